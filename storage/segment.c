/*
 * segment.c: the documents (database "docs", FORMAT.md): segments of consecutive document
 * numbers, each one LMDB value holding a directory and the documents' records one after
 * another. A record is self-describing (number, token count, CRC-32C) and laid out so that a
 * kernel reads its parts straight from the map with their natural alignment; one damaged
 * record condemns no other. Segments are keyed by a lower bound of their numbers, filled to
 * about a whole number of pages (LMDB gives each large value whole pages of its own), and
 * rewritten whole by the changes that touch them.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "tartan.h"

/*
 * Segment sizes (FORMAT.md "docs"). A segment stops growing once it is at least SEG_MIN bytes
 * and its last overflow page is nearly full (no more than SEG_SLACK bytes unused), or when the
 * next document would take it past SEG_MAX: so segments leave about SEG_SLACK / 2 bytes unused
 * in ~100 KB, where one value per document left most of a page. SEG_MAX bounds what a change
 * rewrites: an add reopens the last segment, a delete rewrites the segments it touches.
 */
#define SEG_MIN ((size_t)32 << 10)
#define SEG_MAX ((size_t)256 << 10)
#define SEG_SLACK 256u
/* LMDB's overflow pages start with a 16-byte page header. */
#define OVERFLOW_HEAD 16u

size_t store_doc_size(uint32_t ntok, unsigned code_bytes, unsigned token_bytes)
{
    size_t n = STORE_DOC_HEAD + (size_t)ntok * (4 + code_bytes + token_bytes);
    /* A multiple of 4: records start 4-byte aligned, one after another. */
    return (n + 3) & ~(size_t)3;
}

/* The CRC covers the record's number and token count and everything after the CRC field
 * (padding included), so a record under another number fails too. */
uint32_t store_doc_crc(const uint8_t *rec, size_t size)
{
    uint32_t c = store_crc32c(0, rec, 8);
    return store_crc32c(c, rec + STORE_DOC_HEAD, size - STORE_DOC_HEAD);
}

uint32_t store_seg_crc(uint32_t key, const void *vval, uint32_t n)
{
    const uint8_t *val = vval;
    uint32_t c = store_crc32c(0, &key, 4);
    c = store_crc32c(c, val, 4);
    return store_crc32c(c, val + STORE_SEG_HEAD, (size_t)n * STORE_SEG_ENTRY);
}

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int store_doc_parse(uint32_t docno, const void *vrec, size_t size, unsigned code_bytes,
                    unsigned token_bytes, int verify, store_doc *doc, store_msg *m)
{
    const uint8_t *b = vrec;
    if (size < STORE_DOC_HEAD)
        return store_fail(m, TARTAN_ECORRUPT, "document %u: record of %zu bytes is truncated",
                          docno, size);
    if ((uintptr_t)b % 4 != 0)
        return store_fail(m, TARTAN_ECORRUPT, "document %u: record misaligned in the map", docno);
    uint32_t held = rd32(b), ntok = rd32(b + 4);
    if (held != docno)
        return store_fail(m, TARTAN_ECORRUPT, "document %u: its record holds number %u", docno,
                          held);
    if (ntok == 0 || ntok > STORE_MAX_DOC_TOKENS ||
        size != store_doc_size(ntok, code_bytes, token_bytes))
        return store_fail(m, TARTAN_ECORRUPT,
                          "document %u: record of %zu bytes does not hold %u tokens", docno, size,
                          ntok);
    if (verify) {
        uint32_t want = rd32(b + 8), got = store_doc_crc(b, size);
        if (got != want)
            return store_fail(m, TARTAN_ECORRUPT,
                              "document %u: checksum mismatch (stored %08x, computed %08x)", docno,
                              want, got);
    }
    doc->ntok = ntok;
    doc->inv_norms = (const float *)(b + STORE_DOC_HEAD);
    doc->codes = b + STORE_DOC_HEAD + (size_t)ntok * 4;
    doc->residuals = b + STORE_DOC_HEAD + (size_t)ntok * (4 + code_bytes);
    return 0;
}

/* ---- segment structure ------------------------------------------------------------------- */

