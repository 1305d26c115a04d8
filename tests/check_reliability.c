/*
 * check_reliability.c: tartan_check against indexes damaged on purpose through LMDB (a flipped
 * byte in a blob, a removed or added inverted-list entry, a broken id mapping, wrong counts,
 * codes out of range), and the guarantee that a damaged document reads as TARTAN_ECORRUPT,
 * never as a wrong score. Each test builds a fresh random index in its own directory.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <lmdb.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db.h"
#include "index.h"
#include "store.h"
#include "store_internal.h"
#include "damage.h"
#include "fixture.h"
#include "tartan.h"
#include "verify.h"

/* ---- fixture: a fresh directory per test (tests/fixture.c) ------------------------------ */

/* ---- random index ----------------------------------------------------------------------- */

#define DIM 32
#define NDOCS 60
#define K 16

static char id_store[NDOCS][16];
static const char *ids[NDOCS];
static size_t doclens[NDOCS];

/* Builds ixpath: NDOCS documents of 1..12 random tokens, K centroids, nbits 2. */
static void build_index(uint64_t seed)
{
    rng_state = seed;
    size_t rows = 0;
    for (int i = 0; i < NDOCS; i++) {
        snprintf(id_store[i], sizeof id_store[i], "doc-%d", i);
        ids[i] = id_store[i];
        doclens[i] = 1 + rnd() % 12;
        rows += doclens[i];
    }
    float *emb = malloc(rows * DIM * sizeof *emb);
    ck_assert_ptr_nonnull(emb);
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
    tartan_batch b = {NDOCS, ids, doclens, emb, rows, DIM, TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    tartan_close(db);
    free(emb);
}

/* ---- checking ---------------------------------------------------------------------------- */

typedef struct found {
    int n;
    char kinds[64][24];
    char last[640];
} found;

static int collect(void *ctx, const char *kind, const char *message)
{
    found *f = ctx;
    if (f->n < 64)
        snprintf(f->kinds[f->n], sizeof f->kinds[0], "%s", kind);
    f->n++;
    snprintf(f->last, sizeof f->last, "%s: %s", kind, message);
    return 0;
}

static int has_kind(const found *f, const char *kind)
{
    for (int i = 0; i < f->n && i < 64; i++)
        if (!strcmp(f->kinds[i], kind))
            return 1;
    return 0;
}

/* Runs tartan_check on a read-only handle; fills f; returns its result. */
static int check_index(found *f)
{
    memset(f, 0, sizeof *f);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    size_t n = 99;
    int rc = tartan_check(db, collect, f, &n);
    ck_assert_int_eq((int)n, f->n);
    if (rc == TARTAN_ECORRUPT)
        ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "TARTAN_ECORRUPT"));
    tartan_close(db);
    return rc;
}

/* ---- damaging an index (tests/damage.c) ------------------------------------------------- */

/* Token budget of the test index's records: codes are u16 (K <= 65536), residuals dim*2/8. */
#define CODE_BYTES 2
#define TOKEN_BYTES (DIM * 2 / 8)

/* Token t's code in a record. */
static uint16_t rec_code(const uint8_t *rec, uint32_t t)
{
    uint32_t ntok;
    memcpy(&ntok, rec + 4, 4);
    uint16_t x;
    memcpy(&x, rec + STORE_DOC_HEAD + 4 * (size_t)ntok + 2 * (size_t)t, 2);
    return x;
}

static int rec_has_code(const uint8_t *rec, unsigned c)
{
    uint32_t ntok;
    memcpy(&ntok, rec + 4, 4);
    for (uint32_t t = 0; t < ntok; t++)
        if (rec_code(rec, t) == c)
            return 1;
    return 0;
}

/* The file offset of byte `at` of document docno's record (at < 0: from its end). */
static long record_byte(uint32_t docno, long at)
{
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m), 0);
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    size_t size;
    const uint8_t *rec = damage_record(t, docno, &size);
    long off = damage_offset(t, rec + (at < 0 ? (long)size + at : at));
    store_read_end(env, t);
    store_close(env);
    return off;
}

