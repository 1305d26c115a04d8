/*
 * check_adaptive.c: the adaptive search and its calibration (engine/SEARCH.md) on real
 * indexes: default recall against exhaustive search on small corpora of each generator family
 * (tools/synth.h: models 1, 2 and 3, whose token statistics differ), the calibration a search
 * then uses, the stopping rule against exhaustive search, staleness, a damaged calibration
 * record, and bad arguments.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "db.h"
#include "fixture.h"
#include "search.h"
#include "store.h"
#include "synth.h"
#include "tartan.h"

static void setup(void)
{
    fixture_dir_create("check-adaptive");
}

static void teardown(void)
{
    fixture_dir_remove();
}

/* A corpus of one generator family, in memory, with its queries. */
typedef struct corpus {
    size_t n_docs, n_rows, dim, nq, qlen;
    size_t *doclens;
    float *emb, *q;
    char **ids;
} corpus;

/* Tokens of the queries corpus_make writes (a test may change it for its corpus). */
static size_t corpus_qlen = 32;

static void corpus_make(corpus *c, int model, size_t n_docs, size_t len, size_t dim, size_t nq,
                        uint64_t seed)
{
    tool_synth_params p;
    tool_synth_params_init(&p);
    tool_synth_params_model(&p, model);
    p.n_docs = n_docs;
    p.len_mean = len;
    p.len_min = 4;
    p.dim = dim;
    p.n_queries = nq;
    p.qlen = corpus_qlen;
    p.group_docs = p.model == TOOL_SYNTH_V1 ? 0 : 50;
    p.seed = seed;
    tool_synth *s = NULL;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    memset(c, 0, sizeof *c);
    c->n_docs = n_docs;
    c->dim = dim;
    c->nq = nq;
    c->qlen = p.qlen;
    c->doclens = xmalloc(n_docs * sizeof *c->doclens);
    for (size_t i = 0; i < n_docs; i++)
        c->n_rows += c->doclens[i] = tool_synth_doclen(s, i);
    c->emb = xmalloc(c->n_rows * dim * sizeof *c->emb);
    c->ids = xmalloc(n_docs * sizeof *c->ids);
    for (size_t i = 0, row = 0; i < n_docs; row += c->doclens[i], i++) {
        tool_synth_doc(s, i, c->emb + row * dim);
        c->ids[i] = xmalloc(24);
        snprintf(c->ids[i], 24, "d%zu", i);
    }
    c->q = xmalloc(nq * p.qlen * dim * sizeof *c->q);
    for (size_t j = 0; j < nq; j++)
        tool_synth_query(s, j, c->q + j * p.qlen * dim, NULL);
    tool_synth_free(s);
}

static void corpus_free(corpus *c)
{
    for (size_t i = 0; i < c->n_docs; i++)
        free(c->ids[i]);
    free(c->ids);
    free(c->doclens);
    free(c->emb);
    free(c->q);
}

static tartan_db *open_ix(size_t dim)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = dim;
    o.device = TARTAN_DEVICE_CPU;
    tartan_db *db = NULL;
    ck_assert_msg(tartan_open(ixpath, &o, &db) == 0, "%s", tartan_errmsg(NULL));
    return db;
}

/* Adds documents [a, b) of c. */
static void add_range(tartan_db *db, const corpus *c, size_t a, size_t b)
{
    size_t row = 0;
    for (size_t i = 0; i < a; i++)
        row += c->doclens[i];
    size_t rows = 0;
    for (size_t i = a; i < b; i++)
        rows += c->doclens[i];
    tartan_batch batch = {b - a,          (const char *const *)c->ids + a,
                          c->doclens + a, c->emb + row * c->dim,
                          rows,           c->dim,
                          TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &batch, 0) == 0, "%s", tartan_errmsg(db));
}

static tartan_queries queries_of(const corpus *c)
{
    return fx_fixed_queries(c->q, c->nq, c->qlen, c->dim);
}

/* eng_calib_read over the index's current snapshot: its code, the message in m. */
static int read_calib(tartan_db *db, eng_calib *cal, store_msg *m)
{
    store_txn *txn;
    ck_assert_int_eq(store_read_begin(db->env, &txn, m), 0);
    int rc = eng_calib_read(txn, cal, m);
    store_read_end(db->env, txn);
    return rc;
}

static tartan_results *search(tartan_db *db, const corpus *c, const tartan_search_params *p)
{
    tartan_queries q = queries_of(c);
    tartan_results *r = NULL;
    ck_assert_msg(tartan_search(db, &q, p, &r) == 0, "%s", tartan_errmsg(db));
    return r;
}

/* Mean recall of a's top k against b's (the reference) over the queries. */
static double recall(const tartan_results *a, const tartan_results *b, size_t k)
{
    double sum = 0;
    for (size_t q = 0; q < b->n_queries; q++) {
        size_t nb = b->counts[q] < k ? b->counts[q] : k, na = a->counts[q] < k ? a->counts[q] : k;
        size_t hit = 0;
        for (size_t i = 0; i < nb; i++)
            for (size_t j = 0; j < na; j++)
                if (!strcmp(b->hits[b->offsets[q] + i].id, a->hits[a->offsets[q] + j].id)) {
                    hit++;
                    break;
                }
        sum += nb ? (double)hit / (double)nb : 1.0;
    }
    return sum / (double)b->n_queries;
}

/* The default search at k and exhaustive search, both over c's queries, into *ad and *ex (the
 * caller frees them): the default's recall against exhaustive. */
static double against_exhaustive(tartan_db *db, const corpus *c, size_t k, tartan_results **ad,
                                 tartan_results **ex)
{
    tartan_search_params pe, pa;
    tartan_search_params_init(&pe, k);
    pe.exhaustive = 1;
    tartan_search_params_init(&pa, k);
    *ad = search(db, c, &pa);
    *ex = search(db, c, &pe);
    return recall(*ad, *ex, k);
}

