/*
 * verify.c: the whole-index check behind `tartan check` (verify.h). Problem kinds:
 *   header       meta "header" missing, of the wrong size, its checksum failing, or
 *                contradicting itself
 *   meta         a malformed or damaged format record, a meta record whose checksum fails
 *   codec        meta "codec" missing, of the wrong size, or not ascending / finite; it or its
 *                copy "codec.copy" damaged (naming which), or the two differing
 *   centroids    the centroid table missing, of the wrong size, its checksum failing, not
 *                finite or not unit length; it (key 0) or its copy (key 1) damaged (naming
 *                which), or the two differing
 *   doc-key      a "docs" key that is not 4 bytes
 *   segment      a segment whose directory is malformed or whose directory checksum fails
 *   doc-number   a document number at or above the header's next_docno
 *   doc-size     a record whose size does not match its token count, that holds another
 *                number, or misaligned
 *   checksum     a record whose CRC-32C does not match
 *   code-range   a token code at or above K
 *   norm         an inverse norm that is not finite and positive
 *   count        the header's n_docs / n_tokens / n_postings differ from the index
 *   ivf-block    an inverted-list block that is malformed, has a key that is not 8 bytes, or
 *                whose checksum fails
 *   ivf-missing  a document's code whose inverted list does not list it
 *   ivf-stale    an inverted-list entry for a document that does not exist, a centroid at or
 *                above K, or a document without that code
 *   id-bad       an external id that breaks FORMAT.md's rules (length, control bytes)
 *   id-checksum  an "ids" or "names" value whose size is wrong or whose checksum fails
 *   id-missing   a document without an external id
 *   id-map       ids and names disagree, or name a document that does not exist
 *   lmdb         LMDB's two meta pages disagree (FORMAT.md "LMDB's meta pages": LMDB may read
 *                an older snapshot; nothing else is checked then), or LMDB's own structure:
 *                a page that breaks LMDB's layout (pages.c reads every
 *                tree of the snapshot first, without LMDB; when one is damaged, nothing else
 *                is walked), damaged pages LMDB reports, keys out of order, or a key that
 *                iteration finds and a lookup does not
 *
 * Cost: one pass over each database and one lookup of each key. The inverted lists are
 * compared with the documents' codes by a count and an order-free hash of every (centroid,
 * document) pair on each side; only when those differ does a second pass look each pair up
 * to name the missing and stale ones. Memory: two bits per document number, plus one
 * document's codes.
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

typedef struct vstate {
    store_env *env;
    store_txn *t;
    MDB_txn *txn;
    store_gen *g;
    store_verify_fn report;
    void *ctx;
    size_t n; /* problems so far */
    int stop; /* the callback asked to stop */
    store_header h;
    int h_ok;
    uint8_t *live;    /* bit per document number: a record exists */
    uint8_t *damaged; /* bit per document number: its record is unusable */
    uint64_t nbits_map;
    uint32_t *codes; /* one document's codes, sorted */
    size_t codes_cap;
    uint64_t doc_pairs, doc_hash; /* (code, document) pairs of sound documents */
    uint64_t ivf_pairs, ivf_hash; /* list entries naming sound documents */
    uint64_t ivf_entries;
    int ivf_damaged; /* some block could not be read */
    store_verify_stats st;
} vstate;

