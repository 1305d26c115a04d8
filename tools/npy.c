/*
 * npy.c: reading NumPy .npy files (see npy.h for the format and the contract).
 *
 * The header is untrusted input: every length is bounded before anything is allocated, the
 * parser never looks past the bytes it was given, and the shape's byte count is checked for
 * overflow and against the file's size before any data is touched.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "npy.h"
#include "tartan.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .npy reader hands out little-endian data as is; a big-endian host needs swapping"
#endif

static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

size_t tool_dtype_size(tool_dtype t)
{
    switch (t) {
    case TOOL_F32:
    case TOOL_I32:
        return 4;
    case TOOL_F16:
    case TOOL_BF16:
        return 2;
    case TOOL_I64:
        return 8;
    case TOOL_U8:
        return 1;
    default:
        return 0;
    }
}

const char *tool_dtype_name(tool_dtype t)
{
    switch (t) {
    case TOOL_F32:
        return "float32";
    case TOOL_F16:
        return "float16";
    case TOOL_BF16:
        return "bfloat16";
    case TOOL_I32:
        return "int32";
    case TOOL_I64:
        return "int64";
    case TOOL_U8:
        return "uint8";
    default:
        return "none";
    }
}

/* ---- the header's dict literal --------------------------------------------------------- */

typedef struct cursor {
    const char *p, *begin, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int eat(cursor *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A Python string literal without escapes (all that NumPy writes for these keys). */
static int parse_string(cursor *c, const char **s, size_t *n)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return 0;
    char q = *c->p++;
    const char *start = c->p;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || *c->p == '\n')
            return 0;
        c->p++;
    }
    if (c->p >= c->end)
        return 0;
    *s = start;
    *n = (size_t)(c->p - start);
    c->p++;
    return 1;
}

static int parse_word(cursor *c, const char *w)
{
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && !memcmp(c->p, w, n)) {
        c->p += n;
        return 1;
    }
    return 0;
}

static int key_is(const char *s, size_t n, const char *key)
{
    return n == strlen(key) && !memcmp(s, key, n);
}

/* Maps a descr string to a dtype. Returns 0 and sets *t, or TARTAN_EDTYPE with a reason. */
static int descr_dtype(const char *d, size_t n, unsigned dtypes, tool_dtype *t, const char *name,
                       char *err, size_t errlen)
{
    static const struct {
        const char *descr;
        tool_dtype t;
    } known[] = {
        {"<f4", TOOL_F32}, {"<f2", TOOL_F16}, {"<i4", TOOL_I32}, {"<i8", TOOL_I64},
        {"|u1", TOOL_U8},  {"<u1", TOOL_U8},  {"=f4", TOOL_F32}, {"=f2", TOOL_F16},
        {"=i4", TOOL_I32}, {"=i8", TOOL_I64}, {"=u1", TOOL_U8},  {"|i1", TOOL_DTYPE_NONE},
    };
    *t = TOOL_DTYPE_NONE;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (key_is(d, n, known[i].descr))
            *t = known[i].t;
    /* uint16 is a bfloat16 only where the caller expects one: otherwise it is an integer
     * type tartan has no use for. */
    if ((key_is(d, n, "<u2") || key_is(d, n, "=u2")) && (dtypes & TOOL_DT(TOOL_BF16)))
        *t = TOOL_BF16;
    if (*t != TOOL_DTYPE_NONE)
        return 0;
    if (n >= 2 && d[0] == '>' && d[1] != '1')
        return tool_fail(err, errlen, TARTAN_EDTYPE,
                         "%s: big-endian data ('%.*s') is not supported; save it with "
                         "arr.astype(arr.dtype.newbyteorder('<'))",
                         name, (int)n, d);
    return tool_fail(err, errlen, TARTAN_EDTYPE,
                     "%s: data type '%.*s' is not supported (float32 <f4, float16 <f2, "
                     "bfloat16 as <u2, int32 <i4, int64 <i8, uint8 |u1)",
                     name, (int)(n > 32 ? 32 : n), d);
}

static int malformed(const char *name, const cursor *c, const char *what, char *err, size_t errlen)
{
    return tool_fail(err, errlen, TARTAN_EFORMAT, "%s: malformed header: %s (at header byte %zu)",
                     name, what, (size_t)(c->p - c->begin));
}

