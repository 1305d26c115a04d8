/*
 * reader.c: a read snapshot of an index for the search pipeline: the model, documents as
 * kernel pointers straight into LMDB's map (no copies), inverted lists, ids.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "model.h"
#include "tartan.h"

/*
 * The axes code, parsed once for every reader of it. Parsing a record rebuilds the rotation,
 * its transpose, the levels and the kernels' decode tables (about 0.5 MB at dim 128, 4 MB at
 * 384), which each search's reader did before this cache. An entry is found by the record's
 * whole stored value, its checksum included (compared in full: a checksum alone would let two
 * codes of one length share an entry, a wrong decode no check could see), so a retrained or
 * other index never takes a stale one; a value equal to an entry's was checked when the entry
 * was made, so a hit skips the checksum too (store_meta_raw).
 * The cache holds a reference to each of its AXES_CACHED most recent entries; readers hold
 * one each; the last release frees an entry.
 */
typedef struct axes_entry {
    unsigned refs;
    uint8_t *blob; /* the record's stored value (store_meta_raw), the key */
    size_t len;
    idx_axes axes;
    float *dec;
    unsigned bytes[4];
    int additive; /* kern_axes_additive of dec */
} axes_entry;

#define AXES_CACHED 4
static pthread_mutex_t axes_mu = PTHREAD_MUTEX_INITIALIZER;
static axes_entry *axes_cache[AXES_CACHED]; /* most recently used first */

static void axes_entry_free(axes_entry *e)
{
    idx_axes_free(&e->axes);
    free(e->dec);
    free(e->blob);
    free(e);
}

static void axes_release(void *ref)
{
    axes_entry *e = ref;
    if (!e)
        return;
    pthread_mutex_lock(&axes_mu);
    const unsigned left = --e->refs;
    pthread_mutex_unlock(&axes_mu);
    if (!left)
        axes_entry_free(e);
}

/* The parsed code of the index's record, a reference taken; NULL with *rc TARTAN_ENOTFOUND (no
 * record, no message) or an error. */
