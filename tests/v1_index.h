/*
 * v1_index.h: a format-version-1 index for the conversion tests, written with plain LMDB from
 * storage/FORMAT.md's description of version 1 (no tartan writer of version 1 is left): the
 * same content as an index of the current version, laid out as version 1 laid it out.
 */
#ifndef TARTAN_TESTS_V1_INDEX_H
#define TARTAN_TESTS_V1_INDEX_H

/* Writes at dst (a directory that must not exist) a version-1 index holding src's header,
 * codec, centroids (as fp32), documents, inverted lists and ids. */
void v1_index_from(const char *src, const char *dst);

#endif
