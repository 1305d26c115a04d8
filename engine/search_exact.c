/*
 * search_exact.c: exhaustive search, the exact residual-fused MaxSim of every live document
 * (the reference PLAID's recall is measured against).
 *
 * The calling thread walks the documents with one cursor of its reader, in number order, and
 * gathers chunks of kernel pointers into the map; threads then score a chunk for a group of
 * queries at once (work items are (query, slice of the chunk) pairs, so that one query still
 * uses every thread), and each query's running top-k takes the chunk's scores. Documents are
 * read once per group of queries; a group holds as many queries as their score tables
 * (q . C, [lq, K] floats each) fit in GROUP_BYTES. On CPUs with AMX tiles the scores go
 * through a screen first (screened()): bf16 scores with proven error bounds rule out most
 * documents, and only the rest are scored in fp32; the results are the same bit for bit.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "search.h"

/* Documents per chunk: large enough that the kernel's per-call setup (query panels, the
 * transposed score table) is a few percent of the scoring, small enough to stay in cache
 * as pointers. */
#define CHUNK 4096

/* Score tables of one group of queries: bounds memory whatever the batch size. */
#define GROUP_BYTES ((size_t)256 << 20)

typedef struct scan {
    idx_reader *r;
    const eng_search *s;
    int threads;
    size_t g0, g1;   /* the group's queries */
    float **S;       /* [g1 - g0] score tables */
    kern_topk **tk;  /* [g1 - g0] */
    uint32_t *docno; /* [CHUNK] */
    int64_t *ids;    /* [CHUNK] */
    kern_pdoc *pd;   /* [CHUNK] */
    float *score;    /* [(g1 - g0) * CHUNK] */
    int screen;      /* exact scores through the AMX screen (screened()) */
} scan;

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The k-th largest of v [n] (1 <= k <= n; v reordered). */
static float kth_largest(float *v, size_t n, size_t k)
{
    qsort(v, n, sizeof *v, cmp_desc);
    return v[k - 1];
}

/*
 * One item's exact scores through the AMX screen (where usable: see eng_exact_scan): bf16
 * scores with a per-document bound on their error (kern_cpu_maxsim_residual_amx), then the
 * fp32 kernel for the documents the bound cannot rule out of the top k; the others score
 * KERN_EMPTY_SCORE, which top-k never takes. A document is ruled out when (1) at least k
 * documents of the item have a higher bf16 score less their bound than its score plus its
 * bound can reach, or (2) its score plus bound stays below the query's running k-th exact
 * score (top-k full). Either way k documents beat it exactly, so the top k, ties and order
 * included, is the unscreened search's. The bf16 pass runs at the tile unit's rate; the fp32
 * one on a few percent of the documents.
 */
static int screened(scan *c, size_t g, const kern_residual *a, float *out)
{
    size_t nd = a->nd, k = c->s->k;
    float *ap = malloc(nd * sizeof *ap), *bd = malloc(nd * sizeof *bd), *lo = NULL;
    kern_pdoc *pick = NULL;
    size_t *at = NULL;
    int rc = ap && bd ? kern_maxsim_residual_screen(KERN_DEV_CPU, a, ap, bd) : KERN_ENOMEM;
    /* the k-th largest lower end (score - bound) of the item: nothing reaching below it... */
    float kth = -INFINITY;
    if (!rc && nd > k) {
        if (!(lo = malloc(nd * sizeof *lo))) {
            rc = KERN_ENOMEM;
        } else {
            size_t nl = 0;
            for (size_t i = 0; i < nd; i++)
                if (ap[i] != KERN_EMPTY_SCORE)
                    lo[nl++] = ap[i] - bd[i];
            if (nl >= k)
                kth = kth_largest(lo, nl, k);
        }
    }
    /* ... and nothing below the running k-th exact score can enter */
    float run = kern_topk_threshold(c->tk[g]);
    if (!rc) {
        pick = malloc(nd * sizeof *pick);
        at = malloc(nd * sizeof *at);
        if (!pick || !at)
            rc = KERN_ENOMEM;
    }
    size_t np = 0;
    for (size_t i = 0; !rc && i < nd; i++) {
        out[i] = KERN_EMPTY_SCORE;
        float hi = ap[i] + bd[i];
        if (ap[i] == KERN_EMPTY_SCORE || hi < kth || hi < run)
            continue;
        pick[np] = a->docs[i];
        at[np++] = i;
    }
    if (!rc && np) {
        kern_residual b = *a;
        b.docs = pick;
        b.nd = np;
        rc = kern_maxsim_residual(KERN_DEV_CPU, &b, ap); /* ap reused for the exact scores */
        for (size_t j = 0; !rc && j < np; j++)
            out[at[j]] = ap[j];
    }
    free(ap);
    free(bd);
    free(lo);
    free(pick);
    free(at);
    return rc;
}

