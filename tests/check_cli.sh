#!/bin/sh
# check_cli.sh: the tartan command end to end on a tiny generated corpus: gen -> build ->
# search (PLAID defaults, exhaustive, subset, JSON lines, packed and padded queries) -> eval
# -> delete -> search again, and the exit status and message of malformed arguments and
# files (2 for usage, 1 for failures). A few seconds.
set -eu
top_builddir=${top_builddir:-.}
tartan="$top_builddir/tartan"
# The CPU path throughout, GPU or not (the GPU path has its own tests): runs are compared byte
# for byte below.
export TARTAN_DEVICE=cpu
[ -x "$tartan" ] || { echo "no $tartan: build it first"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tartan-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
ok() { echo "ok: $*"; }
expect() { # expect STATUS PATTERN ARGS...: tartan's exit status and a stderr line
    want=$1
    pat=$2
    shift 2
    set +e
    "$tartan" "$@" >"$work/out.txt" 2>"$work/err.txt"
    got=$?
    set -e
    if [ "$got" -eq "$want" ] && grep -q -- "$pat" "$work/err.txt"; then
        ok "exit $got: $*"
    else
        fail "'tartan $*' exited $got (want $want), stderr: $(head -c 300 "$work/err.txt")"
    fi
    [ ! -s "$work/out.txt" ] || [ "$want" -eq 0 ] || fail "'tartan $*' wrote to stdout"
}

# ---- a corpus and its index --------------------------------------------------------------
"$tartan" gen "$work/c" --docs 400 --queries 30 --doc-len 40 --seed 7 \
    >"$work/gen.err" 2>&1 || { cat "$work/gen.err"; exit 1; }
"$tartan" build "$work/index" --embeddings "$work/c/embeddings.npy" \
    --doclens "$work/c/doclens.npy" --ids "$work/c/ids.txt" 2>"$work/build.err" ||
    { cat "$work/build.err"; exit 1; }
idx=$work/index
q=$work/c/queries.npy
qids=$work/c/query_ids.txt

search() { "$tartan" search "$idx" --queries "$q" --query-ids "$qids" -q "$@"; }

# ---- default and exhaustive ----------------------------------------------------------------
search -o "$work/default.run"
search --exhaustive -o "$work/exh.run"
search --exhaustive -k 400 -o "$work/exh_all.run"

# Every query gets k results, ranks 1..k, scores not increasing, the tag given.
awk '{ n[$1]++; if ($4 != n[$1]) bad = "rank " $4 " at position " n[$1];
       if (n[$1] > 1 && $5 > last[$1] + 0) bad = "scores increase for " $1;
       last[$1] = $5; if ($2 != "Q0" || $6 != "tartan" || NF != 6) bad = "line " NR }
     END { for (k in n) { q++; if (n[k] != 10) bad = k " has " n[k] " results" }
           if (q != 30) bad = q " queries"; if (bad) { print bad; exit 1 } }' \
    "$work/exh.run" && ok "exhaustive run well-formed" || fail "exhaustive run: malformed"

