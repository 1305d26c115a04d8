/*
 * search_gpu.c: tartan_search on a CUDA GPU (gpu.h).
 *
 * The mirror. Documents keep their numbers on the device: doc_off [next_docno + 1] gives each
 * number its run of tokens in codes (uint32), residuals and inv_norms; a deleted document keeps
 * its run but loses its bit in live. A search whose snapshot differs from the mirror's first
 * catches up: documents numbered from the mirror's next_docno on are appended (numbers only
 * grow, so nothing else can be new), and when the live count then disagrees with the snapshot's,
 * some older documents were deleted and one pass over the index's document keys finds which.
 * Inverted lists are rebuilt on the device from the codes and live after every catch-up (a few
 * milliseconds per million documents) rather than read from LMDB. Runs of deleted documents
 * are dropped by reloading once they hold more than half of the tokens.
 *
 * Modes. Resident: residuals and norms live on the device too and the whole search runs there.
 * Streaming: only codes, offsets, centroids and lists do; the documents that reach exact
 * scoring are read from LMDB's map (checksums verified) into page-locked buffers and copied
 * over for each batch, and exhaustive search streams every document through in slices.
 *
 * A batch of queries runs in chunks sized so that the [K, tokens] score table stays within
 * about 1 GB. Per chunk the stages are: the score table (one GEMM-like kernel), each token's
 * probes, the candidate bitmaps and their counts (the one copy back to the host before the
 * end: it sizes the candidate matrices), the candidates in ascending number, pruned centroid
 * interaction, top ndocs, unpruned interaction, top ndocs_exact, exact residual-fused scores,
 * top k. Everything between stays on the device.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "kernels.h"

/* Budget of the score table of one chunk of queries, and of its candidate matrices. */
#define ST_BUDGET ((size_t)1 << 30)
#define MATRIX_BUDGET ((size_t)2 << 30)
/* Tokens staged on the host before each copy to the device while loading. */
#define STAGE_TOKENS ((size_t)1 << 20)
/* Documents per slice of a streaming exhaustive search (eng_gpu_set_slice changes it). */
#define STREAM_SLICE_DOCS ((size_t)1 << 16)

static pthread_mutex_t gpu_mutex = PTHREAD_MUTEX_INITIALIZER;

void eng_gpu_lock(void)
{
    pthread_mutex_lock(&gpu_mutex);
}

void eng_gpu_unlock(void)
{
    pthread_mutex_unlock(&gpu_mutex);
}

/* A device buffer that only grows. */
typedef struct dbuf {
    void *p;
    size_t cap;
} dbuf;

/*
 * Documents copied over for the exact stage: one page-locked block laid out as offsets
 * [n + 1] (int64), numbers [n] (uint32: i, or KERN_NO_DOC), codes, norms, residuals (the
 * last at a 16-byte boundary), copied to a device block of the same layout in one copy.
 */
typedef struct xslot {
    void *pin;
    size_t pin_cap;
    dbuf dev;
    size_t bytes, o_docs, o_codes, o_norms, o_res;
} xslot;

struct eng_gpu {
    int valid;
    tartan_gpu_mode mode; /* RESIDENT or STREAMING once loaded */
    uint32_t K, next_docno;
    uint64_t n_docs; /* live documents in the mirror */
    size_t dim, rbytes, n_tok, dead_tok;
    unsigned nbits;
    dbuf centroids, weights, doc_off, codes, residuals, norms, live, alive, ivf_off, ivf_docs,
        ivf_scratch;
    /* The residual code by principal axes (index/axes.h), where axes is set: the positions'
     * decode tables and the rotation, rows the axes; the exact stage reads the rotated queries
     * (qrot, written per chunk). */
    int axes;
    dbuf axes_dec, rot;
    unsigned axes_bytes[4];
    int axes_additive;
    /* Each document's distinct codes (udoc_off [next_docno + 1], ucodes [n_utok]), in the
     * order they first occur: the centroid interaction takes each query token's best over a
     * document's codes, which its distinct codes give with fewer rows read (a document of
     * `tartan gen` repeats most of its codes: 0.28-0.41 distinct a token at 340 tokens a
     * centroid). */
    dbuf udoc_off, ucodes;
    size_t n_utok;
    /* The centroids as fp16 numbers, when every value is one (an index's centroids are stored
     * in fp16; a format-1 index's may not be): the score table then takes the fp16 kernel. */
    dbuf c16;
    int c16_ok;
    size_t n_alive;
    uint32_t *h_live;
    size_t h_live_words;
    int64_t *h_doc_off; /* [next_docno + 1] */
    size_t h_doc_cap;
    int64_t *h_udoc_off; /* [next_docno + 1] */
    size_t h_udoc_cap;
    uint32_t *seen; /* [K]: the last document that staged each code's row */
    /* Host staging while loading. */
    uint32_t *s_codes;
    uint8_t *s_res;
    float *s_norms;
    size_t s_n;
    uint32_t *s_ucodes;
    size_t s_un;
    /* Search workspace. */
    dbuf q, q_off, ST, ST16, blk, colbest, tilekey, probes, colm, bits, counts, docs1, approx1, sel,
        docs2, approx2, docs3, scores, docs4, vals, allowed, list, done, next, exact_all, poff,
        pair_q, qrot;
    int bits_dirty; /* bits may hold set bits (a search failed between marking and taking) */
    /* Streaming: the exact stage's documents, in two slots (one filling while the other is
     * scored), each page-locked on the host and copied whole to the device. */
    xslot xs[2];
    kern_cuda_copier *copier;
    size_t slice_docs;
    size_t mem_total; /* the device's memory, once known (0: not yet) */
};

static int gpu_fail(int krc, store_msg *m, const char *what)
{
    switch (krc) {
    case KERN_ENOMEM:
        return store_fail(m, ENOMEM, "GPU search: %s: out of GPU memory (%s)", what,
                          kern_last_error());
    case KERN_ENODEV:
        return store_fail(m, TARTAN_ENODEV, "GPU search: %s: %s", what, kern_last_error());
    case KERN_EDEVICE:
        return store_fail(m, TARTAN_EDEVICE, "GPU search: %s: %s", what, kern_last_error());
    default:
        return store_fail(m, TARTAN_EINTERNAL, "GPU search: %s: %s", what, kern_last_error());
    }
}

#define KTRY(call, what)                                                                           \
    do {                                                                                           \
        int krc_ = (call);                                                                         \
        if (krc_)                                                                                  \
            return gpu_fail(krc_, m, what);                                                        \
    } while (0)

static void dbuf_free(dbuf *b)
{
    kern_cuda_free(b->p);
    b->p = NULL;
    b->cap = 0;
}

/* At least bytes in b; keep: copy the old contents over. */
static int dbuf_need(dbuf *b, size_t bytes, int keep, store_msg *m)
{
    if (bytes <= b->cap && b->p)
        return 0;
    size_t c = b->cap + b->cap / 2;
    if (c < bytes)
        c = bytes;
    if (c < 256)
        c = 256;
    void *n = NULL;
    KTRY(kern_cuda_malloc(&n, c), "device memory");
    if (keep && b->p && b->cap) {
        int krc = kern_cuda_copy_d2d(n, b->p, b->cap);
        if (krc) {
            kern_cuda_free(n);
            return gpu_fail(krc, m, "device copy");
        }
    }
    kern_cuda_free(b->p); /* synchronises: the copy above is done */
    b->p = n;
    b->cap = c;
    return 0;
}

static void mirror_reset(eng_gpu *g)
{
    dbuf *all[] = {&g->centroids, &g->weights,  &g->doc_off,     &g->codes,
                   &g->residuals, &g->norms,    &g->live,        &g->alive,
                   &g->ivf_off,   &g->ivf_docs, &g->ivf_scratch, &g->c16,
                   &g->udoc_off,  &g->ucodes,   &g->axes_dec,    &g->rot};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        dbuf_free(all[i]);
    g->valid = 0;
    g->c16_ok = 0;
    g->axes = 0;
    g->K = g->next_docno = 0;
    g->n_docs = 0;
    g->n_tok = g->dead_tok = g->n_alive = g->n_utok = 0;
}

void eng_gpu_free_held(eng_gpu *g)
{
    if (!g)
        return;
    mirror_reset(g);
    dbuf *ws[] = {&g->q,         &g->q_off,     &g->ST,      &g->probes, &g->colm,      &g->bits,
                  &g->counts,    &g->docs1,     &g->approx1, &g->sel,    &g->docs2,     &g->approx2,
                  &g->docs3,     &g->scores,    &g->docs4,   &g->vals,   &g->allowed,   &g->list,
                  &g->xs[0].dev, &g->xs[1].dev, &g->done,    &g->next,   &g->exact_all, &g->ST16,
                  &g->poff,      &g->pair_q,    &g->colbest, &g->blk,    &g->tilekey,   &g->qrot};
    kern_cuda_copier_free(g->copier);
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
        dbuf_free(ws[i]);
    kern_cuda_host_free(g->xs[0].pin);
    kern_cuda_host_free(g->xs[1].pin);
    free(g->h_live);
    free(g->h_doc_off);
    free(g->h_udoc_off);
    free(g->seen);
    free(g->s_codes);
    free(g->s_ucodes);
    free(g->s_res);
    free(g->s_norms);
    free(g);
}

