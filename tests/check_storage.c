/*
 * check_storage.c: the on-disk index: create, reopen, add, delete, replace, training, inverted
 * lists, the codec's round trip through LMDB, bad input (each leaves the index byte-identical),
 * format versions, read-only indexes, map growth, and a bounded-memory build by the tool.
 * Real LMDB in a fresh temporary directory per test, removed after.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db.h"
#include "index.h"
#include "kernels.h"
#include "store.h"
#include "store_internal.h"
#include "damage.h"
#include "fixture.h"
#include "tartan.h"

/* ---- fixture: a fresh directory per test (tests/fixture.c) ------------------------------ */

static void setup(void)
{
    fixture_dir_create("check-storage");
}

static void teardown(void)
{
    fixture_dir_remove();
}

/* ---- random, clustered embeddings ------------------------------------------------------- */

/* A batch the tests own: ids "<prefix><n>", clustered tokens, lengths in [minlen, maxlen]. */
typedef struct tbatch {
    size_t n_docs, n_rows, dim;
    char **ids;
    size_t *doclens;
    float *emb;
    tartan_batch b;
} tbatch;

/* Cluster centres shared by all batches of a test, so that later batches resemble earlier. */
#define NCLUST 24
static float centres[NCLUST][256];
static size_t centres_dim;

static void make_centres(size_t dim)
{
    centres_dim = dim;
    for (int c = 0; c < NCLUST; c++)
        for (size_t j = 0; j < dim; j++)
            centres[c][j] = (float)gauss();
}

static void tbatch_make(tbatch *t, size_t n_docs, size_t minlen, size_t maxlen, size_t dim,
                        const char *prefix, size_t first)
{
    if (centres_dim != dim)
        make_centres(dim);
    memset(t, 0, sizeof *t);
    t->n_docs = n_docs;
    t->dim = dim;
    t->ids = calloc(n_docs, sizeof *t->ids);
    t->doclens = calloc(n_docs, sizeof *t->doclens);
    for (size_t i = 0; i < n_docs; i++) {
        ck_assert_int_gt(asprintf(&t->ids[i], "%s%zu", prefix, first + i), 0);
        t->doclens[i] = minlen + (size_t)(rnd() % (maxlen - minlen + 1));
        t->n_rows += t->doclens[i];
    }
    t->emb = malloc(t->n_rows * dim * sizeof(float));
    for (size_t r = 0; r < t->n_rows; r++) {
        int c = (int)(rnd() % NCLUST);
        for (size_t j = 0; j < dim; j++)
            t->emb[r * dim + j] = centres[c][j] + 0.35f * (float)gauss();
    }
    t->b.n_docs = n_docs;
    t->b.ids = (const char *const *)t->ids;
    t->b.doclens = t->doclens;
    t->b.embeddings = t->emb;
    t->b.n_rows = t->n_rows;
    t->b.dim = dim;
    t->b.dtype = TARTAN_FLOAT32;
}

static void tbatch_free(tbatch *t)
{
    for (size_t i = 0; i < t->n_docs; i++)
        free(t->ids[i]);
    free(t->ids);
    free(t->doclens);
    free(t->emb);
}

/* Row offset of document i. */
static size_t tbatch_off(const tbatch *t, size_t i)
{
    size_t o = 0;
    for (size_t k = 0; k < i; k++)
        o += t->doclens[k];
    return o;
}

static tartan_db *open_new(size_t dim, unsigned nbits, size_t k)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE | TARTAN_EXCL;
    o.dim = dim;
    o.nbits = nbits;
    o.n_centroids = k;
    tartan_db *db = NULL;
    int rc = tartan_open(ixpath, &o, &db);
    ck_assert_msg(rc == 0, "open: %s", tartan_errmsg(NULL));
    ck_assert_ptr_nonnull(db);
    return db;
}

static tartan_db *reopen(uint32_t flags)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = flags;
    tartan_db *db = NULL;
    int rc = tartan_open(ixpath, &o, &db);
    ck_assert_msg(rc == 0, "reopen: %s", tartan_errmsg(NULL));
    return db;
}

static void add_ok(tartan_db *db, const tbatch *t, unsigned flags)
{
    int rc = tartan_add(db, &t->b, flags);
    ck_assert_msg(rc == 0, "add: %s", tartan_errmsg(db));
}

/* ---- whole-index dumps: every key and value of every database ---------------------------- */

typedef struct dumpbuf {
    uint8_t *p;
    size_t n, cap;
} dumpbuf;

static void dump_put(dumpbuf *d, const void *x, size_t n)
{
    if (d->n + n > d->cap) {
        d->cap = (d->n + n) * 2 + 4096;
        d->p = realloc(d->p, d->cap);
    }
    memcpy(d->p + d->n, x, n);
    d->n += n;
}

static int dump_fn(const char *db, const void *k, size_t kl, const void *v, size_t vl, void *ctx)
{
    dumpbuf *d = ctx;
    dump_put(d, db, strlen(db) + 1);
    dump_put(d, &kl, sizeof kl);
    dump_put(d, k, kl);
    dump_put(d, &vl, sizeof vl);
    dump_put(d, v, vl);
    return 0;
}

static dumpbuf dump_index(tartan_db *db)
{
    dumpbuf d = {0};
    store_msg m;
    store_txn *txn;
    ck_assert_int_eq(store_read_begin(db->env, &txn, &m), 0);
    ck_assert_int_eq(store_dump(txn, dump_fn, &d, &m), 0);
    store_read_end(db->env, txn);
    return d;
}

static void assert_same_dump(dumpbuf *a, dumpbuf *b)
{
    ck_assert_uint_eq(a->n, b->n);
    ck_assert_int_eq(memcmp(a->p, b->p, a->n), 0);
    free(a->p);
    free(b->p);
}

/* ---- reading helpers -------------------------------------------------------------------- */

static uint32_t code_at(const idx_reader *r, const kern_pdoc *d, uint32_t t)
{
    return r->h.code_bytes == 2 ? ((const uint16_t *)d->codes)[t] : ((const uint32_t *)d->codes)[t];
}

/* The test's own unpacking (DESIGN.md: each dimension's bucket as nbits bits, least
 * significant first; the stream packed into bytes most significant bit first). */
static unsigned ref_bucket(const uint8_t *packed, unsigned nbits, size_t j)
{
    unsigned b = 0;
    for (unsigned k = 0; k < nbits; k++) {
        size_t p = j * nbits + k;
        unsigned bit = (packed[p / 8] >> (7 - p % 8)) & 1u;
        b |= bit << k;
    }
    return b;
}

/* Decompresses token t of d in double: normalise(C[code] + w[bucket]). */
static void ref_decompress(const idx_reader *r, const kern_pdoc *d, uint32_t t, double *out)
{
    size_t dim = r->h.dim;
    uint32_t c = code_at(r, d, t);
    const uint8_t *pk = d->residuals + (size_t)t * r->h.token_bytes;
    double ss = 0;
    for (size_t j = 0; j < dim; j++) {
        out[j] = (double)r->centroids[(size_t)c * dim + j] +
                 (double)r->codec.weights[ref_bucket(pk, r->h.nbits, j)];
        ss += out[j] * out[j];
    }
    for (size_t j = 0; j < dim; j++)
        out[j] /= sqrt(ss);
}

static uint32_t docno_of(const idx_reader *r, const char *id)
{
    uint32_t n = UINT32_MAX;
    store_msg m;
    ck_assert_int_eq(idx_reader_docno(r, id, &n, &m), 0);
    return n;
}

/* Cosine of the stored token against the original (normalised in double). */
static double cos_orig(const float *orig, const double *dec, size_t dim)
{
    double dot = 0, ss = 0;
    for (size_t j = 0; j < dim; j++) {
        dot += (double)orig[j] * dec[j];
        ss += (double)orig[j] * orig[j];
    }
    return dot / sqrt(ss);
}

