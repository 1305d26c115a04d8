/*
 * nearest_amx_cpu.c: nearest centroid with bf16 products on Intel AMX (the tile unit of Xeons from
 * Sapphire Rapids on): k-means training's assignment (kern_nearest_centroid_bf16).
 *
 * One TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 fp32 sums: 8,192
 * products in about 16 cycles, where AVX-512 does 32 fp32 products a cycle (two FMA ports).
 * The centroids are the A tiles (16 rows of 32 dims, read straight from a bf16 copy of the
 * centroid table), the points the B tiles (pairs of dims, "VNNI" layout: [dim / 2][point][2]),
 * so a C tile holds 16 centroids (rows) x 16 points (columns): one C row is one centroid against
 * 16 points, and the running argmax is vertical, as in the AVX-512 micro-kernel. Eight tile
 * registers hold 2 A + 2 B + 4 C: 32 centroids x 32 points a step of 32 dims.
 *
 * Determinism: each (point, centroid) sum is the same chain of TDPBF16PS steps (32 dims each,
 * in ascending order, from zero) whatever the work item, block or thread, and each point sees
 * the centroids in ascending order with strict comparisons (ties keep the lower index), so the
 * answer depends on the inputs only (on a given CPU: the order of the pairs inside one
 * instruction is the hardware's).
 *
 * Linux hands out the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM, once per
 * process, on the first bf16 call); without it (another OS, an old kernel, or a refusal: Linux
 * refuses where a thread's alternate signal stack is too small for the 8 KB of tile state a
 * signal frame then carries), the kernel reports itself unusable and k-means runs on the
 * AVX-512 kernels.
 */
#define _GNU_SOURCE /* syscall */
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

#if defined(TARTAN_HAVE_AMX) && defined(__linux__) && defined(__x86_64__)

#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TAMX __attribute__((target("amx-tile,amx-bf16,avx512f,fma")))

/* arch_prctl's request for an extended state component, and AMX's tile data component. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Points per work item, at most: 8 panels of 32 (64 KB of bf16 pairs at d 128). */
#define AMX_POINTS 128

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok;
static int amx_off; /* kern_cpu_use_amx(0): tests and benchmarks */

static void amx_probe(void)
{
    unsigned a, b, c, d;
    /* CPUID.7.0:EDX bit 22 AMX-BF16, bit 24 AMX-TILE; leaf 0xd.0:EAX bits 17-18 say the OS
     * manages the tile state (XCR0) */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
        return;
    if (!__get_cpuid_count(0xd, 0, &a, &b, &c, &d) || (a & (3u << 17)) != (3u << 17))
        return;
    /* the argmax runs on AVX-512 (every AMX CPU has it; an emulator may hide it) */
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f"))
        return;
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int kern_cpu_amx_usable(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok && !amx_off;
}

int kern_cpu_use_amx(int on)
{
    pthread_once(&amx_once, amx_probe);
    if (on && !amx_ok) {
        kern_set_error("this CPU (or OS) does not let the process use AMX tiles");
        return KERN_ENODEV;
    }
    amx_off = !on;
    return KERN_OK;
}

/* The tile configuration (palette 1): every tile 16 rows of 64 bytes. Tiles 0-3: C; 4-5: A
 * (centroids); 6-7: B (points). */
typedef struct amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/*
 * The argmax of one 16 x 16 C tile, stored at c (row r: centroid first + r against 16 points),
 * into the points' running best (b, i). Most tiles improve no point once the bests are good, so
 * a pass of maxima decides first whether the exact pass (strict >, rows ascending) is needed;
 * skipping it when no lane's maximum beats its best changes nothing. NaN never wins: max_ps
 * keeps its second operand when either is NaN, and the comparisons are ordered.
 */
TAMX static inline void tile_argmax(const float *c, int32_t first, __m512 *b, __m512i *i)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int r = 0; r < 16; r++)
        m = _mm512_max_ps(_mm512_load_ps(c + 16 * r), m);
    if (!_mm512_cmp_ps_mask(m, *b, _CMP_GT_OQ))
        return;
    for (int r = 0; r < 16; r++) {
        __m512 v = _mm512_load_ps(c + 16 * r);
        __mmask16 g = _mm512_cmp_ps_mask(v, *b, _CMP_GT_OQ);
        *b = _mm512_mask_mov_ps(*b, g, v);
        *i = _mm512_mask_mov_epi32(*i, g, _mm512_set1_epi32(first + r));
    }
}

/* The 4 C tiles of centroids a .. a + 31 (rows of dimp bf16) against one panel of 32 points
 * pq, stored at c (4 KB, 64-byte aligned): c + 256 t holds tile t, 16 rows (centroids) of 16
 * points; tiles 0 and 1 are centroids 0-15 against points 0-15 and 16-31, tiles 2 and 3
 * centroids 16-31. Each sum is the same chain of TDPBF16PS steps, 32 dims each, ascending. */
