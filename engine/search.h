/*
 * search.h: the search pipeline's internal interface (layer prefix eng_). tartan_search
 * (engine/search.c) checks a call, prepares its queries (engine/queries.c), takes one snapshot
 * and runs either PLAID's four stages per query (engine/search_plaid.c) or exact scoring of
 * every live document (engine/search_exact.c); both leave each query's best documents as
 * (document number, score) pairs that search.c turns into external ids.
 */
#ifndef TARTAN_ENGINE_SEARCH_H
#define TARTAN_ENGINE_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "index.h"
#include "tartan.h"

/* Most tokens in one query (tartan.h). */
#define ENG_MAX_QLEN 65536u

/* Queries checked, converted to fp32 and L2-normalised token by token. */
typedef struct eng_queries {
    size_t n; /* queries */
    size_t dim;
    size_t *off;    /* [n + 1] token offsets, owned */
    float *emb;     /* [off[n], dim], owned */
    size_t max_len; /* longest query */
} eng_queries;

/* Checks q against an index of dimension dim (see tartan_search's errors) and fills out. */
int eng_queries_prepare(const tartan_queries *q, size_t dim, eng_queries *out, store_msg *m);
void eng_queries_free(eng_queries *q);

/* What every worker of one call reads (read-only while they run). */
typedef struct eng_search {
    const eng_queries *q;
    size_t k;      /* results per query (already at most the live documents) */
    size_t ncells; /* probes per query token at most (at most n_centroids) */
    float margin;  /* of those, only centroids within margin of the token's best (INFINITY:
                      all ncells, the fixed mode); the widest of margin_q's when set */
    const float *margin_q; /* [q->n] each query's margin by its length (NULL: margin) */
    int prune;     /* stage 2 ignores centroids whose best score is below threshold */
    float threshold;
    /* Fixed mode (adaptive 0): stage 2 keeps ndocs, stage 3 ndocs_exact = max(ndocs / 4, k).
     * Adaptive mode: exact scoring in order of approximate score until the next candidate's
     * approximate score + mean + z sd of the approximation error so far falls below the k-th
     * best exact score (engine/SEARCH.md); ndocs = ndocs_exact = k then. */
    int adaptive;
    float z;
    /* ... and, beside it, until the expected number of the remaining ordered candidates whose
     * exact score beats the k-th best (each one's chance under a normal error of that mean and
     * sd, summed: eng_tail_need) is at most tail_eps. */
    double tail_eps;
    size_t depth_cap; /* adaptive mode: exactly scored documents at most */
    size_t ndocs;
    size_t ndocs_exact;
    uint32_t n_docnos; /* document numbers are below this (the snapshot's next_docno) */
    /* Subset mode: allowed[docno / 64] bit docno % 64, over n_docnos; NULL: all allowed.
     * allowed_list: the allowed live documents in ascending order (n_allowed of them). */
    const uint64_t *allowed;
    const uint32_t *allowed_list;
    size_t n_allowed;
    /* Score the subset's list exactly instead of running PLAID's stages: a subset of at most
     * ndocs documents, or in exhaustive mode one of at most an eighth of the index (cheaper
     * to look up than to walk the whole index past). */
    int subset_exact;
    /* Leave damaged records out instead of failing (tartan_search_params.skip_damaged); each
     * reader then counts them in its *damaged. */
    int skip_damaged;
    /* The bf16 probe table of the centroids (kern_centroid_probe): stage 1 takes each token's
     * probes from it, exactly as from the fp32 table, and stages 2 and 3 read its bf16 scores;
     * the centroids of documents scored exactly get fp32 scores first. NULL: the fp32 table. */
    const kern_probe_table *probe;
    /* Results: query i's hits at hit_doc / hit_score [i * k ...], hit_n[i] of them. */
    uint32_t *hit_doc;
    float *hit_score;
    size_t *hit_n;
} eng_search;

/* Time and work per stage, one per thread, summed at the end. */
typedef struct eng_stage_stats {
    double cand, prune, exact;
    uint64_t n_cand, n_exact, n_probes;
    uint64_t n_damaged; /* damaged records left out (skip_damaged) */
} eng_stage_stats;

/* Adaptive mode: documents of the first exact batch (at least 2k), how much each later batch
 * grows, and how far it goes at most (a multiple of k, at least a floor). */
