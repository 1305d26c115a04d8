/*
 * check_kernels_gpu.c: the CUDA kernels against a double-precision reference, on the GPU.
 *
 * Fresh random inputs every run (the seed is printed), ragged lengths, empty and 1-token
 * documents, masks, every dtype and the dims the issue names. Outputs are poisoned (NaN) on the
 * device and on the host before each call, so an unwritten element fails. Every CUDA call's
 * status is checked. Exits 77 (skipped) where no GPU is present; runs without fork, since a
 * CUDA context does not survive one.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "fixture.h"
#include "kernels_impl.h"
#include "scratch_cuda.h"
#include "search.h"
#include "tune_cuda.h"

/* ---- device helpers: every status checked ----------------------------------------------- */
static void *dev_put(const void *src, size_t bytes)
{
    void *p = NULL;
    ck_assert_int_eq(kern_gpu_malloc(&p, bytes), KERN_OK);
    if (bytes)
        ck_assert_int_eq(kern_gpu_copy(p, src, bytes, 1), KERN_OK);
    return p;
}

/* x as kern_cuda_probe's order key (0: no value above -inf). */
static unsigned float_key(float x)
{
    if (!(x > -INFINITY))
        return 0;
    uint32_t u;
    memcpy(&u, &x, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* A device buffer of n floats filled with NaN. */
static float *dev_poisoned(size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(h);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = dev_put(h, n * sizeof(float));
    free(h);
    return d;
}

static float *dev_get_floats(const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(h);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    ck_assert_int_eq(kern_gpu_sync(), KERN_OK);
    ck_assert_int_eq(kern_gpu_copy(h, d, n * sizeof(float), 0), KERN_OK);
    return h;
}

static void expect_ok(int rc)
{
    if (rc != KERN_OK)
        fprintf(stderr, "kernel failed: %d %s\n", rc, kern_last_error());
    ck_assert_int_eq(rc, KERN_OK);
}

/* ---- embeddings in each dtype ----------------------------------------------------------- */
/* Random values rounded to the dtype; vals gets the exact (rounded) values for the reference. */
static void *make_emb(kern_dtype t, size_t n, double *vals)
{
    size_t es = kern_dtype_size(t);
    uint8_t *buf = malloc(n * es + 1);
    ck_assert_ptr_nonnull(buf);
    for (size_t i = 0; i < n; i++) {
        float f = (float)gauss() * 0.125f;
        if (t == KERN_F32) {
            memcpy(buf + 4 * i, &f, 4);
            vals[i] = f;
        } else if (t == KERN_F16) {
            uint16_t h = kern_f32_to_f16(f);
            memcpy(buf + 2 * i, &h, 2);
            vals[i] = kern_f16_to_f32(h);
        } else if (t == KERN_BF16) {
            uint16_t h = kern_f32_to_bf16(f);
            memcpy(buf + 2 * i, &h, 2);
            vals[i] = kern_bf16_to_f32(h);
        } else {
            buf[i] = kern_f32_to_e4m3(f);
            vals[i] = kern_e4m3_to_f32(buf[i]);
        }
    }
    return buf;
}

/*
 * Reference MaxSim of one query (rows qv[lq, dim], mask qm) against one document (dv[ld, dim],
 * mask dm); *mag gets sum over rows of max |partial products| bound for the tolerance.
 */
static double ref_maxsim(const double *qv, const uint8_t *qm, size_t lq, const double *dv,
                         const uint8_t *dm, size_t ld, size_t dim, double *mag)
{
    int any = 0;
    for (size_t t = 0; t < ld; t++)
        any |= !dm || dm[t];
    *mag = 0;
    if (!any)
        return -INFINITY;
    double sum = 0;
    for (size_t i = 0; i < lq; i++) {
        if (qm && !qm[i])
            continue;
        double best = -INFINITY, bmag = 0;
        for (size_t t = 0; t < ld; t++) {
            if (dm && !dm[t])
                continue;
            double s = 0, m = 0;
            for (size_t j = 0; j < dim; j++) {
                s += qv[i * dim + j] * dv[t * dim + j];
                m += fabs(qv[i * dim + j] * dv[t * dim + j]);
            }
            if (s > best)
                best = s;
            if (m > bmag)
                bmag = m;
        }
        sum += best;
        *mag += bmag;
    }
    return sum;
}

/*
 * Compares got with ref: -inf exactly where ref is -inf, else |got - ref| <= rel * mag + abs.
 * Also the aggregate ||got - ref|| / ||ref|| under agg. Returns the aggregate error.
 */
static double compare(const char *what, const float *got, const double *ref, const double *mag,
                      size_t n, double rel, double abs_tol, double agg)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i]) && ref[i] < 0) {
            if (!(isinf(got[i]) && got[i] < 0))
                ck_abort_msg("%s[%zu]: got %g, want -inf (empty document)", what, i, got[i]);
            continue;
        }
        if (!isfinite(got[i]) || fabs(got[i] - ref[i]) > rel * mag[i] + abs_tol)
            ck_abort_msg("%s[%zu]: got %.9g, reference %.9g (tolerance %g)", what, i, got[i],
                         ref[i], rel * mag[i] + abs_tol);
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    ck_assert_msg(e <= agg, "%s: relative error %g over %g", what, e, agg);
    return e;
}

/* The aggregate bound of the residual kernels: 2e-4 of the scores' norm, widened where the
 * residual terms are larger. fp16 rounds those terms, so its error scales with them (mag sums
 * |q_j w_j|, about sqrt(dim) times the L2 size that the rounding errors add up to), and a score
 * that cancels to near zero (the centroid term against the residual one) must not shrink the
 * bound: seed 4021885315793 gave dim 96 nbits 8 2.43e-4 of its scores, 2e-6 of mag's norm. */
static double residual_agg(const double *ref, const double *mag, size_t n, size_t dim)
{
    double r2 = 0, m2 = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(ref[i]))
            r2 += ref[i] * ref[i], m2 += mag[i] * mag[i] / (double)dim;
    return 2e-4 * (m2 > r2 && r2 > 0 ? sqrt(m2 / r2) : 1.0);
}

/* The GPU result against the CPU kernel's (same semantics, its own fp32 arithmetic): empty
 * documents alike, values within the same tolerance as against the reference. */
static void compare_cpu(const char *what, const float *got, const float *cpu, const double *mag,
                        size_t n, double rel, double abs_tol)
{
    for (size_t i = 0; i < n; i++) {
        if (isinf(cpu[i]) && cpu[i] < 0) {
            ck_assert_msg(isinf(got[i]) && got[i] < 0, "%s[%zu]: GPU %g, CPU -inf", what, i,
                          got[i]);
            continue;
        }
        ck_assert_msg(isfinite(got[i]) && fabs(got[i] - cpu[i]) <= rel * mag[i] + abs_tol,
                      "%s[%zu]: GPU %.9g, CPU %.9g", what, i, got[i], cpu[i]);
    }
}

/* A host buffer of n floats filled with NaN, for the CPU kernel's output. */
static float *host_poisoned(size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(h);
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    return h;
}

/* Tolerances: inputs are exactly the rounded values, so only fp32 accumulation differs. */
#define REL_TOL 2e-5
#define AGG_TOL 1e-5
/* FP8 on the tensor cores: the products are exact, but the MMA adds them at a precision of its
 * own, below fp32's (about 2^-13 of the largest term a k32 step). 2^-10 of the magnitude bound
 * holds that with room for dim 128's four steps; a wrong element or layout is off by O(1). */
#define FP8_REL_TOL 1e-3
#define FP8_AGG_TOL 5e-4

/* Worst |got - ref| / magnitude seen on the FP8 tensor-core paths, over fp8_calls calls. */
static double fp8_worst;
static int fp8_calls;

/* The device's compute capability, as major * 10 + minor. */
static int device_cc(void)
{
    int major = 0, minor = 0, dev = 0;
    ck_assert_int_eq(cudaGetDevice(&dev), cudaSuccess);
    ck_assert_int_eq(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                     cudaSuccess);
    ck_assert_int_eq(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev),
                     cudaSuccess);
    return major * 10 + minor;
}

/* Whether an FP8 call runs on the tensor cores (and so is held to the FP8 tolerance): the
 * streaming kernel (sm_89+, dim a multiple of 64 up to 256, no masks) or the wgmma kernel
 * (sm_90, dim 64/96/128, no document masks), as maxsim_cuda.cu routes them; else the exact
 * path. */
static int fp8_on_tensor_cores(kern_dtype t, size_t dim, int qmask, int dmask)
{
    if (t != KERN_E4M3 || dmask)
        return 0;
    const int cc = device_cc(), path = kern_gpu_tune.dense_path;
    const int stream = !qmask && dim % 64 == 0 && dim <= 256 && cc >= 89;
    const int wg = (dim == 64 || dim == 96 || dim == 128) && cc == 90;
    return path == 2 ? wg : stream || (path != 1 && wg);
}

static void report_fp8(const char *what)
{
    if (fp8_calls > 0)
        printf("fp8 on the tensor cores (%s, %d calls so far): worst |score - reference| = %.3g "
               "of the magnitude bound\n",
               what, fp8_calls, fp8_worst);
}

static void note_fp8_error(const float *got, const double *ref, const double *mag, size_t n)
{
    fp8_calls++;
    for (size_t i = 0; i < n; i++)
        if (mag[i] > 0 && isfinite(ref[i]) && fabs(got[i] - ref[i]) / mag[i] > fp8_worst)
            fp8_worst = fabs(got[i] - ref[i]) / mag[i];
}

/* ---- dense ------------------------------------------------------------------------------ */
static void run_dense(kern_dtype t, size_t dim, size_t nq, size_t lq, size_t nd, size_t ld,
                      int masks)
{
    double *qv = malloc(nq * lq * dim * sizeof(double));
    double *dv = malloc(nd * ld * dim * sizeof(double));
    ck_assert(qv && dv);
    void *qh = make_emb(t, nq * lq * dim, qv);
    void *dh = make_emb(t, nd * ld * dim, dv);
    uint8_t *qm = NULL, *dm = NULL;
    if (masks) { /* 1: query and document masks; 2: query masks only */
        qm = malloc(nq * lq);
        dm = malloc(nd * ld);
        for (size_t i = 0; i < nq * lq; i++)
            qm[i] = unif() < 0.8;
        for (size_t i = 0; i < nd * ld; i++)
            dm[i] = unif() < 0.7;
        memset(dm, 0, ld); /* document 0: no valid token */
        if (nq > 1)
            memset(qm + lq, 0, lq); /* query 1: no valid token */
        if (nd > 1) {               /* document 1: one valid token */
            memset(dm + ld, 0, ld);
            dm[ld + ld / 2] = 1;
        }
        for (size_t n = 2; n < nd; n++) /* a few more empty ones among the rest */
            if (unif() < 0.05)
                memset(dm + n * ld, 0, ld);
        if (masks == 2)
            free(dm), dm = NULL;
    }
    size_t es = kern_dtype_size(t);
    kern_dense a = {t,  dim, dev_put(qh, nq * lq * dim * es), qm ? dev_put(qm, nq * lq) : NULL,
                    nq, lq,  dev_put(dh, nd * ld * dim * es), dm ? dev_put(dm, nd * ld) : NULL,
                    nd, ld};
    float *sd = dev_poisoned(nq * nd);
    expect_ok(kern_maxsim_dense(KERN_DEV_CUDA, &a, sd));
    float *got = dev_get_floats(sd, nq * nd);
    kern_dense h = {t, dim, qh, qm, nq, lq, dh, dm, nd, ld};
    float *cpu = host_poisoned(nq * nd);
    expect_ok(kern_maxsim_dense(KERN_DEV_CPU, &h, cpu));
    double *ref = malloc(nq * nd * sizeof(double)), *mag = malloc(nq * nd * sizeof(double));
    for (size_t q = 0; q < nq; q++)
        for (size_t n = 0; n < nd; n++)
            ref[q * nd + n] =
                ref_maxsim(qv + q * lq * dim, qm ? qm + q * lq : NULL, lq, dv + n * ld * dim,
                           dm ? dm + n * ld : NULL, ld, dim, &mag[q * nd + n]);
    char what[128];
    snprintf(what, sizeof what, "dense dtype %d dim %zu nq %zu lq %zu nd %zu ld %zu masks %d",
             (int)t, dim, nq, lq, nd, ld, masks);
    /* FP8 takes the tensor cores where the wgmma path can run the call, else the exact path,
     * held to the fp32 tolerance. */
    const int tc = fp8_on_tensor_cores(t, dim, qm != NULL, dm != NULL);
    const double rel = tc ? FP8_REL_TOL : REL_TOL;
    compare(what, got, ref, mag, nq * nd, rel, 1e-6, tc ? FP8_AGG_TOL : AGG_TOL);
    compare_cpu(what, got, cpu, mag, nq * nd, 2 * rel, 2e-6);
    if (tc)
        note_fp8_error(got, ref, mag, nq * nd);
    kern_gpu_free((void *)a.q);
    kern_gpu_free((void *)a.d);
    kern_gpu_free((void *)a.qmask);
    kern_gpu_free((void *)a.dmask);
    kern_gpu_free(sd);
    free(qv), free(dv), free(qh), free(dh), free(qm), free(dm), free(got), free(ref), free(mag);
    free(cpu);
}

START_TEST(test_kernels_gpu_dense_matches_reference)
{
    static const size_t dims[] = {64, 96, 128, 256, 1024};
    for (int t = 0; t < 4; t++) /* f32, f16, bf16, e4m3 */
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
            size_t dim = dims[i];
            size_t lq = urnd(1, dim >= 1024 ? 40 : 70);
            size_t ld = urnd(1, dim >= 1024 ? 60 : 200);
            run_dense((kern_dtype)t, dim, urnd(1, 5), lq, urnd(2, 9), ld, (int)(rnd() & 1));
        }
    /* Lq 1, Ld 1, and masks on a fixed small case of each dtype. */
    for (int t = 0; t < 4; t++) {
        run_dense((kern_dtype)t, 128, 1, 1, 3, 1, 0);
        run_dense((kern_dtype)t, 128, 3, 32, 7, 37, 1);
    }
    /* Dims outside the tensor-core path (fp32 CUDA-core path for 16-bit types). */
    run_dense(KERN_BF16, 48, 2, 9, 4, 21, 1);
    run_dense(KERN_F16, 200, 2, 5, 3, 11, 0);
    /* Many query rows per document (the shared-memory tile kernel): many queries in one
     * CTA's chunk and beyond it (64 per chunk), and each row-block width. */
    run_dense(KERN_BF16, 128, 70, 8, 3, 50, 1);
    run_dense(KERN_F16, 96, 9, 40, 5, 130, 1);
    run_dense(KERN_BF16, 64, 12, 20, 4, 70, 1);
    run_dense(KERN_BF16, 128, 1, 700, 3, 150, 1);
    /* More documents than resident CTAs, with masks (empty documents between full ones). */
    run_dense(KERN_BF16, 128, 2, 20, 1500, 24, 1);
}
END_TEST

START_TEST(test_kernels_gpu_dense_wgmma)
{
    /* The warpgroup-MMA kernel (sm_90), forced: every block shape (32, 128, 256 and 512 rows),
     * row-block layout and input type. */
    int major = 0, dev = 0;
    ck_assert_int_eq(cudaGetDevice(&dev), cudaSuccess);
    ck_assert_int_eq(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev),
                     cudaSuccess);
    kern_gpu_tune.dense_path = 2;
    if (major == 9) {
        /* Each case in its 16-bit type as listed, then again in FP8 (e4m3: k32 steps, half the
         * bytes a row). wgmma_rows: 0 the default block shape, else forced. */
        static const struct {
            kern_dtype t;
            size_t dim, nq, lq, nd, ld;
            int masks, rows;
        } cases[] = {
            /* 256-row blocks of 8 whole queries, the last block part padding. */
            {KERN_BF16, 128, 9, 32, 37, 300, 0, 0},
            /* 3 units a query (5 queries a block), query masks, a partial last tile. */
            {KERN_F16, 64, 3, 40, 20, 65, 2, 0},
            /* 128-row blocks; 1-token documents. */
            {KERN_BF16, 96, 2, 16, 50, 1, 0, 0},
            {KERN_F16, 128, 5, 7, 9, 64, 2, 0},
            /* Queries longer than a block: parts in scratch, added by the second kernel. */
            {KERN_BF16, 128, 1, 700, 5, 150, 2, 0},
            {KERN_F16, 128, 2, 300, 300, 64, 0, 0},
            /* More row blocks than resident CTAs: shares that cross from one row block's
             * stream to the next, the query rows reloaded. */
            {KERN_BF16, 64, 5000, 8, 3, 20, 0, 0},
            /* Documents longer than a CTA's share (split over many CTAs, merged from the
             * slots); ColPali-like pages over shares that cross row blocks; many short
             * documents a tile; documents of 63 tokens (every tile straddles one). */
            {KERN_BF16, 128, 1, 32, 3, 9000, 0, 0},
            {KERN_BF16, 128, 1, 1024, 7, 1030, 2, 0},
            {KERN_F16, 64, 40, 16, 333, 5, 0, 0},
            {KERN_BF16, 96, 4, 20, 100, 63, 2, 0},
            /* Work for one CTA (no split documents, no merge). */
            {KERN_F16, 128, 3, 40, 1, 10, 2, 0},
            /* The shapes above that took 512-row blocks (two warpgroups), with one-warpgroup
             * blocks of 256 rows forced. */
            {KERN_BF16, 128, 1, 700, 5, 150, 2, 256},
            {KERN_F16, 128, 2, 300, 300, 64, 0, 256},
            {KERN_BF16, 64, 5000, 8, 3, 20, 0, 256},
            {KERN_BF16, 128, 1, 1024, 7, 1030, 2, 256},
            {KERN_F16, 64, 40, 16, 333, 5, 0, 256},
            /* 128-row blocks forced on two whole queries. */
            {KERN_BF16, 128, 2, 32, 400, 300, 2, 128},
            /* 32-row blocks (one m64n32 a tile, fewer rows than threads): one query, two of
             * 16 rows, one of 1 row, one longer than a block (parts), documents split among
             * many CTAs, many short ones. */
            {KERN_BF16, 128, 1, 32, 500, 300, 0, 32},
            {KERN_F16, 64, 2, 16, 77, 65, 2, 32},
            {KERN_BF16, 96, 1, 1, 40, 63, 0, 32},
            {KERN_F16, 128, 1, 100, 9, 150, 2, 32},
            {KERN_BF16, 96, 3, 20, 30, 300, 0, 32},
            {KERN_F16, 64, 5, 32, 333, 5, 2, 32},
        };
        for (int fp8 = 0; fp8 < 2; fp8++)
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
                kern_gpu_tune.wgmma_rows = cases[i].rows;
                run_dense(fp8 ? KERN_E4M3 : cases[i].t, cases[i].dim, cases[i].nq, cases[i].lq,
                          cases[i].nd, cases[i].ld, cases[i].masks);
            }
        kern_gpu_tune.wgmma_rows = 0;
    } else {
        /* Elsewhere the forced path is refused with a message, and nothing is written. */
        void *zeros = calloc(300 * 32 * 128, 2);
        kern_dense a = {KERN_BF16, 128, NULL, NULL, 300, 32, NULL, NULL, 10, 30};
        a.q = dev_put(zeros, 300 * 32 * 128 * 2);
        a.d = dev_put(zeros, 10 * 30 * 128 * 2);
        float *sd = dev_poisoned(3000);
        ck_assert_int_eq(kern_maxsim_dense(KERN_DEV_CUDA, &a, sd), KERN_EINVAL);
        ck_assert_ptr_nonnull(strstr(kern_last_error(), "wgmma"));
        float *got = dev_get_floats(sd, 3000);
        for (int i = 0; i < 3000; i++)
            ck_assert(isnan(got[i])); /* still the poison */
        kern_gpu_free((void *)a.q), kern_gpu_free((void *)a.d), kern_gpu_free(sd);
        free(zeros), free(got);
    }
    /* The mma.sync tile kernel on the same kind of shapes, forced (FP8 then takes the exact
     * path). */
    kern_gpu_tune.dense_path = 1;
    run_dense(KERN_BF16, 128, 9, 32, 37, 300, 0);
    run_dense(KERN_F16, 64, 3, 40, 20, 65, 2);
    run_dense(KERN_E4M3, 128, 3, 32, 20, 65, 2);
    kern_gpu_tune.dense_path = 0;
    /* FP8 unforced: few query rows take the streaming e4m3 kernel (one query; dim 256 and 64;
     * 1-row queries of 1-token documents; query masks go to the wgmma kernel), many rows the
     * wgmma kernel; then many queries on the streaming kernel, forced off wgmma. */
    run_dense(KERN_E4M3, 128, 1, 32, 700, 120, 0);
    run_dense(KERN_E4M3, 256, 2, 20, 300, 77, 0);
    run_dense(KERN_E4M3, 64, 3, 1, 50, 1, 0);
    run_dense(KERN_E4M3, 128, 2, 32, 40, 65, 2);
    run_dense(KERN_E4M3, 128, 40, 32, 60, 200, 2);
    kern_gpu_tune.dense_path = 1;
    run_dense(KERN_E4M3, 128, 70, 32, 60, 200, 0);
    kern_gpu_tune.dense_path = 0;
    report_fp8("dense");
}
END_TEST

