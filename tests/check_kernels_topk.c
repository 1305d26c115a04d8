/*
 * check_kernels_topk.c: top-k selection, per row and streamed in chunks, against a sorting
 * reference on scores with many ties, -inf and NaN.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "fixture_kernels.h"
#include "kernels.h"
#include "microkernel_cpu.h"

/* ---- top-k ------------------------------------------------------------------------------- */

typedef struct pair {
    float v;
    int64_t i;
} pair;

static int pair_cmp(const void *a, const void *b)
{
    const pair *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Scores with many ties, some -inf and NaN. */
static void tie_scores(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t r = rnd() % 20;
        x[i] = r == 0 ? -INFINITY : r == 1 ? NAN : (float)(rnd() % 50) - 20.0f;
    }
}

/* The reference: eligible entries sorted best first; returns their count. */
static size_t ref_topk(const float *x, const int64_t *ids, size_t n, pair *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(x[i]) && x[i] != -INFINITY)
            out[m++] = (pair){x[i], ids ? ids[i] : (int64_t)i};
    qsort(out, m, sizeof *out, pair_cmp);
    return m;
}

START_TEST(test_kernels_topk_rows)
{
    rng_init_random();
    static const size_t shapes[][3] = {{5, 1000, 10}, {3, 17, 40}, {1, 100000, 100}, {8, 50, 1}};
    for (size_t s = 0; s < 4; s++) {
        size_t rows = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *x = xcalloc(rows * n, sizeof(float)), *val = xcalloc(rows * k, sizeof(float));
        int64_t *idx = xcalloc(rows * k, sizeof(int64_t));
        pair *ref = xcalloc(n, sizeof(pair));
        tie_scores(x, rows * n);
        poison(val, rows * k);
        for (size_t i = 0; i < rows * k; i++)
            idx[i] = -7;
        ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, x, rows, n, k, idx, val), KERN_OK);
        for (size_t r = 0; r < rows; r++) {
            size_t m = ref_topk(x + r * n, NULL, n, ref);
            for (size_t j = 0; j < k; j++) {
                if (j < m) {
                    ck_assert_int_eq(idx[r * k + j], ref[j].i);
                    ck_assert(val[r * k + j] == ref[j].v);
                } else { /* k larger than the eligible count */
                    ck_assert_int_eq(idx[r * k + j], -1);
                    ck_assert(isinf(val[r * k + j]) && val[r * k + j] < 0);
                }
            }
        }
        free(x);
        free(val);
        free(idx);
        free(ref);
    }
}
END_TEST

START_TEST(test_kernels_topk_stream_chunks)
{
    /* Many chunks of random sizes against one full sort; ids continue across chunks. */
    rng_init_random();
    size_t n = 200000, k = 1000;
    float *x = xcalloc(n, sizeof(float)), *val = xcalloc(k, sizeof(float));
    int64_t *idx = xcalloc(k, sizeof(int64_t));
    pair *ref = xcalloc(n, sizeof(pair));
    tie_scores(x, n);
    kern_topk *t = kern_topk_new(k);
    ck_assert_ptr_nonnull(t);
    for (size_t i = 0; i < n;) {
        size_t c = urnd(0, 5000);
        c = c > n - i ? n - i : c;
        ck_assert_int_eq(kern_topk_push(t, x + i, NULL, c), KERN_OK);
        i += c;
    }
    poison(val, k);
    size_t got = kern_topk_take(t, idx, val);
    size_t m = ref_topk(x, NULL, n, ref);
    ck_assert_uint_eq(got, m < k ? m : k);
    for (size_t j = 0; j < got; j++) {
        ck_assert_int_eq(idx[j], ref[j].i);
        ck_assert(val[j] == ref[j].v);
    }
    /* take leaves the state usable: push more, take again. */
    float more[3] = {1000.0f, -INFINITY, 1000.0f};
    ck_assert_int_eq(kern_topk_push(t, more, NULL, 3), KERN_OK);
    ck_assert_uint_eq(kern_topk_take(t, idx, val), k);
    ck_assert_int_eq(idx[0], (int64_t)n);
    ck_assert_int_eq(idx[1], (int64_t)n + 2);
    ck_assert_int_eq(idx[2], ref[0].i);
    kern_topk_free(t);
    free(x);
    free(val);
    free(idx);
    free(ref);
}
END_TEST

