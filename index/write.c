/*
 * write.c: the changes an index goes through: training, adding a batch, deleting by id. Each
 * is one write transaction (store_write), so it lands whole or not at all; the inverted lists
 * change in the same transaction as the documents (a document is listed under each distinct
 * code it has, and deleting it removes exactly those entries).
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "assign.h"
#include "group.h"
#include "model.h"
#include "rand.h"
#include "tartan.h"

/* Returned by a change whose model went stale: another writer trained the index between the
 * model's load and the transaction. The change is encoded again with the stored model. */
#define IDX_ESTALE (-30991)

typedef struct encoded {
    uint32_t *codes;  /* [n_rows] */
    uint8_t *packed;  /* [n_rows, token_bytes] */
    float *inv_norms; /* [n_rows] */
} encoded;

static void encoded_free(encoded *e)
{
    free(e->codes);
    free(e->packed);
    free(e->inv_norms);
    memset(e, 0, sizeof *e);
}

/* Seconds an add spent in each phase, for the trace (TARTAN_KMEANS_TRACE). */
typedef struct add_times {
    double load, assign, compress, fn, write;
} add_times;

/* Codes (nearest centroid by inner product, on dev), packed residuals and inverse norms (on
 * the CPU's OpenMP threads: the code decides them, so they are the same whichever device
 * assigned); their seconds added to t. */
static int encode(kern_dev dev, const idx_model *mod, const idx_batch *b, encoded *e, add_times *t,
                  store_msg *m)
{
    size_t n = b->n_rows, tb = idx_codec_token_bytes(&mod->codec);
    memset(e, 0, sizeof *e);
    e->codes = malloc(n * sizeof *e->codes);
    e->packed = malloc(n * tb);
    e->inv_norms = malloc(n * sizeof(float));
    if (!e->codes || !e->packed || !e->inv_norms) {
        encoded_free(e);
        return store_fail(m, ENOMEM, "out of memory encoding %zu tokens", n);
    }
    const double t0 = idx_now();
    int rc = idx_assign(dev, mod->centroids, mod->k, b->dim, b->emb, n, e->codes, NULL, m);
    if (rc) {
        encoded_free(e);
        return rc;
    }
    const double t1 = idx_now();
    if (mod->axes.rot)
        idx_axes_compress(&mod->axes, mod->centroids, b->emb, e->codes, n, e->packed, e->inv_norms);
    else
        idx_codec_compress(&mod->codec, mod->centroids, b->emb, e->codes, n, e->packed,
                           e->inv_norms);
    t->assign += t1 - t0;
    t->compress += idx_now() - t1;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts codes[0..n) and drops repeats; returns the count left. */
static size_t distinct(uint32_t *codes, size_t n)
{
    qsort(codes, n, sizeof *codes, cmp_u32);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || codes[i] != codes[k - 1])
            codes[k++] = codes[i];
    return k;
}

/* A growing scratch array of codes. */
typedef struct scratch {
    uint32_t *v;
    size_t cap;
} scratch;

static int scratch_fit(scratch *s, size_t n, store_msg *m)
{
    if (n <= s->cap)
        return 0;
    uint32_t *v = realloc(s->v, n * sizeof *v);
    if (!v)
        return store_fail(m, ENOMEM, "out of memory");
    s->v = v;
    s->cap = n;
    return 0;
}

/* A document a change removes: its number and the id bound to it. */
typedef struct victim {
    uint32_t docno;
    const char *id;
    size_t idlen;
} victim;

