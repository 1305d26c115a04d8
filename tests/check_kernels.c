/*
 * check_kernels.c: the CPU kernels against plain double-precision references on fresh random
 * inputs. Every output is poisoned (NaN) before a call. Numeric tests run once per micro-kernel
 * variant this CPU supports (avx512, avx2, generic), so a CI machine without AVX-512 still
 * tests what it runs and this one tests all three.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "microkernel_cpu.h"

/* ---- random inputs ---------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t seed;

static void rng_init(void)
{
    const char *s = getenv("TARTAN_TEST_SEED");
    seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
}

static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [-1, 1). */
static float frnd(void)
{
    return (float)(rnd() >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static size_t urnd(size_t lo, size_t hi) /* uniform in lo..hi */
{
    return lo + (size_t)(rnd() % (hi - lo + 1));
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

static void poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* Embeddings stored in dtype t (raw) with the fp32 values they hold (val) for references. */
typedef struct emb {
    kern_dtype t;
    size_t rows, dim;
    void *raw;
    float *val;
} emb;

static void emb_rand(emb *e, kern_dtype t, size_t rows, size_t dim)
{
    e->t = t;
    e->rows = rows;
    e->dim = dim;
    e->raw = xcalloc(rows * dim, kern_dtype_size(t));
    e->val = xcalloc(rows * dim, sizeof(float));
    for (size_t i = 0; i < rows * dim; i++) {
        float f = frnd();
        if (t == KERN_F32) {
            ((float *)e->raw)[i] = f;
        } else if (t == KERN_F16) {
            ((uint16_t *)e->raw)[i] = kern_f32_to_f16(f);
            f = kern_f16_to_f32(((uint16_t *)e->raw)[i]);
        } else if (t == KERN_BF16) {
            ((uint16_t *)e->raw)[i] = kern_f32_to_bf16(f);
            f = kern_bf16_to_f32(((uint16_t *)e->raw)[i]);
        } else {
            ((uint8_t *)e->raw)[i] = kern_f32_to_e4m3(f);
            f = kern_e4m3_to_f32(((uint8_t *)e->raw)[i]);
        }
        e->val[i] = f;
    }
}

/* Makes row dst a copy of row src (both the stored and the reference values). */
static void emb_copy_row(emb *e, size_t dst, size_t src)
{
    size_t es = kern_dtype_size(e->t);
    memcpy((char *)e->raw + dst * e->dim * es, (char *)e->raw + src * e->dim * es, e->dim * es);
    memcpy(e->val + dst * e->dim, e->val + src * e->dim, e->dim * sizeof(float));
}

static void emb_free(emb *e)
{
    free(e->raw);
    free(e->val);
}

static uint8_t *mask_rand(size_t n, double p_valid)
{
    uint8_t *m = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++)
        m[i] =
            (uint8_t)((double)(rnd() >> 11) / 9007199254740992.0 < p_valid ? 1 + rnd() % 255 : 0);
    return m;
}

/* ---- references ------------------------------------------------------------------------- */

/*
 * MaxSim in double of lq query rows q against ld document rows d (masks NULL: all valid).
 * *bound gets sum_i max_t sum_k |q_ik d_tk|, the scale of the fp32 rounding error.
 */
static double ref_maxsim(const float *q, const uint8_t *qm, size_t lq, const float *d,
                         const uint8_t *dm, size_t ld, size_t dim, double *bound)
{
    size_t nd = 0;
    for (size_t t = 0; t < ld; t++)
        nd += !dm || dm[t];
    *bound = 0.0;
    if (nd == 0)
        return -INFINITY;
    double s = 0.0;
    for (size_t i = 0; i < lq; i++) {
        if (qm && !qm[i])
            continue;
        double mx = -INFINITY, mb = 0.0;
        for (size_t t = 0; t < ld; t++) {
            if (dm && !dm[t])
                continue;
            double dot = 0.0, ab = 0.0;
            for (size_t k = 0; k < dim; k++) {
                double p = (double)q[i * dim + k] * d[t * dim + k];
                dot += p;
                ab += fabs(p);
            }
            mx = dot > mx ? dot : mx;
            mb = ab > mb ? ab : mb;
        }
        s += mx;
        *bound += mb;
    }
    return s;
}

#define TOL(bound) (2e-6 * (bound) + 1e-5)

static void assert_close(float got, double ref, double bound, const char *what, size_t a, size_t b)
{
    if (isinf(ref)) {
        ck_assert_msg(isinf(got) && got < 0, "%s [%zu,%zu]: got %g, want -inf (seed %llu)", what, a,
                      b, got, (unsigned long long)seed);
        return;
    }
    ck_assert_msg(fabs(got - ref) <= TOL(bound), "%s [%zu,%zu]: got %.9g, want %.9g (seed %llu)",
                  what, a, b, got, ref, (unsigned long long)seed);
}

/* The micro-kernel variants this CPU runs; each numeric test loops over them. */
static const char *const isas[] = {"avx512", "avx2", "generic"};
#define FOR_EACH_ISA(name)                                                                         \
    for (size_t isa_i_ = 0; isa_i_ < 3; isa_i_++)                                                  \
        for (const char *name = isas[isa_i_];                                                      \
             name && kern_cpu_has_isa(name) && kern_cpu_force_isa(name) == KERN_OK; name = NULL)

static const kern_dtype dtypes[] = {KERN_F32, KERN_F16, KERN_BF16, KERN_E4M3};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

/* ---- dense MaxSim --------------------------------------------------------------------------- */

/* Runs dense MaxSim on random inputs of the given shape and masks and checks every score. */
static void check_dense(kern_dtype t, size_t dim, size_t nq, size_t lq, size_t nd, size_t ld,
                        double qvalid, double dvalid)
{
    emb q, d;
    emb_rand(&q, t, nq * lq, dim);
    emb_rand(&d, t, nd * ld, dim);
    uint8_t *qm = qvalid < 1.0 ? mask_rand(nq * lq, qvalid) : NULL;
    uint8_t *dm = dvalid < 1.0 ? mask_rand(nd * ld, dvalid) : NULL;
    float *scores = xcalloc(nq * nd, sizeof(float));
    kern_dense a = {t, dim, q.raw, qm, nq, lq, d.raw, dm, nd, ld};
    FOR_EACH_ISA(isa)
    {
        poison(scores, nq * nd);
        ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, scores), KERN_OK);
        for (size_t i = 0; i < nq; i++)
            for (size_t n = 0; n < nd; n++) {
                double bound;
                double ref =
                    ref_maxsim(q.val + i * lq * dim, qm ? qm + i * lq : NULL, lq,
                               d.val + n * ld * dim, dm ? dm + n * ld : NULL, ld, dim, &bound);
                assert_close(scores[i * nd + n], ref, bound, isa, i, n);
            }
    }
    kern_cpu_force_isa(NULL);
    emb_free(&q);
    emb_free(&d);
    free(qm);
    free(dm);
    free(scores);
}

