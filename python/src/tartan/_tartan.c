/*
 * _tartan.c: the CPython extension under the `tartan` package. It binds libtartan's public
 * API (engine/tartan.h, nothing else of the library) and the tool's evaluation code
 * (tools/evaluate.c, metrics.c and their readers, compiled into this module: the package is an
 * application of the library, on the tool's layer, so `tartan.evaluate` and `tartan eval` are
 * one implementation).
 *
 * What this file owns, and why it is C rather than Python:
 *   - embeddings go to the engine as the pointer of the caller's buffer (buffer protocol),
 *     never copied when the buffer is C-contiguous; a list of arrays lying one after another
 *     in memory (views of one array) is passed the same way; only scattered pieces are
 *     concatenated, once, with the GIL released;
 *   - every engine call runs with the GIL released, so threads search one index at once;
 *   - results become Python objects here, in one pass, without a Python loop over hits;
 *   - the exception classes come from the header's own error list (TARTAN_ERRNO_MAP), so a
 *     code added to the header gets its class at the next build.
 * The Python layer (tartan/__init__.py) turns torch tensors, bfloat16 arrays and other
 * layouts into C-contiguous NumPy arrays (views where it can) and checks shapes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "evaluate.h"
#include "metrics.h"
#include "qrels.h"
#include "strtab.h"
#include "tartan.h"
#include "trec_run.h"

/* Sizes and counts travel as uint64 NumPy arrays and are read as size_t. */
_Static_assert(sizeof(size_t) == 8, "tartan's Python binding assumes a 64-bit size_t");

/* ---------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------- */

static PyObject *Error;      /* tartan.Error: every failure of the engine */
static PyObject *ErrnoError; /* tartan.ErrnoError(Error, OSError): positive errno codes */

/* One class per engine code, from the header's list. */
typedef struct code_class {
    int code;
    const char *name; /* "EDIM" */
    const char *text; /* "dimension mismatch" */
    PyObject *cls;
} code_class;

static code_class code_classes[] = {
#define XX(name, value, text) {TARTAN_##name, #name, text, NULL},
    TARTAN_ERRNO_MAP(XX)
#undef XX
};
enum { N_CODES = sizeof code_classes / sizeof code_classes[0] };

/* Codes that are about the caller's arguments also derive from ValueError (EDTYPE from
 * TypeError), so that code catching the built-in exceptions keeps working. A code added to
 * the header later derives from Error alone until it is listed here. */
static const char *const value_codes[] = {"EINVAL", "EDIM",   "ENONFINITE", "EEMPTY", "ETOOBIG",
                                          "EDUPID", "EBADID", "ERANGE",     NULL};

static PyObject *class_of(int code)
{
    if (code > 0)
        return ErrnoError;
    for (size_t i = 0; i < N_CODES; i++)
        if (code_classes[i].code == code)
            return code_classes[i].cls;
    return Error;
}

/*
 * Raises the exception of code with message msg (which starts with the code's name, as the
 * engine's messages do). The instance carries code (int), name ("TARTAN_EDIM", "ENOENT") and
 * message; an ErrnoError is also an OSError with errno set. Returns NULL.
 */
static PyObject *raise_code(int code, const char *msg)
{
    PyObject *cls = class_of(code), *exc;
    if (code > 0)
        exc = PyObject_CallFunction(cls, "is", code, msg);
    else
        exc = PyObject_CallFunction(cls, "s", msg);
    if (!exc)
        return NULL;
    const char *name = tartan_err_name(code);
    PyObject *c = PyLong_FromLong(code), *n = name ? PyUnicode_FromString(name) : Py_None;
    PyObject *m = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (name == NULL)
        Py_INCREF(n);
    if (c && n && m && !PyObject_SetAttrString(exc, "code", c) &&
        !PyObject_SetAttrString(exc, "name", n) && !PyObject_SetAttrString(exc, "message", m))
        PyErr_SetObject(cls, exc);
    Py_XDECREF(c);
    Py_XDECREF(n);
    Py_XDECREF(m);
    Py_DECREF(exc);
    return NULL;
}

/* A failure the binding finds itself (before the engine is called), in the engine's form. */
static PyObject *raise_fmt(int code, const char *fmt, ...)
{
    char detail[512], msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    const char *name = tartan_err_name(code);
    snprintf(msg, sizeof msg, "%s: %s", name ? name : "error", detail);
    return raise_code(code, msg);
}

/* ---------------------------------------------------------------------------------------
 * Inputs: ids and rows of embeddings
 * ------------------------------------------------------------------------------------- */

/* External ids as the C strings the engine reads, kept alive by references. */
typedef struct idlist {
    const char **p;
    size_t n;
    PyObject *keep;  /* the tuple of the caller's objects */
    PyObject *extra; /* bytes made for str ids with surrogates (surrogateescape), or NULL */
} idlist;

static void ids_release(idlist *l)
{
    PyMem_Free(l->p);
    Py_XDECREF(l->keep);
    Py_XDECREF(l->extra);
    memset(l, 0, sizeof *l);
}

/* One id: str (UTF-8; lone surrogates as the bytes they escape) or bytes. */
static const char *id_chars(idlist *l, PyObject *o, size_t i, const char *what)
{
    const char *s;
    Py_ssize_t len;
    if (PyUnicode_Check(o)) {
        s = PyUnicode_AsUTF8AndSize(o, &len);
        if (!s) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
                return NULL;
            PyErr_Clear();
            PyObject *b = PyUnicode_AsEncodedString(o, "utf-8", "surrogateescape");
            if (!b)
                return NULL;
            if (!l->extra && !(l->extra = PyList_New(0))) {
                Py_DECREF(b);
                return NULL;
            }
            int bad = PyList_Append(l->extra, b);
            Py_DECREF(b);
            if (bad)
                return NULL;
            s = PyBytes_AS_STRING(b);
            len = PyBytes_GET_SIZE(b);
        }
    } else if (PyBytes_Check(o)) {
        s = PyBytes_AS_STRING(o);
        len = PyBytes_GET_SIZE(o);
    } else {
        PyErr_Format(PyExc_TypeError, "%s %zu is a %.80s; ids are str or bytes", what, i,
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    if (strlen(s) != (size_t)len) {
        raise_fmt(TARTAN_EBADID, "%s %zu contains a NUL byte", what, i);
        return NULL;
    }
    return s;
}

static int ids_get(idlist *l, PyObject *seq, const char *what)
{
    memset(l, 0, sizeof *l);
    if (PyUnicode_Check(seq) || PyBytes_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%ss must be a sequence of ids, not one %.40s", what,
                     Py_TYPE(seq)->tp_name);
        return -1;
    }
    if (!(l->keep = PySequence_Tuple(seq)))
        return -1;
    l->n = (size_t)PyTuple_GET_SIZE(l->keep);
    if (!(l->p = PyMem_Malloc((l->n ? l->n : 1) * sizeof *l->p))) {
        PyErr_NoMemory();
        goto fail;
    }
    for (size_t i = 0; i < l->n; i++)
        if (!(l->p[i] = id_chars(l, PyTuple_GET_ITEM(l->keep, (Py_ssize_t)i), i, what)))
            goto fail;
    return 0;
fail:
    ids_release(l);
    return -1;
}

