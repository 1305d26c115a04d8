/*
 * db.h: the handle behind tartan_db and the engine's error reporting (layer prefix eng_).
 * The search pipeline (engine/) reads an index through db->env with index/index.h's reader.
 */
#ifndef TARTAN_ENGINE_DB_H
#define TARTAN_ENGINE_DB_H

#include <pthread.h>
#include <stdint.h>

#include "index.h"
#include "store.h"
#include "tartan.h"

struct tartan_db {
    store_env *env;
    tartan_options opts;
    uint64_t serial; /* tells handles apart in the per-thread message slot */
    /* One change at a time per handle: training and encoding run outside LMDB's writer lock,
     * and a second change would only wait there after doing that work for nothing. */
    pthread_mutex_t write_lock;
    /* The index mirrored in GPU memory for GPU searches (engine/gpu.h); NULL until the first.
     * Guarded by the process-wide GPU lock. */
    struct eng_gpu *gpu;
    /* The index spread over several GPUs (engine/gpus.h) when the handle's plan has more than
     * one partition; NULL until the first such search. Guarded by the GPU lock. */
    struct eng_gpus *gpus;
    /* The bf16 probe table of the centroids for CPU searches (engine/probe.c); NULL until the
     * first. Guarded by probe_lock. */
    pthread_mutex_t probe_lock;
    struct eng_probe *probe;
};

/*
 * Records a failure for tartan_errmsg: "<code name>: <m's text>" in the calling thread's slot
 * for db (NULL: the slot of calls without a handle). Returns code.
 */
int eng_fail(const tartan_db *db, int code, const store_msg *m);
/* The same with a message of its own (printf-style). */
int eng_failf(const tartan_db *db, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
