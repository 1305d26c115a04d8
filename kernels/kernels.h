/*
 * kernels.h: the numeric kernels' internal interface (layer prefix kern_).
 *
 * One device-neutral set of calls. Each call names the device it runs on (kern_dev); the CPU
 * implementation lives in kernels/ *_cpu.c (C, OpenMP, SIMD), the CUDA one in kernels/ *.cu.
 * A build without CUDA answers KERN_ENODEV for KERN_DEV_CUDA.
 *
 * Memory: every pointer a call takes lives in the memory of the device the call runs on: host
 * memory for KERN_DEV_CPU, device memory (kern_cuda_malloc) for KERN_DEV_CUDA. CUDA calls
 * run on the stream given in kern_cuda_stream (NULL: the default stream) and return once the
 * work is queued, unless the call says otherwise; kern_cuda_sync() waits.
 *
 * Semantics shared by every MaxSim variant:
 * - score(q, d) = sum over the query's valid tokens of the max over the document's valid
 *   tokens of <q_i, d_t>, accumulated in fp32 whatever the input type.
 * - masked or padding positions never win a max (they count as -inf);
 * - a document with no valid token scores -INFINITY (KERN_EMPTY_SCORE) and top-k never
 *   returns it; a query with no valid token scores 0 against every non-empty document;
 * - nothing of size nq * nd * lq * ld is ever allocated, nor padded copies of ragged input.
 *
 * This layer uses nothing of the project. Its status codes are its own (KERN_E...); the engine
 * maps them to TARTAN_E... codes.
 */
#ifndef TARTAN_KERNELS_H
#define TARTAN_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
enum {
    KERN_OK = 0,
    KERN_EINVAL = -1, /* bad argument: NULL pointer, zero dim, nbits not 1/2/4/8, ... */
    KERN_ENOMEM = -2, /* host or device allocation failed */
    KERN_ENODEV = -3, /* no such device: CUDA asked for but not built or no GPU present */
    KERN_EDEVICE = -4 /* a CUDA call failed; kern_last_error() has its text */
};

/* Where a call runs. */
typedef enum kern_dev { KERN_DEV_CPU = 0, KERN_DEV_CUDA = 1 } kern_dev;

/* Element types of embeddings. Queries and documents of one call share one type.
 * KERN_E4M3: 8-bit floats (the "e4m3fn" format: sign, 4 exponent bits of bias 7, 3 mantissa
 * bits; no infinities, 0x7f / 0xff are NaN, largest finite 448, smallest subnormal 2^-9). Its
 * precision is relative (3 mantissa bits) across 2^-6 .. 448, so unit vectors need no scale;
 * whoever scales the embeddings by s_q and s_d gets scores scaled by s_q * s_d. On the CPU, and
 * on CUDA through an exact fp32 path, wherever the 16-bit types run; on Hopper (sm_90) dense
 * calls without document masks at dim 64, 96 or 128 take the FP8 tensor cores (fp32
 * accumulation of the exact products, at the rounding the tensor cores apply). */
typedef enum kern_dtype { KERN_F32 = 0, KERN_F16 = 1, KERN_BF16 = 2, KERN_E4M3 = 3 } kern_dtype;

/* The score of a document that has no valid token. */
#define KERN_EMPTY_SCORE (-INFINITY)

/* Bytes per element of a dtype (4, 2, 2, 1), or 0 for an unknown one. */
size_t kern_dtype_size(kern_dtype t);

/* Conversions between fp32 and the 16-bit types (round to nearest even). */
float kern_f16_to_f32(uint16_t h);
uint16_t kern_f32_to_f16(float f);
float kern_bf16_to_f32(uint16_t h);
uint16_t kern_f32_to_bf16(float f);
/* A score in the GPU interaction's int8 table: round(127 f) (ties to even), f clamped to
 * [-1, 1], NaN to -127; the score it stands for is the result / 127. */
int8_t kern_f32_to_i8(float f);
/* ... and e4m3: round to nearest, ties to even; beyond +-448 saturates to +-448 (the
 * conversion the FP8 tensor-core kernels' users want: no value becomes NaN); NaN -> 0x7f. */
float kern_e4m3_to_f32(uint8_t x);
void kern_e4m3_to_f32_n(const uint8_t *src, float *dst, size_t n); /* n of them (a table) */
uint8_t kern_f32_to_e4m3(float f);

/* Text of the last failure in this thread (CUDA error string and where), "" if none. */
const char *kern_last_error(void);

/* ---------------------------------------------------------------------------------------
 * MaxSim, dense: Q [nq, lq, dim] against D [nd, ld, dim], scores [nq, nd] (row-major).
 * qmask [nq, lq] and dmask [nd, ld]: nonzero = valid token; NULL = all valid.
 * ------------------------------------------------------------------------------------- */
typedef struct kern_dense {
    kern_dtype dtype;
    size_t dim;
    const void *q;
    const uint8_t *qmask;
    size_t nq, lq;
    const void *d;
    const uint8_t *dmask;
    size_t nd, ld;
} kern_dense;

int kern_maxsim_dense(kern_dev dev, const kern_dense *a, float *scores);