START_TEST(test_kernels_gpu_long_documents)
{
    /* Ld up to 8192: the running max over many tiles, and rows over several units. */
    run_dense(KERN_BF16, 128, 2, 33, 2, 8192, 0);
    run_dense(KERN_F16, 64, 1, 100, 2, 8192, 1);
    run_dense(KERN_F32, 96, 1, 3, 2, 8192, 0);
}
END_TEST

/* ---- varlen ----------------------------------------------------------------------------- */
static int varlen_q0_len = 1; /* tokens of query 0 */

static void run_varlen(kern_dtype t, size_t dim, size_t nq, size_t nd, int maxq, int maxd,
                       int with_long)
{
    int64_t *qo = malloc((nq + 1) * sizeof(int64_t)), *dof = malloc((nd + 1) * sizeof(int64_t));
    qo[0] = dof[0] = 0;
    for (size_t i = 0; i < nq; i++)
        qo[i + 1] = qo[i] + (i == 0 ? varlen_q0_len : i == 1 && nq > 2 ? 0 : (int)urnd(0, maxq));
    for (size_t i = 0; i < nd; i++) {
        int len = i == 0 ? 0 : i == 1 ? 1 : (int)urnd(0, maxd);
        if (with_long && i == nd - 1)
            len = 8192;
        dof[i + 1] = dof[i] + len;
    }
    size_t tq = (size_t)qo[nq], td = (size_t)dof[nd];
    double *qv = malloc((tq * dim + 1) * sizeof(double)),
           *dv = malloc((td * dim + 1) * sizeof(double));
    void *qh = make_emb(t, tq * dim, qv);
    void *dh = make_emb(t, td * dim, dv);
    size_t es = kern_dtype_size(t);
    kern_varlen a = {t,
                     dim,
                     dev_put(qh, tq * dim * es),
                     dev_put(qo, (nq + 1) * 8),
                     nq,
                     dev_put(dh, td * dim * es),
                     dev_put(dof, (nd + 1) * 8),
                     nd};
    float *sd = dev_poisoned(nq * nd);
    expect_ok(kern_maxsim_varlen(KERN_DEV_CUDA, &a, sd));
    float *got = dev_get_floats(sd, nq * nd);
    kern_varlen h = {t, dim, qh, qo, nq, dh, dof, nd};
    float *cpu = host_poisoned(nq * nd);
    expect_ok(kern_maxsim_varlen(KERN_DEV_CPU, &h, cpu));
    double *ref = malloc(nq * nd * sizeof(double)), *mag = malloc(nq * nd * sizeof(double));
    for (size_t q = 0; q < nq; q++)
        for (size_t n = 0; n < nd; n++) {
            size_t lq = (size_t)(qo[q + 1] - qo[q]), ld = (size_t)(dof[n + 1] - dof[n]);
            ref[q * nd + n] = ref_maxsim(qv + qo[q] * dim, NULL, lq, dv + dof[n] * dim, NULL, ld,
                                         dim, &mag[q * nd + n]);
            /* An empty query scores exactly 0 against a non-empty document. */
            if (lq == 0 && ld > 0)
                ck_assert_msg(got[q * nd + n] == 0.f, "empty query scored %g", got[q * nd + n]);
        }
    char what[128];
    snprintf(what, sizeof what, "varlen dtype %d dim %zu nq %zu nd %zu", (int)t, dim, nq, nd);
    const int tc = fp8_on_tensor_cores(t, dim, 0, 0) && kern_gpu_tune.dense_path != 2;
    const double rel = tc ? FP8_REL_TOL : REL_TOL;
    compare(what, got, ref, mag, nq * nd, rel, 1e-6, tc ? FP8_AGG_TOL : AGG_TOL);
    compare_cpu(what, got, cpu, mag, nq * nd, 2 * rel, 2e-6);
    if (tc)
        note_fp8_error(got, ref, mag, nq * nd);
    free(cpu);
    kern_gpu_free((void *)a.q), kern_gpu_free((void *)a.q_off), kern_gpu_free((void *)a.d);
    kern_gpu_free((void *)a.d_off), kern_gpu_free(sd);
    free(qo), free(dof), free(qv), free(dv), free(qh), free(dh), free(got), free(ref), free(mag);
}

START_TEST(test_kernels_gpu_varlen_matches_reference)
{
    static const size_t dims[] = {64, 96, 128, 256, 1024};
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
            run_varlen((kern_dtype)t, dims[i], urnd(1, 6), urnd(3, 40), dims[i] >= 1024 ? 20 : 60,
                       dims[i] >= 1024 ? 40 : 300, 0);
    run_varlen(KERN_BF16, 128, 3, 5, 32, 100, 1); /* one document of 8192 tokens */
    run_varlen(KERN_E4M3, 128, 3, 5, 32, 100, 1);
    run_varlen(KERN_E4M3, 64, 70, 40, 30, 50, 0); /* more queries than a CTA's chunk */
    report_fp8("varlen");
    run_varlen(KERN_F16, 128, 9, 300, 40, 20, 0); /* many short documents, 9 queries */
    /* More documents than resident CTAs: each CTA walks several and prefetches across them. */
    run_varlen(KERN_BF16, 128, 1, 3000, 32, 40, 0);
}
END_TEST

START_TEST(test_kernels_gpu_stream_warp)
{
    /* One query against many documents: the warp-per-document kernel (the default for varlen
     * documents) with empty and 1-token documents, prefetches across documents, each row-block
     * width, and varlen queries longer than a warp's rows (its separate branch). */
    const int q0[] = {32, 7, 45, 100};
    const size_t dims[] = {128, 64, 96, 128};
    for (int i = 0; i < 4; i++) {
        varlen_q0_len = q0[i];
        run_varlen(i & 1 ? KERN_F16 : KERN_BF16, dims[i], 1, 3000, 1, i < 2 ? 300 : 90, i == 3);
    }
    /* Dense documents, forced: masks (empty documents among them), 64 rows, 1-token docs. */
    kern_gpu_tune.stream_path = 2;
    run_dense(KERN_BF16, 128, 1, 32, 2000, 300, 1);
    run_dense(KERN_F16, 64, 1, 50, 100, 37, 0);
    run_dense(KERN_BF16, 128, 1, 16, 500, 1, 0);
    /* Two tiles in flight per warp instead of the default four, forced. */
    kern_gpu_tune.stream_path = 0;
    kern_gpu_tune.stream_tiles = 2;
    varlen_q0_len = 45;
    run_varlen(KERN_F16, 128, 1, 3000, 1, 300, 1);
    run_dense(KERN_BF16, 128, 1, 32, 2000, 300, 1);
    kern_gpu_tune.stream_tiles = 0;
    run_dense(KERN_BF16, 128, 1, 30, 700, 250, 0);
    /* And the CTA-per-document kernel, forced, on the varlen case. */
    kern_gpu_tune.stream_path = 1;
    varlen_q0_len = 32;
    run_varlen(KERN_BF16, 128, 1, 3000, 1, 300, 0);
    kern_gpu_tune.stream_path = 0;
    varlen_q0_len = 1;
}
END_TEST

/* ---- centroid scores -------------------------------------------------------------------- */
static float *rand_floats(size_t n, float scale)
{
    float *f = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)gauss() * scale;
    return f;
}

static void normalise_rows(float *x, size_t rows, size_t dim)
{
    for (size_t r = 0; r < rows; r++) {
        double s = 0;
        for (size_t j = 0; j < dim; j++)
            s += (double)x[r * dim + j] * x[r * dim + j];
        for (size_t j = 0; j < dim; j++)
            x[r * dim + j] = (float)(x[r * dim + j] / sqrt(s));
    }
}

/* ref [na, nb]: every row of a [na, dim] against every row of b [nb, dim] in double, and mag
 * the sums of the products' magnitudes (the scale of their rounding). */
static void ref_products(const float *a, size_t na, const float *b, size_t nb, size_t dim,
                         double **ref, double **mag)
{
    const size_t n = na * nb > 0 ? na * nb : 1;
    *ref = malloc(n * sizeof(double));
    *mag = malloc(n * sizeof(double));
    for (size_t i = 0; i < na; i++)
        for (size_t k = 0; k < nb; k++) {
            double s = 0, m = 0;
            for (size_t j = 0; j < dim; j++) {
                s += (double)a[i * dim + j] * b[k * dim + j];
                m += fabs((double)a[i * dim + j] * b[k * dim + j]);
            }
            (*ref)[i * nb + k] = s;
            (*mag)[i * nb + k] = m;
        }
}

START_TEST(test_kernels_gpu_centroid_scores_match_reference)
{
    static const size_t dims[] = {64, 96, 128, 256, 1024, 5};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        /* Up to 300 rows: several tiles of the tensor-core kernel, ragged at both edges. */
        size_t dim = dims[di], lq = urnd(1, 300), nc = urnd(1, 3000);
        float *q = rand_floats(lq * dim, 1), *c = rand_floats(nc * dim, 1);
        float *qd = dev_put(q, lq * dim * 4), *cd = dev_put(c, nc * dim * 4);
        float *sd = dev_poisoned(lq * nc);
        expect_ok(kern_centroid_scores(KERN_DEV_CUDA, qd, lq, cd, nc, dim, sd));
        float *got = dev_get_floats(sd, lq * nc);
        float *cpu = host_poisoned(lq * nc);
        expect_ok(kern_centroid_scores(KERN_DEV_CPU, q, lq, c, nc, dim, cpu));
        double *ref, *mag;
        ref_products(q, lq, c, nc, dim, &ref, &mag);
        compare("centroid_scores", got, ref, mag, lq * nc, 1e-5, 1e-6, 1e-5);
        compare_cpu("centroid_scores", got, cpu, mag, lq * nc, 2e-5, 2e-6);
        free(cpu);
        kern_gpu_free(qd), kern_gpu_free(cd), kern_gpu_free(sd);
        free(q), free(c), free(got), free(ref), free(mag);
    }
}
END_TEST

/* The search's table kernel: centroids that are fp16 numbers, tokens split in two fp16 parts.
 * Against double, at the fp32 call's tolerance (without the lo pass the error is some 2^-12 of
 * each product, 100 times the tolerance), and against the fp32 GPU call on the same values.
 * Some tokens carry tiny values, whose lo part is an fp16 subnormal. */
START_TEST(test_kernels_gpu_centroid_scores_f16)
{
    static const size_t dims[] = {16, 48, 128, 384};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        for (int rep = 0; rep < 2; rep++) {
            size_t dim = dims[di], nc = urnd(1, 3000), nt = rep ? urnd(1, 300) : 256;
            float *c = rand_floats(nc * dim, 1), *q = rand_floats(nt * dim, 1);
            normalise_rows(c, nc, dim);
            normalise_rows(q, nt, dim);
            uint16_t *c16 = malloc(nc * dim * sizeof *c16);
            for (size_t i = 0; i < nc * dim; i++) {
                c16[i] = kern_f32_to_f16(c[i]);
                c[i] = kern_f16_to_f32(c16[i]);
            }
            for (size_t i = 0; i < nt * dim; i += 7)
                q[i] *= 1e-5f;
            float *qd = dev_put(q, nt * dim * 4), *cd = dev_put(c, nc * dim * 4);
            uint16_t *c16d = dev_put(c16, nc * dim * 2);
            float *sd = dev_poisoned(nc * nt), *s32 = dev_poisoned(nc * nt);
            /* A third of the cases ask for the fp16 copy too, into NaN halves, and a third for
             * the int8 copy, into -128 (which no score becomes). */
            const int copy = (int)((rep + di) % 3);
            uint16_t *s16 = NULL;
            int8_t *s8 = NULL;
            if (copy) {
                const size_t bytes = nc * nt * (copy == 1 ? 2 : 1);
                uint8_t *poison = malloc(bytes);
                memset(poison, copy == 1 ? 0xff : 0x80, bytes);
                if (copy == 1)
                    s16 = dev_put(poison, bytes);
                else
                    s8 = dev_put(poison, bytes);
                free(poison);
            }
            /* Two cases in three ask for each column's best as well, into poison. */
            unsigned *cb = NULL;
            if ((rep + di) % 3 != 1) {
                unsigned *poison = malloc(nt * sizeof *poison);
                for (size_t j = 0; j < nt; j++)
                    poison[j] = 0x5a5a5a5au;
                cb = dev_put(poison, nt * sizeof *poison);
                free(poison);
            }
            /* The copy in blocks of random widths (some empty, some odd) where rep is 1, else in
             * one block; the tiles' bests where the columns' are asked for and rep is 0. */
            int64_t *bq = malloc((2 * nt + 3) * sizeof *bq);
            size_t nb = 0;
            bq[0] = 0;
            while (rep && (size_t)bq[nb] < nt) {
                size_t w = urnd(0, 40);
                if (w == 0 && nb % 2) /* empty blocks, but not one after another */
                    w = 1;
                bq[nb + 1] = bq[nb] + (int64_t)(w < nt - (size_t)bq[nb] ? w : nt - (size_t)bq[nb]);
                nb++;
            }
            if (!rep)
                bq[1] = (int64_t)nt, nb = 1;
            int32_t *hblk = malloc(2 * nt * sizeof *hblk), *blk = NULL;
            kern_table_blk(bq, nb, hblk);
            if (rep) {
                /* The device's blocks, as the search finds them, equal the host's. */
                int64_t *dbq = dev_put(bq, (nb + 1) * sizeof *bq);
                int32_t *dblk = malloc(2 * nt * sizeof *dblk);
                for (size_t i = 0; i < 2 * nt; i++)
                    dblk[i] = -5;
                blk = dev_put(dblk, 2 * nt * sizeof *dblk);
                expect_ok(kern_cuda_table_blk(dbq, nb, nt, blk));
                ck_assert_int_eq(kern_gpu_copy(dblk, blk, 2 * nt * sizeof *dblk, 0), KERN_OK);
                ck_assert_msg(memcmp(dblk, hblk, 2 * nt * sizeof *dblk) == 0,
                              "table_blk: the device's blocks differ (%zu blocks)", nb);
                kern_gpu_free(dbq);
                free(dblk);
            }
            const size_t tiles = (nc + KERN_CUDA_TILE_ROWS - 1) / KERN_CUDA_TILE_ROWS;
            unsigned *tk = NULL;
            if (cb && !rep) {
                unsigned *poison = malloc(tiles * nt * sizeof *poison);
                for (size_t j = 0; j < tiles * nt; j++)
                    poison[j] = 0x5a5a5a5au;
                tk = dev_put(poison, tiles * nt * sizeof *poison);
                free(poison);
            }
            if (copy == 2)
                expect_ok(
                    kern_cuda_centroid_scores_f16_i8(c16d, nc, qd, nt, dim, sd, s8, cb, blk, tk));
            else
                expect_ok(
                    kern_cuda_centroid_scores_f16(c16d, nc, qd, nt, dim, sd, s16, cb, blk, tk));
            expect_ok(kern_centroid_scores(KERN_DEV_CUDA, cd, nc, qd, nt, dim, s32));
            float *got = dev_get_floats(sd, nc * nt), *g32 = dev_get_floats(s32, nc * nt);
            double *ref, *mag;
            ref_products(c, nc, q, nt, dim, &ref, &mag);
            compare("centroid_scores_f16", got, ref, mag, nc * nt, 4e-6, 1e-7, 2e-6);
            if (cb) {
                /* Each column's best: the key of the largest of its nc scores as written. */
                unsigned *hb = malloc(nt * sizeof *hb);
                ck_assert_int_eq(kern_gpu_copy(hb, cb, nt * sizeof *hb, 0), KERN_OK);
                for (size_t j = 0; j < nt; j++) {
                    float best = -INFINITY;
                    for (size_t r = 0; r < nc; r++)
                        best = fmaxf(best, got[r * nt + j]);
                    ck_assert_msg(hb[j] == float_key(best), "column %zu's best: %08x, want %08x", j,
                                  hb[j], float_key(best));
                }
                free(hb);
                kern_gpu_free(cb);
            }
            if (tk) {
                /* Each tile's best of each column: the key of the largest of its rows. */
                unsigned *hk = malloc(tiles * nt * sizeof *hk);
                ck_assert_int_eq(kern_gpu_copy(hk, tk, tiles * nt * sizeof *hk, 0), KERN_OK);
                for (size_t t = 0; t < tiles; t++)
                    for (size_t j = 0; j < nt; j++) {
                        float best = -INFINITY;
                        for (size_t r = t * KERN_CUDA_TILE_ROWS;
                             r < nc && r < (t + 1) * KERN_CUDA_TILE_ROWS; r++)
                            best = fmaxf(best, got[r * nt + j]);
                        ck_assert_msg(hk[t * nt + j] == float_key(best),
                                      "tile %zu column %zu's best: %08x, want %08x", t, j,
                                      hk[t * nt + j], float_key(best));
                    }
                free(hk);
                kern_gpu_free(tk);
            }
            if (s16) {
                /* The fp16 copy: each fp32 score rounded to nearest even, in its block. */
                uint16_t *h16 = malloc(nc * nt * 2), *w16 = malloc(nc * nt * 2);
                uint16_t *want = malloc(nc * nt * 2);
                ck_assert_int_eq(kern_gpu_copy(h16, s16, nc * nt * 2, 0), KERN_OK);
                for (size_t i = 0; i < nc * nt; i++)
                    w16[i] = kern_f32_to_f16(got[i]);
                kern_table_blocks(w16, 2, nc, nt, bq, nb, want);
                for (size_t i = 0; i < nc * nt; i++)
                    ck_assert_msg(h16[i] == want[i],
                                  "fp16 copy [%zu] (%zu blocks): %04x, want %04x", i, nb, h16[i],
                                  want[i]);
                free(h16), free(w16), free(want);
                kern_gpu_free(s16);
            }
            if (s8) {
                /* The int8 copy: each fp32 score as kern_f32_to_i8 maps it, within half a
                 * step of the double product, in its block. */
                int8_t *h8 = malloc(nc * nt), *w8 = malloc(nc * nt), *want = malloc(nc * nt);
                ck_assert_int_eq(kern_gpu_copy(h8, s8, nc * nt, 0), KERN_OK);
                for (size_t i = 0; i < nc * nt; i++) {
                    w8[i] = kern_f32_to_i8(got[i]);
                    ck_assert(fabs(w8[i] / 127.0 - fmax(-1, fmin(1, ref[i]))) <= 0.5 / 127 + 1e-5);
                }
                kern_table_blocks(w8, 1, nc, nt, bq, nb, want);
                for (size_t i = 0; i < nc * nt; i++)
                    ck_assert_msg(h8[i] == want[i], "int8 copy [%zu] (%zu blocks): %d, want %d", i,
                                  nb, h8[i], want[i]);
                free(h8), free(w8), free(want);
                kern_gpu_free(s8);
            }
            if (blk)
                kern_gpu_free(blk);
            free(bq), free(hblk);
            compare_cpu("centroid_scores_f16 vs fp32", got, g32, mag, nc * nt, 8e-6, 2e-7);
            kern_gpu_free(qd), kern_gpu_free(cd), kern_gpu_free(c16d);
            kern_gpu_free(sd), kern_gpu_free(s32);
            free(c), free(q), free(c16), free(got), free(g32), free(ref), free(mag);
        }
    }
    /* What it cannot take: a dim not a multiple of 16, unaligned tokens, NULL. */
    float *qd = dev_poisoned(64), *sd = dev_poisoned(64);
    uint16_t *cd = dev_put((uint16_t[64]){0}, 128);
    ck_assert_int_eq(kern_cuda_centroid_scores_f16(cd, 2, qd, 2, 24, sd, NULL, NULL, NULL, NULL),
                     KERN_EINVAL);
    ck_assert_int_eq(
        kern_cuda_centroid_scores_f16(cd, 2, qd + 1, 1, 16, sd, NULL, NULL, NULL, NULL),
        KERN_EINVAL);
    ck_assert_int_eq(kern_cuda_centroid_scores_f16(NULL, 2, qd, 2, 16, sd, NULL, NULL, NULL, NULL),
                     KERN_EINVAL);
    /* Tile keys without the columns' best. */
    ck_assert_int_eq(
        kern_cuda_centroid_scores_f16(cd, 2, qd, 2, 16, sd, NULL, NULL, NULL, (unsigned *)sd),
        KERN_EINVAL);
    expect_ok(kern_cuda_centroid_scores_f16(cd, 0, qd, 2, 16, sd, NULL, NULL, NULL, NULL));
    kern_gpu_free(qd), kern_gpu_free(sd), kern_gpu_free(cd);
}
END_TEST

