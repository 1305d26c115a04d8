/*
 * bench_kernels.c: the CPU MaxSim kernels at the ColBERT shape (Lq 32, d 128, Ld 300 padded or
 * ragged 30..300), one query and 32 queries against N documents, fp32 / bf16 / f16, plus the
 * residual-fused PLAID kernel (2-bit, ragged). Each figure is set against this machine's
 * measured single-precision GEMM rate through BLAS (the attainable ceiling) and a naive loop.
 *
 *   bench_kernels [--device cpu|cuda] [--threads N] [--ndocs N] [--reps N] [--isa NAME]
 *                 [--json FILE]
 *
 * FLOPs are counted as 2 * Lq * Ld * d per query-document pair (Ld: the document's tokens), so
 * rates are comparable with GEMM's 2 * M * N * K. The naive reference is a plain triple loop
 * (dot products, max, sum) on one thread, timed on a subset and scaled to N documents; it also
 * checks the kernel's scores on that subset.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(HAVE_CBLAS_H)
#include <cblas.h>
#elif defined(HAVE_OPENBLAS_CBLAS_H)
#include <openblas/cblas.h>
#else
enum CBLAS_ORDER { CblasRowMajor = 101 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };
void cblas_sgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int, int, float,
                 const float *, int, const float *, int, float, float *, int);
#endif

#include "kernels.h"
#include "microkernel_cpu.h"

/* OpenBLAS's thread control, where the BLAS is OpenBLAS (weak: other BLASes lack it). */
void openblas_set_num_threads(int) __attribute__((weak));

#define LQ 32
#define DIM 128
#define LD 300
#define LD_MIN 30

static double clock_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

/*
 * CPU time of the process (all threads). On a shared machine wall time counts the time other
 * programs hold the cores; FLOPs per CPU second (per busy core) do not, so the table shows
 * both. Time OpenMP threads spend spinning at barriers counts as CPU time.
 */
static double cpu_now(void)
{
    return clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

/* xorshift64*: fast, reproducible inputs. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the GEMM ceiling ----------------------------------------------------------------- */

/* A GEMM rate: best GFLOP/s over wall time, and per CPU second (per busy core). */
typedef struct rate {
    double wall, core;
} rate;

/* Rates of C[M,N] = A[M,K] B[N,K]^T, the best of a few runs. */
static rate gemm_rate(int M, int N, int K)
{
    float *A = xmalloc((size_t)M * K * 4), *B = xmalloc((size_t)N * K * 4);
    float *C = xmalloc((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)M * K; i++)
        A[i] = frand();
    for (size_t i = 0; i < (size_t)N * K; i++)
        B[i] = frand();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < 5; r++) {
        double t = now(), c = cpu_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
        t = now() - t;
        c = cpu_now() - c;
        best = t < best ? t : best;
        best_cpu = c < best_cpu ? c : best_cpu;
    }
    free(A);
    free(B);
    free(C);
    return (rate){2.0 * M * N * K / best * 1e-9, 2.0 * M * N * K / best_cpu * 1e-9};
}

/* ---- the naive reference ---------------------------------------------------------------- */

static float naive_score(const float *q, size_t lq, const float *d, size_t ld)
{
    float s = 0.0f;
    for (size_t i = 0; i < lq; i++) {
        float mx = -INFINITY;
        for (size_t t = 0; t < ld; t++) {
            float dot = 0.0f;
            for (size_t k = 0; k < DIM; k++)
                dot += q[i * DIM + k] * d[t * DIM + k];
            mx = dot > mx ? dot : mx;
        }
        s += mx;
    }
    return ld ? s : -INFINITY;
}

/* ---- one case ----------------------------------------------------------------------------- */

typedef struct result {
    char name[64];
    const char *dtype;
    size_t nq, nd;
    double avg_ld, time_ms, gflops, core_gflops, naive_ms, max_rel_err;
} result;

static result results[32];
static int nresults;

typedef struct inputs {
    size_t nd;
    float *q32;    /* [32 queries, LQ, DIM] */
    uint16_t *q16; /* the same in the 16-bit type under test */
    float *d32;    /* [nd, LD, DIM] */
    uint16_t *d16; /* the same in the 16-bit type under test */
    int64_t *off;  /* ragged offsets [nd + 1] into the same rows */
    int64_t *qoff; /* [nq + 1] */
} inputs;

