/*
 * batch.c: checking a batch of documents before anything touches the index, and making its
 * L2-normalised fp32 copy (tokens are always normalised before encoding, DESIGN.md section 3).
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "kernels.h"
#include "plan.h"
#include "tartan.h"

/* Ids in messages are cut to this many bytes. */
#define ID_SHOWN 64

int idx_id_check(const char *id, size_t *len)
{
    if (!id)
        return TARTAN_EBADID;
    size_t n = strlen(id);
    *len = n;
    if (n == 0 || n > STORE_MAX_ID)
        return TARTAN_EBADID;
    /* Ids are lines of an ids file and fields of TREC runs: no control characters. */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c < 0x20 || c == 0x7f)
            return TARTAN_EBADID;
    }
    return 0;
}

static int id_cmp(const void *a, const void *b, void *ids)
{
    const char *const *v = ids;
    return strcmp(v[*(const size_t *)a], v[*(const size_t *)b]);
}

/* An id for a message: at most ID_SHOWN bytes. */
#define SHOW(id) (int)(strlen(id) > ID_SHOWN ? ID_SHOWN : strlen(id)), (id)

/* "document 17 (id 'abc')", or "document 17" for a batch without ids. */
static const char *label(char *buf, size_t len, const idx_input *in, size_t i)
{
    if (in->ids && in->ids[i])
        snprintf(buf, len, "document %zu (id '%.*s')", i, SHOW(in->ids[i]));
    else
        snprintf(buf, len, "document %zu", i);
    return buf;
}

static int check_ids(const idx_input *in, size_t *idlens, store_msg *m)
{
    for (size_t i = 0; i < in->n_docs; i++) {
        const char *id = in->ids[i];
        if (!id)
            return store_fail(m, TARTAN_EBADID, "document %zu: id is NULL", i);
        if (idx_id_check(id, &idlens[i])) {
            if (idlens[i] == 0)
                return store_fail(m, TARTAN_EBADID, "document %zu: empty id", i);
            if (idlens[i] > STORE_MAX_ID)
                return store_fail(m, TARTAN_EBADID,
                                  "document %zu (id '%.*s...'): id has %zu bytes, more than %u", i,
                                  SHOW(id), idlens[i], STORE_MAX_ID);
            return store_fail(m, TARTAN_EBADID,
                              "document %zu: id '%.*s' contains a control character", i, SHOW(id));
        }
    }
    size_t *order = malloc(in->n_docs * sizeof *order);
    if (!order)
        return store_fail(m, ENOMEM, "out of memory");
    for (size_t i = 0; i < in->n_docs; i++)
        order[i] = i;
    qsort_r(order, in->n_docs, sizeof *order, id_cmp, (void *)in->ids);
    int rc = 0;
    for (size_t i = 1; i < in->n_docs; i++) {
        if (strcmp(in->ids[order[i - 1]], in->ids[order[i]]) == 0) {
            size_t a = order[i - 1] < order[i] ? order[i - 1] : order[i];
            size_t b = order[i - 1] < order[i] ? order[i] : order[i - 1];
            rc = store_fail(m, TARTAN_EDUPID, "documents %zu and %zu have the same id '%.*s'", a, b,
                            SHOW(in->ids[a]));
            break;
        }
    }
    free(order);
    return rc;
}

