/*
 * microkernel_cpu.h: the register-blocked building blocks the CPU kernels share. Private to
 * kernels/.
 *
 * Every CPU kernel that multiplies query tokens with document (or centroid) tokens works the
 * same GEMM-like way: the query is packed once into panels, [dim][P] fp32 per panel of P query
 * tokens (lanes beyond the valid tokens are zero), and a micro-kernel multiplies one panel with
 * J document rows at a time, broadcasting each document value along dim and accumulating J x P
 * products in registers. The max variant folds the J rows into a per-lane running maximum (the
 * MaxSim inner step, no horizontal reduction needed); the tile variant writes the J x P block
 * for kernels that transform each product before the max (residual scoring) or keep it
 * (centroid scores); the argmax variant folds the block into a per-lane running best and its
 * row number (nearest-centroid assignment).
 *
 * Rows are passed as J pointers so that masks, ragged tails and converted 16-bit inputs cost
 * nothing: callers list valid rows only and repeat the last row to fill a group of J
 * (a repeated row cannot change a maximum).
 *
 * The implementation is chosen at run time from what the CPU supports (AVX-512, AVX2 + FMA,
 * or portable C), so one binary runs well on any x86-64 machine.
 */
#ifndef TARTAN_MICROKERNEL_CPU_H
#define TARTAN_MICROKERNEL_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* Most rows one micro-kernel call takes (the largest J of any variant). */
#define KERN_MK_MAX_J 16

/* Most lanes of one panel (the largest P of any variant). */
#define KERN_MK_MAX_P 32

typedef struct kern_mk {
    const char *name; /* "avx512", "avx2" or "generic" */
    unsigned P;       /* query lanes per panel */
    unsigned J;       /* document rows per call */
    /* mx[l] = max(mx[l], max_j <qt lane l, rows[j]>) for l < P; lanes (1..P) says how many
     * lanes are valid, so that a narrower, cheaper kernel may run on a part-filled panel.
     * pf (or NULL): J * dim * 4 bytes the caller reads next, fetched into cache a line at a
     * time while this call computes (data streamed from memory only). */
    void (*max)(const float *qt, size_t dim, const float *const *rows, unsigned lanes, float *mx,
                const char *pf);
    /* mx[l] = max(mx[l], max_j (<qt lane l, rows[j]> + add[j][l]) * scale[j]): MaxSim of
     * products that need a per-row offset and scale first (residual-fused scoring). add[j]
     * points at P floats (any alignment). */
    void (*max_affine)(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                       float *mx, const float *const *add, const float *scale);
    /* out[j * P + l] = <qt lane l, rows[j]> for j < J, l < P (lanes as for max). */
    void (*tile)(const float *qt, size_t dim, const float *const *rows, unsigned lanes, float *out);
    /* The running argmax of nearest-centroid assignment: for j = 0 .. J - 1 in turn, lane l
     * takes (<qt lane l, rows[j]>, first + j) into (best[l], bidx[l]) where the product is
     * strictly greater than best[l] (ties keep the earlier, lower index; NaN never wins).
     * The products are tile's, bit for bit. best, bidx: P entries, 64-byte aligned; callers
     * filling a group with repeats of the last row lose nothing (a repeat never wins). */
    void (*argmax)(const float *qt, size_t dim, const float *const *rows, unsigned lanes,
                   int32_t first, float *best, int32_t *bidx);
    /* max for bf16 documents read as they are, two dims per step with AVX512_BF16's dot
     * product (exact products, fp32 accumulation; bf16 subnormals count as zero): qt is a
     * panel of bf16 pairs (kern_pack_panels_bf16), rows point at bf16 rows, dim is even.
     * NULL where the CPU lacks the instruction. */
    void (*max_bf16)(const uint16_t *qt, size_t dim, const uint16_t *const *rows, unsigned lanes,
                     float *mx, const char *pf);
    /* argmax over products of bf16 pairs (AVX512_BF16's dot product; fp32 accumulation,
     * bf16 subnormals count as zero): qt a panel of bf16 pairs (kern_pack_panels_bf16), rows
     * point at bf16 rows, dim even; otherwise as argmax. The products differ from argmax's
     * (bf16 inputs), so the choice may differ where two scores are within bf16 rounding.
     * NULL where the CPU (or the compiler) lacks the instruction. */
    void (*argmax_bf16)(const uint16_t *qt, size_t dim, const uint16_t *const *rows, unsigned lanes,
                        int32_t first, float *best, int32_t *bidx);
    /* n 16-bit values to fp32. */
    void (*f16)(const uint16_t *src, float *dst, size_t n);
    void (*bf16)(const uint16_t *src, float *dst, size_t n);
} kern_mk;