void eng_gpu_free(eng_gpu *g)
{
    if (!g)
        return;
    eng_gpu_lock();
    eng_gpu_free_held(g);
    eng_gpu_unlock();
}

void eng_gpu_set_slice(eng_gpu *g, size_t docs)
{
    eng_gpu_lock();
    g->slice_docs = docs ? docs : STREAM_SLICE_DOCS;
    eng_gpu_unlock();
}

void eng_gpu_describe(const eng_gpu *g, tartan_gpu_mode *mode, size_t *device_bytes)
{
    const dbuf *all[] = {&g->centroids, &g->weights,  &g->doc_off, &g->codes,    &g->residuals,
                         &g->norms,     &g->live,     &g->alive,   &g->ivf_off,  &g->ivf_docs,
                         &g->c16,       &g->udoc_off, &g->ucodes,  &g->axes_dec, &g->rot};
    size_t b = 0;
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        b += all[i]->cap;
    if (mode)
        *mode = g->valid ? g->mode : TARTAN_GPU_AUTO;
    if (device_bytes)
        *device_bytes = b;
}

/* ---- catching up with the snapshot ---------------------------------------------------- */

/* Copies the staged tokens to the end of the device arrays. */
static int flush_stage(eng_gpu *g, store_msg *m)
{
    int rc;
    if (g->s_un) {
        size_t u = g->n_utok + g->s_un;
        if ((rc = dbuf_need(&g->ucodes, u * 4, 1, m)))
            return rc;
        KTRY(kern_cuda_upload((uint32_t *)g->ucodes.p + g->n_utok, g->s_ucodes, g->s_un * 4),
             "upload");
        g->n_utok = u;
        g->s_un = 0;
    }
    if (!g->s_n)
        return 0;
    size_t n = g->n_tok + g->s_n;
    if ((rc = dbuf_need(&g->codes, n * 4, 1, m)))
        return rc;
    KTRY(kern_cuda_upload((uint32_t *)g->codes.p + g->n_tok, g->s_codes, g->s_n * 4), "upload");
    if (g->mode == TARTAN_GPU_RESIDENT) {
        if ((rc = dbuf_need(&g->residuals, n * g->rbytes, 1, m)) ||
            (rc = dbuf_need(&g->norms, n * 4, 1, m)))
            return rc;
        KTRY(kern_cuda_upload((uint8_t *)g->residuals.p + g->n_tok * g->rbytes, g->s_res,
                              g->s_n * g->rbytes),
             "upload");
        KTRY(kern_cuda_upload((float *)g->norms.p + g->n_tok, g->s_norms, g->s_n * 4), "upload");
    }
    g->n_tok = n;
    g->s_n = 0;
    return 0;
}

/* Appends document docno (numbers arrive ascending; those skipped get empty runs). */
static int append_doc(eng_gpu *g, const idx_reader *r, uint32_t docno, const kern_pdoc *d,
                      store_msg *m)
{
    if (eng_grow((void **)&g->h_doc_off, &g->h_doc_cap, (size_t)docno + 2, sizeof(int64_t)) ||
        eng_grow((void **)&g->h_udoc_off, &g->h_udoc_cap, (size_t)docno + 2, sizeof(int64_t)))
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    for (uint32_t x = g->next_docno; x < docno; x++) {
        g->h_doc_off[x + 1] = g->h_doc_off[x];
        g->h_udoc_off[x + 1] = g->h_udoc_off[x];
    }
    int64_t start = (int64_t)(g->n_tok + g->s_n);
    g->h_doc_off[docno] = start;
    g->h_doc_off[docno + 1] = start + d->ntok;
    g->h_udoc_off[docno] = (int64_t)(g->n_utok + g->s_un);
    g->next_docno = docno + 1;
    g->h_live[docno >> 5] |= 1u << (docno & 31);
    g->n_docs++;
    const unsigned cb = r->h.code_bytes;
    for (uint32_t t = 0; t < d->ntok;) {
        if (g->s_n == STAGE_TOKENS) {
            int rc = flush_stage(g, m);
            if (rc)
                return rc;
        }
        uint32_t take = d->ntok - t;
        if (take > STAGE_TOKENS - g->s_n)
            take = (uint32_t)(STAGE_TOKENS - g->s_n);
        for (uint32_t i = 0; i < take; i++) {
            uint32_t c = cb == 2 ? ((const uint16_t *)d->codes)[t + i]
                                 : ((const uint32_t *)d->codes)[t + i];
            if (c >= g->K)
                return store_fail(m, TARTAN_ECORRUPT,
                                  "document %u: token %u has code %u, past %u centroids", docno,
                                  t + i, c, g->K);
            g->s_codes[g->s_n + i] = c;
            /* The code's first occurrence in this document: staged for the distinct list
             * too (flushed with the tokens: never more of them). */
            if (g->seen[c] != docno) {
                g->seen[c] = docno;
                g->s_ucodes[g->s_un++] = c;
            }
        }
        if (g->mode == TARTAN_GPU_RESIDENT) {
            memcpy(g->s_res + g->s_n * g->rbytes, d->residuals + (size_t)t * g->rbytes,
                   (size_t)take * g->rbytes);
            memcpy(g->s_norms + g->s_n, d->inv_norms + t, (size_t)take * 4);
        }
        g->s_n += take;
        t += take;
    }
    g->h_udoc_off[docno + 1] = (int64_t)(g->n_utok + g->s_un);
    return 0;
}

/* A token's code, residual, norm and inverted-list entry, and at most one distinct code; a
 * document's two offsets; a centroid in fp32 and fp16. */
size_t eng_gpu_resident_bytes(const idx_reader *r)
{
    const store_header *h = &r->h;
    return (size_t)h->n_tokens * (4 + h->token_bytes + 4 + 4 + 4) +
           (size_t)h->n_centroids * (h->dim * 6 + 16) + (size_t)h->next_docno * 24 +
           (r->axes ? (idx_axes_decode_floats(r->axes) + h->dim * h->dim) * 4 : 0);
}

/*
 * The score table's kernels, by TARTAN_GPU_TABLE (a benchmark's comparison): "f32", the fp32
 * table (3xTF32) and the fp32 interaction; "f16", the fp16 table kernel and the fp32
 * interaction; "i8", the fp16 table kernel writing an int8 copy too, which the centroid
 * interaction reads where it can; else (the default) the same with an fp16 copy. The int8
 * copy reads half the bytes a row but moves approximate scores by up to 0.004 a query token;
 * measured against the fp16 copy it was faster on one corpus and slower on another
 * (engine/SEARCH.md), so it stays a choice.
 */
enum { TABLE_F32, TABLE_F16, TABLE_H16, TABLE_I8 };

/* TARTAN_GPU_TRACE=1: a line a chunk on stderr (its stages' wall time, each ended by a
 * download that waits for the GPU, and its exact rounds); 2: a line a round as well. For
 * finding where a batch's time goes without a profiler. */
static int trace_level(void)
{
    const char *e = getenv("TARTAN_GPU_TRACE");
    return e ? atoi(e) : 0;
}

/* TARTAN_GPU_ROUNDS=columns: the exact rounds over [nq, widest] with holes (the former
 * layout), for comparison; the default lists each round's pairs. */
static int rounds_by_columns(void)
{
    const char *e = getenv("TARTAN_GPU_ROUNDS");
    return e && !strcmp(e, "columns");
}

/* The exact rounds' first size and growth (ENG_GPU_FIRST_BATCH, ENG_GPU_BATCH_GROWTH), or
 * the environment's name's value within [lo, hi], for comparison. */
static double round_knob(const char *name, double def, double lo, double hi)
{
    const char *e = getenv(name);
    double v = e ? strtod(e, NULL) : def;
    return v >= lo && v <= hi ? v : def;
}

/* The score table's budget: a 64th of the device's memory, from ST_BUDGET up to twice that
 * (TARTAN_GPU_TABLE_MB, 64 to 16384, for comparison); the candidate matrices' budget keeps its
 * ratio to it. Why: a chunk's exact rounds end when its last query stops, so a chunk of more
 * queries takes fewer rounds and fills the GPU better in each. At 1M documents (K 131,072) on
 * an H200, 64 queries a chunk (1 GiB) gave 8,506-9,223 queries/s and 128 (2 GiB) 8,893-9,515
 * in the same calls; 4 and 8 GiB no more (8,746, 8,616). */
static size_t table_budget(eng_gpu *g)
{
    const char *e = getenv("TARTAN_GPU_TABLE_MB");
    long v = e ? strtol(e, NULL, 10) : 0;
    if (v >= 64 && v <= 16384)
        return (size_t)v << 20;
    if (!g->mem_total) {
        size_t fr = 0;
        if (kern_cuda_mem_info(&fr, &g->mem_total))
            g->mem_total = 1; /* unknown: the smallest budget */
    }
    size_t b = g->mem_total / 64;
    return b < ST_BUDGET ? ST_BUDGET : b > 2 * ST_BUDGET ? 2 * ST_BUDGET : b;
}

