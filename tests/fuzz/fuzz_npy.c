/*
 * fuzz_npy.c: libFuzzer target for the .npy reader: tool_npy_parse on the raw bytes under
 * every accepted-dtype and rank setting the tool uses, then tool_npy_open on the same bytes
 * as a file (length checks, mapping or reading, the data's alignment).
 */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <string.h>

#include "fuzz_file.h"
#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct {
        unsigned dtypes;
        int min_rank, max_rank;
    } modes[] = {
        {TOOL_DT_FLOATS, 2, 2},    /* embeddings */
        {TOOL_DT_INTS, 1, 1},      /* doclens */
        {TOOL_DT_FLOATS, 2, 3},    /* queries */
        {0, 0, TOOL_NPY_MAX_RANK}, /* anything */
    };
    char err[256];
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        tool_npy a;
        size_t off;
        int rc = tool_npy_parse(data, size, "fuzz.npy", modes[i].dtypes, modes[i].min_rank,
                                modes[i].max_rank, &a, &off, err, sizeof err);
        if (rc == 0 && (off > size || a.count * tool_dtype_size(a.dtype) != a.nbytes))
            abort();
    }
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    tool_npy a;
    if (tool_npy_open(&a, path, 0, 0, TOOL_NPY_MAX_RANK, err, sizeof err) == 0) {
        /* Touch every byte the reader hands out: it must all be there. */
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < a.nbytes; i++)
            sum += ((const uint8_t *)a.data)[i];
        (void)sum;
        if ((uintptr_t)a.data % tool_dtype_size(a.dtype))
            abort();
    }
    tool_npy_close(&a);
    close(fd);
    return 0;
}
