/*
 * model_io.c: an index's trained model as one byte string (tartan_model_export and
 * tartan_model_import), so that the shards of one corpus, built by different processes or
 * hosts, share one set of centroids and one codec and a document scores the same in any of
 * them.
 *
 * The string carries the header's model fields and every model record as the storage layer
 * keeps it (store_model_records: the codec tables, the centroid table, and whatever records a
 * later codec adds), so nothing here knows what a record holds. Layout, native byte order
 * (like the index files themselves, FORMAT.md "Conventions"):
 *
 *   offset size
 *        0    8  magic "tartanmd"
 *        8    4  u32 version of this layout (1)
 *       12    4  u32 format version of the index the records come from (2 or 3)
 *       16    4  u32 dim            20  4  u32 nbits        24  4  u32 n_centroids
 *       28    4  u32 code_bytes     32  4  u32 token_bytes  36  4  u32 kmeans_iters
 *       40    4  u32 sample_docs    44  4  u32 n_records    48  8  u64 seed
 *       56    8  u64 total length of the string, checksum included
 *       64       n_records records, each: u32 database (1 meta, 2 centroids), u32 key length,
 *                u64 value length, the key, the value, zero padding to a multiple of 8
 *      end-4  4  u32 CRC-32C of every byte before it
 *
 * An import checks the whole string (length, magic, checksum, versions, every record's bounds)
 * before it touches the index, writes it in one transaction, then reads the model back as a
 * search would (idx_model_load) before committing.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "index.h"
#include "model.h"
#include "tartan.h"

#define MODEL_MAGIC "tartanmd"
#define MODEL_VERSION 1u
#define HEAD_SIZE 64u
#define REC_HEAD 16u
/* A model string is centroids and small tables: far below this. The bound keeps a damaged
 * length field from asking for absurd allocations on import. */
#define MODEL_MAX_RECORDS 4096u

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* ---- export ------------------------------------------------------------------------- */

typedef struct out_buf {
    uint8_t *p;
    size_t len, cap;
    uint32_t n_records;
    int oom;
} out_buf;

static int reserve(out_buf *o, size_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    uint8_t *p = realloc(o->p, cap);
    if (!p)
        return ENOMEM;
    o->p = p;
    o->cap = cap;
    return 0;
}

static int add_record(int db, const void *key, size_t klen, const void *val, size_t vlen, void *ctx)
{
    out_buf *o = ctx;
    size_t need = REC_HEAD + pad8(klen + vlen);
    if (reserve(o, need)) {
        o->oom = 1;
        return ENOMEM;
    }
    uint8_t *r = o->p + o->len;
    memset(r, 0, need);
    store_put32(r, (uint32_t)db);
    store_put32(r + 4, (uint32_t)klen);
    store_put64(r + 8, (uint64_t)vlen);
    memcpy(r + REC_HEAD, key, klen);
    memcpy(r + REC_HEAD + klen, val, vlen);
    o->len += need;
    o->n_records++;
    return 0;
}

int idx_model_export(store_env *env, void **buf, size_t *len, store_msg *m)
{
    *buf = NULL;
    *len = 0;
    store_txn *txn;
    int rc = store_read_begin(env, &txn, m);
    if (rc)
        return rc;
    store_header h;
    out_buf o = {0};
    if ((rc = store_header_get(txn, &h, m)))
        goto done;
    if (h.n_centroids == 0) {
        rc = store_fail(m, TARTAN_ENOTTRAINED, "the index has no model yet (not trained)");
        goto done;
    }
    if (reserve(&o, HEAD_SIZE)) {
        rc = store_fail(m, ENOMEM, "out of memory exporting the model");
        goto done;
    }
    o.len = HEAD_SIZE;
    rc = store_model_records(txn, add_record, &o, m);
    if (rc) {
        if (o.oom)
            rc = store_fail(m, ENOMEM, "out of memory exporting the model");
        goto done;
    }
    if (reserve(&o, 4)) {
        rc = store_fail(m, ENOMEM, "out of memory exporting the model");
        goto done;
    }
    uint8_t *p = o.p;
    memset(p, 0, HEAD_SIZE);
    memcpy(p, MODEL_MAGIC, 8);
    store_put32(p + 8, MODEL_VERSION);
    unsigned version;
    if ((rc = store_format_version(txn, &version, m)))
        goto done;
    store_put32(p + 12, version);
    store_put32(p + 16, h.dim);
    store_put32(p + 20, h.nbits);
    store_put32(p + 24, h.n_centroids);
    store_put32(p + 28, h.code_bytes);
    store_put32(p + 32, h.token_bytes);
    store_put32(p + 36, h.kmeans_iters);
    store_put32(p + 40, h.sample_docs);
    store_put32(p + 44, o.n_records);
    store_put64(p + 48, h.seed);
    store_put64(p + 56, (uint64_t)(o.len + 4));
    store_put32(p + o.len, store_crc32c(0, p, o.len));
    o.len += 4;
    *buf = o.p;
    *len = o.len;
    o.p = NULL;
done:
    store_read_end(env, txn);
    free(o.p);
    return rc;
}

