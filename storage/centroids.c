/*
 * centroids.c: the centroid table (database "centroids", FORMAT.md): one checksummed record of
 * K x dim values, fp16 for indexes trained by this version, fp32 for indexes converted from
 * version 1. Readers get fp32: a copy made once per environment, since the table never changes
 * after training (the checksum is verified when the copy is made).
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "tartan.h"

static uint32_t cent_crc(const uint8_t *val, size_t size)
{
    uint32_t c = store_crc32c(0, val, 12);
    return store_crc32c(c, val + STORE_CENT_HEAD, size - STORE_CENT_HEAD);
}

int store_centroids_check(const void *vval, size_t size, uint32_t k, uint32_t dim, int verify,
                          int *dtype, const void **data, store_msg *m)
{
    const uint8_t *val = vval;
    if (size < STORE_CENT_HEAD)
        return store_fail(m, TARTAN_ECORRUPT, "the centroid record has %zu bytes", size);
    uint32_t rk, rd, dt, want;
    memcpy(&rk, val, 4);
    memcpy(&rd, val + 4, 4);
    memcpy(&dt, val + 8, 4);
    memcpy(&want, val + 12, 4);
    if (verify) {
        uint32_t got = cent_crc(val, size);
        if (got != want)
            return store_fail(m, TARTAN_ECORRUPT,
                              "the centroid table: checksum mismatch (stored %08x, computed %08x)",
                              want, got);
    }
    size_t el = dt == STORE_CENT_F32 ? 4 : dt == STORE_CENT_F16 ? 2 : 0;
    if (el == 0)
        return store_fail(m, TARTAN_ECORRUPT, "the centroid table has unknown type %u", dt);
    if (rk != k || rd != dim || size != STORE_CENT_HEAD + (size_t)k * dim * el)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the centroid table holds %u x %u in %zu bytes; the header says %u x %u",
                          rk, rd, size, k, dim);
    *dtype = (int)dt;
    *data = val + STORE_CENT_HEAD;
    return 0;
}

int store_centroids_put(store_txn *t, uint32_t k, uint32_t dim, const float *c, int dtype,
                        store_msg *m)
{
    t->st_dirty = 1;
    size_t el = dtype == STORE_CENT_F16 ? 2 : 4;
    size_t n = (size_t)k * dim;
    unsigned key = 0;
    MDB_val kv = {sizeof key, &key}, d = {STORE_CENT_HEAD + n * el, NULL};
    int rc = mdb_put(t->st_txn, t->st_gen->g_centroids, &kv, &d, MDB_RESERVE);
    if (rc)
        return store_map_lmdb(m, rc, "writing the centroids");
    uint8_t *v = d.mv_data;
    uint32_t dt = (uint32_t)dtype;
    memcpy(v, &k, 4);
    memcpy(v + 4, &dim, 4);
    memcpy(v + 8, &dt, 4);
    if (dtype == STORE_CENT_F16) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h = store_f32_to_f16(c[i]);
            memcpy(v + STORE_CENT_HEAD + 2 * i, &h, 2);
        }
    } else {
        memcpy(v + STORE_CENT_HEAD, c, n * 4);
    }
    uint32_t crc = cent_crc(v, d.mv_size);
    memcpy(v + 12, &crc, 4);
    return store_centroids_put_copy(t, v, d.mv_size, m);
}

int store_centroids_put_copy(store_txn *t, const void *val, size_t size, store_msg *m)
{
    t->st_dirty = 1;
    /* The second copy (FORMAT.md "centroids"): the same bytes, in the same transaction. A
     * value of the map may move when the tree changes: copy it out first. */
    void *b = malloc(size ? size : 1);
    if (!b)
        return store_fail(m, ENOMEM, "out of memory for the centroids' copy");
    memcpy(b, val, size);
    unsigned key = STORE_CENT_COPY_KEY;
    MDB_val kv = {sizeof key, &key}, d = {size, b};
    int rc = mdb_put(t->st_txn, t->st_gen->g_centroids, &kv, &d, 0);
    free(b);
    return rc ? store_map_lmdb(m, rc, "writing the centroids' copy") : 0;
}

