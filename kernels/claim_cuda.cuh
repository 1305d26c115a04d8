/*
 * claim_cuda.cuh: work handed out in order from a counter to the warps of a persistent grid
 * (private to the kernels/ *.cu that include it; each gets its own counters).
 *
 * The counters live in device memory for the whole process and start at zero. A launch's warps
 * claim items with kern_claim(); every warp calls kern_claims_done() once (lane 0) when it has
 * claimed its last, and the last warp to do so puts both counters back to zero, so the next
 * launch needs no memset before it (a memset is a launch of its own: microseconds on a 20-us
 * call). Launches that use the counters must not overlap: the kernels run on the legacy
 * default stream, which orders every launch of the process on a device.
 */
#ifndef TARTAN_CLAIM_CUDA_CUH
#define TARTAN_CLAIM_CUDA_CUH

#include <cuda_runtime.h>

static __device__ unsigned long long kern_claim_ctr[2]; /* claims made, warps finished */

/* The next unclaimed ticket: 0, 1, 2, ... across the launch. */
static __device__ __forceinline__ unsigned long long kern_claim(void)
{
    return atomicAdd(&kern_claim_ctr[0], 1ull);
}

/* Lane 0 of every warp of the grid, once, after its last claim (or none). */
static __device__ __forceinline__ void kern_claims_done(void)
{
    const unsigned long long warps = (unsigned long long)gridDim.x * gridDim.y * gridDim.z *
                                     ((blockDim.x * blockDim.y * blockDim.z + 31) / 32);
    if (atomicAdd(&kern_claim_ctr[1], 1ull) == warps - 1) {
        atomicExch(&kern_claim_ctr[0], 0ull);
        atomicExch(&kern_claim_ctr[1], 0ull);
    }
}

#endif
