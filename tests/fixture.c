/* fixture.c: see fixture.h. */
#define _GNU_SOURCE
#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "fixture.h"

char tmpdir[256];
char ixpath[300];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

void fixture_dir_create(const char *name)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tartan-%s-XXXXXX", name);
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(ixpath, sizeof ixpath, "%s/ix", tmpdir);
}

void fixture_dir_remove(void)
{
    chmod(tmpdir, 0700);
    chmod(ixpath, 0700);
    nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
