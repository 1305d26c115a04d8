/*
 * pages.c: LMDB's own structure, read page by page without LMDB (FORMAT.md "What is and is not
 * guaranteed against damage"). LMDB keeps no checksums and trusts its pages: a damaged node
 * pointer or size makes its cursors read outside the page, or the file, and stop the process.
 * tartan check walks every tree of a snapshot here first, from the meta page down, checking
 * each page against LMDB 0.9's on-disk layout (lmdb.h's MDB_meta, MDB_db, MDB_page, MDB_node:
 * data format version 1, stable since LMDB 0.9.0) before letting LMDB's cursors near them; a
 * salvage reads the leaves of sound pages this way, skipping what lies under damaged ones.
 *
 * What a page must satisfy: its number (in its header) is where it was found and below the
 * snapshot's last page; it is a branch or a leaf (a value's own overflow pages are checked with
 * the value); its node pointers lie between its header and the page end, each node within the
 * page; keys ascend, and lie within the bounds its parent's keys give; every leaf is at the
 * tree's depth; no page is reached twice. The free list's pages must be ones no tree uses, and
 * every page is used or free. The database records (MDB_db) must agree with what their trees
 * hold (page and entry counts, depth, flags).
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store_internal.h"
#include "tartan.h"
#include "verify.h"

/* LMDB 0.9's layout (64-bit): page header, node header, flags, meta and database records. */
#define PAGEHDR 16
#define NODEHDR 8
#define P_BRANCH 0x01
#define P_LEAF 0x02
#define P_OVERFLOW 0x04
#define P_META 0x08
#define P_LEAF2 0x20
#define F_BIGDATA 0x01
#define F_SUBDATA 0x02
#define F_DUPDATA 0x04
#define MDB_DB_SIZE 48
#define META_DBS 40 /* mm_dbs in a meta page, after its page header */
#define META_LAST_PG 136
#define META_TXNID 144
#define LMDB_MAGIC 0xBEEFC0DEu
#define P_INVALID (~(uint64_t)0)
#define MAX_DEPTH 32 /* LMDB's cursor stack */

static uint16_t u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static uint32_t u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

typedef struct walker {
    const uint8_t *base;
    size_t psize;
    uint64_t npages; /* pages of the snapshot: last_pg + 1 */
    uint64_t fpages; /* pages the file holds (at most npages): LMDB may allocate a page and
                        free it again in one transaction without ever writing it, so the
                        snapshot's last pages can lie past the file's end, free */
    uint8_t *used;   /* bit per page */
    store_verify_fn report;
    void *ctx;
    size_t problems;
    int stop;
    /* the tree being walked */
    const char *db;
    int intkey;
    uint64_t branch, leaf, overflow, entries;
    int depth_seen;
    int damaged;
    store_pages_leaf_fn leaf_fn;
    void *leaf_ctx;
} walker;

