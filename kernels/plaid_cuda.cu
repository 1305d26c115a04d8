/*
 * plaid_cuda.cu: the batched PLAID stages of a GPU search over an index held in device memory
 * (kernels.h, "The GPU search pipeline"): each token's probed centroids, the candidate union as
 * one bitmap per query, centroid interaction with and without pruning, gathers between stages,
 * and the inverted lists rebuilt from the resident codes. The exact stage is in residual_cuda.cu
 * (it shares the residual-fused kernel).
 *
 * Scores are read from ST [K, ld], the centroid scores transposed: a document token's scores
 * against one query's tokens are one contiguous run of a row, so a warp whose lanes are the
 * query's tokens reads a token's scores in one or a few cache lines.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.cuh"
#include "order_key_cuda.cuh"

namespace
{

/* An environment variable set to "0": a benchmark's switch back to the former kernel. */
static int getenv_flag_off(const char *name)
{
    const char *e = getenv(name);
    return e && !strcmp(e, "0");
}

/* ---- probes: each column's best ncells rows of ST ------------------------------------- */

constexpr int PROBE_THREADS = 128;
constexpr int PROBE_BATCH = 8;
/* Fewest rows a segment scans: enough segments to fill the GPU for one query's 32 columns. */
constexpr long long PROBE_SEG_ROWS = 32;
constexpr long long PROBE_MERGE_ENTRIES = 16384; /* segments x n a column, at most */

/* Keeps the n best (value descending, row ascending) in v/ix, sorted; rows arrive ascending,
 * so a later row with an equal value never displaces an earlier one. */
template <int NC>
__device__ __forceinline__ void keep_best(float (&v)[NC], int (&ix)[NC], int n, float x, int r)
{
    if (!(x > v[n - 1]))
        return;
    int p = n - 1;
    while (p > 0 && x > v[p - 1]) {
        v[p] = v[p - 1];
        ix[p] = ix[p - 1];
        p--;
    }
    v[p] = x;
    ix[p] = r;
}

/* order_key / key_value (order_key_cuda.cuh): NaN is excluded here by the callers (keep_best
 * drops it, fmaxf skips it). */

/* Phase 0 (with a finite margin): each column's best value, as an order key in colkey[j]
 * (zeroed by the caller: below every value's key). Why: the merge keeps only rows within margin
 * of that best, so a segment that knows it skips every row below at once; without it, every
 * segment kept its own best n, and the first few hundred rows of each segment inserted into a
 * list in local memory with the warp diverged (15% of a default search's GPU time at 2M
 * documents, H200). The same grid and loads as phase 1, one atomic a segment and column. */
__global__ void __launch_bounds__(PROBE_THREADS)
    probe_colmax_kernel(const float *__restrict__ ST, long long K, long long ld, long long seg_rows,
                        const float *__restrict__ col_margin, unsigned *__restrict__ colkey)
{
    const long long j = (long long)blockIdx.x * PROBE_THREADS + threadIdx.x;
    if (j >= ld || (col_margin && col_margin[j] < 0.f))
        return; /* a column that probes nothing keeps key 0: no best, nothing kept */
    const long long r0 = (long long)blockIdx.y * seg_rows;
    const long long r1 = r0 + seg_rows < K ? r0 + seg_rows : K;
    float best = -INFINITY;
    for (long long r = r0; r < r1; r += PROBE_BATCH) {
        float x[PROBE_BATCH];
#pragma unroll
        for (int u = 0; u < PROBE_BATCH; u++)
            x[u] = r + u < r1 ? __ldg(ST + (r + u) * ld + j) : -INFINITY;
#pragma unroll
        for (int u = 0; u < PROBE_BATCH; u++)
            best = fmaxf(best, x[u]);
    }
    if (best > -INFINITY)
        atomicMax(colkey + j, order_key(best));
}

/* Phase 1: segment s of the rows, column j: its best n into part [(s * ld + j) * n ...]. */
template <int NC>
__global__ void __launch_bounds__(PROBE_THREADS)
    probe_segment_kernel(const float *__restrict__ ST, long long K, long long ld, int n,
                         long long seg_rows, const unsigned *__restrict__ colkey,
                         const unsigned *__restrict__ tilekey, float margin,
                         const float *__restrict__ col_margin, float *__restrict__ pv,
                         int *__restrict__ pi)
{
    const long long j = (long long)blockIdx.x * PROBE_THREADS + threadIdx.x;
    if (j >= ld)
        return;
    if (col_margin)
        margin = col_margin[j];
    float v[NC];
    int ix[NC];
    for (int i = 0; i < NC; i++) {
        v[i] = -INFINITY;
        ix[i] = -1;
    }
    if (margin < 0.f) { /* the column probes nothing: no loads, an empty list */
        const long long o = ((long long)blockIdx.y * ld + j) * n;
        for (int i = 0; i < n; i++) {
            pv[o + i] = v[i];
            pi[o + i] = ix[i];
        }
        return;
    }
    const long long r0 = (long long)blockIdx.y * seg_rows;
    const long long r1 = r0 + seg_rows < K ? r0 + seg_rows : K;
    float last = -INFINITY;
    /* Rows below the merge's threshold (the column's best less margin, the same float
     * operation as the merge's) are never probed: skipped here. No column best (all rows
     * NaN or -INFINITY): nothing is kept, as before. */
    float thr = -INFINITY;
    if (colkey) {
        const unsigned k = colkey[j];
        thr = k ? key_value(k) - margin : INFINITY;
    }
    /* PROBE_BATCH loads in flight before they are kept: one at a time, each row waited for
     * its load (a latency chain of seg_rows loads). Rows past the run's end read as -INFINITY,
     * never kept. With tilekey, rows go in the table kernel's runs of KERN_CUDA_TILE_ROWS, and
     * a run whose best is below thr (or that has no value above -inf) is not read: no row of
     * it could be kept. At K 131,072 this pass read the whole fp32 table (0.78 ms of a
     * 128-query chunk at 1M documents, H200) to keep a few rows a column. */
    for (long long r = r0; r < r1;) {
        long long rend = r1;
        if (tilekey) {
            const long long t = r / KERN_CUDA_TILE_ROWS;
            rend = (t + 1) * KERN_CUDA_TILE_ROWS < r1 ? (t + 1) * KERN_CUDA_TILE_ROWS : r1;
            const unsigned tk = tilekey[t * ld + j];
            if (!tk || key_value(tk) < thr) {
                r = rend;
                continue;
            }
        }
        for (; r < rend; r += PROBE_BATCH) {
            float x[PROBE_BATCH];
#pragma unroll
            for (int u = 0; u < PROBE_BATCH; u++)
                x[u] = r + u < rend ? __ldg(ST + (r + u) * ld + j) : -INFINITY;
                /* The list's last value in a register: most rows fall below it and cost no read
                 * of the (local-memory) list. */
#pragma unroll
            for (int u = 0; u < PROBE_BATCH; u++)
                if (x[u] > last && x[u] >= thr) {
                    keep_best<NC>(v, ix, n, x[u], (int)(r + u));
                    last = v[n - 1];
                }
        }
        r = rend;
    }
    const long long o = ((long long)blockIdx.y * ld + j) * n;
    for (int i = 0; i < n; i++) {
        pv[o + i] = v[i];
        pi[o + i] = ix[i];
    }
}

/* Phase 2: each column's best n over its segments' lists, one block per column. The serial
 * merge this replaces (one thread a column, segs x n entries in turn) cost a fixed ~0.7 ms a
 * query at 128 segments and n 16: a latency chain of dependent loads. Here the block finds the
 * column's best, keeps the entries within margin of it (all of them with no margin), narrows
 * them to about n by a radix select on the value when more than MERGE_CAP remain, and ranks the
 * survivors against each other in shared memory: rank = the survivors better than it (value
 * descending, row ascending, as keep_best orders them), so the output is the serial merge's. */
constexpr int MERGE_THREADS = 256;
constexpr int MERGE_CAP = 1024;

__device__ __forceinline__ float block_max(float x, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = red[0];
    for (int w = 1; w < MERGE_THREADS / 32; w++)
        x = fmaxf(x, red[w]);
    return x;
}

__device__ __forceinline__ int block_count(int x, int *red)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = 0;
    for (int w = 0; w < MERGE_THREADS / 32; w++)
        x += red[w];
    return x;
}

/* Where the merge's e-th entry of column j sits: entry e is slot e % n of segment e / n, and a
 * segment's n slots per column follow one another, columns ld apart. */
__device__ __forceinline__ long long merge_at(long long e, int n, long long ld, long long j)
{
    return ((e / n) * ld + j) * n + e % n;
}

