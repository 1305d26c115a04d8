/*
 * tartan.h: the public interface of libtartan, an embedded retrieval engine for
 * late-interaction (multi-vector) embeddings such as ColBERT and ColPali.
 *
 * This header is the manual. Anything not declared here is not API. It includes only
 * <stddef.h> and <stdint.h>; no type of LMDB, FAISS or CUDA reaches an application.
 *
 * Conventions
 * -----------
 * - Every function that can fail returns int: 0 (TARTAN_OK) for success, a negative
 *   TARTAN_E... code for the engine's own errors, or a positive errno value for the
 *   system's (ENOMEM, EACCES, ENOSPC, ...). tartan_strerror() names any of them.
 * - A handle keeps the detailed message of its last failure (tartan_errmsg()).
 * - Inputs are const pointers owned by the caller; the library never keeps them after a call
 *   returns. Sizes are size_t. The handle comes first, outputs last.
 * - The library never prints, never calls exit() or abort() on bad input.
 */
#ifndef TARTAN_H
#define TARTAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define TARTAN_API
#else
#define TARTAN_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------- */

#define TARTAN_VERSION_MAJOR 0
#define TARTAN_VERSION_MINOR 1
#define TARTAN_VERSION_PATCH 0
#define TARTAN_VERSION_STRING "0.1.0"
/* One number that compares in version order: 10000 * major + 100 * minor + patch. */
#define TARTAN_VERSION_NUMBER                                                                  \
    (TARTAN_VERSION_MAJOR * 10000 + TARTAN_VERSION_MINOR * 100 + TARTAN_VERSION_PATCH)

/*
 * tartan_version: the version of the library linked at run time.
 *   major, minor, patch: out, each may be NULL.
 * Returns the version as a string ("0.1.0"), static, never NULL. Any thread may call it.
 */
TARTAN_API const char *tartan_version(int *major, int *minor, int *patch);

/* ---------------------------------------------------------------------------------------
 * Errors
 *
 * The engine's codes, defined once here: XX(NAME, value, description). Values sit in a
 * reserved negative band (-30999 .. -30900) so that they never meet an errno value (positive)
 * nor TARTAN_OK (0).
 * ------------------------------------------------------------------------------------- */

#define TARTAN_ERRNO_MAP(XX)                                                                       \
    XX(EINVAL, -30900, "invalid argument")                                                         \
    XX(EDIM, -30901, "dimension mismatch")                                                         \
    XX(ENONFINITE, -30902, "NaN or infinity in input")                                             \
    XX(EEMPTY, -30903, "empty document, query or input")                                           \
    XX(ETOOBIG, -30904, "input or value too large")                                                \
    XX(EDUPID, -30905, "duplicate external id")                                                    \
    XX(EBADID, -30906, "empty or malformed external id")                                           \
    XX(ENOTFOUND, -30907, "no such document or id")                                                \
    XX(ERANGE, -30908, "parameter out of range")                                                   \
    XX(EEXIST, -30909, "index already exists")                                                     \
    XX(ENOINDEX, -30910, "not a tartan index")                                                     \
    XX(EVERSION, -30911, "unsupported index format version")                                       \
    XX(ECORRUPT, -30912, "index data is damaged")                                                  \
    XX(EREADONLY, -30913, "index is open read-only")                                               \
    XX(ENOTTRAINED, -30914, "index has no centroids yet")                                          \
    XX(EFORMAT, -30915, "malformed file")                                                          \
    XX(ETRUNC, -30916, "truncated file")                                                           \
    XX(EDTYPE, -30917, "unsupported data type")                                                    \
    XX(ESTORAGE, -30918, "storage engine error")                                                   \
    XX(ETRAIN, -30919, "centroid training failed")                                                 \
    XX(ENODEV, -30920, "no usable GPU")                                                            \
    XX(EDEVICE, -30921, "GPU error")                                                               \
    XX(ENOTSUP, -30922, "not supported by this build")                                             \
    XX(EINTERNAL, -30923, "internal error")                                                        \
    XX(EGROUP, -30924, "another member of a shared training failed")

/* TARTAN_OK and one TARTAN_E<NAME> per entry of the list above. */
enum tartan_errno {
    TARTAN_OK = 0,
#define TARTAN_XX_ENUM(name, value, text) TARTAN_##name = (value),
    TARTAN_ERRNO_MAP(TARTAN_XX_ENUM)
#undef TARTAN_XX_ENUM
};

/*
 * tartan_strerror: a description of any code a tartan function returns.
 *   code: in; TARTAN_OK, a TARTAN_E... code, or a positive errno value.
 * Returns a string that starts with the code's name ("TARTAN_EDIM: dimension mismatch",
 * "ENOMEM: Cannot allocate memory"); an unknown code gets "unknown error N". Never NULL.
 * Engine codes get static strings; the text for an errno value lives in a per-thread buffer,
 * valid until the same thread calls again. Any thread may call it.
 */
TARTAN_API const char *tartan_strerror(int code);

/*
 * tartan_err_name: the name of a code ("TARTAN_EDIM", "ENOENT"), or NULL if unknown.
 * Static string. Any thread may call it.
 */
TARTAN_API const char *tartan_err_name(int code);

/* ---------------------------------------------------------------------------------------
 * Indexes
 *
 * An index is a directory holding one LMDB environment: a PLAID index of late-interaction
 * embeddings (centroids, one centroid code and one quantised residual per token, inverted
 * lists), plus the map between your external ids (strings) and the engine's own document
 * numbers, which never leak through this API. storage/FORMAT.md describes the files.
 *
 * Lifecycle of a handle:
 *   1. tartan_options_init(&o), set what differs (o.flags, o.dim, ...);
 *   2. tartan_open(path, &o, &db): opens, or creates with TARTAN_CREATE;
 *   3. tartan_train(db, sample, ...) once, optionally: trains centroids and codec from a sample
 *      of the corpus (otherwise the first tartan_add trains from its own batch);
 *   4. tartan_add / tartan_delete / tartan_info, any number of times, in any order;
 *   5. tartan_close(db).
 *
 * Every tartan_add, tartan_delete and tartan_train is one transaction: it lands whole or not
 * at all, whatever happens to the process, and a call that fails leaves the index exactly as
 * it was. Tokens are L2-normalised before they are encoded (MaxSim scores are cosines).
 *
 * Threads: a handle may be shared by threads. Changes on one index are serialised (by the
 * handle and across processes by LMDB); readers are never blocked by a writer. Several
 * processes may open one index at once, each with its own handle. Never open the same index
 * twice in one process (LMDB's rule: its locks are per process); share the handle instead.
 * ------------------------------------------------------------------------------------- */

/* An open index. */
typedef struct tartan_db tartan_db;

/* tartan_options.flags */
/* Create the index (and its directory) if there is none. */
#define TARTAN_CREATE 0x1u
/* With TARTAN_CREATE: fail with TARTAN_EEXIST if an index exists. */
#define TARTAN_EXCL 0x2u
/* Open read-only: changes fail with TARTAN_EREADONLY; creates nothing (TARTAN_CREATE is
 * ignored). */
