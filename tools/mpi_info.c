/*
 * mpi_info.c: `tartan-mpi info INDEX` (each shard's counts and space, the totals, and whether
 * the shards share one model) and `tartan-mpi check INDEX` (tartan_check on every shard in
 * parallel, each problem printed by rank 0 as "shard R: KIND: message", plus the shards'
 * models compared). check exits 0 when every shard is sound and all share one model.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "mpi_commands.h"
#include "mpi_util.h"
#include "tartan.h"

/* Opens this rank's shard read-only; collective; 1 after a report. */
static int open_ro(const char *prog, const char *index, tartan_db **db)
{
    char err[1400] = "";
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    int rc = tool_mpi_open_shard(index, &o, db, err, sizeof err);
    return tool_mpi_failed(prog, rc, err);
}

static int one_index_arg(int argc, char **argv, const char *name, const char *help)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        if (tool_mpi_rank == 0)
            printf("usage: tartan-mpi %s INDEX\n\n%s\n", name, help);
        return 0;
    }
    if (argc != 2) {
        if (tool_mpi_rank == 0)
            fprintf(stderr, "usage: tartan-mpi %s INDEX\n", name);
        return 2;
    }
    return -1;
}

int tool_mpi_cmd_info(int argc, char **argv)
{
    const char *prog = "tartan-mpi info";
    int st = one_index_arg(argc, argv, "info",
                           "Prints each shard's documents, tokens and space, the totals, and\n"
                           "whether every shard has the same model.");
    if (st >= 0)
        return st;
    tartan_db *db = NULL;
    if (open_ro(prog, argv[1], &db))
        return 1;
    char err[1400] = "";
    tartan_index_info mine;
    int rc = tartan_info(db, &mine);
    if (rc)
        tool_fail(err, sizeof err, rc, "%s", tool_mpi_detail(tartan_errmsg(db)));
    if (tool_mpi_failed(prog, rc, err)) {
        tartan_close(db);
        return 1;
    }
    uint32_t crc = 0;
    size_t mlen = 0;
    int model_rc = tool_mpi_same_model(db, &crc, &mlen, err, sizeof err);
    /* Each shard's search calibration (its own: see tools/mpi_ingest.c): calibrated (-1: the
     * record could not be read), stale, recall@10 on its queries, probe margin at k 10. */
    tartan_calibration cal;
    double mycal[4] = {-1, 0, 0, 0}, *cals = NULL;
    if (tartan_calibration_get(db, &cal) == 0) {
        mycal[0] = cal.calibrated;
        mycal[1] = cal.stale;
        mycal[2] = cal.recall_k10;
        mycal[3] = cal.margin_k10;
    }
    tartan_index_info *all = NULL;
    if (tool_mpi_rank == 0) {
        all = malloc((size_t)tool_mpi_size * sizeof *all);
        cals = malloc((size_t)tool_mpi_size * sizeof mycal);
    }
    MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0,
               MPI_COMM_WORLD);
    MPI_Gather(mycal, 4, MPI_DOUBLE, cals, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (tool_mpi_rank == 0 && all) {
        tartan_index_info t = {0};
        printf("index          %s (%d shards)\n", argv[1], tool_mpi_size);
        printf("%-6s %12s %14s %10s %16s %16s\n", "shard", "documents", "tokens", "centroids",
               "data file (B)", "ivf entries");
        for (int r = 0; r < tool_mpi_size; r++) {
            const tartan_index_info *i = &all[r];
            printf("%-6d %12llu %14llu %10u %16llu %16llu\n", r, (unsigned long long)i->n_docs,
                   (unsigned long long)i->n_tokens, i->n_centroids,
                   (unsigned long long)i->bytes_file, (unsigned long long)i->ivf_entries);
            t.n_docs += i->n_docs;
            t.n_tokens += i->n_tokens;
            t.bytes_file += i->bytes_file;
            t.ivf_entries += i->ivf_entries;
        }
        printf("%-6s %12llu %14llu %10s %16llu %16llu\n", "total", (unsigned long long)t.n_docs,
               (unsigned long long)t.n_tokens, "", (unsigned long long)t.bytes_file,
               (unsigned long long)t.ivf_entries);
        printf("dim            %u\nnbits          %u\n", all[0].dim, all[0].nbits);
        if (model_rc)
            printf("model          NOT SHARED: %s\n", err);
        else
            printf("model          one for all shards (%zu bytes, CRC-32C %08x)\n", mlen, crc);
        for (int r = 0; cals && r < tool_mpi_size; r++) {
            const double *c = cals + 4 * r;
            printf("%s shard %d: ", r ? "              " : "calibration   ", r);
            if (c[0] < 0)
                printf("unreadable\n");
            else if (c[0] == 0)
                printf("none (built-in margins)\n");
            else
                printf("recall@10 %.4f, probe margin %.4f at k 10%s\n", c[2], c[3],
                       c[1] ? "; STALE" : "");
        }
    }
    free(cals);
    free(all);
    tartan_close(db);
    return 0;
}

