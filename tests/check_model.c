/*
 * check_model.c: a model-based randomized test of the engine, through its public API
 * (engine/tartan.h) and the `tartan` command, checked after every step against a plain
 * in-memory model of what the index must hold.
 *
 * One writer (the main thread) runs a long random sequence of steps on an index: adds (batches
 * of random sizes and dtypes, TARTAN_REPLACE of existing ids, batches the API must refuse),
 * deletes (ids that exist, ids deleted before, ids never seen, repeats), an explicit
 * tartan_train, closing and reopening the handle, `tartan search` / `tartan info` /
 * `tartan check` in a second process that opens the index read-only while the writer goes on,
 * writes done by a child process killed with SIGKILL at a random moment, and writes whose
 * write()/pwrite()/writev()/fsync()/fdatasync() on the data file fails (ENOSPC or EIO) at a
 * random call. Meanwhile several reader threads search the same handle (exhaustive, PLAID with
 * default and random parameters, subsets, batches of ragged queries, OpenMP threads 0..4) and
 * call tartan_info. Indexes live for an "epoch" of steps (a random dimension, nbits, number of
 * centroids and token family each), then the next starts.
 *
 * The model. Every committed change makes a new version; a document record is visible in the
 * versions [born, died). The writer publishes `pending` (the version its change will make)
 * before calling the library and `committed` after the model holds the change, so that a call
 * that started with committed = lo and ended with pending = hi saw one of the versions lo..hi;
 * its results must match one of them completely (every query of a batch the same one): never
 * half a batch. After each step the writer also checks the current version exactly:
 * tartan_info's counts and byte formulas, an exhaustive search returning every live document
 * with its score, another random search, and tartan_check every few steps.
 *
 * Which reference is exact. The index stores each token as a centroid code and a quantised
 * residual, so MaxSim over the original vectors differs from the index's by the quantisation
 * error (about 0.1 per query token at nbits 2): too coarse to tell a wrong score from
 * rounding. Instead the model reads each document's decompressed tokens from the index once,
 * right after the add that wrote it (index/index.h's reader: the same decompression a search
 * applies), checks them against the vectors given (same token count; mean cosine to the
 * originals above a floor for the nbits, which catches a document stored with another's
 * tokens), and from then on scores in double precision from that copy. The index scores in
 * fp32 from codes and residuals; the two agree within TOL_PER_TOKEN per query token (measured
 * largest difference: printed at the end). A wrong document, a missing or stale one, a lost
 * replace (the model's copy comes from the new encoding) or a wrong score each differ by far
 * more than that (scores of random tokens differ by about 0.05 per query token).
 * PLAID's approximate stages are not modelled: a PLAID search must return live documents of
 * one version with their exact scores, in order, and is exact (the model's top k) where the
 * API says it is: a subset of at most ndocs live documents (256 with the adaptive default
 * ndocs 0), or every centroid probed, no threshold and ndocs above four times the documents
 * (of the version searched: an add that lands during the call may take it past that).
 *
 * Reproducing. The writer's sequence depends on the seed only: a killed write that had not
 * landed, and a write failed on purpose, are redone afterwards, so every run of a seed makes
 * the same changes (readers and kill moments vary). A failure prints the seed, epoch and step
 * and keeps the index: TARTAN_MODEL_SEED=<seed> (or `SEED=<seed> make soak`) replays it.
 *
 * Knobs (environment): TARTAN_MODEL_SECONDS (default 40), TARTAN_MODEL_SEED (default from
 * the clock), TARTAN_MODEL_READERS (default 3), TARTAN_MODEL_STEPS (stop after that many
 * steps), TARTAN_MODEL_KILLS=0, TARTAN_MODEL_FAULTS=0, TARTAN_MODEL_PROCS=0 (leave those steps
 * out), TARTAN_MODEL_STALL (seconds without progress that count as a hang, default 300),
 * TARTAN_MODEL_DIR (scratch, default $TMPDIR or /tmp), TARTAN_MODEL_VERBOSE=1. `top_builddir`
 * locates the `tartan` command for the second-process steps (skipped without it).
 */
#define _GNU_SOURCE
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "index.h"
#include "store_internal.h"
#include "tartan.h"

extern char **environ;

/* Largest |index score - model score| per query token accepted. The index scores in fp32
 * ((q . C[code] + sum_j q_j w[b_j]) * inv_norm, stored inverse norms), the model in double from
 * the decompressed fp32 tokens: measured differences stay below 1e-6 per token (dim <= 128);
 * 2e-5 leaves room for long documents and sums over 32 query tokens, and is still about a
 * thousand times smaller than the score gap a wrong document makes. */
#define TOL_PER_TOKEN 2e-5
/* A GPU search rounds the residual term to fp16 (tartan.h: about 1e-4 per query token). */
#define TOL_PER_TOKEN_GPU 5e-4

#define NEVER UINT64_MAX
/* The most documents one add makes (gen_change). */
#define ADD_MAX 149
/* Slots of the versions in use: 0 the writer, 1 the second process, 2.. the readers. */
#define SLOT_WRITER 0
#define SLOT_PROC 1
#define MAX_READERS 16
#define MAX_SLOTS (2 + MAX_READERS)

/* ---- configuration, time, failure ------------------------------------------------------------ */

static struct {
    double seconds;
    uint64_t seed;
    int readers;
    long max_steps;
    int kills, faults, procs;
    int verbose;
    double stall;
    double tol;
    tartan_device device;
    char tartan[1024]; /* the `tartan` command; empty: second-process steps are skipped */
    char self[1024];   /* this program, for the killed writers */
    char work[512];    /* this run's scratch directory */
} cfg;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Where the writer is, for failure messages (atomics: any thread may report). */
static _Atomic int cur_epoch;
static _Atomic long cur_step;
static _Atomic(const char *) cur_op = "start";
static _Atomic double last_progress;
static _Atomic pid_t child_pid, proc_pid;
static char cur_ix[700];

static pthread_mutex_t die_mu = PTHREAD_MUTEX_INITIALIZER;

/* Reports a difference from the model (or a broken promise) and ends the process at once,
 * keeping the index for inspection. Any thread. */
static _Noreturn __attribute__((format(printf, 1, 2))) void die(const char *fmt, ...)
{
    pthread_mutex_lock(&die_mu);
    fflush(stdout);
    fprintf(stderr,
            "check_model: FAIL (seed %llu, epoch %d, step %ld, %s): ", (unsigned long long)cfg.seed,
            atomic_load(&cur_epoch), atomic_load(&cur_step), atomic_load(&cur_op));
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "\ncheck_model: replay with TARTAN_MODEL_SEED=%llu (make soak: SEED=%llu); the "
            "index is kept in %s\n",
            (unsigned long long)cfg.seed, (unsigned long long)cfg.seed, cur_ix);
    pid_t p;
    if ((p = atomic_load(&child_pid)) > 0)
        kill(p, SIGKILL);
    if ((p = atomic_load(&proc_pid)) > 0)
        kill(p, SIGKILL);
    _exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t n, size_t s)
{
    void *p = calloc(n ? n : 1, s ? s : 1);
    if (!p)
        die("out of memory");
    return p;
}

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p)
        die("out of memory");
    return p;
}

static void progress(const char *op)
{
    atomic_store(&cur_op, op);
    atomic_store(&last_progress, now());
}

/* ---- statistics ------------------------------------------------------------------------------ */

static struct {
    _Atomic long steps, epochs, adds, replaces, refused, deletes, deleted, trains, reopens, kills,
        kill_landed, kill_late, kill_finished, faults, faults_fired, faults_fatal, procs, checks,
        reader_calls, reader_infos, writer_searches, range_wider;
} st;

static pthread_mutex_t err_mu = PTHREAD_MUTEX_INITIALIZER;
static double max_err_per_token; /* guarded by err_mu */

static void note_err(double e)
{
    pthread_mutex_lock(&err_mu);
    if (e > max_err_per_token)
        max_err_per_token = e;
    pthread_mutex_unlock(&err_mu);
}

/* ---- random numbers (splitmix64: one stream per thread) -------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rnext(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t rbelow(rng *r, size_t n)
{
    return n ? (size_t)(rnext(r) % n) : 0;
}

static double runif(rng *r)
{
    return (double)(rnext(r) >> 11) / 9007199254740992.0;
}

static double rgauss(rng *r)
{
    double u = runif(r) + 1e-300, v = runif(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* ---- fp16 and bf16 (inputs of the other dtypes) ---------------------------------------------- */

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; the values here are small, so no infinities. */
static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, m = x & 0x7fffffu;
    int e = (int)((x >> 23) & 0xff) - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7bffu);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        m |= 0x800000u;
        unsigned shift = (unsigned)(14 - e);
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    uint32_t m = h & 0x3ffu;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400u), e - 25);
    return (h & 0x8000u) ? -v : v;
}

/* ---- write failures on purpose ------------------------------------------------------------------
 *
 * The test program defines write, pwrite, writev, fsync, fdatasync and msync itself. The
 * library is linked in statically, LMDB as a shared library, so LMDB's calls resolve to these
 * (the executable comes first in symbol lookup); each passes through to the next definition
 * (libc's, or a sanitizer's interceptor) unless a failure is armed. Only calls on the index's
 * data file count (matched by device and inode), so the test's own output and the second
 * process are never touched. Armed, the N-th counted call (and with `sticky` every later one)
 * fails without writing anything, with errno ENOSPC or EIO.
 */

enum { INJ_OFF = 0, INJ_COUNT = 1, INJ_ARMED = 2 };
enum { INJ_WRITES = 1, INJ_SYNCS = 2 };

static struct {
    _Atomic int mode;
    _Atomic long calls;
    _Atomic int fired;
    long at;
    int err, sticky, classes;
    dev_t dev;
    ino_t ino;
} inj;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_msync)(void *, size_t, int);

static void *next_fn(const char *name)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (!p)
        p = dlsym(RTLD_DEFAULT, name);
    return p;
}

/* The build hides symbols by default; these must be seen by the shared libraries. */
#define INTERPOSE __attribute__((visibility("default")))

/* Resolved before main, while there is one thread. */
__attribute__((constructor)) static void inj_resolve(void)
{
    real_write = (ssize_t(*)(int, const void *, size_t))next_fn("write");
    real_pwrite = (ssize_t(*)(int, const void *, size_t, off_t))next_fn("pwrite");
    real_writev = (ssize_t(*)(int, const struct iovec *, int))next_fn("writev");
    real_fsync = (int (*)(int))next_fn("fsync");
    real_fdatasync = (int (*)(int))next_fn("fdatasync");
    real_msync = (int (*)(void *, size_t, int))next_fn("msync");
}

/* Whether this call (on fd, -1 for msync) fails; sets errno then. */
static int inj_fail(int fd, int cls)
{
    int mode = atomic_load_explicit(&inj.mode, memory_order_acquire);
    if (mode == INJ_OFF)
        return 0;
    if (fd >= 0) {
        struct stat s;
        if (fstat(fd, &s) != 0 || s.st_dev != inj.dev || s.st_ino != inj.ino)
            return 0;
    }
    if (mode == INJ_COUNT) {
        atomic_fetch_add(&inj.calls, 1);
        return 0;
    }
    if (!(cls & inj.classes))
        return 0;
    long n = atomic_fetch_add(&inj.calls, 1) + 1;
    if (n == inj.at || (inj.sticky && n > inj.at)) {
        atomic_store(&inj.fired, 1);
        errno = inj.err;
        return 1;
    }
    return 0;
}

INTERPOSE ssize_t write(int fd, const void *buf, size_t n)
{
    if (inj_fail(fd, INJ_WRITES))
        return -1;
    return real_write(fd, buf, n);
}

INTERPOSE ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (inj_fail(fd, INJ_WRITES))
        return -1;
    return real_pwrite(fd, buf, n, off);
}

INTERPOSE ssize_t writev(int fd, const struct iovec *iov, int n)
{
    if (inj_fail(fd, INJ_WRITES))
        return -1;
    return real_writev(fd, iov, n);
}

INTERPOSE int fsync(int fd)
{
    if (inj_fail(fd, INJ_SYNCS))
        return -1;
    return real_fsync(fd);
}

INTERPOSE int fdatasync(int fd)
{
    if (inj_fail(fd, INJ_SYNCS))
        return -1;
    return real_fdatasync(fd);
}

INTERPOSE int msync(void *addr, size_t len, int flags)
{
    if (inj_fail(-1, INJ_SYNCS))
        return -1;
    return real_msync(addr, len, flags);
}

