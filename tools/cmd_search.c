/*
 * cmd_search.c: `tartan search INDEX --queries Q.npy [--qlens L.npy] -k K ...`: searches an
 * index for every query of a .npy file and writes the results as a TREC run (what `tartan
 * eval` and trec_eval read) or as JSON lines.
 *
 * Queries come as ColBERT writes them, [Nq, Lq, d] (every query Lq tokens, or the first
 * qlens[i] of them when --qlens is given: padded queries), or packed [Tq, d] with --qlens
 * giving each query's tokens. The query file stays memory-mapped and is searched --batch
 * queries at a time, each batch's results written before the next starts, so memory is
 * bounded by the batch, not by the number of queries.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
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
            "                     [--threshold T] [--ndocs N] [--format trec|jsonl]\n"
            "                     [--query-ids FILE] [--tag NAME] [--batch N]\n"
            "                     [--threads N] [--device D] [-o FILE] [--quiet]\n\n"
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
            "Search (defaults by K, ColBERT's: K <= 10: 1, 0.5, 256; K <= 100: 2, 0.45,\n"
            "1024; else 4, 0.4, max(4K, 4096)):\n"
            "  -k, --k K           results per query (default 10)\n"
            "  --ncells N          centroids each query token probes\n"
            "  --threshold T       centroid score below which pruning ignores a centroid\n"
            "  --ndocs N           documents kept by centroid interaction\n"
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
    OPT_DEVICE
};

/* The queries of the file, however they are laid out. */
typedef struct query_source {
    tool_npy emb;
    tool_npy lens;
    int have_lens;
    size_t nq; /* queries */
    size_t dim;
    size_t stride; /* [Nq, Lq, d]: Lq; packed: 0 */
    size_t *start; /* packed: first row of query i ([nq + 1]); else NULL */
    size_t *qlen;  /* tokens of query i ([nq]) */
    size_t elsize;
    tartan_dtype dtype;
    const char *path, *lens_path;
} query_source;

static void source_close(query_source *s)
{
    tool_npy_close(&s->emb);
    tool_npy_close(&s->lens);
    free(s->start);
    free(s->qlen);
}

