/* mpi_util.c: see mpi_util.h. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "mpi_util.h"

int tool_mpi_rank = 0, tool_mpi_size = 1, tool_mpi_serialized = 0;

int tool_mpi_init(int *argc, char ***argv)
{
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS)
        return rc;
    tool_mpi_serialized = provided >= MPI_THREAD_SERIALIZED;
    MPI_Comm_rank(MPI_COMM_WORLD, &tool_mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &tool_mpi_size);
    tool_mpi_pick_gpu();
    return 0;
}

void tool_mpi_finalize(void)
{
    MPI_Finalize();
}

/* GPUs the driver shows on this host (0 without the NVIDIA driver). */
static int host_gpus(void)
{
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

void tool_mpi_pick_gpu(void)
{
    MPI_Comm host;
    int local = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(host, &local);
        MPI_Comm_free(&host);
    }
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    char pick[64];
    if (vis && *vis) {
        /* Keep the local rank's entry of the list the user gave (modulo its length). */
        size_t n = 1;
        for (const char *p = vis; *p; p++)
            n += *p == ',';
        size_t want = (size_t)local % n;
        const char *p = vis;
        for (size_t i = 0; i < want; i++)
            p = strchr(p, ',') + 1;
        size_t l = strcspn(p, ",");
        if (l >= sizeof pick)
            return;
        memcpy(pick, p, l);
        pick[l] = 0;
    } else {
        int n = host_gpus();
        if (n <= 0)
            return;
        snprintf(pick, sizeof pick, "%d", local % n);
    }
    setenv("CUDA_VISIBLE_DEVICES", pick, 1);
}

