/*
 * check_tools_eval.c: `tartan eval`'s library: qrels and TREC runs read, every measure
 * against hand-computed values, trec_eval's tie order, random runs against a plain reference,
 * measure lists, bad files refused; runs written and read back.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "evaluate.h"
#include "fixture.h"
#include "idlist.h"
#include "jsonl.h"
#include "kernels.h"
#include "metrics.h"
#include "npy.h"
#include "qrels.h"
#include "synth.h"
#include "tartan.h"
#include "trec_run.h"

/* ---- evaluation ----------------------------------------------------------------------------- */

/* Evaluates qrels text against run text with the measures in spec; returns the result. */
static void eval_texts(const char *qtext, const char *rtext, const char *spec, long level,
                       int complete, tool_qrels *q, tool_run *r, tool_measure **m, size_t *nm,
                       tool_eval *e)
{
    char err[512];
    fx_write_text(fx_path("qrels"), qtext);
    fx_write_text(fx_path("run"), rtext);
    ck_assert_msg(tool_qrels_read(q, fx_path("qrels"), err, sizeof err) == 0, "%s", err);
    ck_assert_msg(tool_run_read(r, fx_path("run"), err, sizeof err) == 0, "%s", err);
    ck_assert_msg(tool_measures_parse(spec, m, nm, err, sizeof err) == 0, "%s", err);
    tool_eval_opts o = {.level = level, .complete = complete};
    memset(e, 0xFF, sizeof *e);
    ck_assert_msg(tool_evaluate(q, r, *m, *nm, &o, e, err, sizeof err) == 0, "%s", err);
}

static double value_of(const tool_eval *e, const tool_measure *m, const char *qid, const char *name)
{
    size_t mi = 0;
    while (mi < e->nm && strcmp(m[mi].name, name))
        mi++;
    ck_assert_msg(mi < e->nm, "no measure %s", name);
    if (!qid)
        return e->mean[mi];
    for (size_t q = 0; q < e->nq; q++)
        if (!strcmp(e->qids[q], qid))
            return e->values[q * e->nm + mi];
    ck_abort_msg("query %s not scored", qid);
    return 0;
}

#define TOL 1e-12

/*
 * Query q1, judged (BEIR TSV, CRLF): d1 2, d2 1, d3 0, d4 1, d5 3 (d5 never retrieved).
 * Run: d1 0.9, d2 0.5, d3 0.5, dx 0.7, d4 0.1, ranks given in a misleading order.
 * trec_eval's order: d1 (0.9), dx (0.7), then the 0.5 tie by docid descending: d3, d2; then
 * d4. Relevance by rank: 2, unjudged, 0, 1, 1. Relevant (>= 1): d1, d2, d4, d5: 4.
 *   P_5 = 3/5; P_1 = 1; P_10 = 3/10 (a short list still divides by 10).
 *   recall_3 = 1/4; recall_5 = 3/4.
 *   map = (1/1 + 2/4 + 3/5) / 4 = 0.525; map_cut_4 = (1/1 + 2/4) / 4 = 0.375.
 *   recip_rank = 1.
 *   ndcg_cut_5: DCG = 2/log2(2) + 1/log2(5) + 1/log2(6); ideal gains 3, 2, 1, 1:
 *     IDCG = 3 + 2/log2(3) + 1/log2(4) + 1/log2(5).
 *   ndcg_cut_3: DCG = 2; IDCG = 3 + 2/log2(3) + 1/log2(4).
 * Query q2: judged, nothing relevant (d7 0): every measure 0, and it counts in the means.
 * Query q3: retrieved, never judged: not scored. Query q4: judged, never retrieved: scored
 * only with complete, as 0.
 */
static const char hand_qrels[] = "query-id\tcorpus-id\tscore\r\n"
                                 "q1\td1\t2\r\nq1\td2\t1\r\nq1\td3\t0\r\nq1\td4\t1\r\n"
                                 "q1\td5\t3\r\nq2\td7\t0\r\nq4\td1\t1\r\n";
