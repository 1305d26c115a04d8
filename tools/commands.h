/* commands.h: the tartan tool's subcommands, one file each (tools/cmd_<name>.c). */
#ifndef TARTAN_TOOLS_COMMANDS_H
#define TARTAN_TOOLS_COMMANDS_H

/* A subcommand gets argv from its own name on; returns the process exit status
 * (0 success, 1 failure, 2 usage error). */
typedef int (*tool_cmd_fn)(int argc, char **argv);

typedef struct tool_cmd {
    const char *name;
    tool_cmd_fn fn;
    const char *summary;
} tool_cmd;

/* tools/cmd_eval.c: scores a TREC run against qrels. */
int tool_cmd_eval(int argc, char **argv);

/* tools/cmd_gen.c: writes a synthetic corpus (tools/synth.h). */
int tool_cmd_gen(int argc, char **argv);

/* Index commands (tools/cmd_<name>.c). */
int tool_cmd_build(int argc, char **argv);
int tool_cmd_add(int argc, char **argv);
int tool_cmd_delete(int argc, char **argv);
int tool_cmd_info(int argc, char **argv);
/* tools/cmd_model.c: writes an index's trained model to a file (tartan_model_export). */
int tool_cmd_model(int argc, char **argv);

/* tools/cmd_search.c: searches an index for the queries of a .npy file. */
int tool_cmd_search(int argc, char **argv);
/* tools/cmd_check.c: verifies a whole index (reliability); --repair salvages it. */
int tool_cmd_check(int argc, char **argv);
/* tools/cmd_compact.c: rewrites an index without free pages, or converts version 1. */
int tool_cmd_compact(int argc, char **argv);

/* tools/cmd_calibrate.c: measures and stores the index's search calibration. */
int tool_cmd_calibrate(int argc, char **argv);

#include <stdio.h>

#include "tartan.h"

/* Prints what a calibration measured (tartan info, build, add, calibrate). */
void tool_calibration_print(FILE *f, const tartan_calibration *c);

/*
 * Calibrates db (queries NULL: pseudo-queries; given NULL: the defaults) when force is set, or
 * when it was never calibrated or its calibration is stale, and reports it on stderr; who
 * names the command in messages. Returns 0 or 1 (the message printed).
 */
int tool_calibrate_db(tartan_db *db, const char *who, int force, const tartan_queries *queries,
                      const tartan_calibrate_params *given);

#endif
