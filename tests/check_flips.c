/*
 * check_flips.c: one flipped bit at a time, over the bytes of a real small index's data.mdb
 * (every stride-th byte; TARTAN_FLIPS_STRIDE=1 for all of them), each tried in a child
 * process: does the index still open, does `tartan check` see the damage, do searches
 * (exhaustive and PLAID) answer exactly as before, and, when the damage is seen, does
 * tartan_repair leave a sound index that answers for the kept documents exactly as before?
 *
 * Each byte is classed by what it is part of, from LMDB's page layout (lmdb.h's structures,
 * read from the file): a tartan record (the data of a value of a tartan database), LMDB's own
 * structure (meta pages, page headers, node headers and pointers, keys, branch pages, the free
 * list's and the main database's pages), or bytes no page uses (free pages, free space inside
 * pages, the unused end of overflow pages). Prints a table of outcome counts per class.
 *
 * Fails when any flip is answered wrongly (by a search before any repair, or after it); when a
 * flip in a tartan record (the codec tables and the centroid table, which are stored twice,
 * included), in a transaction id of LMDB's meta pages (which tartan's commit record orders,
 * FORMAT.md "LMDB's meta pages"; the one flip that looks like LMDB's own failed-commit trace
 * there does not arise in this index's state) or in an unused byte crashes or is not
 * repaired. LMDB's other
 * bytes are measured and reported (README "Guarantees"), not failed on for crashes: LMDB keeps
 * no checksums of its own pages and its cursors trust them.
 *
 * Besides every stride-th byte (with one bit each), every run flips the focus bytes: several
 * bits of both meta pages' transaction ids, and bytes of the codec record, the centroid record
 * and their copies (header, checksum, data, LMDB's node of each).
 *
 * Exit status 0 or 1. TARTAN_FLIPS_STRIDE (default 61: about a minute) and TARTAN_FLIPS_PHASE
 * (default 0): the bytes flipped are phase, phase + stride, ...; TARTAN_FLIPS_DIR (default /dev/shm
 * when it exists: the repairs' syncs are free there); TARTAN_FLIPS_ONLY=N (and TARTAN_FLIPS_MASK=M,
 * default the sweep's bit) flips byte N alone in this process.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tartan.h"

#define DIM 32
#define K 16
#define NDOCS 300
#define NQ 4
#define QLEN 3
#define DEEP 300 /* exhaustive depth: every document */

