/*
 * queries.c: checking a batch of query embeddings at the API boundary and making its
 * L2-normalised fp32 copy, the form every search stage reads. Queries are normalised as
 * documents are (index/batch.c), so that a score is a sum of cosines.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "search.h"

/* Query rows (tokens) from which a batch is prepared by several threads: 8 queries of 32. */
#define PARALLEL_ROWS 256

static float load(const void *p, tartan_dtype t, size_t i)
{
    switch (t) {
    case TARTAN_FLOAT16:
        return kern_f16_to_f32(((const uint16_t *)p)[i]);
    case TARTAN_BFLOAT16:
        return kern_bf16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

/*
 * Row t of the queries (dim values) into row as fp32; returns its sum of squares in double, or
 * NaN when a value is not finite (v - v is NaN exactly then). It was a per-value dtype switch,
 * finiteness test and one serial double sum: about 10 us a 32-token query, a fifth of the host
 * time a batched GPU search spends per query outside the GPUs (bench/RESULTS.md "MPI scaling").
 * Four partial sums keep the adds independent; each stays in double, so the norm is the same
 * to within double rounding.
 */
static double load_row(const void *p, tartan_dtype t, size_t row_i, size_t dim, float *row)
{
    if (t == TARTAN_FLOAT32)
        memcpy(row, (const float *)p + row_i * dim, dim * sizeof(float));
    else
        for (size_t j = 0; j < dim; j++)
            row[j] = load(p, t, row_i * dim + j);
    double a[4] = {0, 0, 0, 0};
    float bad = 0.f;
    size_t j = 0;
    for (; j + 4 <= dim; j += 4)
        for (int u = 0; u < 4; u++) {
            a[u] += (double)row[j + u] * row[j + u];
            bad += row[j + u] - row[j + u];
        }
    for (; j < dim; j++) {
        a[0] += (double)row[j] * row[j];
        bad += row[j] - row[j];
    }
    return bad == 0.f ? (a[0] + a[1]) + (a[2] + a[3]) : NAN;
}

int eng_queries_prepare(const tartan_queries *q, size_t dim, eng_queries *out, store_msg *m)
{
    memset(out, 0, sizeof *out);
    if (q->n_queries == 0)
        return store_fail(m, TARTAN_EEMPTY, "no queries (n_queries is 0)");
    if (q->dtype != TARTAN_FLOAT32 && q->dtype != TARTAN_FLOAT16 && q->dtype != TARTAN_BFLOAT16)
        return store_fail(m, TARTAN_EDTYPE, "queries: unknown dtype %d", (int)q->dtype);
    if (q->dim != dim)
        return store_fail(m, TARTAN_EDIM, "queries have dimension %zu, the index %zu", q->dim, dim);
    if (!q->qlens) {
        if (q->qlen == 0)
            return store_fail(m, TARTAN_EEMPTY, "queries: qlen is 0 (queries without tokens)");
        if (q->qlen > ENG_MAX_QLEN)
            return store_fail(m, TARTAN_ETOOBIG, "queries: qlen %zu is above %u tokens", q->qlen,
                              ENG_MAX_QLEN);
    }
    size_t total = 0;
    for (size_t i = 0; i < q->n_queries; i++) {
        size_t len = q->qlens ? q->qlens[i] : q->qlen;
        if (len == 0)
            return store_fail(m, TARTAN_EEMPTY, "query %zu has no tokens", i);
        if (len > ENG_MAX_QLEN)
            return store_fail(m, TARTAN_ETOOBIG, "query %zu has %zu tokens, above %u", i, len,
                              ENG_MAX_QLEN);
        total += len; /* no overflow: each term is at most 2^16 and n_queries fits memory */
    }
    if (total != q->n_rows)
        return store_fail(m, TARTAN_EINVAL,
                          "queries: n_rows is %zu but the query lengths sum to %zu", q->n_rows,
                          total);
    if (!q->embeddings)
        return store_fail(m, TARTAN_EINVAL, "queries: embeddings is NULL");
    if (total > SIZE_MAX / sizeof(float) / (dim ? dim : 1))
        return store_fail(m, TARTAN_ETOOBIG, "queries: %zu rows of dimension %zu are too many",
                          total, dim);
    out->n = q->n_queries;
    out->dim = dim;
    out->off = malloc((q->n_queries + 1) * sizeof *out->off);
    out->emb = malloc(total * dim * sizeof(float));
    if (!out->off || !out->emb) {
        eng_queries_free(out);
        return store_fail(m, ENOMEM, "out of memory for %zu query tokens", total);
    }
    out->off[0] = 0;
    for (size_t i = 0; i < q->n_queries; i++) {
        size_t len = q->qlens ? q->qlens[i] : q->qlen;
        out->off[i + 1] = out->off[i] + len;
        if (len > out->max_len)
            out->max_len = len;
    }
    /* Rows are independent: a batch's are shared among the caller's OpenMP threads (a GPU
     * search's host time per query is mostly this and the results; one query stays on the
     * calling thread). The first failing row, the lowest, is the one reported. */
    size_t bad = SIZE_MAX;
#pragma omp parallel for schedule(static) reduction(min : bad) if (total >= PARALLEL_ROWS)
    for (size_t t = 0; t < total; t++) {
        float *row = out->emb + t * dim;
        double ss = load_row(q->embeddings, q->dtype, t, dim, row);
        if (!(ss > 0.0)) { /* NaN: a value not finite; 0: all zeros */
            bad = t < bad ? t : bad;
            continue;
        }
        float inv = (float)(1.0 / sqrt(ss));
        for (size_t j = 0; j < dim; j++)
            row[j] *= inv;
    }
    if (bad == SIZE_MAX)
        return 0;
    size_t lo = 0, hi = q->n_queries; /* the query holding row bad: off[lo] <= bad < off[lo + 1] */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (out->off[mid + 1] <= bad)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* The loop left the failing row loaded and unscaled: a value not finite, else all zeros. */
    const float *row = out->emb + bad * dim;
    size_t j = 0;
    while (j < dim && isfinite(row[j]))
        j++;
    int rc = j < dim
                 ? store_fail(m, TARTAN_ENONFINITE, "query %zu: token %zu has %s at dimension %zu",
                              lo, bad - out->off[lo], isnan(row[j]) ? "NaN" : "infinity", j)
                 : store_fail(m, TARTAN_ERANGE,
                              "query %zu: token %zu is all zeros (it has no direction)", lo,
                              bad - out->off[lo]);
    eng_queries_free(out);
    return rc;
}

void eng_queries_free(eng_queries *q)
{
    if (!q)
        return;
    free(q->off);
    free(q->emb);
    q->off = NULL;
    q->emb = NULL;
}
