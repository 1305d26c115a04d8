/*
 * maxsim_i8_cuda.cu: INT8 MaxSim with per-token scales, and the per-token quantiser, on CUDA.
 *
 * Fast path (dim a multiple of 64 up to 256, 16-byte aligned tokens): mma.sync m16n8k32
 * s8 x s8 -> s32 (sm_80 and later), the same streaming design as the 16-bit kernel in
 * maxsim_cuda.cu: each warp keeps a block of query rows as A fragments in registers, streams
 * document tokens straight from device memory into B fragments with 16-byte loads (every byte
 * read once per query block, half the bytes of bf16), software-pipelined one group ahead, and
 * folds each 16 x 8 integer tile into a running per-row max after scaling: the dequantisation
 * is deferred to the scores, score = (q_scale * d_scale) * dot, never to the tokens.
 *
 * K permutation: in a 64-dim chunk lane (g, t4) loads the 16 bytes [t4*16, t4*16+16) of row g;
 * words x, y feed the first k32 step (slots t4*4.. and 16+t4*4..), z, w the second. A and B use
 * the same permutation, so the dot product is unchanged.
 *
 * int32 -> fp32: |dot| <= 128 * 128 * 256 = 2^22 on the fast path, so the conversion is the
 * exact magic-number trick (an integer add and a float subtract) rather than I2F, which runs
 * at a quarter of the FP32 rate.
 *
 * Everything else (other dims, misaligned pointers) takes a plain CUDA-core kernel: one CTA per
 * (document, query) pair, exact integer dots.
 *
 * FP8 (e4m3 queries and documents, no scales): the same streaming kernel with the e4m3 MMA
 * (m16n8k32, fp32 accumulators; sm_89 and later), for calls with few query rows, where
 * maxsim_cuda.cu sends them (dense or varlen; the many-row calls take the wgmma kernel). Dense
 * calls pass no offsets: query q is rows [q * lq, (q + 1) * lq), document n likewise with ld.
 * That choice is a template flag, not a runtime branch: a branch on the offsets pointer in the
 * shared document and query lookups cost the int8 kernel 12-18% on the H200. One FP8 query goes
 * here rather than to the wgmma kernel because there a 64-token tile is a chain (barrier,
 * copies, descriptors, one MMA group, its wait, the fold) of ~254 instructions a warp that more
 * stages did not shorten: 198-202 us against 138-140 here for 1 x 10k (bf16: 180).
 *
 * What limits the int8 rerank (78% of copy, 1.63x bf16 rather than 2x): 64 bytes a lane in
 * flight against bf16's 128, and twice the score elements per byte to fold (convert, two
 * multiplies, select, max each); ncu showed DRAM 69% busy at 23% occupancy.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.cuh"
#include "frag_cuda.cuh"
#include "tune_cuda.h"

namespace
{

struct i8_args {
    const int8_t *q;      /* int8, or e4m3 bytes */
    const float *qs;      /* NULL for e4m3 */
    const int64_t *q_off; /* NULL: every query lq rows */
    long long nq, lq;
    const int8_t *d;
    const float *ds;
    const int64_t *d_off; /* NULL: every document ld tokens */
    long long nd, ld;
    int dim;
    float *scores;
    int qchunk;
};

constexpr int I8_QCHUNK = 64;

/* Query q's first row and length; DENSE: no offsets, every query lq rows (a compile-time
 * choice: a branch on the pointer here measured 12-18% slower on the int8 shapes). */
template <bool DENSE = false>
__device__ __forceinline__ void i8_query(const i8_args &a, long long q, long long *s, int *len)
{
    *s = DENSE ? q * a.lq : a.q_off[q];
    *len = (int)(DENSE ? a.lq : a.q_off[q + 1] - *s);
}

template <bool DENSE = false>
__device__ __forceinline__ void i8_doc(const i8_args &a, long long n, long long *s, int *len)
{
    *s = DENSE ? n * a.ld : a.d_off[n];
    *len = (int)(DENSE ? a.ld : a.d_off[n + 1] - *s);
}

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* e4m3 x e4m3 -> fp32 (sm_89 and later; elsewhere never launched). */
__device__ __forceinline__ void mma_s8(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    (void)c, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
    __trap();
#endif
}

