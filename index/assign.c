/*
 * assign.c: nearest centroid and spherical k-means on the device the build runs on (see
 * assign.h). The CUDA side is thin on purpose: device buffers, copies, and one fused kernel
 * call per chunk of points (kern_nearest_centroid); everything else is host code that runs the
 * same way whichever device assigned.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "assign.h"
#include "kmeans.h"
#include "rand.h"
#include "tartan.h"

/* Points per GPU chunk: 256 MB of them (512K points at dim 128), beside the centroids. The
 * fused kernel allocates nothing of size n * k, so this bounds the call's device memory. */
#define GPU_CHUNK_BYTES ((size_t)256 << 20)
/* Points per kernel call on the CPU: bounds the label buffer. */
#define CPU_CHUNK 65536

static int kern_fail(int rc, store_msg *m, const char *what)
{
    int code = rc == KERN_ENOMEM    ? ENOMEM
               : rc == KERN_ENODEV  ? TARTAN_ENODEV
               : rc == KERN_EDEVICE ? TARTAN_EDEVICE
                                    : TARTAN_EINTERNAL;
    return store_fail(m, code, "%s: %s", what, kern_last_error());
}

/* bf16: k-means iterations only (kern_nearest_centroid_bf16); encoding always passes 0. */
static int assign_cpu(const float *centroids, size_t k, size_t dim, const float *x, size_t n,
                      uint32_t *codes, float *scores, int bf16, store_msg *m)
{
    /* The project's own fused kernel (scores and a running argmax in the AVX-512 or AVX2
     * micro-kernel's registers, over OpenMP threads) rather than FAISS's IndexFlatIP: it picks
     * the same centroids (ties to the lower index, as on the GPU); its first version, a score
     * table then an argmax pass, already ran 1.6-1.8x faster than FAISS's BLAS path on the
     * 2-core build host, and the fused one takes 2.2-2.5x less CPU time again (bench_assign). */
    size_t chunk = n < CPU_CHUNK ? n : CPU_CHUNK;
    int32_t *best = malloc(chunk * sizeof *best);
    if (!best)
        return store_fail(m, ENOMEM, "out of memory assigning %zu points", n);
    int rc = 0, krc;
    for (size_t r0 = 0; r0 < n && !rc; r0 += chunk) {
        size_t c = n - r0 < chunk ? n - r0 : chunk;
        float *sc = scores ? scores + r0 : NULL;
        if ((krc = bf16 ? kern_nearest_centroid_bf16(KERN_DEV_CPU, x + r0 * dim, c, centroids, k,
                                                     dim, best, sc)
                        : kern_nearest_centroid(KERN_DEV_CPU, x + r0 * dim, c, centroids, k, dim,
                                                best, sc))) {
            rc = kern_fail(krc, m, "assigning points to centroids");
            break;
        }
        for (size_t i = 0; i < c; i++) {
            /* The kernel answers -1 for a point whose every score is NaN; the codec would then
             * read outside the centroid table. Inputs are checked finite, so this only guards
             * against a bug upstream. */
            if (best[i] < 0 || (size_t)best[i] >= k) {
                rc = store_fail(m, TARTAN_EINTERNAL, "point %zu was assigned to no centroid",
                                r0 + i);
                break;
            }
            codes[r0 + i] = (uint32_t)best[i];
        }
    }
    free(best);
    return rc;
}

/* bf16: k-means iterations only (the tensor cores' bf16 argmax, kern_nearest_centroid_bf16);
 * encoding passes 0 and gets fp32's codes (kern_nearest_centroid, screened in bf16 where the
 * GPU has tensor cores). x_dev: the same points already on the device (k-means keeps its points
 * there across iterations), or NULL: x is uploaded chunk by chunk. */
static int assign_cuda(const float *centroids, size_t k, size_t dim, const float *x,
                       const float *x_dev, size_t n, uint32_t *codes, float *scores, int bf16,
                       store_msg *m)
{
    size_t chunk = GPU_CHUNK_BYTES / (dim * sizeof(float));
    if (chunk == 0)
        chunk = 1;
    if (chunk > n)
        chunk = n;
    int32_t *best = malloc(chunk * sizeof *best);
    if (!best)
        return store_fail(m, ENOMEM, "out of memory assigning %zu points", n);
    float *dc = NULL, *dx = NULL, *ds = NULL;
    int32_t *db = NULL;
    int rc = 0, krc;
    if ((krc = kern_cuda_malloc((void **)&dc, k * dim * sizeof(float))) ||
        (!x_dev && (krc = kern_cuda_malloc((void **)&dx, chunk * dim * sizeof(float)))) ||
        (krc = kern_cuda_malloc((void **)&db, chunk * sizeof(int32_t))) ||
        (scores && (krc = kern_cuda_malloc((void **)&ds, chunk * sizeof(float)))) ||
        (krc = kern_cuda_upload(dc, centroids, k * dim * sizeof(float)))) {
        rc = kern_fail(krc, m, "preparing the GPU assignment");
        goto out;
    }
    for (size_t r0 = 0; r0 < n; r0 += chunk) {
        size_t c = n - r0 < chunk ? n - r0 : chunk;
        /* Copies and the kernel share the default stream: each download waits for the kernel
         * and reports a failure of it. */
        const float *px = x_dev ? x_dev + r0 * dim : dx;
        if ((!x_dev && (krc = kern_cuda_upload(dx, x + r0 * dim, c * dim * sizeof(float)))) ||
            (krc = bf16 ? kern_nearest_centroid_bf16(KERN_DEV_CUDA, px, c, dc, k, dim, db, ds)
                        : kern_nearest_centroid(KERN_DEV_CUDA, px, c, dc, k, dim, db, ds)) ||
            (krc = kern_cuda_download(best, db, c * sizeof(int32_t))) ||
            (scores && (krc = kern_cuda_download(scores + r0, ds, c * sizeof(float))))) {
            rc = kern_fail(krc, m, "assigning points to centroids on the GPU");
            goto out;
        }
        for (size_t i = 0; i < c; i++) {
            if (best[i] < 0 || (size_t)best[i] >= k) {
                rc = store_fail(m, TARTAN_EINTERNAL, "point %zu was assigned to no centroid",
                                r0 + i);
                goto out;
            }
            codes[r0 + i] = (uint32_t)best[i];
        }
    }
out:
    kern_cuda_free(dc);
    kern_cuda_free(dx);
    kern_cuda_free(db);
    kern_cuda_free(ds);
    free(best);
    return rc;
}