/* ---------------------------------------------------------------------------------------
 * MaxSim, varlen: queries packed [q_off[nq], dim] with offsets q_off [nq + 1]; documents
 * packed [d_off[nd], dim] with offsets d_off [nd + 1] (non-decreasing, starting at 0: an
 * empty document has d_off[i] == d_off[i + 1]). scores [nq, nd].
 * ------------------------------------------------------------------------------------- */
typedef struct kern_varlen {
    kern_dtype dtype;
    size_t dim;
    const void *q;
    const int64_t *q_off;
    size_t nq;
    const void *d;
    const int64_t *d_off;
    size_t nd;
} kern_varlen;

int kern_maxsim_varlen(kern_dev dev, const kern_varlen *a, float *scores);

/* ---------------------------------------------------------------------------------------
 * MaxSim on INT8 tokens with per-token scales (deferred dequantisation): token t stands for
 * scale[t] * x[t, :] with x int8 in [-127, 127]. Queries and documents packed and offset as in
 * kern_varlen, both int8 with an fp32 scale per token (q_scale [q_off[nq]], d_scale
 * [d_off[nd]]). <q_i, d_t> = (q_scale[i] * d_scale[t]) * dot_int32(q_i, d_t): the integer dot
 * is exact (dim <= 1040 keeps it exact in fp32 too), the product of the scales is rounded to
 * fp32 once; then max over t and the fp32 sum over i as for every MaxSim. scores [nq, nd].
 * ------------------------------------------------------------------------------------- */
typedef struct kern_varlen_i8 {
    size_t dim;
    const int8_t *q;
    const float *q_scale;
    const int64_t *q_off;
    size_t nq;
    const int8_t *d;
    const float *d_scale;
    const int64_t *d_off;
    size_t nd;
} kern_varlen_i8;

int kern_maxsim_varlen_i8(kern_dev dev, const kern_varlen_i8 *a, float *scores);

/*
 * Symmetric per-token quantiser: for each of n rows of x [n, dim] fp32, scale = max|x| / 127
 * and q = round-to-nearest-even(x * (127 / max|x|)), so |x - scale * q| <= scale / 2 (up to
 * fp32 rounding). A zero row, or one holding NaN or inf, gets scale 0 and q 0. q [n, dim],
 * scales [n].
 */
int kern_quantize_i8(kern_dev dev, const float *x, size_t n, size_t dim, int8_t *q, float *scales);

/* ---------------------------------------------------------------------------------------
 * Centroid scores: S = Q C^T. q [lq, dim] fp32, centroids [n_centroids, dim] fp32,
 * S [lq, n_centroids]. (PLAID stage 1; also the q . C[code] table the residual kernel reads.)
 * ------------------------------------------------------------------------------------- */
int kern_centroid_scores(kern_dev dev, const float *q, size_t lq, const float *centroids,
                         size_t n_centroids, size_t dim, float *S);

/* The same for the centroids cols [ncols] only, transposed: out [ncols, ld] (ld >= lq),
 * out[j * ld + i] = S[i, cols[j]] of kern_centroid_scores on the same device, bit for bit
 * (lanes past lq untouched). CPU only (KERN_ENODEV elsewhere). */
int kern_centroid_scores_cols(kern_dev dev, const float *q, size_t lq, const float *centroids,
                              size_t dim, const uint32_t *cols, size_t ncols, float *out,
                              size_t ld);

/* ---------------------------------------------------------------------------------------
 * The probe of PLAID's stage 1 screened on AMX tiles: the score table in bf16 and each query
 * token's best centroids as fp32 ranks them. A probe table holds the centroids as bf16 tiles
 * (K x dim x 2 bytes) and their norms; built once (kern_probe_table_new says KERN_ENODEV where
 * the CPU, the OS or the build has no AMX tiles, or the micro-kernels in use are not
 * AVX-512's), it serves every later search of the same centroids: kern_probe_table_matches
 * says whether t was built from centroids of this shape (and compares a sample of values).
 *
 * kern_centroid_probe (centroids: the fp32 table t was built from, read by the refinement)
 * fills S [lq, K], and ST [K, ld] (ld >= lq rounded up to 16; NULL: not wanted) with the same
 * transposed (lanes past lq zero), with bf16 products (each within a proven bound of
 * kern_centroid_scores's fp32 score: about 0.006 for unit vectors; entries the refinement rescored
 * hold the fp32 score itself) and idx, val [lq, nc] with exactly what kern_centroid_scores followed
 * by kern_topk_rows(S, lq, K, nc) gives on the CPU: indices and scores bit for bit, equal scores to
 * the lower index. n_fp32 (or NULL): tokens the screen could not settle, whose rows it computed in
 * fp32 instead (non-finite input, or more than nc + 256 centroids within the bound's window). nc in
 * 1 .. K (KERN_EINVAL otherwise).
 * ------------------------------------------------------------------------------------- */
typedef struct kern_probe_table kern_probe_table;
int kern_probe_table_new(kern_dev dev, const float *centroids, size_t n_centroids, size_t dim,
                         kern_probe_table **out);
void kern_probe_table_free(kern_probe_table *t);
int kern_probe_table_matches(const kern_probe_table *t, const float *centroids, size_t n_centroids,
                             size_t dim);
int kern_centroid_probe(kern_dev dev, const kern_probe_table *t, const float *centroids,
                        const float *q, size_t lq, size_t nc, float *S, float *ST, size_t ld,
                        int64_t *idx, float *val, size_t *n_fp32);

