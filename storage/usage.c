/*
 * usage.c: where an index's bytes go: pages per named database, the file, and what is free.
 * Also store_dump, which walks every key and value (tests compare whole indexes with it).
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "store_internal.h"
#include "tartan.h"

static uint64_t pages(const MDB_stat *s)
{
    return (uint64_t)(s->ms_branch_pages + s->ms_leaf_pages + s->ms_overflow_pages) * s->ms_psize;
}

/* LMDB's free list is database 0 (FREE_DBI): keys are transaction ids, values lists of page
 * numbers, each a size_t count followed by that many size_t page numbers (LMDB's MDB_IDL). */
#define FREE_DBI 0

static int free_pages(store_txn *t, uint64_t *n, store_msg *m)
{
    MDB_cursor *cur;
    *n = 0;
    int rc = mdb_cursor_open(t->st_txn, FREE_DBI, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "reading the free list");
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while ((rc = store_cget(t, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        size_t cnt;
        if (d.mv_size < sizeof cnt)
            continue;
        memcpy(&cnt, d.mv_data, sizeof cnt);
        *n += cnt;
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : store_map_lmdb(m, rc, "reading the free list");
}

int store_usage_get(store_env *env, store_txn *t, store_usage *u, store_msg *m)
{
    store_gen *g = t->st_gen;
    memset(u, 0, sizeof *u);
    struct {
        MDB_dbi dbi;
        uint64_t *out;
    } dbs[] = {
        {g->g_meta, &u->meta}, {g->g_centroids, &u->centroids}, {g->g_docs, &u->docs},
        {g->g_ivf, &u->ivf},   {g->g_ids, &u->ids},             {g->g_names, &u->names},
    };
    MDB_stat s;
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        int rc = mdb_stat(t->st_txn, dbs[i].dbi, &s);
        if (rc)
            return store_map_lmdb(m, rc, "measuring the index");
        *dbs[i].out = pages(&s);
    }
    u->page_size = s.ms_psize;
    uint64_t nfree;
    int rc = free_pages(t, &nfree, m);
    if (rc)
        return rc;
    MDB_envinfo info;
    mdb_env_info(g->g_env, &info);
    uint64_t used = ((uint64_t)info.me_last_pgno + 1) * u->page_size;
    /* The file this snapshot reads (not the path's: a rewrite may have replaced that). */
    int fd;
    struct stat st;
    if (mdb_env_get_fd(g->g_env, &fd) != 0 || fstat(fd, &st) != 0)
        return store_fail(m, errno ? errno : EIO, "'%s/data.mdb': %s", env->se_path,
                          strerror(errno ? errno : EIO));
    u->file = (uint64_t)st.st_size;
    /* Free: listed in the free list, or past the last page ever used. */
    u->free = nfree * u->page_size + (u->file > used ? u->file - used : 0);
    return 0;
}

int store_dump(store_txn *t, store_dump_fn fn, void *ctx, store_msg *m)
{
    store_gen *g = t->st_gen;
    struct {
        const char *name;
        MDB_dbi dbi;
    } dbs[] = {
        {"meta", g->g_meta}, {"centroids", g->g_centroids},
        {"docs", g->g_docs}, {"ivf", g->g_ivf},
        {"ids", g->g_ids},   {"names", g->g_names},
    };
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        MDB_cursor *cur;
        int rc = mdb_cursor_open(t->st_txn, dbs[i].dbi, &cur);
        if (rc)
            return store_map_lmdb(m, rc, "dumping the index");
        MDB_val k, d;
        MDB_cursor_op op = MDB_FIRST;
        while ((rc = store_cget(t, cur, &k, &d, op)) == 0) {
            op = MDB_NEXT;
            int r = fn(dbs[i].name, k.mv_data, k.mv_size, d.mv_data, d.mv_size, ctx);
            if (r) {
                mdb_cursor_close(cur);
                return r;
            }
        }
        mdb_cursor_close(cur);
        if (rc != MDB_NOTFOUND)
            return store_map_lmdb(m, rc, "dumping the index");
    }
    return 0;
}
