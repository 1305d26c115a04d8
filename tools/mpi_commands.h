/*
 * mpi_commands.h: tartan-mpi's subcommands (tools/tartan_mpi.c dispatches), each run by every
 * rank of the job with the same arguments. Each returns the process's exit status (0, 1
 * failure, 2 usage), the same on every rank.
 */
#ifndef TARTAN_TOOLS_MPI_COMMANDS_H
#define TARTAN_TOOLS_MPI_COMMANDS_H

/* tools/mpi_ingest.c */
int tool_mpi_cmd_build(int argc, char **argv);
int tool_mpi_cmd_add(int argc, char **argv);
/* tools/mpi_delete.c */
int tool_mpi_cmd_delete(int argc, char **argv);
/* tools/mpi_info.c */
int tool_mpi_cmd_info(int argc, char **argv);
int tool_mpi_cmd_check(int argc, char **argv);
/* tools/mpi_search.c */
int tool_mpi_cmd_search(int argc, char **argv);

#endif
