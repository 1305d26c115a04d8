/*
 * store.h: the on-disk format of a tartan index (layer prefix store_). Everything here is the
 * LMDB side of DESIGN.md section 6; storage/FORMAT.md describes every key and value byte by
 * byte, and the code cites it. The layers above (index/, engine/) never see an LMDB type except
 * through the transaction handle store_txn, which they only pass back into this layer.
 *
 * Lifecycle of an environment:
 *   1. store_open(path, ...) opens (or creates) the directory's environment, its named
 *      databases and checks the format version;
 *   2. store_write(env, fn, ctx, msg) runs one change as one write transaction; fn may be run
 *      again from the start when the map had to grow (MDB_MAP_FULL never reaches the caller);
 *      store_read_begin / store_read_end bracket a read snapshot (any number, any threads);
 *   3. store_close(env).
 *
 * Errors: every function returns 0, a negative TARTAN_E... code or a positive errno value, and
 * writes a detail message (without the code's name: the engine prefixes it) into a store_msg.
 * LMDB's own codes never leave this layer (store_map_lmdb).
 *
 * Threads: an env may be shared by threads. Write transactions are serialised by LMDB; a read
 * snapshot may be used by one thread at a time, and is not tied to the thread that began it
 * (MDB_NOTLS). A thread holding a read snapshot must not call store_write (the map may have to
 * grow, which waits for every snapshot of this process to end).
 */
#ifndef TARTAN_STORAGE_STORE_H
#define TARTAN_STORAGE_STORE_H

#include <stddef.h>
#include <stdint.h>

/* The format version this build writes and the only one it reads (FORMAT.md). */
#define STORE_FORMAT_VERSION 1u

/* Longest external id in bytes: LMDB's default largest key. */
#define STORE_MAX_ID 511u

/* Most tokens in one document: keeps a blob's offsets in 32 bits with room to spare. */
#define STORE_MAX_DOC_TOKENS (1u << 20)

/* Detail of the last failure, written by the function that failed. */
typedef struct store_msg {
    char text[512];
} store_msg;