/* ---- PLAID documents -------------------------------------------------------------------- */
typedef struct plaid_set {
    size_t dim, nc, nd, lq;
    unsigned nbits, code_bytes;
    float *q, *cent, *w, *qc; /* host: query, centroids, bucket weights, q.C */
    uint32_t **codes;         /* per doc */
    uint8_t **res;            /* per doc packed residuals */
    float **inv;              /* per doc inverse norms */
    uint32_t *ntok;
    kern_pdoc *ddocs;   /* device array of device pointers */
    kern_pdoc *hdocs;   /* the same documents in host memory, for the CPU kernels */
    uint16_t **codes16; /* per doc, when code_bytes == 2 */
    void **dbufs;       /* device buffers to free, 3 per doc */
    /* The axes code (plaid_make_axes), or dec NULL: the positions' tables (host) and the
     * counts of 8-, 4-, 2- and 1-bit positions; rb: residual bytes a token either way. */
    float *dec;
    unsigned axes[4];
    size_t rb;
} plaid_set;

static unsigned bucket_of(const uint8_t *packed, size_t j, unsigned nbits)
{
    unsigned b = 0;
    for (unsigned k = 0; k < nbits; k++) {
        size_t bit = j * nbits + k;
        b |= (unsigned)((packed[bit >> 3] >> (7 - (bit & 7))) & 1) << k;
    }
    return b;
}

/* Dims the axes code of byte counts b decodes to. */
static size_t axes_dims(const unsigned b[4])
{
    return (size_t)b[0] + 2 * (size_t)b[1] + 4 * (size_t)b[2] + 8 * (size_t)b[3];
}

/* One token of the axes code decoded in double, as kernels.h defines it: out [dim], the dims
 * past the coded ones 0. */
static void axes_decode(const plaid_set *p, const uint8_t *src, double *out)
{
    size_t d = 0, pos = 0;
    for (unsigned w = 0; w < 4; w++) {
        const size_t per = (size_t)1 << w;
        for (unsigned k = 0; k < p->axes[w]; k++, pos++, d += per)
            for (size_t e = 0; e < per; e++)
                out[d + e] = p->dec[256 * d + src[pos] * per + e];
    }
    for (; d < p->dim; d++)
        out[d] = 0;
}

/* Set: plaid_make_code's axes tables are additive in the bits (additive_tables), so that the
 * GPU takes its bit-plane kernels. */
static int bits_tables;

/* Tables additive in each byte's bits, as index/axes.c fits them but denser: value i of a
 * position owns its bits i w .. i w + w - 1 (w = 8 / values), weights of a uniform quantiser's
 * (2^k a step, a few of them negative), and every other bit of the byte adds a little to it
 * too (a general additive table, which the kernels must take as well). */
static void additive_tables(float *dec, const unsigned axes[4])
{
    float *t = dec;
    for (unsigned w = 0; w < 4; w++) {
        const unsigned per = 1u << w, wb = 8 / per;
        for (unsigned k = 0; k < axes[w]; k++, t += 256 * per) {
            double base[8], D[8][8];
            for (unsigned i = 0; i < per; i++) {
                const double step = 0.08 * (0.5 + (double)(rnd() % 1000) / 1000) / (1u << wb);
                base[i] = 0.02 * gauss() - step * ((1u << wb) - 1) / 2;
                for (unsigned b = 0; b < 8; b++)
                    D[b][i] = b / wb == i ? step * (1u << (b % wb)) * (rnd() % 5 == 0 ? -1 : 1)
                                          : 0.002 * gauss();
            }
            for (unsigned v = 0; v < 256; v++)
                for (unsigned i = 0; i < per; i++) {
                    double s = base[i];
                    for (unsigned b = 0; b < 8; b++)
                        if (v >> b & 1u)
                            s += D[b][i];
                    t[v * per + i] = (float)s;
                }
        }
    }
}

static void plaid_make_code(plaid_set *p, size_t dim, unsigned nbits, const unsigned *axes,
                            unsigned code_bytes, size_t nd, size_t lq, int maxtok)
{
    memset(p, 0, sizeof *p);
    p->dim = dim, p->nbits = nbits, p->code_bytes = code_bytes, p->nd = nd, p->lq = lq;
    if (axes) {
        memcpy(p->axes, axes, sizeof p->axes);
        /* Levels of rotated residuals: a few hundredths, each position's own. */
        const size_t n = 256 * axes_dims(axes);
        p->dec = malloc((n ? n : 1) * sizeof(float));
        for (size_t i = 0; i < n; i++)
            p->dec[i] = (float)(0.04 * gauss());
        if (bits_tables)
            additive_tables(p->dec, axes);
    }
    p->nc = urnd(16, 600);
    p->q = rand_floats(lq * dim + 1, 1);
    normalise_rows(p->q, lq, dim);
    p->cent = rand_floats(p->nc * dim, 1);
    normalise_rows(p->cent, p->nc, dim);
    unsigned nb = 1u << nbits;
    p->w = malloc(nb * sizeof(float));
    for (unsigned b = 0; b < nb; b++) /* ascending, like the codec's quantiles */
        p->w[b] = (float)(-0.06 + 0.12 * (b + 0.5) / nb + 0.002 * (float)gauss());
    p->qc = malloc((lq ? lq : 1) * p->nc * sizeof(float));
    for (size_t i = 0; i < lq; i++)
        for (size_t k = 0; k < p->nc; k++) {
            double s = 0;
            for (size_t j = 0; j < dim; j++)
                s += (double)p->q[i * dim + j] * p->cent[k * dim + j];
            p->qc[i * p->nc + k] = (float)s;
        }
    p->codes = calloc(nd, sizeof *p->codes);
    p->res = calloc(nd, sizeof *p->res);
    p->inv = calloc(nd, sizeof *p->inv);
    p->ntok = calloc(nd, sizeof *p->ntok);
    p->dbufs = calloc(3 * nd, sizeof(void *));
    p->hdocs = calloc(nd, sizeof *p->hdocs);
    p->codes16 = calloc(nd, sizeof *p->codes16);
    kern_pdoc *hd = calloc(nd, sizeof *hd);
    size_t rb = axes ? (size_t)axes[0] + axes[1] + axes[2] + axes[3] : dim * nbits / 8;
    p->rb = rb;
    double *dv = malloc(dim * sizeof(double));
    for (size_t n = 0; n < nd; n++) {
        uint32_t nt = n == 0 ? 0 : n == 1 ? 1 : (uint32_t)urnd(0, maxtok);
        p->ntok[n] = nt;
        p->codes[n] = malloc((nt + 1) * 4);
        p->res[n] = malloc(nt * rb + 1);
        p->inv[n] = malloc((nt + 1) * 4);
        uint16_t *c16 = malloc((nt + 1) * 2);
        for (uint32_t t = 0; t < nt; t++) {
            uint32_t c = (uint32_t)urnd(0, (int)p->nc - 1);
            p->codes[n][t] = c;
            c16[t] = (uint16_t)c;
            for (size_t b = 0; b < rb; b++)
                p->res[n][t * rb + b] = (uint8_t)rnd();
            double s = 0;
            if (axes)
                axes_decode(p, p->res[n] + t * rb, dv);
            for (size_t j = 0; j < dim; j++) {
                double v = p->cent[c * dim + j] +
                           (axes ? dv[j] : p->w[bucket_of(p->res[n] + t * rb, j, nbits)]);
                s += v * v;
            }
            p->inv[n][t] = (float)(1.0 / sqrt(s));
        }
        /* Residuals at an odd offset for some documents: the kernel must not assume alignment. */
        int odd = (int)(rnd() & 1);
        uint8_t *rbuf = malloc(nt * rb + 2);
        memcpy(rbuf + odd, p->res[n], nt * rb);
        uint8_t *rdev = dev_put(rbuf, nt * rb + 2);
        free(rbuf);
        void *cdev =
            code_bytes == 2 ? dev_put(c16, (nt + 1) * 2) : dev_put(p->codes[n], (nt + 1) * 4);
        float *idev = dev_put(p->inv[n], (nt + 1) * 4);
        p->codes16[n] = c16;
        p->hdocs[n].codes = code_bytes == 2 ? (const void *)c16 : (const void *)p->codes[n];
        p->hdocs[n].residuals = p->res[n];
        p->hdocs[n].inv_norms = p->inv[n];
        p->hdocs[n].ntok = nt;
        p->dbufs[3 * n] = rdev, p->dbufs[3 * n + 1] = cdev, p->dbufs[3 * n + 2] = idev;
        hd[n].codes = cdev;
        hd[n].residuals = rdev + odd;
        hd[n].inv_norms = idev;
        hd[n].ntok = nt;
    }
    p->ddocs = dev_put(hd, nd * sizeof *hd);
    free(hd), free(dv);
}

static void plaid_make(plaid_set *p, size_t dim, unsigned nbits, unsigned code_bytes, size_t nd,
                       size_t lq, int maxtok)
{
    plaid_make_code(p, dim, nbits, NULL, code_bytes, nd, lq, maxtok);
}

static void plaid_free(plaid_set *p)
{
    for (size_t n = 0; n < p->nd; n++) {
        free(p->codes[n]), free(p->res[n]), free(p->inv[n]), free(p->codes16[n]);
        for (int k = 0; k < 3; k++)
            kern_gpu_free(p->dbufs[3 * n + k]);
    }
    kern_gpu_free(p->ddocs);
    free(p->codes), free(p->res), free(p->inv), free(p->ntok), free(p->dbufs);
    free(p->hdocs), free(p->codes16);
    free(p->q), free(p->cent), free(p->w), free(p->qc), free(p->dec);
}

/* The double-precision score of rows [r0, r1) of p's query against document n (-inf for an
 * empty one); *mag: the sum over those rows of the largest residual term's magnitude, which
 * bounds the error of its fp16 operands (the centroid term, fp32 q.C, adds fp32 rounding only). */
static double plaid_ref(const plaid_set *p, size_t n, size_t r0, size_t r1, double *mag)
{
    const size_t dim = p->dim, rb = p->rb;
    *mag = 0;
    if (p->ntok[n] == 0)
        return -INFINITY;
    double sum = 0, *dv = malloc(dim * sizeof(double));
    for (size_t i = r0; i < r1; i++) {
        double best = -INFINITY, bres = 0;
        for (uint32_t t = 0; t < p->ntok[n]; t++) {
            uint32_t c = p->codes[n][t];
            double s = 0, r = 0;
            if (p->dec)
                axes_decode(p, p->res[n] + t * rb, dv);
            for (size_t j = 0; j < dim; j++) {
                double wj = p->dec ? dv[j] : p->w[bucket_of(p->res[n] + t * rb, j, p->nbits)];
                s += (double)p->q[i * dim + j] * (p->cent[c * dim + j] + wj);
                r += fabs((double)p->q[i * dim + j] * wj);
            }
            s *= p->inv[n][t];
            if (s > best)
                best = s;
            if (r * p->inv[n][t] > bres)
                bres = r * p->inv[n][t];
        }
        sum += best;
        *mag += bres;
    }
    free(dv);
    return sum;
}

/* The GPU's scores of p's query (kern_maxsim_residual), on device buffers made here; the query
 * shift floats past a 256-byte boundary (1: not 16-byte aligned, so not read as float4). *rc:
 * the call's return (the scores NULL unless KERN_OK). */
static float *residual_try(const plaid_set *p, unsigned code_bytes, int shift, int *rc)
{
    const size_t dim = p->dim, lq = p->lq, nd = p->nd;
    float *qh = calloc(lq * dim + 2, sizeof(float));
    memcpy(qh + shift, p->q, lq * dim * sizeof(float));
    float *qd = dev_put(qh, (lq * dim + 2) * 4), *qcd = dev_put(p->qc, lq * p->nc * 4 + 4);
    float *wd = dev_put(p->w, (1u << p->nbits) * 4);
    float *decd = p->dec ? dev_put(p->dec, (256 * axes_dims(p->axes) + 1) * 4) : NULL;
    float *sd = dev_poisoned(nd);
    const float *qs = qd + shift;
    kern_residual a = {dim,      p->nbits, code_bytes, qs, lq,   qcd,          p->nc, wd,
                       p->ddocs, nd,       NULL,       0,  NULL, {0, 0, 0, 0}, 0};
    if (p->dec) { /* the axes code: no bucket weights */
        a.bucket_weights = NULL;
        a.axes_dec = decd;
        memcpy(a.axes_bytes, p->axes, sizeof a.axes_bytes);
        a.axes_additive = kern_axes_additive(p->dec, p->axes);
    }
    *rc = kern_maxsim_residual(KERN_DEV_CUDA, &a, sd);
    float *got = NULL;
    if (*rc == KERN_OK)
        got = dev_get_floats(sd, nd);
    kern_gpu_free(qd), kern_gpu_free(qcd), kern_gpu_free(wd), kern_gpu_free(sd);
    kern_gpu_free(decd);
    free(qh);
    return got;
}

static float *residual_on_gpu(const plaid_set *p, unsigned code_bytes, int shift)
{
    int rc;
    float *got = residual_try(p, code_bytes, shift, &rc);
    expect_ok(rc);
    return got;
}

/* paths: besides the automatic choice (which the reference checks), the MMA kernel forced
 * (kern_gpu_tune.residual_path 1: KERN_EINVAL, so a failed test, where the shape has none),
 * with the query off 16-byte alignment (its fragments then loaded 4 bytes at a time), must
 * give the same scores bit for bit, so the automatic choice was that kernel; the exact fp32
 * kernel (2) must meet the reference too and differ from them somewhere (it rounds nothing
 * to fp16), so the knob does choose. */
static void run_residual_code(size_t dim, unsigned nbits, const unsigned *axes, unsigned code_bytes,
                              size_t nd, size_t lq, int maxtok, int paths)
{
    plaid_set p;
    plaid_make_code(&p, dim, nbits, axes, code_bytes, nd, lq, maxtok);
    float *got = residual_on_gpu(&p, code_bytes, 0);
    kern_residual h = {dim,     nbits, code_bytes, p.q, lq,   p.qc,         p.nc, p.w,
                       p.hdocs, nd,    NULL,       0,   NULL, {0, 0, 0, 0}, 0};
    if (axes) {
        h.axes_dec = p.dec;
        memcpy(h.axes_bytes, axes, sizeof h.axes_bytes);
    }
    float *cpu = host_poisoned(nd);
    expect_ok(kern_maxsim_residual(KERN_DEV_CPU, &h, cpu));
    double *ref = malloc(nd * sizeof(double)), *mag = malloc(nd * sizeof(double));
    for (size_t n = 0; n < nd; n++)
        ref[n] = plaid_ref(&p, n, 0, lq, &mag[n]);
    char what[160];
    if (axes)
        snprintf(what, sizeof what, "residual axes %u/%u/%u/%u dim %zu code_bytes %u lq %zu nd %zu",
                 axes[0], axes[1], axes[2], axes[3], dim, code_bytes, lq, nd);
    else
        snprintf(what, sizeof what, "residual dim %zu nbits %u code_bytes %u lq %zu", dim, nbits,
                 code_bytes, lq);
    const double agg = residual_agg(ref, mag, nd, dim);
    double e = compare(what, got, ref, mag, nd, 2e-3, 1e-5 * (double)(lq + 1), agg);
    compare_cpu(what, got, cpu, mag, nd, 2e-3, 2e-5 * (double)(lq + 1));
    fprintf(stderr, "%s: relative error %.3g (bound %.3g)\n", what, e, agg);
    if (paths) {
        const int saved = kern_gpu_tune.residual_path;
        kern_gpu_tune.residual_path = 1;
        float *mma = residual_on_gpu(&p, code_bytes, 1);
        kern_gpu_tune.residual_path = 2;
        float *exact = residual_on_gpu(&p, code_bytes, 0);
        kern_gpu_tune.residual_path = saved;
        ck_assert_msg(memcmp(mma, got, nd * sizeof(float)) == 0,
                      "%s: the automatic choice is not the MMA kernel", what);
        compare(what, exact, ref, mag, nd, 2e-3, 1e-5 * (double)(lq + 1), agg);
        int differs = 0;
        for (size_t n = 0; n < nd; n++)
            differs |= p.ntok[n] > 0 && lq > 0 && memcmp(&exact[n], &mma[n], 4) != 0;
        ck_assert_msg(differs || lq == 0, "%s: the exact kernel gave the MMA kernel's bits", what);
        free(mma), free(exact);
    }
    free(cpu), free(got), free(ref), free(mag);
    plaid_free(&p);
}

static void run_residual_paths(size_t dim, unsigned nbits, unsigned code_bytes, size_t nd,
                               size_t lq, int maxtok, int paths)
{
    run_residual_code(dim, nbits, NULL, code_bytes, nd, lq, maxtok, paths);
}

static void run_residual(size_t dim, unsigned nbits, unsigned code_bytes, size_t nd, size_t lq,
                         int maxtok)
{
    run_residual_paths(dim, nbits, code_bytes, nd, lq, maxtok, 0);
}

/* Whether the device has the shared memory a CTA of the dim-768 batched kernel takes (196 KB of
 * query fragments and its decode table; sm_90 has 227 KB, sm_80 163: there the exact kernel
 * runs and forcing the MMA kernel is an error). */
static int gpu_smem_for_768(void)
{
    int dev = 0, optin = 0;
    ck_assert_int_eq(cudaGetDevice(&dev), cudaSuccess);
    ck_assert_int_eq(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                     cudaSuccess);
    return optin >= 4 * 48 * 1024 + 5 * 1024;
}

/* Whether the big-dim cases check dim on this device (dim 768 needs gpu_smem_for_768). */
static int big_dim_checked(size_t dim)
{
    if (dim != 768 || gpu_smem_for_768())
        return 1;
    fprintf(stderr, "dim 768: the device lacks the shared memory; not checked\n");
    return 0;
}

START_TEST(test_kernels_gpu_residual_matches_reference)
{
    static const size_t dims[] = {64, 96, 128, 256, 48};
    static const unsigned nbits[] = {1, 2, 4, 8};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (size_t bi = 0; bi < sizeof nbits / sizeof nbits[0]; bi++)
            run_residual(dims[di], nbits[bi], (rnd() & 1) ? 2 : 4, urnd(3, 60), urnd(1, 40), 120);
    run_residual(128, 2, 2, 50, 1, 300);  /* Lq 1 */
    run_residual(128, 2, 4, 20, 32, 300); /* ColBERT's shape */
    run_residual(128, 2, 2, 10, 70, 200); /* rows over several units */
}
END_TEST

/* Many more documents than resident warps: each warp walks several documents, so the
 * pipelined kernel's loads of a warp's next document (issued during the current one's last
 * tiles) are exercised, with empty documents, queries over several 32-row units and a query
 * without rows among them; every launch variant of the kernel. */
