/*
 * assign.h: nearest-centroid assignment and spherical k-means on either device (layer prefix
 * idx_). The same index code builds on the CPU and on a CUDA GPU: only these two calls look at
 * the device.
 *
 * Assignment: each point's centroid of greatest inner product. On KERN_DEV_CPU through FAISS
 * (IndexFlatIP, fp32 BLAS); on KERN_DEV_CUDA through kern_nearest_centroid (fp32, scores and
 * argmax fused) over chunks of points, so that device memory stays bounded (the centroids plus
 * 256 MB of points). Both compute the same fp32 products in different orders: they pick the same
 * centroid for every point except where two centroids' scores are within fp32 rounding of each
 * other (a few ulps of 1); the GPU then takes the lower index, FAISS whichever it met first.
 * Codes, residuals and norms follow from the code, so an index encoded on either device is
 * byte-identical apart from such near-ties.
 */
#ifndef TARTAN_INDEX_ASSIGN_H
#define TARTAN_INDEX_ASSIGN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "store.h"

/*
 * codes [n] (and scores [n], the best inner product, when not NULL) of the points x [n, dim]
 * against centroids [k, dim] on dev. Errors: TARTAN_ENODEV (CUDA absent), TARTAN_EDEVICE (a
 * CUDA failure), ENOMEM, TARTAN_ETRAIN (FAISS failed), TARTAN_EINTERNAL (a point placed
 * nowhere: NaN input). n == 0 does nothing.
 */
int idx_assign(kern_dev dev, const float *centroids, size_t k, size_t dim, const float *x, size_t n,
               uint32_t *codes, float *scores, store_msg *m);

/*
 * Spherical k-means with assignment on dev (the CPU build path uses FAISS instead; this one
 * serves the GPU, and runs on the CPU for tests). The rules are the FAISS path's: at most
 * max_per_centroid * k training points (a seeded random subset beyond), k distinct seeded random
 * points as the first centroids, niter Lloyd iterations (assign; each centroid the normalised
 * sum of its points, summed in double in point order). An empty cluster takes the worst-served
 * point (lowest best score, ties to the lower index; the next worst for the next empty one) as
 * its centroid, where FAISS splits a large cluster: both keep all k centroids in use. The same
 * inputs, seed and device give the same centroids whatever the thread count. x [n, dim]
 * L2-normalised, 1 <= k <= n, k <= INT32_MAX; centroids [k, dim] L2-normalised on return.
 * Errors as idx_assign's, and TARTAN_EINVAL for bad sizes.
 */
int idx_kmeans_device(kern_dev dev, const float *x, size_t n, size_t dim, size_t k, int niter,
                      int max_per_centroid, uint64_t seed, float *centroids, store_msg *m);

#endif
