/*
 * check_axes.c: the residual code by principal axes (index/axes.h) and the CPU kernel that
 * reads it. Fresh random residuals each run, compared with plain double-precision references
 * written here: the axes against a known rotation, the allocation against every count by
 * brute force, the bit layout, decoding, norms, and the fused MaxSim against MaxSim over the
 * decoded tokens.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "axes.h"
#include "codec.h"
#include "db.h"
#include "fixture.h"
#include "index.h"
#include "kernels.h"
#include "model.h"
#include "tartan.h"

/* A random orthonormal basis Q [d][d] (Gram-Schmidt on Gaussian rows, in double). */
static void random_basis(double *Q, size_t d)
{
    for (size_t a = 0; a < d; a++) {
        for (;;) {
            for (size_t j = 0; j < d; j++)
                Q[a * d + j] = gauss();
            for (int twice = 0; twice < 2; twice++)
                for (size_t b = 0; b < a; b++) {
                    double s = 0;
                    for (size_t j = 0; j < d; j++)
                        s += Q[a * d + j] * Q[b * d + j];
                    for (size_t j = 0; j < d; j++)
                        Q[a * d + j] -= s * Q[b * d + j];
                }
            double nn = 0;
            for (size_t j = 0; j < d; j++)
                nn += Q[a * d + j] * Q[a * d + j];
            if (nn > 1e-6) {
                for (size_t j = 0; j < d; j++)
                    Q[a * d + j] /= sqrt(nn);
                break;
            }
        }
    }
}

/*
 * n residuals [n, d] = sum_a sigma_a g_a Q[a] with falling sigmas: sigma_a = s0 * decay^a
 * (decay 1: isotropic). Q is returned for the checks.
 */
static float *draw(size_t n, size_t d, double s0, double decay, double *Q, double *sig)
{
    float *r = xmalloc(n * d * sizeof *r);
    random_basis(Q, d);
    for (size_t a = 0; a < d; a++)
        sig[a] = s0 * pow(decay, (double)a);
    for (size_t i = 0; i < n; i++) {
        float *ri = r + i * d;
        double acc[IDX_AXES_MAX_DIM] = {0};
        for (size_t a = 0; a < d; a++) {
            double g = sig[a] * gauss();
            for (size_t j = 0; j < d; j++)
                acc[j] += g * Q[a * d + j];
        }
        for (size_t j = 0; j < d; j++)
            ri[j] = (float)acc[j];
    }
    return r;
}

/* Reference of the layout: value a's index, read bit by bit from the packed stream (axes in
 * order, each w bits least significant first, bytes filled from their most significant bit,
 * a byte never split between widths). */
static unsigned ref_index(const idx_axes *x, const uint8_t *p, size_t a)
{
    size_t bit = 0;
    for (size_t b = 0; b < a; b++)
        bit += idx_axes_width(x, b);
    unsigned w = idx_axes_width(x, a), v = 0;
    for (unsigned u = 0; u < w; u++) {
        size_t s = bit + u;
        v |= (unsigned)((p[s / 8] >> (7 - s % 8)) & 1u) << u;
    }
    return v;
}

/* The decoded token in double, not normalised. */
static void ref_decode(const idx_axes *x, const float *cen, const uint8_t *p, double *o)
{
    size_t d = x->dim;
    for (size_t j = 0; j < d; j++)
        o[j] = cen[j];
    for (size_t a = 0; a < d; a++) {
        unsigned w = idx_axes_width(x, a);
        if (!w)
            continue;
        double l = x->levels[a * IDX_AXES_LEVELS + ref_index(x, p, a)];
        for (size_t j = 0; j < d; j++)
            o[j] += l * x->rot[a * d + j];
    }
}

START_TEST(test_axes_fit_finds_the_axes)
{
    /* Anisotropic residuals of a known basis: the fitted rows are orthonormal, span the
     * leading directions in order, and the widest widths go to them. */
    size_t d = 64, n = 20000;
    double *Q = xmalloc(d * d * sizeof *Q), sig[64];
    float *r = draw(n, d, 0.08, 0.93, Q, sig);
    idx_axes x;
    ck_assert_int_eq(idx_axes_fit(&x, d, 2, r, n, 20), 0);
    ck_assert_uint_eq(x.dim, d);
    ck_assert_uint_eq(8 * x.n8 + 4 * x.n4 + 2 * x.n2 + x.n1, d * 2);
    ck_assert_uint_eq(idx_axes_token_bytes(&x), d * 2 / 8);
    ck_assert_uint_gt(x.n8 + x.n4, 0); /* sigmas 0.08 down to 0.0008: the top deserves more */
    double worst = 0;
    for (size_t a = 0; a < d; a++)
        for (size_t b = 0; b < d; b++) {
            double s = 0;
            for (size_t j = 0; j < d; j++)
                s += (double)x.rot[a * d + j] * x.rot[b * d + j];
            worst = fmax(worst, fabs(s - (a == b)));
        }
    ck_assert_msg(worst < 1e-5, "rows not orthonormal: %g", worst);
    /* The first 8 axes (sigma ratios 0.93 apart, sampled from 20,000) match Q's rows. */
    for (size_t a = 0; a < 8; a++) {
        double s = 0;
        for (size_t j = 0; j < d; j++)
            s += x.rot[a * d + j] * Q[a * d + j];
        ck_assert_msg(fabs(s) > 0.9, "axis %zu: |cos| %g with the true axis", a, fabs(s));
    }
    /* Widths never grow along the axes. */
    for (size_t a = 1; a < d; a++)
        ck_assert_uint_le(idx_axes_width(&x, a), idx_axes_width(&x, a - 1));
    idx_axes_free(&x);
    free(r);
    free(Q);
}
END_TEST

