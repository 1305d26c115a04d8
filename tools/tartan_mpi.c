/*
 * tartan_mpi.c: the entry point of `tartan-mpi`, the sharded index over MPI ranks
 * (`mpirun -np P tartan-mpi COMMAND ...`): every rank runs the same command on its own shard
 * (tools/mpi_util.h says where shards live), and rank 0 speaks for the job. The subcommands
 * take the options of the `tartan` command of the same name.
 */
#include <stdio.h>
#include <string.h>

#include "mpi_commands.h"
#include "mpi_util.h"
#include "tartan.h"

typedef struct mpi_cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} mpi_cmd;

static const mpi_cmd commands[] = {
    {"build", tool_mpi_cmd_build, "create a sharded index: one model, every rank its documents"},
    {"add", tool_mpi_cmd_add, "add documents, each to the shard its id hashes to"},
    {"delete", tool_mpi_cmd_delete, "delete documents by id from their shards"},
    {"search", tool_mpi_cmd_search, "search every shard, merge: TREC run or JSON lines"},
    {"info", tool_mpi_cmd_info, "counts and space of every shard, and their model"},
    {"check", tool_mpi_cmd_check, "verify every shard and that they share one model"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mpirun -np P tartan-mpi COMMAND INDEX [ARGS...]\n\n"
               "tartan-mpi keeps one index as P shards, INDEX/shard-R-of-P, one per MPI rank,\n"
               "each on its rank's host, all encoded with one model; documents go to the shard\n"
               "their id hashes to. Run every command with the number of ranks the index was\n"
               "built with. The commands take the options of 'tartan COMMAND'.\n\n"
               "commands:\n");
    for (const mpi_cmd *c = commands; c->name; c++)
        fprintf(f, "  %-8s %s\n", c->name, c->summary);
}

int main(int argc, char **argv)
{
    if (tool_mpi_init(&argc, &argv)) {
        fprintf(stderr, "tartan-mpi: MPI_Init failed\n");
        return 1;
    }
    int status = 2;
    if (argc < 2) {
        if (tool_mpi_rank == 0)
            usage(stderr);
    } else if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (tool_mpi_rank == 0)
            usage(stdout);
        status = 0;
    } else if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        if (tool_mpi_rank == 0)
            printf("tartan-mpi %s\n", tartan_version(NULL, NULL, NULL));
        status = 0;
    } else {
        const mpi_cmd *c = commands;
        while (c->name && strcmp(argv[1], c->name))
            c++;
        if (c->name)
            status = c->fn(argc - 1, argv + 1);
        else if (tool_mpi_rank == 0)
            fprintf(stderr, "tartan-mpi: unknown command '%s' (try 'tartan-mpi --help')\n",
                    argv[1]);
    }
    fflush(stdout);
    tool_mpi_finalize();
    return status;
}