/* Starts counting the data file's write calls (the index must exist). */
static void inj_count(const char *ix)
{
    char p[800];
    snprintf(p, sizeof p, "%s/data.mdb", ix);
    struct stat s;
    if (stat(p, &s) != 0)
        die("%s: %s", p, strerror(errno));
    inj.dev = s.st_dev;
    inj.ino = s.st_ino;
    atomic_store(&inj.calls, 0);
    atomic_store(&inj.fired, 0);
    atomic_store_explicit(&inj.mode, INJ_COUNT, memory_order_release);
}

static void inj_arm(long at, int err, int sticky, int classes)
{
    inj.at = at;
    inj.err = err;
    inj.sticky = sticky;
    inj.classes = classes;
    atomic_store(&inj.calls, 0);
    atomic_store(&inj.fired, 0);
    atomic_store_explicit(&inj.mode, INJ_ARMED, memory_order_release);
}

/* Stops counting or failing; returns the calls counted. */
static long inj_off(void)
{
    atomic_store_explicit(&inj.mode, INJ_OFF, memory_order_release);
    return atomic_load(&inj.calls);
}

/* ---- a small string -> pointer hash map (open addressing; no removal) ------------------------ */

typedef struct idmap {
    size_t cap, n;
    const char **key;
    void **val;
} idmap;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void idmap_init(idmap *m, size_t hint)
{
    m->cap = 16;
    while (m->cap < 2 * hint + 16)
        m->cap *= 2;
    m->n = 0;
    m->key = xcalloc(m->cap, sizeof *m->key);
    m->val = xcalloc(m->cap, sizeof *m->val);
}

