/* check_engine.c: the public API's version and error model. */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tartan.h"

START_TEST(test_engine_version_agrees)
{
    int ma = -1, mi = -1, pa = -1;
    const char *v = tartan_version(&ma, &mi, &pa);
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(ma, TARTAN_VERSION_MAJOR);
    ck_assert_int_eq(mi, TARTAN_VERSION_MINOR);
    ck_assert_int_eq(pa, TARTAN_VERSION_PATCH);
    ck_assert_str_eq(v, TARTAN_VERSION_STRING);
    /* configure.ac's AC_INIT version is the package's: header and library must match it. */
    ck_assert_str_eq(v, PACKAGE_VERSION);
    char buf[64];
    snprintf(buf, sizeof buf, "%d.%d.%d", ma, mi, pa);
    ck_assert_str_eq(buf, v);
    ck_assert_int_eq(TARTAN_VERSION_NUMBER, ma * 10000 + mi * 100 + pa);
    /* NULL outputs are allowed. */
    ck_assert_str_eq(tartan_version(NULL, NULL, NULL), v);
}
END_TEST

static const int all_codes[] = {
#define XX(name, value, text) TARTAN_##name,
    TARTAN_ERRNO_MAP(XX)
#undef XX
};
static const char *const all_names[] = {
#define XX(name, value, text) "TARTAN_" #name,
    TARTAN_ERRNO_MAP(XX)
#undef XX
};
#define N_CODES (sizeof all_codes / sizeof all_codes[0])

START_TEST(test_engine_error_codes_in_band_and_unique)
{
    ck_assert_int_ge(N_CODES, 20);
    for (size_t i = 0; i < N_CODES; i++) {
        ck_assert_int_lt(all_codes[i], -30899);
        ck_assert_int_gt(all_codes[i], -31000);
        for (size_t j = i + 1; j < N_CODES; j++)
            ck_assert_int_ne(all_codes[i], all_codes[j]);
    }
}
END_TEST

START_TEST(test_engine_strerror_names_every_code)
{
    for (size_t i = 0; i < N_CODES; i++) {
        const char *s = tartan_strerror(all_codes[i]);
        const char *n = tartan_err_name(all_codes[i]);
        ck_assert_ptr_nonnull(n);
        ck_assert_str_eq(n, all_names[i]);
        /* The message starts with the code's name, then ": " and a description. */
        size_t len = strlen(all_names[i]);
        ck_assert_int_eq(strncmp(s, all_names[i], len), 0);
        ck_assert_int_eq(strncmp(s + len, ": ", 2), 0);
        ck_assert_int_gt(strlen(s + len + 2), 5);
    }
    ck_assert_str_eq(tartan_err_name(TARTAN_OK), "TARTAN_OK");
    ck_assert_int_eq(strncmp(tartan_strerror(0), "TARTAN_OK", 9), 0);
}
END_TEST

START_TEST(test_engine_strerror_passes_errno_through)
{
    const char *s = tartan_strerror(ENOMEM);
    ck_assert_int_eq(strncmp(s, "ENOMEM: ", 8), 0);
    ck_assert_ptr_nonnull(strstr(s, strerror(ENOMEM)));
    s = tartan_strerror(ENOENT);
    ck_assert_int_eq(strncmp(s, "ENOENT: ", 8), 0);
    ck_assert_str_eq(tartan_err_name(EACCES), "EACCES");
}
END_TEST

START_TEST(test_engine_strerror_unknown_code)
{
    ck_assert_str_eq(tartan_strerror(-12345), "unknown error -12345");
    ck_assert_ptr_null(tartan_err_name(-12345));
    ck_assert_str_eq(tartan_strerror(-30999), "unknown error -30999");
}
END_TEST

static Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"version", test_engine_version_agrees},
        {"codes", test_engine_error_codes_in_band_and_unique},
        {"strerror", test_engine_strerror_names_every_code},
        {"errno", test_engine_strerror_passes_errno_through},
        {"unknown", test_engine_strerror_unknown_code},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(engine_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
