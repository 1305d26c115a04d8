/*
 * cmd_gen.c: `tartan gen OUTDIR --docs N ...` writes a synthetic late-interaction corpus
 * (tools/synth.h) as the files `tartan build` and `tartan search` read, plus qrels for
 * `tartan eval` (tools/synth_write.c: streamed, in bounded memory, whatever N is).
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

static void usage(FILE *f)
{
    fprintf(
        f, "usage: tartan gen OUTDIR --docs N [--queries N] [--dim D] [--doc-len L]\n"
           "                  [--fixed-len] [--query-len L] [--terms N] [--seed S]\n"
           "                  [--dtype f32|f16] [--model 1|2|3] [--noise X] [--context X]\n"
           "                  [--query-context X] [--query-content X] [--group-docs N]\n"
           "                  [--group-terms X] [--group-context X]\n\n"
           "Writes a synthetic ColBERT-like corpus into OUTDIR: embeddings.npy [T, D],\n"
           "doclens.npy [N] int32, ids.txt, queries.npy [Q, L, D], query_ids.txt and\n"
           "qrels.tsv (BEIR layout: each query is relevant to the document it was built from).\n"
           "Document lengths vary around --doc-len, the mean tokens per document (log-normal,\n"
           "like text passages; MS MARCO-like: --doc-len 70); with --fixed-len every document\n"
           "has exactly --doc-len tokens (ColPali-like pages: --doc-len 1030 --fixed-len\n"
           "--query-len 24). --dtype f16 writes embeddings and queries as float16 (half the\n"
           "size; tartan build and search read it).\n"
           "--model 2 (default) is calibrated against real token embeddings; --model 1 is the\n"
           "first, harder model (noise 0.45, context 0.3, queries of a third to a half content\n"
           "tokens). --noise, --context (token and document-context noise norms), --query-context\n"
           "(share of a query's context from its document, model 2) and --query-content (share\n"
           "of query tokens that are not expansion tokens, model 2), --group-docs (documents per\n"
           "topic group, 0 for none, model 2), --group-terms and --group-context (shares of a\n"
           "document's topic terms and context from its group's, model 2) override the model's\n"
           "values.\n"
           "--model 3 is a family with other token statistics (anisotropic tokens around a\n"
           "shared mean direction, runs of near-duplicate tokens, heavy-tailed lengths up to 8x\n"
           "--doc-len, queries with hard-negative tokens): a check that what works on model 2\n"
           "works elsewhere too.\n"
           "Defaults: --queries 100 --dim 128 --doc-len 100 --query-len 32 --seed 42\n"
           "--dtype f32 --model 2.\n");
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

static int parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= 0.f && v <= 100.f))
        return -1;
    *out = v;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int tool_cmd_gen(int argc, char **argv)
{
    tool_synth_params p;
    tool_synth_params_init(&p);
    p.n_queries = 100;
    int have_docs = 0, fixed_len = 0, model = TOOL_SYNTH_V2;
    tool_dtype dtype = TOOL_F32;
    /* Noise settings given on the command line win over the model's, whatever the order. */
    float noise = -1.f, context = -1.f, qcontext = -1.f, qcontent = -1.f, gterms = -1.f,
          gcontext = -1.f;
    size_t gdocs = (size_t)-1;
    static const struct option opts[] = {
        {"docs", required_argument, NULL, 'n'},
        {"queries", required_argument, NULL, 'q'},
        {"dim", required_argument, NULL, 'd'},
        {"doc-len", required_argument, NULL, 'l'},
        {"query-len", required_argument, NULL, 'L'},
        {"terms", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {"fixed-len", no_argument, NULL, 'F'},
        {"dtype", required_argument, NULL, 'D'},
        {"model", required_argument, NULL, 'M'},
        {"noise", required_argument, NULL, 'N'},
        {"context", required_argument, NULL, 'C'},
        {"query-context", required_argument, NULL, 'Q'},
        {"query-content", required_argument, NULL, 'K'},
        {"group-docs", required_argument, NULL, 'G'},
        {"group-terms", required_argument, NULL, 'T'},
        {"group-context", required_argument, NULL, 'X'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        size_t v = 0;
        float x = 0.f;
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case 'F':
            fixed_len = 1;
            continue;
        case 'D':
            if (strcmp(optarg, "f32") == 0 || strcmp(optarg, "float32") == 0)
                dtype = TOOL_F32;
            else if (strcmp(optarg, "f16") == 0 || strcmp(optarg, "float16") == 0)
                dtype = TOOL_F16;
            else {
                fprintf(stderr, "tartan gen: --dtype is f32 or f16, not '%s'\n", optarg);
                return 2;
            }
            continue;
        case 'M':
            if (strcmp(optarg, "1") == 0)
                model = TOOL_SYNTH_V1;
            else if (strcmp(optarg, "2") == 0)
                model = TOOL_SYNTH_V2;
            else if (strcmp(optarg, "3") == 0)
                model = TOOL_SYNTH_V3;
            else {
                fprintf(stderr, "tartan gen: --model is 1, 2 or 3, not '%s'\n", optarg);
                return 2;
            }
            continue;
        case 'N':
        case 'C':
        case 'Q':
        case 'K':
        case 'T':
        case 'X': {
            int unit = c != 'N' && c != 'C'; /* a share: at most 1 */
            if (parse_float(optarg, &x) != 0 || (unit && x > 1.f)) {
                fprintf(stderr, "tartan gen: bad value '%s' (a number, at least 0%s)\n", optarg,
                        unit ? " and at most 1" : "");
                return 2;
            }
            *(c == 'N'   ? &noise
              : c == 'C' ? &context
              : c == 'Q' ? &qcontext
              : c == 'K' ? &qcontent
              : c == 'T' ? &gterms
                         : &gcontext) = x;
            continue;
        }
        case '?':
            usage(stderr);
            return 2;
        }
        if (parse_size(optarg, &v) != 0) {
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
        case 'G':
            gdocs = v;
            break;
        }
    }
    if (optind != argc - 1 || !have_docs || p.n_docs == 0) {
        fprintf(stderr, "tartan gen: need OUTDIR and --docs N (N > 0)\n");
        usage(stderr);
        return 2;
    }
    tool_synth_params_model(&p, model);
    if (noise >= 0.f)
        p.noise = noise;
    if (context >= 0.f)
        p.context = context;
    if (qcontext >= 0.f)
        p.query_context = qcontext;
    if (qcontent >= 0.f)
        p.query_content = qcontent;
    if (gdocs != (size_t)-1)
        p.group_docs = gdocs;
    if (gterms >= 0.f)
        p.group_terms = gterms;
    if (gcontext >= 0.f)
        p.group_context = gcontext;
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
    char err[4200];
    rc = tool_synth_write(s, &p, dir, dtype, &T, err, sizeof err);
    tool_synth_free(s);
    if (rc) {
        fprintf(stderr, "tartan gen: %s\n", err);
        return 1;
    }
    printf("wrote %zu documents (%zu tokens, dim %zu, %s, model %d) and %zu queries to %s in "
           "%.1f s\n",
           p.n_docs, T, p.dim, tool_dtype_name(dtype), p.model, p.n_queries, dir, now_s() - t0);
    return 0;
}
