/*
 * docblob.c: one document's value in database "docs" (FORMAT.md "docs"): token count,
 * checksum, inverse norms, codes, packed residuals, laid out so that a kernel reads each part
 * straight from LMDB's map with its natural alignment.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "tartan.h"

/* Bytes before the inverse norms: ntok (u32) and the CRC32C (u32). */
#define DOC_HEAD 8

size_t store_doc_size(uint32_t ntok, unsigned code_bytes, unsigned token_bytes)
{
    size_t n = DOC_HEAD + (size_t)ntok * (4 + code_bytes + token_bytes);
    /* A multiple of 4: with 4-byte keys every node of "docs" then has a size that is a
     * multiple of 4, so nodes (and the data 12 bytes into each) stay 4-byte aligned inside
     * their pages (FORMAT.md explains the arithmetic). */
    return (n + 3) & ~(size_t)3;
}

static void layout(uint8_t *blob, uint32_t ntok, unsigned code_bytes, float **norms, void **codes,
                   uint8_t **res)
{
    *norms = (float *)(blob + DOC_HEAD);
    *codes = blob + DOC_HEAD + (size_t)ntok * 4;
    *res = blob + DOC_HEAD + (size_t)ntok * (4 + code_bytes);
}

/* The checksum covers the document number too: a blob found under another key is damage. */
static uint32_t doc_crc(uint32_t docno, const uint8_t *blob, size_t size)
{
    uint32_t c = store_crc32c(0, &docno, 4);
    return store_crc32c(c, blob + DOC_HEAD, size - DOC_HEAD);
}

int store_doc_reserve(store_txn *t, uint32_t docno, uint32_t ntok, unsigned code_bytes,
                      unsigned token_bytes, store_doc_out *out, store_msg *m)
{
    unsigned key = docno;
    MDB_val k = {sizeof key, &key};
    MDB_val d = {store_doc_size(ntok, code_bytes, token_bytes), NULL};
    /* Numbers only grow, so every new document goes at the end: MDB_APPEND fills pages
     * completely instead of splitting them in half. */
    int rc = mdb_put(t->st_txn, t->st_env->se_docs, &k, &d, MDB_RESERVE | MDB_APPEND);
    if (rc == MDB_KEYEXIST)
        return store_fail(m, TARTAN_ECORRUPT, "document number %u is taken already", docno);
    if (rc)
        return store_map_lmdb(m, rc, "writing a document");
    uint8_t *b = d.mv_data;
    memcpy(b, &ntok, 4);
    memset(b + 4, 0, 4);
    out->blob = b;
    out->size = d.mv_size;
    layout(b, ntok, code_bytes, &out->inv_norms, &out->codes, &out->residuals);
    /* Padding is part of the checksummed bytes: zero it. */
    size_t used = DOC_HEAD + (size_t)ntok * (4 + code_bytes + token_bytes);
    memset(b + used, 0, d.mv_size - used);
    return 0;
}

void store_doc_seal(uint32_t docno, store_doc_out *out)
{
    uint32_t c = doc_crc(docno, out->blob, out->size);
    memcpy(out->blob + 4, &c, 4);
}

int store_doc_parse(uint32_t docno, const void *blob, size_t size, unsigned code_bytes,
                    unsigned token_bytes, int verify, store_doc *doc, store_msg *m)
{
    const uint8_t *b = blob;
    if (size < DOC_HEAD)
        return store_fail(m, TARTAN_ECORRUPT, "document %u: blob of %zu bytes is truncated", docno,
                          size);
    uint32_t ntok;
    memcpy(&ntok, b, 4);
    if (ntok == 0 || ntok > STORE_MAX_DOC_TOKENS ||
        size != store_doc_size(ntok, code_bytes, token_bytes))
        return store_fail(m, TARTAN_ECORRUPT,
                          "document %u: blob of %zu bytes does not hold %u tokens", docno, size,
                          ntok);
    if ((uintptr_t)b % 4 != 0)
        return store_fail(m, TARTAN_ECORRUPT, "document %u: blob misaligned in the map", docno);
    if (verify) {
        uint32_t want;
        memcpy(&want, b + 4, 4);
        uint32_t got = doc_crc(docno, b, size);
        if (got != want)
            return store_fail(m, TARTAN_ECORRUPT,
                              "document %u: checksum mismatch (stored %08x, computed %08x)", docno,
                              want, got);
    }
    float *norms;
    void *codes;
    uint8_t *res;
    layout((uint8_t *)b, ntok, code_bytes, &norms, &codes, &res);
    doc->ntok = ntok;
    doc->inv_norms = norms;
    doc->codes = codes;
    doc->residuals = res;
    return 0;
}

int store_doc_get(store_txn *t, uint32_t docno, unsigned code_bytes, unsigned token_bytes,
                  int verify, store_doc *doc, store_msg *m)
{
    unsigned key = docno;
    MDB_val k = {sizeof key, &key}, d;
    int rc = mdb_get(t->st_txn, t->st_env->se_docs, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTFOUND, "no document %u", docno);
    if (rc)
        return store_map_lmdb(m, rc, "reading a document");
    return store_doc_parse(docno, d.mv_data, d.mv_size, code_bytes, token_bytes, verify, doc, m);
}

int store_doc_del(store_txn *t, uint32_t docno, store_msg *m)
{
    unsigned key = docno;
    MDB_val k = {sizeof key, &key};
    int rc = mdb_del(t->st_txn, t->st_env->se_docs, &k, NULL);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTFOUND, "no document %u", docno);
    return rc ? store_map_lmdb(m, rc, "deleting a document") : 0;
}

struct store_cursor {
    MDB_cursor *sc_cur;
    int sc_started;
};

int store_docs_first(store_txn *t, store_cursor **out, store_msg *m)
{
    *out = NULL;
    store_cursor *c = calloc(1, sizeof *c);
    if (!c)
        return store_fail(m, ENOMEM, "out of memory");
    int rc = mdb_cursor_open(t->st_txn, t->st_env->se_docs, &c->sc_cur);
    if (rc) {
        free(c);
        return store_map_lmdb(m, rc, "opening a cursor");
    }
    *out = c;
    return 0;
}

int store_docs_next(store_cursor *c, uint32_t *docno, const void **blob, size_t *size, store_msg *m)
{
    MDB_val k, d;
    int rc = mdb_cursor_get(c->sc_cur, &k, &d, c->sc_started ? MDB_NEXT : MDB_FIRST);
    c->sc_started = 1;
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc)
        return store_map_lmdb(m, rc, "reading the documents");
    if (k.mv_size != sizeof(unsigned))
        return store_fail(m, TARTAN_ECORRUPT, "a document key has %zu bytes", k.mv_size);
    unsigned key;
    memcpy(&key, k.mv_data, sizeof key);
    *docno = key;
    *blob = d.mv_data;
    *size = d.mv_size;
    return 1;
}

void store_cursor_close(store_cursor *c)
{
    if (!c)
        return;
    mdb_cursor_close(c->sc_cur);
    free(c);
}
