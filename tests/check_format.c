/*
 * check_format.c: index format version 2 (storage/FORMAT.md) on real LMDB: segments and
 * inverted-list blocks against in-memory references through random sequences of changes, the
 * checksummed meta records, fp16 conversion against the kernels' own, every record kind's
 * checksum caught for every flipped byte (in the file, as a disk would flip it), and version 1
 * indexes refused, then converted with every document, id and score kept.
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

static void setup(void)
{
    fixture_dir_create("check-format");
}

static void teardown(void)
{
    fixture_dir_remove();
}

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double gauss(void)
{
    double u = ((double)(rnd() >> 11) + 1) / 9007199254740993.0;
    double v = (double)(rnd() >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* ---- a raw store env for the storage-level tests ----------------------------------------- */

static store_env *raw_env(void)
{
    store_header init = {0};
    init.dim = 128;
    init.nbits = 2;
    init.seed = 1;
    init.kmeans_iters = 4;
    store_env *env;
    store_msg m = {{0}};
    ck_assert_msg(store_open(ixpath, STORE_CREATE, &init, 0, &env, &m) == 0, "%s", m.text);
    return env;
}

/* ---- fp16 ------------------------------------------------------------------------------- */

START_TEST(test_format_f16_conversions)
{
    /* Every half to single and back, against the kernels' conversions (written separately). */
    for (uint32_t h = 0; h < 65536; h++) {
        float a = store_f16_to_f32((uint16_t)h), b = kern_f16_to_f32((uint16_t)h);
        ck_assert_msg(memcmp(&a, &b, 4) == 0 || (isnan(a) && isnan(b)), "half %04x", h);
        if (!isnan(a))
            ck_assert_uint_eq(store_f32_to_f16(a), h);
    }
    /* Singles of every magnitude, halfway cases included. */
    rng_state = 160;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rnd();
        if (i % 4 == 0) /* near the half range's ends and rounding points */
            u = (u & 0x80001fffu) | ((uint32_t)(101 + rnd() % 44) << 23) | (i % 8 ? 0x1000u : 0);
        float f;
        memcpy(&f, &u, 4);
        uint16_t a = store_f32_to_f16(f), b = kern_f32_to_f16(f);
        if (isnan(f))
            ck_assert(isnan(store_f16_to_f32(a)));
        else
            ck_assert_msg(a == b, "float %08x: %04x against %04x", u, a, b);
    }
}
END_TEST

/* ---- meta records ----------------------------------------------------------------------- */

typedef struct meta_ctx {
    int step;
} meta_ctx;

static int meta_fn(store_txn *t, void *vctx, store_msg *m)
{
    meta_ctx *c = vctx;
    const void *d;
    size_t len;
    if (c->step == 0) {
        ck_assert_int_eq(store_meta_put(t, "calibration", "0123456789", 10, m), 0);
        ck_assert_int_eq(store_meta_put(t, "empty", "", 0, m), 0);
        ck_assert_int_eq(store_meta_put(t, "format", "x", 1, m), TARTAN_EINVAL);
        ck_assert_int_eq(store_meta_put(t, "", "x", 1, m), TARTAN_EINVAL);
        ck_assert_int_eq(store_meta_put(t, "with space", "x", 1, m), TARTAN_EINVAL);
        char longname[80];
        memset(longname, 'a', sizeof longname - 1);
        longname[79] = 0;
        ck_assert_int_eq(store_meta_put(t, longname, "x", 1, m), TARTAN_EINVAL);
    } else if (c->step == 1) {
        ck_assert_int_eq(store_meta_get(t, "calibration", &d, &len, m), 0);
        ck_assert_uint_eq(len, 10);
        ck_assert(!memcmp(d, "0123456789", 10));
        ck_assert_int_eq(store_meta_get(t, "empty", &d, &len, m), 0);
        ck_assert_uint_eq(len, 0);
        ck_assert_int_eq(store_meta_get(t, "absent", &d, &len, m), TARTAN_ENOTFOUND);
        /* A sound value under another name is damage: the checksum covers the name. */
        MDB_val k = {11, "calibration"}, v;
        ck_assert_int_eq(mdb_get(t->st_txn, t->st_gen->g_meta, &k, &v), 0);
        uint8_t copy[64];
        memcpy(copy, v.mv_data, v.mv_size);
        MDB_val k2 = {11, "calibratioN"}, v2 = {v.mv_size, copy};
        ck_assert_int_eq(mdb_put(t->st_txn, t->st_gen->g_meta, &k2, &v2, 0), 0);
        ck_assert_int_eq(store_meta_get(t, "calibratioN", &d, &len, m), TARTAN_ECORRUPT);
        ck_assert_ptr_nonnull(strstr(m->text, "checksum"));
        ck_assert_int_eq(store_meta_del(t, "calibratioN", m), 0);
        ck_assert_int_eq(store_meta_del(t, "calibratioN", m), TARTAN_ENOTFOUND);
    }
    return 0;
}

