/*
 * env.c: an index's LMDB environment: opening and creating it, its named databases, the
 * format check, transactions, growing the map when it fills, and moving to the new environment
 * when a store_rewrite replaced the directory's (FORMAT.md).
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
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

int store_is_readonly(const store_env *env)
{
    return (env->se_flags & STORE_READONLY) != 0;
}

const char *store_path(const store_env *env)
{
    return env->se_path;
}

/* ---- generations ------------------------------------------------------------------------ */

static store_gen *gen_acquire(store_env *env)
{
    pthread_mutex_lock(&env->se_lock);
    store_gen *g = env->se_gen;
    g->g_refs++;
    pthread_mutex_unlock(&env->se_lock);
    return g;
}

static void gen_release(store_env *env, store_gen *g)
{
    pthread_mutex_lock(&env->se_lock);
    int last = --g->g_refs == 0;
    pthread_mutex_unlock(&env->se_lock);
    if (last)
        store_gen_close(g);
}

/* Has a store_rewrite put another environment at the path? (A path that cannot be read right
 * now says no: the generation in hand is still a sound index.) */
static int gen_replaced(const store_env *env, const store_gen *g, uint64_t *fsize)
{
    struct stat st;
    *fsize = 0;
    if (stat(env->se_data, &st) != 0)
        return 0;
    if (st.st_dev != g->g_dev || st.st_ino != g->g_ino)
        return 1;
    *fsize = (uint64_t)st.st_size;
    return 0;
}

/* Moves env to the environment now at its path, unless another thread did already. */
static int gen_switch(store_env *env, store_gen *old, store_msg *m)
{
    pthread_mutex_lock(&env->se_switch);
    int rc = 0;
    if (env->se_gen == old) {
        store_gen *ng;
        size_t map = store_map_size(env);
        rc = store_gen_open(env->se_path, env->se_flags & (STORE_READONLY | STORE_OPEN_V1), NULL,
                            map > env->se_map_req ? map : env->se_map_req, &ng, m);
        if (!rc) {
            ng->g_refs = 1;
            pthread_mutex_lock(&env->se_lock);
            env->se_gen = ng;
            int last = --old->g_refs == 0;
            pthread_mutex_unlock(&env->se_lock);
            if (last)
                store_gen_close(old);
        }
    }
    pthread_mutex_unlock(&env->se_switch);
    return rc;
}

size_t store_map_size(store_env *env)
{
    store_gen *g = gen_acquire(env);
    MDB_envinfo info;
    mdb_env_info(g->g_env, &info);
    gen_release(env, g);
    return info.me_mapsize;
}

unsigned store_version(store_env *env)
{
    store_gen *g = gen_acquire(env);
    unsigned v = g->g_version;
    gen_release(env, g);
    return v;
}

/* ---- the format record ------------------------------------------------------------------ */

static void format_bytes(uint8_t b[STORE_FORMAT_SIZE], unsigned version)
{
    memcpy(b, STORE_MAGIC, 8);
    uint32_t v = version;
    memcpy(b + 8, &v, 4);
    uint32_t c = store_meta_crc(STORE_KEY_FORMAT, strlen(STORE_KEY_FORMAT), b, 12);
    memcpy(b + 12, &c, 4);
}

int store_format_put(MDB_txn *txn, MDB_dbi meta, unsigned version, store_msg *m)
{
    uint8_t b[STORE_FORMAT_SIZE];
    format_bytes(b, version);
    MDB_val k = {strlen(STORE_KEY_FORMAT), STORE_KEY_FORMAT}, d = {sizeof b, b};
    int rc = mdb_put(txn, meta, &k, &d, 0);
    return rc ? store_map_lmdb(m, rc, "writing the format record") : 0;
}