static int problem(vstate *v, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int problem(vstate *v, const char *kind, const char *fmt, ...)
{
    char buf[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    v->n++;
    if (v->report && v->report(v->ctx, kind, buf))
        v->stop = 1;
    return v->stop;
}

/* LMDB errors while walking database what: damage becomes a problem and ends that walk (0,
 * *ended set); others fail the check. */
static int lmdb_err(vstate *v, int rc, const char *what, store_msg *m)
{
    if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND) {
        problem(v, "lmdb", "%s: LMDB reports damaged pages (%s)", what, mdb_strerror(rc));
        return 0;
    }
    return store_map_lmdb(m, rc, what);
}

/* Does a lookup of the key the cursor is on find the same value? A damaged branch page can
 * route lookups away from keys that iteration (which follows the leaves) still finds. */
static int lookup_agrees(vstate *v, MDB_dbi dbi, const MDB_val *k, const MDB_val *d,
                         const char *db)
{
    MDB_val kk = *k, dd;
    int rc = store_get(v->t, dbi, &kk, &dd);
    if (rc == 0 && dd.mv_data == d->mv_data && dd.mv_size == d->mv_size)
        return 1;
    problem(v, "lmdb", "database '%s': a key iteration finds is %s by lookup (damaged pages)",
            db, rc ? "not found" : "found elsewhere");
    return 0;
}

static int bit_get(const uint8_t *map, uint64_t nbits, uint64_t i)
{
    return i < nbits && (map[i >> 3] >> (i & 7) & 1);
}

static void bit_set(uint8_t *map, uint64_t nbits, uint64_t i)
{
    if (i < nbits)
        map[i >> 3] |= (uint8_t)(1u << (i & 7));
}

/* An order-free hash of a (centroid, document) pair: summed over a set, equal sums and counts
 * mean equal sets but for a 2^-64 chance. */
static uint64_t pair_hash(uint32_t c, uint32_t d)
{
    uint64_t z = ((uint64_t)c << 32 | d) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* "document 17 (id 'abc')", or without the id when it has none (or a damaged one). */
static void doc_label(vstate *v, uint32_t docno, char *buf, size_t len)
{
    const char *id;
    size_t idl;
    if (store_name_get(v->t, docno, &id, &idl, NULL) == 0)
        snprintf(buf, len, "document %u (id '%.*s')", docno, (int)(idl > 64 ? 64 : idl), id);
    else
        snprintf(buf, len, "document %u", docno);
}

/* A reader's message without its own "document N: " prefix (the label says it better). */
static const char *detail(const store_msg *pm)
{
    const char *p = pm->text;
    if (!strncmp(p, "document ", 9) && strstr(p, ": "))
        return strstr(p, ": ") + 2;
    return p;
}

/* A problem store_pages_check found, counted as this walk's. */
static int page_problem(void *ctx, const char *kind, const char *message)
{
    vstate *v = ctx;
    return problem(v, kind, "%s", message);
}

/* ---- meta ------------------------------------------------------------------------------ */

static int check_meta(vstate *v, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(v->txn, v->g->g_meta, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening meta");
    MDB_val k, d;
    int seen_format = 0;
    unsigned format_ver = 0, need_ver = STORE_FORMAT_VERSION;
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = store_cget(v->t, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        int kl = (int)(k.mv_size > 64 ? 64 : k.mv_size);
        lookup_agrees(v, v->g->g_meta, &k, &d, "meta");
        if (k.mv_size == strlen(STORE_KEY_FORMAT) && !memcmp(k.mv_data, STORE_KEY_FORMAT, 6)) {
            seen_format = 1;
            unsigned ver;
            int dmg;
            if (store_format_parse(d.mv_data, d.mv_size, &ver, &dmg) || dmg ||
                ver < STORE_FORMAT_VERSION || ver > STORE_FORMAT_MAX ||
                d.mv_size != STORE_FORMAT_SIZE)
                problem(v, "meta", "the format record is damaged");
            else
                format_ver = ver;
            continue;
        }
        if (store_format_needs(k.mv_data, k.mv_size) > need_ver)
            need_ver = store_format_needs(k.mv_data, k.mv_size);
        uint32_t want = 0;
        if (d.mv_size >= 4)
            memcpy(&want, d.mv_data, 4);
        if (d.mv_size < 4 || store_meta_crc(k.mv_data, k.mv_size, (const uint8_t *)d.mv_data + 4,
                                            d.mv_size - 4) != want)
            problem(v, "meta", "meta record '%.*s' (%zu bytes): checksum mismatch", kl,
                    (const char *)k.mv_data, d.mv_size);
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "walking meta", m);
    if (!seen_format)
        problem(v, "meta", "the format record is missing");
    else if (format_ver && format_ver < need_ver)
        problem(v, "meta",
                "the index holds a codec extension record (FORMAT.md \"meta/codec.axes\") but its "
                "format record says version %u, not %u",
                format_ver, need_ver);
    return 0;
}

/* The codec tables and centroids of a trained index, and their second copies (FORMAT.md); their
 * absence in an untrained one. A missing copy is no problem (indexes written before the copies
 * have none; a compaction or a repair adds them). */
static int check_model(vstate *v, store_msg *m)
{
    const store_header *h = &v->h;
    const void *cd, *cc;
    size_t clen, cclen;
    store_msg pm, pcm;
    int rc = store_meta_get(v->t, STORE_KEY_CODEC, &cd, &clen, &pm);
    if (rc && rc != TARTAN_ENOTFOUND && rc != TARTAN_ECORRUPT) {
        *m = pm;
        return rc;
    }
    int rcc = store_meta_get(v->t, STORE_KEY_CODEC_COPY, &cc, &cclen, &pcm);
    if (rcc && rcc != TARTAN_ENOTFOUND && rcc != TARTAN_ECORRUPT) {
        *m = pcm;
        return rcc;
    }
    size_t nb = (size_t)1 << h->nbits;
    const char *restores =
        rcc == 0 ? "; its copy ('" STORE_KEY_CODEC_COPY "') is sound: a repair restores it" : "";
    if (h->n_centroids == 0) {
        if (rc != TARTAN_ENOTFOUND || rcc != TARTAN_ENOTFOUND)
            problem(v, "codec", "the index is untrained (0 centroids) but has codec tables");
    } else if (rc == TARTAN_ENOTFOUND && rcc == TARTAN_ENOTFOUND) {
        problem(v, "codec", "the index has %u centroids but no codec tables", h->n_centroids);
    } else {
        if (rc == TARTAN_ENOTFOUND)
            problem(v, "codec", "the codec tables ('codec') are missing%s", restores);
        else if (rc == TARTAN_ECORRUPT)
            problem(v, "codec", "the codec tables ('codec'): %s%s", pm.text, restores);
        if (rcc == TARTAN_ECORRUPT)
            problem(v, "codec", "the codec tables' copy ('%s'): %s%s", STORE_KEY_CODEC_COPY,
                    pcm.text, rc == 0 ? "; the primary is sound: a repair restores the copy" : "");
        else if (rc == 0 && rcc == 0 && (clen != cclen || memcmp(cd, cc, clen)))
            problem(v, "codec", "the codec tables and their copy ('%s') differ",
                    STORE_KEY_CODEC_COPY);
        if (rc && rcc == 0) {
            cd = cc;
            clen = cclen;
            rc = 0;
        }
    }
    if (h->n_centroids && rc == 0 && clen != (2 * nb - 1) * sizeof(float)) {
        problem(v, "codec", "the codec tables have %zu bytes, not %zu", clen,
                (2 * nb - 1) * sizeof(float));
    } else if (h->n_centroids && rc == 0) {
        float t[511];
        memcpy(t, cd, clen);
        for (size_t i = 0; i < 2 * nb - 1; i++) {
            int bad = !isfinite(t[i]);
            /* cutoffs [0, nb-1) ascending; weights [nb-1, 2nb-1) ascending */
            if (!bad && i > 0 && i != nb - 1 && t[i] < t[i - 1])
                bad = 1;
            if (bad) {
                problem(v, "codec", "codec %s %zu (%g) is %s", i < nb - 1 ? "cutoff" : "weight",
                        i < nb - 1 ? i : i - (nb - 1), (double)t[i],
                        isfinite(t[i]) ? "out of ascending order" : "not finite");
                break;
            }
        }
    }

    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(v->txn, v->g->g_centroids, &cur)))
        return store_map_lmdb(m, rc, "opening the centroids");
    MDB_val k, d, rec[2] = {{0, NULL}, {0, NULL}};
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = store_cget(v->t, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        unsigned key = 0;
        if (k.mv_size == sizeof key)
            memcpy(&key, k.mv_data, sizeof key);
        if (k.mv_size != sizeof key || (key != 0 && key != STORE_CENT_COPY_KEY)) {
            problem(v, "centroids", "unexpected key in the centroids database (%zu bytes)",
                    k.mv_size);
            continue;
        }
        lookup_agrees(v, v->g->g_centroids, &k, &d, "centroids");
        rec[key != 0] = d;
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "walking the centroids", m);
    if (v->stop)
        return 0;
    if (h->n_centroids == 0) {
        if (rec[0].mv_data || rec[1].mv_data)
            problem(v, "centroids", "the index is untrained but has a centroid table");
        return 0;
    }
    if (!rec[0].mv_data && !rec[1].mv_data) {
        problem(v, "centroids", "the index has %u centroids but no centroid table", h->n_centroids);
        return 0;
    }
    int dtype, ok[2] = {0, 0};
    const void *data, *tables[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        if (!rec[i].mv_data)
            continue;
        ok[i] = store_centroids_check(rec[i].mv_data, rec[i].mv_size, h->n_centroids, h->dim, 1,
                                      &dtype, &data, &pm) == 0;
        tables[i] = data;
        if (!ok[i])
            problem(v, "centroids", "%s%s", i ? "the centroid table's copy (key 1): " : "",
                    pm.text);
    }
    if (!rec[0].mv_data)
        problem(v, "centroids", "the centroid table (key 0) is missing%s",
                ok[1] ? "; its copy is sound: a repair restores it" : "");
    else if (!ok[0] && ok[1])
        problem(v, "centroids",
                "the centroid table (key 0) is damaged; its copy is sound: a "
                "repair restores it");
    if (ok[0] && ok[1] &&
        (rec[0].mv_size != rec[1].mv_size ||
         memcmp(rec[0].mv_data, rec[1].mv_data, rec[0].mv_size)))
        problem(v, "centroids", "the centroid table and its copy differ");
    /* The unit-length rule on the table readers use: the primary, else the copy. */
    int use = ok[0] ? 0 : ok[1] ? 1 : -1;
    if (use < 0)
        return 0;
    store_centroids_check(rec[use].mv_data, rec[use].mv_size, h->n_centroids, h->dim, 0, &dtype,
                          &data, NULL);
    const uint8_t *p = tables[use];
    /* Stored L2-normalised (FORMAT.md): 1e-3 leaves room for fp32 rounding, 3e-3 for
     * fp16's (2^-11 relative a value). */
    double tol = dtype == STORE_CENT_F16 ? 3e-3 : 1e-3;
    for (uint32_t c = 0; c < h->n_centroids && !v->stop; c++) {
        double ss = 0;
        int fin = 1;
        for (uint32_t j = 0; j < h->dim; j++) {
            size_t at = (size_t)c * h->dim + j;
            float x;
            if (dtype == STORE_CENT_F16) {
                uint16_t hv;
                memcpy(&hv, p + 2 * at, 2);
                x = store_f16_to_f32(hv);
            } else {
                memcpy(&x, p + 4 * at, 4);
            }
            fin &= isfinite(x) != 0;
            ss += (double)x * x;
        }
        if (!fin || fabs(sqrt(ss) - 1.0) > tol)
            problem(v, "centroids", "centroid %u is %s", c,
                    fin ? "not of unit length" : "not finite");
    }
    return 0;
}

/* ---- documents ------------------------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t code_at(const store_doc *d, unsigned code_bytes, uint32_t t)
{
    if (code_bytes == 2) {
        uint16_t c;
        memcpy(&c, (const uint8_t *)d->codes + 2 * (size_t)t, 2);
        return c;
    }
    uint32_t c;
    memcpy(&c, (const uint8_t *)d->codes + 4 * (size_t)t, 4);
    return c;
}

/* A document's distinct codes into v->codes, sorted; *n: their count. 0 or ENOMEM. */
static int distinct_codes(vstate *v, const store_doc *d, size_t *n, store_msg *m)
{
    if (d->ntok > v->codes_cap) {
        uint32_t *p = realloc(v->codes, d->ntok * sizeof *p);
        if (!p)
            return store_fail(m, ENOMEM, "out of memory");
        v->codes = p;
        v->codes_cap = d->ntok;
    }
    for (uint32_t t = 0; t < d->ntok; t++)
        v->codes[t] = code_at(d, v->h.code_bytes, t);
    qsort(v->codes, d->ntok, sizeof *v->codes, cmp_u32);
    size_t k = 0;
    for (uint32_t t = 0; t < d->ntok; t++)
        if (k == 0 || v->codes[t] != v->codes[k - 1])
            v->codes[k++] = v->codes[t];
    *n = k;
    return 0;
}

/* One sound record: codes, norms; its pairs go into the documents' side of the comparison.
 * *usable: 0 when a code or norm is bad (the document is then treated as damaged). */
static int check_doc_body(vstate *v, uint32_t docno, const store_doc *d, int *usable,
                          store_msg *m)
{
    const store_header *h = &v->h;
    char label[128];
    *usable = 1;
    for (uint32_t t = 0; t < d->ntok; t++) {
        uint32_t c = code_at(d, h->code_bytes, t);
        if (c >= h->n_centroids) {
            doc_label(v, docno, label, sizeof label);
            problem(v, "code-range", "%s: token %u has code %u, K is %u", label, t, c,
                    h->n_centroids);
            *usable = 0;
            return 0;
        }
    }
    for (uint32_t t = 0; t < d->ntok; t++) {
        float x;
        memcpy(&x, &d->inv_norms[t], sizeof x);
        if (!isfinite(x) || x <= 0) {
            doc_label(v, docno, label, sizeof label);
            problem(v, "norm", "%s: token %u has inverse norm %g", label, t, (double)x);
            *usable = 0;
            return 0;
        }
    }
    size_t nd;
    int rc = distinct_codes(v, d, &nd, m);
    if (rc)
        return rc;
    for (size_t i = 0; i < nd; i++)
        v->doc_hash += pair_hash(v->codes[i], docno);
    v->doc_pairs += nd;
    return 0;
}

static int check_docs(vstate *v, store_msg *m)
{
    const store_header *h = &v->h;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(v->txn, v->g->g_docs, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the documents");
    /* The bitmaps cover every number in use: the header's next_docno, or beyond it when a
     * directory says otherwise (reported below). */
    uint64_t top = h->next_docno;
    MDB_val k, d;
    rc = store_cget(v->t, cur, &k, &d, MDB_LAST);
    if (rc == 0 && k.mv_size == 4) {
        store_seg s;
        if (store_seg_parse(*(const uint32_t *)k.mv_data, d.mv_data, d.mv_size, 0, 0, 0, &s,
                            NULL) == 0) {
            uint32_t last;
            const uint8_t *r;
            size_t sz;
            store_seg_entry(&s, s.n - 1, &last, &r, &sz);
            if ((uint64_t)last + 1 > top)
                top = (uint64_t)last + 1;
        }
    } else if (rc && rc != MDB_NOTFOUND) {
        rc = lmdb_err(v, rc, "reading the documents", m);
        goto out;
    }
    v->nbits_map = top;
    v->live = calloc(top / 8 + 1, 1);
    v->damaged = calloc(top / 8 + 1, 1);
    if (!v->live || !v->damaged) {
        rc = store_fail(m, ENOMEM, "out of memory for %llu document bits", (unsigned long long)top);
        goto out;
    }
    int tokens_known = 1;
    uint64_t ndocs = 0, ntok = 0;
    uint32_t prev_key = 0;
    int any_key = 0;
    char label[128];
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = store_cget(v->t, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 4) {
            problem(v, "doc-key", "a document segment key has %zu bytes, not 4", k.mv_size);
            continue;
        }
        uint32_t key;
        memcpy(&key, k.mv_data, 4);
        if (any_key && key <= prev_key)
            problem(v, "lmdb", "document segments out of order (%u after %u)", key, prev_key);
        any_key = 1;
        prev_key = key;
        lookup_agrees(v, v->g->g_docs, &k, &d, "docs");
        store_seg s;
        store_msg pm;
        if (store_seg_parse(key, d.mv_data, d.mv_size, 0, 0, 1, &s, &pm)) {
            tokens_known = 0;
            problem(v, "segment", "%s", pm.text);
            continue;
        }
        for (uint32_t i = 0; i < s.n && !v->stop; i++) {
            uint32_t docno;
            const uint8_t *rec;
            size_t size;
            store_seg_entry(&s, i, &docno, &rec, &size);
            ndocs++;
            bit_set(v->live, v->nbits_map, docno);
            if (docno >= h->next_docno &&
                problem(v, "doc-number", "document %u is at or above next_docno %u", docno,
                        h->next_docno))
                break;
            if (h->n_centroids == 0) {
                tokens_known = 0;
                bit_set(v->damaged, v->nbits_map, docno);
                problem(v, "doc-size", "document %u exists in an untrained index", docno);
                continue;
            }
            store_doc doc;
            if (store_doc_parse(docno, rec, size, h->code_bytes, h->token_bytes, 0, &doc, &pm)) {
                tokens_known = 0;
                bit_set(v->damaged, v->nbits_map, docno);
                doc_label(v, docno, label, sizeof label);
                problem(v, "doc-size", "%s: %s", label, detail(&pm));
                continue;
            }
            ntok += doc.ntok;
            if (store_doc_parse(docno, rec, size, h->code_bytes, h->token_bytes, 1, &doc, &pm)) {
                bit_set(v->damaged, v->nbits_map, docno);
                doc_label(v, docno, label, sizeof label);
                problem(v, "checksum", "%s: %s", label, detail(&pm));
                continue;
            }
            int usable;
            if ((rc = check_doc_body(v, docno, &doc, &usable, m)))
                goto out;
            if (!usable)
                bit_set(v->damaged, v->nbits_map, docno);
            const char *id;
            size_t idl;
            int r2 = store_name_get(v->t, docno, &id, &idl, &pm);
            if (r2 == TARTAN_ENOTFOUND)
                problem(v, "id-missing", "document %u has no external id in 'names'", docno);
        }
    }
    if (rc == MDB_NOTFOUND)
        rc = 0;
    if (rc) {
        rc = lmdb_err(v, rc, "walking the documents", m);
        goto out;
    }
    v->st.docs = ndocs;
    v->st.tokens = ntok;
    if (!v->stop && ndocs != h->n_docs)
        problem(v, "count", "the header counts %llu documents, the index holds %llu",
                (unsigned long long)h->n_docs, (unsigned long long)ndocs);
    if (!v->stop && tokens_known && ntok != h->n_tokens)
        problem(v, "count", "the header counts %llu tokens, the documents hold %llu",
                (unsigned long long)h->n_tokens, (unsigned long long)ntok);
out:
    mdb_cursor_close(cur);
    return rc;
}

/* ---- inverted lists -------------------------------------------------------------------- */

/* Sound document docno's distinct codes into v->codes (*n of them); *n 0 when it cannot be
 * read (damaged: reported already). */
static int doc_codes(vstate *v, uint32_t docno, size_t *n, store_msg *m)
{
    *n = 0;
    store_doc d;
    store_msg pm;
    int rc = store_doc_get(v->t, docno, v->h.code_bytes, v->h.token_bytes, 0, &d, &pm);
    if (rc == TARTAN_ENOTFOUND || rc == TARTAN_ECORRUPT)
        return 0;
    if (rc) {
        *m = pm;
        return rc;
    }
    return distinct_codes(v, &d, n, m);
}

/* Is doc in centroid c's list? (*listed stays 1 when a damaged block leaves it unknown.) */
static int list_has(vstate *v, MDB_cursor *cur, uint32_t c, uint32_t doc, int *listed,
                    store_msg *m)
{
    uint64_t want = store_ivf_key(c, doc);
    MDB_val k = {8, &want}, d;
    int rc = store_cget(v->t, cur, &k, &d, MDB_SET_RANGE);
    uint64_t key = 0;
    if (rc == 0 && k.mv_size == 8)
        memcpy(&key, k.mv_data, 8);
    if (rc == MDB_NOTFOUND)
        rc = store_cget(v->t, cur, &k, &d, MDB_LAST);
    else if (rc == 0 && key != want)
        rc = store_cget(v->t, cur, &k, &d, MDB_PREV);
    *listed = 0;
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc)
        return lmdb_err(v, rc, "looking up an inverted list", m);
    if (k.mv_size != 8)
        return 0;
    memcpy(&key, k.mv_data, 8);
    if ((uint32_t)(key >> 32) != c)
        return 0;
    uint32_t buf[STORE_IVF_BLOCK];
    size_t n;
    if (store_ivf_decode(key, d.mv_data, d.mv_size, 1, buf, &n, NULL)) {
        *listed = 1; /* unknown: the damaged block is reported itself */
        return 0;
    }
    for (size_t i = 0; i < n && !*listed; i++)
        *listed = buf[i] == doc;
    return 0;
}

