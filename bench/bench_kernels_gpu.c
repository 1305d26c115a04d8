/*
 * bench_kernels_gpu.c: the CUDA kernels on the shapes, against the device's own
 * ceilings.
 *
 *   bench/bench_kernels_gpu [--json FILE] [--reps N] [--only NAME] [--noise X]
 *
 * Measures the device-to-device copy bandwidth (bytes read + written), then for each shape the
 * median time of many calls (CUDA events around each call, after warm-up; inputs rotate among
 * copies when one copy would fit in L2), the bytes each shape must move at least (every input
 * read once, every output written once), its FLOPs, and so the achieved TB/s against the copy
 * ceiling and TFLOP/s. The bf16 GEMM ceiling is not measured here (cuBLAS is linked nowhere):
 * bench/peers_maxsim.py measures it with PyTorch in the same run and reads this program's JSON.
 * The int8 shapes (i8_*) run on clustered data (--noise sets its spread), quantised on the
 * GPU, side by side with the bf16 kernel on the same data, each reporting recall@10 against
 * exact fp32 MaxSim; the FP8 shapes (fp8_*) likewise, e4m3 queries and documents on the
 * FP8 tensor cores beside bf16. Prints a table; --json writes the same numbers.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "kernels_impl.h"
#include "tune_cuda.h"
#include "bench_check.h"

/* ---- data ------------------------------------------------------------------------------- */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Approximately normal values (sum of four uniforms, unit variance) in bf16 or fp16, made in
 * parallel from a counter-based generator so that gigabytes take a second. */
static void fill_16(uint16_t *h, size_t n, uint64_t seed, int bf16)
{
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) {
        uint64_t r = mix(seed * 0x9e3779b97f4a7c15ull + (uint64_t)i);
        double s = (double)(r & 0xffff) + (double)((r >> 16) & 0xffff) +
                   (double)((r >> 32) & 0xffff) + (double)(r >> 48);
        float f = (float)((s / 65536.0 - 2.0) * 1.7320508);
        h[i] = bf16 ? kern_f32_to_bf16(f) : kern_f32_to_f16(f);
    }
}

static void *upload(const void *h, size_t bytes)
{
    void *d = NULL;
    KK(kern_gpu_malloc(&d, bytes));
    KK(kern_gpu_copy(d, h, bytes, 1));
    return d;
}

static void *dev_random16(size_t n, uint64_t seed, int bf16)
{
    uint16_t *h = malloc(n * 2);
    if (!h) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    fill_16(h, n, seed, bf16);
    void *d = upload(h, n * 2);
    free(h);
    return d;
}

/* ---- timing ----------------------------------------------------------------------------- */
typedef void (*call_fn)(void *ctx, int rep);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int g_reps = 50;
static int g_back = 1;       /* calls timed together (bench_dense's back-to-back rows) */
static double g_noise = 0.6; /* int8 shapes: noise of the clustered data (--noise) */

/* Median microseconds of one call, each timed with events after warm-up. */
static double time_call(call_fn f, void *ctx, double *spread)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 5; i++)
        f(ctx, i);
    CK(cudaDeviceSynchronize());
    double *t = malloc(g_reps * sizeof(double));
    for (int i = 0; i < g_reps; i++) {
        CK(cudaEventRecord(a, 0));
        for (int k = 0; k < g_back; k++) /* g_back > 1: a call's share of a run of calls */
            f(ctx, i * g_back + k);
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        t[i] = ms * 1e3 / g_back;
    }
    CK(cudaGetLastError());
    qsort(t, g_reps, sizeof(double), cmp_double);
    double med = t[g_reps / 2];
    if (spread)
        *spread = t[(g_reps * 9) / 10] - t[g_reps / 10];
    free(t);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return med;
}

/* ---- copy ceiling ----------------------------------------------------------------------- */
typedef struct copy_ctx {
    void *src, *dst;
    size_t bytes;
} copy_ctx;

static void copy_call(void *p, int rep)
{
    copy_ctx *c = p;
    CK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, 0));
}

typedef struct copies_ctx {
    copy_ctx c[4];
} copies_ctx;

static void copies_call(void *p, int rep)
{
    copy_call(&((copies_ctx *)p)->c[rep % 4], rep);
}

/* ---- MaxSim shapes ---------------------------------------------------------------------- */
#define MAXSETS 4

typedef struct dense_ctx {
    kern_dense a[MAXSETS];
    int nsets;
    float *scores;
} dense_ctx;

static void dense_call(void *p, int rep)
{
    dense_ctx *c = p;
    KK(kern_gpu_maxsim_dense(&c->a[rep % c->nsets], c->scores));
}

typedef struct varlen_ctx {
    kern_varlen a[MAXSETS];
    int nsets;
    float *scores;
} varlen_ctx;

static void varlen_call(void *p, int rep)
{
    varlen_ctx *c = p;
    KK(kern_gpu_maxsim_varlen(&c->a[rep % c->nsets], c->scores));
}

typedef struct residual_ctx {
    kern_residual a[MAXSETS];
    int nsets;
    float *scores;
    const float *centroids; /* for the variant that computes q.C first */
    float *qc;
    int with_qc;
} residual_ctx;

static void residual_call(void *p, int rep)
{
    residual_ctx *c = p;
    kern_residual *a = &c->a[rep % c->nsets];
    if (c->with_qc)
        KK(kern_gpu_centroid_scores(a->q, a->lq, c->centroids, a->n_centroids, a->dim, c->qc));
    KK(kern_gpu_maxsim_residual(a, c->scores));
}

typedef struct topk_ctx {
    float *x;
    size_t rows, n, k;
    int64_t *idx;
    float *val;
} topk_ctx;

static void topk_call(void *p, int rep)
{
    topk_ctx *c = p;
    KK(kern_gpu_topk_rows(c->x, c->rows, c->n, c->k, c->idx, c->val));
}

/* ---- results ---------------------------------------------------------------------------- */
typedef struct result {
    char name[64];
    char desc[160];
    double us, spread, bytes, flops;
    double recall; /* recall@10 against exact fp32 MaxSim, or 0 where not measured */
} result;

static result results[128];
static int nresults;
static double copy_tbps;

static void record(const char *name, const char *desc, double us, double spread, double bytes,
                   double flops)
{
    if (nresults == (int)(sizeof results / sizeof results[0])) {
        fprintf(stderr, "bench_kernels_gpu: more shapes than results[] holds\n");
        exit(1);
    }
    result *r = &results[nresults++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->desc, sizeof r->desc, "%s", desc);
    r->us = us, r->spread = spread, r->bytes = bytes, r->flops = flops, r->recall = 0;
    double tbps = bytes / (us * 1e-6) / 1e12, tf = flops / (us * 1e-6) / 1e12;
    printf("%-16s %10.1f us (+-%5.1f)  %6.3f TB/s %5.1f%% of copy  %7.1f TFLOP/s  %s\n", name, us,
           spread / 2, tbps, 100 * tbps / copy_tbps, tf, desc);
    fflush(stdout);
}

static int want(const char *only, const char *name)
{
    return !only || strstr(name, only) != NULL;
}

