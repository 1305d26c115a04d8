/*
 * topk_cuda.cu: each row's top k of a [rows, n] score matrix on CUDA GPUs, for n into the
 * millions, in memory O(rows * k) beside the input.
 *
 * Every valid score (not NaN, not -inf) gets a 64-bit key: the score mapped to an unsigned
 * integer that sorts best-first in its high 32 bits, its index in the low 32. Keys are distinct,
 * and key order is exactly the required order (higher score first, then lower index), so the top
 * k are the k smallest keys. A radix select finds the k-th smallest key 8 bits at a time: each
 * pass histograms, over the row's keys that share the prefix fixed so far, the next 8 bits, and a
 * one-thread-per-row step picks the bin holding the k-th key. A pass stops the search as soon as
 * the chosen bin holds exactly the keys still wanted (usually after 3 or 4 passes on real
 * scores). Then every key at or below the threshold is gathered (exactly min(k, valid) of them),
 * and each one's place in the output is its rank among them (sorted in shared memory up to 4,096
 * of them, counted beyond).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_check.cuh"

namespace
{

struct row_state {
    unsigned long long prefix; /* key bits fixed so far */
    unsigned long long thresh; /* once done: keys <= thresh are selected */
    int k_rem;                 /* keys still wanted from the current bin */
    int done;                  /* 1: thresh is final (or nothing qualifies) */
    int kk;                    /* min(k, number of valid scores) */
    int count;                 /* keys gathered so far */
};

constexpr int TK_THREADS = 256, TK_PER_THREAD = 16, TK_CHUNK = TK_THREADS * TK_PER_THREAD;

__device__ __forceinline__ bool key_of(float f, unsigned long long i, unsigned long long *key)
{
    if (isnan(f) || f == -INFINITY)
        return false;
    uint32_t u = f == 0.f ? 0u : __float_as_uint(f);                /* -0 and +0 tie */
    const uint32_t up = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* increasing in f */
    *key = ((unsigned long long)(~up) << 32) | i;
    return true;
}

