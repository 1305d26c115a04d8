/*
 * centroid_cuda.cu: query x centroid scores S = Q C^T in fp32 on CUDA GPUs (PLAID stage 1 and
 * the q . C[code] table that the residual kernel reads).
 *
 * fp32 accuracy, not tf32's: S is the main term of every residual score, and tf32's 10-bit
 * mantissa would cost more accuracy than the residual codec itself. Two kernels: for problems
 * of at least one 128 x 128 tile (GPU search batches, k-means assignment), the tensor cores
 * with each operand split in two tf32 parts (3xTF32, below); for small ones and odd dims, the
 * CUDA cores: a 64 x 64 output tile per CTA, both operands staged through shared memory in
 * 16-dim slices, 4 x 4 outputs per thread. A third kernel serves GPU searches, whose
 * centroids are fp16 numbers: two fp16 tensor-core passes (kern_cuda_centroid_scores_f16).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.cuh"
#include "order_key_cuda.cuh"

namespace
{

constexpr int TM = 64, TN = 64, TK = 16;

__global__ void __launch_bounds__(256)
    centroid_scores_kernel(const float *__restrict__ Q, const float *__restrict__ C, long long lq,
                           long long nc, long long dim, float *__restrict__ S)
{
    __shared__ float sq[TK][TM + 4];
    __shared__ float sc[TK][TN + 4];
    const long long m0 = (long long)blockIdx.y * TM, n0 = (long long)blockIdx.x * TN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (long long k0 = 0; k0 < dim; k0 += TK) {
        /* 256 threads load 64 x 16 of each operand: 4 elements each, k fastest (coalesced). */
        for (int i = threadIdx.x; i < TM * TK; i += 256) {
            const int r = i / TK, k = i % TK;
            const long long gm = m0 + r, gn = n0 + r, gk = k0 + k;
            sq[k][r] = (gm < lq && gk < dim) ? Q[gm * dim + gk] : 0.f;
            sc[k][r] = (gn < nc && gk < dim) ? C[gn * dim + gk] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = sq[k][ty + 16 * i];
                b[i] = sc[k][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const long long gm = m0 + ty + 16 * i;
        if (gm >= lq)
            continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const long long gn = n0 + tx + 16 * j;
            if (gn < nc)
                S[gm * nc + gn] = acc[i][j];
        }
    }
}

/*
 * The same product on the tensor cores at fp32 accuracy ("3xTF32"): each operand x splits into
 * hi = tf32(x) and lo = tf32(x - hi), and S = hi.hi + hi.lo + lo.hi, each term an mma.sync
 * m16n8k8 tf32 with fp32 accumulation; the dropped lo.lo term and the rounding of lo are
 * about 2^-22 of each product, the order of fp32's own rounding. A 128 x 128 output tile per
 * CTA of 8 warps (2 x 4, each 64 x 32), operands staged through shared memory in 32-dim slices
 * (rows padded to 36 floats: the fragment loads hit 32 distinct banks). Needs dim % 4 == 0 and
 * 16-byte aligned rows (float4 loads); other shapes take the SIMT kernel above.
 */
constexpr int XM = 128, XN = 128, XK = 32, XLD = XK + 4;