template <int NC>
__global__ void __launch_bounds__(MERGE_THREADS)
    probe_merge_kernel(const float *__restrict__ pv, const int *__restrict__ pi, int segs,
                       long long ld, int n, float margin, const float *__restrict__ col_margin,
                       int32_t *__restrict__ probes)
{
    __shared__ float s_v[MERGE_CAP];
    __shared__ int s_r[MERGE_CAP];
    __shared__ unsigned s_hist[256];
    __shared__ float s_fred[MERGE_THREADS / 32];
    __shared__ int s_ired[MERGE_THREADS / 32];
    __shared__ int s_at;
    __shared__ unsigned s_pick[2];
    const long long j = blockIdx.x;
    const int tid = threadIdx.x;
    const long long entries = (long long)segs * n;
    if (col_margin)
        margin = col_margin[j];
    if (margin < 0.f) { /* the column probes nothing */
        for (int i = tid; i < n; i += MERGE_THREADS)
            probes[j * n + i] = -1;
        return;
    }
    /* The column's best: the best of the segments' firsts. */
    float best = -INFINITY;
    for (int sg = tid; sg < segs; sg += MERGE_THREADS) {
        const long long o = ((long long)sg * ld + j) * n;
        if (pi[o] >= 0)
            best = fmaxf(best, pv[o]);
    }
    best = block_max(best, s_fred);
    /* Kept values are above -INFINITY, so none kept leaves every probe -1 (as before). */
    float thr = best - margin;
    int mine = 0;
    for (long long e = tid; e < entries; e += MERGE_THREADS) {
        const long long o = merge_at(e, n, ld, j);
        mine += pi[o] >= 0 && pv[o] >= thr;
    }
    int total = block_count(mine, s_ired);
    const int want = total < n ? total : n;
    if (total > MERGE_CAP) {
        /* The want-th best value among the survivors, 8 bits of its key at a time. */
        unsigned prefix = 0, mask = 0;
        int left = want;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += MERGE_THREADS)
                s_hist[b] = 0;
            __syncthreads();
            for (long long e = tid; e < entries; e += MERGE_THREADS) {
                const long long o = merge_at(e, n, ld, j);
                if (pi[o] < 0 || !(pv[o] >= thr))
                    continue;
                const unsigned k = order_key(pv[o]);
                if ((k & mask) == prefix)
                    atomicAdd(&s_hist[(k >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                int acc = 0, b = 255;
                while (b > 0 && acc + (int)s_hist[b] < left)
                    acc += (int)s_hist[b--];
                s_pick[0] = (unsigned)b;
                s_pick[1] = (unsigned)(left - acc);
            }
            __syncthreads();
            prefix |= s_pick[0] << shift;
            mask |= 255u << shift;
            left = (int)s_pick[1];
            __syncthreads();
        }
        /* Every survivor at or above that value; more than fit only with many exact ties. */
        thr = fmaxf(thr, key_value(prefix));
        mine = 0;
        for (long long e = tid; e < entries; e += MERGE_THREADS) {
            const long long o = merge_at(e, n, ld, j);
            mine += pi[o] >= 0 && pv[o] >= thr;
        }
        total = block_count(mine, s_ired);
    }
    if (total > MERGE_CAP) {
        /* Ties beyond the shared list: the serial merge, by one thread. */
        if (tid == 0) {
            float v[NC];
            int ix[NC];
            for (int i = 0; i < NC; i++) {
                v[i] = -INFINITY;
                ix[i] = -1;
            }
            for (int sg = 0; sg < segs; sg++) {
                const long long o = ((long long)sg * ld + j) * n;
                for (int i = 0; i < n; i++)
                    if (pi[o + i] >= 0)
                        keep_best<NC>(v, ix, n, pv[o + i], pi[o + i]);
            }
            for (int i = 0; i < n; i++)
                probes[j * n + i] = i == 0 || v[i] >= v[0] - margin ? ix[i] : -1;
        }
        return;
    }
    if (tid == 0)
        s_at = 0;
    __syncthreads();
    for (long long e = tid; e < entries; e += MERGE_THREADS) {
        const long long o = merge_at(e, n, ld, j);
        if (pi[o] >= 0 && pv[o] >= thr) {
            const int at = atomicAdd(&s_at, 1);
            s_v[at] = pv[o];
            s_r[at] = pi[o];
        }
    }
    __syncthreads();
    for (int x = tid; x < total; x += MERGE_THREADS) {
        const float vx = s_v[x];
        const int rx = s_r[x];
        int rank = 0;
        for (int y = 0; y < total && rank < want; y++)
            rank += s_v[y] > vx || (s_v[y] == vx && s_r[y] < rx);
        if (rank < want)
            probes[j * n + rank] = rx;
    }
    for (int i = want + tid; i < n; i += MERGE_THREADS)
        probes[j * n + i] = -1;
}

template <int NC>
int launch_probe(const float *ST, size_t K, size_t ld, int n, float margin, const float *col_margin,
                 const unsigned *colbest, const unsigned *tilekey, int32_t *probes)
{
    /* Enough segments to fill the GPU when there are few columns; each at least
     * PROBE_SEG_ROWS rows, and at most PROBE_MERGE_ENTRIES / n of them: the merge's block
     * reads every segment's n entries of its column several times, so a single query's 32
     * columns over 4,096 segments of K 131,072 spent 175 us a query there (ncu, H200) while
     * phase 1 took 62. */
    const long long colblocks = (long long)((ld + PROBE_THREADS - 1) / PROBE_THREADS);
    long long segs = 4096 / colblocks;
    if (segs > PROBE_MERGE_ENTRIES / n)
        segs = PROBE_MERGE_ENTRIES / n;
    if (segs > ((long long)K + PROBE_SEG_ROWS - 1) / PROBE_SEG_ROWS)
        segs = ((long long)K + PROBE_SEG_ROWS - 1) / PROBE_SEG_ROWS;
    if (segs < 1)
        segs = 1;
    if (segs > 65535)
        segs = 65535;
    const long long seg_rows = ((long long)K + segs - 1) / segs;
    const size_t part = (size_t)segs * ld * (size_t)n;
    float *pv = NULL;
    int rc = kern_scratch((void **)&pv, part * (sizeof(float) + sizeof(int)));
    if (rc != KERN_OK)
        return rc;
    int *pi = (int *)(pv + part);
    const unsigned cols = (unsigned)((ld + PROBE_THREADS - 1) / PROBE_THREADS);
    /* A finite margin: the columns' best first (phase 0), unless the table kernel gave them. */
    unsigned *colkey = NULL;
    const int pre = margin < INFINITY && !colbest && !getenv_flag_off("TARTAN_PROBE_COLMAX");
    if (pre) {
        if ((rc = kern_scratch((void **)&colkey, ld * sizeof(unsigned))) != KERN_OK) {
            kern_scratch_free(pv, part * (sizeof(float) + sizeof(int)));
            return rc;
        }
        cudaMemsetAsync(colkey, 0, ld * sizeof(unsigned), 0);
        probe_colmax_kernel<<<dim3(cols, (unsigned)segs), PROBE_THREADS>>>(
            ST, (long long)K, (long long)ld, seg_rows, col_margin, colkey);
    }
    probe_segment_kernel<NC><<<dim3(cols, (unsigned)segs), PROBE_THREADS>>>(
        ST, (long long)K, (long long)ld, n, seg_rows,
        margin < INFINITY && colbest ? colbest : colkey,
        margin < INFINITY && colbest ? tilekey : NULL, margin, col_margin, pv, pi);
    probe_merge_kernel<NC><<<(unsigned)ld, MERGE_THREADS>>>(pv, pi, (int)segs, (long long)ld, n,
                                                            margin, col_margin, probes);
    cudaError_t e = cudaGetLastError();
    rc = e == cudaSuccess ? KERN_OK : kern_cuda_fail(e, "launch of probe kernels", __FILE__, __LINE__);
    if (colkey)
        kern_scratch_free(colkey, ld * sizeof(unsigned));
    kern_scratch_free(pv, part * (sizeof(float) + sizeof(int)));
    return rc;
}

/* ---- candidates ------------------------------------------------------------------------- */

/* Block b: probe b (token b / ncells); every document of its list that is live and allowed
 * gets its bit in its query's bitmap; newly set bits are counted. */
__global__ void mark_kernel(const int32_t *__restrict__ probes, int ncells,
                            const int64_t *__restrict__ q_off, int nq,
                            const int64_t *__restrict__ ivf_off,
                            const uint32_t *__restrict__ ivf_docs,
                            const uint32_t *__restrict__ live, const uint32_t *__restrict__ allowed,
                            long long words, uint32_t *__restrict__ bits,
                            unsigned long long *__restrict__ counts)
{
    __shared__ int s_q;
    const long long b = blockIdx.x;
    const int32_t c = probes[b];
    if (c < 0)
        return;
    if (threadIdx.x == 0) {
        /* The query whose token rows hold token b / ncells. */
        const long long t = b / ncells;
        int lo = 0, hi = nq - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (q_off[mid] <= t)
                lo = mid;
            else
                hi = mid - 1;
        }
        s_q = lo;
    }
    __syncthreads();
    uint32_t *qb = bits + (long long)s_q * words;
    const long long e0 = ivf_off[c], e1 = ivf_off[c + 1];
    const int lane = threadIdx.x & 31;
    for (long long e = e0 + threadIdx.x; e - threadIdx.x < e1; e += blockDim.x) {
        bool fresh = false;
        if (e < e1) {
            const uint32_t d = __ldg(ivf_docs + e), w = d >> 5, bit = 1u << (d & 31);
            if ((__ldg(live + w) & bit) && (!allowed || (__ldg(allowed + w) & bit)))
                fresh = !(atomicOr(qb + w, bit) & bit);
        }
        const unsigned m = __ballot_sync(0xffffffffu, fresh);
        if (lane == 0 && m)
            atomicAdd(counts + s_q, (unsigned long long)__popc(m));
    }
}

constexpr int TAKE_THREADS = 1024;