START_TEST(test_axes_allocation_is_least_error)
{
    /* The counts minimise the sum of the axes' errors: every byte-filling count is tried here
     * with each axis quantised by its own fitted table of that width, in double. Isotropic
     * residuals give every axis nbits bits. */
    static const double decays[] = {1.0, 0.97, 0.9};
    for (int c = 0; c < 3; c++)
        for (unsigned nbits = 1; nbits <= 4; nbits *= 2) {
            size_t d = 32, n = 4000;
            double *Q = xmalloc(d * d * sizeof *Q), sig[32];
            float *r = draw(n, d, 0.05, decays[c], Q, sig);
            idx_axes x;
            ck_assert_int_eq(idx_axes_fit(&x, d, nbits, r, n, 20), 0);
            /* Each axis's error at each width, from the projections. */
            float *v = xmalloc(n * sizeof *v), *proj = xmalloc(n * d * sizeof *proj);
            idx_axes_rotate(&x, r, n, proj);
            double err[32][9];
            for (size_t a = 0; a < d; a++) {
                double s = 0;
                for (size_t i = 0; i < n; i++) {
                    v[i] = proj[i * d + a];
                    s += (double)v[i] * v[i];
                }
                err[a][0] = s / (double)n;
                for (unsigned w = 1; w <= 8; w *= 2) {
                    float cut[255], lev[256];
                    ck_assert(idx_codec_fit_values(w, v, n, 20, cut, lev) >= 0);
                    double e = 0;
                    for (size_t i = 0; i < n; i++) {
                        unsigned b = 0;
                        while (b + 1 < (1u << w) && cut[b] < v[i])
                            b++;
                        e += (v[i] - (double)lev[b]) * (v[i] - (double)lev[b]);
                    }
                    err[a][w] = e / (double)n;
                }
            }
            double best = INFINITY, got = 0;
            for (size_t c8 = 0; c8 <= d; c8++)
                for (size_t c4 = 0; c8 + c4 <= d; c4 += 2)
                    for (size_t c2 = 0; c8 + c4 + c2 <= d; c2 += 4)
                        for (size_t c1 = 0; c8 + c4 + c2 + c1 <= d; c1 += 8) {
                            if (8 * c8 + 4 * c4 + 2 * c2 + c1 != d * nbits)
                                continue;
                            size_t e4 = c8 + c4, e2 = e4 + c2, e1 = e2 + c1;
                            double e = 0;
                            for (size_t a = 0; a < d; a++)
                                e += err[a][a < c8 ? 8 : a < e4 ? 4 : a < e2 ? 2 : a < e1 ? 1 : 0];
                            best = fmin(best, e);
                            if (c8 == x.n8 && c4 == x.n4 && c2 == x.n2 && c1 == x.n1)
                                got = e;
                        }
            ck_assert_msg(got <= best * (1 + 1e-9) + 1e-15,
                          "decay %g nbits %u: counts %u/%u/%u/%u give %g, best %g", decays[c],
                          nbits, x.n8, x.n4, x.n2, x.n1, got, best);
            if (c == 0)
                ck_assert_msg(idx_axes_width(&x, 0) == nbits && idx_axes_width(&x, d - 1) == nbits,
                              "isotropic, nbits %u: widths %u..%u", nbits, idx_axes_width(&x, 0),
                              idx_axes_width(&x, d - 1));
            idx_axes_free(&x);
            free(v);
            free(proj);
            free(r);
            free(Q);
        }
}
END_TEST

/* Whether axis a's levels are additive in the index's bits within 1e-5 of the largest. */
static int axis_additive(const idx_axes *x, size_t a)
{
    const unsigned w = idx_axes_width(x, a), nb = 1u << w;
    const float *l = x->levels + a * IDX_AXES_LEVELS;
    double big = 0;
    for (unsigned i = 0; i < nb; i++)
        big = fmax(big, fabs(l[i]));
    for (unsigned i = 0; i < nb; i++) {
        double s = l[0];
        for (unsigned k = 0; k < w; k++)
            if (i >> k & 1u)
                s += (double)l[1u << k] - l[0];
        if (fabs(s - l[i]) > 1e-5 * big)
            return 0;
    }
    return 1;
}