static void problem(walker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void problem(walker *w, const char *fmt, ...)
{
    w->damaged = 1;
    w->problems++;
    if (!w->report || w->stop)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char msg[640];
    snprintf(msg, sizeof msg, "database '%s': %s", w->db, buf);
    if (w->report(w->ctx, "lmdb", msg))
        w->stop = 1;
}

static int bit_get(const uint8_t *b, uint64_t i)
{
    return b[i >> 3] >> (i & 7) & 1;
}

static void bit_set(uint8_t *b, uint64_t i)
{
    b[i >> 3] |= (uint8_t)(1u << (i & 7));
}

/* Claims pages [pgno, pgno + n) for a tree: 0, or 1 when one is out of range or used twice. */
static int claim(walker *w, uint64_t pgno, uint64_t n)
{
    if (pgno < 2 || pgno >= w->fpages || n > w->fpages - pgno)
        return 1;
    for (uint64_t i = 0; i < n; i++) {
        if (bit_get(w->used, pgno + i))
            return 1;
        bit_set(w->used, pgno + i);
    }
    return 0;
}

/* Key order of a database: integers (4 or 8 bytes, native) or bytes then length. */
static int key_cmp(const walker *w, const uint8_t *a, size_t al, const uint8_t *b, size_t bl)
{
    if (w->intkey && al == bl && (al == 4 || al == 8)) {
        uint64_t x = al == 4 ? u32(a) : u64(a), y = al == 4 ? u32(b) : u64(b);
        return (x > y) - (x < y);
    }
    size_t n = al < bl ? al : bl;
    int c = memcmp(a, b, n);
    return c ? c : (al > bl) - (al < bl);
}

typedef struct bound {
    const uint8_t *k;
    size_t len;
} bound;

/* Walks the subtree of page pgno at depth (1: the root); lo / hi: the keys its parent allows
 * ([lo, hi); k NULL: unbounded). */
static void walk(walker *w, uint64_t pgno, int depth, int max_depth, bound lo, bound hi)
{
    if (w->stop)
        return;
    if (depth > max_depth || depth > MAX_DEPTH) {
        problem(w, "page %llu lies deeper than the tree's depth %d", (unsigned long long)pgno,
                max_depth);
        return;
    }
    if (claim(w, pgno, 1)) {
        problem(w, "page %llu is out of the file or reached twice", (unsigned long long)pgno);
        return;
    }
    const uint8_t *pg = w->base + pgno * w->psize;
    uint16_t flags = u16(pg + 10) & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2);
    uint16_t lower = u16(pg + 12), upper = u16(pg + 14);
    if (flags != P_BRANCH && flags != P_LEAF) {
        problem(w, "page %llu: flags %#x", (unsigned long long)pgno, u16(pg + 10));
        return;
    }
    /* A wrong number in the header is damage, but LMDB does not read it: the page is read. */
    if (u64(pg) != pgno)
        problem(w, "page %llu: its header names page %llu", (unsigned long long)pgno,
                (unsigned long long)u64(pg));
    int branch = flags == P_BRANCH;
    if (lower < PAGEHDR + 2 || lower > upper || upper > w->psize || (lower - PAGEHDR) % 2) {
        problem(w, "page %llu: bounds %u..%u are not a page's", (unsigned long long)pgno, lower,
                upper);
        return;
    }
    if (branch)
        w->branch++;
    else
        w->leaf++;
    unsigned n = (lower - PAGEHDR) / 2;
    if (branch && n < 2)
        problem(w, "branch page %llu has %u child", (unsigned long long)pgno, n);
    if (!branch && depth != max_depth)
        problem(w, "leaf page %llu at depth %d of %d", (unsigned long long)pgno, depth,
                max_depth);
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (unsigned i = 0; i < n && !w->stop; i++) {
        unsigned at = u16(pg + PAGEHDR + 2 * i);
        /* A damaged node is skipped (with what lies under it), not the page's others. */
        if (at < upper || at % 2 || at + NODEHDR > w->psize) {
            problem(w, "page %llu: node %u lies at %u, outside the page's nodes",
                    (unsigned long long)pgno, i, at);
            continue;
        }
        const uint8_t *node = pg + at;
        unsigned ksize = u16(node + 6), nflags = u16(node + 4);
        uint32_t dsize = u16(node) | (uint32_t)u16(node + 2) << 16;
        size_t need = NODEHDR + ksize + (branch ? 0 : (nflags & F_BIGDATA) ? 8 : dsize);
        if (at + need > w->psize) {
            problem(w, "page %llu: node %u runs past the page", (unsigned long long)pgno, i);
            continue;
        }
        const uint8_t *key = node + NODEHDR;
        /* A branch page's first key is not a key (LMDB leaves it empty). */
        int has_key = !(branch && i == 0);
        if (has_key) {
            if ((prev && key_cmp(w, prev, prev_len, key, ksize) >= 0) ||
                (lo.k && key_cmp(w, key, ksize, lo.k, lo.len) < 0) ||
                (hi.k && key_cmp(w, key, ksize, hi.k, hi.len) >= 0)) {
                problem(w, "page %llu: key %u out of order", (unsigned long long)pgno, i);
                continue;
            }
            prev = key;
            prev_len = ksize;
        }
        if (branch) {
            uint64_t child = u16(node) | (uint64_t)u16(node + 2) << 16 |
                             (uint64_t)u16(node + 4) << 32;
            bound clo = has_key ? (bound){key, ksize} : lo, chi = hi;
            if (i + 1 < n) {
                unsigned nat = u16(pg + PAGEHDR + 2 * (i + 1));
                if (nat >= upper && nat + NODEHDR <= w->psize &&
                    nat + NODEHDR + u16(pg + nat + 6) <= w->psize)
                    chi = (bound){pg + nat + NODEHDR, u16(pg + nat + 6)};
            }
            walk(w, child, depth + 1, max_depth, clo, chi);
            continue;
        }
        w->entries++;
        if (nflags & (F_DUPDATA)) {
            problem(w, "page %llu: node %u is a duplicate set, which no tartan database has",
                    (unsigned long long)pgno, i);
            continue;
        }
        const uint8_t *data = key + ksize;
        if (nflags & F_BIGDATA) {
            uint64_t ov = u64(data);
            size_t pages = (PAGEHDR + (size_t)dsize + w->psize - 1) / w->psize;
            if (claim(w, ov, pages)) {
                problem(w, "page %llu: node %u's value pages at %llu are out of the file or "
                           "another's",
                        (unsigned long long)pgno, i, (unsigned long long)ov);
                continue;
            }
            const uint8_t *op = w->base + ov * w->psize;
            w->overflow += pages;
            /* LMDB reads a value's pages by number alone; a damaged header of the first one is
             * damage all the same, but the value can still be read (it checks itself). */
            if (u64(op) != ov ||
                (u16(op + 10) & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META)) != P_OVERFLOW ||
                u32(op + 12) != pages)
                problem(w, "page %llu: the header of node %u's value pages at %llu is damaged",
                        (unsigned long long)pgno, i, (unsigned long long)ov);
            data = op + PAGEHDR;
        }
        if (w->leaf_fn && w->leaf_fn(w->leaf_ctx, key, ksize, data, dsize))
            w->stop = 1;
    }
}

