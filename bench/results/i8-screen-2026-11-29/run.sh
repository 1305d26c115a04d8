#!/bin/sh
# The int8 screen of the CPU's fp32 nearest centroid (kernels/nearest_i8_cpu.c) on an AVX2 CPU
# without AMX: each corpus built twice on 2 pinned cores, with the screen (the default) and
# without (TARTAN_NEAREST_SCREEN=0), traced, and the two indexes dumped and compared (centroids,
# codes, decompressed tokens). Then the screen against the fp32 kernel by K (bench_assign).
# Run from the top of a build tree: bench/results/i8-screen-2026-11-29/run.sh S
set -eu
S=$1
mkdir -p "$S"
[ -f "$S/m3-20k/doclens.npy" ] || ./tartan gen "$S/m3-20k" --docs 20000 --doc-len 74 --model 3 --queries 200
for m in 1 2; do
    [ -f "$S/m$m-5k/doclens.npy" ] || ./tartan gen "$S/m$m-5k" --docs 5000 --model $m --queries 200
done
[ -f "$S/d384/doclens.npy" ] ||
    ./tartan gen "$S/d384" --docs 1500 --dim 384 --doc-len 228 --model 3 --queries 100 --seed 11
pair() {
    c=$1 n=$(basename "$1")
    for v in i8 off; do
        rm -rf "$S/ix-$n-$v" "$S/dump-$n-$v"
        if [ $v = off ]; then export TARTAN_NEAREST_SCREEN=0; else unset TARTAN_NEAREST_SCREEN; fi
        TARTAN_DEVICE=cpu TARTAN_KMEANS_TRACE=1 /usr/bin/time -f "$n $v build: %e s wall, %U s user" \
            taskset -c 0,1 ./tartan build "$S/ix-$n-$v" --embeddings "$c/embeddings.npy" \
            --doclens "$c/doclens.npy" --ids "$c/ids.txt" > "$S/log-$n-$v.txt" 2>&1
        grep -E 'assignment|built|calibration  ' "$S/log-$n-$v.txt" |
            sed -e 's/.*assignment/assignment/' -e 's/, sums.*//'
        tail -1 "$S/log-$n-$v.txt"
        ./bench/index_dump "$S/ix-$n-$v" "$S/dump-$n-$v" --decompressed > /dev/null
    done
    unset TARTAN_NEAREST_SCREEN
    diff -r "$S/dump-$n-i8" "$S/dump-$n-off" && echo "$n: dumps identical"
}
uptime
for c in m3-20k m1-5k m2-5k d384; do pair "$S/$c"; done
uptime
for K in 512 1024 2048 4096; do
    echo "K $K: $(./bench/bench_assign --device cpu --tokens 65536 --centroids $K \
        --kmeans-points $((K * 4)) --iters 1 --check 65536 2>&1 | grep screened)"
done
./bench/bench_assign --device cpu --embeddings "$S/m3-20k/embeddings.npy" --tokens 300000 \
    --centroids 16384 --per-centroid 16 --iters 2 --check 30000 | tail -8