#define TARTAN_READONLY 0x4u
/* Convert an index of an older format version (1) to this one while opening it: a
 * tartan_compact that keeps every document, id, code, residual and norm, so every search
 * answers exactly as before. Needs write access; without this flag such an index is refused
 * with TARTAN_EVERSION. Programs of the older version must not have the index open meanwhile
 * (their changes would be lost; their next write fails). */
#define TARTAN_UPGRADE 0x8u

/*
 * Where work runs. TARTAN_DEVICE_AUTO: the environment variable TARTAN_DEVICE ("auto", "cpu"
 * or "cuda") when set, else a CUDA GPU when the build has CUDA and one is present, else the
 * CPU. TARTAN_DEVICE_CUDA fails with TARTAN_ENODEV (build without CUDA, or no GPU) where the
 * work would start; it never falls back silently. What differs between the devices is
 * rounding: the GPU rounds the small residual term of each score to fp16 (scores agree within
 * about 1e-4 per query token), and PLAID's centroid stages, summing in another order, may send
 * a different document to exact scoring where a score sits on the threshold or the ndocs
 * boundary (about 1% of hits on random data). Both devices' default search probes each query
 * with its own length's margin and widens a query whose margin reaches fewer candidates than k
 * to its whole probe cap. Exhaustive search returns the same documents, near-ties aside.
 */
typedef enum tartan_device {
    TARTAN_DEVICE_AUTO = 0,
    TARTAN_DEVICE_CPU = 1,
    TARTAN_DEVICE_CUDA = 2
} tartan_device;

/*
 * tartan_device_resolve: where work asked for on device want would run now, by the rule
 * above: *where is TARTAN_DEVICE_CPU or TARTAN_DEVICE_CUDA. For a caller that arranges its own
 * work around the device (tartan search keeps two batches in flight on a GPU). Returns 0,
 * TARTAN_EINVAL (want not a tartan_device, TARTAN_DEVICE malformed, where NULL), TARTAN_ENODEV
 * (TARTAN_DEVICE_CUDA, or TARTAN_DEVICE=cuda, where no usable GPU is). Any thread.
 */
TARTAN_API int tartan_device_resolve(tartan_device want, tartan_device *where);

/*
 * How a GPU search holds the index. TARTAN_GPU_RESIDENT: codes, residuals, norms, centroids
 * and inverted lists are copied to GPU memory at the first GPU search and kept in step with
 * every later change (each search first applies what was committed since). TARTAN_GPU_STREAMING:
 * only centroids, codes and inverted lists live on the GPU; the residuals of the documents a
 * search scores exactly stream from the index's memory map through pinned buffers. AUTO
 * (default): the environment variable TARTAN_GPU_MODE ("auto", "resident", "streaming") when
 * set, else resident when the index fits in 80% of the GPU's free memory, else streaming.
 */
typedef enum tartan_gpu_mode {
    TARTAN_GPU_AUTO = 0,
    TARTAN_GPU_RESIDENT = 1,
    TARTAN_GPU_STREAMING = 2
} tartan_gpu_mode;

/*
 * How a search over several GPUs (tartan_options.gpu_devices) shares its work.
 * TARTAN_GPU_SPLIT_DOCUMENTS: the documents are split into one partition per GPU (by internal
 * number); each GPU holds and searches its partition for every query and the partitions' top k
 * merge exactly (exhaustive search returns what one GPU returns; PLAID keeps at least as much
 * of the exhaustive top k in practice, as each partition keeps candidates of its own). For an
 * index larger than one GPU. TARTAN_GPU_SPLIT_QUERIES: every GPU holds a whole copy of the
 * index and searches its share of each call's queries, so the results are one GPU's exactly and
 * a batch of queries runs about N times as fast on N GPUs; a call of one query runs on one GPU.
 * AUTO (default): the environment variable TARTAN_GPU_SPLIT ("auto", "documents", "queries")
 * when set, else queries when a resident copy of the index takes at most a third of a GPU's
 * memory (and stays so while it takes at most half), else documents.
 */
typedef enum tartan_gpu_split {
    TARTAN_GPU_SPLIT_AUTO = 0,
    TARTAN_GPU_SPLIT_DOCUMENTS = 1,
    TARTAN_GPU_SPLIT_QUERIES = 2
} tartan_gpu_split;

/*
 * Options of tartan_open. Always start from tartan_options_init(): fields may be added at the
 * end in later versions, and the initialiser gives each its default.
 */
typedef struct tartan_options {
    uint32_t flags;     /* TARTAN_CREATE, TARTAN_EXCL, TARTAN_READONLY; default 0 */
    size_t dim;         /* embedding dimension: required to create; when opening an existing
                           index 0 or its dimension (else TARTAN_EDIM). Default 0 */
    unsigned nbits;     /* residual bits per dimension, 1, 2, 4 or 8 (dim * nbits a multiple of
                           8); only used when creating. Default 2 */
    size_t n_centroids; /* centroids to train; 0: 2^floor(log2(16 sqrt(tokens))). Default 0 */
    int kmeans_iters;   /* k-means iterations (>= 1); default 4 */
    size_t sample_docs; /* documents a first tartan_add trains from, and what
                           tartan_sample_docs() advises; 0: min(1 + 16 sqrt(120 N), N).
                           Default 0 */
    uint64_t seed;      /* sampling and k-means seed; default 42 */
    size_t map_size;    /* initial LMDB map size in bytes; 0: 256 MiB. The map grows by
                           itself as the index grows. Default 0 */
    tartan_device device; /* where searches, k-means and encoding run (see tartan_device);
                           default TARTAN_DEVICE_AUTO */
    tartan_gpu_mode gpu_mode; /* how a GPU search holds the index (see tartan_gpu_mode);
                           default TARTAN_GPU_AUTO */
    int gpu_devices;          /* GPUs of this host a GPU search uses, sharing the work as gpu_split
                                 says. 0 (default): the environment variable TARTAN_GPU_DEVICES
                                 ("all" or a number) when set, else 1; -1: every visible GPU; N >= 1:
                                 the first N visible GPUs (fewer when fewer are visible;
                                 CUDA_VISIBLE_DEVICES picks which). The variable
                                 TARTAN_GPU_PARTITIONS=N (for tests and measurements) makes N
                                 partitions or copies, placed on the GPUs in turn, several on one GPU
                                 when N is larger. Else TARTAN_EINVAL from tartan_open (below -1) or
                                 the search (a malformed variable) */
    tartan_gpu_split gpu_split; /* how several GPUs share a search (see tartan_gpu_split);
                           default TARTAN_GPU_SPLIT_AUTO */
    unsigned codec; /* the residual code a training of this handle fits (TARTAN_CODEC_*);
                       an index keeps the code it was trained with. Default
                       TARTAN_CODEC_SCALAR */
} tartan_options;

/*
 * tartan_options.codec. SCALAR: ColBERTv2's code, nbits a dimension through one fitted table.
 * AXES: the same bytes spent in the residuals' principal axes, more bits on the axes that vary
 * most, a table each (index/axes.h); nbits 1, 2 or 4 and dim up to 1024 (else TARTAN_EINVAL
 * when training). More faithful on anisotropic embeddings; searched on the CPU and the GPU
 * alike, but the GPU has tensor-core kernels for it at dims 64, 96 and 128 only: at 256 to
 * 768, where the scalar code has them, a GPU search of an axes index runs an exact fp32
 * kernel, tens of times slower (d 384: 120x exhaustive, 47x default search). An index trained
 * with it is format version 3 (storage/FORMAT.md), which builds before it refuse.
 */
