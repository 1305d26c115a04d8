/*
 * check_tools_npy.c: the tool layer's .npy reading and writing: round trips in every dtype
 * (whole and streamed), files NumPy wrote and NumPy reading ours, hand-made bad files (malformed
 * headers, unsupported layouts, bad sizes, corruption) refused with a message naming the file.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "evaluate.h"
#include "fixture.h"
#include "idlist.h"
#include "jsonl.h"
#include "kernels.h"
#include "metrics.h"
#include "npy.h"
#include "qrels.h"
#include "synth.h"
#include "tartan.h"
#include "trec_run.h"

static const tool_dtype all_dtypes[] = {TOOL_F32, TOOL_F16, TOOL_BF16, TOOL_I32, TOOL_I64, TOOL_U8};
#define N_DTYPES (sizeof all_dtypes / sizeof all_dtypes[0])

/* Opens with the dtype and rank the file should have; poisons the struct first. */
static int open_expect(tool_npy *a, const char *path, tool_dtype t, int rank, char *err)
{
    memset(a, 0xA5, sizeof *a);
    return tool_npy_open(a, path, TOOL_DT(t), rank, rank, err, 512);
}

/* ---- .npy round trips ------------------------------------------------------------------- */

START_TEST(test_tools_npy_roundtrip)
{
    rng_init_random();
    char err[512];
    for (size_t di = 0; di < N_DTYPES; di++) {
        tool_dtype t = all_dtypes[di];
        for (int rank = 0; rank <= 5; rank++) {
            for (int trial = 0; trial < 3; trial++) {
                size_t shape[8], count = 1;
                for (int i = 0; i < rank; i++) {
                    /* One trial per dtype and rank has an empty first dimension. */
                    shape[i] = (trial == 2 && i == 0) ? 0 : 1 + rnd_below(rank > 3 ? 4 : 9);
                    count *= shape[i];
                }
                size_t nbytes = count * tool_dtype_size(t);
                unsigned char *data = malloc(nbytes + 1);
                fill_random(data, nbytes);
                const char *p = fx_path("rt.npy");
                ck_assert_msg(tool_npy_save(p, t, rank, shape, data, err, sizeof err) == 0, "%s",
                              err);
                size_t flen;
                unsigned char *file = fx_read_file(p, &flen);
                /* The data starts 64-aligned, right after the header's newline. */
                size_t off = flen - nbytes;
                ck_assert_uint_eq(off % 64, 0);
                ck_assert_int_eq(file[off - 1], '\n');
                free(file);

                tool_npy a;
                int rc = open_expect(&a, p, t, rank, err);
                ck_assert_msg(rc == 0, "%s", err);
                ck_assert_int_eq(a.dtype, t);
                ck_assert_int_eq(a.rank, rank);
                for (int i = 0; i < rank; i++)
                    ck_assert_uint_eq(a.shape[i], shape[i]);
                ck_assert_uint_eq(a.count, count);
                ck_assert_uint_eq(a.nbytes, nbytes);
                ck_assert_ptr_nonnull(a.data);
                ck_assert_uint_eq((uintptr_t)a.data % tool_dtype_size(t), 0);
                ck_assert_int_eq(memcmp(a.data, data, nbytes), 0);
                /* Integers read back by value, whatever their width. */
                for (size_t i = 0; i < count && (t == TOOL_I32 || t == TOOL_I64 || t == TOOL_U8);
                     i++) {
                    int64_t want = t == TOOL_I32   ? (int64_t)((int32_t *)(void *)data)[i]
                                   : t == TOOL_I64 ? ((int64_t *)(void *)data)[i]
                                                   : (int64_t)data[i];
                    ck_assert_int_eq(tool_npy_int(&a, i), want);
                }
                tool_npy_close(&a);
                tool_npy_close(&a); /* closing twice is harmless */
                free(data);
            }
        }
    }
}
END_TEST

