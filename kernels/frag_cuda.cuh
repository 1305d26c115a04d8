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

#endif