START_TEST(test_kernels_dense_unmasked)
{
    rng_init();
    check_dense(KERN_F32, 128, 3, 32, 9, 41, 1.0, 1.0);
    check_dense(KERN_F32, 64, 1, 7, 5, 3, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_dims)
{
    rng_init();
    static const size_t dims[] = {64, 96, 128, 256, 320, 1024};
    for (size_t i = 0; i < 6; i++)
        for (size_t k = 0; k < NDTYPES; k++)
            check_dense(dtypes[k], dims[i], 2, urnd(1, 40), 4, urnd(1, 30), 1.0, 0.8);
}
END_TEST

START_TEST(test_kernels_dense_odd_dims)
{
    /* Any positive dim works, also ones no vector width divides. */
    rng_init();
    static const size_t dims[] = {1, 3, 17, 33};
    for (size_t i = 0; i < 4; i++) {
        check_dense(KERN_F32, dims[i], 2, urnd(1, 35), 3, urnd(1, 20), 0.9, 0.9);
        check_dense(KERN_BF16, dims[i], 2, urnd(1, 35), 3, urnd(1, 20), 0.9, 0.9);
        check_dense(KERN_E4M3, dims[i], 2, urnd(1, 35), 3, urnd(1, 20), 0.9, 0.9);
    }
}
END_TEST

START_TEST(test_kernels_dense_query_mask)
{
    rng_init();
    check_dense(KERN_F32, 128, 4, 32, 6, 20, 0.6, 1.0);
    /* Two-token queries, a third of their tokens valid: many queries have none at all, the
     * first of a call included, and the next query makes the first pass over a chunk. */
    for (size_t k = 0; k < NDTYPES; k++)
        check_dense(dtypes[k], 64, 9, 2, 5, 20, 0.3, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_doc_mask)
{
    rng_init();
    check_dense(KERN_F32, 96, 2, 16, 10, 50, 1.0, 0.3);
}
END_TEST

START_TEST(test_kernels_dense_f16)
{
    rng_init();
    check_dense(KERN_F16, 128, 3, 32, 5, 33, 0.8, 0.7);
    check_dense(KERN_F16, 320, 1, 5, 3, 9, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_bf16)
{
    rng_init();
    check_dense(KERN_BF16, 128, 3, 32, 5, 33, 0.8, 0.7);
    check_dense(KERN_BF16, 1024, 1, 3, 2, 5, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_lq1)
{
    rng_init();
    for (size_t k = 0; k < NDTYPES; k++)
        check_dense(dtypes[k], 128, 3, 1, 7, 25, 1.0, 0.9);
}
END_TEST

START_TEST(test_kernels_dense_many_panels)
{
    /* More query tokens than one panel holds, with a part-filled last panel. */
    rng_init();
    check_dense(KERN_F32, 64, 2, 75, 3, 19, 0.95, 1.0);
    check_dense(KERN_BF16, 64, 2, 75, 3, 19, 0.95, 1.0);
    check_dense(KERN_F16, 32, 1, 40, 2, 9, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_long_docs)
{
    /* Documents longer than one chunk of rows, so running maxima carry across chunks. */
    rng_init();
    check_dense(KERN_F32, 64, 2, 8, 2, 1100, 1.0, 0.9);
    check_dense(KERN_BF16, 128, 1, 8, 2, 700, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_queries_split)
{
    /* Many queries, few documents: threads split the queries. */
    rng_init();
    check_dense(KERN_F32, 64, 37, 9, 1, 13, 0.9, 1.0);
    check_dense(KERN_F16, 64, 11, 4, 2, 7, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_all_masked)
{
    /* A document whose every token is masked scores -inf; a query with none scores 0. */
    rng_init();
    size_t dim = 64, nq = 2, lq = 5, nd = 3, ld = 4;
    emb q, d;
    emb_rand(&q, KERN_F32, nq * lq, dim);
    emb_rand(&d, KERN_F32, nd * ld, dim);
    uint8_t qm[10] = {1, 1, 0, 1, 1, 0, 0, 0, 0, 0};       /* query 1: no valid token */
    uint8_t dm[12] = {1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1}; /* document 1: all masked */
    float scores[6];
    kern_dense a = {KERN_F32, dim, q.raw, qm, nq, lq, d.raw, dm, nd, ld};
    FOR_EACH_ISA(isa)
    {
        poison(scores, 6);
        ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, scores), KERN_OK);
        ck_assert(isinf(scores[1]) && scores[1] < 0);
        ck_assert(isinf(scores[4]) && scores[4] < 0);
        ck_assert(scores[3] == 0.0f && scores[5] == 0.0f);
        double bound;
        double ref = ref_maxsim(q.val, qm, lq, d.val, dm, ld, dim, &bound);
        assert_close(scores[0], ref, bound, isa, 0, 0);
        ref = ref_maxsim(q.val, qm, lq, d.val + 2 * ld * dim, dm + 2 * ld, ld, dim, &bound);
        assert_close(scores[2], ref, bound, isa, 0, 2);
    }
    emb_free(&q);
    emb_free(&d);
}
END_TEST

START_TEST(test_kernels_dense_duplicate_maxima)
{
    /* Repeated document tokens (equal maxima) and repeated query tokens: each query token
     * still counts once, whichever copy wins. */
    rng_init();
    size_t dim = 128, lq = 6, ld = 12;
    emb q, d;
    emb_rand(&q, KERN_F32, lq, dim);
    emb_rand(&d, KERN_F32, ld, dim);
    for (size_t t = 1; t < ld; t += 2)
        emb_copy_row(&d, t, t - 1);
    emb_copy_row(&q, 3, 1);
    emb_copy_row(&q, 4, 1);
    /* Query token 5 is document token 7 itself, which also appears as token 6. */
    memcpy((float *)q.raw + 5 * dim, d.val + 7 * dim, dim * sizeof(float));
    memcpy(q.val + 5 * dim, d.val + 7 * dim, dim * sizeof(float));
    float s;
    kern_dense a = {KERN_F32, dim, q.raw, NULL, 1, lq, d.raw, NULL, 1, ld};
    FOR_EACH_ISA(isa)
    {
        s = NAN;
        ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, &s), KERN_OK);
        double bound;
        double ref = ref_maxsim(q.val, NULL, lq, d.val, NULL, ld, dim, &bound);
        assert_close(s, ref, bound, isa, 0, 0);
    }
    emb_free(&q);
    emb_free(&d);
}
END_TEST

START_TEST(test_kernels_dense_no_product_memory)
{
    /*
     * One query of 16384 tokens against one document of 16384 tokens: the token x token table
     * would take 1 GiB. With the address space capped a few hundred MiB above what the
     * process already maps, the call must still succeed.
     */
    rng_init();
    size_t dim = 16, l = 16384;
    emb q, d;
    emb_rand(&q, KERN_BF16, l, dim);
    emb_rand(&d, KERN_BF16, l, dim);
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long pages = 0;
        ck_assert_int_eq(fscanf(f, "%lu", &pages), 1);
        fclose(f);
        struct rlimit rl = {pages * (unsigned long)sysconf(_SC_PAGESIZE) + (600ul << 20),
                            RLIM_INFINITY};
        rl.rlim_max = rl.rlim_cur;
        ck_assert_int_eq(setrlimit(RLIMIT_AS, &rl), 0);
    }
    float s = NAN;
    kern_dense a = {KERN_BF16, dim, q.raw, NULL, 1, l, d.raw, NULL, 1, l};
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, &s), KERN_OK);
    ck_assert(isfinite(s));
    /* The full reference takes too long: check the first 256 query tokens' call instead. */
    double ref = 0.0, bound_all = 0.0;
    for (size_t i = 0; i < 256; i++) {
        double bound;
        ref += ref_maxsim(q.val + i * dim, NULL, 1, d.val, NULL, l, dim, &bound);
        bound_all += bound;
    }
    a.lq = 256;
    s = NAN;
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, &s), KERN_OK);
    assert_close(s, ref, bound_all, "prefix", 0, 0);
    emb_free(&q);
    emb_free(&d);
}
END_TEST

/* ---- varlen MaxSim ---------------------------------------------------------------------- */

/* Random ragged lengths, a fifth of them 0 or 1 tokens. */
static int64_t *ragged_offsets(size_t n, size_t maxlen)
{
    int64_t *off = xcalloc(n + 1, sizeof *off);
    for (size_t i = 0; i < n; i++) {
        size_t r = rnd() % 10, len = r == 0 ? 0 : r == 1 ? 1 : urnd(2, maxlen);
        off[i + 1] = off[i] + (int64_t)len;
    }
    return off;
}

static void check_varlen(kern_dtype t, size_t dim, size_t nq, size_t maxq, size_t nd, size_t maxd)
{
    int64_t *qo = ragged_offsets(nq, maxq), *doff = ragged_offsets(nd, maxd);
    emb q, d;
    emb_rand(&q, t, (size_t)qo[nq], dim);
    emb_rand(&d, t, (size_t)doff[nd], dim);
    float *scores = xcalloc(nq * nd, sizeof(float));
    kern_varlen a = {t, dim, q.raw, qo, nq, d.raw, doff, nd};
    FOR_EACH_ISA(isa)
    {
        poison(scores, nq * nd);
        ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &a, scores), KERN_OK);
        for (size_t i = 0; i < nq; i++)
            for (size_t n = 0; n < nd; n++) {
                double bound;
                size_t lq = (size_t)(qo[i + 1] - qo[i]), ld = (size_t)(doff[n + 1] - doff[n]);
                double ref = ref_maxsim(q.val + qo[i] * dim, NULL, lq, d.val + doff[n] * dim, NULL,
                                        ld, dim, &bound);
                assert_close(scores[i * nd + n], ref, bound, isa, i, n);
                if (ld == 0)
                    ck_assert(isinf(scores[i * nd + n]));
                else if (lq == 0)
                    ck_assert(scores[i * nd + n] == 0.0f);
            }
    }
    kern_cpu_force_isa(NULL);
    emb_free(&q);
    emb_free(&d);
    free(qo);
    free(doff);
    free(scores);
}

START_TEST(test_kernels_varlen_ragged)
{
    rng_init();
    check_varlen(KERN_F32, 128, 1, 32, 40, 60);
    check_varlen(KERN_F32, 96, 3, 40, 25, 30);
}
END_TEST

