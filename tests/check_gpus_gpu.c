/*
 * check_gpus_gpu.c: tartan_search over several GPU partitions (engine/gpus.h) on a real GPU,
 * against the CPU's exhaustive search and one GPU's search: TARTAN_GPU_PARTITIONS=N places N
 * partitions on the visible GPUs in turn (all on one GPU when there is one), gpu_devices -1
 * spreads them over every visible GPU. Exhaustive results equal the CPU's (ids, scores within
 * the GPU's rounding), PLAID keeps at least one GPU's recall, the partitions follow adds and
 * deletes, subsets and streaming mode work. Split by queries instead (TARTAN_GPU_SPLIT=queries:
 * a copy of the index on each GPU, each searching a share of the queries), the results are one
 * GPU's, and the automatic split picks copies for an index this small. Exits 77 (skipped)
 * without a GPU; run with CK_FORK=no (a CUDA context does not survive a fork).
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "fixture.h"
#include "gpus.h"
#include "kernels.h"
#include "tartan.h"

enum { DIM = 64, NTOPIC = 50, NQ = 24, LQ = 16 };

typedef struct corpus {
    size_t n_docs, n_rows;
    size_t *doclens, *offs;
    char **ids;
    float *emb, *q, *topics;
} corpus;

static void corpus_make(corpus *c, size_t n_docs)
{
    c->n_docs = n_docs;
    c->topics = xmalloc(NTOPIC * DIM * sizeof(float));
    for (size_t i = 0; i < NTOPIC * DIM; i++)
        c->topics[i] = (float)gauss();
    c->doclens = xmalloc(n_docs * sizeof(size_t));
    c->offs = xmalloc((n_docs + 1) * sizeof(size_t));
    c->ids = xmalloc(n_docs * sizeof(char *));
    c->n_rows = 0;
    for (size_t i = 0; i < n_docs; i++) {
        c->doclens[i] = 8 + rnd() % 60;
        c->offs[i] = c->n_rows;
        c->n_rows += c->doclens[i];
        c->ids[i] = xmalloc(24);
        snprintf(c->ids[i], 24, "d%zu", i);
    }
    c->offs[n_docs] = c->n_rows;
    c->emb = xmalloc(c->n_rows * DIM * sizeof(float));
    for (size_t i = 0, r = 0; i < n_docs; i++) {
        size_t t3[3] = {rnd() % NTOPIC, rnd() % NTOPIC, rnd() % NTOPIC};
        for (size_t t = 0; t < c->doclens[i]; t++, r++)
            for (size_t j = 0; j < DIM; j++)
                c->emb[r * DIM + j] = (float)(c->topics[t3[rnd() % 3] * DIM + j] + 0.5 * gauss());
    }
    c->q = xmalloc(NQ * LQ * DIM * sizeof(float));
    for (size_t r = 0; r < NQ * LQ; r++) {
        size_t src = rnd() % c->n_rows;
        for (size_t j = 0; j < DIM; j++)
            c->q[r * DIM + j] = (float)(c->emb[src * DIM + j] + 0.5 * gauss());
    }
}

static void corpus_free(corpus *c)
{
    for (size_t i = 0; i < c->n_docs; i++)
        free(c->ids[i]);
    free(c->ids);
    free(c->doclens);
    free(c->offs);
    free(c->emb);
    free(c->q);
    free(c->topics);
}

static tartan_db *open_ix(tartan_gpu_mode mode, int gpu_devices)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = 128;
    o.gpu_mode = mode;
    o.gpu_devices = gpu_devices;
    o.device = TARTAN_DEVICE_CPU; /* builds on the CPU; each search names its device */
    tartan_db *db = NULL;
    ck_assert_msg(tartan_open(ixpath, &o, &db) == 0, "%s", tartan_errmsg(NULL));
    return db;
}

static void add_range(tartan_db *db, const corpus *c, size_t from, size_t n)
{
    tartan_batch b = {n,
                      (const char *const *)c->ids + from,
                      c->doclens + from,
                      c->emb + c->offs[from] * DIM,
                      c->offs[from + n] - c->offs[from],
                      DIM,
                      TARTAN_FLOAT32};
    ck_assert_msg(tartan_add(db, &b, 0) == 0, "%s", tartan_errmsg(db));
}

