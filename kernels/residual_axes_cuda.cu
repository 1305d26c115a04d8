/*
 * residual_axes_cuda.cu: residual-fused MaxSim on the axes code (index/axes.h), on CUDA GPUs.
 *
 * The scalar kernels (residual_cuda.cu) decode in registers: lane (g, t4) of an MMA owns the
 * dims [t4 dim/4, (t4 + 1) dim/4) of token g, which are its own packed bytes, all of one width.
 * The axes code packs axes of four widths at byte positions chosen per index (kernels.h,
 * kern_residual.axes_dec), each position with its own table (fp16 in shared memory here: 256
 * x dims coded entries, 64 KB at dim 128). The MMAs (mma.sync m16n8k16, fp32 accumulation)
 * take the dims in a column order of their own, in which every byte's values are one aligned
 * run: the 1-bit axes first (8 values), then the 2-bit (4 values), the 4-bit (2) and the
 * 8-bit, then the dims without bits (0). The A fragments are packed once a call in that order
 * (dim_of). Within k step kt, lane t4 feeds the 4 columns 16 kt + 4 t4 .. + 3 (a run): half
 * of a 1-bit byte, a whole 2-bit byte or two 4-bit bytes, whose values are one 8-byte or two
 * 4-byte loads from their tables; only where widths meet, and for 8-bit axes, a run is read
 * column by column. The residual term is at the scalar GPU path's precision (query and levels
 * rounded to fp16 in it only; q.C, norms, max and sum in fp32).
 *
 * Three kernels. The per-warp kernel (residual_axes_mma_kernel: lists of pairs, one query, and
 * what the others do not take) has each lane decode its own runs straight into its B
 * registers (run_frag, through run words made once a call on the host, make_runs). The cross
 * kernel (crossed pairs of 4 queries or more, exhaustive search's batches) has a CTA decode
 * each document once for the W queries of its warps, a step of 16 tokens a warp into a tile in
 * shared memory (swizzled so that a half warp's loads fall in distinct banks), from which each
 * warp's MMAs read their B fragments. One query of 32 rows or fewer keeps its A fragments in
 * shared memory, one copy a CTA (AS): the 64 registers they took a lane fit 8 warps a CTA in
 * 128 registers instead of 6 in 168. A few hundred pairs of one such query (the default
 * search's exact rounds, a query at a time) take the split kernel (residual_axes_split_kernel):
 * a CTA a pair, its warps over the document's steps, so that a round costs about one step's
 * latency, not a document's. H200, 100k documents of model 3, one query a call: p50 0.73-0.75
 * ms against 0.92-1.06 on the per-warp kernel (the scalar code: 0.70), its exact stage
 * 0.57 against 0.85-0.89 ms (bench/results/axes-gpu-2026-11-29/s45/call7/).
 *
 * Shapes without these kernels (dims other than 64, 96 and 128, or a device whose shared memory
 * cannot hold the tables) take the bit-plane kernels where the tables are additive in the bits
 * (below: any dim, no tables; H200, d 384: 268 us for one query x 10k documents against 17.3 ms
 * on the fp32 kernel), else an exact fp32 kernel: a warp a pair, a lane a token, the tables
 * read from global memory as they are.
 *
 * Cost, H200 (bench codes10k_*: 10k documents of 50-90 tokens, cross pairs, Lq 32, dim 128,
 * K 8,192, 32 bytes a token either way; medians of 11 calls, 2026-11-29; "axes": 8 byte
 * positions of each width, "axesm3": model 3's fitted layout, 28 / 48 / 48 axes at 4 / 2 / 1
 * bits; two runs each):
 *   queries                  axes          axesm3        scalar 2-bit
 *   1 (per-warp, AS)         112-120 us    104-111 us    63 us
 *   8 (cross)                471           487           335
 *   8 (per-warp, no cross)   828-851       766-781
 *   64 (cross)               3,111         3,229         2,456
 * The per-warp kernel decoded into a tile a warp before (as the cross kernel does): 127-131,
 * 132-137, 897-916 and 1,000-1,018 us in the same runs. Floors (790 TFLOP/s for the MMAs at
 * dim 128, 4.3 TB/s for each input read once): 7 us for one query, 58 for 8, 465 for 64, all
 * MMA-bound; the kernels sit far above them, bound by the latency of the decode and of the
 * q.C gathers at 12 to 16 warps an SM (at 64 queries the gathers alone move 5.7 GB from L2:
 * ncu, cross kernel, L1 65% busy, issue 38%). The decode is the price against the scalar code:
 * a run is a lookup in its position's table of 256 random entries, bank conflicts the scalar
 * kernel avoids with a copy of its one small table per lane, which 64 KB of tables cannot have.
 * Tried and dropped: the tile kernel with its loads (words, codes, then q.C) a step ahead
 * (142.7 against 143.5 us for one query); 10 warps a CTA with A in shared memory (126 against
 * 120 us; 96 registers, spills); the register kernel prefetching the next step's rows, codes
 * and norms into L1 (prefetch.global.L1: 104-116 us without, 110-120 with).
 * Not tried: tables by nibble (16 entries of 4 values for a 1- or 2-bit position: the codec's
 * tables factor so, but kernels.h's contract and the tests' random tables do not).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "claim_cuda.cuh"
#include "cuda_check.cuh"
#include "frag_cuda.cuh"
#include "residual_axes_cuda.h"

namespace
{

/* Warps a CTA (the tables are loaded once for all of them), 2 CTAs an SM: 6 warps fit the loop
 * in 168 registers (92 bytes of spills at dim 128; 8 warps at 128 registers spill 292, 4 at
 * 206 none). H200, 10k documents of 70 tokens, Lq 32, dim 128, the tile kernel before: 137 us
 * at 6 warps, 149 at 8, 153 at 4 (one query); 843, 843 and 984 us (8 queries). */
constexpr int AX_WARPS = 6;
/* Warps a CTA with one query's A fragments in shared memory (AS): 8 fit in 127 registers at
 * dim 128, 16 an SM. One query, codes10k, the tile kernel before: 120 us at 8, 126 at 10 (96
 * registers, 156 bytes of spills), 136 for the 6 warps with A in registers. */
constexpr int AXS_WARPS = 8;
constexpr int AX_TOK = 16; /* tokens a step: two n8 tiles, independent MMA chains */
/* Pairs up to which one query's pairs take the split kernel (residual_axes_split_kernel). */
constexpr long long AXP_SPLIT_PAIRS = 512;
/* Halves a tile row: dim rounded up to 64, so that rows start in bank 0 (swz). */
__host__ __device__ constexpr int ax_row(int dim)
{
    return (dim + 63) / 64 * 64;
}

/* The code's layout, derived once a call on the host. Byte positions [0, p1) hold 8-bit axes,
 * [p1, p2) 4-bit, [p2, p3) 2-bit, [p3, rbytes) 1-bit; the axes of the 4-, 2- and 1-bit
 * positions start at dims d1, d2, d3; coded dims in all. Tile columns: 1-bit values from 0,
 * 2-bit from c2, 4-bit from c1, 8-bit from c0, uncoded dims from coded. */
struct ax_layout {
    int rbytes, coded;
    int p1, p2, p3;
    int d1, d2, d3;
    int c2, c1, c0;
};

ax_layout make_layout(const unsigned b[4])
{
    ax_layout L;
    L.p1 = (int)b[0];
    L.p2 = L.p1 + (int)b[1];
    L.p3 = L.p2 + (int)b[2];
    L.rbytes = L.p3 + (int)b[3];
    L.d1 = (int)b[0];
    L.d2 = L.d1 + 2 * (int)b[1];
    L.d3 = L.d2 + 4 * (int)b[2];
    L.coded = L.d3 + 8 * (int)b[3];
    L.c2 = 8 * (int)b[3];
    L.c1 = L.c2 + 4 * (int)b[2];
    L.c0 = L.c1 + 2 * (int)b[1];
    return L;
}

/* The register decode's descriptors (residual_axes_mma_kernel, REG): run r = 4 kt + t4 is the
 * four tile columns 16 kt + 4 t4 .. + 3 that lane t4 of every row group feeds the MMA of k step
 * kt. A run's word: kind (bits 0-2), byte position p (bits 3-9), table offset in halves (bits
 * 10-25). Kinds: RUN_ZERO, columns without bits; RUN_ONE, half of a 1-bit byte, 4 halves at
 * off + 8 v; RUN_TWO, a 2-bit byte, 4 halves at off + 4 v; RUN_FOUR, the 4-bit bytes p and
 * p + 1, 2 halves at off + 2 v and at off + 512 + 2 v'; RUN_COLS, a run across widths (at most
 * the two where the 4-bit, 8-bit and uncoded columns meet, and every 8-bit run), column by
 * column through cols. A column's word: shift (log2 of its byte's values, bits 0-1), no bits
 * (bit 2), p (bits 3-9), offset (bits 10-25): the half at off + (v << shift). */
enum { RUN_ZERO, RUN_ONE, RUN_TWO, RUN_FOUR, RUN_COLS };
constexpr int AX_MAX_DIM = 128; /* the MMA kernels' widest dim */

struct ax_args {
    kern_axes_job j;
    ax_layout L;
    const uint4 *af;   /* packed A fragments (pack_axes_afrag_kernel, pack_bits_afrag_kernel) */
    const float *crow; /* bits: each query row's constant term (pack_bits_afrag_kernel) */
    int af_units;
    int ahead; /* the cross kernel reads a document ahead (TARTAN_GPU_AXES_AHEAD=0: not) */
    uint32_t runs[AX_MAX_DIM / 4], cols[AX_MAX_DIM];
};

/* Tile column c's word (the runs' comment): its byte, that byte's first axis and c's place in
 * it, in the column order of dim_of. */