START_TEST(test_kernels_varlen_dtypes)
{
    rng_init();
    check_varlen(KERN_F16, 128, 2, 32, 20, 40);
    check_varlen(KERN_BF16, 256, 2, 20, 15, 40);
    check_varlen(KERN_E4M3, 128, 3, 32, 20, 40);
    check_varlen(KERN_E4M3, 17, 2, 9, 11, 30); /* rows at odd addresses */
}
END_TEST

START_TEST(test_kernels_varlen_one_token_docs)
{
    /* Every document a single token: MaxSim is then the sum of plain dot products. */
    rng_init();
    size_t dim = 64, nd = 23, lq = 9;
    emb q, d;
    emb_rand(&q, KERN_F32, lq, dim);
    emb_rand(&d, KERN_F32, nd, dim);
    int64_t qo[2] = {0, (int64_t)lq}, doff[24];
    for (size_t n = 0; n <= nd; n++)
        doff[n] = (int64_t)n;
    float scores[23];
    kern_varlen a = {KERN_F32, dim, q.raw, qo, 1, d.raw, doff, nd};
    FOR_EACH_ISA(isa)
    {
        poison(scores, nd);
        ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &a, scores), KERN_OK);
        for (size_t n = 0; n < nd; n++) {
            double s = 0.0, b = 0.0;
            for (size_t i = 0; i < lq; i++)
                for (size_t k = 0; k < dim; k++) {
                    s += (double)q.val[i * dim + k] * d.val[n * dim + k];
                    b += fabs((double)q.val[i * dim + k] * d.val[n * dim + k]);
                }
            assert_close(scores[n], s, b, isa, 0, n);
        }
    }
    emb_free(&q);
    emb_free(&d);
}
END_TEST

START_TEST(test_kernels_varlen_equals_dense)
{
    /* Equal lengths: varlen and dense read the same rows and must agree exactly. */
    rng_init();
    size_t dim = 128, nq = 2, lq = 32, nd = 9, ld = 17;
    emb q, d;
    emb_rand(&q, KERN_BF16, nq * lq, dim);
    emb_rand(&d, KERN_BF16, nd * ld, dim);
    int64_t qo[3] = {0, 32, 64}, doff[10];
    for (size_t n = 0; n <= nd; n++)
        doff[n] = (int64_t)(n * ld);
    float s1[18], s2[18];
    poison(s1, 18);
    poison(s2, 18);
    kern_dense a = {KERN_BF16, dim, q.raw, NULL, nq, lq, d.raw, NULL, nd, ld};
    kern_varlen b = {KERN_BF16, dim, q.raw, qo, nq, d.raw, doff, nd};
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s1), KERN_OK);
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &b, s2), KERN_OK);
    for (size_t i = 0; i < 18; i++)
        ck_assert(s1[i] == s2[i]);
    emb_free(&q);
    emb_free(&d);
}
END_TEST

START_TEST(test_kernels_varlen_bad_offsets)
{
    float q[4] = {1, 2, 3, 4}, d[8] = {0}, s[4];
    int64_t qo[2] = {0, 1}, bad1[3] = {0, 2, 1}, bad2[3] = {1, 1, 2}, good[3] = {0, 1, 2};
    kern_varlen a = {KERN_F32, 4, q, qo, 1, d, bad1, 2};
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    ck_assert_ptr_nonnull(strstr(kern_last_error(), "decrease"));
    a.d_off = bad2;
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.d_off = good;
    a.q_off = bad2;
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.q_off = qo;
    poison(s, 2);
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &a, s), KERN_OK);
    ck_assert(s[0] == 0.0f && s[1] == 0.0f);
}
END_TEST

/* ---- 16-bit conversions ------------------------------------------------------------------ */

static uint16_t f16_bits(_Float16 h)
{
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

START_TEST(test_kernels_f16_exhaustive)
{
    /* Every half against the compiler's _Float16, both ways, and the vector converters. */
    uint16_t *all = xcalloc(65536, 2);
    float *vec = xcalloc(65536, sizeof(float));
    for (uint32_t u = 0; u < 65536; u++) {
        all[u] = (uint16_t)u;
        _Float16 h;
        memcpy(&h, &all[u], 2);
        float want = (float)h, got = kern_f16_to_f32((uint16_t)u);
        if (isnan(want)) {
            ck_assert(isnan(got));
            ck_assert(isnan(kern_f16_to_f32(kern_f32_to_f16(got))));
        } else {
            ck_assert_msg(memcmp(&want, &got, 4) == 0, "half %04x: %g != %g", u, got, want);
            ck_assert_uint_eq(kern_f32_to_f16(got), u);
        }
    }
    FOR_EACH_ISA(isa)
    {
        poison(vec, 65536);
        kern_mk_active()->f16(all, vec, 65536);
        for (uint32_t u = 0; u < 65536; u++) {
            float want = kern_f16_to_f32((uint16_t)u);
            ck_assert(isnan(want) ? isnan(vec[u]) : memcmp(&want, &vec[u], 4) == 0);
        }
    }
    /* Rounding: random floats of every magnitude, and the midpoints between halves. */
    rng_init();
    for (int i = 0; i < 200000; i++) {
        uint32_t b = (uint32_t)rnd();
        float f;
        memcpy(&f, &b, 4);
        if (isnan(f))
            continue;
        ck_assert_msg(kern_f32_to_f16(f) == f16_bits((_Float16)f), "float %a", f);
    }
    for (uint32_t u = 0; u < 0x7bff; u++) {
        float lo = kern_f16_to_f32((uint16_t)u), hi = kern_f16_to_f32((uint16_t)(u + 1));
        float mid = (float)(((double)lo + hi) / 2); /* exact: halves have few bits */
        ck_assert_uint_eq(kern_f32_to_f16(mid), f16_bits((_Float16)mid));
        ck_assert_uint_eq(kern_f32_to_f16(-mid), f16_bits((_Float16)-mid));
    }
    free(all);
    free(vec);
}
END_TEST

/* e4m3 from its definition: (-1)^s * (e ? 1 + m / 8 : m / 8) * 2^(max(e, 1) - 7), NaN at
 * e = 15, m = 7. */
static double ref_e4m3(unsigned c)
{
    unsigned e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = (e ? 1.0 + m / 8.0 : m / 8.0) * ldexp(1.0, (e ? (int)e : 1) - 7);
    return (c & 0x80) ? -v : v;
}

/* The e4m3 code nearest to f (ties to the even code, which is the even mantissa), saturating
 * at +-448, by search over every finite code. */
static unsigned ref_to_e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    double a = fabs((double)f);
    unsigned best = 0;
    for (unsigned c = 1; c < 0x7f; c++) {
        double eb = fabs(a - ref_e4m3(best)), ec = fabs(a - ref_e4m3(c));
        if (ec < eb || (ec == eb && (c & 1) == 0 && (best & 1)))
            best = c;
    }
    return (signbit(f) ? 0x80u : 0u) | best;
}

START_TEST(test_kernels_e4m3_conversions)
{
    /* Every code decodes to its definition's value and encodes back to itself. */
    for (unsigned c = 0; c < 256; c++) {
        double want = ref_e4m3(c);
        float got = kern_e4m3_to_f32((uint8_t)c);
        if (isnan(want)) {
            ck_assert(isnan(got));
            ck_assert_uint_eq(kern_f32_to_e4m3(got), 0x7f);
            continue;
        }
        ck_assert_msg((double)got == want && !!signbit(got) == ((c & 0x80) != 0), "code %02x", c);
        ck_assert_uint_eq(kern_f32_to_e4m3(got), c);
    }
    /* Rounding: the midpoints between neighbours (ties), their float neighbours, random floats
     * of the magnitudes that matter and beyond (saturation, subnormals, zeros). */
    for (unsigned c = 0; c < 0x7e; c++) {
        float mid = (float)((ref_e4m3(c) + ref_e4m3(c + 1)) / 2); /* exact in fp32 */
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, 1000.0f)};
        for (int k = 0; k < 3; k++) {
            ck_assert_msg(kern_f32_to_e4m3(probes[k]) == ref_to_e4m3(probes[k]), "%a", probes[k]);
            ck_assert_msg(kern_f32_to_e4m3(-probes[k]) == ref_to_e4m3(-probes[k]), "%a",
                          -probes[k]);
        }
    }
    rng_init();
    for (int i = 0; i < 20000; i++) {
        float f = (float)ldexp(frnd(), (int)urnd(0, 30) - 16);
        ck_assert_msg(kern_f32_to_e4m3(f) == ref_to_e4m3(f), "float %a", f);
    }
    ck_assert_uint_eq(kern_f32_to_e4m3(INFINITY), 0x7e);
    ck_assert_uint_eq(kern_f32_to_e4m3(-1e30f), 0xfe);
    ck_assert_uint_eq(kern_f32_to_e4m3(NAN), 0x7f);
    ck_assert_uint_eq(kern_f32_to_e4m3(1e-30f), 0x00);
    ck_assert_uint_eq(kern_dtype_size(KERN_E4M3), 1);
}
END_TEST

