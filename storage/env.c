/*
 * env.c: an index's LMDB environment: opening and creating it, its named databases, the
 * format check, transactions, and growing the map when it fills (FORMAT.md).
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include "store_internal.h"
#include "tartan.h"

/* Files the index creates: rw for the owner, readable by others; the umask narrows it. */
#define STORE_FILE_MODE 0644
#define STORE_DIR_MODE 0755

/* The map doubles when full, but by at most this much at a time, so that a big index does not
 * reserve address space far beyond what it uses. */
#define STORE_GROW_MAX ((size_t)8 << 30)

int store_fail(store_msg *m, int code, const char *fmt, ...)
{
    if (m) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->text, sizeof m->text, fmt, ap);
        va_end(ap);
    }
    return code;
}

int store_map_lmdb(store_msg *m, int rc, const char *what)
{
    switch (rc) {
    case MDB_SUCCESS:
        return 0;
    case MDB_MAP_FULL:
        return store_fail(m, STORE_EMAPFULL, "%s: the map is full", what);
    case MDB_NOTFOUND:
        return store_fail(m, TARTAN_ENOTFOUND, "%s: not found", what);
    case MDB_KEYEXIST:
        return store_fail(m, TARTAN_EEXIST, "%s: key exists", what);
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
        return store_fail(m, TARTAN_ECORRUPT, "%s: LMDB reports damaged pages (%s)", what,
                          mdb_strerror(rc));
    case MDB_INVALID:
        return store_fail(m, TARTAN_ENOINDEX, "%s: not an LMDB environment", what);
    case MDB_INCOMPATIBLE:
        return store_fail(m, TARTAN_ENOINDEX,
                          "%s: the LMDB environment holds databases of another layout", what);
    case MDB_VERSION_MISMATCH:
        return store_fail(m, TARTAN_EVERSION, "%s: written by an incompatible LMDB version", what);
    case MDB_TXN_FULL:
        return store_fail(m, TARTAN_ETOOBIG,
                          "%s: the change is too large for one transaction; split the batch", what);
    case MDB_BAD_VALSIZE:
        return store_fail(m, TARTAN_ETOOBIG, "%s: key or value too large", what);
    case MDB_READERS_FULL:
        return store_fail(m, TARTAN_ESTORAGE, "%s: too many concurrent readers", what);
    default:
        break;
    }
    if (rc > 0)
        return store_fail(m, rc, "%s: %s", what, strerror(rc));
    return store_fail(m, TARTAN_ESTORAGE, "%s: %s", what, mdb_strerror(rc));
}

int store_is_readonly(const store_env *env)
{
    return (env->se_flags & STORE_READONLY) != 0;
}

const char *store_path(const store_env *env)
{
    return env->se_path;
}

size_t store_map_size(store_env *env)
{
    MDB_envinfo info;
    mdb_env_info(env->se_env, &info);
    return info.me_mapsize;
}

/* Writes a fresh index's meta (FORMAT.md "meta"): the format record and the header. */
static int create_meta(store_txn *t, const store_header *init, store_msg *m)
{
    uint8_t fmt[12];
    memcpy(fmt, STORE_MAGIC, 8);
    uint32_t v = STORE_FORMAT_VERSION;
    memcpy(fmt + 8, &v, 4);
    MDB_val k = {strlen(STORE_KEY_FORMAT), STORE_KEY_FORMAT}, d = {sizeof fmt, fmt};
    int rc = mdb_put(t->st_txn, t->st_env->se_meta, &k, &d, MDB_NOOVERWRITE);
    if (rc)
        return store_map_lmdb(m, rc, "creating the index");
    store_header h = *init;
    h.n_centroids = 0;
    h.code_bytes = 0;
    h.token_bytes = h.dim * h.nbits / 8;
    h.next_docno = 0;
    h.n_docs = 0;
    h.n_tokens = 0;
    return store_header_put(t, &h, m);
}

