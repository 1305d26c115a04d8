/*
 * check_redundancy.c: what keeps one flipped byte from costing an index its answers where
 * nothing else holds the information (storage/FORMAT.md): the second copies of the codec tables
 * and the centroid table, read when the primary is damaged and restored from by a repair, and
 * LMDB's two meta pages, whose transaction ids carry no checksum and are checked against
 * tartan's commit record. Each test builds a real index, damages data.mdb in the file, and
 * compares every answer (exhaustive search over every document) with the undamaged index's.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <lmdb.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "damage.h"
#include "fixture.h"
#include "tartan.h"

#define DIM 16
#define K 8
#define NDOCS 60
#define NQ 3
#define QLEN 2

static void setup(void)
{
    fixture_dir_create("check-redundancy");
}

static void teardown(void)
{
    fixture_dir_remove();
}

/* An index of NDOCS random documents in two batches, then a few deleted: several commits, so
 * that both meta pages name a snapshot of the index. */
static void build_codec(const char *path, unsigned codec)
{
    rng_state = 4242;
    static char idb[NDOCS][16];
    const char *idp[NDOCS];
    size_t lens[NDOCS], rows = 0;
    for (int i = 0; i < NDOCS; i++) {
        snprintf(idb[i], sizeof idb[i], "d%d", i);
        idp[i] = idb[i];
        lens[i] = 1 + rnd() % 6;
        rows += lens[i];
    }
    float *emb = malloc(rows * DIM * sizeof *emb);
    for (size_t i = 0; i < rows * DIM; i++)
        emb[i] = (float)gauss();
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = K;
    o.codec = codec;
    tartan_db *db;
    ck_assert_int_eq(tartan_open(path, &o, &db), 0);
    size_t half = 0;
    for (int i = 0; i < NDOCS / 2; i++)
        half += lens[i];
    tartan_batch a = {NDOCS / 2, idp, lens, emb, half, DIM, TARTAN_FLOAT32};
    tartan_batch b = {NDOCS - NDOCS / 2, idp + NDOCS / 2, lens + NDOCS / 2,
                      emb + half * DIM,  rows - half,     DIM,
                      TARTAN_FLOAT32};
    const char *del[] = {"d3", "d40"};
    ck_assert_int_eq(tartan_add(db, &a, 0), 0);
    ck_assert_int_eq(tartan_add(db, &b, 0), 0);
    ck_assert_int_eq(tartan_delete(db, del, 2, NULL), 0);
    tartan_close(db);
    free(emb);
}

static void build(const char *path)
{
    build_codec(path, TARTAN_CODEC_SCALAR);
}

/* Every query's exhaustive ranking of every document, as "id:score" lines; NULL when the
 * search fails (*rc says how). */
static char *answers(tartan_db *db, int *rc)
{
    uint64_t s = rng_state;
    rng_state = 7;
    float q[NQ * QLEN * DIM];
    for (int i = 0; i < NQ * QLEN * DIM; i++)
        q[i] = (float)gauss();
    rng_state = s;
    tartan_queries qs = {NQ, NULL, QLEN, q, NQ * QLEN, DIM, TARTAN_FLOAT32};
    tartan_search_params p;
    tartan_search_params_init(&p, NDOCS);
    p.exhaustive = 1;
    p.threads = 1;
    p.device = TARTAN_DEVICE_CPU;
    tartan_results *res;
    if ((*rc = tartan_search(db, &qs, &p, &res)))
        return NULL;
    size_t cap = 64 * NQ * NDOCS, len = 0;
    char *out = malloc(cap);
    out[0] = 0;
    for (size_t i = 0; i < NQ; i++)
        for (size_t j = 0; j < res->counts[i]; j++)
            len += (size_t)snprintf(out + len, cap - len, "%zu %s:%.9g\n", i,
                                    res->hits[res->offsets[i] + j].id,
                                    (double)res->hits[res->offsets[i] + j].score);
    tartan_results_free(res);
    return out;
}

static char *answers_of(const char *path)
{
    tartan_db *db;
    ck_assert_int_eq(tartan_open(path, NULL, &db), 0);
    int rc;
    char *a = answers(db, &rc);
    ck_assert_msg(a != NULL, "search: %s", tartan_errmsg(db));
    tartan_close(db);
    return a;
}

