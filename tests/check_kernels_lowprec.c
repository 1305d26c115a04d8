/*
 * check_kernels_lowprec.c: the low-precision numbers: fp16, bf16 and e4m3 conversions (fp16
 * exhaustively, against the compiler's _Float16), and INT8 MaxSim and its quantiser against a
 * double-precision reference of the dequantised values.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "fixture_kernels.h"
#include "kernels.h"
#include "microkernel_cpu.h"

/* ---- 16-bit conversions ------------------------------------------------------------------ */

static uint16_t f16_bits(_Float16 h)
{
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

START_TEST(test_kernels_f16_exhaustive)
{
    /* Every half against the compiler's _Float16, both ways, and the vector converters. */
    uint16_t *all = xcalloc(65536, 2);
    float *vec = xcalloc(65536, sizeof(float));
    for (uint32_t u = 0; u < 65536; u++) {
        all[u] = (uint16_t)u;
        _Float16 h;
        memcpy(&h, &all[u], 2);
        float want = (float)h, got = kern_f16_to_f32((uint16_t)u);
        if (isnan(want)) {
            ck_assert(isnan(got));
            ck_assert(isnan(kern_f16_to_f32(kern_f32_to_f16(got))));
        } else {
            ck_assert_msg(memcmp(&want, &got, 4) == 0, "half %04x: %g != %g", u, got, want);
            ck_assert_uint_eq(kern_f32_to_f16(got), u);
        }
    }
    FOR_EACH_ISA(isa)
    {
        poison(vec, 65536);
        kern_mk_active()->f16(all, vec, 65536);
        for (uint32_t u = 0; u < 65536; u++) {
            float want = kern_f16_to_f32((uint16_t)u);
            ck_assert(isnan(want) ? isnan(vec[u]) : memcmp(&want, &vec[u], 4) == 0);
        }
    }
    /* Rounding: random floats of every magnitude, and the midpoints between halves. */
    rng_init_random();
    for (int i = 0; i < 200000; i++) {
        uint32_t b = (uint32_t)rnd();
        float f;
        memcpy(&f, &b, 4);
        if (isnan(f))
            continue;
        ck_assert_msg(kern_f32_to_f16(f) == f16_bits((_Float16)f), "float %a", f);
    }
    for (uint32_t u = 0; u < 0x7bff; u++) {
        float lo = kern_f16_to_f32((uint16_t)u), hi = kern_f16_to_f32((uint16_t)(u + 1));
        float mid = (float)(((double)lo + hi) / 2); /* exact: halves have few bits */
        ck_assert_uint_eq(kern_f32_to_f16(mid), f16_bits((_Float16)mid));
        ck_assert_uint_eq(kern_f32_to_f16(-mid), f16_bits((_Float16)-mid));
    }
    free(all);
    free(vec);
}
END_TEST

/* e4m3 from its definition: (-1)^s * (e ? 1 + m / 8 : m / 8) * 2^(max(e, 1) - 7), NaN at
 * e = 15, m = 7. */
static double ref_e4m3(unsigned c)
{
    unsigned e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    double v = (e ? 1.0 + m / 8.0 : m / 8.0) * ldexp(1.0, (e ? (int)e : 1) - 7);
    return (c & 0x80) ? -v : v;
}

/* The e4m3 code nearest to f (ties to the even code, which is the even mantissa), saturating
 * at +-448, by search over every finite code. */
static unsigned ref_to_e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    double a = fabs((double)f);
    unsigned best = 0;
    for (unsigned c = 1; c < 0x7f; c++) {
        double eb = fabs(a - ref_e4m3(best)), ec = fabs(a - ref_e4m3(c));
        if (ec < eb || (ec == eb && (c & 1) == 0 && (best & 1)))
            best = c;
    }
    return (signbit(f) ? 0x80u : 0u) | best;
}