#define TARTAN_CODEC_SCALAR 0u
#define TARTAN_CODEC_AXES 1u
/* AUTO: both fitted on most of the held-out residuals, the axes code kept only where it cuts
 * the error on the rest (unseen by either fit) by 10% or more, else the scalar code; where the
 * axes code cannot code the index (nbits 8, dim above 1024) or the GPU would read it far slower
 * than the scalar code (dims 256 to 768, above), the scalar code. An index records the code
 * chosen, not AUTO. */
#define TARTAN_CODEC_AUTO 2u

/* Fills *o with the defaults above. o: out, not NULL. Any thread. */
TARTAN_API void tartan_options_init(tartan_options *o);

/*
 * tartan_open: opens the index in directory path.
 *   path: in, the index directory (created, with its parents' permission, by TARTAN_CREATE).
 *   options: in, NULL for the defaults (open an existing index read-write).
 *   db: out, the handle on success, NULL on failure.
 * Creating needs options->dim >= 1 and a valid nbits. Returns 0, or:
 *   ENOENT            no such directory (and no TARTAN_CREATE);
 *   ENOTDIR           path is not a directory;
 *   TARTAN_ENOINDEX   the directory holds no tartan index (or another program's LMDB files);
 *   TARTAN_EEXIST     TARTAN_CREATE | TARTAN_EXCL and an index exists there;
 *   TARTAN_EVERSION   the index has a format version this build cannot read;
 *   TARTAN_EDIM       options->dim differs from the index's;
 *   TARTAN_EINVAL     bad options (dim 0 when creating, nbits not 1/2/4/8, dim * nbits not a
 *                     multiple of 8, kmeans_iters < 1, unknown flags);
 *   TARTAN_ECORRUPT   the index's description is damaged;
 *   EACCES            no permission (a directory you may not write opens only with
 *                     TARTAN_READONLY; then LMDB's lock file is not used, and no one may
 *                     write the index while it is open);
 *   ENOMEM, TARTAN_ESTORAGE.
 * On failure tartan_errmsg(NULL) gives the detailed message, in the calling thread, until its
 * next failed call with no handle. The caller owns *db and frees it with tartan_close().
 */
TARTAN_API int tartan_open(const char *path, const tartan_options *options, tartan_db **db);

/* Closes db and frees it; NULL is fine. No other call on db may be running or follow. */
TARTAN_API void tartan_close(tartan_db *db);

/*
 * tartan_errmsg: the detailed message of the calling thread's last failed call on db
 * ("TARTAN_ENONFINITE: document 17 (id 'abc'): token 3 has NaN at dimension 5"), starting with
 * the code's name; "TARTAN_OK: no error" if that thread has had no failure on db. db NULL: the
 * thread's last failed tartan_open (or other call given a NULL handle). The string belongs to
 * the library and stays valid until the same thread's next failed call; never NULL.
 */
TARTAN_API const char *tartan_errmsg(const tartan_db *db);

/* Element type of embeddings. */
typedef enum tartan_dtype {
    TARTAN_FLOAT32 = 0,
    TARTAN_FLOAT16 = 1, /* IEEE half */
    TARTAN_BFLOAT16 = 2
} tartan_dtype;

/*
 * A batch of documents: n_docs documents whose tokens lie one after another in embeddings,
 * document i taking doclens[i] consecutive rows. All memory is the caller's; the library only
 * reads it during the call.
 */
typedef struct tartan_batch {
    size_t n_docs;
    const char *const *ids; /* [n_docs] external ids: NUL-terminated, 1 to 511 bytes, no
                               control characters (bytes below 0x20, 0x7f), unique. May be
                               NULL for tartan_train's sample only */
    const size_t *doclens;  /* [n_docs] tokens per document, each 1 to 1,048,576 */
    const void *embeddings; /* [n_rows, dim] row-major, of dtype */
    size_t n_rows;          /* must equal the sum of doclens */
    size_t dim;             /* must equal the index's dimension */
    tartan_dtype dtype;
} tartan_batch;

/* tartan_add flags */
#define TARTAN_REPLACE 0x1u /* an id the index has already is replaced, not refused */

/*
 * tartan_add: adds a batch of documents in one transaction. If the index has no centroids
 * yet, trains them and the codec first, from a sample of this batch's documents
 * (tartan_sample_docs()), in the same transaction.
 *   db: in, open read-write.   batch: in.   flags: 0 or TARTAN_REPLACE.
 * Every input is checked before the index is touched. Returns 0, or:
 *   TARTAN_EINVAL      NULL arguments, unknown flags, doclens not summing to n_rows;
 *   TARTAN_EEMPTY      no documents, or a document without tokens;
 *   TARTAN_EDIM        batch->dim is not the index's;
 *   TARTAN_EDTYPE      unknown dtype;
 *   TARTAN_ENONFINITE  a NaN or infinity (the message names document, id, token, dimension);
 *   TARTAN_ERANGE      a token that is all zeros (no direction to normalise);
 *   TARTAN_ETOOBIG     a document above 1,048,576 tokens; a batch too large for one
 *                      transaction (split it); document numbers exhausted (2^32 adds);
 *   TARTAN_EBADID      an empty, NULL, too long or malformed id;
 *   TARTAN_EDUPID      an id twice in the batch, or one the index has (without
 *                      TARTAN_REPLACE);
 *   TARTAN_EREADONLY   the index is open read-only;
 *   TARTAN_ETRAIN      training failed;  TARTAN_ECORRUPT, TARTAN_ESTORAGE, ENOMEM, ENOSPC, EIO.
 * A replaced document gets a new internal number; deleted ones are never reused.
 */
TARTAN_API int tartan_add(tartan_db *db, const tartan_batch *batch, unsigned flags);

/*
 * tartan_train: trains the centroids and the residual codec from a sample, in one
 * transaction, before any document is added. Use it to build from a corpus larger than
 * memory: sample tartan_sample_docs(db, N) documents over the whole corpus, train, then add
 * the corpus in batches.
 *   sample: in, the sample's documents (ids may be NULL: they are not stored).
 *   corpus_tokens: in, the whole corpus's token count (it sizes the centroid table); 0: the
 *   sample's own.
 * All of the sample's tokens are used: 5% (at most 50,000) train the codec, the rest k-means.
 * Returns 0, the batch errors of tartan_add, TARTAN_EINVAL if the index is trained already,
 * TARTAN_EEMPTY for fewer than 2 tokens, TARTAN_ETRAIN, TARTAN_EREADONLY, ENOMEM.
 */
TARTAN_API int tartan_train(tartan_db *db, const tartan_batch *sample, size_t corpus_tokens);

/*
 * tartan_sample_docs: how many documents to sample from a corpus of n_docs for tartan_train:
 * options.sample_docs if set (at most n_docs), else min(1 + 16 sqrt(120 n_docs), n_docs).
 * db NULL gives the formula. Any thread.
 */
