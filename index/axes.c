/*
 * axes.c: the residual code by principal axes (axes.h). Fitting: second moments, Jacobi
 * eigenvectors, per-axis Lloyd-Max tables of each width (codec.c's fit), and the byte-filling
 * counts of least error. Coding: rotate, bucket each axis, pack; decoding: unpack, levels,
 * rotate back. Every sum runs in a fixed order, so a fit or a token's code does not depend on
 * the number of threads.
 */
#include "axes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "kernels.h"

#define NORM_EPS 1e-12f
/* Below this many tokens a parallel region costs more than it saves. */
#define OMP_MIN_TOKENS 256
/* Tokens a step of idx_axes_sq_error's rotation: an [n, dim] scratch array. */
#define COMPRESS_CHUNK 4096
/* Tokens a thread compresses at a time: its scratch, 2 x 128 KB of floats at dim 128, stays in
 * its L2 cache. */
#define COMPRESS_STEP 256
/* Tokens a step of the second moments takes. */
#define MOMENT_CHUNK 64
/* Jacobi sweeps at most; 128 dims settle in 8-10. */
#define JACOBI_SWEEPS 60
#define HEADER_BYTES 24
/* The growth of the summed squared error that additive tables may cost (idx_axes_fit). Model 3
 * at dim 384 (1,500 documents): +5.2% with uniform 4-bit tables, exhaustive recall@10 against
 * exact 0.979 either way; at dim 128 (20k documents) +1.8%, 0.9440 against 0.9455; models 1
 * and 2 (2-bit axes only): +0.01% and +0.04% (bench/results/bits-2026-11-29/). */
#define ADDITIVE_SLACK 0.10
/* Widths an axis may take, widest first, and their index in the fit's tables. */
static const unsigned widths[4] = {8, 4, 2, 1};

unsigned idx_axes_width(const idx_axes *x, size_t a)
{
    if (a < x->n8)
        return 8;
    a -= x->n8;
    if (a < x->n4)
        return 4;
    if (a < (size_t)x->n4 + x->n2)
        return 2;
    if (a < (size_t)x->n4 + x->n2 + x->n1)
        return 1;
    return 0;
}

/* Axes with bits. */
static size_t coded_axes(const idx_axes *x)
{
    return (size_t)x->n8 + x->n4 + x->n2 + x->n1;
}

size_t idx_axes_token_bytes(const idx_axes *x)
{
    return x->n8 + x->n4 / 2 + x->n2 / 4 + x->n1 / 8;
}

void idx_axes_free(idx_axes *x)
{
    if (!x)
        return;
    free(x->rot);
    memset(x, 0, sizeof *x);
}

/* One allocation for the four arrays; rot is its start. */
static int axes_alloc(idx_axes *x, size_t dim)
{
    size_t nf = 2 * dim * dim + dim * IDX_AXES_LEVELS + dim * (IDX_AXES_LEVELS - 1);
    float *p = calloc(nf, sizeof *p);
    if (!p)
        return -1;
    x->rot = p;
    x->rot_t = p + dim * dim;
    x->levels = p + 2 * dim * dim;
    x->cutoffs = x->levels + dim * IDX_AXES_LEVELS;
    return 0;
}

static void fill_transpose(idx_axes *x)
{
    size_t d = x->dim;
    for (size_t a = 0; a < d; a++)
        for (size_t j = 0; j < d; j++)
            x->rot_t[j * d + a] = x->rot[a * d + j];
}

/* ---- fitting ---------------------------------------------------------------------------- */

/*
 * Eigen-decomposition of the symmetric A [d][d] (destroyed) by cyclic Jacobi rotations: the
 * eigenvalues end on A's diagonal, the eigenvectors in V's columns. Rotation angles as in
 * Rutishauser's formulation (t = sign(theta) / (|theta| + sqrt(theta^2 + 1))), which keeps
 * every step stable.
 */
static void jacobi(double *A, double *V, size_t d)
{
    for (size_t i = 0; i < d; i++)
        for (size_t j = 0; j < d; j++)
            V[i * d + j] = i == j;
    double total = 0.0;
    for (size_t i = 0; i < d * d; i++)
        total += A[i] * A[i];
    for (int sweep = 0; sweep < JACOBI_SWEEPS; sweep++) {
        double off = 0.0;
        for (size_t p = 0; p < d; p++)
            for (size_t q = p + 1; q < d; q++)
                off += A[p * d + q] * A[p * d + q];
        if (off <= 1e-30 * total)
            break;
        for (size_t p = 0; p < d; p++)
            for (size_t q = p + 1; q < d; q++) {
                double apq = A[p * d + q];
                if (fabs(apq) < 1e-300)
                    continue;
                double theta = (A[q * d + q] - A[p * d + p]) / (2.0 * apq);
                double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
                double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
                for (size_t k = 0; k < d; k++) {
                    double akp = A[k * d + p], akq = A[k * d + q];
                    A[k * d + p] = c * akp - s * akq;
                    A[k * d + q] = s * akp + c * akq;
                }
                for (size_t k = 0; k < d; k++) {
                    double apk = A[p * d + k], aqk = A[q * d + k];
                    A[p * d + k] = c * apk - s * aqk;
                    A[q * d + k] = s * apk + c * aqk;
                }
                for (size_t k = 0; k < d; k++) {
                    double vkp = V[k * d + p], vkq = V[k * d + q];
                    V[k * d + p] = c * vkp - s * vkq;
                    V[k * d + q] = s * vkp + c * vkq;
                }
            }
    }
}

