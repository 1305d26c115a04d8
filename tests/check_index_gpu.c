/*
 * check_index_gpu.c: index building on the GPU against the CPU and a double-precision
 * reference: the fused nearest-centroid kernel, the index layer's assignment (chunked), the
 * device k-means, and a whole index encoded on either device (codes, residuals and norms byte
 * for byte, near-ties aside). Exits 77 (skipped) where no GPU is present; runs without fork,
 * since a forked child cannot use the parent's CUDA context.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "assign.h"
#include "db.h"
#include "fixture.h"
#include "index.h"
#include "kernels.h"
#include "tartan.h"

static void random_units(float *x, size_t n, size_t dim)
{
    for (size_t i = 0; i < n; i++) {
        double s = 0.0;
        for (size_t j = 0; j < dim; j++) {
            x[i * dim + j] = (float)gauss();
            s += (double)x[i * dim + j] * x[i * dim + j];
        }
        for (size_t j = 0; j < dim; j++)
            x[i * dim + j] = (float)(x[i * dim + j] / sqrt(s));
    }
}

/* Points near a few hundred random directions (cosine ~0.9): a k-means workload whose
 * assignments are not all near-ties. */
static void clustered(float *x, size_t n, size_t dim, size_t ncl)
{
    float *cen = xmalloc(sizeof(float) * ncl * dim);
    random_units(cen, ncl, dim);
    for (size_t i = 0; i < n; i++) {
        const float *c = cen + (rnd() % ncl) * dim;
        double s = 0.0;
        for (size_t j = 0; j < dim; j++) {
            x[i * dim + j] = (float)(c[j] + 0.04 * gauss());
            s += (double)x[i * dim + j] * x[i * dim + j];
        }
        for (size_t j = 0; j < dim; j++)
            x[i * dim + j] = (float)(x[i * dim + j] / sqrt(s));
    }
    free(cen);
}

/* Two choices for one point agree: the same centroid, or two whose true (double) scores are
 * within fp32 rounding. Returns 1 when they differ (a near-tie), 0 when equal. */
static int same_or_near_tie(const float *c, size_t dim, const float *v, long long a, long long b,
                            size_t point)
{
    if (a == b)
        return 0;
    double sa = dot_d(c + (size_t)a * dim, v, dim), sb = dot_d(c + (size_t)b * dim, v, dim);
    ck_assert_msg(fabs(sa - sb) < 1e-5, "point %zu: centroid %lld (%.9f) against %lld (%.9f)",
                  point, a, sa, b, sb);
    return 1;
}

/* kern_nearest_centroid on the GPU: device copies in, best [n] and scores [n] out. */
static void gpu_nearest(const float *x, size_t n, const float *c, size_t k, size_t dim,
                        int32_t *best, float *score)
{
    float *dx, *dc, *ds;
    int32_t *db;
    ck_assert_int_eq(kern_cuda_malloc((void **)&dx, n * dim * sizeof(float)), KERN_OK);
    ck_assert_int_eq(kern_cuda_malloc((void **)&dc, k * dim * sizeof(float)), KERN_OK);
    ck_assert_int_eq(kern_cuda_malloc((void **)&db, n * sizeof(int32_t)), KERN_OK);
    ck_assert_int_eq(kern_cuda_malloc((void **)&ds, n * sizeof(float)), KERN_OK);
    ck_assert_int_eq(kern_cuda_upload(dx, x, n * dim * sizeof(float)), KERN_OK);
    ck_assert_int_eq(kern_cuda_upload(dc, c, k * dim * sizeof(float)), KERN_OK);
    /* Poisoned outputs: every slot must be written. */
    int32_t *pb = xmalloc(n * sizeof(int32_t));
    float *ps = xmalloc(n * sizeof(float));
    memset(pb, 0xab, n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        ps[i] = NAN;
    ck_assert_int_eq(kern_cuda_upload(db, pb, n * sizeof(int32_t)), KERN_OK);
    ck_assert_int_eq(kern_cuda_upload(ds, ps, n * sizeof(float)), KERN_OK);
    ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CUDA, dx, n, dc, k, dim, db, ds), KERN_OK);
    ck_assert_int_eq(kern_cuda_sync(), KERN_OK);
    ck_assert_int_eq(kern_cuda_download(best, db, n * sizeof(int32_t)), KERN_OK);
    ck_assert_int_eq(kern_cuda_download(score, ds, n * sizeof(float)), KERN_OK);
    kern_cuda_free(dx);
    kern_cuda_free(dc);
    kern_cuda_free(db);
    kern_cuda_free(ds);
    free(pb);
    free(ps);
}

