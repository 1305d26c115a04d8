/*
 * check_storage_tool.c: the tool on the on-disk index: a build in bounded memory (address-space
 * limit) and the commands' files, exit codes and messages.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "damage.h"
#include "db.h"
#include "fixture.h"
#include "fixture_storage.h"
#include "index.h"
#include "kernels.h"
#include "store.h"
#include "store_internal.h"
#include "tartan.h"

/* ---- the tool: a build in bounded memory ------------------------------------------------- */

/* Writes a 2-D float32 or 1-D int64 .npy by hand (the test's own writer). */
static void write_npy_header(FILE *f, const char *descr, const char *shape)
{
    char h[256];
    int n = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
                     shape);
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    uint16_t hl = (uint16_t)(n + pad + 1);
    fwrite(&hl, 2, 1, f);
    fwrite(h, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
}

START_TEST(test_storage_bounded_memory_build)
{
    const char *bld = getenv("top_builddir");
    char tool[512];
    snprintf(tool, sizeof tool, "%s/tartan", bld ? bld : ".");
    if (access(tool, X_OK) != 0) {
        /* Built by make before the tests; absent only when run by hand elsewhere. */
        ck_abort_msg("no tartan tool at %s", tool);
    }
    /* 24,000 documents of 16 tokens at dim 128: 196 MB of float32 written in slices. */
    const size_t ndocs = 24000, len = 16, dim = 128, rows = ndocs * len;
    char emb[400], lens[400];
    snprintf(emb, sizeof emb, "%s/emb.npy", tmpdir);
    snprintf(lens, sizeof lens, "%s/lens.npy", tmpdir);
    FILE *f = fopen(emb, "wb");
    char shape[64];
    snprintf(shape, sizeof shape, "(%zu, %zu)", rows, dim);
    write_npy_header(f, "<f4", shape);
    long hdr = ftell(f);
    fclose(f);
    /* The data through a shared mapping, as numpy.memmap writes it: the page cache then holds
     * it in large folios, which a careless reader maps far beyond the pages it touches. */
    size_t bytes = rows * dim * sizeof(float);
    int fd = open(emb, O_RDWR);
    ck_assert_int_eq(ftruncate(fd, hdr + (off_t)bytes), 0);
    uint8_t *map = mmap(NULL, hdr + bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(map, MAP_FAILED);
    float *data = (float *)(map + hdr);
    rng_state = 1600;
    make_centres(dim);
    for (size_t r = 0; r < rows; r++)
        clustered_token(data + r * dim, dim);
    munmap(map, hdr + bytes);
    close(fd);
    f = fopen(lens, "wb");
    snprintf(shape, sizeof shape, "(%zu,)", ndocs);
    write_npy_header(f, "<i8", shape);
    for (size_t i = 0; i < ndocs; i++) {
        int64_t l = (int64_t)len;
        fwrite(&l, 8, 1, f);
    }
    fclose(f);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        execl(tool, "tartan", "build", ixpath, "--embeddings", emb, "--doclens", lens, "--batch",
              "500", "--centroids", "64", "--sample", "500", "--no-calibrate", (char *)NULL);
        _exit(127);
    }
    int st;
    struct rusage ru;
    ck_assert_int_eq(wait4(pid, &st, 0, &ru), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tartan build: status %d",
                  WEXITSTATUS(st));
    /* The file is 196 MB; a build that held it (or its normalised copy, or had it mapped in)
     * would exceed this. What remains is the libraries, a batch, the sample and the map pages
     * of the index that LMDB touched. */
    long peak_kib = ru.ru_maxrss;
#if !defined(__SANITIZE_ADDRESS__)
    /* Not under AddressSanitizer: its quarantine of freed blocks and its shadow memory add
     * more than the bound itself. */
    ck_assert_msg(peak_kib < 80 * 1024, "peak RSS %ld KiB", peak_kib);
#else
    (void)peak_kib;
#endif
    tartan_db *db = reopen(TARTAN_READONLY);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, ndocs);
    ck_assert_uint_eq(info.n_tokens, rows);
    ck_assert_uint_eq(info.n_centroids, 64);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t x;
    ck_assert_int_eq(idx_reader_docno(&r, "0", &x, &m), 0);
    ck_assert_int_eq(idx_reader_docno(&r, "23999", &x, &m), 0);
    idx_reader_close(&r);
    tartan_close(db);
}
END_TEST

/* Runs the tool with args (NULL-terminated); its stderr goes to tmpdir/stderr.txt. Returns
 * the exit status. */