__global__ void __launch_bounds__(TK_THREADS)
    hist_kernel(const float *__restrict__ x, long long n, int pass, row_state *st, unsigned *hist)
{
    const long long row = blockIdx.y;
    if (st[row].done)
        return;
    __shared__ unsigned h[256];
    h[threadIdx.x] = 0;
    __syncthreads();
    const int shift = 56 - 8 * pass;
    const unsigned long long prefix = st[row].prefix;
    const float *xr = x + row * n;
    const long long base = (long long)blockIdx.x * TK_CHUNK;
    for (int j = 0; j < TK_PER_THREAD; j++) {
        const long long i = base + j * TK_THREADS + threadIdx.x;
        unsigned long long key;
        if (i < n && key_of(__ldg(xr + i), (unsigned long long)i, &key) &&
            (pass == 0 || (key >> (shift + 8)) == (prefix >> (shift + 8))))
            atomicAdd(&h[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    if (h[threadIdx.x])
        atomicAdd(&hist[row * 256 + threadIdx.x], h[threadIdx.x]);
}

/* The bin step of a pass, one warp per row: lane l holds bins [8 l, 8 l + 8), a warp scan of the
 * lanes' sums finds the lane, then the bin, holding the k_rem-th key. Why a warp: one thread a
 * row walked the 256 bins and cleared them in a chain of dependent loads, ~28 us a launch at
 * 1,000 rows, 12% of a batched default search's GPU time at 1M documents (H200). A row done in
 * an earlier pass returns at once (its bins were never touched again), and a row done in this
 * one leaves its bins (no pass adds to them again; every call clears the scratch first). */
constexpr int SCAN_ROWS = 4; /* warps, so rows, a block */

__global__ void __launch_bounds__(32 * SCAN_ROWS)
    scan_kernel(int pass, long long rows, long long k, row_state *st, unsigned *hist)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * SCAN_ROWS + threadIdx.x / 32;
    if (row >= rows)
        return; /* the whole warp: row is the warp's */
    row_state s = st[row];
    if (s.done)
        return;
    unsigned *h = hist + row * 256;
    unsigned v[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        v[j] = h[lane * 8 + j];
        sum += v[j];
    }
    unsigned inc = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_up_sync(full, inc, o);
        if (lane >= o)
            inc += t;
    }
    const unsigned total = __shfl_sync(full, inc, 31);
    const int shift = 56 - 8 * pass;
    if (pass == 0) {
        s.kk = (int)(total < (unsigned long long)k ? total : (unsigned long long)k);
        s.k_rem = s.kk;
        if (s.kk == 0) {
            s.done = 1;
            s.thresh = 0;
        }
    }
    if (!s.done) {
        /* The first lane whose running count reaches k_rem, then its first such bin. */
        const unsigned ballot = __ballot_sync(full, inc >= (unsigned)s.k_rem);
        const int at = ballot ? __ffs(ballot) - 1 : 31;
        unsigned cum = inc - sum, hb = 0;
        int b = 0;
        if (lane == at) {
            int j = 0;
            for (; j < 8; j++) {
                if (cum + v[j] >= (unsigned)s.k_rem)
                    break;
                cum += v[j];
            }
            if (j == 8) { /* unreachable: k_rem never exceeds the prefix's count */
                j = 7;
                cum -= v[7];
            }
            b = lane * 8 + j;
            hb = v[j];
        }
        b = __shfl_sync(full, b, at);
        cum = __shfl_sync(full, cum, at);
        hb = __shfl_sync(full, hb, at);
        s.k_rem -= (int)cum;
        s.prefix |= (unsigned long long)b << shift;
        if (hb == (unsigned)s.k_rem) {
            s.done = 1;
            s.thresh = shift ? s.prefix | ((1ull << shift) - 1) : s.prefix;
        }
    }
    if (!s.done) /* the next pass counts into these bins again */
#pragma unroll
        for (int j = 0; j < 8; j++)
            h[lane * 8 + j] = 0;
    if (lane == 0)
        st[row] = s;
}

__global__ void __launch_bounds__(TK_THREADS)
    gather_kernel(const float *__restrict__ x, long long n, long long k, row_state *st,
                  unsigned long long *cand)
{
    const long long row = blockIdx.y;
    if (st[row].kk == 0)
        return;
    const unsigned long long t = st[row].thresh;
    const float *xr = x + row * n;
    const long long base = (long long)blockIdx.x * TK_CHUNK;
    for (int j = 0; j < TK_PER_THREAD; j++) {
        const long long i = base + j * TK_THREADS + threadIdx.x;
        unsigned long long key;
        if (i < n && key_of(__ldg(xr + i), (unsigned long long)i, &key) && key <= t) {
            const int pos = atomicAdd(&st[row].count, 1);
            if (pos < k)
                cand[row * k + pos] = key;
        }
    }
}

__global__ void __launch_bounds__(TK_THREADS)
    rank_kernel(const float *__restrict__ x, long long n, long long k, long long kout,
                const row_state *st, const unsigned long long *cand, int64_t *idx, float *val)
{
    const long long row = blockIdx.y;
    const long long i = (long long)blockIdx.x * TK_THREADS + threadIdx.x;
    const int kk = st[row].kk;
    const unsigned long long *c = cand + row * k;
    __shared__ unsigned long long tile[TK_THREADS];
    const unsigned long long mine = i < kk ? c[i] : ~0ull;
    long long rank = 0;
    for (int t0 = 0; t0 < kk; t0 += TK_THREADS) {
        __syncthreads();
        tile[threadIdx.x] = t0 + threadIdx.x < kk ? c[t0 + threadIdx.x] : ~0ull;
        __syncthreads();
        const int m = min(TK_THREADS, kk - t0);
        for (int j = 0; j < m; j++)
            rank += tile[j] < mine;
    }
    if (i < kk) {
        const long long at = (long long)(mine & 0xffffffffu);
        idx[row * kout + rank] = at;
        val[row * kout + rank] = x[row * n + at];
    } else if (i < kout) {
        idx[row * kout + i] = -1;
        val[row * kout + i] = KERN_EMPTY_SCORE;
    }
}

/*
 * The rank step for kk <= TK_SORT_MAX: a block a row sorts its keys in shared memory (bitonic,
 * padded to a power of two with keys above every real one) and writes them in that order, the
 * same output as rank_kernel's counting. Why: counting is kk^2 comparisons a row, and at kk
 * 4,096 (the adaptive search orders every query's candidates to its depth cap) rank_kernel
 * took 0.39 ms for 64 rows, 5% of a batch's GPU time at 1M documents (ncu, H200).
 */
constexpr int TK_SORT_MAX = 4096;

__global__ void __launch_bounds__(TK_THREADS)
    sort_rank_kernel(const float *__restrict__ x, long long n, long long k, long long kout,
                     const row_state *st, const unsigned long long *cand, int64_t *idx, float *val)
{
    __shared__ unsigned long long key[TK_SORT_MAX];
    const long long row = blockIdx.x;
    const int kk = st[row].kk;
    const unsigned long long *c = cand + row * k;
    int p = 1;
    while (p < kk)
        p <<= 1;
    for (int i = threadIdx.x; i < p; i += TK_THREADS)
        key[i] = i < kk ? c[i] : ~0ull;
    __syncthreads();
    for (int size = 2; size <= p; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < p / 2; i += TK_THREADS) {
                const int lo = 2 * stride * (i / stride) + i % stride, hi = lo + stride;
                const unsigned long long a = key[lo], b = key[hi];
                if ((a > b) == ((lo & size) == 0)) {
                    key[lo] = b;
                    key[hi] = a;
                }
            }
            __syncthreads();
        }
    for (long long i = threadIdx.x; i < kout; i += TK_THREADS) {
        if (i < kk) {
            const long long at = (long long)(key[i] & 0xffffffffu);
            idx[row * kout + i] = at;
            val[row * kout + i] = x[row * n + at];
        } else {
            idx[row * kout + i] = -1;
            val[row * kout + i] = KERN_EMPTY_SCORE;
        }
    }
}