/* Dense rerank: nq queries x nd docs, lq x ld tokens, dim 128, bf16. */
static void bench_dense(const char *name, size_t nq, size_t lq, size_t nd, size_t ld,
                        size_t l2_bytes)
{
    const size_t dim = 128;
    dense_ctx c = {0};
    size_t dbytes = nd * ld * dim * 2;
    c.nsets = dbytes > 4 * l2_bytes ? 1 : MAXSETS;
    for (int s = 0; s < c.nsets; s++) {
        c.a[s] = (kern_dense){KERN_BF16, dim, dev_random16(nq * lq * dim, 100 + s, 1), NULL,
                              nq,        lq,  dev_random16(nd * ld * dim, 200 + s, 1), NULL,
                              nd,        ld};
    }
    KK(kern_gpu_malloc((void **)&c.scores, nq * nd * 4));
    double spread, us = time_call(dense_call, &c, &spread);
    char desc[128];
    snprintf(desc, sizeof desc, "dense bf16 %zu q x %zu docs, Lq %zu, Ld %zu, d %zu%s", nq, nd, lq,
             ld, dim, c.nsets > 1 ? ", 4 rotating sets" : "");
    record(name, desc, us, spread, (double)dbytes + nq * lq * dim * 2.0 + nq * nd * 4.0,
           2.0 * nq * lq * nd * ld * dim);
    for (int s = 0; s < c.nsets; s++) {
        kern_gpu_free((void *)c.a[s].q);
        kern_gpu_free((void *)c.a[s].d);
    }
    kern_gpu_free(c.scores);
}

/* What moving a shape's bytes costs one call at the least: a device-to-device copy of half of
 * them (read + written), timed as the shapes are, from 4 rotating buffer pairs (beyond L2). */
static void bench_copy_floor(const char *name, double bytes, const char *of)
{
    copies_ctx c;
    const size_t half = (size_t)(bytes / 2) / 256 * 256;
    for (int s = 0; s < 4; s++) {
        c.c[s].bytes = half;
        KK(kern_gpu_malloc(&c.c[s].src, half));
        KK(kern_gpu_malloc(&c.c[s].dst, half));
        CK(cudaMemset(c.c[s].src, 1, half));
    }
    double spread, us = time_call(copies_call, &c, &spread);
    char desc[128];
    snprintf(desc, sizeof desc, "copy of %s's bytes: 2 x %.1f MB, 4 rotating pairs", of,
             half / 1e6);
    record(name, desc, us, spread, 2.0 * half, 0);
    for (int s = 0; s < 4; s++)
        kern_gpu_free(c.c[s].src), kern_gpu_free(c.c[s].dst);
}

/* Ragged lengths uniform in [26, 300] (mean 163), the same draw as bench/peers_maxsim.py. */
static int64_t *ragged_offsets(size_t nd, uint64_t seed)
{
    int64_t *off = malloc((nd + 1) * sizeof(int64_t));
    off[0] = 0;
    for (size_t i = 0; i < nd; i++)
        off[i + 1] = off[i] + 26 + (int64_t)(mix(seed * 7919 + i) % 275);
    return off;
}

static void bench_ragged(const char *name, size_t nd, size_t l2_bytes)
{
    const size_t dim = 128, lq = 32;
    varlen_ctx c = {0};
    int64_t *off = ragged_offsets(nd, 1);
    size_t tot = (size_t)off[nd];
    int64_t qoff[2] = {0, (int64_t)lq};
    c.nsets = tot * dim * 2 > 4 * l2_bytes ? 1 : MAXSETS;
    for (int s = 0; s < c.nsets; s++)
        c.a[s] = (kern_varlen){KERN_F16,
                               dim,
                               dev_random16(lq * dim, 300 + s, 0),
                               upload(qoff, sizeof qoff),
                               1,
                               dev_random16(tot * dim, 400 + s, 0),
                               upload(off, (nd + 1) * 8),
                               nd};
    KK(kern_gpu_malloc((void **)&c.scores, nd * 4));
    double spread, us = time_call(varlen_call, &c, &spread);
    char desc[128];
    snprintf(desc, sizeof desc, "varlen fp16 1 q x %zu docs, Lq %zu, avg Ld %.1f, d %zu", nd, lq,
             (double)tot / nd, dim);
    record(name, desc, us, spread, tot * dim * 2.0 + lq * dim * 2.0 + (nd + 1) * 8.0 + nd * 4.0,
           2.0 * lq * tot * dim);
    for (int s = 0; s < c.nsets; s++) {
        kern_gpu_free((void *)c.a[s].q), kern_gpu_free((void *)c.a[s].q_off);
        kern_gpu_free((void *)c.a[s].d), kern_gpu_free((void *)c.a[s].d_off);
    }
    kern_gpu_free(c.scores);
    free(off);
}

/* Bucket weights for nbits: at nbits 2 the values the dim-128 shapes always had, else evenly
 * spaced over the same range. */
static void bench_weights(float *w, unsigned nbits)
{
    static const float w2[4] = {-0.045f, -0.012f, 0.012f, 0.045f};
    const unsigned nb = 1u << nbits;
    for (unsigned b = 0; b < nb; b++)
        w[b] = nbits == 2 ? w2[b] : -0.045f + 0.09f * (float)b / (float)(nb - 1);
}

/* PLAID: nd ragged docs (as above), nbits 2, dim 128, K = 16384 centroids (PLAID's rule for
 * 1.6 M embeddings), uint16 codes, Lq 32; or the dim, nbits and K given (bench_plaid_dim). */
