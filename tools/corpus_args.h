/*
 * corpus_args.h: the options of the commands that feed a corpus into an index, `build` and
 * `add`, parsed once for `tartan` (tools/cmd_build.c, tools/cmd_add.c) and `tartan-mpi`
 * (tools/mpi_ingest.c), which take the same options.
 */
#ifndef TARTAN_TOOLS_CORPUS_ARGS_H
#define TARTAN_TOOLS_CORPUS_ARGS_H

#include <stddef.h>
#include <stdio.h>

#include "tartan.h"

typedef struct tool_build_args {
    const char *path;             /* INDEX */
    const char *emb, *lens, *ids; /* --embeddings, --doclens, --ids (NULL: row numbers) */
    const char *model;            /* --model FILE: import instead of training, or NULL */
    size_t nbits, k, batch, seed, sample, iters;
    tartan_device device;
    int no_calibrate; /* --no-calibrate: no search calibration after the documents */
    unsigned codec;   /* --codec: TARTAN_CODEC_SCALAR (default) or TARTAN_CODEC_AXES */
} tool_build_args;

/*
 * Parses `PROG build`'s arguments (argv from the command's name on). Messages and --help go to
 * out and err (NULL: nowhere, for the ranks of an MPI job that are not rank 0). Returns -1 to
 * go on, else the exit status: 0 after --help, 2 for a usage error.
 */
int tool_build_args_parse(int argc, char **argv, const char *prog, FILE *out, FILE *err,
                          tool_build_args *a);

/* The tartan_open options that create the index the arguments describe (dim from the corpus). */
void tool_build_options(const tool_build_args *a, size_t dim, tartan_options *o);

typedef struct tool_add_args {
    const char *path;
    const char *emb, *lens, *ids;
    size_t batch;
    unsigned flags; /* TARTAN_REPLACE */
    tartan_device device;
    int no_calibrate; /* --no-calibrate: no calibration even when the documents changed */
} tool_add_args;

/* The same for `PROG add`. */
int tool_add_args_parse(int argc, char **argv, const char *prog, FILE *out, FILE *err,
                        tool_add_args *a);

#endif