__device__ __forceinline__ uint32_t tf32_of(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void split_tf32(float x, uint32_t &hi, uint32_t &lo)
{
    hi = tf32_of(x);
    lo = tf32_of(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* A score as the int8 copy holds it: round(127 s), s clamped to [-1, 1] (NaN: -127); the same
 * numbers as kern_f32_to_i8. */
__device__ __forceinline__ signed char to_i8(float v)
{
    return (signed char)__float2int_rn(fminf(fmaxf(v * 127.f, -127.f), 127.f));
}

/* Where the narrow copy holds score (m, n) of S [rows, cols]: in the block of column n
 * (blk, kernels.h), or at m * cols + n without blocks. */
__device__ __forceinline__ long long copy_at(const int *__restrict__ blk, long long m, long long n,
                                             long long rows, long long cols)
{
    if (!blk)
        return m * cols + n;
    const long long b = blk[2 * n], w = blk[2 * n + 1];
    return b * rows + m * w + (n - b);
}

/* A warp's 64 x 32 block of S [rows, cols] (NULL: not written) from its m16n8 accumulator
 * fragments (lane (g, t4) holds rows g and g + 8 at columns 2 t4 and 2 t4 + 1 of each tile),
 * from (m0, n0); pairs of columns as one 8-byte store where the row layout allows. S16 (NULL:
 * none) gets the same values rounded to fp16, S8 (NULL: none) as int8 (to_i8), both at
 * copy_at. */
__device__ __forceinline__ void store_tile(const float (&acc)[4][4][4], float *__restrict__ S,
                                           __half *__restrict__ S16, signed char *__restrict__ S8,
                                           const int *__restrict__ blk, long long m0, long long n0,
                                           long long rows, long long cols, int g, int t4)
{
    const bool pairs = cols % 2 == 0 && (uintptr_t)S % 8 == 0;
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        const long long n = n0 + nt * 8 + 2 * t4;
        /* The copy's places of this lane's two columns at row 0, and their row strides. */
        long long c0 = 0, c1 = 0, w0 = cols, w1 = cols;
        if ((S16 || S8) && n < cols) {
            c0 = copy_at(blk, 0, n, rows, cols);
            w0 = blk ? blk[2 * n + 1] : cols;
            if (n + 1 < cols) {
                c1 = copy_at(blk, 0, n + 1, rows, cols);
                w1 = blk ? blk[2 * n + 3] : cols;
            }
        }
        /* Both columns in one block, the pair aligned for one store. */
        const bool cpair = n + 1 < cols && c1 == c0 + 1 && w1 == w0 && c0 % 2 == 0 && w0 % 2 == 0;
#pragma unroll
        for (int mt = 0; mt < 4; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const long long m = m0 + mt * 16 + g + 8 * h;
                if (m >= rows || n >= cols)
                    continue;
                const float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
                const long long a0 = c0 + m * w0, a1 = c1 + m * w1;
                if (S && pairs && n + 1 < cols)
                    *reinterpret_cast<float2 *>(S + m * cols + n) = make_float2(v0, v1);
                else if (S) {
                    S[m * cols + n] = v0;
                    if (n + 1 < cols)
                        S[m * cols + n + 1] = v1;
                }
                if (cpair) {
                    if (S16)
                        *reinterpret_cast<__half2 *>(S16 + a0) = __floats2half2_rn(v0, v1);
                    if (S8)
                        *reinterpret_cast<char2 *>(S8 + a0) = make_char2(to_i8(v0), to_i8(v1));
                    continue;
                }
                if (S16)
                    S16[a0] = __float2half_rn(v0);
                if (S8)
                    S8[a0] = to_i8(v0);
                if (n + 1 < cols) {
                    if (S16)
                        S16[a1] = __float2half_rn(v1);
                    if (S8)
                        S8[a1] = to_i8(v1);
                }
            }
    }
}

__global__ void __launch_bounds__(256)
    centroid_scores_tf32x3_kernel(const float *__restrict__ Q, const float *__restrict__ C,
                                  long long lq, long long nc, long long dim, float *__restrict__ S)
{
    __shared__ __align__(16) float sa[XM * XLD];
    __shared__ __align__(16) float sb[XN * XLD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3; /* warp tile: rows wm*64, cols wn*32 */
    const int g = lane >> 2, t4 = lane & 3;
    const long long m0 = (long long)blockIdx.y * XM, n0 = (long long)blockIdx.x * XN;
    float acc[4][4][4] = {};
    for (long long k0 = 0; k0 < dim; k0 += XK) {
        /* 128 rows x 32 floats of each operand: 1024 float4, 4 per thread. */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int v = tid + i * 256, r = v >> 3, c4 = (v & 7) * 4;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f), y = x;
            if (m0 + r < lq && k0 + c4 < dim)
                x = __ldg(reinterpret_cast<const float4 *>(Q + (m0 + r) * dim + k0 + c4));
            if (n0 + r < nc && k0 + c4 < dim)
                y = __ldg(reinterpret_cast<const float4 *>(C + (n0 + r) * dim + k0 + c4));
            *reinterpret_cast<float4 *>(sa + r * XLD + c4) = x;
            *reinterpret_cast<float4 *>(sb + r * XLD + c4) = y;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < XK; kk += 8) {
            uint32_t ah[4][4], al[4][4], bh[4][2], bl[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                const float *p = sa + (wm * 64 + mt * 16 + g) * XLD + kk + t4;
                split_tf32(p[0], ah[mt][0], al[mt][0]);
                split_tf32(p[8 * XLD], ah[mt][1], al[mt][1]);
                split_tf32(p[4], ah[mt][2], al[mt][2]);
                split_tf32(p[8 * XLD + 4], ah[mt][3], al[mt][3]);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const float *p = sb + (wn * 32 + nt * 8 + g) * XLD + kk + t4;
                split_tf32(p[0], bh[nt][0], bl[nt][0]);
                split_tf32(p[4], bh[nt][1], bl[nt][1]);
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    mma_tf32(acc[mt][nt], al[mt], bh[nt]);
                    mma_tf32(acc[mt][nt], ah[mt], bl[nt]);
                    mma_tf32(acc[mt][nt], ah[mt], bh[nt]);
                }
        }
        __syncthreads();
    }
    store_tile(acc, S, (__half *)NULL, (signed char *)NULL, (const int *)NULL, m0 + wm * 64,
               n0 + wn * 32, lq, nc, g, t4);
}

/*
 * The search's table S = C Q^T when every centroid value is a binary16 number (the index
 * stores its centroids in fp16, so a search's are): the centroids enter the tensor cores
 * exactly as fp16, and each query value splits into hi = fp16(q) and lo = fp16(q - hi), so
 * S = C.lo + C.hi in two m16n8k16 fp16 passes with fp32 accumulation. The products are exact
 * in fp32; what is dropped is lo's rounding, 2^-11 of q - hi, itself at most 2^-11 of q, so
 * about 2^-22 of each product as in 3xTF32 (where lo is tiny, fp16's subnormals bound the
 * error at 2^-25 a value instead, under fp32's rounding of a score). Two fp16 passes cost a
 * third of 3xTF32's tensor-core time and no operand splitting in the inner loop (the query
 * is split once, as it is staged). A 128 x 128 output tile per CTA of 8 warps (2 x 4, each
 * 64 x 32), 32-dim slices through shared memory, rows padded to 40 halves (a fragment load's
 * 32 lanes hit 32 distinct banks). Needs dim % 16 == 0 and 16-byte aligned operands.
 */
constexpr int HM = 128, HN = 128, HK = 32, HLD = HK + 8;

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Two fp16 values packed as an mma operand register, the first in the low half. */
__device__ __forceinline__ uint32_t pack_h2(__half_raw a, __half_raw b)
{
    return (uint32_t)a.x | ((uint32_t)b.x << 16);
}

/*
 * store_tile for a warp's block inside the table, through shared memory: 16 rows at a time
 * (one mt), each lane's fragments into st (16 rows of SLD floats; SLD 40: the fragments' 8-byte
 * writes and the rows' 16-byte reads hit distinct banks), then each row's 32 scores as 8
 * lanes' 16-byte stores, 128 bytes of one line, and the fp16 copy's 64 bytes where the
 * warp's 32 columns lie in one block (else as store_tile). Why: from the fragments, a store
 * instruction wrote 32 bytes to each of 8 rows (16 to the copy's), and the table kernel ran at
 * 1.57 TB/s, its L2 76% busy, its DRAM 33% (ncu, H200, K 131,072 x 4,096 columns).
 */
constexpr int SLD = 40;
static_assert(8 * 16 * SLD * 4 <= (HM + 2 * HN) * HLD * 2, "staging rows fit the operands' space");

__device__ __forceinline__ void store_staged(const float (&acc)[4][4][4], float *__restrict__ st,
                                             float *__restrict__ S, __half *__restrict__ S16,
                                             const int *__restrict__ blk, long long m0,
                                             long long n0, long long rows, long long cols, int lane)
{
    const int g = lane >> 2, t4 = lane & 3;
    long long c0 = 0, w0 = cols;
    bool cstaged = false;
    if (S16) {
        c0 = copy_at(blk, 0, n0, rows, cols);
        w0 = blk ? blk[2 * n0 + 1] : cols;
        cstaged = (!blk || blk[2 * n0] == blk[2 * (n0 + 31)]) && c0 % 4 == 0 && w0 % 4 == 0 &&
                  (uintptr_t)S16 % 8 == 0;
    }
    const int r8 = lane >> 3, c4 = (lane & 7) * 4;
#pragma unroll
    for (int mt = 0; mt < 4; mt++) {
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *reinterpret_cast<float2 *>(st + (g + 8 * h) * SLD + nt * 8 + 2 * t4) =
                    make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = i * 4 + r8;
            const float4 v = *reinterpret_cast<const float4 *>(st + r * SLD + c4);
            const long long m = m0 + mt * 16 + r;
            *reinterpret_cast<float4 *>(S + m * cols + n0 + c4) = v;
            if (cstaged) {
                const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
                *reinterpret_cast<uint2 *>(S16 + c0 + m * w0 + c4) =
                    make_uint2(*reinterpret_cast<const uint32_t *>(&lo),
                               *reinterpret_cast<const uint32_t *>(&hi));
            }
        }
        __syncwarp();
    }
    if (S16 && !cstaged)
        store_tile(acc, (float *)NULL, S16, (signed char *)NULL, blk, m0, n0, rows, cols, g, t4);
}

