/*
 * gpus.h: one index searched on several GPUs of this host at once (layer prefix eng_;
 * engine/search_gpus.c). The documents are split into partitions by number (document d in
 * partition d mod P); partition p lives in its own mirror (gpu.h) on device p mod D; a search
 * runs every partition's PLAID (or exhaustive) search, one thread per device, each over a
 * reader that shows only its partition's documents (idx_reader.part_n), and merges their top
 * k by score, ties to the lower document number as on one device. With more partitions than
 * devices several share one device: that is how the split and the merge are tested on one
 * GPU (TARTAN_GPU_PARTITIONS). Or, split by queries (tartan_gpu_split), every partition is a
 * copy of the whole index searching a share of the call's queries, and nothing is merged.
 */
#ifndef TARTAN_ENGINE_GPUS_H
#define TARTAN_ENGINE_GPUS_H

#include "gpu.h"
#include "search.h"
#include "tartan.h"

typedef struct eng_gpus eng_gpus;

/*
 * The partitions and devices a handle's GPU searches use: tartan_options.gpu_devices (0: the
 * TARTAN_GPU_DEVICES variable, "all" or a number, else 1; -1: every visible GPU; N: the first N
 * visible, fewer when fewer are visible), and the TARTAN_GPU_PARTITIONS variable (partitions,
 * at least 1; default one per device; fewer than the devices uses that many devices).
 * *replicas: each partition a copy of the whole index taking a share of the queries
 * (tartan_gpu_split: the option, else TARTAN_GPU_SPLIT, else by the size of r's index against
 * the current device's memory; r NULL: documents). TARTAN_EINVAL for a malformed variable.
 * The caller holds the GPU lock (the plan reads db->gpus).
 */
int eng_gpus_plan(const tartan_db *db, const idx_reader *r, int *n_parts, int *n_dev, int *replicas,
                  store_msg *m);

/*
 * A GPU search of db through reader r (tartan_search's snapshot): on one mirror (db->gpu,
 * eng_gpu_search) when the plan has one partition, else over the partitions (db->gpus). Fills
 * s's hits as eng_gpu_search does. Takes the GPU lock.
 */
int eng_gpus_search(tartan_db *db, idx_reader *r, const eng_search *s, int exhaustive,
                    tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m);

/* One partition's search: eng_gpu_search_held, or in tests a CPU stand-in. */
typedef int (*eng_part_search_fn)(eng_gpu **g, idx_reader *r, const eng_search *s, int exhaustive,
                                  tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m);

/*
 * The partitioned search itself (the caller holds the GPU lock when fn uses a GPU): *gp is
 * made or remade for n_parts partitions (replicas: copies, each searching a contiguous share of
 * the queries, the p-th of n_parts) over n_dev devices; env opens the extra readers the
 * device threads need (at r's snapshot; when a writer commits in between, the devices take
 * turns on r instead). With n_dev 1 the calling thread's current device is used and never
 * changed.
 */
int eng_gpus_run(eng_gpus **gp, store_env *env, idx_reader *r, const eng_search *s, int exhaustive,
                 tartan_gpu_mode mode, int n_parts, int n_dev, int replicas, eng_part_search_fn fn,
                 eng_stage_stats *st, store_msg *m);

/* What the partitions hold, for tests: live documents of partition p at the last search. */
uint64_t eng_gpus_part_docs(const eng_gpus *g, int p);

/* What db's GPU searches hold: the mode in use and the device bytes of its one mirror or of all
 * its partitions' (eng_gpu_describe's; TARTAN_GPU_AUTO and 0 before the first search). */
void eng_gpus_describe(const tartan_db *db, tartan_gpu_mode *mode, size_t *device_bytes);

/* Frees the partitions' mirrors (each on its device), taking the GPU lock; NULL is fine. */
void eng_gpus_free(eng_gpus *g);

#endif
