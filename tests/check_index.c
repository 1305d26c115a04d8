/*
 * check_index.c: the index layer's numeric core: the FAISS bridge (spherical k-means, flat
 * inner-product search), the sizing plan and the residual codec. Every numeric result is
 * compared with a plain double-precision reference computed here; outputs are poisoned first.
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
#include "kernels.h"
#include "kmeans.h"
#include "microkernel_cpu.h"
#include "plan.h"
#include "tartan.h"

/* ---- helpers ------------------------------------------------------------------------ */

/* splitmix64: small, seedable, and the same stream on every platform. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s) /* (0, 1) */
{
    return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_gauss(uint64_t *s)
{
    double u = rng_uniform(s), v = rng_uniform(s);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void normalise(float *x, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += (double)x[j] * x[j];
    double inv = 1.0 / sqrt(s);
    for (size_t j = 0; j < dim; j++)
        x[j] = (float)(x[j] * inv);
}

static double dot_d(const float *a, const float *b, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += (double)a[j] * b[j];
    return s;
}

static double cosine_d(const float *a, const float *b, size_t dim)
{
    return dot_d(a, b, dim) / sqrt(dot_d(a, a, dim) * dot_d(b, b, dim));
}

static void poison_f(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    ck_assert_ptr_nonnull(p);
    return p;
}

/*
 * A clustered corpus: ncl random unit centers, n points normalise(center + sigma * g) with
 * point i in cluster i % ncl. Per-dimension sigma gives a within-cluster cosine of about
 * 1 / sqrt(1 + sigma^2 dim).
 */
static void clustered(uint64_t seed, size_t n, size_t dim, size_t ncl, double sigma, float *centers,
                      float *x)
{
    uint64_t s = seed;
    for (size_t c = 0; c < ncl; c++) {
        for (size_t j = 0; j < dim; j++)
            centers[c * dim + j] = (float)rng_gauss(&s);
        normalise(centers + c * dim, dim);
    }
    for (size_t i = 0; i < n; i++) {
        const float *c = centers + (i % ncl) * dim;
        for (size_t j = 0; j < dim; j++)
            x[i * dim + j] = (float)(c[j] + sigma * rng_gauss(&s));
        normalise(x + i * dim, dim);
    }
}

/* Index of the row of c [k, dim] with the largest inner product with v, in double. */
static uint32_t nearest_d(const float *c, size_t k, size_t dim, const float *v)
{
    uint32_t best = 0;
    double bs = -INFINITY;
    for (size_t i = 0; i < k; i++) {
        double d = dot_d(c + i * dim, v, dim);
        if (d > bs) {
            bs = d;
            best = (uint32_t)i;
        }
    }
    return best;
}

/* ---- k-means ------------------------------------------------------------------------ */

enum { KM_DIM = 32, KM_CL = 8, KM_K = 64, KM_N = 12000 };

START_TEST(test_index_kmeans_recovers_clusters)
{
    float *centers = xmalloc(sizeof(float) * KM_CL * KM_DIM);
    float *x = xmalloc(sizeof(float) * KM_N * KM_DIM);
    float *cen = xmalloc(sizeof(float) * KM_K * KM_DIM);
    /* sigma 0.03 at dim 32: points at cosine ~0.985 to their center, clusters far apart. k is
     * 8 x the true count so that random initialisation puts a centroid in every cluster. */
    clustered(11, KM_N, KM_DIM, KM_CL, 0.03, centers, x);
    poison_f(cen, KM_K * KM_DIM);
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
    clustered(21, N, D, 10, 0.1, centers, x);
    for (size_t i = 0; i < (size_t)N * D; i++)
        x[i] *= 3.0f;
    char err[256] = "";
    size_t ks[2] = {K, K};
    size_t ns[2] = {N, K};
    for (int t = 0; t < 2; t++) {
        poison_f(cen, K * D);
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
    clustered(31, N, D, 16, 0.1, centers, x);
    char err[256] = "";
    poison_f(a, K * D);
    poison_f(b, K * D);
    poison_f(c, K * D);
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
    clustered(131, N, D, 8, 0.1, centers, x);
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
    poison_f(sc, N * TOP);
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
    poison_f(sc2, N * TOP);
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
    poison_f(sc, TOP);
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

/* ---- codec -------------------------------------------------------------------------- */

static const unsigned all_nbits[4] = {1, 2, 4, 8};

/* A codec with random ascending cutoffs and weights (the packer and bucketing do not care
 * where they come from). */
static void random_codec(idx_codec *c, size_t dim, unsigned nbits, uint64_t *s)
{
    memset(c, 0, sizeof *c);
    c->dim = dim;
    c->nbits = nbits;
    unsigned nb = 1u << nbits;
    float v = -0.3f;
    for (unsigned i = 0; i + 1 < nb; i++) {
        v += (float)(0.6 / nb * (0.5 + rng_uniform(s)));
        c->cutoffs[i] = v;
    }
    for (unsigned i = 0; i < nb; i++)
        c->weights[i] = (i == 0 ? -0.35f : c->cutoffs[i - 1]) + 0.01f;
}

static unsigned bucket_ref(const idx_codec *c, float v)
{
    unsigned n = 0;
    for (unsigned i = 0; i + 1 < (1u << c->nbits); i++)
        n += c->cutoffs[i] < v; /* torch.bucketize(right=False): cutoffs strictly below */
    return n;
}

START_TEST(test_index_codec_bucket_boundaries)
{
    uint64_t s = 51;
    for (int t = 0; t < 4; t++) {
        idx_codec c;
        random_codec(&c, 128, all_nbits[t], &s);
        unsigned nb = 1u << c.nbits;
        for (unsigned i = 0; i + 1 < nb; i++) {
            float cut = c.cutoffs[i];
            /* Equal to cutoff i: i cutoffs lie strictly below, so bucket i (the lower one). */
            ck_assert_uint_eq(idx_codec_bucket(&c, cut), i);
            ck_assert_uint_eq(idx_codec_bucket(&c, nextafterf(cut, INFINITY)), i + 1);
            ck_assert_uint_eq(idx_codec_bucket(&c, nextafterf(cut, -INFINITY)), i);
        }
        ck_assert_uint_eq(idx_codec_bucket(&c, -INFINITY), 0);
        ck_assert_uint_eq(idx_codec_bucket(&c, -1.0f), 0);
        ck_assert_uint_eq(idx_codec_bucket(&c, 1.0f), nb - 1);
        ck_assert_uint_eq(idx_codec_bucket(&c, INFINITY), nb - 1);
        for (int k = 0; k < 2000; k++) {
            float v = (float)(0.4 * rng_gauss(&s));
            ck_assert_uint_eq(idx_codec_bucket(&c, v), bucket_ref(&c, v));
        }
    }
    /* Repeated cutoffs (a residual distribution with ties): a value equal to them goes below
     * all of them, a value just above goes past all of them. */
    idx_codec c;
    random_codec(&c, 16, 2, &s);
    c.cutoffs[0] = c.cutoffs[1] = c.cutoffs[2] = 0.0f;
    ck_assert_uint_eq(idx_codec_bucket(&c, 0.0f), 0);
    ck_assert_uint_eq(idx_codec_bucket(&c, 1e-30f), 3);
}
END_TEST

static int cmp_asc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* NumPy's default (linear) quantile of m sorted doubles. */
static double quantile_ref(const double *v, size_t m, double q)
{
    double h = q * (double)(m - 1);
    size_t lo = (size_t)floor(h);
    size_t hi = lo + 1 < m ? lo + 1 : m - 1;
    return v[lo] + (h - (double)lo) * (v[hi] - v[lo]);
}

START_TEST(test_index_codec_quantiles_match_reference)
{
    enum { N = 997, D = 32 };
    float *r = xmalloc(sizeof(float) * N * D);
    float *copy = xmalloc(sizeof(float) * N * D);
    double *sorted = xmalloc(sizeof(double) * N * D);
    uint64_t s = 61;
    for (int rep = 0; rep < 2; rep++) {
        for (size_t i = 0; i < (size_t)N * D; i++) {
            double g = 0.05 * rng_gauss(&s) + (rng_uniform(&s) < 0.1 ? 0.2 : 0.0);
            /* The second round snaps values to a coarse grid, so that many are equal and the
             * quantiles fall on ties; both signs of zero included. */
            if (rep == 1)
                g = round(g * 200.0) / 200.0;
            r[i] = (float)g;
        }
        memcpy(copy, r, sizeof(float) * N * D);
        for (size_t i = 0; i < (size_t)N * D; i++)
            sorted[i] = r[i];
        qsort(sorted, (size_t)N * D, sizeof(double), cmp_asc);
        for (int t = 0; t < 4; t++) {
            unsigned nbits = all_nbits[t], nb = 1u << nbits;
            idx_codec c;
            memset(&c, 0xff, sizeof c);
            ck_assert_int_eq(idx_codec_train(&c, D, nbits, r, N), 0);
            ck_assert_uint_eq(c.dim, D);
            ck_assert_uint_eq(c.nbits, nbits);
            for (unsigned i = 1; i < nb; i++) {
                double want = quantile_ref(sorted, (size_t)N * D, (double)i / nb);
                ck_assert_msg(fabs(c.cutoffs[i - 1] - want) <= 1e-7 + 1e-6 * fabs(want),
                              "nbits %u cutoff %u: %.9g want %.9g", nbits, i, c.cutoffs[i - 1],
                              want);
                if (i > 1)
                    ck_assert(c.cutoffs[i - 1] >= c.cutoffs[i - 2]);
            }
            for (unsigned i = 0; i < nb; i++) {
                double want = quantile_ref(sorted, (size_t)N * D, (i + 0.5) / nb);
                ck_assert_msg(fabs(c.weights[i] - want) <= 1e-7 + 1e-6 * fabs(want),
                              "nbits %u weight %u: %.9g want %.9g", nbits, i, c.weights[i], want);
            }
        }
        ck_assert(memcmp(copy, r, sizeof(float) * N * D) == 0); /* input untouched */
    }
    free(r);
    free(copy);
    free(sorted);
}
END_TEST

/* The bit stream of the layout, written one bit at a time as codec.h describes it. */
static void pack_ref(const uint8_t *b, size_t dim, unsigned nbits, uint8_t *out)
{
    size_t nbytes = dim * nbits / 8;
    memset(out, 0, nbytes);
    size_t pos = 0;
    for (size_t j = 0; j < dim; j++)
        for (unsigned bit = 0; bit < nbits; bit++, pos++)
            if ((b[j] >> bit) & 1)
                out[pos / 8] |= (uint8_t)(0x80u >> (pos % 8));
}

START_TEST(test_index_codec_pack_round_trip)
{
    const size_t dims[] = {8, 16, 24, 64, 96, 128, 200, 256};
    uint64_t s = 71;
    for (int t = 0; t < 4; t++) {
        unsigned nbits = all_nbits[t];
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            size_t dim = dims[di];
            idx_codec c;
            random_codec(&c, dim, nbits, &s);
            size_t tb = idx_codec_token_bytes(&c);
            ck_assert_uint_eq(tb, dim * nbits / 8);
            uint8_t b[257], back[257], p[257], pr[257];
            for (int rep = 0; rep < 50; rep++) {
                for (size_t j = 0; j < dim; j++)
                    b[j] = (uint8_t)(rng_next(&s) & ((1u << nbits) - 1));
                memset(p, 0xab, sizeof p);
                memset(back, 0xab, sizeof back);
                idx_codec_pack(&c, b, p);
                pack_ref(b, dim, nbits, pr);
                ck_assert(memcmp(p, pr, tb) == 0);
                ck_assert_uint_eq(p[tb], 0xab); /* nothing written past the token */
                idx_codec_unpack(&c, p, back);
                ck_assert(memcmp(back, b, dim) == 0);
                ck_assert_uint_eq(back[dim], 0xab);
            }
        }
    }
}
END_TEST

/*
 * The bit order, by hand. nbits 2, buckets 1 2 3 0 | 0 1 2 3. Each bucket is written least
 * significant bit first, so the stream is
 *   1 -> 10, 2 -> 01, 3 -> 11, 0 -> 00   = 1001 1100 = 0x9C
 *   0 -> 00, 1 -> 10, 2 -> 01, 3 -> 11   = 0010 0111 = 0x27
 * and packbits puts the first bit of the stream in the byte's most significant bit.
 * nbits 4, buckets 1 6 11 15: 1 = 0001 -> 1000, 6 = 0110 -> 0110, 11 = 1011 -> 1101,
 * 15 -> 1111, so the bytes are 1000 0110 = 0x86 and 1101 1111 = 0xDF.
 * nbits 8, buckets 0x01 0xC4: bytes are the bit reversals, 0x80 and 0x23 (1100 0100 -> 0010 0011).
 * nbits 1, buckets 1 0 0 0 0 1 1 0: 1000 0110 = 0x86.
 * Compression is pinned too: with zero centroids and the nbits 2 cutoffs -0.1, 0, 0.1, the
 * values -0.2, -0.05, 0.05, 0.2 fall in buckets 0, 1, 2, 3.
 */
START_TEST(test_index_codec_bit_order_hand_computed)
{
    idx_codec c;
    uint64_t s = 81;
    uint8_t p[8], back[8];

    random_codec(&c, 8, 2, &s);
    const uint8_t b2[8] = {1, 2, 3, 0, 0, 1, 2, 3};
    idx_codec_pack(&c, b2, p);
    ck_assert_uint_eq(p[0], 0x9C);
    ck_assert_uint_eq(p[1], 0x27);
    idx_codec_unpack(&c, (const uint8_t[]){0x9C, 0x27}, back);
    ck_assert(memcmp(back, b2, 8) == 0);

    c.cutoffs[0] = -0.1f;
    c.cutoffs[1] = 0.0f;
    c.cutoffs[2] = 0.1f;
    for (int i = 0; i < 4; i++)
        c.weights[i] = -0.15f + 0.1f * i;
    const float e[8] = {-0.05f, 0.05f, 0.2f, -0.2f, -0.2f, -0.05f, 0.05f, 0.2f};
    const float zero[8] = {0};
    const uint32_t code = 0;
    float inv = NAN;
    memset(p, 0, sizeof p);
    idx_codec_compress(&c, zero, e, &code, 1, p, &inv);
    ck_assert_uint_eq(p[0], 0x9C);
    ck_assert_uint_eq(p[1], 0x27);

    random_codec(&c, 4, 4, &s);
    const uint8_t b4[4] = {1, 6, 11, 15};
    idx_codec_pack(&c, b4, p);
    ck_assert_uint_eq(p[0], 0x86);
    ck_assert_uint_eq(p[1], 0xDF);
    idx_codec_unpack(&c, (const uint8_t[]){0x86, 0xDF}, back);
    ck_assert(memcmp(back, b4, 4) == 0);

    random_codec(&c, 2, 8, &s);
    const uint8_t b8[2] = {0x01, 0xC4};
    idx_codec_pack(&c, b8, p);
    ck_assert_uint_eq(p[0], 0x80);
    ck_assert_uint_eq(p[1], 0x23);

    random_codec(&c, 8, 1, &s);
    const uint8_t b1[8] = {1, 0, 0, 0, 0, 1, 1, 0};
    idx_codec_pack(&c, b1, p);
    ck_assert_uint_eq(p[0], 0x86);
}
END_TEST

/* A trained codec over a clustered corpus: true centers as centroids, codes by nearest
 * centroid, codec trained on the residuals of the first n_train tokens. */
struct corpus {
    size_t n, dim, k;
    float *x, *cen;
    uint32_t *codes;
};

static void corpus_make(struct corpus *co, uint64_t seed, size_t n, size_t dim, size_t k,
                        double sigma)
{
    co->n = n;
    co->dim = dim;
    co->k = k;
    co->x = xmalloc(sizeof(float) * n * dim);
    co->cen = xmalloc(sizeof(float) * k * dim);
    co->codes = xmalloc(sizeof(uint32_t) * n);
    clustered(seed, n, dim, k, sigma, co->cen, co->x);
    for (size_t i = 0; i < n; i++)
        co->codes[i] = nearest_d(co->cen, k, dim, co->x + i * dim);
}

static void corpus_train(const struct corpus *co, size_t n_train, unsigned nbits, idx_codec *c)
{
    float *r = xmalloc(sizeof(float) * n_train * co->dim);
    for (size_t i = 0; i < n_train; i++)
        for (size_t j = 0; j < co->dim; j++)
            r[i * co->dim + j] =
                co->x[i * co->dim + j] - co->cen[(size_t)co->codes[i] * co->dim + j];
    ck_assert_int_eq(idx_codec_train(c, co->dim, nbits, r, n_train), 0);
    free(r);
}

static void corpus_free(struct corpus *co)
{
    free(co->x);
    free(co->cen);
    free(co->codes);
}

START_TEST(test_index_codec_compress_decompress_cosine)
{
    /* Within-cluster cosine ~0.8 at dim 128 (sigma 0.066), like ColBERT tokens. */
    struct corpus co;
    corpus_make(&co, 91, 3000, 128, 32, 0.066);
    float *out = xmalloc(sizeof(float) * co.n * co.dim);
    uint8_t *p = xmalloc(co.n * co.dim);
    float *inv = xmalloc(sizeof(float) * co.n);
    double prev = 0.0;
    for (int t = 0; t < 4; t++) {
        idx_codec c;
        corpus_train(&co, 1000, all_nbits[t], &c);
        poison_f(out, co.n * co.dim);
        idx_codec_compress(&c, co.cen, co.x, co.codes, co.n, p, inv);
        idx_codec_decompress(&c, co.cen, co.codes, p, co.n, out);
        double mean = 0.0;
        for (size_t i = 0; i < co.n; i++) {
            double nrm = sqrt(dot_d(out + i * co.dim, out + i * co.dim, co.dim));
            ck_assert_msg(fabs(nrm - 1.0) < 1e-5, "token %zu: norm %.8f", i, nrm);
            mean += dot_d(out + i * co.dim, co.x + i * co.dim, co.dim);
        }
        mean /= (double)co.n;
        /* The bare centroid gives ~0.8; each extra bit must do better, and 2 bits (the
         * default) must clear 0.9 (issue 3). */
        ck_assert_msg(mean > prev, "nbits %u: mean cosine %.4f not above %.4f", all_nbits[t], mean,
                      prev);
        if (all_nbits[t] >= 2)
            ck_assert_msg(mean > 0.9, "nbits %u: mean cosine %.4f", all_nbits[t], mean);
        prev = mean;
    }
    free(out);
    free(p);
    free(inv);
    corpus_free(&co);
}
END_TEST

START_TEST(test_index_codec_matches_double_reference)
{
    /* Inverse norms and decompressed vectors against a double-precision recomputation from
     * the buckets a plain bucketing loop gives. */
    struct corpus co;
    corpus_make(&co, 101, 1500, 96, 16, 0.08);
    float *out = xmalloc(sizeof(float) * co.n * co.dim);
    uint8_t *p = xmalloc(co.n * co.dim);
    uint8_t *b = xmalloc(co.dim), *rb = xmalloc(co.dim);
    float *inv = xmalloc(sizeof(float) * co.n);
    double *v = xmalloc(sizeof(double) * co.dim);
    for (int t = 0; t < 4; t++) {
        idx_codec c;
        corpus_train(&co, 500, all_nbits[t], &c);
        size_t tb = idx_codec_token_bytes(&c);
        poison_f(inv, co.n);
        poison_f(out, co.n * co.dim);
        idx_codec_compress(&c, co.cen, co.x, co.codes, co.n, p, inv);
        idx_codec_decompress(&c, co.cen, co.codes, p, co.n, out);
        for (size_t i = 0; i < co.n; i++) {
            const float *cen = co.cen + (size_t)co.codes[i] * co.dim;
            for (size_t j = 0; j < co.dim; j++)
                rb[j] = (uint8_t)bucket_ref(&c, co.x[i * co.dim + j] - cen[j]);
            idx_codec_unpack(&c, p + i * tb, b);
            ck_assert(memcmp(b, rb, co.dim) == 0);
            double ss = 0.0;
            for (size_t j = 0; j < co.dim; j++) {
                v[j] = (double)cen[j] + c.weights[rb[j]];
                ss += v[j] * v[j];
            }
            double want = 1.0 / sqrt(ss);
            ck_assert_msg(fabs(inv[i] / want - 1.0) < 1e-5, "token %zu: inv %.9g want %.9g", i,
                          inv[i], want);
            for (size_t j = 0; j < co.dim; j++)
                ck_assert(fabs(out[i * co.dim + j] - v[j] * want) < 1e-5);
        }
    }
    free(out);
    free(p);
    free(b);
    free(rb);
    free(inv);
    free(v);
    corpus_free(&co);
}
END_TEST

START_TEST(test_index_codec_parallel_matches_serial)
{
    /* 3000 tokens take the OpenMP path; one token at a time never does. */
    struct corpus co;
    corpus_make(&co, 111, 3000, 128, 16, 0.07);
    idx_codec c;
    corpus_train(&co, 800, 2, &c);
    size_t tb = idx_codec_token_bytes(&c);
    uint8_t *p = xmalloc(co.n * tb), *p1 = xmalloc(co.n * tb);
    float *inv = xmalloc(sizeof(float) * co.n), *inv1 = xmalloc(sizeof(float) * co.n);
    float *out = xmalloc(sizeof(float) * co.n * co.dim);
    float *out1 = xmalloc(sizeof(float) * co.n * co.dim);
    idx_codec_compress(&c, co.cen, co.x, co.codes, co.n, p, inv);
    idx_codec_decompress(&c, co.cen, co.codes, p, co.n, out);
    for (size_t i = 0; i < co.n; i++) {
        idx_codec_compress(&c, co.cen, co.x + i * co.dim, co.codes + i, 1, p1 + i * tb, inv1 + i);
        idx_codec_decompress(&c, co.cen, co.codes + i, p1 + i * tb, 1, out1 + i * co.dim);
    }
    ck_assert(memcmp(p, p1, co.n * tb) == 0);
    ck_assert(memcmp(inv, inv1, sizeof(float) * co.n) == 0);
    ck_assert(memcmp(out, out1, sizeof(float) * co.n * co.dim) == 0);
    free(p);
    free(p1);
    free(inv);
    free(inv1);
    free(out);
    free(out1);
    corpus_free(&co);
}
END_TEST

START_TEST(test_index_codec_rejects_invalid_shapes)
{
    float r[64 * 3];
    uint64_t s = 121;
    for (size_t i = 0; i < 64 * 3; i++)
        r[i] = (float)rng_gauss(&s);
    idx_codec c, before;
    memset(&c, 0x5a, sizeof c);
    before = c;
    /* nbits outside {1, 2, 4, 8}. */
    const unsigned bad_nbits[] = {0, 3, 5, 6, 7, 9, 16};
    for (size_t i = 0; i < sizeof bad_nbits / sizeof bad_nbits[0]; i++)
        ck_assert_int_eq(idx_codec_train(&c, 16, bad_nbits[i], r, 4), -1);
    /* dim * nbits not a multiple of 8. */
    ck_assert_int_eq(idx_codec_train(&c, 3, 2, r, 4), -1);
    ck_assert_int_eq(idx_codec_train(&c, 6, 1, r, 4), -1);
    ck_assert_int_eq(idx_codec_train(&c, 1, 4, r, 4), -1);
    ck_assert_int_eq(idx_codec_train(&c, 0, 8, r, 4), -1);
    /* No data, no pointer, or a value that is not finite. */
    ck_assert_int_eq(idx_codec_train(&c, 16, 2, r, 0), -1);
    ck_assert_int_eq(idx_codec_train(&c, 16, 2, NULL, 4), -1);
    ck_assert_int_eq(idx_codec_train(NULL, 16, 2, r, 4), -1);
    r[17] = NAN;
    ck_assert_int_eq(idx_codec_train(&c, 16, 2, r, 4), -1);
    r[17] = INFINITY;
    ck_assert_int_eq(idx_codec_train(&c, 16, 2, r, 4), -1);
    ck_assert(memcmp(&c, &before, sizeof c) == 0); /* untouched by every failure */
    r[17] = 0.0f;
    /* A codec of an invalid shape (damaged, since training refuses them) makes the other
     * functions write nothing, rather than divide by zero or run off the buffers. */
    const unsigned bad[] = {0, 3, 16};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0] + 1; i++) {
        idx_codec z;
        memset(&z, 0, sizeof z);
        z.dim = i < sizeof bad / sizeof bad[0] ? 16 : 3;
        z.nbits = i < sizeof bad / sizeof bad[0] ? bad[i] : 2;
        uint8_t bk[16] = {0}, pk[64];
        float emb[16] = {0}, cen[16] = {0}, out[16], inv = NAN;
        uint32_t code = 0;
        memset(pk, 0xab, sizeof pk);
        poison_f(out, 16);
        idx_codec_pack(&z, bk, pk);
        idx_codec_compress(&z, cen, emb, &code, 1, pk, &inv);
        for (size_t j = 0; j < sizeof pk; j++)
            ck_assert_uint_eq(pk[j], 0xab);
        ck_assert(isnan(inv));
        memset(bk, 0xcd, sizeof bk);
        idx_codec_unpack(&z, pk, bk);
        idx_codec_decompress(&z, cen, &code, pk, 1, out);
        for (size_t j = 0; j < 16; j++) {
            ck_assert_uint_eq(bk[j], 0xcd);
            ck_assert(isnan(out[j]));
        }
    }
    /* The smallest valid shapes are accepted. */
    ck_assert_int_eq(idx_codec_train(&c, 4, 2, r, 4), 0);
    ck_assert_int_eq(idx_codec_train(&c, 2, 4, r, 4), 0);
    ck_assert_int_eq(idx_codec_train(&c, 8, 1, r, 4), 0);
    ck_assert_int_eq(idx_codec_train(&c, 1, 8, r, 1), 0);
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
            poison_f(sc, n);
            ck_assert_int_eq(kern_nearest_centroid(KERN_DEV_CPU, x, n, c, k, dim, best, sc),
                             KERN_OK);
            for (size_t i = 0; i < n; i++)
                check_choice(c, k, dim, x + i * dim, best[i], sc[i], i);
        }
        /* The index layer's CPU path (FAISS). */
        memset(codes, 0xab, sizeof(uint32_t) * n);
        poison_f(sc2, n);
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
        poison_f(s2, N);
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
    clustered(11, KM_N, KM_DIM, KM_CL, 0.03, centers, x);
    /* max_per_centroid 100 < KM_N / KM_K: the subsampling path runs too. */
    for (int per = 100; per <= 256; per += 156) {
        store_msg m = {{0}};
        poison_f(cen, KM_K * KM_DIM);
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
        poison_f(cen2, KM_K * KM_DIM);
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
    for (int seed = 1; seed <= 3; seed++) {
        store_msg m = {{0}};
        poison_f(cen, K * D);
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

/* ---- suite -------------------------------------------------------------------------- */

static void add(Suite *s, const char *name, const TTest *t)
{
    TCase *tc = tcase_create(name);
    tcase_add_test(tc, t);
    suite_add_tcase(s, tc);
}

int main(void)
{
    Suite *s = suite_create("index");
    add(s, "kmeans_recovers_clusters", test_index_kmeans_recovers_clusters);
    add(s, "kmeans_centroids_normalised", test_index_kmeans_centroids_normalised);
    add(s, "kmeans_reproducible", test_index_kmeans_reproducible);
    add(s, "kmeans_rejects_bad_arguments", test_index_kmeans_rejects_bad_arguments);
    add(s, "kmeans_prints_nothing", test_index_kmeans_prints_nothing);
    add(s, "flat_search_matches_bruteforce", test_index_flat_search_matches_bruteforce);
    add(s, "flat_search_pads_beyond_k", test_index_flat_search_pads_beyond_k);
    add(s, "plan_sample_docs", test_index_plan_sample_docs);
    add(s, "plan_centroids", test_index_plan_centroids);
    add(s, "codec_bucket_boundaries", test_index_codec_bucket_boundaries);
    add(s, "codec_quantiles_match_reference", test_index_codec_quantiles_match_reference);
    add(s, "codec_pack_round_trip", test_index_codec_pack_round_trip);
    add(s, "codec_bit_order_hand_computed", test_index_codec_bit_order_hand_computed);
    add(s, "codec_compress_decompress_cosine", test_index_codec_compress_decompress_cosine);
    add(s, "codec_matches_double_reference", test_index_codec_matches_double_reference);
    add(s, "codec_parallel_matches_serial", test_index_codec_parallel_matches_serial);
    add(s, "codec_rejects_invalid_shapes", test_index_codec_rejects_invalid_shapes);
    add(s, "assign_matches_double", test_index_assign_matches_double);
    add(s, "assign_ties_go_to_lower_index", test_index_assign_ties_go_to_lower_index);
    add(s, "assign_same_any_threads", test_index_assign_same_any_threads);
    add(s, "assign_rejects_bad_arguments", test_index_assign_rejects_bad_arguments);
    add(s, "kmeans_device_recovers_clusters", test_index_kmeans_device_recovers_clusters);
    add(s, "kmeans_device_refills_empty_clusters", test_index_kmeans_device_refills_empty_clusters);
    add(s, "device_option_reaches_build", test_index_device_option_reaches_build);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