START_TEST(test_kernels_e4m3_conversions)
{
    /* Every code decodes to its definition's value and encodes back to itself. */
    for (unsigned c = 0; c < 256; c++) {
        double want = ref_e4m3(c);
        float got = kern_e4m3_to_f32((uint8_t)c);
        if (isnan(want)) {
            ck_assert(isnan(got));
            ck_assert_uint_eq(kern_f32_to_e4m3(got), 0x7f);
            continue;
        }
        ck_assert_msg((double)got == want && !!signbit(got) == ((c & 0x80) != 0), "code %02x", c);
        ck_assert_uint_eq(kern_f32_to_e4m3(got), c);
    }
    /* Rounding: the midpoints between neighbours (ties), their float neighbours, random floats
     * of the magnitudes that matter and beyond (saturation, subnormals, zeros). */
    for (unsigned c = 0; c < 0x7e; c++) {
        float mid = (float)((ref_e4m3(c) + ref_e4m3(c + 1)) / 2); /* exact in fp32 */
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, 1000.0f)};
        for (int k = 0; k < 3; k++) {
            ck_assert_msg(kern_f32_to_e4m3(probes[k]) == ref_to_e4m3(probes[k]), "%a", probes[k]);
            ck_assert_msg(kern_f32_to_e4m3(-probes[k]) == ref_to_e4m3(-probes[k]), "%a",
                          -probes[k]);
        }
    }
    rng_init_random();
    for (int i = 0; i < 20000; i++) {
        float f = (float)ldexp(frnd(), (int)urnd(0, 30) - 16);
        ck_assert_msg(kern_f32_to_e4m3(f) == ref_to_e4m3(f), "float %a", f);
    }
    ck_assert_uint_eq(kern_f32_to_e4m3(INFINITY), 0x7e);
    ck_assert_uint_eq(kern_f32_to_e4m3(-1e30f), 0xfe);
    ck_assert_uint_eq(kern_f32_to_e4m3(NAN), 0x7f);
    ck_assert_uint_eq(kern_f32_to_e4m3(1e-30f), 0x00);
    ck_assert_uint_eq(kern_dtype_size(KERN_E4M3), 1);
}
END_TEST

/* bf16 rounding reference in double: the nearer of the two bf16 neighbours, ties to even. */
static uint16_t ref_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dlo = kern_bf16_to_f32(lo), dhi = kern_bf16_to_f32(hi);
    if (isinf(dhi) && !isinf(dlo)) /* the neighbour past the largest finite value */
        dhi = ldexp(copysign(1.0, f), 128);
    double el = fabs((double)f - dlo), eh = fabs((double)f - dhi);
    if (el < eh)
        return lo;
    if (eh < el)
        return hi;
    return (lo & 1) ? hi : lo;
}

START_TEST(test_kernels_bf16_rounding)
{
    rng_init_random();
    for (int i = 0; i < 500000; i++) {
        uint32_t b = (uint32_t)rnd();
        if (i % 4 == 0) /* force an exact tie between neighbours */
            b = (b & 0xffff0000u) | 0x8000u;
        float f;
        memcpy(&f, &b, 4);
        if (isnan(f) || isinf(f))
            continue;
        uint16_t got = kern_f32_to_bf16(f);
        ck_assert_msg(got == ref_bf16(f), "float %a: %04x != %04x", f, got, ref_bf16(f));
        /* bf16 -> f32 is exact: the top half of the float's bits. */
        float back = kern_bf16_to_f32(got);
        uint32_t bb;
        memcpy(&bb, &back, 4);
        ck_assert_uint_eq(bb, (uint32_t)got << 16);
    }
    ck_assert(isnan(kern_bf16_to_f32(kern_f32_to_bf16(NAN))));
    uint16_t *all = xcalloc(65536, 2);
    float *vec = xcalloc(65536, sizeof(float));
    for (uint32_t u = 0; u < 65536; u++)
        all[u] = (uint16_t)u;
    FOR_EACH_ISA(isa)
    {
        poison(vec, 65536);
        kern_mk_active()->bf16(all, vec, 65536);
        for (uint32_t u = 0; u < 65536; u++) {
            float want = kern_bf16_to_f32((uint16_t)u);
            ck_assert(memcmp(&want, &vec[u], 4) == 0);
        }
    }
    free(all);
    free(vec);
}
END_TEST

/* ---- INT8 MaxSim and the quantiser ------------------------------------------------------ */

/* MaxSim of the dequantised values (scale * int8) in double. */
static double ref_i8(const kern_varlen_i8 *a, size_t qi, size_t n, double *bound)
{
    const size_t dim = a->dim;
    double s = 0;
    *bound = 0;
    if (a->d_off[n + 1] == a->d_off[n])
        return -INFINITY;
    for (int64_t i = a->q_off[qi]; i < a->q_off[qi + 1]; i++) {
        double mx = -INFINITY, mb = 0;
        for (int64_t t = a->d_off[n]; t < a->d_off[n + 1]; t++) {
            double dot = 0, mag = 0;
            for (size_t k = 0; k < dim; k++) {
                const double x = (double)a->q_scale[i] * a->q[i * dim + k];
                const double y = (double)a->d_scale[t] * a->d[t * dim + k];
                dot += x * y;
                mag += fabs(x * y);
            }
            mx = fmax(mx, dot);
            mb = fmax(mb, mag);
        }
        s += mx;
        *bound += mb;
    }
    return s;
}

static int8_t *i8_rand(size_t n)
{
    int8_t *x = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++)
        x[i] = (int8_t)((int)(rnd() % 255) - 127);
    return x;
}

