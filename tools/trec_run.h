/*
 * trec_run.h: TREC run files, one retrieved document per line:
 *   qid  Q0  docid  rank  score  tag
 * Fields are separated by spaces or tabs; lines may end in CRLF; blank lines and lines
 * starting with '#' are skipped. As in trec_eval, the rank column is read but not used: a
 * query's documents are ordered by score, descending, ties broken by docid, descending
 * (byte order); the Q0 column is ignored.
 */
#ifndef TARTAN_TOOLS_TREC_RUN_H
#define TARTAN_TOOLS_TREC_RUN_H

#include <stddef.h>
#include <stdio.h>

#include "strtab.h"

typedef struct tool_run_doc {
    long doc; /* number in tool_run.docids */
    double score;
    size_t line;
} tool_run_doc;

typedef struct tool_run_query {
    tool_run_doc *d; /* in file order */
    size_t n, cap;
} tool_run_query;

typedef struct tool_run {
    tool_strtab qids;   /* query id -> query number */
    tool_strtab docids; /* document id -> document number */
    tool_run_query *q;  /* q[query number] */
    size_t lines;       /* documents read */
} tool_run;

/*
 * tool_run_read: reads path ("-" is standard input).
 * Errors (messages name the file and line): TARTAN_EFORMAT (not 6 fields, a score that is
 * not a number, or NaN), TARTAN_EDUPID (a document twice for one query, which trec_eval
 * refuses too), TARTAN_EEMPTY (no lines), errno. On failure r is left empty.
 */
int tool_run_read(tool_run *r, const char *path, char *err, size_t errlen);

/* tool_run_free: frees r; accepts an empty one. */
void tool_run_free(tool_run *r);

/*
 * tool_run_write: writes one query's results, best first, ranks 1..n.
 *   qid, docids[n], tag: ids without whitespace; scores[n]: finite, in the order given.
 * Scores are written in the fewest digits that read back as the same value (as a float32
 * when the score is one, at most 9 digits; else as a double, at most 17), so that trec_eval's
 * reordering by score reproduces the order given, except among equal scores.
 * Errors: TARTAN_EBADID (empty id or one with whitespace), TARTAN_ENONFINITE, errno (write).
 */
int tool_run_write(FILE *f, const char *qid, const char *const *docids, const double *scores,
                   size_t n, const char *tag);

#endif