/* The second moments M = (1/n) sum r r^T [d][d] in double; rows of the upper triangle by
 * thread, each element summed over the tokens in order (the same whatever the threads). */
static void moments(const float *r, size_t n, size_t d, double *M)
{
    memset(M, 0, d * d * sizeof *M);
    for (size_t i0 = 0; i0 < n; i0 += MOMENT_CHUNK) {
        size_t i1 = i0 + MOMENT_CHUNK < n ? i0 + MOMENT_CHUNK : n;
#pragma omp parallel for schedule(dynamic, 4) if (d >= 64 && n >= 4096)
        for (long long a = 0; a < (long long)d; a++)
            for (size_t i = i0; i < i1; i++) {
                const float *ri = r + i * d;
                double s = ri[a];
                double *Ma = M + (size_t)a * d;
                for (size_t b = (size_t)a; b < d; b++)
                    Ma[b] += s * (double)ri[b];
            }
    }
    for (size_t a = 0; a < d; a++)
        for (size_t b = a; b < d; b++) {
            M[a * d + b] /= (double)n;
            M[b * d + a] = M[a * d + b];
        }
}

/* The counts of least modelled error: err [d][4] holds each axis's mean squared error at 8,
 * 4, 2 and 1 bits, sq [d] at 0 bits; axes take widths in order, widest first. */
static void allocate(const double *err, const double *sq, size_t d, unsigned nbits, idx_axes *x)
{
    /* Prefix sums of each width's errors over the axes. */
    double *P = malloc(5 * (d + 1) * sizeof *P);
    size_t budget = d * nbits;
    double best = INFINITY;
    x->n8 = x->n4 = x->n2 = x->n1 = 0;
    if (!P)
        return;
    for (int w = 0; w < 5; w++) {
        P[w * (d + 1)] = 0.0;
        for (size_t a = 0; a < d; a++)
            P[w * (d + 1) + a + 1] = P[w * (d + 1) + a] + (w < 4 ? err[a * 4 + w] : sq[a]);
    }
#define RANGE(w, lo, hi) (P[(w) * (d + 1) + (hi)] - P[(w) * (d + 1) + (lo)])
    for (size_t c8 = 0; c8 <= d && 8 * c8 <= budget; c8++)
        for (size_t c4 = 0; c8 + c4 <= d && 8 * c8 + 4 * c4 <= budget; c4 += 2)
            for (size_t c2 = 0; c8 + c4 + c2 <= d && 8 * c8 + 4 * c4 + 2 * c2 <= budget; c2 += 4) {
                size_t c1 = budget - 8 * c8 - 4 * c4 - 2 * c2;
                if (c1 % 8 || c8 + c4 + c2 + c1 > d)
                    continue;
                size_t e4 = c8 + c4, e2 = e4 + c2, e1 = e2 + c1;
                double e = RANGE(0, 0, c8) + RANGE(1, c8, e4) + RANGE(2, e4, e2) +
                           RANGE(3, e2, e1) + RANGE(4, e1, d);
                if (e < best) {
                    best = e;
                    x->n8 = (uint32_t)c8;
                    x->n4 = (uint32_t)c4;
                    x->n2 = (uint32_t)c2;
                    x->n1 = (uint32_t)c1;
                }
            }
#undef RANGE
    free(P);
}

/* Solves the k x k system A x = b (A symmetric, positive semi-definite) in place by Gaussian
 * elimination with partial pivoting; a pivot below 1e-300 (a bit that never varies among the
 * values) leaves its unknown 0. */
static void solve_small(double *A, double *b, int k, double *x)
{
    for (int c = 0; c < k; c++) {
        int p = c;
        for (int r = c + 1; r < k; r++)
            if (fabs(A[r * k + c]) > fabs(A[p * k + c]))
                p = r;
        if (p != c) {
            for (int e = 0; e < k; e++) {
                double t = A[c * k + e];
                A[c * k + e] = A[p * k + e];
                A[p * k + e] = t;
            }
            double t = b[c];
            b[c] = b[p];
            b[p] = t;
        }
        if (fabs(A[c * k + c]) < 1e-300)
            continue;
        for (int r = c + 1; r < k; r++) {
            double f = A[r * k + c] / A[c * k + c];
            for (int e = c; e < k; e++)
                A[r * k + e] -= f * A[c * k + e];
            b[r] -= f * b[c];
        }
    }
    for (int c = k - 1; c >= 0; c--) {
        double s = b[c];
        for (int e = c + 1; e < k; e++)
            s -= A[c * k + e] * x[e];
        x[c] = fabs(A[c * k + c]) < 1e-300 ? 0.0 : s / A[c * k + c];
    }
}