static int run_tool(const char *const *args)
{
    const char *bld = getenv("top_builddir");
    char tool[512], errf[400];
    snprintf(tool, sizeof tool, "%s/tartan", bld ? bld : ".");
    snprintf(errf, sizeof errf, "%s/stderr.txt", tmpdir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        int out = open("/dev/null", O_WRONLY);
        dup2(out, 1);
        execv(tool, (char *const *)args);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static char *slurp(const char *name)
{
    char p[400];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "r");
    static char buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    return buf;
}

/* A small corpus as .npy files: n documents of 3..9 tokens, dim 16; ids file of nid lines. */
static void write_corpus(const char *tag, size_t n, size_t nid, const char *idprefix)
{
    char emb[400], lens[400], ids[400], shape[64];
    snprintf(emb, sizeof emb, "%s/%s-emb.npy", tmpdir, tag);
    snprintf(lens, sizeof lens, "%s/%s-lens.npy", tmpdir, tag);
    snprintf(ids, sizeof ids, "%s/%s-ids.txt", tmpdir, tag);
    tbatch t;
    tbatch_make(&t, n, 3, 9, 16, idprefix, 0);
    FILE *f = fopen(emb, "wb");
    snprintf(shape, sizeof shape, "(%zu, 16)", t.n_rows);
    write_npy_header(f, "<f4", shape);
    fwrite(t.emb, sizeof(float), t.n_rows * 16, f);
    fclose(f);
    f = fopen(lens, "wb");
    snprintf(shape, sizeof shape, "(%zu,)", n);
    write_npy_header(f, "<i4", shape);
    for (size_t i = 0; i < n; i++) {
        int32_t l = (int32_t)t.doclens[i];
        fwrite(&l, 4, 1, f);
    }
    fclose(f);
    f = fopen(ids, "w");
    for (size_t i = 0; i < nid; i++)
        fprintf(f, "%s%zu\n", idprefix, i);
    fclose(f);
    tbatch_free(&t);
}

START_TEST(test_storage_tool_commands)
{
    rng_state = 1700;
    write_corpus("a", 300, 300, "a");
    write_corpus("b", 50, 50, "b");
    write_corpus("c", 40, 39, "c"); /* one id short */
    char emb[400], lens[400], ids[400], del[400];
#define FILES(tag)                                                                                 \
    snprintf(emb, sizeof emb, "%s/%s-emb.npy", tmpdir, tag);                                       \
    snprintf(lens, sizeof lens, "%s/%s-lens.npy", tmpdir, tag);                                    \
    snprintf(ids, sizeof ids, "%s/%s-ids.txt", tmpdir, tag)
    FILES("a");
    const char *build[] = {"tartan", "build", ixpath, "--embeddings", emb,  "--doclens",
                           lens,     "--ids", ids,    "--batch",      "64", "--centroids",
                           "32",     NULL};
    ck_assert_msg(run_tool(build) == 0, "build: %s", slurp("stderr.txt"));
    /* A second build over it is refused. */
    ck_assert_int_eq(run_tool(build), 1);
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "TARTAN_EEXIST"));
    FILES("b");
    const char *add[] = {"tartan", "add", ixpath, "--embeddings", emb, "--doclens", lens,
                         "--ids",  ids,   NULL};
    ck_assert_msg(run_tool(add) == 0, "add: %s", slurp("stderr.txt"));
    /* The same ids again: refused, then replaced. */
    ck_assert_int_eq(run_tool(add), 1);
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "TARTAN_EDUPID"));
    const char *replace[] = {"tartan", "add",   ixpath, "--embeddings", emb, "--doclens",
                             lens,     "--ids", ids,    "--replace",    NULL};
    ck_assert_int_eq(run_tool(replace), 0);
    tartan_db *db = reopen(0);
    dumpbuf before = dump_index(db);
    tartan_close(db);
    /* An ids file one line short: refused before the index is touched. */
    FILES("c");
    const char *bad[] = {"tartan", "add", ixpath, "--embeddings", emb, "--doclens", lens,
                         "--ids",  ids,   NULL};
    ck_assert_int_eq(run_tool(bad), 1);
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "has 39 ids but"));
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "TARTAN_ETRUNC"));
    db = reopen(0);
    dumpbuf after = dump_index(db);
    assert_same_dump(&before, &after);
    tartan_close(db);
    /* Delete a few. */
    snprintf(del, sizeof del, "%s/del.txt", tmpdir);
    FILE *f = fopen(del, "w");
    fprintf(f, "a1\nb7\nnot-there\n");
    fclose(f);
    const char *delete[] = {"tartan", "delete", ixpath, "--ids", del, NULL};
    ck_assert_int_eq(run_tool(delete), 0);
    ck_assert_ptr_nonnull(strstr(slurp("stderr.txt"), "deleted 2 documents (1 ids"));
    const char *info[] = {"tartan", "info", ixpath, NULL};
    ck_assert_int_eq(run_tool(info), 0);
    const char *usage[] = {"tartan", "build", ixpath, NULL};
    ck_assert_int_eq(run_tool(usage), 2);
    db = reopen(TARTAN_READONLY);
    tartan_index_info in;
    ck_assert_int_eq(tartan_info(db, &in), 0);
    ck_assert_uint_eq(in.n_docs, 348);
    ck_assert_uint_eq(in.n_centroids, 32);
    tartan_close(db);
    check_ivf_consistent(db = reopen(0));
    tartan_close(db);
#undef FILES
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"bounded_memory_build", test_storage_bounded_memory_build, 60},
        {"tool_commands", test_storage_tool_commands, 60},
    };
    return FX_RUN("storage-tool", cases, FX_DIR, 30);
}