static void fill16(const float *src, uint16_t *dst, size_t n, kern_dtype t)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        dst[i] = t == KERN_F16 ? kern_f32_to_f16(src[i]) : kern_f32_to_bf16(src[i]);
}

static void to32(const uint16_t *src, float *dst, size_t n, kern_dtype t)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = t == KERN_F16 ? kern_f16_to_f32(src[i]) : kern_bf16_to_f32(src[i]);
}

/*
 * Runs MaxSim (dense when ragged == 0, else varlen) for nq queries against in->nd documents
 * in dtype t, reps times; checks a subset against the naive loop and times that loop.
 */
static void run_case(const char *name, const inputs *in, kern_dtype t, size_t nq, int ragged,
                     int reps, size_t naive_docs)
{
    size_t nd = in->nd;
    const void *q = t == KERN_F32 ? (const void *)in->q32 : (const void *)in->q16;
    const void *d = t == KERN_F32 ? (const void *)in->d32 : (const void *)in->d16;
    float *scores = xmalloc(nq * nd * sizeof(float));
    double total_tokens = ragged ? (double)in->off[nd] : (double)nd * LD;
    double flops = 2.0 * LQ * DIM * total_tokens * nq;
    kern_dense dn = {t, DIM, q, NULL, nq, LQ, d, NULL, nd, LD};
    kern_varlen vl = {t, DIM, q, in->qoff, nq, d, in->off, nd};
    double *times = xmalloc(reps * sizeof(double)), best_cpu = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now(), c0 = cpu_now();
        int rc = ragged ? kern_maxsim_varlen(KERN_DEV_CPU, &vl, scores)
                        : kern_maxsim_dense(KERN_DEV_CPU, &dn, scores);
        times[r] = now() - t0;
        c0 = cpu_now() - c0;
        best_cpu = c0 < best_cpu ? c0 : best_cpu;
        if (rc) {
            fprintf(stderr, "%s: error %d: %s\n", name, rc, kern_last_error());
            exit(1);
        }
    }
    qsort(times, reps, sizeof *times, cmp_double);
    double best = times[0];

    /* Naive loop on the first naive_docs documents of query 0 (and the check). */
    size_t sub = naive_docs < nd ? naive_docs : nd;
    float *qf = xmalloc(LQ * DIM * sizeof(float));
    float *df = xmalloc((size_t)LD * DIM * sizeof(float));
    if (t == KERN_F32)
        memcpy(qf, in->q32, LQ * DIM * sizeof(float));
    else
        to32(in->q16, qf, LQ * DIM, t);
    double naive = 0.0, sub_tokens = 0.0, err = 0.0;
    for (size_t n = 0; n < sub; n++) {
        size_t first = ragged ? (size_t)in->off[n] : n * LD;
        size_t ld = ragged ? (size_t)(in->off[n + 1] - in->off[n]) : LD;
        const float *dd;
        if (t == KERN_F32) {
            dd = in->d32 + first * DIM;
        } else {
            to32(in->d16 + first * DIM, df, ld * DIM, t);
            dd = df;
        }
        /* This thread's CPU time: the loop runs on one thread. */
        double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        float ref = naive_score(qf, LQ, dd, ld);
        naive += clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
        sub_tokens += ld;
        double e = fabs((double)scores[n] - ref) / (fabs(ref) + 1.0);
        err = e > err ? e : err;
    }
    naive *= total_tokens * nq / (sub_tokens ? sub_tokens : 1);

    result *res = &results[nresults++];
    snprintf(res->name, sizeof res->name, "%s", name);
    res->dtype = t == KERN_F32 ? "f32" : t == KERN_F16 ? "f16" : "bf16";
    res->nq = nq;
    res->nd = nd;
    res->avg_ld = total_tokens / nd;
    res->time_ms = best * 1e3;
    res->gflops = flops / best * 1e-9;
    res->core_gflops = flops / best_cpu * 1e-9;
    res->naive_ms = naive * 1e3;
    res->max_rel_err = err;
    free(times);
    free(scores);
    free(qf);
    free(df);
}

