/*
 * index.h: building, changing and reading a PLAID index (layer prefix idx_). The engine calls
 * this layer; it uses storage/ (store.h), the codec (codec.h), FAISS (kmeans.h) and the sizing
 * rules (plan.h).
 *
 * Writing:
 *   1. idx_batch_prepare checks a batch of documents (ids, lengths, values) and makes its
 *      L2-normalised fp32 copy; nothing in the index is touched;
 *   2. idx_train (explicit, from a sample) or the first idx_add trains centroids and codec;
 *   3. idx_add / idx_delete change the index, each in one write transaction;
 *   4. idx_batch_free.
 *
 * Reading (the search pipeline's entry point):
 *   1. idx_reader_open begins a read snapshot and loads the model (header, codec, centroids
 *      straight from the map);
 *   2. idx_reader_doc / idx_reader_next_doc give documents as kern_pdoc pointers into the map;
 *      idx_reader_ivf_* iterate inverted lists; idx_reader_name / idx_reader_docno map
 *      document numbers to external ids and back;
 *   3. idx_reader_close ends the snapshot; every pointer obtained through it dies with it.
 * A reader is used by one thread at a time (it may move between threads); any number of
 * readers may live at once, beside one writer, each seeing the index as of its open. A thread
 * must close its readers before it calls idx_add, idx_delete or idx_train (store.h).
 *
 * Errors: 0, a negative TARTAN_E... code or a positive errno value; the detail goes into the
 * store_msg (without the code's name).
 */
#ifndef TARTAN_INDEX_INDEX_H
#define TARTAN_INDEX_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "axes.h"
#include "codec.h"
#include "group.h"
#include "kernels.h"
#include "store.h"

/* Element types of input embeddings (the same values as tartan_dtype). */
enum { IDX_F32 = 0, IDX_F16 = 1, IDX_BF16 = 2 };

/* A batch as the caller gives it (mirrors tartan_batch; see engine/tartan.h). */
typedef struct idx_input {
    size_t n_docs;
    const char *const *ids; /* [n_docs], NUL-terminated; NULL for a training sample */
    const size_t *doclens;  /* [n_docs] */
    const void *embeddings; /* [n_rows, dim] of dtype */
    size_t n_rows;
    size_t dim;
    int dtype;
} idx_input;

/* A checked batch: the caller's ids and lengths, and its own normalised fp32 embeddings. */
typedef struct idx_batch {
    size_t n_docs;
    const char *const *ids; /* NULL for a sample without ids */
    size_t *idlens;         /* [n_docs], owned */
    const size_t *doclens;  /* the caller's */
    size_t *offsets;        /* [n_docs + 1] token offsets, owned */
    size_t n_rows, dim;
    float *emb; /* [n_rows, dim], L2-normalised, owned */
} idx_batch;

/*
 * Checks in (against an index of dimension dim) and fills b. Errors, each naming the document
 * (its position and id) and token: TARTAN_EINVAL (NULL pointers, doclens not summing to
 * n_rows), TARTAN_EEMPTY (no documents, a document without tokens), TARTAN_ETOOBIG (a document
 * above STORE_MAX_DOC_TOKENS tokens), TARTAN_EDIM, TARTAN_EDTYPE, TARTAN_EBADID (an empty id,
 * one longer than STORE_MAX_ID bytes, or with a control character), TARTAN_EDUPID (an id twice
 * in the batch), TARTAN_ENONFINITE (NaN or infinity), TARTAN_ERANGE (a token of all zeros,
 * which has no direction), ENOMEM. On failure b needs no idx_batch_free.
 */
int idx_batch_prepare(const idx_input *in, size_t dim, idx_batch *b, store_msg *m);
void idx_batch_free(idx_batch *b);

