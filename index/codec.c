/*
 * codec.c: the ColBERTv2 residual codec (DESIGN.md section 3; the layout is described in
 * codec.h). Training pools every residual value of the held-out sample, sorts them, reads
 * the cutoffs and weights off as quantiles and (idx_codec_fit) refines them by Lloyd-Max.
 * Compression runs over every token of a corpus, so it works on fixed chunks of dimensions with
 * loops the compiler vectorises, and spreads tokens over OpenMP threads when there are enough of
 * them.
 */
#include "codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/*
 * Dimensions handled per step in compress/decompress. 64 dims always fill whole bytes at
 * every nbits (64 * nbits is a multiple of 8), so chunks pack independently; and 64 keeps
 * the per-chunk scratch arrays on the stack whatever the dimension.
 */
#define CHUNK 64

/* Below this many tokens a parallel region costs more than it saves. */
#define OMP_MIN_TOKENS 1024

/* F.normalize's floor on the norm, which ColBERTv2's decompression uses: a zero vector
 * decodes to zero instead of NaN. */
#define NORM_EPS 1e-12f

/* rev8[b]: the bits of byte b in reverse order. A bucket index is written least significant
 * bit first into a stream that packbits reads most significant bit first, so each nbits-wide
 * field of a byte holds its bucket index bit-reversed: field = rev8[bucket] >> (8 - nbits). */
#define R2(n) n, n + 2 * 64, n + 1 * 64, n + 3 * 64
#define R4(n) R2(n), R2(n + 2 * 16), R2(n + 1 * 16), R2(n + 3 * 16)
#define R6(n) R4(n), R4(n + 2 * 4), R4(n + 1 * 4), R4(n + 3 * 4)
static const uint8_t rev8[256] = {R6(0), R6(2), R6(1), R6(3)};
#undef R2
#undef R4
#undef R6

static int valid_shape(size_t dim, unsigned nbits)
{
    if (nbits != 1 && nbits != 2 && nbits != 4 && nbits != 8)
        return 0;
    if (dim == 0 || dim > (SIZE_MAX / 8))
        return 0;
    return (dim * nbits) % 8 == 0;
}

size_t idx_codec_token_bytes(const idx_codec *c)
{
    return c->dim * c->nbits / 8;
}

/* ---- training ----------------------------------------------------------------------- */

/* Maps a float to an unsigned key whose unsigned order is the float order (negative floats
 * have their bits flipped, positive ones their sign bit set). */