/*
 * Checks every document of t against the index: the code is a nearest centroid, the inverse
 * norm is 1/|C[c] + w[b]|, the library's decompression matches the reference, and the mean
 * cosine with the originals is returned.
 */
static double check_docs(tartan_db *db, const tbatch *t)
{
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert(r.trained);
    size_t dim = r.h.dim;
    double *ref = malloc(dim * sizeof *ref), *raw = malloc(dim * sizeof *raw);
    double sum = 0;
    size_t cnt = 0;
    for (size_t i = 0; i < t->n_docs; i++) {
        kern_pdoc d;
        ck_assert_int_eq(idx_reader_doc(&r, docno_of(&r, t->ids[i]), &d, &m), 0);
        ck_assert_uint_eq(d.ntok, t->doclens[i]);
        float *lib = malloc((size_t)d.ntok * dim * sizeof(float));
        for (size_t k = 0; k < (size_t)d.ntok * dim; k++)
            lib[k] = NAN;
        idx_reader_decompress(&r, &d, lib);
        const float *orig = t->emb + tbatch_off(t, i) * dim;
        for (uint32_t tok = 0; tok < d.ntok; tok++) {
            const float *x = orig + (size_t)tok * dim;
            /* Nearest centroid by inner product (ties within float rounding allowed). */
            double xn = 0;
            for (size_t j = 0; j < dim; j++)
                xn += (double)x[j] * x[j];
            xn = sqrt(xn);
            double best = -1e30, got = 0;
            uint32_t code = code_at(&r, &d, tok);
            ck_assert_uint_lt(code, r.h.n_centroids);
            for (uint32_t c = 0; c < r.h.n_centroids; c++) {
                double s = 0;
                for (size_t j = 0; j < dim; j++)
                    s += (double)x[j] / xn * r.centroids[(size_t)c * dim + j];
                if (s > best)
                    best = s;
                if (c == code)
                    got = s;
            }
            ck_assert_msg(got >= best - 1e-4, "token code %u scores %g, best %g", code, got, best);
            /* Inverse norm of the unnormalised decompressed vector. */
            const uint8_t *pk = d.residuals + (size_t)tok * r.h.token_bytes;
            double ss = 0;
            for (size_t j = 0; j < dim; j++) {
                raw[j] = (double)r.centroids[(size_t)code * dim + j] +
                         r.codec.weights[ref_bucket(pk, r.h.nbits, j)];
                ss += raw[j] * raw[j];
            }
            ck_assert_double_eq_tol(d.inv_norms[tok], 1.0 / sqrt(ss), 1e-5 / sqrt(ss));
            ref_decompress(&r, &d, tok, ref);
            for (size_t j = 0; j < dim; j++)
                ck_assert_double_eq_tol(lib[(size_t)tok * dim + j], ref[j], 1e-5);
            sum += cos_orig(x, ref, dim);
            cnt++;
        }
        free(lib);
    }
    free(ref);
    free(raw);
    idx_reader_close(&r);
    return sum / (double)cnt;
}

/* Expected inverted lists from the stored codes vs the stored lists, both ways, and the
 * header counts against a recount. */
static void check_ivf_consistent(tartan_db *db)
{
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    if (!r.trained) {
        idx_reader_close(&r);
        return;
    }
    uint32_t k = r.h.n_centroids, nd = r.h.next_docno;
    /* expected[c * nd + doc] */
    uint8_t *want = calloc((size_t)k * (nd ? nd : 1), 1);
    store_cursor *cur = NULL;
    uint32_t docno;
    kern_pdoc d;
    uint64_t docs = 0, toks = 0;
    int rc;
    while ((rc = idx_reader_next_doc(&r, &cur, &docno, &d, &m)) == 1) {
        ck_assert_uint_lt(docno, nd);
        docs++;
        toks += d.ntok;
        for (uint32_t t = 0; t < d.ntok; t++)
            want[(size_t)code_at(&r, &d, t) * nd + docno] = 1;
        /* ids <-> numbers both ways */
        const char *id;
        size_t len;
        ck_assert_int_eq(idx_reader_name(&r, docno, &id, &len, &m), 0);
        char buf[600];
        memcpy(buf, id, len);
        buf[len] = 0;
        ck_assert_uint_eq(docno_of(&r, buf), docno);
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(docs, r.h.n_docs);
    ck_assert_uint_eq(toks, r.h.n_tokens);
    size_t listed = 0;
    for (uint32_t c = 0; c < k; c++) {
        store_ivf_iter *it;
        ck_assert_int_eq(idx_reader_ivf_open(&r, c, &it, &m), 0);
        const uint32_t *v;
        size_t n;
        int64_t last = -1;
        while ((rc = store_ivf_next(it, &v, &n, &m)) == 1) {
            for (size_t i = 0; i < n; i++) {
                ck_assert_int_gt((int64_t)v[i], last); /* ascending, no repeats */
                last = v[i];
                ck_assert_uint_lt(v[i], nd);
                ck_assert_msg(want[(size_t)c * nd + v[i]],
                              "centroid %u lists document %u, which has no such code", c, v[i]);
                want[(size_t)c * nd + v[i]] = 2;
                listed++;
            }
        }
        ck_assert_int_eq(rc, 0);
        store_ivf_close(it);
    }
    for (size_t i = 0; i < (size_t)k * nd; i++)
        ck_assert_msg(want[i] != 1, "centroid %zu misses document %zu", i / nd, i % nd);
    free(want);
    idx_reader_close(&r);
    (void)listed;
}

/* The parts of tartan_info add up to the file, less LMDB's own few pages (meta pages,
 * catalogue, free-list tree), and the inverted lists take some bytes when they have entries. */
static void check_info_adds_up(tartan_db *db)
{
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    uint64_t parts = info.bytes_docs + info.bytes_ivf + info.bytes_ids + info.bytes_centroids +
                     info.bytes_meta + info.bytes_free;
    ck_assert_uint_le(parts, info.bytes_file);
    ck_assert_uint_le(info.bytes_file - parts, 8 * 4096);
    ck_assert(info.ivf_entries == 0 || info.bytes_ivf > 0);
    ck_assert_uint_ge(info.bytes_docs,
                      info.bytes_residuals + info.bytes_codes + info.bytes_norms + 8 * info.n_docs);
}

/* ---- tests ------------------------------------------------------------------------------ */

START_TEST(test_storage_create_reopen_info)
{
    rng_state = 101;
    tartan_db *db = open_new(32, 2, 16);
    tartan_index_info info;
    for (size_t i = 0; i < sizeof info; i++)
        ((uint8_t *)&info)[i] = 0xa5;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 0);
    ck_assert_uint_eq(info.n_centroids, 0);
    ck_assert_uint_eq(info.dim, 32);
    tbatch t;
    tbatch_make(&t, 60, 3, 20, 32, "doc", 0);
    add_ok(db, &t, 0);
    tartan_close(db);
    db = reopen(0);
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 60);
    ck_assert_uint_eq(info.n_tokens, t.n_rows);
    ck_assert_uint_eq(info.dim, 32);
    ck_assert_uint_eq(info.nbits, 2);
    ck_assert_uint_eq(info.n_centroids, 16);
    ck_assert_uint_eq(info.code_bytes, 2);
    ck_assert_uint_eq(info.bytes_residuals, t.n_rows * 32 * 2 / 8);
    ck_assert_uint_eq(info.bytes_codes, t.n_rows * 2);
    ck_assert_uint_eq(info.bytes_norms, t.n_rows * 4);
    ck_assert_uint_ge(info.bytes_docs, info.bytes_residuals + info.bytes_codes + info.bytes_norms);
    ck_assert_uint_gt(info.bytes_ivf, 0);
    ck_assert_uint_gt(info.ivf_entries, 59);
    ck_assert_uint_gt(info.bytes_ids, 0);
    ck_assert_uint_gt(info.bytes_file, info.bytes_docs);
    check_info_adds_up(db);
    /* Created exclusively again: refused; without EXCL: opened. */
    tartan_close(db);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE | TARTAN_EXCL;
    o.dim = 32;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EEXIST);
    ck_assert_ptr_null(db);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "TARTAN_EEXIST"));
    o.flags = TARTAN_CREATE;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 60);
    tartan_close(db);
    tartan_close(NULL);
    tbatch_free(&t);
}
END_TEST

