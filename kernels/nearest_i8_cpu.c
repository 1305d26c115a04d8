/*
 * nearest_i8_cpu.c: the fp32 nearest centroid screened with int8 products on AVX2, for CPUs
 * without AMX tiles (kern_cpu_nearest_centroid_screened_i8).
 *
 * On AVX2 the fp32 kernel does 16 products a cycle (two 8-lane FMA ports) and runs at 70-80%
 * of that; VPMADDUBSW multiplies 32 byte pairs an instruction and issues as often. The screen
 * computes every (point, centroid) score once from bytes, exactly as integers, lists per point
 * the centroids within twice a proven bound of its best, and takes the fp32 argmax of that list
 * with the fp32 kernel's own product chains (kern_cpu_rescore_list): the same codes and scores
 * bit for bit as kern_cpu_nearest_centroid_fp32. The flagged points (non-finite or all-zero
 * inputs, overflowing lists) go to the fp32 kernel whole.
 *
 * The codes: a centroid c is stored as qc = round(c / sc), sc = max|c_i| / 63, qc in [-63, 63]
 * (signed bytes); a point x as qx = round(x / sx), sx = max|x_i| / 63, stored as the unsigned
 * byte qx + 64 in [1, 127] (VPMADDUBSW takes one operand unsigned). One VPMADDUBSW sum of two
 * byte products is then at most 2 * 127 * 63 = 16,002, and two of them add in 16 bits without
 * saturating, so the integer sums are exact: sum (qx + 64) qc - 64 sum qc = qx . qc, and the
 * approximate score is (float)(qx . qc) * (sx * sc). (8-bit centroids would halve their
 * rounding but cost a widening instruction for every 32 products instead of 64: 1.25x the
 * kernel's time, for windows a quarter narrower.)
 *
 * The bound, for x^ = sx qx and c^ = sc qc (ex = x^ - x, ec = c^ - c), u = 2^-24, and
 * g = d u / (1 - d u) (fp32's sum of d products, in any order, is within g sum |x_i c_i|):
 *   |approx - s32| <= |approx - x^.c^| + |x^.c^ - x.c| + |x.c - s32|
 *                  <= 3 u |x^| |c^| + (|ex| |c^| + |x| |ec|) + g |x| |c|
 * (the integer sum converts to float exactly below 2^24, which dim <= 2048 keeps; the scale
 * product and the final product round once each), with the centroid norms at their maxima
 * over the table, plus 2^-100 for underflow. At d 128 the window 2E is about 0.05 for unit
 * vectors, which lists a few centroids a point.
 *
 * Layout (lanes are points, as in the fp32 micro-kernel): a panel of 16 points holds, for each
 * group of 4 dims, the 16 points' 4 bytes (64 bytes: two ymm); a centroid row holds its bytes in
 * dim order, padded with zeros to a multiple of 8, and is broadcast 4 bytes at a time. The
 * kernel runs 16 points against 3 centroids (6 accumulators), then folds the 3 scores into the
 * points' running best and lists the centroids within the window of it.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels_impl.h"
#include "microkernel_cpu.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define TI8 __attribute__((target("avx2,fma")))

/* Points a panel, centroids a kernel call. */
#define I8_P 16
#define I8_J 3
/* Points per work item, at most (16 panels: 32 KB of bytes at d 128). */
#define I8_POINTS 256
/* Bytes of centroid rows per block, read from L2 by every panel of an item. */
#define I8_BLOCK_BYTES ((size_t)192 << 10)
/* Candidates a point may list (after compaction) before it goes to the fp32 kernel. */
#define I8_CAP 256
/* Largest dim the screen takes: its integer sums convert to float exactly. */
#define I8_MAX_DIM 2048

/* A point's working state: running best and the two windows (float), list. */
typedef struct i8_item {
    float *bs;     /* [per] running best approx score (-inf at the start) */
    float *win;    /* [per] 2E rounded up (0 for lanes not screened) */
    float *wink;   /* [per] the kernel's looser window (see i8_nearest) */
    float *sx;     /* [per] the point's scale (0 for lanes not screened) */
    uint32_t *cnt; /* [per] listed entries */
    int32_t *li;   /* [per * I8_CAP] listed centroid indices, ascending */
    float *ls;     /* [per * I8_CAP] their approx scores */
    uint8_t *over; /* [per] 1: the list overflowed (to the fp32 kernel) */
} i8_item;

