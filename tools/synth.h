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
 *
 * Two versions of the model (bench/RESULTS.md, "Calibrating the generator", has the figures):
 * - TOOL_SYNTH_V1, the first one: noise 0.45, context 0.3, every document's topic terms and
 *   context independent of every other's; a query is a third to a half content tokens in a
 *   context of its own, the rest expansion tokens. Measured against real token embeddings
 *   (BEIR SciFact, MiniLM), its queries match their best document weakly and its documents
 *   are nearly tied (scores per query token: top 1 0.47, top 1 - top 10 0.11, against 0.70
 *   and 0.16), and tokens of one document are less alike than real ones (0.11 against 0.25).
 * - TOOL_SYNTH_V2 (the default), calibrated on those statistics, one parameter for each:
 *   a stronger document context (context 0.6, noise 0.5: tokens of one document as alike as
 *   real ones); topic groups of about group_docs documents sharing group_terms of their topic
 *   terms and group_context of their context (a collection has many documents on one
 *   subject: they set the spread of the top 10 and top 100 scores); a query is about its
 *   document's topic (query_context of its context is the document's) and has function
 *   tokens like a document (real queries are all tokens, no [MASK] padding); expansion
 *   tokens only when query_content < 1.
 * - TOOL_SYNTH_V3, a family with other token statistics, for checking that a default tuned on
 *   one family holds on another: V2's documents, topic groups and queries, then every token
 *   mapped into an anisotropic space as BERT-like encoders give (a shared mean direction
 *   carrying aniso_mean of each token, the rest in a subspace whose scales fall off as
 *   1 / (1 + k / aniso_rank), so random tokens have cosines around aniso_mean^2 and most of the
 *   variance lies in a few dozen directions); runs of near-duplicate tokens (each token
 *   continues the previous one's term with probability run_prob, moved by run_noise: image
 *   patches and repeated words behave so); heavy-tailed lengths (log-normal sigma 1.0, up to
 *   8 times the mean); and queries whose content tokens come from a hard negative (another
 *   document's topics and context) with probability negatives.
 */
#ifndef TARTAN_TOOLS_SYNTH_H
#define TARTAN_TOOLS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "npy.h"

enum { TOOL_SYNTH_V1 = 1, TOOL_SYNTH_V2 = 2, TOOL_SYNTH_V3 = 3 };

typedef struct tool_synth_params {
    int model; /* TOOL_SYNTH_V1, TOOL_SYNTH_V2 (default) or TOOL_SYNTH_V3 */
    size_t n_docs;
    size_t dim;          /* default 128 */
    size_t n_terms;      /* term centres; 0: about 4 * sqrt(total tokens), at least 64 */
    double zipf;         /* Zipf exponent of term frequencies, default 1.0 */
    size_t len_mean;     /* mean document length in tokens, default 100 */
    size_t len_min;      /* default 8 */
    size_t len_max;      /* default 4 * len_mean */
    size_t topics;       /* topic terms per document, default 12 */
    float noise;         /* per-token noise norm relative to the unit centre (V2 0.5, V1 0.45) */
    float context;       /* document context norm (V2 0.6, V1 0.3) */
    float function_frac; /* share of tokens drawn from the 64 most frequent terms, default 0.2 */
    size_t n_queries;
    size_t qlen; /* query tokens, default 32 */
    /* V2 only: share of the query's context that is its relevant document's (default 0.8),
     * and share of query tokens built from terms, the rest expansion tokens (default 1). */
    float query_context;
    float query_content;
    /* V2 only: documents per topic group (0: none; default 200), the share of a document's
     * topic terms (default 0.6) and of its context (default 0.7) taken from its group's. */
    size_t group_docs;
    float group_terms;
    float group_context;
    /* Log-normal sigma of document lengths (V1, V2 0.5; V3 1.0). */
    float len_sigma;
    /* V3 only (0 elsewhere): the mean direction's share (default 0.6), the subspace's scale
     * length (default 16 dimensions), near-duplicate runs (probability 0.5, moved by 0.15),
     * the share of query content tokens from a hard negative (0.25). */
    float aniso_mean;
    float aniso_rank;
    float run_prob;
    float run_noise;
    float negatives;
    uint64_t seed;
} tool_synth_params;

typedef struct tool_synth tool_synth;

/* Fills the defaults above (n_docs, n_queries left 0) of model V2. */
void tool_synth_params_init(tool_synth_params *p);
/* Sets model (V1, V2 or V3) and its noise, context, query and shape defaults; leaves the
 * rest. */
void tool_synth_params_model(tool_synth_params *p, int model);

/* Builds the term centres. Returns 0, or an errno / TARTAN_E code (bad sizes, ENOMEM). */
int tool_synth_new(const tool_synth_params *p, tool_synth **out);
void tool_synth_free(tool_synth *s);

/* Token count of document i (deterministic). */
size_t tool_synth_doclen(const tool_synth *s, size_t i);

/* Document i's tokens, L2-normalised: out [doclen(i), dim]. */
void tool_synth_doc(const tool_synth *s, size_t i, float *out);

/* Query j: out [qlen, dim], L2-normalised; *relevant = the document it was built from. */
void tool_synth_query(const tool_synth *s, size_t j, float *out, size_t *relevant);

/*
 * Writes the corpus of s (made from p, with p->n_queries queries) into the directory dir
 * (which must exist): embeddings.npy [T, dim], doclens.npy [N] int32, ids.txt, queries.npy
 * [Q, qlen, dim], query_ids.txt, qrels.tsv. dtype TOOL_F32 or TOOL_F16 (embeddings and
 * queries; fp16 halves the files). The files are the same whatever the thread count.
 * *total_tokens: T. Returns 0, or an error code with its message in err.
 */
int tool_synth_write(const tool_synth *s, const tool_synth_params *p, const char *dir,
                     tool_dtype dtype, size_t *total_tokens, char *err, size_t errlen);

/* fp32 to IEEE binary16, round to nearest even. */
uint16_t tool_f32_to_f16(float f);

#endif