/* Round trip at nbits b: codes, norms and decompression against the reference, and the
 * mean cosine with the originals above a floor that grows with the bits. */
static void round_trip(unsigned nbits, double floor_cos)
{
    rng_state = 200 + nbits;
    tartan_db *db = open_new(64, nbits, 32);
    tbatch t;
    tbatch_make(&t, 40, 5, 30, 64, "r", 0);
    add_ok(db, &t, 0);
    double c = check_docs(db, &t);
    ck_assert_msg(c > floor_cos, "nbits %u: mean cosine %g", nbits, c);
    /* The same after reopening. */
    tartan_close(db);
    db = reopen(TARTAN_READONLY);
    ck_assert_double_eq_tol(check_docs(db, &t), c, 1e-12);
    tartan_close(db);
    tbatch_free(&t);
}

START_TEST(test_storage_round_trip_nbits1)
{
    round_trip(1, 0.75);
}
END_TEST

START_TEST(test_storage_round_trip_nbits2)
{
    round_trip(2, 0.9);
}
END_TEST

START_TEST(test_storage_round_trip_nbits4)
{
    round_trip(4, 0.97);
}
END_TEST

START_TEST(test_storage_round_trip_nbits8)
{
    round_trip(8, 0.97);
}
END_TEST

START_TEST(test_storage_float16_input)
{
    rng_state = 300;
    tartan_db *db = open_new(32, 2, 16);
    tbatch t;
    tbatch_make(&t, 30, 2, 12, 32, "h", 0);
    uint16_t *h = malloc(t.n_rows * 32 * sizeof *h);
    for (size_t i = 0; i < t.n_rows * 32; i++) {
        h[i] = kern_f32_to_f16(t.emb[i]);
        t.emb[i] = kern_f16_to_f32(h[i]); /* the originals are what fp16 holds */
    }
    tartan_batch b = t.b;
    b.embeddings = h;
    b.dtype = TARTAN_FLOAT16;
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    ck_assert(check_docs(db, &t) > 0.9);
    free(h);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

START_TEST(test_storage_add_after_build)
{
    rng_state = 400;
    tartan_db *db = open_new(32, 2, 16);
    tbatch a, b;
    tbatch_make(&a, 50, 2, 15, 32, "a", 0);
    tbatch_make(&b, 70, 2, 15, 32, "b", 0);
    add_ok(db, &a, 0);
    dumpbuf before = dump_index(db);
    /* The centroids and codec stay as the first add trained them. */
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    size_t csz = (size_t)r.h.n_centroids * 32;
    float *c0 = malloc(csz * sizeof(float));
    memcpy(c0, r.centroids, csz * sizeof(float));
    idx_codec codec0 = r.codec;
    idx_reader_close(&r);
    add_ok(db, &b, 0);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert_int_eq(memcmp(c0, r.centroids, csz * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(&codec0, &r.codec, sizeof codec0), 0);
    ck_assert_uint_eq(r.h.n_docs, 120);
    ck_assert_uint_eq(r.h.n_tokens, a.n_rows + b.n_rows);
    idx_reader_close(&r);
    ck_assert(check_docs(db, &a) > 0.85);
    ck_assert(check_docs(db, &b) > 0.85);
    check_ivf_consistent(db);
    free(c0);
    free(before.p);
    tartan_close(db);
    tbatch_free(&a);
    tbatch_free(&b);
}
END_TEST

START_TEST(test_storage_delete)
{
    rng_state = 500;
    tartan_db *db = open_new(32, 2, 16);
    tbatch t;
    tbatch_make(&t, 40, 2, 10, 32, "d", 0);
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t gone[3] = {docno_of(&r, "d3"), docno_of(&r, "d17"), docno_of(&r, "d39")};
    uint32_t next0 = r.h.next_docno;
    idx_reader_close(&r);
    const char *ids[] = {"d3", "d17", "nope", "d39", "d3"};
    size_t n = 99;
    ck_assert_msg(tartan_delete(db, ids, 5, &n) == 0, "%s", tartan_errmsg(db));
    ck_assert_uint_eq(n, 3);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 37);
    ck_assert_uint_eq(info.n_tokens, t.n_rows - t.doclens[3] - t.doclens[17] - t.doclens[39]);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t x;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(idx_reader_docno(&r, ids[i == 2 ? 3 : i], &x, &m), TARTAN_ENOTFOUND);
        kern_pdoc d;
        ck_assert_int_eq(idx_reader_doc(&r, gone[i], &d, &m), TARTAN_ENOTFOUND);
        const char *id;
        size_t len;
        ck_assert_int_eq(idx_reader_name(&r, gone[i], &id, &len, &m), TARTAN_ENOTFOUND);
    }
    idx_reader_close(&r);
    check_ivf_consistent(db); /* no list names a deleted number */
    /* New documents get new numbers, above every number ever used; "d3" may come back. */
    tbatch u;
    tbatch_make(&u, 5, 2, 10, 32, "d", 3);
    free(u.ids[1]);
    u.ids[1] = strdup("fresh");
    free(u.ids[2]);
    u.ids[2] = strdup("d39x");
    free(u.ids[3]);
    u.ids[3] = strdup("new3");
    free(u.ids[4]);
    u.ids[4] = strdup("new4");
    add_ok(db, &u, 0);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert_uint_ge(docno_of(&r, "d3"), next0);
    ck_assert_uint_ne(docno_of(&r, "d3"), gone[0]);
    ck_assert_uint_eq(r.h.next_docno, next0 + 5);
    idx_reader_close(&r);
    check_ivf_consistent(db);
    ck_assert(check_docs(db, &u) > 0.85);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}
END_TEST

START_TEST(test_storage_ivf_consistent_random)
{
    rng_state = 600;
    tartan_db *db = open_new(16, 2, 8);
    size_t next = 0;
    char **live = calloc(2000, sizeof *live);
    size_t nlive = 0;
    for (int round = 0; round < 12; round++) {
        tbatch t;
        size_t n = 5 + rnd() % 25;
        tbatch_make(&t, n, 1, 12, 16, "x", next);
        next += n;
        add_ok(db, &t, 0);
        for (size_t i = 0; i < n; i++)
            live[nlive++] = strdup(t.ids[i]);
        tbatch_free(&t);
        /* Delete a random handful. */
        size_t nd = rnd() % (nlive / 2 + 1);
        const char **del = calloc(nd + 1, sizeof *del);
        for (size_t i = 0; i < nd; i++) {
            size_t j = rnd() % nlive;
            del[i] = live[j];
            live[j] = live[--nlive];
        }
        size_t got;
        ck_assert_int_eq(tartan_delete(db, del, nd, &got), 0);
        ck_assert_uint_eq(got, nd);
        for (size_t i = 0; i < nd; i++)
            free((char *)del[i]);
        free(del);
        check_ivf_consistent(db);
        tartan_index_info info;
        ck_assert_int_eq(tartan_info(db, &info), 0);
        ck_assert_uint_eq(info.n_docs, nlive);
    }
    for (size_t i = 0; i < nlive; i++)
        free(live[i]);
    free(live);
    tartan_close(db);
}
END_TEST

