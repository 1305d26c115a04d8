/* jsonl.c: ids from BEIR JSON-lines files, and JSON strings written (see jsonl.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "jsonl.h"
#include "tartan.h"
#include "textfile.h"

/* Deeper nesting than any BEIR metadata; the bound keeps the recursion's stack small. */
#define MAX_DEPTH 256

typedef struct scan {
    const char *p, *end;
    const char *why; /* what was wrong, for the message */
} scan;

static void ws(scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d == 16)
            return -1;
        *v = *v << 4 | d;
    }
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/*
 * A string at s->p (on its opening quote). With out, writes the unescaped bytes there (the
 * caller gives room for as many bytes as the literal has: unescaping never grows it) and
 * sets *outlen.
 */
static int string(scan *s, char *out, size_t *outlen)
{
    size_t o = 0;
    s->p++;
    while (s->p < s->end && *s->p != '"') {
        unsigned char c = (unsigned char)*s->p;
        if (c < 0x20) {
            s->why = "control character inside a string";
            return -1;
        }
        if (c != '\\') {
            if (out)
                out[o++] = (char)c;
            s->p++;
            continue;
        }
        if (s->end - s->p < 2) {
            s->why = "unterminated escape";
            return -1;
        }
        char e = s->p[1];
        s->p += 2;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *simple = strchr(from, e);
        if (e && simple) {
            if (out)
                out[o++] = to[simple - from];
            continue;
        }
        unsigned cp, lo;
        if (e != 'u' || s->end - s->p < 4 || hex4(s->p, &cp)) {
            s->why = "bad escape in a string";
            return -1;
        }
        s->p += 4;
        if (cp >= 0xD800 && cp < 0xDC00) {
            /* A surrogate pair: \uD83D\uDE00 is one code point (6 bytes in, 4 out). */
            if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' || hex4(s->p + 2, &lo) ||
                lo < 0xDC00 || lo > 0xDFFF) {
                s->why = "unpaired surrogate in a string";
                return -1;
            }
            s->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
            s->why = "unpaired surrogate in a string";
            return -1;
        }
        if (out)
            o += put_utf8(out + o, cp);
    }
    if (s->p >= s->end) {
        s->why = "unterminated string";
        return -1;
    }
    s->p++;
    if (outlen)
        *outlen = o;
    return 0;
}

static int number(scan *s)
{
    const char *p = s->p;
    if (p < s->end && *p == '-')
        p++;
    if (p >= s->end || *p < '0' || *p > '9') {
        s->why = "unexpected character";
        return -1;
    }
    if (*p == '0')
        p++;
    else
        while (p < s->end && *p >= '0' && *p <= '9')
            p++;
    if (p < s->end && *p == '.') {
        p++;
        if (p >= s->end || *p < '0' || *p > '9') {
            s->why = "bad number";
            return -1;
        }
        while (p < s->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < s->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < s->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= s->end || *p < '0' || *p > '9') {
            s->why = "bad number";
            return -1;
        }
        while (p < s->end && *p >= '0' && *p <= '9')
            p++;
    }
    s->p = p;
    return 0;
}

static int value(scan *s, int depth);

static int literal(scan *s, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n)) {
        s->why = "unexpected character";
        return -1;
    }
    s->p += n;
    return 0;
}

/* An object or array at s->p; for the top-level object, reports where "_id"'s value is. */
static int container(scan *s, int depth, const char **id_at)
{
    char close = *s->p == '{' ? '}' : ']';
    if (depth >= MAX_DEPTH) {
        s->why = "nested too deeply";
        return -1;
    }
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return 0;
    }
    for (;;) {
        ws(s);
        if (close == '}') {
            if (s->p >= s->end || *s->p != '"') {
                s->why = "expected a member name";
                return -1;
            }
            const char *k = s->p;
            if (string(s, NULL, NULL))
                return -1;
            int is_id = s->p - k == 5 && !memcmp(k, "\"_id\"", 5);
            ws(s);
            if (s->p >= s->end || *s->p != ':') {
                s->why = "expected ':'";
                return -1;
            }
            s->p++;
            ws(s);
            if (is_id && id_at) {
                if (*id_at) {
                    s->why = "two \"_id\" members";
                    return -1;
                }
                *id_at = s->p;
            }
        }
        if (value(s, depth + 1))
            return -1;
        ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return 0;
        }
        s->why = close == '}' ? "expected ',' or '}'" : "expected ',' or ']'";
        return -1;
    }
}

