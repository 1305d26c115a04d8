/*
 * check_train_shared.c: tartan_train_shared (engine/tartan.h) with an in-process group: P
 * members as P threads, each with its own index in a fresh temporary directory, joined by a
 * fake transport (shared pointers and a barrier) whose sum adds the members' values in a
 * different order on each member, as an allreduce's tree may. Checked:
 *   - P members given the P parts of a sample (uneven, one of them empty) store the model
 *     that tartan_train stores from the whole sample, byte for byte (tartan_model_export), with
 *     k-means drawing a subset and using every point, with clusters that empty and refill; and
 *     the centroids find the corpus's topics (against a double-precision cosine);
 *   - one member's failure (NaN in its sample, another nbits, an index trained already), a
 *     transport that fails, or a group sample of one token makes every member return an error
 *     (the failed one its own code, the others TARTAN_EGROUP naming it), none hangs, and no
 *     index changes; a malformed group is refused at once.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "fixture.h"
#include "model.h"
#include "store.h"
#include "tartan.h"

enum { MAXP = 4, DIM = 32 };

/* ---- the fake transport ------------------------------------------------------------------ */

typedef struct fake {
    int size;
    pthread_barrier_t bar;
    void *ptr[MAXP];
    size_t len[MAXP];
    int fail_at;     /* the call number (from 1) at which every member's call fails; 0 never */
    int calls[MAXP]; /* calls so far, per member */
    int lens_wrong;  /* a gather's lens disagreed with what the members sent */
    int sum_calls[MAXP];
} fake;

typedef struct member {
    fake *f;
    int rank;
    tartan_db *db;
    const tartan_batch *part;
    size_t corpus_tokens;
    const tartan_train_group *group; /* NULL: the member's own */
    int rc;
    char msg[600];
    tartan_train_stats st;
} member;

/* Every member makes the same calls in the same order, so failing at the same call number
 * fails every member's call alike, as a transport's collective failure does. */
static int failing(member *me)
{
    return me->f->fail_at && ++me->f->calls[me->rank] >= me->f->fail_at;
}

static int f_sum(void *ctx, double *v, size_t n)
{
    member *me = ctx;
    fake *f = me->f;
    if (failing(me))
        return -1;
    f->sum_calls[me->rank]++;
    f->ptr[me->rank] = v;
    pthread_barrier_wait(&f->bar);
    double *t = malloc((n ? n : 1) * sizeof *t);
    /* Each member adds the parts starting from its own: another order on every member. */
    for (size_t i = 0; i < n && t; i++) {
        double s = 0.0;
        for (int q = 0; q < f->size; q++)
            s += ((const double *)f->ptr[(me->rank + q) % f->size])[i];
        t[i] = s;
    }
    pthread_barrier_wait(&f->bar);
    if (t)
        memcpy(v, t, n * sizeof *t);
    free(t);
    return t ? 0 : -1;
}

static int f_bcast(void *ctx, void *buf, size_t len)
{
    member *me = ctx;
    fake *f = me->f;
    if (failing(me))
        return -1;
    f->ptr[me->rank] = buf;
    pthread_barrier_wait(&f->bar);
    if (me->rank != 0 && len)
        memcpy(buf, f->ptr[0], len);
    pthread_barrier_wait(&f->bar);
    return 0;
}

static int f_gather(void *ctx, const void *mine, size_t len, void *all, const size_t *lens)
{
    member *me = ctx;
    fake *f = me->f;
    if (failing(me))
        return -1;
    f->ptr[me->rank] = (void *)mine;
    f->len[me->rank] = len;
    pthread_barrier_wait(&f->bar);
    if (me->rank == 0) {
        size_t at = 0;
        for (int r = 0; r < f->size; r++) {
            if (lens[r] != f->len[r])
                f->lens_wrong = 1;
            memcpy((char *)all + at, f->ptr[r], f->len[r]);
            at += f->len[r];
        }
    } else if (all != NULL) {
        f->lens_wrong = 1;
    }
    pthread_barrier_wait(&f->bar);
    return 0;
}

static void *member_main(void *arg)
{
    member *me = arg;
    tartan_train_group g = {me->rank, me->f->size, me, f_sum, f_bcast, f_gather};
    me->rc = tartan_train_shared(me->db, me->part, me->corpus_tokens, me->group ? me->group : &g,
                                 &me->st);
    snprintf(me->msg, sizeof me->msg, "%s", me->rc ? tartan_errmsg(me->db) : "");
    return NULL;
}