/* The count and the directory's extent, without looking at the entries. */
static int seg_head(uint32_t key, const uint8_t *val, size_t size, uint32_t *n, store_msg *m)
{
    if (size < STORE_SEG_HEAD || (uintptr_t)val % 4 != 0)
        return store_fail(m, TARTAN_ECORRUPT, "segment %u: %zu bytes, %s", key, size,
                          size < STORE_SEG_HEAD ? "truncated" : "misaligned in the map");
    uint32_t c = rd32(val);
    if (c == 0 || STORE_SEG_HEAD + (size_t)c * STORE_SEG_ENTRY >= size)
        return store_fail(m, TARTAN_ECORRUPT, "segment %u: %u entries do not fit its %zu bytes",
                          key, c, size);
    *n = c;
    return 0;
}

static int seg_dir_verify(uint32_t key, const uint8_t *val, uint32_t n, store_msg *m)
{
    uint32_t want = rd32(val + 4), got = store_seg_crc(key, val, n);
    if (want != got)
        return store_fail(m, TARTAN_ECORRUPT,
                          "segment %u: directory checksum mismatch (stored %08x, computed %08x)",
                          key, want, got);
    return 0;
}

int store_seg_parse(uint32_t key, const void *vval, size_t size, unsigned code_bytes,
                    unsigned token_bytes, int verify, store_seg *s, store_msg *m)
{
    (void)code_bytes;
    (void)token_bytes;
    const uint8_t *val = vval;
    uint32_t n;
    int rc = seg_head(key, val, size, &n, m);
    if (rc)
        return rc;
    if (verify && (rc = seg_dir_verify(key, val, n, m)))
        return rc;
    size_t start = STORE_SEG_HEAD + (size_t)n * STORE_SEG_ENTRY;
    uint64_t prev_doc = 0, prev_off = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = val + STORE_SEG_HEAD + (size_t)i * STORE_SEG_ENTRY;
        uint32_t d = rd32(e), off = rd32(e + 4);
        int bad = (i == 0 ? d < key : d <= prev_doc) || off % 4 != 0 ||
                  (i == 0 ? off != start : off <= prev_off) || off + STORE_DOC_HEAD > size;
        if (bad)
            return store_fail(m, TARTAN_ECORRUPT,
                              "segment %u: directory entry %u (document %u at %u) is out of "
                              "order or place",
                              key, i, d, off);
        prev_doc = d;
        prev_off = off;
    }
    s->key = key;
    s->val = val;
    s->size = size;
    s->n = n;
    return 0;
}

void store_seg_entry(const store_seg *s, uint32_t i, uint32_t *docno, const uint8_t **rec,
                     size_t *size)
{
    const uint8_t *e = s->val + STORE_SEG_HEAD + (size_t)i * STORE_SEG_ENTRY;
    uint32_t off = rd32(e + 4);
    size_t end = i + 1 < s->n ? rd32(e + STORE_SEG_ENTRY + 4) : s->size;
    *docno = rd32(e);
    *rec = s->val + off;
    *size = end > off ? end - off : 0;
}

/* ---- lookups ----------------------------------------------------------------------------- */

static int docs_cursor(store_txn *t, MDB_cursor **cur, store_msg *m)
{
    *cur = NULL;
    if (!t->st_docs) {
        int rc = mdb_cursor_open(t->st_txn, t->st_gen->g_docs, &t->st_docs);
        if (rc) {
            t->st_docs = NULL;
            return store_map_lmdb(m, rc, "opening the documents");
        }
    }
    *cur = t->st_docs;
    return 0;
}

/* The segment that would hold docno: the greatest key at or below it. 0 and the segment,
 * TARTAN_ENOTFOUND (no message) when docno is below every key. */
static int seg_find(store_txn *t, uint32_t docno, uint32_t *key, const uint8_t **val, size_t *size,
                    store_msg *m)
{
    MDB_cursor *cur;
    int rc = docs_cursor(t, &cur, m);
    if (rc)
        return rc;
    unsigned kk = docno;
    MDB_val k = {sizeof kk, &kk}, d;
    rc = store_cget(t, cur, &k, &d, MDB_SET_RANGE);
    if (rc == MDB_NOTFOUND)
        rc = store_cget(t, cur, &k, &d, MDB_LAST);
    else if (rc == 0 && (k.mv_size != 4 || rd32(k.mv_data) != docno))
        rc = store_cget(t, cur, &k, &d, MDB_PREV);
    if (rc == MDB_NOTFOUND)
        return TARTAN_ENOTFOUND;
    if (rc)
        return store_map_lmdb(m, rc, "reading the documents");
    if (k.mv_size != 4)
        return store_fail(m, TARTAN_ECORRUPT, "a document segment key has %zu bytes", k.mv_size);
    *key = rd32(k.mv_data);
    if (*key > docno)
        return TARTAN_ENOTFOUND;
    *val = d.mv_data;
    *size = d.mv_size;
    return 0;
}