/* pass 0: every block's key, checksum, shape, and every entry's centroid and document; the
 * pairs on sound documents go into the lists' side of the comparison. pass 1 (only when the
 * two sides differ): names the entries whose document lacks the code. */
static int walk_ivf(vstate *v, int pass, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(v->txn, v->g->g_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    MDB_val k, d;
    char label[128];
    uint32_t buf[STORE_IVF_BLOCK];
    uint64_t prev_key = 0;
    int any = 0;
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = store_cget(v->t, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 8) {
            if (pass == 0)
                problem(v, "ivf-block", "an inverted-list key has %zu bytes, not 8", k.mv_size);
            v->ivf_damaged = 1;
            continue;
        }
        uint64_t key;
        memcpy(&key, k.mv_data, 8);
        if (pass == 0) {
            if (any && key <= prev_key)
                problem(v, "lmdb", "inverted-list blocks out of order");
            lookup_agrees(v, v->g->g_ivf, &k, &d, "ivf");
        }
        any = 1;
        prev_key = key;
        size_t n;
        store_msg pm;
        if (store_ivf_decode(key, d.mv_data, d.mv_size, 1, buf, &n, &pm)) {
            if (pass == 0)
                problem(v, "ivf-block", "%s", pm.text);
            v->ivf_damaged = 1;
            continue;
        }
        uint32_t c = (uint32_t)(key >> 32);
        for (size_t i = 0; i < n && !v->stop; i++) {
            uint32_t doc = buf[i];
            int live = bit_get(v->live, v->nbits_map, doc);
            int sound = live && !bit_get(v->damaged, v->nbits_map, doc);
            if (pass == 0) {
                v->ivf_entries++;
                if (c >= v->h.n_centroids)
                    problem(v, "ivf-stale",
                            "the inverted list of centroid %u (K is %u) lists document %u", c,
                            v->h.n_centroids, doc);
                else if (!live)
                    problem(v, "ivf-stale",
                            "the inverted list of centroid %u lists document %u, which does not "
                            "exist",
                            c, doc);
                else if (sound) {
                    v->ivf_pairs++;
                    v->ivf_hash += pair_hash(c, doc);
                }
                continue;
            }
            if (c >= v->h.n_centroids || !sound)
                continue;
            size_t nc;
            if ((rc = doc_codes(v, doc, &nc, m)))
                goto out;
            if (nc && !bsearch(&c, v->codes, nc, sizeof *v->codes, cmp_u32)) {
                doc_label(v, doc, label, sizeof label);
                problem(v, "ivf-stale",
                        "the inverted list of centroid %u lists %s, which has no token with that "
                        "code",
                        c, label);
            }
        }
    }
out:
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "walking the inverted lists", m);
    return 0;
}

