/*
 * maxsim_wgmma_cuda.cu: dense MaxSim for many query rows per document (many queries at once,
 * ColPali's 1024-token queries) on Hopper, through the warpgroup MMA (wgmma, sm_90a).
 *
 * The roles are swapped against the mma.sync kernels: the document tile is the MMA's A
 * (M = 64 tokens) and a block of NB query rows is its B (N = NB, 128 or 256), both read by the
 * tensor cores straight from shared memory. One warpgroup (128 threads) is a CTA; its NB query
 * rows stay in shared memory while the documents stream through a ring of 64-token tiles
 * (cp.async, two tiles ahead with three stages). A tile costs one wgmma instruction of
 * 64 x 128 x (32 bytes of K: k16 of fp16/bf16, k32 of FP8 e4m3) per 32 bytes of a row for each
 * 128 rows of the block, one commit group per 128 rows, then each thread
 * folds its accumulators into a running max per query row (the max is over tokens, the MMA's M:
 * a thread's two token rows per column fold in registers, the rest at the document's end
 * through shuffles and shared memory); the first half's fold runs while the second half's MMAs
 * do. So the query-token x document-token table exists only as one tile's accumulators.
 *
 * Why swapped: with the queries as B, 256 rows share one load of each document tile (half the
 * L2 traffic of 128-row blocks) and the accumulators of a 64 x 256 tile fit one warpgroup.
 * Where there are 512 rows or more, a CTA is two such warpgroups with 256 rows each, sharing
 * every tile (half the L2 traffic again; one CTA an SM). A single query of up to 32 rows takes
 * 32-row blocks (m64n32), so that no MMA or fold works on padding.
 *
 * FP8 (e4m3 queries and documents): the same kernel, byte for byte: the layout, the copies and
 * the descriptors are in bytes, and a k32 step of e4m3 is 32 bytes like a k16 step of bf16; the
 * MMA is the e4m3 one at twice the bf16 rate.
 *
 * Shared-memory layout (no swizzle, the "interleaved" canonical layout): a core matrix is 8 rows
 * x 16 bytes, stored as 128 contiguous bytes; core matrices adjacent in the row direction are
 * 128 bytes apart (SBO), those adjacent along the embedding dimension one slab apart (LBO: 64
 * tokens x 16 bytes for a tile, NB x 16 for the query block). cp.async fills it with thread
 * pairs reading a token's 32 contiguous bytes (whole sectors).
 *
 * Work: the documents' tokens end to end are one stream of 64-token tiles, which straddle
 * documents (a tile past a document's end holds the next one's first tokens, not padding). Each
 * row block reads the whole stream; the row blocks' streams laid end to end are cut into one
 * equal share of tiles per CTA of a persistent grid. So every CTA has the same number of tiles
 * (no last round run half empty, no padded tile at each document's end: ColPali pages of 1,030
 * tokens spent 5% of the MMAs on padding and 5% in a part-empty last round), a CTA keeps one
 * row block when there are no more blocks than CTAs, and the CTAs of different blocks read the
 * same tokens at the same time (from DRAM once). A document cut by a share's boundary leaves
 * each CTA's maxima for its rows in a slot; a second kernel takes the max over the slots and
 * forms the scores. A row block holds whole queries when a query has at most NB rows; a longer
 * query spans several blocks, each writes its part of the sum to scratch, and a third kernel
 * adds the parts in block order. Every sum is formed in a fixed order and the maxima do not
 * depend on the order, so results are deterministic.
 *
 * Measured on the H200 and kept in mind when changing this file: the mma.sync tile kernel this
 * replaces ran 233 TFLOP/s with the tensor pipe half busy; this one ~490-560. Cursors advance
 * by addition, never a 64-bit division a tile (~680 -> ~400 instructions a tile: 381 -> 485
 * TFLOP/s). The wgmma waits sit outside any branch: inside one, ptxas put the second
 * WARPGROUP.DEPBAR right after the first, and the first half's fold no longer overlapped the
 * second half's MMAs (7-12% a tile). 128-row blocks run at 280-300 TFLOP/s against 470-493
 * (twice the tile loads from L2). The document-end reduction has a buffer of its own in
 * two-warpgroup CTAs: borrowing the last tile's stage raced with the other warpgroup. Not
 * written yet: a producer warp with TMA copies into swizzled tiles and two consumer warpgroups
 * taking turns (the tensor pipe was ~64% busy on ColPali when last profiled, at 500 TFLOP/s).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.cuh"
#include "maxsim_wgmma_cuda.h"
#include "tune_cuda.h"

namespace
{

constexpr int WG_TOK = 64; /* document tokens per tile: the MMA's M */

