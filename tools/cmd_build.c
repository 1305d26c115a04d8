/*
 * cmd_build.c: `tartan build INDEX --embeddings E.npy --doclens L.npy [--ids ids.txt]
 * [--nbits 2] [--centroids K] [--batch N] [--seed S] [--sample N] [--kmeans-iters N]
 * [--device auto|cpu|cuda] [--model FILE]`: creates an index, trains it from a sample drawn
 * over the whole corpus (or takes the model of FILE, from `tartan model`), then adds the corpus
 * in batches (one transaction each), in memory bounded by the batch and the sample. k-means and
 * encoding run on the device (a GPU when there is one). Then the index is compacted
 * (tartan_compact: the batches' transactions leave free pages behind) and calibrates its
 * search (tartan_calibrate) unless --no-calibrate. Options: tools/corpus_args.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "corpus_args.h"
#include "ingest.h"
#include "progress.h"
#include "tartan.h"

int tool_cmd_build(int argc, char **argv)
{
    tool_build_args a;
    int st = tool_build_args_parse(argc, argv, "tartan", stdout, stderr, &a);
    if (st >= 0)
        return st;
    const char *path = a.path;
    char err[1024];
    tool_corpus corpus;
    int rc = tool_corpus_open(&corpus, a.emb, a.lens, a.ids, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tartan build: %s: %s\n", tartan_err_name(rc), err);
        return 1;
    }
    tartan_options o;
    tool_build_options(&a, corpus.dim, &o);
    tartan_db *db;
    double t0 = tool_now();
    if ((rc = tartan_open(path, &o, &db))) {
        fprintf(stderr, "tartan build: %s\n", tartan_errmsg(NULL));
        tool_corpus_close(&corpus);
        return 1;
    }
    if (tool_trace())
        fprintf(stderr, "training: the index created in %.3f s\n", tool_now() - t0);
    size_t added = 0;
    if (a.model)
        rc = tool_model_import_file(db, a.model, err, sizeof err);
    else
        rc = tool_corpus_train(db, &corpus, a.seed, err, sizeof err);
    double t1 = tool_now();
    corpus.batch_tokens = tool_batch_tokens(o.device);
    if (!rc)
        rc = tool_corpus_ingest(db, &corpus, a.batch, 0, &added, err, sizeof err);
    double t2 = tool_now();
    /* Each batch's transaction leaves the pages it replaced free (reused by later changes,
     * never given back): a fresh index is written once more without them. A file system
     * without atomic directory exchange keeps the index as built. */
    int compacted = 0;
    if (!rc) {
        int crc = tartan_compact(db);
        if (crc)
            fprintf(stderr, "tartan build: not compacted (the index is complete): %s\n",
                    tartan_errmsg(db));
        compacted = crc == 0;
    }
    double t3 = tool_now();
    if (rc) {
        fprintf(stderr, "tartan build: %s: %s\n", tartan_err_name(rc), err);
        if (added)
            fprintf(stderr, "tartan build: %s holds the first %zu documents\n", path, added);
    } else {
        tartan_index_info info;
        if (tartan_info(db, &info) == 0) {
            fprintf(stderr,
                    "built %s: %llu documents, %llu tokens, %u centroids; training %.1f s, "
                    "adding %.1f s",
                    path, (unsigned long long)info.n_docs, (unsigned long long)info.n_tokens,
                    info.n_centroids, t1 - t0, t2 - t1);
            if (compacted)
                fprintf(stderr, ", compacting %.1f s", t3 - t2);
            fprintf(stderr, "\n");
        }
        if (!a.no_calibrate)
            rc = tool_calibrate_db(db, "build", 1, NULL, NULL);
    }
    tartan_close(db);
    tool_corpus_close(&corpus);
    return rc ? 1 : 0;
}
