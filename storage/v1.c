/*
 * v1.c: what converting a format-version-1 index reads of it (FORMAT.md "Version 1"): its
 * header and codec (meta values without checksums), its fp32 centroid table (one raw value),
 * and its document blobs. Its inverted lists (sorted duplicates) and id maps (raw values) are
 * read by store_rewrite's conversion directly (compact.c).
 */
#include "config.h"

#include <string.h>

#include "store_internal.h"
#include "tartan.h"

int store_v1_header_get(store_txn *t, store_header *h, store_msg *m)
{
    MDB_val k = {strlen(STORE_KEY_HEADER), STORE_KEY_HEADER}, d;
    int rc = store_get(t, t->st_gen->g_meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT, "the index header is missing");
    if (rc)
        return store_map_lmdb(m, rc, "reading the index header");
    /* Version 1's 64 bytes are version 2's header payload, with the inverted-list entry count
     * (bytes 56..63) still zero: the conversion counts them. */
    uint8_t b[STORE_HEADER_SIZE];
    if (d.mv_size != STORE_HEADER_SIZE)
        return store_fail(m, TARTAN_ECORRUPT, "the index header has %zu bytes, not %d", d.mv_size,
                          STORE_HEADER_SIZE);
    memcpy(b, d.mv_data, sizeof b);
    memset(b + 56, 0, 8);
    return store_header_decode(b, sizeof b, h, m);
}

int store_v1_codec_get(store_txn *t, unsigned nbits, const void **tables, size_t *size,
                       store_msg *m)
{
    MDB_val k = {strlen(STORE_KEY_CODEC), STORE_KEY_CODEC}, d;
    int rc = store_get(t, t->st_gen->g_meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTTRAINED, "the index has no codec yet");
    if (rc)
        return store_map_lmdb(m, rc, "reading the codec tables");
    size_t nb = (size_t)1 << nbits;
    if (d.mv_size != (2 * nb - 1) * sizeof(float))
        return store_fail(m, TARTAN_ECORRUPT, "the codec tables have %zu bytes, not %zu", d.mv_size,
                          (2 * nb - 1) * sizeof(float));
    *tables = d.mv_data;
    *size = d.mv_size;
    return 0;
}

int store_v1_centroids_get(store_txn *t, uint32_t k, uint32_t dim, const float **c, store_msg *m)
{
    unsigned key = 0;
    MDB_val kv = {sizeof key, &key}, d;
    int rc = store_get(t, t->st_gen->g_centroids, &kv, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTTRAINED, "the index has no centroids yet");
    if (rc)
        return store_map_lmdb(m, rc, "reading the centroids");
    if (d.mv_size != (size_t)k * dim * sizeof(float))
        return store_fail(m, TARTAN_ECORRUPT, "the centroids have %zu bytes, not %zu", d.mv_size,
                          (size_t)k * dim * sizeof(float));
    *c = d.mv_data; /* may be unaligned (a small table in a leaf): the caller copies */
    return 0;
}

/* Version 1's blob: ntok, CRC, norms, codes, residuals, padding (FORMAT.md "Version 1"). */
#define V1_HEAD 8

int store_v1_doc_parse(uint32_t docno, const void *blob, size_t size, unsigned code_bytes,
                       unsigned token_bytes, store_doc *doc, store_msg *m)
{
    const uint8_t *b = blob;
    if (size < V1_HEAD)
        return store_fail(m, TARTAN_ECORRUPT, "document %u: blob of %zu bytes is truncated", docno,
                          size);
    uint32_t ntok, want;
    memcpy(&ntok, b, 4);
    memcpy(&want, b + 4, 4);
    size_t expect = V1_HEAD + (size_t)ntok * (4 + code_bytes + token_bytes);
    expect = (expect + 3) & ~(size_t)3;
    if (ntok == 0 || ntok > STORE_MAX_DOC_TOKENS || size != expect)
        return store_fail(m, TARTAN_ECORRUPT,
                          "document %u: blob of %zu bytes does not hold %u tokens", docno, size,
                          ntok);
    uint32_t c = store_crc32c(0, &docno, 4);
    c = store_crc32c(c, b + V1_HEAD, size - V1_HEAD);
    if (c != want)
        return store_fail(m, TARTAN_ECORRUPT,
                          "document %u: checksum mismatch (stored %08x, computed %08x)", docno,
                          want, c);
    doc->ntok = ntok;
    doc->inv_norms = (const float *)(b + V1_HEAD); /* unaligned possible: the caller copies */
    doc->codes = b + V1_HEAD + (size_t)ntok * 4;
    doc->residuals = b + V1_HEAD + (size_t)ntok * (4 + code_bytes);
    return 0;
}