/* bf16 rounding reference in double: the nearer of the two bf16 neighbours, ties to even. */
static uint16_t ref_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dlo = kern_bf16_to_f32(lo), dhi = kern_bf16_to_f32(hi);
    if (isinf(dhi) && !isinf(dlo)) /* the neighbour past the largest finite value */
        dhi = ldexp(copysign(1.0, f), 128);
    double el = fabs((double)f - dlo), eh = fabs((double)f - dhi);
    if (el < eh)
        return lo;
    if (eh < el)
        return hi;
    return (lo & 1) ? hi : lo;
}

START_TEST(test_kernels_bf16_rounding)
{
    rng_init();
    for (int i = 0; i < 500000; i++) {
        uint32_t b = (uint32_t)rnd();
        if (i % 4 == 0) /* force an exact tie between neighbours */
            b = (b & 0xffff0000u) | 0x8000u;
        float f;
        memcpy(&f, &b, 4);
        if (isnan(f) || isinf(f))
            continue;
        uint16_t got = kern_f32_to_bf16(f);
        ck_assert_msg(got == ref_bf16(f), "float %a: %04x != %04x", f, got, ref_bf16(f));
        /* bf16 -> f32 is exact: the top half of the float's bits. */
        float back = kern_bf16_to_f32(got);
        uint32_t bb;
        memcpy(&bb, &back, 4);
        ck_assert_uint_eq(bb, (uint32_t)got << 16);
    }
    ck_assert(isnan(kern_bf16_to_f32(kern_f32_to_bf16(NAN))));
    uint16_t *all = xcalloc(65536, 2);
    float *vec = xcalloc(65536, sizeof(float));
    for (uint32_t u = 0; u < 65536; u++)
        all[u] = (uint16_t)u;
    FOR_EACH_ISA(isa)
    {
        poison(vec, 65536);
        kern_mk_active()->bf16(all, vec, 65536);
        for (uint32_t u = 0; u < 65536; u++) {
            float want = kern_bf16_to_f32((uint16_t)u);
            ck_assert(memcmp(&want, &vec[u], 4) == 0);
        }
    }
    free(all);
    free(vec);
}
END_TEST

/* ---- centroid scores ------------------------------------------------------------------- */

START_TEST(test_kernels_centroid_scores)
{
    rng_init();
    static const size_t shapes[][3] = {{32, 1000, 128}, {1, 37, 64}, {45, 513, 96}, {3, 5, 1024}};
    for (size_t s = 0; s < 4; s++) {
        size_t lq = shapes[s][0], K = shapes[s][1], dim = shapes[s][2];
        emb q, c;
        emb_rand(&q, KERN_F32, lq, dim);
        emb_rand(&c, KERN_F32, K, dim);
        float *S = xcalloc(lq * K, sizeof(float));
        FOR_EACH_ISA(isa)
        {
            poison(S, lq * K);
            ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q.val, lq, c.val, K, dim, S),
                             KERN_OK);
            for (size_t i = 0; i < lq; i++)
                for (size_t k = 0; k < K; k++) {
                    double dot = 0.0, b = 0.0;
                    for (size_t j = 0; j < dim; j++) {
                        dot += (double)q.val[i * dim + j] * c.val[k * dim + j];
                        b += fabs((double)q.val[i * dim + j] * c.val[k * dim + j]);
                    }
                    assert_close(S[i * K + k], dot, b, isa, i, k);
                }
        }
        kern_cpu_force_isa(NULL);
        emb_free(&q);
        emb_free(&c);
        free(S);
    }
}
END_TEST

/* ---- residual-fused PLAID scoring ------------------------------------------------------- */

/*
 * The reference packer, written from the spec: each dim's bucket as nbits bits, least
 * significant first, dims in order; the bit stream into bytes, most significant bit first.
 */
static void ref_pack(const uint8_t *buckets, size_t dim, unsigned nbits, uint8_t *out)
{
    memset(out, 0, dim * nbits / 8);
    size_t bit = 0;
    for (size_t j = 0; j < dim; j++)
        for (unsigned u = 0; u < nbits; u++, bit++)
            if ((buckets[j] >> u) & 1)
                out[bit / 8] |= (uint8_t)(0x80u >> (bit % 8));
}

/* A PLAID corpus: centroids, codebook weights, documents decompressed in double. */
typedef struct plaid {
    size_t dim, K, nd;
    unsigned nbits, code_bytes;
    float *C, w[256];
    int64_t *off;
    void *codes;
    uint8_t *buckets, *packed;
    float *inv;
    double *dec; /* decompressed, normalised tokens [T, dim] */
    kern_pdoc *docs;
} plaid;

static void plaid_make(plaid *p, size_t dim, size_t K, size_t nd, size_t maxlen, unsigned nbits,
                       unsigned code_bytes)
{
    memset(p, 0, sizeof *p);
    p->dim = dim;
    p->K = K;
    p->nd = nd;
    p->nbits = nbits;
    p->code_bytes = code_bytes;
    p->C = xcalloc(K * dim, sizeof(float));
    for (size_t i = 0; i < K * dim; i++)
        p->C[i] = frnd() * 0.2f;
    unsigned B = 1u << nbits;
    for (unsigned b = 0; b < B; b++) /* ascending, like trained quantiles */
        p->w[b] = -0.1f + 0.2f * ((float)b + 0.5f) / (float)B + 0.01f * frnd() / (float)B;
    p->off = ragged_offsets(nd, maxlen);
    size_t T = (size_t)p->off[nd], tb = dim * nbits / 8;
    p->codes = xcalloc(T, code_bytes);
    p->buckets = xcalloc(T * dim, 1);
    p->packed = xcalloc(T * tb, 1);
    p->inv = xcalloc(T, sizeof(float));
    p->dec = xcalloc(T * dim, sizeof(double));
    p->docs = xcalloc(nd, sizeof(kern_pdoc));
    for (size_t t = 0; t < T; t++) {
        uint32_t code = (uint32_t)(rnd() % K);
        if (code_bytes == 2)
            ((uint16_t *)p->codes)[t] = (uint16_t)code;
        else
            ((uint32_t *)p->codes)[t] = code;
        double nrm = 0.0;
        for (size_t j = 0; j < dim; j++) {
            p->buckets[t * dim + j] = (uint8_t)(rnd() % B);
            double v = (double)p->C[code * dim + j] + p->w[p->buckets[t * dim + j]];
            p->dec[t * dim + j] = v;
            nrm += v * v;
        }
        p->inv[t] = (float)(1.0 / sqrt(nrm));
        for (size_t j = 0; j < dim; j++)
            p->dec[t * dim + j] /= sqrt(nrm);
        ref_pack(p->buckets + t * dim, dim, nbits, p->packed + t * tb);
    }
    for (size_t n = 0; n < nd; n++) {
        size_t f = (size_t)p->off[n];
        p->docs[n] = (kern_pdoc){(const char *)p->codes + f * code_bytes, p->packed + f * tb,
                                 p->inv + f, (uint32_t)(p->off[n + 1] - p->off[n])};
    }
}

static void plaid_free(plaid *p)
{
    free(p->C);
    free(p->off);
    free(p->codes);
    free(p->buckets);
    free(p->packed);
    free(p->inv);
    free(p->dec);
    free(p->docs);
}

/* MaxSim in double of q [lq, dim] against the decompressed document n. */
static double plaid_ref(const plaid *p, const float *q, size_t lq, size_t n, double *bound)
{
    size_t f = (size_t)p->off[n], ld = (size_t)(p->off[n + 1] - p->off[n]), dim = p->dim;
    *bound = 0.0;
    if (ld == 0)
        return -INFINITY;
    double s = 0.0;
    for (size_t i = 0; i < lq; i++) {
        double mx = -INFINITY, mb = 0.0;
        for (size_t t = f; t < f + ld; t++) {
            double dot = 0.0, ab = 0.0;
            for (size_t j = 0; j < dim; j++) {
                dot += q[i * dim + j] * p->dec[t * dim + j];
                ab += fabs(q[i * dim + j] * p->dec[t * dim + j]);
            }
            mx = dot > mx ? dot : mx;
            mb = ab > mb ? ab : mb;
        }
        s += mx;
        *bound += mb;
    }
    return s;
}