static void idmap_free(idmap *m)
{
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static size_t idmap_find(const idmap *m, const char *k)
{
    size_t i = (size_t)hash_str(k) & (m->cap - 1);
    while (m->key[i] && strcmp(m->key[i], k))
        i = (i + 1) & (m->cap - 1);
    return i;
}

static void *idmap_get(const idmap *m, const char *k)
{
    size_t i = idmap_find(m, k);
    return m->key[i] ? m->val[i] : NULL;
}

/* k must outlive the map. */
static void idmap_put(idmap *m, const char *k, void *v)
{
    if (2 * (m->n + 1) > m->cap) {
        idmap old = *m;
        idmap_init(m, old.cap);
        for (size_t i = 0; i < old.cap; i++)
            if (old.key[i])
                idmap_put(m, old.key[i], old.val[i]);
        idmap_free(&old);
    }
    size_t i = idmap_find(m, k);
    if (!m->key[i]) {
        m->key[i] = k;
        m->n++;
    }
    m->val[i] = v;
}

/* ---- the model ------------------------------------------------------------------------------- */

/* One document as the index holds it: visible in the versions [born, died). */
typedef struct rdoc {
    char *id;
    uint32_t ntok;
    float *tok; /* [ntok, dim]: decompressed from the index right after its add */
    uint64_t born, died;
    uint64_t seq; /* add order: ties go to the document added first */
} rdoc;

static struct {
    size_t dim;
    unsigned nbits;
    pthread_rwlock_t lock; /* the records; the writer changes them under the write lock */
    rdoc **rec;            /* every record a version in use may see, in add order */
    size_t n, cap;
    pthread_mutex_t mu; /* committed, active; cv: committed moved */
    pthread_cond_t cv;
    _Atomic uint64_t committed, pending;
    _Atomic uint64_t active[MAX_SLOTS]; /* the oldest version each user may still check */
    uint64_t seq;
    /* The writer's own: the current live documents. */
    idmap live;
    size_t nlive;
    uint64_t live_tokens;
    int trained;
    uint64_t next_id;
} M;

static int visible(const rdoc *d, uint64_t v)
{
    return d->born <= v && v < d->died;
}

static void rdoc_free(rdoc *d)
{
    if (!d)
        return;
    free(d->id);
    free(d->tok);
    free(d);
}

/* The writer's map of live ids, rebuilt from the records after each change. */
static void live_rebuild(void)
{
    idmap_free(&M.live);
    idmap_init(&M.live, M.n);
    M.nlive = 0;
    M.live_tokens = 0;
    for (size_t i = 0; i < M.n; i++)
        if (M.rec[i]->died == NEVER) {
            idmap_put(&M.live, M.rec[i]->id, M.rec[i]);
            M.nlive++;
            M.live_tokens += M.rec[i]->ntok;
        }
}

/* Makes version committed + 1 (announced as pending already): added records are born, gone
 * ones die. No other thread changes records, so the writer reads them without the lock. */
/* Ids deleted or replaced lately (the writer's, for deletes of ids that are gone). */
#define NDEAD 64
static char *dead_ids[NDEAD];
static size_t n_dead;

static void model_commit(rdoc **added, size_t nadd, rdoc **gone, size_t ngone)
{
    for (size_t i = 0; i < ngone; i++) {
        free(dead_ids[n_dead % NDEAD]);
        dead_ids[n_dead++ % NDEAD] = xstrdup(gone[i]->id);
    }
    uint64_t v = atomic_load(&M.committed) + 1;
    if (atomic_load(&M.pending) != v)
        die("internal: pending %llu, committing %llu", (unsigned long long)M.pending,
            (unsigned long long)v);
    pthread_rwlock_wrlock(&M.lock);
    for (size_t i = 0; i < ngone; i++)
        gone[i]->died = v;
    if (M.n + nadd > M.cap) {
        M.cap = 2 * (M.n + nadd) + 64;
        rdoc **r = realloc(M.rec, M.cap * sizeof *r);
        if (!r)
            die("out of memory");
        M.rec = r;
    }
    for (size_t i = 0; i < nadd; i++) {
        added[i]->born = v;
        added[i]->died = NEVER;
        added[i]->seq = ++M.seq;
        M.rec[M.n++] = added[i];
    }
    pthread_rwlock_unlock(&M.lock);
    pthread_mutex_lock(&M.mu);
    atomic_store(&M.committed, v);
    pthread_cond_broadcast(&M.cv);
    pthread_mutex_unlock(&M.mu);
    live_rebuild();
}

static void model_announce(void)
{
    atomic_store(&M.pending, atomic_load(&M.committed) + 1);
}

/* Takes the versions from now on for slot; returns the current one. */
static uint64_t model_enter(int slot)
{
    pthread_mutex_lock(&M.mu);
    uint64_t v = atomic_load(&M.committed);
    atomic_store(&M.active[slot], v);
    pthread_mutex_unlock(&M.mu);
    return v;
}

static void model_leave(int slot)
{
    atomic_store(&M.active[slot], NEVER);
}

/* Waits until the model holds version v (the writer is between its library call and
 * model_commit). */
static void model_wait(uint64_t v)
{
    pthread_mutex_lock(&M.mu);
    while (atomic_load(&M.committed) < v)
        pthread_cond_wait(&M.cv, &M.mu);
    pthread_mutex_unlock(&M.mu);
}

/* Frees the records no version in use can see. Writer only. */
static void model_gc(void)
{
    pthread_mutex_lock(&M.mu);
    uint64_t lo = atomic_load(&M.committed);
    for (int i = 0; i < MAX_SLOTS; i++) {
        uint64_t a = atomic_load(&M.active[i]);
        if (a < lo)
            lo = a;
    }
    pthread_mutex_unlock(&M.mu);
    pthread_rwlock_wrlock(&M.lock);
    size_t j = 0;
    for (size_t i = 0; i < M.n; i++) {
        if (M.rec[i]->died <= lo)
            rdoc_free(M.rec[i]);
        else
            M.rec[j++] = M.rec[i];
    }
    M.n = j;
    pthread_rwlock_unlock(&M.lock);
    live_rebuild();
}

static void model_reset(size_t dim, unsigned nbits)
{
    for (size_t i = 0; i < M.n; i++)
        rdoc_free(M.rec[i]);
    M.n = 0;
    M.seq = 0;
    M.dim = dim;
    M.nbits = nbits;
    M.trained = 0;
    atomic_store(&M.committed, 0);
    atomic_store(&M.pending, 0);
    for (int i = 0; i < MAX_SLOTS; i++)
        atomic_store(&M.active[i], NEVER);
    live_rebuild();
}

/* The documents of version v, in add order, with an id lookup. Called with M.lock held. */
typedef struct view {
    uint64_t v;
    rdoc **d;
    size_t n;
    uint64_t tokens;
    idmap ids; /* id -> position + 1 */
} view;

static void view_build(view *w, uint64_t v)
{
    w->v = v;
    w->d = xmalloc(M.n * sizeof *w->d);
    w->n = 0;
    w->tokens = 0;
    for (size_t i = 0; i < M.n; i++)
        if (visible(M.rec[i], v)) {
            w->d[w->n++] = M.rec[i];
            w->tokens += M.rec[i]->ntok;
        }
    idmap_init(&w->ids, w->n);
    for (size_t i = 0; i < w->n; i++)
        idmap_put(&w->ids, w->d[i]->id, (void *)(uintptr_t)(i + 1));
}

static void view_free(view *w)
{
    free(w->d);
    idmap_free(&w->ids);
}

/* ---- queries and the reference score --------------------------------------------------------- */

typedef struct qbatch {
    size_t nq;
    size_t *qlens; /* NULL: every query `fixed` tokens */
    size_t fixed;
    size_t *off; /* [nq + 1] first token of each query */
    size_t rows, dim;
    tartan_dtype dtype;
    void *emb;  /* [rows, dim] of dtype */
    double *qn; /* [rows, dim] the values as the library reads them, L2-normalised */
} qbatch;

static void qbatch_free(qbatch *b)
{
    free(b->qlens);
    free(b->off);
    free(b->emb);
    free(b->qn);
    memset(b, 0, sizeof *b);
}

/* A pool of tokens to build queries near real documents: copies of some records' tokens. */
typedef struct pool {
    float *tok;
    size_t n, cap; /* tokens held; floats allocated (the dimension changes between epochs) */
    size_t doc_first, doc_n; /* one whole document of the pool (a query of its own tokens) */
} pool;

static void pool_fill(pool *p, rng *r, size_t dim)
{
    p->n = 0;
    p->doc_n = 0;
    pthread_rwlock_rdlock(&M.lock);
    for (int k = 0; k < 4 && M.n; k++) {
        const rdoc *d = M.rec[rbelow(r, M.n)];
        if ((p->n + d->ntok) * dim > p->cap) {
            p->cap = (2 * (p->n + d->ntok) + 64) * dim;
            float *t = realloc(p->tok, p->cap * sizeof *t);
            if (!t)
                die("out of memory");
            p->tok = t;
        }
        if (k == 0) {
            p->doc_first = 0;
            p->doc_n = d->ntok;
        }
        memcpy(p->tok + p->n * dim, d->tok, (size_t)d->ntok * dim * sizeof(float));
        p->n += d->ntok;
    }
    pthread_rwlock_unlock(&M.lock);
}

/* nq queries of random tokens, tokens near the pool's (noise of random size), or one
 * document's own tokens (its score is then the query's length, the most there is); f32 or
 * bf16; fixed length or ragged. plain: fixed length and f32 (what a .npy file holds). */
static void qbatch_make(qbatch *b, rng *r, size_t dim, const pool *p, size_t nq, int plain)
{
    memset(b, 0, sizeof *b);
    b->nq = nq;
    b->dim = dim;
    b->off = xmalloc((nq + 1) * sizeof *b->off);
    size_t *len = xmalloc(nq * sizeof *len);
    int ragged = !plain && nq > 1 && rbelow(r, 2);
    size_t fixed = 1 + rbelow(r, 32);
    int self = p->doc_n > 0 && p->doc_n <= 32 && rbelow(r, 4) == 0;
    if (self && !ragged)
        fixed = p->doc_n;
    for (size_t i = 0; i < nq; i++)
        len[i] = !ragged ? fixed : self && i == 0 ? p->doc_n : 1 + rbelow(r, 32);
    b->off[0] = 0;
    for (size_t i = 0; i < nq; i++)
        b->off[i + 1] = b->off[i] + len[i];
    b->rows = b->off[nq];
    if (ragged)
        b->qlens = len;
    else {
        b->fixed = fixed;
        free(len);
    }
    b->dtype = !plain && rbelow(r, 4) == 0 ? TARTAN_BFLOAT16 : TARTAN_FLOAT32;
    float *x = xmalloc(b->rows * dim * sizeof *x);
    for (size_t i = 0; i < nq; i++) {
        int src = p->n ? (int)rbelow(r, 3) : 0; /* 0 random, 1 near the pool, 2 the pool doc */
        if (self && i == 0)
            src = 2;
        double noise = rbelow(r, 3) == 0 ? 0.0 : 0.05 + 0.5 * runif(r);
        for (size_t t = b->off[i]; t < b->off[i + 1]; t++) {
            float *o = x + t * dim;
            const float *base = NULL;
            if (src == 2 && p->doc_n)
                base = p->tok + (p->doc_first + (t - b->off[i]) % p->doc_n) * dim;
            else if (src == 1)
                base = p->tok + rbelow(r, p->n) * dim;
            for (size_t j = 0; j < dim; j++)
                o[j] = base ? base[j] + (src == 2 ? 0.0f : (float)(noise * rgauss(r) / sqrt(dim)))
                            : (float)rgauss(r);
        }
    }
    b->qn = xmalloc(b->rows * dim * sizeof *b->qn);
    if (b->dtype == TARTAN_BFLOAT16) {
        uint16_t *h = xmalloc(b->rows * dim * sizeof *h);
        for (size_t i = 0; i < b->rows * dim; i++) {
            h[i] = f32_to_bf16(x[i]);
            b->qn[i] = bf16_to_f32(h[i]);
        }
        b->emb = h;
        free(x);
    } else {
        for (size_t i = 0; i < b->rows * dim; i++)
            b->qn[i] = x[i];
        b->emb = x;
    }
    for (size_t t = 0; t < b->rows; t++) {
        double ss = 0;
        for (size_t j = 0; j < dim; j++)
            ss += b->qn[t * dim + j] * b->qn[t * dim + j];
        if (ss == 0) { /* (never drawn: a zero token would be refused) */
            b->qn[t * dim] = 1;
            ss = 1;
            if (b->dtype == TARTAN_FLOAT32)
                ((float *)b->emb)[t * dim] = 1;
            else
                ((uint16_t *)b->emb)[t * dim] = f32_to_bf16(1.0f);
        }
        double inv = 1.0 / sqrt(ss);
        for (size_t j = 0; j < dim; j++)
            b->qn[t * dim + j] *= inv;
    }
}

static tartan_queries qbatch_api(const qbatch *b)
{
    tartan_queries q = {b->nq, b->qlens, b->fixed, b->emb, b->rows, b->dim, b->dtype};
    return q;
}

/* MaxSim of a normalised query against a record's decompressed (unit) tokens, in double. */
static double maxsim_ref(const double *q, size_t lq, const rdoc *d, size_t dim)
{
    double s = 0;
    for (size_t i = 0; i < lq; i++) {
        double best = -INFINITY;
        for (uint32_t t = 0; t < d->ntok; t++) {
            const float *x = d->tok + (size_t)t * dim;
            double dot = 0;
            for (size_t j = 0; j < dim; j++)
                dot += q[i * dim + j] * x[j];
            if (dot > best)
                best = dot;
        }
        s += best;
    }
    return s;
}

/* ---- checking search results ----------------------------------------------------------------- */

/* How exact a search is promised to be (tartan.h). */
enum {
    MODE_EXACT = 1, /* exhaustive, or PLAID with every centroid probed and nothing pruned */
    MODE_PLAID = 2  /* exact for a subset of at most ndocs live documents (256 with ndocs 0,
                       adaptive); else only consistent */
};

typedef struct call {
    qbatch qb;
    tartan_search_params p;
    int mode;
    /* PLAID with nothing pruned (ndocs set): exact only for a version of at most this many
     * live documents (0: no such limit). */
    size_t exact_upto;
    char **subset; /* owned copies */
    size_t n_subset;
    idmap subset_ids;
    int has_subset;
} call;

static void call_free(call *c)
{
    qbatch_free(&c->qb);
    for (size_t i = 0; i < c->n_subset; i++)
        free(c->subset[i]);
    free(c->subset);
    if (c->has_subset)
        idmap_free(&c->subset_ids);
    memset(c, 0, sizeof *c);
}

/*
 * Checks one query's hits against view w. Returns 0, or 1 with a description in why: a hit
 * that is no live document of this version (or outside the subset), a duplicate, a score off
 * the model's by more than the tolerance, hits out of order (or a tie not in add order), more
 * than k hits; where the search is exact also a wrong count or a better document left out.
 */
static int check_hits(const view *w, const call *c, size_t qi, const tartan_hit *h, size_t cnt,
                      char *why, size_t wl)
{
    const qbatch *b = &c->qb;
    const double *q = b->qn + b->off[qi] * b->dim;
    size_t lq = b->off[qi + 1] - b->off[qi];
    double tol = cfg.tol * (double)lq;
    size_t n = w->n;
    unsigned char *el = xcalloc(n, 1), *seen = xcalloc(n, 1);
    double *ref = xmalloc(n * sizeof *ref);
    size_t nel = 0;
    for (size_t i = 0; i < n; i++) {
        el[i] = !c->has_subset || idmap_get(&c->subset_ids, w->d[i]->id) != NULL;
        nel += el[i];
        ref[i] = NAN;
    }
    /* A subset scored exactly, all of it: tartan.h says "at most max(ndocs, 256) live
     * documents"; engine/search.c scores it so up to 256 with ndocs 0 (adaptive) but only up
     * to ndocs with ndocs set. The model holds the engine to what both say. */
    size_t small = c->p.ndocs ? c->p.ndocs : 256;
    int exact = (c->mode == MODE_EXACT && (!c->exact_upto || n <= c->exact_upto)) ||
                (c->has_subset && nel <= small);
    int bad = 1;
    if (cnt > c->p.k) {
        snprintf(why, wl, "%zu hits for k %zu", cnt, c->p.k);
        goto out;
    }
    size_t prev = 0;
    double lowest = INFINITY;
    for (size_t j = 0; j < cnt; j++) {
        uintptr_t pos = (uintptr_t)idmap_get(&w->ids, h[j].id);
        if (!pos) {
            snprintf(why, wl, "hit %zu '%s' is no live document of version %llu", j, h[j].id,
                     (unsigned long long)w->v);
            goto out;
        }
        size_t i = pos - 1;
        if (!el[i]) {
            snprintf(why, wl, "hit %zu '%s' is not in the subset", j, h[j].id);
            goto out;
        }
        if (seen[i]) {
            snprintf(why, wl, "hit %zu '%s' appears twice", j, h[j].id);
            goto out;
        }
        seen[i] = 1;
        ref[i] = maxsim_ref(q, lq, w->d[i], b->dim);
        double e = fabs((double)h[j].score - ref[i]);
        if (!(e <= tol)) {
            snprintf(why, wl, "hit %zu '%s' scores %.9g, the model %.9g (tolerance %.2g)", j,
                     h[j].id, (double)h[j].score, ref[i], tol);
            goto out;
        }
        if (j > 0) {
            if (h[j].score > h[j - 1].score) {
                snprintf(why, wl, "hit %zu '%s' (%.9g) ranks below a lower score (%.9g)", j,
                         h[j].id, (double)h[j].score, (double)h[j - 1].score);
                goto out;
            }
            if (h[j].score == h[j - 1].score && w->d[i]->seq < w->d[prev]->seq) {
                snprintf(why, wl, "tie at %.9g: '%s' added before '%s' ranks after it",
                         (double)h[j].score, h[j].id, h[j - 1].id);
                goto out;
            }
        }
        prev = i;
        if (ref[i] < lowest)
            lowest = ref[i];
    }
    if (exact) {
        size_t want = nel < c->p.k ? nel : c->p.k;
        if (cnt != want) {
            snprintf(why, wl, "%zu hits, the model has %zu (k %zu, %zu eligible documents)", cnt,
                     want, c->p.k, nel);
            goto out;
        }
        for (size_t i = 0; i < n && cnt < nel; i++) {
            if (!el[i] || seen[i])
                continue;
            ref[i] = maxsim_ref(q, lq, w->d[i], b->dim);
            if (ref[i] > lowest + tol) {
                snprintf(why, wl,
                         "'%s' (model score %.9g) is missing from the top %zu, whose lowest "
                         "scores %.9g",
                         w->d[i]->id, ref[i], cnt, lowest);
                goto out;
            }
        }
    }
    bad = 0;
    /* The largest difference seen, for the closing line. */
    for (size_t j = 0; j < cnt; j++) {
        size_t i = (uintptr_t)idmap_get(&w->ids, h[j].id) - 1;
        note_err(fabs((double)h[j].score - ref[i]) / (double)lq);
    }
out:
    free(el);
    free(seen);
    free(ref);
    return bad;
}

/* Hits of query i of a result set. */
typedef struct hitlist {
    const tartan_hit *h;
    size_t n;
} hitlist;

/*
 * Checks every query of a call against the versions lo..hi: they must all match one version.
 * hits(i) gives query i's hits. Dies with the newest version's difference otherwise.
 */
static void check_call(const call *c, uint64_t lo, uint64_t hi, const hitlist *hl, const char *who)
{
    char why[1024] = "", first[1024] = "";
    model_wait(hi);
    pthread_rwlock_rdlock(&M.lock);
    int ok = 0;
    for (uint64_t v = hi + 1; v-- > lo && !ok;) {
        view w;
        view_build(&w, v);
        ok = 1;
        for (size_t i = 0; i < c->qb.nq && ok; i++)
            if (check_hits(&w, c, i, hl[i].h, hl[i].n, why, sizeof why)) {
                ok = 0;
                if (!first[0])
                    snprintf(first, sizeof first, "query %zu of %zu: %s", i, c->qb.nq, why);
            }
        view_free(&w);
        if (ok && v != hi)
            atomic_fetch_add(&st.range_wider, 1);
    }
    pthread_rwlock_unlock(&M.lock);
    if (!ok)
        die("%s (%s k %zu%s%s, threads %d): no version %llu..%llu matches; against %llu: %s", who,
            c->p.exhaustive         ? "exhaustive"
            : c->mode == MODE_EXACT ? "PLAID all-in"
                                    : "PLAID",
            c->p.k, c->has_subset ? ", subset of " : "",
            c->has_subset ? (c->n_subset ? "some ids" : "none") : "", c->p.threads,
            (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)hi, first);
}

/*
 * check_hits' reading of the PLAID all-in promise, on made-up documents (dim 2, one query token
 * (1, 0)): a, b, c score 0.5, 0.8 and 0.9. A search with ndocs 8 and k 1 keeps max(8 / 4, 1) =
 * 2 documents for exact scoring; on a version of three documents whose approximate scores tie
 * it may keep a and b and answer b: allowed there (this is what made the soak of seed
 * 599546791755 fail: an add landed during the call), a difference on a version of a and b
 * only, or where the promise covers three documents.
 */
static void selftest_exactness(void)
{
    float ta[2] = {0.5f, 0.8660254f}, tb[2] = {0.8f, 0.6f}, tc[2] = {0.9f, 0.4358899f};
    rdoc da = {"a", 1, ta, 1, NEVER, 1}, dbb = {"b", 1, tb, 1, NEVER, 2},
         dc = {"c", 1, tc, 2, NEVER, 3};
    rdoc *docs[3] = {&da, &dbb, &dc};
    size_t off[2] = {0, 1};
    double qn[2] = {1.0, 0.0};
    call c;
    memset(&c, 0, sizeof c);
    c.qb.nq = 1;
    c.qb.off = off;
    c.qb.rows = 1;
    c.qb.dim = 2;
    c.qb.qn = qn;
    tartan_search_params_init(&c.p, 1);
    c.p.ndocs = 8;
    c.mode = MODE_EXACT;
    tartan_hit hit = {"b", 0.8f};
    char why[512];
    for (int n = 2; n <= 3; n++) {
        view w = {.v = (uint64_t)n - 1, .d = docs, .n = (size_t)n};
        idmap_init(&w.ids, 3);
        for (size_t i = 0; i < w.n; i++)
            idmap_put(&w.ids, docs[i]->id, (void *)(uintptr_t)(i + 1));
        c.exact_upto = 2;
        if (check_hits(&w, &c, 0, &hit, 1, why, sizeof why))
            die("self-test: %zu documents, exact up to 2: %s", w.n, why);
        c.exact_upto = 0; /* exhaustive: always exact */
        if (check_hits(&w, &c, 0, &hit, 1, why, sizeof why) != (n == 3))
            die("self-test: exhaustive search over %zu documents answering b: %s", w.n,
                n == 3 ? "not caught" : why);
        c.exact_upto = 3;
        if (check_hits(&w, &c, 0, &hit, 1, why, sizeof why) != (n == 3))
            die("self-test: %zu documents, exact up to 3: %s", w.n, n == 3 ? "not caught" : why);
        idmap_free(&w.ids);
    }
    tartan_hit wrong = {"a", 0.5f};
    view w2 = {.v = 1, .d = docs, .n = 2};
    idmap_init(&w2.ids, 2);
    for (size_t i = 0; i < 2; i++)
        idmap_put(&w2.ids, docs[i]->id, (void *)(uintptr_t)(i + 1));
    c.exact_upto = 2;
    if (!check_hits(&w2, &c, 0, &wrong, 1, why, sizeof why))
        die("self-test: a answered over a and b, exact up to 2: not caught");
    idmap_free(&w2.ids);
}

/* tartan_info against version v: counts and the byte formulas. NULL when right. */
static const char *info_diff(const view *w, const tartan_index_info *in, char *buf, size_t bl)
{
    uint64_t t = w->tokens;
    if (in->n_docs != w->n || in->n_tokens != t)
        snprintf(buf, bl, "%llu documents and %llu tokens; the model has %zu and %llu",
                 (unsigned long long)in->n_docs, (unsigned long long)in->n_tokens, w->n,
                 (unsigned long long)t);
    else if (in->dim != M.dim || in->nbits != M.nbits)
        snprintf(buf, bl, "dim %u nbits %u, expected %zu and %u", in->dim, in->nbits, M.dim,
                 M.nbits);
    else if (in->bytes_residuals != t * M.dim * M.nbits / 8 || in->bytes_norms != t * 4 ||
             in->bytes_codes != t * in->code_bytes)
        snprintf(buf, bl, "payload bytes %llu/%llu/%llu do not follow from %llu tokens",
                 (unsigned long long)in->bytes_residuals, (unsigned long long)in->bytes_codes,
                 (unsigned long long)in->bytes_norms, (unsigned long long)t);
    else if (w->n && (!in->n_centroids || in->code_bytes != (in->n_centroids <= 65536 ? 2u : 4u)))
        snprintf(buf, bl, "documents but %u centroids, %u code bytes", in->n_centroids,
                 in->code_bytes);
    else
        return NULL;
    return buf;
}

static void check_info_range(const tartan_index_info *in, uint64_t lo, uint64_t hi, const char *who)
{
    char buf[512], first[512] = "";
    model_wait(hi);
    pthread_rwlock_rdlock(&M.lock);
    int ok = 0;
    for (uint64_t v = hi + 1; v-- > lo && !ok;) {
        view w;
        view_build(&w, v);
        const char *d = info_diff(&w, in, buf, sizeof buf);
        if (!d)
            ok = 1;
        else if (!first[0])
            snprintf(first, sizeof first, "%s", d);
        view_free(&w);
    }
    pthread_rwlock_unlock(&M.lock);
    if (!ok)
        die("%s: tartan_info matches no version %llu..%llu; against %llu: %s", who,
            (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)hi, first);
}

/* ---- random searches ------------------------------------------------------------------------- */

/* Picks a search: kind 0-2 exhaustive, 3-5 PLAID defaults, 6 PLAID with nothing pruned, 7
 * PLAID with random parameters, 8 a subset. */
static void call_make(call *c, rng *r, const pool *p, int kind, int plain)
{
    memset(c, 0, sizeof *c);
    size_t nq = 1 + (rbelow(r, 3) == 0 ? rbelow(r, 4) : 0);
    qbatch_make(&c->qb, r, M.dim, p, nq, plain);
    static const size_t ks[] = {1, 2, 5, 10, 20, 100, 1000};
    size_t k = ks[rbelow(r, sizeof ks / sizeof ks[0])];
    pthread_rwlock_rdlock(&M.lock);
    size_t nrec = M.n;
    pthread_rwlock_unlock(&M.lock);
    if (kind <= 2 && rbelow(r, 2))
        k = nrec + 1 + rbelow(r, 3); /* every document */
    tartan_search_params_init(&c->p, k);
    static const int threads[] = {0, 1, 2, 4};
    c->p.threads = threads[rbelow(r, 4)];
    c->mode = MODE_PLAID;
    if (kind <= 2) {
        c->p.exhaustive = 1;
        c->mode = MODE_EXACT;
    } else if (kind == 6) {
        /* Every centroid probed and nothing pruned: every live document is a candidate, and
         * the result is exhaustive search's where stage 3 keeps them all, i.e. while the
         * version searched has at most max(ndocs / 4, k) live documents (tartan.h). nrec
         * counts the records of the versions in use now; the call may see a later version,
         * grown by adds meanwhile (up to 149 documents each; a 1-centroid index ties every
         * approximate score, so stage 3 then drops the newest documents): room for one such
         * add, and check_hits holds each version to the promise only where it applies. */
        c->p.ncells = (size_t)1 << 20; /* more than the index has: all */
        c->p.centroid_score_threshold = -1000.0f;
        c->p.ndocs = 4 * (nrec + k + ADD_MAX) + 4;
        c->exact_upto = c->p.ndocs / 4;
        c->mode = MODE_EXACT;
    } else if (kind == 7) {
        c->p.ncells = 1 + rbelow(r, 8);
        c->p.centroid_score_threshold = (float)(runif(r) * 1.2 - 0.3);
        c->p.ndocs = 1 + rbelow(r, 300);
    } else if (kind <= 5) { /* the adaptive defaults, at their own recall target or another */
        if (rbelow(r, 2))
            c->p.recall_target = (float)(0.3 + 0.69 * runif(r));
    } else if (kind == 8) {
        c->has_subset = 1;
        c->p.exhaustive = rbelow(r, 3) == 0;
        if (c->p.exhaustive)
            c->mode = MODE_EXACT;
        if (rbelow(r, 3) == 0)
            c->p.ndocs = 1 + rbelow(r, 40);
        size_t n = !plain && rbelow(r, 12) == 0 ? 0 : 1 + rbelow(r, 40);
        c->subset = xmalloc((n ? n : 1) * sizeof *c->subset);
        pthread_rwlock_rdlock(&M.lock);
        for (size_t i = 0; i < n; i++) {
            char buf[64];
            if (M.n && rbelow(r, 5)) /* a record: live, dead or deleted */
                c->subset[i] = xstrdup(M.rec[rbelow(r, M.n)]->id);
            else if (i > 0 && rbelow(r, 2)) /* a repeat */
                c->subset[i] = xstrdup(c->subset[rbelow(r, i)]);
            else { /* never an id */
                snprintf(buf, sizeof buf, "absent-%zu", rbelow(r, 1000));
                c->subset[i] = xstrdup(buf);
            }
        }
        pthread_rwlock_unlock(&M.lock);
        c->n_subset = n;
        idmap_init(&c->subset_ids, n);
        for (size_t i = 0; i < n; i++)
            idmap_put(&c->subset_ids, c->subset[i], c->subset[i]);
        c->p.subset = (const char *const *)c->subset;
        c->p.n_subset = n;
    }
}

/* One search or info call on db by slot, checked against the versions it may have seen.
 * Returns 0, or the error of a call that failed while `tolerate` was set. */
static _Atomic int tolerate_errors;

static int one_call(tartan_db *db, rng *r, pool *p, int slot, const char *who)
{
    int kind = (int)rbelow(r, 10);
    pool_fill(p, r, M.dim);
    if (kind == 9) {
        uint64_t lo = model_enter(slot);
        tartan_index_info in;
        int rc = tartan_info(db, &in);
        uint64_t hi = atomic_load(&M.pending);
        if (rc) {
            model_leave(slot);
            if (atomic_load(&tolerate_errors))
                return rc;
            die("%s: tartan_info: %s", who, tartan_errmsg(db));
        }
        check_info_range(&in, lo, hi, who);
        model_leave(slot);
        return 0;
    }
    call c;
    call_make(&c, r, p, kind, 0);
    tartan_queries q = qbatch_api(&c.qb);
    tartan_results *res = NULL;
    uint64_t lo = model_enter(slot);
    int rc = tartan_search(db, &q, &c.p, &res);
    uint64_t hi = atomic_load(&M.pending);
    if (rc) {
        model_leave(slot);
        call_free(&c);
        if (atomic_load(&tolerate_errors))
            return rc;
        die("%s: tartan_search: %s", who, tartan_errmsg(db));
    }
    if (res->n_queries != c.qb.nq)
        die("%s: %zu result lists for %zu queries", who, res->n_queries, c.qb.nq);
    hitlist *hl = xmalloc(c.qb.nq * sizeof *hl);
    for (size_t i = 0; i < c.qb.nq; i++) {
        if (res->offsets[i + 1] - res->offsets[i] != res->counts[i])
            die("%s: offsets and counts of query %zu disagree", who, i);
        hl[i].h = res->hits + res->offsets[i];
        hl[i].n = res->counts[i];
    }
    check_call(&c, lo, hi, hl, who);
    model_leave(slot);
    free(hl);
    tartan_results_free(res);
    call_free(&c);
    return 0;
}

/* ---- readers --------------------------------------------------------------------------------- */

typedef struct reader {
    pthread_t th;
    int slot;
    rng r;
    tartan_db *db;
    char name[32];
} reader;

static reader readers[MAX_READERS];
static _Atomic int readers_stop_flag;
static int readers_running;

static void *reader_main(void *arg)
{
    reader *rd = arg;
    pool p = {0};
    while (!atomic_load(&readers_stop_flag)) {
        int rc = one_call(rd->db, &rd->r, &p, rd->slot, rd->name);
        if (rc) /* tolerated (a write failed on purpose left the handle unusable): wait */
            usleep(1000);
        else
            atomic_fetch_add(&st.reader_calls, 1);
    }
    free(p.tok);
    return NULL;
}

static void readers_start(tartan_db *db, uint64_t seed)
{
    atomic_store(&readers_stop_flag, 0);
    for (int i = 0; i < cfg.readers; i++) {
        reader *rd = &readers[i];
        rd->slot = 2 + i;
        rd->r.s = seed ^ (0x5851F42D4C957F2Dull * (uint64_t)(i + 1));
        rd->db = db;
        snprintf(rd->name, sizeof rd->name, "reader %d", i);
        if (pthread_create(&rd->th, NULL, reader_main, rd))
            die("pthread_create: %s", strerror(errno));
    }
    readers_running = 1;
}

static void readers_stop(void)
{
    if (!readers_running)
        return;
    atomic_store(&readers_stop_flag, 1);
    for (int i = 0; i < cfg.readers; i++)
        pthread_join(readers[i].th, NULL);
    readers_running = 0;
}

/* ---- writes: generating them ----------------------------------------------------------------- */

enum { OP_ADD = 1, OP_DELETE = 2, OP_TRAIN = 3 };

typedef struct wop {
    int kind;
    unsigned flags;
    size_t n; /* documents (add, train) or ids (delete) */
    char **ids;
    size_t *doclens;
    size_t rows, dim;
    tartan_dtype dtype;
    void *emb;   /* [rows, dim] of dtype */
    float *orig; /* [rows, dim] the values as given, decoded */
    int expect;  /* the return code the model predicts */
    const char *what;
} wop;

static void wop_free(wop *op)
{
    for (size_t i = 0; op->ids && i < op->n; i++)
        free(op->ids[i]);
    free(op->ids);
    free(op->doclens);
    free(op->emb);
    free(op->orig);
    memset(op, 0, sizeof *op);
}

/* An index's lifetime: its shape and how its documents look. */
typedef struct epoch {
    int no;
    size_t dim;
    unsigned nbits;
    size_t n_centroids; /* 0: the library's rule */
    int family;         /* 0: isotropic Gaussian; 1: clusters of near-duplicate tokens */
    size_t maxlen;      /* tokens per document, up to */
    size_t target;      /* documents the index hovers around */
    long steps;
    size_t map_size;
    float *proto; /* [nproto, dim] family 1's cluster centres */
    size_t nproto;
    char ix[700];
} epoch;

static epoch E;
/* The writer's streams: W decides the sequence of changes and nothing else, so that a seed
 * always makes the same changes; WQ the rest (the writer's queries, reopening options, the
 * readers' seeds), which may draw more or less depending on what the readers kept. */
static rng W, WQ;

static void gen_tokens(float *x, size_t ntok)
{
    size_t dim = E.dim;
    for (size_t t = 0; t < ntok; t++) {
        float *o = x + t * dim;
        if (E.family == 1) {
            const float *c = E.proto + rbelow(&W, E.nproto) * dim;
            double spread = rbelow(&W, 4) == 0 ? 0.02 : 0.3;
            for (size_t j = 0; j < dim; j++)
                o[j] = c[j] + (float)(spread * rgauss(&W));
        } else {
            for (size_t j = 0; j < dim; j++)
                o[j] = (float)rgauss(&W);
        }
    }
}

static char *new_id(void)
{
    static const char *prefix[] = {"d", "doc/", "\xc3\xbc-", "a.b:", "x_", "\xce\xa9", "L"};
    char buf[600];
    uint64_t no = M.next_id++;
    size_t p = rbelow(&W, 7);
    if (p == 6) { /* long ids, up to the 511-byte limit */
        size_t len = 100 + rbelow(&W, 412);
        int k = snprintf(buf, sizeof buf, "%llu-", (unsigned long long)no);
        while ((size_t)k < len)
            buf[k++] = (char)('a' + rbelow(&W, 26));
        buf[len] = 0;
    } else {
        snprintf(buf, sizeof buf, "%s%llu", prefix[p], (unsigned long long)no);
    }
    return xstrdup(buf);
}

/* A live id at random (NULL if none). */
static const char *pick_live(void)
{
    if (!M.nlive)
        return NULL;
    size_t k = rbelow(&W, M.nlive);
    for (size_t i = 0; i < M.n; i++)
        if (M.rec[i]->died == NEVER && k-- == 0)
            return M.rec[i]->id;
    return NULL;
}

static void encode(wop *op, const float *x)
{
    size_t n = op->rows * op->dim;
    op->orig = xmalloc(n * sizeof(float));
    if (op->dtype == TARTAN_FLOAT32) {
        op->emb = xmalloc(n * sizeof(float));
        memcpy(op->emb, x, n * sizeof(float));
        memcpy(op->orig, x, n * sizeof(float));
    } else {
        uint16_t *h = xmalloc(n * sizeof *h);
        for (size_t i = 0; i < n; i++) {
            h[i] = op->dtype == TARTAN_FLOAT16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
            op->orig[i] = op->dtype == TARTAN_FLOAT16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
        }
        op->emb = h;
    }
}

/*
 * An add of n documents. replace: a share of the ids are live ones, with TARTAN_REPLACE.
 * Some documents copy another of the batch exactly (ties) or a live document's decompressed
 * tokens (near-duplicates).
 */
static void gen_add(wop *op, size_t n, int replace)
{
    memset(op, 0, sizeof *op);
    op->kind = OP_ADD;
    op->what = replace ? "add, replacing" : "add";
    op->flags = replace ? TARTAN_REPLACE : 0;
    op->n = n;
    op->dim = E.dim;
    op->ids = xcalloc(n, sizeof *op->ids);
    op->doclens = xmalloc(n * sizeof *op->doclens);
    idmap used;
    idmap_init(&used, n);
    for (size_t i = 0; i < n; i++) {
        const char *old = replace && rbelow(&W, 2) ? pick_live() : NULL;
        if (old && !idmap_get(&used, old))
            op->ids[i] = xstrdup(old);
        else
            op->ids[i] = new_id();
        idmap_put(&used, op->ids[i], op->ids[i]);
        size_t len = 1 + rbelow(&W, E.maxlen);
        if (rbelow(&W, 50) == 0)
            len = E.maxlen * 4 + rbelow(&W, 100); /* a long one */
        op->doclens[i] = len;
        op->rows += len;
    }
    idmap_free(&used);
    float *x = xmalloc(op->rows * E.dim * sizeof *x);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        float *o = x + at * E.dim;
        size_t len = op->doclens[i];
        int copy = (int)rbelow(&W, 12);
        if (copy == 0 && i > 0 && op->doclens[i - 1] == len) /* an exact copy of the last */
            memcpy(o, o - len * E.dim, len * E.dim * sizeof *o);
        else if (copy == 1 && M.nlive) { /* a live document's tokens, nearly */
            const rdoc *d = idmap_get(&M.live, pick_live());
            for (size_t t = 0; t < len; t++)
                for (size_t j = 0; j < E.dim; j++)
                    o[t * E.dim + j] = d->tok[(t % d->ntok) * E.dim + j] +
                                       (float)(0.01 * rgauss(&W) / sqrt((double)E.dim));
        } else
            gen_tokens(o, len);
        at += len;
    }
    static const tartan_dtype dt[] = {TARTAN_FLOAT32, TARTAN_FLOAT32, TARTAN_FLOAT16,
                                      TARTAN_BFLOAT16};
    op->dtype = dt[rbelow(&W, 4)];
    encode(op, x);
    free(x);
    op->expect = 0;
    if (!M.trained && op->rows < 2)
        op->expect = TARTAN_EEMPTY;
}

