/*
 * cmd_search.c: `tartan search INDEX --queries Q.npy [--qlens L.npy] -k K ...`: searches an
 * index for every query of a .npy file and writes the results as a TREC run (what `tartan
 * eval` and trec_eval read) or as JSON lines.
 *
 * Queries come as ColBERT writes them, [Nq, Lq, d] (every query Lq tokens, or the first
 * qlens[i] of them when --qlens is given: padded queries), or packed [Tq, d] with --qlens
 * giving each query's tokens. The query file stays memory-mapped and is searched --batch
 * queries at a time, so memory is bounded by two batches' results, not by the number of
 * queries.
 *
 * A writer thread writes each batch's results while the next batch is searched, and where the
 * search runs on a GPU two threads search, so that one prepares its queries and names its
 * hits while the other's call holds the GPU (search_loop). Why: the work outside the GPU
 * (reading queries, writing lines, turning document numbers into ids) took about a fifth of
 * the time at 2M documents on an H200, time in which the GPUs idled and which two GPUs
 * sharing each batch could not divide. Results and their order are unchanged.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "commands.h"
#include "errbuf.h"
#include "idlist.h"
#include "ingest.h"
#include "jsonl.h"
#include "npy.h"
#include "progress.h"
#include "queryfile.h"
#include "search_io.h"
#include "search_run.h"
#include "tartan.h"
#include "textfile.h"
#include "trec_run.h"

/* Queries per tartan_search call: enough for every core to have many queries (the library
 * spreads a batch's queries over threads) while the results held at once stay small. */
#define DEFAULT_BATCH 256

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tartan search INDEX --queries Q.npy [--qlens L.npy] [-k K]\n"
            "                     [--exhaustive] [--subset IDS] [--ncells N]\n"
            "                     [--threshold T] [--ndocs N] [--recall R]\n"
            "                     [--format trec|jsonl]\n"
            "                     [--query-ids FILE] [--tag NAME] [--batch N]\n"
            "                     [--threads N] [--device D] [--skip-damaged]\n"
            "                     [-o FILE] [--quiet]\n\n"
            "Searches INDEX for the best K documents of each query and writes one line per\n"
            "result as a TREC run (qid Q0 docid rank score tag), or one JSON object per\n"
            "query with --format jsonl.\n\n"
            "Queries (float32, float16, or bfloat16 stored as uint16):\n"
            "  Q.npy [Nq, Lq, d]   Nq queries of Lq tokens each; with --qlens, query i uses\n"
            "                      its first qlens[i] tokens (padding left out)\n"
            "  Q.npy [Tq, d]       packed queries, one after another; --qlens required\n"
            "  --qlens L.npy       tokens per query, [Nq] int32 or int64\n"
            "  --query-ids FILE    query ids, one a line (or a BEIR queries .jsonl file,\n"
            "                      by its \"_id\"s, in order); default \"0\" .. \"Nq-1\"\n\n"
            "Search (by default every stage adapts to the index and the query: probing by\n"
            "the index's calibration, exact scoring until the rest cannot reach the top K;\n"
            "ColBERT's PLAID for K <= 10 is --ncells 1 --threshold 0.5 --ndocs 256):\n"
            "  -k, --k K           results per query (default 10)\n"
            "  --recall R          share of the exhaustive top K to aim for, 0 < R < 1\n"
            "                      (default 0.95; higher is slower)\n"
            "  --ncells N          probe exactly each query token's best N centroids\n"
            "  --threshold T       centroid score below which pruning ignores a centroid\n"
            "  --ndocs N           keep N documents by centroid interaction, then N / 4 for\n"
            "                      exact scoring (PLAID's fixed stages)\n"
            "  --exhaustive        score every document exactly (slow; the reference)\n"
            "  --subset IDS        only return documents whose ids IDS lists (one a line)\n\n"
            "Output and running:\n"
            "  --format F          trec (default) or jsonl\n"
            "  --tag NAME          the run's tag, TREC's last column (default tartan)\n"
            "  -o, --output FILE   write there (put in place only when the search succeeds);\n"
            "                      default standard output\n"
            "  --batch N           queries per search call (default %d)\n"
            "  --threads N         threads (default: OpenMP's, all cores)\n"
            "  --device D          auto (default: the TARTAN_DEVICE variable, else a GPU\n"
            "                      when present), cpu or cuda\n"
            "  --skip-damaged      leave documents whose stored record is damaged out of the\n"
            "                      search (with a warning) instead of failing; CPU only\n"
            "  -q, --quiet         no summary on standard error\n",
            DEFAULT_BATCH);
}

