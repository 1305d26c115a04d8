/*
 * mpi_util.h: what tartan-mpi's commands share: the ranks, where each rank's shard lives,
 * collective failure reports, and moving byte strings between ranks.
 *
 * A sharded index is a directory INDEX holding one tartan index per rank,
 * INDEX/shard-R-of-P (R = 0 .. P-1), each on the disk of the host its rank runs on. Rank R of
 * an `mpirun -np P` job opens INDEX/shard-R-of-P; a job with another number of ranks finds no
 * shard of its own and says how many ranks the index was built with. Every document lives in
 * the shard tartan_shard_of(id, P) names.
 *
 * Every function named collective here must be called by every rank, in the same order.
 */
#ifndef TARTAN_TOOLS_MPI_UTIL_H
#define TARTAN_TOOLS_MPI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "tartan.h"

/* This process's rank and the job's size (set by tool_mpi_init). */
extern int tool_mpi_rank, tool_mpi_size;
/* Whether any thread may call MPI, one at a time (MPI_THREAD_SERIALIZED or better); else only
 * the main thread (MPI_THREAD_FUNNELED). */
extern int tool_mpi_serialized;

/* Starts MPI (thread level funneled: OpenMP threads never call MPI) and, for ranks of a host
 * with several GPUs, gives each rank its own (tool_mpi_pick_gpu). 0 or an MPI error. */
int tool_mpi_init(int *argc, char ***argv);
void tool_mpi_finalize(void);

/*
 * Makes each rank of a host use its own GPU: when CUDA_VISIBLE_DEVICES is unset, sets it to
 * the rank's index among the host's ranks modulo the host's GPUs (the entries of
 * /proc/driver/nvidia/gpus); when it lists devices, keeps that entry of the list. Runs before
 * anything touches CUDA. Collective (ranks of a host find each other).
 */
void tool_mpi_pick_gpu(void);

/*
 * Collective: each rank passes its own result (0 or a tartan code) and message. When every
 * rank failed, rank 0 prints its message once ("PROG: NAME: message"); otherwise each rank
 * that failed prints its own, naming its rank. Returns 1 on every rank when any failed.
 */
int tool_mpi_failed(const char *prog, int rc, const char *msg);

/* A library message without its leading code name ("TARTAN_EDIM: x" -> "x"). */
const char *tool_mpi_detail(const char *msg);

/* Collective: 1 on every rank when any rank passes nonzero. */
int tool_mpi_any(int flag);

/* Collective: sums / maxima over ranks (every rank gets the result). */
uint64_t tool_mpi_sum(uint64_t v);
double tool_mpi_max(double v);

/* Collective: root's len bytes of buf into every rank's buf (any length: sent in pieces). */
void tool_mpi_bcast(void *buf, size_t len, int root);

/* Collective: root's string of *len bytes to every rank, where *buf is allocated (malloc,
 * with a NUL after the last byte). 0, or ENOMEM on every rank when any rank lacked memory. */
int tool_mpi_bcast_alloc(char **buf, size_t *len, int root);

/* The job's ranks as a shared training's group (tartan_train_shared): MPI_Allreduce,
 * MPI_Bcast and point-to-point sends to rank 0 on MPI_COMM_WORLD, from the main thread. MPI's
 * default error handler ends the job on a failed call, so a failure is every rank's. */
void tool_mpi_train_group(tartan_train_group *g);

/* Collective: each rank's text to rank 0: there texts[r] (malloc'd, NUL-terminated; free each
 * and the array), NULL elsewhere. */
char **tool_mpi_gather_text(const char *text);

/* The directory of rank's shard: INDEX/shard-R-of-P. */
void tool_mpi_shard_path(const char *index, int rank, int size, char *out, size_t cap);

/*
 * Opens this rank's shard with options o (TARTAN_CREATE: creates INDEX and the shard). When
 * the shard is missing, the message says how many ranks INDEX's shards were built for.
 * 0 or the code, with the message in err.
 */
int tool_mpi_open_shard(const char *index, const tartan_options *o, tartan_db **db, char *err,
                        size_t errlen);

/*
 * For search: the same, or, where INDEX holds the shards of S ranks with S dividing the job's
 * ranks (replicas, tools/mpi_search.c), shard rank % S. *n_shards: the job's ranks or S.
 */
int tool_mpi_open_search_shard(const char *index, const tartan_options *o, tartan_db **db,
                               int *n_shards, char *err, size_t errlen);

/*
 * Collective: compares the shards' models (tartan_model_export's checksum and length). 0 when
 * every shard has the model of shard 0; else a code and, in err, which shards differ or have
 * none. *crc, *len: shard 0's (may be NULL).
 */
int tool_mpi_same_model(tartan_db *db, uint32_t *crc, size_t *len, char *err, size_t errlen);

#endif