static void bench_plaid_dim(const char *name, size_t nd, int with_qc, size_t dim, unsigned nbits,
                            size_t K)
{
    const size_t lq = 32;
    const size_t rb = dim * nbits / 8;
    residual_ctx c = {0};
    int64_t *off = ragged_offsets(nd, 1);
    size_t tot = (size_t)off[nd];
    float *q = malloc(lq * dim * 4), *cent = malloc(K * dim * 4), *qc = malloc(lq * K * 4);
    for (size_t i = 0; i < lq * dim; i++)
        q[i] = (float)((double)(mix(11 + i) % 20001) / 10000.0 - 1.0) * 0.15f;
    for (size_t i = 0; i < K * dim; i++)
        cent[i] = (float)((double)(mix(77 + i) % 20001) / 10000.0 - 1.0) * 0.15f;
    for (size_t i = 0; i < lq * K; i++)
        qc[i] = (float)((double)(mix(99 + i) % 20001) / 10000.0 - 1.0) * 0.8f;
    float w[256];
    bench_weights(w, nbits);
    uint16_t *codes = malloc(tot * 2);
    uint8_t *res = malloc(tot * rb);
    float *inv = malloc(tot * 4);
    for (size_t t = 0; t < tot; t++) {
        codes[t] = (uint16_t)(mix(5 * t + 1) % K);
        inv[t] = 0.95f + (float)(mix(5 * t + 2) % 1000) * 1e-4f;
    }
    for (size_t i = 0; i < tot * rb; i++)
        res[i] = (uint8_t)mix(3 * i + 17);
    /* Rotating sets: the compressed docs are 62 MB, about L2's size. */
    c.nsets = MAXSETS;
    float *qd = upload(q, lq * dim * 4), *qcd = upload(qc, lq * K * 4);
    float *wd = upload(w, (1u << nbits) * sizeof(float));
    c.centroids = upload(cent, K * dim * 4);
    KK(kern_gpu_malloc((void **)&c.qc, lq * K * 4));
    c.with_qc = with_qc;
    void *bufs[MAXSETS][4];
    for (int s = 0; s < c.nsets; s++) {
        uint16_t *cd = upload(codes, tot * 2);
        uint8_t *rd = upload(res, tot * rb);
        float *id = upload(inv, tot * 4);
        kern_pdoc *hd = malloc(nd * sizeof *hd);
        for (size_t n = 0; n < nd; n++) {
            hd[n].codes = cd + off[n];
            hd[n].residuals = rd + off[n] * rb;
            hd[n].inv_norms = id + off[n];
            hd[n].ntok = (uint32_t)(off[n + 1] - off[n]);
        }
        kern_pdoc *dd = upload(hd, nd * sizeof *hd);
        free(hd);
        bufs[s][0] = cd, bufs[s][1] = rd, bufs[s][2] = id, bufs[s][3] = dd;
        c.a[s] =
            (kern_residual){dim,  nbits, 2,    qd,        lq, with_qc ? c.qc : qcd, K, wd, dd, nd,
                            NULL, 0,     NULL, {0, 0, 0}, 0};
    }
    KK(kern_gpu_malloc((void **)&c.scores, nd * 4));
    double spread, us = time_call(residual_call, &c, &spread);
    char desc[128];
    snprintf(desc, sizeof desc, "PLAID %u-bit dim %zu 1 q x %zu docs, avg %.1f tok, K %zu%s%s",
             nbits, dim, nd, (double)tot / nd, K, with_qc ? ", incl. q.C" : ", q.C given",
             kern_gpu_tune.residual_path == 2 ? ", exact fp32 kernel" : "");
    double bytes = tot * (rb + 2.0 + 4.0) + nd * (double)sizeof(kern_pdoc) + lq * K * 4.0 +
                   nd * 4.0 + (with_qc ? K * dim * 4.0 + lq * K * 4.0 : 0);
    record(name, desc, us, spread, bytes,
           2.0 * lq * tot * dim + (with_qc ? 2.0 * lq * K * dim : 0));
    for (int s = 0; s < c.nsets; s++)
        for (int j = 0; j < 4; j++)
            kern_gpu_free(bufs[s][j]);
    kern_gpu_free(qd), kern_gpu_free(qcd), kern_gpu_free(wd), kern_gpu_free(c.qc);
    kern_gpu_free((void *)c.centroids), kern_gpu_free(c.scores);
    free(q), free(cent), free(qc), free(codes), free(res), free(inv), free(off);
}

static void bench_plaid(const char *name, size_t nd, int with_qc)
{
    bench_plaid_dim(name, nd, with_qc, 128, 2, 16384);
}

static void bench_topk(const char *name, size_t rows, size_t n, size_t k)
{
    topk_ctx c = {0};
    float *h = malloc(rows * n * 4);
    for (size_t i = 0; i < rows * n; i++)
        h[i] = (float)((double)(mix(i + 5) % 2000001) / 1e6 - 1.0);
    c.x = upload(h, rows * n * 4);
    free(h);
    c.rows = rows, c.n = n, c.k = k;
    KK(kern_gpu_malloc((void **)&c.idx, rows * k * 8));
    KK(kern_gpu_malloc((void **)&c.val, rows * k * 4));
    double spread, us = time_call(topk_call, &c, &spread);
    char desc[128];
    snprintf(desc, sizeof desc, "top-%zu of %zu rows x %zu scores", k, rows, n);
    record(name, desc, us, spread, rows * n * 4.0 + rows * k * 12.0, 0);
    kern_gpu_free(c.x), kern_gpu_free(c.idx), kern_gpu_free(c.val);
}

/* Exhaustive-search shape: nq queries (Lq 32) each against the same nd documents (lengths
 * 50-90, mean 70, as the 1M-document corpus), nbits 2, dim 128, K 131,072 centroids (the 1M
 * corpus's), through kern_cuda_exact_scores (cross pairs), with the score table's columns of
 * all nq queries side by side as the GPU search lays them out. The documents (nd * 70 * 40 B)
 * exceed L2, so each query's pass reads them from memory as a full search does. */
typedef struct exact_ctx {
    kern_cuda_exact a;
    float *scores;
} exact_ctx;

static void exact_call(void *p, int rep)
{
    (void)rep;
    exact_ctx *c = p;
    KK(kern_cuda_exact_scores(&c->a, c->scores));
}

/* The axes code's shapes in the benchmarks, byte positions of 8, 4, 2 and 1 bits at dim 128, 32
 * bytes a token as the 2-bit scalar code, tables of random levels: "axes", 8 of each width (120
 * dims coded: every kind of position, and dims that decode to 0); "axesm3", the counts fitted
 * to model 3's residuals (28 / 48 / 48 axes at 4 / 2 / 1 bits, 124 dims coded). */
static const unsigned bench_axes[4] = {8, 8, 8, 8}, bench_axes_m3[4] = {0, 14, 12, 6};

static float *bench_axes_tables(const unsigned *b, int additive)
{
    const size_t n = 256 * ((size_t)b[0] + 2 * b[1] + 4 * b[2] + 8 * b[3]);
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((double)(mix(555 + i) % 20001) / 10000.0 - 1.0) * 0.08f;
    /* Additive: each value of a position a uniform quantiser of its bits (step 2^k), levels in
     * [-0.08, 0.08), as index/axes.c fits them (the bit-plane kernels). */
    float *t = h;
    for (unsigned w = 0; additive && w < 4; w++) {
        const unsigned per = 1u << w, wb = 8 / per;
        for (unsigned k = 0; k < b[w]; k++, t += 256 * per)
            for (unsigned v = 0; v < 256; v++)
                for (unsigned i = 0; i < per; i++) {
                    const unsigned idx = (v >> (i * wb)) & ((1u << wb) - 1);
                    t[v * per + i] = (float)(-0.08 + 0.16 * (idx + 0.5) / (1u << wb));
                }
    }
    float *d = upload(h, n * sizeof(float));
    free(h);
    return d;
}

/* axes: the axes code of those byte counts (dim 128) instead of the nbits scalar one (NULL);
 * additive: its tables additive in the bits (the bit-plane kernels). */