/* Bytes the binding copied and the pointer it last gave the engine: the tests' proof that
 * contiguous input reaches the engine as the caller's own memory. */
static unsigned long long copied_bytes;
static const void *last_pointer;

/*
 * Rows of embeddings from a list of buffers (C-contiguous, one element type), as one
 * contiguous block: the first buffer's own memory when the pieces lie back to back (one
 * array, or views of one array), else a copy made by rows_join().
 */
typedef struct rows {
    Py_buffer *views;
    size_t nviews;
    const void *data;
    size_t nbytes;
    void *copy; /* malloc'ed when the pieces were scattered */
    int scattered;
} rows;

static void rows_release(rows *r)
{
    for (size_t i = 0; i < r->nviews; i++)
        PyBuffer_Release(&r->views[i]);
    PyMem_Free(r->views);
    free(r->copy);
    memset(r, 0, sizeof *r);
}

static int rows_get(rows *r, PyObject *pieces)
{
    memset(r, 0, sizeof *r);
    PyObject *fast = PySequence_Fast(pieces, "embeddings must be a list of buffers");
    if (!fast)
        return -1;
    size_t n = (size_t)PySequence_Fast_GET_SIZE(fast);
    if (!(r->views = PyMem_Calloc(n ? n : 1, sizeof *r->views))) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    const char *next = NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fast, (Py_ssize_t)i);
        if (PyObject_GetBuffer(o, &r->views[i], PyBUF_C_CONTIGUOUS) < 0) {
            Py_DECREF(fast);
            rows_release(r);
            return -1;
        }
        r->nviews++;
        Py_buffer *v = &r->views[i];
        if (v->len == 0)
            continue;
        if (!r->data)
            r->data = v->buf;
        else if ((const char *)v->buf != next)
            r->scattered = 1;
        next = (const char *)v->buf + v->len;
        r->nbytes += (size_t)v->len;
    }
    Py_DECREF(fast);
    if (!r->data)
        r->data = n ? r->views[0].buf : NULL;
    if (r->scattered && !(r->copy = malloc(r->nbytes))) {
        rows_release(r);
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Concatenates scattered pieces into r->copy; called with the GIL released (the views keep
 * the memory alive). */
static void rows_join(rows *r)
{
    if (!r->scattered)
        return;
    char *p = r->copy;
    for (size_t i = 0; i < r->nviews; i++) {
        memcpy(p, r->views[i].buf, (size_t)r->views[i].len);
        p += r->views[i].len;
    }
    r->data = r->copy;
}

static void rows_note(const rows *r)
{
    if (r->scattered)
        copied_bytes += r->nbytes;
    last_pointer = r->data;
}

/* A buffer of n uint64 values (document or query lengths), read in place. */
static int lens_get(Py_buffer *v, PyObject *o, size_t n, const char *what)
{
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if ((size_t)v->len != n * sizeof(size_t)) {
        PyBuffer_Release(v);
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes for %zu lengths", what, v->len, n);
        return -1;
    }
    return 0;
}

static int dtype_ok(int dtype)
{
    if (dtype == TARTAN_FLOAT32 || dtype == TARTAN_FLOAT16 || dtype == TARTAN_BFLOAT16)
        return 1;
    raise_fmt(TARTAN_EDTYPE, "unknown element type %d", dtype);
    return 0;
}

static size_t dtype_size(int dtype)
{
    return dtype == TARTAN_FLOAT32 ? 4 : 2;
}

/* ---------------------------------------------------------------------------------------
 * Db: one open index
 * ------------------------------------------------------------------------------------- */

typedef struct DbObject {
    PyObject_HEAD tartan_db *db;
    int busy;    /* engine calls in flight (with the GIL released) */
    int closing; /* close() came while busy: the last call to return closes */
} DbObject;

/* Every engine call on a handle is bracketed by db_enter/db_leave, under the GIL: a close
 * from another thread meanwhile waits for the calls in flight instead of freeing the handle
 * under them. */
static tartan_db *db_enter(DbObject *self)
{
    if (!self->db || self->closing) {
        raise_fmt(TARTAN_EINVAL, "the index is closed");
        return NULL;
    }
    self->busy++;
    return self->db;
}

static void db_leave(DbObject *self)
{
    if (--self->busy == 0 && self->closing) {
        tartan_db *db = self->db;
        self->db = NULL;
        self->closing = 0;
        Py_BEGIN_ALLOW_THREADS
            tartan_close(db);
        Py_END_ALLOW_THREADS
    }
}

static int Db_init(DbObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path",         "flags",       "dim",       "nbits",    "n_centroids",
                             "kmeans_iters", "sample_docs", "seed",      "map_size", "device",
                             "gpu_mode",     "gpu_devices", "gpu_split", "codec",    NULL};
    PyObject *path = NULL;
    unsigned flags = 0, nbits = 2;
    Py_ssize_t dim = 0, n_centroids = 0, sample_docs = 0, map_size = 0;
    int kmeans_iters = 4, device = 0, gpu_mode = 0, gpu_devices = 0, gpu_split = 0;
    unsigned codec = TARTAN_CODEC_SCALAR;
    unsigned long long seed = 42;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|InInInKniiiiI", kwlist, PyUnicode_FSConverter,
                                     &path, &flags, &dim, &nbits, &n_centroids, &kmeans_iters,
                                     &sample_docs, &seed, &map_size, &device, &gpu_mode,
                                     &gpu_devices, &gpu_split, &codec))
        return -1;
    if (self->db) {
        Py_DECREF(path);
        PyErr_SetString(PyExc_RuntimeError, "Db is open already");
        return -1;
    }
    if (dim < 0 || n_centroids < 0 || sample_docs < 0 || map_size < 0) {
        Py_DECREF(path);
        raise_fmt(TARTAN_EINVAL, "dim, n_centroids, sample_docs and map_size must be >= 0");
        return -1;
    }
    tartan_options o;
    tartan_options_init(&o);
    o.flags = flags;
    o.dim = (size_t)dim;
    o.nbits = nbits;
    o.n_centroids = (size_t)n_centroids;
    o.kmeans_iters = kmeans_iters;
    o.sample_docs = (size_t)sample_docs;
    o.seed = seed;
    o.map_size = (size_t)map_size;
    o.device = (tartan_device)device;
    o.gpu_mode = (tartan_gpu_mode)gpu_mode;
    o.gpu_devices = gpu_devices;
    o.gpu_split = (tartan_gpu_split)gpu_split;
    o.codec = codec;
    const char *p = PyBytes_AS_STRING(path);
    tartan_db *db = NULL;
    int rc;
    const char *msg = NULL;
    Py_BEGIN_ALLOW_THREADS
        rc = tartan_open(p, &o, &db);
        if (rc)
            msg = tartan_errmsg(NULL); /* this thread's message: read before any other call */
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (rc) {
        raise_code(rc, msg);
        return -1;
    }
    self->db = db;
    return 0;
}

