/*
 * check_compact.c: rewriting an index whole (storage/rewrite.c): tartan_compact gives the free
 * pages back and keeps every document, id and answer; searches running beside it, in this
 * process and in another one holding a snapshot, never fail nor change; a handle opened before
 * a compaction writes into the new index, never the replaced file; tartan_repair salvages
 * damaged indexes (the kept documents answering as before, the removed ones reported with
 * their ids); searches with skip_damaged leave damaged documents out.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "damage.h"
#include "db.h"
#include "fixture.h"
#include "store.h"
#include "store_internal.h"
#include "tartan.h"

#define DIM 32
#define K 32
#define NQ 6
#define QLEN 4
#define TOPK 400 /* deep enough to hold every document: answers compare whole rankings */

/* Adds n documents "p-first".."p-(first+n-1)" of 1..lmax random tokens. */
static void add_docs(tartan_db *db, const char *p, int first, int n, int lmax)
{
    char(*idb)[24] = malloc((size_t)n * sizeof *idb);
    const char **idp = malloc((size_t)n * sizeof *idp);
    size_t *lens = malloc((size_t)n * sizeof *lens), rows = 0;
    for (int i = 0; i < n; i++) {
        snprintf(idb[i], sizeof idb[i], "%s-%d", p, first + i);
        idp[i] = idb[i];
        lens[i] = 1 + rnd() % lmax;
        rows += lens[i];
    }
    float *emb = malloc(rows * DIM * sizeof *emb);
    for (size_t i = 0; i < rows * DIM; i++)
        emb[i] = (float)gauss();
    tartan_batch b = {(size_t)n, idp, lens, emb, rows, DIM, TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    free(emb);
    free(lens);
    free(idp);
    free(idb);
}

static tartan_db *create(uint64_t seed)
{
    rng_state = seed;
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = K;
    o.seed = seed;
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    return db;
}

/* Deletes every document "p-i" whose i % mod is in [0, keep_below). */
static size_t delete_some(tartan_db *db, const char *p, int n, int mod, int below)
{
    char(*idb)[24] = malloc((size_t)n * sizeof *idb);
    const char **idp = malloc((size_t)n * sizeof *idp);
    size_t k = 0, got;
    for (int i = 0; i < n; i++)
        if (i % mod < below) {
            snprintf(idb[k], sizeof idb[k], "%s-%d", p, i);
            idp[k] = idb[k];
            k++;
        }
    ck_assert_int_eq(tartan_delete(db, idp, k, &got), 0);
    free(idb);
    free(idp);
    return got;
}

/* The whole exhaustive ranking and the PLAID top 10 of NQ fixed random queries. */
typedef struct answers {
    char id[2][NQ][TOPK][24];
    float score[2][NQ][TOPK];
    size_t n[2][NQ];
} answers;

static float queries[NQ * QLEN * DIM];

static void make_queries(void)
{
    uint64_t s = rng_state;
    rng_state = 4242;
    for (int i = 0; i < NQ * QLEN * DIM; i++)
        queries[i] = (float)gauss();
    rng_state = s;
}

/* 0, or the search's error. skip: skip_damaged; *damaged: its count. */
static int answer(tartan_db *db, answers *a, int skip, uint64_t *damaged)
{
    tartan_queries qs = {NQ, NULL, QLEN, queries, NQ * QLEN, DIM, TARTAN_FLOAT32};
    memset(a, 0, sizeof *a);
    if (damaged)
        *damaged = 0;
    for (int e = 0; e < 2; e++) {
        tartan_search_params p;
        tartan_search_params_init(&p, e ? TOPK : 10);
        p.exhaustive = e;
        p.threads = 1;
        p.skip_damaged = skip;
        tartan_results *res;
        int rc = tartan_search(db, &qs, &p, &res);
        if (rc)
            return rc;
        for (int i = 0; i < NQ; i++) {
            a->n[e][i] = res->counts[i];
            for (size_t j = 0; j < res->counts[i]; j++) {
                snprintf(a->id[e][i][j], 24, "%s", res->hits[res->offsets[i] + j].id);
                a->score[e][i][j] = res->hits[res->offsets[i] + j].score;
            }
        }
        if (damaged)
            *damaged += res->stats.n_damaged;
        tartan_results_free(res);
    }
    return 0;
}

static int same_answers(const answers *a, const answers *b)
{
    return !memcmp(a, b, sizeof *a);
}

/* The exhaustive rankings of a, without the ids in gone[ngone], are b's. */
static void same_without(const answers *a, const answers *b, char gone[][24], int ngone)
{
    for (int i = 0; i < NQ; i++) {
        size_t j = 0;
        for (size_t x = 0; x < a->n[1][i]; x++) {
            int skip = 0;
            for (int g = 0; g < ngone; g++)
                skip |= !strcmp(a->id[1][i][x], gone[g]);
            if (skip)
                continue;
            ck_assert_msg(j < b->n[1][i], "query %d: fewer results", i);
            ck_assert_str_eq(a->id[1][i][x], b->id[1][i][j]);
            ck_assert(a->score[1][i][x] == b->score[1][i][j]);
            j++;
        }
        ck_assert_uint_eq(j, b->n[1][i]);
    }
}

static int no_leftovers(void)
{
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".compact-") != NULL;
    closedir(d);
    return n == 0;
}

