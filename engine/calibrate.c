/*
 * calibrate.c: measuring how wide the adaptive search must probe on this index
 * (tartan_calibrate), storing it (meta "calibration", storage/FORMAT.md), and turning it into
 * a search's margin, probe cap and stopping rule (engine/SEARCH.md has the design and the
 * measurements behind the constants).
 *
 * A calibration:
 *   1. queries: the caller's, or pseudo-queries drawn from the index's own documents (below);
 *   2. the reference: their exhaustive top 100 over the live documents, or over a fixed
 *      sample of max_reference_docs of them (by a hash of the document number and the seed);
 *   3. for every document of each reference top 10 and top 100, the smallest probe margin
 *      that makes it a candidate: the least, over the query's tokens i and the document's
 *      codes c among token i's best probe-cap centroids, of best_i - S[i, c] (a document
 *      none of whose codes is among them needs more than any margin: infinite);
 *   4. the quantiles of those margins at the coverage levels, the table a search reads;
 *   5. the default search's recall@10 and @100 with the new table, on the same queries,
 *      against the reference documents that stand for the index's top 10 and top 100 (all
 *      of the reference's top k when it ranked every document; recall_of) (for tartan info);
 *   6. one write transaction stores the record.
 *
 * Pseudo-queries stand in for real queries when the caller has none. Real queries relate to
 * their relevant documents in many ways (paraphrase, other contexts, [MASK]-like expansion
 * tokens, words of other documents), so each pseudo-query mixes them: 32 tokens, of which
 * some are noisy copies of a random document's tokens (as the index decompresses them) or of
 * their centroids (a token near the "word" rather than its occurrence), a quarter of them
 * taken from a second random document instead, and the rest (a quarter, a half or two thirds,
 * by query in turn) noisy copies of the query's own mean direction (expansion tokens, like
 * ColBERT's [MASK] padding); the noise leaves a cosine of 0.95, 0.85, 0.75 or 0.65 with the
 * original, by query in turn.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "calibrate.h"
#include "db.h"
#include "device.h"
#include "gpu.h"
#include "kernels.h"
#include "search.h"

/* FORMAT.md "meta/calibration". */
#define CALIB_KEY STORE_META_CALIBRATION
#define CALIB_VERSION 2u
#define CALIB_SIZE_V1 (32 + 12 * ENG_CALIB_LEVELS + 8 + 24)
#define CALIB_SIZE (CALIB_SIZE_V1 + 4 + 8 * ENG_CALIB_LEVELS)

/* Coverage levels measured (shares of the reference top k made candidates). */
static const float levels[ENG_CALIB_LEVELS] = {0.9f, 0.95f, 0.975f, 0.99f, 0.995f};

/*
 * The built-in table, for indexes never calibrated: margins that covered each level on the
 * synthetic and SciFact corpora of engine/SEARCH.md's measurements, rounded up to the widest
 * of them, so that an uncalibrated index errs on the side of recall.
 */
static const float default_m10[ENG_CALIB_LEVELS] = {0.01f, 0.015f, 0.02f, 0.03f, 0.04f};
static const float default_m100[ENG_CALIB_LEVELS] = {0.03f, 0.04f, 0.05f, 0.07f, 0.09f};

/* A margin of this or more stands for "more than the probe cap reaches" (quantiles that are
 * infinite): the search then probes the whole cap. */
#define MARGIN_ALL 2.0f

/* A search at recall target t asks stage 1 to cover 1 - (1 - t) * COVER_SHARE of the top k:
 * half of the misses it may afford go to probing, half to the stopping rule. */
#define COVER_SHARE 0.5

/*
 * The calibrated margin is multiplied by SAFETY: pseudo-queries are not the user's queries,
 * and on the corpora measured (engine/SEARCH.md) real queries' margins at a level reached up
 * to about 1.5 times the pseudo-queries' at the same level.
 */
#define SAFETY 1.5f

/* Probe caps: probes per query token at most, for k 10 (and below) and k 100 (and above). */
#define PROBE_CAP_10 16
#define PROBE_CAP_100 32

/* Pseudo-queries. */
#define PSEUDO_LEN 32
/* Short pseudo-queries: the first SHORT_LEN tokens of each (content tokens: the expansion
 * tokens come last). Why: a query of 8 tokens reaches a document through 8 chances, not 32;
 * margins measured on 32-token pseudo-queries kept 0.933 of the exhaustive top 10 for 8-token
 * queries (8,000 documents of model 2), where the same queries' own calibration needed a
 * margin 7x wider. */
#define SHORT_LEN 8
#define PSEUDO_OTHER_DOC 0.25
#define PSEUDO_CENTROID 0.4
#define DEFAULT_PSEUDO 128
#define DEFAULT_REFERENCE_DOCS 20000
#define DEFAULT_REFERENCE_DOCS_GPU 1000000

/* Live documents changed by more than this factor since calibration: stale. */
#define STALE_FACTOR 2.0

void eng_calib_default(eng_calib *c)
{
    memset(c, 0, sizeof *c);
    memcpy(c->levels, levels, sizeof levels);
    memcpy(c->margin10, default_m10, sizeof default_m10);
    memcpy(c->margin100, default_m100, sizeof default_m100);
}

int eng_calib_write(store_txn *txn, const eng_calib *c, store_msg *m)
{
    uint8_t b[CALIB_SIZE];
    const size_t L = ENG_CALIB_LEVELS;
    /* Version 1 when no short margins were measured (what older builds read). */
    const int v2 = c->short_len > 0;
    store_put32(b + 0, v2 ? CALIB_VERSION : 1u);
    store_put32(b + 4, c->flags);
    store_put32(b + 8, c->n_queries);
    store_put32(b + 12, (uint32_t)L);
    store_put64(b + 16, c->n_docs);
    store_put64(b + 24, c->n_reference_docs);
    for (size_t i = 0; i < L; i++) {
        store_putf(b + 32 + 4 * i, c->levels[i]);
        store_putf(b + 32 + 4 * (L + i), c->margin10[i]);
        store_putf(b + 32 + 4 * (2 * L + i), c->margin100[i]);
    }
    uint8_t *t = b + 32 + 12 * L;
    store_putf(t, c->recall10);
    store_putf(t + 4, c->recall100);
    store_putd(t + 8, c->candidates10);
    store_putd(t + 16, c->exact10);
    store_putd(t + 24, c->seconds);
    if (v2) {
        uint8_t *x = b + CALIB_SIZE_V1;
        store_put32(x, c->short_len);
        for (size_t i = 0; i < L; i++) {
            store_putf(x + 4 + 4 * i, c->margin10s[i]);
            store_putf(x + 4 + 4 * (L + i), c->margin100s[i]);
        }
    }
    return store_meta_put(txn, CALIB_KEY, b, v2 ? CALIB_SIZE : CALIB_SIZE_V1, m);
}