static int source_open(query_source *s, const char *path, const char *lens_path, char *err,
                       size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    s->lens_path = lens_path;
    int rc = tool_npy_open(&s->emb, path, TOOL_DT_FLOATS, 2, 3, err, errlen);
    if (rc)
        return rc;
    s->dtype = s->emb.dtype == TOOL_F32   ? TARTAN_FLOAT32
               : s->emb.dtype == TOOL_F16 ? TARTAN_FLOAT16
                                          : TARTAN_BFLOAT16;
    s->elsize = tool_dtype_size(s->emb.dtype);
    s->dim = s->emb.shape[s->emb.rank - 1];
    if (s->emb.rank == 3) {
        s->nq = s->emb.shape[0];
        s->stride = s->emb.shape[1];
    } else if (!lens_path) {
        return tool_fail(err, errlen, TARTAN_EINVAL,
                         "%s: packed queries [%zu, %zu] need --qlens (tokens per query); "
                         "fixed-length queries are [queries, tokens, dim]",
                         path, s->emb.shape[0], s->emb.shape[1]);
    }
    if (s->dim == 0)
        return tool_fail(err, errlen, TARTAN_EDIM, "%s: dimension 0", path);
    if (lens_path) {
        if ((rc = tool_npy_open(&s->lens, lens_path, TOOL_DT_INTS, 1, 1, err, errlen)))
            return rc;
        s->have_lens = 1;
        size_t n = s->lens.shape[0];
        if (s->emb.rank == 3 && n != s->nq)
            return tool_fail(err, errlen, TARTAN_EFORMAT,
                             "%s has %zu lengths but %s holds %zu queries", lens_path, n, path,
                             s->nq);
        s->nq = n;
    }
    if (s->nq == 0)
        return tool_fail(err, errlen, TARTAN_EEMPTY, "%s: no queries", path);
    if (!(s->qlen = malloc(s->nq * sizeof *s->qlen)))
        return tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
    if (!s->have_lens) {
        if (s->stride == 0)
            return tool_fail(err, errlen, TARTAN_EEMPTY, "%s: queries of 0 tokens", path);
        for (size_t i = 0; i < s->nq; i++)
            s->qlen[i] = s->stride;
        return 0;
    }
    if (s->emb.rank == 2 && !(s->start = malloc((s->nq + 1) * sizeof *s->start)))
        return tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
    size_t total = 0;
    for (size_t i = 0; i < s->nq; i++) {
        int64_t v = s->lens.dtype == TOOL_I32 ? ((const int32_t *)s->lens.data)[i]
                                              : ((const int64_t *)s->lens.data)[i];
        if (v < 1)
            return tool_fail(err, errlen, TARTAN_EEMPTY,
                             "%s: query %zu has length %lld (at least 1 token)", lens_path, i,
                             (long long)v);
        if (s->emb.rank == 3 && (uint64_t)v > s->stride)
            return tool_fail(err, errlen, TARTAN_EFORMAT,
                             "%s: query %zu has length %lld but %s holds %zu tokens a query",
                             lens_path, i, (long long)v, path, s->stride);
        if (s->emb.rank == 2 && (uint64_t)v > s->emb.shape[0] - total)
            return tool_fail(err, errlen, TARTAN_ETRUNC,
                             "%s: the lengths sum to more than the %zu rows of %s (query %zu)",
                             lens_path, s->emb.shape[0], path, i);
        s->qlen[i] = (size_t)v;
        if (s->start)
            s->start[i] = total;
        total += (size_t)v;
    }
    if (s->start) {
        s->start[s->nq] = total;
        if (total != s->emb.shape[0])
            return tool_fail(err, errlen, TARTAN_EFORMAT,
                             "%s: the lengths sum to %zu but %s has %zu rows", lens_path, total,
                             path, s->emb.shape[0]);
    }
    return 0;
}

/*
 * Describes queries [q0, q1) as a tartan_queries. Fixed-length and packed queries point
 * straight into the file's mapping; padded ones (rank 3 with lengths) are gathered into buf.
 */
static void source_batch(const query_source *s, size_t q0, size_t q1, char *buf, size_t *qlens,
                         tartan_queries *q)
{
    size_t row = s->dim * s->elsize;
    memset(q, 0, sizeof *q);
    q->n_queries = q1 - q0;
    q->dim = s->dim;
    q->dtype = s->dtype;
    const char *data = s->emb.data;
    if (!s->have_lens) {
        q->qlen = s->stride;
        q->n_rows = (q1 - q0) * s->stride;
        q->embeddings = data + q0 * s->stride * row;
        return;
    }
    size_t rows = 0;
    for (size_t i = q0; i < q1; i++) {
        qlens[i - q0] = s->qlen[i];
        if (!s->start)
            memcpy(buf + rows * row, data + i * s->stride * row, s->qlen[i] * row);
        rows += s->qlen[i];
    }
    q->qlens = qlens;
    q->n_rows = rows;
    q->embeddings = s->start ? data + s->start[q0] * row : buf;
}

/* Gives the mapped pages of queries already searched back to the system, so that a query
 * file larger than memory streams (as tools/ingest.c does for documents). */
static void source_release(const query_source *s, size_t q1, size_t *released)
{
    if (!s->emb.mapped)
        return;
    size_t row = s->dim * s->elsize;
    size_t end = (s->start ? s->start[q1] : q1 * s->stride) * row;
    size_t page = 4096;
    uintptr_t base = (uintptr_t)s->emb.np_base;
    uintptr_t from = ((uintptr_t)s->emb.data + *released + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t to = ((uintptr_t)s->emb.data + end) & ~(uintptr_t)(page - 1);
    if (to > from && from >= base) {
        madvise((void *)from, to - from, MADV_DONTNEED);
        *released = to - (uintptr_t)s->emb.data;
    }
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* One query's results as one JSON line: {"qid": ..., "hits": [{"id":, "rank":, "score":}]}.
 * Scores in 9 significant digits: a float32 reads back exactly. */
static void write_jsonl(FILE *f, const char *qid, const tartan_hit *h, size_t n)
{
    fputs("{\"qid\": ", f);
    json_string(f, qid);
    fputs(", \"hits\": [", f);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ", {\"id\": " : "{\"id\": ", f);
        json_string(f, h[i].id);
        fprintf(f, ", \"rank\": %zu, \"score\": %.9g}", i + 1, (double)h[i].score);
    }
    fputs("]}\n", f);
}