/* ---- import ------------------------------------------------------------------------- */

typedef struct model_in {
    const uint8_t *p;
    size_t len;
    store_header h; /* the model fields only */
    uint32_t n_records;
} model_in;

/* Checks the whole string before anything is written. */
static int parse(const void *buf, size_t len, model_in *in, store_msg *m)
{
    const uint8_t *p = buf;
    memset(in, 0, sizeof *in);
    if (len < HEAD_SIZE + 4 || memcmp(p, MODEL_MAGIC, 8))
        return store_fail(m, TARTAN_EFORMAT, "not a tartan model (%zu bytes%s)", len,
                          len >= 8 ? ", no \"tartanmd\" magic" : "");
    if (store_get64(p + 56) != len)
        return store_fail(m, TARTAN_ETRUNC, "the model says it has %llu bytes, it has %zu",
                          (unsigned long long)store_get64(p + 56), len);
    uint32_t want = store_get32(p + len - 4), got = store_crc32c(0, p, len - 4);
    if (want != got)
        return store_fail(m, TARTAN_ECORRUPT,
                          "model checksum mismatch (stored %08x, computed %08x)", want, got);
    if (store_get32(p + 8) != MODEL_VERSION)
        return store_fail(m, TARTAN_EVERSION, "model layout version %u; this build reads %u",
                          store_get32(p + 8), MODEL_VERSION);
    if (store_get32(p + 12) < STORE_FORMAT_VERSION || store_get32(p + 12) > STORE_FORMAT_MAX)
        return store_fail(m, TARTAN_EVERSION,
                          "the model comes from an index of format version %u; this build "
                          "writes versions %u to %u",
                          store_get32(p + 12), STORE_FORMAT_VERSION, STORE_FORMAT_MAX);
    store_header *h = &in->h;
    h->dim = store_get32(p + 16);
    h->nbits = store_get32(p + 20);
    h->n_centroids = store_get32(p + 24);
    h->code_bytes = store_get32(p + 28);
    h->token_bytes = store_get32(p + 32);
    h->kmeans_iters = store_get32(p + 36);
    h->sample_docs = store_get32(p + 40);
    h->seed = store_get64(p + 48);
    in->n_records = store_get32(p + 44);
    int nb_ok = h->nbits == 1 || h->nbits == 2 || h->nbits == 4 || h->nbits == 8;
    if (!nb_ok || h->dim == 0 || h->dim > (1u << 16) || (h->dim * h->nbits) % 8 ||
        h->token_bytes != h->dim * h->nbits / 8 || h->n_centroids == 0 ||
        h->code_bytes != (h->n_centroids <= 65536u ? 2u : 4u) || in->n_records > MODEL_MAX_RECORDS)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the model's description is inconsistent (dim %u, nbits %u, centroids "
                          "%u, code bytes %u, %u records)",
                          h->dim, h->nbits, h->n_centroids, h->code_bytes, in->n_records);
    size_t at = HEAD_SIZE, end = len - 4;
    for (uint32_t i = 0; i < in->n_records; i++) {
        if (end - at < REC_HEAD)
            return store_fail(m, TARTAN_ECORRUPT, "model record %u runs past the end", i);
        uint32_t db = store_get32(p + at), klen = store_get32(p + at + 4);
        uint64_t vlen = store_get64(p + at + 8);
        if (db != STORE_DB_META && db != STORE_DB_CENTROIDS)
            return store_fail(m, TARTAN_ECORRUPT, "model record %u names database %u", i, db);
        if (klen == 0 || klen > STORE_MAX_ID || vlen > end - at - REC_HEAD - klen)
            return store_fail(m, TARTAN_ECORRUPT, "model record %u runs past the end", i);
        at += REC_HEAD + pad8(klen + (size_t)vlen);
        if (at > end)
            return store_fail(m, TARTAN_ECORRUPT, "model record %u runs past the end", i);
    }
    if (at != end)
        return store_fail(m, TARTAN_ECORRUPT, "%zu stray bytes after the model's records",
                          end - at);
    in->p = p;
    in->len = len;
    return 0;
}

