/*
 * dispatch.c: the device-neutral entry points. Checks arguments once, then hands the call to
 * the CPU or the CUDA implementation. A build without CUDA answers KERN_ENODEV for the GPU.
 */
#include "config.h"

#include "kernels_impl.h"

/* Each call picks its implementation with this: CPU always, CUDA where built. */
#ifdef TARTAN_HAVE_CUDA
#define DISPATCH(dev, cpu_call, gpu_call)                                                      \
    ((dev) == KERN_DEV_CPU ? (cpu_call) : (dev) == KERN_DEV_CUDA ? (gpu_call) : KERN_EINVAL)
#else
#define DISPATCH(dev, cpu_call, gpu_call)                                                      \
    ((dev) == KERN_DEV_CPU ? (cpu_call) : (dev) == KERN_DEV_CUDA ? no_cuda() : KERN_EINVAL)
static int no_cuda(void)
{
    kern_set_error("this build of tartan has no CUDA kernels");
    return KERN_ENODEV;
}
#endif

static int bad(const char *what)
{
    kern_set_error("%s", what);
    return KERN_EINVAL;
}

/* bad() for the messages that name their caller: "who: what". */
static int bad2(const char *who, const char *what)
{
    kern_set_error("%s: %s", who, what);
    return KERN_EINVAL;
}

static int dtype_ok(kern_dtype t)
{
    return t == KERN_F32 || t == KERN_F16 || t == KERN_BF16 || t == KERN_E4M3;
}

int kern_maxsim_dense(kern_dev dev, const kern_dense *a, float *scores)
{
    if (!a || !scores || !dtype_ok(a->dtype) || a->dim == 0)
        return bad("maxsim_dense: NULL argument, unknown dtype or zero dim");
    if (a->nq == 0 || a->nd == 0)
        return KERN_OK;
    if (!a->q || !a->d || a->lq == 0 || a->ld == 0)
        return bad("maxsim_dense: NULL embeddings or zero length");
    return DISPATCH(dev, kern_cpu_maxsim_dense(a, scores), kern_gpu_maxsim_dense(a, scores));
}

int kern_maxsim_varlen(kern_dev dev, const kern_varlen *a, float *scores)
{
    if (!a || !scores || !dtype_ok(a->dtype) || a->dim == 0 || !a->q_off || !a->d_off)
        return bad("maxsim_varlen: NULL argument, unknown dtype or zero dim");
    if (a->nq == 0 || a->nd == 0)
        return KERN_OK;
    if (!a->q || !a->d)
        return bad("maxsim_varlen: NULL embeddings");
    return DISPATCH(dev, kern_cpu_maxsim_varlen(a, scores), kern_gpu_maxsim_varlen(a, scores));
}

int kern_maxsim_varlen_i8(kern_dev dev, const kern_varlen_i8 *a, float *scores)
{
    if (!a || !scores || a->dim == 0 || !a->q_off || !a->d_off)
        return bad("maxsim_varlen_i8: NULL argument or zero dim");
    if (a->nq == 0 || a->nd == 0)
        return KERN_OK;
    if (!a->q || !a->d || !a->q_scale || !a->d_scale)
        return bad("maxsim_varlen_i8: NULL embeddings or scales");
    return DISPATCH(dev, kern_cpu_maxsim_varlen_i8(a, scores),
                    kern_gpu_maxsim_varlen_i8(a, scores));
}

int kern_quantize_i8(kern_dev dev, const float *x, size_t n, size_t dim, int8_t *q, float *scales)
{
    if (!x || !q || !scales || dim == 0)
        return bad("quantize_i8: NULL argument or zero dim");
    if (n == 0)
        return KERN_OK;
    return DISPATCH(dev, kern_cpu_quantize_i8(x, n, dim, q, scales),
                    kern_gpu_quantize_i8(x, n, dim, q, scales));
}

int kern_centroid_scores(kern_dev dev, const float *q, size_t lq, const float *centroids,
                         size_t n_centroids, size_t dim, float *S)
{
    if (!q || !centroids || !S || dim == 0)
        return bad("centroid_scores: NULL argument or zero dim");
    if (lq == 0 || n_centroids == 0)
        return KERN_OK;
    return DISPATCH(dev, kern_cpu_centroid_scores(q, lq, centroids, n_centroids, dim, S),
                    kern_gpu_centroid_scores(q, lq, centroids, n_centroids, dim, S));
}