START_TEST(test_axes_fit_additive)
{
    /* At dim 32 (no GPU table kernel for the axes code) the fit keeps levels additive in the
     * bits where they cost at most 10% more summed error than Lloyd-Max's (TARTAN_AXES_ADDITIVE
     * =0), else Lloyd-Max's tables bit for bit. Gaussian residuals, anisotropic and isotropic,
     * at nbits 1, 2 and 4 (widths 1 to 8): additive, every axis (checked here entry by entry,
     * and by idx_axes_additive over the kernels' tables), ascending, cutoffs the midpoints.
     * Residuals whose leading axis holds four clusters spaced unevenly (-3, -2.5, 0, 3: no
     * additive 2-bit table codes them well): whatever the fit keeps, the rule above holds. At
     * dim 64, which the table kernels serve, Lloyd-Max's always (kind 3). */
    static const double decays[] = {0.9, 1.0};
    for (int kind = 0; kind < 4; kind++)
        for (unsigned nbits = 1; nbits <= 4; nbits *= 2) {
            size_t d = kind == 3 ? 64 : 32, n = 6000;
            double *Q = xmalloc(d * d * sizeof *Q), sig[64];
            float *r = draw(n, d, 0.05, kind < 2 ? decays[kind] : kind == 2 ? 0.5 : 0.95, Q, sig);
            if (kind == 2) /* the clusters along Q[0], over small Gaussian noise */
                for (size_t i = 0; i < n; i++) {
                    static const double at[4] = {-3, -2.5, 0, 3};
                    const double c = 0.05 * at[rnd_below(4)];
                    for (size_t j = 0; j < d; j++)
                        r[i * d + j] = (float)(0.02 * r[i * d + j] + c * Q[j]);
                }
            idx_axes x, y;
            ck_assert_int_eq(idx_axes_fit(&x, d, nbits, r, n, 20), 0);
            setenv("TARTAN_AXES_ADDITIVE", "0", 1);
            ck_assert_int_eq(idx_axes_fit(&y, d, nbits, r, n, 20), 0);
            unsetenv("TARTAN_AXES_ADDITIVE");
            ck_assert(x.n8 == y.n8 && x.n4 == y.n4 && x.n2 == y.n2 && x.n1 == y.n1);
            ck_assert_int_eq(memcmp(x.rot, y.rot, d * d * sizeof *x.rot), 0);
            const double ex = idx_axes_sq_error(&x, r, n), ey = idx_axes_sq_error(&y, r, n);
            int all = 1, same = 1;
            for (size_t a = 0; a < d; a++) {
                const unsigned w = idx_axes_width(&x, a);
                if (!w)
                    continue;
                all &= axis_additive(&x, a);
                same &= memcmp(x.levels + a * IDX_AXES_LEVELS, y.levels + a * IDX_AXES_LEVELS,
                               (1u << w) * sizeof(float)) == 0;
                const float *l = x.levels + a * IDX_AXES_LEVELS;
                for (unsigned i = 0; i + 1 < (1u << w); i++) {
                    ck_assert(l[i] <= l[i + 1]);
                    /* Additive tables' cutoffs are the midpoints (Lloyd-Max's may stop short). */
                    if (axis_additive(&x, a) && !same)
                        ck_assert(fabs(x.cutoffs[a * (IDX_AXES_LEVELS - 1) + i] -
                                       ((double)l[i] + l[i + 1]) / 2) <=
                                  1e-6 * (fabs(l[0]) + fabs(l[(1u << w) - 1])));
                }
            }
            ck_assert_int_eq(idx_axes_additive(&x), all);
            if (kind == 3)
                ck_assert_msg(same, "nbits %u: dim 64, not Lloyd-Max's", nbits);
            else if (all)
                ck_assert_msg(ex <= ey * 1.10 * (1 + 1e-6),
                              "kind %d nbits %u: additive error %g against Lloyd-Max's %g", kind,
                              nbits, ex, ey);
            else
                ck_assert_msg(same, "kind %d nbits %u: not additive, yet not Lloyd-Max's", kind,
                              nbits);
            if (kind < 2 && nbits < 4)
                ck_assert_msg(all, "kind %d nbits %u: Gaussian residuals, not additive", kind,
                              nbits);
            fprintf(stderr, "kind %d nbits %u: %u/%u/%u/%u, additive %d, error %.4g / %.4g\n", kind,
                    nbits, x.n8, x.n4, x.n2, x.n1, all, ex, ey);
            idx_axes_free(&x);
            idx_axes_free(&y);
            free(r);
            free(Q);
        }
}
END_TEST

/* Centroids, codes and tokens around them: k unit centroids, tokens = normalise(C + r). */
static void tokens(size_t d, size_t k, size_t n, const float *r, float **cen, uint32_t **codes,
                   float **emb)
{
    *cen = xmalloc(k * d * sizeof **cen);
    *codes = xmalloc(n * sizeof **codes);
    *emb = xmalloc(n * d * sizeof **emb);
    for (size_t c = 0; c < k * d; c++)
        (*cen)[c] = (float)gauss();
    for (size_t c = 0; c < k; c++)
        normalise(*cen + c * d, d);
    for (size_t i = 0; i < n; i++) {
        (*codes)[i] = (uint32_t)rnd_below(k);
        for (size_t j = 0; j < d; j++)
            (*emb)[i * d + j] = (*cen)[(*codes)[i] * d + j] + r[i * d + j];
        normalise(*emb + i * d, d);
    }
}

