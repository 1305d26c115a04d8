/*
 * probe.c: the handle's probe table (kern_centroid_probe's bf16 centroid tiles), built by the
 * first CPU search that can use it and kept for the later ones: building it reads and rounds
 * every centroid (about 3 ms at K 8,192, d 128: as long as a query), so one per search call
 * would cost single-query calls more than the probe saves.
 *
 * Searches on several threads share it: a table in use is counted, and one that no longer
 * matches the snapshot's centroids (kern_probe_table_matches; centroids are trained once, so
 * this is a safeguard) is replaced, the old one freed by its last user.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "probe.h"

struct eng_probe {
    kern_probe_table *t;
    unsigned users;
    int detached; /* replaced: freed by the last user */
    int unusable; /* kern_probe_table_new said no (no AMX): not asked again */
};

static int probe_off(void)
{
    /* For benchmarks and tests: the fp32 table and heap top-k of the first version. */
    const char *e = getenv("TARTAN_CPU_PROBE");
    return e && strcmp(e, "fp32") == 0;
}

static void drop(struct eng_probe *p)
{
    kern_probe_table_free(p->t);
    free(p);
}

struct eng_probe *eng_probe_get(tartan_db *db, const idx_reader *r)
{
    if (!r->trained || !r->centroids || probe_off())
        return NULL;
    size_t K = r->h.n_centroids, dim = r->h.dim;
    struct eng_probe *got = NULL;
    pthread_mutex_lock(&db->probe_lock);
    struct eng_probe *p = db->probe;
    if (p && !p->unusable && !kern_probe_table_matches(p->t, r->centroids, K, dim)) {
        /* other centroids: the next table replaces this one */
        p->detached = 1;
        if (!p->users)
            drop(p);
        db->probe = p = NULL;
    }
    if (!p) {
        p = calloc(1, sizeof *p);
        if (p && kern_probe_table_new(KERN_DEV_CPU, r->centroids, K, dim, &p->t) != KERN_OK)
            p->unusable = 1; /* no AMX here (or no memory now: fp32 still works) */
        db->probe = p;
    }
    if (p && !p->unusable) {
        p->users++;
        got = p;
    }
    pthread_mutex_unlock(&db->probe_lock);
    return got;
}

const kern_probe_table *eng_probe_table(const struct eng_probe *p)
{
    return p ? p->t : NULL;
}

void eng_probe_put(tartan_db *db, struct eng_probe *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&db->probe_lock);
    if (--p->users == 0 && p->detached)
        drop(p);
    pthread_mutex_unlock(&db->probe_lock);
}

void eng_probe_free(struct eng_probe *p)
{
    if (p)
        drop(p);
}
