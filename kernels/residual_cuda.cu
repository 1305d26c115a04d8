/*
 * residual_cuda.cu: PLAID scoring straight from the index's compressed form, on CUDA GPUs.
 *
 * kern_gpu_maxsim_residual: exact MaxSim of one query against PLAID documents given as codes +
 * packed residuals + inverse norms, with no decompressed vector ever written anywhere:
 *   <q_i, d_t> = (qc[i, code_t] + sum_j q_ij * w[bucket_tj]) * inv_norm_t.
 * The residual sum runs on the tensor cores (mma.sync m16n8k16, fp16 operands, fp32
 * accumulation): A is the query (fp16, in registers for the whole call), B the residual decoded
 * in registers through a 256-entry table in shared memory that turns one packed byte into its
 * 8 / nbits fp16 weights. The K dimension is permuted as in maxsim_cuda.cu: lane (g, t4) decodes
 * the dims [t4 * dim/4, (t4+1) * dim/4) of token g, which are its own contiguous packed bytes.
 * One query of <= 32 rows at nbits 2, dim 64 or 128 (PLAID's rerank of one query) takes its own
 * variant: A in shared memory (one copy a CTA), the residual decoded by byte permutes of the
 * four weights held in registers (no table: the L1's data pipe was the limit), 32-token steps
 * without a software pipeline, half steps at a document's end, the centroid term added after
 * the MMAs so that its gathers wait under them. Measured on the H200 (PLAID 2-bit, 1 query x
 * 10k ragged documents): the table's lookups and the A fragments' loads had the L1 data pipe 85%
 * busy; the byte-permute decode took the kernel from 131 to 115 us, 4 tiles a step without a
 * pipeline to 108 (L1 data pipe 73%), the late centroid term at 4 CTAs (128 registers) to 99. The permutes
 * are PTX `prmt`, not `__byte_perm` (whose definition masks each selector with 0x7777 first: 64
 * instructions a step), and a disabled term is a branch on the template flag, not `+ 0.0f`
 * (which the compiler may not drop: -0 + 0 is +0). Tried and kept only as variants: 16-byte q.C
 * loads of a permuted table (half the global wavefronts, yet 1-5% slower; not understood), the
 * document prefetched into L2 (no change), quarter steps at a document's end (~2% slower).
 * With A in registers the decode table is not the limit and the permute decode only adds
 * instructions (141 against 134 us), so the batched path (GPU search's exact stage) keeps the
 * table.
 * The centroid term qc[i, code] is gathered from a transposed copy [n_centroids, lq] so that a
 * token's lq scores are one contiguous run (4 sectors instead of 32).
 * Precision: the query and the bucket weights are rounded to fp16 (relative 2^-12) inside the
 * residual term only, which is small next to the centroid term; qc, norms, the max and the sum
 * stay fp32. Dims 320, 384, 512 and 768 keep A in shared memory instead of registers (RES_AW:
 * 8 registers a k step would not fit), fetched per k step; other shapes (dims not listed in
 * run_residual, or where the device lacks the shared memory) take an exact fp32 path.
 *
 * kern_gpu_centroid_interaction: PLAID stages 2 and 3, a gather-max over the same transposed
 * table; one warp per document, a lane per query row.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>
#include <utility>

#include "claim_cuda.cuh"
#include "cuda_check.cuh"
#include "frag_cuda.cuh"
#include "residual_axes_cuda.h"
#include "tune_cuda.h"

namespace
{

/* src [rows, cols] -> dst [cols, rows]. */
__global__ void transpose_kernel(const float *__restrict__ src, float *__restrict__ dst,
                                 long long rows, long long cols)
{
    __shared__ float tile[32][33];
    const long long c0 = (long long)blockIdx.x * 32, r0 = (long long)blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        long long r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols)
            tile[i][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        long long c = c0 + i, r = r0 + threadIdx.x;
        if (r < rows && c < cols)
            dst[c * rows + r] = tile[threadIdx.x][i];
    }
}

/* src [rows <= 32, cols] -> dst [cols, 32] with row r at 4 g + 2 mt + h where r = 16 mt + 8 h +
 * g: the four rows of one accumulator lane (g, g + 8, g + 16, g + 24) are one 16-byte run.
 * Rows past rows are 0. */
__global__ void transpose_perm32_kernel(const float *__restrict__ src, float *__restrict__ dst,
                                        int rows, long long cols)
{
    __shared__ float tile[32][33];
    const long long c0 = (long long)blockIdx.x * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        const long long c = c0 + threadIdx.x;
        tile[i][threadIdx.x] = i < rows && c < cols ? src[i * cols + c] : 0.f;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        const long long c = c0 + i;
        const int r = threadIdx.x, pos = 4 * (r & 7) + 2 * (r >> 4) + ((r >> 3) & 1);
        if (c < cols)
            dst[c * 32 + pos] = tile[r][i];
    }
}

int transpose_perm32(const float *src, float *dst, size_t rows, size_t cols)
{
    if ((cols + 31) / 32 > 0x7fffffffu || rows > 32) {
        kern_set_error("transpose (cuda): %zu x %zu table too large", rows, cols);
        return KERN_EINVAL;
    }
    transpose_perm32_kernel<<<(unsigned)((cols + 31) / 32), dim3(32, 8)>>>(src, dst, (int)rows,
                                                                           (long long)cols);
    KERN_CUDA_LAUNCHED("transpose_perm32_kernel");
    return KERN_OK;
}

int transpose(const float *src, float *dst, size_t rows, size_t cols)
{
    if ((cols + 31) / 32 > 0x7fffffffu || (rows + 31) / 32 > 65535) {
        kern_set_error("transpose (cuda): %zu x %zu table too large", rows, cols);
        return KERN_EINVAL;
    }
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32));
    transpose_kernel<<<grid, dim3(32, 8)>>>(src, dst, (long long)rows, (long long)cols);
    KERN_CUDA_LAUNCHED("transpose_kernel");
    return KERN_OK;
}

__device__ __forceinline__ uint32_t load_code(const void *codes, unsigned code_bytes, long long t)
{
    return code_bytes == 2 ? (uint32_t)__ldg(static_cast<const uint16_t *>(codes) + t)
                           : __ldg(static_cast<const uint32_t *>(codes) + t);
}

/* Byte i of a lane's packed residual words (i a compile-time constant after unrolling). */
template <int W> __device__ __forceinline__ uint32_t byte_at(const uint32_t (&w)[W], int i)
{
    return (w[i >> 2] >> (8 * (i & 3))) & 0xffu;
}

/* One query (q_off NULL): q [lq, dim], qcT [n_centroids, lq] (+ KERN_CUDA_ST_SLACK floats: the
 * fast kernel reads the 32 rows of a unit at fixed offsets, past lq too, and ignores those). Batched (q_off set): pair n is
 * query n / per_q (rows [q_off[qi], q_off[qi + 1]) of q, columns of qcT [n_centroids, ldq] at
 * the same offsets) against docs[cross ? n % per_q : n]. */
struct res_args {
    int dim, nbits, code_bytes, lq;
    const float *q;   /* [lq, dim] */
    const float *qcT; /* [n_centroids, ldq] */
    long long ldq;
    const int64_t *q_off;
    long long per_q;
    int cross;
    /* pair_q (NULL: none): pair n's query is pair_q[n] (kern_cuda_exact.pair_q), of nq_all
     * queries; per_q is then nd. A separate array, read in pair mode only: with the query in
     * the pair's document record (its fourth word) exhaustive search ran 6% slower (1M
     * documents, H200). */
    const uint32_t *pair_q;
    long long nq_all;
    const float *w;   /* [1 << nbits] */
    const kern_pdoc *docs;
    long long nd;
    float *scores;
    int claim; /* pairs claimed from the counters of claim_cuda.cuh, or a grid stride */
    int one;   /* the one-query kernel's variant (one_query), or -1 */
    /* Many queries (q_off), A fragments in registers: every query's fragments packed once
     * (pack_afrag_kernel), fragment (mt, kt) of 32-row unit u of query qi for lane l at
     * [((qi * af_units + u) * 2 + mt) * KT + kt] * 32 + l; NULL: a_frag from q. */
    const uint4 *af;
    int af_units;
};