/* ---- residual-fused PLAID scoring, 2-bit, ragged ------------------------------------------ */

static void run_residual(const inputs *in, int reps)
{
    const size_t K = 16384, nbits = 2, tb = DIM * nbits / 8, nd = in->nd;
    size_t T = (size_t)in->off[nd];
    float *C = xmalloc(K * DIM * sizeof(float)), *qc = xmalloc(LQ * K * sizeof(float));
    uint16_t *codes = xmalloc(T * sizeof(uint16_t));
    uint8_t *res = xmalloc(T * tb);
    float *inv = xmalloc(T * sizeof(float)), *scores = xmalloc(nd * sizeof(float));
    kern_pdoc *docs = xmalloc(nd * sizeof *docs);
    const float w[4] = {-0.05f, -0.015f, 0.015f, 0.05f};
    for (size_t i = 0; i < K * DIM; i++)
        C[i] = frand() * 0.15f;
    for (size_t t = 0; t < T; t++) {
        codes[t] = (uint16_t)(rng % K);
        inv[t] = 1.0f + 0.1f * frand();
        for (size_t b = 0; b < tb; b++)
            res[t * tb + b] = (uint8_t)(frand() * 127.0f + 128.0f);
    }
    for (size_t n = 0; n < nd; n++) {
        size_t f = (size_t)in->off[n];
        docs[n] =
            (kern_pdoc){codes + f, res + f * tb, inv + f, (uint32_t)(in->off[n + 1] - in->off[n])};
    }
    kern_centroid_scores(KERN_DEV_CPU, in->q32, LQ, C, K, DIM, qc);
    kern_residual a = {DIM, nbits, 2, in->q32, LQ, qc, K, w, docs, nd, NULL, 0, NULL, {0, 0, 0}};
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now(), c0 = cpu_now();
        int rc = kern_maxsim_residual(KERN_DEV_CPU, &a, scores);
        t0 = now() - t0;
        c0 = cpu_now() - c0;
        best_cpu = c0 < best_cpu ? c0 : best_cpu;
        if (rc) {
            fprintf(stderr, "residual: error %d: %s\n", rc, kern_last_error());
            exit(1);
        }
        best = t0 < best ? t0 : best;
    }
    result *r = &results[nresults++];
    snprintf(r->name, sizeof r->name, "plaid 2-bit ragged 1q");
    r->dtype = "2-bit";
    r->nq = 1;
    r->nd = nd;
    r->avg_ld = (double)T / nd;
    r->time_ms = best * 1e3;
    r->gflops = 2.0 * LQ * DIM * T / best * 1e-9;
    r->core_gflops = 2.0 * LQ * DIM * T / best_cpu * 1e-9;
    r->naive_ms = NAN;
    r->max_rel_err = NAN;
    free(C);
    free(qc);
    free(codes);
    free(res);
    free(inv);
    free(scores);
    free(docs);
}

/* ---- machine description ---------------------------------------------------------------- */

static void cpu_model(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c += 2;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    fclose(f);
}

static void load_avg(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f)
        return;
    if (fgets(buf, (int)n, f))
        buf[strcspn(buf, "\n")] = 0;
    fclose(f);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_kernels [--device cpu|cuda] [--threads N] [--ndocs N] [--reps N]\n"
               "                     [--isa avx512|avx2|generic] [--json FILE]\n");
}

