/*
 * maxsim_cpu.c: dense and varlen MaxSim on the CPU.
 *
 * Queries are packed once into fp32 panels (valid tokens only, see microkernel_cpu.h). Threads
 * take documents (and, when documents are too few to keep every thread busy, groups of
 * queries). A thread walks its document in chunks of about 128 KiB of fp32 rows: fp32 rows are
 * read where they lie, 16-bit rows are converted into a per-thread buffer; every query panel
 * then runs over the chunk while it is in L2, folding into per-query-token running maxima.
 * Per-thread memory is one chunk plus the running maxima: nothing grows with nq * nd * lq * ld
 * and no ragged document is ever padded.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels_impl.h"
#include "microkernel_cpu.h"

/* The packed queries of one call. */
typedef struct qpack {
    const kern_mk *mk;
    size_t dim, nq;
    float *panels; /* every query's panels, back to back */
    size_t *poff;  /* [nq] offset of query q's first panel in panels, in floats */
    size_t *roff;  /* [nq] offset of query q's running maxima in a thread's buffer */
    size_t *nval;  /* [nq] valid tokens of query q */
    size_t rtotal; /* floats of running maxima for all queries */
    int bf16dot;   /* bf16 inputs multiplied as bf16 pairs (mk->max_bf16) */
} qpack;

/* Where the documents of one call lie. */
typedef struct dsrc {
    kern_dtype t;
    size_t dim, esize;
    const char *base;
    const uint8_t *mask; /* dense only, [nd, ld] or NULL */
    size_t ld;           /* dense: tokens per document */
    const int64_t *off;  /* varlen: [nd + 1] */
} dsrc;

static void qpack_free(qpack *p)
{
    free(p->panels);
    free(p->poff);
    free(p->roff);
    free(p->nval);
}

/*
 * Packs nq queries: query q's tokens are rows first[q] .. first[q] + len[q] - 1 of base, of
 * which those with a nonzero mask byte (mask NULL: all) are valid.
 */
static int qpack_build(qpack *p, const kern_mk *mk, kern_dtype t, size_t dim, const void *base,
                       size_t nq, const int64_t *first, const int64_t *len, size_t lq_fixed,
                       const uint8_t *mask)
{
    size_t es = kern_dtype_size(t), maxlen = 0, total = 0, rtotal = 0;
    memset(p, 0, sizeof *p);
    p->mk = mk;
    p->dim = dim;
    p->nq = nq;
    p->bf16dot = t == KERN_BF16 && mk->max_bf16 && dim % 2 == 0;
    p->poff = malloc(nq * sizeof *p->poff);
    p->roff = malloc(nq * sizeof *p->roff);
    p->nval = malloc(nq * sizeof *p->nval);
    if (!p->poff || !p->roff || !p->nval)
        goto fail;
    for (size_t q = 0; q < nq; q++) {
        size_t f = len ? (size_t)first[q] : q * lq_fixed, l = len ? (size_t)len[q] : lq_fixed;
        size_t nv = 0;
        for (size_t i = 0; i < l; i++)
            nv += !mask || mask[f + i];
        p->nval[q] = nv;
        p->poff[q] = total;
        p->roff[q] = rtotal;
        total += kern_npanels(mk, nv) * kern_panel_floats(mk, dim);
        rtotal += kern_npanels(mk, nv) * mk->P;
        maxlen = l > maxlen ? l : maxlen;
    }
    p->rtotal = rtotal;
    p->panels = kern_aligned_alloc(total * sizeof(float));
    const void **rows = malloc((maxlen ? maxlen : 1) * sizeof *rows);
    if (!p->panels || !rows) {
        free(rows);
        goto fail;
    }
    for (size_t q = 0; q < nq; q++) {
        size_t f = len ? (size_t)first[q] : q * lq_fixed, l = len ? (size_t)len[q] : lq_fixed;
        size_t nv = 0;
        for (size_t i = 0; i < l; i++)
            if (!mask || mask[f + i])
                rows[nv++] = (const char *)base + (f + i) * dim * es;
        if (p->bf16dot)
            kern_pack_panels_bf16(mk, rows, nv, dim, (uint16_t *)(p->panels + p->poff[q]));
        else
            kern_pack_panels(mk, t, rows, nv, dim, p->panels + p->poff[q]);
    }
    free(rows);
    return KERN_OK;
fail:
    qpack_free(p);
    kern_set_error("maxsim: out of memory packing %zu queries", nq);
    return KERN_ENOMEM;
}

