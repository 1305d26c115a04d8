/*
 * store_internal.h: what the storage layer's own files share (not for the layers above).
 */
#ifndef TARTAN_STORAGE_STORE_INTERNAL_H
#define TARTAN_STORAGE_STORE_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>
#include <sys/types.h>

#include "store.h"

/*
 * One LMDB environment that a store_env has opened: the directory's current one, or one a
 * store_rewrite has replaced while transactions still used it. Transactions hold a reference;
 * the last one to let go of a replaced generation closes it.
 */
typedef struct store_gen {
    MDB_env *g_env;
    MDB_dbi g_meta, g_centroids, g_docs, g_ivf, g_ids, g_names;
    unsigned g_version; /* format version: 2, or 1 (STORE_OPEN_V1) */
    dev_t g_dev;        /* data.mdb's identity: a different file at the path means replaced */
    ino_t g_ino;
    unsigned g_psize;
    /* Where the map starts (found from a page's own number; NULL when unknown) and its size:
     * what store_get / store_cget check values against. Found again when the map moves. */
    const uint8_t *g_base;
    size_t g_mapsize;
    unsigned g_refs; /* guarded by the env's se_lock; the env itself holds one while current */
    /*
     * Every transaction of this process on this environment holds this lock for reading while
     * it lives; growing the map takes it for writing, because mdb_env_set_mapsize may only run
     * while no transaction of the process is active (LMDB does not check this itself).
     */
    pthread_rwlock_t g_grow;
    /* The centroids as fp32, converted once (store_centroids_get). */
    pthread_mutex_t g_cent_lock;
    float *g_cent; /* owned copy, or NULL */
    size_t g_cent_size; /* the record it was made from: its size and checksum field */
    uint32_t g_cent_crc;
    unsigned g_cent_key; /* the record it was made from: 0, or STORE_CENT_COPY_KEY */
    /* LMDB's meta pages disagree (store_pages_meta, at open): every snapshot and change is
     * refused with g_meta_why; only a salvage (store_salvage) reads the index then. */
    int g_meta_bad;
    char g_meta_why[300];
} store_gen;

struct store_env {
    char *se_path;
    char *se_data; /* se_path/data.mdb */
    unsigned se_flags; /* STORE_READONLY, STORE_OPEN_V1 */
    size_t se_map_req;
    pthread_mutex_t se_lock;   /* guards se_gen and every generation's g_refs */
    pthread_mutex_t se_switch; /* one move to a new generation at a time */
    store_gen *se_gen;
};

/* The last segment a read snapshot looked in (store_doc_get's shortcut for ascending reads). */
typedef struct store_seg_cache {
    uint32_t lo, last; /* its key and its last document number */
    const uint8_t *val;
    size_t size;
    int dir_ok; /* directory checksum verified */
} store_seg_cache;

struct store_txn {
    MDB_txn *st_txn;
    store_env *st_env;
    store_gen *st_gen;
    int st_write;
    uint64_t st_fsize;   /* data.mdb's size when the transaction began (0: unknown) */
    MDB_cursor *st_docs; /* lazily opened, for document lookups */
    store_seg_cache st_seg;
    store_seg_cache st_seg_pf; /* store_doc_prefetch's own, read snapshots only */
    /* Which meta page pages.c reads the snapshot from: 0, the one holding the transaction's id;
     * 1 or 2, page 0 or 1 (a salvage reading the newest snapshot when LMDB would not). */
    int st_meta_use;
    /* A write function of this layer ran in this (write) transaction: store_write then advances
     * the commit record; a change that wrote nothing commits nothing, as before. */
    int st_dirty;
};

/* Whether rc is one of LMDB's own codes (MDB_KEYEXIST .. MDB_LAST_ERRCODE), which a loop over
 * a cursor may hold beside this layer's mapped codes. */
static inline int store_lmdb_code(int rc)
{
    return rc <= MDB_KEYEXIST && rc >= MDB_LAST_ERRCODE;
}

/*
 * bounds.c: mdb_get and mdb_cursor_get that also check where the key and value they found lie: within
 * the data file, and a value or key in a leaf page within that page. LMDB trusts the sizes in
 * its node headers, so a damaged one would hand out a value running past the end of the file
 * (a read there is SIGBUS); these give MDB_CORRUPTED instead. Values of a write transaction's
 * own changes (outside the map) are not checked.
 */
int store_get(store_txn *t, MDB_dbi dbi, MDB_val *k, MDB_val *d);
int store_cget(store_txn *t, MDB_cursor *c, MDB_val *k, MDB_val *d, MDB_cursor_op op);
/* Finds where g's map starts (after opening it and whenever the map moves). */
void store_gen_find_map(store_gen *g);

