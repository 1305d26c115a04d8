/*
 * model_records.c: the records that make up an index's trained model, as stored (FORMAT.md
 * "Model records"): what tartan_model_export copies out of one index and tartan_model_import
 * writes into another, byte for byte, so that shards of one corpus share one codec whatever
 * the codec stores.
 */
#include "config.h"

#include <string.h>

#include "store_internal.h"
#include "tartan.h"

/*
 * Meta records that describe one index rather than its model: the format record and the
 * header (whose model fields the layer above carries itself), and what searches measure on
 * the index's own documents (the calibration). Every other meta record is the model's: a
 * record a later codec adds travels without a change here.
 */
static const char *const local_records[] = {STORE_KEY_FORMAT, STORE_KEY_HEADER, "calibration",
                                            STORE_KEY_COMMIT};

/* The second copies of the codec and the centroid table are storage's own redundancy, not
 * part of the model: export leaves them out, import writes them with their primaries. */
static int is_copy(int db, const void *key, size_t klen)
{
    unsigned k;
    if (db == STORE_DB_CENTROIDS)
        return klen == sizeof k && (memcpy(&k, key, sizeof k), k == STORE_CENT_COPY_KEY);
    return klen == strlen(STORE_KEY_CODEC_COPY) && !memcmp(key, STORE_KEY_CODEC_COPY, klen);
}

int store_meta_is_local(const void *name, size_t len)
{
    for (size_t i = 0; i < sizeof local_records / sizeof local_records[0]; i++)
        if (strlen(local_records[i]) == len && !memcmp(local_records[i], name, len))
            return 1;
    return 0;
}

static MDB_dbi dbi_of(const store_txn *t, int db)
{
    return db == STORE_DB_META ? t->st_gen->g_meta : t->st_gen->g_centroids;
}

int store_model_records(store_txn *t, store_record_fn fn, void *ctx, store_msg *m)
{
    static const int dbs[] = {STORE_DB_META, STORE_DB_CENTROIDS};
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        MDB_cursor *cur;
        int rc = mdb_cursor_open(t->st_txn, dbi_of(t, dbs[i]), &cur);
        if (rc)
            return store_map_lmdb(m, rc, "reading the model records");
        MDB_val k, d;
        MDB_cursor_op op = MDB_FIRST;
        while ((rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
            op = MDB_NEXT;
            if ((dbs[i] == STORE_DB_META && store_meta_is_local(k.mv_data, k.mv_size)) ||
                is_copy(dbs[i], k.mv_data, k.mv_size))
                continue;
            int r = fn(dbs[i], k.mv_data, k.mv_size, d.mv_data, d.mv_size, ctx);
            if (r) {
                mdb_cursor_close(cur);
                return r;
            }
        }
        mdb_cursor_close(cur);
        if (rc != MDB_NOTFOUND)
            return store_map_lmdb(m, rc, "reading the model records");
    }
    return 0;
}

int store_model_record_get(store_txn *t, int db, const void *key, size_t klen, const void **val,
                           size_t *vlen, store_msg *m)
{
    if (db != STORE_DB_META && db != STORE_DB_CENTROIDS)
        return store_fail(m, TARTAN_EINVAL, "no database %d holds model records", db);
    MDB_val k = {klen, (void *)key}, d;
    int rc = mdb_get(t->st_txn, dbi_of(t, db), &k, &d);
    if (rc == MDB_NOTFOUND)
        return TARTAN_ENOTFOUND;
    if (rc)
        return store_map_lmdb(m, rc, "reading a model record");
    *val = d.mv_data;
    *vlen = d.mv_size;
    return 0;
}

int store_model_record_put(store_txn *t, int db, const void *key, size_t klen, const void *val,
                           size_t vlen, store_msg *m)
{
    t->st_dirty = 1;
    if (db != STORE_DB_META && db != STORE_DB_CENTROIDS)
        return store_fail(m, TARTAN_EINVAL, "no database %d holds model records", db);
    if (klen == 0 || klen > STORE_MAX_ID)
        return store_fail(m, TARTAN_EINVAL, "a model record's key of %zu bytes", klen);
    if (db == STORE_DB_META && store_meta_is_local(key, klen))
        return store_fail(m, TARTAN_EINVAL, "meta record '%.*s' is not part of a model", (int)klen,
                          (const char *)key);
    /* The centroids database has integer keys: LMDB compares them as native unsigned
     * integers of 4 or 8 bytes and refuses other sizes. */
    if (db == STORE_DB_CENTROIDS && klen != sizeof(uint32_t) && klen != sizeof(uint64_t))
        return store_fail(m, TARTAN_EINVAL, "a centroids key of %zu bytes", klen);
    if (is_copy(db, key, klen))
        return store_fail(m, TARTAN_EINVAL, "a model string holds no second copies");
    MDB_val k = {klen, (void *)key}, d = {vlen, (void *)val};
    int rc = mdb_put(t->st_txn, dbi_of(t, db), &k, &d, 0);
    if (rc)
        return store_map_lmdb(m, rc, "writing a model record");
    if (db == STORE_DB_META && (rc = store_format_raise(t, store_format_needs(key, klen), m)))
        return rc;
    /* The primaries' copies (FORMAT.md): the centroid record byte for byte, the codec under
     * its own name (a meta record's checksum covers its name). */
    unsigned ck;
    if (db == STORE_DB_CENTROIDS && klen == sizeof ck && (memcpy(&ck, key, sizeof ck), ck == 0))
        return store_centroids_put_copy(t, val, vlen, m);
    if (db == STORE_DB_META && klen == strlen(STORE_KEY_CODEC) &&
        !memcmp(key, STORE_KEY_CODEC, klen) && vlen >= 4) {
        /* Only a sound primary gets a copy: a damaged one must fail the read-back. */
        uint32_t want;
        memcpy(&want, val, 4);
        if (store_meta_crc(key, klen, (const uint8_t *)val + 4, vlen - 4) == want)
            return store_meta_put(t, STORE_KEY_CODEC_COPY, (const uint8_t *)val + 4, vlen - 4, m);
    }
    return 0;
}
