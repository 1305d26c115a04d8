/*
 * maxsim_wgmma_cuda.cu: dense MaxSim for many query rows per document (many queries at once,
 * ColPali's 1024-token queries) on Hopper, through the warpgroup MMA (wgmma, sm_90a).
 *
 * The roles are swapped against the mma.sync kernels: the document tile is the MMA's A
 * (M = 64 tokens) and a block of NB query rows is its B (N = NB, 128 or 256), both read by the
 * tensor cores straight from shared memory. One warpgroup (128 threads) is a CTA; its NB query
 * rows stay in shared memory while the documents stream through a ring of 64-token tiles
 * (cp.async, two tiles ahead with three stages). A tile costs dim/16 wgmma instructions of
 * 64 x 128 x 16 for each 128 rows of the block, one commit group per 128 rows, then each thread
 * folds its accumulators into a running max per query row (the max is over tokens, the MMA's M:
 * a thread's two token rows per column fold in registers, the rest at the document's end
 * through shuffles and shared memory); the first half's fold runs while the second half's MMAs
 * do. So the query-token x document-token table exists only as one tile's accumulators.
 *
 * Why swapped: with the queries as B, 256 rows share one load of each document tile (half the
 * L2 traffic of 128-row blocks) and the accumulators of a 64 x 256 tile fit one warpgroup.
 * Where there are 512 rows or more, a CTA is two such warpgroups with 256 rows each, sharing
 * every tile (half the L2 traffic again; one CTA an SM).
 *
 * Shared-memory layout (no swizzle, the "interleaved" canonical layout): a core matrix is 8 rows
 * x 16 bytes, stored as 128 contiguous bytes; core matrices adjacent in the row direction are
 * 128 bytes apart (SBO), those adjacent along the embedding dimension one slab apart (LBO: 64
 * tokens x 16 bytes for a tile, NB x 16 for the query block). cp.async fills it with thread
 * pairs reading a token's 32 contiguous bytes (whole sectors).
 *
 * Work: items are (document, row block) pairs, document-major, on a persistent grid whose size
 * is a multiple of the row-block count, so a CTA keeps one row block for the whole launch and
 * the CTAs sharing a document run at the same time (the document comes from DRAM once). A row
 * block holds whole queries when a query has at most NB rows; a longer query spans several
 * blocks, each writes its part of the sum to scratch, and a second kernel adds the parts in
 * block order. Every sum is formed in a fixed order, so results are deterministic.
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
    const uint16_t *q;
    const uint8_t *qmask;
    long long nq, lq;
    const uint16_t *d;
    long long nd, ld;
    float *scores;
    float *part;   /* [nq][nbq][nd] when queries span blocks */
    int upq;       /* 16-row units per query */
    int qpb;       /* whole queries per row block; 0 when a query spans blocks */
    int nbq;       /* row blocks per query when it spans them */
    long long nrb; /* row blocks */
    long long items;
    int docmajor; /* items document-major (grid a multiple of nrb) or block-major */
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

/* d (+)= A(desc) x B(desc): m64 x n128 x k16, fp32 accumulators; acc = 0 overwrites d. T: the
 * input type's PTX name. */
#define WG_MMA128(T)                                                                               \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                   \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {" WG_S64                           \
    "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
template <bool BF16>
__device__ __forceinline__ void wg_mma(float (&d)[64], uint64_t da, uint64_t db, int acc)
{
    if (BF16)
        asm volatile(WG_MMA128("bf16") : WG_F64 : "l"(da), "l"(db), "r"(acc));
    else
        asm volatile(WG_MMA128("f16") : WG_F64 : "l"(da), "l"(db), "r"(acc));
}

/* Waits until at most N of this warpgroup's MMA groups are pending; the accumulators of the
 * group waited for are operands, so that no read of them is moved above the wait. */