/*
 * The goal in miniature: on each family, after calibration, the default search keeps
 * at least 0.95 of the exhaustive top 10 and top 100, while scoring far fewer documents
 * exactly than exhaustive search does.
 */
START_TEST(test_adaptive_default_recall_each_family)
{
    int model = TOOL_SYNTH_V1 + _i;
    corpus c;
    corpus_make(&c, model, 1500, 30, 64, 60, 1000 + (uint64_t)model);
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, c.n_docs);
    tartan_calibration cal;
    ck_assert_msg(tartan_calibrate(db, NULL, &cal) == 0, "%s", tartan_errmsg(db));
    ck_assert_int_eq(cal.calibrated, 1);
    for (size_t k = 10; k <= 100; k *= 10) {
        tartan_results *a, *b;
        double r = against_exhaustive(db, &c, k, &a, &b);
        ck_assert_msg(r >= 0.95, "model %d k %zu: recall %.4f", model, k, r);
        ck_assert_uint_lt(a->stats.n_exact, b->stats.n_exact / 2);
        ck_assert(a->stats.probe_margin >= 0.f && a->stats.rerank_z > 0.f);
        tartan_results_free(a);
        tartan_results_free(b);
    }
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* A search takes its margin from the stored calibration (for its k and recall target), and a
 * new calibration changes what the next search uses; an index never calibrated uses the
 * built-in table. */
START_TEST(test_adaptive_search_uses_calibration)
{
    corpus c;
    corpus_make(&c, TOOL_SYNTH_V1, 800, 25, 32, 20, 7);
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, c.n_docs);
    tartan_search_params p;
    tartan_search_params_init(&p, 10);
    eng_calib builtin;
    eng_calib_default(&builtin);
    tartan_results *r = search(db, &c, &p);
    ck_assert_float_eq(r->stats.probe_margin, eng_calib_margin(&builtin, 10, 0.95f, c.qlen));
    ck_assert_float_eq(r->stats.rerank_z, eng_rerank_z(0.95f));
    tartan_results_free(r);
    tartan_calibration got;
    ck_assert_int_eq(tartan_calibration_get(db, &got), 0);
    ck_assert_int_eq(got.calibrated, 0);

    tartan_calibration cal, again;
    ck_assert_msg(tartan_calibrate(db, NULL, &cal) == 0, "%s", tartan_errmsg(db));
    ck_assert_int_eq(tartan_calibration_get(db, &again), 0);
    ck_assert_int_eq(again.calibrated, 1);
    ck_assert_int_eq(again.from_queries, 0);
    ck_assert_uint_eq(again.n_queries, 128);
    ck_assert_uint_eq(again.n_docs, c.n_docs);
    ck_assert_float_eq(again.margin_k10, cal.margin_k10);
    ck_assert_float_eq(again.margin_k100, cal.margin_k100);
    ck_assert(again.recall_k10 > 0.f && again.recall_k10 <= 1.f);
    for (size_t k = 10; k <= 100; k *= 10) {
        tartan_search_params_init(&p, k);
        r = search(db, &c, &p);
        ck_assert_float_eq(r->stats.probe_margin, k == 10 ? cal.margin_k10 : cal.margin_k100);
        tartan_results_free(r);
    }
    /* The stored table read back gives the same margin at another target and k. */
    store_msg m;
    eng_calib stored;
    ck_assert_int_eq(read_calib(db, &stored, &m), 0);
    ck_assert_int_eq(stored.calibrated, 1);
    tartan_search_params_init(&p, 30);
    p.recall_target = 0.99f;
    r = search(db, &c, &p);
    ck_assert_float_eq(r->stats.probe_margin, eng_calib_margin(&stored, 30, 0.99f, c.qlen));
    ck_assert_float_eq(r->stats.rerank_z, eng_rerank_z(0.99f));
    tartan_results_free(r);

    /* Short queries: the stored short margins (8-token pseudo-queries), at least the full
     * ones; 8-token queries probe with them, 16-token ones between; in a batch of mixed
     * lengths each query keeps its own margin (the same hits as searched alone) and the batch
     * reports the widest. */
    ck_assert_uint_eq(stored.short_len, 8);
    for (size_t l = 0; l < ENG_CALIB_LEVELS; l++) {
        ck_assert(stored.margin10s[l] >= stored.margin10[l]);
        ck_assert(stored.margin100s[l] >= stored.margin100[l]);
    }
    float m8 = eng_calib_margin(&stored, 10, 0.95f, 8),
          m16 = eng_calib_margin(&stored, 10, 0.95f, 16),
          m32 = eng_calib_margin(&stored, 10, 0.95f, 32);
    ck_assert(m8 >= m16 && m16 >= m32);
    /* Beyond k 100 the cap and the margin keep growing (k 1,000: 64 probes a token). */
    ck_assert_uint_eq(eng_probe_cap(10), 16);
    ck_assert_uint_eq(eng_probe_cap(100), 32);
    ck_assert_uint_eq(eng_probe_cap(200), 45);
    ck_assert_uint_eq(eng_probe_cap(1000), 64);
    ck_assert(eng_calib_margin(&stored, 1000, 0.95f, 32) >=
              eng_calib_margin(&stored, 100, 0.95f, 32));
    ck_assert_uint_eq(again.short_len, 8); /* the public view tells the same */
    ck_assert_float_eq(again.margin_k10_short, m8);
    ck_assert_float_eq(again.margin_k100_short, eng_calib_margin(&stored, 100, 0.95f, 8));
    ck_assert_float_eq(eng_calib_margin(&stored, 10, 0.95f, 3), m8);
    ck_assert_float_eq(eng_calib_margin(&stored, 10, 0.95f, 200), m32);
    {
        const size_t nq = c.nq, d = c.dim;
        size_t *lens = xmalloc(nq * sizeof *lens), rows = 0;
        for (size_t i = 0; i < nq; i++)
            rows += lens[i] = i % 2 ? 8 : c.qlen;
        float *packed = xmalloc(rows * d * sizeof *packed), *q8 = xmalloc(nq * 8 * d * 4);
        for (size_t i = 0, at = 0; i < nq; i++) {
            memcpy(packed + at * d, c.q + i * c.qlen * d, lens[i] * d * sizeof *packed);
            memcpy(q8 + i * 8 * d, c.q + i * c.qlen * d, 8 * d * sizeof *q8);
            at += lens[i];
        }
        tartan_queries mixed = {.n_queries = nq,
                                .qlens = lens,
                                .embeddings = packed,
                                .n_rows = rows,
                                .dim = d,
                                .dtype = TARTAN_FLOAT32};
        tartan_queries short8 = fx_fixed_queries(q8, nq, 8, d);
        tartan_search_params_init(&p, 10);
        tartan_results *rm = NULL, *r8 = NULL, *rf = search(db, &c, &p);
        ck_assert_int_eq(tartan_search(db, &short8, &p, &r8), 0);
        ck_assert_float_eq(r8->stats.probe_margin, m8);
        ck_assert_int_eq(tartan_search(db, &mixed, &p, &rm), 0);
        ck_assert_float_eq(rm->stats.probe_margin, m8);
        for (size_t i = 0; i < nq; i++) {
            const tartan_results *alone = i % 2 ? r8 : rf;
            ck_assert_uint_eq(rm->counts[i], alone->counts[i]);
            for (size_t j = 0; j < rm->counts[i]; j++) {
                ck_assert_str_eq(rm->hits[rm->offsets[i] + j].id,
                                 alone->hits[alone->offsets[i] + j].id);
                ck_assert_float_eq(rm->hits[rm->offsets[i] + j].score,
                                   alone->hits[alone->offsets[i] + j].score);
            }
        }
        tartan_results_free(rm);
        tartan_results_free(r8);
        tartan_results_free(rf);
        free(lens);
        free(packed);
        free(q8);
    }

    /* The caller's queries: a calibration of their own, marked so. */
    tartan_queries q = queries_of(&c);
    tartan_calibrate_params cp;
    tartan_calibrate_params_init(&cp);
    cp.queries = &q;
    ck_assert_msg(tartan_calibrate(db, &cp, &cal) == 0, "%s", tartan_errmsg(db));
    ck_assert_int_eq(cal.from_queries, 1);
    ck_assert_uint_eq(cal.n_queries, c.nq);
    tartan_search_params_init(&p, 10);
    r = search(db, &c, &p);
    ck_assert_float_eq(r->stats.probe_margin, cal.margin_k10);
    tartan_results_free(r);
    /* Fixed probing reports no margin. */
    p.ncells = 2;
    r = search(db, &c, &p);
    ck_assert_float_eq(r->stats.probe_margin, -1.f);
    ck_assert_uint_eq(r->stats.n_probes, c.nq * c.qlen * 2);
    tartan_results_free(r);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/*
 * With every centroid probed and a target so high that the stopping rule never stops early,
 * the adaptive search scores every candidate and must return exactly exhaustive search's
 * results: the same ids in the same order, the same scores.
 */