/* The one-query kernel's options. RES_ALU: nbits-2 residuals decoded with byte permutes of the
 * four weights held in registers instead of a shared-memory table (the table's lookups and the
 * query fragments' shared-memory loads saturated the L1 data pipe: 85% busy, ncu). RES_PERM:
 * qcT is [n_centroids, 32] with the rows permuted by transpose_perm32, so that a token's four
 * q.C values of a lane are one 16-byte load instead of four 4-byte ones. */
constexpr int RES_ALU = 1, RES_PERM = 2, RES_SKIP = 4, RES_PF = 8, RES_LATEQ = 16, RES_SKIP8 = 32;

/* Bytes of (a, b) picked by the nibbles of s (PTX prmt's default mode: a nibble's top bit
 * asks for the byte's sign replicated; the selectors here never set it). __byte_perm would
 * mask every selector with 0x7777 first: one instruction more a lookup. */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s)
{
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
    return d;
}

/* A hint that the line of p will be read soon: fetched into L2, no register waits for it. */
__device__ __forceinline__ void prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p)));
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ void mma16816_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

constexpr int RES_WARPS = 4;

/* RES_AW: the query's A fragments in dynamic shared memory, fetched per k step, for dims past
 * 256: in registers they take 8 a k step (192 at dim 384: the loop would spill), and the
 * static AS copy is for one query only and past 48 KB at dim 768. With AS one copy for the
 * CTA; without, one a warp, of which each lane writes and reads only its own fragments (no
 * synchronisation), refilled where the registers would be. aw_smem: its bytes. */
constexpr int RES_AW = 64;
constexpr size_t aw_smem(int kt, bool as)
{
    return (size_t)(as ? 1 : RES_WARPS) * 2 * kt * 32 * 16;
}

/* The loads of RNG 8-token tiles of one document: each lane's packed residual words of token
 * tok0 + 8j + g, and the codes and inverse norms of tokens tok0 + 8j + 2 t4 (+1), the columns of
 * its accumulator fragment. Tokens past the end repeat the last one (masked in the max). */
template <int NB, int KT, int RNG> struct res_tile {
    static constexpr int BPT = KT * NB / 2, WPT = (BPT + 3) / 4;
    uint32_t wds[RNG][WPT];
    uint32_t cd[RNG][2];
    float nrm[RNG][2];
};

template <int NB, int KT, int RNG>
__device__ __forceinline__ void load_tile(res_tile<NB, KT, RNG> &t, const kern_pdoc &doc, int tok0,
                                          int rbytes, unsigned code_bytes, int g, int t4)
{
    constexpr int BPT = res_tile<NB, KT, RNG>::BPT, WPT = res_tile<NB, KT, RNG>::WPT;
    const int ntok = (int)doc.ntok;
    const bool al4 = ((uintptr_t)doc.residuals % 4 == 0) && (rbytes % 4 == 0) && (BPT % 4 == 0);
#pragma unroll
    for (int j = 0; j < RNG; j++) {
        const int tb = min(tok0 + 8 * j + g, ntok - 1);
        const uint8_t *rp = doc.residuals + (long long)tb * rbytes + t4 * BPT;
        if (al4) {
#pragma unroll
            for (int i = 0; i < WPT; i++)
                t.wds[j][i] = __ldg(reinterpret_cast<const uint32_t *>(rp) + i);
        } else {
#pragma unroll
            for (int i = 0; i < WPT; i++) {
                uint32_t w = 0;
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (i * 4 + e < BPT)
                        w |= (uint32_t)__ldg(rp + i * 4 + e) << (8 * e);
                t.wds[j][i] = w;
            }
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tc = min(tok0 + 8 * j + 2 * t4 + e, ntok - 1);
            t.cd[j][e] = load_code(doc.codes, code_bytes, tc);
            t.nrm[j][e] = __ldg(doc.inv_norms + tc);
        }
    }
}

/* The warp's next pair after n: with the claim counter, the next unclaimed one (pairs [0,
 * warps) are each warp's first, the rest are claimed in order), so that warps that drew short
 * documents take more of them; without, a grid stride. */
__device__ __forceinline__ long long advance(const res_args &a, long long n, long long warps,
                                             int lane)
{
    if (!a.claim)
        return n + warps;
    unsigned long long t = 0;
    if (lane == 0)
        t = kern_claim();
    return warps + (long long)__shfl_sync(0xffffffffu, t, 0);
}

/* From pair n on, the first pair whose document has tokens; the pairs skipped get the empty
 * score. */
__device__ __forceinline__ long long next_pair(const res_args &a, long long n, long long warps,
                                               int lane, kern_pdoc &doc)
{
    while (n < a.nd) {
        doc = a.docs[a.q_off && a.cross ? n % a.per_q : n];
        if (doc.ntok > 0)
            break;
        if (lane == 0)
            a.scores[n] = KERN_EMPTY_SCORE;
        n = advance(a, n, warps, lane);
    }
    return n;
}

/* The A fragment (k step kt, row tile mt) of a lane for the 32 query rows from r0 of q [lq,
 * dim], fp16 pairs: rows g and g + 8, dims t4 * dpl + 4 kt .. + 3 (rows past lq are 0). */
__device__ __forceinline__ uint4 a_frag(const float *qp, int lq, int dim, int r0, int mt, int kt,
                                        int g, int t4, bool alu = false)
{
    /* alu (RES_ALU's order): value e of k step kt is dim 16 (kt / 4) + 4 e + kt % 4 of the
     * lane's quarter, i.e. field kt % 4 of byte e of the lane's packed word kt / 4. */
    const int dj = alu ? t4 * (dim / 4) + 16 * (kt >> 2) + (kt & 3) : t4 * (dim / 4) + kt * 4;
    const int de = alu ? 4 : 1;
    float x[2][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + mt * 16 + g + 8 * h;
#pragma unroll
        for (int e = 0; e < 4; e++)
            x[h][e] = r < lq ? qp[(long long)r * dim + dj + de * e] : 0.f;
    }
    return make_uint4(pack_h2(x[0][0], x[0][1]), pack_h2(x[1][0], x[1][1]),
                      pack_h2(x[0][2], x[0][3]), pack_h2(x[1][2], x[1][3]));
}

/* RES_AW: a lane's A fragments (mt, kt) of the 32 query rows from r0 into its slots of s
 * ([(mt * KT + kt) * 32 + lane]), the same as a_frag's, from 16-byte loads where q is 16-byte
 * aligned (dim a multiple of 16 keeps every row and quarter so): a fragment's 4 values of a
 * row are one float4, or with RES_ALU's order component kt % 4 of the 4 float4 of 16 dims,
 * a quarter of a_frag's load instructions. The per-warp copy is refilled for every 32-row
 * unit of every document where a query has more than 32 rows. Unrolled in part: fully, all
 * its loads are issued at once and the kernels spill more (nbits 2, dim 512: 222 bytes
 * against 68). */
template <int KT, bool ALU>
__device__ __forceinline__ void fill_aw(uint4 *s, const float *qp, int lq, int dim, int r0, int g,
                                        int t4, int lane)
{
    if (((uintptr_t)qp & 15) != 0) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int kt = 0; kt < KT; kt++)
                s[(mt * KT + kt) * 32 + lane] = a_frag(qp, lq, dim, r0, mt, kt, g, t4, ALU);
        return;
    }
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        const float4 *row[2];
        bool ok[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = r0 + mt * 16 + g + 8 * h;
            ok[h] = r < lq;
            row[h] = reinterpret_cast<const float4 *>(qp + (long long)(ok[h] ? r : 0) * dim +
                                                      t4 * (dim / 4));
        }
        if (ALU) {
#pragma unroll 2
            for (int k4 = 0; k4 < KT / 4; k4++) {
                float v[2][4][4]; /* row h, float4 e (dims 16 k4 + 4 e ..), component */
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float4 f = ok[h] ? row[h][4 * k4 + e] : zero;
                        v[h][e][0] = f.x, v[h][e][1] = f.y, v[h][e][2] = f.z, v[h][e][3] = f.w;
                    }
#pragma unroll
                for (int c = 0; c < 4; c++)
                    s[(mt * KT + 4 * k4 + c) * 32 + lane] = make_uint4(
                        pack_h2(v[0][0][c], v[0][1][c]), pack_h2(v[1][0][c], v[1][1][c]),
                        pack_h2(v[0][2][c], v[0][3][c]), pack_h2(v[1][2][c], v[1][3][c]));
            }
        } else {
#pragma unroll 4
            for (int kt = 0; kt < KT; kt++) {
                const float4 f0 = ok[0] ? row[0][kt] : zero, f1 = ok[1] ? row[1][kt] : zero;
                s[(mt * KT + kt) * 32 + lane] =
                    make_uint4(pack_h2(f0.x, f0.y), pack_h2(f1.x, f1.y), pack_h2(f0.z, f0.w),
                               pack_h2(f1.z, f1.w));
            }
        }
    }
}