int store_format_parse(const void *val, size_t size, unsigned *version, int *damaged)
{
    const uint8_t *p = val;
    *damaged = 0;
    if (size == 12 && !memcmp(p, STORE_MAGIC, 8)) {
        uint32_t v;
        memcpy(&v, p + 8, 4);
        *version = v;
        return 0;
    }
    if (size != STORE_FORMAT_SIZE)
        return TARTAN_ENOINDEX;
    /* A record of a version this build reads, or one damaged byte off it: still that version
     * (tartan check reports it, a repair rewrites it). Versions 2 and 3 differ in their version
     * byte and in their checksum, so no record is one byte off both. Anything else is a record
     * of another version or no index. */
    for (unsigned ver = STORE_FORMAT_VERSION; ver <= STORE_FORMAT_MAX; ver++) {
        uint8_t want[STORE_FORMAT_SIZE];
        format_bytes(want, ver);
        int diff = 0;
        for (size_t i = 0; i < STORE_FORMAT_SIZE; i++)
            diff += p[i] != want[i];
        if (diff <= 1) {
            *version = ver;
            *damaged = diff == 1;
            return 0;
        }
    }
    if (memcmp(p, STORE_MAGIC, 8))
        return TARTAN_ENOINDEX;
    uint32_t v;
    memcpy(&v, p + 8, 4);
    *version = v;
    uint32_t c, want_c = store_meta_crc(STORE_KEY_FORMAT, strlen(STORE_KEY_FORMAT), p, 12);
    memcpy(&c, p + 12, 4);
    *damaged = c != want_c;
    return 0;
}

/* Writes a fresh index's meta (FORMAT.md "meta"): the format record and the header. */
static int create_meta(store_txn *t, const store_header *init, store_msg *m)
{
    int rc = store_format_put(t->st_txn, t->st_gen->g_meta, STORE_FORMAT_VERSION, m);
    if (rc)
        return rc;
    store_header h = *init;
    h.n_centroids = 0;
    h.code_bytes = 0;
    h.token_bytes = h.dim * h.nbits / 8;
    h.next_docno = 0;
    h.n_docs = 0;
    h.n_tokens = 0;
    h.n_postings = 0;
    return store_header_put(t, &h, m);
}

/* Reads meta "format": magic and version. */
static int check_format(const char *path, MDB_txn *txn, MDB_dbi meta, unsigned flags,
                        unsigned *version, store_msg *m)
{
    MDB_val k = {strlen(STORE_KEY_FORMAT), STORE_KEY_FORMAT}, d;
    int rc = mdb_get(txn, meta, &k, &d);
    if (rc == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ENOINDEX, "'%s': not a tartan index (no format record)",
                          path);
    if (rc)
        return store_map_lmdb(m, rc, "reading the format record");
    int damaged;
    if (store_format_parse(d.mv_data, d.mv_size, version, &damaged))
        return store_fail(m, TARTAN_ENOINDEX, "'%s': not a tartan index (bad format record)",
                          path);
    if (*version == 1 && (flags & STORE_OPEN_V1))
        return 0;
    if (*version == 1)
        return store_fail(m, TARTAN_EVERSION,
                          "'%s': index format version 1; this build of tartan reads version %u: "
                          "convert it with 'tartan compact %s' (or tartan_open with "
                          "TARTAN_UPGRADE), which keeps every document, id and score",
                          path, STORE_FORMAT_VERSION, path);
    if (*version < STORE_FORMAT_VERSION || *version > STORE_FORMAT_MAX)
        return store_fail(m, TARTAN_EVERSION,
                          "'%s': index format version %u; this build of tartan reads versions "
                          "%u to %u",
                          path, *version, STORE_FORMAT_VERSION, STORE_FORMAT_MAX);
    return 0;
}

unsigned store_format_needs(const void *name, size_t len)
{
    const char *s = name;
    if (len > 6 && !memcmp(s, "codec.", 6) &&
        !(len == strlen(STORE_KEY_CODEC_COPY) && !memcmp(s, STORE_KEY_CODEC_COPY, len)))
        return 3;
    return STORE_FORMAT_VERSION;
}

int store_format_version(store_txn *txn, unsigned *version, store_msg *m)
{
    MDB_val k = {strlen(STORE_KEY_FORMAT), STORE_KEY_FORMAT}, d;
    int rc = mdb_get(txn->st_txn, txn->st_gen->g_meta, &k, &d), damaged;
    if (rc)
        return store_map_lmdb(m, rc, "reading the format record");
    if (store_format_parse(d.mv_data, d.mv_size, version, &damaged))
        return store_fail(m, TARTAN_ECORRUPT, "the format record is damaged");
    return 0;
}

int store_format_raise(store_txn *t, unsigned v, store_msg *m)
{
    /* Every meta write asks; only a codec extension needs more than any index has, so the
     * others read nothing. */
    if (v <= STORE_FORMAT_VERSION)
        return 0;
    unsigned cur;
    int rc = store_format_version(t, &cur, m);
    if (rc || cur >= v)
        return rc;
    return store_format_put(t->st_txn, t->st_gen->g_meta, v, m);
}