START_TEST(test_adaptive_full_equals_exhaustive)
{
    corpus c;
    corpus_make(&c, TOOL_SYNTH_V3, 600, 20, 32, 25, 11);
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, c.n_docs);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    for (size_t k = 1; k <= 50; k *= 7) {
        tartan_search_params ad, ex;
        tartan_search_params_init(&ad, k);
        ad.ncells = info.n_centroids;
        ad.recall_target = 0.999999f;
        tartan_search_params_init(&ex, k);
        ex.exhaustive = 1;
        tartan_results *a = search(db, &c, &ad), *b = search(db, &c, &ex);
        for (size_t q = 0; q < c.nq; q++) {
            ck_assert_uint_eq(a->counts[q], b->counts[q]);
            for (size_t j = 0; j < a->counts[q]; j++) {
                const tartan_hit *x = &a->hits[a->offsets[q] + j], *y = &b->hits[b->offsets[q] + j];
                ck_assert_msg(!strcmp(x->id, y->id), "k %zu query %zu rank %zu: %s, want %s", k, q,
                              j, x->id, y->id);
                ck_assert_float_eq_tol(x->score, y->score, 1e-5f * c.qlen);
            }
        }
        tartan_results_free(a);
        tartan_results_free(b);
    }
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* A calibration goes stale when the live documents change more than twofold; adds after it
 * do not change what is stored. */
START_TEST(test_adaptive_stale)
{
    corpus c;
    corpus_make(&c, TOOL_SYNTH_V2, 900, 20, 32, 4, 5);
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, 200);
    tartan_calibration cal;
    ck_assert_msg(tartan_calibrate(db, NULL, &cal) == 0, "%s", tartan_errmsg(db));
    ck_assert_int_eq(cal.stale, 0);
    ck_assert_uint_eq(cal.n_docs, 200);
    add_range(db, &c, 200, 400);
    ck_assert_int_eq(tartan_calibration_get(db, &cal), 0);
    ck_assert_int_eq(cal.stale, 0);
    add_range(db, &c, 400, 900);
    ck_assert_int_eq(tartan_calibration_get(db, &cal), 0);
    ck_assert_int_eq(cal.stale, 1);
    ck_assert_uint_eq(cal.n_docs, 200);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* A damaged calibration record is TARTAN_ECORRUPT for searches that read it and for
 * tartan_calibration_get; calibrating again repairs it. */
typedef struct put_ctx {
    const void *data;
    size_t len;
} put_ctx;

static int put_fn(store_txn *txn, void *ctx, store_msg *m)
{
    put_ctx *p = ctx;
    return store_meta_put(txn, STORE_META_CALIBRATION, p->data, p->len, m);
}

