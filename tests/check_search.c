/*
 * check_search.c: tartan_search on real indexes (real LMDB in a fresh temporary directory per
 * test): exhaustive search against a brute-force double-precision MaxSim over the decompressed
 * documents, PLAID against exhaustive, subsets, deletes, k beyond the index, empty and
 * untrained indexes, batches against one-by-one searches (fixed and ragged, fp32 and fp16),
 * and every bad argument rejected with its code while the index stays as it was.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db.h"
#include "index.h"
#include "kernels.h"
#include "store.h"
#include "fixture.h"
#include "tartan.h"

/* ---- fixture: a fresh directory per test (tests/fixture.c) ------------------------------ */

static void setup(void)
{
    fixture_dir_create("check-search");
}

static void teardown(void)
{
    fixture_dir_remove();
}

/* ---- random clustered corpora ------------------------------------------------------------ */

enum { DIM = 32, NTOPIC = 60, NDOC = 400, LQ = 8 };

/*
 * A corpus like ColBERT output in miniature: topic centres; each document draws 3 topics and
 * fills 4 to 40 tokens with noisy copies of them (so that tokens cluster and documents share
 * clusters); queries are noisy copies of some tokens of one document.
 */
typedef struct corpus {
    size_t n_docs, n_rows;
    size_t *doclens;
    float *emb; /* [n_rows, DIM] */
    char **ids;
    float *topics;
} corpus;

static void corpus_make(corpus *c, size_t n_docs, uint64_t seed)
{
    rng_state = seed;
    c->n_docs = n_docs;
    c->topics = xmalloc(NTOPIC * DIM * sizeof(float));
    for (size_t i = 0; i < NTOPIC * DIM; i++)
        c->topics[i] = (float)gauss();
    c->doclens = xmalloc(n_docs * sizeof(size_t));
    c->ids = xmalloc(n_docs * sizeof(char *));
    c->n_rows = 0;
    for (size_t i = 0; i < n_docs; i++) {
        c->doclens[i] = 4 + rnd() % 37;
        c->n_rows += c->doclens[i];
        c->ids[i] = xmalloc(32);
        snprintf(c->ids[i], 32, "doc-%zu", i);
    }
    c->emb = xmalloc(c->n_rows * DIM * sizeof(float));
    size_t row = 0;
    for (size_t i = 0; i < n_docs; i++) {
        size_t t3[3] = {rnd() % NTOPIC, rnd() % NTOPIC, rnd() % NTOPIC};
        for (size_t t = 0; t < c->doclens[i]; t++, row++) {
            const float *ctr = c->topics + t3[rnd() % 3] * DIM;
            for (size_t j = 0; j < DIM; j++)
                c->emb[row * DIM + j] = (float)(ctr[j] + 0.6 * gauss());
        }
    }
}

static void corpus_free(corpus *c)
{
    for (size_t i = 0; i < c->n_docs; i++)
        free(c->ids[i]);
    free(c->ids);
    free(c->doclens);
    free(c->emb);
    free(c->topics);
}

/* nq queries of lq tokens each (lens NULL) or of lens[i] tokens, from random documents. */
static float *make_queries(const corpus *c, size_t nq, size_t lq, const size_t *lens,
                           size_t *rows_out)
{
    size_t rows = 0;
    for (size_t i = 0; i < nq; i++)
        rows += lens ? lens[i] : lq;
    float *q = xmalloc(rows * DIM * sizeof(float));
    size_t r = 0;
    for (size_t i = 0; i < nq; i++) {
        size_t d = rnd() % c->n_docs, off = 0;
        for (size_t j = 0; j < d; j++)
            off += c->doclens[j];
        size_t len = lens ? lens[i] : lq;
        for (size_t t = 0; t < len; t++, r++) {
            size_t src = off + rnd() % c->doclens[d];
            for (size_t j = 0; j < DIM; j++)
                q[r * DIM + j] = (float)(c->emb[src * DIM + j] + 0.8 * gauss());
        }
    }
    *rows_out = rows;
    return q;
}

static tartan_db *open_ix(unsigned flags, size_t n_centroids)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = flags;
    o.dim = DIM;
    o.n_centroids = n_centroids;
    tartan_db *db = NULL;
    int rc = tartan_open(ixpath, &o, &db);
    ck_assert_msg(rc == 0, "open: %s", tartan_errmsg(NULL));
    return db;
}

static void add_docs(tartan_db *db, const corpus *c, size_t from, size_t n)
{
    size_t off = 0, rows = 0;
    for (size_t i = 0; i < from; i++)
        off += c->doclens[i];
    for (size_t i = from; i < from + n; i++)
        rows += c->doclens[i];
    tartan_batch b = {.n_docs = n,
                      .ids = (const char *const *)c->ids + from,
                      .doclens = c->doclens + from,
                      .embeddings = c->emb + off * DIM,
                      .n_rows = rows,
                      .dim = DIM,
                      .dtype = TARTAN_FLOAT32};
    int rc = tartan_add(db, &b, 0);
    ck_assert_msg(rc == 0, "add: %s", tartan_errmsg(db));
}

