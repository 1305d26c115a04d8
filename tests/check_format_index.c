/*
 * check_format_index.c: index format version 2 on a real index: every record kind's checksum
 * caught for every flipped byte (in the file, as a disk would flip it), and version 1 indexes
 * refused, then converted with every document, id and score kept (or, damaged, not converted).
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
#include "kernels.h"
#include "store.h"
#include "store_internal.h"
#include "tartan.h"
#include "v1_index.h"
#include "verify.h"

/* ---- a real index ----------------------------------------------------------------------- */

#define DIM 32
#define K 16

static char id_store[400][16];
static const char *ids[400];

/* Builds ixpath with n documents of 1..lmax tokens (ids "doc-i"), K centroids, nbits 2, then
 * deletes every seventh document (numbers with holes, free pages). */
static void build_index(uint64_t seed, int n, int lmax)
{
    rng_state = seed;
    size_t *lens = malloc(n * sizeof *lens), rows = 0;
    for (int i = 0; i < n; i++) {
        snprintf(id_store[i], sizeof id_store[i], "doc-%d", i);
        ids[i] = id_store[i];
        lens[i] = 1 + rnd() % lmax;
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
    o.seed = seed;
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    /* In two batches: the second reopens the first's last segment. */
    size_t half_rows = 0;
    for (int i = 0; i < n / 2; i++)
        half_rows += lens[i];
    tartan_batch b = {(size_t)n / 2, ids, lens, emb, half_rows, DIM, TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    tartan_batch b2 = {(size_t)(n - n / 2), ids + n / 2, lens + n / 2,  emb + half_rows * DIM,
                       rows - half_rows,    DIM,         TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b2, 0) == 0, "%s", tartan_errmsg(db));
    const char *del[64];
    size_t nd = 0;
    for (int i = 3; i < n && nd < 64; i += 7)
        del[nd++] = ids[i];
    size_t got;
    ck_assert_int_eq(tartan_delete(db, del, nd, &got), 0);
    ck_assert_uint_eq(got, nd);
    tartan_close(db);
    free(emb);
    free(lens);
}

static int count_fn(void *ctx, const char *kind, const char *message)
{
    (void)kind;
    (void)message;
    ++*(int *)ctx;
    return 0;
}

/* Problems tartan_check finds in ixpath (-1 when the index does not even open). */
static int problems(void)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    tartan_db *db;
    if (tartan_open(ixpath, &o, &db))
        return -1;
    int n = 0;
    size_t np;
    int rc = tartan_check(db, count_fn, &n, &np);
    tartan_close(db);
    ck_assert(rc == 0 || rc == TARTAN_ECORRUPT);
    ck_assert_int_eq((int)np, n);
    return n;
}

/* ---- every record's checksum ------------------------------------------------------------- */

/* Where a record lies in the file, and how its own reader reacts to damage. */
typedef enum {
    R_FORMAT,
    R_HEADER,
    R_CODEC,
    R_CENTROIDS,
    R_SEGDIR,
    R_DOC,
    R_BLOCK,
    R_ID,
    R_NAME
} rkind;

typedef struct rloc {
    long off, len;
    uint32_t docno; /* R_SEGDIR, R_DOC: a document inside; R_NAME: the number */
    uint32_t c;     /* R_BLOCK: its centroid */
} rloc;

