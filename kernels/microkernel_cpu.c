/*
 * microkernel_cpu.c: the CPU micro-kernels (see microkernel_cpu.h), one variant per instruction
 * set, chosen at run time with __builtin_cpu_supports so that one binary runs anywhere.
 *
 * Block sizes: the AVX-512 kernel keeps 2 x 8 = 16 accumulators of 16 lanes (32 query tokens x
 * 8 document rows) in 32 zmm registers; per dim step it loads 2 query vectors and broadcasts 8
 * document values (folded into the FMAs as memory operands), so loads never limit the FMA rate.
 * The AVX2 kernel keeps 2 x 6 = 12 accumulators of 8 lanes in 16 ymm registers. Both have
 * more independent accumulators than FMA latency x FMA ports, so the FMA units stay busy.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

#include "kernels_impl.h"
#include "microkernel_cpu.h"

void *kern_aligned_alloc(size_t bytes)
{
    size_t n = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, n ? n : 64);
}

/* ---- portable C: plain loops the compiler vectorises for the baseline instruction set ---- */

#define GEN_P 16
#define GEN_J 4

static void gen_block(const float *qt, size_t dim, const float *const *rows, float *acc)
{
    for (unsigned j = 0; j < GEN_J * GEN_P; j++)
        acc[j] = 0.0f;
    for (size_t k = 0; k < dim; k++) {
        const float *q = qt + k * GEN_P;
        for (unsigned j = 0; j < GEN_J; j++) {
            float b = rows[j][k];
            for (unsigned l = 0; l < GEN_P; l++)
                acc[j * GEN_P + l] += q[l] * b;
        }
    }
}

static void gen_max(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                    float *mx, const char *pf)
{
    float acc[GEN_J * GEN_P];
    gen_block(qt, dim, rows, acc);
    for (unsigned j = 0; j < GEN_J; j++)
        for (unsigned l = 0; l < GEN_P; l++)
            mx[l] = acc[j * GEN_P + l] > mx[l] ? acc[j * GEN_P + l] : mx[l];
}

static void gen_tile(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                     float *out)
{
    gen_block(qt, dim, rows, out);
}

static void gen_argmax(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                       int32_t first, float *best, int32_t *bidx)
{
    float acc[GEN_J * GEN_P];
    gen_block(qt, dim, rows, acc);
    for (unsigned j = 0; j < GEN_J; j++)
        for (unsigned l = 0; l < GEN_P; l++)
            if (acc[j * GEN_P + l] > best[l]) {
                best[l] = acc[j * GEN_P + l];
                bidx[l] = first + (int32_t)j;
            }
}

static void gen_max_affine(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                           float *mx, const float *const *add, const float *scale)
{
    float acc[GEN_J * GEN_P];
    gen_block(qt, dim, rows, acc);
    for (unsigned j = 0; j < GEN_J; j++)
        for (unsigned l = 0; l < GEN_P; l++) {
            float v = (acc[j * GEN_P + l] + add[j][l]) * scale[j];
            mx[l] = v > mx[l] ? v : mx[l];
        }
}

static void gen_f16(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kern_f16_to_f32(src[i]);
}

static void gen_bf16(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kern_bf16_to_f32(src[i]);
}

static const kern_mk mk_generic = {
    .name = "generic",
    .P = GEN_P,
    .J = GEN_J,
    .max = gen_max,
    .max_affine = gen_max_affine,
    .tile = gen_tile,
    .argmax = gen_argmax,
    .f16 = gen_f16,
    .bf16 = gen_bf16,
};

#ifdef HAVE_X86

/* ---- AVX-512: P = 32 lanes (2 zmm), J = 8 rows ------------------------------------------- */

#define T512 __attribute__((target("avx512f")))
#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

/* The shared body: two lane vectors (W = 2) or one (W = 1) times 8 rows. */
#define A512_DECL(j)                                                                               \
    const float *r##j = rows[j];                                                                   \
    __m512 a##j##0 = _mm512_setzero_ps(), a##j##1 = _mm512_setzero_ps();
