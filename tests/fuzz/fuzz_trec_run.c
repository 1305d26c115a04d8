/* fuzz_trec_run.c: libFuzzer target for TREC run files (tool_run_read). */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>

#include "fuzz_file.h"
#include "trec_run.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[256];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    tool_run r;
    if (tool_run_read(&r, path, err, sizeof err) == 0)
        tool_run_free(&r);
    close(fd);
    return 0;
}
