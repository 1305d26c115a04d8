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

/* The sound entries of both id maps (pointers into the old map). */
static int read_ids(store_txn *src, sctx *s, store_msg *m)
{
    size_t cap_n = 0, cap_i = 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(src->st_txn, src->st_gen->g_names, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the names");
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while ((rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        uint32_t docno;
        const char *id;
        size_t len;
        if (k.mv_size != 4)
            continue;
        memcpy(&docno, k.mv_data, 4);
        if (store_names_decode(docno, d.mv_data, d.mv_size, &id, &len, NULL) ||
            !store_id_valid(id, len))
            continue;
        if (grow_refs(&s->names, &cap_n, s->n_names)) {
            mdb_cursor_close(cur);
            return store_fail(m, ENOMEM, "out of memory");
        }
        s->names[s->n_names++] = (idref){docno, (uint32_t)len, id};
        see(s, docno);
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) {
        if (!store_lmdb_code(rc) || (rc != MDB_CORRUPTED && rc != MDB_PAGE_NOTFOUND))
            return store_map_lmdb(m, rc, "reading the names");
        say(s, "lmdb", "database 'names': LMDB reports damaged pages (%s); the ids behind them "
            "come from 'ids'", mdb_strerror(rc));
    }
    /* Written in number order; sort anyway (damage may have disordered keys). */
    qsort(s->names, s->n_names, sizeof *s->names, cmp_idref);

    if ((rc = mdb_cursor_open(src->st_txn, src->st_gen->g_ids, &cur)))
        return store_map_lmdb(m, rc, "opening the ids");
    op = MDB_FIRST;
    while ((rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        uint32_t docno;
        if (store_ids_decode(k.mv_data, k.mv_size, d.mv_data, d.mv_size, &docno, NULL) ||
            !store_id_valid(k.mv_data, k.mv_size))
            continue;
        if (grow_refs(&s->ids, &cap_i, s->n_ids)) {
            mdb_cursor_close(cur);
            return store_fail(m, ENOMEM, "out of memory");
        }
        s->ids[s->n_ids++] = (idref){docno, (uint32_t)k.mv_size, k.mv_data};
        see(s, docno);
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) {
        if (!store_lmdb_code(rc) || (rc != MDB_CORRUPTED && rc != MDB_PAGE_NOTFOUND))
            return store_map_lmdb(m, rc, "reading the ids");
        say(s, "lmdb", "database 'ids': LMDB reports damaged pages (%s); the ids behind them "
            "come from 'names'", mdb_strerror(rc));
    }
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

static int copy_docs(store_txn *src, store_txn *dst, sctx *s, const store_header *h, doc_out *o,
                     store_msg *m)
{
    int rc = store_docs_append_begin(dst, h->code_bytes, h->token_bytes, &o->a, m);
    if (rc)
        return rc;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(src->st_txn, src->st_gen->g_docs, &cur))) {
        store_docs_append_free(o->a);
        return store_map_lmdb(m, rc, "opening the documents");
    }
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    int mrc;
    rc = 0;
    while (!rc && (mrc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 4)
            continue;
        uint32_t key;
        memcpy(&key, k.mv_data, 4);
        store_seg sg;
        if (store_seg_parse(key, d.mv_data, d.mv_size, 0, 0, 1, &sg, NULL) == 0) {
            for (uint32_t i = 0; i < sg.n && !rc; i++) {
                uint32_t docno;
                const uint8_t *rec;
                size_t size;
                store_seg_entry(&sg, i, &docno, &rec, &size);
                see(s, docno);
                rc = keep_record(s, h, o, docno, rec, size, m);
            }
        } else if ((uintptr_t)d.mv_data % 4 == 0) {
            rc = scan_records(s, h, o, key, d.mv_data, d.mv_size, m);
        }
    }
    mdb_cursor_close(cur);
    if (!rc && mrc != MDB_NOTFOUND) {
        if (mrc != MDB_CORRUPTED && mrc != MDB_PAGE_NOTFOUND)
            rc = store_map_lmdb(m, mrc, "reading the documents");
        else
            say(s, "lmdb", "database 'docs': LMDB reports damaged pages (%s); the documents "
                "behind them are lost", mdb_strerror(mrc));
    }
    if (rc) {
        store_docs_append_free(o->a);
        return rc;
    }
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

/* Header, codec and centroids: copied when sound, the header rebuilt from the other two when
 * not. Fails (the index cannot be salvaged) when the codec or centroids are damaged. */
static int salvage_model(store_txn *src, store_txn *dst, sctx *s, store_header *h, int *h_ok,
                         store_msg *m)
{
    store_msg hm;
    *h_ok = store_header_get(src, h, &hm) == 0;
    const void *cd = NULL;
    size_t clen = 0;
    store_msg pm;
    int crc = store_meta_get(src, STORE_KEY_CODEC, &cd, &clen, &pm);
    if (crc == TARTAN_ECORRUPT)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the codec tables are damaged (%s): the documents cannot be decoded "
                          "without them; rebuild the index from its embeddings",
                          pm.text);
    if (crc && crc != TARTAN_ENOTFOUND) {
        *m = pm;
        return crc;
    }
    unsigned key = 0;
    MDB_val k = {sizeof key, &key}, d;
    int r = mdb_get(src->st_txn, src->st_gen->g_centroids, &k, &d);
    if (r && r != MDB_NOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the centroids cannot be read (%s); rebuild the index from its "
                          "embeddings",
                          mdb_strerror(r));
    if (!*h_ok) {
        if (r == MDB_NOTFOUND || crc == TARTAN_ENOTFOUND)
            return store_fail(m, TARTAN_ECORRUPT,
                              "the header is damaged (%s) and the index has no trained model to "
                              "rebuild it from; create the index again",
                              hm.text);
        uint32_t rk = 0, rd = 0;
        if (d.mv_size >= STORE_CENT_HEAD) {
            memcpy(&rk, d.mv_data, 4);
            memcpy(&rd, (const uint8_t *)d.mv_data + 4, 4);
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
        if (!nbits || !rd || !rk || rd > 65536 || (rd * nbits) % 8)
            return store_fail(m, TARTAN_ECORRUPT,
                              "the header is damaged (%s) and cannot be rebuilt from the model "
                              "records",
                              hm.text);
        say(s, "rebuilt", "the header (dim %u, nbits %u, %u centroids from the model records; "
            "seed, k-means iterations and sample size unknown: 42, 4, default)", rd, nbits, rk);
    }
    if (h->n_centroids == 0) {
        if (r == 0 || crc == 0)
            say(s, "dropped", "a model record of an index never trained");
        return 0;
    }
    if (crc == TARTAN_ENOTFOUND || r == MDB_NOTFOUND)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the index has %u centroids but its %s record is missing; rebuild the "
                          "index from its embeddings",
                          h->n_centroids, r == MDB_NOTFOUND ? "centroid" : "codec");
    int dtype;
    const void *data;
    if (store_centroids_check(d.mv_data, d.mv_size, h->n_centroids, h->dim, 1, &dtype, &data, &pm))
        return store_fail(m, TARTAN_ECORRUPT,
                          "%s: the documents cannot be decoded without the centroids; rebuild "
                          "the index from its embeddings",
                          pm.text);
    size_t nb = (size_t)1 << h->nbits;
    if (clen != (2 * nb - 1) * 4)
        return store_fail(m, TARTAN_ECORRUPT, "the codec tables have %zu bytes, not %zu", clen,
                          (2 * nb - 1) * 4);
    int rc;
    if ((r = mdb_put(dst->st_txn, dst->st_gen->g_centroids, &k, &d, 0)))
        return store_map_lmdb(m, r, "writing the centroids");
    float t[511];
    memcpy(t, cd, clen);
    if ((rc = store_codec_put(dst, h->nbits, t, t + nb - 1, m)))
        return rc;
    return 0;
}

/* Meta records of other layers: copied when sound, dropped (and said) when not. */
static int salvage_meta(store_txn *src, store_txn *dst, sctx *s, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(src->st_txn, src->st_gen->g_meta, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening meta");
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while ((rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        static const char *const own[] = {STORE_KEY_FORMAT, STORE_KEY_HEADER, STORE_KEY_CODEC};
        int skip = 0;
        for (size_t i = 0; i < 3; i++)
            skip |= k.mv_size == strlen(own[i]) && !memcmp(k.mv_data, own[i], k.mv_size);
        if (skip)
            continue;
        uint32_t want = 0;
        if (d.mv_size >= 4)
            memcpy(&want, d.mv_data, 4);
        int kl = (int)(k.mv_size > 64 ? 64 : k.mv_size);
        if (d.mv_size < 4 || store_meta_crc(k.mv_data, k.mv_size, (const uint8_t *)d.mv_data + 4,
                                            d.mv_size - 4) != want) {
            say(s, "dropped", "meta record '%.*s': its checksum fails", kl,
                (const char *)k.mv_data);
            continue;
        }
        if ((rc = mdb_put(dst->st_txn, dst->st_gen->g_meta, &k, &d, 0))) {
            mdb_cursor_close(cur);
            return store_map_lmdb(m, rc, "writing meta");
        }
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) {
        if (rc != MDB_CORRUPTED && rc != MDB_PAGE_NOTFOUND)
            return store_map_lmdb(m, rc, "reading meta");
        say(s, "lmdb", "database 'meta': LMDB reports damaged pages (%s)", mdb_strerror(rc));
    }
    return 0;
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
    if (src->st_gen->g_version != STORE_FORMAT_VERSION)
        return store_fail(m, TARTAN_EVERSION, "salvage reads only format version %u",
                          STORE_FORMAT_VERSION);
    store_header h;
    int h_ok, rc;
    if ((rc = salvage_model(src, dst, s, &h, &h_ok, m)) || (rc = salvage_meta(src, dst, s, m)) ||
        (rc = read_ids(src, s, m)))
        return rc;
    if (h_ok && h.next_docno)
        see(s, h.next_docno - 1);
    /* Every number the segments' keys and directories can name is at most the largest key's
     * segment's end; bound the bitmaps by what the documents walk sees. */
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(src->st_txn, src->st_gen->g_docs, &cur)))
        return store_map_lmdb(m, rc, "opening the documents");
    MDB_val k, d;
    if (mdb_cursor_get(cur, &k, &d, MDB_LAST) == 0 && k.mv_size == 4) {
        uint32_t key;
        memcpy(&key, k.mv_data, 4);
        see(s, key);
        store_seg sg;
        if (store_seg_parse(key, d.mv_data, d.mv_size, 0, 0, 0, &sg, NULL) == 0) {
            uint32_t last;
            const uint8_t *r;
            size_t sz;
            store_seg_entry(&sg, sg.n - 1, &last, &r, &sz);
            see(s, last);
        }
    }
    mdb_cursor_close(cur);
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
    int rc = store_rewrite(env, salvage_fn, &s, m);
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
