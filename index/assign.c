/*
 * assign.c: nearest centroid and spherical k-means on the device the build runs on (see
 * assign.h). The CUDA side is thin on purpose: device buffers, copies, and one fused kernel
 * call per chunk of points (kern_nearest_centroid); everything else is host code that runs the
 * same way whichever device assigned.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
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
 * GPU has tensor cores). */
static int assign_cuda(const float *centroids, size_t k, size_t dim, const float *x, size_t n,
                       uint32_t *codes, float *scores, int bf16, store_msg *m)
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
        (krc = kern_cuda_malloc((void **)&dx, chunk * dim * sizeof(float))) ||
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
        if ((krc = kern_cuda_upload(dx, x + r0 * dim, c * dim * sizeof(float))) ||
            (krc = bf16 ? kern_nearest_centroid_bf16(KERN_DEV_CUDA, dx, c, dc, k, dim, db, ds)
                        : kern_nearest_centroid(KERN_DEV_CUDA, dx, c, dc, k, dim, db, ds)) ||
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
        return assign_cuda(centroids, k, dim, x, n, codes, scores, 0, m);
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

/* Uniform in [0, bound) from the splitmix stream (the modulo bias is below 2^-30 here). */
static size_t rand_below(uint64_t *st, size_t bound)
{
    return (size_t)(idx_rand_next(st) % bound);
}

/* Selection sampling (Knuth's algorithm S): want of n indices, uniformly, ascending, in one
 * pass, so that the picked points keep their order. */
static void sample_sorted(uint64_t *st, size_t n, size_t want, size_t *out)
{
    size_t got = 0;
    for (size_t i = 0; i < n && got < want; i++)
        if (rand_below(st, n - i) < want - got)
            out[got++] = i;
}

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
static int worse(float as, size_t ai, float bs, size_t bi)
{
    return as < bs || (as == bs && ai < bi);
}

/*
 * The e worst-served points (lowest score first, ties to the lower index) into out [e]: a
 * max-heap of the e worst seen so far, whose root is the best of them. O(n log e).
 */
static void worst_points(const float *score, size_t n, size_t e, size_t *out)
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
                if (!worse(ps, pi, s, i))
                    break;
                out[at] = pi;
                at = p;
            }
            out[at] = i;
            continue;
        }
        size_t ri = out[0];
        float rs = isnan(score[ri]) ? -INFINITY : score[ri];
        if (!worse(s, i, rs, ri))
            continue;
        /* replace the root, sift down */
        at = 0;
        for (;;) {
            size_t l = 2 * at + 1, r = l + 1, big = at;
            size_t bi = i;
            float bsc = s;
            if (l < h) {
                float ls = isnan(score[out[l]]) ? -INFINITY : score[out[l]];
                if (worse(bsc, bi, ls, out[l])) {
                    big = l;
                    bi = out[l];
                    bsc = ls;
                }
            }
            if (r < h) {
                float rsc = isnan(score[out[r]]) ? -INFINITY : score[out[r]];
                if (worse(bsc, bi, rsc, out[r]))
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
            if (!worse(vs, v, ps, out[b - 1]))
                break;
            out[b] = out[b - 1];
            b--;
        }
        out[b] = v;
    }
}