/*
 * NB: nbits; KT: k16 steps (dim / 16). Each lane owns dim/4 = 4*KT dims, i.e. BPT = KT*NB/2
 * packed bytes of each token. Persistent: warps walk the (query, document) pairs with a grid
 * stride. PIPE: software pipeline, the loads of the next RNG tiles (of this document, or of the
 * warp's next pair) are issued before the math of the current ones, so that a warp always has
 * a round trip to memory in flight; without it each step loads, waits, gathers, waits, then
 * computes. MINB: CTAs per SM the registers are fitted to. AS: one query of at most 32 rows
 * (q_off NULL, lq <= 32), its A fragments in shared memory, one copy for the CTA's warps,
 * instead of 64 registers a thread: room for more warps an SM. MODE & RES_AW (dims past 256):
 * the A fragments in dynamic shared memory (aw_smem bytes), for one query (AS) or any.
 */
template <int NB, int KT, int RNG, bool PIPE, int MINB, bool AS, int MODE>
__global__ void __launch_bounds__(RES_WARPS * 32, MINB) residual_mma_kernel(res_args a)
{
    constexpr bool ALU = (MODE & RES_ALU) != 0, PERM = (MODE & RES_PERM) != 0;
    constexpr bool SKIP = (MODE & RES_SKIP) != 0 && RNG >= 4;
    constexpr bool SKIP8 = (MODE & RES_SKIP8) != 0 && RNG == 4;
    constexpr bool PF = (MODE & RES_PF) != 0, LATEQ = (MODE & RES_LATEQ) != 0;
    constexpr bool AW = (MODE & RES_AW) != 0;
    constexpr bool AREG = !AS && !AW; /* A fragments in registers */
    static_assert(!ALU || (NB == 2 && KT % 4 == 0), "RES_ALU: nbits 2, whole words");
    static_assert(!PERM || AS, "RES_PERM: one query of <= 32 rows");
    using tile_t = res_tile<NB, KT, RNG>;
    constexpr int WPT = tile_t::WPT;
    constexpr int VPB = 8 / NB;        /* values per byte */
    constexpr int MT = 2;              /* 32 query rows per pass */
    /* Decode tables. nbits 1 and 2: a nibble (4 or 2 dims) -> its weights as fp16, one copy
     * of the 16 entries per lane so that a warp's 32 lookups of random nibbles hit 32 distinct
     * banks (a shared byte-keyed table costs several wavefronts per lookup in bank conflicts).
     * nbits 4 and 8: byte -> its VPB weights, one shared copy. */
    __shared__ __align__(16) __half s_lut[NB >= 4 ? 256 : 1][VPB];
    __shared__ __align__(16) uint32_t s_nib[NB == 1 ? 16 * 32 * 2 : 1];
    /* nbits 2: byte -> its 4 weights (b01, b23), one copy per lane of a half warp: entry
     * (v, l) at byte v * 128 + l * 8, so a warp's 32 lookups fill 2 wavefronts whatever the
     * bytes (lanes l and l + 16 share a column and are the second wavefront anyway). The
     * offset of a lookup is one shift and one mask-or of the packed word (32 KB a CTA). */
    __shared__ __align__(16) uint2 s_b2[NB == 2 && !ALU ? 256 * 16 : 1];
    /* AS: fragment (mt, kt) of lane l at [(mt * KT + kt) * 32 + l], one 16-byte load. */
    __shared__ __align__(16) uint4 s_af[AS && !AW ? MT * KT * 32 : 1];
    /* RES_AW: the same layout from s_a on: the CTA's copy (AS) or the warp's. */
    extern __shared__ __align__(16) uint4 s_dyn[];
    uint4 *const s_a = AW ? s_dyn + (AS ? 0 : (threadIdx.x >> 5) * (MT * KT * 32)) : s_af;
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const uint32_t lane16 = (uint32_t)(lane & 15);
    if (NB >= 4) {
        for (int v = threadIdx.x; v < 256; v += blockDim.x)
            for (int j = 0; j < VPB; j++) {
                int b = 0;
                for (int k = 0; k < NB; k++)
                    b |= ((v >> (7 - (j * NB + k))) & 1) << k;
                s_lut[v][j] = __float2half_rn(a.w[b]);
            }
    } else {
        /* Nibble bits from the most significant: nbits 2 -> dims (b3 | b2 << 1), (b1 | b0 << 1);
         * nbits 1 -> dims b3, b2, b1, b0. */
        if (NB == 2 && !ALU) {
            for (int i = threadIdx.x; i < 256 * 16; i += blockDim.x) {
                const int v = i / 16;
                int b[4];
                for (int d = 0; d < 4; d++)
                    b[d] = ((v >> (7 - 2 * d)) & 1) | (((v >> (6 - 2 * d)) & 1) << 1);
                s_b2[i] = make_uint2(pack_h2(a.w[b[0]], a.w[b[1]]), pack_h2(a.w[b[2]], a.w[b[3]]));
            }
        } else if (NB == 1) { /* (NB 2 with RES_ALU has no table) */
            for (int i = threadIdx.x; i < 16 * 32; i += blockDim.x) {
                const int v = i / 32, l = i % 32;
                reinterpret_cast<uint2 *>(s_nib)[v * 32 + l] =
                    make_uint2(pack_h2(a.w[(v >> 3) & 1], a.w[(v >> 2) & 1]),
                               pack_h2(a.w[(v >> 1) & 1], a.w[v & 1]));
            }
        }
    }
    if (AW && AS && threadIdx.x < 32)
        fill_aw<KT, ALU>(s_a, a.q, a.lq, a.dim, 0, g, t4, lane);
    else if (AS && threadIdx.x < 32)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kt = 0; kt < KT; kt++)
                s_af[(mt * KT + kt) * 32 + lane] = a_frag(a.q, a.lq, a.dim, 0, mt, kt, g, t4, ALU);
    __syncthreads();
    /* RES_ALU: the fp16 weights of the four 2-bit fields f (bucket = f with its two bits
     * swapped: the packing's first bit is the bucket's low one), low bytes in wlo, high bytes
     * in whi, byte f each; prmt(wlo, whi, s) with selector nibbles f, f + 4 picks one. */
    uint32_t wlo = 0, whi = 0;
    if (ALU)
