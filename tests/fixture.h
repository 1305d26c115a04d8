/*
 * fixture.h: what the test programs share, so that a new case is a few lines:
 *  - a fresh temporary directory per test, with the path of an index inside it, removed after
 *    the test (Check runs setup and teardown in the forked child, so each test sees its own);
 *  - seeded random numbers (splitmix64: the same stream on every platform) and their uniform
 *    and Gaussian forms; allocation that fails the test instead of returning NULL;
 *  - a clustered random corpus (documents, ids, embeddings) and queries drawn from it;
 *  - an index opened and filled from such a corpus, searches checked for their layout;
 *  - double-precision MaxSim references (on raw vectors, and on an index's decompressed
 *    documents) and result lists compared with them or with each other;
 *  - a suite runner: one TCase per case, the table of cases as the program's main.
 * Each program draws from these what its data needs; data that differs on purpose (another
 * generator, another shape) stays in the program.
 */
#ifndef TARTAN_TESTS_FIXTURE_H
#define TARTAN_TESTS_FIXTURE_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "tartan.h"

/* ---- the temporary directory ------------------------------------------------------------ */

/* The current test's directory and the index path inside it ("<tmpdir>/ix"). */
extern char tmpdir[256];
extern char ixpath[300];

/* Creates $TMPDIR/tartan-<name>-XXXXXX (/tmp without TMPDIR; failing the test if it cannot). */
void fixture_dir_create(const char *name);

/* Removes the directory and everything below it, first making the directory and the index
 * writable again (tests that check read-only directories take the write bit away). */
void fixture_dir_remove(void);

/* "<tmpdir>/<name>" in one of four rotating static buffers (valid for the next three calls). */
const char *fx_path(const char *name);

/* Entries of tmpdir whose names do not start with a dot. */
size_t fx_count_dir_entries(void);

/* Writes len bytes to path, or reads the whole file (*len its size, NUL after the end). */
void fx_write_file(const char *path, const void *buf, size_t len);
void fx_write_text(const char *path, const char *text);
unsigned char *fx_read_file(const char *path, size_t *len);

/* ---- random numbers --------------------------------------------------------------------- */

/* The state of the shared stream; tests with a fixed seed set it directly. */
extern uint64_t rng_state;
/* The seed rng_init_random chose (0 until it is called). */
extern uint64_t rng_seed;

/* Seeds the shared stream from TARTAN_TEST_SEED, or from the time and the process id (a fresh
 * seed per test: Check forks one process per test), and prints it so a failure can be
 * replayed. */
void rng_init_random(void);

/* splitmix64 on an explicit state; uniform in (0, 1); a standard normal (Box-Muller). */
uint64_t rng_next(uint64_t *s);
double rng_uniform(uint64_t *s);
double rng_gauss(uint64_t *s);

/* The same on rng_state, and: uniform float in [-1, 1), uniform in lo..hi, below n. */
uint64_t rnd(void);
double unif(void);
double gauss(void);
float frnd(void);
size_t urnd(size_t lo, size_t hi);
size_t rnd_below(size_t n);

/* n random bytes. */
void fill_random(void *buf, size_t n);

/* ---- memory ------------------------------------------------------------------------------ */

/* malloc / calloc that fail the test rather than return NULL (a size of 0 allocates 1). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);

/* NaN into every output, so that a value the code forgets to write fails the comparison. */
void poison(float *x, size_t n);

/* x /= |x| (in double). */
void normalise(float *x, size_t dim);

/* ---- vectors in double ------------------------------------------------------------------ */

/* The inner product and the cosine of a and b, in double. */
double dot_d(const float *a, const float *b, size_t dim);
double cosine_d(const float *a, const float *b, size_t dim);

/*
 * A clustered set of unit vectors from its own stream (seed): ncl random unit centers, n points
 * normalise(center + sigma * g) with point i in cluster i % ncl. Per-dimension sigma gives a
 * within-cluster cosine of about 1 / sqrt(1 + sigma^2 dim).
 */
void fx_clustered(uint64_t seed, size_t n, size_t dim, size_t ncl, double sigma, float *centers,
                  float *x);

/* Index of the row of c [k, dim] with the largest inner product with v, in double (the first
 * of equals). */
uint32_t nearest_d(const float *c, size_t k, size_t dim, const float *v);

/* ---- a clustered random corpus ----------------------------------------------------------- */

/*
 * A corpus like ColBERT output in miniature: n_topics Gaussian topic centres; document i has
 * min_len..max_len tokens, draws 3 topics and fills its tokens with copies of them plus noise *
 * a standard normal (so tokens cluster and documents share clusters). Ids are
 * id_fmt % (first_id + i) (id_fmt a printf format with one %zu, "doc-%zu" by default).
 */
typedef struct fx_corpus_spec {
    size_t dim, n_docs, n_topics, min_len, max_len;
    double noise;
    const char *id_fmt;
    size_t first_id;
    int topic_per_value; /* each value (not each token) picks one of its document's 3 topics */
} fx_corpus_spec;

typedef struct fx_corpus {
    size_t dim, n_docs, n_rows, n_topics;
    size_t *doclens; /* [n_docs] */
    size_t *offs;    /* [n_docs + 1]: first row of each document */
    float *emb;      /* [n_rows, dim] */
    float *topics;   /* [n_topics, dim] */
    char **ids;      /* [n_docs] */
} fx_corpus;