START_TEST(test_index_gpu_nearest_matches_double)
{
    static const struct {
        size_t n, k, dim;
    } shapes[] = {{1, 1, 64},     {517, 1023, 128}, {1000, 300, 64},
                  {129, 77, 256}, {70, 4097, 128},  {3001, 131072, 128}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        size_t n = shapes[t].n, k = shapes[t].k, dim = shapes[t].dim;
        float *x = xmalloc(sizeof(float) * n * dim), *c = xmalloc(sizeof(float) * k * dim);
        int32_t *gb = xmalloc(sizeof(int32_t) * n), *cb = xmalloc(sizeof(int32_t) * n);
        float *gs = xmalloc(sizeof(float) * n), *cs = xmalloc(sizeof(float) * n);
        random_units(x, n, dim);
        random_units(c, k, dim);
        gpu_nearest(x, n, c, k, dim, gb, gs);
        ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, n, c, k, dim, cb, cs), KERN_OK);
        size_t ties = 0;
        /* The big shape's double reference would take minutes: the CPU kernel stands in for it
         * there (it is checked against double in check_index_train). */
        int full = k * n <= (size_t)4 << 20;
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(gb[i] >= 0 && (size_t)gb[i] < k, "shape %zu point %zu: %d", t, i, gb[i]);
            double got = dot_d(c + (size_t)gb[i] * dim, x + i * dim, dim);
            ck_assert_msg(fabs(gs[i] - got) < 1e-5, "shape %zu point %zu: score %.9f, true %.9f", t,
                          i, gs[i], got);
            if (full) {
                long long ref = 0;
                double bs = -INFINITY;
                for (size_t j = 0; j < k; j++) {
                    double s = dot_d(c + j * dim, x + i * dim, dim);
                    if (s > bs) {
                        bs = s;
                        ref = (long long)j;
                    }
                }
                same_or_near_tie(c, dim, x + i * dim, gb[i], ref, i);
            }
            ties += same_or_near_tie(c, dim, x + i * dim, gb[i], cb[i], i);
        }
        ck_assert_msg(ties <= n / 100 + 1, "shape %zu: %zu near-ties of %zu", t, ties, n);
        free(x);
        free(c);
        free(gb);
        free(cb);
        free(gs);
        free(cs);
    }
}
END_TEST

START_TEST(test_index_gpu_nearest_ties_go_to_lower_index)
{
    /* Centroids 3, 130 and 200 are equal (130 in another 128-centroid tile, 200 too); points
     * equal to them must take 3. */
    enum { K = 257, D = 128, N = 300 };
    float *c = xmalloc(sizeof(float) * K * D), *x = xmalloc(sizeof(float) * N * D);
    int32_t *b = xmalloc(sizeof(int32_t) * N);
    float *s = xmalloc(sizeof(float) * N);
    random_units(c, K, D);
    memcpy(c + 130 * D, c + 3 * D, sizeof(float) * D);
    memcpy(c + 200 * D, c + 3 * D, sizeof(float) * D);
    random_units(x, N, D);
    for (size_t i = 0; i < N; i += 3)
        memcpy(x + i * D, c + 3 * D, sizeof(float) * D);
    gpu_nearest(x, N, c, K, D, b, s);
    for (size_t i = 0; i < N; i += 3)
        ck_assert_int_eq(b[i], 3);
    free(c);
    free(x);
    free(b);
    free(s);
}
END_TEST

START_TEST(test_index_gpu_assign_matches_cpu)
{
    /* dim 2048 makes the index layer's GPU chunk 32,768 points: 40,000 points span two. */
    static const struct {
        size_t n, k, dim;
    } shapes[] = {{40000, 96, 2048}, {20011, 65536, 128}, {5003, 1000, 64}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        size_t n = shapes[t].n, k = shapes[t].k, dim = shapes[t].dim;
        float *x = xmalloc(sizeof(float) * n * dim), *c = xmalloc(sizeof(float) * k * dim);
        uint32_t *gc = xmalloc(sizeof(uint32_t) * n), *cc = xmalloc(sizeof(uint32_t) * n);
        float *gs = xmalloc(sizeof(float) * n);
        clustered(x, n, dim, 300);
        random_units(c, k, dim);
        memset(gc, 0xab, sizeof(uint32_t) * n);
        for (size_t i = 0; i < n; i++)
            gs[i] = NAN;
        store_msg m = {{0}};
        ck_assert_msg(idx_assign(KERN_DEV_CUDA, c, k, dim, x, n, gc, gs, &m) == 0, "%s", m.text);
        ck_assert_msg(idx_assign(KERN_DEV_CPU, c, k, dim, x, n, cc, NULL, &m) == 0, "%s", m.text);
        size_t ties = 0;
        for (size_t i = 0; i < n; i++) {
            ck_assert(gc[i] < k);
            ck_assert(!isnan(gs[i]));
            ties += same_or_near_tie(c, dim, x + i * dim, gc[i], cc[i], i);
        }
        ck_assert_msg(ties <= n / 100 + 1, "shape %zu: %zu near-ties of %zu", t, ties, n);
        free(x);
        free(c);
        free(gc);
        free(cc);
        free(gs);
    }
}
END_TEST