/* The accumulators of a k32 MMA: int32 for int8, fp32 for e4m3. */
template <bool FP8> struct acc_type {
    typedef int type;
};
template <> struct acc_type<true> {
    typedef float type;
};

/* Exact for |v| <= 2^22: 1.5 * 2^23 + v is representable with unit spacing. */
__device__ __forceinline__ float i2f_exact(int v)
{
    return __int_as_float(v + 0x4B400000) - 12582912.0f;
}

__device__ __forceinline__ uint4 ldg16(const int8_t *p)
{
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

template <int MT, int NCH, bool FP8>
__device__ __forceinline__ void load_a(uint4 (&af)[MT][NCH][2], float (&qsc)[MT][2],
                                       const i8_args &a, long long qstart, int r0, int qlen, int g,
                                       int t4)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const long long r = qstart + min(r0 + mt * 16 + g + 8 * h, qlen - 1);
            qsc[mt][h] = FP8 ? 1.f : a.qs[r];
#pragma unroll
            for (int c = 0; c < NCH; c++)
                af[mt][c][h] = ldg16(a.q + r * a.dim + c * 64 + t4 * 16);
        }
}

/* B fragments of NG 8-token tiles from tok0, and the scales of the two token columns each lane
 * accumulates (tokens clamped to the last; masked when folded). */
template <int NG, int NCH, bool FP8>
__device__ __forceinline__ void load_b(uint4 (&bf)[NG][NCH], float (&bsc)[NG][2], const i8_args &a,
                                       long long dstart, int tok0, int dlen, int g, int t4)
{
#pragma unroll
    for (int j = 0; j < NG; j++) {
        const long long t = dstart + min(tok0 + j * 8 + g, dlen - 1);
#pragma unroll
        for (int c = 0; c < NCH; c++)
            bf[j][c] = ldg16(a.d + t * a.dim + c * 64 + t4 * 16);
        const int tc = tok0 + j * 8 + 2 * t4;
        bsc[j][0] = FP8 ? 1.f : __ldg(a.ds + dstart + min(tc, dlen - 1));
        bsc[j][1] = FP8 ? 1.f : __ldg(a.ds + dstart + min(tc + 1, dlen - 1));
    }
}

template <int MT, int NG, int NCH, typename A>
__device__ __forceinline__ void mma_chunks(A (&acc)[MT][NG][4], const uint4 (&af)[MT][NCH][2],
                                           const uint4 (&bf)[NG][NCH])
{
#pragma unroll
    for (int c = 0; c < NCH; c++) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NG; j++)
                mma_s8(acc[mt][j], af[mt][c][0].x, af[mt][c][1].x, af[mt][c][0].y, af[mt][c][1].y,
                       bf[j][c].x, bf[j][c].y);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < NG; j++)
                mma_s8(acc[mt][j], af[mt][c][0].z, af[mt][c][1].z, af[mt][c][0].w, af[mt][c][1].w,
                       bf[j][c].z, bf[j][c].w);
    }
}

/* The score of an accumulator: int8's scaled after the exact conversion, e4m3's as it is. */
__device__ __forceinline__ float acc_score(float sc, int v)
{
    return sc * i2f_exact(v);
}
__device__ __forceinline__ float acc_score(float, float v)
{
    return v;
}

template <int MT, int NG, typename A>
__device__ __forceinline__ void fold_max(float (&rmax)[MT][2], const A (&acc)[MT][NG][4],
                                         const float (&qsc)[MT][2], const float (&bsc)[NG][2],
                                         int tok0, int dlen, int t4)
{
#pragma unroll
    for (int j = 0; j < NG; j++) {
        const int t = tok0 + j * 8 + 2 * t4;
        const bool v0 = t < dlen, v1 = t + 1 < dlen;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float s0 = acc_score(qsc[mt][h] * bsc[j][0], acc[mt][j][2 * h]);
                const float s1 = acc_score(qsc[mt][h] * bsc[j][1], acc[mt][j][2 * h + 1]);
                rmax[mt][h] = fmaxf(rmax[mt][h], fmaxf(v0 ? s0 : -INFINITY, v1 ? s1 : -INFINITY));
            }
    }
}

/*
 * The streaming kernel. MT: m16 tiles per warp (16 * MT query rows per unit); NCH: 64-dim
 * chunks (dim = 64 * NCH); NG: 8-token tiles per warp step. Persistent grid-stride over
 * documents; when the CTA's query units fit in one round, A stays in registers throughout and
 * the last group of a document prefetches the first of the CTA's next one.
 */
