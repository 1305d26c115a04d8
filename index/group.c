/*
 * group.c: the collective calls of a shared training (group.h), timed, with every member's
 * status carried along.
 */
#include "config.h"

#include <string.h>
#include <time.h>

#include "group.h"
#include "tartan.h"

double idx_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int solo_sum(void *ctx, double *v, size_t n)
{
    (void)ctx;
    (void)v;
    (void)n;
    return 0;
}

static int solo_bcast(void *ctx, void *buf, size_t len)
{
    (void)ctx;
    (void)buf;
    (void)len;
    return 0;
}

static int solo_gather(void *ctx, const void *mine, size_t len, void *all, const size_t *lens)
{
    (void)ctx;
    (void)lens;
    if (len)
        memmove(all, mine, len);
    return 0;
}

void idx_group_solo(idx_group *g)
{
    g->rank = 0;
    g->size = 1;
    g->ctx = NULL;
    g->sum = solo_sum;
    g->bcast = solo_bcast;
    g->gather = solo_gather;
    g->seconds = 0.0;
    g->failed_rank = -1;
    g->failed_code = 0;
}

static int callback_failed(idx_group *g, const char *what, int crc, store_msg *m)
{
    g->failed_rank = -1;
    g->failed_code = 0;
    return store_fail(m, TARTAN_EGROUP, "the group's %s failed (it returned %d)", what, crc);
}

int idx_group_sum(idx_group *g, double *v, size_t n, int rc, store_msg *m)
{
    size_t p = (size_t)g->size;
    for (size_t r = 0; r < p; r++)
        v[n + r] = 0.0;
    /* A code is a small integer: exact in a double, and only one member writes each slot. */
    v[n + (size_t)g->rank] = (double)rc;
    double t0 = idx_now();
    int crc = g->sum(g->ctx, v, n + p);
    g->seconds += idx_now() - t0;
    if (crc)
        return rc ? rc : callback_failed(g, "sum", crc, m);
    if (rc)
        return rc;
    for (size_t r = 0; r < p; r++)
        if (v[n + r] != 0.0) {
            g->failed_rank = (int)r;
            g->failed_code = (int)v[n + r];
            return store_fail(m, TARTAN_EGROUP, "rank %zu of %zu failed (code %d)", r, p,
                              g->failed_code);
        }
    return 0;
}

int idx_group_check(idx_group *g, int rc, store_msg *m)
{
    return idx_group_sum(g, g->scratch, 0, rc, m);
}

int idx_group_counts(idx_group *g, size_t mine, size_t *each, int rc, store_msg *m)
{
    size_t p = (size_t)g->size;
    double *v = g->scratch;
    for (size_t r = 0; r < p; r++)
        v[r] = 0.0;
    /* Counts of points and bytes stay far below 2^53: exact in a double. */
    v[g->rank] = (double)mine;
    int out = idx_group_sum(g, v, p, rc, m);
    for (size_t r = 0; r < p && each; r++)
        each[r] = out ? 0 : (size_t)v[r];
    return out;
}

int idx_group_bcast(idx_group *g, void *buf, size_t len, store_msg *m)
{
    double t0 = idx_now();
    int crc = g->bcast(g->ctx, buf, len);
    g->seconds += idx_now() - t0;
    return crc ? callback_failed(g, "broadcast", crc, m) : 0;
}

int idx_group_gather(idx_group *g, const void *mine, size_t len, void *all, const size_t *lens,
                     store_msg *m)
{
    double t0 = idx_now();
    int crc = g->gather(g->ctx, mine, len, g->rank == 0 ? all : NULL, lens);
    g->seconds += idx_now() - t0;
    return crc ? callback_failed(g, "gather", crc, m) : 0;
}
