/*
 * idmap.c: external ids <-> document numbers (databases "ids" and "names", FORMAT.md). The two
 * always change together: an id is bound in both or in neither. Each value carries a CRC-32C
 * over the pair it states, so a damaged or misplaced one is told from a sound one on read.
 */
#include "config.h"

#include <string.h>

#include "store_internal.h"
#include "tartan.h"

/* The CRC-32C of an (id, document number) pair, as both maps store it. */
static uint32_t pair_crc(const void *id, size_t len, uint32_t docno)
{
    uint32_t c = store_crc32c(0, &docno, 4);
    return store_crc32c(c, id, len);
}

int store_id_valid(const void *vid, size_t len)
{
    const uint8_t *id = vid;
    if (len == 0 || len > STORE_MAX_ID)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (id[i] < 0x20 || id[i] == 0x7f)
            return 0;
    return 1;
}

int store_ids_decode(const void *key, size_t klen, const void *val, size_t vlen, uint32_t *docno,
                     store_msg *m)
{
    int kl = (int)(klen > 64 ? 64 : klen);
    if (vlen != 8)
        return store_fail(m, TARTAN_ECORRUPT, "id '%.*s' maps to a value of %zu bytes, not 8", kl,
                          (const char *)key, vlen);
    uint32_t d, want;
    memcpy(&d, val, 4);
    memcpy(&want, (const uint8_t *)val + 4, 4);
    if (pair_crc(key, klen, d) != want)
        return store_fail(m, TARTAN_ECORRUPT, "id '%.*s' -> document %u: checksum mismatch", kl,
                          (const char *)key, d);
    *docno = d;
    return 0;
}

int store_names_decode(uint32_t docno, const void *val, size_t vlen, const char **id, size_t *len,
                       store_msg *m)
{
    if (vlen < 5)
        return store_fail(m, TARTAN_ECORRUPT, "the id of document %u has %zu bytes", docno, vlen);
    uint32_t want;
    memcpy(&want, val, 4);
    const char *s = (const char *)val + 4;
    if (pair_crc(s, vlen - 4, docno) != want)
        return store_fail(m, TARTAN_ECORRUPT, "the id of document %u: checksum mismatch", docno);
    *id = s;
    *len = vlen - 4;
    return 0;
}

int store_ids_put_raw(MDB_txn *txn, MDB_dbi ids, const void *id, size_t len, uint32_t docno,
                      unsigned flags, store_msg *m)
{
    uint32_t v[2] = {docno, pair_crc(id, len, docno)};
    MDB_val k = {len, (void *)id}, d = {sizeof v, v};
    int rc = mdb_put(txn, ids, &k, &d, flags);
    return rc ? store_map_lmdb(m, rc, "writing an id") : 0;
}

int store_names_put_raw(MDB_txn *txn, MDB_dbi names, uint32_t docno, const void *id, size_t len,
                        unsigned flags, store_msg *m)
{
    unsigned key = docno;
    MDB_val k = {sizeof key, &key}, d = {4 + len, NULL};
    int rc = mdb_put(txn, names, &k, &d, flags | MDB_RESERVE);
    if (rc)
        return store_map_lmdb(m, rc, "writing an id");
    uint32_t c = pair_crc(id, len, docno);
    memcpy(d.mv_data, &c, 4);
    memcpy((uint8_t *)d.mv_data + 4, id, len);
    return 0;
}

int store_id_get(store_txn *t, const char *id, size_t len, uint32_t *docno, store_msg *m)
{
    MDB_val k = {len, (void *)id}, d;
    int rc = store_get(t, t->st_gen->g_ids, &k, &d);
    if (rc == MDB_NOTFOUND)
        return TARTAN_ENOTFOUND; /* an answer, not a failure: no message */
    if (rc)
        return store_map_lmdb(m, rc, "looking up an id");
    return store_ids_decode(id, len, d.mv_data, d.mv_size, docno, m);
}

int store_name_get(store_txn *t, uint32_t docno, const char **id, size_t *len, store_msg *m)
{
    unsigned key = docno;
    MDB_val k = {sizeof key, &key}, d;
    int rc = store_get(t, t->st_gen->g_names, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTFOUND, "document %u has no id", docno);
    if (rc)
        return store_map_lmdb(m, rc, "looking up a document's id");
    return store_names_decode(docno, d.mv_data, d.mv_size, id, len, m);
}

int store_id_put(store_txn *t, const char *id, size_t len, uint32_t docno, store_msg *m)
{
    t->st_dirty = 1;
    uint32_t v[2] = {docno, pair_crc(id, len, docno)};
    MDB_val k = {len, (void *)id}, d = {sizeof v, v};
    int rc = mdb_put(t->st_txn, t->st_gen->g_ids, &k, &d, MDB_NOOVERWRITE);
    if (rc == MDB_KEYEXIST)
        return store_fail(m, TARTAN_EDUPID, "id '%.*s' exists", (int)(len > 64 ? 64 : len), id);
    if (rc)
        return store_map_lmdb(m, rc, "writing an id");
    unsigned key = docno;
    MDB_val nk = {sizeof key, &key}, nd = {4 + len, NULL};
    /* Numbers grow: append (FORMAT.md). */
    rc = mdb_put(t->st_txn, t->st_gen->g_names, &nk, &nd, MDB_APPEND | MDB_RESERVE);
    if (rc == MDB_KEYEXIST)
        return store_fail(m, TARTAN_ECORRUPT, "document number %u has an id already", docno);
    if (rc)
        return store_map_lmdb(m, rc, "writing an id");
    memcpy(nd.mv_data, &v[1], 4);
    memcpy((uint8_t *)nd.mv_data + 4, id, len);
    return 0;
}

int store_id_del(store_txn *t, const char *id, size_t len, uint32_t docno, store_msg *m)
{
    t->st_dirty = 1;
    MDB_val k = {len, (void *)id};
    int rc = mdb_del(t->st_txn, t->st_gen->g_ids, &k, NULL);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT, "id '%.*s' is not bound", (int)(len > 64 ? 64 : len),
                          id);
    if (rc)
        return store_map_lmdb(m, rc, "deleting an id");
    unsigned key = docno;
    MDB_val nk = {sizeof key, &key};
    rc = mdb_del(t->st_txn, t->st_gen->g_names, &nk, NULL);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT, "document %u has no id", docno);
    return rc ? store_map_lmdb(m, rc, "deleting an id") : 0;
}