template <int MT, int NCH, int NG, int W, bool FP8, bool DENSE>
__global__ void __launch_bounds__(W * 32, MT >= 4 ? 1 : 3) maxsim_i8_kernel(i8_args a, int wm_count)
{
    typedef typename acc_type<FP8>::type acc_t;
    constexpr int RM = 16 * MT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int WM = wm_count, WN = W / wm_count;
    const int wm = warp / WN, wn = warp % WN;
    const long long q0 = (long long)blockIdx.y * a.qchunk;
    const int nqc = (int)min((long long)a.qchunk, a.nq - q0);

    __shared__ float s_max[W][RM];
    __shared__ float s_part[W];
    __shared__ int s_unit_q[W];
    __shared__ float s_qsum[I8_QCHUNK];
    __shared__ int s_ufirst[I8_QCHUNK + 1];

    if (threadIdx.x == 0) {
        int u = 0;
        for (int i = 0; i < nqc; i++) {
            long long qs;
            int ql;
            i8_query<DENSE>(a, q0 + i, &qs, &ql);
            s_ufirst[i] = u;
            u += (ql + RM - 1) / RM;
            s_qsum[i] = 0.f;
        }
        s_ufirst[nqc] = u;
    }
    __syncthreads();
    const int units = s_ufirst[nqc];
    const bool resident = units <= WM;
    uint4 af[MT][NCH][2];
    float qsc[MT][2];
    int qi = 0, r0 = 0, qlen = 0;
    long long qstart = 0;
    if (resident && wm < units) {
        while (s_ufirst[qi + 1] <= wm)
            qi++;
        i8_query<DENSE>(a, q0 + qi, &qstart, &qlen);
        r0 = (wm - s_ufirst[qi]) * RM;
        load_a<MT, NCH, FP8>(af, qsc, a, qstart, r0, qlen, g, t4);
    }

    uint4 nb[NG][NCH];
    float nsc[NG][2];
    bool have_nb = false;
    for (long long n = blockIdx.x; n < a.nd; n += gridDim.x) {
        long long dstart;
        int dlen;
        i8_doc<DENSE>(a, n, &dstart, &dlen);
        const bool nonempty = dlen > 0;
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
                    i8_query<DENSE>(a, q0 + qi, &qstart, &qlen);
                    r0 = (u - s_ufirst[qi]) * RM;
                    load_a<MT, NCH, FP8>(af, qsc, a, qstart, r0, qlen, g, t4);
                }
                const int step = WN * NG * 8;
                int tok0 = wn * NG * 8;
                if (tok0 < dlen && !have_nb)
                    load_b<NG, NCH, FP8>(nb, nsc, a, dstart, tok0, dlen, g, t4);
                have_nb = false;
                for (; tok0 < dlen; tok0 += step) {
                    uint4 bf[NG][NCH];
                    float bsc[NG][2];
#pragma unroll
                    for (int j = 0; j < NG; j++) {
                        bsc[j][0] = nsc[j][0];
                        bsc[j][1] = nsc[j][1];
#pragma unroll
                        for (int c = 0; c < NCH; c++)
                            bf[j][c] = nb[j][c];
                    }
                    if (tok0 + step < dlen) {
                        load_b<NG, NCH, FP8>(nb, nsc, a, dstart, tok0 + step, dlen, g, t4);
                    } else if (resident && n + gridDim.x < a.nd) {
                        long long ns;
                        int nl;
                        i8_doc<DENSE>(a, n + gridDim.x, &ns, &nl);
                        if (wn * NG * 8 < nl) {
                            load_b<NG, NCH, FP8>(nb, nsc, a, ns, wn * NG * 8, nl, g, t4);
                            have_nb = true;
                        }
                    }
                    acc_t acc[MT][NG][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int j = 0; j < NG; j++)
                            acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0;
                    mma_chunks<MT, NG, NCH>(acc, af, bf);
                    fold_max<MT, NG>(rmax, acc, qsc, bsc, tok0, dlen, t4);
                }
            }
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
                        if (r0 + r < qlen)
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

