/*
 * rand.h: a deterministic stream of random numbers (splitmix64) for sampling and shuffling:
 * the training sample (write.c), k-means's seeds and subsets (assign.c) and the codec's
 * hold-out (train.c). Seeded from the index's seed, so that a build is reproducible.
 */
#ifndef TARTAN_INDEX_RAND_H
#define TARTAN_INDEX_RAND_H

#include <stddef.h>
#include <stdint.h>

/* The next number of the stream whose state is *s (advanced). */
static inline uint64_t idx_rand_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/*
 * Selection sampling (Knuth's algorithm S) from stream: want of n indices, uniformly, ascending,
 * in one pass, here run only up to hi: the selected indices in [lo, hi), less lo, into out
 * (ascending); returns how many, and *below how many were selected under lo. The members of a
 * training group (group.h) each run the same selection over the group's indices and keep their
 * own range of them, without drawing for the points after it.
 */
static inline size_t idx_select_range(uint64_t stream, size_t n, size_t want, size_t lo, size_t hi,
                                      size_t *out, size_t *below)
{
    uint64_t st = stream;
    size_t got = 0, mine = 0;
    /* The modulo bias is below 2^-30 here. */
    for (size_t i = 0; i < hi && got < want; i++)
        if ((size_t)(idx_rand_next(&st) % (n - i)) < want - got) {
            if (i >= lo)
                out[mine++] = i - lo;
            got++;
        }
    *below = got - mine;
    return mine;
}

#endif