typedef struct problems {
    char *text;
    size_t len, cap;
} problems;

static int collect(void *ctx, const char *kind, const char *message)
{
    problems *p = ctx;
    size_t need = strlen(kind) + strlen(message) + 4;
    if (p->len + need + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 4096;
        while (cap < p->len + need + 1)
            cap *= 2;
        char *t = realloc(p->text, cap);
        if (!t)
            return 1; /* stop: the check still reports TARTAN_ECORRUPT */
        p->text = t;
        p->cap = cap;
    }
    p->len += (size_t)snprintf(p->text + p->len, p->cap - p->len, "%s: %s\n", kind, message);
    return 0;
}

int tool_mpi_cmd_check(int argc, char **argv)
{
    const char *prog = "tartan-mpi check";
    int st = one_index_arg(argc, argv, "check",
                           "Verifies every shard (tartan check) in parallel and that the shards\n"
                           "share one model; prints each problem as 'shard R: KIND: message'.\n"
                           "Exit status 0 when all is sound, 1 when not.");
    if (st >= 0)
        return st;
    tartan_db *db = NULL;
    if (open_ro(prog, argv[1], &db))
        return 1;
    problems p = {0};
    size_t n = 0;
    int rc = tartan_check(db, collect, &p, &n);
    char err[1400] = "";
    if (rc && rc != TARTAN_ECORRUPT)
        tool_fail(err, sizeof err, rc, "%s", tool_mpi_detail(tartan_errmsg(db)));
    int could_not = tool_mpi_failed(prog, rc && rc != TARTAN_ECORRUPT ? rc : 0, err);
    int model_rc = tool_mpi_same_model(db, NULL, NULL, err, sizeof err);
    tartan_index_info info = {0};
    tartan_info(db, &info);
    uint64_t docs = tool_mpi_sum(info.n_docs), toks = tool_mpi_sum(info.n_tokens);
    uint64_t total = tool_mpi_sum(n) + (model_rc != 0);
    char **texts = tool_mpi_gather_text(p.text ? p.text : "");
    if (tool_mpi_rank == 0) {
        for (int r = 0; r < tool_mpi_size; r++) {
            for (char *line = texts[r], *nl; *line; line = nl + 1) {
                nl = strchr(line, '\n');
                *nl = 0;
                printf("shard %d: %s\n", r, line);
            }
            free(texts[r]);
        }
        free(texts);
        if (model_rc)
            printf("model: %s\n", err);
        if (!could_not && total == 0)
            printf("%s: sound (%d shards, %llu documents, %llu tokens)\n", argv[1], tool_mpi_size,
                   (unsigned long long)docs, (unsigned long long)toks);
        else if (total)
            printf("%s: %llu problem%s\n", argv[1], (unsigned long long)total,
                   total == 1 ? "" : "s");
    }
    free(p.text);
    tartan_close(db);
    return could_not || total ? 1 : 0;
}
