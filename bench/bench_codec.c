/*
 * bench_codec.c: quality and speed of the residual codec on a clustered synthetic corpus.
 *
 * Tokens are normalise(center + sigma * g) around random unit centers (g standard normal per
 * dimension), which gives a within-cluster spread like ColBERT's token embeddings when sigma
 * is chosen so that tokens sit at cosine ~0.8 from their k-means centroid. The pipeline is the
 * index builder's: spherical k-means over the corpus (K from the sizing plan), codes by flat
 * inner-product search, the codec trained on a held-out 5% of the tokens, then compress and
 * decompress of every token. Prints a table, writes JSON.
 *
 *   bench/bench_codec [--tokens N] [--dim D] [--clusters C] [--sigma S] [--seed X]
 *                     [--json FILE]
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

#include "codec.h"
#include "kmeans.h"
#include "plan.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_gauss(uint64_t *s)
{
    double u = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
    double v = ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void normalise(float *x, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += (double)x[j] * x[j];
    double inv = 1.0 / sqrt(s);
    for (size_t j = 0; j < dim; j++)
        x[j] = (float)(x[j] * inv);
}

static double dot_d(const float *a, const float *b, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += (double)a[j] * b[j];
    return s;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

/* Tokens per second of compress (or decompress) over the whole corpus: repeated until 0.3 s
 * have passed, best of three such runs (other people's builds share this machine). */
static double rate(const idx_codec *c, const float *cen, const float *x, const uint32_t *codes,
                   size_t n, uint8_t *p, float *inv, float *out, int decompress)
{
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        size_t done = 0;
        double t0 = now(), t;
        do {
            if (decompress)
                idx_codec_decompress(c, cen, codes, p, n, out);
            else
                idx_codec_compress(c, cen, x, codes, n, p, inv);
            done += n;
            t = now() - t0;
        } while (t < 0.3);
        if (done / t > best)
            best = done / t;
    }
    return best;
}