/* The nearest of nb ascending levels lev to each value (the cutoffs, midpoints, as the coder
 * buckets), its count and sum by level, and the summed squared error. */
static double assign_levels(const float *v, size_t m, const double *lev, unsigned nb, double *cnt,
                            double *tot)
{
    double cut[255], e = 0.0;
    for (unsigned b = 0; b + 1 < nb; b++)
        cut[b] = (float)((lev[b] + lev[b + 1]) / 2);
    memset(cnt, 0, nb * sizeof *cnt);
    memset(tot, 0, nb * sizeof *tot);
    for (size_t i = 0; i < m; i++) {
        unsigned b = 0;
        for (unsigned step = nb >> 1; step > 0; step >>= 1)
            b += cut[b + step - 1] < v[i] ? step : 0;
        cnt[b] += 1.0;
        tot[b] += v[i];
        double d = (double)v[i] - lev[b];
        e += d * d;
    }
    return e;
}

/*
 * Levels additive in the index's bits (issue 19): level(i) = c0 + sum_k c_k bit_k(i), w + 1
 * numbers for 2^w levels, so that a decoder can score a code's bits as 0/1 values weighted by
 * the c_k (the GPU's bit-plane kernel) instead of looking levels up. Alternating least squares
 * from the Lloyd-Max table lev0 (ascending): each value to its nearest level, then the c of
 * least squared error for those assignments, iters times. The c_k are then made positive (a
 * negative one flips its bit: c0 += c_k) and sorted, so that the levels ascend with the index
 * as the stored form asks; that holds where each c_k is at least the sum of the smaller ones.
 * Writes cut [2^w - 1] and lev [2^w] and returns the mean squared error over v, or a negative
 * number (nothing written) where the fitted levels cannot ascend so.
 */
static double fit_additive(unsigned w, int uniform, const float *v, size_t m, unsigned iters,
                           const float *lev0, float *cut, float *lev)
{
    const unsigned nb = 1u << w;
    const int k = uniform ? 2 : (int)w + 1;
    double L[256], cnt[256], tot[256], c[9];
    for (unsigned i = 0; i < nb; i++)
        L[i] = lev0[i];
    for (unsigned it = 0; it < iters; it++) {
        /* The levels ascend (sorted below), and so do their bit patterns' order pat. */
        unsigned pat[256];
        for (unsigned i = 0; i < nb; i++)
            pat[i] = i;
        if (it > 0) {
            for (unsigned i = 1; i < nb; i++) {
                unsigned p = pat[i], b = i;
                while (b > 0 && L[pat[b - 1]] > L[p]) {
                    pat[b] = pat[b - 1];
                    b--;
                }
                pat[b] = p;
            }
        }
        double sl[256];
        for (unsigned i = 0; i < nb; i++)
            sl[i] = L[pat[i]];
        assign_levels(v, m, sl, nb, cnt, tot);
        /* Normal equations over the basis [1, bits of the pattern]. */
        double A[81], rhs[9];
        memset(A, 0, sizeof A);
        memset(rhs, 0, sizeof rhs);
        for (unsigned i = 0; i < nb; i++) {
            double bas[9];
            bas[0] = 1.0;
            if (uniform)
                bas[1] = (double)pat[i];
            else
                for (int b = 1; b < k; b++)
                    bas[b] = (double)((pat[i] >> (b - 1)) & 1u);
            for (int r = 0; r < k; r++) {
                rhs[r] += bas[r] * tot[i];
                for (int e = 0; e < k; e++)
                    A[r * k + e] += bas[r] * cnt[i] * bas[e];
            }
        }
        solve_small(A, rhs, k, c);
        if (uniform) /* level c0 + delta i: c_b = 2^(b - 1) delta */
            for (int b = (int)w; b >= 1; b--)
                c[b] = c[1] * (double)(1u << (b - 1));
        for (unsigned i = 0; i < nb; i++) {
            L[i] = c[0];
            for (int b = 1; b <= (int)w; b++)
                L[i] += ((i >> (b - 1)) & 1u) ? c[b] : 0.0;
        }
    }
    if (iters == 0)
        return -1.0;
    /* Positive coefficients, ascending. */
    const int kc = (int)w + 1;
    for (int b = 1; b < kc; b++)
        if (c[b] < 0) {
            c[0] += c[b];
            c[b] = -c[b];
        }
    for (int b = 2; b < kc; b++) {
        double t = c[b];
        int e = b;
        while (e > 1 && c[e - 1] > t) {
            c[e] = c[e - 1];
            e--;
        }
        c[e] = t;
    }
    double below = 0.0;
    for (int b = 1; b < kc; b++) {
        if (c[b] < below)
            return -1.0;
        below += c[b];
    }
    /* The table as floats, each level the float sum in bit order (as a decoder would add). */
    double fl[256];
    for (unsigned i = 0; i < nb; i++) {
        double s = c[0];
        for (int b = 1; b < kc; b++)
            s += ((i >> (b - 1)) & 1u) ? c[b] : 0.0;
        lev[i] = (float)s;
        if (i > 0 && lev[i] < lev[i - 1])
            return -1.0;
        fl[i] = lev[i];
    }
    for (unsigned b = 0; b + 1 < nb; b++)
        cut[b] = (float)((fl[b] + fl[b + 1]) / 2);
    return assign_levels(v, m, fl, nb, cnt, tot) / (double)m;
}

