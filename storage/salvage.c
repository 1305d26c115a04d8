/*
 * salvage.c: store_salvage, a damaged index rewritten from what survives of it (verify.h,
 * FORMAT.md "Salvage"). What it reports, by kind:
 *   removed   a document left out: its record is damaged or unreadable, or no external id of it
 *             survives (the message names its number and, when an id map still knows it, its id)
 *   rebuilt   a record derived again: the header (from the centroid and codec records when it is
 *             damaged), a segment whose directory was damaged (its records found by their own
 *             headers)
 *   dropped   a meta record whose checksum fails (written by another layer: calibration, codec
 *             extensions; its owner must write it again)
 *   lmdb      LMDB reported damaged pages while reading a database: what lies behind them is
 *             lost (its documents are reported as removed when an id map knows them)
 * Documents keep their numbers, records and ids; the inverted lists, both id maps and the
 * header's counts are rebuilt from the kept documents, so the salvaged index passes
 * store_verify and answers every query over its documents exactly as the index did before
 * the damage. The codec tables and the centroids cannot be derived from anything: damage to
 * them makes the index unsalvageable (TARTAN_ECORRUPT, nothing changed).
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "tartan.h"
#include "verify.h"

/* Pairs sorted into the inverted lists per pass over the kept documents (8 bytes each): the
 * lists are rebuilt a centroid range at a time within this much memory. */
#define PAIRS_PER_PASS ((size_t)16 << 20)

typedef struct idref {
    uint32_t docno;
    uint32_t len;
    const char *id; /* into the old environment's map */
} idref;

typedef struct sctx {
    store_verify_fn report;
    void *ctx;
    size_t removed;
    /* What the run said, given to report only once the rewrite is in place (a run may also
     * start again when the new map fills). */
    char **said;
    size_t n_said, said_cap;
    /* per run */
    idref *names, *ids; /* sound entries of each map, by document number */
    size_t n_names, n_ids;
    uint32_t max_docno; /* the largest number seen anywhere */
    int any_docno;
    uint8_t *kept; /* bit per number below max_docno + 1: kept */
    uint8_t *gone; /* bit: reported removed */
    size_t nbits;
} sctx;

static void say(sctx *s, const char *kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Keeps "kind\0message" for later (out of memory: the line is lost, the salvage goes on). */
static void say(sctx *s, const char *kind, const char *fmt, ...)
{
    char buf[640];
    int kl = snprintf(buf, sizeof buf, "%s", kind) + 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + kl, sizeof buf - (size_t)kl, fmt, ap);
    va_end(ap);
    if (s->n_said == s->said_cap) {
        size_t cap = s->said_cap ? 2 * s->said_cap : 64;
        char **p = realloc(s->said, cap * sizeof *p);
        if (!p)
            return;
        s->said = p;
        s->said_cap = cap;
    }
    size_t len = (size_t)kl + strlen(buf + kl) + 1;
    char *line = malloc(len);
    if (!line)
        return;
    memcpy(line, buf, len);
    s->said[s->n_said++] = line;
}

static void forget_said(sctx *s)
{
    for (size_t i = 0; i < s->n_said; i++)
        free(s->said[i]);
    s->n_said = 0;
}

static void see(sctx *s, uint32_t docno)
{
    if (!s->any_docno || docno > s->max_docno)
        s->max_docno = docno;
    s->any_docno = 1;
}

static int cmp_idref(const void *a, const void *b)
{
    uint32_t x = ((const idref *)a)->docno, y = ((const idref *)b)->docno;
    return (x > y) - (x < y);
}

static const idref *find_ref(const idref *v, size_t n, uint32_t docno)
{
    idref key = {docno, 0, NULL};
    return bsearch(&key, v, n, sizeof *v, cmp_idref);
}

/* The external id salvage knows for docno (names first, then ids), or NULL. */
static const idref *id_of(const sctx *s, uint32_t docno)
{
    const idref *r = find_ref(s->names, s->n_names, docno);
    return r ? r : find_ref(s->ids, s->n_ids, docno);
}

static void lost(sctx *s, uint32_t docno, const char *why)
{
    if (docno < s->nbits && (s->gone[docno >> 3] >> (docno & 7) & 1))
        return;
    if (docno < s->nbits)
        s->gone[docno >> 3] |= (uint8_t)(1u << (docno & 7));
    const idref *r = id_of(s, docno);
    s->removed++;
    if (r)
        say(s, "removed", "document %u (id '%.*s'): %s", docno, (int)(r->len > 64 ? 64 : r->len),
            r->id, why);
    else
        say(s, "removed", "document %u: %s", docno, why);
}

/* ---- reading the old environment -------------------------------------------------------- */

