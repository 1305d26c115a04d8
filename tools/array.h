/* array.h: growing the tools' dynamic arrays of records. */
#ifndef TARTAN_TOOLS_ARRAY_H
#define TARTAN_TOOLS_ARRAY_H

#include <stddef.h>

/*
 * tool_array_reserve: makes *arr (of *cap elements of size bytes) hold at least need
 * elements, doubling its capacity from first; elements added are zeroed. Returns 0, or -1 when
 * memory runs out (then *arr and *cap are unchanged).
 */
int tool_array_reserve(void **arr, size_t *cap, size_t need, size_t size, size_t first);

#endif
