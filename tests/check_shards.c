/*
 * check_shards.c: the library's pieces of a sharded index (tartan.h, "Shards") on real indexes
 * in a fresh temporary directory per test: a model exported from one index and imported into
 * others makes them encode and score exactly alike; exhaustive search over shards merged with
 * tartan_results_merge equals one index of the whole corpus; the merge against a brute-force
 * reference on random hits with duplicates and ties; tartan_shard_of's fixed values, spread
 * and consistency; and every bad model string refused with its code, the index left as it was.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "fixture.h"
#include "store.h"
#include "store_internal.h"
#include "tartan.h"

static void setup(void)
{
    fixture_dir_create("check-shards");
}

static void teardown(void)
{
    fixture_dir_remove();
}

/* ---- random clustered corpora ------------------------------------------------------------ */

enum { DIM = 32, NTOPIC = 40, NDOC = 300, LQ = 8, NQ = 12 };

/* NTOPIC topics, n_docs documents of 4 to 33 tokens (each value from one of the document's 3
 * topics) with noise 0.6, ids "d<i>". */
static void corpus_make(fx_corpus *c, size_t n_docs, uint64_t seed)
{
    fx_corpus_spec s = {DIM, n_docs, NTOPIC, 4, 33, 0.6, "d%zu", 0, 1};
    rng_state = seed;
    fx_corpus_make(c, &s);
}

/* nq queries of LQ tokens, each copying tokens of one random document plus noise 0.8. */
static float *make_queries(const fx_corpus *c, size_t nq)
{
    return fx_queries(c, nq, LQ, NULL, 0.8, NULL);
}

static tartan_db *open_at(const char *path, unsigned flags)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = flags;
    o.dim = DIM;
    o.n_centroids = 32;
    tartan_db *db = NULL;
    int rc = tartan_open(path, &o, &db);
    ck_assert_msg(rc == 0, "open %s: %s", path, tartan_errmsg(NULL));
    return db;
}

static char *sub(const char *name)
{
    char *p = xmalloc(strlen(tmpdir) + strlen(name) + 2);
    sprintf(p, "%s/%s", tmpdir, name);
    return p;
}

/* Adds the documents i of c with pick(i) true (pick NULL: all), in one batch. */
static void add_some(tartan_db *db, const fx_corpus *c, int (*pick)(size_t, void *), void *ctx)
{
    size_t n = 0, rows = 0;
    const char **ids = xmalloc(c->n_docs * sizeof *ids);
    size_t *lens = xmalloc(c->n_docs * sizeof *lens);
    float *emb = xmalloc(c->n_rows * DIM * sizeof *emb);
    for (size_t i = 0; i < c->n_docs; i++) {
        if (pick && !pick(i, ctx))
            continue;
        ids[n] = c->ids[i];
        lens[n] = c->doclens[i];
        memcpy(emb + rows * DIM, c->emb + c->offs[i] * DIM, c->doclens[i] * DIM * sizeof *emb);
        rows += c->doclens[i];
        n++;
    }
    if (n) {
        tartan_batch b = {n, ids, lens, emb, rows, DIM, TARTAN_FLOAT32};
        int rc = tartan_add(db, &b, 0);
        ck_assert_msg(rc == 0, "add: %s", tartan_errmsg(db));
    }
    free(ids);
    free(lens);
    free(emb);
}

static void train_on_all(tartan_db *db, const fx_corpus *c)
{
    tartan_batch b = {c->n_docs, NULL, c->doclens, c->emb, c->n_rows, DIM, TARTAN_FLOAT32};
    int rc = tartan_train(db, &b, c->n_rows);
    ck_assert_msg(rc == 0, "train: %s", tartan_errmsg(db));
}

