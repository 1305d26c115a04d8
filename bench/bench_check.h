/*
 * bench_check.h: the GPU benchmarks' way out on a failed call: file, line, the call and its
 * message, exit 1 (a benchmark has nothing to clean up and no result worth keeping then).
 * CK for CUDA runtime calls (include cuda_runtime.h first), KK for the kernels' calls.
 */
#ifndef TARTAN_BENCH_CHECK_H
#define TARTAN_BENCH_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define KK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != KERN_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %d %s\n", __FILE__, __LINE__, #call, rc_,                  \
                    kern_last_error());                                                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
