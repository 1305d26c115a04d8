/*
 * evaluate.h: scoring a run against qrels, query by query, as trec_eval does:
 *   - the queries scored are those in both the run and the qrels (a query with judgments
 *     but no relevant document counts, and scores 0); run queries without judgments are
 *     skipped; qrels queries missing from the run are skipped too, unless `complete` is set
 *     (trec_eval's -c), where they count as empty rankings (0) in the means;
 *   - each query's documents are ordered by score descending, ties by docid descending (byte
 *     order), whatever the rank column says;
 *   - means are arithmetic over the queries scored (or all qrels queries when complete).
 */
#ifndef TARTAN_TOOLS_EVALUATE_H
#define TARTAN_TOOLS_EVALUATE_H

#include <stddef.h>

#include "metrics.h"
#include "qrels.h"
#include "trec_run.h"

typedef struct tool_eval_opts {
    long level;   /* relevance level: judged relevance >= level is relevant (trec_eval -l) */
    int complete; /* average over every qrels query (trec_eval -c) */
} tool_eval_opts;

typedef struct tool_eval {
    size_t nm;         /* measures */
    size_t nq;         /* queries scored (in the run and the qrels) */
    const char **qids; /* their ids, in byte order; point into the run */
    double *values;    /* values[i * nm + m]: query i, measure m */
    double *mean;      /* mean[m] */
    size_t num_q;      /* queries averaged over: nq, or every qrels query if complete */
    size_t run_only;   /* run queries without judgments (skipped) */
    size_t qrels_only; /* qrels queries without results */
} tool_eval;

/*
 * tool_evaluate: scores run against qrels.
 *   opts: may be NULL (level 1, not complete).
 *   out: filled; free with tool_eval_free. The qrels and run must outlive it.
 * Errors: TARTAN_EINVAL (no measures), TARTAN_EEMPTY (no query in both files, and not
 * complete), ENOMEM.
 */
int tool_evaluate(const tool_qrels *qrels, const tool_run *run, const tool_measure *m, size_t nm,
                  const tool_eval_opts *opts, tool_eval *out, char *err, size_t errlen);

void tool_eval_free(tool_eval *e);

#endif
