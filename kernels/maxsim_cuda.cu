/*
 * maxsim_cuda.cu: dense and varlen MaxSim on CUDA GPUs.
 *
 * Fast path (fp16/bf16, dim a multiple of 32, 16-byte aligned embeddings): tensor-core
 * mma.sync m16n8k16 with fp32 accumulation, sm_80 and later. The query-token x document-token
 * table never exists anywhere but in registers: each warp keeps a block of query rows as MMA
 * A fragments in registers, streams document tokens straight from device memory into B
 * fragments (16-byte loads, every byte read once per query block), and folds each 16x8 product
 * tile into a running per-row max before the next tile.
 *
 * The K (embedding) dimension may be permuted freely as long as A and B use the same
 * permutation, since a dot product sums over it. We choose the permutation that makes both
 * fragments plain 16-byte loads of row-major data: in a 32-dim chunk, lane (g, t4) loads the 8
 * dims [t4*8, t4*8+8) of row g; dims +0,+1 / +2,+3 feed the first k16 step, +4,+5 / +6,+7 the
 * second. Eight lanes of a token cover its 64 contiguous bytes, so loads are fully coalesced.
 *
 * Work split: one CTA (4 warps) per (document, chunk of queries). The rows of the CTA's queries
 * are cut into units of 16*MT rows; WM warp-rows take units round-robin, and the WN = 4 / WM
 * warps of a warp-row split the document's tokens. Sums are formed in a fixed order, so results
 * are deterministic.
 *
 * One query whose rows fit a warp (rerank, ragged rerank) takes the warp kernel instead: each
 * warp streams whole documents claimed from a counter, so no warp waits for others at a
 * document's end. Measured on the H200: the CTA kernel's four warps met at a barrier at each
 * document's end, and a ragged document's last step was mostly idle (ragged 73% of copy; the
 * warp kernel 85-90%). Four 8-token tiles in flight a warp (242 registers, 8 warps an SM) beat
 * two by 1-3%; more loads a step at the cost of warps lost (4 tiles x 4 chunks, 214 registers:
 * 263 against 222 us), so the loads overlap within a warp (one group ahead) instead. Claiming a
 * warp's next document one ahead measured 3-5% slower (not understood) and is not done.
 *
 * Dimensions over 128 are tiled: the accumulators of one token group sum over passes of 128
 * dims (A fragments reloaded per pass, from L1), so any multiple of 32 up to any size works.
 *
 * On sm_90 the tile kernel's shapes (dense queries, no document masks, dim 64/96/128) go to
 * the warpgroup-MMA kernel of maxsim_wgmma_cuda.cu instead.
 *
 * Everything else (fp32 inputs, other dims, misaligned pointers) takes an exact fp32 path on
 * the CUDA cores: one CTA per (query, document) pair.
 */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "claim_cuda.cuh"
#include "cuda_check.cuh"
#include "frag_cuda.cuh"
#include "maxsim_wgmma_cuda.h"
#include "tune_cuda.h"

namespace
{

/* Arguments of both kernels: dense when q_off / d_off are NULL. */
struct ms_args {
    const void *q;
    const int64_t *q_off;
    const uint8_t *qmask;
    long long nq, lq;
    const void *d;
    const int64_t *d_off;
    const uint8_t *dmask;
    long long nd, ld;
    int dim;
    float *scores;
    int qchunk; /* queries per CTA */
};

__device__ __forceinline__ void query_range(const ms_args &a, long long q, long long *start,
                                            int *len)
{
    if (a.q_off) {
        long long s = a.q_off[q];
        *start = s;
        *len = (int)(a.q_off[q + 1] - s);
    } else {
        *start = q * a.lq;
        *len = (int)a.lq;
    }
}

__device__ __forceinline__ void doc_range(const ms_args &a, long long n, long long *start, int *len)
{
    if (a.d_off) {
        long long s = a.d_off[n];
        *start = s;
        *len = (int)(a.d_off[n + 1] - s);
    } else {
        *start = n * a.ld;
        *len = (int)a.ld;
    }
}

__device__ __forceinline__ bool qrow_valid(const ms_args &a, long long q, int r, int len)
{
    return r < len && (!a.qmask || a.qmask[q * a.lq + r]);
}

__device__ __forceinline__ bool dtok_valid(const ms_args &a, long long n, int t, int len)
{
    return t < len && (!a.dmask || a.dmask[n * a.ld + t]);
}

/* Whether document n has any valid token (all threads of the CTA get the answer). */
__device__ bool doc_nonempty(const ms_args &a, long long n, int len)
{
    if (!a.dmask)
        return len > 0;
    int any = 0;
    for (int t = threadIdx.x; t < len && !any; t += blockDim.x)
        any = a.dmask[n * a.ld + t] != 0;
    return __syncthreads_or(any) != 0;
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1)
{
    /* Not volatile: the compiler may then interleave independent MMAs. */
    if (BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldg16(const uint16_t *p)
{
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

constexpr int MS_QCHUNK = 64; /* queries per CTA at most: a doc is re-read once per round */

/* The units of a CTA's query chunk: s_ufirst[i] = first unit of query i, [nqc] = the total. */
template <int RM>
__device__ void chunk_units(const ms_args &a, long long q0, int nqc, int *s_ufirst, float *s_qsum)
{
    if (threadIdx.x == 0) {
        int u = 0;
        for (int i = 0; i < nqc; i++) {
            long long qs;
            int ql;
            query_range(a, q0 + i, &qs, &ql);
            s_ufirst[i] = u;
            u += (ql + RM - 1) / RM;
            s_qsum[i] = 0.f;
        }
        s_ufirst[nqc] = u;
    }
}

/* Loads a unit's A fragments for one pass of NCH 32-dim chunks (koff: the pass's first dim). */
template <int MT, int NCH>
__device__ __forceinline__ void load_a(uint4 (&af)[MT][NCH][2], const uint16_t *Qq, int r0,
                                       int qlen, int dim, int koff, int g, int t4)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint16_t *row = Qq + (long long)min(r0 + mt * 16 + g + 8 * h, qlen - 1) * dim;
#pragma unroll
            for (int c = 0; c < NCH; c++)
                af[mt][c][h] = ldg16(row + koff + c * 32 + t4 * 8);
        }
}

/* B fragments of NG 8-token tiles from tok0 (tokens clamped to the last; masked later). */
template <int NG, int NCH>
__device__ __forceinline__ void load_b(uint4 (&bf)[NG][NCH], const uint16_t *Dd, int tok0, int dlen,
                                       int dim, int koff, int g, int t4)
{
#pragma unroll
    for (int j = 0; j < NG; j++) {
        const int t = min(tok0 + j * 8 + g, dlen - 1);
#pragma unroll
        for (int c = 0; c < NCH; c++)
            bf[j][c] = ldg16(Dd + (long long)t * dim + koff + c * 32 + t4 * 8);
    }
}

/* The prefetched tiles become the current ones (the prefetch buffer is then refilled). */
template <int NG, int NCH>
__device__ __forceinline__ void take_b(uint4 (&bf)[NG][NCH], const uint4 (&nb)[NG][NCH])
{
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int c = 0; c < NCH; c++)
            bf[j][c] = nb[j][c];
}

template <int MT, int NG> __device__ __forceinline__ void zero_acc(float (&acc)[MT][NG][4])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NG; j++)
            acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
}