/* The database record (MDB_db) of tree `name` checked against what its walk found. */
static void walk_db(walker *w, const char *name, const uint8_t *rec, int intkey)
{
    w->db = name;
    w->intkey = intkey;
    w->branch = w->leaf = w->overflow = w->entries = 0;
    w->damaged = 0;
    uint64_t root = u64(rec + 40);
    int depth = u16(rec + 6);
    if (root == P_INVALID) {
        if (u64(rec + 32) != 0 || depth != 0)
            problem(w, "an empty tree with %llu entries, depth %d",
                    (unsigned long long)u64(rec + 32), depth);
        return;
    }
    walk(w, root, 1, depth, (bound){NULL, 0}, (bound){NULL, 0});
    if (!w->damaged && (w->branch != u64(rec + 8) || w->leaf != u64(rec + 16) ||
                        w->overflow != u64(rec + 24) || w->entries != u64(rec + 32)))
        problem(w, "its record counts %llu/%llu/%llu pages, %llu entries; the tree holds "
                   "%llu/%llu/%llu, %llu",
                (unsigned long long)u64(rec + 8), (unsigned long long)u64(rec + 16),
                (unsigned long long)u64(rec + 24), (unsigned long long)u64(rec + 32),
                (unsigned long long)w->branch, (unsigned long long)w->leaf,
                (unsigned long long)w->overflow, (unsigned long long)w->entries);
}

/* The free list: its values are page lists (a size_t count, then the page numbers). */
typedef struct freelist {
    walker *w;
    uint8_t *free_bits;
} freelist;

static int free_leaf(void *ctx, const void *key, size_t klen, const void *val, size_t vlen)
{
    (void)key;
    (void)klen;
    freelist *f = ctx;
    walker *w = f->w;
    const uint8_t *v = val;
    if (vlen < 8 || u64(v) != (vlen - 8) / 8 || (vlen - 8) % 8) {
        problem(w, "a free-list record of %zu bytes is malformed", vlen);
        return 0;
    }
    for (uint64_t i = 0; i < u64(v); i++) {
        uint64_t pg = u64(v + 8 + 8 * i);
        if (pg < 2 || pg >= w->npages || bit_get(f->free_bits, pg))
            problem(w, "the free list names page %llu, %s", (unsigned long long)pg,
                    pg < 2 || pg >= w->npages ? "out of the file" : "twice");
        else
            bit_set(f->free_bits, pg);
    }
    return 0;
}

/* Named databases as tartan opens them: name, integer keys. */
static const struct {
    const char *name;
    int intkey;
    unsigned flags; /* md_flags as stored */
} tartan_dbs[] = {
    {"meta", 0, 0},
    {"centroids", 1, MDB_INTEGERKEY},
    {"docs", 1, MDB_INTEGERKEY},
    {"ivf", 1, MDB_INTEGERKEY},
    {"ids", 0, 0},
    {"names", 1, MDB_INTEGERKEY},
};
#define N_TARTAN_DBS (sizeof tartan_dbs / sizeof tartan_dbs[0])

typedef struct main_ctx {
    walker *w;
    const uint8_t *rec[N_TARTAN_DBS];
} main_ctx;

static int main_leaf(void *ctx, const void *key, size_t klen, const void *val, size_t vlen)
{
    main_ctx *c = ctx;
    for (size_t i = 0; i < N_TARTAN_DBS; i++)
        if (klen == strlen(tartan_dbs[i].name) && !memcmp(key, tartan_dbs[i].name, klen)) {
            if (vlen != MDB_DB_SIZE)
                problem(c->w, "the record of database '%s' has %zu bytes", tartan_dbs[i].name,
                        vlen);
            else
                c->rec[i] = val;
            return 0;
        }
    problem(c->w, "a database '%.*s' that tartan does not have", (int)(klen > 32 ? 32 : klen),
            (const char *)key);
    return 0;
}

/* The meta page of txn's snapshot, or NULL (and a problem) when neither is sound. */
static const uint8_t *snapshot_meta(walker *w, store_txn *t)
{
    if (t->st_meta_use)
        return w->base + (size_t)(t->st_meta_use - 1) * w->psize;
    uint64_t want = mdb_txn_id(t->st_txn) - (t->st_write ? 1 : 0);
    for (int i = 0; i < 2; i++) {
        const uint8_t *pg = w->base + (size_t)i * w->psize;
        if (u32(pg + PAGEHDR) == LMDB_MAGIC && u64(pg + META_TXNID) == want)
            return pg;
    }
    w->db = "(meta pages)";
    problem(w, "no meta page holds the snapshot's transaction %llu", (unsigned long long)want);
    return NULL;
}

