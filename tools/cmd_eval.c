/*
 * cmd_eval.c: `tartan eval`, a run scored against qrels with trec_eval's measures and rules
 * (see evaluate.h). The table has trec_eval's layout (measure, query or "all", value), so
 * scripts that read trec_eval's output read this too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "evaluate.h"
#include "jsonl.h"
#include "metrics.h"
#include "qrels.h"
#include "tartan.h"
#include "trec_run.h"

/* BEIR's headline measures, plus MAP and P@10. */
#define DEFAULT_MEASURES "ndcg_cut.10,recall.100,recip_rank.10,map,P.10"

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan eval --qrels QRELS --run RUN [--metrics LIST] [--per-query]\n"
               "                   [--json FILE] [--level N] [--complete]\n\n"
               "Scores a TREC run (qid Q0 docid rank score tag) against qrels (BEIR TSV\n"
               "'query-id corpus-id score' with its header line, or TREC 'qid 0 docid rel'),\n"
               "with trec_eval's definitions: documents ordered by score, ties by docid, both\n"
               "descending; the rank column ignored; means over the queries in both files.\n\n"
               "  --qrels FILE     judgments ('-' for standard input)\n"
               "  --run FILE       the run ('-' for standard input)\n"
               "  -m, --metrics L  comma-separated measures (default " DEFAULT_MEASURES ")\n"
               "                   trec_eval names: ndcg_cut.K ndcg recall.K P.K map map_cut.K\n"
               "                   recip_rank recip_rank.K (MRR@K); several cutoffs: P.5,10\n"
               "                   short names: ndcg@K recall@K p@K map map@K mrr mrr@K\n"
               "  -q, --per-query  also print each query's values (and put them in the JSON)\n"
               "  --json FILE      write the results as JSON ('-' for standard output)\n"
               "  -l, --level N    judged relevance >= N is relevant (default 1)\n"
               "  -c, --complete   average over every judged query; missing ones score 0\n");
}

static int write_json(FILE *f, const char *qrels, const char *run, const tool_measure *m, size_t nm,
                      const tool_eval *e, const tool_eval_opts *o, int per_query)
{
    fprintf(f, "{\n  \"qrels\": ");
    tool_json_string(f, qrels);
    fprintf(f, ",\n  \"run\": ");
    tool_json_string(f, run);
    fprintf(f,
            ",\n  \"relevance_level\": %ld,\n  \"complete\": %s,\n  \"num_q\": %zu,\n"
            "  \"run_queries_without_qrels\": %zu,\n  \"qrels_queries_without_run\": %zu,\n"
            "  \"measures\": {",
            o->level, o->complete ? "true" : "false", e->num_q, e->run_only, e->qrels_only);
    for (size_t i = 0; i < nm; i++)
        fprintf(f, "%s\n    \"%s\": %.17g", i ? "," : "", m[i].name, e->mean[i]);
    fprintf(f, "\n  }");
    if (per_query) {
        fprintf(f, ",\n  \"per_query\": {");
        for (size_t q = 0; q < e->nq; q++) {
            fprintf(f, "%s\n    ", q ? "," : "");
            tool_json_string(f, e->qids[q]);
            fprintf(f, ": {");
            for (size_t i = 0; i < nm; i++)
                fprintf(f, "%s\"%s\": %.17g", i ? ", " : "", m[i].name, e->values[q * nm + i]);
            fprintf(f, "}");
        }
        fprintf(f, "\n  }");
    }
    fprintf(f, "\n}\n");
    return ferror(f) ? EIO : 0;
}

