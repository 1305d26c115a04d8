/*
 * search_run.h: `tartan search`'s whole command (options, query file, batches, TREC or JSONL
 * output, summary) over a search backend: one index in this process (`tartan search`), or the
 * shards of an index over MPI (`tartan-mpi search`, tools/mpi_search.c), so that both take
 * the same options and write the same runs.
 */
#ifndef TARTAN_TOOLS_SEARCH_RUN_H
#define TARTAN_TOOLS_SEARCH_RUN_H

#include "tartan.h"

/* Where the searches go. Every function returns 0 or a tartan code; errmsg gives the last
 * failure's message, starting with the code's name. */
typedef struct tool_search_backend {
    /* Opens the index at path for searching; fills *info (dim is what the command checks). */
    int (*open)(void *ctx, const char *path, tartan_index_info *info);
    /* tartan_search's contract: the results are freed with tartan_results_free. */
    int (*search)(void *ctx, const tartan_queries *q, const tartan_search_params *p,
                  tartan_results **r);
    const char *(*errmsg)(void *ctx);
    void (*close)(void *ctx); /* also when open failed or was never called */
    void *ctx;
    int concurrent; /* search may be called from two threads at once */
    /* Told, before the first search, how many batches the command keeps in flight (1 or 2;
     * NULL: not wanted). */
    void (*inflight)(void *ctx, int batches);
} tool_search_backend;

/* Runs `tartan search` with argv (from the command's own name on) through be
 * (tool_cmd_search passes one index in this process). Returns the exit status: 0, 1 failure,
 * 2 usage. be->close is called once at the end, whatever happened. */
int tool_search_run(int argc, char **argv, const tool_search_backend *be);

#endif