uint32_t col_word(const ax_layout &L, int c)
{
    int p, first, i, sh;
    if (c < L.c2) {
        p = L.p3 + c / 8, first = L.d3 + c / 8 * 8, i = c % 8, sh = 3;
    } else if (c < L.c1) {
        p = L.p2 + (c - L.c2) / 4, first = L.d2 + (c - L.c2) / 4 * 4, i = (c - L.c2) % 4, sh = 2;
    } else if (c < L.c0) {
        p = L.p1 + (c - L.c1) / 2, first = L.d1 + (c - L.c1) / 2 * 2, i = (c - L.c1) % 2, sh = 1;
    } else if (c < L.coded) {
        p = c - L.c0, first = c - L.c0, i = 0, sh = 0;
    } else {
        return 4u;
    }
    return (uint32_t)sh | (uint32_t)p << 3 | (uint32_t)(256 * first + i) << 10;
}

/* a's runs and columns for dim (at most AX_MAX_DIM; the layout's bytes at most 128). */
void make_runs(ax_args &a, int dim)
{
    const ax_layout &L = a.L;
    for (int c = 0; c < dim; c++)
        a.cols[c] = col_word(L, c);
    for (int r = 0; r < dim / 4; r++) {
        const int c = 4 * r;
        const uint32_t w = a.cols[c];
        uint32_t kind = RUN_COLS, off = w >> 10;
        if (c >= L.coded)
            kind = RUN_ZERO;
        else if (c + 4 <= L.c2)
            kind = RUN_ONE;
        else if (c >= L.c2 && c + 4 <= L.c1)
            kind = RUN_TWO;
        else if (c >= L.c1 && c + 4 <= L.c0)
            kind = RUN_FOUR;
        a.runs[r] = kind | (w & (127u << 3)) | off << 10;
    }
}

/* The dim held by tile column c. */
__device__ __forceinline__ int dim_of(const ax_layout &L, int c)
{
    if (c < L.c2)
        return L.d3 + c;
    if (c < L.c1)
        return L.d2 + (c - L.c2);
    if (c < L.c0)
        return L.d1 + (c - L.c1);
    if (c < L.coded)
        return c - L.c0;
    return c;
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint4 &a, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t load_code(const void *codes, int code_bytes, long long t)
{
    return code_bytes == 2 ? (uint32_t)__ldg(static_cast<const uint16_t *>(codes) + t)
                           : __ldg(static_cast<const uint32_t *>(codes) + t);
}

/* Pair n's document, and its query: rows, first row and the number of rows. */
__device__ __forceinline__ kern_pdoc pair_doc(const kern_axes_job &j, long long n)
{
    return j.docs[j.q_off && j.cross ? n % j.per_q : n];
}

/* Query qi's first row (row0) and number of rows (q_off NULL: the one query, lq rows). */
__device__ __forceinline__ int query_rows(const kern_axes_job &j, long long qi, long long &row0)
{
    if (!j.q_off) {
        row0 = 0;
        return j.lq;
    }
    row0 = j.q_off[qi];
    return (int)(j.q_off[qi + 1] - row0);
}

__device__ __forceinline__ long long pair_query(const kern_axes_job &j, long long n,
                                                long long &row0, int &lq)
{
    if (!j.q_off) {
        row0 = 0;
        lq = j.lq;
        return 0;
    }
    const long long qi = j.pair_q ? (long long)__ldg(j.pair_q + n) : n / j.per_q;
    row0 = j.q_off[qi];
    lq = (int)(j.q_off[qi + 1] - row0);
    return qi;
}

/* Every query's A fragments in tile-column order: fragment (mt, kt) of 32-row unit u of query
 * qi for lane l at [((qi * units + u) * 2 + mt) * KT + kt] * 32 + l, rows g, g + 8 (+ 16 mt)
 * and columns 16 kt + 4 t4 .. + 3 as (a0: row g cols 0-1, a1: row g+8 cols 0-1, a2: row g
 * cols 2-3, a3: row g+8 cols 2-3); rows past the query's are 0. */
/* Packed A fragment i of every query, per_q of them a query, at [((qi * units + u) * 2 + mt) *
 * KT + kt] * 32 + lane in the standard m16n8k16 order (a0: row g, a1: row g + 8; a2 and a3: the
 * next columns): element e of row h is val(the row's query vector, kt, t4, e), 0 past the
 * query's rows. The column map val is the A operand's meaning (dims, or the code's bits). */
template <class F>
__device__ __forceinline__ void pack_afrag(const ax_args &a, int KT, long long i, long long per_q,
                                           uint4 *__restrict__ out, F val)
{
    const long long qi = i / per_q;
    const int r = (int)(i % per_q), lane = r & 31, kt = (r >> 5) % KT, mt = (r >> 5) / KT % 2;
    const int u = (r >> 5) / (2 * KT), g = lane >> 2, t4 = lane & 3;
    long long row0;
    const int lq = query_rows(a.j, qi, row0);
    float x[2][4];
    for (int h = 0; h < 2; h++) {
        const int row = 32 * u + 16 * mt + g + 8 * h;
        const float *qrow = row < lq ? a.j.q + (row0 + row) * a.j.dim : nullptr;
        for (int e = 0; e < 4; e++)
            x[h][e] = qrow ? val(qrow, kt, t4, e) : 0.f;
    }
    out[i] = make_uint4(pack_h2(x[0][0], x[0][1]), pack_h2(x[1][0], x[1][1]),
                        pack_h2(x[0][2], x[0][3]), pack_h2(x[1][2], x[1][3]));
}

__global__ void pack_axes_afrag_kernel(ax_args a, int KT, long long nq, uint4 *__restrict__ out)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_q = (long long)a.af_units * 2 * KT * 32;
    if (i >= nq * per_q)
        return;
    pack_afrag(a, KT, i, per_q, out, [&](const float *qrow, int kt, int t4, int e) {
        return qrow[dim_of(a.L, 16 * kt + 4 * t4 + e)];
    });
}

/* The swizzle of tile row t: its columns XOR 8 s(t) (whole 8-half blocks, so that a byte's run
 * of 1, 2, 4 or 8 values stays one aligned store). With rows a multiple of 64 halves apart,
 * s(t) = 2 (t & 3) + bit 2 of t puts a half warp's B loads (rows g 0..3, 8 bytes at 4 t4) in
 * 16 distinct bank pairs, and spreads the decode's stores (16 rows at once) over 8 bank
 * groups instead of 1. */
__device__ __forceinline__ int swz(int t)
{
    return 8 * (2 * (t & 3) + ((t >> 2) & 1));
}

/* Byte v of position p into row (a tile row, swizzle sw) through the tables tab (fp16,
 * positions in order, as kern_residual.axes_dec). Each width's values are one aligned run in
 * the table and in the row (the column order above). */
__device__ __forceinline__ void put_byte(const ax_layout &L, const __half *__restrict__ tab,
                                         __half *__restrict__ row, int sw, int p, uint32_t v)
{
    if (p < L.p1) {
        row[(L.c0 + p) ^ sw] = tab[256 * p + v];
    } else if (p < L.p2) {
        const int k = p - L.p1;
        *reinterpret_cast<uint32_t *>(row + ((L.c1 + 2 * k) ^ sw)) =
            *reinterpret_cast<const uint32_t *>(tab + 256 * (L.d1 + 2 * k) + 2 * v);
    } else if (p < L.p3) {
        const int k = p - L.p2;
        *reinterpret_cast<uint2 *>(row + ((L.c2 + 4 * k) ^ sw)) =
            *reinterpret_cast<const uint2 *>(tab + 256 * (L.d2 + 4 * k) + 4 * v);
    } else {
        const int k = p - L.p3;
        *reinterpret_cast<uint4 *>(row + ((8 * k) ^ sw)) =
            *reinterpret_cast<const uint4 *>(tab + 256 * (L.d3 + 8 * k) + 8 * v);
    }
}

/* A warp decodes tokens tok0 .. tok0 + AX_TOK - 1 of doc (those past its end repeat its last
 * token, so that they never change the max) into tile [AX_TOK][rs]: lane l takes token l % 16
 * and its items (G bytes each; G 4: words, where rbytes is a multiple of 4) l / 16, + 2, ...:
 * position-major, so that the lanes of an instruction share a position and so its width (a
 * token-major order had lanes of all four widths in one instruction, each width's branch run
 * in turn). */
template <int G>
__device__ __forceinline__ void decode_step(const ax_layout &L, const __half *tab, __half *tile,
                                            int rs, const kern_pdoc &doc, int tok0, int lane)
{
    const int per = L.rbytes / G, t = lane & (AX_TOK - 1), sw = swz(t);
    const int tok = min(tok0 + t, (int)doc.ntok - 1);
    const uint8_t *src = doc.residuals + (long long)tok * L.rbytes;
    const bool al4 = G == 4 && ((uintptr_t)doc.residuals & 3) == 0;
    __half *row = tile + t * rs;
#pragma unroll 2
    for (int k = lane / AX_TOK; k < per; k += 32 / AX_TOK) {
        if (G == 1) {
            put_byte(L, tab, row, sw, k, __ldg(src + k));
        } else {
            uint32_t w;
            if (al4) {
                w = __ldg(reinterpret_cast<const uint32_t *>(src) + k);
            } else {
                w = 0;
#pragma unroll
                for (int e = 0; e < 4; e++)
                    w |= (uint32_t)__ldg(src + 4 * k + e) << (8 * e);
            }
#pragma unroll
            for (int e = 0; e < 4; e++)
                put_byte(L, tab, row, sw, 4 * k + e, (w >> (8 * e)) & 0xffu);
        }
    }
}