static float *scales_rand(size_t n)
{
    float *s = xcalloc(n, sizeof *s);
    for (size_t i = 0; i < n; i++)
        s[i] = frnd() * 0.02f; /* either sign: the semantics do not assume positive scales */
    return s;
}

START_TEST(test_kernels_i8_matches_reference)
{
    rng_init_random();
    static const size_t dims[] = {64, 128, 96, 256, 7};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const size_t dim = dims[di], nq = 3, nd = 40;
        int64_t *qo = ragged_offsets(nq, 33), *doff = ragged_offsets(nd, 70);
        int8_t *q = i8_rand((size_t)qo[nq] * dim), *d = i8_rand((size_t)doff[nd] * dim);
        float *qs = scales_rand((size_t)qo[nq]), *ds = scales_rand((size_t)doff[nd]);
        float *scores = xcalloc(nq * nd, sizeof(float));
        kern_varlen_i8 a = {dim, q, qs, qo, nq, d, ds, doff, nd};
        poison(scores, nq * nd);
        ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, scores), KERN_OK);
        for (size_t i = 0; i < nq; i++)
            for (size_t n = 0; n < nd; n++) {
                double bound;
                const double ref = ref_i8(&a, i, n, &bound);
                assert_close(scores[i * nd + n], ref, bound, "i8", i, n);
                if (qo[i + 1] == qo[i] && doff[n + 1] > doff[n])
                    ck_assert(scores[i * nd + n] == 0.0f);
            }
        free(qo);
        free(doff);
        free(q);
        free(d);
        free(qs);
        free(ds);
        free(scores);
    }
}
END_TEST

START_TEST(test_kernels_i8_quantize_round_trip)
{
    rng_init_random();
    const size_t n = 300, dim = 128;
    float *x = xcalloc(n * dim, sizeof *x), *sc = xcalloc(n, sizeof *sc);
    int8_t *q = xcalloc(n * dim, 1);
    for (size_t r = 0; r < n; r++) {
        const float mag = ldexpf(1.0f, (int)urnd(0, 40) - 20); /* rows of very different size */
        for (size_t k = 0; k < dim; k++)
            x[r * dim + k] = frnd() * mag;
    }
    for (size_t k = 0; k < dim; k++) {
        x[0 * dim + k] = 0.f;                   /* a zero row */
        x[1 * dim + k] = k == 5 ? NAN : frnd(); /* a row holding NaN */
    }
    poison(sc, n);
    memset(q, 0x55, n * dim);
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, x, n, dim, q, sc), KERN_OK);
    ck_assert(sc[0] == 0.f && sc[1] == 0.f);
    for (size_t k = 0; k < dim; k++)
        ck_assert(q[k] == 0 && q[dim + k] == 0);
    for (size_t r = 2; r < n; r++) {
        double amax = 0;
        int hit = 0;
        for (size_t k = 0; k < dim; k++)
            amax = fmax(amax, fabs(x[r * dim + k]));
        ck_assert_msg(fabs(sc[r] - amax / 127) <= 1e-7 * amax / 127, "scale of row %zu (seed %llu)",
                      r, (unsigned long long)rng_seed);
        for (size_t k = 0; k < dim; k++) {
            const int v = q[r * dim + k];
            ck_assert(v >= -127 && v <= 127);
            hit |= v == 127 || v == -127;
            const double err = fabs((double)x[r * dim + k] - (double)sc[r] * v);
            ck_assert_msg(err <= 0.5 * sc[r] * (1 + 1e-4),
                          "row %zu dim %zu: error %g > scale/2 %g (seed %llu)", r, k, err,
                          0.5 * sc[r], (unsigned long long)rng_seed);
        }
        ck_assert_msg(hit, "row %zu: its absmax does not map to +-127", r);
    }
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, NULL, n, dim, q, sc), KERN_EINVAL);
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, x, n, 0, q, sc), KERN_EINVAL);
    free(x);
    free(sc);
    free(q);
}
END_TEST

/* Clustered unit vectors: each token a random centroid plus noise, normalised. */
static void clustered(float *x, size_t rows, size_t dim, const float *cent, size_t ncent,
                      float noise)
{
    for (size_t r = 0; r < rows; r++) {
        const float *c = cent + (rnd() % ncent) * dim;
        double nn = 0;
        for (size_t k = 0; k < dim; k++) {
            x[r * dim + k] = c[k] + noise * frnd();
            nn += (double)x[r * dim + k] * x[r * dim + k];
        }
        for (size_t k = 0; k < dim; k++)
            x[r * dim + k] /= (float)sqrt(nn);
    }
}