START_TEST(test_index_gpu_kmeans_matches_cpu)
{
    /* The same k-means with assignment on either device: the same init from the seed, and
     * assignments equal but for near-ties, so the centroids agree closely. Both in fp32: the
     * CPU's bf16 iterations (AMX hosts) move ~0.7% of the points between near-tied clusters,
     * which check_index_train's kmeans_bf16_switch measures against fp32 instead. */
    ck_assert_int_eq(setenv("TARTAN_KMEANS_BF16", "0", 1), 0);
    enum { N = 60000, D = 128, K = 1024 };
    float *x = xmalloc(sizeof(float) * N * D);
    float *g = xmalloc(sizeof(float) * K * D), *c = xmalloc(sizeof(float) * K * D);
    clustered(x, N, D, 2000);
    store_msg m = {{0}};
    /* The same schedule on both devices (the warm start is the CPU's default, not the GPU's):
     * none, and a warm start of two steps (the same points on either device). */
    static const char *const warm[] = {"0", "2/4,1/2"};
    for (int w = 0; w < 2; w++) {
        ck_assert_int_eq(setenv("TARTAN_KMEANS_WARM", warm[w], 1), 0);
        ck_assert_msg(idx_kmeans_device(KERN_DEV_CUDA, x, N, D, K, 4, 256, 42, g, &m) == 0, "%s",
                      m.text);
        ck_assert_msg(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, 256, 42, c, &m) == 0, "%s",
                      m.text);
        size_t close = 0;
        for (size_t i = 0; i < K; i++) {
            double nn = dot_d(g + i * D, g + i * D, D);
            ck_assert_msg(fabs(nn - 1.0) < 1e-5, "centroid %zu: squared norm %f", i, nn);
            close += dot_d(g + i * D, c + i * D, D) > 0.9999;
        }
        /* A flipped near-tie moves one point between two clusters; allow a few such
         * centroids. */
        ck_assert_msg(close >= K - K / 100, "warm %s: %zu of %d centroids agree", warm[w], close,
                      K);
    }
    ck_assert_int_eq(unsetenv("TARTAN_KMEANS_WARM"), 0);
    free(x);
    free(g);
    free(c);
}
END_TEST

/*
 * idx_kmeans_device on the GPU (4 iterations, seed 42) with the environment variable var set to
 * val (NULL: unset) for the call only, into centroids [k, dim] (poisoned first). With trace
 * non-NULL, *trace receives the call's TARTAN_KMEANS_TRACE line (free it).
 */
static void kmeans_gpu_with(const char *var, const char *val, const float *x, size_t n, size_t dim,
                            size_t k, int per, float *centroids, char **trace)
{
    char path[] = "/tmp/check_index_gpu_traceXXXXXX";
    int fd = -1, save2 = -1;
    if (trace) {
        ck_assert_int_ge(fd = mkstemp(path), 0);
        fflush(stderr);
        ck_assert_int_ge(save2 = dup(2), 0);
        ck_assert_int_ge(dup2(fd, 2), 0);
        ck_assert_int_eq(setenv("TARTAN_KMEANS_TRACE", "1", 1), 0);
    }
    ck_assert_int_eq(val ? setenv(var, val, 1) : unsetenv(var), 0);
    poison(centroids, k * dim);
    store_msg m = {{0}};
    int rc = idx_kmeans_device(KERN_DEV_CUDA, x, n, dim, k, 4, per, 42, centroids, &m);
    ck_assert_int_eq(unsetenv(var), 0);
    if (trace) {
        ck_assert_int_eq(unsetenv("TARTAN_KMEANS_TRACE"), 0);
        fflush(stderr);
        dup2(save2, 2);
        close(save2);
        close(fd);
        size_t len = 0;
        *trace = (char *)fx_read_file(path, &len);
        unlink(path);
    }
    ck_assert_msg(rc == 0, "%s=%s: %s", var, val ? val : "(unset)", m.text);
}