int kern_centroid_scores_cols(kern_dev dev, const float *q, size_t lq, const float *centroids,
                              size_t dim, const uint32_t *cols, size_t ncols, float *out, size_t ld)
{
    if (!q || !centroids || !out || dim == 0 || (ncols && !cols) || ld < lq)
        return bad("centroid_scores_cols: NULL argument, zero dim or ld under lq");
    if (dev != KERN_DEV_CPU) {
        kern_set_error("centroid_scores_cols: CPU only");
        return KERN_ENODEV;
    }
    if (lq == 0 || ncols == 0)
        return KERN_OK;
    return kern_cpu_centroid_scores_cols(q, lq, centroids, dim, cols, ncols, out, ld);
}

int kern_probe_table_new(kern_dev dev, const float *centroids, size_t n_centroids, size_t dim,
                         kern_probe_table **out)
{
    if (!out)
        return bad("probe_table: NULL argument");
    *out = NULL;
    if (!centroids || dim == 0 || n_centroids == 0)
        return bad("probe_table: NULL centroids, zero dim or no centroids");
    if (dev != KERN_DEV_CPU) {
        kern_set_error("probe_table: CPU only");
        return KERN_ENODEV;
    }
    return kern_cpu_probe_table_new(centroids, n_centroids, dim, out);
}

void kern_probe_table_free(kern_probe_table *t)
{
    kern_cpu_probe_table_free(t);
}

int kern_probe_table_matches(const kern_probe_table *t, const float *centroids, size_t n_centroids,
                             size_t dim)
{
    return t && centroids && kern_cpu_probe_table_matches(t, centroids, n_centroids, dim);
}

int kern_centroid_probe(kern_dev dev, const kern_probe_table *t, const float *centroids,
                        const float *q, size_t lq, size_t nc, float *S, float *ST, size_t ld,
                        int64_t *idx, float *val, size_t *n_fp32)
{
    if (!t || !centroids || !q || !S || !idx || !val)
        return bad("centroid_probe: NULL argument");
    if (ST && ld < (lq + 15) / 16 * 16)
        return bad("centroid_probe: ld under lq rounded up to 16");
    if (dev != KERN_DEV_CPU) {
        kern_set_error("centroid_probe: CPU only");
        return KERN_ENODEV;
    }
    if (lq == 0) {
        if (n_fp32)
            *n_fp32 = 0;
        return KERN_OK;
    }
    return kern_cpu_centroid_probe(t, centroids, q, lq, nc, S, ST, ld, idx, val, n_fp32);
}

int kern_nearest_centroid(kern_dev dev, const float *x, size_t n, const float *centroids,
                          size_t n_centroids, size_t dim, int32_t *best, float *best_score)
{
    if (!x || !centroids || !best || dim == 0)
        return bad("nearest_centroid: NULL argument or zero dim");
    if (n_centroids == 0 || n_centroids > INT32_MAX)
        return bad("nearest_centroid: the number of centroids must be 1 to INT32_MAX");
    if (n == 0)
        return KERN_OK;
    return DISPATCH(dev,
                    kern_cpu_nearest_centroid(x, n, centroids, n_centroids, dim, best, best_score),
                    kern_gpu_nearest_centroid(x, n, centroids, n_centroids, dim, best, best_score));
}

int kern_nearest_centroid_bf16(kern_dev dev, const float *x, size_t n, const float *centroids,
                               size_t n_centroids, size_t dim, int32_t *best, float *best_score)
{
    if (!x || !centroids || !best || dim == 0)
        return bad("nearest_centroid_bf16: NULL argument or zero dim");
    if (n_centroids == 0 || n_centroids > INT32_MAX)
        return bad("nearest_centroid_bf16: the number of centroids must be 1 to INT32_MAX");
    if (n == 0)
        return KERN_OK;
    return DISPATCH(
        dev, kern_cpu_nearest_centroid_bf16(x, n, centroids, n_centroids, dim, best, best_score),
        kern_gpu_nearest_centroid_bf16(x, n, centroids, n_centroids, dim, best, best_score));
}

const char *kern_nearest_centroid_bf16_path(kern_dev dev)
{
    if (dev == KERN_DEV_CPU)
        return kern_cpu_nearest_centroid_bf16_path();
#ifdef TARTAN_HAVE_CUDA
    if (dev == KERN_DEV_CUDA)
        return kern_gpu_nearest_centroid_bf16_path();
#endif
    return NULL;
}

