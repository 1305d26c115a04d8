/* search_io.c: see search_io.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "jsonl.h"
#include "search_io.h"

/* One query's results as one JSON line: {"qid": ..., "hits": [{"id":, "rank":, "score":}]}.
 * Scores in 9 significant digits: a float32 reads back exactly. */
void tool_jsonl_write_hits(FILE *f, const char *qid, const tartan_hit *h, size_t n)
{
    fputs("{\"qid\": ", f);
    tool_json_string(f, qid);
    fputs(", \"hits\": [", f);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ", {\"id\": " : "{\"id\": ", f);
        tool_json_string(f, h[i].id);
        fprintf(f, ", \"rank\": %zu, \"score\": %.9g}", i + 1, (double)h[i].score);
    }
    fputs("]}\n", f);
}

/* Reads --subset: one id a line, blank lines skipped; repeats are harmless (the library
 * takes the union), so unlike tool_idlist_read they are not refused. */
int tool_subset_read(const char *path, tool_textfile *tf, char ***ids, size_t *n, char *err,
                     size_t errlen)
{
    int rc = tool_textfile_read(tf, path, err, errlen);
    if (rc)
        return rc;
    size_t cap = 0, len;
    char *line;
    *ids = NULL;
    *n = 0;
    while (tool_textfile_next(tf, &line, &len)) {
        if (len == 0)
            continue;
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 1024;
            char **p = realloc(*ids, nc * sizeof *p);
            if (!p)
                return tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
            *ids = p;
            cap = nc;
        }
        (*ids)[(*n)++] = line;
    }
    return 0;
}