START_TEST(test_index_gpu_kmeans_resident)
{
    /* k-means keeps its points on the GPU across iterations where they fit: the same
     * centroids, bit for bit, as uploading them chunk by chunk at every iteration
     * (TARTAN_KMEANS_RESIDENT=0), with a subset (64 a centroid) and with every point. */
    enum { N = 60000, D = 128, K = 512 };
    float *x = xmalloc(sizeof(float) * N * D), *a = xmalloc(sizeof(float) * K * D);
    float *b = xmalloc(sizeof(float) * K * D);
    clustered(x, N, D, 1000);
    const int per[2] = {64, 256};
    for (int t = 0; t < 2; t++) {
        kmeans_gpu_with("TARTAN_KMEANS_RESIDENT", NULL, x, N, D, K, per[t], a, NULL);
        kmeans_gpu_with("TARTAN_KMEANS_RESIDENT", "0", x, N, D, K, per[t], b, NULL);
        ck_assert_msg(memcmp(a, b, sizeof(float) * K * D) == 0,
                      "per %d: resident points gave other centroids", per[t]);
    }
    free(x);
    free(a);
    free(b);
}
END_TEST

/* A coordinate that kern_cuda_cluster_sums must round exactly like idx_fixed_point: mostly
 * ordinary values of a unit vector, but also exact ties of the rounding (odd multiples of
 * 2^-31, which scale to half-integers; below 2^-7 in magnitude, where floats are that fine),
 * +-1, zeros and values that round to 0 or +-1. */
static float sum_test_value(void)
{
    switch (rnd_below(8)) {
    case 0:
    case 1:
        /* (2a + 1) * 2^-31, a below 2^23: exact in a float (at most 24 significant bits) and
         * a tie after scaling, half of them rounding down to even, half up. */
        return (float)((double)(2 * rnd_below((size_t)1 << 23) + 1) * ldexp(1.0, -31) *
                       (rnd_below(2) ? 1.0 : -1.0));
    case 2: {
        static const float special[] = {1.0f,      -1.0f,     0.0f,      -0.0f,    0x1p-32f,
                                        -0x1p-32f, 0x3p-32f,  -0x3p-32f, 0x1p-31f, -0x1p-31f,
                                        0x3p-31f,  -0x3p-31f, 1e-12f,    -1e-12f};
        return special[rnd_below(sizeof special / sizeof special[0])];
    }
    default:
        return (float)(gauss() / sqrt(128.0));
    }
}