static axes_entry *axes_acquire(store_txn *txn, const store_header *h, store_msg *m, int *rc)
{
    const void *raw, *data;
    size_t len, dlen;
    if ((*rc = store_meta_raw(txn, IDX_META_AXES, &raw, &len, m)))
        return NULL;
    const uint8_t *blob = raw;
    pthread_mutex_lock(&axes_mu);
    for (int i = 0; i < AXES_CACHED; i++) {
        axes_entry *e = axes_cache[i];
        if (e && e->len == len && !memcmp(e->blob, blob, len)) {
            e->refs++;
            memmove(axes_cache + 1, axes_cache, i * sizeof *axes_cache);
            axes_cache[0] = e;
            pthread_mutex_unlock(&axes_mu);
            return e;
        }
    }
    pthread_mutex_unlock(&axes_mu);
    /* Checked and parsed outside the lock: two readers missing at once both parse, and both
     * enter. */
    if ((*rc = store_meta_get(txn, IDX_META_AXES, &data, &dlen, m)))
        return NULL;
    axes_entry *e = calloc(1, sizeof *e);
    if (!e || !(e->blob = malloc(len ? len : 1))) {
        free(e);
        *rc = store_fail(m, ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(e->blob, blob, len);
    e->len = len;
    if ((*rc = idx_axes_parse(data, dlen, h, &e->axes, m))) {
        free(e->blob);
        free(e);
        return NULL;
    }
    if (!(e->dec = malloc(idx_axes_decode_floats(&e->axes) * sizeof(float)))) {
        axes_entry_free(e);
        *rc = store_fail(m, ENOMEM, "out of memory");
        return NULL;
    }
    idx_axes_decode_tables(&e->axes, e->dec, e->bytes);
    e->additive = kern_axes_additive(e->dec, e->bytes);
    e->refs = 2; /* the reader's and the cache's */
    pthread_mutex_lock(&axes_mu);
    axes_entry *out = axes_cache[AXES_CACHED - 1];
    memmove(axes_cache + 1, axes_cache, (AXES_CACHED - 1) * sizeof *axes_cache);
    axes_cache[0] = e;
    const unsigned left = out ? --out->refs : 1;
    pthread_mutex_unlock(&axes_mu);
    if (!left)
        axes_entry_free(out);
    return e;
}

int idx_reader_open(store_env *env, idx_reader *r, store_msg *m)
{
    memset(r, 0, sizeof *r);
    r->env = env;
    r->verify = 1;
    int rc = store_read_begin(env, &r->txn, m);
    if (rc)
        return rc;
    if ((rc = store_header_get(r->txn, &r->h, m)))
        goto fail;
    if (r->h.n_centroids) {
        r->codec.dim = r->h.dim;
        r->codec.nbits = r->h.nbits;
        if ((rc = store_centroids_get(r->txn, r->h.n_centroids, r->h.dim, &r->centroids, m)) ||
            (rc = store_codec_get(r->txn, r->h.nbits, r->codec.cutoffs, r->codec.weights, m)))
            goto fail;
        axes_entry *e = axes_acquire(r->txn, &r->h, m, &rc);
        if (e) {
            r->axes_ref = e;
            r->axes = &e->axes;
            r->axes_dec = e->dec;
            memcpy(r->axes_bytes, e->bytes, sizeof r->axes_bytes);
            r->axes_additive = e->additive;
        } else if (rc != TARTAN_ENOTFOUND)
            goto fail;
        r->trained = 1;
    }
    return 0;
fail:
    store_read_end(env, r->txn);
    memset(r, 0, sizeof *r);
    return rc;
}

void idx_reader_close(idx_reader *r)
{
    if (!r)
        return;
    axes_release(r->axes_ref);
    r->axes_ref = NULL;
    r->axes = NULL;
    r->axes_dec = NULL;
    if (!r->txn)
        return;
    store_read_end(r->env, r->txn);
    r->txn = NULL;
}

static void to_pdoc(const store_doc *d, kern_pdoc *p)
{
    p->codes = d->codes;
    p->residuals = d->residuals;
    p->inv_norms = d->inv_norms;
    p->ntok = d->ntok;
}

/* Outside the reader's partition (index.h). */
static int elsewhere(const idx_reader *r, uint32_t docno)
{
    return r->part_n > 1 && docno % r->part_n != r->part_i;
}

int idx_reader_doc(const idx_reader *r, uint32_t docno, kern_pdoc *doc, store_msg *m)
{
    if (elsewhere(r, docno))
        return TARTAN_ENOTFOUND;
    store_doc d;
    int rc = store_doc_get(r->txn, docno, r->h.code_bytes, r->h.token_bytes, r->verify, &d, m);
    if (!rc)
        to_pdoc(&d, doc);
    return rc;
}

void idx_reader_doc_prefetch(const idx_reader *r, uint32_t docno)
{
    if (!elsewhere(r, docno))
        store_doc_prefetch(r->txn, docno, r->h.code_bytes, r->h.token_bytes);
}

int idx_reader_next_doc(const idx_reader *r, store_cursor **cur, uint32_t *docno, kern_pdoc *doc,
                        store_msg *m)
{
    int rc;
    if (!*cur && (rc = store_docs_first(r->txn, r->verify, cur, m)))
        return rc;
    for (;;) {
        const void *rec;
        size_t size;
        rc = store_docs_next(*cur, docno, &rec, &size, m);
        if (rc == 1 && elsewhere(r, *docno))
            continue;
        if (rc == 1) {
            store_doc d;
            rc = store_doc_parse(*docno, rec, size, r->h.code_bytes, r->h.token_bytes, r->verify,
                                 &d, m);
            if (rc == 0) {
                to_pdoc(&d, doc);
                return 1;
            }
        }
        if (rc == TARTAN_ECORRUPT && r->skip_damaged) {
            if (r->damaged)
                (*r->damaged)++;
            continue;
        }
        if (rc)
            return rc;
        break;
    }
    store_cursor_close(*cur);
    *cur = NULL;
    return 0;
}

void idx_reader_docs_end(store_cursor *cur)
{
    store_cursor_close(cur);
}

int idx_reader_ivf_open(const idx_reader *r, uint32_t centroid, store_ivf_iter **it, store_msg *m)
{
    return store_ivf_open(r->txn, centroid, it, m);
}

int idx_reader_name(const idx_reader *r, uint32_t docno, const char **id, size_t *len, store_msg *m)
{
    return store_name_get(r->txn, docno, id, len, m);
}

int idx_reader_docno(const idx_reader *r, const char *id, uint32_t *docno, store_msg *m)
{
    return store_id_get(r->txn, id, strlen(id), docno, m);
}

void idx_reader_decompress(const idx_reader *r, const kern_pdoc *doc, float *out)
{
    uint32_t codes[256];
    /* In slices: the codec wants uint32 codes, the blob may hold uint16. */
    size_t tb = r->h.token_bytes;
    for (uint32_t t0 = 0; t0 < doc->ntok; t0 += 256) {
        uint32_t n = doc->ntok - t0 < 256 ? doc->ntok - t0 : 256;
        for (uint32_t t = 0; t < n; t++)
            codes[t] = r->h.code_bytes == 2 ? ((const uint16_t *)doc->codes)[t0 + t]
                                            : ((const uint32_t *)doc->codes)[t0 + t];
        if (r->axes)
            idx_axes_decompress(r->axes, r->centroids, codes, doc->residuals + (size_t)t0 * tb, n,
                                out + (size_t)t0 * r->h.dim);
        else
            idx_codec_decompress(&r->codec, r->centroids, codes, doc->residuals + (size_t)t0 * tb,
                                 n, out + (size_t)t0 * r->h.dim);
    }
}
