/*
 * synth_write.c: writes a synthetic corpus (synth.h) as the files `tartan build`, `tartan
 * search` and `tartan eval` read. Streams: memory stays bounded by one chunk of documents,
 * whatever the corpus size. The files do not depend on the number of threads: each document
 * is a pure function of (seed, its number), and every chunk is written in document order.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"
#include "synth.h"
#include "tartan.h"

/* Documents generated (in parallel) before each write: about 50 MB of fp32 at the defaults. */
#define GEN_CHUNK 1024

/*
 * IEEE binary16, round to nearest, ties to even (what NumPy's astype(float16) gives). The
 * tool keeps its own copy: the kernels' conversion is internal to the library.
 */
uint16_t tool_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u)                  /* rounds to 65520 or more: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {   /* under the smallest normal half: a subnormal or zero */
        if (a < 0x33000000u) /* under half the smallest subnormal: rounds to zero */
            return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* m >> shift counts units of 2^-24 */
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    /* A normal number: rebias the exponent, round the mantissa to 10 bits (a carry into the
     * exponent is the right result). */
    a += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}

static void to_f16(const float *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = tool_f32_to_f16(in[i]);
}

static int write_docs(const tool_synth *s, const tool_synth_params *p, const char *dir,
                      tool_dtype dtype, size_t *total_tokens, char *err, size_t errlen)
{
    char path[4096];
    int rc = 0;
    int32_t *lens = malloc((p->n_docs ? p->n_docs : 1) * sizeof(int32_t));
    float *buf = NULL;
    uint16_t *half = NULL;
    tool_npy_writer *w = NULL;
    FILE *ids = NULL;
    if (!lens) {
        snprintf(err, errlen, "out of memory for %zu documents", p->n_docs);
        return ENOMEM;
    }
    size_t T = 0, longest = 0;
    for (size_t i = 0; i < p->n_docs; i++) {
        size_t n = tool_synth_doclen(s, i);
        lens[i] = (int32_t)n;
        T += n;
        if (n > longest)
            longest = n;
    }
    *total_tokens = T;
    snprintf(path, sizeof path, "%s/doclens.npy", dir);
    size_t shape[2] = {p->n_docs, p->dim};
    if ((rc = tool_npy_save(path, TOOL_I32, 1, shape, lens, err, errlen)))
        goto fail;
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    if (!(ids = fopen(path, "w")))
        goto fail_errno;
    for (size_t i = 0; i < p->n_docs; i++)
        fprintf(ids, "doc%zu\n", i);
    if (fclose(ids) != 0) {
        ids = NULL;
        goto fail_errno;
    }
    ids = NULL;

    snprintf(path, sizeof path, "%s/embeddings.npy", dir);
    shape[0] = T;
    if ((rc = tool_npy_writer_open(&w, path, dtype, 2, shape, err, errlen)))
        goto fail;
    size_t cap = GEN_CHUNK * longest * p->dim;
    buf = malloc((cap ? cap : 1) * sizeof(float));
    if (dtype == TOOL_F16)
        half = malloc((cap ? cap : 1) * sizeof(uint16_t));
    if (!buf || (dtype == TOOL_F16 && !half)) {
        rc = ENOMEM;
        snprintf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    size_t offs[GEN_CHUNK + 1];
    for (size_t c0 = 0; c0 < p->n_docs; c0 += GEN_CHUNK) {
        size_t c1 = c0 + GEN_CHUNK < p->n_docs ? c0 + GEN_CHUNK : p->n_docs;
        offs[0] = 0;
        for (size_t i = c0; i < c1; i++)
            offs[i - c0 + 1] = offs[i - c0] + (size_t)lens[i];
#pragma omp parallel for schedule(dynamic, 16)
        for (size_t i = c0; i < c1; i++) {
            float *x = buf + offs[i - c0] * p->dim;
            size_t n = (size_t)lens[i] * p->dim;
            tool_synth_doc(s, i, x);
            if (half)
                to_f16(x, half + offs[i - c0] * p->dim, n);
        }
        const void *rows = half ? (const void *)half : (const void *)buf;
        if ((rc = tool_npy_writer_rows(w, rows, offs[c1 - c0], err, errlen)))
            goto fail;
    }
    rc = tool_npy_writer_close(w, err, errlen);
    w = NULL;
    if (rc)
        goto fail;
    free(half);
    free(buf);
    free(lens);
    return 0;
fail_errno:
    rc = errno;
    snprintf(err, errlen, "%s: %s", path, strerror(rc));
fail:
    if (ids)
        fclose(ids);
    tool_npy_writer_abort(w);
    free(half);
    free(buf);
    free(lens);
    return rc;
}

static int write_queries(const tool_synth *s, const tool_synth_params *p, const char *dir,
                         tool_dtype dtype, char *err, size_t errlen)
{
    char path[4096];
    int rc = 0;
    FILE *qids = NULL, *qrels = NULL;
    size_t nq = p->n_queries ? p->n_queries : 1, n = nq * p->qlen * p->dim;
    size_t *rel = malloc(nq * sizeof(size_t));
    float *q = malloc(n * sizeof(float));
    uint16_t *half = dtype == TOOL_F16 ? malloc(n * sizeof(uint16_t)) : NULL;
    if (!rel || !q || (dtype == TOOL_F16 && !half)) {
        free(rel);
        free(q);
        free(half);
        snprintf(err, errlen, "out of memory for %zu queries", p->n_queries);
        return ENOMEM;
    }
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t j = 0; j < p->n_queries; j++)
        tool_synth_query(s, j, q + j * p->qlen * p->dim, &rel[j]);
    if (half)
        to_f16(q, half, p->n_queries * p->qlen * p->dim);
    snprintf(path, sizeof path, "%s/queries.npy", dir);
    size_t shape[3] = {p->n_queries, p->qlen, p->dim};
    if ((rc = tool_npy_save(path, dtype, 3, shape, half ? (const void *)half : (const void *)q, err,
                            errlen)))
        goto fail;
    snprintf(path, sizeof path, "%s/query_ids.txt", dir);
    if (!(qids = fopen(path, "w")))
        goto fail_errno;
    snprintf(path, sizeof path, "%s/qrels.tsv", dir);
    if (!(qrels = fopen(path, "w")))
        goto fail_errno;
    fprintf(qrels, "query-id\tcorpus-id\tscore\n");
    for (size_t j = 0; j < p->n_queries; j++) {
        fprintf(qids, "q%zu\n", j);
        fprintf(qrels, "q%zu\tdoc%zu\t1\n", j, rel[j]);
    }
    if (fclose(qrels) != 0) {
        qrels = NULL;
        goto fail_errno;
    }
    qrels = NULL;
    snprintf(path, sizeof path, "%s/query_ids.txt", dir);
    if (fclose(qids) != 0) {
        qids = NULL;
        goto fail_errno;
    }
    free(rel);
    free(q);
    free(half);
    return 0;
fail_errno:
    rc = errno;
    snprintf(err, errlen, "%s: %s", path, strerror(rc));
fail:
    if (qids)
        fclose(qids);
    if (qrels)
        fclose(qrels);
    free(rel);
    free(q);
    free(half);
    return rc;
}

int tool_synth_write(const tool_synth *s, const tool_synth_params *p, const char *dir,
                     tool_dtype dtype, size_t *total_tokens, char *err, size_t errlen)
{
    *total_tokens = 0;
    if (dtype != TOOL_F32 && dtype != TOOL_F16) {
        snprintf(err, errlen, "unsupported output dtype %s", tool_dtype_name(dtype));
        return TARTAN_EDTYPE;
    }
    int rc = write_docs(s, p, dir, dtype, total_tokens, err, errlen);
    if (!rc)
        rc = write_queries(s, p, dir, dtype, err, errlen);
    return rc;
}
