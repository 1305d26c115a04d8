#!/usr/bin/env bash
# check_eval_cli.sh: `tartan eval` as a command: exit codes (0 done, 1 bad input, 2 usage),
# messages that name the file and line, the trec_eval-shaped table, per-query rows, JSON,
# standard input, and the hand-computed values of tests/check_tools_eval.c's first case.
set -euo pipefail
tartan="${top_builddir:-.}/tartan"
work=$(mktemp -d "${TMPDIR:-/tmp}/tartan-eval-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

printf 'query-id\tcorpus-id\tscore\r\nq1\td1\t2\r\nq1\td2\t1\r\nq1\td3\t0\r\nq1\td4\t1\r\nq1\td5\t3\r\nq2\td7\t0\r\n' >"$work/qrels.tsv"
printf 'q1 Q0 d1 5 0.9 t\nq1 Q0 d2 1 0.5 t\nq1 Q0 d3 2 0.5 t\nq1 Q0 dx 3 0.7 t\nq1 Q0 d4 4 0.1 t\nq2 Q0 d7 1 3 t\n' >"$work/run"

# The table: num_q, then each measure; q1's P_5 = 3/5 and map = 0.525, q2 scores 0.
out=$("$tartan" eval --qrels "$work/qrels.tsv" --run "$work/run" -m P.5,map -q --json "$work/out.json")
echo "$out"
grep -qP '^P_5\s+q1\s+0\.6000$' <<<"$out" || fail "per-query P_5"
grep -qP '^map\s+q2\s+0\.0000$' <<<"$out" || fail "per-query map of a query with nothing relevant"
grep -qP '^num_q\s+all\s+2$' <<<"$out" || fail "num_q"
grep -qP '^P_5\s+all\s+0\.3000$' <<<"$out" || fail "mean P_5"
grep -qP '^map\s+all\s+0\.2625$' <<<"$out" || fail "mean map"
grep -q '"map": 0.26250000000000001' "$work/out.json" || fail "JSON mean"
grep -q '"q1": {"P_5": 0.59999999999999998, "map": 0.52500000000000002}' "$work/out.json" ||
    fail "JSON per query"
if command -v python3 >/dev/null; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["num_q"] == 2' \
        "$work/out.json" || fail "JSON does not parse"
fi
# The run from standard input, the default measures.
"$tartan" eval --qrels "$work/qrels.tsv" --run - <"$work/run" | grep -qP '^ndcg_cut_10\s+all' ||
    fail "default measures from standard input"

# Bad input: exit 1, the file and line named.
printf 'q1 Q0 d1 1 high t\n' >"$work/bad.run"
set +e
msg=$("$tartan" eval --qrels "$work/qrels.tsv" --run "$work/bad.run" 2>&1 >/dev/null)
rc=$?
set -e
[ $rc -eq 1 ] || fail "bad run: exit $rc"
grep -q "bad.run:1: score 'high' is not a number" <<<"$msg" || fail "bad run message: $msg"

# Usage errors: exit 2.
for args in "--qrels $work/qrels.tsv" "--qrels $work/qrels.tsv --run $work/run -m bleu" \
    "--qrels - --run -" "--qrels $work/qrels.tsv --run $work/run extra" "--bogus"; do
    set +e
    # shellcheck disable=SC2086
    "$tartan" eval $args >/dev/null 2>&1 </dev/null
    rc=$?
    set -e
    [ $rc -eq 2 ] || fail "'$args': exit $rc, want 2"
done
"$tartan" eval --help | grep -q 'usage: tartan eval' || fail "--help"
echo "eval cli: ok"
