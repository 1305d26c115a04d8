/*
 * residual_cpu.c: PLAID scoring straight from the index's compressed tokens on the CPU: the
 * residual-fused exact MaxSim (stage 4) and the centroid interaction (stages 2 and 3).
 *
 * Exact scores use <q_i, d_t> = (q_i . C[code_t] + q_i . r_t) * inv_norm_t with r_t the
 * decoded residual (w[bucket_tj] for each dim j). A thread decodes a chunk of tokens' residuals
 * into fp32 rows (one table read per packed byte), the tile micro-kernel multiplies them with
 * the query panels, and an epilogue adds the centroid term, scales by the inverse norm and folds
 * into the running maxima. Only a chunk of decoded residuals exists at any time; no
 * decompressed document is ever built.
 *
 * Bit layout (index/codec.h, DESIGN.md section 3): each dim's bucket index as nbits bits, least
 * significant bit first, dims in order; the bit stream fills bytes most significant bit first.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_impl.h"
#include "microkernel_cpu.h"

/*
 * Token t's code and inverse norm. Documents may point straight into LMDB's map, which aligns
 * values to 2 bytes only, so 4-byte fields are read with memcpy (a plain load on x86).
 */
static inline uint32_t code_at(const void *codes, unsigned code_bytes, size_t t)
{
    if (code_bytes == 2) {
        uint16_t c;
        memcpy(&c, (const char *)codes + 2 * t, 2);
        return c;
    }
    uint32_t c;
    memcpy(&c, (const char *)codes + 4 * t, 4);
    return c;
}

static inline float inv_norm_at(const float *inv, size_t t)
{
    float v;
    memcpy(&v, (const char *)inv + 4 * t, 4);
    return v;
}

/*
 * When documents hold at least this fraction of n_centroids tokens in all, reading the score
 * table transposed (one contiguous run per token) pays for building it; below, strided reads
 * of the few columns needed are cheaper.
 */
static int want_transpose(const kern_pdoc *docs, size_t nd, size_t n_centroids)
{
    size_t total = 0;
    for (size_t n = 0; n < nd; n++)
        total += docs[n].ntok;
    return total >= n_centroids / 8;
}

/*
 * Fills dec [256][8 / nbits]: the weights of the dims one packed byte holds. Byte bit 7 is the
 * first bit of the stream, and each dim's nbits bits come least significant first.
 */
static void decode_table(unsigned nbits, const float *w, float *dec)
{
    unsigned per = 8 / nbits;
    for (unsigned v = 0; v < 256; v++)
        for (unsigned jj = 0; jj < per; jj++) {
            unsigned bucket = 0;
            for (unsigned u = 0; u < nbits; u++)
                bucket |= ((v >> (7 - (jj * nbits + u))) & 1u) << u;
            dec[v * per + jj] = w[bucket];
        }
}

/* Decodes one token's packed residual into its dim weights, (8 / nbits) dims per byte. */
static inline void decode_token(const uint8_t *src, size_t tb, unsigned nbits, const float *dec,
                                float *dst)
{
    /* Fixed-size copies per nbits, so that the compiler inlines them as vector moves. */
    switch (nbits) {
    case 1:
        for (size_t b = 0; b < tb; b++)
            memcpy(dst + b * 8, dec + src[b] * 8, 8 * sizeof(float));
        break;
    case 2:
        for (size_t b = 0; b < tb; b++)
            memcpy(dst + b * 4, dec + src[b] * 4, 4 * sizeof(float));
        break;
    case 4:
        for (size_t b = 0; b < tb; b++)
            memcpy(dst + b * 2, dec + src[b] * 2, 2 * sizeof(float));
        break;
    default:
        for (size_t b = 0; b < tb; b++)
            dst[b] = dec[src[b]];
    }
}

/* Decodes one token of the axes code (kernels.h): each run of positions copies 8 / w floats
 * a byte from its own table; the dims past the coded ones are 0 (set once per buffer). */
static inline void decode_token_axes(const uint8_t *src, const unsigned bytes[4], const float *dec,
                                     float *dst)
{
    size_t b = 0;
    for (size_t e = bytes[0]; b < e; b++, dst += 1, dec += 256)
        *dst = dec[src[b]];
    for (size_t e = b + bytes[1]; b < e; b++, dst += 2, dec += 512)
        memcpy(dst, dec + src[b] * 2, 2 * sizeof(float));
    for (size_t e = b + bytes[2]; b < e; b++, dst += 4, dec += 1024)
        memcpy(dst, dec + src[b] * 4, 4 * sizeof(float));
    for (size_t e = b + bytes[3]; b < e; b++, dst += 8, dec += 2048)
        memcpy(dst, dec + src[b] * 8, 8 * sizeof(float));
}

