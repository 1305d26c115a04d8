/*
 * db.c: opening, closing and describing an index (tartan_open, tartan_close, tartan_info),
 * and the per-thread detailed messages of tartan_errmsg.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "probe.h"
#include "gpu.h"
#include "gpus.h"
#include "model.h"
#include "plan.h"

/* Each thread keeps its last message per kind: one for calls on handles (tagged with the
 * handle's serial, so that a message is never shown for another handle), one for calls with
 * no handle (tartan_open's failures). Per thread, so that threads sharing a handle never read
 * each other's half-written text. */
typedef struct msg_slot {
    uint64_t serial;
    char text[640];
} msg_slot;
static _Thread_local msg_slot slot_handle, slot_none;
static atomic_uint_fast64_t next_serial = 1;

static int record(const tartan_db *db, int code, const char *detail)
{
    msg_slot *s = db ? &slot_handle : &slot_none;
    s->serial = db ? db->serial : 0;
    const char *name = tartan_err_name(code);
    if (detail && detail[0])
        snprintf(s->text, sizeof s->text, "%s: %s", name ? name : "error", detail);
    else
        snprintf(s->text, sizeof s->text, "%s", tartan_strerror(code));
    return code;
}

int eng_fail(const tartan_db *db, int code, const store_msg *m)
{
    return record(db, code, m ? m->text : NULL);
}

int eng_failf(const tartan_db *db, int code, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return record(db, code, buf);
}

const char *tartan_errmsg(const tartan_db *db)
{
    if (!db)
        return slot_none.text[0] ? slot_none.text : "TARTAN_OK: no error";
    if (slot_handle.serial == db->serial && slot_handle.text[0])
        return slot_handle.text;
    return "TARTAN_OK: no error";
}

void tartan_options_init(tartan_options *o)
{
    memset(o, 0, sizeof *o);
    o->nbits = 2;
    o->kmeans_iters = 4;
    o->seed = 42;
}

static int check_options(const tartan_options *o, store_msg *m)
{
    if (o->flags & ~(uint32_t)(TARTAN_CREATE | TARTAN_EXCL | TARTAN_READONLY | TARTAN_UPGRADE))
        return store_fail(m, TARTAN_EINVAL, "unknown flags 0x%x", (unsigned)o->flags);
    if ((unsigned)o->device > TARTAN_DEVICE_CUDA)
        return store_fail(m, TARTAN_EINVAL, "device is %d; it must be a tartan_device",
                          (int)o->device);
    if ((unsigned)o->gpu_mode > TARTAN_GPU_STREAMING)
        return store_fail(m, TARTAN_EINVAL, "gpu_mode is %d; it must be a tartan_gpu_mode",
                          (int)o->gpu_mode);
    if ((unsigned)o->gpu_split > TARTAN_GPU_SPLIT_QUERIES)
        return store_fail(m, TARTAN_EINVAL, "gpu_split is %d; it must be a tartan_gpu_split",
                          (int)o->gpu_split);
    if (o->gpu_devices < -1)
        return store_fail(m, TARTAN_EINVAL, "gpu_devices is %d; it must be -1, 0 or more",
                          o->gpu_devices);
    if (o->kmeans_iters < 1)
        return store_fail(m, TARTAN_EINVAL, "kmeans_iters is %d; it must be at least 1",
                          o->kmeans_iters);
    if (o->codec > TARTAN_CODEC_AUTO)
        return store_fail(m, TARTAN_EINVAL, "codec is %u; it must be a TARTAN_CODEC_ value",
                          o->codec);
    if (o->dim > (1u << 16))
        return store_fail(m, TARTAN_EINVAL, "dim %zu is above the largest supported, 65536",
                          o->dim);
    if (o->n_centroids > ((size_t)1 << 31))
        return store_fail(m, TARTAN_EINVAL, "n_centroids %zu is too many", o->n_centroids);
    if (o->sample_docs > UINT32_MAX)
        return store_fail(m, TARTAN_EINVAL, "sample_docs %zu is too many", o->sample_docs);
    if ((o->flags & TARTAN_CREATE) && !(o->flags & TARTAN_READONLY)) {
        if (o->dim == 0)
            return store_fail(m, TARTAN_EINVAL, "creating an index needs options.dim");
        if (o->nbits != 1 && o->nbits != 2 && o->nbits != 4 && o->nbits != 8)
            return store_fail(m, TARTAN_EINVAL, "nbits is %u; it must be 1, 2, 4 or 8", o->nbits);
        if ((o->dim * o->nbits) % 8 != 0)
            return store_fail(m, TARTAN_EINVAL,
                              "dim %zu times nbits %u is not a multiple of 8 bits", o->dim,
                              o->nbits);
    }
    return 0;
}

