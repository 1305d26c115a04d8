/*
 * compact.c: tartan_compact, the index rewritten without free pages (storage/compact.c does
 * the copying, storage/rewrite.c the atomic exchange).
 */
#include "config.h"

#include <pthread.h>

#include "db.h"

int tartan_compact(tartan_db *db)
{
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_compact: db is NULL");
    store_msg m = {{0}};
    pthread_mutex_lock(&db->write_lock);
    store_compact_stats st;
    int rc = store_compact(db->env, &st, &m);
    pthread_mutex_unlock(&db->write_lock);
    return rc ? eng_fail(db, rc, &m) : 0;
}