START_TEST(test_format_meta_records)
{
    store_env *env = raw_env();
    store_msg m = {{0}};
    meta_ctx c = {0};
    ck_assert_int_eq(store_write(env, meta_fn, &c, &m), 0);
    c.step = 1;
    ck_assert_int_eq(store_write(env, meta_fn, &c, &m), 0);
    /* Every byte of the record flipped in the file: the read fails, never returns junk. */
    store_txn *t;
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    const void *d;
    size_t len;
    ck_assert_int_eq(store_meta_get(t, "calibration", &d, &len, &m), 0);
    long at = damage_offset(t, (const uint8_t *)d - 4);
    store_read_end(env, t);
    store_close(env);
    for (long i = 0; i < 14; i++) {
        damage_flip(ixpath, at + i, 0x04);
        ck_assert_int_eq(store_open(ixpath, STORE_READONLY, NULL, 0, &env, &m), 0);
        ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
        ck_assert_int_eq(store_meta_get(t, "calibration", &d, &len, &m), TARTAN_ECORRUPT);
        store_read_end(env, t);
        store_close(env);
        damage_flip(ixpath, at + i, 0x04);
    }
}
END_TEST

/* ---- segments against a reference --------------------------------------------------------- */

#define RT_CB 2
#define RT_TB 32

/* A document's content is a function of its number and token count: nothing to store. */
static void doc_content(uint32_t docno, uint32_t ntok, float *norms, uint16_t *codes,
                        uint8_t *res)
{
    uint64_t s = rng_state;
    rng_state = 0x1234567ull * (docno + 1);
    for (uint32_t t = 0; t < ntok; t++) {
        norms[t] = 0.5f + (float)(rnd() % 1000) / 1000.0f;
        codes[t] = (uint16_t)rnd();
        for (int b = 0; b < RT_TB; b++)
            res[(size_t)t * RT_TB + b] = (uint8_t)rnd();
    }
    rng_state = s;
}

typedef struct seg_ref {
    uint32_t n;       /* numbers handed out */
    uint32_t *ntok;   /* [cap]: 0 when absent */
    uint32_t cap;
    uint32_t *batch; /* numbers of the change in hand */
    size_t nbatch;
    int op; /* 0 add, 1 delete */
} seg_ref;

/* Token counts: mostly short, sometimes one larger than a whole segment (256 KiB). */
static uint32_t pick_len(void)
{
    uint64_t r = rnd() % 100;
    if (r < 3)
        return 7000 + (uint32_t)(rnd() % 3000);
    if (r < 20)
        return 1 + (uint32_t)(rnd() % 3);
    return 1 + (uint32_t)(rnd() % 400);
}

static int seg_change(store_txn *t, void *vctx, store_msg *m)
{
    seg_ref *r = vctx;
    size_t maxtok = 10000;
    float *norms = malloc(maxtok * 4);
    uint16_t *codes = malloc(maxtok * 2);
    uint8_t *res = malloc(maxtok * RT_TB);
    ck_assert(norms && codes && res);
    int rc = 0;
    if (r->op == 0) {
        store_appender *a;
        ck_assert_int_eq(store_docs_append_begin(t, RT_CB, RT_TB, &a, m), 0);
        for (size_t i = 0; i < r->nbatch && !rc; i++) {
            uint32_t d = r->batch[i];
            doc_content(d, r->ntok[d], norms, codes, res);
            rc = store_docs_append(a, d, r->ntok[d], norms, codes, 2, res, m);
        }
        ck_assert_msg(rc == 0, "%s", m->text);
        ck_assert_msg(store_docs_append_end(a, m) == 0, "%s", m->text);
    } else {
        rc = store_docs_delete(t, r->batch, r->nbatch, m);
        ck_assert_msg(rc == 0, "%s", m->text);
    }
    free(norms);
    free(codes);
    free(res);
    return rc;
}