static void Db_dealloc(DbObject *self)
{
    /* No call can be in flight: each holds a reference to self. */
    if (self->db) {
        tartan_db *db = self->db;
        self->db = NULL;
        Py_BEGIN_ALLOW_THREADS
            tartan_close(db);
        Py_END_ALLOW_THREADS
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Db_close(DbObject *self, PyObject *unused)
{
    if (!self->db)
        Py_RETURN_NONE;
    if (self->busy) {
        self->closing = 1;
        Py_RETURN_NONE;
    }
    tartan_db *db = self->db;
    self->db = NULL;
    Py_BEGIN_ALLOW_THREADS
        tartan_close(db);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Db_closed(DbObject *self, void *unused)
{
    return PyBool_FromLong(!self->db || self->closing);
}

/* The engine's failure on db, raised. Must run in the thread that made the call. */
static PyObject *raise_db(tartan_db *db, int rc)
{
    return raise_code(rc, tartan_errmsg(db));
}

/*
 * add(ids, pieces, doclens, n_rows, dim, dtype, flags=0): one tartan_add.
 *   pieces: buffers holding the rows, in order; doclens: uint64 buffer [len(ids)].
 */
static PyObject *Db_add(DbObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ids", "pieces", "doclens", "n_rows", "dim", "dtype", "flags", NULL};
    PyObject *ids_o, *pieces, *lens_o;
    Py_ssize_t n_rows, dim;
    int dtype;
    unsigned flags = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOnni|I", kwlist, &ids_o, &pieces, &lens_o,
                                     &n_rows, &dim, &dtype, &flags))
        return NULL;
    if (n_rows < 0 || dim < 0)
        return raise_fmt(TARTAN_EINVAL, "n_rows and dim must be >= 0");
    if (!dtype_ok(dtype))
        return NULL;
    tartan_db *db = db_enter(self);
    if (!db)
        return NULL;
    PyObject *ret = NULL;
    idlist ids = {0};
    rows r = {0};
    Py_buffer lens = {0};
    if (ids_get(&ids, ids_o, "id") < 0)
        goto done;
    if (lens_get(&lens, lens_o, ids.n, "doclens") < 0)
        goto done;
    if (rows_get(&r, pieces) < 0)
        goto done;
    if (r.nbytes != (size_t)n_rows * (size_t)dim * dtype_size(dtype)) {
        raise_fmt(TARTAN_EINVAL, "%zu bytes of embeddings for %zd rows of dimension %zd", r.nbytes,
                  n_rows, dim);
        goto done;
    }
    rows_note(&r);
    tartan_batch b = {.n_docs = ids.n,
                      .ids = ids.p,
                      .doclens = lens.buf,
                      .n_rows = (size_t)n_rows,
                      .dim = (size_t)dim,
                      .dtype = (tartan_dtype)dtype};
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rows_join(&r);
        b.embeddings = r.data;
        rc = tartan_add(db, &b, flags);
    Py_END_ALLOW_THREADS
    if (rc)
        raise_db(db, rc);
    else
        ret = Py_NewRef(Py_None);
done:
    rows_release(&r);
    if (lens.obj)
        PyBuffer_Release(&lens);
    ids_release(&ids);
    db_leave(self);
    return ret;
}

/*
 * train(pieces, doclens, n_docs, n_rows, dim, dtype, corpus_tokens=0): one tartan_train on a
 * sample (ids are not needed).
 */
static PyObject *Db_train(DbObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pieces", "doclens", "n_docs",        "n_rows",
                             "dim",    "dtype",   "corpus_tokens", NULL};
    PyObject *pieces, *lens_o;
    Py_ssize_t n_docs, n_rows, dim, corpus_tokens = 0;
    int dtype;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOnnni|n", kwlist, &pieces, &lens_o, &n_docs,
                                     &n_rows, &dim, &dtype, &corpus_tokens))
        return NULL;
    if (n_docs < 0 || n_rows < 0 || dim < 0 || corpus_tokens < 0)
        return raise_fmt(TARTAN_EINVAL, "sizes must be >= 0");
    if (!dtype_ok(dtype))
        return NULL;
    tartan_db *db = db_enter(self);
    if (!db)
        return NULL;
    PyObject *ret = NULL;
    rows r = {0};
    Py_buffer lens = {0};
    if (lens_get(&lens, lens_o, (size_t)n_docs, "doclens") < 0)
        goto done;
    if (rows_get(&r, pieces) < 0)
        goto done;
    if (r.nbytes != (size_t)n_rows * (size_t)dim * dtype_size(dtype)) {
        raise_fmt(TARTAN_EINVAL, "%zu bytes of embeddings for %zd rows of dimension %zd", r.nbytes,
                  n_rows, dim);
        goto done;
    }
    rows_note(&r);
    tartan_batch b = {.n_docs = (size_t)n_docs,
                      .doclens = lens.buf,
                      .n_rows = (size_t)n_rows,
                      .dim = (size_t)dim,
                      .dtype = (tartan_dtype)dtype};
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rows_join(&r);
        b.embeddings = r.data;
        rc = tartan_train(db, &b, (size_t)corpus_tokens);
    Py_END_ALLOW_THREADS
    if (rc)
        raise_db(db, rc);
    else
        ret = Py_NewRef(Py_None);
done:
    rows_release(&r);
    if (lens.obj)
        PyBuffer_Release(&lens);
    db_leave(self);
    return ret;
}

/* delete(ids) -> documents deleted: one tartan_delete. */
static PyObject *Db_delete(DbObject *self, PyObject *ids_o)
{
    tartan_db *db = db_enter(self);
    if (!db)
        return NULL;
    PyObject *ret = NULL;
    idlist ids = {0};
    if (ids_get(&ids, ids_o, "id") == 0) {
        size_t n_deleted = 0;
        int rc;
        Py_BEGIN_ALLOW_THREADS
            rc = tartan_delete(db, ids.p, ids.n, &n_deleted);
        Py_END_ALLOW_THREADS
        if (rc)
            raise_db(db, rc);
        else
            ret = PyLong_FromSize_t(n_deleted);
    }
    ids_release(&ids);
    db_leave(self);
    return ret;
}