/* Meta keys (FORMAT.md "meta"). */
#define STORE_KEY_FORMAT "format"
#define STORE_KEY_HEADER "header"
#define STORE_KEY_CODEC "codec"
/* The second copy of the codec tables (FORMAT.md "meta/codec"): readers fall back to it. */
#define STORE_KEY_CODEC_COPY "codec.copy"
/* The commit sequence number (FORMAT.md "meta/commit"), written by every change. */
#define STORE_KEY_COMMIT "commit"

/*
 * Writes meta "commit" in a write transaction: one above the number the transaction reads
 * (1 when it reads none or a damaged one). Every commit of this version calls it last.
 */
int store_commit_mark(store_txn *t, store_msg *m);

/* The first 8 bytes of meta "format": tells a tartan index from other LMDB environments. */
#define STORE_MAGIC "tartanix"
/* meta "format" of version 2: magic, version, CRC-32C (FORMAT.md). */
#define STORE_FORMAT_SIZE 16

/* The header record's payload (FORMAT.md "meta/header"). */
#define STORE_HEADER_SIZE 64

/* Opens the environment at path as a generation (no store_env): flags as store_open's;
 * create: may create an index from init. */
int store_gen_open(const char *path, unsigned flags, const store_header *init, size_t map_size,
                   store_gen **out, store_msg *m);
void store_gen_close(store_gen *g);

/* Writes the 16-byte format record of version (2 or 3; a fresh index, a rewrite). */
int store_format_put(MDB_txn *txn, MDB_dbi meta, unsigned version, store_msg *m);
/* Checks a format record's bytes: 0 and *version (1, 2, 3 or another), TARTAN_ENOINDEX for
 * something else. A version-2 or 3 record with one damaged byte still reads as its version
 * (*damaged set), so that the index can be opened, checked and repaired. */
int store_format_parse(const void *val, size_t size, unsigned *version, int *damaged);

/* The checksum of a meta record's name and data (FORMAT.md "meta"). */
uint32_t store_meta_crc(const void *name, size_t nlen, const void *data, size_t len);

/* ---- segments (segment.c; FORMAT.md "docs") ---------------------------------------------- */

/* A parsed segment value: n entries of (docno, offset). */
typedef struct store_seg {
    uint32_t key;
    const uint8_t *val;
    size_t size;
    uint32_t n;
} store_seg;

/* Bytes before the directory, and per directory entry. */
#define STORE_SEG_HEAD 8
#define STORE_SEG_ENTRY 8
/* Bytes before a record's inverse norms: docno, ntok, CRC-32C. */
#define STORE_DOC_HEAD 12

/*
 * Checks a segment value's structure (entry count against the size, directory entries in
 * ascending number at or above the key, offsets 4-aligned and consecutive, the last record
 * ending at the value's end) and, with verify, the directory's CRC-32C. code_bytes and
 * token_bytes size the records (from their token counts). TARTAN_ECORRUPT with the reason.
 */
int store_seg_parse(uint32_t key, const void *val, size_t size, unsigned code_bytes,
                    unsigned token_bytes, int verify, store_seg *s, store_msg *m);
/* Entry i of a parsed segment. */
void store_seg_entry(const store_seg *s, uint32_t i, uint32_t *docno, const uint8_t **rec,
                     size_t *size);
/* The CRC-32C a segment's header field must hold. */
uint32_t store_seg_crc(uint32_t key, const void *val, uint32_t n);
/* The CRC-32C a record's field must hold. */
uint32_t store_doc_crc(const uint8_t *rec, size_t size);

/* ---- inverted-list blocks (ivf.c; FORMAT.md "ivf") --------------------------------------- */

#define STORE_IVF_HEAD 8
/* Key of a block: centroid in the high half, the block's lower bound in the low half. */
static inline uint64_t store_ivf_key(uint32_t c, uint32_t lo)
{
    return (uint64_t)c << 32 | lo;
}
/*
 * Decodes a block (key: its 8-byte key) into out[STORE_IVF_BLOCK]: *n numbers, strictly
 * ascending, at or above the key's lower bound. verify: check the CRC-32C first.
 * TARTAN_ECORRUPT with the reason.
 */
int store_ivf_decode(uint64_t key, const void *val, size_t size, int verify, uint32_t *out,
                     size_t *n, store_msg *m);
/* Writes n numbers (ascending, n <= STORE_IVF_BLOCK) as the block under key (lower bound at
 * most docs[0]); MDB_APPEND when append. */
int store_ivf_put_block(MDB_txn *txn, MDB_dbi dbi, uint64_t key, const uint32_t *docs, size_t n,
                        int append, store_msg *m);

/* ---- id maps (idmap.c; FORMAT.md "ids and names") ---------------------------------------- */

/* Checks an "ids" value (docno, CRC over the id and docno): 0 and *docno, or TARTAN_ECORRUPT. */
int store_ids_decode(const void *key, size_t klen, const void *val, size_t vlen, uint32_t *docno,
                     store_msg *m);
