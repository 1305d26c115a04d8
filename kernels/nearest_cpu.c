/*
 * nearest_cpu.c: each point's nearest centroid by inner product on the CPU.
 *
 * kern_cpu_nearest_centroid fuses the scores and the argmax: a work item packs a few hundred
 * points into micro-kernel panels and runs them against the centroids in blocks that stay in
 * the L2 cache; the micro-kernel folds each J x P block of products into a per-point running
 * best (mk->argmax) in registers. It replaced a score table of 64 MB per chunk of points
 * (scalar stores of every product) and a scalar argmax pass over it, which took 2.2-2.5x this
 * loop's CPU time (bench_assign, bench/RESULTS.md "k-means and encoding on the CPU"). Each product
 * is the micro-kernel's (the same FMAs in the same order as kern_cpu_centroid_scores), and each
 * point sees the centroids in ascending order with strict comparisons, so the answer does not
 * depend on the blocking or the thread count. kern_cpu_nearest_centroid screens that loop
 * where it pays (screen_pays below: AMX tiles, nearest_amx_cpu.c, or int8 on AVX2,
 * nearest_i8_cpu.c), with the same answer bit for bit.
 *
 * kern_cpu_nearest_centroid_bf16 (k-means training only, index/assign.c; encoding stays fp32)
 * runs on AMX tiles where the CPU has them (nearest_amx_cpu.c), else the same loop as above over
 * bf16 copies of the points (rounded per work item) and of the centroids (rounded once per
 * call), with mk->argmax_bf16 (AVX512_BF16's dot product of bf16 pairs). Both keep the
 * independence of the blocking and the thread count.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels_impl.h"
#include "microkernel_cpu.h"

/* Points per work item, at most: 8 AVX-512 panels (128 KB at d 128, in L2 beside a block). */
#define NC_POINTS 256
/* Bytes of centroids per block: 512 fp32 rows (1,024 bf16 rows) at d 128, read from L2 by
 * every panel of the item. */
#define NC_BLOCK_BYTES ((size_t)256 << 10)

/*
 * The shared loop. bf16 == 0: fp32 products (mk->argmax). bf16 == 1: points and centroids
 * rounded to bf16 (nearest even) and multiplied with mk->argmax_bf16; an odd dim gets a zero
 * pad, which adds nothing to any product. The centroids are rounded once per call into cb
 * (K x dim2 bf16, 4 MB at K 16,384, d 128: a few ms beside the products' seconds).
 */
