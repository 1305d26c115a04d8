/*
 * idmap.c: external ids <-> document numbers (databases "ids" and "names", FORMAT.md). The two
 * always change together: an id is bound in both or in neither.
 */
#include "config.h"

#include <string.h>

#include "store_internal.h"
#include "tartan.h"

int store_id_get(store_txn *t, const char *id, size_t len, uint32_t *docno, store_msg *m)
{
    MDB_val k = {len, (void *)id}, d;
    int rc = mdb_get(t->st_txn, t->st_env->se_ids, &k, &d);
    if (rc == MDB_NOTFOUND)
        return TARTAN_ENOTFOUND; /* an answer, not a failure: no message */
    if (rc)
        return store_map_lmdb(m, rc, "looking up an id");
    if (d.mv_size != 4)
        return store_fail(m, TARTAN_ECORRUPT, "id '%.*s' maps to a value of %zu bytes",
                          (int)(len > 64 ? 64 : len), id, d.mv_size);
    memcpy(docno, d.mv_data, 4);
    return 0;
}

int store_name_get(store_txn *t, uint32_t docno, const char **id, size_t *len, store_msg *m)
{
    unsigned key = docno;
    MDB_val k = {sizeof key, &key}, d;
    int rc = mdb_get(t->st_txn, t->st_env->se_names, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTFOUND, "document %u has no id", docno);
    if (rc)
        return store_map_lmdb(m, rc, "looking up a document's id");
    *id = d.mv_data;
    *len = d.mv_size;
    return 0;
}

int store_id_put(store_txn *t, const char *id, size_t len, uint32_t docno, store_msg *m)
{
    unsigned key = docno;
    MDB_val k = {len, (void *)id}, d = {sizeof key, &key};
    int rc = mdb_put(t->st_txn, t->st_env->se_ids, &k, &d, MDB_NOOVERWRITE);
    if (rc == MDB_KEYEXIST)
        return store_fail(m, TARTAN_EDUPID, "id '%.*s' exists", (int)(len > 64 ? 64 : len), id);
    if (rc)
        return store_map_lmdb(m, rc, "writing an id");
    MDB_val nk = {sizeof key, &key}, nd = {len, (void *)id};
    /* Numbers grow: append (FORMAT.md). */
    rc = mdb_put(t->st_txn, t->st_env->se_names, &nk, &nd, MDB_APPEND);
    if (rc == MDB_KEYEXIST)
        return store_fail(m, TARTAN_ECORRUPT, "document number %u has an id already", docno);
    return rc ? store_map_lmdb(m, rc, "writing an id") : 0;
}

int store_id_del(store_txn *t, const char *id, size_t len, uint32_t docno, store_msg *m)
{
    MDB_val k = {len, (void *)id};
    int rc = mdb_del(t->st_txn, t->st_env->se_ids, &k, NULL);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT, "id '%.*s' is not bound", (int)(len > 64 ? 64 : len),
                          id);
    if (rc)
        return store_map_lmdb(m, rc, "deleting an id");
    unsigned key = docno;
    MDB_val nk = {sizeof key, &key};
    rc = mdb_del(t->st_txn, t->st_env->se_names, &nk, NULL);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT, "document %u has no id", docno);
    return rc ? store_map_lmdb(m, rc, "deleting an id") : 0;
}
