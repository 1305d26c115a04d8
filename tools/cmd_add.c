/*
 * cmd_add.c: `tartan add INDEX --embeddings E.npy --doclens L.npy [--ids ids.txt] [--batch N]
 * [--replace] [--device auto|cpu|cuda]`: adds a corpus to an existing index in batches (one
 * transaction each), with the index's centroids and codec (an untrained index trains from the
 * first batch); encoding runs on the device. Calibrates the search again when the documents
 * have changed more than twofold since its last calibration (or it never had one), unless
 * --no-calibrate. Options: tools/corpus_args.c.
 */
#include <stdio.h>
#include <stdlib.h>

#include "commands.h"
#include "corpus_args.h"
#include "ingest.h"
#include "tartan.h"

int tool_cmd_add(int argc, char **argv)
{
    tool_add_args a;
    int st = tool_add_args_parse(argc, argv, "tartan", stdout, stderr, &a);
    if (st >= 0)
        return st;
    char err[1024];
    tool_corpus corpus;
    int rc = tool_corpus_open(&corpus, a.emb, a.lens, a.ids, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tartan add: %s: %s\n", tartan_err_name(rc), err);
        return 1;
    }
    tartan_options o;
    tartan_options_init(&o);
    o.dim = corpus.dim;
    o.device = a.device;
    tartan_db *db;
    if ((rc = tartan_open(a.path, &o, &db))) {
        fprintf(stderr, "tartan add: %s\n", tartan_errmsg(NULL));
        tool_corpus_close(&corpus);
        return 1;
    }
    size_t added = 0;
    corpus.batch_tokens = tool_batch_tokens(o.device);
    rc = tool_corpus_ingest(db, &corpus, a.batch, a.flags, &added, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tartan add: %s: %s\n", tartan_err_name(rc), err);
        fprintf(stderr, "tartan add: %zu documents were added before the failure\n", added);
    } else if (!a.no_calibrate) {
        /* Again once the documents have changed more than twofold since the last time. */
        rc = tool_calibrate_db(db, "add", 0, NULL, NULL);
    }
    tartan_close(db);
    tool_corpus_close(&corpus);
    return rc ? 1 : 0;
}