static int score_chunk(scan *c, size_t n, store_msg *m)
{
    const eng_search *s = c->s;
    const eng_queries *q = s->q;
    size_t G = c->g1 - c->g0;
    size_t slices = 1;
    if (G < (size_t)c->threads) {
        slices = ((size_t)c->threads + G - 1) / G;
        if (slices > n)
            slices = n;
    }
    size_t per = (n + slices - 1) / slices, items = G * slices;
    int err = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->threads) if (items > 1)
    for (size_t it = 0; it < items; it++) {
        size_t g = it / slices, sl = it % slices, b = sl * per, e = b + per < n ? b + per : n;
        if (b >= e)
            continue;
        size_t qi = c->g0 + g;
#ifdef _OPENMP
        if (items > 1)
            omp_set_num_threads(1); /* this item's kernel on this thread alone */
#endif
        kern_residual a = {
            .dim = q->dim,
            .nbits = c->r->h.nbits,
            .code_bytes = c->r->h.code_bytes,
            .q = q->emb + q->off[qi] * q->dim,
            .lq = q->off[qi + 1] - q->off[qi],
            .qc = c->S[g],
            .n_centroids = c->r->h.n_centroids,
            .bucket_weights = c->r->codec.weights,
            .docs = c->pd + b,
            .nd = e - b,
        };
        float *qr = NULL;
        store_msg am;
        int krc = 0;
        if (c->r->axes && eng_axes_query(c->r, &a, &qr, &am))
            krc = KERN_ENOMEM;
        else
            krc = c->screen && !qr
                      ? screened(c, g, &a, c->score + g * CHUNK + b)
                      : kern_maxsim_residual(KERN_DEV_CPU, &a, c->score + g * CHUNK + b);
        free(qr);
        if (krc) {
#pragma omp critical(eng_exact_err)
            if (!err)
                err = krc;
        }
    }
    if (err)
        return eng_kern_fail(err, m, "exact scoring");
    for (size_t g = 0; g < G; g++)
        if (kern_topk_push(c->tk[g], c->score + g * CHUNK, c->ids, n))
            return store_fail(m, ENOMEM, "search: out of memory for top-k");
    return 0;
}

