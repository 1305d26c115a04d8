/*
 * plan.h: how big the training sample and the centroid table are (DESIGN.md section 3).
 */
#ifndef TARTAN_INDEX_PLAN_H
#define TARTAN_INDEX_PLAN_H

#include <stddef.h>

/* Documents sampled for k-means: min(1 + 16 * sqrt(120 * n_docs), n_docs). */
size_t idx_plan_sample_docs(size_t n_docs);

/* Centroids: 2^floor(log2(16 * sqrt(n_embeddings_estimate))), at least 1. Below 128 tokens
 * this exceeds the token count (16 tokens -> 64 centroids), and the sample may hold fewer
 * tokens than the estimate: the caller clamps K to the number of training vectors, since
 * idx_kmeans_spherical refuses k > n. */
size_t idx_plan_centroids(size_t n_embeddings_estimate);

#endif