/* The stored calibration record's bytes now (a static copy). */
static const uint8_t *data_copy(tartan_db *db, size_t *len)
{
    static uint8_t copy[512];
    store_msg m;
    store_txn *txn;
    const void *data;
    ck_assert_int_eq(store_read_begin(db->env, &txn, &m), 0);
    ck_assert_int_eq(store_meta_get(txn, STORE_META_CALIBRATION, &data, len, &m), 0);
    ck_assert_uint_le(*len, sizeof copy);
    memcpy(copy, data, *len);
    store_read_end(db->env, txn);
    return copy;
}

/* Writes bytes as the calibration record, in one transaction (the store's checks only). */
static void put_record(tartan_db *db, const void *bytes, size_t len)
{
    store_msg m;
    put_ctx ctx = {bytes, len};
    ck_assert_int_eq(store_write(db->env, put_fn, &ctx, &m), 0);
}

/* 300 documents of model 2 (32 dimensions, nq queries, seed), added and calibrated: its
 * record, version 2, is 168 bytes. */
static tartan_db *calibrated_ix(corpus *c, size_t nq, uint64_t seed)
{
    corpus_make(c, TOOL_SYNTH_V2, 300, 20, 32, nq, seed);
    tartan_db *db = open_ix(c->dim);
    add_range(db, c, 0, c->n_docs);
    ck_assert_int_eq(tartan_calibrate(db, NULL, NULL), 0);
    return db;
}

/* A query whose margin reaches fewer candidates than k probes every token's whole cap: it
 * returns as many results as probing the cap outright does (fixed ncells at the cap, every
 * candidate kept), never fewer. */
START_TEST(test_adaptive_too_few_candidates)
{
    /* 8-token queries at k 100 on small documents: no query may come back with fewer results
     * than probing its tokens' whole caps finds (the widening; test_adaptive_widens reaches
     * it, this calibrated corpus does not). */
    corpus c;
    corpus_qlen = 8;
    corpus_make(&c, TOOL_SYNTH_V1, 800, 12, 64, 20, 77);
    corpus_qlen = 32;
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, c.n_docs);
    ck_assert_int_eq(tartan_calibrate(db, NULL, NULL), 0);
    const size_t d = c.dim, L = c.qlen, K = 100, cap = eng_probe_cap(K);
    for (size_t i = 0; i < c.nq; i++) {
        tartan_queries q = fx_fixed_queries(c.q + i * L * d, 1, L, d);
        tartan_search_params ad, fx;
        tartan_search_params_init(&ad, K);
        tartan_search_params_init(&fx, K);
        fx.ncells = cap;
        fx.ndocs = 100000;
        tartan_results *ra = NULL, *rf = NULL;
        ck_assert_int_eq(tartan_search(db, &q, &ad, &ra), 0);
        ck_assert_int_eq(tartan_search(db, &q, &fx, &rf), 0);
        /* Never fewer results than probing the whole cap gives. */
        const size_t want = rf->counts[0] < K ? rf->counts[0] : K;
        ck_assert_msg(ra->counts[0] >= want, "query %zu: %zu results, the cap reaches %zu", i,
                      ra->counts[0], rf->counts[0]);
        tartan_results_free(ra);
        tartan_results_free(rf);
    }
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/*
 * The widening where it must happen: 1-token queries on an index of 2,048 centroids over ~10k
 * tokens (about 5 a list), k 100, uncalibrated (the built-in margin, 0.05 at k 100: calibration
 * on so small a corpus asks for margins covering the whole cap). Probing one centroid reaches
 * 1-17 documents and the margin's probes 16 or so, so the query probes its token's whole cap
 * (n_probes = the cap) and returns what probing the cap outright returns, the same documents.
 * Without the widening: "16 results, the cap gives 100".
 */
