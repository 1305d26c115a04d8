/*
 * codec.h: the ColBERTv2 residual codec (DESIGN.md section 3), layer prefix idx_.
 *
 * A token e (L2-normalised, dim floats) is stored as the code c of its nearest centroid by
 * inner product and the residual r = e - C[c] quantised per dimension into B = 2^nbits buckets
 * with one codebook for all dimensions: cutoffs [B - 1] split values into buckets, weights [B]
 * are the values buckets decode to (fitted at training: idx_codec_fit). Packing (byte-compatible
 * with ColBERTv2): each dimension's bucket index as nbits bits, least significant bit first,
 * dimensions in order, the bit stream packed into bytes most significant bit first (NumPy
 * packbits). A token's residual takes dim * nbits / 8 bytes. Decompression: d = normalise(C[c] +
 * w[bucket_j] for each j); the stored inverse norm is 1 / |C[c] + w[bucket]|.
 */
#ifndef TARTAN_INDEX_CODEC_H
#define TARTAN_INDEX_CODEC_H

#include <stddef.h>
#include <stdint.h>

typedef struct idx_codec {
    size_t dim;
    unsigned nbits;     /* 1, 2, 4 or 8 */
    float cutoffs[255]; /* [(1 << nbits) - 1], ascending */
    float weights[256]; /* [1 << nbits], ascending */
} idx_codec;

/* Bytes of packed residual per token: dim * nbits / 8. */
size_t idx_codec_token_bytes(const idx_codec *c);

/*
 * Trains cutoffs and weights from held-out residuals: the quantiles of all values (all
 * dimensions pooled) at i/B (i = 1..B-1) and (i + 0.5)/B (i = 0..B-1). residuals [n, dim].
 * Quantiles by NumPy's default "linear" method (what torch.quantile, hence ColBERTv2, uses):
 * h = q (m - 1) over the m sorted values, interpolating between v[floor h] and v[floor h + 1].
 * Returns 0, or -1 if nbits/dim are invalid (nbits not 1, 2, 4, 8 or dim * nbits not a multiple
 * of 8), n == 0, a value is NaN or infinite, or memory runs out (8 bytes per value, freed before
 * return); c is untouched on failure. Sorts a copy; input untouched.
 */
int idx_codec_train(idx_codec *c, size_t dim, unsigned nbits, const float *residuals, size_t n);

/*
 * Trains tables fitted to the residuals: starts from idx_codec_train's quantiles, then up to
 * iters Lloyd-Max steps on the same pooled values (weights = the mean of the values each bucket
 * holds, cutoffs = midpoints of adjacent weights), stopping early once no cutoff moves. Each
 * step can only lower the squared quantisation error of the pooled values, so the result is at
 * least as faithful as the quantiles, at the same bytes: only the stored tables change, and
 * every decoder (CPU and GPU kernels) reads them as before. One pass over the values a step,
 * sequential and deterministic. iters 0 gives idx_codec_train's tables. Returns and refuses
 * as idx_codec_train.
 */
int idx_codec_fit(idx_codec *c, size_t dim, unsigned nbits, const float *residuals, size_t n,
                  unsigned iters);

/*
 * Fits one table of B = 2^nbits levels (nbits 1..8) to m values v as idx_codec_fit fits the
 * pooled one: quantiles, then up to iters Lloyd-Max steps. Writes cut [B - 1] and w [B], both
 * ascending, and returns the mean squared quantisation error of the values (in double), or a
 * negative number (nothing written) for bad arguments, a value not finite, or no memory. For
 * the per-axis tables of axes.h.
 */
double idx_codec_fit_values(unsigned nbits, const float *v, size_t m, unsigned iters, float *cut,
                            float *w);

/*
 * Compresses n tokens: emb [n, dim] (fp32, L2-normalised), their codes [n] and the centroids
 * give residuals; writes packed [n, token_bytes] and inv_norms [n] (of the decompressed,
 * unnormalised vector C[code] + w[bucket], as 1 / max(norm, 1e-12) like F.normalize). codes
 * must index rows of centroids (not checked). Runs over OpenMP threads for large n.
 */
void idx_codec_compress(const idx_codec *c, const float *centroids, const float *emb,
                        const uint32_t *codes, size_t n, uint8_t *packed, float *inv_norms);

/*
 * Bucket index of one value (for tests and the packer): the number of cutoffs strictly below v,
 * i.e. torch.bucketize(v, cutoffs) with its default right=False as ColBERTv2 calls it; a value
 * equal to a cutoff goes to the lower bucket.
 */
unsigned idx_codec_bucket(const idx_codec *c, float v);
/* The summed squared error of coding residuals [n, dim] (each value against its bucket's
 * weight). */
double idx_codec_sq_error(const idx_codec *c, const float *residuals, size_t n);

/* Unpacks one token's bucket indices: packed [token_bytes] -> buckets [dim]. */
void idx_codec_unpack(const idx_codec *c, const uint8_t *packed, uint8_t *buckets);

/* Packs one token's bucket indices: buckets [dim] -> packed [token_bytes]. */
void idx_codec_pack(const idx_codec *c, const uint8_t *buckets, uint8_t *packed);

/* Decompresses n tokens to normalised fp32 vectors out [n, dim] (x / max(|x|, 1e-12)).
 * pack, unpack, compress and decompress write nothing for a codec whose nbits/dim training
 * would refuse. */
void idx_codec_decompress(const idx_codec *c, const float *centroids, const uint32_t *codes,
                          const uint8_t *packed, size_t n, float *out);

#endif