static const char hand_run[] = "q1 Q0 d1 5 0.9 t\nq1 Q0 d2 1 0.5 t\nq1 Q0 d3 2 0.5 t\n"
                               "q1 Q0 dx 3 0.7 t\nq1 Q0 d4 4 0.1 t\n"
                               "q2 Q0 d7 1 3 t\nq2 Q0 d8 2 2 t\nq3 Q0 d1 1 1 t\n";
static const char hand_spec[] = "P.1,5,10,recall.3,5,map,map_cut.4,recip_rank,ndcg_cut.3,5";

START_TEST(test_tools_eval_hand_computed)
{
    tool_qrels q;
    tool_run r;
    tool_measure *m;
    size_t nm;
    tool_eval e;
    eval_texts(hand_qrels, hand_run, hand_spec, 1, 0, &q, &r, &m, &nm, &e);
    ck_assert_int_eq(q.format, TOOL_QRELS_BEIR);
    ck_assert_uint_eq(nm, 10);
    ck_assert_uint_eq(e.nq, 2);
    ck_assert_uint_eq(e.num_q, 2);
    ck_assert_uint_eq(e.run_only, 1);
    ck_assert_uint_eq(e.qrels_only, 1);
    ck_assert_str_eq(e.qids[0], "q1");
    ck_assert_str_eq(e.qids[1], "q2");
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "P_1"), 1.0, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "P_5"), 3.0 / 5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "P_10"), 3.0 / 10, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recall_3"), 1.0 / 4, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recall_5"), 3.0 / 4, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "map"), (1.0 + 2.0 / 4 + 3.0 / 5) / 4, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "map_cut_4"), (1.0 + 2.0 / 4) / 4, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recip_rank"), 1.0, TOL);
    double dcg5 = 2.0 + 1.0 / log2(5.0) + 1.0 / log2(6.0);
    double idcg5 = 3.0 + 2.0 / log2(3.0) + 1.0 / 2 + 1.0 / log2(5.0);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "ndcg_cut_5"), dcg5 / idcg5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "ndcg_cut_3"),
                            2.0 / (3.0 + 2.0 / log2(3.0) + 0.5), TOL);
    for (size_t i = 0; i < nm; i++) {
        ck_assert_double_eq_tol(e.values[1 * nm + i], 0.0, TOL);
        ck_assert_double_eq_tol(e.mean[i], e.values[i] / 2, TOL);
    }
    tool_eval_free(&e);
    free(m);

    /* Complete: q4 joins the means as zeros. */
    tool_measure *m2;
    size_t nm2;
    char err[512];
    ck_assert_int_eq(tool_measures_parse("P.5", &m2, &nm2, err, sizeof err), 0);
    tool_eval_opts o = {.level = 1, .complete = 1};
    ck_assert_int_eq(tool_evaluate(&q, &r, m2, nm2, &o, &e, err, sizeof err), 0);
    ck_assert_uint_eq(e.num_q, 3);
    ck_assert_double_eq_tol(e.mean[0], (3.0 / 5) / 3, TOL);
    tool_eval_free(&e);
    free(m2);
    tool_run_free(&r);
    tool_qrels_free(&q);
}
END_TEST

/*
 * Relevance level 2 on the same data (TREC qrels this time): relevant are d1 (2) and d5 (3).
 *   P_5 = 1/5; recall_5 = 1/2; map = (1/1) / 2; recip_rank = 1.
 *   nDCG's gains and ideal do not depend on the level: ndcg_cut_5 as before.
 */