/*
 * Short rows (n <= TK_SMALL_N, k <= TK_SMALL_K), e.g. a query's tokens x centroids for the top
 * ncells: one CTA per row runs the whole select (the same passes, the row re-read from L1/L2
 * each pass), gathers and ranks in shared memory. One launch instead of 18: the multi-kernel
 * path is bound by launches at this size (measured 162 us for 32 rows x 16384).
 */
constexpr int TK_SMALL_N = 1 << 16, TK_SMALL_K = 1024;

__global__ void __launch_bounds__(TK_THREADS)
    topk_small_kernel(const float *__restrict__ x, long long n, long long k, int64_t *idx,
                      float *val)
{
    const long long row = blockIdx.x;
    const float *xr = x + row * n;
    __shared__ unsigned h[256];
    __shared__ unsigned long long s_prefix, s_thresh;
    __shared__ int s_krem, s_done, s_kk, s_count;
    __shared__ unsigned long long cand[TK_SMALL_K];
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_done = 0;
        s_count = 0;
    }
    for (int pass = 0; pass < 8; pass++) {
        h[threadIdx.x] = 0;
        __syncthreads();
        if (s_done)
            break;
        const int shift = 56 - 8 * pass;
        const unsigned long long prefix = s_prefix;
        for (long long i = threadIdx.x; i < n; i += TK_THREADS) {
            unsigned long long key;
            if (key_of(xr[i], (unsigned long long)i, &key) &&
                (pass == 0 || (key >> (shift + 8)) == (prefix >> (shift + 8))))
                atomicAdd(&h[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (pass == 0) {
                unsigned long long total = 0;
                for (int b = 0; b < 256; b++)
                    total += h[b];
                s_kk = (int)(total < (unsigned long long)k ? total : (unsigned long long)k);
                s_krem = s_kk;
                if (s_kk == 0)
                    s_done = 1;
            }
            if (!s_done) {
                unsigned cum = 0;
                int b = 0;
                for (; b < 255; b++) {
                    if (cum + h[b] >= (unsigned)s_krem)
                        break;
                    cum += h[b];
                }
                s_krem -= (int)cum;
                s_prefix |= (unsigned long long)b << shift;
                if (h[b] == (unsigned)s_krem) {
                    s_done = 1;
                    s_thresh = shift ? s_prefix | ((1ull << shift) - 1) : s_prefix;
                }
            }
        }
        __syncthreads();
    }
    const int kk = s_kk;
    if (kk > 0) {
        const unsigned long long t = s_thresh;
        for (long long i = threadIdx.x; i < n; i += TK_THREADS) {
            unsigned long long key;
            if (key_of(xr[i], (unsigned long long)i, &key) && key <= t) {
                const int pos = atomicAdd(&s_count, 1);
                if (pos < kk)
                    cand[pos] = key;
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < k; i += TK_THREADS) {
        if (i < kk) {
            const unsigned long long mine = cand[i];
            int rank = 0;
            for (int j = 0; j < kk; j++)
                rank += cand[j] < mine;
            const long long at = (long long)(mine & 0xffffffffu);
            idx[row * k + rank] = at;
            val[row * k + rank] = xr[at];
        } else {
            idx[row * k + i] = -1;
            val[row * k + i] = KERN_EMPTY_SCORE;
        }
    }
}

} // namespace

extern "C" int kern_gpu_topk_rows(const float *x, size_t rows, size_t n, size_t k, int64_t *idx,
                                  float *val)
{
    cudaGetLastError(); /* a stale error of an earlier call is not this call's */
    if (n > 0xffffffffu || rows > 65535 || k > 0x7fffffff ||
        (k + TK_THREADS - 1) / TK_THREADS > 0x7fffffffu) {
        kern_set_error("topk_rows (cuda): %zu rows x %zu scores, k %zu beyond one launch", rows, n,
                       k);
        return KERN_EINVAL;
    }
    if (n <= (size_t)TK_SMALL_N && k <= (size_t)TK_SMALL_K && rows <= 0x7fffffffu) {
        topk_small_kernel<<<(unsigned)rows, TK_THREADS>>>(x, (long long)n, (long long)k, idx, val);
        KERN_CUDA_LAUNCHED("topk_small_kernel");
        return KERN_OK;
    }
    const size_t chunks = n ? (n + TK_CHUNK - 1) / TK_CHUNK : 1;
    const size_t kc = k < n ? k : (n ? n : 1); /* candidates per row */
    const size_t st_bytes = rows * sizeof(row_state);
    const size_t h_bytes = rows * 256 * sizeof(unsigned);
    const size_t c_bytes = rows * kc * sizeof(unsigned long long);
    char *scratch = NULL;
    int rc = kern_scratch((void **)&scratch, st_bytes + h_bytes + c_bytes);
    if (rc != KERN_OK)
        return rc;
    row_state *st = (row_state *)scratch;
    unsigned *hist = (unsigned *)(scratch + st_bytes);
    unsigned long long *cand = (unsigned long long *)(scratch + st_bytes + h_bytes);
    cudaError_t e = cudaMemsetAsync(scratch, 0, st_bytes + h_bytes, 0);
    if (e != cudaSuccess) {
        rc = kern_cuda_fail(e, "cudaMemsetAsync", __FILE__, __LINE__);
        goto out;
    }
    {
        const dim3 grid((unsigned)chunks, (unsigned)rows);
        const unsigned sblocks = (unsigned)((rows + SCAN_ROWS - 1) / SCAN_ROWS);
        for (int pass = 0; pass < 8; pass++) {
            hist_kernel<<<grid, TK_THREADS>>>(x, (long long)n, pass, st, hist);
            scan_kernel<<<sblocks, 32 * SCAN_ROWS>>>(pass, (long long)rows, (long long)kc, st,
                                                     hist);
        }
        gather_kernel<<<grid, TK_THREADS>>>(x, (long long)n, (long long)kc, st, cand);
        /* The rank step writes all k output slots: padding past the qualifying ones too. */
        if (kc <= (size_t)TK_SORT_MAX) {
            sort_rank_kernel<<<(unsigned)rows, TK_THREADS>>>(x, (long long)n, (long long)kc,
                                                             (long long)k, st, cand, idx, val);
        } else {
            const dim3 rgrid((unsigned)((k + TK_THREADS - 1) / TK_THREADS), (unsigned)rows);
            rank_kernel<<<rgrid, TK_THREADS>>>(x, (long long)n, (long long)kc, (long long)k, st,
                                               cand, idx, val);
        }
        e = cudaGetLastError();
        if (e != cudaSuccess)
            rc = kern_cuda_fail(e, "launch of the top-k kernels", __FILE__, __LINE__);
    }
out:
    kern_scratch_free(scratch, st_bytes + h_bytes + c_bytes);
    return rc;
}