/* Calls fn on each record of a parsed string. */
static int each_record(const model_in *in, store_txn *txn,
                       int (*fn)(store_txn *, int, const uint8_t *, size_t, const uint8_t *, size_t,
                                 store_msg *),
                       store_msg *m)
{
    size_t at = HEAD_SIZE;
    for (uint32_t i = 0; i < in->n_records; i++) {
        const uint8_t *r = in->p + at;
        uint32_t klen = store_get32(r + 4);
        uint64_t vlen = store_get64(r + 8);
        int rc = fn(txn, (int)store_get32(r), r + REC_HEAD, klen, r + REC_HEAD + klen, (size_t)vlen, m);
        if (rc)
            return rc;
        at += REC_HEAD + pad8(klen + (size_t)vlen);
    }
    return 0;
}

static int put_one(store_txn *txn, int db, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl,
                   store_msg *m)
{
    return store_model_record_put(txn, db, k, kl, v, vl, m);
}

/* 0 when the index holds this record byte for byte, else TARTAN_EINVAL. */
static int same_one(store_txn *txn, int db, const uint8_t *k, size_t kl, const uint8_t *v,
                    size_t vl, store_msg *m)
{
    const void *have;
    size_t hl;
    int rc = store_model_record_get(txn, db, k, kl, &have, &hl, m);
    if (rc && rc != TARTAN_ENOTFOUND)
        return rc;
    if (rc || hl != vl || memcmp(have, v, vl))
        return store_fail(m, TARTAN_EINVAL, "the index is trained already, with another model");
    return 0;
}

/* Counts the index's own model records (an index trained with the same model has exactly the
 * string's, no more). */
static int count_one(int db, const void *key, size_t klen, const void *val, size_t vlen, void *ctx)
{
    (*(uint32_t *)ctx)++;
    return 0;
}

typedef struct import_ctx {
    const model_in *in;
    size_t dim;
    int unchanged; /* out: the index had this very model already */
} import_ctx;

static int import_txn(store_txn *txn, void *vctx, store_msg *m)
{
    import_ctx *c = vctx;
    const store_header *mh = &c->in->h;
    store_header h;
    int rc = store_header_get(txn, &h, m);
    if (rc)
        return rc;
    c->unchanged = 0;
    if (h.dim != mh->dim)
        return store_fail(m, TARTAN_EDIM, "the model has dimension %u, the index %u", mh->dim,
                          h.dim);
    if (h.n_centroids) {
        /* Importing the model an index already has changes nothing: a retried build converges. */
        uint32_t have = 0;
        if (h.nbits != mh->nbits || h.n_centroids != mh->n_centroids)
            return store_fail(m, TARTAN_EINVAL, "the index is trained already, with another model");
        if ((rc = store_model_records(txn, count_one, &have, m)))
            return rc;
        if (have != c->in->n_records)
            return store_fail(m, TARTAN_EINVAL, "the index is trained already, with another model");
        if ((rc = each_record(c->in, txn, same_one, m)))
            return rc;
        c->unchanged = 1;
        return 0;
    }
    if (h.n_docs || h.next_docno)
        return store_fail(m, TARTAN_EINVAL, "the index holds documents but no model");
    if ((rc = each_record(c->in, txn, put_one, m)))
        return rc;
    h.nbits = mh->nbits;
    h.token_bytes = mh->token_bytes;
    h.n_centroids = mh->n_centroids;
    h.code_bytes = mh->code_bytes;
    h.seed = mh->seed;
    h.kmeans_iters = mh->kmeans_iters;
    h.sample_docs = mh->sample_docs;
    if ((rc = store_header_put(txn, &h, m)))
        return rc;
    /* Read it back as every reader will: a model whose records do not make a codec and a
     * centroid table of the header's shape never commits. */
    idx_model mod;
    if ((rc = idx_model_load(txn, &h, &mod, m))) {
        if (rc == TARTAN_ENOTTRAINED)
            rc = store_fail(m, TARTAN_ECORRUPT, "the model lacks a record: %s", m->text);
        return rc;
    }
    idx_model_free(&mod);
    return 0;
}

int idx_model_import(store_env *env, const void *buf, size_t len, int *unchanged, store_msg *m)
{
    model_in in;
    int rc = parse(buf, len, &in, m);
    if (rc)
        return rc;
    import_ctx c = {&in, in.h.dim, 0};
    rc = store_write(env, import_txn, &c, m);
    if (unchanged)
        *unchanged = !rc && c.unchanged;
    return rc;
}
