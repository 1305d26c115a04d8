/*
 * topk.c: top-k selection on the CPU: each row of a score matrix, and a stream of scores
 * pushed in chunks (the search's last step, fed by kernels that score a chunk at a time).
 *
 * Both keep a binary heap of the k best so far with the worst at the root, on two parallel
 * arrays (values, ids), so a score that cannot enter costs one comparison. Order: higher score
 * first, equal scores by lower id first. KERN_EMPTY_SCORE (-inf) and NaN never enter.
 * Heap sort then leaves the k entries best first in place, with no extra memory.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>

#include "kernels_impl.h"

/* Whether (va, ia) ranks before (vb, ib). */
static inline int better(float va, int64_t ia, float vb, int64_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

static inline int eligible(float v)
{
    return !isnan(v) && v != KERN_EMPTY_SCORE;
}

static void sift_down(float *v, int64_t *ix, size_t n, size_t i)
{
    float ev = v[i];
    int64_t ei = ix[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        /* Follow the worse child: the root holds the worst entry. */
        if (c + 1 < n && better(v[c], ix[c], v[c + 1], ix[c + 1]))
            c++;
        if (!better(ev, ei, v[c], ix[c]))
            break;
        v[i] = v[c];
        ix[i] = ix[c];
        i = c;
    }
    v[i] = ev;
    ix[i] = ei;
}

static void sift_up(float *v, int64_t *ix, size_t i)
{
    float ev = v[i];
    int64_t ei = ix[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!better(v[p], ix[p], ev, ei))
            break;
        v[i] = v[p];
        ix[i] = ix[p];
        i = p;
    }
    v[i] = ev;
    ix[i] = ei;
}

/* Offers (s, id) to a heap of *n entries and capacity k. */
static inline void offer(float *v, int64_t *ix, size_t *n, size_t k, float s, int64_t id)
{
    if (*n < k) {
        v[*n] = s;
        ix[*n] = id;
        sift_up(v, ix, (*n)++);
    } else if (better(s, id, v[0], ix[0])) {
        v[0] = s;
        ix[0] = id;
        sift_down(v, ix, k, 0);
    }
}

/* Heap sort: moves the worst to the end each step, leaving the entries best first. */
static void sort_best_first(float *v, int64_t *ix, size_t n)
{
    for (size_t end = n; end > 1; end--) {
        float tv = v[0];
        int64_t ti = ix[0];
        v[0] = v[end - 1];
        ix[0] = ix[end - 1];
        v[end - 1] = tv;
        ix[end - 1] = ti;
        sift_down(v, ix, end - 1, 0);
    }
}

int kern_cpu_topk_rows(const float *x, size_t rows, size_t n, size_t k, int64_t *idx, float *val)
{
#pragma omp parallel for schedule(dynamic, 1) if (rows > 1)
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *v = val + r * k;
        int64_t *ix = idx + r * k;
        size_t cnt = 0, i = 0;
        for (; i < n && cnt < k; i++)
            if (eligible(xr[i]))
                offer(v, ix, &cnt, k, xr[i], (int64_t)i);
        /* The heap is full: a later score enters only when strictly above the root (an equal
         * one has the higher index), so blocks of 16 that hold none go by in one vectorised
         * test (NaN and -inf never pass it). */
        for (; k && i + 16 <= n; i += 16) {
            float root = v[0];
            int any = 0;
            for (size_t j = 0; j < 16; j++)
                any |= xr[i + j] > root;
            if (any)
                for (size_t j = i; j < i + 16; j++)
                    if (eligible(xr[j]))
                        offer(v, ix, &cnt, k, xr[j], (int64_t)j);
        }
        for (; i < n; i++)
            if (eligible(xr[i]))
                offer(v, ix, &cnt, k, xr[i], (int64_t)i);
        sort_best_first(v, ix, cnt);
        for (size_t i = cnt; i < k; i++) {
            v[i] = KERN_EMPTY_SCORE;
            ix[i] = -1;
        }
    }
    return KERN_OK;
}

struct kern_topk {
    size_t k, n;
    int64_t next_id; /* the id a score pushed without ids gets */
    float *v;
    int64_t *ix;
};

kern_topk *kern_topk_new(size_t k)
{
    kern_topk *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->k = k;
    t->v = malloc((k ? k : 1) * sizeof *t->v);
    t->ix = malloc((k ? k : 1) * sizeof *t->ix);
    if (!t->v || !t->ix) {
        kern_topk_free(t);
        return NULL;
    }
    return t;
}

int kern_topk_push(kern_topk *t, const float *scores, const int64_t *ids, size_t n)
{
    if (!t || (n && !scores)) {
        kern_set_error("topk_push: NULL state or scores");
        return KERN_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t id = ids ? ids[i] : t->next_id + (int64_t)i;
        if (eligible(scores[i]))
            offer(t->v, t->ix, &t->n, t->k, scores[i], id);
    }
    if (n)
        t->next_id = (ids ? ids[n - 1] : t->next_id + (int64_t)n - 1) + 1;
    return KERN_OK;
}

size_t kern_topk_take(kern_topk *t, int64_t *idx, float *val)
{
    if (!t)
        return 0;
    sort_best_first(t->v, t->ix, t->n);
    for (size_t i = 0; i < t->n; i++) {
        if (idx)
            idx[i] = t->ix[i];
        if (val)
            val[i] = t->v[i];
    }
    /* Reversed, a best-first array is worst first: a valid heap again, so pushing may go on. */
    for (size_t i = 0, j = t->n ? t->n - 1 : 0; i < j; i++, j--) {
        float tv = t->v[i];
        int64_t ti = t->ix[i];
        t->v[i] = t->v[j];
        t->ix[i] = t->ix[j];
        t->v[j] = tv;
        t->ix[j] = ti;
    }
    return t->n;
}

float kern_topk_threshold(const kern_topk *t)
{
    /* the heap's root is its worst entry */
    return t && t->k && t->n == t->k ? t->v[0] : -INFINITY;
}

void kern_topk_free(kern_topk *t)
{
    if (!t)
        return;
    free(t->v);
    free(t->ix);
    free(t);
}
