/* fixture.c: see fixture.h. */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "fixture.h"
#include "index.h"
#include "kernels.h"
#include "store.h"

/* ---- the temporary directory ------------------------------------------------------------ */

char tmpdir[256];
char ixpath[300];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

void fixture_dir_create(const char *name)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/tartan-%s-XXXXXX", base && *base ? base : "/tmp", name);
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(ixpath, sizeof ixpath, "%s/ix", tmpdir);
}

void fixture_dir_remove(void)
{
    chmod(tmpdir, 0700);
    chmod(ixpath, 0700);
    nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fx_path(const char *name)
{
    static char buf[4][512];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

size_t fx_count_dir_entries(void)
{
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

void fx_write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

void fx_write_text(const char *path, const char *text)
{
    fx_write_file(path, text, strlen(text));
}

unsigned char *fx_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = xmalloc((size_t)n + 1);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

/* ---- random numbers --------------------------------------------------------------------- */

uint64_t rng_state;
uint64_t rng_seed;

void rng_init_random(void)
{
    const char *s = getenv("TARTAN_TEST_SEED");
    rng_seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    rng_state = rng_seed;
    fprintf(stderr, "seed %llu (TARTAN_TEST_SEED replays it)\n", (unsigned long long)rng_seed);
}

uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double rng_uniform(uint64_t *s)
{
    return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double rng_gauss(uint64_t *s)
{
    double u = rng_uniform(s), v = rng_uniform(s);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

uint64_t rnd(void)
{
    return rng_next(&rng_state);
}

double unif(void)
{
    return rng_uniform(&rng_state);
}

double gauss(void)
{
    return rng_gauss(&rng_state);
}

float frnd(void)
{
    return (float)(rnd() >> 40) / 16777216.0f * 2.0f - 1.0f;
}

size_t urnd(size_t lo, size_t hi)
{
    return lo + (size_t)(rnd() % (hi - lo + 1));
}

size_t rnd_below(size_t n)
{
    return (size_t)(rnd() % n);
}

void fill_random(void *buf, size_t n)
{
    unsigned char *b = buf;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)rnd();
}

/* ---- memory ------------------------------------------------------------------------------ */

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

void poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

void normalise(float *x, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += (double)x[j] * x[j];
    double inv = 1.0 / sqrt(s);
    for (size_t j = 0; j < dim; j++)
        x[j] = (float)(x[j] * inv);
}

/* ---- vectors in double ------------------------------------------------------------------ */

double dot_d(const float *a, const float *b, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += (double)a[j] * b[j];
    return s;
}

double cosine_d(const float *a, const float *b, size_t dim)
{
    return dot_d(a, b, dim) / sqrt(dot_d(a, a, dim) * dot_d(b, b, dim));
}

/*
 * A clustered corpus: ncl random unit centers, n points normalise(center + sigma * g) with
 * point i in cluster i % ncl. Per-dimension sigma gives a within-cluster cosine of about
 * 1 / sqrt(1 + sigma^2 dim).
 */
void fx_clustered(uint64_t seed, size_t n, size_t dim, size_t ncl, double sigma, float *centers,
                  float *x)
{
    uint64_t s = seed;
    for (size_t c = 0; c < ncl; c++) {
        for (size_t j = 0; j < dim; j++)
            centers[c * dim + j] = (float)rng_gauss(&s);
        normalise(centers + c * dim, dim);
    }
    for (size_t i = 0; i < n; i++) {
        const float *c = centers + (i % ncl) * dim;
        for (size_t j = 0; j < dim; j++)
            x[i * dim + j] = (float)(c[j] + sigma * rng_gauss(&s));
        normalise(x + i * dim, dim);
    }
}

/* Index of the row of c [k, dim] with the largest inner product with v, in double. */
uint32_t nearest_d(const float *c, size_t k, size_t dim, const float *v)
{
    uint32_t best = 0;
    double bs = -INFINITY;
    for (size_t i = 0; i < k; i++) {
        double d = dot_d(c + i * dim, v, dim);
        if (d > bs) {
            bs = d;
            best = (uint32_t)i;
        }
    }
    return best;
}

/* ---- a clustered random corpus ----------------------------------------------------------- */

void fx_corpus_make(fx_corpus *c, const fx_corpus_spec *s)
{
    size_t dim = s->dim;
    memset(c, 0, sizeof *c);
    c->dim = dim;
    c->n_docs = s->n_docs;
    c->n_topics = s->n_topics;
    c->topics = xmalloc(s->n_topics * dim * sizeof(float));
    for (size_t i = 0; i < s->n_topics * dim; i++)
        c->topics[i] = (float)gauss();
    c->doclens = xmalloc(s->n_docs * sizeof(size_t));
    c->offs = xmalloc((s->n_docs + 1) * sizeof(size_t));
    c->ids = xmalloc(s->n_docs * sizeof(char *));
    for (size_t i = 0; i < s->n_docs; i++) {
        c->doclens[i] = s->min_len + rnd() % (s->max_len - s->min_len + 1);
        c->offs[i] = c->n_rows;
        c->n_rows += c->doclens[i];
        c->ids[i] = xmalloc(32);
        snprintf(c->ids[i], 32, s->id_fmt ? s->id_fmt : "doc-%zu", s->first_id + i);
    }
    c->offs[s->n_docs] = c->n_rows;
    c->emb = xmalloc(c->n_rows * dim * sizeof(float));
    for (size_t i = 0, row = 0; i < s->n_docs; i++) {
        size_t t3[3] = {rnd() % s->n_topics, rnd() % s->n_topics, rnd() % s->n_topics};
        for (size_t t = 0; t < c->doclens[i]; t++, row++) {
            const float *ctr = c->topics + t3[rnd() % 3] * dim;
            for (size_t j = 0; j < dim; j++) {
                if (s->topic_per_value && j)
                    ctr = c->topics + t3[rnd() % 3] * dim;
                c->emb[row * dim + j] = (float)(ctr[j] + s->noise * gauss());
            }
        }
    }
}

void fx_corpus_free(fx_corpus *c)
{
    for (size_t i = 0; i < c->n_docs; i++)
        free(c->ids[i]);
    free(c->ids);
    free(c->doclens);
    free(c->offs);
    free(c->emb);
    free(c->topics);
}

void fx_corpus_default(fx_corpus *c, size_t n_docs, uint64_t seed)
{
    fx_corpus_spec s = {.dim = 32,
                        .n_docs = n_docs,
                        .n_topics = 60,
                        .min_len = 4,
                        .max_len = 40,
                        .noise = 0.6,
                        .id_fmt = "doc-%zu"};
    rng_state = seed;
    fx_corpus_make(c, &s);
}

float *fx_queries(const fx_corpus *c, size_t nq, size_t lq, const size_t *lens, double noise,
                  size_t *rows_out)
{
    size_t rows = 0, dim = c->dim;
    for (size_t i = 0; i < nq; i++)
        rows += lens ? lens[i] : lq;
    float *q = xmalloc(rows * dim * sizeof(float));
    for (size_t i = 0, r = 0; i < nq; i++) {
        size_t d = rnd() % c->n_docs, len = lens ? lens[i] : lq;
        for (size_t t = 0; t < len; t++, r++) {
            size_t src = c->offs[d] + rnd() % c->doclens[d];
            for (size_t j = 0; j < dim; j++)
                q[r * dim + j] = (float)(c->emb[src * dim + j] + noise * gauss());
        }
    }
    if (rows_out)
        *rows_out = rows;
    return q;
}

/* ---- an index ------------------------------------------------------------------------------ */

tartan_db *fx_open_with(const char *path, const tartan_options *o)
{
    tartan_db *db = NULL;
    int rc = tartan_open(path, o, &db);
    ck_assert_msg(rc == 0, "open %s: %s", path, tartan_errmsg(NULL));
    ck_assert_ptr_nonnull(db);
    return db;
}

tartan_db *fx_open(const char *path, unsigned flags, size_t dim, size_t n_centroids)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = flags;
    o.dim = dim;
    o.n_centroids = n_centroids;
    return fx_open_with(path, &o);
}

void fx_add_range(tartan_db *db, const fx_corpus *c, size_t from, size_t n)
{
    tartan_batch b = {.n_docs = n,
                      .ids = (const char *const *)c->ids + from,
                      .doclens = c->doclens + from,
                      .embeddings = c->emb + c->offs[from] * c->dim,
                      .n_rows = c->offs[from + n] - c->offs[from],
                      .dim = c->dim,
                      .dtype = TARTAN_FLOAT32};
    int rc = tartan_add(db, &b, 0);
    ck_assert_msg(rc == 0, "add: %s", tartan_errmsg(db));
}

tartan_db *fx_build(fx_corpus *c, size_t n_docs, uint64_t seed)
{
    fx_corpus_default(c, n_docs, seed);
    tartan_db *db = fx_open(ixpath, TARTAN_CREATE, c->dim, 64);
    fx_add_range(db, c, 0, n_docs);
    return db;
}

tartan_queries fx_fixed_queries(const float *q, size_t nq, size_t lq, size_t dim)
{
    tartan_queries x = {.n_queries = nq,
                        .qlens = NULL,
                        .qlen = lq,
                        .embeddings = q,
                        .n_rows = nq * lq,
                        .dim = dim,
                        .dtype = TARTAN_FLOAT32};
    return x;
}

tartan_results *fx_search_ok(tartan_db *db, const tartan_queries *q, const tartan_search_params *p)
{
    tartan_results *r = NULL;
    int rc = tartan_search(db, q, p, &r);
    ck_assert_msg(rc == 0, "search: %s", tartan_errmsg(db));
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->n_queries, q->n_queries);
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

/* ---- double-precision references --------------------------------------------------------- */

double fx_maxsim_ref(const float *q, const uint8_t *qm, size_t lq, const float *d,
                     const uint8_t *dm, size_t ld, size_t dim, double *bound)
{
    size_t nd = 0;
    for (size_t t = 0; t < ld; t++)
        nd += !dm || dm[t];
    *bound = 0.0;
    if (nd == 0)
        return -INFINITY;
    double s = 0.0;
    for (size_t i = 0; i < lq; i++) {
        if (qm && !qm[i])
            continue;
        double mx = -INFINITY, mb = 0.0;
        for (size_t t = 0; t < ld; t++) {
            if (dm && !dm[t])
                continue;
            double dot = 0.0, ab = 0.0;
            for (size_t k = 0; k < dim; k++) {
                double p = (double)q[i * dim + k] * d[t * dim + k];
                dot += p;
                ab += fabs(p);
            }
            mx = dot > mx ? dot : mx;
            mb = ab > mb ? ab : mb;
        }
        s += mx;
        *bound += mb;
    }
    return s;
}

static int ref_cmp(const void *a, const void *b)
{
    const fx_ref_hit *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return (x->docno > y->docno) - (x->docno < y->docno);
}

fx_ref_hit *fx_reference(tartan_db *db, const float *q, size_t lq, size_t dim, size_t *n)
{
    double *qn = xmalloc(lq * dim * sizeof(double));
    for (size_t i = 0; i < lq; i++) {
        double ss = 0;
        for (size_t j = 0; j < dim; j++)
            ss += (double)q[i * dim + j] * q[i * dim + j];
        for (size_t j = 0; j < dim; j++)
            qn[i * dim + j] = q[i * dim + j] / sqrt(ss);
    }
    idx_reader r;
    store_msg m;
    ck_assert_int_eq(idx_reader_open(db->env, &r, &m), 0);
    fx_ref_hit *out = xmalloc((r.h.n_docs + 1) * sizeof *out);
    store_cursor *cur = NULL;
    uint32_t docno;
    kern_pdoc doc;
    size_t k = 0;
    int rc;
    while ((rc = idx_reader_next_doc(&r, &cur, &docno, &doc, &m)) == 1) {
        float *d = xmalloc((size_t)doc.ntok * dim * sizeof(float));
        idx_reader_decompress(&r, &doc, d);
        double s = 0;
        for (size_t i = 0; i < lq; i++) {
            double best = -INFINITY;
            for (size_t t = 0; t < doc.ntok; t++) {
                double v = 0;
                for (size_t j = 0; j < dim; j++)
                    v += qn[i * dim + j] * d[t * dim + j];
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

const fx_ref_hit *fx_ref_find(const fx_ref_hit *ref, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ref[i].id, id))
            return &ref[i];
    return NULL;
}

void fx_expect_exact(const tartan_results *r, size_t qi, const fx_ref_hit *ref, size_t nref,
                     size_t k)
{
    size_t want = k < nref ? k : nref;
    ck_assert_uint_eq(r->counts[qi], want);
    for (size_t j = 0; j < want; j++) {
        const tartan_hit *h = &r->hits[r->offsets[qi] + j];
        const fx_ref_hit *f = fx_ref_find(ref, nref, h->id);
        ck_assert_msg(f != NULL, "unknown id %s", h->id);
        ck_assert_msg(fabs(h->score - f->score) < 1e-4, "%s: %.6f vs reference %.6f", h->id,
                      h->score, f->score);
        ck_assert_msg(fabs(h->score - ref[j].score) < 1e-4, "rank %zu: %.6f vs %.6f", j, h->score,
                      ref[j].score);
    }
}

void fx_expect_same(const tartan_results *a, size_t qa, const tartan_results *b, size_t qb)
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

void fx_expect_identical(const tartan_results *a, const tartan_results *b, const char *what)
{
    ck_assert_msg(a->n_queries == b->n_queries, "%s: %zu queries against %zu", what, a->n_queries,
                  b->n_queries);
    for (size_t q = 0; q < a->n_queries; q++) {
        ck_assert_msg(a->counts[q] == b->counts[q], "%s: query %zu: %zu hits against %zu", what, q,
                      a->counts[q], b->counts[q]);
        for (size_t j = 0; j < a->counts[q]; j++) {
            const tartan_hit *x = &a->hits[a->offsets[q] + j], *y = &b->hits[b->offsets[q] + j];
            ck_assert_msg(!strcmp(x->id, y->id) &&
                              memcmp(&x->score, &y->score, sizeof x->score) == 0,
                          "%s: query %zu rank %zu: %s %.9g against %s %.9g", what, q, j, x->id,
                          (double)x->score, y->id, (double)y->score);
        }
    }
}

int fx_has_id(const tartan_results *r, size_t qi, const char *id)
{
    for (size_t j = 0; j < r->counts[qi]; j++)
        if (!strcmp(r->hits[r->offsets[qi] + j].id, id))
            return 1;
    return 0;
}

/* ---- the suite --------------------------------------------------------------------------- */

void (*fx_after_each)(void);

static const char *suite_name;
static unsigned suite_flags;

static void case_setup(void)
{
    if (suite_flags & FX_DIR)
        fixture_dir_create(suite_name);
}

static void case_teardown(void)
{
    if (fx_after_each)
        fx_after_each();
    if (suite_flags & FX_DIR)
        fixture_dir_remove();
}

int fx_run(const char *suite, const fx_case *cases, size_t n, unsigned flags, int timeout)
{
    if ((flags & FX_GPU) && kern_cuda_device_count() == 0) {
        printf("no CUDA GPU: skipped\n");
        return 77;
    }
    if (flags & FX_GPU)
        rng_init_random();
    suite_name = suite;
    suite_flags = flags;
    Suite *s = suite_create(suite);
    for (size_t i = 0; i < n; i++) {
        TCase *tc = tcase_create(cases[i].name);
        if ((flags & FX_DIR) || fx_after_each)
            tcase_add_checked_fixture(tc, case_setup, case_teardown);
        if (cases[i].timeout || timeout)
            tcase_set_timeout(tc, cases[i].timeout ? cases[i].timeout : timeout);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    SRunner *sr = srunner_create(s);
    if (flags & FX_GPU)
        srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
