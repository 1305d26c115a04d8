/*
 * bytes.h: fixed-width numbers in and out of byte records, in the machine's byte order (the
 * index's, storage/FORMAT.md), through memcpy so that no alignment is assumed. For records
 * that several layers lay out: the header (storage/meta.c), model strings (index/model_io.c),
 * the calibration (engine/calibrate.c).
 */
#ifndef TARTAN_STORAGE_BYTES_H
#define TARTAN_STORAGE_BYTES_H

#include <stdint.h>
#include <string.h>

static inline void store_put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static inline void store_put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static inline void store_putf(uint8_t *p, float v)
{
    memcpy(p, &v, 4);
}

static inline void store_putd(uint8_t *p, double v)
{
    memcpy(p, &v, 8);
}

static inline uint32_t store_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t store_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline float store_getf(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

static inline double store_getd(const uint8_t *p)
{
    double v;
    memcpy(&v, p, 8);
    return v;
}

#endif
