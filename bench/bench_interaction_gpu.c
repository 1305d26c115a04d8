/*
 * bench_interaction_gpu.c: the centroid interaction of a batch of queries (PLAID's stage 2,
 * kern_cuda_interaction) on the shapes default search meets, each kernel variant timed and
 * their outputs compared bit for bit.
 *
 *   bench/bench_interaction_gpu [--reps N]
 *
 * Shapes (synthetic: random score table, random codes, random candidate lists): a chunk of 85
 * queries over 2M documents of about 11 tokens with K 65,536 (116k candidates a query: the
 * two-GPU scaling corpus of bench/RESULTS.md), and 64 queries over 1M documents of about 70
 * tokens with K 131,072 (33k candidates a query: the 1M corpus of model 1). Variants:
 * TARTAN_INTERACTION=warp (one warp a document) and the default (eight lanes a document);
 * plus query lengths of 31 tokens (no float4 rows) and the pruned form. Prints, per shape and
 * variant, the median time of a call, the microseconds a query, and the bytes of score rows
 * read (every kept document token reads its query's row: lq floats) per second. First, the
 * score table those stages read (ST = C Q^T), by the fp32 call and by the fp16 one searches
 * take (run_table).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "bench_check.h"
#include "kernels.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static double unif(void)
{
    return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct shape {
    const char *name;
    size_t n_docs, doclen, K, nq, lq, cand;
    int prune;
} shape;

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    KK(kern_cuda_malloc(&d, bytes));
    KK(kern_cuda_upload(d, h, bytes));
    return d;
}

static int run_shape(const shape *sh, int reps)
{
    const size_t N = sh->n_docs, K = sh->K, nq = sh->nq, T = nq * sh->lq;
    int64_t *doc_off = malloc((N + 1) * sizeof *doc_off);
    doc_off[0] = 0;
    for (size_t d = 0; d < N; d++) {
        size_t len = sh->doclen / 2 + (size_t)(unif() * (double)sh->doclen);
        doc_off[d + 1] = doc_off[d] + (int64_t)len;
    }
    const size_t ntok = (size_t)doc_off[N];
    uint32_t *codes = malloc(ntok * sizeof *codes);
    for (size_t t = 0; t < ntok; t++)
        codes[t] = (uint32_t)(next_u64() % K);
    /* Candidate lists: ascending document numbers, counts spread 0.5x to 1.5x. */
    size_t *cnt = malloc(nq * sizeof *cnt), width = 0;
    for (size_t q = 0; q < nq; q++) {
        cnt[q] = (size_t)((0.5 + unif()) * (double)sh->cand);
        if (cnt[q] > width)
            width = cnt[q];
    }
    uint32_t *docs = malloc(nq * width * sizeof *docs);
    for (size_t q = 0; q < nq; q++) {
        size_t got = 0;
        double p = (double)cnt[q] / (double)N;
        for (size_t d = 0; d < N && got < cnt[q]; d++)
            if (unif() < p)
                docs[q * width + got++] = (uint32_t)d;
        cnt[q] = got;
        for (; got < width; got++)
            docs[q * width + got] = KERN_NO_DOC;
    }
    int64_t *q_off = malloc((nq + 1) * sizeof *q_off);
    for (size_t q = 0; q <= nq; q++)
        q_off[q] = (int64_t)(q * sh->lq);
    const size_t st_n = K * T + KERN_CUDA_ST_SLACK;
    float *ST = malloc(st_n * sizeof *ST);
    for (size_t i = 0; i < st_n; i++)
        ST[i] = (float)(unif() * 2.0 - 1.0);
    int64_t *counts = malloc(nq * sizeof *counts);
    for (size_t q = 0; q < nq; q++)
        counts[q] = (int64_t)cnt[q];

    /* The same table rounded to fp16 and as int8, for the h16 and i8 variants. */
    uint16_t *ST16 = malloc(st_n * sizeof *ST16);
    int8_t *ST8 = malloc(st_n);
    for (size_t i = 0; i < st_n; i++) {
        ST16[i] = kern_f32_to_f16(ST[i]);
        ST8[i] = kern_f32_to_i8(ST[i]);
    }
    /* ... in blocks of the queries' columns, as the table kernel writes them. */
    uint16_t *B16 = malloc(st_n * sizeof *B16);
    int8_t *B8 = malloc(st_n);
    memset(B16, 0, st_n * sizeof *B16), memset(B8, 0, st_n);
    kern_table_blocks(ST16, 2, K, T, q_off, nq, B16);
    kern_table_blocks(ST8, 1, K, T, q_off, nq, B8);
    uint16_t *dST16 = dev_copy(B16, st_n * 2);
    int8_t *dST8 = dev_copy(B8, st_n);
    free(B16), free(B8);
    float *dST = dev_copy(ST, st_n * 4);
    int64_t *dq_off = dev_copy(q_off, (nq + 1) * 8), *ddoc_off = dev_copy(doc_off, (N + 1) * 8);
    uint32_t *dcodes = dev_copy(codes, ntok * 4), *ddocs = dev_copy(docs, nq * width * 4);
    int64_t *dcounts = dev_copy(counts, nq * 8);
    float *dapprox = NULL;
    KK(kern_cuda_malloc((void **)&dapprox, nq * width * 4));
    size_t kept_tokens = 0;
    for (size_t q = 0; q < nq; q++)
        for (size_t i = 0; i < cnt[q]; i++) {
            uint32_t d = docs[q * width + i];
            kept_tokens += (size_t)(doc_off[d + 1] - doc_off[d]);
        }
    const char *variants[4] = {"warp", "group", "h16", "i8"};
    const int nvar = sh->lq % 8 == 0 ? 4 : 2;
    float *out[4] = {NULL, NULL, NULL, NULL};
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float *times = malloc((size_t)reps * sizeof *times);
    for (int v = 0; v < nvar; v++) {
        setenv("TARTAN_INTERACTION", v == 0 ? "warp" : "group", 1);
        KK(kern_cuda_memset(dapprox, 0x55, nq * width * 4)); /* poisoned */
        for (int r = -1; r < reps; r++) {
            cudaEventRecord(e0, 0);
            if (v == 3)
                KK(kern_cuda_interaction_i8(dST, dST8, K, T, dq_off, q_off, nq, ddoc_off, dcodes,
                                            ddocs, width, sh->prune, sh->prune ? dcounts : NULL,
                                            sh->prune ? (int64_t)(sh->cand / 2) : 0, 0.95f,
                                            dapprox));
            else if (v == 2)
                KK(kern_cuda_interaction_h16(dST, dST16, K, T, dq_off, q_off, nq, ddoc_off, dcodes,
                                             ddocs, width, sh->prune, sh->prune ? dcounts : NULL,
                                             sh->prune ? (int64_t)(sh->cand / 2) : 0, 0.95f,
                                             dapprox));
            else
                KK(kern_cuda_interaction(dST, K, T, dq_off, q_off, nq, ddoc_off, dcodes, ddocs,
                                         width, sh->prune, sh->prune ? dcounts : NULL,
                                         sh->prune ? (int64_t)(sh->cand / 2) : 0, 0.95f, dapprox));
            cudaEventRecord(e1, 0);
            KK(kern_cuda_sync());
            if (r >= 0)
                cudaEventElapsedTime(&times[r], e0, e1);
        }
        qsort(times, (size_t)reps, sizeof *times, cmp_float);
        float med = times[reps / 2];
        out[v] = malloc(nq * width * 4);
        KK(kern_cuda_download(out[v], dapprox, nq * width * 4));
        printf("%-28s %-6s %9.3f ms a call %8.2f us a query  %7.1f GB/s of rows (%zu queries x "
               "%zu tokens, %zu candidates a query, %.1f tokens a candidate)\n",
               sh->name, variants[v], med, med * 1e3 / (double)nq,
               (double)kept_tokens * (double)sh->lq *
                   (v == 3   ? 1
                    : v == 2 ? 2
                             : 4) /
                   (med * 1e-3) / 1e9,
               nq, sh->lq,
               kept_tokens
                   ? (size_t)((double)(kept_tokens) / (double)nq / ((double)ntok / (double)N))
                   : 0,
               (double)ntok / (double)N);
    }
    unsetenv("TARTAN_INTERACTION");
    size_t diff = 0;
    for (size_t i = 0; i < nq * width; i++) {
        uint32_t a, b;
        memcpy(&a, &out[0][i], 4);
        memcpy(&b, &out[1][i], 4);
        diff += a != b;
    }
    printf("%-28s outputs differing in bits: %zu of %zu\n", sh->name, diff, nq * width);
    /* h16 and i8 sum the rounded rows: their largest differences from the fp32 sums. */
    for (int v = 2; v < nvar; v++) {
        double worst = 0;
        for (size_t i = 0; i < nq * width; i++) {
            double e = fabs((double)out[v][i] - (double)out[1][i]);
            if (out[1][i] == out[1][i] && !(e <= worst))
                worst = e;
        }
        printf("%-28s %s: largest difference from group %.3g\n", sh->name, variants[v], worst);
    }
    kern_cuda_free(dST);
    kern_cuda_free(dq_off);
    kern_cuda_free(ddoc_off);
    kern_cuda_free(dcodes);
    kern_cuda_free(ddocs);
    kern_cuda_free(dcounts);
    kern_cuda_free(dapprox);
    free(out[0]);
    free(out[1]);
    free(out[2]);
    free(out[3]);
    kern_cuda_free(dST16);
    kern_cuda_free(dST8);
    free(ST16);
    free(ST8);
    free(times);
    free(doc_off);
    free(codes);
    free(cnt);
    free(docs);
    free(q_off);
    free(ST);
    free(counts);
    return diff != 0;
}

