/*
 * check_search_api.c: tartan_search's interface: batches against one-by-one searches (fixed
 * and ragged, fp32 and fp16), every bad argument rejected with its code while the index stays as
 * it was, read-only handles, and the choice of device.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db.h"
#include "fixture.h"
#include "index.h"
#include "kernels.h"
#include "store.h"
#include "tartan.h"

enum { DIM = 32, NDOC = 400, LQ = 8 };

static void batch_vs_single(tartan_db *db, const tartan_queries *qs, const tartan_search_params *p)
{
    tartan_results *all = fx_search_ok(db, qs, p);
    size_t es = qs->dtype == TARTAN_FLOAT32 ? 4 : 2, row = 0;
    for (size_t i = 0; i < qs->n_queries; i++) {
        size_t len = qs->qlens ? qs->qlens[i] : qs->qlen;
        tartan_queries one = *qs;
        one.n_queries = 1;
        one.qlens = qs->qlens ? &qs->qlens[i] : NULL;
        one.embeddings = (const char *)qs->embeddings + row * DIM * es;
        one.n_rows = len;
        tartan_results *r = fx_search_ok(db, &one, p);
        fx_expect_same(all, i, r, 0);
        tartan_results_free(r);
        row += len;
    }
    tartan_results_free(all);
}

START_TEST(test_search_batch_fixed_f32)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 20);
    enum { NQ = 9 };
    size_t rows;
    float *q = fx_queries(&c, NQ, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, NQ, LQ, DIM);
    tartan_search_params p;
    for (int ex = 0; ex < 2; ex++)
        for (int threads = 1; threads <= 3; threads += 2) {
            tartan_search_params_init(&p, 10);
            p.exhaustive = ex;
            p.threads = threads;
            batch_vs_single(db, &qs, &p);
        }
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_batch_ragged_f16)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 21);
    enum { NQ = 7 };
    size_t lens[NQ] = {1, 8, 3, 16, 5, 2, 11}, rows;
    float *q = fx_queries(&c, NQ, 0, lens, 0.8, &rows);
    uint16_t *h = xmalloc(rows * DIM * sizeof *h);
    float *back = xmalloc(rows * DIM * sizeof *back);
    for (size_t i = 0; i < rows * DIM; i++) {
        h[i] = kern_f32_to_f16(q[i]);
        back[i] = kern_f16_to_f32(h[i]);
    }
    tartan_queries qs = {.n_queries = NQ,
                         .qlens = lens,
                         .embeddings = h,
                         .n_rows = rows,
                         .dim = DIM,
                         .dtype = TARTAN_FLOAT16};
    tartan_search_params p;
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params_init(&p, 15);
        p.exhaustive = ex;
        p.threads = 2;
        batch_vs_single(db, &qs, &p);
    }
    /* fp16 queries score as their fp32 values do. */
    tartan_search_params_init(&p, 15);
    tartan_results *a = fx_search_ok(db, &qs, &p);
    qs.embeddings = back;
    qs.dtype = TARTAN_FLOAT32;
    tartan_results *b = fx_search_ok(db, &qs, &p);
    for (size_t i = 0; i < NQ; i++)
        fx_expect_same(a, i, b, i);
    tartan_results_free(a);
    tartan_results_free(b);
    free(h);
    free(back);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

/* The index's info, to see that a failed search changed nothing. */
static void expect_info(tartan_db *db, const tartan_index_info *before)
{
    tartan_index_info now;
    ck_assert_int_eq(tartan_info(db, &now), 0);
    ck_assert_uint_eq(now.n_docs, before->n_docs);
    ck_assert_uint_eq(now.n_tokens, before->n_tokens);
    ck_assert_uint_eq(now.bytes_file, before->bytes_file);
    ck_assert_uint_eq(now.ivf_entries, before->ivf_entries);
}