/* ---------------------------------------------------------------------------------------
 * Nearest centroid (index building: k-means assignment, token encoding): for each of n points
 * x [n, dim] fp32, the centroid of centroids [n_centroids, dim] fp32 with the greatest inner
 * product: best [n] (int32), and its score best_score [n] (NULL: not wanted). Products in fp32
 * (the devices' summation orders differ, so they may pick differently only where two scores are
 * within fp32 rounding of each other); equal scores go to the lower index; a NaN score never
 * wins (a point whose every score is NaN gets -1 and -inf). Nothing of size n * n_centroids is
 * allocated on either device: scores and argmax are fused. The answer does not depend on the
 * thread count. On CPUs with AMX tiles, bf16 products on the tiles first list the few
 * centroids that can be a point's fp32 best (a proven bound on the bf16 error), and fp32 then
 * chooses among them: the same codes and scores bit for bit, 4.5x faster at K 8,192. On CUDA
 * GPUs of sm_80 or later likewise on the tensor cores (nearest_bf16_cuda.cu): a bf16 pass with
 * each point's best and second-best scores, fp32 for the points whose gap the error bound
 * cannot settle; the fp32 kernel's codes and scores bit for bit, and the call then waits for
 * the device once. TARTAN_GPU_NEAREST=fp32 in the environment keeps the GPU on fp32 alone.
 * n_centroids must be 1 to INT32_MAX.
 * ------------------------------------------------------------------------------------- */
int kern_nearest_centroid(kern_dev dev, const float *x, size_t n, const float *centroids,
                          size_t n_centroids, size_t dim, int32_t *best, float *best_score);

/*
 * The same with bf16 products, for k-means training (never for encoding, whose codes must be
 * fp32's): each point and centroid rounded to bf16 (nearest even), products of bf16 pairs
 * accumulated in fp32 (bf16 subnormals count as zero), on Intel AMX tiles where the CPU has
 * them, else with AVX512_BF16's dot product; on CUDA GPUs of sm_80 or later with the tensor
 * cores' mma (at dims too wide for that kernel, the fp32 kernel answers, which keeps this
 * promise too). The scores are within bf16 rounding of fp32's
 * (|error| <= 2^-8 |x| |c| at worst, about 4e-4 typically at d 128 for unit vectors), so a
 * point may take another centroid where two scores are that close. Ties, NaN, thread count: as
 * kern_nearest_centroid (the two paths may differ from each other in the last bits).
 * KERN_ENODEV where kern_nearest_centroid_bf16_path says NULL.
 */
int kern_nearest_centroid_bf16(kern_dev dev, const float *x, size_t n, const float *centroids,
                               size_t n_centroids, size_t dim, int32_t *best, float *best_score);

/* Which way kern_nearest_centroid_bf16 runs on dev now: "amx", "avx512bf16" (CPU), "mma" (CUDA
 * tensor cores), or NULL (it cannot: no AMX nor AVX512_BF16 in this CPU or build, a forced
 * variant without them; no CUDA build, no GPU, or one before sm_80). */
const char *kern_nearest_centroid_bf16_path(kern_dev dev);

/* Whether that way is faster than kern_nearest_centroid's fp32 on this CPU: AMX is (about 20x
 * the products a cycle); AVX512_BF16's dot product is on AMD (Zen 4, 5), not on Intel. On CUDA:
 * wherever it runs (the tensor cores' bf16 rate is 8x or more the fp32 FMA rate). */
int kern_nearest_centroid_bf16_pays(kern_dev dev);

/* ---------------------------------------------------------------------------------------
 * k-means's cluster sums where the points live (CUDA only: KERN_ENODEV in a build without
 * CUDA; every pointer device memory). For the points x [n, dim] fp32 and their clusters codes
 * [n] (uint32, each below k):
 *   sums[c * dim + j] = sum over the points i of cluster c of llrint(x[i, j] * 2^30),
 *   counts[c] = how many points cluster c has,
 * with llrint rounding to nearest, ties to even: the integers index/assign.h's idx_fixed_point
 * holds in doubles (IDX_SUM_SCALE is 2^30). sums [k, dim] and counts [k] are int64, zeroed by
 * the call, then added to with integer atomics: exact and independent of order, so equal bit
 * for bit to the CPU's sums of the same integers wherever those are exact (below 2^53 in
 * magnitude). No int64 sum overflows while |x| <= 1 (L2-normalised points) and n < 2^33. A
 * point whose code is not below k is left out (the caller checks its codes). Queued on the
 * default stream; a download after it waits for it. KERN_EINVAL for NULL or bad sizes
 * (k or dim 0, dim above INT_MAX).
 * ------------------------------------------------------------------------------------- */
int kern_cuda_cluster_sums(const float *x, size_t n, size_t dim, const uint32_t *codes, size_t k,
                           int64_t *sums, int64_t *counts);

/* ---------------------------------------------------------------------------------------
 * PLAID documents as the index stores them: per token a centroid code (uint16 when
 * code_bytes == 2, uint32 when 4), dim * nbits / 8 bytes of packed residual (ColBERTv2's bit
 * layout, see index/codec.h) and an fp32 inverse norm of the decompressed vector. A document is
 * three pointers and a token count, so that a kernel can read straight from LMDB's map.
 * ------------------------------------------------------------------------------------- */