static tartan_results *search(tartan_db *db, const corpus *c, size_t k, int exhaustive,
                              tartan_device dev, const char *const *subset, size_t n_subset)
{
    tartan_queries q = {NQ, NULL, LQ, c->q, NQ * LQ, DIM, TARTAN_FLOAT32};
    tartan_search_params p;
    tartan_search_params_init(&p, k);
    p.exhaustive = exhaustive;
    p.device = dev;
    p.subset = subset;
    p.n_subset = n_subset;
    tartan_results *r = NULL;
    int rc = tartan_search(db, &q, &p, &r);
    ck_assert_msg(rc == 0, "search: %s", tartan_errmsg(db));
    return r;
}

/* The partitioned GPU's exhaustive results against the CPU's: the same number of hits, the
 * same score at each rank within the GPU's rounding (check_search_gpu's bound: the fp16
 * residual term, about 1e-4 a query token as a random walk, plus fp32 rounding relative to
 * the score), and the same id unless the two scores there are a near tie. */
static void expect_close(const tartan_results *gpu, const tartan_results *cpu)
{
    for (size_t i = 0; i < cpu->n_queries; i++) {
        ck_assert_uint_eq(gpu->counts[i], cpu->counts[i]);
        for (size_t j = 0; j < cpu->counts[i]; j++) {
            const tartan_hit *x = &gpu->hits[gpu->offsets[i] + j];
            const tartan_hit *y = &cpu->hits[cpu->offsets[i] + j];
            const double tol = 2e-4 * fmax(1.0, fabs(y->score)) + 3e-4 * sqrt((double)LQ);
            ck_assert_msg(fabs(x->score - y->score) <= tol, "query %zu rank %zu: %.7f vs %.7f", i,
                          j, x->score, y->score);
            if (strcmp(x->id, y->id)) {
                /* A swap is only allowed between near-equal scores. */
                /* At the last rank the CPU's next document is not in its list: the score
                 * check above is the tie test there. */
                int near =
                    j + 1 == cpu->counts[i] ||
                    (j + 1 < cpu->counts[i] &&
                     fabs(cpu->hits[cpu->offsets[i] + j + 1].score - y->score) <= 2 * tol) ||
                    (j > 0 && fabs(cpu->hits[cpu->offsets[i] + j - 1].score - y->score) <= 2 * tol);
                ck_assert_msg(near, "query %zu rank %zu: %s vs %s, not a near tie", i, j, x->id,
                              y->id);
            }
        }
    }
}

static double recall(const tartan_results *r, const tartan_results *exh)
{
    size_t found = 0, total = 0;
    for (size_t i = 0; i < exh->n_queries; i++)
        for (size_t j = 0; j < exh->counts[i]; j++) {
            total++;
            for (size_t x = 0; x < r->counts[i]; x++)
                if (!strcmp(r->hits[r->offsets[i] + x].id, exh->hits[exh->offsets[i] + j].id)) {
                    found++;
                    break;
                }
        }
    return total ? (double)found / (double)total : 1.0;
}

/* n partitions by document (the split these tests are about unless they say otherwise). */
static void set_parts(int n)
{
    char v[16];
    snprintf(v, sizeof v, "%d", n);
    setenv("TARTAN_GPU_PARTITIONS", v, 1);
    setenv("TARTAN_GPU_SPLIT", "documents", 1);
}

