/*
 * bench_search_gpu.c: search on a CUDA GPU (issue 7's figures) on an index built beforehand.
 *
 *   - loading the mirror (the first GPU search of a handle) and the GPU memory it holds;
 *   - exhaustive search on the GPU: every query in batches, time per query; its top 10 is the
 *     reference for recall and is written as a TREC run (--truth-out) for the peers;
 *   - the k = 10 defaults (adaptive, recall target 0.95), the adaptive search at each of
 *     --targets, and PLAID's fixed stages at each setting of --ncells x --ndocs (threshold
 *     --thresholds, default 0.5, ColBERT's): recall@10 against exhaustive, batched queries/s
 *     (every query in one call, best of --reps), single-query p50/p99 latency (one query a
 *     call);
 *   - optionally the same defaults on the CPU (--cpu-queries N first queries, all threads).
 * Queries: [Q, L, d] .npy (float32 or float16). Prints a table; JSON with --json.
 *
 *   bench/bench_search_gpu INDEX --queries Q.npy [--nq N] [--json FILE] [--truth-out RUN]
 *        [--targets 0.9,0.99] [--ncells 1,2,4] [--ndocs 256,1024,4096] [--thresholds T] [--reps N]
 *        [--mode auto|resident|streaming] [--cpu-queries N] [--batch N] [--runs-out RUN]
 * --residual-tiles 2|4: the residual kernel's tiles in flight (kernels/tune_cuda.h; default
 * automatic), to compare the exact stage's variants on one index.
 * --runs-out: every setting's top 10 (first batched pass) in one TREC file, tagged
 * tartan-gpu-nc<ncells>-th<threshold>-nd<ndocs>.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "gpu.h"
#include "gpus.h"
#include "npy.h"
#include "tartan.h"
#include "trec_run.h"
#include "tune_cuda.h"

typedef struct bench {
    tartan_db *db;
    tool_npy q;
    size_t nq, qlen, dim, elsize;
    tartan_dtype dtype;
    char (*truth)[10][64]; /* [nq] exhaustive top 10 ids */
    size_t *ntruth;
} bench;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static tartan_results *run(bench *b, size_t q0, size_t n, const tartan_search_params *p)
{
    tartan_queries q = {
        .n_queries = n,
        .qlen = b->qlen,
        .n_rows = n * b->qlen,
        .dim = b->dim,
        .dtype = b->dtype,
        .embeddings = (const char *)b->q.data + q0 * b->qlen * b->dim * b->elsize,
    };
    tartan_results *r = NULL;
    if (tartan_search(b->db, &q, p, &r)) {
        fprintf(stderr, "bench_search_gpu: %s\n", tartan_errmsg(b->db));
        exit(1);
    }
    return r;
}

static double recall10(const bench *b, const tartan_results *r, size_t q0)
{
    double sum = 0;
    for (size_t i = 0; i < r->n_queries; i++) {
        size_t qi = q0 + i, hit = 0, want = b->ntruth[qi];
        for (size_t j = 0; j < r->counts[i] && j < 10; j++)
            for (size_t t = 0; t < want; t++)
                if (!strcmp(r->hits[r->offsets[i] + j].id, b->truth[qi][t])) {
                    hit++;
                    break;
                }
        sum += want ? (double)hit / (double)want : 1.0;
    }
    return sum;
}

typedef struct measure {
    double recall, qps, p50, p99, mean, cand, exact, margin;
    double ms_cand, ms_prune, ms_exact; /* one query a call: stage times (tartan_search_stats) */
} measure;

/* Query i's hits as TREC lines tagged tag (the batched pass's results). */
static void write_run(FILE *f, const tartan_results *r, size_t q0, const char *tag)
{
    for (size_t i = 0; i < r->n_queries; i++) {
        const char *ids[10];
        double sc[10];
        size_t n = r->counts[i] < 10 ? r->counts[i] : 10;
        for (size_t j = 0; j < n; j++) {
            ids[j] = r->hits[r->offsets[i] + j].id;
            sc[j] = r->hits[r->offsets[i] + j].score;
        }
        char qid[32];
        snprintf(qid, sizeof qid, "%zu", q0 + i);
        tool_run_write(f, qid, ids, sc, n, tag);
    }
}

