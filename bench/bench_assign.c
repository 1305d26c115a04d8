/*
 * bench_assign.c: index building's heavy steps on a device: nearest-centroid assignment
 * (encoding's first step), spherical k-means (training) and residual compression, on random
 * clustered unit vectors. Prints a table and writes JSON.
 *
 * Assignment costs 2 n K d floating-point operations (one multiply-add per point, centroid and
 * dimension), reported beside the time. On a GPU of sm_80 or later kern_nearest_centroid screens
 * in bf16 on the tensor cores and completes in fp32 (the fp32 kernel's codes bit for bit), and
 * k-means assigns in bf16; TARTAN_GPU_NEAREST=fp32 and TARTAN_KMEANS_BF16=0 give the fp32
 * kernel alone, to compare. "kernel" times kern_nearest_centroid on points already in device
 * memory; "assign" times idx_assign as the build calls it, copies included.
 *
 *   bench/bench_assign [--device cpu|cuda] [--tokens N] [--centroids K] [--dim D]
 *                      [--kmeans-points M] [--iters I] [--check N] [--seed X] [--json FILE]
 *                      [--embeddings E.npy] [--per-centroid P] [--no-amx]
 *
 * On the GPU host, 1M-document (70M-token) sizes: --device cuda --tokens 4194304
 * --centroids 131072 --kmeans-points 11700000 (the 95% of a 175,000-document sample that
 * k-means gets); the build's assignment time then scales by 70M / tokens.
 *
 * --embeddings takes the points from a real corpus (its first --tokens rows, L2-normalised)
 * instead of random clustered vectors: k-means runs on all of them (at most --per-centroid points
 * a centroid, default 64 as in a build), and the assignment step uses the centroids it found,
 * rounded to fp16 as the index stores them. The last lines say whether k-means assigned in bf16
 * or fp32 (idx_kmeans_bf16: TARTAN_KMEANS_BF16=0 forces fp32) and, with --embeddings, the mean
 * cosine of a token to its centroid (what k-means maximises), to compare the two trainings.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "assign.h"
#include "codec.h"
#include "kernels.h"
#include "kernels_impl.h"
#include "microkernel_cpu.h"
#include "npy.h"
#include "store.h"

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rng_next(uint64_t *s)
{
    return mix(*s += 0x9e3779b97f4a7c15ull);
}

static double rng_gauss(uint64_t *s)
{
    double u = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
    double v = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void unit_row(float *x, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += (double)x[j] * x[j];
    double inv = 1.0 / sqrt(s);
    for (size_t j = 0; j < dim; j++)
        x[j] = (float)(x[j] * inv);
}

/* Row i of the data: normalise(center[i's cluster] + sigma g), from a stream seeded by (seed,
 * i), so rows are made in parallel and the same whatever the thread count. sigma 0.06 at d 128
 * puts tokens at cosine ~0.8 from their center, like ColBERT tokens to their centroid. */
static void make_rows(float *x, size_t n, size_t dim, const float *centers, size_t ncl,
                      uint64_t seed)
{
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) {
        uint64_t s = mix(seed ^ mix((uint64_t)i + 1));
        const float *c = centers + (rng_next(&s) % ncl) * dim;
        float *r = x + (size_t)i * dim;
        for (size_t j = 0; j < dim; j++)
            r[j] = (float)(c[j] + 0.06 * rng_gauss(&s));
        unit_row(r, dim);
    }
}

static void make_units(float *x, size_t n, size_t dim, uint64_t seed)
{
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) {
        uint64_t s = mix(seed ^ mix((uint64_t)i + 7));
        float *r = x + (size_t)i * dim;
        for (size_t j = 0; j < dim; j++)
            r[j] = (float)rng_gauss(&s);
        unit_row(r, dim);
    }
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_assign: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static size_t arg_size(const char *v, const char *name)
{
    char *end;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || *end || x == 0) {
        fprintf(stderr, "bench_assign: %s wants a positive number\n", name);
        exit(2);
    }
    return (size_t)x;
}