/* Runs the group: member r trains dbs[r] from parts[r]. */
static void run_group(int p, tartan_db **dbs, const tartan_batch *parts, size_t corpus_tokens,
                      int fail_at, member *mem)
{
    fake *f = xcalloc(1, sizeof *f);
    f->size = p;
    f->fail_at = fail_at;
    ck_assert_int_eq(pthread_barrier_init(&f->bar, NULL, (unsigned)p), 0);
    pthread_t th[MAXP];
    for (int r = 0; r < p; r++) {
        memset(&mem[r], 0, sizeof mem[r]);
        mem[r].f = f;
        mem[r].rank = r;
        mem[r].db = dbs[r];
        mem[r].part = &parts[r];
        mem[r].corpus_tokens = corpus_tokens;
        ck_assert_int_eq(pthread_create(&th[r], NULL, member_main, &mem[r]), 0);
    }
    for (int r = 0; r < p; r++)
        ck_assert_int_eq(pthread_join(th[r], NULL), 0);
    ck_assert_msg(!f->lens_wrong, "a gather's lens did not match what the members sent");
    /* Every member made the same exchanges. */
    for (int r = 1; r < p; r++)
        ck_assert_int_eq(f->sum_calls[r], f->sum_calls[0]);
    pthread_barrier_destroy(&f->bar);
    for (int r = 0; r < p; r++)
        mem[r].f = NULL;
    free(f);
}

/* ---- data -------------------------------------------------------------------------------- */

static tartan_db *open_index(const char *name, size_t n_centroids, unsigned nbits)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE | TARTAN_EXCL;
    o.dim = DIM;
    o.nbits = nbits;
    o.n_centroids = n_centroids;
    o.device = TARTAN_DEVICE_CPU;
    o.seed = 1234;
    return fx_open_with(fx_path(name), &o);
}

/* The documents [d0, d1) of c as a batch (ids left out, as a sample's may be). */
static tartan_batch part_of(const fx_corpus *c, size_t d0, size_t d1)
{
    tartan_batch b = {0};
    b.n_docs = d1 - d0;
    b.doclens = c->doclens + d0;
    b.embeddings = c->emb + c->offs[d0] * c->dim;
    b.n_rows = c->offs[d1] - c->offs[d0];
    b.dim = c->dim;
    b.dtype = TARTAN_FLOAT32;
    return b;
}

static unsigned char *export_of(tartan_db *db, size_t *len)
{
    void *buf = NULL;
    ck_assert_msg(tartan_model_export(db, &buf, len) == 0, "%s", tartan_errmsg(db));
    return buf;
}

static uint32_t centroids_of(tartan_db *db)
{
    tartan_index_info info;
    ck_assert_int_eq(tartan_info(db, &info), 0);
    return info.n_centroids;
}

/* The stored centroids (a copy). */
static float *stored_centroids(tartan_db *db, uint32_t *k)
{
    store_msg m = {{0}};
    store_txn *txn;
    store_header h;
    idx_model mod;
    ck_assert_int_eq(store_read_begin(db->env, &txn, &m), 0);
    ck_assert_int_eq(store_header_get(txn, &h, &m), 0);
    ck_assert_int_eq(idx_model_load(txn, &h, &mod, &m), 0);
    store_read_end(db->env, txn);
    *k = mod.k;
    return mod.centroids;
}

/*
 * One training of the corpus by tartan_train, then by groups of 3 and 4 members over uneven
 * parts (the 4-member group with an empty part): every member's export equals the single
 * index's, byte for byte. Returns the single index (open).
 */
static tartan_db *same_model_any_split(const fx_corpus *c, size_t n_centroids, const char *tag)
{
    char name[64];
    snprintf(name, sizeof name, "%s-one", tag);
    tartan_db *one = open_index(name, n_centroids, 2);
    tartan_batch all = part_of(c, 0, c->n_docs);
    ck_assert_msg(tartan_train(one, &all, c->n_rows) == 0, "%s", tartan_errmsg(one));
    size_t rlen;
    unsigned char *ref = export_of(one, &rlen);
    size_t n = c->n_docs;
    const size_t cuts[2][MAXP + 1] = {{0, n / 9, n / 2 + 3, n, n}, {0, n / 3, n / 3, 3 * n / 4, n}};
    const int ps[2] = {3, 4};
    for (int s = 0; s < 2; s++) {
        int p = ps[s];
        tartan_db *dbs[MAXP];
        tartan_batch parts[MAXP];
        member mem[MAXP];
        for (int r = 0; r < p; r++) {
            snprintf(name, sizeof name, "%s-p%d-r%d", tag, p, r);
            dbs[r] = open_index(name, n_centroids, 2);
            parts[r] = part_of(c, cuts[s][r], cuts[s][r + 1]);
        }
        run_group(p, dbs, parts, c->n_rows, 0, mem);
        for (int r = 0; r < p; r++) {
            ck_assert_msg(mem[r].rc == 0, "%s: %d members, rank %d: %s", tag, p, r, mem[r].msg);
            ck_assert(mem[r].st.seconds_kmeans > 0.0 && mem[r].st.seconds_codec >= 0.0);
            ck_assert(mem[r].st.seconds_total >=
                      mem[r].st.seconds_kmeans + mem[r].st.seconds_codec);
            size_t len;
            unsigned char *got = export_of(dbs[r], &len);
            ck_assert_uint_eq(len, rlen);
            if (memcmp(got, ref, len) != 0) {
                /* Say how far apart the centroids are before failing. */
                uint32_t k1, k2;
                float *a = stored_centroids(one, &k1), *b = stored_centroids(dbs[r], &k2);
                size_t differ = 0;
                double worst = 0.0;
                for (size_t i = 0; i < (size_t)k1 * DIM; i++)
                    if (a[i] != b[i]) {
                        differ++;
                        worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
                    }
                ck_abort_msg("%s: %d members, rank %d: another model than one process's (%zu "
                             "centroid values differ, by up to %g)",
                             tag, p, r, differ, worst);
            }
            tartan_free(got);
            tartan_close(dbs[r]);
        }
    }
    tartan_free(ref);
    return one;
}

