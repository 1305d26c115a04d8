/*
 * mpi_ingest.c: `tartan-mpi build` and `tartan-mpi add`: the corpus goes to the shards, each
 * document to the shard tartan_shard_of(id, P) names, every rank encoding and writing its own
 * documents in parallel. Every rank reads the same corpus files (a shared file system, or a
 * copy on each host) but touches only its own documents' rows.
 *
 * build: every rank draws its share of the training sample from its own documents (shares in
 * proportion to the ranks' documents, tartan_sample_docs of the whole corpus in all), and all
 * ranks train together (tartan_train_shared: each assigns its own share at every k-means
 * iteration, the centroid sums are added up over MPI), so that every shard stores the same
 * model and encodes alike; or, given --model, every rank imports that file's model; then every
 * rank adds its documents. Then every shard calibrates its search on its own documents, its
 * exhaustive reference a sample at the whole corpus's rate (calibrate_shards), unless
 * --no-calibrate; an add calibrates again the shards whose documents
 * changed more than twofold.
 *
 * Failures: every batch is one transaction in one shard. When a rank fails or is killed,
 * each shard holds whole batches of its documents (a prefix of them, in file order) and is
 * sound. Running the same `tartan-mpi add` again with --replace converges: every document
 * ends in its shard exactly once, as given (ids it held already are replaced by the same
 * document). A build that failed before the model reached every shard is built again from
 * scratch (remove INDEX); one that failed while adding documents is completed the same way as
 * an add, with `tartan-mpi add --replace`.
 */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corpus_args.h"
#include "errbuf.h"
#include "ingest.h"
#include "mpi_commands.h"
#include "mpi_util.h"
#include "progress.h"
#include "tartan.h"
#include "textfile.h"

/* keep[i]: document i belongs to this rank's shard. *n, *tokens: this rank's documents. */
static uint8_t *route(const tool_corpus *c, size_t *n, size_t *tokens)
{
    uint8_t *keep = malloc(c->n_docs ? c->n_docs : 1);
    *n = *tokens = 0;
    if (!keep)
        return NULL;
    char buf[21];
    for (size_t i = 0; i < c->n_docs; i++) {
        keep[i] = tartan_shard_of(tool_corpus_id(c, i, buf), (uint32_t)tool_mpi_size) ==
                  (uint32_t)tool_mpi_rank;
        if (keep[i]) {
            (*n)++;
            *tokens += tool_corpus_doclen(c, i);
        }
    }
    return keep;
}

/* This rank's share of a sample of want documents: want times the documents of ranks before it
 * and up to it, over all documents, rounded down, minus the same for the ranks before it. */