START_TEST(test_storage_replace)
{
    rng_state = 700;
    tartan_db *db = open_new(32, 2, 16);
    tbatch t, u;
    tbatch_make(&t, 20, 2, 10, 32, "p", 0);
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t old = docno_of(&r, "p5");
    idx_reader_close(&r);
    /* p5 and p6 again with other tokens and lengths, plus a new one. */
    tbatch_make(&u, 3, 11, 14, 32, "p", 5);
    free(u.ids[2]);
    u.ids[2] = strdup("q");
    ck_assert_int_eq(tartan_add(db, &u.b, 0), TARTAN_EDUPID);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "'p5'"));
    add_ok(db, &u, TARTAN_REPLACE);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 21);
    ck_assert_uint_eq(info.n_tokens, t.n_rows - t.doclens[5] - t.doclens[6] + u.n_rows);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert_uint_ne(docno_of(&r, "p5"), old);
    kern_pdoc d;
    ck_assert_int_eq(idx_reader_doc(&r, old, &d, &m), TARTAN_ENOTFOUND);
    idx_reader_close(&r);
    ck_assert(check_docs(db, &u) > 0.85); /* the new tokens, not the old */
    check_ivf_consistent(db);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}
END_TEST

START_TEST(test_storage_train_then_add)
{
    rng_state = 800;
    tartan_db *db = open_new(32, 4, 0);
    tbatch s, t;
    tbatch_make(&s, 80, 5, 10, 32, "s", 0);
    tbatch_make(&t, 30, 5, 10, 32, "t", 0);
    tartan_batch sb = s.b;
    sb.ids = NULL; /* a sample needs no ids */
    ck_assert_msg(tartan_train(db, &sb, 4096) == 0, "%s", tartan_errmsg(db));
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    /* K from the corpus size given: 2^floor(log2(16 sqrt(4096))) = 1024, at most the points
     * k-means had (95% of the sample). */
    size_t ntrain = s.n_rows - (size_t)(0.05 * s.n_rows);
    ck_assert_uint_eq(info.n_centroids, ntrain < 1024 ? ntrain : 1024);
    ck_assert_uint_eq(info.n_docs, 0);
    ck_assert_int_eq(tartan_train(db, &sb, 0), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "trained already"));
    add_ok(db, &t, 0);
    ck_assert(check_docs(db, &t) > 0.95);
    tartan_close(db);
    tbatch_free(&s);
    tbatch_free(&t);
}
END_TEST

/* Tokens are L2-normalised before encoding: a document and the same document scaled by 8
 * (exact in binary floating point) are stored identically. */
START_TEST(test_storage_tokens_normalised)
{
    rng_state = 850;
    tartan_db *db = open_new(32, 2, 16);
    tbatch t;
    tbatch_make(&t, 20, 4, 9, 32, "n", 0);
    size_t off = tbatch_off(&t, 7), len = t.doclens[7];
    /* Document 19 becomes document 7 times 8. */
    size_t off19 = tbatch_off(&t, 19);
    ck_assert_uint_ge(t.n_rows - off19, len);
    t.doclens[19] = len;
    t.n_rows = off19 + len;
    t.b.n_rows = t.n_rows;
    for (size_t i = 0; i < len * 32; i++)
        t.emb[off19 * 32 + i] = 8.0f * t.emb[off * 32 + i];
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    kern_pdoc a, b;
    ck_assert_int_eq(idx_reader_doc(&r, docno_of(&r, "n7"), &a, &m), 0);
    ck_assert_int_eq(idx_reader_doc(&r, docno_of(&r, "n19"), &b, &m), 0);
    ck_assert_uint_eq(a.ntok, b.ntok);
    ck_assert_int_eq(memcmp(a.codes, b.codes, a.ntok * r.h.code_bytes), 0);
    ck_assert_int_eq(memcmp(a.residuals, b.residuals, a.ntok * r.h.token_bytes), 0);
    ck_assert_int_eq(memcmp(a.inv_norms, b.inv_norms, a.ntok * sizeof(float)), 0);
    /* And a stored token decompresses to a unit vector close to the normalised original. */
    double *ref = malloc(32 * sizeof *ref), ss = 0;
    ref_decompress(&r, &a, 0, ref);
    for (int j = 0; j < 32; j++)
        ss += ref[j] * ref[j];
    ck_assert_double_eq_tol(ss, 1.0, 1e-9);
    free(ref);
    idx_reader_close(&r);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

/* ---- bad input: each gets its code and message, and the index stays byte-identical ------ */

typedef void (*spoil_fn)(tbatch *t, tartan_batch *b);

static void bad_input(spoil_fn spoil, int want, const char *msg_part, unsigned flags)
{
    rng_state = 900;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t, u;
    tbatch_make(&t, 10, 2, 6, 16, "ok", 0);
    add_ok(db, &t, 0);
    dumpbuf before = dump_index(db);
    tbatch_make(&u, 6, 2, 6, 16, "in", 0);
    tartan_batch b = u.b;
    spoil(&u, &b);
    int rc = tartan_add(db, &b, flags);
    ck_assert_msg(rc == want, "got %s (%s), want %s", tartan_err_name(rc), tartan_errmsg(db),
                  tartan_err_name(want));
    const char *msg = tartan_errmsg(db);
    ck_assert_msg(strncmp(msg, tartan_err_name(want), strlen(tartan_err_name(want))) == 0,
                  "message '%s'", msg);
    ck_assert_msg(strstr(msg, msg_part), "message '%s' lacks '%s'", msg, msg_part);
    dumpbuf after = dump_index(db);
    assert_same_dump(&before, &after);
    /* And the same after reopening: nothing reached the disk either. */
    tartan_close(db);
    db = reopen(0);
    after = dump_index(db);
    before = after;
    before.p = malloc(after.n);
    memcpy(before.p, after.p, after.n);
    assert_same_dump(&before, &after);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}

static void spoil_dim(tbatch *t, tartan_batch *b)
{
    b->dim = 15;
    b->n_rows = t->n_rows * 16 / 15;
}
static void spoil_nan(tbatch *t, tartan_batch *b)
{
    size_t off = tbatch_off(t, 4);
    t->emb[(off + 1) * 16 + 7] = NAN;
}
static void spoil_inf(tbatch *t, tartan_batch *b)
{
    t->emb[tbatch_off(t, 5) * 16 + 3] = -INFINITY;
}
static void spoil_empty_doc(tbatch *t, tartan_batch *b)
{
    t->doclens[2] = 0;
}
static void spoil_sum(tbatch *t, tartan_batch *b)
{
    b->n_rows = t->n_rows - 1;
}
static void spoil_dup_batch(tbatch *t, tartan_batch *b)
{
    free(t->ids[4]);
    t->ids[4] = strdup("in1");
}
static void spoil_dup_index(tbatch *t, tartan_batch *b)
{
    /* The last document: the earlier ones are written in the transaction before the clash. */
    free(t->ids[5]);
    t->ids[5] = strdup("ok7");
}
static void spoil_empty_id(tbatch *t, tartan_batch *b)
{
    free(t->ids[3]);
    t->ids[3] = strdup("");
}
static void spoil_ctrl_id(tbatch *t, tartan_batch *b)
{
    free(t->ids[3]);
    t->ids[3] = strdup("a\nb");
}
static void spoil_zero(tbatch *t, tartan_batch *b)
{
    memset(t->emb + tbatch_off(t, 1) * 16, 0, 16 * sizeof(float));
}
static void spoil_dtype(tbatch *t, tartan_batch *b)
{
    b->dtype = (tartan_dtype)7;
}
static void spoil_long_doc(tbatch *t, tartan_batch *b)
{
    t->doclens[0] = STORE_MAX_DOC_TOKENS + 1;
}

START_TEST(test_storage_bad_dim)
{
    bad_input(spoil_dim, TARTAN_EDIM, "dimension 15", 0);
}
END_TEST
START_TEST(test_storage_bad_nan)
{
    bad_input(spoil_nan, TARTAN_ENONFINITE, "document 4 (id 'in4'): token 1 has NaN at dimension 7",
              0);
}
END_TEST
START_TEST(test_storage_bad_inf)
{
    bad_input(spoil_inf, TARTAN_ENONFINITE, "document 5 (id 'in5'): token 0 has infinity", 0);
}
END_TEST
START_TEST(test_storage_bad_empty_document)
{
    bad_input(spoil_empty_doc, TARTAN_EEMPTY, "document 2 (id 'in2') has no tokens", 0);
}
END_TEST
START_TEST(test_storage_bad_doclens_sum)
{
    bad_input(spoil_sum, TARTAN_EINVAL, "doclens sum to", 0);
}
END_TEST
START_TEST(test_storage_bad_duplicate_in_batch)
{
    bad_input(spoil_dup_batch, TARTAN_EDUPID, "documents 1 and 4 have the same id 'in1'", 0);
}
END_TEST
START_TEST(test_storage_bad_duplicate_in_index)
{
    bad_input(spoil_dup_index, TARTAN_EDUPID, "document 5 (id 'ok7')", 0);
}
END_TEST
START_TEST(test_storage_bad_empty_id)
{
    bad_input(spoil_empty_id, TARTAN_EBADID, "document 3: empty id", 0);
}
END_TEST
START_TEST(test_storage_bad_control_id)
{
    bad_input(spoil_ctrl_id, TARTAN_EBADID, "control character", TARTAN_REPLACE);
}
END_TEST
START_TEST(test_storage_bad_zero_token)
{
    bad_input(spoil_zero, TARTAN_ERANGE, "document 1 (id 'in1'): token 0 is all zeros", 0);
}
END_TEST
START_TEST(test_storage_bad_dtype)
{
    bad_input(spoil_dtype, TARTAN_EDTYPE, "dtype 7", 0);
}
END_TEST
START_TEST(test_storage_bad_long_document)
{
    bad_input(spoil_long_doc, TARTAN_ETOOBIG, "document 0 (id 'in0') has 1048577 tokens", 0);
}
END_TEST

START_TEST(test_storage_bad_arguments)
{
    rng_state = 950;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t;
    tbatch_make(&t, 10, 2, 6, 16, "ok", 0);
    add_ok(db, &t, 0);
    dumpbuf before = dump_index(db);
    ck_assert_int_eq(tartan_add(db, NULL, 0), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_add(db, &t.b, 0x80), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_add(NULL, &t.b, 0), TARTAN_EINVAL);
    tartan_batch b = t.b;
    b.ids = NULL;
    ck_assert_int_eq(tartan_add(db, &b, 0), TARTAN_EINVAL);
    b = t.b;
    b.n_docs = 0;
    ck_assert_int_eq(tartan_add(db, &b, 0), TARTAN_EEMPTY);
    const char *bad[] = {"ok1", ""};
    size_t n = 7;
    ck_assert_int_eq(tartan_delete(db, bad, 2, &n), TARTAN_EBADID);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(tartan_delete(db, NULL, 3, &n), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_info(db, NULL), TARTAN_EINVAL);
    /* Deleting nothing that exists changes nothing either. */
    const char *none[] = {"zz"};
    ck_assert_int_eq(tartan_delete(db, none, 1, &n), 0);
    ck_assert_uint_eq(n, 0);
    dumpbuf after = dump_index(db);
    assert_same_dump(&before, &after);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

START_TEST(test_storage_readonly_handle)
{
    rng_state = 960;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t;
    tbatch_make(&t, 10, 2, 6, 16, "ok", 0);
    add_ok(db, &t, 0);
    dumpbuf before = dump_index(db);
    tartan_close(db);
    db = reopen(TARTAN_READONLY);
    tbatch u;
    tbatch_make(&u, 3, 2, 6, 16, "ro", 0);
    ck_assert_int_eq(tartan_add(db, &u.b, 0), TARTAN_EREADONLY);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "read-only"));
    const char *ids[] = {"ok1"};
    ck_assert_int_eq(tartan_delete(db, ids, 1, NULL), TARTAN_EREADONLY);
    ck_assert_int_eq(tartan_train(db, &u.b, 0), TARTAN_EREADONLY);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 10);
    dumpbuf after = dump_index(db);
    assert_same_dump(&before, &after);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}
