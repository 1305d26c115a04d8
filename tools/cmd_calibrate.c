/*
 * cmd_calibrate.c: `tartan calibrate INDEX [--queries Q.npy [--qlens L.npy]]`: measures how
 * wide the adaptive search must probe on this index and stores it (tartan_calibrate); and
 * the calibration report that `tartan build`, `add` and `info` share.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ingest.h"
#include "queryfile.h"
#include "tartan.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tartan calibrate INDEX [--queries Q.npy [--qlens L.npy]] [--pseudo N]\n"
            "                        [--reference-docs N] [--seed S] [--threads N] [--device D]\n\n"
            "Measures, on queries run exhaustively and through the adaptive search, how wide a\n"
            "probe margin keeps each share of the exhaustive top 10 and top 100, and stores it\n"
            "in the index: later searches take their margins from it. Without --queries the\n"
            "queries are pseudo-queries drawn from the index's own documents. `tartan build`\n"
            "calibrates by itself, and `tartan add` again once the documents have changed more\n"
            "than twofold since.\n\n"
            "  --queries Q.npy       your queries, as `tartan search` reads them (better than\n"
            "                        pseudo-queries when you have typical ones)\n"
            "  --qlens L.npy         tokens per query, as for `tartan search`\n"
            "  --pseudo N            pseudo-queries to draw (default 128)\n"
            "  --reference-docs N    rank at most N documents exhaustively, a fixed sample\n"
            "                        of a larger index (default 20000 on the CPU,\n"
            "                        1000000 on a GPU)\n"
            "  --seed S              pseudo-queries and sample (default 42)\n"
            "  --threads N           threads (default: OpenMP's, all cores)\n"
            "  --device D            auto (default), cpu or cuda\n");
}

void tool_calibration_print(FILE *f, const tartan_calibration *c)
{
    if (!c->calibrated) {
        fprintf(f, "calibration    none (searches use built-in margins; run tartan calibrate)\n");
        return;
    }
    fprintf(f, "calibration    %u %s, %llu documents then (%llu ranked exhaustively)%s, %.1f s\n",
            c->n_queries, c->from_queries ? "of your queries" : "pseudo-queries",
            (unsigned long long)c->n_docs, (unsigned long long)c->n_reference_docs,
            c->stale ? "; STALE: the documents changed more than twofold since" : "", c->seconds);
    /* Over a sample the recall is an estimate and the counts are the sample's. */
    const int sampled = c->n_reference_docs < c->n_docs;
    fprintf(f,
            "  default search (recall target 0.95): probe margin %.4f at k 10, %.4f at k 100;\n"
            "  recall against exhaustive %.4f at k 10, %.4f at k 100%s;\n"
            "  %.0f candidates and %.0f exact scores a query at k 10%s\n",
            (double)c->margin_k10, (double)c->margin_k100, (double)c->recall_k10,
            (double)c->recall_k100, sampled ? " (estimated from the sample)" : "",
            c->candidates_k10, c->exact_k10, sampled ? " over the sample" : "");
    if (c->short_len)
        fprintf(f,
                "  queries of %u tokens or fewer: probe margin %.4f at k 10, %.4f at k 100 "
                "(longer ones: in between, by length)\n",
                c->short_len, (double)c->margin_k10_short, (double)c->margin_k100_short);
}

int tool_calibrate_db(tartan_db *db, const char *who, int force, const tartan_queries *queries,
                      const tartan_calibrate_params *given)
{
    tartan_calibration c;
    if (!force) {
        if (tartan_calibration_get(db, &c)) {
            fprintf(stderr, "tartan %s: %s\n", who, tartan_errmsg(db));
            return 1;
        }
        if (c.calibrated && !c.stale)
            return 0;
    }
    tartan_calibrate_params p;
    if (given)
        p = *given;
    else
        tartan_calibrate_params_init(&p);
    p.queries = queries;
    if (tartan_calibrate(db, &p, &c)) {
        fprintf(stderr, "tartan %s: calibration: %s\n", who, tartan_errmsg(db));
        return 1;
    }
    tool_calibration_print(stderr, &c);
    return 0;
}

int tool_cmd_calibrate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"queries", required_argument, NULL, 'q'},
        {"qlens", required_argument, NULL, 'l'},
        {"pseudo", required_argument, NULL, 'p'},
        {"reference-docs", required_argument, NULL, 'r'},
        {"seed", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 't'},
        {"device", required_argument, NULL, 'D'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *qpath = NULL, *lpath = NULL;
    tartan_calibrate_params p;
    tartan_calibrate_params_init(&p);
    size_t threads = 0, seed = p.seed;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        size_t *v = NULL;
        const char *name = NULL;
        switch (c) {
        case 'q':
            qpath = optarg;
            break;
        case 'l':
            lpath = optarg;
            break;
        case 'p':
            v = &p.n_pseudo;
            name = "pseudo";
            break;
        case 'r':
            v = &p.max_reference_docs;
            name = "reference-docs";
            break;
        case 's':
            v = &seed;
            name = "seed";
            break;
        case 't':
            v = &threads;
            name = "threads";
            break;
        case 'D':
            if (tool_parse_device(optarg, &p.device)) {
                fprintf(stderr, "tartan calibrate: --device wants auto, cpu or cuda, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (v && (tool_parse_size(optarg, v) || (v != &seed && *v == 0) ||
                  (v == &threads && threads > 4096))) {
            fprintf(stderr, "tartan calibrate: --%s wants a number above 0, not '%s'\n", name,
                    optarg);
            return 2;
        }
    }
    if (optind != argc - 1 || (lpath && !qpath)) {
        usage(stderr);
        return 2;
    }
    p.seed = seed;
    p.threads = (int)threads;
    tool_qfile src;
    tartan_queries q, *qp = NULL;
    char *buf = NULL;
    size_t *qlens = NULL;
    char err[1024];
    int opened = 0;
    if (qpath) {
        if (tool_qfile_open(&src, qpath, lpath, err, sizeof err)) {
            fprintf(stderr, "tartan calibrate: %s\n", err);
            tool_qfile_close(&src);
            return 1;
        }
        opened = 1;
        size_t rows = 0;
        for (size_t i = 0; i < src.nq; i++)
            rows += src.qlen[i];
        buf = malloc(rows * src.dim * src.elsize + 1);
        qlens = malloc(src.nq * sizeof *qlens);
        if (!buf || !qlens) {
            fprintf(stderr, "tartan calibrate: out of memory for %zu queries\n", src.nq);
            free(buf);
            free(qlens);
            tool_qfile_close(&src);
            return 1;
        }
        tool_qfile_batch(&src, 0, src.nq, buf, qlens, &q);
        qp = &q;
    }
    tartan_options o;
    tartan_options_init(&o);
    tartan_db *db;
    int rc = 1;
    if (tartan_open(argv[optind], &o, &db)) {
        fprintf(stderr, "tartan calibrate: %s\n", tartan_errmsg(NULL));
    } else {
        rc = tool_calibrate_db(db, "calibrate", 1, qp, &p);
        tartan_close(db);
    }
    free(buf);
    free(qlens);
    if (opened)
        tool_qfile_close(&src);
    return rc;
}