START_TEST(test_axes_code_round_trip)
{
    /* Compress, then decode three ways: the library's decompression, a bit-by-bit reference in
     * double, and pack(unpack(p)) == p; the stored inverse norm is the reference's; each axis's
     * index is the reference bucket of the rotated residual (but within rounding of a cutoff);
     * the error is lower than the scalar codec's at the same bytes. */
    size_t d = 128, n = 1500, k = 16;
    for (unsigned nbits = 1; nbits <= 4; nbits *= 2) {
        double *Q = xmalloc(d * d * sizeof *Q), sig[128];
        float *r = draw(n, d, 0.12, 0.975, Q, sig);
        float *cen, *emb;
        uint32_t *codes;
        tokens(d, k, n, r, &cen, &codes, &emb);
        /* The codes' true residuals, to fit both codes on. */
        float *res = xmalloc(n * d * sizeof *res);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < d; j++)
                res[i * d + j] = emb[i * d + j] - cen[codes[i] * d + j];
        idx_axes x;
        ck_assert_int_eq(idx_axes_fit(&x, d, nbits, res, n, 20), 0);
        size_t tb = idx_axes_token_bytes(&x);
        ck_assert_uint_eq(tb, d * nbits / 8);
        uint8_t *p = xmalloc(n * tb), *p2 = xmalloc(tb), idx[128];
        float *inv = xmalloc(n * sizeof *inv), *out = xmalloc(n * d * sizeof *out);
        poison(inv, n);
        poison(out, n * d);
        idx_axes_compress(&x, cen, emb, codes, n, p, inv);
        idx_axes_decompress(&x, cen, codes, p, n, out);
        /* A token's code and norm depend on it alone: tokens from 7 on compressed by
         * themselves on one thread give the same bytes as the whole call on all threads. */
        {
            uint8_t *ps = xmalloc(n * tb);
            float *invs = xmalloc(n * sizeof *invs);
            poison(invs, n);
#ifdef _OPENMP
            int nt = omp_get_max_threads();
            omp_set_num_threads(1);
#endif
            idx_axes_compress(&x, cen, emb + 7 * d, codes + 7, n - 7, ps, invs);
#ifdef _OPENMP
            omp_set_num_threads(nt);
#endif
            ck_assert_mem_eq(ps, p + 7 * tb, (n - 7) * tb);
            ck_assert_mem_eq(invs, inv + 7, (n - 7) * sizeof *invs);
            free(ps);
            free(invs);
        }
        double err_axes = 0, err_scalar = 0;
        size_t near_cut = 0;
        for (size_t i = 0; i < n; i++) {
            const uint8_t *pi = p + i * tb;
            double o[128], nn = 0;
            ref_decode(&x, cen + codes[i] * d, pi, o);
            for (size_t j = 0; j < d; j++)
                nn += o[j] * o[j];
            nn = sqrt(nn);
            ck_assert_msg(fabs(inv[i] * nn - 1.0) < 1e-5, "token %zu: inv norm %g, 1/|d| %g", i,
                          inv[i], 1 / nn);
            for (size_t j = 0; j < d; j++) {
                ck_assert_msg(fabs(out[i * d + j] - o[j] / nn) < 2e-6, "token %zu dim %zu", i, j);
                double e = emb[i * d + j] - o[j];
                err_axes += e * e;
            }
            idx_axes_unpack(&x, pi, idx);
            idx_axes_pack(&x, idx, p2);
            ck_assert_mem_eq(p2, pi, tb);
            for (size_t a = 0; a < d; a++) {
                unsigned w = idx_axes_width(&x, a);
                ck_assert_uint_eq(idx[a], w ? ref_index(&x, pi, a) : 0);
                double v = 0;
                for (size_t j = 0; j < d; j++)
                    v += (double)x.rot[a * d + j] * res[i * d + j];
                const float *cut = x.cutoffs + a * (IDX_AXES_LEVELS - 1);
                unsigned b = 0, close = 0;
                for (unsigned c = 0; c + 1 < (1u << w); c++) {
                    b += cut[c] < v;
                    close |= fabs(cut[c] - v) < 1e-6;
                }
                if (close)
                    near_cut++;
                else
                    ck_assert_msg(idx[a] == b, "token %zu axis %zu: index %u, reference %u", i, a,
                                  idx[a], b);
            }
        }
        ck_assert_uint_lt(near_cut, n * d / 200 + 1);
        /* The scalar codec, fitted to the same residuals, at the same bytes. */
        idx_codec c;
        ck_assert_int_eq(idx_codec_fit(&c, d, nbits, res, n, 30), 0);
        uint8_t *ps = xmalloc(n * tb);
        idx_codec_compress(&c, cen, emb, codes, n, ps, inv);
        idx_codec_decompress(&c, cen, codes, ps, n, out);
        for (size_t i = 0; i < n; i++) {
            double o[128], nn = 0;
            ref_decode(&x, cen + codes[i] * d, p + i * tb, o); /* for the norm's scale only */
            (void)o;
            (void)nn;
            /* The scalar output is normalised; compare unnormalised via its inverse norm. */
            for (size_t j = 0; j < d; j++) {
                double e = emb[i * d + j] - out[i * d + j] / inv[i];
                err_scalar += e * e;
            }
        }
        ck_assert_msg(err_axes < 0.8 * err_scalar, "nbits %u: axes error %g, scalar %g", nbits,
                      err_axes / n, err_scalar / n);
        idx_axes_free(&x);
        free(ps);
        free(p);
        free(p2);
        free(inv);
        free(out);
        free(res);
        free(cen);
        free(codes);
        free(emb);
        free(r);
        free(Q);
    }
}
END_TEST

