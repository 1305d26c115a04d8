/*
 * check_index_train.c: the index layer's training: spherical k-means (clusters recovered,
 * centroids normalised, reproducible, silent, bad arguments refused; on the kernels' device
 * path too), flat inner-product search, the sizing plan, and nearest-centroid assignment, each
 * against a plain double-precision reference computed here; k-means skipping rows against
 * k-means without them; outputs are poisoned first.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "assign.h"
#include "codec.h"
#include "fixture.h"
#include "kernels.h"
#include "kernels_impl.h"
#include "kmeans.h"
#include "microkernel_cpu.h"
#include "model.h"
#include "plan.h"
#include "rand.h"
#include "store.h"
#include "tartan.h"

/* ---- k-means ------------------------------------------------------------------------ */

enum { KM_DIM = 32, KM_CL = 8, KM_K = 64, KM_N = 12000 };

START_TEST(test_index_kmeans_recovers_clusters)
{
    float *centers = xmalloc(sizeof(float) * KM_CL * KM_DIM);
    float *x = xmalloc(sizeof(float) * KM_N * KM_DIM);
    float *cen = xmalloc(sizeof(float) * KM_K * KM_DIM);
    /* sigma 0.03 at dim 32: points at cosine ~0.985 to their center, clusters far apart. k is
     * 8 x the true count so that random initialisation puts a centroid in every cluster. */
    fx_clustered(11, KM_N, KM_DIM, KM_CL, 0.03, centers, x);
    poison(cen, KM_K * KM_DIM);
    char err[256] = "";
    ck_assert_int_eq(idx_kmeans_spherical(x, KM_N, KM_DIM, KM_K, 4, 256, 7, cen, err, sizeof err),
                     0);
    for (size_t c = 0; c < KM_CL; c++) {
        double best = -2.0;
        for (size_t i = 0; i < KM_K; i++) {
            double cs = cosine_d(centers + c * KM_DIM, cen + i * KM_DIM, KM_DIM);
            if (cs > best)
                best = cs;
        }
        ck_assert_msg(best > 0.99, "true center %zu: best centroid cosine %.4f", c, best);
    }
    /* And no centroid is off in empty space: each lies near some true center. */
    for (size_t i = 0; i < KM_K; i++) {
        double best = -2.0;
        for (size_t c = 0; c < KM_CL; c++) {
            double cs = cosine_d(centers + c * KM_DIM, cen + i * KM_DIM, KM_DIM);
            if (cs > best)
                best = cs;
        }
        ck_assert_msg(best > 0.95, "centroid %zu: nearest true center cosine %.4f", i, best);
    }
    free(centers);
    free(x);
    free(cen);
}
END_TEST

START_TEST(test_index_kmeans_centroids_normalised)
{
    /* Realistic spread (cosine ~0.8 within clusters), and the n == k case, where FAISS copies
     * the points instead of iterating. Unnormalised inputs test that the bridge normalises. */
    enum { N = 3000, D = 48, K = 40 };
    float *centers = xmalloc(sizeof(float) * 10 * D);
    float *x = xmalloc(sizeof(float) * N * D);
    float *cen = xmalloc(sizeof(float) * K * D);
    fx_clustered(21, N, D, 10, 0.1, centers, x);
    for (size_t i = 0; i < (size_t)N * D; i++)
        x[i] *= 3.0f;
    char err[256] = "";
    size_t ks[2] = {K, K};
    size_t ns[2] = {N, K};
    for (int t = 0; t < 2; t++) {
        poison(cen, K * D);
        ck_assert_int_eq(idx_kmeans_spherical(x, ns[t], D, ks[t], 4, 256, 3, cen, err, sizeof err),
                         0);
        for (size_t i = 0; i < ks[t]; i++) {
            double nrm = sqrt(dot_d(cen + i * D, cen + i * D, D));
            ck_assert_msg(fabs(nrm - 1.0) < 1e-5, "centroid %zu norm %.8f", i, nrm);
        }
    }
    free(centers);
    free(x);
    free(cen);
}
END_TEST

START_TEST(test_index_kmeans_reproducible)
{
    enum { N = 4000, D = 32, K = 32 };
    float *centers = xmalloc(sizeof(float) * 16 * D);
    float *x = xmalloc(sizeof(float) * N * D);
    float *a = xmalloc(sizeof(float) * K * D);
    float *b = xmalloc(sizeof(float) * K * D);
    float *c = xmalloc(sizeof(float) * K * D);
    fx_clustered(31, N, D, 16, 0.1, centers, x);
    char err[256] = "";
    poison(a, K * D);
    poison(b, K * D);
    poison(c, K * D);
    ck_assert_int_eq(idx_kmeans_spherical(x, N, D, K, 4, 256, 1234, a, err, sizeof err), 0);
    ck_assert_int_eq(idx_kmeans_spherical(x, N, D, K, 4, 256, 1234, b, err, sizeof err), 0);
    ck_assert_int_eq(idx_kmeans_spherical(x, N, D, K, 4, 256, 99, c, err, sizeof err), 0);
    ck_assert_msg(memcmp(a, b, sizeof(float) * K * D) == 0, "same seed, different centroids");
    ck_assert_msg(memcmp(a, c, sizeof(float) * K * D) != 0, "seed has no effect");
    free(centers);
    free(x);
    free(a);
    free(b);
    free(c);
}
END_TEST

START_TEST(test_index_kmeans_rejects_bad_arguments)
{
    enum { N = 10, D = 8 };
    float x[N * D], cen[(N + 1) * D];
    uint64_t s = 5;
    for (size_t i = 0; i < N * D; i++)
        x[i] = (float)rng_gauss(&s);
    char err[256];
    /* k > n is an error (documented in faiss_bridge.cpp), with a message naming both. */
    err[0] = '\0';
    ck_assert_int_eq(idx_kmeans_spherical(x, N, D, N + 1, 4, 256, 1, cen, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "11") && strstr(err, "10"), "message: %s", err);
    err[0] = '\0';
    ck_assert_int_eq(idx_kmeans_spherical(x, 0, D, 1, 4, 256, 1, cen, err, sizeof err), -1);
    ck_assert_int_gt(strlen(err), 0);
    err[0] = '\0';
    ck_assert_int_eq(idx_kmeans_spherical(x, N, D, 0, 4, 256, 1, cen, err, sizeof err), -1);
    ck_assert_int_gt(strlen(err), 0);
    ck_assert_int_eq(idx_kmeans_spherical(NULL, N, D, 2, 4, 256, 1, cen, err, sizeof err), -1);
    ck_assert_int_eq(idx_kmeans_spherical(x, N, D, 2, 0, 256, 1, cen, err, sizeof err), -1);
    /* A NULL or empty err buffer is allowed. */
    ck_assert_int_eq(idx_kmeans_spherical(x, N, D, N + 1, 4, 256, 1, cen, NULL, 0), -1);
    ck_assert_int_eq(idx_flat_ip_search(x, N, D, x, 1, 0, NULL, NULL, err, sizeof err), -1);
    ck_assert_int_eq(idx_flat_ip_search(x, 0, D, x, 1, 1, NULL, NULL, err, sizeof err), -1);
}
END_TEST

START_TEST(test_index_kmeans_prints_nothing)
{
    /* FAISS warns on stderr below 39 points per centroid and reports progress on stdout when
     * verbose; the library must print nothing. 2 points per centroid, and a cap of 1 point per
     * centroid so that the subsampling path runs too. */
    enum { N = 256, D = 16, K = 128 };
    float *centers = xmalloc(sizeof(float) * 8 * D);
    float *x = xmalloc(sizeof(float) * N * D);
    float *cen = xmalloc(sizeof(float) * K * D);
    fx_clustered(131, N, D, 8, 0.1, centers, x);
    char path[] = "/tmp/check_index_outXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stdout);
    fflush(stderr);
    int save1 = dup(1), save2 = dup(2);
    dup2(fd, 1);
    dup2(fd, 2);
    char err[256] = "";
    int rc1 = idx_kmeans_spherical(x, N, D, K, 4, 256, 5, cen, err, sizeof err);
    int rc2 = idx_kmeans_spherical(x, N, D, K / 2, 4, 1, 5, cen, err, sizeof err);
    int rc3 = idx_kmeans_spherical(x, N, D, N + 1, 4, 256, 5, cen, err, sizeof err);
    fflush(stdout);
    fflush(stderr);
    dup2(save1, 1);
    dup2(save2, 2);
    close(save1);
    close(save2);
    off_t size = lseek(fd, 0, SEEK_END);
    close(fd);
    unlink(path);
    ck_assert_int_eq(rc1, 0);
    ck_assert_int_eq(rc2, 0);
    ck_assert_int_eq(rc3, -1);
    ck_assert_msg(size == 0, "k-means wrote %lld bytes to stdout/stderr", (long long)size);
    free(centers);
    free(x);
    free(cen);
}
END_TEST

/* The centroid sums' rounding (idx_fixed_point) is nearbyint's: random coordinates, exact ties
 * at both parities, zeros, the ends of the range and past them. */
