/*
 * fuzz_search.c: libFuzzer target for tartan_search's arguments against a real index on tmpfs
 * (200 documents, dim 8, 16 centroids). The input picks the query batch (count, ragged or
 * fixed lengths, dtype, generated or raw values, a wrong dim or row count) and the parameters
 * (k, ncells, threshold, ndocs, exhaustive, subset ids, threads). A call either fails with
 * a named code and no results, or returns results that hold together: counts within k,
 * offsets that add up, finite scores best first, no more than the query's token count (each
 * query token adds at most a cosine of 1), ids of the index and of the subset.
 *
 * Input layout: byte 0 queries (0..4) and flags, byte 1 dtype, byte 2 k, byte 3 ncells,
 * byte 4 ndocs, byte 5 threshold, byte 6 subset size, byte 7 threads; then per query a length
 * byte; then subset ids (a byte each: a document number, 255 an unknown id, 254 an empty one);
 * the rest raw values.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tartan.h"

#define DIM 8
#define NDOCS 200
enum {
    F_RAW = 8,      /* query values from the input */
    F_RAGGED = 16,  /* qlens given */
    F_BADDIM = 32,  /* dim one off */
    F_BADROWS = 64, /* n_rows one off */
    F_EXHAUSTIVE = 128
};

static char dir[64];
static tartan_db *db;

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void cleanup(void)
{
    tartan_close(db);
    db = NULL;
    if (dir[0])
        nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static float rnd_value(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void open_index(void)
{
    snprintf(dir, sizeof dir, "/dev/shm/tartan-fuzzs-%d", (int)getpid());
    if (access("/dev/shm", W_OK) != 0)
        snprintf(dir, sizeof dir, "/tmp/tartan-fuzzs-%d", (int)getpid());
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = 16;
    if (tartan_open(dir, &o, &db))
        abort();
    static char idb[NDOCS][8];
    static const char *ids[NDOCS];
    static size_t lens[NDOCS];
    size_t rows = 0;
    uint64_t s = 7;
    for (size_t i = 0; i < NDOCS; i++) {
        snprintf(idb[i], sizeof idb[i], "d%zu", i);
        ids[i] = idb[i];
        lens[i] = 1 + (size_t)((rnd_value(&s) + 1) * 3);
        rows += lens[i];
    }
    float *x = malloc(rows * DIM * sizeof *x);
    if (!x)
        abort();
    for (size_t i = 0; i < rows * DIM; i++)
        x[i] = rnd_value(&s);
    tartan_batch b = {NDOCS, ids, lens, x, rows, DIM, TARTAN_FLOAT32};
    if (tartan_add(db, &b, 0))
        abort();
    free(x);
    atexit(cleanup);
}

/* Is id one of the index's ("d0".."d199")? Its number, or -1. */
static int doc_of(const char *id)
{
    if (id[0] != 'd' || !id[1])
        return -1;
    char *end;
    long v = strtol(id + 1, &end, 10);
    return *end || v < 0 || v >= NDOCS ? -1 : (int)v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!db)
        open_index();
    if (size < 8)
        return 0;
    unsigned fl = data[0];
    size_t nq = fl % 5;
    int dtype = data[1] % 4 == 3 ? (int)data[1] : (int)(data[1] % 3);
    size_t p = 8, rows = 0;
    size_t qlens[4], qlen = 1 + data[p < size ? p : 0] % 5;
    for (size_t i = 0; i < nq; i++) {
        qlens[i] = p < size ? data[p++] % 7 : 1; /* 0: an empty query */
        rows += (fl & F_RAGGED) ? qlens[i] : qlen;
    }
    tartan_search_params sp;
    size_t k = data[2] == 255 ? (size_t)-1 : data[2] == 254 ? TARTAN_MAX_K + 1 : data[2] % 40;
    tartan_search_params_init(&sp, k);
    if (data[3] < 200)
        sp.ncells = data[3] % 20;
    if (data[4] < 200)
        sp.ndocs = data[4];
    if (data[5] < 100)
        sp.centroid_score_threshold = (float)data[5] / 50.0f - 1.0f;
    else if (data[5] == 255)
        sp.centroid_score_threshold = NAN;
    sp.exhaustive = (fl & F_EXHAUSTIVE) != 0;
    sp.threads = data[7] % 4 == 3 ? -1 : data[7] % 4;
    /* Subset: up to 16 ids. */
    static char sb[16][8];
    const char *subset[16];
    size_t ns = data[6] % 18; /* 16, 17: NULL subset */
    int allowed[NDOCS] = {0};
    if (ns <= 16) {
        for (size_t i = 0; i < ns; i++) {
            uint8_t c = p < size ? data[p++] : 0;
            if (c == 254)
                sb[i][0] = 0;
            else if (c == 255)
                snprintf(sb[i], sizeof sb[i], "zz");
            else {
                snprintf(sb[i], sizeof sb[i], "d%u", c % NDOCS);
                allowed[c % NDOCS] = 1;
            }
            subset[i] = sb[i];
        }
        sp.subset = subset;
        sp.n_subset = ns;
    }
    size_t esz = dtype == TARTAN_FLOAT32 ? 4 : 2;
    uint8_t *emb = malloc(rows * DIM * esz + 1);
    if (!emb)
        return 0;
    uint64_t s = size;
    for (size_t i = 0; i < rows * DIM; i++) {
        if (fl & F_RAW) {
            for (size_t b = 0; b < esz; b++)
                emb[i * esz + b] = p < size ? data[p++] : (uint8_t)i;
            continue;
        }
        float v = rnd_value(&s);
        uint32_t u;
        memcpy(&u, &v, 4);
        if (esz == 4) {
            memcpy(emb + 4 * i, &v, 4);
        } else {
            uint16_t h = dtype == TARTAN_BFLOAT16 ? (uint16_t)(u >> 16)
                                                  : (uint16_t)(0x3800 | (u >> 20 & 0x3ff));
            memcpy(emb + 2 * i, &h, 2);
        }
    }
    tartan_queries q = {nq,
                        (fl & F_RAGGED) ? qlens : NULL,
                        qlen,
                        emb,
                        rows + ((fl & F_BADROWS) ? 1 : 0),
                        DIM + ((fl & F_BADDIM) ? 1 : 0),
                        (tartan_dtype)dtype};
    tartan_results *res = (tartan_results *)1;
    int rc = tartan_search(db, &q, &sp, &res);
    if (rc != 0) {
        if (res != NULL || tartan_errmsg(db)[0] != 'T')
            abort();
    } else {
        if (res->n_queries != nq || res->offsets[0] != 0)
            abort();
        for (size_t i = 0; i < nq; i++) {
            size_t lq = (fl & F_RAGGED) ? qlens[i] : qlen;
            if (res->counts[i] > k || res->offsets[i + 1] != res->offsets[i] + res->counts[i])
                abort();
            for (size_t j = 0; j < res->counts[i]; j++) {
                const tartan_hit *h = &res->hits[res->offsets[i] + j];
                int d = doc_of(h->id);
                if (d < 0 || !isfinite(h->score) || h->score > (float)lq * 1.001f + 1e-4f)
                    abort();
                if (sp.subset && !allowed[d])
                    abort();
                if (j > 0 && h->score > res->hits[res->offsets[i] + j - 1].score)
                    abort();
            }
        }
        tartan_results_free(res);
    }
    free(emb);
    return 0;
}
