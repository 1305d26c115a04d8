/*
 * kernels_impl.h: what kernels/dispatch.c calls on each device. Private to kernels/.
 * kern_cpu_* live in kernels/ *_cpu.c; kern_gpu_* in kernels/ *.cu (CUDA builds only).
 * Arguments are already checked by dispatch.c (non-NULL, sizes > 0 where required).
 */
#ifndef TARTAN_KERNELS_IMPL_H
#define TARTAN_KERNELS_IMPL_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records the text kern_last_error() returns for this thread (printf-style). */
void kern_set_error(const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 1, 2)))
#endif
    ;

int kern_cpu_maxsim_dense(const kern_dense *a, float *scores);
int kern_cpu_maxsim_varlen(const kern_varlen *a, float *scores);
int kern_cpu_centroid_scores(const float *q, size_t lq, const float *centroids,
                             size_t n_centroids, size_t dim, float *S);
/* kern_cpu_centroid_scores's columns cols [ncols] only, into out [lq, ncols], bit for bit. */
int kern_cpu_centroid_scores_cols(const float *q, size_t lq, const float *centroids, size_t dim,
                                  const uint32_t *cols, size_t ncols, float *out, size_t ld);
int kern_cpu_maxsim_residual(const kern_residual *a, float *scores);
int kern_cpu_centroid_interaction(const float *S, size_t lq, size_t n_centroids,
                                  unsigned code_bytes, const kern_pdoc *docs, size_t nd,
                                  const uint8_t *keep, float *approx);
int kern_cpu_centroid_interaction_t(const float *ST, size_t ld, size_t lq, size_t n_centroids,
                                    unsigned code_bytes, const kern_pdoc *docs, size_t nd,
                                    const uint8_t *keep, float *approx);
int kern_cpu_topk_rows(const float *x, size_t rows, size_t n, size_t k, int64_t *idx,
                       float *val);
int kern_cpu_maxsim_varlen_i8(const kern_varlen_i8 *a, float *scores);
int kern_cpu_quantize_i8(const float *x, size_t n, size_t dim, int8_t *q, float *scales);
int kern_cpu_nearest_centroid(const float *x, size_t n, const float *centroids,
                              size_t n_centroids, size_t dim, int32_t *best, float *best_score);
int kern_cpu_nearest_centroid_bf16(const float *x, size_t n, const float *centroids,
                                   size_t n_centroids, size_t dim, int32_t *best,
                                   float *best_score);
const char *kern_cpu_nearest_centroid_bf16_path(void);
int kern_cpu_nearest_centroid_bf16_pays(void);
int kern_cpu_nearest_centroid_amx(const float *x, size_t n, const float *centroids,
                                  size_t n_centroids, size_t dim, int32_t *best, float *best_score);
/* The fp32 nearest centroid without screening (nearest_cpu.c's micro-kernel loop), and the same
 * answer bit for bit screened on AMX tiles (nearest_amx_cpu.c): the bf16 scores list every
 * centroid that can be the fp32 argmax, which the fp32 products then choose among. n_fp32 (or
 * NULL): how many points the screen left to the fp32 kernel. KERN_ENODEV where AMX is not
 * usable. kern_cpu_nearest_centroid takes the screened path where it pays. */
int kern_cpu_nearest_centroid_fp32(const float *x, size_t n, const float *centroids,
                                   size_t n_centroids, size_t dim, int32_t *best,
                                   float *best_score);
int kern_cpu_nearest_centroid_screened(const float *x, size_t n, const float *centroids,
                                       size_t n_centroids, size_t dim, int32_t *best,
                                       float *best_score, size_t *n_fp32);
/* The same answer screened with int8 products on AVX2 (nearest_i8_cpu.c), for CPUs without
 * AMX. KERN_ENODEV without AVX2 and FMA, at dim 0 or above 2,048, with no centroids, or where a
 * centroid is not finite. */
int kern_cpu_nearest_centroid_screened_i8(const float *x, size_t n, const float *centroids,
                                          size_t n_centroids, size_t dim, int32_t *best,
                                          float *best_score, size_t *n_fp32);
/* What the screens share (nearest_cpu.c). kern_cpu_rescore_list: the fp32 argmax of x over the
 * listed centroids (ascending), with the AVX2 / AVX-512 micro-kernels' products bit for bit;
 * needs FMA. kern_cpu_nearest_flagged: the points flagged in fb through the fp32 kernel, their
 * count in n_fp32 (or NULL). */
void kern_cpu_rescore_list(const float *x, const float *centroids, size_t dim, const int32_t *list,
                           size_t nc, int32_t *best, float *best_score);
int kern_cpu_nearest_flagged(const float *x, size_t n, const float *centroids, size_t n_centroids,
                             size_t dim, int32_t *best, float *best_score, const uint8_t *fb,
                             size_t *n_fp32);
/* Residual-coded MaxSim (as kern_cpu_maxsim_residual) with bf16 products on AMX tiles:
 * approx [nd] and, per document, bound [nd] >= |approx - kern_cpu_maxsim_residual's score|
 * (INFINITY where it cannot say: non-finite inputs). Documents without tokens: approx
 * KERN_EMPTY_SCORE, bound 0. KERN_ENODEV where AMX is not usable. Arguments are checked by
 * kern_maxsim_residual_screen. nearest_amx_cpu.c. */
int kern_cpu_maxsim_residual_amx(const kern_residual *a, float *approx, float *bound);
/* Every document with tokens has its arrays and every code names a centroid (else 0, and the
 * message set, who first). residual_cpu.c. */
