/*
 * check_kernels_plaid.c: PLAID's kernels on the CPU: centroid scores, residual-fused scoring of
 * compressed documents against a double-precision decompression written from the spec (every
 * nbits, code width, long and unaligned documents), and the centroid-interaction bound.
 */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "fixture_kernels.h"
#include "kernels.h"
#include "kernels_impl.h"
#include "microkernel_cpu.h"

/* ---- centroid scores ------------------------------------------------------------------- */

START_TEST(test_kernels_centroid_scores)
{
    rng_init_random();
    static const size_t shapes[][3] = {{32, 1000, 128}, {1, 37, 64}, {45, 513, 96}, {3, 5, 1024}};
    for (size_t s = 0; s < 4; s++) {
        size_t lq = shapes[s][0], K = shapes[s][1], dim = shapes[s][2];
        emb q, c;
        emb_rand(&q, KERN_F32, lq, dim);
        emb_rand(&c, KERN_F32, K, dim);
        float *S = xcalloc(lq * K, sizeof(float));
        FOR_EACH_ISA(isa)
        {
            poison(S, lq * K);
            ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q.val, lq, c.val, K, dim, S),
                             KERN_OK);
            for (size_t i = 0; i < lq; i++)
                for (size_t k = 0; k < K; k++) {
                    double dot = 0.0, b = 0.0;
                    for (size_t j = 0; j < dim; j++) {
                        dot += (double)q.val[i * dim + j] * c.val[k * dim + j];
                        b += fabs((double)q.val[i * dim + j] * c.val[k * dim + j]);
                    }
                    assert_close(S[i * K + k], dot, b, isa, i, k);
                }
        }
        kern_cpu_force_isa(NULL);
        emb_free(&q);
        emb_free(&c);
        free(S);
    }
}
END_TEST

/* ---- the bf16 probe (stage 1 on AMX tiles) --------------------------------------------- */