enum {
    OPT_QUERIES = 256,
    OPT_QLENS,
    OPT_EXHAUSTIVE,
    OPT_SUBSET,
    OPT_NCELLS,
    OPT_THRESHOLD,
    OPT_NDOCS,
    OPT_FORMAT,
    OPT_QUERY_IDS,
    OPT_TAG,
    OPT_BATCH,
    OPT_THREADS,
    OPT_DEVICE,
    OPT_RECALL,
    OPT_SKIP_DAMAGED
};

static int parse_num(const char *opt, const char *arg, size_t *v)
{
    if (tool_parse_size(arg, v)) {
        fprintf(stderr, "tartan search: --%s wants a whole number, not '%s'\n", opt, arg);
        return -1;
    }
    return 0;
}

/*
 * Says which query of the file a failed batch stumbled on. The library numbers queries within
 * the batch; searching them one at a time (validation comes before any index read, so this
 * is cheap) finds the row of the file and its id.
 */
static void report_failure(const tool_search_backend *be, const tool_qfile *s,
                           const tartan_search_params *p, size_t q0, size_t q1, char *buf,
                           size_t *qlens, char **ids)
{
    for (size_t i = q0; i < q1; i++) {
        tartan_queries one;
        tartan_results *r;
        tool_qfile_batch(s, i, i + 1, buf, qlens, &one);
        if (be->search(be->ctx, &one, p, &r) == 0) {
            tartan_results_free(r);
            continue;
        }
        const char *m = be->errmsg(be->ctx);
        const char *name_end = strstr(m, ": ");
        const char *detail = name_end ? name_end + 2 : m;
        if (!strncmp(detail, "query 0: ", 9))
            detail += 9;
        fprintf(stderr, "tartan search: %.*s: %s: query %zu", (int)(name_end ? name_end - m : 0), m,
                s->path, i);
        if (ids)
            fprintf(stderr, " (id '%s')", ids[i]);
        fprintf(stderr, ": %s\n", detail);
        return;
    }
    fprintf(stderr, "tartan search: %s (queries %zu to %zu of %s)\n", be->errmsg(be->ctx), q0,
            q1 - 1, s->path);
}

/* ncells and ndocs of 0 would mean "the default" below: refuse them rather than ignore them. */
static int at_least_one(const char *opt, size_t v)
{
    if (v == 0)
        fprintf(stderr, "tartan search: --%s must be at least 1\n", opt);
    return v == 0;
}

/* ---- the local backend: one index in this process ---------------------------------------- */

typedef struct local_index {
    tartan_db *db;
} local_index;

static int local_open(void *ctx, const char *path, tartan_index_info *info)
{
    local_index *l = ctx;
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    int rc = tartan_open(path, &o, &l->db);
    return rc ? rc : tartan_info(l->db, info);
}

static int local_search(void *ctx, const tartan_queries *q, const tartan_search_params *p,
                        tartan_results **r)
{
    return tartan_search(((local_index *)ctx)->db, q, p, r);
}

static const char *local_errmsg(void *ctx)
{
    return tartan_errmsg(((local_index *)ctx)->db);
}

static void local_close(void *ctx)
{
    local_index *l = ctx;
    tartan_close(l->db);
    l->db = NULL;
}