static tartan_results *search_ok(tartan_db *db, const float *q, size_t nq, size_t k, int exh)
{
    tartan_queries x = {nq, NULL, LQ, q, nq * LQ, DIM, TARTAN_FLOAT32};
    tartan_search_params p;
    tartan_search_params_init(&p, k);
    p.exhaustive = exh;
    tartan_results *r = NULL;
    int rc = tartan_search(db, &x, &p, &r);
    ck_assert_msg(rc == 0, "search: %s", tartan_errmsg(db));
    return r;
}

static uint32_t n_shards_of_test;
static int in_shard(size_t i, void *ctx)
{
    const fx_corpus *c = ((void **)ctx)[0];
    uint32_t s = *(uint32_t *)((void **)ctx)[1];
    return tartan_shard_of(c->ids[i], n_shards_of_test) == s;
}

/* ---- model export and import ------------------------------------------------------------- */

/* An index trained by import encodes every document exactly as the index the model came from:
 * same ids, bit-identical scores, in PLAID and exhaustive search. */
START_TEST(test_shards_model_import_same_scores)
{
    fx_corpus c;
    corpus_make(&c, NDOC, 11);
    char *pa = sub("a"), *pb = sub("b");
    tartan_db *a = open_at(pa, TARTAN_CREATE);
    train_on_all(a, &c);
    void *model = NULL;
    size_t len = 0;
    ck_assert_int_eq(tartan_model_export(a, &model, &len), 0);
    /* At least the centroid table (32 rows of DIM fp16 values, format 2). */
    ck_assert_uint_gt(len, 32 * DIM * sizeof(uint16_t));
    /* A different nbits at creation: the model's replaces it. */
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.nbits = 4;
    tartan_db *b = NULL;
    ck_assert_int_eq(tartan_open(pb, &o, &b), 0);
    ck_assert_msg(tartan_model_import(b, model, len) == 0, "%s", tartan_errmsg(b));
    /* The same model again: nothing changes, no error. */
    ck_assert_msg(tartan_model_import(b, model, len) == 0, "%s", tartan_errmsg(b));
    tartan_index_info ia, ib;
    ck_assert_int_eq(tartan_info(a, &ia), 0);
    ck_assert_int_eq(tartan_info(b, &ib), 0);
    ck_assert_uint_eq(ib.nbits, ia.nbits);
    ck_assert_uint_eq(ib.n_centroids, ia.n_centroids);
    ck_assert_uint_eq(ib.n_docs, 0);
    add_some(a, &c, NULL, NULL);
    add_some(b, &c, NULL, NULL);
    /* The second export is byte-identical to the first (documents are not part of it). */
    void *model2 = NULL;
    size_t len2 = 0;
    ck_assert_int_eq(tartan_model_export(b, &model2, &len2), 0);
    ck_assert_uint_eq(len2, len);
    ck_assert(memcmp(model, model2, len) == 0);
    float *q = make_queries(&c, NQ);
    for (int exh = 0; exh < 2; exh++) {
        tartan_results *ra = search_ok(a, q, NQ, 10, exh), *rb = search_ok(b, q, NQ, 10, exh);
        ck_assert_uint_eq(ra->offsets[NQ], rb->offsets[NQ]);
        for (size_t h = 0; h < ra->offsets[NQ]; h++) {
            ck_assert_str_eq(ra->hits[h].id, rb->hits[h].id);
            ck_assert(ra->hits[h].score == rb->hits[h].score);
        }
        tartan_results_free(ra);
        tartan_results_free(rb);
    }
    size_t np = 1;
    ck_assert_int_eq(tartan_check(b, NULL, NULL, &np), 0);
    ck_assert_uint_eq(np, 0);
    tartan_free(model);
    tartan_free(model2);
    free(q);
    tartan_close(a);
    tartan_close(b);
    free(pa);
    free(pb);
    fx_corpus_free(&c);
}
END_TEST

/* Model records travel generically: a meta record a later codec might add goes along; the
 * records that describe one index (its calibration) stay. */
typedef struct rec_ctx {
    const char *name;
    const char *value;
} rec_ctx;