/* Record `key` of the centroids database: 0 and its value, or an error (no message). */
static int cent_record(store_txn *t, unsigned key, MDB_val *d)
{
    MDB_val kv = {sizeof key, &key};
    return store_get(t, t->st_gen->g_centroids, &kv, d);
}

int store_centroids_get(store_txn *t, uint32_t k, uint32_t dim, const float **c, store_msg *m)
{
    store_gen *g = t->st_gen;
    pthread_mutex_lock(&g->g_cent_lock);
    MDB_val d;
    int rc;
    if (g->g_cent) {
        /* The copy stands for the record it was made from: same size and checksum field (the
         * record is written once, at training). */
        uint32_t crc = 0;
        rc = cent_record(t, g->g_cent_key, &d);
        if (rc == 0 && d.mv_size >= STORE_CENT_HEAD)
            memcpy(&crc, (const uint8_t *)d.mv_data + 12, 4);
        if (rc == 0 && g->g_cent_size == d.mv_size && g->g_cent_crc == crc) {
            *c = g->g_cent;
            pthread_mutex_unlock(&g->g_cent_lock);
            return 0;
        }
        /* Written once, at training: another table under an open environment means the
         * record was damaged (the copy in hand may be in use by other snapshots). */
        pthread_mutex_unlock(&g->g_cent_lock);
        return store_fail(m, TARTAN_ECORRUPT, "the centroid record changed under an open index");
    }
    rc = cent_record(t, 0, &d);
    int dtype;
    const void *data;
    store_msg pm = {{0}};
    unsigned used = 0;
    if (rc == MDB_NOTFOUND) {
        /* No table, or a primary lost with its key: the copy tells. */
        MDB_val cd;
        if (cent_record(t, STORE_CENT_COPY_KEY, &cd) != 0) {
            pthread_mutex_unlock(&g->g_cent_lock);
            return store_fail(m, TARTAN_ENOTTRAINED, "the index has no centroids yet");
        }
        rc = store_fail(&pm, TARTAN_ECORRUPT, "the centroid table (key 0) is missing");
    } else if (rc) {
        rc = store_map_lmdb(&pm, rc, "reading the centroids");
    } else {
        rc = store_centroids_check(d.mv_data, d.mv_size, k, dim, 1, &dtype, &data, &pm);
    }
    if (rc == TARTAN_ECORRUPT) {
        /* The primary is damaged: the copy, when it is sound, serves (tartan check reports
         * the damage and a repair restores the primary). */
        MDB_val cd;
        if (cent_record(t, STORE_CENT_COPY_KEY, &cd) == 0 &&
            store_centroids_check(cd.mv_data, cd.mv_size, k, dim, 1, &dtype, &data, NULL) == 0) {
            d = cd;
            used = STORE_CENT_COPY_KEY;
            rc = 0;
        } else {
            rc = store_fail(&pm, TARTAN_ECORRUPT, "%.400s, and its copy is damaged or missing",
                            pm.text);
        }
    }
    if (rc) {
        pthread_mutex_unlock(&g->g_cent_lock);
        if (m)
            *m = pm;
        return rc;
    }
    size_t n = (size_t)k * dim;
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (!f) {
        pthread_mutex_unlock(&g->g_cent_lock);
        return store_fail(m, ENOMEM, "out of memory for %u centroids", k);
    }
    if (dtype == STORE_CENT_F32) {
        memcpy(f, data, n * 4);
    } else {
        const uint8_t *p = data;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            f[i] = store_f16_to_f32(h);
        }
    }
    uint32_t crc;
    memcpy(&crc, (const uint8_t *)d.mv_data + 12, 4);
    g->g_cent = f;
    g->g_cent_size = d.mv_size;
    g->g_cent_crc = crc;
    g->g_cent_key = used;
    *c = f;
    pthread_mutex_unlock(&g->g_cent_lock);
    return 0;
}