/* Binary search of a segment's directory: the entry of docno, or -1. */
static int64_t dir_search(const uint8_t *val, uint32_t n, uint32_t docno)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        uint32_t d = rd32(val + STORE_SEG_HEAD + (size_t)mid * STORE_SEG_ENTRY);
        if (d < docno)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < n && rd32(val + STORE_SEG_HEAD + (size_t)lo * STORE_SEG_ENTRY) == docno)
        return lo;
    return -1;
}

/* The segment that would hold docno: from a read snapshot's cache sc (ascending lookups,
 * as candidates come, often stay in one segment), else found, its head checked, and cached. A
 * write transaction's values move as it changes them: it never uses or fills the cache. */
static int seg_locate(store_txn *t, store_seg_cache *sc, uint32_t docno, uint32_t *key,
                      const uint8_t **val, size_t *size, store_msg *m)
{
    if (!t->st_write && sc->val && docno >= sc->lo && docno <= sc->last) {
        *key = sc->lo;
        *val = sc->val;
        *size = sc->size;
        return 0;
    }
    uint32_t n;
    int rc = seg_find(t, docno, key, val, size, m);
    if (rc == TARTAN_ENOTFOUND)
        return store_fail(m, TARTAN_ENOTFOUND, "no document %u", docno);
    if (rc || (rc = seg_head(*key, *val, *size, &n, m)))
        return rc;
    if (!t->st_write) {
        sc->lo = *key;
        sc->last = rd32(*val + STORE_SEG_HEAD + (size_t)(n - 1) * STORE_SEG_ENTRY);
        sc->val = *val;
        sc->size = *size;
        sc->dir_ok = 0;
    }
    return 0;
}

/* Entry i of a segment of n entries and size bytes: its record's bytes [*off, *end); -1 where
 * they lie outside the segment's records. */
static int seg_entry(const uint8_t *val, uint32_t n, size_t size, int64_t i, uint32_t *off,
                     size_t *end)
{
    const uint8_t *e = val + STORE_SEG_HEAD + (size_t)i * STORE_SEG_ENTRY;
    *off = rd32(e + 4);
    *end = (uint32_t)i + 1 < n ? rd32(e + STORE_SEG_ENTRY + 4) : size;
    return *off < STORE_SEG_HEAD + (size_t)n * STORE_SEG_ENTRY || *end > size || *end <= *off ? -1
                                                                                              : 0;
}

int store_doc_get(store_txn *t, uint32_t docno, unsigned code_bytes, unsigned token_bytes,
                  int verify, store_doc *doc, store_msg *m)
{
    store_seg_cache *sc = &t->st_seg;
    uint32_t key, n, off;
    const uint8_t *val;
    size_t size, end;
    int rc;
    if ((rc = seg_locate(t, sc, docno, &key, &val, &size, m)))
        return rc;
    n = rd32(val);
    if (verify && !(!t->st_write && sc->val == val && sc->dir_ok)) {
        if ((rc = seg_dir_verify(key, val, n, m)))
            return rc;
        if (!t->st_write && sc->val == val)
            sc->dir_ok = 1;
    }
    int64_t i = dir_search(val, n, docno);
    if (i < 0)
        return store_fail(m, TARTAN_ENOTFOUND, "no document %u", docno);
    if (seg_entry(val, n, size, i, &off, &end))
        return store_fail(m, TARTAN_ECORRUPT, "segment %u: entry of document %u is out of place",
                          key, docno);
    return store_doc_parse(docno, val + off, end - off, code_bytes, token_bytes, verify, doc, m);
}

