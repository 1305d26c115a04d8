/*
 * frag_cuda.cuh: what the mma.sync kernels do with their accumulator fragments (private to
 * kernels/ *.cu). In an m16n8 tile lane (g, t4) holds rows g and g + 8 at the token columns
 * 2 t4 and 2 t4 + 1, so a row's running max is spread over the four lanes of its group.
 */
#ifndef TARTAN_FRAG_CUDA_CUH
#define TARTAN_FRAG_CUDA_CUH

#include <cuda_runtime.h>

/* The max of m over the four lanes of this lane's row group (lanes 4g .. 4g + 3), in each. */
__device__ __forceinline__ float quad_max(float m)
{
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
}

/* The sum of a block's row maxima, in every lane: rmax [mt][h] is the lane's running max of row
 * 16 mt + g + 8 h (of the block's 16 MT rows) over its columns; row r counts where keep(r). */
template <int MT, class K>
__device__ __forceinline__ float rows_max_sum(const float (&rmax)[MT][2], int lane, K keep)
{
    const int g = lane >> 2, t4 = lane & 3;
    float part = 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float m = quad_max(rmax[mt][h]);
            if (t4 == 0 && keep(16 * mt + g + 8 * h))
                part += m;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        part += __shfl_xor_sync(0xffffffffu, part, o);
    return part;
}

#endif