/* One thread's working memory. */
typedef struct scratch {
    size_t chunk;            /* rows per chunk */
    const float **rows;      /* [chunk + J] */
    const uint16_t **rows16; /* [chunk + J] bf16 rows read in place (bf16dot) */
    float *conv;             /* [chunk, dim] converted rows (16-bit inputs only) */
    float *rm;               /* [rtotal] running maxima */
} scratch;

static int scratch_init(scratch *s, const qpack *qp, kern_dtype t)
{
    const kern_mk *mk = qp->mk;
    s->chunk = kern_chunk_rows(mk, qp->dim);
    int conv = t != KERN_F32 && !qp->bf16dot;
    s->rows = malloc((s->chunk + mk->J) * sizeof *s->rows);
    s->rows16 = malloc((s->chunk + mk->J) * sizeof *s->rows16);
    s->conv = conv ? kern_aligned_alloc(s->chunk * qp->dim * sizeof(float)) : NULL;
    s->rm = kern_aligned_alloc((qp->rtotal ? qp->rtotal : 1) * sizeof(float));
    return s->rows && s->rows16 && s->rm && (!conv || s->conv);
}

static void scratch_free(scratch *s)
{
    free(s->rows);
    free(s->rows16);
    free(s->conv);
    free(s->rm);
}

/* Scores queries q0 .. q1 - 1 against document n: scores[q * nd + n]. */
static void score_doc(const qpack *qp, size_t q0, size_t q1, const dsrc *ds, size_t n, size_t nd,
                      scratch *s, float *scores)
{
    const kern_mk *mk = qp->mk;
    size_t dim = qp->dim, P = mk->P, J = mk->J, first, count;
    const uint8_t *mask = NULL;
    if (ds->off) {
        first = (size_t)ds->off[n];
        count = (size_t)(ds->off[n + 1] - ds->off[n]);
    } else {
        first = n * ds->ld;
        count = ds->ld;
        mask = ds->mask ? ds->mask + first : NULL;
    }
    for (size_t q = q0; q < q1; q++) {
        float *rm = s->rm + qp->roff[q];
        for (size_t i = 0, e = kern_npanels(mk, qp->nval[q]) * P; i < e; i++)
            rm[i] = -INFINITY;
    }
    size_t t = 0, valid = 0;
    const size_t rowbytes = dim * ds->esize;
    while (t < count) {
        size_t m = 0;
        for (; t < count && m < s->chunk; t++) {
            if (mask && !mask[t])
                continue;
            const char *src = ds->base + (first + t) * rowbytes;
            if (ds->t == KERN_F32) {
                s->rows[m] = (const float *)src;
            } else if (qp->bf16dot) {
                s->rows16[m] = (const uint16_t *)src;
            } else {
                kern_to_f32(mk, ds->t, src, s->conv + m * dim, dim);
                s->rows[m] = s->conv + m * dim;
            }
            m++;
        }
        if (m == 0)
            break;
        valid += m;
        /* Fill the last group with copies of the last row: a repeat cannot change a max. */
        for (size_t g = m; g % J; g++) {
            if (qp->bf16dot)
                s->rows16[g] = s->rows16[m - 1];
            else
                s->rows[g] = s->rows[m - 1];
        }
        for (size_t q = q0; q < q1; q++) {
            size_t nv = qp->nval[q];
            for (size_t p = 0; p * P < nv; p++) {
                const float *qt = qp->panels + qp->poff[q] + p * kern_panel_floats(mk, dim);
                float *mx = s->rm + qp->roff[q] + p * P;
                unsigned lanes = (unsigned)(nv - p * P < P ? nv - p * P : P);
                for (size_t g = 0; g < m; g += J) {
                    /* The first pass over a chunk is the one that reads from memory: it
                     * fetches ahead, fp32 rows the next group, 16-bit ones the next chunk. */
                    const char *pf = NULL;
                    if (q == q0 && p == 0) {
                        if (qp->bf16dot && g + J < m)
                            pf = (const char *)s->rows16[g + J];
                        else if (ds->t == KERN_F32 && g + J < m)
                            pf = (const char *)s->rows[g + J];
                        else if (ds->t != KERN_F32 && !qp->bf16dot &&
                                 t + (g / J + 1) * 2 * J <= count)
                            pf = ds->base + (first + t + (g / J) * 2 * J) * rowbytes;
                    }
                    if (qp->bf16dot)
                        mk->max_bf16((const uint16_t *)qt, dim, s->rows16 + g, lanes, mx, pf);
                    else
                        mk->max(qt, dim, s->rows + g, lanes, mx, pf);
                }
            }
        }
    }
    for (size_t q = q0; q < q1; q++) {
        float sum = 0.0f;
        const float *rm = s->rm + qp->roff[q];
        for (size_t i = 0; i < qp->nval[q]; i++)
            sum += rm[i];
        scores[q * nd + n] = valid ? sum : KERN_EMPTY_SCORE;
    }
}

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Scores every query of qp against nd documents of ds. */
static int run(const qpack *qp, const dsrc *ds, size_t nd, float *scores)
{
    size_t nq = qp->nq, T = (size_t)max_threads();
    /* With fewer documents than a few per thread, split the queries too. */
    size_t groups = 1;
    if (nd < 4 * T && nq > 1) {
        groups = (4 * T + nd - 1) / nd;
        groups = groups > nq ? nq : groups;
    }
    size_t qper = (nq + groups - 1) / groups;
    groups = (nq + qper - 1) / qper;
    size_t work = nd * groups;
    int failed = 0;
#pragma omp parallel
    {
        scratch s;
        int ok = scratch_init(&s, qp, ds->t);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t w = 0; w < work; w++) {
            if (!ok)
                continue;
            size_t n = w / groups, g = w % groups, q0 = g * qper;
            size_t q1 = q0 + qper < nq ? q0 + qper : nq;
            score_doc(qp, q0, q1, ds, n, nd, &s, scores);
        }
        scratch_free(&s);
    }
    if (failed) {
        kern_set_error("maxsim: out of memory for per-thread buffers");
        return KERN_ENOMEM;
    }
    return KERN_OK;
}