/* Checks that every document with tokens has its arrays, and every code is a centroid. */
static int docs_ok(const kern_pdoc *docs, size_t nd, unsigned code_bytes, size_t n_centroids,
                   int need_residuals, const char *who)
{
    for (size_t n = 0; n < nd; n++) {
        const kern_pdoc *d = &docs[n];
        if (d->ntok == 0)
            continue;
        if (!d->codes || (need_residuals && (!d->residuals || !d->inv_norms))) {
            kern_set_error("%s: document %zu has %u tokens but NULL arrays", who, n, d->ntok);
            return 0;
        }
        for (uint32_t t = 0; t < d->ntok; t++)
            if (code_at(d->codes, code_bytes, t) >= n_centroids) {
                kern_set_error("%s: document %zu token %u has code %u, past %zu centroids", who, n,
                               t, code_at(d->codes, code_bytes, t), n_centroids);
                return 0;
            }
    }
    return 1;
}

int kern_cpu_residual_docs_ok(const kern_residual *a, const char *who)
{
    return docs_ok(a->docs, a->nd, a->code_bytes, a->n_centroids, 1, who);
}

int kern_cpu_maxsim_residual(const kern_residual *a, float *scores)
{
    const kern_mk *mk = kern_mk_active();
    size_t dim = a->dim, lq = a->lq, K = a->n_centroids, P = mk->P, J = mk->J;
    const int axes = a->axes_dec != NULL;
    size_t np = kern_npanels(mk, lq), lq_pad = np * P;
    size_t tb =
        axes ? (size_t)a->axes_bytes[0] + a->axes_bytes[1] + a->axes_bytes[2] + a->axes_bytes[3]
             : dim * a->nbits / 8;
    unsigned per = axes ? 1 : 8 / a->nbits;
    if (!docs_ok(a->docs, a->nd, a->code_bytes, K, 1, "maxsim_residual"))
        return KERN_EINVAL;

    float *panels = kern_aligned_alloc(np * kern_panel_floats(mk, dim) * sizeof(float));
    float *dec = axes ? NULL : malloc(256 * per * sizeof(float));
    const void **qrows = malloc((lq ? lq : 1) * sizeof *qrows);
    float *qcT = NULL;     /* a transpose of qc made here */
    const float *T = NULL; /* the transposed table read: a->qcT or qcT */
    size_t ldT = lq_pad;
    if (a->qcT) {
        T = a->qcT;
        ldT = a->ld;
    } else if (lq && want_transpose(a->docs, a->nd, K))
        T = qcT = kern_transpose_scores(a->qc, lq, K, lq_pad);
    int failed = !panels || (!axes && !dec) || !qrows;
    if (!failed) {
        for (size_t i = 0; i < lq; i++)
            qrows[i] = a->q + i * dim;
        kern_pack_panels(mk, KERN_F32, qrows, lq, dim, panels);
        if (!axes)
            decode_table(a->nbits, a->bucket_weights, dec);
    }
    free(qrows);

#pragma omp parallel if (!failed)
    {
        size_t chunk = kern_chunk_rows(mk, dim);
        float *conv = kern_aligned_alloc(chunk * dim * sizeof(float));
        float *rm = kern_aligned_alloc((lq_pad ? lq_pad : 1) * sizeof(float));
        const float **rows = malloc((chunk + J) * sizeof *rows);
        /* Per group: each row's centroid scores (pointers into qcT, or gathered into cols
         * from the strided table) and inverse norm. */
        float cols[KERN_MK_MAX_J * KERN_MK_MAX_P] __attribute__((aligned(64)));
        const float *add[KERN_MK_MAX_J];
        float scale[KERN_MK_MAX_J];
        int ok = conv && rm && rows && !failed;
        /* The axes code leaves the dims past its coded ones at 0 in every row. */
        if (ok && axes)
            memset(conv, 0, chunk * dim * sizeof(float));
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t n = 0; n < a->nd; n++) {
            if (!ok)
                continue;
            const kern_pdoc *d = &a->docs[n];
            for (size_t i = 0; i < lq_pad; i++)
                rm[i] = -INFINITY;
            for (size_t t0 = 0; t0 < d->ntok; t0 += chunk) {
                size_t m = d->ntok - t0 < chunk ? d->ntok - t0 : chunk;
                for (size_t t = 0; t < m; t++) {
                    if (axes)
                        decode_token_axes(d->residuals + (t0 + t) * tb, a->axes_bytes, a->axes_dec,
                                          conv + t * dim);
                    else
                        decode_token(d->residuals + (t0 + t) * tb, tb, a->nbits, dec,
                                     conv + t * dim);
                    rows[t] = conv + t * dim;
                }
                for (size_t g = m; g % J; g++)
                    rows[g] = rows[m - 1];
                for (size_t p = 0; p < np; p++) {
                    const float *qt = panels + p * kern_panel_floats(mk, dim);
                    size_t lanes = lq - p * P < P ? lq - p * P : P;
                    for (size_t g = 0; g < m; g += J) {
                        for (size_t j = 0; j < J; j++) {
                            /* Rows past the chunk repeat its last token, offset and scale. */
                            size_t t = t0 + (g + j < m ? g + j : m - 1);
                            uint32_t code = code_at(d->codes, a->code_bytes, t);
                            scale[j] = inv_norm_at(d->inv_norms, t);
                            if (T) {
                                add[j] = T + code * ldT + p * P;
                            } else {
                                const float *c = a->qc + p * P * K + code;
                                for (size_t l = 0; l < P; l++)
                                    cols[j * P + l] = l < lanes ? c[l * K] : 0.0f;
                                add[j] = cols + j * P;
                            }
                        }
                        /* The next group's centroid-score rows: random reads in a table
                         * larger than L2, fetched while this group computes. */
                        if (T)
                            for (size_t t = t0 + g + J; t < t0 + g + 2 * J && t < t0 + m; t++) {
                                const char *row =
                                    (const char *)(T + code_at(d->codes, a->code_bytes, t) * ldT +
                                                   p * P);
                                __builtin_prefetch(row);
                                __builtin_prefetch(row + 64);
                            }
                        mk->max_affine(qt, dim, rows + g, (unsigned)lanes, rm + p * P, add, scale);
                    }
                }
            }
            float sum = 0.0f;
            for (size_t i = 0; i < lq; i++)
                sum += rm[i];
            scores[n] = d->ntok ? sum : KERN_EMPTY_SCORE;
        }
        free(conv);
        free(rm);
        free(rows);
    }
    free(panels);
    free(dec);
    free(qcT);
    if (failed) {
        kern_set_error("maxsim_residual: out of memory");
        return KERN_ENOMEM;
    }
    return KERN_OK;
}