START_TEST(test_compact_gives_space_back)
{
    tartan_db *db = create(1701);
    make_queries();
    add_docs(db, "a", 0, 150, 30);
    add_docs(db, "b", 0, 150, 30);
    ck_assert_uint_eq(delete_some(db, "a", 150, 10, 4), 60);
    add_docs(db, "c", 0, 30, 30);
    answers before, after;
    ck_assert_int_eq(answer(db, &before, 0, NULL), 0);
    tartan_index_info i0, i1, i2;
    ck_assert_int_eq(tartan_info(db, &i0), 0);
    ck_assert_int_eq(tartan_compact(db), 0);
    ck_assert_int_eq(tartan_info(db, &i1), 0);
    ck_assert(no_leftovers());
    ck_assert_uint_eq(i1.n_docs, i0.n_docs);
    ck_assert_uint_eq(i1.n_tokens, i0.n_tokens);
    ck_assert_uint_eq(i1.ivf_entries, i0.ivf_entries);
    ck_assert_msg(i1.bytes_file < i0.bytes_file, "%llu -> %llu bytes",
                  (unsigned long long)i0.bytes_file, (unsigned long long)i1.bytes_file);
    /* No free page left but the few LMDB keeps for its own bookkeeping. */
    ck_assert_uint_le(i1.bytes_free, 4 * 4096);
    ck_assert_int_eq(answer(db, &after, 0, NULL), 0);
    ck_assert(same_answers(&before, &after));
    size_t np;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    /* Again: nothing left to give back. */
    ck_assert_int_eq(tartan_compact(db), 0);
    ck_assert_int_eq(tartan_info(db, &i2), 0);
    ck_assert_uint_le(i2.bytes_file, i1.bytes_file + 4096);
    /* And the compacted index takes changes. */
    add_docs(db, "d", 0, 20, 30);
    ck_assert_uint_eq(delete_some(db, "b", 150, 2, 1), 75);
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    tartan_close(db);
}
END_TEST

/* ---- compaction beside searches of the same handle -------------------------------------- */

typedef struct reader_ctx {
    tartan_db *db;
    const answers *want;
    atomic_int *stop;
    int searches;
    char failure[256];
} reader_ctx;

static void *reader_main(void *vctx)
{
    reader_ctx *c = vctx;
    answers *got = malloc(sizeof *got);
    while (!atomic_load(c->stop) && !c->failure[0]) {
        int rc = answer(c->db, got, 0, NULL);
        if (rc)
            snprintf(c->failure, sizeof c->failure, "search: %s", tartan_errmsg(c->db));
        else if (!same_answers(c->want, got))
            snprintf(c->failure, sizeof c->failure, "a search answered differently");
        c->searches++;
    }
    free(got);
    return NULL;
}

START_TEST(test_compact_beside_searches)
{
    tartan_db *db = create(1702);
    make_queries();
    add_docs(db, "a", 0, 200, 20);
    ck_assert_uint_eq(delete_some(db, "a", 200, 3, 1), 67);
    answers *want = malloc(sizeof *want);
    ck_assert_int_eq(answer(db, want, 0, NULL), 0);
    atomic_int stop = 0;
    enum { NR = 2 };
    reader_ctx rc[NR];
    pthread_t th[NR];
    for (int i = 0; i < NR; i++) {
        memset(&rc[i], 0, sizeof rc[i]);
        rc[i].db = db;
        rc[i].want = want;
        rc[i].stop = &stop;
        ck_assert_int_eq(pthread_create(&th[i], NULL, reader_main, &rc[i]), 0);
    }
    int compactions = 0;
    for (; compactions < 12; compactions++)
        ck_assert_msg(tartan_compact(db) == 0, "%s", tartan_errmsg(db));
    atomic_store(&stop, 1);
    int searches = 0;
    for (int i = 0; i < NR; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(!rc[i].failure[0], "reader %d: %s", i, rc[i].failure);
        searches += rc[i].searches;
    }
    ck_assert_int_gt(searches, 0);
    ck_assert(no_leftovers());
    size_t np;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    tartan_close(db);
    free(want);
}
END_TEST