static rloc locate(rkind kind)
{
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m), 0);
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    rloc r = {0, 0, 0, 0};
    MDB_val k, d;
    MDB_cursor *c;
    switch (kind) {
    case R_FORMAT:
    case R_HEADER:
    case R_CODEC: {
        const char *name = kind == R_FORMAT ? "format" : kind == R_HEADER ? "header" : "codec";
        k.mv_size = strlen(name);
        k.mv_data = (void *)name;
        ck_assert_int_eq(mdb_get(t->st_txn, t->st_gen->g_meta, &k, &d), 0);
        break;
    }
    case R_CENTROIDS: {
        unsigned z = 0;
        k.mv_size = 4;
        k.mv_data = &z;
        ck_assert_int_eq(mdb_get(t->st_txn, t->st_gen->g_centroids, &k, &d), 0);
        break;
    }
    case R_SEGDIR:
    case R_DOC: {
        ck_assert_int_eq(mdb_cursor_open(t->st_txn, t->st_gen->g_docs, &c), 0);
        ck_assert_int_eq(mdb_cursor_get(c, &k, &d, MDB_LAST), 0);
        mdb_cursor_close(c);
        store_seg s;
        uint32_t key;
        memcpy(&key, k.mv_data, 4);
        ck_assert_int_eq(store_seg_parse(key, d.mv_data, d.mv_size, 0, 0, 1, &s, &m), 0);
        const uint8_t *rec;
        size_t size;
        store_seg_entry(&s, s.n / 2, &r.docno, &rec, &size);
        if (kind == R_SEGDIR) {
            d.mv_size = STORE_SEG_HEAD + (size_t)s.n * STORE_SEG_ENTRY;
        } else {
            d.mv_data = (void *)rec;
            d.mv_size = size;
        }
        break;
    }
    case R_BLOCK: {
        ck_assert_int_eq(mdb_cursor_open(t->st_txn, t->st_gen->g_ivf, &c), 0);
        ck_assert_int_eq(mdb_cursor_get(c, &k, &d, MDB_FIRST), 0);
        uint64_t key;
        memcpy(&key, k.mv_data, 8);
        r.c = (uint32_t)(key >> 32);
        mdb_cursor_close(c);
        break;
    }
    case R_ID:
        k.mv_size = 5;
        k.mv_data = "doc-1";
        ck_assert_int_eq(mdb_get(t->st_txn, t->st_gen->g_ids, &k, &d), 0);
        break;
    case R_NAME: {
        r.docno = 1;
        unsigned one = 1;
        k.mv_size = 4;
        k.mv_data = &one;
        ck_assert_int_eq(mdb_get(t->st_txn, t->st_gen->g_names, &k, &d), 0);
        break;
    }
    }
    r.off = damage_offset(t, d.mv_data);
    r.len = (long)d.mv_size;
    store_read_end(env, t);
    store_close(env);
    return r;
}

/* What the record's own reader says now (a fresh environment: nothing cached). */
static int reader_rc(rkind kind, const rloc *r)
{
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    int rc = store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m);
    if (rc)
        return rc;
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    store_header h;
    int hrc = store_header_get(t, &h, &m);
    if (kind == R_FORMAT) {
        rc = 0; /* one damaged byte still opens: tartan check reports it */
    } else if (kind == R_HEADER) {
        rc = hrc;
    } else {
        ck_assert_int_eq(hrc, 0);
        float cut[3], w[4];
        const float *cent;
        store_doc doc;
        const char *id;
        size_t len, n;
        uint32_t docno;
        store_ivf_iter *it;
        const uint32_t *v;
        switch (kind) {
        case R_CODEC:
            rc = store_codec_get(t, h.nbits, cut, w, &m);
            break;
        case R_CENTROIDS:
            rc = store_centroids_get(t, h.n_centroids, h.dim, &cent, &m);
            break;
        case R_SEGDIR:
        case R_DOC:
            rc = store_doc_get(t, r->docno, h.code_bytes, h.token_bytes, 1, &doc, &m);
            break;
        case R_BLOCK:
            ck_assert_int_eq(store_ivf_open(t, r->c, &it, &m), 0);
            rc = store_ivf_next(it, &v, &n, &m);
            store_ivf_close(it);
            break;
        case R_ID:
            rc = store_id_get(t, "doc-1", 5, &docno, &m);
            break;
        case R_NAME:
            rc = store_name_get(t, 1, &id, &len, &m);
            break;
        default:
            break;
        }
    }
    store_read_end(env, t);
    store_close(env);
    return rc;
}

START_TEST(test_format_every_record_checksum)
{
    build_index(1603, 40, 10);
    ck_assert_int_eq(problems(), 0);
    static const char *const names[] = {"format", "header",    "codec",     "centroids",  "segment",
                                        "record", "ivf block", "ids value", "names value"};
    for (int kind = R_FORMAT; kind <= R_NAME; kind++) {
        rloc r = locate((rkind)kind);
        ck_assert_int_gt(r.len, 0);
        /* Every byte, one bit of it; a wide table every few bytes (it is verified as one). */
        long step = kind == R_CENTROIDS ? 7 : 1;
        for (long i = 0; i < r.len; i += step) {
            uint8_t mask = (uint8_t)(1u << (i % 8));
            damage_flip(ixpath, r.off + i, mask);
            int n = problems();
            int rrc = reader_rc((rkind)kind, &r);
            damage_flip(ixpath, r.off + i, mask);
            ck_assert_msg(n > 0, "%s: flipped bit %ld of byte %ld of %ld unseen by tartan check",
                          names[kind], i % 8, i, r.len);
            /* The codec tables and the centroid table are stored twice: their readers serve
             * the sound copy. */
            if (kind == R_CODEC || kind == R_CENTROIDS)
                ck_assert_msg(rrc == 0, "%s: flipped byte %ld of %ld: its reader says %d",
                              names[kind], i, r.len, rrc);
            else if (kind != R_FORMAT)
                ck_assert_msg(rrc == TARTAN_ECORRUPT,
                              "%s: flipped byte %ld of %ld: its reader says %d", names[kind], i,
                              r.len, rrc);
        }
        ck_assert_int_eq(problems(), 0);
    }
}
END_TEST