/* Sets d[key] = v and drops v; returns -1 on failure (v NULL included). */
static int put(PyObject *d, const char *key, PyObject *v)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* A tartan_calibration as a dict. */
static PyObject *calibration_dict(const tartan_calibration *c)
{
    return Py_BuildValue(
        "{sisisisIsKsKsfsfsfsfsdsdsdsIsfsf}", "calibrated", c->calibrated, "from_queries",
        c->from_queries, "stale", c->stale, "n_queries", (unsigned int)c->n_queries, "n_docs",
        (unsigned long long)c->n_docs, "n_reference_docs", (unsigned long long)c->n_reference_docs,
        "margin_k10", c->margin_k10, "margin_k100", c->margin_k100, "recall_k10", c->recall_k10,
        "recall_k100", c->recall_k100, "candidates_k10", c->candidates_k10, "exact_k10",
        c->exact_k10, "seconds", c->seconds, "short_len", (unsigned int)c->short_len,
        "margin_k10_short", c->margin_k10_short, "margin_k100_short", c->margin_k100_short);
}

/* calibrate(n_pseudo=0, reference_docs=0, seed=42, threads=0) -> dict (tartan_calibrate with
 * pseudo-queries). */
static PyObject *Db_calibrate(DbObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"n_pseudo", "reference_docs", "seed", "threads", NULL};
    Py_ssize_t n_pseudo = 0, ref = 0;
    unsigned long long seed = 42;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|nnKi", kwlist, &n_pseudo, &ref, &seed,
                                     &threads))
        return NULL;
    if (n_pseudo < 0 || ref < 0) {
        PyErr_SetString(PyExc_ValueError, "n_pseudo and reference_docs must be >= 0");
        return NULL;
    }
    tartan_db *db = db_enter(self);
    if (!db)
        return NULL;
    tartan_calibrate_params p;
    tartan_calibrate_params_init(&p);
    p.n_pseudo = (size_t)n_pseudo;
    p.max_reference_docs = (size_t)ref;
    p.seed = seed;
    p.threads = threads;
    tartan_calibration c;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = tartan_calibrate(db, &p, &c);
    Py_END_ALLOW_THREADS
    PyObject *ret = rc ? raise_db(db, rc) : calibration_dict(&c);
    db_leave(self);
    return ret;
}

/* calibration() -> dict (tartan_calibration_get). */
static PyObject *Db_calibration(DbObject *self, PyObject *unused)
{
    tartan_db *db = db_enter(self);
    if (!db)
        return NULL;
    tartan_calibration c;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = tartan_calibration_get(db, &c);
    Py_END_ALLOW_THREADS
    PyObject *ret = rc ? raise_db(db, rc) : calibration_dict(&c);
    db_leave(self);
    return ret;
}

/* info() -> dict of tartan_index_info's fields. */
static PyObject *Db_info(DbObject *self, PyObject *unused)
{
    tartan_db *db = db_enter(self);
    if (!db)
        return NULL;
    tartan_index_info in;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = tartan_info(db, &in);
    Py_END_ALLOW_THREADS
    PyObject *d = NULL;
    if (rc) {
        raise_db(db, rc);
        goto done;
    }
    typedef unsigned long long ull;
    d = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKss}", "n_docs", (ull)in.n_docs, "n_tokens",
        (ull)in.n_tokens, "dim", (ull)in.dim, "nbits", (ull)in.nbits, "n_centroids",
        (ull)in.n_centroids, "code_bytes", (ull)in.code_bytes, "bytes_residuals",
        (ull)in.bytes_residuals, "bytes_codes", (ull)in.bytes_codes, "bytes_norms",
        (ull)in.bytes_norms, "bytes_docs", (ull)in.bytes_docs, "bytes_ivf", (ull)in.bytes_ivf,
        "ivf_entries", (ull)in.ivf_entries, "bytes_ids", (ull)in.bytes_ids, "bytes_centroids",
        (ull)in.bytes_centroids, "bytes_meta", (ull)in.bytes_meta, "bytes_free", (ull)in.bytes_free,
        "bytes_file", (ull)in.bytes_file, "map_size", (ull)in.map_size, "format", (ull)in.format,
        "codec", in.codec == TARTAN_CODEC_AXES ? "axes" : "scalar");
done:
    db_leave(self);
    return d;
}

/* Problems tartan_check reports, kept in C while the GIL is released. */
typedef struct problems {
    char **kind, **msg;
    size_t n, cap;
    int oom;
} problems;

/* Problems kept for Python at most: the count returned is exact whatever the number. */
#define MAX_KEPT_PROBLEMS 100000

static int on_problem(void *ctx, const char *kind, const char *message)
{
    problems *p = ctx;
    if (p->oom || p->n >= MAX_KEPT_PROBLEMS)
        return 0;
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 16;
        char **k = realloc(p->kind, cap * sizeof *k);
        if (!k) {
            p->oom = 1;
            return 0;
        }
        p->kind = k;
        char **m = realloc(p->msg, cap * sizeof *m);
        if (!m) {
            p->oom = 1;
            return 0;
        }
        p->msg = m;
        p->cap = cap;
    }
    char *k = strdup(kind), *m = strdup(message);
    if (!k || !m) {
        free(k);
        free(m);
        p->oom = 1;
        return 0;
    }
    p->kind[p->n] = k;
    p->msg[p->n++] = m;
    return 0;
}

/* check() -> (problems found, [(kind, message), ...]): one tartan_check. */
static PyObject *Db_check(DbObject *self, PyObject *unused)
{
    tartan_db *db = db_enter(self);
    if (!db)
        return NULL;
    problems p = {0};
    size_t n_problems = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rc = tartan_check(db, on_problem, &p, &n_problems);
    Py_END_ALLOW_THREADS
    PyObject *ret = NULL, *list = NULL;
    if (rc && rc != TARTAN_ECORRUPT) {
        raise_db(db, rc);
        goto done;
    }
    if (p.oom) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(list = PyList_New((Py_ssize_t)p.n)))
        goto done;
    for (size_t i = 0; i < p.n; i++) {
        PyObject *t = Py_BuildValue("(ss)", p.kind[i], p.msg[i]);
        if (!t)
            goto done;
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    ret = Py_BuildValue("(nO)", (Py_ssize_t)n_problems, list);
done:
    Py_XDECREF(list);
    for (size_t i = 0; i < p.n; i++) {
        free(p.kind[i]);
        free(p.msg[i]);
    }
    free(p.kind);
    free(p.msg);
    db_leave(self);
    return ret;
}

