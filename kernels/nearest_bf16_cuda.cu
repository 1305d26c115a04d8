/*
 * nearest_bf16_cuda.cu: each point's nearest centroid by inner product on the tensor cores
 * (sm_80 and later): bf16 products accumulated in fp32 by mma.sync, fused with a running
 * argmax, for index building.
 *
 * Why: the fp32 kernel (nearest_cuda.cu) spends about 55 s of a 158 s encode on an H200 at 70M
 * tokens and 131,072 centroids (2.35e15 FLOP on the CUDA cores); bf16 tensor cores do the same
 * products at many times the rate. Two uses:
 *  - k-means training (kern_gpu_nearest_centroid_bf16): the bf16 argmax itself, as the CPU's
 *    AMX path does (kernels.h, kern_nearest_centroid_bf16);
 *  - encoding (kern_gpu_nearest_centroid_screened): codes must be fp32's. The bf16 pass keeps,
 *    per point, its best score b1 (index i1) and its second-best score b2 (over every other
 *    centroid). With E a proven bound on |bf16 score - fp32 score| for that point and any
 *    centroid (below), b1 - b2 > 2E makes i1 the fp32 argmax, alone: for any c != i1,
 *    s32(c) <= sb(c) + E <= b2 + E < b1 - E <= s32(i1). Such a point's fp32 score is then
 *    recomputed exactly as the fp32 kernel computes it (one fmaf chain over k = 0, 1, ...,
 *    from +0), so index and score are the fp32 kernel's bit for bit. The other points ("open":
 *    the gap too small, ties included) are gathered for a second bf16 pass that lists every
 *    centroid scoring at least b1 - 2E, which always includes fp32's argmax and everything
 *    tied with it in fp32 (rescore_lists says why); fp32 then chooses among the list with the
 *    same chain and the same tie rule. A list longer than LIST_CAP, or anything not finite,
 *    sends the point through the fp32 kernel itself, its answer scattered back. (Sending every
 *    open point to the fp32 kernel would cost a share of fp32's time equal to the open share,
 *    which at K 131,072 on real tokens may be large: the CPU's screen lists 1-3 centroids a
 *    point there, with a window of the same size.)
 *
 * The bound, for a point x and a centroid c, x~ and c~ their bf16 roundings (nearest even;
 * bf16 subnormals flushed to zero here, so that the tensor cores' own handling of them does
 * not matter), following nearest_amx_cpu.c:
 *   |sb - s32| <= |sb - x~.c~| + |x~.c~ - x.c| + |x.c - s32|
 *             <= gt |x~| |c~| + |x~ - x| |c~| + |x| |c~ - c| + g |x| |c| + 2^-100
 * with the centroid norms at their maxima over the table, g = d u / (1 - d u), u = 2^-24 (the
 * fp32 kernel's fmaf chain), and gt the tensor cores' accumulation: products of bf16 pairs are
 * exact in fp32, but one mma may add its 16 products and the accumulator after aligning them
 * to the largest and truncating, so we allow each m16n8k16 step an error of 17 terms of 2^-21
 * of the largest magnitude in it (a factor 4 over one truncated ulp per term), each at most
 * sum |x~_k c~_k| <= |x~| |c~|: gt = s 17 2^-21 / (1 - s 17 2^-21), s the steps (dims padded
 * to 32, over 16). (6.5e-5 at d 128: a small part of the bf16 terms, which are about 3e-3 for
 * unit vectors; the window is 2E.) 2^-100 covers products and sums flushed below fp32's normal
 * range. check_kernels_gpu measures the accumulation against x~.c~ computed in double.
 *
 * Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16" with .bf16), lane = 4 g + t
 * (g = groupID 0..7, t = threadID_in_group 0..3); each .b32 register holds two bf16, the lower
 * column (A) or row (B) in the low 16 bits:
 *   A (16 x 16, row-major; rows = points, columns = dims):
 *     a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
 *   B (16 x 8, "col": element (k, n) with k fastest, which is a centroid row; k = dims,
 *     n = centroids):
 *     b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
 *   C, D (16 x 8 fp32): c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
 * Points and centroids are both stored dims-fastest, so every fragment register is one aligned
 * 32-bit load of two consecutive dims. (maxsim_cuda.cu's mma16816 pairs registers the same way:
 * a0, a2 row g and a1, a3 row g + 8; a0 and b0 one k pair, a2 and b1 another.)
 *
 * Tiling: a CTA of 8 warps owns 128 points, their bf16 rows resident in shared memory for the
 * whole call (so dims up to MAX_DP), and walks every centroid in tiles of 128; each tile's
 * centroid rows come through a 3-stage cp.async ring in slices of 32 dims. Warps are 2 (points)
 * x 4 (centroids), each computing 64 x 32 scores as 4 x 4 mma tiles; 128 registers a thread,
 * so that two CTAs share an SM (16 warps to hide latency). After a tile's last slice each thread
 * folds its 64 scores into a running (best, index, second) for each of its 8 points, through
 * each point's maximum of the tile first (one compare per 8 scores in the common case: a
 * per-score update would cost as many issue slots as the mma themselves).
 * Ties: a thread visits its columns in increasing index and replaces its best only on a strictly
 * greater score (an equal one becomes the second best); across threads the lower index wins on
 * equal scores. So the lowest index among equal best scores wins, and an exact tie leaves
 * b1 == b2 (a gap of 0: the encode path sends the point to fp32).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "nearest_cuda.cuh"

namespace
{

constexpr int BM = 128, BN = 128, THREADS = 256;
/* Candidates a point of the second pass may list before it goes to the fp32 kernel (the CPU's
 * screen allows 64; lists on build corpora hold 1-3). */
