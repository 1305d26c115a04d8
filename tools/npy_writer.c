/*
 * npy_writer.c: writing .npy files in row batches (see npy.h).
 *
 * The header is byte for byte what NumPy's np.save writes for the same array (v1, dict keys
 * in this order, padded with spaces to a multiple of 64 bytes with a final newline), so that
 * files compare equal and NumPy maps them aligned. When the row count is not known up front,
 * the header is sized for a 20-digit count and rewritten at close; NumPy accepts the extra
 * padding.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "npy.h"
#include "tartan.h"

/* NumPy aligns the data to 64 bytes, enough for any SIMD load of the first row. */
#define HEADER_ALIGN 64

struct tool_npy_writer {
    int fd;
    char *path, *tmp;
    tool_dtype dtype;
    int rank;
    size_t shape[TOOL_NPY_MAX_RANK];
    int rows_unknown;
    size_t row_bytes;
    size_t rows_written;
    size_t header_len; /* preamble + dict + padding */
    int failed;
};

static const char *descr_of(tool_dtype t)
{
    switch (t) {
    case TOOL_F32:
        return "<f4";
    case TOOL_F16:
        return "<f2";
    case TOOL_BF16:
        return "<u2"; /* NumPy has no bfloat16; readers view it back */
    case TOOL_I32:
        return "<i4";
    case TOOL_I64:
        return "<i8";
    case TOOL_U8:
        return "|u1";
    default:
        return NULL;
    }
}

/*
 * Formats the whole header (preamble included) into buf. first_dim_width > 0 pads the
 * dict as if shape[0] had that many digits (room for a later rewrite); total > 0 forces the
 * header to exactly that length. Returns the length, or 0 if it does not fit.
 */
static size_t format_header(const tool_npy_writer *w, size_t rows, size_t first_dim_width,
                            size_t total, char *buf, size_t cap)
{
    char dict[TOOL_NPY_MAX_RANK * 24 + 96];
    size_t o = 0;
    o += (size_t)snprintf(dict + o, sizeof dict - o,
                          "{'descr': '%s', 'fortran_order': False, 'shape': (", descr_of(w->dtype));
    for (int i = 0; i < w->rank; i++)
        o += (size_t)snprintf(dict + o, sizeof dict - o, "%s%zu", i ? ", " : "",
                              i == 0 ? rows : w->shape[i]);
    o += (size_t)snprintf(dict + o, sizeof dict - o, "%s), }", w->rank == 1 ? "," : "");
    size_t reserve = 0;
    if (first_dim_width) {
        char digits[24];
        size_t have = (size_t)snprintf(digits, sizeof digits, "%zu", rows);
        reserve = first_dim_width > have ? first_dim_width - have : 0;
    }
    /* Always version 1.0: even 64 dimensions of 20 digits make a dict under 2 KiB, far
     * below the 65,535 bytes its 2-byte length field can describe. */
    const size_t pre = 10;             /* magic (6), version (2), header length (2) */
    size_t dict_len = o + reserve + 1; /* + the final newline */
    size_t len = total ? total : (pre + dict_len + HEADER_ALIGN - 1) / HEADER_ALIGN * HEADER_ALIGN;
    if (len > cap || len < pre + o + 1 || len - pre > 65535)
        return 0;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = 1;
    buf[7] = 0;
    size_t hl = len - pre;
    buf[8] = (char)(hl & 0xff);
    buf[9] = (char)(hl >> 8 & 0xff);
    memcpy(buf + pre, dict, o);
    memset(buf + pre + o, ' ', len - pre - o - 1);
    buf[len - 1] = '\n';
    return len;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t r = write(fd, p, chunk);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void writer_free(tool_npy_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    if (w->tmp)
        unlink(w->tmp);
    free(w->tmp);
    free(w->path);
    free(w);
}

int tool_npy_writer_open(tool_npy_writer **out, const char *path, tool_dtype dtype, int rank,
                         const size_t *shape, char *err, size_t errlen)
{
    if (!out || !path)
        return tool_fail(err, errlen, TARTAN_EINVAL, "npy: no writer or path given");
    *out = NULL;
    if (!descr_of(dtype))
        return tool_fail(err, errlen, TARTAN_EINVAL, "%s: cannot write data type %d", path,
                         (int)dtype);
    if (rank < 0 || rank > TOOL_NPY_MAX_RANK || (rank > 0 && !shape))
        return tool_fail(err, errlen, TARTAN_EINVAL, "%s: cannot write %d dimensions", path, rank);
    tool_npy_writer *w = calloc(1, sizeof *w);
    if (!w)
        return tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
    w->fd = -1;
    w->dtype = dtype;
    w->rank = rank;
    w->row_bytes = tool_dtype_size(dtype);
    for (int i = 0; i < rank; i++) {
        w->shape[i] = shape[i];
        if (i == 0 && shape[0] == TOOL_NPY_ROWS_UNKNOWN) {
            w->rows_unknown = 1;
            continue;
        }
        if (i == 0)
            continue;
        if (shape[i] && w->row_bytes > SIZE_MAX / 2 / shape[i]) {
            writer_free(w);
            return tool_fail(err, errlen, TARTAN_ETOOBIG, "%s: rows of this shape are too large",
                             path);
        }
        w->row_bytes *= shape[i];
    }
    if (rank > 0 && !w->rows_unknown && w->row_bytes && shape[0] > (SIZE_MAX / 2) / w->row_bytes) {
        writer_free(w);
        return tool_fail(err, errlen, TARTAN_ETOOBIG, "%s: the array is too large", path);
    }
    size_t plen = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(plen + 48);
    if (!w->path || !w->tmp) {
        free(w->tmp);
        w->tmp = NULL;
        writer_free(w);
        return tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
    }
    /* A name of our own beside the target: the rename at close stays on one file system. */
    static unsigned serial;
    for (int attempt = 0; attempt < 100 && w->fd < 0; attempt++) {
        snprintf(w->tmp, plen + 48, "%s.tmp.%ld.%u", path, (long)getpid(),
                 __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED));
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd < 0 && errno != EEXIST)
            break;
    }
    if (w->fd < 0) {
        int e = errno;
        free(w->tmp);
        w->tmp = NULL;
        writer_free(w);
        return tool_fail(err, errlen, e, "%s: cannot create a file beside it: %s", path,
                         strerror(e));
    }
    char hdr[TOOL_NPY_MAX_RANK * 24 + 256];
    size_t rows = w->rows_unknown ? 0 : (rank ? shape[0] : 1);
    w->header_len = format_header(w, rows, w->rows_unknown ? 20 : 0, 0, hdr, sizeof hdr);
    int e = w->header_len ? write_all(w->fd, hdr, w->header_len) : EINVAL;
    if (e) {
        writer_free(w);
        return tool_fail(err, errlen, e, "%s: %s", path, strerror(e));
    }
    *out = w;
    return 0;
}