/* A hit's id as str: UTF-8, any other byte kept by surrogateescape (round-trips into ids). */
static PyObject *id_str(const char *s)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
}

/* Results as [[(id, score), ...], ...]. */
static PyObject *results_tuples(const tartan_results *res)
{
    PyObject *out = PyList_New((Py_ssize_t)res->n_queries);
    if (!out)
        return NULL;
    for (size_t i = 0; i < res->n_queries; i++) {
        size_t n = res->counts[i];
        const tartan_hit *h = res->hits + res->offsets[i];
        PyObject *l = PyList_New((Py_ssize_t)n);
        if (!l)
            goto fail;
        PyList_SET_ITEM(out, (Py_ssize_t)i, l);
        for (size_t j = 0; j < n; j++) {
            PyObject *id = id_str(h[j].id), *sc = PyFloat_FromDouble((double)h[j].score), *t;
            if (!id || !sc || !(t = PyTuple_New(2))) {
                Py_XDECREF(id);
                Py_XDECREF(sc);
                goto fail;
            }
            PyTuple_SET_ITEM(t, 0, id);
            PyTuple_SET_ITEM(t, 1, sc);
            PyList_SET_ITEM(l, (Py_ssize_t)j, t);
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/*
 * Results as arrays of width w (the most hits any query got): (ids: list of nq * w str or
 * None, scores: bytearray of nq * w float32 with -inf where there is no hit, counts:
 * bytearray of nq int64).
 */
static PyObject *results_arrays(const tartan_results *res)
{
    size_t nq = res->n_queries, w = 0;
    for (size_t i = 0; i < nq; i++)
        w = res->counts[i] > w ? res->counts[i] : w;
    PyObject *ids = PyList_New((Py_ssize_t)(nq * w));
    PyObject *scores = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(nq * w * sizeof(float)));
    PyObject *counts = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(nq * sizeof(int64_t)));
    if (!ids || !scores || !counts)
        goto fail;
    float *s = (float *)PyByteArray_AS_STRING(scores);
    int64_t *c = (int64_t *)PyByteArray_AS_STRING(counts);
    for (size_t i = 0; i < nq; i++) {
        size_t n = res->counts[i];
        const tartan_hit *h = res->hits + res->offsets[i];
        c[i] = (int64_t)n;
        for (size_t j = 0; j < w; j++) {
            PyObject *id;
            if (j < n) {
                if (!(id = id_str(h[j].id)))
                    goto fail;
                s[i * w + j] = h[j].score;
            } else {
                id = Py_NewRef(Py_None);
                s[i * w + j] = -INFINITY;
            }
            PyList_SET_ITEM(ids, (Py_ssize_t)(i * w + j), id);
        }
    }
    PyObject *t = Py_BuildValue("(NNNn)", ids, scores, counts, (Py_ssize_t)w);
    return t;
fail:
    Py_XDECREF(ids);
    Py_XDECREF(scores);
    Py_XDECREF(counts);
    return NULL;
}

static PyObject *stats_dict(const tartan_search_stats *st)
{
    return Py_BuildValue("{sdsdsdsdsKsKsKsdsd}", "seconds_candidates", st->seconds_candidates,
                         "seconds_prune", st->seconds_prune, "seconds_exact", st->seconds_exact,
                         "seconds_total", st->seconds_total, "n_candidates",
                         (unsigned long long)st->n_candidates, "n_exact",
                         (unsigned long long)st->n_exact, "n_probes",
                         (unsigned long long)st->n_probes, "probe_margin",
                         (double)st->probe_margin, "rerank_z", (double)st->rerank_z);
}

/* An optional whole number >= 1 (None: keep the default). */
static int opt_count(PyObject *o, size_t *out, const char *what)
{
    if (o == Py_None)
        return 0;
    Py_ssize_t v = PyNumber_AsSsize_t(o, PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 1) {
        raise_fmt(TARTAN_ERANGE, "%s must be at least 1, not %zd", what, v);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

/*
 * search(pieces, qlens, qlen, n_queries, n_rows, dim, dtype, k, ncells=None, threshold=None,
 *        ndocs=None, exhaustive=False, subset=None, threads=0, device=0, recall_target=None,
 *        arrays=False): one tartan_search.
 *   qlens: uint64 buffer [n_queries] or None (then every query has qlen tokens).
 * Returns (results_tuples' list, or with arrays=True results_arrays' tuple; the stats as a
 * dict).
 */
static PyObject *Db_search(DbObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"pieces", "qlens",   "qlen",   "n_queries",     "n_rows", "dim",
                             "dtype",  "k",       "ncells", "threshold",     "ndocs",  "exhaustive",
                             "subset", "threads", "device", "recall_target", "arrays", NULL};
    PyObject *pieces, *qlens_o, *ncells_o = Py_None, *thr_o = Py_None, *ndocs_o = Py_None;
    PyObject *subset_o = Py_None, *rt_o = Py_None;
    Py_ssize_t qlen, nq, n_rows, dim, k;
    int dtype, exhaustive = 0, threads = 0, device = 0, arrays = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOnnnnin|OOOpOiiOp", kwlist, &pieces, &qlens_o,
                                     &qlen, &nq, &n_rows, &dim, &dtype, &k, &ncells_o, &thr_o,
                                     &ndocs_o, &exhaustive, &subset_o, &threads, &device, &rt_o,
                                     &arrays))
        return NULL;
    if (qlen < 0 || nq < 0 || n_rows < 0 || dim < 0)
        return raise_fmt(TARTAN_EINVAL, "sizes must be >= 0");
    if (!dtype_ok(dtype))
        return NULL;
    tartan_search_params p;
    /* A k below 1 reaches the engine as 0 (TARTAN_ERANGE, its message), never as a huge
     * size_t. */
    tartan_search_params_init(&p, k < 1 ? 1 : (size_t)k);
    p.k = k < 1 ? 0 : (size_t)k;
    if (opt_count(ncells_o, &p.ncells, "ncells") < 0 || opt_count(ndocs_o, &p.ndocs, "ndocs") < 0)
        return NULL;
    if (thr_o != Py_None) {
        double t = PyFloat_AsDouble(thr_o);
        if (t == -1.0 && PyErr_Occurred())
            return NULL;
        p.centroid_score_threshold = (float)t;
    }
    if (rt_o != Py_None) {
        double rt = PyFloat_AsDouble(rt_o);
        if (rt == -1.0 && PyErr_Occurred())
            return NULL;
        p.recall_target = (float)rt;
    }
    p.exhaustive = exhaustive;
    p.threads = threads;
    p.device = (tartan_device)device;

    tartan_db *db = db_enter(self);
    if (!db)
        return NULL;
    PyObject *ret = NULL;
    idlist subset = {0};
    rows r = {0};
    Py_buffer lens = {0};
    tartan_results *res = NULL;
    if (subset_o != Py_None) {
        if (ids_get(&subset, subset_o, "subset id") < 0)
            goto done;
        p.subset = subset.p; /* never NULL, also for an empty subset (nothing allowed) */
        p.n_subset = subset.n;
    }
    if (qlens_o != Py_None && lens_get(&lens, qlens_o, (size_t)nq, "qlens") < 0)
        goto done;
    if (rows_get(&r, pieces) < 0)
        goto done;
    if (r.nbytes != (size_t)n_rows * (size_t)dim * dtype_size(dtype)) {
        raise_fmt(TARTAN_EINVAL, "%zu bytes of queries for %zd rows of dimension %zd", r.nbytes,
                  n_rows, dim);
        goto done;
    }
    rows_note(&r);
    tartan_queries q = {.n_queries = (size_t)nq,
                        .qlens = lens.obj ? lens.buf : NULL,
                        .qlen = (size_t)qlen,
                        .n_rows = (size_t)n_rows,
                        .dim = (size_t)dim,
                        .dtype = (tartan_dtype)dtype};
    int rc;
    Py_BEGIN_ALLOW_THREADS
        rows_join(&r);
        q.embeddings = r.data;
        rc = tartan_search(db, &q, &p, &res);
    Py_END_ALLOW_THREADS
    if (rc) {
        raise_db(db, rc);
        goto done;
    }
    PyObject *a = arrays ? results_arrays(res) : results_tuples(res);
    PyObject *st = stats_dict(&res->stats);
    if (a && st)
        ret = Py_BuildValue("(OO)", a, st);
    Py_XDECREF(a);
    Py_XDECREF(st);
done:
    tartan_results_free(res);
    rows_release(&r);
    if (lens.obj)
        PyBuffer_Release(&lens);
    ids_release(&subset);
    db_leave(self);
    return ret;
}