/* A batch the API must refuse, leaving the index as it was. */
static void gen_bad_add(wop *op)
{
    size_t n = 1 + rbelow(&W, 6);
    int v = (int)rbelow(&W, 6);
    if (v == 0 && !M.nlive)
        v = 1;
    gen_add(op, n, 0);
    switch (v) {
    case 0: /* an id the index has, without TARTAN_REPLACE */
        free(op->ids[n - 1]);
        op->ids[n - 1] = xstrdup(pick_live());
        op->expect = TARTAN_EDUPID;
        op->what = "add of an existing id";
        break;
    case 1: /* an id twice in the batch (also with TARTAN_REPLACE) */
        if (n == 1) {
            wop_free(op);
            gen_add(op, 2, 0);
            n = 2;
        }
        free(op->ids[n - 1]);
        op->ids[n - 1] = xstrdup(op->ids[0]);
        op->flags = rbelow(&W, 2) ? TARTAN_REPLACE : 0;
        op->expect = TARTAN_EDUPID;
        op->what = "add with an id twice";
        break;
    case 2: { /* NaN in one value */
        size_t at = rbelow(&W, op->rows * op->dim);
        if (op->dtype == TARTAN_FLOAT32)
            ((float *)op->emb)[at] = NAN;
        else
            ((uint16_t *)op->emb)[at] = op->dtype == TARTAN_FLOAT16 ? 0x7e00 : 0x7fc0;
        op->expect = TARTAN_ENONFINITE;
        op->what = "add with a NaN";
        break;
    }
    case 3: { /* a token of zeros */
        size_t t = rbelow(&W, op->rows);
        size_t es = op->dtype == TARTAN_FLOAT32 ? 4 : 2;
        memset((char *)op->emb + t * op->dim * es, 0, op->dim * es);
        op->expect = TARTAN_ERANGE;
        op->what = "add with a zero token";
        break;
    }
    case 4: /* the wrong dimension: one token a document, each of dim + 8 values */
        op->dim = E.dim + 8;
        op->rows = n;
        for (size_t i = 0; i < n; i++)
            op->doclens[i] = 1;
        op->dtype = TARTAN_FLOAT32;
        free(op->emb);
        op->emb = xmalloc(n * op->dim * sizeof(float));
        for (size_t i = 0; i < n * op->dim; i++)
            ((float *)op->emb)[i] = (float)rgauss(&W);
        op->expect = TARTAN_EDIM;
        op->what = "add of the wrong dimension";
        break;
    default: /* an empty id */
        free(op->ids[0]);
        op->ids[0] = xstrdup("");
        op->expect = TARTAN_EBADID;
        op->what = "add with an empty id";
        break;
    }
}