static int table_choice(void)
{
    const char *e = getenv("TARTAN_GPU_TABLE");
    if (!e)
        return TABLE_H16;
    return !strcmp(e, "f32")   ? TABLE_F32
           : !strcmp(e, "f16") ? TABLE_F16
           : !strcmp(e, "i8")  ? TABLE_I8
                               : TABLE_H16;
}

/* The fp16 copy of the centroids, kept when every value survives fp16 exactly and the
 * table kernel can take the dim. */
static int upload_c16(eng_gpu *g, const float *centroids, store_msg *m)
{
    g->c16_ok = 0;
    if (g->dim % 16 || table_choice() == TABLE_F32)
        return 0;
    size_t n = (size_t)g->K * g->dim;
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    if (!h)
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    size_t i = 0;
    for (; i < n; i++) {
        h[i] = kern_f32_to_f16(centroids[i]);
        if (kern_f16_to_f32(h[i]) != centroids[i])
            break;
    }
    int rc = 0;
    if (i == n && !(rc = dbuf_need(&g->c16, n * sizeof *h, 0, m))) {
        int krc = kern_cuda_upload(g->c16.p, h, n * sizeof *h);
        if (krc)
            rc = gpu_fail(krc, m, "upload");
        else
            g->c16_ok = 1;
    }
    free(h);
    return rc;
}

static int mirror_sync(eng_gpu *g, idx_reader *r, tartan_gpu_mode want, store_msg *m)
{
    const store_header *h = &r->h;
    tartan_gpu_mode mode = want;
    if (mode == TARTAN_GPU_AUTO) {
        size_t fr = 0, tot = 0;
        KTRY(kern_cuda_mem_info(&fr, &tot), "device memory");
        size_t mine = 0;
        eng_gpu_describe(g, NULL, &mine);
        mode = eng_gpu_resident_bytes(r) <= (fr + mine) / 10 * 8 ? TARTAN_GPU_RESIDENT
                                                                 : TARTAN_GPU_STREAMING;
        /* Stay as loaded while it still fits: no flapping between modes. */
        if (g->valid && g->mode == TARTAN_GPU_RESIDENT && eng_gpu_resident_bytes(r) <= (fr + mine))
            mode = TARTAN_GPU_RESIDENT;
    }
    const int axes = r->axes != NULL;
    if (g->valid && g->mode == mode && g->K == h->n_centroids && g->next_docno == h->next_docno &&
        g->n_docs == h->n_docs && g->axes == axes)
        return 0;
    int full = !g->valid || g->mode != mode || g->K != h->n_centroids || g->dim != h->dim ||
               g->nbits != h->nbits || h->next_docno < g->next_docno ||
               g->dead_tok > g->n_tok / 2 || g->axes != axes;
    int rc = 0;
    if (full) {
        mirror_reset(g);
        g->mode = mode;
        g->K = h->n_centroids;
        g->dim = h->dim;
        g->nbits = h->nbits;
        g->rbytes = h->token_bytes;
        if ((rc = dbuf_need(&g->centroids, (size_t)g->K * g->dim * 4, 0, m)) ||
            (rc = dbuf_need(&g->weights, sizeof r->codec.weights, 0, m)))
            return rc;
        KTRY(kern_cuda_upload(g->centroids.p, r->centroids, (size_t)g->K * g->dim * 4),
             "upload");
        KTRY(kern_cuda_upload(g->weights.p, r->codec.weights, sizeof r->codec.weights), "upload");
        if ((rc = upload_c16(g, r->centroids, m)))
            return rc;
        if (axes) {
            const size_t nd = idx_axes_decode_floats(r->axes) * 4, nr = g->dim * g->dim * 4;
            if ((rc = dbuf_need(&g->axes_dec, nd, 0, m)) || (rc = dbuf_need(&g->rot, nr, 0, m)))
                return rc;
            KTRY(kern_cuda_upload(g->axes_dec.p, r->axes_dec, nd), "upload");
            KTRY(kern_cuda_upload(g->rot.p, r->axes->rot, nr), "upload");
            memcpy(g->axes_bytes, r->axes_bytes, sizeof g->axes_bytes);
            g->axes_additive = r->axes_additive;
            g->axes = 1;
        }
        free(g->seen);
        g->seen = malloc(((size_t)g->K ? g->K : 1) * sizeof *g->seen);
        if (!g->seen || eng_grow((void **)&g->h_doc_off, &g->h_doc_cap, 1, sizeof(int64_t)) ||
            eng_grow((void **)&g->h_udoc_off, &g->h_udoc_cap, 1, sizeof(int64_t)))
            return store_fail(m, ENOMEM, "GPU search: out of memory");
        memset(g->seen, 0xff, (size_t)g->K * sizeof *g->seen);
        g->h_doc_off[0] = 0;
        g->h_udoc_off[0] = 0;
    }
    g->valid = 0; /* until the end: a failure leaves a mirror that reloads */
    size_t words = ((size_t)h->next_docno + 31) / 32;
    if (eng_grow((void **)&g->h_live, &g->h_live_words, words ? words : 1, sizeof(uint32_t)))
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    uint32_t from = full ? 0 : g->next_docno;
    memset(g->h_live + (from >> 5) + ((from & 31) ? 1 : 0), 0,
           (words - (from >> 5) - ((from & 31) ? 1 : 0)) * sizeof(uint32_t));
    if (from & 31)
        g->h_live[from >> 5] &= (1u << (from & 31)) - 1;
    /* Each staging buffer on its own: after a failed allocation of one, the next load
     * allocates what is missing (testing the first alone had left the others NULL). */
    if (!g->s_codes)
        g->s_codes = malloc(STAGE_TOKENS * 4);
    if (!g->s_ucodes)
        g->s_ucodes = malloc(STAGE_TOKENS * 4);
    if (!g->s_res)
        g->s_res = malloc(STAGE_TOKENS * (g->rbytes ? g->rbytes : 1));
    if (!g->s_norms)
        g->s_norms = malloc(STAGE_TOKENS * 4);
    if (!g->s_codes || !g->s_ucodes || !g->s_res || !g->s_norms)
        return store_fail(m, ENOMEM, "GPU search: out of memory for staging");
    g->s_n = g->s_un = 0;
    int verify = r->verify;
    if (full) {
        /* Every document, in number order, checksums verified once here. */
        r->verify = 1;
        store_cursor *cur = NULL;
        uint32_t d;
        kern_pdoc pd;
        while ((rc = idx_reader_next_doc(r, &cur, &d, &pd, m)) == 1)
            if ((rc = append_doc(g, r, d, &pd, m)))
                break;
        if (rc > 0 || cur)
            idx_reader_docs_end(cur);
    } else {
        r->verify = 1;
        for (uint32_t d = from; d < h->next_docno && !rc; d++) {
            kern_pdoc pd;
            rc = idx_reader_doc(r, d, &pd, m);
            if (rc == TARTAN_ENOTFOUND) {
                rc = 0;
                continue;
            }
            if (!rc)
                rc = append_doc(g, r, d, &pd, m);
        }
    }
    r->verify = verify;
    if (rc)
        return rc;
    /* Numbers past the last live document still get their (empty) runs. */
    if (eng_grow((void **)&g->h_doc_off, &g->h_doc_cap, (size_t)h->next_docno + 1,
                 sizeof(int64_t)) ||
        eng_grow((void **)&g->h_udoc_off, &g->h_udoc_cap, (size_t)h->next_docno + 1,
                 sizeof(int64_t)))
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    for (uint32_t x = g->next_docno; x < h->next_docno; x++) {
        g->h_doc_off[x + 1] = g->h_doc_off[x];
        g->h_udoc_off[x + 1] = g->h_udoc_off[x];
    }
    g->next_docno = h->next_docno;
    if ((rc = flush_stage(g, m)))
        return rc;
    /* Deletions among the older documents: the live count says whether there were any. */
    if (!full && g->n_docs != h->n_docs) {
        uint32_t *seen = calloc(words ? words : 1, sizeof *seen);
        if (!seen)
            return store_fail(m, ENOMEM, "GPU search: out of memory");
        r->verify = 0;
        store_cursor *cur = NULL;
        uint32_t d;
        kern_pdoc pd;
        while ((rc = idx_reader_next_doc(r, &cur, &d, &pd, m)) == 1)
            if (d < h->next_docno)
                seen[d >> 5] |= 1u << (d & 31);
        r->verify = verify;
        if (rc) {
            if (cur)
                idx_reader_docs_end(cur);
            free(seen);
            return rc;
        }
        uint64_t n = 0;
        for (size_t w = 0; w < words; w++) {
            uint32_t gone = g->h_live[w] & ~seen[w];
            for (uint32_t x = gone; x; x &= x - 1) {
                uint32_t dd = (uint32_t)(w * 32 + (unsigned)__builtin_ctz(x));
                g->dead_tok += (size_t)(g->h_doc_off[dd + 1] - g->h_doc_off[dd]);
            }
            g->h_live[w] &= seen[w];
            n += (uint64_t)__builtin_popcount(g->h_live[w]);
        }
        free(seen);
        g->n_docs = n;
    }
    if (g->n_docs != h->n_docs)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the index counts %llu live documents but holds %llu",
                          (unsigned long long)h->n_docs, (unsigned long long)g->n_docs);
    /* Offsets, live bits, the live list, then the inverted lists from them. */
    size_t nd = g->next_docno;
    if ((rc = dbuf_need(&g->doc_off, (nd + 1) * 8, 0, m)) ||
        (rc = dbuf_need(&g->udoc_off, (nd + 1) * 8, 0, m)) ||
        (rc = dbuf_need(&g->live, (words ? words : 1) * 4, 0, m)))
        return rc;
    KTRY(kern_cuda_upload(g->doc_off.p, g->h_doc_off, (nd + 1) * 8), "upload");
    KTRY(kern_cuda_upload(g->udoc_off.p, g->h_udoc_off, (nd + 1) * 8), "upload");
    if (words)
        KTRY(kern_cuda_upload(g->live.p, g->h_live, words * 4), "upload");
    uint32_t *alive = malloc((g->n_docs ? g->n_docs : 1) * sizeof *alive);
    if (!alive)
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    size_t na = 0;
    for (size_t w = 0; w < words; w++)
        for (uint32_t x = g->h_live[w]; x; x &= x - 1)
            alive[na++] = (uint32_t)(w * 32 + (unsigned)__builtin_ctz(x));
    rc = dbuf_need(&g->alive, (na ? na : 1) * 4, 0, m);
    if (!rc && na) {
        int krc = kern_cuda_upload(g->alive.p, alive, na * 4);
        if (krc)
            rc = gpu_fail(krc, m, "upload");
    }
    free(alive);
    if (rc)
        return rc;
    g->n_alive = na;
    size_t entries = 0;
    if ((rc = dbuf_need(&g->ivf_off, ((size_t)g->K + 1) * 8, 0, m)) ||
        (rc = dbuf_need(&g->ivf_scratch, (size_t)g->K * 8, 0, m)))
        return rc;
    KTRY(kern_cuda_build_ivf(g->doc_off.p, g->codes.p ? g->codes.p : g->ivf_scratch.p,
                             g->live.p, nd, g->K, g->ivf_off.p, g->ivf_scratch.p, NULL, &entries),
         "inverted lists");
    if ((rc = dbuf_need(&g->ivf_docs, (entries ? entries : 1) * 4, 0, m)))
        return rc;
    KTRY(kern_cuda_build_ivf(g->doc_off.p, g->codes.p ? g->codes.p : g->ivf_scratch.p,
                             g->live.p, nd, g->K, g->ivf_off.p, g->ivf_scratch.p, g->ivf_docs.p,
                             &entries),
         "inverted lists");
    KTRY(kern_cuda_sync(), "inverted lists");
    g->valid = 1;
    return 0;
}