START_TEST(test_index_fixed_point_rounds_like_nearbyint)
{
    for (int i = 0; i < 1000000; i++) {
        float v = frnd() * (i % 3 ? 1.0f : 1.001f);
        double want = nearbyint((double)v * IDX_SUM_SCALE), got = idx_fixed_point(v);
        ck_assert_msg(got == want, "%.9g: %.17g, nearbyint %.17g", (double)v, got, want);
    }
    for (int i = 0; i < 100000; i++) {
        /* (2n + 1) / 2^31: half way between two multiples of 2^-30, as a float exactly */
        float v = (float)(2 * (double)rnd_below(1u << 22) + 1) / 2147483648.0f;
        if (i & 1)
            v = -v;
        double want = nearbyint((double)v * IDX_SUM_SCALE), got = idx_fixed_point(v);
        ck_assert_msg(got == want, "tie %.9g: %.17g, nearbyint %.17g", (double)v, got, want);
        ck_assert(fmod(got, 2.0) == 0.0); /* ties go to even */
    }
    const float edge[] = {0.0f,      -0.0f,      1.0f, -1.0f, 0x1p-31f,
                          -0x1p-31f, 0x1.8p-31f, 1.5f, -2.0f, 0x1.fffffep-1f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        ck_assert(idx_fixed_point(edge[i]) == nearbyint((double)edge[i] * IDX_SUM_SCALE));
}
END_TEST

/* One centroid: after k-means it is every point's normalised sum, which the fixed-point sums
 * (gathered by cluster, fetched ahead) must give to within their rounding; in double here. The
 * corpus is large enough that every thread sums a long run of points. */
START_TEST(test_index_kmeans_one_centroid_is_the_mean)
{
    enum { N = 5000, D = 128 };
    float *centers = xmalloc(sizeof(float) * 4 * D);
    float *x = xmalloc(sizeof(float) * N * D);
    float *cen = xmalloc(sizeof(float) * D);
    fx_clustered(rnd(), N, D, 4, 0.3, centers, x);
    poison(cen, D);
    store_msg m = {{0}};
    ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, 1, 2, N, 17, cen, &m), 0);
    double sum[D] = {0}, nrm = 0;
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < D; j++)
            sum[j] += x[i * D + j];
    for (size_t j = 0; j < D; j++)
        nrm += sum[j] * sum[j];
    nrm = sqrt(nrm);
    for (size_t j = 0; j < D; j++)
        ck_assert_msg(fabs(cen[j] - sum[j] / nrm) < 1e-6, "dim %zu: %.9g, mean %.9g", j,
                      (double)cen[j], sum[j] / nrm);
    free(centers);
    free(x);
    free(cen);
}
END_TEST

/* TARTAN_KMEANS_TRACE: one line on stderr a k-means, naming its phases; the same centroids. */
START_TEST(test_index_kmeans_trace)
{
    enum { N = 2000, D = 32, K = 16 };
    float *centers = xmalloc(sizeof(float) * 8 * D);
    float *x = xmalloc(sizeof(float) * N * D);
    float *a = xmalloc(sizeof(float) * K * D), *b = xmalloc(sizeof(float) * K * D);
    fx_clustered(77, N, D, 8, 0.1, centers, x);
    store_msg m = {{0}};
    ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 3, 256, 5, a, &m), 0);
    char path[] = "/tmp/check_index_traceXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int save2 = dup(2);
    dup2(fd, 2);
    setenv("TARTAN_KMEANS_TRACE", "1", 1);
    int rc = idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 3, 256, 5, b, &m);
    unsetenv("TARTAN_KMEANS_TRACE");
    fflush(stderr);
    dup2(save2, 2);
    close(save2);
    close(fd);
    size_t len = 0;
    char *text = (char *)fx_read_file(path, &len);
    unlink(path);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(strstr(text, "k-means, member 0 of 1: 2000 points, 16 centroids, dim 32, 3 "
                               "iterations on the CPU") != NULL,
                  "trace: %s", text);
    ck_assert(strstr(text, "assignment") && strstr(text, "sums") && strstr(text, "update"));
    ck_assert(memchr(text, '\n', len) == text + len - 1); /* one line */
    ck_assert(memcmp(a, b, sizeof(float) * K * D) == 0);
    free(text);
    free(centers);
    free(x);
    free(a);
    free(b);
}
END_TEST

/* ---- flat search -------------------------------------------------------------------- */

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

START_TEST(test_index_flat_search_matches_bruteforce)
{
    enum { K = 500, D = 64, N = 60, TOP = 12 };
    float *c = xmalloc(sizeof(float) * K * D);
    float *q = xmalloc(sizeof(float) * N * D);
    int64_t *lab = xmalloc(sizeof(int64_t) * N * TOP);
    float *sc = xmalloc(sizeof(float) * N * TOP);
    double *ref = xmalloc(sizeof(double) * K);
    uint64_t s = 41;
    for (size_t i = 0; i < (size_t)K * D; i++)
        c[i] = (float)rng_gauss(&s);
    for (size_t i = 0; i < (size_t)N * D; i++)
        q[i] = (float)rng_gauss(&s);
    poison(sc, N * TOP);
    memset(lab, 0xab, sizeof(int64_t) * N * TOP);
    char err[256] = "";
    ck_assert_int_eq(idx_flat_ip_search(c, K, D, q, N, TOP, lab, sc, err, sizeof err), 0);
    for (size_t i = 0; i < N; i++) {
        for (size_t k = 0; k < K; k++)
            ref[k] = dot_d(q + i * D, c + k * D, D);
        double *sorted = xmalloc(sizeof(double) * K);
        memcpy(sorted, ref, sizeof(double) * K);
        qsort(sorted, K, sizeof(double), cmp_desc);
        for (size_t r = 0; r < TOP; r++) {
            int64_t l = lab[i * TOP + r];
            ck_assert(l >= 0 && l < K);
            /* Rank r holds a centroid whose true score is the r-th best (ties aside), and the
             * reported score is that score. */
            ck_assert_msg(fabs(ref[l] - sorted[r]) < 1e-4, "query %zu rank %zu", i, r);
            ck_assert_msg(fabs(sc[i * TOP + r] - ref[l]) < 1e-4, "query %zu rank %zu", i, r);
            for (size_t r2 = 0; r2 < r; r2++)
                ck_assert(lab[i * TOP + r2] != l);
        }
        free(sorted);
    }
    /* Labels only, scores only. */
    int64_t *lab2 = xmalloc(sizeof(int64_t) * N * TOP);
    float *sc2 = xmalloc(sizeof(float) * N * TOP);
    ck_assert_int_eq(idx_flat_ip_search(c, K, D, q, N, TOP, lab2, NULL, err, sizeof err), 0);
    ck_assert(memcmp(lab, lab2, sizeof(int64_t) * N * TOP) == 0);
    poison(sc2, N * TOP);
    ck_assert_int_eq(idx_flat_ip_search(c, K, D, q, N, TOP, NULL, sc2, err, sizeof err), 0);
    ck_assert(memcmp(sc, sc2, sizeof(float) * N * TOP) == 0);
    free(lab2);
    free(sc2);
    free(c);
    free(q);
    free(lab);
    free(sc);
    free(ref);
}
END_TEST

START_TEST(test_index_flat_search_pads_beyond_k)
{
    enum { K = 3, D = 16, TOP = 5 };
    float c[K * D], q[D];
    uint64_t s = 43;
    for (size_t i = 0; i < K * D; i++)
        c[i] = (float)rng_gauss(&s);
    for (size_t i = 0; i < D; i++)
        q[i] = (float)rng_gauss(&s);
    int64_t lab[TOP];
    float sc[TOP];
    poison(sc, TOP);
    char err[256] = "";
    ck_assert_int_eq(idx_flat_ip_search(c, K, D, q, 1, TOP, lab, sc, err, sizeof err), 0);
    for (size_t r = 0; r < K; r++) {
        ck_assert(lab[r] >= 0 && lab[r] < K);
        ck_assert(fabs(sc[r] - dot_d(q, c + lab[r] * D, D)) < 1e-4);
    }
    for (size_t r = K; r < TOP; r++) {
        ck_assert_int_eq(lab[r], -1);
        ck_assert(isinf(sc[r]) && sc[r] < 0);
    }
}
END_TEST

/* ---- plan --------------------------------------------------------------------------- */

START_TEST(test_index_plan_sample_docs)
{
    const size_t ns[] = {0, 1, 2, 100, 1000, 30720, 30721, 123457, 1000000, 8841823, 100000000};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        size_t n = ns[i];
        double want = 1.0 + floor(16.0 * sqrt(120.0 * (double)n));
        size_t ref = want < (double)n ? (size_t)want : n;
        ck_assert_msg(idx_plan_sample_docs(n) == ref, "N %zu: %zu, want %zu", n,
                      idx_plan_sample_docs(n), ref);
        ck_assert(idx_plan_sample_docs(n) <= n);
    }
    /* Worked by hand: 16 sqrt(120 * 10^6) = 175271.2..., so 175272 documents. */
    ck_assert_uint_eq(idx_plan_sample_docs(1000000), 175272);
}
END_TEST

START_TEST(test_index_plan_centroids)
{
    const size_t ns[] = {
        1, 2, 3, 63, 64, 65, 1000, 4096, 65535, 65536, 1000000, 6400000, 8841823ull * 64};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        size_t n = ns[i];
        double x = 16.0 * sqrt((double)n);
        double ref = pow(2.0, floor(log2(x)));
        size_t k = idx_plan_centroids(n);
        ck_assert_msg((double)k == ref, "n %zu: %zu, want %.0f", n, k, ref);
        ck_assert(k <= x && 2.0 * k > x);
    }
    /* Powers of two land exactly: 16 sqrt(64) = 128 and 16 sqrt(65536) = 4096. By hand,
     * 16 sqrt(10^6) = 16000 -> 8192 (ColBERTv2's figure for a million tokens). */
    ck_assert_uint_eq(idx_plan_centroids(64), 128);
    ck_assert_uint_eq(idx_plan_centroids(63), 64);
    ck_assert_uint_eq(idx_plan_centroids(65536), 4096);
    ck_assert_uint_eq(idx_plan_centroids(1000000), 8192);
    ck_assert_uint_eq(idx_plan_centroids(0), 1);
}
END_TEST

