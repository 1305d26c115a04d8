/*
 * nearest_cpu.c: each point's nearest centroid by inner product on the CPU: the score table of
 * a chunk of points (kern_cpu_centroid_scores, fp32) then each row's argmax. The chunk is sized
 * so that its table stays near 64 MB whatever the number of centroids, and has at least 64
 * rows so that the micro-kernel's query panels stay full.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>

#include "kernels_impl.h"

#define TABLE_FLOATS ((size_t)16 << 20)
#define MIN_ROWS 64

int kern_cpu_nearest_centroid(const float *x, size_t n, const float *centroids, size_t n_centroids,
                              size_t dim, int32_t *best, float *best_score)
{
    size_t rows = TABLE_FLOATS / n_centroids;
    if (rows < MIN_ROWS)
        rows = MIN_ROWS;
    if (rows > n)
        rows = n;
    float *S = malloc(rows * n_centroids * sizeof(float));
    if (!S) {
        kern_set_error("nearest_centroid: out of memory for a %zu x %zu score table", rows,
                       n_centroids);
        return KERN_ENOMEM;
    }
    for (size_t r0 = 0; r0 < n; r0 += rows) {
        size_t m = n - r0 < rows ? n - r0 : rows;
        int rc = kern_cpu_centroid_scores(x + r0 * dim, m, centroids, n_centroids, dim, S);
        if (rc) {
            free(S);
            return rc;
        }
        /* Strictly greater replaces: the lowest index wins among equal scores; NaN never. */
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < (long long)m; i++) {
            const float *s = S + (size_t)i * n_centroids;
            float bs = -INFINITY;
            int32_t bi = -1;
            for (size_t c = 0; c < n_centroids; c++)
                if (s[c] > bs || (bi < 0 && !isnan(s[c]))) {
                    bs = s[c];
                    bi = (int32_t)c;
                }
            best[r0 + (size_t)i] = bi;
            if (best_score)
                best_score[r0 + (size_t)i] = bs;
        }
    }
    free(S);
    return KERN_OK;
}