static void check_residual(size_t dim, size_t K, size_t nd, size_t maxlen, size_t lq,
                           unsigned nbits, unsigned code_bytes)
{
    plaid p;
    plaid_make(&p, dim, K, nd, maxlen, nbits, code_bytes);
    emb q;
    emb_rand(&q, KERN_F32, lq, dim);
    float *qc = xcalloc(lq * K, sizeof(float)), *scores = xcalloc(nd, sizeof(float));
    ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q.val, lq, p.C, K, dim, qc), KERN_OK);
    kern_residual a = {dim, nbits, code_bytes, q.val, lq, qc, K, p.w, p.docs, nd};
    FOR_EACH_ISA(isa)
    {
        poison(scores, nd);
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, scores), KERN_OK);
        for (size_t n = 0; n < nd; n++) {
            double bound, ref = plaid_ref(&p, q.val, lq, n, &bound);
            /* Inverse norms are stored in fp32: allow their rounding too. */
            assert_close(scores[n], ref, bound * 2.0, isa, nbits, n);
        }
    }
    kern_cpu_force_isa(NULL);
    emb_free(&q);
    free(qc);
    free(scores);
    plaid_free(&p);
}

START_TEST(test_kernels_residual_bit_order)
{
    /*
     * dim 8, nbits 2, buckets 0 1 2 3 3 2 1 0. LSB first per dim gives the bit stream
     * 00 10 01 11 | 11 01 10 00, packed MSB first: 0x27 0xd8. With nbits 1 and buckets
     * 1 0 0 0 0 0 1 1 the stream is the byte 0x83.
     */
    const uint8_t b2[8] = {0, 1, 2, 3, 3, 2, 1, 0}, b1[8] = {1, 0, 0, 0, 0, 0, 1, 1};
    uint8_t out[2];
    ref_pack(b2, 8, 2, out);
    ck_assert_uint_eq(out[0], 0x27);
    ck_assert_uint_eq(out[1], 0xd8);
    ref_pack(b1, 8, 1, out);
    ck_assert_uint_eq(out[0], 0x83);

    /* The kernel on those bytes: centroid 0 is zero, so <q, d> = (q . w[b]) * inv_norm. With
     * q = e_j the score picks out w[bucket_j] * inv_norm: each dim's bucket, read back. */
    float w[4] = {1.0f, 10.0f, 100.0f, 1000.0f}, C[8] = {0}, q[64] = {0}, qc[8] = {0};
    for (int j = 0; j < 8; j++)
        q[j * 8 + j] = 1.0f;
    const uint8_t packed2[2] = {0x27, 0xd8}, packed1[1] = {0x83};
    uint16_t code = 0;
    float inv = 1.0f, s = NAN;
    kern_pdoc doc = {&code, packed2, &inv, 1};
    for (int j = 0; j < 8; j++) {
        kern_residual a = {8, 2, 2, q + j * 8, 1, qc, 1, w, &doc, 1};
        s = NAN;
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, &s), KERN_OK);
        ck_assert_msg(s == w[b2[j]], "nbits 2 dim %d: %g != %g", j, s, w[b2[j]]);
    }
    doc.residuals = packed1;
    for (int j = 0; j < 8; j++) {
        kern_residual a = {8, 1, 2, q + j * 8, 1, qc, 1, w, &doc, 1};
        s = NAN;
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, &s), KERN_OK);
        ck_assert_msg(s == w[b1[j]], "nbits 1 dim %d: %g != %g", j, s, w[b1[j]]);
    }
    (void)C;
}
END_TEST

START_TEST(test_kernels_residual_nbits)
{
    rng_init();
    static const unsigned nb[] = {1, 2, 4, 8};
    for (size_t i = 0; i < 4; i++) {
        check_residual(128, 64, 20, 40, 32, nb[i], 2);
        check_residual(64, 300, 12, 30, 7, nb[i], 4);
    }
}
END_TEST

START_TEST(test_kernels_residual_strided_table)
{
    /* Few tokens, many centroids: the kernel reads the score table without transposing. */
    rng_init();
    check_residual(96, 5000, 6, 20, 32, 2, 2);
    check_residual(128, 70000, 3, 10, 5, 4, 4);
}
END_TEST

START_TEST(test_kernels_residual_long_docs)
{
    /* Documents longer than one chunk, and more query tokens than one panel. */
    rng_init();
    check_residual(128, 32, 3, 900, 40, 2, 2);
}
END_TEST

START_TEST(test_kernels_residual_unaligned)
{
    /* Codes and inverse norms read from memory aligned to 2 bytes only (as in LMDB's map)
     * give the same scores as aligned copies. */
    rng_init();
    plaid p;
    size_t dim = 64, K = 50, nd = 9, lq = 8;
    plaid_make(&p, dim, K, nd, 30, 2, 4);
    size_t T = (size_t)p.off[nd];
    char *cbuf = xcalloc(T * 4 + 8, 1), *ibuf = xcalloc(T * 4 + 8, 1);
    memcpy(cbuf + 2, p.codes, T * 4);
    memcpy(ibuf + 2, p.inv, T * 4);
    kern_pdoc *ud = xcalloc(nd, sizeof *ud);
    for (size_t n = 0; n < nd; n++) {
        ud[n] = p.docs[n];
        ud[n].codes = cbuf + 2 + 4 * p.off[n];
        ud[n].inv_norms = (const float *)(ibuf + 2 + 4 * p.off[n]);
    }
    emb q;
    emb_rand(&q, KERN_F32, lq, dim);
    float *qc = xcalloc(lq * K, sizeof(float)), s1[9], s2[9], a1[9], a2[9];
    ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q.val, lq, p.C, K, dim, qc), KERN_OK);
    kern_residual a = {dim, 2, 4, q.val, lq, qc, K, p.w, p.docs, nd};
    poison(s1, nd);
    poison(s2, nd);
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s1), KERN_OK);
    a.docs = ud;
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s2), KERN_OK);
    poison(a1, nd);
    poison(a2, nd);
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, qc, lq, K, 4, p.docs, nd, NULL, a1),
                     KERN_OK);
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, qc, lq, K, 4, ud, nd, NULL, a2),
                     KERN_OK);
    for (size_t n = 0; n < nd; n++) {
        ck_assert(memcmp(&s1[n], &s2[n], 4) == 0 && !isnan(s1[n]));
        ck_assert(memcmp(&a1[n], &a2[n], 4) == 0 && !isnan(a1[n]));
    }
    emb_free(&q);
    free(qc);
    free(ud);
    free(cbuf);
    free(ibuf);
    plaid_free(&p);
}
END_TEST

START_TEST(test_kernels_residual_bad_input)
{
    float w[4] = {0}, q[8] = {0}, qc[2] = {0}, inv[2] = {1, 1}, s[2];
    uint16_t codes[2] = {0, 2};
    uint8_t res[4] = {0};
    kern_pdoc doc = {codes, res, inv, 2};
    kern_residual a = {8, 2, 2, q, 1, qc, 2, w, &doc, 1};
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL); /* code 2 >= K */
    ck_assert_ptr_nonnull(strstr(kern_last_error(), "code"));
    codes[1] = 1;
    poison(s, 1);
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_OK);
    ck_assert(!isnan(s[0]));
    a.nbits = 3;
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.nbits = 1;
    a.dim = 12; /* 12 bits: not whole bytes */
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.dim = 8;
    a.code_bytes = 3;
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.code_bytes = 2;
    doc.residuals = NULL;
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    doc.ntok = 0; /* an empty document needs no arrays and scores -inf */
    poison(s, 1);
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_OK);
    ck_assert(isinf(s[0]) && s[0] < 0);
}
END_TEST

/* ---- centroid interaction ------------------------------------------------------------------ */

static void check_interaction(size_t K, size_t nd, size_t maxlen, size_t lq, unsigned cb,
                              double keep_p)
{
    plaid p;
    plaid_make(&p, 8, K, nd, maxlen, 8, cb);
    float *S = xcalloc(lq * K, sizeof(float)), *approx = xcalloc(nd, sizeof(float));
    for (size_t i = 0; i < lq * K; i++)
        S[i] = frnd();
    uint8_t *keep = keep_p < 1.0 ? mask_rand(K, keep_p) : NULL;
    for (size_t n = 0; n < nd; n++)
        p.docs[n].residuals = NULL, p.docs[n].inv_norms = NULL; /* codes only */
    poison(approx, nd);
    ck_assert_int_eq(
        kern_centroid_interaction(KERN_DEV_CPU, S, lq, K, cb, p.docs, nd, keep, approx), KERN_OK);
    for (size_t n = 0; n < nd; n++) {
        double s = 0.0;
        size_t kept = 0;
        for (size_t i = 0; i < lq; i++) {
            double mx = -INFINITY;
            for (int64_t t = p.off[n]; t < p.off[n + 1]; t++) {
                uint32_t c = cb == 2 ? ((uint16_t *)p.codes)[t] : ((uint32_t *)p.codes)[t];
                if (keep && !keep[c])
                    continue;
                kept += i == 0;
                mx = S[i * K + c] > mx ? S[i * K + c] : mx;
            }
            s += mx;
        }
        if (!kept)
            ck_assert_msg(isinf(approx[n]) && approx[n] < 0, "doc %zu: %g", n, approx[n]);
        else
            ck_assert_msg(fabs(approx[n] - s) <= 1e-5 * lq, "doc %zu: %g != %g (seed %llu)", n,
                          approx[n], s, (unsigned long long)seed);
    }
    free(S);
    free(approx);
    free(keep);
    plaid_free(&p);
}

