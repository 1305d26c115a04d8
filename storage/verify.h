/*
 * verify.h: a whole-index consistency check against FORMAT.md (layer prefix store_). It reads
 * one snapshot and reports each problem it finds instead of stopping at the first, which is
 * what `tartan check` and tartan_check() need; the readers elsewhere in storage/ only decide
 * whether the one value they read is usable.
 */
#ifndef TARTAN_STORAGE_VERIFY_H
#define TARTAN_STORAGE_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

/*
 * Called once per problem. kind: a short stable tag (the list is in verify.c's header
 * comment), message: what and where. Returning nonzero stops the walk.
 */
typedef int (*store_verify_fn)(void *ctx, const char *kind, const char *message);

/* What the walk looked at (for a summary line). */
typedef struct store_verify_stats {
    uint64_t docs, tokens, ivf_entries, ids;
} store_verify_stats;

/*
 * Checks the whole index in one read snapshot: header and format record, codec and centroids,
 * every document blob (size, alignment, checksum, codes below K, inverse norms), the header's
 * counts against the documents, the inverted lists against the documents' codes both ways
 * (missing and stale entries), and ids <-> document numbers both ways. Each problem goes to
 * report (may be NULL) and is counted in *n_problems.
 * Returns 0 when the walk ran (whatever it found; damage LMDB itself reports while walking is
 * a problem of kind "lmdb" and ends the walk), or an error that kept it from running (ENOMEM,
 * TARTAN_ESTORAGE) with m's detail.
 */
int store_verify(store_env *env, store_verify_fn report, void *ctx, size_t *n_problems,
                 store_verify_stats *stats, store_msg *m);

#endif
