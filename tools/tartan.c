/*
 * tartan.c: the command-line tool's entry point. Dispatches to one subcommand per file
 * (tools/cmd_*.c) through the table below.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tartan.h"

/* The subcommands, in the order --help lists them. */
static const tool_cmd commands[] = {
    {"build", tool_cmd_build, "create an index from embeddings.npy + doclens.npy"},
    {"add", tool_cmd_add, "add documents to an index"},
    {"delete", tool_cmd_delete, "delete documents by id"},
    {"info", tool_cmd_info, "counts, dimensions and space of an index"},
    {"search", tool_cmd_search, "search an index: TREC run or JSON lines of the top k"},
    {"check", tool_cmd_check, "verify a whole index (--repair: salvage it); status 1 if damaged"},
    {"calibrate", tool_cmd_calibrate, "measure and store how wide searches must probe"},
    {"model", tool_cmd_model, "write an index's trained model, for build --model"},
    {"compact", tool_cmd_compact, "rewrite an index without free pages (or convert version 1)"},
    {"gen", tool_cmd_gen, "write a synthetic ColBERT-like corpus, queries and qrels"},
    {"eval", tool_cmd_eval, "score a TREC run against qrels (trec_eval's measures)"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan [--help] [--version] COMMAND [ARGS...]\n\n"
               "tartan builds, searches and evaluates late-interaction (ColBERT, ColPali)\n"
               "indexes stored in LMDB.\n\n");
    if (commands[0].name) {
        fprintf(f, "commands:\n");
        for (const tool_cmd *c = commands; c->name; c++)
            fprintf(f, "  %-10s %s\n", c->name, c->summary);
        fprintf(f, "\n'tartan COMMAND --help' describes a command.\n");
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        printf("tartan %s\n", tartan_version(NULL, NULL, NULL));
        return 0;
    }
    for (const tool_cmd *c = commands; c->name; c++)
        if (!strcmp(argv[1], c->name))
            return c->fn(argc - 1, argv + 1);
    fprintf(stderr, "tartan: unknown command '%s' (try 'tartan --help')\n", argv[1]);
    return 2;
}
