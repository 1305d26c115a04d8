/*
 * scratch_cuda.h: accounting of the device scratch memory the CUDA kernels borrow (private to
 * kernels/ and its tests). Lets a test show that a call's peak device memory stays within its
 * inputs and outputs: every temporary buffer the kernels take goes through kern_scratch.
 */
#ifndef TARTAN_SCRATCH_CUDA_H
#define TARTAN_SCRATCH_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest total of scratch bytes held at once since the last reset, and the reset. */
size_t kern_gpu_scratch_peak(void);
void kern_gpu_scratch_reset_peak(void);

#ifdef __cplusplus
}
#endif

#endif
