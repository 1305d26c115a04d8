/*
 * check_codec_fit.c: the codec's fitted tables (idx_codec_fit, Lloyd-Max from the quantiles).
 * Each test draws fresh random residuals and compares with a plain double-precision reference
 * computed here: the reference Lloyd-Max iteration, the squared quantisation error, and the
 * decoding of a real index on disk through the tables it stored.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "codec.h"
#include "db.h"
#include "fixture.h"
#include "index.h"
#include "tartan.h"

static const unsigned all_nbits[] = {1, 2, 4, 8};

/*
 * Residual-like values of three shapes: 0 Gaussian; 1 a Gaussian per dimension with its own
 * scale (anisotropic: pooled, a heavy-tailed mixture); 2 skewed (a Gaussian plus a sparse
 * positive spike), as residuals to a centroid that a near-duplicate run pulled aside are.
 */
static void draw(float *r, size_t n, size_t dim, int shape, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < dim; j++) {
            double g = rng_gauss(s);
            if (shape == 1)
                g *= 0.01 + 0.12 * (double)((j * 7) % dim) / (double)dim;
            else if (shape == 2)
                g = 0.04 * g + (rng_uniform(s) < 0.08 ? 0.15 : 0.0);
            else
                g *= 0.05;
            r[i * dim + j] = (float)g;
        }
}

/* The bucket of v under ascending cutoffs: the number of cutoffs strictly below v. */
static unsigned bucket_ref(const double *cut, unsigned nb, double v)
{
    unsigned b = 0;
    while (b + 1 < nb && cut[b] < v)
        b++;
    return b;
}

/* Mean squared error of the m values quantised with the tables, in double. */
static double mse_ref(const float *v, size_t m, const float *cutf, const float *wf, unsigned nb)
{
    double cut[255], e = 0.0;
    for (unsigned b = 0; b + 1 < nb; b++)
        cut[b] = cutf[b];
    for (size_t i = 0; i < m; i++) {
        double d = (double)v[i] - (double)wf[bucket_ref(cut, nb, v[i])];
        e += d * d;
    }
    return e / (double)m;
}

/* Fitted tables never lose to the quantile tables in squared error, and strictly win on every
 * shape at 1, 2 and 4 bits (8 bits: not worse). Both tables ascending. */
START_TEST(test_codec_fit_lowers_squared_error)
{
    enum { N = 701, D = 64 };
    float *r = xmalloc(sizeof(float) * N * D);
    float *copy = xmalloc(sizeof(float) * N * D);
    uint64_t s = 1009;
    for (int shape = 0; shape < 3; shape++) {
        draw(r, N, D, shape, &s);
        memcpy(copy, r, sizeof(float) * N * D);
        for (int t = 0; t < 4; t++) {
            unsigned nbits = all_nbits[t], nb = 1u << nbits;
            idx_codec q, f;
            memset(&q, 0xff, sizeof q);
            memset(&f, 0xff, sizeof f);
            ck_assert_int_eq(idx_codec_train(&q, D, nbits, r, N), 0);
            ck_assert_int_eq(idx_codec_fit(&f, D, nbits, r, N, 30), 0);
            ck_assert_uint_eq(f.dim, D);
            ck_assert_uint_eq(f.nbits, nbits);
            double eq = mse_ref(r, (size_t)N * D, q.cutoffs, q.weights, nb);
            double ef = mse_ref(r, (size_t)N * D, f.cutoffs, f.weights, nb);
            ck_assert_msg(ef <= eq * (1 + 1e-9), "shape %d nbits %u: fitted %.6g > quantile %.6g",
                          shape, nbits, ef, eq);
            if (nbits < 8)
                ck_assert_msg(ef < 0.995 * eq, "shape %d nbits %u: fitted %.6g, quantile %.6g",
                              shape, nbits, ef, eq);
            for (unsigned b = 1; b < nb; b++) {
                ck_assert(f.weights[b] >= f.weights[b - 1]);
                if (b + 1 < nb)
                    ck_assert(f.cutoffs[b] >= f.cutoffs[b - 1]);
            }
            /* Zero steps are the quantile tables, bit for bit. */
            idx_codec z;
            ck_assert_int_eq(idx_codec_fit(&z, D, nbits, r, N, 0), 0);
            ck_assert(memcmp(z.cutoffs, q.cutoffs, (nb - 1) * sizeof(float)) == 0);
            ck_assert(memcmp(z.weights, q.weights, nb * sizeof(float)) == 0);
        }
        ck_assert(memcmp(copy, r, sizeof(float) * N * D) == 0); /* input untouched */
    }
    free(r);
    free(copy);
}
END_TEST