/* Whether (va, ia) ranks before (vb, ib) in top-k's order. */
static int ranks_before(float va, int64_t ia, float vb, int64_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

START_TEST(test_kernels_centroid_probe)
{
    rng_init_random();
    if (!kern_cpu_amx_usable()) {
        kern_probe_table *t = NULL;
        float c[8] = {0};
        ck_assert_int_eq(kern_probe_table_new(KERN_DEV_CPU, c, 1, 8, &t), KERN_ENODEV);
        ck_assert_ptr_null(t);
        fprintf(stderr, "centroid_probe: no AMX here; only the refusal checked\n");
        return;
    }
    static const size_t sh[][4] = {{32, 1000, 128, 1}, {17, 513, 96, 4},   {45, 300, 64, 8},
                                   {1, 37, 128, 1},    {21, 4096, 384, 2}, {40, 2000, 128, 16},
                                   {8, 64, 40, 64}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        size_t lq = sh[s][0], K = sh[s][1], dim = sh[s][2], nc = sh[s][3];
        emb q, c;
        emb_rand(&q, KERN_F32, lq, dim);
        emb_rand(&c, KERN_F32, K, dim);
        /* Near ties the bf16 scores cannot separate: centroid 2j + 1 is centroid 2j with one
         * value moved by an ulp (j < K / 8), or the same (j % 3 == 0: exact ties, which go to
         * the lower index); query token i % 4 == 1 is a centroid itself (a clear best). */
        for (size_t j = 0; 2 * j + 1 < K / 4; j++) {
            float *a = c.val + 2 * j * dim, *b = a + dim;
            memcpy(b, a, dim * sizeof(float));
            if (j % 3)
                b[rnd_below(dim)] = nextafterf(a[rnd_below(dim)], j % 2 ? INFINITY : -INFINITY);
        }
        for (size_t i = 1; i < lq; i += 4)
            memcpy(q.val + i * dim, c.val + rnd_below(K) * dim, dim * sizeof(float));
        /* token 2 (when there is one): all zero, every score 0: the window holds every
         * centroid, so the token goes to fp32 where they are more than the list's nc + 256 */
        if (lq > 2)
            memset(q.val + 2 * dim, 0, dim * sizeof(float));
        float *S = xcalloc(lq * K, sizeof(float)), *Sr = xcalloc(lq * K, sizeof(float));
        /* the transposed copy, 16 lanes wider than it needs (lanes past lq come back zero) */
        size_t ld = (lq + 15) / 16 * 16 + 16;
        float *ST = xcalloc(K * ld, sizeof(float));
        float *val = xcalloc(lq * nc, sizeof(float)), *vr = xcalloc(lq * nc, sizeof(float));
        int64_t *idx = xcalloc(lq * nc, sizeof(int64_t)), *ir = xcalloc(lq * nc, sizeof(int64_t));
        ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q.val, lq, c.val, K, dim, Sr), KERN_OK);
        ck_assert_int_eq(kern_topk_rows(KERN_DEV_CPU, Sr, lq, K, nc, ir, vr), KERN_OK);
        kern_probe_table *t = NULL;
        ck_assert_int_eq(kern_probe_table_new(KERN_DEV_CPU, c.val, K, dim, &t), KERN_OK);
        ck_assert(kern_probe_table_matches(t, c.val, K, dim));
        ck_assert(!kern_probe_table_matches(t, c.val, K - 1, dim));
        poison(S, lq * K);
        poison(ST, K * ld);
        poison(val, lq * nc);
        for (size_t i = 0; i < lq * nc; i++)
            idx[i] = -7;
        size_t nf = 99;
        ck_assert_int_eq(
            kern_centroid_probe(KERN_DEV_CPU, t, c.val, q.val, lq, nc, S, ST, ld, idx, val, &nf),
            KERN_OK);
        for (size_t cc = 0; cc < K; cc++)
            for (size_t i = 0; i < ld; i++)
                ck_assert_msg(i < lq ? memcmp(&ST[cc * ld + i], &S[i * K + cc], sizeof(float)) == 0
                                     : ST[cc * ld + i] == 0.0f,
                              "ST[%zu][%zu] %.9g, S %.9g", cc, i, ST[cc * ld + i],
                              i < lq ? S[i * K + cc] : 0.0f);
        for (size_t i = 0; i < lq; i++) {
            /* the fp32 table's top nc, bit for bit */
            for (size_t j = 0; j < nc; j++) {
                ck_assert_msg(idx[i * nc + j] == ir[i * nc + j] &&
                                  memcmp(&val[i * nc + j], &vr[i * nc + j], sizeof(float)) == 0,
                              "shape %zu token %zu rank %zu: %lld %.9g, fp32 %lld %.9g", s, i, j,
                              (long long)idx[i * nc + j], val[i * nc + j],
                              (long long)ir[i * nc + j], vr[i * nc + j]);
            }
            /* against double precision: each score within fp32 rounding, best first, and no
             * centroid left out beats the last one taken by more than fp32 rounding */
            double qn = 0;
            for (size_t k = 0; k < dim; k++)
                qn += (double)q.val[i * dim + k] * q.val[i * dim + k];
            double worst = INFINITY;
            for (size_t j = 0; j < nc; j++) {
                int64_t cj = idx[i * nc + j];
                ck_assert(cj >= 0 && (size_t)cj < K);
                double dot = 0, ab = 0;
                for (size_t k = 0; k < dim; k++) {
                    dot += (double)q.val[i * dim + k] * c.val[cj * dim + k];
                    ab += fabs((double)q.val[i * dim + k] * c.val[cj * dim + k]);
                }
                ck_assert_msg(fabs(val[i * nc + j] - dot) <= 1e-6 * ab + 1e-30,
                              "token %zu: %.9g against %.9g", i, val[i * nc + j], dot);
                if (j)
                    ck_assert(ranks_before(val[i * nc + j - 1], idx[i * nc + j - 1],
                                           val[i * nc + j], cj));
                worst = dot < worst ? dot : worst;
            }
            for (size_t cc = 0; cc < K; cc++) {
                double dot = 0, ab = 0;
                for (size_t k = 0; k < dim; k++) {
                    dot += (double)q.val[i * dim + k] * c.val[cc * dim + k];
                    ab += fabs((double)q.val[i * dim + k] * c.val[cc * dim + k]);
                }
                int taken = 0;
                for (size_t j = 0; j < nc; j++)
                    taken |= idx[i * nc + j] == (int64_t)cc;
                if (!taken)
                    ck_assert_msg(dot <= worst + 2e-6 * sqrt(qn) + 1e-6 * ab,
                                  "token %zu: centroid %zu (%.9g) left out, last taken %.9g", i, cc,
                                  dot, worst);
                /* S: bf16 products, within bf16 rounding (2^-8 relative a product, with room
                 * for the sum) of the exact score; rescored entries are fp32's */
                ck_assert_msg(fabs(S[i * K + cc] - dot) <= 0x1p-7 * ab + 1e-6,
                              "token %zu centroid %zu: S %.9g against %.9g", i, cc, S[i * K + cc],
                              dot);
            }
        }
        if (lq > 2 && K > nc + 256)
            ck_assert_uint_ge(nf, 1);
        /* chosen columns of the fp32 table, bit for bit */
        size_t nsel = 1 + rnd_below(K < 300 ? K : 300);
        uint32_t *cols = xcalloc(nsel, sizeof(uint32_t));
        for (size_t j = 0; j < nsel; j++)
            cols[j] = (uint32_t)rnd_below(K);
        float *out = xcalloc(ld * nsel, sizeof(float));
        poison(out, ld * nsel);
        ck_assert_int_eq(
            kern_centroid_scores_cols(KERN_DEV_CPU, q.val, lq, c.val, dim, cols, nsel, out, ld),
            KERN_OK);
        for (size_t i = 0; i < lq; i++)
            for (size_t j = 0; j < nsel; j++)
                ck_assert(memcmp(&out[j * ld + i], &Sr[i * K + cols[j]], sizeof(float)) == 0);
        /* another table's centroids are told apart */
        c.val[(32 * K / 64) * dim] += 0.5f;
        ck_assert(!kern_probe_table_matches(t, c.val, K, dim));
        ck_assert_int_eq(kern_centroid_probe(KERN_DEV_CPU, t, c.val, q.val, lq, K + 1, S, NULL, 0,
                                             idx, val, NULL),
                         KERN_EINVAL);
        kern_probe_table_free(t);
        free(cols);
        free(out);
        free(S);
        free(ST);
        free(Sr);
        free(val);
        free(vr);
        free(idx);
        free(ir);
        emb_free(&q);
        emb_free(&c);
    }
}
END_TEST