static int grow_refs(idref **v, size_t *cap, size_t n)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? 2 * *cap : 1024;
    idref *p = realloc(*v, c * sizeof *p);
    if (!p)
        return ENOMEM;
    *v = p;
    *cap = c;
    return 0;
}

/* A walk of one database's leaves said how many damaged pages it skipped. */
static void walked(sctx *s, const char *db, size_t damage, const char *lost_what)
{
    if (damage)
        say(s, "lmdb", "database '%s': %zu damaged page%s of LMDB's skipped; %s", db, damage,
            damage == 1 ? "" : "s", lost_what);
}

typedef struct ids_walk {
    sctx *s;
    size_t cap;
    int names; /* walking "names" (else "ids") */
    int oom;
} ids_walk;

static int id_leaf(void *ctx, const void *key, size_t klen, const void *val, size_t vlen)
{
    ids_walk *w = ctx;
    sctx *s = w->s;
    uint32_t docno;
    const char *id;
    size_t len;
    if (w->names) {
        if (klen != 4)
            return 0;
        memcpy(&docno, key, 4);
        if (store_names_decode(docno, val, vlen, &id, &len, NULL) || !store_id_valid(id, len))
            return 0;
    } else {
        if (store_ids_decode(key, klen, val, vlen, &docno, NULL) || !store_id_valid(key, klen))
            return 0;
        id = key;
        len = klen;
    }
    idref **v = w->names ? &s->names : &s->ids;
    size_t *n = w->names ? &s->n_names : &s->n_ids;
    if (grow_refs(v, &w->cap, *n)) {
        w->oom = 1;
        return 1;
    }
    (*v)[(*n)++] = (idref){docno, (uint32_t)len, id};
    see(s, docno);
    return 0;
}

/* The sound entries of both id maps (pointers into the old map), each sorted by number. */
static int read_ids(store_txn *src, sctx *s, store_msg *m)
{
    for (int names = 1; names >= 0; names--) {
        ids_walk w = {s, 0, names, 0};
        size_t damage;
        const char *db = names ? "names" : "ids";
        int rc = store_pages_leaves(src, db, id_leaf, &w, &damage, m);
        if (!rc && w.oom)
            rc = store_fail(m, ENOMEM, "out of memory");
        if (rc)
            return rc;
        walked(s, db, damage,
               names ? "the ids there come from 'ids'" : "the ids there come from 'names'");
    }
    qsort(s->names, s->n_names, sizeof *s->names, cmp_idref);
    qsort(s->ids, s->n_ids, sizeof *s->ids, cmp_idref);
    return 0;
}

/* Is a sound record's content usable: codes below K, inverse norms finite and positive? */
static int body_ok(const store_header *h, const store_doc *d)
{
    for (uint32_t t = 0; t < d->ntok; t++) {
        uint32_t c;
        if (h->code_bytes == 2) {
            uint16_t c16;
            memcpy(&c16, (const uint8_t *)d->codes + 2 * (size_t)t, 2);
            c = c16;
        } else {
            memcpy(&c, (const uint8_t *)d->codes + 4 * (size_t)t, 4);
        }
        float x;
        memcpy(&x, &d->inv_norms[t], 4);
        if (c >= h->n_centroids || !isfinite(x) || x <= 0)
            return 0;
    }
    return 1;
}

typedef struct doc_out {
    store_appender *a;
    uint64_t docs, tokens;
    int have_last;
    uint32_t last;
} doc_out;

/* Keeps one sound record (numbers arrive ascending; a record out of order is not kept). */
static int keep_record(sctx *s, const store_header *h, doc_out *o, uint32_t docno,
                       const uint8_t *rec, size_t size, store_msg *m)
{
    store_doc d;
    if (store_doc_parse(docno, rec, size, h->code_bytes, h->token_bytes, 1, &d, NULL) ||
        !body_ok(h, &d)) {
        lost(s, docno, "its record is damaged");
        return 0;
    }
    if ((o->have_last && docno <= o->last) || docno >= s->nbits) {
        lost(s, docno, "its record is out of order");
        return 0;
    }
    if (!id_of(s, docno)) {
        lost(s, docno, "no external id of it survives");
        return 0;
    }
    int rc = store_docs_append_record(o->a, docno, rec, size, m);
    if (rc)
        return rc;
    o->have_last = 1;
    o->last = docno;
    o->docs++;
    o->tokens += d.ntok;
    if (docno < s->nbits)
        s->kept[docno >> 3] |= (uint8_t)(1u << (docno & 7));
    return 0;
}

/* A segment whose directory is damaged: its records found by their own headers (number, token
 * count, checksum), scanning 4 bytes at a time past anything that does not check out. */
