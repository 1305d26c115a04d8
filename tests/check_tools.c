/*
 * check_tools.c: the tool layer's file formats: .npy reading and writing (round trips, files
 * NumPy wrote, hand-made bad files), id lists; the synthetic corpus generator's files.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "evaluate.h"
#include "idlist.h"
#include "jsonl.h"
#include "kernels.h"
#include "metrics.h"
#include "npy.h"
#include "qrels.h"
#include "synth.h"
#include "tartan.h"
#include "trec_run.h"

/* ---- fixture: a fresh temporary directory per test --------------------------------------- */

static char tmpdir[256];

static void tmp_setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/tartan-check-tools-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

static void tmp_teardown(void)
{
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static size_t count_dir_entries(void)
{
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* ---- random numbers: a fresh seed per run, printed so a failure can be replayed ------------ */

static uint64_t rng_state;

static void rng_seed(void)
{
    const char *s = getenv("TARTAN_TEST_SEED");
    rng_state = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (!rng_state)
        rng_state = 1;
    fprintf(stderr, "seed %llu\n", (unsigned long long)rng_state);
}

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t rng_below(size_t n)
{
    return (size_t)(rng() % n);
}

static void fill_random(void *buf, size_t n)
{
    unsigned char *b = buf;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)rng();
}

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
    rng_seed();
    char err[512];
    for (size_t di = 0; di < N_DTYPES; di++) {
        tool_dtype t = all_dtypes[di];
        for (int rank = 0; rank <= 5; rank++) {
            for (int trial = 0; trial < 3; trial++) {
                size_t shape[8], count = 1;
                for (int i = 0; i < rank; i++) {
                    /* One trial per dtype and rank has an empty first dimension. */
                    shape[i] = (trial == 2 && i == 0) ? 0 : 1 + rng_below(rank > 3 ? 4 : 9);
                    count *= shape[i];
                }
                size_t nbytes = count * tool_dtype_size(t);
                unsigned char *data = malloc(nbytes + 1);
                fill_random(data, nbytes);
                const char *p = tmp_path("rt.npy");
                ck_assert_msg(tool_npy_save(p, t, rank, shape, data, err, sizeof err) == 0, "%s",
                              err);
                size_t flen;
                unsigned char *file = read_file(p, &flen);
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
    rng_seed();
    char err[512];
    /* Large enough (4 MiB) that the reader maps it. */
    const size_t rows = 8192, dim = 128;
    float *data = malloc(rows * dim * sizeof *data);
    for (size_t i = 0; i < rows * dim; i++)
        data[i] = (float)((double)rng() / (double)UINT64_MAX - 0.5);
    for (int unknown = 0; unknown <= 1; unknown++) {
        const char *p = tmp_path(unknown ? "unknown.npy" : "known.npy");
        size_t shape[2] = {unknown ? TOOL_NPY_ROWS_UNKNOWN : rows, dim};
        tool_npy_writer *w;
        ck_assert_msg(tool_npy_writer_open(&w, p, TOOL_F32, 2, shape, err, sizeof err) == 0, "%s",
                      err);
        /* Nothing at the final path until close. */
        ck_assert_int_eq(access(p, F_OK), -1);
        size_t done = 0;
        while (done < rows) {
            size_t n = 1 + rng_below(1000);
            if (n > rows - done)
                n = rows - done;
            if (rng_below(8) == 0)
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
    ck_assert_uint_eq(count_dir_entries(), 2);
    free(data);
}
END_TEST

START_TEST(test_tools_npy_writer_refuses_wrong_counts)
{
    char err[512];
    int32_t rows[6] = {1, 2, 3, 4, 5, 6};
    size_t shape[2] = {2, 3};
    tool_npy_writer *w;
    const char *p = tmp_path("w.npy");

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
    ck_assert_uint_eq(count_dir_entries(), 1);

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
        tool_npy_writer_open(&w, tmp_path("no/such/dir.npy"), TOOL_F32, 2, shape, err, sizeof err),
        ENOENT);
    ck_assert_uint_eq(count_dir_entries(), 1);
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
    const char *sp = tmp_path("gen.py");
    write_file(sp, script, strlen(script));
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
    rng_seed();
    char seed[32], err[512];
    snprintf(seed, sizeof seed, "%u", (unsigned)(rng() & 0x7fffffff));
    run_numpy(numpy_script, seed);
    for (size_t i = 0; i < sizeof numpy_cases / sizeof numpy_cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.npy", numpy_cases[i].name);
        tool_npy a;
        int rc = open_expect(&a, tmp_path(name), numpy_cases[i].t, numpy_cases[i].rank, err);
        ck_assert_msg(rc == 0, "%s: %s", name, err);
        size_t count = 1;
        for (int d = 0; d < numpy_cases[i].rank; d++) {
            ck_assert_uint_eq(a.shape[d], numpy_cases[i].shape[d]);
            count *= numpy_cases[i].shape[d];
        }
        ck_assert_uint_eq(a.count, count);
        snprintf(name, sizeof name, "%s.bin", numpy_cases[i].name);
        size_t blen;
        unsigned char *bin = read_file(tmp_path(name), &blen);
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
    rng_seed();
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
        ck_assert_msg(tool_npy_save(tmp_path(name), cases[i].t, cases[i].rank, cases[i].shape, buf,
                                    err, sizeof err) == 0,
                      "%s", err);
        snprintf(name, sizeof name, "%s.bin", cases[i].name);
        write_file(tmp_path(name), buf, n);
    }
    /* A streamed file whose row count was unknown until the end. */
    size_t shape[2] = {TOOL_NPY_ROWS_UNKNOWN, 3};
    tool_npy_writer *w;
    ck_assert_int_eq(
        tool_npy_writer_open(&w, tmp_path("w_stream.npy"), TOOL_I32, 2, shape, err, sizeof err), 0);
    int32_t rows[37 * 3];
    for (int i = 0; i < 37 * 3; i++)
        rows[i] = (int32_t)rng();
    ck_assert_int_eq(tool_npy_writer_rows(w, rows, 30, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_rows(w, rows + 90, 7, err, sizeof err), 0);
    ck_assert_int_eq(tool_npy_writer_close(w, err, sizeof err), 0);
    write_file(tmp_path("w_stream.bin"), rows, sizeof rows);
    run_numpy(numpy_check_script, "");
}
END_TEST

/* ---- hand-made bad files ------------------------------------------------------------------ */

/* A .npy file from its parts: version, a header dict written as given (no padding unless the
 * caller adds it), then len data bytes. */
static const char *make_npy(const char *name, int major, const char *dict, size_t datalen)
{
    const char *p = tmp_path(name);
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
    write_file(p, b, pre + hl + datalen);
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
    const char *p = tmp_path("text.npy");
    write_file(p, "hello, world\n", 13);
    expect_bad(p, ANY, TARTAN_EFORMAT, "not a .npy file");
    write_file(p, "\x93NUM", 4);
    expect_bad(p, ANY, TARTAN_ETRUNC, "truncated");
    write_file(p, "", 0);
    expect_bad(p, ANY, TARTAN_ETRUNC, "truncated");
    expect_bad(make_npy("v4.npy", 4, D2, 24), ANY, TARTAN_EFORMAT, "version 4.0");

    /* Header lengths: longer than the file, and absurd (bounded before any allocation). */
    p = tmp_path("hlen.npy");
    unsigned char b[64] = "\x93NUMPY\x01\x00\xff\x7f{'descr'";
    write_file(p, b, 20);
    expect_bad(p, ANY, TARTAN_ETRUNC, "truncated");
    unsigned char v2[16] = "\x93NUMPY\x02\x00\xff\xff\xff\x7f{";
    write_file(p, v2, 13);
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
    expect_bad(tmp_path("absent.npy"), ANY, ENOENT, "No such file");
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
    rng_seed();
    char err[512];
    float data[12];
    for (int i = 0; i < 12; i++)
        data[i] = (float)i;
    size_t shape[2] = {3, 4};
    const char *p = tmp_path("good.npy");
    ck_assert_int_eq(tool_npy_save(p, TOOL_F32, 2, shape, data, err, sizeof err), 0);
    size_t len;
    unsigned char *good = read_file(p, &len);
    const char *q = tmp_path("fuzz.npy");
    int ok = 0, failed = 0;
    for (int trial = 0; trial < 3000; trial++) {
        unsigned char b[256];
        memcpy(b, good, len);
        int flips = 1 + (int)rng_below(4);
        for (int f = 0; f < flips; f++) {
            size_t at = rng_below(64 + 8); /* the preamble, the header and some data */
            const char alphabet[] = "0123456789(),:'\"{} \nTFLx<>|=fiu";
            b[at] = rng_below(2) ? (unsigned char)rng()
                                 : (unsigned char)alphabet[rng_below(sizeof alphabet - 1)];
        }
        size_t n = rng_below(8) ? len : rng_below(len + 1);
        write_file(q, b, n);
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

/* ---- id lists ----------------------------------------------------------------------------- */

START_TEST(test_tools_idlist_reads_ids)
{
    char err[512];
    tool_idlist l;
    const char *p = tmp_path("ids.txt");
    /* LF, CRLF, a byte order mark, and no newline at the end. */
    const char *text = "\xEF\xBB\xBF"
                       "doc-1\r\ndoc-2\ndoc_3\r\n4";
    write_file(p, text, strlen(text));
    ck_assert_msg(tool_idlist_read(&l, p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(l.n, 4);
    ck_assert_str_eq(l.ids[0], "doc-1");
    ck_assert_str_eq(l.ids[1], "doc-2");
    ck_assert_str_eq(l.ids[2], "doc_3");
    ck_assert_str_eq(l.ids[3], "4");
    ck_assert_int_eq(tool_idlist_find(&l, "doc_3"), 2);
    ck_assert_int_eq(tool_idlist_find(&l, "4"), 3);
    ck_assert_int_eq(tool_idlist_find(&l, "doc"), -1);
    tool_idlist_free(&l);
    tool_idlist_free(&l);

    /* Many ids, in order, found again. */
    FILE *f = fopen(p, "w");
    for (int i = 0; i < 50000; i++)
        fprintf(f, "id%07d\n", i * 7);
    fclose(f);
    ck_assert_int_eq(tool_idlist_read(&l, p, err, sizeof err), 0);
    ck_assert_uint_eq(l.n, 50000);
    for (int i = 0; i < 50000; i += 997) {
        char id[32];
        snprintf(id, sizeof id, "id%07d", i * 7);
        ck_assert_str_eq(l.ids[i], id);
        ck_assert_int_eq(tool_idlist_find(&l, id), i);
    }
    tool_idlist_free(&l);

    write_file(p, "", 0);
    ck_assert_int_eq(tool_idlist_read(&l, p, err, sizeof err), 0);
    ck_assert_uint_eq(l.n, 0);
    tool_idlist_free(&l);
}
END_TEST

static void expect_idlist_error(const char *text, size_t len, int code, const char *phrase)
{
    char err[512] = "";
    tool_idlist l;
    const char *p = tmp_path("bad_ids.txt");
    write_file(p, text, len);
    int rc = tool_idlist_read(&l, p, err, sizeof err);
    ck_assert_msg(rc == code, "got %d (%s), want %d", rc, err, code);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_uint_eq(l.n, 0);
    ck_assert_ptr_null(l.ids);
}

START_TEST(test_tools_idlist_rejects_bad_lines)
{
    expect_idlist_error("a\nb\n\nc\n", 7, TARTAN_EBADID, "bad_ids.txt:3: empty line");
    expect_idlist_error("a\r\n\r\n", 5, TARTAN_EBADID, "bad_ids.txt:2: empty line");
    expect_idlist_error("a\nb\nc\nb\n", 8, TARTAN_EDUPID,
                        "bad_ids.txt:4: duplicate id 'b' (first on line 2)");
    expect_idlist_error("a\nb c\n", 6, TARTAN_EBADID,
                        "bad_ids.txt:2: id 'b c' contains whitespace");
    expect_idlist_error("a\tx\n", 4, TARTAN_EBADID, ":1: id");
    expect_idlist_error("a\nb\0c\n", 6, TARTAN_EFORMAT, "bad_ids.txt:2: NUL byte");
    char err[512];
    tool_idlist l;
    ck_assert_int_eq(tool_idlist_read(&l, tmp_path("none.txt"), err, sizeof err), ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "none.txt"));
}
END_TEST

/* ---- evaluation ----------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    write_file(path, text, strlen(text));
}

/* Evaluates qrels text against run text with the measures in spec; returns the result. */
static void eval_texts(const char *qtext, const char *rtext, const char *spec, long level,
                       int complete, tool_qrels *q, tool_run *r, tool_measure **m, size_t *nm,
                       tool_eval *e)
{
    char err[512];
    write_text(tmp_path("qrels"), qtext);
    write_text(tmp_path("run"), rtext);
    ck_assert_msg(tool_qrels_read(q, tmp_path("qrels"), err, sizeof err) == 0, "%s", err);
    ck_assert_msg(tool_run_read(r, tmp_path("run"), err, sizeof err) == 0, "%s", err);
    ck_assert_msg(tool_measures_parse(spec, m, nm, err, sizeof err) == 0, "%s", err);
    tool_eval_opts o = {.level = level, .complete = complete};
    memset(e, 0xFF, sizeof *e);
    ck_assert_msg(tool_evaluate(q, r, *m, *nm, &o, e, err, sizeof err) == 0, "%s", err);
}

static double value_of(const tool_eval *e, const tool_measure *m, const char *qid, const char *name)
{
    size_t mi = 0;
    while (mi < e->nm && strcmp(m[mi].name, name))
        mi++;
    ck_assert_msg(mi < e->nm, "no measure %s", name);
    if (!qid)
        return e->mean[mi];
    for (size_t q = 0; q < e->nq; q++)
        if (!strcmp(e->qids[q], qid))
            return e->values[q * e->nm + mi];
    ck_abort_msg("query %s not scored", qid);
    return 0;
}

#define TOL 1e-12

/*
 * Query q1, judged (BEIR TSV, CRLF): d1 2, d2 1, d3 0, d4 1, d5 3 (d5 never retrieved).
 * Run: d1 0.9, d2 0.5, d3 0.5, dx 0.7, d4 0.1, ranks given in a misleading order.
 * trec_eval's order: d1 (0.9), dx (0.7), then the 0.5 tie by docid descending: d3, d2; then
 * d4. Relevance by rank: 2, unjudged, 0, 1, 1. Relevant (>= 1): d1, d2, d4, d5: 4.
 *   P_5 = 3/5; P_1 = 1; P_10 = 3/10 (a short list still divides by 10).
 *   recall_3 = 1/4; recall_5 = 3/4.
 *   map = (1/1 + 2/4 + 3/5) / 4 = 0.525; map_cut_4 = (1/1 + 2/4) / 4 = 0.375.
 *   recip_rank = 1.
 *   ndcg_cut_5: DCG = 2/log2(2) + 1/log2(5) + 1/log2(6); ideal gains 3, 2, 1, 1:
 *     IDCG = 3 + 2/log2(3) + 1/log2(4) + 1/log2(5).
 *   ndcg_cut_3: DCG = 2; IDCG = 3 + 2/log2(3) + 1/log2(4).
 * Query q2: judged, nothing relevant (d7 0): every measure 0, and it counts in the means.
 * Query q3: retrieved, never judged: not scored. Query q4: judged, never retrieved: scored
 * only with complete, as 0.
 */
static const char hand_qrels[] = "query-id\tcorpus-id\tscore\r\n"
                                 "q1\td1\t2\r\nq1\td2\t1\r\nq1\td3\t0\r\nq1\td4\t1\r\n"
                                 "q1\td5\t3\r\nq2\td7\t0\r\nq4\td1\t1\r\n";
static const char hand_run[] = "q1 Q0 d1 5 0.9 t\nq1 Q0 d2 1 0.5 t\nq1 Q0 d3 2 0.5 t\n"
                               "q1 Q0 dx 3 0.7 t\nq1 Q0 d4 4 0.1 t\n"
                               "q2 Q0 d7 1 3 t\nq2 Q0 d8 2 2 t\nq3 Q0 d1 1 1 t\n";
static const char hand_spec[] = "P.1,5,10,recall.3,5,map,map_cut.4,recip_rank,ndcg_cut.3,5";

START_TEST(test_tools_eval_hand_computed)
{
    tool_qrels q;
    tool_run r;
    tool_measure *m;
    size_t nm;
    tool_eval e;
    eval_texts(hand_qrels, hand_run, hand_spec, 1, 0, &q, &r, &m, &nm, &e);
    ck_assert_int_eq(q.format, TOOL_QRELS_BEIR);
    ck_assert_uint_eq(nm, 10);
    ck_assert_uint_eq(e.nq, 2);
    ck_assert_uint_eq(e.num_q, 2);
    ck_assert_uint_eq(e.run_only, 1);
    ck_assert_uint_eq(e.qrels_only, 1);
    ck_assert_str_eq(e.qids[0], "q1");
    ck_assert_str_eq(e.qids[1], "q2");
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "P_1"), 1.0, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "P_5"), 3.0 / 5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "P_10"), 3.0 / 10, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recall_3"), 1.0 / 4, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recall_5"), 3.0 / 4, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "map"), (1.0 + 2.0 / 4 + 3.0 / 5) / 4, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "map_cut_4"), (1.0 + 2.0 / 4) / 4, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recip_rank"), 1.0, TOL);
    double dcg5 = 2.0 + 1.0 / log2(5.0) + 1.0 / log2(6.0);
    double idcg5 = 3.0 + 2.0 / log2(3.0) + 1.0 / 2 + 1.0 / log2(5.0);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "ndcg_cut_5"), dcg5 / idcg5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "ndcg_cut_3"),
                            2.0 / (3.0 + 2.0 / log2(3.0) + 0.5), TOL);
    for (size_t i = 0; i < nm; i++) {
        ck_assert_double_eq_tol(e.values[1 * nm + i], 0.0, TOL);
        ck_assert_double_eq_tol(e.mean[i], e.values[i] / 2, TOL);
    }
    tool_eval_free(&e);
    free(m);

    /* Complete: q4 joins the means as zeros. */
    tool_measure *m2;
    size_t nm2;
    char err[512];
    ck_assert_int_eq(tool_measures_parse("P.5", &m2, &nm2, err, sizeof err), 0);
    tool_eval_opts o = {.level = 1, .complete = 1};
    ck_assert_int_eq(tool_evaluate(&q, &r, m2, nm2, &o, &e, err, sizeof err), 0);
    ck_assert_uint_eq(e.num_q, 3);
    ck_assert_double_eq_tol(e.mean[0], (3.0 / 5) / 3, TOL);
    tool_eval_free(&e);
    free(m2);
    tool_run_free(&r);
    tool_qrels_free(&q);
}
END_TEST