/* (d0, d1, ...): non-negative integers, an optional trailing comma, Python 2's 'L' suffix. */
static int parse_shape(cursor *c, tool_npy *a, const char *name, char *err, size_t errlen)
{
    if (!eat(c, '('))
        return malformed(name, c, "shape is not a tuple", err, errlen);
    a->rank = 0;
    for (;;) {
        if (eat(c, ')'))
            return 0;
        skip_ws(c);
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return malformed(name, c, "shape holds something other than a non-negative integer",
                             err, errlen);
        size_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            unsigned dgt = (unsigned)(*c->p - '0');
            if (v > (SIZE_MAX - dgt) / 10)
                return tool_fail(err, errlen, TARTAN_ETOOBIG,
                                 "%s: dimension %d of the shape is too large", name, a->rank);
            v = v * 10 + dgt;
            c->p++;
        }
        if (c->p < c->end && *c->p == 'L')
            c->p++;
        if (a->rank == TOOL_NPY_MAX_RANK)
            return tool_fail(err, errlen, TARTAN_EDIM, "%s: more than %d dimensions", name,
                             TOOL_NPY_MAX_RANK);
        a->shape[a->rank++] = v;
        if (eat(c, ','))
            continue;
        if (eat(c, ')'))
            return 0;
        return malformed(name, c, "expected ',' or ')' in the shape", err, errlen);
    }
}

static void shape_text(const tool_npy *a, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "(");
    for (int i = 0; i < a->rank && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%zu", i ? ", " : "", a->shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, a->rank == 1 ? ",)" : ")");
}

static void rank_range_text(int min_rank, int max_rank, char *buf, size_t len)
{
    if (min_rank == max_rank)
        snprintf(buf, len, "%d dimension%s", min_rank, min_rank == 1 ? "" : "s");
    else
        snprintf(buf, len, "%d to %d dimensions", min_rank, max_rank);
}

static void dtypes_text(unsigned dtypes, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int t = TOOL_F32; t <= TOOL_U8 && o < len; t++)
        if (dtypes & TOOL_DT(t))
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? " or " : "",
                                  tool_dtype_name((tool_dtype)t));
}

/* Reads the fixed prefix: version and header length. Returns the header's start offset. */
static int parse_prefix(const unsigned char *b, size_t len, const char *name, size_t *hstart,
                        size_t *hlen, char *err, size_t errlen)
{
    size_t m = len < sizeof magic ? len : sizeof magic;
    if (memcmp(b, magic, m))
        return tool_fail(err, errlen, TARTAN_EFORMAT,
                         "%s: not a .npy file (no \\x93NUMPY magic at the start)", name);
    if (len < 8)
        return tool_fail(err, errlen, TARTAN_ETRUNC, "%s: truncated in the .npy preamble", name);
    unsigned major = b[6], minor = b[7];
    if (major < 1 || major > 3 || minor != 0)
        return tool_fail(err, errlen, TARTAN_EFORMAT,
                         "%s: .npy format version %u.%u is not supported (1.0, 2.0, 3.0)", name,
                         major, minor);
    size_t lenbytes = major == 1 ? 2 : 4;
    if (len < 8 + lenbytes)
        return tool_fail(err, errlen, TARTAN_ETRUNC, "%s: truncated in the .npy preamble", name);
    size_t h = (size_t)b[8] | (size_t)b[9] << 8;
    if (lenbytes == 4)
        h |= (size_t)b[10] << 16 | (size_t)b[11] << 24;
    *hstart = 8 + lenbytes;
    *hlen = h;
    if (h > TOOL_NPY_MAX_HEADER)
        return tool_fail(err, errlen, TARTAN_EFORMAT,
                         "%s: header of %zu bytes is longer than the %zu bytes allowed", name, h,
                         TOOL_NPY_MAX_HEADER);
    return 0;
}

