#!/usr/bin/env bash
# SciFact end to end through the tartan command: build the index, search it three ways (PLAID
# defaults, exhaustive, high recall), score each run with `tartan eval` (and with score.py as an
# independent check), measure parity with the exhaustive run, time every step, write a summary.
#
#   bench/scifact/run.sh EMB_DIR [WORK_DIR]
#
# EMB_DIR is embed.py's output (embeddings.npy, doclens.npy, ids.txt, queries.npy, qlens.npy,
# query_ids.txt, meta.json); WORK_DIR (default EMB_DIR/run) receives the index, the runs,
# the evaluations and summary.md / summary.tsv. When EMB_DIR/reference.trec exists
# (reference.py), the exhaustive run's parity with that NumPy reference is reported too.
# Environment: TARTAN (the command; default the build tree's ./tartan or tools/tartan, else
# `tartan` on PATH), QRELS (default: meta.json's data dir/qrels/SPLIT.tsv), PYTHON (python3),
# K (documents per query, 100), BUILD_OPTS (extra `tartan build` options, e.g. --centroids 4096).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
emb=$(cd "$1" && pwd)
work=${2:-$emb/run}
PYTHON=${PYTHON:-python3}
K=${K:-100}

if [ -z "${TARTAN:-}" ]; then
    for t in "$top/tartan" "$top/tools/tartan"; do
        [ -x "$t" ] && { TARTAN=$t; break; }
    done
    TARTAN=${TARTAN:-tartan}
fi
command -v "$TARTAN" >/dev/null || { echo "run.sh: no tartan command ($TARTAN): build it or set TARTAN" >&2; exit 2; }
for f in embeddings.npy doclens.npy ids.txt queries.npy qlens.npy query_ids.txt; do
    [ -f "$emb/$f" ] || { echo "run.sh: missing $emb/$f: run bench/scifact/embed.py first" >&2; exit 2; }
done
if [ -z "${QRELS:-}" ]; then
    QRELS=$("$PYTHON" -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["data"] + "/qrels/" + m.get("split","test") + ".tsv")' "$emb/meta.json")
fi
[ -f "$QRELS" ] || { echo "run.sh: missing qrels $QRELS (set QRELS)" >&2; exit 2; }

mkdir -p "$work/runs" "$work/eval"
times=$work/times.tsv
printf 'step\tseconds\n' >"$times"
# timed NAME CMD...: run CMD, append its wall time to times.tsv.
timed() {
    local name=$1 t0 t1
    shift
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    awk -v n="$name" -v a="$t0" -v b="$t1" 'BEGIN { printf "%s\t%.3f\n", n, b - a }' >>"$times"
    echo "== $name: $(tail -n1 "$times" | cut -f2) s" >&2
}

echo "tartan: $TARTAN; embeddings: $emb; qrels: $QRELS; out: $work" >&2
echo "load before: $(uptime)" >"$work/load.txt"

rm -rf "$work/index"
# shellcheck disable=SC2086 # BUILD_OPTS is a list of options
timed build "$TARTAN" build "$work/index" --embeddings "$emb/embeddings.npy" \
    --doclens "$emb/doclens.npy" --ids "$emb/ids.txt" ${BUILD_OPTS:-}

# search NAME [OPTIONS...]: all queries, top K, TREC run into runs/NAME.trec.
search() {
    local name=$1
    shift
    "$TARTAN" search "$work/index" --queries "$emb/queries.npy" --qlens "$emb/qlens.npy" \
        --query-ids "$emb/query_ids.txt" -k "$K" "$@" --format trec >"$work/runs/$name.trec"
}

# name|extra search options
settings=("default|" "exhaustive|--exhaustive" "highrecall|--ncells 4 --ndocs 4096")
for s in "${settings[@]}"; do
    name=${s%%|*} opts=${s#*|}
    # shellcheck disable=SC2086 # opts is a list of options
    timed "search_$name" search "$name" $opts
done
echo "load after: $(uptime)" >>"$work/load.txt"

for s in "${settings[@]}"; do
    name=${s%%|*}
    "$TARTAN" eval --qrels "$QRELS" --run "$work/runs/$name.trec" >"$work/eval/$name.tartan.txt"
    "$PYTHON" "$here/score.py" --qrels "$QRELS" --run "$work/runs/$name.trec" \
        --json "$work/eval/$name.score.json" >"$work/eval/$name.score.txt"
done

parity() { "$PYTHON" "$here/score.py" --parity "$1" "$2" -k "$3"; }
{
    echo "# SciFact end to end ($(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    echo "- tartan: \`$TARTAN\` ($(cd "$top" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    "$PYTHON" - "$emb/meta.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
print(f"- embeddings: {sys.argv[1]}: {m['model']}, {m['n_docs']} docs / {m['n_doc_tokens']} "
      f"tokens (doc_maxlen {m['doc_maxlen']}), {m['n_queries']} queries / "
      f"{m['n_query_tokens']} tokens (query_maxlen {m['query_maxlen']}), {m['dtype']}")
EOF
    echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
    sed 's/^/- /' "$work/load.txt"
    echo
    echo "| setting | nDCG@10 | Recall@100 | MRR@10 | parity R@10 vs exhaustive | search s |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    for s in "${settings[@]}"; do
        name=${s%%|*}
        "$PYTHON" - "$work/eval/$name.score.json" "$name" \
            "$(parity "$work/runs/exhaustive.trec" "$work/runs/$name.trec" 10)" \
            "$(awk -F'\t' -v n="search_$name" '$1 == n { print $2 }' "$times")" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["python"]
print(f"| {sys.argv[2]} | {r['ndcg_cut_10']:.4f} | {r['recall_100']:.4f} | "
      f"{r['recip_rank_10']:.4f} | {float(sys.argv[3]):.4f} | {sys.argv[4]} |")
EOF
    done
    if [ -f "$emb/reference.trec" ]; then
        echo
        echo "Exhaustive vs the NumPy reference (reference.py): recall@10 $(parity "$emb/reference.trec" "$work/runs/exhaustive.trec" 10), recall@100 $(parity "$emb/reference.trec" "$work/runs/exhaustive.trec" 100)."
        echo "(tartan's exhaustive mode scores the index's compressed tokens, centroid plus quantised residual;"
        echo "the reference scores the float embeddings: this parity measures the codec's loss.)"
    fi
    echo
    echo "Build: $(awk -F'\t' '$1 == "build" { print $2 }' "$times") s. Metrics by score.py; \`tartan eval\` output in eval/*.tartan.txt:"
    for s in "${settings[@]}"; do
        name=${s%%|*}
        echo
        echo "\`tartan eval\` $name:"
        echo '```'
        cat "$work/eval/$name.tartan.txt"
        echo '```'
    done
} >"$work/summary.md"
cat "$work/summary.md"