static PyMethodDef Db_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Db_add, METH_VARARGS | METH_KEYWORDS,
     "add(ids, pieces, doclens, n_rows, dim, dtype, flags=0): tartan_add"},
    {"train", (PyCFunction)(void (*)(void))Db_train, METH_VARARGS | METH_KEYWORDS,
     "train(pieces, doclens, n_docs, n_rows, dim, dtype, corpus_tokens=0): tartan_train"},
    {"delete", (PyCFunction)Db_delete, METH_O, "delete(ids) -> documents deleted"},
    {"calibrate", (PyCFunction)(void (*)(void))Db_calibrate, METH_VARARGS | METH_KEYWORDS,
     "calibrate(n_pseudo=0, reference_docs=0, seed=42, threads=0) -> dict"},
    {"calibration", (PyCFunction)Db_calibration, METH_NOARGS, "calibration() -> dict"},
    {"info", (PyCFunction)Db_info, METH_NOARGS, "info() -> dict"},
    {"check", (PyCFunction)Db_check, METH_NOARGS, "check() -> (n_problems, [(kind, message)])"},
    {"search", (PyCFunction)(void (*)(void))Db_search, METH_VARARGS | METH_KEYWORDS,
     "search(pieces, qlens, qlen, n_queries, n_rows, dim, dtype, k, ...): tartan_search"},
    {"close", (PyCFunction)Db_close, METH_NOARGS,
     "close(): closes the handle (after the calls in flight in other threads)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Db_getset[] = {
    {"closed", (getter)Db_closed, NULL, "whether the handle is closed", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject DbType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tartan._tartan.Db",
    .tp_basicsize = sizeof(DbObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An open libtartan index (tartan_db); use tartan.Index.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Db_init,
    .tp_dealloc = (destructor)Db_dealloc,
    .tp_methods = Db_methods,
    .tp_getset = Db_getset,
};

/* ---------------------------------------------------------------------------------------
 * Evaluation: the tool's code over files or over Python dicts
 * ------------------------------------------------------------------------------------- */

/* A dict key or id as UTF-8 (str only: BEIR and pytrec_eval use str ids). */
static const char *key_chars(PyObject *o, Py_ssize_t *len, const char *what)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.80s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(o, len);
}

static int by_doc(const void *a, const void *b)
{
    const tool_judgment *x = a, *y = b;
    return (x->doc > y->doc) - (x->doc < y->doc);
}

/* qrels from {qid: {docid: relevance (int)}}, as tool_qrels_read would hold them. */
static int qrels_from_dict(tool_qrels *q, PyObject *d)
{
    memset(q, 0, sizeof *q);
    q->format = TOOL_QRELS_TREC;
    size_t qcap = 0, total = 0;
    PyObject *qk, *docs;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &qk, &docs)) {
        Py_ssize_t ql;
        const char *qs = key_chars(qk, &ql, "a qrels query id");
        if (!qs)
            goto fail;
        if (!PyDict_Check(docs)) {
            PyErr_Format(PyExc_TypeError, "qrels['%s'] must be a dict of docid: relevance", qs);
            goto fail;
        }
        long qi = tool_strtab_intern(&q->qids, qs, (size_t)ql, NULL);
        if (qi < 0 || tool_array_reserve((void **)&q->q, &qcap, (size_t)qi + 1, sizeof *q->q, 64))
            goto nomem;
        tool_qrels_query *qq = &q->q[qi];
        PyObject *dk, *rv;
        Py_ssize_t dpos = 0;
        while (PyDict_Next(docs, &dpos, &dk, &rv)) {
            Py_ssize_t dl;
            const char *ds = key_chars(dk, &dl, "a qrels document id");
            if (!ds)
                goto fail;
            if (PyFloat_Check(rv) || !PyIndex_Check(rv)) {
                PyErr_Format(PyExc_TypeError, "qrels['%s']['%s'] must be an int relevance", qs, ds);
                goto fail;
            }
            long rel = PyLong_AsLong(rv);
            if (rel == -1 && PyErr_Occurred())
                goto fail;
            long di = tool_strtab_intern(&q->docids, ds, (size_t)dl, NULL);
            if (di < 0 ||
                tool_array_reserve((void **)&qq->j, &qq->cap, qq->n + 1, sizeof *qq->j, 8))
                goto nomem;
            qq->j[qq->n++] = (tool_judgment){.doc = di, .rel = rel, .line = 0};
            total++;
        }
    }
    if (!total) {
        raise_fmt(TARTAN_EEMPTY, "qrels: no judgments");
        goto fail;
    }
    for (size_t i = 0; i < q->qids.n; i++)
        qsort(q->q[i].j, q->q[i].n, sizeof *q->q[i].j, by_doc);
    return 0;