START_TEST(test_adaptive_widens)
{
    corpus c;
    corpus_make(&c, TOOL_SYNTH_V2, 800, 12, 64, 12, 78);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = c.dim;
    o.n_centroids = 2048;
    o.device = TARTAN_DEVICE_CPU;
    tartan_db *db = NULL;
    ck_assert_msg(tartan_open(ixpath, &o, &db) == 0, "%s", tartan_errmsg(NULL));
    add_range(db, &c, 0, c.n_docs); /* uncalibrated: the built-in margins, 0.01-0.09 */
    const size_t d = c.dim, K = 100, cap = eng_probe_cap(K);
    size_t widened = 0;
    for (size_t i = 0; i < c.nq; i++) {
        tartan_queries q = fx_fixed_queries(c.q + i * c.qlen * d, 1, 1, d);
        tartan_search_params ad, one, fx;
        tartan_search_params_init(&ad, K);
        tartan_search_params_init(&one, K);
        tartan_search_params_init(&fx, K);
        one.ncells = 1;
        one.ndocs = 100000;
        fx.ncells = cap;
        fx.ndocs = 100000;
        tartan_results *ra = NULL, *r1 = NULL, *rf = NULL;
        ck_assert_int_eq(tartan_search(db, &q, &ad, &ra), 0);
        ck_assert_int_eq(tartan_search(db, &q, &one, &r1), 0);
        ck_assert_int_eq(tartan_search(db, &q, &fx, &rf), 0);
        ck_assert_msg(r1->counts[0] < K, "query %zu: one centroid reaches %zu documents", i,
                      r1->counts[0]);
        const size_t want = rf->counts[0] < K ? rf->counts[0] : K;
        ck_assert_msg(ra->counts[0] == want, "query %zu: %zu results, the cap gives %zu", i,
                      ra->counts[0], want);
        for (size_t j = 0; j < want; j++) /* exact scores of the same candidates */
            ck_assert_str_eq(ra->hits[j].id, rf->hits[j].id);
        widened += ra->stats.n_probes == cap;
        tartan_results_free(ra);
        tartan_results_free(r1);
        tartan_results_free(rf);
    }
    ck_assert_uint_eq(widened, c.nq);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/*
 * The recall a calibration reports is the default search's recall against exhaustive search
 * on its queries: exactly that when it ranked every document, and an estimate close to it
 * when it ranked a sample. Over a 10% sample it counts the sample's documents that stand for
 * the index's top k (its top ceil(k / 10)), not the sample's whole top k: those stand for the
 * index's top 10 k, which a search at k does not promise (that reading was 0.934 / 0.880 at k
 * 10 / 100 on 200,000 documents of 10 tokens whose search kept 0.97 / 0.98).
 */
START_TEST(test_adaptive_recall_estimate)
{
    corpus c;
    corpus_make(&c, TOOL_SYNTH_V2, 4000, 10, 64, 100, 91);
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, c.n_docs);
    tartan_queries q = queries_of(&c);
    for (int sampled = 0; sampled < 2; sampled++) {
        tartan_calibrate_params cp;
        tartan_calibrate_params_init(&cp);
        cp.queries = &q;
        cp.max_reference_docs = sampled ? 400 : 0;
        tartan_calibration cal;
        ck_assert_msg(tartan_calibrate(db, &cp, &cal) == 0, "%s", tartan_errmsg(db));
        ck_assert(sampled ? cal.n_reference_docs < c.n_docs : cal.n_reference_docs == c.n_docs);
        for (size_t k = 10; k <= 100; k *= 10) {
            tartan_results *a, *b;
            const double truth = against_exhaustive(db, &c, k, &a, &b);
            const double said = k == 10 ? cal.recall_k10 : cal.recall_k100;
            if (!sampled) /* the same searches: the same figure */
                ck_assert_msg(fabs(said - truth) < 1e-6, "k %zu: %.4f said, %.4f measured", k, said,
                              truth);
            else
                ck_assert_msg(fabs(said - truth) <= 0.04,
                              "k %zu, sampled: %.4f said, %.4f measured", k, said, truth);
            tartan_results_free(a);
            tartan_results_free(b);
        }
    }
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/*
 * A shard of a larger corpus (corpus_docs) samples its reference at the corpus's rate: at
 * max_reference_docs 2,000 over a corpus of 4 x 4,000 documents, about 500 of its 4,000 (a
 * hashed sample: binomial, sd 21); its recall estimate stays close to the truth as any
 * sample's does; corpus_docs at most the index's own changes nothing, and 0 is the index.
 */
START_TEST(test_adaptive_corpus_share)
{
    corpus c;
    corpus_make(&c, TOOL_SYNTH_V2, 4000, 10, 64, 100, 93);
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, c.n_docs);
    tartan_queries q = queries_of(&c);
    const uint64_t corpus_of[3] = {4 * 4000, 0, 1000};
    uint64_t n_ref[3];
    for (int i = 0; i < 3; i++) {
        tartan_calibrate_params cp;
        tartan_calibrate_params_init(&cp);
        ck_assert_uint_eq(cp.corpus_docs, 0);
        cp.queries = &q;
        cp.max_reference_docs = 2000;
        cp.corpus_docs = corpus_of[i];
        tartan_calibration cal;
        ck_assert_msg(tartan_calibrate(db, &cp, &cal) == 0, "%s", tartan_errmsg(db));
        n_ref[i] = cal.n_reference_docs;
        ck_assert_uint_eq(cal.n_docs, c.n_docs);
        if (i == 0) {
            ck_assert_msg(n_ref[0] >= 420 && n_ref[0] <= 580, "%llu reference documents",
                          (unsigned long long)n_ref[0]);
            for (size_t k = 10; k <= 100; k *= 10) {
                tartan_results *a, *b;
                const double truth = against_exhaustive(db, &c, k, &a, &b);
                const double said = k == 10 ? cal.recall_k10 : cal.recall_k100;
                ck_assert_msg(fabs(said - truth) <= 0.05, "k %zu: %.4f said, %.4f measured", k,
                              said, truth);
                tartan_results_free(a);
                tartan_results_free(b);
            }
        }
    }
    /* 0 and a corpus smaller than the index: the index's own rate, 2,000 of 4,000. */
    ck_assert_uint_eq(n_ref[1], n_ref[2]);
    ck_assert_msg(n_ref[1] >= 1850 && n_ref[1] <= 2150, "%llu", (unsigned long long)n_ref[1]);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/*
 * The calibration's subset by document numbers (eng_docset) is the subset of those documents'
 * ids: exhaustive and default searches return the same; from an older snapshot (documents
 * deleted since) only the ones still live count; numbers out of order are refused.
 */
START_TEST(test_adaptive_docset_subset)
{
    corpus c;
    corpus_make(&c, TOOL_SYNTH_V2, 900, 10, 32, 6, 71);
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, c.n_docs);
    /* Every third document, by number, and their ids. */
    store_msg m;
    idx_reader r;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t docs[300];
    const char *ids[300];
    for (size_t i = 0; i < 300; i++) {
        ids[i] = c.ids[3 * i];
        ck_assert_int_eq(idx_reader_docno(&r, ids[i], &docs[i], &m), 0);
        ck_assert(i == 0 || docs[i] > docs[i - 1]);
    }
    eng_docset ds = {docs, 300, r.h.next_docno, r.h.n_docs};
    idx_reader_close(&r);
    tartan_queries q = queries_of(&c);
    for (int round = 0; round < 2; round++) {
        /* Round 1: 50 of them deleted since the numbers were taken (every sixth). */
        size_t n_ids = 0;
        const char *live[300];
        for (size_t i = 0; i < 300; i++)
            if (round == 0 || i % 6)
                live[n_ids++] = ids[i];
        for (int ex = 0; ex < 2; ex++) {
            tartan_search_params p;
            tartan_search_params_init(&p, 20);
            p.exhaustive = ex;
            tartan_results *by_no = NULL, *by_id = NULL;
            ck_assert_msg(eng_search_call(db, &q, &p, NULL, &ds, &by_no) == 0, "%s",
                          tartan_errmsg(db));
            p.subset = live;
            p.n_subset = n_ids;
            ck_assert_int_eq(tartan_search(db, &q, &p, &by_id), 0);
            char what[48];
            snprintf(what, sizeof what, "round %d, exhaustive %d", round, ex);
            fx_expect_identical(by_no, by_id, what);
            ck_assert_uint_eq(by_no->counts[0], 20);
            tartan_results_free(by_no);
            tartan_results_free(by_id);
        }
        if (round == 0) {
            const char *gone[50];
            for (size_t i = 0; i < 50; i++)
                gone[i] = ids[6 * i];
            size_t n_del = 0;
            ck_assert_int_eq(tartan_delete(db, gone, 50, &n_del), 0);
            ck_assert_uint_eq(n_del, 50);
        }
    }
    /* Out of order: refused, not searched. */
    uint32_t bad[2] = {docs[1], docs[0]};
    eng_docset bs = {bad, 2, ds.next_docno, ds.n_docs};
    tartan_search_params p;
    tartan_search_params_init(&p, 5);
    tartan_results *res = NULL;
    ck_assert_int_eq(eng_search_call(db, &q, &p, NULL, &bs, &res), TARTAN_EINTERNAL);
    ck_assert_ptr_null(res);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* eng_tail_need against the tail sums taken in full, in double: random descending scores, the
 * scored share, sd 0 (chances 0 or 1) and budgets from tiny to the whole tail. */
START_TEST(test_adaptive_tail_need)
{
    uint64_t st = 12345;
    for (int trial = 0; trial < 400; trial++) {
        size_t valid = 1 + (size_t)(rng_uniform(&st) * 3000),
               n = (size_t)(rng_uniform(&st) * valid);
        float *a = xmalloc(valid * sizeof *a);
        double x = 30.0;
        for (size_t j = 0; j < valid; j++) {
            x -= rng_uniform(&st) * (trial % 3 == 0 ? 0.001 : 0.05);
            a[j] = (float)x;
        }
        const double sd = trial % 7 == 0 ? 0.0 : 0.01 + rng_uniform(&st);
        const double mu = rng_uniform(&st) - 0.5,
                     theta = a[n < valid ? n : valid - 1] + mu + (rng_uniform(&st) - 0.3) * 2.0;
        const double eps = trial % 5 == 0 ? 1e-6 : rng_uniform(&st) * 3.0;
        /* The smallest m in [n, valid] whose full tail sum is at most eps. */
        size_t want = valid;
        for (size_t m = n; m <= valid; m++) {
            double t = 0;
            for (size_t j = m; j < valid; j++)
                t += sd > 0 ? 0.5 * erfc((theta - mu - (double)a[j]) / (sd * sqrt(2.0)))
                     : (double)a[j] + mu >= theta ? 1.0
                                                  : 0.0;
            if (t <= eps) {
                want = m;
                break;
            }
        }
        const size_t got = eng_tail_need(a, n, valid, theta, mu, sd, eps);
        /* Within one candidate where the tail sits within rounding of eps. */
        ck_assert_msg(got == want || (got + 1 == want || want + 1 == got),
                      "trial %d (n %zu, valid %zu, sd %g, eps %g): %zu, want %zu", trial, n, valid,
                      sd, eps, got, want);
        free(a);
    }
}
END_TEST

/* A version 1 record (no short margins, as older builds write) still reads and steers the
 * search: every length gets the full margin. */
START_TEST(test_adaptive_version1_record)
{
    corpus c;
    tartan_db *db = calibrated_ix(&c, 4, 19);
    size_t len;
    uint8_t v1[512];
    const uint8_t *now = data_copy(db, &len);
    memcpy(v1, now, len);
    ck_assert_uint_eq(len, 168);
    uint32_t one = 1;
    memcpy(v1, &one, 4);
    put_record(db, v1, 124);
    store_msg m;
    eng_calib got;
    ck_assert_msg(read_calib(db, &got, &m) == 0, "%s", m.text);
    ck_assert_int_eq(got.calibrated, 1);
    ck_assert_uint_eq(got.short_len, 0);
    ck_assert_float_eq(eng_calib_margin(&got, 10, 0.95f, 8), eng_calib_margin(&got, 10, 0.95f, 32));
    tartan_search_params p;
    tartan_search_params_init(&p, 10);
    tartan_results *r = search(db, &c, &p);
    ck_assert_float_eq(r->stats.probe_margin, eng_calib_margin(&got, 10, 0.95f, 32));
    tartan_results_free(r);
    /* A version 1 header on a version 2 body is refused. */
    put_record(db, v1, 168);
    ck_assert_int_eq(read_calib(db, &got, &m), TARTAN_ECORRUPT);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_adaptive_damaged_record)
{
    corpus c;
    tartan_db *db = calibrated_ix(&c, 3, 9);
    /* The record with its first margin made negative, then cut short. */
    size_t len;
    const uint8_t *now = data_copy(db, &len);
    uint8_t *bad = xmalloc(len);
    memcpy(bad, now, len);
    ck_assert_uint_eq(len, 168); /* version 2: with the short queries' margins */
    for (int how = 0; how < 3; how++) {
        float neg = -0.5f;
        if (how == 2) {
            /* A sound full table, a short margin below its full one. */
            now = data_copy(db, &len);
            memcpy(bad, now, len);
            memcpy(bad + 124 + 4, &neg, 4);
        } else {
            memcpy(bad + 32 + 4 * ENG_CALIB_LEVELS, &neg, 4);
        }
        put_record(db, bad, how == 1 ? len - 4 : len);
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        tartan_queries q = queries_of(&c);
        tartan_results *r = NULL;
        ck_assert_int_eq(tartan_search(db, &q, &p, &r), TARTAN_ECORRUPT);
        ck_assert_ptr_null(r);
        ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "calibration"));
        tartan_calibration cal;
        ck_assert_int_eq(tartan_calibration_get(db, &cal), TARTAN_ECORRUPT);
        size_t problems = 0;
        ck_assert_int_eq(tartan_check(db, NULL, NULL, &problems), TARTAN_ECORRUPT);
        ck_assert_uint_eq(problems, 1);
        ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "calibration"));
        /* Searches that do not probe adaptively do not read it. */
        tartan_search_params fx = p;
        fx.ncells = 2;
        ck_assert_int_eq(tartan_search(db, &q, &fx, &r), 0);
        tartan_results_free(r);
        fx.exhaustive = 1;
        ck_assert_int_eq(tartan_search(db, &q, &fx, &r), 0);
        tartan_results_free(r);
        /* Calibrating again writes a sound record. */
        ck_assert_int_eq(tartan_calibrate(db, NULL, &cal), 0);
        ck_assert_int_eq(tartan_check(db, NULL, NULL, &problems), 0);
        ck_assert_int_eq(tartan_search(db, &q, &p, &r), 0);
        tartan_results_free(r);
    }
    free(bad);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* Bad arguments get their codes and leave the stored calibration as it was. */
