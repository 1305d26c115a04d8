/* ingest.c: see ingest.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "errbuf.h"
#include "ingest.h"
#include "progress.h"
#include "textfile.h"

int tool_parse_size(const char *s, size_t *v)
{
    if (!s || !*s || *s == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *v = (size_t)x;
    return 0;
}

int tool_parse_device(const char *s, tartan_device *d)
{
    if (s && strcmp(s, "auto") == 0)
        *d = TARTAN_DEVICE_AUTO;
    else if (s && strcmp(s, "cpu") == 0)
        *d = TARTAN_DEVICE_CPU;
    else if (s && strcmp(s, "cuda") == 0)
        *d = TARTAN_DEVICE_CUDA;
    else
        return -1;
    return 0;
}

size_t tool_corpus_doclen(const tool_corpus *c, size_t i)
{
    if (c->lens.dtype == TOOL_I32)
        return (size_t)((const int32_t *)c->lens.data)[i];
    return (size_t)((const int64_t *)c->lens.data)[i];
}

/* The library's message without its leading code name: the command prints the name once,
 * before the context this file adds ("batch of documents 0..999: ..."). */
static const char *errdetail(const tartan_db *db, int rc)
{
    const char *m = tartan_errmsg(db), *name = tartan_err_name(rc);
    size_t n = name ? strlen(name) : 0;
    if (n && !strncmp(m, name, n) && !strncmp(m + n, ": ", 2))
        return m + n + 2;
    return m;
}

static int64_t raw_len(const tool_corpus *c, size_t i)
{
    if (c->lens.dtype == TOOL_I32)
        return ((const int32_t *)c->lens.data)[i];
    return ((const int64_t *)c->lens.data)[i];
}

void tool_corpus_close(tool_corpus *c)
{
    tool_npy_close(&c->emb);
    tool_npy_close(&c->lens);
    if (c->have_ids)
        tool_idlist_free(&c->ids);
    memset(c, 0, sizeof *c);
}

int tool_corpus_open(tool_corpus *c, const char *emb, const char *lens, const char *ids, char *err,
                     size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->emb_path = emb;
    c->lens_path = lens;
    c->ids_path = ids;
    int rc = tool_npy_open(&c->emb, emb, TOOL_DT_FLOATS, 2, 2, err, errlen);
    if (rc)
        return rc;
    if ((rc = tool_npy_open(&c->lens, lens, TOOL_DT_INTS, 1, 1, err, errlen)))
        goto fail;
    c->n_docs = c->lens.shape[0];
    c->n_rows = c->emb.shape[0];
    c->dim = c->emb.shape[1];
    c->dtype = c->emb.dtype == TOOL_F32   ? TARTAN_FLOAT32
               : c->emb.dtype == TOOL_F16 ? TARTAN_FLOAT16
                                          : TARTAN_BFLOAT16;
    c->row_bytes = c->dim * tool_dtype_size(c->emb.dtype);
    if (c->n_docs == 0) {
        rc = tool_fail(err, errlen, TARTAN_EEMPTY, "%s: no documents", lens);
        goto fail;
    }
    if (c->dim == 0) {
        rc = tool_fail(err, errlen, TARTAN_EDIM, "%s: embeddings of dimension 0", emb);
        goto fail;
    }
    size_t sum = 0;
    for (size_t i = 0; i < c->n_docs; i++) {
        int64_t l = raw_len(c, i);
        if (l <= 0) {
            rc = tool_fail(err, errlen, TARTAN_EEMPTY, "%s: document %zu has length %lld", lens, i,
                           (long long)l);
            goto fail;
        }
        sum += (size_t)l;
    }
    if (sum != c->n_rows) {
        rc = tool_fail(err, errlen, sum > c->n_rows ? TARTAN_ETRUNC : TARTAN_EFORMAT,
                       "%s has %zu rows but %s sums to %zu", emb, c->n_rows, lens, sum);
        goto fail;
    }
    if (ids) {
        if ((rc = tool_idlist_read(&c->ids, ids, err, errlen)))
            goto fail;
        c->have_ids = 1;
        if (c->ids.n != c->n_docs) {
            rc = tool_fail(err, errlen, c->ids.n < c->n_docs ? TARTAN_ETRUNC : TARTAN_EFORMAT,
                           "%s has %zu ids but %s has %zu documents", ids, c->ids.n, lens,
                           c->n_docs);
            goto fail;
        }
    }
    return 0;
fail:
    tool_corpus_close(c);
    return rc;
}

/* Gives back the mapped pages of the embeddings below byte offset upto of the data (whole
 * pages only): they were read once and are not needed again. */