int eng_calib_read(store_txn *txn, eng_calib *c, store_msg *m)
{
    const void *data;
    size_t len;
    eng_calib_default(c);
    int rc = store_meta_get(txn, CALIB_KEY, &data, &len, m);
    if (rc == TARTAN_ENOTFOUND)
        return 0;
    if (rc)
        return rc;
    const uint8_t *b = data;
    const size_t L = ENG_CALIB_LEVELS;
    const uint32_t version = len >= 4 ? store_get32(b) : 0;
    if (!((version == 1 && len == CALIB_SIZE_V1) || (version == 2 && len == CALIB_SIZE)) ||
        store_get32(b + 12) != L)
        return store_fail(m, TARTAN_ECORRUPT,
                          "the calibration record has %zu bytes (version %u), not %d (version 1) "
                          "or %d (version 2)",
                          len, version, CALIB_SIZE_V1, CALIB_SIZE);
    eng_calib x = {.calibrated = 1};
    x.flags = store_get32(b + 4);
    x.n_queries = store_get32(b + 8);
    x.n_docs = store_get64(b + 16);
    x.n_reference_docs = store_get64(b + 24);
    int ok = x.n_queries > 0 && x.n_reference_docs > 0;
    for (size_t i = 0; i < L; i++) {
        x.levels[i] = store_getf(b + 32 + 4 * i);
        x.margin10[i] = store_getf(b + 32 + 4 * (L + i));
        x.margin100[i] = store_getf(b + 32 + 4 * (2 * L + i));
        /* Levels ascend inside (0, 1); margins are finite, in [0, MARGIN_ALL] and grow with
         * the level. */
        ok = ok && x.levels[i] > 0.f && x.levels[i] < 1.f &&
             (i == 0 || x.levels[i] > x.levels[i - 1]);
        for (int t = 0; t < 2; t++) {
            const float *mg = t ? x.margin100 : x.margin10;
            ok = ok && mg[i] >= 0.f && mg[i] <= MARGIN_ALL && (i == 0 || mg[i] >= mg[i - 1]);
        }
    }
    const uint8_t *t = b + 32 + 12 * L;
    x.recall10 = store_getf(t);
    x.recall100 = store_getf(t + 4);
    x.candidates10 = store_getd(t + 8);
    x.exact10 = store_getd(t + 16);
    x.seconds = store_getd(t + 24);
    ok = ok && x.recall10 >= 0.f && x.recall10 <= 1.f && x.recall100 >= 0.f && x.recall100 <= 1.f &&
         x.candidates10 >= 0 && x.exact10 >= 0 && x.seconds >= 0;
    if (version == 2) {
        /* Short margins: as the others, and no narrower than them. */
        const uint8_t *e = b + CALIB_SIZE_V1;
        x.short_len = store_get32(e);
        ok = ok && x.short_len >= 1 && x.short_len < PSEUDO_LEN;
        for (size_t i = 0; i < L; i++) {
            x.margin10s[i] = store_getf(e + 4 + 4 * i);
            x.margin100s[i] = store_getf(e + 4 + 4 * (L + i));
            for (int u = 0; u < 2; u++) {
                const float *mg = u ? x.margin100s : x.margin10s;
                const float *lo = u ? x.margin100 : x.margin10;
                ok = ok && mg[i] >= lo[i] && mg[i] <= MARGIN_ALL && (i == 0 || mg[i] >= mg[i - 1]);
            }
        }
    }
    if (!ok)
        return store_fail(m, TARTAN_ECORRUPT, "the calibration record holds values out of range");
    *c = x;
    return 0;
}

/* Linear interpolation of margins [L] over the levels, in log(1 - level). */
static float at_level(const float *lv, const float *mg, double level)
{
    const size_t L = ENG_CALIB_LEVELS;
    if (level <= lv[0])
        return mg[0];
    if (level >= lv[L - 1])
        return mg[L - 1];
    size_t i = 1;
    while (lv[i] < level)
        i++;
    double a = log(1.0 - lv[i - 1]), b = log(1.0 - lv[i]), x = log(1.0 - level);
    double w = (x - a) / (b - a);
    return (float)((1.0 - w) * mg[i - 1] + w * mg[i]);
}

/* Where k sits between 10 and 100, in log k: 0 at 10 and below, 1 at 100 and above. */
static double k_weight(size_t k)
{
    if (k <= 10)
        return 0.0;
    if (k >= 100)
        return 1.0;
    return log((double)k / 10.0) / log(10.0);
}

float eng_calib_margin(const eng_calib *c, size_t k, float target, size_t lq)
{
    double level = 1.0 - (1.0 - (double)target) * COVER_SHARE;
    double w = k_weight(k);
    float m10 = at_level(c->levels, c->margin10, level);
    float m100 = at_level(c->levels, c->margin100, level);
    if (c->short_len && lq < PSEUDO_LEN) {
        /* u: 0 at PSEUDO_LEN tokens, 1 at short_len and below, linear in log lq. */
        double u = lq <= c->short_len ? 1.0
                                      : log((double)PSEUDO_LEN / (double)lq) /
                                            log((double)PSEUDO_LEN / (double)c->short_len);
        float s10 = at_level(c->levels, c->margin10s, level);
        float s100 = at_level(c->levels, c->margin100s, level);
        if (u >= 1.0 && (s10 >= MARGIN_ALL || s100 >= MARGIN_ALL))
            return INFINITY;
        m10 = (float)((1.0 - u) * m10 + u * s10);
        m100 = (float)((1.0 - u) * m100 + u * s100);
    }
    if (m10 >= MARGIN_ALL || m100 >= MARGIN_ALL)
        return INFINITY;
    float mg = (float)((1.0 - w) * m10 + w * m100);
    if (k > 100 && m100 > m10) {
        /* Beyond k 100 (nothing measured there): the k 10 -> k 100 growth, continued in log k
         * (k 1,000: m100 + (m100 - m10)); the probe cap grows too (eng_probe_cap). Why: at k
         * 1,000 the k 100 margin and cap kept 0.64-0.76 of the exhaustive top 1,000 (5,000 and
         * 8,000 documents of models 1 and 2). */
        mg = (float)(m100 + log10((double)k / 100.0) * (m100 - m10));
        if (mg >= MARGIN_ALL)
            return INFINITY;
    }
    return c->calibrated ? mg * SAFETY : mg;
}

