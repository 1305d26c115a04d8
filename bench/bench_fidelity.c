/*
 * bench_fidelity.c: how faithful an index is to the vectors it was built from.
 *
 * On a corpus directory as `tartan gen` writes it (embeddings.npy, doclens.npy, ids.txt,
 * queries.npy [Nq, Lq, d] or packed [Tq, d] with qlens.npy) and an index built from it:
 *   - exact: the top 10 of every query by exact MaxSim over the ORIGINAL vectors (L2-normalised,
 *     fp32 products, fp32 sums as every MaxSim kernel does), cached in --truth as a TREC run;
 *   - exhaustive search through the index (tartan_search, exhaustive): recall@10 against exact,
 *     the codec's fidelity as a search sees it;
 *   - the default search (tartan_search_params_init(k = 10)): recall@10 against exhaustive
 *     (PLAID's pruning) and against exact (the two together);
 *   - per token: the cosine between the decompressed token and the original one (mean, and the
 *     1st percentile), over every live token of the index.
 * Prints one table row and writes JSON (--json, one object a line, appended).
 *
 *   bench/bench_fidelity INDEX CORPUS_DIR [--truth FILE] [--nq N] [--label S] [--json FILE]
 *                        [--threads N]
 *
 * Documents of the index are matched to the corpus's rows by external id (ids.txt, else the
 * row numbers "0" .. "N-1" as `tartan build` names them).
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
#ifdef _OPENMP
#include <omp.h>
#endif

#include "db.h"
#include "ingest.h"
#include "kernels.h"
#include "npy.h"
#include "tartan.h"
#include "trec_run.h"

#define TOPK 10
/* Document tokens per exact-MaxSim call: the score table is nq x documents of the chunk. */
#define CHUNK_TOKENS 65536

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *fmt, const char *a)
{
    fprintf(stderr, "bench_fidelity: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("%s", "out of memory");
    return p;
}

/* Element i of a float array of any of the corpus's dtypes. */
static float elem(const void *p, tool_dtype t, size_t i)
{
    if (t == TOOL_F16)
        return kern_f16_to_f32(((const uint16_t *)p)[i]);
    if (t == TOOL_BF16)
        return kern_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* Rows [r0, r0 + n) of a [*, dim] array as L2-normalised fp32 (norm in double). */
static void load_rows(const void *p, tool_dtype t, size_t dim, size_t r0, size_t n, float *out)
{
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)n; i++) {
        float *o = out + (size_t)i * dim;
        double ss = 0;
        for (size_t j = 0; j < dim; j++) {
            o[j] = elem(p, t, (r0 + (size_t)i) * dim + j);
            ss += (double)o[j] * o[j];
        }
        double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
        for (size_t j = 0; j < dim; j++)
            o[j] = (float)(o[j] * inv);
    }
}

/* A query's top 10: row numbers and scores, best first; ties to the lower row. */
typedef struct top {
    long row[TOPK];
    double score[TOPK];
    size_t n;
} top;

static void top_push(top *t, long row, double s)
{
    if (t->n == TOPK && !(s > t->score[TOPK - 1]))
        return;
    size_t at = t->n < TOPK ? t->n++ : TOPK - 1;
    while (at > 0 && s > t->score[at - 1]) {
        t->row[at] = t->row[at - 1];
        t->score[at] = t->score[at - 1];
        at--;
    }
    t->row[at] = row;
    t->score[at] = s;
}

/* |a ∩ b| / |b| over the top 10 (b the reference). */
static double overlap(const top *a, const top *b)
{
    if (b->n == 0)
        return 1.0;
    size_t f = 0;
    for (size_t i = 0; i < b->n; i++)
        for (size_t j = 0; j < a->n; j++)
            if (a->row[j] == b->row[i]) {
                f++;
                break;
            }
    return (double)f / (double)b->n;
}

typedef struct corpus {
    tool_corpus c;
    size_t *off; /* [n_docs + 1] */
    /* queries, normalised fp32 */
    size_t nq, dim;
    size_t *qoff; /* [nq + 1] */
    float *q;
} corpus;

