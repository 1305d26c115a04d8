/*
 * check_tools_ids.c: the tool layer's id files: id lists (one id a line) and JSON lines
 * (BEIR's corpus and queries), read back and bad lines refused with the line named.
 */
#define _GNU_SOURCE
#include "config.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "evaluate.h"
#include "fixture.h"
#include "idlist.h"
#include "jsonl.h"
#include "kernels.h"
#include "metrics.h"
#include "npy.h"
#include "qrels.h"
#include "synth.h"
#include "tartan.h"
#include "trec_run.h"

/* ---- id lists ----------------------------------------------------------------------------- */

START_TEST(test_tools_idlist_reads_ids)
{
    char err[512];
    tool_idlist l;
    const char *p = fx_path("ids.txt");
    /* LF, CRLF, a byte order mark, and no newline at the end. */
    const char *text = "\xEF\xBB\xBF"
                       "doc-1\r\ndoc-2\ndoc_3\r\n4";
    fx_write_file(p, text, strlen(text));
    ck_assert_msg(tool_idlist_read(&l, p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(l.n, 4);
    ck_assert_str_eq(l.ids[0], "doc-1");
    ck_assert_str_eq(l.ids[1], "doc-2");
    ck_assert_str_eq(l.ids[2], "doc_3");
    ck_assert_str_eq(l.ids[3], "4");
    ck_assert_int_eq(tool_idlist_find(&l, "doc_3"), 2);
    ck_assert_int_eq(tool_idlist_find(&l, "4"), 3);
    ck_assert_int_eq(tool_idlist_find(&l, "doc"), -1);
    tool_idlist_free(&l);
    tool_idlist_free(&l);

    /* Many ids, in order, found again. */
    FILE *f = fopen(p, "w");
    for (int i = 0; i < 50000; i++)
        fprintf(f, "id%07d\n", i * 7);
    fclose(f);
    ck_assert_int_eq(tool_idlist_read(&l, p, err, sizeof err), 0);
    ck_assert_uint_eq(l.n, 50000);
    for (int i = 0; i < 50000; i += 997) {
        char id[32];
        snprintf(id, sizeof id, "id%07d", i * 7);
        ck_assert_str_eq(l.ids[i], id);
        ck_assert_int_eq(tool_idlist_find(&l, id), i);
    }
    tool_idlist_free(&l);

    fx_write_file(p, "", 0);
    ck_assert_int_eq(tool_idlist_read(&l, p, err, sizeof err), 0);
    ck_assert_uint_eq(l.n, 0);
    tool_idlist_free(&l);
}
END_TEST

static void expect_idlist_error(const char *text, size_t len, int code, const char *phrase)
{
    char err[512] = "";
    tool_idlist l;
    const char *p = fx_path("bad_ids.txt");
    fx_write_file(p, text, len);
    int rc = tool_idlist_read(&l, p, err, sizeof err);
    ck_assert_msg(rc == code, "got %d (%s), want %d", rc, err, code);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_uint_eq(l.n, 0);
    ck_assert_ptr_null(l.ids);
}

START_TEST(test_tools_idlist_rejects_bad_lines)
{
    expect_idlist_error("a\nb\n\nc\n", 7, TARTAN_EBADID, "bad_ids.txt:3: empty line");
    expect_idlist_error("a\r\n\r\n", 5, TARTAN_EBADID, "bad_ids.txt:2: empty line");
    expect_idlist_error("a\nb\nc\nb\n", 8, TARTAN_EDUPID,
                        "bad_ids.txt:4: duplicate id 'b' (first on line 2)");
    expect_idlist_error("a\nb c\n", 6, TARTAN_EBADID,
                        "bad_ids.txt:2: id 'b c' contains whitespace");
    expect_idlist_error("a\tx\n", 4, TARTAN_EBADID, ":1: id");
    expect_idlist_error("a\nb\0c\n", 6, TARTAN_EFORMAT, "bad_ids.txt:2: NUL byte");
    char err[512];
    tool_idlist l;
    ck_assert_int_eq(tool_idlist_read(&l, fx_path("none.txt"), err, sizeof err), ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "none.txt"));
}
END_TEST

/* ---- JSON lines ------------------------------------------------------------------------------ */

START_TEST(test_tools_jsonl_reads_ids)
{
    char err[512];
    tool_idlist l;
    const char *p = fx_path("corpus.jsonl");
    /* Escapes and braces inside text, a nested "_id" that is not the document's, \u escapes
     * in an id (é, and U+1F600 as a surrogate pair), a numeric id, CRLF, a blank line, "_id"
     * after other members. */
    fx_write_text(
        p, "{\"_id\": \"doc1\", \"title\": \"a \\\"quoted\\\" {brace} [x]\", \"text\": \"t\"}\n"
           "{\"text\": \"x\\\\\", \"metadata\": {\"_id\": \"inner\", \"l\": [1, -2.5e3, "
           "true, null, {}]}, \"_id\":\"caf\\u00e9\"}\r\n"
           "\r\n"
           "  {\"_id\": \"smile\\ud83d\\ude00\\/\"}  \n"
           "{\"_id\": 12345}\n");
    ck_assert_msg(tool_jsonl_ids(&l, p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(l.n, 4);
    ck_assert_str_eq(l.ids[0], "doc1");
    ck_assert_str_eq(l.ids[1], "caf\xC3\xA9");
    ck_assert_str_eq(l.ids[2], "smile\xF0\x9F\x98\x80/");
    ck_assert_str_eq(l.ids[3], "12345");
    ck_assert_int_eq(tool_idlist_find(&l, "inner"), -1);
    ck_assert_int_eq(tool_idlist_find(&l, "12345"), 3);
    tool_idlist_free(&l);
}
END_TEST

static void expect_jsonl_error(const char *text, int code, const char *phrase)
{
    char err[512] = "";
    tool_idlist l;
    fx_write_text(fx_path("bad.jsonl"), text);
    int rc = tool_jsonl_ids(&l, fx_path("bad.jsonl"), err, sizeof err);
    ck_assert_msg(rc == code, "%s: got %d (%s), want %d", text, rc, err, code);
    ck_assert_msg(strstr(err, phrase) != NULL, "message '%s' lacks '%s'", err, phrase);
    ck_assert_uint_eq(l.n, 0);
}

START_TEST(test_tools_jsonl_rejects_bad_lines)
{
    const char *ok = "{\"_id\": \"a\"}\n";
    char buf[2048];
    struct {
        const char *line;
        int code;
        const char *phrase;
    } bad[] = {
        {"[\"_id\", \"b\"]", TARTAN_EFORMAT, ":2: not a JSON object"},
        {"{\"_id\": \"b\"", TARTAN_EFORMAT, ":2: malformed JSON: expected ',' or '}'"},
        {"{\"_id\" \"b\"}", TARTAN_EFORMAT, "expected ':'"},
        {"{\"_id\": \"b}", TARTAN_EFORMAT, "unterminated string"},
        {"{\"_id\": \"b\", \"t\": \"\\x\"}", TARTAN_EFORMAT, "bad escape"},
        {"{\"_id\": \"b\", \"t\": \"\\ud800\"}", TARTAN_EFORMAT, "unpaired surrogate"},
        {"{\"_id\": \"b\", \"t\": tru}", TARTAN_EFORMAT, "unexpected character"},
        {"{\"_id\": \"b\", \"t\": 1.}", TARTAN_EFORMAT, "bad number"},
        {"{\"_id\": \"b\"} x", TARTAN_EFORMAT, "text after the object"},
        {"{\"_id\": \"b\", \"_id\": \"c\"}", TARTAN_EFORMAT, "two \"_id\""},
        {"{\"id\": \"b\"}", TARTAN_EFORMAT, ":2: no \"_id\" member"},
        {"{\"_id\": null}", TARTAN_EFORMAT, "neither a string nor a number"},
        {"{\"_id\": \"\"}", TARTAN_EBADID, ":2: id '' is empty"},
        {"{\"_id\": \"b c\"}", TARTAN_EBADID, "whitespace"},
        {"{\"_id\": \"b\\u0000\"}", TARTAN_EBADID, "NUL"},
        {"{\"_id\": \"a\"}", TARTAN_EDUPID, "bad.jsonl:2: duplicate id 'a' (first on line 1)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, "%s%s\n", ok, bad[i].line);
        expect_jsonl_error(buf, bad[i].code, bad[i].phrase);
    }
    /* Deep nesting is refused, not recursed into without bound. */
    strcpy(buf, ok);
    strcat(buf, "{\"_id\": \"z\", \"t\": ");
    for (int i = 0; i < 300; i++)
        strcat(buf, "[");
    strcat(buf, "\n");
    expect_jsonl_error(buf, TARTAN_EFORMAT, "nested too deeply");
}
END_TEST

/* The real BEIR SciFact files, where shared/ sits beside the checkout: every id read, the
 * same ids as Python's json module finds, and every judged id among them. */
static const char *scifact_dir(void)
{
    static char dir[1024];
    const char *env = getenv("TARTAN_SCIFACT"), *top = getenv("top_srcdir");
    const char *cands[] = {env, "../shared/data/beir/scifact", "../../shared/data/beir/scifact"};
    for (size_t i = 0; i < 3; i++) {
        if (!cands[i])
            continue;
        if (i == 0 || !top)
            snprintf(dir, sizeof dir, "%s", cands[i]);
        else
            snprintf(dir, sizeof dir, "%s/%s", top, cands[i]);
        char probe[1100];
        snprintf(probe, sizeof probe, "%s/corpus.jsonl", dir);
        if (access(probe, R_OK) == 0)
            return dir;
    }
    return NULL;
}

START_TEST(test_tools_jsonl_scifact)
{
    const char *dir = scifact_dir();
    if (!dir) {
        fprintf(stderr, "BEIR SciFact not found: skipped\n");
        return;
    }
    char err[512], path[1200];
    tool_idlist corpus, queries;
    snprintf(path, sizeof path, "%s/corpus.jsonl", dir);
    ck_assert_msg(tool_jsonl_ids(&corpus, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(corpus.n, 5183);
    snprintf(path, sizeof path, "%s/queries.jsonl", dir);
    ck_assert_msg(tool_jsonl_ids(&queries, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_gt(queries.n, 300);
    snprintf(path, sizeof path, "%s/qrels/test.tsv", dir);
    tool_qrels q;
    ck_assert_msg(tool_qrels_read(&q, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(q.qids.n, 300);
    for (size_t i = 0; i < q.qids.n; i++)
        ck_assert_msg(tool_idlist_find(&queries, q.qids.keys[i]) >= 0, "query %s", q.qids.keys[i]);
    for (size_t i = 0; i < q.docids.n; i++)
        ck_assert_msg(tool_idlist_find(&corpus, q.docids.keys[i]) >= 0, "doc %s", q.docids.keys[i]);
    tool_qrels_free(&q);
    if (system("python3 -c 'import json' >/dev/null 2>&1") == 0) {
        char cmd[2600];
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; [print(json.loads(l)[\"_id\"]) for l in "
                 "open(sys.argv[1], encoding=\"utf-8\") if l.strip()]' '%s/corpus.jsonl' > '%s'",
                 dir, fx_path("py_ids.txt"));
        ck_assert_int_eq(system(cmd), 0);
        tool_idlist py;
        ck_assert_msg(tool_idlist_read(&py, fx_path("py_ids.txt"), err, sizeof err) == 0, "%s",
                      err);
        ck_assert_uint_eq(py.n, corpus.n);
        for (size_t i = 0; i < py.n; i++)
            ck_assert_str_eq(py.ids[i], corpus.ids[i]);
        tool_idlist_free(&py);
    }
    tool_idlist_free(&corpus);
    tool_idlist_free(&queries);
}
END_TEST

int main(void)
{
    const fx_case cases[] = {
        {"idlist_reads", test_tools_idlist_reads_ids, 0},
        {"idlist_errors", test_tools_idlist_rejects_bad_lines, 0},
        {"jsonl_ids", test_tools_jsonl_reads_ids, 0},
        {"jsonl_errors", test_tools_jsonl_rejects_bad_lines, 0},
        {"jsonl_scifact", test_tools_jsonl_scifact, 0},
    };
    return FX_RUN("tools-ids", cases, FX_DIR, 60);
}
