/*
 * tartan.h: the public interface of libtartan, an embedded retrieval engine for
 * late-interaction (multi-vector) embeddings such as ColBERT and ColPali.
 *
 * This header is the manual. Anything not declared here is not API. It includes only
 * <stddef.h> and <stdint.h>; no type of LMDB, FAISS or CUDA reaches an application.
 *
 * Conventions
 * -----------
 * - Every function that can fail returns int: 0 (TARTAN_OK) for success, a negative
 *   TARTAN_E... code for the engine's own errors, or a positive errno value for the
 *   system's (ENOMEM, EACCES, ENOSPC, ...). tartan_strerror() names any of them.
 * - A handle keeps the detailed message of its last failure (tartan_errmsg()).
 * - Inputs are const pointers owned by the caller; the library never keeps them after a call
 *   returns. Sizes are size_t. The handle comes first, outputs last.
 * - The library never prints, never calls exit() or abort() on bad input.
 */
#ifndef TARTAN_H
#define TARTAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define TARTAN_API
#else
#define TARTAN_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------- */

#define TARTAN_VERSION_MAJOR 0
#define TARTAN_VERSION_MINOR 1
#define TARTAN_VERSION_PATCH 0
#define TARTAN_VERSION_STRING "0.1.0"
/* One number that compares in version order: 10000 * major + 100 * minor + patch. */
#define TARTAN_VERSION_NUMBER                                                                  \
    (TARTAN_VERSION_MAJOR * 10000 + TARTAN_VERSION_MINOR * 100 + TARTAN_VERSION_PATCH)

/*
 * tartan_version: the version of the library linked at run time.
 *   major, minor, patch: out, each may be NULL.
 * Returns the version as a string ("0.1.0"), static, never NULL. Any thread may call it.
 */
TARTAN_API const char *tartan_version(int *major, int *minor, int *patch);

/* ---------------------------------------------------------------------------------------
 * Errors
 *
 * The engine's codes, defined once here: XX(NAME, value, description). Values sit in a
 * reserved negative band (-30999 .. -30900) so that they never meet an errno value (positive)
 * nor TARTAN_OK (0).
 * ------------------------------------------------------------------------------------- */

#define TARTAN_ERRNO_MAP(XX)                                                                   \
    XX(EINVAL, -30900, "invalid argument")                                                     \
    XX(EDIM, -30901, "dimension mismatch")                                                     \
    XX(ENONFINITE, -30902, "NaN or infinity in input")                                         \
    XX(EEMPTY, -30903, "empty document, query or input")                                       \
    XX(ETOOBIG, -30904, "input or value too large")                                            \
    XX(EDUPID, -30905, "duplicate external id")                                                \
    XX(EBADID, -30906, "empty or malformed external id")                                       \
    XX(ENOTFOUND, -30907, "no such document or id")                                            \
    XX(ERANGE, -30908, "parameter out of range")                                               \
    XX(EEXIST, -30909, "index already exists")                                                 \
    XX(ENOINDEX, -30910, "not a tartan index")                                                 \
    XX(EVERSION, -30911, "unsupported index format version")                                   \
    XX(ECORRUPT, -30912, "index data is damaged")                                              \
    XX(EREADONLY, -30913, "index is open read-only")                                           \
    XX(ENOTTRAINED, -30914, "index has no centroids yet")                                      \
    XX(EFORMAT, -30915, "malformed file")                                                      \
    XX(ETRUNC, -30916, "truncated file")                                                       \
    XX(EDTYPE, -30917, "unsupported data type")                                                \
    XX(ESTORAGE, -30918, "storage engine error")                                               \
    XX(ETRAIN, -30919, "centroid training failed")                                             \
    XX(ENODEV, -30920, "no usable GPU")                                                        \
    XX(EDEVICE, -30921, "GPU error")                                                           \
    XX(ENOTSUP, -30922, "not supported by this build")                                         \
    XX(EINTERNAL, -30923, "internal error")

/* TARTAN_OK and one TARTAN_E<NAME> per entry of the list above. */
enum tartan_errno {
    TARTAN_OK = 0,
#define TARTAN_XX_ENUM(name, value, text) TARTAN_##name = (value),
    TARTAN_ERRNO_MAP(TARTAN_XX_ENUM)
#undef TARTAN_XX_ENUM
};

/*
 * tartan_strerror: a description of any code a tartan function returns.
 *   code: in; TARTAN_OK, a TARTAN_E... code, or a positive errno value.
 * Returns a string that starts with the code's name ("TARTAN_EDIM: dimension mismatch",
 * "ENOMEM: Cannot allocate memory"); an unknown code gets "unknown error N". Never NULL.
 * Engine codes get static strings; the text for an errno value lives in a per-thread buffer,
 * valid until the same thread calls again. Any thread may call it.
 */
TARTAN_API const char *tartan_strerror(int code);

/*
 * tartan_err_name: the name of a code ("TARTAN_EDIM", "ENOENT"), or NULL if unknown.
 * Static string. Any thread may call it.
 */
TARTAN_API const char *tartan_err_name(int code);

#ifdef __cplusplus
}
#endif

#endif /* TARTAN_H */
