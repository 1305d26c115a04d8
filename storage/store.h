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
 *      store_rewrite(env, fn, ...) replaces the whole environment by a new one that fn writes
 *      (compaction, conversion, salvage; storage/rewrite.c);
 *   3. store_close(env).
 *
 * An environment can be replaced under a live store_env by a store_rewrite in this or another
 * process (the directory is swapped atomically). Every transaction begins by checking that the
 * environment it uses is still the one in the directory and moves to the new one when it is
 * not, so that a write never lands in a replaced file and a new read snapshot always sees the
 * directory's current index. A snapshot begun before the swap stays valid and unchanged.
 *
 * Errors: every function returns 0, a negative TARTAN_E... code or a positive errno value, and
 * writes a detail message (without the code's name: the engine prefixes it) into a store_msg.
 * LMDB's own codes never leave this layer (store_map_lmdb).
 *
 * Threads: an env may be shared by threads. Write transactions are serialised by LMDB; a read
 * snapshot may be used by one thread at a time, and is not tied to the thread that began it
 * (MDB_NOTLS). A thread holding a read snapshot must not call store_write (the map may have to
 * grow, which waits for every snapshot of this process to end).
 *
 * Checksums: every value tartan writes carries a CRC-32C (FORMAT.md "Checksums"), bound to its
 * key, so that a value found under another key is damage too. Readers verify what is cheap to
 * verify on every read (headers, codec, id maps, inverted-list blocks, segment directories on
 * request, documents on request); store_verify (verify.h) verifies everything.
 */
#ifndef TARTAN_STORAGE_STORE_H
#define TARTAN_STORAGE_STORE_H

#include <stddef.h>
#include <stdint.h>

/* The format version this build creates and reads (FORMAT.md). Version 1 is read only to
 * convert it (STORE_OPEN_V1). Version 3 is version 2 with codec extension records (meta records
 * named codec.*, but codec.copy: the axes code), which a reader of version 2 would not know to
 * decode with: an index becomes version 3 in the transaction that first writes one
 * (store_format_raise), and this build reads and writes both. */
#define STORE_FORMAT_VERSION 2u
#define STORE_FORMAT_MAX 3u

/* The format version an index holding the meta record name [len] needs: 3 for a codec
 * extension record, else 2. */
unsigned store_format_needs(const void *name, size_t len);

/* Longest external id in bytes: LMDB's default largest key. */
#define STORE_MAX_ID 511u

/* Most tokens in one document: keeps a record's offsets in 32 bits with room to spare. */
#define STORE_MAX_DOC_TOKENS (1u << 20)

/* Longest meta record name (store_meta_put). */
#define STORE_MAX_META_NAME 64u

/* Detail of the last failure, written by the function that failed. */
typedef struct store_msg {
    char text[512];
} store_msg;

/* Formats msg (printf-style) and returns code: `return store_fail(m, TARTAN_EDIM, ...)`. */
int store_fail(store_msg *m, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

typedef struct store_env store_env;
typedef struct store_txn store_txn; /* an MDB_txn, opaque to the layers above */

/* The fixed part of an index's description: meta record "header" (FORMAT.md). */
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
    uint64_t n_postings;  /* (centroid, document) pairs in the inverted lists */
} store_header;

/* Options of store_open. */
enum {
    STORE_CREATE = 1,   /* create the directory and an empty index if there is none */
    STORE_EXCL = 2,     /* with STORE_CREATE: fail with TARTAN_EEXIST if an index is there */
    STORE_READONLY = 4, /* open read-only; writes fail with TARTAN_EREADONLY */
    /* Also open an index of format version 1, for store_rewrite to convert it (store_version
     * tells which it is; nothing but the v1 readers of v1.c and store_rewrite may use it). */
    STORE_OPEN_V1 = 8,
};

/*
 * Opens the index in directory path. With STORE_CREATE and no index there, creates one described
 * by *init (dim, nbits, seed, kmeans_iters, sample_docs; the rest is computed) in one transaction.
 * map_size: the initial map size in bytes (0: STORE_DEFAULT_MAP). Errors: ENOENT (no directory,
 * no STORE_CREATE), TARTAN_ENOINDEX (a directory without a tartan index, or an LMDB environment
 * of something else), TARTAN_EEXIST, TARTAN_EVERSION (another format version; version 1 names
 * the conversion), TARTAN_ECORRUPT (meta unreadable), EACCES, ENOMEM, TARTAN_ESTORAGE.
 */
#define STORE_DEFAULT_MAP ((size_t)256 << 20)
int store_open(const char *path, unsigned flags, const store_header *init, size_t map_size,
               store_env **env, store_msg *m);
void store_close(store_env *env);

int store_is_readonly(const store_env *env);
const char *store_path(const store_env *env);
/* The format version of the environment the env uses now (2, or 1 under STORE_OPEN_V1). */
unsigned store_version(store_env *env);

/*
 * One change: fn(txn, ctx, m) runs inside a fresh write transaction; returning 0 commits it,
 * anything else aborts it and is returned. When the map is full (at any put or at commit), the
 * transaction is aborted, the map grows, and fn runs again from the start: fn must derive
 * everything it writes from ctx and the transaction, never from what an earlier run changed.
 * TARTAN_EREADONLY on a read-only env; TARTAN_EVERSION on a version 1 index.
 */
typedef int (*store_write_fn)(store_txn *txn, void *ctx, store_msg *m);
int store_write(store_env *env, store_write_fn fn, void *ctx, store_msg *m);

/* A read snapshot (MDB_RDONLY transaction). End it with store_read_end (NULL ok). */
int store_read_begin(store_env *env, store_txn **txn, store_msg *m);
void store_read_end(store_env *env, store_txn *txn);

/*
 * Replaces the environment by a new one, atomically for every reader and writer of any
 * process (storage/rewrite.c, FORMAT.md "Compaction"):
 *   1. a write transaction on the current environment holds off every other writer;
 *   2. a fresh version-2 environment is created beside the index directory
 *      (PATH.compact-XXXXXX) and fn(src, dst, ctx, m) fills it in one write transaction: src is
 *      the old environment's transaction (read it only), dst the new one's (the format record
 *      is there already); fn runs again from the start when dst's map fills;
 *   3. the new environment is committed and synced, then the two directories are exchanged
 *      (renameat2 RENAME_EXCHANGE), and the old one is removed.
 * A crash before the exchange leaves the index as it was (and a PATH.compact-XXXXXX directory
 * that the next store_rewrite removes); after it, the new index. fn returning nonzero aborts
 * everything and is returned. Errors also TARTAN_EREADONLY, ENOTSUP (a file system without
 * RENAME_EXCHANGE), the system's errors creating the directory.
 */
typedef int (*store_rewrite_fn)(store_txn *src, store_txn *dst, void *ctx, store_msg *m);
int store_rewrite(store_env *env, store_rewrite_fn fn, void *ctx, store_msg *m);

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

/* CRC32C (Castagnoli) of data, continued from crc (0 to start). */
uint32_t store_crc32c(uint32_t crc, const void *data, size_t n);
/* The same through the portable table loop (what machines without SSE4.2 run; for tests). */
uint32_t store_crc32c_portable(uint32_t crc, const void *data, size_t n);

/* IEEE half <-> single, round to nearest even (the centroid table's fp16 form). */
uint16_t store_f32_to_f16(float f);
float store_f16_to_f32(uint16_t h);

/* ---- meta ---------------------------------------------------------------------------- */

/*
 * A checksummed meta record (FORMAT.md "meta"): the value is a CRC-32C over the name and the
 * data, then the data. Every meta record but "format" is one of these; new records (search
 * calibration, codec extensions) need nothing more than a name. name: 1..STORE_MAX_META_NAME
 * ASCII bytes, NUL-terminated. store_meta_get points *data into the map (valid for the
 * transaction's life, no particular alignment: copy before reading as numbers) after checking
 * the checksum: TARTAN_ENOTFOUND without a message when there is no such record,
 * TARTAN_ECORRUPT when its checksum fails.
 */
#define STORE_META_CALIBRATION "calibration" /* the adaptive search's (engine/calibrate.c) */
int store_meta_put(store_txn *txn, const char *name, const void *data, size_t len, store_msg *m);
/* The format version the transaction's format record names (2 or 3; a record with one damaged
 * byte reads as its version). */
int store_format_version(store_txn *txn, unsigned *version, store_msg *m);
/* Rewrites the format record to version v where it names an older one (2 -> 3), in t. */
int store_format_raise(store_txn *t, unsigned v, store_msg *m);
int store_meta_get(store_txn *txn, const char *name, const void **data, size_t *len,
                   store_msg *m);
/* The whole stored value of a meta record (its checksum, then its data), NOT checked: for a
 * caller that compares it byte for byte with a value store_meta_get checked before (a copy of
 * a large record parsed once), so that an unchanged record is not checksummed again. Errors as
 * store_meta_get's, but for the checksum. */
int store_meta_raw(store_txn *txn, const char *name, const void **value, size_t *len, store_msg *m);
/* Deletes a meta record: 0, or TARTAN_ENOTFOUND (no message). */
int store_meta_del(store_txn *txn, const char *name, store_msg *m);

/* Reads / writes the header (meta "header"). TARTAN_ECORRUPT if absent, the wrong size, its
 * checksum fails, or its fields contradict each other. */
int store_header_get(store_txn *txn, store_header *h, store_msg *m);
int store_header_put(store_txn *txn, const store_header *h, store_msg *m);
/* Parses and checks a header's 64 bytes (FORMAT.md), as store_header_get does. */
int store_header_decode(const void *b, size_t len, store_header *h, store_msg *m);

/*
 * Codec tables (meta "codec"): cutoffs [2^nbits - 1] then weights [2^nbits], fp32.
 * store_codec_get: TARTAN_ENOTTRAINED if the index has none yet.
 */
int store_codec_get(store_txn *txn, unsigned nbits, float *cutoffs, float *weights, store_msg *m);
int store_codec_put(store_txn *txn, unsigned nbits, const float *cutoffs, const float *weights,
                    store_msg *m);

/*
 * Centroids [k, dim] as one record (FORMAT.md "centroids"), stored as fp16 (STORE_CENT_F16,
 * what training writes) or fp32 (STORE_CENT_F32, indexes converted from version 1).
 * store_centroids_get gives them as fp32: a pointer into the map for an aligned fp32 table, else
 * a copy converted once per environment and kept with it (centroids never change after
 * training); the checksum is verified the first time. Valid for the transaction's life.
 * TARTAN_ENOTTRAINED if there are none, TARTAN_ECORRUPT if the record does not hold k x dim or
 * its checksum fails. store_centroids_put converts c to the stored type (fp16 rounds to
 * nearest even: pass centroids that are fp16 values already to store exactly what encoding
 * used).
 */
enum { STORE_CENT_F32 = 1, STORE_CENT_F16 = 2 };
int store_centroids_get(store_txn *txn, uint32_t k, uint32_t dim, const float **c, store_msg *m);
int store_centroids_put(store_txn *txn, uint32_t k, uint32_t dim, const float *c, int dtype,
                        store_msg *m);

/* ---- documents ------------------------------------------------------------------------ */

/*
 * A document record (FORMAT.md "docs"): a view of its parts. Pointers point into the map,
 * 4-byte aligned, valid for the transaction's life (in a write transaction: until the next
 * change to the documents).
 */
typedef struct store_doc {
    uint32_t ntok;
    const float *inv_norms;   /* [ntok] */
    const void *codes;        /* [ntok] uint16 (code_bytes 2) or uint32 (4) */
    const uint8_t *residuals; /* [ntok, token_bytes] */
} store_doc;

/* Bytes of the record of a document of ntok tokens (a multiple of 4). */
size_t store_doc_size(uint32_t ntok, unsigned code_bytes, unsigned token_bytes);

/*
 * Parses and checks a record already in hand (rec: its first byte, size: its bytes): the
 * docno it holds must be docno, the size must match its token count, the record 4-byte
 * aligned. verify: also check its CRC-32C. TARTAN_ECORRUPT otherwise, with the reason.
 */
int store_doc_parse(uint32_t docno, const void *rec, size_t size, unsigned code_bytes,
                    unsigned token_bytes, int verify, store_doc *doc, store_msg *m);

/*
 * Reads document docno: finds its segment and its record. verify: check the record's CRC-32C
 * and the segment directory's (once per segment and read snapshot). TARTAN_ENOTFOUND if there
 * is no such (live) document; TARTAN_ECORRUPT for a damaged segment or record.
 */
int store_doc_get(store_txn *txn, uint32_t docno, unsigned code_bytes, unsigned token_bytes,
                  int verify, store_doc *doc, store_msg *m);

/*
 * Starts fetching document docno's record head and codes into the cache, for a store_doc_get
 * of it soon after (a search reading a thousand candidates waits on memory, not on work).
 * Never fails: a document it cannot find is left to store_doc_get. Read snapshots only.
 */
void store_doc_prefetch(store_txn *txn, uint32_t docno, unsigned code_bytes, unsigned token_bytes);

/*
 * Appending documents: numbers above every number in the index, ascending. The appender
 * reopens the last segment when it still has room and fills segments up to FORMAT.md's sizes;
 * the caller gives each document's parts and the appender copies them and seals the record.
 * codes: [ntok] of codes_width bytes each (2 or 4), stored as code_bytes. store_docs_append_end
 * writes what is pending and frees the appender (also on failure); a change that fails before
 * it calls store_docs_append_free. Errors: TARTAN_ECORRUPT (a number not above the last),
 * TARTAN_ETOOBIG, ENOMEM, storage errors.
 */
typedef struct store_appender store_appender;
int store_docs_append_begin(store_txn *txn, unsigned code_bytes, unsigned token_bytes,
                            store_appender **a, store_msg *m);
int store_docs_append(store_appender *a, uint32_t docno, uint32_t ntok, const float *inv_norms,
                      const void *codes, unsigned codes_width, const uint8_t *residuals,
                      store_msg *m);
/* Appends a sealed record as it is (compaction): rec/size as store_docs_next gives them. */
int store_docs_append_record(store_appender *a, uint32_t docno, const void *rec, size_t size,
                             store_msg *m);
int store_docs_append_end(store_appender *a, store_msg *m);
void store_docs_append_free(store_appender *a);

/*
 * Deletes the n documents docnos (ascending, distinct) by rewriting their segments without
 * them (a segment left empty is removed). TARTAN_ENOTFOUND (with a message) if one is not
 * there; nothing is changed then.
 */
int store_docs_delete(store_txn *txn, const uint32_t *docnos, size_t n, store_msg *m);

/*
 * A cursor over all documents in number order. verify: check each segment directory's CRC.
 * store_docs_next: 1 (docno, rec, size set: parse with store_doc_parse), 0 at the end, or an
 * error. TARTAN_ECORRUPT for a damaged segment directory: the cursor has moved past that
 * segment then, and the next call goes on with the next one (*docno is the segment's key,
 * the lowest number it can hold).
 */
typedef struct store_cursor store_cursor;
int store_docs_first(store_txn *txn, int verify, store_cursor **c, store_msg *m);
int store_docs_next(store_cursor *c, uint32_t *docno, const void **rec, size_t *size,
                    store_msg *m);
void store_cursor_close(store_cursor *c);

/* ---- inverted lists ------------------------------------------------------------------- */

/*
 * Appends the n documents docs (ascending, each above every document in the list) to centroid
 * c's list: the last block is filled, then new ones (FORMAT.md "ivf"). Each call rewrites at
 * most the last block and writes whole new ones, so a batch should call once per centroid.
 */
int store_ivf_append(store_txn *txn, uint32_t centroid, const uint32_t *docs, size_t n,
                     store_msg *m);
/* Removes the n documents docs (ascending, distinct) from c's list; TARTAN_ECORRUPT if one is
 * not listed. */
int store_ivf_remove(store_txn *txn, uint32_t centroid, const uint32_t *docs, size_t n,
                     store_msg *m);

/*
 * Iterates centroid c's inverted list in ascending document number, a block at a time: each
 * call to store_ivf_next decodes the next block (checking its CRC-32C) into the iterator's own
 * buffer and yields a pointer to its native uint32 document numbers, valid until the next call.
 * Returns 1 with *docs and *n set, 0 at the end (an empty list yields 0 at once), or
 * TARTAN_ECORRUPT for a damaged block; the iterator then goes on with the next block.
 */
typedef struct store_ivf_iter store_ivf_iter;
int store_ivf_open(store_txn *txn, uint32_t centroid, store_ivf_iter **it, store_msg *m);
int store_ivf_next(store_ivf_iter *it, const uint32_t **docs, size_t *n, store_msg *m);
void store_ivf_close(store_ivf_iter *it);
/* Length of centroid c's list (from the blocks' counts, without decoding them). */
int store_ivf_count(store_txn *txn, uint32_t centroid, size_t *n, store_msg *m);

/* Most document numbers in one inverted-list block (FORMAT.md "ivf"). */
#define STORE_IVF_BLOCK 256u

/* ---- external ids -------------------------------------------------------------------- */

/* id -> docno: 0 found, TARTAN_ENOTFOUND (no message), TARTAN_ECORRUPT (checksum). */
int store_id_get(store_txn *txn, const char *id, size_t len, uint32_t *docno, store_msg *m);
/* docno -> id (pointer into the map, not NUL-terminated): 0, TARTAN_ENOTFOUND,
 * TARTAN_ECORRUPT. */
int store_name_get(store_txn *txn, uint32_t docno, const char **id, size_t *len, store_msg *m);
/* Binds id <-> docno in both databases (id must be unbound; docno above every number bound so
 * far, as numbers are handed out: "names" is appended to, which fills its pages). */
int store_id_put(store_txn *txn, const char *id, size_t len, uint32_t docno, store_msg *m);
/* Unbinds id and docno in both databases. */
int store_id_del(store_txn *txn, const char *id, size_t len, uint32_t docno, store_msg *m);

/* ---- rewriting ----------------------------------------------------------------------- */

/* What a compaction copied. */
typedef struct store_compact_stats {
    uint64_t docs, tokens, postings;
    unsigned from_version; /* 1: the index was converted from format version 1 */
} store_compact_stats;

/*
 * Rewrites the index without free pages, documents in full segments and lists in full blocks
 * (store_rewrite), converting a version-1 index (opened with STORE_OPEN_V1) to this version.
 * Every record is verified: TARTAN_ECORRUPT (naming the damage) leaves the index as it was.
 * Other errors: store_rewrite's.
 */
int store_compact(store_env *env, store_compact_stats *st, store_msg *m);

/* ---- space --------------------------------------------------------------------------- */

/* Bytes in use per named database (pages times page size) and in the file. */
typedef struct store_usage {
    uint64_t meta, centroids, docs, ivf, ids, names;
    uint64_t file; /* data.mdb's size */
    uint64_t free; /* pages in the file that hold nothing live (free list, unused tail) */
    uint64_t page_size;
} store_usage;
int store_usage_get(store_env *env, store_txn *txn, store_usage *u, store_msg *m);

/*
 * Test and repair support: visits every key/value of every named database in order (meta,
 * centroids, docs, ivf, ids, names) as stored. fn returns 0 to go on.
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