/* Block q: query q's bitmap into ascending document numbers, clearing it. */
__global__ void __launch_bounds__(TAKE_THREADS)
    take_kernel(uint32_t *__restrict__ bits, long long words, uint32_t *__restrict__ docs,
                long long width)
{
    __shared__ unsigned long long s_sum[TAKE_THREADS];
    uint32_t *qb = bits + (long long)blockIdx.x * words;
    uint32_t *out = docs + (long long)blockIdx.x * width;
    const long long per = (words + TAKE_THREADS - 1) / TAKE_THREADS;
    const long long w0 = threadIdx.x * per, w1 = w0 + per < words ? w0 + per : words;
    unsigned long long mine = 0;
    for (long long w = w0; w < w1; w++)
        mine += __popc(qb[w]);
    s_sum[threadIdx.x] = mine;
    __syncthreads();
    /* Inclusive scan (Hillis-Steele) over the block. */
    for (int o = 1; o < TAKE_THREADS; o <<= 1) {
        const unsigned long long add = threadIdx.x >= o ? s_sum[threadIdx.x - o] : 0;
        __syncthreads();
        s_sum[threadIdx.x] += add;
        __syncthreads();
    }
    long long at = (long long)(s_sum[threadIdx.x] - mine);
    const long long total = (long long)s_sum[TAKE_THREADS - 1];
    for (long long w = w0; w < w1; w++) {
        uint32_t x = qb[w];
        if (!x)
            continue;
        qb[w] = 0;
        while (x) {
            const int i = __ffs(x) - 1;
            x &= x - 1;
            if (at < width)
                out[at] = (uint32_t)(w * 32 + i);
            at++;
        }
    }
    for (long long i = (total < width ? total : width) + threadIdx.x; i < width; i += TAKE_THREADS)
        out[i] = KERN_NO_DOC;
}

/* ---- centroid interaction ---------------------------------------------------------------- */

constexpr int INT_WARPS = 8;
constexpr int INT_GROUPS = 8; /* query tokens held per pass: 8 x 32 */
constexpr int INT_UNROLL = 4; /* document tokens whose rows are loaded together */