static void seg_compare(store_env *env, seg_ref *r)
{
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    float *norms = malloc(10000 * 4);
    uint16_t *codes = malloc(10000 * 2);
    uint8_t *res = malloc(10000 * RT_TB);
    /* Every document in order, nothing else. */
    store_cursor *cur;
    ck_assert_int_eq(store_docs_first(t, 1, &cur, &m), 0);
    uint32_t want = 0, docno;
    const void *rec;
    size_t size;
    int rc;
    while ((rc = store_docs_next(cur, &docno, &rec, &size, &m)) == 1) {
        while (want < r->n && !r->ntok[want])
            want++;
        ck_assert_uint_eq(docno, want);
        store_doc d;
        ck_assert_msg(store_doc_parse(docno, rec, size, RT_CB, RT_TB, 1, &d, &m) == 0, "%s",
                      m.text);
        ck_assert_uint_eq(d.ntok, r->ntok[docno]);
        doc_content(docno, d.ntok, norms, codes, res);
        ck_assert(!memcmp(d.inv_norms, norms, (size_t)d.ntok * 4));
        ck_assert(!memcmp(d.codes, codes, (size_t)d.ntok * 2));
        ck_assert(!memcmp(d.residuals, res, (size_t)d.ntok * RT_TB));
        want++;
    }
    ck_assert_int_eq(rc, 0);
    while (want < r->n && !r->ntok[want])
        want++;
    ck_assert_uint_eq(want, r->n);
    store_cursor_close(cur);
    /* Lookups by number, present and absent, in random order and ascending runs. */
    for (int i = 0; i < 300 && r->n; i++) {
        uint32_t d0 = (uint32_t)(rnd() % (r->n + 5));
        for (uint32_t d = d0; d < d0 + 4; d++) {
            store_doc doc;
            rc = store_doc_get(t, d, RT_CB, RT_TB, 1, &doc, &m);
            if (d < r->n && r->ntok[d]) {
                ck_assert_msg(rc == 0, "document %u: %s", d, m.text);
                ck_assert_uint_eq(doc.ntok, r->ntok[d]);
                ck_assert_uint_eq((uintptr_t)doc.inv_norms % 4, 0);
                doc_content(d, doc.ntok, norms, codes, res);
                ck_assert(!memcmp(doc.residuals, res, (size_t)doc.ntok * RT_TB));
            } else {
                ck_assert_int_eq(rc, TARTAN_ENOTFOUND);
            }
        }
    }
    /* Segments: sound, at most 256 KiB unless a single document, keys ascending. */
    MDB_cursor *c;
    ck_assert_int_eq(mdb_cursor_open(t->st_txn, t->st_gen->g_docs, &c), 0);
    MDB_val k, v;
    MDB_cursor_op op = MDB_FIRST;
    while (mdb_cursor_get(c, &k, &v, op) == 0) {
        op = MDB_NEXT;
        store_seg s;
        uint32_t key;
        memcpy(&key, k.mv_data, 4);
        ck_assert_int_eq(store_seg_parse(key, v.mv_data, v.mv_size, 0, 0, 1, &s, &m), 0);
        ck_assert_msg(s.n == 1 || v.mv_size <= (256u << 10), "segment %u: %zu bytes, %u docs",
                      key, v.mv_size, s.n);
    }
    mdb_cursor_close(c);
    store_read_end(env, t);
    free(norms);
    free(codes);
    free(res);
}

START_TEST(test_format_segments_round_trip)
{
    rng_state = 1601;
    store_env *env = raw_env();
    seg_ref r = {0};
    r.cap = 4096;
    r.ntok = calloc(r.cap, sizeof *r.ntok);
    r.batch = malloc(r.cap * sizeof *r.batch);
    store_msg m = {{0}};
    for (int round = 0; round < 60; round++) {
        r.nbatch = 0;
        if (round < 3 || rnd() % 3) {
            /* an add: 1..40 documents (small batches reopen the last segment) */
            size_t n = round % 5 == 0 ? 1 : 1 + rnd() % 40;
            for (size_t i = 0; i < n && r.n < r.cap; i++) {
                r.ntok[r.n] = pick_len();
                r.batch[r.nbatch++] = r.n++;
            }
            r.op = 0;
        } else {
            /* a delete: a random share of the live documents, ascending */
            uint64_t share = rnd() % 60;
            for (uint32_t d = 0; d < r.n; d++)
                if (r.ntok[d] && rnd() % 100 < share)
                    r.batch[r.nbatch++] = d;
            r.op = 1;
        }
        ck_assert_msg(store_write(env, seg_change, &r, &m) == 0, "%s", m.text);
        if (r.op == 1)
            for (size_t i = 0; i < r.nbatch; i++)
                r.ntok[r.batch[i]] = 0;
        seg_compare(env, &r);
    }
    free(r.ntok);
    free(r.batch);
    store_close(env);
}
END_TEST