#pragma unroll
        for (int f = 0; f < 4; f++) {
            const __half hv = __float2half_rn(a.w[((f & 1) << 1) | (f >> 1)]);
            const uint32_t u = *reinterpret_cast<const uint16_t *>(&hv);
            wlo |= (u & 0xffu) << (8 * f);
            whi |= (u >> 8) << (8 * f);
        }

    const int dim = a.dim;
    const int rbytes = dim * NB / 8;
    const long long warps = (long long)gridDim.x * RES_WARPS;
    uint32_t af[AREG ? MT : 1][AREG ? KT : 1][4];
    bool have_a = false; /* A fragments of unit 0 of query last_q already in registers */
    long long last_q = -1;

    kern_pdoc doc;
    long long n = next_pair(a, (long long)blockIdx.x * RES_WARPS + (threadIdx.x >> 5), warps,
                            lane, doc);
    tile_t cur;
    if (PIPE && n < a.nd)
        load_tile(cur, doc, 0, rbytes, a.code_bytes, g, t4);
    while (n < a.nd) {
        long long qi = 0;
        int lq = a.lq;
        const float *qp = a.q, *qcT = a.qcT;
        if (a.q_off) {
            qi = a.pair_q ? (long long)__ldg(a.pair_q + n) : n / a.per_q;
            const long long row0 = a.q_off[qi];
            lq = (int)(a.q_off[qi + 1] - row0);
            qp += row0 * dim;
            qcT += row0;
        }
        const uint32_t ldq4 = (uint32_t)a.ldq * 4u; /* bytes a centroid row (< 4 GiB) */
        const int units = (lq + 16 * MT - 1) / (16 * MT);
        const int ntok = (int)doc.ntok;
        long long n_next = a.nd;
        kern_pdoc doc_next = doc;
        float total = 0.f;
        bool advanced = false; /* the next pair found and its first tiles loaded */
        if (PF) {
            /* RES_PF: the document's tokens past the first step into L2 now, so that the later
             * steps' loads wait for L2 instead of DRAM (no registers held for them). */
            const int t0 = 8 * RNG;
            for (int t = t0 + lane; t < ntok; t += 32)
                prefetch_l2(doc.residuals + (long long)t * rbytes);
            const int cb = (int)a.code_bytes;
            for (int b = t0 * cb + 32 * lane; b < ntok * cb; b += 32 * 32)
                prefetch_l2(static_cast<const char *>(doc.codes) + b);
            for (int b = t0 * 4 + 32 * lane; b < ntok * 4; b += 32 * 32)
                prefetch_l2(reinterpret_cast<const char *>(doc.inv_norms) + b);
        }
        for (int u = 0; u < units; u++) {
            const int r0 = u * 16 * MT;
            if (!AS && (units > 1 || !have_a || qi != last_q)) {
                have_a = true;
                last_q = qi;
                if (AW) { /* the lane's own slots: no other lane reads them */
                    fill_aw<KT, ALU>(s_a, qp, lq, dim, r0, g, t4, lane);
                } else if (a.af) { /* packed: one 16-byte load a fragment, lanes contiguous */
                    const uint4 *pf = a.af + (qi * a.af_units + u) * (MT * KT * 32) + lane;
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int kt = 0; kt < KT; kt++) {
                            const uint4 f = __ldg(pf + (mt * KT + kt) * 32);
                            uint32_t(&d)[4] = af[AREG ? mt : 0][AREG ? kt : 0];
                            d[0] = f.x, d[1] = f.y, d[2] = f.z, d[3] = f.w;
                        }
                } else {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int kt = 0; kt < KT; kt++) {
                            const uint4 f = a_frag(qp, lq, dim, r0, mt, kt, g, t4, ALU);
                            uint32_t(&d)[4] = af[AREG ? mt : 0][AREG ? kt : 0];
                            d[0] = f.x, d[1] = f.y, d[2] = f.z, d[3] = f.w;
                        }
                }
            }
            float rmax[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                rmax[mt][0] = rmax[mt][1] = -INFINITY;
            const char *qbase = reinterpret_cast<const char *>(qcT + r0 + g);
            for (int tok0 = 0; tok0 < ntok; tok0 += 8 * RNG) {
                if (!PIPE)
                    load_tile(cur, doc, tok0, rbytes, a.code_bytes, g, t4);
                /* The step's work on its first NT tiles (RES_SKIP: half of them where the
                 * document ends within that half; the tiles past it would only repeat its last
                 * token). */
                tile_t nxt;
                auto step = [&](auto nt_c) {
                    constexpr int NT = decltype(nt_c)::value;
                    /* The q.C gathers of the current tiles (their codes are here): a token's row of
                     * the table at one multiply-add, its 4 query rows of this lane at fixed offsets
                     * from it. Rows past lq read the table's slack or other columns (never used).
                     */
                    float qv[RNG][MT][2][2];
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            if (PERM) { /* rows g, g + 8, g + 16, g + 24 at 4 g .. 4 g + 3 */
                                const float4 v =
                                    __ldg(reinterpret_cast<const float4 *>(
                                              qcT + (unsigned long long)cur.cd[j][e] * 32) +
                                          g);
                                qv[j][0][0][e] = v.x, qv[j][0][1][e] = v.y;
                                qv[j][1][0][e] = v.z, qv[j][1][1][e] = v.w;
                                continue;
                            }
                            const float *row = reinterpret_cast<const float *>(
                                qbase + (unsigned long long)cur.cd[j][e] * ldq4);
#pragma unroll
                            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                                for (int h = 0; h < 2; h++)
                                    qv[j][mt][h][e] = __ldg(row + mt * 16 + 8 * h);
                        }
                    /* ...then the next tiles' loads, all in flight during the math below. */
                    if (PIPE) {
                        if (tok0 + 8 * RNG < ntok) {
                            load_tile(nxt, doc, tok0 + 8 * RNG, rbytes, a.code_bytes, g, t4);
                        } else if (u + 1 < units) {
                            load_tile(nxt, doc, 0, rbytes, a.code_bytes, g, t4);
                        } else {
                            n_next =
                                next_pair(a, advance(a, n, warps, lane), warps, lane, doc_next);
                            advanced = true;
                            if (n_next < a.nd)
                                load_tile(nxt, doc_next, 0, rbytes, a.code_bytes, g, t4);
                        }
                    }
                    /* k steps outermost: the RNG * MT accumulators are independent, so
                     * consecutive MMAs never wait on each other. */
                    float acc[RNG][MT][4];
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int mt = 0; mt < MT; mt++)
#pragma unroll
                            for (int h = 0; h < 2;
                                 h++) { /* the centroid term: the MMAs add to it */
                                /* RES_LATEQ: from 0, the gathers added after the MMAs */
                                acc[j][mt][2 * h] = LATEQ ? 0.f : qv[j][mt][h][0];
                                acc[j][mt][2 * h + 1] = LATEQ ? 0.f : qv[j][mt][h][1];
                            }
                    /* RES_ALU: a word's 16 fields, field d of its 4 bytes as 4 selectors, each
                     * byte f | (f + 4) << 4: the low half picks bytes 0, 1, the high half 2, 3. */
                    uint32_t sel[RNG][4];
#pragma unroll
                    for (int kt = 0; kt < KT; kt++) {
                        if (ALU && (kt & 3) == 0)
#pragma unroll
                            for (int j = 0; j < NT; j++)
#pragma unroll
                                for (int d = 0; d < 4; d++)
                                    sel[j][d] =
                                        ((cur.wds[j][kt >> 2] >> (6 - 2 * d)) & 0x03030303u) *
                                            0x11u +
                                        0x40404040u;
                        uint32_t fa[MT][4];
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            if (AS || AW) {
                                const uint4 f = (AW ? s_a : s_af)[(mt * KT + kt) * 32 + lane];
                                fa[mt][0] = f.x, fa[mt][1] = f.y, fa[mt][2] = f.z, fa[mt][3] = f.w;
                            } else {
#pragma unroll
                                for (int e = 0; e < 4; e++)
                                    fa[mt][e] = af[AREG ? mt : 0][AREG ? kt : 0][e];
                            }
                        }
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            /* The 4 values of k step kt: dims t4*dpl + 4kt .. +3. */
                            uint32_t b01, b23;
                            if (ALU) {
                                b01 = prmt(wlo, whi, sel[j][kt & 3]);
                                b23 = prmt(wlo, whi, sel[j][kt & 3] >> 16);
                            } else if (NB == 1) {
                                const uint32_t v = byte_at<WPT>(cur.wds[j], kt / 2);
                                const uint32_t nib = (kt & 1) ? (v & 15u) : (v >> 4);
                                const uint2 l =
                                    reinterpret_cast<const uint2 *>(s_nib)[nib * 32 + lane];
                                b01 = l.x;
                                b23 = l.y;
                            } else if (NB == 2) {
                                /* byte kt of the lane's words, times 16, or the lane's column */
                                const uint32_t wv = cur.wds[j][kt >> 2];
                                const int sh = 8 * (kt & 3);
                                const uint32_t idx =
                                    ((sh >= 4 ? wv >> (sh - 4) : wv << (4 - sh)) & 0xff0u) | lane16;
                                const uint2 l = s_b2[idx];
                                b01 = l.x;
                                b23 = l.y;
                            } else if (NB == 4) {
                                b01 = *reinterpret_cast<const uint32_t *>(
                                    s_lut[byte_at<WPT>(cur.wds[j], 2 * kt)]);
                                b23 = *reinterpret_cast<const uint32_t *>(
                                    s_lut[byte_at<WPT>(cur.wds[j], 2 * kt + 1)]);
                            } else {
                                uint32_t h[4];
#pragma unroll
                                for (int e = 0; e < 4; e++)
                                    h[e] = *reinterpret_cast<const uint16_t *>(
                                        s_lut[byte_at<WPT>(cur.wds[j], 4 * kt + e)]);
                                b01 = h[0] | (h[1] << 16);
                                b23 = h[2] | (h[3] << 16);
                            }
#pragma unroll
                            for (int mt = 0; mt < MT; mt++)
                                mma16816_f16(acc[j][mt], fa[mt][0], fa[mt][1], fa[mt][2], fa[mt][3],
                                             b01, b23);
                        }
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        /* No mask: a column past the document's end is its last token again (the
                         * loads clamp), whose score is already in the max. */