/* Opens the named databases with the flags of format version `version`; creates them when
 * create is set (a write transaction). */
static int open_dbs(store_gen *g, const char *path, MDB_txn *txn, unsigned version, int create,
                    store_msg *m)
{
    /* Version 1's inverted lists were sorted duplicates; version 2's are blocks under 8-byte
     * integer keys (FORMAT.md). */
    unsigned ivf_flags = version == 1
                             ? MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED | MDB_INTEGERDUP
                             : MDB_INTEGERKEY;
    struct {
        const char *name;
        unsigned flags;
        MDB_dbi *dbi;
    } dbs[] = {
        {"meta", 0, &g->g_meta},
        {"centroids", MDB_INTEGERKEY, &g->g_centroids},
        {"docs", MDB_INTEGERKEY, &g->g_docs},
        {"ivf", ivf_flags, &g->g_ivf},
        {"ids", 0, &g->g_ids},
        {"names", MDB_INTEGERKEY, &g->g_names},
    };
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        int rc =
            mdb_dbi_open(txn, dbs[i].name, dbs[i].flags | (create ? MDB_CREATE : 0), dbs[i].dbi);
        if (rc == MDB_NOTFOUND)
            return store_fail(m, TARTAN_ENOINDEX, "'%s': not a tartan index (no '%s' database)",
                              path, dbs[i].name);
        if (rc)
            return store_map_lmdb(m, rc, "opening the index's databases");
    }
    return 0;
}

static int env_configure(store_gen *g, const char *path, size_t map_size, unsigned mdb_flags)
{
    int rc = mdb_env_create(&g->g_env);
    if (rc)
        return rc;
    if ((rc = mdb_env_set_maxdbs(g->g_env, 8)) || (rc = mdb_env_set_mapsize(g->g_env, map_size))) {
        mdb_env_close(g->g_env);
        g->g_env = NULL;
        return rc;
    }
    /* MDB_NOTLS: a read snapshot belongs to its transaction, not to the thread that began it,
     * so that a search may hand it between threads and one thread may hold several. */
    rc = mdb_env_open(g->g_env, path, mdb_flags | MDB_NOTLS, STORE_FILE_MODE);
    if (rc) {
        mdb_env_close(g->g_env);
        g->g_env = NULL;
    }
    return rc;
}

/* LMDB opens lock.mdb and data.mdb by name, one after the other: a store_rewrite swapping the
 * directory in between would pair one environment's lock file with the other's data. Opening
 * again when the directory at the path changed during the open rules that out. */
#define STORE_OPEN_TRIES 8