typedef struct kern_pdoc {
    const void *codes;        /* [ntok] uint16 or uint32 */
    const uint8_t *residuals; /* [ntok, dim * nbits / 8] */
    const float *inv_norms;   /* [ntok] */
    uint32_t ntok;
} kern_pdoc;

typedef struct kern_residual {
    size_t dim;
    unsigned nbits;            /* 1, 2, 4 or 8 */
    unsigned code_bytes;       /* 2 or 4 */
    const float *q;            /* [lq, dim] fp32, one query */
    size_t lq;
    const float *qc;           /* [lq, n_centroids]: kern_centroid_scores(q, centroids) */
    size_t n_centroids;
    const float *bucket_weights; /* [1 << nbits] */
    const kern_pdoc *docs;     /* [nd] */
    size_t nd;
    /* Or, on the CPU (qc may then be NULL): the same table transposed, qcT [n_centroids, ld]
     * with qcT[c * ld + i] = qc[i, c], ld >= lq rounded up to 32 (lanes past lq finite: they
     * are computed, then left out), so the kernel reads it as it is instead of transposing qc
     * on every call. */
    const float *qcT;
    size_t ld;
    /* Or the residual code by principal axes (index/axes.h), where axes_dec is not NULL: q
     * then holds the rotated query (R q), and packed byte p of a token decodes through a table
     * of its own, axes_dec holding the positions' tables in order, 256 x (8 / w) floats for a
     * position of w-bit axes; the first axes_bytes[0] positions hold 8-bit axes, the next
     * axes_bytes[1] 4-bit ones, then axes_bytes[2] of 2-bit and axes_bytes[3] of 1-bit ones,
     * decoding to dims in order, and the dims past them decode to 0. nbits and bucket_weights
     * are then not read; the token's residual takes the sum of axes_bytes bytes. On the CPU
     * and on CUDA (kernels/residual_axes_cuda.cu: the tables in shared memory as fp16 where
     * they fit, at dims 64, 96 and 128, the residual term on the tensor cores at the scalar
     * path's precision; elsewhere an exact fp32 kernel); the AMX screen answers KERN_ENODEV. */
    const float *axes_dec;
    unsigned axes_bytes[4];
    /* Non-zero where kern_axes_additive(axes_dec, axes_bytes) holds: CUDA then scores the
     * packed bits on the tensor cores, without the tables (any dim). The CPU ignores it. */
    int axes_additive;
} kern_residual;

/*
 * Whether the axes code's tables dec (host memory, laid out as kern_residual.axes_dec for the
 * positions bytes[4]) are additive in each byte's bits: every entry of value v at a position
 * equals the entry at 0 plus, for each bit b set in v, the entry at 1 << b less the entry at 0,
 * within 1e-5 of the tables' largest magnitude (index/axes.c fits such tables). 1 or 0.
 */
int kern_axes_additive(const float *dec, const unsigned bytes[4]);

/*
 * Residual-fused exact MaxSim of one query against nd PLAID documents: for each token,
 * <q_i, d_t> = (qc[i, code_t] + sum_j q_ij * w[bucket_tj]) * inv_norm_t, never building the
 * decompressed document. scores [nd].
 */
int kern_maxsim_residual(kern_dev dev, const kern_residual *a, float *scores);

/*
 * A screen for it: approx [nd], the same MaxSim with bf16 products (on AMX tiles), and bound
 * [nd], a proven bound on |approx - kern_maxsim_residual's score| for each document (from the
 * query's and the bucket weights' bf16 rounding errors and both sides' fp32 rounding; about
 * 0.1 for 32 unit query tokens; INFINITY where it cannot say, for non-finite inputs). A
 * document without tokens: KERN_EMPTY_SCORE, bound 0. Exhaustive search keeps the exact top
 * k by rescoring only the documents the bounds cannot rule out (engine/search_exact.c).
 * KERN_ENODEV where kern_maxsim_residual_screen_usable says 0 (not the CPU, no AMX);
 * arguments as kern_maxsim_residual's.
 */
int kern_maxsim_residual_screen(kern_dev dev, const kern_residual *a, float *approx, float *bound);
int kern_maxsim_residual_screen_usable(kern_dev dev);

/*
 * Whether the CUDA kernels multiply a residual code of this dim on the tensor cores through
 * its tables (axes: the axes code, else the scalar one), where the device's shared memory
 * holds them; other dims take an exact fp32 kernel, tens of times slower (d 384, axes code:
 * exhaustive search 20.9 ms a query against 0.17 ms for the scalar code's tensor-core kernel,
 * H200), except an axes code whose tables are additive in the bits (kern_axes_additive),
 * which the bit-plane kernels multiply on the tensor cores at any dim. A property
 * of the library, not of a device: it answers the same without CUDA, so an index trained here
 * can weigh how a GPU will read it (index/train.c, TARTAN_CODEC_AUTO).
 */
int kern_residual_mma_dim(size_t dim, int axes);

/*
 * Centroid interaction (PLAID stages 2 and 3): approx[n] = sum_i max over tokens t of doc n
 * whose code is kept of S[i, code_t]. keep [n_centroids] (nonzero = kept) or NULL for all.
 * Codes only are read from docs (residuals and norms may be NULL). A document with no kept
 * token scores KERN_EMPTY_SCORE.
 */
