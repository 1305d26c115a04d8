/*
 * check_format_records.c: index format version 2's records (storage/FORMAT.md) on real LMDB:
 * fp16 conversion against the kernels' own, the checksummed meta records, segments and
 * inverted-list blocks against in-memory references through random sequences of changes.
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
static void doc_content(uint32_t docno, uint32_t ntok, float *norms, uint16_t *codes, uint8_t *res)
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
    uint32_t n;     /* numbers handed out */
    uint32_t *ntok; /* [cap]: 0 when absent */
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
        ck_assert_msg(s.n == 1 || v.mv_size <= (256u << 10), "segment %u: %zu bytes, %u docs", key,
                      v.mv_size, s.n);
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
                uint64_t gap = kind == 0   ? 0
                               : kind == 1 ? rnd() % 50
                               : kind == 2 ? rnd() % 100000
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

int main(void)
{
    const fx_case cases[] = {
        {"f16_conversions", test_format_f16_conversions, 0},
        {"meta_records", test_format_meta_records, 0},
        {"segments_round_trip", test_format_segments_round_trip, 0},
        {"segments_refuse", test_format_segments_refuse, 0},
        {"ivf_round_trip", test_format_ivf_round_trip, 0},
    };
    return FX_RUN("format-records", cases, FX_DIR, 0);
}