START_TEST(test_axes_kernel_matches_reference)
{
    /* kern_maxsim_residual with the axes tables and the rotated query against MaxSim in double
     * over the decoded tokens (scaled by the stored inverse norms), on ragged documents, both
     * with the transposed and the plain centroid table. Scores start poisoned. */
    size_t d = 128, k = 64, nd = 40, lq = 13;
    for (unsigned nbits = 1; nbits <= 4; nbits *= 2) {
        size_t n = 0, lens[40];
        for (size_t i = 0; i < nd; i++)
            n += lens[i] = i == 3 ? 0 : urnd(1, 90);
        double *Q = xmalloc(d * d * sizeof *Q), sig[128];
        float *r = draw(n, d, 0.1, 0.97, Q, sig);
        float *cen, *emb;
        uint32_t *codes;
        tokens(d, k, n, r, &cen, &codes, &emb);
        float *res = xmalloc(n * d * sizeof *res);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < d; j++)
                res[i * d + j] = emb[i * d + j] - cen[codes[i] * d + j];
        idx_axes x;
        ck_assert_int_eq(idx_axes_fit(&x, d, nbits, res, n, 20), 0);
        size_t tb = idx_axes_token_bytes(&x);
        uint8_t *p = xmalloc(n * tb);
        float *inv = xmalloc(n * sizeof *inv);
        idx_axes_compress(&x, cen, emb, codes, n, p, inv);
        uint16_t *c16 = xmalloc(n * sizeof *c16);
        for (size_t i = 0; i < n; i++)
            c16[i] = (uint16_t)codes[i];
        kern_pdoc *docs = xmalloc(nd * sizeof *docs);
        size_t off = 0;
        for (size_t i = 0; i < nd; i++) {
            docs[i] = (kern_pdoc){c16 + off, p + off * tb, inv + off, (uint32_t)lens[i]};
            off += lens[i];
        }
        float *q = xmalloc(lq * d * sizeof *q), *qr = xmalloc(lq * d * sizeof *qr);
        for (size_t i = 0; i < lq * d; i++)
            q[i] = (float)gauss();
        for (size_t i = 0; i < lq; i++)
            normalise(q + i * d, d);
        idx_axes_rotate(&x, q, lq, qr);
        float *qc = xmalloc(lq * k * sizeof *qc);
        for (size_t i = 0; i < lq; i++)
            for (size_t c = 0; c < k; c++)
                qc[i * k + c] = (float)dot_d(q + i * d, cen + c * d, d);
        float *dec = xmalloc(idx_axes_decode_floats(&x) * sizeof *dec);
        kern_residual a = {.dim = d,
                           .code_bytes = 2,
                           .q = qr,
                           .lq = lq,
                           .qc = qc,
                           .n_centroids = k,
                           .docs = docs,
                           .nd = nd,
                           .axes_dec = dec};
        idx_axes_decode_tables(&x, dec, a.axes_bytes);
        ck_assert_uint_eq(a.axes_bytes[0] + a.axes_bytes[1] + a.axes_bytes[2] + a.axes_bytes[3],
                          tb);
        float *got = xmalloc(nd * sizeof *got);
        poison(got, nd);
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, got), KERN_OK);
        off = 0;
        for (size_t i = 0; i < nd; i++) {
            double want = 0;
            for (size_t qi = 0; qi < lq && lens[i]; qi++) {
                double best = -INFINITY;
                for (size_t t = 0; t < lens[i]; t++) {
                    double o[128], s = 0;
                    ref_decode(&x, cen + codes[off + t] * d, p + (off + t) * tb, o);
                    for (size_t j = 0; j < d; j++)
                        s += q[qi * d + j] * o[j];
                    best = fmax(best, s * inv[off + t]);
                }
                want += best;
            }
            if (lens[i] == 0)
                ck_assert(got[i] == KERN_EMPTY_SCORE);
            else
                ck_assert_msg(fabs(got[i] - want) < 2e-4 * lq, "nbits %u doc %zu: %g, want %g",
                              nbits, i, got[i], want);
            off += lens[i];
        }
        /* The same through a GPU, where one is built: refused, not decoded wrongly; and the
         * AMX screen does not read it. */
        float bound[40];
        ck_assert_int_ne(kern_maxsim_residual_screen(KERN_DEV_CPU, &a, got, bound), KERN_OK);
        /* A code whose bytes decode to more dims than dim is refused. */
        kern_residual bad = a;
        bad.axes_bytes[3] += 1;
        bad.dim = bad.axes_bytes[0] + 2 * bad.axes_bytes[1] + 4 * bad.axes_bytes[2] +
                  8 * bad.axes_bytes[3] - 1;
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &bad, got), KERN_EINVAL);
        idx_axes_free(&x);
        free(got);
        free(dec);
        free(qc);
        free(q);
        free(qr);
        free(docs);
        free(c16);
        free(inv);
        free(p);
        free(res);
        free(cen);
        free(codes);
        free(emb);
        free(r);
        free(Q);
    }
}
END_TEST

START_TEST(test_axes_stored_form)
{
    /* save/load give the same code bit for bit (the same packed bytes and norms after); a
     * blob of another size, counts that do not fill the budget, a NaN, or descending levels
     * are refused with a reason. */
    size_t d = 32, n = 2000;
    double *Q = xmalloc(d * d * sizeof *Q), sig[32];
    float *r = draw(n, d, 0.1, 0.9, Q, sig);
    idx_axes x, y;
    ck_assert_int_eq(idx_axes_fit(&x, d, 2, r, n, 10), 0);
    size_t len = idx_axes_bytes(&x);
    uint8_t *blob = xmalloc(len + 4);
    idx_axes_save(&x, blob);
    char err[200];
    ck_assert_int_eq(idx_axes_load(&y, blob, len, err), 0);
    ck_assert_uint_eq(y.n4, x.n4);
    ck_assert_uint_eq(y.n2, x.n2);
    ck_assert_uint_eq(y.n1, x.n1);
    ck_assert_mem_eq(y.rot, x.rot, d * d * sizeof(float));
    ck_assert_mem_eq(y.rot_t, x.rot_t, d * d * sizeof(float));
    ck_assert_mem_eq(y.levels, x.levels, d * IDX_AXES_LEVELS * sizeof(float));
    idx_axes_free(&y);
    err[0] = 0;
    ck_assert_int_eq(idx_axes_load(&y, blob, len - 4, err), -1);
    ck_assert(strlen(err) > 0);
    ck_assert_int_eq(idx_axes_load(&y, blob, 3, err), -1);
    uint8_t *b2 = xmalloc(len);
    memcpy(b2, blob, len);
    uint32_t n2 = x.n2 + 4;
    memcpy(b2 + 16, &n2, 4);
    ck_assert_int_eq(idx_axes_load(&y, b2, len, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "counts"));
    memcpy(b2, blob, len);
    float nan = NAN;
    memcpy(b2 + 24 + 4 * 7, &nan, 4);
    ck_assert_int_eq(idx_axes_load(&y, b2, len, err), -1);
    memcpy(b2, blob, len);
    float big = 1e9f; /* axis 0's first level above its second */
    memcpy(b2 + 24 + 4 * d * d, &big, 4);
    ck_assert_int_eq(idx_axes_load(&y, b2, len, err), -1);
    /* Refusals of fit: bad nbits, dim, NaN input. */
    ck_assert_int_eq(idx_axes_fit(&y, d, 8, r, n, 10), -1); /* 8 bits a dim: no need */
    ck_assert_int_eq(idx_axes_fit(&y, d, 3, r, n, 10), -1);
    ck_assert_int_eq(idx_axes_fit(&y, 3, 2, r, n, 10), -1);
    ck_assert_int_eq(idx_axes_fit(&y, d, 2, r, 0, 10), -1);
    r[5] = NAN;
    ck_assert_int_eq(idx_axes_fit(&y, d, 2, r, n, 10), -1);
    idx_axes_free(&x);
    free(b2);
    free(blob);
    free(r);
    free(Q);
}
END_TEST