TAMX static inline void group_tiles(const uint16_t *a, const uint16_t *pq, size_t dimp, float *c)
{
    size_t astride = dimp * sizeof(uint16_t);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (size_t k = 0; k < dimp; k += 32) {
        /* B: pair rows k/2 .. k/2 + 15, points 0-15 at byte 0, 16-31 at byte 64 */
        const uint16_t *p = pq + (k / 2) * 64;
        _tile_loadd(4, a + k, astride);
        _tile_loadd(5, a + 16 * dimp + k, astride);
        _tile_loadd(6, p, 128);
        _tile_loadd(7, p + 32, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
}

/*
 * The panels of a work item (np panels of 32 points, pk: [dimp / 2][32][2] bf16 each, panel
 * uint16 apart) against the centroids [c0, c1) of cb (rows of dimp bf16; c1 - c0 a multiple of
 * 32, the table padded so): running bests bs, bi [np * 32]. Each group of 32 centroids (8 KB at
 * d 128) meets every panel while it is in L1, and the item's panels (32 KB) stay there too.
 * c: 4 KB of scratch, 64-byte aligned.
 */
TAMX static void item_block(const uint16_t *pk, size_t np, size_t panel, size_t dimp,
                            const uint16_t *cb, size_t c0, size_t c1, float *bs, int32_t *bi,
                            float *c)
{
    for (size_t g = c0; g < c1; g += 32) {
        const uint16_t *a = cb + g * dimp;
        for (size_t q = 0; q < np; q++) {
            group_tiles(a, pk + q * panel, dimp, c);
            float *qs = bs + 32 * q;
            int32_t *qi = bi + 32 * q;
            __m512 b0 = _mm512_load_ps(qs), b1 = _mm512_load_ps(qs + 16);
            __m512i i0 = _mm512_load_si512(qi), i1 = _mm512_load_si512(qi + 16);
            /* centroids g .. g + 15, then g + 16 .. g + 31: ascending for every point */
            tile_argmax(c, (int32_t)g, &b0, &i0);
            tile_argmax(c + 256, (int32_t)g, &b1, &i1);
            tile_argmax(c + 512, (int32_t)g + 16, &b0, &i0);
            tile_argmax(c + 768, (int32_t)g + 16, &b1, &i1);
            _mm512_store_ps(qs, b0);
            _mm512_store_ps(qs + 16, b1);
            _mm512_store_si512(qi, i0);
            _mm512_store_si512(qi + 16, i1);
        }
    }
}

/*
 * Screening over one 16 x 16 C tile (as tile_argmax's: row r is centroid first + r against
 * points lane0 .. lane0 + 15), in one pass: each point's running bf16 best b rises to the
 * tile's maximum where that is higher, and every centroid whose score reaches b - w (w: the
 * point's window, w[l]) joins the point's list with its score. A centroid that reaches the
 * final best's threshold reached the running one when it was scanned (the running best is
 * never above the final), so the list holds every centroid the final threshold keeps, plus
 * stale ones that the end filters out. A full list first drops the entries below the current
 * threshold; cnt counts on past cap when that does not make room (the point then goes to the
 * fp32 kernel). Centroids at or past nk are the table's padding, never listed. Most tiles
 * reach no point's threshold: one pass of maxima decides that. NaN never joins (ordered
 * comparisons); thresholds are rounded down.
 */
TAMX static inline void tile_screen(const float *c, int32_t first, size_t lane0, int32_t nk,
                                    __m512 *b, __m512 w, uint32_t *cnt, int32_t *li, float *ls,
                                    size_t cap)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int r = 0; r < 16; r++)
        m = _mm512_max_ps(_mm512_load_ps(c + 16 * r), m);
    *b = _mm512_max_ps(m, *b);
    __m512 t = _mm512_sub_round_ps(*b, w, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    if (!_mm512_cmp_ps_mask(m, t, _CMP_GE_OQ))
        return;
    float tl[16];
    _mm512_storeu_ps(tl, t);
    for (int r = 0; r < 16 && first + r < nk; r++) {
        const float *row = c + 16 * r;
        unsigned g = _mm512_cmp_ps_mask(_mm512_load_ps(row), t, _CMP_GE_OQ);
        while (g) {
            unsigned l = (unsigned)__builtin_ctz(g);
            size_t p = lane0 + l;
            g &= g - 1;
            if (cnt[p] == cap) { /* full: keep what the current threshold keeps */
                uint32_t kept = 0;
                for (uint32_t e = 0; e < cap; e++)
                    if (ls[p * cap + e] >= tl[l]) {
                        li[p * cap + kept] = li[p * cap + e];
                        ls[p * cap + kept] = ls[p * cap + e];
                        kept++;
                    }
                cnt[p] = kept == cap ? cap + 1 : kept;
            }
            if (cnt[p] < cap) {
                li[p * cap + cnt[p]] = first + r;
                ls[p * cap + cnt[p]] = row[l];
                cnt[p]++;
            }
        }
    }
}

/* A work item's screening pass: as item_block, with tile_screen for the argmax. The running
 * bests bs [np * 32] start at -inf, the windows w [np * 32] are the points' (0 past m). */
TAMX static void item_screen(const uint16_t *pk, size_t np, size_t panel, size_t dimp,
                             const uint16_t *cb, size_t kp, int32_t nk, float *bs, const float *w,
                             uint32_t *cnt, int32_t *li, float *ls, size_t cap, float *c)
{
    for (size_t g = 0; g < kp; g += 32) {
        const uint16_t *a = cb + g * dimp;
        for (size_t q = 0; q < np; q++) {
            group_tiles(a, pk + q * panel, dimp, c);
            float *qs = bs + 32 * q;
            __m512 b0 = _mm512_load_ps(qs), b1 = _mm512_load_ps(qs + 16);
            __m512 w0 = _mm512_load_ps(w + 32 * q), w1 = _mm512_load_ps(w + 32 * q + 16);
            /* centroids g .. g + 15, then g + 16 .. g + 31: ascending for every point */
            tile_screen(c, (int32_t)g, 32 * q, nk, &b0, w0, cnt, li, ls, cap);
            tile_screen(c + 256, (int32_t)g, 32 * q + 16, nk, &b1, w1, cnt, li, ls, cap);
            tile_screen(c + 512, (int32_t)g + 16, 32 * q, nk, &b0, w0, cnt, li, ls, cap);
            tile_screen(c + 768, (int32_t)g + 16, 32 * q + 16, nk, &b1, w1, cnt, li, ls, cap);
            _mm512_store_ps(qs, b0);
            _mm512_store_ps(qs + 16, b1);
        }
    }
}

TAMX static void tiles_on(void)
{
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    /* GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the 64, so the stores
     * above could be dropped as dead (ldtilecfg then faults on garbage): the address escapes
     * into an asm that clobbers memory first. */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

TAMX static void tiles_off(void)
{
    _tile_release();
}

/* bf16 as AMX reads it: a subnormal (exponent field zero) counts as zero. */
static inline float bf16_daz(uint16_t h)
{
    return (h & 0x7f80u) ? kern_bf16_to_f32(h) : 0.0f;
}

/* The norms the screens' bounds are built from, of a vector v [n] and of its bf16 rounding as
 * the tile unit reads it: |v|, |bf16(v)| and |bf16(v) - v|, summed in double. */
typedef struct bf16_norms {
    double v, b, d;
} bf16_norms;

static bf16_norms norms_of(const float *v, size_t n)
{
    double s = 0, sb = 0, sd = 0;
    for (size_t k = 0; k < n; k++) {
        double x = v[k], xb = bf16_daz(kern_f32_to_bf16(v[k]));
        s += x * x;
        sb += xb * xb;
        sd += (xb - x) * (xb - x);
    }
    return (bf16_norms){sqrt(s), sqrt(sb), sqrt(sd)};
}

/* g = n u / (1 - n u), u = 2^-24: a sum of n fp32 products, in any order, is within g times
 * the sum of their magnitudes of the exact one. */
static double sum_gamma(size_t n)
{
    return (double)n * 0x1p-24 / (1 - (double)n * 0x1p-24);
}

/* Candidates a point may list before it goes to the fp32 kernel. */
#define SCREEN_CAP 64

/*
 * The shared driver. screen == 0: the bf16 argmax (kern_cpu_nearest_centroid_amx). screen == 1:
 * the fp32 argmax, screened (kern_cpu_nearest_centroid_screened): one bf16 pass over the
 * centroids (item_screen) lists each point's centroids whose bf16 score is within 2 E of its
 * bf16 best, E a bound on |bf16 score - fp32 score| over every centroid (below), and
 * kern_cpu_rescore_list takes the fp32 argmax of the list. The fp32 argmax c* is always listed:
 * s32(c*) >= s32(b)
 * for the bf16 winner b, so sb(c*) >= s32(c*) - E >= s32(b) - E >= sb(b) - 2E. Points whose
 * list overflows, or whose bound or bf16 best is not finite (NaN or infinite input), are
 * flagged in fb for the fp32 kernel. (A first version took the bf16 best in one pass and
 * listed in a second: 1.6x this one's time.)
 *
 * The bound, for a point x and any centroid c, with x~ and c~ their bf16 roundings (subnormals
 * zero, as the tile unit reads them), u = 2^-24 and g = d u / (1 - d u) (a sum of d products
 * in fp32, in any order, is within g sum |x_i c_i| of the exact one):
 *   |sb - s32| <= |sb - x~.c~| + |x~.c~ - x.c| + |x.c - s32|
 *             <= g |x~| |c~| + (|x~ - x| |c~| + |x| |c~ - c|) + g |x| |c|    (Cauchy-Schwarz)
 * with the centroid norms at their maxima over the table, plus 2^-100 for flushed subnormal
 * sums. Measured over real rounding errors, |x~ - x| is about 0.15% of |x| where the worst
 * case is 0.39%, so the window is about 0.006 for unit vectors (d 128) and lists 1-3 centroids
 * a point on the build corpora.
 */
static int amx_nearest(const float *x, size_t n, const float *centroids, size_t n_centroids,
                       size_t dim, int32_t *best, float *best_score, int screen, uint8_t *fb)
{
    /* dims padded with zeros to whole tiles (32), centroids to whole groups of 32 by repeating
     * the last one (a repeat scores the same with a higher index: it never wins) */
    size_t dimp = (dim + 31) / 32 * 32, kp = (n_centroids + 31) / 32 * 32;
    uint16_t *cb = kern_aligned_alloc(kp * dimp * sizeof(uint16_t));
    if (!cb) {
        kern_set_error("nearest_centroid_bf16: out of memory for %zu bf16 centroids", n_centroids);
        return KERN_ENOMEM;
    }
    /* screening: the largest |c|, |bf16(c)| and |bf16(c) - c| over the centroids */
    double cn = 0, cbn = 0, dcn = 0;
#pragma omp parallel for schedule(static) reduction(max : cn, cbn, dcn)
    for (long long cc = 0; cc < (long long)kp; cc++) {
        size_t c = (size_t)cc < n_centroids ? (size_t)cc : n_centroids - 1;
        uint16_t *r = cb + (size_t)cc * dimp;
        const float *f = centroids + c * dim;
        for (size_t k = 0; k < dim; k++)
            r[k] = kern_f32_to_bf16(f[k]);
        for (size_t k = dim; k < dimp; k++)
            r[k] = 0;
        if (screen) {
            bf16_norms nc = norms_of(f, dim);
            cn = nc.v > cn ? nc.v : cn;
            cbn = nc.b > cbn ? nc.b : cbn;
            dcn = nc.d > dcn ? nc.d : dcn;
        }
    }
    double gam = sum_gamma(dim);
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    size_t per = (n + 4 * (size_t)threads - 1) / (4 * (size_t)threads);
    per = (per + 31) / 32 * 32;
    if (per > AMX_POINTS)
        per = AMX_POINTS;
    if (per < 32)
        per = 32;
    size_t nitems = (n + per - 1) / per, panel = dimp / 2 * 64; /* uint16 per panel */
    int failed = 0;
#pragma omp parallel
    {
        uint16_t *pk = kern_aligned_alloc(per / 32 * panel * sizeof(uint16_t));
        float *bs = kern_aligned_alloc(per * sizeof(float));
        int32_t *bi = kern_aligned_alloc(per * sizeof(int32_t));
        float *c = kern_aligned_alloc(1024 * sizeof(float));
        /* screening: each point's bound E, window 2E as a float, list count and list */
        double *eb = screen ? malloc(per * sizeof(double)) : NULL;
        float *win = screen ? kern_aligned_alloc(per * sizeof(float)) : NULL;
        uint32_t *cnt = screen ? malloc(per * sizeof(uint32_t)) : NULL;
        int32_t *li = screen ? malloc(per * SCREEN_CAP * sizeof(int32_t)) : NULL;
        float *ls = screen ? malloc(per * SCREEN_CAP * sizeof(float)) : NULL;
        int ok = pk && bs && bi && c && (!screen || (eb && win && cnt && li && ls));
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        } else
            tiles_on();
#pragma omp for schedule(dynamic, 1)
        for (size_t it = 0; it < nitems; it++) {
            if (!ok)
                continue;
            size_t p0 = it * per, m = n - p0 < per ? n - p0 : per, np = (m + 31) / 32;
            /* the points rounded to bf16 and packed as pairs; lanes past m stay zero */
            memset(pk, 0, np * panel * sizeof(uint16_t));
            for (size_t i = 0; i < m; i++) {
                uint16_t *q = pk + (i / 32) * panel + (i % 32) * 2;
                const float *xi = x + (p0 + i) * dim;
                for (size_t k = 0; k < dim; k++)
                    q[(k / 2) * 64 + (k & 1)] = kern_f32_to_bf16(xi[k]);
                if (screen) {
                    bf16_norms nx = norms_of(xi, dim);
                    eb[i] = gam * nx.b * cbn + nx.d * cbn + nx.v * dcn + gam * nx.v * cn + 0x1p-100;
                }
            }
            for (size_t i = 0; i < np * 32; i++) {
                bs[i] = -INFINITY;
                bi[i] = -1;
            }
            if (!screen) {
                item_block(pk, np, panel, dimp, cb, 0, kp, bs, bi, c);
                for (size_t i = 0; i < m; i++) {
                    best[p0 + i] = bi[i];
                    if (best_score)
                        best_score[p0 + i] = bs[i];
                }
                continue;
            }
            for (size_t i = 0; i < np * 32; i++) {
                cnt[i] = 0;
                /* 2E and a relative 1e-6 for the double sums' own rounding, rounded up to a
                 * float (lanes past m: 0; a point whose bound is not finite goes to fp32) */
                double wd = i < m ? 2 * eb[i] * (1 + 1e-6) : 0;
                float wf = (float)wd;
                win[i] = (double)wf < wd ? nextafterf(wf, INFINITY) : wf;
                if (i < m && !isfinite(wd))
                    fb[p0 + i] = 1;
            }
            item_screen(pk, np, panel, dimp, cb, kp, (int32_t)n_centroids, bs, win, cnt, li, ls,
                        SCREEN_CAP, c);
            for (size_t i = 0; i < m; i++) {
                if (fb[p0 + i])
                    continue;
                /* the final threshold, rounded down; the list filtered to it, in order */
                float tf = bs[i] - win[i];
                if ((double)tf > (double)bs[i] - (double)win[i])
                    tf = nextafterf(tf, -INFINITY);
                uint32_t kept = 0;
                if (cnt[i] <= SCREEN_CAP)
                    for (uint32_t e2 = 0; e2 < cnt[i]; e2++)
                        if (ls[i * SCREEN_CAP + e2] >= tf)
                            li[i * SCREEN_CAP + kept++] = li[i * SCREEN_CAP + e2];
                /* overflow, a non-finite best (NaN or infinite input), or nothing listed
                 * (cannot happen for finite inputs; safe anyway): the fp32 kernel */
                if (cnt[i] > SCREEN_CAP || !isfinite(bs[i]) || !isfinite(tf) || kept == 0) {
                    fb[p0 + i] = 1;
                    continue;
                }
                float sc;
                kern_cpu_rescore_list(x + (p0 + i) * dim, centroids, dim, li + i * SCREEN_CAP, kept,
                                      best + p0 + i, &sc);
                if (best_score)
                    best_score[p0 + i] = sc;
            }
        }
        if (ok)
            tiles_off();
        free(pk);
        free(bs);
        free(bi);
        free(c);
        free(eb);
        free(win);
        free(cnt);
        free(li);
        free(ls);
    }
    free(cb);
    if (failed) {
        kern_set_error("nearest_centroid_bf16: out of memory for the point panels");
        return KERN_ENOMEM;
    }
    return KERN_OK;
}

int kern_cpu_nearest_centroid_amx(const float *x, size_t n, const float *centroids,
                                  size_t n_centroids, size_t dim, int32_t *best, float *best_score)
{
    if (!kern_cpu_amx_usable()) {
        kern_set_error("nearest_centroid_bf16: AMX is not usable here");
        return KERN_ENODEV;
    }
    return amx_nearest(x, n, centroids, n_centroids, dim, best, best_score, 0, NULL);
}

int kern_cpu_nearest_centroid_screened(const float *x, size_t n, const float *centroids,
                                       size_t n_centroids, size_t dim, int32_t *best,
                                       float *best_score, size_t *n_fp32)
{
    if (!kern_cpu_amx_usable()) {
        kern_set_error("nearest_centroid: AMX is not usable here");
        return KERN_ENODEV;
    }
    uint8_t *fb = calloc(n ? n : 1, 1);
    if (!fb) {
        kern_set_error("nearest_centroid: out of memory for %zu flags", n);
        return KERN_ENOMEM;
    }
    int rc = amx_nearest(x, n, centroids, n_centroids, dim, best, best_score, 1, fb);
    if (rc == KERN_OK)
        rc = kern_cpu_nearest_flagged(x, n, centroids, n_centroids, dim, best, best_score, fb,
                                      n_fp32);
    free(fb);
    return rc;
}

/* ---------------------------------------------------------------------------------------
 * Residual-coded MaxSim with bf16 products on the tiles, and a bound on its error: the
 * screen of exhaustive search (engine/search_exact.c), which rescores in fp32 only the
 * documents the bound cannot rule out.
 *
 * For query token i and document token t the fp32 kernel (kern_cpu_maxsim_residual) computes
 * v = (q_i . r_t + S[i][code_t]) * inv_t, r_t the decoded residual, S the fp32 centroid scores.
 * Here q_i . r_t comes from the tiles (q_i and r_t rounded to bf16); S and inv are the same
 * fp32 values. Per query token, with R, R~ and dR the largest |r|, |bf16(r)| and
 * |bf16(r) - r| any token can have (sqrt(dim) times the largest bucket weight, its bf16
 * rounding and their difference), A_i = max |S[i][c]|, g = d u / (1 - d u), u = 2^-24:
 *   |acc~ - acc| <= |bf16(q_i) - q_i| R~ + |q_i| dR + g (|q_i| R + |bf16(q_i)| R~)
 *   |v~ - v| <= inv_max (|acc~ - acc| + 8 u (|q_i| max(R, R~) + A_i))
 * (two roundings on each side: the add and the multiply), and the maximum over tokens moves
 * no more than its terms. The document score sums lq maxima in the same order on both sides,
 * so |score~ - score| <= D + g_lq (2 sum |max~_i| + D), D the sum of the per-token bounds,
 * inv_max the document's largest inverse norm.
 * ------------------------------------------------------------------------------------- */

/* One document's per-query-token maxima mx [lqp] (kern_cpu_maxsim_residual_amx), 16 tokens at
 * a time: decoded to bf16 rows in rb (16 x dimp), two query groups of 16 a pass through tiles
 * 0 and 1 (c: 512 floats of scratch), the fp32 centroid scores added and the inverse norm
 * applied as the fp32 kernel does. Returns the document's largest inverse norm. */
TAMX static float amx_doc(const kern_residual *a, const kern_pdoc *d, size_t dimp, size_t ng,
                          size_t lqp, size_t tb, unsigned per, const uint16_t *dec,
                          const uint16_t *qb, const float *qcT, uint16_t *rb, float *c, float *mx)
{
    size_t dim = a->dim;
    for (size_t i = 0; i < lqp; i++)
        mx[i] = -INFINITY;
    float inv_max = 0;
    for (size_t t0 = 0; t0 < d->ntok; t0 += 16) {
        size_t m = d->ntok - t0 < 16 ? d->ntok - t0 : 16;
        /* decode 16 tokens (the last repeated past m) to bf16 rows, dims padded */
        for (size_t r = 0; r < 16; r++) {
            size_t tt = t0 + (r < m ? r : m - 1);
            const uint8_t *src = d->residuals + tt * tb;
            uint16_t *dst = rb + r * dimp;
            /* fixed-size copies per nbits, inlined as single moves */
            switch (per) {
            case 4:
                for (size_t b = 0; b < tb; b++)
                    memcpy(dst + b * 4, dec + src[b] * 4, 4 * sizeof(uint16_t));
                break;
            case 8:
                for (size_t b = 0; b < tb; b++)
                    memcpy(dst + b * 8, dec + src[b] * 8, 8 * sizeof(uint16_t));
                break;
            case 2:
                for (size_t b = 0; b < tb; b++)
                    memcpy(dst + b * 2, dec + src[b] * 2, 2 * sizeof(uint16_t));
                break;
            default:
                for (size_t b = 0; b < tb; b++)
                    dst[b] = dec[src[b]];
            }
            for (size_t k = dim; k < dimp; k++)
                dst[k] = 0;
        }
        for (size_t g = 0; g < ng; g += 2) {
            int two = g + 1 < ng;
            _tile_zero(0);
            _tile_zero(1);
            for (size_t k = 0; k < dimp; k += 32) {
                _tile_loadd(4, rb + k, dimp * sizeof(uint16_t));
                _tile_loadd(6, qb + g * dimp * 16 + (k / 2) * 32, 64);
                _tile_dpbf16ps(0, 4, 6);
                if (two) {
                    _tile_loadd(7, qb + (g + 1) * dimp * 16 + (k / 2) * 32, 64);
                    _tile_dpbf16ps(1, 4, 7);
                }
            }
            _tile_stored(0, c, 64);
            if (two)
                _tile_stored(1, c + 256, 64);
            __m512 m0 = _mm512_loadu_ps(mx + 16 * g);
            __m512 m1 = two ? _mm512_loadu_ps(mx + 16 * (g + 1)) : m0;
            for (size_t r = 0; r < m; r++) {
                size_t tt = t0 + r;
                uint32_t code;
                if (a->code_bytes == 2) {
                    uint16_t c16;
                    memcpy(&c16, (const char *)d->codes + 2 * tt, 2);
                    code = c16;
                } else
                    memcpy(&code, (const char *)d->codes + 4 * tt, 4);
                float inv;
                memcpy(&inv, (const char *)d->inv_norms + 4 * tt, 4);
                inv_max = inv > inv_max ? inv : inv_max;
                __m512 sc = _mm512_set1_ps(inv);
                const float *add = qcT + (size_t)code * lqp + 16 * g;
                m0 = _mm512_max_ps(
                    m0, _mm512_mul_ps(
                            _mm512_add_ps(_mm512_load_ps(c + 16 * r), _mm512_loadu_ps(add)), sc));
                if (two)
                    m1 = _mm512_max_ps(m1,
                                       _mm512_mul_ps(_mm512_add_ps(_mm512_load_ps(c + 256 + 16 * r),
                                                                   _mm512_loadu_ps(add + 16)),
                                                     sc));
            }
            _mm512_storeu_ps(mx + 16 * g, m0);
            if (two)
                _mm512_storeu_ps(mx + 16 * (g + 1), m1);
        }
    }
    return inv_max;
}

int kern_cpu_maxsim_residual_amx(const kern_residual *a, float *approx, float *bound)
{
    if (!kern_cpu_amx_usable()) {
        kern_set_error("maxsim_residual_amx: AMX is not usable here");
        return KERN_ENODEV;
    }
    size_t dim = a->dim, lq = a->lq, K = a->n_centroids;
    size_t dimp = (dim + 31) / 32 * 32, ng = (lq + 15) / 16, lqp = ng * 16;
    unsigned nbits = a->nbits, per = 8 / nbits;
    size_t tb = dim * nbits / 8;
    if (lq == 0 || nbits == 0 || nbits > 8 || (dim * nbits) % 8) {
        kern_set_error("maxsim_residual_amx: bad shape");
        return KERN_EINVAL;
    }
    /* the query: bf16 pairs, [ng][dimp / 2][16][2]; each token's norms */
    uint16_t *qb = kern_aligned_alloc(ng * dimp * 16 * sizeof(uint16_t));
    float *qcT = kern_transpose_scores(a->qc, lq, K, lqp); /* [K][lqp], lanes past lq 0 */
    uint16_t *dec = malloc(256 * per * sizeof(uint16_t));
    if (!qb || !qcT || !dec) {
        free(qb);
        free(qcT);
        free(dec);
        kern_set_error("maxsim_residual_amx: out of memory");
        return KERN_ENOMEM;
    }
    memset(qb, 0, ng * dimp * 16 * sizeof(uint16_t));
    /* residual bounds: the bucket weights, their bf16 roundings */
    double wmax = 0, wbmax = 0, dwmax = 0;
    unsigned nb = 1u << nbits;
    for (unsigned b = 0; b < nb; b++) {
        double w = a->bucket_weights[b], wb = bf16_daz(kern_f32_to_bf16(a->bucket_weights[b]));
        wmax = fmax(wmax, fabs(w));
        wbmax = fmax(wbmax, fabs(wb));
        dwmax = fmax(dwmax, fabs(wb - w));
    }
    double sd = sqrt((double)dim), R = sd * wmax, Rb = sd * wbmax, dR = sd * dwmax;
    double gam = sum_gamma(dim), u = 0x1p-24;
    double qe = 0; /* sum over query tokens of the bound without inv_max */
    int finite = isfinite(R) && isfinite(Rb);
    for (size_t i = 0; i < lq; i++) {
        const float *qi = a->q + i * dim;
        uint16_t *grp = qb + (i / 16) * dimp * 16;
        for (size_t k = 0; k < dim; k++)
            grp[(k / 2) * 32 + (i % 16) * 2 + (k & 1)] = kern_f32_to_bf16(qi[k]);
        bf16_norms nq = norms_of(qi, dim);
        const float *Si = a->qc + i * K;
        float am = 0;
        for (size_t c = 0; c < K; c++) {
            float v = fabsf(Si[c]);
            am = v > am ? v : am;
        }
        double amax = isnan(am) ? INFINITY : am; /* a NaN score: no bound (max skips NaN) */
        qe += nq.d * Rb + nq.v * dR + gam * (nq.v * R + nq.b * Rb) +
              8 * u * (nq.v * fmax(R, Rb) + amax);
    }
    finite = finite && isfinite(qe);
    for (unsigned v = 0; v < 256; v++)
        for (unsigned jj = 0; jj < per; jj++) {
            unsigned bucket = 0;
            for (unsigned b = 0; b < nbits; b++)
                bucket |= ((v >> (7 - (jj * nbits + b))) & 1u) << b;
            dec[v * per + jj] = kern_f32_to_bf16(a->bucket_weights[bucket]);
        }
    double glq = sum_gamma(lq);
    int failed = 0;
#pragma omp parallel
    {
        uint16_t *rb = kern_aligned_alloc(16 * dimp * sizeof(uint16_t)); /* 16 tokens */
        float *c = kern_aligned_alloc(512 * sizeof(float));
        float *mx = kern_aligned_alloc(lqp * sizeof(float));
        int ok = rb && c && mx;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        } else
            tiles_on();
#pragma omp for schedule(dynamic, 16)
        for (size_t n = 0; n < a->nd; n++) {
            if (!ok)
                continue;
            const kern_pdoc *d = &a->docs[n];
            if (!d->ntok) {
                approx[n] = KERN_EMPTY_SCORE;
                bound[n] = 0;
                continue;
            }
            float inv_max = amx_doc(a, d, dimp, ng, lqp, tb, per, dec, qb, qcT, rb, c, mx);
            float sum = 0.0f;
            double asum = 0;
            for (size_t i = 0; i < lq; i++) {
                sum += mx[i];
                asum += fabs((double)mx[i]);
            }
            approx[n] = sum;
            double D = (double)inv_max * qe;
            double bnd = (D + glq * (2 * asum + D)) * (1 + 1e-5) + 1e-30;
            bound[n] =
                finite && isfinite(bnd) && isfinite(sum) ? (float)(bnd * (1 + 1e-6)) : INFINITY;
        }
        if (ok)
            tiles_off();
        free(rb);
        free(c);
        free(mx);
    }
    free(qb);
    free(qcT);
    free(dec);
    if (failed) {
        kern_set_error("maxsim_residual_amx: out of memory");
        return KERN_ENOMEM;
    }
    return KERN_OK;
}

