/*
 * textfile.h: a text file read whole into memory and walked line by line, for the line-based
 * formats (id lists, qrels, TREC runs, JSON lines). Lines may end in LF or CRLF; a UTF-8 byte
 * order mark at the start is skipped; the last line needs no newline. A NUL byte anywhere is
 * an error, because every line is handed out as a C string.
 */
#ifndef TARTAN_TOOLS_TEXTFILE_H
#define TARTAN_TOOLS_TEXTFILE_H

#include <stddef.h>

typedef struct tool_textfile {
    char *buf;     /* the file's bytes plus a terminating NUL */
    size_t len;    /* bytes of text */
    size_t pos;    /* where the next line starts */
    size_t lineno; /* 1-based number of the line last returned */
} tool_textfile;

/*
 * tool_textfile_read: reads path ("-" is standard input) whole.
 * Errors: errno (open, read, ENOMEM), TARTAN_EFORMAT (a NUL byte; the message names the
 * line). On failure f is left empty.
 */
int tool_textfile_read(tool_textfile *f, const char *path, char *err, size_t errlen);

/*
 * tool_file_read: reads path ("-" is standard input) whole, as bytes: *buf (malloc'd, with a
 * NUL after the last byte; free() it) and *len. Errors: errno (open, read, ENOMEM).
 */
int tool_file_read(const char *path, char **buf, size_t *len, char *err, size_t errlen);

/*
 * tool_textfile_next: the next line, terminated in place, without its LF or CRLF.
 *   line, len: out. Returns 1, or 0 at the end of the file. f->lineno numbers the line.
 */
int tool_textfile_next(tool_textfile *f, char **line, size_t *len);

/* tool_textfile_free: frees the text; accepts an empty or freed file. */
void tool_textfile_free(tool_textfile *f);

#endif