__global__ void __launch_bounds__(INT_WARPS * 32)
    interaction_batch_kernel(const float *__restrict__ ST, long long ld,
                             const int64_t *__restrict__ q_off, const int64_t *__restrict__ doc_off,
                             const uint32_t *__restrict__ codes, const uint32_t *__restrict__ docs,
                             long long width, long long n, int prune,
                             const int64_t *__restrict__ counts, long long prune_over,
                             const uint32_t *__restrict__ keep, long long kw,
                             float *__restrict__ approx)
{
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * INT_WARPS;
    for (long long it = (long long)blockIdx.x * INT_WARPS + (threadIdx.x >> 5); it < n;
         it += warps) {
        const uint32_t d = docs[it];
        if (d == KERN_NO_DOC) {
            if (lane == 0)
                approx[it] = __int_as_float(0x7fc00000); /* NaN: never selected */
            continue;
        }
        const long long qi = it / width, col0 = q_off[qi];
        const int lq = (int)(q_off[qi + 1] - col0);
        const long long t0 = doc_off[d];
        const int ntok = (int)(doc_off[d + 1] - t0);
        const float *S = ST + col0;
        const bool pr = prune && (!counts || counts[qi] > prune_over);
        float total = 0.f;
        bool any = false;
        const uint32_t *kq = keep + qi * kw;
        for (int g0 = 0; g0 < lq; g0 += 32 * INT_GROUPS) {
            float m[INT_GROUPS];
#pragma unroll
            for (int g = 0; g < INT_GROUPS; g++)
                m[g] = -INFINITY;
            for (int tb = 0; tb < ntok; tb += 32) {
                /* Lanes load 32 codes and test them; only kept tokens are visited, so a
                 * pruned token costs no read of its scores. */
                const bool in = tb + lane < ntok;
                const uint32_t mycode = in ? __ldg(codes + t0 + tb + lane) : 0;
                const bool kept = in && (!pr || ((__ldg(kq + (mycode >> 5)) >> (mycode & 31)) & 1));
                unsigned left = __ballot_sync(0xffffffffu, kept);
                any |= left != 0;
                /* INT_UNROLL tokens' rows loaded before any is folded in: one at a time, the
                 * warp waited for each row (a latency chain of a document's tokens). A
                 * missing token repeats the first (max is idempotent); left is the same in
                 * every lane, so the shuffles are uniform. */
                while (left) {
                    uint32_t cs[INT_UNROLL];
#pragma unroll
                    for (int u = 0; u < INT_UNROLL; u++) {
                        const int t = left ? __ffs(left) - 1 : -1;
                        left &= left - 1;
                        const uint32_t c = __shfl_sync(0xffffffffu, mycode, t < 0 ? 0 : t);
                        cs[u] = t < 0 ? cs[0] : c;
                    }
#pragma unroll
                    for (int g = 0; g < INT_GROUPS; g++) {
                        const int j = g0 + g * 32 + lane;
                        if (g0 + g * 32 < lq && j < lq) {
                            float x[INT_UNROLL];
#pragma unroll
                            for (int u = 0; u < INT_UNROLL; u++)
                                x[u] = __ldg(S + (long long)cs[u] * ld + j);
#pragma unroll
                            for (int u = 0; u < INT_UNROLL; u++)
                                m[g] = fmaxf(m[g], x[u]);
                        }
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < INT_GROUPS; g++)
                if (g0 + g * 32 + lane < lq)
                    total += m[g];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            total += __shfl_xor_sync(0xffffffffu, total, o);
        if (lane == 0)
            approx[it] = any ? total : KERN_EMPTY_SCORE;
    }
}

/*
 * The same sums with IX_LANES lanes per document, IX_DOCS documents a warp at once. Why: the
 * warp-per-document kernel above waits on a chain of loads per document (its number, its token
 * range, its codes, then its score rows four at a time) with one document in flight; documents
 * of ten tokens or so leave it latency-bound (58% of a default search's GPU time at 2M
 * documents of doc-len 10, H200). Here each lane of a group holds four consecutive query
 * tokens (float4 loads of a score row when every query's column offset and ld allow, else four
 * scalars), a group folds up to IX_LANES of its document's tokens per step (one code a lane,
 * every row of the step loaded before any is folded), and four documents run side by side.
 * The sum is taken in the warp kernel's order exactly (its lane j is element j % 4 of lane
 * j / 4 of a group; the butterfly's levels 16, 8, 4 are the group's, 2 and 1 inside the
 * lane), so both kernels give the same bits.
 */
/* What the grouped interaction kernels know of candidate slot it of n (query it / width):
 * whether it holds a document, the query's columns [col0, col0 + lq), the document's tokens
 * [t0, t0 + ntok), and whether the query prunes (prune, and more than prune_over candidates
 * by counts, or counts NULL). */
struct ix_doc {
    bool live, pr;
    long long qi, col0, t0;
    int lq, ntok;
};

__device__ __forceinline__ ix_doc ix_doc_at(long long it, long long n, long long width,
                                            const uint32_t *__restrict__ docs,
                                            const int64_t *__restrict__ q_off,
                                            const int64_t *__restrict__ doc_off, int prune,
                                            const int64_t *__restrict__ counts,
                                            long long prune_over)
{
    ix_doc x = {false, false, 0, 0, 0, 0, 0};
    const uint32_t d = it < n ? docs[it] : KERN_NO_DOC;
    x.qi = it < n ? it / width : 0;
    if (d == KERN_NO_DOC)
        return x;
    x.live = true;
    x.col0 = q_off[x.qi];
    x.lq = (int)(q_off[x.qi + 1] - x.col0);
    x.t0 = doc_off[d];
    x.ntok = (int)(doc_off[d + 1] - x.t0);
    x.pr = prune && (!counts || counts[x.qi] > prune_over);
    return x;
}

constexpr int IX_LANES = 8;
constexpr int IX_DOCS = 32 / IX_LANES;
constexpr int IX_WARPS = 8;

template <bool VEC>
__global__ void __launch_bounds__(IX_WARPS * 32)
    interaction_group_kernel(const float *__restrict__ ST, long long ld,
                             const int64_t *__restrict__ q_off, const int64_t *__restrict__ doc_off,
                             const uint32_t *__restrict__ codes, const uint32_t *__restrict__ docs,
                             long long width, long long n, int prune,
                             const int64_t *__restrict__ counts, long long prune_over,
                             const uint32_t *__restrict__ keep, long long kw,
                             float *__restrict__ approx)
{
    const int lane = threadIdx.x & 31, sub = lane / IX_LANES, l = lane % IX_LANES;
    const long long warps = (long long)gridDim.x * IX_WARPS;
    for (long long base = ((long long)blockIdx.x * IX_WARPS + (threadIdx.x >> 5)) * IX_DOCS;
         base < n; base += warps * IX_DOCS) {
        const long long it = base + sub;
        const ix_doc x = ix_doc_at(it, n, width, docs, q_off, doc_off, prune, counts, prune_over);
        const bool valid = it < n, live = x.live, pr = x.pr;
        const long long qi = x.qi, col0 = x.col0, t0 = x.t0;
        const int lq = x.lq, ntok = x.ntok;
        const int lq_max = (int)__reduce_max_sync(0xffffffffu, (unsigned)lq);
        const int ntok_max = (int)__reduce_max_sync(0xffffffffu, (unsigned)ntok);
        const float *S = ST + col0;
        const uint32_t *kq = keep + qi * kw;
        float tot[4] = {0.f, 0.f, 0.f, 0.f};
        bool any = false;
        for (int g0 = 0; g0 < lq_max; g0 += 32) {
            const int j = g0 + 4 * l; /* this lane's first query token */
            float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
            for (int tb = 0; tb < ntok_max; tb += IX_LANES) {
                const bool in = tb + l < ntok;
                const uint32_t mycode = in ? __ldg(codes + t0 + tb + l) : 0;
                const bool kept = in && (!pr || ((__ldg(kq + (mycode >> 5)) >> (mycode & 31)) & 1));
                unsigned left =
                    (__ballot_sync(0xffffffffu, kept) >> (sub * IX_LANES)) & ((1u << IX_LANES) - 1);
                const bool some = left != 0;
                any |= some;
                /* A missing token repeats the first kept one (max is idempotent). */
                uint32_t cs[IX_LANES];
#pragma unroll
                for (int u = 0; u < IX_LANES; u++) {
                    const int t = left ? __ffs(left) - 1 : -1;
                    left &= left - 1;
                    const uint32_t c =
                        __shfl_sync(0xffffffffu, mycode, sub * IX_LANES + (t < 0 ? 0 : t));
                    cs[u] = t < 0 ? cs[0] : c;
                }
                if (some && j < lq) {
                    if (VEC) {
                        float4 x[IX_LANES];
#pragma unroll
                        for (int u = 0; u < IX_LANES; u++)
                            x[u] = __ldg(
                                reinterpret_cast<const float4 *>(S + (long long)cs[u] * ld + j));
#pragma unroll
                        for (int u = 0; u < IX_LANES; u++) {
                            m[0] = fmaxf(m[0], x[u].x);
                            m[1] = fmaxf(m[1], x[u].y);
                            m[2] = fmaxf(m[2], x[u].z);
                            m[3] = fmaxf(m[3], x[u].w);
                        }
                    } else {
                        float x[IX_LANES][4];
#pragma unroll
                        for (int u = 0; u < IX_LANES; u++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                x[u][e] = __ldg(S + (long long)cs[u] * ld + j + e);
#pragma unroll
                        for (int u = 0; u < IX_LANES; u++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                m[e] = fmaxf(m[e], x[u][e]);
                    }
                }
            }
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (j + e < lq)
                    tot[e] += m[e];
        }
        /* The warp kernel's butterfly: levels 16, 8, 4 across the group's lanes... */
#pragma unroll
        for (int o = IX_LANES / 2; o > 0; o >>= 1)
#pragma unroll
            for (int e = 0; e < 4; e++)
                tot[e] += __shfl_xor_sync(0xffffffffu, tot[e], o);
        /* ... then 2 and 1 inside the lane. */
        const float total = (tot[0] + tot[2]) + (tot[1] + tot[3]);
        if (valid && l == 0)
            approx[it] = !live ? __int_as_float(0x7fc00000) : any ? total : KERN_EMPTY_SCORE;
    }
}

/*
 * The same sums over a narrower copy of the table, in blocks of the queries' columns
 * (kernels.h: a query's rows are its own, [K, lq], not the lines they shared with other
 * queries' rows in [K, ld]): the fp16 copy (a row of a query's 32 scores is 64 bytes) or the
 * int8 one (32 bytes, one L2 sector). Four lanes hold
 * a document (eight query tokens a lane, one 16- or 8-byte load a row), eight groups of four a
 * warp (the kernel below). Why: at 1M documents the rows are read from L2 and DRAM more than
 * once a query (a query's fp32 rows are 16.8 MB at K 131,072, and the L2 hit rate was a
 * third), so fewer bytes and load instructions a row go straight to the time. The max is
 * taken in the copy's own numbers (half2, or four int8 at once), exact; the sum in fp32 (fp16)
 * or in integers (int8, divided by 127 at the end). Needs ld and every query's first column
 * a multiple of 8.
 */
constexpr int HX_LANES = 4;
constexpr int HX_WARPS = 8;
constexpr int HX_STEP = 8; /* document tokens a group folds per step: two codes a lane */

/* A lane's eight query tokens of one row, as the fp16 copy holds them. */
struct row_h16 {
    typedef __half elem;
    typedef uint4 row;
    struct acc {
        __half2 m[4];
    };
    static __device__ __forceinline__ acc init()
    {
        const __half2 ninf = __half2half2(__ushort_as_half((unsigned short)0xfc00u));
        return acc{{ninf, ninf, ninf, ninf}};
    }
    static __device__ __forceinline__ void fold(acc &a, const uint4 &x)
    {
        a.m[0] = __hmax2(a.m[0], *reinterpret_cast<const __half2 *>(&x.x));
        a.m[1] = __hmax2(a.m[1], *reinterpret_cast<const __half2 *>(&x.y));
        a.m[2] = __hmax2(a.m[2], *reinterpret_cast<const __half2 *>(&x.z));
        a.m[3] = __hmax2(a.m[3], *reinterpret_cast<const __half2 *>(&x.w));
    }
    /* The sum of the first `valid` of the lane's eight maxima. */
    typedef float total;
    static __device__ __forceinline__ float sum(const acc &a, int valid)
    {
        float t = 0.f;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = __half22float2(a.m[e]);
            if (2 * e < valid)
                t += f.x;
            if (2 * e + 1 < valid)
                t += f.y;
        }
        return t;
    }
    static __device__ __forceinline__ float score(float t)
    {
        return t;
    }
};

/* ... as the int8 copy holds them: four scores a word, the max with __vmaxs4. */
struct row_i8 {
    typedef signed char elem;
    typedef uint2 row;
    struct acc {
        unsigned m[2];
    };
    static __device__ __forceinline__ acc init()
    {
        return acc{{0x80808080u, 0x80808080u}};
    }
    static __device__ __forceinline__ void fold(acc &a, const uint2 &x)
    {
        a.m[0] = __vmaxs4(a.m[0], x.x);
        a.m[1] = __vmaxs4(a.m[1], x.y);
    }
    typedef int total;
    static __device__ __forceinline__ int sum(const acc &a, int valid)
    {
        int t = 0;
#pragma unroll
        for (int e = 0; e < 8; e++)
            if (e < valid)
                t += (int)(signed char)(a.m[e >> 2] >> (8 * (e & 3)));
        return t;
    }
    static __device__ __forceinline__ float score(int t)
    {
        return (float)t * (1.f / 127.f);
    }
};

/*
 * The kernel. A warp takes a run of CH consecutive slots and its eight groups of four lanes
 * take documents from the run one at a time, each group its next one as soon as it finishes
 * its last: documents' lengths vary (a lognormal around 70 tokens in `tartan gen`, a heavier
 * tail in real corpora), and when each group held one document of eight side by side the warp
 * ran as long as the longest, about half its lanes idle. Slots without work (KERN_NO_DOC,
 * which fills each query's row past its count, a query or document without tokens) are
 * answered as they are handed out. The runs of all warps move through the slots in order, so
 * the rows read at any time are those of a few queries, which stay in L2.
 */
template <class R, int CH>
__global__ void __launch_bounds__(HX_WARPS * 32)
    interaction_narrow_kernel(const typename R::elem *__restrict__ STn, long long K, long long ld,
                              int blocks, const int64_t *__restrict__ q_off,
                              const int64_t *__restrict__ doc_off,
                              const uint32_t *__restrict__ codes, const uint32_t *__restrict__ docs,
                              long long width, long long n, int prune,
                              const int64_t *__restrict__ counts, long long prune_over,
                              const uint32_t *__restrict__ keep, long long kw,
                              float *__restrict__ approx)
{
    typedef typename R::row row;
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, sub = lane / HX_LANES, l = lane % HX_LANES;
    const unsigned below = (1u << (sub * HX_LANES)) - 1; /* the lanes of the groups before */
    const long long warps = (long long)gridDim.x * HX_WARPS;
    for (long long c0 = ((long long)blockIdx.x * HX_WARPS + (threadIdx.x >> 5)) * CH; c0 < n;
         c0 += warps * CH) {
        const long long end = c0 + CH < n ? c0 + CH : n;
        long long next = c0; /* the run's next slot to hand out (the same in every lane) */
        long long it = 0;    /* this group's slot */
        ix_doc x = {false, false, 0, 0, 0, 0, 0};
        bool need = true; /* this group has no document */
        int tb = 0, g0 = 0;
        typename R::acc m = R::init();
        typename R::total tot = 0;
        bool any = false;
        uint32_t ahead[2] = {0, 0}; /* the codes of this group's next step */
        for (;;) {
            /* Documents to the groups without one, in group order. */
            for (unsigned ask = __ballot_sync(full, need && l == 0); ask && next < end;
                 ask = __ballot_sync(full, need && l == 0)) {
                if (need) {
                    it = next + __popc(ask & below);
                    if (it < end) {
                        x = ix_doc_at(it, n, width, docs, q_off, doc_off, prune, counts,
                                      prune_over);
                        if (!x.live || x.lq == 0 || x.ntok == 0) {
                            if (l == 0)
                                approx[it] =
                                    !x.live ? __int_as_float(0x7fc00000) : KERN_EMPTY_SCORE;
                        } else {
                            need = false;
                            tb = 0, g0 = 0, tot = 0, any = false;
                            m = R::init();
#pragma unroll
                            for (int h = 0; h < 2; h++)
                                ahead[h] = h * HX_LANES + l < x.ntok
                                               ? __ldg(codes + x.t0 + h * HX_LANES + l)
                                               : 0;
                        }
                    }
                }
                next += __popc(ask);
            }
            if (!__any_sync(full, !need))
                break;
            const bool work = !need;
            const int j = g0 + 8 * l; /* this lane's first query token */
            uint32_t code[2] = {ahead[0], ahead[1]};
            /* The next step's codes are loaded before this step's rows: one memory latency a
             * step instead of two (codes, then the rows they name). */
            const bool more = work && tb + HX_STEP < x.ntok;
            const int ntb = more ? tb + HX_STEP : 0;
            const bool cont = work && (more || g0 + 32 < x.lq);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int t = ntb + h * HX_LANES + l;
                ahead[h] = cont && t < x.ntok ? __ldg(codes + x.t0 + t) : 0;
            }
            const uint32_t *kq = keep + x.qi * kw;
            unsigned left = 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int t = tb + h * HX_LANES + l;
                const bool kept = work && t < x.ntok &&
                                  (!x.pr || ((__ldg(kq + (code[h] >> 5)) >> (code[h] & 31)) & 1));
                left |= ((__ballot_sync(full, kept) >> (sub * HX_LANES)) & ((1u << HX_LANES) - 1))
                        << (h * HX_LANES);
            }
            const bool some = left != 0;
            any |= some;
            uint32_t cs[HX_STEP];
#pragma unroll
            for (int u = 0; u < HX_STEP; u++) {
                const int t = left ? __ffs(left) - 1 : -1;
                left &= left - 1;
                const int tt = t < 0 ? 0 : t;
                const uint32_t c = __shfl_sync(full, tt >= HX_LANES ? code[1] : code[0],
                                               sub * HX_LANES + (tt & (HX_LANES - 1)));
                cs[u] = t < 0 ? cs[0] : c;
            }
            if (some && j < x.lq) {
                /* The query's block of the copy: [K, lq] (kernels.h); or, blocks 0, its columns
                 * of [K, ld] (TARTAN_GPU_BLOCKS=off, a benchmark's comparison). */
                const typename R::elem *S = blocks ? STn + x.col0 * K : STn + x.col0;
                const long long stride = blocks ? (long long)x.lq : ld;
                row xr[HX_STEP];
#pragma unroll
                for (int u = 0; u < HX_STEP; u++)
                    xr[u] = __ldg(reinterpret_cast<const row *>(S + (long long)cs[u] * stride + j));
#pragma unroll
                for (int u = 0; u < HX_STEP; u++)
                    R::fold(m, xr[u]);
            }
            /* The end of the document's tokens: this block of 32 query tokens is summed, and
             * the document is done or starts over for the next block. */
            bool done = false;
            if (work && !more) {
                tot += R::sum(m, x.lq - j);
                m = R::init();
                g0 += 32;
                done = g0 >= x.lq;
            }
            tb = ntb;
            if (__ballot_sync(full, done)) {
                typename R::total t = tot;
#pragma unroll
                for (int o = HX_LANES / 2; o > 0; o >>= 1)
                    t += __shfl_xor_sync(full, t, o);
                if (done && l == 0)
                    approx[it] = any ? R::score(t) : KERN_EMPTY_SCORE;
                need |= done;
            }
        }
    }
}

/* keep[q * kw + c / 32] bit c % 32: the best score of centroid c over query q's tokens
 * reaches threshold. Thread (q, c), c fastest: a warp decides 32 consecutive centroids of one
 * query and writes their word. */
__global__ void keep_kernel(const float *__restrict__ ST, long long K, long long ld,
                            const int64_t *__restrict__ q_off, float threshold, long long kw,
                            uint32_t *__restrict__ keep)
{
    const long long q = blockIdx.y;
    const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long j0 = q_off[q], j1 = q_off[q + 1];
    float mx = -INFINITY;
    if (c < K)
        for (long long j = j0; j < j1; j++)
            mx = fmaxf(mx, __ldg(ST + c * ld + j));
    const unsigned bits = __ballot_sync(0xffffffffu, c < K && mx >= threshold);
    if ((threadIdx.x & 31) == 0 && c < K)
        keep[q * kw + c / 32] = bits;
}

__global__ void gather_kernel(const uint32_t *__restrict__ in, long long width,
                              const int64_t *__restrict__ sel, long long k, long long n,
                              uint32_t *__restrict__ out)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const long long q = i / k, s = sel[i];
    /* width 0: one list shared by every query. */
    out[i] = s >= 0 && (width == 0 || s < width) ? in[q * width + s] : KERN_NO_DOC;
}

/* ---- the adaptive exact stage ------------------------------------------------------------ */

/* out[q, j] = in[q, c0 + j] for j < c1 - c0 where lo[q] <= c0 + j < hi[q] (lo, hi NULL: no
 * bound), else KERN_NO_DOC. */
__global__ void take_columns_kernel(const uint32_t *__restrict__ in, long long width, long long c0,
                                    long long w, const int64_t *__restrict__ lo,
                                    const int64_t *__restrict__ hi, long long n,
                                    uint32_t *__restrict__ out)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const long long q = i / w, c = c0 + i % w;
    const bool in_range = (!lo || c >= lo[q]) && (!hi || c < hi[q]);
    out[i] = in_range ? in[q * width + c] : KERN_NO_DOC;
}