/* The tables (n halves) into shared memory as fp16 by the whole CTA, 4 floats a load where
 * they are 16-byte aligned, LT_BATCH loads of a thread in flight at once: a CTA's 64 KB (dim
 * 128) then take 2 round trips to memory, not 32 one after another, which a launch of few
 * pairs (the default search's exact rounds) paid in full. */
constexpr int LT_BATCH = 16;

__device__ __forceinline__ void load_tables(const float *__restrict__ dec, int n, __half *tab)
{
    const int step = (int)blockDim.x;
    if (((uintptr_t)dec & 15) == 0) {
        const float4 *src = reinterpret_cast<const float4 *>(dec);
        const int n4 = n / 4;
        for (int i0 = threadIdx.x; i0 < n4; i0 += LT_BATCH * step) {
            float4 f[LT_BATCH];
#pragma unroll
            for (int b = 0; b < LT_BATCH; b++)
                f[b] = i0 + b * step < n4 ? __ldg(src + i0 + b * step) : make_float4(0, 0, 0, 0);
#pragma unroll
            for (int b = 0; b < LT_BATCH; b++)
                if (i0 + b * step < n4)
                    *reinterpret_cast<uint2 *>(tab + 4 * (i0 + b * step)) =
                        make_uint2(pack_h2(f[b].x, f[b].y), pack_h2(f[b].z, f[b].w));
        }
    } else {
        for (int i0 = threadIdx.x; i0 < n; i0 += LT_BATCH * step) {
            float f[LT_BATCH];
#pragma unroll
            for (int b = 0; b < LT_BATCH; b++)
                f[b] = i0 + b * step < n ? __ldg(dec + i0 + b * step) : 0.f;
#pragma unroll
            for (int b = 0; b < LT_BATCH; b++)
                if (i0 + b * step < n)
                    tab[i0 + b * step] = __float2half_rn(f[b]);
        }
    }
}

/* The B fragment of a run (its word d, make_runs) for the token whose packed bytes are at src:
 * its four columns' values as two half2 words, read from the tables tab and, for RUN_COLS, the
 * column words cols (shared memory) from column c. */
__device__ __forceinline__ uint2 run_frag(uint32_t d, const uint8_t *__restrict__ src,
                                          const __half *__restrict__ tab,
                                          const uint32_t *__restrict__ cols, int c)
{
    const uint32_t kind = d & 7u, p = (d >> 3) & 127u, off = d >> 10;
    if (kind == RUN_ONE || kind == RUN_TWO) {
        const uint32_t v = __ldg(src + p);
        return *reinterpret_cast<const uint2 *>(tab + off + (v << (kind == RUN_ONE ? 3 : 2)));
    }
    if (kind == RUN_FOUR) {
        const uint32_t v0 = __ldg(src + p), v1 = __ldg(src + p + 1);
        return make_uint2(*reinterpret_cast<const uint32_t *>(tab + off + 2 * v0),
                          *reinterpret_cast<const uint32_t *>(tab + off + 512 + 2 * v1));
    }
    if (kind == RUN_ZERO)
        return make_uint2(0u, 0u);
    const unsigned short *t16 = reinterpret_cast<const unsigned short *>(tab);
    uint32_t h[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const uint32_t w = cols[c + e];
        h[e] =
            w & 4u ? 0u : t16[(w >> 10) + ((uint32_t)__ldg(src + ((w >> 3) & 127u)) << (w & 3u))];
    }
    return make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
}

/* The lane's row maxima rmax [mt][h] taken over a step's scores: (residual term acc + q.C qv)
 * times the inverse norm nrm of the lane's accumulator columns. */
template <int MT>
__device__ __forceinline__ void acc_max(const float (&acc)[2][MT][4],
                                        const float (&qv)[2][MT][2][2], const float (&nrm)[2][2],
                                        float (&rmax)[MT][2])
{
#pragma unroll
    for (int jt = 0; jt < 2; jt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float s0 = (acc[jt][mt][2 * h] + qv[jt][mt][h][0]) * nrm[jt][0];
                const float s1 = (acc[jt][mt][2 * h + 1] + qv[jt][mt][h][1]) * nrm[jt][1];
                rmax[mt][h] = fmaxf(rmax[mt][h], fmaxf(s0, s1));
            }
}

/* One step of AX_TOK tokens against a 32-row unit of the query: its residual terms on the
 * tensor cores, A fragment (mt, kt) from afrag(mt, kt) and B fragment (kt, jt) (n8 tile jt)
 * from bfrag(kt, jt), then the lane's row maxima rmax [mt][h] taken over (residual term + q.C
 * qv) times the inverse norm nrm of the lane's accumulator columns. */
template <int KT, int MT, class AF, class BF>
__device__ __forceinline__ void step_max_b(AF afrag, BF bfrag, const float (&qv)[2][MT][2][2],
                                           const float (&nrm)[2][2], float (&rmax)[MT][2])
{
    float acc[2][MT][4];
#pragma unroll
    for (int jt = 0; jt < 2; jt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[jt][mt][e] = 0.f;
#pragma unroll
    for (int kt = 0; kt < KT; kt++)
#pragma unroll
        for (int jt = 0; jt < 2; jt++) {
            const uint2 b = bfrag(kt, jt);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                mma16816(acc[jt][mt], afrag(mt, kt), b.x, b.y);
        }
    acc_max<MT>(acc, qv, nrm, rmax);
}

/* step_max_b with the B fragments read from a step's decoded tile ts (rows rs halves apart,
 * swizzled): the cross kernel's. */
template <int KT, int MT, class AF>
__device__ __forceinline__ void step_max(const __half *ts, int rs, int lane, AF afrag,
                                         const float (&qv)[2][MT][2][2], const float (&nrm)[2][2],
                                         float (&rmax)[MT][2])
{
    const int g = lane >> 2, t4 = lane & 3;
    step_max_b<KT, MT>(
        afrag,
        [&](int kt, int jt) {
            const int r = 8 * jt + g;
            return *reinterpret_cast<const uint2 *>(ts + r * rs + ((16 * kt + 4 * t4) ^ swz(r)));
        },
        qv, nrm, rmax);
}

/* A 32-row unit's part of the score, in every lane: each row's max over the quad's columns
 * (rmax from step_max), summed over the unit u's rows below lq. */
template <int MT>
__device__ __forceinline__ float unit_sum(const float (&rmax)[MT][2], int lane, int u, int lq)
{
    return rows_max_sum<MT>(rmax, lane, [&](int r) { return 32 * u + r < lq; });
}

/* The codes and norms of the lane's accumulator columns of the step at tok0 (past the end, the
 * last token's), then their q.C values (the query's rows at qb): in flight while the step
 * decodes and multiplies. */
template <int MT>
__device__ __forceinline__ void step_cols(const kern_axes_job &j, const kern_pdoc &doc, int ntok,
                                          int tok0, const float *qb, int t4,
                                          float (&qv)[2][MT][2][2], float (&nrm)[2][2])
{
#pragma unroll
    for (int jt = 0; jt < 2; jt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tc = min(tok0 + 8 * jt + 2 * t4 + e, ntok - 1);
            const uint32_t c = load_code(doc.codes, j.code_bytes, tc);
            nrm[jt][e] = __ldg(doc.inv_norms + tc);
            const float *row = qb + (long long)c * j.ldq;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    qv[jt][mt][h][e] = __ldg(row + 16 * mt + 8 * h);
        }
}

/* The per-warp kernels' step: tokens tok0 .. tok0 + AX_TOK - 1 of doc (of ntok) against a
 * 32-row unit of the query (its q.C rows at qb, lane's row group included; A fragments from
 * afrag), each lane decoding its B fragments from the run words run, into rmax. */
template <int KT, int MT, class AF>
__device__ __forceinline__ void reg_step(const kern_axes_job &j, const ax_layout &L,
                                         const kern_pdoc &doc, int ntok, int tok0, const float *qb,
                                         AF afrag, const uint32_t (&run)[KT], const __half *tab,
                                         const uint32_t *s_cols, int lane, float (&rmax)[MT][2])
{
    const int g = lane >> 2, t4 = lane & 3;
    float qv[2][MT][2][2], nrm[2][2];
    step_cols<MT>(j, doc, ntok, tok0, qb, t4, qv, nrm);
    /* The B operand's tokens (rows g and g + 8 of the step; past the end, the
     * last token, which never changes a max). */
    const uint8_t *src[2];
#pragma unroll
    for (int jt = 0; jt < 2; jt++)
        src[jt] = doc.residuals + (long long)min(tok0 + 8 * jt + g, ntok - 1) * L.rbytes;
    step_max_b<KT, MT>(
        afrag,
        [&](int kt, int jt) { return run_frag(run[kt], src[jt], tab, s_cols, 16 * kt + 4 * t4); },
        qv, nrm, rmax);
}

/* The register kernels' start, before their barrier: the tables, the column words and (AS) the
 * one query's A fragments into shared memory by the whole CTA, and the lane's run words, one a
 * k step, into run. */
template <int KT, int MT, bool AS>
__device__ __forceinline__ void reg_setup(const ax_args &a, __half *tab, uint4 *sa,
                                          uint32_t *s_cols, uint32_t (&run)[KT])
{
    load_tables(a.j.dec, 256 * a.L.coded, tab);
    for (int i = threadIdx.x; i < 16 * KT; i += blockDim.x)
        s_cols[i] = a.cols[i];
    if (AS)
        for (int i = threadIdx.x; i < MT * KT * 32; i += blockDim.x)
            sa[i] = __ldg(a.af + i);
#pragma unroll
    for (int kt = 0; kt < KT; kt++)
        run[kt] = a.runs[4 * kt + (threadIdx.x & 3)];
}

/* The per-warp kernels' walk: each warp takes pairs claimed from a counter (claim_cuda.cuh:
 * warps that drew short documents take more) and writes each pair's score, the sum over its
 * query's 32-row units u of unit(doc, ntok, qi, row0, lq, u) (every lane's the same), or
 * KERN_EMPTY_SCORE for a document without tokens. */
template <int WARPS, class U>
__device__ __forceinline__ void warp_pairs(const kern_axes_job &j, U unit)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * WARPS;
    long long n = (long long)blockIdx.x * WARPS + warp;
    while (n < j.nd) {
        const kern_pdoc doc = pair_doc(j, n);
        const int ntok = (int)doc.ntok;
        float total = 0.f;
        if (ntok > 0) {
            long long row0;
            int lq;
            const long long qi = pair_query(j, n, row0, lq);
            const int units = (lq + 31) / 32;
            for (int u = 0; u < units; u++)
                total += unit(doc, ntok, qi, row0, lq, u);
        }
        if (lane == 0)
            j.scores[n] = ntok > 0 ? total : KERN_EMPTY_SCORE;
        unsigned long long t = 0;
        if (lane == 0)
            t = kern_claim();
        n = warps + (long long)__shfl_sync(0xffffffffu, t, 0);
    }
    if (lane == 0)
        kern_claims_done();
}