/* Drops the entries of point i's list below its current threshold (rounded down), in order. */
static void i8_compact(i8_item *w, size_t i)
{
    float tf = w->bs[i] - w->win[i];
    if ((double)tf > (double)w->bs[i] - (double)w->win[i])
        tf = nextafterf(tf, -INFINITY);
    uint32_t kept = 0;
    for (uint32_t e = 0; e < w->cnt[i]; e++)
        if (w->ls[i * I8_CAP + e] >= tf) {
            w->li[i * I8_CAP + kept] = w->li[i * I8_CAP + e];
            w->ls[i * I8_CAP + kept] = w->ls[i * I8_CAP + e];
            kept++;
        }
    w->cnt[i] = kept;
}

static void i8_append(i8_item *w, size_t i, int32_t c, float s)
{
    if (w->over[i])
        return;
    if (w->cnt[i] == I8_CAP) {
        i8_compact(w, i);
        if (w->cnt[i] == I8_CAP) {
            w->over[i] = 1;
            return;
        }
    }
    w->li[i * I8_CAP + w->cnt[i]] = c;
    w->ls[i * I8_CAP + w->cnt[i]] = s;
    w->cnt[i]++;
}

/*
 * One panel of 16 points (pk: [dim4][16][4] bytes, dim4 even) against 3 centroid rows (bytes,
 * rows of dim4 * 4), indices c0 .. c0 + 2 (those >= nk are repeats, never listed), with their
 * scales sc and corrections corr (64 sum qc). Two groups of 4 dims a step: their two VPMADDUBSW
 * results add in 16 bits (each at most 2 * 127 * 63, the pair 32,004) before one VPMADDWD
 * widens them, 5 instructions for 64 products a lane group. The 16 points' state sits at
 * w->... + base; only the lanes whose bits are set in live are screened (list anything).
 */
/* The integer sums: acc [6][8] = rows j against lanes 0-7 (acc[2j]) and 8-15 (acc[2j + 1]).
 * Kept out of line: inlined into the fold, GCC's register allocation reloads the point
 * vectors from memory in the loop (1.3x slower). */
TI8 __attribute__((noinline)) static void i8_dots(const uint8_t *pk, size_t dim4, const int8_t *r0,
                                                  const int8_t *r1, const int8_t *r2, __m256i *acc)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
    for (size_t k = 0; k < dim4; k += 2) {
        const uint8_t *p = pk + 64 * k;
        __m256i q0 = _mm256_load_si256((const __m256i *)p);
        __m256i q1 = _mm256_load_si256((const __m256i *)(p + 32));
        __m256i p0 = _mm256_load_si256((const __m256i *)(p + 64));
        __m256i p1 = _mm256_load_si256((const __m256i *)(p + 96));
        int32_t v, u;
#define I8_STEP(j)                                                                                 \
    memcpy(&v, r##j + 4 * k, 4);                                                                   \
    memcpy(&u, r##j + 4 * k + 4, 4);                                                               \
    {                                                                                              \
        __m256i b = _mm256_set1_epi32(v), c = _mm256_set1_epi32(u);                                \
        a##j##0 = _mm256_add_epi32(                                                                \
            a##j##0, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(q0, b),               \
                                                        _mm256_maddubs_epi16(p0, c)),              \
                                       ones));                                                     \
        a##j##1 = _mm256_add_epi32(                                                                \
            a##j##1, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(q1, b),               \
                                                        _mm256_maddubs_epi16(p1, c)),              \
                                       ones));                                                     \
    }
        I8_STEP(0)
        I8_STEP(1)
        I8_STEP(2)
#undef I8_STEP
    }
    _mm256_store_si256(acc, a00);
    _mm256_store_si256(acc + 1, a01);
    _mm256_store_si256(acc + 2, a10);
    _mm256_store_si256(acc + 3, a11);
    _mm256_store_si256(acc + 4, a20);
    _mm256_store_si256(acc + 5, a21);
}

/* The slow half of i8_kernel: the scores of acc folded into the running bests one centroid at a
 * time, listing those within the window; also the last, part-filled group (c0 + j >= nk). */