/* ---- streaming: documents for the exact stage ----------------------------------------- */

/*
 * Reads the documents docs [n] (KERN_NO_DOC allowed) from the map (checksums verified) into
 * slot x's page-locked block, and makes room for it on the device; upload_slot copies it.
 */
static int stage_docs(eng_gpu *g, idx_reader *r, xslot *x, const uint32_t *docs, size_t n,
                      store_msg *m)
{
    size_t ntok = 0;
    int rc = 0;
    kern_pdoc *pd = malloc((n ? n : 1) * sizeof *pd);
    if (!pd)
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    int verify = r->verify;
    r->verify = 1;
    for (size_t i = 0; i < n && !rc; i++) {
        if (docs[i] == KERN_NO_DOC) {
            pd[i].ntok = 0;
            continue;
        }
        rc = idx_reader_doc(r, docs[i], &pd[i], m);
        if (rc == TARTAN_ENOTFOUND)
            rc = store_fail(m, TARTAN_ECORRUPT, "document %u vanished", docs[i]);
        ntok += pd[i].ntok;
    }
    r->verify = verify;
    if (rc) {
        free(pd);
        return rc;
    }
    x->o_docs = (n + 1) * 8;
    x->o_codes = x->o_docs + n * 4;
    x->o_norms = x->o_codes + ntok * 4;
    x->o_res = (x->o_norms + ntok * 4 + 15) / 16 * 16;
    x->bytes = x->o_res + ntok * g->rbytes;
    if (x->bytes > x->pin_cap) {
        kern_cuda_host_free(x->pin);
        x->pin = NULL;
        x->pin_cap = 0;
        int krc = kern_cuda_host_alloc(&x->pin, x->bytes + x->bytes / 2);
        if (krc) {
            free(pd);
            return gpu_fail(krc, m, "page-locked memory");
        }
        x->pin_cap = x->bytes + x->bytes / 2;
    }
    char *b = x->pin;
    int64_t *off = (int64_t *)b;
    uint32_t *xd = (uint32_t *)(b + x->o_docs), *codes = (uint32_t *)(b + x->o_codes);
    float *norms = (float *)(b + x->o_norms);
    uint8_t *res = (uint8_t *)(b + x->o_res);
    size_t at = 0;
    const unsigned cb = r->h.code_bytes;
    off[0] = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        xd[i] = docs[i] == KERN_NO_DOC ? KERN_NO_DOC : (uint32_t)i;
        for (uint32_t t = 0; t < pd[i].ntok; t++) {
            uint32_t c = cb == 2 ? ((const uint16_t *)pd[i].codes)[t]
                                 : ((const uint32_t *)pd[i].codes)[t];
            if (c >= g->K) {
                rc = store_fail(m, TARTAN_ECORRUPT,
                                "document %u: token %u has code %u, past %u centroids", docs[i],
                                t, c, g->K);
                break;
            }
            codes[at + t] = c;
        }
        memcpy(norms + at, pd[i].inv_norms, (size_t)pd[i].ntok * 4);
        memcpy(res + at * g->rbytes, pd[i].residuals, (size_t)pd[i].ntok * g->rbytes);
        at += pd[i].ntok;
        off[i + 1] = (int64_t)at;
    }
    free(pd);
    if (rc)
        return rc;
    return dbuf_need(&x->dev, x->bytes, 0, m);
}

/* Slot x's block to the device: through the copier's slot s, or on the kernels' stream. */
static int upload_slot(eng_gpu *g, xslot *x, int s, store_msg *m)
{
    if (g->copier)
        KTRY(kern_cuda_copier_upload(g->copier, s, x->dev.p, x->pin, x->bytes), "upload");
    else
        KTRY(kern_cuda_upload_async(x->dev.p, x->pin, x->bytes), "upload");
    return 0;
}

/* The exact stage reads slot x's documents. */
static void slot_args(const xslot *x, kern_cuda_exact *a)
{
    char *d = x->dev.p;
    a->doc_off = (const int64_t *)d;
    a->docs = (const uint32_t *)(d + x->o_docs);
    a->codes = (const uint32_t *)(d + x->o_codes);
    a->inv_norms = (const float *)(d + x->o_norms);
    a->residuals = (const uint8_t *)(d + x->o_res);
}

/* ---- one chunk of queries -------------------------------------------------------------- */

typedef struct chunk {
    size_t qa, nq;     /* queries [qa, qa + nq) */
    int64_t *h_off;    /* [nq + 1] token offsets within the chunk */
    size_t T;          /* tokens */
    int narrow;        /* ST16 holds a copy of the table for the interaction: TABLE_H16 (fp16),
                        * TABLE_I8 (int8), or 0: none */
    int colbest;       /* the table kernel wrote each column's best into g->colbest */
    int tiles;         /* ... and each tile's into g->tilekey, for the probe */
} chunk;

/* Whether the centroid interaction reads each document's distinct codes (the default) or
 * all of them (TARTAN_GPU_CODES=all, a benchmark's comparison): the same sums. */
static int distinct_codes(void)
{
    const char *e = getenv("TARTAN_GPU_CODES");
    return !(e && !strcmp(e, "all"));
}

/* The centroid interaction of docs [nq, width] into approx: from the narrow copy of the table
 * where the chunk has one, else from ST; over each document's distinct codes. */
static int interaction(eng_gpu *g, const chunk *c, const uint32_t *docs, size_t width, int prune,
                       const int64_t *counts, int64_t prune_over, float threshold, float *approx,
                       store_msg *m)
{
    const int u = distinct_codes() && g->ucodes.p;
    const int64_t *off = u ? g->udoc_off.p : g->doc_off.p;
    const uint32_t *codes = u ? g->ucodes.p : g->codes.p;
    KTRY(c->narrow == TABLE_I8
             ? kern_cuda_interaction_i8(g->ST.p, g->ST16.p, g->K, c->T, g->q_off.p, c->h_off, c->nq,
                                        off, codes, docs, width, prune, counts, prune_over,
                                        threshold, approx)
         : c->narrow == TABLE_H16
             ? kern_cuda_interaction_h16(g->ST.p, g->ST16.p, g->K, c->T, g->q_off.p, c->h_off,
                                         c->nq, off, codes, docs, width, prune, counts, prune_over,
                                         threshold, approx)
             : kern_cuda_interaction(g->ST.p, g->K, c->T, g->q_off.p, c->h_off, c->nq, off, codes,
                                     docs, width, prune, counts, prune_over, threshold, approx),
         "centroid interaction");
    return 0;
}

/* The exact stage over docs [nq, per_q] (or the one list with cross) of the mirror, or in
 * streaming mode of documents copied over for it. */