/* The micro-kernels in use: the best the CPU supports, or the one forced below. */
const kern_mk *kern_mk_active(void);

/*
 * Forces a variant by name ("avx512", "avx2", "generic"; NULL: back to the best). For tests
 * and benchmarks, not thread-safe against running kernels. KERN_ENODEV if this CPU lacks it.
 */
int kern_cpu_force_isa(const char *name);

/*
 * Lets kern_nearest_centroid_bf16 use AMX tiles where it can (on: the default) or not (0: the
 * AVX512_BF16 micro-kernel instead). For tests and benchmarks, not thread-safe against running
 * kernels. KERN_ENODEV when asked on where AMX is not usable.
 */
int kern_cpu_use_amx(int on);

/* Whether this CPU can run the named variant (1) or not (0). */
int kern_cpu_has_isa(const char *name);

/* 64-byte aligned allocation (size rounded up), freed with free(). NULL on failure. */
void *kern_aligned_alloc(size_t bytes);

/* Floats of one panel: dim * P. */
static inline size_t kern_panel_floats(const kern_mk *mk, size_t dim)
{
    return dim * mk->P;
}

/* Panels for n valid query tokens: ceil(n / P). */
static inline size_t kern_npanels(const kern_mk *mk, size_t n)
{
    return (n + mk->P - 1) / mk->P;
}

/*
 * Packs n query rows (each dim elements of dtype t at rows[i]) into npanels(n) panels at out
 * (64-byte aligned, npanels * dim * P floats), converting to fp32 and zero-filling lanes past n.
 */
void kern_pack_panels(const kern_mk *mk, kern_dtype t, const void *const *rows, size_t n,
                      size_t dim, float *out);

/*
 * Packs n bf16 query rows into panels of bf16 pairs for max_bf16: [dim / 2][P][2] uint16 per
 * panel (dim even), lanes past n zero. Panels lie dim * P floats apart, as fp32 panels do, so
 * out holds npanels * dim * P floats.
 */
void kern_pack_panels_bf16(const kern_mk *mk, const void *const *rows, size_t n, size_t dim,
                           uint16_t *out);

/* Converts n elements of dtype t at src to fp32 at dst with the active micro-kernels. */
void kern_to_f32(const kern_mk *mk, kern_dtype t, const void *src, float *dst, size_t n);

/*
 * Rows of document tokens one thread converts or gathers at a time: about 128 KiB of fp32,
 * so that a chunk stays in the L2 cache while every query panel runs over it.
 */
static inline size_t kern_chunk_rows(const kern_mk *mk, size_t dim)
{
    size_t rows = (size_t)32768 / dim;
    rows -= rows % mk->J;
    return rows < mk->J ? mk->J : rows;
}

/*
 * The centroid score table transposed, qcT [n_centroids][lq_pad] (lq_pad = lq rounded up to
 * P), so that one token's scores against all query tokens are one contiguous run. Built by
 * kernels that read the table once per document token (residual scoring, centroid
 * interaction) when that beats strided reads. NULL on allocation failure.
 */
float *kern_transpose_scores(const float *S, size_t lq, size_t n_centroids, size_t lq_pad);

#endif /* TARTAN_MICROKERNEL_CPU_H */
