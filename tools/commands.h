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

/* tools/cmd_search.c: searches an index for the queries of a .npy file. */
int tool_cmd_search(int argc, char **argv);
/* tools/cmd_check.c: verifies a whole index (reliability). */
int tool_cmd_check(int argc, char **argv);

#endif