/* Any dim, any alignment: one CTA per (document, query), exact integer dots. */
__global__ void maxsim_i8_simple_kernel(i8_args a)
{
    const long long n = blockIdx.x, q = blockIdx.y;
    __shared__ float s_red[32];
    long long dstart, qstart;
    int dlen, qlen;
    i8_doc(a, n, &dstart, &dlen);
    i8_query(a, q, &qstart, &qlen);
    float sum = 0.f;
    for (int r = 0; r < qlen && dlen > 0; r++) {
        const int8_t *qr = a.q + (qstart + r) * a.dim;
        const float qs = a.qs[qstart + r];
        float m = -INFINITY;
        for (int t = threadIdx.x; t < dlen; t += blockDim.x) {
            const int8_t *dr = a.d + (dstart + t) * a.dim;
            int s = 0;
            for (int j = 0; j < a.dim; j++)
                s += (int)qr[j] * (int)dr[j];
            m = fmaxf(m, (qs * a.ds[dstart + t]) * __int2float_rn(s));
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
        a.scores[q * a.nd + n] = dlen > 0 ? sum : KERN_EMPTY_SCORE;
}

template <int MT, int NCH, int NG, bool FP8, bool DENSE>
int launch_i8_ng(const i8_args &a, int wm, unsigned qblocks)
{
    constexpr int W = 4;
    long long want = 0;
    int rc = kern_resident_ctas((const void *)maxsim_i8_kernel<MT, NCH, NG, W, FP8, DENSE>, W * 32,
                                0, &want);
    if (rc != KERN_OK)
        return rc;
    want /= qblocks;
    if (want < 1)
        want = 1;
    const unsigned blocks = (unsigned)(a.nd < want ? a.nd : want);
    maxsim_i8_kernel<MT, NCH, NG, W, FP8, DENSE><<<dim3(blocks, qblocks), W * 32>>>(a, wm);
    KERN_CUDA_LAUNCHED("maxsim_i8_kernel");
    return KERN_OK;
}

/* NG: 8-token tiles per warp step; 2 by default, 4 on request. Four keep twice the bytes in
 * flight but measured slower on the H200 (rerank 1 x 10k 127.8 against 119.1 us, ragged 98.5
 * against 84.5): more registers, fewer warps an SM, the same lesson as the 16-bit kernel's. */
template <int MT, int NCH, bool FP8> int launch_i8(const i8_args &a, int wm, unsigned qblocks)
{
    const bool dense = !a.q_off; /* FP8 dense calls: no offsets at all */
    if (FP8 && dense)
        return kern_gpu_tune.i8_tiles == 4 ? launch_i8_ng<MT, NCH, 4, FP8, true>(a, wm, qblocks)
                                           : launch_i8_ng<MT, NCH, 2, FP8, true>(a, wm, qblocks);
    return kern_gpu_tune.i8_tiles == 4 ? launch_i8_ng<MT, NCH, 4, FP8, false>(a, wm, qblocks)
                                       : launch_i8_ng<MT, NCH, 2, FP8, false>(a, wm, qblocks);
}

/* The streaming kernel for m (dim a multiple of 64 up to 256, 16-byte aligned): 32 rows a unit,
 * up to 64 queries a CTA. */
template <bool FP8> int launch_stream(i8_args m)
{
    m.qchunk = (int)(m.nq < I8_QCHUNK ? m.nq : I8_QCHUNK);
    const unsigned qblocks = (unsigned)((m.nq + m.qchunk - 1) / m.qchunk);
    const int units = m.qchunk;
    const int wm = units >= 4 ? 4 : units >= 2 ? 2 : 1;
    switch (m.dim / 64) {
    case 4:
        return launch_i8<2, 4, FP8>(m, wm, qblocks);
    case 3:
        return launch_i8<2, 3, FP8>(m, wm, qblocks);
    case 2:
        return launch_i8<2, 2, FP8>(m, wm, qblocks);
    default:
        return launch_i8<2, 1, FP8>(m, wm, qblocks);
    }
}

/* One warp per row: absmax, then q = rint(x * (127 / absmax)) as on the CPU (IEEE division and
 * multiply, so both devices produce the same bytes). */
__global__ void quantize_i8_kernel(const float *x, long long n, int dim, int8_t *q, float *scales)
{
    const long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= n)
        return;
    const float *xr = x + r * dim;
    int8_t *qr = q + r * dim;
    float amax = 0.f;
    int finite = 1;
    for (int k = lane; k < dim; k += 32) {
        const float v = xr[k];
        amax = fmaxf(amax, fabsf(v));
        finite &= isfinite(v) ? 1 : 0;
    }
    for (int o = 16; o > 0; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        finite &= __shfl_xor_sync(0xffffffffu, finite, o);
    }
    const bool zero = !(amax > 0.f) || !finite;
    const float inv = zero ? 0.f : 127.0f / amax;
    if (lane == 0)
        scales[r] = zero ? 0.f : amax / 127.0f;
    for (int k = lane; k < dim; k += 32) {
        float v = zero ? 0.f : rintf(xr[k] * inv);
        v = fminf(127.f, fmaxf(-127.f, v));
        qr[k] = (int8_t)v;
    }
}

} // namespace