nomem:
    PyErr_NoMemory();
fail:
    tool_qrels_free(q);
    return -1;
}

/* A run from {qid: {docid: score}}, as tool_run_read would hold it. */
static int run_from_dict(tool_run *r, PyObject *d)
{
    memset(r, 0, sizeof *r);
    size_t qcap = 0;
    PyObject *qk, *docs;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &qk, &docs)) {
        Py_ssize_t ql;
        const char *qs = key_chars(qk, &ql, "a run query id");
        if (!qs)
            goto fail;
        if (!PyDict_Check(docs)) {
            PyErr_Format(PyExc_TypeError, "run['%s'] must be a dict of docid: score", qs);
            goto fail;
        }
        long qi = tool_strtab_intern(&r->qids, qs, (size_t)ql, NULL);
        if (qi < 0 || tool_array_reserve((void **)&r->q, &qcap, (size_t)qi + 1, sizeof *r->q, 64))
            goto nomem;
        tool_run_query *rq = &r->q[qi];
        PyObject *dk, *sv;
        Py_ssize_t dpos = 0;
        while (PyDict_Next(docs, &dpos, &dk, &sv)) {
            Py_ssize_t dl;
            const char *ds = key_chars(dk, &dl, "a run document id");
            if (!ds)
                goto fail;
            double score = PyFloat_AsDouble(sv);
            if (score == -1.0 && PyErr_Occurred())
                goto fail;
            if (isnan(score)) {
                raise_fmt(TARTAN_EFORMAT, "run['%s']['%s'] is NaN", qs, ds);
                goto fail;
            }
            long di = tool_strtab_intern(&r->docids, ds, (size_t)dl, NULL);
            if (di < 0 ||
                tool_array_reserve((void **)&rq->d, &rq->cap, rq->n + 1, sizeof *rq->d, 16))
                goto nomem;
            rq->d[rq->n++] = (tool_run_doc){.doc = di, .score = score, .line = 0};
            r->lines++;
        }
    }
    return 0;
nomem:
    PyErr_NoMemory();
fail:
    tool_run_free(r);
    return -1;
}

/*
 * evaluate(qrels, run, measures, level=1, complete=False): qrels and run are each a path
 * (str or bytes: the tool's readers) or a dict. Returns a dict: measures (trec_eval names),
 * mean, qids (byte order), values (per query, in measures' order), num_q, run_only,
 * qrels_only.
 */
static PyObject *py_evaluate(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"qrels", "run", "measures", "level", "complete", NULL};
    PyObject *qrels_o, *run_o;
    const char *spec;
    long level = 1;
    int complete = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOs|lp", kwlist, &qrels_o, &run_o, &spec, &level,
                                     &complete))
        return NULL;
    char err[1400] = "";
    tool_measure *m = NULL;
    size_t nm = 0;
    tool_qrels qrels = {0};
    tool_run run = {0};
    tool_eval e = {0};
    int have_qrels = 0, have_run = 0, have_eval = 0, rc;
    PyObject *ret = NULL;
    if ((rc = tool_measures_parse(spec, &m, &nm, err, sizeof err))) {
        raise_fmt(rc, "%s", err);
        goto done;
    }
    if (PyDict_Check(qrels_o)) {
        if (qrels_from_dict(&qrels, qrels_o) < 0)
            goto done;
    } else {
        PyObject *path;
        if (!PyUnicode_FSConverter(qrels_o, &path))
            goto done;
        Py_BEGIN_ALLOW_THREADS
            rc = tool_qrels_read(&qrels, PyBytes_AS_STRING(path), err, sizeof err);
        Py_END_ALLOW_THREADS
        Py_DECREF(path);
        if (rc) {
            raise_fmt(rc, "%s", err);
            goto done;
        }
    }
    have_qrels = 1;
    if (PyDict_Check(run_o)) {
        if (run_from_dict(&run, run_o) < 0)
            goto done;
    } else {
        PyObject *path;
        if (!PyUnicode_FSConverter(run_o, &path))
            goto done;
        Py_BEGIN_ALLOW_THREADS
            rc = tool_run_read(&run, PyBytes_AS_STRING(path), err, sizeof err);
        Py_END_ALLOW_THREADS
        Py_DECREF(path);
        if (rc) {
            raise_fmt(rc, "%s", err);
            goto done;
        }
    }
    have_run = 1;
    tool_eval_opts o = {.level = level, .complete = complete};
    Py_BEGIN_ALLOW_THREADS
        rc = tool_evaluate(&qrels, &run, m, nm, &o, &e, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc) {
        raise_fmt(rc, "%s", err);
        goto done;
    }
    have_eval = 1;
    PyObject *names = PyList_New((Py_ssize_t)nm), *mean = PyList_New((Py_ssize_t)nm);
    PyObject *qids = PyList_New((Py_ssize_t)e.nq), *values = PyList_New((Py_ssize_t)e.nq);
    if (!names || !mean || !qids || !values)
        goto build_fail;
    for (size_t i = 0; i < nm; i++) {
        PyObject *n = PyUnicode_FromString(m[i].name), *v = PyFloat_FromDouble(e.mean[i]);
        if (!n || !v) {
            Py_XDECREF(n);
            Py_XDECREF(v);
            goto build_fail;
        }
        PyList_SET_ITEM(names, (Py_ssize_t)i, n);
        PyList_SET_ITEM(mean, (Py_ssize_t)i, v);
    }
    for (size_t q = 0; q < e.nq; q++) {
        PyObject *id = id_str(e.qids[q]), *row = PyList_New((Py_ssize_t)nm);
        if (!id || !row) {
            Py_XDECREF(id);
            Py_XDECREF(row);
            goto build_fail;
        }
        PyList_SET_ITEM(qids, (Py_ssize_t)q, id);
        PyList_SET_ITEM(values, (Py_ssize_t)q, row);
        for (size_t i = 0; i < nm; i++) {
            PyObject *v = PyFloat_FromDouble(e.values[q * nm + i]);
            if (!v)
                goto build_fail;
            PyList_SET_ITEM(row, (Py_ssize_t)i, v);
        }
    }
    ret = Py_BuildValue("{sNsNsNsNsnsnsn}", "measures", names, "mean", mean, "qids", qids, "values",
                        values, "num_q", (Py_ssize_t)e.num_q, "run_only", (Py_ssize_t)e.run_only,
                        "qrels_only", (Py_ssize_t)e.qrels_only);
    goto done;
build_fail:
    Py_XDECREF(names);
    Py_XDECREF(mean);
    Py_XDECREF(qids);
    Py_XDECREF(values);