/*
 * Relevance level 2 on the same data (TREC qrels this time): relevant are d1 (2) and d5 (3).
 *   P_5 = 1/5; recall_5 = 1/2; map = (1/1) / 2; recip_rank = 1.
 *   nDCG's gains and ideal do not depend on the level: ndcg_cut_5 as before.
 */
START_TEST(test_tools_eval_relevance_level)
{
    static const char trec_qrels[] = "q1 0 d1 2\nq1 0 d2 1\nq1 0 d3 0\nq1 0 d4 1\nq1 0 d5 3\n"
                                     "q2 0 d7 0\nq4 0 d1 1\n";
    tool_qrels q;
    tool_run r;
    tool_measure *m;
    size_t nm;
    tool_eval e;
    eval_texts(trec_qrels, hand_run, hand_spec, 2, 0, &q, &r, &m, &nm, &e);
    ck_assert_int_eq(q.format, TOOL_QRELS_TREC);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "P_5"), 1.0 / 5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recall_5"), 1.0 / 2, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "map"), 1.0 / 2, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recip_rank"), 1.0, TOL);
    double dcg5 = 2.0 + 1.0 / log2(5.0) + 1.0 / log2(6.0);
    double idcg5 = 3.0 + 2.0 / log2(3.0) + 1.0 / 2 + 1.0 / log2(5.0);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "ndcg_cut_5"), dcg5 / idcg5, TOL);
    tool_eval_free(&e);
    free(m);
    tool_run_free(&r);
    tool_qrels_free(&q);
}
END_TEST