int main(int argc, char **argv)
{
    kern_dev dev = kern_cuda_device_count() > 0 ? KERN_DEV_CUDA : KERN_DEV_CPU;
    size_t n = (size_t)1 << 20, k = 131072, dim = 128, km_n = (size_t)1 << 20, iters = 4;
    size_t check = 2000;
    uint64_t seed = 42;
    const char *json = "bench_assign.json", *emb_path = NULL;
    size_t per = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--device") && v) {
            if (!strcmp(v, "cpu"))
                dev = KERN_DEV_CPU;
            else if (!strcmp(v, "cuda"))
                dev = KERN_DEV_CUDA;
            else {
                fprintf(stderr, "bench_assign: --device cpu or cuda\n");
                return 2;
            }
        } else if (!strcmp(a, "--tokens"))
            n = arg_size(v, a);
        else if (!strcmp(a, "--centroids"))
            k = arg_size(v, a);
        else if (!strcmp(a, "--dim"))
            dim = arg_size(v, a);
        else if (!strcmp(a, "--kmeans-points"))
            km_n = arg_size(v, a);
        else if (!strcmp(a, "--iters"))
            iters = arg_size(v, a);
        else if (!strcmp(a, "--check"))
            check = arg_size(v, a);
        else if (!strcmp(a, "--seed"))
            seed = arg_size(v, a);
        else if (!strcmp(a, "--json") && v)
            json = v;
        else if (!strcmp(a, "--embeddings") && v)
            emb_path = v;
        else if (!strcmp(a, "--per-centroid"))
            per = arg_size(v, a);
        else if (!strcmp(a, "--no-amx")) {
            kern_cpu_use_amx(0); /* bf16 k-means on AVX512_BF16 (with TARTAN_KMEANS_BF16=1) */
            continue;
        } else {
            fprintf(stderr, "usage: bench_assign [--device cpu|cuda] [--tokens N] [--centroids K]"
                            " [--dim D] [--kmeans-points M] [--iters I] [--check N] [--seed X]"
                            " [--json FILE] [--embeddings E.npy] [--per-centroid P] [--no-amx]\n");
            return 2;
        }
        i++;
    }
    if (km_n < k)
        km_n = k;
    if (check > n)
        check = n;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    char cpu[128] = "unknown";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[256];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
                snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
                cpu[strcspn(cpu, "\n")] = '\0';
                break;
            }
        fclose(ci);
    }
    printf("bench_assign: device %s, %zu tokens, K %zu, dim %zu, k-means %zu points x %zu "
           "iterations, %d CPU threads (%s)\n",
           dev == KERN_DEV_CUDA ? "cuda" : "cpu", n, k, dim, km_n, iters, threads, cpu);

    size_t ncl = k * 2;
    float *centers = xmalloc(ncl * dim * sizeof(float));
    float *x, *cen = xmalloc(k * dim * sizeof(float));
    store_msg m = {{0}};
    double t_kmeans = NAN;
    if (emb_path) {
        /* A real corpus: its first n rows, and centroids trained on them as a build does. */
        tool_npy e;
        char err[512];
        if (tool_npy_open(&e, emb_path, TOOL_DT(TOOL_F32) | TOOL_DT(TOOL_F16), 2, 2, err,
                          sizeof err)) {
            fprintf(stderr, "bench_assign: %s\n", err);
            return 1;
        }
        dim = e.shape[1];
        if (n > e.shape[0])
            n = e.shape[0];
        x = xmalloc(n * dim * sizeof(float));
        for (size_t i = 0; i < n * dim; i++)
            x[i] = e.dtype == TOOL_F16 ? kern_f16_to_f32(((const uint16_t *)e.data)[i])
                                       : ((const float *)e.data)[i];
        tool_npy_close(&e);
        for (size_t i = 0; i < n; i++)
            unit_row(x + i * dim, dim);
        /* Centroids for the assignment step: k-means as a build trains them (timed here; at
         * most per points a centroid, a seeded subset), stored as fp16. */
        km_n = n;
        double t0 = now();
        if (idx_kmeans_device(dev, x, n, dim, k, (int)iters, (int)per, seed, cen, &m)) {
            fprintf(stderr, "bench_assign: k-means: %s\n", m.text);
            return 1;
        }
        t_kmeans = now() - t0;
        for (size_t i = 0; i < k * dim; i++)
            cen[i] = kern_f16_to_f32(kern_f32_to_f16(cen[i]));
        printf("corpus %s: %zu tokens, dim %zu; k-means on %zu of them\n", emb_path, n, dim,
               n < k * per ? n : k * per);
    } else {
        make_units(centers, ncl, dim, seed);
        x = xmalloc(n * dim * sizeof(float));
        make_rows(x, n, dim, centers, ncl, seed + 1);
        make_rows(cen, k, dim, centers, ncl, seed + 2); /* centroids near the data, as trained */
    }
    uint32_t *codes = xmalloc(n * sizeof(uint32_t));
    const double flop = 2.0 * (double)n * (double)k * (double)dim;

    /* Kernel alone, on device-resident points (CUDA), or the CPU kernel. */
    double t_kernel = NAN;
    if (dev == KERN_DEV_CUDA) {
        size_t chunk = n < ((size_t)1 << 20) ? n : ((size_t)1 << 20);
        float *dx, *dc;
        int32_t *db;
        if (kern_cuda_malloc((void **)&dx, chunk * dim * sizeof(float)) ||
            kern_cuda_malloc((void **)&dc, k * dim * sizeof(float)) ||
            kern_cuda_malloc((void **)&db, chunk * sizeof(int32_t)) ||
            kern_cuda_upload(dx, x, chunk * dim * sizeof(float)) ||
            kern_cuda_upload(dc, cen, k * dim * sizeof(float))) {
            fprintf(stderr, "bench_assign: %s\n", kern_last_error());
            return 1;
        }
        /* warm-up */
        kern_nearest_centroid(KERN_DEV_CUDA, dx, chunk < 1024 ? chunk : 1024, dc, k, dim, db, NULL);
        kern_cuda_sync();
        double t0 = now();
        if (kern_nearest_centroid(KERN_DEV_CUDA, dx, chunk, dc, k, dim, db, NULL) ||
            kern_cuda_sync()) {
            fprintf(stderr, "bench_assign: %s\n", kern_last_error());
            return 1;
        }
        t_kernel = (now() - t0) * (double)n / (double)chunk;
        kern_cuda_free(dx);
        kern_cuda_free(dc);
        kern_cuda_free(db);
    }

    float *best = xmalloc(n * sizeof(float));
    double t0 = now();
    if (idx_assign(dev, cen, k, dim, x, n, codes, best, &m)) {
        fprintf(stderr, "bench_assign: assignment: %s\n", m.text);
        return 1;
    }
    double t_assign = now() - t0;
    /* How well the centroids serve the tokens: the mean cosine of each to its code's centroid
     * (the quantity k-means maximises), to compare trainings (TARTAN_KMEANS_BF16=0 or not). */
    double mean_cos = 0;
    for (size_t i = 0; i < n; i++)
        mean_cos += best[i];
    mean_cos /= (double)n;
    free(best);

    /* A check against the CPU kernel on the first points: differing codes must be near-ties. */
    int32_t *ref = xmalloc(check * sizeof(int32_t));
    size_t differ = 0, bad = 0;
    if (kern_nearest_centroid(KERN_DEV_CPU, x, check, cen, k, dim, ref, NULL) == KERN_OK) {
        for (size_t i = 0; i < check; i++) {
            if ((uint32_t)ref[i] == codes[i])
                continue;
            differ++;
            double a = 0, b = 0;
            for (size_t j = 0; j < dim; j++) {
                a += (double)x[i * dim + j] * cen[(size_t)ref[i] * dim + j];
                b += (double)x[i * dim + j] * cen[(size_t)codes[i] * dim + j];
            }
            bad += fabs(a - b) >= 1e-5;
        }
    }
    /* The screen of the fp32 argmax on the same points (AMX, kernels/nearest_amx_cpu.c, or else
     * int8 on AVX2, kernels/nearest_i8_cpu.c), against the unscreened fp32 kernel: codes and
     * scores equal bit for bit, how many points its window left to the fp32 kernel, and its
     * time. */
    size_t scr_fp32 = 0, scr_differ = 0;
    int screened = 0;
    const char *scr_name = "AMX";
    double t_scr = NAN, t_unscr = NAN;
    if (dev == KERN_DEV_CPU) {
        int32_t *b1 = xmalloc(check * sizeof(int32_t)), *b2 = xmalloc(check * sizeof(int32_t));
        float *s1 = xmalloc(check * sizeof(float)), *s2 = xmalloc(check * sizeof(float));
        double t0 = now();
        int rc1 = kern_cpu_nearest_centroid_fp32(x, check, cen, k, dim, b1, s1);
        double t1 = now();
        int rc2 = kern_cpu_nearest_centroid_screened(x, check, cen, k, dim, b2, s2, &scr_fp32);
        if (rc2 == KERN_ENODEV && kern_cpu_amx_usable() == 0) {
            scr_name = "int8 (AVX2)";
            t1 = now();
            rc2 = kern_cpu_nearest_centroid_screened_i8(x, check, cen, k, dim, b2, s2, &scr_fp32);
        }
        double t2 = now();
        if (rc1 == KERN_OK && rc2 == KERN_OK) {
            screened = 1;
            t_unscr = t1 - t0;
            t_scr = t2 - t1;
            for (size_t i = 0; i < check; i++)
                scr_differ += b1[i] != b2[i] || memcmp(s1 + i, s2 + i, sizeof(float)) != 0;
        }
        free(b1);
        free(b2);
        free(s1);
        free(s2);
    }
    free(ref);

    /* Residual compression of every token (CPU, OpenMP), with a codec trained on a slice. */
    size_t held = n < 50000 ? n : 50000;
    float *res = xmalloc(held * dim * sizeof(float));
    for (size_t i = 0; i < held; i++)
        for (size_t j = 0; j < dim; j++)
            res[i * dim + j] = x[i * dim + j] - cen[(size_t)codes[i] * dim + j];
    idx_codec codec;
    double t_compress = NAN;
    if (idx_codec_train(&codec, dim, 2, res, held) == 0) {
        uint8_t *packed = xmalloc(n * idx_codec_token_bytes(&codec));
        float *inv = xmalloc(n * sizeof(float));
        t0 = now();
        idx_codec_compress(&codec, cen, x, codes, n, packed, inv);
        t_compress = now() - t0;
        free(packed);
        free(inv);
    }
    free(res);

    /* k-means as training runs it (a real corpus: timed above). */
    free(x);
    if (!emb_path) {
        float *kx = xmalloc(km_n * dim * sizeof(float));
        make_rows(kx, km_n, dim, centers, ncl, seed + 3);
        t0 = now();
        if (idx_kmeans_device(dev, kx, km_n, dim, k, (int)iters, (int)per, seed, cen, &m)) {
            fprintf(stderr, "bench_assign: k-means: %s\n", m.text);
            return 1;
        }
        t_kmeans = now() - t0;
        free(kx);
    }
    double km_flop =
        2.0 * (double)(km_n < k * per ? km_n : k * per) * (double)k * (double)dim * (double)iters;
    printf("\n%-28s %12s %14s %12s\n", "step", "seconds", "TFLOP", "TFLOP/s");
    if (!isnan(t_kernel))
        printf("%-28s %12.3f %14.2f %12.2f\n", "kernel (device-resident)", t_kernel, flop / 1e12,
               flop / t_kernel / 1e12);
    printf("%-28s %12.3f %14.2f %12.2f\n", "assign (copies included)", t_assign, flop / 1e12,
           flop / t_assign / 1e12);
    printf("%-28s %12.3f %14.2f %12.2f\n", "k-means (all iterations)", t_kmeans, km_flop / 1e12,
           km_flop / t_kmeans / 1e12);
    printf("%-28s %12.3f %14s %12s\n", "compress (CPU threads)", t_compress, "-", "-");
    printf("\nassign: %.0f tokens/s (%.1f s per 70M tokens); compress: %.0f tokens/s\n",
           (double)n / t_assign, 70e6 * t_assign / (double)n, (double)n / t_compress);
    printf("check: %zu of %zu codes differ from the CPU kernel's, %zu beyond a near-tie\n", differ,
           check, bad);
    if (screened)
        printf("fp32 screened on %s: %zu of %zu points left to the fp32 kernel; %zu codes or "
               "scores differ from the unscreened kernel's; %.3f s against %.3f s unscreened\n",
               scr_name, scr_fp32, check, scr_differ, t_scr, t_unscr);
    else if (dev == KERN_DEV_CPU)
        printf("fp32 screened: not here (%s)\n", kern_last_error());
    printf("k-means assignment in %s (%s); mean cosine of a token to its centroid %.6f\n",
           idx_kmeans_bf16(dev) ? "bf16" : "fp32",
           idx_kmeans_bf16(dev) ? kern_nearest_centroid_bf16_path(dev) : "fp32 kernel", mean_cos);

    FILE *f = fopen(json, "w");
    if (f) {
        fprintf(f,
                "{\"bench\": \"assign\", \"device\": \"%s\", \"cpu\": \"%s\", \"threads\": %d, "
                "\"tokens\": %zu, \"centroids\": %zu, \"dim\": %zu, \"assign_flop\": %.6g, "
                "\"kernel_s\": %.6g, \"assign_s\": %.6g, \"kmeans_points\": %zu, "
                "\"kmeans_iters\": %zu, \"kmeans_flop\": %.6g, \"kmeans_s\": %.6g, "
                "\"compress_s\": %.6g, \"check_points\": %zu, \"check_differ\": %zu, "
                "\"check_beyond_tie\": %zu, \"kmeans_per_centroid\": %zu, "
                "\"kmeans_bf16\": %d, \"mean_cosine\": %.6f, \"screened\": %d, "
                "\"screen_fp32_points\": %zu, \"screen_differ\": %zu}\n",
                dev == KERN_DEV_CUDA ? "cuda" : "cpu", cpu, threads, n, k, dim, flop,
                isnan(t_kernel) ? -1.0 : t_kernel, t_assign, km_n, iters, km_flop, t_kmeans,
                t_compress, check, differ, bad, per, idx_kmeans_bf16(dev), mean_cos, screened,
                scr_fp32, scr_differ);
        fclose(f);
    }
    free(centers);
    free(cen);
    free(codes);
    return bad ? 1 : 0;
}