static void expect_fail(tartan_db *db, const tartan_queries *qs, const tartan_search_params *p,
                        int code, const tartan_index_info *before)
{
    tartan_results *r = (tartan_results *)1;
    int rc = tartan_search(db, qs, p, &r);
    ck_assert_msg(rc == code, "got %s, want %s (%s)", tartan_err_name(rc), tartan_err_name(code),
                  tartan_errmsg(db));
    ck_assert_ptr_null(r);
    const char *name = tartan_err_name(code);
    ck_assert_msg(!strncmp(tartan_errmsg(db), name, strlen(name)), "%s", tartan_errmsg(db));
    expect_info(db, before);
}

START_TEST(test_search_bad_arguments)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, 100, 22);
    tartan_index_info before;
    ck_assert_int_eq(tartan_info(db, &before), 0);
    size_t rows;
    float *q = fx_queries(&c, 2, LQ, NULL, 0.8, &rows);
    tartan_queries good = fx_fixed_queries(q, 2, LQ, DIM), qs;
    tartan_search_params p, gp;
    tartan_search_params_init(&gp, 10);

    qs = good;
    qs.dim = DIM * 2;
    expect_fail(db, &qs, &gp, TARTAN_EDIM, &before);
    q[LQ * DIM + 3 * DIM + 5] = NAN;
    expect_fail(db, &good, &gp, TARTAN_ENONFINITE, &before);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "query 1: token 3 has NaN at dimension 5"));
    q[LQ * DIM + 3 * DIM + 5] = INFINITY;
    expect_fail(db, &good, &gp, TARTAN_ENONFINITE, &before);
    ck_assert_ptr_nonnull(
        strstr(tartan_errmsg(db), "query 1: token 3 has infinity at dimension 5"));
    q[LQ * DIM + 3 * DIM + 5] = 0.25f;
    float last = q[LQ * DIM + DIM - 1];
    q[LQ * DIM + DIM - 1] = -INFINITY; /* the last value of a row */
    expect_fail(db, &good, &gp, TARTAN_ENONFINITE, &before);
    ck_assert_ptr_nonnull(
        strstr(tartan_errmsg(db), "query 1: token 0 has infinity at dimension 31"));
    q[LQ * DIM + DIM - 1] = last;
    q[LQ * DIM + 3 * DIM + 5] = 0.25f;
    float saved[DIM];
    memcpy(saved, q + 2 * DIM, sizeof saved);
    memset(q + 2 * DIM, 0, sizeof saved);
    expect_fail(db, &good, &gp, TARTAN_ERANGE, &before);
    memcpy(q + 2 * DIM, saved, sizeof saved);

    p = gp;
    p.k = 0;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p.k = (size_t)-1; /* a negative k through an int */
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    p.recall_target = 1.f;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    p.recall_target = NAN;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    p.centroid_score_threshold = NAN;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    p.threads = -2;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    const char *bad_ids[] = {"doc-1", ""};
    p.subset = bad_ids;
    p.n_subset = 2;
    expect_fail(db, &good, &p, TARTAN_EBADID, &before);
    const char *null_ids[] = {NULL};
    p.subset = null_ids;
    p.n_subset = 1;
    expect_fail(db, &good, &p, TARTAN_EBADID, &before);
    p.subset = NULL;
    expect_fail(db, &good, &p, TARTAN_EINVAL, &before);

    qs = good;
    qs.n_queries = 0;
    qs.n_rows = 0;
    expect_fail(db, &qs, &gp, TARTAN_EEMPTY, &before);
    qs = good;
    qs.qlen = 0;
    qs.n_rows = 0;
    expect_fail(db, &qs, &gp, TARTAN_EEMPTY, &before);
    size_t lens[2] = {LQ, 0};
    qs = good;
    qs.qlens = lens;
    qs.n_rows = LQ;
    expect_fail(db, &qs, &gp, TARTAN_EEMPTY, &before);
    qs = good;
    qs.n_rows = 2 * LQ - 1;
    expect_fail(db, &qs, &gp, TARTAN_EINVAL, &before);
    qs = good;
    qs.embeddings = NULL;
    expect_fail(db, &qs, &gp, TARTAN_EINVAL, &before);
    qs = good;
    qs.dtype = (tartan_dtype)7;
    expect_fail(db, &qs, &gp, TARTAN_EDTYPE, &before);
    qs = good;
    qs.qlen = 70000;
    qs.n_rows = 140000;
    expect_fail(db, &qs, &gp, TARTAN_ETOOBIG, &before);

    tartan_results *r = NULL;
    ck_assert_int_eq(tartan_search(db, NULL, &gp, &r), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_search(db, &good, &gp, NULL), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_search(NULL, &good, &gp, &r), TARTAN_EINVAL);
    /* And the good call still works: NULL params are the defaults for k = 10. */
    r = fx_search_ok(db, &good, NULL);
    ck_assert_uint_eq(r->counts[0], 10);
    tartan_results_free(r);
    expect_info(db, &before);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_readonly_handle)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 23);
    tartan_close(db);
    db = fx_open(ixpath, TARTAN_READONLY, DIM, 0);
    size_t rows;
    float *q = fx_queries(&c, 4, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 4, LQ, DIM);
    tartan_search_params p;
    tartan_search_params_init(&p, 10);
    p.threads = 2;
    tartan_results *r = fx_search_ok(db, &qs, &p);
    size_t nref;
    fx_ref_hit *ref = fx_reference(db, q, LQ, DIM, &nref);
    /* A PLAID hit scores exactly. */
    ck_assert(fabs(r->hits[0].score - fx_ref_find(ref, nref, r->hits[0].id)->score) < 1e-4);
    free(ref);
    tartan_results_free(r);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_device_choice)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, 120, 31);
    size_t rows;
    float *q = fx_queries(&c, 3, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 3, LQ, DIM);
    tartan_search_params p;
    tartan_search_params_init(&p, 5);
    tartan_results *r = NULL;
    p.device = TARTAN_DEVICE_CUDA;
    if (kern_cuda_device_count() == 0) {
        ck_assert_int_eq(tartan_search(db, &qs, &p, &r), TARTAN_ENODEV);
        ck_assert_ptr_null(r);
        ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "CUDA"));
        setenv("TARTAN_DEVICE", "cuda", 1);
        p.device = TARTAN_DEVICE_AUTO;
        ck_assert_int_eq(tartan_search(db, &qs, &p, &r), TARTAN_ENODEV);
        /* AUTO without the variable runs on the CPU. */
        unsetenv("TARTAN_DEVICE");
        r = fx_search_ok(db, &qs, &p);
        tartan_results_free(r);
    }
    /* tartan_device_resolve tells the same rule. */
    tartan_device where = (tartan_device)9;
    ck_assert_int_eq(tartan_device_resolve(TARTAN_DEVICE_CPU, &where), 0);
    ck_assert_int_eq(where, TARTAN_DEVICE_CPU);
    where = (tartan_device)9;
    ck_assert_int_eq(tartan_device_resolve(TARTAN_DEVICE_AUTO, &where), 0);
    ck_assert_int_eq(where, kern_cuda_device_count() > 0 ? TARTAN_DEVICE_CUDA : TARTAN_DEVICE_CPU);
    setenv("TARTAN_DEVICE", "cpu", 1);
    where = (tartan_device)9;
    ck_assert_int_eq(tartan_device_resolve(TARTAN_DEVICE_AUTO, &where), 0);
    ck_assert_int_eq(where, TARTAN_DEVICE_CPU);
    setenv("TARTAN_DEVICE", "cuda", 1);
    where = (tartan_device)9;
    ck_assert_int_eq(tartan_device_resolve(TARTAN_DEVICE_AUTO, &where),
                     kern_cuda_device_count() > 0 ? 0 : TARTAN_ENODEV);
    ck_assert_int_eq(where, kern_cuda_device_count() > 0 ? TARTAN_DEVICE_CUDA : (tartan_device)9);
    unsetenv("TARTAN_DEVICE");
    ck_assert_int_eq(tartan_device_resolve(TARTAN_DEVICE_CUDA, &where),
                     kern_cuda_device_count() > 0 ? 0 : TARTAN_ENODEV);
    ck_assert_int_eq(tartan_device_resolve((tartan_device)7, &where), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_device_resolve(TARTAN_DEVICE_CPU, NULL), TARTAN_EINVAL);
    setenv("TARTAN_DEVICE", "tpu", 1);
    ck_assert_int_eq(tartan_device_resolve(TARTAN_DEVICE_AUTO, &where), TARTAN_EINVAL);
    p.device = TARTAN_DEVICE_AUTO;
    ck_assert_int_eq(tartan_search(db, &qs, &p, &r), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "TARTAN_DEVICE"));
    unsetenv("TARTAN_DEVICE");
    p.device = (tartan_device)7;
    ck_assert_int_eq(tartan_search(db, &qs, &p, &r), TARTAN_EINVAL);
    p.device = TARTAN_DEVICE_CPU;
    setenv("TARTAN_DEVICE", "cuda", 1); /* an explicit device overrides the environment */
    r = fx_search_ok(db, &qs, &p);
    ck_assert_uint_eq(r->counts[0], 5);
    tartan_results_free(r);
    unsetenv("TARTAN_DEVICE");
    /* Options: an unknown device or GPU mode does not open. */
    tartan_close(db);
    tartan_options o;
    tartan_options_init(&o);
    o.device = (tartan_device)9;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    tartan_options_init(&o);
    o.gpu_mode = (tartan_gpu_mode)5;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    free(q);
    fx_corpus_free(&c);
}
END_TEST