__global__ void __launch_bounds__(256, 2)
    centroid_scores_f16x2_kernel(const uint16_t *__restrict__ C, const float *__restrict__ Q,
                                 long long nc, long long nq, long long dim, float *__restrict__ S,
                                 __half *__restrict__ S16, signed char *__restrict__ S8,
                                 const int *__restrict__ blk, unsigned *__restrict__ colbest,
                                 unsigned *__restrict__ tilekey)
{
    /* The operands' slices; after the products, each warp's staging rows (store_staged). */
    __shared__ __align__(16) uint16_t smem[(HM + 2 * HN) * HLD];
    uint16_t *const sa = smem, *const sh = smem + HM * HLD, *const sl = sh + HN * HLD;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3; /* warp tile: rows wm*64, cols wn*32 */
    const int g = lane >> 2, t4 = lane & 3;
    const long long m0 = (long long)blockIdx.y * HM, n0 = (long long)blockIdx.x * HN;
    float acc[4][4][4] = {};
    for (long long k0 = 0; k0 < dim; k0 += HK) {
        /* Centroids: 128 rows x 32 halves, 512 uint4, 2 per thread. */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int v = tid + i * 256, r = v >> 2, c8 = (v & 3) * 8;
            uint4 x = make_uint4(0, 0, 0, 0);
            if (m0 + r < nc && k0 + c8 < dim)
                x = __ldg(reinterpret_cast<const uint4 *>(C + (m0 + r) * dim + k0 + c8));
            *reinterpret_cast<uint4 *>(sa + r * HLD + c8) = x;
        }
        /* Query tokens: 128 rows x 32 floats, 1024 float4, 4 per thread, split as staged. */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int v = tid + i * 256, r = v >> 3, c4 = (v & 7) * 4;
            float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
            if (n0 + r < nq && k0 + c4 < dim)
                y = __ldg(reinterpret_cast<const float4 *>(Q + (n0 + r) * dim + k0 + c4));
            const float f[4] = {y.x, y.y, y.z, y.w};
            __half_raw hi[4], lo[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const __half h = __float2half_rn(f[e]);
                hi[e] = h;
                lo[e] = __float2half_rn(f[e] - __half2float(h));
            }
            *reinterpret_cast<uint2 *>(sh + r * HLD + c4) =
                make_uint2(pack_h2(hi[0], hi[1]), pack_h2(hi[2], hi[3]));
            *reinterpret_cast<uint2 *>(sl + r * HLD + c4) =
                make_uint2(pack_h2(lo[0], lo[1]), pack_h2(lo[2], lo[3]));
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < HK; kk += 16) {
            uint32_t a[4][4], bh[4][2], bl[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                const uint16_t *p = sa + (wm * 64 + mt * 16 + g) * HLD + kk + 2 * t4;
                a[mt][0] = *reinterpret_cast<const uint32_t *>(p);
                a[mt][1] = *reinterpret_cast<const uint32_t *>(p + 8 * HLD);
                a[mt][2] = *reinterpret_cast<const uint32_t *>(p + 8);
                a[mt][3] = *reinterpret_cast<const uint32_t *>(p + 8 * HLD + 8);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int o = (wn * 32 + nt * 8 + g) * HLD + kk + 2 * t4;
                bh[nt][0] = *reinterpret_cast<const uint32_t *>(sh + o);
                bh[nt][1] = *reinterpret_cast<const uint32_t *>(sh + o + 8);
                bl[nt][0] = *reinterpret_cast<const uint32_t *>(sl + o);
                bl[nt][1] = *reinterpret_cast<const uint32_t *>(sl + o + 8);
            }
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    mma_f16(acc[mt][nt], a[mt], bl[nt]);
                    mma_f16(acc[mt][nt], a[mt], bh[nt]);
                }
        }
        __syncthreads();
    }
    if (!S8 && m0 + wm * 64 + 64 <= nc && n0 + wn * 32 + 32 <= nq && nq % 4 == 0 &&
        (uintptr_t)S % 16 == 0)
        store_staged(acc, reinterpret_cast<float *>(smem) + warp * (16 * SLD), S, S16, blk,
                     m0 + wm * 64, n0 + wn * 32, nc, nq, lane);
    else
        store_tile(acc, S, S16, S8, blk, m0 + wm * 64, n0 + wn * 32, nc, nq, g, t4);
    if (colbest) {
        /* Each column's best of the tile: a warp's 64 rows in registers and over the lanes of
         * one t4 (g is lane bits 2-4), the CTA's two row halves in shared memory, one atomic a
         * column and CTA. Why here: the probe's first pass read the whole table again for it
         * (0.28 ms of a 64-query chunk at K 131,072, H200). NaN is left out (fmaxf), as there. */
        __shared__ unsigned best[HN];
        if (tid < HN)
            best[tid] = 0;
        __syncthreads();
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float mx = -INFINITY;
#pragma unroll
                for (int mt = 0; mt < 4; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        if (m0 + wm * 64 + mt * 16 + g + 8 * h < nc)
                            mx = fmaxf(mx, acc[mt][nt][2 * h + e]);
                for (int o = 4; o < 32; o <<= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                if (g == 0 && mx > -INFINITY)
                    atomicMax(&best[wn * 32 + nt * 8 + 2 * t4 + e], order_key(mx));
            }
        __syncthreads();
        if (tid < HN && n0 + tid < nq && best[tid])
            atomicMax(colbest + n0 + tid, best[tid]);
        /* The tile's best of each column as well (HM == KERN_CUDA_TILE_ROWS): the probe reads
         * the rows of a tile only where it may keep one. */
        if (tilekey && tid < HN && n0 + tid < nq)
            tilekey[(long long)blockIdx.y * nq + n0 + tid] = best[tid];
    }
}

