/*
 * store_internal.h: what the storage layer's own files share (not for the layers above).
 */
#ifndef TARTAN_STORAGE_STORE_INTERNAL_H
#define TARTAN_STORAGE_STORE_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>

#include "store.h"

struct store_env {
    MDB_env *se_env;
    MDB_dbi se_meta, se_centroids, se_docs, se_ivf, se_ids, se_names;
    unsigned se_flags; /* STORE_READONLY, ... */
    char *se_path;
    /*
     * Every transaction of this process holds this lock for reading while it lives; growing
     * the map takes it for writing, because mdb_env_set_mapsize may only run while no
     * transaction of the process is active (LMDB does not check this itself).
     */
    pthread_rwlock_t se_grow;
};

struct store_txn {
    MDB_txn *st_txn;
    store_env *st_env;
};

/* Meta keys (FORMAT.md "meta"). */
#define STORE_KEY_FORMAT "format"
#define STORE_KEY_HEADER "header"
#define STORE_KEY_CODEC "codec"

/* The first 8 bytes of meta "format": tells a tartan index from other LMDB environments. */
#define STORE_MAGIC "tartanix"

#endif