/* Adds delta to the header's inverted-list entry count (damage that keeps it consistent). */
static void add_postings(store_txn *t, int64_t delta)
{
    store_header h;
    store_msg m;
    ck_assert_int_eq(store_header_get(t, &h, &m), 0);
    h.n_postings = (uint64_t)((int64_t)h.n_postings + delta);
    ck_assert_int_eq(store_header_put(t, &h, &m), 0);
}

/* ---- tests ------------------------------------------------------------------------------- */

START_TEST(test_reliability_sound_index)
{
    build_index(11);
    found f;
    ck_assert_int_eq(check_index(&f), 0);
    ck_assert_int_eq(f.n, 0);
    /* Deleting and replacing keep it sound. */
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    const char *del[] = {"doc-3", "doc-7", "doc-40"};
    size_t nd;
    ck_assert_int_eq(tartan_delete(db, del, 3, &nd), 0);
    ck_assert_int_eq((int)nd, 3);
    float emb[3 * DIM];
    for (int i = 0; i < 3 * DIM; i++)
        emb[i] = (float)gauss();
    const char *rid[] = {"doc-5"};
    size_t rl[] = {3};
    tartan_batch b = {1, rid, rl, emb, 3, DIM, TARTAN_FLOAT32};
    ck_assert_int_eq(tartan_add(db, &b, TARTAN_REPLACE), 0);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_int_eq((int)info.n_docs, NDOCS - 3);
    tartan_close(db);
    ck_assert_int_eq(check_index(&f), 0);
    ck_assert_msg(f.n == 0, "%s", f.last);
}
END_TEST

START_TEST(test_reliability_flipped_byte)
{
    build_index(12);
    damage_flip(ixpath, record_byte(4, -5), 0x10); /* inside the residuals */
    found f;
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_int_eq(f.n, 1);
    ck_assert_msg(has_kind(&f, "checksum"), "%s", f.last);
    ck_assert_ptr_nonnull(strstr(f.last, "doc-4"));

    /* Reading it is an error, never a value: by number and while walking every document. */
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    idx_reader rd;
    store_msg m = {{0}};
    ck_assert_int_eq(idx_reader_open(db->env, &rd, &m), 0);
    kern_pdoc pd;
    ck_assert_int_eq(idx_reader_doc(&rd, 4, &pd, &m), TARTAN_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(m.text, "checksum"));
    ck_assert_int_eq(idx_reader_doc(&rd, 5, &pd, &m), 0);
    store_cursor *cur = NULL;
    uint32_t docno;
    int rc, seen = 0;
    while ((rc = idx_reader_next_doc(&rd, &cur, &docno, &pd, &m)) == 1)
        seen++;
    ck_assert_int_eq(rc, TARTAN_ECORRUPT);
    ck_assert_int_eq(seen, 4); /* documents 0..3 come first */
    idx_reader_docs_end(cur);
    idx_reader_close(&rd);
    /* Deleting it refuses to guess its codes, and changes nothing. */
    const char *del[] = {"doc-4"};
    ck_assert_int_eq(tartan_delete(db, del, 1, NULL), TARTAN_ECORRUPT);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_int_eq((int)info.n_docs, NDOCS);
    tartan_close(db);
}
END_TEST

/* Every single flipped byte of a record, header included, is caught by the reader's parse. */
static void copy_record(store_txn *t, void *ctx)
{
    uint8_t **out = ctx;
    size_t size;
    const uint8_t *rec = damage_record(t, 9, &size);
    *out = malloc(size + sizeof(size_t));
    ck_assert_ptr_nonnull(*out);
    memcpy(*out, &size, sizeof size);
    memcpy(*out + sizeof size, rec, size);
}