/* How the first training runs (from the engine's options). */
typedef struct idx_train_opts {
    size_t n_centroids; /* 0: DESIGN's formula from the corpus size */
    size_t sample_docs; /* documents a first add samples from its batch; 0: DESIGN's formula */
    int kmeans_iters;
    uint64_t seed;
    kern_dev device; /* where k-means and encoding assign tokens to centroids (assign.h) */
    unsigned codec;  /* TARTAN_CODEC_SCALAR or TARTAN_CODEC_AXES (tartan.h) */
} idx_train_opts;

/*
 * Trains centroids and codec from sample (all of its tokens) and stores them in one
 * transaction. corpus_tokens: tokens of the whole collection the sample stands for (sizes K;
 * 0: the sample's own). TARTAN_EINVAL if the index is trained already, TARTAN_ETRAIN if
 * FAISS fails, TARTAN_EEMPTY if the sample has too few tokens (fewer than 2).
 */
int idx_train(store_env *env, const idx_batch *sample, size_t corpus_tokens,
              const idx_train_opts *o, store_msg *m);

/* Where a training's time went (seconds, this member's). */
typedef struct idx_train_times {
    double kmeans; /* idx_kmeans_group, its exchanges included */
    double codec;  /* the held-out residuals, their gathering, the fit and its broadcast */
    double store;  /* writing the model (idx_train_group) */
} idx_train_times;

/*
 * idx_train shared by the members of a group (group.h, idx_model_train_group): each member
 * passes its own part of the sample (sample->n_rows may be 0) and its own index, and every
 * member stores the same model. rc: this member's failure so far (0 or a code, its message in
 * m), which the first exchange makes every member's. Every member's index must have been
 * created alike and be opened alike (dim, nbits, seed, k-means iterations, centroids; corpus_tokens
 * too), else TARTAN_EINVAL naming what differs. Errors as idx_train's where they arose,
 * TARTAN_EGROUP on the others; a member that failed to store the model makes every member
 * return an error, though the others have stored it. times: may be NULL.
 */
int idx_train_group(store_env *env, const idx_batch *sample, size_t corpus_tokens,
                    const idx_train_opts *o, int rc, idx_group *g, idx_train_times *times,
                    store_msg *m);

/*
 * Adds the documents of b in one transaction (trains first from a sample of b when the index
 * has no centroids yet: opts says how). replace: an id that exists is replaced (its old
 * document deleted, the new one gets a new number); otherwise TARTAN_EDUPID. Errors also
 * TARTAN_ETOOBIG (document numbers exhausted), TARTAN_EREADONLY, and storage errors. On any
 * failure the index is as it was.
 */
int idx_add(store_env *env, const idx_batch *b, int replace, const idx_train_opts *opts,
            store_msg *m);

/*
 * Deletes the documents with the n given ids in one transaction; ids not in the index are
 * skipped. *n_deleted: how many were deleted. TARTAN_EBADID for an empty or invalid id.
 */
int idx_delete(store_env *env, const char *const *ids, size_t n, size_t *n_deleted, store_msg *m);

/* Checks one external id (non-empty, at most STORE_MAX_ID bytes, no control character). */
int idx_id_check(const char *id, size_t *len);

/* Documents to sample from a corpus of n_docs (sample_docs if nonzero, else DESIGN's rule). */
size_t idx_sample_docs(size_t n_docs, size_t sample_docs);

/*
 * The trained model as one byte string (index/model_io.c describes its layout): the header's
 * model fields and every model record (store_model_records), checksummed. idx_model_export:
 * *buf from malloc; TARTAN_ENOTTRAINED for an untrained index. idx_model_import: writes a
 * model into an untrained index without documents in one transaction, or, when the index is
 * trained with exactly that model already, changes nothing (*unchanged 1, may be NULL).
 * Errors: TARTAN_EFORMAT (not a model), TARTAN_ETRUNC, TARTAN_ECORRUPT (checksum, bounds),
 * TARTAN_EVERSION (another layout or index format version), TARTAN_EDIM, TARTAN_EINVAL (the
 * index is trained with another model), TARTAN_EREADONLY, storage errors.
 */