/* ---- residual-fused PLAID scoring ------------------------------------------------------- */

/*
 * The reference packer, written from the spec: each dim's bucket as nbits bits, least
 * significant first, dims in order; the bit stream into bytes, most significant bit first.
 */
static void ref_pack(const uint8_t *buckets, size_t dim, unsigned nbits, uint8_t *out)
{
    memset(out, 0, dim * nbits / 8);
    size_t bit = 0;
    for (size_t j = 0; j < dim; j++)
        for (unsigned u = 0; u < nbits; u++, bit++)
            if ((buckets[j] >> u) & 1)
                out[bit / 8] |= (uint8_t)(0x80u >> (bit % 8));
}

/* A PLAID corpus: centroids, codebook weights, documents decompressed in double. */
typedef struct plaid {
    size_t dim, K, nd;
    unsigned nbits, code_bytes;
    float *C, w[256];
    int64_t *off;
    void *codes;
    uint8_t *buckets, *packed;
    float *inv;
    double *dec; /* decompressed, normalised tokens [T, dim] */
    kern_pdoc *docs;
} plaid;

static void plaid_make(plaid *p, size_t dim, size_t K, size_t nd, size_t maxlen, unsigned nbits,
                       unsigned code_bytes)
{
    memset(p, 0, sizeof *p);
    p->dim = dim;
    p->K = K;
    p->nd = nd;
    p->nbits = nbits;
    p->code_bytes = code_bytes;
    p->C = xcalloc(K * dim, sizeof(float));
    for (size_t i = 0; i < K * dim; i++)
        p->C[i] = frnd() * 0.2f;
    unsigned B = 1u << nbits;
    for (unsigned b = 0; b < B; b++) /* ascending, like trained quantiles */
        p->w[b] = -0.1f + 0.2f * ((float)b + 0.5f) / (float)B + 0.01f * frnd() / (float)B;
    p->off = ragged_offsets(nd, maxlen);
    size_t T = (size_t)p->off[nd], tb = dim * nbits / 8;
    p->codes = xcalloc(T, code_bytes);
    p->buckets = xcalloc(T * dim, 1);
    p->packed = xcalloc(T * tb, 1);
    p->inv = xcalloc(T, sizeof(float));
    p->dec = xcalloc(T * dim, sizeof(double));
    p->docs = xcalloc(nd, sizeof(kern_pdoc));
    for (size_t t = 0; t < T; t++) {
        uint32_t code = (uint32_t)(rnd() % K);
        if (code_bytes == 2)
            ((uint16_t *)p->codes)[t] = (uint16_t)code;
        else
            ((uint32_t *)p->codes)[t] = code;
        double nrm = 0.0;
        for (size_t j = 0; j < dim; j++) {
            p->buckets[t * dim + j] = (uint8_t)(rnd() % B);
            double v = (double)p->C[code * dim + j] + p->w[p->buckets[t * dim + j]];
            p->dec[t * dim + j] = v;
            nrm += v * v;
        }
        p->inv[t] = (float)(1.0 / sqrt(nrm));
        for (size_t j = 0; j < dim; j++)
            p->dec[t * dim + j] /= sqrt(nrm);
        ref_pack(p->buckets + t * dim, dim, nbits, p->packed + t * tb);
    }
    for (size_t n = 0; n < nd; n++) {
        size_t f = (size_t)p->off[n];
        p->docs[n] = (kern_pdoc){(const char *)p->codes + f * code_bytes, p->packed + f * tb,
                                 p->inv + f, (uint32_t)(p->off[n + 1] - p->off[n])};
    }
}