START_TEST(test_tools_npy_streaming_writer)
{
    rng_init_random();
    char err[512];
    /* Large enough (4 MiB) that the reader maps it. */
    const size_t rows = 8192, dim = 128;
    float *data = malloc(rows * dim * sizeof *data);
    for (size_t i = 0; i < rows * dim; i++)
        data[i] = (float)((double)rnd() / (double)UINT64_MAX - 0.5);
    for (int unknown = 0; unknown <= 1; unknown++) {
        const char *p = fx_path(unknown ? "unknown.npy" : "known.npy");
        size_t shape[2] = {unknown ? TOOL_NPY_ROWS_UNKNOWN : rows, dim};
        tool_npy_writer *w;
        ck_assert_msg(tool_npy_writer_open(&w, p, TOOL_F32, 2, shape, err, sizeof err) == 0, "%s",
                      err);
        /* Nothing at the final path until close. */
        ck_assert_int_eq(access(p, F_OK), -1);
        size_t done = 0;
        while (done < rows) {
            size_t n = 1 + rnd_below(1000);
            if (n > rows - done)
                n = rows - done;
            if (rnd_below(8) == 0)
                n = 0; /* empty batches are allowed */
            ck_assert_msg(tool_npy_writer_rows(w, data + done * dim, n, err, sizeof err) == 0, "%s",
                          err);
            done += n;
        }
        ck_assert_msg(tool_npy_writer_close(w, err, sizeof err) == 0, "%s", err);
        tool_npy a;
        ck_assert_msg(open_expect(&a, p, TOOL_F32, 2, err) == 0, "%s", err);
        ck_assert_uint_eq(a.shape[0], rows);
        ck_assert_uint_eq(a.shape[1], dim);
        ck_assert_int_eq(a.mapped, 1);
        ck_assert_int_eq(memcmp(a.data, data, rows * dim * sizeof *data), 0);
        tool_npy_close(&a);
    }
    /* Only the two finished files remain: no temporary files are left behind. */
    ck_assert_uint_eq(fx_count_dir_entries(), 2);
    free(data);
}
END_TEST