static int exact_stage(eng_gpu *g, idx_reader *r, const chunk *c, const uint32_t *docs,
                       size_t per_q, int cross, const uint32_t *pair_q, const xslot *staged,
                       float *scores, store_msg *m)
{
    kern_cuda_exact a = {
        .dim = g->dim,
        .nbits = g->nbits,
        .q = g->axes ? g->qrot.p : g->q.p,
        .q_off = g->q_off.p,
        .h_q_off = c->h_off,
        .nq = c->nq,
        .ST = g->ST.p,
        .ld = c->T,
        .n_centroids = g->K,
        .bucket_weights = g->weights.p,
        .doc_off = g->doc_off.p,
        .codes = g->codes.p,
        .residuals = g->residuals.p,
        .inv_norms = g->norms.p,
        .docs = docs,
        .per_q = per_q,
        .cross = cross,
        .pair_q = pair_q,
        .axes_dec = g->axes ? g->axes_dec.p : NULL,
    };
    memcpy(a.axes_bytes, g->axes_bytes, sizeof a.axes_bytes);
    a.axes_additive = g->axes_additive;
    if (staged) {
        slot_args(staged, &a);
    } else if (g->mode == TARTAN_GPU_STREAMING) {
        /* The documents of this stage, read now (one round trip for their numbers). */
        size_t n = cross || pair_q ? per_q : c->nq * per_q;
        uint32_t *h = malloc((n ? n : 1) * 4);
        if (!h)
            return store_fail(m, ENOMEM, "GPU search: out of memory");
        int krc = kern_cuda_download(h, docs, n * 4);
        int rc = krc ? gpu_fail(krc, m, "download") : stage_docs(g, r, &g->xs[0], h, n, m);
        free(h);
        if (!rc && g->copier)
            rc = kern_cuda_copier_host_wait(g->copier, 0);
        if (!rc)
            rc = upload_slot(g, &g->xs[0], 0, m);
        if (!rc && g->copier && (krc = kern_cuda_copier_ready(g->copier, 0)))
            rc = gpu_fail(krc, m, "copy");
        if (rc)
            return rc;
        slot_args(&g->xs[0], &a);
    }
    KTRY(kern_cuda_exact_scores(&a, scores), "exact scoring");
    return 0;
}

/* Top k of scores [nq, n] over docs (the same shape, or the one list with cross): the hits
 * go to docs4 / vals [nq, k]. */
static int final_topk(eng_gpu *g, const chunk *c, const float *scores, size_t n,
                      const uint32_t *docs, int cross, size_t k, store_msg *m)
{
    int rc;
    if ((rc = dbuf_need(&g->sel, c->nq * k * 8, 0, m)) ||
        (rc = dbuf_need(&g->vals, c->nq * k * 4, 0, m)) ||
        (rc = dbuf_need(&g->docs4, c->nq * k * 4, 0, m)))
        return rc;
    KTRY(kern_topk_rows(KERN_DEV_CUDA, scores, c->nq, n, k, g->sel.p, g->vals.p), "top-k");
    if (cross) {
        /* One list for all queries: gather from it with width 0 (row 0 for every query). */
        KTRY(kern_cuda_gather_docs(docs, 0, g->sel.p, c->nq, k, g->docs4.p), "gather");
    } else {
        KTRY(kern_cuda_gather_docs(docs, n, g->sel.p, c->nq, k, g->docs4.p), "gather");
    }
    return 0;
}

/*
 * Streaming exhaustive search: the listed documents in slices, each read from the map into a
 * page-locked slot, copied on the copier's stream while the previous slice is scored, scored
 * against the chunk's queries and cut to its top k on the device; the slices' top k merge on
 * the host.
 */
static int exhaustive_slices(eng_gpu *g, idx_reader *r, const eng_search *s, const chunk *c,
                             const uint32_t *list, size_t n_list, store_msg *m)
{
    const size_t nq = c->nq;
    int rc = 0, krc;
    if (!g->copier && (krc = kern_cuda_copier_new(&g->copier, 2)))
        return gpu_fail(krc, m, "copy stream");
    kern_topk **tk = calloc(nq, sizeof *tk);
    uint32_t *hd = malloc(nq * s->k * 4);
    float *hv = malloc(nq * s->k * 4);
    int64_t *ids = malloc(nq * s->k * 8);
    if (!tk || !hd || !hv || !ids)
        rc = store_fail(m, ENOMEM, "GPU search: out of memory");
    for (size_t i = 0; i < nq && !rc; i++)
        if (!(tk[i] = kern_topk_new(s->k)))
            rc = store_fail(m, ENOMEM, "GPU search: out of memory");
    if (!rc)
        rc = dbuf_need(&g->scores, nq * g->slice_docs * 4, 0, m);
    size_t pend_k = 0; /* results of the previous slice still on the device: its k */
    const size_t slice = g->slice_docs;
    for (size_t s0 = 0, i = 0; !rc && (s0 < n_list || pend_k); s0 += slice, i++) {
        const int slot = (int)(i & 1);
        size_t n = s0 < n_list ? (n_list - s0 < slice ? n_list - s0 : slice) : 0;
        if (n) {
            /* Read and copy slice i while slice i - 1 is scored. */
            uint32_t *h = malloc(n * 4);
            if (!h) {
                rc = store_fail(m, ENOMEM, "GPU search: out of memory");
                break;
            }
            krc = kern_cuda_download(h, list + s0, n * 4);
            if (krc)
                rc = gpu_fail(krc, m, "download");
            if (!rc && (krc = kern_cuda_copier_host_wait(g->copier, slot)))
                rc = gpu_fail(krc, m, "copy");
            if (!rc)
                rc = stage_docs(g, r, &g->xs[slot], h, n, m);
            free(h);
            if (!rc)
                rc = upload_slot(g, &g->xs[slot], slot, m);
            if (rc)
                break;
        }
        if (pend_k) {
            /* The previous slice's top k (waits for its kernels, not for the copy above). */
            krc = kern_cuda_download(hd, g->docs4.p, nq * pend_k * 4);
            if (!krc)
                krc = kern_cuda_download(hv, g->vals.p, nq * pend_k * 4);
            if (krc) {
                rc = gpu_fail(krc, m, "download");
                break;
            }
            for (size_t q = 0; q < nq && !rc; q++) {
                size_t h = 0;
                for (; h < pend_k && hd[q * pend_k + h] != KERN_NO_DOC &&
                       hv[q * pend_k + h] > -INFINITY;
                     h++)
                    ids[h] = hd[q * pend_k + h];
                if (h && kern_topk_push(tk[q], hv + q * pend_k, ids, h))
                    rc = store_fail(m, ENOMEM, "GPU search: out of memory");
            }
            pend_k = 0;
        }
        if (!n || rc)
            continue;
        size_t kk = s->k < n ? s->k : n;
        if ((krc = kern_cuda_copier_ready(g->copier, slot))) {
            rc = gpu_fail(krc, m, "copy");
            break;
        }
        if ((rc = exact_stage(g, r, c, list + s0, n, 1, NULL, &g->xs[slot], g->scores.p, m)) ||
            (rc = final_topk(g, c, g->scores.p, n, list + s0, 1, kk, m)))
            break;
        if ((krc = kern_cuda_copier_release(g->copier, slot))) {
            rc = gpu_fail(krc, m, "copy");
            break;
        }
        pend_k = kk;
    }
    for (size_t i = 0; i < nq && !rc; i++) {
        size_t qi = c->qa + i;
        size_t h = kern_topk_take(tk[i], ids, hv);
        for (size_t j = 0; j < h; j++) {
            s->hit_doc[qi * s->k + j] = (uint32_t)ids[j];
            s->hit_score[qi * s->k + j] = hv[j];
        }
        s->hit_n[qi] = h;
    }
    for (size_t i = 0; tk && i < nq; i++)
        kern_topk_free(tk[i]);
    free(tk);
    free(hd);
    free(hv);
    free(ids);
    return rc;
}

/*
 * The adaptive stages of one chunk (engine/SEARCH.md) over the candidates docs1 [nq, width]:
 * unpruned (unless s->prune) centroid interaction, then exact scoring in rounds by the same
 * rule as the CPU's (search_plaid.c): each query's candidates in order of approximate score,
 * done[q] of them scored so far into exact_all [nq, cap] (NaN elsewhere); a round scores
 * columns [done[q], next[q]) of every query at once, then the stopping rule on the device
 * (kern_cuda_adaptive_next) gives the next round's next[q]; the rounds end when no query goes
 * on. The rounds are larger than the CPU's (ENG_GPU_FIRST_BATCH, ENG_GPU_BATCH_GROWTH: a round
 * costs launches and a download here), the rule the same. The best *k of each query's scored
 * documents go to docs4 / vals (*k lowered to what fits). *n_exact: exact scores counted.
 */
