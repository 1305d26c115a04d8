/*
 * search_gpus.c: one index searched on several GPUs at once (gpus.h).
 *
 * Why partitions by document number modulo P: MaxSim scores depend only on their document, so
 * each partition's exact top k, merged, is the index's exact top k; numbering modulo P keeps
 * the partitions the same size as documents come and go (new numbers spread over all of
 * them). Each partition's mirror is the one-GPU mirror (search_gpu.c) loaded through a reader
 * that shows only its documents, with its own counts in the reader's header, so the mirror's
 * catching up (appends, deletes, reloads) works unchanged. The counts per partition are kept
 * from search to search: new document numbers are counted as they come, and a full pass over
 * the documents is made only when documents were deleted.
 *
 * PLAID's stages run per partition, each keeping up to ndocs of its own candidates for exact
 * scoring, so the partitions together score more documents exactly than one device would: the
 * merged results keep at least as much of the exhaustive top k in practice (not query by
 * query), and exhaustive search returns exactly one device's results.
 *
 * Copies instead of partitions (split by queries, tartan_gpu_split): every "partition" is the
 * whole index and takes a contiguous share of the call's queries, its hits written straight
 * into the caller's slots. Partitions pay, on every device, the work that does not shrink with
 * the documents: the probe of every centroid for every query token, and the exact scoring a
 * top k needs whatever the partition's size (measured: 2M documents on 2 GPUs, 1.37x one GPU's
 * batched queries/s by documents, 1.92x for exhaustive search; copies 1.59x and 1.97x;
 * bench/RESULTS.md "MPI scaling"). Copies divide all of it, at the price of the index's memory
 * on every device.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "gpus.h"
#include "kernels.h"

/* Attempts at readers of one snapshot for the device threads. */
#define SNAPSHOT_TRIES 8
/* Most partitions: far more than GPUs on a host; a bound on what a variable may ask. */
#define MAX_PARTS 1024

struct eng_gpus {
    int n_parts, n_dev;
    int replicas;            /* each partition is a copy of the whole index (split by queries) */
    eng_gpu **part;          /* [n_parts]; partition p on device p % n_dev */
    uint64_t *docs, *tokens; /* [n_parts] live documents and tokens at the counted snapshot */
    uint32_t snap_next;      /* the counted snapshot: next_docno and n_docs */
    uint64_t snap_docs;
    int counted;
};

/* A positive number from an environment variable: 0 when unset, -1 when malformed. */
static long env_count(const char *name)
{
    const char *e = getenv(name);
    if (!e || !*e)
        return 0;
    char *end;
    long v = strtol(e, &end, 10);
    return *end || v < 1 || v > MAX_PARTS ? -1 : v;
}

/* The split the handle asks for (option, else TARTAN_GPU_SPLIT); -1 for a malformed variable. */
static int split_wanted(const tartan_db *db)
{
    if (db->opts.gpu_split != TARTAN_GPU_SPLIT_AUTO)
        return (int)db->opts.gpu_split;
    const char *e = getenv("TARTAN_GPU_SPLIT");
    if (!e || !*e || !strcmp(e, "auto"))
        return TARTAN_GPU_SPLIT_AUTO;
    if (!strcmp(e, "documents"))
        return TARTAN_GPU_SPLIT_DOCUMENTS;
    if (!strcmp(e, "queries"))
        return TARTAN_GPU_SPLIT_QUERIES;
    return -1;
}