int kern_nearest_centroid_bf16_pays(kern_dev dev)
{
    if (dev == KERN_DEV_CPU)
        return kern_cpu_nearest_centroid_bf16_pays();
    /* The tensor cores' bf16 rate is 8x or more the CUDA cores' fp32 (sm_80, sm_90). */
    return kern_nearest_centroid_bf16_path(dev) != NULL;
}

int kern_axes_additive(const float *dec, const unsigned bytes[4])
{
    if (!dec || !bytes)
        return 0;
    static const unsigned per_of[4] = {1, 2, 4, 8};
    size_t floats = 0;
    for (int k = 0; k < 4; k++)
        floats += (size_t)bytes[k] * 256 * per_of[k];
    float big = 0.0f;
    for (size_t i = 0; i < floats; i++) {
        if (!isfinite(dec[i]))
            return 0;
        big = fmaxf(big, fabsf(dec[i]));
    }
    const double tol = 1e-5 * (double)big;
    const float *t = dec;
    for (int k = 0; k < 4; k++)
        for (unsigned p = 0; p < bytes[k]; p++, t += 256 * per_of[k]) {
            const unsigned per = per_of[k];
            for (unsigned v = 1; v < 256; v++)
                for (unsigned i = 0; i < per; i++) {
                    double s = t[i];
                    for (unsigned b = 0; b < 8; b++)
                        if (v >> b & 1u)
                            s += (double)t[(1u << b) * per + i] - t[i];
                    if (fabs(s - t[v * per + i]) > tol)
                        return 0;
                }
        }
    return 1;
}

/* kern_maxsim_residual's checks of its arguments (then nd == 0 or docs non-NULL). */
static int residual_args(const kern_residual *a, const float *scores, const char *who)
{
    if (!a || !scores || !a->q || (!a->qc && !a->qcT) || (!a->bucket_weights && !a->axes_dec) ||
        a->dim == 0)
        return bad2(who, "NULL argument or zero dim");
    if (a->qcT && a->ld < (a->lq + 31) / 32 * 32)
        return bad2(who, "the transposed table's ld is under lq rounded up to 32");
    if (a->axes_dec) {
        size_t dims = (size_t)a->axes_bytes[0] + 2 * (size_t)a->axes_bytes[1] +
                      4 * (size_t)a->axes_bytes[2] + 8 * (size_t)a->axes_bytes[3];
        if (dims > a->dim)
            return bad2(who, "the axes code's bytes decode to more dims than dim");
    } else if (!(a->nbits == 1 || a->nbits == 2 || a->nbits == 4 || a->nbits == 8) ||
               (a->dim * a->nbits) % 8 != 0)
        return bad2(who, "nbits must be 1, 2, 4 or 8 and dim * nbits a multiple of 8");
    if (a->code_bytes != 2 && a->code_bytes != 4)
        return bad2(who, "code_bytes must be 2 or 4");
    if (a->nd && !a->docs)
        return bad2(who, "NULL documents");
    return KERN_OK;
}

int kern_maxsim_residual(kern_dev dev, const kern_residual *a, float *scores)
{
    int rc = residual_args(a, scores, "maxsim_residual");
    if (rc || a->nd == 0)
        return rc;
    if (dev != KERN_DEV_CPU && !a->qc)
        return bad("maxsim_residual: the GPU kernel reads qc, not qcT");
    return DISPATCH(dev, kern_cpu_maxsim_residual(a, scores), kern_gpu_maxsim_residual(a, scores));
}

int kern_maxsim_residual_screen(kern_dev dev, const kern_residual *a, float *approx, float *bound)
{
    int rc = residual_args(a, approx, "maxsim_residual_screen");
    if (rc)
        return rc;
    if (!bound || !a->qc)
        return bad("maxsim_residual_screen: NULL bound or qc");
    if (dev != KERN_DEV_CPU || !kern_cpu_amx_usable()) {
        kern_set_error("maxsim_residual_screen: needs AMX tiles on the CPU");
        return KERN_ENODEV;
    }
    if (a->axes_dec) {
        kern_set_error("maxsim_residual_screen: the screen does not read the axes code");
        return KERN_ENODEV;
    }
    if (a->nd == 0 || a->lq == 0) {
        for (size_t i = 0; i < a->nd; i++) {
            approx[i] = a->lq ? KERN_EMPTY_SCORE : 0.0f; /* lq 0: every score is the empty sum */
            bound[i] = 0;
        }
        return KERN_OK;
    }
    if (!kern_cpu_residual_docs_ok(a, "maxsim_residual_screen"))
        return KERN_EINVAL;
    return kern_cpu_maxsim_residual_amx(a, approx, bound);
}

