/*
 * check_tools_synth.c: the synthetic corpus generator (synth.h, `tartan gen`): the same files
 * whatever the thread count, queries and qrels, fp16 rounding, document lengths, the statistics
 * of the v3 model, bad parameters refused without leaving files.
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

/* ---- the synthetic corpus generator (synth.h, tartan gen) -------------------------------- */

/* Random but small generator parameters: any model, any dimension, short documents. */
static void synth_random_params(tool_synth_params *p)
{
    tool_synth_params_init(p);
    tool_synth_params_model(p, TOOL_SYNTH_V1 + (int)rnd_below(3));
    static const size_t dims[] = {8, 33, 64, 128, 200};
    p->dim = dims[rnd_below(sizeof dims / sizeof dims[0])];
    p->n_docs = 20 + rnd_below(150);
    p->n_queries = 1 + rnd_below(20);
    p->len_mean = 4 + rnd_below(60);
    p->len_min = p->len_mean < 8 ? p->len_mean : 8;
    p->qlen = 1 + rnd_below(40);
    p->seed = rnd();
    if (p->model != TOOL_SYNTH_V1) {
        p->group_docs = rnd_below(40);
        p->query_content = (float)rnd_below(11) / 10.f;
    }
}

/* The tokens of a .npy row as doubles (float32 or float16). */
static double npy_elem(const tool_npy *a, size_t i)
{
    if (a->dtype == TOOL_F16)
        return kern_f16_to_f32(((const uint16_t *)a->data)[i]);
    return ((const float *)a->data)[i];
}

static void gen_dir(const char *name, const tool_synth_params *p, tool_dtype dt, int threads,
                    size_t *tokens)
{
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    (void)threads;
#endif
    const char *dir = fx_path(name);
    ck_assert_int_eq(mkdir(dir, 0777), 0);
    tool_synth *s = NULL;
    ck_assert_int_eq(tool_synth_new(p, &s), 0);
    char err[4200];
    int rc = tool_synth_write(s, p, dir, dt, tokens, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    tool_synth_free(s);
}

static int files_equal(const char *a, const char *b)
{
    size_t la, lb;
    unsigned char *x = fx_read_file(a, &la), *y = fx_read_file(b, &lb);
    int eq = la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return eq;
}

/* The same files whatever the thread count, and the files hold what tool_synth_doc makes. */
START_TEST(test_tools_synth_deterministic_any_threads)
{
    rng_init_random();
    for (int round = 0; round < 4; round++) {
        tool_synth_params p;
        synth_random_params(&p);
        tool_dtype dt = rnd_below(2) ? TOOL_F16 : TOOL_F32;
        char a[32], b[32];
        snprintf(a, sizeof a, "one%d", round);
        snprintf(b, sizeof b, "many%d", round);
        size_t ta, tb;
        gen_dir(a, &p, dt, 1, &ta);
        gen_dir(b, &p, dt, 3, &tb);
        ck_assert_uint_eq(ta, tb);
        static const char *files[] = {"embeddings.npy", "doclens.npy",   "ids.txt",
                                      "queries.npy",    "query_ids.txt", "qrels.tsv"};
        for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
            char pa[600], pb[600];
            snprintf(pa, sizeof pa, "%s/%s/%s", tmpdir, a, files[f]);
            snprintf(pb, sizeof pb, "%s/%s/%s", tmpdir, b, files[f]);
            ck_assert_msg(files_equal(pa, pb), "%s differs between 1 and 3 threads", files[f]);
        }
        /* Every document's rows against tool_synth_doc (exact for float32, the nearest
         * float16 otherwise), unit norm. */
        char path[600], err[512];
        snprintf(path, sizeof path, "%s/%s/embeddings.npy", tmpdir, a);
        tool_npy e, l;
        ck_assert_int_eq(tool_npy_open(&e, path, TOOL_DT(dt), 2, 2, err, sizeof err), 0);
        snprintf(path, sizeof path, "%s/%s/doclens.npy", tmpdir, a);
        ck_assert_int_eq(tool_npy_open(&l, path, TOOL_DT(TOOL_I32), 1, 1, err, sizeof err), 0);
        ck_assert_uint_eq(e.shape[0], ta);
        ck_assert_uint_eq(e.shape[1], p.dim);
        ck_assert_uint_eq(l.shape[0], p.n_docs);
        tool_synth *s = NULL;
        ck_assert_int_eq(tool_synth_new(&p, &s), 0);
        size_t row = 0;
        for (size_t i = 0; i < p.n_docs; i++) {
            size_t n = tool_synth_doclen(s, i);
            ck_assert_int_eq(((const int32_t *)l.data)[i], (int32_t)n);
            ck_assert_uint_ge(n, p.len_min);
            float *x = malloc(n * p.dim * sizeof(float));
            for (size_t k = 0; k < n * p.dim; k++)
                x[k] = NAN;
            tool_synth_doc(s, i, x);
            for (size_t t = 0; t < n; t++) {
                double norm = 0;
                for (size_t k = 0; k < p.dim; k++) {
                    float want = x[t * p.dim + k];
                    double got = npy_elem(&e, (row + t) * p.dim + k);
                    if (dt == TOOL_F16)
                        want = kern_f16_to_f32(tool_f32_to_f16(want));
                    ck_assert_msg(got == want, "doc %zu token %zu [%zu]: %g, want %g", i, t, k, got,
                                  (double)want);
                    norm += got * got;
                }
                ck_assert_double_eq_tol(sqrt(norm), 1.0, dt == TOOL_F16 ? 2e-3 : 1e-5);
            }
            row += n;
            free(x);
        }
        ck_assert_uint_eq(row, ta);
        tool_synth_free(s);
        tool_npy_close(&e);
        tool_npy_close(&l);
    }
#ifdef _OPENMP
    omp_set_num_threads(omp_get_num_procs());
#endif
}
END_TEST