constexpr unsigned LIST_CAP = 32;
/* Dims per pipeline stage (two k16 steps), and stages in flight: 3 lets two slices' loads run
 * while one is multiplied. */
constexpr int BKC = 32, STAGES = 3;
/* A stage's centroid rows are 32 dims plus 8 of padding (80 bytes): the 8 rows g = 0..7 a
 * fragment load touches then start 20 words apart, which puts the 32 lanes on 32 banks; 80 is
 * also a multiple of 16 for cp.async. */
constexpr int CS = BKC + 8;
/* Padded dims the resident point tile allows: 128 x (512 + 8) bf16 = 130 KB of shared memory,
 * under the 227 KB of sm_90 and 163 KB of sm_80 with the stages. Wider points take fp32. */
constexpr int MAX_DP = 512;
/* Centroids the kernel takes: a tile's column indices stay ints. */
constexpr size_t MAX_K = 0x7fffffffu - 2 * BN;

__device__ __forceinline__ uint16_t bf16_daz(float v)
{
    uint16_t h = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return (h & 0x7f80u) ? h : (uint16_t)(h & 0x8000u);
}

__device__ __forceinline__ float bf16_val(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* A warp's 64 x 32 tile of fp32 sums, cleared (at the start and after each column tile). */
__device__ __forceinline__ void zero_acc(float (&acc)[4][4][4])
{
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[mi][ni][r] = 0.f;
}

/* Folds another candidate state (ob1, oi1, ob2) into (b1, i1, b2): the new second best is the
 * best of the winner's second and the loser's best (a state's second never exceeds its best). */
__device__ __forceinline__ void merge(float &b1, int &i1, float &b2, float ob1, int oi1, float ob2)
{
    if (kern_nearest_beats(ob1, oi1, b1, i1)) {
        const float nb2 = fmaxf(ob2, b1);
        b1 = ob1;
        i1 = oi1;
        b2 = nb2;
    } else {
        b2 = fmaxf(b2, ob1);
    }
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* D = A B + D, m16n8k16, bf16 inputs, fp32 accumulators (layouts in the header comment). */
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)d, (void)a, (void)b; /* never launched below sm_80 (kern_gpu_nearest_bf16_usable) */
#endif
}

/*
 * Centroids to bf16: cb [kp, dp] (rows past k and dims past dim zero), and the maxima over the
 * rows of |c|, |c~| and |c~ - c| into cmax[0..2] (as float bits rounded up, by atomicMax on
 * the bits, which orders non-negative floats; a NaN norm wins and makes every bound NaN).
 * One warp a row.
 */
__global__ void centroids_to_bf16(const float *__restrict__ c, long long k, int dim, int dp,
                                  long long kp, uint16_t *__restrict__ cb,
                                  unsigned *__restrict__ cmax)
{
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= kp)
        return;
    double s = 0, sb = 0, sd = 0;
    for (int j = lane; j < dp; j += 32) {
        const float v = (row < k && j < dim) ? c[row * dim + j] : 0.f;
        const uint16_t h = bf16_daz(v);
        cb[row * dp + j] = h;
        const double dv = v, db = bf16_val(h);
        s += dv * dv;
        sb += db * db;
        sd += (db - dv) * (db - dv);
    }
    for (int off = 16; off > 0; off >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, off);
        sb += __shfl_xor_sync(0xffffffffu, sb, off);
        sd += __shfl_xor_sync(0xffffffffu, sd, off);
    }
    if (lane == 0 && row < k) {
        const double v[3] = {sqrt(s), sqrt(sb), sqrt(sd)};
        for (int q = 0; q < 3; q++) {
            float f = (float)v[q];
            if ((double)f < v[q])
                f = nextafterf(f, INFINITY);
            atomicMax(&cmax[q], __float_as_uint(f));
        }
    }
}