/* A delete of live ids, deleted ones, never-seen ones and repeats; or of everything. */
static void gen_delete(wop *op, int all)
{
    memset(op, 0, sizeof *op);
    op->kind = OP_DELETE;
    op->what = all ? "delete everything" : "delete";
    size_t n = all ? M.nlive : 1 + rbelow(&W, 24);
    op->n = n;
    op->ids = xcalloc(n ? n : 1, sizeof *op->ids);
    size_t k = 0;
    if (all) {
        for (size_t i = 0; i < M.n; i++)
            if (M.rec[i]->died == NEVER)
                op->ids[k++] = xstrdup(M.rec[i]->id);
    } else {
        for (; k < n; k++) {
            int src = (int)rbelow(&W, 8);
            const char *s = NULL;
            char buf[64];
            if (src < 5)
                s = pick_live();
            else if (src == 5 && n_dead)
                s = dead_ids[rbelow(&W, n_dead < NDEAD ? n_dead : NDEAD)]; /* gone, or back */
            else if (src == 6 && k > 0)
                s = op->ids[rbelow(&W, k)];
            if (!s) {
                snprintf(buf, sizeof buf, "never-%llu", (unsigned long long)rnext(&W) % 100000);
                s = buf;
            }
            op->ids[k] = xstrdup(s);
        }
    }
    op->expect = 0;
}

/* Documents a successful delete takes away (each live id once). */
static size_t delete_targets(const wop *op, rdoc **gone)
{
    idmap seen;
    idmap_init(&seen, op->n);
    size_t ng = 0;
    for (size_t i = 0; i < op->n; i++) {
        rdoc *d = idmap_get(&M.live, op->ids[i]);
        if (d && !idmap_get(&seen, d->id)) {
            idmap_put(&seen, d->id, d);
            if (gone)
                gone[ng] = d;
            ng++;
        }
    }
    idmap_free(&seen);
    return ng;
}

/* ---- writes: carrying them out and taking them into the model -------------------------------- */

static tartan_db *db;

static int run_op(tartan_db *h, const wop *op, size_t *n_deleted)
{
    tartan_batch b = {
        op->n, (const char *const *)op->ids, op->doclens, op->emb, op->rows, op->dim, op->dtype};
    switch (op->kind) {
    case OP_ADD:
        return tartan_add(h, &b, op->flags);
    case OP_TRAIN:
        b.ids = NULL;
        return tartan_train(h, &b, 0);
    default:
        return tartan_delete(h, (const char *const *)op->ids, op->n, n_deleted);
    }
}

/* Whether code is a nearest centroid (by inner product, DESIGN.md section 3) of token x
 * once normalised, as the index must have encoded it: within 1e-5 of the best, for the
 * index's fp32 sums. Decompressed tokens may be far from the ones given (a token unlike any
 * of the training sample keeps little at nbits 1 or 2), so their codes are what tells the
 * right document from another's. */
static int nearest_centroid(const idx_reader *rd, const float *x, uint32_t code, double *got,
                            double *best)
{
    size_t dim = rd->h.dim;
    double xx = 0;
    for (size_t j = 0; j < dim; j++)
        xx += (double)x[j] * x[j];
    double inv = 1 / sqrt(xx);
    *best = -INFINITY;
    *got = NAN;
    for (uint32_t c = 0; c < rd->h.n_centroids; c++) {
        double s = 0;
        for (size_t j = 0; j < dim; j++)
            s += (double)rd->centroids[(size_t)c * dim + j] * x[j];
        s *= inv;
        if (s > *best)
            *best = s;
        if (c == code)
            *got = s;
    }
    return !(*got >= *best - 1e-5);
}

/* Reads the documents of an add back from the index (decompressed) as new records. */
static void read_docs(const wop *op, rdoc **out)
{
    idx_reader rd;
    store_msg m = {{0}};
    int rc = idx_reader_open(db->env, &rd, &m);
    if (rc)
        die("reading the index: %s", m.text);
    size_t at = 0;
    for (size_t i = 0; i < op->n; i++) {
        uint32_t docno;
        kern_pdoc pd;
        if ((rc = idx_reader_docno(&rd, op->ids[i], &docno, &m)))
            die("'%s' was added but the index has no such id (%s)", op->ids[i],
                tartan_err_name(rc));
        if ((rc = idx_reader_doc(&rd, docno, &pd, &m)))
            die("'%s' was added but cannot be read: %s", op->ids[i], m.text);
        if (pd.ntok != op->doclens[i])
            die("'%s' was added with %zu tokens, the index holds %u", op->ids[i], op->doclens[i],
                pd.ntok);
        rdoc *d = xcalloc(1, sizeof *d);
        d->id = xstrdup(op->ids[i]);
        d->ntok = pd.ntok;
        d->tok = xmalloc((size_t)pd.ntok * E.dim * sizeof(float));
        idx_reader_decompress(&rd, &pd, d->tok);
        for (uint32_t t = 0; t < pd.ntok; t++) {
            const float *a = d->tok + (size_t)t * E.dim;
            double aa = 0;
            for (size_t j = 0; j < E.dim; j++)
                aa += (double)a[j] * a[j];
            if (fabs(aa - 1) > 1e-3)
                die("'%s' token %u decompresses to norm %g, not 1", op->ids[i], t, sqrt(aa));
            uint32_t code = rd.h.code_bytes == 2 ? ((const uint16_t *)pd.codes)[t]
                                                 : ((const uint32_t *)pd.codes)[t];
            double got, best;
            if (nearest_centroid(&rd, op->orig + (at + t) * E.dim, code, &got, &best))
                die("'%s' token %u has code %u (inner product %.7f with the token added), but "
                    "the nearest centroid's is %.7f: the index holds other tokens",
                    op->ids[i], t, code, got, best);
        }
        out[i] = d;
        at += op->doclens[i];
    }
    idx_reader_close(&rd);
}