int idx_model_export(store_env *env, void **buf, size_t *len, store_msg *m);
int idx_model_import(store_env *env, const void *buf, size_t len, int *unchanged, store_msg *m);

/* ---- reading -------------------------------------------------------------------------- */

typedef struct idx_reader {
    store_env *env;
    store_txn *txn;
    store_header h;         /* dim, nbits, n_centroids, code_bytes, token_bytes, counts */
    int trained;            /* 0: no centroids, codec or documents yet */
    idx_codec codec;        /* valid when trained */
    /* The residual code by principal axes when the index was trained with it (axes not
     * NULL; codec is then unused), with the kernels' decode tables (kern_residual.axes_dec,
     * axes_bytes). Shared and read-only: readers of the same code hold one parsed copy
     * (reader.c's cache), which idx_reader_close releases (a copy of a reader must not be
     * closed as well). */
    const idx_axes *axes;
    const float *axes_dec;
    unsigned axes_bytes[4];
    int axes_additive; /* kern_residual.axes_additive for these tables */
    void *axes_ref;
    const float *centroids; /* [n_centroids, dim], in the map; NULL when untrained */
    int verify;             /* check each document's checksum on read (default 1) */
    /* A partition of the documents (the multi-GPU search, engine/search_gpus.c): with
     * part_n > 1 the reader shows only documents whose number is part_i modulo part_n
     * (idx_reader_doc says TARTAN_ENOTFOUND for the others, idx_reader_next_doc skips them).
     * 0 (idx_reader_open's): every document. */
    uint32_t part_n, part_i;
    /* Skip damaged records while walking the documents (idx_reader_next_doc) instead of
     * failing, counting each in *damaged when not NULL (default 0, NULL). */
    int skip_damaged;
    uint64_t *damaged;
} idx_reader;

/* Begins a snapshot and loads the model. */
int idx_reader_open(store_env *env, idx_reader *r, store_msg *m);
void idx_reader_close(idx_reader *r);

/*
 * Document docno as kernel pointers into the map (codes uint16 when h.code_bytes == 2, else
 * uint32). TARTAN_ENOTFOUND for a number never used or deleted; TARTAN_ECORRUPT for a damaged
 * blob (checksum, size).
 */
int idx_reader_doc(const idx_reader *r, uint32_t docno, kern_pdoc *doc, store_msg *m);
/* store_doc_prefetch for docno (a hint; does nothing for a number this reader does not show). */
void idx_reader_doc_prefetch(const idx_reader *r, uint32_t docno);

/*
 * All live documents in number order: *cur starts NULL; each call gives the next one and
 * returns 1, then 0 at the end (the cursor is freed then), or an error (call
 * idx_reader_docs_end to free a cursor left early). With r->skip_damaged, a damaged record or
 * segment is passed over (and counted) instead of being an error.
 */
int idx_reader_next_doc(const idx_reader *r, store_cursor **cur, uint32_t *docno, kern_pdoc *doc,
                        store_msg *m);
void idx_reader_docs_end(store_cursor *cur);

/* Inverted list of a centroid: see store_ivf_open / store_ivf_next (runs of native uint32
 * document numbers, ascending, pointing into the map). */
int idx_reader_ivf_open(const idx_reader *r, uint32_t centroid, store_ivf_iter **it, store_msg *m);

/* External id of docno (pointer into the map, len bytes, not NUL-terminated). */
int idx_reader_name(const idx_reader *r, uint32_t docno, const char **id, size_t *len,
                    store_msg *m);
/* Document number of an external id: 0 or TARTAN_ENOTFOUND (no message then). */
int idx_reader_docno(const idx_reader *r, const char *id, uint32_t *docno, store_msg *m);

/* Decompresses a stored document into out [ntok, dim] (tests, tools, GPU staging). */
void idx_reader_decompress(const idx_reader *r, const kern_pdoc *doc, float *out);

#endif
