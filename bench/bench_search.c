/*
 * bench_search.c: speed and recall of search on the CPU, through the public API only.
 *
 * On an index and a query file ([Nq, Lq, d], as `tartan gen` writes) it measures:
 *   - the exhaustive top-100 of every query (the reference; cached in --truth as a TREC run,
 *     because on 100k documents it costs seconds a query);
 *   - the default search for k = 10 and k = 100: recall@10 and recall@100 against the
 *     exhaustive top-k, queries/s with one thread and with all threads (one batch of all the
 *     queries), and single-query latency (one call per query) p50 / p99 / mean;
 *   - a sweep, k = 10: the adaptive search at each recall target of --targets, then PLAID's
 *     fixed stages at each ncells x ndocs (threshold --thresholds, default 0.5, ColBERT's):
 *     recall@10, queries/s on one thread (one batch) and single-query latency on one thread,
 *     the recall-vs-speed trade-off.
 * Prints a table, writes JSON (--json) and a whitespace-separated table for gnuplot (--dat).
 *
 *   bench/bench_search INDEX --queries Q.npy [--nq N] [--truth FILE] [--json FILE]
 *                      [--dat FILE] [--targets 0.8,0.9,0.95,0.99] [--ncells 1,2,4,8]
 *                      [--ndocs 256,1024,4096,16384] [--thresholds 0.5] [--reps N]
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "npy.h"
#include "strtab.h"
#include "tartan.h"
#include "trec_run.h"

/* Depth of the reference: recall@100 needs the exhaustive top 100. */
#define TRUTH_K 100

typedef struct bench {
    tartan_db *db;
    tool_npy q;
    size_t nq, qlen, dim;
    tartan_dtype dtype;
    size_t elsize;
    /* The exhaustive top TRUTH_K of query i: ids truth[i][0 .. ntruth[i]-1], best first. */
    char ***truth;
    size_t *ntruth;
} bench;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of sorted v[n] (nearest rank). */
static double quantile(const double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)ceil(q * (double)n);
    return v[i ? i - 1 : 0];
}

static void queries_of(const bench *b, size_t q0, size_t n, tartan_queries *q)
{
    memset(q, 0, sizeof *q);
    q->n_queries = n;
    q->qlen = b->qlen;
    q->n_rows = n * b->qlen;
    q->dim = b->dim;
    q->dtype = b->dtype;
    q->embeddings = (const char *)b->q.data + q0 * b->qlen * b->dim * b->elsize;
}

static int search(bench *b, size_t q0, size_t n, const tartan_search_params *p, tartan_results **r)
{
    tartan_queries q;
    queries_of(b, q0, n, &q);
    int rc = tartan_search(b->db, &q, p, r);
    if (rc) {
        fprintf(stderr, "bench_search: %s\n", tartan_errmsg(b->db));
        exit(1);
    }
    return rc;
}

/* Recall@k of query i's hits against its exhaustive top k. */
static double recall_one(const bench *b, size_t i, const tartan_hit *h, size_t n, size_t k)
{
    size_t nt = b->ntruth[i] < k ? b->ntruth[i] : k;
    if (nt == 0)
        return 1.0;
    size_t found = 0;
    for (size_t t = 0; t < nt; t++)
        for (size_t j = 0; j < n && j < k; j++)
            if (!strcmp(b->truth[i][t], h[j].id)) {
                found++;
                break;
            }
    return (double)found / (double)nt;
}

static double recall(const bench *b, const tartan_results *r, size_t q0, size_t k)
{
    double s = 0;
    for (size_t i = 0; i < r->n_queries; i++)
        s += recall_one(b, q0 + i, r->hits + r->offsets[i], r->counts[i], k);
    return s;
}

static void set_truth(bench *b, size_t i, const char *const *ids, size_t n)
{
    b->ntruth[i] = n;
    b->truth[i] = calloc(n ? n : 1, sizeof(char *));
    for (size_t j = 0; j < n; j++)
        b->truth[i][j] = strdup(ids[j]);
}

/* Reads the reference run written by an earlier run of the benchmark; 0 if it holds every
 * query. */