/* ---- another process: a snapshot across the exchange, a write through an old handle ------ */

static void wait_byte(int fd)
{
    char b;
    ck_assert_int_eq(read(fd, &b, 1), 1);
}

static void send_byte(int fd)
{
    ck_assert_int_eq(write(fd, "x", 1), 1);
}

/* Child: opens the index, takes a snapshot, lets the parent compact, then reads every
 * document of its old snapshot, takes a new one, and adds a document through its handle. */
static int child_main(int to_parent, int from_parent)
{
    wait_byte(from_parent); /* the parent built the index */
    tartan_db *db;
    if (tartan_open(ixpath, NULL, &db))
        return 10;
    store_txn *t;
    store_msg m;
    if (store_read_begin(db->env, &t, &m))
        return 11;
    store_header h;
    if (store_header_get(t, &h, &m))
        return 12;
    ino_t ino = t->st_gen->g_ino;
    send_byte(to_parent);
    wait_byte(from_parent); /* the parent compacted */
    /* The old snapshot reads on, every record sound. */
    store_cursor *cur;
    if (store_docs_first(t, 1, &cur, &m))
        return 13;
    uint32_t docno;
    const void *rec;
    size_t size;
    uint64_t n = 0;
    int rc;
    while ((rc = store_docs_next(cur, &docno, &rec, &size, &m)) == 1) {
        store_doc d;
        if (store_doc_parse(docno, rec, size, h.code_bytes, h.token_bytes, 1, &d, &m))
            return 14;
        n++;
    }
    store_cursor_close(cur);
    if (rc || n != h.n_docs)
        return 15;
    store_read_end(db->env, t);
    /* A new snapshot reads the new environment. */
    if (store_read_begin(db->env, &t, &m))
        return 16;
    int moved = t->st_gen->g_ino != ino;
    store_read_end(db->env, t);
    if (!moved)
        return 17;
    /* A change through this handle lands in the index at the path. */
    rng_state = 99;
    add_docs(db, "child", 0, 1, 5);
    tartan_close(db);
    return 0;
}

START_TEST(test_compact_other_process)
{
    /* The child is forked before this process uses OpenMP (GNU OpenMP's threads do not
     * survive a fork). */
    int up[2], down[2];
    ck_assert_int_eq(pipe(up), 0);
    ck_assert_int_eq(pipe(down), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(child_main(up[1], down[0]));
    tartan_db *db = create(1703);
    add_docs(db, "a", 0, 80, 20);
    ck_assert_uint_eq(delete_some(db, "a", 80, 2, 1), 40);
    tartan_close(db);
    send_byte(down[1]);
    wait_byte(up[0]);
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    ck_assert_msg(tartan_compact(db) == 0, "%s", tartan_errmsg(db));
    tartan_close(db);
    send_byte(down[1]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d", status);
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 41); /* the child's document is there */
    tartan_search_params p;
    tartan_search_params_init(&p, 1);
    const char *only[] = {"child-0"};
    p.subset = only;
    p.n_subset = 1;
    float q[DIM];
    for (int i = 0; i < DIM; i++)
        q[i] = (float)gauss();
    tartan_queries qs = {1, NULL, 1, q, 1, DIM, TARTAN_FLOAT32};
    tartan_results *res;
    ck_assert_int_eq(tartan_search(db, &qs, &p, &res), 0);
    ck_assert_uint_eq(res->counts[0], 1);
    tartan_results_free(res);
    size_t np;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    tartan_close(db);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
}
END_TEST

/* ---- repair ------------------------------------------------------------------------------ */

typedef struct said {
    int n;
    char kind[64][16];
    char msg[64][256];
} said;

static int collect(void *ctx, const char *kind, const char *message)
{
    said *s = ctx;
    if (s->n < 64) {
        snprintf(s->kind[s->n], 16, "%s", kind);
        snprintf(s->msg[s->n], 256, "%s", message);
    }
    s->n++;
    return 0;
}

static int said_has(const said *s, const char *kind, const char *text)
{
    for (int i = 0; i < s->n && i < 64; i++)
        if (!strcmp(s->kind[i], kind) && (!text || strstr(s->msg[i], text)))
            return 1;
    return 0;
}

/* The file offset of byte at (< 0: from the end) of the record of document id, and of its
 * ids and names values. */
typedef struct where {
    long rec, ids, names;
    uint32_t docno;
} where;

static where locate(const char *id, long at)
{
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m), 0);
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    where w;
    ck_assert_int_eq(store_id_get(t, id, strlen(id), &w.docno, &m), 0);
    size_t size;
    const uint8_t *rec = damage_record(t, w.docno, &size);
    w.rec = damage_offset(t, rec + (at < 0 ? (long)size + at : at));
    MDB_val k = {strlen(id), (void *)id}, d;
    ck_assert_int_eq(mdb_get(t->st_txn, t->st_gen->g_ids, &k, &d), 0);
    w.ids = damage_offset(t, d.mv_data);
    unsigned key = w.docno;
    MDB_val nk = {4, &key};
    ck_assert_int_eq(mdb_get(t->st_txn, t->st_gen->g_names, &nk, &d), 0);
    w.names = damage_offset(t, d.mv_data);
    store_read_end(env, t);
    store_close(env);
    return w;
}