static void plaid_free(plaid *p)
{
    free(p->C);
    free(p->off);
    free(p->codes);
    free(p->buckets);
    free(p->packed);
    free(p->inv);
    free(p->dec);
    free(p->docs);
}

/* MaxSim in double of q [lq, dim] against the decompressed document n. */
static double plaid_ref(const plaid *p, const float *q, size_t lq, size_t n, double *bound)
{
    size_t f = (size_t)p->off[n], ld = (size_t)(p->off[n + 1] - p->off[n]), dim = p->dim;
    *bound = 0.0;
    if (ld == 0)
        return -INFINITY;
    double s = 0.0;
    for (size_t i = 0; i < lq; i++) {
        double mx = -INFINITY, mb = 0.0;
        for (size_t t = f; t < f + ld; t++) {
            double dot = 0.0, ab = 0.0;
            for (size_t j = 0; j < dim; j++) {
                dot += q[i * dim + j] * p->dec[t * dim + j];
                ab += fabs(q[i * dim + j] * p->dec[t * dim + j]);
            }
            mx = dot > mx ? dot : mx;
            mb = ab > mb ? ab : mb;
        }
        s += mx;
        *bound += mb;
    }
    return s;
}

static void check_residual(size_t dim, size_t K, size_t nd, size_t maxlen, size_t lq,
                           unsigned nbits, unsigned code_bytes)
{
    plaid p;
    plaid_make(&p, dim, K, nd, maxlen, nbits, code_bytes);
    emb q;
    emb_rand(&q, KERN_F32, lq, dim);
    float *qc = xcalloc(lq * K, sizeof(float)), *scores = xcalloc(nd, sizeof(float));
    ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q.val, lq, p.C, K, dim, qc), KERN_OK);
    kern_residual a = {dim,    nbits, code_bytes, q.val, lq,   qc,           K, p.w,
                       p.docs, nd,    NULL,       0,     NULL, {0, 0, 0, 0}, 0};
    FOR_EACH_ISA(isa)
    {
        poison(scores, nd);
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, scores), KERN_OK);
        for (size_t n = 0; n < nd; n++) {
            double bound, ref = plaid_ref(&p, q.val, lq, n, &bound);
            /* Inverse norms are stored in fp32: allow their rounding too. */
            assert_close(scores[n], ref, bound * 2.0, isa, nbits, n);
        }
        /* The table given transposed (qcT, a wider ld, lanes past lq finite junk): the same
         * scores bit for bit. */
        if (nd && (p.off[nd] >= (int64_t)K / 8)) {
            size_t ld = (lq + 31) / 32 * 32 + 32;
            float *qcT = xcalloc(K * ld, sizeof(float)), *s2 = xcalloc(nd, sizeof(float));
            for (size_t c = 0; c < K; c++)
                for (size_t i = 0; i < ld; i++)
                    qcT[c * ld + i] = i < lq ? qc[i * K + c] : 1e3f;
            kern_residual b = a;
            b.qc = NULL;
            b.qcT = qcT;
            b.ld = ld;
            poison(s2, nd);
            ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &b, s2), KERN_OK);
            for (size_t n = 0; n < nd; n++)
                ck_assert_msg(memcmp(&s2[n], &scores[n], sizeof(float)) == 0,
                              "%s doc %zu: qcT %.9g, qc %.9g", isa, n, s2[n], scores[n]);
            b.ld = (lq + 31) / 32 * 32 - 1;
            ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &b, s2), KERN_EINVAL);
            free(qcT);
            free(s2);
        }
    }
    kern_cpu_force_isa(NULL);
    emb_free(&q);
    free(qc);
    free(scores);
    plaid_free(&p);
}