int kern_residual_mma_dim(size_t dim, int axes)
{
    /* The axes code: residual_axes_cuda.cu's mma_fits asks this. The scalar code:
     * residual_cuda.cu's run_residual (64, 96, 128, 256, and big_dim's 320 to 768). */
    if (dim == 64 || dim == 96 || dim == 128)
        return 1;
    return !axes && (dim == 256 || dim == 320 || dim == 384 || dim == 512 || dim == 768);
}

int kern_maxsim_residual_screen_usable(kern_dev dev)
{
    return dev == KERN_DEV_CPU && kern_cpu_amx_usable();
}

int kern_centroid_interaction_t(kern_dev dev, const float *ST, size_t ld, size_t lq,
                                size_t n_centroids, unsigned code_bytes, const kern_pdoc *docs,
                                size_t nd, const uint8_t *keep, float *approx)
{
    if (!ST || !approx || (code_bytes != 2 && code_bytes != 4) || ld < (lq + 15) / 16 * 16)
        return bad("centroid_interaction_t: NULL argument, code_bytes not 2 or 4, or ld under lq "
                   "rounded up to 16");
    if (dev != KERN_DEV_CPU) {
        kern_set_error("centroid_interaction_t: CPU only");
        return KERN_ENODEV;
    }
    if (nd == 0)
        return KERN_OK;
    if (!docs)
        return bad("centroid_interaction_t: NULL documents");
    return kern_cpu_centroid_interaction_t(ST, ld, lq, n_centroids, code_bytes, docs, nd, keep,
                                           approx);
}

int kern_centroid_interaction(kern_dev dev, const float *S, size_t lq, size_t n_centroids,
                              unsigned code_bytes, const kern_pdoc *docs, size_t nd,
                              const uint8_t *keep, float *approx)
{
    if (!S || !approx || (code_bytes != 2 && code_bytes != 4))
        return bad("centroid_interaction: NULL argument or code_bytes not 2 or 4");
    if (nd == 0)
        return KERN_OK;
    if (!docs)
        return bad("centroid_interaction: NULL documents");
    return DISPATCH(
        dev, kern_cpu_centroid_interaction(S, lq, n_centroids, code_bytes, docs, nd, keep, approx),
        kern_gpu_centroid_interaction(S, lq, n_centroids, code_bytes, docs, nd, keep, approx));
}

int kern_topk_rows(kern_dev dev, const float *x, size_t rows, size_t n, size_t k, int64_t *idx,
                   float *val)
{
    if (!x || !idx || !val)
        return bad("topk_rows: NULL argument");
    if (rows == 0 || k == 0)
        return KERN_OK;
    return DISPATCH(dev, kern_cpu_topk_rows(x, rows, n, k, idx, val),
                    kern_gpu_topk_rows(x, rows, n, k, idx, val));
}

int kern_cuda_device_count(void)
{
#ifdef TARTAN_HAVE_CUDA
    return kern_gpu_device_count();
#else
    return 0;
#endif
}

int kern_cuda_set_device(int dev)
{
    return DISPATCH(KERN_DEV_CUDA, KERN_EINVAL, kern_gpu_set_device(dev));
}

int kern_cuda_get_device(int *dev)
{
    *dev = 0;
    return DISPATCH(KERN_DEV_CUDA, KERN_EINVAL, kern_gpu_get_device(dev));
}

int kern_cuda_malloc(void **p, size_t bytes)
{
    return DISPATCH(KERN_DEV_CUDA, KERN_EINVAL, kern_gpu_malloc(p, bytes));
}

void kern_cuda_free(void *p)
{
#ifdef TARTAN_HAVE_CUDA
    kern_gpu_free(p);
#else
    (void)p;
#endif
}

int kern_cuda_upload(void *dst, const void *src, size_t bytes)
{
    return DISPATCH(KERN_DEV_CUDA, KERN_EINVAL, kern_gpu_copy(dst, src, bytes, 1));
}

int kern_cuda_download(void *dst, const void *src, size_t bytes)
{
    return DISPATCH(KERN_DEV_CUDA, KERN_EINVAL, kern_gpu_copy(dst, src, bytes, 0));
}

int kern_cuda_sync(void)
{
    return DISPATCH(KERN_DEV_CUDA, KERN_EINVAL, kern_gpu_sync());
}

/* The CUDA-only calls (k-means's cluster sums, the GPU search pipeline) in a build without
 * CUDA. */
