/*
 * meta.c: the index's description (meta "header"), its codec tables (meta "codec") and its
 * centroids (database "centroids"). Layouts: FORMAT.md.
 */
#include "config.h"

#include <string.h>

#include "store_internal.h"
#include "tartan.h"

/* FORMAT.md "meta/header": 64 bytes, native byte order. */
#define HEADER_SIZE 64

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static void put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int store_header_put(store_txn *t, const store_header *h, store_msg *m)
{
    uint8_t b[HEADER_SIZE] = {0};
    put32(b + 0, h->dim);
    put32(b + 4, h->nbits);
    put32(b + 8, h->n_centroids);
    put32(b + 12, h->code_bytes);
    put32(b + 16, h->token_bytes);
    put32(b + 20, h->next_docno);
    put64(b + 24, h->n_docs);
    put64(b + 32, h->n_tokens);
    put64(b + 40, h->seed);
    put32(b + 48, h->kmeans_iters);
    put32(b + 52, h->sample_docs);
    MDB_val k = {strlen(STORE_KEY_HEADER), STORE_KEY_HEADER}, d = {sizeof b, b};
    int rc = mdb_put(t->st_txn, t->st_env->se_meta, &k, &d, 0);
    return rc ? store_map_lmdb(m, rc, "writing the index header") : 0;
}

int store_header_get(store_txn *t, store_header *h, store_msg *m)
{
    MDB_val k = {strlen(STORE_KEY_HEADER), STORE_KEY_HEADER}, d;
    int rc = mdb_get(t->st_txn, t->st_env->se_meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT, "the index header is missing");
    if (rc)
        return store_map_lmdb(m, rc, "reading the index header");
    if (d.mv_size != HEADER_SIZE)
        return store_fail(m, TARTAN_ECORRUPT, "the index header has %zu bytes, not %d", d.mv_size,
                          HEADER_SIZE);
    const uint8_t *b = d.mv_data;
    h->dim = get32(b + 0);
    h->nbits = get32(b + 4);
    h->n_centroids = get32(b + 8);
    h->code_bytes = get32(b + 12);
    h->token_bytes = get32(b + 16);
    h->next_docno = get32(b + 20);
    h->n_docs = get64(b + 24);
    h->n_tokens = get64(b + 32);
    h->seed = get64(b + 40);
    h->kmeans_iters = get32(b + 48);
    h->sample_docs = get32(b + 52);
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

int store_codec_put(store_txn *t, unsigned nbits, const float *cutoffs, const float *weights,
                    store_msg *m)
{
    size_t nb = (size_t)1 << nbits;
    float buf[511];
    memcpy(buf, cutoffs, (nb - 1) * sizeof(float));
    memcpy(buf + nb - 1, weights, nb * sizeof(float));
    MDB_val k = {strlen(STORE_KEY_CODEC), STORE_KEY_CODEC}, d = {(2 * nb - 1) * sizeof(float), buf};
    int rc = mdb_put(t->st_txn, t->st_env->se_meta, &k, &d, 0);
    return rc ? store_map_lmdb(m, rc, "writing the codec tables") : 0;
}

int store_codec_get(store_txn *t, unsigned nbits, float *cutoffs, float *weights, store_msg *m)
{
    MDB_val k = {strlen(STORE_KEY_CODEC), STORE_KEY_CODEC}, d;
    int rc = mdb_get(t->st_txn, t->st_env->se_meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTTRAINED, "the index has no codec yet");
    if (rc)
        return store_map_lmdb(m, rc, "reading the codec tables");
    size_t nb = (size_t)1 << nbits;
    if (d.mv_size != (2 * nb - 1) * sizeof(float))
        return store_fail(m, TARTAN_ECORRUPT, "the codec tables have %zu bytes, not %zu", d.mv_size,
                          (2 * nb - 1) * sizeof(float));
    memcpy(cutoffs, d.mv_data, (nb - 1) * sizeof(float));
    memcpy(weights, (const float *)d.mv_data + nb - 1, nb * sizeof(float));
    return 0;
}

int store_meta_put(store_txn *t, const char *name, const void *data, size_t len, store_msg *m)
{
    MDB_val k = {strlen(name), (void *)name}, d = {len, (void *)data};
    int rc = mdb_put(t->st_txn, t->st_env->se_meta, &k, &d, 0);
    return rc ? store_map_lmdb(m, rc, "writing a meta record") : 0;
}

int store_meta_get(store_txn *t, const char *name, const void **data, size_t *len, store_msg *m)
{
    MDB_val k = {strlen(name), (void *)name}, d;
    int rc = mdb_get(t->st_txn, t->st_env->se_meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return TARTAN_ENOTFOUND;
    if (rc)
        return store_map_lmdb(m, rc, "reading a meta record");
    *data = d.mv_data;
    *len = d.mv_size;
    return 0;
}

/* FORMAT.md "centroids": one value under key 0. */
int store_centroids_put(store_txn *t, uint32_t k, uint32_t dim, const float *c, store_msg *m)
{
    unsigned key = 0;
    MDB_val kv = {sizeof key, &key}, d = {(size_t)k * dim * sizeof(float), NULL};
    int rc = mdb_put(t->st_txn, t->st_env->se_centroids, &kv, &d, MDB_RESERVE);
    if (rc)
        return store_map_lmdb(m, rc, "writing the centroids");
    memcpy(d.mv_data, c, d.mv_size);
    return 0;
}

int store_centroids_get(store_txn *t, uint32_t k, uint32_t dim, const float **c, store_msg *m)
{
    unsigned key = 0;
    MDB_val kv = {sizeof key, &key}, d;
    int rc = mdb_get(t->st_txn, t->st_env->se_centroids, &kv, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOTTRAINED, "the index has no centroids yet");
    if (rc)
        return store_map_lmdb(m, rc, "reading the centroids");
    if (d.mv_size != (size_t)k * dim * sizeof(float))
        return store_fail(m, TARTAN_ECORRUPT, "the centroids have %zu bytes, not %zu", d.mv_size,
                          (size_t)k * dim * sizeof(float));
    /* A value this large lives on its own overflow pages, which start 16 bytes into a page:
     * aligned. A small one (a handful of centroids) sits in a leaf and may not be. */
    if ((uintptr_t)d.mv_data % sizeof(float) != 0)
        return store_fail(m, TARTAN_ECORRUPT, "the centroids are misaligned in the map");
    *c = d.mv_data;
    return 0;
}