/* One 32-dim chunk: acc[mt][j] += A[mt](chunk ca) x B[j](chunk cb). */
template <bool BF16, int MT, int NG, int NCH, int NB>
__device__ __forceinline__ void mma_chunk(float (&acc)[MT][NG][4], const uint4 (&af)[MT][NCH][2],
                                          int ca, const uint4 (&bf)[NG][NB], int cb)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NG; j++)
            mma16816<BF16>(acc[mt][j], af[mt][ca][0].x, af[mt][ca][1].x, af[mt][ca][0].y,
                           af[mt][ca][1].y, bf[j][cb].x, bf[j][cb].y);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NG; j++)
            mma16816<BF16>(acc[mt][j], af[mt][ca][0].z, af[mt][ca][1].z, af[mt][ca][0].w,
                           af[mt][ca][1].w, bf[j][cb].z, bf[j][cb].w);
}

/* acc[mt][j] += A(chunk c) x B(tile j, chunk c), both k16 steps of the chunk. The k step is
 * the outer loop so that consecutive MMAs go to different accumulators (no back-to-back
 * dependency). */
template <bool BF16, int MT, int NG, int NCH>
__device__ __forceinline__ void mma_chunks(float (&acc)[MT][NG][4], const uint4 (&af)[MT][NCH][2],
                                           const uint4 (&bf)[NG][NCH])
{
#pragma unroll
    for (int c = 0; c < NCH; c++)
        mma_chunk<BF16, MT, NG, NCH, NCH>(acc, af, c, bf, c);
}
/* Folds NG finished 16 x 8 tiles (tokens tok0 + 8j + 2*t4 + {0,1}) into the row maxima. */
template <int MT, int NG>
__device__ __forceinline__ void fold_max(float (&rmax)[MT][2], const float (&acc)[MT][NG][4],
                                         const ms_args &a, long long n, int tok0, int dlen, int t4)
{
#pragma unroll
    for (int j = 0; j < NG; j++) {
        const int t = tok0 + j * 8 + 2 * t4;
        const bool v0 = dtok_valid(a, n, t, dlen);
        const bool v1 = dtok_valid(a, n, t + 1, dlen);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            rmax[mt][0] = fmaxf(
                rmax[mt][0], fmaxf(v0 ? acc[mt][j][0] : -INFINITY, v1 ? acc[mt][j][1] : -INFINITY));
            rmax[mt][1] = fmaxf(
                rmax[mt][1], fmaxf(v0 ? acc[mt][j][2] : -INFINITY, v1 ? acc[mt][j][3] : -INFINITY));
        }
    }
}

/* The warp's sum over its valid query rows (q's rows r0 + 16 mt + g + 8 h) of their maxima;
 * the four lanes of a row group saw different token columns. Every lane gets the sum. */
template <int MT>
__device__ __forceinline__ float rows_sum(const float (&rmax)[MT][2], const ms_args &a, long long q,
                                          int r0, int qlen, int g, int t4)
{
    return rows_max_sum<MT>(rmax, 4 * g + t4,
                            [&](int r) { return qrow_valid(a, q, r0 + r, qlen); });
}

/* With document masks: whether a valid token is among this lane's columns of NG 8-token tiles. */
template <int NG>
__device__ __forceinline__ bool lane_any_valid(const ms_args &a, long long n, int tok0, int dlen,
                                               int t4)
{
    bool any = false;
#pragma unroll
    for (int j = 0; j < NG; j++)
        any = any || dtok_valid(a, n, tok0 + j * 8 + 2 * t4, dlen) ||
              dtok_valid(a, n, tok0 + j * 8 + 2 * t4 + 1, dlen);
    return any;
}

