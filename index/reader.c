/*
 * reader.c: a read snapshot of an index for the search pipeline: the model, documents as
 * kernel pointers straight into LMDB's map (no copies), inverted lists, ids.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "model.h"
#include "tartan.h"

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
        if ((rc = idx_axes_get(r->txn, &r->h, &r->axes, m)) == 0) {
            r->axes_dec = malloc(idx_axes_decode_floats(&r->axes) * sizeof(float));
            if (!r->axes_dec) {
                rc = store_fail(m, ENOMEM, "out of memory");
                goto fail;
            }
            idx_axes_decode_tables(&r->axes, r->axes_dec, r->axes_bytes);
        } else if (rc != TARTAN_ENOTFOUND)
            goto fail;
        r->trained = 1;
    }
    return 0;
fail:
    store_read_end(env, r->txn);
    idx_axes_free(&r->axes);
    free(r->axes_dec);
    memset(r, 0, sizeof *r);
    return rc;
}

void idx_reader_close(idx_reader *r)
{
    if (!r)
        return;
    idx_axes_free(&r->axes);
    free(r->axes_dec);
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
        if (r->axes.rot)
            idx_axes_decompress(&r->axes, r->centroids, codes, doc->residuals + (size_t)t0 * tb, n,
                                out + (size_t)t0 * r->h.dim);
        else
            idx_codec_decompress(&r->codec, r->centroids, codes, doc->residuals + (size_t)t0 * tb,
                                 n, out + (size_t)t0 * r->h.dim);
    }
}