START_TEST(test_kernels_interaction_all_kept)
{
    rng_init();
    check_interaction(256, 50, 40, 32, 2, 1.0);
    check_interaction(100000, 5, 8, 3, 4, 1.0); /* strided table reads */
}
END_TEST

START_TEST(test_kernels_interaction_keep_mask)
{
    rng_init();
    check_interaction(64, 60, 12, 32, 2, 0.3);
    check_interaction(50000, 8, 10, 9, 4, 0.5);
    check_interaction(16, 40, 3, 5, 2, 0.1); /* many documents with no kept token */
}
END_TEST

START_TEST(test_kernels_interaction_bad_code)
{
    float S[4] = {1, 2, 3, 4}, approx[1];
    uint32_t codes[2] = {1, 4};
    kern_pdoc doc = {codes, NULL, NULL, 2};
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, S, 1, 4, 4, &doc, 1, NULL, approx),
                     KERN_EINVAL);
    codes[1] = 3;
    approx[0] = NAN;
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, S, 1, 4, 4, &doc, 1, NULL, approx),
                     KERN_OK);
    ck_assert(approx[0] == 4.0f);
}
END_TEST

/* ---- top-k ------------------------------------------------------------------------------- */

typedef struct pair {
    float v;
    int64_t i;
} pair;

static int pair_cmp(const void *a, const void *b)
{
    const pair *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Scores with many ties, some -inf and NaN. */
static void tie_scores(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t r = rnd() % 20;
        x[i] = r == 0 ? -INFINITY : r == 1 ? NAN : (float)(rnd() % 50) - 20.0f;
    }
}

/* The reference: eligible entries sorted best first; returns their count. */
static size_t ref_topk(const float *x, const int64_t *ids, size_t n, pair *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(x[i]) && x[i] != -INFINITY)
            out[m++] = (pair){x[i], ids ? ids[i] : (int64_t)i};
    qsort(out, m, sizeof *out, pair_cmp);
    return m;
}

START_TEST(test_kernels_topk_rows)
{
    rng_init();
    static const size_t shapes[][3] = {{5, 1000, 10}, {3, 17, 40}, {1, 100000, 100}, {8, 50, 1}};
    for (size_t s = 0; s < 4; s++) {
        size_t rows = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *x = xcalloc(rows * n, sizeof(float)), *val = xcalloc(rows * k, sizeof(float));
        int64_t *idx = xcalloc(rows * k, sizeof(int64_t));
        pair *ref = xcalloc(n, sizeof(pair));
        tie_scores(x, rows * n);
        poison(val, rows * k);
        for (size_t i = 0; i < rows * k; i++)
            idx[i] = -7;
        ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, x, rows, n, k, idx, val), KERN_OK);
        for (size_t r = 0; r < rows; r++) {
            size_t m = ref_topk(x + r * n, NULL, n, ref);
            for (size_t j = 0; j < k; j++) {
                if (j < m) {
                    ck_assert_int_eq(idx[r * k + j], ref[j].i);
                    ck_assert(val[r * k + j] == ref[j].v);
                } else { /* k larger than the eligible count */
                    ck_assert_int_eq(idx[r * k + j], -1);
                    ck_assert(isinf(val[r * k + j]) && val[r * k + j] < 0);
                }
            }
        }
        free(x);
        free(val);
        free(idx);
        free(ref);
    }
}
END_TEST

START_TEST(test_kernels_topk_stream_chunks)
{
    /* Many chunks of random sizes against one full sort; ids continue across chunks. */
    rng_init();
    size_t n = 200000, k = 1000;
    float *x = xcalloc(n, sizeof(float)), *val = xcalloc(k, sizeof(float));
    int64_t *idx = xcalloc(k, sizeof(int64_t));
    pair *ref = xcalloc(n, sizeof(pair));
    tie_scores(x, n);
    kern_topk *t = kern_topk_new(k);
    ck_assert_ptr_nonnull(t);
    for (size_t i = 0; i < n;) {
        size_t c = urnd(0, 5000);
        c = c > n - i ? n - i : c;
        ck_assert_int_eq(kern_topk_push(t, x + i, NULL, c), KERN_OK);
        i += c;
    }
    poison(val, k);
    size_t got = kern_topk_take(t, idx, val);
    size_t m = ref_topk(x, NULL, n, ref);
    ck_assert_uint_eq(got, m < k ? m : k);
    for (size_t j = 0; j < got; j++) {
        ck_assert_int_eq(idx[j], ref[j].i);
        ck_assert(val[j] == ref[j].v);
    }
    /* take leaves the state usable: push more, take again. */
    float more[3] = {1000.0f, -INFINITY, 1000.0f};
    ck_assert_int_eq(kern_topk_push(t, more, NULL, 3), KERN_OK);
    ck_assert_uint_eq(kern_topk_take(t, idx, val), k);
    ck_assert_int_eq(idx[0], (int64_t)n);
    ck_assert_int_eq(idx[1], (int64_t)n + 2);
    ck_assert_int_eq(idx[2], ref[0].i);
    kern_topk_free(t);
    free(x);
    free(val);
    free(idx);
    free(ref);
}
END_TEST

START_TEST(test_kernels_topk_stream_ids)
{
    /* Explicit ids, ties to the lower id whatever the push order; k above the count. */
    rng_init();
    size_t n = 3000, k = 5000;
    float *x = xcalloc(n, sizeof(float)), *val = xcalloc(k, sizeof(float));
    int64_t *ids = xcalloc(n, sizeof(int64_t)), *idx = xcalloc(k, sizeof(int64_t));
    pair *ref = xcalloc(n, sizeof(pair));
    tie_scores(x, n);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int64_t)((n - i) * 7); /* descending: later pushes hold lower ids */
    kern_topk *t = kern_topk_new(k);
    ck_assert_ptr_nonnull(t);
    for (size_t i = 0; i < n; i += 100)
        ck_assert_int_eq(kern_topk_push(t, x + i, ids + i, 100), KERN_OK);
    poison(val, k);
    size_t got = kern_topk_take(t, idx, val), m = ref_topk(x, ids, n, ref);
    ck_assert_uint_eq(got, m);
    for (size_t j = 0; j < got; j++) {
        ck_assert_int_eq(idx[j], ref[j].i);
        ck_assert(val[j] == ref[j].v);
        ck_assert(isfinite(val[j]));
    }
    /* Consecutive ids continue after the last explicit one. */
    float one = 1e9f;
    ck_assert_int_eq(kern_topk_push(t, &one, NULL, 1), KERN_OK);
    kern_topk_take(t, idx, val);
    ck_assert_int_eq(idx[0], ids[n - 1] + 1);
    kern_topk_free(t);
    free(x);
    free(val);
    free(ids);
    free(idx);
    free(ref);
}
END_TEST

START_TEST(test_kernels_topk_stream_edges)
{
    /* k = 0 takes nothing; only -inf and NaN: nothing; NULL state is harmless. */
    kern_topk *t = kern_topk_new(0);
    ck_assert_ptr_nonnull(t);
    float x[3] = {1, 2, 3};
    ck_assert_int_eq(kern_topk_push(t, x, NULL, 3), KERN_OK);
    ck_assert_uint_eq(kern_topk_take(t, NULL, NULL), 0);
    kern_topk_free(t);
    t = kern_topk_new(4);
    float bad[3] = {-INFINITY, NAN, -INFINITY};
    ck_assert_int_eq(kern_topk_push(t, bad, NULL, 3), KERN_OK);
    int64_t idx[4];
    float val[4];
    ck_assert_uint_eq(kern_topk_take(t, idx, val), 0);
    ck_assert_int_eq(kern_topk_push(t, NULL, NULL, 1), KERN_EINVAL);
    ck_assert_int_eq(kern_topk_push(NULL, x, NULL, 1), KERN_EINVAL);
    ck_assert_int_eq(kern_topk_push(t, NULL, NULL, 0), KERN_OK);
    kern_topk_free(t);
    kern_topk_free(NULL);
    ck_assert_uint_eq(kern_topk_take(NULL, idx, val), 0);
}
END_TEST

/* ---- dispatch --------------------------------------------------------------------------- */