static int cmp_victim(const void *a, const void *b)
{
    uint32_t x = ((const victim *)a)->docno, y = ((const victim *)b)->docno;
    return (x > y) - (x < y);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/*
 * Removes the n documents of v (any order; a number listed twice counts once) with their
 * inverted-list entries and ids, and adjusts h's counts. Their segments are rewritten once each
 * and each touched list once per block, whatever the order of the numbers.
 */
static int remove_docs(store_txn *txn, store_header *h, victim *v, size_t n, scratch *s,
                       store_msg *m)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_victim);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || v[i].docno != v[k - 1].docno)
            v[k++] = v[i];
    n = k;
    uint64_t *pairs = NULL; /* code << 32 | docno */
    size_t np = 0, cap = 0;
    uint32_t *docnos = malloc(n * sizeof *docnos);
    uint64_t ntok = 0;
    int rc = docnos ? 0 : store_fail(m, ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        store_doc d;
        docnos[i] = v[i].docno;
        /* The checksum is checked: removing a damaged document must not guess its codes
         * (tartan_repair removes damaged ones). */
        rc = store_doc_get(txn, v[i].docno, h->code_bytes, h->token_bytes, 1, &d, m);
        if (rc == TARTAN_ENOTFOUND)
            rc = store_fail(m, TARTAN_ECORRUPT, "id '%.*s' names document %u, which is missing",
                            (int)(v[i].idlen > 64 ? 64 : v[i].idlen), v[i].id, v[i].docno);
        if (rc || (rc = scratch_fit(s, d.ntok, m)))
            break;
        for (uint32_t t = 0; t < d.ntok; t++)
            s->v[t] = h->code_bytes == 2 ? ((const uint16_t *)d.codes)[t]
                                         : ((const uint32_t *)d.codes)[t];
        size_t nd = distinct(s->v, d.ntok);
        if (np + nd > cap) {
            size_t c2 = cap ? 2 * cap : 4096;
            while (c2 < np + nd)
                c2 *= 2;
            uint64_t *p = realloc(pairs, c2 * sizeof *p);
            if (!p) {
                rc = store_fail(m, ENOMEM, "out of memory");
                break;
            }
            pairs = p;
            cap = c2;
        }
        for (size_t j = 0; j < nd; j++)
            pairs[np++] = (uint64_t)s->v[j] << 32 | v[i].docno;
        ntok += d.ntok;
    }
    if (!rc && (h->n_docs < n || h->n_tokens < ntok || h->n_postings < np))
        rc = store_fail(m, TARTAN_ECORRUPT, "the index's counts are inconsistent");
    if (!rc)
        rc = store_docs_delete(txn, docnos, n, m);
    if (rc == TARTAN_ENOTFOUND)
        rc = TARTAN_ECORRUPT; /* a listed document without a record: m says which */
    if (!rc) {
        /* By centroid, then number: each list's numbers come ascending, one call per list. */
        qsort(pairs, np, sizeof *pairs, cmp_u64);
        uint32_t *run = (uint32_t *)docnos; /* reused: at most n numbers per list */
        for (size_t i = 0; i < np && !rc;) {
            uint32_t c = (uint32_t)(pairs[i] >> 32);
            size_t r = 0;
            for (; i < np && (uint32_t)(pairs[i] >> 32) == c; i++)
                run[r++] = (uint32_t)pairs[i];
            rc = store_ivf_remove(txn, c, run, r, m);
        }
    }
    for (size_t i = 0; i < n && !rc; i++)
        rc = store_id_del(txn, v[i].id, v[i].idlen, v[i].docno, m);
    if (!rc) {
        h->n_docs -= n;
        h->n_tokens -= ntok;
        h->n_postings -= np;
    }
    free(pairs);
    free(docnos);
    return rc;
}

/*
 * Writes a batch's inverted-list entries (code pc[i], document pd[i]; documents ascending in
 * input order) a list at a time: a stable counting sort by code keeps each list's documents
 * ascending, and each list gets one call (its last block refilled, then whole new blocks).
 * One document at a time would scatter its ~60 changes over lists all across the B-tree; in
 * code order consecutive changes land on the same pages (measured 2.5x faster for the whole
 * transaction with format 1's lists at 131,072 centroids).
 */
static int ivf_flush(store_txn *txn, const uint32_t *pc, const uint32_t *pd, size_t np, uint32_t k,
                     store_msg *m)
{
    if (np == 0)
        return 0;
    size_t *start = calloc((size_t)k + 1, sizeof *start);
    uint32_t *sd = malloc(np * sizeof *sd);
    int rc = 0;
    if (!start || !sd) {
        rc = store_fail(m, ENOMEM, "out of memory for %zu inverted-list entries", np);
        goto out;
    }
    for (size_t i = 0; i < np; i++) {
        if (pc[i] >= k) {
            rc = store_fail(m, TARTAN_EINTERNAL, "code %u beyond the %u centroids", pc[i], k);
            goto out;
        }
        start[pc[i] + 1]++;
    }
    for (uint32_t c = 0; c < k; c++)
        start[c + 1] += start[c];
    for (size_t i = 0; i < np; i++)
        sd[start[pc[i]]++] = pd[i];
    /* start[c] is now the end of list c's run. */
    size_t at = 0;
    for (uint32_t c = 0; c < k && !rc; c++) {
        if (start[c] > at)
            rc = store_ivf_append(txn, c, sd + at, start[c] - at, m);
        at = start[c];
    }
out:
    free(start);
    free(sd);
    return rc;
}