static int scan_records(sctx *s, const store_header *h, doc_out *o, uint32_t key,
                        const uint8_t *val, size_t size, store_msg *m)
{
    size_t found = 0;
    for (size_t off = STORE_SEG_HEAD; off + STORE_DOC_HEAD <= size;) {
        uint32_t docno, ntok;
        memcpy(&docno, val + off, 4);
        memcpy(&ntok, val + off + 4, 4);
        size_t rs = ntok && ntok <= STORE_MAX_DOC_TOKENS
                        ? store_doc_size(ntok, h->code_bytes, h->token_bytes)
                        : 0;
        store_doc d;
        if (docno >= key && rs && off + rs <= size && (!o->have_last || docno > o->last) &&
            store_doc_parse(docno, val + off, rs, h->code_bytes, h->token_bytes, 1, &d, NULL) ==
                0) {
            see(s, docno);
            int rc = keep_record(s, h, o, docno, val + off, rs, m);
            if (rc)
                return rc;
            found++;
            off += rs;
        } else {
            off += 4;
        }
    }
    say(s, "rebuilt", "segment %u: its directory was damaged; %zu record%s found by their own "
        "headers", key, found, found == 1 ? "" : "s");
    return 0;
}

typedef struct docs_walk {
    sctx *s;
    const store_header *h;
    doc_out *o;
    int rc;
    store_msg *m;
} docs_walk;

static int doc_leaf(void *ctx, const void *key, size_t klen, const void *val, size_t vlen)
{
    docs_walk *w = ctx;
    if (klen != 4)
        return 0;
    uint32_t k;
    memcpy(&k, key, 4);
    store_seg sg;
    if (store_seg_parse(k, val, vlen, 0, 0, 1, &sg, NULL) == 0) {
        for (uint32_t i = 0; i < sg.n && !w->rc; i++) {
            uint32_t docno;
            const uint8_t *rec;
            size_t size;
            store_seg_entry(&sg, i, &docno, &rec, &size);
            see(w->s, docno);
            w->rc = keep_record(w->s, w->h, w->o, docno, rec, size, w->m);
        }
    } else if ((uintptr_t)val % 4 == 0) {
        w->rc = scan_records(w->s, w->h, w->o, k, val, vlen, w->m);
    }
    return w->rc != 0;
}

/* The largest number a segment names (its key, its directory's last), for the bitmaps. */
static int max_leaf(void *ctx, const void *key, size_t klen, const void *val, size_t vlen)
{
    sctx *s = ctx;
    if (klen != 4)
        return 0;
    uint32_t k;
    memcpy(&k, key, 4);
    see(s, k);
    store_seg sg;
    if (store_seg_parse(k, val, vlen, 0, 0, 0, &sg, NULL) == 0) {
        uint32_t last;
        const uint8_t *r;
        size_t sz;
        store_seg_entry(&sg, sg.n - 1, &last, &r, &sz);
        see(s, last);
    }
    return 0;
}

static int copy_docs(store_txn *src, store_txn *dst, sctx *s, const store_header *h, doc_out *o,
                     store_msg *m)
{
    int rc = store_docs_append_begin(dst, h->code_bytes, h->token_bytes, &o->a, m);
    if (rc)
        return rc;
    docs_walk w = {s, h, o, 0, m};
    size_t damage;
    rc = store_pages_leaves(src, "docs", doc_leaf, &w, &damage, m);
    if (!rc)
        rc = w.rc;
    if (rc) {
        store_docs_append_free(o->a);
        return rc;
    }
    walked(s, "docs", damage, "the documents there are lost");
    return store_docs_append_end(o->a, m);
}

/* ---- writing the new one ------------------------------------------------------------------ */