/*
 * Ties go to the greater docid in byte order, whatever the rank column says: "d9" > "d10"
 * (since '9' > '1'), so with equal scores d9 ranks first. Only d10 is relevant: recip_rank
 * = 1/2 (it would be 1 with ascending ties or with the rank column), recip_rank_1 = 0,
 * recip_rank_2 = 1/2. Negative scores sort below zero, and "1e-1" is read as 0.1.
 * Query b: the relevant z is third: recip_rank = 1/3, recip_rank_2 = 0, ndcg_cut_2 = 0,
 * ndcg_cut_3 = (1/log2(4)) / 1 = 1/2.
 */
START_TEST(test_tools_eval_ties_by_docid_descending)
{
    static const char qrels[] = "a 0 d10 1\na 0 d9 0\nb 0 z 1\n";
    static const char run[] = "a Q0 d10 1 0.5 t\r\na Q0 d9 2 0.5 t\r\na Q0 e 3 -1 t\r\n"
                              "b Q0 z 1 -0.5 t\r\nb Q0 y 2 1e-1 t\r\nb Q0 x 3 0 t\r\n";
    tool_qrels q;
    tool_run r;
    tool_measure *m;
    size_t nm;
    tool_eval e;
    eval_texts(qrels, run, "mrr,mrr@1,mrr@2,ndcg@2,ndcg@3", 1, 0, &q, &r, &m, &nm, &e);
    ck_assert_double_eq_tol(value_of(&e, m, "a", "recip_rank"), 0.5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "a", "recip_rank_1"), 0.0, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "a", "recip_rank_2"), 0.5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "b", "recip_rank"), 1.0 / 3, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "b", "recip_rank_2"), 0.0, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "b", "ndcg_cut_2"), 0.0, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "b", "ndcg_cut_3"), 0.5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, NULL, "recip_rank"), (0.5 + 1.0 / 3) / 2, TOL);
    tool_eval_free(&e);
    free(m);
    tool_run_free(&r);
    tool_qrels_free(&q);
}
END_TEST

/* A plain reference for random rankings: documents picked best-first by repeated scans, and
 * every measure from its textbook definition in double precision. */