START_TEST(test_kernels_gpu_residual_variants_many_docs)
{
    /* asmem 2: one query's A fragments in registers (the default keeps them in shared memory
     * where lq <= 32); ctas 5: the shared-memory variant fitted to 5 CTAs an SM; one 1-19: the
     * one-query kernel's variants (nbits 2, dim 64 / 128, lq <= 32; ONE_VARIANTS in
     * kernels/residual_cuda.cu: table or byte-permute decode, 4- or 16-byte q.C loads, 2 or 4
     * tiles, pipelined or not, 3 to 5 CTAs, half or quarter end steps, L2 prefetch, the
     * centroid term before or after the MMAs), several under both schedules. */
    static const struct {
        int tiles, pipe, ctas, sched, asmem, one;
    } v[] = {{0, 0, 0, 0, 0, 0},  {0, 0, 0, 2, 0, 0},  {0, 2, 0, 0, 0, 0},  {0, 2, 0, 2, 0, 0},
             {0, 0, 4, 0, 0, 0},  {0, 2, 4, 2, 0, 0},  {4, 0, 0, 0, 0, 0},  {4, 2, 0, 2, 0, 0},
             {0, 0, 0, 0, 2, 0},  {0, 0, 5, 0, 0, 0},  {0, 0, 5, 2, 0, 0},  {0, 0, 0, 0, 0, 1},
             {0, 0, 0, 0, 0, 2},  {0, 0, 0, 0, 0, 3},  {0, 0, 0, 2, 0, 4},  {0, 0, 0, 0, 0, 5},
             {0, 0, 0, 2, 0, 5},  {0, 0, 0, 0, 0, 6},  {0, 0, 0, 0, 0, 7},  {0, 0, 0, 0, 0, 8},
             {0, 0, 0, 2, 0, 8},  {0, 0, 0, 0, 0, 9},  {0, 0, 0, 0, 0, 10}, {0, 0, 0, 0, 0, 11},
             {0, 0, 0, 0, 0, 12}, {0, 0, 0, 0, 0, 13}, {0, 0, 0, 0, 0, 14}, {0, 0, 0, 2, 0, 14},
             {0, 0, 0, 0, 0, 15}, {0, 0, 0, 2, 0, 15}, {0, 0, 0, 0, 0, 16}, {0, 0, 0, 0, 0, 17},
             {0, 0, 0, 2, 0, 17}, {0, 0, 0, 0, 0, 18}, {0, 0, 0, 0, 0, 19}, {0, 0, 0, 2, 0, 19}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        kern_gpu_tune.residual_tiles = v[i].tiles;
        kern_gpu_tune.residual_pipe = v[i].pipe;
        kern_gpu_tune.residual_ctas = v[i].ctas;
        kern_gpu_tune.residual_sched = v[i].sched;
        kern_gpu_tune.residual_asmem = v[i].asmem;
        kern_gpu_tune.residual_one = v[i].one;
        fprintf(stderr, "variant tiles %d pipe %d ctas %d sched %d asmem %d one %d\n", v[i].tiles,
                v[i].pipe, v[i].ctas, v[i].sched, v[i].asmem, v[i].one);
        run_residual(128, 2, 4, 5000, 32, 24);
        run_residual(64, 2, 2, 4000, 17, 40); /* the one-query kernel at dim 64, rows < 32 */
        run_residual(64, 1, 2, 4000, 40, 19);
        run_residual(96, 4, 4, 3000, 7, 33);
        run_residual(128, 8, 2, 3000, 33, 9);
        run_residual(128, 2, 2, 3000, 0, 12);
    }
    kern_gpu_tune.residual_tiles = kern_gpu_tune.residual_pipe = 0;
    kern_gpu_tune.residual_sched = 0;
    kern_gpu_tune.residual_ctas = kern_gpu_tune.residual_asmem = 0;
    kern_gpu_tune.residual_one = 0;
}
END_TEST

/* Dims past 256, where the MMA kernel keeps the query's fragments in shared memory instead of
 * registers (RES_AW in kernels/residual_cuda.cu), at every nbits: one query of <= 32 rows (one
 * copy for the CTA), more rows (a copy a warp, refilled for each 32-row unit), rows <= 32 in
 * the per-warp layout too (asmem 2), and many more documents than warps (each warp's
 * pipelined loads of its next document). Every call also forced onto the MMA kernel and onto
 * the exact one (run_residual_paths): the dims are the kernel's, not the exact kernel's. */
START_TEST(test_kernels_gpu_residual_big_dims)
{
    static const size_t dims[] = {320, 384, 512, 768};
    static const unsigned nbits[] = {1, 2, 4, 8};
    static const size_t lqs[] = {1, 17, 32, 33, 70};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        if (!big_dim_checked(dims[di]))
            continue;
        for (size_t bi = 0; bi < sizeof nbits / sizeof nbits[0]; bi++) {
            for (size_t li = 0; li < sizeof lqs / sizeof lqs[0]; li++)
                run_residual_paths(dims[di], nbits[bi], (rnd() & 1) ? 2 : 4, urnd(3, 40), lqs[li],
                                   80, 1);
            kern_gpu_tune.residual_asmem = 2;
            run_residual_paths(dims[di], nbits[bi], 4, urnd(3, 40), urnd(1, 32), 80, 1);
            kern_gpu_tune.residual_asmem = 0;
            run_residual_paths(dims[di], nbits[bi], 2, 1500, urnd(1, 40), 12, 1);
        }
    }
}
END_TEST

/* A batched call's inputs: p's documents as resident arrays, nq queries as rows of p's query
 * table (q_off), pairs as kern_cuda_exact_scores takes them. */
typedef struct exact_set {
    kern_cuda_exact a;
    void *bufs[11];
    size_t pairs;
} exact_set;

static void exact_make(exact_set *x, const plaid_set *p, const int64_t *qoff, size_t nq,
                       const uint32_t *docs, size_t per_q, int cross)
{
    const size_t nd = p->nd, rb = p->rb, T = (size_t)qoff[nq];
    int64_t *doff = malloc((nd + 1) * 8);
    doff[0] = 0;
    for (size_t n = 0; n < nd; n++)
        doff[n + 1] = doff[n] + p->ntok[n];
    const size_t tot = (size_t)doff[nd];
    uint32_t *codes = malloc((tot + 1) * 4);
    float *inv = malloc((tot + 1) * 4);
    /* The residuals at an odd address half the time: the kernel must not assume alignment. */
    const int odd = (int)(rnd() & 1);
    uint8_t *res = malloc(tot * rb + 2);
    for (size_t n = 0; n < nd; n++) {
        memcpy(codes + doff[n], p->codes[n], p->ntok[n] * 4);
        memcpy(inv + doff[n], p->inv[n], p->ntok[n] * 4);
        memcpy(res + odd + doff[n] * rb, p->res[n], p->ntok[n] * rb);
    }
    float *st = calloc(p->nc * T + KERN_CUDA_ST_SLACK, 4);
    for (size_t i = 0; i < T; i++)
        for (size_t c = 0; c < p->nc; c++)
            st[c * T + i] = p->qc[i * p->nc + c];
    memset(x, 0, sizeof *x);
    x->pairs = nq * per_q;
    void **b = x->bufs;
    b[0] = dev_put(p->q, T * p->dim * 4);
    b[1] = dev_put(qoff, (nq + 1) * 8);
    b[2] = dev_put(st, (p->nc * T + KERN_CUDA_ST_SLACK) * 4);
    b[3] = dev_put(p->w, (1u << p->nbits) * 4);
    b[4] = dev_put(doff, (nd + 1) * 8);
    b[5] = dev_put(codes, (tot + 1) * 4);
    b[6] = dev_put(res, tot * rb + 2);
    b[7] = dev_put(inv, (tot + 1) * 4);
    b[8] = dev_put(docs, (cross ? per_q : nq * per_q) * 4);
    /* The queries again, one float past alignment (qshifted): read 4 bytes at a time. */
    float *qh = calloc(T * p->dim + 1, sizeof(float));
    memcpy(qh + 1, p->q, T * p->dim * sizeof(float));
    b[9] = dev_put(qh, (T * p->dim + 1) * 4);
    free(qh);
    x->a = (kern_cuda_exact){.dim = p->dim,
                             .nbits = p->nbits,
                             .q = b[0],
                             .q_off = b[1],
                             .h_q_off = qoff,
                             .nq = nq,
                             .ST = b[2],
                             .ld = T,
                             .n_centroids = p->nc,
                             .bucket_weights = b[3],
                             .doc_off = b[4],
                             .codes = b[5],
                             .residuals = (const uint8_t *)b[6] + odd,
                             .inv_norms = b[7],
                             .docs = b[8],
                             .per_q = per_q,
                             .cross = cross};
    if (p->dec) { /* the axes code: no bucket weights */
        b[10] = dev_put(p->dec, (256 * axes_dims(p->axes) + 1) * 4);
        x->a.bucket_weights = NULL;
        x->a.axes_dec = b[10];
        memcpy(x->a.axes_bytes, p->axes, sizeof x->a.axes_bytes);
        x->a.axes_additive = kern_axes_additive(p->dec, p->axes);
    }
    free(doff), free(codes), free(inv), free(res), free(st);
}

/* The scores of x's pairs by kern_cuda_exact_scores (the path kern_gpu_tune says). */
static float *exact_on_gpu(const exact_set *x)
{
    float *sd = dev_poisoned(x->pairs);
    expect_ok(kern_cuda_exact_scores(&x->a, sd));
    float *got = dev_get_floats(sd, x->pairs);
    kern_gpu_free(sd);
    return got;
}

static void exact_free(exact_set *x)
{
    for (int i = 0; i < 11; i++)
        kern_gpu_free(x->bufs[i]);
}

/* nq queries of 1 to 70 rows (their rows side by side in one table, as GPU search and
 * calibration lay them out) against per_q documents each, their own lists or one list for all
 * (cross), with missing (KERN_NO_DOC) and empty documents among them: the automatic choice,
 * the MMA kernel forced (the same bits, also from queries off 16-byte alignment) and the
 * exact kernel (other bits), each against the reference. */
static void run_exact_code(size_t dim, unsigned nbits, const unsigned *axes, size_t nq,
                           size_t per_q, int cross, int maxtok)
{
    static const int64_t lens[] = {32, 70, 1, 33, 17, 32, 64, 5};
    int64_t *qoff = malloc((nq + 1) * 8);
    qoff[0] = 0;
    size_t lq_max = 0;
    for (size_t i = 0; i < nq; i++) {
        const int64_t l = lens[(i + rnd()) % 8];
        qoff[i + 1] = qoff[i] + l;
        lq_max = (size_t)l > lq_max ? (size_t)l : lq_max;
    }
    plaid_set p;
    plaid_make_code(&p, dim, nbits, axes, 4, urnd(20, 60), (size_t)qoff[nq], maxtok);
    const size_t pairs = nq * per_q, nlist = cross ? per_q : pairs;
    uint32_t *docs = malloc(nlist * 4);
    for (size_t i = 0; i < nlist; i++)
        docs[i] = rnd() % 10 == 0 ? KERN_NO_DOC : (uint32_t)urnd(0, p.nd - 1);
    exact_set x;
    exact_make(&x, &p, qoff, nq, docs, per_q, cross);
    double *ref = malloc(pairs * sizeof(double)), *mag = malloc(pairs * sizeof(double));
    for (size_t n = 0; n < pairs; n++) {
        const size_t qi = n / per_q;
        const uint32_t d = docs[cross ? n % per_q : n];
        mag[n] = 0;
        ref[n] = d == KERN_NO_DOC
                     ? -INFINITY
                     : plaid_ref(&p, d, (size_t)qoff[qi], (size_t)qoff[qi + 1], &mag[n]);
    }
    char what[160];
    if (axes)
        snprintf(what, sizeof what, "batched axes %u/%u/%u/%u dim %zu nq %zu per_q %zu cross %d",
                 axes[0], axes[1], axes[2], axes[3], dim, nq, per_q, cross);
    else
        snprintf(what, sizeof what, "batched dim %zu nbits %u nq %zu per_q %zu cross %d", dim,
                 nbits, nq, per_q, cross);
    const int saved = kern_gpu_tune.residual_path;
    float *got[5];
    for (int path = 0; path < 3; path++) {
        kern_gpu_tune.residual_path = path;
        got[path] = exact_on_gpu(&x);
    }
    kern_gpu_tune.residual_path = 1; /* the queries off 16-byte alignment */
    const float *q_aligned = x.a.q;
    x.a.q = (const float *)x.bufs[9] + 1;
    got[3] = exact_on_gpu(&x);
    x.a.q = q_aligned;
    /* Each warp building the A fragments from q, as before they were packed once. */
    kern_gpu_tune.residual_afpack = 2;
    got[4] = exact_on_gpu(&x);
    kern_gpu_tune.residual_afpack = 0;
    kern_gpu_tune.residual_path = saved;
    if (!cross) {
        /* A list of pairs (pair_q: the exact rounds of GPU search), about 70% of them in
         * order: each scores what the same pair scored in the [nq, per_q] layout, bit for bit,
         * on each path. */
        uint32_t *ld = malloc(pairs * 4 + 4), *lq = malloc(pairs * 4 + 4);
        size_t *from = malloc(pairs * sizeof *from + 8), np = 0;
        for (size_t n = 0; n < pairs; n++)
            if (rnd() % 10 < 7) {
                ld[np] = docs[n];
                lq[np] = (uint32_t)(n / per_q);
                from[np++] = n;
            }
        if (np) {
            exact_set y = x;
            y.a.docs = dev_put(ld, np * 4);
            y.a.pair_q = dev_put(lq, np * 4);
            y.a.per_q = np;
            y.pairs = np;
            for (int path = 0; path < 4; path++) {
                kern_gpu_tune.residual_path = path < 3 ? path : 1;
                kern_gpu_tune.residual_afpack = path < 3 ? 0 : 2;
                float *gl = exact_on_gpu(&y);
                for (size_t i = 0; i < np; i++)
                    ck_assert_msg(memcmp(&gl[i], &got[path < 3 ? path : 4][from[i]], 4) == 0,
                                  "%s: pair list, path %d, pair %zu: %g against %g", what, path,
                                  from[i], gl[i], got[path < 3 ? path : 4][from[i]]);
                free(gl);
            }
            kern_gpu_tune.residual_afpack = 0;
            kern_gpu_tune.residual_path = saved;
            y.a.cross = 1; /* a list is not crossed */
            float *sd = dev_poisoned(np);
            ck_assert_int_eq(kern_cuda_exact_scores(&y.a, sd), KERN_EINVAL);
            kern_gpu_free(sd);
            kern_gpu_free((void *)y.a.docs), kern_gpu_free((void *)y.a.pair_q);
        }
        free(ld), free(lq), free(from);
    }
    /* The aggregate error is an estimate from the scored pairs: with few of them (nq 3 per_q 1
     * scores at most 3) it spreads as 1/sqrt(count), so its bound widens below 16 pairs; the
     * per-pair bound stays. */
    const double abs_tol = 1e-5 * (double)(lq_max + 1);
    int differs = 0;
    size_t scored = 0;
    for (size_t n = 0; n < pairs; n++)
        scored += isfinite(ref[n]) != 0;
    const double agg = residual_agg(ref, mag, pairs, dim) *
                       (scored < 16 ? sqrt(16.0 / (double)(scored ? scored : 1)) : 1.0);
    double e = compare(what, got[0], ref, mag, pairs, 2e-3, abs_tol, agg);
    compare(what, got[2], ref, mag, pairs, 2e-3, abs_tol, agg);
    ck_assert_msg(memcmp(got[0], got[1], pairs * sizeof(float)) == 0,
                  "%s: the automatic choice is not the MMA kernel", what);
    ck_assert_msg(memcmp(got[1], got[3], pairs * sizeof(float)) == 0,
                  "%s: other scores from unaligned queries", what);
    ck_assert_msg(memcmp(got[1], got[4], pairs * sizeof(float)) == 0,
                  "%s: the packed A fragments give other scores than q's", what);
    for (size_t n = 0; n < pairs; n++)
        differs |= isfinite(ref[n]) && memcmp(&got[1][n], &got[2][n], 4) != 0;
    ck_assert_msg(differs || !scored, "%s: the exact kernel gave the MMA kernel's bits", what);
    fprintf(stderr, "%s: relative error %.3g (bound %.3g)\n", what, e, agg);
    for (int path = 0; path < 5; path++)
        free(got[path]);
    exact_free(&x);
    free(ref), free(mag), free(docs), free(qoff);
    plaid_free(&p);
}

static void run_exact_batched(size_t dim, unsigned nbits, size_t nq, size_t per_q, int cross,
                              int maxtok)
{
    run_exact_code(dim, nbits, NULL, nq, per_q, cross, maxtok);
}

/* The batched layout (q_off: GPU search's exact stage, calibration) at the dims past 256 and
 * at 64, 128 and 256 (the query's fragments in registers, packed once for all warps), every
 * nbits: few documents with long ones among them, and many short ones (warps walk several
 * pairs, and several queries). */
START_TEST(test_kernels_gpu_residual_batched)
{
    static const size_t dims[] = {64, 128, 256, 320, 384, 512, 768};
    static const unsigned nbits[] = {1, 2, 4, 8};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        if (!big_dim_checked(dims[di]))
            continue;
        for (size_t bi = 0; bi < sizeof nbits / sizeof nbits[0]; bi++) {
            run_exact_batched(dims[di], nbits[bi], urnd(1, 6), urnd(1, 30), 0, 100);
            run_exact_batched(dims[di], nbits[bi], urnd(2, 6), urnd(1, 30), 1, 100);
            run_exact_batched(dims[di], nbits[bi], 8, 300, (int)(rnd() & 1), 10);
        }
    }
}
END_TEST

/* ---- the axes code (index/axes.h) -------------------------------------------------------- */

/* A random split of dim's axes into counts of 8-, 4-, 2- and 1-bit byte positions: mode 0 all
 * four widths (every dim coded, or dims left over that decode to 0), 1 to 4 one width only
 * (8, 4, 2 or 1 bits), filling dim or not. */
static void axes_split(size_t dim, int mode, unsigned b[4])
{
    memset(b, 0, 4 * sizeof *b);
    if (mode == 0) {
        size_t rem = dim;
        b[0] = (unsigned)urnd(1, dim / 8);
        rem -= b[0];
        b[1] = (unsigned)urnd(1, rem / 8);
        rem -= 2 * (size_t)b[1];
        b[2] = (unsigned)urnd(1, rem / 16);
        rem -= 4 * (size_t)b[2];
        b[3] = (unsigned)((rnd() & 1) ? rem / 8 : urnd(1, rem / 8));
        rem -= 8 * (size_t)b[3];
        if (rnd() & 1) /* every dim coded: the rest as 8-bit axes */
            b[0] += (unsigned)rem;
    } else {
        const unsigned w = (unsigned)mode - 1, per = 1u << w;
        b[w] = (unsigned)((rnd() & 1) ? dim / per : urnd(1, dim / per));
    }
}

/* The axes code through kern_maxsim_residual on the GPU, against the double-precision reference
 * and the CPU kernel (run_residual_code's tolerances, those of the scalar code), at dims 64,
 * 96 and 128 (the MMA kernel, also forced, and the exact fp32 kernel forced: paths), every
 * mode of axes_split, code_bytes 2 and 4, ragged documents with empty ones, query rows under,
 * at and over 32; token bytes that are not a multiple of 4 and residuals at odd addresses
 * come with the random splits and plaid_make. Dims the MMA kernel lacks (48, 256) take the
 * exact kernel, and forcing the MMA kernel there is an error. Many documents: each warp walks
 * several. */
START_TEST(test_kernels_gpu_residual_axes)
{
    static const size_t dims[] = {64, 96, 128};
    static const size_t lqs[] = {1, 17, 32, 33, 70};
    unsigned b[4];
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int mode = 0; mode < 5; mode++)
            for (size_t li = 0; li < sizeof lqs / sizeof lqs[0]; li++) {
                axes_split(dims[di], mode, b);
                run_residual_code(dims[di], 2, b, (rnd() & 1) ? 2 : 4, urnd(3, 60), lqs[li], 120,
                                  1);
            }
    axes_split(128, 0, b);
    run_residual_code(128, 2, b, 2, 6000, 32, 24, 1);
    axes_split(96, 0, b);
    run_residual_code(96, 2, b, 4, 3000, 7, 33, 1);
    axes_split(128, 0, b);
    run_residual_code(128, 2, b, 2, 500, 0, 12, 0); /* a query without rows */
    static const size_t other[] = {48, 256};
    for (size_t di = 0; di < 2; di++) {
        axes_split(other[di], 0, b);
        run_residual_code(other[di], 2, b, 4, urnd(3, 60), urnd(1, 40), 100, 0);
    }
}
END_TEST

/* The same code through kern_cuda_exact_scores: pairs [nq, per_q], crossed (4 queries or
 * more: the cross kernel), and as a list (run_exact_code: the automatic choice, the MMA and
 * exact kernels forced, queries off 16-byte alignment, each against the reference). */
