/*
 * check_storage_errors.c: what the on-disk index refuses: each kind of bad input gets its code and
 * message and leaves the index byte-identical; bad arguments, read-only handles, open errors,
 * unknown format versions, read-only directories; and the map growing as the index does.
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

/* ---- bad input: each gets its code and message, and the index stays byte-identical ------ */

typedef void (*spoil_fn)(tbatch *t, tartan_batch *b);

static void bad_input(spoil_fn spoil, int want, const char *msg_part, unsigned flags)
{
    rng_state = 900;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t, u;
    tbatch_make(&t, 10, 2, 6, 16, "ok", 0);
    add_ok(db, &t, 0);
    dumpbuf before = dump_index(db);
    tbatch_make(&u, 6, 2, 6, 16, "in", 0);
    tartan_batch b = u.b;
    spoil(&u, &b);
    int rc = tartan_add(db, &b, flags);
    ck_assert_msg(rc == want, "got %s (%s), want %s", tartan_err_name(rc), tartan_errmsg(db),
                  tartan_err_name(want));
    const char *msg = tartan_errmsg(db);
    ck_assert_msg(strncmp(msg, tartan_err_name(want), strlen(tartan_err_name(want))) == 0,
                  "message '%s'", msg);
    ck_assert_msg(strstr(msg, msg_part), "message '%s' lacks '%s'", msg, msg_part);
    dumpbuf after = dump_index(db);
    assert_same_dump(&before, &after);
    /* And the same after reopening: nothing reached the disk either. */
    tartan_close(db);
    db = reopen(0);
    after = dump_index(db);
    before = after;
    before.p = malloc(after.n);
    memcpy(before.p, after.p, after.n);
    assert_same_dump(&before, &after);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}

static void spoil_dim(tbatch *t, tartan_batch *b)
{
    b->dim = 15;
    b->n_rows = t->n_rows * 16 / 15;
}
static void spoil_nan(tbatch *t, tartan_batch *b)
{
    size_t off = tbatch_off(t, 4);
    t->emb[(off + 1) * 16 + 7] = NAN;
}
static void spoil_inf(tbatch *t, tartan_batch *b)
{
    t->emb[tbatch_off(t, 5) * 16 + 3] = -INFINITY;
}
static void spoil_empty_doc(tbatch *t, tartan_batch *b)
{
    t->doclens[2] = 0;
}
static void spoil_sum(tbatch *t, tartan_batch *b)
{
    b->n_rows = t->n_rows - 1;
}
static void spoil_dup_batch(tbatch *t, tartan_batch *b)
{
    free(t->ids[4]);
    t->ids[4] = strdup("in1");
}
static void spoil_dup_index(tbatch *t, tartan_batch *b)
{
    /* The last document: the earlier ones are written in the transaction before the clash. */
    free(t->ids[5]);
    t->ids[5] = strdup("ok7");
}
static void spoil_empty_id(tbatch *t, tartan_batch *b)
{
    free(t->ids[3]);
    t->ids[3] = strdup("");
}
static void spoil_ctrl_id(tbatch *t, tartan_batch *b)
{
    free(t->ids[3]);
    t->ids[3] = strdup("a\nb");
}
static void spoil_zero(tbatch *t, tartan_batch *b)
{
    memset(t->emb + tbatch_off(t, 1) * 16, 0, 16 * sizeof(float));
}
static void spoil_dtype(tbatch *t, tartan_batch *b)
{
    b->dtype = (tartan_dtype)7;
}
static void spoil_long_doc(tbatch *t, tartan_batch *b)
{
    t->doclens[0] = STORE_MAX_DOC_TOKENS + 1;
}