/* An index of the whole corpus (64 centroids: lists of a few dozen documents each). */
static tartan_db *build(corpus *c, size_t n_docs, uint64_t seed)
{
    corpus_make(c, n_docs, seed);
    tartan_db *db = open_ix(TARTAN_CREATE, 64);
    add_docs(db, c, 0, n_docs);
    return db;
}

static tartan_queries fixed_queries(const float *q, size_t nq, size_t lq)
{
    tartan_queries x = {.n_queries = nq,
                        .qlens = NULL,
                        .qlen = lq,
                        .embeddings = q,
                        .n_rows = nq * lq,
                        .dim = DIM,
                        .dtype = TARTAN_FLOAT32};
    return x;
}

static tartan_results *search_ok(tartan_db *db, const tartan_queries *q,
                                 const tartan_search_params *p)
{
    tartan_results *r = NULL;
    int rc = tartan_search(db, q, p, &r);
    ck_assert_msg(rc == 0, "search: %s", tartan_errmsg(db));
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->n_queries, q->n_queries);
    /* The layout: consecutive offsets, NUL-terminated ids, scores best first. */
    ck_assert_uint_eq(r->offsets[0], 0);
    for (size_t i = 0; i < r->n_queries; i++) {
        ck_assert_uint_eq(r->offsets[i + 1], r->offsets[i] + r->counts[i]);
        ck_assert_uint_le(r->counts[i], p ? p->k : 10);
        for (size_t j = 0; j < r->counts[i]; j++) {
            const tartan_hit *h = &r->hits[r->offsets[i] + j];
            ck_assert(strlen(h->id) > 0);
            ck_assert(isfinite(h->score));
            if (j)
                ck_assert(h[-1].score >= h->score);
        }
    }
    return r;
}

/* ---- the double-precision reference --------------------------------------------------- */

/* Brute-force MaxSim of one query against every live document, decompressed by the codec. */
typedef struct ref_hit {
    char id[64];
    double score;
    uint32_t docno;
} ref_hit;

static int ref_cmp(const void *a, const void *b)
{
    const ref_hit *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return (x->docno > y->docno) - (x->docno < y->docno);
}

/* All live documents' reference scores for query q [lq, DIM] (not normalised), best first;
 * *n the count. */
static ref_hit *reference(tartan_db *db, const float *q, size_t lq, size_t *n)
{
    double *qn = xmalloc(lq * DIM * sizeof(double));
    for (size_t i = 0; i < lq; i++) {
        double ss = 0;
        for (size_t j = 0; j < DIM; j++)
            ss += (double)q[i * DIM + j] * q[i * DIM + j];
        for (size_t j = 0; j < DIM; j++)
            qn[i * DIM + j] = q[i * DIM + j] / sqrt(ss);
    }
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    ref_hit *out = xmalloc((r.h.n_docs + 1) * sizeof *out);
    store_cursor *cur = NULL;
    uint32_t docno;
    kern_pdoc doc;
    size_t k = 0;
    int rc;
    while ((rc = idx_reader_next_doc(&r, &cur, &docno, &doc, &m)) == 1) {
        float *d = xmalloc((size_t)doc.ntok * DIM * sizeof(float));
        idx_reader_decompress(&r, &doc, d);
        double s = 0;
        for (size_t i = 0; i < lq; i++) {
            double best = -INFINITY;
            for (size_t t = 0; t < doc.ntok; t++) {
                double v = 0;
                for (size_t j = 0; j < DIM; j++)
                    v += qn[i * DIM + j] * d[t * DIM + j];
                best = v > best ? v : best;
            }
            s += best;
        }
        free(d);
        const char *id;
        size_t len;
        ck_assert_int_eq(idx_reader_name(&r, docno, &id, &len, &m), 0);
        ck_assert_uint_lt(len, sizeof out[k].id);
        memcpy(out[k].id, id, len);
        out[k].id[len] = '\0';
        out[k].score = s;
        out[k].docno = docno;
        k++;
    }
    ck_assert_int_eq(rc, 0);
    idx_reader_close(&r);
    free(qn);
    qsort(out, k, sizeof *out, ref_cmp);
    *n = k;
    return out;
}

static const ref_hit *ref_find(const ref_hit *ref, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ref[i].id, id))
            return &ref[i];
    return NULL;
}

/* Results of query qi as returned equal the reference's top (ties aside): every returned id
 * has the reference's score within 1e-4, and at rank j the reference's j-th score. */
static void expect_exact(const tartan_results *r, size_t qi, const ref_hit *ref, size_t nref,
                         size_t k)
{
    size_t want = k < nref ? k : nref;
    ck_assert_uint_eq(r->counts[qi], want);
    for (size_t j = 0; j < want; j++) {
        const tartan_hit *h = &r->hits[r->offsets[qi] + j];
        const ref_hit *f = ref_find(ref, nref, h->id);
        ck_assert_msg(f != NULL, "unknown id %s", h->id);
        ck_assert_msg(fabs(h->score - f->score) < 1e-4, "%s: %.6f vs reference %.6f", h->id,
                      h->score, f->score);
        ck_assert_msg(fabs(h->score - ref[j].score) < 1e-4, "rank %zu: %.6f vs %.6f", j, h->score,
                      ref[j].score);
    }
}