/*
 * KT: k16 steps (dim / 16). A warp walks (query, document) pairs claimed from a counter
 * (claim_cuda.cuh: warps that drew short documents take more); for each 32-row unit of its
 * query and each step of AX_TOK tokens it gathers the tokens' q.C values, runs the MMAs and
 * takes the max. Each lane decodes its own B fragments, run by run (run_frag: one byte and
 * one table load for a run of 1- or 2-bit axes), straight into registers. Dynamic shared
 * memory (reg_smem): the tables (256 x coded halves, room for 256 x dim), (AS) the query's A
 * fragments, then the column words.
 */
template <int KT, int WARPS, int MINB, bool AS>
__global__ void __launch_bounds__(WARPS * 32, MINB) residual_axes_mma_kernel(ax_args a)
{
    extern __shared__ __align__(16) unsigned char ax_smem[];
    /* The layout read where the launch put it (constant memory), not copied into registers:
     * the loop needs all it has for the A fragments. */
    const ax_layout &L = a.L;
    const kern_axes_job &j = a.j;
    constexpr int MT = 2;
    const int dim = 16 * KT;
    __half *const tab = reinterpret_cast<__half *>(ax_smem);
    const int lane = threadIdx.x & 31, g = lane >> 2;
    /* AS: the one query's A fragments (one unit) in shared memory after the tables. */
    uint4 *const sa = reinterpret_cast<uint4 *>(tab + 256 * dim);
    uint32_t *const s_cols = reinterpret_cast<uint32_t *>(sa + (AS ? MT * KT * 32 : 0));

    uint32_t run[KT];
    reg_setup<KT, MT, AS>(a, tab, sa, s_cols, run);
    __syncthreads();

    warp_pairs<WARPS>(
        j, [&](const kern_pdoc &doc, int ntok, long long qi, long long row0, int lq, int u) {
            uint4 af[MT][KT];
            if (!AS) {
                const uint4 *pf = a.af + (qi * a.af_units + u) * (MT * KT * 32) + lane;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int kt = 0; kt < KT; kt++)
                        af[mt][kt] = __ldg(pf + (mt * KT + kt) * 32);
            }
            const auto afrag = [&](int mt, int kt) {
                return AS ? sa[(mt * KT + kt) * 32 + lane] : af[mt][kt];
            };
            float rmax[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                rmax[mt][0] = rmax[mt][1] = -INFINITY;
            const float *qb = j.qcT + row0 + 32 * u + g;
            for (int tok0 = 0; tok0 < ntok; tok0 += AX_TOK)
                reg_step<KT, MT>(j, L, doc, ntok, tok0, qb, afrag, run, tab, s_cols, lane, rmax);
            return unit_sum<MT>(rmax, lane, u, lq);
        });
}

/* The split kernels' end of a pair: each warp's row maxima rmax into s_rm [WARPS][32], then
 * warp 0 takes each row's max over the warps, sums the rows below lq into pair n's score and
 * claims the CTA's next pair into s_n; the barriers are the whole CTA's. */
template <int WARPS, int MT>
__device__ __forceinline__ void split_finish(const kern_axes_job &j, const float (&rmax)[MT][2],
                                             float *s_rm, long long n, int ntok, int lq,
                                             long long &s_n)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float m = quad_max(rmax[mt][h]);
            if (t4 == 0)
                s_rm[warp * 32 + 16 * mt + g + 8 * h] = m;
        }
    __syncthreads();
    if (warp == 0) {
        float m = -INFINITY;
        for (int w = 0; w < WARPS; w++)
            m = fmaxf(m, s_rm[w * 32 + lane]);
        float part = lane < lq ? m : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            part += __shfl_xor_sync(0xffffffffu, part, o);
        if (lane == 0) {
            j.scores[n] = ntok > 0 ? part : KERN_EMPTY_SCORE;
            s_n = gridDim.x + (long long)kern_claim();
        }
    }
    __syncthreads();
}

/* The split kernels' walk: the CTA takes pairs claimed into s_n (its first, blockIdx.x, set
 * before its barrier), its warps the document's steps in turn (warp w steps w, w + WARPS, ...,
 * each through step(doc, ntok, tok0, qb, rmax): the query's q.C rows at qb), then
 * split_finish. */
template <int WARPS, int MT, class S>
__device__ __forceinline__ void split_pairs(const kern_axes_job &j, float *s_rm, long long &s_n,
                                            S step)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    for (;;) {
        const long long n = s_n;
        if (n >= j.nd)
            break;
        const kern_pdoc doc = pair_doc(j, n);
        const int ntok = (int)doc.ntok;
        long long row0;
        int lq;
        pair_query(j, n, row0, lq);
        float rmax[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            rmax[mt][0] = rmax[mt][1] = -INFINITY;
        const float *qb = j.qcT + row0 + g;
        for (int tok0 = warp * AX_TOK; tok0 < ntok; tok0 += WARPS * AX_TOK)
            step(doc, ntok, tok0, qb, rmax);
        split_finish<WARPS, MT>(j, rmax, s_rm, n, ntok, lq, s_n);
    }
    if (lane == 0)
        kern_claims_done();
}

/*
 * Few pairs of one query of 32 rows or fewer (the default search's exact rounds, a query at a
 * time): the per-warp kernel's time is then a warp's walk through one document, step after
 * step, with most of the GPU idle. Here a CTA takes one pair at a time and its warps take the
 * document's steps in turn (warp w steps w, w + WARPS, ...), each with the query's A fragments
 * from shared memory (as AS); the warps' row maxima meet in shared memory, where warp 0 takes
 * the max of each row and sums the rows. Shared memory as the AS kernel's, then WARPS x 32
 * floats of row maxima.
 */
template <int KT, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 2) residual_axes_split_kernel(ax_args a)
{
    extern __shared__ __align__(16) unsigned char ax_smem[];
    __shared__ long long s_n; /* the CTA's pair */
    const ax_layout &L = a.L;
    const kern_axes_job &j = a.j;
    constexpr int MT = 2;
    const int dim = 16 * KT;
    __half *const tab = reinterpret_cast<__half *>(ax_smem);
    const int lane = threadIdx.x & 31;
    uint4 *const sa = reinterpret_cast<uint4 *>(tab + 256 * dim);
    uint32_t *const s_cols = reinterpret_cast<uint32_t *>(sa + MT * KT * 32);
    float *const s_rm = reinterpret_cast<float *>(s_cols + dim);

    uint32_t run[KT];
    reg_setup<KT, MT, true>(a, tab, sa, s_cols, run);
    if (threadIdx.x == 0)
        s_n = blockIdx.x;
    __syncthreads();

    split_pairs<WARPS, MT>(
        j, s_rm, s_n,
        [&](const kern_pdoc &doc, int ntok, int tok0, const float *qb, float(&rmax)[MT][2]) {
            reg_step<KT, MT>(
                j, L, doc, ntok, tok0, qb,
                [&](int mt, int kt) { return sa[(mt * KT + kt) * 32 + lane]; }, run, tab, s_cols,
                lane, rmax);
        });
}

/* ---- The bit-plane kernels: tables additive in the bits ---------------------------------
 *
 * Where every table is additive in its byte's bits (kern_axes_additive: the entry of value v is
 * the entry of 0 plus, for each bit b of v, the entry of 1 << b less that of 0, as index/axes.c
 * fits them), a token's residual term is q'.r' = sum_p base_p + sum over the code's bits k of
 * A_k bit_k, with A_k (bit b of byte p) = sum over p's axes i of q'_i (T_p[1 << b][i] -
 * T_p[0][i]) and base_p = sum_i q'_i T_p[0][i]. So the MMAs take the bits themselves as the B
 * operand, 0 or 1 in fp16, made from a code word with a few integer operations, and the query's
 * A over the code's bits (twice the columns of dims at 2 bits a dim): no tables, no lookups,
 * whatever the widths, and any dim. K steps go by pairs over the token's 4-byte words (bit_col);
 * the constant sum_p base_p of each query row (crow) joins the q.C term before the norm. */

/* Byte position p's width as values a byte (per) and its first dim d0 (its table starts at
 * 256 d0 floats, the positions' tables being in dim order). */
__device__ __forceinline__ void pos_dims(const ax_layout &L, int p, int &per, int &d0)
{
    if (p < L.p1)
        per = 1, d0 = p;
    else if (p < L.p2)
        per = 2, d0 = L.d1 + 2 * (p - L.p1);
    else if (p < L.p3)
        per = 4, d0 = L.d2 + 4 * (p - L.p2);
    else
        per = 8, d0 = L.d3 + 8 * (p - L.p3);
}

