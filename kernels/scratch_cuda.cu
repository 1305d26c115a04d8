/*
 * scratch_cuda.cu: the kernels' temporary device memory, stream-ordered on the default stream
 * (cudaMallocAsync draws on the device's pool, so repeated calls do not pay for cudaMalloc's
 * device-wide synchronisation), with a count of the bytes held for scratch_cuda.h.
 * The count is process-wide and not locked: calls on one device come from one thread at a time.
 */
#include <cuda_runtime.h>

#include "cuda_check.cuh"
#include "scratch_cuda.h"

static size_t held, peak;

int kern_scratch(void **p, size_t bytes)
{
    cudaError_t e = cudaMallocAsync(p, bytes ? bytes : 1, 0);
    if (e != cudaSuccess) {
        *p = NULL;
        return kern_cuda_fail(e, "cudaMallocAsync (scratch)", __FILE__, __LINE__);
    }
    held += bytes;
    if (held > peak)
        peak = held;
    return KERN_OK;
}

void kern_scratch_free(void *p, size_t bytes)
{
    if (!p)
        return;
    cudaFreeAsync(p, 0);
    held -= bytes;
}

extern "C" size_t kern_gpu_scratch_peak(void)
{
    return peak;
}

extern "C" void kern_gpu_scratch_reset_peak(void)
{
    peak = held;
}
