/*
 * ivf.c: the inverted lists (database "ivf", FORMAT.md): for each centroid, the sorted set of
 * document numbers that have a token with that code, as LMDB duplicates of fixed size so that
 * a list reads out of the map a page at a time.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "tartan.h"

int store_ivf_add(store_txn *t, uint32_t docno, const uint32_t *codes, size_t n, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(t->st_txn, t->st_env->se_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    unsigned doc = docno;
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned key = codes[i];
        MDB_val k = {sizeof key, &key}, d = {sizeof doc, &doc};
        /* A new document has the highest number yet (FORMAT.md), so it goes at the end of
         * each list: MDB_APPENDDUP makes LMDB split a full page by starting a new one rather
         * than halving it, so that lists stay packed. */
        rc = mdb_cursor_put(cur, &k, &d, MDB_APPENDDUP);
        if (rc == MDB_KEYEXIST)
            rc = mdb_cursor_put(cur, &k, &d, MDB_NODUPDATA);
        if (rc == MDB_KEYEXIST)
            rc = 0; /* listed once per distinct code; a repeated code is harmless */
    }
    mdb_cursor_close(cur);
    return rc ? store_map_lmdb(m, rc, "writing the inverted lists") : 0;
}

int store_ivf_del(store_txn *t, uint32_t docno, const uint32_t *codes, size_t n, store_msg *m)
{
    unsigned doc = docno;
    for (size_t i = 0; i < n; i++) {
        unsigned key = codes[i];
        MDB_val k = {sizeof key, &key}, d = {sizeof doc, &doc};
        int rc = mdb_del(t->st_txn, t->st_env->se_ivf, &k, &d);
        if (rc == MDB_NOTFOUND)
            return store_fail(m, TARTAN_ECORRUPT,
                              "inverted list of centroid %u does not list document %u", key, docno);
        if (rc)
            return store_map_lmdb(m, rc, "updating the inverted lists");
    }
    return 0;
}

struct store_ivf_iter {
    MDB_cursor *si_cur;
    unsigned si_key;
    int si_state; /* 0: not started, 1: inside the list, 2: done */
};

int store_ivf_open(store_txn *t, uint32_t centroid, store_ivf_iter **out, store_msg *m)
{
    *out = NULL;
    store_ivf_iter *it = calloc(1, sizeof *it);
    if (!it)
        return store_fail(m, ENOMEM, "out of memory");
    int rc = mdb_cursor_open(t->st_txn, t->st_env->se_ivf, &it->si_cur);
    if (rc) {
        free(it);
        return store_map_lmdb(m, rc, "opening the inverted lists");
    }
    it->si_key = centroid;
    *out = it;
    return 0;
}

int store_ivf_next(store_ivf_iter *it, const uint32_t **docs, size_t *n, store_msg *m)
{
    MDB_val k = {sizeof it->si_key, &it->si_key}, d;
    int rc;
    if (it->si_state == 2)
        return 0;
    if (it->si_state == 0) {
        rc = mdb_cursor_get(it->si_cur, &k, &d, MDB_SET);
        if (rc == MDB_NOTFOUND) {
            it->si_state = 2;
            return 0;
        }
        if (rc)
            return store_map_lmdb(m, rc, "reading an inverted list");
        it->si_state = 1;
        rc = mdb_cursor_get(it->si_cur, &k, &d, MDB_GET_MULTIPLE);
    } else {
        rc = mdb_cursor_get(it->si_cur, &k, &d, MDB_NEXT_MULTIPLE);
    }
    if (rc == MDB_NOTFOUND) {
        it->si_state = 2;
        return 0;
    }
    if (rc)
        return store_map_lmdb(m, rc, "reading an inverted list");
    if (d.mv_size % sizeof(uint32_t) != 0 || (uintptr_t)d.mv_data % sizeof(uint32_t) != 0)
        return store_fail(m, TARTAN_ECORRUPT, "inverted list of centroid %u is malformed",
                          it->si_key);
    *docs = d.mv_data;
    *n = d.mv_size / sizeof(uint32_t);
    return 1;
}

void store_ivf_close(store_ivf_iter *it)
{
    if (!it)
        return;
    mdb_cursor_close(it->si_cur);
    free(it);
}

int store_ivf_count(store_txn *t, uint32_t centroid, size_t *n, store_msg *m)
{
    MDB_cursor *cur;
    *n = 0;
    int rc = mdb_cursor_open(t->st_txn, t->st_env->se_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    unsigned key = centroid;
    MDB_val k = {sizeof key, &key}, d;
    rc = mdb_cursor_get(cur, &k, &d, MDB_SET);
    if (rc == 0) {
        rc = mdb_cursor_count(cur, n);
    } else if (rc == MDB_NOTFOUND) {
        rc = 0;
    }
    mdb_cursor_close(cur);
    return rc ? store_map_lmdb(m, rc, "reading an inverted list") : 0;
}