int kern_cpu_residual_docs_ok(const kern_residual *a, const char *who);
/* AMX tiles usable by this process (nearest_amx_cpu.c): the CPU has AMX-BF16 and the OS granted the
 * tile state; and not switched off by kern_cpu_use_amx(0) (microkernel_cpu.h). */
int kern_cpu_amx_usable(void);
/* The probe screened on AMX tiles (kern_centroid_probe; nearest_amx_cpu.c). */
int kern_cpu_probe_table_new(const float *centroids, size_t K, size_t dim, kern_probe_table **out);
void kern_cpu_probe_table_free(kern_probe_table *t);
int kern_cpu_probe_table_matches(const kern_probe_table *t, const float *centroids, size_t K,
                                 size_t dim);
int kern_cpu_centroid_probe(const kern_probe_table *t, const float *centroids, const float *q,
                            size_t lq, size_t nc, float *S, float *ST, size_t ld, int64_t *idx,
                            float *val, size_t *n_fp32);

#ifdef TARTAN_HAVE_CUDA
int kern_gpu_maxsim_dense(const kern_dense *a, float *scores);
int kern_gpu_maxsim_varlen(const kern_varlen *a, float *scores);
int kern_gpu_centroid_scores(const float *q, size_t lq, const float *centroids,
                             size_t n_centroids, size_t dim, float *S);
int kern_gpu_maxsim_residual(const kern_residual *a, float *scores);
int kern_gpu_centroid_interaction(const float *S, size_t lq, size_t n_centroids,
                                  unsigned code_bytes, const kern_pdoc *docs, size_t nd,
                                  const uint8_t *keep, float *approx);
int kern_gpu_topk_rows(const float *x, size_t rows, size_t n, size_t k, int64_t *idx,
                       float *val);
int kern_gpu_maxsim_varlen_i8(const kern_varlen_i8 *a, float *scores);
int kern_gpu_quantize_i8(const float *x, size_t n, size_t dim, int8_t *q, float *scales);
/* FP8 (e4m3) MaxSim on the int8 kernel's streaming design, for calls with few query rows: usable
 * where dim is a multiple of 64 up to 256, the embeddings 16-byte aligned and the device sm_89 or
 * later. Offsets NULL: dense, every query lq rows and every document ld tokens. */
int kern_gpu_e4m3_stream_usable(size_t dim, const void *q, const void *d);
int kern_gpu_maxsim_e4m3_stream(const void *q, const int64_t *q_off, size_t nq, size_t lq,
                                const void *d, const int64_t *d_off, size_t nd, size_t ld,
                                size_t dim, float *scores);
/* Nearest centroid on the GPU (kern_nearest_centroid): the bf16 screen below where it is usable
 * and TARTAN_GPU_NEAREST is not "fp32", else the fp32 kernel. nearest_bf16_cuda.cu. */
int kern_gpu_nearest_centroid(const float *x, size_t n, const float *centroids,
                              size_t n_centroids, size_t dim, int32_t *best, float *best_score);
/* The fp32 kernel alone (nearest_cuda.cu): fmaf on the CUDA cores, fused argmax. */
int kern_gpu_nearest_centroid_fp32(const float *x, size_t n, const float *centroids,
                                   size_t n_centroids, size_t dim, int32_t *best,
                                   float *best_score);
/* The fp32 answer bit for bit (index and score), screened on the tensor cores: a bf16 pass
 * keeps each point's best and second-best bf16 scores; where their gap exceeds twice a proven
 * bound on the bf16 error the bf16 best is fp32's and only its score is recomputed. The other
 * points ("open", n_open or NULL) take a second bf16 pass that lists every centroid within
 * that window, and fp32 chooses among the list; a list beyond 32, or anything not finite, goes
 * through kern_gpu_nearest_centroid_fp32 (n_fp32 or NULL: how many). Waits for the device up
 * to twice (to size those passes). KERN_ENODEV where kern_gpu_nearest_bf16_usable(dim) is 0;
 * n at most INT32_MAX. */
int kern_gpu_nearest_centroid_screened(const float *x, size_t n, const float *centroids,
                                       size_t n_centroids, size_t dim, int32_t *best,
                                       float *best_score, size_t *n_open, size_t *n_fp32);
/* The bf16 argmax itself (k-means training; kern_nearest_centroid_bf16): best_score the bf16
 * score. Where the dims are too wide for the tensor-core kernel, the fp32 kernel answers.
 * KERN_ENODEV below sm_80. */
int kern_gpu_nearest_centroid_bf16(const float *x, size_t n, const float *centroids,
                                   size_t n_centroids, size_t dim, int32_t *best,
                                   float *best_score);
/* The tensor-core kernel runs here at this dim: sm_80 or later, the padded dims' point tile
 * fits the device's shared memory (dim up to 512 on sm_80 and sm_90). */
int kern_gpu_nearest_bf16_usable(size_t dim);
/* "mma" where kern_gpu_nearest_centroid_bf16 runs on the tensor cores (sm_80+), else NULL. */
const char *kern_gpu_nearest_centroid_bf16_path(void);
int kern_gpu_device_count(void);
int kern_gpu_set_device(int dev);
int kern_gpu_get_device(int *dev);
int kern_gpu_malloc(void **p, size_t bytes);
void kern_gpu_free(void *p);
int kern_gpu_copy(void *dst, const void *src, size_t bytes, int to_device);
int kern_gpu_sync(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* TARTAN_KERNELS_IMPL_H */