static int walker_init(walker *w, store_txn *t, store_msg *m)
{
    memset(w, 0, sizeof *w);
    store_gen *g = t->st_gen;
    if (!g->g_base)
        return store_fail(m, TARTAN_ENOTSUP, "the map's address is unknown");
    w->base = g->g_base;
    w->psize = g->g_psize;
    return 0;
}

int store_pages_check(store_txn *t, store_verify_fn report, void *ctx, unsigned *unsound,
                      store_msg *m)
{
    walker w;
    int rc = walker_init(&w, t, m);
    *unsound = 0;
    if (rc)
        return rc == TARTAN_ENOTSUP ? 0 : rc;
    w.report = report;
    w.ctx = ctx;
    const uint8_t *meta = snapshot_meta(&w, t);
    if (!meta) {
        *unsound = ~0u;
        return 0;
    }
    w.npages = u64(meta + META_LAST_PG) + 1;
    w.fpages = w.npages;
    if (t->st_fsize && w.npages * w.psize > t->st_fsize)
        w.fpages = t->st_fsize / w.psize; /* trees must not reach past it; free pages may */
    w.used = calloc(w.npages / 8 + 1, 1);
    uint8_t *free_bits = calloc(w.npages / 8 + 1, 1);
    if (!w.used || !free_bits) {
        free(w.used);
        free(free_bits);
        return store_fail(m, ENOMEM, "out of memory for %llu page bits",
                          (unsigned long long)w.npages);
    }
    /* The free list's tree and the main database's (which names the others). */
    freelist fl = {&w, free_bits};
    w.leaf_fn = free_leaf;
    w.leaf_ctx = &fl;
    walk_db(&w, "(free list)", meta + META_DBS, 1);
    int free_bad = w.damaged;
    main_ctx mc = {&w, {NULL}};
    w.leaf_fn = main_leaf;
    w.leaf_ctx = &mc;
    walk_db(&w, "(main)", meta + META_DBS + MDB_DB_SIZE, 0);
    if (w.damaged)
        *unsound = ~0u;
    w.leaf_fn = NULL;
    for (size_t i = 0; i < N_TARTAN_DBS && !w.stop; i++) {
        if (!mc.rec[i]) {
            w.db = tartan_dbs[i].name;
            problem(&w, "the main database does not name it");
            *unsound |= 1u << i;
            continue;
        }
        if (u16(mc.rec[i] + 4) != tartan_dbs[i].flags) {
            w.db = tartan_dbs[i].name;
            problem(&w, "its flags are %#x, not %#x", u16(mc.rec[i] + 4), tartan_dbs[i].flags);
        }
        walk_db(&w, tartan_dbs[i].name, mc.rec[i], tartan_dbs[i].intkey);
        if (w.damaged)
            *unsound |= 1u << i;
    }
    /* Every page is used by a tree or free, not both; a free page a tree uses would be handed
     * out again by the next change. */
    if (!w.stop && !free_bad && !*unsound) {
        w.db = "(free list)";
        uint64_t leaked = 0, both = 0;
        for (uint64_t p = 2; p < w.fpages; p++) {
            int u = bit_get(w.used, p), f = bit_get(free_bits, p);
            leaked += !u && !f;
            both += u && f;
        }
        if (both)
            problem(&w, "%llu pages in use are listed as free", (unsigned long long)both);
        if (leaked)
            problem(&w, "%llu pages are neither in use nor free", (unsigned long long)leaked);
    }
    free(w.used);
    free(free_bits);
    return 0;
}

int store_pages_main_sound(store_txn *t)
{
    walker w;
    store_msg m;
    if (walker_init(&w, t, &m))
        return 0; /* unknown map: LMDB's own checks only */
    const uint8_t *meta = snapshot_meta(&w, t);
    if (!meta)
        return TARTAN_ECORRUPT;
    w.npages = u64(meta + META_LAST_PG) + 1;
    w.fpages = w.npages;
    if (t->st_fsize && w.npages * w.psize > t->st_fsize)
        w.fpages = t->st_fsize / w.psize; /* see walker.fpages */
    w.used = calloc(w.npages / 8 + 1, 1);
    if (!w.used)
        return ENOMEM;
    walk_db(&w, "(main)", meta + META_DBS + MDB_DB_SIZE, 0);
    free(w.used);
    return w.damaged ? TARTAN_ECORRUPT : 0;
}