#ifndef TARTAN_HAVE_CUDA
int kern_cuda_cluster_sums(const float *x, size_t n, size_t dim, const uint32_t *codes, size_t k,
                           int64_t *sums, int64_t *counts)
{
    (void)x, (void)n, (void)dim, (void)codes, (void)k, (void)sums, (void)counts;
    return no_cuda();
}

int kern_cuda_centroid_scores_f16(const uint16_t *c16, size_t K, const float *tokens, size_t nt,
                                  size_t dim, float *ST, uint16_t *ST16, unsigned *colbest,
                                  const int32_t *blk, unsigned *tilekey)
{
    (void)c16, (void)K, (void)tokens, (void)nt, (void)dim, (void)ST, (void)ST16, (void)colbest;
    (void)blk, (void)tilekey;
    return no_cuda();
}

int kern_cuda_table_blk(const int64_t *q_off, size_t nq, size_t nt, int32_t *blk)
{
    (void)q_off, (void)nq, (void)nt, (void)blk;
    return no_cuda();
}

int kern_cuda_interaction_h16(const float *ST, const uint16_t *ST16, size_t n_centroids, size_t ld,
                              const int64_t *q_off, const int64_t *h_q_off, size_t nq,
                              const int64_t *doc_off, const uint32_t *codes, const uint32_t *docs,
                              size_t width, int prune, const int64_t *counts, int64_t prune_over,
                              float threshold, float *approx)
{
    (void)ST, (void)ST16, (void)n_centroids, (void)ld, (void)q_off, (void)h_q_off, (void)nq;
    (void)doc_off, (void)codes, (void)docs, (void)width, (void)prune, (void)counts;
    (void)prune_over, (void)threshold, (void)approx;
    return no_cuda();
}

int kern_cuda_centroid_scores_f16_i8(const uint16_t *c16, size_t K, const float *tokens, size_t nt,
                                     size_t dim, float *ST, int8_t *ST8, unsigned *colbest,
                                     const int32_t *blk, unsigned *tilekey)
{
    (void)c16, (void)K, (void)tokens, (void)nt, (void)dim, (void)ST, (void)ST8, (void)colbest;
    (void)blk, (void)tilekey;
    return no_cuda();
}

int kern_cuda_interaction_i8(const float *ST, const int8_t *ST8, size_t n_centroids, size_t ld,
                             const int64_t *q_off, const int64_t *h_q_off, size_t nq,
                             const int64_t *doc_off, const uint32_t *codes, const uint32_t *docs,
                             size_t width, int prune, const int64_t *counts, int64_t prune_over,
                             float threshold, float *approx)
{
    (void)ST, (void)ST8, (void)n_centroids, (void)ld, (void)q_off, (void)h_q_off, (void)nq;
    (void)doc_off, (void)codes, (void)docs, (void)width, (void)prune, (void)counts;
    (void)prune_over, (void)threshold, (void)approx;
    return no_cuda();
}

int kern_cuda_probe(const float *ST, size_t K, size_t ld, size_t ncells, float margin,
                    const float *col_margin, const unsigned *colbest, const unsigned *tilekey,
                    int32_t *probes)
{
    (void)ST, (void)K, (void)ld, (void)ncells, (void)margin, (void)col_margin, (void)colbest;
    (void)tilekey, (void)probes;
    return no_cuda();
}

int kern_cuda_round_pairs(const uint32_t *in, size_t width, const int64_t *lo, const int64_t *poff,
                          size_t nq, size_t n_pairs, uint32_t *docs, uint32_t *pair_q)
{
    (void)in, (void)width, (void)lo, (void)poff, (void)nq, (void)n_pairs, (void)docs, (void)pair_q;
    return no_cuda();
}

int kern_cuda_round_scatter(const float *scores, const uint32_t *pair_q, size_t n_pairs,
                            const int64_t *lo, const int64_t *poff, float *E, size_t ldE)
{
    (void)scores, (void)pair_q, (void)n_pairs, (void)lo, (void)poff, (void)E, (void)ldE;
    return no_cuda();
}

int kern_cuda_take_columns(const uint32_t *in, size_t width, size_t c0, size_t c1,
                           const int64_t *lo, const int64_t *hi, size_t nq, uint32_t *out)
{
    (void)in, (void)width, (void)c0, (void)c1, (void)lo, (void)hi, (void)nq, (void)out;
    return no_cuda();
}

int kern_cuda_scatter_columns(const float *in, size_t w, size_t c0, const int64_t *lo,
                              const int64_t *hi, size_t nq, float *E, size_t ldE)
{
    (void)in, (void)w, (void)c0, (void)lo, (void)hi, (void)nq, (void)E, (void)ldE;
    return no_cuda();
}

