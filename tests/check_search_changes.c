/*
 * check_search_changes.c: tartan_search as the index changes: deleted documents never returned,
 * replaced ones scored once, k beyond the index, untrained and empty indexes, and a search's
 * snapshot unmoved by writes during it.
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

START_TEST(test_search_deleted_never_returned)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 16);
    size_t rows;
    float *q = fx_queries(&c, 3, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 3, LQ, DIM);
    /* Delete the exhaustive top 5 of each query, and every tenth document. */
    tartan_search_params p;
    tartan_search_params_init(&p, 5);
    p.exhaustive = 1;
    tartan_results *r = fx_search_ok(db, &qs, &p);
    const char *del[3 * 5 + NDOC / 10];
    char *dup[3 * 5];
    size_t nd = 0;
    for (size_t h = 0; h < r->offsets[3]; h++)
        del[nd++] = dup[h] = strdup(r->hits[h].id);
    size_t ntop = nd;
    for (size_t i = 5; i < NDOC; i += 10)
        del[nd++] = c.ids[i];
    tartan_results_free(r);
    size_t n_deleted;
    ck_assert_int_eq(tartan_delete(db, del, nd, &n_deleted), 0);
    ck_assert_uint_gt(n_deleted, NDOC / 10);
    for (int reopen = 0; reopen < 2; reopen++) {
        if (reopen) {
            tartan_close(db);
            db = fx_open(ixpath, 0, DIM, 0);
        }
        for (int ex = 0; ex < 2; ex++) {
            tartan_search_params_init(&p, 1000);
            p.exhaustive = ex;
            r = fx_search_ok(db, &qs, &p);
            for (size_t i = 0; i < 3; i++) {
                if (ex)
                    ck_assert_uint_eq(r->counts[i], NDOC - n_deleted);
                for (size_t j = 0; j < nd; j++)
                    ck_assert_msg(!fx_has_id(r, i, del[j]), "deleted %s returned", del[j]);
            }
            tartan_results_free(r);
        }
    }
    /* The survivors still rank exactly. */
    tartan_search_params_init(&p, 10);
    p.exhaustive = 1;
    r = fx_search_ok(db, &qs, &p);
    size_t nref;
    fx_ref_hit *ref = fx_reference(db, q, LQ, DIM, &nref);
    ck_assert_uint_eq(nref, NDOC - n_deleted);
    fx_expect_exact(r, 0, ref, nref, 10);
    free(ref);
    tartan_results_free(r);
    for (size_t i = 0; i < ntop; i++)
        free(dup[i]);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_replaced_scored_once)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 17);
    size_t rows;
    float *q = fx_queries(&c, 1, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 1, LQ, DIM);
    /* Replace doc-7 by the query itself: it becomes the best match, returned once. */
    size_t len = LQ;
    const char *id[] = {"doc-7"};
    tartan_batch b = {.n_docs = 1,
                      .ids = id,
                      .doclens = &len,
                      .embeddings = q,
                      .n_rows = LQ,
                      .dim = DIM,
                      .dtype = TARTAN_FLOAT32};
    ck_assert_int_eq(tartan_add(db, &b, TARTAN_REPLACE), 0);
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, NDOC);
        p.exhaustive = ex;
        tartan_results *r = fx_search_ok(db, &qs, &p);
        ck_assert_str_eq(r->hits[0].id, "doc-7");
        size_t seen = 0;
        for (size_t j = 0; j < r->counts[0]; j++)
            seen += !strcmp(r->hits[j].id, "doc-7");
        ck_assert_uint_eq(seen, 1);
        size_t nref;
        fx_ref_hit *ref = fx_reference(db, q, LQ, DIM, &nref);
        ck_assert(fabs(r->hits[0].score - ref[0].score) < 1e-4);
        free(ref);
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_k_beyond_index)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, 50, 18);
    size_t rows;
    float *q = fx_queries(&c, 2, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 2, LQ, DIM);
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 100000);
        p.exhaustive = ex;
        tartan_results *r = fx_search_ok(db, &qs, &p);
        for (size_t i = 0; i < 2; i++) {
            if (ex)
                ck_assert_uint_eq(r->counts[i], 50);
            else
                ck_assert_uint_le(r->counts[i], 50);
            ck_assert_uint_gt(r->counts[i], 0);
            for (size_t j = 0; j < r->counts[i]; j++)
                for (size_t l = 0; l < j; l++)
                    ck_assert_str_ne(r->hits[r->offsets[i] + j].id, r->hits[r->offsets[i] + l].id);
        }
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_untrained_index)
{
    tartan_db *db = fx_open(ixpath, TARTAN_CREATE, DIM, 0);
    float q[2 * DIM];
    for (size_t i = 0; i < 2 * DIM; i++)
        q[i] = (float)(i % 7) - 3.0f;
    tartan_queries qs = fx_fixed_queries(q, 1, 2, DIM);
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = ex;
        tartan_results *r = fx_search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->counts[0], 0);
        tartan_results_free(r);
    }
    /* The queries are still checked. */
    qs.dim = DIM + 1;
    tartan_results *r = (tartan_results *)1;
    ck_assert_int_eq(tartan_search(db, &qs, NULL, &r), TARTAN_EDIM);
    ck_assert_ptr_null(r);
    tartan_close(db);
}
END_TEST