/* Leaf entries found by the scan of pages no sound tree holds (sorted by key before use). */
typedef struct found {
    const uint8_t *key, *val;
    size_t klen, vlen;
} found;

typedef struct found_set {
    found *v;
    size_t n, cap;
    int intkey;
} found_set;

static int keep_found(void *ctx, const void *key, size_t klen, const void *val, size_t vlen)
{
    found_set *f = ctx;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 1024;
        found *p = realloc(f->v, cap * sizeof *p);
        if (!p)
            return 1;
        f->v = p;
        f->cap = cap;
    }
    f->v[f->n++] = (found){key, val, klen, vlen};
    return 0;
}

static int cmp_found(const void *a, const void *b, void *ctx)
{
    const found *x = a, *y = b;
    walker w = {.intkey = *(const int *)ctx};
    return key_cmp(&w, x->key, x->klen, y->key, y->klen);
}

/*
 * The leaves of a tree that cannot be walked from its root (its record or a page of it is
 * damaged): every page no sound tree uses and the free list does not list is one of the damaged
 * trees' (LMDB leaves no other: store_pages_check's last rule), so its sound leaf pages are
 * read one by one. Entries of other damaged trees come along; the caller's checksums tell them
 * apart.
 */
static int scan_orphans(walker *w, const uint8_t *meta, const uint8_t *const *rec, size_t skip,
                        found_set *out)
{
    uint8_t *free_bits = calloc(w->npages / 8 + 1, 1);
    if (!free_bits)
        return ENOMEM;
    memset(w->used, 0, w->npages / 8 + 1);
    freelist fl = {w, free_bits};
    w->leaf_fn = free_leaf;
    w->leaf_ctx = &fl;
    walk_db(w, "(free list)", meta + META_DBS, 1);
    w->leaf_fn = NULL;
    walk_db(w, "(main)", meta + META_DBS + MDB_DB_SIZE, 0);
    for (size_t i = 0; i < N_TARTAN_DBS; i++) {
        if (i == skip || !rec[i])
            continue;
        /* A sound tree's pages are its own: walk it into a scratch copy of the claims, and
         * keep them only when the whole tree is sound. */
        uint8_t *save = malloc(w->npages / 8 + 1);
        if (!save) {
            free(free_bits);
            return ENOMEM;
        }
        memcpy(save, w->used, w->npages / 8 + 1);
        walk_db(w, tartan_dbs[i].name, rec[i], tartan_dbs[i].intkey);
        if (w->damaged)
            memcpy(w->used, save, w->npages / 8 + 1);
        free(save);
    }
    w->leaf_fn = keep_found;
    w->leaf_ctx = out;
    for (uint64_t p = 2; p < w->fpages; p++) {
        if (bit_get(w->used, p) || bit_get(free_bits, p))
            continue;
        const uint8_t *pg = w->base + p * w->psize;
        if ((u16(pg + 10) & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2)) != P_LEAF)
            continue;
        /* One leaf alone: depth 1 of 1, no bounds; its overflow values are claimed now. */
        walk(w, p, 1, 1, (bound){NULL, 0}, (bound){NULL, 0});
    }
    free(free_bits);
    return 0;
}

int store_pages_leaves(store_txn *t, const char *db, store_pages_leaf_fn fn, void *ctx,
                       size_t *damage, store_msg *m)
{
    walker w;
    int rc = walker_init(&w, t, m);
    *damage = 0;
    if (rc)
        return rc;
    const uint8_t *meta = snapshot_meta(&w, t);
    if (!meta) {
        *damage = 1;
        return 0;
    }
    w.npages = u64(meta + META_LAST_PG) + 1;
    if (t->st_fsize && w.npages * w.psize > t->st_fsize)
        w.npages = t->st_fsize / w.psize;
    w.fpages = w.npages;
    w.used = calloc(w.npages / 8 + 1, 1);
    if (!w.used)
        return store_fail(m, ENOMEM, "out of memory");
    main_ctx mc = {&w, {NULL}};
    w.leaf_fn = main_leaf;
    w.leaf_ctx = &mc;
    walk_db(&w, "(main)", meta + META_DBS + MDB_DB_SIZE, 0);
    size_t i = 0;
    while (i < N_TARTAN_DBS && strcmp(tartan_dbs[i].name, db))
        i++;
    if (i == N_TARTAN_DBS) {
        free(w.used);
        return store_fail(m, TARTAN_EINTERNAL, "no database '%s'", db);
    }
    /* First a dry walk: is the tree sound from its root? */
    if (mc.rec[i]) {
        memset(w.used, 0, w.npages / 8 + 1);
        w.leaf_fn = NULL;
        walk_db(&w, db, mc.rec[i], tartan_dbs[i].intkey);
    }
    if (mc.rec[i] && !w.damaged) {
        memset(w.used, 0, w.npages / 8 + 1);
        w.leaf_fn = fn;
        w.leaf_ctx = ctx;
        w.stop = 0;
        walk_db(&w, db, mc.rec[i], tartan_dbs[i].intkey);
        free(w.used);
        return 0;
    }
    /* Damaged: every leaf no sound tree holds, in key order. */
    found_set f = {NULL, 0, 0, tartan_dbs[i].intkey};
    w.stop = 0;
    w.problems = 0;
    rc = scan_orphans(&w, meta, mc.rec, i, &f);
    *damage = 1 + w.problems;
    if (!rc) {
        qsort_r(f.v, f.n, sizeof *f.v, cmp_found, &f.intkey);
        for (size_t j = 0; j < f.n; j++)
            if (fn(ctx, f.v[j].key, f.v[j].klen, f.v[j].val, f.v[j].vlen))
                break;
    }
    free(f.v);
    free(w.used);
    return rc ? store_fail(m, rc, "out of memory") : 0;
}

