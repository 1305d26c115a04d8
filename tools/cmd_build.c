/*
 * cmd_build.c: `tartan build INDEX --embeddings E.npy --doclens L.npy [--ids ids.txt]
 * [--nbits 2] [--centroids K] [--batch N] [--seed S] [--sample N] [--kmeans-iters N]
 * [--device auto|cpu|cuda]`: creates an index, trains it from a sample drawn over the whole
 * corpus, then adds the corpus in batches (one transaction each), in memory bounded by the batch
 * and the sample. k-means and encoding run on the device (a GPU when there is one). Then the
 * index calibrates its search (tartan_calibrate) unless --no-calibrate.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ingest.h"
#include "progress.h"
#include "tartan.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan build INDEX --embeddings E.npy --doclens L.npy [--ids ids.txt]\n"
               "                    [--nbits 2] [--centroids K] [--batch N] [--seed S]\n"
               "                    [--sample N] [--kmeans-iters N] [--device D]\n"
               "                    [--no-calibrate]\n\n"
               "Creates the index directory INDEX (it must not hold an index yet) from\n"
               "embeddings E.npy [tokens, dim] (float32, float16 or bfloat16 as uint16) and\n"
               "document lengths L.npy [documents] (int32 or int64). Ids come from ids.txt, one\n"
               "a line, else they are the row numbers of L.npy (\"0\", \"1\", ...).\n\n"
               "  --nbits B         residual bits per dimension: 1, 2 (default), 4 or 8\n"
               "  --centroids K     centroids (default 2^floor(log2(16 sqrt(tokens))))\n"
               "  --batch N         documents per transaction (default: documents\n"
               "                    of about 262,144 tokens)\n"
               "  --seed S          sampling and k-means seed (default 42)\n"
               "  --sample N        documents sampled for training (default\n"
               "                    min(1 + 16 sqrt(120 N), N))\n"
               "  --kmeans-iters N  k-means iterations (default 4)\n"
               "  --device D        where k-means and encoding run: auto (default: the\n"
               "                    TARTAN_DEVICE variable, else a GPU when present), cpu\n"
               "                    or cuda\n"
               "  --no-calibrate    skip the search calibration that follows the build\n"
               "                    (tartan calibrate runs it later)\n");
}

int tool_cmd_build(int argc, char **argv)
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
        {"no-calibrate", no_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *emb = NULL, *lens = NULL, *ids = NULL;
    size_t nbits = 2, k = 0, batch = 0, seed = 42, sample = 0, iters = 4;
    tartan_device device = TARTAN_DEVICE_AUTO;
    int c, calibrate = 1;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        size_t *v = NULL;
        switch (c) {
        case 'e':
            emb = optarg;
            break;
        case 'l':
            lens = optarg;
            break;
        case 'i':
            ids = optarg;
            break;
        case 'b':
            v = &nbits;
            break;
        case 'k':
            v = &k;
            break;
        case 'n':
            v = &batch;
            break;
        case 's':
            v = &seed;
            break;
        case 'S':
            v = &sample;
            break;
        case 'I':
            v = &iters;
            break;
        case 'D':
            if (tool_parse_device(optarg, &device)) {
                fprintf(stderr, "tartan build: --device wants auto, cpu or cuda, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'C':
            calibrate = 0;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (v && (tool_parse_size(optarg, v) || (v == &batch && batch == 0))) {
            fprintf(stderr, "tartan build: --%s wants a number, not '%s'\n",
                    opts[c == 'b'   ? 3
                         : c == 'k' ? 4
                         : c == 'n' ? 5
                         : c == 's' ? 6
                         : c == 'S' ? 7
                                    : 8]
                        .name,
                    optarg);
            return 2;
        }
    }
    if (optind != argc - 1 || !emb || !lens) {
        usage(stderr);
        return 2;
    }
    if (iters == 0 || iters > 1000) {
        fprintf(stderr, "tartan build: --kmeans-iters must be 1 to 1000\n");
        return 2;
    }
    const char *path = argv[optind];
    char err[1024];
    tool_corpus corpus;
    int rc = tool_corpus_open(&corpus, emb, lens, ids, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tartan build: %s: %s\n", tartan_err_name(rc), err);
        return 1;
    }
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE | TARTAN_EXCL;
    o.dim = corpus.dim;
    o.nbits = (unsigned)nbits;
    o.n_centroids = k;
    o.seed = seed;
    o.sample_docs = sample;
    o.kmeans_iters = (int)iters;
    o.device = device;
    tartan_db *db;
    double t0 = tool_now();
    if ((rc = tartan_open(path, &o, &db))) {
        fprintf(stderr, "tartan build: %s\n", tartan_errmsg(NULL));
        tool_corpus_close(&corpus);
        return 1;
    }
    size_t added = 0;
    rc = tool_corpus_train(db, &corpus, seed, err, sizeof err);
    double t1 = tool_now();
    if (!rc)
        rc = tool_corpus_ingest(db, &corpus, batch, 0, &added, err, sizeof err);
    double t2 = tool_now();
    if (rc) {
        fprintf(stderr, "tartan build: %s: %s\n", tartan_err_name(rc), err);
        if (added)
            fprintf(stderr, "tartan build: %s holds the first %zu documents\n", path, added);
    } else {
        tartan_index_info info;
        if (tartan_info(db, &info) == 0)
            fprintf(stderr,
                    "built %s: %llu documents, %llu tokens, %u centroids; training %.1f s, "
                    "adding %.1f s\n",
                    path, (unsigned long long)info.n_docs, (unsigned long long)info.n_tokens,
                    info.n_centroids, t1 - t0, t2 - t1);
        if (calibrate)
            rc = tool_calibrate_db(db, "build", 1, NULL, NULL);
    }
    tartan_close(db);
    tool_corpus_close(&corpus);
    return rc ? 1 : 0;
}
