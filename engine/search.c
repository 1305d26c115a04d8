/*
 * search.c: tartan_search: checks a call, takes its snapshot, runs PLAID per query
 * (search_plaid.c) or the exhaustive scan (search_exact.c), and hands back the results with
 * external ids in one allocation.
 *
 * Snapshot. An LMDB read transaction may be used by one thread at a time, so each thread that
 * searches gets its own reader. All readers of one call must see the same index: they are
 * opened one after another and compared by the header's (next_docno, n_docs, n_centroids),
 * which identify a committed state (document numbers only grow, every add hands out new ones,
 * and between two adds each delete lowers n_docs); if a writer committed in between, they are
 * all reopened. Reading never waits for a writer (LMDB's MVCC), so neither does a search.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "calibrate.h"
#include "db.h"
#include "device.h"
#include "gpu.h"
#include "gpus.h"
#include "search.h"
#include "probe.h"

/* Readers one call opens at most: LMDB has 126 reader slots per environment by default, to be
 * shared with the application's other searches and processes. */
#define MAX_READERS 32

/* Attempts at a consistent set of readers before falling back to one thread. */
#define SNAPSHOT_TRIES 8

void tartan_search_params_init(tartan_search_params *p, size_t k)
{
    memset(p, 0, sizeof *p);
    p->k = k;
    /* Adaptive probing and exact scoring (tartan.h, engine/SEARCH.md); no pruning: scores
     * are cosines, never below -1. */
    p->centroid_score_threshold = -1.f;
}

void tartan_results_free(tartan_results *r)
{
    free(r);
}

static int check_params(const tartan_search_params *p, store_msg *m)
{
    if (p->k == 0 || p->k > TARTAN_MAX_K)
        return store_fail(m, TARTAN_ERANGE, "k is %zu; it must be 1 to %zu", p->k, TARTAN_MAX_K);
    if (!p->exhaustive && !isfinite(p->centroid_score_threshold))
        return store_fail(m, TARTAN_ERANGE, "centroid_score_threshold is not finite");
    if (!(p->recall_target >= 0.f && p->recall_target < 1.f))
        return store_fail(m, TARTAN_ERANGE,
                          "recall_target is %g; it must be above 0 and below 1 (0: the default)",
                          (double)p->recall_target);
    if ((unsigned)p->device > TARTAN_DEVICE_CUDA)
        return store_fail(m, TARTAN_EINVAL, "device is %d; it must be a tartan_device",
                          (int)p->device);
    if (p->threads < 0)
        return store_fail(m, TARTAN_ERANGE, "threads is %d; it must be 0 or more", p->threads);
    if (!p->subset && p->n_subset)
        return store_fail(m, TARTAN_EINVAL, "subset is NULL but n_subset is %zu", p->n_subset);
    for (size_t i = 0; i < p->n_subset; i++) {
        size_t len;
        if (!p->subset[i])
            return store_fail(m, TARTAN_EBADID, "subset id %zu is NULL", i);
        if (idx_id_check(p->subset[i], &len))
            return store_fail(m, TARTAN_EBADID,
                              "subset id %zu is empty, longer than %u bytes or has a control "
                              "character",
                              i, STORE_MAX_ID);
    }
    return 0;
}

/* Same committed state (see the top of this file). */
static int same_snapshot(const idx_reader *a, const idx_reader *b)
{
    return a->h.next_docno == b->h.next_docno && a->h.n_docs == b->h.n_docs &&
           a->h.n_centroids == b->h.n_centroids;
}

/* Opens readers r[1 .. want - 1] on r[0]'s state; returns how many readers there are then
 * (at least 1: with fewer slots, or a writer committing each time, fewer threads search). */
static int open_more(store_env *env, idx_reader *r, int want)
{
    for (int attempt = 0; attempt < SNAPSHOT_TRIES; attempt++) {
        int n = 1;
        for (; n < want; n++) {
            store_msg scratch;
            if (idx_reader_open(env, &r[n], &scratch))
                break; /* no slot left: search with the readers there are */
            if (!same_snapshot(&r[0], &r[n])) {
                idx_reader_close(&r[n]);
                break;
            }
        }
        if (n == want || attempt == SNAPSHOT_TRIES - 1)
            return n;
        for (int i = 1; i < n; i++)
            idx_reader_close(&r[i]);
    }
    return 1;
}