static void bench_exact_code(const char *name, size_t nq, size_t nd, size_t dim, unsigned nbits,
                             size_t K, const unsigned *axes, int additive)
{
    const size_t lq = 32, T = nq * lq;
    const size_t rb = axes ? (size_t)axes[0] + axes[1] + axes[2] + axes[3] : dim * nbits / 8;
    int64_t *off = malloc((nd + 1) * 8), *qoff = malloc((nq + 1) * 8);
    off[0] = 0;
    for (size_t i = 0; i < nd; i++)
        off[i + 1] = off[i] + 50 + (int64_t)(mix(4242 + i) % 41);
    for (size_t i = 0; i <= nq; i++)
        qoff[i] = (int64_t)(i * lq);
    const size_t tot = (size_t)off[nd];
    float *q = malloc(T * dim * 4), *st = calloc(K * T + KERN_CUDA_ST_SLACK, 4);
    for (size_t i = 0; i < T * dim; i++)
        q[i] = (float)((double)(mix(11 + i) % 20001) / 10000.0 - 1.0) * 0.15f;
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)(K * T); i++)
        st[i] = (float)((double)(mix(99 + (uint64_t)i) % 20001) / 10000.0 - 1.0) * 0.8f;
    float w[256];
    bench_weights(w, nbits);
    uint32_t *codes = malloc(tot * 4), *docs = malloc(nd * 4);
    uint8_t *res = malloc(tot * rb);
    float *inv = malloc(tot * 4);
    for (size_t t = 0; t < tot; t++) {
        codes[t] = (uint32_t)(mix(5 * t + 1) % K);
        inv[t] = 0.95f + (float)(mix(5 * t + 2) % 1000) * 1e-4f;
    }
    for (size_t i = 0; i < tot * rb; i++)
        res[i] = (uint8_t)mix(3 * i + 17);
    for (size_t i = 0; i < nd; i++)
        docs[i] = (uint32_t)i;
    exact_ctx c;
    c.a = (kern_cuda_exact){.dim = dim,
                            .nbits = nbits,
                            .q = upload(q, T * dim * 4),
                            .q_off = upload(qoff, (nq + 1) * 8),
                            .h_q_off = qoff,
                            .nq = nq,
                            .ST = upload(st, (K * T + KERN_CUDA_ST_SLACK) * 4),
                            .ld = T,
                            .n_centroids = K,
                            .bucket_weights = upload(w, (1u << nbits) * sizeof(float)),
                            .doc_off = upload(off, (nd + 1) * 8),
                            .codes = upload(codes, tot * 4),
                            .residuals = upload(res, tot * rb),
                            .inv_norms = upload(inv, tot * 4),
                            .docs = upload(docs, nd * 4),
                            .per_q = nd,
                            .cross = 1};
    if (axes) {
        c.a.axes_dec = bench_axes_tables(axes, additive);
        memcpy(c.a.axes_bytes, axes, sizeof c.a.axes_bytes);
        c.a.axes_additive = additive;
    }
    KK(kern_gpu_malloc((void **)&c.scores, nq * nd * 4));
    int reps = g_reps;
    g_reps = 11;
    double spread, us = time_call(exact_call, &c, &spread);
    g_reps = reps;
    char desc[160];
    char code[32];
    if (axes)
        snprintf(code, sizeof code, "axes %u/%u/%u/%u%s", axes[0], axes[1], axes[2], axes[3],
                 additive ? " bits" : "");
    else
        snprintf(code, sizeof code, "%u-bit", nbits);
    snprintf(desc, sizeof desc,
             "exact %zu q x %zu docs (cross), %s dim %zu, avg %.1f tok, K %zu: %.3f ms a "
             "query at 1M docs%s",
             nq, nd, code, dim, (double)tot / nd, K, us / 1e3 / nq * (1e6 / nd),
             kern_gpu_tune.residual_path == 2 ? ", exact fp32 kernel" : "");
    /* Bytes: each query's pass reads every document (codes 4 B + residual 32 B + norm 4 B a
     * token); the q.C table once. */
    record(name, desc, us, spread, nq * tot * (rb + 8.0) + K * T * 4.0 + nq * nd * 4.0,
           2.0 * lq * tot * dim * nq);
    kern_gpu_free((void *)c.a.q), kern_gpu_free((void *)c.a.q_off), kern_gpu_free((void *)c.a.ST);
    kern_gpu_free((void *)c.a.bucket_weights), kern_gpu_free((void *)c.a.doc_off);
    kern_gpu_free((void *)c.a.codes), kern_gpu_free((void *)c.a.residuals);
    kern_gpu_free((void *)c.a.inv_norms), kern_gpu_free((void *)c.a.docs), kern_gpu_free(c.scores);
    kern_gpu_free((void *)c.a.axes_dec);
    free(off), free(qoff), free(q), free(st), free(codes), free(docs), free(res), free(inv);
}

static void bench_exact_dim(const char *name, size_t nq, size_t nd, size_t dim, unsigned nbits,
                            size_t K)
{
    bench_exact_code(name, nq, nd, dim, nbits, K, NULL, 0);
}

/* The axes code against the 2-bit scalar code at the same bytes a token, batched exact scoring
 * (kern_cuda_exact_scores, cross pairs) of Lq-32 queries against 10k documents of 50-90
 * tokens, dim 128, K 8,192: codes10k_2bit_*, codes10k_axes_* and codes10k_axesm3_* (the two
 * shapes of bench_axes), codes10k_bitsm3_* (model 3's shape with additive tables: the bit-plane
 * kernels) with 1, 8 and 64 queries (64: an exhaustive search's batch), the first
 * two also on the exact fp32 kernels (_fp32); --only codes10k runs them all. */
static void bench_axes_shapes(const char *only)
{
    static const size_t nqs[] = {1, 8, 64};
    static const char *const names[] = {"2bit", "axes", "axesm3", "bitsm3"};
    const unsigned *const layouts[] = {NULL, bench_axes, bench_axes_m3, bench_axes_m3};
    for (int fp32 = 0; fp32 < 2; fp32++)
        for (size_t i = 0; i < (fp32 ? 2 : 3); i++)
            for (int code = 0; code < 4; code++) {
                char nm[64];
                snprintf(nm, sizeof nm, "codes10k_%s_%zuq%s", names[code], nqs[i],
                         fp32 ? "_fp32" : "");
                if (!want(only, nm) || (fp32 && code >= 2))
                    continue;
                kern_gpu_tune.residual_path = fp32 ? 2 : 0;
                bench_exact_code(nm, nqs[i], 10000, 128, 2, 8192, layouts[code], code == 3);
                kern_gpu_tune.residual_path = 0;
            }
}

/* The axes code at dim 384 (model 3's shape three times: 42 / 36 / 18 byte positions of 4, 2
 * and 1 bits, 96 bytes a token as the 2-bit scalar code), additive tables: the bit-plane
 * kernels, the only tensor-core kernels of the axes code past dim 128, against the 2-bit scalar
 * code's kernels and (_fp32) the exact fp32 kernel the axes code took there before.
 * bits384_{1q_10k,8q_5k,64q_5k} and 2bit384_*: 1 query x 10,000 documents (K 16,384), 8 and 64
 * queries x SciFact's 5,183 (K 4,096), crossed. */
static void bench_bits_big(const char *only)
{
    static const unsigned m3x3[4] = {0, 42, 36, 18};
    static const struct {
        const char *tag;
        size_t nq, nd, K;
    } shapes[] = {
        {"1q_10k", 1, 10000, 16384}, {"8q_5k", 8, 5183, 4096}, {"64q_5k", 64, 5183, 4096}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int v = 0; v < 3; v++) {
            char nm[64];
            snprintf(nm, sizeof nm, "%s384_%s%s", v == 0 ? "2bit" : "bits", shapes[i].tag,
                     v == 2 ? "_fp32" : "");
            if (!want(only, nm) || (v == 2 && shapes[i].nq > 8))
                continue;
            kern_gpu_tune.residual_path = v == 2 ? 2 : 0;
            bench_exact_code(nm, shapes[i].nq, shapes[i].nd, 384, 2, shapes[i].K, v ? m3x3 : NULL,
                             v != 0);
            kern_gpu_tune.residual_path = 0;
        }
}