static int cmp_id_bytes(const void *a, const void *b)
{
    const idref *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->id, y->id, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Both id maps for the kept documents; a document whose id another kept document has
 * already is removed (only damage can have bound one id twice). */
static int write_ids(store_txn *dst, sctx *s, doc_out *o, store_msg *m)
{
    size_t n = 0;
    idref *v = malloc((o->docs ? o->docs : 1) * sizeof *v);
    if (!v)
        return store_fail(m, ENOMEM, "out of memory");
    for (uint64_t d = 0; d < s->nbits; d++)
        if (s->kept[d >> 3] >> (d & 7) & 1)
            v[n++] = *id_of(s, (uint32_t)d);
    qsort(v, n, sizeof *v, cmp_id_bytes);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (i > 0 && !cmp_id_bytes(&v[i], &v[i - 1])) {
            /* Keep the one 'ids' names (or the first); drop the other document. */
            rc = TARTAN_EDUPID;
            break;
        }
        rc = store_ids_put_raw(dst->st_txn, dst->st_gen->g_ids, v[i].id, v[i].len, v[i].docno,
                               MDB_APPEND, m);
    }
    if (rc == TARTAN_EDUPID)
        rc = store_fail(m, TARTAN_ECORRUPT, "two documents are bound to one id; salvage cannot "
                        "tell which is the id's");
    for (uint64_t d = 0; d < s->nbits && !rc; d++) {
        if (!(s->kept[d >> 3] >> (d & 7) & 1))
            continue;
        const idref *r = id_of(s, (uint32_t)d);
        rc = store_names_put_raw(dst->st_txn, dst->st_gen->g_names, (uint32_t)d, r->id, r->len,
                                 MDB_APPEND, m);
    }
    free(v);
    return rc;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Calls fn(ctx, docno, codes, n) with each document's distinct codes (ascending), in number
 * order, for the new environment's documents. */
typedef void (*codes_fn)(void *ctx, uint32_t docno, const uint32_t *codes, size_t n);

static int walk_codes(store_txn *dst, const store_header *h, codes_fn fn, void *ctx, store_msg *m)
{
    store_cursor *cur;
    int rc = store_docs_first(dst, 0, &cur, m);
    if (rc)
        return rc;
    uint32_t *codes = NULL;
    size_t cap = 0;
    uint32_t docno;
    const void *rec;
    size_t size;
    while ((rc = store_docs_next(cur, &docno, &rec, &size, m)) == 1) {
        store_doc d;
        if ((rc = store_doc_parse(docno, rec, size, h->code_bytes, h->token_bytes, 0, &d, m)))
            break;
        if (d.ntok > cap) {
            uint32_t *p = realloc(codes, d.ntok * sizeof *p);
            if (!p) {
                rc = store_fail(m, ENOMEM, "out of memory");
                break;
            }
            codes = p;
            cap = d.ntok;
        }
        for (uint32_t t = 0; t < d.ntok; t++) {
            if (h->code_bytes == 2) {
                uint16_t c16;
                memcpy(&c16, (const uint8_t *)d.codes + 2 * (size_t)t, 2);
                codes[t] = c16;
            } else {
                memcpy(&codes[t], (const uint8_t *)d.codes + 4 * (size_t)t, 4);
            }
        }
        qsort(codes, d.ntok, sizeof *codes, cmp_u32);
        size_t n = 0;
        for (uint32_t t = 0; t < d.ntok; t++)
            if (n == 0 || codes[t] != codes[n - 1])
                codes[n++] = codes[t];
        fn(ctx, docno, codes, n);
    }
    store_cursor_close(cur);
    free(codes);
    return rc;
}

typedef struct pairs {
    uint64_t *per;      /* [K] entries per centroid */
    uint32_t c0, c1;    /* the range being collected */
    uint32_t *pc, *pd;  /* its pairs, in document order */
    size_t np;
} pairs;

static void count_codes(void *ctx, uint32_t docno, const uint32_t *codes, size_t n)
{
    (void)docno;
    pairs *p = ctx;
    for (size_t i = 0; i < n; i++)
        p->per[codes[i]]++;
}

static void take_codes(void *ctx, uint32_t docno, const uint32_t *codes, size_t n)
{
    pairs *p = ctx;
    for (size_t i = 0; i < n; i++)
        if (codes[i] >= p->c0 && codes[i] < p->c1) {
            p->pc[p->np] = codes[i];
            p->pd[p->np] = docno;
            p->np++;
        }
}

/* The last centroid (exclusive) of the range from c0 whose entries fit PAIRS_PER_PASS (one
 * centroid at least). */
static uint32_t range_end(const uint64_t *per, size_t K, uint32_t c0, uint64_t *sum)
{
    uint32_t c1 = c0;
    *sum = 0;
    while (c1 < K && (c1 == c0 || *sum + per[c1] <= PAIRS_PER_PASS))
        *sum += per[c1++];
    return c1;
}

/* The inverted lists from the new environment's documents, a centroid range per pass. */
static int write_lists(store_txn *dst, const store_header *h, uint64_t *postings, store_msg *m)
{
    size_t K = h->n_centroids;
    *postings = 0;
    if (!K)
        return 0;
    pairs p;
    memset(&p, 0, sizeof p);
    uint32_t *sd = NULL;
    size_t *start = NULL;
    p.per = calloc(K, sizeof *p.per);
    if (!p.per)
        return store_fail(m, ENOMEM, "out of memory");
    int rc = walk_codes(dst, h, count_codes, &p, m);
    uint64_t cap = 0, sum;
    for (uint32_t c = 0; !rc && c < K;) {
        uint32_t e = range_end(p.per, K, c, &sum);
        if (sum > cap)
            cap = sum;
        c = e;
    }
    if (!rc) {
        p.pc = malloc((cap ? cap : 1) * sizeof *p.pc);
        p.pd = malloc((cap ? cap : 1) * sizeof *p.pd);
        sd = malloc((cap ? cap : 1) * sizeof *sd);
        start = malloc((K + 1) * sizeof *start);
        if (!p.pc || !p.pd || !sd || !start)
            rc = store_fail(m, ENOMEM, "out of memory for %llu inverted-list entries",
                            (unsigned long long)cap);
    }
    for (uint32_t c0 = 0; !rc && c0 < K;) {
        p.c0 = c0;
        p.c1 = range_end(p.per, K, c0, &sum);
        p.np = 0;
        if ((rc = walk_codes(dst, h, take_codes, &p, m)))
            break;
        /* Stable counting sort by centroid keeps each list's documents ascending. */
        size_t nc = p.c1 - p.c0;
        memset(start, 0, (nc + 1) * sizeof *start);
        for (size_t i = 0; i < p.np; i++)
            start[p.pc[i] - p.c0 + 1]++;
        for (size_t c = 0; c < nc; c++)
            start[c + 1] += start[c];
        for (size_t i = 0; i < p.np; i++)
            sd[start[p.pc[i] - p.c0]++] = p.pd[i];
        size_t at = 0;
        for (size_t c = 0; c < nc && !rc; c++) {
            size_t end = at + (size_t)p.per[p.c0 + c];
            for (size_t b = at; b < end && !rc; b += STORE_IVF_BLOCK) {
                size_t take = end - b < STORE_IVF_BLOCK ? end - b : STORE_IVF_BLOCK;
                rc = store_ivf_put_block(dst->st_txn, dst->st_gen->g_ivf,
                                         store_ivf_key((uint32_t)(p.c0 + c), sd[b]), sd + b, take,
                                         1, m);
            }
            at = end;
        }
        *postings += p.np;
        c0 = p.c1;
    }
    free(p.per);
    free(p.pc);
    free(p.pd);
    free(sd);
    free(start);
    return rc;
}

/* ---- the model -------------------------------------------------------------------------- */

/* The old index's meta records and centroid record, found by walking their pages. */
typedef struct model_walk {
    const uint8_t **names, **vals;
    size_t *nlen, *vlen;
    int n, cap, oom;
    const uint8_t *cent, *cent_copy; /* the centroid record (key 0) and its copy (key 1) */
    size_t cent_len, cent_copy_len;
    const uint8_t *cent_stray; /* a sound centroid record under another key (a damaged one) */
    size_t cent_stray_len;
} model_walk;

static int meta_leaf(void *ctx, const void *key, size_t klen, const void *val, size_t vlen)
{
    model_walk *w = ctx;
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 32;
        const uint8_t **a = realloc(w->names, cap * sizeof *a), **b;
        if (a)
            w->names = a;
        b = realloc(w->vals, cap * sizeof *b);
        if (b)
            w->vals = b;
        size_t *c = realloc(w->nlen, cap * sizeof *c), *d;
        if (c)
            w->nlen = c;
        d = realloc(w->vlen, cap * sizeof *d);
        if (d)
            w->vlen = d;
        if (!a || !b || !c || !d) {
            w->oom = 1;
            return 1;
        }
        w->cap = cap;
    }
    w->names[w->n] = key;
    w->nlen[w->n] = klen;
    w->vals[w->n] = val;
    w->vlen[w->n] = vlen;
    w->n++;
    return 0;
}