START_TEST(test_tools_eval_relevance_level)
{
    static const char trec_qrels[] = "q1 0 d1 2\nq1 0 d2 1\nq1 0 d3 0\nq1 0 d4 1\nq1 0 d5 3\n"
                                     "q2 0 d7 0\nq4 0 d1 1\n";
    tool_qrels q;
    tool_run r;
    tool_measure *m;
    size_t nm;
    tool_eval e;
    eval_texts(trec_qrels, hand_run, hand_spec, 2, 0, &q, &r, &m, &nm, &e);
    ck_assert_int_eq(q.format, TOOL_QRELS_TREC);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "P_5"), 1.0 / 5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recall_5"), 1.0 / 2, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "map"), 1.0 / 2, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "recip_rank"), 1.0, TOL);
    double dcg5 = 2.0 + 1.0 / log2(5.0) + 1.0 / log2(6.0);
    double idcg5 = 3.0 + 2.0 / log2(3.0) + 1.0 / 2 + 1.0 / log2(5.0);
    ck_assert_double_eq_tol(value_of(&e, m, "q1", "ndcg_cut_5"), dcg5 / idcg5, TOL);
    tool_eval_free(&e);
    free(m);
    tool_run_free(&r);
    tool_qrels_free(&q);
}
END_TEST

/*
 * Ties go to the greater docid in byte order, whatever the rank column says: "d9" > "d10"
 * (since '9' > '1'), so with equal scores d9 ranks first. Only d10 is relevant: recip_rank
 * = 1/2 (it would be 1 with ascending ties or with the rank column), recip_rank_1 = 0,
 * recip_rank_2 = 1/2. Negative scores sort below zero, and "1e-1" is read as 0.1.
 * Query b: the relevant z is third: recip_rank = 1/3, recip_rank_2 = 0, ndcg_cut_2 = 0,
 * ndcg_cut_3 = (1/log2(4)) / 1 = 1/2.
 */
START_TEST(test_tools_eval_ties_by_docid_descending)
{
    static const char qrels[] = "a 0 d10 1\na 0 d9 0\nb 0 z 1\n";
    static const char run[] = "a Q0 d10 1 0.5 t\r\na Q0 d9 2 0.5 t\r\na Q0 e 3 -1 t\r\n"
                              "b Q0 z 1 -0.5 t\r\nb Q0 y 2 1e-1 t\r\nb Q0 x 3 0 t\r\n";
    tool_qrels q;
    tool_run r;
    tool_measure *m;
    size_t nm;
    tool_eval e;
    eval_texts(qrels, run, "mrr,mrr@1,mrr@2,ndcg@2,ndcg@3", 1, 0, &q, &r, &m, &nm, &e);
    ck_assert_double_eq_tol(value_of(&e, m, "a", "recip_rank"), 0.5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "a", "recip_rank_1"), 0.0, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "a", "recip_rank_2"), 0.5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "b", "recip_rank"), 1.0 / 3, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "b", "recip_rank_2"), 0.0, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "b", "ndcg_cut_2"), 0.0, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, "b", "ndcg_cut_3"), 0.5, TOL);
    ck_assert_double_eq_tol(value_of(&e, m, NULL, "recip_rank"), (0.5 + 1.0 / 3) / 2, TOL);
    tool_eval_free(&e);
    free(m);
    tool_run_free(&r);
    tool_qrels_free(&q);
}
END_TEST

/* A plain reference for random rankings: documents picked best-first by repeated scans, and
 * every measure from its textbook definition in double precision. */