/*
 * The fused bf16 scores and argmax. x [n, dim] fp32 (rounded to bf16 as the CTA loads it),
 * cb [kp, dp] from centroids_to_bf16, k real centroids.
 * LIST false: best [n] (the bf16 argmax, -1 where every score is NaN), and where not NULL
 * b1 [n] its score and b2 [n] the best score of every other centroid (-inf where there is none).
 * LIST true (the encode path's second pass, on the points the first left open): every centroid
 * whose bf16 score is >= thr [n] (NaN: none) is appended to the point's list, cand [n][LIST_CAP]
 * in no particular order, cnt [n] (zeroed by the caller) counting them all, beyond the cap too.
 * Shared memory (dynamic): the point tile [BM][dp + 8] bf16, then STAGES x [BN][CS] bf16.
 */
template <bool LIST>
__global__ void __launch_bounds__(THREADS, LIST ? 1 : 2)
    nearest_bf16_kernel(const float *__restrict__ x, long long n, int dim, int dp,
                        const uint16_t *__restrict__ cb, int k, int *__restrict__ best,
                        float *__restrict__ b1_out, float *__restrict__ b2_out,
                        const float *__restrict__ thr, unsigned *__restrict__ cnt,
                        int *__restrict__ cand)
{
    extern __shared__ __align__(16) uint16_t smem[];
    const int sxs = dp + 8; /* point-tile row stride, elements */
    uint16_t *sx = smem;
    uint16_t *sc = smem + BM * sxs;
    const long long m0 = (long long)blockIdx.x * BM;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int wm = warp / 4, wn = warp % 4; /* rows wm * 64.., columns wn * 32.. of a tile */

    /* the point tile, once: rows past n and dims past dim are zero */
    for (int e = tid; e < BM * dp; e += THREADS) {
        const int r = e / dp, j = e % dp;
        const long long gm = m0 + r;
        const float v = (gm < n && j < dim) ? x[gm * dim + j] : 0.f;
        sx[r * sxs + j] = bf16_daz(v);
    }

    const int nkc = dp / BKC, ntiles = (k + BN - 1) / BN;
    const long long nstages = (long long)ntiles * nkc;
    /* Stage s: centroid tile s / nkc, dims (s % nkc) * 32.. : 128 rows x 64 bytes, 512 copies
     * of 16 bytes, two per thread. */
    auto load_stage = [&](long long s) {
        const long long tile = s / nkc;
        const int kc = (int)(s % nkc);
        uint16_t *dst = sc + (int)(s % STAGES) * (BN * CS);
        for (int e = tid; e < BN * 4; e += THREADS) {
            const int r = e / 4, q = e % 4;
            cp_async16(dst + r * CS + q * 8, cb + (tile * BN + r) * dp + kc * BKC + q * 8);
        }
    };

    float rb1[8], rb2[8];
    int ri1[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        rb1[i] = -INFINITY;
        rb2[i] = -INFINITY;
        ri1[i] = -1;
        if (LIST) { /* list mode keeps each row's threshold in rb1 */
            const long long gm = m0 + wm * 64 + (i / 2) * 16 + (i % 2) * 8 + g;
            rb1[i] = gm < n ? thr[gm] : NAN;
        }
    }
    float acc[4][4][4];
    zero_acc(acc);

    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nstages)
            load_stage(s);
        cp_async_commit();
    }
    for (long long s = 0; s < nstages; s++) {
        /* stage s has landed (this thread's copies), and after the barrier everyone's; the
         * barrier also means every warp is done with the buffer the next load overwrites
         * (stage s - 1's), and, on the first pass, that the point tile is written */
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (s + STAGES - 1 < nstages)
            load_stage(s + STAGES - 1);
        cp_async_commit();

        const int kc = (int)(s % nkc);
        const uint16_t *cs = sc + (int)(s % STAGES) * (BN * CS);
#pragma unroll
        for (int ks = 0; ks < BKC / 16; ks++) {
            const int kx = kc * BKC + ks * 16 + 2 * t, kl = ks * 16 + 2 * t;
            /* the warp's 4 B fragments, then A one m16 row block at a time (fewer live
             * registers: two CTAs fit an SM) */
            uint32_t b[4][2];
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const uint16_t *p = cs + (wn * 32 + ni * 8 + g) * CS + kl;
                b[ni][0] = *reinterpret_cast<const uint32_t *>(p);
                b[ni][1] = *reinterpret_cast<const uint32_t *>(p + 8);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                const uint16_t *p0 = sx + (wm * 64 + mi * 16 + g) * sxs + kx;
                const uint16_t *p1 = p0 + 8 * sxs;
                uint32_t a[4];
                a[0] = *reinterpret_cast<const uint32_t *>(p0);
                a[1] = *reinterpret_cast<const uint32_t *>(p1);
                a[2] = *reinterpret_cast<const uint32_t *>(p0 + 8);
                a[3] = *reinterpret_cast<const uint32_t *>(p1 + 8);
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma_bf16(acc[mi][ni], a, b[ni]);
            }
        }

        if (kc == nkc - 1) {
            /* The tile's scores into the running states. A row's 8 scores here first give
             * their maximum: below the running best (the common case once a few tiles are
             * done) it only raises the second best, or in list mode lists nothing; else, and
             * in a tile with padding centroids or before any candidate, the scores go one by
             * one. This thread's columns rise with (ni, e) and earlier tiles' are lower, so a
             * strict > keeps the lowest index among equal scores, and an equal score becomes
             * the second best. fmaxf returns one of its operands (NaN only if both are): the
             * maximum is one of the scores. */
            /* int: k is at most INT32_MAX - 256 here (the entry points' check) */
            const int c0 = (int)(s / nkc) * BN + wn * 32 + 2 * t;
            const bool whole = (int)(s / nkc) * BN + BN <= k;
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int slot = mi * 2 + h;
                    float m = acc[mi][0][h * 2];
#pragma unroll
                    for (int ni = 0; ni < 4; ni++)
                        m = fmaxf(m, fmaxf(acc[mi][ni][h * 2], acc[mi][ni][h * 2 + 1]));
                    const bool quick =
                        whole && (LIST ? !(m >= rb1[slot]) : (ri1[slot] >= 0 && !(m > rb1[slot])));
                    if (quick) {
                        if (!LIST)
                            rb2[slot] = fmaxf(rb2[slot], m);
                        continue;
                    }
#pragma unroll
                    for (int ni = 0; ni < 4; ni++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int col = c0 + ni * 8 + e;
                            const float v = acc[mi][ni][h * 2 + e];
                            if (col >= k)
                                continue; /* padding centroids score 0 and must not count */
                            if (LIST) {
                                if (v >= rb1[slot]) { /* false for a NaN threshold */
                                    const long long gm = m0 + wm * 64 + mi * 16 + h * 8 + g;
                                    const unsigned pos = atomicAdd(&cnt[gm], 1u);
                                    if (pos < LIST_CAP)
                                        cand[gm * LIST_CAP + pos] = col;
                                }
                                continue;
                            }
                            if (v > rb1[slot] || (ri1[slot] < 0 && !isnan(v))) {
                                rb2[slot] = rb1[slot];
                                rb1[slot] = v;
                                ri1[slot] = col;
                            } else {
                                rb2[slot] = fmaxf(rb2[slot], v);
                            }
                        }
                }
            zero_acc(acc);
        }
    }
    cp_async_wait<0>();
    if (LIST)
        return;
    __syncthreads(); /* the stage buffers are free: they hold the cross-warp reduction now */

    /* A point's candidates: the 4 lanes t of its g in each of the 4 warps wn. */