int idx_assign(kern_dev dev, const float *centroids, size_t k, size_t dim, const float *x, size_t n,
               uint32_t *codes, float *scores, store_msg *m)
{
    if (n == 0)
        return 0;
    if (!centroids || !x || !codes || k == 0 || dim == 0 || k > INT32_MAX)
        return store_fail(m, TARTAN_EINVAL, "assignment: NULL input or bad sizes (k %zu, dim %zu)",
                          k, dim);
    if (dev == KERN_DEV_CUDA)
        return assign_cuda(centroids, k, dim, x, NULL, n, codes, scores, 0, m);
    return assign_cpu(centroids, k, dim, x, n, codes, scores, 0, m);
}

int idx_kmeans_bf16(kern_dev dev)
{
    const char *e = getenv("TARTAN_KMEANS_BF16");
    if (e && strcmp(e, "0") == 0)
        return 0;
    if (e && strcmp(e, "1") == 0)
        return kern_nearest_centroid_bf16_path(dev) != NULL;
    return kern_nearest_centroid_bf16_pays(dev);
}

/* ---- k-means -------------------------------------------------------------------------- */

static void normalise_row(float *dst, const double *acc, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += acc[j] * acc[j];
    double inv = s > 0.0 ? 1.0 / sqrt(s) : 0.0;
    for (size_t j = 0; j < dim; j++)
        dst[j] = (float)(acc[j] * inv);
}

/* (a_s, a_i) is worse served than (b_s, b_i): lower score, or equal and lower index. */
static int worse(float as, uint64_t ai, float bs, uint64_t bi)
{
    return as < bs || (as == bs && ai < bi);
}

/*
 * The e worst-served points (lowest score first, ties to the lower index in the group's subset,
 * ids [n]) into out [e] (positions in score): a max-heap of the e worst seen so far, whose root
 * is the best of them. O(n log e).
 */
static void worst_points(const float *score, const uint64_t *ids, size_t n, size_t e, size_t *out)
{
    size_t h = 0;
    for (size_t i = 0; i < n; i++) {
        float s = isnan(score[i]) ? -INFINITY : score[i];
        size_t at;
        if (h < e) {
            at = h++;
            /* sift up */
            while (at > 0) {
                size_t p = (at - 1) / 2;
                size_t pi = out[p];
                float ps = isnan(score[pi]) ? -INFINITY : score[pi];
                if (!worse(ps, ids[pi], s, ids[i]))
                    break;
                out[at] = pi;
                at = p;
            }
            out[at] = i;
            continue;
        }
        size_t ri = out[0];
        float rs = isnan(score[ri]) ? -INFINITY : score[ri];
        if (!worse(s, ids[i], rs, ids[ri]))
            continue;
        /* replace the root, sift down */
        at = 0;
        for (;;) {
            size_t l = 2 * at + 1, r = l + 1, big = at;
            size_t bi = i;
            float bsc = s;
            if (l < h) {
                float ls = isnan(score[out[l]]) ? -INFINITY : score[out[l]];
                if (worse(bsc, ids[bi], ls, ids[out[l]])) {
                    big = l;
                    bi = out[l];
                    bsc = ls;
                }
            }
            if (r < h) {
                float rsc = isnan(score[out[r]]) ? -INFINITY : score[out[r]];
                if (worse(bsc, ids[bi], rsc, ids[out[r]]))
                    big = r;
            }
            if (big == at)
                break;
            out[at] = out[big];
            at = big;
        }
        out[at] = i;
    }
    /* Heap order to ascending (worst first): a plain insertion sort, e is small. */
    for (size_t a = 1; a < h; a++) {
        size_t v = out[a], b = a;
        float vs = isnan(score[v]) ? -INFINITY : score[v];
        while (b > 0) {
            float ps = isnan(score[out[b - 1]]) ? -INFINITY : score[out[b - 1]];
            if (!worse(vs, ids[v], ps, ids[out[b - 1]]))
                break;
            out[b] = out[b - 1];
            b--;
        }
        out[b] = v;
    }
}