/* ---- nearest centroid and device k-means (assign.h) ------------------------------------ */

static void random_units(uint64_t *s, float *x, size_t n, size_t dim)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < dim; j++)
            x[i * dim + j] = (float)rng_gauss(s);
        normalise(x + i * dim, dim);
    }
}

/*
 * A chosen centroid agrees with the double-precision argmax: it is the argmax, or its true
 * score is within fp32 rounding (1e-5 at unit norm) of the best, a near-tie either device may
 * break either way. Its reported score is its true score within fp32 rounding.
 */
static void check_choice(const float *c, size_t k, size_t dim, const float *v, long long chosen,
                         double reported, size_t point)
{
    ck_assert_msg(chosen >= 0 && (size_t)chosen < k, "point %zu: centroid %lld", point, chosen);
    uint32_t ref = nearest_d(c, k, dim, v);
    double best = dot_d(c + (size_t)ref * dim, v, dim);
    double got = dot_d(c + (size_t)chosen * dim, v, dim);
    ck_assert_msg((size_t)chosen == ref || best - got < 1e-5,
                  "point %zu: centroid %lld (%.9f), the best is %u (%.9f)", point, chosen, got, ref,
                  best);
    if (!isnan(reported))
        ck_assert_msg(fabs(reported - got) < 1e-5, "point %zu: score %.9f, true %.9f", point,
                      reported, got);
}

START_TEST(test_index_assign_matches_double)
{
    /* Ragged n (not multiples of any tile), K not a power of two, d 64 / 128 / 256. */
    static const struct {
        size_t n, k, dim;
    } shapes[] = {{1, 1, 64}, {517, 1023, 128}, {1000, 300, 64}, {129, 77, 256}, {70, 4097, 128}};
    uint64_t s = 2024;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        size_t n = shapes[t].n, k = shapes[t].k, dim = shapes[t].dim;
        float *x = xmalloc(sizeof(float) * n * dim);
        float *c = xmalloc(sizeof(float) * k * dim);
        int32_t *best = xmalloc(sizeof(int32_t) * n);
        uint32_t *codes = xmalloc(sizeof(uint32_t) * n);
        float *sc = xmalloc(sizeof(float) * n);
        float *sc2 = xmalloc(sizeof(float) * n);
        random_units(&s, x, n, dim);
        random_units(&s, c, k, dim);
        /* The kernel (what the GPU path mirrors) on the CPU, with every micro-kernel variant
         * this CPU runs: each the same answer as the double reference. */
        static const char *const isas[] = {"generic", "avx2", "avx512", NULL};
        for (size_t v = 0; v < 4; v++) {
            if (isas[v] && !kern_cpu_has_isa(isas[v]))
                continue;
            ck_assert_int_eq(kern_cpu_force_isa(isas[v]), KERN_OK);
            memset(best, 0xab, sizeof(int32_t) * n);
            poison(sc, n);
            ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, n, c, k, dim, best, sc),
                             KERN_OK);
            for (size_t i = 0; i < n; i++)
                check_choice(c, k, dim, x + i * dim, best[i], sc[i], i);
        }
        /* The index layer's CPU path (FAISS). */
        memset(codes, 0xab, sizeof(uint32_t) * n);
        poison(sc2, n);
        store_msg m = {{0}};
        ck_assert_int_eq(idx_assign(KERN_DEV_CPU, c, k, dim, x, n, codes, sc2, &m), 0);
        for (size_t i = 0; i < n; i++) {
            check_choice(c, k, dim, x + i * dim, best[i], sc[i], i);
            check_choice(c, k, dim, x + i * dim, codes[i], sc2[i], i);
        }
        /* Without scores: the same choices. */
        int32_t *best2 = xmalloc(sizeof(int32_t) * n);
        ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, n, c, k, dim, best2, NULL),
                         KERN_OK);
        ck_assert(memcmp(best, best2, sizeof(int32_t) * n) == 0);
        free(best2);
        free(x);
        free(c);
        free(best);
        free(codes);
        free(sc);
        free(sc2);
    }
}
END_TEST

START_TEST(test_index_assign_ties_go_to_lower_index)
{
    /* Centroids 3, 9 and 20 are the same vector; points equal to it score exactly the same
     * against all three and must take 3. */
    enum { K = 33, D = 64, N = 200 };
    float *c = xmalloc(sizeof(float) * K * D);
    float *x = xmalloc(sizeof(float) * N * D);
    int32_t *best = xmalloc(sizeof(int32_t) * N);
    uint64_t s = 99;
    random_units(&s, c, K, D);
    memcpy(c + 9 * D, c + 3 * D, sizeof(float) * D);
    memcpy(c + 20 * D, c + 3 * D, sizeof(float) * D);
    random_units(&s, x, N, D);
    for (size_t i = 0; i < N; i += 2)
        memcpy(x + i * D, c + 3 * D, sizeof(float) * D);
    memset(best, 0xab, sizeof(int32_t) * N);
    ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, N, c, K, D, best, NULL), KERN_OK);
    for (size_t i = 0; i < N; i++) {
        ck_assert(best[i] != 9 && best[i] != 20);
        if (i % 2 == 0)
            ck_assert_int_eq(best[i], 3);
        else
            check_choice(c, K, D, x + i * D, best[i], NAN, i);
    }
    free(c);
    free(x);
    free(best);
    /* Equal centroids in different blocks of the CPU kernel (it scores 512 at a time) and in
     * one group of rows of the micro-kernel: still the lowest index, with every variant. */
    enum { K2 = 1500 };
    static const size_t same[] = {700, 1101, 1499, 1102, 1103};
    float *c2 = xmalloc(sizeof(float) * K2 * D);
    float *x2 = xmalloc(sizeof(float) * N * D);
    int32_t *b2 = xmalloc(sizeof(int32_t) * N);
    random_units(&s, c2, K2, D);
    random_units(&s, x2, N, D);
    for (size_t t = 0; t < sizeof same / sizeof same[0]; t++)
        memcpy(c2 + same[t] * D, c2 + 1100 * D, sizeof(float) * D);
    for (size_t i = 0; i < N; i += 3)
        memcpy(x2 + i * D, c2 + 1100 * D, sizeof(float) * D);
    static const char *const isas[] = {"generic", "avx2", "avx512", NULL};
    for (size_t v = 0; v < 4; v++) {
        if (isas[v] && !kern_cpu_has_isa(isas[v]))
            continue;
        ck_assert_int_eq(kern_cpu_force_isa(isas[v]), KERN_OK);
        memset(b2, 0xab, sizeof(int32_t) * N);
        ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x2, N, c2, K2, D, b2, NULL), KERN_OK);
        for (size_t i = 0; i < N; i++) {
            if (i % 3 == 0)
                ck_assert_int_eq(b2[i], 700);
            else
                check_choice(c2, K2, D, x2 + i * D, b2[i], NAN, i);
        }
    }
    free(c2);
    free(x2);
    free(b2);
}
END_TEST

START_TEST(test_index_assign_same_any_threads)
{
    /* The CPU kernel splits the points over threads in work items sized by the thread count:
     * the same choices and scores, bit for bit, whatever that count. */
    enum { N = 3001, K = 2000, D = 96 };
    float *x = xmalloc(sizeof(float) * N * D), *c = xmalloc(sizeof(float) * K * D);
    int32_t *b1 = xmalloc(sizeof(int32_t) * N), *b2 = xmalloc(sizeof(int32_t) * N);
    float *s1 = xmalloc(sizeof(float) * N), *s2 = xmalloc(sizeof(float) * N);
    uint64_t s = 4711;
    random_units(&s, x, N, D);
    random_units(&s, c, K, D);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, N, c, K, D, b1, s1), KERN_OK);
    for (int t = 2; t <= 5; t += 3) {
#ifdef _OPENMP
        omp_set_num_threads(t);
#endif
        memset(b2, 0xab, sizeof(int32_t) * N);
        poison(s2, N);
        ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, N, c, K, D, b2, s2), KERN_OK);
        ck_assert_msg(memcmp(b1, b2, sizeof(int32_t) * N) == 0, "1 and %d threads differ", t);
        ck_assert_msg(memcmp(s1, s2, sizeof(float) * N) == 0, "1 and %d threads differ", t);
    }
    for (size_t i = 0; i < N; i += 97)
        check_choice(c, K, D, x + i * D, b1[i], s1[i], i);
    free(x);
    free(c);
    free(b1);
    free(b2);
    free(s1);
    free(s2);
}
END_TEST

/* x rounded to bf16 (nearest even), back in fp32: what the bf16 kernel multiplies. */
static float *bf16_copy(const float *x, size_t n)
{
    float *r = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        r[i] = kern_bf16_to_f32(kern_f32_to_bf16(x[i]));
    return r;
}