/* The format version db's format record names. */
static unsigned format_of(tartan_db *db)
{
    store_txn *txn;
    store_msg m = {{0}};
    unsigned v = 0;
    ck_assert_int_eq(store_read_begin(db->env, &txn, &m), 0);
    ck_assert_int_eq(store_format_version(txn, &v, &m), 0);
    store_read_end(db->env, txn);
    return v;
}

/* Opens (creating) an index at path with the axes code, on the CPU. */
static tartan_db *open_axes(const char *path, unsigned nbits, unsigned codec, size_t dim)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = dim;
    o.nbits = nbits;
    o.n_centroids = 64;
    o.device = TARTAN_DEVICE_CPU;
    o.codec = codec;
    return fx_open_with(path, &o);
}

START_TEST(test_axes_index_end_to_end)
{
    /* A real index on disk trained with the axes code: it stores the code, reopens with it,
     * passes tartan_check; exhaustive and default search give the double reference's top 10
     * over the decoded documents (decoded through the stored code); compaction and a model
     * exported to a fresh index keep every score. (Its fidelity is the benchmarks' to
     * measure: this corpus's noise is isotropic, where the code gains nothing.) */
    fixture_dir_create("axes");
    fx_corpus c;
    fx_corpus_default(&c, 300, 99);
    tartan_db *db = open_axes(ixpath, 2, TARTAN_CODEC_AXES, c.dim);
    fx_add_range(db, &c, 0, c.n_docs);
    tartan_close(db);
    tartan_options o;
    tartan_options_init(&o);
    o.device = TARTAN_DEVICE_CPU;
    db = fx_open_with(ixpath, &o);
    /* Version 3: a reader of version 2 refuses it instead of decoding it with the scalar
     * tables. */
    ck_assert_uint_eq(format_of(db), 3);
    size_t np = 99;
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    ck_assert_uint_eq(np, 0);
    {
        idx_reader r;
        store_msg m = {{0}};
        ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
        ck_assert_ptr_nonnull(r.axes);
        ck_assert_uint_eq(r.axes->dim, c.dim);
        ck_assert_uint_eq(idx_axes_token_bytes(r.axes), r.h.token_bytes);
        idx_reader_close(&r);
    }
    size_t rows, nq = 6, lq = 8;
    float *q = fx_queries(&c, nq, lq, NULL, 0.3, &rows);
    tartan_queries tq = fx_fixed_queries(q, nq, lq, c.dim);
    tartan_search_params p;
    tartan_search_params_init(&p, 10);
    p.exhaustive = 1;
    tartan_results *ex = fx_search_ok(db, &tq, &p);
    tartan_search_params_init(&p, 10);
    tartan_results *df = fx_search_ok(db, &tq, &p);
    for (size_t i = 0; i < nq; i++) {
        size_t nref;
        fx_ref_hit *ref = fx_reference(db, q + i * lq * c.dim, lq, c.dim, &nref);
        fx_expect_exact(ex, i, ref, nref, 10);
        free(ref);
    }
    /* Default search keeps most of the exhaustive top 10 on this small clustered corpus. */
    size_t kept = 0, all = 0;
    for (size_t i = 0; i < nq; i++)
        for (size_t a = ex->offsets[i]; a < ex->offsets[i + 1]; a++, all++)
            for (size_t b = df->offsets[i]; b < df->offsets[i + 1]; b++)
                kept += strcmp(ex->hits[a].id, df->hits[b].id) == 0;
    ck_assert_msg(kept * 10 >= all * 8, "default search kept %zu of %zu", kept, all);
    /* Compaction rewrites the environment: the code travels with it. */
    ck_assert_int_eq(tartan_compact(db), 0);
    ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
    ck_assert_uint_eq(format_of(db), 3);
    tartan_search_params_init(&p, 10);
    p.exhaustive = 1;
    tartan_results *ex2 = fx_search_ok(db, &tq, &p);
    for (size_t i = 0; i < nq; i++)
        fx_expect_same(ex, i, ex2, i);
    /* The model, exported and imported into an empty index, encodes the same documents to the
     * same scores. */
    void *model;
    size_t mlen;
    ck_assert_int_eq(tartan_model_export(db, &model, &mlen), 0);
    char path2[4096];
    snprintf(path2, sizeof path2, "%s-2", ixpath);
    tartan_db *db2 = open_axes(path2, 2, TARTAN_CODEC_SCALAR, c.dim);
    ck_assert_uint_eq(format_of(db2), 2);
    ck_assert_int_eq(tartan_model_import(db2, model, mlen), 0);
    ck_assert_uint_eq(format_of(db2), 3);
    fx_add_range(db2, &c, 0, c.n_docs);
    tartan_search_params_init(&p, 10);
    p.exhaustive = 1;
    tartan_results *ex3 = fx_search_ok(db2, &tq, &p);
    for (size_t i = 0; i < nq; i++)
        fx_expect_same(ex, i, ex3, i);
    tartan_free(model);
    tartan_results_free(ex);
    tartan_results_free(ex2);
    tartan_results_free(ex3);
    tartan_results_free(df);
    tartan_close(db);
    tartan_close(db2);
    free(q);
    fx_corpus_free(&c);
    fixture_dir_remove();
}
END_TEST