TARTAN_API size_t tartan_sample_docs(const tartan_db *db, size_t n_docs);

/*
 * tartan_delete: deletes the documents with the given external ids, in one transaction.
 * Ids the index does not have are skipped. Nothing is renumbered.
 *   ids: in, [n] NUL-terminated ids.   n_deleted: out (may be NULL): documents deleted.
 * Returns 0, TARTAN_EINVAL (ids NULL with n > 0), TARTAN_EBADID (an empty, NULL or malformed
 * id: nothing is deleted), TARTAN_EREADONLY, TARTAN_ECORRUPT, TARTAN_ESTORAGE, ENOMEM.
 */
TARTAN_API int tartan_delete(tartan_db *db, const char *const *ids, size_t n, size_t *n_deleted);

/* What an index holds and where its bytes go (tartan_info). */
typedef struct tartan_index_info {
    uint64_t n_docs;   /* live documents */
    uint64_t n_tokens; /* their tokens */
    uint32_t dim;
    uint32_t nbits;
    uint32_t n_centroids; /* 0 until trained */
    uint32_t code_bytes;  /* bytes per token code: 2 (up to 65,536 centroids) or 4; 0 untrained */
    /* Payload inside the documents (exact): */
    uint64_t bytes_residuals; /* n_tokens * dim * nbits / 8 */
    uint64_t bytes_codes;     /* n_tokens * code_bytes */
    uint64_t bytes_norms;     /* n_tokens * 4 */
    /* Pages in use per part (LMDB pages of 4 KiB, whole): */
    uint64_t bytes_docs;  /* document blobs: the payload above, headers, page slack */
    uint64_t bytes_ivf;   /* inverted lists */
    uint64_t ivf_entries; /* (centroid, document) pairs in them */
    uint64_t bytes_ids;   /* external ids, both directions */
    uint64_t bytes_centroids;
    uint64_t bytes_meta;
    uint64_t bytes_free; /* pages of the file holding nothing live (reused later) */
    uint64_t bytes_file; /* size of the data file */
    uint64_t map_size;   /* current LMDB map size */
    uint32_t
        format;     /* the on-disk format version (storage/FORMAT.md): 2, or 3 with the axes code */
    uint32_t codec; /* the residual code the index holds: TARTAN_CODEC_SCALAR or _AXES (never
                       AUTO: the code it chose); SCALAR until trained */
    uint32_t axes_bits[4]; /* with the axes code, its counts of axes at 8, 4, 2 and 1 bits (0 0 0 0
                              where its record is damaged: tartan_check names it); else 0 */
} tartan_index_info;

/*
 * tartan_info: fills *info from one consistent snapshot.
 * Returns 0, TARTAN_EINVAL (NULL), TARTAN_ECORRUPT, TARTAN_ESTORAGE. Any thread.
 */
TARTAN_API int tartan_info(tartan_db *db, tartan_index_info *info);

/*
 * tartan_compact: rewrites the index without free pages: documents packed into full segments,
 * inverted lists into full blocks, every database's pages full (storage/FORMAT.md
 * "Compaction"). Deletes and replaces leave pages that later changes reuse but never give
 * back to the file system; this does. The whole index is written anew beside the index
 * directory (INDEX.compact-XXXXXX, so the file system needs room for a second copy) in one
 * transaction, then the two directories are exchanged atomically: a crash leaves either the
 * old index or the new one, whole, and the next compaction removes what a killed one left.
 * Every record is verified on the way; damage stops it (TARTAN_ECORRUPT, nothing changed: see
 * tartan_repair).
 *   db: in, open read-write.
 * Other handles, in this process or others, move to the new index at their next call: a
 * search that began before keeps reading the old one until it ends, later ones read the new
 * one (same documents, ids and scores), and no change is ever written to the old file. Changes
 * wait while the compaction runs (it holds the index's writer lock); searches never wait.
 * Returns 0, TARTAN_EINVAL (NULL), TARTAN_EREADONLY, TARTAN_ECORRUPT, ENOTSUP (the file system
 * cannot exchange directories: Linux renameat2 RENAME_EXCHANGE, which ext4, XFS, Btrfs and
 * tmpfs have), ENOSPC, EACCES (no permission to create the sibling directory), ENOMEM,
 * TARTAN_ESTORAGE. Any thread; one compaction, repair or change at a time per index.
 */
TARTAN_API int tartan_compact(tartan_db *db);

/* ---------------------------------------------------------------------------------------
 * Search
 *
 * A search scores queries (late-interaction query embeddings: a few tokens of the index's
 * dimension each) against the index's documents with MaxSim and returns each query's best k
 * documents by external id. The default pipeline adapts to the index and to each query
 * (engine/SEARCH.md has the design and its measured trade-offs):
 *   1. candidates: each query token probes every centroid whose score is within a margin of
 *      its best centroid's (at most a cap of them); the margin comes from the index's
 *      calibration (tartan_calibrate) for the search's k and recall_target, or from built-in
 *      defaults when the index was never calibrated; the union of the probed centroids'
 *      inverted lists is the candidate set;
 *   2. centroid interaction: every candidate's approximate score from its tokens' centroid
 *      scores;
 *   3. exact scoring in order of approximate score, in growing batches, until the next
 *      candidate's approximate score plus the approximation error measured on the documents
 *      scored so far (mean + z standard deviations, z from recall_target) cannot reach the
 *      k-th best exact score; the best k of the exactly scored documents are the results.
 * Every stage can be fixed instead (expert overrides, ColBERT's PLAID): ncells > 0 probes
 * each token's best ncells centroids; ndocs > 0 keeps ndocs documents by (pruned) centroid
 * interaction, then max(ndocs / 4, k) by unpruned interaction, and scores those exactly (when
 * stage 1 finds no more candidates than that, all are scored exactly); ColBERT's settings for
 * k <= 10 are ncells 1, centroid_score_threshold 0.5, ndocs 256. Exhaustive mode scores every
 * live document exactly (the reference recall is measured against). With a subset, the
 * candidates are only the subset's documents; a subset of at most ndocs live documents
 * (256 when ndocs is 0, the adaptive default) is scored exactly instead, all of it (as cheap
 * as the pruning stages, and exact).
 * Scores are sums over query tokens of cosines (tokens of queries and documents are
 * L2-normalised); ties go to the document added first.
 *
 * Lifecycle of a search:
 *   1. tartan_search_params_init(&p, k): the defaults for k; set what differs;
 *   2. fill a tartan_queries describing your query embeddings;
 *   3. tartan_search(db, &queries, &p, &results);
 *   4. read results->hits; tartan_results_free(results).
 *
 * Snapshots and threads: one call sees one consistent snapshot of the index (every query of
 * the batch sees the same documents), taken when the call starts; documents added or deleted
 * meanwhile by this or another process are not seen, and the search never waits for a writer.
 * Any number of threads may search one handle at once, also while another adds or deletes.
 * A batch of queries runs over OpenMP threads (params.threads).
 * ------------------------------------------------------------------------------------- */

/* Largest k a search accepts: catches a negative int converted to size_t. */
#define TARTAN_MAX_K ((size_t)1 << 24)

