/*
 * plan.c: the training sample and centroid table sizes (DESIGN.md section 3, the figures
 * ColBERTv2 uses).
 */
#include "plan.h"

#include <math.h>

/* ColBERTv2 assumes a typical document of 120 tokens when it sizes the k-means sample. */
#define TYPICAL_DOCLEN 120.0

size_t idx_plan_sample_docs(size_t n_docs)
{
    /* 1 + floor(16 * sqrt(120 * N)) as ColBERTv2 computes it (int() of a positive double), then
     * capped at N. Doubles hold 120 * N exactly up to N ~ 7.5e13 documents. */
    double s = 16.0 * sqrt(TYPICAL_DOCLEN * (double)n_docs);
    double want = 1.0 + floor(s);
    if (want >= (double)n_docs)
        return n_docs;
    return (size_t)want;
}

size_t idx_plan_centroids(size_t n_embeddings_estimate)
{
    double x = 16.0 * sqrt((double)n_embeddings_estimate);
    if (x < 1.0)
        return 1;
    /* floor(log2(x)) through frexp, which is exact (x = m * 2^e, m in [0.5, 1)), where log2()
     * could round a value just below a power of two up to it. */
    int e;
    frexp(x, &e);
    int p = e - 1;
    /* Far beyond any real corpus (2^62 centroids); only keeps the shift defined. */
    if (p > 62)
        p = 62;
    return (size_t)1 << p;
}
