/* corpus_args.c: see corpus_args.h. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "corpus_args.h"
#include "ingest.h"

static void build_usage(FILE *f, const char *prog)
{
    if (!f)
        return;
    int w = (int)strlen(prog) + 6;
    fprintf(f,
            "usage: %s build INDEX --embeddings E.npy --doclens L.npy [--ids ids.txt]\n"
            "       %*s [--nbits 2] [--centroids K] [--batch N] [--seed S]\n"
            "       %*s [--sample N] [--kmeans-iters N] [--device D]\n"
            "       %*s [--codec scalar|axes|auto] [--model FILE] [--no-calibrate]\n\n"
            "Creates the index directory INDEX (it must not hold an index yet) from\n"
            "embeddings E.npy [tokens, dim] (float32, float16 or bfloat16 as uint16) and\n"
            "document lengths L.npy [documents] (int32 or int64). Ids come from ids.txt, one\n"
            "a line, else they are the row numbers of L.npy (\"0\", \"1\", ...).\n\n"
            "  --nbits B         residual bits per dimension: 1, 2 (default), 4 or 8\n"
            "  --centroids K     centroids (default 2^floor(log2(16 sqrt(tokens))))\n"
            "  --batch N         documents per transaction (default: documents\n"
            "                    of about 262,144 tokens; 1,048,576 on a GPU)\n"
            "  --seed S          sampling and k-means seed (default 42)\n"
            "  --sample N        documents sampled for training (default\n"
            "                    min(1 + 16 sqrt(120 N), N))\n"
            "  --kmeans-iters N  k-means iterations (default 4)\n"
            "  --codec C         the residual code: scalar (default: one table for every\n"
            "                    dimension), axes (the residuals' principal axes, more\n"
            "                    bits where they vary most; nbits 1, 2 or 4; GPU search\n"
            "                    is fast on it at dims 64, 96 and 128 only) or auto (axes\n"
            "                    where it cuts held-out error by 10%% and the GPU reads it\n"
            "                    fast, else scalar)\n"
            "  --device D        where k-means and encoding run: auto (default: the\n"
            "                    TARTAN_DEVICE variable, else a GPU when present), cpu\n"
            "                    or cuda\n"
            "  --model FILE      no training: encode with the model FILE holds (written by\n"
            "                    'tartan model'; --nbits, --centroids, --sample and\n"
            "                    --kmeans-iters are then the model's)\n"
            "  --no-calibrate    skip the search calibration that follows the build\n"
            "                    (tartan calibrate runs it later)\n",
            prog, w, "", w, "", w, "");
}

/* The long name of the option whose getopt value is c ("?" where none is). */
static const char *option_name(const struct option *opts, int c)
{
    for (; opts->name; opts++)
        if (opts->val == c)
            return opts->name;
    return "?";
}