int idx_axes_fit(idx_axes *out, size_t dim, unsigned nbits, const float *residuals, size_t n,
                 unsigned iters)
{
    if (!out || !residuals || n == 0 || dim == 0 || dim > IDX_AXES_MAX_DIM ||
        (nbits != 1 && nbits != 2 && nbits != 4) || (dim * nbits) % 8 ||
        n > SIZE_MAX / sizeof(float) / dim)
        return -1;
    for (size_t i = 0; i < n * dim; i++)
        if (!isfinite(residuals[i]))
            return -1;
    idx_axes x;
    memset(&x, 0, sizeof x);
    x.dim = (uint32_t)dim;
    x.nbits = nbits;
    double *M = malloc(dim * dim * sizeof *M), *V = malloc(dim * dim * sizeof *V);
    double *err = malloc(dim * 4 * sizeof *err), *sq = calloc(dim, sizeof *sq);
    float *proj = malloc(n * dim * sizeof *proj), *col = NULL;
    /* Every axis's tables at each width: [dim][4][256 + 255]. */
    float *tabs = malloc(dim * 4 * 511 * sizeof *tabs);
    int rc = -1;
    if (!M || !V || !err || !sq || !proj || !tabs || axes_alloc(&x, dim))
        goto done;
    moments(residuals, n, dim, M);
    jacobi(M, V, dim);
    /* Axes by falling eigenvalue (ties by index); each vector's sign makes its largest
     * component positive, so the result does not depend on the rotations' signs. */
    size_t *ord = malloc(dim * sizeof *ord);
    if (!ord)
        goto done;
    for (size_t a = 0; a < dim; a++)
        ord[a] = a;
    for (size_t a = 1; a < dim; a++) {
        size_t v = ord[a], b = a;
        while (b > 0 && M[ord[b - 1] * dim + ord[b - 1]] < M[v * dim + v]) {
            ord[b] = ord[b - 1];
            b--;
        }
        ord[b] = v;
    }
    for (size_t a = 0; a < dim; a++) {
        size_t e = ord[a], big = 0;
        for (size_t j = 1; j < dim; j++)
            if (fabs(V[j * dim + e]) > fabs(V[big * dim + e]))
                big = j;
        double sgn = V[big * dim + e] < 0 ? -1.0 : 1.0;
        for (size_t j = 0; j < dim; j++)
            x.rot[a * dim + j] = (float)(sgn * V[j * dim + e]);
    }
    free(ord);
    fill_transpose(&x);
    /* The held-out residuals in the axes, as the coder computes them, one axis a row. */
    idx_axes_rotate(&x, residuals, n, proj);
    col = malloc(n * sizeof *col);
    if (!col)
        goto done;
    int bad = 0;
    for (size_t a = 0; a < dim && !bad; a++) {
        double s = 0.0;
        for (size_t i = 0; i < n; i++) {
            col[i] = proj[i * dim + a];
            s += (double)col[i] * col[i];
        }
        sq[a] = s / (double)n;
        for (int w = 0; w < 4 && !bad; w++) {
            float *t = tabs + (a * 4 + (size_t)w) * 511;
            double e = idx_codec_fit_values(widths[w], col, n, iters, t + 256, t);
            if (e < 0)
                bad = 1;
            err[a * 4 + (size_t)w] = e;
        }
    }
    if (bad)
        goto done;
    allocate(err, sq, dim, nbits, &x);
    if (8 * (size_t)x.n8 + 4 * (size_t)x.n4 + 2 * (size_t)x.n2 + x.n1 != dim * nbits)
        goto done;
    /* Each coded axis's tables at its width: at dims where the GPU has no table kernel for
     * the code (kern_residual_mma_dim), levels additive in the bits where every axis's fit
     * allows it and the summed error (uncoded axes included) grows by ADDITIVE_SLACK at most,
     * so that the GPU's bit-plane kernels multiply it on the tensor cores (kernels.h
     * kern_axes_additive); else, and at the dims of the table kernels (faster there),
     * Lloyd-Max's, of least error. */
    double e_lloyd = 0.0, e_add = 0.0;
    const char *env = getenv("TARTAN_AXES_ADDITIVE"); /* 0: Lloyd-Max's (benchmarks) */
    int additive = (!env || atoi(env) != 0) && !kern_residual_mma_dim(dim, 1);
    for (size_t a = 0; a < dim; a++) {
        unsigned w = idx_axes_width(&x, a);
        if (w == 0) { /* decodes to 0 either way */
            e_lloyd += sq[a];
            e_add += sq[a];
            continue;
        }
        const int wi = w == 8 ? 0 : w == 4 ? 1 : w == 2 ? 2 : 3;
        const float *t = tabs + (a * 4 + (size_t)wi) * 511;
        memcpy(x.levels + a * IDX_AXES_LEVELS, t, (1u << w) * sizeof(float));
        memcpy(x.cutoffs + a * (IDX_AXES_LEVELS - 1), t + 256, ((1u << w) - 1) * sizeof(float));
        e_lloyd += err[a * 4 + (size_t)wi];
        if (!additive)
            continue;
        for (size_t i = 0; i < n; i++)
            col[i] = proj[i * dim + a];
        /* The additive table goes where Lloyd-Max's other widths were: tabs is spent. */
        float *u = tabs + (a * 4 + (size_t)(wi == 0 ? 1 : 0)) * 511;
        /* Free coefficients; where they cannot ascend with the index (4 and 8 bits of a
         * Gaussian: the largest falls short of the sum of the others), a uniform table. */
        double e = fit_additive(w, 0, col, n, iters > 0 ? iters : 1, t, u + 256, u);
        if (e < 0)
            e = fit_additive(w, 1, col, n, iters > 0 ? iters : 1, t, u + 256, u);
        if (e < 0)
            additive = 0;
        e_add += e;
    }
    if (additive && e_add <= e_lloyd * (1.0 + ADDITIVE_SLACK))
        for (size_t a = 0; a < dim; a++) {
            unsigned w = idx_axes_width(&x, a);
            if (w == 0)
                continue;
            const int wi = w == 8 ? 0 : w == 4 ? 1 : w == 2 ? 2 : 3;
            const float *u = tabs + (a * 4 + (size_t)(wi == 0 ? 1 : 0)) * 511;
            memcpy(x.levels + a * IDX_AXES_LEVELS, u, (1u << w) * sizeof(float));
            memcpy(x.cutoffs + a * (IDX_AXES_LEVELS - 1), u + 256, ((1u << w) - 1) * sizeof(float));
        }
    rc = 0;
done:
    free(M);
    free(V);
    free(err);
    free(sq);
    free(proj);
    free(col);
    free(tabs);
    if (rc)
        idx_axes_free(&x);
    else
        *out = x;
    return rc;
}