START_TEST(test_gpus_exhaustive_equals_cpu)
{
    corpus c;
    corpus_make(&c, 900);
    tartan_db *db = open_ix(TARTAN_GPU_RESIDENT, 0);
    add_range(db, &c, 0, 900);
    tartan_results *cpu = search(db, &c, 10, 1, TARTAN_DEVICE_CPU, NULL, 0);
    for (int np = 1; np <= 4; np++) {
        set_parts(np);
        tartan_results *g = search(db, &c, 10, 1, TARTAN_DEVICE_CUDA, NULL, 0);
        expect_close(g, cpu);
        tartan_results_free(g);
    }
    tartan_results_free(cpu);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_gpus_plaid_recall)
{
    corpus c;
    corpus_make(&c, 1500);
    tartan_db *db = open_ix(TARTAN_GPU_RESIDENT, 0);
    add_range(db, &c, 0, 1500);
    tartan_results *exh = search(db, &c, 10, 1, TARTAN_DEVICE_CPU, NULL, 0);
    unsetenv("TARTAN_GPU_PARTITIONS");
    tartan_results *one = search(db, &c, 10, 0, TARTAN_DEVICE_CUDA, NULL, 0);
    set_parts(3);
    tartan_results *three = search(db, &c, 10, 0, TARTAN_DEVICE_CUDA, NULL, 0);
    double r1 = recall(one, exh), r3 = recall(three, exh);
    printf("PLAID recall@10 against exhaustive: one GPU %.4f, 3 partitions %.4f\n", r1, r3);
    /* Default (adaptive) search: every partition probes alike (one index, one calibration)
     * and stops scoring against its own k-th best score, no higher than the index's, so it
     * keeps at least as much of the top 10 (a rounding swap at the boundary aside). */
    ck_assert_msg(r3 >= r1 - 0.005, "3 partitions %.4f < one %.4f", r3, r1);
    tartan_results_free(exh);
    tartan_results_free(one);
    tartan_results_free(three);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* Adds and deletes between searches: every partition's mirror catches up. */
START_TEST(test_gpus_follow_changes)
{
    corpus c;
    corpus_make(&c, 800);
    tartan_db *db = open_ix(TARTAN_GPU_RESIDENT, 0);
    add_range(db, &c, 0, 500);
    set_parts(3);
    for (int step = 0; step < 4; step++) {
        if (step == 1)
            add_range(db, &c, 500, 200);
        if (step == 2) {
            const char *del[60];
            for (int i = 0; i < 60; i++)
                del[i] = c.ids[i * 11];
            size_t nd = 0;
            ck_assert_int_eq(tartan_delete(db, del, 60, &nd), 0);
            ck_assert_uint_eq(nd, 60);
        }
        if (step == 3) {
            add_range(db, &c, 700, 100);
            const char *one[1] = {c.ids[3]};
            ck_assert_int_eq(tartan_delete(db, one, 1, NULL), 0);
        }
        tartan_results *cpu = search(db, &c, 10, 1, TARTAN_DEVICE_CPU, NULL, 0);
        tartan_results *g = search(db, &c, 10, 1, TARTAN_DEVICE_CUDA, NULL, 0);
        expect_close(g, cpu);
        tartan_results_free(g);
        tartan_results_free(cpu);
    }
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

START_TEST(test_gpus_subset_and_streaming)
{
    corpus c;
    corpus_make(&c, 700);
    for (int mode = 0; mode < 2; mode++) {
        tartan_db *db = open_ix(mode ? TARTAN_GPU_STREAMING : TARTAN_GPU_RESIDENT, 0);
        if (mode == 0)
            add_range(db, &c, 0, 700);
        const char *sub[100];
        for (int i = 0; i < 100; i++)
            sub[i] = c.ids[(size_t)i * 7];
        set_parts(3);
        for (int exh = 0; exh < 2; exh++) {
            tartan_results *cpu = search(db, &c, 5, 1, TARTAN_DEVICE_CPU, sub, 100);
            tartan_results *g = search(db, &c, 5, exh, TARTAN_DEVICE_CUDA, sub, 100);
            expect_close(g, cpu);
            tartan_results_free(g);
            tartan_results_free(cpu);
        }
        tartan_results *cpu = search(db, &c, 10, 1, TARTAN_DEVICE_CPU, NULL, 0);
        tartan_results *g = search(db, &c, 10, 1, TARTAN_DEVICE_CUDA, NULL, 0);
        expect_close(g, cpu);
        tartan_results_free(g);
        tartan_results_free(cpu);
        tartan_close(db);
    }
    corpus_free(&c);
}
END_TEST

/* gpu_devices -1: every visible GPU, one partition each (on a one-GPU host, one GPU's path). */
START_TEST(test_gpus_all_devices)
{
    corpus c;
    corpus_make(&c, 900);
    tartan_db *db = open_ix(TARTAN_GPU_RESIDENT, -1);
    add_range(db, &c, 0, 900);
    unsetenv("TARTAN_GPU_PARTITIONS");
    printf("visible GPUs: %d\n", kern_cuda_device_count());
    tartan_results *cpu = search(db, &c, 10, 1, TARTAN_DEVICE_CPU, NULL, 0);
    tartan_results *g = search(db, &c, 10, 1, TARTAN_DEVICE_CUDA, NULL, 0);
    expect_close(g, cpu);
    tartan_results_free(g);
    setenv("TARTAN_GPU_SPLIT", "documents", 1);
    g = search(db, &c, 10, 1, TARTAN_DEVICE_CUDA, NULL, 0);
    expect_close(g, cpu);
    tartan_results_free(g);
    /* Twice as many partitions as GPUs: two on each. */
    set_parts(2 * kern_cuda_device_count());
    g = search(db, &c, 10, 1, TARTAN_DEVICE_CUDA, NULL, 0);
    expect_close(g, cpu);
    tartan_results_free(g);
    tartan_results_free(cpu);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

/* Split by queries: 1 to 5 copies (more than the GPUs: several on one), each a share of the
 * queries; exhaustive results the CPU's, PLAID one GPU's recall (a query's search is its own,
 * though the kernels' tiles may round differently by batch), through adds and deletes; and the
 * automatic split takes copies for this small index. */
START_TEST(test_gpus_copies)
{
    corpus c;
    corpus_make(&c, 1200);
    tartan_db *db = open_ix(TARTAN_GPU_RESIDENT, 0);
    add_range(db, &c, 0, 1000);
    tartan_results *exh = search(db, &c, 10, 1, TARTAN_DEVICE_CPU, NULL, 0);
    unsetenv("TARTAN_GPU_PARTITIONS");
    tartan_results *one = search(db, &c, 10, 0, TARTAN_DEVICE_CUDA, NULL, 0);
    double r1 = recall(one, exh);
    for (int n = 2; n <= 5; n++) {
        set_parts(n);
        setenv("TARTAN_GPU_SPLIT", "queries", 1); /* set_parts asks for documents */
        tartan_results *g = search(db, &c, 10, 1, TARTAN_DEVICE_CUDA, NULL, 0);
        expect_close(g, exh);
        tartan_results_free(g);
        g = search(db, &c, 10, 0, TARTAN_DEVICE_CUDA, NULL, 0);
        double rn = recall(g, exh);
        ck_assert_msg(rn >= r1 - 0.005, "%d copies: recall %.4f < one GPU's %.4f", n, rn, r1);
        tartan_results_free(g);
    }
    printf("PLAID recall@10 against exhaustive: one GPU %.4f (copies: at least that)\n", r1);
    add_range(db, &c, 1000, 200);
    const char *del[20];
    for (int i = 0; i < 20; i++)
        del[i] = c.ids[i * 13];
    ck_assert_int_eq(tartan_delete(db, del, 20, NULL), 0);
    tartan_results *cpu = search(db, &c, 10, 1, TARTAN_DEVICE_CPU, NULL, 0);
    tartan_results *g = search(db, &c, 10, 1, TARTAN_DEVICE_CUDA, NULL, 0);
    expect_close(g, cpu);
    tartan_results_free(g);
    tartan_results_free(cpu);
    /* The automatic split of a small index: copies. */
    unsetenv("TARTAN_GPU_SPLIT");
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    int np = 0, nd = 0, copies = -1;
    eng_gpu_lock();
    ck_assert_int_eq(eng_gpus_plan(db, &r, &np, &nd, &copies, &m), 0);
    eng_gpu_unlock();
    idx_reader_close(&r);
    ck_assert_int_eq(np, 5);
    ck_assert_int_eq(copies, 1);
    tartan_results_free(exh);
    tartan_results_free(one);
    tartan_close(db);
    corpus_free(&c);
}
END_TEST

static void unset_partitions(void)
{
    unsetenv("TARTAN_GPU_PARTITIONS");
    unsetenv("TARTAN_GPU_SPLIT");
}

int main(void)
{
    fx_after_each = unset_partitions;
    const fx_case cases[] = {
        {"exhaustive_equals_cpu", test_gpus_exhaustive_equals_cpu, 0},
        {"plaid_recall", test_gpus_plaid_recall, 0},
        {"follow_changes", test_gpus_follow_changes, 0},
        {"subset_and_streaming", test_gpus_subset_and_streaming, 0},
        {"all_devices", test_gpus_all_devices, 0},
        {"copies", test_gpus_copies, 0},
    };
    return FX_RUN("gpus_gpu", cases, FX_DIR | FX_GPU, 300);
}