START_TEST(test_kernels_dispatch_errors)
{
    float q[8] = {1, 0, 0, 0, 0, 1, 0, 0}, d[8] = {1, 1, 1, 1, 2, 2, 2, 2}, s[4];
    kern_dense a = {KERN_F32, 4, q, NULL, 2, 1, d, NULL, 2, 1};
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, NULL, s), KERN_EINVAL);
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, NULL), KERN_EINVAL);
    ck_assert_int_gt(strlen(kern_last_error()), 0);
    ck_assert_int_eq(kern_maxsim_dense((kern_dev)7, &a, s), KERN_EINVAL);
    a.dtype = (kern_dtype)9;
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.dtype = KERN_F32;
    a.dim = 0;
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.dim = 4;
    a.ld = 0;
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.ld = 1;
    a.d = NULL;
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.d = d;
    /* No queries or no documents: nothing to do, outputs untouched. */
    poison(s, 4);
    a.nq = 0;
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s), KERN_OK);
    ck_assert(isnan(s[0]));
    a.nq = 2;
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s), KERN_OK);
    ck_assert(s[0] == 1.0f && s[1] == 2.0f && s[2] == 1.0f && s[3] == 2.0f);

    int64_t off[2] = {0, 1};
    kern_varlen v = {KERN_F32, 4, q, NULL, 1, d, off, 1};
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &v, s), KERN_EINVAL);
    v.q_off = off;
    v.d = NULL;
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &v, s), KERN_EINVAL);
    ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q, 1, NULL, 2, 4, s), KERN_EINVAL);
    ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q, 1, d, 2, 0, s), KERN_EINVAL);
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, q, 1, 2, 3, NULL, 0, NULL, s),
                     KERN_EINVAL);
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, q, 1, 2, 2, NULL, 1, NULL, s),
                     KERN_EINVAL);
    int64_t idx[2];
    ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, q, 1, 8, 2, NULL, s), KERN_EINVAL);
    ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, q, 1, 8, 2, idx, s), KERN_OK);
    ck_assert_int_eq(idx[0], 0); /* q[0] = 1 and q[5] = 1: tie to the lower index */
    ck_assert_int_eq(idx[1], 5);
#ifndef TARTAN_HAVE_CUDA
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CUDA, &a, s), KERN_ENODEV);
    ck_assert_ptr_nonnull(strstr(kern_last_error(), "CUDA"));
    ck_assert_int_eq(kern_cuda_device_count(), 0);
#endif
}
END_TEST

START_TEST(test_kernels_isa_selection)
{
    /* The portable kernels always exist; unknown names are refused; NULL restores the best. */
    ck_assert(kern_cpu_has_isa("generic"));
    ck_assert_int_eq(kern_cpu_force_isa("generic"), KERN_OK);
    ck_assert_str_eq(kern_mk_active()->name, "generic");
    ck_assert_int_eq(kern_cpu_force_isa("sse9"), KERN_EINVAL);
    ck_assert_int_eq(kern_cpu_force_isa(NULL), KERN_OK);
    const char *best = kern_mk_active()->name;
    if (kern_cpu_has_isa("avx512bf16"))
        ck_assert_str_eq(best, "avx512bf16");
    else if (kern_cpu_has_isa("avx512"))
        ck_assert_str_eq(best, "avx512");
    else if (kern_cpu_has_isa("avx2"))
        ck_assert_str_eq(best, "avx2");
    else
        ck_assert_str_eq(best, "generic");
    ck_assert_uint_le(kern_mk_active()->J, KERN_MK_MAX_J);
    ck_assert_uint_le(kern_mk_active()->P, KERN_MK_MAX_P);
}
END_TEST

START_TEST(test_kernels_threads_agree)
{
    /* One thread and all threads give identical scores (work splits never change sums). */
    rng_init();
    size_t dim = 128, nq = 3, lq = 32, nd = 50, ld = 40;
    emb q, d;
    emb_rand(&q, KERN_F32, nq * lq, dim);
    emb_rand(&d, KERN_F32, nd * ld, dim);
    float *s1 = xcalloc(nq * nd, 4), *s2 = xcalloc(nq * nd, 4);
    poison(s1, nq * nd);
    poison(s2, nq * nd);
    kern_dense a = {KERN_F32, dim, q.raw, NULL, nq, lq, d.raw, NULL, nd, ld};
    kern_set_threads(1);
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s1), KERN_OK);
    kern_set_threads(4);
    ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CPU, &a, s2), KERN_OK);
    ck_assert_int_eq(memcmp(s1, s2, nq * nd * 4), 0);
    emb_free(&q);
    emb_free(&d);
    free(s1);
    free(s2);
}
END_TEST

/* ---- INT8 MaxSim and the quantiser ------------------------------------------------------ */

/* MaxSim of the dequantised values (scale * int8) in double. */
static double ref_i8(const kern_varlen_i8 *a, size_t qi, size_t n, double *bound)
{
    const size_t dim = a->dim;
    double s = 0;
    *bound = 0;
    if (a->d_off[n + 1] == a->d_off[n])
        return -INFINITY;
    for (int64_t i = a->q_off[qi]; i < a->q_off[qi + 1]; i++) {
        double mx = -INFINITY, mb = 0;
        for (int64_t t = a->d_off[n]; t < a->d_off[n + 1]; t++) {
            double dot = 0, mag = 0;
            for (size_t k = 0; k < dim; k++) {
                const double x = (double)a->q_scale[i] * a->q[i * dim + k];
                const double y = (double)a->d_scale[t] * a->d[t * dim + k];
                dot += x * y;
                mag += fabs(x * y);
            }
            mx = fmax(mx, dot);
            mb = fmax(mb, mag);
        }
        s += mx;
        *bound += mb;
    }
    return s;
}

static int8_t *i8_rand(size_t n)
{
    int8_t *x = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++)
        x[i] = (int8_t)((int)(rnd() % 255) - 127);
    return x;
}

static float *scales_rand(size_t n)
{
    float *s = xcalloc(n, sizeof *s);
    for (size_t i = 0; i < n; i++)
        s[i] = frnd() * 0.02f; /* either sign: the semantics do not assume positive scales */
    return s;
}

START_TEST(test_kernels_i8_matches_reference)
{
    rng_init();
    static const size_t dims[] = {64, 128, 96, 256, 7};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const size_t dim = dims[di], nq = 3, nd = 40;
        int64_t *qo = ragged_offsets(nq, 33), *doff = ragged_offsets(nd, 70);
        int8_t *q = i8_rand((size_t)qo[nq] * dim), *d = i8_rand((size_t)doff[nd] * dim);
        float *qs = scales_rand((size_t)qo[nq]), *ds = scales_rand((size_t)doff[nd]);
        float *scores = xcalloc(nq * nd, sizeof(float));
        kern_varlen_i8 a = {dim, q, qs, qo, nq, d, ds, doff, nd};
        poison(scores, nq * nd);
        ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, scores), KERN_OK);
        for (size_t i = 0; i < nq; i++)
            for (size_t n = 0; n < nd; n++) {
                double bound;
                const double ref = ref_i8(&a, i, n, &bound);
                assert_close(scores[i * nd + n], ref, bound, "i8", i, n);
                if (qo[i + 1] == qo[i] && doff[n + 1] > doff[n])
                    ck_assert(scores[i * nd + n] == 0.0f);
            }
        free(qo);
        free(doff);
        free(q);
        free(d);
        free(qs);
        free(ds);
        free(scores);
    }
}
END_TEST

START_TEST(test_kernels_i8_quantize_round_trip)
{
    rng_init();
    const size_t n = 300, dim = 128;
    float *x = xcalloc(n * dim, sizeof *x), *sc = xcalloc(n, sizeof *sc);
    int8_t *q = xcalloc(n * dim, 1);
    for (size_t r = 0; r < n; r++) {
        const float mag = ldexpf(1.0f, (int)urnd(0, 40) - 20); /* rows of very different size */
        for (size_t k = 0; k < dim; k++)
            x[r * dim + k] = frnd() * mag;
    }
    for (size_t k = 0; k < dim; k++) {
        x[0 * dim + k] = 0.f;                   /* a zero row */
        x[1 * dim + k] = k == 5 ? NAN : frnd(); /* a row holding NaN */
    }
    poison(sc, n);
    memset(q, 0x55, n * dim);
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, x, n, dim, q, sc), KERN_OK);
    ck_assert(sc[0] == 0.f && sc[1] == 0.f);
    for (size_t k = 0; k < dim; k++)
        ck_assert(q[k] == 0 && q[dim + k] == 0);
    for (size_t r = 2; r < n; r++) {
        double amax = 0;
        int hit = 0;
        for (size_t k = 0; k < dim; k++)
            amax = fmax(amax, fabs(x[r * dim + k]));
        ck_assert_msg(fabs(sc[r] - amax / 127) <= 1e-7 * amax / 127, "scale of row %zu (seed %llu)",
                      r, (unsigned long long)seed);
        for (size_t k = 0; k < dim; k++) {
            const int v = q[r * dim + k];
            ck_assert(v >= -127 && v <= 127);
            hit |= v == 127 || v == -127;
            const double err = fabs((double)x[r * dim + k] - (double)sc[r] * v);
            ck_assert_msg(err <= 0.5 * sc[r] * (1 + 1e-4),
                          "row %zu dim %zu: error %g > scale/2 %g (seed %llu)", r, k, err,
                          0.5 * sc[r], (unsigned long long)seed);
        }
        ck_assert_msg(hit, "row %zu: its absmax does not map to +-127", r);
    }
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, NULL, n, dim, q, sc), KERN_EINVAL);
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, x, n, 0, q, sc), KERN_EINVAL);
    free(x);
    free(sc);
    free(q);
}
END_TEST