static int value(scan *s, int depth)
{
    ws(s);
    if (s->p >= s->end) {
        s->why = "missing value";
        return -1;
    }
    switch (*s->p) {
    case '{':
    case '[':
        return container(s, depth, NULL);
    case '"':
        return string(s, NULL, NULL);
    case 't':
        return literal(s, "true");
    case 'f':
        return literal(s, "false");
    case 'n':
        return literal(s, "null");
    default:
        return number(s);
    }
}

int tool_jsonl_ids(tool_idlist *l, const char *path, char *err, size_t errlen)
{
    memset(l, 0, sizeof *l);
    tool_textfile f;
    int rc = tool_textfile_read(&f, path, err, errlen);
    if (rc)
        return rc;
    char *line, *id = NULL;
    size_t len;
    size_t *first_line = NULL, cap = 0;
    while (tool_textfile_next(&f, &line, &len)) {
        scan s = {line, line + len, NULL};
        ws(&s);
        if (s.p == s.end)
            continue;
        if (*s.p != '{') {
            rc =
                tool_fail(err, errlen, TARTAN_EFORMAT, "%s:%zu: not a JSON object", path, f.lineno);
            goto fail;
        }
        const char *id_at = NULL;
        if (container(&s, 0, &id_at) == 0) {
            ws(&s);
            if (s.p != s.end)
                s.why = "text after the object";
        }
        if (s.why) {
            rc = tool_fail(err, errlen, TARTAN_EFORMAT, "%s:%zu: malformed JSON: %s (byte %zu)",
                           path, f.lineno, s.why, (size_t)(s.p - line) + 1);
            goto fail;
        }
        if (!id_at) {
            rc =
                tool_fail(err, errlen, TARTAN_EFORMAT, "%s:%zu: no \"_id\" member", path, f.lineno);
            goto fail;
        }
        /* Scan the id's value again, this time keeping it. */
        scan v = {id_at, line + len, NULL};
        size_t n;
        free(id);
        id = malloc(len + 1);
        if (!id)
            goto nomem;
        if (*id_at == '"') {
            string(&v, id, &n);
        } else if (*id_at == '-' || (*id_at >= '0' && *id_at <= '9')) {
            number(&v);
            n = (size_t)(v.p - id_at);
            memcpy(id, id_at, n);
        } else {
            rc = tool_fail(err, errlen, TARTAN_EFORMAT,
                           "%s:%zu: \"_id\" is neither a string nor a number", path, f.lineno);
            goto fail;
        }
        id[n] = '\0';
        if (n == 0 || strlen(id) != n || strpbrk(id, " \t\r\n\v\f")) {
            rc = tool_fail(err, errlen, TARTAN_EBADID,
                           "%s:%zu: id '%.80s' is empty or contains whitespace or NUL, which "
                           "TREC runs cannot carry",
                           path, f.lineno, id);
            goto fail;
        }
        int added;
        long k = tool_strtab_intern(&l->tab, id, n, &added);
        if (k < 0)
            goto nomem;
        if (!added) {
            rc = tool_fail(err, errlen, TARTAN_EDUPID,
                           "%s:%zu: duplicate id '%.80s' (first on line %zu)", path, f.lineno, id,
                           first_line[k]);
            goto fail;
        }
        if ((size_t)k >= cap) {
            size_t c = cap ? cap * 2 : 1024;
            size_t *nf = realloc(first_line, c * sizeof *nf);
            if (!nf)
                goto nomem;
            first_line = nf;
            cap = c;
        }
        first_line[k] = f.lineno;
    }
    l->n = l->tab.n;
    l->ids = l->tab.keys;
    free(id);
    free(first_line);
    tool_textfile_free(&f);
    return 0;
nomem:
    rc = tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
fail:
    free(id);
    free(first_line);
    tool_textfile_free(&f);
    tool_idlist_free(l);
    return rc;
}

void tool_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}