struct wg_args {
    const uint8_t *q; /* rows of dim elements, 2 or 1 bytes each */
    const uint8_t *qmask;
    long long nq, lq;
    const uint8_t *d;
    long long nd, ld;
    float *scores;
    float *part;   /* [nq][nbq][nd] when queries span blocks */
    int upq;       /* 16-row units per query */
    int qpb;       /* whole queries per row block; 0 when a query spans blocks */
    int nbq;       /* row blocks per query when it spans them */
    long long nrb; /* row blocks */
    long long tiles; /* 64-token tiles of the token stream (all documents end to end) */
    long long work;  /* nrb * tiles */
    float *slots;    /* [grid][2][rows a block]: maxima of documents split between CTAs */
};

/* The kernel's body exists in the sm_90a device pass (and is parsed in the host pass); other
 * targets get an empty kernel that the host code never launches. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#define WG_ARCH 1
#endif

#ifdef WG_ARCH
/* Unit u (16 rows) of row block rb: its query and first row; false for a padding unit. */
template <int UB>
__device__ __forceinline__ bool unit_rows(const wg_args &a, long long rb, int u, long long *q,
                                          int *r0)
{
    if (a.qpb) {
        const long long qq = rb * a.qpb + u / a.upq;
        if (u >= a.qpb * a.upq || qq >= a.nq)
            return false;
        *q = qq;
        *r0 = (u % a.upq) * 16;
        return true;
    }
    const long long r = ((rb % a.nbq) * UB + u) * 16LL;
    if (r >= a.lq)
        return false;
    *q = rb / a.nbq;
    *r0 = (int)r;
    return true;
}

/* Matrix descriptor, no swizzle: start address, LBO (K direction), SBO (M/N direction). */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32);
}

/* Operand lists: "%0, %1, ..." and the matching "+f" accumulators. */
#define WG_S10(t)                                                                                  \
    "%" #t "0, %" #t "1, %" #t "2, %" #t "3, %" #t "4, %" #t "5, %" #t "6, %" #t "7, %" #t         \
    "8, %" #t "9, "
#define WG_S64                                                                                     \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, " WG_S10(1) WG_S10(2) WG_S10(3) WG_S10(4) WG_S10(5)  \
        "%60, %61, %62, %63"
#define WG_F8(b)                                                                                   \
    "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]),    \
        "+f"(d[b + 6]), "+f"(d[b + 7])
#define WG_F32(b) WG_F8(b), WG_F8(b + 8), WG_F8(b + 16), WG_F8(b + 24)
#define WG_F64 WG_F32(0), WG_F32(32)
#define WG_S16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_F16V WG_F8(0), WG_F8(8)

/* d (+)= A(desc) x B(desc): m64 x n128 (or n32) x 32 bytes of K (k16 of a 16-bit type, k32 of
 * e4m3), fp32 accumulators; acc = 0 overwrites d. T: the input type's PTX name; the 16-bit
 * types take the two (no-)transpose immediates, e4m3 has none. N: the accumulators' operands. */
#define WG_MMA(NS, KS_, T, TAIL, R, A, B, P)                                                       \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                                                \
    "wgmma.mma_async.sync.aligned.m64" NS KS_ ".f32." T "." T " {" R "}, %" A ", %" B              \
    ", p, 1, 1" TAIL ";\n}\n"
#define WG_MMA128(K, T, TAIL) WG_MMA("n128", K, T, TAIL, WG_S64, "64", "65", "66")
#define WG_MMA32(K, T, TAIL) WG_MMA("n32", K, T, TAIL, WG_S16, "16", "17", "18")
/* The instruction of input type DT with the accumulator operands OUTS. */
#define WG_MMA_DT(MMA, OUTS)                                                                       \
    if (DT == WG_BF16)                                                                             \
        asm volatile(MMA("k16", "bf16", ", 0, 0") : OUTS : "l"(da), "l"(db), "r"(acc));            \
    else if (DT == WG_F16)                                                                         \
        asm volatile(MMA("k16", "f16", ", 0, 0") : OUTS : "l"(da), "l"(db), "r"(acc));             \
    else                                                                                           \
        asm volatile(MMA("k32", "e4m3", "") : OUTS : "l"(da), "l"(db), "r"(acc))