static char dir[512], ix[600], pristine[600];

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double gauss(void)
{
    double u = ((double)(rnd() >> 11) + 1) / 9007199254740993.0;
    double v = (double)(rnd() >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* ---- the index and its answers (in children: this process never starts OpenMP, whose
 * threads do not survive a fork) ------------------------------------------------------------ */

static int build(void)
{
    rng_state = 31337;
    static char idb[NDOCS][16];
    static const char *idp[NDOCS];
    size_t lens[NDOCS], rows = 0;
    for (int i = 0; i < NDOCS; i++) {
        snprintf(idb[i], sizeof idb[i], "doc-%d", i);
        idp[i] = idb[i];
        lens[i] = 1 + rnd() % 10;
        rows += lens[i];
    }
    float *emb = malloc(rows * DIM * sizeof *emb);
    for (size_t i = 0; i < rows * DIM; i++)
        emb[i] = (float)gauss();
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = K;
    tartan_db *db;
    if (tartan_open(ix, &o, &db))
        return 1;
    /* Two batches (the second reopens a segment), then every seventh document deleted:
     * free pages and numbers with holes. */
    size_t half = 0;
    for (int i = 0; i < NDOCS / 2; i++)
        half += lens[i];
    tartan_batch a = {NDOCS / 2, idp, lens, emb, half, DIM, TARTAN_FLOAT32};
    tartan_batch b = {NDOCS - NDOCS / 2, idp + NDOCS / 2, lens + NDOCS / 2, emb + half * DIM,
                      rows - half, DIM, TARTAN_FLOAT32};
    const char *del[NDOCS / 7 + 1];
    size_t nd = 0;
    for (int i = 0; i < NDOCS; i += 7)
        del[nd++] = idp[i];
    int rc = tartan_add(db, &a, 0) || tartan_add(db, &b, 0) || tartan_delete(db, del, nd, NULL);
    tartan_close(db);
    free(emb);
    return rc;
}

typedef struct answers {
    int rc;
    size_t n[2][NQ];
    char id[2][NQ][DEEP][12];
    float score[2][NQ][DEEP];
} answers;

static int answer(tartan_db *db, answers *a)
{
    uint64_t s = rng_state;
    rng_state = 99;
    float q[NQ * QLEN * DIM];
    for (int i = 0; i < NQ * QLEN * DIM; i++)
        q[i] = (float)gauss();
    rng_state = s;
    tartan_queries qs = {NQ, NULL, QLEN, q, NQ * QLEN, DIM, TARTAN_FLOAT32};
    memset(a, 0, sizeof *a);
    for (int e = 0; e < 2; e++) {
        tartan_search_params p;
        tartan_search_params_init(&p, e ? DEEP : 10);
        p.exhaustive = e;
        p.threads = 1;
        p.device = TARTAN_DEVICE_CPU;
        tartan_results *res;
        int rc = tartan_search(db, &qs, &p, &res);
        if (rc)
            return a->rc = rc;
        for (int i = 0; i < NQ; i++) {
            a->n[e][i] = res->counts[i];
            for (size_t j = 0; j < res->counts[i] && j < DEEP; j++) {
                snprintf(a->id[e][i][j], 12, "%s", res->hits[res->offsets[i] + j].id);
                a->score[e][i][j] = res->hits[res->offsets[i] + j].score;
            }
        }
        tartan_results_free(res);
    }
    return 0;
}

/* The exhaustive rankings of want without the documents removed (gone: ids, n) are got's. */
static int same_without(const answers *want, const answers *got, char (*gone)[12], int ngone)
{
    for (int i = 0; i < NQ; i++) {
        size_t j = 0;
        for (size_t x = 0; x < want->n[1][i]; x++) {
            int skip = 0;
            for (int g = 0; g < ngone; g++)
                skip |= !strcmp(want->id[1][i][x], gone[g]);
            if (skip)
                continue;
            if (j >= got->n[1][i] || strcmp(want->id[1][i][x], got->id[1][i][j]) ||
                want->score[1][i][x] != got->score[1][i][j])
                return 0;
            j++;
        }
        if (j != got->n[1][i])
            return 0;
    }
    return 1;
}

/* ---- one flip, in a child ------------------------------------------------------------------ */

enum outcome {
    O_SAME,       /* check finds nothing; every answer as before */
    O_NOOPEN,     /* the index does not open (seen; nothing to repair it through) */
    O_DETECTED,   /* check reports damage; the repair then works ("repaired") */
    O_SEARCHONLY, /* check finds nothing, a search reports damage */
    O_WRONG,      /* check finds nothing, an answer differs */
    O_NOREPAIR,   /* seen, but the repair failed (codec or centroid damage: expected) */
    O_BADREPAIR,  /* repaired, but the index is not sound or answers otherwise */
    O_CRASH,      /* the child died (signal) or hung */
    O_N
};
static const char *const outcome_name[O_N] = {"same",      "no-open",    "repaired", "search-only",
                                              "WRONG",     "no-repair",  "BAD-REPAIR", "crash"};

typedef struct removed {
    int n;
    char id[NDOCS][12];
} removed;

static int note_removed(void *ctx, const char *kind, const char *message)
{
    removed *r = ctx;
    const char *p = strstr(message, "(id '");
    if (strcmp(kind, "removed") || !p || r->n >= NDOCS)
        return 0;
    p += 5;
    size_t n = strcspn(p, "'");
    snprintf(r->id[r->n++], 12, "%.*s", (int)(n < 11 ? n : 11), p);
    return 0;
}

static int count_problems(void *ctx, const char *kind, const char *message)
{
    (void)kind;
    (void)message;
    ++*(int *)ctx;
    return 0;
}

/* Open and check: O_SAME, O_WRONG, O_SEARCHONLY when the check finds nothing (the searches
 * then tell), O_NOOPEN, or O_DETECTED when it reports damage (the parent then tries searches
 * and the repair in processes of their own). */
static int child_check(const answers *want)
{
    tartan_db *db;
    if (tartan_open(ix, NULL, &db))
        return O_NOOPEN;
    int problems = 0;
    size_t np;
    int crc = tartan_check(db, count_problems, &problems, &np);
    if (crc) {
        tartan_close(db);
        return O_DETECTED;
    }
    answers *got = malloc(sizeof *got);
    int arc = answer(db, got);
    tartan_close(db);
    int o = arc ? O_SEARCHONLY : memcmp(want, got, sizeof *got) ? O_WRONG : O_SAME;
    free(got);
    return o;
}

/* Searches over an index whose damage the check saw (never repaired): S_ERROR when they
 * refuse, S_SAME when the answers are as before, S_WRONG otherwise. */
enum { S_ERROR, S_SAME, S_WRONG, S_CRASH, S_N };
static const char *const search_name[S_N] = {"refused", "same", "WRONG", "crash"};

static int child_search(const answers *want)
{
    tartan_db *db;
    if (tartan_open(ix, NULL, &db))
        return S_ERROR;
    answers *got = malloc(sizeof *got);
    int arc = answer(db, got);
    tartan_close(db);
    int o = arc ? S_ERROR : memcmp(want, got, sizeof *got) ? S_WRONG : S_SAME;
    free(got);
    return o;
}

/* The repair: O_DETECTED when it leaves a sound index answering for the kept documents as
 * before, O_NOREPAIR when it refuses, O_BADREPAIR otherwise. */
static int child_repair(const answers *want)
{
    tartan_db *db;
    if (tartan_open(ix, NULL, &db))
        return O_NOREPAIR;
    removed r = {0};
    size_t nrem, np;
    int rrc = tartan_repair(db, note_removed, &r, &nrem);
    if (rrc && getenv("TARTAN_FLIPS_ONLY"))
        printf("repair: %s\n", tartan_errmsg(db));
    if (rrc) {
        tartan_close(db);
        return O_NOREPAIR;
    }
    answers *got = malloc(sizeof *got);
    int sound = tartan_check(db, NULL, NULL, &np) == 0;
    int ok = sound && answer(db, got) == 0 && same_without(want, got, r.id, r.n);
    if (!ok && getenv("TARTAN_FLIPS_ONLY"))
        printf("after the repair: sound %d, %zu problems, %d removed: %s\n", sound, np, r.n,
               tartan_errmsg(db));
    tartan_close(db);
    free(got);
    return ok ? O_DETECTED : O_BADREPAIR;
}

/* ---- LMDB's page layout, to class each byte (lmdb.h, 64-bit) ------------------------------- */

enum cls {
    C_RECORD,
    C_MODEL,
    C_UNUSED,
    C_META,
    C_TXNID,
    C_PAGEHDR,
    C_NODE,
    C_KEY,
    C_BRANCH,
    C_FREEDB,
    C_MAINDB,
    C_N
};
static const char *const cls_name[C_N] = {"tartan records",
                                          "tartan codec, centroids",
                                          "unused bytes",
                                          "LMDB meta pages",
                                          "LMDB meta txnids",
                                          "LMDB page headers",
                                          "LMDB node headers, pointers",
                                          "LMDB keys",
                                          "LMDB branch pages",
                                          "LMDB free-list tree",
                                          "LMDB main database"};

#define PAGEHDR 16
#define P_BRANCH 0x01
#define P_LEAF 0x02
#define P_OVERFLOW 0x04
#define P_META 0x08
#define F_BIGDATA 0x01

static const uint8_t *file;
static size_t fsize, psize = 4096;
static uint8_t *cls; /* [fsize] */

/* Where the model's records lie (focus bytes): the codec, its copy, the centroid record, its
 * copy: data offset and size, and the offset of LMDB's node holding each. */
enum { R_CODEC, R_CODEC_COPY, R_CENT, R_CENT_COPY, R_N };
static size_t rec_at[R_N], rec_size[R_N], rec_node[R_N];

static uint16_t u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static uint64_t u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void mark(size_t off, size_t n, int c)
{
    for (size_t i = 0; i < n && off + i < fsize; i++)
        cls[off + i] = (uint8_t)c;
}

/* Classes the pages of the tree rooted at pgno; `values`: the class of its values' data. */
static void walk(uint64_t pgno, int values, int depth, const char *db)
{
    if (pgno == UINT64_MAX || pgno * psize >= fsize || depth > 16)
        return;
    const uint8_t *pg = file + pgno * psize;
    size_t base = pgno * psize;
    uint16_t flags = u16(pg + 10), lower = u16(pg + 12);
    int branch = flags & P_BRANCH;
    mark(base, psize, C_UNUSED);
    mark(base, PAGEHDR, branch ? C_BRANCH : C_PAGEHDR);
    mark(base + PAGEHDR, lower - PAGEHDR, branch ? C_BRANCH : C_NODE);
    unsigned n = (lower - PAGEHDR) / 2;
    for (unsigned i = 0; i < n; i++) {
        uint16_t at = u16(pg + PAGEHDR + 2 * i);
        if (at >= psize)
            continue;
        const uint8_t *node = pg + at;
        uint16_t ksize = u16(node + 6);
        if (branch) {
            uint64_t child = u16(node) | (uint64_t)u16(node + 2) << 16 | (uint64_t)u16(node + 4) << 32;
            mark(base + at, 8u + ksize, C_BRANCH);
            walk(child, values, depth + 1, db);
            continue;
        }
        uint32_t dsize = u16(node) | (uint32_t)u16(node + 2) << 16;
        uint16_t nflags = u16(node + 4);
        int rec = -1;
        if (db && !strcmp(db, "meta") && ksize == 5 && !memcmp(node + 8, "codec", 5))
            rec = R_CODEC;
        else if (db && !strcmp(db, "meta") && ksize == 10 && !memcmp(node + 8, "codec.copy", 10))
            rec = R_CODEC_COPY;
        else if (db && !strcmp(db, "centroids") && ksize == 4)
            rec = u16(node + 8) == 0 ? R_CENT : R_CENT_COPY;
        if (rec >= 0) {
            rec_node[rec] = base + at;
            rec_size[rec] = dsize;
            rec_at[rec] = base + at + 8 + ksize;
            if ((nflags & F_BIGDATA) && u64(node + 8 + ksize) * psize < fsize)
                rec_at[rec] = u64(node + 8 + ksize) * psize + PAGEHDR;
        }
        mark(base + at, 8, C_NODE);
        mark(base + at + 8, ksize, values == C_RECORD ? C_KEY : values);
        size_t data = base + at + 8 + ksize;
        if (nflags & F_BIGDATA) {
            uint64_t ov = u64(node + 8 + ksize);
            mark(data, 8, C_NODE);
            if (ov * psize < fsize) {
                size_t pages = (PAGEHDR + dsize + psize - 1) / psize;
                mark(ov * psize, pages * psize, C_UNUSED);
                mark(ov * psize, PAGEHDR, C_PAGEHDR);
                mark(ov * psize + PAGEHDR, dsize, values);
            }
        } else if (values == C_MAINDB && (nflags & 0x02) && dsize == 48) { /* F_SUBDATA */
            /* A named database's record: its own tree holds tartan records (the model's
             * cannot be salvaged when damaged: FORMAT.md). */
            mark(data, dsize, C_MAINDB);
            char name[16];
            snprintf(name, sizeof name, "%.*s", ksize < 15 ? ksize : 15, (const char *)node + 8);
            walk(u64(file + data + 40), strcmp(name, "centroids") ? C_RECORD : C_MODEL, 0, name);
        } else {
            mark(data, dsize, rec == R_CODEC || rec == R_CODEC_COPY ? C_MODEL : values);
        }
    }
}

static void classify(void)
{
    cls = malloc(fsize);
    memset(cls, C_UNUSED, fsize);
    mark(0, 2 * psize, C_META);
    mark(144, 8, C_TXNID);
    mark(psize + 144, 8, C_TXNID);
    /* The current meta page: the higher transaction id. In a meta page: mm_dbs (free, main:
     * 48 bytes each) at 40, md_root at 40 into an MDB_db, mm_txnid at 144. */
    const uint8_t *meta = u64(file + 144) >= u64(file + psize + 144) ? file : file + psize;
    walk(u64(meta + 40 + 40), C_FREEDB, 0, NULL);
    walk(u64(meta + 88 + 40), C_MAINDB, 0, NULL);
}

/* ---- the sweep ----------------------------------------------------------------------------- */

static int copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0)
        return -1;
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            return -1;
    close(in);
    close(out);
    return 0;
}

