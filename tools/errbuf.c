/* errbuf.c: the tool's failure messages (see errbuf.h). */
#include <stdarg.h>
#include <stdio.h>

#include "errbuf.h"

int tool_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
