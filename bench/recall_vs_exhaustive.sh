#!/bin/sh
# recall_vs_exhaustive.sh: default search's recall against exhaustive search on any index and
# query file, with ColBERT's fixed settings beside it (for corpora bench/bench_search cannot
# read, such as SciFact's queries of different lengths).
#
#   bench/recall_vs_exhaustive.sh INDEX QUERIES.npy [QLENS.npy]
#
# Runs exhaustive search (top 100, cached as INDEX.truth100.trec beside the index), the
# default search at k 10 and k 100, and the fixed settings ncells 1 / threshold 0.5 / ndocs
# 256 (k 10) and ncells 2 / threshold 0.45 / ndocs 1024 (k 100); prints each search's line
# and its recall@k against the exhaustive top k. TARTAN: the tartan program (default
# ./tartan).
set -eu
T=${TARTAN:-./tartan}
ix=$1
q=$2
ql=${3:+--qlens $3}
truth=$ix.truth100.trec
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -f "$truth" ] || $T search "$ix" --queries "$q" $ql --exhaustive -k 100 -o "$truth" -q
# recall K RUN: mean over queries of |top K of RUN and of the truth| / K
recall() {
    awk -v k="$1" -v name="$3" '
        FNR == 1 { f++ }
        $4 <= k { if (f == 1) t[$1 " " $3] = 1; else if (($1 " " $3) in t) hit[$1]++;
                  if (f == 1) n[$1]++ }
        END { for (q in n) { s += hit[q] / n[q]; c++ }
              printf "  %s: recall@%d against exhaustive %.4f over %d queries\n", name, k, s / c, c }
    ' "$truth" "$2"
}
for k in 10 100; do
    $T search "$ix" --queries "$q" $ql -k $k -o "$tmp/d$k.trec" 2>&1
    recall $k "$tmp/d$k.trec" "default k $k"
done
$T search "$ix" --queries "$q" $ql -k 10 --ncells 1 --threshold 0.5 --ndocs 256 \
    -o "$tmp/f10.trec" 2>&1
recall 10 "$tmp/f10.trec" "fixed 1 / 0.5 / 256, k 10"
$T search "$ix" --queries "$q" $ql -k 100 --ncells 2 --threshold 0.45 --ndocs 1024 \
    -o "$tmp/f100.trec" 2>&1
recall 100 "$tmp/f100.trec" "fixed 2 / 0.45 / 1024, k 100"