template <int DT>
__device__ __forceinline__ void wg_mma(float (&d)[64], uint64_t da, uint64_t db, int acc)
{
    WG_MMA_DT(WG_MMA128, WG_F64);
}
template <int DT>
__device__ __forceinline__ void wg_mma(float (&d)[16], uint64_t da, uint64_t db, int acc)
{
    WG_MMA_DT(WG_MMA32, WG_F16V);
}

/* Waits until at most N of this warpgroup's MMA groups are pending; the accumulators of the
 * group waited for are operands, so that no read of them is moved above the wait. */
template <int N> __device__ __forceinline__ void wg_wait(float (&d)[64])
{
    asm volatile("wgmma.wait_group.sync.aligned %64;\n" : WG_F64 : "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void wg_wait(float (&d)[16])
{
    asm volatile("wgmma.wait_group.sync.aligned %16;\n" : WG_F16V : "n"(N) : "memory");
}

__device__ __forceinline__ void wg_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wg_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* Ordinary and cp.async writes to shared memory become visible to the tensor cores' (async
 * proxy) reads after this fence and a barrier. */
__device__ __forceinline__ void proxy_fence()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void cp16(uint32_t s, const void *g)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g) : "memory");
}

template <int N> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

#endif /* WG_ARCH */

#ifdef WG_ARCH
/* The unit table of row block rb: unit -> query (-1 for padding) and its first row. */
template <int UB>
__device__ __forceinline__ void unit_table(const wg_args &a, long long rb, long long *s_uq,
                                           int *s_ur0)
{
    for (int u = threadIdx.x; u < UB; u += blockDim.x) {
        long long q;
        int r0;
        const bool ok = unit_rows<UB>(a, rb, u, &q, &r0);
        s_uq[u] = ok ? q : -1;
        s_ur0[u] = ok ? r0 : 0;
    }
}

/* Document n's scores for row block rb from its rows' maxima, v[k] for row tid + k * T (every
 * thread of a CTA of T threads calls it): padding and masked rows count 0, each 16-row unit
 * (16 lanes of a warp) is summed by a shuffle tree, then a query's units in order (or, for a
 * query that spans blocks, the block's units by one warp). Every sum has a fixed order. */
template <int RB, int T> struct rows_per_thread {
    static constexpr int K = RB >= T ? RB / T : 1; /* RB < T: threads tid < RB hold a row */
};

template <int RB, int T>
__device__ __forceinline__ void finish_block(const wg_args &a, long long rb, long long n,
                                             const float (&v)[rows_per_thread<RB, T>::K],
                                             float *s_usum, const long long *s_uq, const int *s_ur0)
{
    constexpr int UB = RB / 16;
    static_assert(T % 32 == 0 && RB % 32 == 0 && (RB % T == 0 || RB < T), "units are half-warps");
    const int tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < rows_per_thread<RB, T>::K; k++) {
        const int c = tid + k * T;
        if (RB < T && c >= RB)
            break; /* whole warps */
        const long long q = s_uq[c >> 4];
        const int r = s_ur0[c >> 4] + (c & 15);
        float x = q < 0 || r >= a.lq || (a.qmask && !a.qmask[q * a.lq + r]) ? 0.f : v[k];
        x += __shfl_xor_sync(0xffffffffu, x, 8);
        x += __shfl_xor_sync(0xffffffffu, x, 4);
        x += __shfl_xor_sync(0xffffffffu, x, 2);
        x += __shfl_xor_sync(0xffffffffu, x, 1);
        if ((tid & 15) == 0)
            s_usum[c >> 4] = x;
    }
    __syncthreads();
    if (a.qpb) {
        for (int i = tid; i < a.qpb; i += T) {
            const long long q = rb * a.qpb + i;
            if (q >= a.nq)
                break;
            float s = 0.f;
            for (int u = i * a.upq; u < (i + 1) * a.upq; u++)
                s += s_usum[u];
            a.scores[q * a.nd + n] = s;
        }
    } else if (tid < 32) {
        float s = 0.f;
        for (int u = tid; u < UB; u += 32)
            s += s_usum[u];
        s += __shfl_xor_sync(0xffffffffu, s, 16);
        s += __shfl_xor_sync(0xffffffffu, s, 8);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (tid == 0)
            a.part[rb * a.nd + n] = s; /* rb = q * nbq + part */
    }
}
#endif /* WG_ARCH */