/* A_k of query row qrow (NULL: a row past the query's, 0) for the code's bit col. */
__device__ float bit_coef(const ax_args &a, const float *qrow, int col)
{
    const int p = col >> 3, b = col & 7;
    if (!qrow || p >= a.L.rbytes)
        return 0.f;
    int per, d0;
    pos_dims(a.L, p, per, d0);
    const float *t = a.j.dec + 256LL * d0;
    float s = 0.f;
    for (int i = 0; i < per; i++)
        s = fmaf(qrow[d0 + i], __ldg(t + (1 << b) * per + i) - __ldg(t + i), s);
    return s;
}

/* The code bit that A fragment element e (a0 .. a3 as pack_bits_afrag_kernel) of lane t4 takes
 * in k step kb. Steps 2 m and 2 m + 1 read the code's word m (bytes 4 m .. 4 m + 3, little-
 * endian); a B register holds the word's bits j and j + 16 (bit_pair), j = t4 + 4 hi + 8 (kb
 * odd), hi the register (native columns 2 t4 .. + 1 or 2 t4 + 8 .. + 9), so that a register is
 * a shift, one LOP3 and one HADD2 from the word. */
__host__ __device__ __forceinline__ int bit_col(int kb, int t4, int e)
{
    return 32 * (kb >> 1) + t4 + 4 * (e >> 1) + 8 * (kb & 1) + 16 * (e & 1);
}

/* Every query's A fragments over the code's bits (KB k steps), in the standard m16n8k16 order
 * (a0: row g, columns 2 t4 and 2 t4 + 1; a1: row g + 8; a2 and a3: columns + 8), fragment
 * (mt, kb) of unit u of query qi for lane l at [((qi * units + u) * 2 + mt) * KB + kb] * 32 +
 * l; rows past the query's are 0. Threads past those: crow [(qi * units + u) * 32 + r], the
 * constant term of row r of unit u (0 past the query's rows). */
__global__ void pack_bits_afrag_kernel(ax_args a, int KB, long long nq, uint4 *__restrict__ out,
                                       float *__restrict__ crow)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per_q = (long long)a.af_units * 2 * KB * 32, nf = nq * per_q;
    const int dim = a.j.dim;
    if (i >= nf) {
        const long long r = i - nf;
        if (r >= nq * a.af_units * 32)
            return;
        const long long qi = r / (a.af_units * 32);
        const int row = (int)(r % (a.af_units * 32));
        long long row0;
        const int lq = query_rows(a.j, qi, row0);
        float s = 0.f;
        if (row < lq) {
            const float *qrow = a.j.q + (row0 + row) * dim;
            for (int p = 0; p < a.L.rbytes; p++) {
                int per, d0;
                pos_dims(a.L, p, per, d0);
                const float *t = a.j.dec + 256LL * d0;
                for (int e = 0; e < per; e++)
                    s = fmaf(qrow[d0 + e], __ldg(t + e), s);
            }
        }
        crow[r] = s;
        return;
    }
    pack_afrag(a, KB, i, per_q, out, [&](const float *qrow, int kb, int t4, int e) {
        return bit_coef(a, qrow, bit_col(kb, t4, e));
    });
}

/* Code bytes a chunk of the bit-plane step (whole 4-byte words). */
constexpr int BX_CHUNK = 32;

/* Bits 0 and 16 of y as the halves (low, high) of a word, each 0 or 1: 1024 + bit as halves
 * (exponent 0x64 over the bit as the lowest mantissa bit: one LOP3), less 1024. */
__device__ __forceinline__ uint32_t bit_pair(uint32_t y)
{
    const uint32_t r = (y & 0x00010001u) | 0x64006400u;
    const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&r), __float2half2_rn(1024.f));
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Four bytes of a token's code from byte o, little-endian (bytes at or past rbytes read 0);
 * al4: the code's words are 4-byte aligned (rbytes a multiple of 4 and an aligned start). */
__device__ __forceinline__ uint32_t code_word(const uint8_t *src, int o, int rbytes, bool al4)
{
    if (al4)
        return __ldg(reinterpret_cast<const uint32_t *>(src + o));
    uint32_t w = 0;
#pragma unroll
    for (int e = 0; e < 4; e++)
        if (o + e < rbytes)
            w |= (uint32_t)__ldg(src + o + e) << (8 * e);
    return w;
}

/* The bit-plane kernels' step: tokens tok0 .. tok0 + AX_TOK - 1 of doc against a 32-row unit
 * (q.C rows at qb, constant terms cr of the lane's rows, A fragments afrag(mt, kb) over the
 * code's KB k steps), into rmax. */