/* ---- coding ----------------------------------------------------------------------------- */

/* The low w bits of v in reverse order (the codec's field layout, codec.c's rev8). */
static inline unsigned rev_bits(unsigned v, unsigned w)
{
    unsigned r = 0;
    for (unsigned u = 0; u < w; u++)
        r |= ((v >> u) & 1u) << (w - 1 - u);
    return r;
}

void idx_axes_pack(const idx_axes *x, const uint8_t *idx, uint8_t *packed)
{
    size_t a = 0, coded = coded_axes(x);
    uint8_t *o = packed;
    while (a < coded) {
        unsigned w = idx_axes_width(x, a), per = 8 / w, v = 0;
        for (unsigned jj = 0; jj < per; jj++)
            v |= rev_bits(idx[a + jj], w) << (8 - w - jj * w);
        *o++ = (uint8_t)v;
        a += per;
    }
}

void idx_axes_unpack(const idx_axes *x, const uint8_t *packed, uint8_t *idx)
{
    size_t a = 0, coded = coded_axes(x);
    const uint8_t *p = packed;
    while (a < coded) {
        unsigned w = idx_axes_width(x, a), per = 8 / w, v = *p++;
        for (unsigned jj = 0; jj < per; jj++)
            idx[a + jj] = (uint8_t)rev_bits((v >> (8 - w - jj * w)) & ((1u << w) - 1), w);
        a += per;
    }
    for (; a < x->dim; a++)
        idx[a] = 0;
}

/* out [n, dim] = rows of q times the rows of M (out[i, a] = q_i . M_a), as a matrix product
 * on the CPU's kernel (kernels.h's centroid scores: M's rows as the "centroids"); a plain loop
 * where that fails (no memory). */
static void times_rows(const float *M, size_t d, const float *q, size_t n, float *out)
{
    if (n == 0 || kern_centroid_scores(KERN_DEV_CPU, q, n, M, d, d, out) == KERN_OK)
        return;
    for (size_t i = 0; i < n; i++)
        for (size_t a = 0; a < d; a++) {
            float s = 0.0f;
            for (size_t j = 0; j < d; j++)
                s += q[i * d + j] * M[a * d + j];
            out[i * d + a] = s;
        }
}

void idx_axes_rotate(const idx_axes *x, const float *q, size_t n, float *out)
{
    times_rows(x->rot, x->dim, q, n, out);
}

