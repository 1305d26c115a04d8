#!/bin/sh
# gpu_search_families.sh: the adaptive search on a GPU host, one corpus per generator family.
#
#   bench/gpu_search_families.sh OUTDIR [DOCS] [FAMILIES]
#
# For each family (tartan gen --model 1, 2, 3; default all) it generates DOCS documents
# (default 200,000, 70 tokens on average, 1,000 queries, float16), builds the index on the GPU
# (which calibrates it), and runs bench/bench_search_gpu: exhaustive search as the reference,
# the adaptive defaults and recall targets 0.8, 0.9, 0.99, and PLAID's fixed stages (ColBERT's
# ncells 1 / threshold 0.5 / ndocs 256 among them). OUTDIR gets per family gpu-m<N>.json,
# gpu-m<N>.dat (bench/plot_search.gp draws it) and the logs. Programs: tartan and
# bench_search_gpu from $BIN, a folder holding both (a copy of the built programs, for a GPU
# host without a build tree), else from this build tree (./configure --enable-cuda && make);
# corpora go to $WORK (default /tmp).
set -eu
out=$1
docs=${2:-200000}
fams=${3:-1 2 3}
if [ -n "${BIN:-}" ]; then
    tartan=$BIN/tartan bsg=$BIN/bench_search_gpu
else
    tartan=./tartan bsg=bench/bench_search_gpu
fi
if [ ! -x "$tartan" ] || [ ! -x "$bsg" ]; then
    echo "gpu_search_families.sh: no $tartan or $bsg: build with --enable-cuda, or set BIN" >&2
    exit 2
fi
work=${WORK:-/tmp}
nq=${NQ:-1000}
mkdir -p "$out"
for m in $fams; do
    d=$work/fam$m-$docs
    if [ ! -f "$d/queries.npy" ]; then
        "$tartan" gen "$d" --docs "$docs" --queries "$nq" --doc-len 70 --seed $((7 + m)) \
            --model "$m" --dtype f16 >"$out/gen-m$m.log" 2>&1
    fi
    if [ ! -d "$d/ix" ]; then
        /usr/bin/time -v "$tartan" build "$d/ix" --embeddings "$d/embeddings.npy" \
            --doclens "$d/doclens.npy" --ids "$d/ids.txt" --device cuda >"$out/build-m$m.log" 2>&1
    fi
    "$tartan" info "$d/ix" >"$out/info-m$m.txt" 2>&1
    "$bsg" "$d/ix" --queries "$d/queries.npy" --json "$out/gpu-m$m.json" \
        --dat "$out/gpu-m$m.dat" --targets 0.8,0.9,0.99 --ncells 1,2,4 --ndocs 256,1024 \
        --thresholds 0.5 --reps 2 >"$out/bench-m$m.txt" 2>&1
    tail -n 14 "$out/bench-m$m.txt"
done