#pragma unroll
                        for (int mt = 0; mt < MT; mt++)
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                float x0 = acc[j][mt][2 * h], x1 = acc[j][mt][2 * h + 1];
                                if (LATEQ)
                                    x0 += qv[j][mt][h][0], x1 += qv[j][mt][h][1];
                                const float s0 = x0 * cur.nrm[j][0];
                                const float s1 = x1 * cur.nrm[j][1];
                                rmax[mt][h] = fmaxf(rmax[mt][h], fmaxf(s0, s1));
                            }
                    }
                };
                const int rest = ntok - tok0;
                if (SKIP8 && rest <= 8)
                    step(std::integral_constant<int, 1>{});
                else if (SKIP8 && rest <= 24 && rest > 16)
                    step(std::integral_constant<int, 3>{});
                else if ((SKIP || SKIP8) && rest <= 4 * RNG)
                    step(std::integral_constant<int, RNG / 2>{});
                else
                    step(std::integral_constant<int, RNG>{});
                if (PIPE)
                    cur = nxt;
            }
            total += rows_max_sum<MT>(rmax, lane, [&](int r) { return r0 + r < lq; });
        }
        if (lane == 0)
            a.scores[n] = total;
        if (!advanced) { /* no pipeline, or a query without rows */
            n_next = next_pair(a, advance(a, n, warps, lane), warps, lane, doc_next);
            if (PIPE && n_next < a.nd)
                load_tile(cur, doc_next, 0, rbytes, a.code_bytes, g, t4);
        }
        n = n_next;
        doc = doc_next;
    }
    if (a.claim && lane == 0)
        kern_claims_done();
}

/* Exact fp32 path: one warp per document, a lane per token, the query row loop outside. */
__global__ void residual_simple_kernel(res_args a)
{
    const int lane = threadIdx.x & 31;
    const long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= a.nd)
        return;
    int lq = a.lq;
    const float *qp = a.q, *qcT = a.qcT;
    const kern_pdoc doc = a.docs[a.q_off && a.cross ? n % a.per_q : n];
    if (a.q_off) {
        const long long qi = a.pair_q ? (long long)a.pair_q[n] : n / a.per_q, row0 = a.q_off[qi];
        lq = (int)(a.q_off[qi + 1] - row0);
        qp += row0 * a.dim;
        qcT += row0;
    }
    const int ntok = (int)doc.ntok, dim = a.dim, nb = a.nbits;
    const int rbytes = dim * nb / 8;
    if (ntok == 0) {
        if (lane == 0)
            a.scores[n] = KERN_EMPTY_SCORE;
        return;
    }
    float total = 0.f;
    for (int i = 0; i < lq; i++) {
        float m = -INFINITY;
        for (int t = lane; t < ntok; t += 32) {
            const uint8_t *rp = doc.residuals + (long long)t * rbytes;
            float s = 0.f;
            for (int j = 0; j < dim; j++) {
                int b = 0;
                for (int k = 0; k < nb; k++) {
                    const int bit = j * nb + k;
                    b |= ((rp[bit >> 3] >> (7 - (bit & 7))) & 1) << k;
                }
                s = fmaf(qp[(long long)i * dim + j], a.w[b], s);
            }
            const uint32_t c = load_code(doc.codes, a.code_bytes, t);
            m = fmaxf(m, (qcT[(long long)c * a.ldq + i] + s) * doc.inv_norms[t]);
        }
        for (int o = 16; o > 0; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        total += m;
    }
    if (lane == 0)
        a.scores[n] = total;
}

bool afpack_on(void);

/* Every query's A fragments, packed as res_args.af lays them out: one thread a lane of a
 * fragment (mt, kt) of a 32-row unit u of query qi, from a_frag (the same values, so the
 * same scores). Units past a query's rows are zeros, as a_frag gives them. */
template <int KT, bool ALU>
__global__ void pack_afrag_kernel(const float *__restrict__ q, const int64_t *__restrict__ q_off,
                                  long long nq, int dim, int units, uint4 *__restrict__ out)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_q = (long long)units * 2 * KT * 32;
    if (i >= nq * per_q)
        return;
    const long long qi = i / per_q;
    const int r = (int)(i % per_q), lane = r & 31, kt = (r >> 5) % KT, mt = (r >> 5) / KT % 2;
    const int u = (r >> 5) / (2 * KT);
    const long long row0 = q_off[qi];
    const int lq = (int)(q_off[qi + 1] - row0);
    out[i] = a_frag(q + row0 * dim, lq, dim, 32 * u, mt, kt, lane >> 2, lane & 3, ALU);
}

template <int NB, int KT, int RNG, bool PIPE, int MINB, bool AS = false, int MODE = 0>
int launch_residual_k(const res_args &a)
{
    int blocks = 0, rc;
    constexpr size_t smem = (MODE & RES_AW) ? aw_smem(KT, AS) : 0;
    const void *k = (const void *)residual_mma_kernel<NB, KT, RNG, PIPE, MINB, AS, MODE>;
    if ((rc = kern_persistent_grid(k, RES_WARPS * 32, smem, (a.nd + RES_WARPS - 1) / RES_WARPS,
                                   &blocks)) != KERN_OK)
        return rc;
    res_args b = a;
    b.claim = kern_gpu_tune.residual_sched != 2;
    /* Many queries with A in registers: a warp reloads A whenever its next pair is another
     * query's, which in a search's exact rounds is nearly every pair (a round's pairs are a
     * few per warp, claimed in query order by all warps at once). From q that is 128 4-byte
     * loads a lane, each warp-wide load touching 32 sectors: at 1M documents (H200, ncu) the
     * kernel was bound by L1 wavefronts (86%, 77% of its sectors excessive) with the SMs 10%
     * busy. Packed once, a reload is 16 coalesced 16-byte loads. */
    uint4 *af = NULL;
    size_t af_bytes = 0;
    constexpr bool AREG = !AS && !(MODE & RES_AW);
    if (AREG && a.q_off && a.per_q > 0 && afpack_on()) {
        /* pairs are [nq, per_q], cross or not, or a list of nq_all queries' pairs */
        const long long nq = a.pair_q ? a.nq_all : a.nd / a.per_q;
        const int units = (a.lq + 31) / 32;
        const long long n = nq * units * 2 * KT * 32;
        af_bytes = (size_t)n * sizeof(uint4);
        if (n > 0 && (rc = kern_scratch((void **)&af, af_bytes)) != KERN_OK)
            return rc;
        if (n > 0) {
            pack_afrag_kernel<KT, (MODE & RES_ALU) != 0>
                <<<(unsigned)((n + 255) / 256), 256>>>(a.q, a.q_off, nq, a.dim, units, af);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess) {
                kern_scratch_free(af, af_bytes);
                return kern_cuda_fail(e, "launch of pack_afrag_kernel", __FILE__, __LINE__);
            }
            b.af = af;
            b.af_units = units;
        }
    }
    residual_mma_kernel<NB, KT, RNG, PIPE, MINB, AS, MODE><<<blocks, RES_WARPS * 32, smem>>>(b);
    cudaError_t e = cudaGetLastError();
    if (af)
        kern_scratch_free(af, af_bytes);
    if (e != cudaSuccess)
        return kern_cuda_fail(e, "launch of residual_mma_kernel", __FILE__, __LINE__);
    return KERN_OK;
}

