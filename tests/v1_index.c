/* v1_index.c: see v1_index.h. */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <lmdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "store_internal.h"
#include "v1_index.h"

/* The version-1 blob of a document: [ntok][crc][norms][codes][residuals][pad to 4], the CRC
 * over the document number and the blob from byte 8. */
static void *v1_blob(uint32_t docno, const store_doc *d, unsigned cb, unsigned tb, size_t *size)
{
    size_t n = 8 + (size_t)d->ntok * (4 + cb + tb);
    n = (n + 3) & ~(size_t)3;
    uint8_t *b = calloc(1, n);
    ck_assert_ptr_nonnull(b);
    memcpy(b, &d->ntok, 4);
    memcpy(b + 8, d->inv_norms, (size_t)d->ntok * 4);
    memcpy(b + 8 + (size_t)d->ntok * 4, d->codes, (size_t)d->ntok * cb);
    memcpy(b + 8 + (size_t)d->ntok * (4 + cb), d->residuals, (size_t)d->ntok * tb);
    uint32_t c = store_crc32c(0, &docno, 4);
    c = store_crc32c(c, b + 8, n - 8);
    memcpy(b + 4, &c, 4);
    *size = n;
    return b;
}

static void put(MDB_txn *txn, MDB_dbi dbi, const void *k, size_t kl, const void *v, size_t vl,
                unsigned flags)
{
    MDB_val key = {kl, (void *)k}, val = {vl, (void *)v};
    int rc = mdb_put(txn, dbi, &key, &val, flags);
    ck_assert_msg(rc == 0, "mdb_put: %s", mdb_strerror(rc));
}

void v1_index_from(const char *src, const char *dst)
{
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    ck_assert_msg(store_open(src, STORE_READONLY, NULL, 0, &env, &m) == 0, "%s", m.text);
    ck_assert_int_eq(store_read_begin(env, &t, &m), 0);
    store_header h;
    ck_assert_int_eq(store_header_get(t, &h, &m), 0);

    ck_assert_int_eq(mkdir(dst, 0755), 0);
    MDB_env *e;
    MDB_txn *w;
    MDB_dbi meta, cent, docs, ivf, ids, names;
    ck_assert_int_eq(mdb_env_create(&e), 0);
    ck_assert_int_eq(mdb_env_set_maxdbs(e, 8), 0);
    ck_assert_int_eq(mdb_env_set_mapsize(e, (size_t)1 << 30), 0);
    ck_assert_int_eq(mdb_env_open(e, dst, 0, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(e, NULL, 0, &w), 0);
    ck_assert_int_eq(mdb_dbi_open(w, "meta", MDB_CREATE, &meta), 0);
    ck_assert_int_eq(mdb_dbi_open(w, "centroids", MDB_CREATE | MDB_INTEGERKEY, &cent), 0);
    ck_assert_int_eq(mdb_dbi_open(w, "docs", MDB_CREATE | MDB_INTEGERKEY, &docs), 0);
    ck_assert_int_eq(mdb_dbi_open(w, "ivf",
                                  MDB_CREATE | MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED |
                                      MDB_INTEGERDUP,
                                  &ivf),
                     0);
    ck_assert_int_eq(mdb_dbi_open(w, "ids", MDB_CREATE, &ids), 0);
    ck_assert_int_eq(mdb_dbi_open(w, "names", MDB_CREATE | MDB_INTEGERKEY, &names), 0);

    /* meta: the 12-byte format record, the raw 64-byte header (bytes 56..63 zero), raw codec */
    uint8_t fmt[12];
    memcpy(fmt, "tartanix", 8);
    uint32_t one = 1;
    memcpy(fmt + 8, &one, 4);
    put(w, meta, "format", 6, fmt, 12, 0);
    const void *hd;
    size_t hl;
    ck_assert_int_eq(store_meta_get(t, "header", &hd, &hl, &m), 0);
    uint8_t hb[64];
    memcpy(hb, hd, 64);
    memset(hb + 56, 0, 8);
    put(w, meta, "header", 6, hb, 64, 0);
    /* Version 1 kept the search calibration bare too. */
    const void *cal;
    size_t cl;
    if (store_meta_get(t, STORE_META_CALIBRATION, &cal, &cl, &m) == 0)
        put(w, meta, STORE_META_CALIBRATION, strlen(STORE_META_CALIBRATION), cal, cl, 0);
    unsigned cb = h.code_bytes, tb = h.token_bytes;
    if (h.n_centroids) {
        size_t nb = (size_t)1 << h.nbits;
        float cut[255], wt[256], tab[511];
        ck_assert_int_eq(store_codec_get(t, h.nbits, cut, wt, &m), 0);
        memcpy(tab, cut, (nb - 1) * 4);
        memcpy(tab + nb - 1, wt, nb * 4);
        put(w, meta, "codec", 5, tab, (2 * nb - 1) * 4, 0);
        const float *c;
        ck_assert_int_eq(store_centroids_get(t, h.n_centroids, h.dim, &c, &m), 0);
        unsigned zero = 0;
        put(w, cent, &zero, 4, c, (size_t)h.n_centroids * h.dim * 4, 0);
    }
    /* docs */
    store_cursor *cur;
    ck_assert_int_eq(store_docs_first(t, 1, &cur, &m), 0);
    uint32_t docno;
    const void *rec;
    size_t size;
    int rc;
    while ((rc = store_docs_next(cur, &docno, &rec, &size, &m)) == 1) {
        store_doc d;
        ck_assert_int_eq(store_doc_parse(docno, rec, size, cb, tb, 1, &d, &m), 0);
        size_t bl;
        void *b = v1_blob(docno, &d, cb, tb, &bl);
        put(w, docs, &docno, 4, b, bl, MDB_APPEND);
        free(b);
    }
    ck_assert_int_eq(rc, 0);
    store_cursor_close(cur);
    /* ivf: one sorted duplicate per (centroid, document) */
    for (uint32_t c = 0; c < h.n_centroids; c++) {
        store_ivf_iter *it;
        ck_assert_int_eq(store_ivf_open(t, c, &it, &m), 0);
        const uint32_t *v;
        size_t n;
        while ((rc = store_ivf_next(it, &v, &n, &m)) == 1)
            for (size_t i = 0; i < n; i++)
                put(w, ivf, &c, 4, &v[i], 4, 0);
        ck_assert_int_eq(rc, 0);
        store_ivf_close(it);
    }
    /* ids: bare u32 values; names: bare id bytes */
    MDB_cursor *ic;
    ck_assert_int_eq(mdb_cursor_open(t->st_txn, t->st_gen->g_ids, &ic), 0);
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while (mdb_cursor_get(ic, &k, &d, op) == 0) {
        op = MDB_NEXT;
        uint32_t dn;
        ck_assert_int_eq(store_ids_decode(k.mv_data, k.mv_size, d.mv_data, d.mv_size, &dn, &m), 0);
        put(w, ids, k.mv_data, k.mv_size, &dn, 4, 0);
        put(w, names, &dn, 4, k.mv_data, k.mv_size, 0);
    }
    mdb_cursor_close(ic);
    ck_assert_int_eq(mdb_txn_commit(w), 0);
    mdb_env_close(e);
    store_read_end(env, t);
    store_close(env);
}
