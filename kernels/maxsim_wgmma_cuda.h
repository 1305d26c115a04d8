/*
 * maxsim_wgmma_cuda.h: the Hopper (sm_90a) dense MaxSim path for many query rows per document
 * (private to kernels/). maxsim_cuda.cu asks whether a call can take it and hands it over.
 */
#ifndef TARTAN_MAXSIM_WGMMA_CUDA_H
#define TARTAN_MAXSIM_WGMMA_CUDA_H

#include <stdint.h>

/* Input types of the path. */
enum { WG_F16 = 0, WG_BF16 = 1, WG_E4M3 = 2 };

typedef struct wg_dense {
    int dt;  /* WG_F16, WG_BF16 or WG_E4M3 (queries and documents alike) */
    int dim; /* 64, 96 or 128 */
    const void *q;
    const uint8_t *qmask; /* may be NULL */
    long long nq, lq;
    const void *d; /* dense [nd, ld, dim]; no document masks on this path */
    long long nd, ld;
    float *scores; /* [nq, nd] */
} wg_dense;

/* Whether this build and the current device can run a call of this shape on the path; when
 * not, *why says so (for the tuning override that forces the path). */
int kern_wgmma_usable(const wg_dense *a, const char **why);

/* Runs it (usable must have said yes). KERN_OK or a kernel-layer error code. */
int kern_wgmma_maxsim_dense(const wg_dense *a);

#endif
