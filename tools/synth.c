/* synth.c: the synthetic corpus model described in synth.h. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"
#include "tartan.h"

/* The most frequent terms play function words (the, of, [CLS], punctuation). */
#define FUNCTION_TERMS 64

/* Model V3 maps tokens through a dim x dim matrix: keep dim modest there. */
#define V3_MAX_DIM 4096

struct tool_synth {
    tool_synth_params p;
    float *centres; /* [n_terms, dim], unit norm */
    double *cdf;    /* [n_terms], Zipf cumulative frequencies, cdf[n_terms - 1] == 1 */
    /* Model V3: the anisotropic map, row-major [dim, dim], and the mean direction [dim]. */
    float *aniso;
    float *mean_dir;
};

/* splitmix64: a tiny, well-mixed generator; one stream per (seed, item, purpose). */
typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next_u64(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static rng stream(uint64_t seed, uint64_t kind, uint64_t item)
{
    rng r = {seed ^ (kind * 0xd1b54a32d192ed03ull)};
    r.s = next_u64(&r) ^ (item * 0x8cb92ba72f3d8dd7ull);
    next_u64(&r);
    return r;
}

static double uniform(rng *r) /* [0, 1) */
{
    return (double)(next_u64(r) >> 11) * 0x1.0p-53;
}

static double normal(rng *r)
{
    /* Box-Muller; 1 - u keeps the log's argument in (0, 1]. */
    double u = 1.0 - uniform(r), v = uniform(r);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void add_noise(rng *r, float *x, size_t dim, float norm)
{
    float s = norm / sqrtf((float)dim);
    for (size_t j = 0; j < dim; j++)
        x[j] += s * (float)normal(r);
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

/* A term drawn by Zipf frequency among ranks [lo, hi). */
static size_t draw_term(const tool_synth *s, rng *r, size_t lo, size_t hi)
{
    double base = lo ? s->cdf[lo - 1] : 0.0;
    double u = base + uniform(r) * (s->cdf[hi - 1] - base);
    size_t a = lo, b = hi - 1;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (s->cdf[m] < u)
            a = m + 1;
        else
            b = m;
    }
    return a;
}

void tool_synth_params_model(tool_synth_params *p, int model)
{
    p->model = model == TOOL_SYNTH_V1 || model == TOOL_SYNTH_V3 ? model : TOOL_SYNTH_V2;
    p->len_sigma = model == TOOL_SYNTH_V3 ? 1.0f : 0.5f;
    p->aniso_mean = p->aniso_rank = p->run_prob = p->run_noise = p->negatives = 0.f;
    if (p->model == TOOL_SYNTH_V3) {
        p->aniso_mean = 0.6f;
        p->aniso_rank = 16.f;
        p->run_prob = 0.5f;
        p->run_noise = 0.15f;
        p->negatives = 0.25f;
    }
    if (p->model == TOOL_SYNTH_V1) {
        p->noise = 0.45f;
        p->context = 0.3f;
        p->query_context = 0.f;
        p->query_content = 0.f;
        p->group_docs = 0;
        p->group_terms = 0.f;
        p->group_context = 0.f;
    } else {
        /* Calibrated against SciFact / MiniLM token statistics (bench/RESULTS.md); V3 keeps
         * them for its latent space. */
        p->noise = 0.5f;
        p->context = 0.6f;
        p->query_context = 0.8f;
        p->query_content = 1.f;
        p->group_docs = 200;
        p->group_terms = 0.6f;
        p->group_context = 0.7f;
    }
}

void tool_synth_params_init(tool_synth_params *p)
{
    memset(p, 0, sizeof *p);
    p->dim = 128;
    p->zipf = 1.0;
    p->len_mean = 100;
    p->len_min = 8;
    p->topics = 12;
    p->function_frac = 0.2f;
    p->qlen = 32;
    p->seed = 42;
    tool_synth_params_model(p, TOOL_SYNTH_V2);
}

/*
 * Model V3's map M = U diag(sc): U a random orthogonal matrix (Gram-Schmidt over Gaussian
 * columns, in double), sc_k = c / (1 + k / aniso_rank) with c making E|M x|^2 = 1 for a unit
 * isotropic x; and a random unit mean direction. 0 or -1 (no memory).
 */
static int aniso_new(tool_synth *s)
{
    const size_t dim = s->p.dim;
    double *u = malloc(dim * dim * sizeof *u);
    s->aniso = malloc(dim * dim * sizeof *s->aniso);
    s->mean_dir = malloc(dim * sizeof *s->mean_dir);
    if (!u || !s->aniso || !s->mean_dir) {
        free(u);
        return -1;
    }
    /* Column k of U is u[k * dim ...]. */
    rng r = stream(s->p.seed, 6, 0);
    for (size_t k = 0; k < dim; k++) {
        double *col = u + k * dim;
        for (;;) {
            for (size_t j = 0; j < dim; j++)
                col[j] = normal(&r);
            for (size_t i = 0; i < k; i++) { /* twice: Gram-Schmidt's lost orthogonality */
                for (int pass = 0; pass < 2; pass++) {
                    const double *prev = u + i * dim;
                    double d = 0;
                    for (size_t j = 0; j < dim; j++)
                        d += prev[j] * col[j];
                    for (size_t j = 0; j < dim; j++)
                        col[j] -= d * prev[j];
                }
            }
            double n = 0;
            for (size_t j = 0; j < dim; j++)
                n += col[j] * col[j];
            if (n > 1e-6) {
                n = 1.0 / sqrt(n);
                for (size_t j = 0; j < dim; j++)
                    col[j] *= n;
                break;
            }
        }
    }
    double sum = 0;
    for (size_t k = 0; k < dim; k++) {
        double sc = 1.0 / (1.0 + (double)k / s->p.aniso_rank);
        sum += sc * sc;
    }
    double c = sqrt((double)dim / sum);
    for (size_t i = 0; i < dim; i++)
        for (size_t k = 0; k < dim; k++)
            s->aniso[i * dim + k] =
                (float)(u[k * dim + i] * c / (1.0 + (double)k / s->p.aniso_rank));
    for (size_t j = 0; j < dim; j++)
        s->mean_dir[j] = (float)normal(&r);
    normalise(s->mean_dir, dim);
    free(u);
    return 0;
}

/* Model V3: x (unit, latent) -> normalise(a mean + b M x), a^2 + b^2 = 1. tmp [dim]. */
static void aniso_apply(const tool_synth *s, float *x, float *tmp)
{
    const size_t dim = s->p.dim;
    const float a = s->p.aniso_mean, b = sqrtf(1.f - a * a);
    for (size_t i = 0; i < dim; i++) {
        const float *row = s->aniso + i * dim;
        float acc = 0.f;
        for (size_t k = 0; k < dim; k++)
            acc += row[k] * x[k];
        tmp[i] = a * s->mean_dir[i] + b * acc;
    }
    memcpy(x, tmp, dim * sizeof *x);
    normalise(x, dim);
}

int tool_synth_new(const tool_synth_params *in, tool_synth **out)
{
    *out = NULL;
    tool_synth_params p = *in;
    if (p.dim == 0 || p.dim > 65536 || p.len_mean == 0 || p.qlen == 0 || p.topics == 0)
        return TARTAN_EINVAL;
    if (p.model != TOOL_SYNTH_V1 && p.model != TOOL_SYNTH_V2 && p.model != TOOL_SYNTH_V3)
        return TARTAN_EINVAL;
    if (p.model == TOOL_SYNTH_V3 &&
        (p.dim > V3_MAX_DIM || !(p.aniso_mean >= 0.f && p.aniso_mean < 1.f) ||
         !(p.aniso_rank >= 1.f && p.aniso_rank <= 65536.f) ||
         !(p.run_prob >= 0.f && p.run_prob < 1.f) ||
         !(p.run_noise >= 0.f && p.run_noise <= 100.f) ||
         !(p.negatives >= 0.f && p.negatives <= 1.f)))
        return TARTAN_EINVAL;
    if (!(p.len_sigma >= 0.f && p.len_sigma <= 4.f))
        return TARTAN_EINVAL;
    /* Negated comparisons also refuse NaN. */
    if (!(p.noise >= 0.f && p.noise <= 100.f) || !(p.context >= 0.f && p.context <= 100.f) ||
        !(p.function_frac >= 0.f && p.function_frac <= 1.f) ||
        !(p.query_context >= 0.f && p.query_context <= 1.f) ||
        !(p.query_content >= 0.f && p.query_content <= 1.f) ||
        !(p.group_terms >= 0.f && p.group_terms <= 1.f) ||
        !(p.group_context >= 0.f && p.group_context <= 1.f) || !(p.zipf >= 0.0 && p.zipf <= 10.0))
        return TARTAN_EINVAL;
    if (p.len_min == 0)
        p.len_min = 1;
    if (p.len_max == 0) /* V3's lengths have a heavier tail */
        p.len_max = (p.model == TOOL_SYNTH_V3 ? 8 : 4) * p.len_mean;
    if (p.len_max < p.len_min || p.len_mean < p.len_min || p.len_mean > p.len_max)
        return TARTAN_EINVAL;
    if (p.n_terms == 0) {
        double tokens = (double)(p.n_docs ? p.n_docs : 1) * (double)p.len_mean;
        p.n_terms = (size_t)(4.0 * sqrt(tokens));
        if (p.n_terms < 4 * FUNCTION_TERMS)
            p.n_terms = 4 * FUNCTION_TERMS;
    }
    if (p.n_terms <= FUNCTION_TERMS || p.n_terms > ((size_t)1 << 26))
        return TARTAN_EINVAL;

    tool_synth *s = calloc(1, sizeof *s);
    if (!s)
        return ENOMEM;
    s->p = p;
    s->centres = malloc(p.n_terms * p.dim * sizeof(float));
    s->cdf = malloc(p.n_terms * sizeof(double));
    if (!s->centres || !s->cdf) {
        tool_synth_free(s);
        return ENOMEM;
    }
    double total = 0;
    for (size_t t = 0; t < p.n_terms; t++) {
        total += pow((double)(t + 1), -p.zipf);
        s->cdf[t] = total;
    }
    for (size_t t = 0; t < p.n_terms; t++)
        s->cdf[t] /= total;
    s->cdf[p.n_terms - 1] = 1.0;
    for (size_t t = 0; t < p.n_terms; t++) {
        rng r = stream(p.seed, 1, t);
        float *c = s->centres + t * p.dim;
        for (size_t j = 0; j < p.dim; j++)
            c[j] = (float)normal(&r);
        normalise(c, p.dim);
    }
    if (p.model == TOOL_SYNTH_V3 && aniso_new(s) != 0) {
        tool_synth_free(s);
        return ENOMEM;
    }
    *out = s;
    return 0;
}

void tool_synth_free(tool_synth *s)
{
    if (!s)
        return;
    free(s->centres);
    free(s->cdf);
    free(s->aniso);
    free(s->mean_dir);
    free(s);
}

size_t tool_synth_doclen(const tool_synth *s, size_t i)
{
    /* Log-normal lengths (mean-preserving), clipped: ColBERT passage lengths are skewed with a
     * long tail (sigma 0.5); V3's heavier one (1.0) mixes short passages with long pages. */
    rng r = stream(s->p.seed, 2, i);
    double sg = s->p.len_sigma;
    double len = (double)s->p.len_mean * exp(sg * normal(&r) - 0.5 * sg * sg);
    size_t n = (size_t)(len + 0.5);
    if (n < s->p.len_min)
        n = s->p.len_min;
    if (n > s->p.len_max)
        n = s->p.len_max;
    return n;
}

/*
 * A document's topic terms and, when ctx is not NULL, its context [dim] (scratch: 2 * dim
 * floats), drawn from its stream r = stream(seed, 3, doc), which is left where the document's
 * tokens start. Model V2 puts documents into topic groups of about group_docs documents (as
 * a real collection has many documents on one subject): a group has its own topic terms and
 * context; a document takes each of its topic terms from its group's list with probability
 * group_terms, and group_context of its context from its group's (the norm kept).
 */
static void doc_topics(const tool_synth *s, rng *r, size_t *topics, size_t nt, float *ctx,
                       float *scratch)
{
    const size_t dim = s->p.dim;
    size_t groups = s->p.group_docs ? s->p.n_docs / s->p.group_docs : 0;
    if (s->p.model == TOOL_SYNTH_V1 || groups == 0) {
        for (size_t k = 0; k < nt; k++)
            topics[k] = draw_term(s, r, FUNCTION_TERMS, s->p.n_terms);
        if (ctx) {
            memset(ctx, 0, dim * sizeof(float));
            add_noise(r, ctx, dim, s->p.context);
        }
        return;
    }
    rng g = stream(s->p.seed, 5, next_u64(r) % groups);
    for (size_t k = 0; k < nt; k++) {
        size_t own = draw_term(s, r, FUNCTION_TERMS, s->p.n_terms);
        size_t shared = draw_term(s, &g, FUNCTION_TERMS, s->p.n_terms);
        topics[k] = uniform(r) < s->p.group_terms ? shared : own;
    }
    if (ctx) {
        float *own = scratch, *shared = scratch + dim;
        memset(own, 0, dim * sizeof(float));
        add_noise(r, own, dim, s->p.context);
        memset(shared, 0, dim * sizeof(float));
        add_noise(&g, shared, dim, s->p.context);
        float a = s->p.group_context, b = sqrtf(1.f - a * a);
        for (size_t j = 0; j < dim; j++)
            ctx[j] = a * shared[j] + b * own[j];
    }
}

void tool_synth_doc(const tool_synth *s, size_t i, float *out)
{
    const size_t dim = s->p.dim, len = tool_synth_doclen(s, i);
    rng r = stream(s->p.seed, 3, i);
    size_t topics[64];
    size_t nt = s->p.topics < 64 ? s->p.topics : 64;
    /* The document's context, shared by its tokens. */
    float ctx_buf[3 * 1024];
    float *ctx = dim <= 1024 ? ctx_buf : NULL;
    float *ctx_heap = NULL;
    if (!ctx)
        ctx = ctx_heap = malloc(3 * dim * sizeof(float));
    doc_topics(s, &r, topics, nt, ctx, ctx ? ctx + dim : NULL);
    if (!ctx) /* no memory: fall back to no context, still a valid document */
        memset(out, 0, len * dim * sizeof(float));
    /* V3: the previous token's latent vector (runs) and the map's scratch, in ctx's spare
     * room (3 * dim floats: the context, then two of scratch). */
    float *prev = ctx ? ctx + dim : NULL, *tmp = ctx ? ctx + 2 * dim : NULL;
    int v3 = s->p.model == TOOL_SYNTH_V3 && ctx;
    for (size_t t = 0; t < len; t++) {
        float *x = out + t * dim;
        if (v3 && t > 0 && uniform(&r) < s->p.run_prob) {
            /* A near-duplicate of the previous token. */
            memcpy(x, prev, dim * sizeof(float));
            add_noise(&r, x, dim, s->p.run_noise);
            normalise(x, dim);
        } else {
            size_t term = uniform(&r) < s->p.function_frac ? draw_term(s, &r, 0, FUNCTION_TERMS)
                                                           : topics[next_u64(&r) % nt];
            memcpy(x, s->centres + term * dim, dim * sizeof(float));
            if (ctx)
                for (size_t j = 0; j < dim; j++)
                    x[j] += ctx[j];
            add_noise(&r, x, dim, s->p.noise);
            normalise(x, dim);
        }
        if (v3) {
            memcpy(prev, x, dim * sizeof(float));
            aniso_apply(s, x, tmp);
        }
    }
    free(ctx_heap);
}

/* Expansion tokens, like ColBERT's [MASK] padding: near the mean of the content tokens. */
static void expansion_tokens(const tool_synth *s, rng *r, float *out, size_t content)
{
    const size_t dim = s->p.dim;
    for (size_t t = content; t < s->p.qlen; t++) {
        float *x = out + t * dim;
        memset(x, 0, dim * sizeof(float));
        for (size_t c = 0; c < content; c++)
            for (size_t k = 0; k < dim; k++)
                x[k] += out[c * dim + k];
        normalise(x, dim);
        add_noise(r, x, dim, 0.6f);
        normalise(x, dim);
    }
}

/*
 * Model V2: the query is about its document's topic, so its context is mostly the document's
 * (query_context of it, the rest its own, the norm kept); its tokens are drawn like a
 * document's (function terms at function_frac), content terms mostly the document's topics
 * (70%), the others any term (users ask in other words).
 */
static void query_v2(const tool_synth *s, rng *r, rng *dr, size_t *topics, size_t nt, float *out)
{
    /* V3: a hard negative, another document whose topics and context some content tokens
     * take instead (drawn first, so that V2's queries stay as they were). */
    size_t neg_topics[64];
    float neg_ctx[3 * 1024];
    int negs = s->p.model == TOOL_SYNTH_V3 && s->p.negatives > 0.f && s->p.dim <= 1024;
    if (negs) {
        rng nr = stream(s->p.seed, 3, (size_t)(next_u64(r) % (s->p.n_docs ? s->p.n_docs : 1)));
        doc_topics(s, &nr, neg_topics, nt, neg_ctx, neg_ctx + s->p.dim);
    }
    const size_t dim = s->p.dim, qlen = s->p.qlen;
    size_t content = (size_t)((double)qlen * s->p.query_content + 0.5);
    if (content == 0)
        content = 1;
    if (content > qlen)
        content = qlen;
    float ctx_buf[3 * 1024];
    float *ctx = dim <= 1024 ? ctx_buf : malloc(3 * dim * sizeof(float));
    /* The document's topics and context, drawn from its stream as tool_synth_doc draws them. */
    doc_topics(s, dr, topics, nt, ctx, ctx ? ctx + dim : NULL);
    if (ctx) {
        float *own = ctx + dim;
        memset(own, 0, dim * sizeof(float));
        add_noise(r, own, dim, s->p.context);
        float a = s->p.query_context, b = sqrtf(1.f - a * a);
        for (size_t k = 0; k < dim; k++)
            ctx[k] = a * ctx[k] + b * own[k];
    }
    for (size_t t = 0; t < content; t++) {
        float *x = out + t * dim;
        size_t term;
        const float *tc = ctx;
        if (negs && uniform(r) < s->p.negatives) {
            term = neg_topics[next_u64(r) % nt];
            tc = neg_ctx;
        } else if (uniform(r) < s->p.function_frac)
            term = draw_term(s, r, 0, FUNCTION_TERMS);
        else if (uniform(r) < 0.7)
            term = topics[next_u64(r) % nt];
        else
            term = draw_term(s, r, FUNCTION_TERMS, s->p.n_terms);
        memcpy(x, s->centres + term * dim, dim * sizeof(float));
        if (tc)
            for (size_t k = 0; k < dim; k++)
                x[k] += tc[k];
        add_noise(r, x, dim, s->p.noise);
        normalise(x, dim);
    }
    if (ctx != ctx_buf)
        free(ctx);
    expansion_tokens(s, r, out, content);
    if (s->p.model == TOOL_SYNTH_V3) {
        float tmp[1024];
        float *t = dim <= 1024 ? tmp : malloc(dim * sizeof *t);
        if (t)
            for (size_t q = 0; q < qlen; q++)
                aniso_apply(s, out + q * dim, t);
        if (t != tmp)
            free(t);
    }
}

void tool_synth_query(const tool_synth *s, size_t j, float *out, size_t *relevant)
{
    const size_t dim = s->p.dim, qlen = s->p.qlen;
    rng r = stream(s->p.seed, 4, j);
    size_t doc = (size_t)(next_u64(&r) % (s->p.n_docs ? s->p.n_docs : 1));
    if (relevant)
        *relevant = doc;
    /* The relevant document's topic terms, drawn from its own stream exactly as
     * tool_synth_doc draws them. */
    rng dr = stream(s->p.seed, 3, doc);
    size_t topics[64];
    size_t nt = s->p.topics < 64 ? s->p.topics : 64;
    if (s->p.model != TOOL_SYNTH_V1) {
        query_v2(s, &r, &dr, topics, nt, out);
        return;
    }
    doc_topics(s, &dr, topics, nt, NULL, NULL);
    /* Model V1. */
    /* Content tokens, a third to a half of the query: mostly the document's terms in the
     * query's own context, some terms the document lacks (users ask in other words). */
    size_t content = qlen / 3 + (size_t)(next_u64(&r) % (qlen / 6 + 1));
    if (content == 0)
        content = 1;
    float ctx_buf[1024];
    float *ctx = dim <= 1024 ? ctx_buf : malloc(dim * sizeof(float));
    if (ctx) {
        memset(ctx, 0, dim * sizeof(float));
        add_noise(&r, ctx, dim, s->p.context);
    }
    for (size_t t = 0; t < content; t++) {
        float *x = out + t * dim;
        size_t term = uniform(&r) < 0.7 ? topics[next_u64(&r) % nt]
                                        : draw_term(s, &r, FUNCTION_TERMS, s->p.n_terms);
        memcpy(x, s->centres + term * dim, dim * sizeof(float));
        if (ctx)
            for (size_t k = 0; k < dim; k++)
                x[k] += ctx[k];
        add_noise(&r, x, dim, s->p.noise);
        normalise(x, dim);
    }
    if (ctx != ctx_buf)
        free(ctx);
    expansion_tokens(s, &r, out, content);
}