/* kern_topk_threshold: -inf until k scores are held, then the k-th best so far. */
START_TEST(test_kernels_topk_threshold)
{
    rng_init_random();
    size_t n = 6000, k = 50;
    float *x = xcalloc(n, sizeof(float));
    pair *ref = xcalloc(n, sizeof(pair));
    tie_scores(x, n);
    kern_topk *t = kern_topk_new(k);
    ck_assert(kern_topk_threshold(t) == -INFINITY);
    for (size_t i = 0; i < n;) {
        size_t c = urnd(0, 400);
        c = c > n - i ? n - i : c;
        ck_assert_int_eq(kern_topk_push(t, x + i, NULL, c), KERN_OK);
        i += c;
        size_t m = ref_topk(x, NULL, i, ref);
        float want = m >= k ? ref[k - 1].v : -INFINITY;
        ck_assert_msg(kern_topk_threshold(t) == want, "after %zu: %g, want %g", i,
                      kern_topk_threshold(t), want);
    }
    kern_topk_free(t);
    ck_assert(kern_topk_threshold(NULL) == -INFINITY);
    free(x);
    free(ref);
}
END_TEST

START_TEST(test_kernels_topk_stream_ids)
{
    /* Explicit ids, ties to the lower id whatever the push order; k above the count. */
    rng_init_random();
    size_t n = 3000, k = 5000;
    float *x = xcalloc(n, sizeof(float)), *val = xcalloc(k, sizeof(float));
    int64_t *ids = xcalloc(n, sizeof(int64_t)), *idx = xcalloc(k, sizeof(int64_t));
    pair *ref = xcalloc(n, sizeof(pair));
    tie_scores(x, n);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int64_t)((n - i) * 7); /* descending: later pushes hold lower ids */
    kern_topk *t = kern_topk_new(k);
    ck_assert_ptr_nonnull(t);
    for (size_t i = 0; i < n; i += 100)
        ck_assert_int_eq(kern_topk_push(t, x + i, ids + i, 100), KERN_OK);
    poison(val, k);
    size_t got = kern_topk_take(t, idx, val), m = ref_topk(x, ids, n, ref);
    ck_assert_uint_eq(got, m);
    for (size_t j = 0; j < got; j++) {
        ck_assert_int_eq(idx[j], ref[j].i);
        ck_assert(val[j] == ref[j].v);
        ck_assert(isfinite(val[j]));
    }
    /* Consecutive ids continue after the last explicit one. */
    float one = 1e9f;
    ck_assert_int_eq(kern_topk_push(t, &one, NULL, 1), KERN_OK);
    kern_topk_take(t, idx, val);
    ck_assert_int_eq(idx[0], ids[n - 1] + 1);
    kern_topk_free(t);
    free(x);
    free(val);
    free(ids);
    free(idx);
    free(ref);
}
END_TEST

START_TEST(test_kernels_topk_stream_edges)
{
    /* k = 0 takes nothing; only -inf and NaN: nothing; NULL state is harmless. */
    kern_topk *t = kern_topk_new(0);
    ck_assert_ptr_nonnull(t);
    float x[3] = {1, 2, 3};
    ck_assert_int_eq(kern_topk_push(t, x, NULL, 3), KERN_OK);
    ck_assert_uint_eq(kern_topk_take(t, NULL, NULL), 0);
    kern_topk_free(t);
    t = kern_topk_new(4);
    float bad[3] = {-INFINITY, NAN, -INFINITY};
    ck_assert_int_eq(kern_topk_push(t, bad, NULL, 3), KERN_OK);
    int64_t idx[4];
    float val[4];
    ck_assert_uint_eq(kern_topk_take(t, idx, val), 0);
    ck_assert_int_eq(kern_topk_push(t, NULL, NULL, 1), KERN_EINVAL);
    ck_assert_int_eq(kern_topk_push(NULL, x, NULL, 1), KERN_EINVAL);
    ck_assert_int_eq(kern_topk_push(t, NULL, NULL, 0), KERN_OK);
    kern_topk_free(t);
    kern_topk_free(NULL);
    ck_assert_uint_eq(kern_topk_take(NULL, idx, val), 0);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"topk_rows", test_kernels_topk_rows, 0},
        {"topk_stream_chunks", test_kernels_topk_stream_chunks, 0},
        {"topk_threshold", test_kernels_topk_threshold, 0},
        {"topk_stream_ids", test_kernels_topk_stream_ids, 0},
        {"topk_stream_edges", test_kernels_topk_stream_edges, 0},
    };
    return FX_RUN("kernels-topk", cases, 0, 60);
}