/* The selections' streams: one for each selection, each from the seed alone, so that a member
 * of a group runs a selection only up to the end of its own points and runs no other. */
#define STREAM_SUBSET 0x6b2d6d65616e7321ull
#define STREAM_INIT 0x6b2d696e69747321ull

/* An empty cluster's candidate as a member proposes it: a worst-served point, its score (NaN
 * as -inf) and its index in the group's subset, followed by the point's dim floats. */
typedef struct cand {
    float score;
    uint32_t pad;
    uint64_t at;
} cand;

/* A candidate on rank 0, for sorting: worst first, ties to the lower index. */
typedef struct cand_key {
    float score;
    uint64_t at;
    size_t i;
} cand_key;

static int cand_cmp(const void *a, const void *b)
{
    const cand_key *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/*
 * Refills the ne empty clusters (ascending in empty) with the ne worst-served points of the
 * group: each member proposes its own ne worst (lowest score, ties to the lower index), rank 0
 * takes the ne worst of all the proposals in the same order and sends their vectors to every
 * member. One process alone takes its own ne worst: the same points as a group would.
 * xs [np, dim], score [np]: the points this member assigned; ids [np]: their indices in the
 * group's subset (the tie-break, the same whatever the order of the rows); sub [size]: every
 * member's number of points assigned. lens [size]: scratch.
 */
static int refill(idx_group *g, const float *xs, const float *score, size_t np, const uint64_t *ids,
                  const size_t *sub, size_t dim, const size_t *empty, size_t ne, size_t *lens,
                  double *acc, float *centroids, store_msg *m)
{
    size_t p = (size_t)g->size, rec = sizeof(cand) + dim * sizeof(float);
    size_t mine = ne < np ? ne : np, total = 0;
    for (size_t r = 0; r < p; r++) {
        lens[r] = (ne < sub[r] ? ne : sub[r]) * rec;
        total += lens[r];
    }
    /* Fewer points than empty clusters in all: the rest stay where they were. */
    if (total / rec < ne)
        ne = total / rec;
    size_t *w = malloc((mine ? mine : 1) * sizeof *w);
    unsigned char *buf = malloc(mine ? mine * rec : 1);
    float *fill = malloc(ne * dim * sizeof *fill);
    unsigned char *all = NULL;
    cand_key *keys = NULL;
    int rc = 0;
    if (g->rank == 0) {
        all = malloc(total ? total : 1);
        keys = malloc((total / rec + 1) * sizeof *keys);
    }
    if (!w || !buf || !fill || (g->rank == 0 && (!all || !keys)))
        rc = store_fail(m, ENOMEM, "out of memory refilling %zu empty clusters", ne);
    if ((rc = idx_group_check(g, rc, m)))
        goto out;
    worst_points(score, ids, np, mine, w);
    for (size_t t = 0; t < mine; t++) {
        cand c = {isnan(score[w[t]]) ? -INFINITY : score[w[t]], 0, ids[w[t]]};
        memcpy(buf + t * rec, &c, sizeof c);
        memcpy(buf + t * rec + sizeof c, xs + w[t] * dim, dim * sizeof(float));
    }
    if ((rc = idx_group_gather(g, buf, mine * rec, all, lens, m)))
        goto out;
    if (g->rank == 0) {
        size_t nk = total / rec;
        for (size_t i = 0; i < nk; i++) {
            cand c;
            memcpy(&c, all + i * rec, sizeof c);
            keys[i] = (cand_key){c.score, c.at, i};
        }
        qsort(keys, nk, sizeof *keys, cand_cmp);
        for (size_t t = 0; t < ne; t++)
            memcpy(fill + t * dim, all + keys[t].i * rec + sizeof(cand), dim * sizeof(float));
    }
    if ((rc = idx_group_bcast(g, fill, ne * dim * sizeof(float), m)))
        goto out;
    for (size_t t = 0; t < ne; t++) {
        double *a = acc + empty[t] * dim;
        for (size_t j = 0; j < dim; j++)
            a[j] = fill[t * dim + j];
        normalise_row(centroids + empty[t] * dim, a, dim);
    }
out:
    free(w);
    free(buf);
    free(fill);
    free(all);
    free(keys);
    return rc;
}

/* This member's points on the GPU for all of k-means's iterations, when they take at most
 * half of its free memory (the rest for the centroids, the kernel's scratch and other work):
 * each iteration then uploads only the centroids. *dx NULL: they stay on the host, uploaded
 * chunk by chunk at every iteration as before (also where TARTAN_KMEANS_RESIDENT is "0", to
 * compare). 0, or a device error other than no memory. */
static int resident_points(const float *xs, size_t np, size_t dim, float **dx, store_msg *m)
{
    *dx = NULL;
    size_t bytes = np * dim * sizeof(float), fr = 0, tot = 0;
    const char *e = getenv("TARTAN_KMEANS_RESIDENT");
    if (np == 0 || (e && strcmp(e, "0") == 0) || kern_cuda_mem_info(&fr, &tot) != 0 ||
        bytes > fr / 2)
        return 0;
    int krc = kern_cuda_malloc((void **)dx, bytes);
    if (krc == KERN_ENOMEM) {
        *dx = NULL;
        return 0;
    }
    if (!krc)
        krc = kern_cuda_upload(*dx, xs, bytes);
    if (krc) {
        kern_cuda_free(*dx);
        *dx = NULL;
        return kern_fail(krc, m, "keeping the k-means points on the GPU");
    }
    return 0;
}

/* Whether k-means sums its clusters on the GPU where its points are resident there: unless
 * TARTAN_KMEANS_SUMS is "cpu" (the host's loop below, the same sums bit for bit, to compare the
 * times or to rule the kernel out). */
static int sums_on_gpu(void)
{
    const char *e = getenv("TARTAN_KMEANS_SUMS");
    return !(e && strcmp(e, "cpu") == 0);
}

/* The device buffers of the GPU sums, allocated once a k-means: the codes [np] and the int64
 * sums [k * dim] followed by the counts [k], the layout of acc. Both NULL where the device has
 * no room for them: the sums then run on the host, as they would without resident points.
 * 0, or a device error other than no memory. */
static int gpu_sums_buffers(size_t np, size_t k, size_t dim, uint32_t **dcodes, int64_t **dsums,
                            store_msg *m)
{
    *dcodes = NULL;
    *dsums = NULL;
    int krc = kern_cuda_malloc((void **)dcodes, np * sizeof **dcodes);
    if (!krc)
        krc = kern_cuda_malloc((void **)dsums, (k * dim + k) * sizeof **dsums);
    if (krc) {
        kern_cuda_free(*dcodes);
        kern_cuda_free(*dsums);
        *dcodes = NULL;
        *dsums = NULL;
        return krc == KERN_ENOMEM ? 0 : kern_fail(krc, m, "preparing the GPU cluster sums");
    }
    return 0;
}

/* The cluster sums of this member's np points, resident on the GPU (dxs), with their codes
 * [np]: into acc [k * dim] and the counts after them [k], the same numbers bit for bit as the
 * host's loop in idx_kmeans_group. The kernel adds the integers idx_fixed_point holds (as
 * int64, exactly, kern_cuda_cluster_sums); they come down into acc's own bytes and are turned
 * into doubles in place. The conversion is exact: a point's coordinates are at most 1 in
 * magnitude (L2-normalised), so a term is at most 2^30 and a cluster's sum at most
 * count * 2^30, below 2^53 for clusters of fewer than 2^23 (8.4M) points, the same bound that
 * keeps the host's double sums exact, so the two agree. Beyond (a build's clusters average 64
 * to 256 points), the int64 sum is still exact and rounded once here, where the host's would
 * round at each term. */
static int sums_cuda(const float *dxs, const uint32_t *codes, size_t np, size_t k, size_t dim,
                     uint32_t *dcodes, int64_t *dsums, double *acc, store_msg *m)
{
    _Static_assert(sizeof(double) == sizeof(int64_t), "acc holds the int64 sums in place");
    size_t total = k * dim + k;
    int krc;
    /* The copies and the kernel share the default stream: the download waits for the kernel
     * and reports a failure of it. */
    if ((krc = kern_cuda_upload(dcodes, codes, np * sizeof *codes)) ||
        (krc = kern_cuda_cluster_sums(dxs, np, dim, dcodes, k, dsums, dsums + k * dim)) ||
        (krc = kern_cuda_download(acc, dsums, total * sizeof *dsums)))
        return kern_fail(krc, m, "summing the clusters on the GPU");
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)total; i++) {
        int64_t v;
        memcpy(&v, acc + i, sizeof v);
        acc[i] = (double)v;
    }
    return 0;
}