START_TEST(test_storage_bad_dim)
{
    bad_input(spoil_dim, TARTAN_EDIM, "dimension 15", 0);
}
END_TEST
START_TEST(test_storage_bad_nan)
{
    bad_input(spoil_nan, TARTAN_ENONFINITE, "document 4 (id 'in4'): token 1 has NaN at dimension 7",
              0);
}
END_TEST
START_TEST(test_storage_bad_inf)
{
    bad_input(spoil_inf, TARTAN_ENONFINITE, "document 5 (id 'in5'): token 0 has infinity", 0);
}
END_TEST
START_TEST(test_storage_bad_empty_document)
{
    bad_input(spoil_empty_doc, TARTAN_EEMPTY, "document 2 (id 'in2') has no tokens", 0);
}
END_TEST
START_TEST(test_storage_bad_doclens_sum)
{
    bad_input(spoil_sum, TARTAN_EINVAL, "doclens sum to", 0);
}
END_TEST
START_TEST(test_storage_bad_duplicate_in_batch)
{
    bad_input(spoil_dup_batch, TARTAN_EDUPID, "documents 1 and 4 have the same id 'in1'", 0);
}
END_TEST
START_TEST(test_storage_bad_duplicate_in_index)
{
    bad_input(spoil_dup_index, TARTAN_EDUPID, "document 5 (id 'ok7')", 0);
}
END_TEST
START_TEST(test_storage_bad_empty_id)
{
    bad_input(spoil_empty_id, TARTAN_EBADID, "document 3: empty id", 0);
}
END_TEST
START_TEST(test_storage_bad_control_id)
{
    bad_input(spoil_ctrl_id, TARTAN_EBADID, "control character", TARTAN_REPLACE);
}
END_TEST
START_TEST(test_storage_bad_zero_token)
{
    bad_input(spoil_zero, TARTAN_ERANGE, "document 1 (id 'in1'): token 0 is all zeros", 0);
}
END_TEST
START_TEST(test_storage_bad_dtype)
{
    bad_input(spoil_dtype, TARTAN_EDTYPE, "dtype 7", 0);
}
END_TEST
START_TEST(test_storage_bad_long_document)
{
    bad_input(spoil_long_doc, TARTAN_ETOOBIG, "document 0 (id 'in0') has 1048577 tokens", 0);
}
END_TEST

START_TEST(test_storage_bad_arguments)
{
    rng_state = 950;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t;
    tbatch_make(&t, 10, 2, 6, 16, "ok", 0);
    add_ok(db, &t, 0);
    dumpbuf before = dump_index(db);
    ck_assert_int_eq(tartan_add(db, NULL, 0), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_add(db, &t.b, 0x80), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_add(NULL, &t.b, 0), TARTAN_EINVAL);
    tartan_batch b = t.b;
    b.ids = NULL;
    ck_assert_int_eq(tartan_add(db, &b, 0), TARTAN_EINVAL);
    b = t.b;
    b.n_docs = 0;
    ck_assert_int_eq(tartan_add(db, &b, 0), TARTAN_EEMPTY);
    const char *bad[] = {"ok1", ""};
    size_t n = 7;
    ck_assert_int_eq(tartan_delete(db, bad, 2, &n), TARTAN_EBADID);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(tartan_delete(db, NULL, 3, &n), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_info(db, NULL), TARTAN_EINVAL);
    /* Deleting nothing that exists changes nothing either. */
    const char *none[] = {"zz"};
    ck_assert_int_eq(tartan_delete(db, none, 1, &n), 0);
    ck_assert_uint_eq(n, 0);
    dumpbuf after = dump_index(db);
    assert_same_dump(&before, &after);
    tartan_close(db);
    tbatch_free(&t);
}
END_TEST

START_TEST(test_storage_readonly_handle)
{
    rng_state = 960;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t;
    tbatch_make(&t, 10, 2, 6, 16, "ok", 0);
    add_ok(db, &t, 0);
    dumpbuf before = dump_index(db);
    tartan_close(db);
    db = reopen(TARTAN_READONLY);
    tbatch u;
    tbatch_make(&u, 3, 2, 6, 16, "ro", 0);
    ck_assert_int_eq(tartan_add(db, &u.b, 0), TARTAN_EREADONLY);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "read-only"));
    const char *ids[] = {"ok1"};
    ck_assert_int_eq(tartan_delete(db, ids, 1, NULL), TARTAN_EREADONLY);
    ck_assert_int_eq(tartan_train(db, &u.b, 0), TARTAN_EREADONLY);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 10);
    dumpbuf after = dump_index(db);
    assert_same_dump(&before, &after);
    tartan_close(db);
    tbatch_free(&t);
    tbatch_free(&u);
}
END_TEST

/* ---- opening: errors, versions, permissions --------------------------------------------- */

