/*
 * list_ids.c: prints the external ids an index holds, one a line in byte order (a test helper
 * for tests/check_crash.sh, which compares them with the batches it committed; the public API
 * has no id listing). Exit status 0, or 1 with a message when the index cannot be read.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "store.h"
#include "tartan.h"

static int print_id(const char *db, const void *key, size_t klen, const void *val, size_t vlen,
                    void *ctx)
{
    (void)val;
    (void)vlen;
    (void)ctx;
    if (!strcmp(db, "ids"))
        printf("%.*s\n", (int)klen, (const char *)key);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: list_ids INDEX\n");
        return 2;
    }
    store_env *env;
    store_txn *txn;
    store_msg m = {{0}};
    int rc = store_open(argv[1], STORE_READONLY, NULL, 0, &env, &m);
    if (rc) {
        fprintf(stderr, "list_ids: %s: %s\n", tartan_err_name(rc), m.text);
        return 1;
    }
    if (!(rc = store_read_begin(env, &txn, &m))) {
        rc = store_dump(txn, print_id, NULL, &m);
        store_read_end(env, txn);
    }
    if (rc)
        fprintf(stderr, "list_ids: %s: %s\n", tartan_err_name(rc), m.text);
    store_close(env);
    return rc ? 1 : 0;
}