START_TEST(test_tools_npy_writer_refuses_wrong_counts)
{
    char err[512];
    int32_t rows[6] = {1, 2, 3, 4, 5, 6};
    size_t shape[2] = {2, 3};
    tool_npy_writer *w;
    const char *p = fx_path("w.npy");

    /* Too many rows. */
    ck_assert_int_eq(tool_npy_writer_open(&w, p, TOOL_I32, 2, shape, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_rows(w, rows, 1, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_rows(w, rows, 2, err, sizeof err), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "w.npy"));
    ck_assert_int_eq(tool_npy_writer_close(w, err, sizeof err), TARTAN_EINVAL);
    ck_assert_int_eq(access(p, F_OK), -1);

    /* Too few rows. */
    ck_assert_int_eq(tool_npy_writer_open(&w, p, TOOL_I32, 2, shape, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_rows(w, rows, 1, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_close(w, err, sizeof err), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "1 rows written"));
    ck_assert_int_eq(access(p, F_OK), -1);

    /* Abandoned. */
    ck_assert_int_eq(tool_npy_writer_open(&w, p, TOOL_I32, 2, shape, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_rows(w, rows, 2, err, sizeof err), 0);
    tool_npy_writer_abort(w);
    ck_assert_int_eq(access(p, F_OK), -1);

    /* A failed write leaves an existing file as it was. */
    ck_assert_int_eq(tool_npy_save(p, TOOL_I32, 2, shape, rows, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_open(&w, p, TOOL_I32, 2, shape, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_close(w, err, sizeof err), TARTAN_EINVAL);
    tool_npy a;
    ck_assert_int_eq(open_expect(&a, p, TOOL_I32, 2, err), 0);
    ck_assert_int_eq(memcmp(a.data, rows, sizeof rows), 0);
    tool_npy_close(&a);
    ck_assert_uint_eq(fx_count_dir_entries(), 1);

    /* Bad arguments. */
    ck_assert_int_eq(tool_npy_writer_open(&w, p, TOOL_DTYPE_NONE, 2, shape, err, sizeof err),
                     TARTAN_EINVAL);
    ck_assert_int_eq(
        tool_npy_writer_open(&w, p, TOOL_F32, TOOL_NPY_MAX_RANK + 1, shape, err, sizeof err),
        TARTAN_EINVAL);
    size_t huge[2] = {SIZE_MAX / 4, SIZE_MAX / 4};
    ck_assert_int_eq(tool_npy_writer_open(&w, p, TOOL_F32, 2, huge, err, sizeof err),
                     TARTAN_ETOOBIG);
    ck_assert_int_eq(
        tool_npy_writer_open(&w, fx_path("no/such/dir.npy"), TOOL_F32, 2, shape, err, sizeof err),
        ENOENT);
    ck_assert_uint_eq(fx_count_dir_entries(), 1);
}
END_TEST

/* ---- files written by NumPy -------------------------------------------------------------- */

static int have_numpy(void)
{
    return system("python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

/* Each case: a file NumPy writes, and the same values as raw little-endian bytes (.bin). */
static const char numpy_script[] =
    "import numpy as np, sys\n"
    "d = sys.argv[1]\n"
    "rng = np.random.default_rng(int(sys.argv[2]))\n"
    "def save(name, a, version=None):\n"
    "    if version is None:\n"
    "        np.save(f'{d}/{name}.npy', a)\n"
    "    else:\n"
    "        with open(f'{d}/{name}.npy', 'wb') as f:\n"
    "            np.lib.format.write_array(f, a, version=version)\n"
    "    np.ascontiguousarray(a).tofile(f'{d}/{name}.bin')\n"
    "save('f4', rng.standard_normal((7, 5)).astype('<f4'))\n"
    "save('f2', rng.standard_normal((3, 4, 6)).astype('<f2'))\n"
    "save('i4', rng.integers(-2**31, 2**31, (11,), dtype='<i4'))\n"
    "save('i8', rng.integers(-2**62, 2**62, (2, 3), dtype='<i8'))\n"
    "save('u1', rng.integers(0, 256, (4, 4, 4, 2), dtype='|u1'))\n"
    "save('bf16', rng.integers(0, 2**16, (5, 8), dtype='<u2'))\n"
    "save('scalar', np.array(3.5, dtype='<f4'))\n"
    "save('empty', np.zeros((0, 16), dtype='<f4'))\n"
    "save('v2', rng.standard_normal((9, 3)).astype('<f4'), version=(2, 0))\n"
    "save('v3', rng.integers(0, 9, (6,), dtype='<i8'), version=(3, 0))\n"
    "save('big', rng.standard_normal((3000, 128)).astype('<f4'))\n"
    "save('fvec', np.asfortranarray(rng.standard_normal(10).astype('<f4')))\n";

static const struct {
    const char *name;
    tool_dtype t;
    int rank;
    size_t shape[4];
} numpy_cases[] = {
    {"f4", TOOL_F32, 2, {7, 5}},  {"f2", TOOL_F16, 3, {3, 4, 6}},    {"i4", TOOL_I32, 1, {11}},
    {"i8", TOOL_I64, 2, {2, 3}},  {"u1", TOOL_U8, 4, {4, 4, 4, 2}},  {"bf16", TOOL_BF16, 2, {5, 8}},
    {"scalar", TOOL_F32, 0, {0}}, {"empty", TOOL_F32, 2, {0, 16}},   {"v2", TOOL_F32, 2, {9, 3}},
    {"v3", TOOL_I64, 1, {6}},     {"big", TOOL_F32, 2, {3000, 128}}, {"fvec", TOOL_F32, 1, {10}},
};

static void run_numpy(const char *script, const char *arg2)
{
    const char *sp = fx_path("gen.py");
    fx_write_file(sp, script, strlen(script));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s' %s", sp, tmpdir, arg2);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_tools_npy_reads_numpy_files)
{
    if (!have_numpy()) {
        fprintf(stderr, "numpy not importable: NumPy-written cases skipped\n");
        return;
    }
    rng_init_random();
    char seed[32], err[512];
    snprintf(seed, sizeof seed, "%u", (unsigned)(rnd() & 0x7fffffff));
    run_numpy(numpy_script, seed);
    for (size_t i = 0; i < sizeof numpy_cases / sizeof numpy_cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.npy", numpy_cases[i].name);
        tool_npy a;
        int rc = open_expect(&a, fx_path(name), numpy_cases[i].t, numpy_cases[i].rank, err);
        ck_assert_msg(rc == 0, "%s: %s", name, err);
        size_t count = 1;
        for (int d = 0; d < numpy_cases[i].rank; d++) {
            ck_assert_uint_eq(a.shape[d], numpy_cases[i].shape[d]);
            count *= numpy_cases[i].shape[d];
        }
        ck_assert_uint_eq(a.count, count);
        snprintf(name, sizeof name, "%s.bin", numpy_cases[i].name);
        size_t blen;
        unsigned char *bin = fx_read_file(fx_path(name), &blen);
        ck_assert_uint_eq(blen, a.nbytes);
        ck_assert_int_eq(memcmp(bin, a.data, blen), 0);
        if (!strcmp(numpy_cases[i].name, "big"))
            ck_assert_int_eq(a.mapped, 1);
        free(bin);
        tool_npy_close(&a);
    }
}
END_TEST

/* NumPy reads what the writer writes, and for a known shape the bytes are np.save's own. */
static const char numpy_check_script[] =
    "import numpy as np, sys\n"
    "d = sys.argv[1]\n"
    "for name, dt, shape in [('w_f4', '<f4', (6, 7)), ('w_i8', '<i8', (5,)),\n"
    "                        ('w_f2', '<f2', (2, 3, 4)), ('w_u1', '|u1', ()),\n"
    "                        ('w_stream', '<i4', (37, 3))]:\n"
    "    a = np.load(f'{d}/{name}.npy')\n"
    "    b = np.fromfile(f'{d}/{name}.bin', dtype=dt).reshape(shape)\n"
    "    assert a.dtype == np.dtype(dt) and a.shape == shape, (name, a.dtype, a.shape)\n"
    "    assert np.array_equal(a.view('u1'), b.view('u1')), name\n"
    "    m = np.load(f'{d}/{name}.npy', mmap_mode='r')\n"
    "    assert np.array_equal(np.asarray(m).view('u1'), b.view('u1')), name\n"
    "    if name != 'w_stream':\n"
    "        np.save(f'{d}/ref.npy', b)\n"
    "        assert open(f'{d}/ref.npy', 'rb').read() == open(f'{d}/{name}.npy', 'rb').read(), "
    "name\n"
    "print('numpy agrees')\n";

START_TEST(test_tools_npy_numpy_reads_our_files)
{
    if (!have_numpy()) {
        fprintf(stderr, "numpy not importable: NumPy-reading cases skipped\n");
        return;
    }
    rng_init_random();
    char err[512];
    struct {
        const char *name;
        tool_dtype t;
        int rank;
        size_t shape[3];
    } cases[] = {
        {"w_f4", TOOL_F32, 2, {6, 7}},
        {"w_i8", TOOL_I64, 1, {5}},
        {"w_f2", TOOL_F16, 3, {2, 3, 4}},
        {"w_u1", TOOL_U8, 0, {0}},
    };
    unsigned char buf[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = tool_dtype_size(cases[i].t);
        for (int d = 0; d < cases[i].rank; d++)
            n *= cases[i].shape[d];
        fill_random(buf, n);
        /* Keep floats finite so that NaN payloads cannot make np.array_equal disagree; the
         * comparison is bytewise anyway. */
        char name[64];
        snprintf(name, sizeof name, "%s.npy", cases[i].name);
        ck_assert_msg(tool_npy_save(fx_path(name), cases[i].t, cases[i].rank, cases[i].shape, buf,
                                    err, sizeof err) == 0,
                      "%s", err);
        snprintf(name, sizeof name, "%s.bin", cases[i].name);
        fx_write_file(fx_path(name), buf, n);
    }
    /* A streamed file whose row count was unknown until the end. */
    size_t shape[2] = {TOOL_NPY_ROWS_UNKNOWN, 3};
    tool_npy_writer *w;
    ck_assert_int_eq(
        tool_npy_writer_open(&w, fx_path("w_stream.npy"), TOOL_I32, 2, shape, err, sizeof err), 0);
    int32_t rows[37 * 3];
    for (int i = 0; i < 37 * 3; i++)
        rows[i] = (int32_t)rnd();
    ck_assert_int_eq(tool_npy_writer_rows(w, rows, 30, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_rows(w, rows + 90, 7, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_close(w, err, sizeof err), 0);
    fx_write_file(fx_path("w_stream.bin"), rows, sizeof rows);
    run_numpy(numpy_check_script, "");
}
END_TEST

/* ---- hand-made bad files ------------------------------------------------------------------ */

/* A .npy file from its parts: version, a header dict written as given (no padding unless the
 * caller adds it), then len data bytes. */
static const char *make_npy(const char *name, int major, const char *dict, size_t datalen)
{
    const char *p = fx_path(name);
    size_t hl = strlen(dict), pre = major == 1 ? 10 : 12;
    unsigned char *b = calloc(1, pre + hl + datalen + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    b[8] = (unsigned char)(hl & 0xff);
    b[9] = (unsigned char)(hl >> 8);
    if (major != 1) {
        b[10] = (unsigned char)(hl >> 16);
        b[11] = (unsigned char)(hl >> 24);
    }
    memcpy(b + pre, dict, hl);
    for (size_t i = 0; i < datalen; i++)
        b[pre + hl + i] = (unsigned char)i;
    fx_write_file(p, b, pre + hl + datalen);
    free(b);
    return p;
}

/* Expects tool_npy_open to fail with code, the file's name and the phrase in the message. */
static void expect_bad(const char *path, unsigned dtypes, int min_rank, int max_rank, int code,
                       const char *phrase)
{
    char err[512];
    tool_npy a;
    memset(&a, 0x5A, sizeof a);
    memset(err, 0, sizeof err);
    int rc = tool_npy_open(&a, path, dtypes, min_rank, max_rank, err, sizeof err);
    ck_assert_msg(rc == code, "%s: got %d (%s), want %d", path, rc, err, code);
    ck_assert_msg(strstr(err, path) != NULL, "message '%s' does not name the file", err);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_ptr_null(a.data); /* left closed */
    tool_npy_close(&a);
}

#define ANY 0, 0, TOOL_NPY_MAX_RANK
#define D2 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n"

START_TEST(test_tools_npy_rejects_malformed_headers)
{
    const char *p = fx_path("text.npy");
    fx_write_file(p, "hello, world\n", 13);
    expect_bad(p, ANY, TARTAN_EFORMAT, "not a .npy file");
    fx_write_file(p, "\x93NUM", 4);
    expect_bad(p, ANY, TARTAN_ETRUNC, "truncated");
    fx_write_file(p, "", 0);
    expect_bad(p, ANY, TARTAN_ETRUNC, "truncated");
    expect_bad(make_npy("v4.npy", 4, D2, 24), ANY, TARTAN_EFORMAT, "version 4.0");

    /* Header lengths: longer than the file, and absurd (bounded before any allocation). */
    p = fx_path("hlen.npy");
    unsigned char b[64] = "\x93NUMPY\x01\x00\xff\x7f{'descr'";
    fx_write_file(p, b, 20);
    expect_bad(p, ANY, TARTAN_ETRUNC, "truncated");
    unsigned char v2[16] = "\x93NUMPY\x02\x00\xff\xff\xff\x7f{";
    fx_write_file(p, v2, 13);
    expect_bad(p, ANY, TARTAN_EFORMAT, "longer than");

    struct {
        const char *dict, *phrase;
    } bad[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), \n", "expected a quoted key"},
        {"['descr', '<f4']\n", "no '{'"},
        {"{'descr': '<f4', 'fortran_order': False}\n", "missing"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }\n", "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n", "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3), }\n", "expected ','"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': 6, }\n", "not a tuple"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }\n", "neither True nor False"},
        {"{'descr': <f4, 'fortran_order': False, 'shape': (2, 3), }\n", "descr is not a string"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }\n", "expected ','"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", "expected ':'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,3)}\n",
         "repeated key"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n", "unknown"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } junk\n", "after the closing"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3), }\n", "expected ','"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.npy", i);
        expect_bad(make_npy(name, 1, bad[i].dict, 24), ANY, TARTAN_EFORMAT, bad[i].phrase);
    }
    /* The same header in v2 and v3 files is read alike. */
    char err[512];
    tool_npy a;
    ck_assert_msg(open_expect(&a, make_npy("ok2.npy", 2, D2, 24), TOOL_F32, 2, err) == 0, "%s",
                  err);
    tool_npy_close(&a);
    ck_assert_msg(open_expect(&a, make_npy("ok3.npy", 3, D2, 24), TOOL_F32, 2, err) == 0, "%s",
                  err);
    tool_npy_close(&a);
    /* Python 2's long suffix, double quotes, no trailing comma: all valid literals. */
    ck_assert_msg(open_expect(&a,
                              make_npy("py2.npy", 1,
                                       "{\"descr\": \"<f4\", \"shape\": (2L, 3L), "
                                       "\"fortran_order\": False}   \n",
                                       24),
                              TOOL_F32, 2, err) == 0,
                  "%s", err);
    tool_npy_close(&a);
}
END_TEST

START_TEST(test_tools_npy_rejects_unsupported_layouts)
{
    expect_bad(make_npy("fortran.npy", 1,
                        "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", 24),
               ANY, TARTAN_EFORMAT, "Fortran order is not supported");
    expect_bad(
        make_npy("be.npy", 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24),
        ANY, TARTAN_EDTYPE, "big-endian");
    expect_bad(
        make_npy("f8.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }\n", 24),
        ANY, TARTAN_EDTYPE, "'<f8' is not supported");
    expect_bad(make_npy("rec.npy", 1,
                        "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }\n", 24),
               ANY, TARTAN_EDTYPE, "structured");
    /* <u2 is bfloat16 only where bfloat16 is expected. */
    const char *u2 =
        make_npy("u2.npy", 1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }\n", 24);
    expect_bad(u2, TOOL_DT(TOOL_F32) | TOOL_DT(TOOL_F16), 2, 2, TARTAN_EDTYPE, "'<u2'");
    char err[512];
    tool_npy a;
    ck_assert_msg(tool_npy_open(&a, u2, TOOL_DT_FLOATS, 2, 2, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(a.dtype, TOOL_BF16);
    tool_npy_close(&a);
    /* A Fortran-ordered vector is laid out as a C one. */
    ck_assert_msg(open_expect(&a,
                              make_npy("fvec.npy", 1,
                                       "{'descr': '<f4', 'fortran_order': True, 'shape': (6,), "
                                       "}\n",
                                       24),
                              TOOL_F32, 1, err) == 0,
                  "%s", err);
    tool_npy_close(&a);
}
END_TEST

START_TEST(test_tools_npy_rejects_unexpected_dtype_or_rank)
{
    const char *p = make_npy("ints.npy", 1,
                             "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }\n", 24);
    expect_bad(p, TOOL_DT_FLOATS, 2, 2, TARTAN_EDTYPE, "data type is int32, expected float32");
    expect_bad(p, TOOL_DT(TOOL_I64), 2, 2, TARTAN_EDTYPE, "expected int64");
    expect_bad(p, TOOL_DT_INTS, 1, 1, TARTAN_EDIM, "expected 1 dimension, found shape (2, 3)");
    expect_bad(p, TOOL_DT_INTS, 3, 4, TARTAN_EDIM, "expected 3 to 4 dimensions");
    char err[512];
    tool_npy a;
    ck_assert_int_eq(tool_npy_open(&a, p, TOOL_DT_INTS, 2, 3, err, sizeof err), 0);
    ck_assert_int_eq(a.dtype, TOOL_I32);
    tool_npy_close(&a);
    /* Argument checks. */
    ck_assert_int_eq(tool_npy_open(&a, p, 0, 3, 2, err, sizeof err), TARTAN_EINVAL);
    ck_assert_int_eq(tool_npy_open(&a, p, 0, 0, TOOL_NPY_MAX_RANK + 1, err, sizeof err),
                     TARTAN_EINVAL);
}
END_TEST

START_TEST(test_tools_npy_rejects_bad_sizes)
{
    /* Truncated data: 2 x 3 floats need 24 bytes. */
    expect_bad(make_npy("short.npy", 1, D2, 23), ANY, TARTAN_ETRUNC,
               "truncated: shape (2, 3) of float32 needs 24 data bytes, the file has 23");
    expect_bad(make_npy("long.npy", 1, D2, 25), ANY, TARTAN_EFORMAT, "1 bytes after the data");
    /* Products that overflow 64 bits, and dimensions that do not fit in one. */
    expect_bad(make_npy("ovf.npy", 1,
                        "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
                        "4294967296), }\n",
                        24),
               ANY, TARTAN_ETOOBIG, "shape (4294967296, 4294967296) of float32 is too large");
    expect_bad(
        make_npy("ovf2.npy", 1,
                 "{'descr': '<i8', 'fortran_order': False, 'shape': (4611686018427387904,), }\n",
                 24),
        ANY, TARTAN_ETOOBIG, "too large");
    expect_bad(make_npy("digits.npy", 1,
                        "{'descr': '<f4', 'fortran_order': False, 'shape': "
                        "(123456789012345678901234567890,), }\n",
                        24),
               ANY, TARTAN_ETOOBIG, "too large");
    /* Huge but representable: the file is far too short. */
    expect_bad(make_npy("huge.npy", 1,
                        "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }\n",
                        24),
               ANY, TARTAN_ETRUNC, "truncated");
    /* A zero dimension makes an empty array even beside a huge one. */
    char err[512];
    tool_npy a;
    const char *p = make_npy("zero.npy", 1,
                             "{'descr': '<f4', 'fortran_order': False, 'shape': "
                             "(0, 18446744073709551615), }\n",
                             0);
    ck_assert_msg(open_expect(&a, p, TOOL_F32, 2, err) == 0, "%s", err);
    ck_assert_uint_eq(a.count, 0);
    ck_assert_ptr_nonnull(a.data);
    tool_npy_close(&a);
    /* More dimensions than NumPy allows. */
    char dict[1024] = "{'descr': '<u1', 'fortran_order': False, 'shape': (";
    for (int i = 0; i < TOOL_NPY_MAX_RANK + 1; i++)
        strcat(dict, "1,");
    strcat(dict, "), }\n");
    expect_bad(make_npy("rank65.npy", 1, dict, 1), ANY, TARTAN_EDIM, "more than 64 dimensions");
    /* Not a file. */
    expect_bad(tmpdir, ANY, TARTAN_EFORMAT, "not a regular file");
    expect_bad(fx_path("absent.npy"), ANY, ENOENT, "No such file");
}
END_TEST

/* A large file whose data does not start at a multiple of the element size (a hand-written
 * header of odd length) is read into aligned memory rather than mapped misaligned. */
START_TEST(test_tools_npy_large_unaligned)
{
    char err[512];
    const size_t rows = 65536, cols = 5; /* 1.25 MiB of float32 */
    char dict[128] = "{'descr': '<f4', 'fortran_order': False, 'shape': (65536, 5)}";
    while ((10 + strlen(dict) + 1) % 4 == 0)
        strcat(dict, " ");
    strcat(dict, "\n");
    const char *p = make_npy("odd.npy", 1, dict, 0);
    size_t hlen = 10 + strlen(dict);
    ck_assert_uint_ne(hlen % 4, 0);
    float *v = malloc(rows * cols * sizeof *v);
    for (size_t i = 0; i < rows * cols; i++)
        v[i] = (float)i * 0.25f;
    FILE *f = fopen(p, "ab");
    ck_assert_uint_eq(fwrite(v, sizeof *v, rows * cols, f), rows * cols);
    fclose(f);
    tool_npy a;
    ck_assert_msg(open_expect(&a, p, TOOL_F32, 2, err) == 0, "%s", err);
    ck_assert_int_eq(a.mapped, 0);
    ck_assert_uint_eq((uintptr_t)a.data % 4, 0);
    ck_assert_int_eq(memcmp(a.data, v, rows * cols * sizeof *v), 0);
    tool_npy_close(&a);
    free(v);
}
END_TEST

/* Random corruption of a valid file's first bytes: the reader answers every variant with
 * success or an error and a message naming the file, and never reads out of bounds. */
START_TEST(test_tools_npy_survives_corruption)
{
    rng_init_random();
    char err[512];
    float data[12];
    for (int i = 0; i < 12; i++)
        data[i] = (float)i;
    size_t shape[2] = {3, 4};
    const char *p = fx_path("good.npy");
    ck_assert_int_eq(tool_npy_save(p, TOOL_F32, 2, shape, data, err, sizeof err), 0);
    size_t len;
    unsigned char *good = fx_read_file(p, &len);
    const char *q = fx_path("fuzz.npy");
    int ok = 0, failed = 0;
    for (int trial = 0; trial < 3000; trial++) {
        unsigned char b[256];
        memcpy(b, good, len);
        int flips = 1 + (int)rnd_below(4);
        for (int f = 0; f < flips; f++) {
            size_t at = rnd_below(64 + 8); /* the preamble, the header and some data */
            const char alphabet[] = "0123456789(),:'\"{} \nTFLx<>|=fiu";
            b[at] = rnd_below(2) ? (unsigned char)rnd()
                                 : (unsigned char)alphabet[rnd_below(sizeof alphabet - 1)];
        }
        size_t n = rnd_below(8) ? len : rnd_below(len + 1);
        fx_write_file(q, b, n);
        tool_npy a;
        memset(err, 0, sizeof err);
        int rc = tool_npy_open(&a, q, 0, 0, TOOL_NPY_MAX_RANK, err, sizeof err);
        if (rc == 0) {
            ok++;
            ck_assert_uint_le(a.nbytes, n);
            ck_assert_uint_eq(a.nbytes, a.count * tool_dtype_size(a.dtype));
            tool_npy_close(&a);
        } else {
            failed++;
            ck_assert_int_lt(rc, 0);
            ck_assert_ptr_nonnull(strstr(err, q));
        }
    }
    ck_assert_int_gt(failed, 0);
    ck_assert_int_gt(ok, 0);
    free(good);
}
END_TEST

/* The parser on a buffer exactly as long as the header: nothing past it is looked at. */
START_TEST(test_tools_npy_parse_stays_in_buffer)
{
    const char *dict = D2;
    size_t hl = strlen(dict);
    for (size_t cut = 0; cut <= 10 + hl; cut++) {
        unsigned char *b = malloc(cut ? cut : 1); /* exact size: a sanitizer sees any overrun */
        unsigned char full[128] = "\x93NUMPY\x01\x00";
        full[8] = (unsigned char)hl;
        memcpy(full + 10, dict, hl);
        memcpy(b, full, cut);
        tool_npy a;
        size_t off;
        char err[256];
        int rc = tool_npy_parse(b, cut, "buf", 0, 0, 8, &a, &off, err, sizeof err);
        if (cut == 10 + hl) {
            ck_assert_int_eq(rc, 0);
            ck_assert_uint_eq(off, 10 + hl);
            ck_assert_uint_eq(a.count, 6);
        } else {
            ck_assert_int_eq(rc, TARTAN_ETRUNC);
        }
        free(b);
    }
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"npy_roundtrip", test_tools_npy_roundtrip, 0},
        {"npy_streaming", test_tools_npy_streaming_writer, 0},
        {"npy_writer_counts", test_tools_npy_writer_refuses_wrong_counts, 0},
        {"npy_from_numpy", test_tools_npy_reads_numpy_files, 0},
        {"npy_to_numpy", test_tools_npy_numpy_reads_our_files, 0},
        {"npy_malformed", test_tools_npy_rejects_malformed_headers, 0},
        {"npy_layouts", test_tools_npy_rejects_unsupported_layouts, 0},
        {"npy_expectations", test_tools_npy_rejects_unexpected_dtype_or_rank, 0},
        {"npy_sizes", test_tools_npy_rejects_bad_sizes, 0},
        {"npy_large_unaligned", test_tools_npy_large_unaligned, 0},
        {"npy_corruption", test_tools_npy_survives_corruption, 0},
        {"npy_parse_bounds", test_tools_npy_parse_stays_in_buffer, 0},
    };
    return FX_RUN("tools-npy", cases, FX_DIR, 60);
}
