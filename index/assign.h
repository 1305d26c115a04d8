/*
 * assign.h: nearest-centroid assignment and spherical k-means on either device (layer prefix
 * idx_). The same index code builds on the CPU and on a CUDA GPU: only these two calls look at
 * the device.
 *
 * Assignment: each point's centroid of greatest inner product, through kern_nearest_centroid
 * (fp32 scores and argmax fused, ties to the lower index) on either device: on KERN_DEV_CPU
 * over chunks of points with the CPU micro-kernel and OpenMP threads; on KERN_DEV_CUDA over
 * chunks of points uploaded in turn, so that device memory stays bounded (the centroids plus
 * 256 MB of points). Both compute the same fp32 products in different orders: they pick the
 * same centroid for every point except where two centroids' scores are within fp32 rounding of
 * each other (a few ulps of 1). Codes, residuals and norms follow from the code, so an index
 * encoded on either device is byte-identical apart from such near-ties.
 */
#ifndef TARTAN_INDEX_ASSIGN_H
#define TARTAN_INDEX_ASSIGN_H

#include <stddef.h>
#include <stdint.h>

#include "group.h"
#include "kernels.h"
#include "store.h"

/*
 * codes [n] (and scores [n], the best inner product, when not NULL) of the points x [n, dim]
 * against centroids [k, dim] on dev. Errors: TARTAN_ENODEV (CUDA absent), TARTAN_EDEVICE (a
 * CUDA failure), ENOMEM, TARTAN_EINTERNAL (a point placed nowhere: NaN input). n == 0 does nothing.
 */
int idx_assign(kern_dev dev, const float *centroids, size_t k, size_t dim, const float *x, size_t n,
               uint32_t *codes, float *scores, store_msg *m);

/*
 * The centroid sums in fixed point: each coordinate of a point (L2-normalised: |v| <= 1)
 * rounded to a multiple of 2^-30 and kept as an integer in a double. Sums of integers below
 * 2^53 are exact, so a sum does not depend on the order of its terms: not on the thread count,
 * not on how the points are split between the members of a group, not on the order in which the
 * group's sum adds the members' parts (an MPI allreduce's tree). P members thus compute exactly
 * the centroids one process computes from all the points. 2^30 keeps the sums exact for clusters
 * of up to 2^23 (8.4M) points; beyond, they are rounded as ordinary double sums are (a cluster
 * averages max_per_centroid points, 64 in a build). The rounding, 2^-31 at most, is a sixteenth
 * of a float's spacing at a typical coordinate (1/sqrt(128)) and far below the fp16 the index
 * stores its centroids in. kernels/cluster_sums_cuda.cu, which sums on the GPU, repeats the
 * constant (kernels/ cannot include index/); check_index_gpu's cluster_sums compares the two.
 */
#define IDX_SUM_SCALE 1073741824.0

/* v * IDX_SUM_SCALE rounded to the nearest integer, ties to even: nearbyint's result in the
 * default rounding mode (the library never changes it) without a libm call a coordinate.
 * Adding and subtracting 1.5 * 2^52 leaves the integer nearest to x for |x| < 2^51; here |x| is
 * about 2^30 at most, and the product is exact (a float times a power of 2), so a fused
 * multiply-add rounds the same. It needs IEEE double arithmetic as written: -ffast-math would
 * fold it away (configure never passes it; check_index_train compares it with nearbyint). */
static inline double idx_fixed_point(float v)
{
    const double magic = 6755399441055744.0; /* 1.5 * 2^52 */
    return ((double)v * IDX_SUM_SCALE + magic) - magic;
}

/*
 * Spherical k-means with assignment on dev: the build's k-means on both devices (it replaced
 * FAISS's Clustering on the CPU, whose rules it keeps): at most
 * max_per_centroid * k training points (a seeded random subset beyond), k distinct seeded random
 * points as the first centroids, niter Lloyd iterations (assign; each centroid the normalised
 * sum of its points, summed exactly: fixed point in double, IDX_SUM_SCALE). An empty
 * cluster takes the worst-served point (lowest best score, ties to the lower index; the next
 * worst for the next empty one) as its centroid, where FAISS splits a large cluster: both keep
 * all k centroids in use. The same inputs, seed and device give the same centroids whatever the
 * thread count. x [n, dim] L2-normalised, 1 <= k <= n, k <= INT32_MAX; centroids [k, dim]
 * L2-normalised on return. Errors as idx_assign's, and TARTAN_EINVAL for bad sizes. The
 * group of one's idx_kmeans_group.
 *
 * The warm start (on the CPU by default): the first two iterations of niter >= 3 (the first
 * niter - 1 when fewer) assign and sum only one training point of every 4 (a seeded choice in
 * each block of 4 consecutive indices of the group's subset, idx_warm_depth), the others every
 * point; a stride whose share holds fewer than 8 points a centroid gives way to the next
 * narrower one (or to every point). TARTAN_KMEANS_WARM sets a schedule on either device:
 * "I/S[,I/S...]", I iterations on one point of every S, each S a multiple of the next ("0":
 * none; one that does not parse: the default). The same rules for the first centroids, the
 * sums and the refill (its ties by the index in the subset), over the points the iteration
 * assigns.
 *
 * Where idx_kmeans_bf16(dev) says 1, the iterations assign with bf16 products
 * (kern_nearest_centroid_bf16: points and centroids rounded to bf16, fp32 accumulation, on AMX
 * tiles or with AVX512_BF16, or on a CUDA GPU's tensor cores): a point may then join another
 * cluster where two centroids score within bf16 rounding of each other. The update still sums
 * the fp32 points in double, and the result is still independent of the thread count (on a
 * given CPU or GPU). Encoding (idx_assign) always gets fp32's codes (on the GPU screened in
 * bf16 and completed in fp32, see kern_nearest_centroid).
 */