START_TEST(test_storage_open_errors)
{
    tartan_db *db = (tartan_db *)1;
    tartan_options o;
    tartan_options_init(&o);
    /* No directory. */
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), ENOENT);
    ck_assert_ptr_null(db);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), ixpath));
    ck_assert_int_eq(strncmp(tartan_errmsg(NULL), "ENOENT: ", 8), 0);
    /* An empty directory. */
    ck_assert_int_eq(mkdir(ixpath, 0755), 0);
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_ENOINDEX);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "TARTAN_ENOINDEX"));
    /* Creating without a dimension, or with bad nbits. */
    o.flags = TARTAN_CREATE;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    o.dim = 12;
    o.nbits = 3;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    o.nbits = 1;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL); /* 12 bits: not bytes */
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "multiple of 8"));
    o.nbits = 2;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tartan_close(db);
    /* A different dimension when opening. */
    tartan_options_init(&o);
    o.dim = 16;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EDIM);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(NULL), "dimension 12"));
    /* A file, not a directory. */
    char file[400];
    snprintf(file, sizeof file, "%s/afile", tmpdir);
    FILE *f = fopen(file, "w");
    fclose(f);
    o.dim = 0;
    ck_assert_int_eq(tartan_open(file, &o, &db), ENOTDIR);
    /* Another program's LMDB environment. */
    char other[400];
    snprintf(other, sizeof other, "%s/other", tmpdir);
    mkdir(other, 0755);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    mdb_env_create(&env);
    ck_assert_int_eq(mdb_env_open(env, other, 0, 0644), 0);
    mdb_txn_begin(env, NULL, 0, &txn);
    mdb_dbi_open(txn, NULL, 0, &dbi);
    MDB_val k = {3, "key"}, v = {5, "value"};
    mdb_put(txn, dbi, &k, &v, 0);
    mdb_txn_commit(txn);
    mdb_env_close(env);
    o.flags = TARTAN_CREATE;
    o.dim = 8;
    ck_assert_int_eq(tartan_open(other, &o, &db), TARTAN_ENOINDEX);
    ck_assert_int_eq(tartan_open(NULL, &o, &db), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_open(ixpath, &o, NULL), TARTAN_EINVAL);
    o.flags = 0x100;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
}
END_TEST

/* Writes format version v into an index's meta "format" with plain LMDB, as a build of that
 * version would (FORMAT.md: magic, version, CRC-32C). */
static void set_version(uint32_t v)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    mdb_env_create(&env);
    mdb_env_set_maxdbs(env, 8);
    ck_assert_int_eq(mdb_env_open(env, ixpath, 0, 0644), 0);
    ck_assert_int_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    ck_assert_int_eq(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    MDB_val k = {6, "format"}, d;
    ck_assert_int_eq(mdb_get(txn, dbi, &k, &d), 0);
    ck_assert_uint_eq(d.mv_size, 16);
    uint8_t buf[16];
    memcpy(buf, d.mv_data, 16);
    memcpy(buf + 8, &v, 4);
    uint32_t c = store_meta_crc("format", 6, buf, 12);
    memcpy(buf + 12, &c, 4);
    d.mv_data = buf;
    ck_assert_int_eq(mdb_put(txn, dbi, &k, &d, 0), 0);
    ck_assert_int_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

START_TEST(test_storage_unknown_version_refused)
{
    tartan_db *db = open_new(16, 2, 8);
    tartan_close(db);
    set_version(STORE_FORMAT_VERSION + 98);
    tartan_options o;
    tartan_options_init(&o);
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EVERSION);
    ck_assert_ptr_null(db);
    const char *msg = tartan_errmsg(NULL);
    char want[32];
    snprintf(want, sizeof want, "version %u", STORE_FORMAT_VERSION + 98);
    ck_assert_msg(strstr(msg, "TARTAN_EVERSION") && strstr(msg, want) &&
                      strstr(msg, "versions 2 to 3"),
                  "message '%s'", msg);
    o.flags = TARTAN_READONLY;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EVERSION);
    set_version(STORE_FORMAT_VERSION);
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tartan_close(db);
    /* Version 3 (version 2 with codec extension records) opens too. */
    set_version(STORE_FORMAT_MAX);
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tartan_close(db);
}
END_TEST

/* In a child process: without write permission to the index directory, a read-write open is
 * refused (EACCES) and a read-only one works. Root drops to nobody to lose the permission. */