/* The rotation one token at a time (axpy over R^T's rows): the fallback of compress. */
static void rotate_one(const idx_axes *x, const float *q, size_t n, float *out)
{
    size_t d = x->dim;
    for (long long i = 0; i < (long long)n; i++) {
        float *o = out + (size_t)i * d;
        const float *qi = q + (size_t)i * d;
        memset(o, 0, d * sizeof *o);
        for (size_t j = 0; j < d; j++) {
            float s = qi[j];
            const float *rt = x->rot_t + j * d;
            for (size_t a = 0; a < d; a++)
                o[a] += s * rt[a];
        }
    }
}

/* The decoded token, not normalised: o = cen + sum over coded axes of level * axis. */
static void decode_one(const idx_axes *x, const float *cen, const uint8_t *idx, float *o)
{
    size_t d = x->dim, coded = coded_axes(x);
    memcpy(o, cen, d * sizeof *o);
    for (size_t a = 0; a < coded; a++) {
        float l = x->levels[a * IDX_AXES_LEVELS + idx[a]];
        const float *ra = x->rot + a * d;
        for (size_t j = 0; j < d; j++)
            o[j] += l * ra[j];
    }
}

static float norm_of(const float *v, size_t d)
{
    double s = 0.0;
    for (size_t j = 0; j < d; j++)
        s += (double)v[j] * v[j];
    return (float)sqrt(s);
}

/* Buckets one rotated residual rp [dim] into idx and replaces it by its levels (0 past the
 * coded axes). */
static void bucket_levels(const idx_axes *x, float *rp, uint8_t *idx)
{
    size_t d = x->dim, coded = coded_axes(x);
    for (size_t a = 0; a < d; a++) {
        unsigned w = a < coded ? idx_axes_width(x, a) : 0, b = 0;
        const float *cut = x->cutoffs + a * (IDX_AXES_LEVELS - 1);
        /* A binary search over the 2^w - 1 ascending cutoffs: the count of those below (w
         * compares instead of 2^w - 1; a NaN counts none). */
        for (unsigned step = (1u << w) >> 1; step > 0; step >>= 1)
            b += cut[b + step - 1] < rp[a] ? step : 0;
        idx[a] = (uint8_t)b;
        rp[a] = w ? x->levels[a * IDX_AXES_LEVELS + b] : 0.0f;
    }
}

int idx_axes_additive(const idx_axes *x)
{
    float *dec = malloc(idx_axes_decode_floats(x) * sizeof *dec + sizeof *dec);
    unsigned b[4];
    if (!dec)
        return 0;
    idx_axes_decode_tables(x, dec, b);
    const int r = kern_axes_additive(dec, b);
    free(dec);
    return r;
}

double idx_axes_sq_error(const idx_axes *x, const float *residuals, size_t n)
{
    const size_t d = x->dim, ch = n < COMPRESS_CHUNK ? n : COMPRESS_CHUNK;
    float *rp = malloc((ch ? ch : 1) * d * sizeof *rp);
    uint8_t *idx = malloc(d);
    double e = 0.0;
    if (!rp || !idx) {
        e = -1.0;
        n = 0;
    }
    for (size_t i0 = 0; i0 < n; i0 += ch) {
        const size_t m = n - i0 < ch ? n - i0 : ch;
        idx_axes_rotate(x, residuals + i0 * d, m, rp);
        for (size_t t = 0; t < m; t++) {
            float *v = rp + t * d;
            float orig[IDX_AXES_MAX_DIM];
            memcpy(orig, v, d * sizeof *v);
            bucket_levels(x, v, idx);
            for (size_t a = 0; a < d; a++)
                e += ((double)orig[a] - v[a]) * ((double)orig[a] - v[a]);
        }
    }
    free(rp);
    free(idx);
    return e;
}

/* The token-at-a-time compression (when the chunks' scratch cannot be had). */
static void compress_slow(const idx_axes *x, const float *centroids, const float *emb,
                          const uint32_t *codes, size_t n, uint8_t *packed, float *inv_norms);