static int nearest(const kern_mk *mk, int bf16, const float *x, size_t n, const float *centroids,
                   size_t n_centroids, size_t dim, int32_t *best, float *best_score)
{
    size_t P = mk->P, J = mk->J;
    size_t dim2 = bf16 ? dim + (dim & 1) : dim; /* the panels' and rows' dim */
    size_t row_bytes = dim2 * (bf16 ? sizeof(uint16_t) : sizeof(float));
    size_t block = NC_BLOCK_BYTES / row_bytes;
    block = block < J ? J : block - block % J;
    uint16_t *cb = NULL;
    if (bf16) {
        if (!(cb = kern_aligned_alloc(n_centroids * dim2 * sizeof(uint16_t)))) {
            kern_set_error("nearest_centroid: out of memory for %zu bf16 centroids", n_centroids);
            return KERN_ENOMEM;
        }
#pragma omp parallel for schedule(static)
        for (long long c = 0; c < (long long)n_centroids; c++) {
            uint16_t *r = cb + (size_t)c * dim2;
            for (size_t k = 0; k < dim; k++)
                r[k] = kern_f32_to_bf16(centroids[(size_t)c * dim + k]);
            if (dim2 > dim)
                r[dim] = 0;
        }
    }
    /* Items small enough that every thread has several (small inputs: the codec's held-out
     * set, small adds, tests), whole panels always. */
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    size_t per = (n + 4 * (size_t)threads - 1) / (4 * (size_t)threads);
    per = (per + P - 1) / P * P;
    if (per > NC_POINTS)
        per = NC_POINTS;
    if (per < P)
        per = P;
    size_t nitems = (n + per - 1) / per;
    int failed = 0;
#pragma omp parallel
    {
        size_t npmax = kern_npanels(mk, per);
        float *panels = kern_aligned_alloc(npmax * kern_panel_floats(mk, dim2) * sizeof(float));
        float *bs = kern_aligned_alloc(npmax * P * sizeof(float));
        int32_t *bi = kern_aligned_alloc(npmax * P * sizeof(int32_t));
        /* bf16: the item's points rounded, one row of dim2 each, before packing */
        uint16_t *xb = bf16 ? kern_aligned_alloc(per * dim2 * sizeof(uint16_t)) : NULL;
        const void *prow[NC_POINTS];
        const float *rows[KERN_MK_MAX_J];
        const uint16_t *rows16[KERN_MK_MAX_J];
        int ok = panels && bs && bi && (!bf16 || xb);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < nitems; it++) {
            if (!ok)
                continue;
            size_t p0 = it * per, m = n - p0 < per ? n - p0 : per, np = kern_npanels(mk, m);
            if (bf16) {
                for (size_t i = 0; i < m; i++) {
                    uint16_t *r = xb + i * dim2;
                    for (size_t k = 0; k < dim; k++)
                        r[k] = kern_f32_to_bf16(x[(p0 + i) * dim + k]);
                    if (dim2 > dim)
                        r[dim] = 0;
                    prow[i] = r;
                }
                kern_pack_panels_bf16(mk, prow, m, dim2, (uint16_t *)panels);
            } else {
                for (size_t i = 0; i < m; i++)
                    prow[i] = x + (p0 + i) * dim;
                kern_pack_panels(mk, KERN_F32, prow, m, dim, panels);
            }
            for (size_t i = 0; i < np * P; i++) {
                bs[i] = -INFINITY;
                bi[i] = -1;
            }
            for (size_t b0 = 0; b0 < n_centroids; b0 += block) {
                size_t b1 = n_centroids - b0 < block ? n_centroids : b0 + block;
                for (size_t p = 0; p < np; p++) {
                    size_t lanes = m - p * P < P ? m - p * P : P;
                    const float *qt = panels + p * kern_panel_floats(mk, dim2);
                    for (size_t c0 = b0; c0 < b1; c0 += J) {
                        size_t mj = b1 - c0 < J ? b1 - c0 : J;
                        if (bf16) {
                            for (size_t j = 0; j < J; j++)
                                rows16[j] = cb + (c0 + (j < mj ? j : mj - 1)) * dim2;
                            mk->argmax_bf16((const uint16_t *)qt, dim2, rows16, (unsigned)lanes,
                                            (int32_t)c0, bs + p * P, bi + p * P);
                        } else {
                            for (size_t j = 0; j < J; j++)
                                rows[j] = centroids + (c0 + (j < mj ? j : mj - 1)) * dim;
                            mk->argmax(qt, dim, rows, (unsigned)lanes, (int32_t)c0, bs + p * P,
                                       bi + p * P);
                        }
                    }
                }
            }
            for (size_t i = 0; i < m; i++) {
                best[p0 + i] = bi[i];
                if (best_score)
                    best_score[p0 + i] = bs[i];
            }
        }
        free(panels);
        free(bs);
        free(bi);
        free(xb);
    }
    free(cb);
    if (failed) {
        kern_set_error("nearest_centroid: out of memory for the point panels");
        return KERN_ENOMEM;
    }
    return KERN_OK;
}

int kern_cpu_nearest_centroid_fp32(const float *x, size_t n, const float *centroids,
                                   size_t n_centroids, size_t dim, int32_t *best, float *best_score)
{
    return nearest(kern_mk_active(), 0, x, n, centroids, n_centroids, dim, best, best_score);
}