int tool_cmd_search(int argc, char **argv)
{
    local_index l = {NULL};
    tool_search_backend be = {local_open, local_search, local_errmsg, local_close, &l, 1, NULL};
    return tool_search_run(argc, argv, &be);
}

/* The writer thread: one batch's results at a time, handed over by the searching thread. */
typedef struct writer {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, quit;
    tartan_results *res; /* the batch to write; NULL when idle */
    size_t q0;           /* its first query */
    /* What it writes with. */
    FILE *out;
    int jsonl;
    const tool_idlist *qids;
    const char *tag;
    const char **docids;
    double *scores;
    /* What it found: hits, queries without any, the first write error (0 if none). */
    size_t n_hits, empty;
    int rc;
} writer;

static int write_batch(writer *w, const tartan_results *res, size_t q0)
{
    char qid_buf[32];
    for (size_t i = 0; i < res->n_queries; i++) {
        const char *qid = w->qids->n ? w->qids->ids[q0 + i] : qid_buf;
        if (!w->qids->n)
            snprintf(qid_buf, sizeof qid_buf, "%zu", q0 + i);
        const tartan_hit *h = res->hits + res->offsets[i];
        size_t n = res->counts[i];
        w->n_hits += n;
        w->empty += n == 0;
        if (w->jsonl) {
            tool_jsonl_write_hits(w->out, qid, h, n);
            continue;
        }
        for (size_t j = 0; j < n; j++) {
            w->docids[j] = h[j].id;
            w->scores[j] = h[j].score;
        }
        int rc = tool_run_write(w->out, qid, w->docids, w->scores, n, w->tag);
        if (rc)
            return rc;
    }
    return ferror(w->out) ? EIO : 0;
}

static void *writer_main(void *arg)
{
    writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->res && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->res)
            break; /* told to quit, nothing left */
        tartan_results *res = w->res;
        size_t q0 = w->q0;
        int failed = w->rc;
        pthread_mutex_unlock(&w->mu);
        int rc = failed ? 0 : write_batch(w, res, q0);
        tartan_results_free(res);
        pthread_mutex_lock(&w->mu);
        if (rc && !w->rc)
            w->rc = rc;
        w->res = NULL;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Waits until the writer has written what it was given; its first error, or 0. */