END_TEST

/* ---- opening: errors, versions, permissions --------------------------------------------- */

START_TEST(test_storage_open_errors)
{
    tartan_db *db = (tartan_db *)1;
    tartan_options o;
    tartan_options_init(&o);
    /* No directory. */
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), ENOENT);
    ck_assert_ptr_null(db);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), ixpath));
    ck_assert_int_eq(strncmp(tartan_errmsg(NULL), "ENOENT: ", 8), 0);
    /* An empty directory. */
    ck_assert_int_eq(mkdir(ixpath, 0755), 0);
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_ENOINDEX);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "TARTAN_ENOINDEX"));
    /* Creating without a dimension, or with bad nbits. */
    o.flags = TARTAN_CREATE;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    o.dim = 12;
    o.nbits = 3;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    o.nbits = 1;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL); /* 12 bits: not bytes */
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "multiple of 8"));
    o.nbits = 2;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tartan_close(db);
    /* A different dimension when opening. */
    tartan_options_init(&o);
    o.dim = 16;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EDIM);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "dimension 12"));
    /* A file, not a directory. */
    char file[400];
    snprintf(file, sizeof file, "%s/afile", tmpdir);
    FILE *f = fopen(file, "w");
    fclose(f);
    o.dim = 0;
    ck_assert_int_eq(tartan_open(file, &o, &db), ENOTDIR);
    /* Another program's LMDB environment. */
    char other[400];
    snprintf(other, sizeof other, "%s/other", tmpdir);
    mkdir(other, 0755);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    mdb_env_create(&env);
    ck_assert_int_eq(mdb_env_open(env, other, 0, 0644), 0);
    mdb_txn_begin(env, NULL, 0, &txn);
    mdb_dbi_open(txn, NULL, 0, &dbi);
    MDB_val k = {3, "key"}, v = {5, "value"};
    mdb_put(txn, dbi, &k, &v, 0);
    mdb_txn_commit(txn);
    mdb_env_close(env);
    o.flags = TARTAN_CREATE;
    o.dim = 8;
    ck_assert_int_eq(tartan_open(other, &o, &db), TARTAN_ENOINDEX);
    ck_assert_int_eq(tartan_open(NULL, &o, &db), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_open(ixpath, &o, NULL), TARTAN_EINVAL);
    o.flags = 0x100;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
}
END_TEST

/* Writes format version v into an index's meta "format" with plain LMDB, as a build of that
 * version would (FORMAT.md: magic, version, CRC-32C). */