TI8 static void i8_fold_list(const __m256i *acc, const float *sc, const int32_t *corr, int32_t c0,
                             int32_t nk, i8_item *w, size_t base, unsigned live)
{
    __m256 s0 = _mm256_load_ps(w->sx + base), s1 = _mm256_load_ps(w->sx + base + 8);
    float sv[I8_J][I8_P];
    for (int j = 0; j < I8_J; j++) {
        __m256i cr = _mm256_set1_epi32(corr[j]);
        __m256 scj = _mm256_set1_ps(sc[j]);
        _mm256_storeu_ps(sv[j], _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[2 * j], cr)),
                                              _mm256_mul_ps(s0, scj)));
        _mm256_storeu_ps(sv[j] + 8,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[2 * j + 1], cr)),
                                       _mm256_mul_ps(s1, scj)));
    }
    while (live) {
        unsigned l = (unsigned)__builtin_ctz(live);
        live &= live - 1;
        size_t i = base + l;
        for (int j = 0; j < I8_J && c0 + j < nk; j++) {
            float v = sv[j][l];
            if (v > w->bs[i])
                w->bs[i] = v;
            if (v >= w->bs[i] - w->wink[i])
                i8_append(w, i, c0 + j, v);
        }
    }
}

TI8 static void i8_kernel(const uint8_t *pk, size_t dim4, const int8_t *const *rows,
                          const float *sc, const int32_t *corr, int32_t c0, int32_t nk, i8_item *w,
                          size_t base, unsigned live)
{
    __m256i acc[6];
    i8_dots(pk, dim4, rows[0], rows[1], rows[2], acc);
    if (c0 + I8_J > nk) {
        i8_fold_list(acc, sc, corr, c0, nk, w, base, live);
        return;
    }
    /* The fast half: each score against its lane's window below the best so far; where none
     * is inside (nearly always once a lane has met its near centroids), only the bests move. */
    __m256 s0 = _mm256_load_ps(w->sx + base), s1 = _mm256_load_ps(w->sx + base + 8);
    __m256 b0 = _mm256_load_ps(w->bs + base), b1 = _mm256_load_ps(w->bs + base + 8);
    __m256 t0 = _mm256_sub_ps(b0, _mm256_load_ps(w->wink + base));
    __m256 t1 = _mm256_sub_ps(b1, _mm256_load_ps(w->wink + base + 8));
    __m256 in0 = _mm256_setzero_ps(), in1 = in0;
#define I8_FOLD(j)                                                                                 \
    {                                                                                              \
        __m256i cr = _mm256_set1_epi32(corr[j]);                                                   \
        __m256 scj = _mm256_set1_ps(sc[j]);                                                        \
        __m256 v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[2 * j], cr)),            \
                                  _mm256_mul_ps(s0, scj));                                         \
        __m256 v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[2 * j + 1], cr)),        \
                                  _mm256_mul_ps(s1, scj));                                         \
        in0 = _mm256_or_ps(in0, _mm256_cmp_ps(v0, t0, _CMP_GE_OQ));                                \
        in1 = _mm256_or_ps(in1, _mm256_cmp_ps(v1, t1, _CMP_GE_OQ));                                \
        b0 = _mm256_max_ps(b0, v0);                                                                \
        b1 = _mm256_max_ps(b1, v1);                                                                \
    }
    I8_FOLD(0)
    I8_FOLD(1)
    I8_FOLD(2)
#undef I8_FOLD
    unsigned in =
        ((unsigned)_mm256_movemask_ps(in0) | (unsigned)_mm256_movemask_ps(in1) << 8) & live;
    if (in) /* the lanes with a candidate, again one centroid at a time (bests as before) */
        i8_fold_list(acc, sc, corr, c0, nk, w, base, in);
    _mm256_store_ps(w->bs + base, _mm256_max_ps(b0, _mm256_load_ps(w->bs + base)));
    _mm256_store_ps(w->bs + base + 8, _mm256_max_ps(b1, _mm256_load_ps(w->bs + base + 8)));
}

/* u = 2^-24; g = d u / (1 - d u). */
static double i8_gamma(size_t n)
{
    return (double)n * 0x1p-24 / (1 - (double)n * 0x1p-24);
}

/* Quantises v [dim] to bytes: q = round(v / s) in [-lim, lim] (lim <= 127), s = max|v| / lim
 * (float), stored as the byte q + off (which must fit a signed byte); returns s (0 for a zero
 * vector), and the norms |v|, |s q| and |s q - v| in double (s q is exact in double). Not
 * finite: returns NaN. Eight dims a step. */
