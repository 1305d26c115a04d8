/*
 * bench_nearest_gpu.c: the GPU's nearest-centroid kernels (index building's k-means assignment
 * and token encoding) side by side: the fp32 kernel (nearest_cuda.cu, CUDA cores), the bf16
 * argmax on the tensor cores that k-means uses, and the encode path (the bf16 screen completed
 * in fp32, whose codes and scores equal fp32's bit for bit).
 *
 *   bench/bench_nearest_gpu [--n N] [--k K[,K...]] [--dim D] [--reps R] [--noise S]
 *                           [--seed X] [--json FILE]
 *
 * Defaults: n 262,144 points, K 131,072 and 16,384, dim 128, 3 timed calls after one warm-up
 * (the median is reported). Points are unit vectors near random centroids (each a random
 * centroid plus Gaussian noise of spread --noise, default 1.0 per unit of the centroid's
 * norm, then normalised), so that best and second-best scores are as close as in an encode of
 * a trained index rather than of pure noise; the screen's shares of points left open by its
 * first pass and left to the fp32 kernel after its second are printed with the times. Every path's
 * answer is checked against the fp32 kernel's: the encode path must match it exactly (a mismatch
 * exits 1); for the bf16 argmax the count of points that chose another centroid is printed. FLOP: 2
 * n K d per call.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels_impl.h"
#include "bench_check.h"

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A standard normal from a counter (Box-Muller on two 32-bit uniforms). */
static double gauss_at(uint64_t seed, uint64_t i)
{
    uint64_t r = mix(seed * 0x9e3779b97f4a7c15ull + i);
    double u1 = ((double)(r >> 32) + 1.0) / 4294967297.0,
           u2 = (double)(r & 0xffffffffu) / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void normalise_rows(float *v, size_t n, size_t dim)
{
#pragma omp parallel for schedule(static)
    for (long long r = 0; r < (long long)n; r++) {
        double s = 0;
        for (size_t j = 0; j < dim; j++)
            s += (double)v[r * dim + j] * v[r * dim + j];
        double inv = s > 0 ? 1 / sqrt(s) : 0;
        for (size_t j = 0; j < dim; j++)
            v[r * dim + j] = (float)(v[r * dim + j] * inv);
    }
}

static void *upload(const void *h, size_t bytes)
{
    void *d = NULL;
    KK(kern_gpu_malloc(&d, bytes));
    KK(kern_gpu_copy(d, h, bytes, 1));
    return d;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

enum { P_FP32, P_BF16, P_SCREENED, NPATHS };
static const char *path_name[NPATHS] = {"fp32", "bf16-argmax", "encode-screened"};

/* Median milliseconds of reps calls of one path; its last answer into hb, hs; nf [2] the screen's
 * counts of open points and of points left to the fp32 kernel. */
static double time_path(int path, const float *dx, size_t n, const float *dc, size_t k, size_t dim,
                        int32_t *db, float *ds, int reps, int32_t *hb, float *hs, size_t nf[2])
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float *ms = malloc(sizeof(float) * (size_t)reps);
    for (int r = -1; r < reps; r++) {
        CK(cudaEventRecord(a, 0));
        if (path == P_FP32)
            KK(kern_gpu_nearest_centroid_fp32(dx, n, dc, k, dim, db, ds));
        else if (path == P_BF16)
            KK(kern_gpu_nearest_centroid_bf16(dx, n, dc, k, dim, db, ds));
        else
            KK(kern_gpu_nearest_centroid_screened(dx, n, dc, k, dim, db, ds, nf, nf + 1));
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        if (r >= 0)
            CK(cudaEventElapsedTime(&ms[r], a, b));
    }
    qsort(ms, (size_t)reps, sizeof(float), cmp_float);
    double med = ms[reps / 2];
    free(ms);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    KK(kern_gpu_sync());
    KK(kern_gpu_copy(hb, db, n * sizeof(int32_t), 0));
    KK(kern_gpu_copy(hs, ds, n * sizeof(float), 0));
    return med;
}

int main(int argc, char **argv)
{
    size_t n = 262144, dim = 128, ks[16] = {131072, 16384}, nk = 2;
    int reps = 3;
    double noise = 1.0;
    uint64_t seed = 1;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--n") && v)
            n = strtoull(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--dim") && v)
            dim = strtoull(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--reps") && v)
            reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--noise") && v)
            noise = atof(v), i++;
        else if (!strcmp(argv[i], "--seed") && v)
            seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(argv[i], "--json") && v)
            json = v, i++;
        else if (!strcmp(argv[i], "--k") && v) {
            nk = 0;
            for (const char *p = v; *p && nk < 16;) {
                ks[nk++] = strtoull(p, (char **)&p, 10);
                if (*p == ',')
                    p++;
            }
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s [--n N] [--k K[,K...]] [--dim D] [--reps R] [--noise S] "
                    "[--seed X] [--json FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    if (n == 0 || dim == 0 || reps < 1 || nk == 0) {
        fprintf(stderr, "bench_nearest_gpu: n, dim, reps and K must be positive\n");
        return 2;
    }
    int cc = -1, dev = 0;
    struct cudaDeviceProp prop;
    if (kern_gpu_device_count() <= 0) {
        fprintf(stderr, "bench_nearest_gpu: no CUDA GPU\n");
        return 77;
    }
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    cc = prop.major * 10 + prop.minor;
    printf("device: %s (sm_%d), n %zu, dim %zu, reps %d, noise %.2f\n", prop.name, cc, n, dim, reps,
           noise);
    if (!kern_gpu_nearest_bf16_usable(dim))
        printf("note: no tensor-core path here at dim %zu; bf16 rows fall back to fp32\n", dim);
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        perror(json);
        return 1;
    }
    if (jf)
        fprintf(jf, "{\"device\": \"%s\", \"sm\": %d, \"n\": %zu, \"dim\": %zu, \"rows\": [",
                prop.name, cc, n, dim);
    printf("%-8s %-16s %10s %14s %9s %10s %s\n", "K", "path", "ms", "points/s", "TFLOP/s",
           "vs fp32", "notes");
    int failed = 0;
    for (size_t t = 0; t < nk; t++) {
        size_t k = ks[t];
        float *c = malloc(k * dim * sizeof(float)), *x = malloc(n * dim * sizeof(float));
        int32_t *hb[NPATHS];
        float *hs[NPATHS];
        if (!c || !x) {
            fprintf(stderr, "bench_nearest_gpu: out of memory\n");
            return 1;
        }
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < (long long)(k * dim); i++)
            c[i] = (float)gauss_at(seed * 7 + t, (uint64_t)i);
        normalise_rows(c, k, dim);
        double sd = noise / sqrt((double)dim);
#pragma omp parallel for schedule(static)
        for (long long r = 0; r < (long long)n; r++) {
            size_t a = (size_t)(mix(seed * 131 + (uint64_t)r) % k);
            for (size_t j = 0; j < dim; j++)
                x[r * dim + j] = (float)(c[a * dim + j] +
                                         sd * gauss_at(seed * 7 + 1000 + t, (uint64_t)r * dim + j));
        }
        normalise_rows(x, n, dim);
        float *dx = upload(x, n * dim * sizeof(float)), *dc = upload(c, k * dim * sizeof(float));
        float *ds = NULL;
        int32_t *db = NULL;
        KK(kern_gpu_malloc((void **)&ds, n * sizeof(float)));
        KK(kern_gpu_malloc((void **)&db, n * sizeof(int32_t)));
        double flop = 2.0 * (double)n * (double)k * (double)dim, ms[NPATHS];
        size_t nf[2] = {0, 0};
        for (int p = 0; p < NPATHS; p++) {
            hb[p] = malloc(n * sizeof(int32_t));
            hs[p] = malloc(n * sizeof(float));
            ms[p] = time_path(p, dx, n, dc, k, dim, db, ds, reps, hb[p], hs[p], nf);
            char note[160] = "";
            if (p == P_BF16) {
                size_t other = 0;
                for (size_t i = 0; i < n; i++)
                    other += hb[p][i] != hb[P_FP32][i];
                snprintf(note, sizeof note, "%zu points chose another centroid than fp32", other);
            } else if (p == P_SCREENED) {
                size_t bad = 0;
                for (size_t i = 0; i < n; i++)
                    bad += hb[p][i] != hb[P_FP32][i] ||
                           memcmp(&hs[p][i], &hs[P_FP32][i], sizeof(float)) != 0;
                snprintf(note, sizeof note,
                         "%.2f%% open after pass 1, %.3f%% to the fp32 kernel; %zu differ from "
                         "fp32%s",
                         100.0 * (double)nf[0] / (double)n, 100.0 * (double)nf[1] / (double)n, bad,
                         bad ? " (WRONG)" : "");
                failed |= bad != 0;
            }
            printf("%-8zu %-16s %10.2f %14.4g %9.1f %9.2fx %s\n", k, path_name[p], ms[p],
                   (double)n / (ms[p] * 1e-3), flop / (ms[p] * 1e-3) / 1e12, ms[P_FP32] / ms[p],
                   note);
            if (jf)
                fprintf(jf,
                        "%s{\"k\": %zu, \"path\": \"%s\", \"ms\": %.4f, \"points_per_s\": %.6g, "
                        "\"tflops\": %.4f, \"n_open\": %zu, \"n_fp32\": %zu}",
                        (t || p) ? ", " : "", k, path_name[p], ms[p], (double)n / (ms[p] * 1e-3),
                        flop / (ms[p] * 1e-3) / 1e12, p == P_SCREENED ? nf[0] : 0,
                        p == P_SCREENED ? nf[1] : 0);
        }
        for (int p = 0; p < NPATHS; p++)
            free(hb[p]), free(hs[p]);
        kern_gpu_free(dx);
        kern_gpu_free(dc);
        kern_gpu_free(ds);
        kern_gpu_free(db);
        free(c);
        free(x);
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    return failed;
}
