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

/*
 * Persistent grids: how many CTAs of kernel fn (threads each, smem bytes of dynamic shared
 * memory) are resident at once on the current device (SMs x CTAs an SM, at least the SM count).
 * The answer is cached per (device, kernel, threads, smem): the occupancy query costs
 * microseconds of host time, which a 20-us call notices. With smem > 0, the kernel's dynamic
 * shared-memory limit is set to smem on the first call for that device.
 */
int kern_resident_ctas(const void *fn, int threads, size_t smem, long long *ctas);

/* The current device's compute capability as 10 * major + minor (90 for sm_90), or -1 where
 * there is no device; cached per device, so that the per-call path checks cost no runtime
 * queries beyond cudaGetDevice. */
int kern_device_cc(void);

/* A persistent grid of at least one CTA, as many as are resident at once, no more than want. */
static inline int kern_persistent_grid(const void *fn, int threads, size_t smem, long long want,
                                       int *blocks)
{
    long long b = 0;
    int rc = kern_resident_ctas(fn, threads, smem, &b);
    if (rc != KERN_OK)
        return rc;
    if (want < 1)
        want = 1;
    *blocks = (int)(want < b ? want : b);
    return KERN_OK;
}

#endif