/* Two results equal: same ids in the same order, same scores (to fp32 rounding). */
static void expect_same(const tartan_results *a, size_t qa, const tartan_results *b, size_t qb)
{
    ck_assert_uint_eq(a->counts[qa], b->counts[qb]);
    for (size_t j = 0; j < a->counts[qa]; j++) {
        const tartan_hit *x = &a->hits[a->offsets[qa] + j], *y = &b->hits[b->offsets[qb] + j];
        ck_assert_msg(fabsf(x->score - y->score) < 1e-5, "rank %zu: %f vs %f", j, x->score,
                      y->score);
        if (strcmp(x->id, y->id)) /* only a tie may swap two documents */
            ck_assert_msg(fabsf(x->score - y->score) < 1e-6, "rank %zu: %s vs %s", j, x->id, y->id);
    }
}

static int has_id(const tartan_results *r, size_t qi, const char *id)
{
    for (size_t j = 0; j < r->counts[qi]; j++)
        if (!strcmp(r->hits[r->offsets[qi] + j].id, id))
            return 1;
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------ */

START_TEST(test_search_params_defaults)
{
    /* Every k: the adaptive stages (ncells 0, ndocs 0), no pruning, the default target. */
    static const size_t ks[] = {1, 10, 11, 100, 101, 1024, 1025, 5000};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        tartan_search_params p;
        memset(&p, 0xA5, sizeof p);
        tartan_search_params_init(&p, ks[i]);
        ck_assert_uint_eq(p.k, ks[i]);
        ck_assert_uint_eq(p.ncells, 0);
        ck_assert_uint_eq(p.ndocs, 0);
        ck_assert(p.centroid_score_threshold == -1.f);
        ck_assert(p.recall_target == 0.f);
        ck_assert_int_eq(p.exhaustive, 0);
        ck_assert_ptr_null(p.subset);
        ck_assert_uint_eq(p.n_subset, 0);
        ck_assert_int_eq(p.threads, 0);
        ck_assert_int_eq(p.device, TARTAN_DEVICE_AUTO);
    }
    tartan_results_free(NULL);
}
END_TEST

