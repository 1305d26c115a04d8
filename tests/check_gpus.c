/*
 * check_gpus.c: the multi-GPU layer's split and merge (engine/gpus.h), on the CPU: every
 * partition searched by a CPU stand-in for the one-GPU search (the exhaustive scan, or exact
 * scoring of a subset, over the partition's reader), on real indexes in a fresh temporary
 * directory per test. The merged results must equal the unpartitioned search's exactly (ids
 * and scores bit for bit), with 1 to 7 partitions, through adds and deletes (the partitions'
 * counts kept up incrementally and recounted), with subsets, and with more partitions than
 * documents; the plan's options and variables are checked. The GPU itself is
 * tests/check_gpus_gpu.c's.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "fixture.h"
#include "gpus.h"
#include "search.h"
#include "tartan.h"

enum { DIM = 32, NQ = 9, LQ = 6, K = 10 };

/* Adds n random documents named prefix0 .. prefixN-1 (4 to 20 tokens each, clustered). */
static void add_random(tartan_db *db, size_t n, const char *prefix)
{
    size_t *lens = xmalloc(n * sizeof *lens), rows = 0;
    char **ids = xmalloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        lens[i] = 4 + rnd() % 17;
        rows += lens[i];
        ids[i] = xmalloc(32);
        snprintf(ids[i], 32, "%s%zu", prefix, i);
    }
    float *emb = xmalloc(rows * DIM * sizeof *emb);
    for (size_t r = 0; r < rows; r++) {
        int topic = (int)(rnd() % 8);
        for (size_t j = 0; j < DIM; j++)
            emb[r * DIM + j] = (float)((j % 8 == (size_t)topic ? 2.0 : 0.0) + gauss());
    }
    tartan_batch b = {n, (const char *const *)ids, lens, emb, rows, DIM, TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    for (size_t i = 0; i < n; i++)
        free(ids[i]);
    free(ids);
    free(lens);
    free(emb);
}

static tartan_db *open_ix(void)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = 16;
    tartan_db *db;
    ck_assert_msg(tartan_open(ixpath, &o, &db) == 0, "%s", tartan_errmsg(NULL));
    return db;
}

/* A prepared search of NQ random queries, k K, over reader r's snapshot. */
typedef struct prep {
    eng_queries q;
    eng_search s;
    float *raw;
} prep;

static void prep_make(prep *p, const idx_reader *r)
{
    memset(p, 0, sizeof *p);
    p->raw = xmalloc(NQ * LQ * DIM * sizeof(float));
    for (size_t i = 0; i < NQ * LQ * DIM; i++)
        p->raw[i] = (float)gauss();
    tartan_queries tq = {NQ, NULL, LQ, p->raw, NQ * LQ, DIM, TARTAN_FLOAT32};
    store_msg m;
    ck_assert_int_eq(eng_queries_prepare(&tq, DIM, &p->q, &m), 0);
    p->s.q = &p->q;
    p->s.k = K;
    p->s.n_docnos = r->h.next_docno;
    p->s.ndocs = p->s.ndocs_exact = K;
    p->s.hit_doc = xmalloc(NQ * K * sizeof *p->s.hit_doc);
    p->s.hit_score = xmalloc(NQ * K * sizeof *p->s.hit_score);
    p->s.hit_n = xmalloc(NQ * sizeof *p->s.hit_n);
    /* Poisoned: every result the layer reports must be written by it. */
    for (size_t i = 0; i < NQ * K; i++) {
        p->s.hit_doc[i] = 0xdeadbeef;
        p->s.hit_score[i] = NAN;
    }
    for (size_t i = 0; i < NQ; i++)
        p->s.hit_n[i] = 12345;
}

static void prep_free(prep *p)
{
    eng_queries_free(&p->q);
    free(p->s.hit_doc);
    free(p->s.hit_score);
    free(p->s.hit_n);
    free(p->raw);
}

/* The CPU stand-in for one partition's GPU search. It checks that the layer hands each
 * partition the same state slot every time and a reader whose counts are its documents'. */