START_TEST(test_repair_salvages)
{
    tartan_db *db = create(1704);
    make_queries();
    add_docs(db, "a", 0, 160, 25);
    ck_assert_uint_eq(delete_some(db, "a", 160, 5, 1), 32);
    store_msg m = {{0}};
    /* A meta record of another layer: the search calibration, which default searches read. */
    ck_assert_msg(tartan_calibrate(db, NULL, NULL) == 0, "%s", tartan_errmsg(db));
    answers *before = malloc(sizeof *before), *after = malloc(sizeof *after);
    ck_assert_int_eq(answer(db, before, 0, NULL), 0);
    tartan_close(db);

    /* Three damaged records; an ids value and a names value of two other documents (their ids
     * survive in the other map); the calibration record; a byte of the header. */
    const char *victims[] = {"a-7", "a-81", "a-159"};
    for (int i = 0; i < 3; i++)
        damage_flip(ixpath, locate(victims[i], -2 - 9 * i).rec, 0x40);
    damage_flip(ixpath, locate("a-12", 0).ids + 1, 0x01);
    damage_flip(ixpath, locate("a-13", 0).names + 5, 0x08);
    {
        store_env *env;
        store_txn *t;
        ck_assert_int_eq(store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m), 0);
        ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
        const void *d;
        size_t len;
        ck_assert_int_eq(store_meta_get(t, "calibration", &d, &len, &m), 0);
        long cal = damage_offset(t, d);
        ck_assert_int_eq(store_meta_get(t, "header", &d, &len, &m), 0);
        long hdr = damage_offset(t, (const uint8_t *)d + 50);
        store_read_end(env, t);
        store_close(env);
        damage_flip(ixpath, cal + 3, 0x02);
        damage_flip(ixpath, hdr, 0x02); /* kmeans_iters: lost, rebuilt as the default */
    }
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    size_t np;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), TARTAN_ECORRUPT);
    said s = {0};
    size_t removed = 99;
    ck_assert_msg(tartan_repair(db, collect, &s, &removed) == 0, "%s", tartan_errmsg(db));
    ck_assert_uint_eq(removed, 3);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(said_has(&s, "removed", victims[i]), "no report of %s", victims[i]);
    ck_assert(said_has(&s, "dropped", "calibration"));
    ck_assert(said_has(&s, "rebuilt", "header"));
    ck_assert(no_leftovers());
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    /* The kept documents answer exactly as before; the removed ones are gone. */
    ck_assert_int_eq(answer(db, after, 0, NULL), 0);
    char gone[3][24];
    for (int i = 0; i < 3; i++)
        snprintf(gone[i], 24, "%s", victims[i]);
    same_without(before, after, gone, 3);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 160 - 32 - 3);
    /* Nothing left to repair; the repaired index takes changes. */
    s.n = 0;
    ck_assert_int_eq(tartan_repair(db, collect, &s, &removed), 0);
    ck_assert_uint_eq(removed, 0);
    ck_assert_int_eq(s.n, 0);
    add_docs(db, "z", 0, 5, 10);
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    tartan_close(db);
    free(before);
    free(after);
}
END_TEST

