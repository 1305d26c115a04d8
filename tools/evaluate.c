/* evaluate.c: a run scored against qrels (see evaluate.h for the rules, which are
 * trec_eval's). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "evaluate.h"
#include "tartan.h"

typedef struct ranked {
    double score;
    const char *docid;
    long doc;
} ranked;

/* trec_eval's order: score descending, then docid descending in byte order. */
static int trec_order(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score > y->score)
        return -1;
    if (x->score < y->score)
        return 1;
    return strcmp(y->docid, x->docid);
}

static int by_qid(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int desc_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

/* The ideal gains and the relevant count of qrels query qi. */
static size_t judged_gains(const tool_qrels *qrels, size_t qi, long level, long *ideal,
                           size_t *num_rel)
{
    const tool_qrels_query *qq = &qrels->q[qi];
    size_t n = 0;
    *num_rel = 0;
    for (size_t k = 0; k < qq->n; k++) {
        if (qq->j[k].rel > 0)
            ideal[n++] = qq->j[k].rel;
        if (qq->j[k].rel >= level)
            (*num_rel)++;
    }
    qsort(ideal, n, sizeof *ideal, desc_long);
    return n;
}

int tool_evaluate(const tool_qrels *qrels, const tool_run *run, const tool_measure *m, size_t nm,
                  const tool_eval_opts *opts, tool_eval *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    long level = opts ? opts->level : 1;
    int complete = opts ? opts->complete : 0;
    if (!m || !nm)
        return tool_fail(err, errlen, TARTAN_EINVAL, "evaluation: no measures");

    /* The queries in both, in byte order of their ids (trec_eval's per-query order). */
    size_t nrq = run->qids.n;
    const char **qids = malloc((nrq ? nrq : 1) * sizeof *qids);
    if (!qids)
        return tool_fail(err, errlen, ENOMEM, "evaluation: out of memory");
    size_t nq = 0;
    for (size_t i = 0; i < nrq; i++) {
        const char *id = run->qids.keys[i];
        if (tool_strtab_find(&qrels->qids, id, strlen(id)) >= 0)
            qids[nq++] = id;
    }
    qsort(qids, nq, sizeof *qids, by_qid);
    out->qids = qids;
    out->nq = nq;
    out->nm = nm;
    out->run_only = nrq - nq;
    out->qrels_only = qrels->qids.n - nq;
    out->num_q = complete ? qrels->qids.n : nq;
    if (!out->num_q) {
        tool_eval_free(out);
        return tool_fail(err, errlen, TARTAN_EEMPTY,
                         "evaluation: no query has both results and judgments (do the query "
                         "ids of the run and the qrels match?)");
    }

    size_t maxd = 0, maxj = 0;
    for (size_t i = 0; i < nrq; i++)
        maxd = run->q[i].n > maxd ? run->q[i].n : maxd;
    for (size_t i = 0; i < qrels->qids.n; i++)
        maxj = qrels->q[i].n > maxj ? qrels->q[i].n : maxj;
    out->values = calloc(nq * nm + 1, sizeof *out->values);
    out->mean = calloc(nm, sizeof *out->mean);
    ranked *rk = malloc((maxd + 1) * sizeof *rk);
    long *rel = malloc((maxd + 1) * sizeof *rel);
    long *ideal = malloc((maxj + 1) * sizeof *ideal);
    if (!out->values || !out->mean || !rk || !rel || !ideal) {
        free(rk);
        free(rel);
        free(ideal);
        tool_eval_free(out);
        return tool_fail(err, errlen, ENOMEM, "evaluation: out of memory");
    }

    for (size_t i = 0; i < nq; i++) {
        long rqi = tool_strtab_find(&run->qids, qids[i], strlen(qids[i]));
        long qqi = tool_strtab_find(&qrels->qids, qids[i], strlen(qids[i]));
        const tool_run_query *rq = &run->q[rqi];
        for (size_t k = 0; k < rq->n; k++) {
            rk[k].score = rq->d[k].score;
            rk[k].docid = run->docids.keys[rq->d[k].doc];
        }
        qsort(rk, rq->n, sizeof *rk, trec_order);
        for (size_t k = 0; k < rq->n; k++) {
            long d = tool_strtab_find(&qrels->docids, rk[k].docid, strlen(rk[k].docid));
            const tool_judgment *j = d >= 0 ? tool_qrels_find(qrels, (size_t)qqi, d) : NULL;
            rel[k] = j ? j->rel : TOOL_REL_UNJUDGED;
        }
        tool_ranking r = {.rel = rel, .n = rq->n, .ideal = ideal, .level = level};
        r.nideal = judged_gains(qrels, (size_t)qqi, level, ideal, &r.num_rel);
        for (size_t mi = 0; mi < nm; mi++) {
            double v = tool_measure_value(&m[mi], &r);
            out->values[i * nm + mi] = v;
            out->mean[mi] += v;
        }
    }
    /* Queries judged but absent from the run add empty rankings, which score 0 on every
     * measure: only the divisor changes. */
    for (size_t mi = 0; mi < nm; mi++)
        out->mean[mi] /= (double)out->num_q;
    free(rk);
    free(rel);
    free(ideal);
    return 0;
}

void tool_eval_free(tool_eval *e)
{
    free(e->qids);
    free(e->values);
    free(e->mean);
    memset(e, 0, sizeof *e);
}