/*
 * DT: WG_F16, WG_BF16 or WG_E4M3; KS: 32-byte K steps a row (dim / 16 of a 16-bit type, dim / 32
 * of e4m3: the layout, the copies and the descriptors are the same in bytes); NB: query rows per
 * warpgroup; ST: tile stages; WGS: warpgroups per CTA, each with its own NB rows of the block,
 * all sharing the tiles.
 */
template <int DT, int KS, int NB, int ST, int WGS>
__global__ void __launch_bounds__(128 * WGS, WGS == 1 ? (NB == 32 ? 4 : 2) : 1)
    maxsim_wgmma_kernel(wg_args a)
{
#ifdef WG_ARCH
    constexpr int T = 128 * WGS;               /* threads */
    constexpr int RB = NB * WGS;               /* query rows per block */
    constexpr int KV = rows_per_thread<RB, T>::K;
    constexpr int NC = NB < 128 ? NB : 128;     /* query rows an MMA (its N): 128, or 32 */
    constexpr int H = NB / NC;                  /* MMA groups a tile */
    constexpr int ROW = KS * 32, KC = ROW / 16; /* bytes and 16-byte chunks a row */
    constexpr int UB = RB / 16;                 /* units per block */
    constexpr int QSLAB = RB * 16, TSLAB = WG_TOK * 16;
    constexpr int QBYTES = KC * QSLAB, TBYTES = KC * TSLAB;
    static_assert(WGS > 1 || TBYTES >= 4 * RB * (int)sizeof(float), "a stage holds the reduction");
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ float s_usum[UB];
    __shared__ long long s_uq[UB]; /* unit -> query, or -1 for padding */
    __shared__ int s_ur0[UB];      /* unit -> first row */

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t st = sq + QBYTES;
    const long long total = a.nd * a.ld; /* tokens of the stream */
    /* This CTA's share: tiles [w0, w1) of the row blocks' streams laid end to end. */
    const long long w0 = blockIdx.x * a.work / gridDim.x;
    const long long w1 = (blockIdx.x + 1) * a.work / gridDim.x;

    /* The load cursor: the CTA's next tile goes to stage l_slot; one commit group per call,
     * empty past the end. */
    long long l_t = w0 % a.tiles, l_left = w1 - w0;
    int l_slot = 0;
    auto issue = [&]() {
        if (l_left > 0) {
            /* Thread pairs take a token's 32 contiguous bytes: pair p = tid / 2 copies chunks
             * 2k + (tid & 1), k = p / 64, p / 64 + WGS, ... < KC / 2, of token p % 64 (the
             * stream's last token repeats past its end; masked later). */
            const int tok = (tid >> 1) & (WG_TOK - 1), lo = tid & 1, k0 = tid >> 7;
            const uint8_t *src = a.d + min(l_t * WG_TOK + tok, total - 1) * ROW + lo * 16;
            const uint32_t dst = st + (uint32_t)l_slot * TBYTES + lo * TSLAB + tok * 16;
#pragma unroll
            for (int k = k0; k < KC / 2; k += WGS)
                cp16(dst + 2 * k * TSLAB, src + 2 * k * 16);
            l_slot = l_slot + 1 == ST ? 0 : l_slot + 1;
            if (++l_t == a.tiles)
                l_t = 0;
            l_left--;
        }
        cp_commit();
    };

    /* The query rows of block rb into shared memory (cp.async, one commit group: once per
     * launch, mostly), after the block's unit table. */
    auto load_q = [&](long long rb) {
        unit_table<UB>(a, rb, s_uq, s_ur0);
        __syncthreads();
#pragma unroll 4
        for (int k = 0; k < (RB * KC + T - 1) / T; k++) {
            const int i = tid + T * k;
            if ((RB * KC) % T != 0 && i >= RB * KC)
                break;
            const int row = (i >> 1) % RB, kc = (i / (2 * RB)) * 2 + (i & 1);
            const long long q = s_uq[row >> 4];
            const uint8_t *src = a.q + kc * 16;
            if (q >= 0)
                src += (q * a.lq + min((long long)s_ur0[row >> 4] + (row & 15), a.lq - 1)) * ROW;
            cp16(sq + kc * QSLAB + row * 16, src);
        }
        cp_commit();
    };

    /* The query rows' copies (one group), then the first tiles' behind them, in flight
     * together; the rows must have landed before the first MMA. */
    long long rb = w0 / a.tiles, t = w0 % a.tiles;
    if (w0 < w1)
        load_q(rb);
    for (int s = 0; s < ST - 1; s++)
        issue();
    cp_wait<ST - 1>();
    proxy_fence();
    __syncthreads();

    /* The document being folded (n, ending at token nend of the stream) and where this CTA's
     * part of the current stream began: a document that started before seg0 or goes on past the
     * CTA's last tile is split with other CTAs, and its maxima go to the slots. */
    long long seg0 = t * WG_TOK, n = seg0 / a.ld, nend = (n + 1) * a.ld;
    float rmax[NB / 4];
#pragma unroll
    for (int i = 0; i < NB / 4; i++)
        rmax[i] = -INFINITY;

    /* Document n's end: max over the 8 token rows of the lanes, then over the 4 warps of the
     * warpgroup, through shared memory: with two warpgroups a buffer of its own (the other
     * warpgroup may still be reading the tile), with one the stage of the tile just computed
     * after a barrier (no copy targets it until the next ST - 1 issues, each after a barrier;
     * no room for a buffer at two CTAs an SM). */
    auto emit = [&](int slot, bool split_head, bool split_tail) {
        float(*s_red)[RB] =
            reinterpret_cast<float(*)[RB]>(smem + QBYTES + (WGS > 1 ? ST : slot) * TBYTES);
        if (WGS == 1)
            __syncthreads(); /* all warps' MMAs are done reading the stage */
#pragma unroll
        for (int i = 0; i < NB / 4; i++) {
            float m = rmax[i];
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
            rmax[i] = m;
        }
        if (g == 0)
#pragma unroll
            for (int j = 0; j < NB / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    s_red[warp][wg * NB + 8 * j + 2 * t4 + e] = rmax[2 * j + e];
#pragma unroll
        for (int i = 0; i < NB / 4; i++)
            rmax[i] = -INFINITY;
        __syncthreads();
        float v[KV];
#pragma unroll
        for (int k = 0; k < KV; k++) {
            const int c = RB < T ? min(tid, RB - 1) : tid + k * T; /* RB < T: spare threads
                                                                       read a row, unused */
            v[k] = fmaxf(fmaxf(s_red[0][c], s_red[1][c]), fmaxf(s_red[2][c], s_red[3][c]));
        }
        if (split_head || split_tail) {
            float *out = a.slots + (blockIdx.x * 2LL + (split_head ? 0 : 1)) * RB;
#pragma unroll
            for (int k = 0; k < KV; k++)
                if (RB >= T || tid < RB)
                    out[tid + k * T] = v[k];
            __syncthreads(); /* s_red read by all before the next emit writes it */
        } else {
            finish_block<RB, T>(a, rb, n, v, s_usum, s_uq, s_ur0);
        }
    };

    int c_slot = 0, last_slot = 0;
    for (long long w = w0; w < w1; w++, t++) {
        if (t == a.tiles) { /* the next row block's stream, from its start */
            t = 0;
            rb++;
            seg0 = 0;
            n = 0;
            nend = a.ld;
            cp_wait<0>();
            __syncthreads();
            load_q(rb);
            cp_wait<0>();
            proxy_fence();
            __syncthreads();
        }
        cp_wait<ST - 2>();
        proxy_fence();
        __syncthreads();
        issue();
        const uint32_t ta = st + (uint32_t)c_slot * TBYTES;
        last_slot = c_slot;
        c_slot = c_slot + 1 == ST ? 0 : c_slot + 1;
        /* The block's rows in halves of 128 (m64n128), one commit group each: the first
         * half's max folds while the second half's MMAs run (a 32-row block: one m64n32). */
        float acc[H][NC / 2];
        wg_fence();
#pragma unroll
        for (int h = 0; h < H; h++) {
#pragma unroll
            for (int s = 0; s < KS; s++)
                wg_mma<DT>(
                    acc[h], wg_desc(ta + 2 * s * TSLAB, TSLAB, 128),
                    wg_desc(sq + 2 * s * QSLAB + (wg * NB / 8 + h * (NC / 8)) * 128, QSLAB, 128),
                    s);
            wg_commit();
        }
        /* acc[h][4j + e]: token warp*16 + g, query row NB*wg + 128h + 8j + 2*t4 + e;
         * acc[h][4j + 2 + e]: token +8. */
        const long long base = t * WG_TOK;
        const long long rel = nend - base; /* > 0: document n has tokens from this tile on */
        const int hi = (int)min((long long)WG_TOK, total - base);
        const int tok = warp * 16 + g;
        /* Half h's accumulators into rmax for the token rows in [lo, e): a thread's two rows
         * (tok, tok + 8) are each in or out, so the fold is unmasked and a warp pays for the
         * split only where the boundary falls among its 16 tokens. */
        auto fold_half = [&](int h, int lo, int e) {
            const bool v0 = tok >= lo && tok < e, v1 = tok + 8 >= lo && tok + 8 < e;
            float *rm = rmax + NC / 4 * h;
            if (v0 && v1) {
#pragma unroll
                for (int j = 0; j < NC / 8; j++)
#pragma unroll
                    for (int x = 0; x < 2; x++)
                        rm[2 * j + x] =
                            fmaxf(rm[2 * j + x], fmaxf(acc[h][4 * j + x], acc[h][4 * j + 2 + x]));
            } else if (v0) {
#pragma unroll
                for (int j = 0; j < NC / 8; j++)
#pragma unroll
                    for (int x = 0; x < 2; x++)
                        rm[2 * j + x] = fmaxf(rm[2 * j + x], acc[h][4 * j + x]);
            } else if (v1) {
#pragma unroll
                for (int j = 0; j < NC / 8; j++)
#pragma unroll
                    for (int x = 0; x < 2; x++)
                        rm[2 * j + x] = fmaxf(rm[2 * j + x], acc[h][4 * j + 2 + x]);
            }
        };
        /* Each half folds its rows of document n, [0, e0), as soon as its MMAs are done, the
         * first while the second half's run. (The waits stay outside any branch: inside one,
         * ptxas moved the second wait above the first half's fold, measured 10% slower.) */
        const int e0 = (int)min(rel, (long long)hi);
#pragma unroll
        for (int h = 0; h < H; h++) {
            if (h + 1 < H)
                wg_wait<1>(acc[h]);
            else
                wg_wait<0>(acc[h]);
            fold_half(h, 0, e0);
        }
        /* Documents that end in the tile: emit each, fold the next one's rows. */
        long long e = rel;
        int lo = e0;
        while (e <= hi) {
            emit(last_slot, n * a.ld < seg0, false);
            n++;
            e += a.ld;
            const int e1 = (int)min(e, (long long)hi);
            if (lo < e1)
#pragma unroll
                for (int h = 0; h < H; h++)
                    fold_half(h, lo, e1);
            lo = e1;
        }
        nend = base + e;
    }
    /* The CTA's share ended inside document n: its maxima so far go to a slot. */
    if (w0 < w1 && n < a.nd && n * a.ld < t * WG_TOK)
        emit(last_slot, n * a.ld < seg0, true);
    cp_wait<0>();
#endif
}

/*
 * Documents split between CTAs: the CTA holding a split document's first token (its maxima in
 * its tail slot) takes the maxima of the CTAs after it that hold the rest (their head slots),
 * then forms the scores as the main kernel does. One CTA of RB threads per main-kernel CTA.
 */
template <int RB> __global__ void __launch_bounds__(RB) wgmma_merge_kernel(wg_args a)
{
#ifdef WG_ARCH
    constexpr int UB = RB / 16;
    __shared__ float s_usum[UB];
    __shared__ long long s_uq[UB];
    __shared__ int s_ur0[UB];
    const long long G = gridDim.x, c = blockIdx.x;
    const long long w0 = c * a.work / G, w1 = (c + 1) * a.work / G;
    const long long t1 = w1 % a.tiles;
    if (t1 == 0)
        return; /* the share ends with a stream: nothing goes on past it */
    const long long rb = w1 / a.tiles;
    const long long seg0 = (w0 / a.tiles == rb ? w0 % a.tiles : 0) * WG_TOK;
    const long long p1 = t1 * WG_TOK, n = (p1 - 1) / a.ld;
    if (n * a.ld < seg0 || (n + 1) * a.ld <= p1)
        return; /* document n began before this CTA's share, or ends in it */
    const int r = threadIdx.x;
    float m = a.slots[(c * 2 + 1) * RB + r];
    for (long long k = c + 1; k < G; k++) {
        const long long kw0 = k * a.work / G;
        if (kw0 / a.tiles != rb || (kw0 % a.tiles) * WG_TOK >= (n + 1) * a.ld)
            break;
        m = fmaxf(m, a.slots[k * 2 * RB + r]);
    }
    const float v[1] = {m};
    unit_table<UB>(a, rb, s_uq, s_ur0);
    __syncthreads();
    finish_block<RB, RB>(a, rb, n, v, s_usum, s_uq, s_ur0);
#endif
}

/* Adds the parts of queries that span row blocks, in block order. */
__global__ void wgmma_parts_kernel(wg_args a)
{
    const long long total = a.nq * a.nd;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long q = i / a.nd, n = i % a.nd;
        float s = 0.f;
        for (int p = 0; p < a.nbq; p++)
            s += a.part[(q * a.nbq + p) * a.nd + n];
        a.scores[i] = s;
    }
}