int eng_gpus_plan(const tartan_db *db, const idx_reader *r, int *n_parts, int *n_dev, int *replicas,
                  store_msg *m)
{
    int split = split_wanted(db);
    if (split < 0)
        return store_fail(m, TARTAN_EINVAL,
                          "TARTAN_GPU_SPLIT is '%s'; it must be auto, documents or queries",
                          getenv("TARTAN_GPU_SPLIT"));
    int want = db->opts.gpu_devices;
    if (want == 0) {
        const char *e = getenv("TARTAN_GPU_DEVICES");
        long v = env_count("TARTAN_GPU_DEVICES");
        if (e && !strcmp(e, "all"))
            want = -1;
        else if (v < 0)
            return store_fail(m, TARTAN_EINVAL,
                              "TARTAN_GPU_DEVICES is '%s'; it must be \"all\" or a number of "
                              "GPUs (1 to %d)",
                              e, MAX_PARTS);
        else
            want = v ? (int)v : 1;
    }
    int have = kern_cuda_device_count();
    int nd = want < 0 || want > have ? have : want;
    if (nd < 1)
        nd = 1;
    int np = nd;
    long v = env_count("TARTAN_GPU_PARTITIONS");
    if (v < 0)
        return store_fail(m, TARTAN_EINVAL,
                          "TARTAN_GPU_PARTITIONS is '%s'; it must be a number of partitions "
                          "(1 to %d)",
                          getenv("TARTAN_GPU_PARTITIONS"), MAX_PARTS);
    if (v) {
        np = (int)v;
        if (np < nd)
            nd = np;
    }
    *n_parts = np;
    *n_dev = nd;
    *replicas = split == TARTAN_GPU_SPLIT_QUERIES;
    if (split == TARTAN_GPU_SPLIT_AUTO && np > 1 && r) {
        /* Copies while one takes at most a third of a GPU's memory; once copies, while it
         * takes at most half (no flapping between the two as the index grows and shrinks). */
        size_t fr = 0, tot = 0, need = eng_gpu_resident_bytes(r);
        int copies = db->gpus && db->gpus->replicas && db->gpus->n_parts == np;
        if (kern_cuda_mem_info(&fr, &tot) == 0 && tot > 0)
            *replicas = need <= (copies ? tot / 2 : tot / 3);
    }
    return 0;
}

uint64_t eng_gpus_part_docs(const eng_gpus *g, int p)
{
    return g && p >= 0 && p < g->n_parts ? g->docs[p] : 0;
}

void eng_gpus_describe(const tartan_db *db, tartan_gpu_mode *mode, size_t *device_bytes)
{
    tartan_gpu_mode md = TARTAN_GPU_AUTO;
    size_t total = 0, b;
    if (db->gpu)
        eng_gpu_describe(db->gpu, &md, &total);
    for (int p = 0; db->gpus && p < db->gpus->n_parts; p++)
        if (db->gpus->part[p]) {
            eng_gpu_describe(db->gpus->part[p], &md, &b);
            total += b;
        }
    if (mode)
        *mode = md;
    if (device_bytes)
        *device_bytes = total;
}

/* Frees partition p's mirror on its device; the caller holds the GPU lock. */
static void free_part(eng_gpus *g, int p)
{
    if (!g->part[p])
        return;
    int cur = 0, moved = 0;
    if (g->n_dev > 1 && kern_cuda_get_device(&cur) == 0)
        moved = kern_cuda_set_device(p % g->n_dev) == 0;
    eng_gpu_free_held(g->part[p]);
    g->part[p] = NULL;
    if (moved)
        kern_cuda_set_device(cur);
}

/* eng_gpus_free's work, for a caller that holds the GPU lock: eng_gpus_run remakes the
 * partitions when their number changes, inside a search that holds it. */
static void gpus_free_held(eng_gpus *g)
{
    if (!g)
        return;
    for (int p = 0; p < g->n_parts; p++)
        free_part(g, p);
    free(g->part);
    free(g->docs);
    free(g->tokens);
    free(g);
}

void eng_gpus_free(eng_gpus *g)
{
    if (!g)
        return;
    eng_gpu_lock();
    gpus_free_held(g);
    eng_gpu_unlock();
}

static eng_gpus *gpus_new(int n_parts, int n_dev, int replicas)
{
    eng_gpus *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->n_parts = n_parts;
    g->n_dev = n_dev;
    g->replicas = replicas;
    g->part = calloc((size_t)n_parts, sizeof *g->part);
    g->docs = calloc((size_t)n_parts, sizeof *g->docs);
    g->tokens = calloc((size_t)n_parts, sizeof *g->tokens);
    if (!g->part || !g->docs || !g->tokens) {
        gpus_free_held(g);
        return NULL;
    }
    return g;
}

