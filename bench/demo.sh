#!/bin/sh
# demo.sh: tartan's main job in a minute or two. Generates a synthetic ColBERT-like corpus
# with queries and relevance judgments, builds an index, searches it with PLAID's defaults and
# exhaustively, prints a few results, the recall of PLAID against exhaustive search, and
# nDCG@10 from `tartan eval`. `make demo` runs it from the build directory.
#
#   bench/demo.sh [--docs 20000] [--queries 100] [--centroids 2048] [--keep DIR]
#
# --centroids: the index's codebook. The default sizing rule would train 16,384 centroids for
# this corpus, which takes minutes on two cores; 2,048 keep the demo short (a real index
# leaves it to the rule). --keep DIR: work in DIR and leave the files there.
set -eu

docs=20000
queries=100
centroids=2048
keep=
tartan=${TARTAN:-./tartan}
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
    case $1 in
    --docs) docs=$2 ;;
    --queries) queries=$2 ;;
    --centroids) centroids=$2 ;;
    --keep) keep=$2 ;;
    *) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
    shift 2
done
if [ ! -x "$tartan" ]; then
    echo "demo.sh: $tartan not found: run 'make' first (or set TARTAN)" >&2
    exit 1
fi
if [ -n "$keep" ]; then
    work=$keep
    rm -rf "$work/corpus" "$work/index"
    mkdir -p "$work"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/tartan-demo-XXXXXX")
    trap 'rm -rf "$work"' EXIT
fi
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

echo "== 1. a synthetic corpus: $docs documents of ~100 token embeddings (d 128), $queries queries"
t0=$(now)
"$tartan" gen "$work/corpus" --docs "$docs" --queries "$queries"
c=$work/corpus

echo
echo "== 2. an index (PLAID: $centroids centroids, 2-bit residuals, in LMDB)"
t1=$(now)
"$tartan" build "$work/index" --embeddings "$c/embeddings.npy" --doclens "$c/doclens.npy" \
    --ids "$c/ids.txt" --centroids "$centroids"
t2=$(now)
"$tartan" info "$work/index" | sed -n '1,8p'

echo
echo "== 3. search: top 10 of each query, PLAID at its defaults and at a higher-recall"
echo "      setting (more documents through centroid interaction), then exhaustively"
"$tartan" search "$work/index" --queries "$c/queries.npy" --query-ids "$c/query_ids.txt" \
    -k 10 -o "$work/plaid.run"
t3=$(now)
"$tartan" search "$work/index" --queries "$c/queries.npy" --query-ids "$c/query_ids.txt" \
    -k 10 --ndocs 4096 --tag plaid4096 -o "$work/plaid-ndocs4096.run"
t3b=$(now)
"$tartan" search "$work/index" --queries "$c/queries.npy" --query-ids "$c/query_ids.txt" \
    -k 10 --exhaustive --tag exhaustive -o "$work/exhaustive.run"
t4=$(now)

echo
echo "== 4. a few results (PLAID; * marks the document the query was built from)"
awk 'NR == FNR { if (FNR > 1) rel[$1] = $2; next }
     { if (!($1 in seen)) { seen[$1] = 1; nq++ }
       if (nq <= 3 && $4 <= 5)
           printf "%s%-6s %2d  %-10s %8.3f%s\n", ($4 == 1 ? "\n" : ""),
                  ($4 == 1 ? $1 : ""), $4, $3, $5, ($3 == rel[$1] ? "  *" : "") }' \
    "$c/qrels.tsv" "$work/plaid.run"
echo

echo "== 5. PLAID against exhaustive search, and against the judgments"
for r in plaid plaid-ndocs4096; do
    awk -v r="$r" 'NR == FNR { t[$1 " " $3] = 1; n++; next } t[$1 " " $3] { h++ }
         END { printf "recall@10 of %-15s against exhaustive search: %.4f (%d of %d)\n",
                      r, h / n, h, n }' "$work/exhaustive.run" "$work/$r.run"
done
for r in plaid plaid-ndocs4096 exhaustive; do
    "$tartan" eval --qrels "$c/qrels.tsv" --run "$work/$r.run" -m ndcg@10,mrr@10 |
        awk -v r="$r" '$2 == "all" && $1 != "num_q" { v[$1] = $3 }
            END { printf "%-15s nDCG@10 %.4f  MRR@10 %.4f\n", r, v["ndcg_cut_10"], v["recip_rank_10"] }'
done
echo
echo "times: generate $(secs "$t0" "$t1") s, build $(secs "$t1" "$t2") s," \
    "search $(secs "$t2" "$t3") s (PLAID), $(secs "$t3" "$t3b") s (ndocs 4096)," \
    "$(secs "$t3b" "$t4") s (exhaustive)"
[ -z "$keep" ] || echo "files kept in $work"
