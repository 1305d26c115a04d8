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
 * [k, dim], L2-normalised on return. niter iterations, at most max_per_centroid training points
 * per centroid (FAISS subsamples beyond), seed for reproducibility. Returns 0 or -1 (err set).
 */
int idx_kmeans_spherical(const float *x, size_t n, size_t dim, size_t k, int niter,
                         int max_per_centroid, uint64_t seed, float *centroids, char *err,
                         size_t errlen);

/*
 * Exact top-n by inner product of x [n, dim] against centroids [k, dim] (FAISS IndexFlatIP):
 * labels [n, topn], scores [n, topn] (either may be NULL). Returns 0 or -1 (err set).
 */
int idx_flat_ip_search(const float *centroids, size_t k, size_t dim, const float *x, size_t n,
                       size_t topn, int64_t *labels, float *scores, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