/* Whether meta entry i's checksum holds. */
static int meta_sound(const model_walk *w, int i)
{
    uint32_t want;
    if (w->vlen[i] < 4)
        return 0;
    memcpy(&want, w->vals[i], 4);
    return store_meta_crc(w->names[i], w->nlen[i], w->vals[i] + 4, w->vlen[i] - 4) == want;
}

/* Whether a centroid record's checksum holds (its shape is checked against the header). */
static int cent_sound(const uint8_t *val, size_t size)
{
    uint32_t want;
    memcpy(&want, val + 12, 4);
    uint32_t c = store_crc32c(0, val, 12);
    return store_crc32c(c, val + STORE_CENT_HEAD, size - STORE_CENT_HEAD) == want;
}

static int cent_leaf(void *ctx, const void *key, size_t klen, const void *val, size_t vlen)
{
    model_walk *w = ctx;
    uint32_t k;
    if (klen == 4 && (memcpy(&k, key, 4), k == 0)) {
        w->cent = val;
        w->cent_len = vlen;
    } else if (klen == 4 && k == STORE_CENT_COPY_KEY) {
        w->cent_copy = val;
        w->cent_copy_len = vlen;
    } else if (!w->cent_stray && vlen >= STORE_CENT_HEAD && cent_sound(val, vlen)) {
        /* The checksum does not cover the key: a record whose key was damaged is still the
         * table (or its copy). */
        w->cent_stray = val;
        w->cent_stray_len = vlen;
    }
    return 0;
}

