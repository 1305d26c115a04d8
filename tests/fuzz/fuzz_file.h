/*
 * fuzz_file.h: the readers under fuzzing take a path; this hands them the input as an
 * in-memory file (memfd), so that a run costs no disk I/O and leaves nothing behind.
 */
#ifndef TARTAN_FUZZ_FILE_H
#define TARTAN_FUZZ_FILE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data into a fresh memfd and puts its /proc path in path; returns the fd or -1. */
static int fuzz_memfile(const unsigned char *data, size_t size, char *path, size_t len)
{
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0)
        abort(); /* the harness, not the target, failed */
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0)
            abort();
        off += (size_t)w;
    }
    snprintf(path, len, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