/*
 * Parameters of tartan_search. Always start from tartan_search_params_init(): fields may be
 * added at the end in later versions, and the initialiser gives each its default.
 */
typedef struct tartan_search_params {
    size_t k;      /* results per query, 1 .. TARTAN_MAX_K (else TARTAN_ERANGE). Fewer come
                      back when fewer documents qualify */
    size_t ncells; /* 0 (default): each query token probes the centroids within the margin
                      of its best (see above); N >= 1: exactly its best N centroids (more
                      than the index has means all) */
    float centroid_score_threshold; /* stage 2 ignores centroids whose best score over the
                      query's tokens is below this (finite; -1, the default, ignores none:
                      scores are cosines). ColBERT's PLAID used 0.5 (k <= 10), 0.45, 0.4 */
    size_t ndocs;  /* 0 (default): exact scoring stops by the rule above; N >= 1: stage 2
                      keeps N documents and stage 3 max(N / 4, k) of them for exact
                      scoring */
    int exhaustive; /* nonzero: score every live document exactly (ignores ncells,
                      threshold and ndocs); slow, the reference for recall. Default 0 */
    const char *const *subset; /* allowed external ids, or NULL (default) for all documents:
                      only documents whose ids are listed can be returned. Ids the index does
                      not have are ignored; an id may repeat. See n_subset */
    size_t n_subset; /* entries of subset (0 with subset non-NULL: nothing is allowed) */
    int threads;   /* OpenMP threads for this call, 0 (default): OpenMP's default */
    tartan_device device; /* this call's device; TARTAN_DEVICE_AUTO (default): the handle's
                      (tartan_options.device) */
    float recall_target; /* the share of the exhaustive top k the adaptive stages aim to keep,
                      0 < recall_target < 1 (else TARTAN_ERANGE); 0 means the default, 0.95.
                      Higher costs more time. It steers only the stages left adaptive
                      (ncells 0, ndocs 0); it is an aim measured on the index's calibration
                      queries, not a guarantee for every query */
    int skip_damaged; /* nonzero: a document whose stored record is damaged (its checksum
                      fails), or an inverted-list block that is, is left out of the search
                      instead of failing it with TARTAN_ECORRUPT; results.stats.n_damaged
                      counts what was left out (a warning: run tartan_repair). Candidate
                      documents are then verified before PLAID's pruning stages too (slower).
                      CPU searches only (TARTAN_ENOTSUP on a GPU). Default 0 */
} tartan_search_params;

/*
 * Fills *p with the defaults for k: adaptive probing and exact scoring (ncells 0, ndocs 0,
 * threshold -1), recall_target 0 (0.95), exhaustive 0, subset NULL, threads 0, device AUTO,
 * skip_damaged 0. p: out, not NULL. Any thread.
 */
TARTAN_API void tartan_search_params_init(tartan_search_params *p, size_t k);

/*
 * A batch of queries: n_queries queries whose tokens lie one after another in embeddings.
 * Either every query has qlen tokens (qlens NULL: the [n_queries, qlen, dim] array of
 * ColBERT's fixed-length queries) or query i has qlens[i] tokens (ragged). Every token
 * counts (there is no mask: leave padding out with qlens). All memory is the caller's; the
 * library only reads it during the call.
 */
typedef struct tartan_queries {
    size_t n_queries;       /* >= 1 */
    const size_t *qlens;    /* [n_queries] tokens per query, each 1 .. 65,536; or NULL */
    size_t qlen;            /* tokens of every query when qlens is NULL (1 .. 65,536) */
    const void *embeddings; /* [n_rows, dim] row-major, of dtype */
    size_t n_rows;          /* must equal the sum of qlens (or n_queries * qlen) */
    size_t dim;             /* must equal the index's dimension */
    tartan_dtype dtype;
} tartan_queries;

/* One result: a document's external id and its MaxSim score. */
typedef struct tartan_hit {
    const char *id; /* NUL-terminated, inside the results' allocation */
    float score;
} tartan_hit;

/* Where a search spent its time and how many documents each stage saw, summed over the
 * batch's queries (seconds are thread time, so they may add up to more than the call took). */
typedef struct tartan_search_stats {
    double seconds_candidates; /* stage 1: centroid scores, probing, inverted-list union */
    double seconds_prune;      /* stages 2 and 3: centroid interaction */
    double seconds_exact;      /* stage 4 (or exhaustive scoring): exact MaxSim, top-k */
    double seconds_total;      /* wall time of the whole call */
    uint64_t n_candidates;     /* documents stage 2 scored (or exhaustive mode scored) */
    uint64_t n_exact;          /* documents scored exactly */
    uint64_t n_probes;         /* centroids probed, summed over the queries' tokens */
    float probe_margin;        /* the margin stage 1 probed with (-1: fixed ncells) */
    float rerank_z;            /* the z of stage 3's stopping rule (0: fixed ndocs) */
    uint64_t n_damaged; /* damaged records left out (params.skip_damaged; 0 otherwise) */
} tartan_search_stats;

/*
 * A search's results, one allocation: query i's hits are hits[offsets[i]] to
 * hits[offsets[i] + counts[i] - 1], best first (counts[i] <= k; 0 when nothing qualifies).
 * Read-only for the caller; free it with tartan_results_free().
 */
typedef struct tartan_results {
    size_t n_queries;
    const size_t *counts;  /* [n_queries] */
    const size_t *offsets; /* [n_queries + 1]; offsets[n_queries] = total hits */
    const tartan_hit *hits;
    tartan_search_stats stats;
} tartan_results;

/*
 * tartan_search: the best k documents of each query.
 *   db: in, an open index (read-only or read-write).
 *   queries: in, the query batch.
 *   params: in, NULL for tartan_search_params_init(&p, 10).
 *   results: out, the results on success (the caller frees them with tartan_results_free),
 *   NULL on failure.
 * Queries are L2-normalised token by token, as documents are. Every query and parameter is
 * checked before the index is read. An index with no documents (also one never trained)
 * gives every query zero hits; so does an empty subset. Returns 0, or:
 *   TARTAN_EINVAL      NULL db, queries or results; embeddings NULL; n_rows not the sum of
 *                      the query lengths;
 *   TARTAN_EEMPTY      no queries (n_queries 0), or a query with no tokens;
 *   TARTAN_ETOOBIG     a query above 65,536 tokens;
 *   TARTAN_EDIM        queries->dim is not the index's dimension;
 *   TARTAN_EDTYPE      unknown dtype;
 *   TARTAN_ENONFINITE  a NaN or infinity (the message names query, token and dimension);
 *   TARTAN_ERANGE      a token of all zeros; k of 0 or above TARTAN_MAX_K; ncells or ndocs
 *                      of 0; a threshold that is NaN or infinite; threads < 0;
 *   TARTAN_EBADID      a NULL, empty or malformed id in params->subset (or subset NULL
 *                      with n_subset > 0 is TARTAN_EINVAL);
 *   TARTAN_ECORRUPT    damaged index data (a record whose checksum fails; see skip_damaged);
 *   TARTAN_ENOTSUP     skip_damaged on a GPU;
 *   TARTAN_ESTORAGE, ENOMEM.
 * The index is never changed. Any thread, any number at once (see above).
 */