/* E[q, c0 + j] = in[q, j] for j < w where lo[q] <= c0 + j < hi[q]; other entries untouched. */
__global__ void scatter_columns_kernel(const float *__restrict__ in, long long w, long long c0,
                                       const int64_t *__restrict__ lo,
                                       const int64_t *__restrict__ hi, long long n,
                                       float *__restrict__ E, long long ldE)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const long long q = i / w, c = c0 + i % w;
    if (c >= lo[q] && c < hi[q])
        E[q * ldE + c] = in[i];
}

/* Pair i of a round: its query q (the last with poff[q] <= i, a binary search over poff [nq +
 * 1]), docs[i] = in[q, lo[q] + i - poff[q]]. */
__global__ void round_pairs_kernel(const uint32_t *__restrict__ in, long long width,
                                   const int64_t *__restrict__ lo, const int64_t *__restrict__ poff,
                                   long long nq, long long n, uint32_t *__restrict__ docs,
                                   uint32_t *__restrict__ pair_q)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    long long a = 0, b = nq; /* poff[a] <= i < poff[b] */
    while (b - a > 1) {
        const long long mid = (a + b) >> 1;
        if (poff[mid] <= i)
            a = mid;
        else
            b = mid;
    }
    docs[i] = in[a * width + lo[a] + (i - poff[a])];
    pair_q[i] = (uint32_t)a;
}

__global__ void round_scatter_kernel(const float *__restrict__ scores,
                                     const uint32_t *__restrict__ pair_q, long long n,
                                     const int64_t *__restrict__ lo,
                                     const int64_t *__restrict__ poff, float *__restrict__ E,
                                     long long ldE)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const long long q = pair_q[i];
    E[q * ldE + lo[q] + (i - poff[q])] = scores[i];
}

constexpr int NEXT_THREADS = 256; /* next_kernel's radix select: a bin a thread */

