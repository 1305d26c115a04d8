/*
 * cmd_add.c: `tartan add INDEX --embeddings E.npy --doclens L.npy [--ids ids.txt] [--batch N]
 * [--replace] [--device auto|cpu|cuda]`: adds a corpus to an existing index in batches (one
 * transaction each), with the index's centroids and codec (an untrained index trains from the
 * first batch); encoding runs on the device. Calibrates the search again when the documents
 * have changed more than twofold since its last calibration (or it never had one).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "commands.h"
#include "ingest.h"
#include "tartan.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan add INDEX --embeddings E.npy --doclens L.npy [--ids ids.txt]\n"
               "                  [--batch N] [--replace] [--device D] [--no-calibrate]\n\n"
               "Adds documents to the index INDEX. Without --ids the ids are the row numbers\n"
               "of L.npy. An id the index has already is an error unless --replace.\n\n"
               "  --batch N    documents per transaction (default: documents of about\n"
               "               262,144 tokens)\n"
               "  --replace    replace documents whose ids exist\n"
               "  --device D   where encoding runs: auto (default: the TARTAN_DEVICE\n"
               "               variable, else a GPU when present), cpu or cuda\n"
               "  --no-calibrate  do not calibrate the search again, even when the\n"
               "               documents have changed more than twofold since the last\n"
               "               calibration (tartan info tells)\n");
}

int tool_cmd_add(int argc, char **argv)
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
    const char *emb = NULL, *lens = NULL, *ids = NULL;
    size_t batch = 0;
    unsigned flags = 0;
    int calibrate = 1;
    tartan_device device = TARTAN_DEVICE_AUTO;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
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
        case 'n':
            if (tool_parse_size(optarg, &batch) || batch == 0) {
                fprintf(stderr, "tartan add: --batch wants a number >= 1, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'r':
            flags |= TARTAN_REPLACE;
            break;
        case 'C':
            calibrate = 0;
            break;
        case 'D':
            if (tool_parse_device(optarg, &device)) {
                fprintf(stderr, "tartan add: --device wants auto, cpu or cuda, not '%s'\n", optarg);
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
    }
    if (optind != argc - 1 || !emb || !lens) {
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    char err[1024];
    tool_corpus corpus;
    int rc = tool_corpus_open(&corpus, emb, lens, ids, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tartan add: %s: %s\n", tartan_err_name(rc), err);
        return 1;
    }
    tartan_options o;
    tartan_options_init(&o);
    o.dim = corpus.dim;
    o.device = device;
    tartan_db *db;
    if ((rc = tartan_open(path, &o, &db))) {
        fprintf(stderr, "tartan add: %s\n", tartan_errmsg(NULL));
        tool_corpus_close(&corpus);
        return 1;
    }
    size_t added = 0;
    rc = tool_corpus_ingest(db, &corpus, batch, flags, &added, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tartan add: %s: %s\n", tartan_err_name(rc), err);
        fprintf(stderr, "tartan add: %zu documents were added before the failure\n", added);
    } else if (calibrate) {
        /* Again once the documents have changed more than twofold since the last time. */
        rc = tool_calibrate_db(db, "add", 0, NULL, NULL);
    }
    tartan_close(db);
    tool_corpus_close(&corpus);
    return rc ? 1 : 0;
}