static int adaptive_stages(eng_gpu *g, idx_reader *r, const eng_search *s, const chunk *c,
                           size_t width, const int64_t *counts, size_t *n_exact, size_t *k,
                           eng_stage_stats *st, double *t0, store_msg *m)
{
    const int trace = trace_level();
    const size_t nq = c->nq;
    const size_t cap = s->depth_cap < width ? s->depth_cap : width;
    const size_t first0 = round_knob("TARTAN_GPU_FIRST", ENG_GPU_FIRST_BATCH, 16, 4096);
    const double growth = round_knob("TARTAN_GPU_GROWTH", ENG_GPU_BATCH_GROWTH, 1.2, 10.0);
    const size_t first = 2 * s->k > first0 ? 2 * s->k : first0;
    int rc, krc = 0;
    if ((rc = dbuf_need(&g->done, nq * 8, 0, m)) || (rc = dbuf_need(&g->next, nq * 8, 0, m)) ||
        (rc = dbuf_need(&g->exact_all, nq * cap * 4, 0, m)) ||
        (rc = dbuf_need(&g->sel, nq * cap * 8, 0, m)) ||
        (rc = dbuf_need(&g->approx2, nq * cap * 4, 0, m)) ||
        (rc = dbuf_need(&g->docs2, nq * cap * 4, 0, m)) ||
        (rc = dbuf_need(&g->docs3, nq * cap * 4, 0, m)) ||
        (rc = dbuf_need(&g->scores, nq * cap * 4, 0, m)) ||
        (rc = dbuf_need(&g->pair_q, nq * cap * 4, 0, m)) ||
        (rc = dbuf_need(&g->poff, (nq + 1) * 8, 0, m)))
        return rc;
    if ((rc = interaction(g, c, g->docs1.p, width, s->prune, NULL, 0, s->threshold, g->approx1.p,
                          m)))
        return rc;
    int64_t *h = malloc((nq * 3 + 1) * 8);
    if (!h)
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    int64_t *done = h, *next = h + nq, *poff = h + 2 * nq;
    const int columns = rounds_by_columns();
    if (trace && (krc = kern_cuda_sync()))
        goto dev_fail;
    double t1 = eng_now();
    const double t_ix = t1 - *t0;
    st->prune += t1 - *t0; /* the launch alone, unless traced: the kernels run on */
    *t0 = t1;
    for (size_t q = 0; q < nq; q++) {
        size_t v = (size_t)counts[q] < cap ? (size_t)counts[q] : cap;
        done[q] = 0;
        next[q] = (int64_t)(first < v ? first : v);
    }
    /* NaN (all bytes 0xff) where nothing was scored: top-k never selects it. */
    if ((krc = kern_cuda_memset(g->exact_all.p, 0xff, nq * cap * 4)) ||
        (krc = kern_cuda_upload(g->done.p, done, nq * 8)) ||
        (krc = kern_cuda_upload(g->next.p, next, nq * 8)))
        goto dev_fail;
    /* Every query's candidates in order as deep as any round may go (cap), once: a top-k
     * orders its leading columns as a narrower one would, so each round takes the next
     * columns of this order. Why once: a top-k per round read every candidate column again
     * (its histogram passes), and the top-k machinery was 30% of a batch's GPU time at 1M
     * documents (ncu, H200). */
    if ((krc =
             kern_topk_rows(KERN_DEV_CUDA, g->approx1.p, nq, width, cap, g->sel.p, g->approx2.p)) ||
        (krc = kern_cuda_gather_docs(g->docs1.p, width, g->sel.p, nq, cap, g->docs2.p)))
        goto dev_fail;
    size_t D = 0; /* columns scored as far as any query went */
    int rounds = 0;
    size_t pairs = 0;
    for (;;) {
        /* The round: query q's columns [done[q], next[q]). */
        size_t dn = 0, dmin = SIZE_MAX, np = 0, act = 0;
        poff[0] = 0;
        for (size_t q = 0; q < nq; q++) {
            dn = (size_t)next[q] > dn ? (size_t)next[q] : dn;
            const size_t w = next[q] > done[q] ? (size_t)(next[q] - done[q]) : 0;
            if (w && (size_t)done[q] < dmin)
                dmin = (size_t)done[q];
            np += w;
            act += w > 0;
            poff[q + 1] = (int64_t)np;
        }
        if (np == 0)
            break; /* every query has stopped */
        if (trace > 1)
            fprintf(stderr,
                    "tartan trace: round %d: columns %zu-%zu, %zu queries, %zu pairs, "
                    "%.3f ms\n",
                    rounds, dmin, dn, act, np, 1e3 * (eng_now() - t1));
        pairs += np;
        rounds++;
        D = dn > D ? dn : D;
        if (columns) {
            /* The former layout, for comparison: [nq, dn - dmin] with holes. */
            if ((krc = kern_cuda_take_columns(g->docs2.p, cap, dmin, dn, g->done.p, g->next.p, nq,
                                              g->docs3.p)))
                goto dev_fail;
            if ((rc = exact_stage(g, r, c, g->docs3.p, dn - dmin, 0, NULL, NULL, g->scores.p, m)))
                goto fail;
            if ((krc = kern_cuda_scatter_columns(g->scores.p, dn - dmin, dmin, g->done.p, g->next.p,
                                                 nq, g->exact_all.p, cap)))
                goto dev_fail;
        } else {
            /* The round's pairs as one list: a round where a few queries go on is a few pairs,
             * not nq rows as wide as the widest (which the exact kernel claimed one by one). */
            if ((krc = kern_cuda_upload(g->poff.p, poff, (nq + 1) * 8)) ||
                (krc = kern_cuda_round_pairs(g->docs2.p, cap, g->done.p, g->poff.p, nq, np,
                                             g->docs3.p, g->pair_q.p)))
                goto dev_fail;
            if ((rc = exact_stage(g, r, c, g->docs3.p, np, 0, g->pair_q.p, NULL, g->scores.p, m)))
                goto fail;
            if ((krc = kern_cuda_round_scatter(g->scores.p, g->pair_q.p, np, g->done.p, g->poff.p,
                                               g->exact_all.p, cap)))
                goto dev_fail;
        }
        if ((krc = kern_cuda_copy_d2d(g->done.p, g->next.p, nq * 8)) ||
            (krc = kern_cuda_adaptive_next(g->exact_all.p, cap, g->approx2.p, cap, g->done.p,
                                           g->counts.p, nq, s->k, s->z, s->tail_eps, growth, cap,
                                           g->next.p)))
            goto dev_fail;
        memcpy(done, next, nq * 8);
        if ((krc = kern_cuda_download(next, g->next.p, nq * 8)))
            goto dev_fail;
    }
    *n_exact = 0;
    for (size_t q = 0; q < nq; q++)
        *n_exact += (size_t)done[q];
    if (trace)
        fprintf(stderr,
                "tartan trace: chunk %zu queries, %zu candidate columns: interaction %.3f ms, "
                "%d exact rounds %.3f ms (%zu pairs scored, %zu columns of work)\n",
                nq, width, 1e3 * t_ix, rounds, 1e3 * (eng_now() - t1), pairs, nq * D);
    free(h);
    h = NULL;
    if (D == 0) {
        *k = 0;
        return 0;
    }
    *k = s->k < D ? s->k : D;
    if ((rc = dbuf_need(&g->vals, nq * *k * 4, 0, m)) ||
        (rc = dbuf_need(&g->docs4, nq * *k * 4, 0, m)))
        return rc;
    /* The scored documents' best: their columns index the order (docs2). */
    KTRY(kern_topk_rows(KERN_DEV_CUDA, g->exact_all.p, nq, cap, *k, g->sel.p, g->vals.p), "top-k");
    KTRY(kern_cuda_gather_docs(g->docs2.p, cap, g->sel.p, nq, *k, g->docs4.p), "gather");
    return 0;
dev_fail:
    rc = gpu_fail(krc, m, "adaptive stages");
fail:
    free(h);
    return rc;
}

/* Which margins the columns of a chunk probe with: the one margin; each query its own
 * (s->margin_q); or, widening, INFINITY for the queries with fewer than k candidates (counts
 * below s->k) and none for the others. */
enum probe_how { PROBE_ALL, PROBE_OWN, PROBE_WIDEN };

/* Each token's probes, then the candidates they reach marked in the queries' bitmaps and
 * counted (newly set bits only: a second pass adds to the first). */
static int probe_and_mark(eng_gpu *g, const eng_search *s, const chunk *c, enum probe_how how,
                          float margin, const int64_t *counts, size_t words, store_msg *m)
{
    const float *colm = NULL;
    int rc;
    if (how != PROBE_ALL) {
        float *h = malloc(c->T * sizeof *h);
        if (!h)
            return store_fail(m, ENOMEM, "GPU search: out of memory");
        for (size_t i = 0; i < c->nq; i++) {
            float mi = how == PROBE_OWN           ? s->margin_q[c->qa + i]
                       : (size_t)counts[i] < s->k ? INFINITY
                                                  : -1.f;
            for (int64_t t = c->h_off[i]; t < c->h_off[i + 1]; t++)
                h[t] = mi;
        }
        int krc = 0;
        if (!(rc = dbuf_need(&g->colm, c->T * sizeof *h, 0, m)))
            krc = kern_cuda_upload(g->colm.p, h, c->T * sizeof *h);
        free(h);
        if (rc)
            return rc;
        if (krc)
            return gpu_fail(krc, m, "upload");
        colm = g->colm.p;
    }
    int krc = kern_cuda_probe(g->ST.p, g->K, c->T, s->ncells, margin, colm,
                              c->colbest ? g->colbest.p : NULL,
                              c->colbest && c->tiles ? g->tilekey.p : NULL, g->probes.p);
    if (!krc)
        krc = kern_cuda_candidates_mark(
            g->probes.p, s->ncells, g->q_off.p, c->h_off, c->nq, g->ivf_off.p, g->ivf_docs.p,
            g->live.p, s->allowed ? g->allowed.p : NULL, words, g->bits.p, g->counts.p);
    return krc ? gpu_fail(krc, m, how == PROBE_WIDEN ? "widening probes" : "probes") : 0;
}