/* ---- version 1 ---------------------------------------------------------------------------- */

/* Exhaustive and PLAID top 10 of a few queries (the same random queries each call). */
typedef struct answers {
    char id[2][8][10][16];
    float score[2][8][10];
    size_t n[2][8];
} answers;

static void answer(const char *path, answers *a)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    tartan_db *db;
    ck_assert_int_eq(tartan_open(path, &o, &db), 0);
    uint64_t s = rng_state;
    rng_state = 777;
    float q[8 * 4 * DIM];
    for (int i = 0; i < 8 * 4 * DIM; i++)
        q[i] = (float)gauss();
    rng_state = s;
    tartan_queries qs = {8, NULL, 4, q, 32, DIM, TARTAN_FLOAT32};
    memset(a, 0, sizeof *a);
    for (int e = 0; e < 2; e++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = e;
        p.ncells = 3;
        tartan_results *res;
        ck_assert_msg(tartan_search(db, &qs, &p, &res) == 0, "%s", tartan_errmsg(db));
        for (int i = 0; i < 8; i++) {
            a->n[e][i] = res->counts[i];
            for (size_t j = 0; j < res->counts[i]; j++) {
                snprintf(a->id[e][i][j], 16, "%s", res->hits[res->offsets[i] + j].id);
                a->score[e][i][j] = res->hits[res->offsets[i] + j].score;
            }
        }
        tartan_results_free(res);
    }
    tartan_close(db);
}

/* Documents (numbers and records), lists, ids of an index, as a checksum of the whole. */
static uint32_t content_crc(const char *path)
{
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_open(path, STORE_READONLY, NULL, 0, &env, &m), 0);
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    store_header h;
    ck_assert_int_eq(store_header_get(t, &h, &m), 0);
    uint32_t crc = store_crc32c(0, &h.n_docs, 8);
    crc = store_crc32c(crc, &h.n_tokens, 8);
    crc = store_crc32c(crc, &h.next_docno, 4);
    crc = store_crc32c(crc, &h.n_postings, 8);
    store_cursor *cur;
    ck_assert_int_eq(store_docs_first(t, 1, &cur, &m), 0);
    uint32_t docno;
    const void *rec;
    size_t size;
    while (store_docs_next(cur, &docno, &rec, &size, &m) == 1) {
        crc = store_crc32c(crc, rec, size);
        const char *id;
        size_t len;
        ck_assert_int_eq(store_name_get(t, docno, &id, &len, &m), 0);
        crc = store_crc32c(crc, id, len);
        uint32_t back;
        ck_assert_int_eq(store_id_get(t, id, len, &back, &m), 0);
        ck_assert_uint_eq(back, docno);
    }
    store_cursor_close(cur);
    for (uint32_t c = 0; c < h.n_centroids; c++) {
        store_ivf_iter *it;
        ck_assert_int_eq(store_ivf_open(t, c, &it, &m), 0);
        const uint32_t *v;
        size_t n;
        while (store_ivf_next(it, &v, &n, &m) == 1) {
            crc = store_crc32c(crc, &c, 4);
            crc = store_crc32c(crc, v, n * 4);
        }
        store_ivf_close(it);
    }
    store_read_end(env, t);
    store_close(env);
    return crc;
}