static int env_open_stable(store_gen *g, const char *path, size_t map_size, unsigned mdb_flags)
{
    int rc = EAGAIN;
    for (int i = 0; i < STORE_OPEN_TRIES; i++) {
        struct stat a, b;
        if (stat(path, &a) != 0)
            return errno;
        rc = env_configure(g, path, map_size, mdb_flags);
        if ((rc == EACCES || rc == EROFS) && (mdb_flags & MDB_RDONLY)) {
            /* A reader that may not write the lock file (read-only media or directory): open
             * without it. Nothing can write the index meanwhile with the same rights. */
            rc = env_configure(g, path, map_size, mdb_flags | MDB_NOLOCK);
        }
        if (rc)
            return rc;
        if (stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
            return 0;
        mdb_env_close(g->g_env);
        g->g_env = NULL;
        rc = EAGAIN;
    }
    return rc;
}

void store_gen_close(store_gen *g)
{
    if (!g)
        return;
    if (g->g_env)
        mdb_env_close(g->g_env);
    pthread_rwlock_destroy(&g->g_grow);
    pthread_mutex_destroy(&g->g_cent_lock);
    free(g->g_cent);
    free(g);
}

int store_gen_open(const char *path, unsigned flags, const store_header *init, size_t map_size,
                   store_gen **out, store_msg *m)
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

    store_gen *g = calloc(1, sizeof *g);
    if (!g)
        return store_fail(m, ENOMEM, "out of memory");
    pthread_rwlock_init(&g->g_grow, NULL);
    pthread_mutex_init(&g->g_cent_lock, NULL);
    if (map_size == 0)
        map_size = STORE_DEFAULT_MAP;
    /* The map must cover the file: an existing index may be bigger than what was asked. */
    if (have_data && (size_t)st.st_size > map_size)
        map_size = (size_t)st.st_size;

    unsigned mdb_flags = (flags & STORE_READONLY) ? MDB_RDONLY : 0;
    rc = env_open_stable(g, path, map_size, mdb_flags);
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
    MDB_stat es;
    mdb_env_stat(g->g_env, &es);
    g->g_psize = es.ms_psize;
    int fd;
    if (mdb_env_get_fd(g->g_env, &fd) == 0 && fstat(fd, &st) == 0) {
        g->g_dev = st.st_dev;
        g->g_ino = st.st_ino;
    }
    store_gen_find_map(g);

    /* Does the environment hold a tartan index? Look before creating anything, so that a
     * foreign LMDB environment is never written to. */
    MDB_txn *txn;
    rc = mdb_txn_begin(g->g_env, NULL, MDB_RDONLY, &txn);
    if (rc) {
        rc = store_map_lmdb(m, rc, "reading the index");
        goto fail;
    }
    MDB_dbi main_dbi;
    MDB_stat ms;
    if ((rc = mdb_dbi_open(txn, NULL, 0, &main_dbi)) || (rc = mdb_stat(txn, main_dbi, &ms))) {
        mdb_txn_abort(txn);
        rc = store_map_lmdb(m, rc, "reading the index");
        goto fail;
    }
    if (ms.ms_entries != 0) {
        struct stat dst;
        store_txn probe = {.st_txn = txn, .st_gen = g};
        if (mdb_env_get_fd(g->g_env, &fd) == 0 && fstat(fd, &dst) == 0)
            probe.st_fsize = (uint64_t)dst.st_size;
        if ((rc = store_pages_main_sound(&probe))) {
            mdb_txn_abort(txn);
            rc = rc == TARTAN_ECORRUPT
                     ? store_fail(m, TARTAN_ECORRUPT,
                                  "'%s': LMDB's own pages are damaged where it names the index's "
                                  "databases (the meta pages or the main database): the index "
                                  "cannot be opened; restore it from a copy or rebuild it",
                                  path)
                     : store_fail(m, rc, "out of memory");
            goto fail;
        }
        /* LMDB took the meta page with the larger transaction id; is its snapshot the newest?
         * (pages.c; the read transaction keeps writers off both snapshots' pages.) */
        store_meta_pages mp;
        if (mdb_env_get_fd(g->g_env, &fd) == 0 && store_pages_meta(fd, g->g_psize, &mp) == 0 &&
            mp.bad) {
            g->g_meta_bad = 1;
            snprintf(g->g_meta_why, sizeof g->g_meta_why, "%s", mp.why);
        }
        rc = mdb_dbi_open(txn, "meta", 0, &g->g_meta);
        if (rc == MDB_NOTFOUND)
            rc = store_fail(m, TARTAN_ENOINDEX, "'%s': not a tartan index (no 'meta' database)",
                            path);
        else if (rc)
            rc = store_map_lmdb(m, rc, "opening the index's databases");
        if (!rc)
            rc = check_format(path, txn, g->g_meta, flags, &g->g_version, m);
        if (!rc)
            rc = open_dbs(g, path, txn, g->g_version, 0, m);
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
        rc = mdb_txn_begin(g->g_env, NULL, 0, &txn);
        if (rc) {
            rc = store_map_lmdb(m, rc, "creating the index");
            goto fail;
        }
        g->g_version = STORE_FORMAT_VERSION;
        store_txn t = {.st_txn = txn, .st_gen = g, .st_write = 1};
        rc = open_dbs(g, path, txn, g->g_version, 1, m);
        if (!rc)
            rc = init ? create_meta(&t, init, m)
                      : store_format_put(txn, g->g_meta, STORE_FORMAT_VERSION, m);
        if (!rc)
            rc = store_commit_mark(&t, m);
        if (rc) {
            mdb_txn_abort(txn);
            goto fail;
        }
        if ((rc = mdb_txn_commit(txn))) {
            rc = store_map_lmdb(m, rc, "creating the index");
            goto fail;
        }
    }
    store_gen_find_map(g);
    *out = g;
    return 0;
fail:
    store_gen_close(g);
    return rc;
}