# The exhaustive top 1 is the document the query was built from for most queries.
hits=$(awk 'NR == FNR { if (FNR > 1) rel[$1] = $2; next } $4 == 1 && rel[$1] == $3 { h++ }
            END { print h + 0 }' "$work/c/qrels.tsv" "$work/exh.run")
[ "$hits" -ge 20 ] && ok "exhaustive finds the source document of $hits/30 queries" ||
    fail "exhaustive finds the source document of only $hits/30 queries"

# PLAID at its defaults agrees with exhaustive search on most of the top 10.
rec=$(awk 'NR == FNR { t[$1 " " $3] = 1; n++; next } t[$1 " " $3] { h++ }
           END { printf "%d", 100 * h / n }' "$work/exh.run" "$work/default.run")
[ "$rec" -ge 80 ] && ok "default recall@10 against exhaustive: $rec%" ||
    fail "default recall@10 against exhaustive only $rec%"

# The exhaustive top 10 is the head of the exhaustive ranking of every document.
awk '$4 <= 10' "$work/exh_all.run" | cmp -s - "$work/exh.run" &&
    ok "exhaustive top 10 = head of the full ranking" || fail "exhaustive top 10 differs"

# tartan eval reads the runs.
"$tartan" eval --qrels "$work/c/qrels.tsv" --run "$work/exh.run" -m ndcg@10 >"$work/eval.txt" ||
    fail "tartan eval refused the run"
ndcg=$(awk '$1 == "ndcg_cut_10" && $2 == "all" { printf "%d", 100 * $3 }' "$work/eval.txt")
[ "${ndcg:-0}" -ge 70 ] && ok "eval nDCG@10 of exhaustive: 0.$ndcg" ||
    fail "eval nDCG@10 of exhaustive: '${ndcg:-none}'"

# ---- subset ------------------------------------------------------------------------------
awk 'NR % 7 == 3' "$work/c/ids.txt" >"$work/subset.txt"
search --exhaustive --subset "$work/subset.txt" -o "$work/sub_exh.run"
search --subset "$work/subset.txt" -o "$work/sub_def.run"
for r in sub_exh sub_def; do
    bad=$(awk 'NR == FNR { s[$1] = 1; next } !s[$3] { print $3; exit }' \
        "$work/subset.txt" "$work/$r.run")
    [ -z "$bad" ] && [ -s "$work/$r.run" ] && ok "$r: only subset ids" ||
        fail "$r: '$bad' is outside the subset"
done
# Exhaustive with a subset = the full exhaustive ranking filtered to the subset.
awk 'NR == FNR { s[$1] = 1; next } s[$3] { if (++n[$1] <= 10) print $1, $3 }' \
    "$work/subset.txt" "$work/exh_all.run" >"$work/sub_expect.txt"
awk '{ print $1, $3 }' "$work/sub_exh.run" | cmp -s - "$work/sub_expect.txt" &&
    ok "subset exhaustive = full ranking filtered" || fail "subset exhaustive ranking differs"
: >"$work/empty.txt"
search --subset "$work/empty.txt" -o "$work/none.run" 2>/dev/null
[ ! -s "$work/none.run" ] && ok "empty subset: no results" || fail "empty subset returned results"

# ---- formats and query layouts ------------------------------------------------------------
search --format jsonl -k 3 -o "$work/out.jsonl"
lines=$(grep -c '^{"qid": "q[0-9]*", "hits": \[{"id": "doc[0-9]*", "rank": 1, "score": [-0-9.e]*}' \
    "$work/out.jsonl" || true)
[ "$lines" -eq 30 ] && ok "jsonl: 30 lines" || fail "jsonl: $lines well-formed lines of 30"
if command -v python3 >/dev/null 2>&1 && python3 -c 'import numpy' 2>/dev/null; then
    python3 - "$work" <<'PY'
import sys, numpy as np
w = sys.argv[1]
q = np.load(w + "/c/queries.npy")
lens = np.array([32 if i % 3 else 9 for i in range(q.shape[0])], dtype=np.int32)
np.save(w + "/qlens.npy", lens)
np.save(w + "/packed.npy", np.concatenate([q[i, :lens[i]] for i in range(q.shape[0])]))
np.save(w + "/q16.npy", q.astype(np.float16))
q[5, 3, 7] = np.nan
np.save(w + "/nan.npy", q)
PY
    expect 1 "nan.npy: query 5 (id 'q5'): token 3 has NaN" search "$idx" --queries "$work/nan.npy" \
        --query-ids "$qids" --batch 4 -o "$work/nan.run"
    [ ! -e "$work/nan.run" ] && [ ! -e "$work/nan.run.tmp" ] || fail "a failed search left its run"
    search --exhaustive --queries "$work/packed.npy" --qlens "$work/qlens.npy" --batch 4 \
        -o "$work/packed.run"
    search --exhaustive --qlens "$work/qlens.npy" --batch 7 -o "$work/padded.run"
    cmp -s "$work/packed.run" "$work/padded.run" && ok "packed = padded queries with --qlens" ||
        fail "packed and padded queries differ"
    # Two batches in flight (as on a GPU): the same run, and the same failure.
    for layout in "--batch 1" "--batch 4" "--qlens $work/qlens.npy --batch 3" \
        "--queries $work/packed.npy --qlens $work/qlens.npy --batch 5"; do
        export TARTAN_SEARCH_INFLIGHT=1
        # shellcheck disable=SC2086
        search $layout -o "$work/in1.run"
        export TARTAN_SEARCH_INFLIGHT=2
        # shellcheck disable=SC2086
        search $layout -o "$work/in2.run"
        unset TARTAN_SEARCH_INFLIGHT
        cmp -s "$work/in1.run" "$work/in2.run" && [ -s "$work/in1.run" ] &&
            ok "two batches in flight: the same run ($layout)" ||
            fail "two batches in flight: another run ($layout)"
    done
    export TARTAN_SEARCH_INFLIGHT=2
    expect 1 "nan.npy: query 5 (id 'q5'): token 3 has NaN" search "$idx" \
        --queries "$work/nan.npy" --query-ids "$qids" --batch 2 -o "$work/nan2.run"
    unset TARTAN_SEARCH_INFLIGHT
    [ ! -e "$work/nan2.run" ] && [ ! -e "$work/nan2.run.tmp" ] ||
        fail "a failed search with two batches in flight left its run"
    search --exhaustive --queries "$work/q16.npy" -o "$work/q16.run"
    same=$(paste "$work/q16.run" "$work/exh.run" | awk '$3 == $9 { n++ } END { print n + 0 }')
    [ "$same" -ge 270 ] && ok "float16 queries: $same/300 results as float32" ||
        fail "float16 queries: only $same/300 results as float32"
else
    echo "skip: packed/float16 queries (no python3 with numpy)"
fi

# ---- delete, then search again -------------------------------------------------------------
awk '$4 <= 2 { print $3 }' "$work/exh.run" | sort -u >"$work/deleted.txt"
"$tartan" delete "$idx" --ids "$work/deleted.txt" 2>/dev/null || fail "delete failed"
search -o "$work/after_def.run"
search --exhaustive -o "$work/after_exh.run"
for r in after_def after_exh; do
    bad=$(awk 'NR == FNR { d[$1] = 1; next } d[$3] { print $3; exit }' \
        "$work/deleted.txt" "$work/$r.run")
    [ -z "$bad" ] && [ -s "$work/$r.run" ] && ok "$r: no deleted document" ||
        fail "$r: deleted '$bad' returned"
done
# What remains ranks as before: the exhaustive ranking with the deleted ids taken out.
awk 'NR == FNR { d[$1] = 1; next } !d[$3] { if (++n[$1] <= 10) print $1, $3 }' \
    "$work/deleted.txt" "$work/exh_all.run" >"$work/after_expect.txt"
awk '{ print $1, $3 }' "$work/after_exh.run" | cmp -s - "$work/after_expect.txt" &&
    ok "after delete: the old ranking minus the deleted" || fail "after delete: ranking differs"

# ---- malformed arguments: exit 2 with a message; bad files: exit 1 with a message -------------
expect 2 "\-k must be" search "$idx" --queries "$q" -k 0
expect 2 "wants a whole number" search "$idx" --queries "$q" -k ten
expect 2 "wants a whole number" search "$idx" --queries "$q" -k -3
expect 2 "at least 1" search "$idx" --queries "$q" --ncells 0
expect 2 "at least 1" search "$idx" --queries "$q" --ndocs 0
expect 2 "finite number" search "$idx" --queries "$q" --threshold nan
expect 2 "trec or jsonl" search "$idx" --queries "$q" --format xml
expect 2 "queries is required" search "$idx"
expect 2 "INDEX is required" search --queries "$q"
expect 2 "unrecognized option" search "$idx" --queries "$q" --bogus
expect 2 "whitespace" search "$idx" --queries "$q" --tag "a b"
expect 2 "auto, cpu or cuda" search "$idx" --queries "$q" --device gpu
# --device cpu: the same run as the default device (the CPU, by TARTAN_DEVICE above).
search --exhaustive --device cpu -o "$work/exh_cpu.run"
cmp -s "$work/exh_cpu.run" "$work/after_exh.run" && ok "--device cpu: same run" ||
    fail "--device cpu: another run"
expect 1 "no such index" search "$work/nowhere" --queries "$q"
expect 1 "missing.npy" search "$idx" --queries "$work/missing.npy"
expect 1 "doclens.npy" search "$idx" --queries "$work/c/doclens.npy"
expect 1 "need --qlens" search "$idx" --queries "$work/c/embeddings.npy"
expect 1 "query ids but" search "$idx" --queries "$q" --query-ids "$work/c/ids.txt"
expect 1 "subset-missing" search "$idx" --queries "$q" --subset "$work/subset-missing"
expect 1 "no-dir" search "$idx" --queries "$q" -o "$work/no-dir/run"
"$tartan" gen "$work/d64" --docs 2 --queries 2 --dim 64 --doc-len 8 >/dev/null 2>&1
expect 1 "dimension 64" search "$idx" --queries "$work/d64/queries.npy"
printf 'not a numpy file\n' >"$work/bad.npy"
expect 1 "bad.npy" search "$idx" --queries "$work/bad.npy"
# A failed search leaves no output file behind.
[ ! -e "$work/no-dir/run" ] && [ ! -e "$work/no-dir/run.tmp" ] || fail "left a file behind"

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
echo "all checks passed"