START_TEST(test_kernels_gpu_residual_axes_batched)
{
    static const size_t dims[] = {64, 96, 128};
    unsigned b[4];
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int mode = 0; mode < 5; mode++) {
            axes_split(dims[di], mode, b);
            run_exact_code(dims[di], 2, b, urnd(1, 6), urnd(1, 30), 0, 100);
            axes_split(dims[di], mode, b);
            run_exact_code(dims[di], 2, b, urnd(2, 6), urnd(1, 30), 1, 100);
            axes_split(dims[di], mode, b);
            run_exact_code(dims[di], 2, b, 8, 300, (int)(rnd() & 1), 10);
            /* Crossed, many queries (groups of a CTA's warps, the last part empty) against
             * documents longer than the cross kernel's chunks. */
            axes_split(dims[di], mode, b);
            run_exact_code(dims[di], 2, b, 13, 40, 1, 300);
        }
}
END_TEST

/* The bit-plane kernels, which take tables additive in the bits (kern_axes_additive), against
 * the reference as the two tests above: first the test itself, which holds for additive_tables
 * and for no random table or additive one with one entry moved by 1e-4 of the largest; then
 * one query (rows under, at and over 32) of few pairs (the split kernel) and of many (the
 * per-warp kernel, its A fragments shared), with the split kernel forced and forbidden, at
 * dims with table kernels (64, 128: the bit-plane kernels forced) and without (200, 384),
 * every mode of axes_split; then batched pairs, crossed and listed (the per-warp kernel, A
 * from global memory); last, dims 384 and 256 without forcing. */
START_TEST(test_kernels_gpu_residual_axes_bits)
{
    unsigned b[4];
    for (int k = 0; k < 6; k++) {
        axes_split(128, k % 5, b);
        const size_t n = 256 * axes_dims(b);
        float *dec = malloc(n * sizeof *dec);
        for (size_t i = 0; i < n; i++)
            dec[i] = (float)(0.04 * gauss());
        ck_assert_int_eq(kern_axes_additive(dec, b), 0);
        additive_tables(dec, b);
        ck_assert_int_eq(kern_axes_additive(dec, b), 1);
        float big = 0;
        for (size_t i = 0; i < n; i++)
            big = fmaxf(big, fabsf(dec[i]));
        /* Any entry: one of value 0 or 1 << b moves what others derive from (value 3 or
         * 1 << b | 1 then disagrees), any other disagrees itself. */
        const size_t at = (size_t)urnd(0, (int)n - 1);
        const float was = dec[at];
        dec[at] = was + 1e-4f * big;
        const int add = kern_axes_additive(dec, b);
        dec[at] = was;
        ck_assert_msg(add == 0, "entry %zu moved, still additive", at);
        free(dec);
    }
    bits_tables = 1;
    /* Dims 200 and 384 take them by themselves (the paths check: forcing an MMA kernel gives
     * the automatic choice's bits); 64 and 128 where told to. */
    setenv("TARTAN_GPU_AXES_BITS", "1", 1);
    static const size_t dims[] = {64, 128, 200, 384};
    static const size_t lqs[] = {1, 32, 33};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int mode = 0; mode < 5; mode++)
            for (size_t li = 0; li < sizeof lqs / sizeof lqs[0]; li++) {
                axes_split(dims[di], mode, b);
                run_residual_code(dims[di], 2, b, (rnd() & 1) ? 2 : 4, urnd(3, 60), lqs[li], 120,
                                  1);
            }
    axes_split(128, 0, b);
    run_residual_code(128, 2, b, 2, 3000, 32, 24, 1);
    setenv("TARTAN_GPU_AXES_SPLIT", "1", 1);
    axes_split(384, 2, b);
    run_residual_code(384, 2, b, 4, 2000, 20, 40, 1);
    setenv("TARTAN_GPU_AXES_SPLIT", "0", 1);
    axes_split(200, 0, b);
    run_residual_code(200, 2, b, 4, 40, 31, 90, 1);
    unsetenv("TARTAN_GPU_AXES_SPLIT");
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int mode = 0; mode < 5; mode += 2) {
            axes_split(dims[di], mode, b);
            run_exact_code(dims[di], 2, b, urnd(1, 6), urnd(1, 30), 0, 100);
            axes_split(dims[di], mode, b);
            run_exact_code(dims[di], 2, b, 13, 40, 1, 300);
            axes_split(dims[di], mode, b);
            run_exact_code(dims[di], 2, b, 8, 300, (int)(rnd() & 1), 10);
        }
    unsetenv("TARTAN_GPU_AXES_BITS");
    axes_split(384, 0, b);
    run_residual_code(384, 2, b, 4, 50, 32, 100, 1);
    axes_split(256, 3, b);
    run_exact_code(256, 2, b, 5, 30, 1, 100);
    bits_tables = 0;
}
END_TEST

/* Byte counts that decode to more dims than dim are refused on both calls, before any work. */
START_TEST(test_kernels_gpu_residual_mma_dims)
{
    /* kern_residual_mma_dim, which training's codec auto weighs, against the kernels: with the
     * MMA path forced, each code runs at the dims it names and is refused at the others (an
     * H100 or H200 holds every table these dims need in a CTA's shared memory). */
    static const size_t dims[] = {48, 64, 96, 128, 192, 256, 384};
    const int saved = kern_gpu_tune.residual_path;
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        for (int axes = 0; axes < 2; axes++) {
            const size_t dim = dims[i];
            const unsigned layout[4] = {0, 0, (unsigned)dim / 4, 0}; /* every dim 2 bits */
            plaid_set p;
            plaid_make_code(&p, dim, 2, axes ? layout : NULL, 4, 5, 3, 10);
            kern_gpu_tune.residual_path = 1;
            int rc;
            float *got = residual_try(&p, 4, 0, &rc);
            kern_gpu_tune.residual_path = saved;
            const int want = kern_residual_mma_dim(dim, axes) ? KERN_OK : KERN_EINVAL;
            ck_assert_msg(rc == want, "dim %zu, %s code: %d from the forced MMA path, want %d", dim,
                          axes ? "axes" : "scalar", rc, want);
            free(got);
            plaid_free(&p);
        }
}
END_TEST

START_TEST(test_kernels_gpu_residual_axes_bad_arguments)
{
    const size_t dim = 64;
    const unsigned ok[4] = {8, 8, 4, 3}, bad[4] = {8, 8, 4, 4}; /* 64 dims, then 72 */
    plaid_set p;
    plaid_make_code(&p, dim, 2, ok, 4, 5, 3, 10);
    float *qd = dev_put(p.q, 3 * dim * 4), *qcd = dev_put(p.qc, 3 * p.nc * 4 + 4);
    float *decd = dev_put(p.dec, 256 * 64 * 4);
    float *sd = dev_poisoned(5);
    kern_residual a = {.dim = dim,
                       .nbits = 2,
                       .code_bytes = 4,
                       .q = qd,
                       .lq = 3,
                       .qc = qcd,
                       .n_centroids = p.nc,
                       .docs = p.ddocs,
                       .nd = 5,
                       .axes_dec = decd};
    memcpy(a.axes_bytes, bad, sizeof a.axes_bytes);
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CUDA, &a, sd), KERN_EINVAL);
    ck_assert_int_gt(strlen(kern_last_error()), 0);
    memcpy(a.axes_bytes, ok, sizeof a.axes_bytes);
    expect_ok(kern_maxsim_residual(KERN_DEV_CUDA, &a, sd));
    plaid_free(&p);

    plaid_make_code(&p, dim, 2, ok, 4, 20, 5, 10);
    const int64_t qoff[2] = {0, 5};
    const uint32_t docs[4] = {0, 3, 7, 19};
    exact_set x;
    exact_make(&x, &p, qoff, 1, docs, 4, 0);
    memcpy(x.a.axes_bytes, bad, sizeof x.a.axes_bytes);
    ck_assert_int_eq(kern_cuda_exact_scores(&x.a, sd), KERN_EINVAL);
    memcpy(x.a.axes_bytes, ok, sizeof x.a.axes_bytes);
    expect_ok(kern_cuda_exact_scores(&x.a, sd));
    expect_ok(kern_cuda_sync());
    exact_free(&x);
    plaid_free(&p);
    kern_gpu_free(qd), kern_gpu_free(qcd), kern_gpu_free(decd), kern_gpu_free(sd);
}
END_TEST

START_TEST(test_kernels_gpu_centroid_interaction_matches_reference)
{
    for (int rep = 0; rep < 6; rep++) {
        size_t lq = rep == 0 ? 1 : urnd(2, 70);
        plaid_set p;
        plaid_make(&p, 32, 2, (rnd() & 1) ? 2 : 4, urnd(3, 200), lq, 100);
        uint8_t *keep = NULL, *keepd = NULL;
        if (rep % 2) {
            keep = malloc(p.nc);
            for (size_t k = 0; k < p.nc; k++)
                keep[k] = unif() < 0.3;
            keepd = dev_put(keep, p.nc);
        }
        float *Sd = dev_put(p.qc, lq * p.nc * 4), *ad = dev_poisoned(p.nd);
        expect_ok(kern_centroid_interaction(KERN_DEV_CUDA, Sd, lq, p.nc, p.code_bytes, p.ddocs,
                                            p.nd, keepd, ad));
        float *got = dev_get_floats(ad, p.nd);
        float *cpu = host_poisoned(p.nd);
        expect_ok(kern_centroid_interaction(KERN_DEV_CPU, p.qc, lq, p.nc, p.code_bytes, p.hdocs,
                                            p.nd, keep, cpu));
        double *ref = malloc(p.nd * sizeof(double)), *mag = malloc(p.nd * sizeof(double));
        for (size_t n = 0; n < p.nd; n++) {
            int any = 0;
            double sum = 0, m = 0;
            for (size_t i = 0; i < lq; i++) {
                double best = -INFINITY;
                for (uint32_t t = 0; t < p.ntok[n]; t++) {
                    uint32_t c = p.codes[n][t];
                    if (keep && !keep[c])
                        continue;
                    any = 1;
                    if (p.qc[i * p.nc + c] > best)
                        best = p.qc[i * p.nc + c];
                }
                if (best > -INFINITY) {
                    sum += best;
                    m += fabs(best);
                }
            }
            ref[n] = any ? sum : -INFINITY;
            mag[n] = m;
        }
        compare("centroid_interaction", got, ref, mag, p.nd, 1e-6, 1e-6, 1e-6);
        compare_cpu("centroid_interaction", got, cpu, mag, p.nd, 2e-6, 2e-6);
        free(cpu);
        kern_gpu_free(Sd), kern_gpu_free(ad), kern_gpu_free(keepd);
        free(keep), free(got), free(ref), free(mag);
        plaid_free(&p);
    }
}
END_TEST

/* ---- top-k ------------------------------------------------------------------------------ */
typedef struct scored {
    float v;
    int64_t i;
} scored;

static int by_score(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static void run_topk(size_t rows, size_t n, size_t k, int ties)
{
    float *x = malloc((rows * n + 1) * sizeof(float));
    for (size_t i = 0; i < rows * n; i++) {
        double u = unif();
        x[i] = ties ? (float)(int)urnd(-20, 20) * 0.25f : (float)gauss();
        if (u < 0.01)
            x[i] = -INFINITY;
        else if (u < 0.02)
            x[i] = NAN;
        else if (u < 0.025)
            x[i] = (rnd() & 1) ? 0.f : -0.f;
    }
    float *xd = dev_put(x, rows * n * 4 + 4);
    int64_t *idd = NULL;
    ck_assert_int_eq(kern_gpu_malloc((void **)&idd, rows * k * 8), KERN_OK);
    ck_assert_int_eq(cudaMemset(idd, 0x7f, rows * k * 8), cudaSuccess);
    float *vd = dev_poisoned(rows * k);
    expect_ok(kern_topk_rows(KERN_DEV_CUDA, xd, rows, n, k, idd, vd));
    float *val = dev_get_floats(vd, rows * k);
    int64_t *idx = malloc(rows * k * 8);
    ck_assert_int_eq(kern_gpu_copy(idx, idd, rows * k * 8, 0), KERN_OK);
    /* The CPU kernel must agree exactly: same order, same ties, same padding. */
    float *cval = host_poisoned(rows * k);
    int64_t *cidx = malloc(rows * k * 8);
    expect_ok(kern_topk_rows(KERN_DEV_CPU, x, rows, n, k, cidx, cval));
    for (size_t i = 0; i < rows * k; i++)
        ck_assert_msg(cidx[i] == idx[i] && (cval[i] == val[i] || (isinf(cval[i]) && isinf(val[i]))),
                      "topk [%zu]: GPU (%lld, %g), CPU (%lld, %g)", i, (long long)idx[i], val[i],
                      (long long)cidx[i], cval[i]);
    free(cval), free(cidx);
    scored *s = malloc((n + 1) * sizeof *s);
    for (size_t r = 0; r < rows; r++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            float v = x[r * n + i];
            if (isnan(v) || v == -INFINITY)
                continue;
            s[m].v = v;
            s[m].i = (int64_t)i;
            m++;
        }
        qsort(s, m, sizeof *s, by_score);
        for (size_t j = 0; j < k; j++) {
            if (j < m) {
                ck_assert_msg(idx[r * k + j] == s[j].i && val[r * k + j] == s[j].v,
                              "topk row %zu rank %zu: got (%lld, %g), want (%lld, %g)", r, j,
                              (long long)idx[r * k + j], val[r * k + j], (long long)s[j].i, s[j].v);
            } else {
                ck_assert_int_eq(idx[r * k + j], -1);
                ck_assert(isinf(val[r * k + j]) && val[r * k + j] < 0);
            }
        }
    }
    kern_gpu_free(xd), kern_gpu_free(idd), kern_gpu_free(vd);
    free(x), free(val), free(idx), free(s);
}

START_TEST(test_kernels_gpu_topk_matches_reference)
{
    run_topk(3, 1000000, 10, 0);   /* millions of scores in all */
    run_topk(2, 2000000, 1000, 1); /* heavy ties: lower index first */
    /* The multi-kernel path over many rows (the scan's four rows a block, the last partial). */
    run_topk(37, 70000, 300, 0);
    run_topk(9, 100000, 2000, 1);
    run_topk(5, 70000, 4096, 1);  /* the sort's largest rows (the adaptive search's depth cap) */
    run_topk(3, 90000, 3000, 0);  /* padded to 4,096 */
    run_topk(2, 200000, 6000, 0); /* beyond the sort: counted ranks */
    run_topk(4, 5000, 1, 0);
    run_topk(2, 50, 80, 0);    /* fewer qualify than k */
    run_topk(32, 3000, 64, 1); /* a query's tokens x centroids: top ncells */
}
END_TEST

/* ---- the adaptive stages: probing with a margin, taking columns, the stopping rule ------- */

/* kern_cuda_probe with a margin against a host reference: each column's best n rows (ties to
 * the lower row), those below best - margin replaced by -1. With cols, each column its own
 * margin: a quarter none (negative: every probe -1), a quarter INFINITY (cols 1; cols 2: all
 * finite, so the columns' best are found first), the rest in [0, 0.3] (margin then the
 * largest, as the caller passes it). */
static void run_probe_how(size_t K, size_t ld, size_t n, float margin, int cols)
{
    float *st = malloc(K * ld * sizeof *st), *cm = malloc(ld * sizeof *cm);
    ck_assert(st && cm);
    for (size_t i = 0; i < K * ld; i++) /* coarse values: ties happen */
        st[i] = (float)(int)urnd(-400, 400) / 400.f;
    float *d_st = dev_put(st, K * ld * sizeof *st), *d_cm = NULL;
    if (cols) {
        margin = 0.f;
        for (size_t j = 0; j < ld; j++) {
            int kind = (int)urnd(0, 3);
            cm[j] = kind == 0 ? -1.f : kind == 1 && cols == 1 ? INFINITY : (float)(0.3 * unif());
            margin = cm[j] > margin ? cm[j] : margin;
        }
        d_cm = dev_put(cm, ld * sizeof *cm);
    }
    int32_t *h = malloc(ld * n * sizeof *h), *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < ld * n; i++)
        h[i] = -7;
    int32_t *d_pr = dev_put(h, ld * n * sizeof *h);
    ck_assert_int_eq(kern_cuda_probe(d_st, K, ld, n, margin, d_cm, NULL, NULL, d_pr), KERN_OK);
    ck_assert_int_eq(kern_gpu_copy(h, d_pr, ld * n * sizeof *h, 0), KERN_OK);
    {
        /* The columns' best given (as the table kernel writes them): the same probes. */
        unsigned *cb = malloc(ld * sizeof *cb);
        int32_t *h2 = malloc(ld * n * sizeof *h2);
        for (size_t j = 0; j < ld; j++) {
            float best = -INFINITY;
            for (size_t r = 0; r < K; r++)
                best = fmaxf(best, st[r * ld + j]);
            cb[j] = float_key(best);
        }
        unsigned *d_cb = dev_put(cb, ld * sizeof *cb);
        int32_t *d_pr2 = dev_put(h, ld * n * sizeof *h);
        ck_assert_int_eq(kern_cuda_probe(d_st, K, ld, n, margin, d_cm, d_cb, NULL, d_pr2), KERN_OK);
        ck_assert_int_eq(kern_gpu_copy(h2, d_pr2, ld * n * sizeof *h2, 0), KERN_OK);
        ck_assert_msg(memcmp(h, h2, ld * n * sizeof *h) == 0,
                      "K %zu: other probes with the columns' best given", K);
        /* ... and each tile's best (the table kernel's runs of rows): the same probes, the
         * runs below a column's threshold unread. */
        const size_t tiles = (K + KERN_CUDA_TILE_ROWS - 1) / KERN_CUDA_TILE_ROWS;
        unsigned *tk = malloc(tiles * ld * sizeof *tk);
        for (size_t t = 0; t < tiles; t++)
            for (size_t j = 0; j < ld; j++) {
                float best = -INFINITY;
                for (size_t r = t * KERN_CUDA_TILE_ROWS; r < K && r < (t + 1) * KERN_CUDA_TILE_ROWS;
                     r++)
                    best = fmaxf(best, st[r * ld + j]);
                tk[t * ld + j] = float_key(best);
            }
        unsigned *d_tk = dev_put(tk, tiles * ld * sizeof *tk);
        for (size_t i = 0; i < ld * n; i++)
            h2[i] = -7;
        kern_gpu_copy(d_pr2, h2, ld * n * sizeof *h2, 1);
        ck_assert_int_eq(kern_cuda_probe(d_st, K, ld, n, margin, d_cm, d_cb, d_tk, d_pr2), KERN_OK);
        ck_assert_int_eq(kern_gpu_copy(h2, d_pr2, ld * n * sizeof *h2, 0), KERN_OK);
        ck_assert_msg(memcmp(h, h2, ld * n * sizeof *h) == 0,
                      "K %zu: other probes with the tiles' best given", K);
        /* Tile keys without the columns' best: refused. */
        ck_assert_int_eq(kern_cuda_probe(d_st, K, ld, n, margin, d_cm, NULL, d_tk, d_pr2),
                         KERN_EINVAL);
        kern_gpu_free(d_cb), kern_gpu_free(d_pr2), kern_gpu_free(d_tk);
        free(cb), free(h2), free(tk);
    }
    for (size_t j = 0; j < ld; j++) {
        const float mj = cols ? cm[j] : margin;
        if (mj < 0.f) {
            for (size_t t = 0; t < n; t++)
                ck_assert_msg(h[j * n + t] == -1, "column %zu probes nothing: probe %zu is %d", j,
                              t, h[j * n + t]);
            continue;
        }
        /* The reference: n passes of "best not yet taken, lowest row on ties". */
        for (size_t t = 0; t < n; t++) {
            int32_t best = -1;
            for (size_t r = 0; r < K; r++) {
                int taken = 0;
                for (size_t u = 0; u < t; u++)
                    taken |= want[u] == (int32_t)r;
                if (!taken && (best < 0 || st[r * ld + j] > st[(size_t)best * ld + j]))
                    best = (int32_t)r;
            }
            want[t] = best;
        }
        float top = st[(size_t)want[0] * ld + j];
        for (size_t t = 0; t < n; t++) {
            int32_t w = t == 0 || st[(size_t)want[t] * ld + j] >= top - mj ? want[t] : -1;
            ck_assert_msg(h[j * n + t] == w, "K %zu column %zu probe %zu: %d, want %d", K, j, t,
                          h[j * n + t], w);
        }
    }
    kern_gpu_free(d_st), kern_gpu_free(d_pr);
    if (d_cm)
        kern_gpu_free(d_cm);
    free(st), free(cm), free(h), free(want);
}

static void run_probe(size_t K, size_t ld, size_t n, float margin)
{
    run_probe_how(K, ld, n, margin, 0);
}