START_TEST(test_reliability_every_byte_flip)
{
    build_index(13);
    uint8_t *got = NULL;
    damage_write(ixpath, copy_record, &got);
    size_t size;
    memcpy(&size, got, sizeof size);
    const uint8_t *b = got + sizeof size;
    store_doc d;
    store_msg m;
    uint8_t *c = aligned_alloc(4, (size + 3) & ~(size_t)3);
    ck_assert_ptr_nonnull(c);
    memcpy(c, b, size);
    ck_assert_int_eq(store_doc_parse(9, c, size, CODE_BYTES, TOKEN_BYTES, 1, &d, &m), 0);
    for (size_t i = 0; i < size; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(c, b, size);
            c[i] ^= (uint8_t)(1u << bit);
            ck_assert_msg(store_doc_parse(9, c, size, CODE_BYTES, TOKEN_BYTES, 1, &d, &m) ==
                              TARTAN_ECORRUPT,
                          "flip of bit %d at byte %zu of %zu went unseen", bit, i, size);
        }
    }
    /* A sound record under another number fails too. */
    memcpy(c, b, size);
    ck_assert_int_eq(store_doc_parse(10, c, size, CODE_BYTES, TOKEN_BYTES, 1, &d, &m),
                     TARTAN_ECORRUPT);
    free(c);
    free(got);
}
END_TEST

static void drop_entry(store_txn *t, void *ctx)
{
    (void)ctx;
    size_t size;
    unsigned c = rec_code(damage_record(t, 7, &size), 0);
    damage_list(t, c, 7, 0);
    add_postings(t, -1);
}

START_TEST(test_reliability_ivf_missing)
{
    build_index(14);
    damage_write(ixpath, drop_entry, NULL);
    found f;
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_msg(f.n == 1, "%d: %s", f.n, f.last);
    ck_assert_msg(has_kind(&f, "ivf-missing"), "%s", f.last);
    ck_assert_ptr_nonnull(strstr(f.last, "doc-7"));
}
END_TEST

/* An entry for a code document 2 lacks, one for a document that never existed, one for a
 * deleted document, and one for a centroid beyond K. */
static void add_stale(store_txn *t, void *ctx)
{
    (void)ctx;
    size_t size;
    const uint8_t *rec = damage_record(t, 2, &size);
    unsigned c = 0;
    while (rec_has_code(rec, c))
        c++;
    ck_assert_uint_lt(c, K);
    unsigned entries[4][2] = {{c, 2}, {0, 1000}, {1, NDOCS + 5}, {K + 3, 1}};
    for (int i = 0; i < 4; i++)
        damage_list(t, entries[i][0], entries[i][1], 1);
    add_postings(t, 4);
}

START_TEST(test_reliability_ivf_stale)
{
    build_index(15);
    damage_write(ixpath, add_stale, NULL);
    found f;
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_msg(f.n == 4, "%d problems, last %s", f.n, f.last);
    for (int i = 0; i < 4; i++)
        ck_assert_str_eq(f.kinds[i], "ivf-stale");
}
END_TEST

static void rebind_id(store_txn *t, void *ctx)
{
    (void)ctx;
    store_msg m;
    /* ids: "doc-1" now names document 2 (whose name is "doc-2"). */
    ck_assert_int_eq(store_ids_put_raw(t->st_txn, t->st_gen->g_ids, "doc-1", 5, 2, 0, &m), 0);
}

static void drop_name(store_txn *t, void *ctx)
{
    (void)ctx;
    unsigned key = 8;
    MDB_val nk = {4, &key};
    ck_assert_int_eq(mdb_del(t->st_txn, t->st_gen->g_names, &nk, NULL), 0);
}

static void bind_ghost(store_txn *t, void *ctx)
{
    (void)ctx;
    store_msg m;
    unsigned ghost = NDOCS + 9;
    ck_assert_int_eq(store_ids_put_raw(t->st_txn, t->st_gen->g_ids, "a\tb!", 4, ghost, 0, &m), 0);
    ck_assert_int_eq(store_names_put_raw(t->st_txn, t->st_gen->g_names, ghost, "a\tb!", 4, 0, &m),
                     0);
}

START_TEST(test_reliability_id_mapping)
{
    build_index(16);
    damage_write(ixpath, rebind_id, NULL);
    found f;
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_msg(has_kind(&f, "id-map"), "%s", f.last);
    /* Both directions see it: ids names the wrong document, and names' "doc-1" points back
     * to another. */
    ck_assert_int_eq(f.n, 2);

    /* A document whose name is gone. */
    fixture_dir_remove();
    fixture_dir_create("reliability");
    build_index(17);
    damage_write(ixpath, drop_name, NULL);
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_msg(has_kind(&f, "id-missing"), "%s", f.last);
    ck_assert_msg(has_kind(&f, "id-map"), "%s", f.last); /* ids' doc-8 finds no name */

    /* An id with a control byte, bound both ways to a document that does not exist. */
    fixture_dir_remove();
    fixture_dir_create("reliability");
    build_index(18);
    damage_write(ixpath, bind_ghost, NULL);
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_msg(has_kind(&f, "id-bad"), "%s", f.last);
    ck_assert_msg(has_kind(&f, "id-map"), "%s", f.last);
}
END_TEST