void idx_axes_compress(const idx_axes *x, const float *centroids, const float *emb,
                       const uint32_t *codes, size_t n, uint8_t *packed, float *inv_norms)
{
    /* Threads take steps of COMPRESS_STEP tokens, each step on one thread from end to end:
     * the residuals, their rotation as one matrix product, buckets and levels, the decoded
     * tokens as a second product, their norms. The products run on the CPU kernel (about 40x
     * the token-at-a-time loops); that kernel spreads one call over blocks of 64 output
     * columns, two for dim 128, so chunks shared by all threads (before) kept 16 cores to
     * 0.7M tokens/s. Each product's value is the kernel's lane-by-row product, which does not
     * depend on the other rows of its call, so the steps' size changes no bit of the code. */
    const size_t d = x->dim, tb = idx_axes_token_bytes(x);
    const long long steps = (long long)((n + COMPRESS_STEP - 1) / COMPRESS_STEP);
#pragma omp parallel if (steps > 1)
    {
        float *r = malloc(COMPRESS_STEP * d * sizeof *r),
              *rp = malloc(COMPRESS_STEP * d * sizeof *rp);
        uint8_t *idx = malloc(COMPRESS_STEP * d);
        const int ok = r && rp && idx;
#pragma omp for schedule(dynamic, 1)
        for (long long s = 0; s < steps; s++) {
            const size_t i0 = (size_t)s * COMPRESS_STEP;
            const size_t m = n - i0 < COMPRESS_STEP ? n - i0 : COMPRESS_STEP;
            if (!ok) {
                compress_slow(x, centroids, emb + i0 * d, codes + i0, m, packed + i0 * tb,
                              inv_norms + i0);
                continue;
            }
            for (size_t t = 0; t < m; t++) {
                const float *cen = centroids + (size_t)codes[i0 + t] * d, *e = emb + (i0 + t) * d;
                for (size_t j = 0; j < d; j++)
                    r[t * d + j] = e[j] - cen[j];
            }
            times_rows(x->rot, d, r, m, rp);
            for (size_t t = 0; t < m; t++) {
                bucket_levels(x, rp + t * d, idx + t * d);
                idx_axes_pack(x, idx + t * d, packed + (i0 + t) * tb);
            }
            times_rows(x->rot_t, d, rp, m, r); /* r: the decoded residuals R^T r^' */
            for (size_t t = 0; t < m; t++) {
                const float *cen = centroids + (size_t)codes[i0 + t] * d;
                float *o = r + t * d;
                for (size_t j = 0; j < d; j++)
                    o[j] += cen[j];
                float nm = norm_of(o, d);
                inv_norms[i0 + t] = 1.0f / (nm > NORM_EPS ? nm : NORM_EPS);
            }
        }
        free(r);
        free(rp);
        free(idx);
    }
}

static void compress_slow(const idx_axes *x, const float *centroids, const float *emb,
                          const uint32_t *codes, size_t n, uint8_t *packed, float *inv_norms)
{
    size_t d = x->dim, tb = idx_axes_token_bytes(x);
#pragma omp parallel for schedule(dynamic, 256) if (n >= OMP_MIN_TOKENS)
    for (long long i = 0; i < (long long)n; i++) {
        float r[IDX_AXES_MAX_DIM], rp[IDX_AXES_MAX_DIM], dec[IDX_AXES_MAX_DIM];
        uint8_t idx[IDX_AXES_MAX_DIM];
        const float *cen = centroids + (size_t)codes[i] * d, *e = emb + (size_t)i * d;
        for (size_t j = 0; j < d; j++)
            r[j] = e[j] - cen[j];
        rotate_one(x, r, 1, rp);
        bucket_levels(x, rp, idx);
        idx_axes_pack(x, idx, packed + (size_t)i * tb);
        decode_one(x, cen, idx, dec);
        float nm = norm_of(dec, d);
        inv_norms[i] = 1.0f / (nm > NORM_EPS ? nm : NORM_EPS);
    }
}

void idx_axes_decompress(const idx_axes *x, const float *centroids, const uint32_t *codes,
                         const uint8_t *packed, size_t n, float *out)
{
    size_t d = x->dim, tb = idx_axes_token_bytes(x);
#pragma omp parallel if (n >= OMP_MIN_TOKENS)
    {
        uint8_t *idx = malloc(d);
#pragma omp for schedule(dynamic, 256)
        for (long long i = 0; i < (long long)n; i++) {
            if (!idx)
                continue;
            float *o = out + (size_t)i * d;
            idx_axes_unpack(x, packed + (size_t)i * tb, idx);
            decode_one(x, centroids + (size_t)codes[i] * d, idx, o);
            float nm = norm_of(o, d), inv = 1.0f / (nm > NORM_EPS ? nm : NORM_EPS);
            for (size_t j = 0; j < d; j++)
                o[j] *= inv;
        }
        free(idx);
    }
}

/* ---- the kernels' tables ---------------------------------------------------------------- */

size_t idx_axes_decode_floats(const idx_axes *x)
{
    return 256 * coded_axes(x);
}

void idx_axes_decode_tables(const idx_axes *x, float *dec, unsigned bytes[4])
{
    size_t a = 0, coded = coded_axes(x);
    float *o = dec;
    while (a < coded) {
        unsigned w = idx_axes_width(x, a), per = 8 / w, mask = (1u << w) - 1;
        for (unsigned v = 0; v < 256; v++)
            for (unsigned jj = 0; jj < per; jj++)
                *o++ = x->levels[(a + jj) * IDX_AXES_LEVELS +
                                 rev_bits((v >> (8 - w - jj * w)) & mask, w)];
        a += per;
    }
    bytes[0] = x->n8;
    bytes[1] = x->n4 / 2;
    bytes[2] = x->n2 / 4;
    bytes[3] = x->n1 / 8;
}

/* ---- stored form ------------------------------------------------------------------------ */