void store_doc_prefetch(store_txn *t, uint32_t docno, unsigned code_bytes, unsigned token_bytes)
{
    /* Its own segment cache: the reads it runs ahead of keep theirs. */
    store_msg scratch = {{0}};
    uint32_t key, off;
    const uint8_t *val;
    size_t size, end;
    if (t->st_write || seg_locate(t, &t->st_seg_pf, docno, &key, &val, &size, &scratch))
        return;
    uint32_t n = rd32(val);
    int64_t i = dir_search(val, n, docno);
    if (i < 0 || seg_entry(val, n, size, i, &off, &end) || end < off + STORE_DOC_HEAD)
        return;
    /* the head, and the codes (after ntok inverse norms; ntok from the record's size) */
    const char *rec = (const char *)val + off;
    size_t ntok = (end - off - STORE_DOC_HEAD) / (4 + code_bytes + token_bytes);
    const char *codes = rec + STORE_DOC_HEAD + ntok * 4;
    __builtin_prefetch(rec);
    for (size_t b = 0; b < ntok * code_bytes; b += 64)
        __builtin_prefetch(codes + b);
    __builtin_prefetch(codes + ntok * code_bytes - 1);
}

/* ---- iteration --------------------------------------------------------------------------- */

struct store_cursor {
    store_txn *sc_t;
    MDB_cursor *sc_cur;
    int sc_started;
    int sc_verify;
    store_seg sc_seg;
    uint32_t sc_i; /* next entry of sc_seg; sc_seg.n when done with it */
};

int store_docs_first(store_txn *t, int verify, store_cursor **out, store_msg *m)
{
    *out = NULL;
    store_cursor *c = calloc(1, sizeof *c);
    if (!c)
        return store_fail(m, ENOMEM, "out of memory");
    int rc = mdb_cursor_open(t->st_txn, t->st_gen->g_docs, &c->sc_cur);
    if (rc) {
        free(c);
        return store_map_lmdb(m, rc, "opening a cursor");
    }
    c->sc_verify = verify;
    c->sc_t = t;
    *out = c;
    return 0;
}

int store_docs_next(store_cursor *c, uint32_t *docno, const void **rec, size_t *size, store_msg *m)
{
    while (c->sc_i >= c->sc_seg.n) {
        MDB_val k, d;
        int rc = store_cget(c->sc_t, c->sc_cur, &k, &d, c->sc_started ? MDB_NEXT : MDB_FIRST);
        c->sc_started = 1;
        if (rc == MDB_NOTFOUND)
            return 0;
        if (rc)
            return store_map_lmdb(m, rc, "reading the documents");
        c->sc_seg.n = 0;
        c->sc_i = 0;
        if (k.mv_size != 4)
            return store_fail(m, TARTAN_ECORRUPT, "a document segment key has %zu bytes",
                              k.mv_size);
        uint32_t key = rd32(k.mv_data);
        *docno = key;
        /* Record sizes are checked record by record (store_doc_parse): a damaged record
         * condemns no neighbour. */
        if ((rc = store_seg_parse(key, d.mv_data, d.mv_size, 0, 0, c->sc_verify, &c->sc_seg, m)))
            return rc;
    }
    const uint8_t *r;
    store_seg_entry(&c->sc_seg, c->sc_i++, docno, &r, size);
    *rec = r;
    return 1;
}

void store_cursor_close(store_cursor *c)
{
    if (!c)
        return;
    mdb_cursor_close(c->sc_cur);
    free(c);
}

/* ---- appending --------------------------------------------------------------------------- */

struct store_appender {
    store_txn *t;
    unsigned cb, tb, psize;
    int open;     /* a segment is being filled */
    int reopened; /* it exists in the database already (rewritten, not appended) */
    uint32_t key;
    uint32_t n;
    uint32_t *dno, *off; /* [ncap] */
    size_t ncap;
    uint8_t *rec; /* records, one after another */
    size_t rlen, rcap;
    int any;       /* some document precedes the next one */
    uint32_t last; /* and this is its number */
};

static size_t seg_bytes(uint32_t n, size_t rlen)
{
    return STORE_SEG_HEAD + (size_t)n * STORE_SEG_ENTRY + rlen;
}

/* Whether a segment of size bytes takes no more: FORMAT.md's rule (see SEG_MIN). */
static int seg_closed(size_t size, unsigned psize)
{
    if (size >= SEG_MAX)
        return 1;
    if (size < SEG_MIN)
        return 0;
    size_t pages = (size + OVERFLOW_HEAD + psize - 1) / psize;
    return pages * psize - OVERFLOW_HEAD - size <= SEG_SLACK;
}