/* The second pass's other half: every sound document's codes looked up in their lists. */
static int find_missing(vstate *v, store_msg *m)
{
    MDB_cursor *ivf;
    int rc = mdb_cursor_open(v->txn, v->g->g_ivf, &ivf);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    char label[128];
    for (uint64_t docno = 0; docno < v->nbits_map && !v->stop && !rc; docno++) {
        if (!bit_get(v->live, v->nbits_map, docno) || bit_get(v->damaged, v->nbits_map, docno))
            continue;
        size_t nc;
        if ((rc = doc_codes(v, (uint32_t)docno, &nc, m)))
            break;
        for (size_t i = 0; i < nc && !v->stop; i++) {
            int listed;
            if ((rc = list_has(v, ivf, v->codes[i], (uint32_t)docno, &listed, m)))
                break;
            if (!listed) {
                doc_label(v, (uint32_t)docno, label, sizeof label);
                problem(v, "ivf-missing",
                        "%s has code %u but the inverted list of centroid %u does not list it",
                        label, v->codes[i], v->codes[i]);
            }
        }
    }
    mdb_cursor_close(ivf);
    return rc;
}

static int check_ivf(vstate *v, store_msg *m)
{
    int rc = walk_ivf(v, 0, m);
    if (rc || v->stop)
        return rc;
    if (!v->ivf_damaged && v->ivf_entries != v->h.n_postings)
        problem(v, "count", "the header counts %llu inverted-list entries, the lists hold %llu",
                (unsigned long long)v->h.n_postings, (unsigned long long)v->ivf_entries);
    if (v->ivf_pairs == v->doc_pairs && v->ivf_hash == v->doc_hash)
        return 0;
    if ((rc = find_missing(v, m)) || v->stop)
        return rc;
    return walk_ivf(v, 1, m);
}