/* The one-query variants, by kern_gpu_tune.residual_one (0: the default, 18; 1 is the general
 * kernel and never comes here): tiles a step, pipelined, CTAs an SM, A in shared memory, mode
 * bits. The bench names them plaid_o<N>_10k (bench/bench_kernels_gpu); 18 measured fastest of
 * all (98.8-102.0 us on the H200 against 100-132 for the others). */
struct one_variant {
    int rng;
    bool pipe;
    int minb;
    bool as;
    int mode;
};
constexpr int ONE_DEFAULT = 18;
constexpr one_variant ONE_VARIANTS[] = {
    {4, false, 4, true, RES_ALU | RES_SKIP | RES_LATEQ}, /* 0: as 18 */
    {4, false, 4, true, RES_ALU | RES_SKIP | RES_LATEQ}, /* 1: unused */
    {2, true, 4, true, RES_ALU},
    {2, true, 4, true, RES_PERM},
    {2, true, 4, true, RES_ALU | RES_PERM},
    {4, false, 4, true, RES_ALU | RES_PERM},
    {4, true, 4, true, RES_ALU | RES_PERM},
    {2, true, 5, true, RES_ALU | RES_PERM},
    {4, false, 4, true, RES_ALU},
    {4, true, 4, true, RES_ALU},
    {2, true, 5, true, RES_ALU},
    {4, false, 3, true, RES_ALU},
    {2, true, 3, false, RES_ALU},
    {4, false, 3, false, RES_ALU},
    {4, false, 4, true, RES_ALU | RES_SKIP},
    {4, false, 4, true, RES_ALU | RES_SKIP | RES_PF},
    {4, false, 3, true, RES_ALU | RES_SKIP | RES_PF | RES_LATEQ},
    {4, false, 3, true, RES_ALU | RES_SKIP | RES_LATEQ},
    {4, false, 4, true, RES_ALU | RES_SKIP | RES_LATEQ},
    {4, false, 3, true, RES_ALU | RES_SKIP8 | RES_LATEQ},
};
constexpr int ONE_COUNT = (int)(sizeof ONE_VARIANTS / sizeof ONE_VARIANTS[0]);

/* The residual kernel forced: kern_gpu_tune.residual_path, or where that is 0, 2 (the exact
 * kernel) with TARTAN_GPU_RESIDUAL=exact, so that a whole run of the tool (search, or
 * calibration) can be timed against it; 0: the automatic choice. */
int residual_path(void)
{
    if (kern_gpu_tune.residual_path)
        return kern_gpu_tune.residual_path;
    const char *e = getenv("TARTAN_GPU_RESIDUAL");
    return e && strcmp(e, "exact") == 0 ? 2 : 0;
}

/* Whether the many-query kernel reads packed A fragments (res_args.af):
 * kern_gpu_tune.residual_afpack, or where that is 0, not with TARTAN_GPU_RESIDUAL=unpacked (a
 * whole search timed against the former loads; the scores are the same bits). */
bool afpack_on(void)
{
    if (kern_gpu_tune.residual_afpack)
        return kern_gpu_tune.residual_afpack != 2;
    const char *e = getenv("TARTAN_GPU_RESIDUAL");
    return !(e && strcmp(e, "unpacked") == 0);
}

/* One query of <= 32 rows, nbits 2, dim 64 or 128, no variant of the general kernel asked for:
 * the variant of kern_gpu_tune.residual_one (0: the default), or -1 where this path does not
 * apply. kern_gpu_maxsim_residual lays out the q.C table by what this says. */
int one_query(bool batched, int lq, int dim, int nbits)
{
    const kern_gpu_tuning t = kern_gpu_tune;
    if (batched || lq > 32 || nbits != 2 || (dim != 64 && dim != 128) || t.residual_tiles ||
        t.residual_pipe || t.residual_ctas || t.residual_asmem || t.residual_one == 1 ||
        residual_path() == 2)
        return -1;
    return t.residual_one ? t.residual_one : ONE_DEFAULT;
}

template <int NB, int KT, int V> int launch_one_variant(const res_args &a)
{
    constexpr one_variant c = ONE_VARIANTS[V];
    return launch_residual_k<NB, KT, c.rng, c.pipe, c.minb, c.as, c.mode>(a);
}

template <int NB, int KT, int... V>
int launch_one_of(const res_args &a, int v, std::integer_sequence<int, V...>)
{
    using launcher = int (*)(const res_args &);
    static constexpr launcher table[] = {&launch_one_variant<NB, KT, V>...};
    return table[v](a);
}

template <int NB, int KT> int launch_residual_one(const res_args &a, int v)
{
    if constexpr (NB == 2 && KT % 4 == 0 && KT <= 8) {
        if (v >= 2 && v < ONE_COUNT)
            return launch_one_of<NB, KT>(a, v, std::make_integer_sequence<int, ONE_COUNT>{});
    }
    kern_set_error("maxsim_residual (cuda): no one-query kernel variant %d for nbits %d dim %d", v,
                   NB, 16 * KT);
    return KERN_EINVAL;
}

template <int NB, int KT> int launch_residual_kt(const res_args &a)
{
    if (a.one >= 0) /* the table is laid out for it */
        return launch_residual_one<NB, KT>(a, a.one);
    /* dim 256: 2 tiles, one CTA's worth of registers. Otherwise the default is 2 tiles in
     * flight per warp, pipelined, registers fitted to 3 CTAs (12 warps) per SM: measured the
     * fastest: at 4 CTAs the loop spilled 112-574 bytes, and past that the step is bound by
     * its own dependent chain (decode -> MMA -> max), so the pipeline gains 3-4% at most;
     * claiming (query, document) pairs from a counter balances ragged documents (-12% against a
     * grid stride on the 10k PLAID shape). The variants
     * (kern_gpu_tune, for benchmarks and tests) are no pipeline, 4 CTAs (128 registers, which
     * spills), and 4 tiles. */
    if (KT > 8)
        return launch_residual_k<NB, KT, 2, true, 1>(a);
    const kern_gpu_tuning t = kern_gpu_tune;
    const bool pipe = t.residual_pipe != 2;
    /* One query of up to 32 rows: A in shared memory, 4 CTAs an SM (5 by tune). */
    if (!a.q_off && a.lq <= 32 && t.residual_asmem != 2 && !t.residual_tiles && !t.residual_pipe &&
        (!t.residual_ctas || t.residual_ctas == 5))
        return t.residual_ctas == 5 ? launch_residual_k<NB, KT, 2, true, 5, true>(a)
                                    : launch_residual_k<NB, KT, 2, true, 4, true>(a);
    if (t.residual_tiles == 4)
        return pipe ? launch_residual_k<NB, KT, 4, true, 3>(a)
                    : launch_residual_k<NB, KT, 4, false, 3>(a);
    if (t.residual_ctas == 4)
        return pipe ? launch_residual_k<NB, KT, 2, true, 4>(a)
                    : launch_residual_k<NB, KT, 2, false, 4>(a);
    return pipe ? launch_residual_k<NB, KT, 2, true, 3>(a)
                : launch_residual_k<NB, KT, 2, false, 3>(a);
}

