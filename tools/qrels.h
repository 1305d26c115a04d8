/*
 * qrels.h: relevance judgments. Two formats, told apart by the number of fields:
 *   BEIR TSV:  query-id  corpus-id  score      (a header line "query-id corpus-id score" first)
 *   TREC:      qid  iteration  docid  relevance (iteration ignored)
 * Fields are separated by tabs or spaces; lines may end in CRLF; blank lines and lines
 * starting with '#' are skipped. Relevance is an integer (graded; negative means judged but
 * not relevant). A document judged twice for one query is an error, as in trec_eval.
 */
#ifndef TARTAN_TOOLS_QRELS_H
#define TARTAN_TOOLS_QRELS_H

#include <stddef.h>

#include "strtab.h"

typedef struct tool_judgment {
    long doc; /* number in tool_qrels.docids */
    long rel;
    size_t line; /* where it was read, for messages */
} tool_judgment;

typedef struct tool_qrels_query {
    tool_judgment *j; /* sorted by doc number */
    size_t n, cap;
} tool_qrels_query;

enum { TOOL_QRELS_TREC = 4, TOOL_QRELS_BEIR = 3 };

typedef struct tool_qrels {
    tool_strtab qids;    /* query id -> query number */
    tool_strtab docids;  /* document id -> document number */
    tool_qrels_query *q; /* q[query number] */
    int format;          /* TOOL_QRELS_TREC or TOOL_QRELS_BEIR (the field count) */
} tool_qrels;

/*
 * tool_qrels_read: reads path ("-" is standard input).
 * Errors (messages name the file and line): TARTAN_EFORMAT (wrong field count, a relevance
 * that is not an integer, a misplaced header), TARTAN_EDUPID (a document judged twice for a
 * query), TARTAN_EEMPTY (no judgments), errno. On failure q is left empty.
 */
int tool_qrels_read(tool_qrels *q, const char *path, char *err, size_t errlen);

/* tool_qrels_find: the judgment of document number doc for query number query, or NULL. */
const tool_judgment *tool_qrels_find(const tool_qrels *q, size_t query, long doc);

/* tool_qrels_free: frees q; accepts an empty one. */
void tool_qrels_free(tool_qrels *q);

#endif
