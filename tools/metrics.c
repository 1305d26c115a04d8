/*
 * metrics.c: the measures of metrics.h. Each follows trec_eval's definition (checked against
 * its source and, in tests/check_eval_parity.sh, against pytrec_eval on random runs):
 *   P.k          relevant among the first k / k, even when fewer than k were retrieved;
 *   recall.k     relevant among the first k / relevant judged (0 if none are);
 *   map          sum of precision at each relevant retrieved / relevant judged;
 *   map_cut.k    the same over the first k;
 *   recip_rank   1 / rank of the first relevant retrieved (0 if none);
 *   ndcg_cut.k   DCG@k / IDCG@k, gain = judged relevance (> 0 only), discount log2(rank + 1),
 *                ideal from the judged relevances > 0 in descending order; 0 when IDCG is 0.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "errbuf.h"
#include "metrics.h"
#include "tartan.h"

static size_t cutoff(const tool_measure *m, size_t n)
{
    return m->k > 0 && (size_t)m->k < n ? (size_t)m->k : n;
}

static double dcg(const long *gains, size_t n)
{
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        if (gains[i] > 0)
            sum += (double)gains[i] / log2((double)(i + 2));
    return sum;
}

double tool_measure_value(const tool_measure *m, const tool_ranking *r)
{
    size_t n = cutoff(m, r->n);
    size_t rel = 0;
    switch (m->kind) {
    case TOOL_M_P:
        for (size_t i = 0; i < n; i++)
            rel += r->rel[i] >= r->level;
        return m->k > 0 ? (double)rel / (double)m->k : 0.0;
    case TOOL_M_RECALL:
        if (!r->num_rel)
            return 0.0;
        for (size_t i = 0; i < n; i++)
            rel += r->rel[i] >= r->level;
        return (double)rel / (double)r->num_rel;
    case TOOL_M_MAP: {
        if (!r->num_rel)
            return 0.0;
        double sum = 0.0;
        for (size_t i = 0; i < n; i++)
            if (r->rel[i] >= r->level)
                sum += (double)++rel / (double)(i + 1);
        return sum / (double)r->num_rel;
    }
    case TOOL_M_RECIP_RANK:
        for (size_t i = 0; i < n; i++)
            if (r->rel[i] >= r->level)
                return 1.0 / (double)(i + 1);
        return 0.0;
    case TOOL_M_NDCG: {
        double ideal = dcg(r->ideal, cutoff(m, r->nideal));
        return ideal > 0.0 ? dcg(r->rel, n) / ideal : 0.0;
    }
    }
    return 0.0;
}

/* ---- parsing measure lists ---------------------------------------------------------------- */

static const struct {
    const char *trec;  /* trec_eval's name, used with ".k" */
    const char *alias; /* the short name, used with "@k" */
    tool_measure_kind kind;
    int needs_k;          /* 1: a cutoff is required; 0: optional */
    const char *cut_name; /* trec_eval's name when a cutoff is given */
} names[] = {
    {"P", "p", TOOL_M_P, 1, "P"},
    {"recall", "recall", TOOL_M_RECALL, 1, "recall"},
    {"map", "map", TOOL_M_MAP, 0, "map_cut"},
    {"map_cut", NULL, TOOL_M_MAP, 1, "map_cut"},
    {"recip_rank", "mrr", TOOL_M_RECIP_RANK, 0, "recip_rank"},
    {"ndcg", "ndcg", TOOL_M_NDCG, 0, "ndcg_cut"},
    {"ndcg_cut", NULL, TOOL_M_NDCG, 1, "ndcg_cut"},
};

static int add_measure(tool_measure **v, size_t *n, size_t *cap, int which, long k)
{
    tool_measure m = {.kind = names[which].kind, .k = k};
    if (k > 0)
        snprintf(m.name, sizeof m.name, "%s_%ld", names[which].cut_name, k);
    else
        snprintf(m.name, sizeof m.name, "%s", names[which].trec);
    for (size_t i = 0; i < *n; i++)
        if (!strcmp((*v)[i].name, m.name))
            return 0;
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        tool_measure *nv = realloc(*v, c * sizeof *nv);
        if (!nv)
            return ENOMEM;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = m;
    return 0;
}

static int parse_cutoff(const char *s, size_t len, long *k)
{
    if (!len || len > 9)
        return -1;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v <= 0)
        return -1;
    *k = v;
    return 0;
}

int tool_measures_parse(const char *spec, tool_measure **out, size_t *n, char *err, size_t errlen)
{
    tool_measure *v = NULL;
    size_t nv = 0, cap = 0;
    int last = -1; /* the measure a bare number ("ndcg_cut.5,10") adds a cutoff to */
    int rc = 0;
    *out = NULL;
    *n = 0;
    const char *p = spec ? spec : "";
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len && isspace((unsigned char)*p))
            p++, len--;
        while (len && isspace((unsigned char)p[len - 1]))
            len--;
        long k = 0;
        if (len && isdigit((unsigned char)*p)) {
            if (last < 0 || parse_cutoff(p, len, &k)) {
                rc = tool_fail(err, errlen, TARTAN_EINVAL, "measure list: '%.*s' is not a measure",
                               (int)len, p);
                goto fail;
            }
            rc = add_measure(&v, &nv, &cap, last, k);
        } else if (len) {
            const char *dot = memchr(p, '.', len), *at = memchr(p, '@', len);
            const char *sep = dot ? dot : at;
            size_t nlen = sep ? (size_t)(sep - p) : len;
            int which = -1;
            /* trec_eval's names as it spells them; the short names in any case. */
            for (size_t i = 0; i < sizeof names / sizeof names[0] && which < 0; i++)
                if ((strlen(names[i].trec) == nlen && !strncmp(p, names[i].trec, nlen)) ||
                    (names[i].alias && strlen(names[i].alias) == nlen &&
                     !strncasecmp(p, names[i].alias, nlen)))
                    which = (int)i;
            if (which < 0) {
                rc = tool_fail(err, errlen, TARTAN_EINVAL,
                               "measure list: unknown measure '%.*s' (known: ndcg_cut.K, "
                               "recall.K, P.K, map, map_cut.K, recip_rank[.K], ndcg, or "
                               "ndcg@K, recall@K, p@K, map[@K], mrr[@K])",
                               (int)len, p);
                goto fail;
            }
            if (sep && parse_cutoff(sep + 1, len - nlen - 1, &k)) {
                rc = tool_fail(err, errlen, TARTAN_EINVAL,
                               "measure list: '%.*s' needs a positive whole cutoff", (int)len, p);
                goto fail;
            }
            if (!sep && names[which].needs_k) {
                rc = tool_fail(err, errlen, TARTAN_EINVAL,
                               "measure list: '%.*s' needs a cutoff, as in %s.10", (int)len, p,
                               names[which].trec);
                goto fail;
            }
            rc = add_measure(&v, &nv, &cap, which, k);
            last = sep ? which : -1;
        }
        if (rc) {
            rc = tool_fail(err, errlen, ENOMEM, "measure list: out of memory");
            goto fail;
        }
        p += (e ? (size_t)(e - p) + 1 : strlen(p));
    }
    if (!nv) {
        rc = tool_fail(err, errlen, TARTAN_EINVAL, "measure list: no measure given");
        goto fail;
    }
    *out = v;
    *n = nv;
    return 0;
fail:
    free(v);
    return rc;
}