static double ref_measure(const char *name, const long *rel, size_t n, const long *judged,
                          size_t nj, long level)
{
    size_t num_rel = 0;
    for (size_t i = 0; i < nj; i++)
        num_rel += judged[i] >= level;
    long k = 0;
    const char *us = strrchr(name, '_');
    if (us && us[1] >= '0' && us[1] <= '9')
        k = atol(us + 1);
    size_t lim = k && (size_t)k < n ? (size_t)k : n;
    if (!strncmp(name, "P_", 2)) {
        double c = 0;
        for (size_t i = 0; i < lim; i++)
            c += rel[i] >= level;
        return c / (double)k;
    }
    if (!strncmp(name, "recall_", 7)) {
        double c = 0;
        for (size_t i = 0; i < lim; i++)
            c += rel[i] >= level;
        return num_rel ? c / (double)num_rel : 0;
    }
    if (!strncmp(name, "map", 3)) {
        double s = 0, c = 0;
        for (size_t i = 0; i < lim; i++)
            if (rel[i] >= level)
                s += ++c / (double)(i + 1);
        return num_rel ? s / (double)num_rel : 0;
    }
    if (!strncmp(name, "recip_rank", 10)) {
        for (size_t i = 0; i < lim; i++)
            if (rel[i] >= level)
                return 1.0 / (double)(i + 1);
        return 0;
    }
    /* ndcg: the ideal ranking by selection from the judged gains. */
    long *g = malloc((nj + 1) * sizeof *g);
    size_t ng = 0;
    for (size_t i = 0; i < nj; i++)
        if (judged[i] > 0)
            g[ng++] = judged[i];
    double dcg = 0, idcg = 0;
    for (size_t i = 0; i < lim; i++)
        if (rel[i] > 0)
            dcg += (double)rel[i] / (log(i + 2.0) / log(2.0));
    size_t ilim = k && (size_t)k < ng ? (size_t)k : ng;
    for (size_t i = 0; i < ilim; i++) {
        size_t best = i;
        for (size_t j = i + 1; j < ng; j++)
            if (g[j] > g[best])
                best = j;
        long t = g[i];
        g[i] = g[best];
        g[best] = t;
        idcg += (double)g[i] / (log(i + 2.0) / log(2.0));
    }
    free(g);
    return idcg > 0 ? dcg / idcg : 0;
}