static double ref_measure(const char *name, const long *rel, size_t n, const long *judged,
                          size_t nj, long level)
{
    size_t num_rel = 0;
    for (size_t i = 0; i < nj; i++)
        num_rel += judged[i] >= level;
    long k = 0;
    const char *us = strrchr(name, '_');
    if (us && us[1] >= '0' && us[1] <= '9')
        k = atol(us + 1);
    size_t lim = k && (size_t)k < n ? (size_t)k : n;
    if (!strncmp(name, "P_", 2)) {
        double c = 0;
        for (size_t i = 0; i < lim; i++)
            c += rel[i] >= level;
        return c / (double)k;
    }
    if (!strncmp(name, "recall_", 7)) {
        double c = 0;
        for (size_t i = 0; i < lim; i++)
            c += rel[i] >= level;
        return num_rel ? c / (double)num_rel : 0;
    }
    if (!strncmp(name, "map", 3)) {
        double s = 0, c = 0;
        for (size_t i = 0; i < lim; i++)
            if (rel[i] >= level)
                s += ++c / (double)(i + 1);
        return num_rel ? s / (double)num_rel : 0;
    }
    if (!strncmp(name, "recip_rank", 10)) {
        for (size_t i = 0; i < lim; i++)
            if (rel[i] >= level)
                return 1.0 / (double)(i + 1);
        return 0;
    }
    /* ndcg: the ideal ranking by selection from the judged gains. */
    long *g = malloc((nj + 1) * sizeof *g);
    size_t ng = 0;
    for (size_t i = 0; i < nj; i++)
        if (judged[i] > 0)
            g[ng++] = judged[i];
    double dcg = 0, idcg = 0;
    for (size_t i = 0; i < lim; i++)
        if (rel[i] > 0)
            dcg += (double)rel[i] / (log(i + 2.0) / log(2.0));
    size_t ilim = k && (size_t)k < ng ? (size_t)k : ng;
    for (size_t i = 0; i < ilim; i++) {
        size_t best = i;
        for (size_t j = i + 1; j < ng; j++)
            if (g[j] > g[best])
                best = j;
        long t = g[i];
        g[i] = g[best];
        g[best] = t;
        idcg += (double)g[i] / (log(i + 2.0) / log(2.0));
    }
    free(g);
    return idcg > 0 ? dcg / idcg : 0;
}