static int app_fit(store_appender *a, size_t n, size_t rlen, store_msg *m)
{
    if (n > a->ncap) {
        size_t cap = a->ncap ? 2 * a->ncap : 64;
        while (cap < n)
            cap *= 2;
        uint32_t *d = realloc(a->dno, cap * sizeof *d);
        if (!d)
            return store_fail(m, ENOMEM, "out of memory");
        a->dno = d;
        uint32_t *o = realloc(a->off, cap * sizeof *o);
        if (!o)
            return store_fail(m, ENOMEM, "out of memory");
        a->off = o;
        a->ncap = cap;
    }
    if (rlen > a->rcap) {
        size_t cap = a->rcap ? 2 * a->rcap : SEG_MIN;
        while (cap < rlen)
            cap *= 2;
        uint8_t *r = realloc(a->rec, cap);
        if (!r)
            return store_fail(m, ENOMEM, "out of memory for a segment of %zu bytes", rlen);
        a->rec = r;
        a->rcap = cap;
    }
    return 0;
}

/* Writes the segment being filled (FORMAT.md "docs": header, directory, records). */
static int app_flush(store_appender *a, store_msg *m)
{
    if (!a->open || a->n == 0) {
        a->open = 0;
        return 0;
    }
    a->t->st_dirty = 1;
    size_t total = seg_bytes(a->n, a->rlen);
    if (total > UINT32_MAX)
        return store_fail(m, TARTAN_ETOOBIG, "a segment of %zu bytes", total);
    unsigned key = a->key;
    MDB_val k = {sizeof key, &key}, d = {total, NULL};
    int rc = mdb_put(a->t->st_txn, a->t->st_gen->g_docs, &k, &d,
                     MDB_RESERVE | (a->reopened ? 0 : MDB_APPEND));
    if (rc == MDB_KEYEXIST)
        return store_fail(m, TARTAN_ECORRUPT,
                          "document %u is not above every document number in the index", key);
    if (rc)
        return store_map_lmdb(m, rc, "writing documents");
    uint8_t *v = d.mv_data;
    memcpy(v, &a->n, 4);
    uint32_t start = (uint32_t)(STORE_SEG_HEAD + (size_t)a->n * STORE_SEG_ENTRY);
    for (uint32_t i = 0; i < a->n; i++) {
        uint32_t o = start + a->off[i];
        memcpy(v + STORE_SEG_HEAD + (size_t)i * STORE_SEG_ENTRY, &a->dno[i], 4);
        memcpy(v + STORE_SEG_HEAD + (size_t)i * STORE_SEG_ENTRY + 4, &o, 4);
    }
    memcpy(v + start, a->rec, a->rlen);
    uint32_t c = store_seg_crc(key, v, a->n);
    memcpy(v + 4, &c, 4);
    a->open = 0;
    a->reopened = 0;
    a->n = 0;
    a->rlen = 0;
    memset(&a->t->st_seg, 0, sizeof a->t->st_seg);
    memset(&a->t->st_seg_pf, 0, sizeof a->t->st_seg_pf);
    return 0;
}

int store_docs_append_begin(store_txn *t, unsigned code_bytes, unsigned token_bytes,
                            store_appender **out, store_msg *m)
{
    *out = NULL;
    store_appender *a = calloc(1, sizeof *a);
    if (!a)
        return store_fail(m, ENOMEM, "out of memory");
    a->t = t;
    a->cb = code_bytes;
    a->tb = token_bytes;
    a->psize = t->st_gen->g_psize ? t->st_gen->g_psize : 4096;
    MDB_cursor *cur;
    int rc = docs_cursor(t, &cur, m);
    if (rc) {
        free(a);
        return rc;
    }
    MDB_val k, d;
    rc = store_cget(t, cur, &k, &d, MDB_LAST);
    if (rc == MDB_NOTFOUND) {
        *out = a;
        return 0;
    }
    if (rc) {
        free(a);
        return store_map_lmdb(m, rc, "reading the documents");
    }
    store_seg s;
    store_msg pm;
    uint32_t key = k.mv_size == 4 ? rd32(k.mv_data) : 0;
    a->any = 1;
    a->last = key;
    /* Reopen the last segment when it is sound and has room; a damaged one is left as it is
     * (tartan check reports it) and the new documents start a segment of their own. */
    if (k.mv_size == 4 && store_seg_parse(key, d.mv_data, d.mv_size, 0, 0, 1, &s, &pm) == 0) {
        uint32_t dn;
        const uint8_t *r;
        size_t sz;
        store_seg_entry(&s, s.n - 1, &dn, &r, &sz);
        a->last = dn;
        if (!seg_closed(d.mv_size, a->psize)) {
            size_t start = STORE_SEG_HEAD + (size_t)s.n * STORE_SEG_ENTRY;
            if ((rc = app_fit(a, s.n, d.mv_size - start, m))) {
                store_docs_append_free(a);
                return rc;
            }
            for (uint32_t i = 0; i < s.n; i++) {
                store_seg_entry(&s, i, &a->dno[i], &r, &sz);
                a->off[i] = (uint32_t)(r - s.val - start);
            }
            memcpy(a->rec, s.val + start, d.mv_size - start);
            a->rlen = d.mv_size - start;
            a->n = s.n;
            a->key = key;
            a->open = 1;
            a->reopened = 1;
        }
    }
    *out = a;
    return 0;
}

