/*
 * meta.c: checksummed meta records (FORMAT.md "meta"): the generic record every layer may add
 * (store_meta_put / store_meta_get), the index's description (meta "header") and its codec
 * tables (meta "codec").
 */
#include "config.h"

#include <string.h>

#include "bytes.h"
#include "store_internal.h"
#include "tartan.h"

/* A meta value: CRC-32C (4 bytes), then the data. */
#define META_HEAD 4

uint32_t store_meta_crc(const void *name, size_t nlen, const void *data, size_t len)
{
    uint32_t n = (uint32_t)nlen;
    uint32_t c = store_crc32c(0, &n, 4);
    c = store_crc32c(c, name, nlen);
    return store_crc32c(c, data, len);
}

static int name_ok(const char *name, size_t *nlen)
{
    if (!name)
        return 0;
    size_t n = strlen(name);
    if (n == 0 || n > STORE_MAX_META_NAME)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x21 || (unsigned char)name[i] > 0x7e)
            return 0;
    *nlen = n;
    return 1;
}

int store_meta_put(store_txn *t, const char *name, const void *data, size_t len, store_msg *m)
{
    size_t nlen;
    if (!name_ok(name, &nlen) || !strcmp(name, STORE_KEY_FORMAT))
        return store_fail(m, TARTAN_EINVAL, "meta record name '%s' is not allowed",
                          name ? name : "(null)");
    MDB_val k = {nlen, (void *)name}, d = {META_HEAD + len, NULL};
    uint32_t c = store_meta_crc(name, nlen, data, len);
    /* A record written again as it is changes nothing: no write (and no commit record). */
    MDB_val old;
    if (store_get(t, t->st_gen->g_meta, &k, &old) == 0 && old.mv_size == META_HEAD + len &&
        !memcmp(old.mv_data, &c, 4) &&
        (!len || !memcmp((const uint8_t *)old.mv_data + META_HEAD, data, len)))
        return 0;
    t->st_dirty = 1;
    int rc = mdb_put(t->st_txn, t->st_gen->g_meta, &k, &d, MDB_RESERVE);
    if (rc)
        return store_map_lmdb(m, rc, "writing a meta record");
    memcpy(d.mv_data, &c, 4);
    if (len)
        memcpy((uint8_t *)d.mv_data + META_HEAD, data, len);
    /* A codec extension needs format version 3 (store.h): the index says so in the same
     * transaction, so that older readers refuse it rather than decode it wrongly. */
    return store_format_raise(t, store_format_needs(name, nlen), m);
}

