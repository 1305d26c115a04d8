/*
 * synth.h: synthetic late-interaction corpora that behave like ColBERT output, for demos,
 * tests and benchmarks (`tartan gen`).
 *
 * The model, and why each part is there:
 * - Token vectors cluster around "term" centres whose frequencies follow a Zipf law, as
 *   ColBERT's token embeddings cluster by word: a few terms occur everywhere, most are rare.
 * - A document draws a handful of topic terms and fills its tokens with them, plus frequent
 *   "function" terms; each token is its term's centre plus a document context vector (the
 *   contextualisation that makes one word's embeddings differ between passages) plus noise.
 * - A query is built from one document (its relevant one): noisy copies of some of that
 *   document's tokens, plus query-expansion tokens near the query's own mean (ColBERT's [MASK]
 *   padding behaves so). Other documents sharing its terms are the hard negatives.
 * Every document and query is a pure function of (seed, its number): a corpus streams in any
 * order, in parallel, in bounded memory, and regenerates bit for bit.
 */
#ifndef TARTAN_TOOLS_SYNTH_H
#define TARTAN_TOOLS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

typedef struct tool_synth_params {
    size_t n_docs;
    size_t dim;         /* default 128 */
    size_t n_terms;     /* term centres; 0: about 4 * sqrt(total tokens), at least 64 */
    double zipf;        /* Zipf exponent of term frequencies, default 1.0 */
    size_t len_mean;    /* mean document length in tokens, default 100 */
    size_t len_min;     /* default 8 */
    size_t len_max;     /* default 4 * len_mean */
    size_t topics;      /* topic terms per document, default 12 */
    float noise;        /* per-token noise norm relative to the unit centre, default 0.45 */
    float context;      /* document context norm, default 0.3 */
    float function_frac;/* share of tokens drawn from the 64 most frequent terms, default 0.2 */
    size_t n_queries;
    size_t qlen;        /* query tokens, default 32 */
    uint64_t seed;
} tool_synth_params;

typedef struct tool_synth tool_synth;

/* Fills the defaults above (n_docs, n_queries left 0). */
void tool_synth_params_init(tool_synth_params *p);

/* Builds the term centres. Returns 0, or an errno / TARTAN_E code (bad sizes, ENOMEM). */
int tool_synth_new(const tool_synth_params *p, tool_synth **out);
void tool_synth_free(tool_synth *s);

/* Token count of document i (deterministic). */
size_t tool_synth_doclen(const tool_synth *s, size_t i);

/* Document i's tokens, L2-normalised: out [doclen(i), dim]. */
void tool_synth_doc(const tool_synth *s, size_t i, float *out);

/* Query j: out [qlen, dim], L2-normalised; *relevant = the document it was built from. */
void tool_synth_query(const tool_synth *s, size_t j, float *out, size_t *relevant);

#endif