static long row_of(const corpus *co, const char *id)
{
    if (co->c.have_ids)
        return tool_idlist_find(&co->c.ids, id);
    char *end;
    errno = 0;
    long v = strtol(id, &end, 10);
    if (errno || *end || v < 0 || (size_t)v >= co->c.n_docs)
        return -1;
    return v;
}

static void load_queries(corpus *co, const char *dir, size_t max_nq)
{
    char p[4096], err[1024];
    tool_npy q = {0}, ql = {0};
    snprintf(p, sizeof p, "%s/queries.npy", dir);
    if (tool_npy_open(&q, p, TOOL_DT_FLOATS, 2, 3, err, sizeof err))
        die("%s", err);
    size_t dim = q.shape[q.rank - 1], nq, total;
    co->qoff = NULL;
    if (q.rank == 3) {
        nq = q.shape[0];
        if (max_nq && nq > max_nq)
            nq = max_nq;
        co->qoff = xmalloc((nq + 1) * sizeof *co->qoff);
        for (size_t i = 0; i <= nq; i++)
            co->qoff[i] = i * q.shape[1];
    } else {
        snprintf(p, sizeof p, "%s/qlens.npy", dir);
        if (tool_npy_open(&ql, p, TOOL_DT_INTS, 1, 1, err, sizeof err))
            die("%s", err);
        nq = ql.shape[0];
        if (max_nq && nq > max_nq)
            nq = max_nq;
        co->qoff = xmalloc((nq + 1) * sizeof *co->qoff);
        co->qoff[0] = 0;
        for (size_t i = 0; i < nq; i++)
            co->qoff[i + 1] = co->qoff[i] + (size_t)tool_npy_int(&ql, i);
        tool_npy_close(&ql);
    }
    total = co->qoff[nq];
    if (total > q.count / dim)
        die("%s", "queries.npy has fewer rows than the query lengths say");
    co->q = xmalloc(total * dim * sizeof(float));
    load_rows(q.data, q.dtype, dim, 0, total, co->q);
    co->nq = nq;
    co->dim = dim;
    tool_npy_close(&q);
}

/* Exact top 10 of every query over the original vectors. */
static void exact_compute(const corpus *co, top *ex)
{
    const tool_corpus *c = &co->c;
    size_t dim = co->dim, nq = co->nq;
    int64_t *qo = xmalloc((nq + 1) * sizeof *qo);
    for (size_t i = 0; i <= nq; i++)
        qo[i] = (int64_t)co->qoff[i];
    float *d = xmalloc((CHUNK_TOKENS + 1) * dim * sizeof(float) + 4 * sizeof(float));
    int64_t *doff = NULL;
    float *sc = NULL;
    size_t cap = 0;
    double t0 = now();
    for (size_t d0 = 0; d0 < c->n_docs;) {
        size_t d1 = d0 + 1;
        while (d1 < c->n_docs && co->off[d1 + 1] - co->off[d0] <= CHUNK_TOKENS)
            d1++;
        size_t nd = d1 - d0, ntok = co->off[d1] - co->off[d0];
        if (nd > cap) {
            free(doff);
            free(sc);
            cap = nd;
            doff = xmalloc((nd + 1) * sizeof *doff);
            sc = xmalloc(nq * nd * sizeof *sc);
        }
        float *dd = ntok <= CHUNK_TOKENS ? d : xmalloc(ntok * dim * sizeof(float));
        load_rows(c->emb.data, c->emb.dtype, dim, co->off[d0], ntok, dd);
        for (size_t i = 0; i <= nd; i++)
            doff[i] = (int64_t)(co->off[d0 + i] - co->off[d0]);
        kern_varlen a = {KERN_F32, dim, co->q, qo, nq, dd, doff, nd};
        if (kern_maxsim_varlen(KERN_DEV_CPU, &a, sc))
            die("exact MaxSim: %s", kern_last_error());
        for (size_t qi = 0; qi < nq; qi++)
            for (size_t i = 0; i < nd; i++)
                top_push(&ex[qi], (long)(d0 + i), sc[qi * nd + i]);
        if (dd != d)
            free(dd);
        d0 = d1;
        fprintf(stderr, "\rexact MaxSim: %zu/%zu documents, %.0f s", d0, c->n_docs, now() - t0);
    }
    fputc('\n', stderr);
    free(d);
    free(doff);
    free(sc);
    free(qo);
}