static void bench_exact(const char *name, size_t nq, size_t nd)
{
    bench_exact_dim(name, nq, nd, 128, 2, 131072);
}

/* Dims past 256 (all-MiniLM-L6-v2's 384, 768), new kernel against old: each shape once on the
 * automatic choice (the MMA kernel with the query's fragments in shared memory) and once,
 * _fp32 in its name, on the exact fp32 kernel they took before (kern_gpu_tune.residual_path
 * 2). One query against SciFact's scale (1,000 documents, K 4,096) and 10,000; the batched
 * layout of GPU search and calibration, 8 queries x SciFact's 5,183 documents, nbits 2 and
 * 4 (calibration took 2.2 and 7.8 s for 1,000 documents on the exact kernel). */
static const struct {
    const char *name;
    int exact; /* batched (kern_cuda_exact_scores) */
    size_t nq, nd, dim;
    unsigned nbits;
    size_t K;
} big_shapes[] = {
    {"plaid384_1k", 0, 1, 1000, 384, 2, 4096},     {"plaid384_10k", 0, 1, 10000, 384, 2, 16384},
    {"plaid768_1k", 0, 1, 1000, 768, 2, 4096},     {"exact384_8x5k", 1, 8, 5183, 384, 2, 4096},
    {"exact384n4_8x5k", 1, 8, 5183, 384, 4, 4096}, {"exact768_8x5k", 1, 8, 5183, 768, 2, 4096},
};

static void bench_big_dims(const char *only)
{
    for (size_t i = 0; i < sizeof big_shapes / sizeof big_shapes[0]; i++)
        for (int fp32 = 0; fp32 < 2; fp32++) {
            char nm[64];
            snprintf(nm, sizeof nm, "%s%s", big_shapes[i].name, fp32 ? "_fp32" : "");
            if (!want(only, nm))
                continue;
            kern_gpu_tune.residual_path = fp32 ? 2 : 0;
            if (big_shapes[i].exact)
                bench_exact_dim(nm, big_shapes[i].nq, big_shapes[i].nd, big_shapes[i].dim,
                                big_shapes[i].nbits, big_shapes[i].K);
            else
                bench_plaid_dim(nm, big_shapes[i].nd, 0, big_shapes[i].dim, big_shapes[i].nbits,
                                big_shapes[i].K);
            kern_gpu_tune.residual_path = 0;
        }
}

/* The residual kernel's launch variants (kern_gpu_tune), each benchmarked under its own name. */
static const struct {
    const char *suffix;
    int tiles, pipe, ctas, sched, asmem, one;
} res_variants[] = {
    {"", 0, 0, 0, 0, 0, 0},      {"_st", 0, 0, 0, 2, 0, 0},   {"_np", 0, 2, 0, 0, 0, 0},
    {"_c4", 0, 0, 4, 0, 0, 0},   {"_np4", 0, 2, 4, 0, 0, 0},  {"_t4", 4, 0, 0, 0, 0, 0},
    {"_ar", 0, 0, 0, 0, 2, 0},   {"_a5", 0, 0, 5, 0, 0, 0},   {"_o1", 0, 0, 0, 0, 0, 1},
    {"_o2", 0, 0, 0, 0, 0, 2},   {"_o3", 0, 0, 0, 0, 0, 3},   {"_o5", 0, 0, 0, 0, 0, 5},
    {"_o6", 0, 0, 0, 0, 0, 6},   {"_o7", 0, 0, 0, 0, 0, 7},   {"_o8", 0, 0, 0, 0, 0, 8},
    {"_o9", 0, 0, 0, 0, 0, 9},   {"_o10", 0, 0, 0, 0, 0, 10}, {"_o11", 0, 0, 0, 0, 0, 11},
    {"_o12", 0, 0, 0, 0, 0, 12}, {"_o13", 0, 0, 0, 0, 0, 13}, {"_o14", 0, 0, 0, 0, 0, 14},
    {"_o15", 0, 0, 0, 0, 0, 15}, {"_o16", 0, 0, 0, 0, 0, 16}, {"_o17", 0, 0, 0, 0, 0, 17},
    {"_o18", 0, 0, 0, 0, 0, 18}, {"_o19", 0, 0, 0, 0, 0, 19}};

/* Single-knob variants of the MaxSim shapes (kern_gpu_tune field = value), each benchmarked
 * under the shape's name with the tag inserted: one-query shapes on each streaming kernel and
 * tiles in flight; the compute-bound shapes on the mma.sync tile kernel and each wgmma block. */
typedef struct knob_variant {
    int *knob;
    int value;
    const char *tag;
} knob_variant;

static const knob_variant oneq_variants[] = {{&kern_gpu_tune.stream_path, 1, "cta"},
                                             {&kern_gpu_tune.stream_path, 2, "warp"},
                                             {&kern_gpu_tune.stream_tiles, 2, "t2"},
                                             {&kern_gpu_tune.stream_tiles, 4, "t4"}};
static const knob_variant dense_variants[] = {{&kern_gpu_tune.dense_path, 1, "mma"},
                                              {&kern_gpu_tune.wgmma_rows, 128, "r128"},
                                              {&kern_gpu_tune.wgmma_rows, 256, "r256"}};

/* The MaxSim shapes, named family_size (family_tag_size under a variant); ragged:
 * bench_ragged's lengths, nd documents. */
typedef struct ms_shape {
    const char *family, *size;
    int ragged;
    size_t nq, lq, nd, ld;
} ms_shape;

static const ms_shape oneq_shapes[] = {{"rerank", "10k", 0, 1, 32, 10000, 300},
                                       {"rerank", "1k", 0, 1, 32, 1000, 300},
                                       {"ragged", "10k", 1, 1, 32, 10000, 0}};
static const ms_shape dense_shapes[] = {{"multi", "32x10k", 0, 32, 32, 10000, 300},
                                        {"colpali", "1k", 0, 1, 1024, 1000, 1030}};

/* Each shape at the defaults, then each shape under each variant. */
static void bench_shapes(const ms_shape *sh, size_t ns, const knob_variant *kv, size_t nv,
                         const char *only, size_t l2)
{
    for (size_t v = 0; v <= nv; v++) {
        if (v > 0)
            *kv[v - 1].knob = kv[v - 1].value;
        for (size_t i = 0; i < ns; i++) {
            char nm[48];
            if (v == 0)
                snprintf(nm, sizeof nm, "%s_%s", sh[i].family, sh[i].size);
            else
                snprintf(nm, sizeof nm, "%s_%s_%s", sh[i].family, kv[v - 1].tag, sh[i].size);
            if (!want(only, nm))
                continue;
            if (sh[i].ragged)
                bench_ragged(nm, sh[i].nd, l2);
            else
                bench_dense(nm, sh[i].nq, sh[i].lq, sh[i].nd, sh[i].ld, l2);
        }
        if (v > 0)
            *kv[v - 1].knob = 0;
    }
}

/* ---- INT8 MaxSim ------------------------------------------------------------------------ */
typedef struct i8_ctx {
    kern_varlen_i8 a[MAXSETS];
    int nsets;
    float *scores;
} i8_ctx;

