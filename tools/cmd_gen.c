/*
 * cmd_gen.c: `tartan gen OUTDIR --docs N ...` writes a synthetic late-interaction corpus
 * (tools/synth.h) as the files `tartan build` and `tartan search` read, plus qrels for
 * `tartan eval`. Streams: memory stays bounded by one chunk of documents, whatever N is.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "commands.h"
#include "npy.h"
#include "synth.h"
#include "tartan.h"

/* Documents generated (in parallel) before each write: about 50 MB of fp32 at the defaults. */
#define GEN_CHUNK 1024

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tartan gen OUTDIR --docs N [--queries N] [--dim D] [--doc-len L]\n"
            "                  [--fixed-len] [--query-len L] [--terms N] [--seed S]\n\n"
            "Writes a synthetic ColBERT-like corpus into OUTDIR: embeddings.npy [T, D] float32,\n"
            "doclens.npy [N] int32, ids.txt, queries.npy [Q, L, D] float32, query_ids.txt and\n"
            "qrels.tsv (BEIR layout: each query is relevant to the document it was built from).\n"
            "Document lengths vary around --doc-len (log-normal, like text passages); with\n"
            "--fixed-len every document has exactly --doc-len tokens (ColPali-style pages:\n"
            "--doc-len 1030 --fixed-len --query-len 24).\n"
            "Defaults: --queries 100 --dim 128 --doc-len 100 --query-len 32 --seed 42.\n");
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return -1;
    *out = (size_t)v;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int write_docs(const tool_synth *s, const tool_synth_params *p, const char *dir,
                      size_t *total_tokens)
{
    char path[1024], err[1400];
    int rc = 0;
    int32_t *lens = malloc((p->n_docs ? p->n_docs : 1) * sizeof(int32_t));
    float *buf = NULL;
    tool_npy_writer *w = NULL;
    FILE *ids = NULL;
    if (!lens)
        return ENOMEM;
    size_t T = 0, longest = 0;
    for (size_t i = 0; i < p->n_docs; i++) {
        size_t n = tool_synth_doclen(s, i);
        lens[i] = (int32_t)n;
        T += n;
        if (n > longest)
            longest = n;
    }
    *total_tokens = T;
    snprintf(path, sizeof path, "%s/doclens.npy", dir);
    size_t shape[2] = {p->n_docs, p->dim};
    if ((rc = tool_npy_save(path, TOOL_I32, 1, shape, lens, err, sizeof err)))
        goto fail;
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    if (!(ids = fopen(path, "w"))) {
        rc = errno;
        snprintf(err, sizeof err, "%s: %s", path, strerror(rc));
        goto fail;
    }
    for (size_t i = 0; i < p->n_docs; i++)
        fprintf(ids, "doc%zu\n", i);
    if (fclose(ids) != 0) {
        ids = NULL;
        rc = errno;
        snprintf(err, sizeof err, "%s: %s", path, strerror(rc));
        goto fail;
    }
    ids = NULL;

    snprintf(path, sizeof path, "%s/embeddings.npy", dir);
    shape[0] = T;
    if ((rc = tool_npy_writer_open(&w, path, TOOL_F32, 2, shape, err, sizeof err)))
        goto fail;
    size_t cap = GEN_CHUNK * longest * p->dim;
    if (!(buf = malloc((cap ? cap : 1) * sizeof(float)))) {
        rc = ENOMEM;
        snprintf(err, sizeof err, "%s: out of memory", path);
        goto fail;
    }
    size_t offs[GEN_CHUNK + 1];
    for (size_t c0 = 0; c0 < p->n_docs; c0 += GEN_CHUNK) {
        size_t c1 = c0 + GEN_CHUNK < p->n_docs ? c0 + GEN_CHUNK : p->n_docs;
        offs[0] = 0;
        for (size_t i = c0; i < c1; i++)
            offs[i - c0 + 1] = offs[i - c0] + (size_t)lens[i];
#pragma omp parallel for schedule(dynamic, 16)
        for (size_t i = c0; i < c1; i++)
            tool_synth_doc(s, i, buf + offs[i - c0] * p->dim);
        if ((rc = tool_npy_writer_rows(w, buf, offs[c1 - c0], err, sizeof err)))
            goto fail;
    }
    rc = tool_npy_writer_close(w, err, sizeof err);
    w = NULL;
    if (rc)
        goto fail;
    free(buf);
    free(lens);
    return 0;
fail:
    fprintf(stderr, "tartan gen: %s\n", err);
    if (ids)
        fclose(ids);
    tool_npy_writer_abort(w);
    free(buf);
    free(lens);
    return rc;
}

