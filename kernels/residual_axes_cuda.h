/*
 * residual_axes_cuda.h: the residual kernels of the axes code (index/axes.h) on CUDA GPUs,
 * private to kernels/residual_cuda.cu (which takes kern_maxsim_residual's and
 * kern_cuda_exact_scores's calls and hands those with axes_dec here) and
 * kernels/residual_axes_cuda.cu.
 */
#ifndef TARTAN_RESIDUAL_AXES_CUDA_H
#define TARTAN_RESIDUAL_AXES_CUDA_H

#include <stdint.h>

#include "kernels.h"

/* One launch's work, in device memory: pair n (of nd) is query n / per_q (or pair_q[n] when
 * that is set; q_off NULL: the one query of lq rows) against docs[cross ? n % per_q : n]. The
 * query's rows are rows [q_off[qi], q_off[qi + 1]) of q [*, dim] (rotated by the code's axes)
 * and the same columns of qcT [n_centroids, ldq] (followed by KERN_CUDA_ST_SLACK readable
 * floats); lq is the most rows of any query. dec and bytes as kern_residual.axes_dec and
 * .axes_bytes; a token's residual takes the sum of bytes. */
typedef struct kern_axes_job {
    int dim, code_bytes, lq;
    const float *q, *qcT;
    long long ldq;
    const int64_t *q_off;
    long long per_q;
    int cross;
    const uint32_t *pair_q;
    long long nq_all; /* queries (the one query: 1) */
    const float *dec;
    unsigned bytes[4];
    int additive; /* dec is additive in the bits (kern_axes_additive): the bit-plane kernels */
    const kern_pdoc *docs;
    long long nd;
    float *scores;
    int path; /* residual_path(): 0 automatic, 1 the MMA kernel (KERN_EINVAL where it has none
                 for the shape), 2 the exact fp32 kernel */
} kern_axes_job;

/* Queues the scores of j's pairs (KERN_EMPTY_SCORE for a document without tokens); who names
 * the caller in errors. */
int kern_gpu_residual_axes(const kern_axes_job *j, const char *who);

#endif
