#!/bin/sh
# format2_gpu.sh: search on the GPU and the CPU in one run, on indexes of format version 2 and,
# when BEFORE_BIN names the programs of an earlier commit, of that commit's format, on the same
# generated corpora: issue 19's "search speed on CPU and GPU no worse than today".
#
#   [BIN=DIR] [BEFORE_BIN=DIR] bench/format2_gpu.sh OUTDIR
#
# BIN (and BEFORE_BIN) name the programs `tartan` and `bench_search_gpu` built with CUDA: a
# build tree (default: this one, `./configure --enable-cuda && make`), or a folder holding a
# copy of both (their libraries, if not installed, in ../lib beside it). For each generator
# family (tartan gen --model 1 and --model 2; 20,000 documents of ~100 tokens, d 128, 200
# queries) each set of programs builds its own index on the GPU (K 4,096, nbits 2), prints its
# size (tartan info), and bench_search_gpu runs exhaustive search, PLAID at fixed settings (the
# ncells x ndocs sweep below) on the GPU and the defaults on the CPU (--cpu-queries 100, all
# threads). OUTDIR gets m<N>-<after|before>.json and .txt and summary.txt. Corpora and indexes
# go to $WORK (default /tmp). A few minutes on one H100/H200.
set -eu
out=$1
bin=${BIN:-.}
# The two programs of a set: a build tree keeps bench_search_gpu under bench/.
bsg_of() { if [ -x "$1/bench_search_gpu" ]; then echo "$1/bench_search_gpu"; else echo "$1/bench/bench_search_gpu"; fi; }
for b in "$bin" ${BEFORE_BIN:-}; do
    if [ ! -x "$b/tartan" ] || [ ! -x "$(bsg_of "$b")" ]; then
        echo "format2_gpu.sh: no tartan and bench_search_gpu in '$b': build with --enable-cuda, or set BIN" >&2
        exit 2
    fi
done
work=${WORK:-/tmp}/tartan-format2-gpu
mkdir -p "$out" "$work"
sets="$bin:after"
if [ -n "${BEFORE_BIN:-}" ]; then
    sets="$sets $BEFORE_BIN:before"
fi
echo "format2_gpu.sh: $(date -u) $(hostname); $(uptime)" | tee "$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
for model in 1 2; do
    c=$work/m$model
    if [ ! -f "$c/queries.npy" ]; then
        LD_LIBRARY_PATH=$bin/../lib "$bin/tartan" gen "$c" --docs 20000 --queries 200 \
            --model $model >"$out/gen-m$model.log" 2>&1
    fi
    for s in $sets; do
        b=${s%%:*}
        tag=${s##*:}
        ix=$work/ix-m$model-$tag
        rm -rf "$ix"
        export LD_LIBRARY_PATH="$b/../lib"
        "$b/tartan" build "$ix" --embeddings "$c/embeddings.npy" --doclens "$c/doclens.npy" \
            --ids "$c/ids.txt" --centroids 4096 --device cuda >"$out/build-m$model-$tag.log" 2>&1
        echo "== model $model, $tag ($b)" | tee -a "$out/summary.txt"
        "$b/tartan" info "$ix" | grep -E "data file|free pages" | tee -a "$out/summary.txt"
        "$(bsg_of "$b")" "$ix" --queries "$c/queries.npy" --nq 200 --ncells 1,2,4 \
            --ndocs 256,1024 --reps 3 --cpu-queries 100 --json "$out/m$model-$tag.json" \
            | tee "$out/m$model-$tag.txt"
    done
done
echo "done $(date -u)" | tee -a "$out/summary.txt"