/* ---------------------------------------------------------------------------------------
 * PLAID's probe (stage 1) screened on the tiles: the query x centroid table in bf16, and each
 * query token's best nc centroids exactly as the fp32 table would rank them.
 *
 * The table S~ [lq, K] comes from the tiles with the query tokens as A (rows: 16 tokens of 32
 * dims, row-major bf16) and the centroids as B (pairs of dims, [dimp / 2][16 centroids][2]),
 * so a C tile holds 16 tokens (rows) x 16 centroids: S~'s own row-major layout, no transpose.
 * For token i, E_i bounds |S~[i][c] - S[i][c]| over every centroid c, S the fp32 table of
 * kern_cpu_centroid_scores (the bound of amx_nearest's comment, with the table's largest
 * centroid norms). If t~ is the nc-th largest S~[i][.], the nc centroids at or above it have
 * fp32 scores >= t~ - E_i, so the fp32 nc-th score T is too, and every centroid of the fp32
 * top nc (score >= T) has S~ >= T - E_i >= t~ - 2 E_i. The centroids above that line are
 * rescored with the tile micro-kernel and the same query panels as kern_cpu_centroid_scores
 * (the same products bit for bit), written back into S~, and the best nc of them, equal scores
 * to the lower index, are fp32's top nc: all of fp32's ties at T are listed too.
 * ------------------------------------------------------------------------------------- */