/* Floats of the tables of the coded axes: 2^w levels and 2^w - 1 cutoffs each. */
static size_t table_floats(const idx_axes *x)
{
    return (size_t)x->n8 * 511 + (size_t)x->n4 * 31 + (size_t)x->n2 * 7 + (size_t)x->n1 * 3;
}

size_t idx_axes_bytes(const idx_axes *x)
{
    return HEADER_BYTES + 4 * ((size_t)x->dim * x->dim + table_floats(x));
}

void idx_axes_save(const idx_axes *x, uint8_t *out)
{
    uint32_t h[6] = {x->dim, x->nbits, x->n8, x->n4, x->n2, x->n1};
    size_t d = x->dim;
    memcpy(out, h, sizeof h);
    uint8_t *o = out + HEADER_BYTES;
    memcpy(o, x->rot, d * d * 4);
    o += d * d * 4;
    for (size_t a = 0; a < coded_axes(x); a++) {
        size_t nb = (size_t)1 << idx_axes_width(x, a);
        memcpy(o, x->levels + a * IDX_AXES_LEVELS, nb * 4);
        memcpy(o + nb * 4, x->cutoffs + a * (IDX_AXES_LEVELS - 1), (nb - 1) * 4);
        o += (2 * nb - 1) * 4;
    }
}

int idx_axes_counts(const uint8_t *blob, size_t len, unsigned counts[4])
{
    uint32_t h[6];
    if (len < HEADER_BYTES)
        return -1;
    memcpy(h, blob, sizeof h);
    for (int i = 0; i < 4; i++)
        counts[i] = h[2 + i];
    return 0;
}

int idx_axes_load(idx_axes *out, const uint8_t *blob, size_t len, char *err)
{
    uint32_t h[6];
    if (len < HEADER_BYTES) {
        snprintf(err, 200, "the axes code has %zu bytes, fewer than its header", len);
        return -1;
    }
    memcpy(h, blob, sizeof h);
    size_t d = h[0];
    if (d == 0 || d > IDX_AXES_MAX_DIM) {
        snprintf(err, 200, "the axes code's dimension %zu is not 1..%u", d, IDX_AXES_MAX_DIM);
        return -1;
    }
    if ((h[1] != 1 && h[1] != 2 && h[1] != 4) || h[3] % 2 || h[4] % 4 || h[5] % 8 ||
        (size_t)h[2] + h[3] + h[4] + h[5] > d ||
        8 * (size_t)h[2] + 4 * (size_t)h[3] + 2 * (size_t)h[4] + h[5] != d * h[1]) {
        snprintf(err, 200,
                 "the axes code's counts (%u, %u, %u, %u axes at 8, 4, 2, 1 bits) do not fill "
                 "%zu dimensions at %u bits",
                 h[2], h[3], h[4], h[5], d, h[1]);
        return -1;
    }
    idx_axes x;
    memset(&x, 0, sizeof x);
    x.dim = h[0];
    x.nbits = h[1];
    x.n8 = h[2];
    x.n4 = h[3];
    x.n2 = h[4];
    x.n1 = h[5];
    if (len != idx_axes_bytes(&x)) {
        snprintf(err, 200, "the axes code has %zu bytes, not the %zu its counts make", len,
                 idx_axes_bytes(&x));
        return -1;
    }
    if (axes_alloc(&x, d)) {
        snprintf(err, 200, "out of memory");
        return -1;
    }
    const uint8_t *p = blob + HEADER_BYTES;
    memcpy(x.rot, p, d * d * 4);
    p += d * d * 4;
    for (size_t a = 0; a < coded_axes(&x); a++) {
        size_t nb = (size_t)1 << idx_axes_width(&x, a);
        memcpy(x.levels + a * IDX_AXES_LEVELS, p, nb * 4);
        memcpy(x.cutoffs + a * (IDX_AXES_LEVELS - 1), p + nb * 4, (nb - 1) * 4);
        p += (2 * nb - 1) * 4;
    }
    for (size_t i = 0; i < d * d; i++)
        if (!isfinite(x.rot[i])) {
            snprintf(err, 200, "the axes code's rotation holds a value that is not finite");
            idx_axes_free(&x);
            return -1;
        }
    for (size_t a = 0; a < coded_axes(&x); a++) {
        unsigned nb = 1u << idx_axes_width(&x, a);
        const float *l = x.levels + a * IDX_AXES_LEVELS, *c = x.cutoffs + a * (IDX_AXES_LEVELS - 1);
        for (unsigned b = 0; b < nb; b++)
            if (!isfinite(l[b]) || (b && l[b] < l[b - 1]) ||
                (b + 1 < nb && (!isfinite(c[b]) || (b && c[b] < c[b - 1])))) {
                snprintf(err, 200,
                         "the axes code's tables of axis %zu are not finite and ascending", a);
                idx_axes_free(&x);
                return -1;
            }
    }
    fill_transpose(&x);
    *out = x;
    return 0;
}
