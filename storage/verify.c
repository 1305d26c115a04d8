/*
 * verify.c: the whole-index check behind `tartan check` (verify.h). Problem kinds:
 *   header       meta "header" missing, of the wrong size or contradicting itself
 *   meta         an unknown meta key or a malformed format record
 *   codec        meta "codec" missing, of the wrong size, or not ascending / finite
 *   centroids    the centroid table missing, of the wrong size, not finite or not unit length
 *   doc-key      a "docs" key that is not 4 bytes
 *   doc-number   a document number at or above the header's next_docno
 *   doc-size     a blob whose size does not match its token count, or misaligned
 *   checksum     a blob whose CRC-32C does not match
 *   code-range   a token code at or above K
 *   norm         an inverse norm that is not finite and positive
 *   count        the header's n_docs / n_tokens differ from the documents
 *   ivf-missing  a document's code whose inverted list does not list it
 *   ivf-stale    an inverted-list entry for a document that does not exist, a centroid at or
 *                above K, or a document without that code
 *   ivf-size     an inverted-list key or entry that is not 4 bytes
 *   id-bad       an external id that breaks FORMAT.md's rules (length, control bytes)
 *   id-size      an "ids" value or "names" key that is not 4 bytes
 *   id-missing   a document without an external id
 *   id-map       ids and names disagree, or name a document that does not exist
 *   lmdb         LMDB itself reported damaged pages; the walk stops there
 *
 * Cost: one pass over each database, plus one inverted-list lookup per (document, distinct
 * code) pair. Memory: a bit per document number, plus one document's codes. Stale entries
 * on live documents are found by counting (every expected pair found, and the lists holding
 * exactly that many entries on live documents, leaves no room for one); only when the counts
 * differ does a second pass look each entry up in its document.
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
    MDB_txn *txn;
    store_verify_fn report;
    void *ctx;
    size_t n; /* problems so far */
    int stop; /* the callback asked to stop, or LMDB reported damage */
    store_header h;
    uint8_t *live;    /* bit per document number: a blob exists */
    uint8_t *damaged; /* bit per document number: its blob failed its size or checksum */
    uint64_t nbits_map;
    uint32_t *codes; /* one document's codes, sorted */
    size_t codes_cap;
    uint64_t pairs_found; /* (document, distinct code) pairs found in the lists */
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

/* LMDB errors while walking: damage becomes a problem (and ends the walk); others fail. */
static int lmdb_err(vstate *v, int rc, const char *what, store_msg *m)
{
    if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND) {
        problem(v, "lmdb", "%s: LMDB reports damaged pages (%s)", what, mdb_strerror(rc));
        v->stop = 1;
        return 0;
    }
    return store_map_lmdb(m, rc, what);
}

static int bit_get(const uint8_t *map, uint64_t nbits, uint64_t i)
{
    return i < nbits && (map[i >> 3] >> (i & 7) & 1);
}

static void bit_set(uint8_t *map, uint64_t i)
{
    map[i >> 3] |= (uint8_t)(1u << (i & 7));
}