TI8 static float i8_quant(const float *v, size_t dim, int lim, int off, uint8_t *out, double *nv,
                          double *nq, double *nd)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mxv = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    size_t k8 = dim / 8 * 8;
    for (size_t k = 0; k < k8; k += 8) {
        __m256 x = _mm256_loadu_ps(v + k);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        mxv = _mm256_max_ps(mxv, _mm256_and_ps(x, absmask));
    }
    float m8[8], mx = 0;
    _mm256_storeu_ps(m8, mxv);
    int bad = !_mm256_testz_ps(nan, nan);
    for (int l = 0; l < 8; l++)
        mx = m8[l] > mx ? m8[l] : mx;
    for (size_t k = k8; k < dim; k++) {
        float a = fabsf(v[k]);
        if (!(a <= mx)) /* NaN too */
            mx = a;
    }
    if (bad || !isfinite(mx))
        return NAN;
    float s = mx / (float)lim, inv = s > 0 ? (float)lim / mx : 0;
    __m256d a1 = _mm256_setzero_pd(), a2 = a1, a3 = a1;
    __m256d sd = _mm256_set1_pd((double)s);
    __m256 invv = _mm256_set1_ps(inv);
    __m256i lo = _mm256_set1_epi32(-lim), hi = _mm256_set1_epi32(lim), of = _mm256_set1_epi32(off);
    for (size_t k = 0; k < k8; k += 8) {
        __m256 x = _mm256_loadu_ps(v + k);
        __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, invv));
        q = _mm256_min_epi32(_mm256_max_epi32(q, lo), hi);
        __m256 qf = _mm256_cvtepi32_ps(q);
        for (int h = 0; h < 2; h++) {
            __m256d xd =
                _mm256_cvtps_pd(h ? _mm256_extractf128_ps(x, 1) : _mm256_castps256_ps128(x));
            __m256d qd = _mm256_mul_pd(
                sd, _mm256_cvtps_pd(h ? _mm256_extractf128_ps(qf, 1) : _mm256_castps256_ps128(qf)));
            __m256d e = _mm256_sub_pd(qd, xd);
            a1 = _mm256_fmadd_pd(xd, xd, a1);
            a2 = _mm256_fmadd_pd(qd, qd, a2);
            a3 = _mm256_fmadd_pd(e, e, a3);
        }
        __m256i t = _mm256_add_epi32(q, of);
        t = _mm256_packs_epi32(t, t);
        t = _mm256_packs_epi16(t, t);
        int32_t w0 = _mm256_extract_epi32(t, 0), w1 = _mm256_extract_epi32(t, 4);
        memcpy(out + k, &w0, 4);
        memcpy(out + k + 4, &w1, 4);
    }
    double t1[4], t2[4], t3[4];
    _mm256_storeu_pd(t1, a1);
    _mm256_storeu_pd(t2, a2);
    _mm256_storeu_pd(t3, a3);
    double s1 = t1[0] + t1[1] + t1[2] + t1[3], s2 = t2[0] + t2[1] + t2[2] + t2[3],
           s3 = t3[0] + t3[1] + t3[2] + t3[3];
    for (size_t k = k8; k < dim; k++) {
        long q = lrintf(v[k] * inv);
        q = q > lim ? lim : q < -lim ? -lim : q;
        out[k] = (uint8_t)(q + off);
        double x = v[k], xq = (double)s * (double)q;
        s1 += x * x;
        s2 += xq * xq;
        s3 += (xq - x) * (xq - x);
    }
    *nv = sqrt(s1);
    *nq = sqrt(s2);
    *nd = sqrt(s3);
    return s;
}

