/*
 * fixture_storage.h: what the storage test programs share: batches of clustered random
 * documents (cluster centres shared by all batches of a test, so later batches resemble
 * earlier ones), an index opened, reopened and added to, whole-index dumps for byte-identical
 * comparisons, and checks of every stored document and inverted list against references
 * written from storage/FORMAT.md.
 */
#ifndef TARTAN_TESTS_FIXTURE_STORAGE_H
#define TARTAN_TESTS_FIXTURE_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "index.h"
#include "kernels.h"
#include "tartan.h"

/* A batch the tests own: ids "<prefix><n>", clustered tokens, lengths in [minlen, maxlen]. */
typedef struct tbatch {
    size_t n_docs, n_rows, dim;
    char **ids;
    size_t *doclens;
    float *emb;
    tartan_batch b;
} tbatch;

/* A growing byte buffer. */
typedef struct dumpbuf {
    uint8_t *p;
    size_t n, cap;
} dumpbuf;

/* Draws new cluster centres of dim (at most 256) values (tbatch_make draws them when the
 * dimension changes). */
void make_centres(size_t dim);

/* One token: a random centre plus 0.35 * a standard normal in each dimension. */
void clustered_token(float *x, size_t dim);

/* Draws a batch from rng_state: n_docs documents "<prefix><first + i>" of minlen..maxlen tokens,
 * each token a cluster centre plus noise. */
void tbatch_make(tbatch *t, size_t n_docs, size_t minlen, size_t maxlen, size_t dim,
                 const char *prefix, size_t first);

/* Frees what tbatch_make allocated. */
void tbatch_free(tbatch *t);

/* Row offset of document i. */
size_t tbatch_off(const tbatch *t, size_t i);

/* Creates ixpath (it must not exist) with dim, nbits and k centroids. */
tartan_db *open_new(size_t dim, unsigned nbits, size_t k);

/* Opens ixpath again with flags. */
tartan_db *reopen(uint32_t flags);

/* tartan_add of t that must succeed. */
void add_ok(tartan_db *db, const tbatch *t, unsigned flags);

/* Every key and value of every database of the index, in one buffer. */
dumpbuf dump_index(tartan_db *db);

/* The two dumps are equal byte for byte; frees both. */
void assert_same_dump(dumpbuf *a, dumpbuf *b);

/* The centroid code of token t of d. */
uint32_t code_at(const idx_reader *r, const kern_pdoc *d, uint32_t t);

/* The test's own unpacking (DESIGN.md: each dimension's bucket as nbits bits, least
 * significant first; the stream packed into bytes most significant bit first). */
unsigned ref_bucket(const uint8_t *packed, unsigned nbits, size_t j);

/* Decompresses token t of d in double: normalise(C[code] + w[bucket]). */
void ref_decompress(const idx_reader *r, const kern_pdoc *d, uint32_t t, double *out);

/* The document number of id (which must exist). */
uint32_t docno_of(const idx_reader *r, const char *id);

/* Cosine of the stored token against the original (normalised in double). */
double cos_orig(const float *orig, const double *dec, size_t dim);

/*
 * Checks every document of t against the index: the code is a nearest centroid, the inverse
 * norm is 1/|C[c] + w[b]|, the library's decompression matches the reference, and the mean
 * cosine with the originals is returned.
 */
double check_docs(tartan_db *db, const tbatch *t);

/* Expected inverted lists from the stored codes vs the stored lists, both ways, and the
 * header counts against a recount. */
void check_ivf_consistent(tartan_db *db);

/* The parts of tartan_info add up to the file, less LMDB's own few pages (meta pages,
 * catalogue, free-list tree), and the inverted lists take some bytes when they have entries. */
void check_info_adds_up(tartan_db *db);

#endif
