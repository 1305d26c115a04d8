/*
 * fixture.h: the test programs' shared fixture: a fresh temporary directory per test, with the
 * path of an index inside it, removed after the test (Check runs setup and teardown in the
 * forked child, so each test sees its own).
 */
#ifndef TARTAN_TESTS_FIXTURE_H
#define TARTAN_TESTS_FIXTURE_H

/* The current test's directory and the index path inside it ("<tmpdir>/ix"). */
extern char tmpdir[256];
extern char ixpath[300];

/* Creates /tmp/tartan-<name>-XXXXXX (failing the test if it cannot). */
void fixture_dir_create(const char *name);

/* Removes the directory and everything below it, first making the directory and the index
 * writable again (tests that check read-only directories take the write bit away). */
void fixture_dir_remove(void);

#endif