START_TEST(test_index_gpu_cluster_sums)
{
    /* The GPU's fixed-point cluster sums (kern_cuda_cluster_sums) against the same sums on the
     * host: idx_fixed_point's integers added in int64. Bit for bit, counts equal, every slot
     * written (poisoned first, empty clusters included); a code not below k is left out. Dims
     * that fill the warp's lanes and dims that do not; one cluster crowded (atomics in
     * contention), some never used. */
    static const struct {
        size_t n, k, dim;
    } shapes[] = {{1, 1, 128},     {0, 7, 64},     {5000, 300, 128}, {20011, 4096, 128},
                  {3001, 50, 100}, {777, 1000, 7}, {4000, 64, 300}};
    /* idx_fixed_point is the integer nearest to v * 2^30, ties to even (the GPU's __double2ll_rn
     * rounding): the claim both paths rest on, checked on ties of both parities. */
    for (int t = 0; t < 10000; t++) {
        float v = sum_test_value();
        ck_assert_msg(idx_fixed_point(v) == nearbyint((double)v * IDX_SUM_SCALE), "%a", v);
    }
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        size_t n = shapes[t].n, k = shapes[t].k, dim = shapes[t].dim;
        float *x = xmalloc(sizeof(float) * (n ? n : 1) * dim);
        uint32_t *codes = xmalloc(sizeof(uint32_t) * (n ? n : 1));
        int64_t *want = xcalloc(k * dim + k, sizeof(int64_t));
        int64_t *got = xmalloc(sizeof(int64_t) * (k * dim + k));
        size_t ties = 0, left_out = 0;
        for (size_t i = 0; i < n * dim; i++) {
            x[i] = sum_test_value();
            double sc = (double)x[i] * IDX_SUM_SCALE;
            ties += sc - floor(sc) == 0.5;
        }
        for (size_t i = 0; i < n; i++) {
            size_t r = rnd_below(10);
            if (r == 0)
                codes[i] = 0; /* the crowded cluster */
            else if (r == 1 && t == 2)
                codes[i] = (uint32_t)(k + rnd_below(3)); /* no such cluster: left out */
            else
                codes[i] = (uint32_t)(rnd_below(k) / 3 * 3); /* two clusters in three stay empty */
            if (codes[i] >= k) {
                left_out++;
                continue;
            }
            int64_t *w = want + (size_t)codes[i] * dim;
            for (size_t j = 0; j < dim; j++)
                w[j] += (int64_t)idx_fixed_point(x[i * dim + j]);
            want[k * dim + codes[i]]++;
        }
        ck_assert(n * dim < 1000 || ties > n * dim / 8);
        ck_assert(t != 2 || left_out > 0);
        float *dx;
        uint32_t *dc;
        int64_t *ds;
        ck_assert_int_eq(kern_cuda_malloc((void **)&dx, sizeof(float) * (n ? n : 1) * dim), 0);
        ck_assert_int_eq(kern_cuda_malloc((void **)&dc, sizeof(uint32_t) * (n ? n : 1)), 0);
        ck_assert_int_eq(kern_cuda_malloc((void **)&ds, sizeof(int64_t) * (k * dim + k)), 0);
        ck_assert_int_eq(kern_cuda_upload(dx, x, sizeof(float) * n * dim), 0);
        ck_assert_int_eq(kern_cuda_upload(dc, codes, sizeof(uint32_t) * n), 0);
        memset(got, 0xab, sizeof(int64_t) * (k * dim + k));
        ck_assert_int_eq(kern_cuda_upload(ds, got, sizeof(int64_t) * (k * dim + k)), 0);
        ck_assert_int_eq(kern_cuda_cluster_sums(dx, n, dim, dc, k, ds, ds + k * dim), KERN_OK);
        ck_assert_int_eq(kern_cuda_download(got, ds, sizeof(int64_t) * (k * dim + k)), 0);
        for (size_t c = 0; c < k; c++) {
            ck_assert_msg(got[k * dim + c] == want[k * dim + c],
                          "shape %zu: cluster %zu has %lld points, the GPU counted %lld", t, c,
                          (long long)want[k * dim + c], (long long)got[k * dim + c]);
            for (size_t j = 0; j < dim; j++)
                ck_assert_msg(got[c * dim + j] == want[c * dim + j],
                              "shape %zu: cluster %zu dim %zu: %lld, the GPU %lld", t, c, j,
                              (long long)want[c * dim + j], (long long)got[c * dim + j]);
        }
        /* Bad sizes are refused, not launched. */
        ck_assert_int_eq(kern_cuda_cluster_sums(dx, n, dim, dc, 0, ds, ds), KERN_EINVAL);
        ck_assert_int_eq(kern_cuda_cluster_sums(dx, n, 0, dc, k, ds, ds), KERN_EINVAL);
        kern_cuda_free(dx);
        kern_cuda_free(dc);
        kern_cuda_free(ds);
        free(x);
        free(codes);
        free(want);
        free(got);
    }
}
END_TEST

START_TEST(test_index_gpu_kmeans_sums_on_gpu)
{
    /* Where its points are resident, k-means sums its clusters on the GPU: the same centroids,
     * byte for byte, as the host's sums (TARTAN_KMEANS_SUMS=cpu), with a subset (32 a
     * centroid) and with every point, in bf16 (the default where the GPU has tensor cores) and
     * in fp32; the trace says where each ran, so that the comparison is not of the host with
     * itself. 1,000 centroids for points near 700 directions: clusters may empty, and their
     * refill then follows the GPU's sums. */
    enum { N = 60000, D = 128, K = 1000 };
    float *x = xmalloc(sizeof(float) * N * D), *a = xmalloc(sizeof(float) * K * D);
    float *b = xmalloc(sizeof(float) * K * D);
    clustered(x, N, D, 700);
    const int per[2] = {32, 256};
    for (int t = 0; t < 4; t++) {
        ck_assert_int_eq(
            t < 2 ? unsetenv("TARTAN_KMEANS_BF16") : setenv("TARTAN_KMEANS_BF16", "0", 1), 0);
        char *ta = NULL, *tb = NULL;
        kmeans_gpu_with("TARTAN_KMEANS_SUMS", NULL, x, N, D, K, per[t % 2], a, &ta);
        kmeans_gpu_with("TARTAN_KMEANS_SUMS", "cpu", x, N, D, K, per[t % 2], b, &tb);
        ck_assert_msg(strstr(ta, "(on the GPU)") != NULL, "trace: %s", ta);
        ck_assert_msg(strstr(tb, "(on the CPU)") != NULL, "trace: %s", tb);
        fprintf(stderr, "kmeans_sums_on_gpu, run %d:\n  %s  %s", t, ta, tb);
        for (size_t i = 0; i < K; i++) {
            double nn = dot_d(a + i * D, a + i * D, D);
            ck_assert_msg(fabs(nn - 1.0) < 1e-5, "centroid %zu: squared norm %f", i, nn);
        }
        ck_assert_msg(memcmp(a, b, sizeof(float) * K * D) == 0,
                      "run %d (per %d): the GPU's sums gave other centroids", t, per[t % 2]);
        free(ta);
        free(tb);
    }
    ck_assert_int_eq(unsetenv("TARTAN_KMEANS_BF16"), 0);
    free(x);
    free(a);
    free(b);
}
END_TEST

