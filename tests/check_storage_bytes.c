/*
 * check_storage_bytes.c: the stored bytes: blob alignment, checksums that catch damage, CRC32C
 * against its reference values, long inverted lists, snapshots isolated from a concurrent writer,
 * error messages kept per handle.
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

/* ---- the stored bytes: alignment, checksums, long inverted lists -------------------------- */

START_TEST(test_storage_blob_alignment)
{
    rng_state = 1000;
    tartan_db *db = open_new(24, 1, 8); /* 3-byte residuals: odd sizes everywhere */
    char **ids = NULL;
    size_t nids = 0;
    for (int round = 0; round < 6; round++) {
        tbatch t;
        tbatch_make(&t, 60, 1, 300, 24, "al", (size_t)round * 60);
        add_ok(db, &t, 0);
        ids = realloc(ids, (nids + 60) * sizeof *ids);
        for (size_t i = 0; i < 60; i++)
            ids[nids++] = strdup(t.ids[i]);
        tbatch_free(&t);
        const char *del[20];
        for (int i = 0; i < 20; i++)
            del[i] = ids[rnd() % nids];
        ck_assert_int_eq(tartan_delete(db, del, 20, NULL), 0);
    }
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    store_cursor *cur = NULL;
    uint32_t docno;
    kern_pdoc d;
    int rc, n = 0;
    while ((rc = idx_reader_next_doc(&r, &cur, &docno, &d, &m)) == 1) {
        ck_assert_uint_eq((uintptr_t)d.inv_norms % 4, 0);
        ck_assert_uint_eq((uintptr_t)d.codes % 2, 0);
        n++;
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_int_gt(n, 100);
    ck_assert_uint_eq((uintptr_t)r.centroids % 4, 0);
    idx_reader_close(&r);
    for (size_t i = 0; i < nids; i++)
        free(ids[i]);
    free(ids);
    tartan_close(db);
}
END_TEST

START_TEST(test_storage_checksum_detects_damage)
{
    rng_state = 1100;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t;
    tbatch_make(&t, 10, 3, 8, 16, "c", 0);
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t victim = docno_of(&r, "c4");
    idx_reader_close(&r);
    tartan_close(db);
    /* Flip one residual bit of c4 in the file, behind the library's back. */
    db = reopen(TARTAN_READONLY);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    kern_pdoc rd;
    ck_assert_int_eq(idx_reader_doc(&r, victim, &rd, &m), 0);
    long at = damage_offset(r.txn, rd.residuals + 3);
    idx_reader_close(&r);
    tartan_close(db);
    damage_flip(ixpath, at, 0x10);
    db = reopen(0);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    kern_pdoc pd;
    ck_assert_int_eq(idx_reader_doc(&r, victim, &pd, &m), TARTAN_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(m.text, "checksum"));
    ck_assert_int_eq(idx_reader_doc(&r, victim - 1, &pd, &m), 0);
    r.verify = 0;
    ck_assert_int_eq(idx_reader_doc(&r, victim, &pd, &m), 0);
    idx_reader_close(&r);
    /* Deleting the damaged document refuses rather than guessing its codes. */
    const char *ids[] = {"c4"};
    ck_assert_int_eq(tartan_delete(db, ids, 1, NULL), TARTAN_ECORRUPT);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

START_TEST(test_storage_crc32c)
{
    /* The standard check value of CRC-32C. */
    ck_assert_uint_eq(store_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(store_crc32c_portable(0, "123456789", 9), 0xE3069283u);
    rng_state = 1200;
    uint8_t buf[1031];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rnd();
    for (size_t off = 0; off < 9; off++) {
        size_t n = sizeof buf - off;
        /* Bit by bit, the definition. */
        uint32_t c = 0xffffffffu;
        for (size_t i = off; i < sizeof buf; i++) {
            c ^= buf[i];
            for (int k = 0; k < 8; k++)
                c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        }
        c = ~c;
        ck_assert_uint_eq(store_crc32c(0, buf + off, n), c);
        ck_assert_uint_eq(store_crc32c_portable(0, buf + off, n), c);
        /* Continued in two pieces. */
        ck_assert_uint_eq(store_crc32c(store_crc32c(0, buf + off, 100), buf + off + 100, n - 100),
                          c);
    }
}
END_TEST

START_TEST(test_storage_long_inverted_lists)
{
    rng_state = 1300;
    tartan_db *db = open_new(16, 2, 2); /* 2 centroids: lists of thousands, many pages */
    tbatch t;
    tbatch_make(&t, 3000, 1, 4, 16, "l", 0);
    add_ok(db, &t, 0);
    check_ivf_consistent(db);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    size_t total = 0, runs = 0;
    for (uint32_t c = 0; c < 2; c++) {
        store_ivf_iter *it;
        ck_assert_int_eq(idx_reader_ivf_open(&r, c, &it, &m), 0);
        const uint32_t *v;
        size_t n, cnt;
        while (store_ivf_next(it, &v, &n, &m) == 1) {
            total += n;
            runs++;
        }
        store_ivf_close(it);
        ck_assert_int_eq(store_ivf_count(r.txn, c, &cnt, &m), 0);
    }
    ck_assert_uint_ge(total, 3000);
    check_info_adds_up(db);
    ck_assert_uint_gt(runs, 2); /* more than a page per list: several runs */
    idx_reader_close(&r);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

/* A reader sees one snapshot while another thread adds. */
typedef struct adder {
    tartan_db *db;
    tbatch *t;
    int rc;
} adder;

static void *add_thread(void *p)
{
    adder *a = p;
    a->rc = tartan_add(a->db, &a->t->b, 0);
    return NULL;
}

START_TEST(test_storage_snapshot_isolation)
{
    rng_state = 1400;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t, u;
    tbatch_make(&t, 20, 2, 6, 16, "s", 0);
    tbatch_make(&u, 20, 2, 6, 16, "u", 0);
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    adder a = {db, &u, -1};
    pthread_t th;
    pthread_create(&th, NULL, add_thread, &a);
    pthread_join(th, NULL);
    ck_assert_int_eq(a.rc, 0);
    uint32_t x;
    ck_assert_int_eq(idx_reader_docno(&r, "u3", &x, &m), TARTAN_ENOTFOUND);
    ck_assert_uint_eq(r.h.n_docs, 20);
    idx_reader_close(&r);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert_int_eq(idx_reader_docno(&r, "u3", &x, &m), 0);
    idx_reader_close(&r);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}
END_TEST

START_TEST(test_storage_errmsg_per_handle)
{
    rng_state = 1500;
    tartan_db *a = open_new(16, 2, 8);
    char other[400];
    snprintf(other, sizeof other, "%s/second", tmpdir);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = 16;
    tartan_db *b;
    ck_assert_int_eq(tartan_open(other, &o, &b), 0);
    ck_assert_str_eq(tartan_errmsg(a), "TARTAN_OK: no error");
    ck_assert_int_eq(tartan_add(a, NULL, 0), TARTAN_EINVAL);
    ck_assert_int_eq(strncmp(tartan_errmsg(a), "TARTAN_EINVAL: ", 15), 0);
    ck_assert_str_eq(tartan_errmsg(b), "TARTAN_OK: no error");
    tartan_close(a);
    tartan_close(b);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"blob_alignment", test_storage_blob_alignment, 0},
        {"checksum_detects_damage", test_storage_checksum_detects_damage, 0},
        {"crc32c", test_storage_crc32c, 0},
        {"long_inverted_lists", test_storage_long_inverted_lists, 0},
        {"snapshot_isolation", test_storage_snapshot_isolation, 0},
        {"errmsg_per_handle", test_storage_errmsg_per_handle, 0},
    };
    return FX_RUN("storage-bytes", cases, FX_DIR, 30);
}