template <int DT, int KS, int NB, int ST, int WGS> int launch(wg_args a)
{
    constexpr int RB = NB * WGS;
    const void *fn = (const void *)maxsim_wgmma_kernel<DT, KS, NB, ST, WGS>;
    const int smem = KS * 32 * (RB + ST * WG_TOK) + (WGS > 1 ? 4 * RB * 4 : 0);
    int g = 0;
    int rc = kern_persistent_grid(fn, 128 * WGS, smem, a.work, &g);
    if (rc != KERN_OK)
        return rc;
    const size_t slot_bytes = (size_t)g * 2 * RB * sizeof(float);
    if ((rc = kern_scratch((void **)&a.slots, slot_bytes)) != KERN_OK)
        return rc;
    maxsim_wgmma_kernel<DT, KS, NB, ST, WGS><<<g, 128 * WGS, smem>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && g > 1) {
        wgmma_merge_kernel<RB><<<g, RB>>>(a);
        e = cudaGetLastError();
    }
    kern_scratch_free(a.slots, slot_bytes);
    if (e != cudaSuccess)
        return kern_cuda_fail(e, "launch of maxsim_wgmma_kernel", __FILE__, __LINE__);
    return KERN_OK;
}

/* RB: query rows per block. 512: two warpgroups of 256 rows, one CTA an SM (128 KB of rows
 * and 4 stages at dim 128 bf16); 256: one warpgroup, two CTAs an SM, 3 stages (64 + 48 KB);
 * 128: three CTAs an SM, 2 stages; 32 (one m64n32 a tile, for a single query): small
 * registers and shared memory, 4 stages, four or more CTAs an SM. e4m3 halves every byte figure
 * (twice the stages in the same memory measured no faster: fewer is kept). */