#define ENG_FIRST_BATCH 32
#define ENG_BATCH_GROWTH 1.5
/* The GPU's batches: the same stopping rule in fewer, larger rounds, since a round there
 * costs ~0.1 ms of launches and a download whatever its size (H200, 200k documents: 9 rounds
 * and p50 1.56 ms at 32 / 1.5, 3 rounds and 0.95 ms at 128 / 3, 4% more exact scores, the
 * same recall; engine/SEARCH.md). */
#define ENG_GPU_FIRST_BATCH 128
#define ENG_GPU_BATCH_GROWTH 3.0
#define ENG_DEPTH_FLOOR 4096
#define ENG_DEPTH_PER_K 64
/* The share of a search's allowed misses (1 - recall target) of its top k that the stopping
 * rule may spend in expectation: tail_eps = ENG_TAIL_SHARE (1 - target) k (the other half goes
 * to probing, engine/calibrate.c COVER_SHARE). */
#define ENG_TAIL_SHARE 0.5

/*
 * The stopping rule's multiplicity bound: with a[0 .. valid) the ordered candidates'
 * approximate scores (descending) of which the first n are scored, theta the k-th best exact
 * score and (mu, sd) the error's mean and standard deviation, each remaining candidate j beats
 * theta with chance p_j = P(N(mu, sd) > theta - a[j]) (sd 0: 1 when a[j] + mu >= theta, else
 * 0). Returns the smallest m in [n, valid] whose tail sum of p_j over [m, valid) is at most
 * eps. Why: the z rule bounds each candidate's chance, not their number; at 1M documents of
 * `tartan gen --model 1` thousands of candidates sat just under its bound and the rule kept
 * 0.947 of the exhaustive top 10 (engine/SEARCH.md).
 */
size_t eng_tail_need(const float *a, size_t n, size_t valid, double theta, double mu, double sd,
                     double eps);

/* Monotonic seconds. */
double eng_now(void);

/* Makes *p (of *cap elements of sz bytes) hold at least n, doubling; 0 or ENOMEM (*p kept). */
int eng_grow(void **p, size_t *cap, size_t n, size_t sz);

/*
 * PLAID (DESIGN.md section 4) for query qi through reader r, which the calling thread alone
 * uses; ws is the thread's workspace (zeroed before the first use, freed with
 * eng_plaid_ws_free), reused across queries so that a batch allocates once per thread. With
 * s->subset_exact the subset's documents are scored exactly instead.
 */
typedef struct eng_plaid_ws eng_plaid_ws;
eng_plaid_ws *eng_plaid_ws_new(void);
void eng_plaid_ws_free(eng_plaid_ws *ws);
int eng_plaid_query(idx_reader *r, const eng_search *s, size_t qi, eng_plaid_ws *ws,
                    eng_stage_stats *st, store_msg *m);

/*
 * Exhaustive: exact scores of every live (and allowed) document for every query, by one pass
 * over the documents per group of queries, read by reader r in the calling thread; scoring
 * runs on threads OpenMP threads.
 */
int eng_exact_scan(idx_reader *r, const eng_search *s, int threads, eng_stage_stats *st,
                   store_msg *m);

/* A subset of at most this many documents is scored exactly, all of it, by a default search
 * (no candidate generation: it would cost more than the scores). */
#define ENG_SUBSET_EXACT_MAX 256

/*
 * A subset by document numbers (ascending, distinct), live in the snapshot whose header had
 * next_docno and n_docs: the calibration's reference, which would otherwise go through its
 * external ids (a check and an LMDB look-up each, every search). A search whose snapshot
 * differs (a writer committed since) keeps the ones still live.
 */
typedef struct eng_docset {
    const uint32_t *docs;
    size_t n;
    uint32_t next_docno;
    uint64_t n_docs;
} eng_docset;

/*
 * tartan_search's body: with calib non-NULL, that calibration instead of the index's (the
 * calibration measures a table before storing it); with only non-NULL (and params->subset
 * NULL), that subset.
 */
struct eng_calib;
int eng_search_call(tartan_db *db, const tartan_queries *queries,
                    const tartan_search_params *params, const struct eng_calib *calib,
                    const eng_docset *only, tartan_results **results);

/* Maps a kernel status to an engine code, with the kernel's message. */
int eng_kern_fail(int krc, store_msg *m, const char *what);

/* For an index of the axes code (r->axes not NULL): points a's query at a rotated copy
 * (*qr, which the caller frees after the kernel) and a's decode tables at the reader's.
 * ENOMEM. */
int eng_axes_query(const idx_reader *r, kern_residual *a, float **qr, store_msg *m);

#endif
