/*
 * rewrite.c: store_rewrite, replacing an index's environment by a new one (compaction,
 * conversion from version 1, salvage) safely against crashes and against readers and writers
 * in any process (FORMAT.md "Compaction").
 *
 * The new environment is written beside the index directory, then the two directories trade
 * places in one renameat2(RENAME_EXCHANGE): every path lookup sees either the whole old index
 * or the whole new one. The rewrite holds a write transaction on the old environment from
 * before it reads it until after the exchange, so no change can land in the old file unseen:
 * every later write transaction, in any process, begins by checking that its environment is
 * still the file at the path (store_write) and moves to the new one when not. Readers keep
 * their snapshots of the old file (its pages stay mapped after the directory is removed);
 * their next snapshot reads the new one.
 */
#define _GNU_SOURCE
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store_internal.h"
#include "tartan.h"

/* Removes a rewrite's directory (an LMDB environment: data.mdb and lock.mdb). */
static void remove_env_dir(const char *dir)
{
    static const char *const files[] = {"data.mdb", "lock.mdb"};
    char buf[4096];
    for (size_t i = 0; i < 2; i++) {
        if (snprintf(buf, sizeof buf, "%s/%s", dir, files[i]) < (int)sizeof buf)
            unlink(buf);
    }
    rmdir(dir);
}

/* Splits path (without trailing slashes) into its directory and its last name. */
static int split_path(const char *path, char **parent, char **base, char **clean, store_msg *m)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    char *c = strndup(path, n);
    if (!c)
        return store_fail(m, ENOMEM, "out of memory");
    char *slash = strrchr(c, '/');
    char *p, *b;
    if (!slash) {
        p = strdup(".");
        b = strdup(c);
    } else {
        p = slash == c ? strdup("/") : strndup(c, (size_t)(slash - c));
        b = strdup(slash + 1);
    }
    if (!p || !b || !b[0] || !strcmp(b, ".") || !strcmp(b, "..")) {
        int bad = p && b;
        free(p);
        free(b);
        free(c);
        return bad ? store_fail(m, TARTAN_EINVAL, "'%s': cannot rewrite an index named so", path)
                   : store_fail(m, ENOMEM, "out of memory");
    }
    *parent = p;
    *base = b;
    *clean = c;
    return 0;
}

/* Removes what killed rewrites of this index left beside it (BASE.compact-XXXXXX). Only a
 * process holding the current environment's writer lock writes such a directory, and it is
 * the caller: any other one is dead weight. */
static void sweep_leftovers(const char *parent, const char *base)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    size_t bl = strlen(base);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, base, bl) || strncmp(e->d_name + bl, ".compact-", 9) ||
            strlen(e->d_name + bl + 9) != 6)
            continue;
        char buf[4096];
        if (snprintf(buf, sizeof buf, "%s/%s", parent, e->d_name) < (int)sizeof buf)
            remove_env_dir(buf);
    }
    closedir(d);
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return errno;
    int rc = fsync(fd) ? errno : 0;
    close(fd);
    return rc;
}

/* Writes the new environment in dir: fn in one transaction, the map grown as needed. */
static int fill_new(store_env *env, store_txn *src, const char *dir, size_t map, store_rewrite_fn fn,
                    void *ctx, store_msg *m)
{
    store_gen *ng;
    int rc = store_gen_open(dir, STORE_CREATE, NULL, map, &ng, m);
    if (rc)
        return rc;
    for (int attempt = 0; attempt < 40; attempt++) {
        MDB_txn *txn;
        if ((rc = mdb_txn_begin(ng->g_env, NULL, 0, &txn))) {
            rc = store_map_lmdb(m, rc, "beginning the rewrite");
            break;
        }
        store_txn dst = {.st_txn = txn, .st_env = env, .st_gen = ng, .st_write = 1};
        memset(&src->st_seg, 0, sizeof src->st_seg);
        memset(&src->st_seg_pf, 0, sizeof src->st_seg_pf);
        rc = fn(src, &dst, ctx, m);
        if (rc == 0)
            rc = store_commit_mark(&dst, m);
        if (dst.st_docs)
            mdb_cursor_close(dst.st_docs);
        int full = 0;
        if (rc == 0) {
            int c = mdb_txn_commit(txn);
            full = c == MDB_MAP_FULL;
            if (c && !full)
                rc = store_map_lmdb(m, c, "committing the rewrite");
        } else {
            mdb_txn_abort(txn);
            full = rc == STORE_EMAPFULL;
        }
        if (!full)
            break;
        MDB_envinfo info;
        mdb_env_info(ng->g_env, &info);
        if ((rc = mdb_env_set_mapsize(ng->g_env, info.me_mapsize * 2))) {
            rc = store_map_lmdb(m, rc, "growing the rewrite's map");
            break;
        }
        rc = STORE_EMAPFULL;
    }
    if (rc == STORE_EMAPFULL)
        rc = store_fail(m, ENOSPC, "the rewrite's map could not grow enough");
    /* The commit synced the data file; LMDB's files must be named durably too. */
    if (!rc && (rc = mdb_env_sync(ng->g_env, 1)))
        rc = store_map_lmdb(m, rc, "syncing the rewrite");
    store_gen_close(ng);
    if (!rc && (rc = fsync_dir(dir)))
        rc = store_fail(m, rc, "syncing '%s': %s", dir, strerror(rc));
    return rc;
}