static void i8_call(void *p, int rep)
{
    i8_ctx *c = p;
    KK(kern_gpu_maxsim_varlen_i8(&c->a[rep % c->nsets], c->scores));
}

typedef struct quant_ctx {
    const float *x;
    size_t n, dim;
    int8_t *q;
    float *s;
} quant_ctx;

static void quant_call(void *p, int rep)
{
    quant_ctx *c = p;
    (void)rep;
    KK(kern_gpu_quantize_i8(c->x, c->n, c->dim, c->q, c->s));
}

/* Approximately normal (sum of four uniforms) from a counter. */
static float normal_at(uint64_t i)
{
    uint64_t r = mix(i);
    double s = (double)(r & 0xffff) + (double)((r >> 16) & 0xffff) + (double)((r >> 32) & 0xffff) +
               (double)(r >> 48);
    return (float)((s / 65536.0 - 2.0) * 1.7320508);
}

/* Clustered unit vectors: row r is centroid (mix(r) mod K) plus noise, normalised, so that
 * rankings have structure (near-ties of pure noise would make any agreement figure moot). */
static void fill_clustered(float *x, size_t rows, size_t dim, const float *cent, size_t K,
                           uint64_t seed)
{
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < (long long)rows; r++) {
        const float *c = cent + (mix(seed * 131 + (uint64_t)r) % K) * dim;
        float *xr = x + (size_t)r * dim;
        double nn = 0;
        for (size_t k = 0; k < dim; k++) {
            xr[k] = c[k] + (float)g_noise * normal_at((seed << 40) ^ ((uint64_t)r * dim + k));
            nn += (double)xr[k] * xr[k];
        }
        const float inv = (float)(1.0 / sqrt(nn));
        for (size_t k = 0; k < dim; k++)
            xr[k] *= inv;
    }
}

/* Mean over queries of (documents in both the approx and the exact top k) / k. */
static double mean_recall(const float *exact, const float *approx, size_t nq, size_t nd, size_t k)
{
    int64_t *ie = malloc(nq * k * 8), *ia = malloc(nq * k * 8);
    float *ve = malloc(nq * k * 4), *va = malloc(nq * k * 4);
    KK(kern_cpu_topk_rows(exact, nq, nd, k, ie, ve));
    KK(kern_cpu_topk_rows(approx, nq, nd, k, ia, va));
    size_t hit = 0;
    for (size_t q = 0; q < nq; q++)
        for (size_t i = 0; i < k; i++)
            for (size_t j = 0; j < k; j++)
                hit += ie[q * k + i] == ia[q * k + j];
    free(ie), free(ia), free(ve), free(va);
    return (double)hit / (double)(nq * k);
}

static float *download_scores(const float *d, size_t n)
{
    float *h = malloc(n * 4);
    KK(kern_gpu_sync());
    KK(kern_gpu_copy(h, d, n * 4, 0));
    return h;
}

/*
 * INT8 against bf16 on the same clustered data: nq queries of Lq 32 x nd documents (fixed Ld,
 * or ragged 26-300 when ld == 0), d 128. Times the int8 kernel and the bf16 kernel side by
 * side, and reports recall@10 of each ranking against exact fp32 MaxSim (the fp32 CUDA-core
 * path on the unquantised vectors).
 */
static void bench_i8(const char *name, size_t nq, size_t nd, size_t ld, size_t l2_bytes)
{
    const size_t dim = 128, lq = 32, K = 1024, k = 10;
    int64_t *off = ld ? malloc((nd + 1) * 8) : ragged_offsets(nd, 1);
    if (ld)
        for (size_t n = 0; n <= nd; n++)
            off[n] = (int64_t)(n * ld);
    const size_t tot = (size_t)off[nd], tq = nq * lq;
    int64_t *qoff = malloc((nq + 1) * 8);
    for (size_t i = 0; i <= nq; i++)
        qoff[i] = (int64_t)(i * lq);
    float *cent = malloc(K * dim * 4);
    for (size_t i = 0; i < K * dim; i++)
        cent[i] = normal_at(0xC0FFEEull + i);
    float *dh = malloc(tot * dim * 4), *qh = malloc(tq * dim * 4);
    fill_clustered(dh, tot, dim, cent, K, 1);
    fill_clustered(qh, tq, dim, cent, K, 2);
    uint16_t *db = malloc(tot * dim * 2), *qb = malloc(tq * dim * 2);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)(tot * dim); i++)
        db[i] = kern_f32_to_bf16(dh[i]);
    for (size_t i = 0; i < tq * dim; i++)
        qb[i] = kern_f32_to_bf16(qh[i]);

    float *dd = upload(dh, tot * dim * 4), *qd = upload(qh, tq * dim * 4);
    int64_t *offd = upload(off, (nd + 1) * 8), *qoffd = upload(qoff, (nq + 1) * 8);
    float *scores;
    KK(kern_gpu_malloc((void **)&scores, nq * nd * 4));

    /* Exact fp32 scores. */
    kern_varlen ex = {KERN_F32, dim, qd, qoffd, nq, dd, offd, nd};
    KK(kern_gpu_maxsim_varlen(&ex, scores));
    float *exact = download_scores(scores, nq * nd);

    /* Quantise on the GPU (timed: one pass over the fp32 tokens). */
    int8_t *dq, *qq;
    float *ds, *qs;
    KK(kern_gpu_malloc((void **)&dq, tot * dim));
    KK(kern_gpu_malloc((void **)&ds, tot * 4));
    KK(kern_gpu_malloc((void **)&qq, tq * dim));
    KK(kern_gpu_malloc((void **)&qs, tq * 4));
    KK(kern_gpu_quantize_i8(qd, tq, dim, qq, qs));
    quant_ctx qc = {dd, tot, dim, dq, ds};
    double spread, us;
    char desc[160];
    if (nq == 1 && ld) {
        us = time_call(quant_call, &qc, &spread);
        snprintf(desc, sizeof desc, "quantise %zu fp32 tokens of d %zu to int8 + scale", tot, dim);
        record("quantize_i8", desc, us, spread, tot * (dim * 5.0 + 4.0), 0);
    } else {
        KK(kern_gpu_quantize_i8(dd, tot, dim, dq, ds));
    }
    kern_gpu_free(dd);

    /* Rotating copies where one set would sit in L2. */
    i8_ctx c = {0};
    c.nsets = tot * dim > 4 * l2_bytes ? 1 : MAXSETS;
    c.scores = scores;
    for (int s = 0; s < c.nsets; s++) {
        int8_t *d8 = dq;
        float *d8s = ds;
        if (s > 0) {
            KK(kern_gpu_malloc((void **)&d8, tot * dim));
            KK(kern_gpu_malloc((void **)&d8s, tot * 4));
            CK(cudaMemcpy(d8, dq, tot * dim, cudaMemcpyDeviceToDevice));
            CK(cudaMemcpy(d8s, ds, tot * 4, cudaMemcpyDeviceToDevice));
        }
        c.a[s] = (kern_varlen_i8){dim, qq, qs, qoffd, nq, d8, d8s, offd, nd};
    }
    us = time_call(i8_call, &c, &spread);
    KK(kern_gpu_maxsim_varlen_i8(&c.a[0], scores));
    float *s8 = download_scores(scores, nq * nd);
    const double r8 = mean_recall(exact, s8, nq, nd, k);
    snprintf(desc, sizeof desc, "int8 %zu q x %zu docs, Lq %zu, %s Ld %.1f, d %zu; recall@10 %.3f",
             nq, nd, lq, ld ? "" : "avg", (double)tot / nd, dim, r8);
    record(name, desc, us, spread,
           tot * (dim + 4.0) + tq * (dim + 4.0) + (nd + nq + 2) * 8.0 + nq * nd * 4.0,
           2.0 * lq * tot * dim * nq);
    results[nresults - 1].recall = r8;
    /* Variant: 4 tiles in flight per warp (more bytes in flight, more registers). */
    kern_gpu_tune.i8_tiles = 4;
    us = time_call(i8_call, &c, &spread);
    KK(kern_gpu_maxsim_varlen_i8(&c.a[0], scores));
    kern_gpu_tune.i8_tiles = 0;
    float *s8b = download_scores(scores, nq * nd);
    const int same = memcmp(s8, s8b, nq * nd * 4) == 0;
    char tname[64];
    snprintf(tname, sizeof tname, "%s_t4", name);
    snprintf(desc, sizeof desc, "the same, 4 tiles per warp; scores %s",
             same ? "identical" : "DIFFER");
    record(tname, desc, us, spread,
           tot * (dim + 4.0) + tq * (dim + 4.0) + (nd + nq + 2) * 8.0 + nq * nd * 4.0,
           2.0 * lq * tot * dim * nq);
    free(s8b);
    for (int s = 1; s < c.nsets; s++)
        kern_gpu_free((void *)c.a[s].d), kern_gpu_free((void *)c.a[s].d_scale);
    kern_gpu_free(dq), kern_gpu_free(ds), kern_gpu_free(qq), kern_gpu_free(qs);

    /* bf16 on the same data, same run. */
    varlen_ctx v = {0};
    v.nsets = tot * dim * 2 > 4 * l2_bytes ? 1 : MAXSETS;
    v.scores = scores;
    void *qbd = upload(qb, tq * dim * 2);
    for (int s = 0; s < v.nsets; s++)
        v.a[s] = (kern_varlen){KERN_BF16, dim, qbd, qoffd, nq, upload(db, tot * dim * 2), offd, nd};
    us = time_call(varlen_call, &v, &spread);
    KK(kern_gpu_maxsim_varlen(&v.a[0], scores));
    float *sb = download_scores(scores, nq * nd);
    const double rb = mean_recall(exact, sb, nq, nd, k);
    char bname[64];
    snprintf(bname, sizeof bname, "%s_bf16", name);
    snprintf(desc, sizeof desc, "bf16 (same data) %zu q x %zu docs; recall@10 %.3f", nq, nd, rb);
    record(bname, desc, us, spread,
           tot * dim * 2.0 + tq * dim * 2.0 + (nd + nq + 2) * 8.0 + nq * nd * 4.0,
           2.0 * lq * tot * dim * nq);
    results[nresults - 1].recall = rb;
    for (int s = 0; s < v.nsets; s++)
        kern_gpu_free((void *)v.a[s].d);
    kern_gpu_free(qbd), kern_gpu_free(qd), kern_gpu_free(offd), kern_gpu_free(qoffd);
    kern_gpu_free(scores);
    free(off), free(qoff), free(cent), free(dh), free(qh), free(db), free(qb);
    free(exact), free(s8), free(sb);
}