int kern_centroid_interaction(kern_dev dev, const float *S, size_t lq, size_t n_centroids,
                              unsigned code_bytes, const kern_pdoc *docs, size_t nd,
                              const uint8_t *keep, float *approx);
/* The same from the table transposed, ST [n_centroids, ld] (ST[c * ld + i] = S[i, c]; ld >= lq
 * rounded up to 16, lanes past lq finite), the layout the CPU kernel works in. CPU only. */
int kern_centroid_interaction_t(kern_dev dev, const float *ST, size_t ld, size_t lq,
                                size_t n_centroids, unsigned code_bytes, const kern_pdoc *docs,
                                size_t nd, const uint8_t *keep, float *approx);

/* ---------------------------------------------------------------------------------------
 * Top-k. Best first by score; equal scores in order of lower index first; scores of
 * KERN_EMPTY_SCORE (and NaN) are never selected. Fewer than k results when fewer qualify.
 * ------------------------------------------------------------------------------------- */

/* Each row's top k of a [rows, n] matrix: idx [rows, k] (-1 past the end), val [rows, k]. */
int kern_topk_rows(kern_dev dev, const float *x, size_t rows, size_t n, size_t k, int64_t *idx,
                   float *val);

/*
 * Chunked top-k over a stream of host scores in bounded memory (O(k)), any total length.
 * (On the GPU, kern_topk_rows reduces a device chunk first; its k results are pushed here.)
 *   kern_topk_new(k) -> state or NULL (ENOMEM); kern_topk_push(state, scores, ids, n) adds n
 *   scores with their ids (ids NULL: consecutive ids continuing after the last id pushed);
 *   kern_topk_take(state, idx, val) writes the best min(k, count) best first and returns
 *   that count; kern_topk_free(state) (NULL allowed).
 */
typedef struct kern_topk kern_topk;
kern_topk *kern_topk_new(size_t k);
int kern_topk_push(kern_topk *t, const float *scores, const int64_t *ids, size_t n);
size_t kern_topk_take(kern_topk *t, int64_t *idx, float *val);
void kern_topk_free(kern_topk *t);
/* The k-th best score held once k are held (a score below it can no longer enter), else
 * -INFINITY. */
float kern_topk_threshold(const kern_topk *t);

/* ---------------------------------------------------------------------------------------
 * The GPU search pipeline (CUDA only: KERN_ENODEV in a build without CUDA). Batched PLAID
 * stages over an index held in device memory, for nq queries at once, with no host round trip
 * between stages except where a call says so. Every pointer is device memory.
 *
 * Layout shared by these calls:
 * - the queries' tokens are rows [q_off[q], q_off[q + 1]) of a token table; q_off [nq + 1]
 *   is given twice, on the host (h_q_off) to size launches and on the device (q_off);
 * - ST [K, ld]: the centroid scores transposed, ST[c * ld + j] = <token j, centroid c>, one
 *   column per query token (ld >= q_off[nq]); kern_centroid_scores(centroids, K, tokens, nt)
 *   computes it;
 * - a document is numbered; its tokens are [doc_off[d], doc_off[d + 1]) of the resident
 *   arrays codes (uint32), residuals (dim * nbits / 8 bytes a token) and inv_norms;
 * - lists of documents per query are [nq, width] matrices of document numbers, KERN_NO_DOC
 *   past a query's last, with scores [nq, width] (NaN past the last: never selected by top-k).
 * ------------------------------------------------------------------------------------- */
#define KERN_NO_DOC 0xffffffffu
/* Most centroids one query token may probe on the GPU. */
#define KERN_CUDA_MAX_NCELLS 64

/* ST [K, nt] as kern_centroid_scores(centroids, K, tokens, nt) computes it, for centroids whose
 * every value is a binary16 number, given as those numbers (c16 [K, dim], device): fp16
 * tensor-core products with each token split in two fp16 parts, as accurate as the fp32 call
 * to a few units of fp32 rounding and about 3x faster on sm_90. ST16 (NULL: none) receives
 * the same scores rounded to fp16 (nearest even), in blocks (below). dim % 16 == 0, c16 and
 * tokens 16-byte aligned; KERN_EINVAL otherwise (use kern_centroid_scores).
 *
 * The copy's blocks: blk (device, int32 [2 nt], or NULL) gives each column n the first column
 * b = blk[2n] and the width w = blk[2n + 1] of its block (a query's columns), and the copy
 * holds score (c, n) at b * K + c * w + (n - b): a block is [K, w], row-major, the blocks one
 * after the other. Why: the centroid interaction reads a query's row of each code of its
 * candidates; in [K, nt] a query's row shares its 128-byte L2 line with other queries' rows,
 * so a query's table took twice (fp16) or four times (int8) its bytes of L2, and at 1M
 * documents most of those reads went to DRAM. NULL: one block, [K, nt].
 *
 * tilekey (device, [ceil(K / KERN_CUDA_TILE_ROWS), nt], or NULL): for each run of
 * KERN_CUDA_TILE_ROWS rows and each column, the best score of those rows as an order key
 * (kern_cuda_probe), 0 where none is above -inf: the probe skips the runs whose best is below
 * what it keeps. Only with colbest. */