size_t eng_probe_cap(size_t k)
{
    double w = k_weight(k);
    if (k > 100) {
        /* PROBE_CAP_100 times sqrt(k / 100), at most the GPU's probe width. */
        double cap = PROBE_CAP_100 * sqrt((double)k / 100.0);
        return cap < KERN_CUDA_MAX_NCELLS ? (size_t)(cap + 0.5) : KERN_CUDA_MAX_NCELLS;
    }
    return (size_t)((1.0 - w) * PROBE_CAP_10 + w * PROBE_CAP_100 + 0.5);
}

float eng_rerank_z(float target)
{
    /* z = 1.5 + 1.15 log10(1 / (1 - target)): 2.65 at 0.9, 3.0 at 0.95, 3.8 at 0.99
     * (engine/SEARCH.md: the recall the rule kept against z). */
    double t = target < 0.5f ? 0.5 : (double)target;
    return (float)(1.5 + 1.15 * log10(1.0 / (1.0 - t)));
}

void eng_calib_public(const eng_calib *c, uint64_t n_docs_now, tartan_calibration *out)
{
    memset(out, 0, sizeof *out);
    if (!c->calibrated)
        return;
    out->calibrated = 1;
    out->from_queries = (c->flags & ENG_CALIB_FROM_QUERIES) != 0;
    out->n_queries = c->n_queries;
    out->n_docs = c->n_docs;
    out->n_reference_docs = c->n_reference_docs;
    double a = (double)(c->n_docs ? c->n_docs : 1), b = (double)(n_docs_now ? n_docs_now : 1);
    out->stale = a / b > STALE_FACTOR || b / a > STALE_FACTOR;
    out->margin_k10 = eng_calib_margin(c, 10, ENG_DEFAULT_TARGET, PSEUDO_LEN);
    out->margin_k100 = eng_calib_margin(c, 100, ENG_DEFAULT_TARGET, PSEUDO_LEN);
    out->recall_k10 = c->recall10;
    out->recall_k100 = c->recall100;
    out->candidates_k10 = c->candidates10;
    out->exact_k10 = c->exact10;
    out->seconds = c->seconds;
    out->short_len = c->short_len;
    if (c->short_len) {
        out->margin_k10_short = eng_calib_margin(c, 10, ENG_DEFAULT_TARGET, c->short_len);
        out->margin_k100_short = eng_calib_margin(c, 100, ENG_DEFAULT_TARGET, c->short_len);
    }
}

void tartan_calibrate_params_init(tartan_calibrate_params *p)
{
    memset(p, 0, sizeof *p);
    p->seed = 42;
}

int tartan_calibration_get(tartan_db *db, tartan_calibration *out)
{
    if (!db || !out)
        return eng_failf(db, TARTAN_EINVAL, "tartan_calibration_get: %s is NULL",
                         db ? "out" : "db");
    store_msg m = {{0}};
    store_txn *txn;
    int rc = store_read_begin(db->env, &txn, &m);
    if (rc)
        return eng_fail(db, rc, &m);
    eng_calib c;
    store_header h;
    if (!(rc = store_header_get(txn, &h, &m)))
        rc = eng_calib_read(txn, &c, &m);
    store_read_end(db->env, txn);
    if (rc)
        return eng_fail(db, rc, &m);
    eng_calib_public(&c, h.n_docs, out);
    return 0;
}

/* ---- the measurement ---------------------------------------------------------------------- */

/* splitmix64 streams: one per (seed, purpose, item), as reproducible as the index. */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unit(uint64_t *s)
{
    return (double)(mix(s) >> 11) * 0x1.0p-53;
}