/* ---- the env ---------------------------------------------------------------------------- */

int store_open(const char *path, unsigned flags, const store_header *init, size_t map_size,
               store_env **out, store_msg *m)
{
    *out = NULL;
    store_env *env = calloc(1, sizeof *env);
    if (!env || !(env->se_path = strdup(path)) || asprintf(&env->se_data, "%s/data.mdb", path) < 0) {
        if (env)
            free(env->se_path);
        free(env);
        return store_fail(m, ENOMEM, "out of memory");
    }
    pthread_mutex_init(&env->se_lock, NULL);
    pthread_mutex_init(&env->se_switch, NULL);
    env->se_flags = flags & (STORE_READONLY | STORE_OPEN_V1);
    env->se_map_req = map_size ? map_size : STORE_DEFAULT_MAP;
    int rc = store_gen_open(path, flags, init, map_size, &env->se_gen, m);
    if (rc) {
        store_close(env);
        return rc;
    }
    env->se_gen->g_refs = 1;
    *out = env;
    return 0;
}

void store_close(store_env *env)
{
    if (!env)
        return;
    if (env->se_gen)
        gen_release(env, env->se_gen);
    pthread_mutex_destroy(&env->se_lock);
    pthread_mutex_destroy(&env->se_switch);
    free(env->se_path);
    free(env->se_data);
    free(env);
}

/* Grows the map: doubles it, by at most STORE_GROW_MAX. Called with no transaction live in
 * this thread; waits for those of other threads. */
static int grow_map(store_gen *g, store_msg *m)
{
    pthread_rwlock_wrlock(&g->g_grow);
    MDB_envinfo info;
    mdb_env_info(g->g_env, &info);
    size_t cur = info.me_mapsize;
    size_t add = cur < STORE_GROW_MAX ? cur : STORE_GROW_MAX;
    int rc = mdb_env_set_mapsize(g->g_env, cur + add);
    store_gen_find_map(g); /* the map may have moved */
    pthread_rwlock_unlock(&g->g_grow);
    if (rc)
        return store_map_lmdb(m, rc, "growing the map");
    return 0;
}

/* Another process grew the map: adopt its size (mdb_env_set_mapsize with 0). */
static int adopt_map(store_gen *g, store_msg *m)
{
    pthread_rwlock_wrlock(&g->g_grow);
    int rc = mdb_env_set_mapsize(g->g_env, 0);
    store_gen_find_map(g);
    pthread_rwlock_unlock(&g->g_grow);
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
    struct stat st;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        stat(env->se_data, &st) == 0 && (uint64_t)st.st_size + slack >= (uint64_t)rl.rlim_cur)
        return store_fail(m, EFBIG, "committing: '%s' reached the process's file size limit",
                          env->se_path);
    return store_fail(m, EIO, "committing: input/output error writing '%s'", env->se_path);
}

/* What every snapshot and change of an environment whose meta pages disagree answers. */
static int meta_refusal(const store_env *env, const store_gen *g, store_msg *m)
{
    return store_fail(m, TARTAN_ECORRUPT,
                      "'%s': %s; LMDB could read an older state of the index, so nothing is read "
                      "or written: 'tartan check --repair' rewrites the index from its newest "
                      "snapshot",
                      env->se_path, g->g_meta_why);
}

/* Each change retries at most this often: every retry at least doubles the map (or follows a
 * rewrite to the new environment), so more means the change cannot fit the address space. */
#define STORE_MAX_RETRIES 40

static void txn_close_cursors(store_txn *t)
{
    if (t->st_docs)
        mdb_cursor_close(t->st_docs);
    t->st_docs = NULL;
    memset(&t->st_seg, 0, sizeof t->st_seg);
    memset(&t->st_seg_pf, 0, sizeof t->st_seg_pf);
}