static int put_meta(store_txn *txn, void *vctx, store_msg *m)
{
    const rec_ctx *r = vctx;
    if (!store_meta_is_local(r->name, strlen(r->name)))
        return store_model_record_put(txn, STORE_DB_META, r->name, strlen(r->name), r->value,
                                      strlen(r->value), m);
    /* A local record is its owner's to write; the model's writer refuses it. The test writes
     * it straight into LMDB, as its owner would. */
    ck_assert_int_eq(store_model_record_put(txn, STORE_DB_META, r->name, strlen(r->name), r->value,
                                            strlen(r->value), m),
                     TARTAN_EINVAL);
    MDB_val k = {strlen(r->name), (void *)r->name}, d = {strlen(r->value), (void *)r->value};
    ck_assert_int_eq(mdb_put(txn->st_txn, txn->st_gen->g_meta, &k, &d, 0), 0);
    return 0;
}

static int get_meta(store_env *env, const char *name, char *out, size_t cap)
{
    store_txn *txn;
    store_msg m;
    ck_assert_int_eq(store_read_begin(env, &txn, &m), 0);
    const void *v;
    size_t vl;
    int rc = store_model_record_get(txn, STORE_DB_META, name, strlen(name), &v, &vl, &m);
    if (!rc) {
        ck_assert_uint_lt(vl, cap);
        memcpy(out, v, vl);
        out[vl] = 0;
    }
    store_read_end(env, txn);
    return rc;
}

START_TEST(test_shards_model_records_generic)
{
    fx_corpus c;
    corpus_make(&c, 120, 5);
    char *pa = sub("a"), *pb = sub("b");
    tartan_db *a = open_at(pa, TARTAN_CREATE);
    train_on_all(a, &c);
    store_msg m;
    rec_ctx extra = {"codec-extension-test", "rotation 1 2 3"};
    rec_ctx cal = {"calibration", "never travels"};
    ck_assert_int_eq(store_write(a->env, put_meta, &extra, &m), 0);
    ck_assert_int_eq(store_write(a->env, put_meta, &cal, &m), 0);
    void *model;
    size_t len;
    ck_assert_int_eq(tartan_model_export(a, &model, &len), 0);
    /* Neither the header nor a local record is in the string; the extension is. */
    ck_assert_ptr_null(memmem(model, len, "calibration", 11));
    ck_assert_ptr_null(memmem(model, len, "header", 6));
    ck_assert_ptr_nonnull(memmem(model, len, "codec-extension-test", 20));
    tartan_db *b = open_at(pb, TARTAN_CREATE);
    ck_assert_int_eq(tartan_model_import(b, model, len), 0);
    char got[64];
    ck_assert_int_eq(get_meta(b->env, "codec-extension-test", got, sizeof got), 0);
    ck_assert_str_eq(got, "rotation 1 2 3");
    ck_assert_int_eq(get_meta(b->env, "calibration", got, sizeof got), TARTAN_ENOTFOUND);
    tartan_free(model);
    tartan_close(a);
    tartan_close(b);
    free(pa);
    free(pb);
    fx_corpus_free(&c);
}
END_TEST