/* The interaction from S [lq, K] (ST NULL) or from ST [K, ld] (ld >= lq_pad). */
static int interaction(const float *S, const float *ST, size_t ld, size_t lq, size_t n_centroids,
                       unsigned code_bytes, const kern_pdoc *docs, size_t nd, const uint8_t *keep,
                       float *approx)
{
    size_t K = n_centroids, lq_pad = (lq + 15) & ~(size_t)15;
    int failed = 0;
#pragma omp parallel
    {
        float *mx = kern_aligned_alloc((lq_pad ? lq_pad : 1) * sizeof(float));
        if (!mx) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (size_t n = 0; n < nd; n++) {
            if (!mx)
                continue;
            const kern_pdoc *d = &docs[n];
            size_t kept = 0;
            for (size_t i = 0; i < lq_pad; i++)
                mx[i] = -INFINITY;
            for (uint32_t t = 0; t < d->ntok; t++) {
                uint32_t code = code_at(d->codes, code_bytes, t);
                if (keep && !keep[code])
                    continue;
                kept++;
                if (ST) {
                    const float *row = ST + (size_t)code * ld;
                    /* row and mx never overlap: vectorised without the compiler's check */
#pragma omp simd
                    for (size_t i = 0; i < lq_pad; i++)
                        mx[i] = row[i] > mx[i] ? row[i] : mx[i];
                } else {
                    for (size_t i = 0; i < lq; i++) {
                        float v = S[i * K + code];
                        mx[i] = v > mx[i] ? v : mx[i];
                    }
                }
            }
            float sum = 0.0f;
            for (size_t i = 0; i < lq; i++)
                sum += mx[i];
            approx[n] = kept ? sum : KERN_EMPTY_SCORE;
        }
        free(mx);
    }
    if (failed) {
        kern_set_error("centroid_interaction: out of memory");
        return KERN_ENOMEM;
    }
    return KERN_OK;
}

int kern_cpu_centroid_interaction(const float *S, size_t lq, size_t n_centroids,
                                  unsigned code_bytes, const kern_pdoc *docs, size_t nd,
                                  const uint8_t *keep, float *approx)
{
    size_t K = n_centroids, lq_pad = (lq + 15) & ~(size_t)15;
    if (!docs_ok(docs, nd, code_bytes, K, 0, "centroid_interaction"))
        return KERN_EINVAL;
    float *ST = NULL;
    if (lq && want_transpose(docs, nd, K)) {
        ST = kern_transpose_scores(S, lq, K, lq_pad);
        if (!ST) {
            kern_set_error("centroid_interaction: out of memory");
            return KERN_ENOMEM;
        }
    }
    int rc = interaction(S, ST, lq_pad, lq, K, code_bytes, docs, nd, keep, approx);
    free(ST);
    return rc;
}

int kern_cpu_centroid_interaction_t(const float *ST, size_t ld, size_t lq, size_t n_centroids,
                                    unsigned code_bytes, const kern_pdoc *docs, size_t nd,
                                    const uint8_t *keep, float *approx)
{
    if (!docs_ok(docs, nd, code_bytes, n_centroids, 0, "centroid_interaction"))
        return KERN_EINVAL;
    return interaction(NULL, ST, ld, lq, n_centroids, code_bytes, docs, nd, keep, approx);
}