int main(int argc, char **argv)
{
    size_t n = 20000, dim = 128, ncl = 1000;
    double sigma = 0.06;
    uint64_t seed = 2026;
    const char *json = "bench_codec.json";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) {
            fprintf(stderr, "%s: missing value\n", a);
            return 2;
        }
        if (!strcmp(a, "--tokens"))
            n = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--dim"))
            dim = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--clusters"))
            ncl = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--sigma"))
            sigma = strtod(v, NULL);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--json"))
            json = v;
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (n < 100 || dim == 0 || dim % 8 || ncl == 0 || ncl > n) {
        fprintf(stderr, "need tokens >= 100, dim a multiple of 8, 0 < clusters <= tokens\n");
        return 2;
    }

    /* Corpus. */
    float *centers = malloc(sizeof(float) * ncl * dim), *x = malloc(sizeof(float) * n * dim);
    if (!centers || !x)
        return 1;
    uint64_t s = seed;
    for (size_t c = 0; c < ncl; c++) {
        for (size_t j = 0; j < dim; j++)
            centers[c * dim + j] = (float)rng_gauss(&s);
        normalise(centers + c * dim, dim);
    }
    /* Shuffled cluster membership, so the held-out tokens are a fair sample. */
    double cos_center = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float *c = centers + (rng_next(&s) % ncl) * dim;
        for (size_t j = 0; j < dim; j++)
            x[i * dim + j] = (float)(c[j] + sigma * rng_gauss(&s));
        normalise(x + i * dim, dim);
        cos_center += dot_d(x + i * dim, c, dim);
    }
    cos_center /= (double)n;

    /* Centroids, as the builder does: K by the plan, at most the token count. */
    size_t k = idx_plan_centroids(n);
    if (k > n)
        k = n;
    float *cen = malloc(sizeof(float) * k * dim);
    int64_t *lab = malloc(sizeof(int64_t) * n);
    float *sc = malloc(sizeof(float) * n);
    uint32_t *codes = malloc(sizeof(uint32_t) * n);
    char err[256];
    double t0 = now();
    if (idx_kmeans_spherical(x, n, dim, k, 4, 256, seed, cen, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double t_kmeans = now() - t0;
    t0 = now();
    if (idx_flat_ip_search(cen, k, dim, x, n, 1, lab, sc, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double t_assign = now() - t0;
    double cos_centroid = 0.0;
    for (size_t i = 0; i < n; i++) {
        codes[i] = (uint32_t)lab[i];
        cos_centroid += sc[i];
    }
    cos_centroid /= (double)n;

    /* Held-out 5% (the last tokens; membership is shuffled). */
    size_t nh = n / 20;
    float *res = malloc(sizeof(float) * nh * dim);
    for (size_t i = 0; i < nh; i++) {
        size_t t = n - nh + i;
        for (size_t j = 0; j < dim; j++)
            res[i * dim + j] = x[t * dim + j] - cen[(size_t)codes[t] * dim + j];
    }

    uint8_t *p = malloc(n * dim);
    float *inv = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n * dim);
    int threads = max_threads();
    const unsigned nbits_all[4] = {1, 2, 4, 8};
    double mean_cos[4], min_cos[4], c_rate[4], c_rate1[4], d_rate[4], t_train[4];
    for (int b = 0; b < 4; b++) {
        idx_codec c;
        t0 = now();
        if (idx_codec_train(&c, dim, nbits_all[b], res, nh) != 0) {
            fprintf(stderr, "codec training failed\n");
            return 1;
        }
        t_train[b] = now() - t0;
        idx_codec_compress(&c, cen, x, codes, n, p, inv);
        idx_codec_decompress(&c, cen, codes, p, n, out);
        double m = 0.0, mn = 2.0;
        for (size_t i = 0; i < n; i++) {
            double cs = dot_d(out + i * dim, x + i * dim, dim);
            m += cs;
            if (cs < mn)
                mn = cs;
        }
        mean_cos[b] = m / (double)n;
        min_cos[b] = mn;
        set_threads(threads);
        c_rate[b] = rate(&c, cen, x, codes, n, p, inv, out, 0);
        d_rate[b] = rate(&c, cen, x, codes, n, p, inv, out, 1);
        set_threads(1);
        c_rate1[b] = rate(&c, cen, x, codes, n, p, inv, out, 0);
        set_threads(threads);
    }

    printf("codec on a clustered synthetic corpus: %zu tokens, dim %zu, %zu true clusters, "
           "sigma %.3f\n",
           n, dim, ncl, sigma);
    printf("token-to-true-center cosine %.4f; K = %zu centroids (k-means %.2f s, assignment "
           "%.2f s); token-to-centroid cosine %.4f (no residual)\n",
           cos_center, k, t_kmeans, t_assign, cos_centroid);
    printf("codec trained on %zu held-out tokens; OpenMP threads %d\n\n", nh, threads);
    printf("%5s %10s %12s %10s %14s %14s %14s %9s\n", "nbits", "bytes/tok", "mean cosine",
           "min cos", "compress t/s", "compress 1thr", "decompress t/s", "train s");
    for (int b = 0; b < 4; b++)
        printf("%5u %10zu %12.4f %10.4f %14.3g %14.3g %14.3g %9.3f\n", nbits_all[b],
               dim * nbits_all[b] / 8, mean_cos[b], min_cos[b], c_rate[b], c_rate1[b], d_rate[b],
               t_train[b]);

    FILE *f = fopen(json, "w");
    if (f) {
        fprintf(f,
                "{\"bench\": \"codec\", \"tokens\": %zu, \"dim\": %zu, \"clusters\": %zu, "
                "\"sigma\": %g, \"seed\": %llu, \"threads\": %d, \"centroids\": %zu, "
                "\"cos_token_center\": %.6f, \"cos_token_centroid\": %.6f, \"kmeans_s\": %.4f, "
                "\"results\": [",
                n, dim, ncl, sigma, (unsigned long long)seed, threads, k, cos_center, cos_centroid,
                t_kmeans);
        for (int b = 0; b < 4; b++)
            fprintf(f,
                    "%s{\"nbits\": %u, \"bytes_per_token\": %zu, \"mean_cosine\": %.6f, "
                    "\"min_cosine\": %.6f, \"compress_tokens_per_s\": %.1f, "
                    "\"compress_tokens_per_s_1thread\": %.1f, "
                    "\"decompress_tokens_per_s\": %.1f, \"train_s\": %.4f}",
                    b ? ", " : "", nbits_all[b], dim * nbits_all[b] / 8, mean_cos[b], min_cos[b],
                    c_rate[b], c_rate1[b], d_rate[b], t_train[b]);
        fprintf(f, "]}\n");
        fclose(f);
        printf("\nwrote %s\n", json);
    }
    free(centers);
    free(x);
    free(cen);
    free(lab);
    free(sc);
    free(codes);
    free(res);
    free(p);
    free(inv);
    free(out);
    return 0;
}
