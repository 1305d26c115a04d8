/*
 * cuda_check.cuh: how the CUDA kernels check the runtime's answers and borrow scratch memory.
 * Private to kernels/ *.cu. Every failure becomes KERN_EDEVICE (KERN_ENOMEM for an allocation)
 * with the CUDA error text and the call site in kern_last_error(); nothing exits or prints.
 */
#ifndef TARTAN_CUDA_CHECK_CUH
#define TARTAN_CUDA_CHECK_CUH

#include <cuda_runtime.h>

#include "kernels_impl.h"

/* Records a failed CUDA status; returns the kernel-layer code for it. */
static inline int kern_cuda_fail(cudaError_t e, const char *what, const char *file, int line)
{
    cudaGetLastError(); /* clear a non-sticky error so that later calls do not report it */
    kern_set_error("%s: %s (%s:%d)", what, cudaGetErrorString(e), file, line);
    return e == cudaErrorMemoryAllocation ? KERN_ENOMEM : KERN_EDEVICE;
}

/* Evaluates a CUDA call; on failure records it and returns from the calling function. */
#define KERN_CUDA_TRY(call)                                                                        \
    do {                                                                                           \
        cudaError_t kern_e_ = (call);                                                              \
        if (kern_e_ != cudaSuccess)                                                                \
            return kern_cuda_fail(kern_e_, #call, __FILE__, __LINE__);                             \
    } while (0)

/* After a launch: a bad configuration shows at once in cudaGetLastError. */
#define KERN_CUDA_LAUNCHED(name)                                                                   \
    do {                                                                                           \
        cudaError_t kern_e_ = cudaGetLastError();                                                  \
        if (kern_e_ != cudaSuccess)                                                                \
            return kern_cuda_fail(kern_e_, "launch of " name, __FILE__, __LINE__);                 \
    } while (0)

/*
 * Scratch memory (scratch_cuda.cu): stream-ordered on the default stream and counted, so that
 * tests can bound a call's peak device memory. Free with the size that was asked for.
 */
int kern_scratch(void **p, size_t bytes);
void kern_scratch_free(void *p, size_t bytes);

#endif