int tool_cmd_eval(int argc, char **argv)
{
    static const struct option opts[] = {
        {"qrels", required_argument, NULL, 'Q'},   {"run", required_argument, NULL, 'R'},
        {"metrics", required_argument, NULL, 'm'}, {"measures", required_argument, NULL, 'm'},
        {"per-query", no_argument, NULL, 'q'},     {"json", required_argument, NULL, 'J'},
        {"level", required_argument, NULL, 'l'},   {"complete", no_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    const char *qrels_path = NULL, *run_path = NULL, *spec = DEFAULT_MEASURES, *json = NULL;
    int per_query = 0;
    tool_eval_opts eo = {.level = 1, .complete = 0};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:ql:ch", opts, NULL)) != -1) {
        switch (c) {
        case 'Q':
            qrels_path = optarg;
            break;
        case 'R':
            run_path = optarg;
            break;
        case 'm':
            spec = optarg;
            break;
        case 'q':
            per_query = 1;
            break;
        case 'J':
            json = optarg;
            break;
        case 'l': {
            char *end;
            errno = 0;
            eo.level = strtol(optarg, &end, 10);
            if (end == optarg || *end || errno) {
                fprintf(stderr, "tartan eval: --level needs an integer, not '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case 'c':
            eo.complete = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!qrels_path || !run_path || optind < argc) {
        if (optind < argc)
            fprintf(stderr, "tartan eval: unexpected argument '%s'\n", argv[optind]);
        else
            fprintf(stderr, "tartan eval: --qrels and --run are required\n");
        usage(stderr);
        return 2;
    }
    if (!strcmp(qrels_path, "-") && !strcmp(run_path, "-")) {
        fprintf(stderr, "tartan eval: only one of --qrels and --run can be standard input\n");
        return 2;
    }

    char err[512];
    tool_measure *m = NULL;
    size_t nm = 0;
    tool_qrels qrels;
    tool_run run;
    tool_eval e;
    memset(&qrels, 0, sizeof qrels);
    memset(&run, 0, sizeof run);
    memset(&e, 0, sizeof e);
    int status = 1;
    if (tool_measures_parse(spec, &m, &nm, err, sizeof err)) {
        fprintf(stderr, "tartan eval: %s\n", err);
        return 2;
    }
    int rc = tool_qrels_read(&qrels, qrels_path, err, sizeof err);
    if (!rc)
        rc = tool_run_read(&run, run_path, err, sizeof err);
    if (!rc)
        rc = tool_evaluate(&qrels, &run, m, nm, &eo, &e, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tartan eval: %s (%s)\n", err,
                tartan_err_name(rc) ? tartan_err_name(rc) : "error");
        goto done;
    }
    if (e.run_only)
        fprintf(stderr, "tartan eval: note: %zu run quer%s without judgments not scored\n",
                e.run_only, e.run_only == 1 ? "y" : "ies");
    if (e.qrels_only)
        fprintf(stderr, "tartan eval: note: %zu judged quer%s not in the run %s\n", e.qrels_only,
                e.qrels_only == 1 ? "y" : "ies",
                eo.complete ? "count as 0 (--complete)"
                            : "not scored (--complete counts them as 0)");

    if (per_query)
        for (size_t q = 0; q < e.nq; q++)
            for (size_t i = 0; i < nm; i++)
                printf("%-22s\t%s\t%.4f\n", m[i].name, e.qids[q], e.values[q * nm + i]);
    printf("%-22s\tall\t%zu\n", "num_q", e.num_q);
    for (size_t i = 0; i < nm; i++)
        printf("%-22s\tall\t%.4f\n", m[i].name, e.mean[i]);
    if (fflush(stdout) == EOF || ferror(stdout)) {
        fprintf(stderr, "tartan eval: writing the table: %s\n", strerror(errno));
        goto done;
    }
    if (json) {
        int to_stdout = !strcmp(json, "-");
        FILE *f = to_stdout ? stdout : fopen(json, "w");
        if (!f) {
            fprintf(stderr, "tartan eval: %s: %s\n", json, strerror(errno));
            goto done;
        }
        int jr = write_json(f, qrels_path, run_path, m, nm, &e, &eo, per_query);
        if ((!to_stdout && fclose(f) == EOF) || jr) {
            fprintf(stderr, "tartan eval: %s: write failed\n", json);
            goto done;
        }
    }
    status = 0;
done:
    tool_eval_free(&e);
    tool_run_free(&run);
    tool_qrels_free(&qrels);
    free(m);
    return status;
}