int idx_kmeans_device(kern_dev dev, const float *x, size_t n, size_t dim, size_t k, int niter,
                      int max_per_centroid, uint64_t seed, float *centroids, store_msg *m);

/*
 * The same k-means shared by the members of a group (group.h), each calling it with its own
 * points: x [n + n_skip, dim] whose rows skip [n_skip] (ascending; NULL when n_skip is 0) are
 * left out, the n others being this member's training points; n may be 0. The group's points
 * are the members' in rank order, and every rule above runs over them as over one process's:
 * the subset and the first centroids are seeded selections over the group's indices (each
 * member copies out its own), the assignment runs where the points are (each member on its own
 * device), the clusters' sums and counts are added up over the group (idx_group_sum; exact, so
 * the order of the addition does not matter), and the empty clusters take the group's
 * worst-served points (each member proposes its own, rank 0 chooses). Every member returns the
 * same centroids, bit for bit the ones one process computes from all the points in the same
 * order with the same assignment results (the same device and precision; points whose two best
 * scores tie within rounding may go another way on another device). k, niter,
 * max_per_centroid and seed must be the same on every member. On KERN_DEV_CUDA each member's
 * points stay on its GPU for all iterations when they fit (half its free memory; the
 * environment variable TARTAN_KMEANS_RESIDENT=0 uploads them at every iteration instead, the
 * same centroids, to compare the times), and where they stay, the clusters' sums run there too
 * (kern_cuda_cluster_sums: the same fixed-point integers, added exactly in int64; the
 * environment variable TARTAN_KMEANS_SUMS=cpu sums on the host instead, the same centroids bit
 * for bit). Errors:
 * idx_kmeans_device's on the member where they arose, TARTAN_EGROUP on the others.
 */
int idx_kmeans_group(kern_dev dev, const float *x, size_t n, const size_t *skip, size_t n_skip,
                     size_t dim, size_t k, int niter, int max_per_centroid, uint64_t seed,
                     idx_group *g, float *centroids, store_msg *m);

/*
 * k-means's warm start (assign.c), for a schedule of nlev strides ls [nlev] (widest first,
 * each a multiple of the next, all above 1): level l takes one point of every block of ls[l]
 * consecutive indices of the group's subset, always one of the level l + 1 points of the
 * block's sub-blocks, each choice a hash of the seed, the level and the block. So a level holds
 * a 1 / ls[l] share of every run of indices, whatever their order or period, and the narrower
 * levels hold the wider ones' points. idx_warm_depth: the widest level that holds the point of
 * index id, or nlev where none does.
 */
size_t idx_warm_depth(uint64_t seed, const size_t *ls, size_t nlev, uint64_t id);

/*
 * Where each of np rows goes when the rows come in order of depth (idx_warm_depth of their
 * subset indices first, first + 1, ...), keeping the order of equal depths: dest [np], a
 * permutation; lnp [nlev]: the rows of depth up to l, which then come first. 0, or -1 when out
 * of memory (a byte a row) or nlev is above 4.
 */
int idx_warm_dest(uint64_t seed, const size_t *ls, size_t nlev, uint64_t first, size_t np,
                  size_t *dest, size_t *lnp);

/*
 * Whether idx_kmeans_device on dev assigns in bf16. The environment variable TARTAN_KMEANS_BF16,
 * read at each call: "0" forces fp32 (to compare, or to reproduce the centroids of a build
 * without bf16); "1" takes bf16 wherever kern_nearest_centroid_bf16 runs; unset or anything else
 * takes it where it is faster (kern_nearest_centroid_bf16_pays: AMX, AVX512_BF16 on AMD, or a
 * CUDA GPU of sm_80 or later).
 */
int idx_kmeans_bf16(kern_dev dev);

#endif