/* Makes room for a record of rsize bytes for docno at the end of the segment being filled,
 * closing it first when it is full; *at: where the record goes in a->rec. */
static int app_room(store_appender *a, uint32_t docno, size_t rsize, size_t *at, store_msg *m)
{
    if (a->any && docno <= a->last)
        return store_fail(m, TARTAN_ECORRUPT,
                          "document %u is not above the last document number %u", docno,
                          a->last);
    int rc;
    if (a->open && a->n > 0 &&
        (seg_closed(seg_bytes(a->n, a->rlen), a->psize) ||
         seg_bytes(a->n + 1, a->rlen + rsize) > SEG_MAX))
        if ((rc = app_flush(a, m)))
            return rc;
    if (!a->open) {
        a->open = 1;
        a->reopened = 0;
        a->key = docno;
        a->n = 0;
        a->rlen = 0;
    }
    if ((rc = app_fit(a, a->n + 1, a->rlen + rsize, m)))
        return rc;
    *at = a->rlen;
    a->dno[a->n] = docno;
    a->off[a->n] = (uint32_t)a->rlen;
    a->n++;
    a->rlen += rsize;
    a->any = 1;
    a->last = docno;
    return 0;
}

int store_docs_append(store_appender *a, uint32_t docno, uint32_t ntok, const float *inv_norms,
                      const void *codes, unsigned codes_width, const uint8_t *residuals,
                      store_msg *m)
{
    if (ntok == 0 || ntok > STORE_MAX_DOC_TOKENS)
        return store_fail(m, TARTAN_ETOOBIG, "document %u has %u tokens", docno, ntok);
    size_t rsize = store_doc_size(ntok, a->cb, a->tb), at;
    int rc = app_room(a, docno, rsize, &at, m);
    if (rc)
        return rc;
    uint8_t *r = a->rec + at;
    memcpy(r, &docno, 4);
    memcpy(r + 4, &ntok, 4);
    uint8_t *p = r + STORE_DOC_HEAD;
    memcpy(p, inv_norms, (size_t)ntok * 4);
    p += (size_t)ntok * 4;
    if (codes_width == a->cb) {
        memcpy(p, codes, (size_t)ntok * a->cb);
    } else if (a->cb == 2) {
        const uint32_t *c32 = codes;
        for (uint32_t i = 0; i < ntok; i++) {
            uint16_t v = (uint16_t)c32[i];
            memcpy(p + 2 * (size_t)i, &v, 2);
        }
    } else {
        const uint16_t *c16 = codes;
        for (uint32_t i = 0; i < ntok; i++) {
            uint32_t v = c16[i];
            memcpy(p + 4 * (size_t)i, &v, 4);
        }
    }
    p += (size_t)ntok * a->cb;
    memcpy(p, residuals, (size_t)ntok * a->tb);
    p += (size_t)ntok * a->tb;
    /* Padding is part of the checksummed bytes: zero it. */
    memset(p, 0, (size_t)(r + rsize - p));
    uint32_t c = store_doc_crc(r, rsize);
    memcpy(r + 8, &c, 4);
    return 0;
}

int store_docs_append_record(store_appender *a, uint32_t docno, const void *rec, size_t size,
                             store_msg *m)
{
    if (size < STORE_DOC_HEAD || size % 4 != 0 || rd32(rec) != docno)
        return store_fail(m, TARTAN_ECORRUPT, "document %u: not a record of that number", docno);
    size_t at;
    int rc = app_room(a, docno, size, &at, m);
    if (!rc)
        memcpy(a->rec + at, rec, size);
    return rc;
}

