/*
 * centroid_cuda.cu: query x centroid scores S = Q C^T in fp32 on CUDA GPUs (PLAID stage 1 and
 * the q . C[code] table that the residual kernel reads).
 *
 * fp32 on the CUDA cores, not tf32: S is the main term of every residual score, and tf32's
 * 10-bit mantissa would cost more accuracy than the residual codec itself. A 64 x 64 output
 * tile per CTA, both operands staged through shared memory in 16-dim slices, 4 x 4 outputs per
 * thread; the query tile is reused by 64 centroids and each centroid by 64 query rows.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.cuh"

namespace
{

constexpr int TM = 64, TN = 64, TK = 16;

__global__ void __launch_bounds__(256)
    centroid_scores_kernel(const float *__restrict__ Q, const float *__restrict__ C, long long lq,
                           long long nc, long long dim, float *__restrict__ S)
{
    __shared__ float sq[TK][TM + 4];
    __shared__ float sc[TK][TN + 4];
    const long long m0 = (long long)blockIdx.y * TM, n0 = (long long)blockIdx.x * TN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (long long k0 = 0; k0 < dim; k0 += TK) {
        /* 256 threads load 64 x 16 of each operand: 4 elements each, k fastest (coalesced). */
        for (int i = threadIdx.x; i < TM * TK; i += 256) {
            const int r = i / TK, k = i % TK;
            const long long gm = m0 + r, gn = n0 + r, gk = k0 + k;
            sq[k][r] = (gm < lq && gk < dim) ? Q[gm * dim + gk] : 0.f;
            sc[k][r] = (gn < nc && gk < dim) ? C[gn * dim + gk] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = sq[k][ty + 16 * i];
                b[i] = sc[k][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const long long gm = m0 + ty + 16 * i;
        if (gm >= lq)
            continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const long long gn = n0 + tx + 16 * j;
            if (gn < nc)
                S[gm * nc + gn] = acc[i][j];
        }
    }
}

} // namespace

extern "C" int kern_gpu_centroid_scores(const float *q, size_t lq, const float *centroids,
                                        size_t n_centroids, size_t dim, float *S)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    if ((lq + TM - 1) / TM > 65535 || (n_centroids + TN - 1) / TN > 0x7fffffffu) {
        kern_set_error("centroid_scores (cuda): %zu x %zu beyond one launch", lq, n_centroids);
        return KERN_EINVAL;
    }
    dim3 grid((unsigned)((n_centroids + TN - 1) / TN), (unsigned)((lq + TM - 1) / TM));
    centroid_scores_kernel<<<grid, 256>>>(q, centroids, (long long)lq, (long long)n_centroids,
                                          (long long)dim, S);
    KERN_CUDA_LAUNCHED("centroid_scores_kernel");
    return KERN_OK;
}