template <int MT, class AF>
__device__ __forceinline__ void
bits_step(const kern_axes_job &j, int rbytes, int KB, const kern_pdoc &doc, int ntok, int tok0,
          const float *qb, const float (&cr)[MT][2], AF afrag, int lane, float (&rmax)[MT][2])
{
    const int g = lane >> 2, t4 = lane & 3;
    float qv[2][MT][2][2], nrm[2][2];
    step_cols<MT>(j, doc, ntok, tok0, qb, t4, qv, nrm);
#pragma unroll
    for (int jt = 0; jt < 2; jt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    qv[jt][mt][h][e] += cr[mt][h];
    const uint8_t *src[2];
#pragma unroll
    for (int jt = 0; jt < 2; jt++)
        src[jt] = doc.residuals + (long long)min(tok0 + 8 * jt + g, ntok - 1) * rbytes;
    const bool al4 = (rbytes & 3) == 0 && ((uintptr_t)doc.residuals & 3) == 0;
    /* Two accumulators a column block, even and odd k steps, so that a chain of dependent MMAs
     * is KB / 2 long, not KB. */
    float acc[2][2][MT][4];
#pragma unroll
    for (int x = 0; x < 2; x++)
#pragma unroll
        for (int jt = 0; jt < 2; jt++)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[x][jt][mt][e] = 0.f;
    /* The code a chunk of BX_CHUNK bytes at a time (one chunk at dim 128 and 2 bits or fewer),
     * every word of the chunk loaded at once, before the MMAs need them. */
    for (int c0 = 0; c0 < rbytes; c0 += BX_CHUNK) {
        uint32_t w[2][BX_CHUNK / 4];
#pragma unroll
        for (int i = 0; i < BX_CHUNK / 4; i++)
#pragma unroll
            for (int jt = 0; jt < 2; jt++)
                w[jt][i] = c0 + 4 * i < rbytes ? code_word(src[jt], c0 + 4 * i, rbytes, al4) : 0u;
#pragma unroll
        for (int k = 0; k < BX_CHUNK / 2; k++) {
            const int kb = c0 / 2 + k;
            if (kb >= KB)
                break;
#pragma unroll
            for (int jt = 0; jt < 2; jt++) {
                const uint32_t x = w[jt][k / 2] >> (8 * (k & 1) + t4);
                const uint32_t b0 = bit_pair(x), b1 = bit_pair(x >> 4);
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    mma16816(acc[k & 1][jt][mt], afrag(mt, kb), b0, b1);
            }
        }
    }
#pragma unroll
    for (int jt = 0; jt < 2; jt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[0][jt][mt][e] += acc[1][jt][mt][e];
    acc_max<MT>(acc[0], qv, nrm, rmax);
}

/* The constant terms of the lane's rows of unit u of query qi. */
template <int MT>
__device__ __forceinline__ void unit_crow(const ax_args &a, long long qi, int u, int g,
                                          float (&cr)[MT][2])
{
    const float *c = a.crow + (qi * a.af_units + u) * 32 + g;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            cr[mt][h] = __ldg(c + 16 * mt + 8 * h);
}

/* Warps a CTA of the bit-plane kernels (no tables: 2 CTAs an SM or more). */
constexpr int BX_WARPS = 8;

/*
 * The bit-plane per-warp kernel: pairs claimed by warps as residual_axes_mma_kernel claims them,
 * each step on bits_step. AS (one query of one unit): its A fragments in shared memory, read
 * there by every warp; else each warp reads its query's from global memory (L1) at every step.
 */
template <int WARPS, bool AS>
__global__ void __launch_bounds__(WARPS * 32, 2) residual_bits_kernel(ax_args a)
{
    extern __shared__ __align__(16) unsigned char ax_smem[];
    const kern_axes_job &j = a.j;
    constexpr int MT = 2;
    const int rbytes = a.L.rbytes, KB = (rbytes + 3) / 4 * 2;
    uint4 *const sa = reinterpret_cast<uint4 *>(ax_smem);
    const int lane = threadIdx.x & 31, g = lane >> 2;
    if (AS) {
        for (int i = threadIdx.x; i < MT * KB * 32; i += blockDim.x)
            sa[i] = __ldg(a.af + i);
        __syncthreads();
    }
    warp_pairs<WARPS>(
        j, [&](const kern_pdoc &doc, int ntok, long long qi, long long row0, int lq, int u) {
            const uint4 *pf = a.af + (qi * a.af_units + u) * (MT * KB * 32) + lane;
            const auto afrag = [&](int mt, int kb) {
                return AS ? sa[(mt * KB + kb) * 32 + lane] : __ldg(pf + (mt * KB + kb) * 32);
            };
            float cr[MT][2], rmax[MT][2];
            unit_crow<MT>(a, qi, u, g, cr);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                rmax[mt][0] = rmax[mt][1] = -INFINITY;
            const float *qb = j.qcT + row0 + 32 * u + g;
            for (int tok0 = 0; tok0 < ntok; tok0 += AX_TOK)
                bits_step<MT>(j, rbytes, KB, doc, ntok, tok0, qb, cr, afrag, lane, rmax);
            return unit_sum<MT>(rmax, lane, u, lq);
        });
}

/* The bit-plane split kernel: few pairs of one query of 32 rows or fewer, a CTA a pair and its
 * warps over the document's steps (as residual_axes_split_kernel), the A fragments in shared
 * memory, then WARPS x 32 floats of row maxima. */
template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32, 2) residual_bits_split_kernel(ax_args a)
{
    extern __shared__ __align__(16) unsigned char ax_smem[];
    __shared__ long long s_n;
    const kern_axes_job &j = a.j;
    constexpr int MT = 2;
    const int rbytes = a.L.rbytes, KB = (rbytes + 3) / 4 * 2;
    uint4 *const sa = reinterpret_cast<uint4 *>(ax_smem);
    float *const s_rm = reinterpret_cast<float *>(sa + MT * KB * 32);
    const int lane = threadIdx.x & 31, g = lane >> 2;
    for (int i = threadIdx.x; i < MT * KB * 32; i += blockDim.x)
        sa[i] = __ldg(a.af + i);
    float cr[MT][2];
    unit_crow<MT>(a, 0, 0, g, cr);
    if (threadIdx.x == 0)
        s_n = blockIdx.x;
    __syncthreads();
    split_pairs<WARPS, MT>(
        j, s_rm, s_n,
        [&](const kern_pdoc &doc, int ntok, int tok0, const float *qb, float(&rmax)[MT][2]) {
            bits_step<MT>(
                j, rbytes, KB, doc, ntok, tok0, qb, cr,
                [&](int mt, int kb) { return sa[(mt * KB + kb) * 32 + lane]; }, lane, rmax);
        });
}

/* The cross kernel reads a chunk's first packed words a document ahead (tokens of 32 bytes or
 * fewer in whole words): AXP_WORDS a lane, a step's 16 tokens taking 2 lanes each. */
constexpr int AXP_WORDS = 4;

/* Step tok0's packed words of the lane (token tok0 + lane % 16, clamped to the document;
 * words lane / 16, + 2, ... of its per), as decode_step<4> takes them. */
__device__ __forceinline__ void step_words(const kern_pdoc &doc, int rbytes, int tok0, int lane,
                                           uint32_t (&w)[AXP_WORDS])
{
    const int per = rbytes / 4, tok = min(tok0 + (lane & (AX_TOK - 1)), (int)doc.ntok - 1);
    const uint8_t *src = doc.residuals + (long long)tok * rbytes;
    const bool al4 = ((uintptr_t)doc.residuals & 3) == 0;
#pragma unroll
    for (int i = 0; i < AXP_WORDS; i++) {
        const int k = lane / AX_TOK + 2 * i;
        w[i] = 0;
        if (k < per) {
            if (al4) {
                w[i] = __ldg(reinterpret_cast<const uint32_t *>(src) + k);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    w[i] |= (uint32_t)__ldg(src + 4 * k + e) << (8 * e);
            }
        }
    }
}

/* Decodes step_words's words into the lane's tile row (decode_step<4>'s work from registers).
 * A word at a time, shifted out of w (which is spent): unrolled, the compiler ran every width's
 * branch of every byte at once and spilled. */
__device__ __forceinline__ void put_words(const ax_layout &L, const __half *tab, __half *tile,
                                          int rs, int lane, uint32_t (&w)[AXP_WORDS])
{
    const int per = L.rbytes / 4, t = lane & (AX_TOK - 1), sw = swz(t);
    __half *row = tile + t * rs;
#pragma unroll 1
    for (int i = 0; i < AXP_WORDS; i++) {
        const int k = lane / AX_TOK + 2 * i;
        const uint32_t v = w[0];
#pragma unroll
        for (int x = 0; x + 1 < AXP_WORDS; x++)
            w[x] = w[x + 1];
        if (k < per) {
#pragma unroll
            for (int e = 0; e < 4; e++)
                put_byte(L, tab, row, sw, 4 * k + e, (v >> (8 * e)) & 0xffu);
        }
    }
}

/*
 * Cross mode (every query against the same document list, as exhaustive search asks): a CTA
 * takes W queries (a group; warp w the group's query w) and one document at a time, and its
 * warps decode the document once for all of them, chunks of W steps of AX_TOK tokens (warp w
 * step w) into W tiles the CTA shares, then each warp runs its query's MMAs over every tile of
 * the chunk. The per-warp kernel above decodes a document once a query: with 8 or more queries
 * that decode was most of its time, and here it is divided by W. Items are (group, document),
 * group-major and claimed by the CTA (claim_cuda.cuh), so that a warp's query changes rarely
 * and its A fragments (one 32-row unit) stay in registers from one document to the next. A
 * query's running row maxima wait in shared memory between the chunks of a document longer
 * than a chunk, room for AXC_UNITS units (queries of more rows take the kernel above).
 */
constexpr int AXC_UNITS = 3;

/* The q.C values and inverse norms of the lane's accumulator columns of a step whose codes and
 * norms are code[0..AX_TOK), nrm[0..AX_TOK) (shared memory), its query's rows at qb. */
template <int MT>
__device__ __forceinline__ void cross_gather(const float *qb, long long ldq, const uint32_t *code,
                                             const float *nrm, int t4, float (&qv)[2][MT][2][2],
                                             float (&nv)[2][2])
{
#pragma unroll
    for (int jt = 0; jt < 2; jt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int t = 8 * jt + 2 * t4 + e;
            nv[jt][e] = nrm[t];
            const float *row = qb + (long long)code[t] * ldq;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    qv[jt][mt][h][e] = __ldg(row + 16 * mt + 8 * h);
        }
}
constexpr int AXC_WARPS = 6;

/* What warp reads of item's first chunk (cross kernel): the packed words of its step and,
 * lanes < AX_TOK, the code and norm of its token (the last token's past the end). */
__device__ __forceinline__ void first_chunk(const kern_axes_job &j, const ax_layout &L,
                                            long long item, int warp, int lane,
                                            uint32_t (&w)[AXP_WORDS], uint32_t &c, float &nv)
{
    const kern_pdoc doc = j.docs[item % j.per_q];
    const int ntok = (int)doc.ntok;
    if (warp * AX_TOK >= ntok)
        return;
    step_words(doc, L.rbytes, warp * AX_TOK, lane, w);
    const int tc = min(warp * AX_TOK + (lane & (AX_TOK - 1)), ntok - 1);
    c = load_code(doc.codes, j.code_bytes, tc);
    nv = __ldg(doc.inv_norms + tc);
}

template <int KT, int W, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
    residual_axes_cross_kernel(ax_args a, long long groups)
{
    extern __shared__ __align__(16) unsigned char ax_smem[];
    __shared__ long long next_item[2]; /* by turns: a turn's is read before it is written again */
    const ax_layout &L = a.L;
    const kern_axes_job &j = a.j;
    constexpr int MT = 2, CH = W * AX_TOK;
    const int dim = 16 * KT, rs = ax_row(dim);
    __half *const tab = reinterpret_cast<__half *>(ax_smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    __half *const tiles = tab + 256 * dim;
    __half *const tile = tiles + warp * (AX_TOK * rs);
    /* Row maxima kept between chunks: [unit][mt][h] a lane, lanes adjacent (no conflicts). */
    float *const keeps = reinterpret_cast<float *>(tiles + W * AX_TOK * rs);
    float *const keep = keeps + warp * (AXC_UNITS * MT * 2 * 32) + lane;
    /* The chunk's codes and inverse norms (past the end: the last token's), read by the
     * decoding warps: a step's q.C gathers then wait for one load, not a load and a load at
     * the address it returns. */
    uint32_t *const s_code = reinterpret_cast<uint32_t *>(keeps + W * (AXC_UNITS * MT * 2 * 32));
    float *const s_nrm = reinterpret_cast<float *>(s_code + CH);

    /* Items are claimed one ahead, so that the next document's first chunk is read while this
     * one's MMAs run (ahead: tokens of whole words, AXP_WORDS a lane at most); without that the
     * CTA waited for its residuals at the start of every document (64 queries, codes10k: 3,087
     * against 3,380 us). Not at 8 warps, whose 128 registers it would spill. */
    if (threadIdx.x == 0)
        next_item[0] = gridDim.x + (long long)kern_claim();
    load_tables(j.dec, 256 * L.coded, tab);
    for (int i = lane; i < AX_TOK * rs / 2; i += 32)
        reinterpret_cast<uint32_t *>(tile)[i] = 0u;
    __syncthreads();

    const bool words = L.rbytes % 4 == 0;
    const bool ahead = W < 8 && a.ahead && words && L.rbytes <= 8 * AXP_WORDS;
    const long long items = groups * j.per_q;
    long long item = blockIdx.x, nxt = next_item[0];
    long long af_q = -1; /* the query whose unit 0 af holds */
    uint4 af[MT][KT];
    uint32_t pw[AXP_WORDS], pc = 0; /* the first chunk of item, read ahead */
    float pn = 0.f;
    if (ahead && item < items)
        first_chunk(j, L, item, warp, lane, pw, pc, pn);
    int turn = 1;
    while (item < items) {
        const long long grp = item / j.per_q, d = item % j.per_q;
        const kern_pdoc doc = j.docs[d];
        const int ntok = (int)doc.ntok;
        const long long qi = grp * W + warp;
        long long row0 = 0;
        int lq = 0;
        if (qi < j.nq_all) {
            row0 = j.q_off[qi];
            lq = (int)(j.q_off[qi + 1] - row0);
        }
        const int units = (lq + 31) / 32;
        const float *qcT = j.qcT + row0;
        float total = 0.f;
        /* ntok is the CTA's: every warp takes the same chunks and barriers. */
        for (int c0 = 0; c0 < ntok; c0 += CH) {
            if (c0 + warp * AX_TOK < ntok) {
                if (ahead && c0 == 0) {
                    if (lane < AX_TOK) {
                        s_code[warp * AX_TOK + lane] = pc;
                        s_nrm[warp * AX_TOK + lane] = pn;
                    }
                    put_words(L, tab, tile, rs, lane, pw);
                } else {
                    if (lane < AX_TOK) {
                        const int tc = min(c0 + warp * AX_TOK + lane, ntok - 1);
                        s_code[warp * AX_TOK + lane] = load_code(doc.codes, j.code_bytes, tc);
                        s_nrm[warp * AX_TOK + lane] = __ldg(doc.inv_norms + tc);
                    }
                    if (words)
                        decode_step<4>(L, tab, tile, rs, doc, c0 + warp * AX_TOK, lane);
                    else
                        decode_step<1>(L, tab, tile, rs, doc, c0 + warp * AX_TOK, lane);
                }
            }
            __syncthreads();
            const int steps = min(W, (ntok - c0 + AX_TOK - 1) / AX_TOK);
            const bool last = c0 + CH >= ntok;
            if (ahead && last && nxt < items)
                first_chunk(j, L, nxt, warp, lane, pw, pc, pn);
            for (int u = 0; u < units; u++) {
                if (units > 1 || af_q != qi) {
                    const uint4 *pf = a.af + (qi * a.af_units + u) * (MT * KT * 32) + lane;
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int kt = 0; kt < KT; kt++)
                            af[mt][kt] = __ldg(pf + (mt * KT + kt) * 32);
                    af_q = units > 1 ? -1 : qi;
                }
                float rmax[MT][2];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        rmax[mt][h] = c0 == 0 ? -INFINITY : keep[((u * MT + mt) * 2 + h) * 32];
                const float *qb = qcT + 32 * u + g;
                /* The q.C values of step s + 1 are in flight while step s's MMAs run. */
                float qv[2][MT][2][2], nrm[2][2];
                cross_gather<MT>(qb, j.ldq, s_code, s_nrm, t4, qv, nrm);
                for (int s = 0; s < steps; s++) {
                    float qn[2][MT][2][2], nn[2][2];
                    const int sn = min(s + 1, steps - 1) * AX_TOK;
                    cross_gather<MT>(qb, j.ldq, s_code + sn, s_nrm + sn, t4, qn, nn);
                    step_max<KT, MT>(
                        tiles + s * (AX_TOK * rs), rs, lane,
                        [&](int mt, int kt) { return af[mt][kt]; }, qv, nrm, rmax);
#pragma unroll
                    for (int jt = 0; jt < 2; jt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            nrm[jt][e] = nn[jt][e];
#pragma unroll
                            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                                for (int h = 0; h < 2; h++)
                                    qv[jt][mt][h][e] = qn[jt][mt][h][e];
                        }
                }
                if (!last) {
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            keep[((u * MT + mt) * 2 + h) * 32] = rmax[mt][h];
                    continue;
                }
                total += unit_sum<MT>(rmax, lane, u, lq);
            }
            /* Every warp is done with the tiles before the next chunk (or item) decodes. */
            __syncthreads();
        }
        if (ahead && ntok <= 0 && nxt < items)
            first_chunk(j, L, nxt, warp, lane, pw, pc, pn);
        if (qi < j.nq_all && lane == 0)
            j.scores[qi * j.per_q + d] = ntok > 0 ? total : KERN_EMPTY_SCORE;
        if (threadIdx.x == 0)
            next_item[turn] = gridDim.x + (long long)kern_claim();
        __syncthreads();
        item = nxt;
        nxt = next_item[turn];
        turn ^= 1;
    }
    if (lane == 0)
        kern_claims_done();
}

/* Exact fp32 path: a warp a pair, a lane a token, the query rows outermost; the tables read
 * from global memory in fp32 as the CPU kernel reads them. */
__global__ void residual_axes_simple_kernel(ax_args a)
{
    const kern_axes_job &j = a.j;
    const ax_layout L = a.L;
    const int lane = threadIdx.x & 31;
    const long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= j.nd)
        return;
    const kern_pdoc doc = pair_doc(j, n);
    const int ntok = (int)doc.ntok, dim = j.dim;
    if (ntok == 0) {
        if (lane == 0)
            j.scores[n] = KERN_EMPTY_SCORE;
        return;
    }
    long long row0;
    int lq;
    pair_query(j, n, row0, lq);
    const float *qp = j.q + row0 * dim, *qcT = j.qcT + row0;
    float total = 0.f;
    for (int i = 0; i < lq; i++) {
        const float *qi = qp + (long long)i * dim;
        float m = -INFINITY;
        for (int t = lane; t < ntok; t += 32) {
            const uint8_t *rp = doc.residuals + (long long)t * L.rbytes;
            float s = 0.f;
            int d = 0; /* the first dim of position p's values, and of its table */
            for (int p = 0; p < L.rbytes; p++) {
                const int per = p < L.p1 ? 1 : p < L.p2 ? 2 : p < L.p3 ? 4 : 8;
                const float *tv = j.dec + 256LL * d + (int)rp[p] * per;
                for (int e = 0; e < per; e++)
                    s = fmaf(qi[d + e], tv[e], s);
                d += per;
            }
            const uint32_t c = load_code(doc.codes, j.code_bytes, t);
            m = fmaxf(m, (qcT[(long long)c * j.ldq + i] + s) * doc.inv_norms[t]);
        }
        for (int o = 16; o > 0; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        total += m;
    }
    if (lane == 0)
        j.scores[n] = total;
}

/* The tables' room in dynamic shared memory: every dim coded, whatever the code codes, so that
 * a kernel always launches with the same size (kern_resident_ctas caches the limit it sets by
 * size: a smaller size set after a larger would refuse the larger). */
size_t tab_smem(int dim)
{
    return (size_t)256 * dim * 2;
}

/* The per-warp kernel's dynamic shared memory: the tables, (as) one query's A fragments, the
 * column words. */
size_t reg_smem(int dim, bool as)
{
    return tab_smem(dim) + (as ? (size_t)2 * (dim / 16) * 32 * sizeof(uint4) : 0) +
           (size_t)dim * sizeof(uint32_t);
}

/* Whether the MMA kernel runs r: its dims, and its shared memory within the device's. */
bool mma_fits(const kern_axes_job &j)
{
    if (!kern_residual_mma_dim((size_t)j.dim, 1))
        return false;
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        cudaGetLastError(); /* the exact kernel then reports what is wrong with the device */
        return false;
    }
    return reg_smem(j.dim, true) <= (size_t)optin;
}

