/*
 * queryfile.h: the query embeddings of a .npy file as tartan_queries batches, for `tartan
 * search` and `tartan calibrate`. Queries come as ColBERT writes them, [Nq, Lq, d] (every
 * query Lq tokens, or the first qlens[i] of them with a lengths file: padded queries), or
 * packed [Tq, d] with a lengths file giving each query's tokens. The file stays
 * memory-mapped; batches point into it where the layout allows.
 */
#ifndef TARTAN_TOOLS_QUERYFILE_H
#define TARTAN_TOOLS_QUERYFILE_H

#include <stddef.h>

#include "npy.h"
#include "tartan.h"

/* The queries of the file, however they are laid out. */
typedef struct tool_qfile {
    tool_npy emb;
    tool_npy lens;
    int have_lens;
    size_t nq; /* queries */
    size_t dim;
    size_t stride; /* [Nq, Lq, d]: Lq; packed: 0 */
    size_t *start; /* packed: first row of query i ([nq + 1]); else NULL */
    size_t *qlen;  /* tokens of query i ([nq]) */
    size_t elsize;
    tartan_dtype dtype;
    const char *path, *lens_path;
} tool_qfile;

/* Opens path (and lens_path, NULL when none): 0, or an error code with its message in err. */
int tool_qfile_open(tool_qfile *s, const char *path, const char *lens_path, char *err,
                    size_t errlen);

/*
 * Describes queries [q0, q1) as a tartan_queries. Fixed-length and packed queries point
 * straight into the file's mapping; padded ones (rank 3 with lengths) are gathered into buf
 * (the batch's rows), their lengths into qlens [q1 - q0].
 */
void tool_qfile_batch(const tool_qfile *s, size_t q0, size_t q1, char *buf, size_t *qlens,
                      tartan_queries *q);

/* Gives the mapped pages of queries before q1 back to the system (*released: bytes so far). */
void tool_qfile_release(const tool_qfile *s, size_t q1, size_t *released);

void tool_qfile_close(tool_qfile *s);

#endif
