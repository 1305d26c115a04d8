/*
 * frag_cuda.cuh: what the mma.sync kernels do with their accumulator fragments (private to
 * kernels/ *.cu). In an m16n8 tile lane (g, t4) holds rows g and g + 8 at the token columns
 * 2 t4 and 2 t4 + 1, so a row's running max is spread over the four lanes of its group.
 */
#ifndef TARTAN_FRAG_CUDA_CUH
#define TARTAN_FRAG_CUDA_CUH

#include <cuda_runtime.h>

/* rmax[mt][h] (row 16 mt + g + 8 h) becomes the max over the four lanes of its row group, in
 * every one of them. */
template <int MT> __device__ __forceinline__ void quad_max_rows(float (&rmax)[MT][2])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float m = rmax[mt][h];
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            rmax[mt][h] = m;
        }
}

#endif