static void set_version(uint32_t v)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    mdb_env_create(&env);
    mdb_env_set_maxdbs(env, 8);
    ck_assert_int_eq(mdb_env_open(env, ixpath, 0, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    ck_assert_int_eq(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    MDB_val k = {6, "format"}, d;
    ck_assert_int_eq(mdb_get(txn, dbi, &k, &d), 0);
    ck_assert_uint_eq(d.mv_size, 16);
    uint8_t buf[16];
    memcpy(buf, d.mv_data, 16);
    memcpy(buf + 8, &v, 4);
    uint32_t c = store_meta_crc("format", 6, buf, 12);
    memcpy(buf + 12, &c, 4);
    d.mv_data = buf;
    ck_assert_int_eq(mdb_put(txn, dbi, &k, &d, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

START_TEST(test_storage_unknown_version_refused)
{
    tartan_db *db = open_new(16, 2, 8);
    tartan_close(db);
    set_version(STORE_FORMAT_VERSION + 98);
    tartan_options o;
    tartan_options_init(&o);
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EVERSION);
    ck_assert_ptr_null(db);
    const char *msg = tartan_errmsg(NULL);
    char want[32];
    snprintf(want, sizeof want, "version %u", STORE_FORMAT_VERSION + 98);
    ck_assert_msg(strstr(msg, "TARTAN_EVERSION") && strstr(msg, want) &&
                      strstr(msg, "only version 2"),
                  "message '%s'", msg);
    o.flags = TARTAN_READONLY;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EVERSION);
    set_version(STORE_FORMAT_VERSION);
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tartan_close(db);
}
END_TEST

/* In a child process: without write permission to the index directory, a read-write open is
 * refused (EACCES) and a read-only one works. Root drops to nobody to lose the permission. */
START_TEST(test_storage_readonly_directory)
{
    rng_state = 970;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t;
    tbatch_make(&t, 8, 2, 6, 16, "ok", 0);
    add_ok(db, &t, 0);
    tartan_close(db);
    tbatch_free(&t);
    ck_assert_int_eq(chmod(tmpdir, 0755), 0);
    char lock[400], data[400];
    snprintf(lock, sizeof lock, "%s/lock.mdb", ixpath);
    snprintf(data, sizeof data, "%s/data.mdb", ixpath);
    ck_assert_int_eq(chmod(lock, 0444), 0);
    ck_assert_int_eq(chmod(data, 0444), 0);
    ck_assert_int_eq(chmod(ixpath, 0555), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(10);
        tartan_options o;
        tartan_options_init(&o);
        tartan_db *d = NULL;
        if (tartan_open(ixpath, &o, &d) != EACCES)
            _exit(11);
        if (!strstr(tartan_errmsg(NULL), "read-only"))
            _exit(12);
        o.flags = TARTAN_READONLY;
        if (tartan_open(ixpath, &o, &d) != 0)
            _exit(13);
        tartan_index_info info;
        if (tartan_info(d, &info) != 0 || info.n_docs != 8)
            _exit(14);
        const char *ids[] = {"ok1"};
        if (tartan_delete(d, ids, 1, NULL) != TARTAN_EREADONLY)
            _exit(15);
        tartan_close(d);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", WEXITSTATUS(st));
}
END_TEST

START_TEST(test_storage_map_growth)
{
    rng_state = 980;
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = 64;
    o.nbits = 8;
    o.n_centroids = 8;
    o.map_size = 256 << 10; /* 256 KiB: far less than the batches below */
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tbatch a, b;
    tbatch_make(&a, 300, 20, 40, 64, "g", 0); /* ~2.2 MB of documents */
    tbatch_make(&b, 300, 20, 40, 64, "h", 0);
    add_ok(db, &a, 0);
    add_ok(db, &b, 0);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 600);
    ck_assert_uint_gt(info.map_size, 256 << 10);
    ck_assert_uint_ge(info.map_size, info.bytes_file);
    check_info_adds_up(db);
    check_ivf_consistent(db);
    ck_assert(check_docs(db, &b) > 0.97);
    /* A reopen with the small size asked again adopts the file's size. */
    tartan_close(db);
    o.flags = 0;
    o.dim = 0;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tbatch c;
    tbatch_make(&c, 100, 20, 40, 64, "i", 0);
    add_ok(db, &c, 0);
    ck_assert(check_docs(db, &a) > 0.97);
    tartan_close(db);
    tbatch_free(&a);
    tbatch_free(&b);
    tbatch_free(&c);
}
END_TEST

/* ---- the stored bytes: alignment, checksums, long inverted lists -------------------------- */

START_TEST(test_storage_blob_alignment)
{
    rng_state = 1000;
    tartan_db *db = open_new(24, 1, 8); /* 3-byte residuals: odd sizes everywhere */
    char **ids = NULL;
    size_t nids = 0;
    for (int round = 0; round < 6; round++) {
        tbatch t;
        tbatch_make(&t, 60, 1, 300, 24, "al", (size_t)round * 60);
        add_ok(db, &t, 0);
        ids = realloc(ids, (nids + 60) * sizeof *ids);
        for (size_t i = 0; i < 60; i++)
            ids[nids++] = strdup(t.ids[i]);
        tbatch_free(&t);
        const char *del[20];
        for (int i = 0; i < 20; i++)
            del[i] = ids[rnd() % nids];
        ck_assert_int_eq(tartan_delete(db, del, 20, NULL), 0);
    }
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    store_cursor *cur = NULL;
    uint32_t docno;
    kern_pdoc d;
    int rc, n = 0;
    while ((rc = idx_reader_next_doc(&r, &cur, &docno, &d, &m)) == 1) {
        ck_assert_uint_eq((uintptr_t)d.inv_norms % 4, 0);
        ck_assert_uint_eq((uintptr_t)d.codes % 2, 0);
        n++;
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_int_gt(n, 100);
    ck_assert_uint_eq((uintptr_t)r.centroids % 4, 0);
    idx_reader_close(&r);
    for (size_t i = 0; i < nids; i++)
        free(ids[i]);
    free(ids);
    tartan_close(db);
}
END_TEST

START_TEST(test_storage_checksum_detects_damage)
{
    rng_state = 1100;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t;
    tbatch_make(&t, 10, 3, 8, 16, "c", 0);
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t victim = docno_of(&r, "c4");
    idx_reader_close(&r);
    tartan_close(db);
    /* Flip one residual bit of c4 in the file, behind the library's back. */
    db = reopen(TARTAN_READONLY);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    kern_pdoc rd;
    ck_assert_int_eq(idx_reader_doc(&r, victim, &rd, &m), 0);
    long at = damage_offset(r.txn, rd.residuals + 3);
    idx_reader_close(&r);
    tartan_close(db);
    damage_flip(ixpath, at, 0x10);
    db = reopen(0);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    kern_pdoc pd;
    ck_assert_int_eq(idx_reader_doc(&r, victim, &pd, &m), TARTAN_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(m.text, "checksum"));
    ck_assert_int_eq(idx_reader_doc(&r, victim - 1, &pd, &m), 0);
    r.verify = 0;
    ck_assert_int_eq(idx_reader_doc(&r, victim, &pd, &m), 0);
    idx_reader_close(&r);
    /* Deleting the damaged document refuses rather than guessing its codes. */
    const char *ids[] = {"c4"};
    ck_assert_int_eq(tartan_delete(db, ids, 1, NULL), TARTAN_ECORRUPT);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

START_TEST(test_storage_crc32c)
{
    /* The standard check value of CRC-32C. */
    ck_assert_uint_eq(store_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(store_crc32c_portable(0, "123456789", 9), 0xE3069283u);
    rng_state = 1200;
    uint8_t buf[1031];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rnd();
    for (size_t off = 0; off < 9; off++) {
        size_t n = sizeof buf - off;
        /* Bit by bit, the definition. */
        uint32_t c = 0xffffffffu;
        for (size_t i = off; i < sizeof buf; i++) {
            c ^= buf[i];
            for (int k = 0; k < 8; k++)
                c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        }
        c = ~c;
        ck_assert_uint_eq(store_crc32c(0, buf + off, n), c);
        ck_assert_uint_eq(store_crc32c_portable(0, buf + off, n), c);
        /* Continued in two pieces. */
        ck_assert_uint_eq(store_crc32c(store_crc32c(0, buf + off, 100), buf + off + 100, n - 100),
                          c);
    }
}
END_TEST

START_TEST(test_storage_long_inverted_lists)
{
    rng_state = 1300;
    tartan_db *db = open_new(16, 2, 2); /* 2 centroids: lists of thousands, many pages */
    tbatch t;
    tbatch_make(&t, 3000, 1, 4, 16, "l", 0);
    add_ok(db, &t, 0);
    check_ivf_consistent(db);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    size_t total = 0, runs = 0;
    for (uint32_t c = 0; c < 2; c++) {
        store_ivf_iter *it;
        ck_assert_int_eq(idx_reader_ivf_open(&r, c, &it, &m), 0);
        const uint32_t *v;
        size_t n, cnt;
        while (store_ivf_next(it, &v, &n, &m) == 1) {
            total += n;
            runs++;
        }
        store_ivf_close(it);
        ck_assert_int_eq(store_ivf_count(r.txn, c, &cnt, &m), 0);
    }
    ck_assert_uint_ge(total, 3000);
    check_info_adds_up(db);
    ck_assert_uint_gt(runs, 2); /* more than a page per list: several runs */
    idx_reader_close(&r);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

/* A reader sees one snapshot while another thread adds. */
typedef struct adder {
    tartan_db *db;
    tbatch *t;
    int rc;
} adder;

static void *add_thread(void *p)
{
    adder *a = p;
    a->rc = tartan_add(a->db, &a->t->b, 0);
    return NULL;
}

START_TEST(test_storage_snapshot_isolation)
{
    rng_state = 1400;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t, u;
    tbatch_make(&t, 20, 2, 6, 16, "s", 0);
    tbatch_make(&u, 20, 2, 6, 16, "u", 0);
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    adder a = {db, &u, -1};
    pthread_t th;
    pthread_create(&th, NULL, add_thread, &a);
    pthread_join(th, NULL);
    ck_assert_int_eq(a.rc, 0);
    uint32_t x;
    ck_assert_int_eq(idx_reader_docno(&r, "u3", &x, &m), TARTAN_ENOTFOUND);
    ck_assert_uint_eq(r.h.n_docs, 20);
    idx_reader_close(&r);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert_int_eq(idx_reader_docno(&r, "u3", &x, &m), 0);
    idx_reader_close(&r);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}
END_TEST

START_TEST(test_storage_errmsg_per_handle)
{
    rng_state = 1500;
    tartan_db *a = open_new(16, 2, 8);
    char other[400];
    snprintf(other, sizeof other, "%s/second", tmpdir);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = 16;
    tartan_db *b;
    ck_assert_int_eq(tartan_open(other, &o, &b), 0);
    ck_assert_str_eq(tartan_errmsg(a), "TARTAN_OK: no error");
    ck_assert_int_eq(tartan_add(a, NULL, 0), TARTAN_EINVAL);
    ck_assert_int_eq(strncmp(tartan_errmsg(a), "TARTAN_EINVAL: ", 15), 0);
    ck_assert_str_eq(tartan_errmsg(b), "TARTAN_OK: no error");
    tartan_close(a);
    tartan_close(b);
}
END_TEST

/* ---- the tool: a build in bounded memory ------------------------------------------------- */

/* Writes a 2-D float32 or 1-D int64 .npy by hand (the test's own writer). */
static void write_npy_header(FILE *f, const char *descr, const char *shape)
{
    char h[256];
    int n = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
                     shape);
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    uint16_t hl = (uint16_t)(n + pad + 1);
    fwrite(&hl, 2, 1, f);
    fwrite(h, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
}

START_TEST(test_storage_bounded_memory_build)
{
    const char *bld = getenv("top_builddir");
    char tool[512];
    snprintf(tool, sizeof tool, "%s/tartan", bld ? bld : ".");
    if (access(tool, X_OK) != 0) {
        /* Built by make before the tests; absent only when run by hand elsewhere. */
        ck_abort_msg("no tartan tool at %s", tool);
    }
    /* 24,000 documents of 16 tokens at dim 128: 196 MB of float32 written in slices. */
    const size_t ndocs = 24000, len = 16, dim = 128, rows = ndocs * len;
    char emb[400], lens[400];
    snprintf(emb, sizeof emb, "%s/emb.npy", tmpdir);
    snprintf(lens, sizeof lens, "%s/lens.npy", tmpdir);
    FILE *f = fopen(emb, "wb");
    char shape[64];
    snprintf(shape, sizeof shape, "(%zu, %zu)", rows, dim);
    write_npy_header(f, "<f4", shape);
    long hdr = ftell(f);
    fclose(f);
    /* The data through a shared mapping, as numpy.memmap writes it: the page cache then holds
     * it in large folios, which a careless reader maps far beyond the pages it touches. */
    size_t bytes = rows * dim * sizeof(float);
    int fd = open(emb, O_RDWR);
    ck_assert_int_eq(ftruncate(fd, hdr + (off_t)bytes), 0);
    uint8_t *map = mmap(NULL, hdr + bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(map, MAP_FAILED);
    float *data = (float *)(map + hdr);
    rng_state = 1600;
    make_centres(dim);
    for (size_t r = 0; r < rows; r++) {
        int c = (int)(rnd() % NCLUST);
        for (size_t j = 0; j < dim; j++)
            data[r * dim + j] = centres[c][j] + 0.35f * (float)gauss();
    }
    munmap(map, hdr + bytes);
    close(fd);
    f = fopen(lens, "wb");
    snprintf(shape, sizeof shape, "(%zu,)", ndocs);
    write_npy_header(f, "<i8", shape);
    for (size_t i = 0; i < ndocs; i++) {
        int64_t l = (int64_t)len;
        fwrite(&l, 8, 1, f);
    }
    fclose(f);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        execl(tool, "tartan", "build", ixpath, "--embeddings", emb, "--doclens", lens, "--batch",
              "500", "--centroids", "64", "--sample", "500", "--no-calibrate", (char *)NULL);
        _exit(127);
    }
    int st;
    struct rusage ru;
    ck_assert_int_eq(wait4(pid, &st, 0, &ru), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tartan build: status %d",
                  WEXITSTATUS(st));
    /* The file is 196 MB; a build that held it (or its normalised copy, or had it mapped in)
     * would exceed this. What remains is the libraries, a batch, the sample and the map pages
     * of the index that LMDB touched. */
    long peak_kib = ru.ru_maxrss;
#if !defined(__SANITIZE_ADDRESS__)
    /* Not under AddressSanitizer: its quarantine of freed blocks and its shadow memory add
     * more than the bound itself. */
    ck_assert_msg(peak_kib < 80 * 1024, "peak RSS %ld KiB", peak_kib);
#else
    (void)peak_kib;
#endif
    tartan_db *db = reopen(TARTAN_READONLY);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, ndocs);
    ck_assert_uint_eq(info.n_tokens, rows);
    ck_assert_uint_eq(info.n_centroids, 64);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t x;
    ck_assert_int_eq(idx_reader_docno(&r, "0", &x, &m), 0);
    ck_assert_int_eq(idx_reader_docno(&r, "23999", &x, &m), 0);
    idx_reader_close(&r);
    tartan_close(db);
}
END_TEST

/* Runs the tool with args (NULL-terminated); its stderr goes to tmpdir/stderr.txt. Returns
 * the exit status. */
static int run_tool(const char *const *args)
{
    const char *bld = getenv("top_builddir");
    char tool[512], errf[400];
    snprintf(tool, sizeof tool, "%s/tartan", bld ? bld : ".");
    snprintf(errf, sizeof errf, "%s/stderr.txt", tmpdir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        int out = open("/dev/null", O_WRONLY);
        dup2(out, 1);
        execv(tool, (char *const *)args);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static char *slurp(const char *name)
{
    char p[400];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "r");
    static char buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    return buf;
}

/* A small corpus as .npy files: n documents of 3..9 tokens, dim 16; ids file of nid lines. */
static void write_corpus(const char *tag, size_t n, size_t nid, const char *idprefix)
{
    char emb[400], lens[400], ids[400], shape[64];
    snprintf(emb, sizeof emb, "%s/%s-emb.npy", tmpdir, tag);
    snprintf(lens, sizeof lens, "%s/%s-lens.npy", tmpdir, tag);
    snprintf(ids, sizeof ids, "%s/%s-ids.txt", tmpdir, tag);
    tbatch t;
    tbatch_make(&t, n, 3, 9, 16, idprefix, 0);
    FILE *f = fopen(emb, "wb");
    snprintf(shape, sizeof shape, "(%zu, 16)", t.n_rows);
    write_npy_header(f, "<f4", shape);
    fwrite(t.emb, sizeof(float), t.n_rows * 16, f);
    fclose(f);
    f = fopen(lens, "wb");
    snprintf(shape, sizeof shape, "(%zu,)", n);
    write_npy_header(f, "<i4", shape);
    for (size_t i = 0; i < n; i++) {
        int32_t l = (int32_t)t.doclens[i];
        fwrite(&l, 4, 1, f);
    }
    fclose(f);
    f = fopen(ids, "w");
    for (size_t i = 0; i < nid; i++)
        fprintf(f, "%s%zu\n", idprefix, i);
    fclose(f);
    tbatch_free(&t);
}

START_TEST(test_storage_tool_commands)
{
    rng_state = 1700;
    write_corpus("a", 300, 300, "a");
    write_corpus("b", 50, 50, "b");
    write_corpus("c", 40, 39, "c"); /* one id short */
    char emb[400], lens[400], ids[400], del[400];
#define FILES(tag)                                                                                 \
    snprintf(emb, sizeof emb, "%s/%s-emb.npy", tmpdir, tag);                                       \
    snprintf(lens, sizeof lens, "%s/%s-lens.npy", tmpdir, tag);                                    \
    snprintf(ids, sizeof ids, "%s/%s-ids.txt", tmpdir, tag)
    FILES("a");
    const char *build[] = {"tartan", "build", ixpath, "--embeddings", emb,  "--doclens",
                           lens,     "--ids", ids,    "--batch",      "64", "--centroids",
                           "32",     NULL};
    ck_assert_msg(run_tool(build) == 0, "build: %s", slurp("stderr.txt"));
    /* A second build over it is refused. */
    ck_assert_int_eq(run_tool(build), 1);
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "TARTAN_EEXIST"));
    FILES("b");
    const char *add[] = {"tartan", "add", ixpath, "--embeddings", emb, "--doclens", lens,
                         "--ids",  ids,   NULL};
    ck_assert_msg(run_tool(add) == 0, "add: %s", slurp("stderr.txt"));
    /* The same ids again: refused, then replaced. */
    ck_assert_int_eq(run_tool(add), 1);
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "TARTAN_EDUPID"));
    const char *replace[] = {"tartan", "add",   ixpath, "--embeddings", emb, "--doclens",
                             lens,     "--ids", ids,    "--replace",    NULL};
    ck_assert_int_eq(run_tool(replace), 0);
    tartan_db *db = reopen(0);
    dumpbuf before = dump_index(db);
    tartan_close(db);
    /* An ids file one line short: refused before the index is touched. */
    FILES("c");
    const char *bad[] = {"tartan", "add", ixpath, "--embeddings", emb, "--doclens", lens,
                         "--ids",  ids,   NULL};
    ck_assert_int_eq(run_tool(bad), 1);
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "has 39 ids but"));
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "TARTAN_ETRUNC"));
    db = reopen(0);
    dumpbuf after = dump_index(db);
    assert_same_dump(&before, &after);
    tartan_close(db);
    /* Delete a few. */
    snprintf(del, sizeof del, "%s/del.txt", tmpdir);
    FILE *f = fopen(del, "w");
    fprintf(f, "a1\nb7\nnot-there\n");
    fclose(f);
    const char *delete[] = {"tartan", "delete", ixpath, "--ids", del, NULL};
    ck_assert_int_eq(run_tool(delete), 0);
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "deleted 2 documents (1 ids"));
    const char *info[] = {"tartan", "info", ixpath, NULL};
    ck_assert_int_eq(run_tool(info), 0);
    const char *usage[] = {"tartan", "build", ixpath, NULL};
    ck_assert_int_eq(run_tool(usage), 2);
    db = reopen(TARTAN_READONLY);
    tartan_index_info in;
    ck_assert_int_eq(tartan_info(db, &in), 0);
    ck_assert_uint_eq(in.n_docs, 348);
    ck_assert_uint_eq(in.n_centroids, 32);
    tartan_close(db);
    check_ivf_consistent(db = reopen(0));
    tartan_close(db);