done:
    if (have_eval)
        tool_eval_free(&e);
    if (have_run)
        tool_run_free(&run);
    if (have_qrels)
        tool_qrels_free(&qrels);
    free(m);
    return ret;
}

/* ---------------------------------------------------------------------------------------
 * Module
 * ------------------------------------------------------------------------------------- */

static PyObject *py_version(PyObject *mod, PyObject *unused)
{
    int major, minor, patch;
    const char *s = tartan_version(&major, &minor, &patch);
    return Py_BuildValue("(siii)", s, major, minor, patch);
}

static PyObject *py_strerror(PyObject *mod, PyObject *arg)
{
    int code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(tartan_strerror(code));
}

static PyObject *py_sample_docs(PyObject *mod, PyObject *arg)
{
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0)
        return raise_fmt(TARTAN_EINVAL, "n_docs must be >= 0, not %zd", n);
    return PyLong_FromSize_t(tartan_sample_docs(NULL, (size_t)n));
}

static PyObject *py_last_input(PyObject *mod, PyObject *unused)
{
    return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)last_pointer, copied_bytes);
}

static PyMethodDef module_methods[] = {
    {"version", py_version, METH_NOARGS,
     "version() -> (string, major, minor, patch) of the libtartan linked at run time"},
    {"strerror", py_strerror, METH_O, "strerror(code) -> tartan_strerror(code)"},
    {"evaluate", (PyCFunction)(void (*)(void))py_evaluate, METH_VARARGS | METH_KEYWORDS,
     "evaluate(qrels, run, measures, level=1, complete=False) -> dict (the tool's evaluation)"},
    {"sample_docs", py_sample_docs, METH_O,
     "sample_docs(n_docs) -> tartan_sample_docs(NULL, n_docs)"},
    {"_last_input", py_last_input, METH_NOARGS,
     "_last_input() -> (pointer given to the engine last, bytes the binding ever copied)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tartan._tartan",
                                        "libtartan's public API (engine/tartan.h) for Python.", -1,
                                        module_methods};

static int add_int(PyObject *m, const char *name, long long v)
{
    return PyModule_AddObject(m, name, PyLong_FromLongLong(v)) < 0 ? -1 : 0;
}

PyMODINIT_FUNC PyInit__tartan(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyType_Ready(&DbType) < 0)
        goto fail;
    Py_INCREF(&DbType);
    if (PyModule_AddObject(m, "Db", (PyObject *)&DbType) < 0)
        goto fail;

    /* tartan.Error and one subclass per engine code. */
    Error = PyErr_NewExceptionWithDoc(
        "tartan.Error",
        "A failure of libtartan: code (int), name ('TARTAN_EDIM', 'ENOENT') and message "
        "(tartan_errmsg, starting with the name).",
        NULL, NULL);
    if (!Error || PyModule_AddObject(m, "Error", Py_NewRef(Error)) < 0)
        goto fail;
    PyObject *bases = PyTuple_Pack(2, Error, PyExc_OSError);
    ErrnoError = bases ? PyErr_NewExceptionWithDoc(
                             "tartan.ErrnoError",
                             "A system error (positive errno code: ENOENT, EACCES, ENOSPC, "
                             "ENOMEM, ...); also an OSError with errno set.",
                             bases, NULL)
                       : NULL;
    Py_XDECREF(bases);
    if (!ErrnoError || PyModule_AddObject(m, "ErrnoError", Py_NewRef(ErrnoError)) < 0)
        goto fail;
    PyObject *codes = PyDict_New();
    if (!codes || PyModule_AddObject(m, "ERROR_CODES", codes) < 0)
        goto fail;
    for (size_t i = 0; i < N_CODES; i++) {
        code_class *c = &code_classes[i];
        PyObject *extra = NULL;
        for (const char *const *v = value_codes; *v; v++)
            if (!strcmp(*v, c->name))
                extra = PyExc_ValueError;
        if (!strcmp(c->name, "EDTYPE"))
            extra = PyExc_TypeError;
        char qual[64], doc[160];
        snprintf(qual, sizeof qual, "tartan.%s", c->name);
        snprintf(doc, sizeof doc, "TARTAN_%s (%d): %s.", c->name, c->code, c->text);
        bases = extra ? PyTuple_Pack(2, Error, extra) : PyTuple_Pack(1, Error);
        c->cls = bases ? PyErr_NewExceptionWithDoc(qual, doc, bases, NULL) : NULL;
        Py_XDECREF(bases);
        if (!c->cls || PyModule_AddObject(m, c->name, Py_NewRef(c->cls)) < 0)
            goto fail;
        PyObject *entry = Py_BuildValue("(is)", c->code, c->text);
        if (put(codes, c->name, entry) < 0)
            goto fail;
    }

    if (add_int(m, "CREATE", TARTAN_CREATE) || add_int(m, "EXCL", TARTAN_EXCL) ||
        add_int(m, "READONLY", TARTAN_READONLY) || add_int(m, "REPLACE", TARTAN_REPLACE) ||
        add_int(m, "FLOAT32", TARTAN_FLOAT32) || add_int(m, "FLOAT16", TARTAN_FLOAT16) ||
        add_int(m, "BFLOAT16", TARTAN_BFLOAT16) || add_int(m, "DEVICE_AUTO", TARTAN_DEVICE_AUTO) ||
        add_int(m, "DEVICE_CPU", TARTAN_DEVICE_CPU) ||
        add_int(m, "DEVICE_CUDA", TARTAN_DEVICE_CUDA) || add_int(m, "GPU_AUTO", TARTAN_GPU_AUTO) ||
        add_int(m, "GPU_RESIDENT", TARTAN_GPU_RESIDENT) ||
        add_int(m, "GPU_STREAMING", TARTAN_GPU_STREAMING) ||
        add_int(m, "GPU_SPLIT_AUTO", TARTAN_GPU_SPLIT_AUTO) ||
        add_int(m, "GPU_SPLIT_DOCUMENTS", TARTAN_GPU_SPLIT_DOCUMENTS) ||
        add_int(m, "GPU_SPLIT_QUERIES", TARTAN_GPU_SPLIT_QUERIES) ||
        add_int(m, "MAX_K", (long long)TARTAN_MAX_K))
        goto fail;
    if (PyModule_AddStringConstant(m, "HEADER_VERSION", TARTAN_VERSION_STRING) < 0)
        goto fail;
    /* What this build's header has, among the parts that arrive later (setup.py looks). */
    PyObject *features = PyDict_New();
    if (!features || PyModule_AddObject(m, "FEATURES", features) < 0)
        goto fail;
    if (put(features, "recall_target", Py_NewRef(Py_True)) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
