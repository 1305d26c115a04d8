/*
 * gpu.h: searching on a CUDA GPU (layer prefix eng_). The index a handle searches on the GPU
 * is mirrored in device memory (eng_gpu): centroids, per-token codes and document offsets
 * always, residuals and inverse norms too in resident mode, and inverted lists rebuilt on the
 * device from the codes. Each GPU search first brings the mirror to its snapshot (appending
 * new documents, clearing deleted ones), then runs PLAID's stages for its queries in batches,
 * every stage on the device.
 */
#ifndef TARTAN_ENGINE_GPU_H
#define TARTAN_ENGINE_GPU_H

#include "search.h"
#include "tartan.h"

typedef struct eng_gpu eng_gpu; /* struct eng_gpu: search_gpu.c */

/* All GPU work of the process goes through one lock: the CUDA kernels share per-process
 * scratch accounting and the default stream. */
void eng_gpu_lock(void);
void eng_gpu_unlock(void);

/*
 * Runs search s (prepared by tartan_search) through reader r on the GPU, with *gp the
 * handle's mirror (created at the first call, NULL before). mode: TARTAN_GPU_RESIDENT,
 * TARTAN_GPU_STREAMING or TARTAN_GPU_AUTO (by size). exhaustive: score every live (allowed)
 * document. Fills s's hits as the CPU path does. Takes the GPU lock itself.
 */
int eng_gpu_search(eng_gpu **gp, idx_reader *r, const eng_search *s, int exhaustive,
                   tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m);

/*
 * The same without taking the GPU lock: for engine/search_gpus.c, which holds it for a whole
 * search and runs one thread per device, each on the calling thread's current device and its
 * own mirror (*gp).
 */
int eng_gpu_search_held(eng_gpu **gp, idx_reader *r, const eng_search *s, int exhaustive,
                        tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m);

/* What the mirror holds (for tests and benchmarks): mode in use and device bytes. */
void eng_gpu_describe(const eng_gpu *g, tartan_gpu_mode *mode, size_t *device_bytes);

/* Bytes a resident mirror of r's index takes on a device (an estimate). */
size_t eng_gpu_resident_bytes(const idx_reader *r);

/* Documents per slice of a streaming exhaustive search (0: the default, 65,536); tests set
 * small slices to run several. */
void eng_gpu_set_slice(eng_gpu *g, size_t docs);

/* Frees a mirror: eng_gpu_free takes the GPU lock, eng_gpu_free_held is for a caller that
 * holds it already (the lock is not recursive). */
void eng_gpu_free(eng_gpu *g);
void eng_gpu_free_held(eng_gpu *g);

#endif