template <int N> __device__ __forceinline__ void wg_wait(float (&d)[64])
{
    asm volatile("wgmma.wait_group.sync.aligned %64;\n" : WG_F64 : "n"(N) : "memory");
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

/*
 * BF16: bf16 or fp16; KS: dim / 16; NB: query rows per warpgroup; ST: tile stages; WGS:
 * warpgroups per CTA, each with its own NB rows of the block, all sharing the tiles.
 */
template <bool BF16, int KS, int NB, int ST, int WGS>
__global__ void __launch_bounds__(128 * WGS, WGS == 1 ? 2 : 1) maxsim_wgmma_kernel(wg_args a)
{
#ifdef WG_ARCH
    constexpr int T = 128 * WGS;               /* threads */
    constexpr int RB = NB * WGS;               /* query rows per block */
    constexpr int DIM = KS * 16, KC = DIM / 8; /* 16-byte chunks per row */
    constexpr int UB = RB / 16;                /* units per block */
    constexpr int QSLAB = RB * 16, TSLAB = WG_TOK * 16;
    constexpr int QBYTES = KC * QSLAB, TBYTES = KC * TSLAB;
    static_assert(TBYTES >= 4 * RB * (int)sizeof(float), "a stage holds the reduction");
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ float s_usum[UB];
    __shared__ long long s_uq[UB]; /* unit -> query, or -1 for padding */
    __shared__ int s_ur0[UB];      /* unit -> first row */

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const long long G = gridDim.x;
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t st = sq + QBYTES;
    const int nt = (int)((a.ld + WG_TOK - 1) / WG_TOK);

    /* Items as (row block, document) cursors, advanced by the grid without dividing per tile:
     * document-major grids are a multiple of nrb, so the row block never changes there. */
    const long long dstep = a.docmajor ? G / a.nrb : 0;
    auto first = [&](long long &rb, long long &n) {
        const long long it = blockIdx.x;
        rb = a.docmajor ? it % a.nrb : it / a.nd;
        n = a.docmajor ? it / a.nrb : it % a.nd;
    };
    auto advance = [&](long long &rb, long long &n) {
        if (a.docmajor) {
            n += dstep;
        } else {
            n += G;
            if (n >= a.nd) {
                rb += n / a.nd;
                n %= a.nd;
            }
        }
    };
    auto live = [&](long long rb, long long n) { return a.docmajor ? n < a.nd : rb < a.nrb; };

    /* The load cursor: the next tile of this CTA's stream (its items' tiles in order) goes to
     * stage l_slot; one commit group per call, empty past the end. */
    long long l_rb, l_n;
    first(l_rb, l_n);
    bool l_live = nt > 0 && live(l_rb, l_n);
    int l_t = 0, l_slot = 0;
    auto issue = [&]() {
        if (l_live) {
            /* Thread pairs take a token's 32 contiguous bytes: pair p = tid / 2 copies chunks
             * 2k + (tid & 1), k = p / 64, p / 64 + WGS, ... < KC / 2, of token p % 64 (the
             * last token repeats past the end; masked later). */
            const int tok = (tid >> 1) & (WG_TOK - 1), lo = tid & 1, k0 = tid >> 7;
            const uint16_t *src =
                a.d + (l_n * a.ld + min((long long)l_t * WG_TOK + tok, a.ld - 1)) * DIM + lo * 8;
            const uint32_t dst = st + (uint32_t)l_slot * TBYTES + lo * TSLAB + tok * 16;
#pragma unroll
            for (int k = k0; k < KC / 2; k += WGS)
                cp16(dst + 2 * k * TSLAB, src + 2 * k * 8);
            l_slot = l_slot + 1 == ST ? 0 : l_slot + 1;
            if (++l_t == nt) {
                l_t = 0;
                advance(l_rb, l_n);
                l_live = live(l_rb, l_n);
            }
        }
        cp_commit();
    };

    /* The query rows of block rb into shared memory (plain loads: once per launch, mostly),
     * and the block's unit table. */
    auto load_q = [&](long long rb) {
        if (tid < UB) {
            long long q;
            int r0;
            const bool ok = unit_rows<UB>(a, rb, tid, &q, &r0);
            s_uq[tid] = ok ? q : -1;
            s_ur0[tid] = ok ? r0 : 0;
        }
        __syncthreads();
#pragma unroll 4
        for (int k = 0; k < RB * KC / T; k++) {
            const int i = tid + T * k;
            const int row = (i >> 1) % RB, kc = (i / (2 * RB)) * 2 + (i & 1);
            const long long q = s_uq[row >> 4];
            const uint16_t *src = a.q + kc * 8;
            if (q >= 0)
                src += (q * a.lq + min((long long)s_ur0[row >> 4] + (row & 15), a.lq - 1)) * DIM;
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(src));
            *reinterpret_cast<uint4 *>(smem + kc * QSLAB + row * 16) = v;
        }
        proxy_fence();
        __syncthreads();
    };

    long long rb, n;
    first(rb, n);
    long long cur_rb = -1;
    if (live(rb, n)) {
        cur_rb = rb;
        load_q(cur_rb);
    }
    for (int s = 0; s < ST - 1; s++)
        issue();

    int c_slot = 0;
    for (; live(rb, n); advance(rb, n)) {
        if (rb != cur_rb) {
            cp_wait<0>();
            __syncthreads();
            load_q(rb);
            cur_rb = rb;
        }
        float rmax[NB / 4];
#pragma unroll
        for (int i = 0; i < NB / 4; i++)
            rmax[i] = -INFINITY;
        int last_slot = 0;
        for (int t = 0; t < nt; t++) {
            cp_wait<ST - 2>();
            proxy_fence();
            __syncthreads();
            issue();
            const uint32_t ta = st + (uint32_t)c_slot * TBYTES;
            last_slot = c_slot;
            c_slot = c_slot + 1 == ST ? 0 : c_slot + 1;
            /* The block's rows in halves of 128 (m64n128k16), one commit group each: the
             * first half's max folds while the second half's MMAs run. */
            constexpr int H = NB / 128;
            float acc[H][64];
            wg_fence();
#pragma unroll
            for (int h = 0; h < H; h++) {
#pragma unroll
                for (int s = 0; s < KS; s++)
                    wg_mma<BF16>(
                        acc[h], wg_desc(ta + 2 * s * TSLAB, TSLAB, 128),
                        wg_desc(sq + 2 * s * QSLAB + (wg * NB / 8 + h * 16) * 128, QSLAB, 128), s);
                wg_commit();
            }
            /* acc[h][4j + e]: token warp*16 + g, query row NB*wg + 128h + 8j + 2*t4 + e;
             * acc[h][4j + 2 + e]: token +8. */
            const int rem = (int)min((long long)WG_TOK, a.ld - (long long)t * WG_TOK);
            const int tok = warp * 16 + g;
#pragma unroll
            for (int h = 0; h < H; h++) {
                if (h + 1 < H)
                    wg_wait<1>(acc[h]);
                else
                    wg_wait<0>(acc[h]);
                float *rm = rmax + 32 * h;
                if (tok + 8 < rem) {
#pragma unroll
                    for (int j = 0; j < 16; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            rm[2 * j + e] =
                                fmaxf(rm[2 * j + e], fmaxf(acc[h][4 * j + e], acc[h][4 * j + 2 + e]));
                } else if (tok < rem) {
#pragma unroll
                    for (int j = 0; j < 16; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            rm[2 * j + e] = fmaxf(rm[2 * j + e], acc[h][4 * j + e]);
                }
            }
        }
        /* The document's end: max over the 8 token rows of the lanes, then over the 4 warps of
         * the warpgroup, through the stage of the last tile (free until the next issue, after
         * a barrier). */
        if (nt > 0) {
            float(*s_red)[RB] = reinterpret_cast<float(*)[RB]>(smem + QBYTES + last_slot * TBYTES);
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
            __syncthreads();
            for (int c = tid; c < RB; c += T) {
                const float m =
                    fmaxf(fmaxf(s_red[0][c], s_red[1][c]), fmaxf(s_red[2][c], s_red[3][c]));
                const long long q = s_uq[c >> 4];
                const int r = s_ur0[c >> 4] + (c & 15);
                const bool valid = q >= 0 && r < a.lq && (!a.qmask || a.qmask[q * a.lq + r]);
                s_red[0][c] = valid ? m : 0.f;
            }
            __syncthreads();
            if (tid < UB) {
                float s = 0.f;
                for (int i = 0; i < 16; i++)
                    s += s_red[0][tid * 16 + i];
                s_usum[tid] = s;
            }
            __syncthreads();
        }
        if (a.qpb) {
            for (int i = tid; i < a.qpb; i += T) {
                const long long q = rb * a.qpb + i;
                if (q >= a.nq)
                    break;
                float s = 0.f;
                for (int u = i * a.upq; u < (i + 1) * a.upq && nt > 0; u++)
                    s += s_usum[u];
                a.scores[q * a.nd + n] = nt > 0 ? s : KERN_EMPTY_SCORE;
            }
        } else if (tid == 0) {
            float s = 0.f;
            for (int u = 0; u < UB && nt > 0; u++)
                s += s_usum[u];
            a.part[rb * a.nd + n] = s; /* rb = q * nbq + part */
        }
    }
    cp_wait<0>();
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
        a.scores[i] = a.ld > 0 ? s : KERN_EMPTY_SCORE;
    }
}

template <bool BF16, int KS, int NB, int ST, int WGS> int launch(wg_args a)
{
    const void *fn = (const void *)maxsim_wgmma_kernel<BF16, KS, NB, ST, WGS>;
    const int smem = KS * 16 * 2 * (NB * WGS + ST * WG_TOK);
    KERN_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int dev = 0, sms = 0, per_sm = 0;
    KERN_CUDA_TRY(cudaGetDevice(&dev));
    KERN_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KERN_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 128 * WGS, smem));
    long long g = (long long)sms * (per_sm > 0 ? per_sm : 1);
    a.docmajor = a.nrb <= g;
    if (a.docmajor)
        g = g / a.nrb * a.nrb;
    if (g > a.items)
        g = a.items;
    if (g < 1)
        g = 1;
    maxsim_wgmma_kernel<BF16, KS, NB, ST, WGS><<<(unsigned)g, 128 * WGS, smem>>>(a);
    KERN_CUDA_LAUNCHED("maxsim_wgmma_kernel");
    return KERN_OK;
}