START_TEST(test_adaptive_bad_arguments)
{
    corpus c;
    corpus_make(&c, TOOL_SYNTH_V2, 300, 20, 32, 3, 13);
    tartan_db *db = open_ix(c.dim);
    tartan_calibration cal;
    /* Untrained, then empty after deleting everything. */
    ck_assert_int_eq(tartan_calibrate(db, NULL, &cal), TARTAN_ENOTTRAINED);
    add_range(db, &c, 0, c.n_docs);
    tartan_search_params p;
    tartan_search_params_init(&p, 10);
    tartan_queries q = queries_of(&c);
    tartan_results *r = (tartan_results *)&p;
    const float bad_targets[] = {1.f, -0.1f, NAN, 2.f, INFINITY};
    for (size_t i = 0; i < sizeof bad_targets / sizeof *bad_targets; i++) {
        p.recall_target = bad_targets[i];
        ck_assert_int_eq(tartan_search(db, &q, &p, &r), TARTAN_ERANGE);
        ck_assert_ptr_null(r);
        ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "recall_target"));
    }
    ck_assert_int_eq(tartan_calibrate(db, NULL, &cal), 0);
    tartan_calibration before;
    ck_assert_int_eq(tartan_calibration_get(db, &before), 0);
    /* Queries of another dimension, with a NaN, and threads < 0. */
    tartan_calibrate_params cp;
    tartan_calibrate_params_init(&cp);
    tartan_queries wrong = q;
    wrong.dim = c.dim + 1;
    cp.queries = &wrong;
    ck_assert_int_eq(tartan_calibrate(db, &cp, &cal), TARTAN_EDIM);
    float *nan_q = xmalloc(c.nq * c.qlen * c.dim * sizeof *nan_q);
    memcpy(nan_q, c.q, c.nq * c.qlen * c.dim * sizeof *nan_q);
    nan_q[5] = NAN;
    tartan_queries nq = q;
    nq.embeddings = nan_q;
    cp.queries = &nq;
    ck_assert_int_eq(tartan_calibrate(db, &cp, &cal), TARTAN_ENONFINITE);
    cp.queries = NULL;
    cp.threads = -1;
    ck_assert_int_eq(tartan_calibrate(db, &cp, &cal), TARTAN_ERANGE);
    ck_assert_int_eq(tartan_calibrate(NULL, NULL, &cal), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_calibration_get(db, NULL), TARTAN_EINVAL);
    tartan_calibration after;
    ck_assert_int_eq(tartan_calibration_get(db, &after), 0);
    ck_assert(memcmp(&before, &after, sizeof before) == 0);
    free(nan_q);
    /* Read-only handles cannot calibrate. */
    tartan_close(db);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    ck_assert_int_eq(tartan_calibrate(db, NULL, &cal), TARTAN_EREADONLY);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* The best cap centroids of a row S [K] (double), best first, ties to the lower centroid;
 * taken [K]: scratch. */