extern "C" int kern_gpu_maxsim_varlen_i8(const kern_varlen_i8 *a, float *scores)
{
    cudaGetLastError(); /* a stale error of an earlier, unrelated call is not this call's */
    if (a->dim > 0x7fffffff || a->nd > 0x7fffffffULL || a->nq > 65535ULL * I8_QCHUNK) {
        kern_set_error("maxsim_varlen_i8 (cuda): dim, documents or queries beyond one launch");
        return KERN_EINVAL;
    }
    i8_args m = {};
    m.q = a->q;
    m.qs = a->q_scale;
    m.q_off = a->q_off;
    m.nq = (long long)a->nq;
    m.d = a->d;
    m.ds = a->d_scale;
    m.d_off = a->d_off;
    m.nd = (long long)a->nd;
    m.dim = (int)a->dim;
    m.scores = scores;
    const bool aligned = (uintptr_t)a->q % 16 == 0 && (uintptr_t)a->d % 16 == 0;
    if (aligned && m.dim % 64 == 0 && m.dim <= 256)
        return launch_stream<false>(m); /* query lengths are on the device: 32 rows a unit */
    if (m.nq > 65535) {
        kern_set_error("maxsim_varlen_i8 (cuda): %lld queries exceed one launch of the simple path",
                       m.nq);
        return KERN_EINVAL;
    }
    m.qchunk = 1;
    maxsim_i8_simple_kernel<<<dim3((unsigned)m.nd, (unsigned)m.nq), 128>>>(m);
    KERN_CUDA_LAUNCHED("maxsim_i8_simple_kernel");
    return KERN_OK;
}

extern "C" int kern_gpu_quantize_i8(const float *x, size_t n, size_t dim, int8_t *q, float *scales)
{
    cudaGetLastError();
    if (dim > 0x7fffffff || n > 0x7fffffffULL * 8) {
        kern_set_error("quantize_i8 (cuda): sizes beyond one launch");
        return KERN_EINVAL;
    }
    const unsigned blocks = (unsigned)((n + 7) / 8);
    quantize_i8_kernel<<<blocks, 256>>>(x, (long long)n, (int)dim, q, scales);
    KERN_CUDA_LAUNCHED("quantize_i8_kernel");
    return KERN_OK;
}

extern "C" int kern_gpu_e4m3_stream_usable(size_t dim, const void *q, const void *d)
{
    if ((uintptr_t)q % 16 || (uintptr_t)d % 16 || dim % 64 || dim > 256)
        return 0;
    return kern_device_cc() >= 89;
}

extern "C" int kern_gpu_maxsim_e4m3_stream(const void *q, const int64_t *q_off, size_t nq,
                                           size_t lq, const void *d, const int64_t *d_off,
                                           size_t nd, size_t ld, size_t dim, float *scores)
{
    if (nd > 0x7fffffffULL || nq > 65535ULL * I8_QCHUNK) {
        kern_set_error("maxsim (cuda, e4m3): documents or queries beyond one launch");
        return KERN_EINVAL;
    }
    i8_args m = {};
    m.q = static_cast<const int8_t *>(q);
    m.q_off = q_off;
    m.nq = (long long)nq;
    m.lq = (long long)lq;
    m.d = static_cast<const int8_t *>(d);
    m.d_off = d_off;
    m.nd = (long long)nd;
    m.ld = (long long)ld;
    m.dim = (int)dim;
    m.scores = scores;
    return launch_stream<true>(m);
}