/* Every value equal: the best n are the first n rows (ties to the lower row). */
static void run_probe_equal(size_t K, size_t ld, size_t n)
{
    float *st = malloc(K * ld * sizeof *st);
    ck_assert_ptr_nonnull(st);
    for (size_t i = 0; i < K * ld; i++)
        st[i] = 0.25f;
    float *d_st = dev_put(st, K * ld * sizeof *st);
    int32_t *h = malloc(ld * n * sizeof *h);
    for (size_t i = 0; i < ld * n; i++)
        h[i] = -7;
    int32_t *d_pr = dev_put(h, ld * n * sizeof *h);
    ck_assert_int_eq(kern_cuda_probe(d_st, K, ld, n, INFINITY, NULL, NULL, NULL, d_pr), KERN_OK);
    ck_assert_int_eq(kern_gpu_copy(h, d_pr, ld * n * sizeof *h, 0), KERN_OK);
    for (size_t j = 0; j < ld; j++)
        for (size_t t = 0; t < n; t++)
            ck_assert_msg(h[j * n + t] == (int32_t)t, "equal values: column %zu probe %zu: %d", j,
                          t, h[j * n + t]);
    kern_gpu_free(d_st), kern_gpu_free(d_pr);
    free(st), free(h);
}

/* kern_cuda_take_columns, kern_cuda_scatter_columns and kern_cuda_adaptive_next against host
 * references of kernels.h's definitions: random approximate scores (a row of every candidate,
 * and the same in descending order), exact ones near them, random done counts, random
 * candidate counts (fewer than k, fewer than done, many). */
/* The reference next of one query (kernels.h): c the z rule's count (capped at valid), the
 * tail bound's m over sorted [0, valid) at eps. */
static int64_t next_ref(size_t c, const float *sorted, size_t n, size_t valid, double theta,
                        double mu, double sd, double eps, size_t grow)
{
    size_t m = eng_tail_need(sorted, n, valid, theta, mu, sd, eps);
    size_t w = c > m ? c : m;
    return w > n ? (int64_t)(w < grow ? w : grow) : (int64_t)n;
}

static void run_next(size_t nq, size_t width, size_t ldE, size_t k, float z, size_t cap, double eps,
                     int tail_matters)
{
    size_t by_tail = 0; /* queries whose next the tail bound set */
    float *ap = malloc(nq * width * sizeof *ap), *sorted = malloc(nq * width * sizeof *sorted);
    float *E = malloc(nq * ldE * sizeof *E);
    int64_t *done = malloc(nq * 8), *cnt = malloc(nq * 8), *next = malloc(nq * 8);
    ck_assert(ap && sorted && E && done && cnt && next);
    for (size_t q = 0; q < nq; q++) {
        int kind = (int)urnd(0, 3);
        size_t v = kind == 0 ? urnd(0, (int)k) : urnd(1, (int)width);
        cnt[q] = (int64_t)v;
        size_t lim = v < ldE ? v : ldE;
        /* tail_matters 2: done at least 9,000 where it can be, so that a round reaches past the
         * 4,096 chances the kernel keeps in shared memory. */
        const int lo = tail_matters == 2 && lim > 9000 ? 9000 : 0;
        done[q] = kind == 1 ? (int64_t)lim : (int64_t)(int)urnd(lo, (int)lim);
        /* tail_matters: scores close together against the error's spread, so that many
         * candidates sit within a few sd of the z rule's bound (with the spread ones a call
         * left the tail nothing to decide in a third of the runs, simulated). */
        double a = 20.0, step = tail_matters ? 0.0005 + 0.002 * unif() : 0.002 + 0.05 * unif(),
               noise = tail_matters ? 0.2 + 0.3 * unif() : 0.02 + 0.5 * unif();
        for (size_t j = 0; j < width; j++) {
            a -= step * unif();
            sorted[q * width + j] = j < v ? (float)a : NAN;
        }
        /* The row in another order: a random rotation of the sorted values. */
        size_t rot = v ? urnd(0, (int)v - 1) : 0;
        for (size_t j = 0; j < width; j++)
            ap[q * width + j] = j < v ? sorted[q * width + (j + rot) % v] : NAN;
        for (size_t j = 0; j < ldE; j++)
            E[q * ldE + j] = j < (size_t)done[q]
                                 ? (float)(sorted[q * width + j] + 0.3 + noise * (float)gauss())
                                 : NAN;
    }
    float *d_ap = dev_put(ap, nq * width * 4), *d_so = dev_put(sorted, nq * width * 4);
    float *d_E = dev_put(E, nq * ldE * 4);
    int64_t *d_done = dev_put(done, nq * 8), *d_cnt = dev_put(cnt, nq * 8);
    for (size_t i = 0; i < nq; i++)
        next[i] = -9;
    int64_t *d_next = dev_put(next, nq * 8);
    ck_assert_int_eq(kern_cuda_adaptive_next(d_E, ldE, d_so, width, d_done, d_cnt, nq, k, z, eps,
                                             1.5, cap, d_next),
                     KERN_OK);
    ck_assert_int_eq(kern_gpu_copy(next, d_next, nq * 8, 0), KERN_OK);
    for (size_t q = 0; q < nq; q++) {
        size_t n = (size_t)done[q], valid = (size_t)cnt[q] < cap ? (size_t)cnt[q] : cap;
        int64_t want = (int64_t)n;
        double reach = 0;
        if (n >= k && n < valid) {
            double s = 0, s2 = 0;
            for (size_t j = 0; j < n; j++) {
                double d = (double)E[q * ldE + j] - (double)sorted[q * width + j];
                s += d;
                s2 += d * d;
            }
            double mu = s / (double)n, var = s2 / (double)n - mu * mu, theta = 0;
            for (size_t j = 0; j < n; j++) { /* the k-th best by counting */
                size_t above = 0, same_before = 0;
                for (size_t i = 0; i < n; i++) {
                    above += E[q * ldE + i] > E[q * ldE + j];
                    same_before += E[q * ldE + i] == E[q * ldE + j] && i < j;
                }
                if (above + same_before == k - 1)
                    theta = E[q * ldE + j];
            }
            const double sd = sqrt(var > 0 ? var : 0);
            reach = theta - mu - z * sd;
            size_t c = 0;
            for (size_t j = 0; j < width; j++)
                c += (double)ap[q * width + j] >= reach;
            size_t grow = (size_t)ceil((double)n * 1.5);
            grow = grow > n ? grow : n + 1;
            c = c < valid ? c : valid;
            want = next_ref(c, sorted + q * width, n, valid, theta, mu, sd, eps, grow);
            by_tail += want > (int64_t)(c > n ? (c < grow ? c : grow) : n);
            /* Sums in another order: a tail within rounding of eps may stop either side. */
            if (next[q] != want && (next[q] == next_ref(c, sorted + q * width, n, valid, theta, mu,
                                                        sd, eps * (1 - 1e-9), grow) ||
                                    next[q] == next_ref(c, sorted + q * width, n, valid, theta, mu,
                                                        sd, eps * (1 + 1e-9), grow)))
                want = next[q];
        }
        if (next[q] != want && n >= k && n < valid) {
            /* Sums in another order: a score within rounding of reach may land on either
             * side. */
            size_t near = 0;
            for (size_t j = 0; j < width; j++)
                near += fabs((double)ap[q * width + j] - reach) < 1e-4 * fabs(reach) + 1e-4;
            ck_assert_msg(llabs(next[q] - want) <= (long long)near,
                          "query %zu: next %lld, want %lld", q, (long long)next[q],
                          (long long)want);
            continue;
        }
        ck_assert_msg(next[q] == want, "query %zu (done %zu, candidates %zu): next %lld, want %lld",
                      q, n, (size_t)cnt[q], (long long)next[q], (long long)want);
    }
    if (tail_matters == 1)
        ck_assert_msg(by_tail > 0, "the tail bound decided no query");
    else if (!tail_matters)
        ck_assert_uint_eq(by_tail, 0);
    /* take_columns and scatter_columns over [lo, hi) = [done, next). */
    uint32_t *docs = malloc(nq * width * 4), *cols = malloc(nq * width * 4);
    for (size_t i = 0; i < nq * width; i++)
        docs[i] = (uint32_t)rnd();
    uint32_t *d_docs = dev_put(docs, nq * width * 4);
    size_t c0 = urnd(0, (int)(width / 2)), c1 = c0 + urnd(1, (int)(width - c0));
    size_t w = c1 - c0;
    for (int bounded = 0; bounded < 2; bounded++) {
        for (size_t i = 0; i < nq * w; i++)
            cols[i] = 0x5a5a5a5au;
        uint32_t *d_cols = dev_put(cols, nq * w * 4);
        ck_assert_int_eq(kern_cuda_take_columns(d_docs, width, c0, c1, bounded ? d_done : NULL,
                                                bounded ? d_next : NULL, nq, d_cols),
                         KERN_OK);
        ck_assert_int_eq(kern_gpu_copy(cols, d_cols, nq * w * 4, 0), KERN_OK);
        for (size_t q = 0; q < nq; q++)
            for (size_t c = c0; c < c1; c++) {
                int in = !bounded || ((int64_t)c >= done[q] && (int64_t)c < next[q]);
                ck_assert_uint_eq(cols[q * w + c - c0], in ? docs[q * width + c] : KERN_NO_DOC);
            }
        kern_gpu_free(d_cols);
    }
    if (c1 <= ldE) {
        float *src = malloc(nq * w * 4), *got = malloc(nq * ldE * 4);
        for (size_t i = 0; i < nq * w; i++)
            src[i] = (float)i;
        float *d_src = dev_put(src, nq * w * 4);
        ck_assert_int_eq(kern_cuda_scatter_columns(d_src, w, c0, d_done, d_next, nq, d_E, ldE),
                         KERN_OK);
        ck_assert_int_eq(kern_gpu_copy(got, d_E, nq * ldE * 4, 0), KERN_OK);
        for (size_t q = 0; q < nq; q++)
            for (size_t c = 0; c < ldE; c++) {
                int in = c >= c0 && c < c1 && (int64_t)c >= done[q] && (int64_t)c < next[q];
                float want = in ? src[q * w + c - c0] : E[q * ldE + c];
                ck_assert_msg((isnan(want) && isnan(got[q * ldE + c])) || got[q * ldE + c] == want,
                              "scatter q %zu c %zu", q, c);
            }
        kern_gpu_free(d_src);
        free(src), free(got);
    }
    /* round_pairs and round_scatter: the same [done, next) of every query as one list. */
    if (ldE <= width) {
        int64_t *poff = malloc((nq + 1) * 8);
        poff[0] = 0;
        for (size_t q = 0; q < nq; q++) {
            int64_t lo = done[q] < (int64_t)ldE ? done[q] : (int64_t)ldE;
            int64_t hi = next[q] < (int64_t)ldE ? next[q] : (int64_t)ldE;
            poff[q + 1] = poff[q] + (hi > lo ? hi - lo : 0);
        }
        size_t np = (size_t)poff[nq];
        int64_t *d_poff = dev_put(poff, (nq + 1) * 8);
        uint32_t *pd = malloc((np + 1) * 4), *pq = malloc((np + 1) * 4);
        for (size_t i = 0; i <= np; i++)
            pd[i] = pq[i] = 0x5a5a5a5au;
        uint32_t *d_pd = dev_put(pd, (np + 1) * 4), *d_pq = dev_put(pq, (np + 1) * 4);
        ck_assert_int_eq(kern_cuda_round_pairs(d_docs, width, d_done, d_poff, nq, np, d_pd, d_pq),
                         KERN_OK);
        ck_assert_int_eq(kern_gpu_copy(pd, d_pd, (np + 1) * 4, 0), KERN_OK);
        ck_assert_int_eq(kern_gpu_copy(pq, d_pq, (np + 1) * 4, 0), KERN_OK);
        size_t i = 0;
        for (size_t q = 0; q < nq; q++)
            for (int64_t j = 0; j < poff[q + 1] - poff[q]; j++, i++) {
                ck_assert_uint_eq(pq[i], q);
                ck_assert_uint_eq(pd[i], docs[q * width + (size_t)(done[q] + j)]);
            }
        ck_assert_uint_eq(pd[np], 0x5a5a5a5au); /* nothing past the list */
        float *sc = malloc((np + 1) * 4), *got = malloc(nq * ldE * 4);
        for (size_t j = 0; j < np; j++)
            sc[j] = 1000.f + (float)j;
        float *d_sc = dev_put(sc, (np + 1) * 4);
        ck_assert_int_eq(kern_gpu_copy(d_E, E, nq * ldE * 4, 1), KERN_OK);
        ck_assert_int_eq(kern_cuda_round_scatter(d_sc, d_pq, np, d_done, d_poff, d_E, ldE),
                         KERN_OK);
        ck_assert_int_eq(kern_gpu_copy(got, d_E, nq * ldE * 4, 0), KERN_OK);
        for (size_t q = 0; q < nq; q++)
            for (size_t c = 0; c < ldE; c++) {
                int64_t j = (int64_t)c - done[q];
                int in = j >= 0 && j < poff[q + 1] - poff[q];
                float want = in ? sc[poff[q] + j] : E[q * ldE + c];
                ck_assert_msg((isnan(want) && isnan(got[q * ldE + c])) || got[q * ldE + c] == want,
                              "round_scatter q %zu c %zu", q, c);
            }
        ck_assert_int_eq(kern_cuda_round_pairs(d_docs, width, d_done, NULL, nq, np, d_pd, d_pq),
                         KERN_EINVAL);
        kern_gpu_free(d_poff), kern_gpu_free(d_pd), kern_gpu_free(d_pq), kern_gpu_free(d_sc);
        free(poff), free(pd), free(pq), free(sc), free(got);
    }
    kern_gpu_free(d_ap), kern_gpu_free(d_so), kern_gpu_free(d_E), kern_gpu_free(d_done);
    kern_gpu_free(d_cnt), kern_gpu_free(d_next), kern_gpu_free(d_docs);
    free(ap), free(sorted), free(E), free(done), free(cnt), free(next), free(docs), free(cols);
}

START_TEST(test_kernels_gpu_adaptive_stages)
{
    run_probe(300, 40, 1, INFINITY);
    run_probe(2000, 70, 16, 0.05f);
    run_probe(700, 33, 32, 0.2f);
    run_probe(5000, 9, 64, 0.f);
    /* More survivors than the merge's shared list (radix select), and ties beyond it. */
    run_probe(60000, 3, 16, INFINITY);
    run_probe(40000, 2, 64, 0.5f);
    /* Each column its own margin, none for some (the GPU's per-query margins and widening). */
    run_probe_how(2000, 70, 16, 0.f, 1);
    run_probe_how(9000, 37, 64, 0.f, 1);
    run_probe_how(60000, 6, 32, 0.f, 1);
    run_probe_how(3000, 45, 16, 0.f, 2);
    run_probe_how(40000, 5, 64, 0.f, 2);
    run_probe_equal(3000, 4, 32);
    run_probe_equal(60000, 2, 32);
    /* eps huge: the z rule alone; small: the tail bound decides some queries. */
    run_next(60, 300, 300, 10, 3.f, 300, 1e9, 0);
    run_next(40, 1000, 1000, 100, 2.5f, 640, 1e9, 0);
    run_next(25, 64, 64, 1, 4.f, 64, 1e9, 0);
    run_next(10, 5000, 4096, 1000, 3.f, 4096, 1e9, 0);
    /* A low z leaves many candidates with a fair chance beyond its bound: the tail decides. */
    run_next(60, 300, 300, 10, 1.f, 300, 0.25, 1);
    run_next(40, 1000, 1000, 100, 0.5f, 640, 2.5, 1);
    run_next(40, 5000, 4096, 10, 1.f, 4096, 0.05, 1);
    /* A round wider than the kernel keeps in shared memory (4,096 chances): the tail's
     * binary search computes them as it goes (whether the tail decides depends on the draw:
     * not asserted). */
    run_next(8, 24000, 24000, 10, 1.f, 24000, 0.05, 2);
    /* Bad arguments come back as codes. */
    ck_assert_int_eq(kern_cuda_probe(NULL, 10, 10, 2, 0.f, NULL, NULL, NULL, NULL), KERN_EINVAL);
    ck_assert_int_eq(
        kern_cuda_adaptive_next(NULL, 1, NULL, 1, NULL, NULL, 1, 1, 3.f, 1.0, 1.5, 1, NULL),
        KERN_EINVAL);
}
END_TEST

/* ---- batch interaction: the kernels, against a double reference --------------------------- */
/* The reference sum of document d for query q (columns c0 .. c0 + lq of tables [K, ld]): the
 * threshold's verdict read from keepT, the values from valT. -INFINITY: no kept token. */
static double ref_interaction(const float *keepT, const float *valT, size_t ld, int64_t c0,
                              int64_t lq, const int64_t *doc_off, const uint32_t *codes, uint32_t d,
                              int pr, float threshold)
{
    double total = 0;
    int any = 0;
    for (int64_t j = 0; j < lq; j++) {
        double best = -INFINITY;
        for (int64_t t = doc_off[d]; t < doc_off[d + 1]; t++) {
            const uint32_t c = codes[t];
            if (pr) {
                float mx = -INFINITY;
                for (int64_t jj = 0; jj < lq; jj++)
                    mx = fmaxf(mx, keepT[c * ld + (size_t)(c0 + jj)]);
                if (!(mx >= threshold))
                    continue;
            }
            any = 1;
            best = fmax(best, valT[c * ld + (size_t)(c0 + j)]);
        }
        total += best;
    }
    return any && lq ? total : -INFINITY;
}

/* nq queries of lq[q] tokens (fixed 1: lq_max each; 2: multiples of 8 up to lq_max; 0: any up
 * to lq_max; ld columns of ST in all, ld >= sum), candidates [nq, width] with KERN_NO_DOC
 * slots and empty documents, pruned or not: the default (group) kernel and the warp kernel
 * give the same bits, and both match the double reference. Where ld and every query's first
 * column are multiples of 8, the fp16 kernel too, against the reference over the rounded table
 * (the threshold still read from ST). */