/* A block's sum of v: every thread gets it. */
template <typename T> __device__ T block_sum(T v)
{
    __shared__ T part[NEXT_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    __syncthreads();
    if (l == 0)
        part[w] = v;
    __syncthreads();
    T t = 0;
    for (int i = 0; i < NEXT_THREADS / 32; i++)
        t += part[i];
    return t;
}

/* A remaining candidate's chance to beat theta (eng_tail_need): P(N(0, sd) > gap - a). */
__device__ __forceinline__ double next_chance(double a, double gap, double sd)
{
    return sd > 0 ? 0.5 * erfc((gap - a) / (sd * 1.4142135623730951)) : a >= gap ? 1.0 : 0.0;
}

/* The chances of the candidates [n, n + NEXT_TAIL) kept in shared memory for the tail bound's
 * search: one erfc each instead of one each a step of the binary search. */
constexpr int NEXT_TAIL = 4096;

/*
 * Block q: how far query q's exact scoring goes next (kernels.h, kern_cuda_adaptive_next).
 * E [nq, ldE] exact scores in order of approximate score, sorted [nq, lds] those approximate
 * scores in descending order.
 *
 * Each part reads what it must and no more (at 1M documents this kernel was 7% of a batch's
 * GPU time, 136 launches of 67 us, ncu on an H200): the z rule's count comes from sorted,
 * not from the row of every candidate (tens of thousands of floats a block, see below);
 * theta is a radix select, four passes of 8 bits, where a bisection took 32 block sums; the
 * tail's chances are computed once into shared memory.
 */
__global__ void __launch_bounds__(NEXT_THREADS)
    next_kernel(const float *__restrict__ E, long long ldE, const float *__restrict__ sorted,
                long long lds, const int64_t *__restrict__ done, const int64_t *__restrict__ counts,
                long long k, float z, double eps, double growth, long long cap,
                int64_t *__restrict__ next)
{
    __shared__ unsigned hist[256];
    __shared__ unsigned s_pick[2];
    __shared__ double chance[NEXT_TAIL];
    const long long q = blockIdx.x, n = done[q];
    const long long valid = counts[q] < cap ? counts[q] : cap;
    if (n < k || n >= valid) {
        /* Fewer than k scored (then every candidate was), or nothing left. */
        if (threadIdx.x == 0)
            next[q] = n;
        return;
    }
    const float *e = E + q * ldE, *ap = sorted + q * lds;
    double a = 0, b = 0;
    for (long long j = threadIdx.x; j < n; j += NEXT_THREADS) {
        const double d = (double)e[j] - (double)ap[j];
        a += d;
        b += d * d;
    }
    a = block_sum(a);
    b = block_sum(b);
    /* theta, the k-th best exact score (the largest key t with at least k keys >= t): a radix
     * select from the top byte down; `want` counts down the keys above the digit taken. */
    unsigned prefix = 0, want = (unsigned)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        const unsigned hmask = shift == 24 ? 0u : ~0u << (shift + 8);
        hist[threadIdx.x] = 0;
        __syncthreads();
        for (long long j = threadIdx.x; j < n; j += NEXT_THREADS) {
            const unsigned key = order_key(e[j]);
            if ((key & hmask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            /* Lane l holds digits 255 - 8l down to 248 - 8l; a scan from the top finds the
             * digit where the count from above reaches want. */
            const int l = threadIdx.x;
            unsigned mine = 0;
            for (int i = 0; i < 8; i++)
                mine += hist[255 - 8 * l - i];
            unsigned incl = mine;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
                if (l >= o)
                    incl += v;
            }
            const unsigned excl = incl - mine;
            if (excl < want && incl >= want) {
                unsigned above = excl;
                int d = 255 - 8 * l;
                for (; above + hist[d] < want; d--)
                    above += hist[d];
                s_pick[0] = (unsigned)d;
                s_pick[1] = want - above;
            }
        }
        __syncthreads();
        prefix |= s_pick[0] << shift;
        want = s_pick[1];
        __syncthreads();
    }
    const unsigned t = prefix;
    const float theta = __uint_as_float(t & 0x80000000u ? t & 0x7fffffffu : ~t);
    const double mu = a / (double)n, var = b / (double)n - mu * mu;
    const double sd = sqrt(var > 0 ? var : 0);
    const double reach = (double)theta - mu - (double)z * sd;
    /* The z rule's count, min(c, valid) in kernels.h: sorted [0, valid) holds the row's best
     * values in descending order, so it is the count of those that reach it; past n, since
     * when sorted[n] falls short the count is at most n and next does not depend on it. */
    const double gap = (double)theta - mu;
    const long long grow0 = (long long)ceil((double)n * growth);
    const long long grow = grow0 > n ? grow0 : n + 1;
    /* The tail bound (eng_tail_need): the smallest m >= n whose tail of chances over the
     * ordered candidates [m, valid) is at most eps; searched in [n, min(grow, valid)], since
     * the round takes at most grow. */
    const long long hi0 = grow < valid ? grow : valid;
    const bool keep = hi0 - n <= NEXT_TAIL;
    double tail = 0;
    long long c = 0;
    for (long long j = n + threadIdx.x; j < valid; j += NEXT_THREADS) {
        const double v = (double)ap[j];
        const double p = next_chance(v, gap, sd);
        c += v >= reach;
        tail += p;
        if (keep && j - n < NEXT_TAIL)
            chance[j - n] = p;
    }
    tail = block_sum(tail);
    c = n + block_sum(c);
    long long m = n;
    if (tail > eps) {
        long long lo = n, hi = hi0; /* the answer, capped, is in (lo, hi] */
        while (hi - lo > 1) {
            const long long mid = lo + (hi - lo) / 2;
            double head = 0; /* chances over [n, mid), in the order of the tail's sum */
            for (long long j = n + threadIdx.x; j < mid; j += NEXT_THREADS)
                head += keep ? chance[j - n] : next_chance((double)ap[j], gap, sd);
            if (tail - block_sum(head) <= eps)
                hi = mid;
            else
                lo = mid;
        }
        m = hi;
    }
    if (threadIdx.x == 0) {
        long long w = c < valid ? c : valid;
        w = w > m ? w : m;
        next[q] = w > n ? (w < grow ? w : grow) : n;
    }
}

/* ---- inverted lists from the codes ------------------------------------------------------ */

/* Warp per document; a token counts when no earlier token of its document has its code. With
 * cursor NULL: counts[c]++; else ivf_docs[cursor[c]++] = d. */
__global__ void ivf_pass_kernel(const int64_t *__restrict__ doc_off,
                                const uint32_t *__restrict__ codes,
                                const uint32_t *__restrict__ live, long long n_docs,
                                unsigned long long *__restrict__ counts,
                                unsigned long long *__restrict__ cursor,
                                uint32_t *__restrict__ ivf_docs)
{
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long d = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); d < n_docs;
         d += warps) {
        if (!((live[d >> 5] >> (d & 31)) & 1))
            continue;
        const long long t0 = doc_off[d], t1 = doc_off[d + 1];
        for (long long t = t0 + lane; t < t1; t += 32) {
            const uint32_t c = codes[t];
            bool first = true;
            for (long long u = t0; u < t && first; u++)
                first = codes[u] != c;
            if (!first)
                continue;
            if (cursor)
                ivf_docs[atomicAdd(cursor + c, 1ull)] = (uint32_t)d;
            else
                atomicAdd(counts + c, 1ull);
        }
    }
}

/* One block: off[0] = 0, off[c + 1] = off[c] + counts[c]; cursor[c] = off[c]. */
__global__ void __launch_bounds__(1024)
    ivf_scan_kernel(const unsigned long long *__restrict__ counts, long long K,
                    int64_t *__restrict__ off)
{
    __shared__ unsigned long long s_sum[1024];
    const long long per = (K + 1023) / 1024;
    const long long c0 = threadIdx.x * per, c1 = c0 + per < K ? c0 + per : K;
    unsigned long long mine = 0;
    for (long long c = c0; c < c1; c++)
        mine += counts[c];
    s_sum[threadIdx.x] = mine;
    __syncthreads();
    for (int o = 1; o < 1024; o <<= 1) {
        const unsigned long long add = threadIdx.x >= o ? s_sum[threadIdx.x - o] : 0;
        __syncthreads();
        s_sum[threadIdx.x] += add;
        __syncthreads();
    }
    unsigned long long at = s_sum[threadIdx.x] - mine;
    if (threadIdx.x == 0)
        off[0] = 0;
    for (long long c = c0; c < c1; c++) {
        at += counts[c];
        off[c + 1] = (int64_t)at;
    }
}

} // namespace

extern "C" int kern_cuda_probe(const float *ST, size_t K, size_t ld, size_t ncells, float margin,
                               const float *col_margin, const unsigned *colbest,
                               const unsigned *tilekey, int32_t *probes)
{
    cudaGetLastError();
    if (!ST || !probes || K == 0 || ncells == 0 || ncells > KERN_CUDA_MAX_NCELLS ||
        !(margin >= 0.f) || K > 0x7fffffff || ld > 0x7fffffffu || (tilekey && !colbest)) {
        kern_set_error("probe (cuda): bad arguments (K %zu, ncells %zu, columns %zu, or tile keys "
                       "without column bests)",
                       K, ncells, ld);
        return KERN_EINVAL;
    }
    if (ld == 0)
        return KERN_OK;
    const int n = (int)ncells;
    if (n <= 1)
        return launch_probe<1>(ST, K, ld, n, margin, col_margin, colbest, tilekey, probes);
    if (n <= 2)
        return launch_probe<2>(ST, K, ld, n, margin, col_margin, colbest, tilekey, probes);
    if (n <= 4)
        return launch_probe<4>(ST, K, ld, n, margin, col_margin, colbest, tilekey, probes);
    if (n <= 8)
        return launch_probe<8>(ST, K, ld, n, margin, col_margin, colbest, tilekey, probes);
    if (n <= 16)
        return launch_probe<16>(ST, K, ld, n, margin, col_margin, colbest, tilekey, probes);
    if (n <= 32)
        return launch_probe<32>(ST, K, ld, n, margin, col_margin, colbest, tilekey, probes);
    return launch_probe<KERN_CUDA_MAX_NCELLS>(ST, K, ld, n, margin, col_margin, colbest, tilekey,
                                              probes);
}

extern "C" int kern_cuda_candidates_mark(const int32_t *probes, size_t ncells,
                                         const int64_t *q_off, const int64_t *h_q_off, size_t nq,
                                         const int64_t *ivf_off, const uint32_t *ivf_docs,
                                         const uint32_t *live, const uint32_t *allowed,
                                         size_t words, uint32_t *bits, int64_t *counts)
{
    cudaGetLastError();
    if (!probes || !q_off || !h_q_off || !ivf_off || !ivf_docs || !live || !bits || !counts ||
        ncells == 0 || nq > 0x7fffffff) {
        kern_set_error("candidates_mark (cuda): bad arguments");
        return KERN_EINVAL;
    }
    const long long nprobe = (long long)h_q_off[nq] * (long long)ncells;
    KERN_CUDA_TRY(cudaMemsetAsync(counts, 0, nq * sizeof *counts, 0));
    if (nprobe == 0)
        return KERN_OK;
    if (nprobe > 0x7fffffffLL) {
        kern_set_error("candidates_mark (cuda): %lld probes beyond one launch", nprobe);
        return KERN_EINVAL;
    }
    mark_kernel<<<(unsigned)nprobe, 256>>>(probes, (int)ncells, q_off, (int)nq, ivf_off, ivf_docs,
                                           live, allowed, (long long)words, bits,
                                           (unsigned long long *)counts);
    KERN_CUDA_LAUNCHED("mark_kernel");
    return KERN_OK;
}

extern "C" int kern_cuda_candidates_take(uint32_t *bits, size_t nq, size_t words, uint32_t *docs,
                                         size_t width)
{
    cudaGetLastError();
    if (!bits || !docs || nq > 0x7fffffff) {
        kern_set_error("candidates_take (cuda): bad arguments");
        return KERN_EINVAL;
    }
    if (nq == 0)
        return KERN_OK;
    take_kernel<<<(unsigned)nq, TAKE_THREADS>>>(bits, (long long)words, docs, (long long)width);
    KERN_CUDA_LAUNCHED("take_kernel");
    return KERN_OK;
}

/* A narrow copy of the table for the interaction to read: none, fp16 or int8. */
enum narrow { NARROW_NONE, NARROW_H16, NARROW_I8 };

/* Slots a warp takes at a time (interaction_narrow_kernel): TARTAN_IX_RUN 8, 16, 32 (the
 * default), 64 or 128, a benchmark's comparison. */
static int narrow_run(void)
{
    const char *e = getenv("TARTAN_IX_RUN");
    const int v = e ? atoi(e) : 32;
    return v == 8 || v == 16 || v == 64 || v == 128 ? v : 32;
}

