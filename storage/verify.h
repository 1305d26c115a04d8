/*
 * verify.h: a whole-index consistency check against FORMAT.md, and the salvage of a damaged
 * index (layer prefix store_). The check reads one snapshot and reports each problem it finds
 * instead of stopping at the first, which is what `tartan check` and tartan_check() need; the
 * readers elsewhere in storage/ only decide whether the one value they read is usable.
 */
#ifndef TARTAN_STORAGE_VERIFY_H
#define TARTAN_STORAGE_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

/*
 * Called once per problem (or, for store_salvage, per thing salvage did). kind: a short
 * stable tag (the lists are in verify.c's and salvage.c's header comments), message: what and
 * where. Returning nonzero stops the walk.
 */
typedef int (*store_verify_fn)(void *ctx, const char *kind, const char *message);

/* What the walk looked at (for a summary line). */
typedef struct store_verify_stats {
    uint64_t docs, tokens, ivf_entries, ids;
} store_verify_stats;

/*
 * Checks the whole index in one read snapshot: format and meta records (checksums), header,
 * codec and centroids (checksum, shape, unit length), every segment (directory checksum and
 * structure) and document record (size, checksum, codes below K, inverse norms), the header's
 * counts, every inverted-list block (checksum, shape) and the lists against the documents'
 * codes both ways (missing and stale entries), ids <-> document numbers both ways (checksums),
 * and LMDB's own structure as far as keys in order and every key found by lookup go. Each
 * problem goes to report (may be NULL) and is counted in *n_problems.
 * Returns 0 when the walk ran (whatever it found; damage LMDB itself reports while walking is
 * a problem of kind "lmdb" and ends the walk of that database), or an error that kept it from
 * running (ENOMEM, TARTAN_ESTORAGE) with m's detail.
 */
int store_verify(store_env *env, store_verify_fn report, void *ctx, size_t *n_problems,
                 store_verify_stats *stats, store_msg *m);

/*
 * LMDB's own structure in txn's snapshot, read page by page without LMDB (pages.c): each
 * problem goes to report as kind "lmdb". *unsound: bit i set when tartan's database i (meta,
 * centroids, docs, ivf, ids, names) has a damaged tree, all bits when the meta pages or the main
 * database do; LMDB's cursors must not walk those. 0, or ENOMEM.
 */
int store_pages_check(store_txn *txn, store_verify_fn report, void *ctx, unsigned *unsound,
                      store_msg *m);

/*
 * Salvages a damaged index (salvage.c): rewrites it (store_rewrite, one transaction and an
 * atomic swap) keeping every document whose record is sound and whose external id is known
 * (from either id map), with the inverted lists, both id maps and the header's counts rebuilt
 * from those documents. Each removed document and each rebuilt or dropped record goes to report
 * (kind "removed", "rebuilt", "dropped", "lmdb"); *n_removed counts the removed documents.
 * An index whose codec or centroids are damaged cannot be salvaged: TARTAN_ECORRUPT, and the
 * index is left as it was. Other errors: store_rewrite's.
 */
int store_salvage(store_env *env, store_verify_fn report, void *ctx, size_t *n_removed,
                  store_msg *m);

#endif