/* Centroids whose fp32 values a probe table keeps to tell its own centroids from others. */
#define PROBE_SAMPLE 64

struct kern_probe_table {
    const float *c; /* [K, dim] fp32: the caller's of the current kern_centroid_probe call */
    size_t K, dim, dimp, kp;
    float sample[PROBE_SAMPLE * 4]; /* the first 4 dims of PROBE_SAMPLE centroids spread out */
    uint16_t *b;                    /* [kp / 16][dimp / 2][16][2] bf16, centroids past K zero */
    double cn, cbn, dcn;            /* largest |c|, |bf16(c)|, |bf16(c) - c| */
};

int kern_cpu_probe_table_new(const float *centroids, size_t K, size_t dim, kern_probe_table **out)
{
    *out = NULL;
    if (!kern_cpu_amx_usable() || strncmp(kern_mk_active()->name, "avx512", 6) != 0) {
        kern_set_error("probe_table: needs AMX tiles and the AVX-512 micro-kernels");
        return KERN_ENODEV;
    }
    kern_probe_table *t = calloc(1, sizeof *t);
    size_t dimp = (dim + 31) / 32 * 32, kp = (K + 31) / 32 * 32;
    uint16_t *b = t ? kern_aligned_alloc(kp * dimp * sizeof(uint16_t)) : NULL;
    if (!b) {
        free(t);
        kern_set_error("probe_table: out of memory for %zu bf16 centroids", K);
        return KERN_ENOMEM;
    }
    double cn = 0, cbn = 0, dcn = 0;
#pragma omp parallel for schedule(static) reduction(max : cn, cbn, dcn)
    for (long long cc = 0; cc < (long long)kp; cc++) {
        size_t c = (size_t)cc;
        uint16_t *blk = b + (c / 16) * dimp * 16 + (c % 16) * 2;
        if (c >= K) {
            for (size_t k = 0; k < dimp; k++)
                blk[(k / 2) * 32 + (k & 1)] = 0;
            continue;
        }
        const float *f = centroids + c * dim;
        for (size_t k = 0; k < dimp; k++)
            blk[(k / 2) * 32 + (k & 1)] = k < dim ? kern_f32_to_bf16(f[k]) : 0;
        bf16_norms nc = norms_of(f, dim);
        cn = nc.v > cn ? nc.v : cn;
        cbn = nc.b > cbn ? nc.b : cbn;
        dcn = nc.d > dcn ? nc.d : dcn;
    }
    *t = (kern_probe_table){.c = NULL,
                            .K = K,
                            .dim = dim,
                            .dimp = dimp,
                            .kp = kp,
                            .b = b,
                            .cn = cn,
                            .cbn = cbn,
                            .dcn = dcn};
    for (size_t j = 0; j < PROBE_SAMPLE; j++)
        for (size_t k = 0; k < 4; k++)
            t->sample[4 * j + k] = k < dim ? centroids[(j * K / PROBE_SAMPLE) * dim + k] : 0.0f;
    *out = t;
    return KERN_OK;
}

