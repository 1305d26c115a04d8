/*
 * cmd_compact.c: `tartan compact INDEX`: rewrites the index without free pages
 * (tartan_compact), or converts an index of format version 1 to this version (tartan_open with
 * TARTAN_UPGRADE); prints the data file's size before and after.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "tartan.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan compact INDEX\n\n"
               "Rewrites the index without free pages: documents in full segments, inverted\n"
               "lists in full blocks, every page full (deletes and replaces leave pages that\n"
               "only this gives back). An index of format version 1 is converted to this\n"
               "version instead, keeping every document, id and score. The new index is\n"
               "written beside INDEX and exchanged with it atomically: the file system needs\n"
               "room for a second copy; a killed compaction leaves the index as it was.\n"
               "Searches go on meanwhile; changes wait.\n");
}

static long long file_size(const char *index)
{
    char buf[4096];
    struct stat st;
    if (snprintf(buf, sizeof buf, "%s/data.mdb", index) >= (int)sizeof buf || stat(buf, &st))
        return -1;
    return (long long)st.st_size;
}

int tool_cmd_compact(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        usage(stderr);
        return 2;
    }
    const char *index = argv[1];
    long long before = file_size(index);
    tartan_options o;
    tartan_options_init(&o);
    tartan_db *db;
    int rc = tartan_open(index, &o, &db), converted = 0;
    if (rc == TARTAN_EVERSION) {
        o.flags = TARTAN_UPGRADE;
        rc = tartan_open(index, &o, &db);
        converted = rc == 0;
    }
    if (rc) {
        fprintf(stderr, "tartan compact: %s\n", tartan_errmsg(NULL));
        return 1;
    }
    if (!converted && tartan_compact(db)) {
        fprintf(stderr, "tartan compact: %s\n", tartan_errmsg(db));
        tartan_close(db);
        return 1;
    }
    tartan_index_info i;
    if (tartan_info(db, &i) == 0) {
        long long after = (long long)i.bytes_file;
        printf("%s: %s; data file %lld -> %lld bytes", index,
               converted ? "converted to the current format" : "compacted", before, after);
        if (i.n_tokens)
            printf(" (%.2f -> %.2f B/token)", (double)before / (double)i.n_tokens,
                   (double)after / (double)i.n_tokens);
        printf("\n");
    }
    tartan_close(db);
    return 0;
}