/* The mean over the points of their best score against centroids (idx_assign on the GPU). */
static double mean_best_score(const float *x, size_t n, const float *c, size_t k, size_t dim)
{
    uint32_t *codes = xmalloc(sizeof(uint32_t) * n);
    float *sc = xmalloc(sizeof(float) * n);
    store_msg m = {{0}};
    ck_assert_msg(idx_assign(KERN_DEV_CUDA, c, k, dim, x, n, codes, sc, &m) == 0, "%s", m.text);
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += sc[i];
    free(codes);
    free(sc);
    return s / (double)n;
}

START_TEST(test_index_gpu_kmeans_bf16)
{
    /* Where the GPU has tensor cores (sm_80+), its k-means iterations assign in bf16 by default,
     * as the CPU does on AMX: the centroids differ a little from fp32's but serve the points as
     * well (mean best cosine within 0.002), are reproducible bit for bit, and
     * TARTAN_KMEANS_BF16=0 gives fp32's again. */
    ck_assert_int_eq(unsetenv("TARTAN_KMEANS_BF16"), 0);
    if (!kern_nearest_centroid_bf16_path(KERN_DEV_CUDA)) {
        ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CUDA), 0);
        fprintf(stderr, "kmeans_bf16: no tensor-core path on this GPU; skipped\n");
        return;
    }
    ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CUDA), 1);
    enum { N = 60000, D = 128, K = 1024 };
    float *x = xmalloc(sizeof(float) * N * D), *a = xmalloc(sizeof(float) * K * D);
    float *b = xmalloc(sizeof(float) * K * D), *f = xmalloc(sizeof(float) * K * D);
    clustered(x, N, D, 2000);
    store_msg m = {{0}};
    poison(a, K * D);
    poison(b, K * D);
    ck_assert_msg(idx_kmeans_device(KERN_DEV_CUDA, x, N, D, K, 4, 256, 42, a, &m) == 0, "%s",
                  m.text);
    ck_assert_msg(idx_kmeans_device(KERN_DEV_CUDA, x, N, D, K, 4, 256, 42, b, &m) == 0, "%s",
                  m.text);
    ck_assert(memcmp(a, b, sizeof(float) * K * D) == 0);
    ck_assert_int_eq(setenv("TARTAN_KMEANS_BF16", "0", 1), 0);
    ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CUDA), 0);
    poison(f, K * D);
    ck_assert_msg(idx_kmeans_device(KERN_DEV_CUDA, x, N, D, K, 4, 256, 42, f, &m) == 0, "%s",
                  m.text);
    ck_assert_int_eq(unsetenv("TARTAN_KMEANS_BF16"), 0);
    size_t differ = 0;
    for (size_t i = 0; i < K; i++) {
        double nn = dot_d(a + i * D, a + i * D, D);
        ck_assert_msg(fabs(nn - 1.0) < 1e-5, "centroid %zu: squared norm %f", i, nn);
        differ += memcmp(a + i * D, f + i * D, sizeof(float) * D) != 0;
    }
    double obj_f = mean_best_score(x, N, f, K, D), obj_b = mean_best_score(x, N, a, K, D);
    fprintf(stderr,
            "kmeans_bf16 (gpu): mean best cosine fp32 %.6f, bf16 %.6f; %zu of %d "
            "centroids differ\n",
            obj_f, obj_b, differ, (int)K);
    ck_assert_msg(fabs(obj_f - obj_b) < 2e-3, "fp32 %.6f, bf16 %.6f", obj_f, obj_b);
    free(x);
    free(a);
    free(b);
    free(f);
}
END_TEST

/* One document's stored bytes, read through the index layer. */
typedef struct stored {
    size_t ntok;
    uint32_t *codes;
    uint8_t *res;
    float *inv;
} stored;

