/*
 * maxsim_i8_cpu.c: INT8 MaxSim with per-token scales, and the per-token quantiser, on the CPU.
 *
 * The reference and the fallback for the CUDA path: plain loops, one OpenMP task per
 * (query, document) pair. The integer dot product is exact in int32 (127 * 127 * dim fits
 * for any dim below 2^17), and each token pair's score is (q_scale * d_scale) * (float)dot,
 * in this order, as on the GPU, so the two differ only in the order of the final fp32 sum.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>

#include "kernels_impl.h"

static int32_t dot_i8(const int8_t *a, const int8_t *b, size_t dim)
{
    int32_t s = 0;
    for (size_t k = 0; k < dim; k++)
        s += (int32_t)a[k] * (int32_t)b[k];
    return s;
}

int kern_cpu_maxsim_varlen_i8(const kern_varlen_i8 *a, float *scores)
{
    const size_t dim = a->dim;
    const long long nq = (long long)a->nq, nd = (long long)a->nd;
#pragma omp parallel for collapse(2) schedule(dynamic, 16)
    for (long long qi = 0; qi < nq; qi++) {
        for (long long n = 0; n < nd; n++) {
            const int64_t q0 = a->q_off[qi], q1 = a->q_off[qi + 1];
            const int64_t d0 = a->d_off[n], d1 = a->d_off[n + 1];
            float sum = 0.f;
            if (d1 <= d0) {
                scores[qi * nd + n] = KERN_EMPTY_SCORE;
                continue;
            }
            for (int64_t i = q0; i < q1; i++) {
                const int8_t *qr = a->q + (size_t)i * dim;
                float m = -INFINITY;
                for (int64_t t = d0; t < d1; t++) {
                    const float s = (a->q_scale[i] * a->d_scale[t]) *
                                    (float)dot_i8(qr, a->d + (size_t)t * dim, dim);
                    m = fmaxf(m, s);
                }
                sum += m;
            }
            scores[qi * nd + n] = sum;
        }
    }
    return KERN_OK;
}

int kern_cpu_quantize_i8(const float *x, size_t n, size_t dim, int8_t *q, float *scales)
{
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < (long long)n; r++) {
        const float *xr = x + (size_t)r * dim;
        int8_t *qr = q + (size_t)r * dim;
        float amax = 0.f;
        int finite = 1;
        for (size_t k = 0; k < dim; k++) {
            amax = fmaxf(amax, fabsf(xr[k]));
            finite &= isfinite(xr[k]) != 0;
        }
        if (!(amax > 0.f) || !finite) {
            /* Zero rows, and rows holding NaN or inf (nothing meaningful to keep): zeros. */
            scales[r] = 0.f;
            for (size_t k = 0; k < dim; k++)
                qr[k] = 0;
            continue;
        }
        const float inv = 127.0f / amax;
        scales[r] = amax / 127.0f;
        for (size_t k = 0; k < dim; k++) {
            float v = rintf(xr[k] * inv);
            v = fminf(127.f, fmaxf(-127.f, v));
            qr[k] = (int8_t)v;
        }
    }
    return KERN_OK;
}