static double gauss(uint64_t *s)
{
    double u = 1.0 - unit(s), v = unit(s);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* out = c x + sqrt(1 - c^2) g, g a random unit vector orthogonal to x (x unit): a vector at
 * cosine c from x. */
static void noisy(uint64_t *s, const float *x, size_t dim, double c, float *out)
{
    double dot = 0, n = 0;
    for (size_t j = 0; j < dim; j++) {
        out[j] = (float)gauss(s);
        dot += (double)out[j] * x[j];
    }
    for (size_t j = 0; j < dim; j++) {
        out[j] -= (float)(dot * x[j]);
        n += (double)out[j] * out[j];
    }
    double sc = n > 0 ? sqrt(1.0 - c * c) / sqrt(n) : 0.0;
    for (size_t j = 0; j < dim; j++)
        out[j] = (float)(c * x[j] + sc * out[j]);
}

static void normalise(float *x, size_t dim)
{
    double n = 0;
    for (size_t j = 0; j < dim; j++)
        n += (double)x[j] * x[j];
    float inv = n > 0 ? (float)(1.0 / sqrt(n)) : 0.f;
    for (size_t j = 0; j < dim; j++)
        x[j] *= inv;
}

/* What one calibration holds while it runs. */
typedef struct calib_run {
    tartan_db *db;
    idx_reader r;
    int r_open;
    size_t dim, K;
    uint32_t *ref; /* reference documents, ascending */
    size_t n_ref;
    eng_docset ref_set; /* the same, for the searches */
    float *qemb;    /* pseudo-queries [n_q * PSEUDO_LEN, dim] */
    size_t *qlens;
    uint32_t *src; /* each pseudo-query's source documents [n_q * 2] (UINT32_MAX: none) */
    tartan_queries q;
    float *semb;       /* short pseudo-queries: each one's first SHORT_LEN tokens (owned) */
    tartan_queries sq; /* over semb; n_queries 0 when none */
    float *tok;        /* a document's decompressed tokens */
    size_t tok_cap;
    uint8_t *stand; /* [n_q * 100]: which reference hits stand for the index's top 10 (bit 0)
                     * and top 100 (bit 1) (needed_margins), for step 5's recall */
    int whole;      /* the reference is every live document: the searches take no subset */
    float *gap10, *gap100; /* [K] each, INFINITY but while needed_margins fills them */
} calib_run;

/* The reference sample: live documents whose hashed number falls under the sampling rate,
 * max_ref over the corpus's documents (corpus_docs: tartan_calibrate_params). */
static int pick_reference(calib_run *c, size_t max_ref, uint64_t corpus_docs, uint64_t seed,
                          store_msg *m)
{
    uint64_t n_docs = c->r.h.n_docs > corpus_docs ? c->r.h.n_docs : corpus_docs;
    double rate = n_docs <= max_ref ? 1.0 : (double)max_ref / (double)n_docs;
    size_t cap = 0;
    store_cursor *cur = NULL;
    uint32_t d;
    kern_pdoc pd;
    int rc;
    c->r.verify = 0;
    while ((rc = idx_reader_next_doc(&c->r, &cur, &d, &pd, m)) == 1) {
        uint64_t h = seed ^ ((uint64_t)d * 0x9e3779b97f4a7c15ull);
        if (rate < 1.0 && unit(&h) >= rate)
            continue;
        if (eng_grow((void **)&c->ref, &cap, c->n_ref + 1, sizeof *c->ref)) {
            idx_reader_docs_end(cur);
            return store_fail(m, ENOMEM, "calibration: out of memory");
        }
        c->ref[c->n_ref++] = d;
    }
    c->r.verify = 1;
    if (rc < 0 || rc > 1)
        return rc;
    if (c->n_ref == 0)
        return store_fail(m, TARTAN_EEMPTY, "calibration: no live documents");
    /*
     * The searches take the sample as document numbers (eng_docset), not as external ids,
     * which each search would check and look up in LMDB one by one (4M look-ups in the four
     * searches of a 1M-document reference). A reference of every live document takes no
     * subset at all, except in a small index, where a subset is scored exactly, all of it
     * (ENG_SUBSET_EXACT_MAX, search.c), and a default search without one would not be.
     */
    c->whole = rate >= 1.0 && c->n_ref > ENG_SUBSET_EXACT_MAX;
    c->ref_set = (eng_docset){
        .docs = c->ref, .n = c->n_ref, .next_docno = c->r.h.next_docno, .n_docs = c->r.h.n_docs};
    return 0;
}

/* Document d's decompressed tokens into c->tok; *ntok set. */
static int doc_tokens(calib_run *c, uint32_t d, kern_pdoc *pd, store_msg *m)
{
    int rc = idx_reader_doc(&c->r, d, pd, m);
    if (rc)
        return rc == TARTAN_ENOTFOUND ? store_fail(m, TARTAN_ECORRUPT, "document %u vanished", d)
                                      : rc;
    if (eng_grow((void **)&c->tok, &c->tok_cap, (size_t)pd->ntok * c->dim, sizeof(float)))
        return store_fail(m, ENOMEM, "calibration: out of memory");
    idx_reader_decompress(&c->r, pd, c->tok);
    return 0;
}

/* The pseudo-queries (the comment at the top), into c->q. */
static int make_pseudo(calib_run *c, size_t n, uint64_t seed, store_msg *m)
{
    static const double cosines[4] = {0.95, 0.85, 0.75, 0.65};
    static const size_t expansion[3] = {PSEUDO_LEN / 4, PSEUDO_LEN / 2, 2 * PSEUDO_LEN / 3};
    const size_t dim = c->dim;
    c->qemb = malloc(n * PSEUDO_LEN * dim * sizeof *c->qemb);
    c->qlens = malloc(n * sizeof *c->qlens);
    c->src = malloc(2 * n * sizeof *c->src);
    float *base = malloc(2 * dim * sizeof *base);
    if (!c->qemb || !c->qlens || !c->src || !base) {
        free(base);
        return store_fail(m, ENOMEM, "calibration: out of memory");
    }
    float *mean = base + dim;
    int rc = 0;
    for (size_t p = 0; p < n && !rc; p++) {
        uint64_t s = seed ^ (0xc2b2ae3d27d4eb4full * (p + 1));
        double cs = cosines[p % 4];
        size_t content = PSEUDO_LEN - expansion[p % 3];
        uint32_t doc[2] = {c->ref[mix(&s) % c->n_ref], c->ref[mix(&s) % c->n_ref]};
        c->src[2 * p] = doc[0];
        c->src[2 * p + 1] = doc[1] != doc[0] ? doc[1] : UINT32_MAX;
        float *q = c->qemb + p * PSEUDO_LEN * dim;
        memset(mean, 0, dim * sizeof *mean);
        size_t t = 0;
        /* Tokens from each document in turn, so that a document is decompressed once. */
        for (int which = 0; which < 2 && !rc; which++) {
            kern_pdoc pd;
            if ((rc = doc_tokens(c, doc[which], &pd, m)))
                break;
            uint64_t s2 = s ^ (which ? 0x85ebca6bull : 0x27d4eb2full);
            for (size_t j = 0; j < content; j++) {
                uint64_t sj = s2 ^ (0x165667b19e3779f9ull * (j + 1));
                int other = unit(&sj) < PSEUDO_OTHER_DOC;
                if (other != which)
                    continue;
                uint32_t ti = (uint32_t)(mix(&sj) % pd.ntok);
                const float *src = c->tok + (size_t)ti * dim;
                if (unit(&sj) < PSEUDO_CENTROID) {
                    uint32_t code = c->r.h.code_bytes == 2 ? ((const uint16_t *)pd.codes)[ti]
                                                           : ((const uint32_t *)pd.codes)[ti];
                    src = c->r.centroids + (size_t)code * dim;
                }
                memcpy(base, src, dim * sizeof *base);
                noisy(&sj, base, dim, cs, q + t * dim);
                for (size_t k = 0; k < dim; k++)
                    mean[k] += q[t * dim + k];
                t++;
            }
        }
        if (rc)
            break;
        normalise(mean, dim);
        for (; t < PSEUDO_LEN; t++)
            noisy(&s, mean, dim, cs, q + t * dim);
        c->qlens[p] = PSEUDO_LEN;
    }
    free(base);
    if (rc)
        return rc;
    c->q = (tartan_queries){.n_queries = n,
                            .qlens = c->qlens,
                            .embeddings = c->qemb,
                            .n_rows = n * PSEUDO_LEN,
                            .dim = dim,
                            .dtype = TARTAN_FLOAT32};
    return 0;
}

/* Index of document d in the reference list (ascending), or -1. */
static long ref_index(const calib_run *c, uint32_t d)
{
    size_t lo = 0, hi = c->n_ref;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->ref[mid] < d)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->n_ref && c->ref[lo] == d ? (long)lo : -1;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Quantile at level of v [n] (sorted in place): the smallest value covering level of them. */
static float quantile(float *v, size_t n, double level)
{
    qsort(v, n, sizeof *v, cmp_float);
    size_t i = (size_t)ceil(level * (double)n);
    i = i == 0 ? 0 : i - 1;
    return v[i < n ? i : n - 1];
}

typedef struct margin_set {
    float *v;
    size_t n, cap;
} margin_set;

static int margin_push(margin_set *ms, float v)
{
    if (eng_grow((void **)&ms->v, &ms->cap, ms->n + 1, sizeof *ms->v))
        return ENOMEM;
    ms->v[ms->n++] = v;
    return 0;
}

/*
 * Step 3, first half: every query token's best probe-cap centroids (PROBE_CAP_100, at most K),
 * tix / tval [rows, cap] for the rows [n_rows, dim] of prepared queries, best first and ties to
 * the lower centroid (kern_topk_rows, as a search's probes), all queries' rows together in
 * chunks, on the calibration's device. On a GPU: the scores Q C^T of 128 pseudo-queries of 32
 * tokens and 128 of 8 against 65,536 centroids are 86 GFLOP, seconds on the cores of one rank
 * of a GPU host, milliseconds on its GPU, and only the top [rows, cap] come back. On the CPU,
 * chunks of 128 rows or more: one query at a time (8 rows for a short one) paid a parallel
 * region per few rows, ruinous on busy cores (scores of 8,192 rows against 16,384 centroids on
 * 2 threads of the loaded build host: 5.4 s in chunks of 8 rows, 2.1 s of 32, 0.78 s of 128,
 * 0.82 s of 1,024; 0.85, 0.33, 0.34 and 0.60 s on one thread), but a table within about 8 MB
 * stays in cache.
 */
static int probe_tops(calib_run *c, kern_dev dev, const float *rows_q, size_t n_rows, size_t cap,
                      int64_t *tix, float *tval, store_msg *m)
{
    const size_t K = c->K, dim = c->dim;
    /* Rows a chunk: its score table at most 256 MB on a GPU; on the CPU 8 MB, but at least
     * 64 rows (above); at most what one top-k launch takes. */
    size_t chunk = ((dev == KERN_DEV_CUDA ? (size_t)256 : 8) << 20) / (K * sizeof(float));
    if (dev == KERN_DEV_CPU && chunk < 64)
        chunk = 64;
    if (chunk < 1)
        chunk = 1;
    if (chunk > 65535)
        chunk = 65535;
    if (chunk > n_rows)
        chunk = n_rows ? n_rows : 1;
    int krc = 0;
    const char *what = "calibration: centroid scores";
    if (dev == KERN_DEV_CPU) {
        float *S = malloc(chunk * K * sizeof *S);
        if (!S)
            return store_fail(m, ENOMEM, "calibration: out of memory");
        for (size_t r0 = 0; r0 < n_rows && !krc; r0 += chunk) {
            size_t nr = n_rows - r0 < chunk ? n_rows - r0 : chunk;
            what = "calibration: centroid scores";
            krc = kern_centroid_scores(KERN_DEV_CPU, rows_q + r0 * dim, nr, c->r.centroids, K, dim,
                                       S);
            if (!krc) {
                what = "calibration: top-k";
                krc = kern_topk_rows(KERN_DEV_CPU, S, nr, K, cap, tix + r0 * cap, tval + r0 * cap);
            }
        }
        free(S);
        return krc ? eng_kern_fail(krc, m, what) : 0;
    }
    /* The GPU of this thread (a rank's own, or the first the handle's searches use), under the
     * GPU lock that every GPU search of the process takes (kernel scratch is shared). */
    void *dc = NULL, *dq = NULL, *dS = NULL, *dix = NULL, *dval = NULL;
    eng_gpu_lock();
    what = "calibration: GPU memory";
    if (!(krc = kern_cuda_malloc(&dc, K * dim * sizeof(float))) &&
        !(krc = kern_cuda_malloc(&dq, chunk * dim * sizeof(float))) &&
        !(krc = kern_cuda_malloc(&dS, chunk * K * sizeof(float))) &&
        !(krc = kern_cuda_malloc(&dix, chunk * cap * sizeof(int64_t))) &&
        !(krc = kern_cuda_malloc(&dval, chunk * cap * sizeof(float)))) {
        what = "calibration: copying to the GPU";
        krc = kern_cuda_upload(dc, c->r.centroids, K * dim * sizeof(float));
    }
    for (size_t r0 = 0; r0 < n_rows && !krc; r0 += chunk) {
        size_t nr = n_rows - r0 < chunk ? n_rows - r0 : chunk;
        what = "calibration: copying to the GPU";
        if ((krc = kern_cuda_upload(dq, rows_q + r0 * dim, nr * dim * sizeof(float))))
            break;
        what = "calibration: centroid scores";
        if ((krc = kern_centroid_scores(KERN_DEV_CUDA, dq, nr, dc, K, dim, dS)))
            break;
        what = "calibration: top-k";
        if ((krc = kern_topk_rows(KERN_DEV_CUDA, dS, nr, K, cap, dix, dval)))
            break;
        what = "calibration: copying from the GPU";
        if ((krc = kern_cuda_download(tix + r0 * cap, dix, nr * cap * sizeof(int64_t))) ||
            (krc = kern_cuda_download(tval + r0 * cap, dval, nr * cap * sizeof(float))))
            break;
    }
    kern_cuda_free(dc);
    kern_cuda_free(dq);
    kern_cuda_free(dS);
    kern_cuda_free(dix);
    kern_cuda_free(dval);
    eng_gpu_unlock();
    return krc ? eng_kern_fail(krc, m, what) : 0;
}

/*
 * Step 3: the needed margin of every document of query qi's reference top k lists (ids of
 * tartan_search's results over the reference subset) into ms10 / ms100. tix / tval: the
 * query's tokens' best probe-cap centroids (probe_tops) [lq, cap100].
 *
 * A document needs, for the k 10 cap, the least best_i - S[i, c] over the tokens i and the
 * document's codes c among token i's best cap10 centroids (and likewise for cap100): gap10[c]
 * and gap100[c] hold that least over i for every centroid that some token probes, so that a
 * document costs one look-up a token.
 *
 * Over a sample at rate < 1, the sample's top j documents stand for the index's top j / rate:
 * its rank-1 document is the best of rate * n_docs random ones, ranked about 1 / rate in the
 * whole index. So the index's top k is the sample's top ceil(k * rate), except for a
 * pseudo-query's source documents (src, up to 2), which are always in the sample and rank
 * at the top of both: they count as themselves, and the others as ceil((k - sources) *
 * rate). Taking the sample's whole top k asked for documents that the index's top k does not
 * hold (measured: margins 23x too wide at a 10% sample); taking ceil(k * rate) with the
 * sources among them left only the sources (margins 0, recall 0.92 at 200k documents).
 */
static int needed_margins(calib_run *c, const int64_t *tix, const float *tval, size_t lq,
                          const tartan_results *ref, size_t qi, double rate, const uint32_t *src,
                          margin_set *ms10, margin_set *ms100, uint8_t *stand, store_msg *m)
{
    const size_t K = c->K;
    size_t cap10 = eng_probe_cap(10), cap100 = eng_probe_cap(100);
    if (cap10 > K)
        cap10 = K;
    if (cap100 > K)
        cap100 = K;
    float *g10 = c->gap10, *g100 = c->gap100;
    for (size_t i = 0; i < lq; i++) {
        const int64_t *ti = tix + i * cap100;
        const float *tv = tval + i * cap100;
        for (size_t j = 0; j < cap100 && ti[j] >= 0; j++) {
            float gap = tv[0] - tv[j];
            if (j < cap10 && gap < g10[ti[j]])
                g10[ti[j]] = gap;
            if (gap < g100[ti[j]])
                g100[ti[j]] = gap;
        }
    }
    size_t off = ref->offsets[qi], cnt = ref->counts[qi];
    size_t n_src = src ? (size_t)(src[0] != UINT32_MAX) + (src[1] != UINT32_MAX) : 0;
    size_t k10 = rate >= 1.0 ? 10 : (size_t)ceil((10.0 - (double)n_src) * rate);
    size_t k100 = rate >= 1.0 ? 100 : (size_t)ceil((100.0 - (double)n_src) * rate);
    size_t others = 0; /* non-source hits seen so far */
    int rc = 0;
    for (size_t h = 0; h < cnt && !rc; h++) {
        /* The hit's document number: its id's position in the reference list. */
        uint32_t d;
        rc = idx_reader_docno(&c->r, ref->hits[off + h].id, &d, m);
        if (rc) {
            if (rc == TARTAN_ENOTFOUND)
                rc = store_fail(m, TARTAN_ECORRUPT, "calibration: a hit's id vanished");
            break;
        }
        /* (A reference of every live document may hold one added since the sample: it is
         * live, and was ranked with the others.) */
        if (!c->whole && ref_index(c, d) < 0) {
            rc = store_fail(m, TARTAN_EINTERNAL, "calibration: a hit outside the reference");
            break;
        }
        /* Where the hit stands in the index's ranking: rank h at rate 1; else a source at
         * its own rank, the others as above. */
        int is_src = rate < 1.0 && n_src && (d == src[0] || d == src[1]);
        int whole = rate >= 1.0 || is_src;
        size_t slot = whole ? h : others++;
        int in10 = slot < (whole ? 10 : k10), in100 = slot < (whole ? 100 : k100);
        if (stand && h < 100)
            stand[qi * 100 + h] = (uint8_t)(in10 | in100 << 1);
        if (!in10 && !in100)
            continue;
        kern_pdoc pd;
        c->r.verify = 0;
        rc = idx_reader_doc(&c->r, d, &pd, m);
        c->r.verify = 1;
        if (rc)
            break;
        float need10 = INFINITY, need100 = INFINITY;
        for (uint32_t t = 0; t < pd.ntok; t++) {
            uint32_t code = c->r.h.code_bytes == 2 ? ((const uint16_t *)pd.codes)[t]
                                                   : ((const uint32_t *)pd.codes)[t];
            if (code >= K) {
                rc = store_fail(m, TARTAN_ECORRUPT,
                                "document %u: token %u has code %u, past %zu centroids", d, t, code,
                                K);
                break;
            }
            if (g10[code] < need10)
                need10 = g10[code];
            if (g100[code] < need100)
                need100 = g100[code];
        }
        if (!rc && ((in10 && margin_push(ms10, need10)) || (in100 && margin_push(ms100, need100))))
            rc = store_fail(m, ENOMEM, "calibration: out of memory");
    }
    /* The tables back to INFINITY: only the probed centroids were touched. */
    for (size_t i = 0; i < lq * cap100; i++)
        if (tix[i] >= 0)
            g10[tix[i]] = g100[tix[i]] = INFINITY;
    return rc;
}

/* Recall of run res against the reference top k (ids), averaged over the queries. */
/* The margins at each level from the needed margins of the top 10 and top 100, capped at
 * MARGIN_ALL and non-decreasing in the level. */
static void margins_at_levels(const margin_set *ms10, const margin_set *ms100, float *m10,
                              float *m100)
{
    for (size_t l = 0; l < ENG_CALIB_LEVELS; l++) {
        float a = quantile(ms10->v, ms10->n, levels[l]);
        float b = quantile(ms100->v, ms100->n, levels[l]);
        m10[l] = isfinite(a) && a < MARGIN_ALL ? a : MARGIN_ALL;
        m100[l] = isfinite(b) && b < MARGIN_ALL ? b : MARGIN_ALL;
        if (l && m10[l] < m10[l - 1])
            m10[l] = m10[l - 1];
        if (l && m100[l] < m100[l - 1])
            m100[l] = m100[l - 1];
    }
}

/* The short pseudo-queries: the first SHORT_LEN tokens of each pseudo-query, into c->sq. */
static int make_short(calib_run *c, store_msg *m)
{
    const size_t n = c->q.n_queries, dim = c->dim;
    if (!(c->semb = malloc((n ? n : 1) * SHORT_LEN * dim * sizeof *c->semb)))
        return store_fail(m, ENOMEM, "calibration: out of memory");
    for (size_t p = 0; p < n; p++)
        memcpy(c->semb + p * SHORT_LEN * dim, c->qemb + p * PSEUDO_LEN * dim,
               SHORT_LEN * dim * sizeof *c->semb);
    c->sq = (tartan_queries){.n_queries = n,
                             .qlen = SHORT_LEN,
                             .embeddings = c->semb,
                             .n_rows = n * SHORT_LEN,
                             .dim = dim,
                             .dtype = TARTAN_FLOAT32};
    return 0;
}

/* Step 3 for one set of prepared queries eq (ranked exhaustively in ref) on dev: the needed
 * margins of each query's top 10 and top 100 into ms10 / ms100. src: the pseudo-queries'
 * sources, or NULL. */
static int margins_of(calib_run *c, kern_dev dev, const eng_queries *eq, const tartan_results *ref,
                      double rate, const uint32_t *src, margin_set *ms10, margin_set *ms100,
                      uint8_t *stand, store_msg *m)
{
    const size_t cap = eng_probe_cap(100) < c->K ? eng_probe_cap(100) : c->K;
    const size_t rows = eq->off[eq->n];
    int64_t *tix = malloc((rows ? rows : 1) * cap * sizeof *tix);
    float *tval = malloc((rows ? rows : 1) * cap * sizeof *tval);
    int rc = 0;
    if (!tix || !tval)
        rc = store_fail(m, ENOMEM, "calibration: out of memory");
    else
        rc = probe_tops(c, dev, eq->emb, rows, cap, tix, tval, m);
    for (size_t i = 0; i < eq->n && !rc; i++)
        rc = needed_margins(c, tix + eq->off[i] * cap, tval + eq->off[i] * cap,
                            eq->off[i + 1] - eq->off[i], ref, i, rate, src ? src + 2 * i : NULL,
                            ms10, ms100, stand, m);
    free(tix);
    free(tval);
    return rc;
}

/*
 * Recall of run res against the reference hits that stand for the index's top k (stand[q * 100
 * + h] & bit, needed_margins), averaged over the queries: found in res's top k. With every
 * document in the reference those are its top k. Over a sample they are the sources and the
 * sample's top ceil((k - sources) * rate) others: the sample's whole top k would stand for the
 * index's top k / rate, which margins calibrated for the top k do not promise to reach
 * (measured: 0.934 / 0.880 at k 10 / 100 over a 10% sample of 200,000 documents of 10 tokens,
 * where the same queries against every document gave 0.974 / 0.979).
 */
static double recall_of(const tartan_results *res, const tartan_results *ref, size_t k,
                        const uint8_t *stand, int bit)
{
    double sum = 0;
    size_t nq = 0;
    for (size_t q = 0; q < ref->n_queries; q++) {
        size_t nr = 0, hit = 0, ng = res->counts[q] < k ? res->counts[q] : k;
        for (size_t i = 0; i < ref->counts[q] && i < 100; i++) {
            if (!(stand[q * 100 + i] & bit))
                continue;
            nr++;
            for (size_t j = 0; j < ng; j++)
                if (!strcmp(ref->hits[ref->offsets[q] + i].id, res->hits[res->offsets[q] + j].id)) {
                    hit++;
                    break;
                }
        }
        if (!nr)
            continue;
        sum += (double)hit / (double)nr;
        nq++;
    }
    return nq ? sum / (double)nq : 1.0;
}

static void calib_free(calib_run *c)
{
    if (c->r_open)
        idx_reader_close(&c->r);
    free(c->ref);
    free(c->qemb);
    free(c->semb);
    free(c->qlens);
    free(c->src);
    free(c->tok);
    free(c->stand);
    free(c->gap10);
}

typedef struct calib_put {
    const eng_calib *c;
} calib_put;

static int write_fn(store_txn *txn, void *ctx, store_msg *m)
{
    return eng_calib_write(txn, ((calib_put *)ctx)->c, m);
}

int tartan_calibrate(tartan_db *db, const tartan_calibrate_params *params, tartan_calibration *out)
{
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_calibrate: db is NULL");
    tartan_calibrate_params dp;
    if (!params) {
        tartan_calibrate_params_init(&dp);
        params = &dp;
    }
    store_msg m = {{0}};
    if (store_is_readonly(db->env))
        return eng_failf(db, TARTAN_EREADONLY, "'%s' is open read-only", store_path(db->env));
    if (params->threads < 0)
        return eng_failf(db, TARTAN_ERANGE, "threads is %d; it must be 0 or more", params->threads);
    double t0 = eng_now();
    calib_run c = {.db = db};
    tartan_results *ref = NULL, *sref = NULL, *res = NULL;
    eng_queries eq = {0}, eqs = {0};
    margin_set ms10 = {0}, ms100 = {0}, ss10 = {0}, ss100 = {0};
    eng_calib cal;
    eng_calib_default(&cal);
    int recorded = 0; /* the failure's message is on the handle already (a search's) */
    int rc = idx_reader_open(db->env, &c.r, &m);
    if (rc)
        goto fail;
    c.r_open = 1;
    if (!c.r.trained) {
        rc = store_fail(&m, TARTAN_ENOTTRAINED, "calibration: the index has no centroids yet");
        goto fail;
    }
    if (c.r.h.n_docs == 0) {
        rc = store_fail(&m, TARTAN_EEMPTY, "calibration: the index has no documents");
        goto fail;
    }
    c.dim = c.r.h.dim;
    c.K = c.r.h.n_centroids;
    /* The reference: every document up to DEFAULT_REFERENCE_DOCS on the CPU (an exhaustive
     * search of 128 pseudo-queries over 20,000 documents takes seconds on two cores), up to
     * DEFAULT_REFERENCE_DOCS_GPU on a GPU (0.6 s at 1M documents on an H200). */
    kern_dev dev = KERN_DEV_CPU;
    if ((rc = eng_device_pick(
             params->device != TARTAN_DEVICE_AUTO ? params->device : db->opts.device, &dev, &m)))
        goto fail;
    size_t max_ref = params->max_reference_docs;
    if (!max_ref)
        max_ref = dev == KERN_DEV_CUDA ? DEFAULT_REFERENCE_DOCS_GPU : DEFAULT_REFERENCE_DOCS;
    if ((rc = pick_reference(&c, max_ref, params->corpus_docs, params->seed, &m)))
        goto fail;
    const tartan_queries *q = params->queries;
    if (!q) {
        size_t n = params->n_pseudo ? params->n_pseudo : DEFAULT_PSEUDO;
        if ((rc = make_pseudo(&c, n, params->seed, &m)))
            goto fail;
        q = &c.q;
    }
    /* Short pseudo-queries too (not for the caller's own queries: their lengths are the ones
     * the caller searches with). */
    if (!params->queries && (rc = make_short(&c, &m)))
        goto fail;
    /* The queries as the search will see them (checked, normalised). */
    if ((rc = eng_queries_prepare(q, c.dim, &eq, &m)) ||
        (c.sq.n_queries && (rc = eng_queries_prepare(&c.sq, c.dim, &eqs, &m))))
        goto fail;
    /* Step 2: the reference, exhaustive over the sample. */
    tartan_search_params sp;
    tartan_search_params_init(&sp, 100);
    sp.exhaustive = 1;
    sp.threads = params->threads;
    sp.device = params->device;
    /* The searches run without our snapshot: the handle opens its own. */
    idx_reader_close(&c.r);
    c.r_open = 0;
    const eng_docset *only = c.whole ? NULL : &c.ref_set;
    if ((rc = eng_search_call(db, q, &sp, NULL, only, &ref)) ||
        (c.sq.n_queries && (rc = eng_search_call(db, &c.sq, &sp, NULL, only, &sref)))) {
        recorded = 1;
        goto fail;
    }
    if ((rc = idx_reader_open(db->env, &c.r, &m)))
        goto fail;
    c.r_open = 1;
    /* Step 3. */
    c.stand = calloc(q->n_queries ? q->n_queries * 100 : 1, 1);
    c.gap10 = malloc(2 * c.K * sizeof *c.gap10);
    if (!c.stand || !c.gap10) {
        rc = store_fail(&m, ENOMEM, "calibration: out of memory");
        goto fail;
    }
    c.gap100 = c.gap10 + c.K;
    for (size_t i = 0; i < 2 * c.K; i++)
        c.gap10[i] = INFINITY;
    double rate = c.whole ? 1.0 : (double)c.n_ref / (double)(c.r.h.n_docs ? c.r.h.n_docs : 1);
    const uint32_t *src = params->queries ? NULL : c.src;
    if ((rc = margins_of(&c, dev, &eq, ref, rate, src, &ms10, &ms100, c.stand, &m)) ||
        (c.sq.n_queries &&
         (rc = margins_of(&c, dev, &eqs, sref, rate, src, &ss10, &ss100, NULL, &m))))
        goto fail;
    if (!ms10.n || !ms100.n) {
        rc = store_fail(&m, TARTAN_EEMPTY, "calibration: the reference found no documents");
        goto fail;
    }
    /* Step 4. */
    cal.calibrated = 1;
    cal.flags = params->queries ? ENG_CALIB_FROM_QUERIES : 0;
    cal.n_queries = (uint32_t)(q->n_queries > UINT32_MAX ? UINT32_MAX : q->n_queries);
    cal.n_docs = c.r.h.n_docs;
    cal.n_reference_docs = c.n_ref;
    margins_at_levels(&ms10, &ms100, cal.margin10, cal.margin100);
    if (ss10.n && ss100.n) {
        cal.short_len = SHORT_LEN;
        margins_at_levels(&ss10, &ss100, cal.margin10s, cal.margin100s);
        /* A short query needs at least the full one's margin (fewer chances, not more). */
        for (size_t l = 0; l < ENG_CALIB_LEVELS; l++) {
            if (cal.margin10s[l] < cal.margin10[l])
                cal.margin10s[l] = cal.margin10[l];
            if (cal.margin100s[l] < cal.margin100[l])
                cal.margin100s[l] = cal.margin100[l];
        }
    }
    idx_reader_close(&c.r);
    c.r_open = 0;
    /* Step 5: the default search with the new table, k 10 and k 100. */
    for (int pass = 0; pass < 2 && !rc; pass++) {
        size_t k = pass ? 100 : 10;
        tartan_search_params p;
        tartan_search_params_init(&p, k);
        p.threads = params->threads;
        p.device = params->device;
        if ((rc = eng_search_call(db, q, &p, &cal, only, &res)))
            break;
        double r = recall_of(res, ref, k, c.stand, pass ? 2 : 1);
        if (pass) {
            cal.recall100 = (float)r;
        } else {
            cal.recall10 = (float)r;
            cal.candidates10 = (double)res->stats.n_candidates / (double)res->n_queries;
            cal.exact10 = (double)res->stats.n_exact / (double)res->n_queries;
        }
        tartan_results_free(res);
        res = NULL;
    }
    if (rc) {
        recorded = 1;
        goto fail;
    }
    cal.seconds = eng_now() - t0;
    /* Step 6, under the handle's writer lock like every change. */
    calib_put put = {&cal};
    pthread_mutex_lock(&db->write_lock);
    rc = store_write(db->env, write_fn, &put, &m);
    pthread_mutex_unlock(&db->write_lock);
    if (!rc && out)
        eng_calib_public(&cal, cal.n_docs, out);
fail:
    calib_free(&c);
    eng_queries_free(&eq);
    eng_queries_free(&eqs);
    tartan_results_free(ref);
    tartan_results_free(sref);
    free(ms10.v);
    free(ms100.v);
    free(ss10.v);
    free(ss100.v);
    return rc && !recorded ? eng_fail(db, rc, &m) : rc;
}