START_TEST(test_index_nearest_bf16_matches_double)
{
    /* The bf16 kernel against a double-precision argmax of the bf16-rounded inputs, on random
     * shapes: n not a multiple of the 32-lane panel nor of a work item, K not a multiple of the
     * 8-row group nor of a block (1,024 rows at d 128), odd and even dims. Every product of two
     * bf16 values is exact in fp32, so the kernel's scores are the reference's within fp32
     * accumulation error (1e-5 at unit norm); a different choice must be a near-tie within that.
     * The fp32 kernel's scores are not (bf16 rounding moves them by ~4e-4), so a kernel that
     * did not round would fail the score check. */
    rng_init_random();
    if (!kern_nearest_centroid_bf16_path(KERN_DEV_CPU)) {
        /* Neither AMX nor AVX512_BF16 here: the call says so, and k-means falls back to fp32. */
        float x[4] = {1, 0, 0, 0};
        int32_t b;
        ck_assert_int_eq(kern_nearest_centroid_bf16(KERN_DEV_CPU, x, 1, x, 1, 4, &b, NULL),
                         KERN_ENODEV);
        ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CPU), 0);
        fprintf(stderr, "nearest_bf16: this CPU has no AVX512_BF16; only the fallback checked\n");
        return;
    }
    /* Both ways where the CPU has both: AMX tiles (32 x 32 blocks, dims padded to 32), then
     * the AVX512_BF16 micro-kernel. */
    int paths = 1 + (kern_cpu_use_amx(1) == KERN_OK && kern_cpu_has_isa("avx512bf16"));
    for (int t = 0; t < 8 * paths; t++) {
        if (t == 8)
            ck_assert_int_eq(kern_cpu_use_amx(0), KERN_OK);
        size_t n = t % 8 == 0 ? 1 : urnd(2, 1500), k = t % 8 == 0 ? 1 : urnd(2, 2600);
        static const size_t dims[] = {128, 33, 64, 96, 127, 2, 256};
        size_t dim = dims[rnd_below(sizeof dims / sizeof dims[0])];
        if (t % 8 == 1) { /* a block boundary and a ragged group at the default shape */
            k = 1024 + 8 + 3;
            dim = 128;
        }
        uint64_t s = rnd();
        float *x = xmalloc(sizeof(float) * n * dim), *c = xmalloc(sizeof(float) * k * dim);
        random_units(&s, x, n, dim);
        random_units(&s, c, k, dim);
        float *xr = bf16_copy(x, n * dim), *cr = bf16_copy(c, k * dim);
        int32_t *best = xmalloc(sizeof(int32_t) * n), *best2 = xmalloc(sizeof(int32_t) * n);
        float *sc = xmalloc(sizeof(float) * n);
        memset(best, 0xab, sizeof(int32_t) * n);
        poison(sc, n);
        ck_assert_int_eq(kern_nearest_centroid_bf16(KERN_DEV_CPU, x, n, c, k, dim, best, sc),
                         KERN_OK);
        size_t differ = 0;
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(best[i] >= 0 && (size_t)best[i] < k, "n %zu k %zu d %zu point %zu: %d", n,
                          k, dim, i, best[i]);
            uint32_t ref = nearest_d(cr, k, dim, xr + i * dim);
            double want = dot_d(cr + (size_t)ref * dim, xr + i * dim, dim);
            double got = dot_d(cr + (size_t)best[i] * dim, xr + i * dim, dim);
            ck_assert_msg((uint32_t)best[i] == ref || want - got < 1e-5,
                          "n %zu k %zu d %zu point %zu: centroid %d (%.9f), the best is %u (%.9f)",
                          n, k, dim, i, best[i], got, ref, want);
            ck_assert_msg(fabs(sc[i] - got) < 1e-5, "n %zu k %zu d %zu point %zu: score %.9f, %.9f",
                          n, k, dim, i, sc[i], got);
            differ += (uint32_t)best[i] != nearest_d(c, k, dim, x + i * dim);
        }
        /* Without scores and with other thread counts: the same choices, bit for bit. */
        for (int th = 1; th <= 3; th += 2) {
#ifdef _OPENMP
            omp_set_num_threads(th);
#endif
            memset(best2, 0xab, sizeof(int32_t) * n);
            ck_assert_int_eq(kern_nearest_centroid_bf16(KERN_DEV_CPU, x, n, c, k, dim, best2, NULL),
                             KERN_OK);
            ck_assert_msg(memcmp(best, best2, sizeof(int32_t) * n) == 0, "%d threads differ", th);
        }
        fprintf(stderr, "nearest_bf16 (%s): n %zu, K %zu, d %zu: %zu choices differ from fp32's\n",
                kern_nearest_centroid_bf16_path(KERN_DEV_CPU), n, k, dim, differ);
        free(x);
        free(c);
        free(xr);
        free(cr);
        free(best);
        free(best2);
        free(sc);
    }
    /* Ties still go to the lower index: equal centroids in different groups and blocks. */
    enum { K = 2100, D = 64, N = 99 };
    uint64_t s = rnd();
    float *c = xmalloc(sizeof(float) * K * D), *x = xmalloc(sizeof(float) * N * D);
    int32_t *b = xmalloc(sizeof(int32_t) * N);
    random_units(&s, c, K, D);
    random_units(&s, x, N, D);
    static const size_t same[] = {1030, 2099, 1031, 1500};
    for (size_t t = 0; t < sizeof same / sizeof same[0]; t++)
        memcpy(c + same[t] * D, c + 1029 * D, sizeof(float) * D);
    for (size_t i = 0; i < N; i += 2)
        memcpy(x + i * D, c + 1029 * D, sizeof(float) * D);
    for (int path = 0; path < paths; path++) {
        ck_assert_int_eq(kern_cpu_use_amx(path == 0 && paths == 2), KERN_OK);
        memset(b, 0xab, sizeof(int32_t) * N);
        ck_assert_int_eq(kern_nearest_centroid_bf16(KERN_DEV_CPU, x, N, c, K, D, b, NULL), KERN_OK);
        for (size_t i = 0; i < N; i += 2)
            ck_assert_int_eq(b[i], 1029);
    }
    /* On CUDA only where the tensor cores are (a GPU of sm_80 or later: check_kernels_gpu tests
     * it there); with a CPU variant without the instruction: refused. This program's pointers
     * are host memory, so only the refusal is tried. */
    if (!kern_nearest_centroid_bf16_path(KERN_DEV_CUDA)) {
        ck_assert_int_eq(kern_nearest_centroid_bf16(KERN_DEV_CUDA, x, N, c, K, D, b, NULL),
                         KERN_ENODEV);
        ck_assert_int_eq(kern_nearest_centroid_bf16_pays(KERN_DEV_CUDA), 0);
    }
    ck_assert_int_eq(kern_nearest_centroid_bf16(KERN_DEV_CPU, x, N, c, 0, D, b, NULL), KERN_EINVAL);
    if (kern_cpu_has_isa("avx512")) {
        ck_assert_int_eq(kern_cpu_use_amx(0), KERN_OK);
        ck_assert_int_eq(kern_cpu_force_isa("avx512"), KERN_OK);
        ck_assert_ptr_null(kern_nearest_centroid_bf16_path(KERN_DEV_CPU));
        ck_assert_int_eq(kern_nearest_centroid_bf16(KERN_DEV_CPU, x, N, c, K, D, b, NULL),
                         KERN_ENODEV);
        ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CPU), 0);
        ck_assert_int_eq(kern_cpu_force_isa(NULL), KERN_OK);
    }
    free(c);
    free(x);
    free(b);
}
END_TEST

/* A screened fp32 nearest centroid: the AMX one or the int8 one. */
typedef int (*screen_fn)(const float *, size_t, const float *, size_t, size_t, int32_t *, float *,
                         size_t *);

/*
 * The screens (kern_cpu_nearest_centroid_screened on AMX tiles, with the avx512 micro-kernel;
 * kern_cpu_nearest_centroid_screened_i8 on AVX2, with the avx2 one) give the fp32 kernel's
 * answer bit for bit: codes and scores, on inputs built to sit inside their windows: points
 * that are centroids, points between two centroids a few ulps apart, duplicated centroids
 * (ties), clustered centroids (many within the window), vectors far from unit norm, subnormal
 * and zero values, an all-zero point, and NaN and infinite points (which go to the fp32 kernel
 * whole). Where a screen cannot run, its refusal is checked instead.
 */