START_TEST(test_search_exhaustive_matches_bruteforce)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 11);
    size_t rows;
    float *q = make_queries(&c, 4, LQ, NULL, &rows);
    tartan_search_params p;
    tartan_search_params_init(&p, 50);
    p.exhaustive = 1;
    tartan_queries qs = fixed_queries(q, 4, LQ);
    tartan_results *r = search_ok(db, &qs, &p);
    for (size_t i = 0; i < 4; i++) {
        size_t nref;
        ref_hit *ref = reference(db, q + i * LQ * DIM, LQ, &nref);
        ck_assert_uint_eq(nref, NDOC);
        expect_exact(r, i, ref, nref, 50);
        free(ref);
    }
    ck_assert_uint_eq(r->stats.n_exact, 4 * NDOC);
    tartan_results_free(r);
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_plaid_wide_equals_exhaustive)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 12);
    size_t rows;
    float *q = make_queries(&c, 5, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 5, LQ);
    tartan_search_params p;
    tartan_search_params_init(&p, 20);
    /* Every centroid probed, nothing pruned, everything kept: PLAID must find exactly what
     * exhaustive search finds. */
    p.ncells = 1000;
    p.centroid_score_threshold = -1e30f;
    p.ndocs = 4 * NDOC;
    tartan_results *a = search_ok(db, &qs, &p);
    /* Wide but still through stages 2 and 3 (ndocs / 4 below the candidates). */
    p.ndocs = NDOC / 2;
    tartan_results *b = search_ok(db, &qs, &p);
    p.exhaustive = 1;
    tartan_results *e = search_ok(db, &qs, &p);
    for (size_t i = 0; i < 5; i++) {
        expect_same(a, i, e, i);
        ck_assert_uint_eq(b->counts[i], 20);
        size_t nref;
        ref_hit *ref = reference(db, q + i * LQ * DIM, LQ, &nref);
        expect_exact(a, i, ref, nref, 20);
        /* Pruned runs return exact scores of the documents they return. */
        for (size_t j = 0; j < b->counts[i]; j++) {
            const tartan_hit *h = &b->hits[b->offsets[i] + j];
            ck_assert(fabs(h->score - ref_find(ref, nref, h->id)->score) < 1e-4);
        }
        free(ref);
    }
    tartan_results_free(a);
    tartan_results_free(b);
    tartan_results_free(e);
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_default_recall)
{
    corpus c;
    tartan_db *db = build(&c, 1500, 13);
    enum { NQ = 30 };
    size_t rows;
    float *q = make_queries(&c, NQ, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, NQ, LQ);
    tartan_search_params p;
    tartan_search_params_init(&p, 10);
    tartan_results *a = search_ok(db, &qs, &p);
    p.exhaustive = 1;
    tartan_results *e = search_ok(db, &qs, &p);
    size_t found = 0, total = 0;
    for (size_t i = 0; i < NQ; i++) {
        for (size_t j = 0; j < e->counts[i]; j++)
            found += has_id(a, i, e->hits[e->offsets[i] + j].id);
        total += e->counts[i];
    }
    double recall = (double)found / total;
    printf("test_search_default_recall: recall@10 of the defaults against exhaustive: %.3f "
           "(%zu queries, %d documents; %llu candidates, %llu scored exactly)\n",
           recall, (size_t)NQ, 1500, (unsigned long long)a->stats.n_candidates,
           (unsigned long long)a->stats.n_exact);
    /* The pruning stages ran: fewer documents scored exactly than were candidates. */
    ck_assert_uint_lt(a->stats.n_exact, a->stats.n_candidates);
    ck_assert_uint_eq(total, NQ * 10);
    ck_assert_msg(recall >= 0.8, "recall@10 %.3f", recall);
    tartan_results_free(a);
    tartan_results_free(e);
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* The subset: every third document, and a few ids the index does not have. */
static const char **subset_ids(const corpus *c, size_t *n)
{
    const char **ids = xmalloc((c->n_docs / 3 + 3) * sizeof *ids);
    size_t k = 0;
    for (size_t i = 0; i < c->n_docs; i += 3)
        ids[k++] = c->ids[i];
    ids[k++] = "no-such-document";
    ids[k++] = c->ids[0]; /* repeated */
    *n = k;
    return ids;
}

static int in_subset(const char *id)
{
    size_t i;
    return sscanf(id, "doc-%zu", &i) == 1 && i % 3 == 0;
}

START_TEST(test_search_subset_only_allowed)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 14);
    size_t rows, ns;
    float *q = make_queries(&c, 3, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 3, LQ);
    const char **ids = subset_ids(&c, &ns);
    size_t n_allowed = (NDOC + 2) / 3;
    for (int mode = 0; mode < 3; mode++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.subset = ids;
        p.n_subset = ns;
        p.exhaustive = mode == 0;
        /* mode 1: a subset larger than ndocs goes through PLAID's stages; mode 2: smaller,
         * scored exactly. */
        p.ndocs = mode == 1 ? 32 : 256;
        tartan_results *r = search_ok(db, &qs, &p);
        for (size_t i = 0; i < 3; i++) {
            for (size_t j = 0; j < r->counts[i]; j++)
                ck_assert_msg(in_subset(r->hits[r->offsets[i] + j].id), "%s not allowed",
                              r->hits[r->offsets[i] + j].id);
            if (mode != 1)
                ck_assert_uint_eq(r->counts[i], 10);
        }
        if (mode == 2) {
            /* Exact over the subset: the reference restricted to it. */
            for (size_t i = 0; i < 3; i++) {
                size_t nref, k = 0;
                ref_hit *ref = reference(db, q + i * LQ * DIM, LQ, &nref);
                for (size_t j = 0; j < nref; j++)
                    if (in_subset(ref[j].id))
                        ref[k++] = ref[j];
                ck_assert_uint_eq(k, n_allowed);
                expect_exact(r, i, ref, k, 10);
                free(ref);
            }
        }
        tartan_results_free(r);
    }
    /* k beyond the subset: every allowed document comes back, once. */
    tartan_search_params p;
    tartan_search_params_init(&p, 1000);
    p.subset = ids;
    p.n_subset = ns;
    p.exhaustive = 1;
    tartan_results *r = search_ok(db, &qs, &p);
    for (size_t i = 0; i < 3; i++) {
        ck_assert_uint_eq(r->counts[i], n_allowed);
        for (size_t j = 0; j < c.n_docs; j += 3)
            ck_assert(has_id(r, i, c.ids[j]));
    }
    tartan_results_free(r);
    p.exhaustive = 0;
    r = search_ok(db, &qs, &p); /* 134 allowed <= ndocs 4096: all scored */
    for (size_t i = 0; i < 3; i++)
        ck_assert_uint_eq(r->counts[i], n_allowed);
    tartan_results_free(r);
    free(ids);
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_subset_small_exact)
{
    /* Subsets small enough to be scored from their list (PLAID: at most ndocs; exhaustive:
     * at most an eighth of the index) rank exactly as the reference restricted to them. */
    corpus c;
    tartan_db *db = build(&c, NDOC, 25);
    size_t rows;
    float *q = make_queries(&c, 3, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 3, LQ);
    const char *ids[NDOC / 20];
    size_t ns = 0;
    for (size_t i = 7; i < NDOC; i += 20)
        ids[ns++] = c.ids[i];
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = ex;
        p.subset = ids;
        p.n_subset = ns;
        p.threads = 2;
        tartan_results *r = search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->stats.n_exact, 3 * ns); /* the list only, not the index */
        for (size_t i = 0; i < 3; i++) {
            size_t nref, k = 0;
            ref_hit *ref = reference(db, q + i * LQ * DIM, LQ, &nref);
            for (size_t j = 0; j < nref; j++) {
                size_t d;
                if (sscanf(ref[j].id, "doc-%zu", &d) == 1 && d % 20 == 7)
                    ref[k++] = ref[j];
            }
            ck_assert_uint_eq(k, ns);
            expect_exact(r, i, ref, k, 10);
            free(ref);
        }
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_subset_empty)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 15);
    size_t rows;
    float *q = make_queries(&c, 2, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 2, LQ);
    const char *unknown[] = {"x", "y"};
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = ex;
        p.subset = unknown;
        p.n_subset = 2;
        tartan_results *r = search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->offsets[2], 0);
        tartan_results_free(r);
        p.n_subset = 0; /* an empty list allows nothing */
        r = search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->offsets[2], 0);
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_deleted_never_returned)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 16);
    size_t rows;
    float *q = make_queries(&c, 3, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 3, LQ);
    /* Delete the exhaustive top 5 of each query, and every tenth document. */
    tartan_search_params p;
    tartan_search_params_init(&p, 5);
    p.exhaustive = 1;
    tartan_results *r = search_ok(db, &qs, &p);
    const char *del[3 * 5 + NDOC / 10];
    char *dup[3 * 5];
    size_t nd = 0;
    for (size_t h = 0; h < r->offsets[3]; h++)
        del[nd++] = dup[h] = strdup(r->hits[h].id);
    size_t ntop = nd;
    for (size_t i = 5; i < NDOC; i += 10)
        del[nd++] = c.ids[i];
    tartan_results_free(r);
    size_t n_deleted;
    ck_assert_int_eq(tartan_delete(db, del, nd, &n_deleted), 0);
    ck_assert_uint_gt(n_deleted, NDOC / 10);
    for (int reopen = 0; reopen < 2; reopen++) {
        if (reopen) {
            tartan_close(db);
            db = open_ix(0, 0);
        }
        for (int ex = 0; ex < 2; ex++) {
            tartan_search_params_init(&p, 1000);
            p.exhaustive = ex;
            r = search_ok(db, &qs, &p);
            for (size_t i = 0; i < 3; i++) {
                if (ex)
                    ck_assert_uint_eq(r->counts[i], NDOC - n_deleted);
                for (size_t j = 0; j < nd; j++)
                    ck_assert_msg(!has_id(r, i, del[j]), "deleted %s returned", del[j]);
            }
            tartan_results_free(r);
        }
    }
    /* The survivors still rank exactly. */
    tartan_search_params_init(&p, 10);
    p.exhaustive = 1;
    r = search_ok(db, &qs, &p);
    size_t nref;
    ref_hit *ref = reference(db, q, LQ, &nref);
    ck_assert_uint_eq(nref, NDOC - n_deleted);
    expect_exact(r, 0, ref, nref, 10);
    free(ref);
    tartan_results_free(r);
    for (size_t i = 0; i < ntop; i++)
        free(dup[i]);
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_replaced_scored_once)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 17);
    size_t rows;
    float *q = make_queries(&c, 1, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 1, LQ);
    /* Replace doc-7 by the query itself: it becomes the best match, returned once. */
    size_t len = LQ;
    const char *id[] = {"doc-7"};
    tartan_batch b = {.n_docs = 1,
                      .ids = id,
                      .doclens = &len,
                      .embeddings = q,
                      .n_rows = LQ,
                      .dim = DIM,
                      .dtype = TARTAN_FLOAT32};
    ck_assert_int_eq(tartan_add(db, &b, TARTAN_REPLACE), 0);
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, NDOC);
        p.exhaustive = ex;
        tartan_results *r = search_ok(db, &qs, &p);
        ck_assert_str_eq(r->hits[0].id, "doc-7");
        size_t seen = 0;
        for (size_t j = 0; j < r->counts[0]; j++)
            seen += !strcmp(r->hits[j].id, "doc-7");
        ck_assert_uint_eq(seen, 1);
        size_t nref;
        ref_hit *ref = reference(db, q, LQ, &nref);
        ck_assert(fabs(r->hits[0].score - ref[0].score) < 1e-4);
        free(ref);
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_k_beyond_index)
{
    corpus c;
    tartan_db *db = build(&c, 50, 18);
    size_t rows;
    float *q = make_queries(&c, 2, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 2, LQ);
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 100000);
        p.exhaustive = ex;
        tartan_results *r = search_ok(db, &qs, &p);
        for (size_t i = 0; i < 2; i++) {
            if (ex)
                ck_assert_uint_eq(r->counts[i], 50);
            else
                ck_assert_uint_le(r->counts[i], 50);
            ck_assert_uint_gt(r->counts[i], 0);
            for (size_t j = 0; j < r->counts[i]; j++)
                for (size_t l = 0; l < j; l++)
                    ck_assert_str_ne(r->hits[r->offsets[i] + j].id, r->hits[r->offsets[i] + l].id);
        }
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_untrained_index)
{
    tartan_db *db = open_ix(TARTAN_CREATE, 0);
    float q[2 * DIM];
    for (size_t i = 0; i < 2 * DIM; i++)
        q[i] = (float)(i % 7) - 3.0f;
    tartan_queries qs = fixed_queries(q, 1, 2);
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = ex;
        tartan_results *r = search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->counts[0], 0);
        tartan_results_free(r);
    }
    /* The queries are still checked. */
    qs.dim = DIM + 1;
    tartan_results *r = (tartan_results *)1;
    ck_assert_int_eq(tartan_search(db, &qs, NULL, &r), TARTAN_EDIM);
    ck_assert_ptr_null(r);
    tartan_close(db);
}
END_TEST