START_TEST(test_tools_eval_random_vs_reference)
{
    rng_seed();
    char err[512];
    const char *spec = "P.1,3,10,recall.2,10,map,map_cut.5,recip_rank,recip_rank.3,ndcg,"
                       "ndcg_cut.1,5,20";
    tool_measure *m;
    size_t nm;
    ck_assert_int_eq(tool_measures_parse(spec, &m, &nm, err, sizeof err), 0);
    for (int trial = 0; trial < 40; trial++) {
        long level = 1 + (long)rng_below(2);
        size_t ndocs = 1 + rng_below(40);
        /* Documents d0..d(ndocs-1); each judged or not, each retrieved or not. */
        FILE *qf = fopen(tmp_path("rq"), "w"), *rf = fopen(tmp_path("rr"), "w");
        long judged[64], jrel[64];
        double score[64];
        int retrieved[64], nj = 0;
        for (size_t d = 0; d < ndocs; d++) {
            judged[d] = rng_below(3) != 0;
            jrel[d] = (long)rng_below(5) - 1;
            retrieved[d] = rng_below(4) != 0;
            score[d] = (double)rng_below(6) / 4; /* ties */
            if (judged[d]) {
                fprintf(qf, "q 0 d%zu %ld\n", d, jrel[d]);
                nj++;
            }
            if (retrieved[d])
                fprintf(rf, "q Q0 d%zu 0 %.17g run\n", d, score[d]);
        }
        fprintf(qf, "q 0 never-retrieved 1\n");
        fprintf(rf, "q Q0 sentinel 0 -100 run\n");
        fclose(qf);
        fclose(rf);
        tool_qrels q;
        tool_run r;
        ck_assert_msg(tool_qrels_read(&q, tmp_path("rq"), err, sizeof err) == 0, "%s", err);
        ck_assert_msg(tool_run_read(&r, tmp_path("rr"), err, sizeof err) == 0, "%s", err);
        tool_eval e;
        tool_eval_opts o = {.level = level};
        ck_assert_msg(tool_evaluate(&q, &r, m, nm, &o, &e, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_eq(e.nq, 1);

        /* The reference ranking: best score first, ties to the greater name. */
        long rel[66], all_judged[66];
        size_t n = 0, nall = 0;
        int used[64] = {0};
        for (;;) {
            int best = -1;
            char bn[32], cn[32];
            for (size_t d = 0; d < ndocs; d++) {
                if (!retrieved[d] || used[d])
                    continue;
                snprintf(cn, sizeof cn, "d%zu", d);
                if (best < 0 || score[d] > score[best] ||
                    (score[d] == score[best] && strcmp(cn, bn) > 0)) {
                    best = (int)d;
                    strcpy(bn, cn);
                }
            }
            if (best < 0)
                break;
            used[best] = 1;
            rel[n++] = judged[best] ? jrel[best] : TOOL_REL_UNJUDGED;
        }
        rel[n++] = TOOL_REL_UNJUDGED; /* the sentinel, last */
        for (size_t d = 0; d < ndocs; d++)
            if (judged[d])
                all_judged[nall++] = jrel[d];
        all_judged[nall++] = 1;
        for (size_t i = 0; i < nm; i++) {
            double want = ref_measure(m[i].name, rel, n, all_judged, nall, level);
            ck_assert_msg(fabs(e.values[i] - want) < 1e-12, "%s: %.17g, reference %.17g", m[i].name,
                          e.values[i], want);
        }
        tool_eval_free(&e);
        tool_run_free(&r);
        tool_qrels_free(&q);
    }
    free(m);
}
END_TEST

START_TEST(test_tools_eval_measure_lists)
{
    char err[512];
    tool_measure *m;
    size_t n;
    ck_assert_int_eq(tool_measures_parse("ndcg_cut.10,recall.100,map,recip_rank.10,P.10", &m, &n,
                                         err, sizeof err),
                     0);
    const char *want[] = {"ndcg_cut_10", "recall_100", "map", "recip_rank_10", "P_10"};
    ck_assert_uint_eq(n, 5);
    for (size_t i = 0; i < n; i++)
        ck_assert_str_eq(m[i].name, want[i]);
    free(m);
    ck_assert_int_eq(tool_measures_parse(" nDCG@10, MRR@10 ,Recall@100,p@5,map@100,mrr,ndcg,"
                                         "P.5,10,ndcg_cut.10",
                                         &m, &n, err, sizeof err),
                     0);
    const char *want2[] = {"ndcg_cut_10", "recip_rank_10", "recall_100", "P_5",
                           "map_cut_100", "recip_rank",    "ndcg",       "P_10"};
    ck_assert_uint_eq(n, 8); /* P.5 and ndcg_cut.10 repeat earlier ones */
    for (size_t i = 0; i < n; i++)
        ck_assert_str_eq(m[i].name, want2[i]);
    ck_assert_int_eq(m[0].kind, TOOL_M_NDCG);
    ck_assert_int_eq(m[0].k, 10);
    free(m);
    struct {
        const char *spec, *phrase;
    } bad[] = {
        {"bleu", "unknown measure 'bleu'"},
        {"P", "needs a cutoff"},
        {"recall", "needs a cutoff"},
        {"ndcg_cut.0", "positive whole cutoff"},
        {"P.x", "positive whole cutoff"},
        {"10", "not a measure"},
        {"map,5", "not a measure"},
        {"", "no measure"},
        {"ndcg@-3", "positive"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = (tool_measure *)1;
        int rc = tool_measures_parse(bad[i].spec, &m, &n, err, sizeof err);
        ck_assert_msg(rc == TARTAN_EINVAL, "'%s' accepted", bad[i].spec);
        ck_assert_msg(strstr(err, bad[i].phrase) != NULL, "'%s': message '%s'", bad[i].spec, err);
        ck_assert_ptr_null(m);
    }
}
END_TEST

static void expect_qrels_error(const char *text, int code, const char *phrase)
{
    char err[512] = "";
    tool_qrels q;
    write_text(tmp_path("bad_qrels"), text);
    int rc = tool_qrels_read(&q, tmp_path("bad_qrels"), err, sizeof err);
    ck_assert_msg(rc == code, "got %d (%s), want %d", rc, err, code);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_ptr_null(q.q);
}

static void expect_run_error(const char *text, int code, const char *phrase)
{
    char err[512] = "";
    tool_run r;
    write_text(tmp_path("bad_run"), text);
    int rc = tool_run_read(&r, tmp_path("bad_run"), err, sizeof err);
    ck_assert_msg(rc == code, "got %d (%s), want %d", rc, err, code);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_ptr_null(r.q);
}

START_TEST(test_tools_eval_rejects_bad_files)
{
    expect_qrels_error("q1 d1\n", TARTAN_EFORMAT, "bad_qrels:1: 2 fields");
    expect_qrels_error("q1 0 d1 1\nq1 d2 1\n", TARTAN_EFORMAT, "bad_qrels:2: 3 fields");
    expect_qrels_error("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\tx\n", TARTAN_EFORMAT,
                       "bad_qrels:3: relevance 'x' is not an integer");
    expect_qrels_error("q1 0 d1 1.5\n", TARTAN_EFORMAT, "relevance '1.5'");
    expect_qrels_error("q1\td1\t1\nq2\td1\t1\r\n\nq1\td1\t2\n", TARTAN_EDUPID,
                       "bad_qrels:4: document 'd1' judged again for query 'q1' (first on line 1)");
    expect_qrels_error("query-id\tcorpus-id\tscore\n\n# nothing\n", TARTAN_EEMPTY, "no judgments");
    expect_qrels_error("a 0 d 1 extra\n", TARTAN_EFORMAT, "5 fields");

    expect_run_error("q Q0 d 1 0.5\n", TARTAN_EFORMAT, "bad_run:1: 5 fields");
    expect_run_error("q Q0 d 1 0.5 t x\n", TARTAN_EFORMAT, "more than 6 fields");
    expect_run_error("q Q0 d 1 0.5 t\nq Q0 e 2 high t\n", TARTAN_EFORMAT,
                     "bad_run:2: score 'high' is not a number");
    expect_run_error("q Q0 d 1 nan t\n", TARTAN_EFORMAT, "score 'nan'");
    expect_run_error("q Q0 d 1 0.5 t\nr Q0 d 1 0.5 t\nq Q0 d 2 0.1 t\n", TARTAN_EDUPID,
                     "bad_run:3: document 'd' retrieved again for query 'q' (first on line 1)");
    expect_run_error("\n\n", TARTAN_EEMPTY, "no results");

    /* No query in both files. */
    char err[512];
    tool_qrels q;
    tool_run r;
    write_text(tmp_path("q"), "a 0 d 1\n");
    write_text(tmp_path("r"), "b Q0 d 1 1 t\n");
    ck_assert_int_eq(tool_qrels_read(&q, tmp_path("q"), err, sizeof err), 0);
    ck_assert_int_eq(tool_run_read(&r, tmp_path("r"), err, sizeof err), 0);
    tool_measure m = {.kind = TOOL_M_P, .k = 1, .name = "P_1"};
    tool_eval e;
    ck_assert_int_eq(tool_evaluate(&q, &r, &m, 1, NULL, &e, err, sizeof err), TARTAN_EEMPTY);
    ck_assert_ptr_nonnull(strstr(err, "no query has both"));
    ck_assert_int_eq(tool_evaluate(&q, &r, &m, 0, NULL, &e, err, sizeof err), TARTAN_EINVAL);
    tool_run_free(&r);
    tool_qrels_free(&q);
}
END_TEST

/* What tool_run_write writes reads back to the same scores, and trec_eval's order of it is
 * the order given wherever scores differ. */
START_TEST(test_tools_run_write_reads_back)
{
    rng_seed();
    char err[512];
    const char *p = tmp_path("out.run");
    FILE *f = fopen(p, "w");
    enum { N = 300 };
    char names[N][16];
    const char *ids[N];
    double scores[N];
    float s = 50.0f;
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "doc%d", (int)rng_below(1000000) * N + i);
        ids[i] = names[i];
        /* Descending float32 scores, some only one ulp apart, some as double. */
        s = rng_below(3) ? nextafterf(s, -1e30f) : s - (float)rng_below(1000) / 7.0f;
        scores[i] = i % 5 == 0 ? (double)s - 1e-13 * (double)i : (double)s;
    }
    ck_assert_int_eq(tool_run_write(f, "query-1", ids, scores, N, "tartan"), 0);
    ck_assert_int_eq(fclose(f), 0);
    tool_run r;
    ck_assert_msg(tool_run_read(&r, p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.qids.n, 1);
    ck_assert_uint_eq(r.q[0].n, N);
    for (int i = 0; i < N; i++) {
        const tool_run_doc *d = &r.q[0].d[i];
        ck_assert_str_eq(r.docids.keys[d->doc], ids[i]);
        /* float32 scores come back as the same float, others as the same double. */
        if ((double)(float)scores[i] == scores[i])
            ck_assert_msg((float)d->score == (float)scores[i], "score %d: %.9g read as %.9g", i,
                          scores[i], d->score);
        else
            ck_assert_msg(d->score == scores[i], "score %d: %.17g read as %.17g", i, scores[i],
                          d->score);
        /* Order kept: strictly lower stays strictly lower, equal stays equal. */
        if (i > 0 && scores[i] < scores[i - 1])
            ck_assert(d->score < r.q[0].d[i - 1].score);
        if (i > 0 && scores[i] == scores[i - 1])
            ck_assert(d->score == r.q[0].d[i - 1].score);
    }
    tool_run_free(&r);

    f = fopen(p, "w");
    const char *bad_ids[] = {"a b"};
    double one = 1.0, nan_score = NAN;
    const char *good_ids[] = {"a"};
    ck_assert_int_eq(tool_run_write(f, "q", bad_ids, &one, 1, "t"), TARTAN_EBADID);
    ck_assert_int_eq(tool_run_write(f, "", good_ids, &one, 1, "t"), TARTAN_EBADID);
    ck_assert_int_eq(tool_run_write(f, "q", good_ids, &one, 1, "t t"), TARTAN_EBADID);
    ck_assert_int_eq(tool_run_write(f, "q", good_ids, &nan_score, 1, "t"), TARTAN_ENONFINITE);
    ck_assert_int_eq(ftell(f), 0); /* nothing written for a refused query */
    fclose(f);
}
END_TEST

/* ---- JSON lines ------------------------------------------------------------------------------ */

START_TEST(test_tools_jsonl_reads_ids)
{
    char err[512];
    tool_idlist l;
    const char *p = tmp_path("corpus.jsonl");
    /* Escapes and braces inside text, a nested "_id" that is not the document's, \u escapes
     * in an id (é, and U+1F600 as a surrogate pair), a numeric id, CRLF, a blank line, "_id"
     * after other members. */
    write_text(p,
               "{\"_id\": \"doc1\", \"title\": \"a \\\"quoted\\\" {brace} [x]\", \"text\": \"t\"}\n"
               "{\"text\": \"x\\\\\", \"metadata\": {\"_id\": \"inner\", \"l\": [1, -2.5e3, "
               "true, null, {}]}, \"_id\":\"caf\\u00e9\"}\r\n"
               "\r\n"
               "  {\"_id\": \"smile\\ud83d\\ude00\\/\"}  \n"
               "{\"_id\": 12345}\n");
    ck_assert_msg(tool_jsonl_ids(&l, p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(l.n, 4);
    ck_assert_str_eq(l.ids[0], "doc1");
    ck_assert_str_eq(l.ids[1], "caf\xC3\xA9");
    ck_assert_str_eq(l.ids[2], "smile\xF0\x9F\x98\x80/");
    ck_assert_str_eq(l.ids[3], "12345");
    ck_assert_int_eq(tool_idlist_find(&l, "inner"), -1);
    ck_assert_int_eq(tool_idlist_find(&l, "12345"), 3);
    tool_idlist_free(&l);
}
END_TEST

static void expect_jsonl_error(const char *text, int code, const char *phrase)
{
    char err[512] = "";
    tool_idlist l;
    write_text(tmp_path("bad.jsonl"), text);
    int rc = tool_jsonl_ids(&l, tmp_path("bad.jsonl"), err, sizeof err);
    ck_assert_msg(rc == code, "%s: got %d (%s), want %d", text, rc, err, code);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_uint_eq(l.n, 0);
}

START_TEST(test_tools_jsonl_rejects_bad_lines)
{
    const char *ok = "{\"_id\": \"a\"}\n";
    char buf[2048];
    struct {
        const char *line;
        int code;
        const char *phrase;
    } bad[] = {
        {"[\"_id\", \"b\"]", TARTAN_EFORMAT, ":2: not a JSON object"},
        {"{\"_id\": \"b\"", TARTAN_EFORMAT, ":2: malformed JSON: expected ',' or '}'"},
        {"{\"_id\" \"b\"}", TARTAN_EFORMAT, "expected ':'"},
        {"{\"_id\": \"b}", TARTAN_EFORMAT, "unterminated string"},
        {"{\"_id\": \"b\", \"t\": \"\\x\"}", TARTAN_EFORMAT, "bad escape"},
        {"{\"_id\": \"b\", \"t\": \"\\ud800\"}", TARTAN_EFORMAT, "unpaired surrogate"},
        {"{\"_id\": \"b\", \"t\": tru}", TARTAN_EFORMAT, "unexpected character"},
        {"{\"_id\": \"b\", \"t\": 1.}", TARTAN_EFORMAT, "bad number"},
        {"{\"_id\": \"b\"} x", TARTAN_EFORMAT, "text after the object"},
        {"{\"_id\": \"b\", \"_id\": \"c\"}", TARTAN_EFORMAT, "two \"_id\""},
        {"{\"id\": \"b\"}", TARTAN_EFORMAT, ":2: no \"_id\" member"},
        {"{\"_id\": null}", TARTAN_EFORMAT, "neither a string nor a number"},
        {"{\"_id\": \"\"}", TARTAN_EBADID, ":2: id '' is empty"},
        {"{\"_id\": \"b c\"}", TARTAN_EBADID, "whitespace"},
        {"{\"_id\": \"b\\u0000\"}", TARTAN_EBADID, "NUL"},
        {"{\"_id\": \"a\"}", TARTAN_EDUPID, "bad.jsonl:2: duplicate id 'a' (first on line 1)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, "%s%s\n", ok, bad[i].line);
        expect_jsonl_error(buf, bad[i].code, bad[i].phrase);
    }
    /* Deep nesting is refused, not recursed into without bound. */
    strcpy(buf, ok);
    strcat(buf, "{\"_id\": \"z\", \"t\": ");
    for (int i = 0; i < 300; i++)
        strcat(buf, "[");
    strcat(buf, "\n");
    expect_jsonl_error(buf, TARTAN_EFORMAT, "nested too deeply");
}
END_TEST

/* The real BEIR SciFact files, where shared/ sits beside the checkout: every id read, the
 * same ids as Python's json module finds, and every judged id among them. */
static const char *scifact_dir(void)
{
    static char dir[1024];
    const char *env = getenv("TARTAN_SCIFACT"), *top = getenv("top_srcdir");
    const char *cands[] = {env, "../shared/data/beir/scifact", "../../shared/data/beir/scifact"};
    for (size_t i = 0; i < 3; i++) {
        if (!cands[i])
            continue;
        if (i == 0 || !top)
            snprintf(dir, sizeof dir, "%s", cands[i]);
        else
            snprintf(dir, sizeof dir, "%s/%s", top, cands[i]);
        char probe[1100];
        snprintf(probe, sizeof probe, "%s/corpus.jsonl", dir);
        if (access(probe, R_OK) == 0)
            return dir;
    }
    return NULL;
}

START_TEST(test_tools_jsonl_scifact)
{
    const char *dir = scifact_dir();
    if (!dir) {
        fprintf(stderr, "BEIR SciFact not found: skipped\n");
        return;
    }
    char err[512], path[1200];
    tool_idlist corpus, queries;
    snprintf(path, sizeof path, "%s/corpus.jsonl", dir);
    ck_assert_msg(tool_jsonl_ids(&corpus, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(corpus.n, 5183);
    snprintf(path, sizeof path, "%s/queries.jsonl", dir);
    ck_assert_msg(tool_jsonl_ids(&queries, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_gt(queries.n, 300);
    snprintf(path, sizeof path, "%s/qrels/test.tsv", dir);
    tool_qrels q;
    ck_assert_msg(tool_qrels_read(&q, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(q.qids.n, 300);
    for (size_t i = 0; i < q.qids.n; i++)
        ck_assert_msg(tool_idlist_find(&queries, q.qids.keys[i]) >= 0, "query %s", q.qids.keys[i]);
    for (size_t i = 0; i < q.docids.n; i++)
        ck_assert_msg(tool_idlist_find(&corpus, q.docids.keys[i]) >= 0, "doc %s", q.docids.keys[i]);
    tool_qrels_free(&q);
    if (system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
        char cmd[2600];
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; [print(json.loads(l)[\"_id\"]) for l in "
                 "open(sys.argv[1], encoding=\"utf-8\") if l.strip()]' '%s/corpus.jsonl' > '%s'",
                 dir, tmp_path("py_ids.txt"));
        ck_assert_int_eq(system(cmd), 0);
        tool_idlist py;
        ck_assert_msg(tool_idlist_read(&py, tmp_path("py_ids.txt"), err, sizeof err) == 0, "%s",
                      err);
        ck_assert_uint_eq(py.n, corpus.n);
        for (size_t i = 0; i < py.n; i++)
            ck_assert_str_eq(py.ids[i], corpus.ids[i]);
        tool_idlist_free(&py);
    }
    tool_idlist_free(&corpus);
    tool_idlist_free(&queries);
}
END_TEST

/* ---- suite --------------------------------------------------------------------------------- */

/* ---- the synthetic corpus generator (synth.h, tartan gen) -------------------------------- */

/* Random but small generator parameters: any model, any dimension, short documents. */
static void synth_random_params(tool_synth_params *p)
{
    tool_synth_params_init(p);
    tool_synth_params_model(p, TOOL_SYNTH_V1 + (int)rng_below(3));
    static const size_t dims[] = {8, 33, 64, 128, 200};
    p->dim = dims[rng_below(sizeof dims / sizeof dims[0])];
    p->n_docs = 20 + rng_below(150);
    p->n_queries = 1 + rng_below(20);
    p->len_mean = 4 + rng_below(60);
    p->len_min = p->len_mean < 8 ? p->len_mean : 8;
    p->qlen = 1 + rng_below(40);
    p->seed = rng();
    if (p->model != TOOL_SYNTH_V1) {
        p->group_docs = rng_below(40);
        p->query_content = (float)rng_below(11) / 10.f;
    }
}

/* The tokens of a .npy row as doubles (float32 or float16). */
static double npy_elem(const tool_npy *a, size_t i)
{
    if (a->dtype == TOOL_F16)
        return kern_f16_to_f32(((const uint16_t *)a->data)[i]);
    return ((const float *)a->data)[i];
}

static void gen_dir(const char *name, const tool_synth_params *p, tool_dtype dt, int threads,
                    size_t *tokens)
{
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    (void)threads;
#endif
    const char *dir = tmp_path(name);
    ck_assert_int_eq(mkdir(dir, 0777), 0);
    tool_synth *s = NULL;
    ck_assert_int_eq(tool_synth_new(p, &s), 0);
    char err[4200];
    int rc = tool_synth_write(s, p, dir, dt, tokens, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    tool_synth_free(s);
}

static int files_equal(const char *a, const char *b)
{
    size_t la, lb;
    unsigned char *x = read_file(a, &la), *y = read_file(b, &lb);
    int eq = la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return eq;
}

/* The same files whatever the thread count, and the files hold what tool_synth_doc makes. */
START_TEST(test_tools_synth_deterministic_any_threads)
{
    rng_seed();
    for (int round = 0; round < 4; round++) {
        tool_synth_params p;
        synth_random_params(&p);
        tool_dtype dt = rng_below(2) ? TOOL_F16 : TOOL_F32;
        char a[32], b[32];
        snprintf(a, sizeof a, "one%d", round);
        snprintf(b, sizeof b, "many%d", round);
        size_t ta, tb;
        gen_dir(a, &p, dt, 1, &ta);
        gen_dir(b, &p, dt, 3, &tb);
        ck_assert_uint_eq(ta, tb);
        static const char *files[] = {"embeddings.npy", "doclens.npy",   "ids.txt",
                                      "queries.npy",    "query_ids.txt", "qrels.tsv"};
        for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
            char pa[600], pb[600];
            snprintf(pa, sizeof pa, "%s/%s/%s", tmpdir, a, files[f]);
            snprintf(pb, sizeof pb, "%s/%s/%s", tmpdir, b, files[f]);
            ck_assert_msg(files_equal(pa, pb), "%s differs between 1 and 3 threads", files[f]);
        }
        /* Every document's rows against tool_synth_doc (exact for float32, the nearest
         * float16 otherwise), unit norm. */
        char path[600], err[512];
        snprintf(path, sizeof path, "%s/%s/embeddings.npy", tmpdir, a);
        tool_npy e, l;
        ck_assert_int_eq(tool_npy_open(&e, path, TOOL_DT(dt), 2, 2, err, sizeof err), 0);
        snprintf(path, sizeof path, "%s/%s/doclens.npy", tmpdir, a);
        ck_assert_int_eq(tool_npy_open(&l, path, TOOL_DT(TOOL_I32), 1, 1, err, sizeof err), 0);
        ck_assert_uint_eq(e.shape[0], ta);
        ck_assert_uint_eq(e.shape[1], p.dim);
        ck_assert_uint_eq(l.shape[0], p.n_docs);
        tool_synth *s = NULL;
        ck_assert_int_eq(tool_synth_new(&p, &s), 0);
        size_t row = 0;
        for (size_t i = 0; i < p.n_docs; i++) {
            size_t n = tool_synth_doclen(s, i);
            ck_assert_int_eq(((const int32_t *)l.data)[i], (int32_t)n);
            ck_assert_uint_ge(n, p.len_min);
            float *x = malloc(n * p.dim * sizeof(float));
            for (size_t k = 0; k < n * p.dim; k++)
                x[k] = NAN;
            tool_synth_doc(s, i, x);
            for (size_t t = 0; t < n; t++) {
                double norm = 0;
                for (size_t k = 0; k < p.dim; k++) {
                    float want = x[t * p.dim + k];
                    double got = npy_elem(&e, (row + t) * p.dim + k);
                    if (dt == TOOL_F16)
                        want = kern_f16_to_f32(tool_f32_to_f16(want));
                    ck_assert_msg(got == want, "doc %zu token %zu [%zu]: %g, want %g", i, t, k, got,
                                  (double)want);
                    norm += got * got;
                }
                ck_assert_double_eq_tol(sqrt(norm), 1.0, dt == TOOL_F16 ? 2e-3 : 1e-5);
            }
            row += n;
            free(x);
        }
        ck_assert_uint_eq(row, ta);
        tool_synth_free(s);
        tool_npy_close(&e);
        tool_npy_close(&l);
    }
#ifdef _OPENMP
    omp_set_num_threads(omp_get_num_procs());
#endif
}
END_TEST

/* qrels.tsv names, for each query, the document tool_synth_query built it from; the query
 * file holds those queries; ids and query ids match. */
START_TEST(test_tools_synth_queries_and_qrels)
{
    rng_seed();
    tool_synth_params p;
    synth_random_params(&p);
    tool_dtype dt = rng_below(2) ? TOOL_F16 : TOOL_F32;
    size_t T;
    gen_dir("g", &p, dt, 2, &T);
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/g/queries.npy", tmpdir);
    tool_npy q;
    ck_assert_int_eq(tool_npy_open(&q, path, TOOL_DT(dt), 3, 3, err, sizeof err), 0);
    ck_assert_uint_eq(q.shape[0], p.n_queries);
    ck_assert_uint_eq(q.shape[1], p.qlen);
    ck_assert_uint_eq(q.shape[2], p.dim);
    tool_synth *s = NULL;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    snprintf(path, sizeof path, "%s/g/qrels.tsv", tmpdir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f)); /* header */
    float *x = malloc(p.qlen * p.dim * sizeof(float));
    for (size_t j = 0; j < p.n_queries; j++) {
        size_t qj, dj;
        ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
        ck_assert_int_eq(sscanf(line, "q%zu\tdoc%zu\t1", &qj, &dj), 2);
        size_t rel = (size_t)-1;
        for (size_t k = 0; k < p.qlen * p.dim; k++)
            x[k] = NAN;
        tool_synth_query(s, j, x, &rel);
        ck_assert_uint_eq(qj, j);
        ck_assert_uint_eq(dj, rel);
        ck_assert_uint_lt(rel, p.n_docs);
        for (size_t k = 0; k < p.qlen * p.dim; k++) {
            float want = dt == TOOL_F16 ? kern_f16_to_f32(tool_f32_to_f16(x[k])) : x[k];
            ck_assert(npy_elem(&q, j * p.qlen * p.dim + k) == want);
        }
    }
    ck_assert_ptr_null(fgets(line, sizeof line, f));
    fclose(f);
    free(x);
    /* ids.txt: doc0 .. doc{N-1}; query_ids.txt: q0 .. q{Q-1}. */
    tool_idlist ids;
    snprintf(path, sizeof path, "%s/g/ids.txt", tmpdir);
    ck_assert_int_eq(tool_idlist_read(&ids, path, err, sizeof err), 0);
    ck_assert_uint_eq(ids.n, p.n_docs);
    for (size_t i = 0; i < p.n_docs; i++) {
        char want[32];
        snprintf(want, sizeof want, "doc%zu", i);
        ck_assert_str_eq(ids.ids[i], want);
    }
    tool_idlist_free(&ids);
    tool_synth_free(s);
    tool_npy_close(&q);
}
END_TEST

/* tool_f32_to_f16 picks the nearest half (ties to even) of random floats of every range. */
START_TEST(test_tools_synth_f16_rounding)
{
    rng_seed();
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)rng();
        /* Mostly finite values in and around half's range, some of everything. */
        if (i % 4)
            bits = (bits & 0x807fffffu) | ((uint32_t)(100 + rng_below(50)) << 23);
        float f;
        memcpy(&f, &bits, sizeof f);
        uint16_t h = tool_f32_to_f16(f);
        if (isnan(f)) {
            ck_assert(isnan(kern_f16_to_f32(h)));
            continue;
        }
        double got = kern_f16_to_f32(h), x = f;
        ck_assert_msg(signbit(got) == signbit(x), "%a -> %a: sign", x, got);
        if (fabs(x) >= 65520.0) {
            ck_assert(isinf(got));
            continue;
        }
        /* Neither neighbouring half is nearer; at a tie the chosen one is even. */
        uint16_t mag = h & 0x7fffu;
        for (int dlt = -1; dlt <= 1; dlt += 2) {
            int m = (int)mag + dlt;
            if (m < 0 || m >= 0x7c00)
                continue;
            double other = kern_f16_to_f32((uint16_t)((h & 0x8000u) | (unsigned)m));
            double de = fabs(got - x), dn = fabs(other - x);
            ck_assert_msg(de < dn || (de == dn && (mag & 1u) == 0), "%a -> %a, %a nearer", x, got,
                          other);
        }
    }
}
END_TEST

/* Mean document length near --doc-len (log-normal, clipped); --fixed-len exact. */
START_TEST(test_tools_synth_doc_lengths)
{
    rng_seed();
    tool_synth_params p;
    tool_synth_params_init(&p);
    p.n_docs = 4000;
    p.len_mean = 20 + rng_below(1100);
    p.seed = rng();
    tool_synth *s = NULL;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    double sum = 0;
    for (size_t i = 0; i < p.n_docs; i++) {
        size_t n = tool_synth_doclen(s, i);
        ck_assert_uint_ge(n, p.len_min);
        ck_assert_uint_le(n, 4 * p.len_mean);
        sum += (double)n;
    }
    /* sigma 0.5 log-normal: the mean of 4000 is within 3% of len_mean (5 standard errors). */
    ck_assert_double_eq_tol(sum / (double)p.n_docs, (double)p.len_mean, 0.03 * (double)p.len_mean);
    tool_synth_free(s);
    p.len_min = p.len_max = p.len_mean;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    for (size_t i = 0; i < 100; i++)
        ck_assert_uint_eq(tool_synth_doclen(s, i), p.len_mean);
    tool_synth_free(s);
}
END_TEST

/* Model V3 has the statistics it promises, unlike V2 on the same seed: random tokens of
 * different documents share the mean direction (cosine near aniso_mean^2 = 0.36, V2 near 0),
 * and consecutive tokens are often near-duplicates (run_prob). */
START_TEST(test_tools_synth_v3_statistics)
{
    rng_seed();
    double cross[2] = {0, 0}, near_dup[2] = {0, 0};
    for (int m = 0; m < 2; m++) {
        tool_synth_params p;
        tool_synth_params_init(&p);
        tool_synth_params_model(&p, m ? TOOL_SYNTH_V3 : TOOL_SYNTH_V2);
        p.dim = 64;
        p.n_docs = 200;
        p.len_mean = 40;
        p.group_docs = 0; /* no topic groups: unrelated documents */
        p.seed = rng();
        tool_synth *s = NULL;
        ck_assert_int_eq(tool_synth_new(&p, &s), 0);
        float *a = malloc(8 * p.len_mean * p.dim * sizeof(float));
        float *b = malloc(8 * p.len_mean * p.dim * sizeof(float));
        size_t pairs = 0, runs = 0, steps = 0;
        for (size_t i = 0; i + 1 < p.n_docs; i += 2) {
            size_t na = tool_synth_doclen(s, i), nb = tool_synth_doclen(s, i + 1);
            tool_synth_doc(s, i, a);
            tool_synth_doc(s, i + 1, b);
            for (size_t t = 0; t < na && t < nb; t++, pairs++) {
                double d = 0;
                for (size_t k = 0; k < p.dim; k++)
                    d += (double)a[t * p.dim + k] * b[t * p.dim + k];
                cross[m] += d;
            }
            for (size_t t = 1; t < na; t++, steps++) {
                double d = 0;
                for (size_t k = 0; k < p.dim; k++)
                    d += (double)a[t * p.dim + k] * a[(t - 1) * p.dim + k];
                runs += d > 0.97;
            }
        }
        cross[m] /= (double)pairs;
        near_dup[m] = (double)runs / (double)steps;
        free(a);
        free(b);
        tool_synth_free(s);
    }
    ck_assert_msg(cross[0] < 0.15 && cross[1] > 0.25 && cross[1] < 0.6,
                  "mean cosine of unrelated tokens: V2 %.3f, V3 %.3f", cross[0], cross[1]);
    ck_assert_msg(near_dup[0] < 0.05 && near_dup[1] > 0.3,
                  "share of near-duplicate neighbours: V2 %.3f, V3 %.3f", near_dup[0],
                  near_dup[1]);
}
END_TEST

/* Bad parameters are refused with TARTAN_EINVAL; bad output types with TARTAN_EDTYPE. */
START_TEST(test_tools_synth_rejects_bad_params)
{
    rng_seed();
    tool_synth_params p;
    tool_synth *s = (tool_synth *)&p;
    for (int c = 0; c < 11; c++) {
        tool_synth_params_init(&p);
        p.n_docs = 10;
        switch (c) {
        case 0:
            p.dim = 0;
            break;
        case 1:
            p.model = 4;
            break;
        case 8:
            tool_synth_params_model(&p, TOOL_SYNTH_V3);
            p.aniso_mean = 1.f; /* nothing left for the subspace */
            break;
        case 9:
            tool_synth_params_model(&p, TOOL_SYNTH_V3);
            p.run_prob = NAN;
            break;
        case 10:
            tool_synth_params_model(&p, TOOL_SYNTH_V3);
            p.dim = 5000; /* above V3's dense map's limit */
            break;
        case 2:
            p.noise = NAN;
            break;
        case 3:
            p.context = -1.f;
            break;
        case 4:
            p.query_context = 1.5f;
            break;
        case 5:
            p.group_terms = NAN;
            break;
        case 6:
            p.query_content = -0.1f;
            break;
        case 7:
            p.len_min = 50;
            p.len_mean = 10;
            break;
        }
        s = (tool_synth *)&p;
        ck_assert_int_eq(tool_synth_new(&p, &s), TARTAN_EINVAL);
        ck_assert_ptr_null(s);
    }
    tool_synth_params_init(&p);
    p.n_docs = 5;
    p.n_queries = 2;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    ck_assert_int_eq(mkdir(tmp_path("bad"), 0777), 0);
    char err[4200];
    size_t T = 7;
    ck_assert_int_eq(tool_synth_write(s, &p, tmp_path("bad"), TOOL_I32, &T, err, sizeof err),
                     TARTAN_EDTYPE);
    ck_assert_uint_eq(T, 0);
    ck_assert_uint_eq(count_dir_entries(), 1); /* only the empty "bad" */
    /* A directory that does not exist: an error naming the file, no crash. */
    ck_assert_int_ne(tool_synth_write(s, &p, tmp_path("absent"), TOOL_F32, &T, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "absent"));
    tool_synth_free(s);
}
END_TEST

static Suite *tools_suite(void)
{
    Suite *s = suite_create("tools");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"npy_roundtrip", test_tools_npy_roundtrip},
        {"npy_streaming", test_tools_npy_streaming_writer},
        {"npy_writer_counts", test_tools_npy_writer_refuses_wrong_counts},
        {"npy_from_numpy", test_tools_npy_reads_numpy_files},
        {"npy_to_numpy", test_tools_npy_numpy_reads_our_files},
        {"npy_malformed", test_tools_npy_rejects_malformed_headers},
        {"npy_layouts", test_tools_npy_rejects_unsupported_layouts},
        {"npy_expectations", test_tools_npy_rejects_unexpected_dtype_or_rank},
        {"npy_sizes", test_tools_npy_rejects_bad_sizes},
        {"npy_large_unaligned", test_tools_npy_large_unaligned},
        {"npy_corruption", test_tools_npy_survives_corruption},
        {"npy_parse_bounds", test_tools_npy_parse_stays_in_buffer},
        {"idlist_reads", test_tools_idlist_reads_ids},
        {"idlist_errors", test_tools_idlist_rejects_bad_lines},
        {"eval_hand_computed", test_tools_eval_hand_computed},
        {"eval_level", test_tools_eval_relevance_level},
        {"eval_ties", test_tools_eval_ties_by_docid_descending},
        {"eval_reference", test_tools_eval_random_vs_reference},
        {"eval_measure_lists", test_tools_eval_measure_lists},
        {"eval_bad_files", test_tools_eval_rejects_bad_files},
        {"run_write", test_tools_run_write_reads_back},
        {"jsonl_ids", test_tools_jsonl_reads_ids},
        {"jsonl_errors", test_tools_jsonl_rejects_bad_lines},
        {"jsonl_scifact", test_tools_jsonl_scifact},
        {"synth_threads", test_tools_synth_deterministic_any_threads},
        {"synth_qrels", test_tools_synth_queries_and_qrels},
        {"synth_f16", test_tools_synth_f16_rounding},
        {"synth_lengths", test_tools_synth_doc_lengths},
        {"synth_v3_statistics", test_tools_synth_v3_statistics},
        {"synth_bad_params", test_tools_synth_rejects_bad_params},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tools_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
