/*
 * half.c: IEEE 754 binary16 <-> binary32, the element type of a version-2 centroid table
 * (FORMAT.md "centroids"). Written from the formats' definitions: round to nearest, ties to
 * even, subnormals kept, infinities and NaN preserved.
 */
#include "config.h"

#include <string.h>

#include "store.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float store_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f)
        return float_of(sign | 0x7f800000u | man << 13);
    if (exp != 0)
        return float_of(sign | (exp + 112) << 23 | man << 13);
    /* Zero or subnormal: man * 2^-24 is exact in binary32. */
    float v = (float)man * float_of(0x33800000u); /* 2^-24 */
    return float_of(sign | bits_of(v));
}

uint16_t store_f32_to_f16(float f)
{
    uint32_t u = bits_of(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u; /* NaN */
    if (a >= 0x477ff000u)
        return sign | 0x7c00u; /* rounds to 65520 or more: infinity */
    if (a < 0x38800000u) {
        /* Below the smallest normal half: a multiple of 2^-24, rounded to nearest even by the
         * float addition of 0.5 (exact arithmetic up to the rounding we want). */
        float v = float_of(a) * float_of(0x4b800000u); /* 2^24 */
        float r = v + float_of(0x4b000000u) - float_of(0x4b000000u); /* + 2^23: RNE to integer */
        return sign | (uint16_t)r;
    }
    /* Normal: rebias and round the mantissa to 10 bits, ties to even. */
    a += 0xc8000000u + 0xfffu + ((a >> 13) & 1u); /* (15 - 127) << 23, wrapped */
    return sign | (uint16_t)(a >> 13);
}