/* The subset's live documents: a bitmap over document numbers and their sorted list. */
static int resolve_subset(const idx_reader *r, const tartan_search_params *p, uint64_t **bits,
                          uint32_t **list, size_t *n_out, store_msg *m)
{
    size_t words = ((size_t)r->h.next_docno + 63) / 64;
    *bits = calloc(words ? words : 1, sizeof **bits);
    *list = NULL;
    *n_out = 0;
    if (!*bits)
        return store_fail(m, ENOMEM, "search: out of memory for the subset");
    size_t n = 0;
    for (size_t i = 0; i < p->n_subset; i++) {
        uint32_t d;
        int rc = idx_reader_docno(r, p->subset[i], &d, m);
        if (rc == TARTAN_ENOTFOUND)
            continue;
        if (rc)
            return rc;
        if (d >= r->h.next_docno)
            return store_fail(m, TARTAN_ECORRUPT, "id '%s' maps to document %u, never handed out",
                              p->subset[i], d);
        if (!((*bits)[d >> 6] >> (d & 63) & 1)) {
            (*bits)[d >> 6] |= (uint64_t)1 << (d & 63);
            n++;
        }
    }
    *list = malloc((n ? n : 1) * sizeof **list);
    if (!*list)
        return store_fail(m, ENOMEM, "search: out of memory for the subset");
    size_t j = 0;
    for (size_t w = 0; w < words; w++)
        for (uint64_t x = (*bits)[w]; x; x &= x - 1)
            (*list)[j++] = (uint32_t)(w * 64 + (unsigned)__builtin_ctzll(x));
    *n_out = n;
    return 0;
}

/* A subset given by document numbers (eng_docset) as resolve_subset's bitmap and list; where
 * r's snapshot is not the one the numbers came from, only those still live. */
static int resolve_docset(const idx_reader *r, const eng_docset *ds, uint64_t **bits,
                          uint32_t **list, size_t *n_out, store_msg *m)
{
    size_t words = ((size_t)r->h.next_docno + 63) / 64;
    *bits = calloc(words ? words : 1, sizeof **bits);
    *list = malloc((ds->n ? ds->n : 1) * sizeof **list);
    *n_out = 0;
    if (!*bits || !*list)
        return store_fail(m, ENOMEM, "search: out of memory for the subset");
    const int same = r->h.next_docno == ds->next_docno && r->h.n_docs == ds->n_docs;
    size_t n = 0;
    for (size_t i = 0; i < ds->n; i++) {
        uint32_t d = ds->docs[i];
        if (d >= r->h.next_docno || (n && d <= (*list)[n - 1]))
            return store_fail(m, TARTAN_EINTERNAL,
                              "search: a subset of document numbers out of "
                              "order or past the index's");
        if (!same) {
            kern_pdoc pd;
            int rc = idx_reader_doc(r, d, &pd, m);
            if (rc == TARTAN_ENOTFOUND)
                continue;
            if (rc)
                return rc;
        }
        (*bits)[d >> 6] |= (uint64_t)1 << (d & 63);
        (*list)[n++] = d;
    }
    *n_out = n;
    return 0;
}