TARTAN_API int tartan_search(tartan_db *db, const tartan_queries *queries,
                             const tartan_search_params *params, tartan_results **results);

/* Frees results from tartan_search; NULL is fine. */
TARTAN_API void tartan_results_free(tartan_results *results);

/* ---------------------------------------------------------------------------------------
 * Calibration
 *
 * How wide the adaptive search must probe to keep a share of the exhaustive top k depends on
 * the corpus (how crowded its token space is, how its documents share centroids). An index
 * measures it on itself: tartan_calibrate runs queries (the caller's, or pseudo-queries drawn
 * from the index's own documents: noisy copies of a document's tokens and of their centroids,
 * tokens of a second document, and tokens near the query's mean) exhaustively and through the
 * probing stage, and stores how wide a margin kept each share of the top 10 and top 100. A
 * later search takes its probe margin from there (see tartan_search). An index never
 * calibrated searches with built-in margins (wider than most corpora need).
 *
 * `tartan build` calibrates once the documents are in; `tartan add` again when the live
 * documents have changed more than twofold since (tartan_calibration.stale); `tartan
 * calibrate INDEX [--queries Q.npy]` on demand. A library user calls tartan_calibrate after
 * the first large add, and again when stale.
 * ------------------------------------------------------------------------------------- */

/* What a calibration measured (tartan_calibration_get, tartan_calibrate). */
typedef struct tartan_calibration {
    int calibrated;            /* 0: never calibrated (every other field 0) */
    int from_queries;          /* 1: the caller's queries; 0: pseudo-queries */
    int stale;                 /* live documents changed more than twofold since */
    uint32_t n_queries;        /* queries measured */
    uint64_t n_docs;           /* live documents when calibrated */
    uint64_t n_reference_docs; /* documents the exhaustive reference ranked (a sample of them
                                  when the index is larger than max_reference_docs) */
    float margin_k10;          /* probe margins a default search (recall_target 0.95) uses */
    float margin_k100;         /*   at k 10 and k 100, for queries of 32 tokens or more */
    float recall_k10;          /* that search's recall@10 / @100 against exhaustive search */
    float recall_k100;         /*   on the calibration queries (over a sample: an estimate,
                                  from the sample's documents standing for the top k) */
    double candidates_k10;     /* its candidates and exactly scored documents per query, k 10
                                  (over the sample's documents when n_reference_docs < n_docs) */
    double exact_k10;
    double seconds;          /* the calibration's wall time */
    uint32_t short_len;      /* tokens of the short pseudo-queries (8); 0: not measured */
    float margin_k10_short;  /* the margins for queries of short_len tokens or fewer; a */
    float margin_k100_short; /*   query between short_len and 32 tokens gets one between */
} tartan_calibration;

/* Parameters of tartan_calibrate. Start from tartan_calibrate_params_init(). */
typedef struct tartan_calibrate_params {
    const tartan_queries *queries; /* the caller's queries, or NULL (default): pseudo-queries */
    size_t n_pseudo;           /* pseudo-queries to draw, 0: 128 */
    size_t max_reference_docs; /* the exhaustive reference ranks at most this many live
                                  documents (a fixed sample of the index), 0: 20,000
                                  on the CPU, 1,000,000 on a GPU; over
                                  a sample at rate r, the sample's top 10r and 100r stand
                                  for the index's top 10 and 100 */
    uint64_t seed;             /* pseudo-queries and the sample; default 42 */
    int threads;               /* OpenMP threads, 0: OpenMP's default */
    tartan_device device;      /* where the searches run; AUTO: the handle's */
    uint64_t corpus_docs;      /* this index is a shard of a corpus of this many live
                                  documents (0: the index is the corpus; fewer than the
                                  index holds count as the index's): the reference samples
                                  the index at max_reference_docs / corpus_docs, the rate
                                  the whole corpus's calibration would, so that all shards
                                  together rank about max_reference_docs documents */
} tartan_calibrate_params;

/* Fills *p with the defaults above. Any thread. */
TARTAN_API void tartan_calibrate_params_init(tartan_calibrate_params *p);

/*
 * tartan_calibrate: measures the index (see above) and stores the result in it, in one
 * write transaction; searches that start after it returns use it.
 *   db: in, open read-write, trained.   params: in, NULL for the defaults.
 *   out: out (may be NULL): what was measured and stored.
 * The queries' tokens are checked as tartan_search checks them. Time: the calibration
 * queries' exhaustive search over at most max_reference_docs documents plus their adaptive
 * searches (seconds for 20,000 documents on two cores). Returns 0, or:
 *   TARTAN_EINVAL (NULL db; bad queries as tartan_search says), TARTAN_EREADONLY,
 *   TARTAN_ENOTTRAINED (no centroids yet), TARTAN_EEMPTY (no live documents), the errors of
 *   tartan_search (TARTAN_EDIM, TARTAN_ENONFINITE, ...), ENOMEM, TARTAN_ECORRUPT,
 *   TARTAN_ESTORAGE.
 * A failed calibration leaves the stored one as it was. Threads: as tartan_add.
 */
TARTAN_API int tartan_calibrate(tartan_db *db, const tartan_calibrate_params *params,
                                tartan_calibration *out);

/*
 * tartan_calibration_get: the index's stored calibration (out->calibrated 0 if none), with
 * stale computed against the live documents now. Returns 0, TARTAN_EINVAL (NULL),
 * TARTAN_ECORRUPT (a damaged record), TARTAN_ESTORAGE. Any thread.
 */
TARTAN_API int tartan_calibration_get(tartan_db *db, tartan_calibration *out);

/* ---------------------------------------------------------------------------------------
 * Checking an index (reliability)
 * ------------------------------------------------------------------------------------- */

/*
 * Called by tartan_check once per problem found.
 *   ctx: tartan_check's ctx.
 *   kind: a short stable tag of the problem ("checksum", "ivf-missing", "ivf-stale", "count",
 *     "id-map", ...; the full list is in storage/verify.c); message: what and where
 *     ("document 17 (id 'abc'): checksum mismatch ..."). Both valid during the call only.
 * Returning nonzero stops the check (tartan_check then returns TARTAN_ECORRUPT).
 */
typedef int (*tartan_check_fn)(void *ctx, const char *kind, const char *message);

/*
 * tartan_check: verifies the whole index in one read snapshot, against storage/FORMAT.md:
 * the header and its counts against the documents, codec and centroids, every document blob
 * (size, checksum, codes below the number of centroids, inverse norms), the inverted lists
 * against the documents' codes in both directions (missing and stale entries), and external
 * ids <-> documents in both directions. It reads everything and reports every problem rather
 * than stopping at the first.
 *   db: in, open (read-only is enough).   report: in, may be NULL.   ctx: passed to report.
 *   n_problems: out (may be NULL): problems found.
 * Returns 0 when the index is sound; TARTAN_ECORRUPT when problems were found (each went to
 * report; tartan_errmsg(db) counts them); TARTAN_EINVAL (db NULL), ENOMEM, TARTAN_ESTORAGE
 * when the check could not run. Damage inside LMDB's own page structure that LMDB detects is
 * a problem of kind "lmdb"; LMDB trusts its pages, so other damage to them may go unseen or
 * stop the process (README "Guarantees"). It takes time and memory of one pass over the
 * index (a bit per document number). Any thread; it does not block writers.
 */