/* The partitions' live documents and tokens at r's snapshot (see the top of this file). */
static int count_parts(eng_gpus *g, idx_reader *r, store_msg *m)
{
    const store_header *h = &r->h;
    const uint32_t n = (uint32_t)g->n_parts;
    if (g->counted && g->snap_next == h->next_docno && g->snap_docs == h->n_docs)
        return 0;
    int verify = r->verify, rc = 0;
    r->verify = 0; /* counting reads sizes only; the mirrors verify what they load */
    if (g->counted && h->next_docno >= g->snap_next) {
        /* The new numbers only: enough when nothing older was deleted. */
        uint64_t found = 0;
        uint64_t *dd = calloc(n, sizeof *dd), *dt = calloc(n, sizeof *dt);
        if (!dd || !dt)
            rc = store_fail(m, ENOMEM, "GPU search: out of memory");
        for (uint32_t d = g->snap_next; d < h->next_docno && !rc; d++) {
            kern_pdoc pd;
            rc = idx_reader_doc(r, d, &pd, m);
            if (rc == TARTAN_ENOTFOUND) {
                rc = 0;
                continue;
            }
            if (!rc) {
                dd[d % n]++;
                dt[d % n] += pd.ntok;
                found++;
            }
        }
        int enough = !rc && g->snap_docs + found == h->n_docs;
        if (enough)
            for (uint32_t p = 0; p < n; p++) {
                g->docs[p] += dd[p];
                g->tokens[p] += dt[p];
            }
        free(dd);
        free(dt);
        if (rc || enough)
            goto done;
    }
    /* Every document. */
    memset(g->docs, 0, n * sizeof *g->docs);
    memset(g->tokens, 0, n * sizeof *g->tokens);
    store_cursor *cur = NULL;
    uint32_t d;
    kern_pdoc pd;
    while ((rc = idx_reader_next_doc(r, &cur, &d, &pd, m)) == 1) {
        g->docs[d % n]++;
        g->tokens[d % n] += pd.ntok;
    }
    if (rc && cur)
        idx_reader_docs_end(cur);
done:
    r->verify = verify;
    if (rc) {
        g->counted = 0;
        return rc;
    }
    g->counted = 1;
    g->snap_next = h->next_docno;
    g->snap_docs = h->n_docs;
    return 0;
}

/* One partition's search and its own outputs. */
typedef struct part_job {
    eng_gpus *g;
    int p;
    eng_search s;
    eng_queries q;  /* copies: this copy's share of the queries (its own offsets, the caller's
                       embeddings) */
    uint32_t *list; /* the subset's documents in this partition (s.allowed_list), owned */
    eng_stage_stats st;
    store_msg m;
    int rc;
} part_job;

/* One device's partitions, run in turn by one thread over reader r. */
typedef struct dev_job {
    int dev, set_device;
    part_job *jobs; /* all of them: this device takes p = dev, dev + n_dev, ... */
    idx_reader *r;
    eng_part_search_fn fn;
    int exhaustive;
    tartan_gpu_mode mode;
} dev_job;

static void *dev_main(void *arg)
{
    dev_job *d = arg;
    eng_gpus *g = d->jobs[0].g;
    int krc = d->set_device ? kern_cuda_set_device(d->dev) : 0;
    for (int p = d->dev; p < g->n_parts; p += g->n_dev) {
        part_job *j = &d->jobs[p];
        if (krc) {
            j->rc = store_fail(&j->m, TARTAN_EDEVICE, "GPU search: device %d: %s", d->dev,
                               kern_last_error());
            break;
        }
        idx_reader rp = *d->r;
        if (g->replicas) {
            if (j->s.q->n == 0)
                continue; /* more copies than queries */
        } else {
            if (g->docs[p] == 0 || (j->s.allowed && j->s.n_allowed == 0))
                continue; /* no documents, or none allowed: no hits (hit_n is zero) */
            /* The partition's view: its documents, its counts. */
            rp.part_n = (uint32_t)g->n_parts;
            rp.part_i = (uint32_t)p;
            rp.h.n_docs = g->docs[p];
            rp.h.n_tokens = g->tokens[p];
        }
        j->rc = d->fn(&g->part[p], &rp, &j->s, d->exhaustive, d->mode, &j->st, &j->m);
        if (j->rc)
            break;
    }
    return NULL;
}

static int same_snapshot(const idx_reader *a, const idx_reader *b)
{
    return a->h.next_docno == b->h.next_docno && a->h.n_docs == b->h.n_docs &&
           a->h.n_centroids == b->h.n_centroids;
}

/* Readers rd[1 .. n - 1] at rd[0]'s snapshot; 1 when they all are, else 0 (none left open). */
static int open_readers(store_env *env, idx_reader *rd, int n)
{
    for (int t = 0; t < SNAPSHOT_TRIES; t++) {
        int i = 1;
        for (; i < n; i++) {
            store_msg scratch;
            if (idx_reader_open(env, &rd[i], &scratch))
                break;
            if (!same_snapshot(&rd[0], &rd[i])) {
                idx_reader_close(&rd[i]);
                break;
            }
        }
        if (i == n)
            return 1;
        for (int k = 1; k < i; k++)
            idx_reader_close(&rd[k]);
    }
    return 0;
}

