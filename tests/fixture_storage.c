/* fixture_storage.c: see fixture_storage.h. */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "fixture.h"
#include "fixture_storage.h"
#include "index.h"
#include "kernels.h"
#include "store.h"

/* Cluster centres shared by all batches of a test, so that later batches resemble earlier. */
#define NCLUST 24
static float centres[NCLUST][256];
static size_t centres_dim;

void make_centres(size_t dim)
{
    centres_dim = dim;
    for (int c = 0; c < NCLUST; c++)
        for (size_t j = 0; j < dim; j++)
            centres[c][j] = (float)gauss();
}

void clustered_token(float *x, size_t dim)
{
    int c = (int)(rnd() % NCLUST);
    for (size_t j = 0; j < dim; j++)
        x[j] = centres[c][j] + 0.35f * (float)gauss();
}

void tbatch_make(tbatch *t, size_t n_docs, size_t minlen, size_t maxlen, size_t dim,
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
    for (size_t r = 0; r < t->n_rows; r++)
        clustered_token(t->emb + r * dim, dim);
    t->b.n_docs = n_docs;
    t->b.ids = (const char *const *)t->ids;
    t->b.doclens = t->doclens;
    t->b.embeddings = t->emb;
    t->b.n_rows = t->n_rows;
    t->b.dim = dim;
    t->b.dtype = TARTAN_FLOAT32;
}

void tbatch_free(tbatch *t)
{
    for (size_t i = 0; i < t->n_docs; i++)
        free(t->ids[i]);
    free(t->ids);
    free(t->doclens);
    free(t->emb);
}

/* Row offset of document i. */
size_t tbatch_off(const tbatch *t, size_t i)
{
    size_t o = 0;
    for (size_t k = 0; k < i; k++)
        o += t->doclens[k];
    return o;
}

tartan_db *open_new(size_t dim, unsigned nbits, size_t k)
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

tartan_db *reopen(uint32_t flags)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = flags;
    tartan_db *db = NULL;
    int rc = tartan_open(ixpath, &o, &db);
    ck_assert_msg(rc == 0, "reopen: %s", tartan_errmsg(NULL));
    return db;
}

void add_ok(tartan_db *db, const tbatch *t, unsigned flags)
{
    int rc = tartan_add(db, &t->b, flags);
    ck_assert_msg(rc == 0, "add: %s", tartan_errmsg(db));
}

/* ---- whole-index dumps: every key and value of every database ---------------------------- */

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

dumpbuf dump_index(tartan_db *db)
{
    dumpbuf d = {0};
    store_msg m;
    store_txn *txn;
    ck_assert_int_eq(store_read_begin(db->env, &txn, &m), 0);
    ck_assert_int_eq(store_dump(txn, dump_fn, &d, &m), 0);
    store_read_end(db->env, txn);
    return d;
}

void assert_same_dump(dumpbuf *a, dumpbuf *b)
{
    ck_assert_uint_eq(a->n, b->n);
    ck_assert_int_eq(memcmp(a->p, b->p, a->n), 0);
    free(a->p);
    free(b->p);
}

/* ---- reading helpers -------------------------------------------------------------------- */

uint32_t code_at(const idx_reader *r, const kern_pdoc *d, uint32_t t)
{
    return r->h.code_bytes == 2 ? ((const uint16_t *)d->codes)[t] : ((const uint32_t *)d->codes)[t];
}

/* The test's own unpacking (DESIGN.md: each dimension's bucket as nbits bits, least
 * significant first; the stream packed into bytes most significant bit first). */
unsigned ref_bucket(const uint8_t *packed, unsigned nbits, size_t j)
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
void ref_decompress(const idx_reader *r, const kern_pdoc *d, uint32_t t, double *out)
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

uint32_t docno_of(const idx_reader *r, const char *id)
{
    uint32_t n = UINT32_MAX;
    store_msg m;
    ck_assert_int_eq(idx_reader_docno(r, id, &n, &m), 0);
    return n;
}

/* Cosine of the stored token against the original (normalised in double). */
double cos_orig(const float *orig, const double *dec, size_t dim)
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
double check_docs(tartan_db *db, const tbatch *t)
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
void check_ivf_consistent(tartan_db *db)
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
void check_info_adds_up(tartan_db *db)
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