/* A sound meta record's data: 0, TARTAN_ENOTFOUND (absent), TARTAN_ECORRUPT (checksum). */
static int meta_record(const model_walk *w, const char *name, const void **d, size_t *len)
{
    for (int i = 0; i < w->n; i++) {
        if (w->nlen[i] != strlen(name) || memcmp(w->names[i], name, w->nlen[i]))
            continue;
        uint32_t want;
        if (w->vlen[i] < 4)
            return TARTAN_ECORRUPT;
        memcpy(&want, w->vals[i], 4);
        if (store_meta_crc(name, w->nlen[i], w->vals[i] + 4, w->vlen[i] - 4) != want)
            return TARTAN_ECORRUPT;
        *d = w->vals[i] + 4;
        *len = w->vlen[i] - 4;
        return 0;
    }
    return TARTAN_ENOTFOUND;
}

/* Header, codec and centroids: copied when sound, the header rebuilt from the other two when
 * not. Fails (the index cannot be salvaged) when the codec or centroids are damaged. Meta
 * records of other layers: copied when sound, dropped (and said) when not. */
static int salvage_model(store_txn *src, store_txn *dst, sctx *s, store_header *h, int *h_ok,
                         store_msg *m)
{
    model_walk *w = calloc(1, sizeof *w);
    if (!w)
        return store_fail(m, ENOMEM, "out of memory");
    size_t dmeta, dcent;
    int rc = store_pages_leaves(src, "meta", meta_leaf, w, &dmeta, m);
    if (!rc && w->oom)
        rc = store_fail(m, ENOMEM, "out of memory");
    if (!rc)
        rc = store_pages_leaves(src, "centroids", cent_leaf, w, &dcent, m);
    if (rc)
        goto out;
    walked(s, "meta", dmeta, "the records there are lost");
    if (dmeta) {
        /* Read from pages no sound tree holds: other trees' entries come along; keep only
         * what checks out as a meta record. */
        int k = 0;
        for (int i = 0; i < w->n; i++)
            if (meta_sound(w, i)) {
                w->names[k] = w->names[i];
                w->nlen[k] = w->nlen[i];
                w->vals[k] = w->vals[i];
                w->vlen[k] = w->vlen[i];
                k++;
            }
        w->n = k;
    }
    const void *hd = NULL, *cd = NULL;
    size_t hl = 0, clen = 0;
    store_msg hm = {{0}};
    int hrc = meta_record(w, STORE_KEY_HEADER, &hd, &hl);
    *h_ok = hrc == 0 && store_header_decode(hd, hl, h, &hm) == 0;
    if (hrc)
        snprintf(hm.text, sizeof hm.text, "%s",
                 hrc == TARTAN_ENOTFOUND ? "missing" : "checksum mismatch");
    int crc = meta_record(w, STORE_KEY_CODEC, &cd, &clen);
    if (crc) {
        /* The second copy (FORMAT.md "meta/codec"), when the primary is damaged or lost. */
        const void *cc;
        size_t cl;
        if (meta_record(w, STORE_KEY_CODEC_COPY, &cc, &cl) == 0) {
            say(s, "rebuilt", "the codec tables, from their copy ('%s'): the primary is %s",
                STORE_KEY_CODEC_COPY, crc == TARTAN_ENOTFOUND ? "missing" : "damaged");
            cd = cc;
            clen = cl;
            crc = 0;
        }
    }
    /* The centroid table: the primary, else its copy, whichever checks out (its own checksum;
     * its shape against the header below). */
    if (w->cent && (w->cent_len < STORE_CENT_HEAD || !cent_sound(w->cent, w->cent_len)) &&
        w->cent_copy && w->cent_copy_len >= STORE_CENT_HEAD &&
        cent_sound(w->cent_copy, w->cent_copy_len)) {
        say(s, "rebuilt", "the centroid table, from its copy (key %u): the primary is damaged",
            STORE_CENT_COPY_KEY);
        w->cent = w->cent_copy;
        w->cent_len = w->cent_copy_len;
    } else if (!w->cent && w->cent_copy) {
        say(s, "rebuilt", "the centroid table, from its copy (key %u): the primary is lost",
            STORE_CENT_COPY_KEY);
        w->cent = w->cent_copy;
        w->cent_len = w->cent_copy_len;
    }
    if ((!w->cent || w->cent_len < STORE_CENT_HEAD || !cent_sound(w->cent, w->cent_len)) &&
        w->cent_stray) {
        say(s, "rebuilt", "the centroid table, from a sound record under a damaged key");
        w->cent = w->cent_stray;
        w->cent_len = w->cent_stray_len;
    }
    if (crc == TARTAN_ECORRUPT) {
        rc = store_fail(m, TARTAN_ECORRUPT,
                        "the codec tables are damaged: the documents cannot be decoded without "
                        "them; rebuild the index from its embeddings");
        goto out;
    }
    if (!*h_ok) {
        uint32_t rk = 0, rd = 0;
        if (w->cent && w->cent_len >= STORE_CENT_HEAD) {
            memcpy(&rk, w->cent, 4);
            memcpy(&rd, w->cent + 4, 4);
        }
        size_t b = (clen / 4 + 1) / 2;
        unsigned nbits = b == 2 ? 1 : b == 4 ? 2 : b == 16 ? 4 : b == 256 ? 8 : 0;
        memset(h, 0, sizeof *h);
        h->dim = rd;
        h->nbits = nbits;
        h->n_centroids = rk;
        h->code_bytes = rk <= 65536u ? 2 : 4;
        h->token_bytes = rd * nbits / 8;
        h->seed = 42;
        h->kmeans_iters = 4;
        if (crc || !w->cent || !nbits || !rd || !rk || rd > 65536 || (rd * nbits) % 8) {
            rc = store_fail(m, TARTAN_ECORRUPT,
                            "the header is damaged (%s) and cannot be rebuilt from the model "
                            "records; create the index again",
                            hm.text);
            goto out;
        }
        say(s, "rebuilt",
            "the header (dim %u, nbits %u, %u centroids from the model records; seed, k-means "
            "iterations and sample size unknown: 42, 4, default)",
            rd, nbits, rk);
    }
    if (h->n_centroids) {
        int dtype;
        const void *data;
        store_msg pm;
        if (crc == TARTAN_ENOTFOUND || !w->cent) {
            rc = store_fail(m, TARTAN_ECORRUPT,
                            "the index has %u centroids but its %s record is %s; rebuild the "
                            "index from its embeddings",
                            h->n_centroids, !w->cent ? "centroid" : "codec",
                            dcent && !w->cent ? "unreadable" : "missing");
            goto out;
        }
        if (store_centroids_check(w->cent, w->cent_len, h->n_centroids, h->dim, 1, &dtype, &data,
                                  &pm)) {
            rc = store_fail(m, TARTAN_ECORRUPT,
                            "%s: the documents cannot be decoded without the centroids; rebuild "
                            "the index from its embeddings",
                            pm.text);
            goto out;
        }
        size_t nb = (size_t)1 << h->nbits;
        if (clen != (2 * nb - 1) * 4) {
            rc = store_fail(m, TARTAN_ECORRUPT, "the codec tables have %zu bytes, not %zu", clen,
                            (2 * nb - 1) * 4);
            goto out;
        }
        unsigned key = 0;
        MDB_val k = {sizeof key, &key}, d = {w->cent_len, (void *)w->cent};
        if ((rc = mdb_put(dst->st_txn, dst->st_gen->g_centroids, &k, &d, 0))) {
            rc = store_map_lmdb(m, rc, "writing the centroids");
            goto out;
        }
        if ((rc = store_centroids_put_copy(dst, w->cent, w->cent_len, m)))
            goto out;
        float t[511];
        memcpy(t, cd, clen);
        if ((rc = store_codec_put(dst, h->nbits, t, t + nb - 1, m)))
            goto out;
    } else if (w->cent || crc == 0) {
        say(s, "dropped", "a model record of an index never trained");
    }
    /* Meta records of other layers. */
    static const char *const own[] = {STORE_KEY_FORMAT, STORE_KEY_HEADER, STORE_KEY_CODEC,
                                      STORE_KEY_CODEC_COPY, STORE_KEY_COMMIT};
    for (int i = 0; i < w->n && !rc; i++) {
        int skip = 0;
        for (size_t j = 0; j < sizeof own / sizeof own[0]; j++)
            skip |= w->nlen[i] == strlen(own[j]) && !memcmp(w->names[i], own[j], w->nlen[i]);
        if (skip)
            continue;
        int kl = (int)(w->nlen[i] > 64 ? 64 : w->nlen[i]);
        if (!meta_sound(w, i)) {
            /* A record named codec.* is part of the codec (FORMAT.md): the documents cannot
             * be decoded without it, so it cannot be dropped as another layer's would be. */
            if (w->nlen[i] > 6 && !memcmp(w->names[i], "codec.", 6)) {
                rc = store_fail(m, TARTAN_ECORRUPT,
                                "meta record '%.*s' (part of the codec) is damaged: the documents "
                                "cannot be decoded without it, so the index cannot be salvaged",
                                kl, (const char *)w->names[i]);
                break;
            }
            say(s, "dropped", "meta record '%.*s': its checksum fails", kl,
                (const char *)w->names[i]);
            continue;
        }
        MDB_val k = {w->nlen[i], (void *)w->names[i]}, d = {w->vlen[i], (void *)w->vals[i]};
        if ((rc = mdb_put(dst->st_txn, dst->st_gen->g_meta, &k, &d, 0)))
            rc = store_map_lmdb(m, rc, "writing meta");
        else
            rc = store_format_raise(dst, store_format_needs(w->names[i], w->nlen[i]), m);
    }
out:
    free(w->names);
    free(w->vals);
    free(w->nlen);
    free(w->vlen);
    free(w);
    return rc;
}