/* Column n's block: the last query q (of nq, q_off on the device) with q_off[q] <= n. */
__global__ void table_blk_kernel(const int64_t *__restrict__ q_off, long long nq, long long nt,
                                 int *__restrict__ blk)
{
    const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= nt)
        return;
    long long lo = 0, hi = nq - 1;
    while (lo < hi) {
        const long long mid = (lo + hi + 1) / 2;
        if (q_off[mid] <= n)
            lo = mid;
        else
            hi = mid - 1;
    }
    blk[2 * n] = (int)q_off[lo];
    blk[2 * n + 1] = (int)(q_off[lo + 1] - q_off[lo]);
}

} // namespace

extern "C" int kern_cuda_table_blk(const int64_t *q_off, size_t nq, size_t nt, int32_t *blk)
{
    cudaGetLastError();
    if (!q_off || !blk || nq == 0 || nt > 0x7fffffffu) {
        kern_set_error("table_blk (cuda): NULL argument, no queries, or %zu columns", nt);
        return KERN_EINVAL;
    }
    if (nt == 0)
        return KERN_OK;
    table_blk_kernel<<<(unsigned)((nt + 255) / 256), 256>>>(q_off, (long long)nq, (long long)nt,
                                                            reinterpret_cast<int *>(blk));
    KERN_CUDA_LAUNCHED("table_blk_kernel");
    return KERN_OK;
}