/*
 * FP8 (e4m3) against bf16 on the same clustered data: nq queries of lq tokens x nd documents of
 * ld tokens, d 128, dense (the FP8 tensor-core path on sm_90). Times both kernels side by side
 * on nq queries; recall@10 of each against exact fp32 MaxSim (the fp32 CUDA-core path on the
 * unrounded vectors) over rq >= nq queries, from untimed calls. The vectors are converted to
 * e4m3 as they are (unit vectors need no scale).
 */
static void bench_fp8(const char *name, size_t nq, size_t lq, size_t nd, size_t ld, size_t rq,
                      size_t l2_bytes)
{
    const size_t dim = 128, K = 1024, k = 10, tot = nd * ld, tq = rq * lq;
    float *cent = malloc(K * dim * 4), *dh = malloc(tot * dim * 4), *qh = malloc(tq * dim * 4);
    for (size_t i = 0; i < K * dim; i++)
        cent[i] = normal_at(0xC0FFEEull + i);
    fill_clustered(dh, tot, dim, cent, K, 3);
    fill_clustered(qh, tq, dim, cent, K, 4);
    uint8_t *d8 = malloc(tot * dim), *q8 = malloc(tq * dim);
    uint16_t *db = malloc(tot * dim * 2), *qb = malloc(tq * dim * 2);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)(tot * dim); i++) {
        d8[i] = kern_f32_to_e4m3(dh[i]);
        db[i] = kern_f32_to_bf16(dh[i]);
    }
    for (size_t i = 0; i < tq * dim; i++) {
        q8[i] = kern_f32_to_e4m3(qh[i]);
        qb[i] = kern_f32_to_bf16(qh[i]);
    }
    float *scores;
    KK(kern_gpu_malloc((void **)&scores, rq * nd * 4));

    /* Exact scores of the rq queries. */
    void *dd = upload(dh, tot * dim * 4), *qd = upload(qh, tq * dim * 4);
    kern_dense ex = {KERN_F32, dim, qd, NULL, rq, lq, dd, NULL, nd, ld};
    KK(kern_gpu_maxsim_dense(&ex, scores));
    float *exact = download_scores(scores, rq * nd);
    kern_gpu_free(dd), kern_gpu_free(qd);

    static const struct {
        kern_dtype t;
        const char *tag;
        size_t es;
    } types[2] = {{KERN_E4M3, "", 1}, {KERN_BF16, "_bf16", 2}};
    for (int ti = 0; ti < 2; ti++) {
        const size_t es = types[ti].es;
        const void *dsrc = ti == 0 ? (const void *)d8 : (const void *)db;
        const void *qsrc = ti == 0 ? (const void *)q8 : (const void *)qb;
        void *qdev = upload(qsrc, tq * dim * es);
        dense_ctx c = {0};
        c.nsets = tot * dim * es > 4 * l2_bytes ? 1 : MAXSETS;
        c.scores = scores;
        for (int s = 0; s < c.nsets; s++)
            c.a[s] = (kern_dense){
                types[ti].t, dim, qdev, NULL, nq, lq, upload(dsrc, tot * dim * es), NULL, nd, ld};
        double spread, us = time_call(dense_call, &c, &spread);
        /* Agreement over all rq queries (untimed). */
        kern_dense r = c.a[0];
        r.nq = rq;
        KK(kern_gpu_maxsim_dense(&r, scores));
        float *got = download_scores(scores, rq * nd);
        const double rc = mean_recall(exact, got, rq, nd, k);
        char nm[64], desc[160];
        snprintf(nm, sizeof nm, "%s%s", name, types[ti].tag);
        snprintf(desc, sizeof desc,
                 "%s %zu q x %zu docs, Lq %zu, Ld %zu, d %zu%s; recall@10 %.3f over %zu queries",
                 ti == 0 ? "fp8 e4m3" : "bf16 (same data)", nq, nd, lq, ld, dim,
                 c.nsets > 1 ? ", 4 rotating sets" : "", rc, rq);
        record(nm, desc, us, spread,
               tot * dim * (double)es + nq * lq * dim * (double)es + nq * nd * 4.0,
               2.0 * nq * lq * nd * ld * dim);
        results[nresults - 1].recall = rc;
        free(got);
        for (int s = 0; s < c.nsets; s++)
            kern_gpu_free((void *)c.a[s].d);
        kern_gpu_free(qdev);
    }
    kern_gpu_free(scores);
    free(cent), free(dh), free(qh), free(d8), free(q8), free(db), free(qb), free(exact);
}