/* Checks meta "format": magic and version. */
static int check_format(store_env *env, MDB_txn *txn, store_msg *m)
{
    MDB_val k = {strlen(STORE_KEY_FORMAT), STORE_KEY_FORMAT}, d;
    int rc = mdb_get(txn, env->se_meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOINDEX, "'%s': not a tartan index (no format record)",
                          env->se_path);
    if (rc)
        return store_map_lmdb(m, rc, "reading the format record");
    if (d.mv_size < 12 || memcmp(d.mv_data, STORE_MAGIC, 8) != 0)
        return store_fail(m, TARTAN_ENOINDEX, "'%s': not a tartan index (bad format record)",
                          env->se_path);
    uint32_t v;
    memcpy(&v, (const uint8_t *)d.mv_data + 8, 4);
    if (v != STORE_FORMAT_VERSION)
        return store_fail(m, TARTAN_EVERSION,
                          "'%s': index format version %u; this build of tartan reads only "
                          "version %u",
                          env->se_path, v, STORE_FORMAT_VERSION);
    return 0;
}

/* Opens the six named databases; creates them when create is set (a write transaction). */
static int open_dbs(store_env *env, MDB_txn *txn, int create, store_msg *m)
{
    struct {
        const char *name;
        unsigned flags;
        MDB_dbi *dbi;
    } dbs[] = {
        {"meta", 0, &env->se_meta},
        {"centroids", MDB_INTEGERKEY, &env->se_centroids},
        {"docs", MDB_INTEGERKEY, &env->se_docs},
        {"ivf", MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED | MDB_INTEGERDUP, &env->se_ivf},
        {"ids", 0, &env->se_ids},
        {"names", MDB_INTEGERKEY, &env->se_names},
    };
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        int rc =
            mdb_dbi_open(txn, dbs[i].name, dbs[i].flags | (create ? MDB_CREATE : 0), dbs[i].dbi);
        if (rc == MDB_NOTFOUND)
            return store_fail(m, TARTAN_ENOINDEX, "'%s': not a tartan index (no '%s' database)",
                              env->se_path, dbs[i].name);
        if (rc)
            return store_map_lmdb(m, rc, "opening the index's databases");
    }
    return 0;
}

static int env_configure(store_env *env, size_t map_size, unsigned mdb_flags, store_msg *m)
{
    int rc = mdb_env_create(&env->se_env);
    if (rc)
        return store_map_lmdb(m, rc, "creating the LMDB environment");
    if ((rc = mdb_env_set_maxdbs(env->se_env, 8)) ||
        (rc = mdb_env_set_mapsize(env->se_env, map_size)))
        return store_map_lmdb(m, rc, "configuring the LMDB environment");
    /* MDB_NOTLS: a read snapshot belongs to its transaction, not to the thread that began it,
     * so that a search may hand it between threads and one thread may hold several. */
    rc = mdb_env_open(env->se_env, env->se_path, mdb_flags | MDB_NOTLS, STORE_FILE_MODE);
    if (rc) {
        mdb_env_close(env->se_env);
        env->se_env = NULL;
    }
    return rc;
}