/* ---- the two meta pages ----------------------------------------------------------------- */

/*
 * LMDB keeps two meta pages and writes page (txnid & 1) at every commit, so that the other one
 * still names the previous snapshot when a commit is cut short; at open it takes the page with
 * the larger transaction id. Neither carries a checksum: a flipped bit in the older page's id
 * can make it the larger one, and LMDB then reads the previous snapshot as if it were the
 * newest, soundly and silently. What tells the two apart here (FORMAT.md "LMDB's meta pages"):
 *   - the ids: after any commit, page 0 holds an even id, page 1 an odd one, one apart (both
 *     0 in a fresh environment, which tartan never leaves so);
 *   - tartan's own commit record (meta "commit", checksummed): every write transaction of this
 *     version writes its sequence number, one above the one it read, so the tree holding the
 *     larger number is the newer snapshot, and a tree without the record is older than one
 *     with it (older builds do not write it, but copy it along unchanged).
 * Both trees a meta page names are intact at rest: LMDB reuses a page only once no meta page
 * names a snapshot that holds it. The pages are read with pread, not through the map, while
 * the caller holds a snapshot (any transaction): writers of other processes then do not reuse
 * the pages of either tree, and a meta page changing under the read is read again.
 */

#define META_READ (META_TXNID + 8)
#define META_TREE_PAGES 256 /* a meta database of more pages is not read (tartan's has a few) */

typedef struct preader {
    int fd;
    size_t psize;
    uint64_t fpages;
    uint8_t *buf; /* META_TREE_PAGES pages, one per depth level at most */
    unsigned pages;
} preader;

static const uint8_t *pread_page(preader *r, uint64_t pgno, unsigned level)
{
    if (pgno < 2 || pgno >= r->fpages || level >= MAX_DEPTH || ++r->pages > META_TREE_PAGES)
        return NULL;
    uint8_t *b = r->buf + (size_t)level * r->psize;
    if (pread(r->fd, b, r->psize, (off_t)(pgno * r->psize)) != (ssize_t)r->psize)
        return NULL;
    return b;
}

/* Calls fn on every leaf entry of the tree rooted at pgno (values of their own pages read
 * whole); -1 when a page breaks LMDB's layout or fn returns nonzero. */
typedef int (*pentry_fn)(void *ctx, const uint8_t *key, size_t klen, const uint8_t *val,
                         size_t vlen, unsigned nflags);

static int pwalk(preader *r, uint64_t pgno, unsigned level, unsigned depth, pentry_fn fn, void *ctx)
{
    if (level >= depth)
        return -1;
    const uint8_t *pg = pread_page(r, pgno, level);
    if (!pg || u64(pg) != pgno)
        return -1;
    uint16_t flags = u16(pg + 10) & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2);
    uint16_t lower = u16(pg + 12), upper = u16(pg + 14);
    int branch = flags == P_BRANCH;
    if ((flags != P_BRANCH && flags != P_LEAF) || (!branch && level + 1 != depth) ||
        lower < PAGEHDR + 2 || lower > upper || upper > r->psize || (lower - PAGEHDR) % 2)
        return -1;
    unsigned n = (lower - PAGEHDR) / 2;
    for (unsigned i = 0; i < n; i++) {
        unsigned at = u16(pg + PAGEHDR + 2 * i);
        if (at < upper || at % 2 || at + NODEHDR > r->psize)
            return -1;
        const uint8_t *node = pg + at;
        unsigned ksize = u16(node + 6), nflags = u16(node + 4);
        uint32_t dsize = u16(node) | (uint32_t)u16(node + 2) << 16;
        size_t need = NODEHDR + ksize + (branch ? 0 : (nflags & F_BIGDATA) ? 8 : dsize);
        if (at + need > r->psize)
            return -1;
        if (branch) {
            uint64_t child =
                u16(node) | (uint64_t)u16(node + 2) << 16 | (uint64_t)u16(node + 4) << 32;
            /* Deeper levels read into their own buffers: this page stays in hand. */
            if (pwalk(r, child, level + 1, depth, fn, ctx))
                return -1;
            continue;
        }
        const uint8_t *key = node + NODEHDR;
        if (nflags & F_DUPDATA)
            return -1;
        if (!(nflags & F_BIGDATA)) {
            if (fn(ctx, key, ksize, key + ksize, dsize, nflags))
                return -1;
            continue;
        }
        uint64_t ov = u64(key + ksize);
        size_t pages = (PAGEHDR + (size_t)dsize + r->psize - 1) / r->psize;
        if (ov < 2 || ov >= r->fpages || pages > r->fpages - ov)
            return -1;
        uint8_t *v = malloc(dsize ? dsize : 1);
        uint8_t *kc = malloc(ksize ? ksize : 1);
        if (!v || !kc) {
            free(v);
            free(kc);
            return -1;
        }
        memcpy(kc, key, ksize);
        int bad = pread(r->fd, v, dsize, (off_t)(ov * r->psize + PAGEHDR)) != (ssize_t)dsize ||
                  fn(ctx, kc, ksize, v, dsize, nflags);
        free(v);
        free(kc);
        if (bad)
            return -1;
    }
    return 0;
}