/* Each bad string gets its own code, and the index stays untrained and usable. */
START_TEST(test_shards_model_import_refused)
{
    fx_corpus c;
    corpus_make(&c, 120, 9);
    char *pa = sub("a"), *pb = sub("b"), *pc = sub("c"), *pd = sub("d");
    tartan_db *a = open_at(pa, TARTAN_CREATE);
    void *model = NULL;
    size_t len = 7;
    ck_assert_int_eq(tartan_model_export(a, &model, &len), TARTAN_ENOTTRAINED);
    ck_assert_ptr_null(model);
    ck_assert_uint_eq(len, 0);
    train_on_all(a, &c);
    ck_assert_int_eq(tartan_model_export(a, &model, &len), 0);
    tartan_db *b = open_at(pb, TARTAN_CREATE);
    uint8_t *bad = xmalloc(len);

    ck_assert_int_eq(tartan_model_import(NULL, model, len), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_model_import(b, NULL, len), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_model_export(a, NULL, &len), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_model_import(b, "not a model at all, just text.......", 36),
                     TARTAN_EFORMAT);
    ck_assert_int_eq(tartan_model_import(b, model, 10), TARTAN_EFORMAT);
    ck_assert_int_eq(tartan_model_import(b, model, len - 1), TARTAN_ETRUNC);
    /* A flipped bit anywhere: the checksum catches it. */
    for (int trial = 0; trial < 20; trial++) {
        memcpy(bad, model, len);
        size_t at = 8 + rnd() % (len - 8);
        if (at >= 56 && at < 64)
            at = 70; /* the length field: caught as truncation, tested above */
        bad[at] ^= (uint8_t)(1u << (rnd() % 8));
        int rc = tartan_model_import(b, bad, len);
        ck_assert_msg(rc == TARTAN_ECORRUPT, "byte %zu: %s", at, tartan_errmsg(b));
    }
    /* Another layout version with a valid checksum. */
    memcpy(bad, model, len);
    bad[8] = 99;
    uint32_t crc = store_crc32c(0, bad, len - 4);
    memcpy(bad + len - 4, &crc, 4);
    ck_assert_int_eq(tartan_model_import(b, bad, len), TARTAN_EVERSION);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(b), "version 99"));
    /* Records running past the end, with a valid checksum. */
    memcpy(bad, model, len);
    uint64_t huge = 1ull << 40;
    memcpy(bad + 64 + 8, &huge, 8);
    crc = store_crc32c(0, bad, len - 4);
    memcpy(bad + len - 4, &crc, 4);
    ck_assert_int_eq(tartan_model_import(b, bad, len), TARTAN_ECORRUPT);

    /* Another dimension. */
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM * 2;
    tartan_db *cdb = NULL;
    ck_assert_int_eq(tartan_open(pc, &o, &cdb), 0);
    ck_assert_int_eq(tartan_model_import(cdb, model, len), TARTAN_EDIM);
    tartan_close(cdb);

    /* Read-only. */
    tartan_close(b);
    b = open_at(pb, TARTAN_READONLY);
    ck_assert_int_eq(tartan_model_import(b, model, len), TARTAN_EREADONLY);
    tartan_close(b);

    /* Nothing of the above changed b: still untrained, and a good import still works. */
    b = open_at(pb, 0);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(b, &info), 0);
    ck_assert_uint_eq(info.n_centroids, 0);
    ck_assert_int_eq(tartan_model_import(b, model, len), 0);

    /* An index trained with another model refuses, and keeps its own. */
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = 16;
    tartan_db *d = NULL;
    ck_assert_int_eq(tartan_open(pd, &o, &d), 0);
    train_on_all(d, &c);
    ck_assert_int_eq(tartan_model_import(d, model, len), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_info(d, &info), 0);
    ck_assert_uint_eq(info.n_centroids, 16);
    /* So does an index with documents but another model. */
    add_some(d, &c, NULL, NULL);
    ck_assert_int_eq(tartan_model_import(d, model, len), TARTAN_EINVAL);
    size_t np = 1;
    ck_assert_int_eq(tartan_check(d, NULL, NULL, &np), 0);

    free(bad);
    tartan_free(model);
    tartan_close(a);
    tartan_close(b);
    tartan_close(d);
    free(pa);
    free(pb);
    free(pc);
    free(pd);
    fx_corpus_free(&c);
}
END_TEST

/* ---- shards end to end in one process ---------------------------------------------------- */

/* Three shards with the whole index's model, documents routed by tartan_shard_of: exhaustive
 * search merged equals the whole index's (ids exactly, scores bit for bit); PLAID merged finds
 * at least as much of the exhaustive top 10 as the whole index's PLAID. */
