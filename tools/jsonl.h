/*
 * jsonl.h: the ids of a BEIR JSON-lines file (corpus.jsonl, queries.jsonl): one JSON object
 * per line, whose top-level "_id" member names the document or query. Only ids are read;
 * the text is skipped (but checked to be well-formed JSON, so that a damaged line is
 * reported rather than misread). Row i of the embeddings that go with the file is the object
 * on the i-th non-blank line. The tools' JSON output (search results, eval reports) writes its
 * strings through tool_json_string.
 */
#ifndef TARTAN_TOOLS_JSONL_H
#define TARTAN_TOOLS_JSONL_H

#include <stddef.h>
#include <stdio.h>

#include "idlist.h"

/*
 * tool_jsonl_ids: reads the "_id" of every line of path ("-" is standard input) into l, in
 * order. String ids are unescaped (\uXXXX to UTF-8); a numeric id is taken as written.
 * Blank lines are skipped; lines may end in CRLF.
 * Errors (messages name the file and line): TARTAN_EFORMAT (not a JSON object, malformed
 * JSON, no "_id", an "_id" that is neither a string nor a number, nesting deeper than 256),
 * TARTAN_EBADID (empty id, or one with whitespace, which TREC runs cannot carry),
 * TARTAN_EDUPID (an id seen on an earlier line), errno. On failure l is left empty.
 */
int tool_jsonl_ids(tool_idlist *l, const char *path, char *err, size_t errlen);

/* Writes s (UTF-8, NUL-terminated) to f as a JSON string literal: quotes, backslashes and
 * control characters escaped, everything else as it is. */
void tool_json_string(FILE *f, const char *s);

#endif
