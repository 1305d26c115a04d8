/*
 * flip_doc.c: flips one bit of the stored record of the document with a given id, in the
 * file (a test helper for tests/check_compact_crash.sh, which needs a damaged index to repair;
 * the public API damages nothing). Exit status 0, or 1 with a message.
 *
 *   flip_doc INDEX ID
 */
#include "config.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "store.h"
#include "store_internal.h"
#include "tartan.h"

/* The file offset of p, a pointer into txn's map: LMDB maps data.mdb whole from offset 0;
 * the mapping is found by the file's inode in /proc/self/maps. */
static long file_offset(store_txn *txn, const void *p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    char line[1024];
    long off = -1;
    uintptr_t at = (uintptr_t)p;
    while (off < 0 && fgets(line, sizeof line, f)) {
        unsigned long lo, hi, foff, ino;
        char perms[8], dev[32];
        if (sscanf(line, "%lx-%lx %7s %lx %31s %lu", &lo, &hi, perms, &foff, dev, &ino) == 6 &&
            ino == (unsigned long)txn->st_gen->g_ino && at >= lo && at < hi)
            off = (long)(at - lo + foff);
    }
    fclose(f);
    return off;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: flip_doc INDEX ID\n");
        return 2;
    }
    store_env *env;
    store_txn *t;
    store_msg m = {{0}};
    int rc = store_open(argv[1], STORE_READONLY, NULL, 0, &env, &m);
    if (!rc)
        rc = store_read_begin(env, &t, &m);
    if (rc) {
        fprintf(stderr, "flip_doc: %s: %s\n", tartan_err_name(rc), m.text);
        return 1;
    }
    store_header h;
    uint32_t docno;
    store_doc d;
    long off = -1;
    if (!(rc = store_header_get(t, &h, &m)) &&
        !(rc = store_id_get(t, argv[2], strlen(argv[2]), &docno, &m)) &&
        !(rc = store_doc_get(t, docno, h.code_bytes, h.token_bytes, 1, &d, &m)))
        off = file_offset(t, d.residuals);
    store_read_end(env, t);
    store_close(env);
    if (rc || off < 0) {
        fprintf(stderr, "flip_doc: %s: %s\n", rc ? tartan_err_name(rc) : "no mapping",
                rc ? m.text : "");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/data.mdb", argv[1]);
    int fd = open(path, O_RDWR);
    unsigned char b;
    if (fd < 0 || pread(fd, &b, 1, off) != 1) {
        perror(path);
        return 1;
    }
    b ^= 0x10;
    if (pwrite(fd, &b, 1, off) != 1) {
        perror(path);
        return 1;
    }
    close(fd);
    return 0;
}