/* ---- ids ------------------------------------------------------------------------------- */

static int check_ids(vstate *v, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(v->txn, v->g->g_ids, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the ids");
    MDB_val k, d;
    store_msg pm;
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = store_cget(v->t, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        v->st.ids++;
        int kl = (int)(k.mv_size > 64 ? 64 : k.mv_size);
        const char *ks = k.mv_data;
        lookup_agrees(v, v->g->g_ids, &k, &d, "ids");
        if (!store_id_valid(k.mv_data, k.mv_size))
            problem(v, "id-bad", "external id '%.*s' (%zu bytes) breaks the id rules", kl, ks,
                    k.mv_size);
        uint32_t docno;
        if (store_ids_decode(k.mv_data, k.mv_size, d.mv_data, d.mv_size, &docno, &pm)) {
            problem(v, "id-checksum", "%s", pm.text);
            continue;
        }
        if (!bit_get(v->live, v->nbits_map, docno)) {
            problem(v, "id-map", "id '%.*s' names document %u, which does not exist", kl, ks,
                    docno);
            continue;
        }
        const char *nm;
        size_t nl;
        int r2 = store_name_get(v->t, docno, &nm, &nl, &pm);
        if (r2 == TARTAN_ECORRUPT)
            continue; /* reported by the walk of 'names' */
        if (r2 && r2 != TARTAN_ENOTFOUND) {
            rc = r2;
            *m = pm;
            break;
        }
        if (r2 == TARTAN_ENOTFOUND || nl != k.mv_size || memcmp(nm, k.mv_data, k.mv_size))
            problem(v, "id-map", "id '%.*s' names document %u, whose name is %s%.*s%s", kl, ks,
                    docno, r2 ? "missing" : "'", r2 ? 0 : (int)(nl > 64 ? 64 : nl), r2 ? "" : nm,
                    r2 ? "" : "'");
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return store_lmdb_code(rc) ? lmdb_err(v, rc, "walking the ids", m) : rc;

    if ((rc = mdb_cursor_open(v->txn, v->g->g_names, &cur)))
        return store_map_lmdb(m, rc, "opening the names");
    uint32_t prev = 0;
    int any = 0;
    op = MDB_FIRST;
    while (!v->stop && (rc = store_cget(v->t, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 4) {
            problem(v, "id-checksum", "a 'names' key has %zu bytes, not 4", k.mv_size);
            continue;
        }
        uint32_t docno;
        memcpy(&docno, k.mv_data, 4);
        if (any && docno <= prev)
            problem(v, "lmdb", "'names' keys out of order (%u after %u)", docno, prev);
        any = 1;
        prev = docno;
        lookup_agrees(v, v->g->g_names, &k, &d, "names");
        const char *ds;
        size_t dl;
        if (store_names_decode(docno, d.mv_data, d.mv_size, &ds, &dl, &pm)) {
            problem(v, "id-checksum", "%s", pm.text);
            continue;
        }
        int dli = (int)(dl > 64 ? 64 : dl);
        if (!bit_get(v->live, v->nbits_map, docno)) {
            problem(v, "id-map", "document %u, which does not exist, is named '%.*s'", docno, dli,
                    ds);
            continue;
        }
        uint32_t back;
        int r2 = store_id_get(v->t, ds, dl, &back, &pm);
        if (r2 == TARTAN_ECORRUPT)
            continue; /* reported by the walk of 'ids' */
        if (r2 && r2 != TARTAN_ENOTFOUND) {
            rc = r2;
            *m = pm;
            break;
        }
        if (r2 == TARTAN_ENOTFOUND)
            problem(v, "id-map", "document %u is named '%.*s', an id 'ids' does not have", docno,
                    dli, ds);
        else if (back != docno)
            problem(v, "id-map", "document %u is named '%.*s', but that id names document %u",
                    docno, dli, ds, back);
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return store_lmdb_code(rc) ? lmdb_err(v, rc, "walking the names", m) : rc;
    return 0;
}

int store_verify(store_env *env, store_verify_fn report, void *ctx, size_t *n_problems,
                 store_verify_stats *stats, store_msg *m)
{
    vstate v;
    memset(&v, 0, sizeof v);
    v.env = env;
    v.report = report;
    v.ctx = ctx;
    if (n_problems)
        *n_problems = 0;
    int rc = store_read_begin(env, &v.t, m);
    if (rc == TARTAN_ECORRUPT) {
        /* Refused: LMDB's meta pages disagree (seen at open), or LMDB's structure is damaged
         * where the index's databases are named. */
        problem(&v, "lmdb", "%s", m->text);
        if (n_problems)
            *n_problems = v.n;
        return 0;
    }
    if (rc)
        return rc;
    v.txn = v.t->st_txn;
    v.g = v.t->st_gen;
    /* LMDB's two meta pages: does the snapshot LMDB reads hold the newest state? (A damaged
     * transaction id can make it take the older one, which no check inside it can tell.) */
    {
        store_meta_pages mp;
        int fd;
        if (mdb_env_get_fd(v.g->g_env, &fd) == 0 && store_pages_meta(fd, v.g->g_psize, &mp) == 0 &&
            mp.bad) {
            problem(&v, "lmdb",
                    "%s; nothing else is checked, since LMDB may read an older state: "
                    "'tartan check --repair' rewrites the index from its newest snapshot",
                    mp.why);
            goto out;
        }
    }
    /* LMDB's own pages first, read without LMDB: its cursors must never walk a damaged tree
     * (they would read outside the page and stop the process). */
    unsigned unsound;
    if ((rc = store_pages_check(v.t, page_problem, &v, &unsound, m)) || v.stop || unsound)
        goto out;
    if ((rc = check_meta(&v, m)) || v.stop)
        goto out;
    store_msg hm = {{0}};
    rc = store_header_get(v.t, &v.h, &hm);
    if (rc == TARTAN_ECORRUPT) {
        /* Nothing else can be sized without a sound header. */
        problem(&v, "header", "%s", hm.text);
        rc = 0;
        goto out;
    }
    if (rc) {
        *m = hm;
        goto out;
    }
    if ((rc = check_model(&v, m)) || v.stop)
        goto out;
    if ((rc = check_docs(&v, m)) || v.stop)
        goto out;
    if ((rc = check_ivf(&v, m)) || v.stop)
        goto out;
    rc = check_ids(&v, m);
out:
    store_read_end(env, v.t);
    free(v.live);
    free(v.damaged);
    free(v.codes);
    v.st.ivf_entries = v.ivf_entries;
    if (n_problems)
        *n_problems = v.n;
    if (stats)
        *stats = v.st;
    return rc;
}