static void more_tokens(store_txn *t, void *ctx)
{
    (void)ctx;
    store_header h;
    store_msg m;
    ck_assert_int_eq(store_header_get(t, &h, &m), 0);
    h.n_tokens += 3;
    ck_assert_int_eq(store_header_put(t, &h, &m), 0);
}

/* Document 0 removed with everything else that names it, the header left as it was. */
static void vanish_doc0(store_txn *t, void *ctx)
{
    (void)ctx;
    size_t size;
    const uint8_t *rec = damage_record(t, 0, &size);
    uint32_t ntok;
    memcpy(&ntok, rec + 4, 4);
    unsigned seen[K + 1];
    memset(seen, 0, sizeof seen);
    unsigned codes[64], nc = 0;
    for (uint32_t i = 0; i < ntok; i++) {
        unsigned c = rec_code(rec, i);
        if (!seen[c]++)
            codes[nc++] = c;
    }
    for (unsigned i = 0; i < nc; i++)
        damage_list(t, codes[i], 0, 0);
    uint32_t zero = 0;
    store_msg m;
    ck_assert_int_eq(store_docs_delete(t, &zero, 1, &m), 0);
    ck_assert_int_eq(store_id_del(t, "doc-0", 5, 0, &m), 0);
}

START_TEST(test_reliability_counts)
{
    build_index(19);
    damage_write(ixpath, more_tokens, NULL);
    found f;
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_int_eq(f.n, 1);
    ck_assert_msg(has_kind(&f, "count"), "%s", f.last);
    ck_assert_ptr_nonnull(strstr(f.last, "tokens"));

    /* Only the counts are left wrong: documents, tokens (still 3 too many, and the removed
     * document's too) and inverted-list entries. */
    damage_write(ixpath, vanish_doc0, NULL);
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_msg(f.n == 3, "%d: %s", f.n, f.last);
    for (int i = 0; i < 3; i++)
        ck_assert_str_eq(f.kinds[i], "count");
}
END_TEST

static void bad_code(uint8_t *rec, size_t *size, void *ctx)
{
    (void)size;
    (void)ctx;
    uint32_t ntok;
    memcpy(&ntok, rec + 4, 4);
    uint16_t bad = K + 1;
    memcpy(rec + STORE_DOC_HEAD + 4 * (size_t)ntok, &bad, 2); /* token 0's code */
}

static void shorter(uint8_t *rec, size_t *size, void *ctx)
{
    (void)rec;
    (void)ctx;
    *size -= 4;
}

static void code_and_size(store_txn *t, void *ctx)
{
    (void)ctx;
    damage_edit_record(t, 6, bad_code, NULL, 1);
    /* Document 11 four bytes short: its size no longer matches its token count. */
    damage_edit_record(t, 11, shorter, NULL, 0);
}

START_TEST(test_reliability_code_range_and_size)
{
    build_index(20);
    damage_write(ixpath, code_and_size, NULL);
    found f;
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_msg(has_kind(&f, "code-range"), "%s", f.last);
    ck_assert_msg(has_kind(&f, "doc-size"), "%s", f.last);

    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    idx_reader rd;
    store_msg m = {{0}};
    ck_assert_int_eq(idx_reader_open(db->env, &rd, &m), 0);
    kern_pdoc pd;
    ck_assert_int_eq(idx_reader_doc(&rd, 11, &pd, &m), TARTAN_ECORRUPT);
    idx_reader_close(&rd);
    tartan_close(db);
}
END_TEST

static int stop_at_first(void *ctx, const char *kind, const char *message)
{
    (void)kind;
    (void)message;
    ++*(int *)ctx;
    return 1;
}