int store_meta_raw(store_txn *t, const char *name, const void **value, size_t *len, store_msg *m)
{
    size_t nlen;
    if (!name_ok(name, &nlen))
        return store_fail(m, TARTAN_EINVAL, "meta record name '%s' is not allowed",
                          name ? name : "(null)");
    MDB_val k = {nlen, (void *)name}, d;
    int rc = store_get(t, t->st_gen->g_meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return TARTAN_ENOTFOUND;
    if (rc)
        return store_map_lmdb(m, rc, "reading a meta record");
    *value = d.mv_data;
    *len = d.mv_size;
    return 0;
}

int store_meta_get(store_txn *t, const char *name, const void **data, size_t *len, store_msg *m)
{
    const void *v;
    size_t vlen;
    int rc = store_meta_raw(t, name, &v, &vlen, m);
    if (rc)
        return rc;
    if (vlen < META_HEAD)
        return store_fail(m, TARTAN_ECORRUPT, "meta record '%s' has %zu bytes", name, vlen);
    const uint8_t *p = v;
    uint32_t want;
    memcpy(&want, p, 4);
    uint32_t got = store_meta_crc(name, strlen(name), p + META_HEAD, vlen - META_HEAD);
    if (got != want)
        return store_fail(m, TARTAN_ECORRUPT,
                          "meta record '%s': checksum mismatch (stored %08x, computed %08x)", name,
                          want, got);
    *data = p + META_HEAD;
    *len = vlen - META_HEAD;
    return 0;
}

int store_meta_del(store_txn *t, const char *name, store_msg *m)
{
    t->st_dirty = 1;
    size_t nlen;
    if (!name_ok(name, &nlen) || !strcmp(name, STORE_KEY_FORMAT))
        return store_fail(m, TARTAN_EINVAL, "meta record name '%s' is not allowed",
                          name ? name : "(null)");
    MDB_val k = {nlen, (void *)name};
    int rc = mdb_del(t->st_txn, t->st_gen->g_meta, &k, NULL);
    if (rc == MDB_NOTFOUND)
        return TARTAN_ENOTFOUND;
    return rc ? store_map_lmdb(m, rc, "deleting a meta record") : 0;
}

/* ---- header ---------------------------------------------------------------------------- */

int store_header_put(store_txn *t, const store_header *h, store_msg *m)
{
    uint8_t b[STORE_HEADER_SIZE] = {0};
    store_put32(b + 0, h->dim);
    store_put32(b + 4, h->nbits);
    store_put32(b + 8, h->n_centroids);
    store_put32(b + 12, h->code_bytes);
    store_put32(b + 16, h->token_bytes);
    store_put32(b + 20, h->next_docno);
    store_put64(b + 24, h->n_docs);
    store_put64(b + 32, h->n_tokens);
    store_put64(b + 40, h->seed);
    store_put32(b + 48, h->kmeans_iters);
    store_put32(b + 52, h->sample_docs);
    store_put64(b + 56, h->n_postings);
    int rc = store_meta_put(t, STORE_KEY_HEADER, b, sizeof b, m);
    return rc == TARTAN_EINVAL ? TARTAN_EINTERNAL : rc;
}

int store_header_decode(const void *vb, size_t len, store_header *h, store_msg *m)
{
    if (len != STORE_HEADER_SIZE)
        return store_fail(m, TARTAN_ECORRUPT, "the index header has %zu bytes, not %d", len,
                          STORE_HEADER_SIZE);
    const uint8_t *b = vb;
    h->dim = store_get32(b + 0);
    h->nbits = store_get32(b + 4);
    h->n_centroids = store_get32(b + 8);
    h->code_bytes = store_get32(b + 12);
    h->token_bytes = store_get32(b + 16);
    h->next_docno = store_get32(b + 20);
    h->n_docs = store_get64(b + 24);
    h->n_tokens = store_get64(b + 32);
    h->seed = store_get64(b + 40);
    h->kmeans_iters = store_get32(b + 48);
    h->sample_docs = store_get32(b + 52);
    h->n_postings = store_get64(b + 56);
    /* Every later length computation trusts these: check them once here. */
    int nb_ok = h->nbits == 1 || h->nbits == 2 || h->nbits == 4 || h->nbits == 8;
    int cb_ok = h->n_centroids == 0 ? h->code_bytes == 0
                                    : h->code_bytes == (h->n_centroids <= 65536u ? 2u : 4u);
    if (!nb_ok || h->dim == 0 || h->dim > (1u << 16) || (h->dim * h->nbits) % 8 != 0 ||
        h->token_bytes != h->dim * h->nbits / 8 || !cb_ok || h->n_docs > h->next_docno)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the index header is inconsistent (dim %u, nbits %u, centroids %u, "
                          "code bytes %u)",
                          h->dim, h->nbits, h->n_centroids, h->code_bytes);
    return 0;
}

int store_header_get(store_txn *t, store_header *h, store_msg *m)
{
    const void *b;
    size_t len;
    int rc = store_meta_get(t, STORE_KEY_HEADER, &b, &len, m);
    if (rc == TARTAN_ENOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT, "the index header is missing");
    if (rc == TARTAN_ECORRUPT)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the index header is damaged (checksum); 'tartan check --repair' "
                          "rebuilds it");
    if (rc)
        return rc;
    return store_header_decode(b, len, h, m);
}

/* ---- codec ----------------------------------------------------------------------------- */