int tool_npy_parse(const void *buf, size_t len, const char *name, unsigned dtypes, int min_rank,
                   int max_rank, tool_npy *a, size_t *data_off, char *err, size_t errlen)
{
    const unsigned char *b = buf;
    size_t hstart, hlen;
    if (!name)
        name = "(buffer)";
    if (!b || !a || !data_off || min_rank < 0 || max_rank > TOOL_NPY_MAX_RANK ||
        min_rank > max_rank)
        return tool_fail(err, errlen, TARTAN_EINVAL, "%s: invalid arguments to the reader", name);
    memset(a, 0, sizeof *a);
    int rc = parse_prefix(b, len, name, &hstart, &hlen, err, errlen);
    if (rc)
        return rc;
    if (len - hstart < hlen)
        return tool_fail(err, errlen, TARTAN_ETRUNC,
                         "%s: truncated: the header needs %zu bytes, the file has %zu", name,
                         hstart + hlen, len);

    cursor c = {(const char *)b + hstart, (const char *)b + hstart,
                (const char *)b + hstart + hlen};
    const char *descr = NULL;
    size_t descr_n = 0;
    int fortran = -1, have_shape = 0;
    if (!eat(&c, '{'))
        return malformed(name, &c, "no '{'", err, errlen);
    for (;;) {
        if (eat(&c, '}'))
            break;
        const char *k;
        size_t kn;
        if (!parse_string(&c, &k, &kn))
            return malformed(name, &c, "expected a quoted key", err, errlen);
        if (!eat(&c, ':'))
            return malformed(name, &c, "expected ':' after a key", err, errlen);
        if (key_is(k, kn, "descr") && !descr) {
            skip_ws(&c);
            if (c.p < c.end && *c.p == '[')
                return tool_fail(err, errlen, TARTAN_EDTYPE,
                                 "%s: structured (record) data types are not supported", name);
            if (!parse_string(&c, &descr, &descr_n))
                return malformed(name, &c, "descr is not a string", err, errlen);
        } else if (key_is(k, kn, "fortran_order") && fortran < 0) {
            if (parse_word(&c, "True"))
                fortran = 1;
            else if (parse_word(&c, "False"))
                fortran = 0;
            else
                return malformed(name, &c, "fortran_order is neither True nor False", err, errlen);
        } else if (key_is(k, kn, "shape") && !have_shape) {
            rc = parse_shape(&c, a, name, err, errlen);
            if (rc)
                return rc;
            have_shape = 1;
        } else {
            return malformed(name, &c, "unknown or repeated key", err, errlen);
        }
        if (eat(&c, ','))
            continue;
        if (eat(&c, '}'))
            break;
        return malformed(name, &c, "expected ',' or '}'", err, errlen);
    }
    skip_ws(&c);
    while (c.p < c.end && *c.p == '\0') /* some writers pad with NULs */
        c.p++;
    if (c.p != c.end)
        return malformed(name, &c, "text after the closing '}'", err, errlen);
    if (!descr || fortran < 0 || !have_shape)
        return malformed(name, &c, "descr, fortran_order or shape is missing", err, errlen);

    /* Order matters for a rank-2-or-more array only: a vector is the same either way. */
    if (fortran == 1 && a->rank > 1)
        return tool_fail(err, errlen, TARTAN_EFORMAT,
                         "%s: Fortran order is not supported; save np.ascontiguousarray(arr)",
                         name);
    rc = descr_dtype(descr, descr_n, dtypes, &a->dtype, name, err, errlen);
    if (rc)
        return rc;
    unsigned accepted = dtypes ? dtypes
                               : (TOOL_DT(TOOL_F32) | TOOL_DT(TOOL_F16) | TOOL_DT(TOOL_I32) |
                                  TOOL_DT(TOOL_I64) | TOOL_DT(TOOL_U8));
    if (!(accepted & TOOL_DT(a->dtype))) {
        char want[96];
        dtypes_text(accepted, want, sizeof want);
        return tool_fail(err, errlen, TARTAN_EDTYPE, "%s: data type is %s, expected %s", name,
                         tool_dtype_name(a->dtype), want);
    }
    char st[160];
    shape_text(a, st, sizeof st);
    if (a->rank < min_rank || a->rank > max_rank) {
        char want[48];
        rank_range_text(min_rank, max_rank, want, sizeof want);
        return tool_fail(err, errlen, TARTAN_EDIM, "%s: expected %s, found shape %s", name, want,
                         st);
    }
    /* An empty dimension makes the array empty whatever the others say; otherwise the
     * product must not overflow. */
    size_t count = 1, isz = tool_dtype_size(a->dtype);
    int overflow = 0;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] == 0)
            count = 0;
    for (int i = 0; i < a->rank && count; i++) {
        if (count > SIZE_MAX / a->shape[i]) {
            overflow = 1;
            break;
        }
        count *= a->shape[i];
    }
    if (overflow || count > (SIZE_MAX - hstart - hlen) / isz)
        return tool_fail(err, errlen, TARTAN_ETOOBIG, "%s: shape %s of %s is too large", name, st,
                         tool_dtype_name(a->dtype));
    a->count = count;
    a->nbytes = count * isz;
    *data_off = hstart + hlen;
    return 0;
}

/* ---- files ------------------------------------------------------------------------------ */

/* Reads exactly n bytes at off. Returns 0, an errno value, or -1 at end of file. */
static int read_at(int fd, void *buf, size_t n, size_t off)
{
    char *p = buf;
    while (n) {
        size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (r == 0)
            return -1;
        p += r;
        off += (size_t)r;
        n -= (size_t)r;
    }
    return 0;
}