#if defined(__x86_64__) || defined(__i386__)
#define TFMA __attribute__((target("fma")))
#else
#define TFMA
#endif

/*
 * The fp32 argmax of one point x over its listed centroids (ascending indices): each product
 * the chain the AVX2 and AVX-512 micro-kernels compute for a lane (a fused multiply-add a dim,
 * in ascending order, from zero), so score and choice are kern_cpu_nearest_centroid_fp32's bit
 * for bit on those variants; strict comparisons keep the lower index on ties. Four chains at a
 * time for the FMA latency. Called by the screens only, which run where the CPU has FMA.
 */
TFMA void kern_cpu_rescore_list(const float *x, const float *centroids, size_t dim,
                                const int32_t *list, size_t nc, int32_t *best, float *best_score)
{
    float bs = -INFINITY;
    int32_t bi = -1;
    size_t j = 0;
    for (; j + 4 <= nc; j += 4) {
        const float *r0 = centroids + (size_t)list[j] * dim,
                    *r1 = centroids + (size_t)list[j + 1] * dim;
        const float *r2 = centroids + (size_t)list[j + 2] * dim,
                    *r3 = centroids + (size_t)list[j + 3] * dim;
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (size_t k = 0; k < dim; k++) {
            a0 = __builtin_fmaf(x[k], r0[k], a0);
            a1 = __builtin_fmaf(x[k], r1[k], a1);
            a2 = __builtin_fmaf(x[k], r2[k], a2);
            a3 = __builtin_fmaf(x[k], r3[k], a3);
        }
        float a[4] = {a0, a1, a2, a3};
        for (int u = 0; u < 4; u++)
            if (a[u] > bs) {
                bs = a[u];
                bi = list[j + (size_t)u];
            }
    }
    for (; j < nc; j++) {
        const float *r = centroids + (size_t)list[j] * dim;
        float a = 0;
        for (size_t k = 0; k < dim; k++)
            a = __builtin_fmaf(x[k], r[k], a);
        if (a > bs) {
            bs = a;
            bi = list[j];
        }
    }
    *best = bi;
    *best_score = bs;
}

int kern_cpu_nearest_flagged(const float *x, size_t n, const float *centroids, size_t n_centroids,
                             size_t dim, int32_t *best, float *best_score, const uint8_t *fb,
                             size_t *n_fp32)
{
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        nf += fb[i];
    int rc = KERN_OK;
    if (nf) {
        float *xf = malloc(nf * dim * sizeof(float));
        int32_t *bf = malloc(nf * sizeof(int32_t));
        float *sf = malloc(nf * sizeof(float));
        if (!xf || !bf || !sf) {
            kern_set_error("nearest_centroid: out of memory for %zu points", nf);
            rc = KERN_ENOMEM;
        } else {
            for (size_t i = 0, j = 0; i < n; i++)
                if (fb[i])
                    memcpy(xf + dim * j++, x + i * dim, dim * sizeof(float));
            rc = kern_cpu_nearest_centroid_fp32(xf, nf, centroids, n_centroids, dim, bf, sf);
            for (size_t i = 0, j = 0; rc == KERN_OK && i < n; i++)
                if (fb[i]) {
                    best[i] = bf[j];
                    if (best_score)
                        best_score[i] = sf[j];
                    j++;
                }
        }
        free(xf);
        free(bf);
        free(sf);
    }
    if (n_fp32)
        *n_fp32 = nf;
    return rc;
}