static int writer_wait(writer *w)
{
    if (!w->started)
        return w->rc;
    pthread_mutex_lock(&w->mu);
    while (w->res)
        pthread_cond_wait(&w->cv, &w->mu);
    int rc = w->rc;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* Hands res over (the writer frees it) once the previous batch is written; without a thread
 * (none could start), writes it here. Returns the first write error so far, or 0. */
static int writer_give(writer *w, tartan_results *res, size_t q0)
{
    int rc = writer_wait(w);
    if (!w->started) {
        if (!rc)
            rc = w->rc = write_batch(w, res, q0);
        tartan_results_free(res);
        return rc;
    }
    if (rc) {
        tartan_results_free(res);
        return rc;
    }
    pthread_mutex_lock(&w->mu);
    w->res = res;
    w->q0 = q0;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

static void writer_start(writer *w)
{
    w->started = !pthread_mutex_init(&w->mu, NULL) && !pthread_cond_init(&w->cv, NULL) &&
                 !pthread_create(&w->th, NULL, writer_main, w);
}

/* Every batch written (or the first error), the thread gone; returns that error, or 0. */
static int writer_stop(writer *w)
{
    int rc = writer_wait(w);
    if (!w->started)
        return rc;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    w->started = 0;
    return w->rc;
}

static void report_write_error(const char *out_path, int rc)
{
    fprintf(stderr, "tartan search: %s: writing the run: %s\n",
            out_path ? out_path : "standard output", tartan_strerror(rc));
}

/*
 * The search loop: batches claimed in order by one or two searching threads, their results
 * handed to the writer in order. Two on a GPU: while one call holds the GPU, the other
 * prepares its queries and turns its hits into ids (about a fifth of a call's time at 2M
 * documents on an H200: the GPUs' idle time that two GPUs sharing each batch could not
 * divide). One on the CPU, whose search already takes every core, and over MPI, whose calls
 * are collective.
 */
typedef struct search_loop {
    const tool_search_backend *be;
    const tartan_search_params *p;
    const tool_qfile *src;
    const tool_idlist *qids;
    const char *out_path;
    writer *wr;
    tool_progress *prog;
    size_t bq, maxlen, limit; /* batch size; longest query; batches that may be claimed */
    int quiet;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t next_batch, next_give, released;
    int stop, rc; /* a failure stops everyone; rc is the first one's code */
    tartan_search_stats total;
    double lib_s, st_c, st_p, st_e, t_first; /* after the first batch (see below) */
} search_loop;

/* Stops the loop with rc (the caller holds mu and has reported the failure). */
static void loop_fail(search_loop *L, int rc)
{
    if (!L->stop) {
        L->stop = 1;
        L->rc = rc;
    }
    pthread_cond_broadcast(&L->cv);
}

static void *search_batches(void *arg)
{
    search_loop *L = arg;
    const tool_qfile *src = L->src;
    const size_t nb = (src->nq + L->bq - 1) / L->bq;
    char *buf = NULL;
    size_t *blens = malloc(L->bq * sizeof *blens);
    if (blens && src->have_lens && !src->start)
        buf = malloc(L->bq * L->maxlen * src->dim * src->elsize);
    if (!blens || (src->have_lens && !src->start && !buf)) {
        pthread_mutex_lock(&L->mu);
        if (!L->stop)
            fprintf(stderr, "tartan search: out of memory\n");
        loop_fail(L, ENOMEM);
        pthread_mutex_unlock(&L->mu);
        free(blens);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&L->mu);
        if (L->stop || L->next_batch >= nb || L->next_batch >= L->limit) {
            pthread_mutex_unlock(&L->mu);
            break;
        }
        const size_t b = L->next_batch++;
        pthread_mutex_unlock(&L->mu);
        const size_t q0 = b * L->bq, q1 = q0 + L->bq < src->nq ? q0 + L->bq : src->nq;
        tartan_queries q;
        tool_qfile_batch(src, q0, q1, buf, blens, &q);
        tartan_results *res = NULL;
        int rc = L->be->search(L->be->ctx, &q, L->p, &res);
        pthread_mutex_lock(&L->mu);
        /* Results go out in batch order. */
        while (!L->stop && L->next_give != b)
            pthread_cond_wait(&L->cv, &L->mu);
        if (L->stop) {
            pthread_mutex_unlock(&L->mu);
            tartan_results_free(res);
            break;
        }
        if (rc) {
            if (!L->quiet && L->prog->tty)
                fputc('\n', stderr);
            report_failure(L->be, src, L->p, q0, q1, buf, blens, L->qids->n ? L->qids->ids : NULL);
            loop_fail(L, rc);
            pthread_mutex_unlock(&L->mu);
            break;
        }
        const tartan_search_stats *st = &res->stats;
        if (b > 0) {
            L->lib_s += st->seconds_total;
            L->st_c += st->seconds_candidates;
            L->st_p += st->seconds_prune;
            L->st_e += st->seconds_exact;
        }
        L->total.seconds_candidates += st->seconds_candidates;
        L->total.seconds_prune += st->seconds_prune;
        L->total.seconds_exact += st->seconds_exact;
        L->total.n_candidates += st->n_candidates;
        L->total.n_exact += st->n_exact;
        L->total.n_probes += st->n_probes;
        L->total.probe_margin = st->probe_margin;
        L->total.rerank_z = st->rerank_z;
        L->total.n_damaged += st->n_damaged;
        /* This batch's queries are done with (the other thread's are later ones). */
        tool_qfile_release(src, q1, &L->released);
        if ((rc = writer_give(L->wr, res, q0))) {
            report_write_error(L->out_path, rc);
            loop_fail(L, rc);
            pthread_mutex_unlock(&L->mu);
            break;
        }
        L->next_give++;
        if (!L->quiet)
            tool_progress_update(L->prog, q1);
        if (b == 0)
            L->t_first = tool_now();
        pthread_cond_broadcast(&L->cv);
        pthread_mutex_unlock(&L->mu);
    }
    free(buf);
    free(blens);
    return NULL;
}

/* Searches every batch: the first alone (it also loads what a search keeps: a GPU's copy of
 * the index), the rest by `threads` searching threads (1 or 2). Returns the first failure's
 * code (already reported), or 0. */
static int search_all(search_loop *L, int threads)
{
    if (pthread_mutex_init(&L->mu, NULL) || pthread_cond_init(&L->cv, NULL)) {
        fprintf(stderr, "tartan search: could not set up the search threads\n");
        return ENOMEM;
    }
    L->limit = 1;
    search_batches(L);
    L->limit = SIZE_MAX;
    pthread_t th;
    int second = threads > 1 && !L->stop && pthread_create(&th, NULL, search_batches, L) == 0;
    search_batches(L);
    if (second)
        pthread_join(th, NULL);
    pthread_cond_destroy(&L->cv);
    pthread_mutex_destroy(&L->mu);
    return L->rc;
}

int tool_search_run(int argc, char **argv, const tool_search_backend *be)
{
    static const struct option opts[] = {
        {"queries", required_argument, NULL, OPT_QUERIES},
        {"qlens", required_argument, NULL, OPT_QLENS},
        {"k", required_argument, NULL, 'k'},
        {"exhaustive", no_argument, NULL, OPT_EXHAUSTIVE},
        {"subset", required_argument, NULL, OPT_SUBSET},
        {"ncells", required_argument, NULL, OPT_NCELLS},
        {"threshold", required_argument, NULL, OPT_THRESHOLD},
        {"ndocs", required_argument, NULL, OPT_NDOCS},
        {"format", required_argument, NULL, OPT_FORMAT},
        {"query-ids", required_argument, NULL, OPT_QUERY_IDS},
        {"tag", required_argument, NULL, OPT_TAG},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"device", required_argument, NULL, OPT_DEVICE},
        {"recall", required_argument, NULL, OPT_RECALL},
        {"skip-damaged", no_argument, NULL, OPT_SKIP_DAMAGED},
        {"output", required_argument, NULL, 'o'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *qpath = NULL, *lpath = NULL, *subset_path = NULL, *qids_path = NULL;
    const char *out_path = NULL, *tag = "tartan";
    size_t k = 10, ncells = 0, ndocs = 0, batch = DEFAULT_BATCH, threads = 0;
    tartan_device device = TARTAN_DEVICE_AUTO;
    int exhaustive = 0, jsonl = 0, quiet = 0, have_threshold = 0, skip_damaged = 0;
    double threshold = 0, recall = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "hk:o:q", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case OPT_QUERIES:
            qpath = optarg;
            break;
        case OPT_QLENS:
            lpath = optarg;
            break;
        case 'k':
            bad = parse_num("k", optarg, &k);
            break;
        case OPT_EXHAUSTIVE:
            exhaustive = 1;
            break;
        case OPT_SKIP_DAMAGED:
            skip_damaged = 1;
            break;
        case OPT_SUBSET:
            subset_path = optarg;
            break;
        case OPT_NCELLS:
            bad = parse_num("ncells", optarg, &ncells) || at_least_one("ncells", ncells);
            break;
        case OPT_THRESHOLD: {
            char *end;
            errno = 0;
            threshold = strtod(optarg, &end);
            if (errno || end == optarg || *end || !isfinite(threshold)) {
                fprintf(stderr, "tartan search: --threshold wants a finite number, not '%s'\n",
                        optarg);
                bad = 1;
            }
            have_threshold = 1;
            break;
        }
        case OPT_NDOCS:
            bad = parse_num("ndocs", optarg, &ndocs) || at_least_one("ndocs", ndocs);
            break;
        case OPT_RECALL: {
            char *end;
            errno = 0;
            recall = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(recall > 0 && recall < 1)) {
                fprintf(stderr,
                        "tartan search: --recall wants a number above 0 and below 1, "
                        "not '%s'\n",
                        optarg);
                bad = 1;
            }
            break;
        }
        case OPT_FORMAT:
            if (!strcmp(optarg, "trec")) {
                jsonl = 0;
            } else if (!strcmp(optarg, "jsonl")) {
                jsonl = 1;
            } else {
                fprintf(stderr, "tartan search: --format is trec or jsonl, not '%s'\n", optarg);
                bad = 1;
            }
            break;
        case OPT_QUERY_IDS:
            qids_path = optarg;
            break;
        case OPT_TAG:
            tag = optarg;
            break;
        case OPT_BATCH:
            bad = parse_num("batch", optarg, &batch);
            break;
        case OPT_THREADS:
            bad = parse_num("threads", optarg, &threads);
            break;
        case OPT_DEVICE:
            if (tool_parse_device(optarg, &device)) {
                fprintf(stderr, "tartan search: --device is auto, cpu or cuda, not '%s'\n", optarg);
                bad = 1;
            }
            break;
        case 'o':
            out_path = optarg;
            break;
        case 'q':
            quiet = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (bad)
            return 2;
    }
    if (optind != argc - 1 || !qpath) {
        fprintf(stderr, optind < argc - 1 ? "tartan search: one INDEX only\n"
                        : !qpath          ? "tartan search: --queries is required\n"
                                          : "tartan search: INDEX is required\n");
        usage(stderr);
        return 2;
    }
    if (k < 1 || k > TARTAN_MAX_K) {
        fprintf(stderr, "tartan search: -k must be 1 to %zu\n", (size_t)TARTAN_MAX_K);
        return 2;
    }
    if (batch < 1 || batch > ((size_t)1 << 20)) {
        fprintf(stderr, "tartan search: --batch must be 1 to %zu\n", (size_t)1 << 20);
        return 2;
    }
    if (threads > 4096) {
        fprintf(stderr, "tartan search: --threads must be 0 (all) to 4096\n");
        return 2;
    }
    if (!*tag || strpbrk(tag, " \t\r\n")) {
        fprintf(stderr, "tartan search: --tag must be a word without whitespace\n");
        return 2;
    }
    tartan_search_params p;
    tartan_search_params_init(&p, k);
    if (ncells)
        p.ncells = ncells;
    if (ndocs)
        p.ndocs = ndocs;
    if (have_threshold)
        p.centroid_score_threshold = (float)threshold;
    p.recall_target = (float)recall;
    p.exhaustive = exhaustive;
    p.threads = (int)threads;
    p.device = device;
    p.skip_damaged = skip_damaged;

    const char *index = argv[optind];
    char err[1400];
    int rc, status = 1;
    tool_qfile src;
    tool_idlist qids = {0};
    tool_textfile subset_file = {0};
    char **subset = NULL;
    size_t n_subset = 0;
    FILE *out = stdout;
    char *tmp_path = NULL;
    double *scores = NULL;
    const char **docids = NULL;
    writer wr = {0};

    if ((rc = tool_qfile_open(&src, qpath, lpath, err, sizeof err))) {
        fprintf(stderr, "tartan search: %s: %s\n", tartan_err_name(rc), err);
        goto done;
    }
    if (qids_path) {
        size_t l = strlen(qids_path);
        rc = l > 6 && !strcmp(qids_path + l - 6, ".jsonl")
                 ? tool_jsonl_ids(&qids, qids_path, err, sizeof err)
                 : tool_idlist_read(&qids, qids_path, err, sizeof err);
        if (rc) {
            fprintf(stderr, "tartan search: %s: %s\n", tartan_err_name(rc), err);
            goto done;
        }
        if (qids.n != src.nq) {
            fprintf(stderr, "tartan search: %s has %zu query ids but %s holds %zu queries\n",
                    qids_path, qids.n, qpath, src.nq);
            goto done;
        }
    }
    if (subset_path) {
        if ((rc = tool_subset_read(subset_path, &subset_file, &subset, &n_subset, err,
                                   sizeof err))) {
            fprintf(stderr, "tartan search: %s: %s\n", tartan_err_name(rc), err);
            goto done;
        }
        if (n_subset == 0 && !quiet)
            fprintf(stderr, "tartan search: %s lists no ids: every query gets no results\n",
                    subset_path);
        /* An empty list still means "nothing allowed", never "no filter". */
        static const char *const none[1] = {NULL};
        p.subset = n_subset ? (const char *const *)subset : none;
        p.n_subset = n_subset;
    }

    tartan_index_info info;
    if ((rc = be->open(be->ctx, index, &info))) {
        fprintf(stderr, "tartan search: %s\n", be->errmsg(be->ctx));
        goto done;
    }
    if (info.dim != src.dim) {
        fprintf(stderr, "tartan search: TARTAN_EDIM: %s has dimension %zu but index %s has %u\n",
                qpath, src.dim, index, info.dim);
        goto done;
    }

    if (out_path && strcmp(out_path, "-")) {
        size_t l = strlen(out_path);
        if (!(tmp_path = malloc(l + 16)))
            goto nomem;
        snprintf(tmp_path, l + 16, "%s.tmp", out_path);
        if (!(out = fopen(tmp_path, "w"))) {
            fprintf(stderr, "tartan search: %s: %s\n", tmp_path, strerror(errno));
            out = stdout;
            free(tmp_path);
            tmp_path = NULL;
            goto done;
        }
    }
    size_t maxlen = 0;
    for (size_t i = 0; i < src.nq; i++)
        if (src.qlen[i] > maxlen)
            maxlen = src.qlen[i];
    size_t bq = batch < src.nq ? batch : src.nq;
    if (!(scores = malloc(k * sizeof *scores)) || !(docids = malloc(k * sizeof *docids)))
        goto nomem;

    tool_progress prog;
    tool_progress_start(&prog, "queries", src.nq);
    wr.out = out;
    wr.jsonl = jsonl;
    wr.qids = &qids;
    wr.tag = tag;
    wr.docids = docids;
    wr.scores = scores;
    writer_start(&wr);
    /* Two batches in flight where the search runs on a GPU (see search_loop);
     * TARTAN_SEARCH_INFLIGHT (1 or 2) decides instead, for tests and benchmarks. */
    tartan_device where = TARTAN_DEVICE_CPU;
    int searchers = be->concurrent && tartan_device_resolve(p.device, &where) == 0 &&
                            where == TARTAN_DEVICE_CUDA
                        ? 2
                        : 1;
    const char *inflight = getenv("TARTAN_SEARCH_INFLIGHT");
    if (inflight && (!strcmp(inflight, "1") || !strcmp(inflight, "2")))
        searchers = be->concurrent ? inflight[0] - '0' : 1;
    if (be->inflight)
        be->inflight(be->ctx, searchers);
    search_loop L = {.be = be,
                     .p = &p,
                     .src = &src,
                     .qids = &qids,
                     .out_path = out_path,
                     .wr = &wr,
                     .prog = &prog,
                     .bq = bq,
                     .maxlen = maxlen,
                     .quiet = quiet};
    double t0 = tool_now();
    if ((rc = search_all(&L, searchers)))
        goto done;
    /* After the first batch: seconds inside the library, and its stages summed over threads. */
    const double t_first = L.t_first, lib_s = L.lib_s, st_c = L.st_c, st_p = L.st_p, st_e = L.st_e;
    const tartan_search_stats total = L.total;
    if ((rc = writer_stop(&wr))) {
        report_write_error(out_path, rc);
        goto done;
    }
    const size_t n_hits = wr.n_hits, empty = wr.empty;
    double t_end = tool_now(), el = t_end - t0;
    if (!quiet)
        tool_progress_end(&prog, src.nq);
    if (fflush(out) != 0 || ferror(out)) {
        fprintf(stderr, "tartan search: %s: %s\n", out_path ? out_path : "standard output",
                strerror(errno));
        goto done;
    }
    if (tmp_path) {
        FILE *f = out;
        out = stdout;
        if (fclose(f) != 0 || rename(tmp_path, out_path) != 0) {
            fprintf(stderr, "tartan search: %s: %s\n", out_path, strerror(errno));
            goto done;
        }
        free(tmp_path);
        tmp_path = NULL;
    }
    /* Damage left out is a warning whatever --quiet says: the results may lack documents. */
    if (total.n_damaged)
        fprintf(stderr,
                "tartan search: warning: %llu damaged record%s left out of the search "
                "(--skip-damaged); 'tartan check --repair %s' salvages the index\n",
                (unsigned long long)total.n_damaged, total.n_damaged == 1 ? "" : "s", index);
    if (!quiet) {
        fprintf(stderr, "searched %zu queries in %.2f s (%.1f queries/s, %s, k %zu", src.nq, el,
                el > 0 ? (double)src.nq / el : 0.0, exhaustive ? "exhaustive" : "PLAID", k);
        if (!exhaustive && p.ncells)
            fprintf(stderr, ", ncells %zu", p.ncells);
        else if (!exhaustive)
            fprintf(stderr, ", probe margin %.4f", (double)total.probe_margin);
        if (!exhaustive && p.centroid_score_threshold > -1.f)
            fprintf(stderr, ", threshold %g", (double)p.centroid_score_threshold);
        if (!exhaustive && p.ndocs)
            fprintf(stderr, ", ndocs %zu", p.ndocs);
        else if (!exhaustive)
            fprintf(stderr, ", recall target %.3g (z %.2f)", recall > 0 ? recall : 0.95,
                    (double)total.rerank_z);
        fprintf(stderr, "): %zu results", n_hits);
        if (empty)
            fprintf(stderr, ", %zu queries without any", empty);
        fprintf(stderr, "; %.1f probes, %.1f candidates and %.1f exact scores a query\n",
                (double)total.n_probes / (double)src.nq,
                (double)total.n_candidates / (double)src.nq,
                (double)total.n_exact / (double)src.nq);
        /* The first batch also opens what the search keeps between calls (a GPU's copy of the
         * index, the centroids' pages): the rate after it is the steady one. */
        if (src.nq > bq && t_end > t_first)
            fprintf(stderr,
                    "after the first batch: %zu queries in %.2f s (%.1f queries/s); %.2f s in "
                    "the search calls, their stages %.2f / %.2f / %.2f s (candidates / "
                    "interaction / exact, summed over threads)\n",
                    src.nq - bq, t_end - t_first, (double)(src.nq - bq) / (t_end - t_first), lib_s,
                    st_c, st_p, st_e);
    }
    status = 0;
    goto done;
nomem:
    fprintf(stderr, "tartan search: out of memory\n");
done:
    writer_stop(&wr);
    if (out != stdout)
        fclose(out);
    if (tmp_path) {
        remove(tmp_path);
        free(tmp_path);
    }
    be->close(be->ctx);
    free(scores);
    free(docids);
    free(subset);
    tool_textfile_free(&subset_file);
    tool_idlist_free(&qids);
    tool_qfile_close(&src);
    return status;
}