/* "document 17 (id 'abc')", or without the id when it has none. */
static void doc_label(vstate *v, uint32_t docno, char *buf, size_t len)
{
    unsigned key = docno;
    MDB_val k = {sizeof key, &key}, d;
    if (mdb_get(v->txn, v->env->se_names, &k, &d) == 0)
        snprintf(buf, len, "document %u (id '%.*s')", docno, (int)(d.mv_size > 64 ? 64 : d.mv_size),
                 (const char *)d.mv_data);
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

static int id_valid(const uint8_t *id, size_t len)
{
    if (len == 0 || len > STORE_MAX_ID)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (id[i] < 0x20 || id[i] == 0x7f)
            return 0;
    return 1;
}

/* ---- meta ------------------------------------------------------------------------------ */

static int check_meta(vstate *v, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(v->txn, v->env->se_meta, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening meta");
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        int known = 0;
        /* The calibration's layout is the engine's (engine/calibrate.c checks it). */
        static const char *const keys[] = {STORE_KEY_FORMAT, STORE_KEY_HEADER, STORE_KEY_CODEC,
                                           STORE_META_CALIBRATION};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (k.mv_size == strlen(keys[i]) && !memcmp(k.mv_data, keys[i], k.mv_size))
                known = 1;
        if (!known)
            problem(v, "meta", "unknown meta key '%.*s' (%zu bytes of value)",
                    (int)(k.mv_size > 64 ? 64 : k.mv_size), (const char *)k.mv_data, d.mv_size);
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "walking meta", m);
    MDB_val fk = {strlen(STORE_KEY_FORMAT), STORE_KEY_FORMAT};
    rc = mdb_get(v->txn, v->env->se_meta, &fk, &d);
    if (rc == MDB_NOTFOUND || (rc == 0 && d.mv_size != 12))
        problem(v, "meta", "the format record is %s", rc ? "missing" : "not 12 bytes");
    else if (rc)
        return lmdb_err(v, rc, "reading the format record", m);
    return 0;
}

/* The codec tables and centroids of a trained index; their absence in an untrained one. */
static int check_model(vstate *v, store_msg *m)
{
    const store_header *h = &v->h;
    MDB_val ck = {strlen(STORE_KEY_CODEC), STORE_KEY_CODEC}, d;
    int rc = mdb_get(v->txn, v->env->se_meta, &ck, &d);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "reading the codec", m);
    size_t nb = (size_t)1 << h->nbits;
    if (h->n_centroids == 0) {
        if (rc == 0)
            problem(v, "codec", "the index is untrained (0 centroids) but has codec tables");
    } else if (rc == MDB_NOTFOUND) {
        problem(v, "codec", "the index has %u centroids but no codec tables", h->n_centroids);
    } else if (d.mv_size != (2 * nb - 1) * sizeof(float)) {
        problem(v, "codec", "the codec tables have %zu bytes, not %zu", d.mv_size,
                (2 * nb - 1) * sizeof(float));
    } else {
        float t[511];
        memcpy(t, d.mv_data, d.mv_size);
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
    if ((rc = mdb_cursor_open(v->txn, v->env->se_centroids, &cur)))
        return store_map_lmdb(m, rc, "opening the centroids");
    MDB_val k;
    int seen = 0;
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        unsigned key = 0;
        if (k.mv_size == sizeof key)
            memcpy(&key, k.mv_data, sizeof key);
        if (k.mv_size != sizeof key || key != 0) {
            problem(v, "centroids", "unexpected key in the centroids database (%zu bytes)",
                    k.mv_size);
            continue;
        }
        seen = 1;
        size_t want = (size_t)h->n_centroids * h->dim * sizeof(float);
        if (h->n_centroids == 0) {
            problem(v, "centroids", "the index is untrained but has a centroid table");
        } else if (d.mv_size != want) {
            problem(v, "centroids", "the centroid table has %zu bytes, not %zu (%u x %u)",
                    d.mv_size, want, h->n_centroids, h->dim);
        } else {
            const uint8_t *p = d.mv_data;
            for (uint32_t c = 0; c < h->n_centroids && !v->stop; c++) {
                double ss = 0;
                int fin = 1;
                for (uint32_t j = 0; j < h->dim; j++) {
                    float x;
                    memcpy(&x, p + ((size_t)c * h->dim + j) * sizeof x, sizeof x);
                    fin &= isfinite(x) != 0;
                    ss += (double)x * x;
                }
                /* Stored L2-normalised (FORMAT.md); 1e-3 leaves room for fp32 rounding. */
                if (!fin || fabs(sqrt(ss) - 1.0) > 1e-3)
                    problem(v, "centroids", "centroid %u is %s", c,
                            fin ? "not of unit length" : "not finite");
            }
        }
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "walking the centroids", m);
    if (!seen && h->n_centroids)
        problem(v, "centroids", "the index has %u centroids but no centroid table", h->n_centroids);
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

/* One sound blob: codes, norms, and the inverted lists that must list it. */
static int check_doc_body(vstate *v, MDB_cursor *ivf, uint32_t docno, const store_doc *d,
                          store_msg *m)
{
    const store_header *h = &v->h;
    char label[128];
    for (uint32_t t = 0; t < d->ntok; t++) {
        uint32_t c = code_at(d, h->code_bytes, t);
        if (c >= h->n_centroids) {
            doc_label(v, docno, label, sizeof label);
            if (problem(v, "code-range", "%s: token %u has code %u, K is %u", label, t, c,
                        h->n_centroids))
                return 0;
            break;
        }
    }
    for (uint32_t t = 0; t < d->ntok; t++) {
        float x;
        memcpy(&x, &d->inv_norms[t], sizeof x);
        if (!isfinite(x) || x <= 0) {
            doc_label(v, docno, label, sizeof label);
            if (problem(v, "norm", "%s: token %u has inverse norm %g", label, t, (double)x))
                return 0;
            break;
        }
    }
    if (d->ntok > v->codes_cap) {
        uint32_t *p = realloc(v->codes, d->ntok * sizeof *p);
        if (!p)
            return store_fail(m, ENOMEM, "out of memory");
        v->codes = p;
        v->codes_cap = d->ntok;
    }
    for (uint32_t t = 0; t < d->ntok; t++)
        v->codes[t] = code_at(d, h->code_bytes, t);
    qsort(v->codes, d->ntok, sizeof *v->codes, cmp_u32);
    for (uint32_t t = 0; t < d->ntok && !v->stop; t++) {
        if (t > 0 && v->codes[t] == v->codes[t - 1])
            continue;
        unsigned key = v->codes[t], doc = docno;
        MDB_val k = {sizeof key, &key}, dv = {sizeof doc, &doc};
        int rc = mdb_cursor_get(ivf, &k, &dv, MDB_GET_BOTH);
        if (rc == 0) {
            v->pairs_found++;
        } else if (rc == MDB_NOTFOUND) {
            doc_label(v, docno, label, sizeof label);
            problem(v, "ivf-missing",
                    "%s has code %u but the inverted list of centroid %u "
                    "does not list it",
                    label, key, key);
        } else {
            return lmdb_err(v, rc, "looking up an inverted list", m);
        }
    }
    return 0;
}

static int check_docs(vstate *v, store_msg *m)
{
    const store_header *h = &v->h;
    MDB_cursor *cur, *ivf;
    int rc = mdb_cursor_open(v->txn, v->env->se_docs, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the documents");
    if ((rc = mdb_cursor_open(v->txn, v->env->se_ivf, &ivf))) {
        mdb_cursor_close(cur);
        return store_map_lmdb(m, rc, "opening the inverted lists");
    }
    /* The bitmaps cover every number in use: the header's next_docno, or beyond it when a
     * key says otherwise (reported below). */
    uint64_t top = h->next_docno;
    MDB_val k, d;
    rc = mdb_cursor_get(cur, &k, &d, MDB_LAST);
    if (rc == 0 && k.mv_size == 4) {
        unsigned last;
        memcpy(&last, k.mv_data, 4);
        if ((uint64_t)last + 1 > top)
            top = (uint64_t)last + 1;
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
    char label[128];
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 4) {
            problem(v, "doc-key", "a document key has %zu bytes, not 4", k.mv_size);
            continue;
        }
        unsigned docno;
        memcpy(&docno, k.mv_data, 4);
        ndocs++;
        bit_set(v->live, docno);
        if (docno >= h->next_docno &&
            problem(v, "doc-number", "document %u is at or above next_docno %u", docno,
                    h->next_docno))
            break;
        if (h->n_centroids == 0) {
            tokens_known = 0;
            bit_set(v->damaged, docno);
            if (problem(v, "doc-size", "document %u exists in an untrained index", docno))
                break;
            continue;
        }
        store_doc doc;
        store_msg pm;
        if (store_doc_parse(docno, d.mv_data, d.mv_size, h->code_bytes, h->token_bytes, 0, &doc,
                            &pm)) {
            tokens_known = 0;
            bit_set(v->damaged, docno);
            doc_label(v, docno, label, sizeof label);
            if (problem(v, "doc-size", "%s: %s", label, detail(&pm)))
                break;
            continue;
        }
        ntok += doc.ntok;
        if (store_doc_parse(docno, d.mv_data, d.mv_size, h->code_bytes, h->token_bytes, 1, &doc,
                            &pm)) {
            bit_set(v->damaged, docno);
            doc_label(v, docno, label, sizeof label);
            if (problem(v, "checksum", "%s: %s", label, detail(&pm)))
                break;
            continue;
        }
        if ((rc = check_doc_body(v, ivf, docno, &doc, m)))
            goto out;
        MDB_val nk = {sizeof docno, &docno}, nd;
        int r2 = mdb_get(v->txn, v->env->se_names, &nk, &nd);
        if (r2 == MDB_NOTFOUND) {
            problem(v, "id-missing", "document %u has no external id in 'names'", docno);
        } else if (r2) {
            rc = lmdb_err(v, r2, "looking up a document's id", m);
            goto out;
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
    mdb_cursor_close(ivf);
    mdb_cursor_close(cur);
    return rc;
}

/* ---- inverted lists -------------------------------------------------------------------- */

/* Does sound document docno have a token with code c? */
static int doc_has_code(vstate *v, uint32_t docno, uint32_t c, int *has, store_msg *m)
{
    unsigned key = docno;
    MDB_val k = {sizeof key, &key}, d;
    *has = 1; /* unless shown otherwise: report nothing on a failed read */
    int rc = mdb_get(v->txn, v->env->se_docs, &k, &d);
    if (rc)
        return lmdb_err(v, rc, "reading a document", m);
    store_doc doc;
    *has = 0;
    if (store_doc_parse(docno, d.mv_data, d.mv_size, v->h.code_bytes, v->h.token_bytes, 0, &doc,
                        NULL)) {
        *has = 1; /* damaged: reported already */
        return 0;
    }
    for (uint32_t t = 0; t < doc.ntok && !*has; t++)
        *has = code_at(&doc, v->h.code_bytes, t) == c;
    return 0;
}

/* pass 0: every entry's key, size, centroid range and document; counts the entries on sound
 * live documents. pass 1 (only when that count exceeds the pairs found): names the entries
 * whose document lacks the code. */
static int walk_ivf(vstate *v, int pass, uint64_t *on_live, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(v->txn, v->env->se_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    MDB_val k, d;
    char label[128];
    uint64_t entries = 0;
    *on_live = 0;
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        entries++;
        if (k.mv_size != 4 || d.mv_size != 4) {
            if (pass == 0)
                problem(v, "ivf-size",
                        "an inverted-list entry has a %zu-byte key and a %zu-byte "
                        "value, not 4 and 4",
                        k.mv_size, d.mv_size);
            continue;
        }
        unsigned c, doc;
        memcpy(&c, k.mv_data, 4);
        memcpy(&doc, d.mv_data, 4);
        int live = bit_get(v->live, v->nbits_map, doc);
        if (pass == 0) {
            if (c >= v->h.n_centroids)
                problem(v, "ivf-stale",
                        "the inverted list of centroid %u (K is %u) lists "
                        "document %u",
                        c, v->h.n_centroids, doc);
            else if (!live)
                problem(v, "ivf-stale",
                        "the inverted list of centroid %u lists document %u, "
                        "which does not exist",
                        c, doc);
            else if (!bit_get(v->damaged, v->nbits_map, doc))
                (*on_live)++;
            continue;
        }
        if (c >= v->h.n_centroids || !live || bit_get(v->damaged, v->nbits_map, doc))
            continue;
        int has;
        if ((rc = doc_has_code(v, doc, c, &has, m)))
            break;
        if (!has) {
            doc_label(v, doc, label, sizeof label);
            problem(v, "ivf-stale",
                    "the inverted list of centroid %u lists %s, which has no "
                    "token with that code",
                    c, label);
        }
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "walking the inverted lists", m);
    if (pass == 0)
        v->st.ivf_entries = entries;
    return 0;
}

static int check_ivf(vstate *v, store_msg *m)
{
    uint64_t on_live;
    int rc = walk_ivf(v, 0, &on_live, m);
    if (rc || v->stop)
        return rc;
    /* Each expected pair was looked up once and lists hold no repeats, so more entries on
     * sound documents than pairs found means some entry names a code its document lacks. */
    if (on_live > v->pairs_found)
        rc = walk_ivf(v, 1, &on_live, m);
    return rc;
}

/* ---- ids ------------------------------------------------------------------------------- */

static int check_ids(vstate *v, store_msg *m)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(v->txn, v->env->se_ids, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the ids");
    MDB_val k, d;
    MDB_cursor_op op = MDB_FIRST;
    while (!v->stop && (rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        v->st.ids++;
        int kl = (int)(k.mv_size > 64 ? 64 : k.mv_size);
        const char *ks = k.mv_data;
        if (!id_valid(k.mv_data, k.mv_size))
            problem(v, "id-bad", "external id '%.*s' (%zu bytes) breaks the id rules", kl, ks,
                    k.mv_size);
        if (d.mv_size != 4) {
            problem(v, "id-size", "id '%.*s' maps to a value of %zu bytes, not 4", kl, ks,
                    d.mv_size);
            continue;
        }
        unsigned docno;
        memcpy(&docno, d.mv_data, 4);
        if (!bit_get(v->live, v->nbits_map, docno)) {
            problem(v, "id-map", "id '%.*s' names document %u, which does not exist", kl, ks,
                    docno);
            continue;
        }
        MDB_val nk = {sizeof docno, &docno}, nd;
        int r2 = mdb_get(v->txn, v->env->se_names, &nk, &nd);
        if (r2 && r2 != MDB_NOTFOUND) {
            rc = r2;
            break;
        }
        if (r2 == MDB_NOTFOUND || nd.mv_size != k.mv_size ||
            memcmp(nd.mv_data, k.mv_data, k.mv_size))
            problem(v, "id-map", "id '%.*s' names document %u, whose name is %s%.*s%s", kl, ks,
                    docno, r2 ? "missing" : "'", r2 ? 0 : (int)(nd.mv_size > 64 ? 64 : nd.mv_size),
                    r2 ? "" : (const char *)nd.mv_data, r2 ? "" : "'");
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "walking the ids", m);

    if ((rc = mdb_cursor_open(v->txn, v->env->se_names, &cur)))
        return store_map_lmdb(m, rc, "opening the names");
    op = MDB_FIRST;
    while (!v->stop && (rc = mdb_cursor_get(cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        if (k.mv_size != 4) {
            problem(v, "id-size", "a 'names' key has %zu bytes, not 4", k.mv_size);
            continue;
        }
        unsigned docno;
        memcpy(&docno, k.mv_data, 4);
        int dl = (int)(d.mv_size > 64 ? 64 : d.mv_size);
        const char *ds = d.mv_data;
        if (!bit_get(v->live, v->nbits_map, docno)) {
            problem(v, "id-map", "document %u, which does not exist, is named '%.*s'", docno, dl,
                    ds);
            continue;
        }
        MDB_val ik = {d.mv_size, d.mv_data}, id;
        int r2 = d.mv_size ? mdb_get(v->txn, v->env->se_ids, &ik, &id) : MDB_NOTFOUND;
        if (r2 && r2 != MDB_NOTFOUND) {
            rc = r2;
            break;
        }
        unsigned back = 0;
        if (r2 == 0 && id.mv_size == 4)
            memcpy(&back, id.mv_data, 4);
        if (r2 == MDB_NOTFOUND)
            problem(v, "id-map", "document %u is named '%.*s', an id 'ids' does not have", docno,
                    dl, ds);
        else if (id.mv_size == 4 && back != docno)
            problem(v, "id-map", "document %u is named '%.*s', but that id names document %u",
                    docno, dl, ds, back);
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return lmdb_err(v, rc, "walking the names", m);
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
    store_txn *t;
    int rc = store_read_begin(env, &t, m);
    if (rc)
        return rc;
    v.txn = t->st_txn;
    if ((rc = check_meta(&v, m)) || v.stop)
        goto out;
    store_msg hm = {{0}};
    rc = store_header_get(t, &v.h, &hm);
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
    store_read_end(env, t);
    free(v.live);
    free(v.damaged);
    free(v.codes);
    if (n_problems)
        *n_problems = v.n;
    if (stats)
        *stats = v.st;
    return rc;
}