static void run_batch_interaction(size_t K, size_t nq, size_t lq_max, int fixed, size_t ld_pad,
                                  size_t n_docs, size_t max_len, size_t width, int prune)
{
    int64_t *q_off = xmalloc((nq + 1) * 8);
    q_off[0] = 0;
    for (size_t q = 0; q < nq; q++)
        q_off[q + 1] = q_off[q] + (int64_t)(fixed == 1   ? lq_max
                                            : fixed == 2 ? 8 * urnd(0, lq_max / 8)
                                                         : urnd(0, lq_max));
    const size_t ld = (size_t)q_off[nq] + ld_pad;
    const size_t st_n = K * ld + KERN_CUDA_ST_SLACK;
    float *ST = xmalloc(st_n * 4), *STr = xmalloc(st_n * 4);
    float *STq = xmalloc(st_n * 4);
    uint16_t *ST16 = xmalloc(st_n * 2);
    int8_t *ST8 = xmalloc(st_n);
    for (size_t i = 0; i < st_n; i++) {
        ST[i] = (float)(unif() * 2.2 - 1.1); /* a few beyond [-1, 1], which int8 clamps */
        ST16[i] = kern_f32_to_f16(ST[i]);
        STr[i] = kern_f16_to_f32(ST16[i]);
        ST8[i] = kern_f32_to_i8(ST[i]);
        STq[i] = (float)(ST8[i] / 127.0);
    }
    int h16 = ld % 8 == 0;
    for (size_t q = 0; q <= nq; q++)
        h16 &= q_off[q] % 8 == 0;
    int64_t *doc_off = xmalloc((n_docs + 1) * 8);
    doc_off[0] = 0;
    for (size_t d = 0; d < n_docs; d++)
        doc_off[d + 1] = doc_off[d] + (int64_t)(rnd_below(9) == 0 ? 0 : urnd(1, max_len));
    const size_t ntok = (size_t)doc_off[n_docs];
    uint32_t *codes = xmalloc((ntok ? ntok : 1) * 4);
    for (size_t t = 0; t < ntok; t++)
        codes[t] = (uint32_t)rnd_below(K);
    uint32_t *docs = xmalloc(nq * width * 4);
    int64_t *counts = xmalloc(nq * 8);
    for (size_t q = 0; q < nq; q++) {
        size_t c = rnd_below(width + 1);
        counts[q] = (int64_t)c;
        for (size_t i = 0; i < width; i++)
            docs[q * width + i] = i < c ? (uint32_t)rnd_below(n_docs) : KERN_NO_DOC;
    }
    const float threshold = 0.9f;
    const int64_t prune_over = (int64_t)(width / 3);
    float *dST = dev_put(ST, st_n * 4);
    /* The narrow copies in blocks of the queries' columns, as the table kernel writes them. */
    uint16_t *B16 = xmalloc(st_n * 2);
    int8_t *B8 = xmalloc(st_n);
    memset(B16, 0xff, st_n * 2), memset(B8, 0x80, st_n);
    kern_table_blocks(ST16, 2, K, ld, q_off, nq, B16);
    kern_table_blocks(ST8, 1, K, ld, q_off, nq, B8);
    uint16_t *dST16 = dev_put(B16, st_n * 2);
    int8_t *dST8 = dev_put(B8, st_n);
    free(B16), free(B8);
    int64_t *dq = dev_put(q_off, (nq + 1) * 8), *ddo = dev_put(doc_off, (n_docs + 1) * 8);
    uint32_t *dc = dev_put(codes, (ntok ? ntok : 1) * 4), *dd = dev_put(docs, nq * width * 4);
    int64_t *dcnt = dev_put(counts, nq * 8);
    float *got[4] = {NULL, NULL, NULL, NULL};
    const char *variant[2] = {"warp", NULL};
    for (int v = 0; v < 4; v++) {
        if (v < 2 && variant[v])
            setenv("TARTAN_INTERACTION", variant[v], 1);
        else
            unsetenv("TARTAN_INTERACTION");
        float *da = dev_poisoned(nq * width);
        if (v < 2)
            expect_ok(kern_cuda_interaction(dST, K, ld, dq, q_off, nq, ddo, dc, dd, width, prune,
                                            prune ? dcnt : NULL, prune_over, threshold, da));
        else if (v == 2)
            ck_assert_int_eq(kern_cuda_interaction_h16(dST, dST16, K, ld, dq, q_off, nq, ddo, dc,
                                                       dd, width, prune, prune ? dcnt : NULL,
                                                       prune_over, threshold, da),
                             h16 ? KERN_OK : KERN_EINVAL);
        else
            ck_assert_int_eq(kern_cuda_interaction_i8(dST, dST8, K, ld, dq, q_off, nq, ddo, dc, dd,
                                                      width, prune, prune ? dcnt : NULL, prune_over,
                                                      threshold, da),
                             h16 ? KERN_OK : KERN_EINVAL);
        got[v] = dev_get_floats(da, nq * width);
        kern_gpu_free(da);
    }
    unsetenv("TARTAN_INTERACTION");
    ck_assert_int_eq(memcmp(got[0], got[1], nq * width * 4), 0);
    /* The narrow kernels' runs of slots a warp takes at a time decide the order documents are
     * taken in, not their sums: the same bits at every run length. */
    for (int run = 8; h16 && run <= 128; run *= 2) {
        char val[8];
        snprintf(val, sizeof val, "%d", run);
        setenv("TARTAN_IX_RUN", val, 1);
        for (int v = 2; v < 4; v++) {
            float *da = dev_poisoned(nq * width);
            if (v == 2)
                expect_ok(kern_cuda_interaction_h16(dST, dST16, K, ld, dq, q_off, nq, ddo, dc, dd,
                                                    width, prune, prune ? dcnt : NULL, prune_over,
                                                    threshold, da));
            else
                expect_ok(kern_cuda_interaction_i8(dST, dST8, K, ld, dq, q_off, nq, ddo, dc, dd,
                                                   width, prune, prune ? dcnt : NULL, prune_over,
                                                   threshold, da));
            float *o = dev_get_floats(da, nq * width);
            ck_assert_msg(memcmp(o, got[v], nq * width * 4) == 0, "%s: run %d differs",
                          v == 2 ? "h16" : "i8", run);
            free(o);
            kern_gpu_free(da);
        }
    }
    unsetenv("TARTAN_IX_RUN");
    if (h16) {
        /* TARTAN_GPU_BLOCKS=off: the copies in the table's own layout, [K, ld]: the same bits. */
        uint16_t *pST16 = dev_put(ST16, st_n * 2);
        int8_t *pST8 = dev_put(ST8, st_n);
        setenv("TARTAN_GPU_BLOCKS", "off", 1);
        for (int v = 2; v < 4; v++) {
            float *da = dev_poisoned(nq * width);
            if (v == 2)
                expect_ok(kern_cuda_interaction_h16(dST, pST16, K, ld, dq, q_off, nq, ddo, dc, dd,
                                                    width, prune, prune ? dcnt : NULL, prune_over,
                                                    threshold, da));
            else
                expect_ok(kern_cuda_interaction_i8(dST, pST8, K, ld, dq, q_off, nq, ddo, dc, dd,
                                                   width, prune, prune ? dcnt : NULL, prune_over,
                                                   threshold, da));
            float *o = dev_get_floats(da, nq * width);
            ck_assert_msg(memcmp(o, got[v], nq * width * 4) == 0, "%s: [K, ld] differs from blocks",
                          v == 2 ? "h16" : "i8");
            free(o);
            kern_gpu_free(da);
        }
        unsetenv("TARTAN_GPU_BLOCKS");
        kern_gpu_free(pST16), kern_gpu_free(pST8);
    }
    for (size_t q = 0; q < nq; q++) {
        const int64_t c0 = q_off[q], lq = q_off[q + 1] - c0;
        const int pr = prune && counts[q] > prune_over;
        for (size_t i = 0; i < width; i++) {
            const uint32_t d = docs[q * width + i];
            for (int v = 1; v < (h16 ? 4 : 2); v++) {
                const float g = got[v][q * width + i];
                if (d == KERN_NO_DOC) {
                    ck_assert(isnan(g));
                    continue;
                }
                const double total = ref_interaction(ST,
                                                     v == 3   ? STq
                                                     : v == 2 ? STr
                                                              : ST,
                                                     ld, c0, lq, doc_off, codes, d, pr, threshold);
                if (total == -INFINITY) {
                    ck_assert(g == KERN_EMPTY_SCORE);
                    continue;
                }
                ck_assert_msg(fabs(g - total) <= 1e-5 * (1 + fabs(total)),
                              "%s: query %zu slot %zu: %.9g against %.9g",
                              v == 3   ? "i8"
                              : v == 2 ? "h16"
                                       : "group",
                              q, i, (double)g, total);
            }
        }
    }
    kern_gpu_free(dST);
    kern_gpu_free(dST16);
    kern_gpu_free(dST8);
    kern_gpu_free(dq);
    kern_gpu_free(ddo);
    kern_gpu_free(dc);
    kern_gpu_free(dd);
    kern_gpu_free(dcnt);
    for (int v = 0; v < 4; v++)
        free(got[v]);
    free(ST);
    free(STr);
    free(STq);
    free(ST16);
    free(ST8);
    free(q_off);
    free(doc_off);
    free(codes);
    free(docs);
    free(counts);
}

START_TEST(test_kernels_gpu_batch_interaction)
{
    /* 32-token queries, ld a multiple of 4: float4 rows; 64 tokens: two passes. */
    run_batch_interaction(300, 12, 32, 1, 0, 500, 12, 200, 0);
    run_batch_interaction(500, 6, 64, 1, 4, 300, 20, 120, 0);
    /* Ragged queries (0 to 70 tokens: up to three passes of 32), odd ld: scalar rows. */
    run_batch_interaction(257, 9, 70, 0, 3, 400, 40, 150, 0);
    /* Long documents, pruned queries beside unpruned ones, both row forms. */
    run_batch_interaction(1000, 7, 32, 1, 0, 300, 150, 100, 1);
    run_batch_interaction(64, 5, 37, 0, 1, 50, 9, 60, 1);
    /* The fp16 and int8 kernels: queries of 0 to 96 tokens in eights (partial passes of 32),
     * pruned and not, ld padded by 8; and a pad of 4 that they must refuse. */
    run_batch_interaction(700, 11, 96, 2, 8, 400, 30, 150, 0);
    run_batch_interaction(900, 8, 64, 2, 0, 300, 90, 100, 1);
    run_batch_interaction(300, 4, 32, 1, 4, 100, 10, 50, 0);
    /* Many documents of 1 to 300 tokens: a warp's groups take their next documents unevenly. */
    run_batch_interaction(2000, 9, 32, 1, 0, 3000, 300, 1500, 0);
}
END_TEST

/* ---- peak device memory ------------------------------------------------------------------ */
START_TEST(test_kernels_gpu_memory_stays_within_inputs)
{
    /* ColPali-like: 1 query of 1024 tokens x 2000 pages of 1300 tokens, d 128, bf16. The naive
     * table would be 1024 * 1300 * 2000 * 4 bytes = 10.6 GB; inputs are 0.67 GB. */
    const size_t dim = 128, lq = 1024, nd = 2000, ld = 1300;
    ck_assert_double_gt((double)lq * ld * nd * 4, 10e9);
    const size_t qn = lq * dim, dn = nd * ld * dim;
    uint16_t *qh = malloc(qn * 2), *dh = malloc(dn * 2);
    for (size_t i = 0; i < qn; i++)
        qh[i] = kern_f32_to_bf16((float)gauss() * 0.1f);
    for (size_t i = 0; i < dn; i++) /* uniform values: cheap for a third of a billion */
        dh[i] = kern_f32_to_bf16((float)((int)(rnd() % 2001) - 1000) * 1e-4f);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    size_t free0 = 0, total = 0;
    ck_assert_int_eq(cudaMemGetInfo(&free0, &total), cudaSuccess);
    kern_dense a = {KERN_BF16, dim, dev_put(qh, qn * 2), NULL, 1, lq, dev_put(dh, dn * 2), NULL,
                    nd,        ld};
    float *sd = dev_poisoned(nd);
    const size_t io = qn * 2 + dn * 2 + nd * 4;
    size_t free1 = 0;
    ck_assert_int_eq(cudaMemGetInfo(&free1, &total), cudaSuccess);
    kern_gpu_scratch_reset_peak();
    const size_t base = kern_gpu_scratch_peak();
    expect_ok(kern_maxsim_dense(KERN_DEV_CUDA, &a, sd));
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    size_t free2 = 0;
    ck_assert_int_eq(cudaMemGetInfo(&free2, &total), cudaSuccess);
    const size_t scratch = kern_gpu_scratch_peak() - base;
    fprintf(stderr,
            "memory: inputs+outputs %.3f GB, scratch peak %zu bytes, free before %.3f "
            "after %.3f GB (naive table %.1f GB)\n",
            io / 1e9, scratch, free1 / 1e9, free2 / 1e9, (double)lq * ld * nd * 4 / 1e9);
    /* The call takes no scratch beyond a small fraction of its inputs, holds nothing after,
     * and the inputs themselves took what they should. */
    ck_assert_uint_le(scratch, io / 100);
    ck_assert_uint_le(free1 > free2 ? free1 - free2 : 0, (size_t)64 << 20);
    ck_assert_uint_le(free0 - free1, io + ((size_t)64 << 20));
    /* And the answer is right: 3 pages against the reference. */
    float *got = dev_get_floats(sd, nd);
    double *qv = malloc(qn * sizeof(double)), *dv = malloc(ld * dim * sizeof(double));
    for (size_t i = 0; i < qn; i++)
        qv[i] = kern_bf16_to_f32(qh[i]);
    for (size_t n = 0; n < nd; n += nd / 3) {
        for (size_t i = 0; i < ld * dim; i++)
            dv[i] = kern_bf16_to_f32(dh[n * ld * dim + i]);
        double mag, ref = ref_maxsim(qv, NULL, lq, dv, NULL, ld, dim, &mag);
        ck_assert_msg(fabs(got[n] - ref) <= REL_TOL * mag + 1e-5, "page %zu: %g vs %g", n, got[n],
                      ref);
    }
    for (size_t n = 0; n < nd; n++)
        ck_assert(isfinite(got[n]));
    kern_gpu_free((void *)a.q), kern_gpu_free((void *)a.d), kern_gpu_free(sd);
    free(qh), free(dh), free(got), free(qv), free(dv);
}
END_TEST

/* ---- INT8 MaxSim and the quantiser ------------------------------------------------------ */
/* Ragged int8 MaxSim: GPU against the CPU int8 kernel and the double reference on the
 * dequantised values. doff_bytes shifts the document array off 16-byte alignment. */
static void run_i8(size_t dim, size_t nq, size_t nd, int maxq, int maxd, int with_long,
                   size_t doff_bytes)
{
    int64_t *qo = malloc((nq + 1) * sizeof(int64_t)), *dof = malloc((nd + 1) * sizeof(int64_t));
    qo[0] = dof[0] = 0;
    for (size_t i = 0; i < nq; i++)
        qo[i + 1] = qo[i] + (i == 0 ? varlen_q0_len : i == 1 && nq > 2 ? 0 : (int)urnd(0, maxq));
    for (size_t i = 0; i < nd; i++) {
        int len = i == 0 ? 0 : i == 1 ? 1 : (int)urnd(0, maxd);
        if (with_long && i == nd - 1)
            len = 8192;
        dof[i + 1] = dof[i] + len;
    }
    const size_t tq = (size_t)qo[nq], td = (size_t)dof[nd];
    int8_t *qh = malloc(tq * dim + 1), *dh = malloc(td * dim + doff_bytes + 1);
    float *qs = malloc((tq + 1) * sizeof(float)), *ds = malloc((td + 1) * sizeof(float));
    for (size_t i = 0; i < tq * dim; i++)
        qh[i] = (int8_t)(int)urnd(-127, 127);
    for (size_t i = 0; i < td * dim; i++)
        dh[doff_bytes + i] = (int8_t)(int)urnd(-127, 127);
    for (size_t i = 0; i < tq; i++)
        qs[i] = (float)(unif() * 0.02);
    for (size_t i = 0; i < td; i++)
        ds[i] = (float)((unif() - 0.25) * 0.02); /* a quarter negative: any sign works */
    int8_t *dbase = dev_put(dh, td * dim + doff_bytes + 1);
    kern_varlen_i8 a = {dim,
                        dev_put(qh, tq * dim + 1),
                        dev_put(qs, (tq + 1) * sizeof(float)),
                        dev_put(qo, (nq + 1) * 8),
                        nq,
                        dbase + doff_bytes,
                        dev_put(ds, (td + 1) * sizeof(float)),
                        dev_put(dof, (nd + 1) * 8),
                        nd};
    float *sd = dev_poisoned(nq * nd);
    expect_ok(kern_maxsim_varlen_i8(KERN_DEV_CUDA, &a, sd));
    float *got = dev_get_floats(sd, nq * nd);
    kern_varlen_i8 h = {dim, qh, qs, qo, nq, dh + doff_bytes, ds, dof, nd};
    float *cpu = host_poisoned(nq * nd);
    expect_ok(kern_maxsim_varlen_i8(KERN_DEV_CPU, &h, cpu));
    double *ref = malloc(nq * nd * sizeof(double)), *mag = malloc(nq * nd * sizeof(double));
    for (size_t q = 0; q < nq; q++)
        for (size_t n = 0; n < nd; n++) {
            double s = 0, mb = 0;
            if (dof[n + 1] == dof[n]) {
                ref[q * nd + n] = -INFINITY;
                mag[q * nd + n] = 0;
                continue;
            }
            for (int64_t i = qo[q]; i < qo[q + 1]; i++) {
                double mx = -INFINITY, mm = 0;
                for (int64_t t = dof[n]; t < dof[n + 1]; t++) {
                    double dot = 0, am = 0;
                    for (size_t k = 0; k < dim; k++) {
                        const double p = ((double)qs[i] * qh[i * dim + k]) *
                                         ((double)ds[t] * dh[doff_bytes + t * dim + k]);
                        dot += p;
                        am += fabs(p);
                    }
                    mx = fmax(mx, dot);
                    mm = fmax(mm, am);
                }
                s += mx;
                mb += mm;
            }
            ref[q * nd + n] = s;
            mag[q * nd + n] = mb;
            if (qo[q + 1] == qo[q])
                ck_assert_msg(got[q * nd + n] == 0.f, "empty query scored %g", got[q * nd + n]);
        }
    char what[128];
    snprintf(what, sizeof what, "i8 dim %zu nq %zu nd %zu shift %zu", dim, nq, nd, doff_bytes);
    compare(what, got, ref, mag, nq * nd, REL_TOL, 1e-6, AGG_TOL);
    compare_cpu(what, got, cpu, mag, nq * nd, 2 * REL_TOL, 2e-6);
    free(cpu);
    kern_gpu_free((void *)a.q), kern_gpu_free((void *)a.q_scale), kern_gpu_free((void *)a.q_off);
    kern_gpu_free(dbase), kern_gpu_free((void *)a.d_scale), kern_gpu_free((void *)a.d_off);
    kern_gpu_free(sd);
    free(qo), free(dof), free(qh), free(dh), free(qs), free(ds), free(got), free(ref), free(mag);
}

START_TEST(test_kernels_gpu_i8_matches_reference)
{
    static const size_t dims[] = {64, 128, 256, 96, 1024};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        run_i8(dims[i], urnd(1, 6), urnd(3, 40), dims[i] >= 1024 ? 20 : 60,
               dims[i] >= 1024 ? 40 : 300, 0, 0);
    run_i8(128, 3, 5, 32, 100, 1, 0);   /* one document of 8192 tokens */
    run_i8(128, 9, 300, 40, 20, 0, 0);  /* 9 queries: units over several rounds */
    run_i8(64, 2, 50, 100, 60, 0, 0);   /* queries of up to 100 tokens: several units each */
    run_i8(128, 1, 3000, 32, 40, 0, 0); /* more documents than resident CTAs */
    run_i8(128, 2, 30, 32, 60, 0, 3);   /* misaligned documents: the simple path */
    /* The variant with 4 tiles in flight per warp. */
    kern_gpu_tune.i8_tiles = 4;
    run_i8(64, 3, 40, 60, 300, 0, 0);
    run_i8(256, 9, 200, 40, 50, 0, 0);
    run_i8(128, 1, 3000, 32, 40, 0, 0);
    kern_gpu_tune.i8_tiles = 0;
}
END_TEST

START_TEST(test_kernels_gpu_i8_quantize_matches_cpu)
{
    /* The same bytes and scales as the CPU quantiser (IEEE division and rounding on both). */
    static const size_t dims[] = {128, 96, 7};
    for (size_t di = 0; di < 3; di++) {
        const size_t n = 1001, dim = dims[di];
        float *x = malloc(n * dim * sizeof(float));
        for (size_t i = 0; i < n * dim; i++)
            x[i] = (float)gauss() * (float)(1 + (i / dim) % 7);
        for (size_t k = 0; k < dim; k++) {
            x[k] = 0.f;
            x[dim + k] = k == 3 ? INFINITY : 1.f;
        }
        float *xd = dev_put(x, n * dim * sizeof(float));
        int8_t *qd = NULL;
        ck_assert_int_eq(kern_gpu_malloc((void **)&qd, n * dim), KERN_OK);
        float *sd = dev_poisoned(n);
        expect_ok(kern_quantize_i8(KERN_DEV_CUDA, xd, n, dim, qd, sd));
        float *sg = dev_get_floats(sd, n);
        int8_t *qg = malloc(n * dim), *qc = malloc(n * dim);
        ck_assert_int_eq(kern_gpu_copy(qg, qd, n * dim, 0), KERN_OK);
        float *sc = host_poisoned(n);
        expect_ok(kern_quantize_i8(KERN_DEV_CPU, x, n, dim, qc, sc));
        ck_assert_msg(memcmp(qg, qc, n * dim) == 0, "quantised bytes differ (dim %zu)", dim);
        ck_assert_msg(memcmp(sg, sc, n * sizeof(float)) == 0, "scales differ (dim %zu)", dim);
        ck_assert(sg[0] == 0.f && sg[1] == 0.f);
        kern_gpu_free(xd), kern_gpu_free(qd), kern_gpu_free(sd);
        free(x), free(sg), free(qg), free(qc), free(sc);
    }
}
END_TEST

/* ---- nearest centroid on the tensor cores (nearest_bf16_cuda.cu) ------------------------- */
/* The paths a call can take: the fp32 kernel alone, the bf16 screen completed in fp32 (the
 * encode path), the bf16 argmax (k-means training), and kern_nearest_centroid's choice. */
enum { NC_FP32, NC_SCREENED, NC_BF16, NC_DISPATCH };

/* One call on device copies of x [n, dim] and c [k, dim]; best and score on the host, poisoned
 * first on both sides. counts (or NULL): the screen's open points and those left to the fp32
 * kernel. */
