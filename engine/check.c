/*
 * check.c: tartan_check, the whole-index verification (storage/verify.c does the walk), and
 * tartan_repair, the salvage of a damaged index (storage/salvage.c).
 */
#include "config.h"

#include <pthread.h>
#include <stdio.h>

#include "calibrate.h"
#include "db.h"
#include "verify.h"

typedef struct first_problem {
    tartan_check_fn report;
    void *ctx;
    char first[512];
} first_problem;

/* Keeps the first problem for tartan_errmsg, then passes each on. */
static int relay(void *vctx, const char *kind, const char *message)
{
    first_problem *f = vctx;
    if (!f->first[0])
        snprintf(f->first, sizeof f->first, "%s: %s", kind, message);
    return f->report ? f->report(f->ctx, kind, message) : 0;
}

int tartan_check(tartan_db *db, tartan_check_fn report, void *ctx, size_t *n_problems)
{
    if (n_problems)
        *n_problems = 0;
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_check: db is NULL");
    store_msg m = {{0}};
    first_problem f = {report, ctx, ""};
    size_t n = 0;
    int rc = store_verify(db->env, relay, &f, &n, NULL, &m);
    if (!rc) {
        /* The search calibration (engine/calibrate.c lays it out). */
        store_txn *txn;
        eng_calib c;
        if (!(rc = store_read_begin(db->env, &txn, &m))) {
            store_msg cm = {{0}};
            int crc = eng_calib_read(txn, &c, &cm);
            store_read_end(db->env, txn);
            if (crc == TARTAN_ECORRUPT) {
                n++;
                relay(&f, "calibration", cm.text); /* the last part: nothing left to stop */
            } else if (crc) {
                rc = crc;
                m = cm;
            }
        }
    }
    if (n_problems)
        *n_problems = n;
    if (rc)
        return eng_fail(db, rc, &m);
    if (n)
        return eng_failf(db, TARTAN_ECORRUPT, "%zu problem%s found; the first: %s", n,
                         n == 1 ? "" : "s", f.first);
    return 0;
}

int tartan_repair(tartan_db *db, tartan_check_fn report, void *ctx, size_t *n_removed)
{
    if (n_removed)
        *n_removed = 0;
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_repair: db is NULL");
    store_msg m = {{0}};
    pthread_mutex_lock(&db->write_lock);
    int rc = store_salvage(db->env, report, ctx, n_removed, &m);
    pthread_mutex_unlock(&db->write_lock);
    return rc ? eng_fail(db, rc, &m) : 0;
}