/* A batch large enough to be prepared by several threads: the first bad row is the one
 * reported, whichever thread meets it, and good rows after a fixed one still search. */
START_TEST(test_search_bad_rows_in_a_large_batch)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, 100, 23);
    tartan_index_info before;
    ck_assert_int_eq(tartan_info(db, &before), 0);
    enum { NB = 64 }; /* 64 queries x LQ rows: past the parallel threshold */
    size_t rows;
    float *q = fx_queries(&c, NB, LQ, NULL, 0.8, &rows);
    tartan_queries big = fx_fixed_queries(q, NB, LQ, DIM);
    tartan_search_params p;
    tartan_search_params_init(&p, 5);
    float *zero_row = q + (50 * LQ + 6) * DIM, saved[DIM];
    memcpy(saved, zero_row, sizeof saved);
    memset(zero_row, 0, sizeof saved);
    q[(41 * LQ + 2) * DIM + 17] = NAN;
    q[(59 * LQ + 7) * DIM + 3] = INFINITY;
    expect_fail(db, &big, &p, TARTAN_ENONFINITE, &before);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "query 41: token 2 has NaN at dimension 17"));
    q[(41 * LQ + 2) * DIM + 17] = 0.5f;
    expect_fail(db, &big, &p, TARTAN_ERANGE, &before);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "query 50: token 6 is all zeros"));
    memcpy(zero_row, saved, sizeof saved);
    expect_fail(db, &big, &p, TARTAN_ENONFINITE, &before);
    ck_assert_ptr_nonnull(
        strstr(tartan_errmsg(db), "query 59: token 7 has infinity at dimension 3"));
    q[(59 * LQ + 7) * DIM + 3] = 0.25f;
    tartan_results *r = NULL;
    ck_assert_msg(tartan_search(db, &big, &p, &r) == 0, "%s", tartan_errmsg(db));
    ck_assert_uint_eq(r->n_queries, NB);
    tartan_results_free(r);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"batch_fixed_f32", test_search_batch_fixed_f32, 0},
        {"batch_ragged_f16", test_search_batch_ragged_f16, 0},
        {"bad_arguments", test_search_bad_arguments, 0},
        {"bad_rows_in_a_large_batch", test_search_bad_rows_in_a_large_batch, 0},
        {"readonly_handle", test_search_readonly_handle, 0},
        {"device_choice", test_search_device_choice, 0},
    };
    return FX_RUN("search-api", cases, FX_DIR, 60);
}