static void best_of(const double *S, size_t K, size_t cap, size_t *top, uint8_t *taken)
{
    memset(taken, 0, K);
    for (size_t j = 0; j < cap; j++) {
        size_t b = SIZE_MAX;
        for (size_t c = 0; c < K; c++)
            if (!taken[c] && (b == SIZE_MAX || S[c] > S[b]))
                b = c;
        top[j] = b;
        taken[b] = 1;
    }
}

/* The margin quantile as the calibration defines it: the smallest value covering level of
 * them, at most 2 (past the cap). */
static double quantile_ref(double *v, size_t n, double level)
{
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    size_t i = (size_t)ceil(level * (double)n);
    double x = v[(i ? i - 1 : 0) < n ? (i ? i - 1 : 0) : n - 1];
    return x < 2.0 ? x : 2.0;
}

/*
 * The stored margins are the definition's (calibrate.c, step 3), recomputed here in double
 * from the index's centroids and codes and the exhaustive top 10 / 100 of the caller's
 * queries: for each reference document, the least best_i - S[i, c] over the query's tokens i
 * and the document's codes c among token i's best probe-cap centroids (16 at k 10, 32 at k
 * 100), then the quantiles of those over the documents at each level. A reference of every
 * document (the index is under the CPU's 20,000): the searches take no subset then.
 */