int kern_cpu_probe_table_matches(const kern_probe_table *t, const float *centroids, size_t K,
                                 size_t dim)
{
    if (!t || t->K != K || t->dim != dim)
        return 0;
    for (size_t j = 0; j < PROBE_SAMPLE; j++)
        for (size_t k = 0; k < 4 && k < dim; k++)
            if (memcmp(&t->sample[4 * j + k], &centroids[(j * K / PROBE_SAMPLE) * dim + k],
                       sizeof(float)))
                return 0;
    return 1;
}

void kern_cpu_probe_table_free(kern_probe_table *t)
{
    if (!t)
        return;
    free(t->b);
    free(t);
}

/* S~ for centroid groups [g0, g1) of 32 (tiles on): token groups two at a time, the 4 C tiles
 * through c (4 KB scratch) into S [lq, K], columns past K left out, and (ST not NULL) into
 * ST [K, ld] transposed, lanes from lq rounded up to 16 on zero. */
TAMX static void probe_product(const kern_probe_table *t, const uint16_t *qa, size_t lq, size_t g0,
                               size_t g1, float *S, float *ST, size_t ld, float *c)
{
    /* a C tile's column: 16 rows, 16 floats apart */
    const __m512i colx =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32(16));
    size_t dimp = t->dimp, K = t->K, ng = (lq + 15) / 16, bs = dimp * 16;
    for (size_t g = 0; g < ng; g += 2) {
        int two = g + 1 < ng;
        const uint16_t *a0 = qa + g * 16 * dimp, *a1 = a0 + 16 * dimp;
        for (size_t cg = g0; cg < g1; cg++) {
            const uint16_t *b0 = t->b + 2 * cg * bs, *b1 = b0 + bs;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (size_t k = 0; k < dimp; k += 32) {
                _tile_loadd(4, a0 + k, dimp * sizeof(uint16_t));
                _tile_loadd(6, b0 + (k / 2) * 32, 64);
                _tile_loadd(7, b1 + (k / 2) * 32, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                if (two) {
                    _tile_loadd(5, a1 + k, dimp * sizeof(uint16_t));
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, c, 64);
            _tile_stored(1, c + 256, 64);
            if (two) {
                _tile_stored(2, c + 512, 64);
                _tile_stored(3, c + 768, 64);
            }
            for (size_t h = 0; h < 2; h++) {
                size_t c0 = 32 * cg + 16 * h;
                if (c0 >= K)
                    break;
                __mmask16 cm = K - c0 >= 16 ? 0xffff : (__mmask16)((1u << (K - c0)) - 1);
                for (size_t gg = 0; gg < 1u + (unsigned)two; gg++) {
                    const float *ct = c + 512 * gg + 256 * h;
                    for (size_t r = 0; r < 16 && 16 * (g + gg) + r < lq; r++)
                        _mm512_mask_storeu_ps(S + (16 * (g + gg) + r) * K + c0, cm,
                                              _mm512_load_ps(ct + 16 * r));
                    if (ST)
                        for (size_t j = 0; j < 16 && c0 + j < K; j++)
                            _mm512_storeu_ps(ST + (c0 + j) * ld + 16 * (g + gg),
                                             _mm512_i32gather_ps(colx, ct + j, 4));
                }
                if (ST && g + 2 >= ng)
                    for (size_t j = 0; j < 16 && c0 + j < K; j++)
                        for (size_t l = 16 * ng; l < ld; l++)
                            ST[(c0 + j) * ld + l] = 0.0f;
            }
        }
    }
}

/* Whether (va, ia) ranks before (vb, ib): higher score, then lower index. */
static inline int probe_better(float va, int64_t ia, float vb, int64_t ib)
{
    return va > vb || (va == vb && ia < ib);
}

/* Token i's exact top nc (see above): list, rescore, select. Returns 0, or 1 when the list
 * overflowed or a bound or score is not finite (the caller then computes the row in fp32). */
TAMX static int probe_token(const kern_probe_table *t, const kern_mk *mk, const float *panels,
                            size_t lq, size_t i, double E, size_t nc, float *row, float *ST,
                            size_t ld, int64_t *idx, float *val, uint32_t *li, size_t cap)
{
    size_t K = t->K, P = mk->P, J = mk->J, dim = t->dim;
    kern_cpu_topk_rows(row, 1, K, nc, idx, val);
    float tb = val[nc - 1];
    double wd = 2 * E * (1 + 1e-6);
    float w = (float)wd;
    if ((double)w < wd)
        w = nextafterf(w, INFINITY);
    float thr = tb - w;
    if ((double)thr > (double)tb - (double)w)
        thr = nextafterf(thr, -INFINITY);
    if (!isfinite(tb) || !isfinite(wd) || !isfinite(thr))
        return 1;
    /* the list, ascending */
    size_t n = 0;
    __m512 vt = _mm512_set1_ps(thr);
    size_t c = 0;
    for (; c + 16 <= K; c += 16) {
        unsigned m = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + c), vt, _CMP_GE_OQ);
        if (!m)
            continue;
        if (n + 16 > cap && n + (size_t)__builtin_popcount(m) > cap)
            return 1;
        while (m) {
            li[n++] = (uint32_t)(c + (unsigned)__builtin_ctz(m));
            m &= m - 1;
        }
    }
    for (; c < K; c++)
        if (row[c] >= thr) {
            if (n == cap)
                return 1;
            li[n++] = (uint32_t)c;
        }
    /* rescored J at a time on token i's panel lane; the last row repeated to fill a group */
    float tile[KERN_MK_MAX_J * KERN_MK_MAX_P] __attribute__((aligned(64)));
    const float *rows[KERN_MK_MAX_J];
    size_t p = i / P, l = i % P, lanes = lq - p * P < P ? lq - p * P : P;
    const float *pan = panels + p * kern_panel_floats(mk, dim);
    for (size_t j0 = 0; j0 < n; j0 += J) {
        size_t m = n - j0 < J ? n - j0 : J;
        for (size_t j = 0; j < J; j++)
            rows[j] = t->c + (size_t)li[j0 + (j < m ? j : m - 1)] * dim;
        mk->tile(pan, dim, rows, (unsigned)lanes, tile);
        for (size_t j = 0; j < m; j++) {
            row[li[j0 + j]] = tile[j * P + l];
            if (ST)
                ST[(size_t)li[j0 + j] * ld + i] = tile[j * P + l];
        }
    }
    /* the best nc of the list: insertion into a sorted run (the list is short) */
    size_t have = 0;
    for (size_t j = 0; j < n; j++) {
        float v = row[li[j]];
        if (isnan(v))
            return 1;
        int64_t id = li[j];
        if (have == nc && !probe_better(v, id, val[nc - 1], idx[nc - 1]))
            continue;
        size_t at = have < nc ? have++ : nc - 1;
        while (at > 0 && probe_better(v, id, val[at - 1], idx[at - 1])) {
            val[at] = val[at - 1];
            idx[at] = idx[at - 1];
            at--;
        }
        val[at] = v;
        idx[at] = id;
    }
    return have == nc ? 0 : 1;
}