/* Draws the corpus from rng_state (set it first for a fixed seed). */
void fx_corpus_make(fx_corpus *c, const fx_corpus_spec *spec);
void fx_corpus_free(fx_corpus *c);

/* The usual small corpus drawn from seed: 32 dimensions, 60 topics, n_docs documents of 4 to 40
 * tokens with noise 0.6, ids "doc-<i>". */
void fx_corpus_default(fx_corpus *c, size_t n_docs, uint64_t seed);

/* nq queries of lq tokens each (lens NULL) or of lens[i] tokens; each copies random tokens of
 * one random document plus noise * a standard normal. *rows_out gets the row count. */
float *fx_queries(const fx_corpus *c, size_t nq, size_t lq, const size_t *lens, double noise,
                  size_t *rows_out);

/* ---- an index ------------------------------------------------------------------------------ */

/* Opens path with o, failing the test (with tartan_errmsg) if it does not open. */
tartan_db *fx_open_with(const char *path, const tartan_options *o);

/* Opens path with flags, dim and n_centroids, the other options at their defaults. */
tartan_db *fx_open(const char *path, unsigned flags, size_t dim, size_t n_centroids);

/* Adds documents from..from+n-1 of c in one batch (fp32), failing the test on an error. */
void fx_add_range(tartan_db *db, const fx_corpus *c, size_t from, size_t n);

/* fx_corpus_default(c, n_docs, seed) in an index created at ixpath with 64 centroids (lists of
 * a few dozen documents each). */
tartan_db *fx_build(fx_corpus *c, size_t n_docs, uint64_t seed);

/* nq fp32 queries of lq rows each at q. */
tartan_queries fx_fixed_queries(const float *q, size_t nq, size_t lq, size_t dim);

/* tartan_search that must succeed; checks the results' layout (consecutive offsets, at most
 * k hits (p NULL: 10), non-empty ids, finite scores best first). */
tartan_results *fx_search_ok(tartan_db *db, const tartan_queries *q, const tartan_search_params *p);

/* ---- double-precision references --------------------------------------------------------- */

/*
 * MaxSim in double of lq query rows q against ld document rows d (masks NULL: all valid;
 * a masked row takes no part). *bound gets sum_i max_t sum_k |q_ik d_tk|, the scale of the
 * fp32 rounding error. No valid document row: -inf.
 */
double fx_maxsim_ref(const float *q, const uint8_t *qm, size_t lq, const float *d,
                     const uint8_t *dm, size_t ld, size_t dim, double *bound);

/* One document's reference score. */
typedef struct fx_ref_hit {
    char id[64];
    double score;
    uint32_t docno;
} fx_ref_hit;

/* Brute-force MaxSim of query q [lq, dim] (normalised here, in double) against every live
 * document of db, decompressed by the codec: all of them, best first (ties by docno); *n the
 * count. */
fx_ref_hit *fx_reference(tartan_db *db, const float *q, size_t lq, size_t dim, size_t *n);

/* The reference entry of id (NULL if none). */
const fx_ref_hit *fx_ref_find(const fx_ref_hit *ref, size_t n, const char *id);

/* Query qi's results equal the reference's top k (ties aside): every returned id has the
 * reference's score within 1e-4, and at rank j the reference's j-th score. */
void fx_expect_exact(const tartan_results *r, size_t qi, const fx_ref_hit *ref, size_t nref,
                     size_t k);

/* Two results equal: same ids in the same order, scores within 1e-5; only a tie (scores within
 * 1e-6) may swap two documents. */
void fx_expect_same(const tartan_results *a, size_t qa, const tartan_results *b, size_t qb);

/* Two whole results identical: the same queries, counts and ids in the same order, and the
 * scores bit for bit; what names the comparison in a failure's message. */
void fx_expect_identical(const tartan_results *a, const tartan_results *b, const char *what);

/* Whether id is among query qi's hits. */
int fx_has_id(const tartan_results *r, size_t qi, const char *id);

/* ---- the suite --------------------------------------------------------------------------- */

/* One test case: its TCase name, its test, its timeout in seconds (0: the suite's). */
typedef struct fx_case {
    const char *name;
    const TTest *test;
    int timeout;
} fx_case;

/* fx_run's flags: each case in a fresh directory (fixture_dir_create(suite)); a GPU program
 * (skipped, 77, without a CUDA GPU; one seed for the run, from rng_init_random; no fork, since
 * a CUDA context does not survive one). */
enum { FX_DIR = 1, FX_GPU = 2 };

/* Runs cases as suite `suite`, one TCase each, with flags (FX_*); timeout: seconds per case
 * (0: Check's default, which make check sets through CK_DEFAULT_TIMEOUT). Returns the
 * program's exit status. */
/* When set, called after each case (before its directory is removed): state a case may leave
 * behind in a program that does not fork, such as environment variables. */
extern void (*fx_after_each)(void);

int fx_run(const char *suite, const fx_case *cases, size_t n, unsigned flags, int timeout);
#define FX_RUN(suite, cases, flags, timeout)                                                       \
    fx_run(suite, cases, sizeof cases / sizeof cases[0], flags, timeout)

#endif