template <class R, int CH>
static int launch_run(const void *STn, long long K, long long ld, int in_blocks,
                      const int64_t *q_off, const int64_t *doc_off, const uint32_t *codes,
                      const uint32_t *docs, long long width, long long n, int prune,
                      const int64_t *counts, long long prune_over, const uint32_t *keep,
                      long long kw, float *approx)
{
    int blocks = 0, rc;
    if ((rc = kern_persistent_grid((const void *)interaction_narrow_kernel<R, CH>, HX_WARPS * 32, 0,
                                   (n + HX_WARPS * CH - 1) / (HX_WARPS * CH), &blocks)) != KERN_OK)
        return rc;
    interaction_narrow_kernel<R, CH><<<blocks, HX_WARPS * 32>>>(
        static_cast<const typename R::elem *>(STn), K, ld, in_blocks, q_off, doc_off, codes, docs,
        width, n, prune, counts, prune_over, keep, kw, approx);
    return KERN_OK;
}

template <class R>
static int launch_narrow(const void *STn, long long K, long long ld, int in_blocks,
                         const int64_t *q_off, const int64_t *doc_off, const uint32_t *codes,
                         const uint32_t *docs, long long width, long long n_slots, int prune,
                         const int64_t *counts, long long prune_over, const uint32_t *keep,
                         long long kw, float *approx)
{
    switch (narrow_run()) {
#define RUN(n)                                                                                     \
    case n:                                                                                        \
        return launch_run<R, n>(STn, K, ld, in_blocks, q_off, doc_off, codes, docs, width,         \
                                n_slots, prune, counts, prune_over, keep, kw, approx)
        RUN(8);
        RUN(16);
        RUN(64);
        RUN(128);
#undef RUN
    default:
        return launch_run<R, 32>(STn, K, ld, in_blocks, q_off, doc_off, codes, docs, width, n_slots,
                                 prune, counts, prune_over, keep, kw, approx);
    }
}

static int interaction(const float *ST, const void *STn, narrow kind, size_t n_centroids, size_t ld,
                       const int64_t *q_off, const int64_t *h_q_off, size_t nq,
                       const int64_t *doc_off, const uint32_t *codes, const uint32_t *docs,
                       size_t width, int prune, const int64_t *counts, int64_t prune_over,
                       float threshold, float *approx)
{
    cudaGetLastError();
    if (!ST || !q_off || !doc_off || !codes || !docs || !approx) {
        kern_set_error("interaction (cuda): NULL argument");
        return KERN_EINVAL;
    }
    if (kind != NARROW_NONE) {
        /* ld and every query's first column a multiple of 8, the copy aligned for its rows'
         * loads (16 and 8 bytes). */
        bool ok =
            STn && h_q_off && ld % 8 == 0 && (uintptr_t)STn % (kind == NARROW_H16 ? 16 : 8) == 0;
        for (size_t i = 0; ok && i <= nq; i++)
            ok = h_q_off[i] % 8 == 0;
        if (!ok) {
            kern_set_error("interaction_%s (cuda): no %s table, or ld or a query's first column "
                           "not a multiple of 8",
                           kind == NARROW_H16 ? "h16" : "i8", kind == NARROW_H16 ? "fp16" : "int8");
            return KERN_EINVAL;
        }
    }
    const long long n = (long long)(nq * width);
    if (n == 0)
        return KERN_OK;
    int blocks = 0, rc;
    if ((rc = kern_persistent_grid((const void *)interaction_batch_kernel, INT_WARPS * 32, 0,
                                   (n + INT_WARPS - 1) / INT_WARPS, &blocks)) != KERN_OK)
        return rc;
    /* The threshold's verdict per (query, centroid), when pruning. */
    const long long kw = ((long long)n_centroids + 31) / 32;
    uint32_t *keep = NULL;
    const size_t keep_bytes = prune ? nq * (size_t)kw * 4 : 4;
    if ((rc = kern_scratch((void **)&keep, keep_bytes)) != KERN_OK)
        return rc;
    if (prune) {
        const dim3 grid((unsigned)((n_centroids + 255) / 256), (unsigned)nq);
        keep_kernel<<<grid, 256>>>(ST, (long long)n_centroids, (long long)ld, q_off, threshold,
                                   kw, keep);
    }
    const char *var = getenv("TARTAN_INTERACTION");
    if (kind != NARROW_NONE) {
        const long long K = (long long)n_centroids, L = (long long)ld;
        const char *bl = getenv("TARTAN_GPU_BLOCKS");
        const int in_blocks = !(bl && !strcmp(bl, "off"));
        rc = kind == NARROW_H16
                 ? launch_narrow<row_h16>(STn, K, L, in_blocks, q_off, doc_off, codes, docs,
                                          (long long)width, n, prune, counts, (long long)prune_over,
                                          keep, kw, approx)
                 : launch_narrow<row_i8>(STn, K, L, in_blocks, q_off, doc_off, codes, docs,
                                         (long long)width, n, prune, counts, (long long)prune_over,
                                         keep, kw, approx);
        if (rc != KERN_OK) {
            kern_scratch_free(keep, keep_bytes);
            return rc;
        }
    } else if (var && !strcmp(var, "warp")) {
        interaction_batch_kernel<<<blocks, INT_WARPS * 32>>>(
            ST, (long long)ld, q_off, doc_off, codes, docs, (long long)width, n, prune, counts,
            (long long)prune_over, keep, kw, approx);
    } else {
        /* float4 rows when every query's first column and ld are multiples of 4. */
        bool vec = h_q_off && ld % 4 == 0;
        for (size_t i = 0; vec && i <= nq; i++)
            vec = h_q_off[i] % 4 == 0;
        int gblocks = 0;
        const void *fn = vec ? (const void *)interaction_group_kernel<true>
                             : (const void *)interaction_group_kernel<false>;
        if ((rc = kern_persistent_grid(fn, IX_WARPS * 32, 0,
                                       (n + IX_WARPS * IX_DOCS - 1) / (IX_WARPS * IX_DOCS),
                                       &gblocks)) != KERN_OK) {
            kern_scratch_free(keep, keep_bytes);
            return rc;
        }
        if (vec)
            interaction_group_kernel<true><<<gblocks, IX_WARPS * 32>>>(
                ST, (long long)ld, q_off, doc_off, codes, docs, (long long)width, n, prune, counts,
                (long long)prune_over, keep, kw, approx);
        else
            interaction_group_kernel<false><<<gblocks, IX_WARPS * 32>>>(
                ST, (long long)ld, q_off, doc_off, codes, docs, (long long)width, n, prune, counts,
                (long long)prune_over, keep, kw, approx);
    }
    cudaError_t e = cudaGetLastError();
    rc = e == cudaSuccess ? KERN_OK
                          : kern_cuda_fail(e, "launch of the interaction kernels", __FILE__, __LINE__);
    kern_scratch_free(keep, keep_bytes);
    return rc;
}

extern "C" int kern_cuda_interaction(const float *ST, size_t n_centroids, size_t ld,
                                     const int64_t *q_off, const int64_t *h_q_off, size_t nq,
                                     const int64_t *doc_off, const uint32_t *codes,
                                     const uint32_t *docs, size_t width, int prune,
                                     const int64_t *counts, int64_t prune_over, float threshold,
                                     float *approx)
{
    return interaction(ST, NULL, NARROW_NONE, n_centroids, ld, q_off, h_q_off, nq, doc_off, codes,
                       docs, width, prune, counts, prune_over, threshold, approx);
}

extern "C" int kern_cuda_interaction_h16(const float *ST, const uint16_t *ST16, size_t n_centroids,
                                         size_t ld, const int64_t *q_off, const int64_t *h_q_off,
                                         size_t nq, const int64_t *doc_off, const uint32_t *codes,
                                         const uint32_t *docs, size_t width, int prune,
                                         const int64_t *counts, int64_t prune_over, float threshold,
                                         float *approx)
{
    return interaction(ST, ST16, NARROW_H16, n_centroids, ld, q_off, h_q_off, nq, doc_off, codes,
                       docs, width, prune, counts, prune_over, threshold, approx);
}

extern "C" int kern_cuda_interaction_i8(const float *ST, const int8_t *ST8, size_t n_centroids,
                                        size_t ld, const int64_t *q_off, const int64_t *h_q_off,
                                        size_t nq, const int64_t *doc_off, const uint32_t *codes,
                                        const uint32_t *docs, size_t width, int prune,
                                        const int64_t *counts, int64_t prune_over, float threshold,
                                        float *approx)
{
    return interaction(ST, ST8, NARROW_I8, n_centroids, ld, q_off, h_q_off, nq, doc_off, codes,
                       docs, width, prune, counts, prune_over, threshold, approx);
}

extern "C" int kern_cuda_gather_docs(const uint32_t *in, size_t width, const int64_t *sel,
                                     size_t nq, size_t k, uint32_t *out)
{
    cudaGetLastError();
    if (!in || !sel || !out || k == 0) {
        kern_set_error("gather_docs (cuda): bad arguments");
        return KERN_EINVAL;
    }
    const long long n = (long long)(nq * k);
    if (n == 0)
        return KERN_OK;
    gather_kernel<<<(unsigned)((n + 255) / 256), 256>>>(in, (long long)width, sel, (long long)k,
                                                         n, out);
    KERN_CUDA_LAUNCHED("gather_kernel");
    return KERN_OK;
}