/* Checks a "names" value (CRC, then the id): 0 and *id, *len, or TARTAN_ECORRUPT. */
int store_names_decode(uint32_t docno, const void *val, size_t vlen, const char **id, size_t *len,
                       store_msg *m);
/* Writes one side of a binding as stored (flags: mdb_put's, e.g. MDB_APPEND). */
int store_ids_put_raw(MDB_txn *txn, MDB_dbi ids, const void *id, size_t len, uint32_t docno,
                      unsigned flags, store_msg *m);
int store_names_put_raw(MDB_txn *txn, MDB_dbi names, uint32_t docno, const void *id, size_t len,
                        unsigned flags, store_msg *m);
/* Whether id bytes follow FORMAT.md's rules (length, no control byte). */
int store_id_valid(const void *id, size_t len);

/* ---- centroids (centroids.c; FORMAT.md "centroids") -------------------------------------- */

#define STORE_CENT_HEAD 16
/* Key of the centroid table's second copy (key 0 holds the table): byte for byte the same
 * record (its checksum does not cover the key). Readers fall back to it. */
#define STORE_CENT_COPY_KEY 1u
/* Writes the copy of a centroid record (its bytes as under key 0). */
int store_centroids_put_copy(store_txn *t, const void *val, size_t size, store_msg *m);
/* Checks a centroid record: sizes against k x dim, dtype, and (verify) its CRC-32C.
 * *data: the table (fp32 or fp16 by *dtype). */
int store_centroids_check(const void *val, size_t size, uint32_t k, uint32_t dim, int verify,
                          int *dtype, const void **data, store_msg *m);

/* ---- LMDB's pages, read without LMDB (pages.c) ------------------------------------------- */

/*
 * Calls fn(ctx, key, klen, val, vlen) for every leaf entry of named database db (one of
 * tartan's six) in txn's snapshot, reading LMDB's pages directly: pages that break LMDB's
 * layout are skipped with what lies under them (*damage counts them), so a damaged page never
 * takes the walk outside the file. Values of overflow pages are given whole. fn returns
 * nonzero to stop. ENOTSUP when the map's address is unknown, ENOMEM.
 */
typedef int (*store_pages_leaf_fn)(void *ctx, const void *key, size_t klen, const void *val,
                                   size_t vlen);
/* Whether the main database's tree (which names the others) is sound in txn's snapshot, read
 * without LMDB: 0, TARTAN_ECORRUPT, ENOMEM (0 too when the map's address is unknown). LMDB
 * walks it to open the named databases and would stop the process on a damaged page. */
int store_pages_main_sound(store_txn *t);
int store_pages_leaves(store_txn *t, const char *db, store_pages_leaf_fn fn, void *ctx,
                       size_t *damage, store_msg *m);

/*
 * LMDB's two meta pages, read from the file (pages.c, FORMAT.md "LMDB's meta pages"): their
 * transaction ids, the commit record each one's snapshot holds, which page LMDB takes and which
 * one holds the newest snapshot. fd: data.mdb (read with pread); call while holding a
 * transaction on the environment. 0, ENOMEM or EIO.
 */
typedef struct store_meta_pages {
    uint64_t txnid[2];
    uint64_t last_pg[2];
    int rec[2]; /* 1: its snapshot's commit record, seq; 0: no record there (an older build's
                   snapshot, or none); -1: the snapshot's meta database cannot be read */
    uint64_t seq[2];
    uint64_t rec_txnid[2]; /* the LMDB transaction id the commit record says it was written in */
    int pick;   /* the page LMDB takes: the larger id (page 0 on a tie) */
    int newest; /* the page naming the newest snapshot, or -1 when that cannot be told */
    int bad;    /* the pages disagree: LMDB may read an older snapshot; why says how */
    char why[240];
} store_meta_pages;
int store_pages_meta(int fd, size_t psize, store_meta_pages *s);

/* store_rewrite for a salvage: also runs on an environment whose meta pages disagree, reading
 * the newest snapshot (TARTAN_ECORRUPT when which one that is cannot be told). */
int store_rewrite_salvage(store_env *env, store_rewrite_fn fn, void *ctx, store_msg *m);

/* ---- version 1 (v1.c): only what converting a version-1 index reads --------------------- */

/* v1's header (64 bytes, no checksum), codec (raw fp32) and centroids (raw fp32 [k, dim]). */
int store_v1_header_get(store_txn *txn, store_header *h, store_msg *m);
int store_v1_codec_get(store_txn *txn, unsigned nbits, const void **tables, size_t *size,
                       store_msg *m);
int store_v1_centroids_get(store_txn *txn, uint32_t k, uint32_t dim, const float **c,
                           store_msg *m);
/* v1's document blob: [ntok][crc][norms][codes][residuals][pad], CRC over docno and the blob
 * from byte 8 on (verified). */
int store_v1_doc_parse(uint32_t docno, const void *blob, size_t size, unsigned code_bytes,
                       unsigned token_bytes, store_doc *doc, store_msg *m);

#endif