static void corpus(fx_corpus *c, size_t n_docs, size_t topics, size_t min_len, size_t max_len,
                   double noise)
{
    fx_corpus_spec sp = {DIM, n_docs, topics, min_len, max_len, noise, NULL, 0, 0};
    fx_corpus_make(c, &sp);
}

/* ---- tests ------------------------------------------------------------------------------- */

START_TEST(test_train_shared_equals_one_process_subset)
{
    /* About 14k tokens, K 64: k-means draws a subset of 64 x 64 points (the held-out rows
     * skipped, not moved). The centroids also find the topics (cosines in double precision):
     * four iterations from random points leave a few pairs of topics sharing a centroid, but
     * most topics (30 of 40) get one of their own within cosine 0.95. */
    fx_corpus c;
    corpus(&c, 1200, 40, 4, 20, 0.15);
    tartan_db *one = same_model_any_split(&c, 64, "subset");
    uint32_t k;
    float *cen = stored_centroids(one, &k);
    ck_assert_uint_eq(k, 64);
    size_t found = 0;
    for (size_t t = 0; t < c.n_topics; t++) {
        double best = -2.0;
        for (size_t i = 0; i < k; i++)
            best = fmax(best, cosine_d(c.topics + t * DIM, cen + i * DIM, DIM));
        found += best > 0.95;
    }
    printf("train_shared: %zu of %zu topics have a centroid within cosine 0.95\n", found,
           c.n_topics);
    ck_assert_msg(found >= 30, "only %zu of %zu topics have a centroid within cosine 0.95", found,
                  c.n_topics);
    free(cen);
    tartan_close(one);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_train_shared_equals_one_process_all_points)
{
    /* K 512 against about 9k training tokens: every point trains (the held-out rows taken out
     * in place), and with 30 topics many clusters empty and refill from the group's worst
     * served points. */
    fx_corpus c;
    corpus(&c, 800, 30, 4, 20, 0.3);
    tartan_db *one = same_model_any_split(&c, 512, "all");
    ck_assert_uint_eq(centroids_of(one), 512);
    tartan_close(one);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_train_shared_equals_one_process_duplicates)
{
    /* Most tokens are copies of 6 vectors: the first centroids repeat them, all copies go to
     * the lowest of equal centroids and the other clusters empty at every iteration, so the
     * refill decides most centroids (ties between equal scores to the lower index). */
    fx_corpus c;
    corpus(&c, 600, 20, 4, 12, 0.3);
    for (size_t i = 0; i < c.n_rows; i++)
        if (i % 7 != 0)
            memcpy(c.emb + i * DIM, c.emb + (i % 6) * DIM, DIM * sizeof(float));
    tartan_db *one = same_model_any_split(&c, 48, "dup");
    tartan_close(one);
    fx_corpus_free(&c);
}
END_TEST

/* Runs a 3-member group over thirds of c where make_bad may spoil one member (its part or its
 * index); expects rank `bad` to fail with code `want` and the others with TARTAN_EGROUP naming
 * it (bad -1: every member fails with want), and no index trained. */
static void expect_all_fail(const fx_corpus *c, const tartan_batch *parts, tartan_db **dbs,
                            int fail_at, int bad, int want, const char *what)
{
    member mem[MAXP];
    run_group(3, dbs, parts, c->n_rows, fail_at, mem);
    for (int r = 0; r < 3; r++) {
        int expect = bad < 0 || r == bad ? want : TARTAN_EGROUP;
        ck_assert_msg(mem[r].rc == expect, "%s: rank %d returned %d (%s), not %d", what, r,
                      mem[r].rc, mem[r].msg, expect);
        if (bad >= 0 && r != bad) {
            char need[96];
            snprintf(need, sizeof need, "rank %d of 3 failed with %s", bad, tartan_err_name(want));
            ck_assert_msg(strstr(mem[r].msg, need), "%s: rank %d says '%s'", what, r, mem[r].msg);
        }
    }
}