int kern_cpu_maxsim_dense(const kern_dense *a, float *scores)
{
    const kern_mk *mk = kern_mk_active();
    qpack qp;
    int rc = qpack_build(&qp, mk, a->dtype, a->dim, a->q, a->nq, NULL, NULL, a->lq, a->qmask);
    if (rc)
        return rc;
    dsrc ds = {a->dtype, a->dim, kern_dtype_size(a->dtype), a->d, a->dmask, a->ld, NULL};
    rc = run(&qp, &ds, a->nd, scores);
    qpack_free(&qp);
    return rc;
}

/* Offsets must start at 0 and never decrease. */
static int offsets_ok(const int64_t *off, size_t n, const char *what)
{
    if (off[0] != 0) {
        kern_set_error("maxsim_varlen: %s offsets start at %lld, not 0", what, (long long)off[0]);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (off[i + 1] < off[i]) {
            kern_set_error("maxsim_varlen: %s offsets decrease at %zu (%lld > %lld)", what, i,
                           (long long)off[i], (long long)off[i + 1]);
            return 0;
        }
    return 1;
}

int kern_cpu_maxsim_varlen(const kern_varlen *a, float *scores)
{
    if (!offsets_ok(a->q_off, a->nq, "query") || !offsets_ok(a->d_off, a->nd, "document"))
        return KERN_EINVAL;
    int64_t *len = malloc(a->nq * sizeof *len);
    if (!len) {
        kern_set_error("maxsim_varlen: out of memory");
        return KERN_ENOMEM;
    }
    for (size_t q = 0; q < a->nq; q++)
        len[q] = a->q_off[q + 1] - a->q_off[q];
    qpack qp;
    int rc =
        qpack_build(&qp, kern_mk_active(), a->dtype, a->dim, a->q, a->nq, a->q_off, len, 0, NULL);
    free(len);
    if (rc)
        return rc;
    dsrc ds = {a->dtype, a->dim, kern_dtype_size(a->dtype), a->d, NULL, 0, a->d_off};
    rc = run(&qp, &ds, a->nd, scores);
    qpack_free(&qp);
    return rc;
}
