/* fuzz_idlist.c: libFuzzer target for id lists (tool_idlist_read): every id it returns is
 * found again by tool_idlist_find at its own row. */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <string.h>

#include "fuzz_file.h"
#include "idlist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[256];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    tool_idlist l;
    if (tool_idlist_read(&l, path, err, sizeof err) == 0) {
        for (size_t i = 0; i < l.n; i++)
            if (!l.ids[i][0] || tool_idlist_find(&l, l.ids[i]) != (long)i)
                abort();
        tool_idlist_free(&l);
    }
    close(fd);
    return 0;
}