int kern_cuda_adaptive_next(const float *E, size_t ldE, const float *sorted, size_t lds,
                            const int64_t *done, const int64_t *counts, size_t nq, size_t k,
                            float z, double eps, double growth, size_t cap, int64_t *next)
{
    (void)E, (void)ldE, (void)sorted, (void)lds, (void)done, (void)counts, (void)nq, (void)k;
    (void)z, (void)eps, (void)growth, (void)cap, (void)next;
    return no_cuda();
}

int kern_cuda_candidates_mark(const int32_t *probes, size_t ncells, const int64_t *q_off,
                              const int64_t *h_q_off, size_t nq, const int64_t *ivf_off,
                              const uint32_t *ivf_docs, const uint32_t *live,
                              const uint32_t *allowed, size_t words, uint32_t *bits,
                              int64_t *counts)
{
    (void)probes, (void)ncells, (void)q_off, (void)h_q_off, (void)nq, (void)ivf_off;
    (void)ivf_docs, (void)live, (void)allowed, (void)words, (void)bits, (void)counts;
    return no_cuda();
}

int kern_cuda_candidates_take(uint32_t *bits, size_t nq, size_t words, uint32_t *docs,
                              size_t width)
{
    (void)bits, (void)nq, (void)words, (void)docs, (void)width;
    return no_cuda();
}

int kern_cuda_interaction(const float *ST, size_t n_centroids, size_t ld, const int64_t *q_off,
                          const int64_t *h_q_off, size_t nq, const int64_t *doc_off,
                          const uint32_t *codes, const uint32_t *docs, size_t width, int prune,
                          const int64_t *counts, int64_t prune_over, float threshold,
                          float *approx)
{
    (void)counts, (void)prune_over, (void)n_centroids;
    (void)ST, (void)ld, (void)q_off, (void)h_q_off, (void)nq, (void)doc_off, (void)codes;
    (void)docs, (void)width, (void)prune, (void)threshold, (void)approx;
    return no_cuda();
}

int kern_cuda_gather_docs(const uint32_t *in, size_t width, const int64_t *sel, size_t nq,
                          size_t k, uint32_t *out)
{
    (void)in, (void)width, (void)sel, (void)nq, (void)k, (void)out;
    return no_cuda();
}

int kern_cuda_exact_scores(const kern_cuda_exact *a, float *scores)
{
    (void)a, (void)scores;
    return no_cuda();
}

int kern_cuda_build_ivf(const int64_t *doc_off, const uint32_t *codes, const uint32_t *live,
                        size_t n_docs, size_t K, int64_t *ivf_off, int64_t *scratch,
                        uint32_t *ivf_docs, size_t *n_entries)
{
    (void)doc_off, (void)codes, (void)live, (void)n_docs, (void)K, (void)ivf_off, (void)scratch;
    (void)ivf_docs, (void)n_entries;
    return no_cuda();
}

int kern_cuda_memset(void *p, int byte, size_t bytes)
{
    (void)p, (void)byte, (void)bytes;
    return no_cuda();
}

int kern_cuda_copy_d2d(void *dst, const void *src, size_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    return no_cuda();
}

int kern_cuda_host_alloc(void **p, size_t bytes)
{
    (void)bytes;
    *p = NULL;
    return no_cuda();
}

void kern_cuda_host_free(void *p)
{
    (void)p;
}

int kern_cuda_upload_async(void *dst, const void *src, size_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    return no_cuda();
}

int kern_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    return no_cuda();
}

int kern_cuda_copier_new(kern_cuda_copier **c, int slots)
{
    (void)slots;
    *c = NULL;
    return no_cuda();
}

void kern_cuda_copier_free(kern_cuda_copier *c)
{
    (void)c;
}

int kern_cuda_copier_upload(kern_cuda_copier *c, int s, void *dst, const void *src, size_t bytes)
{
    (void)c, (void)s, (void)dst, (void)src, (void)bytes;
    return no_cuda();
}

int kern_cuda_copier_ready(kern_cuda_copier *c, int s)
{
    (void)c, (void)s;
    return no_cuda();
}

int kern_cuda_copier_release(kern_cuda_copier *c, int s)
{
    (void)c, (void)s;
    return no_cuda();
}

int kern_cuda_copier_host_wait(kern_cuda_copier *c, int s)
{
    (void)c, (void)s;
    return no_cuda();
}
#endif