int tool_build_args_parse(int argc, char **argv, const char *prog, FILE *out, FILE *err,
                          tool_build_args *a)
{
    static const struct option opts[] = {
        {"embeddings", required_argument, NULL, 'e'},
        {"doclens", required_argument, NULL, 'l'},
        {"ids", required_argument, NULL, 'i'},
        {"nbits", required_argument, NULL, 'b'},
        {"centroids", required_argument, NULL, 'k'},
        {"batch", required_argument, NULL, 'n'},
        {"seed", required_argument, NULL, 's'},
        {"sample", required_argument, NULL, 'S'},
        {"kmeans-iters", required_argument, NULL, 'I'},
        {"device", required_argument, NULL, 'D'},
        {"model", required_argument, NULL, 'M'},
        {"no-calibrate", no_argument, NULL, 'C'},
        {"codec", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    a->nbits = 2;
    a->seed = 42;
    a->iters = 4;
    a->device = TARTAN_DEVICE_AUTO;
    int c;
    optind = 1;
    opterr = err != NULL;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        size_t *v = NULL;
        switch (c) {
        case 'e':
            a->emb = optarg;
            break;
        case 'l':
            a->lens = optarg;
            break;
        case 'i':
            a->ids = optarg;
            break;
        case 'b':
            v = &a->nbits;
            break;
        case 'k':
            v = &a->k;
            break;
        case 'n':
            v = &a->batch;
            break;
        case 's':
            v = &a->seed;
            break;
        case 'S':
            v = &a->sample;
            break;
        case 'I':
            v = &a->iters;
            break;
        case 'D':
            if (tool_parse_device(optarg, &a->device)) {
                if (err)
                    fprintf(err, "%s build: --device wants auto, cpu or cuda, not '%s'\n", prog,
                            optarg);
                return 2;
            }
            break;
        case 'M':
            a->model = optarg;
            break;
        case 'C':
            a->no_calibrate = 1;
            break;
        case 'c':
            if (strcmp(optarg, "scalar") == 0)
                a->codec = TARTAN_CODEC_SCALAR;
            else if (strcmp(optarg, "axes") == 0)
                a->codec = TARTAN_CODEC_AXES;
            else if (strcmp(optarg, "auto") == 0)
                a->codec = TARTAN_CODEC_AUTO;
            else {
                if (err)
                    fprintf(err, "%s build: --codec wants scalar, axes or auto, not '%s'\n", prog,
                            optarg);
                return 2;
            }
            break;
        case 'h':
            build_usage(out, prog);
            return 0;
        default:
            build_usage(err, prog);
            return 2;
        }
        if (v && (tool_parse_size(optarg, v) || (v == &a->batch && a->batch == 0))) {
            if (err)
                fprintf(err, "%s build: --%s wants a number, not '%s'\n", prog,
                        option_name(opts, c), optarg);
            return 2;
        }
    }
    if (optind != argc - 1 || !a->emb || !a->lens) {
        build_usage(err, prog);
        return 2;
    }
    if (a->iters == 0 || a->iters > 1000) {
        if (err)
            fprintf(err, "%s build: --kmeans-iters must be 1 to 1000\n", prog);
        return 2;
    }
    a->path = argv[optind];
    return -1;
}

void tool_build_options(const tool_build_args *a, size_t dim, tartan_options *o)
{
    tartan_options_init(o);
    o->flags = TARTAN_CREATE | TARTAN_EXCL;
    o->dim = dim;
    o->nbits = (unsigned)a->nbits;
    o->n_centroids = a->k;
    o->seed = a->seed;
    o->sample_docs = a->sample;
    o->kmeans_iters = (int)a->iters;
    o->device = a->device;
    o->codec = a->codec;
}

static void add_usage(FILE *f, const char *prog)
{
    if (!f)
        return;
    int w = (int)strlen(prog) + 4;
    fprintf(f,
            "usage: %s add INDEX --embeddings E.npy --doclens L.npy [--ids ids.txt]\n"
            "       %*s [--batch N] [--replace] [--device D] [--no-calibrate]\n\n"
            "Adds documents to the index INDEX. Without --ids the ids are the row numbers\n"
            "of L.npy. An id the index has already is an error unless --replace.\n\n"
            "  --batch N    documents per transaction (default: documents of about\n"
            "               262,144 tokens; 1,048,576 on a GPU)\n"
            "  --replace    replace documents whose ids exist\n"
            "  --device D   where encoding runs: auto (default: the TARTAN_DEVICE\n"
            "               variable, else a GPU when present), cpu or cuda\n"
            "  --no-calibrate  do not calibrate the search again, even when the\n"
            "               documents have changed more than twofold since the last\n"
            "               calibration (tartan info tells)\n",
            prog, w, "");
}

int tool_add_args_parse(int argc, char **argv, const char *prog, FILE *out, FILE *err,
                        tool_add_args *a)
{
    static const struct option opts[] = {
        {"embeddings", required_argument, NULL, 'e'},
        {"doclens", required_argument, NULL, 'l'},
        {"ids", required_argument, NULL, 'i'},
        {"batch", required_argument, NULL, 'n'},
        {"replace", no_argument, NULL, 'r'},
        {"device", required_argument, NULL, 'D'},
        {"no-calibrate", no_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    a->device = TARTAN_DEVICE_AUTO;
    int c;
    optind = 1;
    opterr = err != NULL;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'e':
            a->emb = optarg;
            break;
        case 'l':
            a->lens = optarg;
            break;
        case 'i':
            a->ids = optarg;
            break;
        case 'n':
            if (tool_parse_size(optarg, &a->batch) || a->batch == 0) {
                if (err)
                    fprintf(err, "%s add: --batch wants a number >= 1, not '%s'\n", prog, optarg);
                return 2;
            }
            break;
        case 'r':
            a->flags |= TARTAN_REPLACE;
            break;
        case 'C':
            a->no_calibrate = 1;
            break;
        case 'D':
            if (tool_parse_device(optarg, &a->device)) {
                if (err)
                    fprintf(err, "%s add: --device wants auto, cpu or cuda, not '%s'\n", prog,
                            optarg);
                return 2;
            }
            break;
        case 'h':
            add_usage(out, prog);
            return 0;
        default:
            add_usage(err, prog);
            return 2;
        }
    }
    if (optind != argc - 1 || !a->emb || !a->lens) {
        add_usage(err, prog);
        return 2;
    }
    a->path = argv[optind];
    return -1;
}