/* Makes a version-1 environment unusable to version-1 writers that still have it open (they
 * know nothing of replaced files): its header becomes a value they refuse. */
static void retire_v1(MDB_txn *txn, store_gen *g)
{
    MDB_val k = {strlen(STORE_KEY_HEADER), STORE_KEY_HEADER}, d = {7, "retired"};
    mdb_put(txn, g->g_meta, &k, &d, 0);
}

static int rewrite(store_env *env, store_rewrite_fn fn, void *ctx, int salvage, store_msg *m)
{
    if (env->se_flags & STORE_READONLY)
        return store_fail(m, TARTAN_EREADONLY, "'%s' is open read-only", env->se_path);
    char *parent = NULL, *base = NULL, *clean = NULL;
    int rc = split_path(env->se_path, &parent, &base, &clean, m);
    if (rc)
        return rc;
    store_gen *g = NULL;
    MDB_txn *txn = NULL;
    for (int attempt = 0; attempt < 8; attempt++) {
        g = env->se_gen;
        pthread_mutex_lock(&env->se_lock);
        g = env->se_gen;
        g->g_refs++;
        pthread_mutex_unlock(&env->se_lock);
        pthread_rwlock_rdlock(&g->g_grow);
        rc = mdb_txn_begin(g->g_env, NULL, 0, &txn);
        if (rc) {
            pthread_rwlock_unlock(&g->g_grow);
            pthread_mutex_lock(&env->se_lock);
            int last = --g->g_refs == 0;
            pthread_mutex_unlock(&env->se_lock);
            if (last)
                store_gen_close(g);
            g = NULL;
            if (rc == MDB_MAP_RESIZED) {
                store_txn *t;
                /* A read snapshot adopts the new size (store_read_begin). */
                if ((rc = store_read_begin(env, &t, m)))
                    goto out;
                store_read_end(env, t);
                continue;
            }
            rc = store_map_lmdb(m, rc, "beginning the rewrite");
            goto out;
        }
        struct stat st;
        if (stat(env->se_data, &st) == 0 && (st.st_dev != g->g_dev || st.st_ino != g->g_ino)) {
            /* Replaced meanwhile: start from the environment now at the path. */
            mdb_txn_abort(txn);
            txn = NULL;
            pthread_rwlock_unlock(&g->g_grow);
            pthread_mutex_lock(&env->se_lock);
            int last = --g->g_refs == 0;
            pthread_mutex_unlock(&env->se_lock);
            if (last)
                store_gen_close(g);
            g = NULL;
            store_txn *t;
            if ((rc = store_read_begin(env, &t, m)))
                goto out;
            store_read_end(env, t);
            continue;
        }
        break;
    }
    if (!g) {
        rc = store_fail(m, TARTAN_ESTORAGE, "'%s' kept being replaced", env->se_path);
        goto out;
    }
    /* Holding the writer lock: nothing else writes this index or rewrites it now. Which
     * snapshot is the newest (pages.c): a compaction reads LMDB's, so refuses when that may be
     * an older one; a salvage reads the newest with its own page reader. */
    int meta_use = 0;
    {
        store_meta_pages mp;
        int fd;
        if (mdb_env_get_fd(g->g_env, &fd) == 0 && store_pages_meta(fd, g->g_psize, &mp) == 0 &&
            mp.bad) {
            if (!salvage)
                rc = store_fail(m, TARTAN_ECORRUPT,
                                "'%s': %s; 'tartan check --repair' rewrites the index from its "
                                "newest snapshot",
                                env->se_path, mp.why);
            else if (mp.newest < 0)
                rc = store_fail(m, TARTAN_ECORRUPT,
                                "'%s': %s, and which of LMDB's two snapshots is the newest cannot "
                                "be told (neither holds a sound commit record): restore the index "
                                "from a copy or rebuild it",
                                env->se_path, mp.why);
            meta_use = mp.newest + 1;
            if (rc)
                goto abort;
        }
    }
    sweep_leftovers(parent, base);
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.compact-XXXXXX", clean) < 0) {
        rc = store_fail(m, ENOMEM, "out of memory");
        goto abort;
    }
    if (!mkdtemp(tmp)) {
        rc = store_fail(m, errno, "creating '%s': %s", tmp, strerror(errno));
        free(tmp);
        goto abort;
    }
    /* The new directory gets the old one's permissions (mkdtemp makes it 0700). */
    struct stat dst;
    if (stat(clean, &dst) == 0)
        chmod(tmp, dst.st_mode & 07777);
    MDB_envinfo info;
    mdb_env_info(g->g_env, &info);
    store_txn src = {
        .st_txn = txn, .st_env = env, .st_gen = g, .st_write = 1, .st_meta_use = meta_use};
    {
        struct stat fst;
        int fd;
        if (mdb_env_get_fd(g->g_env, &fd) == 0 && fstat(fd, &fst) == 0)
            src.st_fsize = (uint64_t)fst.st_size;
    }
    rc = fill_new(env, &src, tmp, info.me_mapsize, fn, ctx, m);
    if (src.st_docs)
        mdb_cursor_close(src.st_docs);
    if (rc) {
        remove_env_dir(tmp);
        free(tmp);
        goto abort;
    }
    if (g->g_version == 1)
        retire_v1(txn, g);
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, clean, RENAME_EXCHANGE) != 0) {
        int e = errno;
        remove_env_dir(tmp);
        free(tmp);
        if (e == EINVAL || e == ENOSYS || e == ENOTSUP)
            rc = store_fail(m, ENOTSUP,
                            "the file system holding '%s' cannot exchange directories "
                            "atomically (renameat2 RENAME_EXCHANGE): rewriting needs it",
                            env->se_path);
        else
            rc = store_fail(m, e, "exchanging '%s' with its rewrite: %s", env->se_path,
                            strerror(e));
        goto abort;
    }
    fsync_dir(parent);
    /* The old environment is now at tmp: end the transaction that held its writers off (a
     * version-1 one keeps its retired header), then remove it. Processes that still map it
     * keep reading their snapshots; the files go when the last one lets go. */
    if (g->g_version == 1)
        mdb_txn_commit(txn);
    else
        mdb_txn_abort(txn);
    txn = NULL;
    pthread_rwlock_unlock(&g->g_grow);
    remove_env_dir(tmp);
    free(tmp);
    /* Move this env to the new environment now rather than at its next transaction. */
    {
        store_txn *t;
        store_msg sm;
        if (store_read_begin(env, &t, &sm) == 0)
            store_read_end(env, t);
    }
    goto release;
abort:
    mdb_txn_abort(txn);
    txn = NULL;
    pthread_rwlock_unlock(&g->g_grow);
release:
    pthread_mutex_lock(&env->se_lock);
    {
        int last = --g->g_refs == 0;
        pthread_mutex_unlock(&env->se_lock);
        if (last)
            store_gen_close(g);
    }
out:
    free(parent);
    free(base);
    free(clean);
    return rc;
}

int store_rewrite(store_env *env, store_rewrite_fn fn, void *ctx, store_msg *m)
{
    return rewrite(env, fn, ctx, 0, m);
}

int store_rewrite_salvage(store_env *env, store_rewrite_fn fn, void *ctx, store_msg *m)
{
    return rewrite(env, fn, ctx, 1, m);
}