static int run_chunk(eng_gpu *g, idx_reader *r, const eng_search *s, int exhaustive, chunk *c,
                     eng_stage_stats *st, store_msg *m)
{
    const eng_queries *q = s->q;
    const size_t K = g->K, nq = c->nq, words = ((size_t)g->next_docno + 31) / 32;
    int rc;
    double t0 = eng_now();
    /* Queries and the score table. */
    if ((rc = dbuf_need(&g->q, c->T * g->dim * 4, 0, m)) ||
        (rc = dbuf_need(&g->q_off, (nq + 1) * 8, 0, m)) ||
        (rc = dbuf_need(&g->ST, (K * c->T + KERN_CUDA_ST_SLACK) * 4, 0, m)))
        return rc;
    KTRY(kern_cuda_upload(g->q.p, q->emb + q->off[c->qa] * g->dim, c->T * g->dim * 4), "upload");
    KTRY(kern_cuda_upload(g->q_off.p, c->h_off, (nq + 1) * 8), "upload");
    /* The axes code scores residuals against the rotated queries: qrot [T, dim], row t the
     * rotation's rows' products with query token t. */
    if (g->axes && (rc = dbuf_need(&g->qrot, c->T * g->dim * 4, 0, m)))
        return rc;
    if (g->axes)
        KTRY(kern_centroid_scores(KERN_DEV_CUDA, g->q.p, c->T, g->rot.p, g->dim, g->dim, g->qrot.p),
             "query rotation");
    /* The narrow copy for the interaction: where the table kernel can write it, the search is
     * adaptive (its interaction reads tens of thousands of candidates' rows a query; the fixed
     * stages read too few to pay for writing the copy: 16,807 queries/s without it, 15,528
     * with, at 1M documents on an H200), and every query's columns start at a multiple of 8. */
    const int choice = table_choice();
    int narrow = g->c16_ok && choice >= TABLE_H16 && !exhaustive && !s->subset_exact &&
                 s->adaptive && c->T % 8 == 0;
    for (size_t i = 0; narrow && i <= nq; i++)
        narrow = c->h_off[i] % 8 == 0;
    c->narrow = narrow ? choice : 0;
    const size_t elem = c->narrow == TABLE_I8 ? 1 : 2;
    if (c->narrow && (rc = dbuf_need(&g->ST16, (K * c->T + KERN_CUDA_ST_SLACK) * elem, 0, m)))
        return rc;
    /* The copy in blocks of the queries' columns (kernels.h), each column's block found on
     * the device (a copy from the host would wait for it); one query's block is the whole
     * table, which is the layout without blocks. */
    const char *bl = getenv("TARTAN_GPU_BLOCKS"); /* "off": [K, T], for comparison */
    const int blocks = c->narrow && nq > 1 && !(bl && !strcmp(bl, "off"));
    if (blocks && (rc = dbuf_need(&g->blk, c->T * 2 * sizeof(int32_t), 0, m)))
        return rc;
    if (blocks)
        KTRY(kern_cuda_table_blk(g->q_off.p, nq, c->T, g->blk.p), "table blocks");
    /* Each column's best, for the probe's margin, found as the table is written (the probe
     * would read the table once more for it); TARTAN_GPU_COLBEST=probe: by the probe, for
     * comparison. With them, each tile's best of each column, so that the probe reads only the
     * tiles where it may keep a row (TARTAN_GPU_TILES=off: every row, for comparison). */
    const char *cb = getenv("TARTAN_GPU_COLBEST"), *tl = getenv("TARTAN_GPU_TILES");
    c->colbest = g->c16_ok && !exhaustive && !s->subset_exact && s->margin < INFINITY &&
                 !(cb && !strcmp(cb, "probe"));
    c->tiles = c->colbest && !(tl && !strcmp(tl, "off"));
    if (c->colbest && (rc = dbuf_need(&g->colbest, c->T * sizeof(unsigned), 0, m)))
        return rc;
    const size_t tile_rows = (K + KERN_CUDA_TILE_ROWS - 1) / KERN_CUDA_TILE_ROWS;
    if (c->tiles && (rc = dbuf_need(&g->tilekey, tile_rows * c->T * sizeof(unsigned), 0, m)))
        return rc;
    unsigned *colbest = c->colbest ? g->colbest.p : NULL;
    unsigned *tilekey = c->tiles ? g->tilekey.p : NULL;
    const int32_t *blkp = blocks ? g->blk.p : NULL;
    KTRY(!g->c16_ok
             ? kern_centroid_scores(KERN_DEV_CUDA, g->centroids.p, K, g->q.p, c->T, g->dim, g->ST.p)
         : c->narrow == TABLE_I8
             ? kern_cuda_centroid_scores_f16_i8(g->c16.p, K, g->q.p, c->T, g->dim, g->ST.p,
                                                g->ST16.p, colbest, blkp, tilekey)
             : kern_cuda_centroid_scores_f16(g->c16.p, K, g->q.p, c->T, g->dim, g->ST.p,
                                             c->narrow ? g->ST16.p : NULL, colbest, blkp, tilekey),
         "centroid scores");

    const uint32_t *list = NULL;
    size_t n_list = 0;
    if (exhaustive || s->subset_exact) {
        list = s->allowed ? g->list.p : g->alive.p;
        n_list = s->allowed ? s->n_allowed : g->n_alive;
    }
    size_t k = s->k;
    if (list) {
        for (size_t i = 0; i < nq; i++)
            s->hit_n[c->qa + i] = 0;
        if (n_list == 0)
            return 0;
        st->n_cand += nq * n_list;
        st->n_exact += nq * n_list;
        if (g->mode == TARTAN_GPU_STREAMING && n_list > g->slice_docs)
            return exhaustive_slices(g, r, s, c, list, n_list, m);
        /* Every listed document against every query of the chunk. */
        if ((rc = dbuf_need(&g->scores, nq * n_list * 4, 0, m)))
            return rc;
        if ((rc = exact_stage(g, r, c, list, n_list, 1, NULL, NULL, g->scores.p, m)))
            return rc;
        size_t kk = k < n_list ? k : n_list;
        if ((rc = final_topk(g, c, g->scores.p, n_list, list, 1, kk, m)))
            return rc;
        k = kk;
    } else {
        size_t nc = s->ncells;
        if ((rc = dbuf_need(&g->probes, c->T * nc * 4, 0, m)) ||
            (rc = dbuf_need(&g->counts, nq * 8, 0, m)))
            return rc;
        /* The bitmaps are all zero between searches (take clears what mark set); a new
         * buffer, or one a failed search left marked, is cleared first. */
        const size_t old_cap = g->bits.cap; /* a new buffer always has a larger capacity */
        if ((rc = dbuf_need(&g->bits, nq * words * 4, 0, m)))
            return rc;
        if (g->bits.cap != old_cap || g->bits_dirty)
            KTRY(kern_cuda_memset(g->bits.p, 0, g->bits.cap), "memset");
        g->bits_dirty = 1;
        int64_t *cnt = malloc(nq * 8);
        if (!cnt)
            return store_fail(m, ENOMEM, "GPU search: out of memory");
        /* Each query probes with its own length's margin (s->margin_q; the batch's widest,
         * s->margin, without it), as on the CPU. */
        int krc = 0;
        if ((rc = probe_and_mark(g, s, c, s->margin_q ? PROBE_OWN : PROBE_ALL, s->margin, NULL,
                                 words, m))) {
            free(cnt);
            return rc;
        }
        krc = kern_cuda_download(cnt, g->counts.p, nq * 8);
        /* A query whose margin reached fewer candidates than k probes its whole cap, its
         * bitmap growing from the first pass's (the cap's probes include the margin's); the
         * other queries' columns probe nothing this time. The CPU's rule (search_plaid.c). */
        if (!krc && s->adaptive && s->margin < INFINITY) {
            size_t n_wide = 0;
            for (size_t i = 0; i < nq; i++)
                n_wide += (size_t)cnt[i] < k;
            int64_t *more = n_wide ? malloc(nq * 8) : NULL;
            if (n_wide && !more)
                rc = store_fail(m, ENOMEM, "GPU search: out of memory");
            else if (n_wide)
                rc = probe_and_mark(g, s, c, PROBE_WIDEN, INFINITY, cnt, words, m);
            if (rc) {
                free(more);
                free(cnt);
                return rc;
            }
            if (n_wide && !(krc = kern_cuda_download(more, g->counts.p, nq * 8))) {
                /* The second pass counted the bits it added: the totals go back to the device,
                 * where the stages after read them. */
                for (size_t i = 0; i < nq; i++)
                    cnt[i] += more[i];
                krc = kern_cuda_upload(g->counts.p, cnt, nq * 8);
            }
            free(more);
        }
        size_t width = 0, n3sum = 0;
        size_t n2 = 0, n3 = 0;
        if (!krc) {
            for (size_t i = 0; i < nq; i++) {
                width = (size_t)cnt[i] > width ? (size_t)cnt[i] : width;
                st->n_cand += (uint64_t)cnt[i];
            }
            if (!s->adaptive) {
                n2 = s->ndocs < width ? s->ndocs : width;
                n3 = s->ndocs_exact < n2 ? s->ndocs_exact : n2;
                for (size_t i = 0; i < nq; i++)
                    n3sum += (size_t)cnt[i] < n3 ? (size_t)cnt[i] : n3;
            }
        }
        if (krc) {
            free(cnt);
            return gpu_fail(krc, m, "download");
        }
        double t1 = eng_now();
        st->cand += t1 - t0;
        if (trace_level())
            fprintf(stderr, "tartan trace: chunk %zu queries, %zu tokens: candidates %.3f ms\n", nq,
                    c->T, 1e3 * (t1 - t0));
        t0 = t1;
        if (width == 0) {
            free(cnt);
            /* No candidates: the bitmaps are still all zero. */
            g->bits_dirty = 0;
            for (size_t i = 0; i < nq; i++)
                s->hit_n[c->qa + i] = 0;
            return 0;
        }
        if ((rc = dbuf_need(&g->docs1, nq * width * 4, 0, m)) ||
            (rc = dbuf_need(&g->approx1, nq * width * 4, 0, m)) ||
            (rc = dbuf_need(&g->sel, nq * n2 * 8, 0, m)) ||
            (rc = dbuf_need(&g->docs2, nq * n2 * 4, 0, m)) ||
            (rc = dbuf_need(&g->approx2, nq * n2 * 4, 0, m)) ||
            (rc = dbuf_need(&g->vals, nq * n2 * 4, 0, m)) ||
            (rc = dbuf_need(&g->docs3, nq * n3 * 4, 0, m)) ||
            (rc = dbuf_need(&g->scores, nq * n3 * 4, 0, m))) {
            free(cnt);
            return rc;
        }
        if ((krc = kern_cuda_candidates_take(g->bits.p, nq, words, g->docs1.p, width))) {
            free(cnt);
            return gpu_fail(krc, m, "candidates");
        }
        g->bits_dirty = 0;
        if (s->adaptive) {
            rc = adaptive_stages(g, r, s, c, width, cnt, &n3sum, &k, st, &t0, m);
            free(cnt);
            if (rc)
                return rc;
            st->n_exact += n3sum;
            if (k == 0) { /* nothing scored: no hits */
                for (size_t i = 0; i < nq; i++)
                    s->hit_n[c->qa + i] = 0;
                st->exact += eng_now() - t0;
                return 0;
            }
            goto hits;
        }
        free(cnt);
        /* Stage 2: pruned, except for queries with few enough candidates to score them all. */
        if ((rc = interaction(g, c, g->docs1.p, width, 1, g->counts.p, (int64_t)s->ndocs_exact,
                              s->threshold, g->approx1.p, m)))
            return rc;
        KTRY(kern_topk_rows(KERN_DEV_CUDA, g->approx1.p, nq, width, n2, g->sel.p, g->vals.p),
             "top-k");
        KTRY(kern_cuda_gather_docs(g->docs1.p, width, g->sel.p, nq, n2, g->docs2.p), "gather");
        /* Stage 3. */
        if ((rc = interaction(g, c, g->docs2.p, n2, 0, NULL, 0, 0.f, g->approx2.p, m)))
            return rc;
        KTRY(kern_topk_rows(KERN_DEV_CUDA, g->approx2.p, nq, n2, n3, g->sel.p, g->vals.p),
             "top-k");
        KTRY(kern_cuda_gather_docs(g->docs2.p, n2, g->sel.p, nq, n3, g->docs3.p), "gather");
        t1 = eng_now();
        st->prune += t1 - t0;
        t0 = t1;
        /* Stage 4. */
        if ((rc = exact_stage(g, r, c, g->docs3.p, n3, 0, NULL, NULL, g->scores.p, m)))
            return rc;
        size_t kk = k < n3 ? k : n3;
        if ((rc = final_topk(g, c, g->scores.p, n3, g->docs3.p, 0, kk, m)))
            return rc;
        st->n_exact += n3sum;
        k = kk;
    }
hits:;
    /* The hits back to the host. */
    uint32_t *hd = malloc(nq * k * 4);
    float *hv = malloc(nq * k * 4);
    int krc = KERN_ENOMEM;
    if (hd && hv && !(krc = kern_cuda_download(hd, g->docs4.p, nq * k * 4)))
        krc = kern_cuda_download(hv, g->vals.p, nq * k * 4);
    if (!krc) {
        for (size_t i = 0; i < nq; i++) {
            size_t qi = c->qa + i, h = 0;
            for (size_t j = 0; j < k; j++) {
                uint32_t d = hd[i * k + j];
                float v = hv[i * k + j];
                if (d == KERN_NO_DOC || !(v > -INFINITY))
                    break;
                s->hit_doc[qi * s->k + h] = d;
                s->hit_score[qi * s->k + h] = v;
                h++;
            }
            s->hit_n[qi] = h;
        }
    }
    free(hd);
    free(hv);
    st->exact += eng_now() - t0;
    if (krc == KERN_ENOMEM && (!hd || !hv))
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    return krc ? gpu_fail(krc, m, "download") : 0;
}