/* qrels.tsv names, for each query, the document tool_synth_query built it from; the query
 * file holds those queries; ids and query ids match. */
START_TEST(test_tools_synth_queries_and_qrels)
{
    rng_init_random();
    tool_synth_params p;
    synth_random_params(&p);
    tool_dtype dt = rnd_below(2) ? TOOL_F16 : TOOL_F32;
    size_t T;
    gen_dir("g", &p, dt, 2, &T);
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/g/queries.npy", tmpdir);
    tool_npy q;
    ck_assert_int_eq(tool_npy_open(&q, path, TOOL_DT(dt), 3, 3, err, sizeof err), 0);
    ck_assert_uint_eq(q.shape[0], p.n_queries);
    ck_assert_uint_eq(q.shape[1], p.qlen);
    ck_assert_uint_eq(q.shape[2], p.dim);
    tool_synth *s = NULL;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    snprintf(path, sizeof path, "%s/g/qrels.tsv", tmpdir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f)); /* header */
    float *x = malloc(p.qlen * p.dim * sizeof(float));
    for (size_t j = 0; j < p.n_queries; j++) {
        size_t qj, dj;
        ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
        ck_assert_int_eq(sscanf(line, "q%zu\tdoc%zu\t1", &qj, &dj), 2);
        size_t rel = (size_t)-1;
        for (size_t k = 0; k < p.qlen * p.dim; k++)
            x[k] = NAN;
        tool_synth_query(s, j, x, &rel);
        ck_assert_uint_eq(qj, j);
        ck_assert_uint_eq(dj, rel);
        ck_assert_uint_lt(rel, p.n_docs);
        for (size_t k = 0; k < p.qlen * p.dim; k++) {
            float want = dt == TOOL_F16 ? kern_f16_to_f32(tool_f32_to_f16(x[k])) : x[k];
            ck_assert(npy_elem(&q, j * p.qlen * p.dim + k) == want);
        }
    }
    ck_assert_ptr_null(fgets(line, sizeof line, f));
    fclose(f);
    free(x);
    /* ids.txt: doc0 .. doc{N-1}; query_ids.txt: q0 .. q{Q-1}. */
    tool_idlist ids;
    snprintf(path, sizeof path, "%s/g/ids.txt", tmpdir);
    ck_assert_int_eq(tool_idlist_read(&ids, path, err, sizeof err), 0);
    ck_assert_uint_eq(ids.n, p.n_docs);
    for (size_t i = 0; i < p.n_docs; i++) {
        char want[32];
        snprintf(want, sizeof want, "doc%zu", i);
        ck_assert_str_eq(ids.ids[i], want);
    }
    tool_idlist_free(&ids);
    tool_synth_free(s);
    tool_npy_close(&q);
}
END_TEST