static int truth_read(bench *b, const char *path)
{
    tool_run run = {0};
    char err[1024];
    if (tool_run_read(&run, path, err, sizeof err))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < b->nq && !rc; i++) {
        char qid[32];
        snprintf(qid, sizeof qid, "%zu", i);
        long qn = tool_strtab_find(&run.qids, qid, strlen(qid));
        if (qn < 0) {
            rc = -1;
            break;
        }
        const tool_run_query *rq = &run.q[qn];
        const char *ids[TRUTH_K];
        size_t n = rq->n < TRUTH_K ? rq->n : TRUTH_K;
        /* Written best first, so file order is rank order. */
        for (size_t j = 0; j < n; j++)
            ids[j] = run.docids.keys[rq->d[j].doc];
        set_truth(b, i, ids, n);
    }
    tool_run_free(&run);
    return rc;
}

/* Computes the reference with all threads; writes it to path (if any). Returns seconds. */
static double truth_compute(bench *b, const char *path)
{
    tartan_search_params p;
    tartan_search_params_init(&p, TRUTH_K);
    p.exhaustive = 1;
    FILE *f = NULL;
    char tmp[4096];
    if (path) {
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        f = fopen(tmp, "w");
    }
    double t = 0;
    /* Small batches, so that progress shows on a slow machine. */
    size_t step = 16;
    for (size_t q0 = 0; q0 < b->nq; q0 += step) {
        size_t n = q0 + step < b->nq ? step : b->nq - q0;
        tartan_results *r;
        double t0 = now();
        search(b, q0, n, &p, &r);
        t += now() - t0;
        for (size_t i = 0; i < n; i++) {
            const tartan_hit *h = r->hits + r->offsets[i];
            const char *ids[TRUTH_K];
            double sc[TRUTH_K];
            for (size_t j = 0; j < r->counts[i]; j++) {
                ids[j] = h[j].id;
                sc[j] = h[j].score;
            }
            set_truth(b, q0 + i, ids, r->counts[i]);
            if (f) {
                char qid[32];
                snprintf(qid, sizeof qid, "%zu", q0 + i);
                tool_run_write(f, qid, ids, sc, r->counts[i], "exhaustive");
            }
        }
        tartan_results_free(r);
        fprintf(stderr, "\rexhaustive reference: %zu/%zu queries, %.1f s", q0 + n, b->nq, t);
    }
    fputc('\n', stderr);
    if (f && fclose(f) == 0)
        rename(tmp, path);
    return t;
}

typedef struct measure {
    double qps1;           /* queries/s, one thread, one batch (sweep only) */
    double recall;         /* mean recall@k against the exhaustive top k */
    double p50, p99, mean; /* single-query latency, ms */
    double cand, exact;    /* documents per query through stage 2 and stage 4 */
} measure;

/* One call per query on `threads` threads: latency and recall. */
static measure per_query(bench *b, const tartan_search_params *p0, int threads)
{
    tartan_search_params p = *p0;
    p.threads = threads;
    double *lat = malloc(b->nq * sizeof *lat);
    measure m = {0};
    for (size_t i = 0; i < b->nq; i++) {
        tartan_results *r;
        double t0 = now();
        search(b, i, 1, &p, &r);
        lat[i] = 1e3 * (now() - t0);
        m.recall += recall(b, r, i, p.k);
        m.cand += (double)r->stats.n_candidates;
        m.exact += (double)r->stats.n_exact;
        m.mean += lat[i];
        tartan_results_free(r);
    }
    qsort(lat, b->nq, sizeof *lat, cmp_double);
    m.p50 = quantile(lat, b->nq, 0.50);
    m.p99 = quantile(lat, b->nq, 0.99);
    m.mean /= (double)b->nq;
    m.recall /= (double)b->nq;
    m.cand /= (double)b->nq;
    m.exact /= (double)b->nq;
    free(lat);
    return m;
}

/* Queries/s of one batch of every query on `threads` threads: the best of reps runs (the
 * machine is shared; the best run is the least disturbed). */
static double throughput(bench *b, const tartan_search_params *p0, int threads, int reps)
{
    tartan_search_params p = *p0;
    p.threads = threads;
    double best = 0;
    for (int rep = 0; rep < reps; rep++) {
        tartan_results *r;
        double t0 = now();
        search(b, 0, b->nq, &p, &r);
        double qps = (double)b->nq / (now() - t0);
        tartan_results_free(r);
        if (qps > best)
            best = qps;
    }
    return best;
}

