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
 * read (every kept document token reads its query's row: lq floats) per second.
 */
#include "config.h"

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
    const char *variants[2] = {"warp", "group"};
    float *out[2];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float *times = malloc((size_t)reps * sizeof *times);
    for (int v = 0; v < 2; v++) {
        setenv("TARTAN_INTERACTION", variants[v], 1);
        KK(kern_cuda_memset(dapprox, 0x55, nq * width * 4)); /* poisoned */
        for (int r = -1; r < reps; r++) {
            cudaEventRecord(e0, 0);
            KK(kern_cuda_interaction(dST, K, T, dq_off, q_off, nq, ddoc_off, dcodes, ddocs, width,
                                     sh->prune, sh->prune ? dcounts : NULL,
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
               (double)kept_tokens * (double)sh->lq * 4 / (med * 1e-3) / 1e9, nq, sh->lq,
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
    kern_cuda_free(dST);
    kern_cuda_free(dq_off);
    kern_cuda_free(ddoc_off);
    kern_cuda_free(dcodes);
    kern_cuda_free(ddocs);
    kern_cuda_free(dcounts);
    kern_cuda_free(dapprox);
    free(out[0]);
    free(out[1]);
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
    int bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        bad |= run_shape(&shapes[i], reps);
    return bad;
}