#pragma unroll
    for (int slot = 0; slot < 8; slot++)
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            const float o1 = __shfl_xor_sync(0xffffffffu, rb1[slot], off);
            const int oi = __shfl_xor_sync(0xffffffffu, ri1[slot], off);
            const float o2 = __shfl_xor_sync(0xffffffffu, rb2[slot], off);
            merge(rb1[slot], ri1[slot], rb2[slot], o1, oi, o2);
        }
    float *red_b1 = reinterpret_cast<float *>(sc);
    float *red_b2 = red_b1 + 4 * BM;
    int *red_i1 = reinterpret_cast<int *>(red_b2 + 4 * BM);
    if (t == 0) {
#pragma unroll
        for (int slot = 0; slot < 8; slot++) {
            const int row = wm * 64 + (slot / 2) * 16 + (slot % 2) * 8 + g;
            red_b1[wn * BM + row] = rb1[slot];
            red_b2[wn * BM + row] = rb2[slot];
            red_i1[wn * BM + row] = ri1[slot];
        }
    }
    __syncthreads();
    if (tid < BM && m0 + tid < n) {
        float b1 = red_b1[tid], b2 = red_b2[tid];
        int i1 = red_i1[tid];
        for (int w = 1; w < 4; w++)
            merge(b1, i1, b2, red_b1[w * BM + tid], red_i1[w * BM + tid], red_b2[w * BM + tid]);
        best[m0 + tid] = i1;
        if (b1_out)
            b1_out[m0 + tid] = i1 < 0 ? -INFINITY : b1;
        if (b2_out)
            b2_out[m0 + tid] = b2;
    }
}

