/* textfile.c: whole-file reading and line splitting (see textfile.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errbuf.h"
#include "tartan.h"
#include "textfile.h"

int tool_file_read(const char *path, char **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    int is_stdin = !strcmp(path, "-");
    int fd = is_stdin ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tool_fail(err, errlen, errno, "%s: %s", path, strerror(errno));
    struct stat st;
    size_t cap = 1 << 16;
    /* Size the buffer from the file where it has one; pipes grow it as they go. */
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size + 1 > cap)
        cap = (size_t)st.st_size + 1;
    char *buf = malloc(cap);
    size_t len = 0;
    int rc = 0;
    if (!buf) {
        rc = tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (;;) {
        if (cap - len < 2) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                rc = tool_fail(err, errlen, ENOMEM, "%s: out of memory", path);
                goto done;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = tool_fail(err, errlen, errno, "%s: %s", path, strerror(errno));
            goto done;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    buf = NULL;
done:
    free(buf);
    if (!is_stdin)
        close(fd);
    return rc;
}

int tool_textfile_read(tool_textfile *f, const char *path, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    char *buf;
    size_t len;
    int rc = tool_file_read(path, &buf, &len, err, errlen);
    if (rc)
        return rc;
    const char *nul = memchr(buf, '\0', len);
    if (nul) {
        size_t line = 1;
        for (const char *p = buf; p < nul; p++)
            line += *p == '\n';
        free(buf);
        return tool_fail(err, errlen, TARTAN_EFORMAT, "%s:%zu: NUL byte (not a text file?)", path,
                         line);
    }
    f->buf = buf;
    f->len = len;
    /* A byte order mark is an editor's habit, not part of the first id. */
    if (f->len >= 3 && !memcmp(f->buf, "\xEF\xBB\xBF", 3))
        f->pos = 3;
    return 0;
}

int tool_textfile_next(tool_textfile *f, char **line, size_t *len)
{
    if (!f->buf || f->pos >= f->len)
        return 0;
    char *s = f->buf + f->pos;
    char *nl = memchr(s, '\n', f->len - f->pos);
    size_t n = nl ? (size_t)(nl - s) : f->len - f->pos;
    f->pos += n + (nl ? 1 : 0);
    if (n && s[n - 1] == '\r')
        n--;
    s[n] = '\0';
    f->lineno++;
    *line = s;
    *len = n;
    return 1;
}

void tool_textfile_free(tool_textfile *f)
{
    free(f->buf);
    memset(f, 0, sizeof *f);
}