START_TEST(test_shards_merge_equals_single_index)
{
    enum { P = 3, K = 10 };
    fx_corpus c;
    corpus_make(&c, NDOC, 21);
    char *pa = sub("all");
    tartan_db *all = open_at(pa, TARTAN_CREATE);
    train_on_all(all, &c);
    add_some(all, &c, NULL, NULL);
    void *model;
    size_t len;
    ck_assert_int_eq(tartan_model_export(all, &model, &len), 0);
    tartan_db *sh[P];
    char *ps[P];
    n_shards_of_test = P;
    size_t docs = 0;
    for (uint32_t s = 0; s < P; s++) {
        char name[16];
        snprintf(name, sizeof name, "shard%u", s);
        ps[s] = sub(name);
        sh[s] = open_at(ps[s], TARTAN_CREATE);
        ck_assert_int_eq(tartan_model_import(sh[s], model, len), 0);
        void *ctx[2] = {&c, &s};
        add_some(sh[s], &c, in_shard, ctx);
        tartan_index_info in;
        ck_assert_int_eq(tartan_info(sh[s], &in), 0);
        ck_assert_uint_gt(in.n_docs, NDOC / P / 2); /* the hash spreads them */
        docs += in.n_docs;
    }
    ck_assert_uint_eq(docs, NDOC);
    float *q = make_queries(&c, NQ);
    double found_single = 0, found_shards = 0;
    tartan_results *ref = search_ok(all, q, NQ, K, 1);
    for (int exh = 1; exh >= 0; exh--) {
        tartan_results *part[P], *merged = NULL;
        for (int s = 0; s < P; s++)
            part[s] = search_ok(sh[s], q, NQ, K, exh);
        ck_assert_int_eq(tartan_results_merge((const tartan_results *const *)part, P, K, &merged),
                         0);
        ck_assert_uint_eq(merged->n_queries, NQ);
        if (exh) {
            ck_assert_uint_eq(merged->offsets[NQ], ref->offsets[NQ]);
            for (size_t h = 0; h < ref->offsets[NQ]; h++) {
                ck_assert_str_eq(merged->hits[h].id, ref->hits[h].id);
                ck_assert_msg(merged->hits[h].score == ref->hits[h].score, "hit %zu: %.9g %.9g", h,
                              merged->hits[h].score, ref->hits[h].score);
            }
        } else {
            tartan_results *single = search_ok(all, q, NQ, K, 0);
            for (size_t i = 0; i < NQ; i++)
                for (size_t j = 0; j < ref->counts[i]; j++) {
                    const char *id = ref->hits[ref->offsets[i] + j].id;
                    for (size_t x = 0; x < single->counts[i]; x++)
                        found_single += !strcmp(single->hits[single->offsets[i] + x].id, id);
                    for (size_t x = 0; x < merged->counts[i]; x++)
                        found_shards += !strcmp(merged->hits[merged->offsets[i] + x].id, id);
                }
            tartan_results_free(single);
        }
        tartan_results_free(merged);
        for (int s = 0; s < P; s++)
            tartan_results_free(part[s]);
    }
    ck_assert_msg(found_shards >= found_single, "recall of shards %g < single %g", found_shards,
                  found_single);
    tartan_results_free(ref);
    for (int s = 0; s < P; s++) {
        tartan_close(sh[s]);
        free(ps[s]);
    }
    tartan_free(model);
    free(q);
    tartan_close(all);
    free(pa);
    fx_corpus_free(&c);
}
END_TEST

/* ---- tartan_results_merge against a brute force ----------------------------------------- */

/* A caller-built result set, as a process that received hits over the network builds one. */
typedef struct built {
    tartan_results r;
    size_t *counts, *offsets;
    tartan_hit *hits;
} built;

static char id_pool[40][8];

