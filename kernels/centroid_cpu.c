/*
 * centroid_cpu.c: the query x centroid score table S = Q C^T (PLAID stage 1) on the CPU, and
 * its transpose for kernels that read one centroid's scores against every query token at once.
 *
 * The query is packed into micro-kernel panels once; threads take blocks of centroids, and the
 * tile micro-kernel computes J centroids x P query tokens at a time. The same loop computes
 * chosen columns only (kern_centroid_scores_cols: the exact scores a bf16 probe leaves to fp32).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "kernels_impl.h"
#include "microkernel_cpu.h"

/* Centroids per work item: 64 keeps S's writes in runs of whole cache lines. */
#define BLOCK 64

/*
 * S [lq, ld]: column j holds the scores of centroid cols[j] (cols NULL: centroid j), for j < n;
 * trans: S [n, ld] instead, row j those scores.
 * Every score is the tile micro-kernel's product of one query lane and one centroid row, which
 * does not depend on the other lanes or rows, so a column computed here equals the same
 * centroid's column of the whole table bit for bit.
 */
static int scores_of(const float *q, size_t lq, const float *centroids, const uint32_t *cols,
                     size_t n, size_t dim, float *S, size_t ld, int trans)
{
    const kern_mk *mk = kern_mk_active();
    size_t P = mk->P, J = mk->J, np = kern_npanels(mk, lq);
    float *panels = kern_aligned_alloc(np * kern_panel_floats(mk, dim) * sizeof(float));
    const void **qrows = malloc(lq * sizeof *qrows);
    if (!panels || !qrows) {
        free(panels);
        free(qrows);
        kern_set_error("centroid_scores: out of memory");
        return KERN_ENOMEM;
    }
    for (size_t i = 0; i < lq; i++)
        qrows[i] = q + i * dim;
    kern_pack_panels(mk, KERN_F32, qrows, lq, dim, panels);
    free(qrows);

    size_t nblocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel if (nblocks > 1)
    {
        float tile[KERN_MK_MAX_J * KERN_MK_MAX_P] __attribute__((aligned(64)));
        const float *rows[KERN_MK_MAX_J];
#pragma omp for schedule(static)
        for (size_t b = 0; b < nblocks; b++) {
            size_t c_end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
            for (size_t c0 = b * BLOCK; c0 < c_end; c0 += J) {
                size_t m = c_end - c0 < J ? c_end - c0 : J;
                for (size_t j = 0; j < J; j++) {
                    size_t c = c0 + (j < m ? j : m - 1);
                    rows[j] = centroids + (cols ? cols[c] : c) * dim;
                }
                for (size_t p = 0; p < np; p++) {
                    size_t lanes = lq - p * P < P ? lq - p * P : P;
                    mk->tile(panels + p * kern_panel_floats(mk, dim), dim, rows, (unsigned)lanes,
                             tile);
                    if (trans)
                        for (size_t j = 0; j < m; j++)
                            memcpy(S + (c0 + j) * ld + p * P, tile + j * P, lanes * sizeof(float));
                    else
                        for (size_t l = 0; l < lanes; l++)
                            for (size_t j = 0; j < m; j++)
                                S[(p * P + l) * ld + c0 + j] = tile[j * P + l];
                }
            }
        }
    }
    free(panels);
    return KERN_OK;
}

int kern_cpu_centroid_scores(const float *q, size_t lq, const float *centroids, size_t n_centroids,
                             size_t dim, float *S)
{
    return scores_of(q, lq, centroids, NULL, n_centroids, dim, S, n_centroids, 0);
}

int kern_cpu_centroid_scores_cols(const float *q, size_t lq, const float *centroids, size_t dim,
                                  const uint32_t *cols, size_t ncols, float *out, size_t ld)
{
    return scores_of(q, lq, centroids, cols, ncols, dim, out, ld, 1);
}

float *kern_transpose_scores(const float *S, size_t lq, size_t n_centroids, size_t lq_pad)
{
    float *t = kern_aligned_alloc(n_centroids * lq_pad * sizeof(float));
    if (!t)
        return NULL;
    /* Blocks of 64 centroids: reads of S stay in runs of cache lines, writes contiguous. */
    size_t nblocks = (n_centroids + 63) / 64;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblocks; b++) {
        size_t c_end = (b + 1) * 64 < n_centroids ? (b + 1) * 64 : n_centroids;
        for (size_t c = b * 64; c < c_end; c++)
            for (size_t i = lq; i < lq_pad; i++)
                t[c * lq_pad + i] = 0.0f;
        for (size_t i = 0; i < lq; i++)
            for (size_t c = b * 64; c < c_end; c++)
                t[c * lq_pad + i] = S[i * n_centroids + c];
    }
    return t;
}
