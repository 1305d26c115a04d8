/*
 * check_search_exact.c: tartan_search against the truth on real indexes (real LMDB in a fresh
 * temporary directory per test): exhaustive search against a brute-force double-precision MaxSim
 * over the decompressed documents (fx_reference), PLAID at full width equal to exhaustive, PLAID's
 * default recall, and subsets (only allowed documents, small subsets scored exactly, empty).
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

/* ---- against the double-precision reference ---------------------------------------------- */

START_TEST(test_search_params_defaults)
{
    /* Every k: the adaptive stages (ncells 0, ndocs 0), no pruning, the default target. */
    static const size_t ks[] = {1, 10, 11, 100, 101, 1024, 1025, 5000};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        tartan_search_params p;
        memset(&p, 0xA5, sizeof p);
        tartan_search_params_init(&p, ks[i]);
        ck_assert_uint_eq(p.k, ks[i]);
        ck_assert_uint_eq(p.ncells, 0);
        ck_assert_uint_eq(p.ndocs, 0);
        ck_assert(p.centroid_score_threshold == -1.f);
        ck_assert(p.recall_target == 0.f);
        ck_assert_int_eq(p.exhaustive, 0);
        ck_assert_ptr_null(p.subset);
        ck_assert_uint_eq(p.n_subset, 0);
        ck_assert_int_eq(p.threads, 0);
        ck_assert_int_eq(p.device, TARTAN_DEVICE_AUTO);
    }
    tartan_results_free(NULL);
}
END_TEST

START_TEST(test_search_exhaustive_matches_bruteforce)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 11);
    size_t rows;
    float *q = fx_queries(&c, 4, LQ, NULL, 0.8, &rows);
    tartan_search_params p;
    tartan_search_params_init(&p, 50);
    p.exhaustive = 1;
    tartan_queries qs = fx_fixed_queries(q, 4, LQ, DIM);
    tartan_results *r = fx_search_ok(db, &qs, &p);
    for (size_t i = 0; i < 4; i++) {
        size_t nref;
        fx_ref_hit *ref = fx_reference(db, q + i * LQ * DIM, LQ, DIM, &nref);
        ck_assert_uint_eq(nref, NDOC);
        fx_expect_exact(r, i, ref, nref, 50);
        free(ref);
    }
    ck_assert_uint_eq(r->stats.n_exact, 4 * NDOC);
    tartan_results_free(r);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

/*
 * Exhaustive search through the AMX screen (engine/search_exact.c: bf16 scores with a bound,
 * fp32 for what the bound cannot rule out) returns exactly what the unscreened search returns:
 * the same ids in the same order with the same scores bit for bit, at k 1, 10 and 100, over
 * more documents than one chunk (4,096; so the running k-th score rules documents out too),
 * on one and two threads, with every document present twice under two ids (ties everywhere).
 */