/* Fraction of the exact top k (by exact score) that the approximate top k holds. */
static double recall_at(const float *exact, const float *approx, size_t n, size_t k)
{
    int64_t *ie = xcalloc(k, sizeof *ie), *ia = xcalloc(k, sizeof *ia);
    float *ve = xcalloc(k, sizeof *ve), *va = xcalloc(k, sizeof *va);
    ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, exact, 1, n, k, ie, ve), KERN_OK);
    ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, approx, 1, n, k, ia, va), KERN_OK);
    size_t hit = 0;
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < k; j++)
            hit += ie[i] == ia[j];
    free(ie);
    free(ia);
    free(ve);
    free(va);
    return (double)hit / (double)k;
}

START_TEST(test_kernels_i8_ranking_agreement)
{
    /* recall@10 of the int8 ranking against exact fp32 MaxSim on clustered data, reported, and
     * bounded well below what int8 gives so that the test fails only on a real regression. */
    rng_init_random();
    const size_t dim = 128, nd = 2000, ld = 40, lq = 32, ncent = 256, k = 10;
    float *cent = xcalloc(ncent * dim, sizeof *cent);
    for (size_t i = 0; i < ncent * dim; i++)
        cent[i] = frnd();
    float *d = xcalloc(nd * ld * dim, sizeof *d), *q = xcalloc(lq * dim, sizeof *q);
    clustered(d, nd * ld, dim, cent, ncent, 0.5f);
    clustered(q, lq, dim, cent, ncent, 0.5f);
    int64_t *doff = xcalloc(nd + 1, sizeof *doff), qo[2] = {0, (int64_t)lq};
    for (size_t n = 0; n < nd; n++)
        doff[n + 1] = doff[n] + (int64_t)ld;
    int8_t *dq = xcalloc(nd * ld * dim, 1), *qq = xcalloc(lq * dim, 1);
    float *ds = xcalloc(nd * ld, sizeof *ds), *qs = xcalloc(lq, sizeof *qs);
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, d, nd * ld, dim, dq, ds), KERN_OK);
    ck_assert_int_eq(kern_quantize_i8(KERN_DEV_CPU, q, lq, dim, qq, qs), KERN_OK);
    float *exact = xcalloc(nd, sizeof *exact), *approx = xcalloc(nd, sizeof *approx);
    poison(exact, nd);
    poison(approx, nd);
    kern_varlen e = {KERN_F32, dim, q, qo, 1, d, doff, nd};
    ck_assert_int_eq(kern_maxsim_varlen(KERN_DEV_CPU, &e, exact), KERN_OK);
    kern_varlen_i8 a = {dim, qq, qs, qo, 1, dq, ds, doff, nd};
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, approx), KERN_OK);
    double maxrel = 0;
    for (size_t n = 0; n < nd; n++)
        maxrel = fmax(maxrel, fabs(approx[n] - exact[n]) / fabs(exact[n]));
    const double r = recall_at(exact, approx, nd, k);
    printf("i8 ranking agreement: recall@%zu %.2f over %zu docs (Lq %zu, Ld %zu, d %zu); "
           "max relative score error %.2e (seed %llu)\n",
           k, r, nd, lq, ld, dim, maxrel, (unsigned long long)rng_seed);
    ck_assert_msg(maxrel < 0.02, "int8 scores off by %g relative", maxrel);
    ck_assert_msg(r >= 0.5, "recall@10 %.2f", r);
    free(cent);
    free(d);
    free(q);
    free(doff);
    free(dq);
    free(qq);
    free(ds);
    free(qs);
    free(exact);
    free(approx);
}
END_TEST

START_TEST(test_kernels_i8_bad_input)
{
    int64_t off[2] = {0, 1};
    int8_t v[64] = {0};
    float sc[1] = {1}, out[1] = {0};
    kern_varlen_i8 a = {64, v, sc, off, 1, v, sc, off, 1};
    a.dim = 0;
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, out), KERN_EINVAL);
    a.dim = 64;
    a.d_scale = NULL;
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, out), KERN_EINVAL);
    a.d_scale = sc;
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, NULL, out), KERN_EINVAL);
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, NULL), KERN_EINVAL);
    ck_assert_int_eq(kern_maxsim_varlen_i8(KERN_DEV_CPU, &a, out), KERN_OK);
    ck_assert(out[0] == 0.f);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"f16_exhaustive", test_kernels_f16_exhaustive, 0},
        {"bf16_rounding", test_kernels_bf16_rounding, 0},
        {"e4m3_conversions", test_kernels_e4m3_conversions, 0},
        {"i8_matches_reference", test_kernels_i8_matches_reference, 0},
        {"i8_quantize_round_trip", test_kernels_i8_quantize_round_trip, 0},
        {"i8_ranking_agreement", test_kernels_i8_ranking_agreement, 0},
        {"i8_bad_input", test_kernels_i8_bad_input, 0},
    };
    return FX_RUN("kernels-lowprec", cases, 0, 60);
}