TARTAN_API int tartan_check(tartan_db *db, tartan_check_fn report, void *ctx,
                            size_t *n_problems);

/* ---------------------------------------------------------------------------------------
 * Shards: one corpus over several indexes
 *
 * A corpus larger than one index should hold (one disk, one GPU, one host, one process's
 * query rate) is split into P shards, each an index of its own, all sharing one trained model
 * (centroids and codec), so that a document scores exactly the same in whichever shard holds
 * it: MaxSim depends only on the query and the document, and the corpus's exact top k is the
 * merge of the shards' exact top k. The library holds no network code; the `tartan-mpi`
 * program (README, "Sharded indexes") does the following over MPI, and an RPC service can do
 * the same with these calls:
 *   1. train every shard with one model: either all of them together, each from its own part
 *      of the sample (tartan_train_shared: k-means's work divides between them), or one shard
 *      (tartan_train, from a sample of the whole corpus), then tartan_model_export its model and
 *      tartan_model_import the string into every other shard, each created empty with the
 *      same dim;
 *   2. send each document to shard tartan_shard_of(id, P), for adds, replaces and deletes
 *      alike, so that an id lives in one shard only;
 *   3. search every shard with the same queries and parameters, k results each, and
 *      tartan_results_merge the shards' results into the corpus's top k.
 * Exhaustive search over the shards then returns what one index of the whole corpus built
 * with the same model returns (ties aside: see tartan_results_merge). PLAID's candidate
 * stages run per shard: each keeps up to ndocs of its own documents, so the shards together
 * score more documents exactly than one index would, and their recall against exhaustive
 * search is as high or higher in practice (tests/check_mpi.sh measures it), though not
 * guaranteed query by query.
 * ------------------------------------------------------------------------------------- */

/* Most members a shared training may have: its status and count exchanges use a buffer of
 * this many slots on the caller's stack (16 KB), so that they need no allocation. */
#define TARTAN_GROUP_MAX 1024

/*
 * The members of a shared training (tartan_train_shared) and the three collective operations
 * the caller's transport provides for them (MPI: MPI_Allreduce, MPI_Bcast, MPI_Gatherv; an RPC
 * service: the same over its connections). Every member passes its own rank and the same size;
 * each callback is called by every member in the same order, on the thread that called
 * tartan_train_shared (never from the library's worker threads: MPI_THREAD_FUNNELED is enough
 * when that is the main thread), and returns 0, or nonzero after a failure, which must then be
 * every member's (a transport that fails on one member only leaves the others waiting in the
 * next call). All buffers are the library's and valid during the call only.
 */
typedef struct tartan_train_group {
    int rank;  /* this member, 0 .. size - 1 */
    int size;  /* members, 1 .. TARTAN_GROUP_MAX */
    void *ctx; /* the caller's, passed to every callback */
    /* Replaces values [n] with their sum over the members, on every member (an allreduce).
     * Called a few times with a handful of values, and once per k-means iteration with
     * K * (dim + 1) + size values (64 MB at K 65,536, dim 128). */
    int (*sum)(void *ctx, double *values, size_t n);
    /* Copies rank 0's buf [len] into every other member's buf (lengths agree). */
    int (*broadcast)(void *ctx, void *buf, size_t len);
    /* Every member's mine [len] to rank 0, into all in rank order: lens [size] gives every
     * member's len and is the same on every member; all is NULL on the others (a gatherv).
     * At most K * dim floats in all (the first centroids), or 50,000 * dim (the held-out
     * residuals); len may be 0. */
    int (*gather)(void *ctx, const void *mine, size_t len, void *all, const size_t *lens);
} tartan_train_group;

/* Where a shared training's time went, this member's seconds (tartan_train_shared). */
typedef struct tartan_train_stats {
    double seconds_kmeans; /* k-means, its exchanges included */
    double seconds_codec;  /* the held-out residuals, gathered on rank 0, the codec fit there
                              and its broadcast */
    double seconds_store;  /* writing the model into this member's index */
    double seconds_group;  /* inside the callbacks, waiting for slower members included */
    double seconds_total;  /* the whole call */
} tartan_train_stats;

/*
 * tartan_train_shared: trains several indexes with one model, each member of the group (a
 * process, usually one per shard) contributing its own part of the sample and its own device:
 * the work of k-means divides between them. Called by every member, collectively. The group's
 * sample is the members' parts in rank order, and every member stores in its own index the
 * model that tartan_train gives one index from that whole sample (the same centroids and codec
 * bit for bit, where the members' devices assign every point alike: see below), so that the
 * shards' tartan_model_export strings are equal and no model needs to be sent afterwards.
 *
 * How: the held-out 5% and k-means's subset and first centroids are seeded selections over the
 * group's tokens, each member keeping its own; at every k-means iteration each member assigns
 * its own points to the centroids (on its GPU or its CPU) and sums them per centroid, sum()
 * adds the members' sums and counts up (in fixed point, exactly: the result does not depend on
 * how the sample is split or on the order the transport adds in), and every member computes
 * the same new centroids; an empty cluster takes the group's worst-served point (each member
 * proposes its own, rank 0 chooses and broadcasts). The codec is fitted on rank 0 to every
 * member's held-out residuals (gathered: at most 50,000 x dim floats) and broadcast. A point
 * whose two best centroids score within rounding of each other may be assigned otherwise on
 * another kind of device or precision (assign.h): members on different kinds of device may
 * then train a slightly different model than one process would, still one model for all.
 *   db: in, this member's index, open read-write, untrained and without documents; every
 *     member's created with the same dim, nbits, seed and sample_docs and opened with the same
 *     n_centroids, kmeans_iters and seed (else TARTAN_EINVAL naming what differs).
 *   sample: in, this member's part of the sample (ids may be NULL); NULL or n_docs 0 for none.
 *   corpus_tokens: in, the whole corpus's tokens (every shard's), the same on every member; 0:
 *     the group's sample's.
 *   group: in, see tartan_train_group.   stats: out, may be NULL.
 * Returns 0 on every member, or an error on every member: where the failure arose, its own
 * code (the batch errors of tartan_add for this member's sample, TARTAN_EINVAL, TARTAN_EDIM,
 * TARTAN_EEMPTY for fewer than 2 tokens in the whole group, TARTAN_ETRAIN, TARTAN_EREADONLY,
 * the device's, ENOMEM, storage errors); on the other members TARTAN_EGROUP, whose message
 * names the first rank that failed and its code. Every exchange carries every member's status,
 * so a member that fails (bad input, no memory, a device error) makes the others return at the
 * next exchange instead of waiting for it; one that dies or hangs is the transport's to detect
 * (MPI ends the job). A malformed group (NULL callbacks, rank or size out of range) gives
 * TARTAN_EINVAL at once, without calling the group. After a failure no index has changed,
 * except when some member failed to store the model: the others have stored it, every member
 * returns the error, and the build starts again with fresh indexes. Threads: as tartan_train;
 * the call holds the index's write lock, and on a GPU the process's GPU lock (one GPU call at a
 * time per process), while it waits for the group: members that are threads of one process
 * must therefore train on the CPU (or at most one of them on a GPU), else they would wait for
 * each other for ever. One process a member, as under MPI, has no such limit.
 */