/* The cross kernel's dynamic shared memory: the tables, W tiles, the kept row maxima of
 * AXC_UNITS units a warp, and a chunk's codes and norms. */
size_t cross_smem(int dim, int warps)
{
    return tab_smem(dim) + (size_t)warps * AX_TOK * ax_row(dim) * 2 +
           (size_t)warps * AXC_UNITS * 2 * 2 * 32 * sizeof(float) +
           (size_t)warps * AX_TOK * (sizeof(uint32_t) + sizeof(float));
}

/* Packs every query's A fragments, KF k steps a fragment row, into scratch (bits:
 * pack_bits_afrag_kernel, the rows' constant terms after them; else pack_axes_afrag_kernel) and
 * runs launch(a) with them. */
template <class F> int with_afrag(ax_args a, int KF, bool bits, F launch, const char *what)
{
    const long long nq = a.j.nq_all;
    a.af_units = (a.j.lq + 31) / 32;
    const long long nf = nq * a.af_units * 2 * KF * 32, nc = bits ? nq * a.af_units * 32 : 0;
    const long long units = nf + (nc + 3) / 4;
    const size_t af_bytes = (size_t)(units > 0 ? units : 1) * sizeof(uint4);
    uint4 *af = NULL;
    int rc;
    if ((rc = kern_scratch((void **)&af, af_bytes)) != KERN_OK)
        return rc;
    a.af = af;
    a.crow = bits ? reinterpret_cast<const float *>(af + nf) : NULL;
    cudaError_t e = cudaSuccess;
    if (nf + nc > 0) {
        if (bits)
            pack_bits_afrag_kernel<<<(unsigned)((nf + nc + 255) / 256), 256>>>(
                a, KF, nq, af, reinterpret_cast<float *>(af + nf));
        else
            pack_axes_afrag_kernel<<<(unsigned)((nf + 255) / 256), 256>>>(a, KF, nq, af);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        launch(a);
        e = cudaGetLastError();
    }
    kern_scratch_free(af, af_bytes);
    if (e != cudaSuccess)
        return kern_cuda_fail(e, what, __FILE__, __LINE__);
    return KERN_OK;
}

template <int KT, int WARPS, int MINB, bool AS = false> int launch_mma(const ax_args &a)
{
    const size_t smem = reg_smem(16 * KT, AS);
    const void *fn = (const void *)residual_axes_mma_kernel<KT, WARPS, MINB, AS>;
    int blocks = 0, rc;
    if ((rc = kern_persistent_grid(fn, WARPS * 32, smem, (a.j.nd + WARPS - 1) / WARPS, &blocks)) !=
        KERN_OK)
        return rc;
    return with_afrag(
        a, KT, false,
        [=](const ax_args &b) {
            residual_axes_mma_kernel<KT, WARPS, MINB, AS><<<blocks, WARPS * 32, smem>>>(b);
        },
        "launch of residual_axes_mma_kernel");
}