/* Dims past 256 (KT k steps): the A fragments in shared memory (RES_AW), one copy for the CTA
 * where there is one query of <= 32 rows (as: AS), else one a warp, 2 tiles a step. A copy a
 * warp limits the SM to 2 CTAs at dims 320 and 384 (80 and 96 KB a CTA) and to 1 at 512 and
 * 768 (sm_90's 228 KB), so registers are fitted to 2 (MINB 2, 255 registers; ptxas then
 * spills 0-108 bytes, against 400-1000 for the dim-256 kernel with A in registers); one copy
 * a CTA leaves registers the limit: fitted to 3 CTAs (168 registers, at most 24 bytes of
 * spills; at 4 CTAs, 128 registers, up to 264). The pipeline runs where the residual words
 * of both steps in flight take at most 48 registers (2 x 2 tiles x WPT): at nbits 8 past dim
 * 192 and nbits 4 past 384 they would crowd out the rest, so those wait for each step's
 * loads (the other warps and the long k loop hide part of it). nbits 2 decodes by
 * byte permutes (RES_ALU): no 32 KB table beside the fragments, and the table's lookups would
 * share the L1 data pipe with the fragments' loads (the one-query kernel's finding). The
 * centroid term comes after the MMAs (RES_LATEQ): their long chain hides its gathers. */
template <int NB, int KT> int launch_residual_big(const res_args &a, bool as)
{
    if constexpr (KT > 16) {
        constexpr int RNG = 2, WPT = res_tile<NB, KT, RNG>::WPT;
        constexpr bool PIPE = 2 * RNG * WPT <= 48;
        constexpr int MODE = RES_AW | RES_LATEQ | (NB == 2 ? RES_ALU : 0);
        return as ? launch_residual_k<NB, KT, RNG, PIPE, 3, true, MODE>(a)
                  : launch_residual_k<NB, KT, RNG, PIPE, 2, false, MODE>(a);
    }
    kern_set_error("maxsim_residual (cuda): no shared-memory query kernel for dim %d", 16 * KT);
    return KERN_EINVAL;
}

/* Whether the big-dim kernel (launch_residual_big) applies: its dims, and its shared memory
 * within the device's limit for a CTA (decode tables: 4 KB at most). A device that lacks it
 * (dim 768 needs 196 KB a CTA: sm_80 offers 163) takes the exact kernel. */
constexpr bool big_dim(int dim)
{
    return dim == 320 || dim == 384 || dim == 512 || dim == 768;
}

bool big_as(const res_args &r)
{
    return !r.q_off && r.lq <= 32 && kern_gpu_tune.residual_asmem != 2;
}

bool big_fits(const res_args &r)
{
    if (!big_dim(r.dim))
        return false;
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        cudaGetLastError(); /* the exact kernel then reports what is wrong with the device */
        return false;
    }
    return aw_smem(r.dim / 16, big_as(r)) + 4096 + 1024 <= (size_t)optin;
}

template <int NB> int launch_residual(const res_args &a)
{
    switch (a.dim / 16) {
    case 4:
        return launch_residual_kt<NB, 4>(a);
    case 6:
        return launch_residual_kt<NB, 6>(a);
    case 8:
        return launch_residual_kt<NB, 8>(a);
    case 20:
        return launch_residual_big<NB, 20>(a, big_as(a));
    case 24:
        return launch_residual_big<NB, 24>(a, big_as(a));
    case 32:
        return launch_residual_big<NB, 32>(a, big_as(a));
    case 48:
        return launch_residual_big<NB, 48>(a, big_as(a));
    default:
        return launch_residual_kt<NB, 16>(a);
    }
}

/* Runs r: the MMA kernel for the instantiated dims (with a query and a table whose row bytes
 * fit 32 bits), the exact fp32 kernel otherwise, or the one residual_path() forces (1: the
 * MMA kernel, or KERN_EINVAL where it has none for the shape; 2: the exact kernel). who names
 * the caller in errors. */
int run_residual(const res_args &r, const char *who)
{
    const int path = residual_path();
    const bool shape = r.lq > 0 && r.ldq < (1ll << 30);
    const bool fast = path != 2 && shape &&
                      (r.dim == 64 || r.dim == 96 || r.dim == 128 || r.dim == 256 || big_fits(r));
    if (path == 1 && !fast && r.lq > 0) {
        kern_set_error("%s (cuda): no MMA kernel for dim %d, nbits %d, %d query rows here", who,
                       r.dim, r.nbits, r.lq);
        return KERN_EINVAL;
    }
    if (fast) {
        switch (r.nbits) {
        case 1:
            return launch_residual<1>(r);
        case 2:
            return launch_residual<2>(r);
        case 4:
            return launch_residual<4>(r);
        default:
            return launch_residual<8>(r);
        }
    }
    const long long blocks = (r.nd + 3) / 4;
    if (blocks > 0x7fffffffLL) {
        kern_set_error("%s (cuda): too many documents", who);
        return KERN_EINVAL;
    }
    residual_simple_kernel<<<(unsigned)blocks, 128>>>(r);
    KERN_CUDA_LAUNCHED("residual_simple_kernel");
    return KERN_OK;
}

/* Centroid interaction: a warp per document, lanes over query rows. */
__global__ void interaction_kernel(const float *__restrict__ ST, int lq, unsigned code_bytes,
                                   const kern_pdoc *__restrict__ docs, long long nd,
                                   const uint8_t *__restrict__ keep, float *__restrict__ approx)
{
    const int lane = threadIdx.x & 31;
    const long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= nd)
        return;
    const kern_pdoc doc = docs[n];
    const int ntok = (int)doc.ntok;
    float total = 0.f;
    int any = 0;
    for (int r0 = 0; r0 < lq || (r0 == 0 && lq == 0); r0 += 32) {
        const int r = min(r0 + lane, lq > 0 ? lq - 1 : 0);
        float m = -INFINITY;
        for (int t0 = 0; t0 < ntok; t0 += 32) {
            /* Lanes fetch 32 codes at once; then each token's code is broadcast. */
            const int t = t0 + lane;
            uint32_t c = t < ntok ? load_code(doc.codes, code_bytes, t) : 0;
            int kept = t < ntok && (!keep || keep[c]);
            const unsigned mask = __ballot_sync(0xffffffffu, kept);
            any |= mask != 0;
            unsigned left = mask;
            while (left) {
                const int j = __ffs(left) - 1;
                left &= left - 1;
                const uint32_t cj = __shfl_sync(0xffffffffu, c, j);
                if (lq > 0)
                    m = fmaxf(m, __ldg(ST + (long long)cj * lq + r));
            }
        }
        if (r0 + lane < lq)
            total += m;
        if (lq == 0)
            break;
    }
    for (int o = 16; o > 0; o >>= 1)
        total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0)
        approx[n] = any ? total : KERN_EMPTY_SCORE;
}

} // namespace

extern "C" int kern_gpu_maxsim_residual(const kern_residual *a, float *scores)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    if (a->lq > 0x7fffffff || a->dim > 0x7fffffff || a->n_centroids > 0xffffffffu) {
        kern_set_error("maxsim_residual (cuda): sizes beyond 2^31");
        return KERN_EINVAL;
    }
    float *qcT = NULL;
    int rc;
    /* One query of <= 32 rows on the one-query kernel: a [n_centroids, 32] table (not for the
     * axes code, whose kernel reads the plain transpose). */
    const int one_v =
        a->lq == 0 || a->axes_dec ? -1 : one_query(false, (int)a->lq, (int)a->dim, (int)a->nbits);
    const bool perm = one_v >= 0 && one_v < ONE_COUNT && (ONE_VARIANTS[one_v].mode & RES_PERM);
    const size_t ldq = perm ? 32 : a->lq;
    /* The transposed table with the slack the fast kernel reads past its last row. */
    const size_t qc_bytes = (a->n_centroids * (ldq ? ldq : 1) + KERN_CUDA_ST_SLACK) * sizeof(float);
    if ((rc = kern_scratch((void **)&qcT, qc_bytes)) != KERN_OK)
        return rc;
    if (a->lq > 0 && (rc = perm ? transpose_perm32(a->qc, qcT, a->lq, a->n_centroids)
                                : transpose(a->qc, qcT, a->lq, a->n_centroids)) != KERN_OK)
        goto out;
    if (a->axes_dec) {
        kern_axes_job j;
        j.dim = (int)a->dim;
        j.code_bytes = (int)a->code_bytes;
        j.lq = (int)a->lq;
        j.q = a->q;
        j.qcT = qcT;
        j.ldq = (long long)ldq;
        j.q_off = NULL;
        j.per_q = (long long)a->nd;
        j.cross = 0;
        j.pair_q = NULL;
        j.nq_all = 1;
        j.dec = a->axes_dec;
        for (int i = 0; i < 4; i++)
            j.bytes[i] = a->axes_bytes[i];
        j.additive = a->axes_additive;
        j.docs = a->docs;
        j.nd = (long long)a->nd;
        j.scores = scores;
        j.path = residual_path();
        rc = kern_gpu_residual_axes(&j, "maxsim_residual");
        goto out;
    }
    {
        res_args r;
        r.dim = (int)a->dim;
        r.nbits = (int)a->nbits;
        r.code_bytes = (int)a->code_bytes;
        r.lq = (int)a->lq;
        r.q = a->q;
        r.qcT = qcT;
        r.ldq = (long long)ldq;
        r.q_off = NULL;
        r.per_q = (long long)a->nd;
        r.cross = 0;
        r.pair_q = NULL;
        r.nq_all = 1;
        r.w = a->bucket_weights;
        r.docs = a->docs;
        r.nd = (long long)a->nd;
        r.scores = scores;
        r.claim = 0; /* set at launch */
        r.one = one_v;
        r.af = NULL;
        r.af_units = 0;
        rc = run_residual(r, "maxsim_residual");
    }