typedef struct hit {
    float score;
    uint32_t doc;
} hit;

/* Score descending, then the lower document number (one device's order). */
static int by_score(const void *a, const void *b)
{
    const hit *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return (x->doc > y->doc) - (x->doc < y->doc);
}

/* Copy p's share of s's queries into job j: its queries, their own offsets from 0, and its
 * results straight in the caller's slots. */
static int share_queries(part_job *j, const eng_search *s, int p, int n_parts)
{
    const eng_queries *q = s->q;
    size_t lo = q->n * (size_t)p / (size_t)n_parts, hi = q->n * (size_t)(p + 1) / (size_t)n_parts;
    j->q.n = hi - lo;
    j->q.dim = q->dim;
    j->q.off = malloc((hi - lo + 1) * sizeof *j->q.off);
    if (!j->q.off)
        return ENOMEM;
    j->q.max_len = 0;
    for (size_t i = 0; i <= hi - lo; i++) {
        j->q.off[i] = q->off[lo + i] - q->off[lo];
        if (i && j->q.off[i] - j->q.off[i - 1] > j->q.max_len)
            j->q.max_len = j->q.off[i] - j->q.off[i - 1];
    }
    j->q.emb = q->emb + q->off[lo] * q->dim;
    j->s.q = &j->q;
    j->s.hit_doc = s->hit_doc + lo * s->k;
    j->s.hit_score = s->hit_score + lo * s->k;
    j->s.hit_n = s->hit_n + lo;
    for (size_t i = lo; i < hi; i++)
        s->hit_n[i] = 0;
    return 0;
}

