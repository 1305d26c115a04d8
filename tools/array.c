/* array.c: see array.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"

int tool_array_reserve(void **arr, size_t *cap, size_t need, size_t size, size_t first)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : first;
    while (c < need) {
        if (c > SIZE_MAX / 2 / size)
            return -1;
        c *= 2;
    }
    if (c > SIZE_MAX / size)
        return -1;
    void *p = realloc(*arr, c * size);
    if (!p)
        return -1;
    memset((char *)p + *cap * size, 0, (c - *cap) * size);
    *arr = p;
    *cap = c;
    return 0;
}