int main(int argc, char **argv)
{
    const char *json = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--noise") && i + 1 < argc)
            g_noise = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--json FILE] [--reps N] [--only NAME] [--noise X]\n",
                    argv[0]);
            return 2;
        }
    }
    if (g_reps < 5)
        g_reps = 5;
    if (kern_gpu_device_count() == 0) {
        fprintf(stderr, "no CUDA GPU\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int drv = 0;
    CK(cudaDriverGetVersion(&drv));
    printf("device: %s, %d SMs, L2 %.0f MB, %.1f GB, driver %d\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize / 1e6, prop.totalGlobalMem / 1e9, drv);

    /* Copy ceiling: 2 GB device to device, counting bytes read and written. */
    copy_ctx cc = {NULL, NULL, (size_t)2 << 30};
    KK(kern_gpu_malloc(&cc.src, cc.bytes));
    KK(kern_gpu_malloc(&cc.dst, cc.bytes));
    CK(cudaMemset(cc.src, 1, cc.bytes));
    double spread, us = time_call(copy_call, &cc, &spread);
    copy_tbps = 2.0 * cc.bytes / (us * 1e-6) / 1e12;
    printf("copy: %.3f TB/s (2 x %.1f GB in %.1f us)\n\n", copy_tbps, cc.bytes / 1e9, us);
    kern_gpu_free(cc.src), kern_gpu_free(cc.dst);

    const size_t l2 = (size_t)prop.l2CacheSize;
    /* A call's fixed cost (one document of 32 tokens) and the copy of the 1k shape's bytes. */
    if (want(only, "rerank_1doc"))
        bench_dense("rerank_1doc", 1, 32, 1, 32, l2);
    /* The same calls 20 at a time between the events: the time a call adds to a stream of
     * calls, where the host's work for the next call overlaps the device's for this one. */
    g_back = 20;
    if (want(only, "rerank_back20_1k"))
        bench_dense("rerank_back20_1k", 1, 32, 1000, 300, l2);
    if (want(only, "rerank_back20_1doc"))
        bench_dense("rerank_back20_1doc", 1, 32, 1, 32, l2);
    g_back = 1;
    if (want(only, "floor_1k"))
        bench_copy_floor("floor_1k", 1000 * 300 * 128 * 2.0, "rerank_1k");
    bench_shapes(oneq_shapes, sizeof oneq_shapes / sizeof oneq_shapes[0], oneq_variants,
                 sizeof oneq_variants / sizeof oneq_variants[0], only, l2);
    if (want(only, "rerank_wg_10k")) { /* the wgmma kernel's 32-row block on bf16, forced */
        kern_gpu_tune.dense_path = 2;
        bench_dense("rerank_wg_10k", 1, 32, 10000, 300, l2);
        kern_gpu_tune.dense_path = 0;
    }
    bench_shapes(dense_shapes, sizeof dense_shapes / sizeof dense_shapes[0], dense_variants,
                 sizeof dense_variants / sizeof dense_variants[0], only, l2);
    for (size_t v = 0; v < sizeof res_variants / sizeof res_variants[0]; v++) {
        char nm[3][48];
        snprintf(nm[0], sizeof nm[0], "plaid%s_10k", res_variants[v].suffix);
        snprintf(nm[1], sizeof nm[1], "plaid_qc%s_10k", res_variants[v].suffix);
        snprintf(nm[2], sizeof nm[2], "exact%s_64x32k", res_variants[v].suffix);
        kern_gpu_tune.residual_tiles = res_variants[v].tiles;
        kern_gpu_tune.residual_pipe = res_variants[v].pipe;
        kern_gpu_tune.residual_ctas = res_variants[v].ctas;
        kern_gpu_tune.residual_sched = res_variants[v].sched;
        kern_gpu_tune.residual_asmem = res_variants[v].asmem;
        kern_gpu_tune.residual_one = res_variants[v].one;
        if (want(only, nm[0]))
            bench_plaid(nm[0], 10000, 0);
        if (v == 0 && want(only, nm[1]))
            bench_plaid(nm[1], 10000, 1);
        if (want(only, nm[2]))
            bench_exact(nm[2], 64, 32768);
        kern_gpu_tune.residual_tiles = kern_gpu_tune.residual_pipe = 0;
        kern_gpu_tune.residual_ctas = kern_gpu_tune.residual_sched = 0;
        kern_gpu_tune.residual_asmem = kern_gpu_tune.residual_one = 0;
    }
    bench_big_dims(only);
    bench_axes_shapes(only);
    bench_bits_big(only);
    if (want(only, "topk_10m"))
        bench_topk("topk_10m", 1, 10000000, 1000);
    if (want(only, "topk_ncells"))
        bench_topk("topk_ncells", 32, 16384, 4);
    if (want(only, "i8_rerank_10k"))
        bench_i8("i8_rerank_10k", 1, 10000, 300, l2);
    if (want(only, "i8_ragged_10k"))
        bench_i8("i8_ragged_10k", 1, 10000, 0, l2);
    if (want(only, "i8_multi_32x10k"))
        bench_i8("i8_multi_32x10k", 32, 10000, 300, l2);
    if (want(only, "fp8_rerank_10k"))
        bench_fp8("fp8_rerank_10k", 1, 32, 10000, 300, 32, l2);
    if (want(only, "fp8_multi_32x10k"))
        bench_fp8("fp8_multi_32x10k", 32, 32, 10000, 300, 32, l2);
    if (want(only, "fp8_colpali_1k"))
        bench_fp8("fp8_colpali_1k", 1, 1024, 1000, 1030, 8, l2);

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\n  \"device\": \"%s\",\n  \"sms\": %d,\n  \"l2_bytes\": %zu,\n", prop.name,
                prop.multiProcessorCount, l2);
        fprintf(f, "  \"copy_tbps\": %.4f,\n  \"reps\": %d,\n  \"shapes\": [\n", copy_tbps, g_reps);
        for (int i = 0; i < nresults; i++) {
            result *r = &results[i];
            fprintf(f,
                    "    {\"name\": \"%s\", \"desc\": \"%s\", \"us\": %.2f, \"spread_us\": %.2f, "
                    "\"bytes\": %.0f, \"flops\": %.0f, \"tbps\": %.4f, \"tflops\": %.2f, "
                    "\"recall_at_10\": %.4f}%s\n",
                    r->name, r->desc, r->us, r->spread, r->bytes, r->flops,
                    r->bytes / (r->us * 1e-6) / 1e12, r->flops / (r->us * 1e-6) / 1e12, r->recall,
                    i + 1 < nresults ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    return 0;
}