/* a += pt in fixed point (idx_fixed_point): a cluster's sum, one point at a time. restrict
 * lets the compiler vectorise it (it could not rule out a store to a changing pt). */
static void add_fixed(double *restrict a, const float *restrict pt, size_t dim)
{
    for (size_t j = 0; j < dim; j++)
        a[j] += idx_fixed_point(pt[j]);
}

/* How many points ahead the cluster sums fetch, and the fetch of one point's row. The sums
 * wait on memory, not on arithmetic: XeonVM, 471,433 points of dim 128, K 8,192, 2 threads,
 * 4 iterations (TARTAN_KMEANS_TRACE): 0.50 s with a libm nearbyint a coordinate, 0.45 s
 * without it, vectorised or not; 0.24 s fetching 6 points ahead (3 to 12 alike). */
#define SUM_AHEAD 6
static inline void prefetch_row(const float *p, size_t dim)
{
    for (size_t j = 0; j < dim; j += 16)
        __builtin_prefetch(p + j, 0, 0);
}

/* TARTAN_KMEANS_TRACE set (and not "0"): each member prints where its training time went. */
int idx_trace(void)
{
    const char *e = getenv("TARTAN_KMEANS_TRACE");
    return e && *e && strcmp(e, "0") != 0;
}

/*
 * The warm start: k-means's first iterations assign only a share of the training points, the
 * later ones more and the last all of them. The first iterations move the centroids far (a
 * third of the way to another centroid on the first step) and settle nothing a quarter of the
 * points could not; the last one, on every point, places them finely. A schedule is a list of
 * "I/S" steps, I iterations on one point of every S (each stride a multiple of the next), the
 * last iteration always on every point. Which point of each block of S consecutive indices of
 * the group's subset is a seeded hash's choice (idx_warm_depth), never a fixed position: where
 * every token trains (corpora up to about 64 points a centroid) the subset is the input in its
 * order, and a position chosen by stride would follow any period in it (a fixed document
 * length, clusters in turn), seeing some clusters and not others. The narrower steps' points
 * include the wider ones', so one reordering puts each step's points first.
 * Default on the CPU, WARM_DEFAULT: the first 2 of 4 iterations on one point in 4, the work of
 * 2.5 iterations instead of 4, with recall unchanged on every family and SciFact
 * (bench/RESULTS.md "Build time"; "2/4,1/2", the work of 2, cost model 2 about 0.005 of
 * exhaustive recall over three seeds, so it is not the default). A stride whose share holds
 * fewer than WARM_MIN_PER_CENTROID points a centroid gives way to the next narrower one. On a
 * GPU the assignment is already a small part of training (0.7-1.1 s of a 2M-document build's),
 * less than moving the points cost there (about 2 s, measured with a partition in place), so it
 * stays off. TARTAN_KMEANS_WARM sets a schedule on either device ("0": none; one that does not
 * parse: the default). Every member of a group must see the same setting and device (mpirun
 * passes the environment on).
 */