/* The results in one allocation: header, counts, offsets, hits, then the ids' bytes. */
static int build_results(const idx_reader *r, const eng_search *s, size_t nq,
                         const eng_stage_stats *st, double seconds, tartan_results **out,
                         store_msg *m)
{
    size_t total = 0, bytes = 0;
    for (size_t i = 0; i < nq; i++)
        total += s->hit_n ? s->hit_n[i] : 0;
    const char **name = malloc((total ? total : 1) * sizeof *name);
    size_t *len = malloc((total ? total : 1) * sizeof *len);
    if (!name || !len) {
        free(name);
        free(len);
        return store_fail(m, ENOMEM, "search: out of memory for results");
    }
    int rc = 0;
    for (size_t i = 0, h = 0; i < nq && !rc; i++)
        for (size_t j = 0; j < s->hit_n[i] && !rc; j++, h++) {
            uint32_t d = s->hit_doc[i * s->k + j];
            rc = idx_reader_name(r, d, &name[h], &len[h], m);
            if (rc == TARTAN_ENOTFOUND)
                rc = store_fail(m, TARTAN_ECORRUPT, "document %u has no external id", d);
            bytes += len[h] + 1;
        }
    tartan_results *res = NULL;
    if (!rc) {
        size_t head = sizeof *res + (2 * nq + 1) * sizeof(size_t);
        head = (head + alignof(tartan_hit) - 1) / alignof(tartan_hit) * alignof(tartan_hit);
        res = malloc(head + total * sizeof(tartan_hit) + bytes);
        if (!res)
            rc = store_fail(m, ENOMEM, "search: out of memory for results");
        else {
            size_t *counts = (size_t *)(res + 1), *offsets = counts + nq;
            tartan_hit *hits = (tartan_hit *)((char *)res + head);
            char *text = (char *)(hits + total);
            res->n_queries = nq;
            res->counts = counts;
            res->offsets = offsets;
            res->hits = hits;
            memset(&res->stats, 0, sizeof res->stats);
            res->stats.seconds_candidates = st->cand;
            res->stats.seconds_prune = st->prune;
            res->stats.seconds_exact = st->exact;
            res->stats.seconds_total = seconds;
            res->stats.n_candidates = st->n_cand;
            res->stats.n_exact = st->n_exact;
            res->stats.n_probes = st->n_probes;
            res->stats.probe_margin = isfinite(s->margin) ? s->margin : -1.f;
            res->stats.rerank_z = s->adaptive ? s->z : 0.f;
            res->stats.n_damaged = st->n_damaged;
            size_t h = 0;
            for (size_t i = 0; i < nq; i++) {
                counts[i] = s->hit_n[i];
                offsets[i] = h;
                for (size_t j = 0; j < s->hit_n[i]; j++, h++) {
                    memcpy(text, name[h], len[h]);
                    text[len[h]] = '\0';
                    hits[h].id = text;
                    hits[h].score = s->hit_score[i * s->k + j];
                    text += len[h] + 1;
                }
            }
            offsets[nq] = h;
        }
    }
    free(name);
    free(len);
    *out = res;
    return rc;
}

static void add_stats(eng_stage_stats *to, const eng_stage_stats *from)
{
    to->cand += from->cand;
    to->prune += from->prune;
    to->exact += from->exact;
    to->n_cand += from->n_cand;
    to->n_exact += from->n_exact;
    to->n_probes += from->n_probes;
    to->n_damaged += from->n_damaged;
}

/* PLAID over all queries: in the calling thread (one query, or one thread: the kernels then
 * use the threads), or one query per thread, each thread with its own reader. */
static int run_plaid(store_env *env, idx_reader *r, const eng_search *s, int threads,
                     eng_stage_stats *st, store_msg *m)
{
    size_t nq = s->q->n;
    int want = threads;
    if ((size_t)want > nq)
        want = (int)nq;
    if (want > MAX_READERS)
        want = MAX_READERS;
    int nr = want > 1 ? open_more(env, r, want) : 1;
    int rc = 0;
    if (nr == 1) {
        r->skip_damaged = s->skip_damaged;
        r->damaged = &st->n_damaged;
        eng_plaid_ws *ws = eng_plaid_ws_new();
        if (!ws)
            return store_fail(m, ENOMEM, "search: out of memory");
        for (size_t i = 0; i < nq && !rc; i++)
            rc = eng_plaid_query(r, s, i, ws, st, m);
        eng_plaid_ws_free(ws);
        return rc;
    }
    int failed = 0;
    eng_stage_stats *per = calloc((size_t)nr, sizeof *per);
    if (!per) {
        rc = store_fail(m, ENOMEM, "search: out of memory");
        goto done;
    }
#pragma omp parallel num_threads(nr)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        store_msg tm = {{0}};
        int trc = 0;
#ifdef _OPENMP
        /* One query per thread: the kernels it calls run on this thread alone, even where the
         * application enabled nested parallelism. */
        omp_set_num_threads(1);
#endif
        r[tid].skip_damaged = s->skip_damaged;
        r[tid].damaged = per ? &per[tid].n_damaged : NULL;
        eng_plaid_ws *ws = eng_plaid_ws_new();
        if (!ws)
            trc = store_fail(&tm, ENOMEM, "search: out of memory");
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < nq; i++) {
            int stop;
#pragma omp atomic read
            stop = failed;
            if (trc || stop)
                continue;
            trc = eng_plaid_query(&r[tid], s, i, ws, &per[tid], &tm);
        }
        eng_plaid_ws_free(ws);
        if (trc) {
#pragma omp critical(eng_search_err)
            if (!rc) {
                rc = trc;
                *m = tm;
#pragma omp atomic write
                failed = 1;
            }
        }
    }
    for (int i = 0; i < nr; i++)
        add_stats(st, &per[i]);