#define KERN_CUDA_TILE_ROWS 128
int kern_cuda_centroid_scores_f16(const uint16_t *c16, size_t K, const float *tokens, size_t nt,
                                  size_t dim, float *ST, uint16_t *ST16, unsigned *colbest,
                                  const int32_t *blk, unsigned *tilekey);
/* The same, with ST8 (device, 2-byte aligned; NULL: none) receiving the scores as int8
 * (kern_f32_to_i8) instead of fp16. Both: colbest (device, [nt]; NULL: none) receives each
 * column's best score (NaN left out) as an order key (kern_cuda_probe), 0 for a column with
 * none above -inf: what kern_cuda_probe would find first, found as the table is written. */
int kern_cuda_centroid_scores_f16_i8(const uint16_t *c16, size_t K, const float *tokens, size_t nt,
                                     size_t dim, float *ST, int8_t *ST8, unsigned *colbest,
                                     const int32_t *blk, unsigned *tilekey);
/* On the host: the blocks of a table src [K, ld] of elem-byte values for queries at columns
 * q_off [nq + 1] (as above, block q = the query's columns) into dst (q_off[nq] * K values);
 * and blk [2 * q_off[nq]] for them. */
void kern_table_blocks(const void *src, size_t elem, size_t K, size_t ld, const int64_t *q_off,
                       size_t nq, void *dst);
void kern_table_blk(const int64_t *q_off, size_t nq, int32_t *blk);
/* The same blk on the device from the device's q_off [nq + 1] (nq >= 1; columns [0, nt) with
 * nt <= q_off[nq]), without a copy from the host. */
int kern_cuda_table_blk(const int64_t *q_off, size_t nq, size_t nt, int32_t *blk);

/* Each token's best ncells centroids (ties to the lower number): probes [nt, ncells] for the
 * nt = ld columns of ST [K, ld]; of those, only the ones whose score is within margin of the
 * token's best (margin >= 0; INFINITY: all), the others -1. col_margin (device, [ld], or NULL)
 * gives each column its own margin instead, margin then being the largest of them (INFINITY
 * when any is); a column whose margin is negative probes nothing (all -1). colbest (device,
 * [ld], or NULL): each column's best score as an order key (the float's bits, all of them
 * flipped where negative, the top bit set where not; 0: none), as the table kernels give it;
 * NULL: found here with a finite margin (a pass over ST). tilekey (device, or NULL; only with
 * colbest): the best of each run of KERN_CUDA_TILE_ROWS rows as the table kernels give it; a
 * run whose best is below a column's best less its margin is not read for that column (at
 * K 131,072 and margins of a few hundredths, most of the table). The same probes. */
int kern_cuda_probe(const float *ST, size_t K, size_t ld, size_t ncells, float margin,
                    const float *col_margin, const unsigned *colbest, const unsigned *tilekey,
                    int32_t *probes);

/*
 * Candidates, counted: for each query q, the union of the inverted lists (CSR: ivf_off [K + 1]
 * int64, ivf_docs) of its tokens' probes [q_off[q] * ncells, q_off[q + 1] * ncells), kept
 * where live (bitmap over document numbers, bit d % 32 of word d / 32) and allowed (the same,
 * or NULL), is set in bits [nq, words] (all zero on entry, or as a former pass left them)
 * and counted in counts [nq] (int64: the bits this call set). words = ceil(n_docs / 32).
 */
int kern_cuda_candidates_mark(const int32_t *probes, size_t ncells, const int64_t *q_off,
                             const int64_t *h_q_off, size_t nq, const int64_t *ivf_off, const uint32_t *ivf_docs,
                             const uint32_t *live, const uint32_t *allowed, size_t words,
                             uint32_t *bits, int64_t *counts);
/* ... then written out in ascending number, width per query (counts[q] <= width), clearing
 * bits: docs [nq, width]. */
int kern_cuda_candidates_take(uint32_t *bits, size_t nq, size_t words, uint32_t *docs,
                             size_t width);

/*
 * Centroid interaction (PLAID stages 2 and 3) over docs [nq, width]: approx[q, i] = sum over
 * query q's tokens j of the max over the document's tokens t with kept code of
 * ST[code_t * ld + j]; a token is kept when prune is zero, or when query q has at most
 * prune_over candidates (counts [nq] on the device; NULL: prune applies to all), or when the
 * best score of its centroid over query q's tokens reaches threshold. A document with no kept token scores
 * KERN_EMPTY_SCORE; KERN_NO_DOC slots NaN.
 */
int kern_cuda_interaction(const float *ST, size_t n_centroids, size_t ld, const int64_t *q_off,
                         const int64_t *h_q_off, size_t nq, const int64_t *doc_off,
                         const uint32_t *codes, const uint32_t *docs, size_t width, int prune,
                         const int64_t *counts, int64_t prune_over, float threshold,
                         float *approx);

/* The same sums read from ST16, the table rounded to fp16 (kern_cuda_centroid_scores_f16's
 * ST16, in blocks of the queries' columns h_q_off): equal to kern_cuda_interaction over an fp32
 * table holding the rounded values, up to the order of the fp32 sum (four lanes a document, half
 * the bytes a row); the threshold's verdict still reads ST. Needs ld, every h_q_off[q] a multiple
 * of 8 and ST16 16-byte aligned; KERN_EINVAL otherwise. */