#define A512_FMA2(j)                                                                               \
    {                                                                                              \
        __m512 b = _mm512_set1_ps(r##j[k]);                                                        \
        a##j##0 = _mm512_fmadd_ps(q0, b, a##j##0);                                                 \
        a##j##1 = _mm512_fmadd_ps(q1, b, a##j##1);                                                 \
    }
#define A512_FMA1(j) a##j##0 = _mm512_fmadd_ps(q0, _mm512_set1_ps(r##j[k]), a##j##0);

T512 static void max512(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                        float *mx, const char *pf)
{
    R8(A512_DECL)
    if (lanes <= 16) {
        for (size_t k = 0; k < dim; k++) {
            __m512 q0 = _mm512_load_ps(qt + 32 * k);
            R8(A512_FMA1)
        }
        __m512 m = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(a00, a10), _mm512_max_ps(a20, a30)),
                                 _mm512_max_ps(_mm512_max_ps(a40, a50), _mm512_max_ps(a60, a70)));
        _mm512_store_ps(mx, _mm512_max_ps(_mm512_load_ps(mx), m));
        return;
    }
    /* Steps of 16 dims (one cache line of each row); each step fetches one line of each of
     * the 8 rows pf holds, spreading the fetches evenly over the computation. */
    for (size_t k0 = 0; k0 < dim; k0 += 16) {
        if (pf)
            for (size_t j = 0; j < 8; j++)
                _mm_prefetch(pf + (j * dim + k0) * 4, _MM_HINT_T0);
        size_t ke = k0 + 16 < dim ? k0 + 16 : dim;
        for (size_t k = k0; k < ke; k++) {
            __m512 q0 = _mm512_load_ps(qt + 32 * k), q1 = _mm512_load_ps(qt + 32 * k + 16);
            R8(A512_FMA2)
        }
    }
    __m512 m0 = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(a00, a10), _mm512_max_ps(a20, a30)),
                              _mm512_max_ps(_mm512_max_ps(a40, a50), _mm512_max_ps(a60, a70)));
    __m512 m1 = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(a01, a11), _mm512_max_ps(a21, a31)),
                              _mm512_max_ps(_mm512_max_ps(a41, a51), _mm512_max_ps(a61, a71)));
    _mm512_store_ps(mx, _mm512_max_ps(_mm512_load_ps(mx), m0));
    _mm512_store_ps(mx + 16, _mm512_max_ps(_mm512_load_ps(mx + 16), m1));
}