int store_open(const char *path, unsigned flags, const store_header *init, size_t map_size,
               store_env **out, store_msg *m)
{
    *out = NULL;
    int rc = 0;
    int create = (flags & STORE_CREATE) && !(flags & STORE_READONLY);
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno != ENOENT)
            return store_fail(m, errno, "'%s': %s", path, strerror(errno));
        if (!create)
            return store_fail(m, ENOENT, "'%s': no such index directory", path);
        if (mkdir(path, STORE_DIR_MODE) != 0)
            return store_fail(m, errno, "creating directory '%s': %s", path, strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return store_fail(m, ENOTDIR, "'%s': not a directory (an index is a directory)", path);
    }
    char *data = NULL;
    if (asprintf(&data, "%s/data.mdb", path) < 0)
        return store_fail(m, ENOMEM, "out of memory");
    int have_data = stat(data, &st) == 0;
    free(data);
    if (!have_data && !create)
        return store_fail(m, TARTAN_ENOINDEX, "'%s': no tartan index in this directory", path);

    store_env *env = calloc(1, sizeof *env);
    if (!env || !(env->se_path = strdup(path))) {
        free(env);
        return store_fail(m, ENOMEM, "out of memory");
    }
    pthread_rwlock_init(&env->se_grow, NULL);
    env->se_flags = flags & STORE_READONLY;
    if (map_size == 0)
        map_size = STORE_DEFAULT_MAP;
    /* The map must cover the file: an existing index may be bigger than what was asked. */
    if (have_data && (size_t)st.st_size > map_size)
        map_size = (size_t)st.st_size;

    unsigned mdb_flags = (flags & STORE_READONLY) ? MDB_RDONLY : 0;
    rc = env_configure(env, map_size, mdb_flags, m);
    if ((rc == EACCES || rc == EROFS) && (flags & STORE_READONLY)) {
        /* A reader that may not write the lock file (read-only media or directory): open
         * without it. Nothing can write the index meanwhile with the same rights. */
        rc = env_configure(env, map_size, mdb_flags | MDB_NOLOCK, m);
    }
    if (rc) {
        if (rc == EACCES)
            rc = store_fail(m, EACCES,
                            "'%s': permission denied (a directory the caller may not write "
                            "opens only read-only)",
                            path);
        else
            rc = store_map_lmdb(m, rc, path);
        goto fail;
    }

    /* Does the environment hold a tartan index? Look before creating anything, so that a
     * foreign LMDB environment is never written to. */
    MDB_txn *txn;
    rc = mdb_txn_begin(env->se_env, NULL, MDB_RDONLY, &txn);
    if (rc) {
        rc = store_map_lmdb(m, rc, "reading the index");
        goto fail;
    }
    MDB_dbi main_dbi;
    MDB_stat ms;
    int fresh = 0;
    if ((rc = mdb_dbi_open(txn, NULL, 0, &main_dbi)) || (rc = mdb_stat(txn, main_dbi, &ms))) {
        mdb_txn_abort(txn);
        rc = store_map_lmdb(m, rc, "reading the index");
        goto fail;
    }
    fresh = ms.ms_entries == 0;
    if (!fresh) {
        rc = open_dbs(env, txn, 0, m);
        if (!rc)
            rc = check_format(env, txn, m);
        if (!rc && create && (flags & STORE_EXCL))
            rc = store_fail(m, TARTAN_EEXIST, "'%s': an index exists there already", path);
        if (!rc)
            rc = mdb_txn_commit(txn) ? store_fail(m, TARTAN_ESTORAGE, "reading the index") : 0;
        else
            mdb_txn_abort(txn);
        if (rc)
            goto fail;
    } else {
        mdb_txn_abort(txn);
        if (!create) {
            rc = store_fail(m, TARTAN_ENOINDEX, "'%s': empty LMDB environment, no tartan index",
                            path);
            goto fail;
        }
        /* A fresh environment: the databases and meta in one transaction, so that a crash
         * leaves either no index or a whole one. */
        rc = mdb_txn_begin(env->se_env, NULL, 0, &txn);
        if (rc) {
            rc = store_map_lmdb(m, rc, "creating the index");
            goto fail;
        }
        store_txn t = {txn, env};
        rc = open_dbs(env, txn, 1, m);
        if (!rc)
            rc = create_meta(&t, init, m);
        if (rc) {
            mdb_txn_abort(txn);
            goto fail;
        }
        if ((rc = mdb_txn_commit(txn))) {
            rc = store_map_lmdb(m, rc, "creating the index");
            goto fail;
        }
    }
    *out = env;
    return 0;
fail:
    store_close(env);
    return rc;
}

void store_close(store_env *env)
{
    if (!env)
        return;
    if (env->se_env)
        mdb_env_close(env->se_env);
    pthread_rwlock_destroy(&env->se_grow);
    free(env->se_path);
    free(env);
}

/* Grows the map: doubles it, by at most STORE_GROW_MAX. Called with no transaction live in
 * this thread; waits for those of other threads. */
static int grow_map(store_env *env, store_msg *m)
{
    pthread_rwlock_wrlock(&env->se_grow);
    size_t cur = store_map_size(env);
    size_t add = cur < STORE_GROW_MAX ? cur : STORE_GROW_MAX;
    int rc = mdb_env_set_mapsize(env->se_env, cur + add);
    pthread_rwlock_unlock(&env->se_grow);
    if (rc)
        return store_map_lmdb(m, rc, "growing the map");
    return 0;
}

/* Another process grew the map: adopt its size (mdb_env_set_mapsize with 0). */
static int adopt_map(store_env *env, store_msg *m)
{
    pthread_rwlock_wrlock(&env->se_grow);
    int rc = mdb_env_set_mapsize(env->se_env, 0);
    pthread_rwlock_unlock(&env->se_grow);
    return rc ? store_map_lmdb(m, rc, "adopting the map size") : 0;
}