template <int DT, int RB> int launch_ks(const wg_args &a, int dim)
{
    constexpr int NB = RB == 512 ? 256 : RB, WGS = RB / NB;
    constexpr int ST = RB == 512 || RB == 32 ? 4 : RB == 256 ? 3 : 2;
    constexpr int S = DT == WG_E4M3 ? 32 : 16; /* elements a 32-byte K step */
    switch (dim) {
    case 64:
        return launch<DT, 64 / S, NB, ST, WGS>(a);
    case 96:
        return launch<DT, 96 / S, NB, ST, WGS>(a);
    default:
        return launch<DT, 128 / S, NB, ST, WGS>(a);
    }
}

template <int DT> int launch_dt(const wg_args &a, int rb, int dim)
{
    return rb == 512   ? launch_ks<DT, 512>(a, dim)
           : rb == 256 ? launch_ks<DT, 256>(a, dim)
           : rb == 128 ? launch_ks<DT, 128>(a, dim)
                       : launch_ks<DT, 32>(a, dim);
}

} // namespace

int kern_wgmma_usable(const wg_dense *a, const char **why)
{
#ifndef TARTAN_WGMMA
    (void)a;
    *why = "this build has no sm_90a code (CUDA_ARCHS without 90)";
    return 0;
#else
    if (a->dim != 64 && a->dim != 96 && a->dim != 128) {
        *why = "dim is not 64, 96 or 128";
        return 0;
    }
    if ((uintptr_t)a->q % 16 || (uintptr_t)a->d % 16) {
        *why = "embeddings not 16-byte aligned";
        return 0;
    }
    const int cc = kern_device_cc();
    if (cc < 0) {
        *why = "no device";
        return 0;
    }
    if (cc != 90) {
        *why = "the device is not sm_90";
        return 0;
    }
    /* Queries longer than a block write parts to scratch: keep that small beside the
     * documents (the call's memory stays within its inputs). */
    const long long upq = (a->lq + 15) / 16;
    const long long nbq = (upq + 15) / 16;
    if (nbq > 1 &&
        a->nq * nbq * a->nd * 4 > a->nd * a->ld * a->dim * (a->dt == WG_E4M3 ? 1 : 2) / 64) {
        *why = "long queries would need too much scratch";
        return 0;
    }
    *why = "";
    return 1;
#endif
}