START_TEST(test_reliability_report_stops)
{
    build_index(21);
    for (unsigned docno = 0; docno < 10; docno++)
        damage_flip(ixpath, record_byte(docno, 9), 1);
    found f;
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_int_eq(f.n, 10);
    tartan_db *db;
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    int calls = 0;
    size_t n;
    ck_assert_int_eq(tartan_check(db, stop_at_first, &calls, &n), TARTAN_ECORRUPT);
    ck_assert_int_eq(calls, 1);
    ck_assert_int_eq((int)n, 1);
    ck_assert_int_eq(tartan_check(NULL, NULL, NULL, &n), TARTAN_EINVAL);
    tartan_close(db);
}
END_TEST

static void header_junk(store_txn *t, void *ctx)
{
    (void)ctx;
    MDB_val k = {6, "header"}, d = {10, "0123456789"};
    ck_assert_int_eq(mdb_put(t->st_txn, t->st_gen->g_meta, &k, &d, 0), 0);
    MDB_val xk = {5, "extra"}, xd = {1, "x"};
    ck_assert_int_eq(mdb_put(t->st_txn, t->st_gen->g_meta, &xk, &xd, 0), 0);
}

START_TEST(test_reliability_header_damage)
{
    build_index(22);
    damage_write(ixpath, header_junk, NULL);
    found f;
    ck_assert_int_eq(check_index(&f), TARTAN_ECORRUPT);
    ck_assert_msg(has_kind(&f, "header"), "%s", f.last);
    ck_assert_msg(has_kind(&f, "meta"), "%s", f.last);
}
END_TEST

/* A token of tiny (subnormal) values has a direction: it is added, normalised, and the index
 * stays sound (its 1/norm overflowed float once and crashed the encoder: found by fuzzing). */
