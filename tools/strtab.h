/*
 * strtab.h: a table of distinct strings numbered 0, 1, 2, ... in the order first seen. The
 * id files, qrels and runs use it to turn external ids into dense numbers and to find
 * duplicates in time proportional to the input.
 */
#ifndef TARTAN_TOOLS_STRTAB_H
#define TARTAN_TOOLS_STRTAB_H

#include <stddef.h>

typedef struct tool_strtab {
    char **keys;   /* keys[i]: NUL-terminated copy of string i */
    size_t n, cap; /* strings held; room in keys */
    size_t *slots; /* open addressing: index + 1, 0 for empty */
    size_t nslots; /* a power of two, at least 2 * n */
    char *arena;   /* current block of key copies */
    size_t arena_used, arena_cap;
    char **blocks; /* every block, for freeing */
    size_t nblocks;
} tool_strtab;

/* A zeroed tool_strtab is a valid empty table. */
#define TOOL_STRTAB_INIT                                                                           \
    {                                                                                              \
        0                                                                                          \
    }

/*
 * tool_strtab_intern: the number of s[0..len) (which need not be terminated), adding it if
 * new; *added (may be NULL) says which. Returns the number, or -1 when out of memory.
 */
long tool_strtab_intern(tool_strtab *t, const char *s, size_t len, int *added);

/* tool_strtab_find: the number of s[0..len), or -1 if absent. */
long tool_strtab_find(const tool_strtab *t, const char *s, size_t len);

/* tool_strtab_free: frees everything; the table is empty and usable afterwards. */
void tool_strtab_free(tool_strtab *t);

#endif