START_TEST(test_search_empty_index)
{
    corpus c;
    corpus_make(&c, 60, 19);
    tartan_db *db = open_ix(TARTAN_CREATE, 16);
    /* Trained, then emptied: centroids but no documents. */
    add_docs(db, &c, 0, 60);
    ck_assert_int_eq(tartan_delete(db, (const char *const *)c.ids, 60, NULL), 0);
    size_t rows;
    float *q = make_queries(&c, 3, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 3, LQ);
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 10);
        p.exhaustive = ex;
        tartan_results *r = search_ok(db, &qs, &p);
        ck_assert_uint_eq(r->offsets[3], 0);
        tartan_results_free(r);
    }
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* One-by-one results of each query of a batch, against the batch's. */
static void batch_vs_single(tartan_db *db, const tartan_queries *qs, const tartan_search_params *p)
{
    tartan_results *all = search_ok(db, qs, p);
    size_t es = qs->dtype == TARTAN_FLOAT32 ? 4 : 2, row = 0;
    for (size_t i = 0; i < qs->n_queries; i++) {
        size_t len = qs->qlens ? qs->qlens[i] : qs->qlen;
        tartan_queries one = *qs;
        one.n_queries = 1;
        one.qlens = qs->qlens ? &qs->qlens[i] : NULL;
        one.embeddings = (const char *)qs->embeddings + row * DIM * es;
        one.n_rows = len;
        tartan_results *r = search_ok(db, &one, p);
        expect_same(all, i, r, 0);
        tartan_results_free(r);
        row += len;
    }
    tartan_results_free(all);
}

