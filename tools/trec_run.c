/* trec_run.c: reading and writing TREC runs (see trec_run.h). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "errbuf.h"
#include "fields.h"
#include "tartan.h"
#include "textfile.h"
#include "trec_run.h"

static int by_doc(const void *a, const void *b)
{
    const tool_run_doc *x = a, *y = b;
    return (x->doc > y->doc) - (x->doc < y->doc);
}

int tool_run_read(tool_run *r, const char *path, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    tool_textfile f;
    int rc = tool_textfile_read(&f, path, err, errlen);
    if (rc)
        return rc;
    size_t qcap = 0;
    char *line;
    size_t len;
    while (tool_textfile_next(&f, &line, &len)) {
        char *fl[7];
        size_t nf = tool_split_fields(line, fl, 6);
        if (nf == 0 || fl[0][0] == '#')
            continue;
        if (nf != 6) {
            rc = tool_fail(err, errlen, TARTAN_EFORMAT,
                           "%s:%zu: %s%zu fields; a run line has 6 (qid Q0 docid rank score "
                           "tag)",
                           path, f.lineno, nf > 6 ? "more than " : "", nf > 6 ? (size_t)6 : nf);
            goto fail;
        }
        char *end;
        double score = strtod(fl[4], &end);
        if (end == fl[4] || *end || isnan(score)) {
            rc = tool_fail(err, errlen, TARTAN_EFORMAT, "%s:%zu: score '%.40s' is not a number",
                           path, f.lineno, fl[4]);
            goto fail;
        }
        long qi = tool_strtab_intern(&r->qids, fl[0], strlen(fl[0]), NULL);
        long di = tool_strtab_intern(&r->docids, fl[2], strlen(fl[2]), NULL);
        if (qi < 0 || di < 0)
            goto nomem;
        if (tool_array_reserve((void **)&r->q, &qcap, (size_t)qi + 1, sizeof *r->q, 64))
            goto nomem;
        tool_run_query *rq = &r->q[qi];
        if (tool_array_reserve((void **)&rq->d, &rq->cap, rq->n + 1, sizeof *rq->d, 16))
            goto nomem;
        rq->d[rq->n++] = (tool_run_doc){.doc = di, .score = score, .line = f.lineno};
        r->lines++;
    }
    if (!r->lines) {
        rc = tool_fail(err, errlen, TARTAN_EEMPTY, "%s: no results", path);
        goto fail;
    }
    /* Duplicates: sort a copy by document, so that the file order stays. */
    size_t maxn = 0;
    for (size_t i = 0; i < r->qids.n; i++)
        maxn = r->q[i].n > maxn ? r->q[i].n : maxn;
    tool_run_doc *tmp = malloc(maxn * sizeof *tmp);
    if (!tmp)
        goto nomem;
    for (size_t i = 0; i < r->qids.n && !rc; i++) {
        memcpy(tmp, r->q[i].d, r->q[i].n * sizeof *tmp);
        qsort(tmp, r->q[i].n, sizeof *tmp, by_doc);
        for (size_t k = 1; k < r->q[i].n; k++) {
            if (tmp[k].doc != tmp[k - 1].doc)
                continue;
            size_t a = tmp[k - 1].line, b = tmp[k].line;
            rc = tool_fail(err, errlen, TARTAN_EDUPID,
                           "%s:%zu: document '%.80s' retrieved again for query '%.80s' (first "
                           "on line %zu)",
                           path, a > b ? a : b, r->docids.keys[tmp[k].doc], r->qids.keys[i],
                           a < b ? a : b);
            break;
        }
    }
    free(tmp);
    if (rc)
        goto fail;
    tool_textfile_free(&f);
    return 0;
nomem:
    rc = tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
fail:
    tool_textfile_free(&f);
    tool_run_free(r);
    return rc;
}

void tool_run_free(tool_run *r)
{
    if (r->q)
        for (size_t i = 0; i < r->qids.n; i++)
            free(r->q[i].d);
    free(r->q);
    tool_strtab_free(&r->qids);
    tool_strtab_free(&r->docids);
    memset(r, 0, sizeof *r);
}

/* Whether a score is written as a float32 (the shortest digits that read back as that float). */
static int is_float_score(double s)
{
    return (double)(float)s == s;
}

static int sign(double a)
{
    return (a > 0) - (a < 0);
}

/*
 * The fewest significant digits that read back as the same value: as a float32 when the
 * score is one (at most 9 digits: 0.5, not 0.50000000000000000), else as a double (at most
 * 17). Distinct float32 scores keep their order when read back as doubles (their rounding
 * intervals do not overlap) and equal ones stay equal; doubles read back exactly. What is
 * left is a float32 next to a double inside that float's rounding interval: the short digits
 * could cross it. So a float's digits must also keep its order against each neighbour that
 * is a double (s[-1] and s[1] where present), and where no 6-9 digit form does, the float is
 * written as the exact double it is. trec_eval's reordering by score then reproduces the
 * order given.
 */
static void format_score(const double *s, size_t i, size_t n, char *buf, size_t len)
{
    double v = s[i];
    if (is_float_score(v)) {
        for (int digits = 6; digits <= 9; digits++) {
            snprintf(buf, len, "%.*g", digits, v);
            if (strtof(buf, NULL) != (float)v)
                continue;
            double back = strtod(buf, NULL);
            int ok = 1;
            for (int side = -1; side <= 1; side += 2) {
                if ((side < 0 && i == 0) || (side > 0 && i + 1 >= n))
                    continue;
                double w = s[(ptrdiff_t)i + side];
                if (!is_float_score(w) && sign(back - w) != sign(v - w))
                    ok = 0;
            }
            if (ok)
                return;
        }
    }
    for (int digits = 15;; digits++) {
        snprintf(buf, len, "%.*g", digits, v);
        if (digits >= 17 || strtod(buf, NULL) == v)
            return;
    }
}

static int bad_id(const char *s)
{
    return !s || !*s || strpbrk(s, " \t\r\n\v\f") != NULL;
}

int tool_run_write(FILE *f, const char *qid, const char *const *docids, const double *scores,
                   size_t n, const char *tag)
{
    if (bad_id(qid) || bad_id(tag))
        return TARTAN_EBADID;
    for (size_t i = 0; i < n; i++) {
        if (bad_id(docids[i]))
            return TARTAN_EBADID;
        if (!isfinite(scores[i]))
            return TARTAN_ENONFINITE;
    }
    for (size_t i = 0; i < n; i++) {
        char num[40];
        format_score(scores, i, n, num, sizeof num);
        if (fprintf(f, "%s Q0 %s %zu %s %s\n", qid, docids[i], i + 1, num, tag) < 0)
            return errno ? errno : EIO;
    }
    return ferror(f) ? (errno ? errno : EIO) : 0;
}
