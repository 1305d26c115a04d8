/*
 * cmd_check.c: `tartan check INDEX`: verifies the whole index (tartan_check) and prints each
 * problem on its own line, "KIND: message". Exit status 0: sound; 1: problems found, or the
 * index could not be checked; 2: usage.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tartan.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan check [--quiet] INDEX\n\n"
               "Verifies the whole index: header counts, codec and centroids, every document's\n"
               "checksum, size and codes, the inverted lists against the documents (missing and\n"
               "stale entries), and ids <-> documents both ways. Prints each problem as\n"
               "'KIND: message'. Exit status 0 when sound, 1 when not (or it cannot be read).\n\n"
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
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int quiet = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        if (c == 'q') {
            quiet = 1;
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
    o.flags = TARTAN_READONLY;
    tartan_db *db;
    if (tartan_open(path, &o, &db)) {
        if (!quiet)
            fprintf(stderr, "tartan check: %s\n", tartan_errmsg(NULL));
        return 1;
    }
    size_t n = 0;
    int rc = tartan_check(db, print_problem, &quiet, &n);
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