typedef struct add_ctx {
    const idx_batch *b;
    const encoded *e;
    const idx_model *mod;
    int fresh; /* the model was trained for this change and must be stored with it */
    int replace;
    double fn_s; /* seconds in add_fn, the trace's */
} add_ctx;

static int add_fn_body(add_ctx *c, store_txn *txn, store_msg *m)
{
    const idx_batch *b = c->b;
    store_header h;
    int rc = store_header_get(txn, &h, m);
    if (rc)
        return rc;
    if (c->fresh) {
        if (h.n_centroids != 0)
            return IDX_ESTALE;
        if ((rc = idx_model_store(txn, c->mod, &h, m)))
            return rc;
    } else if (h.n_centroids != c->mod->k) {
        return IDX_ESTALE;
    }
    scratch s = {0};
    /* The ids the batch replaces go first (their segments and list blocks are rewritten before
     * the new documents are appended after them). */
    victim *old = malloc(b->n_docs * sizeof *old);
    size_t nold = 0;
    if (!old)
        return store_fail(m, ENOMEM, "out of memory");
    for (size_t i = 0; i < b->n_docs && !rc; i++) {
        uint32_t docno;
        rc = store_id_get(txn, b->ids[i], b->idlens[i], &docno, m);
        if (rc == TARTAN_ENOTFOUND) {
            rc = 0;
        } else if (rc == 0 && !c->replace) {
            rc = store_fail(m, TARTAN_EDUPID,
                            "document %zu (id '%.*s'): the index has this id already", i,
                            (int)(b->idlens[i] > 64 ? 64 : b->idlens[i]), b->ids[i]);
        } else if (rc == 0) {
            old[nold++] = (victim){docno, b->ids[i], b->idlens[i]};
        }
    }
    if (!rc)
        rc = remove_docs(txn, &h, old, nold, &s, m);
    free(old);
    if (!rc && b->n_docs > UINT32_MAX - (size_t)h.next_docno)
        rc = store_fail(m, TARTAN_ETOOBIG, "the index has used all %u document numbers",
                        UINT32_MAX);
    /* The batch's inverted-list entries, written after its documents (ivf_flush). */
    uint32_t *pc = malloc((b->n_rows ? b->n_rows : 1) * sizeof *pc);
    uint32_t *pd = malloc((b->n_rows ? b->n_rows : 1) * sizeof *pd);
    size_t np = 0;
    if (!rc && (!pc || !pd))
        rc = store_fail(m, ENOMEM, "out of memory");
    store_appender *app = NULL;
    if (!rc)
        rc = store_docs_append_begin(txn, h.code_bytes, h.token_bytes, &app, m);
    for (size_t i = 0; i < b->n_docs && !rc; i++) {
        uint32_t docno = h.next_docno++;
        size_t off = b->offsets[i], ntok = b->offsets[i + 1] - off;
        if ((rc = store_docs_append(app, docno, (uint32_t)ntok, c->e->inv_norms + off,
                                    c->e->codes + off, 4, c->e->packed + off * h.token_bytes, m)))
            break;
        if ((rc = scratch_fit(&s, ntok, m)))
            break;
        memcpy(s.v, c->e->codes + off, ntok * sizeof(uint32_t));
        size_t nd = distinct(s.v, ntok);
        for (size_t j = 0; j < nd; j++, np++) {
            pc[np] = s.v[j];
            pd[np] = docno;
        }
        if ((rc = store_id_put(txn, b->ids[i], b->idlens[i], docno, m)))
            break;
        h.n_docs++;
        h.n_tokens += ntok;
    }
    if (app) {
        if (rc)
            store_docs_append_free(app);
        else
            rc = store_docs_append_end(app, m);
    }
    free(s.v);
    if (!rc)
        rc = ivf_flush(txn, pc, pd, np, h.n_centroids, m);
    h.n_postings += np;
    free(pc);
    free(pd);
    if (!rc)
        rc = store_header_put(txn, &h, m);
    return rc;
}

