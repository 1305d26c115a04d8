/* version.c: the run-time version, which a test checks against the header and configure. */
#include "tartan.h"

const char *tartan_version(int *major, int *minor, int *patch)
{
    if (major)
        *major = TARTAN_VERSION_MAJOR;
    if (minor)
        *minor = TARTAN_VERSION_MINOR;
    if (patch)
        *patch = TARTAN_VERSION_PATCH;
    return TARTAN_VERSION_STRING;
}