typedef struct bad_ctx {
    uint32_t docno;
    int op;
} bad_ctx;

static int bad_change(store_txn *t, void *vctx, store_msg *m)
{
    bad_ctx *c = vctx;
    if (c->op == 0) {
        store_appender *a;
        ck_assert_int_eq(store_docs_append_begin(t, RT_CB, RT_TB, &a, m), 0);
        float n = 1;
        uint16_t code = 0;
        uint8_t res[RT_TB] = {0};
        int rc = store_docs_append(a, c->docno, 1, &n, &code, 2, res, m);
        if (rc) {
            store_docs_append_free(a);
            return rc;
        }
        return store_docs_append_end(a, m);
    }
    return store_docs_delete(t, &c->docno, 1, m);
}

START_TEST(test_format_segments_refuse)
{
    store_env *env = raw_env();
    store_msg m = {{0}};
    bad_ctx c = {5, 0};
    ck_assert_int_eq(store_write(env, bad_change, &c, &m), 0);
    c.docno = 5; /* not above the last number */
    ck_assert_int_eq(store_write(env, bad_change, &c, &m), TARTAN_ECORRUPT);
    c.docno = 3;
    ck_assert_int_eq(store_write(env, bad_change, &c, &m), TARTAN_ECORRUPT);
    c.op = 1; /* deleting a number never added */
    ck_assert_int_eq(store_write(env, bad_change, &c, &m), TARTAN_ENOTFOUND);
    c.docno = 5;
    ck_assert_int_eq(store_write(env, bad_change, &c, &m), 0);
    ck_assert_int_eq(store_write(env, bad_change, &c, &m), TARTAN_ENOTFOUND);
    store_close(env);
}
END_TEST

/* ---- inverted-list blocks against a reference --------------------------------------------- */

#define NLISTS 6

typedef struct ivf_ref {
    uint32_t *v[NLISTS];
    size_t n[NLISTS], cap[NLISTS];
    uint32_t next[NLISTS]; /* the next number a list may take */
    uint32_t *batch;
    size_t nbatch;
    uint32_t c;
    int op;
} ivf_ref;

static int ivf_change(store_txn *t, void *vctx, store_msg *m)
{
    ivf_ref *r = vctx;
    int rc = r->op == 0 ? store_ivf_append(t, r->c, r->batch, r->nbatch, m)
                        : store_ivf_remove(t, r->c, r->batch, r->nbatch, m);
    ck_assert_msg(rc == 0, "%s", m->text);
    return rc;
}

static void ivf_compare(store_env *env, ivf_ref *r)
{
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    for (uint32_t c = 0; c < NLISTS + 1; c++) {
        store_ivf_iter *it;
        ck_assert_int_eq(store_ivf_open(t, c, &it, &m), 0);
        size_t at = 0, n, want = c < NLISTS ? r->n[c] : 0;
        const uint32_t *v;
        int rc;
        while ((rc = store_ivf_next(it, &v, &n, &m)) == 1) {
            ck_assert_uint_le(n, STORE_IVF_BLOCK);
            ck_assert_uint_le(at + n, want);
            ck_assert_msg(!memcmp(v, r->v[c] + at, n * 4), "list %u differs at %zu", c, at);
            at += n;
        }
        ck_assert_int_eq(rc, 0);
        ck_assert_uint_eq(at, want);
        store_ivf_close(it);
        size_t cnt;
        ck_assert_int_eq(store_ivf_count(t, c, &cnt, &m), 0);
        ck_assert_uint_eq(cnt, want);
    }
    store_read_end(env, t);
}

