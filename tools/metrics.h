/*
 * metrics.h: retrieval measures over one query's ranking, defined as trec_eval defines them
 * (its measures P, recall, map, map_cut, recip_rank, ndcg and ndcg_cut), plus recip_rank
 * with a cutoff (MRR@k), which trec_eval lacks: the reciprocal rank of the first relevant
 * document among the top k, 0 if none.
 *
 * A document is relevant when its judged relevance is at least the relevance level (1 by
 * default, trec_eval's -l). nDCG uses the judged relevance itself as the gain (not
 * 2^rel - 1), discounts rank r by log2(r + 1), and takes the ideal ranking from every judged
 * document with relevance above 0, whatever the level. A query without relevant documents
 * scores 0 on every measure.
 */
#ifndef TARTAN_TOOLS_METRICS_H
#define TARTAN_TOOLS_METRICS_H

#include <stddef.h>

typedef enum tool_measure_kind {
    TOOL_M_P,          /* P.k: relevant in the top k / k */
    TOOL_M_RECALL,     /* recall.k: relevant in the top k / relevant */
    TOOL_M_MAP,        /* map (k = 0) and map_cut.k: average precision */
    TOOL_M_RECIP_RANK, /* recip_rank (k = 0) and recip_rank.k */
    TOOL_M_NDCG,       /* ndcg (k = 0) and ndcg_cut.k */
} tool_measure_kind;

typedef struct tool_measure {
    tool_measure_kind kind;
    long k;        /* cutoff; 0 for none (P and recall always have one) */
    char name[40]; /* trec_eval's output name: "ndcg_cut_10", "P_10", "map", ... */
} tool_measure;

/*
 * tool_measures_parse: a comma-separated list in trec_eval's syntax ("ndcg_cut.10",
 * "ndcg_cut.5,10" for two cutoffs, "recall.100", "P.10", "map", "map_cut.100", "recip_rank",
 * "recip_rank.10", "ndcg") or the short one ("ndcg@10", "recall@100", "p@10", "map@100",
 * "mrr@10", "mrr", case-insensitive). Repeats are dropped.
 *   out: a malloc'ed array of *n measures, in the order given; free() it.
 * Errors: TARTAN_EINVAL (unknown measure, missing or bad cutoff; the message says which),
 * ENOMEM.
 */
int tool_measures_parse(const char *spec, tool_measure **out, size_t *n, char *err, size_t errlen);

/* Relevance values for retrieved documents that the qrels do not judge. */
#define TOOL_REL_UNJUDGED (-1000000L)

/* One query's ranking, ready to be measured. */
typedef struct tool_ranking {
    const long *rel;   /* rel[i]: judged relevance of the document at rank i + 1, or
                          TOOL_REL_UNJUDGED; in trec_eval's order */
    size_t n;          /* documents retrieved */
    const long *ideal; /* judged relevance > 0 of every judged document, descending */
    size_t nideal;
    size_t num_rel; /* judged documents with relevance >= level */
    long level;     /* relevance level (>= 1 in practice) */
} tool_ranking;

/* tool_measure_value: the measure's value for one query. */
double tool_measure_value(const tool_measure *m, const tool_ranking *r);

#endif