START_TEST(test_reliability_tiny_token)
{
    build_index(23);
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    float emb[2 * DIM] = {0};
    uint32_t sub = 0x001f0000u; /* about 2.8e-39 */
    memcpy(&emb[3], &sub, 4);
    emb[DIM + 5] = 1e-30f; /* its square underflows float, not double */
    const char *tid[] = {"tiny"};
    size_t tl[] = {2};
    tartan_batch b = {1, tid, tl, emb, 2, DIM, TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    idx_reader rd;
    store_msg m = {{0}};
    ck_assert_int_eq(idx_reader_open(db->env, &rd, &m), 0);
    uint32_t docno;
    ck_assert_int_eq(idx_reader_docno(&rd, "tiny", &docno, &m), 0);
    kern_pdoc pd;
    ck_assert_int_eq(idx_reader_doc(&rd, docno, &pd, &m), 0);
    float out[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++)
        out[i] = NAN;
    idx_reader_decompress(&rd, &pd, out);
    for (int t = 0; t < 2; t++) {
        double ss = 0;
        for (int j = 0; j < DIM; j++) {
            ck_assert(isfinite(out[t * DIM + j]));
            ss += (double)out[t * DIM + j] * out[t * DIM + j];
        }
        ck_assert_double_eq_tol(ss, 1.0, 1e-3);
    }
    idx_reader_close(&rd);
    tartan_close(db);
    found f;
    ck_assert_int_eq(check_index(&f), 0);
}
END_TEST

/* An add far larger than the initial map grows the map (several times) and lands whole. */
START_TEST(test_reliability_map_grows)
{
    rng_state = 24;
    enum { N = 3000, L = 16 };
    size_t rows = (size_t)N * L;
    float *emb = malloc(rows * DIM * sizeof *emb);
    size_t *lens = malloc(N * sizeof *lens);
    char(*idb)[16] = malloc(N * sizeof *idb);
    const char **idp = malloc(N * sizeof *idp);
    ck_assert(emb && lens && idb && idp);
    for (size_t i = 0; i < rows * DIM; i++)
        emb[i] = (float)gauss();
    for (size_t i = 0; i < N; i++) {
        lens[i] = L;
        snprintf(idb[i], sizeof idb[i], "g%zu", i);
        idp[i] = idb[i];
    }
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = K;
    o.map_size = 256 << 10;
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    uint64_t map0 = info.map_size;
    tartan_batch b = {N, idp, lens, emb, rows, DIM, TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_int_eq((int)info.n_docs, N);
    ck_assert_uint_ge(info.map_size, 4 * map0); /* the batch needed several doublings */
    ck_assert_uint_ge(info.map_size, info.bytes_file);
    tartan_close(db);
    found f;
    ck_assert_int_eq(check_index(&f), 0);
    /* Reopened with the small map asked for again: the map covers the file. */
    o.flags = 0;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_int_eq((int)info.n_docs, N);
    tartan_close(db);
    free(emb);
    free(lens);
    free(idb);
    free(idp);
}
END_TEST

/* A search that meets a damaged document fails with TARTAN_ECORRUPT instead of scoring it:
 * exhaustively, and through PLAID when the document is a candidate (a query made of its own
 * tokens' directions makes it the best one). */
START_TEST(test_reliability_search_damaged)
{
    build_index(25);
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    /* The query: document 13's decompressed tokens, read before the damage. */
    idx_reader rd;
    store_msg m = {{0}};
    ck_assert_int_eq(idx_reader_open(db->env, &rd, &m), 0);
    kern_pdoc pd;
    ck_assert_int_eq(idx_reader_doc(&rd, 13, &pd, &m), 0);
    size_t qn = pd.ntok;
    float *q = malloc(qn * DIM * sizeof *q);
    ck_assert_ptr_nonnull(q);
    idx_reader_decompress(&rd, &pd, q);
    idx_reader_close(&rd);
    tartan_queries qs = {1, NULL, qn, q, qn, DIM, TARTAN_FLOAT32};
    tartan_search_params p;
    tartan_search_params_init(&p, 5);
    p.ncells = 4;
    tartan_results *res = NULL;
    ck_assert_msg(tartan_search(db, &qs, &p, &res) == 0, "%s", tartan_errmsg(db));
    ck_assert_uint_ge(res->counts[0], 1);
    ck_assert_str_eq(res->hits[0].id, "doc-13");
    tartan_results_free(res);
    tartan_close(db);

    damage_flip(ixpath, record_byte(13, -3), 0x01); /* one bit of the last token's residual */

    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    res = (tartan_results *)1;
    ck_assert_int_eq(tartan_search(db, &qs, &p, &res), TARTAN_ECORRUPT);
    ck_assert_ptr_null(res);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "checksum"));
    p.exhaustive = 1;
    res = (tartan_results *)1;
    ck_assert_int_eq(tartan_search(db, &qs, &p, &res), TARTAN_ECORRUPT);
    ck_assert_ptr_null(res);
    /* A PLAID search whose subset leaves it out does not read it. (Exhaustive mode walks
     * every document, and so still meets the damage.) */
    p.exhaustive = 0;
    const char *allow[] = {"doc-1", "doc-2"};
    p.subset = allow;
    p.n_subset = 2;
    ck_assert_msg(tartan_search(db, &qs, &p, &res) == 0, "%s", tartan_errmsg(db));
    for (size_t i = 0; i < res->counts[0]; i++)
        ck_assert_str_ne(res->hits[i].id, "doc-13");
    tartan_results_free(res);
    tartan_close(db);
    free(q);
}
END_TEST

/* ---- concurrency: searches beside a writer --------------------------------------------- */

typedef struct reader_ctx {
    tartan_db *db;
    const float *q; /* one query of QLEN tokens, given twice in each batch */
    atomic_int *stop;
    int searches;
    char failure[256];
} reader_ctx;

#define QLEN 4
#define WBATCH 10

/* Searches until told to stop. Every batch holds the same query twice: both answers must be
 * the same (one snapshot per call), and the index must hold NDOCS or NDOCS + WBATCH documents
 * (the writer's batches land whole), never anything between. */