START_TEST(test_search_exhaustive_screen_same)
{
    enum { N = 2600, NQ = 6 };
    fx_corpus c;
    fx_corpus_default(&c, N, 31);
    tartan_db *db = fx_open(fx_path("ix"), TARTAN_CREATE, DIM, 64);
    fx_add_range(db, &c, 0, N);
    /* the same documents again under other ids */
    const char **ids2 = xmalloc(N * sizeof *ids2);
    char(*buf)[32] = xmalloc(N * sizeof *buf);
    for (size_t i = 0; i < N; i++) {
        snprintf(buf[i], sizeof buf[i], "twin-%zu", i);
        ids2[i] = buf[i];
    }
    tartan_batch b = {N, ids2, c.doclens, c.emb, c.n_rows, DIM, TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    size_t rows;
    float *q = fx_queries(&c, NQ, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, NQ, LQ, DIM);
    static const size_t ks[] = {1, 10, 100};
    for (size_t ki = 0; ki < 3; ki++)
        for (int threads = 1; threads <= 2; threads++) {
            tartan_search_params p;
            tartan_search_params_init(&p, ks[ki]);
            p.exhaustive = 1;
            p.threads = threads;
            ck_assert_int_eq(setenv("TARTAN_EXACT_SCREEN", "0", 1), 0);
            tartan_results *r0 = fx_search_ok(db, &qs, &p);
            ck_assert_int_eq(unsetenv("TARTAN_EXACT_SCREEN"), 0);
            tartan_results *r1 = fx_search_ok(db, &qs, &p);
            for (size_t i = 0; i < NQ; i++)
                ck_assert_uint_eq(r0->counts[i], ks[ki]);
            char what[64];
            snprintf(what, sizeof what, "k %zu threads %d, unscreened against screened", ks[ki],
                     threads);
            fx_expect_identical(r0, r1, what);
            tartan_results_free(r0);
            tartan_results_free(r1);
        }
    free(q);
    free(ids2);
    free(buf);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_plaid_wide_equals_exhaustive)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 12);
    size_t rows;
    float *q = fx_queries(&c, 5, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 5, LQ, DIM);
    tartan_search_params p;
    tartan_search_params_init(&p, 20);
    /* Every centroid probed, nothing pruned, everything kept: PLAID must find exactly what
     * exhaustive search finds. */
    p.ncells = 1000;
    p.centroid_score_threshold = -1e30f;
    p.ndocs = 4 * NDOC;
    tartan_results *a = fx_search_ok(db, &qs, &p);
    /* Wide but still through stages 2 and 3 (ndocs / 4 below the candidates). */
    p.ndocs = NDOC / 2;
    tartan_results *b = fx_search_ok(db, &qs, &p);
    p.exhaustive = 1;
    tartan_results *e = fx_search_ok(db, &qs, &p);
    for (size_t i = 0; i < 5; i++) {
        fx_expect_same(a, i, e, i);
        ck_assert_uint_eq(b->counts[i], 20);
        size_t nref;
        fx_ref_hit *ref = fx_reference(db, q + i * LQ * DIM, LQ, DIM, &nref);
        fx_expect_exact(a, i, ref, nref, 20);
        /* Pruned runs return exact scores of the documents they return. */
        for (size_t j = 0; j < b->counts[i]; j++) {
            const tartan_hit *h = &b->hits[b->offsets[i] + j];
            ck_assert(fabs(h->score - fx_ref_find(ref, nref, h->id)->score) < 1e-4);
        }
        free(ref);
    }
    tartan_results_free(a);
    tartan_results_free(b);
    tartan_results_free(e);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_default_recall)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, 1500, 13);
    enum { NQ = 30 };
    size_t rows;
    float *q = fx_queries(&c, NQ, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, NQ, LQ, DIM);
    tartan_search_params p;
    tartan_search_params_init(&p, 10);
    tartan_results *a = fx_search_ok(db, &qs, &p);
    p.exhaustive = 1;
    tartan_results *e = fx_search_ok(db, &qs, &p);
    size_t found = 0, total = 0;
    for (size_t i = 0; i < NQ; i++) {
        for (size_t j = 0; j < e->counts[i]; j++)
            found += fx_has_id(a, i, e->hits[e->offsets[i] + j].id);
        total += e->counts[i];
    }
    double recall = (double)found / total;
    printf("test_search_default_recall: recall@10 of the defaults against exhaustive: %.3f "
           "(%zu queries, %d documents; %llu candidates, %llu scored exactly)\n",
           recall, (size_t)NQ, 1500, (unsigned long long)a->stats.n_candidates,
           (unsigned long long)a->stats.n_exact);
    /* The pruning stages ran: fewer documents scored exactly than were candidates. */
    ck_assert_uint_lt(a->stats.n_exact, a->stats.n_candidates);
    ck_assert_uint_eq(total, NQ * 10);
    ck_assert_msg(recall >= 0.8, "recall@10 %.3f", recall);
    tartan_results_free(a);
    tartan_results_free(e);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

/* The subset: every third document, and a few ids the index does not have. */
static const char **subset_ids(const fx_corpus *c, size_t *n)
{
    const char **ids = xmalloc((c->n_docs / 3 + 3) * sizeof *ids);
    size_t k = 0;
    for (size_t i = 0; i < c->n_docs; i += 3)
        ids[k++] = c->ids[i];
    ids[k++] = "no-such-document";
    ids[k++] = c->ids[0]; /* repeated */
    *n = k;
    return ids;
}

static int in_subset(const char *id)
{
    size_t i;
    return sscanf(id, "doc-%zu", &i) == 1 && i % 3 == 0;
}