/*
 * Which screen, if any, the fp32 argmax goes through (the answers are the same either way):
 * - AMX tiles where they are usable and the micro-kernel in use is AVX-512's, either variant
 *   (whose products kern_cpu_rescore_list reproduces: one fused chain a lane), from K 1,024
 *   (65,536 points on the XeonVM, 2 threads: 1.6x slower at K 256, 1.2x at K 512, 1.6x
 *   faster at K 1,024, 4.7x at K 16,384);
 * - else int8 products on AVX2 where the micro-kernel in use is AVX2's, from K 2,048 and up
 *   to dim 2,048 (kernels/nearest_i8_cpu.c; 65,536 random clustered points on the Zen3VM,
 *   2 threads: 1.15x slower at K 512, even at K 1,024, 1.55x faster at K 2,048, 1.8x at
 *   K 4,096, 2.0-2.2x at K 16,384 on model 3's tokens).
 * TARTAN_NEAREST_SCREEN=0 turns both off (to compare).
 */
enum { SCREEN_NONE, SCREEN_AMX, SCREEN_I8 };

static int screen_pays(size_t n, size_t n_centroids, size_t dim)
{
    const char *e = getenv("TARTAN_NEAREST_SCREEN");
    if (e && strcmp(e, "0") == 0)
        return SCREEN_NONE;
    if (n < 64 || n_centroids < 1024)
        return SCREEN_NONE;
    const char *mk = kern_mk_active()->name;
    if (kern_cpu_amx_usable() && strncmp(mk, "avx512", 6) == 0)
        return SCREEN_AMX;
    if (strcmp(mk, "avx2") == 0 && n_centroids >= 2048 && dim <= 2048)
        return SCREEN_I8;
    return SCREEN_NONE;
}

int kern_cpu_nearest_centroid(const float *x, size_t n, const float *centroids, size_t n_centroids,
                              size_t dim, int32_t *best, float *best_score)
{
    int how = screen_pays(n, n_centroids, dim);
    if (how != SCREEN_NONE) {
        int rc = how == SCREEN_AMX
                     ? kern_cpu_nearest_centroid_screened(x, n, centroids, n_centroids, dim, best,
                                                          best_score, NULL)
                     : kern_cpu_nearest_centroid_screened_i8(x, n, centroids, n_centroids, dim,
                                                             best, best_score, NULL);
        if (rc != KERN_ENODEV)
            return rc;
    }
    return kern_cpu_nearest_centroid_fp32(x, n, centroids, n_centroids, dim, best, best_score);
}

const char *kern_cpu_nearest_centroid_bf16_path(void)
{
    if (kern_cpu_amx_usable())
        return "amx";
    return kern_mk_active()->argmax_bf16 ? "avx512bf16" : NULL;
}

int kern_cpu_nearest_centroid_bf16_pays(void)
{
    const char *path = kern_cpu_nearest_centroid_bf16_path();
    if (path && strcmp(path, "amx") == 0)
        return 1;
#if defined(__x86_64__) || defined(__i386__)
    /* AVX512_BF16's dot product does 32 products an instruction against an fp32 FMA's 16. On
     * AMD's Zen 4 and 5 both issue at the same rate, so it doubles the rate; on Intel's Xeons
     * (Sapphire Rapids and later) it issues at half the FMA's rate and gains nothing: measured
     * 2x slower than the fp32 kernel (bench/RESULTS.md "Build time"), and AMX is there anyway. */
    if (path) {
        __builtin_cpu_init();
        return __builtin_cpu_is("amd") != 0;
    }
#endif
    return 0;
}

int kern_cpu_nearest_centroid_bf16(const float *x, size_t n, const float *centroids,
                                   size_t n_centroids, size_t dim, int32_t *best, float *best_score)
{
    if (kern_cpu_amx_usable())
        return kern_cpu_nearest_centroid_amx(x, n, centroids, n_centroids, dim, best, best_score);
    const kern_mk *mk = kern_mk_active();
    if (!mk->argmax_bf16) {
        kern_set_error("nearest_centroid_bf16: this CPU (kernels '%s') has neither AMX nor "
                       "AVX512_BF16",
                       mk->name);
        return KERN_ENODEV;
    }
    return nearest(mk, 1, x, n, centroids, n_centroids, dim, best, best_score);
}