/* Takes a change that landed into the model (version pending). */
static void apply_op(const wop *op)
{
    if (op->kind == OP_ADD) {
        rdoc **nd = xmalloc(op->n * sizeof *nd), **gone = xmalloc(op->n * sizeof *gone);
        size_t ng = 0;
        for (size_t i = 0; i < op->n; i++) {
            rdoc *old = idmap_get(&M.live, op->ids[i]);
            if (old) {
                if (!(op->flags & TARTAN_REPLACE))
                    die("internal: an add of existing '%s' landed without TARTAN_REPLACE",
                        op->ids[i]);
                gone[ng++] = old;
            }
        }
        read_docs(op, nd);
        model_commit(nd, op->n, gone, ng);
        M.trained = 1;
        atomic_fetch_add(&st.adds, 1);
        if (ng)
            atomic_fetch_add(&st.replaces, 1);
        free(nd);
        free(gone);
    } else if (op->kind == OP_DELETE) {
        rdoc **gone = xmalloc((op->n ? op->n : 1) * sizeof *gone);
        size_t ng = delete_targets(op, gone);
        model_commit(NULL, 0, gone, ng);
        atomic_fetch_add(&st.deletes, 1);
        atomic_fetch_add(&st.deleted, (long)ng);
        free(gone);
    } else {
        model_commit(NULL, 0, NULL, 0);
        M.trained = 1;
        atomic_fetch_add(&st.trains, 1);
    }
}

/* Write calls on the data file per change, as counted: where a failure on purpose may land. */
static long calls_seen = 4;

/* Runs op in this process and checks its outcome against the model's prediction. */
static void exec_op(const wop *op)
{
    progress(op->what);
    model_announce();
    size_t nd = (size_t)-1;
    if (op->expect == 0 && E.ix[0])
        inj_count(E.ix);
    int rc = run_op(db, op, &nd);
    long calls = inj_off();
    if (rc != op->expect)
        die("%s of %zu: returned %s (%s); the model expected %s", op->what, op->n,
            tartan_err_name(rc), tartan_errmsg(db), tartan_err_name(op->expect));
    if (rc) {
        const char *msg = tartan_errmsg(db);
        if (strncmp(msg, tartan_err_name(rc), strlen(tartan_err_name(rc))))
            die("%s: the message '%s' does not start with the code's name", op->what, msg);
        model_commit(NULL, 0, NULL, 0); /* nothing changed */
        atomic_fetch_add(&st.refused, 1);
        return;
    }
    if (calls > calls_seen)
        calls_seen = calls;
    if (op->kind == OP_DELETE) {
        size_t want = delete_targets(op, NULL);
        if (nd != want)
            die("delete of %zu ids: n_deleted %zu, the model has %zu live among them", op->n, nd,
                want);
    }
    apply_op(op);
}

/* ---- the writer's own check of the current version ------------------------------------------- */

static int found_problem(void *ctx, const char *kind, const char *message)
{
    char *buf = ctx;
    if (!buf[0])
        snprintf(buf, 512, "%s: %s", kind, message);
    return 0;
}

static void run_check(tartan_db *h)
{
    progress("tartan_check");
    char first[512] = "";
    size_t n = 0;
    int rc = tartan_check(h, found_problem, first, &n);
    if (rc || n)
        die("tartan_check: %s, %zu problems; first: %s", tartan_err_name(rc), n, first);
    atomic_fetch_add(&st.checks, 1);
}

static pool writer_pool;

static void writer_check(void)
{
    progress("checking");
    uint64_t v = atomic_load(&M.committed);
    tartan_index_info in;
    if (tartan_info(db, &in))
        die("tartan_info: %s", tartan_errmsg(db));
    check_info_range(&in, v, v, "writer");
    if ((in.n_centroids != 0) != M.trained)
        die("tartan_info: %u centroids, but the index was %strained", in.n_centroids,
            M.trained ? "" : "not ");
    /* Every live document with its score. */
    call c;
    pool_fill(&writer_pool, &WQ, M.dim);
    call_make(&c, &WQ, &writer_pool, 0, 0);
    tartan_search_params_init(&c.p, M.nlive + 1);
    c.p.exhaustive = 1;
    c.mode = MODE_EXACT;
    tartan_queries q = qbatch_api(&c.qb);
    tartan_results *res;
    if (tartan_search(db, &q, &c.p, &res))
        die("writer: exhaustive search: %s", tartan_errmsg(db));
    hitlist *hl = xmalloc(c.qb.nq * sizeof *hl);
    for (size_t i = 0; i < c.qb.nq; i++) {
        hl[i].h = res->hits + res->offsets[i];
        hl[i].n = res->counts[i];
    }
    check_call(&c, v, v, hl, "writer, every document");
    free(hl);
    tartan_results_free(res);
    call_free(&c);
    /* And one random search. */
    one_call(db, &WQ, &writer_pool, SLOT_WRITER, "writer");
    atomic_fetch_add(&st.writer_searches, 2);
}

/* ---- the handle ------------------------------------------------------------------------------ */

/* The training seed: the same for a run's seed and epoch. */
static uint64_t epoch_seed(void)
{
    return cfg.seed + 7919u * (uint64_t)E.no;
}

static void open_db(int create)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = create ? TARTAN_CREATE | TARTAN_EXCL : 0;
    o.dim = create || rbelow(&WQ, 2) ? E.dim : 0;
    o.nbits = E.nbits;
    o.n_centroids = E.n_centroids;
    o.seed = epoch_seed();
    o.map_size = E.map_size;
    o.device = cfg.device;
    int rc = tartan_open(E.ix, &o, &db);
    if (rc)
        die("tartan_open '%s': %s", E.ix, tartan_errmsg(NULL));
}

static void step_reopen(void)
{
    progress("reopen");
    readers_stop();
    tartan_close(db);
    db = NULL;
    open_db(0);
    readers_start(db, rnext(&WQ));
    atomic_fetch_add(&st.reopens, 1);
}

/* ---- a writer killed with SIGKILL ------------------------------------------------------------ */

static void put(FILE *f, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, f) != n)
        die("writing the op file: %s", strerror(errno));
}

static void get(FILE *f, void *p, size_t n)
{
    if (n && fread(p, 1, n, f) != n) {
        fprintf(stderr, "check_model child: short op file\n");
        _exit(2);
    }
}

static size_t elsize(tartan_dtype t)
{
    return t == TARTAN_FLOAT32 ? 4 : 2;
}

static void op_save(const wop *op, const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        die("%s: %s", path, strerror(errno));
    uint64_t hdr[6] = {(uint64_t)op->kind, op->flags, op->n, op->rows, op->dim, op->dtype};
    put(f, hdr, sizeof hdr);
    for (size_t i = 0; i < op->n; i++) {
        uint32_t l = (uint32_t)strlen(op->ids[i]);
        put(f, &l, 4);
        put(f, op->ids[i], l);
    }
    if (op->kind != OP_DELETE) {
        for (size_t i = 0; i < op->n; i++) {
            uint64_t l = op->doclens[i];
            put(f, &l, 8);
        }
        put(f, op->emb, op->rows * op->dim * elsize(op->dtype));
    }
    if (fclose(f))
        die("%s: %s", path, strerror(errno));
}

/* The child: check_model --child-op INDEX OPFILE SEED CENTROIDS. Exit 0 when the change
 * landed. The seed and number of centroids are the writer's own, so that a first add trains
 * the same index in the child as in the writer. */
static int child_main(const char *ix, const char *path, const char *seed, const char *ncent)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "check_model child: %s: %s\n", path, strerror(errno));
        return 2;
    }
    wop op;
    memset(&op, 0, sizeof op);
    uint64_t hdr[6];
    get(f, hdr, sizeof hdr);
    op.kind = (int)hdr[0];
    op.flags = (unsigned)hdr[1];
    op.n = hdr[2];
    op.rows = hdr[3];
    op.dim = hdr[4];
    op.dtype = (tartan_dtype)hdr[5];
    op.ids = calloc(op.n ? op.n : 1, sizeof *op.ids);
    for (size_t i = 0; i < op.n; i++) {
        uint32_t l;
        get(f, &l, 4);
        op.ids[i] = calloc(l + 1, 1);
        get(f, op.ids[i], l);
    }
    if (op.kind != OP_DELETE) {
        op.doclens = malloc(op.n * sizeof *op.doclens);
        for (size_t i = 0; i < op.n; i++) {
            uint64_t l;
            get(f, &l, 8);
            op.doclens[i] = l;
        }
        op.emb = malloc(op.rows * op.dim * elsize(op.dtype));
        get(f, op.emb, op.rows * op.dim * elsize(op.dtype));
    }
    fclose(f);
    tartan_options o;
    tartan_options_init(&o);
    o.device = TARTAN_DEVICE_CPU;
    o.seed = strtoull(seed, NULL, 10);
    o.n_centroids = strtoull(ncent, NULL, 10);
    tartan_db *h;
    if (tartan_open(ix, &o, &h)) {
        fprintf(stderr, "check_model child: %s\n", tartan_errmsg(NULL));
        return 3;
    }
    size_t nd;
    int rc = run_op(h, &op, &nd);
    if (rc)
        fprintf(stderr, "check_model child: %s\n", tartan_errmsg(h));
    tartan_close(h);
    wop_free(&op);
    return rc ? 4 : 0;
}

static double child_ms = 50; /* how long an unkilled child takes, measured */

/* Whether the change of op landed, from what the index holds now. */
static int landed(const wop *op)
{
    idx_reader rd;
    store_msg m = {{0}};
    if (idx_reader_open(db->env, &rd, &m))
        die("reading the index after the kill: %s", m.text);
    int yes = 1;
    uint32_t docno;
    if (op->kind == OP_ADD) {
        const rdoc *old = idmap_get(&M.live, op->ids[0]);
        int rc = idx_reader_docno(&rd, op->ids[0], &docno, &m);
        if (rc == TARTAN_ENOTFOUND)
            yes = 0;
        else if (rc)
            die("after the kill: looking up '%s': %s", op->ids[0], m.text);
        else if (old) { /* replaced, or still the old document? */
            kern_pdoc pd;
            if (idx_reader_doc(&rd, docno, &pd, &m))
                die("after the kill: reading '%s': %s", op->ids[0], m.text);
            float *t = xmalloc((size_t)pd.ntok * E.dim * sizeof *t);
            idx_reader_decompress(&rd, &pd, t);
            yes = !(pd.ntok == old->ntok &&
                    !memcmp(t, old->tok, (size_t)pd.ntok * E.dim * sizeof *t));
            free(t);
        }
    } else if (op->kind == OP_DELETE) {
        for (size_t i = 0; i < op->n; i++)
            if (idmap_get(&M.live, op->ids[i])) {
                yes = idx_reader_docno(&rd, op->ids[i], &docno, &m) == TARTAN_ENOTFOUND;
                break;
            }
    }
    idx_reader_close(&rd);
    return yes;
}

/* Whether landed() can tell op's change from the state before it: an add can, a delete only
 * when one of its ids is live in the model (landed() says yes for the others either way). */
static int observable(const wop *op)
{
    if (op->kind == OP_ADD)
        return 1;
    if (op->kind != OP_DELETE)
        return 0; /* a training: landed() does not look */
    for (size_t i = 0; i < op->n; i++)
        if (idmap_get(&M.live, op->ids[i]))
            return 1;
    return 0;
}

/* LMDB's two numbers of the last commit: *file, the newest meta page's in data.mdb (what the
 * next writer, or a process opening the index afresh, starts from), and *readers, the one in
 * lock.mdb that a read transaction of this process starts from. */
static void lmdb_txnids(uint64_t *file, uint64_t *readers)
{
    store_env *env = db->env;
    /* The current generation (format 2: a compaction may replace it; none runs here). */
    pthread_mutex_lock(&env->se_lock);
    store_gen *g = env->se_gen;
    pthread_mutex_unlock(&env->se_lock);
    MDB_envinfo in;
    int rc = mdb_env_info(g->g_env, &in);
    if (rc)
        die("mdb_env_info: %s", mdb_strerror(rc));
    *file = (uint64_t)in.me_last_txnid;
    MDB_txn *t;
    for (;;) {
        pthread_rwlock_rdlock(&g->g_grow); /* as every transaction of the process does */
        rc = mdb_txn_begin(g->g_env, NULL, MDB_RDONLY, &t);
        if (rc != MDB_MAP_RESIZED)
            break;
        /* The killed writer grew the map before it died: adopt its size, as the library's
         * own transactions do (storage/env.c, adopt_map), and look again. */
        pthread_rwlock_unlock(&g->g_grow);
        pthread_rwlock_wrlock(&g->g_grow);
        rc = mdb_env_set_mapsize(g->g_env, 0);
        store_gen_find_map(g);
        pthread_rwlock_unlock(&g->g_grow);
        if (rc)
            die("adopting the map size after the kill: %s", mdb_strerror(rc));
    }
    if (rc)
        die("a read transaction after the kill: %s", mdb_strerror(rc));
    *readers = (uint64_t)mdb_txn_id(t);
    mdb_txn_abort(t);
    pthread_rwlock_unlock(&g->g_grow);
}