static void build_part(built *b, size_t nq, size_t maxhits)
{
    b->counts = xmalloc(nq * sizeof(size_t));
    b->offsets = xmalloc((nq + 1) * sizeof(size_t));
    b->hits = xmalloc(nq * maxhits * sizeof(tartan_hit));
    size_t h = 0;
    for (size_t i = 0; i < nq; i++) {
        b->offsets[i] = h;
        b->counts[i] = rnd() % (maxhits + 1);
        for (size_t j = 0; j < b->counts[i]; j++, h++) {
            b->hits[h].id = id_pool[rnd() % 40];
            /* Few distinct scores: many ties, within and across parts. */
            b->hits[h].score = (float)(rnd() % 12) * 0.25f - 1.0f;
        }
    }
    b->offsets[nq] = h;
    memset(&b->r, 0, sizeof b->r);
    b->r.n_queries = nq;
    b->r.counts = b->counts;
    b->r.offsets = b->offsets;
    b->r.hits = b->hits;
    b->r.stats.seconds_total = unif();
    b->r.stats.n_exact = rnd() % 100;
    b->r.stats.n_probes = rnd() % 1000;
    b->r.stats.n_damaged = rnd() % 3;
    b->r.stats.probe_margin = rnd() % 4 ? (float)unif() * 0.1f : -1.f; /* -1: fixed ncells */
    b->r.stats.rerank_z = (float)unif() * 4;
}

static void free_part(built *b)
{
    free(b->counts);
    free(b->offsets);
    free(b->hits);
}

START_TEST(test_shards_merge_brute_force)
{
    rng_state = 77;
    for (int i = 0; i < 40; i++)
        snprintf(id_pool[i], sizeof id_pool[i], "id%02d", (i * 7) % 40);
    enum { NQM = 9 };
    for (int trial = 0; trial < 200; trial++) {
        size_t np = 1 + rnd() % 4, k = 1 + rnd() % 12;
        built parts[4];
        const tartan_results *pp[4];
        for (size_t p = 0; p < np; p++) {
            build_part(&parts[p], NQM, 1 + rnd() % 15);
            pp[p] = &parts[p].r;
        }
        tartan_results *out = (tartan_results *)0x1;
        ck_assert_int_eq(tartan_results_merge(pp, np, k, &out), 0);
        ck_assert_uint_eq(out->n_queries, NQM);
        double total_s = 0;
        uint64_t exact = 0, probes = 0, damaged = 0;
        float margin = -INFINITY, z = -INFINITY;
        for (size_t p = 0; p < np; p++) {
            if (pp[p]->stats.seconds_total > total_s)
                total_s = pp[p]->stats.seconds_total;
            exact += pp[p]->stats.n_exact;
            probes += pp[p]->stats.n_probes;
            damaged += pp[p]->stats.n_damaged;
            margin = fmaxf(margin, pp[p]->stats.probe_margin);
            z = fmaxf(z, pp[p]->stats.rerank_z);
        }
        ck_assert(out->stats.seconds_total == total_s);
        ck_assert_uint_eq(out->stats.n_exact, exact);
        ck_assert_uint_eq(out->stats.n_probes, probes);
        ck_assert_uint_eq(out->stats.n_damaged, damaged);
        ck_assert(out->stats.probe_margin == margin);
        ck_assert(out->stats.rerank_z == z);
        for (size_t i = 0; i < NQM; i++) {
            /* Reference: each pool id's best score over all parts (-inf: absent); then repeatedly
             * the best (score, then smallest id) not yet taken. */
            double best[40];
            for (int x = 0; x < 40; x++)
                best[x] = -INFINITY;
            size_t distinct = 0;
            for (size_t p = 0; p < np; p++)
                for (size_t j = 0; j < pp[p]->counts[i]; j++) {
                    const tartan_hit *h = &pp[p]->hits[pp[p]->offsets[i] + j];
                    int x = (int)((h->id - id_pool[0]) / sizeof id_pool[0]);
                    if (best[x] == -INFINITY)
                        distinct++;
                    if (h->score > best[x])
                        best[x] = h->score;
                }
            size_t want = distinct < k ? distinct : k;
            ck_assert_uint_eq(out->counts[i], want);
            for (size_t j = 0; j < want; j++) {
                int pick = -1;
                for (int x = 0; x < 40; x++) {
                    if (best[x] == -INFINITY)
                        continue;
                    if (pick < 0 || best[x] > best[pick] ||
                        (best[x] == best[pick] && strcmp(id_pool[x], id_pool[pick]) < 0))
                        pick = x;
                }
                const tartan_hit *h = &out->hits[out->offsets[i] + j];
                ck_assert_str_eq(h->id, id_pool[pick]);
                ck_assert(h->score == (float)best[pick]);
                ck_assert_ptr_ne(h->id, id_pool[pick]); /* a copy, not the part's pointer */
                best[pick] = -INFINITY;
            }
        }
        /* The parts' order does not matter. */
        if (np > 1) {
            const tartan_results *rev[4];
            for (size_t p = 0; p < np; p++)
                rev[p] = pp[np - 1 - p];
            tartan_results *out2;
            ck_assert_int_eq(tartan_results_merge(rev, np, k, &out2), 0);
            ck_assert_uint_eq(out2->offsets[NQM], out->offsets[NQM]);
            for (size_t h = 0; h < out->offsets[NQM]; h++) {
                ck_assert_str_eq(out2->hits[h].id, out->hits[h].id);
                ck_assert(out2->hits[h].score == out->hits[h].score);
            }
            tartan_results_free(out2);
        }
        /* A merged result merges again (idempotent). */
        tartan_results *again;
        const tartan_results *one[1] = {out};
        ck_assert_int_eq(tartan_results_merge(one, 1, k, &again), 0);
        ck_assert_uint_eq(again->offsets[NQM], out->offsets[NQM]);
        tartan_results_free(again);
        tartan_results_free(out);
        for (size_t p = 0; p < np; p++)
            free_part(&parts[p]);
    }
}
END_TEST