int main(int argc, char **argv)
{
    const char *json = NULL, *isa = NULL, *device = "cpu";
    int threads = 0, reps = 3;
    size_t nd = 10000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--device") && v) {
            device = v;
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            threads = atoi(v);
            i++;
        } else if (!strcmp(a, "--ndocs") && v) {
            nd = strtoull(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            reps = atoi(v);
            i++;
        } else if (!strcmp(a, "--isa") && v) {
            isa = v;
            i++;
        } else if (!strcmp(a, "--json") && v) {
            json = v;
            i++;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!strcmp(device, "cuda")) {
        fprintf(stderr, "bench_kernels: the GPU benchmark is bench/bench_kernels_gpu\n");
        return 2;
    }
    if (strcmp(device, "cpu") || nd == 0 || reps < 1) {
        usage(stderr);
        return 2;
    }
    if (threads > 0) {
        kern_set_threads(threads);
        if (openblas_set_num_threads)
            openblas_set_num_threads(threads);
    }
    if (isa && kern_cpu_force_isa(isa)) {
        fprintf(stderr, "bench_kernels: %s\n", kern_last_error());
        return 2;
    }
#ifdef _OPENMP
    int nthreads = omp_get_max_threads();
#else
    int nthreads = 1;
#endif
    char model[256], load[128];
    cpu_model(model, sizeof model);
    load_avg(load, sizeof load);

    /* Inputs: 32 queries; nd documents of LD tokens; ragged lengths uniform in LD_MIN..LD
     * over the same rows (a ragged document never needs its own copy). */
    const size_t NQ = 32;
    inputs in = {nd, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t qn = NQ * LQ * DIM, dn = nd * LD * DIM;
    in.q32 = xmalloc(qn * 4);
    in.q16 = xmalloc(qn * 2);
    in.d32 = xmalloc(dn * 4);
    in.d16 = xmalloc(dn * 2);
    in.off = xmalloc((nd + 1) * 8);
    in.qoff = xmalloc((NQ + 1) * 8);
    for (size_t i = 0; i < qn; i++)
        in.q32[i] = frand();
    for (size_t i = 0; i < dn; i++)
        in.d32[i] = frand();
    in.off[0] = 0;
    for (size_t n = 0; n < nd; n++) {
        frand();
        in.off[n + 1] = in.off[n] + LD_MIN + (int64_t)(rng % (LD - LD_MIN + 1));
    }
    for (size_t q = 0; q <= NQ; q++)
        in.qoff[q] = (int64_t)(q * LQ);

    printf("tartan CPU kernel benchmark: %s, %d threads, %s kernels, load %s\n", model, nthreads,
           kern_mk_active()->name, load);
    printf("shape: Lq %d, d %d, Ld %d padded or %d..%d ragged, %zu documents\n\n", LQ, DIM, LD,
           LD_MIN, LD, nd);

    /* GEMM ceilings: a query block against many document tokens, and a square GEMM. */
    rate g_1q = gemm_rate(LQ, 32768, DIM), g_32q = gemm_rate(NQ * LQ, 8192, DIM);
    rate g_sq = gemm_rate(2048, 2048, 2048);
    printf("cblas_sgemm GFLOP/s (per core on CPU time): %.1f (%.1f) 32 x 32768 x 128, "
           "%.1f (%.1f) 1024 x 8192 x 128, %.1f (%.1f) 2048^3\n",
           g_1q.wall, g_1q.core, g_32q.wall, g_32q.core, g_sq.wall, g_sq.core);

    size_t nv = 200; /* documents the naive loop runs on */
    int reps32 = reps > 2 ? 2 : reps;
    run_case("dense 1q", &in, KERN_F32, 1, 0, reps, nv);
    run_case("varlen 1q", &in, KERN_F32, 1, 1, reps, nv);
    run_case("dense 32q", &in, KERN_F32, NQ, 0, reps32, nv / 8);
    run_case("varlen 32q", &in, KERN_F32, NQ, 1, reps32, nv / 8);
    for (int k = 0; k < 2; k++) {
        kern_dtype t = k == 0 ? KERN_BF16 : KERN_F16;
        fill16(in.q32, in.q16, qn, t);
        fill16(in.d32, in.d16, dn, t);
        run_case("dense 1q", &in, t, 1, 0, reps, nv);
        run_case("varlen 1q", &in, t, 1, 1, reps, nv);
        run_case("dense 32q", &in, t, NQ, 0, reps32, nv / 8);
        if (t == KERN_BF16)
            run_case("varlen 32q", &in, t, NQ, 1, reps32, nv / 8);
    }
    run_residual(&in, reps);

    /* The GEMM rates again: on a shared machine the load may have changed meanwhile, and
     * the ceiling is the best rate BLAS reached at any time of the run. */
    rate e_1q = gemm_rate(LQ, 32768, DIM), e_32q = gemm_rate(NQ * LQ, 8192, DIM);
    printf("cblas_sgemm GFLOP/s at the end: %.1f (%.1f) 32 x 32768 x 128, %.1f (%.1f) 1024 x "
           "8192 x 128\n",
           e_1q.wall, e_1q.core, e_32q.wall, e_32q.core);
    rate all[5] = {g_1q, g_32q, g_sq, e_1q, e_32q}, ceiling = {0, 0};
    for (int i = 0; i < 5; i++) {
        ceiling.wall = all[i].wall > ceiling.wall ? all[i].wall : ceiling.wall;
        ceiling.core = all[i].core > ceiling.core ? all[i].core : ceiling.core;
    }
    printf("ceiling (best cblas_sgemm rate): %.1f GFLOP/s, %.1f per core on CPU time\n\n",
           ceiling.wall, ceiling.core);

    char load_end[128];
    load_avg(load_end, sizeof load_end);
    printf("load at the end: %s\n\n", load_end);
    /* of GEMM: wall-time rate over the wall-time ceiling; per core: both on CPU time. naive:
     * one thread's CPU time, scaled to all documents and queries. */
    printf("%-22s %-5s %3s %6s %6s %9s %8s %7s %8s %7s %10s %7s %8s\n", "case", "dtype", "nq",
           "docs", "avg Ld", "time ms", "GFLOP/s", "of GEMM", "GF/core", "of GEMM", "naive ms",
           "speedup", "max err");
    for (int i = 0; i < nresults; i++) {
        result *r = &results[i];
        printf("%-22s %-5s %3zu %6zu %6.1f %9.2f %8.1f %6.0f%% %8.1f %6.0f%% %10.0f %6.0fx "
               "%8.1e\n",
               r->name, r->dtype, r->nq, r->nd, r->avg_ld, r->time_ms, r->gflops,
               100.0 * r->gflops / ceiling.wall, r->core_gflops,
               100.0 * r->core_gflops / ceiling.core, r->naive_ms, r->naive_ms / r->time_ms,
               r->max_rel_err);
    }

    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        time_t tt = time(NULL);
        char date[64];
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tt));
        fprintf(f,
                "{\n  \"benchmark\": \"bench_kernels\",\n  \"device\": \"cpu\",\n"
                "  \"cpu\": \"%s\",\n  \"threads\": %d,\n  \"isa\": \"%s\",\n"
                "  \"date\": \"%s\",\n  \"loadavg\": \"%s\",\n  \"loadavg_end\": \"%s\",\n"
                "  \"shape\": {\"lq\": %d, \"dim\": %d, \"ld\": %d, \"ld_min\": %d, "
                "\"ndocs\": %zu},\n"
                "  \"sgemm_gflops\": {\"32x32768x128\": %.2f, \"1024x8192x128\": %.2f, "
                "\"2048^3\": %.2f, \"32x32768x128_end\": %.2f, \"1024x8192x128_end\": %.2f, "
                "\"ceiling\": %.2f, \"ceiling_per_core_cpu_time\": %.2f},\n  \"results\": [\n",
                model, nthreads, kern_mk_active()->name, date, load, load_end, LQ, DIM, LD, LD_MIN,
                nd, g_1q.wall, g_32q.wall, g_sq.wall, e_1q.wall, e_32q.wall, ceiling.wall,
                ceiling.core);
        for (int i = 0; i < nresults; i++) {
            result *r = &results[i];
            fprintf(f,
                    "    {\"case\": \"%s\", \"dtype\": \"%s\", \"nq\": %zu, \"ndocs\": %zu, "
                    "\"avg_ld\": %.2f, \"time_ms\": %.4f, \"gflops\": %.2f, "
                    "\"fraction_of_gemm\": %.4f, \"gflops_per_core_cpu_time\": %.2f, "
                    "\"fraction_of_gemm_per_core\": %.4f",
                    r->name, r->dtype, r->nq, r->nd, r->avg_ld, r->time_ms, r->gflops,
                    r->gflops / ceiling.wall, r->core_gflops, r->core_gflops / ceiling.core);
            if (!isnan(r->naive_ms))
                fprintf(f, ", \"naive_ms_scaled\": %.1f, \"max_rel_err\": %.3g", r->naive_ms,
                        r->max_rel_err);
            fprintf(f, "}%s\n", i + 1 < nresults ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }
    free(in.q32);
    free(in.q16);
    free(in.d32);
    free(in.d16);
    free(in.off);
    free(in.qoff);
    return 0;
}
