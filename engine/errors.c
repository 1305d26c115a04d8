/* errors.c: names and descriptions of every code the library returns. */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tartan.h"

const char *tartan_err_name(int code)
{
    switch (code) {
    case TARTAN_OK:
        return "TARTAN_OK";
#define XX(name, value, text)                                                                  \
    case TARTAN_##name:                                                                        \
        return "TARTAN_" #name;
        TARTAN_ERRNO_MAP(XX)
#undef XX
    default:
        break;
    }
#ifdef HAVE_STRERRORNAME_NP
    if (code > 0)
        return strerrorname_np(code);
#endif
    return NULL;
}

const char *tartan_strerror(int code)
{
    switch (code) {
    case TARTAN_OK:
        return "TARTAN_OK: success";
#define XX(name, value, text)                                                                  \
    case TARTAN_##name:                                                                        \
        return "TARTAN_" #name ": " text;
        TARTAN_ERRNO_MAP(XX)
#undef XX
    default:
        break;
    }
    /* System codes have no static text of this shape: each thread formats its own, kept until
     * that thread's next call. */
    static _Thread_local char buf[160];
    if (code > 0) {
        const char *name = tartan_err_name(code);
        char text[120];
        /* GNU strerror_r returns the text, which may or may not be in our buffer. */
        const char *t = strerror_r(code, text, sizeof text);
        snprintf(buf, sizeof buf, "%s: %s", name ? name : "errno", t);
    } else {
        snprintf(buf, sizeof buf, "unknown error %d", code);
    }
    return buf;
}