START_TEST(test_kernels_residual_bit_order)
{
    /*
     * dim 8, nbits 2, buckets 0 1 2 3 3 2 1 0. LSB first per dim gives the bit stream
     * 00 10 01 11 | 11 01 10 00, packed MSB first: 0x27 0xd8. With nbits 1 and buckets
     * 1 0 0 0 0 0 1 1 the stream is the byte 0x83.
     */
    const uint8_t b2[8] = {0, 1, 2, 3, 3, 2, 1, 0}, b1[8] = {1, 0, 0, 0, 0, 0, 1, 1};
    uint8_t out[2];
    ref_pack(b2, 8, 2, out);
    ck_assert_uint_eq(out[0], 0x27);
    ck_assert_uint_eq(out[1], 0xd8);
    ref_pack(b1, 8, 1, out);
    ck_assert_uint_eq(out[0], 0x83);

    /* The kernel on those bytes: centroid 0 is zero, so <q, d> = (q . w[b]) * inv_norm. With
     * q = e_j the score picks out w[bucket_j] * inv_norm: each dim's bucket, read back. */
    float w[4] = {1.0f, 10.0f, 100.0f, 1000.0f}, C[8] = {0}, q[64] = {0}, qc[8] = {0};
    for (int j = 0; j < 8; j++)
        q[j * 8 + j] = 1.0f;
    const uint8_t packed2[2] = {0x27, 0xd8}, packed1[1] = {0x83};
    uint16_t code = 0;
    float inv = 1.0f, s = NAN;
    kern_pdoc doc = {&code, packed2, &inv, 1};
    for (int j = 0; j < 8; j++) {
        kern_residual a = {8,    2, 2,    q + j * 8, 1,    qc,           1, w,
                           &doc, 1, NULL, 0,         NULL, {0, 0, 0, 0}, 0};
        s = NAN;
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, &s), KERN_OK);
        ck_assert_msg(s == w[b2[j]], "nbits 2 dim %d: %g != %g", j, s, w[b2[j]]);
    }
    doc.residuals = packed1;
    for (int j = 0; j < 8; j++) {
        kern_residual a = {8,    1, 2,    q + j * 8, 1,    qc,           1, w,
                           &doc, 1, NULL, 0,         NULL, {0, 0, 0, 0}, 0};
        s = NAN;
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, &s), KERN_OK);
        ck_assert_msg(s == w[b1[j]], "nbits 1 dim %d: %g != %g", j, s, w[b1[j]]);
    }
    (void)C;
}
END_TEST

START_TEST(test_kernels_residual_nbits)
{
    rng_init_random();
    static const unsigned nb[] = {1, 2, 4, 8};
    for (size_t i = 0; i < 4; i++) {
        check_residual(128, 64, 20, 40, 32, nb[i], 2);
        check_residual(64, 300, 12, 30, 7, nb[i], 4);
    }
}
END_TEST

START_TEST(test_kernels_residual_strided_table)
{
    /* Few tokens, many centroids: the kernel reads the score table without transposing. */
    rng_init_random();
    check_residual(96, 5000, 6, 20, 32, 2, 2);
    check_residual(128, 70000, 3, 10, 5, 4, 4);
}
END_TEST

START_TEST(test_kernels_residual_long_docs)
{
    /* Documents longer than one chunk, and more query tokens than one panel. */
    rng_init_random();
    check_residual(128, 32, 3, 900, 40, 2, 2);
}
END_TEST

START_TEST(test_kernels_residual_unaligned)
{
    /* Codes and inverse norms read from memory aligned to 2 bytes only (as in LMDB's map)
     * give the same scores as aligned copies. */
    rng_init_random();
    plaid p;
    size_t dim = 64, K = 50, nd = 9, lq = 8;
    plaid_make(&p, dim, K, nd, 30, 2, 4);
    size_t T = (size_t)p.off[nd];
    char *cbuf = xcalloc(T * 4 + 8, 1), *ibuf = xcalloc(T * 4 + 8, 1);
    memcpy(cbuf + 2, p.codes, T * 4);
    memcpy(ibuf + 2, p.inv, T * 4);
    kern_pdoc *ud = xcalloc(nd, sizeof *ud);
    for (size_t n = 0; n < nd; n++) {
        ud[n] = p.docs[n];
        ud[n].codes = cbuf + 2 + 4 * p.off[n];
        ud[n].inv_norms = (const float *)(ibuf + 2 + 4 * p.off[n]);
    }
    emb q;
    emb_rand(&q, KERN_F32, lq, dim);
    float *qc = xcalloc(lq * K, sizeof(float)), s1[9], s2[9], a1[9], a2[9];
    ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q.val, lq, p.C, K, dim, qc), KERN_OK);
    kern_residual a = {dim,    2,  4,    q.val, lq,   qc,           K, p.w,
                       p.docs, nd, NULL, 0,     NULL, {0, 0, 0, 0}, 0};
    poison(s1, nd);
    poison(s2, nd);
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s1), KERN_OK);
    a.docs = ud;
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s2), KERN_OK);
    poison(a1, nd);
    poison(a2, nd);
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, qc, lq, K, 4, p.docs, nd, NULL, a1),
                     KERN_OK);
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, qc, lq, K, 4, ud, nd, NULL, a2),
                     KERN_OK);
    for (size_t n = 0; n < nd; n++) {
        ck_assert(memcmp(&s1[n], &s2[n], 4) == 0 && !isnan(s1[n]));
        ck_assert(memcmp(&a1[n], &a2[n], 4) == 0 && !isnan(a1[n]));
    }
    emb_free(&q);
    free(qc);
    free(ud);
    free(cbuf);
    free(ibuf);
    plaid_free(&p);
}
END_TEST