/* Batched (every query in calls of `batch`, best of reps) and one query a call; the first
 * batched pass's top 10 go to runs (if not NULL) tagged tag. */
static measure measure_params(bench *b, const tartan_search_params *p, int reps, size_t batch,
                              FILE *runs, const char *tag)
{
    measure m = {0};
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now(), rec = 0;
        for (size_t q0 = 0; q0 < b->nq; q0 += batch) {
            size_t n = b->nq - q0 < batch ? b->nq - q0 : batch;
            tartan_results *r = run(b, q0, n, p);
            rec += recall10(b, r, q0);
            if (runs && rep == 0)
                write_run(runs, r, q0, tag);
            tartan_results_free(r);
        }
        double qps = (double)b->nq / (now() - t0);
        if (qps > m.qps)
            m.qps = qps;
        m.recall = rec / (double)b->nq;
    }
    double *lat = malloc(b->nq * sizeof *lat);
    for (size_t i = 0; i < b->nq; i++) {
        double t0 = now();
        tartan_results *r = run(b, i, 1, p);
        lat[i] = 1e3 * (now() - t0);
        m.mean += lat[i];
        m.cand += (double)r->stats.n_candidates;
        m.exact += (double)r->stats.n_exact;
        m.margin = r->stats.probe_margin;
        m.ms_cand += 1e3 * r->stats.seconds_candidates;
        m.ms_prune += 1e3 * r->stats.seconds_prune;
        m.ms_exact += 1e3 * r->stats.seconds_exact;
        tartan_results_free(r);
    }
    qsort(lat, b->nq, sizeof *lat, cmp_double);
    m.p50 = lat[b->nq / 2];
    m.p99 = lat[(size_t)((double)(b->nq - 1) * 0.99)];
    m.mean /= (double)b->nq;
    m.cand /= (double)b->nq;
    m.exact /= (double)b->nq;
    m.ms_cand /= (double)b->nq;
    m.ms_prune /= (double)b->nq;
    m.ms_exact /= (double)b->nq;
    free(lat);
    return m;
}

