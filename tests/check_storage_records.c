/*
 * check_storage_records.c: the on-disk index's records: create, reopen and info, the codec's round
 * trip through LMDB at every nbits, fp16 input, adds after a build, deletes, replaces, training
 * then adding; every stored document, code and inverted list against references written from
 * storage/FORMAT.md. Real LMDB in a fresh temporary directory per test, removed after.
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

/* ---- records: documents, codes, lists and counts against references ---------------------- */

START_TEST(test_storage_create_reopen_info)
{
    rng_state = 101;
    tartan_db *db = open_new(32, 2, 16);
    tartan_index_info info;
    for (size_t i = 0; i < sizeof info; i++)
        ((uint8_t *)&info)[i] = 0xa5;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 0);
    ck_assert_uint_eq(info.n_centroids, 0);
    ck_assert_uint_eq(info.dim, 32);
    tbatch t;
    tbatch_make(&t, 60, 3, 20, 32, "doc", 0);
    add_ok(db, &t, 0);
    tartan_close(db);
    db = reopen(0);
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 60);
    ck_assert_uint_eq(info.n_tokens, t.n_rows);
    ck_assert_uint_eq(info.dim, 32);
    ck_assert_uint_eq(info.nbits, 2);
    ck_assert_uint_eq(info.n_centroids, 16);
    ck_assert_uint_eq(info.code_bytes, 2);
    ck_assert_uint_eq(info.bytes_residuals, t.n_rows * 32 * 2 / 8);
    ck_assert_uint_eq(info.bytes_codes, t.n_rows * 2);
    ck_assert_uint_eq(info.bytes_norms, t.n_rows * 4);
    ck_assert_uint_ge(info.bytes_docs, info.bytes_residuals + info.bytes_codes + info.bytes_norms);
    ck_assert_uint_gt(info.bytes_ivf, 0);
    ck_assert_uint_gt(info.ivf_entries, 59);
    ck_assert_uint_gt(info.bytes_ids, 0);
    ck_assert_uint_gt(info.bytes_file, info.bytes_docs);
    check_info_adds_up(db);
    /* Created exclusively again: refused; without EXCL: opened. */
    tartan_close(db);
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE | TARTAN_EXCL;
    o.dim = 32;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EEXIST);
    ck_assert_ptr_null(db);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "TARTAN_EEXIST"));
    o.flags = TARTAN_CREATE;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 60);
    tartan_close(db);
    tartan_close(NULL);
    tbatch_free(&t);
}
END_TEST

/* Round trip at nbits b: codes, norms and decompression against the reference, and the
 * mean cosine with the originals above a floor that grows with the bits. */
static void round_trip(unsigned nbits, double floor_cos)
{
    rng_state = 200 + nbits;
    tartan_db *db = open_new(64, nbits, 32);
    tbatch t;
    tbatch_make(&t, 40, 5, 30, 64, "r", 0);
    add_ok(db, &t, 0);
    double c = check_docs(db, &t);
    ck_assert_msg(c > floor_cos, "nbits %u: mean cosine %g", nbits, c);
    /* The same after reopening. */
    tartan_close(db);
    db = reopen(TARTAN_READONLY);
    ck_assert_double_eq_tol(check_docs(db, &t), c, 1e-12);
    tartan_close(db);
    tbatch_free(&t);
}

START_TEST(test_storage_round_trip_nbits1)
{
    round_trip(1, 0.75);
}
END_TEST

START_TEST(test_storage_round_trip_nbits2)
{
    round_trip(2, 0.9);
}
END_TEST

START_TEST(test_storage_round_trip_nbits4)
{
    round_trip(4, 0.97);
}
END_TEST

START_TEST(test_storage_round_trip_nbits8)
{
    round_trip(8, 0.97);
}
END_TEST

