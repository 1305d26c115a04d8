/*
 * damage.h: the test programs' way of damaging an index as a disk would: one byte of data.mdb
 * flipped in the file itself, found through the pointers the library's readers hand out (a
 * value read from LMDB points into the map, which mirrors the file page for page).
 */
#ifndef TARTAN_TESTS_DAMAGE_H
#define TARTAN_TESTS_DAMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* The offset in data.mdb of p, a pointer into the map of txn's environment. */
long damage_offset(store_txn *txn, const void *p);

/* XORs the byte at offset of path's data.mdb with mask (no process may have it open for
 * writing; readers see the change at their next snapshot). */
void damage_flip(const char *path, long offset, uint8_t mask);

/* The byte at offset of path's data.mdb. */
uint8_t damage_peek(const char *path, long offset);

/* Size of path's data.mdb. */
long damage_file_size(const char *path);

#endif

/* ---- damage by meaning: records rewritten with sound checksums ---------------------------- */

/* Runs fn in one write transaction on path's index (a store_env of its own), committed. */
typedef void (*damage_txn_fn)(store_txn *t, void *ctx);
void damage_write(const char *path, damage_txn_fn fn, void *ctx);

/* Document docno's record (pointer into the map, unverified) and its size. */
const uint8_t *damage_record(store_txn *t, uint32_t docno, size_t *size);

/*
 * Rewrites docno's segment with its record edited in a copy: edit(rec, &size, ctx) may change
 * bytes and shrink size (later records move up). reseal: recompute the record's CRC after the
 * edit. The segment's directory is always rewritten with a sound checksum.
 */
typedef void (*damage_edit_fn)(uint8_t *rec, size_t *size, void *ctx);
void damage_edit_record(store_txn *t, uint32_t docno, damage_edit_fn edit, void *ctx, int reseal);

/* Adds (add 1) or removes (add 0) doc in centroid c's inverted list, blocks kept sound. */
void damage_list(store_txn *t, uint32_t c, uint32_t doc, int add);