/* The main database's entry "meta": its MDB_db record. */
typedef struct find_meta {
    uint8_t rec[MDB_DB_SIZE];
    int found;
} find_meta;

static int main_entry(void *ctx, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                      unsigned nflags)
{
    find_meta *f = ctx;
    if (klen == 4 && !memcmp(key, "meta", 4)) {
        if (vlen != MDB_DB_SIZE || !(nflags & F_SUBDATA) || f->found)
            return 1;
        memcpy(f->rec, val, MDB_DB_SIZE);
        f->found = 1;
    }
    return 0;
}

/* The meta database's entries: every one must check out under its own name (a damaged key
 * could hide the commit record), and the commit record is kept. */
typedef struct find_commit {
    int found;
    uint64_t seq, txnid;
} find_commit;

static int meta_entry(void *ctx, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                      unsigned nflags)
{
    (void)nflags;
    find_commit *f = ctx;
    if (klen == strlen(STORE_KEY_FORMAT) && !memcmp(key, STORE_KEY_FORMAT, klen)) {
        unsigned version;
        int damaged;
        return store_format_parse(val, vlen, &version, &damaged) || damaged;
    }
    uint32_t want;
    if (vlen < 4)
        return 1;
    memcpy(&want, val, 4);
    if (store_meta_crc(key, klen, val + 4, vlen - 4) != want)
        return 1;
    if (klen == strlen(STORE_KEY_COMMIT) && !memcmp(key, STORE_KEY_COMMIT, klen)) {
        if (vlen != 4 + 16)
            return 1;
        memcpy(&f->seq, val + 4, 8);
        memcpy(&f->txnid, val + 12, 8);
        f->found = 1;
    }
    return 0;
}

/* What meta page `page` (its bytes in meta) names: rec 1 and seq (its tree's commit record),
 * 0 (a tree without one, or no tree), -1 (the tree cannot be read). */
static void page_record(preader *r, const uint8_t *meta, int *rec, uint64_t *seq, uint64_t *txnid)
{
    const uint8_t *main_db = meta + META_DBS + MDB_DB_SIZE;
    *rec = -1;
    *seq = 0;
    uint64_t root = u64(main_db + 40);
    if (root == P_INVALID) {
        *rec = 0;
        return;
    }
    find_meta fm = {{0}, 0};
    r->pages = 0;
    if (pwalk(r, root, 0, u16(main_db + 6), main_entry, &fm) || !fm.found)
        return;
    uint64_t mroot = u64(fm.rec + 40);
    if (mroot == P_INVALID)
        return; /* a tartan index's meta database is never empty */
    find_commit fc = {0, 0, 0};
    r->pages = 0;
    if (pwalk(r, mroot, 0, u16(fm.rec + 6), meta_entry, &fc))
        return;
    *rec = fc.found;
    *seq = fc.seq;
    *txnid = fc.txnid;
}

static int parity_ok(const store_meta_pages *s, int i)
{
    return (int)(s->txnid[i] & 1) == i;
}

/* Which page is the newest when one id was flipped: each page in turn taken for the damaged
 * one, its true id one apart from the other's and one bit from what it holds. -1 when no
 * explanation or two that disagree. */
