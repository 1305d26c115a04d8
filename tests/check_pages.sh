#!/bin/sh
# check_pages.sh: search and evaluation at REAL-MM-RAG's shape (ColPali-style pages of 1,030
# patch embeddings, text queries of 24 tokens, page ids, BEIR qrels) on a generated corpus:
# gen -> build -> search (PLAID defaults and exhaustive) -> eval. Checks that every page keeps
# all 1,030 tokens, that exhaustive search finds each query's source page for most queries,
# that PLAID at a high-recall setting agrees with exhaustive search, and that `tartan eval`
# scores the runs. About half a minute on 2 cores.
set -eu
top_builddir=${top_builddir:-.}
tartan="$top_builddir/tartan"
[ -x "$tartan" ] || { echo "no $tartan: build it first"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tartan-pages-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

pages=120
"$tartan" gen "$work/c" --docs $pages --queries 20 --doc-len 1030 --fixed-len --query-len 24 \
    --seed 11 >/dev/null
# Page ids as a page-level benchmark names them: document and page number.
awk '{ printf "report%03d_p%d\n", int((NR - 1) / 8), (NR - 1) % 8 + 1 }' "$work/c/ids.txt" \
    >"$work/page_ids.txt"
awk -F'\t' 'NR == FNR { id["doc" (FNR - 1)] = $0; next }
            FNR == 1 { print; next } { print $1 "\t" id[$2] "\t" $3 }' \
    "$work/page_ids.txt" "$work/c/qrels.tsv" >"$work/qrels.tsv"
"$tartan" build "$work/idx" --embeddings "$work/c/embeddings.npy" \
    --doclens "$work/c/doclens.npy" --ids "$work/page_ids.txt" --centroids 1024 2>/dev/null

"$tartan" info "$work/idx" >"$work/info.txt"
tokens=$(awk '$1 == "tokens" { print $2 }' "$work/info.txt")
[ "$tokens" = $((pages * 1030)) ] || fail "index holds $tokens tokens, not $((pages * 1030))"

s() { "$tartan" search "$work/idx" --queries "$work/c/queries.npy" \
        --query-ids "$work/c/query_ids.txt" -q "$@"; }
s --exhaustive -k 10 -o "$work/exh.run"
s -k 10 -o "$work/plaid.run"
s -k 10 --ncells 8 --threshold 0 --ndocs 4096 -o "$work/wide.run"

# Exhaustive: the source page is first for most queries.
top=$(awk 'NR == FNR { if (FNR > 1) rel[$1] = $2; next }
                  $4 == 1 && rel[$1] == $3 { h++ } END { print h + 0 }' \
    "$work/qrels.tsv" "$work/exh.run")
[ "$top" -ge 16 ] || fail "exhaustive search puts the source page first for $top of 20 queries"

# The wide PLAID setting returns the exhaustive top 10 (recall@10 against exhaustive >= 0.95).
recall() {
    awk 'NR == FNR { want[$1 " " $3] = 1; n++; next } ($1 " " $3) in want { h++ }
         END { printf "%.4f\n", h / n }' "$work/exh.run" "$1"
}
r_wide=$(recall "$work/wide.run")
r_def=$(recall "$work/plaid.run")
awk -v r="$r_wide" 'BEGIN { exit !(r >= 0.95) }' || fail "recall@10 of the wide setting: $r_wide"
echo "pages: recall@10 against exhaustive: defaults $r_def, ncells 8 threshold 0 ndocs 4096 $r_wide"

# tartan eval reads the page-level qrels and runs.
"$tartan" eval --qrels "$work/qrels.tsv" --run "$work/exh.run" -m ndcg@10,recall@10 \
    >"$work/eval.txt"
ndcg=$(awk '$1 == "ndcg_cut_10" && $2 == "all" { print $3 }' "$work/eval.txt")
[ -n "$ndcg" ] || { cat "$work/eval.txt"; fail "no ndcg_cut_10 in tartan eval's output"; }
awk -v x="$ndcg" 'BEGIN { exit !(x >= 0.7) }' || fail "nDCG@10 of exhaustive search: $ndcg"
echo "pages: exhaustive nDCG@10 $ndcg, source page first for $top of 20 queries"