/* Clustered unit vectors: each token a random centroid plus noise, normalised. */
static void clustered(float *x, size_t rows, size_t dim, const float *cent, size_t ncent,
                      float noise)
{
    for (size_t r = 0; r < rows; r++) {
        const float *c = cent + (rnd() % ncent) * dim;
        double nn = 0;
        for (size_t k = 0; k < dim; k++) {
            x[r * dim + k] = c[k] + noise * frnd();
            nn += (double)x[r * dim + k] * x[r * dim + k];
        }
        for (size_t k = 0; k < dim; k++)
            x[r * dim + k] /= (float)sqrt(nn);
    }
}

/* Fraction of the exact top k (by exact score) that the approximate top k holds. */
static double recall_at(const float *exact, const float *approx, size_t n, size_t k)
{
    int64_t *ie = xcalloc(k, sizeof *ie), *ia = xcalloc(k, sizeof *ia);
    float *ve = xcalloc(k, sizeof *ve), *va = xcalloc(k, sizeof *va);
    ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, exact, 1, n, k, ie, ve), KERN_OK);
    ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, approx, 1, n, k, ia, va), KERN_OK);
    size_t hit = 0;
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < k; j++)
            hit += ie[i] == ia[j];
    free(ie);
    free(ia);
    free(ve);
    free(va);
    return (double)hit / (double)k;
}

START_TEST(test_kernels_i8_ranking_agreement)
{
    /* recall@10 of the int8 ranking against exact fp32 MaxSim on clustered data, reported, and
     * bounded well below what int8 gives so that the test fails only on a real regression. */
    rng_init();
    const size_t dim = 128, nd = 2000, ld = 40, lq = 32, ncent = 256, k = 10;
    float *cent = xcalloc(ncent * dim, sizeof *cent);
    for (size_t i = 0; i < ncent * dim; i++)
        cent[i] = frnd();
    float *d = xcalloc(nd * ld * dim, sizeof *d), *q = xcalloc(lq * dim, sizeof *q);
    clustered(d, nd * ld, dim, cent, ncent, 0.5f);
    clustered(q, lq, dim, cent, ncent, 0.5f);
    int64_t *doff = xcalloc(nd + 1, sizeof *doff), qo[2] = {0, (int64_t)lq};
    for (size_t n = 0; n < nd; n++)
        doff[n + 1] = doff[n] + (int64_t)ld;
    int8_t *dq = xcalloc(nd * ld * dim, 1), *qq = xcalloc(lq * dim, 1);
    float *ds = xcalloc(nd * ld, sizeof *ds), *qs = xcalloc(lq, sizeof *qs);
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, d, nd * ld, dim, dq, ds), KERN_OK);
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, q, lq, dim, qq, qs), KERN_OK);
    float *exact = xcalloc(nd, sizeof *exact), *approx = xcalloc(nd, sizeof *approx);
    poison(exact, nd);
    poison(approx, nd);
    kern_varlen e = {KERN_F32, dim, q, qo, 1, d, doff, nd};
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &e, exact), KERN_OK);
    kern_varlen_i8 a = {dim, qq, qs, qo, 1, dq, ds, doff, nd};
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, approx), KERN_OK);
    double maxrel = 0;
    for (size_t n = 0; n < nd; n++)
        maxrel = fmax(maxrel, fabs(approx[n] - exact[n]) / fabs(exact[n]));
    const double r = recall_at(exact, approx, nd, k);
    printf("i8 ranking agreement: recall@%zu %.2f over %zu docs (Lq %zu, Ld %zu, d %zu); "
           "max relative score error %.2e (seed %llu)\n",
           k, r, nd, lq, ld, dim, maxrel, (unsigned long long)seed);
    ck_assert_msg(maxrel < 0.02, "int8 scores off by %g relative", maxrel);
    ck_assert_msg(r >= 0.5, "recall@10 %.2f", r);
    free(cent);
    free(d);
    free(q);
    free(doff);
    free(dq);
    free(qq);
    free(ds);
    free(qs);
    free(exact);
    free(approx);
}
END_TEST

START_TEST(test_kernels_i8_bad_input)
{
    int64_t off[2] = {0, 1};
    int8_t v[64] = {0};
    float sc[1] = {1}, out[1] = {0};
    kern_varlen_i8 a = {64, v, sc, off, 1, v, sc, off, 1};
    a.dim = 0;
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, out), KERN_EINVAL);
    a.dim = 64;
    a.d_scale = NULL;
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, out), KERN_EINVAL);
    a.d_scale = sc;
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, NULL, out), KERN_EINVAL);
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, NULL), KERN_EINVAL);
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, out), KERN_OK);
    ck_assert(out[0] == 0.f);
}
END_TEST

static Suite *kernels_suite(void)
{
    Suite *s = suite_create("kernels");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"dense_unmasked", test_kernels_dense_unmasked},
        {"dense_dims", test_kernels_dense_dims},
        {"dense_odd_dims", test_kernels_dense_odd_dims},
        {"dense_query_mask", test_kernels_dense_query_mask},
        {"dense_doc_mask", test_kernels_dense_doc_mask},
        {"dense_f16", test_kernels_dense_f16},
        {"dense_bf16", test_kernels_dense_bf16},
        {"dense_lq1", test_kernels_dense_lq1},
        {"dense_many_panels", test_kernels_dense_many_panels},
        {"dense_long_docs", test_kernels_dense_long_docs},
        {"dense_queries_split", test_kernels_dense_queries_split},
        {"dense_all_masked", test_kernels_dense_all_masked},
        {"dense_duplicate_maxima", test_kernels_dense_duplicate_maxima},
        {"dense_no_product_memory", test_kernels_dense_no_product_memory},
        {"varlen_ragged", test_kernels_varlen_ragged},
        {"varlen_dtypes", test_kernels_varlen_dtypes},
        {"varlen_one_token_docs", test_kernels_varlen_one_token_docs},
        {"varlen_equals_dense", test_kernels_varlen_equals_dense},
        {"varlen_bad_offsets", test_kernels_varlen_bad_offsets},
        {"f16_exhaustive", test_kernels_f16_exhaustive},
        {"bf16_rounding", test_kernels_bf16_rounding},
        {"e4m3_conversions", test_kernels_e4m3_conversions},
        {"centroid_scores", test_kernels_centroid_scores},
        {"residual_bit_order", test_kernels_residual_bit_order},
        {"residual_nbits", test_kernels_residual_nbits},
        {"residual_strided_table", test_kernels_residual_strided_table},
        {"residual_long_docs", test_kernels_residual_long_docs},
        {"residual_unaligned", test_kernels_residual_unaligned},
        {"residual_bad_input", test_kernels_residual_bad_input},
        {"interaction_all_kept", test_kernels_interaction_all_kept},
        {"interaction_keep_mask", test_kernels_interaction_keep_mask},
        {"interaction_bad_code", test_kernels_interaction_bad_code},
        {"topk_rows", test_kernels_topk_rows},
        {"topk_stream_chunks", test_kernels_topk_stream_chunks},
        {"topk_stream_ids", test_kernels_topk_stream_ids},
        {"topk_stream_edges", test_kernels_topk_stream_edges},
        {"dispatch_errors", test_kernels_dispatch_errors},
        {"isa_selection", test_kernels_isa_selection},
        {"threads_agree", test_kernels_threads_agree},
        {"i8_matches_reference", test_kernels_i8_matches_reference},
        {"i8_quantize_round_trip", test_kernels_i8_quantize_round_trip},
        {"i8_ranking_agreement", test_kernels_i8_ranking_agreement},
        {"i8_bad_input", test_kernels_i8_bad_input},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].test);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(kernels_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