static void check_screen(const char *name, screen_fn fn, const char *isa, size_t zero_fp32)
{
    static const size_t dims[] = {128, 96, 33, 256, 64, 2};
    for (int t = 0; t < 10; t++) {
        size_t n = urnd(64, 1200), k = urnd(700, 3000), dim = dims[t % 6]; /* k: see case 1 */
        if (t == 0) {
            n = 1500;
            k = 4096 + 31;
            dim = 128;
        }
        /* at t 0, a crowd of centroids around centroid 0, more than a point's list holds
         * (AMX's 64, the int8 screen's 256); the pairs of case 1 lie past it */
        size_t crowd_k = t == 0 ? 300 : 100;
        uint64_t s = rnd();
        float *x = xmalloc(sizeof(float) * n * dim), *c = xmalloc(sizeof(float) * k * dim);
        random_units(&s, c, k, dim);
        /* a third of the centroids in tight clusters around 64 (cosines above 0.99) */
        for (size_t j = k / 3; j < 2 * k / 3; j++) {
            const float *base = c + (t == 0 && j < k / 3 + crowd_k ? 0 : j % 64) * dim;
            float *r = c + j * dim;
            double nn = 0;
            for (size_t d = 0; d < dim; d++) {
                r[d] = base[d] + 0.01f * (float)gauss() / sqrtf((float)dim);
                nn += (double)r[d] * r[d];
            }
            for (size_t d = 0; d < dim; d++)
                r[d] = (float)(r[d] / sqrt(nn));
        }
        /* duplicates and one-ulp neighbours */
        memcpy(c + 40 * dim, c + 7 * dim, sizeof(float) * dim);
        memcpy(c + 41 * dim, c + 7 * dim, sizeof(float) * dim);
        c[41 * dim] = nextafterf(c[41 * dim], 2.0f);
        random_units(&s, x, n, dim);
        for (size_t i = 0; i < n; i++) {
            float *xi = x + i * dim;
            switch (i % 8) {
            case 0: /* a centroid itself, or the duplicated one */
                memcpy(xi, c + (i % 3 == 0 ? 7 : rnd_below(k)) * dim, sizeof(float) * dim);
                break;
            case 1: /* between two centroids of one cluster (both below 2k / 3 as k >= 700) */
                for (size_t d = 0; d < dim; d++)
                    xi[d] = 0.5f * (c[(k / 3 + crowd_k + i % 50) * dim + d] +
                                    c[(k / 3 + crowd_k + 64 + i % 50) * dim + d]);
                break;
            case 2: /* near a cluster's base (at t 0, centroid 0's crowd for a fifth of them) */
                for (size_t d = 0; d < dim; d++)
                    xi[d] =
                        c[(t == 0 && i % 5 == 0 ? 0 : i % 64) * dim + d] + 0.003f * (float)gauss();
                break;
            case 3: /* far from unit norm */
                for (size_t d = 0; d < dim; d++)
                    xi[d] *= i % 16 == 3 ? 1e3f : 1e-3f;
                break;
            case 4: /* subnormal and zero values */
                for (size_t d = 0; d < dim; d += 3)
                    xi[d] = d % 2 ? 1e-39f : 0.0f;
                break;
            default:
                break;
            }
        }
        memset(x + 5 * dim, 0, sizeof(float) * dim); /* point 5: all zero (the lowest index) */
        x[6 * dim + 1] = NAN;                        /* point 6: NaN */
        x[7 * dim] = INFINITY;                       /* point 7: infinite */
        int32_t *b32 = xmalloc(sizeof(int32_t) * n), *bs = xmalloc(sizeof(int32_t) * n);
        float *s32 = xmalloc(sizeof(float) * n), *ss = xmalloc(sizeof(float) * n);
        memset(bs, 0xab, sizeof(int32_t) * n);
        poison(ss, n);
        ck_assert_int_eq(kern_cpu_force_isa(isa), KERN_OK);
        ck_assert_int_eq(kern_cpu_nearest_centroid_fp32(x, n, c, k, dim, b32, s32), KERN_OK);
        size_t nf = 12345;
        ck_assert_int_eq(fn(x, n, c, k, dim, bs, ss, &nf), KERN_OK);
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(bs[i] == b32[i], "%s t %d n %zu k %zu d %zu point %zu: %d, fp32 %d", name,
                          t, n, k, dim, i, bs[i], b32[i]);
            ck_assert_msg(memcmp(ss + i, s32 + i, sizeof(float)) == 0,
                          "%s t %d point %zu: score %.9g, fp32 %.9g", name, t, i, ss[i], s32[i]);
        }
        /* the NaN and infinite points went to the fp32 kernel (and the zero one where the
         * screen says so; at t 0 also the crowd's), and few others did (but at d 2, where
         * hundreds of centroids crowd one circle) */
        size_t crowd = t == 0 ? n / 40 : 0, lo = 2 + zero_fp32 + crowd;
        ck_assert_msg(nf >= lo && (dim < 32 || nf <= lo + n / 20),
                      "%s t %d: %zu of %zu points unscreened", name, t, nf, n);
        /* the dispatcher (screened where k >= 1,024) and no scores wanted */
        memset(bs, 0xab, sizeof(int32_t) * n);
        ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, n, c, k, dim, bs, NULL), KERN_OK);
        ck_assert(memcmp(bs, b32, sizeof(int32_t) * n) == 0);
        ck_assert_int_eq(kern_cpu_force_isa(NULL), KERN_OK);
        free(x);
        free(c);
        free(b32);
        free(bs);
        free(s32);
        free(ss);
    }
}

START_TEST(test_index_assign_screened_is_fp32)
{
    rng_init_random();
    int32_t b;
    float x1[4] = {1, 0, 0, 0};
    if (kern_cpu_amx_usable() && kern_cpu_has_isa("avx512"))
        check_screen("amx", kern_cpu_nearest_centroid_screened, "avx512", 0);
    else {
        ck_assert_int_eq(kern_cpu_nearest_centroid_screened(x1, 1, x1, 1, 4, &b, NULL, NULL),
                         KERN_ENODEV);
        fprintf(stderr, "assign_screened: no AMX here; only its refusal checked\n");
    }
    if (kern_cpu_has_isa("avx2")) {
        check_screen("int8", kern_cpu_nearest_centroid_screened_i8, "avx2", 1);
        /* its refusals: no centroids, dim above 2,048, a centroid not finite */
        float *big = xcalloc(2049 * 2, sizeof(float));
        big[0] = big[2049] = 1;
        ck_assert_int_eq(kern_cpu_nearest_centroid_screened_i8(x1, 1, x1, 0, 4, &b, NULL, NULL),
                         KERN_ENODEV);
        ck_assert_int_eq(
            kern_cpu_nearest_centroid_screened_i8(big, 1, big + 2049, 1, 2049, &b, NULL, NULL),
            KERN_ENODEV);
        float cinf[8] = {1, 0, 0, 0, INFINITY, 0, 0, 0};
        ck_assert_int_eq(kern_cpu_nearest_centroid_screened_i8(x1, 1, cinf, 2, 4, &b, NULL, NULL),
                         KERN_ENODEV);
        /* scores that overflow fp32 (points of 1e35 against centroids of 1e4): the fp32
         * kernel's answer, whatever it is (infinite and NaN scores) */
        enum { HN = 96, HK = 2049, HD = 64 };
        uint64_t hs = rnd();
        float *hx = xmalloc(sizeof(float) * HN * HD), *hc = xmalloc(sizeof(float) * HK * HD);
        random_units(&hs, hx, HN, HD);
        random_units(&hs, hc, HK, HD);
        for (size_t i = 0; i < (size_t)HN * HD; i++)
            hx[i] *= i / HD % 2 ? 1e35f : 1.0f;
        for (size_t i = 0; i < (size_t)HK * HD; i++)
            hc[i] *= 1e4f;
        int32_t hb[HN], hb32[HN];
        float hsc[HN], hs32[HN];
        size_t hf = 0;
        ck_assert_int_eq(kern_cpu_force_isa("avx2"), KERN_OK);
        ck_assert_int_eq(kern_cpu_nearest_centroid_fp32(hx, HN, hc, HK, HD, hb32, hs32), KERN_OK);
        ck_assert_int_eq(kern_cpu_nearest_centroid_screened_i8(hx, HN, hc, HK, HD, hb, hsc, &hf),
                         KERN_OK);
        ck_assert_int_eq(kern_cpu_force_isa(NULL), KERN_OK);
        ck_assert(memcmp(hb, hb32, sizeof hb) == 0 && memcmp(hsc, hs32, sizeof hsc) == 0);
        ck_assert_uint_ge(hf, HN / 2); /* the large ones went to the fp32 kernel */
        free(hx);
        free(hc);
        free(big);
    } else {
        ck_assert_int_eq(kern_cpu_nearest_centroid_screened_i8(x1, 1, x1, 1, 4, &b, NULL, NULL),
                         KERN_ENODEV);
        fprintf(stderr, "assign_screened: no AVX2 here; only the int8 screen's refusal checked\n");
    }
}
END_TEST

/* The mean over x of the best cosine to a centroid (k-means's objective), in double. */
static double mean_best_cosine(const float *x, size_t n, const float *c, size_t k, size_t dim)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += dot_d(c + (size_t)nearest_d(c, k, dim, x + i * dim) * dim, x + i * dim, dim);
    return sum / (double)n;
}

START_TEST(test_index_kmeans_bf16_switch)
{
    /* TARTAN_KMEANS_BF16=0 gives fp32 k-means: the centroids of a CPU without AVX512_BF16 (a
     * forced avx512 variant), bit for bit. Otherwise, where the CPU has it, the iterations
     * assign in bf16: the centroids differ a little but serve the points as well (the mean
     * best cosine within 0.002 of fp32's), and they are reproducible and the same whatever the
     * thread count. */
    enum { N = 6000, D = 64, CL = 40, K = 96 };
    float *centers = xmalloc(sizeof(float) * CL * D), *x = xmalloc(sizeof(float) * N * D);
    float *a = xmalloc(sizeof(float) * K * D), *b = xmalloc(sizeof(float) * K * D);
    float *f = xmalloc(sizeof(float) * K * D);
    fx_clustered(23, N, D, CL, 0.12, centers, x);
    store_msg m = {{0}};
    /* fp32 k-means as a CPU without AMX and AVX512_BF16 runs it */
    kern_cpu_use_amx(0);
    if (kern_cpu_has_isa("avx512")) /* else the best variant this CPU runs has no bf16 */
        ck_assert_int_eq(kern_cpu_force_isa("avx512"), KERN_OK);
    ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CPU), 0);
    poison(f, K * D);
    ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, 256, 9, f, &m), 0);
    ck_assert_int_eq(kern_cpu_force_isa(NULL), KERN_OK);
    kern_cpu_use_amx(1);
    ck_assert_int_eq(setenv("TARTAN_KMEANS_BF16", "0", 1), 0);
    ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CPU), 0);
    ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CUDA), 0);
    poison(a, K * D);
    ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, 256, 9, a, &m), 0);
    ck_assert(memcmp(a, f, sizeof(float) * K * D) == 0);
    ck_assert_int_eq(unsetenv("TARTAN_KMEANS_BF16"), 0);
    ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CPU), kern_nearest_centroid_bf16_pays(KERN_DEV_CPU));
    /* "1": bf16 wherever it runs, paying or not */
    ck_assert_int_eq(setenv("TARTAN_KMEANS_BF16", "1", 1), 0);
    int usable = kern_nearest_centroid_bf16_path(KERN_DEV_CPU) != NULL;
    ck_assert_int_eq(idx_kmeans_bf16(KERN_DEV_CPU), usable);
    if (!usable) {
        fprintf(stderr, "kmeans_bf16_switch: no AVX512_BF16 on this CPU; fp32 checked only\n");
        goto done;
    }
    /* AMX and then the AVX512_BF16 micro-kernel, where the CPU has both */
    int paths = 1 + (kern_cpu_use_amx(1) == KERN_OK && kern_cpu_has_isa("avx512bf16"));
    for (int path = 0; path < paths; path++) {
        ck_assert_int_eq(kern_cpu_use_amx(path == 0 && paths == 2), KERN_OK);
#ifdef _OPENMP
        omp_set_num_threads(1);
#endif
        poison(a, K * D);
        ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, 256, 9, a, &m), 0);