int kern_cuda_interaction_h16(const float *ST, const uint16_t *ST16, size_t n_centroids, size_t ld,
                              const int64_t *q_off, const int64_t *h_q_off, size_t nq,
                              const int64_t *doc_off, const uint32_t *codes, const uint32_t *docs,
                              size_t width, int prune, const int64_t *counts, int64_t prune_over,
                              float threshold, float *approx);

/* The same sums read from ST8, the table as int8 (kern_cuda_centroid_scores_f16_i8's ST8, in
 * blocks of the queries' columns): each
 * query token's best of the document's int8 scores, summed exactly as integers and divided by
 * 127; kern_cuda_interaction over a table holding the values kern_f32_to_i8(v) / 127 gives
 * the same, up to its fp32 sum's rounding. A row of a query's 32 scores is 32 bytes, a
 * quarter of the fp32 table's, one L2 sector. Needs ld, every h_q_off[q] a multiple of 8 and
 * ST8 8-byte aligned; KERN_EINVAL otherwise. */
int kern_cuda_interaction_i8(const float *ST, const int8_t *ST8, size_t n_centroids, size_t ld,
                             const int64_t *q_off, const int64_t *h_q_off, size_t nq,
                             const int64_t *doc_off, const uint32_t *codes, const uint32_t *docs,
                             size_t width, int prune, const int64_t *counts, int64_t prune_over,
                             float threshold, float *approx);

/*
 * The adaptive exact stage (engine/SEARCH.md) runs in rounds. Per query q its candidates are
 * ordered by approximate score; done[q] of them are scored exactly, in E [nq, ldE] (column j:
 * the j-th candidate); a round scores columns [done[q], next[q]).
 *
 * take_columns: out [nq, c1 - c0] = columns [c0, c1) of in [nq, width], KERN_NO_DOC where a
 * column lies outside [lo[q], hi[q]) (lo, hi: int64 [nq] on the device, or NULL: no bound).
 * scatter_columns: E[q, c0 + j] = in[q, j] (in [nq, w]) where lo[q] <= c0 + j < hi[q].
 */
/*
 * The pairs of a round as one list, no holes: query q's poff[q + 1] - poff[q] columns of in
 * [nq, width] from lo[q] on, in turn, its first at poff[q] (poff [nq + 1]: exclusive sums of
 * the queries' counts, on the device; n_pairs = poff[nq]): docs[i] = in[q, lo[q] + i -
 * poff[q]], pair_q[i] = q.
 * round_scatter: E[q, lo[q] + i - poff[q]] = scores[i] for every pair i of pair_q.
 */
int kern_cuda_round_pairs(const uint32_t *in, size_t width, const int64_t *lo, const int64_t *poff,
                          size_t nq, size_t n_pairs, uint32_t *docs, uint32_t *pair_q);
int kern_cuda_round_scatter(const float *scores, const uint32_t *pair_q, size_t n_pairs,
                            const int64_t *lo, const int64_t *poff, float *E, size_t ldE);
int kern_cuda_take_columns(const uint32_t *in, size_t width, size_t c0, size_t c1,
                           const int64_t *lo, const int64_t *hi, size_t nq, uint32_t *out);
int kern_cuda_scatter_columns(const float *in, size_t w, size_t c0, const int64_t *lo,
                              const int64_t *hi, size_t nq, float *E, size_t ldE);

/*
 * The stopping rule, per query q with n = done[q] candidates scored: with mu and sd the mean
 * and standard deviation of E - sorted over its first n columns (sorted [nq, lds]: the
 * candidates' approximate scores in descending order, at least min(counts[q], cap) of them: the
 * best of every candidate's) and theta the k-th best of those exact scores, the candidates
 * whose approximate score reaches theta - mu - z sd number c (sorted holds all of them that
 * count: c is only ever taken up to min(counts[q], cap)), and m is eng_tail_need's bound over
 * sorted's first min(counts[q], cap) columns (the smallest m >= n whose remaining candidates'
 * chances to beat theta sum to at most eps), taken up to the growth limit; next[q] =
 * min(max(c, m), ceil(n * growth), min(counts[q], cap)), or n when that is not more than n,
 * or when n < k or n >= min(counts[q], cap) (nothing left to score). All arrays on the
 * device, int64 where integer.
 */
int kern_cuda_adaptive_next(const float *E, size_t ldE, const float *sorted, size_t lds,
                            const int64_t *done, const int64_t *counts, size_t nq, size_t k,
                            float z, double eps, double growth, size_t cap, int64_t *next);

/* out[q, j] = in[q, sel[q, j]] (KERN_NO_DOC where sel is negative), for j < k of sel [nq, k]
 * and in [nq, width]; width 0: in is one list for every query, out[q, j] = in[sel[q, j]]. */
int kern_cuda_gather_docs(const uint32_t *in, size_t width, const int64_t *sel, size_t nq,
                         size_t k, uint32_t *out);