done:
    r[0].damaged = NULL; /* per goes; r[0] lives on in the caller */
    free(per);
    for (int i = 1; i < nr; i++)
        idx_reader_close(&r[i]);
    return rc;
}

int tartan_search(tartan_db *db, const tartan_queries *queries, const tartan_search_params *params,
                  tartan_results **results)
{
    return eng_search_call(db, queries, params, NULL, NULL, results);
}

int eng_search_call(tartan_db *db, const tartan_queries *queries,
                    const tartan_search_params *params, const eng_calib *calib,
                    const eng_docset *only, tartan_results **results)
{
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_search: db is NULL");
    if (!results)
        return eng_failf(db, TARTAN_EINVAL, "tartan_search: results is NULL");
    *results = NULL;
    if (!queries)
        return eng_failf(db, TARTAN_EINVAL, "tartan_search: queries is NULL");
    double t0 = eng_now();
    tartan_search_params dp;
    if (!params) {
        tartan_search_params_init(&dp, 10);
        params = &dp;
    }
    store_msg m = {{0}};
    int rc = check_params(params, &m);
    if (rc)
        return eng_fail(db, rc, &m);

    /* On the heap: a reader holds its codec tables (2 KiB), too much for small thread stacks
     * times MAX_READERS. */
    idx_reader *r = calloc(MAX_READERS, sizeof *r);
    eng_queries q = {0};
    eng_search s = {0};
    eng_stage_stats st = {0};
    uint64_t *allowed = NULL;
    uint32_t *allowed_list = NULL;
    float *margin_q = NULL;
    if (!r)
        return eng_failf(db, ENOMEM, "search: out of memory");
    if ((rc = idx_reader_open(db->env, &r[0], &m))) {
        free(r);
        return eng_fail(db, rc, &m);
    }
    if ((rc = eng_queries_prepare(queries, r[0].h.dim, &q, &m)))
        goto fail;
    int threads = params->threads;
#ifdef _OPENMP
    /* The call's thread count goes into this thread's OpenMP setting (a per-thread value),
     * which the kernels' parallel regions follow; it is put back before returning. */
    int saved_threads = omp_get_max_threads();
    if (threads == 0)
        threads = saved_threads;
    omp_set_num_threads(threads);
#else
    threads = 1;
#endif

    size_t nq = q.n;
    s.q = &q;
    s.k = params->k;
    if (r[0].trained && r[0].h.n_docs < s.k)
        s.k = r[0].h.n_docs ? r[0].h.n_docs : 1;
    s.hit_n = calloc(nq, sizeof *s.hit_n);
    if (!s.hit_n) {
        rc = store_fail(&m, ENOMEM, "search: out of memory");
        goto restore;
    }
    /* An index without documents (or without centroids, hence without documents) gives every
     * query zero hits. */
    if (r[0].trained && r[0].h.n_docs > 0) {
        /* Each stage adaptive unless fixed by the caller (tartan.h, engine/SEARCH.md). */
        const size_t K = r[0].h.n_centroids;
        float target = params->recall_target > 0.f ? params->recall_target : ENG_DEFAULT_TARGET;
        eng_calib cal;
        eng_calib_default(&cal);
        if (calib)
            cal = *calib;
        else if (params->ncells == 0 && !params->exhaustive &&
                 (rc = eng_calib_read(r[0].txn, &cal, &m)))
            goto restore; /* only adaptive probing reads the calibration */
        if (params->ncells == 0) {
            size_t cap = eng_probe_cap(s.k);
            s.ncells = cap < K ? cap : K;
            /* The margin by query length, each query its own (margin_q); s.margin is the
             * shortest's, the widest. */
            size_t min_len = SIZE_MAX;
            for (size_t i = 0; i < nq; i++)
                if (q.off[i + 1] - q.off[i] < min_len)
                    min_len = q.off[i + 1] - q.off[i];
            s.margin = eng_calib_margin(&cal, s.k, target, min_len);
            if (cal.short_len && min_len < q.max_len) {
                if (!(margin_q = malloc(nq * sizeof *margin_q))) {
                    rc = store_fail(&m, ENOMEM, "search: out of memory");
                    goto restore;
                }
                for (size_t i = 0; i < nq; i++)
                    margin_q[i] = eng_calib_margin(&cal, s.k, target, q.off[i + 1] - q.off[i]);
                s.margin_q = margin_q;
            }
        } else {
            s.ncells = params->ncells < K ? params->ncells : K;
            s.margin = INFINITY;
        }
        s.threshold = params->centroid_score_threshold;
        s.prune = s.threshold > -1.f;
        s.adaptive = params->ndocs == 0;
        if (s.adaptive) {
            s.z = eng_rerank_z(target);
            s.tail_eps = ENG_TAIL_SHARE * (1.0 - (double)target) * (double)s.k;
            s.depth_cap =
                ENG_DEPTH_PER_K * s.k > ENG_DEPTH_FLOOR ? ENG_DEPTH_PER_K * s.k : ENG_DEPTH_FLOOR;
            /* A subset this small is scored exactly, all of it. */
            s.ndocs = s.depth_cap < ENG_SUBSET_EXACT_MAX ? s.depth_cap : ENG_SUBSET_EXACT_MAX;
            s.ndocs_exact = s.k;
        } else {
            s.ndocs = params->ndocs;
            s.ndocs_exact = params->ndocs / 4 > s.k ? params->ndocs / 4 : s.k;
        }
        s.n_docnos = r[0].h.next_docno;
        s.hit_doc = malloc(nq * s.k * sizeof *s.hit_doc);
        s.hit_score = malloc(nq * s.k * sizeof *s.hit_score);
        if (!s.hit_doc || !s.hit_score) {
            rc = store_fail(&m, ENOMEM, "search: out of memory for %zu x %zu hits", nq, s.k);
            goto restore;
        }
        if (params->subset || only) {
            rc = params->subset
                     ? resolve_subset(&r[0], params, &allowed, &allowed_list, &s.n_allowed, &m)
                     : resolve_docset(&r[0], only, &allowed, &allowed_list, &s.n_allowed, &m);
            if (rc)
                goto restore;
            s.allowed = allowed;
            s.allowed_list = allowed_list;
        }
        if (s.allowed)
            s.subset_exact =
                params->exhaustive ? s.n_allowed <= r[0].h.n_docs / 8 : s.n_allowed <= s.ndocs;
        if (params->exhaustive) { /* unused by the scan; the subset's list needs only k */
            s.ndocs = s.ndocs_exact = s.k;
            s.adaptive = 0;
        }
        kern_dev dev = KERN_DEV_CPU;
        tartan_gpu_mode gmode = TARTAN_GPU_AUTO;
        if ((rc = eng_device_pick(params->device != TARTAN_DEVICE_AUTO ? params->device
                                                                       : db->opts.device,
                                  &dev, &m)) ||
            (rc = eng_gpu_mode_pick(db->opts.gpu_mode, &gmode, &m)))
            goto restore;
        s.skip_damaged = params->skip_damaged != 0;
        r[0].skip_damaged = s.skip_damaged;
        r[0].damaged = &st.n_damaged;
        if (s.skip_damaged && dev == KERN_DEV_CUDA) {
            rc = store_fail(&m, TARTAN_ENOTSUP,
                            "skip_damaged: GPU searches do not skip damaged records; search on "
                            "the CPU, or repair the index (tartan check --repair)");
            goto restore;
        }
        if (s.allowed && s.n_allowed == 0)
            ; /* nothing allowed: no hits */
        else if (dev == KERN_DEV_CUDA)
            rc = eng_gpus_search(db, &r[0], &s, params->exhaustive, gmode, &st, &m);
        else if (params->exhaustive && !s.subset_exact)
            rc = eng_exact_scan(&r[0], &s, threads, &st, &m);
        else {
            struct eng_probe *probe = s.subset_exact ? NULL : eng_probe_get(db, &r[0]);
            s.probe = eng_probe_table(probe);
            rc = run_plaid(db->env, r, &s, threads, &st, &m);
            eng_probe_put(db, probe);
        }
        if (rc)
            goto restore;
    }
    rc = build_results(&r[0], &s, nq, &st, eng_now() - t0, results, &m);
restore:
#ifdef _OPENMP
    omp_set_num_threads(saved_threads);
#endif
fail:
    idx_reader_close(&r[0]);
    free(r);
    eng_queries_free(&q);
    free(s.hit_n);
    free(s.hit_doc);
    free(s.hit_score);
    free(margin_q);
    free(allowed);
    free(allowed_list);
    return rc ? eng_fail(db, rc, &m) : 0;
}