#ifdef _OPENMP
        omp_set_num_threads(4);
#endif
        poison(b, K * D);
        ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, 256, 9, b, &m), 0);
        ck_assert(memcmp(a, b, sizeof(float) * K * D) == 0);
        double obj_f = mean_best_cosine(x, N, f, K, D), obj_b = mean_best_cosine(x, N, a, K, D);
        size_t moved = 0;
        for (size_t i = 0; i < K; i++) {
            double nn = dot_d(a + i * D, a + i * D, D);
            ck_assert_msg(fabs(nn - 1.0) < 1e-5, "centroid %zu: squared norm %.7f", i, nn);
            moved += memcmp(a + i * D, f + i * D, sizeof(float) * D) != 0;
        }
        fprintf(stderr,
                "kmeans_bf16_switch (%s): mean best cosine fp32 %.6f, bf16 %.6f; %zu of %d "
                "centroids differ\n",
                kern_nearest_centroid_bf16_path(KERN_DEV_CPU), obj_f, obj_b, moved, (int)K);
        ck_assert_msg(fabs(obj_f - obj_b) < 2e-3, "fp32 %.6f, bf16 %.6f", obj_f, obj_b);
    }
done:
    free(centers);
    free(x);
    free(a);
    free(b);
    free(f);
}
END_TEST

START_TEST(test_index_assign_rejects_bad_arguments)
{
    enum { K = 8, D = 16, N = 4 };
    float c[K * D] = {0}, x[N * D] = {0};
    int32_t best[N];
    uint32_t codes[N];
    for (size_t i = 0; i < K; i++)
        c[i * D] = 1.0f;
    for (size_t i = 0; i < N; i++)
        x[i * D + 1] = 1.0f;
    ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, N, c, 0, D, best, NULL), KERN_EINVAL);
    ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, N, c, K, 0, best, NULL), KERN_EINVAL);
    ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, NULL, N, c, K, D, best, NULL),
                     KERN_EINVAL);
    ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, 0, c, K, D, best, NULL), KERN_OK);
    store_msg m = {{0}};
    ck_assert_int_eq(idx_assign(KERN_DEV_CPU, c, 0, D, x, N, codes, NULL, &m), TARTAN_EINVAL);
    float cen[K * D];
    ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, 256, 1, cen, &m),
                     TARTAN_EINVAL); /* k > n */
    ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, 2, 0, 256, 1, cen, &m),
                     TARTAN_EINVAL);
    /* The GPU where there is none: a clear code, not a crash. */
    if (kern_cuda_device_count() == 0) {
        int rc = idx_assign(KERN_DEV_CUDA, c, K, D, x, N, codes, NULL, &m);
        ck_assert_msg(rc == TARTAN_ENODEV || rc == TARTAN_EDEVICE, "rc %d", rc);
        ck_assert(m.text[0] != '\0');
    }
}
END_TEST

START_TEST(test_index_kmeans_device_recovers_clusters)
{
    float *centers = xmalloc(sizeof(float) * KM_CL * KM_DIM);
    float *x = xmalloc(sizeof(float) * KM_N * KM_DIM);
    float *cen = xmalloc(sizeof(float) * KM_K * KM_DIM);
    float *cen2 = xmalloc(sizeof(float) * KM_K * KM_DIM);
    fx_clustered(11, KM_N, KM_DIM, KM_CL, 0.03, centers, x);
    /* max_per_centroid 100 < KM_N / KM_K: the subsampling path runs too. Both precisions of
     * the iterations' assignment (TARTAN_KMEANS_BF16; bf16 where the CPU has it). */
    for (int run = 0; run < 4; run++) {
        int per = run % 2 ? 256 : 100;
        ck_assert_int_eq(setenv("TARTAN_KMEANS_BF16", run < 2 ? "1" : "0", 1), 0);
        store_msg m = {{0}};
        poison(cen, KM_K * KM_DIM);
        ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, KM_N, KM_DIM, KM_K, 4, per, 7, cen, &m),
                         0);
        for (size_t i = 0; i < KM_K; i++) {
            double nn = dot_d(cen + i * KM_DIM, cen + i * KM_DIM, KM_DIM);
            ck_assert_msg(fabs(nn - 1.0) < 1e-5, "centroid %zu: squared norm %.7f", i, nn);
        }
        for (size_t c = 0; c < KM_CL; c++) {
            double best = -2.0;
            for (size_t i = 0; i < KM_K; i++) {
                double cs = cosine_d(centers + c * KM_DIM, cen + i * KM_DIM, KM_DIM);
                if (cs > best)
                    best = cs;
            }
            ck_assert_msg(best > 0.99, "true center %zu: best centroid cosine %.4f", c, best);
        }
        for (size_t i = 0; i < KM_K; i++) {
            double best = -2.0;
            for (size_t c = 0; c < KM_CL; c++) {
                double cs = cosine_d(centers + c * KM_DIM, cen + i * KM_DIM, KM_DIM);
                if (cs > best)
                    best = cs;
            }
            ck_assert_msg(best > 0.95, "centroid %zu: nearest true center cosine %.4f", i, best);
        }
        /* Reproducible: the same inputs and seed give the same centroids. */
        poison(cen2, KM_K * KM_DIM);
        ck_assert_int_eq(
            idx_kmeans_device(KERN_DEV_CPU, x, KM_N, KM_DIM, KM_K, 4, per, 7, cen2, &m), 0);
        ck_assert(memcmp(cen, cen2, sizeof(float) * KM_K * KM_DIM) == 0);
    }
    free(centers);
    free(x);
    free(cen);
    free(cen2);
}
END_TEST

START_TEST(test_index_kmeans_device_refills_empty_clusters)
{
    /* 190 copies of one point and 10 others: with k 20 the initial centroids repeat the copy,
     * all copies go to the lowest of the equal centroids and the others' clusters are empty.
     * Each empty cluster takes a worst-served point, so every distinct point ends up with a
     * centroid of its own, and no centroid is NaN or zero. */
    enum { N = 200, D = 24, K = 20, DISTINCT = 10 };
    float *x = xmalloc(sizeof(float) * N * D);
    float *cen = xmalloc(sizeof(float) * K * D);
    uint64_t s = 5;
    random_units(&s, x, DISTINCT + 1, D);
    for (size_t i = DISTINCT + 1; i < N; i++)
        memcpy(x + i * D, x + DISTINCT * D, sizeof(float) * D);
    for (int run = 0; run < 6; run++) {
        int seed = 1 + run % 3;
        /* both precisions of the iterations' assignment, as above */
        ck_assert_int_eq(setenv("TARTAN_KMEANS_BF16", run < 3 ? "1" : "0", 1), 0);
        store_msg m = {{0}};
        poison(cen, K * D);
        ck_assert_int_eq(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, 256, seed, cen, &m), 0);
        for (size_t i = 0; i < K; i++) {
            double nn = dot_d(cen + i * D, cen + i * D, D);
            ck_assert_msg(fabs(nn - 1.0) < 1e-5, "seed %d centroid %zu: squared norm %f", seed, i,
                          nn);
        }
        for (size_t p = 0; p <= DISTINCT; p++) {
            uint32_t c = nearest_d(cen, K, D, x + p * D);
            double cs = cosine_d(cen + c * D, x + p * D, D);
            ck_assert_msg(cs > 0.9999, "seed %d point %zu: best centroid cosine %.6f", seed, p, cs);
        }
    }
    free(x);
    free(cen);
}
END_TEST