/* store_write's function: add_fn_body, timed for the trace. */
static int add_fn(store_txn *txn, void *vctx, store_msg *m)
{
    add_ctx *c = vctx;
    const double t0 = idx_now();
    int rc = add_fn_body(c, txn, m);
    c->fn_s += idx_now() - t0;
    return rc;
}

/* The stored header and, when trained, the stored model (copied out of a short snapshot). */
static int load_state(store_env *env, store_header *h, idx_model *mod, store_msg *m)
{
    store_txn *txn;
    int rc = store_read_begin(env, &txn, m);
    if (rc)
        return rc;
    rc = store_header_get(txn, h, m);
    memset(mod, 0, sizeof *mod);
    if (!rc && h->n_centroids)
        rc = idx_model_load(txn, h, mod, m);
    store_read_end(env, txn);
    return rc;
}

/* A model trained from a sample of the batch's documents (the first add of an index). */
static int train_from_batch(const idx_batch *b, const store_header *h, const idx_train_opts *o,
                            idx_model *mod, store_msg *m)
{
    size_t ns = idx_sample_docs(b->n_docs, o ? o->sample_docs : 0);
    size_t *pick = malloc(b->n_docs * sizeof *pick);
    if (!pick)
        return store_fail(m, ENOMEM, "out of memory");
    for (size_t i = 0; i < b->n_docs; i++)
        pick[i] = i;
    uint64_t st = o ? o->seed : h->seed;
    for (size_t i = 0; i < ns; i++) {
        size_t j = i + (size_t)(idx_rand_next(&st) % (b->n_docs - i));
        size_t t = pick[i];
        pick[i] = pick[j];
        pick[j] = t;
    }
    size_t ntok = 0;
    for (size_t i = 0; i < ns; i++)
        ntok += b->doclens[pick[i]];
    float *x = malloc(ntok * b->dim * sizeof(float));
    if (!x) {
        free(pick);
        return store_fail(m, ENOMEM, "out of memory for a sample of %zu tokens", ntok);
    }
    size_t at = 0;
    for (size_t i = 0; i < ns; i++) {
        size_t d = pick[i], len = b->offsets[d + 1] - b->offsets[d];
        memcpy(x + at * b->dim, b->emb + b->offsets[d] * b->dim, len * b->dim * sizeof(float));
        at += len;
    }
    free(pick);
    /* K from the batch's size: ColBERTv2 sizes it from the corpus, and this batch is all of
     * the corpus the index knows of yet. */
    int rc = idx_model_train(o ? o->device : KERN_DEV_CPU, x, ntok, b->dim, h->nbits,
                             o ? o->n_centroids : 0, b->n_rows,
                             o && o->kmeans_iters > 0 ? o->kmeans_iters : (int)h->kmeans_iters,
                             o ? o->seed : h->seed, o ? o->codec : 0, mod, m);
    free(x);
    return rc;
}

/* Tries a change this often when other writers keep training the index under it. */
#define STALE_RETRIES 3

int idx_add(store_env *env, const idx_batch *b, int replace, const idx_train_opts *o, store_msg *m)
{
    if (store_is_readonly(env))
        return store_fail(m, TARTAN_EREADONLY, "'%s' is open read-only", store_path(env));
    if (!b->ids)
        return store_fail(m, TARTAN_EINVAL, "the batch has no ids");
    int rc = 0;
    add_times t = {0};
    for (int attempt = 0; attempt < STALE_RETRIES; attempt++) {
        store_header h;
        idx_model mod;
        double t0 = idx_now();
        if ((rc = load_state(env, &h, &mod, m)))
            return rc;
        t.load += idx_now() - t0;
        if (b->dim != h.dim)
            return store_fail(m, TARTAN_EDIM, "the batch has dimension %zu, the index %u", b->dim,
                              h.dim);
        int fresh = h.n_centroids == 0;
        if (fresh && (rc = train_from_batch(b, &h, o, &mod, m)))
            return rc;
        encoded e;
        if ((rc = encode(o ? o->device : KERN_DEV_CPU, &mod, b, &e, &t, m))) {
            idx_model_free(&mod);
            return rc;
        }
        add_ctx c = {b, &e, &mod, fresh, replace, 0};
        t0 = idx_now();
        rc = store_write(env, add_fn, &c, m);
        t.write += idx_now() - t0;
        t.fn += c.fn_s;
        encoded_free(&e);
        idx_model_free(&mod);
        if (rc != IDX_ESTALE) {
            /* One line a batch: where an add's time goes, and how it varies between batches. */
            if (idx_trace())
                fprintf(stderr,
                        "adding: %zu documents (%zu tokens): model loaded %.3f s, codes %.3f s, "
                        "residuals %.3f s, written %.3f s (begin and commit %.3f s)\n",
                        b->n_docs, b->n_rows, t.load, t.assign, t.compress, t.fn, t.write - t.fn);
            return rc;
        }
    }
    return store_fail(m, TARTAN_EINTERNAL, "the index kept being retrained under this change");
}