/* nearest_cuda.cu's score of x and c, bit for bit: acc = fmaf(x_j, c_j, acc), j rising, from +0,
 * then its zero padding to a multiple of 16 dims, fmaf(0, 0, acc), which changes nothing but
 * an underflowed -0 (to +0). */
__device__ __forceinline__ float fp32_score(const float *__restrict__ x,
                                            const float *__restrict__ c, int dim)
{
    float acc = 0.f;
    for (int j = 0; j < dim; j++)
        acc = fmaf(x[j], c[j], acc);
    if (dim % 16)
        acc = fmaf(0.f, 0.f, acc);
    return acc;
}

/*
 * The encode path's decision, one thread a point: its bound E (header comment) from its norms
 * and the centroid maxima; where b1 - b2 > 2E (and everything is finite) the bf16 argmax is
 * fp32's, and best_score gets the fp32 kernel's own score for it; otherwise the point is
 * appended to list (count) with the threshold of the second pass, thr = b1 - 2E rounded down
 * (NaN where something is not finite: the fp32 kernel then answers).
 */
__global__ void screen_decide(const float *__restrict__ x, long long n, int dim,
                              const float *__restrict__ c, const unsigned *__restrict__ cmax,
                              double gt, double g32, const int *__restrict__ best,
                              const float *__restrict__ b1, const float *__restrict__ b2,
                              float *__restrict__ best_score, int *__restrict__ list,
                              float *__restrict__ thr, unsigned *__restrict__ count)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float *xi = x + i * dim;
    double s = 0, sb = 0, sd = 0;
    for (int j = 0; j < dim; j++) {
        const double v = xi[j], vb = bf16_val(bf16_daz(xi[j]));
        s += v * v;
        sb += vb * vb;
        sd += (vb - v) * (vb - v);
    }
    const double cn = __uint_as_float(cmax[0]), cbn = __uint_as_float(cmax[1]),
                 dcn = __uint_as_float(cmax[2]);
    const double nx = sqrt(s), nxb = sqrt(sb), dx = sqrt(sd);
    const double e = gt * nxb * cbn + dx * cbn + nx * dcn + g32 * nx * cn + 0x1p-100;
    /* 2E and a relative 1e-6 for the double arithmetic's own rounding */
    const double w = 2 * e * (1 + 1e-6);
    const int bi = best[i];
    const float f1 = b1[i], f2 = b2[i];
    const bool sure = bi >= 0 && isfinite(f1) && isfinite(w) && (double)f1 - (double)f2 > w;
    if (!sure) {
        const unsigned at = atomicAdd(count, 1u);
        list[at] = (int)i;
        const double td = (double)f1 - w;
        float tf = (float)td;
        if ((double)tf > td)
            tf = nextafterf(tf, -INFINITY);
        thr[at] = bi >= 0 && isfinite(td) ? tf : NAN;
        return;
    }
    if (best_score)
        best_score[i] = fp32_score(xi, c + (long long)bi * dim, dim);
}

/*
 * The second pass's lists, one thread a point j of the m open ones (xg [m, dim] their rows,
 * list their places): the fp32 kernel's argmax among the listed centroids (greatest fp32 score,
 * lowest index among equal ones) into best and best_score at list[j]. The fp32 argmax c* of the
 * whole table is always listed: with b the first pass's bf16 winner, sb(c*) >= s32(c*) - E >=
 * s32(b) - E >= b1 - 2E, whichever pass computed sb; and so is every centroid scoring as c*
 * does in fp32; so the choice among the list is the fp32 kernel's. An empty or overflowing list
 * or a NaN threshold: the point goes to list2 (count2) for the fp32 kernel.
 */
__global__ void rescore_lists(const float *__restrict__ xg, long long m, int dim,
                              const float *__restrict__ c, const int *__restrict__ list,
                              const float *__restrict__ thr, const unsigned *__restrict__ cnt,
                              const int *__restrict__ cand, int *__restrict__ best,
                              float *__restrict__ best_score, int *__restrict__ list2,
                              unsigned *__restrict__ count2)
{
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= m)
        return;
    const unsigned nc = cnt[j];
    if (nc == 0 || nc > LIST_CAP || isnan(thr[j])) {
        list2[atomicAdd(count2, 1u)] = list[j];
        return;
    }
    const float *xj = xg + j * dim;
    int bi = -1;
    float bs = -INFINITY;
    for (unsigned q = 0; q < nc; q++) {
        const int ci = cand[j * LIST_CAP + q];
        const float sc = fp32_score(xj, c + (long long)ci * dim, dim);
        if (isnan(sc))
            continue;
        if (bi < 0 || sc > bs || (sc == bs && ci < bi)) {
            bs = sc;
            bi = ci;
        }
    }
    if (bi < 0) {
        list2[atomicAdd(count2, 1u)] = list[j];
        return;
    }
    best[list[j]] = bi;
    if (best_score)
        best_score[list[j]] = bs;
}