START_TEST(test_train_shared_one_failure_fails_all)
{
    fx_corpus c;
    corpus(&c, 300, 20, 4, 12, 0.3);
    size_t n = c.n_docs;
    tartan_batch parts[3] = {part_of(&c, 0, n / 3), part_of(&c, n / 3, 2 * n / 3),
                             part_of(&c, 2 * n / 3, n)};
    tartan_db *dbs[3];
    char name[32];
    for (int r = 0; r < 3; r++) {
        snprintf(name, sizeof name, "f-r%d", r);
        dbs[r] = open_index(name, 32, 2);
    }
    /* NaN in rank 1's part. */
    float *row = c.emb + (c.offs[n / 3] + 2) * DIM;
    float keep = row[5];
    row[5] = NAN;
    expect_all_fail(&c, parts, dbs, 0, 1, TARTAN_ENONFINITE, "NaN in rank 1's sample");
    row[5] = keep;
    /* A transport that fails at its 1st, 5th, 8th or 10th call (the settings' broadcast,
     * k-means's counts, the first centroids' gather, the first iteration's sum): every member
     * returns TARTAN_EGROUP. */
    const int at[] = {1, 5, 8, 10};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        expect_all_fail(&c, parts, dbs, at[i], -1, TARTAN_EGROUP, "the transport failed");
    for (int r = 0; r < 3; r++)
        ck_assert_uint_eq(centroids_of(dbs[r]), 0);
    /* Rank 2's index created with another nbits. */
    tartan_close(dbs[2]);
    dbs[2] = open_index("f-r2-nbits4", 32, 4);
    expect_all_fail(&c, parts, dbs, 0, 2, TARTAN_EINVAL, "rank 2 with nbits 4");
    /* Rank 0's index trained already. */
    tartan_close(dbs[2]);
    dbs[2] = open_index("f-r2-again", 32, 2);
    ck_assert_int_eq(tartan_train(dbs[0], &parts[0], 0), 0);
    expect_all_fail(&c, parts, dbs, 0, 0, TARTAN_EINVAL, "rank 0 trained already");
    ck_assert_uint_eq(centroids_of(dbs[1]), 0);
    ck_assert_uint_eq(centroids_of(dbs[2]), 0);
    for (int r = 0; r < 3; r++)
        tartan_close(dbs[r]);
    fx_corpus_free(&c);
}
END_TEST

START_TEST(test_train_shared_too_few_tokens_and_bad_group)
{
    fx_corpus c;
    corpus(&c, 10, 4, 1, 1, 0.3);
    /* One token in the whole group: every member says TARTAN_EEMPTY. */
    tartan_batch parts[3] = {part_of(&c, 0, 1), part_of(&c, 1, 1), part_of(&c, 1, 1)};
    tartan_db *dbs[3];
    char name[32];
    for (int r = 0; r < 3; r++) {
        snprintf(name, sizeof name, "e-r%d", r);
        dbs[r] = open_index(name, 0, 2);
    }
    expect_all_fail(&c, parts, dbs, 0, -1, TARTAN_EEMPTY, "one token in all");
    /* A malformed group: refused at once, nothing called. */
    tartan_batch b = part_of(&c, 0, c.n_docs);
    tartan_train_group g = {0, 1, NULL, f_sum, f_bcast, f_gather};
    g.rank = 1;
    ck_assert_int_eq(tartan_train_shared(dbs[0], &b, 0, &g, NULL), TARTAN_EINVAL);
    g.rank = 0;
    g.gather = NULL;
    ck_assert_int_eq(tartan_train_shared(dbs[0], &b, 0, &g, NULL), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_train_shared(dbs[0], &b, 0, NULL, NULL), TARTAN_EINVAL);
    ck_assert_int_eq(tartan_train_shared(NULL, &b, 0, &g, NULL), TARTAN_EINVAL);
    ck_assert_uint_eq(centroids_of(dbs[0]), 0);
    for (int r = 0; r < 3; r++)
        tartan_close(dbs[r]);
    fx_corpus_free(&c);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"equals_one_process_subset", test_train_shared_equals_one_process_subset, 0},
        {"equals_one_process_all_points", test_train_shared_equals_one_process_all_points, 0},
        {"equals_one_process_duplicates", test_train_shared_equals_one_process_duplicates, 0},
        {"one_failure_fails_all", test_train_shared_one_failure_fails_all, 0},
        {"too_few_tokens_and_bad_group", test_train_shared_too_few_tokens_and_bad_group, 0},
    };
    return FX_RUN("train-shared", cases, FX_DIR, 0);
}