START_TEST(test_shards_merge_refused)
{
    rng_state = 3;
    for (int i = 0; i < 40; i++)
        snprintf(id_pool[i], sizeof id_pool[i], "id%02d", i);
    built a, b;
    build_part(&a, 4, 5);
    build_part(&b, 5, 5);
    const tartan_results *pp[2] = {&a.r, &b.r};
    tartan_results *out = (tartan_results *)0x1;
    ck_assert_int_eq(tartan_results_merge(pp, 2, 10, NULL), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_results_merge(pp, 2, 10, &out), TARTAN_EINVAL);
    ck_assert_ptr_null(out);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "part 1 has 5 queries"));
    ck_assert_int_eq(tartan_results_merge(NULL, 2, 10, &out), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_results_merge(pp, 0, 10, &out), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_results_merge(pp, 1, 0, &out), TARTAN_ERANGE);
    ck_assert_int_eq(tartan_results_merge(pp, 1, TARTAN_MAX_K + 1, &out), TARTAN_ERANGE);
    const tartan_results *withnull[2] = {&a.r, NULL};
    ck_assert_int_eq(tartan_results_merge(withnull, 2, 10, &out), TARTAN_EINVAL);
    /* Offsets past the hits. */
    a.offsets[4] = 1;
    a.counts[0] = 3;
    a.offsets[0] = 0;
    ck_assert_int_eq(tartan_results_merge(pp, 1, 10, &out), TARTAN_EINVAL);
    free_part(&a);
    build_part(&a, 4, 5);
    /* A NaN score, a NULL id. */
    size_t q = 0;
    while (a.counts[q] == 0)
        q++;
    a.hits[a.offsets[q]].score = NAN;
    ck_assert_int_eq(tartan_results_merge(pp, 1, 10, &out), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "NaN"));
    a.hits[a.offsets[q]].score = 1;
    a.hits[a.offsets[q]].id = NULL;
    ck_assert_int_eq(tartan_results_merge(pp, 1, 10, &out), TARTAN_EINVAL);
    ck_assert_ptr_null(out);
    free_part(&a);
    free_part(&b);
}
END_TEST

/* ---- tartan_shard_of ---------------------------------------------------------------------- */