static size_t sample_share(size_t want, size_t n_docs, uint64_t mine)
{
    uint64_t before = 0;
    MPI_Exscan(&mine, &before, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (tool_mpi_rank == 0)
        before = 0;
    double w = (double)want, n = (double)(n_docs ? n_docs : 1);
    return (size_t)(w * (double)(before + mine) / n) - (size_t)(w * (double)before / n);
}

/*
 * Trains the shards. Without a model file, every rank draws its share of the sample from its
 * own documents and all of them train together (tartan_train_shared): each runs k-means's
 * assignment over its own share on its own device and the ranks add up the centroid sums at
 * every iteration, so k-means's time divides between them, and every shard stores the same
 * model; nothing is gathered on rank 0 but the first centroids and the held-out residuals. With
 * a model file, rank 0 reads it and every rank imports it. Prints where the time went (the
 * slowest rank's seconds of each part). Collective; 0 on every rank or 1 after reporting.
 */
static int train_shards(const char *prog, tartan_db *db, tool_corpus *c, const tool_build_args *a,
                        const uint8_t *keep, size_t mine)
{
    char err[1400] = "";
    int rc = 0;
    if (a->model) {
        double t0 = tool_now();
        char *model = NULL;
        size_t mlen = 0;
        if (tool_mpi_rank == 0 && (rc = tool_file_read(a->model, &model, &mlen, err, sizeof err)))
            model = NULL;
        /* Rank 0's outcome decides; it alone reports it. */
        MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (rc) {
            if (tool_mpi_rank == 0)
                fprintf(stderr, "%s: %s: %s\n", prog, tartan_err_name(rc), err);
            free(model);
            return 1;
        }
        if (tool_mpi_bcast_alloc(&model, &mlen, 0)) {
            if (tool_mpi_rank == 0)
                fprintf(stderr, "%s: ENOMEM: out of memory for the model\n", prog);
            free(model);
            return 1;
        }
        if ((rc = tartan_model_import(db, model, mlen)))
            tool_fail(err, sizeof err, rc, "%s", tool_mpi_detail(tartan_errmsg(db)));
        free(model);
        double secs = tool_mpi_max(tool_now() - t0);
        if (tool_mpi_failed(prog, rc, err))
            return 1;
        if (tool_mpi_rank == 0)
            fprintf(stderr, "model %s: read, broadcast and imported in %.2f s (slowest rank)\n",
                    a->model, secs);
        return 0;
    }
    double t0 = tool_now();
    size_t want = tartan_sample_docs(db, c->n_docs);
    tool_sample s = {0};
    rc = tool_corpus_sample(c, sample_share(want, c->n_docs, mine), a->seed, keep, &s, err,
                            sizeof err);
    double sample_s = tool_mpi_max(tool_now() - t0);
    if (tool_mpi_failed(prog, rc, err))
        return 1;
    tartan_batch b = {0};
    b.n_docs = s.n;
    b.doclens = s.lens;
    b.embeddings = s.emb;
    b.n_rows = s.tokens;
    b.dim = c->dim;
    b.dtype = c->dtype;
    tartan_train_group g;
    tool_mpi_train_group(&g);
    tartan_train_stats st;
    int tty = tool_mpi_rank == 0 && isatty(STDERR_FILENO);
    uint64_t docs = tool_mpi_sum(s.n), toks = tool_mpi_sum(s.tokens);
    if (tty)
        fprintf(stderr,
                "training on %llu sampled documents (%llu tokens) over %d ranks: k-means, "
                "codec...",
                (unsigned long long)docs, (unsigned long long)toks, tool_mpi_size);
    rc = tartan_train_shared(db, &b, c->n_rows, &g, &st);
    if (tty)
        fprintf(stderr, rc ? " failed\n" : " done\n");
    tool_sample_free(&s);
    if (rc)
        tool_fail(err, sizeof err, rc, "training on %zu sampled documents of this rank: %s",
                  b.n_docs, tool_mpi_detail(tartan_errmsg(db)));
    /* The ranks that failed on their own report; the others (TARTAN_EGROUP: "rank R failed")
     * stay quiet, unless every rank has only that to say (the transport failed). */
    if (tool_mpi_failed(prog, rc == TARTAN_EGROUP ? 0 : rc, err))
        return 1;
    if (tool_mpi_any(rc)) {
        if (tool_mpi_rank == 0)
            fprintf(stderr, "%s: %s: %s\n", prog, tartan_err_name(rc), err);
        return 1;
    }
    double km = tool_mpi_max(st.seconds_kmeans), codec = tool_mpi_max(st.seconds_codec);
    double store = tool_mpi_max(st.seconds_store), ex = tool_mpi_max(st.seconds_group);
    double all = tool_mpi_max(st.seconds_total);
    if (tool_mpi_rank == 0)
        fprintf(stderr,
                "trained one model over %d ranks from %llu sampled documents (%llu tokens): "
                "sampling %.2f s, k-means %.2f s, codec %.2f s, storing %.2f s, training %.2f s "
                "in all, of which exchanges %.2f s (slowest rank each)\n",
                tool_mpi_size, (unsigned long long)docs, (unsigned long long)toks, sample_s, km,
                codec, store, all, ex);
    return 0;
}

/*
 * Calibrates the adaptive search of every shard on its own documents, all shards at once, as
 * `tartan build` and `tartan add` do for one index: always after a build (force), after an
 * add only the shards whose documents changed more than twofold since their last calibration
 * (or that never had one). Each shard's calibration is its own: the model is shared, but a
 * calibration measures the index's documents (tartan_model_export leaves it out), and a shard
 * calibrated on its own documents probes at least as wide for the corpus's top k, which lies
 * among each shard's own top k. An empty shard has nothing to measure and is skipped.
 * Collective; 0 on every rank, or 1 after reporting.
 */
static int calibrate_shards(const char *prog, tartan_db *db, int force)
{
    char err[1400] = "";
    double t0 = tool_now();
    tartan_calibration cal;
    int rc = 0, ran = 0;
    /* The corpus's documents: each shard samples its reference at the rate one index of the
     * whole corpus would (tartan_calibrate_params.corpus_docs), so that the shards together
     * rank about as many documents exhaustively as that index, P times fewer each. Without
     * it, every shard of 1M documents ranked all of them on its GPU, as much as one index of
     * the whole corpus ranked. */
    tartan_index_info info;
    int irc = tartan_info(db, &info);
    uint64_t corpus = tool_mpi_sum(irc ? 0 : info.n_docs);
    tartan_calibrate_params p;
    tartan_calibrate_params_init(&p);
    p.corpus_docs = corpus;
    if (irc)
        rc = tool_fail(err, sizeof err, irc, "%s", tool_mpi_detail(tartan_errmsg(db)));
    if (!rc && !force && (rc = tartan_calibration_get(db, &cal)))
        tool_fail(err, sizeof err, rc, "%s", tool_mpi_detail(tartan_errmsg(db)));
    if (!rc && (force || !cal.calibrated || cal.stale)) {
        rc = tartan_calibrate(db, &p, &cal);
        if (rc == TARTAN_EEMPTY)
            rc = 0;
        else if (rc)
            tool_fail(err, sizeof err, rc, "calibration: %s",
                      tool_mpi_detail(tartan_errmsg(db)));
        else
            ran = 1;
    }
    double secs = tool_mpi_max(tool_now() - t0);
    if (tool_mpi_failed(prog, rc, err))
        return 1;
    uint64_t n = tool_mpi_sum((uint64_t)ran);
    /* The lowest and highest recall@10 the calibrated shards measured on their queries. */
    double lo = -tool_mpi_max(ran ? -(double)cal.recall_k10 : -2.0);
    double hi = tool_mpi_max(ran ? (double)cal.recall_k10 : -1.0);
    if (tool_mpi_rank == 0 && n)
        fprintf(stderr,
                "calibrated the search of %llu shards in %.1f s (slowest shard): default "
                "search's recall@10 on their calibration queries %.3f to %.3f\n",
                (unsigned long long)n, secs, lo, hi);
    return 0;
}

int tool_mpi_cmd_build(int argc, char **argv)
{
    const char *prog = "tartan-mpi build";
    tool_build_args a;
    int st = tool_build_args_parse(argc, argv, "tartan-mpi", tool_mpi_rank ? NULL : stdout,
                                   tool_mpi_rank ? NULL : stderr, &a);
    if (st >= 0)
        return st;
    char err[1400] = "";
    tool_corpus c;
    int rc = tool_corpus_open(&c, a.emb, a.lens, a.ids, err, sizeof err);
    if (tool_mpi_failed(prog, rc, err)) {
        if (!rc)
            tool_corpus_close(&c);
        return 1;
    }
    double t0 = tool_now();
    size_t mine = 0, tokens = 0;
    uint8_t *keep = route(&c, &mine, &tokens);
    if (!keep)
        rc = tool_fail(err, sizeof err, ENOMEM, "out of memory");
    tartan_options o;
    tool_build_options(&a, c.dim, &o);
    tartan_db *db = NULL;
    if (!rc)
        rc = tool_mpi_open_shard(a.path, &o, &db, err, sizeof err);
    int status = 1;
    if (tool_mpi_failed(prog, rc, err))
        goto done;
    if (train_shards(prog, db, &c, &a, keep, mine))
        goto done;
    double t1 = tool_now();
    size_t added = 0;
    c.batch_tokens = tool_batch_tokens(o.device);
    rc = tool_corpus_ingest_some(db, &c, keep, a.batch, 0, &added, err, sizeof err);
    double t2 = tool_now();
    double train_s = tool_mpi_max(t1 - t0), add_s = tool_mpi_max(t2 - t1);
    uint64_t total = tool_mpi_sum(added);
    if (tool_mpi_failed(prog, rc, err)) {
        if (tool_mpi_rank == 0)
            fprintf(stderr,
                    "%s: the shards hold %llu documents; 'tartan-mpi add --replace' with the "
                    "same files completes the build\n",
                    prog, (unsigned long long)total);
        goto done;
    }
    tartan_index_info info;
    uint64_t toks = tartan_info(db, &info) == 0 ? info.n_tokens : 0;
    toks = tool_mpi_sum(toks);
    if (tool_mpi_rank == 0)
        fprintf(stderr,
                "built %s over %d shards: %llu documents, %llu tokens, %u centroids; sampling "
                "and training %.1f s, adding %.1f s (slowest shard)\n",
                a.path, tool_mpi_size, (unsigned long long)total, (unsigned long long)toks,
                info.n_centroids, train_s, add_s);
    if (!a.no_calibrate && calibrate_shards(prog, db, 1))
        goto done;
    status = 0;
done:
    tartan_close(db);
    free(keep);
    tool_corpus_close(&c);
    return status;
}

int tool_mpi_cmd_add(int argc, char **argv)
{
    const char *prog = "tartan-mpi add";
    tool_add_args a;
    int st = tool_add_args_parse(argc, argv, "tartan-mpi", tool_mpi_rank ? NULL : stdout,
                                 tool_mpi_rank ? NULL : stderr, &a);
    if (st >= 0)
        return st;
    char err[1400] = "";
    tool_corpus c;
    int rc = tool_corpus_open(&c, a.emb, a.lens, a.ids, err, sizeof err);
    if (tool_mpi_failed(prog, rc, err)) {
        if (!rc)
            tool_corpus_close(&c);
        return 1;
    }
    size_t mine = 0, tokens = 0;
    uint8_t *keep = route(&c, &mine, &tokens);
    if (!keep)
        rc = tool_fail(err, sizeof err, ENOMEM, "out of memory");
    tartan_options o;
    tartan_options_init(&o);
    o.dim = c.dim;
    o.device = a.device;
    tartan_db *db = NULL;
    if (!rc)
        rc = tool_mpi_open_shard(a.path, &o, &db, err, sizeof err);
    int status = 1;
    if (tool_mpi_failed(prog, rc, err))
        goto done;
    /* Encoding with another model than the other shards' would make scores incomparable. */
    rc = tool_mpi_same_model(db, NULL, NULL, err, sizeof err);
    if (rc) {
        if (tool_mpi_rank == 0)
            fprintf(stderr, "%s: %s: the shards of %s do not share one model: %s\n", prog,
                    tartan_err_name(rc), a.path, err);
        goto done;
    }
    double t0 = tool_now();
    size_t added = 0;
    c.batch_tokens = tool_batch_tokens(o.device);
    rc = tool_corpus_ingest_some(db, &c, keep, a.batch, a.flags, &added, err, sizeof err);
    double secs = tool_mpi_max(tool_now() - t0);
    uint64_t total = tool_mpi_sum(added);
    if (tool_mpi_failed(prog, rc, err)) {
        if (tool_mpi_rank == 0)
            fprintf(stderr,
                    "%s: %llu documents were added before the failure; running the same "
                    "command again with --replace completes it\n",
                    prog, (unsigned long long)total);
        goto done;
    }
    if (tool_mpi_rank == 0)
        fprintf(stderr, "added %llu documents to %d shards in %.1f s\n", (unsigned long long)total,
                tool_mpi_size, secs);
    if (!a.no_calibrate && calibrate_shards(prog, db, 0))
        goto done;
    status = 0;
done:
    tartan_close(db);
    free(keep);
    tool_corpus_close(&c);
    return status;
}