/* Reads --subset: one id a line, blank lines skipped; repeats are harmless (the library
 * takes the union), so unlike tool_idlist_read they are not refused. */
static int read_subset(const char *path, tool_textfile *tf, char ***ids, size_t *n, char *err,
                       size_t errlen)
{
    int rc = tool_textfile_read(tf, path, err, errlen);
    if (rc)
        return rc;
    size_t cap = 0, len;
    char *line;
    *ids = NULL;
    *n = 0;
    while (tool_textfile_next(tf, &line, &len)) {
        if (len == 0)
            continue;
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 1024;
            char **p = realloc(*ids, nc * sizeof *p);
            if (!p)
                return tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
            *ids = p;
            cap = nc;
        }
        (*ids)[(*n)++] = line;
    }
    return 0;
}

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
static void report_failure(tartan_db *db, const query_source *s, const tartan_search_params *p,
                           size_t q0, size_t q1, char *buf, size_t *qlens, char **ids)
{
    for (size_t i = q0; i < q1; i++) {
        tartan_queries one;
        tartan_results *r;
        source_batch(s, i, i + 1, buf, qlens, &one);
        if (tartan_search(db, &one, p, &r) == 0) {
            tartan_results_free(r);
            continue;
        }
        const char *m = tartan_errmsg(db);
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
    fprintf(stderr, "tartan search: %s (queries %zu to %zu of %s)\n", tartan_errmsg(db), q0, q1 - 1,
            s->path);
}

/* ncells and ndocs of 0 would mean "the default" below: refuse them rather than ignore them. */
static int at_least_one(const char *opt, size_t v)
{
    if (v == 0)
        fprintf(stderr, "tartan search: --%s must be at least 1\n", opt);
    return v == 0;
}

int tool_cmd_search(int argc, char **argv)
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
        {"output", required_argument, NULL, 'o'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *qpath = NULL, *lpath = NULL, *subset_path = NULL, *qids_path = NULL;
    const char *out_path = NULL, *tag = "tartan";
    size_t k = 10, ncells = 0, ndocs = 0, batch = DEFAULT_BATCH, threads = 0;
    tartan_device device = TARTAN_DEVICE_AUTO;
    int exhaustive = 0, jsonl = 0, quiet = 0, have_threshold = 0;
    double threshold = 0;
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
                fprintf(stderr, "tartan search: --device is auto, cpu or cuda, not '%s'\n",
                        optarg);
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
    p.exhaustive = exhaustive;
    p.threads = (int)threads;
    p.device = device;

    const char *index = argv[optind];
    char err[1400];
    int rc, status = 1;
    query_source src;
    tool_idlist qids = {0};
    tool_textfile subset_file = {0};
    char **subset = NULL;
    size_t n_subset = 0;
    tartan_db *db = NULL;
    FILE *out = stdout;
    char *tmp_path = NULL;
    char *buf = NULL;
    size_t *blens = NULL;
    double *scores = NULL;
    const char **docids = NULL;
    char qid_buf[32];

    if ((rc = source_open(&src, qpath, lpath, err, sizeof err))) {
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
        if ((rc = read_subset(subset_path, &subset_file, &subset, &n_subset, err, sizeof err))) {
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

    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    if ((rc = tartan_open(index, &o, &db))) {
        fprintf(stderr, "tartan search: %s\n", tartan_errmsg(NULL));
        goto done;
    }
    tartan_index_info info;
    if ((rc = tartan_info(db, &info))) {
        fprintf(stderr, "tartan search: %s\n", tartan_errmsg(db));
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
    if (!(blens = malloc(bq * sizeof *blens)) || !(scores = malloc(k * sizeof *scores)) ||
        !(docids = malloc(k * sizeof *docids)))
        goto nomem;
    if (src.have_lens && !src.start && !(buf = malloc(bq * maxlen * src.dim * src.elsize)))
        goto nomem;

    tool_progress prog;
    tool_progress_start(&prog, "queries", src.nq);
    tartan_search_stats total = {0};
    size_t n_hits = 0, released = 0, empty = 0;
    double t0 = tool_now();
    for (size_t q0 = 0; q0 < src.nq; q0 += bq) {
        size_t q1 = q0 + bq < src.nq ? q0 + bq : src.nq;
        tartan_queries q;
        source_batch(&src, q0, q1, buf, blens, &q);
        tartan_results *res;
        if ((rc = tartan_search(db, &q, &p, &res))) {
            if (!quiet && prog.tty)
                fputc('\n', stderr);
            report_failure(db, &src, &p, q0, q1, buf, blens, qids.n ? qids.ids : NULL);
            goto done;
        }
        for (size_t i = 0; i < res->n_queries; i++) {
            const char *qid = qids.n ? qids.ids[q0 + i] : qid_buf;
            if (!qids.n)
                snprintf(qid_buf, sizeof qid_buf, "%zu", q0 + i);
            const tartan_hit *h = res->hits + res->offsets[i];
            size_t n = res->counts[i];
            n_hits += n;
            empty += n == 0;
            if (jsonl) {
                write_jsonl(out, qid, h, n);
                continue;
            }
            for (size_t j = 0; j < n; j++) {
                docids[j] = h[j].id;
                scores[j] = h[j].score;
            }
            if ((rc = tool_run_write(out, qid, docids, scores, n, tag))) {
                fprintf(stderr, "tartan search: %s: writing the run: %s\n",
                        out_path ? out_path : "standard output", tartan_strerror(rc));
                tartan_results_free(res);
                goto done;
            }
        }
        total.seconds_candidates += res->stats.seconds_candidates;
        total.seconds_prune += res->stats.seconds_prune;
        total.seconds_exact += res->stats.seconds_exact;
        total.n_candidates += res->stats.n_candidates;
        total.n_exact += res->stats.n_exact;
        tartan_results_free(res);
        if (ferror(out)) {
            fprintf(stderr, "tartan search: %s: write error\n",
                    out_path ? out_path : "standard output");
            goto done;
        }
        source_release(&src, q1, &released);
        if (!quiet)
            tool_progress_update(&prog, q1);
    }
    double el = tool_now() - t0;
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
    if (!quiet) {
        fprintf(stderr, "searched %zu queries in %.2f s (%.1f queries/s, %s, k %zu", src.nq, el,
                el > 0 ? (double)src.nq / el : 0.0, exhaustive ? "exhaustive" : "PLAID", k);
        if (!exhaustive)
            fprintf(stderr, ", ncells %zu, threshold %g, ndocs %zu", p.ncells,
                    (double)p.centroid_score_threshold, p.ndocs);
        fprintf(stderr, "): %zu results", n_hits);
        if (empty)
            fprintf(stderr, ", %zu queries without any", empty);
        fprintf(stderr, "; %.1f candidates and %.1f exact scores a query\n",
                (double)total.n_candidates / (double)src.nq,
                (double)total.n_exact / (double)src.nq);
    }
    status = 0;
    goto done;
nomem:
    fprintf(stderr, "tartan search: out of memory\n");
done:
    if (out != stdout)
        fclose(out);
    if (tmp_path) {
        remove(tmp_path);
        free(tmp_path);
    }
    tartan_close(db);
    free(buf);
    free(blens);
    free(scores);
    free(docids);
    free(subset);
    tool_textfile_free(&subset_file);
    tool_idlist_free(&qids);
    source_close(&src);
    return status;
}