int tartan_open(const char *path, const tartan_options *options, tartan_db **out)
{
    store_msg m = {{0}};
    if (!out)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_open: db is NULL");
    *out = NULL;
    if (!path || !path[0])
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_open: path is %s", path ? "empty" : "NULL");
    tartan_options o;
    if (options)
        o = *options;
    else
        tartan_options_init(&o);
    int rc = check_options(&o, &m);
    if (rc)
        return eng_fail(NULL, rc, &m);
    tartan_db *db = calloc(1, sizeof *db);
    if (!db)
        return eng_failf(NULL, ENOMEM, "out of memory");
    db->opts = o;
    db->serial = atomic_fetch_add(&next_serial, 1);
    pthread_mutex_init(&db->write_lock, NULL);
    pthread_mutex_init(&db->probe_lock, NULL);
    unsigned sf = 0;
    if (o.flags & TARTAN_CREATE)
        sf |= STORE_CREATE;
    if (o.flags & TARTAN_EXCL)
        sf |= STORE_EXCL;
    if (o.flags & TARTAN_READONLY)
        sf |= STORE_READONLY;
    store_header init = {0};
    init.dim = (uint32_t)o.dim;
    init.nbits = o.nbits;
    init.seed = o.seed;
    init.kmeans_iters = (uint32_t)o.kmeans_iters;
    init.sample_docs = (uint32_t)o.sample_docs;
    /* An older format version opens only to be converted (TARTAN_UPGRADE). */
    if ((o.flags & TARTAN_UPGRADE) && !(o.flags & TARTAN_READONLY))
        sf |= STORE_OPEN_V1;
    rc = store_open(path, sf, &init, o.map_size, &db->env, &m);
    if (rc)
        goto fail;
    if (store_version(db->env) == 1) {
        store_compact_stats cs;
        if ((rc = store_compact(db->env, &cs, &m)))
            goto fail;
    }
    if (o.dim) {
        store_txn *txn;
        store_header h;
        if ((rc = store_read_begin(db->env, &txn, &m)))
            goto fail;
        rc = store_header_get(txn, &h, &m);
        store_read_end(db->env, txn);
        if (rc)
            goto fail;
        if (h.dim != o.dim) {
            rc = store_fail(&m, TARTAN_EDIM, "'%s' has dimension %u, options.dim is %zu", path,
                            h.dim, o.dim);
            goto fail;
        }
    }
    *out = db;
    return 0;
fail:
    tartan_close(db);
    return eng_fail(NULL, rc, &m);
}

void tartan_close(tartan_db *db)
{
    if (!db)
        return;
    eng_gpu_free(db->gpu);
    eng_gpus_free(db->gpus);
    store_close(db->env);
    pthread_mutex_destroy(&db->write_lock);
    eng_probe_free(db->probe);
    pthread_mutex_destroy(&db->probe_lock);
    free(db);
}

size_t tartan_sample_docs(const tartan_db *db, size_t n_docs)
{
    return idx_sample_docs(n_docs, db ? db->opts.sample_docs : 0);
}

int tartan_info(tartan_db *db, tartan_index_info *info)
{
    if (!db || !info)
        return eng_failf(db, TARTAN_EINVAL, "tartan_info: %s is NULL", db ? "info" : "db");
    store_msg m = {{0}};
    store_txn *txn;
    int rc = store_read_begin(db->env, &txn, &m);
    if (rc)
        return eng_fail(db, rc, &m);
    store_header h;
    store_usage u;
    unsigned format = 0, codec = TARTAN_CODEC_SCALAR, axes[4] = {0, 0, 0, 0};
    if (!(rc = store_header_get(txn, &h, &m)) && !(rc = store_usage_get(db->env, txn, &u, &m)))
        rc = store_format_version(txn, &format, &m);
    if (!rc) {
        /* The code's counts from the head of its record (left 0 where it is too short). */
        const void *d;
        size_t len;
        store_msg am = {{0}};
        int arc = store_meta_get(txn, IDX_META_AXES, &d, &len, &am);
        if (arc != TARTAN_ENOTFOUND)
            codec = TARTAN_CODEC_AXES;
        if (arc == 0)
            (void)idx_axes_counts(d, len, axes);
    }
    store_read_end(db->env, txn);
    if (rc)
        return eng_fail(db, rc, &m);
    memset(info, 0, sizeof *info);
    info->format = format;
    info->codec = codec;
    memcpy(info->axes_bits, axes, sizeof axes);
    info->n_docs = h.n_docs;
    info->n_tokens = h.n_tokens;
    info->dim = h.dim;
    info->nbits = h.nbits;
    info->n_centroids = h.n_centroids;
    info->code_bytes = h.code_bytes;
    info->bytes_residuals = h.n_tokens * h.token_bytes;
    info->bytes_codes = h.n_tokens * h.code_bytes;
    info->bytes_norms = h.n_tokens * 4;
    info->bytes_docs = u.docs;
    info->bytes_ivf = u.ivf;
    info->ivf_entries = h.n_postings;
    info->bytes_ids = u.ids + u.names;
    info->bytes_centroids = u.centroids;
    info->bytes_meta = u.meta;
    info->bytes_free = u.free;
    info->bytes_file = u.file;
    info->map_size = store_map_size(db->env);
    return 0;
}
