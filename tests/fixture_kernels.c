/* fixture_kernels.c: see fixture_kernels.h. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "fixture_kernels.h"

void emb_rand(emb *e, kern_dtype t, size_t rows, size_t dim)
{
    e->t = t;
    e->rows = rows;
    e->dim = dim;
    e->raw = xcalloc(rows * dim, kern_dtype_size(t));
    e->val = xcalloc(rows * dim, sizeof(float));
    for (size_t i = 0; i < rows * dim; i++) {
        float f = frnd();
        if (t == KERN_F32) {
            ((float *)e->raw)[i] = f;
        } else if (t == KERN_F16) {
            ((uint16_t *)e->raw)[i] = kern_f32_to_f16(f);
            f = kern_f16_to_f32(((uint16_t *)e->raw)[i]);
        } else if (t == KERN_BF16) {
            ((uint16_t *)e->raw)[i] = kern_f32_to_bf16(f);
            f = kern_bf16_to_f32(((uint16_t *)e->raw)[i]);
        } else {
            ((uint8_t *)e->raw)[i] = kern_f32_to_e4m3(f);
            f = kern_e4m3_to_f32(((uint8_t *)e->raw)[i]);
        }
        e->val[i] = f;
    }
}

/* Makes row dst a copy of row src (both the stored and the reference values). */
void emb_copy_row(emb *e, size_t dst, size_t src)
{
    size_t es = kern_dtype_size(e->t);
    memcpy((char *)e->raw + dst * e->dim * es, (char *)e->raw + src * e->dim * es, e->dim * es);
    memcpy(e->val + dst * e->dim, e->val + src * e->dim, e->dim * sizeof(float));
}

void emb_free(emb *e)
{
    free(e->raw);
    free(e->val);
}

uint8_t *mask_rand(size_t n, double p_valid)
{
    uint8_t *m = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++)
        m[i] =
            (uint8_t)((double)(rnd() >> 11) / 9007199254740992.0 < p_valid ? 1 + rnd() % 255 : 0);
    return m;
}

/* Random ragged lengths, a fifth of them 0 or 1 tokens. */
int64_t *ragged_offsets(size_t n, size_t maxlen)
{
    int64_t *off = xcalloc(n + 1, sizeof *off);
    for (size_t i = 0; i < n; i++) {
        size_t r = rnd() % 10, len = r == 0 ? 0 : r == 1 ? 1 : urnd(2, maxlen);
        off[i + 1] = off[i] + (int64_t)len;
    }
    return off;
}

void assert_close(float got, double ref, double bound, const char *what, size_t a, size_t b)
{
    if (isinf(ref)) {
        ck_assert_msg(isinf(got) && got < 0, "%s [%zu,%zu]: got %g, want -inf (seed %llu)", what, a,
                      b, got, (unsigned long long)rng_seed);
        return;
    }
    ck_assert_msg(fabs(got - ref) <= TOL(bound), "%s [%zu,%zu]: got %.9g, want %.9g (seed %llu)",
                  what, a, b, got, ref, (unsigned long long)rng_seed);
}

/* The micro-kernel variants this CPU runs; each numeric test loops over them. */
const char *const isas[3] = {"avx512", "avx2", "generic"};

const kern_dtype dtypes[4] = {KERN_F32, KERN_F16, KERN_BF16, KERN_E4M3};