int store_write(store_env *env, store_write_fn fn, void *ctx, store_msg *m)
{
    if (env->se_flags & STORE_READONLY)
        return store_fail(m, TARTAN_EREADONLY, "'%s' is open read-only", env->se_path);
    for (int attempt = 0; attempt < STORE_MAX_RETRIES; attempt++) {
        store_gen *g = gen_acquire(env);
        pthread_rwlock_rdlock(&g->g_grow);
        MDB_txn *txn;
        int rc = mdb_txn_begin(g->g_env, NULL, 0, &txn);
        if (rc == MDB_MAP_RESIZED) {
            pthread_rwlock_unlock(&g->g_grow);
            rc = adopt_map(g, m);
            gen_release(env, g);
            if (rc)
                return rc;
            continue;
        }
        if (rc) {
            pthread_rwlock_unlock(&g->g_grow);
            gen_release(env, g);
            return store_map_lmdb(m, rc, "beginning a write transaction");
        }
        /* Holding the writer lock: a rewrite that replaced this environment has swapped the
         * directory already, so looking now is decisive. Never write into a replaced file. */
        uint64_t fsize;
        if (gen_replaced(env, g, &fsize)) {
            mdb_txn_abort(txn);
            pthread_rwlock_unlock(&g->g_grow);
            rc = gen_switch(env, g, m);
            gen_release(env, g);
            if (rc)
                return rc;
            continue;
        }
        if (g->g_version < STORE_FORMAT_VERSION || g->g_version > STORE_FORMAT_MAX) {
            mdb_txn_abort(txn);
            pthread_rwlock_unlock(&g->g_grow);
            gen_release(env, g);
            return store_fail(m, TARTAN_EVERSION,
                              "'%s': index format version %u; convert it first", env->se_path,
                              g->g_version);
        }
        if (g->g_meta_bad) {
            mdb_txn_abort(txn);
            pthread_rwlock_unlock(&g->g_grow);
            gen_release(env, g);
            return meta_refusal(env, g, m);
        }
        store_txn t = {.st_txn = txn, .st_env = env, .st_gen = g, .st_write = 1, .st_fsize = fsize};
        m->text[0] = 0;
        rc = fn(&t, ctx, m);
        /* Every commit advances the commit record (FORMAT.md "meta/commit"). */
        if (rc == 0 && t.st_dirty)
            rc = store_commit_mark(&t, m);
        txn_close_cursors(&t);
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
        pthread_rwlock_unlock(&g->g_grow);
        if (full)
            rc = grow_map(g, m);
        gen_release(env, g);
        if (!full || rc)
            return rc;
    }
    return store_fail(m, ENOSPC, "the map could not grow enough for this change");
}

int store_read_begin(store_env *env, store_txn **out, store_msg *m)
{
    *out = NULL;
    store_txn *t = calloc(1, sizeof *t);
    if (!t)
        return store_fail(m, ENOMEM, "out of memory");
    for (int attempt = 0; attempt < 8; attempt++) {
        store_gen *g = gen_acquire(env);
        pthread_rwlock_rdlock(&g->g_grow);
        int rc = mdb_txn_begin(g->g_env, NULL, MDB_RDONLY, &t->st_txn);
        if (rc == MDB_MAP_RESIZED) {
            pthread_rwlock_unlock(&g->g_grow);
            rc = adopt_map(g, m);
            gen_release(env, g);
            if (rc) {
                free(t);
                return rc;
            }
            continue;
        }
        if (rc) {
            pthread_rwlock_unlock(&g->g_grow);
            gen_release(env, g);
            free(t);
            return store_map_lmdb(m, rc, "beginning a read transaction");
        }
        /* Looked at after the snapshot began: the file then holds every page it reads. */
        uint64_t fsize;
        if (gen_replaced(env, g, &fsize)) {
            mdb_txn_abort(t->st_txn);
            pthread_rwlock_unlock(&g->g_grow);
            rc = gen_switch(env, g, m);
            gen_release(env, g);
            if (rc) {
                free(t);
                return rc;
            }
            continue;
        }
        if (g->g_meta_bad) {
            mdb_txn_abort(t->st_txn);
            pthread_rwlock_unlock(&g->g_grow);
            rc = meta_refusal(env, g, m);
            gen_release(env, g);
            free(t);
            return rc;
        }
        t->st_env = env;
        t->st_gen = g;
        t->st_fsize = fsize;
        *out = t;
        return 0;
    }
    free(t);
    return store_fail(m, TARTAN_ESTORAGE, "the map kept changing size");
}

void store_read_end(store_env *env, store_txn *t)
{
    if (!t)
        return;
    txn_close_cursors(t);
    mdb_txn_abort(t->st_txn);
    pthread_rwlock_unlock(&t->st_gen->g_grow);
    gen_release(env, t->st_gen);
    free(t);
}
