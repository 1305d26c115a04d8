/*
 * results_merge.c: tartan_results_merge, the gather step of a sharded search: the shards'
 * results for one batch of queries become the corpus's top k, exactly (MaxSim scores depend
 * only on their document, so a document's score is the same in whichever shard holds it).
 *
 * Per query: every hit of every part, an id that appears more than once kept once with its
 * best score, then ordered by score (descending) and, among equal scores, by id (bytewise
 * ascending), and cut at k. The order depends only on the hits, never on the order of the
 * parts, so a gather that receives the shards' answers in any order writes the same run.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"

typedef struct cand {
    const char *id;
    float score;
} cand;

/* Id ascending, then score descending: the first of each id's run is its best. */
static int by_id(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    if (c)
        return c;
    return (x->score < y->score) - (x->score > y->score);
}

/* Score descending, then id ascending. */
static int by_score(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return strcmp(x->id, y->id);
}

/* Checks one part's shape and its hits before anything is read through them. */
static int check_part(const tartan_results *r, size_t p, size_t nq)
{
    if (!r)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_results_merge: part %zu is NULL", p);
    if (r->n_queries != nq)
        return eng_failf(NULL, TARTAN_EINVAL,
                         "tartan_results_merge: part %zu has %zu queries, part 0 has %zu", p,
                         r->n_queries, nq);
    if (!r->counts || !r->offsets || (!r->hits && r->offsets[nq]))
        return eng_failf(NULL, TARTAN_EINVAL,
                         "tartan_results_merge: part %zu lacks counts, offsets or hits", p);
    for (size_t i = 0; i < nq; i++) {
        if (r->offsets[i] > r->offsets[nq] || r->counts[i] > r->offsets[nq] - r->offsets[i])
            return eng_failf(NULL, TARTAN_EINVAL,
                             "tartan_results_merge: part %zu, query %zu: hits %zu..%zu lie "
                             "outside its %zu hits",
                             p, i, r->offsets[i], r->offsets[i] + r->counts[i], r->offsets[nq]);
        for (size_t j = 0; j < r->counts[i]; j++) {
            const tartan_hit *h = &r->hits[r->offsets[i] + j];
            if (!h->id)
                return eng_failf(NULL, TARTAN_EINVAL,
                                 "tartan_results_merge: part %zu, query %zu, hit %zu: id is NULL",
                                 p, i, j);
            if (isnan(h->score))
                return eng_failf(NULL, TARTAN_EINVAL,
                                 "tartan_results_merge: part %zu, query %zu, hit %zu (id '%s'): "
                                 "score is NaN",
                                 p, i, j, h->id);
        }
    }
    return 0;
}

int tartan_results_merge(const tartan_results *const *parts, size_t n_parts, size_t k,
                         tartan_results **out)
{
    if (!out)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_results_merge: out is NULL");
    *out = NULL;
    if (!parts || n_parts == 0)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_results_merge: no parts");
    if (k == 0 || k > TARTAN_MAX_K)
        return eng_failf(NULL, TARTAN_ERANGE, "tartan_results_merge: k is %zu; it must be 1 to %zu",
                         k, TARTAN_MAX_K);
    size_t nq = parts[0] ? parts[0]->n_queries : 0;
    size_t most = 0;  /* the most hits one query has over all parts */
    size_t bound = 0; /* the most hits the merge can keep: sum over queries of min(k, hits) */
    for (size_t p = 0; p < n_parts; p++) {
        int rc = check_part(parts[p], p, nq);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < nq; i++) {
        size_t n = 0;
        for (size_t p = 0; p < n_parts; p++)
            n += parts[p]->counts[i];
        if (n > most)
            most = n;
        bound += n < k ? n : k;
    }

    /* First pass: each query's merged hits, one after another in kept, until the results'
     * size is known. */
    cand *work = malloc((most ? most : 1) * sizeof *work);
    cand *kept = malloc((bound ? bound : 1) * sizeof *kept);
    size_t *count = malloc((nq ? nq : 1) * sizeof *count);
    if (!work || !kept || !count) {
        free(work);
        free(kept);
        free(count);
        return eng_failf(NULL, ENOMEM, "tartan_results_merge: out of memory for %zu hits", most);
    }
    size_t total = 0, bytes = 0;
    for (size_t i = 0; i < nq; i++) {
        size_t n = 0;
        for (size_t p = 0; p < n_parts; p++) {
            const tartan_results *r = parts[p];
            for (size_t j = 0; j < r->counts[i]; j++) {
                work[n].id = r->hits[r->offsets[i] + j].id;
                work[n].score = r->hits[r->offsets[i] + j].score;
                n++;
            }
        }
        qsort(work, n, sizeof *work, by_id);
        size_t u = 0;
        for (size_t j = 0; j < n; j++)
            if (u == 0 || strcmp(work[u - 1].id, work[j].id))
                work[u++] = work[j];
        qsort(work, u, sizeof *work, by_score);
        count[i] = u < k ? u : k;
        for (size_t j = 0; j < count[i]; j++) {
            kept[total + j] = work[j];
            bytes += strlen(work[j].id) + 1;
        }
        total += count[i];
    }
    free(work);

    /* The results in one allocation, laid out as tartan_search lays out its own (header,
     * counts, offsets, hits, then the ids' bytes), so tartan_results_free frees either. */
    tartan_results *res;
    size_t head = sizeof *res + (2 * nq + 1) * sizeof(size_t);
    head = (head + alignof(tartan_hit) - 1) / alignof(tartan_hit) * alignof(tartan_hit);
    res = malloc(head + total * sizeof(tartan_hit) + bytes);
    if (!res) {
        free(kept);
        free(count);
        return eng_failf(NULL, ENOMEM, "tartan_results_merge: out of memory for %zu hits", total);
    }
    size_t *counts = (size_t *)(res + 1), *offsets = counts + nq;
    tartan_hit *hits = (tartan_hit *)((char *)res + head);
    char *text = (char *)(hits + total);
    memset(res, 0, sizeof *res);
    res->n_queries = nq;
    res->counts = counts;
    res->offsets = offsets;
    res->hits = hits;
    for (size_t p = 0; p < n_parts; p++) {
        const tartan_search_stats *s = &parts[p]->stats;
        res->stats.seconds_candidates += s->seconds_candidates;
        res->stats.seconds_prune += s->seconds_prune;
        res->stats.seconds_exact += s->seconds_exact;
        if (s->seconds_total > res->stats.seconds_total)
            res->stats.seconds_total = s->seconds_total;
        res->stats.n_candidates += s->n_candidates;
        res->stats.n_exact += s->n_exact;
        res->stats.n_probes += s->n_probes;
        res->stats.n_damaged += s->n_damaged;
        /* each part probed with its own index's margin: the widest stands for the merge */
        if (p == 0 || s->probe_margin > res->stats.probe_margin)
            res->stats.probe_margin = s->probe_margin;
        if (p == 0 || s->rerank_z > res->stats.rerank_z)
            res->stats.rerank_z = s->rerank_z;
    }
    size_t h = 0;
    for (size_t i = 0; i < nq; i++) {
        counts[i] = count[i];
        offsets[i] = h;
        for (size_t j = 0; j < count[i]; j++, h++) {
            size_t l = strlen(kept[h].id);
            memcpy(text, kept[h].id, l + 1);
            hits[h].id = text;
            hits[h].score = kept[h].score;
            text += l + 1;
        }
    }
    offsets[nq] = h;
    free(kept);
    free(count);
    *out = res;
    return 0;
}
