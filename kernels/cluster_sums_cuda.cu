/*
 * cluster_sums_cuda.cu: k-means's per-cluster sums of points on the GPU, in fixed point and
 * exact (kern_cuda_cluster_sums; index/assign.h's IDX_SUM_SCALE and idx_fixed_point).
 *
 * Why on the GPU: the points of a GPU k-means already live there (index/assign.c keeps them
 * resident), and summing them on the host took 0.2-0.42 s of a 1.2-1.7 s k-means on 2 GPUs at
 * 2M documents (2.66M points, K 65,536, dim 128, 4 iterations), where two ranks share the
 * host's cores. Here it reads the points once (0.7 GB an iteration a GPU) and costs two
 * small copies (the codes up, the sums down).
 *
 * Exactness: each coordinate becomes the integer nearest to v * 2^30, ties to even, and the
 * integers are added with 64-bit integer atomics. Integer addition is associative, so the
 * result does not depend on the order in which the atomics land (two's complement wraps the
 * same way for negative terms whatever the order, and no sum comes near 2^63: see
 * kernels.h). The CPU sums the same integers in doubles, which is exact below 2^53: the two
 * paths give the same numbers bit for bit.
 *
 * Layout: one warp per point, lane l taking dims l, l + 32, ...: each warp-wide load reads 128
 * contiguous bytes of the point and each warp-wide atomic touches 256 contiguous bytes of the
 * cluster's sum (two 128-byte lines), the fewest L2 lines either can touch. Contention is
 * modest: a cluster averages 40 to 256 points of the 1M+ an iteration sums, so two warps rarely
 * add into the same line at once.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <stdint.h>

#include "cuda_check.cuh"

namespace
{

constexpr int THREADS = 256;
/* Each lane loads and converts this many of its dims before it adds any of them, so that all
 * of a point's loads (dim 128: 4 a lane) are in flight at once; the atomics, whose results are
 * not used, then go out without waiting. */
constexpr int UNROLL = 4;

/* IDX_SUM_SCALE (index/assign.h): kernels/ may not include index/, so the constant is repeated;
 * tests/check_index_gpu.c's cluster_sums case fails if the two ever differ. */
constexpr double SUM_SCALE = 1073741824.0; /* 2^30 */

/*
 * The integer idx_fixed_point(v) holds. (double)v * 2^30 is exact: a float's 24-bit
 * significand times a power of two, far inside double's range. idx_fixed_point rounds it to an
 * integer by adding and subtracting 1.5 * 2^52, which in round-to-nearest-even leaves the
 * nearest integer, ties to the even one (1.5 * 2^52 is even, so the sum's parity is the
 * integer's); __double2ll_rn is the same rounding, nearest, ties to even, by definition (the
 * "_rn" mode of the CUDA math API). The same integer then, for |v * 2^30| < 2^51.
 */
__device__ __forceinline__ unsigned long long fixed_point(float v)
{
    return (unsigned long long)__double2ll_rn((double)v * SUM_SCALE);
}

__global__ void __launch_bounds__(THREADS)
    cluster_sums_kernel(const float *__restrict__ x, long long n, int dim,
                        const uint32_t *__restrict__ codes, unsigned long long k,
                        unsigned long long *__restrict__ sums,
                        unsigned long long *__restrict__ counts)
{
    const int lane = threadIdx.x % 32;
    const long long warps = (long long)gridDim.x * (THREADS / 32);
    for (long long i = ((long long)blockIdx.x * THREADS + threadIdx.x) / 32; i < n; i += warps) {
        const uint32_t c = codes[i]; /* one address for the warp: a broadcast */
        if (c >= k)
            continue; /* never from the caller (its codes are checked); no write out of bounds */
        const float *row = x + i * dim;
        unsigned long long *s = sums + (unsigned long long)c * dim;
        for (int j0 = 0; j0 < dim; j0 += 32 * UNROLL) {
            unsigned long long v[UNROLL];
#pragma unroll
            for (int r = 0; r < UNROLL; r++) {
                const int j = j0 + r * 32 + lane;
                v[r] = j < dim ? fixed_point(row[j]) : 0;
            }
#pragma unroll
            for (int r = 0; r < UNROLL; r++) {
                const int j = j0 + r * 32 + lane;
                if (j < dim)
                    atomicAdd(s + j, v[r]);
            }
        }
        if (lane == 0)
            atomicAdd(counts + c, 1ull);
    }
}

} // namespace

extern "C" int kern_cuda_cluster_sums(const float *x, size_t n, size_t dim, const uint32_t *codes,
                                      size_t k, int64_t *sums, int64_t *counts)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    if (!sums || !counts || k == 0 || dim == 0 || dim > INT_MAX || (n && (!x || !codes)) ||
        k > SIZE_MAX / 8 / dim) {
        kern_set_error("cluster_sums (cuda): NULL argument or bad sizes (n %zu, dim %zu, k %zu)", n,
                       dim, k);
        return KERN_EINVAL;
    }
    KERN_CUDA_TRY(cudaMemsetAsync(sums, 0, k * dim * sizeof *sums, 0));
    KERN_CUDA_TRY(cudaMemsetAsync(counts, 0, k * sizeof *counts, 0));
    if (n == 0)
        return KERN_OK;
    int blocks = 0, rc;
    const long long per_block = THREADS / 32; /* points a CTA sums at once */
    if ((rc = kern_persistent_grid((const void *)cluster_sums_kernel, THREADS, 0,
                                   ((long long)n + per_block - 1) / per_block, &blocks)) != KERN_OK)
        return rc;
    cluster_sums_kernel<<<blocks, THREADS>>>(x, (long long)n, (int)dim, codes,
                                             (unsigned long long)k, (unsigned long long *)sums,
                                             (unsigned long long *)counts);
    KERN_CUDA_LAUNCHED("cluster_sums_kernel");
    return KERN_OK;
}