START_TEST(test_index_kmeans_group_skips_rows)
{
    /* k-means given rows to skip (idx_kmeans_group, the group of one) trains on exactly the
     * other rows: the same centroids, bit for bit, as idx_kmeans_device on those rows alone,
     * whether it draws a subset (per 20) or uses every point (per 256). The skipped rows hold
     * NaN: read by mistake, they would fail the assignment or spoil a centroid. */
    enum { N = 3000, D = 24, K = 48, SKIP = 217 };
    float *x = xmalloc(sizeof(float) * (N + SKIP) * D);
    float *kept = xmalloc(sizeof(float) * N * D);
    float *a = xmalloc(sizeof(float) * K * D), *b = xmalloc(sizeof(float) * K * D);
    size_t skip[SKIP];
    uint64_t s = 23;
    random_units(&s, kept, N, D);
    /* SKIP rows of N + SKIP, ascending: pairs of neighbours every 29 rows from the first, and
     * the last row. */
    for (size_t j = 0; j + 1 < SKIP; j++)
        skip[j] = (j / 2) * 29 + j % 2;
    skip[SKIP - 1] = N + SKIP - 1;
    for (size_t i = 0, r = 0, j = 0; i < N + SKIP; i++) {
        if (j < SKIP && skip[j] == i) {
            for (size_t d = 0; d < D; d++)
                x[i * D + d] = NAN;
            j++;
        } else {
            memcpy(x + i * D, kept + r++ * D, sizeof(float) * D);
        }
    }
    const int per[2] = {20, 256};
    for (int t = 0; t < 2; t++) {
        store_msg m = {{0}};
        idx_group g;
        idx_group_solo(&g);
        poison(a, K * D);
        poison(b, K * D);
        ck_assert_msg(
            idx_kmeans_group(KERN_DEV_CPU, x, N, skip, SKIP, D, K, 4, per[t], 9, &g, a, &m) == 0,
            "%s", m.text);
        ck_assert_msg(idx_kmeans_device(KERN_DEV_CPU, kept, N, D, K, 4, per[t], 9, b, &m) == 0,
                      "%s", m.text);
        ck_assert_msg(memcmp(a, b, sizeof(float) * K * D) == 0,
                      "per %d: skipping rows gave other centroids than leaving them out", per[t]);
        for (size_t i = 0; i < K; i++)
            ck_assert(fabs(dot_d(a + i * D, a + i * D, D) - 1.0) < 1e-5);
    }
    free(x);
    free(kept);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_index_warm_order)
{
    /* idx_warm_depth: for schedules of one to three levels, every whole block of ls[l]
     * consecutive indices holds exactly one point of depth <= l (so the narrower levels hold
     * the wider ones' points); over indices whose classes repeat with period 8 (what a strided
     * choice would split unevenly), each class gets a 1 / ls[l] share; other seeds choose
     * other points. */
    const size_t sch[4][3] = {{4, 2, 0}, {8, 0, 0}, {6, 3, 0}, {8, 4, 2}};
    const size_t nl[4] = {2, 1, 2, 3};
    for (int t = 0; t < 4; t++) {
        const size_t *ls = sch[t];
        enum { NB = 48000 };
        size_t *d = xmalloc(sizeof(size_t) * NB);
        size_t moved = 0;
        for (size_t i = 0; i < NB; i++) {
            d[i] = idx_warm_depth(9, ls, nl[t], 1000 + i);
            ck_assert_uint_le(d[i], nl[t]);
            moved += idx_warm_depth(10, ls, nl[t], 1000 + i) != d[i];
        }
        ck_assert_msg(moved > NB / 10, "schedule %d: the seed changes nothing", t);
        for (size_t l = 0; l < nl[t]; l++) {
            /* whole blocks of ls[l] indices from 1000 (a multiple of every stride here) */
            for (size_t b0 = 0; b0 + ls[l] <= NB - 1000 % ls[l]; b0 += ls[l]) {
                size_t at = b0 + (ls[l] - 1000 % ls[l]) % ls[l], in = 0;
                if (at + ls[l] > NB)
                    break;
                for (size_t i = at; i < at + ls[l]; i++)
                    in += d[i] <= l;
                ck_assert_msg(in == 1, "schedule %d level %zu block at %zu: %zu points", t, l, at,
                              in);
            }
            size_t cls[8] = {0};
            for (size_t i = 0; i < NB; i++)
                cls[(1000 + i) % 8] += d[i] <= l;
            for (int c = 0; c < 8; c++) {
                double want = NB / 8.0 / (double)ls[l];
                ck_assert_msg(fabs((double)cls[c] - want) < 0.1 * want + 10,
                              "schedule %d level %zu class %d: %zu points, about %.0f wanted", t, l,
                              c, cls[c], want);
            }
        }
        free(d);
    }
    /* idx_warm_dest against a stable sort by depth done index by index: sizes to 70 and
     * thousands, several first indices. */
    const size_t ls[2] = {4, 2};
    for (size_t np = 0; np <= 3000; np = np < 70 ? np + 1 : np * 3 + 1)
        for (uint64_t first = 0; first < 7; first += 3) {
            size_t *dest = xmalloc(sizeof(size_t) * (np ? np : 1));
            size_t w = 0, wl[2] = {0, 0}, lnp[2] = {99, 99};
            for (size_t i = 0; i < np; i++)
                dest[i] = SIZE_MAX;
            ck_assert_int_eq(idx_warm_dest(3, ls, 2, first, np, dest, lnp), 0);
            for (size_t dd = 0; dd <= 2; dd++) {
                for (size_t i = 0; i < np; i++)
                    if (idx_warm_depth(3, ls, 2, first + i) == dd) {
                        ck_assert_msg(dest[i] == w, "np %zu first %zu: row %zu to %zu, not %zu", np,
                                      (size_t)first, i, dest[i], w);
                        w++;
                    }
                if (dd < 2)
                    wl[dd] = w;
            }
            ck_assert_uint_eq(lnp[0], wl[0]);
            ck_assert_uint_eq(lnp[1], wl[1]);
            free(dest);
        }
    size_t five[5] = {32, 16, 8, 4, 2}, lnp5[5], d5[2];
    ck_assert_int_eq(idx_warm_dest(3, five, 5, 0, 2, d5, lnp5), -1);
}
END_TEST

START_TEST(test_index_kmeans_warm_start)
{
    /* The warm start (TARTAN_KMEANS_WARM "I/S[,I/S...]": the first I iterations assign one
     * point of every block of S consecutive indices of the subset). Each of P distinct points
     * repeated S = 4 times in a row: a block of 4 (or 2) rows is then copies of one point, so
     * a warm level takes one copy (or two) of each point, and a cluster's sum over them is a
     * quarter (a half) of its sum over four, exactly (fixed point times a power of 2): the
     * normalised centroids agree, and the warm run must give the cold run's centroids bit for
     * bit. Had it taken other rows, or summed rows it did not assign, they would differ. On
     * random (unrepeated) points the schedule must change the centroids, "1/1" and "0" are the
     * cold run, and an unreadable setting is the default. */
    enum { P = 600, S = 4, D = 24, K = 40, N = P * S };
    float *pts = xmalloc(sizeof(float) * P * D), *x = xmalloc(sizeof(float) * N * D);
    float *cold = xmalloc(sizeof(float) * K * D), *warm = xmalloc(sizeof(float) * K * D);
    float *def = xmalloc(sizeof(float) * K * D), *bad = xmalloc(sizeof(float) * K * D);
    uint64_t s = 71;
    random_units(&s, pts, P, D);
    for (size_t i = 0; i < N; i++)
        memcpy(x + i * D, pts + (i / S) * D, sizeof(float) * D);
    store_msg m = {{0}};
    const char *warms[] = {"2/4", "3/4", "1/4", "2/4,1/2", "1/4,2/2", "1/4,1/2,1/1", "9/2"};
    setenv("TARTAN_KMEANS_WARM", "0", 1);
    ck_assert_msg(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, N, 5, cold, &m) == 0, "%s",
                  m.text);
    for (size_t t = 0; t < sizeof warms / sizeof *warms; t++) {
        setenv("TARTAN_KMEANS_WARM", warms[t], 1);
        poison(warm, K * D);
        ck_assert_msg(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, N, 5, warm, &m) == 0, "%s",
                      m.text);
        ck_assert_msg(memcmp(cold, warm, sizeof(float) * K * D) == 0,
                      "warm start %s on repeated points: other centroids", warms[t]);
    }
    /* Random points, and a subset (48 a centroid) drawn first. */
    for (int per = 48; per <= N; per += N - 48) {
        s = 72;
        random_units(&s, x, N, D);
        setenv("TARTAN_KMEANS_WARM", "0", 1);
        ck_assert(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, per, 5, cold, &m) == 0);
        setenv("TARTAN_KMEANS_WARM", "1/1", 1);
        ck_assert(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, per, 5, warm, &m) == 0);
        ck_assert_msg(memcmp(cold, warm, sizeof(float) * K * D) == 0, "1/1 is not the cold run");
        unsetenv("TARTAN_KMEANS_WARM");
        ck_assert(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, per, 5, def, &m) == 0);
        ck_assert_msg(memcmp(cold, def, sizeof(float) * K * D) != 0,
                      "the default schedule changed nothing (per %d)", per);
        /* The default is 2 iterations on one point in 4, and no other schedule. */
        setenv("TARTAN_KMEANS_WARM", "2/4", 1);
        ck_assert(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, per, 5, bad, &m) == 0);
        ck_assert_msg(memcmp(def, bad, sizeof(float) * K * D) == 0, "the default is not 2/4");
        setenv("TARTAN_KMEANS_WARM", "2/4,1/2", 1);
        ck_assert(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, per, 5, bad, &m) == 0);
        ck_assert_msg(memcmp(def, bad, sizeof(float) * K * D) != 0, "the default is 2/4,1/2");
        /* Unreadable: words, a stride not a multiple of the next, strides growing, trailing
         * or foreign separators, too many steps. */
        const char *bads[] = {"two/four", "2/3,1/2", "1/2,1/4", "2/4,",
                              "2/4;1/2",  "2/",      "/4",      "1/8,1/4,1/2,1/1,1/1",
                              "-1/4"};
        for (size_t b = 0; b < sizeof bads / sizeof *bads; b++) {
            setenv("TARTAN_KMEANS_WARM", bads[b], 1);
            poison(bad, K * D);
            ck_assert(idx_kmeans_device(KERN_DEV_CPU, x, N, D, K, 4, per, 5, bad, &m) == 0);
            ck_assert_msg(memcmp(def, bad, sizeof(float) * K * D) == 0,
                          "the unreadable setting \"%s\" is not the default", bads[b]);
        }
        for (size_t i = 0; i < K; i++)
            ck_assert(fabs(dot_d(def + i * D, def + i * D, D) - 1.0) < 1e-5);
    }
    /* Points whose clusters repeat with period 8 (point i in cluster i % 8), all of them
     * training points: a strided choice (every 4th point) would see two of the eight clusters
     * in the warm iterations and leave the others with no centroid near them after the last
     * one; a choice by block keeps every cluster's share. */
    {
        enum { CL = 8, KK = 64, NN = 12000, DD = 32 };
        float *ctr = xmalloc(sizeof(float) * CL * DD), *pts8 = xmalloc(sizeof(float) * NN * DD);
        float *cen8 = xmalloc(sizeof(float) * KK * DD);
        fx_clustered(11, NN, DD, CL, 0.03, ctr, pts8);
        setenv("TARTAN_KMEANS_WARM", "3/4", 1);
        ck_assert(idx_kmeans_device(KERN_DEV_CPU, pts8, NN, DD, KK, 4, 256, 7, cen8, &m) == 0);
        for (size_t c = 0; c < CL; c++) {
            double best = -2.0;
            for (size_t i = 0; i < KK; i++) {
                double cs = cosine_d(ctr + c * DD, cen8 + i * DD, DD);
                best = cs > best ? cs : best;
            }
            ck_assert_msg(best > 0.99, "periodic clusters: center %zu best cosine %.4f", c, best);
        }
        free(ctr);
        free(pts8);
        free(cen8);
    }
    /* Nearly as many centroids as points (empty clusters refilled from every point): the
     * warm share is too small, so the schedule steps aside, forced or not. */
    for (int t = 0; t < 2; t++) {
        if (t)
            setenv("TARTAN_KMEANS_WARM", "2/4", 1);
        float *many = xmalloc(sizeof(float) * 569 * D);
        ck_assert_msg(idx_kmeans_device(KERN_DEV_CPU, x, 598, D, 569, 4, 64, 42, many, &m) == 0,
                      "%s", m.text);
        for (size_t i = 0; i < 569; i++)
            ck_assert(fabs(dot_d(many + i * D, many + i * D, D) - 1.0) < 1e-5);
        free(many);
    }
    unsetenv("TARTAN_KMEANS_WARM");
    free(pts);
    free(x);
    free(cold);
    free(warm);
    free(def);
    free(bad);
}
END_TEST

