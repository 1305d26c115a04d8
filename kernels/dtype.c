/* dtype.c: element sizes and conversions between fp32 and the 16- and 8-bit float types. */
#include <math.h>
#include <string.h>

#include "kernels.h"

size_t kern_dtype_size(kern_dtype t)
{
    switch (t) {
    case KERN_F32:
        return 4;
    case KERN_F16:
    case KERN_BF16:
        return 2;
    case KERN_E4M3:
        return 1;
    }
    return 0;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float kern_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t kern_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a NaN after truncation */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

int8_t kern_f32_to_i8(float f)
{
    float x = f * 127.f;
    if (!(x >= -127.f))
        x = -127.f;
    if (x > 127.f)
        x = 127.f;
    return (int8_t)nearbyintf(x);
}

float kern_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* Subnormal half: renormalise into a float. */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        man &= 0x3ffu;
        return bits_f32(sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13));
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

uint16_t kern_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u)                  /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (a < 0x33000000u)
            return (uint16_t)sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e) ... places the point for a subnormal */
        uint32_t half = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    /* Normal: rebias the exponent and round the mantissa to 10 bits, ties to even. */
    a += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}

/* Every e4m3 code's value, from the definition: (-1)^s * (e ? 8 + m : m) * 2^(max(e, 1) - 10),
 * NaN at e = 15, m = 7. Constant expressions, so the table is built by the compiler. */
#define E4M3_MAG(c)                                                                                \
    ((((c) >> 3) & 15) == 15 && ((c)&7) == 7 ? NAN                                                 \
     : (((c) >> 3) & 15) == 0                ? (float)((c)&7) / 512.0f                             \
     : (((c) >> 3) & 15) <= 10 ? (float)(8 + ((c)&7)) / (float)(1 << (10 - (((c) >> 3) & 15)))     \
                               : (float)(8 + ((c)&7)) * (float)(1 << ((((c) >> 3) & 15) - 10)))
#define E4M3_VAL(c) ((c)&0x80 ? -E4M3_MAG(c) : E4M3_MAG(c))
#define E4M3_4(c) E4M3_VAL(c), E4M3_VAL((c) + 1), E4M3_VAL((c) + 2), E4M3_VAL((c) + 3)
#define E4M3_16(c) E4M3_4(c), E4M3_4((c) + 4), E4M3_4((c) + 8), E4M3_4((c) + 12)
#define E4M3_64(c) E4M3_16(c), E4M3_16((c) + 16), E4M3_16((c) + 32), E4M3_16((c) + 48)
static const float e4m3_table[256] = {E4M3_64(0), E4M3_64(64), E4M3_64(128), E4M3_64(192)};

float kern_e4m3_to_f32(uint8_t x)
{
    return e4m3_table[x];
}

void kern_e4m3_to_f32_n(const uint8_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = e4m3_table[src[i]];
}

uint8_t kern_f32_to_e4m3(float f)
{
    uint32_t u = f32_bits(f);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7f;      /* NaN */
    if (a >= 0x43e00000u) /* >= 448 (and infinity): saturate */
        return (uint8_t)(sign | 0x7e);
    if (a < 0x3c800000u) { /* below 2^-6: a multiple of 2^-9 (8 is the smallest normal) */
        /* a * 2^9 < 8 is exact in fp32; round it to an integer, ties to even. */
        const float x = bits_f32(a) * 512.0f;
        uint32_t q = (uint32_t)x;
        const float r = x - (float)q;
        if (r > 0.5f || (r == 0.5f && (q & 1u)))
            q++;
        return (uint8_t)(sign | q);
    }
    /* Normal: round the mantissa to 3 bits (ties to even), then rebias 127 -> 7; a carry out
     * of the mantissa moves the exponent up, which the add does by itself. */
    a += 0x7ffffu + ((a >> 20) & 1u);
    const uint32_t e = (a >> 23) - 120, m = (a >> 20) & 7u;
    if (e > 15 || (e == 15 && m == 7))
        return (uint8_t)(sign | 0x7e); /* rounded past 448 */
    return (uint8_t)(sign | (e << 3) | m);
}

/* The narrow table copies' layout (kernels.h, kern_cuda_centroid_scores_f16): block q holds
 * the columns [q_off[q], q_off[q + 1]) of every row, [K, width], the blocks one after another. */
void kern_table_blocks(const void *src, size_t elem, size_t K, size_t ld, const int64_t *q_off,
                       size_t nq, void *dst)
{
    const char *s = src;
    char *d = dst;
    for (size_t q = 0; q < nq; q++) {
        const size_t b = (size_t)q_off[q], w = (size_t)(q_off[q + 1] - q_off[q]);
        for (size_t c = 0; c < K && w; c++)
            memcpy(d + (b * K + c * w) * elem, s + (c * ld + b) * elem, w * elem);
    }
}

void kern_table_blk(const int64_t *q_off, size_t nq, int32_t *blk)
{
    for (size_t q = 0; q < nq; q++)
        for (int64_t n = q_off[q]; n < q_off[q + 1]; n++) {
            blk[2 * n] = (int32_t)q_off[q];
            blk[2 * n + 1] = (int32_t)(q_off[q + 1] - q_off[q]);
        }
}