/* tool_f32_to_f16 picks the nearest half (ties to even) of random floats of every range. */
START_TEST(test_tools_synth_f16_rounding)
{
    rng_init_random();
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)rnd();
        /* Mostly finite values in and around half's range, some of everything. */
        if (i % 4)
            bits = (bits & 0x807fffffu) | ((uint32_t)(100 + rnd_below(50)) << 23);
        float f;
        memcpy(&f, &bits, sizeof f);
        uint16_t h = tool_f32_to_f16(f);
        if (isnan(f)) {
            ck_assert(isnan(kern_f16_to_f32(h)));
            continue;
        }
        double got = kern_f16_to_f32(h), x = f;
        ck_assert_msg(signbit(got) == signbit(x), "%a -> %a: sign", x, got);
        if (fabs(x) >= 65520.0) {
            ck_assert(isinf(got));
            continue;
        }
        /* Neither neighbouring half is nearer; at a tie the chosen one is even. */
        uint16_t mag = h & 0x7fffu;
        for (int dlt = -1; dlt <= 1; dlt += 2) {
            int m = (int)mag + dlt;
            if (m < 0 || m >= 0x7c00)
                continue;
            double other = kern_f16_to_f32((uint16_t)((h & 0x8000u) | (unsigned)m));
            double de = fabs(got - x), dn = fabs(other - x);
            ck_assert_msg(de < dn || (de == dn && (mag & 1u) == 0), "%a -> %a, %a nearer", x, got,
                          other);
        }
    }
}
END_TEST

/* Mean document length near --doc-len (log-normal, clipped); --fixed-len exact. */
START_TEST(test_tools_synth_doc_lengths)
{
    rng_init_random();
    tool_synth_params p;
    tool_synth_params_init(&p);
    p.n_docs = 4000;
    p.len_mean = 20 + rnd_below(1100);
    p.seed = rnd();
    tool_synth *s = NULL;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    double sum = 0;
    for (size_t i = 0; i < p.n_docs; i++) {
        size_t n = tool_synth_doclen(s, i);
        ck_assert_uint_ge(n, p.len_min);
        ck_assert_uint_le(n, 4 * p.len_mean);
        sum += (double)n;
    }
    /* sigma 0.5 log-normal: the mean of 4000 is within 3% of len_mean (5 standard errors). */
    ck_assert_double_eq_tol(sum / (double)p.n_docs, (double)p.len_mean, 0.03 * (double)p.len_mean);
    tool_synth_free(s);
    p.len_min = p.len_max = p.len_mean;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    for (size_t i = 0; i < 100; i++)
        ck_assert_uint_eq(tool_synth_doclen(s, i), p.len_mean);
    tool_synth_free(s);
}
END_TEST

/* Model V3 has the statistics it promises, unlike V2 on the same seed: random tokens of
 * different documents share the mean direction (cosine near aniso_mean^2 = 0.36, V2 near 0),
 * and consecutive tokens are often near-duplicates (run_prob). */