int idx_kmeans_device(kern_dev dev, const float *x, size_t n, size_t dim, size_t k, int niter,
                      int max_per_centroid, uint64_t seed, float *centroids, store_msg *m)
{
    if (!x || !centroids || n == 0 || dim == 0 || k == 0 || k > n || k > INT32_MAX || niter < 1 ||
        max_per_centroid < 1)
        return store_fail(m, TARTAN_EINVAL,
                          "k-means: bad arguments (%zu points, dim %zu, k %zu, %d iterations)", n,
                          dim, k, niter);
    /* A stream of its own, so that it does not repeat the caller's shuffle of the sample. */
    uint64_t st = seed ^ 0x6b2d6d65616e7321ull;
    size_t np = n;
    const float *xs = x;
    float *own = NULL;
    size_t *pick = NULL, *order = NULL, *count = NULL, *empty = NULL;
    uint32_t *codes = NULL;
    float *score = NULL;
    double *acc = NULL;
    int rc = 0;
    if (k <= SIZE_MAX / (size_t)max_per_centroid && n > k * (size_t)max_per_centroid)
        np = k * (size_t)max_per_centroid;
    if (!(pick = malloc((np > k ? np : k) * sizeof *pick)) ||
        !(order = malloc(np * sizeof *order)) || !(count = calloc(k + 1, sizeof *count)) ||
        !(empty = malloc(k * sizeof *empty)) || !(codes = malloc(np * sizeof *codes)) ||
        !(score = malloc(np * sizeof *score)) || !(acc = malloc(k * dim * sizeof *acc))) {
        rc = store_fail(m, ENOMEM, "out of memory for k-means of %zu points into %zu", np, k);
        goto out;
    }
    /* The iterations' assignment in bf16 where that is faster (idx_kmeans_bf16): on AMX a
     * sixth of fp32's time (8.5 s against 49.4 s for the 1.45M-token build's k-means), and
     * the centroids serve the points as well, with recall unchanged (bench/RESULTS.md "Build
     * time"); on a GPU with tensor cores (sm_80+) likewise, on them. The centroid update below
     * stays fp32 (double sums) on the original points. */
    int bf16 = idx_kmeans_bf16(dev);
    if (np < n) {
        if (np > SIZE_MAX / dim / sizeof(float) || !(own = malloc(np * dim * sizeof(float)))) {
            rc = store_fail(m, ENOMEM, "out of memory for a k-means subsample of %zu", np);
            goto out;
        }
        sample_sorted(&st, n, np, pick);
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < (long long)np; i++)
            memcpy(own + (size_t)i * dim, x + pick[i] * dim, dim * sizeof(float));
        xs = own;
    }
    /* The first centroids: k distinct points of the training set. */
    sample_sorted(&st, np, k, pick);
    for (size_t c = 0; c < k; c++) {
        for (size_t j = 0; j < dim; j++)
            acc[c * dim + j] = xs[pick[c] * dim + j];
        normalise_row(centroids + c * dim, acc + c * dim, dim);
    }
    for (int it = 0; it < niter; it++) {
        if ((rc = !bf16 ? idx_assign(dev, centroids, k, dim, xs, np, codes, score, m)
                  : dev == KERN_DEV_CUDA
                      ? assign_cuda(centroids, k, dim, xs, np, codes, score, 1, m)
                      : assign_cpu(centroids, k, dim, xs, np, codes, score, 1, m)))
            goto out;
        /* Counting sort by cluster, stable: each cluster's points in point order, so that
         * its sum does not depend on the thread count. */
        memset(count, 0, (k + 1) * sizeof *count);
        for (size_t i = 0; i < np; i++)
            count[codes[i] + 1]++;
        for (size_t c = 0; c < k; c++)
            count[c + 1] += count[c];
        for (size_t i = 0; i < np; i++)
            order[count[codes[i]]++] = i;
            /* count[c] is now the end of cluster c, which is where cluster c + 1 starts. */
#pragma omp parallel for schedule(dynamic, 64)
        for (long long cc = 0; cc < (long long)k; cc++) {
            size_t c = (size_t)cc, b = c ? count[c - 1] : 0, e = count[c];
            double *a = acc + c * dim;
            if (b == e)
                continue;
            for (size_t j = 0; j < dim; j++)
                a[j] = 0.0;
            for (size_t t = b; t < e; t++) {
                const float *p = xs + order[t] * dim;
                for (size_t j = 0; j < dim; j++)
                    a[j] += p[j];
            }
            normalise_row(centroids + c * dim, a, dim);
        }
        size_t ne = 0;
        for (size_t c = 0; c < k; c++)
            if ((c ? count[c - 1] : 0) == count[c])
                empty[ne++] = c;
        if (ne) {
            worst_points(score, np, ne, pick);
            for (size_t t = 0; t < ne; t++) {
                double *a = acc + empty[t] * dim;
                for (size_t j = 0; j < dim; j++)
                    a[j] = xs[pick[t] * dim + j];
                normalise_row(centroids + empty[t] * dim, a, dim);
            }
        }
    }
out:
    free(own);
    free(pick);
    free(order);
    free(count);
    free(empty);
    free(codes);
    free(score);
    free(acc);
    return rc;
}
