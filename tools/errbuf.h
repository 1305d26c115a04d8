/* errbuf.h: how the tool's file readers report a failure: a code and a message in the
 * caller's buffer. */
#ifndef TARTAN_TOOLS_ERRBUF_H
#define TARTAN_TOOLS_ERRBUF_H

#include <stddef.h>

/*
 * tool_fail: formats a message into err (errlen bytes, truncated to fit, always terminated
 * when errlen > 0) and returns code, so that a reader can say `return tool_fail(...)`.
 */
int tool_fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