static int i8_nearest(const float *x, size_t n, const float *centroids, size_t n_centroids,
                      size_t dim, int32_t *best, float *best_score, uint8_t *fb)
{
    size_t dim4 = (dim + 7) / 8 * 2, rowb = dim4 * 4; /* dims padded to a multiple of 8 */
    size_t kp = (n_centroids + I8_J - 1) / I8_J * I8_J;
    int8_t *cb = kern_aligned_alloc(kp * rowb);
    float *sc = kern_aligned_alloc(kp * sizeof(float));
    int32_t *corr = kern_aligned_alloc(kp * sizeof(int32_t));
    if (!cb || !sc || !corr) {
        free(cb);
        free(sc);
        free(corr);
        kern_set_error("nearest_centroid: out of memory for %zu int8 centroids", n_centroids);
        return KERN_ENOMEM;
    }
    /* the largest |c|, |c^| and |c^ - c| over the centroids; a non-finite centroid: no screen */
    double cn = 0, cqn = 0, dcn = 0;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(max : cn, cqn, dcn, bad)
    for (long long cc = 0; cc < (long long)kp; cc++) {
        size_t c = (size_t)cc < n_centroids ? (size_t)cc : n_centroids - 1;
        int8_t *r = cb + (size_t)cc * rowb;
        memset(r, 0, rowb);
        double nv, nq, nd;
        float s = i8_quant(centroids + c * dim, dim, 63, 0, (uint8_t *)r, &nv, &nq, &nd);
        if (!isfinite(s)) {
            bad = 1;
            s = 0;
        }
        sc[cc] = s;
        int32_t sum = 0;
        for (size_t k = 0; k < dim; k++)
            sum += r[k];
        corr[cc] = 64 * sum;
        cn = nv > cn ? nv : cn;
        cqn = nq > cqn ? nq : cqn;
        dcn = nd > dcn ? nd : dcn;
    }
    if (bad) {
        free(cb);
        free(sc);
        free(corr);
        kern_set_error("nearest_centroid: a centroid is not finite; no int8 screen");
        return KERN_ENODEV;
    }
    double gam = i8_gamma(dim);
    size_t block = I8_BLOCK_BYTES / rowb;
    block = block < I8_J ? I8_J : block - block % I8_J;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    size_t per = (n + 4 * (size_t)threads - 1) / (4 * (size_t)threads);
    per = (per + I8_P - 1) / I8_P * I8_P;
    if (per > I8_POINTS)
        per = I8_POINTS;
    if (per < I8_P)
        per = I8_P;
    size_t nitems = (n + per - 1) / per, panel = dim4 * 64;
    int failed = 0;
#pragma omp parallel
    {
        uint8_t *pk = kern_aligned_alloc(per / I8_P * panel);
        i8_item w;
        w.bs = kern_aligned_alloc(per * sizeof(float));
        w.win = kern_aligned_alloc(per * sizeof(float));
        w.wink = kern_aligned_alloc(per * sizeof(float));
        w.sx = kern_aligned_alloc(per * sizeof(float));
        w.cnt = malloc(per * sizeof(uint32_t));
        w.li = malloc(per * I8_CAP * sizeof(int32_t));
        w.ls = malloc(per * I8_CAP * sizeof(float));
        w.over = malloc(per);
        int ok = pk && w.bs && w.win && w.wink && w.sx && w.cnt && w.li && w.ls && w.over;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < nitems; it++) {
            if (!ok)
                continue;
            size_t p0 = it * per, m = n - p0 < per ? n - p0 : per, np = (m + I8_P - 1) / I8_P;
            memset(pk, 0, np * panel);
            for (size_t i = 0; i < np * I8_P; i++) {
                w.bs[i] = -INFINITY;
                w.win[i] = 0;
                w.wink[i] = 0;
                w.sx[i] = 0;
                w.cnt[i] = 0;
                w.over[i] = 0;
            }
            for (size_t i = 0; i < m; i++) {
                /* point i's bytes: panel i / 16, lane i % 16, 4 dims a group */
                uint8_t *q = pk + (i / I8_P) * panel + (i % I8_P) * 4;
                uint8_t tmp[I8_MAX_DIM + 8];
                double nv, nq, nd;
                float s = i8_quant(x + (p0 + i) * dim, dim, 63, 64, tmp, &nv, &nq, &nd);
                double e = 3 * 0x1p-24 * nq * cqn + nd * cqn + nv * dcn + gam * nv * cn + 0x1p-100;
                double wd = 2 * e * (1 + 1e-6);
                /* NaN or infinite input, all zero (every score 0), or so large that a score
                 * (at most dim |x| |c|max) could overflow: the fp32 kernel */
                if (!isfinite(s) || !isfinite(wd) || s == 0 || !(nv * cn * (double)dim < 1e37)) {
                    fb[p0 + i] = 1;
                    continue;
                }
                memset(tmp + dim, 0, 4 * dim4 - dim); /* the pad contributes nothing */
                for (size_t k = 0; k < dim4; k++)
                    memcpy(q + k * 64, tmp + 4 * k, 4);
                float wf = (float)wd;
                w.win[i] = (double)wf < wd ? nextafterf(wf, INFINITY) : wf;
                /* the kernel compares with fl(best - wink): wider than win by more than that
                 * subtraction's rounding, for |best| <= |x| |c|max */
                w.wink[i] = (float)(wd * 1.001 + nv * cn * 0x1p-20);
                w.sx[i] = s;
            }
            for (size_t b0 = 0; b0 < kp; b0 += block) {
                size_t b1 = kp - b0 < block ? kp : b0 + block;
                for (size_t p = 0; p < np; p++) {
                    unsigned live = 0; /* the panel's screened lanes */
                    for (size_t l = 0; l < I8_P && p * I8_P + l < m; l++)
                        live |= (unsigned)(w.sx[p * I8_P + l] != 0) << l;
                    const uint8_t *qp = pk + p * panel;
                    for (size_t c0 = b0; c0 < b1; c0 += I8_J) {
                        const int8_t *rows[I8_J];
                        for (int j = 0; j < I8_J; j++)
                            rows[j] = cb + (c0 + (size_t)j) * rowb;
                        i8_kernel(qp, dim4, rows, sc + c0, corr + c0, (int32_t)c0,
                                  (int32_t)n_centroids, &w, p * I8_P, live);
                    }
                }
            }
            for (size_t i = 0; i < m; i++) {
                if (fb[p0 + i])
                    continue;
                if (w.over[i] || !isfinite(w.bs[i])) {
                    fb[p0 + i] = 1;
                    continue;
                }
                i8_compact(&w, i);
                if (w.cnt[i] == 0) { /* cannot happen for finite inputs; safe anyway */
                    fb[p0 + i] = 1;
                    continue;
                }
                float s;
                kern_cpu_rescore_list(x + (p0 + i) * dim, centroids, dim, w.li + i * I8_CAP,
                                      w.cnt[i], best + p0 + i, &s);
                if (best_score)
                    best_score[p0 + i] = s;
            }
        }
        free(pk);
        free(w.bs);
        free(w.win);
        free(w.wink);
        free(w.sx);
        free(w.cnt);
        free(w.li);
        free(w.ls);
        free(w.over);
    }
    free(cb);
    free(sc);
    free(corr);
    if (failed) {
        kern_set_error("nearest_centroid: out of memory for the int8 panels");
        return KERN_ENOMEM;
    }
    return KERN_OK;
}

