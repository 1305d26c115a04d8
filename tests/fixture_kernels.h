/*
 * fixture_kernels.h: what the kernel test programs share: embeddings stored in each dtype with
 * the fp32 values they hold (for the references), random masks and ragged offsets, the score
 * tolerance, and a loop over the micro-kernel variants this CPU runs (avx512, avx2, generic),
 * so that a CI machine without AVX-512 still tests what it runs and this one tests all three.
 */
#ifndef TARTAN_TESTS_FIXTURE_KERNELS_H
#define TARTAN_TESTS_FIXTURE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "microkernel_cpu.h"

/* Embeddings stored in dtype t (raw) with the fp32 values they hold (val) for references. */
typedef struct emb {
    kern_dtype t;
    size_t rows, dim;
    void *raw;
    float *val;
} emb;

/* rows x dim values uniform in [-1, 1), rounded to t. */
void emb_rand(emb *e, kern_dtype t, size_t rows, size_t dim);
/* Makes row dst a copy of row src (both the stored and the reference values). */
void emb_copy_row(emb *e, size_t dst, size_t src);
void emb_free(emb *e);

/* n mask bytes, each valid (a random non-zero byte) with probability p_valid. */
uint8_t *mask_rand(size_t n, double p_valid);

/* Random ragged lengths as n + 1 offsets, a fifth of them 0 or 1 tokens, the rest 2..maxlen. */
int64_t *ragged_offsets(size_t n, size_t maxlen);

/* fp32 accumulation error allowed against a double reference whose scale is bound. */
#define TOL(bound) (2e-6 * (bound) + 1e-5)

/* got within TOL(bound) of ref (or both -inf); the message names what, a, b and the seed. */
void assert_close(float got, double ref, double bound, const char *what, size_t a, size_t b);

/* The micro-kernel variants this CPU runs; each numeric test loops over them (and calls
 * kern_cpu_force_isa(NULL) after the loop). */
extern const char *const isas[3];
#define FOR_EACH_ISA(name)                                                                         \
    for (size_t isa_i_ = 0; isa_i_ < 3; isa_i_++)                                                  \
        for (const char *name = isas[isa_i_];                                                      \
             name && kern_cpu_has_isa(name) && kern_cpu_force_isa(name) == KERN_OK; name = NULL)

/* Every storage dtype of embeddings. */
extern const kern_dtype dtypes[4];
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

#endif