START_TEST(test_kernels_residual_bad_input)
{
    float w[4] = {0}, q[8] = {0}, qc[2] = {0}, inv[2] = {1, 1}, s[2];
    uint16_t codes[2] = {0, 2};
    uint8_t res[4] = {0};
    kern_pdoc doc = {codes, res, inv, 2};
    kern_residual a = {8, 2, 2, q, 1, qc, 2, w, &doc, 1, NULL, 0, NULL, {0, 0, 0, 0}, 0};
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL); /* code 2 >= K */
    ck_assert_ptr_nonnull(strstr(kern_last_error(), "code"));
    codes[1] = 1;
    poison(s, 1);
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_OK);
    ck_assert(!isnan(s[0]));
    a.nbits = 3;
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.nbits = 1;
    a.dim = 12; /* 12 bits: not whole bytes */
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.dim = 8;
    a.code_bytes = 3;
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    a.code_bytes = 2;
    doc.residuals = NULL;
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_EINVAL);
    doc.ntok = 0; /* an empty document needs no arrays and scores -inf */
    poison(s, 1);
    ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, s), KERN_OK);
    ck_assert(isinf(s[0]) && s[0] < 0);
}
END_TEST

/*
 * The screen (kern_maxsim_residual_screen): its bound holds for every document against the
 * fp32 kernel's score (AVX-512, the screen's partner), empty documents included, over nbits,
 * code widths, dims not a multiple of 32 and query lengths around the tile's 16; it stays
 * small (under 1% of the largest score a query can have); and an adversarial query, whose
 * every value bf16 rounds by the most in the direction of the residuals' signs, still stays
 * within it. Bad codes are refused as the exact kernel refuses them.
 */
