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
    return 0;
}

int store_centroids_get(store_txn *t, uint32_t k, uint32_t dim, const float **c, store_msg *m)
{
    unsigned key = 0;
    MDB_val kv = {sizeof key, &key}, d;
    int rc = store_get(t, t->st_gen->g_centroids, &kv, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTTRAINED, "the index has no centroids yet");
    if (rc)
        return store_map_lmdb(m, rc, "reading the centroids");
    store_gen *g = t->st_gen;
    uint32_t crc = 0;
    if (d.mv_size >= STORE_CENT_HEAD)
        memcpy(&crc, (const uint8_t *)d.mv_data + 12, 4);
    pthread_mutex_lock(&g->g_cent_lock);
    /* The copy stands for the record it was made from: same size and checksum field (the
     * record is written once, at training). */
    if (g->g_cent && g->g_cent_size == d.mv_size && g->g_cent_crc == crc) {
        *c = g->g_cent;
        pthread_mutex_unlock(&g->g_cent_lock);
        return 0;
    }
    if (g->g_cent) {
        /* Written once, at training: another table under an open environment means the
         * record was damaged (the copy in hand may be in use by other snapshots). */
        pthread_mutex_unlock(&g->g_cent_lock);
        return store_fail(m, TARTAN_ECORRUPT, "the centroid record changed under an open index");
    }
    int dtype;
    const void *data;
    rc = store_centroids_check(d.mv_data, d.mv_size, k, dim, 1, &dtype, &data, m);
    if (rc) {
        pthread_mutex_unlock(&g->g_cent_lock);
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
    g->g_cent = f;
    g->g_cent_size = d.mv_size;
    g->g_cent_crc = crc;
    *c = f;
    pthread_mutex_unlock(&g->g_cent_lock);
    return 0;
}