static int write_queries(const tool_synth *s, const tool_synth_params *p, const char *dir)
{
    char path[1024], err[1400];
    int rc = 0;
    FILE *qids = NULL, *qrels = NULL;
    size_t *rel = malloc((p->n_queries ? p->n_queries : 1) * sizeof(size_t));
    float *q = malloc((p->n_queries ? p->n_queries : 1) * p->qlen * p->dim * sizeof(float));
    if (!rel || !q) {
        free(rel);
        free(q);
        fprintf(stderr, "tartan gen: out of memory for %zu queries\n", p->n_queries);
        return ENOMEM;
    }
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t j = 0; j < p->n_queries; j++)
        tool_synth_query(s, j, q + j * p->qlen * p->dim, &rel[j]);
    snprintf(path, sizeof path, "%s/queries.npy", dir);
    size_t shape[3] = {p->n_queries, p->qlen, p->dim};
    if ((rc = tool_npy_save(path, TOOL_F32, 3, shape, q, err, sizeof err)))
        goto fail;
    snprintf(path, sizeof path, "%s/query_ids.txt", dir);
    if (!(qids = fopen(path, "w")))
        goto fail_errno;
    snprintf(path, sizeof path, "%s/qrels.tsv", dir);
    if (!(qrels = fopen(path, "w")))
        goto fail_errno;
    fprintf(qrels, "query-id\tcorpus-id\tscore\n");
    for (size_t j = 0; j < p->n_queries; j++) {
        fprintf(qids, "q%zu\n", j);
        fprintf(qrels, "q%zu\tdoc%zu\t1\n", j, rel[j]);
    }
    if (fclose(qrels) != 0) {
        qrels = NULL;
        goto fail_errno;
    }
    qrels = NULL;
    if (fclose(qids) != 0) {
        qids = NULL;
        goto fail_errno;
    }
    free(rel);
    free(q);
    return 0;
fail_errno:
    rc = errno;
    snprintf(err, sizeof err, "%s: %s", path, strerror(rc));
fail:
    fprintf(stderr, "tartan gen: %s\n", err);
    if (qids)
        fclose(qids);
    if (qrels)
        fclose(qrels);
    free(rel);
    free(q);
    return rc;
}

int tool_cmd_gen(int argc, char **argv)
{
    tool_synth_params p;
    tool_synth_params_init(&p);
    p.n_queries = 100;
    int have_docs = 0, fixed_len = 0;
    static const struct option opts[] = {
        {"docs", required_argument, NULL, 'n'},   {"queries", required_argument, NULL, 'q'},
        {"dim", required_argument, NULL, 'd'},    {"doc-len", required_argument, NULL, 'l'},
        {"query-len", required_argument, NULL, 'L'}, {"terms", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 's'},   {"help", no_argument, NULL, 'h'},
        {"fixed-len", no_argument, NULL, 'F'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        size_t v = 0;
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == 'F') {
            fixed_len = 1;
            continue;
        }
        if (c == '?' || parse_size(optarg, &v) != 0) {
            if (c != '?')
                fprintf(stderr, "tartan gen: not a non-negative integer: '%s'\n", optarg);
            usage(stderr);
            return 2;
        }
        switch (c) {
        case 'n':
            p.n_docs = v;
            have_docs = 1;
            break;
        case 'q':
            p.n_queries = v;
            break;
        case 'd':
            p.dim = v;
            break;
        case 'l':
            p.len_mean = v;
            break;
        case 'L':
            p.qlen = v;
            break;
        case 't':
            p.n_terms = v;
            break;
        case 's':
            p.seed = v;
            break;
        }
    }
    if (optind != argc - 1 || !have_docs || p.n_docs == 0) {
        fprintf(stderr, "tartan gen: need OUTDIR and --docs N (N > 0)\n");
        usage(stderr);
        return 2;
    }
    if (fixed_len)
        p.len_min = p.len_max = p.len_mean;
    else if (p.len_mean < p.len_min)
        p.len_min = p.len_mean;
    const char *dir = argv[optind];
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "tartan gen: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    tool_synth *s = NULL;
    int rc = tool_synth_new(&p, &s);
    if (rc) {
        fprintf(stderr, "tartan gen: bad parameters (%s)\n", tartan_strerror(rc));
        return 2;
    }
    double t0 = now_s();
    size_t T = 0;
    rc = write_docs(s, &p, dir, &T);
    if (!rc)
        rc = write_queries(s, &p, dir);
    tool_synth_free(s);
    if (rc)
        return 1;
    printf("wrote %zu documents (%zu tokens, dim %zu) and %zu queries to %s in %.1f s\n",
           p.n_docs, T, p.dim, p.n_queries, dir, now_s() - t0);
    return 0;
}
