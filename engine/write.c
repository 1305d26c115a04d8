/*
 * write.c: the public changes: tartan_add, tartan_train, tartan_delete. Each checks its
 * arguments, then hands the index layer one transaction's worth of work.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "db.h"
#include "device.h"
#include "gpu.h"
#include "group.h"

static void to_input(const tartan_batch *b, idx_input *in)
{
    in->n_docs = b->n_docs;
    in->ids = b->ids;
    in->doclens = b->doclens;
    in->embeddings = b->embeddings;
    in->n_rows = b->n_rows;
    in->dim = b->dim;
    in->dtype = (int)b->dtype;
}

/* The handle's training options, and the device that k-means and encoding run on (the
 * handle's tartan_options.device, resolved: TARTAN_ENODEV when CUDA is asked for and absent). */
static int train_opts(const tartan_db *db, idx_train_opts *o, store_msg *m)
{
    o->n_centroids = db->opts.n_centroids;
    o->sample_docs = db->opts.sample_docs;
    o->kmeans_iters = db->opts.kmeans_iters;
    o->seed = db->opts.seed;
    o->codec = db->opts.codec;
    return eng_device_pick(db->opts.device, &o->device, m);
}

/* The index's dimension, from a short snapshot. */
static int index_dim(tartan_db *db, size_t *dim, store_msg *m)
{
    store_txn *txn;
    store_header h;
    int rc = store_read_begin(db->env, &txn, m);
    if (rc)
        return rc;
    rc = store_header_get(txn, &h, m);
    store_read_end(db->env, txn);
    *dim = h.dim;
    return rc;
}

/* Shared by add and train: arguments, then the batch, then the index. */
static int prepare(tartan_db *db, const tartan_batch *batch, int need_ids, idx_batch *b,
                   store_msg *m)
{
    if (!batch)
        return store_fail(m, TARTAN_EINVAL, "batch is NULL");
    if (need_ids && !batch->ids)
        return store_fail(m, TARTAN_EINVAL, "batch ids is NULL");
    if (store_is_readonly(db->env))
        return store_fail(m, TARTAN_EREADONLY, "'%s' is open read-only", store_path(db->env));
    size_t dim;
    int rc = index_dim(db, &dim, m);
    if (rc)
        return rc;
    idx_input in;
    to_input(batch, &in);
    return idx_batch_prepare(&in, dim, b, m);
}

int tartan_add(tartan_db *db, const tartan_batch *batch, unsigned flags)
{
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_add: db is NULL");
    if (flags & ~TARTAN_REPLACE)
        return eng_failf(db, TARTAN_EINVAL, "tartan_add: unknown flags 0x%x", flags);
    store_msg m = {{0}};
    idx_batch b;
    const double t0 = idx_now();
    int rc = prepare(db, batch, 1, &b, &m);
    if (rc)
        return eng_fail(db, rc, &m);
    if (idx_trace())
        fprintf(stderr, "adding: %zu documents converted and normalised in %.3f s\n", b.n_docs,
                idx_now() - t0);
    idx_train_opts o;
    if ((rc = train_opts(db, &o, &m))) {
        idx_batch_free(&b);
        return eng_fail(db, rc, &m);
    }
    pthread_mutex_lock(&db->write_lock);
    /* GPU work of the whole process goes one call at a time (gpu.h): a GPU search waits for
     * this add's k-means and encoding, and the other way round. */
    if (o.device == KERN_DEV_CUDA)
        eng_gpu_lock();
    rc = idx_add(db->env, &b, (flags & TARTAN_REPLACE) != 0, &o, &m);
    if (o.device == KERN_DEV_CUDA)
        eng_gpu_unlock();
    pthread_mutex_unlock(&db->write_lock);
    idx_batch_free(&b);
    return rc ? eng_fail(db, rc, &m) : 0;
}

/*
 * A training on the GPU starts the GPU's context on a thread of its own while the sample is
 * converted and normalised on the CPU: that first GPU call took 0.10-0.14 s of a build's
 * training on the H200 hosts, serial before k-means. The thread makes the calling thread's
 * current device current first (a new thread's would be device 0), and is joined before the
 * training uses the GPU; whatever it meets (no GPU after all) the training meets again and
 * reports.
 */
typedef struct gpu_warm {
    pthread_t thread;
    int dev, on;
} gpu_warm;

static void *gpu_warm_run(void *arg)
{
    const gpu_warm *w = arg;
    size_t free_b, total_b;
    if (kern_cuda_set_device(w->dev) == 0)
        (void)kern_cuda_mem_info(&free_b, &total_b);
    return NULL;
}

static void gpu_warm_start(gpu_warm *w, kern_dev dev)
{
    w->on = 0;
    if (dev == KERN_DEV_CUDA && kern_cuda_get_device(&w->dev) == 0)
        w->on = pthread_create(&w->thread, NULL, gpu_warm_run, w) == 0;
}

static void gpu_warm_join(gpu_warm *w)
{
    if (w->on)
        pthread_join(w->thread, NULL);
    w->on = 0;
}

