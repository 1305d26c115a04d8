/*
 * cmd_delete.c: `tartan delete INDEX --ids FILE`: deletes the documents with the ids in FILE
 * (one a line) in one transaction; ids the index lacks are counted and skipped.
 */
#include <getopt.h>
#include <stdio.h>

#include "commands.h"
#include "idlist.h"
#include "tartan.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan delete INDEX --ids FILE\n\n"
               "Deletes the documents whose ids FILE lists (one a line; '-' reads standard\n"
               "input), all in one transaction.\n");
}

int tool_cmd_delete(int argc, char **argv)
{
    static const struct option opts[] = {
        {"ids", required_argument, NULL, 'i'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *ids = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'i') {
            ids = optarg;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || !ids) {
        usage(stderr);
        return 2;
    }
    char err[1024];
    tool_idlist list;
    int rc = tool_idlist_read(&list, ids, err, sizeof err);
    if (rc) {
        fprintf(stderr, "tartan delete: %s: %s\n", tartan_err_name(rc), err);
        return 1;
    }
    tartan_db *db;
    if ((rc = tartan_open(argv[optind], NULL, &db))) {
        fprintf(stderr, "tartan delete: %s\n", tartan_errmsg(NULL));
        tool_idlist_free(&list);
        return 1;
    }
    size_t n = 0;
    rc = tartan_delete(db, (const char *const *)list.ids, list.n, &n);
    if (rc)
        fprintf(stderr, "tartan delete: %s\n", tartan_errmsg(db));
    else
        fprintf(stderr, "deleted %zu documents (%zu ids not in the index)\n", n, list.n - n);
    tartan_close(db);
    tool_idlist_free(&list);
    return rc ? 1 : 0;
}