START_TEST(test_storage_float16_input)
{
    rng_state = 300;
    tartan_db *db = open_new(32, 2, 16);
    tbatch t;
    tbatch_make(&t, 30, 2, 12, 32, "h", 0);
    uint16_t *h = malloc(t.n_rows * 32 * sizeof *h);
    for (size_t i = 0; i < t.n_rows * 32; i++) {
        h[i] = kern_f32_to_f16(t.emb[i]);
        t.emb[i] = kern_f16_to_f32(h[i]); /* the originals are what fp16 holds */
    }
    tartan_batch b = t.b;
    b.embeddings = h;
    b.dtype = TARTAN_FLOAT16;
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
    ck_assert(check_docs(db, &t) > 0.9);
    free(h);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

START_TEST(test_storage_add_after_build)
{
    rng_state = 400;
    tartan_db *db = open_new(32, 2, 16);
    tbatch a, b;
    tbatch_make(&a, 50, 2, 15, 32, "a", 0);
    tbatch_make(&b, 70, 2, 15, 32, "b", 0);
    add_ok(db, &a, 0);
    dumpbuf before = dump_index(db);
    /* The centroids and codec stay as the first add trained them. */
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    size_t csz = (size_t)r.h.n_centroids * 32;
    float *c0 = malloc(csz * sizeof(float));
    memcpy(c0, r.centroids, csz * sizeof(float));
    idx_codec codec0 = r.codec;
    idx_reader_close(&r);
    add_ok(db, &b, 0);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert_int_eq(memcmp(c0, r.centroids, csz * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(&codec0, &r.codec, sizeof codec0), 0);
    ck_assert_uint_eq(r.h.n_docs, 120);
    ck_assert_uint_eq(r.h.n_tokens, a.n_rows + b.n_rows);
    idx_reader_close(&r);
    ck_assert(check_docs(db, &a) > 0.85);
    ck_assert(check_docs(db, &b) > 0.85);
    check_ivf_consistent(db);
    free(c0);
    free(before.p);
    tartan_close(db);
    tbatch_free(&a);
    tbatch_free(&b);
}
END_TEST

START_TEST(test_storage_delete)
{
    rng_state = 500;
    tartan_db *db = open_new(32, 2, 16);
    tbatch t;
    tbatch_make(&t, 40, 2, 10, 32, "d", 0);
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t gone[3] = {docno_of(&r, "d3"), docno_of(&r, "d17"), docno_of(&r, "d39")};
    uint32_t next0 = r.h.next_docno;
    idx_reader_close(&r);
    const char *ids[] = {"d3", "d17", "nope", "d39", "d3"};
    size_t n = 99;
    ck_assert_msg(tartan_delete(db, ids, 5, &n) == 0, "%s", tartan_errmsg(db));
    ck_assert_uint_eq(n, 3);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 37);
    ck_assert_uint_eq(info.n_tokens, t.n_rows - t.doclens[3] - t.doclens[17] - t.doclens[39]);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t x;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(idx_reader_docno(&r, ids[i == 2 ? 3 : i], &x, &m), TARTAN_ENOTFOUND);
        kern_pdoc d;
        ck_assert_int_eq(idx_reader_doc(&r, gone[i], &d, &m), TARTAN_ENOTFOUND);
        const char *id;
        size_t len;
        ck_assert_int_eq(idx_reader_name(&r, gone[i], &id, &len, &m), TARTAN_ENOTFOUND);
    }
    idx_reader_close(&r);
    check_ivf_consistent(db); /* no list names a deleted number */
    /* New documents get new numbers, above every number ever used; "d3" may come back. */
    tbatch u;
    tbatch_make(&u, 5, 2, 10, 32, "d", 3);
    free(u.ids[1]);
    u.ids[1] = strdup("fresh");
    free(u.ids[2]);
    u.ids[2] = strdup("d39x");
    free(u.ids[3]);
    u.ids[3] = strdup("new3");
    free(u.ids[4]);
    u.ids[4] = strdup("new4");
    add_ok(db, &u, 0);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert_uint_ge(docno_of(&r, "d3"), next0);
    ck_assert_uint_ne(docno_of(&r, "d3"), gone[0]);
    ck_assert_uint_eq(r.h.next_docno, next0 + 5);
    idx_reader_close(&r);
    check_ivf_consistent(db);
    ck_assert(check_docs(db, &u) > 0.85);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}
END_TEST

START_TEST(test_storage_ivf_consistent_random)
{
    rng_state = 600;
    tartan_db *db = open_new(16, 2, 8);
    size_t next = 0;
    char **live = calloc(2000, sizeof *live);
    size_t nlive = 0;
    for (int round = 0; round < 12; round++) {
        tbatch t;
        size_t n = 5 + rnd() % 25;
        tbatch_make(&t, n, 1, 12, 16, "x", next);
        next += n;
        add_ok(db, &t, 0);
        for (size_t i = 0; i < n; i++)
            live[nlive++] = strdup(t.ids[i]);
        tbatch_free(&t);
        /* Delete a random handful. */
        size_t nd = rnd() % (nlive / 2 + 1);
        const char **del = calloc(nd + 1, sizeof *del);
        for (size_t i = 0; i < nd; i++) {
            size_t j = rnd() % nlive;
            del[i] = live[j];
            live[j] = live[--nlive];
        }
        size_t got;
        ck_assert_int_eq(tartan_delete(db, del, nd, &got), 0);
        ck_assert_uint_eq(got, nd);
        for (size_t i = 0; i < nd; i++)
            free((char *)del[i]);
        free(del);
        check_ivf_consistent(db);
        tartan_index_info info;
        ck_assert_int_eq(tartan_info(db, &info), 0);
        ck_assert_uint_eq(info.n_docs, nlive);
    }
    for (size_t i = 0; i < nlive; i++)
        free(live[i]);
    free(live);
    tartan_close(db);
}
END_TEST