typedef struct seen {
    int n;
    char kinds[512];
    char text[2048];
} seen;

static int note(void *ctx, const char *kind, const char *message)
{
    seen *s = ctx;
    s->n++;
    size_t kl = strlen(s->kinds), tl = strlen(s->text);
    snprintf(s->kinds + kl, sizeof s->kinds - kl, "%s ", kind);
    snprintf(s->text + tl, sizeof s->text - tl, "%s\n", message);
    return 0;
}

/* Where a record lies in data.mdb: db "meta" (key a name) or "centroids" (key a u32). */
static long record_offset(const char *path, const char *db, const void *key, size_t klen,
                          size_t *size)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    ck_assert_int_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 8);
    ck_assert_int_eq(mdb_env_open(env, path, MDB_RDONLY, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    ck_assert_int_eq(mdb_dbi_open(txn, db, strcmp(db, "meta") ? MDB_INTEGERKEY : 0, &dbi), 0);
    MDB_val k = {klen, (void *)key}, d;
    long off = -1;
    if (mdb_get(txn, dbi, &k, &d) == 0) {
        MDB_envinfo info;
        mdb_env_info(env, &info);
        /* The map mirrors the file page for page: a leaf page's own number says where. */
        MDB_stat st;
        mdb_env_stat(env, &st);
        uintptr_t page = (uintptr_t)d.mv_data & ~(uintptr_t)(st.ms_psize - 1);
        uint64_t pgno;
        memcpy(&pgno, (const void *)page, 8);
        off = (long)(pgno * st.ms_psize + ((uintptr_t)d.mv_data - page));
        *size = d.mv_size;
    }
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return off;
}

/* Flips one byte in the middle of a record (its data, past any header). */
static void damage_record_at(const char *path, const char *db, const void *key, size_t klen)
{
    size_t size = 0;
    long off = record_offset(path, db, key, klen, &size);
    ck_assert_msg(off >= 0, "record not found in '%s'", db);
    damage_flip(path, off + (long)(size / 2), 0x10);
}

static void restore(const char *from, const char *to)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -a '%s' '%s'", to, from, to);
    ck_assert_int_eq(system(cmd), 0);
}

/* The damaged index: searches answer as before (from the copy); check reports the damage
 * naming which copy (want_kind and a phrase of the message); a repair leaves a sound index
 * answering as before. */
static void damaged_then_repaired(const char *want, const char *kind, const char *phrase)
{
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    int rc;
    char *got = answers(db, &rc);
    ck_assert_msg(got != NULL, "search over a damaged primary: %s", tartan_errmsg(db));
    ck_assert_str_eq(got, want);
    free(got);
    seen s = {0, "", ""};
    size_t np;
    ck_assert_int_eq(tartan_check(db, note, &s, &np), TARTAN_ECORRUPT);
    ck_assert_msg(strstr(s.kinds, kind) && strstr(s.text, phrase), "check said: %s", s.text);
    size_t removed;
    ck_assert_int_eq(tartan_repair(db, NULL, NULL, &removed), 0);
    ck_assert_uint_eq(removed, 0);
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    got = answers(db, &rc);
    ck_assert_ptr_nonnull(got);
    ck_assert_str_eq(got, want);
    free(got);
    tartan_close(db);
}

START_TEST(test_redundancy_codec_copy)
{
    build(ixpath);
    char *want = answers_of(ixpath);
    char pristine[400];
    snprintf(pristine, sizeof pristine, "%s/pristine", tmpdir);
    restore(ixpath, pristine);
    damage_record_at(ixpath, "meta", "codec", 5);
    damaged_then_repaired(want, "codec", "its copy ('codec.copy') is sound");
    restore(pristine, ixpath);
    damage_record_at(ixpath, "meta", "codec.copy", 10);
    damaged_then_repaired(want, "codec", "the primary is sound");
    free(want);
}
END_TEST