static void nearest_on_gpu(int path, const float *x, size_t n, const float *c, size_t k, size_t dim,
                           int32_t *best, float *score, size_t *counts)
{
    float *dx = dev_put(x, n * dim * sizeof(float)), *dc = dev_put(c, k * dim * sizeof(float));
    float *ds = dev_poisoned(n);
    int32_t *pb = xmalloc(n * sizeof(int32_t));
    memset(pb, 0xab, n * sizeof(int32_t));
    int32_t *db = dev_put(pb, n * sizeof(int32_t));
    int rc = path == NC_FP32 ? kern_gpu_nearest_centroid_fp32(dx, n, dc, k, dim, db, ds)
             : path == NC_SCREENED
                 ? kern_gpu_nearest_centroid_screened(dx, n, dc, k, dim, db, ds, counts,
                                                      counts ? counts + 1 : NULL)
             : path == NC_BF16
                 ? kern_nearest_centroid_bf16(KERN_DEV_CUDA, dx, n, dc, k, dim, db, ds)
                 : kern_nearest_centroid(KERN_DEV_CUDA, dx, n, dc, k, dim, db, ds);
    expect_ok(rc);
    ck_assert_int_eq(kern_gpu_sync(), KERN_OK);
    memset(best, 0xab, n * sizeof(int32_t));
    ck_assert_int_eq(kern_gpu_copy(best, db, n * sizeof(int32_t), 0), KERN_OK);
    float *hs = dev_get_floats(ds, n);
    memcpy(score, hs, n * sizeof(float));
    free(hs);
    free(pb);
    kern_gpu_free(dx);
    kern_gpu_free(dc);
    kern_gpu_free(ds);
    kern_gpu_free(db);
}

/* bf16 as the kernel rounds it: nearest even, subnormals flushed to zero. */
static double bf16_daz_d(float v)
{
    uint16_t h = kern_f32_to_bf16(v);
    if (!(h & 0x7f80u))
        return 0.0;
    return kern_bf16_to_f32(h);
}

static double dot_dd(const float *a, const float *b, size_t dim)
{
    double s = 0;
    for (size_t j = 0; j < dim; j++)
        s += (double)a[j] * b[j];
    return s;
}

/* |v|, |v~| and |v~ - v| in double, v~ the bf16 rounding. */
static void norms3(const float *v, size_t dim, double out[3])
{
    double s = 0, sb = 0, sd = 0;
    for (size_t j = 0; j < dim; j++) {
        double a = v[j], b = bf16_daz_d(v[j]);
        s += a * a;
        sb += b * b;
        sd += (b - a) * (b - a);
    }
    out[0] = sqrt(s), out[1] = sqrt(sb), out[2] = sqrt(sd);
}

/*
 * Test data: k unit centroids (Gaussian directions) and n unit points, with near-ties on
 * purpose when ties != 0: centroid 0 repeated at a later index in another 128-tile and at the
 * last index; centroid 1 copied with one element moved by one ulp; a third of the points exactly
 * a centroid (some of them the repeated one), a third halfway between two centroids
 * (equidistant up to rounding), the rest near a centroid (clustered, small gaps).
 */
static void nearest_data(float *x, size_t n, float *c, size_t k, size_t dim, int ties)
{
    for (size_t i = 0; i < k * dim; i++)
        c[i] = (float)gauss();
    for (size_t r = 0; r < k; r++)
        normalise(c + r * dim, dim);
    for (size_t i = 0; i < n * dim; i++)
        x[i] = (float)gauss();
    for (size_t r = 0; r < n; r++)
        normalise(x + r * dim, dim);
    if (!ties || k < 4)
        return;
    if (k > 130)
        memcpy(c + 130 * dim, c, dim * sizeof(float));
    memcpy(c + (k - 1) * dim, c, dim * sizeof(float));
    memcpy(c + 2 * dim, c + dim, dim * sizeof(float));
    c[2 * dim + dim - 1] = nextafterf(c[2 * dim + dim - 1], INFINITY);
    for (size_t r = 0; r < n; r++) {
        float *xr = x + r * dim;
        size_t a = rnd_below(k), b = rnd_below(k);
        if (r % 3 == 0) {
            memcpy(xr, c + (r % 9 == 0 ? 0 : r % 9 == 3 ? 1 : a) * dim, dim * sizeof(float));
        } else if (r % 3 == 1) {
            for (size_t j = 0; j < dim; j++)
                xr[j] = c[a * dim + j] + c[b * dim + j];
            normalise(xr, dim);
        } else {
            for (size_t j = 0; j < dim; j++)
                xr[j] = c[a * dim + j] + 0.2f * (float)gauss() / sqrtf((float)dim);
            normalise(xr, dim);
        }
    }
}

/* The double-precision argmax of x's scores (lowest index among equal doubles). */
static size_t ref_nearest(const float *x, const float *c, size_t k, size_t dim, double *best)
{
    size_t bi = 0;
    double bs = -INFINITY;
    for (size_t j = 0; j < k; j++) {
        double s = dot_dd(x, c + j * dim, dim);
        if (s > bs)
            bs = s, bi = j;
    }
    *best = bs;
    return bi;
}

/*
 * One shape through every path. The screened and dispatched answers must equal the fp32
 * kernel's bit for bit (index and score); the fp32 answer must be the double argmax up to an
 * fp32 tie (|x| |c| d 2^-23); the bf16 argmax's double score within 2 E of the true best, E the
 * bound nearest_bf16_cuda.cu proves, and its score within gt |x~| |c~| of the exact x~ . c~
 * (the tensor cores' accumulation as assumed there). refs points (spread) get the double
 * reference; all when refs >= n.
 */
static void run_nearest(size_t n, size_t k, size_t dim, int ties, size_t refs)
{
    float *x = xmalloc(n * dim * sizeof(float)), *c = xmalloc(k * dim * sizeof(float));
    nearest_data(x, n, c, k, dim, ties);
    int32_t *b32 = xmalloc(n * sizeof(int32_t)), *bsc = xmalloc(n * sizeof(int32_t)),
            *b16 = xmalloc(n * sizeof(int32_t)), *bdi = xmalloc(n * sizeof(int32_t));
    float *s32 = xmalloc(n * sizeof(float)), *ssc = xmalloc(n * sizeof(float)),
          *s16 = xmalloc(n * sizeof(float)), *sdi = xmalloc(n * sizeof(float));
    size_t nf[2] = {(size_t)-1, (size_t)-1};
    nearest_on_gpu(NC_FP32, x, n, c, k, dim, b32, s32, NULL);
    nearest_on_gpu(NC_SCREENED, x, n, c, k, dim, bsc, ssc, nf);
    nearest_on_gpu(NC_BF16, x, n, c, k, dim, b16, s16, NULL);
    nearest_on_gpu(NC_DISPATCH, x, n, c, k, dim, bdi, sdi, NULL);
    ck_assert_uint_le(nf[0], n);
    ck_assert_uint_le(nf[1], nf[0]);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(b32[i] >= 0 && (size_t)b32[i] < k, "point %zu: fp32 index %d", i, b32[i]);
        ck_assert_msg(bsc[i] == b32[i] && memcmp(&ssc[i], &s32[i], sizeof(float)) == 0,
                      "n %zu k %zu dim %zu point %zu: screened %d (%.9g), fp32 %d (%.9g)", n, k,
                      dim, i, bsc[i], ssc[i], b32[i], s32[i]);
        ck_assert_msg(bdi[i] == b32[i] && memcmp(&sdi[i], &s32[i], sizeof(float)) == 0,
                      "point %zu: kern_nearest_centroid %d, fp32 %d", i, bdi[i], b32[i]);
        ck_assert_msg(b16[i] >= 0 && (size_t)b16[i] < k, "point %zu: bf16 index %d", i, b16[i]);
    }
    /* the bound's parts, as nearest_bf16_cuda.cu builds them */
    double cmax[3] = {0, 0, 0};
    for (size_t j = 0; j < k; j++) {
        double nc[3];
        norms3(c + j * dim, dim, nc);
        for (int q = 0; q < 3; q++)
            cmax[q] = nc[q] > cmax[q] ? nc[q] : cmax[q];
    }
    const double steps = (double)((dim + 31) / 32 * 2);
    const double gt = steps * 17 * 0x1p-21 / (1 - steps * 17 * 0x1p-21);
    const double g32 = dim * 0x1p-24 / (1 - dim * 0x1p-24);
    double worst_acc = 0;
    size_t stride = refs >= n ? 1 : n / refs;
    for (size_t i = 0; i < n; i += stride) {
        const float *xi = x + i * dim;
        double nx[3], best;
        norms3(xi, dim, nx);
        size_t ri = ref_nearest(xi, c, k, dim, &best);
        /* fp32: the double argmax, or a centroid within fp32 rounding of it */
        double tie = nx[0] * cmax[0] * dim * 0x1p-23 + 1e-30;
        double got = dot_dd(xi, c + (size_t)b32[i] * dim, dim);
        ck_assert_msg(got >= best - tie, "point %zu: fp32 chose %d (%.12f), best %zu (%.12f)", i,
                      b32[i], got, ri, best);
        ck_assert_msg(fabs(s32[i] - got) <= g32 * nx[0] * cmax[0] + 1e-30,
                      "point %zu: fp32 score %.9g, exact %.12f", i, s32[i], got);
        /* bf16: within 2E of the best */
        double e = gt * nx[1] * cmax[1] + nx[2] * cmax[1] + nx[0] * cmax[2] + 0x1p-100;
        double g16 = dot_dd(xi, c + (size_t)b16[i] * dim, dim);
        ck_assert_msg(g16 >= best - 2 * e,
                      "point %zu: bf16 chose %d (%.9f), best %zu (%.9f), E %.3g", i, b16[i], g16,
                      ri, best, e);
        ck_assert_msg(fabs(s16[i] - g16) <= e, "point %zu: bf16 score %.9g, exact %.9f, E %.3g", i,
                      s16[i], g16, e);
        /* the tensor cores' accumulation against the exact product of the rounded vectors */
        double xb = 0;
        const float *cb = c + (size_t)b16[i] * dim;
        for (size_t j = 0; j < dim; j++)
            xb += bf16_daz_d(xi[j]) * bf16_daz_d(cb[j]);
        double acc_err = fabs(s16[i] - xb), acc_lim = gt * nx[1] * cmax[1] + 0x1p-100;
        ck_assert_msg(acc_err <= acc_lim, "point %zu: bf16 score %.9g, x~.c~ %.12f (limit %.3g)", i,
                      s16[i], xb, acc_lim);
        if (acc_lim > 0 && acc_err / acc_lim > worst_acc)
            worst_acc = acc_err / acc_lim;
    }
    printf("nearest n %zu k %zu dim %zu%s: %zu of %zu points open after the first pass, %zu left "
           "to the fp32 kernel; bf16 accumulation error at most %.3g of its allowance\n",
           n, k, dim, ties ? " (near-ties)" : "", nf[0], n, nf[1], worst_acc);
    /* Without planted ties the screen must settle most points, or it is not doing its job (random
     * unit vectors: the top two scores are about 0.02 apart at k ~ 1000, the window ~ 0.007). */
    if (!ties && n >= 1000 && k >= 129 && k <= 20000)
        ck_assert_msg(nf[0] <= n / 2, "the screen left %zu of %zu points open", nf[0], n);
    free(x), free(c), free(b32), free(bsc), free(b16), free(bdi);
    free(s32), free(ssc), free(s16), free(sdi);
}

START_TEST(test_kernels_gpu_nearest_bf16_matches_fp32)
{
    if (!kern_gpu_nearest_bf16_usable(128)) {
        printf("nearest bf16: no tensor-core path on this GPU (sm %d); skipped\n", device_cc());
        return;
    }
    ck_assert_str_eq(kern_nearest_centroid_bf16_path(KERN_DEV_CUDA), "mma");
    ck_assert_int_eq(kern_nearest_centroid_bf16_pays(KERN_DEV_CUDA), 1);
    static const struct {
        size_t n, k, dim;
    } shapes[] = {{1, 1, 64},        {5, 3, 128},       {37, 7, 96},    {300, 129, 128},
                  {1000, 1000, 384}, {2000, 4097, 128}, {513, 300, 64}, {129, 257, 96}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int ties = 0; ties < 2; ties++)
            run_nearest(shapes[t].n, shapes[t].k, shapes[t].dim, ties, shapes[t].n);
}
END_TEST

START_TEST(test_kernels_gpu_nearest_bf16_large)
{
    if (!kern_gpu_nearest_bf16_usable(128))
        return;
    /* Many CTAs and the full pipeline: the double reference on a spread of 64 points. */
    run_nearest(20000, 16384, 128, 0, 64);
    run_nearest(65536, 131072 - 3, 128, 1, 32);
    run_nearest(9000, 5000, 384, 1, 64);
}
END_TEST

START_TEST(test_kernels_gpu_nearest_bf16_switches)
{
    /* Dims beyond the resident point tile: no tensor-core path; the bf16 call answers in fp32. */
    ck_assert_int_eq(kern_gpu_nearest_bf16_usable(2048), 0);
    if (!kern_gpu_nearest_bf16_usable(128)) {
        ck_assert_ptr_null(kern_nearest_centroid_bf16_path(KERN_DEV_CUDA));
        return;
    }
    enum { N = 300, K = 70, D = 2048 };
    float *x = xmalloc(N * D * sizeof(float)), *c = xmalloc(K * D * sizeof(float));
    nearest_data(x, N, c, K, D, 0);
    int32_t *b1 = xmalloc(N * sizeof(int32_t)), *b2 = xmalloc(N * sizeof(int32_t));
    float *s1 = xmalloc(N * sizeof(float)), *s2 = xmalloc(N * sizeof(float));
    nearest_on_gpu(NC_FP32, x, N, c, K, D, b1, s1, NULL);
    nearest_on_gpu(NC_BF16, x, N, c, K, D, b2, s2, NULL);
    ck_assert(memcmp(b1, b2, sizeof(int32_t) * N) == 0 && memcmp(s1, s2, sizeof(float) * N) == 0);
    free(x), free(c);
    /* TARTAN_GPU_NEAREST=fp32: kern_nearest_centroid answers as before (the same bits). */
    enum { N2 = 1000, K2 = 513, D2 = 128 };
    x = xmalloc(N2 * D2 * sizeof(float)), c = xmalloc(K2 * D2 * sizeof(float));
    nearest_data(x, N2, c, K2, D2, 1);
    int32_t *b3 = xmalloc(N2 * sizeof(int32_t)), *b4 = xmalloc(N2 * sizeof(int32_t));
    float *s3 = xmalloc(N2 * sizeof(float)), *s4 = xmalloc(N2 * sizeof(float));
    ck_assert_int_eq(setenv("TARTAN_GPU_NEAREST", "fp32", 1), 0);
    nearest_on_gpu(NC_DISPATCH, x, N2, c, K2, D2, b3, s3, NULL);
    ck_assert_int_eq(unsetenv("TARTAN_GPU_NEAREST"), 0);
    nearest_on_gpu(NC_DISPATCH, x, N2, c, K2, D2, b4, s4, NULL);
    ck_assert(memcmp(b3, b4, sizeof(int32_t) * N2) == 0);
    ck_assert(memcmp(s3, s4, sizeof(float) * N2) == 0);
    free(x), free(c), free(b1), free(b2), free(s1), free(s2), free(b3), free(b4), free(s3),
        free(s4);
}
END_TEST

START_TEST(test_kernels_gpu_nearest_bf16_ties_go_to_lower_index)
{
    if (!kern_gpu_nearest_bf16_usable(128))
        return;
    /* Centroid 3 repeated at 130, 200 and 256 (other 128-tiles, other warps and lanes): points
     * equal to it take 3 on every path, the bf16 argmax included (equal rows score equally).
     * Centroid 5 repeated at 60..99, more than a second-pass list holds: points equal to it take
     * 5 too, through the fp32 kernel on the encode path. */
    enum { K = 257, D = 128, N = 300 };
    float *c = xmalloc(sizeof(float) * K * D), *x = xmalloc(sizeof(float) * N * D);
    nearest_data(x, N, c, K, D, 0);
    memcpy(c + 130 * D, c + 3 * D, sizeof(float) * D);
    memcpy(c + 200 * D, c + 3 * D, sizeof(float) * D);
    memcpy(c + 256 * D, c + 3 * D, sizeof(float) * D);
    for (size_t j = 60; j < 100; j++)
        memcpy(c + j * D, c + 5 * D, sizeof(float) * D);
    for (size_t i = 0; i < N; i += 3) {
        memcpy(x + i * D, c + 3 * D, sizeof(float) * D);
        memcpy(x + (i + 1) * D, c + 5 * D, sizeof(float) * D);
    }
    int32_t *b = xmalloc(sizeof(int32_t) * N);
    float *s = xmalloc(sizeof(float) * N);
    size_t nf[2] = {0, 0};
    for (int path = NC_FP32; path <= NC_DISPATCH; path++) {
        nearest_on_gpu(path, x, N, c, K, D, b, s, nf);
        for (size_t i = 0; i < N; i += 3) {
            ck_assert_msg(b[i] == 3, "path %d point %zu: %d", path, i, b[i]);
            ck_assert_msg(b[i + 1] == 5, "path %d point %zu: %d", path, i + 1, b[i + 1]);
        }
        if (path == NC_SCREENED) { /* every exact tie open; the 40-fold one beyond a list */
            ck_assert_uint_ge(nf[0], 2 * N / 3);
            ck_assert_uint_ge(nf[1], N / 3);
        }
    }
    free(c), free(x), free(b), free(s);
}
END_TEST

/* ---- errors become codes ---------------------------------------------------------------- */
START_TEST(test_kernels_gpu_errors_become_codes)
{
    /* An allocation the device cannot satisfy comes back as a code with text, not a crash. */
    void *p = NULL;
    ck_assert_int_eq(kern_gpu_malloc(&p, (size_t)1 << 62), KERN_ENOMEM);
    ck_assert_ptr_null(p);
    ck_assert_int_gt(strlen(kern_last_error()), 0);
    /* The failed allocation must not poison later calls. */
    run_dense(KERN_BF16, 64, 1, 4, 3, 9, 0);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"dense", test_kernels_gpu_dense_matches_reference, 120},
        {"dense_wgmma", test_kernels_gpu_dense_wgmma, 120},
        {"long_documents", test_kernels_gpu_long_documents, 120},
        {"varlen", test_kernels_gpu_varlen_matches_reference, 120},
        {"stream_warp", test_kernels_gpu_stream_warp, 120},
        {"centroid_scores", test_kernels_gpu_centroid_scores_match_reference, 60},
        {"centroid_scores_f16", test_kernels_gpu_centroid_scores_f16, 60},
        {"residual", test_kernels_gpu_residual_matches_reference, 120},
        {"residual_variants", test_kernels_gpu_residual_variants_many_docs, 300},
        {"residual_big_dims", test_kernels_gpu_residual_big_dims, 600},
        {"residual_batched", test_kernels_gpu_residual_batched, 600},
        {"residual_axes", test_kernels_gpu_residual_axes, 300},
        {"residual_axes_batched", test_kernels_gpu_residual_axes_batched, 300},
        {"residual_axes_bad_arguments", test_kernels_gpu_residual_axes_bad_arguments, 60},
        {"residual_axes_bits", test_kernels_gpu_residual_axes_bits, 300},
        {"residual_mma_dims", test_kernels_gpu_residual_mma_dims, 60},
        {"centroid_interaction", test_kernels_gpu_centroid_interaction_matches_reference, 60},
        {"topk", test_kernels_gpu_topk_matches_reference, 120},
        {"adaptive_stages", test_kernels_gpu_adaptive_stages, 120},
        {"batch_interaction", test_kernels_gpu_batch_interaction, 120},
        {"memory", test_kernels_gpu_memory_stays_within_inputs, 120},
        {"errors", test_kernels_gpu_errors_become_codes, 60},
        {"i8", test_kernels_gpu_i8_matches_reference, 120},
        {"i8_quantize", test_kernels_gpu_i8_quantize_matches_cpu, 60},
        {"nearest_bf16", test_kernels_gpu_nearest_bf16_matches_fp32, 300},
        {"nearest_bf16_large", test_kernels_gpu_nearest_bf16_large, 600},
        {"nearest_bf16_switches", test_kernels_gpu_nearest_bf16_switches, 120},
        {"nearest_bf16_ties", test_kernels_gpu_nearest_bf16_ties_go_to_lower_index, 120},
    };
    return FX_RUN("kernels_gpu", cases, FX_GPU, 0);
}