#define A512_ST1(j) _mm512_store_ps(out + 32 * j, a##j##0);
#define A512_ST2(j)                                                                                \
    _mm512_store_ps(out + 32 * j, a##j##0);                                                        \
    _mm512_store_ps(out + 32 * j + 16, a##j##1);

T512 static void tile512(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                         float *out)
{
    R8(A512_DECL)
    if (lanes <= 16) {
        for (size_t k = 0; k < dim; k++) {
            __m512 q0 = _mm512_load_ps(qt + 32 * k);
            R8(A512_FMA1)
        }
        R8(A512_ST1)
        return;
    }
    for (size_t k = 0; k < dim; k++) {
        __m512 q0 = _mm512_load_ps(qt + 32 * k), q1 = _mm512_load_ps(qt + 32 * k + 16);
        R8(A512_FMA2)
    }
    R8(A512_ST2)
}

#define A512_ARG1(j)                                                                               \
    {                                                                                              \
        __mmask16 g = _mm512_cmp_ps_mask(a##j##0, b0, _CMP_GT_OQ);                                 \
        b0 = _mm512_mask_mov_ps(b0, g, a##j##0);                                                   \
        i0 = _mm512_mask_mov_epi32(i0, g, _mm512_set1_epi32(first + j));                           \
    }
#define A512_ARG2(j)                                                                               \
    {                                                                                              \
        __mmask16 g = _mm512_cmp_ps_mask(a##j##1, b1, _CMP_GT_OQ);                                 \
        b1 = _mm512_mask_mov_ps(b1, g, a##j##1);                                                   \
        i1 = _mm512_mask_mov_epi32(i1, g, _mm512_set1_epi32(first + j));                           \
    }

T512 static void argmax512(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                           int32_t first, float *best, int32_t *bidx)
{
    R8(A512_DECL)
    __m512 b0 = _mm512_load_ps(best);
    __m512i i0 = _mm512_load_si512(bidx);
    if (lanes <= 16) {
        for (size_t k = 0; k < dim; k++) {
            __m512 q0 = _mm512_load_ps(qt + 32 * k);
            R8(A512_FMA1)
        }
        R8(A512_ARG1)
        _mm512_store_ps(best, b0);
        _mm512_store_si512(bidx, i0);
        return;
    }
    for (size_t k = 0; k < dim; k++) {
        __m512 q0 = _mm512_load_ps(qt + 32 * k), q1 = _mm512_load_ps(qt + 32 * k + 16);
        R8(A512_FMA2)
    }
    __m512 b1 = _mm512_load_ps(best + 16);
    __m512i i1 = _mm512_load_si512(bidx + 16);
    R8(A512_ARG1)
    R8(A512_ARG2)
    _mm512_store_ps(best, b0);
    _mm512_store_si512(bidx, i0);
    _mm512_store_ps(best + 16, b1);
    _mm512_store_si512(bidx + 16, i1);
}

#define A512_AFF1(j)                                                                               \
    m0 = _mm512_max_ps(m0, _mm512_mul_ps(_mm512_add_ps(a##j##0, _mm512_loadu_ps(add[j])),          \
                                         _mm512_set1_ps(scale[j])));
#define A512_AFF2(j)                                                                               \
    {                                                                                              \
        __m512 s = _mm512_set1_ps(scale[j]);                                                       \
        m0 = _mm512_max_ps(m0, _mm512_mul_ps(_mm512_add_ps(a##j##0, _mm512_loadu_ps(add[j])), s)); \
        m1 = _mm512_max_ps(                                                                        \
            m1, _mm512_mul_ps(_mm512_add_ps(a##j##1, _mm512_loadu_ps(add[j] + 16)), s));           \
    }

T512 static void max_affine512(const float *qt, size_t dim, const float *const *rows,
                               unsigned lanes, float *mx, const float *const *add,
                               const float *scale)
{
    R8(A512_DECL)
    __m512 m0 = _mm512_load_ps(mx);
    if (lanes <= 16) {
        for (size_t k = 0; k < dim; k++) {
            __m512 q0 = _mm512_load_ps(qt + 32 * k);
            R8(A512_FMA1)
        }
        R8(A512_AFF1)
        _mm512_store_ps(mx, m0);
        return;
    }
    for (size_t k = 0; k < dim; k++) {
        __m512 q0 = _mm512_load_ps(qt + 32 * k), q1 = _mm512_load_ps(qt + 32 * k + 16);
        R8(A512_FMA2)
    }
    __m512 m1 = _mm512_load_ps(mx + 16);
    R8(A512_AFF2)
    _mm512_store_ps(mx, m0);
    _mm512_store_ps(mx + 16, m1);
}

T512 static void f16_512(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = kern_f16_to_f32(src[i]);
}

T512 static void bf16_512(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
    }
    for (; i < n; i++)
        dst[i] = kern_bf16_to_f32(src[i]);
}

#ifdef TARTAN_HAVE_AVX512BF16

/* AVX512_BF16: bf16 pairs, 2 x 8 accumulators as above, twice the products per instruction. */

#define TBF __attribute__((target("avx512f,avx512bf16")))

#define ABF_DECL(j)                                                                                \
    const uint16_t *r##j = rows[j];                                                                \
    __m512 a##j##0 = _mm512_setzero_ps(), a##j##1 = _mm512_setzero_ps();
#define ABF_DP2(j)                                                                                 \
    {                                                                                              \
        int32_t pair;                                                                              \
        memcpy(&pair, r##j + 2 * kk, 4);                                                           \
        __m512bh b = (__m512bh)_mm512_set1_epi32(pair);                                            \
        a##j##0 = _mm512_dpbf16_ps(a##j##0, q0, b);                                                \
        a##j##1 = _mm512_dpbf16_ps(a##j##1, q1, b);                                                \
    }
#define ABF_DP1(j)                                                                                 \
    {                                                                                              \
        int32_t pair;                                                                              \
        memcpy(&pair, r##j + 2 * kk, 4);                                                           \
        a##j##0 = _mm512_dpbf16_ps(a##j##0, q0, (__m512bh)_mm512_set1_epi32(pair));                \
    }

TBF static void max_bf16_512(const uint16_t *qt, size_t dim, const uint16_t *const *rows,
                             unsigned lanes, float *mx, const char *pf)
{
    R8(ABF_DECL)
    size_t half = dim / 2;
    if (lanes <= 16) {
        for (size_t kk = 0; kk < half; kk++) {
            __m512bh q0 = (__m512bh)_mm512_load_si512(qt + 64 * kk);
            R8(ABF_DP1)
        }
        __m512 m = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(a00, a10), _mm512_max_ps(a20, a30)),
                                 _mm512_max_ps(_mm512_max_ps(a40, a50), _mm512_max_ps(a60, a70)));
        _mm512_store_ps(mx, _mm512_max_ps(_mm512_load_ps(mx), m));
        return;
    }
    /* Steps of 16 pairs: one cache line of each row, and one line of each row pf holds. */
    for (size_t k0 = 0; k0 < half; k0 += 16) {
        if (pf)
            for (size_t j = 0; j < 8; j++)
                _mm_prefetch(pf + j * dim * 2 + k0 * 4, _MM_HINT_T0);
        size_t ke = k0 + 16 < half ? k0 + 16 : half;
        for (size_t kk = k0; kk < ke; kk++) {
            __m512bh q0 = (__m512bh)_mm512_load_si512(qt + 64 * kk);
            __m512bh q1 = (__m512bh)_mm512_load_si512(qt + 64 * kk + 32);
            R8(ABF_DP2)
        }
    }
    __m512 m0 = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(a00, a10), _mm512_max_ps(a20, a30)),
                              _mm512_max_ps(_mm512_max_ps(a40, a50), _mm512_max_ps(a60, a70)));
    __m512 m1 = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(a01, a11), _mm512_max_ps(a21, a31)),
                              _mm512_max_ps(_mm512_max_ps(a41, a51), _mm512_max_ps(a61, a71)));
    _mm512_store_ps(mx, _mm512_max_ps(_mm512_load_ps(mx), m0));
    _mm512_store_ps(mx + 16, _mm512_max_ps(_mm512_load_ps(mx + 16), m1));
}

/* The running argmax of argmax512 over products of bf16 pairs: each lane's product with a row
 * is the same chain of dot-product steps (kk ascending) whatever the lanes, the rows around it
 * or the caller's blocking, so the choice depends on the inputs only. */
TBF static void argmax_bf16_512(const uint16_t *qt, size_t dim, const uint16_t *const *rows,
                                unsigned lanes, int32_t first, float *best, int32_t *bidx)
{
    R8(ABF_DECL)
    size_t half = dim / 2;
    __m512 b0 = _mm512_load_ps(best);
    __m512i i0 = _mm512_load_si512(bidx);
    if (lanes <= 16) {
        for (size_t kk = 0; kk < half; kk++) {
            __m512bh q0 = (__m512bh)_mm512_load_si512(qt + 64 * kk);
            R8(ABF_DP1)
        }
        R8(A512_ARG1)
        _mm512_store_ps(best, b0);
        _mm512_store_si512(bidx, i0);
        return;
    }
    for (size_t kk = 0; kk < half; kk++) {
        __m512bh q0 = (__m512bh)_mm512_load_si512(qt + 64 * kk);
        __m512bh q1 = (__m512bh)_mm512_load_si512(qt + 64 * kk + 32);
        R8(ABF_DP2)
    }
    __m512 b1 = _mm512_load_ps(best + 16);
    __m512i i1 = _mm512_load_si512(bidx + 16);
    R8(A512_ARG1)
    R8(A512_ARG2)
    _mm512_store_ps(best, b0);
    _mm512_store_si512(bidx, i0);
    _mm512_store_ps(best + 16, b1);
    _mm512_store_si512(bidx + 16, i1);
}

#endif /* TARTAN_HAVE_AVX512BF16 */

static const kern_mk mk_avx512 = {
    .name = "avx512",
    .P = 32,
    .J = 8,
    .max = max512,
    .max_affine = max_affine512,
    .tile = tile512,
    .argmax = argmax512,
    .f16 = f16_512,
    .bf16 = bf16_512,
};

#ifdef TARTAN_HAVE_AVX512BF16
/* The same with bf16 documents multiplied as bf16 (CPUs with AVX512_BF16), and the bf16
 * nearest-centroid argmax that k-means training uses. */
static const kern_mk mk_avx512bf16 = {
    .name = "avx512bf16",
    .P = 32,
    .J = 8,
    .max = max512,
    .max_affine = max_affine512,
    .tile = tile512,
    .argmax = argmax512,
    .max_bf16 = max_bf16_512,
    .argmax_bf16 = argmax_bf16_512,
    .f16 = f16_512,
    .bf16 = bf16_512,
};
#endif

/* ---- AVX2 + FMA: P = 16 lanes (2 ymm), J = 6 rows ---------------------------------------- */

#define T256 __attribute__((target("avx2,fma,f16c")))
#define R6(X) X(0) X(1) X(2) X(3) X(4) X(5)

#define A256_DECL(j)                                                                               \
    const float *r##j = rows[j];                                                                   \
    __m256 a##j##0 = _mm256_setzero_ps(), a##j##1 = _mm256_setzero_ps();
#define A256_FMA2(j)                                                                               \
    {                                                                                              \
        __m256 b = _mm256_broadcast_ss(r##j + k);                                                  \
        a##j##0 = _mm256_fmadd_ps(q0, b, a##j##0);                                                 \
        a##j##1 = _mm256_fmadd_ps(q1, b, a##j##1);                                                 \
    }
#define A256_FMA1(j) a##j##0 = _mm256_fmadd_ps(q0, _mm256_broadcast_ss(r##j + k), a##j##0);

T256 static void max256(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                        float *mx, const char *pf)
{
    R6(A256_DECL)
    if (lanes <= 8) {
        for (size_t k = 0; k < dim; k++) {
            __m256 q0 = _mm256_load_ps(qt + 16 * k);
            R6(A256_FMA1)
        }
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(a00, a10), _mm256_max_ps(a20, a30)),
                                 _mm256_max_ps(a40, a50));
        _mm256_store_ps(mx, _mm256_max_ps(_mm256_load_ps(mx), m));
        return;
    }
    for (size_t k0 = 0; k0 < dim; k0 += 16) {
        if (pf)
            for (size_t j = 0; j < 6; j++)
                _mm_prefetch(pf + (j * dim + k0) * 4, _MM_HINT_T0);
        size_t ke = k0 + 16 < dim ? k0 + 16 : dim;
        for (size_t k = k0; k < ke; k++) {
            __m256 q0 = _mm256_load_ps(qt + 16 * k), q1 = _mm256_load_ps(qt + 16 * k + 8);
            R6(A256_FMA2)
        }
    }
    __m256 m0 = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(a00, a10), _mm256_max_ps(a20, a30)),
                              _mm256_max_ps(a40, a50));
    __m256 m1 = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(a01, a11), _mm256_max_ps(a21, a31)),
                              _mm256_max_ps(a41, a51));
    _mm256_store_ps(mx, _mm256_max_ps(_mm256_load_ps(mx), m0));
    _mm256_store_ps(mx + 8, _mm256_max_ps(_mm256_load_ps(mx + 8), m1));
}

#define A256_ST1(j) _mm256_store_ps(out + 16 * j, a##j##0);
#define A256_ST2(j)                                                                                \
    _mm256_store_ps(out + 16 * j, a##j##0);                                                        \
    _mm256_store_ps(out + 16 * j + 8, a##j##1);

T256 static void tile256(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                         float *out)
{
    R6(A256_DECL)
    if (lanes <= 8) {
        for (size_t k = 0; k < dim; k++) {
            __m256 q0 = _mm256_load_ps(qt + 16 * k);
            R6(A256_FMA1)
        }
        R6(A256_ST1)
        return;
    }
    for (size_t k = 0; k < dim; k++) {
        __m256 q0 = _mm256_load_ps(qt + 16 * k), q1 = _mm256_load_ps(qt + 16 * k + 8);
        R6(A256_FMA2)
    }
    R6(A256_ST2)
}

#define A256_ARG1(j)                                                                               \
    {                                                                                              \
        __m256 g = _mm256_cmp_ps(a##j##0, b0, _CMP_GT_OQ);                                         \
        b0 = _mm256_blendv_ps(b0, a##j##0, g);                                                     \
        i0 = _mm256_blendv_ps(i0, _mm256_castsi256_ps(_mm256_set1_epi32(first + j)), g);           \
    }
#define A256_ARG2(j)                                                                               \
    {                                                                                              \
        __m256 g = _mm256_cmp_ps(a##j##1, b1, _CMP_GT_OQ);                                         \
        b1 = _mm256_blendv_ps(b1, a##j##1, g);                                                     \
        i1 = _mm256_blendv_ps(i1, _mm256_castsi256_ps(_mm256_set1_epi32(first + j)), g);           \
    }

/* The indices ride in float registers (blendv moves bits, whatever they mean). */
T256 static void argmax256(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                           int32_t first, float *best, int32_t *bidx)
{
    R6(A256_DECL)
    __m256 b0 = _mm256_load_ps(best), i0 = _mm256_load_ps((const float *)bidx);
    if (lanes <= 8) {
        for (size_t k = 0; k < dim; k++) {
            __m256 q0 = _mm256_load_ps(qt + 16 * k);
            R6(A256_FMA1)
        }
        R6(A256_ARG1)
        _mm256_store_ps(best, b0);
        _mm256_store_ps((float *)bidx, i0);
        return;
    }
    for (size_t k = 0; k < dim; k++) {
        __m256 q0 = _mm256_load_ps(qt + 16 * k), q1 = _mm256_load_ps(qt + 16 * k + 8);
        R6(A256_FMA2)
    }
    __m256 b1 = _mm256_load_ps(best + 8), i1 = _mm256_load_ps((const float *)bidx + 8);
    R6(A256_ARG1)
    R6(A256_ARG2)
    _mm256_store_ps(best, b0);
    _mm256_store_ps((float *)bidx, i0);
    _mm256_store_ps(best + 8, b1);
    _mm256_store_ps((float *)bidx + 8, i1);
}

#define A256_AFF1(j)                                                                               \
    m0 = _mm256_max_ps(m0, _mm256_mul_ps(_mm256_add_ps(a##j##0, _mm256_loadu_ps(add[j])),          \
                                         _mm256_set1_ps(scale[j])));
#define A256_AFF2(j)                                                                               \
    {                                                                                              \
        __m256 s = _mm256_set1_ps(scale[j]);                                                       \
        m0 = _mm256_max_ps(m0, _mm256_mul_ps(_mm256_add_ps(a##j##0, _mm256_loadu_ps(add[j])), s)); \
        m1 = _mm256_max_ps(m1,                                                                     \
                           _mm256_mul_ps(_mm256_add_ps(a##j##1, _mm256_loadu_ps(add[j] + 8)), s)); \
    }

T256 static void max_affine256(const float *qt, size_t dim, const float *const *rows,
                               unsigned lanes, float *mx, const float *const *add,
                               const float *scale)
{
    R6(A256_DECL)
    __m256 m0 = _mm256_load_ps(mx);
    if (lanes <= 8) {
        for (size_t k = 0; k < dim; k++) {
            __m256 q0 = _mm256_load_ps(qt + 16 * k);
            R6(A256_FMA1)
        }
        R6(A256_AFF1)
        _mm256_store_ps(mx, m0);
        return;
    }
    for (size_t k = 0; k < dim; k++) {
        __m256 q0 = _mm256_load_ps(qt + 16 * k), q1 = _mm256_load_ps(qt + 16 * k + 8);
        R6(A256_FMA2)
    }
    __m256 m1 = _mm256_load_ps(mx + 8);
    R6(A256_AFF2)
    _mm256_store_ps(mx, m0);
    _mm256_store_ps(mx + 8, m1);
}

T256 static void f16_256(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = kern_f16_to_f32(src[i]);
}

T256 static void bf16_256(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < n; i++)
        dst[i] = kern_bf16_to_f32(src[i]);
}

static const kern_mk mk_avx2 = {
    .name = "avx2",
    .P = 16,
    .J = 6,
    .max = max256,
    .max_affine = max_affine256,
    .tile = tile256,
    .argmax = argmax256,
    .f16 = f16_256,
    .bf16 = bf16_256,
};

#endif /* HAVE_X86 */

/* ---- selection ---------------------------------------------------------------------------- */

static const kern_mk *forced;

#ifdef HAVE_X86
/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know the
 * "f16c" feature name, and the ThreadSanitizer build (.ci/sanitizers) compiles with clang. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

int kern_cpu_has_isa(const char *name)
{
    if (!name)
        return 0;
    if (strcmp(name, "generic") == 0)
        return 1;
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") != 0;
#ifdef TARTAN_HAVE_AVX512BF16
    if (strcmp(name, "avx512bf16") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#endif
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               cpu_has_f16c();
#endif
    return 0;
}

static const kern_mk *by_name(const char *name)
{
#ifdef HAVE_X86
    if (strcmp(name, "avx512") == 0)
        return &mk_avx512;
#ifdef TARTAN_HAVE_AVX512BF16
    if (strcmp(name, "avx512bf16") == 0)
        return &mk_avx512bf16;
#endif
    if (strcmp(name, "avx2") == 0)
        return &mk_avx2;
#endif
    return &mk_generic;
}

const kern_mk *kern_mk_active(void)
{
    if (forced)
        return forced;
    /* Computed on every call: a handful of cached cpuid bits, cheaper than a racy static. */
    if (kern_cpu_has_isa("avx512bf16"))
        return by_name("avx512bf16");
    if (kern_cpu_has_isa("avx512"))
        return by_name("avx512");
    if (kern_cpu_has_isa("avx2"))
        return by_name("avx2");
    return &mk_generic;
}

int kern_cpu_force_isa(const char *name)
{
    if (!name) {
        forced = NULL;
        return KERN_OK;
    }
    if (strcmp(name, "avx512bf16") && strcmp(name, "avx512") && strcmp(name, "avx2") &&
        strcmp(name, "generic")) {
        kern_set_error("unknown CPU kernel variant '%s' (avx512bf16, avx512, avx2, generic)", name);
        return KERN_EINVAL;
    }
    if (!kern_cpu_has_isa(name)) {
        kern_set_error("this CPU cannot run the %s kernels", name);
        return KERN_ENODEV;
    }
    forced = by_name(name);
    return KERN_OK;
}

/* ---- packing and conversion ------------------------------------------------------------- */

void kern_to_f32(const kern_mk *mk, kern_dtype t, const void *src, float *dst, size_t n)
{
    if (t == KERN_F32)
        memcpy(dst, src, n * sizeof(float));
    else if (t == KERN_F16)
        mk->f16(src, dst, n);
    else if (t == KERN_BF16)
        mk->bf16(src, dst, n);
    else
        kern_e4m3_to_f32_n(src, dst, n);
}

void kern_pack_panels(const kern_mk *mk, kern_dtype t, const void *const *rows, size_t n,
                      size_t dim, float *out)
{
    size_t P = mk->P, np = kern_npanels(mk, n);
    float tmp[256];
    memset(out, 0, np * dim * P * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float *panel = out + (i / P) * dim * P;
        size_t lane = i % P;
        /* Convert in slices so that any dim works with a small stack buffer. */
        for (size_t k0 = 0; k0 < dim; k0 += 256) {
            size_t m = dim - k0 < 256 ? dim - k0 : 256;
            kern_to_f32(mk, t, (const char *)rows[i] + k0 * kern_dtype_size(t), tmp, m);
            for (size_t k = 0; k < m; k++)
                panel[(k0 + k) * P + lane] = tmp[k];
        }
    }
}

void kern_pack_panels_bf16(const kern_mk *mk, const void *const *rows, size_t n, size_t dim,
                           uint16_t *out)
{
    size_t P = mk->P, np = kern_npanels(mk, n);
    /* Panels keep the fp32 panels' stride (dim * P floats), so that offsets are shared. */
    memset(out, 0, np * dim * P * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        uint16_t *panel = out + (i / P) * dim * P * 2;
        const uint16_t *r = rows[i];
        size_t lane = i % P;
        for (size_t kk = 0; kk < dim / 2; kk++) {
            panel[(kk * P + lane) * 2] = r[2 * kk];
            panel[(kk * P + lane) * 2 + 1] = r[2 * kk + 1];
        }
    }
}
