/*
 * bounds.c: where values may lie. LMDB trusts the sizes in its page and node headers, so a
 * damaged one could hand out a value that runs past its page or the end of the file (reading
 * it there is SIGBUS). store_get and store_cget check every value they return against the
 * map's place in memory, found here from the kernel's list of mappings (store_internal.h).
 */
#define _GNU_SOURCE
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <sys/types.h>

#include "store_internal.h"

/* LMDB's page header: the page number (8 bytes) first; meta pages begin their data with
 * MDB_MAGIC. Overflow pages hold their value from this offset on. */
#define LMDB_PAGE_HEAD 16
#define LMDB_MAGIC 0xBEEFC0DEu

/* The map of data.mdb in this process's address space, from the kernel's list of mappings:
 * no page of the file needs to be read (or trusted) to find it. */
static const uint8_t *map_from_proc(const store_gen *g)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return NULL;
    char line[1024];
    const uint8_t *base = NULL;
    while (!base && fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off, ino;
        unsigned maj, min;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &maj, &min, &ino) ==
                7 &&
            off == 0 && ino == (unsigned long)g->g_ino && makedev(maj, min) == g->g_dev)
            base = (const uint8_t *)(uintptr_t)lo;
    }
    fclose(f);
    return base;
}

void store_gen_find_map(store_gen *g)
{
    g->g_base = NULL;
    MDB_envinfo info;
    mdb_env_info(g->g_env, &info);
    g->g_mapsize = info.me_mapsize;
    const uint8_t *base = map_from_proc(g);
    uint32_t magic;
    if (base && g->g_psize) {
        memcpy(&magic, base + LMDB_PAGE_HEAD, 4);
        if (magic == LMDB_MAGIC) {
            g->g_base = base;
            return;
        }
    }
    if (!g->g_meta)
        return;
    MDB_txn *txn;
    if (!g->g_psize || mdb_txn_begin(g->g_env, NULL, MDB_RDONLY, &txn))
        return;
    MDB_val k = {strlen(STORE_KEY_FORMAT), STORE_KEY_FORMAT}, d;
    /* The format record lies in a leaf page; that page's header names its number. */
    if (mdb_get(txn, g->g_meta, &k, &d) == 0) {
        uintptr_t page = (uintptr_t)d.mv_data & ~(uintptr_t)(g->g_psize - 1);
        uint64_t pgno;
        memcpy(&pgno, (const void *)page, 8);
        const uint8_t *base = (const uint8_t *)(page - (uintptr_t)(pgno * g->g_psize));
        uint32_t magic;
        if (pgno < g->g_mapsize / g->g_psize) {
            memcpy(&magic, base + LMDB_PAGE_HEAD, 4);
            if (magic == LMDB_MAGIC)
                g->g_base = base;
        }
    }
    mdb_txn_abort(txn);
}

/* 0 when v (size n) lies where a page can hold it, or outside the map (a write transaction's
 * own pages). */
static int val_placed(const store_txn *t, const void *v, size_t n)
{
    const store_gen *g = t->st_gen;
    if (!g->g_base || !v)
        return 0;
    uintptr_t p = (uintptr_t)v, base = (uintptr_t)g->g_base;
    if (p < base || p >= base + g->g_mapsize)
        return 0;
    uint64_t end = (uint64_t)(p - base) + n;
    if (t->st_fsize && end > t->st_fsize)
        return MDB_CORRUPTED;
    size_t in_page = (p - base) % g->g_psize;
    /* A value of its own overflow pages starts right after the first one's header; anything
     * else lies in a leaf or branch page and ends inside it. */
    if (in_page != LMDB_PAGE_HEAD && in_page + n > g->g_psize)
        return MDB_CORRUPTED;
    return 0;
}

int store_get(store_txn *t, MDB_dbi dbi, MDB_val *k, MDB_val *d)
{
    int rc = mdb_get(t->st_txn, dbi, k, d);
    return rc ? rc : val_placed(t, d->mv_data, d->mv_size);
}

int store_cget(store_txn *t, MDB_cursor *c, MDB_val *k, MDB_val *d, MDB_cursor_op op)
{
    int rc = mdb_cursor_get(c, k, d, op);
    if (rc)
        return rc;
    if ((rc = val_placed(t, k->mv_data, k->mv_size)))
        return rc;
    return val_placed(t, d->mv_data, d->mv_size);
}
