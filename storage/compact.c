/*
 * compact.c: store_compact, an index rewritten without free pages (FORMAT.md "Compaction"):
 * every record copied into a fresh environment in key order (LMDB then fills its pages
 * instead of splitting them), documents repacked into full segments, inverted lists into full
 * blocks. A version-1 index is converted on the way: same documents, numbers, ids, codes,
 * residuals, norms and fp32 centroids, so every search answers exactly as before.
 *
 * Everything read is verified; damage stops the compaction (store_salvage is the tool for a
 * damaged index) and leaves the index as it was.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "tartan.h"
#include "verify.h"

typedef struct cctx {
    store_compact_stats st;
} cctx;

static int damaged(store_msg *m, int rc)
{
    if (rc == TARTAN_ECORRUPT) {
        char detail[sizeof m->text];
        memcpy(detail, m->text, sizeof detail);
        snprintf(m->text, sizeof m->text, "%.400s; 'tartan check --repair' salvages the index",
                 detail);
    }
    return rc;
}

/* ---- inverted lists: (centroid, document) pairs in order into full blocks ----------------- */

typedef struct list_out {
    store_txn *dst;
    int have;
    uint32_t c;
    uint32_t buf[STORE_IVF_BLOCK];
    size_t n;
    uint64_t pairs;
} list_out;

static int list_flush(list_out *o, store_msg *m)
{
    if (!o->n)
        return 0;
    int rc = store_ivf_put_block(o->dst->st_txn, o->dst->st_gen->g_ivf,
                                 store_ivf_key(o->c, o->buf[0]), o->buf, o->n, 1, m);
    o->n = 0;
    return rc;
}

static int list_push(list_out *o, uint32_t c, uint32_t doc, store_msg *m)
{
    int rc;
    if (o->have && c != o->c && (rc = list_flush(o, m)))
        return rc;
    if (o->have && c == o->c && o->n && doc <= o->buf[o->n - 1])
        return store_fail(m, TARTAN_ECORRUPT,
                          "inverted list of centroid %u: document %u after %u (out of order)", c,
                          doc, o->buf[o->n - 1]);
    if (o->have && c < o->c)
        return store_fail(m, TARTAN_ECORRUPT, "inverted lists out of order (%u after %u)", c,
                          o->c);
    o->have = 1;
    o->c = c;
    o->buf[o->n++] = doc;
    o->pairs++;
    if (o->n == STORE_IVF_BLOCK)
        return list_flush(o, m);
    return 0;
}