START_TEST(test_search_batch_fixed_f32)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 20);
    enum { NQ = 9 };
    size_t rows;
    float *q = make_queries(&c, NQ, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, NQ, LQ);
    tartan_search_params p;
    for (int ex = 0; ex < 2; ex++)
        for (int threads = 1; threads <= 3; threads += 2) {
            tartan_search_params_init(&p, 10);
            p.exhaustive = ex;
            p.threads = threads;
            batch_vs_single(db, &qs, &p);
        }
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_batch_ragged_f16)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 21);
    enum { NQ = 7 };
    size_t lens[NQ] = {1, 8, 3, 16, 5, 2, 11}, rows;
    float *q = make_queries(&c, NQ, 0, lens, &rows);
    uint16_t *h = xmalloc(rows * DIM * sizeof *h);
    float *back = xmalloc(rows * DIM * sizeof *back);
    for (size_t i = 0; i < rows * DIM; i++) {
        h[i] = kern_f32_to_f16(q[i]);
        back[i] = kern_f16_to_f32(h[i]);
    }
    tartan_queries qs = {.n_queries = NQ,
                         .qlens = lens,
                         .embeddings = h,
                         .n_rows = rows,
                         .dim = DIM,
                         .dtype = TARTAN_FLOAT16};
    tartan_search_params p;
    for (int ex = 0; ex < 2; ex++) {
        tartan_search_params_init(&p, 15);
        p.exhaustive = ex;
        p.threads = 2;
        batch_vs_single(db, &qs, &p);
    }
    /* fp16 queries score as their fp32 values do. */
    tartan_search_params_init(&p, 15);
    tartan_results *a = search_ok(db, &qs, &p);
    qs.embeddings = back;
    qs.dtype = TARTAN_FLOAT32;
    tartan_results *b = search_ok(db, &qs, &p);
    for (size_t i = 0; i < NQ; i++)
        expect_same(a, i, b, i);
    tartan_results_free(a);
    tartan_results_free(b);
    free(h);
    free(back);
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* The index's info, to see that a failed search changed nothing. */
static void expect_info(tartan_db *db, const tartan_index_info *before)
{
    tartan_index_info now;
    ck_assert_int_eq(tartan_info(db, &now), 0);
    ck_assert_uint_eq(now.n_docs, before->n_docs);
    ck_assert_uint_eq(now.n_tokens, before->n_tokens);
    ck_assert_uint_eq(now.bytes_file, before->bytes_file);
    ck_assert_uint_eq(now.ivf_entries, before->ivf_entries);
}