static void read_all(tartan_db *db, size_t n_docs, stored *out, size_t *token_bytes)
{
    idx_reader r;
    store_msg m = {{0}};
    ck_assert_msg(idx_reader_open(db->env, &r, &m) == 0, "%s", m.text);
    *token_bytes = r.h.token_bytes;
    for (size_t d = 0; d < n_docs; d++) {
        uint32_t docno;
        char id[32];
        snprintf(id, sizeof id, "d%zu", d);
        ck_assert_int_eq(idx_reader_docno(&r, id, &docno, &m), 0);
        kern_pdoc doc;
        ck_assert_msg(idx_reader_doc(&r, docno, &doc, &m) == 0, "%s", m.text);
        out[d].ntok = doc.ntok;
        out[d].codes = xmalloc(doc.ntok * sizeof(uint32_t));
        out[d].res = xmalloc((size_t)doc.ntok * r.h.token_bytes);
        out[d].inv = xmalloc(doc.ntok * sizeof(float));
        for (uint32_t t = 0; t < doc.ntok; t++)
            out[d].codes[t] = r.h.code_bytes == 2 ? ((const uint16_t *)doc.codes)[t]
                                                  : ((const uint32_t *)doc.codes)[t];
        memcpy(out[d].res, doc.residuals, (size_t)doc.ntok * r.h.token_bytes);
        memcpy(out[d].inv, doc.inv_norms, doc.ntok * sizeof(float));
    }
    idx_reader_close(&r);
}

static tartan_db *open_ix(const char *path, tartan_device dev, int create)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = create ? TARTAN_CREATE | TARTAN_EXCL : 0;
    o.dim = 128;
    o.nbits = 2;
    o.n_centroids = 2048;
    o.seed = 7;
    o.device = dev;
    tartan_db *db = NULL;
    ck_assert_msg(tartan_open(path, &o, &db) == 0, "%s", tartan_errmsg(NULL));
    return db;
}

START_TEST(test_index_gpu_encode_identical)
{
    /* Two indexes with the same model (trained on the CPU, same seed), the same documents
     * added, one encoded on the CPU and one on the GPU: the same bytes, near-ties aside. */
    enum { DOCS = 2000, DIM = 128 };
    fixture_dir_create("index-gpu");
    size_t *lens = xmalloc(sizeof(size_t) * DOCS), total = 0;
    char **ids = xmalloc(sizeof(char *) * DOCS);
    for (size_t d = 0; d < DOCS; d++) {
        lens[d] = 20 + rnd() % 90;
        total += lens[d];
        ids[d] = xmalloc(32);
        snprintf(ids[d], 32, "d%zu", d);
    }
    float *emb = xmalloc(sizeof(float) * total * DIM);
    clustered(emb, total, DIM, 500);
    tartan_batch b = {DOCS, (const char *const *)ids, lens, emb, total, DIM, TARTAN_FLOAT32};
    char pa[400], pb[400];
    snprintf(pa, sizeof pa, "%s/a", tmpdir);
    snprintf(pb, sizeof pb, "%s/b", tmpdir);
    /* One model: trained once, the index directory copied before anything is added. */
    tartan_db *a = open_ix(pa, TARTAN_DEVICE_CPU, 1);
    ck_assert_msg(tartan_train(a, &b, total) == 0, "%s", tartan_errmsg(a));
    tartan_close(a);
    char cmd[900];
    snprintf(cmd, sizeof cmd, "cp -R '%s' '%s'", pa, pb);
    ck_assert_int_eq(system(cmd), 0);
    a = open_ix(pa, TARTAN_DEVICE_CPU, 0);
    tartan_db *g = open_ix(pb, TARTAN_DEVICE_CUDA, 0);
    ck_assert_msg(tartan_add(a, &b, 0) == 0, "%s", tartan_errmsg(a));
    ck_assert_msg(tartan_add(g, &b, 0) == 0, "%s", tartan_errmsg(g));
    stored *sa = xmalloc(sizeof(stored) * DOCS), *sg = xmalloc(sizeof(stored) * DOCS);
    size_t tb, tb2;
    read_all(a, DOCS, sa, &tb);
    read_all(g, DOCS, sg, &tb2);
    ck_assert_uint_eq(tb, tb2);
    /* The centroids, to judge a differing code. */
    idx_reader r;
    store_msg m = {{0}};
    ck_assert_int_eq(idx_reader_open(a->env, &r, &m), 0);
    size_t differ = 0, at = 0;
    for (size_t d = 0; d < DOCS; d++) {
        ck_assert_uint_eq(sa[d].ntok, sg[d].ntok);
        for (size_t t = 0; t < sa[d].ntok; t++, at++) {
            if (sa[d].codes[t] != sg[d].codes[t]) {
                differ += same_or_near_tie(r.centroids, DIM, emb + at * DIM, sa[d].codes[t],
                                           sg[d].codes[t], at);
                continue;
            }
            ck_assert(memcmp(sa[d].res + t * tb, sg[d].res + t * tb, tb) == 0);
            ck_assert(memcmp(&sa[d].inv[t], &sg[d].inv[t], sizeof(float)) == 0);
        }
        free(sa[d].codes);
        free(sa[d].res);
        free(sa[d].inv);
        free(sg[d].codes);
        free(sg[d].res);
        free(sg[d].inv);
    }
    idx_reader_close(&r);
    ck_assert_msg(differ <= total / 1000 + 1, "%zu of %zu tokens differ", differ, total);
    printf("encode_identical: %zu tokens, %zu near-ties\n", total, differ);
    tartan_close(a);
    tartan_close(g);
    for (size_t d = 0; d < DOCS; d++)
        free(ids[d]);
    free(ids);
    free(lens);
    free(emb);
    free(sa);
    free(sg);
    fixture_dir_remove();
}
END_TEST