#define WARM_DEFAULT "2/4"
#define WARM_MAX_LEVELS 4
/* The warm share must hold this many points a centroid (16 in a build's subset of 64 a
 * centroid at stride 4), or the stride gives way: fewer would leave centroids on one or two
 * points, and a refill needs a point for every empty cluster. */
#define WARM_MIN_PER_CENTROID 8

/* Parses a schedule into strides [niter] (1 where it says nothing); 0, or -1 if it does not
 * parse (strides then all 1). */
static int warm_parse(const char *e, int niter, size_t *strides)
{
    for (int it = 0; it < niter; it++)
        strides[it] = 1;
    if (strcmp(e, "0") == 0)
        return 0;
    int it = 0, steps = 0;
    long prev = 0;
    while (*e) {
        char *end;
        long a = strtol(e, &end, 10), b = 1;
        if (end == e || a < 0 || a > 1000)
            goto bad;
        if (*end == '/') {
            const char *f = end + 1;
            b = strtol(f, &end, 10);
            if (end == f)
                goto bad;
        }
        if (b < 1 || b > 1000000 || (prev && prev % b) || ++steps > WARM_MAX_LEVELS ||
            (*end && *end != ','))
            goto bad;
        for (long i = 0; i < a && it < niter - 1; i++)
            strides[it++] = (size_t)b; /* the last iteration always sees every point */
        prev = b;
        if (*end == ',' && end[1] == '\0')
            goto bad;
        e = *end ? end + 1 : end;
    }
    return 0;
bad:
    for (it = 0; it < niter; it++)
        strides[it] = 1;
    return -1;
}

/* The schedule on dev for niter iterations over nsub points into k centroids: strides [niter]. */
static void warm_schedule(kern_dev dev, int niter, size_t nsub, size_t k, size_t *strides)
{
    const char *e = getenv("TARTAN_KMEANS_WARM");
    if (!e || warm_parse(e, niter, strides) != 0)
        (void)warm_parse(dev == KERN_DEV_CPU ? WARM_DEFAULT : "0", niter, strides);
    /* The same decision on every member, from the group's counts. */
    for (int it = 0; it < niter; it++)
        while (strides[it] > 1 &&
               (nsub + strides[it] - 1) / strides[it] < (size_t)WARM_MIN_PER_CENTROID * k) {
            size_t next = 1; /* the next narrower stride of the schedule */
            for (int j = 0; j < niter; j++)
                if (strides[j] < strides[it] && strides[j] > next)
                    next = strides[j];
            strides[it] = next;
        }
}

/* The warm start's stream (a seeded choice of points, as the subset's and the first
 * centroids'). */
#define STREAM_WARM 0x6b2d7761726d7321ull

/* Level l's point in the block of ls[l] consecutive subset indices that holds id: one of the
 * level l + 1 points of the block's ls[l] / ls[l + 1] sub-blocks (at the narrowest level, one
 * of its indices), each choice a hash of the seed, the level and the block. */
static uint64_t warm_pick(uint64_t seed, const size_t *ls, size_t nlev, size_t l, uint64_t id)
{
    uint64_t pos = id / ls[l] * ls[l];
    for (size_t j = l; j < nlev; j++) {
        size_t unit = j + 1 < nlev ? ls[j + 1] : 1;
        uint64_t st = seed ^ STREAM_WARM ^ ((uint64_t)j << 58) ^ (pos / ls[j]);
        pos += idx_rand_next(&st) % (ls[j] / unit) * unit;
    }
    return pos;
}

size_t idx_warm_depth(uint64_t seed, const size_t *ls, size_t nlev, uint64_t id)
{
    size_t d = nlev;
    for (size_t l = nlev; l-- > 0 && warm_pick(seed, ls, nlev, l, id) == id;)
        d = l;
    return d;
}

