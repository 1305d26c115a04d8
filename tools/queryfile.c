/*
 * queryfile.c: query embeddings from a .npy file, however they are laid out (queryfile.h).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "errbuf.h"
#include "queryfile.h"

void tool_qfile_close(tool_qfile *s)
{
    tool_npy_close(&s->emb);
    tool_npy_close(&s->lens);
    free(s->start);
    free(s->qlen);
}

int tool_qfile_open(tool_qfile *s, const char *path, const char *lens_path, char *err,
                    size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    s->lens_path = lens_path;
    int rc = tool_npy_open(&s->emb, path, TOOL_DT_FLOATS, 2, 3, err, errlen);
    if (rc)
        return rc;
    s->dtype = s->emb.dtype == TOOL_F32   ? TARTAN_FLOAT32
               : s->emb.dtype == TOOL_F16 ? TARTAN_FLOAT16
                                          : TARTAN_BFLOAT16;
    s->elsize = tool_dtype_size(s->emb.dtype);
    s->dim = s->emb.shape[s->emb.rank - 1];
    if (s->emb.rank == 3) {
        s->nq = s->emb.shape[0];
        s->stride = s->emb.shape[1];
    } else if (!lens_path) {
        return tool_fail(err, errlen, TARTAN_EINVAL,
                         "%s: packed queries [%zu, %zu] need --qlens (tokens per query); "
                         "fixed-length queries are [queries, tokens, dim]",
                         path, s->emb.shape[0], s->emb.shape[1]);
    }
    if (s->dim == 0)
        return tool_fail(err, errlen, TARTAN_EDIM, "%s: dimension 0", path);
    if (lens_path) {
        if ((rc = tool_npy_open(&s->lens, lens_path, TOOL_DT_INTS, 1, 1, err, errlen)))
            return rc;
        s->have_lens = 1;
        size_t n = s->lens.shape[0];
        if (s->emb.rank == 3 && n != s->nq)
            return tool_fail(err, errlen, TARTAN_EFORMAT,
                             "%s has %zu lengths but %s holds %zu queries", lens_path, n, path,
                             s->nq);
        s->nq = n;
    }
    if (s->nq == 0)
        return tool_fail(err, errlen, TARTAN_EEMPTY, "%s: no queries", path);
    if (!(s->qlen = malloc(s->nq * sizeof *s->qlen)))
        return tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
    if (!s->have_lens) {
        if (s->stride == 0)
            return tool_fail(err, errlen, TARTAN_EEMPTY, "%s: queries of 0 tokens", path);
        for (size_t i = 0; i < s->nq; i++)
            s->qlen[i] = s->stride;
        return 0;
    }
    if (s->emb.rank == 2 && !(s->start = malloc((s->nq + 1) * sizeof *s->start)))
        return tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
    size_t total = 0;
    for (size_t i = 0; i < s->nq; i++) {
        int64_t v = s->lens.dtype == TOOL_I32 ? ((const int32_t *)s->lens.data)[i]
                                              : ((const int64_t *)s->lens.data)[i];
        if (v < 1)
            return tool_fail(err, errlen, TARTAN_EEMPTY,
                             "%s: query %zu has length %lld (at least 1 token)", lens_path, i,
                             (long long)v);
        if (s->emb.rank == 3 && (uint64_t)v > s->stride)
            return tool_fail(err, errlen, TARTAN_EFORMAT,
                             "%s: query %zu has length %lld but %s holds %zu tokens a query",
                             lens_path, i, (long long)v, path, s->stride);
        if (s->emb.rank == 2 && (uint64_t)v > s->emb.shape[0] - total)
            return tool_fail(err, errlen, TARTAN_ETRUNC,
                             "%s: the lengths sum to more than the %zu rows of %s (query %zu)",
                             lens_path, s->emb.shape[0], path, i);
        s->qlen[i] = (size_t)v;
        if (s->start)
            s->start[i] = total;
        total += (size_t)v;
    }
    if (s->start) {
        s->start[s->nq] = total;
        if (total != s->emb.shape[0])
            return tool_fail(err, errlen, TARTAN_EFORMAT,
                             "%s: the lengths sum to %zu but %s has %zu rows", lens_path, total,
                             path, s->emb.shape[0]);
    }
    return 0;
}

/*
 * Describes queries [q0, q1) as a tartan_queries. Fixed-length and packed queries point
 * straight into the file's mapping; padded ones (rank 3 with lengths) are gathered into buf.
 */
void tool_qfile_batch(const tool_qfile *s, size_t q0, size_t q1, char *buf, size_t *qlens,
                      tartan_queries *q)
{
    size_t row = s->dim * s->elsize;
    memset(q, 0, sizeof *q);
    q->n_queries = q1 - q0;
    q->dim = s->dim;
    q->dtype = s->dtype;
    const char *data = s->emb.data;
    if (!s->have_lens) {
        q->qlen = s->stride;
        q->n_rows = (q1 - q0) * s->stride;
        q->embeddings = data + q0 * s->stride * row;
        return;
    }
    size_t rows = 0;
    for (size_t i = q0; i < q1; i++) {
        qlens[i - q0] = s->qlen[i];
        if (!s->start)
            memcpy(buf + rows * row, data + i * s->stride * row, s->qlen[i] * row);
        rows += s->qlen[i];
    }
    q->qlens = qlens;
    q->n_rows = rows;
    q->embeddings = s->start ? data + s->start[q0] * row : buf;
}

/* Gives the mapped pages of queries already searched back to the system, so that a query
 * file larger than memory streams (as tools/ingest.c does for documents). */
void tool_qfile_release(const tool_qfile *s, size_t q1, size_t *released)
{
    if (!s->emb.mapped)
        return;
    size_t row = s->dim * s->elsize;
    size_t end = (s->start ? s->start[q1] : q1 * s->stride) * row;
    size_t page = 4096;
    uintptr_t base = (uintptr_t)s->emb.np_base;
    uintptr_t from = ((uintptr_t)s->emb.data + *released + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t to = ((uintptr_t)s->emb.data + end) & ~(uintptr_t)(page - 1);
    if (to > from && from >= base) {
        madvise((void *)from, to - from, MADV_DONTNEED);
        *released = to - (uintptr_t)s->emb.data;
    }
}