/*
 * The fitted tables are the Lloyd-Max iteration computed here in double from the same
 * quantile start: weights = bucket means, cutoffs = midpoints, the given number of steps.
 */
START_TEST(test_codec_fit_matches_double_lloyd)
{
    enum { N = 523, D = 32 };
    const size_t m = (size_t)N * D;
    float *r = xmalloc(sizeof(float) * m);
    uint64_t s = 77;
    const unsigned steps[] = {1, 3, 12};
    for (int shape = 0; shape < 3; shape++) {
        draw(r, N, D, shape, &s);
        for (int t = 0; t < 3; t++) {
            unsigned nbits = all_nbits[t], nb = 1u << nbits;
            for (int k = 0; k < 3; k++) {
                idx_codec q, f;
                ck_assert_int_eq(idx_codec_train(&q, D, nbits, r, N), 0);
                memset(&f, 0xff, sizeof f);
                ck_assert_int_eq(idx_codec_fit(&f, D, nbits, r, N, steps[k]), 0);
                double cut[255], w[256];
                for (unsigned b = 0; b < nb; b++)
                    w[b] = q.weights[b];
                for (unsigned b = 0; b + 1 < nb; b++)
                    cut[b] = q.cutoffs[b];
                for (unsigned it = 0; it < steps[k]; it++) {
                    double sum[256] = {0};
                    size_t cnt[256] = {0};
                    for (size_t i = 0; i < m; i++) {
                        unsigned b = bucket_ref(cut, nb, r[i]);
                        sum[b] += r[i];
                        cnt[b]++;
                    }
                    for (unsigned b = 0; b < nb; b++)
                        if (cnt[b])
                            w[b] = sum[b] / (double)cnt[b];
                    /* The code rounds each cutoff to float before the next step buckets with
                     * it; so does the reference, else a value sitting on a cutoff could fall
                     * the other way. */
                    for (unsigned b = 0; b + 1 < nb; b++)
                        cut[b] = (float)(0.5 * (w[b] + w[b + 1]));
                }
                for (unsigned b = 0; b < nb; b++)
                    ck_assert_msg(fabs(f.weights[b] - w[b]) <= 1e-6 * fabs(w[b]) + 1e-9,
                                  "shape %d nbits %u steps %u weight %u: %.9g want %.9g", shape,
                                  nbits, steps[k], b, f.weights[b], w[b]);
                for (unsigned b = 0; b + 1 < nb; b++)
                    ck_assert_msg(fabs(f.cutoffs[b] - cut[b]) <= 1e-6 * fabs(cut[b]) + 1e-9,
                                  "shape %d nbits %u steps %u cutoff %u: %.9g want %.9g", shape,
                                  nbits, steps[k], b, f.cutoffs[b], cut[b]);
            }
        }
    }
    free(r);
}
END_TEST

/* Degenerate inputs: all values equal (every bucket but one empty) keeps finite, ascending
 * tables; bad shapes and NaN are refused like idx_codec_train refuses them. */
START_TEST(test_codec_fit_degenerate_and_refused)
{
    float r[64];
    for (int i = 0; i < 64; i++)
        r[i] = 0.25f;
    for (int t = 0; t < 4; t++) {
        unsigned nbits = all_nbits[t], nb = 1u << nbits;
        idx_codec f;
        ck_assert_int_eq(idx_codec_fit(&f, 8, nbits, r, 8, 30), 0);
        for (unsigned b = 0; b < nb; b++) {
            ck_assert(isfinite(f.weights[b]));
            if (b > 0)
                ck_assert(f.weights[b] >= f.weights[b - 1]);
        }
        ck_assert_uint_eq(idx_codec_bucket(&f, 0.25f) < nb, 1);
    }
    idx_codec c;
    memset(&c, 0x5a, sizeof c);
    idx_codec before = c;
    ck_assert_int_eq(idx_codec_fit(&c, 16, 3, r, 4, 30), -1);
    ck_assert_int_eq(idx_codec_fit(&c, 3, 2, r, 4, 30), -1);
    ck_assert_int_eq(idx_codec_fit(&c, 16, 2, r, 0, 30), -1);
    ck_assert_int_eq(idx_codec_fit(&c, 16, 2, NULL, 4, 30), -1);
    r[5] = NAN;
    ck_assert_int_eq(idx_codec_fit(&c, 16, 2, r, 4, 30), -1);
    ck_assert(memcmp(&c, &before, sizeof c) == 0);
}
END_TEST

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* NumPy's default ("linear") q-quantile of m ascending values, in double, rounded once. */
static float quantile_ref(const float *v, size_t m, double q)
{
    double h = q * (double)(m - 1);
    size_t lo = (size_t)floor(h), hi = lo + 1 < m ? lo + 1 : m - 1;
    double g = h - (double)lo, a = v[lo], b = v[hi], d = b - a;
    return (float)(g >= 0.5 ? b - d * (1.0 - g) : a + d * g);
}