/* Puts the pristine index back (the repairs replace the directory). */
static void restore(void)
{
    /* four paths of at most sizeof ix bytes and the words around them */
    char cmd[4 * sizeof ix + 64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'.compact-* && cp -a '%s' '%s'", ix, ix, pristine, ix);
    if (system(cmd) != 0) {
        fprintf(stderr, "check_flips: restoring the index failed\n");
        exit(1);
    }
}

static int run_child(int (*fn)(const answers *), const answers *want, answers *out)
{
    answers *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                           -1, 0);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        int rc;
        if (fn) {
            rc = fn(want);
        } else {
            tartan_db *db;
            rc = tartan_open(ix, NULL, &db) || answer(db, shared);
            tartan_close(db);
        }
        _exit(rc);
    }
    int status;
    waitpid(pid, &status, 0);
    if (out)
        memcpy(out, shared, sizeof *out);
    munmap(shared, sizeof *shared);
    if (!WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

struct flip {
    size_t off;
    uint8_t mask;
};

int main(void)
{
    const char *d = getenv("TARTAN_FLIPS_DIR");
    struct stat st;
    if (!d)
        d = stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp";
    long stride = getenv("TARTAN_FLIPS_STRIDE") ? atol(getenv("TARTAN_FLIPS_STRIDE")) : 61;
    long phase = getenv("TARTAN_FLIPS_PHASE") ? atol(getenv("TARTAN_FLIPS_PHASE")) : 0;
    if (stride < 1)
        stride = 1;
    snprintf(dir, sizeof dir, "%s/tartan-flips-XXXXXX", d);
    if (!mkdtemp(dir)) {
        perror(dir);
        return 1;
    }
    snprintf(ix, sizeof ix, "%s/ix", dir);
    snprintf(pristine, sizeof pristine, "%s/pristine", dir);
    int status = 1;
    struct flip *flips = NULL;
    answers *want = calloc(1, sizeof *want);
    pid_t pid = fork();
    if (pid == 0)
        _exit(build());
    int ws;
    waitpid(pid, &ws, 0);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws)) {
        fprintf(stderr, "check_flips: building the index failed\n");
        goto out;
    }
    if (run_child(NULL, NULL, want) != 0) {
        fprintf(stderr, "check_flips: searching the sound index failed\n");
        goto out;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s'", ix, pristine);
    if (system(cmd) != 0)
        goto out;
    char data[700], pdata[700];
    snprintf(data, sizeof data, "%s/data.mdb", ix);
    snprintf(pdata, sizeof pdata, "%s/data.mdb", pristine);
    int fd = open(pdata, O_RDONLY);
    fstat(fd, &st);
    fsize = (size_t)st.st_size;
    file = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    classify();

    if (getenv("TARTAN_FLIPS_ONLY")) {
        /* One byte, in this process (for a debugger): flip it and run the child's part. */
        size_t off = (size_t)atol(getenv("TARTAN_FLIPS_ONLY"));
        uint8_t mask = getenv("TARTAN_FLIPS_MASK")
                           ? (uint8_t)strtoul(getenv("TARTAN_FLIPS_MASK"), NULL, 0)
                           : (uint8_t)(1u << (off * 5 % 8));
        int rfd = open(data, O_RDWR);
        uint8_t b;
        if (rfd < 0 || pread(rfd, &b, 1, (off_t)off) != 1)
            goto out;
        b ^= mask;
        if (pwrite(rfd, &b, 1, (off_t)off) != 1)
            goto out;
        close(rfd);
        int o = child_check(want);
        if (o == O_DETECTED) {
            printf("searches: %s\n", search_name[child_search(want)]);
            o = child_repair(want);
        }
        printf("byte %zu (%s): %s\n", off, cls_name[cls[off]], outcome_name[o]);
        status = 0;
        goto out;
    }
    int verbose = getenv("TARTAN_FLIPS_VERBOSE") != NULL;
    long counts[C_N][O_N] = {{0}}, scounts[C_N][S_N] = {{0}}, bytes[C_N] = {0};
    for (size_t i = 0; i < fsize; i++)
        bytes[cls[i]]++;
    int bad = 0;
    long tried = 0;
    /* The flips: every stride-th byte, one bit each, then the focus bytes. */
    size_t nflips = 0, cap = fsize / (size_t)stride + 256;
    flips = malloc(cap * sizeof *flips);
    if (!flips)
        goto out;
    for (size_t off = (size_t)(phase % stride); off < fsize; off += (size_t)stride)
        flips[nflips++] = (struct flip){off, (uint8_t)(1u << (off * 5 % 8))};
    size_t nfocus = nflips;
    for (int p = 0; p < 2; p++) {
        /* Both transaction ids: the low bits (parity, the neighbour's id), a middle and a high
         * byte (an id far above the other). */
        static const struct flip tx[] = {{0, 0x01}, {0, 0x02}, {0, 0x04}, {0, 0x80},
                                         {1, 0x01}, {3, 0x10}, {5, 0x02}, {7, 0x40}};
        for (size_t i = 0; i < sizeof tx / sizeof tx[0]; i++)
            flips[nflips++] = (struct flip){(size_t)p * psize + 144 + tx[i].off, tx[i].mask};
    }
    for (int r = 0; r < R_N; r++) {
        if (!rec_size[r]) {
            fprintf(stderr, "check_flips: the index has no %s record\n",
                    r == R_CODEC        ? "codec"
                    : r == R_CODEC_COPY ? "codec copy"
                    : r == R_CENT       ? "centroid"
                                        : "centroid copy");
            goto out;
        }
        /* The record's first bytes (its checksum or header), middle and last byte, and LMDB's
         * node holding it (its size and its key). */
        size_t at[] = {rec_at[r],
                       rec_at[r] + 5,
                       rec_at[r] + 13,
                       rec_at[r] + rec_size[r] / 2,
                       rec_at[r] + rec_size[r] - 1,
                       rec_node[r],
                       rec_node[r] + 6,
                       rec_node[r] + 8};
        for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
            flips[nflips++] = (struct flip){at[i], (uint8_t)(1u << (at[i] * 3 % 8))};
    }
    for (size_t fi = 0; fi < nflips; fi++) {
        size_t off = flips[fi].off;
        uint8_t mask = flips[fi].mask;
        int rfd = open(data, O_RDWR);
        uint8_t b;
        if (rfd < 0 || pread(rfd, &b, 1, (off_t)off) != 1)
            goto out;
        b ^= mask;
        if (pwrite(rfd, &b, 1, (off_t)off) != 1)
            goto out;
        close(rfd);
        int o = run_child(child_check, want, NULL), so = -1;
        if (o < 0 || o >= O_N)
            o = O_CRASH;
        if (o == O_DETECTED) {
            so = run_child(child_search, want, NULL);
            if (so < 0 || so >= S_N)
                so = S_CRASH;
            scounts[cls[off]][so]++;
            o = run_child(child_repair, want, NULL);
            if (o < 0 || o >= O_N)
                o = O_CRASH;
        }
        counts[cls[off]][o]++;
        tried++;
        /* A tartan record's damage (the model's too, stored twice) and a damaged transaction
         * id are seen and repaired; an unused byte changes nothing; nothing is ever answered
         * wrongly, before a repair or after it. */
        int fine = cls[off] == C_RECORD || cls[off] == C_MODEL || cls[off] == C_TXNID
                       ? o == O_DETECTED
                   : cls[off] == C_UNUSED ? o == O_SAME
                                          : o != O_WRONG && o != O_BADREPAIR;
        if (so == S_WRONG || (so == S_CRASH && cls[off] != C_NODE && cls[off] != C_PAGEHDR &&
                              cls[off] != C_KEY && cls[off] != C_BRANCH && cls[off] != C_FREEDB &&
                              cls[off] != C_MAINDB && cls[off] != C_META))
            fine = 0;
        if (verbose && (o != O_SAME && o != O_DETECTED ? 1 : so == S_CRASH || so == S_WRONG))
            printf("byte %zu (%s): %s%s%s\n", off, cls_name[cls[off]], outcome_name[o],
                   so >= 0 ? ", searches before the repair: " : "", so >= 0 ? search_name[so] : "");
        if (!fine) {
            fprintf(stderr, "check_flips: byte %zu (%s), bit mask %02x: %s\n", off,
                    cls_name[cls[off]], mask, outcome_name[o]);
            bad = 1;
        }
        if (o != O_SAME && o != O_WRONG && o != O_SEARCHONLY)
            restore();
        else if (copy_file(pdata, data))
            goto out;
    }
    printf("check_flips: %ld flips in %zu bytes of data.mdb (every %ld-th byte, then %zu focus "
           "bytes)\n",
           tried, fsize, stride, nflips - nfocus);
    printf("%-30s %7s", "class (bytes in the file)", "flipped");
    for (int o = 0; o < O_N; o++)
        printf(" %11s", outcome_name[o]);
    printf("\n");
    for (int c = 0; c < C_N; c++) {
        char label[64];
        snprintf(label, sizeof label, "%s (%ld)", cls_name[c], bytes[c]);
        long n = 0;
        for (int o = 0; o < O_N; o++)
            n += counts[c][o];
        printf("%-30s %7ld", label, n);
        for (int o = 0; o < O_N; o++)
            printf(" %11ld", counts[c][o]);
        printf("\n");
    }
    printf("\nsearches over the damage tartan check saw, before any repair:\n");
    printf("%-30s %7s", "class", "seen");
    for (int o = 0; o < S_N; o++)
        printf(" %11s", search_name[o]);
    printf("\n");
    for (int c = 0; c < C_N; c++) {
        long n = 0;
        for (int o = 0; o < S_N; o++)
            n += scounts[c][o];
        if (!n)
            continue;
        printf("%-30s %7ld", cls_name[c], n);
        for (int o = 0; o < S_N; o++)
            printf(" %11ld", scounts[c][o]);
        printf("\n");
    }
    status = bad;
out:
    free(flips);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        status = 1;
    free(want);
    return status;
}