START_TEST(test_tools_eval_random_vs_reference)
{
    rng_init_random();
    char err[512];
    const char *spec = "P.1,3,10,recall.2,10,map,map_cut.5,recip_rank,recip_rank.3,ndcg,"
                       "ndcg_cut.1,5,20";
    tool_measure *m;
    size_t nm;
    ck_assert_int_eq(tool_measures_parse(spec, &m, &nm, err, sizeof err), 0);
    for (int trial = 0; trial < 40; trial++) {
        long level = 1 + (long)rnd_below(2);
        size_t ndocs = 1 + rnd_below(40);
        /* Documents d0..d(ndocs-1); each judged or not, each retrieved or not. */
        FILE *qf = fopen(fx_path("rq"), "w"), *rf = fopen(fx_path("rr"), "w");
        long judged[64], jrel[64];
        double score[64];
        int retrieved[64], nj = 0;
        for (size_t d = 0; d < ndocs; d++) {
            judged[d] = rnd_below(3) != 0;
            jrel[d] = (long)rnd_below(5) - 1;
            retrieved[d] = rnd_below(4) != 0;
            score[d] = (double)rnd_below(6) / 4; /* ties */
            if (judged[d]) {
                fprintf(qf, "q 0 d%zu %ld\n", d, jrel[d]);
                nj++;
            }
            if (retrieved[d])
                fprintf(rf, "q Q0 d%zu 0 %.17g run\n", d, score[d]);
        }
        fprintf(qf, "q 0 never-retrieved 1\n");
        fprintf(rf, "q Q0 sentinel 0 -100 run\n");
        fclose(qf);
        fclose(rf);
        tool_qrels q;
        tool_run r;
        ck_assert_msg(tool_qrels_read(&q, fx_path("rq"), err, sizeof err) == 0, "%s", err);
        ck_assert_msg(tool_run_read(&r, fx_path("rr"), err, sizeof err) == 0, "%s", err);
        tool_eval e;
        tool_eval_opts o = {.level = level};
        ck_assert_msg(tool_evaluate(&q, &r, m, nm, &o, &e, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_eq(e.nq, 1);

        /* The reference ranking: best score first, ties to the greater name. */
        long rel[66], all_judged[66];
        size_t n = 0, nall = 0;
        int used[64] = {0};
        for (;;) {
            int best = -1;
            char bn[32], cn[32];
            for (size_t d = 0; d < ndocs; d++) {
                if (!retrieved[d] || used[d])
                    continue;
                snprintf(cn, sizeof cn, "d%zu", d);
                if (best < 0 || score[d] > score[best] ||
                    (score[d] == score[best] && strcmp(cn, bn) > 0)) {
                    best = (int)d;
                    strcpy(bn, cn);
                }
            }
            if (best < 0)
                break;
            used[best] = 1;
            rel[n++] = judged[best] ? jrel[best] : TOOL_REL_UNJUDGED;
        }
        rel[n++] = TOOL_REL_UNJUDGED; /* the sentinel, last */
        for (size_t d = 0; d < ndocs; d++)
            if (judged[d])
                all_judged[nall++] = jrel[d];
        all_judged[nall++] = 1;
        for (size_t i = 0; i < nm; i++) {
            double want = ref_measure(m[i].name, rel, n, all_judged, nall, level);
            ck_assert_msg(fabs(e.values[i] - want) < 1e-12, "%s: %.17g, reference %.17g", m[i].name,
                          e.values[i], want);
        }
        tool_eval_free(&e);
        tool_run_free(&r);
        tool_qrels_free(&q);
    }
    free(m);
}
END_TEST

START_TEST(test_tools_eval_measure_lists)
{
    char err[512];
    tool_measure *m;
    size_t n;
    ck_assert_int_eq(tool_measures_parse("ndcg_cut.10,recall.100,map,recip_rank.10,P.10", &m, &n,
                                         err, sizeof err),
                     0);
    const char *want[] = {"ndcg_cut_10", "recall_100", "map", "recip_rank_10", "P_10"};
    ck_assert_uint_eq(n, 5);
    for (size_t i = 0; i < n; i++)
        ck_assert_str_eq(m[i].name, want[i]);
    free(m);
    ck_assert_int_eq(tool_measures_parse(" nDCG@10, MRR@10 ,Recall@100,p@5,map@100,mrr,ndcg,"
                                         "P.5,10,ndcg_cut.10",
                                         &m, &n, err, sizeof err),
                     0);
    const char *want2[] = {"ndcg_cut_10", "recip_rank_10", "recall_100", "P_5",
                           "map_cut_100", "recip_rank",    "ndcg",       "P_10"};
    ck_assert_uint_eq(n, 8); /* P.5 and ndcg_cut.10 repeat earlier ones */
    for (size_t i = 0; i < n; i++)
        ck_assert_str_eq(m[i].name, want2[i]);
    ck_assert_int_eq(m[0].kind, TOOL_M_NDCG);
    ck_assert_int_eq(m[0].k, 10);
    free(m);
    struct {
        const char *spec, *phrase;
    } bad[] = {
        {"bleu", "unknown measure 'bleu'"},
        {"P", "needs a cutoff"},
        {"recall", "needs a cutoff"},
        {"ndcg_cut.0", "positive whole cutoff"},
        {"P.x", "positive whole cutoff"},
        {"10", "not a measure"},
        {"map,5", "not a measure"},
        {"", "no measure"},
        {"ndcg@-3", "positive"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = (tool_measure *)1;
        int rc = tool_measures_parse(bad[i].spec, &m, &n, err, sizeof err);
        ck_assert_msg(rc == TARTAN_EINVAL, "'%s' accepted", bad[i].spec);
        ck_assert_msg(strstr(err, bad[i].phrase) != NULL, "'%s': message '%s'", bad[i].spec, err);
        ck_assert_ptr_null(m);
    }
}
END_TEST

static void expect_qrels_error(const char *text, int code, const char *phrase)
{
    char err[512] = "";
    tool_qrels q;
    fx_write_text(fx_path("bad_qrels"), text);
    int rc = tool_qrels_read(&q, fx_path("bad_qrels"), err, sizeof err);
    ck_assert_msg(rc == code, "got %d (%s), want %d", rc, err, code);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_ptr_null(q.q);
}

static void expect_run_error(const char *text, int code, const char *phrase)
{
    char err[512] = "";
    tool_run r;
    fx_write_text(fx_path("bad_run"), text);
    int rc = tool_run_read(&r, fx_path("bad_run"), err, sizeof err);
    ck_assert_msg(rc == code, "got %d (%s), want %d", rc, err, code);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_ptr_null(r.q);
}

START_TEST(test_tools_eval_rejects_bad_files)
{
    expect_qrels_error("q1 d1\n", TARTAN_EFORMAT, "bad_qrels:1: 2 fields");
    expect_qrels_error("q1 0 d1 1\nq1 d2 1\n", TARTAN_EFORMAT, "bad_qrels:2: 3 fields");
    expect_qrels_error("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\tx\n", TARTAN_EFORMAT,
                       "bad_qrels:3: relevance 'x' is not an integer");
    expect_qrels_error("q1 0 d1 1.5\n", TARTAN_EFORMAT, "relevance '1.5'");
    expect_qrels_error("q1\td1\t1\nq2\td1\t1\r\n\nq1\td1\t2\n", TARTAN_EDUPID,
                       "bad_qrels:4: document 'd1' judged again for query 'q1' (first on line 1)");
    expect_qrels_error("query-id\tcorpus-id\tscore\n\n# nothing\n", TARTAN_EEMPTY, "no judgments");
    expect_qrels_error("a 0 d 1 extra\n", TARTAN_EFORMAT, "5 fields");

    expect_run_error("q Q0 d 1 0.5\n", TARTAN_EFORMAT, "bad_run:1: 5 fields");
    expect_run_error("q Q0 d 1 0.5 t x\n", TARTAN_EFORMAT, "more than 6 fields");
    expect_run_error("q Q0 d 1 0.5 t\nq Q0 e 2 high t\n", TARTAN_EFORMAT,
                     "bad_run:2: score 'high' is not a number");
    expect_run_error("q Q0 d 1 nan t\n", TARTAN_EFORMAT, "score 'nan'");
    expect_run_error("q Q0 d 1 0.5 t\nr Q0 d 1 0.5 t\nq Q0 d 2 0.1 t\n", TARTAN_EDUPID,
                     "bad_run:3: document 'd' retrieved again for query 'q' (first on line 1)");
    expect_run_error("\n\n", TARTAN_EEMPTY, "no results");

    /* No query in both files. */
    char err[512];
    tool_qrels q;
    tool_run r;
    fx_write_text(fx_path("q"), "a 0 d 1\n");
    fx_write_text(fx_path("r"), "b Q0 d 1 1 t\n");
    ck_assert_int_eq(tool_qrels_read(&q, fx_path("q"), err, sizeof err), 0);
    ck_assert_int_eq(tool_run_read(&r, fx_path("r"), err, sizeof err), 0);
    tool_measure m = {.kind = TOOL_M_P, .k = 1, .name = "P_1"};
    tool_eval e;
    ck_assert_int_eq(tool_evaluate(&q, &r, &m, 1, NULL, &e, err, sizeof err), TARTAN_EEMPTY);
    ck_assert_ptr_nonnull(strstr(err, "no query has both"));
    ck_assert_int_eq(tool_evaluate(&q, &r, &m, 0, NULL, &e, err, sizeof err), TARTAN_EINVAL);
    tool_run_free(&r);
    tool_qrels_free(&q);
}
END_TEST

/* What tool_run_write writes reads back to the same scores, and trec_eval's order of it is
 * the order given wherever scores differ. */
START_TEST(test_tools_run_write_reads_back)
{
    rng_init_random();
    char err[512];
    const char *p = fx_path("out.run");
    FILE *f = fopen(p, "w");
    enum { N = 300 };
    char names[N][16];
    const char *ids[N];
    double scores[N];
    float s = 50.0f;
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "doc%d", (int)rnd_below(1000000) * N + i);
        ids[i] = names[i];
        /* Descending float32 scores, some only one ulp apart, some as double. */
        s = rnd_below(3) ? nextafterf(s, -1e30f) : s - (float)rnd_below(1000) / 7.0f;
        scores[i] = i % 5 == 0 ? (double)s - 1e-13 * (double)i : (double)s;
    }
    ck_assert_int_eq(tool_run_write(f, "query-1", ids, scores, N, "tartan"), 0);
    ck_assert_int_eq(fclose(f), 0);
    tool_run r;
    ck_assert_msg(tool_run_read(&r, p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.qids.n, 1);
    ck_assert_uint_eq(r.q[0].n, N);
    for (int i = 0; i < N; i++) {
        const tool_run_doc *d = &r.q[0].d[i];
        ck_assert_str_eq(r.docids.keys[d->doc], ids[i]);
        /* float32 scores come back as the same float, others as the same double. */
        if ((double)(float)scores[i] == scores[i])
            ck_assert_msg((float)d->score == (float)scores[i], "score %d: %.9g read as %.9g", i,
                          scores[i], d->score);
        else
            ck_assert_msg(d->score == scores[i], "score %d: %.17g read as %.17g", i, scores[i],
                          d->score);
        /* Order kept: strictly lower stays strictly lower, equal stays equal. */
        if (i > 0 && scores[i] < scores[i - 1])
            ck_assert(d->score < r.q[0].d[i - 1].score);
        if (i > 0 && scores[i] == scores[i - 1])
            ck_assert(d->score == r.q[0].d[i - 1].score);
    }
    tool_run_free(&r);

    /* A float32 whose shortest digits ("0.1") read back below a double just under it. */
    const char *pair_ids[] = {"f", "d"};
    double pair[] = {(double)0.1f, 0.1000000005};
    f = fopen(p, "w");
    ck_assert_int_eq(tool_run_write(f, "q", pair_ids, pair, 2, "t"), 0);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_msg(tool_run_read(&r, p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(r.q[0].n, 2);
    ck_assert((float)r.q[0].d[0].score == 0.1f);
    ck_assert(r.q[0].d[1].score == pair[1]);
    ck_assert(r.q[0].d[0].score > r.q[0].d[1].score);
    tool_run_free(&r);

    f = fopen(p, "w");
    const char *bad_ids[] = {"a b"};
    double one = 1.0, nan_score = NAN;
    const char *good_ids[] = {"a"};
    ck_assert_int_eq(tool_run_write(f, "q", bad_ids, &one, 1, "t"), TARTAN_EBADID);
    ck_assert_int_eq(tool_run_write(f, "", good_ids, &one, 1, "t"), TARTAN_EBADID);
    ck_assert_int_eq(tool_run_write(f, "q", good_ids, &one, 1, "t t"), TARTAN_EBADID);
    ck_assert_int_eq(tool_run_write(f, "q", good_ids, &nan_score, 1, "t"), TARTAN_ENONFINITE);
    ck_assert_int_eq(ftell(f), 0); /* nothing written for a refused query */
    fclose(f);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"eval_hand_computed", test_tools_eval_hand_computed, 0},
        {"eval_level", test_tools_eval_relevance_level, 0},
        {"eval_ties", test_tools_eval_ties_by_docid_descending, 0},
        {"eval_reference", test_tools_eval_random_vs_reference, 0},
        {"eval_measure_lists", test_tools_eval_measure_lists, 0},
        {"eval_bad_files", test_tools_eval_rejects_bad_files, 0},
        {"run_write", test_tools_run_write_reads_back, 0},
    };
    return FX_RUN("tools-eval", cases, FX_DIR, 60);
}
