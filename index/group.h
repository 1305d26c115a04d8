/*
 * group.h: the members of a training that several processes share (layer prefix idx_), as the
 * index layer sees them: this member's rank, the group's size, and three collective calls the
 * caller supplies (engine/tartan.h, tartan_train_group): a sum of doubles that every member
 * gets, a broadcast of bytes from rank 0, and a gather of bytes on rank 0. One process alone is
 * the group of one (idx_group_solo), whose calls cost nothing, so that one k-means and one
 * codec fit serve both.
 *
 * Failures: every call here is collective and carries, or is preceded by, every member's status,
 * so that a member that failed on its own (bad input, no memory, a device error) still takes
 * part in the next exchange and every member returns an error from it instead of waiting for
 * the failed one: TARTAN_EGROUP on the others, naming the first failed rank. A callback that
 * returns nonzero also ends the training with TARTAN_EGROUP; the caller's transport must make
 * such a failure every member's (MPI's collectives abort the job or fail on every rank).
 */
#ifndef TARTAN_INDEX_GROUP_H
#define TARTAN_INDEX_GROUP_H

#include <stddef.h>

#include "store.h"

/* Most members a group may have: the status and count exchanges use a buffer of this many
 * slots inside the group, so that they need no allocation (a member that could not allocate
 * could not take part, and the others would wait for it). */
#define IDX_GROUP_MAX 1024

typedef struct idx_group {
    int rank, size; /* 0 <= rank < size */
    void *ctx;
    /* v [n] := the sum over members of their v, on every member. 0 or nonzero. */
    int (*sum)(void *ctx, double *v, size_t n);
    /* buf [len] := rank 0's buf, on every member. */
    int (*bcast)(void *ctx, void *buf, size_t len);
    /* On rank 0, all := the members' mine concatenated in rank order; lens [size]: each member's
     * bytes (the same array on every member); all is NULL elsewhere. */
    int (*gather)(void *ctx, const void *mine, size_t len, void *all, const size_t *lens);
    /* Out: seconds spent inside the calls above (transfers, and waiting for slower members). */
    double seconds;
    /* Out, after TARTAN_EGROUP: the first rank that failed on its own and its code (-1, 0 when
     * a callback failed). */
    int failed_rank, failed_code;
    double scratch[2 * IDX_GROUP_MAX];
} idx_group;

/* The group of one: rank 0 of 1, calls that copy or do nothing. */
void idx_group_solo(idx_group *g);

/* Seconds on a monotonic clock (differences only). */
double idx_now(void);

/* Whether TARTAN_KMEANS_TRACE asks for the training's phase times on stderr (set, not "0"). */
int idx_trace(void);

/*
 * Sums v [n] over the members and exchanges their status: v needs room for n + g->size doubles
 * (the status slots after the values). rc: this member's status (0 or a code, its message in
 * m). Returns 0 when every member passed 0; rc (message kept) when this member failed; else
 * TARTAN_EGROUP ("rank R of P failed"). The values are summed even then, and mean nothing.
 */
int idx_group_sum(idx_group *g, double *v, size_t n, int rc, store_msg *m);

/* Only the status: idx_group_sum with no values. */
int idx_group_check(idx_group *g, int rc, store_msg *m);

/* The group's counts: each member's count into each [size] (every member gets all; each may
 * be NULL on a member that failed, rc nonzero). */
int idx_group_counts(idx_group *g, size_t mine, size_t *each, int rc, store_msg *m);

/* Rank 0's len bytes of buf to every member; TARTAN_EGROUP when the callback fails. */
int idx_group_bcast(idx_group *g, void *buf, size_t len, store_msg *m);

/* Every member's bytes to rank 0 (all [sum of lens] there, NULL elsewhere). */
int idx_group_gather(idx_group *g, const void *mine, size_t len, void *all, const size_t *lens,
                     store_msg *m);

#endif