static int copy_ivf_v2(store_txn *src, list_out *o, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(src->st_txn, src->st_gen->g_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    MDB_val k, d;
    uint32_t buf[STORE_IVF_BLOCK];
    uint32_t last_c = 0, last_d = 0;
    int any = 0;
    MDB_cursor_op op = MDB_FIRST;
    while ((rc = store_cget(src, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 8) {
            rc = store_fail(m, TARTAN_ECORRUPT, "an inverted-list key has %zu bytes", k.mv_size);
            break;
        }
        uint64_t key;
        memcpy(&key, k.mv_data, 8);
        size_t n;
        if ((rc = store_ivf_decode(key, d.mv_data, d.mv_size, 1, buf, &n, m)))
            break;
        uint32_t c = (uint32_t)(key >> 32);
        if (any && c == last_c && buf[0] <= last_d) {
            rc = store_fail(m, TARTAN_ECORRUPT,
                            "inverted list of centroid %u: blocks overlap at document %u", c,
                            buf[0]);
            break;
        }
        for (size_t i = 0; i < n && !rc; i++)
            rc = list_push(o, c, buf[i], m);
        if (rc)
            break;
        any = 1;
        last_c = c;
        last_d = buf[n - 1];
    }
    mdb_cursor_close(cur);
    if (rc == MDB_NOTFOUND)
        rc = 0;
    else if (rc && store_lmdb_code(rc))
        rc = store_map_lmdb(m, rc, "reading the inverted lists");
    return rc ? rc : list_flush(o, m);
}

static int copy_ivf_v1(store_txn *src, list_out *o, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(src->st_txn, src->st_gen->g_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while ((rc = store_cget(src, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 4 || d.mv_size != 4) {
            rc = store_fail(m, TARTAN_ECORRUPT, "a version-1 inverted-list entry is malformed");
            break;
        }
        uint32_t c, doc;
        memcpy(&c, k.mv_data, 4);
        memcpy(&doc, d.mv_data, 4);
        if ((rc = list_push(o, c, doc, m)))
            break;
    }
    mdb_cursor_close(cur);
    if (rc == MDB_NOTFOUND)
        rc = 0;
    else if (rc && store_lmdb_code(rc))
        rc = store_map_lmdb(m, rc, "reading the inverted lists");
    return rc ? rc : list_flush(o, m);
}

/* ---- documents -------------------------------------------------------------------------- */

static int copy_docs_v2(store_txn *src, store_txn *dst, const store_header *h, cctx *c,
                        store_msg *m)
{
    store_cursor *cur;
    int rc = store_docs_first(src, 1, &cur, m);
    if (rc)
        return rc;
    store_appender *a;
    if ((rc = store_docs_append_begin(dst, h->code_bytes, h->token_bytes, &a, m))) {
        store_cursor_close(cur);
        return rc;
    }
    uint32_t docno;
    const void *rec;
    size_t size;
    while ((rc = store_docs_next(cur, &docno, &rec, &size, m)) == 1) {
        store_doc d;
        if ((rc = store_doc_parse(docno, rec, size, h->code_bytes, h->token_bytes, 1, &d, m)) ||
            (rc = store_docs_append_record(a, docno, rec, size, m)))
            break;
        c->st.docs++;
        c->st.tokens += d.ntok;
    }
    store_cursor_close(cur);
    if (rc) {
        store_docs_append_free(a);
        return rc;
    }
    return store_docs_append_end(a, m);
}

static int copy_docs_v1(store_txn *src, store_txn *dst, const store_header *h, cctx *c,
                        store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(src->st_txn, src->st_gen->g_docs, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the documents");
    store_appender *a;
    if ((rc = store_docs_append_begin(dst, h->code_bytes, h->token_bytes, &a, m))) {
        mdb_cursor_close(cur);
        return rc;
    }
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while ((rc = store_cget(src, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 4) {
            rc = store_fail(m, TARTAN_ECORRUPT, "a document key has %zu bytes", k.mv_size);
            break;
        }
        uint32_t docno;
        memcpy(&docno, k.mv_data, 4);
        store_doc doc;
        if ((rc = store_v1_doc_parse(docno, d.mv_data, d.mv_size, h->code_bytes, h->token_bytes,
                                     &doc, m)) ||
            (rc = store_docs_append(a, docno, doc.ntok, doc.inv_norms, doc.codes, h->code_bytes,
                                    doc.residuals, m)))
            break;
        c->st.docs++;
        c->st.tokens += doc.ntok;
    }
    mdb_cursor_close(cur);
    if (rc == MDB_NOTFOUND)
        rc = 0;
    else if (rc && store_lmdb_code(rc))
        rc = store_map_lmdb(m, rc, "reading the documents");
    if (rc) {
        store_docs_append_free(a);
        return rc;
    }
    return store_docs_append_end(a, m);
}

/* ---- ids -------------------------------------------------------------------------------- */

static int copy_ids(store_txn *src, store_txn *dst, unsigned version, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(src->st_txn, src->st_gen->g_ids, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the ids");
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while ((rc = store_cget(src, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        uint32_t docno;
        if (version == 1) {
            if (d.mv_size != 4) {
                rc = store_fail(m, TARTAN_ECORRUPT, "an id maps to a value of %zu bytes",
                                d.mv_size);
                break;
            }
            memcpy(&docno, d.mv_data, 4);
        } else if ((rc = store_ids_decode(k.mv_data, k.mv_size, d.mv_data, d.mv_size, &docno,
                                          m))) {
            break;
        }
        if ((rc = store_ids_put_raw(dst->st_txn, dst->st_gen->g_ids, k.mv_data, k.mv_size, docno,
                                    MDB_APPEND, m)))
            break;
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return store_lmdb_code(rc) ? store_map_lmdb(m, rc, "reading the ids") : rc;
    if ((rc = mdb_cursor_open(src->st_txn, src->st_gen->g_names, &cur)))
        return store_map_lmdb(m, rc, "opening the names");
    op = MDB_FIRST;
    while ((rc = store_cget(src, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 4) {
            rc = store_fail(m, TARTAN_ECORRUPT, "a 'names' key has %zu bytes", k.mv_size);
            break;
        }
        uint32_t docno;
        memcpy(&docno, k.mv_data, 4);
        const char *id = d.mv_data;
        size_t len = d.mv_size;
        if (version != 1 && (rc = store_names_decode(docno, d.mv_data, d.mv_size, &id, &len, m)))
            break;
        if ((rc = store_names_put_raw(dst->st_txn, dst->st_gen->g_names, docno, id, len,
                                      MDB_APPEND, m)))
            break;
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return store_lmdb_code(rc) ? store_map_lmdb(m, rc, "reading the names") : rc;
    return 0;
}

/* ---- meta and model --------------------------------------------------------------------- */

/* Version 2: every meta record but the format record, verified and copied as it is. */
static int copy_meta_v2(store_txn *src, store_txn *dst, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(src->st_txn, src->st_gen->g_meta, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening meta");
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while ((rc = store_cget(src, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size == strlen(STORE_KEY_FORMAT) && !memcmp(k.mv_data, STORE_KEY_FORMAT, 6))
            continue;
        uint32_t want = 0;
        if (d.mv_size >= 4)
            memcpy(&want, d.mv_data, 4);
        if (d.mv_size < 4 || store_meta_crc(k.mv_data, k.mv_size, (const uint8_t *)d.mv_data + 4,
                                            d.mv_size - 4) != want) {
            rc = store_fail(m, TARTAN_ECORRUPT, "meta record '%.*s' is damaged (checksum)",
                            (int)(k.mv_size > 64 ? 64 : k.mv_size), (const char *)k.mv_data);
            break;
        }
        if ((rc = mdb_put(dst->st_txn, dst->st_gen->g_meta, &k, &d, 0))) {
            rc = store_map_lmdb(m, rc, "writing meta");
            break;
        }
        if ((rc = store_format_raise(dst, store_format_needs(k.mv_data, k.mv_size), m)))
            break;
    }
    mdb_cursor_close(cur);
    if (rc == MDB_NOTFOUND)
        return 0;
    return store_lmdb_code(rc) ? store_map_lmdb(m, rc, "reading meta") : rc;
}

static int copy_model(store_txn *src, store_txn *dst, const store_header *h, unsigned version,
                      store_msg *m)
{
    if (!h->n_centroids)
        return 0;
    int rc;
    if (version == 1) {
        const void *tables;
        size_t size;
        float cut[255], w[256];
        if ((rc = store_v1_codec_get(src, h->nbits, &tables, &size, m)))
            return rc;
        size_t nb = (size_t)1 << h->nbits;
        memcpy(cut, tables, (nb - 1) * 4);
        memcpy(w, (const uint8_t *)tables + (nb - 1) * 4, nb * 4);
        if ((rc = store_codec_put(dst, h->nbits, cut, w, m)))
            return rc;
        const float *c;
        if ((rc = store_v1_centroids_get(src, h->n_centroids, h->dim, &c, m)))
            return rc;
        size_t n = (size_t)h->n_centroids * h->dim;
        float *copy = malloc(n * sizeof *copy);
        if (!copy)
            return store_fail(m, ENOMEM, "out of memory for the centroids");
        memcpy(copy, c, n * sizeof *copy);
        /* fp32 as stored: the documents' codes, residuals and norms were computed against
         * exactly these values. */
        rc = store_centroids_put(dst, h->n_centroids, h->dim, copy, STORE_CENT_F32, m);
        free(copy);
        return rc;
    }
    unsigned key = 0;
    MDB_val k = {sizeof key, &key}, d;
    if ((rc = store_get(src, src->st_gen->g_centroids, &k, &d)))
        return store_map_lmdb(m, rc, "reading the centroids");
    int dtype;
    const void *data;
    if ((rc = store_centroids_check(d.mv_data, d.mv_size, h->n_centroids, h->dim, 1, &dtype, &data,
                                    m)))
        return rc;
    if ((rc = mdb_put(dst->st_txn, dst->st_gen->g_centroids, &k, &d, 0)))
        return store_map_lmdb(m, rc, "writing the centroids");
    /* The second copies (FORMAT.md), which an index written before them lacks: made from the
     * verified primaries. */
    if ((rc = store_centroids_put_copy(dst, d.mv_data, d.mv_size, m)))
        return rc;
    const void *cd;
    size_t clen;
    if ((rc = store_meta_get(src, STORE_KEY_CODEC, &cd, &clen, m)))
        return rc == TARTAN_ENOTFOUND
                   ? store_fail(m, TARTAN_ECORRUPT, "the index has centroids but no codec")
                   : rc;
    return store_meta_put(dst, STORE_KEY_CODEC_COPY, cd, clen, m);
}

/* Version 1: the search calibration (engine/calibrate.c), a bare record there, carried over as
 * a checksummed one; its layout is the engine's and did not change. */
static int copy_calibration_v1(store_txn *src, store_txn *dst, store_msg *m)
{
    MDB_val k = {strlen(STORE_META_CALIBRATION), (void *)STORE_META_CALIBRATION}, d;
    int rc = store_get(src, src->st_gen->g_meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc)
        return store_map_lmdb(m, rc, "reading the calibration");
    return store_meta_put(dst, STORE_META_CALIBRATION, d.mv_data, d.mv_size, m);
}

static int compact_fn(store_txn *src, store_txn *dst, void *vctx, store_msg *m)
{
    cctx *c = vctx;
    memset(&c->st, 0, sizeof c->st);
    unsigned version = src->st_gen->g_version;
    c->st.from_version = version;
    store_header h;
    int rc;
    if (version != 1) {
        /* LMDB's cursors must not walk damaged pages (pages.c): look at them first. */
        unsigned unsound;
        if ((rc = store_pages_check(src, NULL, NULL, &unsound, m)))
            return rc;
        if (unsound)
            return damaged(m, store_fail(m, TARTAN_ECORRUPT, "LMDB's pages are damaged"));
    }
    rc = version == 1 ? store_v1_header_get(src, &h, m) : store_header_get(src, &h, m);
    if (rc)
        return damaged(m, rc);
    if (version == 1) {
        if ((rc = copy_model(src, dst, &h, 1, m)) || (rc = copy_calibration_v1(src, dst, m)))
            return damaged(m, rc);
    } else if ((rc = copy_meta_v2(src, dst, m)) || (rc = copy_model(src, dst, &h, 2, m))) {
        return damaged(m, rc);
    }
    rc = version == 1 ? copy_docs_v1(src, dst, &h, c, m) : copy_docs_v2(src, dst, &h, c, m);
    if (rc)
        return damaged(m, rc);
    list_out *o = calloc(1, sizeof *o);
    if (!o)
        return store_fail(m, ENOMEM, "out of memory");
    o->dst = dst;
    rc = version == 1 ? copy_ivf_v1(src, o, m) : copy_ivf_v2(src, o, m);
    c->st.postings = o->pairs;
    free(o);
    if (rc || (rc = copy_ids(src, dst, version, m)))
        return damaged(m, rc);
    if (c->st.docs != h.n_docs || c->st.tokens != h.n_tokens ||
        (version != 1 && c->st.postings != h.n_postings))
        return damaged(m, store_fail(m, TARTAN_ECORRUPT,
                                     "the header counts %llu documents, %llu tokens, %llu list "
                                     "entries; the index holds %llu, %llu, %llu",
                                     (unsigned long long)h.n_docs, (unsigned long long)h.n_tokens,
                                     (unsigned long long)h.n_postings,
                                     (unsigned long long)c->st.docs,
                                     (unsigned long long)c->st.tokens,
                                     (unsigned long long)c->st.postings));
    h.n_postings = c->st.postings;
    return store_header_put(dst, &h, m);
}

int store_compact(store_env *env, store_compact_stats *st, store_msg *m)
{
    cctx c;
    memset(&c, 0, sizeof c);
    int rc = store_rewrite(env, compact_fn, &c, m);
    if (st)
        *st = c.st;
    return rc;
}
