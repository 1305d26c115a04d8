/*
 * nearest_cuda.cu: each point's nearest centroid by inner product on CUDA GPUs, the scores and
 * the argmax fused (index building: k-means assignment and token encoding).
 *
 * Why fused: at 70 million tokens and 131,072 centroids the score table has 9e12 entries
 * (37 TB in fp32); writing it and reading it back, even in chunks, costs hours of memory
 * traffic, while the products themselves (2 n K d = 2.3e15 FLOP at d 128) take about a minute
 * on the fp32 units. So each CTA keeps 128 points, walks every centroid in tiles of 128, and
 * folds each tile's scores into a running best per point held in registers.
 *
 * fp32 FMAs on the CUDA cores, as in centroid_cuda.cu (no tf32): the CPU path computes the same
 * products in fp32, so both devices pick the same centroid except where two centroids' scores
 * are within fp32 rounding of each other. The tiling is the classic one: 256 threads, 8 x 8
 * outputs per thread, both operands staged through shared memory in 16-dim slices. A thread's
 * 8 rows are 4 at ty * 4 and 4 at 64 + ty * 4 (its columns likewise with tx), so that it reads
 * each operand as two float4 and the 16 threads of a row group read 256 contiguous bytes: the
 * shared-memory reads then cost a quarter of what scalar reads would, which with 64 FMAs per
 * 16 values read keeps the loop on the FMA units rather than on shared memory.
 * Ties: within a thread columns are visited in increasing index and replaced only by a strictly
 * greater score; across threads the reduction prefers the lower index on equal scores; so the
 * lowest index among equal best scores wins, as kernels.h promises.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_check.cuh"
#include "nearest_cuda.cuh"

namespace
{

constexpr int BM = 128, BN = 128, BK = 16, THREADS = 256;

/* The i-th (0..7) of the 8 rows (or columns) that thread coordinate t (0..15) owns in a
 * 128-wide tile: 4 at t * 4, then 4 at 64 + t * 4; rising with i. */
__device__ __forceinline__ int lane_index(int t, int i)
{
    return i < 4 ? t * 4 + i : 64 + t * 4 + (i - 4);
}

/* Two CTAs per SM (at most 128 registers a thread): one CTA alone leaves 8 warps to hide
 * the shared-memory and global latencies. */
__global__ void __launch_bounds__(THREADS, 2)
    nearest_kernel(const float *__restrict__ X, const float *__restrict__ C, long long n,
                   long long nc, long long dim, int *__restrict__ best,
                   float *__restrict__ best_score)
{
    __shared__ __align__(16) float sx[BK][BM + 4];
    __shared__ __align__(16) float sc[BK][BN + 4];
    const long long m0 = (long long)blockIdx.x * BM;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float bs[8];
    int bi[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        bs[i] = -INFINITY;
        bi[i] = -1;
    }
    for (long long n0 = 0; n0 < nc; n0 += BN) {
        float acc[8][8];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[i][j] = 0.f;
        for (long long k0 = 0; k0 < dim; k0 += BK) {
            /* 256 threads load 128 x 16 of each operand, 8 elements each, k fastest. */
            for (int e = threadIdx.x; e < BM * BK; e += THREADS) {
                const int r = e / BK, k = e % BK;
                const long long gm = m0 + r, gn = n0 + r, gk = k0 + k;
                sx[k][r] = (gm < n && gk < dim) ? X[gm * dim + gk] : 0.f;
                sc[k][r] = (gn < nc && gk < dim) ? C[gn * dim + gk] : 0.f;
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < BK; k++) {
                const float4 a0 = *reinterpret_cast<const float4 *>(&sx[k][ty * 4]);
                const float4 a1 = *reinterpret_cast<const float4 *>(&sx[k][64 + ty * 4]);
                const float4 b0 = *reinterpret_cast<const float4 *>(&sc[k][tx * 4]);
                const float4 b1 = *reinterpret_cast<const float4 *>(&sc[k][64 + tx * 4]);
                const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            __syncthreads();
        }
        /* This thread's columns n0 + col(j) rise with j: strict > keeps the lowest. */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const long long gn = n0 + lane_index(tx, j);
            if (gn >= nc)
                continue; /* padding columns scored 0 and must not win */
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (kern_nearest_beats(acc[i][j], (int)gn, bs[i], bi[i])) {
                    bs[i] = acc[i][j];
                    bi[i] = (int)gn;
                }
        }
    }
    /* The 16 threads of one ty hold row row(i)'s candidates; they are lanes
     * 16 (ty % 2) + tx of one warp, so xor-shuffles over 8, 4, 2, 1 stay among them. */
#pragma unroll
    for (int i = 0; i < 8; i++) {
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) {
            const float os = __shfl_xor_sync(0xffffffffu, bs[i], off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi[i], off);
            if (kern_nearest_beats(os, oi, bs[i], bi[i])) {
                bs[i] = os;
                bi[i] = oi;
            }
        }
        const long long gm = m0 + lane_index(ty, i);
        if (tx == 0 && gm < n) {
            best[gm] = bi[i];
            if (best_score)
                best_score[gm] = bi[i] < 0 ? -INFINITY : bs[i];
        }
    }
}

} // namespace

/* The fp32 kernel alone: the reference, the encode path's answer for the points the bf16 screen
 * leaves open (nearest_bf16_cuda.cu), and the whole answer where TARTAN_GPU_NEAREST=fp32. */
extern "C" int kern_gpu_nearest_centroid_fp32(const float *x, size_t n, const float *centroids,
                                              size_t n_centroids, size_t dim, int32_t *best,
                                              float *best_score)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    if ((n + BM - 1) / BM > 0x7fffffffu) {
        kern_set_error("nearest_centroid (cuda): %zu points beyond one launch", n);
        return KERN_EINVAL;
    }
    nearest_kernel<<<(unsigned)((n + BM - 1) / BM), THREADS>>>(
        x, centroids, (long long)n, (long long)n_centroids, (long long)dim, best, best_score);
    KERN_CUDA_LAUNCHED("nearest_kernel");
    return KERN_OK;
}
