/*
 * search_plaid.c: the search pipeline for one query (DESIGN.md section 4, engine/SEARCH.md),
 * on the CPU, reading codes and residuals straight from LMDB's map through the thread's own
 * reader.
 *
 *   1. S = Q C^T, the whole [lq, K] table; each token's best ncells centroids, of which only
 *      those within margin of the token's best are probed (all of them in the fixed mode);
 *      the union of their inverted lists (deduplicated with a bitmap over document numbers;
 *      filtered by the subset) is the candidate set, in ascending document number.
 *   2. Centroid interaction over the candidates' codes (counting only centroids whose best
 *      score over the query's tokens reaches the threshold, when pruning).
 *   3. Adaptive mode: exact residual-fused MaxSim in order of approximate score, in growing
 *      batches, until the next candidate cannot reach the k-th best exact score by the
 *      approximation error measured so far; fixed mode: PLAID's stage 2 keeps ndocs, stage 3
 *      (unpruned interaction) ndocs_exact, stage 4 scores those exactly.
 *   4. Top k of the exactly scored documents (checksums verified), ties to the lower number.
 *
 * Centroid interaction reads only the codes of each candidate and skips the per-document
 * checksum (it would read every residual byte of thousands of documents); a damaged code
 * cannot mislead it beyond a ranking, since the kernels refuse codes past K, and every
 * document whose score is returned went through a verified read before exact scoring.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "search.h"

/* Lanes a row of the transposed tables has: lq rounded up to 32, the widest panel of the
 * micro-kernels (kern_residual's qcT). */
#define ENG_LD(lq) (((lq) + 31) / 32 * 32)

struct eng_plaid_ws {
    float *S; /* [lq, K] */
    size_t S_cap;
    int64_t *tix; /* [lq * ncells] probed centroids (then reused for top-k indices) */
    float *tval;
    size_t t_cap;
    uint8_t *probed; /* [K] centroids probed by this query's tokens, all 0 between */
    size_t K_cap;
    uint64_t *seen; /* [words] bitmap over document numbers, all zero between queries */
    size_t seen_words;
    uint32_t *cand; /* candidate document numbers */
    kern_pdoc *pd;  /* their documents */
    float *score;
    size_t c_cap;
    uint32_t *surv; /* survivors of stage 3 */
    kern_pdoc *spd;
    size_t s_cap;
    /* The candidates' centroids renumbered densely (see compact()). */
    int32_t *cmap;   /* [K] new number of a centroid, -1 between queries */
    uint32_t *ulist; /* [K] centroid of each new number */
    size_t cm_cap;
    /* The table transposed, ST [K, ld] (ld: lq rounded up to 32), and the candidates'
     * columns of it, S2T [K', ld]: the layout the CPU kernels read, built once a query. */
    float *ST;
    size_t ST_cap;
    float *S2T;
    size_t S2T_cap;
    uint32_t *codes2; /* the candidates' renumbered codes */
    size_t c2_cap;
    uint8_t *keep2; /* [K'] */
    /* With the bf16 probe: S holds bf16 scores; ex2 [K'] says which rows of S2T hold fp32's
     * (exact_columns), need [K'] and cols [K'] list the ones being computed, colbuf their
     * scores. */
    int screened;
    uint8_t *ex2;
    uint32_t *need, *cols;
    float *colbuf;
    size_t col_cap;
    /* Adaptive mode: exactly scored documents (numbers, documents, approximate and exact
     * scores) in the order they were scored. */
    uint32_t *ev_doc;
    kern_pdoc *ev_pd;
    float *ev_approx, *ev_exact;
    size_t ev_cap;
};

double eng_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int eng_axes_query(const idx_reader *r, kern_residual *a, float **qr, store_msg *m)
{
    *qr = malloc((a->lq ? a->lq : 1) * a->dim * sizeof(float));
    if (!*qr)
        return store_fail(m, ENOMEM, "search: out of memory for a rotated query");
    idx_axes_rotate(r->axes, a->q, a->lq, *qr);
    a->q = *qr;
    a->axes_dec = r->axes_dec;
    memcpy(a->axes_bytes, r->axes_bytes, sizeof a->axes_bytes);
    a->axes_additive = r->axes_additive;
    return 0;
}

int eng_kern_fail(int krc, store_msg *m, const char *what)
{
    if (krc == KERN_ENOMEM)
        return store_fail(m, ENOMEM, "%s: out of memory", what);
    /* The engine passes only sound arguments; a refusal means a document's codes point past
     * the centroid table, i.e. damaged data. */
    if (krc == KERN_EINVAL)
        return store_fail(m, TARTAN_ECORRUPT, "%s: %s", what, kern_last_error());
    return store_fail(m, TARTAN_EINTERNAL, "%s: %s", what, kern_last_error());
}

eng_plaid_ws *eng_plaid_ws_new(void)
{
    return calloc(1, sizeof(eng_plaid_ws));
}