int tool_npy_writer_rows(tool_npy_writer *w, const void *rows, size_t nrows, char *err,
                         size_t errlen)
{
    if (!w)
        return tool_fail(err, errlen, TARTAN_EINVAL, "npy: no writer");
    if (w->failed)
        return tool_fail(err, errlen, TARTAN_EINVAL, "%s: an earlier write failed", w->path);
    size_t limit = w->rank == 0 ? 1 : w->rows_unknown ? SIZE_MAX : w->shape[0];
    if (nrows > limit - w->rows_written) {
        w->failed = 1;
        return tool_fail(err, errlen, TARTAN_EINVAL,
                         "%s: %zu more rows would exceed the %zu the header declares", w->path,
                         nrows, limit);
    }
    if (nrows && w->row_bytes && nrows > (SIZE_MAX / 2) / w->row_bytes) {
        w->failed = 1;
        return tool_fail(err, errlen, TARTAN_ETOOBIG, "%s: batch too large", w->path);
    }
    if (nrows && w->row_bytes && !rows)
        return tool_fail(err, errlen, TARTAN_EINVAL, "%s: no rows given", w->path);
    int e = write_all(w->fd, rows, nrows * w->row_bytes);
    if (e) {
        w->failed = 1;
        return tool_fail(err, errlen, e, "%s: %s", w->path, strerror(e));
    }
    w->rows_written += nrows;
    return 0;
}

int tool_npy_writer_close(tool_npy_writer *w, char *err, size_t errlen)
{
    if (!w)
        return 0;
    int rc = 0;
    if (w->failed) {
        rc = tool_fail(err, errlen, TARTAN_EINVAL, "%s: not written: an earlier write failed",
                       w->path);
        goto done;
    }
    size_t want = w->rank == 0 ? 1 : w->shape[0];
    if (!w->rows_unknown && w->rows_written != want) {
        rc = tool_fail(err, errlen, TARTAN_EINVAL,
                       "%s: not written: %zu rows written, the header declares %zu", w->path,
                       w->rows_written, want);
        goto done;
    }
    if (w->rows_unknown) {
        char hdr[TOOL_NPY_MAX_RANK * 24 + 256];
        size_t n = format_header(w, w->rows_written, 0, w->header_len, hdr, sizeof hdr);
        ssize_t r = n ? pwrite(w->fd, hdr, n, 0) : -1;
        if (r != (ssize_t)n) {
            int e = r < 0 ? errno : EIO;
            rc = tool_fail(err, errlen, e, "%s: %s", w->path, strerror(e));
            goto done;
        }
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) < 0) {
        int e = errno;
        rc = tool_fail(err, errlen, e, "%s: %s", w->path, strerror(e));
        goto done;
    }
    if (rename(w->tmp, w->path) < 0) {
        int e = errno;
        rc = tool_fail(err, errlen, e, "%s: %s", w->path, strerror(e));
        goto done;
    }
    free(w->tmp);
    w->tmp = NULL;
done:
    writer_free(w);
    return rc;
}

void tool_npy_writer_abort(tool_npy_writer *w)
{
    if (w)
        writer_free(w);
}

int tool_npy_save(const char *path, tool_dtype dtype, int rank, const size_t *shape,
                  const void *data, char *err, size_t errlen)
{
    tool_npy_writer *w;
    int rc = tool_npy_writer_open(&w, path, dtype, rank, shape, err, errlen);
    if (rc)
        return rc;
    if (rank > 0 && shape[0] == TOOL_NPY_ROWS_UNKNOWN) {
        tool_npy_writer_abort(w);
        return tool_fail(err, errlen, TARTAN_EINVAL, "%s: a whole array has a known shape", path);
    }
    rc = tool_npy_writer_rows(w, data, rank ? shape[0] : 1, err, errlen);
    if (rc) {
        tool_npy_writer_abort(w);
        return rc;
    }
    return tool_npy_writer_close(w, err, errlen);
}