const char *tool_mpi_detail(const char *msg)
{
    /* A code name: TARTAN_E... or an errno name, capitals, digits and underscores. */
    const char *p = msg;
    if (*p != 'E' && strncmp(p, "TARTAN_E", 8))
        return msg;
    while ((*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_')
        p++;
    return p[0] == ':' && p[1] == ' ' ? p + 2 : msg;
}

int tool_mpi_any(int flag)
{
    int in = flag != 0, out = 0;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return out;
}

uint64_t tool_mpi_sum(uint64_t v)
{
    uint64_t out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return out;
}

double tool_mpi_max(double v)
{
    double out = 0;
    MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
}

int tool_mpi_failed(const char *prog, int rc, const char *msg)
{
    int failed = rc != 0, n = 0;
    MPI_Allreduce(&failed, &n, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (n == 0)
        return 0;
    const char *name = tartan_err_name(rc);
    if (n == tool_mpi_size) {
        if (tool_mpi_rank == 0)
            fprintf(stderr, "%s: %s: %s\n", prog, name ? name : "error", msg);
    } else if (failed) {
        fprintf(stderr, "%s: rank %d: %s: %s\n", prog, tool_mpi_rank, name ? name : "error", msg);
    }
    fflush(stderr);
    return 1;
}

/* MPI counts are ints: long strings go in pieces of at most 1 GiB. */
#define PIECE ((size_t)1 << 30)

void tool_mpi_bcast(void *buf, size_t len, int root)
{
    for (size_t at = 0; at < len; at += PIECE) {
        size_t n = len - at < PIECE ? len - at : PIECE;
        MPI_Bcast((char *)buf + at, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
    }
}

int tool_mpi_bcast_alloc(char **buf, size_t *len, int root)
{
    uint64_t n = tool_mpi_rank == root ? (uint64_t)*len : 0;
    MPI_Bcast(&n, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
    char *p = tool_mpi_rank == root ? *buf : malloc((size_t)n + 1);
    if (tool_mpi_any(p == NULL))
        return ENOMEM;
    tool_mpi_bcast(p, (size_t)n, root);
    if (tool_mpi_rank != root) {
        p[n] = 0;
        *buf = p;
        *len = (size_t)n;
    }
    return 0;
}

/* ---- the transport of a shared training (tartan_train_group) ------------------------------ */

static int group_sum(void *ctx, double *v, size_t n)
{
    (void)ctx;
    /* Pieces of 2^27 doubles (1 GiB): MPI counts are ints. */
    const size_t piece = (size_t)1 << 27;
    for (size_t at = 0; at < n; at += piece) {
        size_t c = n - at < piece ? n - at : piece;
        if (MPI_Allreduce(MPI_IN_PLACE, v + at, (int)c, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) !=
            MPI_SUCCESS)
            return -1;
    }
    return 0;
}

static int group_bcast(void *ctx, void *buf, size_t len)
{
    (void)ctx;
    for (size_t at = 0; at < len; at += PIECE) {
        size_t c = len - at < PIECE ? len - at : PIECE;
        if (MPI_Bcast((char *)buf + at, (int)c, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
            return -1;
    }
    return 0;
}

/* Point to point, rank by rank, in pieces: no int limit on any member's bytes or their total
 * (a gather happens twice a training, of at most K x dim floats). */
static int group_gather(void *ctx, const void *mine, size_t len, void *all, const size_t *lens)
{
    (void)ctx;
    const int tag = 2020;
    if (tool_mpi_rank != 0) {
        for (size_t at = 0; at < len; at += PIECE) {
            size_t c = len - at < PIECE ? len - at : PIECE;
            if (MPI_Send((const char *)mine + at, (int)c, MPI_BYTE, 0, tag, MPI_COMM_WORLD) !=
                MPI_SUCCESS)
                return -1;
        }
        return 0;
    }
    char *dst = all;
    if (len)
        memcpy(dst, mine, len);
    dst += len;
    for (int r = 1; r < tool_mpi_size; r++) {
        for (size_t at = 0; at < lens[r]; at += PIECE) {
            size_t c = lens[r] - at < PIECE ? lens[r] - at : PIECE;
            if (MPI_Recv(dst + at, (int)c, MPI_BYTE, r, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) !=
                MPI_SUCCESS)
                return -1;
        }
        dst += lens[r];
    }
    return 0;
}

void tool_mpi_train_group(tartan_train_group *g)
{
    g->rank = tool_mpi_rank;
    g->size = tool_mpi_size;
    g->ctx = NULL;
    g->sum = group_sum;
    g->broadcast = group_bcast;
    g->gather = group_gather;
}

char **tool_mpi_gather_text(const char *text)
{
    int len = (int)strlen(text), p = tool_mpi_size;
    int *lens = tool_mpi_rank == 0 ? calloc((size_t)p, sizeof *lens) : NULL;
    int *offs = tool_mpi_rank == 0 ? calloc((size_t)p, sizeof *offs) : NULL;
    MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
    char *all = NULL;
    if (tool_mpi_rank == 0) {
        size_t total = 0;
        for (int r = 0; r < p; r++) {
            offs[r] = (int)total;
            total += (size_t)lens[r];
        }
        all = malloc(total + 1);
    }
    MPI_Gatherv(text, len, MPI_CHAR, all, lens, offs, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (tool_mpi_rank != 0)
        return NULL;
    char **out = calloc((size_t)p, sizeof *out);
    for (int r = 0; r < p; r++) {
        out[r] = malloc((size_t)lens[r] + 1);
        memcpy(out[r], all + offs[r], (size_t)lens[r]);
        out[r][lens[r]] = 0;
    }
    free(all);
    free(lens);
    free(offs);
    return out;
}

void tool_mpi_shard_path(const char *index, int rank, int size, char *out, size_t cap)
{
    snprintf(out, cap, "%s/shard-%d-of-%d", index, rank, size);
}

/* The shard counts INDEX's directory names: *other, one other than the job's ranks (0: none);
 * *divisor, the largest below the job's ranks that divides them (0: none). */
static void shard_counts(const char *index, int *other, int *divisor)
{
    *other = *divisor = 0;
    DIR *d = opendir(index);
    for (struct dirent *e; d && (e = readdir(d));) {
        int r, n;
        char tail;
        if (sscanf(e->d_name, "shard-%d-of-%d%c", &r, &n, &tail) != 2 || n == tool_mpi_size)
            continue;
        *other = n;
        if (n > 0 && n < tool_mpi_size && tool_mpi_size % n == 0 && n > *divisor)
            *divisor = n;
    }
    if (d)
        closedir(d);
}

int tool_mpi_open_shard(const char *index, const tartan_options *o, tartan_db **db, char *err,
                        size_t errlen)
{
    char path[PATH_MAX];
    tool_mpi_shard_path(index, tool_mpi_rank, tool_mpi_size, path, sizeof path);
    *db = NULL;
    if ((o->flags & TARTAN_CREATE) && mkdir(index, 0777) != 0 && errno != EEXIST)
        return tool_fail(err, errlen, errno, "%s: %s", index, strerror(errno));
    struct stat st;
    if (!(o->flags & TARTAN_CREATE) && stat(path, &st) != 0) {
        /* Say which job the shards here were built for. */
        int other, divisor;
        if (access(index, F_OK) != 0)
            return tool_fail(err, errlen, errno, "'%s': %s", index, strerror(errno));
        shard_counts(index, &other, &divisor);
        if (other)
            return tool_fail(err, errlen, TARTAN_ENOINDEX,
                             "'%s' holds the shards of %d ranks, not %d: run it with mpirun -np %d",
                             index, other, tool_mpi_size, other);
        return tool_fail(err, errlen, TARTAN_ENOINDEX, "'%s': no shard %d of %d on this host (%s)",
                         index, tool_mpi_rank, tool_mpi_size, path);
    }
    int rc = tartan_open(path, o, db);
    if (rc)
        tool_fail(err, errlen, rc, "%s", tool_mpi_detail(tartan_errmsg(NULL)));
    return rc;
}

int tool_mpi_open_search_shard(const char *index, const tartan_options *o, tartan_db **db,
                               int *n_shards, char *err, size_t errlen)
{
    char path[PATH_MAX];
    struct stat st;
    int other = 0, divisor = 0;
    *n_shards = tool_mpi_size;
    tool_mpi_shard_path(index, tool_mpi_rank, tool_mpi_size, path, sizeof path);
    if (stat(path, &st) != 0)
        shard_counts(index, &other, &divisor);
    if (!divisor) /* one rank a shard, or tool_mpi_open_shard's message for what is here */
        return tool_mpi_open_shard(index, o, db, err, errlen);
    tool_mpi_shard_path(index, tool_mpi_rank % divisor, divisor, path, sizeof path);
    *n_shards = divisor;
    int rc = tartan_open(path, o, db);
    if (rc)
        tool_fail(err, errlen, rc, "%s", tool_mpi_detail(tartan_errmsg(NULL)));
    return rc;
}

int tool_mpi_same_model(tartan_db *db, uint32_t *crc, size_t *len, char *err, size_t errlen)
{
    void *buf = NULL;
    size_t n = 0;
    int rc = tartan_model_export(db, &buf, &n);
    uint64_t mine[3] = {(uint64_t)(rc != 0), 0, n};
    if (!rc)
        memcpy(&mine[1], (char *)buf + n - 4, 4);
    tartan_free(buf);
    uint64_t *all = malloc((size_t)tool_mpi_size * sizeof mine);
    if (!all)
        return tool_fail(err, errlen, ENOMEM, "out of memory");
    MPI_Allgather(mine, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, MPI_COMM_WORLD);
    rc = 0;
    size_t at = 0;
    if (err && errlen)
        err[0] = 0;
    for (int r = 0; r < tool_mpi_size; r++) {
        const char *what =
            all[3 * r] ? "has no model"
            : r > 0 && !all[0] && (all[3 * r + 1] != all[1] || all[3 * r + 2] != all[2])
                ? "has another model than shard 0"
                : NULL;
        if (!what)
            continue;
        rc = TARTAN_EINVAL;
        if (at < errlen)
            at += (size_t)snprintf(err + at, errlen - at, "%sshard %d %s", at ? "; " : "", r, what);
    }
    if (crc)
        *crc = (uint32_t)all[1];
    if (len)
        *len = (size_t)all[2];
    free(all);
    return rc;
}