START_TEST(test_search_subset_only_allowed)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 14);
    size_t rows, ns;
    float *q = fx_queries(&c, 3, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 3, LQ, DIM);
    const char **ids = subset_ids(&c, &ns);
    size_t n_allowed = (NDOC + 2) / 3;
    for (int mode = 0; mode < 3; mode++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.subset = ids;
        p.n_subset = ns;
        p.exhaustive = mode == 0;
        /* mode 1: a subset larger than ndocs goes through PLAID's stages; mode 2: smaller,
         * scored exactly. */
        p.ndocs = mode == 1 ? 32 : 256;
        tartan_results *r = fx_search_ok(db, &qs, &p);
        for (size_t i = 0; i < 3; i++) {
            for (size_t j = 0; j < r->counts[i]; j++)
                ck_assert_msg(in_subset(r->hits[r->offsets[i] + j].id), "%s not allowed",
                              r->hits[r->offsets[i] + j].id);
            if (mode != 1)
                ck_assert_uint_eq(r->counts[i], 10);
        }
        if (mode == 2) {
            /* Exact over the subset: the reference restricted to it. */
            for (size_t i = 0; i < 3; i++) {
                size_t nref, k = 0;
                fx_ref_hit *ref = fx_reference(db, q + i * LQ * DIM, LQ, DIM, &nref);
                for (size_t j = 0; j < nref; j++)
                    if (in_subset(ref[j].id))
                        ref[k++] = ref[j];
                ck_assert_uint_eq(k, n_allowed);
                fx_expect_exact(r, i, ref, k, 10);
                free(ref);
            }
        }
        tartan_results_free(r);
    }
    /* k beyond the subset: every allowed document comes back, once. */
    tartan_search_params p;
    tartan_search_params_init(&p, 1000);
    p.subset = ids;
    p.n_subset = ns;
    p.exhaustive = 1;
    tartan_results *r = fx_search_ok(db, &qs, &p);
    for (size_t i = 0; i < 3; i++) {
        ck_assert_uint_eq(r->counts[i], n_allowed);
        for (size_t j = 0; j < c.n_docs; j += 3)
            ck_assert(fx_has_id(r, i, c.ids[j]));
    }
    tartan_results_free(r);
    p.exhaustive = 0;
    r = fx_search_ok(db, &qs, &p); /* 134 allowed <= ndocs 4096: all scored */
    for (size_t i = 0; i < 3; i++)
        ck_assert_uint_eq(r->counts[i], n_allowed);
    tartan_results_free(r);
    free(ids);
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_subset_small_exact)
{
    /* Subsets small enough to be scored from their list (PLAID: at most ndocs; exhaustive:
     * at most an eighth of the index) rank exactly as the reference restricted to them. */
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 25);
    size_t rows;
    float *q = fx_queries(&c, 3, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 3, LQ, DIM);
    const char *ids[NDOC / 20];
    size_t ns = 0;
    for (size_t i = 7; i < NDOC; i += 20)
        ids[ns++] = c.ids[i];
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = ex;
        p.subset = ids;
        p.n_subset = ns;
        p.threads = 2;
        tartan_results *r = fx_search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->stats.n_exact, 3 * ns); /* the list only, not the index */
        for (size_t i = 0; i < 3; i++) {
            size_t nref, k = 0;
            fx_ref_hit *ref = fx_reference(db, q + i * LQ * DIM, LQ, DIM, &nref);
            for (size_t j = 0; j < nref; j++) {
                size_t d;
                if (sscanf(ref[j].id, "doc-%zu", &d) == 1 && d % 20 == 7)
                    ref[k++] = ref[j];
            }
            ck_assert_uint_eq(k, ns);
            fx_expect_exact(r, i, ref, k, 10);
            free(ref);
        }
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_search_subset_empty)
{
    fx_corpus c;
    tartan_db *db = fx_build(&c, NDOC, 15);
    size_t rows;
    float *q = fx_queries(&c, 2, LQ, NULL, 0.8, &rows);
    tartan_queries qs = fx_fixed_queries(q, 2, LQ, DIM);
    const char *unknown[] = {"x", "y"};
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = ex;
        p.subset = unknown;
        p.n_subset = 2;
        tartan_results *r = fx_search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->offsets[2], 0);
        tartan_results_free(r);
        p.n_subset = 0; /* an empty list allows nothing */
        r = fx_search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->offsets[2], 0);
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    fx_corpus_free(&c);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"params_defaults", test_search_params_defaults, 0},
        {"exhaustive_matches_bruteforce", test_search_exhaustive_matches_bruteforce, 0},
        {"exhaustive_screen_same", test_search_exhaustive_screen_same, 0},
        {"plaid_wide_equals_exhaustive", test_search_plaid_wide_equals_exhaustive, 0},
        {"default_recall", test_search_default_recall, 0},
        {"subset_only_allowed", test_search_subset_only_allowed, 0},
        {"subset_small_exact", test_search_subset_small_exact, 0},
        {"subset_empty", test_search_subset_empty, 0},
    };
    return FX_RUN("search-exact", cases, FX_DIR, 60);
}