extern "C" int kern_cuda_build_ivf(const int64_t *doc_off, const uint32_t *codes,
                                   const uint32_t *live, size_t n_docs, size_t K, int64_t *ivf_off,
                                   int64_t *scratch, uint32_t *ivf_docs, size_t *n_entries)
{
    cudaGetLastError();
    if (!doc_off || !codes || !live || !ivf_off || !scratch || K == 0) {
        kern_set_error("build_ivf (cuda): bad arguments");
        return KERN_EINVAL;
    }
    int blocks = 0, rc;
    if ((rc = kern_persistent_grid((const void *)ivf_pass_kernel, 256, 0,
                                   ((long long)n_docs + 7) / 8, &blocks)) != KERN_OK)
        return rc;
    unsigned long long *cnt = (unsigned long long *)scratch;
    if (!ivf_docs) {
        KERN_CUDA_TRY(cudaMemsetAsync(cnt, 0, K * sizeof *cnt, 0));
        if (n_docs)
            ivf_pass_kernel<<<blocks, 256>>>(doc_off, codes, live, (long long)n_docs, cnt, NULL,
                                             NULL);
        ivf_scan_kernel<<<1, 1024>>>(cnt, (long long)K, ivf_off);
        KERN_CUDA_LAUNCHED("ivf_scan_kernel");
        int64_t total = 0;
        KERN_CUDA_TRY(cudaMemcpy(&total, ivf_off + K, sizeof total, cudaMemcpyDeviceToHost));
        if (n_entries)
            *n_entries = (size_t)total;
        return KERN_OK;
    }
    KERN_CUDA_TRY(cudaMemcpyAsync(cnt, ivf_off, K * sizeof *cnt, cudaMemcpyDeviceToDevice, 0));
    if (n_docs)
        ivf_pass_kernel<<<blocks, 256>>>(doc_off, codes, live, (long long)n_docs, NULL, cnt,
                                         ivf_docs);
    KERN_CUDA_LAUNCHED("ivf_pass_kernel");
    return KERN_OK;
}

extern "C" int kern_cuda_memset(void *p, int byte, size_t bytes)
{
    if (bytes)
        KERN_CUDA_TRY(cudaMemsetAsync(p, byte, bytes, 0));
    return KERN_OK;
}

extern "C" int kern_cuda_copy_d2d(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        KERN_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
    return KERN_OK;
}

extern "C" int kern_cuda_host_alloc(void **p, size_t bytes)
{
    *p = NULL;
    KERN_CUDA_TRY(cudaMallocHost(p, bytes ? bytes : 1));
    return KERN_OK;
}

extern "C" void kern_cuda_host_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}

extern "C" int kern_cuda_upload_async(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        KERN_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, 0));
    return KERN_OK;
}

extern "C" int kern_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    KERN_CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return KERN_OK;
}

#define COPIER_MAX_SLOTS 4

struct kern_cuda_copier {
    cudaStream_t stream;
    int slots;
    cudaEvent_t copied[COPIER_MAX_SLOTS], released[COPIER_MAX_SLOTS];
    int has_copied[COPIER_MAX_SLOTS], has_released[COPIER_MAX_SLOTS];
};

extern "C" void kern_cuda_copier_free(kern_cuda_copier *c)
{
    if (!c)
        return;
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    for (int i = 0; i < c->slots; i++) {
        if (c->copied[i])
            cudaEventDestroy(c->copied[i]);
        if (c->released[i])
            cudaEventDestroy(c->released[i]);
    }
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" int kern_cuda_copier_new(kern_cuda_copier **out, int slots)
{
    *out = NULL;
    if (slots < 1 || slots > COPIER_MAX_SLOTS) {
        kern_set_error("copier (cuda): %d slots; 1 to %d", slots, COPIER_MAX_SLOTS);
        return KERN_EINVAL;
    }
    kern_cuda_copier *c = (kern_cuda_copier *)calloc(1, sizeof *c);
    if (!c) {
        kern_set_error("copier (cuda): out of memory");
        return KERN_ENOMEM;
    }
    c->slots = slots;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    for (int i = 0; i < slots && e == cudaSuccess; i++) {
        e = cudaEventCreateWithFlags(&c->copied[i], cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&c->released[i], cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        int rc = kern_cuda_fail(e, "copier (cuda): stream and events", __FILE__, __LINE__);
        kern_cuda_copier_free(c);
        return rc;
    }
    *out = c;
    return KERN_OK;
}

extern "C" int kern_cuda_copier_upload(kern_cuda_copier *c, int s, void *dst, const void *src,
                                       size_t bytes)
{
    if (c->has_released[s])
        KERN_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->released[s], 0));
    if (bytes)
        KERN_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    return KERN_OK;
}

extern "C" int kern_cuda_copier_ready(kern_cuda_copier *c, int s)
{
    KERN_CUDA_TRY(cudaEventRecord(c->copied[s], c->stream));
    c->has_copied[s] = 1;
    KERN_CUDA_TRY(cudaStreamWaitEvent(0, c->copied[s], 0));
    return KERN_OK;
}

extern "C" int kern_cuda_copier_release(kern_cuda_copier *c, int s)
{
    KERN_CUDA_TRY(cudaEventRecord(c->released[s], 0));
    c->has_released[s] = 1;
    return KERN_OK;
}

extern "C" int kern_cuda_copier_host_wait(kern_cuda_copier *c, int s)
{
    if (c->has_copied[s])
        KERN_CUDA_TRY(cudaEventSynchronize(c->copied[s]));
    return KERN_OK;
}

extern "C" int kern_cuda_take_columns(const uint32_t *in, size_t width, size_t c0, size_t c1,
                                      const int64_t *lo, const int64_t *hi, size_t nq,
                                      uint32_t *out)
{
    cudaGetLastError();
    if (!in || !out || c1 < c0 || c1 > width) {
        kern_set_error("take_columns (cuda): bad arguments");
        return KERN_EINVAL;
    }
    const long long w = (long long)(c1 - c0), n = (long long)nq * w;
    if (n == 0)
        return KERN_OK;
    take_columns_kernel<<<(unsigned)((n + 255) / 256), 256>>>(in, (long long)width, (long long)c0,
                                                              w, lo, hi, n, out);
    KERN_CUDA_LAUNCHED("take_columns_kernel");
    return KERN_OK;
}

extern "C" int kern_cuda_round_pairs(const uint32_t *in, size_t width, const int64_t *lo,
                                     const int64_t *poff, size_t nq, size_t n_pairs, uint32_t *docs,
                                     uint32_t *pair_q)
{
    cudaGetLastError();
    if (!in || !lo || !poff || !docs || !pair_q || nq == 0 || nq > 0xffffffffu ||
        n_pairs > 0x7fffffffffLL) {
        kern_set_error("round_pairs (cuda): bad arguments (%zu queries, %zu pairs)", nq, n_pairs);
        return KERN_EINVAL;
    }
    if (n_pairs == 0)
        return KERN_OK;
    round_pairs_kernel<<<(unsigned)((n_pairs + 255) / 256), 256>>>(
        in, (long long)width, lo, poff, (long long)nq, (long long)n_pairs, docs, pair_q);
    KERN_CUDA_LAUNCHED("round_pairs_kernel");
    return KERN_OK;
}

extern "C" int kern_cuda_round_scatter(const float *scores, const uint32_t *pair_q, size_t n_pairs,
                                       const int64_t *lo, const int64_t *poff, float *E, size_t ldE)
{
    cudaGetLastError();
    if (!scores || !pair_q || !lo || !poff || !E || n_pairs > 0x7fffffffffLL) {
        kern_set_error("round_scatter (cuda): bad arguments (%zu pairs)", n_pairs);
        return KERN_EINVAL;
    }
    if (n_pairs == 0)
        return KERN_OK;
    round_scatter_kernel<<<(unsigned)((n_pairs + 255) / 256), 256>>>(
        scores, pair_q, (long long)n_pairs, lo, poff, E, (long long)ldE);
    KERN_CUDA_LAUNCHED("round_scatter_kernel");
    return KERN_OK;
}

extern "C" int kern_cuda_scatter_columns(const float *in, size_t w, size_t c0, const int64_t *lo,
                                         const int64_t *hi, size_t nq, float *E, size_t ldE)
{
    cudaGetLastError();
    if (!in || !lo || !hi || !E || c0 + w > ldE) {
        kern_set_error("scatter_columns (cuda): bad arguments");
        return KERN_EINVAL;
    }
    const long long n = (long long)(nq * w);
    if (n == 0)
        return KERN_OK;
    scatter_columns_kernel<<<(unsigned)((n + 255) / 256), 256>>>(in, (long long)w, (long long)c0,
                                                                 lo, hi, n, E, (long long)ldE);
    KERN_CUDA_LAUNCHED("scatter_columns_kernel");
    return KERN_OK;
}

extern "C" int kern_cuda_adaptive_next(const float *E, size_t ldE, const float *sorted, size_t lds,
                                       const int64_t *done, const int64_t *counts, size_t nq,
                                       size_t k, float z, double eps, double growth, size_t cap,
                                       int64_t *next)
{
    cudaGetLastError();
    if (!E || !sorted || !done || !counts || !next || k == 0 || nq > 0x7fffffff || !(z >= 0.f) ||
        !(eps > 0.0) || !(growth > 1.0)) {
        kern_set_error("adaptive_next (cuda): bad arguments (k %zu, cap %zu)", k, cap);
        return KERN_EINVAL;
    }
    if (nq == 0)
        return KERN_OK;
    next_kernel<<<(unsigned)nq, NEXT_THREADS>>>(E, (long long)ldE, sorted, (long long)lds, done,
                                                counts, (long long)k, z, eps, growth,
                                                (long long)cap, next);
    KERN_CUDA_LAUNCHED("next_kernel");
    return KERN_OK;
}
