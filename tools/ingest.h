/*
 * ingest.h: feeding a corpus on disk (embeddings.npy, doclens.npy, optional ids.txt) into an
 * index through the public API, in bounded memory: the embeddings stay memory-mapped, each
 * batch points straight into the mapping, and pages already added are dropped from the
 * process (MADV_DONTNEED), so a build's peak memory depends on the batch and the training
 * sample, not on the corpus. Used by `tartan build` and `tartan add`.
 */
#ifndef TARTAN_TOOLS_INGEST_H
#define TARTAN_TOOLS_INGEST_H

#include <stddef.h>
#include <stdint.h>

#include "idlist.h"
#include "npy.h"
#include "tartan.h"

typedef struct tool_corpus {
    tool_npy emb;    /* [n_rows, dim] float32, float16 or bfloat16 */
    tool_npy lens;   /* [n_docs] int32 or int64 */
    tool_idlist ids; /* when have_ids */
    int have_ids;
    size_t n_docs, n_rows, dim;
    tartan_dtype dtype;
    size_t row_bytes;
    size_t released; /* bytes of the mapping already given back */
    const char *emb_path, *lens_path, *ids_path;
    size_t batch_tokens; /* tokens a batch when the caller names no batch size (0: the
                            CPU's TOOL_BATCH_TOKENS; tool_batch_tokens picks by device) */
} tool_corpus;

/*
 * Opens the files and checks them against each other in one pass over the lengths: ranks and
 * dtypes, every length >= 1, the lengths summing to the embedding rows (TARTAN_ETRUNC when the
 * embeddings have fewer rows, TARTAN_EFORMAT when more), the ids file holding one id per
 * document (TARTAN_ETRUNC / TARTAN_EFORMAT likewise). ids may be NULL (ids are then the
 * document's row numbers, "0" .. "N-1"). Messages name the file.
 */
int tool_corpus_open(tool_corpus *c, const char *emb, const char *lens, const char *ids, char *err,
                     size_t errlen);
void tool_corpus_close(tool_corpus *c);

/* Length of document i. */
size_t tool_corpus_doclen(const tool_corpus *c, size_t i);

/* The external id of document i: the ids file's, else its row number written into buf. */
const char *tool_corpus_id(const tool_corpus *c, size_t i, char buf[21]);

/* Documents drawn for training, their tokens copied out of the corpus. */
typedef struct tool_sample {
    size_t n;      /* documents */
    size_t tokens; /* their tokens (rows of emb) */
    size_t *lens;  /* [n] */
    char *emb;     /* [tokens, dim] in the corpus's dtype (row_bytes a row) */
    int borrowed;  /* emb is the corpus's own rows (a sample of every document), not a copy */
} tool_sample;

/*
 * Draws want documents (all, when fewer qualify) uniformly among the corpus's documents i with
 * keep[i] nonzero (keep NULL: all documents), seeded, in file order, and reads their tokens
 * with pread (faults spread over a mapped file would make most of it resident), then gives
 * the mapping's pages back. A sample of every document (keep NULL, want >= the corpus's)
 * borrows the corpus's rows instead (s->borrowed): valid while the corpus is open. Errors:
 * ENOMEM, the read's (TARTAN_ETRUNC when the file shrank).
 */
int tool_corpus_sample(tool_corpus *c, size_t want, uint64_t seed, const uint8_t *keep,
                       tool_sample *s, char *err, size_t errlen);
void tool_sample_free(tool_sample *s);

/*
 * Trains db from a sample of tartan_sample_docs(db, n_docs) documents drawn uniformly over
 * the whole corpus (seeded), then gives the sample's memory back. The message of a failure is
 * tartan_errmsg(db)'s, or the sample's own.
 */
int tool_corpus_train(tartan_db *db, tool_corpus *c, uint64_t seed, char *err, size_t errlen);

/* tartan_train on a sample drawn before (corpus_tokens: the whole corpus's tokens). */
int tool_sample_train(tartan_db *db, const tool_sample *s, const tool_corpus *c,
                      size_t corpus_tokens, char *err, size_t errlen);

/* Tokens per batch when the caller names no batch size: on the CPU, and where encoding runs on
 * a GPU. Why larger on a GPU: every batch rewrites the last block of most inverted lists in
 * one thread while the GPU waits, and the GPU encodes a batch in a fraction of that (100k
 * documents of model 1, nbits 4, H200: adding 5.1 -> 3.9 s at 2^20 tokens a batch). About
 * 1 KiB of host memory a token while a batch is encoded: 1 GiB at 2^20. */
#define TOOL_BATCH_TOKENS ((size_t)1 << 18)
#define TOOL_BATCH_TOKENS_GPU ((size_t)1 << 20)

/* The default tokens a batch for encoding on dev (tartan_device_resolve's rule). */
size_t tool_batch_tokens(tartan_device dev);

/*
 * Adds every document, batch_docs at a time (0: documents of about TOOL_BATCH_TOKENS tokens), each
 * batch one tartan_add(flags) (one transaction). *added: documents committed (a failure leaves the
 * earlier batches in the index). progress: report on a terminal.
 */
int tool_corpus_ingest(tartan_db *db, tool_corpus *c, size_t batch_docs, unsigned flags,
                       size_t *added, char *err, size_t errlen);

/*
 * The same for the documents i with keep[i] nonzero only (keep NULL: all), in file order:
 * batch_docs of them (0: about TOOL_BATCH_TOKENS tokens) copied into one batch, one
 * tartan_add each. A shard of a corpus ingests its own documents this way.
 */
int tool_corpus_ingest_some(tartan_db *db, tool_corpus *c, const uint8_t *keep, size_t batch_docs,
                            unsigned flags, size_t *added, char *err, size_t errlen);

/*
 * Trains db with the model in file path (written by `tartan model`, tartan_model_import).
 * The message names the file.
 */
int tool_model_import_file(tartan_db *db, const char *path, char *err, size_t errlen);

/* Parses a size argument ("4096"); 0 on success. */
int tool_parse_size(const char *s, size_t *v);

/* Parses a --device argument ("auto", "cpu" or "cuda"); 0 on success. */
int tool_parse_device(const char *s, tartan_device *d);

#endif