static int truth_read(const corpus *co, const char *path, top *ex)
{
    tool_run run = {0};
    char err[1024];
    if (tool_run_read(&run, path, err, sizeof err))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < co->nq && !rc; i++) {
        char qid[32];
        snprintf(qid, sizeof qid, "%zu", i);
        long qn = tool_strtab_find(&run.qids, qid, strlen(qid));
        if (qn < 0) {
            rc = -1;
            break;
        }
        const tool_run_query *rq = &run.q[qn];
        ex[i].n = 0;
        for (size_t j = 0; j < rq->n && j < TOPK; j++) {
            long row = row_of(co, run.docids.keys[rq->d[j].doc]);
            if (row < 0) {
                rc = -1;
                break;
            }
            ex[i].row[j] = row;
            ex[i].score[j] = rq->d[j].score;
            ex[i].n++;
        }
    }
    tool_run_free(&run);
    return rc;
}

static const char *id_of(const corpus *co, long row, char *buf, size_t len)
{
    if (co->c.have_ids)
        return co->c.ids.ids[row];
    snprintf(buf, len, "%ld", row);
    return buf;
}

static void truth_write(const corpus *co, const char *path, const top *ex)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        die("cannot write %s", tmp);
    for (size_t i = 0; i < co->nq; i++) {
        char qid[32], b[TOPK][32];
        const char *ids[TOPK];
        snprintf(qid, sizeof qid, "%zu", i);
        for (size_t j = 0; j < ex[i].n; j++)
            ids[j] = id_of(co, ex[i].row[j], b[j], sizeof b[j]);
        tool_run_write(f, qid, ids, ex[i].score, ex[i].n, "exact");
    }
    if (fclose(f) || rename(tmp, path))
        die("cannot write %s", path);
}

