#!/bin/sh
# bench_search.sh: search speed and recall on the CPU, on a generated ColBERT-like corpus.
#
# Generates the corpus (`tartan gen`) and builds its index (`tartan build`) unless the cache
# holds them already, then runs bench/bench_search (recall against exhaustive search,
# queries/s, latency, the ncells x ndocs sweep) and draws recall against latency with gnuplot.
# Run it from the build directory:
#
#   bench/bench_search.sh [--docs 100000] [--queries 1000] [--nq 200] [--doc-len 100]
#                         [--seed 42] [--model 2] [--cache /tmp/tartan-bench] [--out bench]
#                         [--ndocs LIST] [--ncells LIST] [--thresholds LIST] [--reps N]
#
# --model: the generator's model (`tartan gen --model`: 2, calibrated against real token
# embeddings, the default; 1, the first and harder one). It is part of the cache's name.
#
# The default corpus (100,000 documents of ~100 tokens, d 128, nbits 2) trains 32,768
# centroids over ~10M tokens: the first build takes hours on 2 cores (bench/RESULTS.md). For a
# quick run: --docs 2000 --queries 100 --nq 50 (minutes); RESULTS.md used --docs 10000.
set -eu

docs=100000
queries=1000
nq=200
doclen=100
seed=42
model=2
cache=${TMPDIR:-/tmp}/tartan-bench
out=$(dirname "$0")
ncells=1,2,4,8
ndocs=256,1024,4096,16384
thresholds=
reps=3
tartan=${TARTAN:-./tartan}
bench=${BENCH_SEARCH:-bench/bench_search}

usage() {
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || usage
    case $1 in
    --docs) docs=$2 ;;
    --queries) queries=$2 ;;
    --nq) nq=$2 ;;
    --doc-len) doclen=$2 ;;
    --seed) seed=$2 ;;
    --model) model=$2 ;;
    --cache) cache=$2 ;;
    --out) out=$2 ;;
    --ncells) ncells=$2 ;;
    --ndocs) ndocs=$2 ;;
    --thresholds) thresholds=$2 ;;
    --reps) reps=$2 ;;
    *) usage ;;
    esac
    shift 2
done

for p in "$tartan" "$bench"; do
    if [ ! -x "$p" ]; then
        echo "bench_search.sh: $p not found: run 'make' (and this script) in the build directory" >&2
        exit 1
    fi
done

dir=$cache/gen-m$model-n$docs-q$queries-l$doclen-s$seed
mkdir -p "$dir" "$out"
if [ ! -f "$dir/queries.npy" ]; then
    echo "== generating $docs documents, $queries queries into $dir"
    "$tartan" gen "$dir" --docs "$docs" --queries "$queries" --doc-len "$doclen" --seed "$seed" \
        --model "$model"
fi
# Built under another name and renamed when complete, so that an interrupted build is never
# taken for an index.
if [ ! -d "$dir/index" ]; then
    echo "== building $dir/index"
    rm -rf "$dir/index.tmp"
    "$tartan" build "$dir/index.tmp" --embeddings "$dir/embeddings.npy" \
        --doclens "$dir/doclens.npy" --ids "$dir/ids.txt" --seed "$seed"
    mv "$dir/index.tmp" "$dir/index"
fi

echo "== $(uptime)"
set -- "$dir/index" --queries "$dir/queries.npy" --nq "$nq" \
    --truth "$dir/exhaustive-k100-nq$nq.run" --json "$out/bench_search.json" \
    --dat "$out/bench_search.dat" --ncells "$ncells" --ndocs "$ndocs" --reps "$reps"
[ -z "$thresholds" ] || set -- "$@" --thresholds "$thresholds"
"$bench" "$@"
echo "== $(uptime)"

if command -v gnuplot >/dev/null 2>&1; then
    gnuplot -e "datafile='$out/bench_search.dat'; outfile='$out/search_recall_latency.png'" \
        "$(dirname "$0")/plot_search.gp"
    echo "wrote $out/search_recall_latency.png"
else
    echo "gnuplot not found: no plot (the data is in $out/bench_search.dat)"
fi