static_assert(HM == KERN_CUDA_TILE_ROWS, "tilekey: the table kernel's tile rows");

static int scores_f16(const uint16_t *c16, size_t n_centroids, const float *q, size_t nq,
                      size_t dim, float *S, uint16_t *S16, int8_t *S8, unsigned *colbest,
                      const int32_t *blk, unsigned *tilekey)
{
    cudaGetLastError();
    if (!c16 || !q || !S || !dim || dim % 16 || (uintptr_t)c16 % 16 || (uintptr_t)q % 16 ||
        (uintptr_t)S16 % 4 || (uintptr_t)S8 % 2 || (tilekey && !colbest)) {
        kern_set_error("centroid_scores_f16 (cuda): NULL argument, dim %zu not a multiple of 16, "
                       "unaligned operands, or tile keys without column bests",
                       dim);
        return KERN_EINVAL;
    }
    if (!n_centroids || !nq)
        return KERN_OK;
    if ((n_centroids + HM - 1) / HM > 65535 || (nq + HN - 1) / HN > 0x7fffffffu) {
        kern_set_error("centroid_scores_f16 (cuda): %zu x %zu beyond one launch", n_centroids, nq);
        return KERN_EINVAL;
    }
    dim3 grid((unsigned)((nq + HN - 1) / HN), (unsigned)((n_centroids + HM - 1) / HM));
    if (colbest)
        KERN_CUDA_TRY(cudaMemsetAsync(colbest, 0, nq * sizeof *colbest, 0));
    centroid_scores_f16x2_kernel<<<grid, 256>>>(c16, q, (long long)n_centroids, (long long)nq,
                                                (long long)dim, S, reinterpret_cast<__half *>(S16),
                                                reinterpret_cast<signed char *>(S8), blk, colbest,
                                                tilekey);
    KERN_CUDA_LAUNCHED("centroid_scores_f16x2_kernel");
    return KERN_OK;
}

