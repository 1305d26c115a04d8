/*
 * errors.c: how the storage layer reports an error: the detail into a store_msg for the engine
 * to put on the handle, and LMDB's own codes mapped to tartan's (LMDB's codes never leave this
 * layer; store.h). Every file of the layer reports through these.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "store_internal.h"
#include "tartan.h"

int store_fail(store_msg *m, int code, const char *fmt, ...)
{
    if (m) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->text, sizeof m->text, fmt, ap);
        va_end(ap);
    }
    return code;
}

int store_map_lmdb(store_msg *m, int rc, const char *what)
{
    switch (rc) {
    case MDB_SUCCESS:
        return 0;
    case MDB_MAP_FULL:
        return store_fail(m, STORE_EMAPFULL, "%s: the map is full", what);
    case MDB_NOTFOUND:
        return store_fail(m, TARTAN_ENOTFOUND, "%s: not found", what);
    case MDB_KEYEXIST:
        return store_fail(m, TARTAN_EEXIST, "%s: key exists", what);
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
        return store_fail(m, TARTAN_ECORRUPT, "%s: LMDB reports damaged pages (%s)", what,
                          mdb_strerror(rc));
    case MDB_INVALID:
        return store_fail(m, TARTAN_ENOINDEX, "%s: not an LMDB environment", what);
    case MDB_INCOMPATIBLE:
        return store_fail(m, TARTAN_ENOINDEX,
                          "%s: the LMDB environment holds databases of another layout", what);
    case MDB_VERSION_MISMATCH:
        return store_fail(m, TARTAN_EVERSION, "%s: written by an incompatible LMDB version", what);
    case MDB_TXN_FULL:
        return store_fail(m, TARTAN_ETOOBIG,
                          "%s: the change is too large for one transaction; split the batch", what);
    case MDB_BAD_VALSIZE:
        return store_fail(m, TARTAN_ETOOBIG, "%s: key or value too large", what);
    case MDB_READERS_FULL:
        return store_fail(m, TARTAN_ESTORAGE, "%s: too many concurrent readers", what);
    default:
        break;
    }
    if (rc > 0)
        return store_fail(m, rc, "%s: %s", what, strerror(rc));
    return store_fail(m, TARTAN_ESTORAGE, "%s: %s", what, mdb_strerror(rc));
}
