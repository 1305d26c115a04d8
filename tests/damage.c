/* damage.c: see damage.h. */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "damage.h"
#include "store_internal.h"

long damage_offset(store_txn *txn, const void *p)
{
    /* LMDB maps data.mdb whole from offset 0: find that mapping (by the file's inode) in the
     * process's map list. */
    FILE *f = fopen("/proc/self/maps", "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    long off = -1;
    uintptr_t at = (uintptr_t)p;
    while (off < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi, foff, ino;
        char perms[8], dev[32];
        if (sscanf(line, "%lx-%lx %7s %lx %31s %lu", &lo, &hi, perms, &foff, dev, &ino) != 6)
            continue;
        if (ino == (unsigned long)txn->st_gen->g_ino && at >= lo && at < hi)
            off = (long)(at - lo + foff);
    }
    fclose(f);
    ck_assert_msg(off >= 0, "no mapping of data.mdb holds %p", p);
    return off;
}

static int open_data(const char *path, int flags)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s/data.mdb", path);
    int fd = open(buf, flags);
    ck_assert_msg(fd >= 0, "opening %s", buf);
    return fd;
}

void damage_flip(const char *path, long offset, uint8_t mask)
{
    int fd = open_data(path, O_RDWR);
    uint8_t b;
    ck_assert_int_eq(pread(fd, &b, 1, offset), 1);
    b ^= mask;
    ck_assert_int_eq(pwrite(fd, &b, 1, offset), 1);
    close(fd);
}

uint8_t damage_peek(const char *path, long offset)
{
    int fd = open_data(path, O_RDONLY);
    uint8_t b;
    ck_assert_int_eq(pread(fd, &b, 1, offset), 1);
    close(fd);
    return b;
}

long damage_file_size(const char *path)
{
    int fd = open_data(path, O_RDONLY);
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    close(fd);
    return (long)st.st_size;
}

/* ---- damage by meaning ------------------------------------------------------------------ */

typedef struct write_ctx {
    damage_txn_fn fn;
    void *ctx;
} write_ctx;

static int write_fn(store_txn *t, void *vctx, store_msg *m)
{
    (void)m;
    write_ctx *w = vctx;
    w->fn(t, w->ctx);
    return 0;
}

void damage_write(const char *path, damage_txn_fn fn, void *ctx)
{
    store_env *env;
    store_msg m = {{0}};
    ck_assert_msg(store_open(path, 0, NULL, 0, &env, &m) == 0, "%s", m.text);
    write_ctx w = {fn, ctx};
    ck_assert_msg(store_write(env, write_fn, &w, &m) == 0, "%s", m.text);
    store_close(env);
}

static void header_of(store_txn *t, store_header *h)
{
    store_msg m;
    ck_assert_msg(store_header_get(t, h, &m) == 0, "%s", m.text);
}

const uint8_t *damage_record(store_txn *t, uint32_t docno, size_t *size)
{
    store_header h;
    header_of(t, &h);
    store_doc d;
    store_msg m;
    ck_assert_msg(store_doc_get(t, docno, h.code_bytes, h.token_bytes, 0, &d, &m) == 0, "%s",
                  m.text);
    *size = store_doc_size(d.ntok, h.code_bytes, h.token_bytes);
    return (const uint8_t *)d.inv_norms - STORE_DOC_HEAD;
}

