/*
 * search_io.h: what `tartan search` and `tartan-mpi search` read and write besides the query
 * file (queryfile.h) and TREC runs (trec_run.h): the --subset id list, and one query's
 * results as a JSON line.
 */
#ifndef TARTAN_TOOLS_SEARCH_IO_H
#define TARTAN_TOOLS_SEARCH_IO_H

#include <stddef.h>
#include <stdio.h>

#include "tartan.h"
#include "textfile.h"

/* One query's results as one JSON line: {"qid": ..., "hits": [{"id":, "rank":, "score":}]},
 * scores in 9 significant digits (a float32 reads back exactly). */
void tool_jsonl_write_hits(FILE *f, const char *qid, const tartan_hit *h, size_t n);

/* Reads a --subset file: one id a line, blank lines skipped, repeats kept (the library takes
 * the union). *ids point into tf (free both: free(*ids), tool_textfile_free(tf)). */
int tool_subset_read(const char *path, tool_textfile *tf, char ***ids, size_t *n, char *err,
                     size_t errlen);

#endif