static size_t parse_list(const char *s, double *v, size_t cap)
{
    size_t n = 0;
    while (*s && n < cap) {
        char *end;
        v[n++] = strtod(s, &end);
        if (end == s)
            return 0;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return 0;
    }
    return n;
}

static void cpu_model(char *out, size_t len)
{
    snprintf(out, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 1 + (c[1] == ' ');
                c[strcspn(c, "\n")] = 0;
                snprintf(out, len, "%s", c);
            }
            break;
        }
    fclose(f);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_search INDEX --queries Q.npy [--nq N] [--truth FILE] [--json FILE]\n"
            "                    [--dat FILE] [--targets LIST] [--ncells LIST] [--ndocs LIST]\n"
            "                    [--thresholds LIST] [--reps N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *index = NULL, *qpath = NULL, *truth_path = NULL;
    const char *json = "bench_search.json", *dat = NULL;
    const char *ncells_s = "1,2,4,8", *ndocs_s = "256,1024,4096,16384", *thr_s = NULL;
    const char *targets_s = "0.8,0.9,0.95,0.99";
    size_t nq = 0;
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (index)
                usage();
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
        else if (!strcmp(a, "--truth"))
            truth_path = v;
        else if (!strcmp(a, "--json"))
            json = v;
        else if (!strcmp(a, "--dat"))
            dat = v;
        else if (!strcmp(a, "--ncells"))
            ncells_s = v;
        else if (!strcmp(a, "--ndocs"))
            ndocs_s = v;
        else if (!strcmp(a, "--thresholds"))
            thr_s = v;
        else if (!strcmp(a, "--targets"))
            targets_s = v;
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else
            usage();
    }
    if (!index || !qpath || reps < 1)
        usage();

    /* Line by line even into a file or pipe: progress shows while a long run goes on. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench b = {0};
    char err[1024];
    if (tool_npy_open(&b.q, qpath, TOOL_DT(TOOL_F32) | TOOL_DT(TOOL_F16), 3, 3, err, sizeof err)) {
        fprintf(stderr, "bench_search: %s\n", err);
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
    if (tartan_open(index, &o, &b.db)) {
        fprintf(stderr, "bench_search: %s\n", tartan_errmsg(NULL));
        return 1;
    }
    tartan_index_info info;
    tartan_info(b.db, &info);
    if (info.dim != b.dim) {
        fprintf(stderr, "bench_search: %s has dimension %zu, the index %u\n", qpath, b.dim,
                info.dim);
        return 1;
    }
    double ncells_v[16], ndocs_v[16], thr_v[16], tg_v[16];
    size_t n_nc = parse_list(ncells_s, ncells_v, 16), n_nd = parse_list(ndocs_s, ndocs_v, 16);
    size_t n_tg = parse_list(targets_s, tg_v, 16);
    tartan_search_params d10, d100;
    tartan_search_params_init(&d10, 10);
    tartan_search_params_init(&d100, 100);
    size_t n_thr = thr_s ? parse_list(thr_s, thr_v, 16) : 1;
    if (!thr_s)
        thr_v[0] = 0.5; /* ColBERT's for k <= 10 */
    if (!n_nc || !n_nd || !n_thr)
        usage();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    char cpu[256];
    cpu_model(cpu, sizeof cpu);

    printf("index %s: %llu documents, %llu tokens, dim %u, nbits %u, %u centroids\n", index,
           (unsigned long long)info.n_docs, (unsigned long long)info.n_tokens, info.dim, info.nbits,
           info.n_centroids);
    printf("queries %s: %zu of %zu, %zu tokens each; %s, %ld cores\n\n", qpath, b.nq, b.q.shape[0],
           b.qlen, cpu, ncpu);

    /* The reference. */
    b.truth = calloc(b.nq, sizeof *b.truth);
    b.ntruth = calloc(b.nq, sizeof *b.ntruth);
    double t_exh = -1;
    if (!truth_path || truth_read(&b, truth_path)) {
        for (size_t i = 0; i < b.nq; i++) {
            for (size_t j = 0; j < b.ntruth[i]; j++)
                free(b.truth[i][j]);
            free(b.truth[i]);
            b.ntruth[i] = 0;
        }
        t_exh = truth_compute(&b, truth_path);
    }
    if (t_exh >= 0)
        printf("exhaustive top-%d: %.1f s for %zu queries, %.2f queries/s on %ld threads\n\n",
               TRUTH_K, t_exh, b.nq, (double)b.nq / t_exh, ncpu);
    else
        printf("exhaustive top-%d: read from %s\n\n", TRUTH_K, truth_path);

    /* Warm-up: pages the index's map in, so that the first measurement is not the disk's. */
    throughput(&b, &d100, 0, 1);

    /* Defaults. */
    struct {
        const char *name;
        tartan_search_params *p;
        measure m1, mall;
        double qps1, qpsall;
    } def[2];
    memset(def, 0, sizeof def);
    def[0].name = "default k=10";
    def[0].p = &d10;
    def[1].name = "default k=100";
    def[1].p = &d100;
    printf("%-14s %6s %6s %6s %8s %9s %9s %8s %8s %8s %10s %8s\n", "search", "ncells", "thresh",
           "ndocs", "recall", "qps 1thr", "qps all", "p50 ms", "p99 ms", "mean ms", "candidates",
           "exact");
    for (int i = 0; i < 2; i++) {
        def[i].qps1 = throughput(&b, def[i].p, 1, reps);
        def[i].qpsall = throughput(&b, def[i].p, 0, reps);
        def[i].m1 = per_query(&b, def[i].p, 1);
        def[i].mall = per_query(&b, def[i].p, 0);
        const tartan_search_params *p = def[i].p;
        printf("%-14s %6zu %6.2f %6zu %8.4f %9.1f %9.1f %8.2f %8.2f %8.2f %10.0f %8.0f\n",
               def[i].name, p->ncells, (double)p->centroid_score_threshold, p->ndocs,
               def[i].m1.recall, def[i].qps1, def[i].qpsall, def[i].m1.p50, def[i].m1.p99,
               def[i].m1.mean, def[i].m1.cand, def[i].m1.exact);
    }
    printf("(recall@k against the exhaustive top k; latency: one query a call, one thread;\n"
           " all threads: p50 %.2f / %.2f ms)\n\n",
           def[0].mall.p50, def[1].mall.p50);

    /* Sweep: adaptive targets, then the fixed grid. */
    size_t nsw = n_tg + n_nc * n_nd * n_thr;
    struct sweep {
        size_t ncells, ndocs;
        double thr, target;
        measure m;
    } *sw = calloc(nsw, sizeof *sw);
    printf("sweep, k=10, one thread (queries/s: one batch; latency: one query a call):\n");
    printf("%6s %6s %6s %6s %10s %9s %8s %8s %8s %10s %8s\n", "target", "ncells", "thresh", "ndocs",
           "recall@10", "qps 1thr", "p50 ms", "p99 ms", "mean ms", "candidates", "exact");
    for (size_t s = 0; s < nsw; s++) {
        tartan_search_params p = d10;
        if (s < n_tg) {
            p.recall_target = (float)tg_v[s];
            sw[s].target = tg_v[s];
        } else {
            size_t g = s - n_tg, t = g / (n_nc * n_nd), i = g / n_nd % n_nc, j = g % n_nd;
            p.ncells = (size_t)ncells_v[i];
            p.ndocs = (size_t)ndocs_v[j];
            p.centroid_score_threshold = (float)thr_v[t];
            sw[s].thr = thr_v[t];
        }
        sw[s].ncells = p.ncells;
        sw[s].ndocs = p.ndocs;
        sw[s].m = per_query(&b, &p, 1);
        sw[s].m.qps1 = throughput(&b, &p, 1, reps);
        printf("%6.3f %6zu %6.2f %6zu %10.4f %9.1f %8.2f %8.2f %8.2f %10.0f %8.0f\n", sw[s].target,
               p.ncells, sw[s].thr, p.ndocs, sw[s].m.recall, sw[s].m.qps1, sw[s].m.p50, sw[s].m.p99,
               sw[s].m.mean, sw[s].m.cand, sw[s].m.exact);
        fflush(stdout);
    }

    FILE *f = fopen(json, "w");
    if (!f) {
        fprintf(stderr, "bench_search: %s: %s\n", json, strerror(errno));
        return 1;
    }
    fprintf(f, "{\n  \"bench\": \"search_cpu\",\n  \"cpu\": \"%s\",\n  \"cores\": %ld,\n", cpu,
            ncpu);
    fprintf(f,
            "  \"index\": {\"path\": \"%s\", \"n_docs\": %llu, \"n_tokens\": %llu, \"dim\": %u, "
            "\"nbits\": %u, \"n_centroids\": %u},\n",
            index, (unsigned long long)info.n_docs, (unsigned long long)info.n_tokens, info.dim,
            info.nbits, info.n_centroids);
    fprintf(f, "  \"queries\": %zu,\n  \"query_tokens\": %zu,\n", b.nq, b.qlen);
    if (t_exh >= 0)
        fprintf(f, "  \"exhaustive\": {\"k\": %d, \"seconds\": %.3f, \"qps_all_threads\": %.3f},\n",
                TRUTH_K, t_exh, (double)b.nq / t_exh);
    for (int i = 0; i < 2; i++) {
        const tartan_search_params *p = def[i].p;
        fprintf(f,
                "  \"default_k%zu\": {\"k\": %zu, \"ncells\": %zu, \"threshold\": %.3f, "
                "\"ndocs\": %zu, \"recall\": %.5f, \"qps_1_thread\": %.2f, "
                "\"qps_all_threads\": %.2f, \"latency_ms_1_thread\": {\"p50\": %.3f, "
                "\"p99\": %.3f, \"mean\": %.3f}, \"latency_ms_all_threads\": {\"p50\": %.3f, "
                "\"p99\": %.3f, \"mean\": %.3f}, \"candidates\": %.1f, \"exact\": %.1f},\n",
                p->k, p->k, p->ncells, (double)p->centroid_score_threshold, p->ndocs,
                def[i].m1.recall, def[i].qps1, def[i].qpsall, def[i].m1.p50, def[i].m1.p99,
                def[i].m1.mean, def[i].mall.p50, def[i].mall.p99, def[i].mall.mean, def[i].m1.cand,
                def[i].m1.exact);
    }
    fprintf(f, "  \"sweep\": [\n");
    for (size_t i = 0; i < nsw; i++)
        fprintf(f,
                "    {\"k\": 10, \"recall_target\": %.3f, \"ncells\": %zu, \"threshold\": %.3f, "
                "\"ndocs\": %zu, \"recall_at_10\": %.5f, \"qps_1_thread\": %.2f, "
                "\"latency_ms\": {\"p50\": %.3f, \"p99\": %.3f, \"mean\": %.3f}, "
                "\"candidates\": %.1f, \"exact\": %.1f}%s\n",
                sw[i].target, sw[i].ncells, sw[i].thr, sw[i].ndocs, sw[i].m.recall, sw[i].m.qps1,
                sw[i].m.p50, sw[i].m.p99, sw[i].m.mean, sw[i].m.cand, sw[i].m.exact,
                i + 1 < nsw ? "," : "");
    fprintf(f, "  ]\n}\n");
    fclose(f);
    printf("\nwrote %s\n", json);
    if (dat) {
        if (!(f = fopen(dat, "w"))) {
            fprintf(stderr, "bench_search: %s: %s\n", dat, strerror(errno));
            return 1;
        }
        /* One block (two blank lines apart) per curve: the adaptive targets, then one per
         * (threshold, ncells) of the fixed grid. Columns: recall_at_10 qps_1_thread p50_ms
         * target ncells threshold ndocs. bench/plot_search.gp draws them. */
        fprintf(f, "# recall_at_10 qps_1_thread p50_ms target ncells threshold ndocs\n");
        for (size_t i = 0; i < nsw; i++) {
            if (i && (i == n_tg || (i > n_tg && (sw[i].ncells != sw[i - 1].ncells ||
                                                 sw[i].thr != sw[i - 1].thr))))
                fprintf(f, "\n\n");
            fprintf(f, "%.5f %.2f %.3f %.3f %zu %.3f %zu\n", sw[i].m.recall, sw[i].m.qps1,
                    sw[i].m.p50, sw[i].target, sw[i].ncells, sw[i].thr, sw[i].ndocs);
        }
        fclose(f);
        printf("wrote %s\n", dat);
    }
    free(sw);
    tartan_close(b.db);
    tool_npy_close(&b.q);
    return 0;
}