START_TEST(test_redundancy_axes_code)
{
    /* The axes code is stored once and cannot be derived: damaged, check reports it, a search
     * refuses (TARTAN_ECORRUPT) rather than decode with the scalar tables, and a repair
     * refuses too, changing nothing (the index still reports the same damage). */
    build_codec(ixpath, TARTAN_CODEC_AXES);
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    int rc;
    char *want = answers(db, &rc);
    ck_assert_ptr_nonnull(want);
    size_t np;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    tartan_close(db);
    damage_record_at(ixpath, "meta", "codec.axes", 10);
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    seen s = {0, "", ""};
    ck_assert_int_eq(tartan_check(db, note, &s, &np), TARTAN_ECORRUPT);
    ck_assert_msg(strstr(s.text, "codec.axes"), "check said: %s", s.text);
    char *got = answers(db, &rc);
    ck_assert_ptr_null(got);
    ck_assert_int_eq(rc, TARTAN_ECORRUPT);
    ck_assert_int_eq(tartan_repair(db, NULL, NULL, NULL), TARTAN_ECORRUPT);
    ck_assert_msg(strstr(tartan_errmsg(db), "codec.axes"), "repair said: %s", tartan_errmsg(db));
    size_t np2;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np2), TARTAN_ECORRUPT);
    ck_assert_uint_eq(np2, np);
    tartan_close(db);
    free(want);
}
END_TEST

START_TEST(test_redundancy_centroid_copy)
{
    build(ixpath);
    char *want = answers_of(ixpath);
    char pristine[400];
    snprintf(pristine, sizeof pristine, "%s/pristine", tmpdir);
    restore(ixpath, pristine);
    uint32_t k0 = 0, k1 = 1;
    damage_record_at(ixpath, "centroids", &k0, 4);
    damaged_then_repaired(want, "centroids", "its copy is sound");
    restore(pristine, ixpath);
    damage_record_at(ixpath, "centroids", &k1, 4);
    damaged_then_repaired(want, "centroids", "copy (key 1)");
    /* Both damaged: nothing to read the model from, and no repair. */
    restore(pristine, ixpath);
    damage_record_at(ixpath, "centroids", &k0, 4);
    damage_record_at(ixpath, "centroids", &k1, 4);
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    int rc;
    ck_assert_ptr_null(answers(db, &rc));
    ck_assert_int_eq(rc, TARTAN_ECORRUPT);
    ck_assert_int_eq(tartan_repair(db, NULL, NULL, NULL), TARTAN_ECORRUPT);
    tartan_close(db);
    free(want);
}
END_TEST

/* An index written before the copies and the commit record (format 2 all the same): opens,
 * checks and answers as it is; a compaction adds what it lacks. */
START_TEST(test_redundancy_older_index)
{
    build(ixpath);
    char *want = answers_of(ixpath);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi meta, cent;
    ck_assert_int_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 8);
    ck_assert_int_eq(mdb_env_open(env, ixpath, 0, 0644), 0);
    /* Two commits, so that neither of LMDB's snapshots holds what is removed. */
    for (int pass = 0; pass < 2; pass++) {
        ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
        ck_assert_int_eq(mdb_dbi_open(txn, "meta", 0, &meta), 0);
        ck_assert_int_eq(mdb_dbi_open(txn, "centroids", MDB_INTEGERKEY, &cent), 0);
        uint32_t k1 = 1;
        MDB_val kc = {10, "codec.copy"}, km = {6, "commit"}, kk = {4, &k1}, kh = {6, "header"}, d;
        if (pass == 0) {
            ck_assert_int_eq(mdb_del(txn, meta, &kc, NULL), 0);
            ck_assert_int_eq(mdb_del(txn, meta, &km, NULL), 0);
            ck_assert_int_eq(mdb_del(txn, cent, &kk, NULL), 0);
        } else {
            ck_assert_int_eq(mdb_get(txn, meta, &kh, &d), 0);
            char hb[128];
            memcpy(hb, d.mv_data, d.mv_size);
            d.mv_data = hb;
            ck_assert_int_eq(mdb_put(txn, meta, &kh, &d, 0), 0);
        }
        ck_assert_int_eq(mdb_txn_commit(txn), 0);
    }
    mdb_env_close(env);
    size_t size;
    uint32_t k1 = 1;
    ck_assert_int_lt(record_offset(ixpath, "centroids", &k1, 4, &size), 0);
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    size_t np;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    int rc;
    char *got = answers(db, &rc);
    ck_assert_ptr_nonnull(got);
    ck_assert_str_eq(got, want);
    free(got);
    ck_assert_int_eq(tartan_compact(db), 0);
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    tartan_close(db);
    ck_assert_int_ge(record_offset(ixpath, "centroids", &k1, 4, &size), 0);
    ck_assert_int_ge(record_offset(ixpath, "meta", "codec.copy", 10, &size), 0);
    ck_assert_int_ge(record_offset(ixpath, "meta", "commit", 6, &size), 0);
    free(want);
}
END_TEST

