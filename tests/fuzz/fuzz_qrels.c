/* fuzz_qrels.c: libFuzzer target for qrels files (tool_qrels_read, BEIR TSV and TREC). */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>

#include "fuzz_file.h"
#include "qrels.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[256];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    tool_qrels q;
    if (tool_qrels_read(&q, path, err, sizeof err) == 0)
        tool_qrels_free(&q);
    close(fd);
    return 0;
}