static inline uint32_t float_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static inline float key_float(uint32_t k)
{
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* LSD radix sort of m keys, 8 bits a pass. A comparison sort of the up to 6.4 million values
 * of a 50,000-vector sample takes seconds; four linear passes take tens of milliseconds. The
 * result ends in keys (an even number of passes). Each pass runs on the threads in order: each
 * counts its own contiguous part of the keys, the counts give every thread its starting place
 * in each bucket (thread t's keys after those of threads before it), and each then moves its
 * part in order: a stable pass, so the result is the one-thread sort's, key for key. On the
 * 16-core GPU hosts the codec fit (this sort, most of it) took 0.16-0.36 s of a build's
 * training, serial, on rank 0 of a shared one. */
static void radix_sort(uint32_t *keys, uint32_t *tmp, size_t m)
{
    int most = 1;
#ifdef _OPENMP
    if (m >= ((size_t)1 << 16))
        most = omp_get_max_threads();
#endif
    size_t one[1][256];
    size_t(*count)[256] = most > 1 ? malloc((size_t)most * sizeof *count) : NULL;
    if (!count) {
        most = 1;
        count = one;
    }
    uint32_t *src = keys, *dst = tmp;
    for (int shift = 0; shift < 32; shift += 8) {
#pragma omp parallel num_threads(most) if (most > 1)
        {
            int t = 0, nt = 1;
#ifdef _OPENMP
            t = omp_get_thread_num();
            nt = omp_get_num_threads();
#endif
            const size_t lo = m * (size_t)t / (size_t)nt, hi = m * (size_t)(t + 1) / (size_t)nt;
            size_t *c = count[t];
            memset(c, 0, sizeof count[0]);
            for (size_t i = lo; i < hi; i++)
                c[(src[i] >> shift) & 0xff]++;
#pragma omp barrier
#pragma omp single
            {
                size_t sum = 0;
                for (int b = 0; b < 256; b++)
                    for (int u = 0; u < nt; u++) {
                        size_t k = count[u][b];
                        count[u][b] = sum;
                        sum += k;
                    }
            }
            for (size_t i = lo; i < hi; i++)
                dst[c[(src[i] >> shift) & 0xff]++] = src[i];
        }
        uint32_t *t = src;
        src = dst;
        dst = t;
    }
    if (most > 1)
        free(count);
}

/*
 * The q-quantile of m sorted values, by NumPy's default method ("linear", type 7 of Hyndman
 * and Fan), which torch.quantile also implements and ColBERTv2 calls: position h = q * (m - 1),
 * lo = floor(h), hi = min(lo + 1, m - 1), g = h - lo, result = v[lo] + g * (v[hi] - v[lo]),
 * written as v[hi] - (1 - g) * (v[hi] - v[lo]) when g >= 0.5 (NumPy's and torch's lerp, exact
 * at both ends). Computed in double and rounded once to float. (torch forms h in float32 for a
 * float32 input, so on millions of values its h can differ from this one by a fraction of a
 * position; the result stays between the same two neighbours.)
 */
static float quantile_sorted(const uint32_t *keys, size_t m, double q)
{
    double h = q * (double)(m - 1);
    size_t lo = (size_t)floor(h);
    if (lo > m - 1)
        lo = m - 1;
    size_t hi = lo + 1 < m ? lo + 1 : m - 1;
    double g = h - (double)lo;
    double a = key_float(keys[lo]), b = key_float(keys[hi]);
    double d = b - a;
    double r = g >= 0.5 ? b - d * (1.0 - g) : a + d * g;
    return (float)r;
}

/* The number of the m sorted values (keys) that are not above cut: where bucket_of's bucket
 * with upper cutoff cut ends (a value equal to a cutoff goes to the lower bucket), found by
 * bisection with the same float comparison (keys ascend in float order, so it holds for a
 * prefix). */
static size_t count_not_above(const uint32_t *keys, size_t m, float cut)
{
    size_t lo = 0, hi = m;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (key_float(keys[mid]) <= cut)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/*
 * Lloyd-Max iterations on the m sorted values, from the tables in t: each bucket's weight
 * becomes the mean of the values it holds (a bucket that holds none keeps its weight), each
 * cutoff the midpoint of its two weights. Each step lowers (never raises) the squared error
 * sum (v - w[bucket(v)])^2 of the pooled values, so the tables end at least as faithful as
 * the quantiles they start from. The values are sorted, so a bucket is a run, found by
 * bisection, and its sum a difference of prefix sums (in double, in a fixed order:
 * deterministic): a step costs B bisections instead of a pass over the values (30 passes over
 * 6.4M values took 0.23 s, about half of the codec's time on rank 0). Stops early once no
 * cutoff moves. prefix [m + 1]: scratch.
 */
static void lloyd_max(const uint32_t *keys, size_t m, unsigned iters, idx_codec *t, double *prefix)
{
    unsigned nb = 1u << t->nbits;
    double w[256];
    for (unsigned b = 0; b < nb; b++)
        w[b] = t->weights[b];
    prefix[0] = 0.0;
    for (size_t i = 0; i < m; i++)
        prefix[i + 1] = prefix[i] + key_float(keys[i]);
    for (unsigned it = 0; it < iters; it++) {
        size_t start = 0;
        for (unsigned b = 0; b < nb; b++) {
            /* Bucket b holds the values above cutoff b - 1 and not above cutoff b. */
            size_t end = b + 1 < nb ? count_not_above(keys, m, t->cutoffs[b]) : m;
            if (end < start)
                end = start; /* cutoffs out of order: an empty bucket */
            if (end > start)
                w[b] = (prefix[end] - prefix[start]) / (double)(end - start);
            start = end;
        }
        int moved = 0;
        for (unsigned b = 0; b < nb; b++)
            t->weights[b] = (float)w[b];
        for (unsigned b = 0; b + 1 < nb; b++) {
            float cut = (float)(0.5 * (w[b] + w[b + 1]));
            moved |= cut != t->cutoffs[b];
            t->cutoffs[b] = cut;
        }
        if (!moved)
            break;
    }
}

/* t's tables (t->nbits set) from the m sorted values: quantiles, then iters Lloyd-Max steps
 * (prefix [m + 1]: scratch, unused when iters is 0). */
static void sorted_tables(const uint32_t *keys, size_t m, unsigned iters, double *prefix,
                          idx_codec *t)
{
    unsigned nb = 1u << t->nbits;
    for (unsigned i = 1; i < nb; i++)
        t->cutoffs[i - 1] = quantile_sorted(keys, m, (double)i / nb);
    for (unsigned i = 0; i < nb; i++)
        t->weights[i] = quantile_sorted(keys, m, (i + 0.5) / nb);
    if (iters > 0)
        lloyd_max(keys, m, iters, t, prefix);
    /* Quantiles rise with q (and bucket means with the bucket); the rounding of two lerp
     * formulas or of a mean must not make a table step down by an ulp, since bucketing
     * assumes ascending cutoffs. */
    for (unsigned i = 1; i + 1 < nb; i++)
        if (t->cutoffs[i] < t->cutoffs[i - 1])
            t->cutoffs[i] = t->cutoffs[i - 1];
    for (unsigned i = 1; i < nb; i++)
        if (t->weights[i] < t->weights[i - 1])
            t->weights[i] = t->weights[i - 1];
}

/* Quantile tables (iters == 0) or Lloyd-Max tables fitted from them. */
static int train_tables(idx_codec *c, size_t dim, unsigned nbits, const float *residuals, size_t n,
                        unsigned iters)
{
    if (c == NULL || residuals == NULL || n == 0 || !valid_shape(dim, nbits))
        return -1;
    if (n > SIZE_MAX / sizeof(uint32_t) / 2 / dim)
        return -1;
    size_t m = n * dim;
    uint32_t *keys = malloc(m * sizeof *keys);
    uint32_t *tmp = malloc(m * sizeof *tmp);
    if (keys == NULL || tmp == NULL) {
        free(keys);
        free(tmp);
        return -1;
    }
    /* A NaN or infinity would make the quantiles meaningless. */
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (m >= ((size_t)1 << 16))
    for (long long i = 0; i < (long long)m; i++) {
        bad |= !isfinite(residuals[i]);
        keys[i] = float_key(residuals[i]);
    }
    if (bad) {
        free(keys);
        free(tmp);
        return -1;
    }
    radix_sort(keys, tmp, m);
    free(tmp);
    double *prefix = NULL;
    if (iters > 0 && !(prefix = malloc((m + 1) * sizeof *prefix))) {
        free(keys);
        return -1;
    }

    idx_codec t;
    memset(&t, 0, sizeof t);
    t.dim = dim;
    t.nbits = nbits;
    sorted_tables(keys, m, iters, prefix, &t);
    free(prefix);
    free(keys);
    *c = t;
    return 0;
}

int idx_codec_train(idx_codec *c, size_t dim, unsigned nbits, const float *residuals, size_t n)
{
    return train_tables(c, dim, nbits, residuals, n, 0);
}

int idx_codec_fit(idx_codec *c, size_t dim, unsigned nbits, const float *residuals, size_t n,
                  unsigned iters)
{
    return train_tables(c, dim, nbits, residuals, n, iters);
}

double idx_codec_fit_values(unsigned nbits, const float *v, size_t m, unsigned iters, float *cut,
                            float *w)
{
    if (nbits < 1 || nbits > 8 || v == NULL || m == 0 || m > SIZE_MAX / sizeof(double) - 1)
        return -1.0;
    uint32_t *keys = malloc(m * sizeof *keys);
    uint32_t *tmp = malloc(m * sizeof *tmp);
    double *prefix = malloc((m + 1) * sizeof *prefix);
    if (!keys || !tmp || !prefix) {
        free(keys);
        free(tmp);
        free(prefix);
        return -1.0;
    }
    int bad = 0;
    for (size_t i = 0; i < m; i++) {
        bad |= !isfinite(v[i]);
        keys[i] = float_key(v[i]);
    }
    double err = -1.0;
    if (!bad) {
        radix_sort(keys, tmp, m);
        idx_codec t;
        memset(&t, 0, sizeof t);
        t.nbits = nbits;
        unsigned nb = 1u << nbits;
        sorted_tables(keys, m, iters, prefix, &t);
        /* The error over the sorted values, bucket by bucket, in a fixed order. */
        err = 0.0;
        size_t start = 0;
        for (unsigned b = 0; b < nb; b++) {
            size_t end = b + 1 < nb ? count_not_above(keys, m, t.cutoffs[b]) : m;
            if (end < start)
                end = start;
            for (size_t i = start; i < end; i++) {
                double d = (double)key_float(keys[i]) - (double)t.weights[b];
                err += d * d;
            }
            start = end;
        }
        err /= (double)m;
        memcpy(cut, t.cutoffs, (nb - 1) * sizeof *cut);
        memcpy(w, t.weights, nb * sizeof *w);
    }
    free(keys);
    free(tmp);
    free(prefix);
    return err;
}

/* ---- bucketing and packing ---------------------------------------------------------- */

/*
 * The number of cutoffs strictly below v: torch.bucketize(v, cutoffs) with its default
 * right=False, as ColBERTv2's binarize calls it. A value equal to a cutoff therefore goes to
 * the lower bucket. Branch-free binary search over the ascending cutoffs; the largest index
 * read is B - 2, the last cutoff.
 */
static inline unsigned bucket_of(const float *cut, unsigned nbits, float v)
{
    unsigned b = 0;
    for (unsigned step = (1u << nbits) >> 1; step > 0; step >>= 1)
        b += (cut[b + step - 1] < v) ? step : 0;
    return b;
}

unsigned idx_codec_bucket(const idx_codec *c, float v)
{
    return bucket_of(c->cutoffs, c->nbits, v);
}

double idx_codec_sq_error(const idx_codec *c, const float *residuals, size_t n)
{
    double e = 0.0;
    for (size_t i = 0; i < n * c->dim; i++) {
        const double r =
            (double)residuals[i] - c->weights[bucket_of(c->cutoffs, c->nbits, residuals[i])];
        e += r * r;
    }
    return e;
}

/* Packs len dims (len * nbits a multiple of 8) of bucket indices into len * nbits / 8 bytes,
 * each field the bit-reversed bucket index (see rev8). */
static inline __attribute__((always_inline)) void pack_run(const uint8_t *b, size_t len,
                                                           unsigned nbits, uint8_t *out)
{
    const unsigned per = 8 / nbits, drop = 8 - nbits;
    const size_t nbytes = len * nbits / 8;
    for (size_t k = 0; k < nbytes; k++) {
        unsigned v = 0;
        for (unsigned i = 0; i < per; i++)
            v |= (unsigned)(rev8[b[k * per + i]] >> drop) << (drop - i * nbits);
        out[k] = (uint8_t)v;
    }
}

static inline __attribute__((always_inline)) void unpack_run(const uint8_t *in, size_t len,
                                                             unsigned nbits, uint8_t *b)
{
    unsigned per = 8 / nbits, drop = 8 - nbits, mask = (1u << nbits) - 1;
    size_t nbytes = len * nbits / 8;
    for (size_t k = 0; k < nbytes; k++) {
        unsigned v = in[k];
        for (unsigned i = 0; i < per; i++)
            b[k * per + i] = (uint8_t)(rev8[(v >> (drop - i * nbits)) & mask] >> drop);
    }
}

/* pack, unpack, compress and decompress do nothing for a codec of an invalid shape (only
 * idx_codec_train makes codecs, and it refuses those; this guards against a damaged one). */
void idx_codec_pack(const idx_codec *c, const uint8_t *buckets, uint8_t *packed)
{
    if (!valid_shape(c->dim, c->nbits))
        return;
    pack_run(buckets, c->dim, c->nbits, packed);
}

void idx_codec_unpack(const idx_codec *c, const uint8_t *packed, uint8_t *buckets)
{
    if (!valid_shape(c->dim, c->nbits))
        return;
    unpack_run(packed, c->dim, c->nbits, buckets);
}

/* ---- compress and decompress -------------------------------------------------------- */

/* Sum of squares with eight independent partial sums, so that the loop vectorises without
 * -ffast-math (the order of additions is fixed, hence reproducible). */
static inline float sum_squares(const float *v, size_t len)
{
    float acc[8] = {0};
    const size_t whole = len & ~(size_t)7;
    for (size_t j = 0; j < whole; j += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += v[j + l] * v[j + l];
    for (size_t j = whole; j < len; j++)
        acc[0] += v[j] * v[j];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/*
 * One run of len dims of a token (len <= CHUNK): buckets, packed bytes, and the sum of squares
 * of the decompressed values. Called with len == CHUNK, a constant, for every whole chunk, so
 * that all loops have constant trip counts and vectorise; the short last chunk of an odd
 * dimension takes the generic copy. For nbits <= 4 the bucket is a count of the cutoffs below
 * the value, one vectorised pass per cutoff (at most 15), counted in 32-bit lanes to match the
 * float compares; for nbits 8 the binary search's 8 steps beat 255 passes.
 */
static inline __attribute__((always_inline)) float compress_run(const idx_codec *c,
                                                                const float *cen, const float *e,
                                                                unsigned nbits, size_t len,
                                                                uint8_t *out)
{
    const unsigned ncut = (1u << nbits) - 1;
    float r[CHUNK], dec[CHUNK];
    int32_t bi[CHUNK];
    uint8_t b[CHUNK];
    for (size_t j = 0; j < len; j++)
        r[j] = e[j] - cen[j];
    if (nbits <= 4) {
        for (size_t j = 0; j < len; j++)
            bi[j] = 0;
        for (unsigned k = 0; k < ncut; k++) {
            const float ck = c->cutoffs[k];
            for (size_t j = 0; j < len; j++)
                bi[j] += ck < r[j];
        }
    } else {
        for (size_t j = 0; j < len; j++)
            bi[j] = (int32_t)bucket_of(c->cutoffs, nbits, r[j]);
    }
    for (size_t j = 0; j < len; j++) {
        dec[j] = cen[j] + c->weights[bi[j]];
        b[j] = (uint8_t)bi[j];
    }
    pack_run(b, len, nbits, out);
    return sum_squares(dec, len);
}

/* One token; nbits is a compile-time constant at each call site (the SPECIALISE copies). */
static inline __attribute__((always_inline)) void compress_token(const idx_codec *c,
                                                                 const float *cen, const float *e,
                                                                 unsigned nbits, uint8_t *out,
                                                                 float *inv_norm)
{
    const size_t dim = c->dim;
    float ss = 0.0f;
    size_t j0 = 0;
    for (; j0 + CHUNK <= dim; j0 += CHUNK)
        ss += compress_run(c, cen + j0, e + j0, nbits, CHUNK, out + j0 * nbits / 8);
    if (j0 < dim) {
        size_t rest = dim - j0;
        if (rest > CHUNK)
            __builtin_unreachable(); /* tells the compiler the scratch arrays suffice */
        ss += compress_run(c, cen + j0, e + j0, nbits, rest, out + j0 * nbits / 8);
    }
    float norm = sqrtf(ss);
    *inv_norm = 1.0f / (norm > NORM_EPS ? norm : NORM_EPS);
}

/* One run of len dims (len <= CHUNK) of a token, not yet normalised; constant len == CHUNK for
 * whole chunks as in compress_run. */
static inline __attribute__((always_inline)) void decompress_run(const idx_codec *c,
                                                                 const float *cen, const uint8_t *p,
                                                                 unsigned nbits, size_t len,
                                                                 float *o)
{
    uint8_t b[CHUNK];
    unpack_run(p, len, nbits, b);
    for (size_t j = 0; j < len; j++)
        o[j] = cen[j] + c->weights[b[j]];
}

/* Decompresses one token into o [dim], normalised. */
static inline __attribute__((always_inline)) void
decompress_token(const idx_codec *c, const float *cen, const uint8_t *p, unsigned nbits, float *o)
{
    const size_t dim = c->dim;
    size_t j0 = 0;
    for (; j0 + CHUNK <= dim; j0 += CHUNK)
        decompress_run(c, cen + j0, p + j0 * nbits / 8, nbits, CHUNK, o + j0);
    if (j0 < dim) {
        size_t rest = dim - j0;
        if (rest > CHUNK)
            __builtin_unreachable();
        decompress_run(c, cen + j0, p + j0 * nbits / 8, nbits, rest, o + j0);
    }
    float norm = sqrtf(sum_squares(o, dim));
    float inv = 1.0f / (norm > NORM_EPS ? norm : NORM_EPS);
    for (size_t j = 0; j < dim; j++)
        o[j] *= inv;
}

/*
 * One copy of each per nbits, with nbits a constant. The OpenMP loops below call them through
 * a pointer: GCC outlines a parallel region before it inlines, so a constant passed into a
 * function holding the region would arrive in the outlined body as a variable.
 */
typedef void compress_fn(const idx_codec *, const float *, const float *, uint8_t *, float *);
typedef void decompress_fn(const idx_codec *, const float *, const uint8_t *, float *);
#define SPECIALISE(N)                                                                              \
    static void compress_token_##N(const idx_codec *c, const float *cen, const float *e,           \
                                   uint8_t *out, float *inv)                                       \
    {                                                                                              \
        compress_token(c, cen, e, N, out, inv);                                                    \
    }                                                                                              \
    static void decompress_token_##N(const idx_codec *c, const float *cen, const uint8_t *p,       \
                                     float *o)                                                     \
    {                                                                                              \
        decompress_token(c, cen, p, N, o);                                                         \
    }
SPECIALISE(1)
SPECIALISE(2)
SPECIALISE(4)
SPECIALISE(8)
#undef SPECIALISE

void idx_codec_compress(const idx_codec *c, const float *centroids, const float *emb,
                        const uint32_t *codes, size_t n, uint8_t *packed, float *inv_norms)
{
    compress_fn *fn;
    switch (c->nbits) {
    case 1:
        fn = compress_token_1;
        break;
    case 2:
        fn = compress_token_2;
        break;
    case 4:
        fn = compress_token_4;
        break;
    case 8:
        fn = compress_token_8;
        break;
    default:
        return;
    }
    if (!valid_shape(c->dim, c->nbits))
        return;
    const size_t dim = c->dim, tb = dim * c->nbits / 8;
    /* Dynamic chunks of 256 tokens: the machines this runs on are often shared, and a static
     * split waits for whichever thread was descheduled. long long: OpenMP loops of older
     * compilers want a signed index. */
#pragma omp parallel for schedule(dynamic, 256) if (n >= OMP_MIN_TOKENS)
    for (long long i = 0; i < (long long)n; i++)
        fn(c, centroids + (size_t)codes[i] * dim, emb + (size_t)i * dim, packed + (size_t)i * tb,
           inv_norms + i);
}

void idx_codec_decompress(const idx_codec *c, const float *centroids, const uint32_t *codes,
                          const uint8_t *packed, size_t n, float *out)
{
    decompress_fn *fn;
    switch (c->nbits) {
    case 1:
        fn = decompress_token_1;
        break;
    case 2:
        fn = decompress_token_2;
        break;
    case 4:
        fn = decompress_token_4;
        break;
    case 8:
        fn = decompress_token_8;
        break;
    default:
        return;
    }
    if (!valid_shape(c->dim, c->nbits))
        return;
    const size_t dim = c->dim, tb = dim * c->nbits / 8;
#pragma omp parallel for schedule(dynamic, 256) if (n >= OMP_MIN_TOKENS)
    for (long long i = 0; i < (long long)n; i++)
        fn(c, centroids + (size_t)codes[i] * dim, packed + (size_t)i * tb, out + (size_t)i * dim);
}