/* xg [m, dim] = the points list names. */
__global__ void gather_rows(const float *__restrict__ x, int dim, const int *__restrict__ list,
                            long long m, float *__restrict__ xg)
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= m * dim)
        return;
    const long long r = e / dim;
    xg[e] = x[(long long)list[r] * dim + e % dim];
}

/* The fp32 kernel's answers for the listed points, back to their places. */
__global__ void scatter_answers(const int *__restrict__ list, long long m,
                                const int *__restrict__ bg, const float *__restrict__ sg,
                                int *__restrict__ best, float *__restrict__ best_score)
{
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= m)
        return;
    best[list[j]] = bg[j];
    if (best_score)
        best_score[list[j]] = sg[j];
}

/* Padded dims: whole pipeline slices. */
size_t padded_dim(size_t dim)
{
    return (dim + BKC - 1) / BKC * BKC;
}

size_t smem_bytes(size_t dp)
{
    return ((size_t)BM * (dp + 8) + (size_t)STAGES * BN * CS) * sizeof(uint16_t);
}

/* g = n u / (1 - n u) for a sum of n terms at unit roundoff u. */
double gamma_of(double n, double u)
{
    return n * u / (1 - n * u);
}

/* The fused kernel over n points (see nearest_bf16_kernel for the arguments). */
template <bool LIST>
int launch_fused(const float *x, size_t n, size_t dim, const uint16_t *cb, size_t k, int *best,
                 float *b1, float *b2, const float *thr, unsigned *cnt, int *cand)
{
    const size_t dp = padded_dim(dim), smem = smem_bytes(dp);
    KERN_CUDA_TRY(cudaFuncSetAttribute(nearest_bf16_kernel<LIST>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    nearest_bf16_kernel<LIST><<<(unsigned)((n + BM - 1) / BM), THREADS, smem>>>(
        x, (long long)n, (int)dim, (int)dp, cb, (int)k, best, b1, b2, thr, cnt, cand);
    KERN_CUDA_LAUNCHED("nearest_bf16_kernel");
    return KERN_OK;
}

/*
 * The shared part of both entry points: centroids to bf16 (cb, cmax: scratch the caller
 * frees), then the fused kernel into best, b1, b2.
 */
int run_bf16(const float *x, size_t n, const float *centroids, size_t k, size_t dim, int *best,
             float *b1, float *b2, uint16_t **cb_out, size_t *cb_bytes, unsigned **cmax_out)
{
    const size_t dp = padded_dim(dim), kp = (k + BN - 1) / BN * BN;
    const size_t cbb = kp * dp * sizeof(uint16_t);
    uint16_t *cb = NULL;
    unsigned *cmax = NULL;
    int rc;
    *cb_out = NULL;
    *cmax_out = NULL;
    *cb_bytes = cbb;
    if ((rc = kern_scratch((void **)&cb, cbb)) != KERN_OK)
        return rc;
    *cb_out = cb;
    if ((rc = kern_scratch((void **)&cmax, 3 * sizeof(unsigned))) != KERN_OK)
        return rc;
    *cmax_out = cmax;
    KERN_CUDA_TRY(cudaMemsetAsync(cmax, 0, 3 * sizeof(unsigned), 0));
    const unsigned rows_per_block = 256 / 32;
    centroids_to_bf16<<<(unsigned)((kp + rows_per_block - 1) / rows_per_block), 256>>>(
        centroids, (long long)k, (int)dim, (int)dp, (long long)kp, cb, cmax);
    KERN_CUDA_LAUNCHED("centroids_to_bf16");
    return launch_fused<false>(x, n, dim, cb, k, best, b1, b2, NULL, NULL, NULL);
}

/* TARTAN_GPU_NEAREST=fp32 keeps the encode path on the fp32 kernel (the reference, and for
 * benchmarks); anything else, or unset, screens on the tensor cores where they exist. */
bool fp32_forced(void)
{
    const char *e = getenv("TARTAN_GPU_NEAREST");
    return e && strcmp(e, "fp32") == 0;
}

} // namespace

extern "C" int kern_gpu_nearest_bf16_usable(size_t dim)
{
    if (kern_device_cc() < 80 || dim == 0 || padded_dim(dim) > (size_t)MAX_DP)
        return 0;
    /* sm_86 and sm_89 allow 99 KB a CTA, sm_80 163 KB, sm_90 227 KB */
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) !=
            cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return smem_bytes(padded_dim(dim)) <= (size_t)optin;
}