int tartan_train(tartan_db *db, const tartan_batch *sample, size_t corpus_tokens)
{
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_train: db is NULL");
    store_msg m = {{0}}, mo = {{0}};
    idx_batch b;
    idx_train_opts o;
    const int orc = train_opts(db, &o, &mo);
    gpu_warm w;
    gpu_warm_start(&w, orc ? KERN_DEV_CPU : o.device);
    const double t0 = idx_now();
    int rc = prepare(db, sample, 0, &b, &m);
    if (rc) {
        gpu_warm_join(&w);
        return eng_fail(db, rc, &m);
    }
    if (idx_trace())
        fprintf(stderr, "training: the sample (%zu tokens) converted and normalised in %.3f s\n",
                b.n_rows, idx_now() - t0);
    gpu_warm_join(&w);
    if (orc) {
        idx_batch_free(&b);
        return eng_fail(db, orc, &mo);
    }
    pthread_mutex_lock(&db->write_lock);
    if (o.device == KERN_DEV_CUDA)
        eng_gpu_lock();
    rc = idx_train(db->env, &b, corpus_tokens, &o, &m);
    if (o.device == KERN_DEV_CUDA)
        eng_gpu_unlock();
    pthread_mutex_unlock(&db->write_lock);
    idx_batch_free(&b);
    return rc ? eng_fail(db, rc, &m) : 0;
}

_Static_assert(TARTAN_GROUP_MAX == IDX_GROUP_MAX, "the public and internal group limits");

int tartan_train_shared(tartan_db *db, const tartan_batch *sample, size_t corpus_tokens,
                        const tartan_train_group *group, tartan_train_stats *stats)
{
    double t0 = idx_now();
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_train_shared: db is NULL");
    if (!group || group->size < 1 || group->size > TARTAN_GROUP_MAX || group->rank < 0 ||
        group->rank >= group->size || !group->sum || !group->broadcast || !group->gather)
        return eng_failf(db, TARTAN_EINVAL,
                         "tartan_train_shared: a malformed group (NULL, a NULL callback, or "
                         "rank %d of %d members, at most %d)",
                         group ? group->rank : -1, group ? group->size : 0, TARTAN_GROUP_MAX);
    /* The group's state lives on this stack (about 16 KB): nothing to allocate before the
     * first exchange, where a member without memory could not take part. */
    idx_group g;
    memset(&g, 0, sizeof g);
    g.rank = group->rank;
    g.size = group->size;
    g.ctx = group->ctx;
    g.sum = group->sum;
    g.bcast = group->broadcast;
    g.gather = group->gather;
    g.failed_rank = -1;
    store_msg m = {{0}};
    idx_batch b;
    memset(&b, 0, sizeof b);
    int have = sample && sample->n_docs > 0, rc = 0;
    idx_train_opts o;
    memset(&o, 0, sizeof o);
    store_msg mo = {{0}};
    const int orc = train_opts(db, &o, &mo);
    gpu_warm w;
    gpu_warm_start(&w, orc ? KERN_DEV_CPU : o.device);
    /* Every failure from here on still takes part in the group's exchanges (idx_train_group
     * carries it to the others). */
    if (have) {
        rc = prepare(db, sample, 0, &b, &m);
        if (rc)
            memset(&b, 0, sizeof b);
    } else if (sample && sample->n_rows) {
        rc =
            store_fail(&m, TARTAN_EINVAL, "a sample of no documents with %zu rows", sample->n_rows);
    }
    gpu_warm_join(&w);
    if (!rc && orc) {
        rc = orc;
        m = mo;
    }
    idx_train_times times = {0, 0, 0};
    pthread_mutex_lock(&db->write_lock);
    if (o.device == KERN_DEV_CUDA)
        eng_gpu_lock();
    rc = idx_train_group(db->env, &b, corpus_tokens, &o, rc, &g, &times, &m);
    if (o.device == KERN_DEV_CUDA)
        eng_gpu_unlock();
    pthread_mutex_unlock(&db->write_lock);
    if (have)
        idx_batch_free(&b);
    if (stats) {
        stats->seconds_kmeans = times.kmeans;
        stats->seconds_codec = times.codec;
        stats->seconds_group = g.seconds;
        stats->seconds_total = idx_now() - t0;
        stats->seconds_store = times.store;
    }
    if (rc == TARTAN_EGROUP && g.failed_rank >= 0) {
        const char *name = tartan_err_name(g.failed_code);
        snprintf(m.text, sizeof m.text, "rank %d of %d failed with %s (its own message says why)",
                 g.failed_rank, g.size, name ? name : "an unknown code");
    }
    return rc ? eng_fail(db, rc, &m) : 0;
}

int tartan_delete(tartan_db *db, const char *const *ids, size_t n, size_t *n_deleted)
{
    if (n_deleted)
        *n_deleted = 0;
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_delete: db is NULL");
    store_msg m = {{0}};
    pthread_mutex_lock(&db->write_lock);
    int rc = idx_delete(db->env, ids, n, n_deleted, &m);
    pthread_mutex_unlock(&db->write_lock);
    return rc ? eng_fail(db, rc, &m) : 0;
}
