/*
 * bench_capi.c: the C side of bench/bench_python.py, which runs the same work through the
 * Python package and compares. Public API only, plus the tool's .npy reader.
 *
 *   bench/bench_capi search INDEX QUERIES.npy [-k K] [--reps N] [--threads T] [--exhaustive]
 *       one tartan_search of the whole batch ([Nq, Lq, d]) per rep, after one warm-up call;
 *       one JSON line per rep: {"mode": "search", "rep": i, "seconds": s, "cpu_seconds": c,
 *       "qps": q, "q_per_cpu_s": qc} (CPU time of the whole process).
 *   bench/bench_capi add INDEX EMB.npy DOCLENS.npy [--train-docs N] [--centroids K]
 *       creates INDEX, trains on the first N documents (tartan_train), copies the embeddings
 *       into heap memory (as np.load does), then times one tartan_add of every document and
 *       measures the process's resident memory before it and its peak during it (VmRSS and
 *       VmHWM, the peak reset through /proc/self/clear_refs): one JSON line.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "npy.h"
#include "tartan.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of the whole process (every thread): less sensitive than wall time to other
 * work on a shared machine. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tartan_dtype engine_dtype(tool_dtype t)
{
    return t == TOOL_F16 ? TARTAN_FLOAT16 : t == TOOL_BF16 ? TARTAN_BFLOAT16 : TARTAN_FLOAT32;
}

/* A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), 0 if unreadable. */
static long long status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = 0;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':')
            kb = atoll(line + n + 1);
    if (f)
        fclose(f);
    return kb * 1024;
}

static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static int fail(tartan_db *db, const char *what)
{
    fprintf(stderr, "bench_capi: %s: %s\n", what, tartan_errmsg(db));
    return 1;
}

static int do_search(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: bench_capi search INDEX QUERIES.npy [-k K] [--reps N] "
                        "[--threads T] [--exhaustive]\n");
        return 2;
    }
    size_t k = 10;
    int reps = 5, threads = 0, exhaustive = 0;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "-k") && i + 1 < argc)
            k = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--exhaustive"))
            exhaustive = 1;
        else {
            fprintf(stderr, "bench_capi: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    char err[512];
    tool_npy q;
    int rc = tool_npy_open(&q, argv[3], TOOL_DT_FLOATS, 3, 3, err, sizeof err);
    if (rc) {
        fprintf(stderr, "bench_capi: %s\n", err);
        return 1;
    }
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    tartan_db *db;
    if (tartan_open(argv[2], &o, &db))
        return fail(NULL, argv[2]);
    tartan_queries qs = {.n_queries = q.shape[0],
                         .qlen = q.shape[1],
                         .embeddings = q.data,
                         .n_rows = q.shape[0] * q.shape[1],
                         .dim = q.shape[2],
                         .dtype = engine_dtype(q.dtype)};
    tartan_search_params p;
    tartan_search_params_init(&p, k);
    p.threads = threads;
    p.exhaustive = exhaustive;
    for (int r = -1; r < reps; r++) {
        tartan_results *res;
        double c0 = cpu_now(), t0 = now();
        if (tartan_search(db, &qs, &p, &res))
            return fail(db, "search");
        tartan_results_free(res);
        double s = now() - t0, c = cpu_now() - c0;
        if (r >= 0)
            printf("{\"mode\": \"search\", \"rep\": %d, \"seconds\": %.6f, \"cpu_seconds\": "
                   "%.6f, \"queries\": %zu, \"qps\": %.3f, \"q_per_cpu_s\": %.3f}\n",
                   r, s, c, qs.n_queries, (double)qs.n_queries / s, (double)qs.n_queries / c);
    }
    tartan_close(db);
    tool_npy_close(&q);
    return 0;
}

static int do_add(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: bench_capi add INDEX EMB.npy DOCLENS.npy [--train-docs N] "
                        "[--centroids K]\n");
        return 2;
    }
    size_t train_docs = 200, centroids = 1024;
    for (int i = 5; i < argc; i++) {
        if (!strcmp(argv[i], "--train-docs") && i + 1 < argc)
            train_docs = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--centroids") && i + 1 < argc)
            centroids = (size_t)atol(argv[++i]);
        else {
            fprintf(stderr, "bench_capi: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    char err[512];
    tool_npy e, l;
    if (tool_npy_open(&e, argv[3], TOOL_DT_FLOATS, 2, 2, err, sizeof err) ||
        tool_npy_open(&l, argv[4], TOOL_DT_INTS, 1, 1, err, sizeof err)) {
        fprintf(stderr, "bench_capi: %s\n", err);
        return 1;
    }
    size_t n = l.count, dim = e.shape[1];
    size_t *lens = malloc(n * sizeof *lens);
    char(*names)[24] = malloc(n * sizeof *names);
    const char **ids = malloc(n * sizeof *ids);
    /* The embeddings in heap memory, every page touched, as after np.load. */
    void *emb = malloc(e.nbytes);
    if (!lens || !names || !ids || !emb) {
        fprintf(stderr, "bench_capi: out of memory\n");
        return 1;
    }
    memcpy(emb, e.data, e.nbytes);
    size_t rows = 0, train_rows = 0;
    for (size_t i = 0; i < n; i++) {
        lens[i] = (size_t)tool_npy_int(&l, i);
        snprintf(names[i], sizeof names[i], "d%zu", i);
        ids[i] = names[i];
        if (i < train_docs)
            train_rows += lens[i];
        rows += lens[i];
    }
    tool_npy_close(&e);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE | TARTAN_EXCL;
    o.dim = dim;
    o.n_centroids = centroids;
    tartan_db *db;
    if (tartan_open(argv[2], &o, &db))
        return fail(NULL, argv[2]);
    tartan_dtype dt = engine_dtype(e.dtype);
    tartan_batch sample = {train_docs < n ? train_docs : n, NULL, lens, emb, train_rows, dim, dt};
    if (tartan_train(db, &sample, rows))
        return fail(db, "train");
    tartan_batch b = {n, ids, lens, emb, rows, dim, dt};
    long long before = status_bytes("VmRSS");
    reset_peak();
    double t0 = now();
    if (tartan_add(db, &b, 0))
        return fail(db, "add");
    double s = now() - t0;
    long long peak = status_bytes("VmHWM");
    printf("{\"mode\": \"add\", \"tokens\": %zu, \"bytes\": %zu, \"seconds\": %.3f, "
           "\"rss_before\": %lld, \"peak_during\": %lld, \"peak_increase\": %lld}\n",
           rows, rows * dim * (dt == TARTAN_FLOAT32 ? 4 : 2), s, before, peak, peak - before);
    tartan_close(db);
    free(emb);
    free(lens);
    free(names);
    free(ids);
    tool_npy_close(&l);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "search"))
        return do_search(argc, argv);
    if (argc > 1 && !strcmp(argv[1], "add"))
        return do_add(argc, argv);
    fprintf(stderr, "usage: bench_capi search|add ...\n");
    return 2;
}