int idx_warm_dest(uint64_t seed, const size_t *ls, size_t nlev, uint64_t first, size_t np,
                  size_t *dest, size_t *lnp)
{
    size_t cnt[WARM_MAX_LEVELS + 2] = {0};
    if (nlev > WARM_MAX_LEVELS)
        return -1;
    uint8_t *depth = malloc(np ? np : 1);
    if (!depth)
        return -1;
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)np; i++)
        depth[i] = (uint8_t)idx_warm_depth(seed, ls, nlev, first + (uint64_t)i);
    for (size_t i = 0; i < np; i++)
        cnt[depth[i] + 1]++;
    for (size_t l = 0; l <= nlev; l++) {
        cnt[l + 1] += cnt[l];
        if (l < nlev)
            lnp[l] = cnt[l + 1];
    }
    for (size_t i = 0; i < np; i++) /* a stable counting sort by depth */
        dest[i] = cnt[depth[i]]++;
    free(depth);
    return 0;
}

int idx_kmeans_group(kern_dev dev, const float *x, size_t n, const size_t *skip, size_t n_skip,
                     size_t dim, size_t k, int niter, int max_per_centroid, uint64_t seed,
                     idx_group *g, float *centroids, store_msg *m)
{
    /* Phase seconds for TARTAN_KMEANS_TRACE: setup (subsample, first centroids, points to the
     * GPU), then summed over the iterations: assignment, the cluster sums, their exchange, and
     * the update (normalisation, refills and their exchanges). */
    double t_mark = idx_now(), t_setup = 0, t_assign = 0, t_sums = 0, t_ex = 0, t_update = 0;
    size_t np_traced = 0;
    size_t p = (size_t)g->size;
    size_t *cnt = NULL, *sub = NULL, *lens = NULL, *sub_w = NULL, *strides = NULL, *dest = NULL;
    uint64_t *ids = NULL;
    size_t *pick = NULL, *order = NULL, *count = NULL, *empty = NULL;
    uint32_t *codes = NULL, *dcodes = NULL;
    float *score = NULL, *own = NULL, *rows = NULL, *dxs = NULL;
    int64_t *dsums = NULL;
    double *acc = NULL;
    int rc = 0;
    if (!centroids || dim == 0 || k == 0 || k > INT32_MAX || niter < 1 || max_per_centroid < 1 ||
        (n && !x) || (n_skip && !skip))
        rc = store_fail(m, TARTAN_EINVAL,
                        "k-means: bad arguments (%zu points, dim %zu, k %zu, %d iterations)", n,
                        dim, k, niter);
    else if (!(cnt = malloc((3 + WARM_MAX_LEVELS) * p * sizeof *cnt)))
        rc = store_fail(m, ENOMEM, "out of memory");
    /* 1. Where this member's points lie among the group's (rank order). */
    if ((rc = idx_group_counts(g, n, cnt, rc, m)))
        goto out;
    sub = cnt + p;
    lens = sub + p;
    sub_w = lens + p;
    size_t ntot = 0, off = 0;
    for (size_t r = 0; r < p; r++) {
        ntot += cnt[r];
        off += r < (size_t)g->rank ? cnt[r] : 0;
    }
    if (ntot == 0 || k > ntot) {
        /* The same on every member: no exchange needed to agree. */
        rc = store_fail(m, TARTAN_EINVAL, "k-means: %zu centroids from %zu points", k, ntot);
        goto out;
    }
    /* 2. The subset k-means trains on: at most max_per_centroid * k of the group's points, a
     * seeded selection over all of them; this member's rows of it (pick: rows of x, skipping
     * the rows that are not training points), its place among the group's (sub_off). */
    size_t nsub = ntot, np = n;
    if (k <= SIZE_MAX / (size_t)max_per_centroid && ntot > k * (size_t)max_per_centroid)
        nsub = k * (size_t)max_per_centroid;
    if (nsub < ntot || n_skip) {
        size_t below;
        if (!(pick = malloc((n ? n : 1) * sizeof *pick))) {
            rc = store_fail(m, ENOMEM, "out of memory for a k-means subsample");
        } else {
            if (nsub < ntot) {
                np = idx_select_range(seed ^ STREAM_SUBSET, ntot, nsub, off, off + n, pick, &below);
            } else {
                for (size_t i = 0; i < n; i++)
                    pick[i] = i;
            }
            /* Training point t is row t plus the skipped rows at or before it. */
            for (size_t i = 0, sp = 0; i < np; i++) {
                while (sp < n_skip && skip[sp] <= pick[i] + sp)
                    sp++;
                pick[i] += sp;
            }
        }
    }
    if ((rc = idx_group_counts(g, np, sub, rc, m)))
        goto out;
    size_t sub_off = 0, nsub_all = 0;
    for (size_t r = 0; r < p; r++) {
        sub_off += r < (size_t)g->rank ? sub[r] : 0;
        nsub_all += sub[r];
    }
    /* 2b. The warm start's schedule (warm_schedule) and its levels, the distinct strides above
     * 1, widest first; each row's place when the levels' points come first (idx_warm_dest). */
    size_t nlev = 0, lstride[WARM_MAX_LEVELS], lnp[WARM_MAX_LEVELS];
    size_t *lsub[WARM_MAX_LEVELS];
    if (!(strides = malloc((size_t)niter * sizeof *strides)) ||
        !(ids = malloc((np ? np : 1) * sizeof *ids)))
        rc = store_fail(m, ENOMEM, "out of memory for k-means");
    if ((rc = idx_group_check(g, rc, m)))
        goto out;
    warm_schedule(dev, niter, nsub_all, k, strides);
    for (int it = 0; it < niter; it++) {
        size_t l = 0;
        while (l < nlev && lstride[l] > strides[it])
            l++;
        if (strides[it] > 1 && (l == nlev || lstride[l] != strides[it]) && nlev < WARM_MAX_LEVELS) {
            memmove(lstride + l + 1, lstride + l, (nlev - l) * sizeof *lstride);
            lstride[l] = strides[it];
            nlev++;
        }
    }
    if (nlev && !(dest = malloc((np ? np : 1) * sizeof *dest)))
        rc = store_fail(m, ENOMEM, "out of memory for k-means's warm start");
    if (!rc && nlev && idx_warm_dest(seed, lstride, nlev, sub_off, np, dest, lnp) != 0)
        rc = store_fail(m, ENOMEM, "out of memory for k-means's warm start");
    for (size_t i = 0; !rc && i < np; i++)
        ids[dest ? dest[i] : i] = sub_off + i;
    /* 2c. This member's rows, copied out in that order (where they are not x itself): each
     * row of the copy from its source (its id less sub_off), the copy written in order. */
    const float *xs = x;
    if (!rc && (pick || dest)) {
        if (np > SIZE_MAX / dim / sizeof(float) ||
            !(own = malloc((np ? np : 1) * dim * sizeof(float))))
            rc = store_fail(m, ENOMEM, "out of memory for a k-means subsample of %zu", np);
        else {
#pragma omp parallel for schedule(static)
            for (long long j = 0; j < (long long)np; j++) {
                size_t i = (size_t)(ids[j] - sub_off);
                memcpy(own + (size_t)j * dim, x + (pick ? pick[i] : i) * dim, dim * sizeof(float));
            }
            xs = own;
        }
    }
    for (size_t l = 0; l < nlev; l++) {
        lsub[l] = sub_w + l * p;
        if ((rc = idx_group_counts(g, rc ? 0 : lnp[l], lsub[l], rc, m)))
            goto out;
    }
    size_t nk = np < k ? np : k; /* this member's share of the first centroids, at most */
    if (!(order = malloc((np ? np : 1) * sizeof *order)) ||
        !(count = calloc(k + 1, sizeof *count)) || !(empty = malloc(k * sizeof *empty)) ||
        !(codes = malloc((np ? np : 1) * sizeof *codes)) ||
        !(score = malloc((np ? np : 1) * sizeof *score)) ||
        !(acc = malloc((k * dim + k + p) * sizeof *acc)) ||
        !(rows = malloc((nk ? nk : 1) * dim * sizeof *rows)) ||
        (nk && !pick && !(pick = malloc(nk * sizeof *pick))))
        rc = store_fail(m, ENOMEM, "out of memory for k-means of %zu points into %zu", np, k);
    /* 3. The first centroids: k distinct points of the subset, a seeded selection over the
     * group's subset; each member sends its own to rank 0, which sends the table to all. */
    size_t kc = 0, below = 0;
    if (!rc) {
        kc = idx_select_range(seed ^ STREAM_INIT, nsub, k, sub_off, sub_off + np, pick, &below);
        for (size_t c = 0; c < kc; c++)
            memcpy(rows + c * dim, xs + (dest ? dest[pick[c]] : pick[c]) * dim,
                   dim * sizeof(float));
    }
    if ((rc = idx_group_counts(g, kc * dim * sizeof(float), lens, rc, m)) ||
        (rc = idx_group_gather(g, rows, kc * dim * sizeof(float), centroids, lens, m)) ||
        (rc = idx_group_bcast(g, centroids, k * dim * sizeof(float), m)))
        goto out;
    for (size_t c = 0; c < k; c++) {
        for (size_t j = 0; j < dim; j++)
            acc[c * dim + j] = centroids[c * dim + j];
        normalise_row(centroids + c * dim, acc + c * dim, dim);
    }
    /* The iterations' assignment in bf16 where that is faster (idx_kmeans_bf16): on AMX a
     * sixth of fp32's time (8.5 s against 49.4 s for the 1.45M-token build's k-means), and
     * the centroids serve the points as well, with recall unchanged (bench/RESULTS.md "Build
     * time"); on a GPU with tensor cores (sm_80+) likewise, on them. The centroid update below
     * stays exact (fixed-point sums, IDX_SUM_SCALE) on the fp32 points. */
    int bf16 = idx_kmeans_bf16(dev);
    double t_gpu = 0, t_up = 0;
    if (dev == KERN_DEV_CUDA) {
        /* Traced apart: the process's first GPU call (its context) and the points' upload. */
        size_t fr, tot;
        t_gpu = idx_now();
        if (idx_trace())
            (void)kern_cuda_mem_info(&fr, &tot);
        t_up = idx_now();
        t_gpu = t_up - t_gpu;
        rc = resident_points(xs, np, dim, &dxs, m);
        t_up = idx_now() - t_up;
        /* The cluster sums where the points are (sums_cuda): on 2 GPUs at 2M documents
         * (2.66M points, K 65,536, dim 128, 4 iterations) the host's loop took 0.2-0.42 s of a
         * 1.2-1.7 s k-means, and did not shrink with two ranks, which share the host's
         * cores. */
        if (!rc && dxs && sums_on_gpu())
            rc = gpu_sums_buffers(np, k, dim, &dcodes, &dsums, m);
    }
    double *cnts = acc + k * dim;
    np_traced = np;
    t_setup = idx_now() - t_mark;
    for (int it = 0; it < niter; it++) {
        /* 4. Each member assigns its own points (the warm start's first, for the first warm
         * iterations) and sums them per cluster; the group adds the sums and counts up, and
         * every member computes the same centroids from them. */
        size_t npi = np;
        const size_t *subi = sub;
        for (size_t l = 0; l < nlev; l++)
            if (lstride[l] == strides[it]) {
                npi = lnp[l];
                subi = lsub[l];
            }
        t_mark = idx_now();
        if (!rc && npi)
            rc = dev == KERN_DEV_CUDA
                     ? assign_cuda(centroids, k, dim, xs, dxs, npi, codes, score, bf16, m)
                     : assign_cpu(centroids, k, dim, xs, npi, codes, score, bf16, m);
        t_assign += idx_now() - t_mark;
        t_mark = idx_now();
        if (!rc && dsums) {
            rc = sums_cuda(dxs, codes, npi, k, dim, dcodes, dsums, acc, m);
        } else if (!rc) {
            /* Counting sort by cluster: each cluster's points together, for one thread. */
            memset(count, 0, (k + 1) * sizeof *count);
            for (size_t i = 0; i < npi; i++)
                count[codes[i] + 1]++;
            for (size_t c = 0; c < k; c++)
                count[c + 1] += count[c];
            for (size_t i = 0; i < npi; i++)
                order[count[codes[i]]++] = i;
                /* count[c] is now the end of cluster c, which is where cluster c + 1 starts. */
#pragma omp parallel for schedule(dynamic, 64)
            for (long long cc = 0; cc < (long long)k; cc++) {
                size_t c = (size_t)cc, b = c ? count[c - 1] : 0, e = count[c];
                double *a = acc + c * dim;
                for (size_t j = 0; j < dim; j++)
                    a[j] = 0.0;
                for (size_t t = b; t < e; t++) {
                    /* The points come in cluster order, scattered over the subset: fetch
                     * one a few ahead (its rows lie far apart; each waits on memory). */
                    if (t + SUM_AHEAD < e)
                        prefetch_row(xs + order[t + SUM_AHEAD] * dim, dim);
                    add_fixed(a, xs + order[t] * dim, dim);
                }
                cnts[c] = (double)(e - b);
            }
        }
        t_sums += idx_now() - t_mark;
        t_mark = idx_now();
        if ((rc = idx_group_sum(g, acc, k * dim + k, rc, m)))
            goto out;
        t_ex += idx_now() - t_mark;
        t_mark = idx_now();
#pragma omp parallel for schedule(static)
        for (long long cc = 0; cc < (long long)k; cc++)
            if (cnts[cc] > 0.0)
                normalise_row(centroids + (size_t)cc * dim, acc + (size_t)cc * dim, dim);
        /* 5. An empty cluster takes a worst-served point of the group (refill). */
        size_t ne = 0;
        for (size_t c = 0; c < k; c++)
            if (cnts[c] == 0.0)
                empty[ne++] = c;
        if (ne &&
            (rc = refill(g, xs, score, npi, ids, subi, dim, empty, ne, lens, acc, centroids, m)))
            goto out;
        t_update += idx_now() - t_mark;
    }
    char sched[96] = "";
    for (int it = 0, at = 0; idx_trace() && it < niter && at < (int)sizeof sched - 24; it++)
        at += snprintf(sched + at, sizeof sched - (size_t)at, "%s%zu", it ? "," : "", strides[it]);
    if (idx_trace())
        fprintf(
            stderr,
            "k-means, member %d of %d: %zu points, %zu centroids, dim %zu, %d iterations on "
            "%s (every n-th point, by iteration: %s): setup %.3f s (GPU start %.3f s, points to "
            "the GPU %.3f s), assignment %.3f s, sums %.3f s (on the %s), exchange of the sums "
            "%.3f s, update %.3f s\n",
            g->rank, g->size, np_traced, k, dim, niter,
            dev == KERN_DEV_CUDA ? (bf16 ? "the GPU (bf16)" : "the GPU")
                                 : (bf16 ? "the CPU (bf16)" : "the CPU"),
            sched, t_setup, t_gpu, t_up, t_assign, t_sums, dsums ? "GPU" : "CPU", t_ex, t_update);
out:
    kern_cuda_free(dxs);
    kern_cuda_free(dcodes);
    kern_cuda_free(dsums);
    free(cnt);
    free(strides);
    free(dest);
    free(ids);
    free(own);
    free(pick);
    free(order);
    free(count);
    free(empty);
    free(codes);
    free(score);
    free(acc);
    free(rows);
    return rc;
}

int idx_kmeans_device(kern_dev dev, const float *x, size_t n, size_t dim, size_t k, int niter,
                      int max_per_centroid, uint64_t seed, float *centroids, store_msg *m)
{
    idx_group g;
    idx_group_solo(&g);
    return idx_kmeans_group(dev, x, n, NULL, 0, dim, k, niter, max_per_centroid, seed, &g,
                            centroids, m);
}