typedef struct train_ctx {
    const idx_model *mod;
} train_ctx;

static int train_fn(store_txn *txn, void *vctx, store_msg *m)
{
    train_ctx *c = vctx;
    store_header h;
    int rc = store_header_get(txn, &h, m);
    if (rc)
        return rc;
    if (h.n_centroids != 0)
        return store_fail(m, TARTAN_EINVAL, "the index is trained already (%u centroids)",
                          h.n_centroids);
    if ((rc = idx_model_store(txn, c->mod, &h, m)))
        return rc;
    return store_header_put(txn, &h, m);
}

int idx_train(store_env *env, const idx_batch *sample, size_t corpus_tokens,
              const idx_train_opts *o, store_msg *m)
{
    if (store_is_readonly(env))
        return store_fail(m, TARTAN_EREADONLY, "'%s' is open read-only", store_path(env));
    store_header h;
    idx_model mod;
    int rc = load_state(env, &h, &mod, m);
    if (rc)
        return rc;
    if (h.n_centroids != 0) {
        idx_model_free(&mod);
        return store_fail(m, TARTAN_EINVAL, "the index is trained already (%u centroids)",
                          h.n_centroids);
    }
    if (sample->dim != h.dim)
        return store_fail(m, TARTAN_EDIM, "the sample has dimension %zu, the index %u", sample->dim,
                          h.dim);
    const double t0 = idx_now();
    rc = idx_model_train(o ? o->device : KERN_DEV_CPU, sample->emb, sample->n_rows, h.dim, h.nbits,
                         o ? o->n_centroids : 0, corpus_tokens,
                         o && o->kmeans_iters > 0 ? o->kmeans_iters : (int)h.kmeans_iters,
                         o ? o->seed : h.seed, o ? o->codec : 0, &mod, m);
    if (rc)
        return rc;
    train_ctx c = {&mod};
    const double t1 = idx_now();
    rc = store_write(env, train_fn, &c, m);
    if (idx_trace())
        fprintf(stderr, "training: model %.3f s, storing it %.3f s\n", t1 - t0, idx_now() - t1);
    idx_model_free(&mod);
    return rc;
}

/* What every member of a shared training must agree on: what it trains with, and the header's
 * model fields that tartan_model_export carries (so that the members' exports are equal). */
enum {
    PAR_DIM,
    PAR_NBITS,
    PAR_SEED,
    PAR_ITERS,
    PAR_K,
    PAR_CORPUS,
    PAR_HSEED,
    PAR_HITERS,
    PAR_HSAMPLE,
    PAR_CODEC,
    PAR_N
};
static const char *const par_name[PAR_N] = {"dim",
                                            "nbits",
                                            "seed",
                                            "k-means iterations",
                                            "centroids",
                                            "corpus tokens",
                                            "creation seed",
                                            "creation k-means iterations",
                                            "creation sample_docs",
                                            "codec"};

