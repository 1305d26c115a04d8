/*
 * mpi_delete.c: `tartan-mpi delete INDEX --ids FILE`: every rank reads the id list and deletes
 * the ids its shard owns (tartan_shard_of), in one transaction per shard. Deleting is
 * idempotent (ids a shard lacks are skipped), so a delete that failed on some rank is
 * completed by running it again.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "errbuf.h"
#include "idlist.h"
#include "mpi_commands.h"
#include "mpi_util.h"
#include "tartan.h"

static void usage(FILE *f)
{
    if (f)
        fprintf(f, "usage: tartan-mpi delete INDEX --ids FILE\n\n"
                   "Deletes the documents whose ids FILE lists (one a line), each from the shard\n"
                   "that holds it, in one transaction per shard.\n");
}

int tool_mpi_cmd_delete(int argc, char **argv)
{
    const char *prog = "tartan-mpi delete";
    static const struct option opts[] = {
        {"ids", required_argument, NULL, 'i'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    FILE *out = tool_mpi_rank ? NULL : stdout, *errf = tool_mpi_rank ? NULL : stderr;
    const char *ids = NULL;
    int c;
    optind = 1;
    opterr = errf != NULL;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'i') {
            ids = optarg;
        } else if (c == 'h') {
            usage(out);
            return 0;
        } else {
            usage(errf);
            return 2;
        }
    }
    if (optind != argc - 1 || !ids) {
        usage(errf);
        return 2;
    }
    char err[1400] = "";
    tool_idlist list = {0};
    int rc = tool_idlist_read(&list, ids, err, sizeof err);
    tartan_db *db = NULL;
    tartan_options o;
    tartan_options_init(&o);
    if (!rc)
        rc = tool_mpi_open_shard(argv[optind], &o, &db, err, sizeof err);
    int status = 1;
    if (tool_mpi_failed(prog, rc, err))
        goto done;
    const char **mine = malloc((list.n ? list.n : 1) * sizeof *mine);
    size_t n = 0, deleted = 0;
    if (!mine) {
        rc = tool_fail(err, sizeof err, ENOMEM, "out of memory");
    } else {
        for (size_t i = 0; i < list.n; i++)
            if (tartan_shard_of(list.ids[i], (uint32_t)tool_mpi_size) == (uint32_t)tool_mpi_rank)
                mine[n++] = list.ids[i];
        if ((rc = tartan_delete(db, mine, n, &deleted)))
            tool_fail(err, sizeof err, rc, "%s", tool_mpi_detail(tartan_errmsg(db)));
    }
    free(mine);
    uint64_t total = tool_mpi_sum(deleted);
    if (tool_mpi_failed(prog, rc, err)) {
        if (tool_mpi_rank == 0)
            fprintf(stderr, "%s: running it again completes it (deleting is idempotent)\n", prog);
        goto done;
    }
    if (tool_mpi_rank == 0)
        fprintf(stderr, "deleted %llu documents (%llu ids not in the index)\n",
                (unsigned long long)total, (unsigned long long)(list.n - total));
    status = 0;
done:
    tartan_close(db);
    tool_idlist_free(&list);
    return status;
}