START_TEST(test_tools_synth_v3_statistics)
{
    rng_init_random();
    double cross[2] = {0, 0}, near_dup[2] = {0, 0};
    for (int m = 0; m < 2; m++) {
        tool_synth_params p;
        tool_synth_params_init(&p);
        tool_synth_params_model(&p, m ? TOOL_SYNTH_V3 : TOOL_SYNTH_V2);
        p.dim = 64;
        p.n_docs = 200;
        p.len_mean = 40;
        p.group_docs = 0; /* no topic groups: unrelated documents */
        p.seed = rnd();
        tool_synth *s = NULL;
        ck_assert_int_eq(tool_synth_new(&p, &s), 0);
        float *a = malloc(8 * p.len_mean * p.dim * sizeof(float));
        float *b = malloc(8 * p.len_mean * p.dim * sizeof(float));
        size_t pairs = 0, runs = 0, steps = 0;
        for (size_t i = 0; i + 1 < p.n_docs; i += 2) {
            size_t na = tool_synth_doclen(s, i), nb = tool_synth_doclen(s, i + 1);
            tool_synth_doc(s, i, a);
            tool_synth_doc(s, i + 1, b);
            for (size_t t = 0; t < na && t < nb; t++, pairs++) {
                double d = 0;
                for (size_t k = 0; k < p.dim; k++)
                    d += (double)a[t * p.dim + k] * b[t * p.dim + k];
                cross[m] += d;
            }
            for (size_t t = 1; t < na; t++, steps++) {
                double d = 0;
                for (size_t k = 0; k < p.dim; k++)
                    d += (double)a[t * p.dim + k] * a[(t - 1) * p.dim + k];
                runs += d > 0.97;
            }
        }
        cross[m] /= (double)pairs;
        near_dup[m] = (double)runs / (double)steps;
        free(a);
        free(b);
        tool_synth_free(s);
    }
    ck_assert_msg(cross[0] < 0.15 && cross[1] > 0.25 && cross[1] < 0.6,
                  "mean cosine of unrelated tokens: V2 %.3f, V3 %.3f", cross[0], cross[1]);
    ck_assert_msg(near_dup[0] < 0.05 && near_dup[1] > 0.3,
                  "share of near-duplicate neighbours: V2 %.3f, V3 %.3f", near_dup[0], near_dup[1]);
}
END_TEST

/* Bad parameters are refused with TARTAN_EINVAL; bad output types with TARTAN_EDTYPE. */
START_TEST(test_tools_synth_rejects_bad_params)
{
    rng_init_random();
    tool_synth_params p;
    tool_synth *s = (tool_synth *)&p;
    for (int c = 0; c < 11; c++) {
        tool_synth_params_init(&p);
        p.n_docs = 10;
        switch (c) {
        case 0:
            p.dim = 0;
            break;
        case 1:
            p.model = 4;
            break;
        case 8:
            tool_synth_params_model(&p, TOOL_SYNTH_V3);
            p.aniso_mean = 1.f; /* nothing left for the subspace */
            break;
        case 9:
            tool_synth_params_model(&p, TOOL_SYNTH_V3);
            p.run_prob = NAN;
            break;
        case 10:
            tool_synth_params_model(&p, TOOL_SYNTH_V3);
            p.dim = 5000; /* above V3's dense map's limit */
            break;
        case 2:
            p.noise = NAN;
            break;
        case 3:
            p.context = -1.f;
            break;
        case 4:
            p.query_context = 1.5f;
            break;
        case 5:
            p.group_terms = NAN;
            break;
        case 6:
            p.query_content = -0.1f;
            break;
        case 7:
            p.len_min = 50;
            p.len_mean = 10;
            break;
        }
        s = (tool_synth *)&p;
        ck_assert_int_eq(tool_synth_new(&p, &s), TARTAN_EINVAL);
        ck_assert_ptr_null(s);
    }
    tool_synth_params_init(&p);
    p.n_docs = 5;
    p.n_queries = 2;
    ck_assert_int_eq(tool_synth_new(&p, &s), 0);
    ck_assert_int_eq(mkdir(fx_path("bad"), 0777), 0);
    char err[4200];
    size_t T = 7;
    ck_assert_int_eq(tool_synth_write(s, &p, fx_path("bad"), TOOL_I32, &T, err, sizeof err),
                     TARTAN_EDTYPE);
    ck_assert_uint_eq(T, 0);
    ck_assert_uint_eq(fx_count_dir_entries(), 1); /* only the empty "bad" */
    /* A directory that does not exist: an error naming the file, no crash. */
    ck_assert_int_ne(tool_synth_write(s, &p, fx_path("absent"), TOOL_F32, &T, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "absent"));
    tool_synth_free(s);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"synth_threads", test_tools_synth_deterministic_any_threads, 0},
        {"synth_qrels", test_tools_synth_queries_and_qrels, 0},
        {"synth_f16", test_tools_synth_f16_rounding, 0},
        {"synth_lengths", test_tools_synth_doc_lengths, 0},
        {"synth_v3_statistics", test_tools_synth_v3_statistics, 0},
        {"synth_bad_params", test_tools_synth_rejects_bad_params, 0},
    };
    return FX_RUN("tools-synth", cases, FX_DIR, 60);
}