extern "C" const char *kern_gpu_nearest_centroid_bf16_path(void)
{
    return kern_device_cc() >= 80 ? "mma" : NULL;
}

extern "C" int kern_gpu_nearest_centroid_bf16(const float *x, size_t n, const float *centroids,
                                              size_t n_centroids, size_t dim, int32_t *best,
                                              float *best_score)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    if (kern_device_cc() < 80) {
        kern_set_error("nearest_centroid_bf16 (cuda): needs sm_80 or later");
        return KERN_ENODEV;
    }
    if (n == 0)
        return KERN_OK;
    /* Wider points than the resident tile allows, or so many centroids that a tile's column
     * indices would overflow an int: fp32's answer is within bf16's promise. */
    if (!kern_gpu_nearest_bf16_usable(dim) || n_centroids > MAX_K)
        return kern_gpu_nearest_centroid_fp32(x, n, centroids, n_centroids, dim, best, best_score);
    if ((n + BM - 1) / BM > 0x7fffffffu) {
        kern_set_error("nearest_centroid_bf16 (cuda): %zu points beyond one launch", n);
        return KERN_EINVAL;
    }
    uint16_t *cb = NULL;
    unsigned *cmax = NULL;
    size_t cbb = 0;
    int rc = run_bf16(x, n, centroids, n_centroids, dim, best, best_score, NULL, &cb, &cbb, &cmax);
    kern_scratch_free(cb, cbb);
    kern_scratch_free(cmax, 3 * sizeof(unsigned));
    return rc;
}

/* A CUDA status as the kernels' code (KERN_OK, or the failure recorded). */
static int cuda_status(cudaError_t e, const char *what)
{
    return e == cudaSuccess ? KERN_OK : kern_cuda_fail(e, what, __FILE__, __LINE__);
}

/* Evaluates a kernels' status into rc; on failure to out. */
#define STEP(call)                                                                                 \
    do {                                                                                           \
        if ((rc = (call)) != KERN_OK)                                                              \
            goto out;                                                                              \
    } while (0)

/*
 * The encode path. Pass 1: the fused bf16 kernel on every point (best, second best), then
 * screen_decide settles the points whose gap exceeds 2E and lists the others with their
 * thresholds. Pass 2, on those m points gathered: the fused kernel again in list mode (every
 * centroid within the threshold), and rescore_lists takes the fp32 argmax of each list. What is
 * left (lists overflowing LIST_CAP, or anything not finite) goes through the fp32 kernel. Two
 * waits for the device: the host sizes pass 2 and the fp32 pass.
 */
