/*
 * check_kernels_maxsim.c: dense and variable-length MaxSim on the CPU against the double-precision
 * reference (fx_maxsim_ref) on fresh random inputs, in every dtype, shape and mask; the
 * dispatcher's argument checks, the micro-kernel choice, and thread counts that never change a
 * score. Every output is poisoned (NaN) before a call; numeric tests run once per micro-kernel
 * variant this CPU supports.
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

#include "fixture.h"
#include "fixture_kernels.h"
#include "kernels.h"
#include "microkernel_cpu.h"

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
                    fx_maxsim_ref(q.val + i * lq * dim, qm ? qm + i * lq : NULL, lq,
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
    rng_init_random();
    check_dense(KERN_F32, 128, 3, 32, 9, 41, 1.0, 1.0);
    check_dense(KERN_F32, 64, 1, 7, 5, 3, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_dims)
{
    rng_init_random();
    static const size_t dims[] = {64, 96, 128, 256, 320, 1024};
    for (size_t i = 0; i < 6; i++)
        for (size_t k = 0; k < NDTYPES; k++)
            check_dense(dtypes[k], dims[i], 2, urnd(1, 40), 4, urnd(1, 30), 1.0, 0.8);
}
END_TEST

START_TEST(test_kernels_dense_odd_dims)
{
    /* Any positive dim works, also ones no vector width divides. */
    rng_init_random();
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
    rng_init_random();
    check_dense(KERN_F32, 128, 4, 32, 6, 20, 0.6, 1.0);
    /* Two-token queries, a third of their tokens valid: many queries have none at all, the
     * first of a call included, and the next query makes the first pass over a chunk. */
    for (size_t k = 0; k < NDTYPES; k++)
        check_dense(dtypes[k], 64, 9, 2, 5, 20, 0.3, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_doc_mask)
{
    rng_init_random();
    check_dense(KERN_F32, 96, 2, 16, 10, 50, 1.0, 0.3);
}
END_TEST

START_TEST(test_kernels_dense_f16)
{
    rng_init_random();
    check_dense(KERN_F16, 128, 3, 32, 5, 33, 0.8, 0.7);
    check_dense(KERN_F16, 320, 1, 5, 3, 9, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_bf16)
{
    rng_init_random();
    check_dense(KERN_BF16, 128, 3, 32, 5, 33, 0.8, 0.7);
    check_dense(KERN_BF16, 1024, 1, 3, 2, 5, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_lq1)
{
    rng_init_random();
    for (size_t k = 0; k < NDTYPES; k++)
        check_dense(dtypes[k], 128, 3, 1, 7, 25, 1.0, 0.9);
}
END_TEST

START_TEST(test_kernels_dense_many_panels)
{
    /* More query tokens than one panel holds, with a part-filled last panel. */
    rng_init_random();
    check_dense(KERN_F32, 64, 2, 75, 3, 19, 0.95, 1.0);
    check_dense(KERN_BF16, 64, 2, 75, 3, 19, 0.95, 1.0);
    check_dense(KERN_F16, 32, 1, 40, 2, 9, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_long_docs)
{
    /* Documents longer than one chunk of rows, so running maxima carry across chunks. */
    rng_init_random();
    check_dense(KERN_F32, 64, 2, 8, 2, 1100, 1.0, 0.9);
    check_dense(KERN_BF16, 128, 1, 8, 2, 700, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_queries_split)
{
    /* Many queries, few documents: threads split the queries. */
    rng_init_random();
    check_dense(KERN_F32, 64, 37, 9, 1, 13, 0.9, 1.0);
    check_dense(KERN_F16, 64, 11, 4, 2, 7, 1.0, 1.0);
}
END_TEST

START_TEST(test_kernels_dense_all_masked)
{
    /* A document whose every token is masked scores -inf; a query with none scores 0. */
    rng_init_random();
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
        double ref = fx_maxsim_ref(q.val, qm, lq, d.val, dm, ld, dim, &bound);
        assert_close(scores[0], ref, bound, isa, 0, 0);
        ref = fx_maxsim_ref(q.val, qm, lq, d.val + 2 * ld * dim, dm + 2 * ld, ld, dim, &bound);
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
    rng_init_random();
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
        double ref = fx_maxsim_ref(q.val, NULL, lq, d.val, NULL, ld, dim, &bound);
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
    rng_init_random();
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
        ref += fx_maxsim_ref(q.val + i * dim, NULL, 1, d.val, NULL, l, dim, &bound);
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
                double ref = fx_maxsim_ref(q.val + qo[i] * dim, NULL, lq, d.val + doff[n] * dim,
                                           NULL, ld, dim, &bound);
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
    rng_init_random();
    check_varlen(KERN_F32, 128, 1, 32, 40, 60);
    check_varlen(KERN_F32, 96, 3, 40, 25, 30);
}
END_TEST

START_TEST(test_kernels_varlen_dtypes)
{
    rng_init_random();
    check_varlen(KERN_F16, 128, 2, 32, 20, 40);
    check_varlen(KERN_BF16, 256, 2, 20, 15, 40);
    check_varlen(KERN_E4M3, 128, 3, 32, 20, 40);
    check_varlen(KERN_E4M3, 17, 2, 9, 11, 30); /* rows at odd addresses */
}
END_TEST

START_TEST(test_kernels_varlen_one_token_docs)
{
    /* Every document a single token: MaxSim is then the sum of plain dot products. */
    rng_init_random();
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
    rng_init_random();
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
    rng_init_random();
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

int main(void)
{
    const fx_case cases[] = {
        {"dense_unmasked", test_kernels_dense_unmasked, 0},
        {"dense_dims", test_kernels_dense_dims, 0},
        {"dense_odd_dims", test_kernels_dense_odd_dims, 0},
        {"dense_query_mask", test_kernels_dense_query_mask, 0},
        {"dense_doc_mask", test_kernels_dense_doc_mask, 0},
        {"dense_f16", test_kernels_dense_f16, 0},
        {"dense_bf16", test_kernels_dense_bf16, 0},
        {"dense_lq1", test_kernels_dense_lq1, 0},
        {"dense_many_panels", test_kernels_dense_many_panels, 0},
        {"dense_long_docs", test_kernels_dense_long_docs, 0},
        {"dense_queries_split", test_kernels_dense_queries_split, 0},
        {"dense_all_masked", test_kernels_dense_all_masked, 0},
        {"dense_duplicate_maxima", test_kernels_dense_duplicate_maxima, 0},
        {"dense_no_product_memory", test_kernels_dense_no_product_memory, 0},
        {"varlen_ragged", test_kernels_varlen_ragged, 0},
        {"varlen_dtypes", test_kernels_varlen_dtypes, 0},
        {"varlen_one_token_docs", test_kernels_varlen_one_token_docs, 0},
        {"varlen_equals_dense", test_kernels_varlen_equals_dense, 0},
        {"varlen_bad_offsets", test_kernels_varlen_bad_offsets, 0},
        {"dispatch_errors", test_kernels_dispatch_errors, 0},
        {"isa_selection", test_kernels_isa_selection, 0},
        {"threads_agree", test_kernels_threads_agree, 0},
    };
    return FX_RUN("kernels-maxsim", cases, 0, 60);
}