START_TEST(test_format_v1_refused_then_converted)
{
    build_index(1604, 120, 40);
    /* Calibrated (a bare record in version 1): the conversion carries it over, checksummed. */
    tartan_db *cdb;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &cdb), 0);
    ck_assert_msg(tartan_calibrate(cdb, NULL, NULL) == 0, "%s", tartan_errmsg(cdb));
    tartan_close(cdb);
    uint8_t cal_before[512];
    size_t cal_len = 0;
    {
        store_env *env;
        store_txn *t;
        store_msg m = {{0}};
        const void *cd;
        ck_assert_int_eq(store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m), 0);
        ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
        ck_assert_int_eq(store_meta_get(t, STORE_META_CALIBRATION, &cd, &cal_len, &m), 0);
        ck_assert_uint_le(cal_len, sizeof cal_before);
        memcpy(cal_before, cd, cal_len);
        store_read_end(env, t);
        store_close(env);
    }
    answers before, after;
    answer(ixpath, &before);
    uint32_t crc_before = content_crc(ixpath);
    char v1[400];
    snprintf(v1, sizeof v1, "%s/v1", tmpdir);
    v1_index_from(ixpath, v1);

    /* Refused, with the fix named; a read-only open cannot convert. */
    tartan_db *db;
    tartan_options o;
    tartan_options_init(&o);
    ck_assert_int_eq(tartan_open(v1, &o, &db), TARTAN_EVERSION);
    const char *msg = tartan_errmsg(NULL);
    ck_assert_msg(strstr(msg, "version 1") && strstr(msg, "tartan compact"), "%s", msg);
    o.flags = TARTAN_READONLY | TARTAN_UPGRADE;
    ck_assert_int_eq(tartan_open(v1, &o, &db), TARTAN_EVERSION);

    /* Converted: the same documents, lists, ids and answers, bit for bit. */
    o.flags = TARTAN_UPGRADE;
    ck_assert_msg(tartan_open(v1, &o, &db) == 0, "%s", tartan_errmsg(NULL));
    size_t np;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    tartan_close(db);
    ck_assert_uint_eq(content_crc(v1), crc_before);
    answer(v1, &after);
    ck_assert(!memcmp(&before, &after, sizeof before));
    /* The converted table is the version-1 fp32 one. */
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_open(v1, STORE_READONLY, NULL, 0, &env, &m), 0);
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    unsigned z = 0;
    MDB_val k = {4, &z}, d;
    ck_assert_int_eq(mdb_get(t->st_txn, t->st_gen->g_centroids, &k, &d), 0);
    uint32_t dtype;
    memcpy(&dtype, (const uint8_t *)d.mv_data + 8, 4);
    ck_assert_uint_eq(dtype, STORE_CENT_F32);
    const void *cal;
    size_t cl;
    ck_assert_int_eq(store_meta_get(t, STORE_META_CALIBRATION, &cal, &cl, &m), 0);
    ck_assert_uint_eq(cl, cal_len);
    ck_assert(!memcmp(cal, cal_before, cl));
    store_read_end(env, t);
    store_close(env);
    /* And it takes changes. */
    ck_assert_int_eq(tartan_open(v1, NULL, &db), 0);
    const char *del[] = {"doc-5"};
    size_t nd;
    ck_assert_int_eq(tartan_delete(db, del, 1, &nd), 0);
    ck_assert_uint_eq(nd, 1);
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    tartan_close(db);
}
END_TEST

/* A version-1 index with a damaged document is not converted, and stays as it was. */
START_TEST(test_format_v1_damaged_not_converted)
{
    build_index(1605, 30, 12);
    char v1[400];
    snprintf(v1, sizeof v1, "%s/v1", tmpdir);
    v1_index_from(ixpath, v1);
    /* Flip a byte of document 2's blob (version 1: the value under key 2 of "docs"). */
    MDB_env *e;
    MDB_txn *txn;
    MDB_dbi dbi;
    ck_assert_int_eq(mdb_env_create(&e), 0);
    ck_assert_int_eq(mdb_env_set_maxdbs(e, 8), 0);
    ck_assert_int_eq(mdb_env_open(e, v1, 0, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(e, NULL, 0, &txn), 0);
    ck_assert_int_eq(mdb_dbi_open(txn, "docs", MDB_INTEGERKEY, &dbi), 0);
    unsigned key = 2;
    MDB_val k = {4, &key}, d;
    ck_assert_int_eq(mdb_get(txn, dbi, &k, &d), 0);
    uint8_t *copy = malloc(d.mv_size);
    memcpy(copy, d.mv_data, d.mv_size);
    copy[d.mv_size - 5] ^= 0x20;
    d.mv_data = copy;
    ck_assert_int_eq(mdb_put(txn, dbi, &k, &d, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(e);
    free(copy);
    long size0 = damage_file_size(v1);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_UPGRADE;
    tartan_db *db;
    ck_assert_int_eq(tartan_open(v1, &o, &db), TARTAN_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "document 2"));
    o.flags = 0;
    ck_assert_int_eq(tartan_open(v1, &o, &db), TARTAN_EVERSION);
    ck_assert_int_eq(damage_file_size(v1), size0);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"every_record_checksum", test_format_every_record_checksum, 0},
        {"v1_refused_then_converted", test_format_v1_refused_then_converted, 0},
        {"v1_damaged_not_converted", test_format_v1_damaged_not_converted, 0},
    };
    return FX_RUN("format-index", cases, FX_DIR, 0);
}