extern "C" int kern_gpu_nearest_centroid_screened(const float *x, size_t n, const float *centroids,
                                                  size_t n_centroids, size_t dim, int32_t *best,
                                                  float *best_score, size_t *n_open, size_t *n_fp32)
{
    cudaGetLastError();
    if (n_open)
        *n_open = 0;
    if (n_fp32)
        *n_fp32 = 0;
    if (n == 0)
        return KERN_OK;
    if (!kern_gpu_nearest_bf16_usable(dim)) {
        kern_set_error("nearest_centroid (cuda): the bf16 screen needs sm_80 and dim <= %d",
                       MAX_DP);
        return KERN_ENODEV;
    }
    if (n > 0x7fffffffu || n_centroids > MAX_K) {
        kern_set_error("nearest_centroid (cuda): %zu points or %zu centroids beyond one screened "
                       "call",
                       n, n_centroids);
        return KERN_EINVAL;
    }
    uint16_t *cb = NULL;
    unsigned *cmax = NULL, *count = NULL, *cnt = NULL;
    size_t cbb = 0;
    float *b1 = NULL, *b2 = NULL, *thr = NULL, *xg = NULL, *sg = NULL;
    int *list = NULL, *list2 = NULL, *cand = NULL, *bg = NULL;
    unsigned nc[2] = {0, 0}; /* open after pass 1, left to fp32 after pass 2 */
    int rc = KERN_OK;
    STEP(kern_scratch((void **)&b1, n * sizeof(float)));
    STEP(kern_scratch((void **)&b2, n * sizeof(float)));
    STEP(kern_scratch((void **)&thr, n * sizeof(float)));
    STEP(kern_scratch((void **)&list, n * sizeof(int)));
    STEP(kern_scratch((void **)&count, 2 * sizeof(unsigned)));
    STEP(run_bf16(x, n, centroids, n_centroids, dim, best, b1, b2, &cb, &cbb, &cmax));
    STEP(cuda_status(cudaMemsetAsync(count, 0, 2 * sizeof(unsigned), 0), "cudaMemsetAsync"));
    {
        /* the tensor cores' steps (dims padded to 16 count too) and fp32's chain */
        const double gt = gamma_of(17.0 * (double)((padded_dim(dim) + 15) / 16), 0x1p-21);
        const double g32 = gamma_of((double)dim, 0x1p-24);
        screen_decide<<<(unsigned)((n + 255) / 256), 256>>>(x, (long long)n, (int)dim, centroids,
                                                            cmax, gt, g32, best, b1, b2, best_score,
                                                            list, thr, count);
        STEP(cuda_status(cudaGetLastError(), "launch of screen_decide"));
    }
    STEP(cuda_status(cudaMemcpy(&nc[0], count, sizeof(unsigned), cudaMemcpyDeviceToHost),
                     "cudaMemcpy (open points)"));
    if (nc[0] > 0) {
        const size_t m = nc[0];
        STEP(kern_scratch((void **)&xg, m * dim * sizeof(float)));
        STEP(kern_scratch((void **)&cnt, m * sizeof(unsigned)));
        STEP(kern_scratch((void **)&cand, m * LIST_CAP * sizeof(int)));
        STEP(kern_scratch((void **)&list2, m * sizeof(int)));
        const long long el = (long long)(m * dim);
        gather_rows<<<(unsigned)((el + 255) / 256), 256>>>(x, (int)dim, list, (long long)m, xg);
        STEP(cuda_status(cudaGetLastError(), "launch of gather_rows"));
        STEP(cuda_status(cudaMemsetAsync(cnt, 0, m * sizeof(unsigned), 0), "cudaMemsetAsync"));
        STEP(launch_fused<true>(xg, m, dim, cb, n_centroids, NULL, NULL, NULL, thr, cnt, cand));
        rescore_lists<<<(unsigned)((m + 255) / 256), 256>>>(xg, (long long)m, (int)dim, centroids,
                                                            list, thr, cnt, cand, best, best_score,
                                                            list2, count + 1);
        STEP(cuda_status(cudaGetLastError(), "launch of rescore_lists"));
        STEP(cuda_status(cudaMemcpy(&nc[1], count + 1, sizeof(unsigned), cudaMemcpyDeviceToHost),
                         "cudaMemcpy (points left to fp32)"));
    }
    if (nc[1] > 0) {
        /* xg is free again (stream order): the rows left, gathered, through fp32 */
        const size_t m = nc[1];
        STEP(kern_scratch((void **)&bg, m * sizeof(int)));
        STEP(kern_scratch((void **)&sg, m * sizeof(float)));
        const long long el = (long long)(m * dim);
        gather_rows<<<(unsigned)((el + 255) / 256), 256>>>(x, (int)dim, list2, (long long)m, xg);
        STEP(cuda_status(cudaGetLastError(), "launch of gather_rows"));
        STEP(kern_gpu_nearest_centroid_fp32(xg, m, centroids, n_centroids, dim, bg, sg));
        scatter_answers<<<(unsigned)((m + 255) / 256), 256>>>(list2, (long long)m, bg, sg, best,
                                                              best_score);
        STEP(cuda_status(cudaGetLastError(), "launch of scatter_answers"));
    }
    if (n_open)
        *n_open = nc[0];
    if (n_fp32)
        *n_fp32 = nc[1];
out:
    kern_scratch_free(cb, cbb);
    kern_scratch_free(cmax, 3 * sizeof(unsigned));
    kern_scratch_free(count, 2 * sizeof(unsigned));
    kern_scratch_free(b1, n * sizeof(float));
    kern_scratch_free(b2, n * sizeof(float));
    kern_scratch_free(thr, n * sizeof(float));
    kern_scratch_free(list, n * sizeof(int));
    kern_scratch_free(xg, (size_t)nc[0] * dim * sizeof(float));
    kern_scratch_free(cnt, (size_t)nc[0] * sizeof(unsigned));
    kern_scratch_free(cand, (size_t)nc[0] * LIST_CAP * sizeof(int));
    kern_scratch_free(list2, (size_t)nc[0] * sizeof(int));
    kern_scratch_free(bg, (size_t)nc[1] * sizeof(int));
    kern_scratch_free(sg, (size_t)nc[1] * sizeof(float));
    return rc;
}

extern "C" int kern_gpu_nearest_centroid(const float *x, size_t n, const float *centroids,
                                         size_t n_centroids, size_t dim, int32_t *best,
                                         float *best_score)
{
    if (!fp32_forced() && kern_gpu_nearest_bf16_usable(dim) && n <= 0x7fffffffu &&
        n_centroids <= MAX_K)
        return kern_gpu_nearest_centroid_screened(x, n, centroids, n_centroids, dim, best,
                                                  best_score, NULL, NULL);
    return kern_gpu_nearest_centroid_fp32(x, n, centroids, n_centroids, dim, best, best_score);
}
