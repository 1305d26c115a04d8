/*
 * rand.h: a deterministic stream of random numbers (splitmix64) for sampling and shuffling:
 * the training sample (write.c), k-means's seeds and subsets (assign.c) and the codec's
 * hold-out (train.c). Seeded from the index's seed, so that a build is reproducible.
 */
#ifndef TARTAN_INDEX_RAND_H
#define TARTAN_INDEX_RAND_H

#include <stdint.h>

/* The next number of the stream whose state is *s (advanced). */
static inline uint64_t idx_rand_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