int kern_cpu_centroid_probe(const kern_probe_table *table, const float *centroids, const float *q,
                            size_t lq, size_t nc, float *S, float *ST, size_t ld, int64_t *idx,
                            float *val, size_t *n_fp32)
{
    /* the fp32 centroids of this call (the table may outlive the snapshot it was built from) */
    kern_probe_table tt = *table;
    tt.c = centroids;
    const kern_probe_table *t = &tt;
    const kern_mk *mk = kern_mk_active();
    size_t dim = t->dim, dimp = t->dimp, K = t->K, ng = (lq + 15) / 16;
    if (n_fp32)
        *n_fp32 = 0;
    if (!kern_cpu_amx_usable() || strncmp(mk->name, "avx512", 6) != 0) {
        kern_set_error("centroid_probe: needs AMX tiles and the AVX-512 micro-kernels");
        return KERN_ENODEV;
    }
    if (nc == 0 || nc > K) {
        kern_set_error("centroid_probe: nc %zu not in 1 .. %zu", nc, K);
        return KERN_EINVAL;
    }
    size_t np = kern_npanels(mk, lq), cap = nc + 256;
    uint16_t *qa = kern_aligned_alloc(ng * 16 * dimp * sizeof(uint16_t));
    float *panels = kern_aligned_alloc(np * kern_panel_floats(mk, dim) * sizeof(float));
    const void **qrows = malloc(lq * sizeof *qrows);
    double *E = malloc(lq * sizeof *E);
    uint8_t *fb = calloc(lq, 1);
    int failed = !qa || !panels || !qrows || !E || !fb;
    if (!failed) {
        memset(qa, 0, ng * 16 * dimp * sizeof(uint16_t));
        double gam = sum_gamma(dim);
        for (size_t i = 0; i < lq; i++) {
            const float *qi = q + i * dim;
            for (size_t k = 0; k < dim; k++)
                qa[i * dimp + k] = kern_f32_to_bf16(qi[k]);
            bf16_norms nq = norms_of(qi, dim);
            E[i] =
                gam * nq.b * t->cbn + nq.d * t->cbn + nq.v * t->dcn + gam * nq.v * t->cn + 0x1p-100;
            qrows[i] = qi;
        }
        kern_pack_panels(mk, KERN_F32, qrows, lq, dim, panels);
    }
    size_t ngroups = t->kp / 32, nfb = 0;
#pragma omp parallel if (!failed && ngroups >= 64) reduction(+ : nfb)
    {
        float *c = kern_aligned_alloc(1024 * sizeof(float));
        uint32_t *li = malloc(cap * sizeof *li);
        int ok = c && li && !failed;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        int nt = 1, me = 0;
#ifdef _OPENMP
        nt = omp_get_num_threads();
        me = omp_get_thread_num();
#endif
        if (ok) {
            size_t g0 = ngroups * (size_t)me / (size_t)nt,
                   g1 = ngroups * (size_t)(me + 1) / (size_t)nt;
            tiles_on();
            probe_product(t, qa, lq, g0, g1, S, ST, ld, c);
            tiles_off();
        }
#pragma omp barrier
        int stop;
#pragma omp atomic read
        stop = failed;
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < lq; i++) {
            if (stop)
                continue;
            if (probe_token(t, mk, panels, lq, i, E[i], nc, S + i * K, ST, ld, idx + i * nc,
                            val + i * nc, li, cap)) {
                fb[i] = 1;
                nfb++;
            }
        }
        free(c);
        free(li);
    }
    /* tokens the screen could not settle: their rows in fp32, as the whole table would have
     * them */
    for (size_t i = 0; !failed && i < lq; i++)
        if (fb[i]) {
            int rc = kern_cpu_centroid_scores(q + i * dim, 1, t->c, K, dim, S + i * K);
            if (rc == KERN_OK)
                rc = kern_cpu_topk_rows(S + i * K, 1, K, nc, idx + i * nc, val + i * nc);
            for (size_t cc = 0; ST && cc < K; cc++)
                ST[cc * ld + i] = S[i * K + cc];
            if (rc != KERN_OK) {
                free(qa), free(panels), free(qrows), free(E), free(fb);
                return rc;
            }
        }
    free(qa);
    free(panels);
    free(qrows);
    free(E);
    free(fb);
    if (failed) {
        kern_set_error("centroid_probe: out of memory");
        return KERN_ENOMEM;
    }
    if (n_fp32)
        *n_fp32 = nfb;
    return KERN_OK;
}

