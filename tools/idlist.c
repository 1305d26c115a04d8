/* idlist.c: reading id files (see idlist.h). */
#include <errno.h>
#include <string.h>

#include "errbuf.h"
#include "idlist.h"
#include "tartan.h"
#include "textfile.h"

int tool_idlist_read(tool_idlist *l, const char *path, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    tool_textfile f;
    int rc = tool_textfile_read(&f, path, err, errlen);
    if (rc)
        return rc;
    char *line;
    size_t len;
    while (tool_textfile_next(&f, &line, &len)) {
        if (len == 0) {
            rc = tool_fail(err, errlen, TARTAN_EBADID, "%s:%zu: empty line where an id belongs",
                           path, f.lineno);
            goto fail;
        }
        if (strpbrk(line, " \t\r\v\f")) {
            rc = tool_fail(err, errlen, TARTAN_EBADID,
                           "%s:%zu: id '%.80s' contains whitespace, which TREC runs cannot "
                           "carry",
                           path, f.lineno, line);
            goto fail;
        }
        int added;
        long k = tool_strtab_intern(&l->tab, line, len, &added);
        if (k < 0) {
            rc = tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        if (!added) {
            /* Rows are ids in line order, so the first occurrence's line is its row + 1. */
            rc = tool_fail(err, errlen, TARTAN_EDUPID,
                           "%s:%zu: duplicate id '%.80s' (first on line %ld)", path, f.lineno, line,
                           k + 1);
            goto fail;
        }
    }
    l->n = l->tab.n;
    l->ids = l->tab.keys;
    tool_textfile_free(&f);
    return 0;
fail:
    tool_textfile_free(&f);
    tool_idlist_free(l);
    return rc;
}

long tool_idlist_find(const tool_idlist *l, const char *id)
{
    return tool_strtab_find(&l->tab, id, strlen(id));
}

void tool_idlist_free(tool_idlist *l)
{
    tool_strtab_free(&l->tab);
    memset(l, 0, sizeof *l);
}