/* A sample large enough for the threaded sort (192,064 values, each pass split between the
 * threads): the quantile tables equal a reference from qsort, value for value, with ties
 * among the values (a tenth repeat an earlier one); and the fitted tables come out the same
 * on 1, 3 and 4 threads. */
START_TEST(test_codec_fit_large_sample_threads)
{
    enum { N = 3001, D = 64 };
    const size_t m = (size_t)N * D;
    float *r = xmalloc(m * sizeof(float)), *v = xmalloc(m * sizeof(float));
    uint64_t s = 31337;
    for (int shape = 0; shape < 3; shape++) {
        draw(r, N, D, shape, &s);
        for (size_t i = 1; i < m; i++)
            if (rng_next(&s) % 10 == 0)
                r[i] = r[rng_next(&s) % i];
        memcpy(v, r, m * sizeof(float));
        qsort(v, m, sizeof(float), cmp_float);
        for (int t = 0; t < 4; t++) {
            unsigned nbits = all_nbits[t], nb = 1u << nbits;
            idx_codec q, f[3];
            ck_assert_int_eq(idx_codec_train(&q, D, nbits, r, N), 0);
            for (unsigned b = 1; b < nb; b++)
                ck_assert_msg(q.cutoffs[b - 1] == quantile_ref(v, m, (double)b / nb),
                              "shape %d nbits %u: cutoff %u %.9g, reference %.9g", shape, nbits,
                              b - 1, q.cutoffs[b - 1], quantile_ref(v, m, (double)b / nb));
            for (unsigned b = 0; b < nb; b++)
                ck_assert_msg(q.weights[b] == quantile_ref(v, m, (b + 0.5) / nb),
                              "shape %d nbits %u: weight %u %.9g, reference %.9g", shape, nbits, b,
                              q.weights[b], quantile_ref(v, m, (b + 0.5) / nb));
            static const int threads[3] = {1, 3, 4};
            for (int k = 0; k < 3; k++) {
#ifdef _OPENMP
                omp_set_num_threads(threads[k]);
#else
                (void)threads;
#endif
                memset(&f[k], 0, sizeof f[k]);
                ck_assert_int_eq(idx_codec_fit(&f[k], D, nbits, r, N, 30), 0);
                ck_assert_msg(memcmp(f[k].cutoffs, f[0].cutoffs, sizeof f[0].cutoffs) == 0 &&
                                  memcmp(f[k].weights, f[0].weights, sizeof f[0].weights) == 0,
                              "shape %d nbits %u: other tables on %d threads", shape, nbits,
                              threads[k]);
            }
        }
    }
    free(r);
    free(v);
}
END_TEST

/*
 * A real index on disk: after tartan_add trains and encodes, the tables read back from LMDB
 * are fitted (not the quantiles of anything: they satisfy the midpoint rule), every stored
 * token's buckets are what the stored cutoffs give for its residual to its centroid, and the
 * reader's decompression equals normalise(C[code] + w[bucket]) computed in double.
 */