START_TEST(test_format_ivf_round_trip)
{
    rng_state = 1602;
    store_env *env = raw_env();
    ivf_ref r;
    memset(&r, 0, sizeof r);
    r.batch = malloc(5000 * sizeof *r.batch);
    store_msg m = {{0}};
    for (int round = 0; round < 200; round++) {
        r.c = (uint32_t)(rnd() % NLISTS);
        uint32_t c = r.c;
        r.nbatch = 0;
        if (r.n[c] == 0 || rnd() % 3) {
            /* gaps of every width: consecutive runs (0 bits), small, large, near 2^32 */
            size_t n = rnd() % 4 ? 1 + rnd() % 30 : 200 + rnd() % 700;
            int kind = (int)(rnd() % 4);
            for (size_t i = 0; i < n; i++) {
                uint64_t gap = kind == 0 ? 0 : kind == 1 ? rnd() % 50 : kind == 2 ? rnd() % 100000
                                                                                    : rnd() % (1u << 24);
                if ((uint64_t)r.next[c] + gap >= UINT32_MAX - 1)
                    break;
                uint32_t d = r.next[c] + (uint32_t)gap;
                r.batch[r.nbatch++] = d;
                r.next[c] = d + 1;
            }
            if (r.nbatch == 0)
                continue;
            r.op = 0;
        } else {
            uint64_t share = rnd() % 70;
            for (size_t i = 0; i < r.n[c]; i++)
                if (rnd() % 100 < share)
                    r.batch[r.nbatch++] = r.v[c][i];
            if (r.nbatch == 0)
                continue;
            r.op = 1;
        }
        ck_assert_msg(store_write(env, ivf_change, &r, &m) == 0, "%s", m.text);
        if (r.op == 0) {
            if (r.n[c] + r.nbatch > r.cap[c]) {
                r.cap[c] = 2 * (r.n[c] + r.nbatch);
                r.v[c] = realloc(r.v[c], r.cap[c] * sizeof *r.v[c]);
            }
            memcpy(r.v[c] + r.n[c], r.batch, r.nbatch * 4);
            r.n[c] += r.nbatch;
        } else {
            size_t w = 0, j = 0;
            for (size_t i = 0; i < r.n[c]; i++) {
                if (j < r.nbatch && r.batch[j] == r.v[c][i]) {
                    j++;
                    continue;
                }
                r.v[c][w++] = r.v[c][i];
            }
            r.n[c] = w;
        }
        ivf_compare(env, &r);
    }
    /* The largest number a list can hold. */
    r.c = 0;
    r.op = 0;
    r.batch[0] = UINT32_MAX - 1;
    r.nbatch = r.next[0] <= UINT32_MAX - 1 ? 1 : 0;
    if (r.nbatch) {
        ck_assert_int_eq(store_write(env, ivf_change, &r, &m), 0);
        r.v[0] = realloc(r.v[0], (r.n[0] + 1) * sizeof *r.v[0]);
        r.v[0][r.n[0]++] = UINT32_MAX - 1;
        ivf_compare(env, &r);
    }
    for (int c = 0; c < NLISTS; c++)
        free(r.v[c]);
    free(r.batch);
    store_close(env);
}
END_TEST

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
    tartan_batch b2 = {(size_t)(n - n / 2), ids + n / 2, lens + n / 2, emb + half_rows * DIM,
                       rows - half_rows, DIM, TARTAN_FLOAT32};
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
typedef enum { R_FORMAT, R_HEADER, R_CODEC, R_CENTROIDS, R_SEGDIR, R_DOC, R_BLOCK, R_ID, R_NAME } rkind;

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
    static const char *const names[] = {"format", "header",  "codec",    "centroids", "segment",
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

static Suite *format_suite(void)
{
    Suite *s = suite_create("format");
    struct {
        const char *name;
        const TTest *t;
    } tests[] = {
        {"f16_conversions", test_format_f16_conversions},
        {"meta_records", test_format_meta_records},
        {"segments_round_trip", test_format_segments_round_trip},
        {"segments_refuse", test_format_segments_refuse},
        {"ivf_round_trip", test_format_ivf_round_trip},
        {"every_record_checksum", test_format_every_record_checksum},
        {"v1_refused_then_converted", test_format_v1_refused_then_converted},
        {"v1_damaged_not_converted", test_format_v1_damaged_not_converted},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, tests[i].t);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(format_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