START_TEST(test_search_empty_index)
{
    fx_corpus c;
    fx_corpus_default(&c, 60, 19);
    tartan_db *db = fx_open(ixpath, TARTAN_CREATE, DIM, 16);
    /* Trained, then emptied: centroids but no documents. */
    fx_add_range(db, &c, 0, 60);
    ck_assert_int_eq(tartan_delete(db, (const char *const *)c.ids, 60, NULL), 0);
    size_t rows;
    float *q = fx_queries(&c, 3, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 3, LQ, DIM);
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = ex;
        tartan_results *r = fx_search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->offsets[3], 0);
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

/* One-by-one results of each query of a batch, against the batch's. */

START_TEST(test_search_snapshot_during_writes)
{
    /* Searches between adds see each committed state whole: the exhaustive result count is
     * always one of the sizes the index had. */
    fx_corpus c;
    fx_corpus_default(&c, 300, 24);
    tartan_db *db = fx_open(ixpath, TARTAN_CREATE, DIM, 32);
    fx_add_range(db, &c, 0, 100);
    size_t rows;
    float *q = fx_queries(&c, 6, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 6, LQ, DIM);
    for (size_t round = 1; round <= 2; round++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 1000);
        p.exhaustive = 1;
        p.threads = 3;
        tartan_results *r = fx_search_ok(db, &qs, &p);
        for (size_t i = 0; i < 6; i++)
            ck_assert_uint_eq(r->counts[i], 100 * round);
        tartan_results_free(r);
        p.exhaustive = 0;
        r = fx_search_ok(db, &qs, &p);
        for (size_t i = 0; i < 6; i++)
            ck_assert_uint_le(r->counts[i], 100 * round);
        tartan_results_free(r);
        fx_add_range(db, &c, 100 * round, 100);
    }
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

/* Device selection: CUDA where none can be had is refused (TARTAN_ENODEV), never run on
 * the CPU instead; a bad TARTAN_DEVICE is refused; the CPU is always there. */

int main(void)
{
    const fx_case cases[] = {
        {"deleted_never_returned", test_search_deleted_never_returned, 0},
        {"replaced_scored_once", test_search_replaced_scored_once, 0},
        {"k_beyond_index", test_search_k_beyond_index, 0},
        {"untrained_index", test_search_untrained_index, 0},
        {"empty_index", test_search_empty_index, 0},
        {"snapshot_during_writes", test_search_snapshot_during_writes, 0},
    };
    return FX_RUN("search-changes", cases, FX_DIR, 60);
}