/* Formats msg (printf-style) and returns code: `return store_fail(m, TARTAN_EDIM, ...)`. */
int store_fail(store_msg *m, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

typedef struct store_env store_env;
typedef struct store_txn store_txn; /* an MDB_txn, opaque to the layers above */

/* The fixed part of an index's description: meta key "header" (FORMAT.md). */
typedef struct store_header {
    uint32_t dim;
    uint32_t nbits;       /* 1, 2, 4 or 8 */
    uint32_t n_centroids; /* 0 until trained */
    uint32_t code_bytes;  /* 2 or 4 once trained, 0 before */
    uint32_t token_bytes; /* dim * nbits / 8 */
    uint32_t next_docno;  /* the next document number to hand out; numbers are never reused */
    uint64_t n_docs;      /* live documents */
    uint64_t n_tokens;    /* tokens of the live documents */
    uint64_t seed;        /* k-means and sampling seed the index was created with */
    uint32_t kmeans_iters;
    uint32_t sample_docs; /* 0: DESIGN's formula */
} store_header;

/* Options of store_open. */
enum {
    STORE_CREATE = 1,   /* create the directory and an empty index if there is none */
    STORE_EXCL = 2,     /* with STORE_CREATE: fail with TARTAN_EEXIST if an index is there */
    STORE_READONLY = 4, /* open read-only; writes fail with TARTAN_EREADONLY */
};

/*
 * Opens the index in directory path. With STORE_CREATE and no index there, creates one described
 * by *init (dim, nbits, seed, kmeans_iters, sample_docs; the rest is computed) in one transaction.
 * map_size: the initial map size in bytes (0: STORE_DEFAULT_MAP). Errors: ENOENT (no directory,
 * no STORE_CREATE), TARTAN_ENOINDEX (a directory without a tartan index, or an LMDB environment
 * of something else), TARTAN_EEXIST, TARTAN_EVERSION, TARTAN_ECORRUPT (meta unreadable),
 * EACCES, ENOMEM, TARTAN_ESTORAGE.
 */
#define STORE_DEFAULT_MAP ((size_t)256 << 20)
int store_open(const char *path, unsigned flags, const store_header *init, size_t map_size,
               store_env **env, store_msg *m);
void store_close(store_env *env);

int store_is_readonly(const store_env *env);
const char *store_path(const store_env *env);

/*
 * One change: fn(txn, ctx, m) runs inside a fresh write transaction; returning 0 commits it,
 * anything else aborts it and is returned. When the map is full (at any put or at commit), the
 * transaction is aborted, the map grows, and fn runs again from the start: fn must derive
 * everything it writes from ctx and the transaction, never from what an earlier run changed.
 * TARTAN_EREADONLY on a read-only env.
 */
typedef int (*store_write_fn)(store_txn *txn, void *ctx, store_msg *m);
int store_write(store_env *env, store_write_fn fn, void *ctx, store_msg *m);

/* A read snapshot (MDB_RDONLY transaction). End it with store_read_end (NULL ok). */
int store_read_begin(store_env *env, store_txn **txn, store_msg *m);
void store_read_end(store_env *env, store_txn *txn);

/* Map size in bytes now (it grows by itself). */
size_t store_map_size(store_env *env);

/*
 * A full map, as store_map_lmdb reports it to a store_write function, which must return it
 * unchanged: store_write then grows the map and runs the change again. Never leaves this
 * layer's store_write (outside TARTAN_ERRNO_MAP's codes, in its reserved band).
 */
#define STORE_EMAPFULL (-30990)

/* Maps an LMDB or system code from an mdb_ call to TARTAN_ESTORAGE/errno with a message. */
int store_map_lmdb(store_msg *m, int rc, const char *what);

/* ---- meta ---------------------------------------------------------------------------- */

/* Reads / writes the header (meta "header"). TARTAN_ECORRUPT if absent or the wrong size. */
int store_header_get(store_txn *txn, store_header *h, store_msg *m);
int store_header_put(store_txn *txn, const store_header *h, store_msg *m);

/*
 * Codec tables (meta "codec"): cutoffs [2^nbits - 1] then weights [2^nbits], fp32.
 * store_codec_get: TARTAN_ENOTTRAINED if the index has none yet.
 */
int store_codec_get(store_txn *txn, unsigned nbits, float *cutoffs, float *weights, store_msg *m);
int store_codec_put(store_txn *txn, unsigned nbits, const float *cutoffs, const float *weights,
                    store_msg *m);

/*
 * A meta record the layers above lay out themselves (FORMAT.md "meta": "calibration"):
 * store_meta_put writes len bytes under name; store_meta_get points *data into the map (valid
 * for the transaction's life, no alignment promised) or returns TARTAN_ENOTFOUND (no
 * message) when there is no such record.
 */
#define STORE_META_CALIBRATION "calibration"
int store_meta_put(store_txn *txn, const char *name, const void *data, size_t len, store_msg *m);
int store_meta_get(store_txn *txn, const char *name, const void **data, size_t *len,
                   store_msg *m);

/*
 * Centroids [k, dim] fp32 as one value. store_centroids_get points into the map (valid for the
 * transaction's life, 4-byte aligned) and checks the size against k * dim.
 */
int store_centroids_get(store_txn *txn, uint32_t k, uint32_t dim, const float **c, store_msg *m);
int store_centroids_put(store_txn *txn, uint32_t k, uint32_t dim, const float *c, store_msg *m);

/* ---- documents ------------------------------------------------------------------------ */

/*
 * A document blob (FORMAT.md "docs"): a view of its parts. Pointers point into the map when
 * the blob was read, 4-byte aligned, valid for the transaction's life.
 */
typedef struct store_doc {
    uint32_t ntok;
    const float *inv_norms;   /* [ntok] */
    const void *codes;        /* [ntok] uint16 (code_bytes 2) or uint32 (4) */
    const uint8_t *residuals; /* [ntok, token_bytes] */
} store_doc;

/* Bytes of the blob of a document of ntok tokens (a multiple of 4). */
size_t store_doc_size(uint32_t ntok, unsigned code_bytes, unsigned token_bytes);

/*
 * Writes document docno: reserves the blob in the map and lays out ntok tokens; the caller
 * gets pointers to fill (inv_norms, codes, residuals) and then calls store_doc_seal to write
 * the checksum. Returns TARTAN_EEXIST if docno is taken.
 */
typedef struct store_doc_out {
    uint8_t *blob;
    size_t size;
    float *inv_norms;
    void *codes;
    uint8_t *residuals;
} store_doc_out;
int store_doc_reserve(store_txn *txn, uint32_t docno, uint32_t ntok, unsigned code_bytes,
                      unsigned token_bytes, store_doc_out *out, store_msg *m);
void store_doc_seal(uint32_t docno, store_doc_out *out);

/*
 * Reads document docno. verify: check the checksum (TARTAN_ECORRUPT on mismatch).
 * TARTAN_ENOTFOUND if there is no such (live) document; TARTAN_ECORRUPT for a blob whose size
 * does not match its token count, or a misaligned one.
 */
int store_doc_get(store_txn *txn, uint32_t docno, unsigned code_bytes, unsigned token_bytes,
                  int verify, store_doc *doc, store_msg *m);

/* Parses and checks a blob already in hand (used by store_doc_get and iteration). */
int store_doc_parse(uint32_t docno, const void *blob, size_t size, unsigned code_bytes,
                    unsigned token_bytes, int verify, store_doc *doc, store_msg *m);

int store_doc_del(store_txn *txn, uint32_t docno, store_msg *m);

/* A cursor over all documents in number order. */
typedef struct store_cursor store_cursor;
int store_docs_first(store_txn *txn, store_cursor **c, store_msg *m);
/* Next document: 1 (docno, blob, size set), 0 at the end, or an error. */
int store_docs_next(store_cursor *c, uint32_t *docno, const void **blob, size_t *size,
                    store_msg *m);
void store_cursor_close(store_cursor *c);

/* CRC32C (Castagnoli) of data, continued from crc (0 to start). */
uint32_t store_crc32c(uint32_t crc, const void *data, size_t n);
/* The same through the portable table loop (what machines without SSE4.2 run; for tests). */
uint32_t store_crc32c_portable(uint32_t crc, const void *data, size_t n);

/* ---- inverted lists ------------------------------------------------------------------- */

/* Adds / removes docno under each of the n (distinct, any order) centroids in codes. */
int store_ivf_add(store_txn *txn, uint32_t docno, const uint32_t *codes, size_t n, store_msg *m);
int store_ivf_del(store_txn *txn, uint32_t docno, const uint32_t *codes, size_t n, store_msg *m);

/*
 * Iterates centroid c's inverted list in ascending document number, a run at a time straight
 * from the map (MDB_GET_MULTIPLE): each call to store_ivf_next yields a pointer to up to a
 * page's worth of native uint32 document numbers, 4-byte aligned, valid for the transaction's
 * life. Returns 1 with *docs and *n set, 0 at the end (an empty list yields 0 at once).
 */
typedef struct store_ivf_iter store_ivf_iter;
int store_ivf_open(store_txn *txn, uint32_t centroid, store_ivf_iter **it, store_msg *m);
int store_ivf_next(store_ivf_iter *it, const uint32_t **docs, size_t *n, store_msg *m);
void store_ivf_close(store_ivf_iter *it);
/* Length of centroid c's list. */
int store_ivf_count(store_txn *txn, uint32_t centroid, size_t *n, store_msg *m);

/* ---- external ids -------------------------------------------------------------------- */

/* id -> docno: 0 found, TARTAN_ENOTFOUND. */
int store_id_get(store_txn *txn, const char *id, size_t len, uint32_t *docno, store_msg *m);
/* docno -> id (pointer into the map, not NUL-terminated): 0 or TARTAN_ENOTFOUND. */
int store_name_get(store_txn *txn, uint32_t docno, const char **id, size_t *len, store_msg *m);
/* Binds id <-> docno in both databases (id must be unbound). */
int store_id_put(store_txn *txn, const char *id, size_t len, uint32_t docno, store_msg *m);
/* Unbinds id and docno in both databases. */
int store_id_del(store_txn *txn, const char *id, size_t len, uint32_t docno, store_msg *m);

/* ---- space --------------------------------------------------------------------------- */

/* Bytes in use per named database (pages times page size) and in the file. */
typedef struct store_usage {
    uint64_t meta, centroids, docs, ivf, ids, names;
    uint64_t file; /* data.mdb's size */
    uint64_t free; /* pages in the file that hold nothing live (free list, unused tail) */
    uint64_t ivf_entries;
    uint64_t page_size;
} store_usage;
int store_usage_get(store_env *env, store_txn *txn, store_usage *u, store_msg *m);

/*
 * Test and repair support: visits every key/value of every named database in order (meta,
 * centroids, docs, ivf, ids, names; duplicates of ivf one by one). fn returns 0 to go on.
 */
typedef int (*store_dump_fn)(const char *db, const void *key, size_t klen, const void *val,
                             size_t vlen, void *ctx);
int store_dump(store_txn *txn, store_dump_fn fn, void *ctx, store_msg *m);

/* ---- model records (storage/model_records.c) ------------------------------------------- */

/*
 * The records of an index's trained model as stored (FORMAT.md "Model records"): every meta
 * record but the index's own (format, header, calibration: store_meta_is_local) and every
 * centroids record. tartan_model_export copies them out, tartan_model_import writes them into
 * another index of the same format version, byte for byte.
 */
enum { STORE_DB_META = 1, STORE_DB_CENTROIDS = 2 };
/* Visits the model records, meta's in name order then the centroids', as stored (pointers into
 * the map, valid during the call). fn returns 0 to go on; anything else stops and is returned. */
typedef int (*store_record_fn)(int db, const void *key, size_t klen, const void *val,
                               size_t vlen, void *ctx);
int store_model_records(store_txn *txn, store_record_fn fn, void *ctx, store_msg *m);
/* One model record: 0 (pointer into the map), TARTAN_ENOTFOUND (no message). */
int store_model_record_get(store_txn *txn, int db, const void *key, size_t klen,
                           const void **val, size_t *vlen, store_msg *m);
/* Writes one model record as given. TARTAN_EINVAL for a local meta name, a bad key size. */
int store_model_record_put(store_txn *txn, int db, const void *key, size_t klen, const void *val,
                           size_t vlen, store_msg *m);
/* 1 when meta record name (len bytes) describes the index itself, not its model. */
int store_meta_is_local(const void *name, size_t len);

#endif