static void sleep_ms(double ms)
{
    struct timespec t = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
    while (nanosleep(&t, &t) && errno == EINTR)
        ;
}

/* op runs in a child process that is killed at a random moment (over 160% of a child's usual
 * time, so that some finish first), or left to finish; whichever state it left, the change
 * lands afterwards. */
static void step_kill(const wop *op)
{
    progress("killed write");
    char path[800], log[800];
    snprintf(path, sizeof path, "%s/op.bin", cfg.work);
    snprintf(log, sizeof log, "%s/child.log", cfg.work);
    op_save(op, path);
    double delay = runif(&W) * 1.6 * child_ms;
    /* One in four runs to the end: how long a child takes (under a sanitizer, or a loaded
     * machine, far longer than the first guess). */
    int measure = rbelow(&W, 4) == 0;
    model_announce();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char seed[32], ncent[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)epoch_seed());
    snprintf(ncent, sizeof ncent, "%zu", E.n_centroids);
    char *argv[] = {"check_model", "--child-op", E.ix, path, seed, ncent, NULL};
    pid_t pid;
    double t0 = now();
    int rc = posix_spawn(&pid, cfg.self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        die("posix_spawn: %s", strerror(rc));
    atomic_store(&child_pid, pid);
    if (!measure) {
        sleep_ms(delay);
        kill(pid, SIGKILL);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    atomic_store(&child_pid, 0);
    atomic_fetch_add(&st.kills, 1);
    int done;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        done = 1;
        atomic_fetch_add(&st.kill_finished, 1);
        if (measure)
            child_ms = 0.5 * child_ms + 0.5 * (now() - t0) * 1000;
    } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
        /* LMDB publishes a commit twice: the meta page in data.mdb, then the transaction
         * number in lock.mdb that readers start from. A writer killed between the two leaves
         * a change that is in the file but that readers of a process holding the index open
         * do not see until the next write transaction takes the dead writer's lock and
         * repairs the number. So look once as a reader, then again after an empty change
         * (the readers meanwhile see the state before or after, never between). A change seen
         * only after the empty one must be exactly that case: the meta page in the file one
         * commit or more ahead of the number readers start from; any other change that appears
         * late, or that is in the file but never appears, is a difference. */
        uint64_t file_id, readers_id;
        lmdb_txnids(&file_id, &readers_id);
        int seen = landed(op);
        size_t nd = 0;
        const char *probe[] = {"never-an-id"};
        if ((rc = tartan_delete(db, probe, 1, &nd)) || nd)
            die("the empty delete after a kill: %s", rc ? tartan_errmsg(db) : "deleted something");
        done = landed(op);
        if (done)
            atomic_fetch_add(&st.kill_landed, 1);
        if (done && !seen)
            atomic_fetch_add(&st.kill_late, 1);
        if (seen && !done)
            die("%s: the killed writer's change was visible, then gone", op->what);
        /* A delete of no live id commits a transaction all the same (the meta page moves on)
         * but shows nothing: only the numbers could be compared, and landed() says yes. */
        if (observable(op) && (file_id > readers_id) != (done && !seen))
            die("%s: after the kill LMDB's meta page had transaction %llu and readers started "
                "from %llu, but the change was %s before the next write and %s after it",
                op->what, (unsigned long long)file_id, (unsigned long long)readers_id,
                seen ? "visible" : "not visible", done ? "visible" : "not visible");
    } else {
        char buf[512] = "";
        FILE *f = fopen(log, "r");
        if (f) {
            size_t k = fread(buf, 1, sizeof buf - 1, f);
            buf[k] = 0;
            fclose(f);
        }
        die("the writing child ended with status %d: %s", status, buf);
    }
    if (!done) {
        size_t nd;
        if ((rc = run_op(db, op, &nd)))
            die("%s redone after the kill: %s", op->what, tartan_errmsg(db));
    }
    apply_op(op);
}

/* ---- writes that fail on purpose ------------------------------------------------------------- */

/* op with the n-th write call on the data file failing; the call must fail cleanly and leave
 * the index as it was (checked through the same handle, or a fresh one where LMDB declared
 * the environment unusable). Then the change is made for real. */
static void step_fault(const wop *op)
{
    progress("failing write");
    long at = 1 + (long)rbelow(&W, (size_t)calls_seen + 2);
    int err = rbelow(&W, 2) ? ENOSPC : EIO;
    int sticky = (int)rbelow(&W, 2);
    int classes = rbelow(&W, 3) == 0 ? INJ_SYNCS
                  : rbelow(&W, 2)    ? INJ_WRITES
                                     : INJ_WRITES | INJ_SYNCS;
    atomic_fetch_add(&st.faults, 1);
    atomic_store(&tolerate_errors, 1);
    model_announce();
    char ixdata[800];
    snprintf(ixdata, sizeof ixdata, "%s", E.ix);
    inj_count(ixdata);
    inj_arm(at, err, sticky, classes);
    size_t nd;
    int rc = run_op(db, op, &nd);
    inj_off();
    int fired = atomic_load(&inj.fired);
    if (!fired) { /* the change needed fewer calls: it is an ordinary one */
        atomic_store(&tolerate_errors, 0);
        if (rc)
            die("%s: returned %s (%s) without a failure on purpose", op->what, tartan_err_name(rc),
                tartan_errmsg(db));
        apply_op(op);
        return;
    }
    atomic_fetch_add(&st.faults_fired, 1);
    if (rc == 0)
        die("%s: write call %ld failed on purpose (%s) but the change returned 0", op->what, at,
            strerror(err));
    if (rc != ENOSPC && rc != EIO && rc != TARTAN_ESTORAGE)
        die("%s with call %ld failing (%s): returned %s (%s)", op->what, at, strerror(err),
            tartan_err_name(rc), tartan_errmsg(db));
    const char *msg = tartan_errmsg(db);
    if (strncmp(msg, tartan_err_name(rc), strlen(tartan_err_name(rc))))
        die("%s: the message '%s' does not start with %s", op->what, msg, tartan_err_name(rc));
    if (cfg.verbose)
        printf("  failed on purpose (call %ld, %s%s, %s): %s\n", at, strerror(err),
               sticky ? " and after" : "", classes == INJ_SYNCS ? "syncs" : "writes", msg);
    model_commit(NULL, 0, NULL, 0); /* the index is as it was */
    tartan_index_info in;
    if (tartan_info(db, &in)) {
        /* LMDB marks an environment fatal when a meta page write fails: the handle answers
         * nothing until it is reopened. The file is as it was. */
        atomic_fetch_add(&st.faults_fatal, 1);
        if (cfg.verbose)
            printf("  the handle is unusable now (%s): reopening\n", tartan_errmsg(db));
        readers_stop();
        tartan_close(db);
        open_db(0);
        readers_start(db, rnext(&WQ));
    }
    atomic_store(&tolerate_errors, 0);
    writer_check();
    model_announce();
    if ((rc = run_op(db, op, &nd)))
        die("%s redone after the failure on purpose: %s", op->what, tartan_errmsg(db));
    apply_op(op);
}

/* ---- a second process: the `tartan` command, read-only, while the writer goes on ------------- */

static struct {
    pid_t pid;
    int kind; /* 0 search, 1 info, 2 check */
    uint64_t lo;
    call c;
    char out[800];
} P;

static void write_npy_f32(const char *path, const float *x, size_t d0, size_t d1, size_t d2)
{
    char dict[200];
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu, %zu, %zu), }", d0, d1,
                     d2);
    size_t hl = (size_t)n + 1;
    while ((10 + hl) % 64)
        hl++;
    FILE *f = fopen(path, "wb");
    if (!f)
        die("%s: %s", path, strerror(errno));
    put(f, "\x93NUMPY\x01\x00", 8);
    uint16_t h16 = (uint16_t)hl;
    put(f, &h16, 2);
    put(f, dict, (size_t)n);
    for (size_t i = (size_t)n; i + 1 < hl; i++)
        put(f, " ", 1);
    put(f, "\n", 1);
    put(f, x, d0 * d1 * d2 * sizeof(float));
    if (fclose(f))
        die("%s: %s", path, strerror(errno));
}