/* The model string leaves the copies out; importing it writes them. */
START_TEST(test_redundancy_model_import)
{
    build(ixpath);
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    void *model;
    size_t mlen;
    ck_assert_int_eq(tartan_model_export(db, &model, &mlen), 0);
    tartan_close(db);
    char other[400];
    snprintf(other, sizeof other, "%s/other", tmpdir);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    ck_assert_int_eq(tartan_open(other, &o, &db), 0);
    ck_assert_int_eq(tartan_model_import(db, model, mlen), 0);
    size_t np;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    void *again;
    size_t alen;
    ck_assert_int_eq(tartan_model_export(db, &again, &alen), 0);
    ck_assert_uint_eq(alen, mlen);
    ck_assert_int_eq(memcmp(again, model, mlen), 0);
    tartan_close(db);
    size_t s0, s1;
    uint32_t k0 = 0, k1 = 1;
    ck_assert_int_ge(record_offset(other, "centroids", &k0, 4, &s0), 0);
    ck_assert_int_ge(record_offset(other, "centroids", &k1, 4, &s1), 0);
    ck_assert_uint_eq(s0, s1);
    ck_assert_int_ge(record_offset(other, "meta", "codec.copy", 10, &s1), 0);
    tartan_free(model);
    tartan_free(again);
}
END_TEST

/* One bit of either meta page's transaction id: never an older state's answer (searches
 * refuse), tartan check reports it, and a repair rewrites the index from the newest
 * snapshot, answering as before. */
START_TEST(test_redundancy_meta_txnids)
{
    build(ixpath);
    char *want = answers_of(ixpath);
    char pristine[400];
    snprintf(pristine, sizeof pristine, "%s/pristine", tmpdir);
    restore(ixpath, pristine);
    static const struct {
        int byte;
        uint8_t mask;
    } bits[] = {{0, 0x01}, {0, 0x02}, {0, 0x04}, {0, 0x08}, {2, 0x01}, {5, 0x02}, {7, 0x80}};
    long psize = 4096;
    for (int page = 0; page < 2; page++) {
        for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
            restore(pristine, ixpath);
            damage_flip(ixpath, page * psize + 144 + bits[i].byte, bits[i].mask);
            tartan_db *db;
            ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
            int rc;
            char *got = answers(db, &rc);
            ck_assert_msg(got == NULL && rc == TARTAN_ECORRUPT,
                          "page %d byte %d mask %02x: the search %s", page, bits[i].byte,
                          bits[i].mask, got ? "answered" : "failed otherwise");
            ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "check --repair"));
            seen s = {0, "", ""};
            size_t np;
            ck_assert_int_eq(tartan_check(db, note, &s, &np), TARTAN_ECORRUPT);
            ck_assert_ptr_nonnull(strstr(s.kinds, "lmdb"));
            ck_assert_msg(tartan_repair(db, NULL, NULL, NULL) == 0, "page %d byte %d: %s", page,
                          bits[i].byte, tartan_errmsg(db));
            ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
            got = answers(db, &rc);
            ck_assert_ptr_nonnull(got);
            ck_assert_str_eq(got, want);
            free(got);
            tartan_close(db);
            /* And the repaired index takes changes again. */
            ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
            const char *del[] = {"d7"};
            ck_assert_int_eq(tartan_delete(db, del, 1, NULL), 0);
            ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
            tartan_close(db);
        }
    }
    free(want);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("redundancy");
    struct {
        const char *name;
        const TTest *t;
    } tests[] = {
        {"codec_copy", test_redundancy_codec_copy},
        {"axes_code", test_redundancy_axes_code},
        {"centroid_copy", test_redundancy_centroid_copy},
        {"older_index", test_redundancy_older_index},
        {"model_import", test_redundancy_model_import},
        {"meta_txnids", test_redundancy_meta_txnids},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, tests[i].t);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