static void expect_fail(tartan_db *db, const tartan_queries *qs, const tartan_search_params *p,
                        int code, const tartan_index_info *before)
{
    tartan_results *r = (tartan_results *)1;
    int rc = tartan_search(db, qs, p, &r);
    ck_assert_msg(rc == code, "got %s, want %s (%s)", tartan_err_name(rc), tartan_err_name(code),
                  tartan_errmsg(db));
    ck_assert_ptr_null(r);
    const char *name = tartan_err_name(code);
    ck_assert_msg(!strncmp(tartan_errmsg(db), name, strlen(name)), "%s", tartan_errmsg(db));
    expect_info(db, before);
}

START_TEST(test_search_bad_arguments)
{
    corpus c;
    tartan_db *db = build(&c, 100, 22);
    tartan_index_info before;
    ck_assert_int_eq(tartan_info(db, &before), 0);
    size_t rows;
    float *q = make_queries(&c, 2, LQ, NULL, &rows);
    tartan_queries good = fixed_queries(q, 2, LQ), qs;
    tartan_search_params p, gp;
    tartan_search_params_init(&gp, 10);

    qs = good;
    qs.dim = DIM * 2;
    expect_fail(db, &qs, &gp, TARTAN_EDIM, &before);
    q[LQ * DIM + 3 * DIM + 5] = NAN;
    expect_fail(db, &good, &gp, TARTAN_ENONFINITE, &before);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "query 1"));
    q[LQ * DIM + 3 * DIM + 5] = INFINITY;
    expect_fail(db, &good, &gp, TARTAN_ENONFINITE, &before);
    q[LQ * DIM + 3 * DIM + 5] = 0.25f;
    float saved[DIM];
    memcpy(saved, q + 2 * DIM, sizeof saved);
    memset(q + 2 * DIM, 0, sizeof saved);
    expect_fail(db, &good, &gp, TARTAN_ERANGE, &before);
    memcpy(q + 2 * DIM, saved, sizeof saved);

    p = gp;
    p.k = 0;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p.k = (size_t)-1; /* a negative k through an int */
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    p.recall_target = 1.f;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    p.recall_target = NAN;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    p.centroid_score_threshold = NAN;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    p.threads = -2;
    expect_fail(db, &good, &p, TARTAN_ERANGE, &before);
    p = gp;
    const char *bad_ids[] = {"doc-1", ""};
    p.subset = bad_ids;
    p.n_subset = 2;
    expect_fail(db, &good, &p, TARTAN_EBADID, &before);
    const char *null_ids[] = {NULL};
    p.subset = null_ids;
    p.n_subset = 1;
    expect_fail(db, &good, &p, TARTAN_EBADID, &before);
    p.subset = NULL;
    expect_fail(db, &good, &p, TARTAN_EINVAL, &before);

    qs = good;
    qs.n_queries = 0;
    qs.n_rows = 0;
    expect_fail(db, &qs, &gp, TARTAN_EEMPTY, &before);
    qs = good;
    qs.qlen = 0;
    qs.n_rows = 0;
    expect_fail(db, &qs, &gp, TARTAN_EEMPTY, &before);
    size_t lens[2] = {LQ, 0};
    qs = good;
    qs.qlens = lens;
    qs.n_rows = LQ;
    expect_fail(db, &qs, &gp, TARTAN_EEMPTY, &before);
    qs = good;
    qs.n_rows = 2 * LQ - 1;
    expect_fail(db, &qs, &gp, TARTAN_EINVAL, &before);
    qs = good;
    qs.embeddings = NULL;
    expect_fail(db, &qs, &gp, TARTAN_EINVAL, &before);
    qs = good;
    qs.dtype = (tartan_dtype)7;
    expect_fail(db, &qs, &gp, TARTAN_EDTYPE, &before);
    qs = good;
    qs.qlen = 70000;
    qs.n_rows = 140000;
    expect_fail(db, &qs, &gp, TARTAN_ETOOBIG, &before);

    tartan_results *r = NULL;
    ck_assert_int_eq(tartan_search(db, NULL, &gp, &r), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_search(db, &good, &gp, NULL), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_search(NULL, &good, &gp, &r), TARTAN_EINVAL);
    /* And the good call still works: NULL params are the defaults for k = 10. */
    r = search_ok(db, &good, NULL);
    ck_assert_uint_eq(r->counts[0], 10);
    tartan_results_free(r);
    expect_info(db, &before);
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_readonly_handle)
{
    corpus c;
    tartan_db *db = build(&c, NDOC, 23);
    tartan_close(db);
    db = open_ix(TARTAN_READONLY, 0);
    size_t rows;
    float *q = make_queries(&c, 4, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 4, LQ);
    tartan_search_params p;
    tartan_search_params_init(&p, 10);
    p.threads = 2;
    tartan_results *r = search_ok(db, &qs, &p);
    size_t nref;
    ref_hit *ref = reference(db, q, LQ, &nref);
    /* A PLAID hit scores exactly. */
    ck_assert(fabs(r->hits[0].score - ref_find(ref, nref, r->hits[0].id)->score) < 1e-4);
    free(ref);
    tartan_results_free(r);
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_search_snapshot_during_writes)
{
    /* Searches between adds see each committed state whole: the exhaustive result count is
     * always one of the sizes the index had. */
    corpus c;
    corpus_make(&c, 300, 24);
    tartan_db *db = open_ix(TARTAN_CREATE, 32);
    add_docs(db, &c, 0, 100);
    size_t rows;
    float *q = make_queries(&c, 6, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 6, LQ);
    for (size_t round = 1; round <= 2; round++) {
        tartan_search_params p;
        tartan_search_params_init(&p, 1000);
        p.exhaustive = 1;
        p.threads = 3;
        tartan_results *r = search_ok(db, &qs, &p);
        for (size_t i = 0; i < 6; i++)
            ck_assert_uint_eq(r->counts[i], 100 * round);
        tartan_results_free(r);
        p.exhaustive = 0;
        r = search_ok(db, &qs, &p);
        for (size_t i = 0; i < 6; i++)
            ck_assert_uint_le(r->counts[i], 100 * round);
        tartan_results_free(r);
        add_docs(db, &c, 100 * round, 100);
    }
    free(q);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* Device selection: CUDA where none can be had is refused (TARTAN_ENODEV), never run on
 * the CPU instead; a bad TARTAN_DEVICE is refused; the CPU is always there. */
START_TEST(test_search_device_choice)
{
    corpus c;
    tartan_db *db = build(&c, 120, 31);
    size_t rows;
    float *q = make_queries(&c, 3, LQ, NULL, &rows);
    tartan_queries qs = fixed_queries(q, 3, LQ);
    tartan_search_params p;
    tartan_search_params_init(&p, 5);
    tartan_results *r = NULL;
    p.device = TARTAN_DEVICE_CUDA;
    if (kern_cuda_device_count() == 0) {
        ck_assert_int_eq(tartan_search(db, &qs, &p, &r), TARTAN_ENODEV);
        ck_assert_ptr_null(r);
        ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "CUDA"));
        setenv("TARTAN_DEVICE", "cuda", 1);
        p.device = TARTAN_DEVICE_AUTO;
        ck_assert_int_eq(tartan_search(db, &qs, &p, &r), TARTAN_ENODEV);
        /* AUTO without the variable runs on the CPU. */
        unsetenv("TARTAN_DEVICE");
        r = search_ok(db, &qs, &p);
        tartan_results_free(r);
    }
    setenv("TARTAN_DEVICE", "tpu", 1);
    p.device = TARTAN_DEVICE_AUTO;
    ck_assert_int_eq(tartan_search(db, &qs, &p, &r), TARTAN_EINVAL);
    ck_assert_ptr_nonnull(strstr(tartan_errmsg(db), "TARTAN_DEVICE"));
    unsetenv("TARTAN_DEVICE");
    p.device = (tartan_device)7;
    ck_assert_int_eq(tartan_search(db, &qs, &p, &r), TARTAN_EINVAL);
    p.device = TARTAN_DEVICE_CPU;
    setenv("TARTAN_DEVICE", "cuda", 1); /* an explicit device overrides the environment */
    r = search_ok(db, &qs, &p);
    ck_assert_uint_eq(r->counts[0], 5);
    tartan_results_free(r);
    unsetenv("TARTAN_DEVICE");
    /* Options: an unknown device or GPU mode does not open. */
    tartan_close(db);
    tartan_options o;
    tartan_options_init(&o);
    o.device = (tartan_device)9;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    tartan_options_init(&o);
    o.gpu_mode = (tartan_gpu_mode)5;
    ck_assert_int_eq(tartan_open(ixpath, &o, &db), TARTAN_EINVAL);
    free(q);
    corpus_free(&c);
}
END_TEST

static Suite *search_suite(void)
{
    Suite *s = suite_create("search");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"params_defaults", test_search_params_defaults},
        {"exhaustive_matches_bruteforce", test_search_exhaustive_matches_bruteforce},
        {"plaid_wide_equals_exhaustive", test_search_plaid_wide_equals_exhaustive},
        {"default_recall", test_search_default_recall},
        {"subset_only_allowed", test_search_subset_only_allowed},
        {"subset_small_exact", test_search_subset_small_exact},
        {"subset_empty", test_search_subset_empty},
        {"deleted_never_returned", test_search_deleted_never_returned},
        {"replaced_scored_once", test_search_replaced_scored_once},
        {"k_beyond_index", test_search_k_beyond_index},
        {"untrained_index", test_search_untrained_index},
        {"empty_index", test_search_empty_index},
        {"batch_fixed_f32", test_search_batch_fixed_f32},
        {"batch_ragged_f16", test_search_batch_ragged_f16},
        {"bad_arguments", test_search_bad_arguments},
        {"readonly_handle", test_search_readonly_handle},
        {"snapshot_during_writes", test_search_snapshot_during_writes},
        {"device_choice", test_search_device_choice},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(search_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