/*
 * Exact residual-fused scores of many (query, document) pairs: pair n of nq * per_q is query
 * n / per_q against document docs[n] (docs [nq, per_q]) or, with cross, docs[n % per_q]
 * (docs [per_q], the same list for every query); a KERN_NO_DOC document, or one without
 * tokens, scores KERN_EMPTY_SCORE. The
 * query's tokens are rows of q [*, dim] (fp32) at q_off, its q . C table the columns of ST
 * [n_centroids, ld], which must be followed by KERN_CUDA_ST_SLACK floats of readable memory
 * (the kernel reads a query's rows in groups of 32 at fixed offsets and ignores those past its
 * end). Precision as kern_maxsim_residual's on the GPU. scores [nq, per_q].
 */
#define KERN_CUDA_ST_SLACK 32
typedef struct kern_cuda_exact {
    size_t dim;
    unsigned nbits;
    const float *q;
    const int64_t *q_off;
    const int64_t *h_q_off;
    size_t nq;
    const float *ST;
    size_t ld, n_centroids;
    const float *bucket_weights;
    const int64_t *doc_off;
    const uint32_t *codes;
    const uint8_t *residuals;
    const float *inv_norms;
    const uint32_t *docs;
    size_t per_q;
    int cross;
    /* A list of pairs instead of [nq, per_q]: pair i (i < per_q) is docs[i] against query
     * pair_q[i] (< nq), its score scores[i]. Not with cross. */
    const uint32_t *pair_q;
    /* The residual code by principal axes (device memory; NULL: the scalar code), as in
     * kern_residual: q holds the rotated queries, residuals the sum of axes_bytes bytes a
     * token; nbits and bucket_weights are then not read. Last, so that initialisers that name
     * only the fields before it keep the scalar code. */
    const float *axes_dec;
    unsigned axes_bytes[4];
    int axes_additive; /* as kern_residual's (the tables' test done on the host copy) */
} kern_cuda_exact;

int kern_cuda_exact_scores(const kern_cuda_exact *a, float *scores);

/*
 * The resident inverted lists from the codes: ivf_off [K + 1] and ivf_docs (each live
 * document once in the list of every centroid one of its tokens has), for documents
 * [0, n_docs) with doc_off [n_docs + 1]. Two calls: with ivf_docs NULL, fills ivf_off and
 * *n_entries (synchronises: the host needs the size); then with ivf_docs of n_entries.
 * Order within a list is unspecified. scratch [K] int64.
 */
int kern_cuda_build_ivf(const int64_t *doc_off, const uint32_t *codes, const uint32_t *live,
                       size_t n_docs, size_t K, int64_t *ivf_off, int64_t *scratch,
                       uint32_t *ivf_docs, size_t *n_entries);

/* Memory helpers of the pipeline: fill bytes, device-to-device copy, page-locked host memory,
 * and asynchronous copies on the default stream (callers synchronise with kern_cuda_sync). */
int kern_cuda_memset(void *p, int byte, size_t bytes);
int kern_cuda_copy_d2d(void *dst, const void *src, size_t bytes);
int kern_cuda_host_alloc(void **p, size_t bytes);
void kern_cuda_host_free(void *p);
int kern_cuda_upload_async(void *dst, const void *src, size_t bytes);
/*
 * Copies that overlap the kernels: host-to-device copies on a stream of their own, ordered
 * against the kernels' default stream per slot (a buffer pair the caller cycles through).
 *   upload: queues a copy into slot s (after the kernels that last used the slot, see release);
 *   ready: kernels queued from now on wait for slot s's copies;
 *   release: the kernels queued so far are the last to read slot s;
 *   host_wait: the host waits for slot s's copies (its page-locked source may then change).
 */
typedef struct kern_cuda_copier kern_cuda_copier;
int kern_cuda_copier_new(kern_cuda_copier **c, int slots);
void kern_cuda_copier_free(kern_cuda_copier *c);
int kern_cuda_copier_upload(kern_cuda_copier *c, int s, void *dst, const void *src, size_t bytes);
int kern_cuda_copier_ready(kern_cuda_copier *c, int s);
int kern_cuda_copier_release(kern_cuda_copier *c, int s);
int kern_cuda_copier_host_wait(kern_cuda_copier *c, int s);

/* Free and total device memory (bytes). */
int kern_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* ---------------------------------------------------------------------------------------
 * Devices
 * ------------------------------------------------------------------------------------- */

/* Number of usable CUDA GPUs: 0 in a build without CUDA, or with no GPU or driver. */
int kern_cuda_device_count(void);

/* The calling thread's CUDA device, which every later kern_cuda_ and KERN_DEV_CUDA call of the
 * thread uses (per thread, as in CUDA; a new thread starts on device 0). KERN_ENODEV in a
 * build without CUDA; KERN_EDEVICE for a device that is not there. */
int kern_cuda_set_device(int dev);
int kern_cuda_get_device(int *dev);

/* Device memory and copies for the CUDA path (KERN_ENODEV in a build without CUDA). */
int kern_cuda_malloc(void **p, size_t bytes);
void kern_cuda_free(void *p);
int kern_cuda_upload(void *dst, const void *src, size_t bytes);
int kern_cuda_download(void *dst, const void *src, size_t bytes);
int kern_cuda_sync(void);

/* CPU threads used by the OpenMP kernels (0: OpenMP's default). */
void kern_set_threads(int n);

#ifdef __cplusplus
}
#endif

#endif /* TARTAN_KERNELS_H */