/* Top 10 of every query through the index with parameters p; returns seconds. */
static double index_search(tartan_db *db, const corpus *co, const tartan_search_params *p, top *out)
{
    size_t step = 32;
    double t = 0;
    for (size_t q0 = 0; q0 < co->nq; q0 += step) {
        size_t n = q0 + step < co->nq ? step : co->nq - q0;
        size_t *ql = xmalloc(n * sizeof *ql);
        for (size_t i = 0; i < n; i++)
            ql[i] = co->qoff[q0 + i + 1] - co->qoff[q0 + i];
        tartan_queries q = {0};
        q.n_queries = n;
        q.qlens = ql;
        q.embeddings = co->q + co->qoff[q0] * co->dim;
        q.n_rows = co->qoff[q0 + n] - co->qoff[q0];
        q.dim = co->dim;
        q.dtype = TARTAN_FLOAT32;
        tartan_results *r;
        double t0 = now();
        if (tartan_search(db, &q, p, &r))
            die("search: %s", tartan_errmsg(db));
        t += now() - t0;
        for (size_t i = 0; i < n; i++) {
            top *o = &out[q0 + i];
            o->n = 0;
            const tartan_hit *h = r->hits + r->offsets[i];
            for (size_t j = 0; j < r->counts[i] && j < TOPK; j++) {
                long row = row_of(co, h[j].id);
                if (row < 0)
                    die("the index returned id '%s', which the corpus does not have", h[j].id);
                o->row[o->n] = row;
                o->score[o->n++] = h[j].score;
            }
        }
        tartan_results_free(r);
        free(ql);
    }
    return t;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Cosine of every live token's decompressed vector with its original: mean and 1st
 * percentile. The documents are listed first (their blobs stay mapped while the reader's
 * transaction is open), then decompressed in parallel: the axes code's decoder rotates each
 * token back, d^2 multiply-adds a token, minutes on one core at 100k documents. */
static void token_cosines(tartan_db *db, const corpus *co, double *mean, double *p01, size_t *ntok)
{
    idx_reader r;
    store_msg m = {{0}};
    if (idx_reader_open(db->env, &r, &m) || !r.trained)
        die("reading the index: %s", m.text);
    size_t dim = co->dim, n = 0, nd = 0, dcap = 0, maxtok = 0;
    kern_pdoc *docs = NULL;
    long *rows = NULL;
    size_t *first = NULL; /* the document's first slot in cs */
    store_cursor *cur = NULL;
    uint32_t docno;
    kern_pdoc d;
    int rc;
    while ((rc = idx_reader_next_doc(&r, &cur, &docno, &d, &m)) == 1) {
        const char *id;
        size_t len;
        char buf[600];
        if (idx_reader_name(&r, docno, &id, &len, &m) || len >= sizeof buf)
            die("id of a document: %s", m.text);
        memcpy(buf, id, len);
        buf[len] = '\0';
        long row = row_of(co, buf);
        if (row < 0 || co->off[row + 1] - co->off[row] != d.ntok)
            die("document '%s' does not match the corpus", buf);
        if (nd == dcap) {
            dcap = dcap ? 2 * dcap : 1024;
            docs = realloc(docs, dcap * sizeof *docs);
            rows = realloc(rows, dcap * sizeof *rows);
            first = realloc(first, dcap * sizeof *first);
            if (!docs || !rows || !first)
                die("%s", "out of memory");
        }
        docs[nd] = d;
        rows[nd] = row;
        first[nd++] = n;
        n += d.ntok;
        if (d.ntok > maxtok)
            maxtok = d.ntok;
    }
    if (rc != 0)
        die("reading the documents: %s", m.text);
    double *cs = xmalloc((n ? n : 1) * sizeof *cs);
#pragma omp parallel
    {
        float *dec = xmalloc((maxtok ? maxtok : 1) * dim * sizeof(float));
        float *orig = xmalloc((maxtok ? maxtok : 1) * dim * sizeof(float));
#pragma omp for schedule(dynamic, 64)
        for (long long i = 0; i < (long long)nd; i++) {
            idx_reader_decompress(&r, &docs[i], dec);
            load_rows(co->c.emb.data, co->c.emb.dtype, dim, co->off[rows[i]], docs[i].ntok, orig);
            for (uint32_t t = 0; t < docs[i].ntok; t++) {
                double s = 0, a = 0;
                for (size_t j = 0; j < dim; j++) {
                    s += (double)dec[t * dim + j] * orig[t * dim + j];
                    a += (double)dec[t * dim + j] * dec[t * dim + j];
                }
                cs[first[i] + t] = s / sqrt(a > 0 ? a : 1);
            }
        }
        free(dec);
        free(orig);
    }
    idx_reader_close(&r);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += cs[i];
    qsort(cs, n, sizeof *cs, cmp_double);
    *mean = n ? sum / (double)n : 0;
    *p01 = n ? cs[(size_t)(0.01 * (double)n)] : 0;
    *ntok = n;
    free(cs);
    free(docs);
    free(rows);
    free(first);
}

int main(int argc, char **argv)
{
    const char *ix = NULL, *dir = NULL, *truth = NULL, *json = NULL, *label = "";
    size_t max_nq = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--truth") && i + 1 < argc)
            truth = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--label") && i + 1 < argc)
            label = argv[++i];
        else if (!strcmp(argv[i], "--nq") && i + 1 < argc)
            max_nq = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
#ifdef _OPENMP
            omp_set_num_threads(atoi(argv[++i]));
#else
            ++i;
#endif
        } else if (argv[i][0] != '-' && !ix)
            ix = argv[i];
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            fprintf(stderr, "usage: bench_fidelity INDEX CORPUS_DIR [--truth FILE] [--nq N] "
                            "[--label S] [--json FILE] [--threads N]\n");
            return 2;
        }
    }
    if (!ix || !dir)
        die("%s", "usage: bench_fidelity INDEX CORPUS_DIR [options]");
    corpus co = {0};
    char pe[4096], pl[4096], pi[4096], err[1024];
    snprintf(pe, sizeof pe, "%s/embeddings.npy", dir);
    snprintf(pl, sizeof pl, "%s/doclens.npy", dir);
    snprintf(pi, sizeof pi, "%s/ids.txt", dir);
    struct stat st;
    if (tool_corpus_open(&co.c, pe, pl, stat(pi, &st) == 0 ? pi : NULL, err, sizeof err))
        die("%s", err);
    co.off = xmalloc((co.c.n_docs + 1) * sizeof *co.off);
    co.off[0] = 0;
    for (size_t i = 0; i < co.c.n_docs; i++)
        co.off[i + 1] = co.off[i] + tool_corpus_doclen(&co.c, i);
    load_queries(&co, dir, max_nq);
    if (co.dim != co.c.dim)
        die("%s", "queries and embeddings differ in dimension");

    top *ex = calloc(co.nq, sizeof *ex), *exh = calloc(co.nq, sizeof *exh),
        *def = calloc(co.nq, sizeof *def);
    if (!ex || !exh || !def)
        die("%s", "out of memory");
    double t_exact = 0;
    if (!truth || truth_read(&co, truth, ex)) {
        for (size_t i = 0; i < co.nq; i++)
            ex[i].n = 0;
        double t0 = now();
        exact_compute(&co, ex);
        t_exact = now() - t0;
        if (truth)
            truth_write(&co, truth, ex);
    }

    tartan_db *db;
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    if (tartan_open(ix, &o, &db))
        die("opening the index: %s", tartan_errmsg(NULL));
    tartan_index_info info;
    if (tartan_info(db, &info))
        die("%s", tartan_errmsg(db));
    tartan_search_params p;
    tartan_search_params_init(&p, TOPK);
    p.exhaustive = 1;
    double t_exh = index_search(db, &co, &p, exh);
    tartan_search_params_init(&p, TOPK);
    double t_def = index_search(db, &co, &p, def);
    double r_exh = 0, r_def_exh = 0, r_def_ex = 0;
    for (size_t i = 0; i < co.nq; i++) {
        r_exh += overlap(&exh[i], &ex[i]);
        r_def_exh += overlap(&def[i], &exh[i]);
        r_def_ex += overlap(&def[i], &ex[i]);
    }
    r_exh /= (double)co.nq;
    r_def_exh /= (double)co.nq;
    r_def_ex /= (double)co.nq;
    double cmean, c01;
    size_t ntok;
    token_cosines(db, &co, &cmean, &c01, &ntok);
    double bpt = info.n_tokens ? (double)info.bytes_file / (double)info.n_tokens : 0;

    printf("%-24s %8s %6s %5s %6s %9s %9s %9s %8s %8s %7s\n", "label", "docs", "dim", "nbits", "K",
           "exh/exact", "def/exh", "def/exact", "cos_mean", "cos_p01", "B/tok");
    printf("%-24s %8llu %6u %5u %6u %9.4f %9.4f %9.4f %8.5f %8.5f %7.1f\n", label,
           (unsigned long long)info.n_docs, info.dim, info.nbits, info.n_centroids, r_exh,
           r_def_exh, r_def_ex, cmean, c01, bpt);
    fprintf(stderr, "queries %zu; exact %.1f s (0: cached), exhaustive %.2f s, default %.2f s\n",
            co.nq, t_exact, t_exh, t_def);
    if (json) {
        FILE *f = fopen(json, "a");
        if (!f)
            die("cannot write %s", json);
        fprintf(f,
                "{\"label\": \"%s\", \"index\": \"%s\", \"corpus\": \"%s\", \"docs\": %llu, "
                "\"tokens\": %llu, \"dim\": %u, \"nbits\": %u, \"centroids\": %u, \"queries\": "
                "%zu, \"recall10_exhaustive_vs_exact\": %.4f, \"recall10_default_vs_exhaustive\": "
                "%.4f, \"recall10_default_vs_exact\": %.4f, \"token_cos_mean\": %.5f, "
                "\"token_cos_p01\": %.5f, \"bytes_per_token\": %.2f, \"seconds_exhaustive\": "
                "%.3f, \"seconds_default\": %.3f}\n",
                label, ix, dir, (unsigned long long)info.n_docs, (unsigned long long)info.n_tokens,
                info.dim, info.nbits, info.n_centroids, co.nq, r_exh, r_def_exh, r_def_ex, cmean,
                c01, bpt, t_exh, t_def);
        fclose(f);
    }
    (void)ntok;
    tartan_close(db);
    tool_corpus_close(&co.c);
    free(co.off);
    free(co.qoff);
    free(co.q);
    free(ex);
    free(exh);
    free(def);
    return 0;
}