static int salvage_fn(store_txn *src, store_txn *dst, void *vctx, store_msg *m)
{
    sctx *s = vctx;
    free(s->names);
    free(s->ids);
    free(s->kept);
    free(s->gone);
    s->names = s->ids = NULL;
    s->kept = s->gone = NULL;
    s->n_names = s->n_ids = 0;
    s->any_docno = 0;
    s->max_docno = 0;
    s->removed = 0;
    forget_said(s);
    if (src->st_gen->g_version < STORE_FORMAT_VERSION || src->st_gen->g_version > STORE_FORMAT_MAX)
        return store_fail(m, TARTAN_EVERSION, "salvage reads only format versions %u to %u",
                          STORE_FORMAT_VERSION, STORE_FORMAT_MAX);
    store_header h;
    int h_ok, rc;
    if ((rc = salvage_model(src, dst, s, &h, &h_ok, m)) || (rc = read_ids(src, s, m)))
        return rc;
    if (h_ok && h.next_docno)
        see(s, h.next_docno - 1);
    /* The largest number the documents name sizes the bitmaps below. */
    size_t damage;
    if ((rc = store_pages_leaves(src, "docs", max_leaf, s, &damage, m)))
        return rc;
    /* Records found by scanning may carry numbers beyond all of that: the bitmaps grow to the
     * largest 32-bit number only when a record says so (keep_record checks the bound). */
    s->nbits = (size_t)s->max_docno + 1 + (1u << 16);
    if (s->nbits < (size_t)s->max_docno)
        s->nbits = (size_t)UINT32_MAX + 1;
    s->kept = calloc(s->nbits / 8 + 1, 1);
    s->gone = calloc(s->nbits / 8 + 1, 1);
    if (!s->kept || !s->gone)
        return store_fail(m, ENOMEM, "out of memory");
    doc_out o;
    memset(&o, 0, sizeof o);
    if (h.n_centroids && (rc = copy_docs(src, dst, s, &h, &o, m)))
        return rc;
    /* Documents an id map knows and no sound record holds. */
    for (size_t i = 0; i < s->n_names; i++)
        if (!(s->names[i].docno < s->nbits &&
              (s->kept[s->names[i].docno >> 3] >> (s->names[i].docno & 7) & 1)))
            lost(s, s->names[i].docno, "its record is missing or unreadable");
    for (size_t i = 0; i < s->n_ids; i++)
        if (!(s->ids[i].docno < s->nbits &&
              (s->kept[s->ids[i].docno >> 3] >> (s->ids[i].docno & 7) & 1)))
            lost(s, s->ids[i].docno, "its record is missing or unreadable");
    uint64_t postings;
    if ((rc = write_ids(dst, s, &o, m)) || (rc = write_lists(dst, &h, &postings, m)))
        return rc;
    h.n_docs = o.docs;
    h.n_tokens = o.tokens;
    h.n_postings = postings;
    uint64_t next = s->any_docno ? (uint64_t)s->max_docno + 1 : 0;
    if (h_ok && h.next_docno > next)
        next = h.next_docno;
    h.next_docno = next > UINT32_MAX ? UINT32_MAX : (uint32_t)next;
    return store_header_put(dst, &h, m);
}

int store_salvage(store_env *env, store_verify_fn report, void *ctx, size_t *n_removed,
                  store_msg *m)
{
    sctx s;
    memset(&s, 0, sizeof s);
    s.report = report;
    s.ctx = ctx;
    int rc = store_rewrite_salvage(env, salvage_fn, &s, m);
    if (n_removed)
        *n_removed = rc ? 0 : s.removed;
    for (size_t i = 0; i < s.n_said && !rc && report; i++) {
        const char *kind = s.said[i];
        if (report(ctx, kind, kind + strlen(kind) + 1))
            break;
    }
    forget_said(&s);
    free(s.said);
    free(s.names);
    free(s.ids);
    free(s.kept);
    free(s.gone);
    return rc;
}
