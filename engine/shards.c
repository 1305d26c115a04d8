/*
 * shards.c: what a sharded corpus needs from the library, with no network code in it
 * (tartan.h, "Shards"): the trained model as a byte string that moves between indexes
 * (tartan_model_export, tartan_model_import) and the stable routing of an external id to a
 * shard (tartan_shard_of). The merge of per-shard results is engine/results_merge.c.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "gpu.h"

void tartan_free(void *p)
{
    free(p);
}

int tartan_model_export(tartan_db *db, void **buf, size_t *len)
{
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_model_export: db is NULL");
    if (!buf || !len)
        return eng_failf(db, TARTAN_EINVAL, "tartan_model_export: buf or len is NULL");
    *buf = NULL;
    *len = 0;
    store_msg m = {{0}};
    int rc = idx_model_export(db->env, buf, len, &m);
    return rc ? eng_fail(db, rc, &m) : 0;
}

int tartan_model_import(tartan_db *db, const void *buf, size_t len)
{
    if (!db)
        return eng_failf(NULL, TARTAN_EINVAL, "tartan_model_import: db is NULL");
    if (!buf)
        return eng_failf(db, TARTAN_EINVAL, "tartan_model_import: buf is NULL");
    if (store_is_readonly(db->env))
        return eng_failf(db, TARTAN_EREADONLY, "'%s' is open read-only", store_path(db->env));
    store_msg m = {{0}};
    pthread_mutex_lock(&db->write_lock);
    int rc = idx_model_import(db->env, buf, len, NULL, &m);
    pthread_mutex_unlock(&db->write_lock);
    return rc ? eng_fail(db, rc, &m) : 0;
}

/*
 * FNV-1a (64 bits) of the id's bytes, then the jump consistent hash of Lamping and Veach
 * ("A Fast, Minimal Memory, Consistent Hash Algorithm", 2014): a linear congruential step
 * decides, bucket after bucket, whether the key jumps further. Going from n to n + 1 shards
 * moves only the ids that land in the new shard (about 1 / (n + 1) of them), never one between
 * two old shards, so growing a sharded index moves the least data. Both steps are fixed
 * integer and double arithmetic: the same id gives the same shard on every machine.
 */
uint32_t tartan_shard_of(const char *id, uint32_t n_shards)
{
    if (!id || n_shards <= 1)
        return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    int64_t b = -1, j = 0;
    while (j < (int64_t)n_shards) {
        b = j;
        h = h * 2862933555777941757ull + 1;
        j = (int64_t)((double)(b + 1) * ((double)(1ull << 31) / (double)((h >> 33) + 1)));
    }
    return (uint32_t)b;
}