int64_t tool_npy_int(const tool_npy *a, size_t i)
{
    switch (a->dtype) {
    case TOOL_I32: {
        int32_t v;
        memcpy(&v, (const char *)a->data + 4 * i, 4);
        return v;
    }
    case TOOL_I64: {
        int64_t v;
        memcpy(&v, (const char *)a->data + 8 * i, 8);
        return v;
    }
    case TOOL_U8:
        return ((const uint8_t *)a->data)[i];
    default:
        return 0;
    }
}

/* Keeps data pointers of empty arrays non-NULL without allocating. */
static const int64_t empty_data[1];

void tool_npy_close(tool_npy *a)
{
    if (!a)
        return;
    if (a->np_base) {
        if (a->mapped)
            munmap(a->np_base, a->np_len);
        else
            free(a->np_base);
    }
    memset(a, 0, sizeof *a);
}

int tool_npy_open(tool_npy *a, const char *path, unsigned dtypes, int min_rank, int max_rank,
                  char *err, size_t errlen)
{
    if (!a || !path)
        return tool_fail(err, errlen, TARTAN_EINVAL, "npy: no array or path given");
    memset(a, 0, sizeof *a);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tool_fail(err, errlen, errno, "%s: %s", path, strerror(errno));
    unsigned char *hdr = NULL;
    int rc;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = tool_fail(err, errlen, errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = tool_fail(err, errlen, TARTAN_EFORMAT, "%s: not a regular file", path);
        goto fail;
    }
    size_t fsize = (size_t)st.st_size;

    /* The preamble first, to learn (and bound) the header's length before reading it. */
    unsigned char pre[12];
    size_t npre = fsize < sizeof pre ? fsize : sizeof pre;
    rc = read_at(fd, pre, npre, 0);
    if (rc) {
        rc = rc < 0 ? tool_fail(err, errlen, TARTAN_ETRUNC, "%s: file shrank while read", path)
                    : tool_fail(err, errlen, rc, "%s: %s", path, strerror(rc));
        goto fail;
    }
    size_t hstart, hlen, off;
    rc = parse_prefix(pre, npre, path, &hstart, &hlen, err, errlen);
    if (rc)
        goto fail;
    size_t hread = fsize - hstart < hlen ? fsize : hstart + hlen;
    hdr = malloc(hread ? hread : 1);
    if (!hdr) {
        rc = tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    rc = read_at(fd, hdr, hread, 0);
    if (rc) {
        rc = rc < 0 ? tool_fail(err, errlen, TARTAN_ETRUNC, "%s: file shrank while read", path)
                    : tool_fail(err, errlen, rc, "%s: %s", path, strerror(rc));
        goto fail;
    }
    rc = tool_npy_parse(hdr, hread, path, dtypes, min_rank, max_rank, a, &off, err, errlen);
    if (rc)
        goto fail;
    free(hdr);
    hdr = NULL;

    if (fsize - off < a->nbytes) {
        char s[160];
        shape_text(a, s, sizeof s);
        rc = tool_fail(err, errlen, TARTAN_ETRUNC,
                       "%s: truncated: shape %s of %s needs %zu data bytes, the file has %zu", path,
                       s, tool_dtype_name(a->dtype), a->nbytes, fsize - off);
        goto fail;
    }
    if (fsize - off > a->nbytes) {
        rc = tool_fail(err, errlen, TARTAN_EFORMAT,
                       "%s: %zu bytes after the data that the header describes", path,
                       fsize - off - a->nbytes);
        goto fail;
    }
    size_t isz = tool_dtype_size(a->dtype);
    if (a->nbytes == 0) {
        a->data = empty_data;
    } else if (a->nbytes >= TOOL_NPY_MAP_MIN && off % isz == 0) {
        /* Read-only and private: nothing the caller does can reach the file. */
        void *m = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            a->np_base = m;
            a->np_len = fsize;
            a->mapped = 1;
            a->data = (const char *)m + off;
        }
        /* A file system that cannot map falls through to reading. */
    }
    if (!a->data) {
        /* Its own block, so that the data is aligned whatever the header's length. */
        a->np_base = malloc(a->nbytes);
        if (!a->np_base) {
            rc = tool_fail(err, errlen, ENOMEM, "%s: out of memory for %zu bytes", path, a->nbytes);
            goto fail;
        }
        a->np_len = a->nbytes;
        rc = read_at(fd, a->np_base, a->nbytes, off);
        if (rc) {
            rc = rc < 0 ? tool_fail(err, errlen, TARTAN_ETRUNC, "%s: file shrank while read", path)
                        : tool_fail(err, errlen, rc, "%s: %s", path, strerror(rc));
            goto fail;
        }
        a->data = a->np_base;
    }
    close(fd);
    return 0;
fail:
    free(hdr);
    close(fd);
    tool_npy_close(a);
    return rc;
}
