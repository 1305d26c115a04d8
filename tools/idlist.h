/*
 * idlist.h: external id files, one id per line (ids.txt beside embeddings.npy, query ids).
 * Line i holds the id of row i. Lines may end in LF or CRLF. An empty line, an id with a
 * space or tab (TREC runs split on whitespace, so such an id could not be written back) and a
 * repeated id are errors that name the line.
 */
#ifndef TARTAN_TOOLS_IDLIST_H
#define TARTAN_TOOLS_IDLIST_H

#include <stddef.h>

#include "strtab.h"

typedef struct tool_idlist {
    size_t n;        /* number of ids */
    char **ids;      /* ids[i]: the id on line i + 1; owned by the list */
    tool_strtab tab; /* id -> row */
} tool_idlist;

/*
 * tool_idlist_read: reads path ("-" is standard input). An empty file gives n = 0.
 * Errors: TARTAN_EBADID (empty line, whitespace inside an id), TARTAN_EDUPID (repeated id;
 * the message names both lines), TARTAN_EFORMAT (NUL byte), errno.
 */
int tool_idlist_read(tool_idlist *l, const char *path, char *err, size_t errlen);

/* tool_idlist_find: the row of id, or -1. */
long tool_idlist_find(const tool_idlist *l, const char *id);

/* tool_idlist_free: frees the list; accepts a zeroed one. */
void tool_idlist_free(tool_idlist *l);

#endif