static void *slot_of[16];
static int calls;
/* Split by queries: every call is a copy of the whole index; the queries the copies saw. */
static int copies;
static size_t queries_seen;

static int cpu_part(eng_gpu **g, idx_reader *r, const eng_search *s, int exhaustive,
                    tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m)
{
    calls++;
    queries_seen += s->q->n;
    if (copies) {
        ck_assert_uint_le(r->part_n, 1);
        ck_assert_uint_gt(s->q->n, 0);
    } else {
        ck_assert_uint_gt(r->part_n, 1);
    }
    if (!copies && r->part_i < 16) {
        if (!slot_of[r->part_i])
            slot_of[r->part_i] = g;
        ck_assert_ptr_eq(slot_of[r->part_i], g);
    }
    /* The reader shows exactly the partition's documents, and its header counts them. */
    store_cursor *cur = NULL;
    uint32_t d;
    kern_pdoc pd;
    uint64_t n = 0, t = 0;
    int rc;
    while ((rc = idx_reader_next_doc(r, &cur, &d, &pd, m)) == 1) {
        if (!copies)
            ck_assert_uint_eq(d % r->part_n, r->part_i);
        n++;
        t += pd.ntok;
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(n, r->h.n_docs);
    ck_assert_uint_eq(t, r->h.n_tokens);
    if (exhaustive && !s->subset_exact)
        return eng_exact_scan(r, s, 1, st, m);
    eng_plaid_ws *ws = eng_plaid_ws_new();
    for (size_t i = 0; i < s->q->n && !rc; i++)
        rc = eng_plaid_query(r, s, i, ws, st, m);
    eng_plaid_ws_free(ws);
    return rc;
}

/* A stand-in that also makes a real mirror for its partition (eng_gpu_search_held allocates it
 * before it loads; without a GPU the load fails and the mirror stays empty), so that remaking
 * the partitions frees mirrors; then the CPU stand-in gives the hits. */
static int mirror_part(eng_gpu **g, idx_reader *r, const eng_search *s, int exhaustive,
                       tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m)
{
    store_msg scratch;
    eng_stage_stats ignored = {0};
    (void)eng_gpu_search_held(g, r, s, exhaustive, mode, &ignored, &scratch);
    ck_assert_ptr_nonnull(*g);
    return cpu_part(g, r, s, exhaustive, mode, st, m);
}

static eng_part_search_fn part_fn = cpu_part;

/* The unpartitioned reference: the same search over the whole reader. */
static void reference(idx_reader *r, const prep *p, int exhaustive, uint32_t *doc, float *score,
                      size_t *n)
{
    eng_search s = p->s;
    s.hit_doc = doc;
    s.hit_score = score;
    s.hit_n = n;
    eng_stage_stats st = {0};
    store_msg m;
    int rc;
    if (exhaustive && !s.subset_exact) {
        rc = eng_exact_scan(r, &s, 1, &st, &m);
    } else {
        eng_plaid_ws *ws = eng_plaid_ws_new();
        rc = 0;
        for (size_t i = 0; i < NQ && !rc; i++)
            rc = eng_plaid_query(r, &s, i, ws, &st, &m);
        eng_plaid_ws_free(ws);
    }
    ck_assert_msg(rc == 0, "reference: %s", m.text);
}

/* Runs the layer with n_parts partitions and compares with the reference. */
static void run_and_compare(tartan_db *db, eng_gpus **g, int n_parts, int exhaustive,
                            const uint64_t *allowed, const uint32_t *list, size_t n_list)
{
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    prep p;
    prep_make(&p, &r);
    if (allowed) {
        p.s.allowed = allowed;
        p.s.allowed_list = list;
        p.s.n_allowed = n_list;
        p.s.subset_exact = 1;
    }
    eng_stage_stats st = {0};
    queries_seen = 0;
    int rc = eng_gpus_run(g, db->env, &r, &p.s, exhaustive, TARTAN_GPU_RESIDENT, n_parts, 1, copies,
                          part_fn, &st, &m);
    ck_assert_msg(rc == 0, "%d partitions: %s", n_parts, m.text);
    uint32_t *rd = xmalloc(NQ * K * sizeof *rd);
    float *rs = xmalloc(NQ * K * sizeof *rs);
    size_t *rn = xmalloc(NQ * sizeof *rn);
    reference(&r, &p, exhaustive, rd, rs, rn);
    for (size_t i = 0; i < NQ; i++) {
        ck_assert_msg(p.s.hit_n[i] == rn[i], "%d partitions, query %zu: %zu hits, reference %zu",
                      n_parts, i, p.s.hit_n[i], rn[i]);
        for (size_t j = 0; j < rn[i]; j++) {
            ck_assert_msg(p.s.hit_doc[i * K + j] == rd[i * K + j],
                          "%d partitions, query %zu, hit %zu: document %u, reference %u", n_parts,
                          i, j, p.s.hit_doc[i * K + j], rd[i * K + j]);
            ck_assert(p.s.hit_score[i * K + j] == rs[i * K + j]);
        }
    }
    if (copies) {
        /* Every query searched once, by one copy. */
        ck_assert_uint_eq(queries_seen, NQ);
        free(rd);
        free(rs);
        free(rn);
        prep_free(&p);
        idx_reader_close(&r);
        return;
    }
    /* The partitions' counts: live documents by number modulo n_parts. */
    uint64_t want[16] = {0};
    store_cursor *cur = NULL;
    uint32_t d;
    kern_pdoc pd;
    while ((rc = idx_reader_next_doc(&r, &cur, &d, &pd, &m)) == 1)
        want[d % (uint32_t)n_parts]++;
    for (int q = 0; q < n_parts && q < 16; q++)
        ck_assert_uint_eq(eng_gpus_part_docs(*g, q), want[q]);
    free(rd);
    free(rs);
    free(rn);
    prep_free(&p);
    idx_reader_close(&r);
}

START_TEST(test_gpus_exhaustive_equals_one)
{
    rng_state = 101;
    tartan_db *db = open_ix();
    add_random(db, 240, "a");
    for (int np = 2; np <= 7; np++) {
        eng_gpus *g = NULL;
        memset(slot_of, 0, sizeof slot_of);
        calls = 0;
        run_and_compare(db, &g, np, 1, NULL, NULL, 0);
        ck_assert_int_eq(calls, np);
        eng_gpus_free(g);
    }
    tartan_close(db);
}
END_TEST

/* One partitioned state through adds (counted incrementally), deletes (recounted), and a change
 * of the number of partitions (remade). */
START_TEST(test_gpus_follow_changes)
{
    rng_state = 202;
    tartan_db *db = open_ix();
    add_random(db, 150, "a");
    eng_gpus *g = NULL;
    memset(slot_of, 0, sizeof slot_of);
    run_and_compare(db, &g, 3, 1, NULL, NULL, 0);
    add_random(db, 70, "b");
    run_and_compare(db, &g, 3, 1, NULL, NULL, 0);
    char name[16];
    const char *del[40];
    char names[40][16];
    for (int i = 0; i < 40; i++) {
        snprintf(names[i], sizeof names[i], "%c%d", i % 2 ? 'a' : 'b', i % 2 ? i * 3 : i);
        del[i] = names[i];
    }
    size_t nd = 0;
    ck_assert_int_eq(tartan_delete(db, del, 40, &nd), 0);
    ck_assert_uint_eq(nd, 40);
    run_and_compare(db, &g, 3, 1, NULL, NULL, 0);
    /* Adds and deletes between two searches. */
    add_random(db, 30, "c");
    snprintf(name, sizeof name, "a1");
    const char *one[1] = {name};
    ck_assert_int_eq(tartan_delete(db, one, 1, &nd), 0);
    run_and_compare(db, &g, 3, 1, NULL, NULL, 0);
    memset(slot_of, 0, sizeof slot_of);
    run_and_compare(db, &g, 4, 1, NULL, NULL, 0);
    eng_gpus_free(g);
    tartan_close(db);
}
END_TEST

/* A subset scored exactly: each partition scores its own part of the list. */
/* Remaking the partitions (their number changed) inside a search that holds the GPU lock, as
 * tartan_search does: freeing the old partitions' mirrors must not take the lock again. */
START_TEST(test_gpus_remade_under_lock)
{
    rng_state = 252;
    tartan_db *db = open_ix();
    add_random(db, 120, "a");
    eng_gpus *g = NULL;
    part_fn = mirror_part;
    eng_gpu_lock();
    for (int np = 2; np <= 4; np++) {
        memset(slot_of, 0, sizeof slot_of);
        run_and_compare(db, &g, np, 1, NULL, NULL, 0);
    }
    eng_gpu_unlock();
    part_fn = cpu_part;
    eng_gpus_free(g);
    tartan_close(db);
}
END_TEST

/* A subset of db's documents: every step-th number from first, at most 60 (*bits and list; the
 * caller frees *bits). Returns how many. */
static size_t subset_every(tartan_db *db, uint32_t first, uint32_t step, uint64_t **bits,
                           uint32_t list[60])
{
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t next = r.h.next_docno;
    idx_reader_close(&r);
    *bits = calloc((next + 63) / 64, 8);
    ck_assert_ptr_nonnull(*bits);
    size_t n = 0;
    for (uint32_t d = first; d < next && n < 60; d += step) {
        (*bits)[d / 64] |= 1ull << (d % 64);
        list[n++] = d;
    }
    return n;
}

START_TEST(test_gpus_subset)
{
    rng_state = 303;
    tartan_db *db = open_ix();
    add_random(db, 200, "a");
    uint64_t *bits;
    uint32_t list[60];
    size_t n = subset_every(db, 3, 3, &bits, list);
    eng_gpus *g = NULL;
    memset(slot_of, 0, sizeof slot_of);
    run_and_compare(db, &g, 3, 0, bits, list, n);
    run_and_compare(db, &g, 3, 1, bits, list, n);
    eng_gpus_free(g);
    free(bits);
    tartan_close(db);
}
END_TEST

/* More partitions than documents: the empty ones give nothing and are not searched. */
START_TEST(test_gpus_more_parts_than_docs)
{
    rng_state = 404;
    tartan_db *db = open_ix();
    add_random(db, 5, "a");
    eng_gpus *g = NULL;
    memset(slot_of, 0, sizeof slot_of);
    calls = 0;
    run_and_compare(db, &g, 9, 1, NULL, NULL, 0);
    ck_assert_int_eq(calls, 5);
    eng_gpus_free(g);
    tartan_close(db);
}
END_TEST

/* Split by queries: each copy searches its share of the queries over the whole index, the
 * hits written in place (the poisoned slots all overwritten) equal one device's, PLAID,
 * exhaustive and a subset, with 1 to 12 copies (more copies than queries: the extra ones are
 * not called), through adds and deletes. */
START_TEST(test_gpus_copies)
{
    rng_state = 505;
    tartan_db *db = open_ix();
    add_random(db, 180, "a");
    copies = 1;
    for (int np = 1; np <= 12; np++) {
        eng_gpus *g = NULL;
        for (int exhaustive = 0; exhaustive <= 1; exhaustive++) {
            calls = 0;
            run_and_compare(db, &g, np, exhaustive, NULL, NULL, 0);
            ck_assert_int_eq(calls, np < NQ ? np : NQ);
        }
        eng_gpus_free(g);
    }
    eng_gpus *g = NULL;
    run_and_compare(db, &g, 4, 0, NULL, NULL, 0);
    add_random(db, 40, "b");
    const char *del[3] = {"a3", "a77", "b5"};
    size_t nd = 0;
    ck_assert_int_eq(tartan_delete(db, del, 3, &nd), 0);
    ck_assert_uint_eq(nd, 3);
    run_and_compare(db, &g, 4, 0, NULL, NULL, 0);
    run_and_compare(db, &g, 4, 1, NULL, NULL, 0);
    uint64_t *bits;
    uint32_t list[60];
    size_t n = subset_every(db, 2, 4, &bits, list);
    run_and_compare(db, &g, 3, 0, bits, list, n);
    run_and_compare(db, &g, 3, 1, bits, list, n);
    free(bits);
    eng_gpus_free(g);
    copies = 0;
    tartan_close(db);
}
END_TEST

START_TEST(test_gpus_plan)
{
    tartan_db *db = open_ix();
    store_msg m;
    int np = 0, nd = 0, rep = -1;
    unsetenv("TARTAN_GPU_DEVICES");
    unsetenv("TARTAN_GPU_PARTITIONS");
    unsetenv("TARTAN_GPU_SPLIT");
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), 0);
    ck_assert_int_eq(np, 1);
    ck_assert_int_eq(nd, 1);
    setenv("TARTAN_GPU_PARTITIONS", "4", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), 0);
    ck_assert_int_eq(np, 4);
    ck_assert_int_le(nd, 4);
    ck_assert_int_ge(nd, 1);
    ck_assert_int_le(nd, kern_cuda_device_count() > 1 ? kern_cuda_device_count() : 1);
    setenv("TARTAN_GPU_PARTITIONS", "0", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(m.text, "TARTAN_GPU_PARTITIONS"));
    setenv("TARTAN_GPU_PARTITIONS", "2x", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), TARTAN_EINVAL);
    unsetenv("TARTAN_GPU_PARTITIONS");
    setenv("TARTAN_GPU_DEVICES", "some", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(m.text, "TARTAN_GPU_DEVICES"));
    setenv("TARTAN_GPU_DEVICES", "all", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), 0);
    ck_assert_int_eq(np, nd);
    unsetenv("TARTAN_GPU_DEVICES");
    /* The split: documents without an index to size (auto), or as the variable says. */
    setenv("TARTAN_GPU_PARTITIONS", "3", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), 0);
    ck_assert_int_eq(rep, 0);
    setenv("TARTAN_GPU_SPLIT", "queries", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), 0);
    ck_assert_int_eq(rep, 1);
    ck_assert_int_eq(np, 3);
    setenv("TARTAN_GPU_SPLIT", "documents", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), 0);
    ck_assert_int_eq(rep, 0);
    setenv("TARTAN_GPU_SPLIT", "rows", 1);
    ck_assert_int_eq(eng_gpus_plan(db, NULL, &np, &nd, &rep, &m), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(m.text, "TARTAN_GPU_SPLIT"));
    unsetenv("TARTAN_GPU_SPLIT");
    unsetenv("TARTAN_GPU_PARTITIONS");
    tartan_close(db);
    /* The option: -1 and up; below is refused by tartan_open. */
    tartan_options o;
    tartan_options_init(&o);
    ck_assert_int_eq(o.gpu_devices, 0);
    o.gpu_devices = -2;
    tartan_db *x = NULL;
    ck_assert_int_eq(tartan_open(ixpath, &o, &x), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "gpu_devices"));
    tartan_options_init(&o);
    ck_assert_int_eq(o.gpu_split, TARTAN_GPU_SPLIT_AUTO);
    o.gpu_split = (tartan_gpu_split)3;
    ck_assert_int_eq(tartan_open(ixpath, &o, &x), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "gpu_split"));
    /* A bad plan fails the search itself with its message (on a machine with a GPU; without
     * one the search fails earlier, with TARTAN_ENODEV). */
    (void)x;
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"exhaustive_equals_one", test_gpus_exhaustive_equals_one, 0},
        {"follow_changes", test_gpus_follow_changes, 0},
        {"remade_under_lock", test_gpus_remade_under_lock, 0},
        {"subset", test_gpus_subset, 0},
        {"more_parts_than_docs", test_gpus_more_parts_than_docs, 0},
        {"copies", test_gpus_copies, 0},
        {"plan", test_gpus_plan, 0},
    };
    return FX_RUN("gpus", cases, FX_DIR, 0);
}