static void proc_start(void)
{
    if (P.pid || !cfg.tartan[0])
        return;
    progress("second process");
    P.kind = (int)rbelow(&WQ, 4);
    if (P.kind == 3)
        P.kind = 0;
    char q[800], sub[800], threads[16], kbuf[32];
    snprintf(q, sizeof q, "%s/q.npy", cfg.work);
    snprintf(sub, sizeof sub, "%s/subset.txt", cfg.work);
    snprintf(P.out, sizeof P.out, "%s/proc.out", cfg.work);
    char *argv[24];
    int a = 0;
    argv[a++] = cfg.tartan;
    if (P.kind == 0) {
        pool_fill(&writer_pool, &WQ, M.dim);
        call_make(&P.c, &WQ, &writer_pool, rbelow(&WQ, 3) == 0 ? 8 : 0, 1);
        P.c.p.exhaustive = 1;
        P.c.mode = MODE_EXACT;
        write_npy_f32(q, P.c.qb.emb, P.c.qb.nq, P.c.qb.fixed, M.dim);
        snprintf(kbuf, sizeof kbuf, "%zu", P.c.p.k);
        snprintf(threads, sizeof threads, "%d", 1 + (int)rbelow(&WQ, 4));
        argv[a++] = "search";
        argv[a++] = E.ix;
        argv[a++] = "--queries";
        argv[a++] = q;
        argv[a++] = "-k";
        argv[a++] = kbuf;
        argv[a++] = "--exhaustive";
        argv[a++] = "--threads";
        argv[a++] = threads;
        argv[a++] = "--device";
        argv[a++] = "cpu";
        argv[a++] = "--quiet";
        if (P.c.has_subset) {
            FILE *f = fopen(sub, "w");
            if (!f)
                die("%s: %s", sub, strerror(errno));
            for (size_t i = 0; i < P.c.n_subset; i++)
                fprintf(f, "%s\n", P.c.subset[i]);
            fclose(f);
            argv[a++] = "--subset";
            argv[a++] = sub;
        }
    } else if (P.kind == 1) {
        argv[a++] = "info";
        argv[a++] = E.ix;
    } else {
        argv[a++] = "check";
        argv[a++] = E.ix;
    }
    argv[a] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, P.out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    P.lo = model_enter(SLOT_PROC);
    int rc = posix_spawn(&P.pid, cfg.tartan, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        die("posix_spawn %s: %s", cfg.tartan, strerror(rc));
    atomic_store(&proc_pid, P.pid);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("%s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *b = xmalloc(cap);
    size_t k;
    while ((k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n < 2) {
            cap *= 2;
            char *nb = realloc(b, cap);
            if (!nb)
                die("out of memory");
            b = nb;
        }
    }
    fclose(f);
    b[n] = 0;
    *len = n;
    return b;
}

/* Checks the second process once it ended (wait: block until it does). */
static void proc_poll(int wait)
{
    if (!P.pid)
        return;
    int status;
    pid_t r;
    while ((r = waitpid(P.pid, &status, wait ? 0 : WNOHANG)) < 0 && errno == EINTR)
        ;
    if (r == 0)
        return;
    atomic_store(&proc_pid, 0);
    P.pid = 0;
    uint64_t hi = atomic_load(&M.pending);
    size_t len;
    char *out = slurp(P.out, &len);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("tartan %s (second process) ended with status %d: %.600s",
            P.kind == 0   ? "search"
            : P.kind == 1 ? "info"
                          : "check",
            status, out);
    if (P.kind == 0) {
        /* TREC run lines: qid Q0 docid rank score tag. */
        size_t nq = P.c.qb.nq;
        tartan_hit *h = xmalloc((len / 8 + 1) * sizeof *h);
        size_t *cnt = xcalloc(nq, sizeof *cnt);
        size_t nh = 0, last_q = 0;
        char *save = NULL;
        for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            char *f[6];
            int k = 0;
            char *s2 = NULL;
            for (char *t = strtok_r(line, " ", &s2); t && k < 6; t = strtok_r(NULL, " ", &s2))
                f[k++] = t;
            if (k != 6)
                die("tartan search wrote a line of %d fields", k);
            size_t qi = strtoul(f[0], NULL, 10);
            if (qi >= nq || qi < last_q)
                die("tartan search: query id %s out of order", f[0]);
            last_q = qi;
            h[nh].id = f[2];
            h[nh].score = (float)strtod(f[4], NULL);
            nh++;
            cnt[qi]++;
        }
        hitlist *hl = xmalloc(nq * sizeof *hl);
        size_t at = 0;
        for (size_t i = 0; i < nq; i++) {
            hl[i].h = h + at;
            hl[i].n = cnt[i];
            at += cnt[i];
        }
        check_call(&P.c, P.lo, hi, hl, "tartan search (second process)");
        free(hl);
        free(cnt);
        free(h);
        call_free(&P.c);
    } else if (P.kind == 1) {
        tartan_index_info in;
        memset(&in, 0, sizeof in);
        unsigned long long docs = 0, toks = 0;
        const char *d = strstr(out, "\ndocuments ");
        const char *t = strstr(out, "\ntokens ");
        if (!d || !t || sscanf(d, "\ndocuments %llu", &docs) != 1 ||
            sscanf(t, "\ntokens %llu", &toks) != 1)
            die("tartan info (second process) wrote no counts: %.300s", out);
        model_wait(hi);
        pthread_rwlock_rdlock(&M.lock);
        int ok = 0;
        for (uint64_t v = P.lo; v <= hi && !ok; v++) {
            view w;
            view_build(&w, v);
            ok = w.n == docs && w.tokens == toks;
            view_free(&w);
        }
        pthread_rwlock_unlock(&M.lock);
        if (!ok)
            die("tartan info (second process): %llu documents, %llu tokens: no version %llu..%llu "
                "has that",
                docs, toks, (unsigned long long)P.lo, (unsigned long long)hi);
    }
    model_leave(SLOT_PROC);
    free(out);
    atomic_fetch_add(&st.procs, 1);
}

/* ---- epochs and steps ------------------------------------------------------------------------ */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void rm_rf(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void epoch_begin(int no)
{
    free(E.proto);
    memset(&E, 0, sizeof E);
    E.no = no;
    static const size_t dims[] = {8, 16, 32, 48, 64, 128};
    static const unsigned nb[] = {1, 2, 2, 4, 8};
    E.dim = dims[rbelow(&W, 6)];
    E.nbits = nb[rbelow(&W, 5)];
    static const size_t ks[] = {0, 0, 1, 4, 16, 64, 256};
    E.n_centroids = ks[rbelow(&W, 7)];
    E.family = (int)rbelow(&W, 2);
    E.maxlen = 4 + rbelow(&W, 40);
    E.target = 20 + rbelow(&W, 400);
    E.steps = 60 + (long)rbelow(&W, 300);
    E.map_size = rbelow(&W, 2) ? (size_t)64 << 10 : 0; /* small maps grow while readers read */
    E.nproto = 4 + rbelow(&W, 12);
    E.proto = xmalloc(E.nproto * E.dim * sizeof *E.proto);
    for (size_t i = 0; i < E.nproto * E.dim; i++)
        E.proto[i] = (float)rgauss(&W);
    snprintf(E.ix, sizeof E.ix, "%s/ix%d", cfg.work, no);
    snprintf(cur_ix, sizeof cur_ix, "%s", E.ix);
    atomic_store(&cur_epoch, no);
    model_reset(E.dim, E.nbits);
    open_db(1);
    readers_start(db, rnext(&WQ));
    if (cfg.verbose)
        printf("epoch %d: dim %zu nbits %u centroids %zu family %d maxlen %zu target %zu, %ld "
               "steps\n",
               no, E.dim, E.nbits, E.n_centroids, E.family, E.maxlen, E.target, E.steps);
}

static void epoch_end(void)
{
    progress("epoch end");
    proc_poll(1);
    readers_stop();
    run_check(db);
    tartan_close(db);
    db = NULL;
    rm_rf(E.ix);
    atomic_fetch_add(&st.epochs, 1);
}

/* A change: mostly adds while the index is below its target size, deletes above it. */
static void gen_change(wop *op)
{
    int below = M.nlive < E.target;
    size_t r = rbelow(&W, 100);
    if (!M.trained || r < (below ? 55u : 30u)) {
        size_t n = rbelow(&W, 8) == 0 ? 30 + rbelow(&W, ADD_MAX - 29) : 1 + rbelow(&W, 20);
        if (!M.trained && n < 8)
            n = 8;
        gen_add(op, n, 0);
    } else if (r < 75)
        gen_add(op, 1 + rbelow(&W, 20), 1);
    else
        gen_delete(op, rbelow(&W, 40) == 0);
}

static void step(void)
{
    wop op;
    memset(&op, 0, sizeof op);
    size_t r = rbelow(&W, 1000);
    if (!M.trained && r < 60) { /* an explicit training from a sample first */
        size_t n = 8 + rbelow(&W, 40);
        gen_add(&op, n, 0);
        op.kind = OP_TRAIN;
        op.what = "train";
        exec_op(&op);
    } else if (r < 700) {
        gen_change(&op);
        exec_op(&op);
    } else if (r < 760) {
        if (M.trained && rbelow(&W, 8) == 0) {
            gen_add(&op, 4, 0);
            op.kind = OP_TRAIN;
            op.what = "train again";
            op.expect = TARTAN_EINVAL;
        } else if (rbelow(&W, 6) == 0) {
            gen_delete(&op, 0);
            free(op.ids[0]);
            op.ids[0] = xstrdup("");
            op.expect = TARTAN_EBADID;
            op.what = "delete with an empty id";
        } else
            gen_bad_add(&op);
        exec_op(&op);
    } else if (r < 790) {
        step_reopen();
    } else if (r < 860) {
        gen_change(&op);
        if (cfg.kills && op.expect == 0)
            step_kill(&op);
        else
            exec_op(&op);
    } else if (r < 930) {
        gen_change(&op);
        if (cfg.faults && op.expect == 0)
            step_fault(&op);
        else
            exec_op(&op);
    } else if (r < 970) {
        if (cfg.procs)
            proc_start();
    } else {
        run_check(db);
    }
    wop_free(&op);
    if (atomic_load(&cur_step) % 8 == 0)
        run_check(db);
    writer_check();
    proc_poll(0);
    model_gc();
    atomic_fetch_add(&st.steps, 1);
}

/* ---- the watchdog and main ------------------------------------------------------------------- */

static void *watchdog(void *arg)
{
    (void)arg;
    for (;;) {
        sleep(1);
        double idle = now() - atomic_load(&last_progress);
        if (idle > cfg.stall)
            die("no progress for %.0f s: a hang", idle);
    }
    return NULL;
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static void configure(void)
{
    cfg.seconds = atof(env_or("TARTAN_MODEL_SECONDS", "40"));
    const char *s = getenv("TARTAN_MODEL_SEED");
    if (!s || !*s)
        s = getenv("SEED");
    cfg.seed =
        s && *s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) * 1000003u + (uint64_t)getpid();
    cfg.seed %= 1000000000000ull; /* short enough to type */
    cfg.readers = atoi(env_or("TARTAN_MODEL_READERS", "3"));
    if (cfg.readers < 0)
        cfg.readers = 0;
    if (cfg.readers > MAX_READERS)
        cfg.readers = MAX_READERS;
    cfg.max_steps = atol(env_or("TARTAN_MODEL_STEPS", "0"));
    cfg.kills = atoi(env_or("TARTAN_MODEL_KILLS", "1"));
    cfg.faults = atoi(env_or("TARTAN_MODEL_FAULTS", "1"));
    cfg.procs = atoi(env_or("TARTAN_MODEL_PROCS", "1"));
    cfg.verbose = atoi(env_or("TARTAN_MODEL_VERBOSE", "0"));
    cfg.stall = atof(env_or("TARTAN_MODEL_STALL", "300"));
    const char *dev = env_or("TARTAN_MODEL_DEVICE", "cpu");
    cfg.device = !strcmp(dev, "auto")   ? TARTAN_DEVICE_AUTO
                 : !strcmp(dev, "cuda") ? TARTAN_DEVICE_CUDA
                                        : TARTAN_DEVICE_CPU;
    cfg.tol = cfg.device == TARTAN_DEVICE_CPU ? TOL_PER_TOKEN : TOL_PER_TOKEN_GPU;
    const char *top = getenv("top_builddir");
    if (top && *top) {
        snprintf(cfg.tartan, sizeof cfg.tartan, "%s/tartan", top);
        if (access(cfg.tartan, X_OK))
            cfg.tartan[0] = 0;
    }
    /* Its path, not /proc/self/exe itself: under valgrind that is valgrind's tool. */
    ssize_t n = readlink("/proc/self/exe", cfg.self, sizeof cfg.self - 1);
    if (n <= 0) {
        fprintf(stderr, "check_model: /proc/self/exe: %s\n", strerror(errno));
        exit(2);
    }
    cfg.self[n] = 0;
    const char *base = env_or("TARTAN_MODEL_DIR", env_or("TMPDIR", "/tmp"));
    snprintf(cfg.work, sizeof cfg.work, "%s/tartan-model-XXXXXX", base);
    if (!mkdtemp(cfg.work)) {
        fprintf(stderr, "check_model: %s: %s\n", cfg.work, strerror(errno));
        exit(2);
    }
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "--child-op"))
        return child_main(argv[2], argv[3], argv[4], argv[5]);
    configure();
    selftest_exactness();
    printf("check_model: seed %llu (TARTAN_MODEL_SEED=%llu replays it), %.0f s, %d readers, "
           "kills %s, write failures %s, second process %s\n",
           (unsigned long long)cfg.seed, (unsigned long long)cfg.seed, cfg.seconds, cfg.readers,
           cfg.kills ? "on" : "off", cfg.faults ? "on" : "off",
           cfg.procs && cfg.tartan[0] ? "on" : "off");
    fflush(stdout);
    W.s = cfg.seed;
    WQ.s = cfg.seed ^ 0x2545F4914F6CDD1Dull;
    pthread_rwlock_init(&M.lock, NULL);
    pthread_mutex_init(&M.mu, NULL);
    pthread_cond_init(&M.cv, NULL);
    idmap_init(&M.live, 16);
    atomic_store(&last_progress, now());
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    pthread_detach(wd);
    double t0 = now(), deadline = t0 + cfg.seconds;
    long total = 0;
    int no = 0;
    do {
        epoch_begin(no);
        for (long s = 0; s < E.steps && now() < deadline; s++) {
            if (cfg.max_steps && total >= cfg.max_steps)
                break;
            atomic_store(&cur_step, s);
            step();
            total++;
        }
        epoch_end();
        no++;
    } while (now() < deadline && !(cfg.max_steps && total >= cfg.max_steps));
    /* The failures on purpose must have happened: otherwise the interposition is broken and
     * the test would pass without testing. */
    if (cfg.faults && atomic_load(&st.faults) >= 5 && atomic_load(&st.faults_fired) == 0)
        die("%ld writes were to fail on purpose and none did: the write interposition does not "
            "reach LMDB",
            atomic_load(&st.faults));
    printf("check_model: seed %llu, %.0f s, %ld epochs, %ld steps: %ld adds (%ld replacing), "
           "%ld deletes (%ld documents), %ld trainings, %ld refused as predicted, %ld reopens, "
           "%ld killed writers (%ld finished first, %ld others had landed, %ld of them seen by "
           "readers only after the next write), %ld failing writes "
           "(%ld failed, %ld left the handle unusable), %ld second-process runs, %ld checks; "
           "%ld reader calls and %ld writer searches checked (%ld matched an older version "
           "than the newest possible); largest score difference %.2g per query token "
           "(tolerance %.2g); 0 differences from the model\n",
           (unsigned long long)cfg.seed, now() - t0, st.epochs, st.steps, st.adds, st.replaces,
           st.deletes, st.deleted, st.trains, st.refused, st.reopens, st.kills, st.kill_finished,
           st.kill_landed, st.kill_late, st.faults, st.faults_fired, st.faults_fatal, st.procs,
           st.checks, st.reader_calls, st.writer_searches, st.range_wider, max_err_per_token,
           cfg.tol);
    model_reset(0, 0);
    idmap_free(&M.live);
    for (size_t i = 0; i < NDEAD; i++)
        free(dead_ids[i]);
    free(writer_pool.tok);
    free(E.proto);
    rm_rf(cfg.work);
    return 0;
}