int store_docs_append_end(store_appender *a, store_msg *m)
{
    int rc = app_flush(a, m);
    store_docs_append_free(a);
    return rc;
}

void store_docs_append_free(store_appender *a)
{
    if (!a)
        return;
    free(a->dno);
    free(a->off);
    free(a->rec);
    free(a);
}

/* ---- deleting ---------------------------------------------------------------------------- */

int store_docs_delete(store_txn *t, const uint32_t *docnos, size_t n, store_msg *m)
{
    t->st_dirty = 1;
    uint8_t *copy = NULL;
    size_t copy_cap = 0;
    uint8_t *keep = NULL; /* per entry of the segment in hand: 1 to keep */
    size_t keep_cap = 0;
    int rc = 0;
    memset(&t->st_seg, 0, sizeof t->st_seg);
    memset(&t->st_seg_pf, 0, sizeof t->st_seg_pf);
    for (size_t i = 0; i < n && !rc;) {
        uint32_t key;
        const uint8_t *val;
        size_t size;
        rc = seg_find(t, docnos[i], &key, &val, &size, m);
        if (rc == TARTAN_ENOTFOUND) {
            rc = store_fail(m, TARTAN_ENOTFOUND, "no document %u", docnos[i]);
            break;
        }
        if (rc)
            break;
        store_seg s;
        if ((rc = store_seg_parse(key, val, size, 0, 0, 1, &s, m)))
            break;
        /* The value moves or is overwritten by the put below: work from a copy. */
        if (size > copy_cap) {
            uint8_t *c = realloc(copy, size);
            if (!c) {
                rc = store_fail(m, ENOMEM, "out of memory");
                break;
            }
            copy = c;
            copy_cap = size;
        }
        memcpy(copy, val, size);
        s.val = copy;
        if (s.n > keep_cap) {
            uint8_t *k = realloc(keep, s.n);
            if (!k) {
                rc = store_fail(m, ENOMEM, "out of memory");
                break;
            }
            keep = k;
            keep_cap = s.n;
        }
        memset(keep, 1, s.n);
        uint32_t last, nkeep = s.n;
        const uint8_t *r;
        size_t sz, rbytes = 0;
        store_seg_entry(&s, s.n - 1, &last, &r, &sz);
        /* Every requested number up to this segment's last one must be in it. */
        for (; i < n && docnos[i] <= last; i++) {
            int64_t e = dir_search(s.val, s.n, docnos[i]);
            if (e < 0) {
                rc = store_fail(m, TARTAN_ENOTFOUND, "no document %u", docnos[i]);
                break;
            }
            keep[e] = 0;
            nkeep--;
        }
        if (rc)
            break;
        unsigned kk = key;
        MDB_val k = {sizeof kk, &kk}, d;
        if (nkeep == 0) {
            rc = mdb_del(t->st_txn, t->st_gen->g_docs, &k, NULL);
            if (rc)
                rc = store_map_lmdb(m, rc, "deleting documents");
            continue;
        }
        for (uint32_t j = 0; j < s.n; j++) {
            uint32_t dn;
            store_seg_entry(&s, j, &dn, &r, &sz);
            if (keep[j])
                rbytes += sz;
        }
        d.mv_size = seg_bytes(nkeep, rbytes);
        d.mv_data = NULL;
        if ((rc = mdb_put(t->st_txn, t->st_gen->g_docs, &k, &d, MDB_RESERVE))) {
            rc = store_map_lmdb(m, rc, "rewriting a document segment");
            break;
        }
        uint8_t *v = d.mv_data;
        memcpy(v, &nkeep, 4);
        uint32_t o = (uint32_t)(STORE_SEG_HEAD + (size_t)nkeep * STORE_SEG_ENTRY), at = 0;
        for (uint32_t j = 0; j < s.n; j++) {
            uint32_t dn;
            store_seg_entry(&s, j, &dn, &r, &sz);
            if (!keep[j])
                continue;
            memcpy(v + STORE_SEG_HEAD + (size_t)at * STORE_SEG_ENTRY, &dn, 4);
            memcpy(v + STORE_SEG_HEAD + (size_t)at * STORE_SEG_ENTRY + 4, &o, 4);
            memcpy(v + o, r, sz);
            o += (uint32_t)sz;
            at++;
        }
        uint32_t c = store_seg_crc(key, v, nkeep);
        memcpy(v + 4, &c, 4);
    }
    free(copy);
    free(keep);
    return rc;
}