static void release_upto(tool_corpus *c, size_t upto)
{
    if (!c->emb.mapped)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const char *base = c->emb.np_base;
    size_t start_off = (size_t)((const char *)c->emb.data - base);
    size_t end = (start_off + upto) / page * page;
    if (end > c->released) {
        madvise((char *)base + c->released, end - c->released, MADV_DONTNEED);
        c->released = end;
    }
}

static void release_all(tool_corpus *c)
{
    if (!c->emb.mapped)
        return;
    madvise(c->emb.np_base, c->emb.np_len, MADV_DONTNEED);
    c->released = 0;
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

const char *tool_corpus_id(const tool_corpus *c, size_t i, char buf[21])
{
    if (c->have_ids)
        return c->ids.ids[i];
    snprintf(buf, 21, "%zu", i);
    return buf;
}

void tool_sample_free(tool_sample *s)
{
    free(s->lens);
    if (!s->borrowed)
        free(s->emb);
    memset(s, 0, sizeof *s);
}

int tool_corpus_sample(tool_corpus *c, size_t want, uint64_t seed, const uint8_t *keep,
                       tool_sample *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    size_t avail = c->n_docs;
    if (keep) {
        avail = 0;
        for (size_t i = 0; i < c->n_docs; i++)
            avail += keep[i] != 0;
    }
    if (want > avail)
        want = avail;
    size_t *lens = malloc((want ? want : 1) * sizeof *lens);
    size_t *pick = malloc((want ? want : 1) * sizeof *pick);
    if (!lens || !pick) {
        free(lens);
        free(pick);
        return tool_fail(err, errlen, ENOMEM, "out of memory for a sample of %zu documents", want);
    }
    /* Selection sampling (each document kept with probability needed / remaining): uniform
     * over the whole file, in file order, in O(sample) memory. */
    uint64_t st = seed;
    size_t n = 0, tokens = 0, seen = 0;
    for (size_t i = 0; i < c->n_docs && n < want; i++) {
        if (keep && !keep[i])
            continue;
        if (next_rand(&st) % (avail - seen) < want - n) {
            pick[n] = i;
            lens[n] = tool_corpus_doclen(c, i);
            tokens += lens[n];
            n++;
        }
        seen++;
    }
    if (!keep && n == c->n_docs) {
        /* Every document: the sample is the file's rows as they stand, read in place (the
         * mapping or the buffer), not copied; adding reads them all next anyway. At d 384 the
         * copy of 1,000 documents' 227k tokens was 0.18-0.21 s of a 1.5 s GPU build. */
        free(pick);
        s->n = n;
        s->tokens = tokens;
        s->lens = lens;
        s->emb = (char *)c->emb.data;
        s->borrowed = 1;
        return 0;
    }
    char *buf = malloc((tokens ? tokens : 1) * c->row_bytes);
    if (!buf) {
        free(lens);
        free(pick);
        return tool_fail(err, errlen, ENOMEM, "out of memory for a sample of %zu tokens", tokens);
    }
    /* Where each picked document's rows start in the file (src [n]) and in the sample (dst
     * [n + 1]): one pass over the document lengths. */
    size_t *src = malloc((2 * n + 1) * sizeof *src), *dst = src + n;
    if (!src) {
        free(buf);
        free(lens);
        free(pick);
        return tool_fail(err, errlen, ENOMEM, "out of memory for a sample of %zu documents", n);
    }
    dst[0] = 0;
    for (size_t i = 0, row = 0, k = 0; i < c->n_docs && k < n; i++) {
        if (pick[k] == i) {
            src[k] = row;
            dst[k + 1] = dst[k] + lens[k];
            k++;
        }
        row += tool_corpus_doclen(c, i);
    }
    /* A mapped file is read with pread, not through the mapping: a fault maps a whole
     * neighbourhood of the page (fault-around, large folios), and faults spread over the whole
     * file would make most of it resident. The mapping starts at the file's offset 0. The
     * reads run in parallel: a sample of 2M documents of 10 tokens is a quarter of a million
     * scattered reads of 5 KB (the 2-GPU build's sampling took 0.62 s, one read after another),
     * and a disk or the page cache serves many at once. */
    int fd = -1;
    size_t base = 0;
    if (c->emb.mapped) {
        fd = open(c->emb_path, O_RDONLY | O_CLOEXEC);
        base = (size_t)((const char *)c->emb.data - (const char *)c->emb.np_base);
    }
    int rc = 0;
    const long nn = (long)n;
#pragma omp parallel for schedule(dynamic, 64) if (fd >= 0 && n > 1024)
    for (long k = 0; k < nn; k++) {
        char *to = buf + dst[k] * c->row_bytes;
        const size_t len = (dst[k + 1] - dst[k]) * c->row_bytes, from = src[k] * c->row_bytes;
        if (fd < 0) {
            memcpy(to, (const char *)c->emb.data + from, len);
            continue;
        }
        for (size_t got = 0; got < len;) {
            ssize_t r = pread(fd, to + got, len - got, (off_t)(base + from + got));
            if (r > 0) {
                got += (size_t)r;
                continue;
            }
            if (r < 0 && errno == EINTR)
                continue;
            const int e = r == 0 ? TARTAN_ETRUNC : errno;
#pragma omp critical(tool_sample_error)
            if (!rc)
                rc = tool_fail(err, errlen, e, "%s: reading the sample: %s", c->emb_path,
                               r == 0 ? "file shrank" : strerror(e));
            break;
        }
    }
    free(src);
    if (fd >= 0)
        close(fd);
    release_all(c);
    free(pick);
    if (rc) {
        free(buf);
        free(lens);
        return rc;
    }
    s->n = n;
    s->tokens = tokens;
    s->lens = lens;
    s->emb = buf;
    return 0;
}

int tool_sample_train(tartan_db *db, const tool_sample *s, const tool_corpus *c,
                      size_t corpus_tokens, char *err, size_t errlen)
{
    tartan_batch b = {0};
    b.n_docs = s->n;
    b.ids = NULL;
    b.doclens = s->lens;
    b.embeddings = s->emb;
    b.n_rows = s->tokens;
    b.dim = c->dim;
    b.dtype = c->dtype;
    /* The library reports nothing while it trains (it never prints); the tool says which
     * phase it is in, between calls, on a terminal, like its progress bar. */
    int tty = isatty(STDERR_FILENO);
    double t0 = tool_now();
    if (tty)
        fprintf(stderr, "training on %zu sampled documents (%zu tokens): k-means, codec...", s->n,
                s->tokens);
    int rc = tartan_train(db, &b, corpus_tokens);
    if (tty)
        fprintf(stderr, rc ? " failed\n" : " took %.1f s\n", tool_now() - t0);
    if (rc)
        tool_fail(err, errlen, rc, "training on %zu sampled documents: %s", s->n,
                  errdetail(db, rc));
    return rc;
}

int tool_corpus_train(tartan_db *db, tool_corpus *c, uint64_t seed, char *err, size_t errlen)
{
    tool_sample s;
    const double t0 = tool_now();
    int rc = tool_corpus_sample(c, tartan_sample_docs(db, c->n_docs), seed, NULL, &s, err, errlen);
    if (rc)
        return rc;
    if (tool_trace())
        fprintf(stderr, "training: %zu documents (%zu tokens) sampled from the file in %.3f s\n",
                s.n, s.tokens, tool_now() - t0);
    rc = tool_sample_train(db, &s, c, c->n_rows, err, errlen);
    tool_sample_free(&s);
    return rc;
}

size_t tool_batch_tokens(tartan_device dev)
{
    tartan_device where = TARTAN_DEVICE_CPU;
    return tartan_device_resolve(dev, &where) == 0 && where == TARTAN_DEVICE_CUDA
               ? TOOL_BATCH_TOKENS_GPU
               : TOOL_BATCH_TOKENS;
}

/* Documents a batch when the caller names no size: about c->batch_tokens tokens (the CPU's
 * TOOL_BATCH_TOKENS when 0) of documents averaging rows / docs tokens. Every batch rewrites the
 * last page of most inverted lists, so small batches multiply the bytes written; large ones
 * cost memory (about 1 KiB a token at dim 128 while a batch is encoded): ingest.h. */
static size_t default_batch(const tool_corpus *c, size_t docs, size_t rows)
{
    size_t avg = docs ? rows / docs : 1;
    size_t n = (c->batch_tokens ? c->batch_tokens : TOOL_BATCH_TOKENS) / (avg ? avg : 1);
    return n ? n : 1;
}

int tool_corpus_ingest(tartan_db *db, tool_corpus *c, size_t batch_docs, unsigned flags,
                       size_t *added, char *err, size_t errlen)
{
    *added = 0;
    if (batch_docs == 0)
        batch_docs = default_batch(c, c->n_docs, c->n_rows);
    size_t *lens = malloc(batch_docs * sizeof *lens);
    const char **ids = malloc(batch_docs * sizeof *ids);
    char *names = malloc(batch_docs * 21); /* row numbers as text: up to 20 digits */
    if (!lens || !ids || !names) {
        free(lens);
        free(ids);
        free(names);
        return tool_fail(err, errlen, ENOMEM, "out of memory for a batch of %zu", batch_docs);
    }
    tool_progress p;
    tool_progress_start(&p, "docs", c->n_docs);
    int rc = 0;
    size_t row = 0;
    for (size_t d0 = 0; d0 < c->n_docs; d0 += batch_docs) {
        size_t n = c->n_docs - d0 < batch_docs ? c->n_docs - d0 : batch_docs;
        size_t rows = 0;
        for (size_t i = 0; i < n; i++) {
            lens[i] = tool_corpus_doclen(c, d0 + i);
            rows += lens[i];
            if (c->have_ids) {
                ids[i] = c->ids.ids[d0 + i];
            } else {
                snprintf(names + 21 * i, 21, "%zu", d0 + i);
                ids[i] = names + 21 * i;
            }
        }
        tartan_batch b = {0};
        b.n_docs = n;
        b.ids = ids;
        b.doclens = lens;
        b.embeddings = (const char *)c->emb.data + row * c->row_bytes;
        b.n_rows = rows;
        b.dim = c->dim;
        b.dtype = c->dtype;
        rc = tartan_add(db, &b, flags);
        if (rc) {
            tool_fail(err, errlen, rc, "batch of documents %zu..%zu (rows %zu..%zu): %s", d0,
                      d0 + n - 1, row, row + rows - 1, errdetail(db, rc));
            break;
        }
        row += rows;
        *added += n;
        release_upto(c, row * c->row_bytes);
        tool_progress_update(&p, *added);
    }
    tool_progress_end(&p, *added);
    free(lens);
    free(ids);
    free(names);
    return rc;
}

int tool_corpus_ingest_some(tartan_db *db, tool_corpus *c, const uint8_t *keep, size_t batch_docs,
                            unsigned flags, size_t *added, char *err, size_t errlen)
{
    if (!keep)
        return tool_corpus_ingest(db, c, batch_docs, flags, added, err, errlen);
    *added = 0;
    size_t n_keep = 0, keep_rows = 0;
    for (size_t i = 0; i < c->n_docs; i++)
        if (keep[i]) {
            n_keep++;
            keep_rows += tool_corpus_doclen(c, i);
        }
    if (batch_docs == 0)
        batch_docs = default_batch(c, n_keep, keep_rows);
    if (batch_docs > n_keep)
        batch_docs = n_keep ? n_keep : 1;
    size_t *lens = malloc(batch_docs * sizeof *lens);
    const char **ids = malloc(batch_docs * sizeof *ids);
    char *names = malloc(batch_docs * 21);
    char *buf = NULL;
    size_t cap = 0;
    if (!lens || !ids || !names) {
        free(lens);
        free(ids);
        free(names);
        return tool_fail(err, errlen, ENOMEM, "out of memory for a batch of %zu", batch_docs);
    }
    tool_progress p;
    tool_progress_start(&p, "docs", n_keep);
    int rc = 0;
    size_t row = 0, i = 0;
    while (i < c->n_docs && !rc) {
        /* The next batch_docs kept documents, copied out of the mapping. */
        size_t n = 0, rows = 0, first = i, last = i;
        for (; i < c->n_docs && n < batch_docs; i++) {
            size_t l = tool_corpus_doclen(c, i);
            if (keep[i]) {
                size_t need = (rows + l) * c->row_bytes;
                if (need > cap) {
                    size_t nc = cap ? cap : ((size_t)1 << 20);
                    while (nc < need)
                        nc *= 2;
                    char *nb = realloc(buf, nc);
                    if (!nb) {
                        rc = tool_fail(err, errlen, ENOMEM, "out of memory for a batch of %zu rows",
                                       rows + l);
                        break;
                    }
                    buf = nb;
                    cap = nc;
                }
                memcpy(buf + rows * c->row_bytes, (const char *)c->emb.data + row * c->row_bytes,
                       l * c->row_bytes);
                lens[n] = l;
                ids[n] = tool_corpus_id(c, i, names + 21 * n);
                rows += l;
                last = i;
                n++;
            }
            row += l;
        }
        if (rc || n == 0)
            break;
        tartan_batch b = {0};
        b.n_docs = n;
        b.ids = ids;
        b.doclens = lens;
        b.embeddings = buf;
        b.n_rows = rows;
        b.dim = c->dim;
        b.dtype = c->dtype;
        rc = tartan_add(db, &b, flags);
        if (rc) {
            tool_fail(err, errlen, rc, "batch of %zu documents (of documents %zu..%zu): %s", n,
                      first, last, errdetail(db, rc));
            break;
        }
        *added += n;
        release_upto(c, row * c->row_bytes);
        tool_progress_update(&p, *added);
    }
    tool_progress_end(&p, *added);
    free(buf);
    free(lens);
    free(ids);
    free(names);
    return rc;
}

int tool_model_import_file(tartan_db *db, const char *path, char *err, size_t errlen)
{
    char *buf;
    size_t len;
    int rc = tool_file_read(path, &buf, &len, err, errlen);
    if (rc)
        return rc;
    if ((rc = tartan_model_import(db, buf, len)))
        tool_fail(err, errlen, rc, "%s: %s", path, errdetail(db, rc));
    free(buf);
    return rc;
}