START_TEST(test_storage_replace)
{
    rng_state = 700;
    tartan_db *db = open_new(32, 2, 16);
    tbatch t, u;
    tbatch_make(&t, 20, 2, 10, 32, "p", 0);
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    uint32_t old = docno_of(&r, "p5");
    idx_reader_close(&r);
    /* p5 and p6 again with other tokens and lengths, plus a new one. */
    tbatch_make(&u, 3, 11, 14, 32, "p", 5);
    free(u.ids[2]);
    u.ids[2] = strdup("q");
    ck_assert_int_eq(tartan_add(db, &u.b, 0), TARTAN_EDUPID);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "'p5'"));
    add_ok(db, &u, TARTAN_REPLACE);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 21);
    ck_assert_uint_eq(info.n_tokens, t.n_rows - t.doclens[5] - t.doclens[6] + u.n_rows);
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ck_assert_uint_ne(docno_of(&r, "p5"), old);
    kern_pdoc d;
    ck_assert_int_eq(idx_reader_doc(&r, old, &d, &m), TARTAN_ENOTFOUND);
    idx_reader_close(&r);
    ck_assert(check_docs(db, &u) > 0.85); /* the new tokens, not the old */
    check_ivf_consistent(db);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}
END_TEST

START_TEST(test_storage_train_then_add)
{
    rng_state = 800;
    tartan_db *db = open_new(32, 4, 0);
    tbatch s, t;
    tbatch_make(&s, 80, 5, 10, 32, "s", 0);
    tbatch_make(&t, 30, 5, 10, 32, "t", 0);
    tartan_batch sb = s.b;
    sb.ids = NULL; /* a sample needs no ids */
    ck_assert_msg(tartan_train(db, &sb, 4096) == 0, "%s", tartan_errmsg(db));
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    /* K from the corpus size given: 2^floor(log2(16 sqrt(4096))) = 1024, at most the points
     * k-means had (95% of the sample). */
    size_t ntrain = s.n_rows - (size_t)(0.05 * s.n_rows);
    ck_assert_uint_eq(info.n_centroids, ntrain < 1024 ? ntrain : 1024);
    ck_assert_uint_eq(info.n_docs, 0);
    ck_assert_int_eq(tartan_train(db, &sb, 0), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "trained already"));
    add_ok(db, &t, 0);
    ck_assert(check_docs(db, &t) > 0.95);
    tartan_close(db);
    tbatch_free(&s);
    tbatch_free(&t);
}
END_TEST

/* Tokens are L2-normalised before encoding: a document and the same document scaled by 8
 * (exact in binary floating point) are stored identically. */
START_TEST(test_storage_tokens_normalised)
{
    rng_state = 850;
    tartan_db *db = open_new(32, 2, 16);
    tbatch t;
    tbatch_make(&t, 20, 4, 9, 32, "n", 0);
    size_t off = tbatch_off(&t, 7), len = t.doclens[7];
    /* Document 19 becomes document 7 times 8. */
    size_t off19 = tbatch_off(&t, 19);
    ck_assert_uint_ge(t.n_rows - off19, len);
    t.doclens[19] = len;
    t.n_rows = off19 + len;
    t.b.n_rows = t.n_rows;
    for (size_t i = 0; i < len * 32; i++)
        t.emb[off19 * 32 + i] = 8.0f * t.emb[off * 32 + i];
    add_ok(db, &t, 0);
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    kern_pdoc a, b;
    ck_assert_int_eq(idx_reader_doc(&r, docno_of(&r, "n7"), &a, &m), 0);
    ck_assert_int_eq(idx_reader_doc(&r, docno_of(&r, "n19"), &b, &m), 0);
    ck_assert_uint_eq(a.ntok, b.ntok);
    ck_assert_int_eq(memcmp(a.codes, b.codes, a.ntok * r.h.code_bytes), 0);
    ck_assert_int_eq(memcmp(a.residuals, b.residuals, a.ntok * r.h.token_bytes), 0);
    ck_assert_int_eq(memcmp(a.inv_norms, b.inv_norms, a.ntok * sizeof(float)), 0);
    /* And a stored token decompresses to a unit vector close to the normalised original. */
    double *ref = malloc(32 * sizeof *ref), ss = 0;
    ref_decompress(&r, &a, 0, ref);
    for (int j = 0; j < 32; j++)
        ss += ref[j] * ref[j];
    ck_assert_double_eq_tol(ss, 1.0, 1e-9);
    free(ref);
    idx_reader_close(&r);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"create_reopen_info", test_storage_create_reopen_info, 0},
        {"round_trip_nbits1", test_storage_round_trip_nbits1, 0},
        {"round_trip_nbits2", test_storage_round_trip_nbits2, 0},
        {"round_trip_nbits4", test_storage_round_trip_nbits4, 0},
        {"round_trip_nbits8", test_storage_round_trip_nbits8, 0},
        {"float16_input", test_storage_float16_input, 0},
        {"add_after_build", test_storage_add_after_build, 0},
        {"delete", test_storage_delete, 0},
        {"ivf_consistent_random", test_storage_ivf_consistent_random, 0},
        {"replace", test_storage_replace, 0},
        {"train_then_add", test_storage_train_then_add, 0},
        {"tokens_normalised", test_storage_tokens_normalised, 0},
    };
    return FX_RUN("storage-records", cases, FX_DIR, 30);
}
