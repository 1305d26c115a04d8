/* qrels.c: reading relevance judgments (see qrels.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "errbuf.h"
#include "fields.h"
#include "qrels.h"
#include "tartan.h"
#include "textfile.h"

static int by_doc(const void *a, const void *b)
{
    const tool_judgment *x = a, *y = b;
    return (x->doc > y->doc) - (x->doc < y->doc);
}

int tool_qrels_read(tool_qrels *q, const char *path, char *err, size_t errlen)
{
    memset(q, 0, sizeof *q);
    tool_textfile f;
    int rc = tool_textfile_read(&f, path, err, errlen);
    if (rc)
        return rc;
    size_t qcap = 0, total = 0;
    char *line;
    size_t len;
    while (tool_textfile_next(&f, &line, &len)) {
        char *fl[5];
        size_t nf = tool_split_fields(line, fl, 4);
        if (nf == 0 || fl[0][0] == '#')
            continue;
        long rel;
        if (!q->format) {
            if (nf != 3 && nf != 4) {
                rc = tool_fail(err, errlen, TARTAN_EFORMAT,
                               "%s:%zu: %zu fields; qrels have 3 (BEIR: query-id corpus-id "
                               "score) or 4 (TREC: qid iteration docid relevance)",
                               path, f.lineno, nf > 4 ? (size_t)5 : nf);
                goto fail;
            }
            q->format = (int)nf;
            /* BEIR's first line names the columns. */
            if (nf == 3 && tool_parse_long(fl[2], &rel))
                continue;
        }
        if (nf != (size_t)q->format) {
            rc =
                tool_fail(err, errlen, TARTAN_EFORMAT,
                          "%s:%zu: %s%zu fields where the file's first line has %d", path, f.lineno,
                          nf > 4 ? "more than " : "", nf > 4 ? (size_t)4 : nf, q->format);
            goto fail;
        }
        if (tool_parse_long(fl[nf - 1], &rel)) {
            rc = tool_fail(err, errlen, TARTAN_EFORMAT,
                           "%s:%zu: relevance '%.40s' is not an integer", path, f.lineno,
                           fl[nf - 1]);
            goto fail;
        }
        long qi = tool_strtab_intern(&q->qids, fl[0], strlen(fl[0]), NULL);
        long di = tool_strtab_intern(&q->docids, fl[nf - 2], strlen(fl[nf - 2]), NULL);
        if (qi < 0 || di < 0)
            goto nomem;
        if (tool_array_reserve((void **)&q->q, &qcap, (size_t)qi + 1, sizeof *q->q, 64))
            goto nomem;
        tool_qrels_query *qq = &q->q[qi];
        if (tool_array_reserve((void **)&qq->j, &qq->cap, qq->n + 1, sizeof *qq->j, 8))
            goto nomem;
        qq->j[qq->n++] = (tool_judgment){.doc = di, .rel = rel, .line = f.lineno};
        total++;
    }
    if (!total) {
        rc = tool_fail(err, errlen, TARTAN_EEMPTY, "%s: no judgments", path);
        goto fail;
    }
    for (size_t i = 0; i < q->qids.n; i++) {
        tool_qrels_query *qq = &q->q[i];
        qsort(qq->j, qq->n, sizeof *qq->j, by_doc);
        for (size_t k = 1; k < qq->n; k++) {
            if (qq->j[k].doc != qq->j[k - 1].doc)
                continue;
            size_t a = qq->j[k - 1].line, b = qq->j[k].line;
            rc = tool_fail(err, errlen, TARTAN_EDUPID,
                           "%s:%zu: document '%.80s' judged again for query '%.80s' (first on "
                           "line %zu)",
                           path, a > b ? a : b, q->docids.keys[qq->j[k].doc], q->qids.keys[i],
                           a < b ? a : b);
            goto fail;
        }
    }
    tool_textfile_free(&f);
    return 0;
nomem:
    rc = tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
fail:
    tool_textfile_free(&f);
    tool_qrels_free(q);
    return rc;
}

const tool_judgment *tool_qrels_find(const tool_qrels *q, size_t query, long doc)
{
    if (query >= q->qids.n)
        return NULL;
    const tool_qrels_query *qq = &q->q[query];
    size_t lo = 0, hi = qq->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (qq->j[mid].doc < doc)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < qq->n && qq->j[lo].doc == doc ? &qq->j[lo] : NULL;
}

void tool_qrels_free(tool_qrels *q)
{
    if (q->q)
        for (size_t i = 0; i < q->qids.n; i++)
            free(q->q[i].j);
    free(q->q);
    tool_strtab_free(&q->qids);
    tool_strtab_free(&q->docids);
    memset(q, 0, sizeof *q);
}