static float load(const void *p, int dtype, size_t i)
{
    switch (dtype) {
    case IDX_F16:
        return kern_f16_to_f32(((const uint16_t *)p)[i]);
    case IDX_BF16:
        return kern_bf16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

/* Where a document first goes wrong: a non-finite value (tok, dim, nan) or a zero token. */
typedef struct bad_token {
    size_t tok, dim;
    int nan, zero;
} bad_token;

/* Converts tokens [t0, t1) into emb, L2-normalised; nonzero (and *bt) at the first bad one. */
static int load_doc(const idx_input *in, size_t dim, size_t t0, size_t t1, float *emb,
                    bad_token *bt)
{
    for (size_t t = t0; t < t1; t++) {
        float *row = emb + t * dim;
        double ss = 0.0;
        for (size_t j = 0; j < dim; j++) {
            float v = load(in->embeddings, in->dtype, t * dim + j);
            if (!isfinite(v)) {
                *bt = (bad_token){t, j, isnan(v), 0};
                return -1;
            }
            row[j] = v;
            ss += (double)v * v;
        }
        if (!(ss > 0.0)) {
            *bt = (bad_token){t, 0, 0, 1};
            return -1;
        }
        /* In double: for a token of tiny (subnormal) values 1/norm exceeds FLT_MAX, and
         * a float factor would turn it into infinities and NaNs (found by fuzzing). */
        double inv = 1.0 / sqrt(ss);
        for (size_t j = 0; j < dim; j++)
            row[j] = (float)(row[j] * inv);
    }
    return 0;
}

int idx_batch_prepare(const idx_input *in, size_t dim, idx_batch *b, store_msg *m)
{
    memset(b, 0, sizeof *b);
    if (!in)
        return store_fail(m, TARTAN_EINVAL, "batch is NULL");
    if (in->n_docs == 0)
        return store_fail(m, TARTAN_EEMPTY, "the batch has no documents");
    if (!in->doclens || !in->embeddings)
        return store_fail(m, TARTAN_EINVAL, "batch %s is NULL",
                          !in->doclens ? "doclens" : "embeddings");
    if (in->dtype != IDX_F32 && in->dtype != IDX_F16 && in->dtype != IDX_BF16)
        return store_fail(m, TARTAN_EDTYPE, "batch dtype %d is not float32, float16 or bfloat16",
                          in->dtype);
    if (in->dim != dim)
        return store_fail(m, TARTAN_EDIM,
                          "the batch's embeddings have dimension %zu, the index %zu", in->dim, dim);
    size_t *idlens = malloc(in->n_docs * sizeof *idlens);
    size_t *offsets = malloc((in->n_docs + 1) * sizeof *offsets);
    float *emb = NULL;
    int rc = 0;
    if (!idlens || !offsets) {
        rc = store_fail(m, ENOMEM, "out of memory");
        goto fail;
    }
    char lb[128];
    if (in->ids && (rc = check_ids(in, idlens, m)))
        goto fail;
    size_t total = 0;
    offsets[0] = 0;
    for (size_t i = 0; i < in->n_docs; i++) {
        size_t n = in->doclens[i];
        if (n == 0) {
            rc = store_fail(m, TARTAN_EEMPTY, "%s has no tokens", label(lb, sizeof lb, in, i));
            goto fail;
        }
        if (n > STORE_MAX_DOC_TOKENS) {
            rc = store_fail(m, TARTAN_ETOOBIG, "%s has %zu tokens, more than %u",
                            label(lb, sizeof lb, in, i), n, STORE_MAX_DOC_TOKENS);
            goto fail;
        }
        total += n;
        offsets[i + 1] = total;
    }
    if (total != in->n_rows) {
        rc = store_fail(m, TARTAN_EINVAL,
                        "doclens sum to %zu tokens but the embeddings have %zu rows", total,
                        in->n_rows);
        goto fail;
    }
    if (total > SIZE_MAX / dim / sizeof(float) || !(emb = malloc(total * dim * sizeof(float)))) {
        rc = store_fail(m, ENOMEM, "out of memory for %zu tokens", total);
        goto fail;
    }
    /* Documents over OpenMP threads (a 70-million-token corpus is 9e9 values to convert,
     * check and scale); the first bad document in order is then converted once more, alone, to
     * name its first bad token, so the message does not depend on the thread count. */
    size_t first_bad = in->n_docs;
#pragma omp parallel for schedule(dynamic, 64) reduction(min : first_bad) if (total >= 65536)
    for (long long i = 0; i < (long long)in->n_docs; i++) {
        bad_token bt;
        if (load_doc(in, dim, offsets[i], offsets[i + 1], emb, &bt))
            first_bad = (size_t)i < first_bad ? (size_t)i : first_bad;
    }
    if (first_bad < in->n_docs) {
        size_t i = first_bad;
        bad_token bt;
        load_doc(in, dim, offsets[i], offsets[i + 1], emb, &bt);
        if (bt.zero)
            rc = store_fail(m, TARTAN_ERANGE,
                            "%s: token %zu is all zeros (it has no direction to normalise)",
                            label(lb, sizeof lb, in, i), bt.tok - offsets[i]);
        else
            rc = store_fail(m, TARTAN_ENONFINITE, "%s: token %zu has %s at dimension %zu",
                            label(lb, sizeof lb, in, i), bt.tok - offsets[i],
                            bt.nan ? "NaN" : "infinity", bt.dim);
        goto fail;
    }
    b->n_docs = in->n_docs;
    b->ids = in->ids;
    b->idlens = idlens;
    b->doclens = in->doclens;
    b->offsets = offsets;
    b->n_rows = total;
    b->dim = dim;
    b->emb = emb;
    return 0;
fail:
    free(idlens);
    free(offsets);
    free(emb);
    return rc;
}

void idx_batch_free(idx_batch *b)
{
    if (!b)
        return;
    free(b->idlens);
    free(b->offsets);
    free(b->emb);
    memset(b, 0, sizeof *b);
}

size_t idx_sample_docs(size_t n_docs, size_t sample_docs)
{
    if (sample_docs)
        return sample_docs < n_docs ? sample_docs : n_docs;
    return idx_plan_sample_docs(n_docs);
}