static size_t parse_list(const char *s, double *v, size_t cap)
{
    size_t n = 0;
    while (s && *s && n < cap) {
        char *end;
        v[n++] = strtod(s, &end);
        if (end == s)
            return 0;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_search_gpu INDEX --queries Q.npy [--nq N] [--json FILE]\n"
                    "       [--truth-out RUN] [--targets LIST] [--ncells LIST] [--ndocs LIST]\n"
                    "       [--thresholds LIST] [--dat FILE]\n"
                    "       [--reps N] [--mode auto|resident|streaming] [--cpu-queries N]\n"
                    "       [--batch N] [--runs-out RUN] [--residual-tiles 2|4]\n"
                    "       [--residual-pipe 1|2] [--residual-ctas 3|4] [--residual-sched 1|2]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *index = NULL, *qpath = NULL, *json = NULL, *truth_out = NULL, *runs_out = NULL;
    const char *dat = NULL;
    const char *ncells_s = "1,2,4", *ndocs_s = "256,1024,4096", *thr_s = NULL, *mode_s = "auto";
    const char *targets_s = "0.9,0.99";
    size_t nq = 0, cpu_q = 0, batch = 1000;
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            index = a;
            continue;
        }
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--queries"))
            qpath = v;
        else if (!strcmp(a, "--nq"))
            nq = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--json"))
            json = v;
        else if (!strcmp(a, "--dat"))
            dat = v;
        else if (!strcmp(a, "--truth-out"))
            truth_out = v;
        else if (!strcmp(a, "--runs-out"))
            runs_out = v;
        else if (!strcmp(a, "--ncells"))
            ncells_s = v;
        else if (!strcmp(a, "--targets"))
            targets_s = v;
        else if (!strcmp(a, "--ndocs"))
            ndocs_s = v;
        else if (!strcmp(a, "--thresholds"))
            thr_s = v;
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--mode"))
            mode_s = v;
        else if (!strcmp(a, "--cpu-queries"))
            cpu_q = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--batch"))
            batch = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--residual-tiles"))
            kern_gpu_tune.residual_tiles = atoi(v);
        else if (!strcmp(a, "--residual-pipe")) /* 1 pipelined (default), 2 not */
            kern_gpu_tune.residual_pipe = atoi(v);
        else if (!strcmp(a, "--residual-ctas")) /* 3 (default) or 4 */
            kern_gpu_tune.residual_ctas = atoi(v);
        else if (!strcmp(a, "--residual-sched")) /* 1 claimed (default), 2 grid stride */
            kern_gpu_tune.residual_sched = atoi(v);
        else
            usage();
    }
    if (!index || !qpath || reps < 1 || batch < 1)
        usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench b = {0};
    char err[1024];
    if (tool_npy_open(&b.q, qpath, TOOL_DT(TOOL_F32) | TOOL_DT(TOOL_F16), 3, 3, err, sizeof err)) {
        fprintf(stderr, "bench_search_gpu: %s\n", err);
        return 1;
    }
    b.nq = nq && nq < b.q.shape[0] ? nq : b.q.shape[0];
    b.qlen = b.q.shape[1];
    b.dim = b.q.shape[2];
    b.dtype = b.q.dtype == TOOL_F32 ? TARTAN_FLOAT32 : TARTAN_FLOAT16;
    b.elsize = tool_dtype_size(b.q.dtype);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    o.device = TARTAN_DEVICE_CUDA;
    o.gpu_mode = !strcmp(mode_s, "resident")    ? TARTAN_GPU_RESIDENT
                 : !strcmp(mode_s, "streaming") ? TARTAN_GPU_STREAMING
                                                : TARTAN_GPU_AUTO;
    if (tartan_open(index, &o, &b.db)) {
        fprintf(stderr, "bench_search_gpu: %s\n", tartan_errmsg(NULL));
        return 1;
    }
    tartan_index_info info;
    tartan_info(b.db, &info);
    printf("index %s: %llu documents, %llu tokens, dim %u, nbits %u, %u centroids\n", index,
           (unsigned long long)info.n_docs, (unsigned long long)info.n_tokens, info.dim, info.nbits,
           info.n_centroids);
    printf("queries %s: %zu, %zu tokens each\n", qpath, b.nq, b.qlen);

    /* Loading: the first search of the handle. */
    tartan_search_params p10;
    tartan_search_params_init(&p10, 10);
    double t0 = now();
    tartan_results_free(run(&b, 0, 1, &p10));
    double t_load = now() - t0;
    tartan_gpu_mode mode;
    size_t dev_bytes;
    eng_gpus_describe(b.db, &mode, &dev_bytes); /* one GPU or every partition */
    printf("mirror: %s, %.2f GB on the GPU, loaded in %.2f s\n",
           mode == TARTAN_GPU_RESIDENT ? "resident" : "streaming", dev_bytes / 1e9, t_load);

    /* Exhaustive reference (batches of 64 queries), timed. */
    b.truth = calloc(b.nq, sizeof *b.truth);
    b.ntruth = calloc(b.nq, sizeof *b.ntruth);
    tartan_search_params pe;
    tartan_search_params_init(&pe, 10);
    pe.exhaustive = 1;
    FILE *tf = truth_out ? fopen(truth_out, "w") : NULL;
    t0 = now();
    for (size_t q0 = 0; q0 < b.nq; q0 += 64) {
        size_t n = b.nq - q0 < 64 ? b.nq - q0 : 64;
        tartan_results *r = run(&b, q0, n, &pe);
        for (size_t i = 0; i < n; i++) {
            const char *ids[10];
            double sc[10];
            b.ntruth[q0 + i] = r->counts[i];
            for (size_t j = 0; j < r->counts[i]; j++) {
                snprintf(b.truth[q0 + i][j], 64, "%s", r->hits[r->offsets[i] + j].id);
                ids[j] = r->hits[r->offsets[i] + j].id;
                sc[j] = r->hits[r->offsets[i] + j].score;
            }
            if (tf) {
                char qid[32];
                snprintf(qid, sizeof qid, "%zu", q0 + i);
                tool_run_write(tf, qid, ids, sc, r->counts[i], "tartan-exhaustive-gpu");
            }
        }
        tartan_results_free(r);
    }
    double t_exh = now() - t0;
    if (tf)
        fclose(tf);
    /* One query a call, a few queries. */
    size_t n1 = b.nq < 20 ? b.nq : 20;
    t0 = now();
    for (size_t i = 0; i < n1; i++)
        tartan_results_free(run(&b, i, 1, &pe));
    double t_exh1 = (now() - t0) / (double)n1;
    printf("exhaustive on the GPU: %.2f ms a query in batches of 64, %.2f ms one query a call\n\n",
           1e3 * t_exh / (double)b.nq, 1e3 * t_exh1);

    double nc_v[16], nd_v[16], th_v[16], tg_v[16];
    size_t n_nc = parse_list(ncells_s, nc_v, 16), n_nd = parse_list(ndocs_s, nd_v, 16);
    size_t n_th = thr_s ? parse_list(thr_s, th_v, 16) : 1;
    size_t n_tg = *targets_s ? parse_list(targets_s, tg_v, 16) : 0;
    if (!thr_s)
        th_v[0] = 0.5; /* ColBERT's for k <= 10 */
    if (!n_nc || !n_nd || !n_th || (*targets_s && !n_tg))
        usage();
    size_t nset = 1 + n_tg + n_nc * n_nd * n_th;
    tartan_search_params *set = calloc(nset, sizeof *set);
    measure *res = calloc(nset, sizeof *res);
    set[0] = p10;
    size_t s0 = 1;
    for (size_t t = 0; t < n_tg; t++, s0++) {
        set[s0] = p10;
        set[s0].recall_target = (float)tg_v[t];
    }
    for (size_t t = 0, s = s0; t < n_th; t++)
        for (size_t i = 0; i < n_nc; i++)
            for (size_t j = 0; j < n_nd; j++, s++) {
                set[s] = p10;
                set[s].ncells = (size_t)nc_v[i];
                set[s].ndocs = (size_t)nd_v[j];
                set[s].centroid_score_threshold = (float)th_v[t];
            }
    printf("%-9s %6s %6s %6s %6s %9s %10s %8s %8s %8s %10s %7s\n", "search", "target", "ncells",
           "thresh", "ndocs", "recall@10", "queries/s", "p50 ms", "p99 ms", "mean ms", "candidates",
           "exact");
    FILE *rf = runs_out ? fopen(runs_out, "w") : NULL;
    for (size_t s = 0; s < nset; s++) {
        char tag[96];
        const char *kind = s == 0 ? "defaults" : set[s].ndocs ? "fixed" : "adaptive";
        float tg = set[s].recall_target > 0 ? set[s].recall_target : 0.95f;
        if (set[s].ndocs)
            snprintf(tag, sizeof tag, "tartan-gpu-nc%zu-th%.2f-nd%zu", set[s].ncells,
                     (double)set[s].centroid_score_threshold, set[s].ndocs);
        else
            snprintf(tag, sizeof tag, "tartan-gpu-adaptive-%.3f", (double)tg);
        res[s] = measure_params(&b, &set[s], reps, batch, rf, tag);
        printf("%-9s %6.3f %6zu %6.2f %6zu %9.4f %10.0f %8.3f %8.3f %8.3f %10.0f %7.0f\n", kind,
               set[s].ndocs ? 0.0 : (double)tg, set[s].ncells,
               (double)set[s].centroid_score_threshold, set[s].ndocs, res[s].recall, res[s].qps,
               res[s].p50, res[s].p99, res[s].mean, res[s].cand, res[s].exact);
        printf(
            "          one query a call, ms in stages: candidates %.3f, prune %.3f, exact %.3f\n",
            res[s].ms_cand, res[s].ms_prune, res[s].ms_exact);
    }
    if (rf)
        fclose(rf);
    double cpu_qps = 0, cpu_recall = 0;
    if (cpu_q) {
        size_t n = cpu_q < b.nq ? cpu_q : b.nq;
        tartan_search_params pc = p10;
        pc.device = TARTAN_DEVICE_CPU;
        t0 = now();
        tartan_results *r = run(&b, 0, n, &pc);
        cpu_qps = (double)n / (now() - t0);
        cpu_recall = recall10(&b, r, 0) / (double)n;
        tartan_results_free(r);
        printf("\nCPU, defaults, all threads, %zu queries in one call: %.1f queries/s, recall@10 "
               "%.4f\n",
               n, cpu_qps, cpu_recall);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "bench_search_gpu: %s: %s\n", json, strerror(errno));
            return 1;
        }
        fprintf(f,
                "{\n  \"bench\": \"search_gpu\",\n  \"index\": {\"path\": \"%s\", \"n_docs\": "
                "%llu, \"n_tokens\": %llu, \"dim\": %u, \"nbits\": %u, \"n_centroids\": %u},\n",
                index, (unsigned long long)info.n_docs, (unsigned long long)info.n_tokens, info.dim,
                info.nbits, info.n_centroids);
        fprintf(f,
                "  \"queries\": %zu, \"query_tokens\": %zu, \"batch\": %zu,\n  \"mirror\": "
                "{\"mode\": \"%s\", \"gpu_bytes\": %zu, \"load_seconds\": %.3f},\n",
                b.nq, b.qlen, batch, mode == TARTAN_GPU_RESIDENT ? "resident" : "streaming",
                dev_bytes, t_load);
        fprintf(f, "  \"exhaustive\": {\"ms_per_query_batched\": %.4f, \"ms_one_query\": %.4f},\n",
                1e3 * t_exh / (double)b.nq, 1e3 * t_exh1);
        if (cpu_q)
            fprintf(f, "  \"cpu_defaults\": {\"qps_all_threads\": %.2f, \"recall_at_10\": %.5f},\n",
                    cpu_qps, cpu_recall);
        fprintf(f, "  \"runs\": [\n");
        for (size_t s = 0; s < nset; s++)
            fprintf(f,
                    "    {\"defaults\": %s, \"k\": 10, \"recall_target\": %.3f, "
                    "\"probe_margin\": %.5f, \"ncells\": %zu, \"threshold\": %.3f, "
                    "\"ndocs\": %zu, \"recall_at_10\": %.5f, \"qps_batched\": %.1f, "
                    "\"latency_ms\": {\"p50\": %.4f, \"p99\": %.4f, \"mean\": %.4f}, "
                    "\"candidates\": %.1f, \"exact\": %.1f, \"stage_ms\": {\"candidates\": "
                    "%.4f, \"prune\": %.4f, \"exact\": %.4f}}%s\n",
                    s ? "false" : "true",
                    set[s].ndocs               ? 0.0
                    : set[s].recall_target > 0 ? (double)set[s].recall_target
                                               : 0.95,
                    res[s].margin, set[s].ncells, (double)set[s].centroid_score_threshold,
                    set[s].ndocs, res[s].recall, res[s].qps, res[s].p50, res[s].p99, res[s].mean,
                    res[s].cand, res[s].exact, res[s].ms_cand, res[s].ms_prune, res[s].ms_exact,
                    s + 1 < nset ? "," : "");
        fprintf(f, "  ]\n}\n");
        fclose(f);
        printf("wrote %s\n", json);
    }
    if (dat) {
        /* bench/plot_search.gp's columns, one block per curve: the defaults and adaptive
         * targets, then one per (threshold, ncells) of the fixed grid; queries/s batched. */
        FILE *f = fopen(dat, "w");
        if (!f) {
            fprintf(stderr, "bench_search_gpu: %s: %s\n", dat, strerror(errno));
            return 1;
        }
        fprintf(f, "# recall_at_10 qps_batched p50_ms target ncells threshold ndocs\n");
        for (size_t s = 0; s < nset; s++) {
            if (s == s0 || (s > s0 && (set[s].ncells != set[s - 1].ncells ||
                                       set[s].centroid_score_threshold !=
                                           set[s - 1].centroid_score_threshold)))
                fprintf(f, "\n\n");
            double tg = set[s].ndocs               ? 0.0
                        : set[s].recall_target > 0 ? (double)set[s].recall_target
                                                   : 0.95;
            fprintf(f, "%.5f %.1f %.4f %.3f %zu %.3f %zu\n", res[s].recall, res[s].qps, res[s].p50,
                    tg, set[s].ncells, (double)set[s].centroid_score_threshold, set[s].ndocs);
        }
        fclose(f);
        printf("wrote %s\n", dat);
    }
    free(set);
    free(res);
    free(b.truth);
    free(b.ntruth);
    tartan_close(b.db);
    tool_npy_close(&b.q);
    return 0;
}