int kern_cpu_nearest_centroid_screened_i8(const float *x, size_t n, const float *centroids,
                                          size_t n_centroids, size_t dim, int32_t *best,
                                          float *best_score, size_t *n_fp32)
{
    if (!kern_cpu_has_isa("avx2")) {
        kern_set_error("nearest_centroid: the int8 screen needs AVX2 and FMA");
        return KERN_ENODEV;
    }
    if (dim == 0 || dim > I8_MAX_DIM || n_centroids == 0) {
        kern_set_error("nearest_centroid: the int8 screen takes dims 1 to %d and one centroid "
                       "or more (dim %zu, %zu centroids)",
                       I8_MAX_DIM, dim, n_centroids);
        return KERN_ENODEV;
    }
    uint8_t *fb = calloc(n ? n : 1, 1);
    if (!fb) {
        kern_set_error("nearest_centroid: out of memory for %zu flags", n);
        return KERN_ENOMEM;
    }
    int rc = i8_nearest(x, n, centroids, n_centroids, dim, best, best_score, fb);
    if (rc == KERN_OK)
        rc = kern_cpu_nearest_flagged(x, n, centroids, n_centroids, dim, best, best_score, fb,
                                      n_fp32);
    free(fb);
    return rc;
}

#else /* not x86 */

int kern_cpu_nearest_centroid_screened_i8(const float *x, size_t n, const float *centroids,
                                          size_t n_centroids, size_t dim, int32_t *best,
                                          float *best_score, size_t *n_fp32)
{
    (void)x;
    (void)n;
    (void)centroids;
    (void)n_centroids;
    (void)dim;
    (void)best;
    (void)best_score;
    (void)n_fp32;
    kern_set_error("nearest_centroid: the int8 screen needs an x86 CPU with AVX2");
    return KERN_ENODEV;
}

#endif