template <int KT, int WARPS> int launch_split(const ax_args &a)
{
    const size_t smem = reg_smem(16 * KT, true) + (size_t)WARPS * 32 * sizeof(float);
    const void *fn = (const void *)residual_axes_split_kernel<KT, WARPS>;
    int blocks = 0, rc;
    if ((rc = kern_persistent_grid(fn, WARPS * 32, smem, a.j.nd, &blocks)) != KERN_OK)
        return rc;
    return with_afrag(
        a, KT, false,
        [=](const ax_args &b) {
            residual_axes_split_kernel<KT, WARPS><<<blocks, WARPS * 32, smem>>>(b);
        },
        "launch of residual_axes_split_kernel");
}

template <int KT, int W, int MINB> int launch_cross(const ax_args &a)
{
    const size_t smem = cross_smem(16 * KT, W);
    const void *fn = (const void *)residual_axes_cross_kernel<KT, W, MINB>;
    const long long groups = (a.j.nq_all + W - 1) / W;
    int blocks = 0, rc;
    if ((rc = kern_persistent_grid(fn, W * 32, smem, groups * a.j.per_q, &blocks)) != KERN_OK)
        return rc;
    return with_afrag(
        a, KT, false,
        [=](const ax_args &b) {
            residual_axes_cross_kernel<KT, W, MINB><<<blocks, W * 32, smem>>>(b, groups);
        },
        "launch of residual_axes_cross_kernel");
}

/* The bit-plane kernels' A fragments of one unit, bytes. */
size_t bits_afrag_bytes(const ax_layout &L)
{
    return (size_t)2 * ((L.rbytes + 3) / 4 * 2) * 32 * sizeof(uint4);
}

/* Launches a bit-plane kernel fn of smem bytes on the grid kern_persistent_grid gives for want
 * work items; its shared memory limit is set on every call, since another index's size may
 * have lowered it. */
template <class K>
int launch_bits_fn(const ax_args &a, K fn, size_t smem, long long want, const char *what)
{
    int blocks = 0, rc;
    if ((rc = kern_persistent_grid((const void *)fn, BX_WARPS * 32, smem, want, &blocks)) !=
        KERN_OK)
        return rc;
    if (smem > 0)
        KERN_CUDA_TRY(cudaFuncSetAttribute((const void *)fn,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int KB = (a.L.rbytes + 3) / 4 * 2;
    return with_afrag(
        a, KB, true, [=](const ax_args &b) { fn<<<blocks, BX_WARPS * 32, smem>>>(b); }, what);
}

/* The bit-plane path: one query of one unit whose A fragments fit in shared memory takes the
 * split kernel for few pairs (as launch_warps) or the per-warp kernel with them shared; the
 * rest the per-warp kernel reading them from global memory. */
int launch_bits(const ax_args &a)
{
    const size_t sa = bits_afrag_bytes(a.L), rm = (size_t)BX_WARPS * 32 * sizeof(float);
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        cudaGetLastError();
    const char *sp = getenv("TARTAN_GPU_AXES_SPLIT");
    const int spv = sp ? atoi(sp) : -1;
    const bool one = a.j.nq_all == 1 && a.j.lq <= 32 && sa + rm + 64 <= (size_t)optin;
    if (one && (spv == 1 || (spv != 0 && a.j.nd <= AXP_SPLIT_PAIRS)))
        return launch_bits_fn(a, residual_bits_split_kernel<BX_WARPS>, sa + rm, a.j.nd,
                              "launch of residual_bits_split_kernel");
    const long long want = (a.j.nd + BX_WARPS - 1) / BX_WARPS;
    if (one)
        return launch_bits_fn(a, residual_bits_kernel<BX_WARPS, true>, sa, want,
                              "launch of residual_bits_kernel");
    return launch_bits_fn(a, residual_bits_kernel<BX_WARPS, false>, 0, want,
                          "launch of residual_bits_kernel");
}

/* Whether j takes the cross kernel: crossed pairs of AXC_MIN_Q queries or more (fewer leave
 * most of a CTA's warps without a query), of AXC_UNITS units at most, and its shared memory
 * within the device's. TARTAN_GPU_AXES_CROSS=0 in the environment turns it off (benchmarks). */
constexpr long long AXC_MIN_Q = 4;

bool cross_fits(const kern_axes_job &j, int warps)
{
    const char *e = getenv("TARTAN_GPU_AXES_CROSS");
    if ((e && atoi(e) == 0) || !j.cross || !j.q_off || j.pair_q || j.nq_all < AXC_MIN_Q ||
        j.lq > 32 * AXC_UNITS)
        return false;
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return cross_smem(j.dim, warps) + 64 <= (size_t)optin;
}

/* Warps a CTA (2 CTAs an SM, registers fitted to that): AX_WARPS, or 4 or 8 with
 * TARTAN_GPU_AXES_WARPS=4 or 8 in the environment (benchmarks; see AX_WARPS). */
template <int KT> int launch_warps(const ax_args &a)
{
    const char *e = getenv("TARTAN_GPU_AXES_WARPS");
    const int w = e ? atoi(e) : 0;
    /* The cross kernel: 8 warps for 8 queries or fewer (one group, none idle), else AXC_WARPS
     * (8 spill at 128 registers and read no document ahead). H200, codes10k: 8 queries 468 us
     * at 8 warps, 469 at 6 (483 and 571 with the read-ahead off); 64 queries 3,087 at 6,
     * 3,612 at 8. */
    const int cw = w == 4 || w == 8 ? w : a.j.nq_all <= 8 ? 8 : AXC_WARPS;
    if (cross_fits(a.j, cw)) {
        if (cw == 4)
            return launch_cross<KT, 4, 2>(a);
        if (cw == 8)
            return launch_cross<KT, 8, 2>(a);
        return launch_cross<KT, AXC_WARPS, 2>(a);
    }
    /* One query of one unit: its A fragments in shared memory, once a CTA, so that the
     * registers they took hold more warps (AXS_WARPS; TARTAN_GPU_AXES_ASMEM=0 in the
     * environment: not, for benchmarks). */
    const char *as = getenv("TARTAN_GPU_AXES_ASMEM"), *sp = getenv("TARTAN_GPU_AXES_SPLIT");
    const bool one = (!as || atoi(as) != 0) && w == 0 && a.j.nq_all == 1 && a.j.lq <= 32;
    /* Few pairs of one query: a CTA a pair, its warps over the document's steps
     * (TARTAN_GPU_AXES_SPLIT=0 never, 1 whatever the pairs: benchmarks). */
    const int spv = sp ? atoi(sp) : -1;
    if (one && (spv == 1 || (spv != 0 && a.j.nd <= AXP_SPLIT_PAIRS)))
        return launch_split<KT, AXS_WARPS>(a);
    if (one)
        return launch_mma<KT, AXS_WARPS, 2, true>(a);
    if (w == 4)
        return launch_mma<KT, 4, 2>(a);
    if (w == 8)
        return launch_mma<KT, 8, 2>(a);
    return launch_mma<KT, AX_WARPS, 2>(a);
}

} // namespace

int kern_gpu_residual_axes(const kern_axes_job *j, const char *who)
{
    ax_args a;
    a.j = *j;
    a.L = make_layout(j->bytes);
    a.af = NULL;
    a.crow = NULL;
    a.af_units = 0;
    const char *ahead = getenv("TARTAN_GPU_AXES_AHEAD");
    a.ahead = !ahead || atoi(ahead) != 0;
    if (a.L.coded > j->dim) {
        kern_set_error("%s (cuda): the axes code's bytes decode to more dims than dim", who);
        return KERN_EINVAL;
    }
    if (j->nd == 0)
        return KERN_OK;
    /* Tables additive in the bits: the bit-plane kernels at dims without the table kernels
     * (where the exact fp32 kernel was the only one); at 64, 96 and 128 the table kernels are
     * the faster (H200, codes10k, model 3's layout: 101 / 486 / 3,077 us at 1 / 8 / 64 queries
     * against 111 / 633 / 4,716). TARTAN_GPU_AXES_BITS=1: everywhere, 0: nowhere (benchmarks,
     * tests). */
    const char *bx = getenv("TARTAN_GPU_AXES_BITS");
    const int bxv = bx ? atoi(bx) : -1;
    if (j->additive && j->path != 2 && j->lq > 0 && (bxv == 1 || (bxv != 0 && !mma_fits(*j)))) {
        const long long kb = (a.L.rbytes + 3) / 4 * 2;
        if (j->nq_all * (long long)((j->lq + 31) / 32) * (2 * kb * 32 + 32) / 256 > 0x7fffffffLL) {
            kern_set_error("%s (cuda): too many queries", who);
            return KERN_EINVAL;
        }
        return launch_bits(a);
    }
    const bool fast = j->path != 2 && j->lq > 0 && mma_fits(*j);
    if (j->path == 1 && !fast && j->lq > 0) {
        kern_set_error("%s (cuda): no MMA kernel for the axes code at dim %d here", who, j->dim);
        return KERN_EINVAL;
    }
    if (fast) {
        if (j->nq_all * (long long)((j->lq + 31) / 32) * 2 * 8 * 32 / 256 > 0x7fffffffLL) {
            kern_set_error("%s (cuda): too many queries", who);
            return KERN_EINVAL;
        }
        make_runs(a, j->dim);
        switch (j->dim) {
        case 64:
            return launch_warps<4>(a);
        case 96:
            return launch_warps<6>(a);
        default:
            return launch_warps<8>(a);
        }
    }
    const long long blocks = (j->nd + 3) / 4;
    if (blocks > 0x7fffffffLL) {
        kern_set_error("%s (cuda): too many documents", who);
        return KERN_EINVAL;
    }
    residual_axes_simple_kernel<<<(unsigned)blocks, 128>>>(a);
    KERN_CUDA_LAUNCHED("residual_axes_simple_kernel");
    return KERN_OK;
}