TARTAN_API int tartan_train_shared(tartan_db *db, const tartan_batch *sample, size_t corpus_tokens,
                                   const tartan_train_group *group, tartan_train_stats *stats);

/*
 * tartan_model_export: the index's trained model as one opaque byte string: the model fields
 * of its description (dim, nbits, number of centroids, seed, k-means settings) and every
 * stored record of the model (centroid table, codec tables, and whatever a later codec
 * stores), versioned and checksummed (CRC-32C). Documents, ids, counts and what searches
 * measure on the index's own documents (calibration) are not part of it. The string holds
 * native-endian numbers and the records of this build's index format version: it moves
 * between processes and machines of one byte order running builds of the same format version.
 *   db: in, open (read-only is enough), trained.
 *   buf, len: out, the string and its length; the caller frees *buf with tartan_free().
 * Returns 0, TARTAN_EINVAL (NULL arguments), TARTAN_ENOTTRAINED (no model yet),
 * TARTAN_ECORRUPT, TARTAN_ESTORAGE, ENOMEM. Any thread; it reads one snapshot.
 */
TARTAN_API int tartan_model_export(tartan_db *db, void **buf, size_t *len);

/*
 * tartan_model_import: trains an empty index with a model from tartan_model_export, in one
 * transaction, instead of tartan_train: later adds encode with exactly that model. The whole
 * string is checked before the index is touched. Importing into an index that has exactly
 * this model already succeeds and changes nothing, so a retried build converges.
 *   db: in, open read-write; untrained and without documents (or trained with this model).
 *   buf, len: in, the string (the caller's; not kept).
 * The model's dim must be the index's; its nbits, centroids, codec and seed replace what the
 * index was created with. Returns 0, or:
 *   TARTAN_EINVAL      NULL db or buf; the index is trained already with another model;
 *   TARTAN_EFORMAT     not a model string (no magic);
 *   TARTAN_ETRUNC      shorter than the length it records;
 *   TARTAN_ECORRUPT    checksum mismatch, records out of bounds, or records that do not
 *                      make a model of the recorded shape;
 *   TARTAN_EVERSION    a string of another layout version, or from an index of another
 *                      format version (export again from an index this build writes);
 *   TARTAN_EDIM        the model's dim is not the index's;
 *   TARTAN_EREADONLY, TARTAN_ESTORAGE, ENOMEM, ENOSPC.
 * Threads: as tartan_train.
 */
TARTAN_API int tartan_model_import(tartan_db *db, const void *buf, size_t len);

/* Frees memory the library allocated for the caller (tartan_model_export's string); NULL is
 * fine. Any thread. */
TARTAN_API void tartan_free(void *p);

/*
 * tartan_shard_of: the shard, 0 .. n_shards - 1, that external id belongs to in a corpus of
 * n_shards shards. Stable: it depends only on the id's bytes and n_shards, the same on every
 * machine and in every version of the library: the 64-bit FNV-1a hash of the id's bytes (no
 * terminating NUL), fed to Lamping and Veach's jump consistent hash. Going from n to n + 1
 * shards moves only the ids that now belong to the new shard (about 1 / (n + 1) of them).
 * id NULL or n_shards 0 or 1: 0. Any thread.
 */
TARTAN_API uint32_t tartan_shard_of(const char *id, uint32_t n_shards);

/*
 * tartan_results_merge: the top k of several result sets for the same batch of queries
 * (query i of every part is the same query), as a sharded search gathers them: for each
 * query, every part's hits; an id found in more than one part kept once, with its best score;
 * ordered by score, best first, equal scores by id (bytewise, ascending); the first k. The
 * result depends only on the hits, not on the order of the parts. A part's ties were broken by
 * its own index (the document added first), so where equal scores straddle the k-th place
 * the merge may keep another of the tied documents than one index of the whole corpus would.
 * For the exact top k of the union, each part must hold (at least) its own top k.
 *   parts: in, n_parts result sets, each from tartan_search or tartan_results_merge, or built
 *     by the caller (deserialised from another process): only n_queries, counts, offsets
 *     and hits are read, and each part's shape is checked first.
 *   k: 1 .. TARTAN_MAX_K.
 *   out: out, the merged results (ids copied into them; parts may be freed afterwards),
 *     freed with tartan_results_free. Its stats add up the parts' (seconds_total: the
 *     longest part's; probe_margin and rerank_z: the largest part's, since each part
 *     probed with its own index's calibration).
 * Returns 0, or TARTAN_EINVAL (NULL out or parts, n_parts 0, a NULL part, parts with
 * different numbers of queries, offsets or counts outside a part's hits, a NULL id, a NaN
 * score), TARTAN_ERANGE (k), ENOMEM; the message is tartan_errmsg(NULL)'s. Any thread.
 */
TARTAN_API int tartan_results_merge(const tartan_results *const *parts, size_t n_parts, size_t k,
                                    tartan_results **out);

/*
 * tartan_repair: salvages a damaged index. Every document whose record is sound and whose
 * external id survives in either id map is kept, with its number, record and id; the others
 * are removed. The inverted lists, both id maps and the header's counts are rebuilt from the
 * kept documents (a damaged header from the centroid and codec records), damaged meta records
 * of other kinds are dropped. It all happens as tartan_compact writes a new index: one
 * transaction, an atomic exchange, the old index untouched on any failure. Afterwards
 * tartan_check finds nothing, and every search answers for the kept documents exactly as the
 * index did before the damage. On a sound index it changes nothing but the layout.
 *   db: in, open read-write.   report: in, may be NULL: called after the repair has landed,
 *   once per thing it did, kind "removed" (message: "document 17 (id 'abc'): its record is
 *   damaged"; the id when an id map still knows it), "rebuilt", "dropped" or "lmdb" (see
 *   storage/salvage.c); returning nonzero stops the calls (not the repair).
 *   ctx: passed to report.   n_removed: out (may be NULL): documents removed.
 * The codec tables and centroids cannot be derived from anything: they are stored twice, and
 * a damaged copy is written again from the sound one; when both are damaged the index cannot be
 * salvaged (TARTAN_ECORRUPT, nothing changed; rebuild it from its embeddings). When LMDB's two
 * meta pages disagree (a damaged transaction id: every search and change of the index answers
 * TARTAN_ECORRUPT then), the repair rewrites the index from the newest snapshot, or refuses
 * (TARTAN_ECORRUPT) when which one that is cannot be told (storage/FORMAT.md "LMDB's meta
 * pages").
 * Damage LMDB's own pages hide (README "Guarantees") loses what lies behind them; LMDB may
 * also stop the process on some such damage before tartan sees it.
 * Returns 0, TARTAN_EINVAL (NULL db), TARTAN_EREADONLY, TARTAN_ECORRUPT, and
 * tartan_compact's errors. Any thread; one compaction, repair or change at a time per index.
 */
TARTAN_API int tartan_repair(tartan_db *db, tartan_check_fn report, void *ctx,
                             size_t *n_removed);

#ifdef __cplusplus
}
#endif

#endif /* TARTAN_H */
