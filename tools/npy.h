/*
 * npy.h: NumPy .npy files, read (memory-mapped when large) and written (streamed in row
 * batches). The tool, tests and benchmarks read embeddings, lengths and codes through this.
 *
 * Format (NumPy's NEP 1): the magic "\x93NUMPY", a major and a minor version byte, the
 * header length (2 bytes little-endian in v1, 4 bytes in v2 and v3), then a Python dict
 * literal such as {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } padded with
 * spaces and a final newline, then the data. v3 differs from v2 only in allowing UTF-8 in
 * the header, which these dtypes never need.
 *
 * Supported: little-endian float32 (<f4), float16 (<f2), int32 (<i4), int64 (<i8), uint8
 * (|u1), and bfloat16 stored as uint16 (<u2), which is what code that cannot name bfloat16 in
 * NumPy writes (arr.view(np.uint16)); C order (or any order for rank 0 and 1), any rank up
 * to TOOL_NPY_MAX_RANK.
 *
 * Errors: every function returns 0, a negative TARTAN_E... code or a positive errno value,
 * and writes a message naming the file and the problem into err (errlen bytes, may be 0).
 */
#ifndef TARTAN_TOOLS_NPY_H
#define TARTAN_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>

typedef enum tool_dtype {
    TOOL_DTYPE_NONE = 0,
    TOOL_F32 = 1,
    TOOL_F16 = 2,
    TOOL_BF16 = 3,
    TOOL_I32 = 4,
    TOOL_I64 = 5,
    TOOL_U8 = 6,
} tool_dtype;

/* A set of accepted dtypes for tool_npy_open: TOOL_DT(TOOL_I32) | TOOL_DT(TOOL_I64). */
#define TOOL_DT(t) (1u << (t))
#define TOOL_DT_FLOATS (TOOL_DT(TOOL_F32) | TOOL_DT(TOOL_F16) | TOOL_DT(TOOL_BF16))
#define TOOL_DT_INTS (TOOL_DT(TOOL_I32) | TOOL_DT(TOOL_I64))

/* NumPy 2's own limit on the number of dimensions. */
#define TOOL_NPY_MAX_RANK 64

/* Bytes per element (0 for TOOL_DTYPE_NONE). */
size_t tool_dtype_size(tool_dtype t);
/* "float32", "bfloat16", ... ("none" for anything else). Static. */
const char *tool_dtype_name(tool_dtype t);

/* An open array. All fields are read-only for the caller. */
typedef struct tool_npy {
    tool_dtype dtype;
    int rank;
    size_t shape[TOOL_NPY_MAX_RANK];
    size_t count;     /* elements: the product of shape (1 for rank 0) */
    size_t nbytes;    /* count * tool_dtype_size(dtype) */
    const void *data; /* nbytes bytes, aligned to the element size; never NULL when open */
    int mapped;       /* 1 when data points into a read-only mapping of the file */
    void *np_base;    /* the mapping or heap block that holds data */
    size_t np_len;
} tool_npy;

/*
 * tool_npy_open: reads the header of path and makes its data available.
 *   a: out; on failure it is left closed (tool_npy_close on it is harmless).
 *   dtypes: accepted dtypes (TOOL_DT bits); 0 accepts every supported one except bfloat16,
 *     because <u2 is read as bfloat16 only where the caller says it expects bfloat16.
 *   min_rank, max_rank: accepted number of dimensions (0 .. TOOL_NPY_MAX_RANK).
 * Files whose data is at least TOOL_NPY_MAP_MIN bytes are memory-mapped read-only; smaller
 * ones are read into memory. A mapped file must not be truncated while it is open.
 * Errors: TARTAN_EFORMAT (not .npy, malformed header, Fortran order, trailing bytes),
 * TARTAN_ETRUNC (file shorter than its header says), TARTAN_EDTYPE (unsupported, big-endian
 * or unexpected dtype), TARTAN_EDIM (unexpected rank), TARTAN_ETOOBIG (shape whose byte count
 * overflows), TARTAN_EINVAL (bad arguments), errno (open, read, mmap, ENOMEM).
 */
int tool_npy_open(tool_npy *a, const char *path, unsigned dtypes, int min_rank, int max_rank,
                  char *err, size_t errlen);

/* Data of at least this many bytes is memory-mapped rather than read. */
#define TOOL_NPY_MAP_MIN ((size_t)1 << 20)

/* tool_npy_int: element i (flat, C order; i < count) of an int32, int64 or uint8 array, as
 * int64: doclens and lengths come in either width. 0 for other dtypes. */
int64_t tool_npy_int(const tool_npy *a, size_t i);

/* tool_npy_close: unmaps or frees. Accepts a zeroed or already closed array. */
void tool_npy_close(tool_npy *a);

/*
 * tool_npy_parse: parses an in-memory .npy prefix (magic, version, header).
 *   buf, len: the bytes; name: the file name used in messages.
 *   a: out; dtype, rank, shape, count and nbytes are filled; data is not.
 *   data_off: out, where the data starts.
 * Checks the same things as tool_npy_open except the file's length. Never reads past len.
 */
int tool_npy_parse(const void *buf, size_t len, const char *name, unsigned dtypes, int min_rank,
                   int max_rank, tool_npy *a, size_t *data_off, char *err, size_t errlen);

/* Header lengths above this are refused before anything is allocated: a header for 64
 * dimensions of 20 digits each needs under 2 KiB; NumPy itself refuses more than 10,000
 * bytes unless told otherwise. */
#define TOOL_NPY_MAX_HEADER ((size_t)1 << 16)

/* ---- writing ---------------------------------------------------------------------------- */

typedef struct tool_npy_writer tool_npy_writer;

/* Pass as shape[0] when the number of rows is known only at the end. */
#define TOOL_NPY_ROWS_UNKNOWN SIZE_MAX

/*
 * tool_npy_writer_open: starts writing path. The data goes into a temporary file beside
 * path that tool_npy_writer_close renames into place, so that a failed or abandoned write
 * never leaves a file that looks complete.
 *   dtype, rank, shape: the array; a row is one index along axis 0 (for rank 0 the one
 *     element). shape[0] may be TOOL_NPY_ROWS_UNKNOWN (rank >= 1): the header is then
 *     rewritten with the count at close.
 *   out: the writer, owned by the caller until close or abort.
 * Errors: TARTAN_EINVAL (bad dtype, rank or shape), TARTAN_ETOOBIG (overflowing shape), errno.
 */
int tool_npy_writer_open(tool_npy_writer **out, const char *path, tool_dtype dtype, int rank,
                         const size_t *shape, char *err, size_t errlen);

/* tool_npy_writer_rows: appends nrows rows (nrows * row size bytes from rows). More rows than
 * shape[0] is TARTAN_EINVAL. After any failure the writer only accepts close or abort. */
int tool_npy_writer_rows(tool_npy_writer *w, const void *rows, size_t nrows, char *err,
                         size_t errlen);

/* tool_npy_writer_close: checks the row count (TARTAN_EINVAL if fewer rows than shape[0]),
 * finishes the header, renames the file into place and frees w, whatever the outcome; on
 * failure nothing is left at path that was not there before. NULL is accepted. */
int tool_npy_writer_close(tool_npy_writer *w, char *err, size_t errlen);

/* tool_npy_writer_abort: removes the temporary file and frees w. NULL is accepted. */
void tool_npy_writer_abort(tool_npy_writer *w);

/* tool_npy_save: writes a whole array in one call (open, rows, close). */
int tool_npy_save(const char *path, tool_dtype dtype, int rank, const size_t *shape,
                  const void *data, char *err, size_t errlen);

#endif
