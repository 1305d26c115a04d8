/*
 * cmd_check.c: `tartan check [--repair] INDEX`: verifies the whole index (tartan_check) and
 * prints each problem on its own line, "KIND: message"; with --repair, salvages a damaged index
 * (tartan_repair), printing what it did the same way, and checks it again. Exit status 0:
 * sound (after the repair, with --repair); 1: problems found (or left), or the index could not
 * be checked or repaired; 2: usage.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tartan.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan check [--repair] [--quiet] INDEX\n\n"
               "Verifies the whole index: every record's checksum, header counts, codec and\n"
               "centroids, every document's size and codes, the inverted lists against the\n"
               "documents (missing and stale entries), and ids <-> documents both ways. Prints\n"
               "each problem as 'KIND: message'. Exit status 0 when sound, 1 when not (or it\n"
               "cannot be read).\n\n"
               "  --repair  salvage a damaged index: remove the documents whose records are\n"
               "            damaged (each printed as 'removed: ...', with its id when known),\n"
               "            rebuild inverted lists, id maps and counts from the others, in one\n"
               "            transaction; then check again. Exit status 0 when sound after it\n"
               "  --quiet   print nothing; the exit status tells\n");
}

static int print_problem(void *ctx, const char *kind, const char *message)
{
    if (!*(int *)ctx)
        printf("%s: %s\n", kind, message);
    return 0;
}

int tool_cmd_check(int argc, char **argv)
{
    static const struct option opts[] = {
        {"quiet", no_argument, NULL, 'q'},
        {"repair", no_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int quiet = 0, repair = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        if (c == 'q') {
            quiet = 1;
        } else if (c == 'r') {
            repair = 1;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    tartan_options o;
    tartan_options_init(&o);
    o.flags = repair ? 0 : TARTAN_READONLY;
    tartan_db *db;
    if (tartan_open(path, &o, &db)) {
        if (!quiet)
            fprintf(stderr, "tartan check: %s\n", tartan_errmsg(NULL));
        return 1;
    }
    size_t n = 0;
    int rc = tartan_check(db, print_problem, &quiet, &n);
    if (rc == TARTAN_ECORRUPT && repair) {
        size_t removed = 0;
        if (!quiet)
            printf("%s: %zu problem%s; repairing\n", path, n, n == 1 ? "" : "s");
        rc = tartan_repair(db, print_problem, &quiet, &removed);
        if (rc) {
            if (!quiet)
                fprintf(stderr, "tartan check: repair failed: %s\n", tartan_errmsg(db));
            tartan_close(db);
            return 1;
        }
        if (!quiet)
            printf("%s: repaired, %zu document%s removed; checking again\n", path, removed,
                   removed == 1 ? "" : "s");
        rc = tartan_check(db, print_problem, &quiet, &n);
    }
    if (rc && rc != TARTAN_ECORRUPT) {
        if (!quiet)
            fprintf(stderr, "tartan check: %s\n", tartan_errmsg(db));
    } else if (!quiet) {
        tartan_index_info i;
        if (!rc && tartan_info(db, &i) == 0)
            printf("%s: sound (%llu documents, %llu tokens)\n", path, (unsigned long long)i.n_docs,
                   (unsigned long long)i.n_tokens);
        else if (rc)
            printf("%s: %zu problem%s\n", path, n, n == 1 ? "" : "s");
    }
    tartan_close(db);
    return rc ? 1 : 0;
}
