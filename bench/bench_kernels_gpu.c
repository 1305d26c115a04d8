/*
 * bench_kernels_gpu.c: the CUDA kernels on the shapes, against the device's own
 * ceilings.
 *
 *   bench/bench_kernels_gpu [--json FILE] [--reps N] [--only NAME]
 *
 * Measures the device-to-device copy bandwidth (bytes read + written), then for each shape the
 * median time of many calls (CUDA events around each call, after warm-up; inputs rotate among
 * copies when one copy would fit in L2), the bytes each shape must move at least (every input
 * read once, every output written once), its FLOPs, and so the achieved TB/s against the copy
 * ceiling and TFLOP/s. The bf16 GEMM ceiling is not measured here (cuBLAS is linked nowhere):
 * bench/peers_maxsim.py measures it with PyTorch in the same run and reads this program's JSON.
 * Prints a table; --json writes the same numbers.
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

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define KK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != KERN_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %d %s\n", __FILE__, __LINE__, #call, rc_,                  \
                    kern_last_error());                                                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

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
        f(ctx, i);
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        t[i] = ms * 1e3;
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
    char desc[128];
    double us, spread, bytes, flops;
} result;

static result results[32];
static int nresults;
static double copy_tbps;

static void record(const char *name, const char *desc, double us, double spread, double bytes,
                   double flops)
{
    result *r = &results[nresults++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->desc, sizeof r->desc, "%s", desc);
    r->us = us, r->spread = spread, r->bytes = bytes, r->flops = flops;
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

/* PLAID: nd ragged docs (as above), nbits 2, dim 128, K = 16384 centroids (PLAID's rule for
 * 1.6 M embeddings), uint16 codes, Lq 32. */
static void bench_plaid(const char *name, size_t nd, int with_qc)
{
    const size_t dim = 128, lq = 32, K = 16384;
    const unsigned nbits = 2;
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
    float w[4] = {-0.045f, -0.012f, 0.012f, 0.045f};
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
    float *qd = upload(q, lq * dim * 4), *qcd = upload(qc, lq * K * 4), *wd = upload(w, sizeof w);
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
        c.a[s] = (kern_residual){dim, nbits, 2, qd, lq, with_qc ? c.qc : qcd, K, wd, dd, nd};
    }
    KK(kern_gpu_malloc((void **)&c.scores, nd * 4));
    double spread, us = time_call(residual_call, &c, &spread);
    char desc[128];
    snprintf(desc, sizeof desc, "PLAID 2-bit 1 q x %zu docs, avg %.1f tok, K %zu%s", nd,
             (double)tot / nd, K, with_qc ? ", incl. q.C" : ", q.C given");
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
        else {
            fprintf(stderr, "usage: %s [--json FILE] [--reps N] [--only NAME]\n", argv[0]);
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
    if (want(only, "rerank_10k"))
        bench_dense("rerank_10k", 1, 32, 10000, 300, l2);
    if (want(only, "rerank_1k"))
        bench_dense("rerank_1k", 1, 32, 1000, 300, l2);
    if (want(only, "ragged_10k"))
        bench_ragged("ragged_10k", 10000, l2);
    if (want(only, "multi_32x10k"))
        bench_dense("multi_32x10k", 32, 32, 10000, 300, l2);
    if (want(only, "colpali_1k"))
        bench_dense("colpali_1k", 1, 1024, 1000, 1030, l2);
    if (want(only, "plaid_10k"))
        bench_plaid("plaid_10k", 10000, 0);
    if (want(only, "plaid_t4_10k")) { /* variant: 4 tiles in flight per warp, fewer warps */
        kern_gpu_tune.residual_tiles = 4;
        bench_plaid("plaid_t4_10k", 10000, 0);
        kern_gpu_tune.residual_tiles = 0;
    }
    if (want(only, "plaid_qc_10k"))
        bench_plaid("plaid_qc_10k", 10000, 1);
    if (want(only, "topk_10m"))
        bench_topk("topk_10m", 1, 10000000, 1000);
    if (want(only, "topk_ncells"))
        bench_topk("topk_ncells", 32, 16384, 4);

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
                    "\"bytes\": %.0f, \"flops\": %.0f, \"tbps\": %.4f, \"tflops\": %.2f}%s\n",
                    r->name, r->desc, r->us, r->spread, r->bytes, r->flops,
                    r->bytes / (r->us * 1e-6) / 1e12, r->flops / (r->us * 1e-6) / 1e12,
                    i + 1 < nresults ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    return 0;
}