START_TEST(test_kernels_residual_screen_bound)
{
    rng_init_random();
    if (!kern_maxsim_residual_screen_usable(KERN_DEV_CPU)) {
        float w[4] = {0}, q[8] = {0}, qc[1] = {0}, ap[1], bd[1];
        kern_residual a = {8, 2, 2, q, 1, qc, 1, w, NULL, 0, NULL, 0, NULL, {0, 0, 0, 0}, 0};
        ck_assert_int_eq(kern_maxsim_residual_screen(KERN_DEV_CPU, &a, ap, bd), KERN_ENODEV);
        fprintf(stderr, "residual_screen: no AMX here; only the refusal checked\n");
        return;
    }
    static const struct {
        size_t dim, K, nd, maxlen, lq;
        unsigned nbits, code_bytes;
    } sh[] = {{128, 300, 200, 80, 32, 2, 2},
              {128, 64, 50, 40, 16, 1, 4},
              {96, 500, 80, 20, 17, 4, 2},
              {200, 40, 30, 33, 1, 8, 2},
              {64, 1000, 60, 50, 40, 2, 4}};
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++) {
        size_t dim = sh[s].dim, K = sh[s].K, nd = sh[s].nd, lq = sh[s].lq;
        plaid p;
        plaid_make(&p, dim, K, nd, sh[s].maxlen, sh[s].nbits, sh[s].code_bytes);
        emb q;
        emb_rand(&q, KERN_F32, lq, dim);
        if (s == 0) {
            /* query token 0: (1 + 2^-8) times the sign of document 0's first token's
             * residual in each dim: bf16 rounds each value down by 2^-8 (a tie, to even),
             * all in the one direction that moves the residual product most */
            int64_t f = p.off[0];
            for (size_t n = 0; p.off[n + 1] == p.off[n] && n + 1 < nd; n++)
                f = p.off[n + 1];
            for (size_t j = 0; j < dim; j++)
                q.val[j] =
                    (p.w[p.buckets[(size_t)f * dim + j]] >= 0 ? 1.0f : -1.0f) * (1.0f + 0x1p-8f);
        }
        float *qc = xcalloc(lq * K, sizeof(float)), *ex = xcalloc(nd, sizeof(float));
        float *ap = xcalloc(nd, sizeof(float)), *bd = xcalloc(nd, sizeof(float));
        ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, q.val, lq, p.C, K, dim, qc), KERN_OK);
        kern_residual a = {
            dim, sh[s].nbits, sh[s].code_bytes, q.val, lq, qc, K, p.w, p.docs, nd, NULL,
            0,   NULL,        {0, 0, 0, 0},     0};
        ck_assert_int_eq(kern_cpu_force_isa("avx512"), KERN_OK);
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a, ex), KERN_OK);
        poison(ap, nd);
        poison(bd, nd);
        ck_assert_int_eq(kern_maxsim_residual_screen(KERN_DEV_CPU, &a, ap, bd), KERN_OK);
        double qsum = 0;
        for (size_t i = 0; i < lq; i++) {
            double nn = 0;
            for (size_t j = 0; j < dim; j++)
                nn += (double)q.val[i * dim + j] * q.val[i * dim + j];
            qsum += sqrt(nn);
        }
        for (size_t n = 0; n < nd; n++) {
            if (p.off[n + 1] == p.off[n]) {
                ck_assert(ap[n] == KERN_EMPTY_SCORE && ex[n] == KERN_EMPTY_SCORE && bd[n] == 0);
                continue;
            }
            ck_assert_msg(isfinite(ap[n]) && isfinite(bd[n]), "shape %zu doc %zu", s, n);
            double err = fabs((double)ap[n] - (double)ex[n]);
            ck_assert_msg(err <= bd[n], "shape %zu doc %zu: bf16 %.9g, fp32 %.9g, bound %.3g", s, n,
                          ap[n], ex[n], bd[n]);
            ck_assert_msg(bd[n] < 0.01 * qsum, "shape %zu doc %zu: bound %.3g of %.3g", s, n, bd[n],
                          qsum);
        }
        kern_cpu_force_isa(NULL);
        emb_free(&q);
        free(qc);
        free(ex);
        free(ap);
        free(bd);
        plaid_free(&p);
    }
    /* The sharp case: one token, its centroid zero, weights bf16 holds exactly, a query
     * (1 + 2^-8) sign(r) that bf16 rounds down by 2^-8 in every dim: the whole error is
     * 2^-8 sum |r_d| inv, which only the bound's query-rounding term covers. */
    {
        enum { D = 128 };
        float w4[4] = {-0.1875f, -0.0625f, 0.0625f, 0.1875f}, C1[D] = {0}, qv[D], qc1[1];
        uint8_t bk[D], pk[D / 4];
        uint16_t code = 0;
        double nn = 0;
        for (size_t j = 0; j < D; j++) {
            bk[j] = (uint8_t)(rnd() % 4);
            nn += (double)w4[bk[j]] * w4[bk[j]];
            qv[j] = (w4[bk[j]] > 0 ? 1.0f : -1.0f) * (1.0f + 0x1p-8f);
        }
        ref_pack(bk, D, 2, pk);
        float inv1 = (float)(1 / sqrt(nn)), ex1, ap1, bd1;
        kern_pdoc d1 = {&code, pk, &inv1, 1};
        ck_assert_int_eq(kern_centroid_scores(KERN_DEV_CPU, qv, 1, C1, 1, D, qc1), KERN_OK);
        kern_residual a1 = {D, 2, 2, qv, 1, qc1, 1, w4, &d1, 1, NULL, 0, NULL, {0, 0, 0, 0}, 0};
        ck_assert_int_eq(kern_cpu_force_isa("avx512"), KERN_OK);
        ck_assert_int_eq(kern_maxsim_residual(KERN_DEV_CPU, &a1, &ex1), KERN_OK);
        kern_cpu_force_isa(NULL);
        ck_assert_int_eq(kern_maxsim_residual_screen(KERN_DEV_CPU, &a1, &ap1, &bd1), KERN_OK);
        double err = fabs((double)ap1 - ex1);
        double sabs = 0;
        for (size_t j = 0; j < D; j++)
            sabs += fabs(w4[bk[j]]);
        ck_assert_msg(err > 0.9 * 0x1p-8 * sabs * inv1,
                      "the adversarial query lost its error: %.3g", err);
        ck_assert_msg(err <= bd1, "adversarial: bf16 %.9g, fp32 %.9g, bound %.3g", ap1, ex1, bd1);
    }
    /* refused as the exact kernel refuses */
    float w[4] = {0}, q[8] = {0}, qc[2] = {0}, inv[2] = {1, 1}, ap[1], bd[1];
    uint16_t codes[2] = {0, 2};
    uint8_t res[4] = {0};
    kern_pdoc doc = {codes, res, inv, 2};
    kern_residual a = {8, 2, 2, q, 1, qc, 2, w, &doc, 1, NULL, 0, NULL, {0, 0, 0, 0}, 0};
    ck_assert_int_eq(kern_maxsim_residual_screen(KERN_DEV_CPU, &a, ap, bd), KERN_EINVAL);
    ck_assert_ptr_nonnull(strstr(kern_last_error(), "code"));
    ck_assert_int_eq(kern_maxsim_residual_screen(KERN_DEV_CPU, &a, ap, NULL), KERN_EINVAL);
    ck_assert_int_eq(kern_maxsim_residual_screen(KERN_DEV_CUDA, &a, ap, bd), KERN_ENODEV);
}
END_TEST

/* ---- centroid interaction ------------------------------------------------------------------ */