int idx_train_group(store_env *env, const idx_batch *sample, size_t corpus_tokens,
                    const idx_train_opts *o, int rc, idx_group *g, idx_train_times *times,
                    store_msg *m)
{
    store_header h;
    idx_model mod;
    memset(&h, 0, sizeof h);
    memset(&mod, 0, sizeof mod);
    if (!rc && store_is_readonly(env))
        rc = store_fail(m, TARTAN_EREADONLY, "'%s' is open read-only", store_path(env));
    if (!rc)
        rc = load_state(env, &h, &mod, m);
    if (!rc && h.n_centroids != 0)
        rc = store_fail(m, TARTAN_EINVAL, "the index is trained already (%u centroids)",
                        h.n_centroids);
    if (!rc && sample->n_rows && sample->dim != h.dim)
        rc = store_fail(m, TARTAN_EDIM, "the sample has dimension %zu, the index %u", sample->dim,
                        h.dim);
    int iters = o->kmeans_iters > 0 ? o->kmeans_iters : (int)h.kmeans_iters;
    uint64_t mine[PAR_N] = {h.dim,         h.nbits, o->seed,        (uint64_t)iters, o->n_centroids,
                            corpus_tokens, h.seed,  h.kmeans_iters, h.sample_docs,   o->codec};
    uint64_t zero[PAR_N];
    memcpy(zero, mine, sizeof zero);
    int brc = idx_group_bcast(g, zero, sizeof zero, m);
    if (brc) {
        idx_model_free(&mod);
        return brc;
    }
    for (int i = 0; i < PAR_N && !rc; i++)
        if (mine[i] != zero[i])
            rc = store_fail(m, TARTAN_EINVAL,
                            "rank %d of %d trains with %s %llu, rank 0 with %llu: every member "
                            "of a shared training must be opened and created alike",
                            g->rank, g->size, par_name[i], (unsigned long long)mine[i],
                            (unsigned long long)zero[i]);
    idx_model_free(&mod);
    if ((rc = idx_group_check(g, rc, m)))
        return rc;
    rc = idx_model_train_group(o->device, sample->emb, sample->n_rows, h.dim, h.nbits,
                               o->n_centroids, corpus_tokens, iters, o->seed, o->codec, g, &mod,
                               times, m);
    if (rc)
        return rc;
    /* Every member stores the same model in its own index; a member that cannot makes all
     * of them fail (the others keep the model they stored). */
    train_ctx c = {&mod};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = store_write(env, train_fn, &c, m);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (times)
        times->store = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    idx_model_free(&mod);
    return idx_group_check(g, rc, m);
}

typedef struct del_ctx {
    const char *const *ids;
    const size_t *lens;
    size_t n;
    size_t deleted;
} del_ctx;

static int del_fn(store_txn *txn, void *vctx, store_msg *m)
{
    del_ctx *c = vctx;
    c->deleted = 0; /* the change may run again after the map grows */
    store_header h;
    int rc = store_header_get(txn, &h, m);
    if (rc)
        return rc;
    victim *v = malloc(c->n * sizeof *v);
    size_t nv = 0;
    if (!v)
        return store_fail(m, ENOMEM, "out of memory");
    for (size_t i = 0; i < c->n && !rc; i++) {
        uint32_t docno;
        rc = store_id_get(txn, c->ids[i], c->lens[i], &docno, m);
        if (rc == TARTAN_ENOTFOUND) {
            rc = 0; /* not there: nothing to do */
            continue;
        }
        if (!rc)
            v[nv++] = (victim){docno, c->ids[i], c->lens[i]};
    }
    scratch s = {0};
    uint64_t before = h.n_docs;
    if (!rc)
        rc = remove_docs(txn, &h, v, nv, &s, m);
    free(s.v);
    free(v);
    if (!rc) {
        c->deleted = (size_t)(before - h.n_docs);
        rc = store_header_put(txn, &h, m);
    }
    return rc;
}

int idx_delete(store_env *env, const char *const *ids, size_t n, size_t *n_deleted, store_msg *m)
{
    if (n_deleted)
        *n_deleted = 0;
    if (n > 0 && !ids)
        return store_fail(m, TARTAN_EINVAL, "ids is NULL");
    size_t *lens = malloc((n ? n : 1) * sizeof *lens);
    if (!lens)
        return store_fail(m, ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (idx_id_check(ids[i], &lens[i])) {
            size_t len = ids[i] ? lens[i] : 0; /* read before lens is freed */
            free(lens);
            return store_fail(m, TARTAN_EBADID, "id %zu is %s", i,
                              !ids[i]              ? "NULL"
                              : len == 0           ? "empty"
                              : len > STORE_MAX_ID ? "longer than 511 bytes"
                                                   : "malformed (a control character)");
        }
    }
    if (store_is_readonly(env)) {
        free(lens);
        return store_fail(m, TARTAN_EREADONLY, "'%s' is open read-only", store_path(env));
    }
    if (n == 0) {
        free(lens);
        return 0; /* nothing to delete: no transaction */
    }
    del_ctx c = {ids, lens, n, 0};
    int rc = store_write(env, del_fn, &c, m);
    free(lens);
    if (!rc && n_deleted)
        *n_deleted = c.deleted;
    return rc;
}