START_TEST(test_storage_readonly_directory)
{
    rng_state = 970;
    tartan_db *db = open_new(16, 2, 8);
    tbatch t;
    tbatch_make(&t, 8, 2, 6, 16, "ok", 0);
    add_ok(db, &t, 0);
    tartan_close(db);
    tbatch_free(&t);
    ck_assert_int_eq(chmod(tmpdir, 0755), 0);
    char lock[400], data[400];
    snprintf(lock, sizeof lock, "%s/lock.mdb", ixpath);
    snprintf(data, sizeof data, "%s/data.mdb", ixpath);
    ck_assert_int_eq(chmod(lock, 0444), 0);
    ck_assert_int_eq(chmod(data, 0444), 0);
    ck_assert_int_eq(chmod(ixpath, 0555), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(10);
        tartan_options o;
        tartan_options_init(&o);
        tartan_db *d = NULL;
        if (tartan_open(ixpath, &o, &d) != EACCES)
            _exit(11);
        if (!strstr(tartan_errmsg(NULL), "read-only"))
            _exit(12);
        o.flags = TARTAN_READONLY;
        if (tartan_open(ixpath, &o, &d) != 0)
            _exit(13);
        tartan_index_info info;
        if (tartan_info(d, &info) != 0 || info.n_docs != 8)
            _exit(14);
        const char *ids[] = {"ok1"};
        if (tartan_delete(d, ids, 1, NULL) != TARTAN_EREADONLY)
            _exit(15);
        tartan_close(d);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", WEXITSTATUS(st));
}
END_TEST

START_TEST(test_storage_map_growth)
{
    rng_state = 980;
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = 64;
    o.nbits = 8;
    o.n_centroids = 8;
    o.map_size = 256 << 10; /* 256 KiB: far less than the batches below */
    tartan_db *db;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tbatch a, b;
    tbatch_make(&a, 300, 20, 40, 64, "g", 0); /* ~2.2 MB of documents */
    tbatch_make(&b, 300, 20, 40, 64, "h", 0);
    add_ok(db, &a, 0);
    add_ok(db, &b, 0);
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    ck_assert_uint_eq(info.n_docs, 600);
    ck_assert_uint_gt(info.map_size, 256 << 10);
    ck_assert_uint_ge(info.map_size, info.bytes_file);
    check_info_adds_up(db);
    check_ivf_consistent(db);
    ck_assert(check_docs(db, &b) > 0.97);
    /* A reopen with the small size asked again adopts the file's size. */
    tartan_close(db);
    o.flags = 0;
    o.dim = 0;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), 0);
    tbatch c;
    tbatch_make(&c, 100, 20, 40, 64, "i", 0);
    add_ok(db, &c, 0);
    ck_assert(check_docs(db, &a) > 0.97);
    tartan_close(db);
    tbatch_free(&a);
    tbatch_free(&b);
    tbatch_free(&c);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"bad_dim", test_storage_bad_dim, 0},
        {"bad_nan", test_storage_bad_nan, 0},
        {"bad_inf", test_storage_bad_inf, 0},
        {"bad_empty_document", test_storage_bad_empty_document, 0},
        {"bad_doclens_sum", test_storage_bad_doclens_sum, 0},
        {"bad_duplicate_in_batch", test_storage_bad_duplicate_in_batch, 0},
        {"bad_duplicate_in_index", test_storage_bad_duplicate_in_index, 0},
        {"bad_empty_id", test_storage_bad_empty_id, 0},
        {"bad_control_id", test_storage_bad_control_id, 0},
        {"bad_zero_token", test_storage_bad_zero_token, 0},
        {"bad_dtype", test_storage_bad_dtype, 0},
        {"bad_long_document", test_storage_bad_long_document, 0},
        {"bad_arguments", test_storage_bad_arguments, 0},
        {"readonly_handle", test_storage_readonly_handle, 0},
        {"open_errors", test_storage_open_errors, 0},
        {"unknown_version_refused", test_storage_unknown_version_refused, 0},
        {"readonly_directory", test_storage_readonly_directory, 0},
        {"map_growth", test_storage_map_growth, 0},
    };
    return FX_RUN("storage-errors", cases, FX_DIR, 30);
}
