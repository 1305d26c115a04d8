/*
 * cmd_model.c: `tartan model INDEX -o FILE`: writes the index's trained model (centroids and
 * codec, tartan_model_export) to FILE, for `tartan build --model FILE` to build another index
 * (a shard, or a reference index) that encodes and scores documents exactly alike.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tartan.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tartan model INDEX -o FILE\n\n"
               "Writes the trained model of INDEX (centroids, codec tables: everything a build\n"
               "needs to encode documents alike) to FILE, for 'tartan build --model FILE'.\n");
}

int tool_cmd_model(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        if (c == 'o') {
            out = optarg;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || !out) {
        usage(stderr);
        return 2;
    }
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    tartan_db *db;
    if (tartan_open(argv[optind], &o, &db)) {
        fprintf(stderr, "tartan model: %s\n", tartan_errmsg(NULL));
        return 1;
    }
    void *buf = NULL;
    size_t len = 0;
    int status = 1;
    if (tartan_model_export(db, &buf, &len)) {
        fprintf(stderr, "tartan model: %s\n", tartan_errmsg(db));
        goto done;
    }
    FILE *f = fopen(out, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = 0;
    if (!ok) {
        fprintf(stderr, "tartan model: %s: %s\n", out, strerror(errno));
        goto done;
    }
    status = 0;
done:
    tartan_free(buf);
    tartan_close(db);
    return status;
}