static int run_search(eng_gpu *g, idx_reader *r, const eng_search *s, int exhaustive,
                      eng_stage_stats *st, store_msg *m)
{
    const eng_queries *q = s->q;
    int rc;
    /* The subset on the device: its bitmap (as 32-bit words) and its list. */
    if (s->allowed) {
        size_t w64 = ((size_t)s->n_docnos + 63) / 64;
        if ((rc = dbuf_need(&g->allowed, (w64 ? w64 : 1) * 8, 0, m)) ||
            (rc = dbuf_need(&g->list, (s->n_allowed ? s->n_allowed : 1) * 4, 0, m)))
            return rc;
        if (w64)
            KTRY(kern_cuda_upload(g->allowed.p, s->allowed, w64 * 8), "upload");
        if (s->n_allowed)
            KTRY(kern_cuda_upload(g->list.p, s->allowed_list, s->n_allowed * 4), "upload");
    }
    /* Chunks: the score table within its budget; the candidate or score matrices within
     * twice that at their largest (every document a candidate). */
    const size_t budget = table_budget(g);
    size_t t_budget = budget / ((size_t)g->K * 4);
    size_t per_query = exhaustive || s->subset_exact
                           ? (s->allowed ? s->n_allowed : g->n_alive) * 4
                           : ((size_t)g->next_docno + 1) * 12;
    size_t q_budget = budget * (MATRIX_BUDGET / ST_BUDGET) / (per_query ? per_query : 1);
    if (q_budget < 1)
        q_budget = 1;
    if (q_budget > 65535)
        q_budget = 65535;
    int64_t *h_off = malloc((q->n + 1) * sizeof *h_off);
    if (!h_off)
        return store_fail(m, ENOMEM, "GPU search: out of memory");
    rc = 0;
    for (size_t qa = 0; qa < q->n && !rc;) {
        chunk c = {.qa = qa, .h_off = h_off};
        size_t qb = qa;
        while (qb < q->n && qb - qa < q_budget &&
               (qb == qa || q->off[qb + 1] - q->off[qa] <= t_budget))
            qb++;
        c.nq = qb - qa;
        c.T = q->off[qb] - q->off[qa];
        for (size_t i = 0; i <= c.nq; i++)
            h_off[i] = (int64_t)(q->off[qa + i] - q->off[qa]);
        rc = run_chunk(g, r, s, exhaustive, &c, st, m);
        qa = qb;
    }
    free(h_off);
    return rc;
}

int eng_gpu_search(eng_gpu **gp, idx_reader *r, const eng_search *s, int exhaustive,
                   tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m)
{
    eng_gpu_lock();
    int rc = eng_gpu_search_held(gp, r, s, exhaustive, mode, st, m);
    eng_gpu_unlock();
    return rc;
}

int eng_gpu_search_held(eng_gpu **gp, idx_reader *r, const eng_search *s, int exhaustive,
                        tartan_gpu_mode mode, eng_stage_stats *st, store_msg *m)
{
    int rc = 0;
    if (!*gp && !(*gp = calloc(1, sizeof **gp)))
        rc = store_fail(m, ENOMEM, "GPU search: out of memory");
    if (!rc && !(*gp)->slice_docs)
        (*gp)->slice_docs = STREAM_SLICE_DOCS;
    double t0 = eng_now();
    if (!rc)
        rc = mirror_sync(*gp, r, mode, m);
    st->cand += eng_now() - t0;
    if (!rc)
        rc = run_search(*gp, r, s, exhaustive, st, m);
    if (rc && *gp && rc != ENOMEM && rc != TARTAN_ECORRUPT)
        (*gp)->valid = 0; /* after a device error, reload from scratch next time */
    return rc;
}