/*
 * The streaming kernel (memory-bound shapes: few query rows per document). MT: m16 tiles per
 * warp (rows per unit = 16 * MT); NCH: 32-dim chunks per pass (dim = npass * NCH * 32); NG:
 * 8-token tiles per warp step (NG * NCH 16-byte loads in flight per lane). Persistent: a CTA
 * walks documents with a grid stride, and when its units fit in one round (the rerank case)
 * the warps keep their A fragments in registers for the whole launch.
 */
template <bool BF16, int MT, int NCH, int NG, int W>
__global__ void __launch_bounds__(W * 32, MT >= 4 ? 1 : 3)
    maxsim_mma_kernel(ms_args a, int wm_count, int npass)
{
    constexpr int RM = 16 * MT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int WM = wm_count, WN = W / wm_count;
    const int wm = warp / WN, wn = warp % WN;
    const long long q0 = (long long)blockIdx.y * a.qchunk;
    const int nqc = (int)min((long long)a.qchunk, a.nq - q0);
    const int dim = a.dim;
    const uint16_t *Q = static_cast<const uint16_t *>(a.q);
    const uint16_t *D = static_cast<const uint16_t *>(a.d);

    __shared__ float s_max[W][RM];
    __shared__ float s_part[W];
    __shared__ int s_unit_q[W];
    __shared__ float s_qsum[MS_QCHUNK];
    __shared__ int s_ufirst[MS_QCHUNK + 1];

    chunk_units<RM>(a, q0, nqc, s_ufirst, s_qsum);
    __syncthreads();
    const int units = s_ufirst[nqc];
    /* One round: every warp's unit is the same for every document. */
    const bool resident = units <= WM && npass == 1;
    uint4 af[MT][NCH][2];
    int qi = 0, r0 = 0, qlen = 0;
    long long qstart = 0;
    if (resident && wm < units) {
        while (s_ufirst[qi + 1] <= wm)
            qi++;
        query_range(a, q0 + qi, &qstart, &qlen);
        r0 = (wm - s_ufirst[qi]) * RM;
        load_a<MT, NCH>(af, Q + qstart * dim, r0, qlen, dim, 0, g, t4);
    }

    /* In the resident case the last group of a document prefetches the first group of the
     * CTA's next document, so the pipeline does not drain between documents. */
    uint4 nb[NG][NCH];
    bool have_nb = false;
    for (long long n = blockIdx.x; n < a.nd; n += gridDim.x) {
        long long dstart;
        int dlen;
        doc_range(a, n, &dstart, &dlen);
        const bool nonempty = doc_nonempty(a, n, dlen);
        const uint16_t *Dd = D + dstart * dim;
        if (!resident)
            qi = 0;
        if (!nonempty)
            have_nb = false;
        for (int round = 0; round * WM < units && nonempty; round++) {
            const int u = round * WM + wm;
            float rmax[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                rmax[mt][0] = rmax[mt][1] = -INFINITY;
            if (u < units) {
                if (!resident) {
                    while (s_ufirst[qi + 1] <= u)
                        qi++;
                    query_range(a, q0 + qi, &qstart, &qlen);
                    r0 = (u - s_ufirst[qi]) * RM;
                    if (npass == 1)
                        load_a<MT, NCH>(af, Q + qstart * dim, r0, qlen, dim, 0, g, t4);
                }
                const int step = WN * NG * 8;
                if (npass == 1) {
                    /* Software pipeline: the next group's loads are in flight while this
                     * group's MMAs run, so each warp always has NG * NCH 16-byte loads out. */
                    int tok0 = wn * NG * 8;
                    if (tok0 < dlen && !have_nb)
                        load_b<NG, NCH>(nb, Dd, tok0, dlen, dim, 0, g, t4);
                    have_nb = false;
                    for (; tok0 < dlen; tok0 += step) {
                        uint4 bf[NG][NCH];
                        take_b<NG, NCH>(bf, nb);
                        if (tok0 + step < dlen) {
                            load_b<NG, NCH>(nb, Dd, tok0 + step, dlen, dim, 0, g, t4);
                        } else if (resident && n + gridDim.x < a.nd) {
                            long long ns;
                            int nl;
                            doc_range(a, n + gridDim.x, &ns, &nl);
                            if (wn * NG * 8 < nl) {
                                load_b<NG, NCH>(nb, D + ns * dim, wn * NG * 8, nl, dim, 0, g, t4);
                                have_nb = true;
                            }
                        }
                        float acc[MT][NG][4];
                        zero_acc<MT, NG>(acc);
                        mma_chunks<BF16, MT, NG, NCH>(acc, af, bf);
                        fold_max<MT, NG>(rmax, acc, a, n, tok0, dlen, t4);
                    }
                } else {
                    for (int tok0 = wn * NG * 8; tok0 < dlen; tok0 += step) {
                        float acc[MT][NG][4];
                        zero_acc<MT, NG>(acc);
                        for (int p = 0; p < npass; p++) {
                            const int koff = p * NCH * 32;
                            load_a<MT, NCH>(af, Q + qstart * dim, r0, qlen, dim, koff, g, t4);
                            uint4 bf[NG][NCH];
                            load_b<NG, NCH>(bf, Dd, tok0, dlen, dim, koff, g, t4);
                            mma_chunks<BF16, MT, NG, NCH>(acc, af, bf);
                        }
                        fold_max<MT, NG>(rmax, acc, a, n, tok0, dlen, t4);
                    }
                }
            }
            /* The four lanes of a row group saw different token columns. */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float m = quad_max(rmax[mt][h]);
                    if (t4 == 0)
                        s_max[warp][mt * 16 + g + 8 * h] = m;
                }
            __syncthreads();
            if (wn == 0) {
                float sum = 0.f;
                if (u < units) {
                    for (int r = lane; r < RM; r += 32) {
                        float m = -INFINITY;
                        for (int w = 0; w < WN; w++)
                            m = fmaxf(m, s_max[warp + w][r]);
                        if (qrow_valid(a, q0 + qi, r0 + r, qlen))
                            sum += m;
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    sum += __shfl_xor_sync(0xffffffffu, sum, o);
                if (lane == 0) {
                    s_part[wm] = sum;
                    s_unit_q[wm] = u < units ? qi : -1;
                }
            }
            __syncthreads();
            if (threadIdx.x == 0)
                for (int w = 0; w < WM; w++)
                    if (s_unit_q[w] >= 0)
                        s_qsum[s_unit_q[w]] += s_part[w];
            __syncthreads();
        }
        for (int i = threadIdx.x; i < nqc; i += blockDim.x) {
            a.scores[(q0 + i) * a.nd + n] = nonempty ? s_qsum[i] : KERN_EMPTY_SCORE;
            s_qsum[i] = 0.f;
        }
        __syncthreads();
    }
}

/* The warp kernel for a varlen query longer than one warp's rows (its length is known only on
 * the device): each document streams once per block of 16 * MT rows, unpipelined, documents by
 * a grid stride. A separate branch from the start, so that it shares no live registers with the
 * main path. */
template <bool BF16, int MT, int NCH, int NG>
__device__ __forceinline__ void warp_long_query(const ms_args &a, const uint16_t *Qq, int qlen)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    const uint16_t *D = static_cast<const uint16_t *>(a.d);
    for (long long n = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5); n < a.nd;
         n += warps) {
        long long dstart;
        int dlen;
        doc_range(a, n, &dstart, &dlen);
        const uint16_t *Dd = D + dstart * a.dim;
        float sum = 0.f;
        bool any = false;
        for (int r0 = 0; r0 < qlen; r0 += 16 * MT) {
            uint4 af[MT][NCH][2];
            load_a<MT, NCH>(af, Qq, r0, qlen, a.dim, 0, g, t4);
            float rmax[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                rmax[mt][0] = rmax[mt][1] = -INFINITY;
            for (int tok0 = 0; tok0 < dlen; tok0 += NG * 8) {
                uint4 bf[NG][NCH];
                load_b<NG, NCH>(bf, Dd, tok0, dlen, a.dim, 0, g, t4);
                float acc[MT][NG][4];
                zero_acc<MT, NG>(acc);
                mma_chunks<BF16, MT, NG, NCH>(acc, af, bf);
                fold_max<MT, NG>(rmax, acc, a, n, tok0, dlen, t4);
                any = any || lane_any_valid<NG>(a, n, tok0, dlen, t4);
            }
            sum += rows_sum<MT>(rmax, a, 0, r0, qlen, g, t4);
        }
        const bool nonempty = __any_sync(0xffffffffu, any);
        if (lane == 0)
            a.scores[n] = nonempty ? sum : KERN_EMPTY_SCORE;
    }
}

/*
 * The warp kernel (one query of at most 16 * MT rows, memory-bound: rerank and ragged rerank):
 * every warp streams whole documents, claimed in turn from a counter, with the query's A
 * fragments in registers for the whole launch. No warp waits for others at a document's end
 * (the CTA kernel's warps split a document and meet at barriers, so a short or ragged document
 * leaves some of them idle), and the next document's first tokens are in flight while the
 * current one finishes.
 */
template <bool BF16, int MT, int NCH, int NG>
__global__ void __launch_bounds__(128, MT >= 4   ? 1
                                       : NG >= 4 ? 2
                                                 : 3) maxsim_warp_kernel(ms_args a)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    const int dim = a.dim;
    const uint16_t *Q = static_cast<const uint16_t *>(a.q);
    const uint16_t *D = static_cast<const uint16_t *>(a.d);
    long long qstart;
    int qlen;
    query_range(a, 0, &qstart, &qlen);
    if (qlen > 16 * MT) {
        warp_long_query<BF16, MT, NCH, NG>(a, Q + qstart * dim, qlen);
        return;
    }
    uint4 af[MT][NCH][2];
    load_a<MT, NCH>(af, Q + qstart * dim, 0, qlen, dim, 0, g, t4);

    /* Warp w's first document is w; later ones come from the counter, claimed as a document
     * starts. (Claiming one document ahead, so that the atomic's round trip is never waited
     * for, measured slower: a warp then holds two documents and the tail is longer.) */
    long long n = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    long long dstart = 0;
    int dlen = 0;
    if (n < a.nd)
        doc_range(a, n, &dstart, &dlen);
    uint4 nb[NG][NCH];
    if (n < a.nd && dlen > 0)
        load_b<NG, NCH>(nb, D + dstart * dim, 0, dlen, dim, 0, g, t4);
    while (n < a.nd) {
        unsigned long long t = 0;
        if (lane == 0)
            t = kern_claim();
        const long long nn = warps + (long long)__shfl_sync(0xffffffffu, t, 0);
        long long ns = 0;
        int nl = 0;
        if (nn < a.nd)
            doc_range(a, nn, &ns, &nl);
        bool next_loaded = false;
        float rmax[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            rmax[mt][0] = rmax[mt][1] = -INFINITY;
        bool any = false; /* with document masks: a valid token among this lane's columns */
        const uint16_t *Dd = D + dstart * dim;
        for (int tok0 = 0; tok0 < dlen; tok0 += NG * 8) {
            uint4 bf[NG][NCH];
            take_b<NG, NCH>(bf, nb);
            if (tok0 + NG * 8 < dlen) {
                load_b<NG, NCH>(nb, Dd, tok0 + NG * 8, dlen, dim, 0, g, t4);
            } else if (nl > 0) {
                load_b<NG, NCH>(nb, D + ns * dim, 0, nl, dim, 0, g, t4);
                next_loaded = true;
            }
            float acc[MT][NG][4];
            zero_acc<MT, NG>(acc);
            mma_chunks<BF16, MT, NG, NCH>(acc, af, bf);
            fold_max<MT, NG>(rmax, acc, a, n, tok0, dlen, t4);
            if (a.dmask)
                any = any || lane_any_valid<NG>(a, n, tok0, dlen, t4);
        }
        if (!next_loaded && nl > 0)
            load_b<NG, NCH>(nb, D + ns * dim, 0, nl, dim, 0, g, t4);
        const float sum = rows_sum<MT>(rmax, a, 0, 0, qlen, g, t4);
        const bool nonempty = a.dmask ? __any_sync(0xffffffffu, any) : dlen > 0;
        if (lane == 0)
            a.scores[n] = nonempty ? sum : KERN_EMPTY_SCORE;
        n = nn;
        dstart = ns;
        dlen = nl;
    }
    if (lane == 0)
        kern_claims_done();
}

/*
 * The tile kernel (compute-bound shapes: many query rows per document, e.g. ColPali pages or
 * many queries). Eight warps, each owning a unit of query rows with its A fragments in
 * registers; the document streams through shared memory in tiles of TT tokens (cp.async, two
 * buffers), and every warp multiplies its rows by the whole tile, so each token is fetched from
 * memory once per round instead of once per warp. Rows are padded by 64 bytes so that the 8
 * lanes of a 16-byte shared load phase (two tokens x four 16-byte chunks) hit distinct banks.
 * dim = NCH * 32 (one pass).
 */
constexpr int TL_WARPS = 8, TT = 64;

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

template <bool BF16, int MT, int NCH>
__global__ void __launch_bounds__(TL_WARPS * 32, MT *NCH >= 8 ? 1 : 2) maxsim_tile_kernel(ms_args a)
{
    constexpr int RM = 16 * MT;
    constexpr int DIM = NCH * 32;
    constexpr int ROWH = DIM + 32;      /* row stride in halves: 64 bytes of padding */
    constexpr int NG = MT >= 4 ? 2 : 4; /* 8 independent accumulators per warp */
    __shared__ __align__(16) uint16_t s_tile[2][TT * ROWH];
    __shared__ float s_part[TL_WARPS];
    __shared__ int s_unit_q[TL_WARPS];
    __shared__ float s_qsum[MS_QCHUNK];
    __shared__ int s_ufirst[MS_QCHUNK + 1];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const long long n = blockIdx.x;
    const long long q0 = (long long)blockIdx.y * a.qchunk;
    const int nqc = (int)min((long long)a.qchunk, a.nq - q0);
    const uint16_t *Q = static_cast<const uint16_t *>(a.q);
    const uint16_t *D = static_cast<const uint16_t *>(a.d);

    long long dstart;
    int dlen;
    doc_range(a, n, &dstart, &dlen);
    const bool nonempty = doc_nonempty(a, n, dlen);
    chunk_units<RM>(a, q0, nqc, s_ufirst, s_qsum);
    __syncthreads();
    const int units = s_ufirst[nqc];
    const uint16_t *Dd = D + dstart * DIM;
    const int ntiles = (dlen + TT - 1) / TT;

    /* Tile t into buffer b: TT tokens x DIM/8 16-byte chunks, clamped to the last token. */
    auto load_tile = [&](int t, int b) {
        for (int i = threadIdx.x; i < TT * (DIM / 8); i += TL_WARPS * 32) {
            const int tok = i / (DIM / 8), ch = i % (DIM / 8);
            const int src = min(t * TT + tok, dlen - 1);
            cp_async16(&s_tile[b][tok * ROWH + ch * 8], Dd + (long long)src * DIM + ch * 8);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    int qi = 0;
    for (int round = 0; round * TL_WARPS < units && nonempty; round++) {
        const int u = round * TL_WARPS + warp;
        int r0 = 0, qlen = 0;
        long long qstart = 0;
        uint4 af[MT][NCH][2];
        float rmax[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            rmax[mt][0] = rmax[mt][1] = -INFINITY;
        if (u < units) {
            while (s_ufirst[qi + 1] <= u)
                qi++;
            query_range(a, q0 + qi, &qstart, &qlen);
            r0 = (u - s_ufirst[qi]) * RM;
            load_a<MT, NCH>(af, Q + qstart * DIM, r0, qlen, DIM, 0, g, t4);
        }
        load_tile(0, 0);
        for (int t = 0; t < ntiles; t++) {
            if (t + 1 < ntiles) {
                load_tile(t + 1, (t + 1) & 1);
                asm volatile("cp.async.wait_group 1;\n" ::);
            } else {
                asm volatile("cp.async.wait_group 0;\n" ::);
            }
            __syncthreads();
            if (u < units) {
                const uint16_t *tile = s_tile[t & 1];
#pragma unroll 1
                for (int j0 = 0; j0 < TT / 8; j0 += NG) {
                    float acc[MT][NG][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int j = 0; j < NG; j++)
                            acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#pragma unroll
                    for (int c = 0; c < NCH; c++) {
                        uint4 bf[NG][1];
#pragma unroll
                        for (int j = 0; j < NG; j++)
                            bf[j][0] = *reinterpret_cast<const uint4 *>(
                                tile + ((j0 + j) * 8 + g) * ROWH + c * 32 + t4 * 8);
                        mma_chunk<BF16, MT, NG, NCH, 1>(acc, af, c, bf, 0);
                    }
                    fold_max<MT, NG>(rmax, acc, a, n, t * TT + j0 * 8, dlen, t4);
                }
            }
            __syncthreads();
        }
        /* u is the same across the warp, so the shuffles inside see every lane. */
        const float sum = u < units ? rows_sum<MT>(rmax, a, q0 + qi, r0, qlen, g, t4) : 0.f;
        if (lane == 0) {
            s_part[warp] = sum;
            s_unit_q[warp] = u < units ? qi : -1;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int w = 0; w < TL_WARPS; w++)
                if (s_unit_q[w] >= 0)
                    s_qsum[s_unit_q[w]] += s_part[w];
        __syncthreads();
    }
    for (int i = threadIdx.x; i < nqc; i += blockDim.x)
        a.scores[(q0 + i) * a.nd + n] = nonempty ? s_qsum[i] : KERN_EMPTY_SCORE;
}

template <int DT> __device__ __forceinline__ float load_elem(const void *p, long long i)
{
    if (DT == KERN_F32)
        return static_cast<const float *>(p)[i];
    if (DT == KERN_E4M3) { /* exact: every e4m3 value is a half */
        const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const uint8_t *>(p)[i], __NV_E4M3);
        return __half2float(__half(h));
    }
    uint32_t h = static_cast<const uint16_t *>(p)[i];
    if (DT == KERN_BF16)
        return __uint_as_float(h << 16);
    return __half2float(__ushort_as_half((unsigned short)h));
}

/* Exact fp32 path on the CUDA cores: one CTA per (document, query). */
template <int DT> __global__ void maxsim_simple_kernel(ms_args a)
{
    const long long n = blockIdx.x, q = blockIdx.y;
    __shared__ float s_red[32];
    long long dstart, qstart;
    int dlen, qlen;
    doc_range(a, n, &dstart, &dlen);
    query_range(a, q, &qstart, &qlen);
    const bool nonempty = doc_nonempty(a, n, dlen);
    float sum = 0.f;
    for (int r = 0; r < qlen && nonempty; r++) {
        if (!qrow_valid(a, q, r, qlen))
            continue;
        float m = -INFINITY;
        for (int t = threadIdx.x; t < dlen; t += blockDim.x) {
            if (!dtok_valid(a, n, t, dlen))
                continue;
            float s = 0.f;
            const long long qi = (qstart + r) * a.dim, di = (dstart + t) * a.dim;
            for (int j = 0; j < a.dim; j++)
                s = fmaf(load_elem<DT>(a.q, qi + j), load_elem<DT>(a.d, di + j), s);
            m = fmaxf(m, s);
        }
        for (int o = 16; o > 0; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if ((threadIdx.x & 31) == 0)
            s_red[threadIdx.x >> 5] = m;
        __syncthreads();
        if (threadIdx.x == 0) {
            float mm = -INFINITY;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++)
                mm = fmaxf(mm, s_red[w]);
            sum += mm;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        a.scores[q * a.nd + n] = nonempty ? sum : KERN_EMPTY_SCORE;
}

/* The streaming kernel on a persistent grid: as many CTAs as fit at once, at most one per
 * document per query chunk. */
template <bool BF16, int MT, int NCH, int W>
int launch_stream_w(const ms_args &a, int wm, unsigned qblocks)
{
    constexpr int NG = 2;
    long long want = 0;
    int rc =
        kern_resident_ctas((const void *)maxsim_mma_kernel<BF16, MT, NCH, NG, W>, W * 32, 0, &want);
    if (rc != KERN_OK)
        return rc;
    want /= qblocks;
    if (want < 1)
        want = 1;
    const unsigned blocks = (unsigned)(a.nd < want ? a.nd : want);
    maxsim_mma_kernel<BF16, MT, NCH, NG, W>
        <<<dim3(blocks, qblocks), W * 32>>>(a, wm, a.dim / (32 * NCH));
    KERN_CUDA_LAUNCHED("maxsim_mma_kernel");
    return KERN_OK;
}

/* The warp kernel on a persistent grid, its documents claimed from claim_cuda.cuh's counter. */
template <bool BF16, int MT, int NCH, int NG> int launch_warp_ng(const ms_args &a)
{
    int blocks = 0;
    int rc = kern_persistent_grid((const void *)maxsim_warp_kernel<BF16, MT, NCH, NG>, 128, 0,
                                  (a.nd + 3) / 4, &blocks);
    if (rc != KERN_OK)
        return rc;
    maxsim_warp_kernel<BF16, MT, NCH, NG><<<blocks, 128>>>(a);
    KERN_CUDA_LAUNCHED("maxsim_warp_kernel");
    return KERN_OK;
}

/* NG 8-token tiles in flight per warp: 4 (242 registers, 8 warps an SM) measured 1-3% faster
 * than 2 (168 registers, 12 warps) on the 10k rerank and ragged shapes, the same on 1k; 2 for
 * 64-row queries, whose A fragments leave no room. tune.stream_tiles forces either. */
template <bool BF16, int MT, int NCH> int launch_warp(const ms_args &a)
{
    const bool four = MT < 4 && kern_gpu_tune.stream_tiles != 2;
    return four ? launch_warp_ng<BF16, MT, NCH, 4>(a) : launch_warp_ng<BF16, MT, NCH, 2>(a);
}

template <bool BF16, int MT> int launch_warp_nch(const ms_args &a, int nch)
{
    switch (nch) {
    case 4:
        return launch_warp<BF16, MT, 4>(a);
    case 3:
        return launch_warp<BF16, MT, 3>(a);
    case 2:
        return launch_warp<BF16, MT, 2>(a);
    default:
        return launch_warp<BF16, MT, 1>(a);
    }
}

/* Four warps per CTA: eight would split short documents finer, but at the 128 registers
 * that two such CTAs per SM allow the kernel spills heavily (ptxas: 792 bytes). */
template <bool BF16, int MT, int NCH> int launch_stream(const ms_args &a, int wm, unsigned qblocks)
{
    return launch_stream_w<BF16, MT, NCH, 4>(a, wm, qblocks);
}

template <bool BF16, int MT>
int launch_stream_nch(const ms_args &a, int nch, int wm, unsigned qblocks)
{
    switch (nch) {
    case 4:
        return launch_stream<BF16, MT, 4>(a, wm, qblocks);
    case 3:
        return launch_stream<BF16, MT, 3>(a, wm, qblocks);
    case 2:
        return launch_stream<BF16, MT, 2>(a, wm, qblocks);
    default:
        return launch_stream<BF16, MT, 1>(a, wm, qblocks);
    }
}

template <bool BF16, int MT> int launch_tile_nch(const ms_args &a, int nch, dim3 grid)
{
    switch (nch) {
    case 4:
        maxsim_tile_kernel<BF16, MT, 4><<<grid, TL_WARPS * 32>>>(a);
        break;
    case 3:
        maxsim_tile_kernel<BF16, MT, 3><<<grid, TL_WARPS * 32>>>(a);
        break;
    default:
        maxsim_tile_kernel<BF16, MT, 2><<<grid, TL_WARPS * 32>>>(a);
        break;
    }
    KERN_CUDA_LAUNCHED("maxsim_tile_kernel");
    return KERN_OK;
}

template <bool BF16> int launch_mma(const ms_args &a, int mt, int nch, int wm, bool tile,
                                     bool warp)
{
    if (warp)
        return mt == 1   ? launch_warp_nch<BF16, 1>(a, nch)
               : mt == 4 ? launch_warp_nch<BF16, 4>(a, nch)
                         : launch_warp_nch<BF16, 2>(a, nch);
    const unsigned qblocks = (unsigned)((a.nq + a.qchunk - 1) / a.qchunk);
    if (tile) {
        dim3 grid((unsigned)a.nd, qblocks);
        return mt == 1   ? launch_tile_nch<BF16, 1>(a, nch, grid)
               : mt == 4 ? launch_tile_nch<BF16, 4>(a, nch, grid)
                         : launch_tile_nch<BF16, 2>(a, nch, grid);
    }
    return mt == 1   ? launch_stream_nch<BF16, 1>(a, nch, wm, qblocks)
           : mt == 4 ? launch_stream_nch<BF16, 4>(a, nch, wm, qblocks)
                     : launch_stream_nch<BF16, 2>(a, nch, wm, qblocks);
}

/* The wgmma path (dense queries and documents, no document masks, dim 64/96/128, sm_90a) for
 * a call of input type dt: 1 and *rc its status when it ran the call, or when tune.dense_path 2
 * forces it and it cannot (KERN_EINVAL, with why); 0 to take another path. */
int try_wgmma(int dt, const ms_args &a, int *rc)
{
    wg_dense w = {dt, a.dim, a.q, a.qmask, a.nq, a.lq, a.d, a.nd, a.ld, a.scores};
    const char *why = "varlen or masked documents";
    if (!a.q_off && !a.d_off && !a.dmask && kern_wgmma_usable(&w, &why)) {
        *rc = kern_wgmma_maxsim_dense(&w);
        return 1;
    }
    if (kern_gpu_tune.dense_path != 2)
        return 0;
    kern_set_error("maxsim (cuda): the wgmma path cannot run this call: %s", why);
    *rc = KERN_EINVAL;
    return 1;
}

int run_maxsim(kern_dtype dtype, ms_args a, long long max_lq)
{
    cudaGetLastError(); /* a stale error of an earlier, unrelated call is not this call's */
    if (a.nd > 0x7fffffffLL || a.nq > 65535LL * MS_QCHUNK) {
        kern_set_error("maxsim (cuda): %lld documents x %lld queries exceed one launch", a.nd,
                       a.nq);
        return KERN_EINVAL;
    }
    const size_t es = kern_dtype_size(dtype);
    const bool aligned = ((uintptr_t)a.q % 16 == 0) && ((uintptr_t)a.d % 16 == 0);
    const bool fast = dtype != KERN_F32 && a.dim % 32 == 0 && aligned && es == 2;
    int rc;
    if (dtype == KERN_E4M3) {
        /* FP8: many query rows a document (8 or more units of 32, dense) go to the wgmma kernel
         * on sm_90; few rows to the streaming e4m3 mma.sync kernel (sm_89+, no masks); the
         * rest to the wgmma kernel where it can take them, else to the exact fp32 path below.
         * tune.dense_path 2 forces the wgmma kernel, 1 keeps calls off it. */
        const int path = kern_gpu_tune.dense_path;
        const bool many = max_lq >= 0 && a.nq * ((max_lq + 31) / 32) >= 8;
        if ((path == 2 || (many && path != 1)) && try_wgmma(WG_E4M3, a, &rc))
            return rc;
        if (!a.qmask && !a.dmask && kern_gpu_e4m3_stream_usable((size_t)a.dim, a.q, a.d))
            return kern_gpu_maxsim_e4m3_stream(a.q, a.q_off, (size_t)a.nq, (size_t)a.lq, a.d,
                                               a.d_off, (size_t)a.nd, (size_t)a.ld, (size_t)a.dim,
                                               a.scores);
        if (path != 1 && try_wgmma(WG_E4M3, a, &rc))
            return rc;
    }
    if (fast) {
        const int c32 = a.dim / 32;
        const int nch = c32 % 4 == 0 ? 4 : c32 % 3 == 0 ? 3 : c32 % 2 == 0 ? 2 : 1;
        /* Rows per warp: as many as the query has, up to 64 (register budget). max_lq < 0:
         * unknown (varlen), take 32. */
        const int mt = max_lq >= 0 && max_lq <= 16 ? 1 : max_lq > 32 ? 4 : 2;
        a.qchunk = (int)(a.nq < MS_QCHUNK ? a.nq : MS_QCHUNK);
        const long long per_q = max_lq >= 0 ? (max_lq + 16 * mt - 1) / (16 * mt) : 1;
        const long long units = per_q * a.qchunk;
        const int wm = units >= 4 ? 4 : units >= 2 ? 2 : 1;
        /* Many query rows per document (>= 8 units): arithmetic dominates, so share each
         * document tile among eight warps through shared memory. Needs one pass (dim <= 128). */
        const bool tile = units >= 8 && c32 == nch && nch >= 2;
        /* On sm_90 the same shapes go to the warpgroup-MMA kernel (dense queries, no
         * document masks, dim 64/96/128); tune.dense_path 1 or 2 forces one of the two. */
        const int path = kern_gpu_tune.dense_path;
        if (((tile && path != 1) || path == 2) &&
            try_wgmma(dtype == KERN_BF16 ? WG_BF16 : WG_F16, a, &rc))
            return rc;
        /* One query, one pass: the warp kernel (tune.stream_path 1 forces the CTA kernel). */
        const bool warp_ok = a.nq == 1 && c32 == nch && !tile && (max_lq < 0 || max_lq <= 16 * mt);
        const int sp = kern_gpu_tune.stream_path;
        const bool warp = warp_ok && sp != 1;
        return dtype == KERN_BF16 ? launch_mma<true>(a, mt, nch, wm, tile, warp)
                                  : launch_mma<false>(a, mt, nch, wm, tile, warp);
    }
    if (a.nq > 65535) {
        kern_set_error("maxsim (cuda): %lld queries exceed one launch of the fp32 path", a.nq);
        return KERN_EINVAL;
    }
    a.qchunk = 1;
    dim3 grid((unsigned)a.nd, (unsigned)a.nq);
    switch (dtype) {
    case KERN_F32:
        maxsim_simple_kernel<KERN_F32><<<grid, 128>>>(a);
        break;
    case KERN_F16:
        maxsim_simple_kernel<KERN_F16><<<grid, 128>>>(a);
        break;
    case KERN_E4M3:
        maxsim_simple_kernel<KERN_E4M3><<<grid, 128>>>(a);
        break;
    default:
        maxsim_simple_kernel<KERN_BF16><<<grid, 128>>>(a);
        break;
    }
    KERN_CUDA_LAUNCHED("maxsim_simple_kernel");
    return KERN_OK;
}

} // namespace

extern "C" int kern_gpu_maxsim_dense(const kern_dense *a, float *scores)
{
    if (a->dim > 0x7fffffff || a->ld > 0x7fffffff || a->lq > 0x7fffffff) {
        kern_set_error("maxsim_dense (cuda): dim or lengths beyond 2^31");
        return KERN_EINVAL;
    }
    ms_args m = {};
    m.q = a->q;
    m.qmask = a->qmask;
    m.nq = (long long)a->nq;
    m.lq = (long long)a->lq;
    m.d = a->d;
    m.dmask = a->dmask;
    m.nd = (long long)a->nd;
    m.ld = (long long)a->ld;
    m.dim = (int)a->dim;
    m.scores = scores;
    return run_maxsim(a->dtype, m, m.lq);
}

extern "C" int kern_gpu_maxsim_varlen(const kern_varlen *a, float *scores)
{
    if (a->dim > 0x7fffffff) {
        kern_set_error("maxsim_varlen (cuda): dim beyond 2^31");
        return KERN_EINVAL;
    }
    ms_args m = {};
    m.q = a->q;
    m.q_off = a->q_off;
    m.nq = (long long)a->nq;
    m.d = a->d;
    m.d_off = a->d_off;
    m.nd = (long long)a->nd;
    m.dim = (int)a->dim;
    m.scores = scores;
    return run_maxsim(a->dtype, m, -1);
}