out:
    kern_scratch_free(qcT, qc_bytes);
    return rc;
}

extern "C" int kern_gpu_centroid_interaction(const float *S, size_t lq, size_t n_centroids,
                                             unsigned code_bytes, const kern_pdoc *docs, size_t nd,
                                             const uint8_t *keep, float *approx)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    if (lq > 0x7fffffff || (nd + 3) / 4 > 0x7fffffffu) {
        kern_set_error("centroid_interaction (cuda): sizes beyond one launch");
        return KERN_EINVAL;
    }
    float *ST = NULL;
    int rc;
    const size_t st_bytes = (n_centroids ? n_centroids : 1) * (lq ? lq : 1) * sizeof(float);
    if ((rc = kern_scratch((void **)&ST, st_bytes)) != KERN_OK)
        return rc;
    if (lq > 0 && n_centroids > 0 && (rc = transpose(S, ST, lq, n_centroids)) != KERN_OK)
        goto out;
    interaction_kernel<<<(unsigned)((nd + 3) / 4), 128>>>(ST, (int)lq, code_bytes, docs,
                                                          (long long)nd, keep, approx);
    {
        cudaError_t e = cudaGetLastError();
        rc = e == cudaSuccess
                 ? KERN_OK
                 : kern_cuda_fail(e, "launch of interaction_kernel", __FILE__, __LINE__);
    }
out:
    kern_scratch_free(ST, st_bytes);
    return rc;
}

namespace
{

/* Pair documents as kernel documents: pointers into the resident arrays (KERN_NO_DOC: an
 * empty document, which scores KERN_EMPTY_SCORE and is never selected). */
__global__ void make_pdocs_kernel(const uint32_t *__restrict__ docs, long long n,
                                  const int64_t *__restrict__ doc_off,
                                  const uint32_t *__restrict__ codes,
                                  const uint8_t *__restrict__ residuals,
                                  const float *__restrict__ inv_norms, long long rbytes,
                                  kern_pdoc *__restrict__ out)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const uint32_t d = docs[i];
    kern_pdoc p;
    if (d == KERN_NO_DOC) {
        p.codes = codes;
        p.residuals = residuals;
        p.inv_norms = inv_norms;
        p.ntok = 0;
    } else {
        const long long o = doc_off[d];
        p.codes = codes + o;
        p.residuals = residuals + o * rbytes;
        p.inv_norms = inv_norms + o;
        p.ntok = (uint32_t)(doc_off[d + 1] - o);
    }
    out[i] = p;
}

} // namespace

extern "C" int kern_cuda_exact_scores(const kern_cuda_exact *a, float *scores)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    const bool axes = a && a->axes_dec;
    if (!a || !scores || !a->q || !a->q_off || !a->h_q_off || !a->ST || !a->doc_off || !a->codes ||
        !a->residuals || !a->inv_norms || !a->docs || (!axes && !a->bucket_weights) ||
        a->dim == 0 || a->dim > 0x7fffffff ||
        (!axes && ((a->nbits != 1 && a->nbits != 2 && a->nbits != 4 && a->nbits != 8) ||
                   (a->dim * a->nbits) % 8 != 0)) ||
        (a->pair_q && (a->cross || a->nq == 0))) {
        kern_set_error("exact_scores (cuda): NULL argument, bad dim / nbits, or a pair list "
                       "with cross or no queries");
        return KERN_EINVAL;
    }
    /* The axes code's token bytes, and the dims they decode to (at most dim). */
    size_t axes_rbytes = 0;
    if (axes) {
        const unsigned *b = a->axes_bytes;
        axes_rbytes = (size_t)b[0] + b[1] + b[2] + b[3];
        if ((size_t)b[0] + 2 * (size_t)b[1] + 4 * (size_t)b[2] + 8 * (size_t)b[3] > a->dim) {
            kern_set_error("exact_scores (cuda): the axes code's bytes decode to more dims than "
                           "dim");
            return KERN_EINVAL;
        }
    }
    const long long pairs = (long long)(a->pair_q ? a->per_q : a->nq * a->per_q);
    if (pairs == 0)
        return KERN_OK;
    const long long npd = a->cross ? (long long)a->per_q : pairs;
    kern_pdoc *pd = NULL;
    int rc = kern_scratch((void **)&pd, (size_t)npd * sizeof *pd);
    if (rc != KERN_OK)
        return rc;
    make_pdocs_kernel<<<(unsigned)((npd + 255) / 256), 256>>>(
        a->docs, npd, a->doc_off, a->codes, a->residuals, a->inv_norms,
        (long long)(axes ? axes_rbytes : a->dim * a->nbits / 8), pd);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        rc = kern_cuda_fail(e, "launch of make_pdocs_kernel", __FILE__, __LINE__);
        goto out;
    }
    {
        int lq_max = 0;
        for (size_t q = 0; q < a->nq; q++) {
            const int64_t l = a->h_q_off[q + 1] - a->h_q_off[q];
            lq_max = l > lq_max ? (int)l : lq_max;
        }
        if (axes) {
            kern_axes_job j;
            j.dim = (int)a->dim;
            j.code_bytes = 4;
            j.lq = lq_max;
            j.q = a->q;
            j.qcT = a->ST;
            j.ldq = (long long)a->ld;
            j.q_off = a->q_off;
            j.per_q = (long long)a->per_q;
            j.cross = a->cross;
            j.pair_q = a->pair_q;
            j.nq_all = (long long)a->nq;
            j.dec = a->axes_dec;
            for (int i = 0; i < 4; i++)
                j.bytes[i] = a->axes_bytes[i];
            j.additive = a->axes_additive;
            j.docs = pd;
            j.nd = pairs;
            j.scores = scores;
            j.path = residual_path();
            rc = kern_gpu_residual_axes(&j, "exact_scores");
            goto out;
        }
        res_args r;
        r.dim = (int)a->dim;
        r.nbits = (int)a->nbits;
        r.code_bytes = 4;
        r.lq = lq_max;
        r.q = a->q;
        r.qcT = a->ST;
        r.ldq = (long long)a->ld;
        r.q_off = a->q_off;
        r.per_q = (long long)a->per_q;
        r.cross = a->cross;
        r.pair_q = a->pair_q;
        r.nq_all = (long long)a->nq;
        r.w = a->bucket_weights;
        r.docs = pd;
        r.nd = pairs;
        r.scores = scores;
        r.claim = 0; /* set at launch */
        r.one = -1;
        r.af = NULL;
        r.af_units = 0;
        rc = run_residual(r, "exact_scores");
    }
out:
    kern_scratch_free(pd, (size_t)npd * sizeof *pd);
    return rc;
}