START_TEST(test_index_gpu_build_trains_on_gpu)
{
    /* A first add on a CUDA handle trains with the device k-means and encodes on the GPU:
     * every token's code is its nearest stored centroid (near-ties aside). */
    enum { DOCS = 600, DIM = 128 };
    fixture_dir_create("index-gpu-train");
    size_t *lens = xmalloc(sizeof(size_t) * DOCS), total = 0;
    char **ids = xmalloc(sizeof(char *) * DOCS);
    for (size_t d = 0; d < DOCS; d++) {
        lens[d] = 30 + rnd() % 50;
        total += lens[d];
        ids[d] = xmalloc(32);
        snprintf(ids[d], 32, "d%zu", d);
    }
    float *emb = xmalloc(sizeof(float) * total * DIM);
    clustered(emb, total, DIM, 300);
    tartan_batch b = {DOCS, (const char *const *)ids, lens, emb, total, DIM, TARTAN_FLOAT32};
    tartan_db *g = open_ix(ixpath, TARTAN_DEVICE_CUDA, 1);
    ck_assert_msg(tartan_add(g, &b, 0) == 0, "%s", tartan_errmsg(g));
    stored *sg = xmalloc(sizeof(stored) * DOCS);
    size_t tb;
    read_all(g, DOCS, sg, &tb);
    idx_reader r;
    store_msg m = {{0}};
    ck_assert_int_eq(idx_reader_open(g->env, &r, &m), 0);
    ck_assert_uint_eq(r.h.n_centroids, 2048);
    size_t at = 0;
    uint32_t *ref = xmalloc(sizeof(uint32_t) * total);
    ck_assert_int_eq(idx_assign(KERN_DEV_CPU, r.centroids, 2048, DIM, emb, total, ref, NULL, &m),
                     0);
    for (size_t d = 0; d < DOCS; d++) {
        for (size_t t = 0; t < sg[d].ntok; t++, at++)
            same_or_near_tie(r.centroids, DIM, emb + at * DIM, sg[d].codes[t], ref[at], at);
        free(sg[d].codes);
        free(sg[d].res);
        free(sg[d].inv);
    }
    idx_reader_close(&r);
    tartan_close(g);
    for (size_t d = 0; d < DOCS; d++)
        free(ids[d]);
    free(ids);
    free(lens);
    free(emb);
    free(sg);
    free(ref);
    fixture_dir_remove();
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"nearest_matches_double", test_index_gpu_nearest_matches_double, 300},
        {"nearest_ties_go_to_lower_index", test_index_gpu_nearest_ties_go_to_lower_index, 60},
        {"assign_matches_cpu", test_index_gpu_assign_matches_cpu, 300},
        {"kmeans_matches_cpu", test_index_gpu_kmeans_matches_cpu, 300},
        {"kmeans_resident", test_index_gpu_kmeans_resident, 0},
        {"cluster_sums", test_index_gpu_cluster_sums, 300},
        {"kmeans_sums_on_gpu", test_index_gpu_kmeans_sums_on_gpu, 300},
        {"kmeans_bf16", test_index_gpu_kmeans_bf16, 300},
        {"encode_identical", test_index_gpu_encode_identical, 300},
        {"build_trains_on_gpu", test_index_gpu_build_trains_on_gpu, 300},
    };
    return FX_RUN("index_gpu", cases, FX_GPU, 0);
}