void eng_plaid_ws_free(eng_plaid_ws *ws)
{
    if (!ws)
        return;
    free(ws->S);
    free(ws->tix);
    free(ws->tval);
    free(ws->probed);
    free(ws->seen);
    free(ws->cand);
    free(ws->pd);
    free(ws->score);
    free(ws->surv);
    free(ws->spd);
    free(ws->cmap);
    free(ws->ulist);
    free(ws->ST);
    free(ws->S2T);
    free(ws->codes2);
    free(ws->keep2);
    free(ws->ex2);
    free(ws->need);
    free(ws->cols);
    free(ws->colbuf);
    free(ws->ev_doc);
    free(ws->ev_pd);
    free(ws->ev_approx);
    free(ws->ev_exact);
    free(ws);
}

/* Grows *p to hold n elements of size sz (contents kept). */
int eng_grow(void **p, size_t *cap, size_t n, size_t sz)
{
    if (n <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < n)
        c *= 2;
    void *q = realloc(*p, c * sz);
    if (!q)
        return ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* Grows *p to hold n floats, 64-byte aligned (contents not kept): rows of the transposed
 * tables are whole cache lines. */
static int grow_aligned(float **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    size_t c = *cap ? *cap : 1024;
    while (c < n)
        c *= 2;
    void *q = NULL;
    if (posix_memalign(&q, 64, c * sizeof(float)))
        return ENOMEM;
    free(*p);
    *p = q;
    *cap = c;
    return 0;
}

/* Grows narr arrays that share one capacity *cap to hold n elements each (contents kept):
 * array i is *p[i], of elements of sz[i] bytes; an empty set starts at `first`. *cap moves only
 * when every array grew (one that grew before another failed keeps its larger block). */
static int grow_together(size_t *cap, size_t first, size_t n, void **const p[], const size_t sz[],
                         size_t narr)
{
    if (n <= *cap)
        return 0;
    size_t c = *cap ? *cap : first;
    while (c < n)
        c *= 2;
    int rc = 0;
    for (size_t i = 0; i < narr; i++) {
        void *q = realloc(*p[i], c * sz[i]);
        if (q)
            *p[i] = q;
        else
            rc = ENOMEM;
    }
    if (!rc)
        *cap = c;
    return rc;
}

/* The three candidate arrays grow together. */
static int grow_cand(eng_plaid_ws *ws, size_t n)
{
    void **const p[] = {(void **)&ws->cand, (void **)&ws->pd, (void **)&ws->score};
    const size_t sz[] = {sizeof *ws->cand, sizeof *ws->pd, sizeof *ws->score};
    return grow_together(&ws->c_cap, 1024, n, p, sz, 3);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int setup(eng_plaid_ws *ws, const idx_reader *r, const eng_search *s, size_t lq,
                 store_msg *m)
{
    size_t K = r->h.n_centroids, words = ((size_t)s->n_docnos + 63) / 64;
    size_t nt = s->subset_exact ? s->k : lq * s->ncells;
    if (nt < s->ndocs)
        nt = s->ndocs;
    if (nt < s->ndocs_exact)
        nt = s->ndocs_exact;
    if (s->adaptive && nt < s->depth_cap)
        nt = s->depth_cap;
    if (eng_grow((void **)&ws->S, &ws->S_cap, lq * K, sizeof(float)))
        goto oom;
    if (s->probe && grow_aligned(&ws->ST, &ws->ST_cap, ENG_LD(lq) * K))
        goto oom;
    if (ws->t_cap < nt) {
        size_t cap = ws->t_cap;
        if (eng_grow((void **)&ws->tix, &cap, nt, sizeof(int64_t)))
            goto oom;
        cap = ws->t_cap;
        if (eng_grow((void **)&ws->tval, &cap, nt, sizeof(float)))
            goto oom;
        ws->t_cap = cap;
    }
    if (ws->K_cap < K) {
        /* probed starts all zero (union_lists keeps it so). */
        free(ws->probed);
        ws->probed = calloc(K, 1);
        ws->K_cap = ws->probed ? K : 0;
        if (!ws->K_cap)
            goto oom;
    }
    if (ws->cm_cap < K) {
        free(ws->cmap);
        free(ws->ulist);
        free(ws->keep2);
        free(ws->ex2);
        free(ws->need);
        free(ws->cols);
        ws->cmap = malloc(K * sizeof *ws->cmap);
        ws->ulist = malloc(K * sizeof *ws->ulist);
        ws->keep2 = malloc(K);
        ws->ex2 = malloc(K);
        ws->need = malloc(K * sizeof *ws->need);
        ws->cols = malloc(K * sizeof *ws->cols);
        ws->cm_cap = ws->cmap && ws->ulist && ws->keep2 && ws->ex2 && ws->need && ws->cols ? K : 0;
        if (!ws->cm_cap)
            goto oom;
        for (size_t c = 0; c < K; c++)
            ws->cmap[c] = -1;
    }
    if (ws->seen_words < words) {
        free(ws->seen);
        ws->seen = calloc(words, sizeof(uint64_t));
        ws->seen_words = ws->seen ? words : 0;
        if (!ws->seen)
            goto oom;
    }
    return 0;
oom:
    return store_fail(m, ENOMEM, "search: out of memory for query workspace");
}

/*
 * Stage 1's union: every document in the probed centroids' lists, once, allowed by the
 * subset, into ws->cand in ascending order (*n_out of them). Leaves ws->seen all zero and
 * ws->probed all zero.
 */
static int union_lists(idx_reader *r, const eng_search *s, eng_plaid_ws *ws, size_t nprobe,
                       size_t *n_out, store_msg *m)
{
    size_t n = 0;
    int rc = 0;
    uint64_t *seen = ws->seen;
    for (size_t p = 0; p < nprobe && !rc; p++) {
        if (ws->tix[p] < 0)
            continue;
        uint32_t c = (uint32_t)ws->tix[p];
        if (ws->probed[c])
            continue; /* probed already by another token */
        ws->probed[c] = 1;
        store_ivf_iter *it;
        if ((rc = idx_reader_ivf_open(r, c, &it, m)))
            break;
        const uint32_t *docs;
        size_t nd;
        int more;
        while ((more = store_ivf_next(it, &docs, &nd, m)) == 1 ||
               (more == TARTAN_ECORRUPT && s->skip_damaged)) {
            if (more != 1) {
                /* A damaged block: its documents are not candidates (skip_damaged). */
                if (r->damaged)
                    (*r->damaged)++;
                continue;
            }
            if (grow_cand(ws, n + nd)) {
                rc = store_fail(m, ENOMEM, "search: out of memory for candidates");
                break;
            }
            for (size_t i = 0; i < nd; i++) {
                uint32_t d = docs[i];
                if (d >= s->n_docnos) {
                    rc = store_fail(m, TARTAN_ECORRUPT,
                                    "inverted list of centroid %u lists document %u, past the "
                                    "last number handed out (%u)",
                                    c, d, s->n_docnos);
                    break;
                }
                uint64_t bit = (uint64_t)1 << (d & 63);
                if (seen[d >> 6] & bit)
                    continue;
                if (s->allowed && !(s->allowed[d >> 6] & bit))
                    continue;
                seen[d >> 6] |= bit;
                ws->cand[n++] = d;
            }
            if (rc)
                break;
        }
        store_ivf_close(it);
        if (!rc && more != 0 && more != 1)
            rc = more;
    }
    /* The bitmap is left all zero for the next query: clear the bits set, or the words in
     * one sweep when that is shorter; the sweep also yields the candidates sorted. */
    size_t words = ((size_t)s->n_docnos + 63) / 64;
    if (!rc && n > words / 4) {
        size_t j = 0;
        for (size_t w = 0; w < words; w++) {
            uint64_t x = seen[w];
            seen[w] = 0;
            while (x) {
                ws->cand[j++] = (uint32_t)(w * 64 + (unsigned)__builtin_ctzll(x));
                x &= x - 1;
            }
        }
    } else {
        for (size_t i = 0; i < n; i++)
            seen[ws->cand[i] >> 6] = 0;
        /* n may be 0 with no candidate array yet: qsort's pointer must not be NULL. */
        if (!rc && n > 1)
            qsort(ws->cand, n, sizeof *ws->cand, cmp_u32);
    }
    for (size_t p = 0; p < nprobe; p++)
        if (ws->tix[p] >= 0)
            ws->probed[ws->tix[p]] = 0;
    *n_out = n;
    return rc;
}

/* Documents a lookup fetches ahead of the one it reads: each is a cache miss (or several) in a
 * map far larger than the caches, and a thousand candidates wait on them one by one. */
#define LOOKAHEAD 16

/*
 * Documents of n numbers through r (pointers into the map) into pd, their numbers into out
 * (which may be docnos itself); *kept: how many. With skip_damaged, a damaged or missing
 * document is left out (and counted) instead of failing, and every document is verified.
 */
static int lookup(idx_reader *r, const eng_search *s, const uint32_t *docnos, size_t n,
                  uint32_t *out, kern_pdoc *pd, int verify, size_t *kept, store_msg *m)
{
    r->verify = verify || s->skip_damaged;
    size_t k = 0;
    for (size_t i = 0; i < n && i < LOOKAHEAD; i++)
        idx_reader_doc_prefetch(r, docnos[i]);
    for (size_t i = 0; i < n; i++) {
        if (i + LOOKAHEAD < n)
            idx_reader_doc_prefetch(r, docnos[i + LOOKAHEAD]);
        uint32_t d = docnos[i];
        int rc = idx_reader_doc(r, d, &pd[k], m);
        if ((rc == TARTAN_ECORRUPT || rc == TARTAN_ENOTFOUND) && s->skip_damaged) {
            if (r->damaged)
                (*r->damaged)++;
            continue;
        }
        if (rc == TARTAN_ENOTFOUND)
            return store_fail(m, TARTAN_ECORRUPT,
                              "document %u is listed but missing from the documents", d);
        if (rc)
            return rc;
        out[k++] = d;
    }
    *kept = k;
    return 0;
}

/* The score table and code width stage 4 reads: the index's [lq, K], or the renumbered ones
 * transposed (ld > 0: S [K', ld]). */
typedef struct qc_table {
    const float *S;
    size_t n;
    unsigned code_bytes;
    size_t ld;
} qc_table;

/*
 * Exact scores of documents docnos [n] into score [n]. With pd_given, pd already holds the
 * documents (codes renumbered for t) and the map is read again only to verify their
 * checksums; otherwise pd holds them from verified reads already (exact_topk's lookup).
 */
static int exact_scores(idx_reader *r, const eng_search *s, size_t qi, const uint32_t *docnos,
                        kern_pdoc *pd, int pd_given, const qc_table *t, float *score, size_t n,
                        store_msg *m)
{
    const eng_queries *q = s->q;
    int rc;
    if (pd_given) {
        r->verify = 1;
        for (size_t i = 0; i < n; i++) {
            kern_pdoc check;
            if ((rc = idx_reader_doc(r, docnos[i], &check, m)))
                return rc == TARTAN_ENOTFOUND
                           ? store_fail(m, TARTAN_ECORRUPT, "document %u vanished", docnos[i])
                           : rc;
        }
    }
    kern_residual a = {
        .dim = q->dim,
        .nbits = r->h.nbits,
        .code_bytes = t->code_bytes,
        .q = q->emb + q->off[qi] * q->dim,
        .lq = q->off[qi + 1] - q->off[qi],
        .qc = t->ld ? NULL : t->S,
        .qcT = t->ld ? t->S : NULL,
        .ld = t->ld,
        .n_centroids = t->n,
        .bucket_weights = r->codec.weights,
        .docs = pd,
        .nd = n,
    };
    float *qr = NULL;
    if (r->axes && (rc = eng_axes_query(r, &a, &qr, m)))
        return rc;
    int krc = kern_maxsim_residual(KERN_DEV_CPU, &a, score);
    free(qr);
    return krc ? eng_kern_fail(krc, m, "exact scoring") : 0;
}

/* The query's top k of docnos [n] (ascending: equal scores go to the lower number) into s's
 * hits. */
static int take_topk(const eng_search *s, size_t qi, eng_plaid_ws *ws, const uint32_t *docnos,
                     const float *score, size_t n, store_msg *m)
{
    size_t k = s->k < n ? s->k : n;
    int krc;
    if (k && (krc = kern_topk_rows(KERN_DEV_CPU, score, 1, n, k, ws->tix, ws->tval)))
        return eng_kern_fail(krc, m, "top-k");
    size_t h = 0;
    uint32_t *hd = s->hit_doc + qi * s->k;
    float *hs = s->hit_score + qi * s->k;
    for (size_t i = 0; i < k && ws->tix[i] >= 0; i++, h++) {
        hd[h] = docnos[ws->tix[i]];
        hs[h] = ws->tval[i];
    }
    s->hit_n[qi] = h;
    return 0;
}

/* Stage 4 over docnos [n] (ascending): exact scores, the query's top k into s's hits. */
static int exact_topk(idx_reader *r, const eng_search *s, size_t qi, eng_plaid_ws *ws,
                      const uint32_t *docnos, kern_pdoc *pd, int pd_given, const qc_table *t,
                      float *score, size_t n, eng_stage_stats *st, store_msg *m)
{
    int rc;
    if (!pd_given) {
        /* Verified reads; with skip_damaged the damaged ones are left out. ws->cand takes the
         * numbers kept (it is docnos, or free: grow_cand sized it). */
        if ((rc = lookup(r, s, docnos, n, ws->cand, pd, 1, &n, m)))
            return rc;
        docnos = ws->cand;
    }
    if ((rc = exact_scores(r, s, qi, docnos, pd, pd_given, t, score, n, m)))
        return rc;
    st->n_exact += n;
    return take_topk(s, qi, ws, docnos, score, n, m);
}

/*
 * Renumbers the centroids the n candidates use densely (K' of them, in order of first use)
 * and points pd's codes at a renumbered copy (uint32), so that stages 2 to 4 read a score
 * table of K' columns: the kernels transpose and scan their table on every call, and the
 * whole [lq, K] table is megabytes where the candidates use a few thousand centroids.
 * Fills S2T [K', ld] (from ST, or from S without the probe) and keep2 [K'] (the threshold's
 * verdict); *kk = K'.
 */
static int compact(const idx_reader *r, const eng_search *s, eng_plaid_ws *ws, size_t lq,
                   kern_pdoc *pd, size_t n, size_t *kk_out, store_msg *m)
{
    size_t K = r->h.n_centroids, ntok = 0, kk = 0;
    unsigned cb = r->h.code_bytes;
    for (size_t i = 0; i < n; i++)
        ntok += pd[i].ntok;
    if (eng_grow((void **)&ws->codes2, &ws->c2_cap, ntok, sizeof *ws->codes2))
        return store_fail(m, ENOMEM, "search: out of memory for candidate codes");
    int rc = 0;
    uint32_t *dst = ws->codes2;
    for (size_t i = 0; i < n && !rc; i++) {
        const kern_pdoc *d = &pd[i];
        for (uint32_t t = 0; t < d->ntok; t++) {
            uint32_t c =
                cb == 2 ? ((const uint16_t *)d->codes)[t] : ((const uint32_t *)d->codes)[t];
            if (c >= K) {
                rc = store_fail(m, TARTAN_ECORRUPT,
                                "document %u: token %u has code %u, past %zu centroids",
                                ws->cand[i], t, c, K);
                break;
            }
            int32_t j = ws->cmap[c];
            if (j < 0) {
                j = ws->cmap[c] = (int32_t)kk;
                ws->ulist[kk++] = c;
            }
            dst[t] = (uint32_t)j;
        }
        pd[i].codes = dst;
        dst += d->ntok;
    }
    for (size_t j = 0; j < kk; j++)
        ws->cmap[ws->ulist[j]] = -1;
    if (rc)
        return rc;
    size_t ld = ENG_LD(lq);
    if (grow_aligned(&ws->S2T, &ws->S2T_cap, kk * ld))
        return store_fail(m, ENOMEM, "search: out of memory for scores");
    if (ws->screened) {
        for (size_t j = 0; j < kk; j++)
            memcpy(ws->S2T + j * ld, ws->ST + (size_t)ws->ulist[j] * ld, ld * sizeof(float));
    } else {
        for (size_t j = 0; j < kk; j++)
            memset(ws->S2T + j * ld + lq, 0, (ld - lq) * sizeof(float));
        for (size_t i = 0; i < lq; i++) {
            const float *row = ws->S + i * K;
            for (size_t j = 0; j < kk; j++)
                ws->S2T[j * ld + i] = row[ws->ulist[j]];
        }
    }
    /* A centroid counts in stage 2 when its best score over the query's tokens reaches the
     * threshold. */
    for (size_t j = 0; j < kk; j++) {
        const float *row = ws->S2T + j * ld;
        float mx = row[0];
        for (size_t i = 1; i < lq; i++)
            mx = row[i] > mx ? row[i] : mx;
        ws->keep2[j] = mx >= s->threshold;
    }
    memset(ws->ex2, !ws->screened, kk);
    *kk_out = kk;
    return 0;
}

/*
 * With the bf16 probe, the columns of S2 that documents pd [n] (codes renumbered) read and that
 * still hold bf16 scores get fp32's, computed as the whole fp32 table would have them
 * (kern_centroid_scores_cols), so that exact scores are the fp32 pipeline's bit for bit.
 */
static int exact_columns(const idx_reader *r, const eng_search *s, size_t qi, eng_plaid_ws *ws,
                         const kern_pdoc *pd, size_t n, store_msg *m)
{
    if (!ws->screened)
        return 0;
    size_t nn = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *codes = pd[i].codes;
        for (uint32_t t = 0; t < pd[i].ntok; t++) {
            uint32_t j = codes[t];
            if (!ws->ex2[j]) {
                ws->ex2[j] = 1;
                ws->need[nn++] = j;
            }
        }
    }
    if (!nn)
        return 0;
    const eng_queries *q = s->q;
    size_t lq = q->off[qi + 1] - q->off[qi];
    size_t ld = ENG_LD(lq);
    if (grow_aligned(&ws->colbuf, &ws->col_cap, ld * nn))
        return store_fail(m, ENOMEM, "search: out of memory for scores");
    for (size_t a = 0; a < nn; a++)
        ws->cols[a] = ws->ulist[ws->need[a]];
    int krc = kern_centroid_scores_cols(KERN_DEV_CPU, q->emb + q->off[qi] * q->dim, lq,
                                        r->centroids, q->dim, ws->cols, nn, ws->colbuf, ld);
    if (krc)
        return eng_kern_fail(krc, m, "centroid scores");
    for (size_t a = 0; a < nn; a++)
        memcpy(ws->S2T + (size_t)ws->need[a] * ld, ws->colbuf + a * ld, lq * sizeof(float));
    return 0;
}

typedef struct survivor {
    uint32_t docno;
    uint32_t at;
} survivor;

static int cmp_survivor(const void *a, const void *b)
{
    uint32_t x = ((const survivor *)a)->docno, y = ((const survivor *)b)->docno;
    return (x > y) - (x < y);
}

/* Grows the adaptive mode's arrays of exactly scored documents to hold n. */
static int grow_ev(eng_plaid_ws *ws, size_t n)
{
    void **const p[] = {(void **)&ws->ev_doc, (void **)&ws->ev_pd, (void **)&ws->ev_approx,
                        (void **)&ws->ev_exact};
    const size_t sz[] = {sizeof *ws->ev_doc, sizeof *ws->ev_pd, sizeof *ws->ev_approx,
                         sizeof *ws->ev_exact};
    return grow_together(&ws->ev_cap, 256, n, p, sz, 4);
}

/* The k-th largest of x [n] (n >= k >= 1), through tmp [n]: quickselect. */
static float kth_largest(const float *x, size_t n, size_t k, float *tmp)
{
    memcpy(tmp, x, n * sizeof *tmp);
    size_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = tmp[lo + (hi - lo) / 2];
        size_t i = lo, j = hi;
        while (i <= j) {
            while (tmp[i] > pivot)
                i++;
            while (tmp[j] < pivot)
                j--;
            if (i <= j) {
                float t = tmp[i];
                tmp[i] = tmp[j];
                tmp[j] = t;
                i++;
                if (j == 0)
                    break;
                j--;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            break;
    }
    return tmp[want];
}

typedef struct scored {
    uint32_t docno;
    float score;
} scored;

static int cmp_scored(const void *a, const void *b)
{
    uint32_t x = ((const scored *)a)->docno, y = ((const scored *)b)->docno;
    return (x > y) - (x < y);
}

size_t eng_tail_need(const float *a, size_t n, size_t valid, double theta, double mu, double sd,
                     double eps)
{
    /* p_j falls with j (a descends): sum from the front until the terms vanish, then walk m
     * up from n while the tail left is over eps. */
    const double gap = theta - mu;
    double tail = 0;
    size_t end = n;
    for (; end < valid; end++) {
        double p = sd > 0 ? 0.5 * erfc((gap - (double)a[end]) / (sd * 1.4142135623730951))
                   : (double)a[end] >= gap ? 1.0
                                           : 0.0;
        if (p < 1e-12 && (double)a[end] < gap)
            break; /* the rest are smaller still: at most valid x 1e-12 in all */
        tail += p;
    }
    size_t m = n;
    while (m < end && tail > eps) {
        tail -= sd > 0                ? 0.5 * erfc((gap - (double)a[m]) / (sd * 1.4142135623730951))
                : (double)a[m] >= gap ? 1.0
                                      : 0.0;
        m++;
    }
    return m;
}

/*
 * The adaptive exact stage over the n candidates of ws (numbers cand, documents pd with codes
 * renumbered for t, approximate scores score): exact scores in order of approximate score, a
 * batch at a time, until the next candidate's approximate score plus the mean and z standard
 * deviations of (exact - approximate) over the documents scored so far falls below the k-th
 * best exact score (or depth_cap documents are scored); a batch takes the candidates that
 * reach it, at most ENG_BATCH_GROWTH times the documents scored so far. The query's top k of
 * the scored documents into s's hits (engine/SEARCH.md; the GPU runs the same rule, in
 * search_gpu.c).
 */
static int adaptive_exact(idx_reader *r, const eng_search *s, size_t qi, eng_plaid_ws *ws,
                          const qc_table *t, size_t n, eng_stage_stats *st, store_msg *m)
{
    size_t cap = n < s->depth_cap ? n : s->depth_cap;
    int krc = kern_topk_rows(KERN_DEV_CPU, ws->score, 1, n, cap, ws->tix, ws->tval);
    if (krc)
        return eng_kern_fail(krc, m, "ordering candidates");
    size_t no = 0;
    while (no < cap && ws->tix[no] >= 0)
        no++;
    if (grow_ev(ws, no))
        return store_fail(m, ENOMEM, "search: out of memory");
    for (size_t i = 0; i < no; i++) {
        ws->ev_doc[i] = ws->cand[ws->tix[i]];
        ws->ev_pd[i] = ws->pd[ws->tix[i]];
        ws->ev_approx[i] = ws->tval[i];
    }
    size_t first = 2 * s->k > ENG_FIRST_BATCH ? 2 * s->k : ENG_FIRST_BATCH;
    size_t done = 0, next = first < no ? first : no;
    double sum = 0, sum2 = 0;
    int rc = 0;
    while (done < next) {
        rc = exact_columns(r, s, qi, ws, ws->ev_pd + done, next - done, m);
        if (!rc)
            rc = exact_scores(r, s, qi, ws->ev_doc + done, ws->ev_pd + done, 1, t,
                              ws->ev_exact + done, next - done, m);
        if (rc)
            return rc;
        for (size_t i = done; i < next; i++) {
            double d = (double)ws->ev_exact[i] - ws->ev_approx[i];
            sum += d;
            sum2 += d * d;
        }
        done = next;
        if (done >= no)
            break;
        if (done < s->k)
            break; /* fewer than k candidates in all */
        /* ws->score is free now: scratch for the selection. */
        float theta = kth_largest(ws->ev_exact, done, s->k, ws->score);
        double mu = sum / (double)done, var = sum2 / (double)done - mu * mu;
        const double sd = sqrt(var > 0 ? var : 0);
        double reach = (double)theta - mu - s->z * sd;
        /* The next batch: the candidates whose approximate score reaches it (they come in
         * descending order), and those the tail bound asks for, at most ENG_BATCH_GROWTH times
         * as many as scored so far. */
        size_t grow = (size_t)ceil((double)done * ENG_BATCH_GROWTH);
        if (grow > no)
            grow = no;
        next = done;
        while (next < grow && (double)ws->ev_approx[next] >= reach)
            next++;
        size_t tail = eng_tail_need(ws->ev_approx, done, no, theta, mu, sd, s->tail_eps);
        if (tail > next)
            next = tail < grow ? tail : grow;
    }
    st->n_exact += done;
    /* Ties go to the lower number: the scored documents in ascending number for top-k. */
    scored *sc = malloc((done ? done : 1) * sizeof *sc);
    if (!sc)
        return store_fail(m, ENOMEM, "search: out of memory");
    for (size_t i = 0; i < done; i++) {
        sc[i].docno = ws->ev_doc[i];
        sc[i].score = ws->ev_exact[i];
    }
    qsort(sc, done, sizeof *sc, cmp_scored);
    for (size_t i = 0; i < done; i++) {
        ws->ev_doc[i] = sc[i].docno;
        ws->ev_exact[i] = sc[i].score;
    }
    free(sc);
    return take_topk(s, qi, ws, ws->ev_doc, ws->ev_exact, done, m);
}

int eng_plaid_query(idx_reader *r, const eng_search *s, size_t qi, eng_plaid_ws *ws,
                    eng_stage_stats *st, store_msg *m)
{
    const eng_queries *q = s->q;
    size_t lq = q->off[qi + 1] - q->off[qi], K = r->h.n_centroids;
    const float *qe = q->emb + q->off[qi] * q->dim;
    s->hit_n[qi] = 0;
    int rc = setup(ws, r, s, lq, m);
    if (rc)
        return rc;
    qc_table full = {ws->S, K, r->h.code_bytes, 0};
    size_t ld = ENG_LD(lq);

    /* Stage 1: the whole fp32 table, or the bf16 one with each token's probes from fp32 (the
     * probe then runs in the loop below). */
    double t0 = eng_now();
    int krc = 0;
    ws->screened = s->probe && !s->subset_exact;
    if (!ws->screened &&
        (krc = kern_centroid_scores(KERN_DEV_CPU, qe, lq, r->centroids, K, q->dim, ws->S)))
        return eng_kern_fail(krc, m, "centroid scores");
    if (s->subset_exact) {
        /* A small subset: score all of it exactly. */
        size_t n = s->n_allowed;
        if ((rc = grow_cand(ws, n)))
            return store_fail(m, ENOMEM, "search: out of memory for candidates");
        double t1 = eng_now();
        st->cand += t1 - t0;
        st->n_cand += n;
        rc = exact_topk(r, s, qi, ws, s->allowed_list, ws->pd, 0, &full, ws->score, n, st, m);
        st->exact += eng_now() - t1;
        return rc;
    }
    size_t nc = s->ncells;
    float margin = s->margin_q ? s->margin_q[qi] : s->margin;
    size_t n = 0;
    for (;;) {
        if (ws->screened)
            krc = kern_centroid_probe(KERN_DEV_CPU, s->probe, r->centroids, qe, lq, nc, ws->S,
                                      ws->ST, ld, ws->tix, ws->tval, NULL);
        else
            krc = kern_topk_rows(KERN_DEV_CPU, ws->S, lq, K, nc, ws->tix, ws->tval);
        if (krc)
            return eng_kern_fail(krc, m, "probing centroids");
        /* Of each token's best nc centroids, those within the margin of its best. */
        uint64_t probes = 0;
        for (size_t i = 0; i < lq; i++) {
            const float *v = ws->tval + i * nc;
            int64_t *ix = ws->tix + i * nc;
            for (size_t j = 0; j < nc; j++) {
                if (ix[j] >= 0 && v[j] < v[0] - margin)
                    ix[j] = -1;
                probes += ix[j] >= 0;
            }
        }
        if ((rc = union_lists(r, s, ws, lq * nc, &n, m)))
            return rc;
        /* Fewer candidates than the results asked for (a short query at k 100, say): no
         * margin can be what this query needs; probe every token's whole cap instead (the
         * adaptive search only). */
        if (!s->adaptive || n >= s->k || !(margin < INFINITY)) {
            st->n_probes += probes;
            break;
        }
        margin = INFINITY;
    }
    double t1 = eng_now();
    st->cand += t1 - t0;
    st->n_cand += n;
    if (n == 0)
        return 0;

    /* Few candidates: score them all exactly, as stage 3 would have kept them all (the
     * adaptive stage's first batch would have scored them all too). */
    size_t few =
        s->adaptive ? (2 * s->k > ENG_FIRST_BATCH ? 2 * s->k : ENG_FIRST_BATCH) : s->ndocs_exact;
    if (n <= few) {
        /* exact scores read the whole table: fp32's (a rare path: not worth columns) */
        if (ws->screened &&
            (krc = kern_centroid_scores(KERN_DEV_CPU, qe, lq, r->centroids, K, q->dim, ws->S)))
            return eng_kern_fail(krc, m, "centroid scores");
        rc = exact_topk(r, s, qi, ws, ws->cand, ws->pd, 0, &full, ws->score, n, st, m);
        st->exact += eng_now() - t1;
        return rc;
    }

    /* Stage 2: pruned centroid interaction over the candidates' codes. */
    size_t kk = 0;
    if ((rc = lookup(r, s, ws->cand, n, ws->cand, ws->pd, 0, &n, m)))
        return rc;
    if (n == 0)
        return 0; /* every candidate was damaged (skip_damaged) */
    if ((rc = compact(r, s, ws, lq, ws->pd, n, &kk, m)))
        return rc;
    qc_table small = {ws->S2T, kk, 4, ld};
    if ((krc = kern_centroid_interaction_t(KERN_DEV_CPU, ws->S2T, ld, lq, kk, 4, ws->pd, n,
                                           s->prune ? ws->keep2 : NULL, ws->score)))
        return eng_kern_fail(krc, m, "centroid interaction");
    if (s->adaptive) {
        double t2 = eng_now();
        st->prune += t2 - t1;
        rc = adaptive_exact(r, s, qi, ws, &small, n, st, m);
        st->exact += eng_now() - t2;
        return rc;
    }
    size_t n2 = s->ndocs < n ? s->ndocs : n;
    if ((krc = kern_topk_rows(KERN_DEV_CPU, ws->score, 1, n, n2, ws->tix, ws->tval)))
        return eng_kern_fail(krc, m, "top-k");
    if (eng_grow((void **)&ws->surv, &ws->s_cap, n2, sizeof *ws->surv))
        return store_fail(m, ENOMEM, "search: out of memory");
    kern_pdoc *spd = realloc(ws->spd, (n2 ? n2 : 1) * sizeof *spd);
    if (!spd)
        return store_fail(m, ENOMEM, "search: out of memory");
    ws->spd = spd;
    size_t m2 = 0;
    for (size_t i = 0; i < n2 && ws->tix[i] >= 0; i++, m2++) {
        ws->surv[m2] = ws->cand[ws->tix[i]];
        spd[m2] = ws->pd[ws->tix[i]];
    }

    /* Stage 3: the same without pruning, over stage 2's survivors. */
    if ((krc = kern_centroid_interaction_t(KERN_DEV_CPU, ws->S2T, ld, lq, kk, 4, spd, m2, NULL,
                                           ws->score)))
        return eng_kern_fail(krc, m, "centroid interaction");
    size_t n3 = s->ndocs_exact < m2 ? s->ndocs_exact : m2;
    if (n3 && (krc = kern_topk_rows(KERN_DEV_CPU, ws->score, 1, m2, n3, ws->tix, ws->tval)))
        return eng_kern_fail(krc, m, "top-k");
    /* Survivors in ascending number, so that exact ties go to the older document. */
    size_t m3 = 0;
    survivor *sv = malloc((n3 ? n3 : 1) * sizeof *sv);
    if (!sv)
        return store_fail(m, ENOMEM, "search: out of memory");
    for (size_t i = 0; i < n3 && ws->tix[i] >= 0; i++, m3++) {
        sv[m3].docno = ws->surv[ws->tix[i]];
        sv[m3].at = (uint32_t)ws->tix[i];
    }
    qsort(sv, m3, sizeof *sv, cmp_survivor);
    for (size_t i = 0; i < m3; i++) {
        ws->cand[i] = sv[i].docno;
        ws->pd[i] = spd[sv[i].at];
    }
    free(sv);
    double t2 = eng_now();
    st->prune += t2 - t1;

    /* Stage 4. */
    if ((rc = exact_columns(r, s, qi, ws, ws->pd, m3, m)))
        return rc;
    rc = exact_topk(r, s, qi, ws, ws->cand, ws->pd, 1, &small, ws->score, m3, st, m);
    st->exact += eng_now() - t2;
    return rc;
}