int eng_gpus_run(eng_gpus **gp, store_env *env, idx_reader *r, const eng_search *s, int exhaustive,
                 tartan_gpu_mode mode, int n_parts, int n_dev, int replicas, eng_part_search_fn fn,
                 eng_stage_stats *st, store_msg *m)
{
    if (n_parts < 1 || n_dev < 1 || n_dev > n_parts)
        return store_fail(m, TARTAN_EINVAL, "GPU search: %d partitions over %d devices", n_parts,
                          n_dev);
    replicas = replicas != 0;
    if (*gp &&
        ((*gp)->n_parts != n_parts || (*gp)->n_dev != n_dev || (*gp)->replicas != replicas)) {
        gpus_free_held(*gp);
        *gp = NULL;
    }
    if (!*gp && !(*gp = gpus_new(n_parts, n_dev, replicas)))
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    eng_gpus *g = *gp;
    double t0 = eng_now();
    int rc = replicas ? 0 : count_parts(g, r, m);
    st->cand += eng_now() - t0;
    if (rc)
        return rc;
    const size_t nq = s->q->n, k = s->k;
    part_job *jobs = calloc((size_t)n_parts, sizeof *jobs);
    idx_reader *rd = calloc((size_t)n_dev, sizeof *rd);
    dev_job *devs = calloc((size_t)n_dev, sizeof *devs);
    pthread_t *tid = calloc((size_t)n_dev, sizeof *tid);
    char *started = calloc((size_t)n_dev, 1);
    hit *merge = malloc((size_t)n_parts * (k ? k : 1) * sizeof *merge);
    if (!jobs || !rd || !devs || !tid || !started || !merge) {
        rc = store_fail(m, ENOMEM, "GPU search: out of memory");
        goto done;
    }
    for (int p = 0; p < n_parts && !rc; p++) {
        part_job *j = &jobs[p];
        j->g = g;
        j->p = p;
        j->s = *s;
        if (replicas) {
            if (share_queries(j, s, p, n_parts))
                rc = store_fail(m, ENOMEM, "GPU search: out of memory");
            continue;
        }
        j->s.hit_doc = malloc(nq * k * sizeof *j->s.hit_doc);
        j->s.hit_score = malloc(nq * k * sizeof *j->s.hit_score);
        j->s.hit_n = calloc(nq, sizeof *j->s.hit_n);
        if (!j->s.hit_doc || !j->s.hit_score || !j->s.hit_n)
            rc = store_fail(m, ENOMEM, "GPU search: out of memory for %zu x %zu hits", nq, k);
        if (!rc && s->allowed_list) {
            /* The subset's documents of this partition only (its mirror has no others). */
            size_t n = 0;
            j->list = malloc((s->n_allowed ? s->n_allowed : 1) * sizeof *j->list);
            if (!j->list) {
                rc = store_fail(m, ENOMEM, "GPU search: out of memory");
                break;
            }
            for (size_t i = 0; i < s->n_allowed; i++)
                if (s->allowed_list[i] % (uint32_t)n_parts == (uint32_t)p)
                    j->list[n++] = s->allowed_list[i];
            j->s.allowed_list = j->list;
            j->s.n_allowed = n;
        }
    }
    if (rc)
        goto done;
    /* One thread per device, each with a reader of the same snapshot; with one device, or
     * when a writer keeps committing, the calling thread takes the devices in turn. */
    rd[0] = *r;
    int parallel = n_dev > 1 && open_readers(env, rd, n_dev);
    int cur_dev = 0, restore = 0;
    if (n_dev > 1)
        restore = kern_cuda_get_device(&cur_dev) == 0;
    for (int d = 0; d < n_dev; d++) {
        devs[d] = (dev_job){.dev = d,
                            .set_device = n_dev > 1,
                            .jobs = jobs,
                            .r = parallel ? &rd[d] : r,
                            .fn = fn,
                            .exhaustive = exhaustive,
                            .mode = mode};
        if (parallel && d > 0 && pthread_create(&tid[d], NULL, dev_main, &devs[d]) == 0)
            started[d] = 1;
    }
    for (int d = 0; d < n_dev; d++)
        if (!started[d])
            dev_main(&devs[d]);
    for (int d = 1; d < n_dev; d++)
        if (started[d])
            pthread_join(tid[d], NULL);
    if (restore)
        kern_cuda_set_device(cur_dev);
    for (int d = 1; parallel && d < n_dev; d++)
        idx_reader_close(&rd[d]);
    for (int p = 0; p < n_parts; p++) {
        st->cand += jobs[p].st.cand;
        st->prune += jobs[p].st.prune;
        st->exact += jobs[p].st.exact;
        st->n_cand += jobs[p].st.n_cand;
        st->n_exact += jobs[p].st.n_exact;
        /* Every partition probes the same centroids for the same queries. */
        if (jobs[p].st.n_probes > st->n_probes)
            st->n_probes = jobs[p].st.n_probes;
        if (jobs[p].rc && !rc) {
            rc = jobs[p].rc;
            *m = jobs[p].m;
        }
    }
    if (rc || replicas)
        goto done; /* copies wrote their queries' hits in place */
    /* The partitions' top k merged, query by query. */
    for (size_t i = 0; i < nq; i++) {
        size_t n = 0;
        for (int p = 0; p < n_parts; p++)
            for (size_t j = 0; j < jobs[p].s.hit_n[i]; j++) {
                merge[n].score = jobs[p].s.hit_score[i * k + j];
                merge[n].doc = jobs[p].s.hit_doc[i * k + j];
                n++;
            }
        qsort(merge, n, sizeof *merge, by_score);
        size_t take = n < k ? n : k;
        for (size_t j = 0; j < take; j++) {
            s->hit_doc[i * k + j] = merge[j].doc;
            s->hit_score[i * k + j] = merge[j].score;
        }
        s->hit_n[i] = take;
    }
done:
    for (int p = 0; jobs && p < n_parts; p++) {
        if (!replicas) {
            free(jobs[p].s.hit_doc);
            free(jobs[p].s.hit_score);
            free(jobs[p].s.hit_n);
        }
        free(jobs[p].q.off);
        free(jobs[p].list);
    }
    free(jobs);
    free(rd);
    free(devs);
    free(tid);
    free(started);
    free(merge);
    return rc;
}

int eng_gpus_search(tartan_db *db, idx_reader *r, const eng_search *s, int exhaustive,
                    tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m)
{
    int np = 1, nd = 1, replicas = 0;
    /* The plan reads what db->gpus holds: under the lock that guards it. */
    eng_gpu_lock();
    int rc = eng_gpus_plan(db, r, &np, &nd, &replicas, m);
    if (!rc && np > 1)
        rc = eng_gpus_run(&db->gpus, db->env, r, s, exhaustive, mode, np, nd, replicas,
                          eng_gpu_search_held, st, m);
    eng_gpu_unlock();
    if (!rc && np == 1)
        rc = eng_gpu_search(&db->gpu, r, s, exhaustive, mode, st, m);
    return rc;
}
