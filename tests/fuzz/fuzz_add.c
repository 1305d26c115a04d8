/*
 * fuzz_add.c: libFuzzer target for the public API's arguments: tartan_add (and tartan_delete)
 * with batches decoded from the input against a real index on tmpfs. Whatever the batch, a
 * call either succeeds or fails leaving the index's counts as they were, and the index stays
 * sound (tartan_check every 64 runs). Values come from a seeded generator unless the input
 * asks for its raw bytes (NaN, infinities, zero tokens, subnormals).
 *
 * Input layout: byte 0 documents (0..7); byte 1 flags (see F_ below); byte 2 dtype; then per
 * document a length byte (0..6 tokens, 255 = 1,048,577) and an id (length byte 0..15, bytes);
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
enum {
    F_REPLACE = 1,   /* TARTAN_REPLACE */
    F_RAW = 2,       /* embeddings from the input's bytes */
    F_BADDIM = 4,    /* batch.dim one off */
    F_BADROWS = 8,   /* n_rows one off */
    F_NULLIDS = 16,  /* ids NULL */
    F_NULLID = 32,   /* one id NULL */
    F_KEEP = 64,     /* do not delete the batch afterwards */
    F_BADFLAGS = 128 /* an unknown flag */
};

static char dir[64];
static tartan_db *db;
static unsigned long runs;

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

/* A fresh trained index (tmpfs: commits cost no disk flushes). */
static void open_index(void)
{
    cleanup();
    snprintf(dir, sizeof dir, "/dev/shm/tartan-fuzz-%d", (int)getpid());
    if (access("/dev/shm", W_OK) != 0)
        snprintf(dir, sizeof dir, "/tmp/tartan-fuzz-%d", (int)getpid());
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_CREATE;
    o.dim = DIM;
    o.n_centroids = 8;
    if (tartan_open(dir, &o, &db))
        abort();
    enum { N = 64 };
    static float x[N * DIM];
    static size_t lens[N];
    uint64_t s = 1;
    for (size_t i = 0; i < N * DIM; i++)
        x[i] = rnd_value(&s);
    for (size_t i = 0; i < N; i++)
        lens[i] = 1;
    tartan_batch b = {N, NULL, lens, x, N, DIM, TARTAN_FLOAT32};
    if (tartan_train(db, &b, 0))
        abort();
}

static void counts(uint64_t *docs, uint64_t *toks)
{
    tartan_index_info i;
    if (tartan_info(db, &i))
        abort();
    *docs = i.n_docs;
    *toks = i.n_tokens;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!db) {
        open_index();
        atexit(cleanup);
    }
    if (size < 3)
        return 0;
    size_t n = data[0] % 8;
    unsigned fl = data[1], dt = data[2];
    size_t p = 3;
    char idbuf[8][16];
    const char *ids[8];
    size_t lens[8], rows = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t l = p < size ? data[p++] : 1;
        lens[i] = l == 255 ? ((size_t)1 << 20) + 1 : l % 7;
        if (lens[i] <= 6)
            rows += lens[i];
        size_t il = p < size ? data[p++] % 16 : 1;
        if (il > size - p)
            il = size - p;
        memcpy(idbuf[i], data + p, il);
        idbuf[i][il] = 0;
        p += il;
        ids[i] = idbuf[i];
    }
    if (fl & F_NULLID && n)
        ids[data[0] % n] = NULL;
    int dtype = dt % 4 == 3 ? (int)dt : (int)(dt % 3); /* mostly valid, sometimes not */
    size_t esz = dtype == TARTAN_FLOAT32 ? 4 : 2;
    size_t want = rows * DIM * esz;
    uint8_t *emb = malloc(want ? want : 1);
    if (!emb)
        return 0;
    if (fl & F_RAW) {
        for (size_t i = 0; i < want; i++)
            emb[i] = p + i < size ? data[p + i] : (uint8_t)i;
    } else {
        uint64_t s = size * 31 + data[0];
        for (size_t i = 0; i < rows * DIM; i++) {
            float v = rnd_value(&s);
            if (esz == 4) {
                memcpy(emb + 4 * i, &v, 4);
            } else {
                /* bfloat16 is float32's top half; as half it is some finite value too */
                uint32_t u;
                memcpy(&u, &v, 4);
                uint16_t h = dtype == TARTAN_BFLOAT16 ? (uint16_t)(u >> 16)
                                                      : (uint16_t)(0x3800 | (u >> 20 & 0x3ff));
                memcpy(emb + 2 * i, &h, 2);
            }
        }
    }
    tartan_batch b = {n,
                      fl & F_NULLIDS ? NULL : ids,
                      lens,
                      emb,
                      rows + (fl & F_BADROWS ? 1 : 0),
                      DIM + (fl & F_BADDIM ? 1 : 0),
                      (tartan_dtype)dtype};
    uint64_t d0, t0, d1, t1;
    counts(&d0, &t0);
    int rc = tartan_add(db, &b, (fl & F_REPLACE ? TARTAN_REPLACE : 0) | (fl & F_BADFLAGS ? 8 : 0));
    counts(&d1, &t1);
    if (rc != 0 && (d1 != d0 || t1 != t0))
        abort(); /* a failed add changed the index */
    if (rc != 0 && tartan_errmsg(db)[0] != 'T')
        abort(); /* every failure names its code */
    if (rc == 0 && !(fl & F_KEEP)) {
        size_t nd;
        if (tartan_delete(db, ids, n, &nd))
            abort();
    }
    free(emb);
    if (++runs % 64 == 0) {
        size_t problems;
        if (tartan_check(db, NULL, NULL, &problems) != 0)
            abort();
        if (d1 > 2000)
            open_index();
    }
    return 0;
}
