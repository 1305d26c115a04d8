/*
 * cmd_info.c: `tartan info INDEX`: what the index holds and where its bytes go, per token.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tartan.h"

static void row(const char *what, unsigned long long bytes, unsigned long long tokens)
{
    printf("  %-22s %14llu B  %8.2f B/token\n", what, bytes,
           tokens ? (double)bytes / (double)tokens : 0.0);
}

int tool_cmd_info(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: tartan info INDEX\n\nPrints counts, dimensions and space per part.\n");
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: tartan info INDEX\n");
        return 2;
    }
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    tartan_db *db;
    if (tartan_open(argv[1], &o, &db)) {
        fprintf(stderr, "tartan info: %s\n", tartan_errmsg(NULL));
        return 1;
    }
    tartan_index_info i;
    if (tartan_info(db, &i)) {
        fprintf(stderr, "tartan info: %s\n", tartan_errmsg(db));
        tartan_close(db);
        return 1;
    }
    unsigned long long t = i.n_tokens;
    printf("index          %s\n", argv[1]);
    printf("documents      %llu\n", (unsigned long long)i.n_docs);
    printf("tokens         %llu (%.1f per document)\n", t,
           i.n_docs ? (double)t / (double)i.n_docs : 0.0);
    printf("dim            %u\n", i.dim);
    printf("nbits          %u\n", i.nbits);
    printf("centroids      %u%s\n", i.n_centroids, i.n_centroids ? "" : " (not trained yet)");
    printf("code bytes     %u\n", i.code_bytes);
    if (i.codec == TARTAN_CODEC_AXES)
        printf("residual code  axes: %u / %u / %u / %u axes at 8 / 4 / 2 / 1 bits\n",
               i.axes_bits[0], i.axes_bits[1], i.axes_bits[2], i.axes_bits[3]);
    else
        printf("residual code  scalar\n");
    printf("format         %u\n", i.format);
    printf("ivf entries    %llu (%.1f per document)\n", (unsigned long long)i.ivf_entries,
           i.n_docs ? (double)i.ivf_entries / (double)i.n_docs : 0.0);
    printf("space:\n");
    row("residuals", i.bytes_residuals, t);
    row("codes", i.bytes_codes, t);
    row("inverse norms", i.bytes_norms, t);
    unsigned long long payload = i.bytes_residuals + i.bytes_codes + i.bytes_norms;
    row("docs pages", i.bytes_docs, t);
    row("  of which overhead", i.bytes_docs > payload ? i.bytes_docs - payload : 0, t);
    row("inverted lists", i.bytes_ivf, t);
    row("ids (both ways)", i.bytes_ids, t);
    row("centroids", i.bytes_centroids, t);
    row("meta", i.bytes_meta, t);
    row("free pages", i.bytes_free, t);
    row("data file", i.bytes_file, t);
    printf("map size       %llu B\n", (unsigned long long)i.map_size);
    tartan_calibration cal;
    if (tartan_calibration_get(db, &cal)) {
        fprintf(stderr, "tartan info: %s\n", tartan_errmsg(db));
        tartan_close(db);
        return 1;
    }
    fflush(stdout);
    tool_calibration_print(stdout, &cal);
    tartan_close(db);
    return 0;
}