/* Values of the documented algorithm, computed independently (Python's integers and floats)
 * when the function was written: an id must go to the same shard in every later version. */
START_TEST(test_shards_shard_of_fixed)
{
    static const struct {
        const char *id;
        uint32_t s[5];
    } v[] = {
        {"doc-0", {0, 0, 0, 929, 1287982923u}}, {"doc-1", {0, 0, 6, 277, 3677509282u}},
        {"a", {1, 2, 2, 163, 2664725428u}},     {"MED-10", {0, 2, 4, 323, 2009015309u}},
        {"4983", {0, 0, 5, 696, 4148866546u}},  {"0", {0, 0, 6, 274, 3383607634u}},
        {"1", {1, 2, 2, 595, 3298397554u}},     {"h\xc3\xa9llo", {1, 1, 4, 962, 1595711555u}},
    };
    static const uint32_t n[5] = {2, 3, 7, 1000, 4294967295u};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        for (int j = 0; j < 5; j++)
            ck_assert_msg(tartan_shard_of(v[i].id, n[j]) == v[i].s[j], "'%s' of %u: %u, not %u",
                          v[i].id, n[j], tartan_shard_of(v[i].id, n[j]), v[i].s[j]);
    char long_id[512];
    memset(long_id, 'x', 511);
    long_id[511] = 0;
    ck_assert_uint_eq(tartan_shard_of(long_id, 1000), 475);
    ck_assert_uint_eq(tartan_shard_of(NULL, 5), 0);
    ck_assert_uint_eq(tartan_shard_of("x", 0), 0);
    ck_assert_uint_eq(tartan_shard_of("x", 1), 0);
}
END_TEST

/* Spread (each of n shards gets its share within 5 standard deviations) and consistency
 * (going from n to n + 1 shards, an id stays or moves to the new shard, never elsewhere). */
START_TEST(test_shards_shard_of_spread)
{
    enum { N = 60000 };
    char id[32];
    for (uint32_t n = 2; n <= 9; n++) {
        size_t cnt[10] = {0}, moved = 0;
        for (size_t i = 0; i < N; i++) {
            snprintf(id, sizeof id, "doc-%zu", i * 7919 % 1000003);
            uint32_t s = tartan_shard_of(id, n), s1 = tartan_shard_of(id, n + 1);
            ck_assert_uint_lt(s, n);
            cnt[s]++;
            ck_assert_msg(s1 == s || s1 == n, "'%s': %u of %u, then %u of %u", id, s, n, s1, n + 1);
            moved += s1 != s;
        }
        double mean = (double)N / n, sd = sqrt(N * (1.0 / n) * (1 - 1.0 / n));
        for (uint32_t s = 0; s < n; s++)
            ck_assert_msg(fabs((double)cnt[s] - mean) < 5 * sd, "shard %u of %u: %zu ids", s, n,
                          cnt[s]);
        double msd = sqrt(N * (1.0 / (n + 1)) * (1 - 1.0 / (n + 1)));
        ck_assert_msg(fabs((double)moved - (double)N / (n + 1)) < 5 * msd, "%zu moved", moved);
    }
}
END_TEST

static Suite *shards_suite(void)
{
    Suite *s = suite_create("shards");
    struct {
        const char *name;
        const TTest *t;
        int fixture;
    } cases[] = {
        {"model_import_same_scores", test_shards_model_import_same_scores, 1},
        {"model_records_generic", test_shards_model_records_generic, 1},
        {"model_import_refused", test_shards_model_import_refused, 1},
        {"merge_equals_single_index", test_shards_merge_equals_single_index, 1},
        {"merge_brute_force", test_shards_merge_brute_force, 0},
        {"merge_refused", test_shards_merge_refused, 0},
        {"shard_of_fixed", test_shards_shard_of_fixed, 0},
        {"shard_of_spread", test_shards_shard_of_spread, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        if (cases[i].fixture)
            tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, cases[i].t);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(shards_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