START_TEST(test_codec_fit_index_round_trip)
{
    enum { DOCS = 120, DIM = 32 };
    for (int t = 0; t < 3; t++) {
        unsigned nbits = all_nbits[t], nb = 1u << nbits;
        fixture_dir_create("codecfit");
        uint64_t s = 4242 + t;
        size_t lens[DOCS], rows = 0;
        for (int i = 0; i < DOCS; i++)
            rows += lens[i] = 8 + rng_next(&s) % 40;
        float *e = xmalloc(rows * DIM * sizeof(float));
        /* Anisotropic tokens around a few directions, as model 3 makes them. */
        for (size_t i = 0; i < rows; i++) {
            double ss = 0;
            int dir = (int)(rng_next(&s) % 7);
            for (size_t j = 0; j < DIM; j++) {
                double v = (j % 7 == (size_t)dir ? 1.0 : 0.0) +
                           rng_gauss(&s) * (0.05 + 0.3 * (double)j / DIM);
                e[i * DIM + j] = (float)v;
                ss += v * v;
            }
            for (size_t j = 0; j < DIM; j++)
                e[i * DIM + j] = (float)(e[i * DIM + j] / sqrt(ss));
        }
        char idbuf[DOCS][16];
        const char *ids[DOCS];
        for (int i = 0; i < DOCS; i++) {
            snprintf(idbuf[i], sizeof idbuf[i], "d%d", i);
            ids[i] = idbuf[i];
        }
        tartan_options o;
        tartan_options_init(&o);
        o.flags = TARTAN_CREATE;
        o.dim = DIM;
        o.nbits = nbits;
        o.n_centroids = 16;
        o.device = TARTAN_DEVICE_CPU;
        tartan_db *db;
        ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
        tartan_batch b = {DOCS, ids, lens, e, rows, DIM, TARTAN_FLOAT32};
        ck_assert_int_eq(tartan_add(db, &b, 0), 0);
        tartan_close(db);

        o.flags = TARTAN_READONLY;
        ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
        idx_reader r;
        store_msg m = {{0}};
        ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
        ck_assert(r.trained);
        const idx_codec *c = &r.codec;
        for (unsigned k = 0; k + 1 < nb; k++) {
            /* Stored cutoffs are the midpoints of the stored weights (Lloyd-Max's rule; the
             * quantile tables do not satisfy it). */
            double mid = 0.5 * ((double)c->weights[k] + c->weights[k + 1]);
            ck_assert_msg(fabs(c->cutoffs[k] - mid) <= 1e-6 * fabs(mid) + 1e-9,
                          "nbits %u cutoff %u %.9g, midpoint %.9g", nbits, k, c->cutoffs[k], mid);
        }
        size_t tb = DIM * nbits / 8, seen = 0;
        float *dec = xmalloc(64 * DIM * sizeof(float));
        uint8_t bk[DIM];
        for (int i = 0; i < DOCS; i++) {
            uint32_t docno;
            kern_pdoc d;
            ck_assert_int_eq(idx_reader_docno(&r, ids[i], &docno, &m), 0);
            ck_assert_int_eq(idx_reader_doc(&r, docno, &d, &m), 0);
            ck_assert_uint_eq(d.ntok, lens[i]);
            for (size_t x = 0; x < d.ntok * DIM; x++)
                dec[x] = NAN;
            idx_reader_decompress(&r, &d, dec);
            for (uint32_t k = 0; k < d.ntok; k++) {
                const float *orig = e + (seen + k) * DIM;
                uint32_t code = r.h.code_bytes == 2 ? ((const uint16_t *)d.codes)[k]
                                                    : ((const uint32_t *)d.codes)[k];
                ck_assert_uint_lt(code, r.h.n_centroids);
                const float *cen = r.centroids + (size_t)code * DIM;
                idx_codec_unpack(c, d.residuals + k * tb, bk);
                double v[DIM], ss = 0;
                for (size_t j = 0; j < DIM; j++) {
                    /* The residual is formed in float, as the encoder forms it. */
                    float res = orig[j] - cen[j];
                    ck_assert_uint_eq(bk[j], idx_codec_bucket(c, res));
                    v[j] = (double)cen[j] + c->weights[bk[j]];
                    ss += v[j] * v[j];
                }
                for (size_t j = 0; j < DIM; j++)
                    ck_assert_msg(fabs(dec[k * DIM + j] - v[j] / sqrt(ss)) <= 1e-5,
                                  "nbits %u doc %d token %u dim %zu: %.7g want %.7g", nbits, i, k,
                                  j, dec[k * DIM + j], v[j] / sqrt(ss));
            }
            seen += d.ntok;
        }
        idx_reader_close(&r);
        tartan_close(db);
        free(dec);
        free(e);
        fixture_dir_remove();
    }
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"codec_fit_lowers_squared_error", test_codec_fit_lowers_squared_error, 0},
        {"codec_fit_matches_double_lloyd", test_codec_fit_matches_double_lloyd, 0},
        {"codec_fit_degenerate_and_refused", test_codec_fit_degenerate_and_refused, 0},
        {"codec_fit_index_round_trip", test_codec_fit_index_round_trip, 0},
        {"codec_fit_large_sample_threads", test_codec_fit_large_sample_threads, 0},
    };
    return FX_RUN("codec_fit", cases, 0, 0);
}