static int scan_group(scan *c, eng_stage_stats *st, store_msg *m)
{
    const eng_search *s = c->s;
    const eng_queries *q = s->q;
    size_t G = c->g1 - c->g0, K = c->r->h.n_centroids;
    int rc = 0, err = 0;
    double t0 = eng_now();
    /* The score tables (q . C) the residual kernel reads. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(c->threads) if (G > 1)
    for (size_t g = 0; g < G; g++) {
        size_t qi = c->g0 + g;
#ifdef _OPENMP
        if (G > 1)
            omp_set_num_threads(1);
#endif
        int krc =
            kern_centroid_scores(KERN_DEV_CPU, q->emb + q->off[qi] * q->dim,
                                 q->off[qi + 1] - q->off[qi], c->r->centroids, K, q->dim, c->S[g]);
        if (krc) {
#pragma omp critical(eng_exact_err)
            if (!err)
                err = krc;
        }
    }
    if (err)
        return eng_kern_fail(err, m, "centroid scores");
    st->cand += eng_now() - t0;

    t0 = eng_now();
    store_cursor *cur = NULL;
    size_t n = 0;
    uint32_t docno;
    kern_pdoc doc;
    c->r->verify = 1;
    while ((rc = idx_reader_next_doc(c->r, &cur, &docno, &doc, m)) == 1) {
        if (s->allowed && (docno >= s->n_docnos || !(s->allowed[docno >> 6] >> (docno & 63) & 1)))
            continue;
        c->docno[n] = docno;
        c->ids[n] = docno;
        c->pd[n] = doc;
        if (++n == CHUNK) {
            if ((rc = score_chunk(c, n, m)))
                break;
            st->n_cand += n * G;
            n = 0;
        }
    }
    if (rc) {
        idx_reader_docs_end(cur);
        return rc;
    }
    if (n && (rc = score_chunk(c, n, m)))
        return rc;
    st->n_cand += n * G;
    st->n_exact = st->n_cand;

    int64_t *idx = malloc((s->k ? s->k : 1) * sizeof *idx);
    if (!idx)
        return store_fail(m, ENOMEM, "search: out of memory for top-k");
    for (size_t g = 0; g < G; g++) {
        size_t qi = c->g0 + g;
        float *hs = s->hit_score + qi * s->k;
        size_t h = kern_topk_take(c->tk[g], idx, hs);
        for (size_t i = 0; i < h; i++)
            s->hit_doc[qi * s->k + i] = (uint32_t)idx[i];
        s->hit_n[qi] = h;
    }
    free(idx);
    st->exact += eng_now() - t0;
    return 0;
}

int eng_exact_scan(idx_reader *r, const eng_search *s, int threads, eng_stage_stats *st,
                   store_msg *m)
{
    const eng_queries *q = s->q;
    size_t K = r->h.n_centroids, nq = q->n;
    scan c = {.r = r, .s = s, .threads = threads > 0 ? threads : 1};
    /* The AMX screen where the CPU has the tiles (TARTAN_EXACT_SCREEN=0: off, to compare; the
     * results are the same) */
    const char *e = getenv("TARTAN_EXACT_SCREEN");
    c.screen =
        s->k > 0 && kern_maxsim_residual_screen_usable(KERN_DEV_CPU) && !(e && strcmp(e, "0") == 0);
    c.S = calloc(nq, sizeof *c.S);
    c.tk = calloc(nq, sizeof *c.tk);
    c.docno = malloc(CHUNK * sizeof *c.docno);
    c.ids = malloc(CHUNK * sizeof *c.ids);
    c.pd = malloc(CHUNK * sizeof *c.pd);
    int rc = 0;
    if (!c.S || !c.tk || !c.docno || !c.ids || !c.pd) {
        rc = store_fail(m, ENOMEM, "search: out of memory");
        goto done;
    }
    for (size_t g0 = 0; g0 < nq && !rc;) {
        /* The group: at least one query, then as many as fit. */
        size_t g1 = g0, bytes = 0;
        while (g1 < nq) {
            size_t b = (q->off[g1 + 1] - q->off[g1]) * K * sizeof(float);
            if (g1 > g0 && bytes + b > GROUP_BYTES)
                break;
            bytes += b;
            g1++;
        }
        c.g0 = g0;
        c.g1 = g1;
        float *score = malloc((g1 - g0) * CHUNK * sizeof(float));
        c.score = score;
        int ok = score != NULL;
        for (size_t g = 0; g < g1 - g0 && ok; g++) {
            c.S[g] = malloc((q->off[g0 + g + 1] - q->off[g0 + g]) * K * sizeof(float));
            c.tk[g] = kern_topk_new(s->k);
            ok = c.S[g] && c.tk[g];
        }
        if (!ok)
            rc = store_fail(m, ENOMEM, "search: out of memory for %zu queries' score tables",
                            g1 - g0);
        else
            rc = scan_group(&c, st, m);
        for (size_t g = 0; g < g1 - g0; g++) {
            free(c.S[g]);
            kern_topk_free(c.tk[g]);
            c.S[g] = NULL;
            c.tk[g] = NULL;
        }
        free(score);
        g0 = g1;
    }
done:
    free(c.S);
    free(c.tk);
    free(c.docno);
    free(c.ids);
    free(c.pd);
    return rc;
}