/* RB: query rows per block. 512: two warpgroups of 256 rows, one CTA an SM (128 KB of rows
 * and 4 stages at dim 128); 256: one warpgroup, two CTAs an SM, 3 stages (64 + 48 KB); 128:
 * three CTAs an SM, 2 stages. */
template <bool BF16, int RB> int launch_ks(const wg_args &a, int ks)
{
    constexpr int NB = RB == 512 ? 256 : RB, WGS = RB / NB;
    constexpr int ST = RB == 512 ? 4 : RB == 256 ? 3 : 2;
    switch (ks) {
    case 4:
        return launch<BF16, 4, NB, ST, WGS>(a);
    case 6:
        return launch<BF16, 6, NB, ST, WGS>(a);
    default:
        return launch<BF16, 8, NB, ST, WGS>(a);
    }
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
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        cudaGetLastError();
        *why = "no device";
        return 0;
    }
    if (major != 9 || minor != 0) {
        *why = "the device is not sm_90";
        return 0;
    }
    /* Queries longer than a block write parts to scratch: keep that small beside the
     * documents (the call's memory stays within its inputs). */
    const long long upq = (a->lq + 15) / 16;
    const long long nbq = (upq + 15) / 16;
    if (nbq > 1 && a->nq * nbq * a->nd * 4 > a->nd * a->ld * a->dim * 2 / 64) {
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
    a.q = static_cast<const uint16_t *>(d->q);
    a.qmask = d->qmask;
    a.nq = d->nq;
    a.lq = d->lq;
    a.d = static_cast<const uint16_t *>(d->d);
    a.nd = d->nd;
    a.ld = d->ld;
    a.scores = d->scores;
    if (a.nq == 0 || a.nd == 0)
        return KERN_OK;
    a.upq = (int)((a.lq + 15) / 16);
    /* Rows a block: 128 when all rows fit in one, 512 when there are 512 or more, else 256
     * (tune.wgmma_rows overrides). */
    const int tr = kern_gpu_tune.wgmma_rows;
    const int nb = tr == 128 || tr == 256 || tr == 512 ? tr
                   : a.nq * a.upq <= 8                 ? 128
                   : a.nq * a.upq >= 32                ? 512
                                                       : 256;
    const int ub = nb / 16;
    if (a.upq <= ub) {
        a.qpb = ub / a.upq;
        a.nrb = (a.nq + a.qpb - 1) / a.qpb;
    } else {
        a.nbq = (a.upq + ub - 1) / ub;
        a.nrb = a.nq * a.nbq;
    }
    a.items = a.nrb * a.nd;
    size_t part_bytes = 0;
    if (!a.qpb) {
        part_bytes = (size_t)a.nq * a.nbq * a.nd * sizeof(float);
        int rc = kern_scratch((void **)&a.part, part_bytes);
        if (rc != KERN_OK)
            return rc;
    }
    const int ks = d->dim / 16;
    int rc = d->bf16 ? (nb == 512   ? launch_ks<true, 512>(a, ks)
                        : nb == 256 ? launch_ks<true, 256>(a, ks)
                                    : launch_ks<true, 128>(a, ks))
                     : (nb == 512   ? launch_ks<false, 512>(a, ks)
                        : nb == 256 ? launch_ks<false, 256>(a, ks)
                                    : launch_ks<false, 128>(a, ks));
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