int kern_wgmma_maxsim_dense(const wg_dense *d)
{
    wg_args a = {};
    a.q = static_cast<const uint8_t *>(d->q);
    a.qmask = d->qmask;
    a.nq = d->nq;
    a.lq = d->lq;
    a.d = static_cast<const uint8_t *>(d->d);
    a.nd = d->nd;
    a.ld = d->ld;
    a.scores = d->scores;
    if (a.nq == 0 || a.nd == 0)
        return KERN_OK;
    a.upq = (int)((a.lq + 15) / 16);
    /* Rows a block: 32 when all rows fit in 32 (one query: FP8 comes here, 16-bit types go to
     * the mma.sync kernels unless forced), 128 when they fit in 128, 512 when there are 512 or
     * more, else 256 (tune.wgmma_rows overrides). */
    const int tr = kern_gpu_tune.wgmma_rows;
    const int nb = tr == 32 || tr == 128 || tr == 256 || tr == 512 ? tr
                   : a.nq * a.upq <= 2                             ? 32
                   : a.nq * a.upq <= 8                             ? 128
                   : a.nq * a.upq >= 32                            ? 512
                                                                   : 256;
    const int ub = nb / 16;
    if (a.upq <= ub) {
        a.qpb = ub / a.upq;
        a.nrb = (a.nq + a.qpb - 1) / a.qpb;
    } else {
        a.nbq = (a.upq + ub - 1) / ub;
        a.nrb = a.nq * a.nbq;
    }
    if (a.ld <= 0) { /* the dispatcher refuses empty documents before this */
        kern_set_error("maxsim (cuda, wgmma): documents without tokens");
        return KERN_EINVAL;
    }
    a.tiles = (a.nd * a.ld + WG_TOK - 1) / WG_TOK;
    a.work = a.nrb * a.tiles;
    size_t part_bytes = 0;
    if (!a.qpb) {
        part_bytes = (size_t)a.nq * a.nbq * a.nd * sizeof(float);
        int rc = kern_scratch((void **)&a.part, part_bytes);
        if (rc != KERN_OK)
            return rc;
    }
    int rc = d->dt == WG_BF16  ? launch_dt<WG_BF16>(a, nb, d->dim)
             : d->dt == WG_F16 ? launch_dt<WG_F16>(a, nb, d->dim)
                               : launch_dt<WG_E4M3>(a, nb, d->dim);
    if (rc == KERN_OK && !a.qpb) {
        const long long total = a.nq * a.nd;
        const unsigned blocks = (unsigned)(total / 256 + 1 < 4096 ? total / 256 + 1 : 4096);
        wgmma_parts_kernel<<<blocks, 256>>>(a);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            rc = kern_cuda_fail(e, "launch of wgmma_parts_kernel", __FILE__, __LINE__);
    }
    kern_scratch_free(a.part, part_bytes);
    return rc;
}
