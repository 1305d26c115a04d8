/* fields.h: splitting a line of a whitespace-separated text format into fields. */
#ifndef TARTAN_TOOLS_FIELDS_H
#define TARTAN_TOOLS_FIELDS_H

#include <stddef.h>

/*
 * tool_split_fields: splits line (terminated; modified in place) at runs of spaces and tabs
 * into at most max fields, each terminated. Returns the number of fields found, max + 1 when
 * there are more than max.
 */
size_t tool_split_fields(char *line, char **fields, size_t max);

/* tool_parse_long: the whole of s as a decimal integer. Returns 0, or -1 if s is not one. */
int tool_parse_long(const char *s, long *v);

#endif