void damage_edit_record(store_txn *t, uint32_t docno, damage_edit_fn edit, void *ctx, int reseal)
{
    MDB_cursor *cur;
    ck_assert_int_eq(mdb_cursor_open(t->st_txn, t->st_gen->g_docs, &cur), 0);
    unsigned kk = docno;
    MDB_val k = {4, &kk}, d;
    int rc = mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE);
    if (rc == MDB_NOTFOUND)
        rc = mdb_cursor_get(cur, &k, &d, MDB_LAST);
    else if (rc == 0 && *(const uint32_t *)k.mv_data != docno)
        rc = mdb_cursor_get(cur, &k, &d, MDB_PREV);
    ck_assert_int_eq(rc, 0);
    uint32_t key = *(const uint32_t *)k.mv_data;
    mdb_cursor_close(cur);
    store_seg s;
    store_msg m;
    ck_assert_msg(store_seg_parse(key, d.mv_data, d.mv_size, 0, 0, 1, &s, &m) == 0, "%s", m.text);
    uint8_t *out = malloc(d.mv_size);
    ck_assert_ptr_nonnull(out);
    memcpy(out, d.mv_data, STORE_SEG_HEAD + (size_t)s.n * STORE_SEG_ENTRY);
    size_t at = STORE_SEG_HEAD + (size_t)s.n * STORE_SEG_ENTRY;
    int found = 0;
    for (uint32_t i = 0; i < s.n; i++) {
        uint32_t dn;
        const uint8_t *rec;
        size_t size;
        store_seg_entry(&s, i, &dn, &rec, &size);
        memcpy(out + at, rec, size);
        if (dn == docno) {
            found = 1;
            edit(out + at, &size, ctx);
            if (reseal) {
                uint32_t c = store_doc_crc(out + at, size);
                memcpy(out + at + 8, &c, 4);
            }
        }
        uint32_t off = (uint32_t)at;
        memcpy(out + STORE_SEG_HEAD + (size_t)i * STORE_SEG_ENTRY + 4, &off, 4);
        at += size;
    }
    ck_assert(found);
    uint32_t c = store_seg_crc(key, out, s.n);
    memcpy(out + 4, &c, 4);
    MDB_val nv = {at, out};
    ck_assert_int_eq(mdb_put(t->st_txn, t->st_gen->g_docs, &k, &nv, 0), 0);
    free(out);
}

void damage_list(store_txn *t, uint32_t c, uint32_t doc, int add)
{
    /* The whole list, changed, written again as fresh blocks. */
    uint32_t *v = NULL;
    size_t n = 0, cap = 0;
    store_ivf_iter *it;
    store_msg m;
    ck_assert_int_eq(store_ivf_open(t, c, &it, &m), 0);
    const uint32_t *docs;
    size_t nd;
    int rc;
    while ((rc = store_ivf_next(it, &docs, &nd, &m)) == 1) {
        if (n + nd + 1 > cap) {
            cap = 2 * (n + nd + 1);
            v = realloc(v, cap * sizeof *v);
            ck_assert_ptr_nonnull(v);
        }
        memcpy(v + n, docs, nd * sizeof *v);
        n += nd;
    }
    ck_assert_int_eq(rc, 0);
    store_ivf_close(it);
    if (!v)
        v = malloc(sizeof *v);
    size_t w = 0, pos = n;
    for (size_t i = 0; i < n; i++) {
        if (add && pos == n && v[i] > doc)
            pos = i;
        if (!add && v[i] == doc)
            continue;
        v[w++] = v[i];
    }
    if (add) {
        memmove(v + pos + 1, v + pos, (n - pos) * sizeof *v);
        v[pos] = doc;
        w = n + 1;
    } else {
        ck_assert_uint_eq(w + 1, n);
    }
    MDB_cursor *cur;
    ck_assert_int_eq(mdb_cursor_open(t->st_txn, t->st_gen->g_ivf, &cur), 0);
    for (;;) {
        uint64_t want = store_ivf_key(c, 0), got;
        MDB_val k = {8, &want}, d;
        if (mdb_cursor_get(cur, &k, &d, MDB_SET_RANGE) != 0)
            break;
        memcpy(&got, k.mv_data, 8);
        if ((uint32_t)(got >> 32) != c)
            break;
        ck_assert_int_eq(mdb_cursor_del(cur, 0), 0);
    }
    mdb_cursor_close(cur);
    for (size_t i = 0; i < w; i += STORE_IVF_BLOCK) {
        size_t take = w - i < STORE_IVF_BLOCK ? w - i : STORE_IVF_BLOCK;
        ck_assert_int_eq(store_ivf_put_block(t->st_txn, t->st_gen->g_ivf,
                                             store_ivf_key(c, v[i]), v + i, take, 0, &m),
                         0);
    }
    free(v);
}
