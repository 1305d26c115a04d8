/*
 * nearest_cuda.cuh: the order the nearest-centroid kernels (nearest_cuda.cu, fp32;
 * nearest_bf16_cuda.cu, the tensor cores) pick a centroid by, shared so that both pick the same
 * one among equals (private to the kernels/ *.cu that include it).
 */
#ifndef TARTAN_NEAREST_CUDA_CUH
#define TARTAN_NEAREST_CUDA_CUH

#include <cuda_runtime.h>
#include <math.h>

/* (s, i) beats (bs, bi): a score beats none (bi < 0); a greater score wins; equal ones go to
 * the lower index; a NaN never wins (it is never stored, and a comparison with it is false);
 * i < 0 (no candidate) never beats anything. */
static __device__ __forceinline__ bool kern_nearest_beats(float s, int i, float bs, int bi)
{
    if (i < 0)
        return false;
    if (bi < 0)
        return !isnan(s);
    return s > bs || (s == bs && i < bi);
}

#endif