START_TEST(test_index_model_train_holds_out_by_rule)
{
    /* idx_model_train against its rules redone here: the held-out tokens are idx_select_range's
     * `held` (5%) of the sample from the seed's stream, k-means runs on the others in their
     * order (64 points a centroid at most: train.c's MAX_PER_CENTROID), the centroids are
     * rounded to fp16, and the codec is fitted (30 Lloyd-Max steps) to the held-out tokens'
     * residuals to their nearest centroid. K 32 draws a subset (held-out rows skipped in
     * place), K 160 uses every point (held-out rows taken out of the sample): the same model,
     * bit for bit, both ways. */
    enum { N = 6000, D = 16 };
    const size_t ks[2] = {32, 160};
    float *x = xmalloc(sizeof(float) * N * D), *work = xmalloc(sizeof(float) * N * D);
    float *train = xmalloc(sizeof(float) * N * D), *cen = NULL;
    uint64_t s = 31;
    random_units(&s, x, N, D);
    size_t held = (size_t)(0.05 * N), sel[N], below;
    ck_assert_uint_eq(idx_select_range(77, N, held, 0, N, sel, &below), held);
    float *res = xmalloc(sizeof(float) * held * D);
    uint32_t *lab = xmalloc(sizeof(uint32_t) * held);
    for (int t = 0; t < 2; t++) {
        size_t k = ks[t], nt = 0;
        for (size_t i = 0, j = 0; i < N; i++) {
            if (j < held && sel[j] == i)
                j++;
            else
                memcpy(train + nt++ * D, x + i * D, sizeof(float) * D);
        }
        ck_assert_uint_eq(nt, N - held);
        cen = xmalloc(sizeof(float) * k * D);
        store_msg m = {{0}};
        ck_assert_msg(idx_kmeans_device(KERN_DEV_CPU, train, nt, D, k, 4, 64, 77, cen, &m) == 0,
                      "%s", m.text);
        for (size_t i = 0; i < k * D; i++)
            cen[i] = store_f16_to_f32(store_f32_to_f16(cen[i]));
        for (size_t i = 0; i < held; i++) {
            lab[i] = nearest_d(cen, k, D, x + sel[i] * D);
            for (size_t j = 0; j < D; j++)
                res[i * D + j] = x[sel[i] * D + j] - cen[lab[i] * D + j];
        }
        idx_codec want;
        ck_assert_int_eq(idx_codec_fit(&want, D, 2, res, held, 30), 0);
        memcpy(work, x, sizeof(float) * N * D);
        idx_model mod;
        ck_assert_msg(idx_model_train(KERN_DEV_CPU, work, N, D, 2, k, 0, 4, 77, 0, &mod, &m) == 0,
                      "%s", m.text);
        ck_assert_uint_eq(mod.k, k);
        ck_assert_msg(memcmp(mod.centroids, cen, sizeof(float) * k * D) == 0,
                      "K %zu: other centroids than k-means on the tokens not held out", k);
        ck_assert(memcmp(mod.codec.cutoffs, want.cutoffs, sizeof(float) * 3) == 0);
        ck_assert(memcmp(mod.codec.weights, want.weights, sizeof(float) * 4) == 0);
        idx_model_free(&mod);
        free(cen);
    }
    free(x);
    free(work);
    free(train);
    free(res);
    free(lab);
}
END_TEST

START_TEST(test_index_device_option_reaches_build)
{
    /* The handle's device reaches training and encoding: asking for CUDA where there is none
     * fails with TARTAN_ENODEV and leaves the index as it was; the CPU (or a present GPU)
     * builds it. */
    enum { DOCS = 60, LEN = 12, D = 64 };
    char dir[] = "/tmp/tartan-index-device-XXXXXX", path[64], cmd[96];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ix", dir);
    float *emb = xmalloc(sizeof(float) * DOCS * LEN * D);
    size_t lens[DOCS];
    char idbuf[DOCS][16];
    const char *ids[DOCS];
    uint64_t s = 17;
    random_units(&s, emb, DOCS * LEN, D);
    for (size_t i = 0; i < DOCS; i++) {
        lens[i] = LEN;
        snprintf(idbuf[i], sizeof idbuf[i], "doc%zu", i);
        ids[i] = idbuf[i];
    }
    tartan_batch b = {DOCS, ids, lens, emb, DOCS * LEN, D, TARTAN_FLOAT32};
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE | TARTAN_EXCL;
    o.dim = D;
    o.n_centroids = 32;
    int gpu = kern_cuda_device_count() > 0;
    o.device = TARTAN_DEVICE_CUDA;
    tartan_db *db;
    ck_assert_int_eq(tartan_open(path, &o, &db), 0);
    tartan_index_info info;
    if (!gpu) {
        ck_assert_int_eq(tartan_add(db, &b, 0), TARTAN_ENODEV);
        ck_assert_int_eq(tartan_train(db, &b, 0), TARTAN_ENODEV);
        ck_assert_int_eq(tartan_info(db, &info), 0);
        ck_assert_uint_eq(info.n_docs, 0);
        ck_assert_uint_eq(info.n_centroids, 0);
        tartan_close(db);
        o.flags = 0;
        o.device = TARTAN_DEVICE_CPU;
        ck_assert_int_eq(tartan_open(path, &o, &db), 0);
    }
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, DOCS);
    ck_assert_uint_eq(info.n_centroids, 32);
    tartan_close(db);
    free(emb);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"kmeans_recovers_clusters", test_index_kmeans_recovers_clusters, 0},
        {"kmeans_centroids_normalised", test_index_kmeans_centroids_normalised, 0},
        {"kmeans_reproducible", test_index_kmeans_reproducible, 0},
        {"kmeans_rejects_bad_arguments", test_index_kmeans_rejects_bad_arguments, 0},
        {"kmeans_prints_nothing", test_index_kmeans_prints_nothing, 0},
        {"fixed_point_rounds_like_nearbyint", test_index_fixed_point_rounds_like_nearbyint, 0},
        {"kmeans_one_centroid_is_the_mean", test_index_kmeans_one_centroid_is_the_mean, 0},
        {"kmeans_trace", test_index_kmeans_trace, 0},
        {"flat_search_matches_bruteforce", test_index_flat_search_matches_bruteforce, 0},
        {"flat_search_pads_beyond_k", test_index_flat_search_pads_beyond_k, 0},
        {"plan_sample_docs", test_index_plan_sample_docs, 0},
        {"plan_centroids", test_index_plan_centroids, 0},
        {"assign_matches_double", test_index_assign_matches_double, 0},
        {"assign_ties_go_to_lower_index", test_index_assign_ties_go_to_lower_index, 0},
        {"assign_same_any_threads", test_index_assign_same_any_threads, 0},
        {"assign_rejects_bad_arguments", test_index_assign_rejects_bad_arguments, 0},
        {"nearest_bf16_matches_double", test_index_nearest_bf16_matches_double, 0},
        {"assign_screened_is_fp32", test_index_assign_screened_is_fp32, 0},
        {"kmeans_bf16_switch", test_index_kmeans_bf16_switch, 0},
        {"kmeans_device_recovers_clusters", test_index_kmeans_device_recovers_clusters, 0},
        {"kmeans_device_refills_empty_clusters", test_index_kmeans_device_refills_empty_clusters,
         0},
        {"kmeans_group_skips_rows", test_index_kmeans_group_skips_rows, 0},
        {"warm_order", test_index_warm_order, 30},
        {"kmeans_warm_start", test_index_kmeans_warm_start, 30},
        {"model_train_holds_out_by_rule", test_index_model_train_holds_out_by_rule, 0},
        {"device_option_reaches_build", test_index_device_option_reaches_build, 0},
    };
    return FX_RUN("index-train", cases, 0, 0);
}