#undef FILES
}
END_TEST

/* ---- suite ------------------------------------------------------------------------------ */

static Suite *storage_suite(void)
{
    Suite *s = suite_create("storage");
    struct {
        const char *name;
        const TTest *test;
        int timeout;
    } cases[] = {
        {"create_reopen_info", test_storage_create_reopen_info, 0},
        {"round_trip_nbits1", test_storage_round_trip_nbits1, 0},
        {"round_trip_nbits2", test_storage_round_trip_nbits2, 0},
        {"round_trip_nbits4", test_storage_round_trip_nbits4, 0},
        {"round_trip_nbits8", test_storage_round_trip_nbits8, 0},
        {"float16_input", test_storage_float16_input, 0},
        {"add_after_build", test_storage_add_after_build, 0},
        {"delete", test_storage_delete, 0},
        {"ivf_consistent_random", test_storage_ivf_consistent_random, 0},
        {"replace", test_storage_replace, 0},
        {"train_then_add", test_storage_train_then_add, 0},
        {"tokens_normalised", test_storage_tokens_normalised, 0},
        {"bad_dim", test_storage_bad_dim, 0},
        {"bad_nan", test_storage_bad_nan, 0},
        {"bad_inf", test_storage_bad_inf, 0},
        {"bad_empty_document", test_storage_bad_empty_document, 0},
        {"bad_doclens_sum", test_storage_bad_doclens_sum, 0},
        {"bad_duplicate_in_batch", test_storage_bad_duplicate_in_batch, 0},
        {"bad_duplicate_in_index", test_storage_bad_duplicate_in_index, 0},
        {"bad_empty_id", test_storage_bad_empty_id, 0},
        {"bad_control_id", test_storage_bad_control_id, 0},
        {"bad_zero_token", test_storage_bad_zero_token, 0},
        {"bad_dtype", test_storage_bad_dtype, 0},
        {"bad_long_document", test_storage_bad_long_document, 0},
        {"bad_arguments", test_storage_bad_arguments, 0},
        {"readonly_handle", test_storage_readonly_handle, 0},
        {"open_errors", test_storage_open_errors, 0},
        {"unknown_version_refused", test_storage_unknown_version_refused, 0},
        {"readonly_directory", test_storage_readonly_directory, 0},
        {"map_growth", test_storage_map_growth, 0},
        {"blob_alignment", test_storage_blob_alignment, 0},
        {"checksum_detects_damage", test_storage_checksum_detects_damage, 0},
        {"crc32c", test_storage_crc32c, 0},
        {"long_inverted_lists", test_storage_long_inverted_lists, 0},
        {"snapshot_isolation", test_storage_snapshot_isolation, 0},
        {"errmsg_per_handle", test_storage_errmsg_per_handle, 0},
        {"bounded_memory_build", test_storage_bounded_memory_build, 60},
        {"tool_commands", test_storage_tool_commands, 60},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, cases[i].timeout ? cases[i].timeout : 30);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(storage_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