/* The score table ST = C Q^T of one chunk: the fp32 call (3xTF32) against the fp16 one
 * (centroids that are fp16 numbers, tokens in two fp16 parts), with the largest difference
 * between their outputs. Useful work: 2 K T dim FLOP, and K T 4 bytes written. */
static void run_table(const char *name, size_t K, size_t T, size_t dim, int reps)
{
    float *C = malloc(K * dim * sizeof *C), *Q = malloc(T * dim * sizeof *Q);
    uint16_t *C16 = malloc(K * dim * sizeof *C16);
    for (size_t i = 0; i < K * dim; i++) {
        C16[i] = kern_f32_to_f16((float)((unif() * 2.0 - 1.0) * 0.2));
        C[i] = kern_f16_to_f32(C16[i]);
    }
    for (size_t i = 0; i < T * dim; i++)
        Q[i] = (float)((unif() * 2.0 - 1.0) * 0.2);
    float *dC = dev_copy(C, K * dim * 4), *dQ = dev_copy(Q, T * dim * 4);
    uint16_t *dC16 = dev_copy(C16, K * dim * 2);
    float *dS[2];
    KK(kern_cuda_malloc((void **)&dS[0], K * T * 4));
    KK(kern_cuda_malloc((void **)&dS[1], K * T * 4));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float *times = malloc((size_t)reps * sizeof *times);
    const char *variants[2] = {"fp32 (3xTF32)", "fp16 x 2"};
    for (int v = 0; v < 2; v++) {
        for (int r = -1; r < reps; r++) {
            cudaEventRecord(e0, 0);
            if (v == 0)
                KK(kern_centroid_scores(KERN_DEV_CUDA, dC, K, dQ, T, dim, dS[0]));
            else
                KK(kern_cuda_centroid_scores_f16(dC16, K, dQ, T, dim, dS[1], NULL, NULL, NULL,
                                                 NULL));
            cudaEventRecord(e1, 0);
            KK(kern_cuda_sync());
            if (r >= 0)
                cudaEventElapsedTime(&times[r], e0, e1);
        }
        qsort(times, (size_t)reps, sizeof *times, cmp_float);
        const double med = times[reps / 2];
        printf("table %-26s %-14s %8.3f ms a call %7.1f TFLOP/s %7.1f GB/s written (K %zu, %zu "
               "tokens, dim %zu)\n",
               name, variants[v], med,
               2.0 * (double)K * (double)T * (double)dim / (med * 1e-3) / 1e12,
               (double)K * (double)T * 4 / (med * 1e-3) / 1e9, K, T, dim);
    }
    float *h[2];
    double worst = 0;
    for (int v = 0; v < 2; v++) {
        h[v] = malloc(K * T * 4);
        KK(kern_cuda_download(h[v], dS[v], K * T * 4));
    }
    for (size_t i = 0; i < K * T; i++) {
        double d = fabs((double)h[0][i] - (double)h[1][i]);
        if (!(d <= worst))
            worst = d;
    }
    printf("table %-26s largest difference between the two: %.3g\n", name, worst);
    kern_cuda_free(dC), kern_cuda_free(dQ), kern_cuda_free(dC16);
    kern_cuda_free(dS[0]), kern_cuda_free(dS[1]);
    free(C), free(Q), free(C16), free(h[0]), free(h[1]), free(times);
}

int main(int argc, char **argv)
{
    int reps = 9;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_interaction_gpu [--reps N]\n");
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    if (kern_cuda_device_count() < 1) {
        fprintf(stderr, "bench_interaction_gpu: no CUDA device\n");
        return 77;
    }
    const shape shapes[] = {
        {"2M docs, len 10, K 65536", 2000000, 11, 65536, 85, 32, 116000, 0},
        {"1M docs, len 70, K 131072", 1000000, 70, 131072, 64, 32, 33000, 0},
        {"2M docs, 31-token queries", 2000000, 11, 65536, 85, 31, 116000, 0},
        {"1M docs, len 70, pruned", 1000000, 70, 131072, 64, 32, 33000, 1},
        {"200k docs, len 70, 64-tok q", 200000, 70, 32768, 64, 64, 20000, 0},
    };
    run_table("1M docs, K 131072, 64 q", 131072, 64 * 32, 128, reps);
    run_table("2M docs, K 65536, 85 q", 65536, 85 * 32, 128, reps);
    run_table("one query, K 131072", 131072, 32, 128, reps);
    int bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        bad |= run_shape(&shapes[i], reps);
    return bad;
}