/* A damaged segment directory: its records are found by their own headers. */
START_TEST(test_repair_segment_directory)
{
    tartan_db *db = create(1705);
    make_queries();
    add_docs(db, "a", 0, 120, 25);
    answers *before = malloc(sizeof *before), *after = malloc(sizeof *after);
    ck_assert_int_eq(answer(db, before, 0, NULL), 0);
    tartan_close(db);
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m), 0);
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    MDB_cursor *c;
    MDB_val k, d;
    ck_assert_int_eq(mdb_cursor_open(t->st_txn, t->st_gen->g_docs, &c), 0);
    ck_assert_int_eq(mdb_cursor_get(c, &k, &d, MDB_FIRST), 0);
    uint32_t n;
    memcpy(&n, d.mv_data, 4);
    ck_assert_uint_gt(n, 2);
    long at = damage_offset(t, (const uint8_t *)d.mv_data + 8 + 8 * 2 + 4); /* an offset */
    mdb_cursor_close(c);
    store_read_end(env, t);
    store_close(env);
    damage_flip(ixpath, at, 0x80);
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    said s = {0};
    size_t removed = 99, np;
    ck_assert_msg(tartan_repair(db, collect, &s, &removed) == 0, "%s", tartan_errmsg(db));
    ck_assert_uint_eq(removed, 0);
    ck_assert(said_has(&s, "rebuilt", "directory"));
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    ck_assert_int_eq(answer(db, after, 0, NULL), 0);
    ck_assert(same_answers(before, after));
    tartan_close(db);
    free(before);
    free(after);
}
END_TEST

/* Damaged codec tables cannot be salvaged: nothing changes. Compaction refuses damage. */
START_TEST(test_repair_refuses_model_damage)
{
    tartan_db *db = create(1706);
    add_docs(db, "a", 0, 40, 10);
    tartan_close(db);
    where w = locate("a-3", -1);
    damage_flip(ixpath, w.rec, 0x01);
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    ck_assert_int_eq(tartan_compact(db), TARTAN_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "--repair"));
    tartan_close(db);
    damage_flip(ixpath, w.rec, 0x01);
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m), 0);
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    const void *d;
    size_t len;
    ck_assert_int_eq(store_meta_get(t, "codec", &d, &len, &m), 0);
    long at = damage_offset(t, d);
    /* The tables are stored twice (FORMAT.md): both copies damaged leave nothing to repair
     * from (one alone is repaired from the other: tests/check_redundancy.c). */
    ck_assert_int_eq(store_meta_get(t, "codec.copy", &d, &len, &m), 0);
    long at2 = damage_offset(t, d);
    store_read_end(env, t);
    store_close(env);
    damage_flip(ixpath, at + 2, 0x10);
    damage_flip(ixpath, at2 + 2, 0x10);
    long size0 = damage_file_size(ixpath);
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    size_t removed;
    ck_assert_int_eq(tartan_repair(db, NULL, NULL, &removed), TARTAN_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "codec"));
    tartan_close(db);
    ck_assert_int_eq(damage_file_size(ixpath), size0);
    ck_assert(no_leftovers());
}
END_TEST

/* ---- searches that skip damage ------------------------------------------------------------ */

START_TEST(test_search_skip_damaged)
{
    tartan_db *db = create(1707);
    make_queries();
    add_docs(db, "a", 0, 150, 25);
    answers *before = malloc(sizeof *before), *after = malloc(sizeof *after);
    ck_assert_int_eq(answer(db, before, 0, NULL), 0);
    tartan_close(db);
    /* The best document of query 0 (so PLAID meets it too) and another one. */
    char gone[2][24];
    snprintf(gone[0], 24, "%s", before->id[1][0][0]);
    snprintf(gone[1], 24, "%s", "a-77");
    if (!strcmp(gone[0], gone[1]))
        snprintf(gone[1], 24, "%s", "a-78");
    for (int i = 0; i < 2; i++)
        damage_flip(ixpath, locate(gone[i], -7).rec, 0x04);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    uint64_t damaged;
    ck_assert_int_eq(answer(db, after, 0, &damaged), TARTAN_ECORRUPT);
    ck_assert_int_eq(answer(db, after, 1, &damaged), 0);
    ck_assert_uint_ge(damaged, 2); /* the exhaustive scan meets both */
    same_without(before, after, gone, 2);
    for (int i = 0; i < NQ; i++)
        for (size_t j = 0; j < after->n[0][i]; j++)
            ck_assert(strcmp(after->id[0][i][j], gone[0]) && strcmp(after->id[0][i][j], gone[1]));
    tartan_close(db);
    free(before);
    free(after);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"gives_space_back", test_compact_gives_space_back, 0},
        {"beside_searches", test_compact_beside_searches, 0},
        {"other_process", test_compact_other_process, 0},
        {"repair_salvages", test_repair_salvages, 0},
        {"repair_segment_directory", test_repair_segment_directory, 0},
        {"repair_refuses_model_damage", test_repair_refuses_model_damage, 0},
        {"search_skip_damaged", test_search_skip_damaged, 0},
    };
    return FX_RUN("compact", cases, FX_DIR, 0);
}