/*
 * LMDB reports a short write at commit as EIO (mdb_page_flush), which is what a full disk or
 * a file size limit gives once part of the pages went out. Tell those apart from a real I/O
 * error by looking: less than 64 KiB free on the file system, or the data file within 64 KiB
 * of RLIMIT_FSIZE. The commit failed either way and the index is as it was.
 */
static int short_write_cause(store_env *env, store_msg *m)
{
    const uint64_t slack = 64 << 10;
    struct statvfs vfs;
    if (statvfs(env->se_path, &vfs) == 0 && (uint64_t)vfs.f_bavail * vfs.f_frsize < slack)
        return store_fail(m, ENOSPC, "committing: no space left on the device holding '%s'",
                          env->se_path);
    struct rlimit rl;
    char *data = NULL;
    struct stat st;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        asprintf(&data, "%s/data.mdb", env->se_path) >= 0 && stat(data, &st) == 0 &&
        (uint64_t)st.st_size + slack >= (uint64_t)rl.rlim_cur) {
        free(data);
        return store_fail(m, EFBIG, "committing: '%s' reached the process's file size limit",
                          env->se_path);
    }
    free(data);
    return store_fail(m, EIO, "committing: input/output error writing '%s'", env->se_path);
}

/* Each change retries at most this often: every retry at least doubles the map, so more means
 * the change cannot fit the address space anyway. */
#define STORE_MAX_RETRIES 40

int store_write(store_env *env, store_write_fn fn, void *ctx, store_msg *m)
{
    if (env->se_flags & STORE_READONLY)
        return store_fail(m, TARTAN_EREADONLY, "'%s' is open read-only", env->se_path);
    for (int attempt = 0; attempt < STORE_MAX_RETRIES; attempt++) {
        pthread_rwlock_rdlock(&env->se_grow);
        MDB_txn *txn;
        int rc = mdb_txn_begin(env->se_env, NULL, 0, &txn);
        if (rc == MDB_MAP_RESIZED) {
            pthread_rwlock_unlock(&env->se_grow);
            if ((rc = adopt_map(env, m)))
                return rc;
            continue;
        }
        if (rc) {
            pthread_rwlock_unlock(&env->se_grow);
            return store_map_lmdb(m, rc, "beginning a write transaction");
        }
        store_txn t = {txn, env};
        m->text[0] = 0;
        rc = fn(&t, ctx, m);
        int full = 0;
        if (rc == 0) {
            int c = mdb_txn_commit(txn);
            if (c == MDB_MAP_FULL)
                full = 1;
            else if (c == EIO)
                rc = short_write_cause(env, m);
            else if (c)
                rc = store_map_lmdb(m, c, "committing");
        } else {
            mdb_txn_abort(txn);
            /* fn passes a full map on as STORE_EMAPFULL (store_map_lmdb's mapping). */
            full = rc == STORE_EMAPFULL;
        }
        pthread_rwlock_unlock(&env->se_grow);
        if (!full)
            return rc;
        if ((rc = grow_map(env, m)))
            return rc;
    }
    return store_fail(m, ENOSPC, "the map could not grow enough for this change");
}

int store_read_begin(store_env *env, store_txn **out, store_msg *m)
{
    *out = NULL;
    store_txn *t = malloc(sizeof *t);
    if (!t)
        return store_fail(m, ENOMEM, "out of memory");
    for (int attempt = 0; attempt < 4; attempt++) {
        pthread_rwlock_rdlock(&env->se_grow);
        int rc = mdb_txn_begin(env->se_env, NULL, MDB_RDONLY, &t->st_txn);
        if (rc == 0) {
            t->st_env = env;
            *out = t;
            return 0;
        }
        pthread_rwlock_unlock(&env->se_grow);
        if (rc != MDB_MAP_RESIZED) {
            free(t);
            return store_map_lmdb(m, rc, "beginning a read transaction");
        }
        if ((rc = adopt_map(env, m))) {
            free(t);
            return rc;
        }
    }
    free(t);
    return store_fail(m, TARTAN_ESTORAGE, "the map kept changing size");
}

void store_read_end(store_env *env, store_txn *t)
{
    if (!t)
        return;
    mdb_txn_abort(t->st_txn);
    pthread_rwlock_unlock(&env->se_grow);
    free(t);
}