extern "C" int kern_cuda_centroid_scores_f16(const uint16_t *c16, size_t n_centroids,
                                             const float *q, size_t nq, size_t dim, float *S,
                                             uint16_t *S16, unsigned *colbest, const int32_t *blk,
                                             unsigned *tilekey)
{
    return scores_f16(c16, n_centroids, q, nq, dim, S, S16, NULL, colbest, blk, tilekey);
}

extern "C" int kern_cuda_centroid_scores_f16_i8(const uint16_t *c16, size_t n_centroids,
                                                const float *q, size_t nq, size_t dim, float *S,
                                                int8_t *S8, unsigned *colbest, const int32_t *blk,
                                                unsigned *tilekey)
{
    return scores_f16(c16, n_centroids, q, nq, dim, S, NULL, S8, colbest, blk, tilekey);
}

extern "C" int kern_gpu_centroid_scores(const float *q, size_t lq, const float *centroids,
                                        size_t n_centroids, size_t dim, float *S)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    if ((lq + TM - 1) / TM > 65535 || (n_centroids + TN - 1) / TN > 0x7fffffffu) {
        kern_set_error("centroid_scores (cuda): %zu x %zu beyond one launch", lq, n_centroids);
        return KERN_EINVAL;
    }
    /* Tensor cores where the rows load as float4 and the problem fills a few tiles. */
    if (dim % 4 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)centroids % 16 == 0 &&
        lq * n_centroids >= (size_t)XM * XN && (lq + XM - 1) / XM <= 65535) {
        dim3 grid((unsigned)((n_centroids + XN - 1) / XN), (unsigned)((lq + XM - 1) / XM));
        centroid_scores_tf32x3_kernel<<<grid, 256>>>(q, centroids, (long long)lq,
                                                     (long long)n_centroids, (long long)dim, S);
        KERN_CUDA_LAUNCHED("centroid_scores_tf32x3_kernel");
        return KERN_OK;
    }
    dim3 grid((unsigned)((n_centroids + TN - 1) / TN), (unsigned)((lq + TM - 1) / TM));
    centroid_scores_kernel<<<grid, 256>>>(q, centroids, (long long)lq, (long long)n_centroids,
                                          (long long)dim, S);
    KERN_CUDA_LAUNCHED("centroid_scores_kernel");
    return KERN_OK;
}