static int explain(const store_meta_pages *s)
{
    int newest = -1, n = 0;
    for (int i = 0; i < 2; i++) {
        int j = 1 - i;
        if (!parity_ok(s, j))
            continue;
        for (int d = -1; d <= 1; d += 2) {
            if (d < 0 && s->txnid[j] == 0)
                continue;
            uint64_t v = s->txnid[j] + (uint64_t)(int64_t)d, x = v ^ s->txnid[i];
            if (!x || (x & (x - 1)))
                continue;
            int nw = v > s->txnid[j] ? i : j;
            if (n++ && nw != newest)
                return -1;
            newest = nw;
        }
    }
    return newest;
}

static void judge(store_meta_pages *s)
{
    const unsigned long long t0 = s->txnid[0], t1 = s->txnid[1];
    s->pick = t0 < t1 ? 1 : 0;
    s->bad = 0;
    s->newest = s->pick;
    s->why[0] = 0;
    if (t0 == 0 && t1 == 0)
        return; /* a fresh environment */
    int txn_ok = parity_ok(s, 0) && parity_ok(s, 1) && (t0 + 1 == t1 || t1 + 1 == t0);
    int tree = -1;
    if (s->rec[0] == 1 && s->rec[1] == 1 && s->seq[0] != s->seq[1])
        tree = s->seq[0] > s->seq[1] ? 0 : 1;
    else if (s->rec[0] == 1 && s->rec[1] == 0)
        tree = 0;
    else if (s->rec[1] == 1 && s->rec[0] == 0)
        tree = 1;
    /* LMDB's own trace of a commit that failed writing its meta page: it writes the page's old
     * id and last page back over the new roots (mdb_env_write_meta), leaving the snapshot of the
     * failed commit under the id before the one LMDB takes, ids and all otherwise consistent.
     * LMDB rightly takes the other page then. A flipped bit of an id can leave the same trace;
     * the pages are taken as LMDB's trace when the snapshot LMDB takes was committed under its
     * page's id and the other one in the next transaction (their commit records say so: a flip
     * of the older page's id up to the pair's next fails this), and the other page's last page
     * does not lie beyond its own (FORMAT.md "LMDB's meta pages"). */
    int other = 1 - s->pick;
    if (tree == other && txn_ok && s->txnid[other] + 1 == s->txnid[s->pick] && s->rec[0] == 1 &&
        s->rec[1] == 1 && s->seq[other] == s->seq[s->pick] + 1 &&
        s->rec_txnid[s->pick] == s->txnid[s->pick] &&
        s->rec_txnid[other] == s->txnid[s->pick] + 1 && s->last_pg[other] <= s->last_pg[s->pick])
        tree = s->pick;
    if (tree >= 0) {
        s->newest = tree;
        if (tree != s->pick) {
            s->bad = 1;
            snprintf(s->why, sizeof s->why,
                     "LMDB's meta page %d (transaction %llu) names an older snapshot than meta "
                     "page %d (transaction %llu): one of their transaction ids is damaged",
                     s->pick, s->pick ? t1 : t0, tree, tree ? t1 : t0);
            return;
        }
    } else if (!txn_ok) {
        s->newest = explain(s);
    }
    if (!txn_ok) {
        s->bad = 1;
        snprintf(s->why, sizeof s->why,
                 "LMDB's meta pages hold transaction ids %llu and %llu, where LMDB writes an "
                 "even one on page 0 and the next or previous odd one on page 1: one is damaged",
                 t0, t1);
    }
}

int store_pages_meta(int fd, size_t psize, store_meta_pages *s)
{
    memset(s, 0, sizeof *s);
    struct stat st;
    if (fstat(fd, &st) != 0)
        return errno;
    preader r = {fd, psize, (uint64_t)st.st_size / psize, NULL, 0};
    r.buf = malloc(MAX_DEPTH * psize);
    uint8_t *a = malloc(2 * META_READ), *b = malloc(2 * META_READ);
    int rc = !r.buf || !a || !b ? ENOMEM : 0;
    /* A meta page that changes while it is read (a writer of another process committing) is
     * read again; damage stays put. */
    for (int attempt = 0; !rc && attempt < 8; attempt++) {
        if (attempt)
            usleep(1000);
        if (pread(fd, a, META_READ, 0) != META_READ ||
            pread(fd, a + META_READ, META_READ, (off_t)psize) != META_READ) {
            rc = EIO;
            break;
        }
        for (int i = 0; i < 2; i++) {
            const uint8_t *pg = a + i * META_READ;
            s->txnid[i] = u64(pg + META_TXNID);
            s->last_pg[i] = u64(pg + META_LAST_PG);
            page_record(&r, pg, &s->rec[i], &s->seq[i], &s->rec_txnid[i]);
        }
        if (pread(fd, b, META_READ, 0) != META_READ ||
            pread(fd, b + META_READ, META_READ, (off_t)psize) != META_READ) {
            rc = EIO;
            break;
        }
        if (!memcmp(a, b, 2 * META_READ))
            break;
    }
    if (!rc)
        judge(s);
    free(r.buf);
    free(a);
    free(b);
    return rc;
}