static void check_interaction(size_t K, size_t nd, size_t maxlen, size_t lq, unsigned cb,
                              double keep_p)
{
    plaid p;
    plaid_make(&p, 8, K, nd, maxlen, 8, cb);
    float *S = xcalloc(lq * K, sizeof(float)), *approx = xcalloc(nd, sizeof(float));
    for (size_t i = 0; i < lq * K; i++)
        S[i] = frnd();
    uint8_t *keep = keep_p < 1.0 ? mask_rand(K, keep_p) : NULL;
    for (size_t n = 0; n < nd; n++)
        p.docs[n].residuals = NULL, p.docs[n].inv_norms = NULL; /* codes only */
    poison(approx, nd);
    ck_assert_int_eq(
        kern_centroid_interaction(KERN_DEV_CPU, S, lq, K, cb, p.docs, nd, keep, approx), KERN_OK);
    /* from the table transposed (a wider ld, lanes past lq finite junk): the same, bit for bit */
    size_t ld = (lq + 15) / 16 * 16 + 16;
    float *ST = xcalloc(K * ld, sizeof(float)), *a2 = xcalloc(nd, sizeof(float));
    for (size_t c = 0; c < K; c++)
        for (size_t i = 0; i < ld; i++)
            ST[c * ld + i] = i < lq ? S[i * K + c] : 1e3f;
    poison(a2, nd);
    ck_assert_int_eq(
        kern_centroid_interaction_t(KERN_DEV_CPU, ST, ld, lq, K, cb, p.docs, nd, keep, a2),
        KERN_OK);
    for (size_t n = 0; n < nd; n++)
        ck_assert(memcmp(&a2[n], &approx[n], sizeof(float)) == 0);
    free(ST);
    free(a2);
    for (size_t n = 0; n < nd; n++) {
        double s = 0.0;
        size_t kept = 0;
        for (size_t i = 0; i < lq; i++) {
            double mx = -INFINITY;
            for (int64_t t = p.off[n]; t < p.off[n + 1]; t++) {
                uint32_t c = cb == 2 ? ((uint16_t *)p.codes)[t] : ((uint32_t *)p.codes)[t];
                if (keep && !keep[c])
                    continue;
                kept += i == 0;
                mx = S[i * K + c] > mx ? S[i * K + c] : mx;
            }
            s += mx;
        }
        if (!kept)
            ck_assert_msg(isinf(approx[n]) && approx[n] < 0, "doc %zu: %g", n, approx[n]);
        else
            ck_assert_msg(fabs(approx[n] - s) <= 1e-5 * lq, "doc %zu: %g != %g (seed %llu)", n,
                          approx[n], s, (unsigned long long)rng_seed);
    }
    free(S);
    free(approx);
    free(keep);
    plaid_free(&p);
}

START_TEST(test_kernels_interaction_all_kept)
{
    rng_init_random();
    check_interaction(256, 50, 40, 32, 2, 1.0);
    check_interaction(100000, 5, 8, 3, 4, 1.0); /* strided table reads */
}
END_TEST

START_TEST(test_kernels_interaction_keep_mask)
{
    rng_init_random();
    check_interaction(64, 60, 12, 32, 2, 0.3);
    check_interaction(50000, 8, 10, 9, 4, 0.5);
    check_interaction(16, 40, 3, 5, 2, 0.1); /* many documents with no kept token */
}
END_TEST

START_TEST(test_kernels_interaction_bad_code)
{
    float S[4] = {1, 2, 3, 4}, approx[1];
    uint32_t codes[2] = {1, 4};
    kern_pdoc doc = {codes, NULL, NULL, 2};
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, S, 1, 4, 4, &doc, 1, NULL, approx),
                     KERN_EINVAL);
    codes[1] = 3;
    approx[0] = NAN;
    ck_assert_int_eq(kern_centroid_interaction(KERN_DEV_CPU, S, 1, 4, 4, &doc, 1, NULL, approx),
                     KERN_OK);
    ck_assert(approx[0] == 4.0f);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"centroid_scores", test_kernels_centroid_scores, 0},
        {"centroid_probe", test_kernels_centroid_probe, 0},
        {"residual_bit_order", test_kernels_residual_bit_order, 0},
        {"residual_nbits", test_kernels_residual_nbits, 0},
        {"residual_strided_table", test_kernels_residual_strided_table, 0},
        {"residual_long_docs", test_kernels_residual_long_docs, 0},
        {"residual_unaligned", test_kernels_residual_unaligned, 0},
        {"residual_bad_input", test_kernels_residual_bad_input, 0},
        {"residual_screen_bound", test_kernels_residual_screen_bound, 0},
        {"interaction_all_kept", test_kernels_interaction_all_kept, 0},
        {"interaction_keep_mask", test_kernels_interaction_keep_mask, 0},
        {"interaction_bad_code", test_kernels_interaction_bad_code, 0},
    };
    return FX_RUN("kernels-plaid", cases, 0, 60);
}
