/*
 * axes.h: the residual code by principal axes (issue 19), layer prefix idx_.
 *
 * The scalar codec (codec.h) quantises every dimension of a residual r = e - C[c] with one
 * table and the same bits. Residuals of real models are anisotropic: a few directions hold
 * much of their variance. This code rotates each residual into the principal axes of the
 * held-out residuals (r' = R r, R orthonormal, its rows the axes by falling variance) and
 * spends the same bytes unevenly: the first n8 axes get 8 bits, the next n4 4 bits, the next n2
 * 2 bits, the next n1 1 bit, the rest none (they decode to 0), each axis with its own table:
 * Lloyd-Max's, or at dims where the GPU has no table kernel for the code, levels additive in
 * the index's bits (c0 + sum_k c_k bit_k) where they cost at most 10% more squared error over
 * all axes (the GPU's bit-plane kernels then read the code on its tensor cores). The counts are
 * those of least squared error for the budget dim * nbits bits, among
 * counts that fill whole bytes (n4 even, n2 a multiple of 4, n1 of 8), so that every packed
 * byte holds axes of one width and a decoder reads it through one table per byte position.
 *
 * Packing: the coded axes in order, 8 / w of them a byte, in the scalar codec's bit layout
 * within a byte (each index least significant bit first, the stream most significant bit
 * first), so a token takes dim * nbits / 8 bytes as before.
 *
 * Scoring never builds the decoded token: with q' = R q, <q, C[c] + R^T r'> = q . C[c] + q' . r'.
 * The query is rotated once; the centroid table q . C is unchanged; the kernels read r' through
 * the per-position tables (idx_axes_decode_tables). The stored inverse norm is that of the
 * decoded token C[c] + R^T r', as before.
 */
#ifndef TARTAN_INDEX_AXES_H
#define TARTAN_INDEX_AXES_H

#include <stddef.h>
#include <stdint.h>

/* The widest dimension the code accepts: its rotation is dim x dim floats (4 MiB at 1024). */
#define IDX_AXES_MAX_DIM 1024u
/* Levels a table of an axis holds, at most (8 bits). */
#define IDX_AXES_LEVELS 256u

typedef struct idx_axes {
    uint32_t dim;
    uint32_t nbits; /* the budget: dim * nbits bits a token, 1, 2 or 4 */
    uint32_t n8, n4, n2, n1;
    float *rot;     /* [dim][dim], owned: row a is axis a */
    float *rot_t;   /* [dim][dim], owned: its transpose (derived, for column access) */
    float *levels;  /* [dim][256]: axis a's 2^w levels, ascending; unused entries 0 */
    float *cutoffs; /* [dim][255]: midpoints of adjacent levels */
} idx_axes;

/* Width in bits of axis a. */
unsigned idx_axes_width(const idx_axes *x, size_t a);

/* Bytes a token: dim * nbits / 8, i.e. n8 + n4 / 2 + n2 / 4 + n1 / 8. */
size_t idx_axes_token_bytes(const idx_axes *x);

/*
 * Fits the code to n held-out residuals [n, dim]: their second moments in double, its
 * eigenvectors (cyclic Jacobi), each axis's Lloyd-Max tables of 1, 2, 4 and 8 bits (iters steps
 * from the quantiles) and their errors, then the byte-filling counts of least total error,
 * then, at dims without the GPU's table kernels (kern_residual_mma_dim), each coded axis's
 * additive table at its width (iters alternating least-squares steps from its Lloyd-Max
 * table; uniform where free coefficients would not ascend with the index), kept where every
 * axis has one and they add at most 10% to the summed error (TARTAN_AXES_ADDITIVE=0 in the
 * environment: never, for benchmarks). Deterministic. Returns 0, or -1 for nbits not 1, 2
 * or 4, dim 0 or above IDX_AXES_MAX_DIM, dim * nbits not a multiple of 8, n == 0, a value not
 * finite, or no memory; x is then untouched. The result owns memory: idx_axes_free.
 */
int idx_axes_fit(idx_axes *x, size_t dim, unsigned nbits, const float *residuals, size_t n,
                 unsigned iters);
void idx_axes_free(idx_axes *x);

/* Whether x's levels are additive in their index's bits, so that the GPU scores its code on
 * the bit-plane kernels at any dim (kernels.h kern_axes_additive over its decode tables); 0
 * also where out of memory. */
int idx_axes_additive(const idx_axes *x);

/* The summed squared error of coding residuals [n, dim] (their rotation against its levels;
 * the rotation is orthonormal, so the residuals' own error); -1 when out of memory. */
double idx_axes_sq_error(const idx_axes *x, const float *residuals, size_t n);

/* Compresses n tokens as idx_codec_compress does (codes index rows of centroids). */
void idx_axes_compress(const idx_axes *x, const float *centroids, const float *emb,
                       const uint32_t *codes, size_t n, uint8_t *packed, float *inv_norms);

/* Decompresses n tokens to normalised fp32 vectors out [n, dim]. */
void idx_axes_decompress(const idx_axes *x, const float *centroids, const uint32_t *codes,
                         const uint8_t *packed, size_t n, float *out);

/* Unpacks / packs one token's level indices by axis ([dim]; axes without bits read 0). */
void idx_axes_unpack(const idx_axes *x, const uint8_t *packed, uint8_t *idx);
void idx_axes_pack(const idx_axes *x, const uint8_t *idx, uint8_t *packed);

/* Rotates n rows of q [n, dim] into out [n, dim]: out = R q (for the kernels). */
void idx_axes_rotate(const idx_axes *x, const float *q, size_t n, float *out);

/*
 * The kernels' decode tables: byte position p (of token_bytes) decodes value v to the 8 / w_p
 * levels of its axes, dec[off_p + v * (8 / w_p) + i]; positions in order, each taking 256 * 8 /
 * w_p floats (idx_axes_decode_floats in all). bytes[4] receives the counts of 8-, 4-, 2- and
 * 1-bit positions.
 */
size_t idx_axes_decode_floats(const idx_axes *x);
void idx_axes_decode_tables(const idx_axes *x, float *dec, unsigned bytes[4]);

/*
 * The stored form (FORMAT.md "meta/codec.axes"): u32 dim, nbits, n8, n4, n2, n1, then as f32
 * the rotation [dim][dim] and, for each coded axis in order, its 2^w levels and 2^w - 1
 * cutoffs, in the host's byte order (little-endian on every host the project supports).
 * idx_axes_bytes: its size; idx_axes_save writes it; idx_axes_load checks and reads it (-1 for
 * a blob of the wrong size, counts that do not fill dim * nbits bits, or non-finite or
 * descending tables, with why in err [200]).
 */
size_t idx_axes_bytes(const idx_axes *x);
void idx_axes_save(const idx_axes *x, uint8_t *out);
int idx_axes_load(idx_axes *x, const uint8_t *blob, size_t len, char *err);
/* The counts of 8-, 4-, 2- and 1-bit axes from the head of a stored code (tartan_info), without
 * parsing the rest: 0, or -1 (counts untouched) where blob is shorter than the head. */
int idx_axes_counts(const uint8_t *blob, size_t len, unsigned counts[4]);

#endif