START_TEST(test_adaptive_margins_reference)
{
    /* Queries of 32 tokens, and of 8 (fewer chances: wider margins, past the k 10 cap). */
    corpus c;
    corpus_qlen = _i ? 8 : 32;
    corpus_make(&c, TOOL_SYNTH_V2, 1500, 10, 32, _i ? 48 : 24, 404);
    corpus_qlen = 32;
    tartan_db *db = open_ix(c.dim);
    add_range(db, &c, 0, c.n_docs);
    tartan_queries q = queries_of(&c);
    tartan_calibrate_params cp;
    tartan_calibrate_params_init(&cp);
    cp.queries = &q;
    tartan_calibration pub;
    ck_assert_msg(tartan_calibrate(db, &cp, &pub) == 0, "%s", tartan_errmsg(db));
    ck_assert_uint_eq(pub.n_reference_docs, c.n_docs);
    store_msg m;
    eng_calib got;
    ck_assert_int_eq(read_calib(db, &got, &m), 0);
    tartan_search_params ep;
    tartan_search_params_init(&ep, 100);
    ep.exhaustive = 1;
    tartan_results *ref = search(db, &c, &ep);

    idx_reader r;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    const size_t K = r.h.n_centroids, d = c.dim, L = c.qlen;
    const size_t cap10 = eng_probe_cap(10) < K ? eng_probe_cap(10) : K;
    const size_t cap100 = eng_probe_cap(100) < K ? eng_probe_cap(100) : K;
    double *S = xmalloc(L * K * sizeof *S), *best = xmalloc(L * sizeof *best);
    uint8_t *in10 = xmalloc(L * K), *in100 = xmalloc(L * K);
    size_t *top = xmalloc(cap100 * sizeof *top);
    uint8_t *taken = xmalloc(K);
    double *n10 = xmalloc(c.nq * 10 * sizeof *n10), *n100 = xmalloc(c.nq * 100 * sizeof *n100);
    size_t c10 = 0, c100 = 0;
    for (size_t qi = 0; qi < c.nq; qi++) {
        memset(in10, 0, L * K);
        memset(in100, 0, L * K);
        for (size_t i = 0; i < L; i++) {
            const float *t = c.q + (qi * L + i) * d;
            double norm = 0;
            for (size_t j = 0; j < d; j++)
                norm += (double)t[j] * t[j];
            norm = sqrt(norm);
            for (size_t k = 0; k < K; k++) {
                double dot = 0;
                for (size_t j = 0; j < d; j++)
                    dot += (double)t[j] * r.centroids[k * d + j];
                S[i * K + k] = dot / norm;
            }
            best_of(S + i * K, K, cap100, top, taken);
            best[i] = S[i * K + top[0]];
            for (size_t j = 0; j < cap100; j++) {
                in100[i * K + top[j]] = 1;
                in10[i * K + top[j]] = j < cap10;
            }
        }
        for (size_t h = 0; h < ref->counts[qi] && h < 100; h++) {
            uint32_t doc;
            kern_pdoc pd;
            ck_assert_int_eq(idx_reader_docno(&r, ref->hits[ref->offsets[qi] + h].id, &doc, &m), 0);
            ck_assert_int_eq(idx_reader_doc(&r, doc, &pd, &m), 0);
            double need10 = INFINITY, need100 = INFINITY;
            for (uint32_t t = 0; t < pd.ntok; t++) {
                uint32_t code = r.h.code_bytes == 2 ? ((const uint16_t *)pd.codes)[t]
                                                    : ((const uint32_t *)pd.codes)[t];
                for (size_t i = 0; i < L; i++) {
                    double gap = best[i] - S[i * K + code];
                    if (in10[i * K + code] && gap < need10)
                        need10 = gap;
                    if (in100[i * K + code] && gap < need100)
                        need100 = gap;
                }
            }
            if (h < 10)
                n10[c10++] = need10;
            n100[c100++] = need100;
        }
    }
    idx_reader_close(&r);
    double w10 = 0, w100 = 0; /* non-decreasing in the level, as stored */
    for (size_t l = 0; l < ENG_CALIB_LEVELS; l++) {
        w10 = fmax(w10, quantile_ref(n10, c10, got.levels[l]));
        w100 = fmax(w100, quantile_ref(n100, c100, got.levels[l]));
        ck_assert_msg(fabs(got.margin10[l] - w10) < 1e-4, "level %.3f: margin10 %.6f, want %.6f",
                      (double)got.levels[l], (double)got.margin10[l], w10);
        ck_assert_msg(fabs(got.margin100[l] - w100) < 1e-4, "level %.3f: margin100 %.6f, want %.6f",
                      (double)got.levels[l], (double)got.margin100[l], w100);
    }
    /* Not all alike: a table of zeros or of the cap would pass nothing above by accident. */
    ck_assert(got.margin100[ENG_CALIB_LEVELS - 1] > got.margin10[0]);
    tartan_results_free(ref);
    free(S);
    free(best);
    free(in10);
    free(in100);
    free(top);
    free(taken);
    free(n10);
    free(n100);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

static Suite *adaptive_suite(void)
{
    Suite *s = suite_create("adaptive");
    TCase *tc = tcase_create("families");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_adaptive_default_recall_each_family, 0, 3);
    suite_add_tcase(s, tc);
    tc = tcase_create("margins_reference");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_adaptive_margins_reference, 0, 2);
    suite_add_tcase(s, tc);
    const struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"uses_calibration", test_adaptive_search_uses_calibration},
        {"full_equals_exhaustive", test_adaptive_full_equals_exhaustive},
        {"stale", test_adaptive_stale},
        {"damaged_record", test_adaptive_damaged_record},
        {"version1_record", test_adaptive_version1_record},
        {"too_few_candidates", test_adaptive_too_few_candidates},
        {"widens", test_adaptive_widens},
        {"recall_estimate", test_adaptive_recall_estimate},
        {"corpus_share", test_adaptive_corpus_share},
        {"docset_subset", test_adaptive_docset_subset},
        {"tail_need", test_adaptive_tail_need},
        {"bad_arguments", test_adaptive_bad_arguments},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(adaptive_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