/* The decode tables rebuilt from the stored record, against a reader's. */
static void expect_reader_code(tartan_db *db, const idx_reader *r)
{
    store_txn *txn;
    store_msg m = {{0}};
    idx_axes x;
    ck_assert_int_eq(store_read_begin(db->env, &txn, &m), 0);
    ck_assert_int_eq(idx_axes_get(txn, &r->h, &x, &m), 0);
    store_read_end(db->env, txn);
    const size_t n = idx_axes_decode_floats(&x);
    ck_assert_uint_eq(n, idx_axes_decode_floats(r->axes));
    float *dec = malloc(n * sizeof(float));
    unsigned bytes[4];
    idx_axes_decode_tables(&x, dec, bytes);
    ck_assert_int_eq(memcmp(dec, r->axes_dec, n * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(bytes, r->axes_bytes, sizeof bytes), 0);
    ck_assert_int_eq(memcmp(x.rot, r->axes->rot, (size_t)x.dim * x.dim * sizeof(float)), 0);
    idx_axes_free(&x);
    free(dec);
}

START_TEST(test_axes_reader_cache)
{
    /* Readers share one parsed copy of a code (reader.c's cache): two readers of an index, or
     * of two indexes holding the same record, get the same tables; indexes trained on other
     * documents get their own. A reader keeps its copy while other codes push it out of the
     * cache (6 codes, the cache holds 4; the sanitizer build sees a use after free), and a
     * reader opened after that parses the record again, to the same values. */
    enum { N = 6 };
    fixture_dir_create("axescache");
    tartan_db *db[N];
    char path[N][4096];
    for (int i = 0; i < N; i++) {
        fx_corpus c;
        fx_corpus_default(&c, 60, 100 + i);
        snprintf(path[i], sizeof path[i], "%s-%d", ixpath, i);
        db[i] = open_axes(path[i], i == 3 ? 4 : 2, TARTAN_CODEC_AXES, c.dim);
        fx_add_range(db[i], &c, 0, c.n_docs);
        fx_corpus_free(&c);
    }
    store_msg m = {{0}};
    idx_reader r0, r0b, ri;
    ck_assert_int_eq(idx_reader_open(db[0]->env, &r0, &m), 0);
    ck_assert_int_eq(idx_reader_open(db[0]->env, &r0b, &m), 0);
    ck_assert_ptr_nonnull(r0.axes);
    ck_assert_ptr_eq(r0.axes, r0b.axes);
    ck_assert_ptr_eq(r0.axes_dec, r0b.axes_dec);
    idx_reader_close(&r0b);
    for (int i = 1; i < N; i++) {
        ck_assert_int_eq(idx_reader_open(db[i]->env, &ri, &m), 0);
        ck_assert_ptr_nonnull(ri.axes);
        ck_assert_ptr_ne(ri.axes, r0.axes);
        expect_reader_code(db[i], &ri);
        idx_reader_close(&ri);
    }
    expect_reader_code(db[0], &r0); /* still whole after its entry left the cache */
    ck_assert_int_eq(idx_reader_open(db[0]->env, &r0b, &m), 0);
    expect_reader_code(db[0], &r0b);
    idx_reader_close(&r0b);
    idx_reader_close(&r0);
    /* A model exported and imported: the same record, so the same entry. */
    void *model;
    size_t mlen;
    ck_assert_int_eq(tartan_model_export(db[1], &model, &mlen), 0);
    char p2[4096];
    snprintf(p2, sizeof p2, "%s-copy", ixpath);
    tartan_db *dbc = open_axes(p2, 2, TARTAN_CODEC_SCALAR, 32);
    ck_assert_int_eq(tartan_model_import(dbc, model, mlen), 0);
    tartan_free(model);
    ck_assert_int_eq(idx_reader_open(db[1]->env, &r0, &m), 0);
    ck_assert_int_eq(idx_reader_open(dbc->env, &ri, &m), 0);
    ck_assert_ptr_eq(r0.axes, ri.axes);
    idx_reader_close(&ri);
    idx_reader_close(&r0);
    tartan_close(dbc);
    for (int i = 0; i < N; i++)
        tartan_close(db[i]);
    fixture_dir_remove();
}
END_TEST

START_TEST(test_axes_auto_chooses)
{
    /* TARTAN_CODEC_AUTO keeps the axes code where it codes unseen residuals with clearly less
     * error, and the scalar code where it does not: 2,500 documents of 40 tokens about 64
     * topics (all sampled: 100,000 tokens, 5,000 held out), their residuals drawn with
     * falling variances (decay 0.85: the last axis's sigma 0.6% of the first's) or equal ones
     * (decay 1, where the axes code has nothing to gain). At dim 256 (decay 0.97: no 8-bit
     * axes, whose uniform tables cost too much) the GPU has no table kernel for the axes
     * code: the falling variances keep it there where its levels are
     * additive in the bits (the bit-plane kernels), and the scalar code where they may not be
     * (TARTAN_AXES_ADDITIVE=0). The index records the code chosen: version 3 with codec.axes,
     * or version 2 without. */
    static const struct {
        size_t dim;
        double decay;
        int axes, lloyd;
    } cases[] = {{32, 0.85, 1, 0}, {32, 1.0, 0, 0}, {256, 0.97, 1, 0}, {256, 0.97, 0, 1}};
    ck_assert(kern_residual_mma_dim(128, 1) && kern_residual_mma_dim(256, 0));
    ck_assert(!kern_residual_mma_dim(256, 1) && !kern_residual_mma_dim(32, 0));
    for (int k = 0; k < 4; k++) {
        if (cases[k].lloyd)
            setenv("TARTAN_AXES_ADDITIVE", "0", 1);
        fixture_dir_create("axesauto");
        rng_state = 4200 + (uint64_t)k;
        fx_corpus_spec spec = {.dim = cases[k].dim,
                               .n_docs = 2500,
                               .n_topics = 64,
                               .min_len = 40,
                               .max_len = 40,
                               .noise = 0.0};
        fx_corpus c;
        fx_corpus_make(&c, &spec);
        double *Q = xmalloc(c.dim * c.dim * sizeof *Q), *sig = xmalloc(c.dim * sizeof *sig);
        float *r = draw(c.n_rows, c.dim, 1.5, cases[k].decay, Q, sig);
        for (size_t i = 0; i < c.n_rows * c.dim; i++)
            c.emb[i] += r[i];
        free(r);
        free(Q);
        free(sig);
        const int want = cases[k].axes;
        tartan_db *db = open_axes(ixpath, 2, TARTAN_CODEC_AUTO, c.dim);
        fx_add_range(db, &c, 0, c.n_docs);
        idx_reader rd;
        store_msg m = {{0}};
        ck_assert_int_eq(idx_reader_open(db->env, &rd, &m), 0);
        if (want)
            ck_assert_ptr_nonnull(rd.axes);
        else
            ck_assert_ptr_null(rd.axes);
        if (want && cases[k].dim == 256)
            ck_assert(idx_axes_additive(rd.axes) && rd.axes_additive);
        ck_assert_uint_eq(format_of(db), want ? 3 : 2);
        idx_reader_close(&rd);
        /* tartan_info names the code kept, its counts filling the budget, and the format. */
        tartan_index_info in;
        ck_assert_int_eq(tartan_info(db, &in), 0);
        ck_assert_uint_eq(in.codec, want ? TARTAN_CODEC_AXES : TARTAN_CODEC_SCALAR);
        ck_assert_uint_eq(in.format, want ? 3 : 2);
        const unsigned *b = in.axes_bits;
        ck_assert_uint_eq(8 * b[0] + 4 * b[1] + 2 * b[2] + b[3], want ? c.dim * 2 : 0);
        size_t np = 99;
        ck_assert_int_eq(tartan_check(db, NULL, NULL, &np), 0);
        ck_assert_uint_eq(np, 0);
        tartan_close(db);
        fx_corpus_free(&c);
        fixture_dir_remove();
        unsetenv("TARTAN_AXES_ADDITIVE");
    }
}
END_TEST

START_TEST(test_axes_refused_cleanly)
{
    /* A codec value out of range is refused at open; the axes code at nbits 8 is refused when
     * training, and the index is left untrained (a later add with the scalar code works). */
    fixture_dir_create("axesbad");
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = 32;
    o.codec = 7;
    tartan_db *db = NULL;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    fx_corpus c;
    fx_corpus_default(&c, 40, 5);
    db = open_axes(ixpath, 8, TARTAN_CODEC_AXES, c.dim);
    const char *ids[40];
    for (size_t i = 0; i < 40; i++)
        ids[i] = c.ids[i];
    tartan_batch b = {40, ids, c.doclens, c.emb, c.n_rows, c.dim, TARTAN_FLOAT32};
    ck_assert_int_eq(tartan_add(db, &b, 0), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "axes"));
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 0);
    ck_assert_uint_eq(info.n_centroids, 0);
    tartan_close(db);
    db = open_axes(ixpath, 8, TARTAN_CODEC_SCALAR, c.dim);
    ck_assert_int_eq(tartan_add(db, &b, 0), 0);
    tartan_close(db);
    fx_corpus_free(&c);
    fixture_dir_remove();
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"axes_fit_finds_the_axes", test_axes_fit_finds_the_axes, 0},
        {"axes_allocation_is_least_error", test_axes_allocation_is_least_error, 0},
        {"axes_fit_additive", test_axes_fit_additive, 0},
        {"axes_code_round_trip", test_axes_code_round_trip, 0},
        {"axes_kernel_matches_reference", test_axes_kernel_matches_reference, 0},
        {"axes_stored_form", test_axes_stored_form, 0},
        {"axes_index_end_to_end", test_axes_index_end_to_end, 0},
        {"axes_refused_cleanly", test_axes_refused_cleanly, 0},
        {"axes_reader_cache", test_axes_reader_cache, 0},
        {"axes_auto_chooses", test_axes_auto_chooses, 0},
    };
    return FX_RUN("axes", cases, 0, 60);
}