int store_codec_put(store_txn *t, unsigned nbits, const float *cutoffs, const float *weights,
                    store_msg *m)
{
    size_t nb = (size_t)1 << nbits;
    float buf[511];
    memcpy(buf, cutoffs, (nb - 1) * sizeof(float));
    memcpy(buf + nb - 1, weights, nb * sizeof(float));
    /* Two copies in one transaction: nothing else holds the tables (FORMAT.md). */
    int rc = store_meta_put(t, STORE_KEY_CODEC, buf, (2 * nb - 1) * sizeof(float), m);
    if (!rc)
        rc = store_meta_put(t, STORE_KEY_CODEC_COPY, buf, (2 * nb - 1) * sizeof(float), m);
    return rc == TARTAN_EINVAL ? TARTAN_EINTERNAL : rc;
}

int store_codec_get(store_txn *t, unsigned nbits, float *cutoffs, float *weights, store_msg *m)
{
    const void *d;
    size_t len;
    size_t nb = (size_t)1 << nbits;
    store_msg pm = {{0}};
    int rc = store_meta_get(t, STORE_KEY_CODEC, &d, &len, &pm);
    if (rc == 0 && len != (2 * nb - 1) * sizeof(float))
        rc = store_fail(&pm, TARTAN_ECORRUPT, "the codec tables have %zu bytes, not %zu", len,
                        (2 * nb - 1) * sizeof(float));
    if (rc == TARTAN_ECORRUPT || rc == TARTAN_ENOTFOUND) {
        /* The primary is damaged (or lost with its key): the copy, when it is sound, serves
         * (tartan check reports the damage and a repair restores the primary). */
        int crc = store_meta_get(t, STORE_KEY_CODEC_COPY, &d, &len, NULL);
        if (crc == 0 && len == (2 * nb - 1) * sizeof(float))
            rc = 0;
    }
    if (rc == TARTAN_ENOTFOUND)
        return store_fail(m, TARTAN_ENOTTRAINED, "the index has no codec yet");
    if (rc) {
        if (m && rc == TARTAN_ECORRUPT)
            return store_fail(m, rc, "%s, and its copy is damaged or missing", pm.text);
        if (m)
            *m = pm;
        return rc;
    }
    memcpy(cutoffs, d, (nb - 1) * sizeof(float));
    memcpy(weights, (const uint8_t *)d + (nb - 1) * sizeof(float), nb * sizeof(float));
    return 0;
}

/* ---- commit sequence ------------------------------------------------------------------- */

int store_commit_mark(store_txn *t, store_msg *m)
{
    static const char name[] = STORE_KEY_COMMIT;
    const size_t nlen = sizeof name - 1;
    MDB_val k = {nlen, (void *)name}, d;
    uint64_t seq = 1;
    /* Within the write transaction: the value is the snapshot's or this transaction's own. */
    if (store_get(t, t->st_gen->g_meta, &k, &d) == 0 && d.mv_size == META_HEAD + 16) {
        uint32_t want;
        uint64_t old;
        memcpy(&want, d.mv_data, 4);
        memcpy(&old, (const uint8_t *)d.mv_data + META_HEAD, 8);
        if (store_meta_crc(name, nlen, (const uint8_t *)d.mv_data + META_HEAD, 16) == want &&
            old < UINT64_MAX)
            seq = old + 1;
    }
    /* The sequence number, then LMDB's id of this transaction (the meta page's it commits). */
    uint64_t rec[2] = {seq, (uint64_t)mdb_txn_id(t->st_txn)};
    uint8_t b[META_HEAD + 16];
    uint32_t c = store_meta_crc(name, nlen, rec, 16);
    memcpy(b, &c, 4);
    memcpy(b + META_HEAD, rec, 16);
    d = (MDB_val){sizeof b, b};
    int rc = mdb_put(t->st_txn, t->st_gen->g_meta, &k, &d, 0);
    return rc ? store_map_lmdb(m, rc, "writing the commit record") : 0;
}