static void *reader_main(void *vctx)
{
    reader_ctx *c = vctx;
    float q2[2 * QLEN * DIM];
    memcpy(q2, c->q, sizeof(float) * QLEN * DIM);
    memcpy(q2 + QLEN * DIM, c->q, sizeof(float) * QLEN * DIM);
    tartan_queries qs = {2, NULL, QLEN, q2, 2 * QLEN, DIM, TARTAN_FLOAT32};
    tartan_search_params p;
    tartan_search_params_init(&p, 1000);
    p.exhaustive = 1;
    p.threads = 1;
    while (!atomic_load(c->stop) && !c->failure[0]) {
        tartan_results *res;
        int rc = tartan_search(c->db, &qs, &p, &res);
        if (rc) {
            snprintf(c->failure, sizeof c->failure, "search: %s", tartan_errmsg(c->db));
            break;
        }
        size_t n0 = res->counts[0], n1 = res->counts[1];
        if (n0 != n1 || (n0 != NDOCS && n0 != NDOCS + WBATCH))
            snprintf(c->failure, sizeof c->failure, "a search saw %zu and %zu documents", n0, n1);
        for (size_t i = 0; i < n0 && i < n1 && !c->failure[0]; i++) {
            const tartan_hit *a = &res->hits[res->offsets[0] + i];
            const tartan_hit *b = &res->hits[res->offsets[1] + i];
            if (strcmp(a->id, b->id) || a->score != b->score)
                snprintf(c->failure, sizeof c->failure, "the two queries of one call differ");
        }
        tartan_results_free(res);
        tartan_index_info info;
        if (tartan_info(c->db, &info) || (info.n_docs != NDOCS && info.n_docs != NDOCS + WBATCH))
            snprintf(c->failure, sizeof c->failure, "tartan_info saw %llu documents",
                     (unsigned long long)info.n_docs);
        c->searches++;
    }
    return NULL;
}

START_TEST(test_reliability_concurrent_search)
{
    build_index(26);
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, NULL, &db), 0);
    float q[QLEN * DIM], w[WBATCH * DIM];
    for (int i = 0; i < QLEN * DIM; i++)
        q[i] = (float)gauss();
    for (int i = 0; i < WBATCH * DIM; i++)
        w[i] = (float)gauss();
    char wid[WBATCH][8];
    const char *wids[WBATCH];
    size_t wl[WBATCH];
    for (int i = 0; i < WBATCH; i++) {
        snprintf(wid[i], sizeof wid[i], "w-%d", i);
        wids[i] = wid[i];
        wl[i] = 1;
    }
    atomic_int stop = 0;
    enum { NR = 3 };
    reader_ctx rc[NR];
    pthread_t th[NR];
    for (int i = 0; i < NR; i++) {
        memset(&rc[i], 0, sizeof rc[i]);
        rc[i].db = db;
        rc[i].q = q;
        rc[i].stop = &stop;
        ck_assert_int_eq(pthread_create(&th[i], NULL, reader_main, &rc[i]), 0);
    }
    tartan_batch b = {WBATCH, wids, wl, w, WBATCH, DIM, TARTAN_FLOAT32};
    int rounds = 0, failed = 0;
    for (; rounds < 40 && !failed; rounds++) {
        size_t nd;
        failed |= tartan_add(db, &b, 0) != 0;
        failed |= tartan_delete(db, wids, WBATCH, &nd) != 0 || nd != WBATCH;
    }
    atomic_store(&stop, 1);
    int searches = 0;
    for (int i = 0; i < NR; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(!rc[i].failure[0], "reader %d: %s", i, rc[i].failure);
        searches += rc[i].searches;
    }
    ck_assert_msg(!failed, "writer: %s", tartan_errmsg(db));
    ck_assert_int_gt(searches, NR);
    tartan_close(db);
    found f;
    ck_assert_int_eq(check_index(&f), 0);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"sound", test_reliability_sound_index, 0},
        {"flipped_byte", test_reliability_flipped_byte, 0},
        {"every_byte_flip", test_reliability_every_byte_flip, 0},
        {"ivf_missing", test_reliability_ivf_missing, 0},
        {"ivf_stale", test_reliability_ivf_stale, 0},
        {"id_mapping", test_reliability_id_mapping, 0},
        {"counts", test_reliability_counts, 0},
        {"code_range_and_size", test_reliability_code_range_and_size, 0},
        {"report_stops", test_reliability_report_stops, 0},
        {"header_damage", test_reliability_header_damage, 0},
        {"tiny_token", test_reliability_tiny_token, 0},
        {"map_grows", test_reliability_map_grows, 0},
        {"search_damaged", test_reliability_search_damaged, 0},
        {"concurrent_search", test_reliability_concurrent_search, 0},
    };
    return FX_RUN("reliability", cases, FX_DIR, 60);
}
