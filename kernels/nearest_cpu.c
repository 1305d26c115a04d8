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
 * depend on the blocking or the thread count.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels_impl.h"
#include "microkernel_cpu.h"

/* Points per work item, at most: 8 AVX-512 panels (128 KB at d 128, in L2 beside a block). */
#define NC_POINTS 256
/* Centroids per block: 256 KB at d 128, read from L2 by every panel of the item. */
#define NC_BLOCK 512

int kern_cpu_nearest_centroid(const float *x, size_t n, const float *centroids, size_t n_centroids,
                              size_t dim, int32_t *best, float *best_score)
{
    const kern_mk *mk = kern_mk_active();
    size_t P = mk->P, J = mk->J;
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
        float *panels = kern_aligned_alloc(npmax * kern_panel_floats(mk, dim) * sizeof(float));
        float *bs = kern_aligned_alloc(npmax * P * sizeof(float));
        int32_t *bi = kern_aligned_alloc(npmax * P * sizeof(int32_t));
        const void *prow[NC_POINTS];
        const float *rows[KERN_MK_MAX_J];
        if (!panels || !bs || !bi) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < nitems; it++) {
            if (!panels || !bs || !bi)
                continue;
            size_t p0 = it * per, m = n - p0 < per ? n - p0 : per, np = kern_npanels(mk, m);
            for (size_t i = 0; i < m; i++)
                prow[i] = x + (p0 + i) * dim;
            kern_pack_panels(mk, KERN_F32, prow, m, dim, panels);
            for (size_t i = 0; i < np * P; i++) {
                bs[i] = -INFINITY;
                bi[i] = -1;
            }
            for (size_t b0 = 0; b0 < n_centroids; b0 += NC_BLOCK) {
                size_t b1 = n_centroids - b0 < NC_BLOCK ? n_centroids : b0 + NC_BLOCK;
                for (size_t p = 0; p < np; p++) {
                    size_t lanes = m - p * P < P ? m - p * P : P;
                    const float *qt = panels + p * kern_panel_floats(mk, dim);
                    for (size_t c0 = b0; c0 < b1; c0 += J) {
                        size_t mj = b1 - c0 < J ? b1 - c0 : J;
                        for (size_t j = 0; j < J; j++)
                            rows[j] = centroids + (c0 + (j < mj ? j : mj - 1)) * dim;
                        mk->argmax(qt, dim, rows, (unsigned)lanes, (int32_t)c0, bs + p * P,
                                   bi + p * P);
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
    }
    if (failed) {
        kern_set_error("nearest_centroid: out of memory for the point panels");
        return KERN_ENOMEM;
    }
    return KERN_OK;
}