#else /* no AMX in this build */

int kern_cpu_amx_usable(void)
{
    return 0;
}

int kern_cpu_use_amx(int on)
{
    if (on) {
        kern_set_error("this build has no AMX kernels");
        return KERN_ENODEV;
    }
    return KERN_OK;
}

int kern_cpu_nearest_centroid_amx(const float *x, size_t n, const float *centroids,
                                  size_t n_centroids, size_t dim, int32_t *best, float *best_score)
{
    (void)x, (void)n, (void)centroids, (void)n_centroids, (void)dim, (void)best, (void)best_score;
    kern_set_error("nearest_centroid_bf16: this build has no AMX kernels");
    return KERN_ENODEV;
}

int kern_cpu_maxsim_residual_amx(const kern_residual *a, float *approx, float *bound)
{
    (void)a, (void)approx, (void)bound;
    kern_set_error("maxsim_residual_amx: this build has no AMX kernels");
    return KERN_ENODEV;
}

int kern_cpu_nearest_centroid_screened(const float *x, size_t n, const float *centroids,
                                       size_t n_centroids, size_t dim, int32_t *best,
                                       float *best_score, size_t *n_fp32)
{
    (void)x, (void)n, (void)centroids, (void)n_centroids, (void)dim, (void)best, (void)best_score;
    (void)n_fp32;
    kern_set_error("nearest_centroid: this build has no AMX kernels");
    return KERN_ENODEV;
}

struct kern_probe_table {
    int unused;
};

int kern_cpu_probe_table_new(const float *centroids, size_t K, size_t dim, kern_probe_table **out)
{
    (void)centroids, (void)K, (void)dim;
    *out = NULL;
    kern_set_error("probe_table: this build has no AMX kernels");
    return KERN_ENODEV;
}

void kern_cpu_probe_table_free(kern_probe_table *t)
{
    free(t);
}

int kern_cpu_probe_table_matches(const kern_probe_table *t, const float *centroids, size_t K,
                                 size_t dim)
{
    (void)t, (void)centroids, (void)K, (void)dim;
    return 0;
}

int kern_cpu_centroid_probe(const kern_probe_table *t, const float *centroids, const float *q,
                            size_t lq, size_t nc, float *S, float *ST, size_t ld, int64_t *idx,
                            float *val, size_t *n_fp32)
{
    (void)t, (void)centroids, (void)q, (void)lq, (void)nc, (void)S, (void)ST, (void)ld, (void)idx,
        (void)val, (void)n_fp32;
    kern_set_error("centroid_probe: this build has no AMX kernels");
    return KERN_ENODEV;
}

#endif
