/*
 * kmeans.h: the FAISS bridge (index/faiss_bridge.cpp, C++ with hidden symbols), callable
 * from C. FAISS exceptions never cross it: each call returns 0 or -1 and fills err.
 */
#ifndef TARTAN_INDEX_KMEANS_H
#define TARTAN_INDEX_KMEANS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Spherical k-means (inner product on L2-normalised vectors) of x [n, dim] into k centroids
 * [k, dim], L2-normalised on return. niter iterations (DESIGN: 4), at most max_per_centroid
 * training points per centroid (DESIGN: 256; FAISS subsamples beyond), seed for
 * reproducibility (the same inputs, seed and thread count give the same centroids). Inputs need
 * not be normalised. k > n is an error, not a clamp: the caller clamps k to its training set.
 * Prints nothing. Returns 0 or -1 (err set, NUL-terminated; err may be NULL).
 */
int idx_kmeans_spherical(const float *x, size_t n, size_t dim, size_t k, int niter,
                         int max_per_centroid, uint64_t seed, float *centroids, char *err,
                         size_t errlen);

/*
 * Exact top-n by inner product of x [n, dim] against centroids [k, dim] (FAISS IndexFlatIP):
 * labels [n, topn], scores [n, topn] (either may be NULL), best first. With topn > k the slots
 * beyond k get label -1 and score -inf. n == 0 does nothing. Returns 0 or -1 (err set).
 */
int idx_flat_ip_search(const float *centroids, size_t k, size_t dim, const float *x, size_t n,
                       size_t topn, int64_t *labels, float *scores, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
