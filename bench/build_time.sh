#!/bin/sh
# build_time.sh: times `tartan build` on the CPU for issue 19's goal (a 20k-document,
# 1.45M-token corpus in <= 150 s on 2 cores, search recall unchanged) and splits the time into
# phases. Run from the build tree on a quiet host, pinned to two cores:
#
#   taskset -c 0,1 bench/build_time.sh OUTDIR [LABEL]
#
# It writes the corpus (tartan gen --model 3, 20,000 documents of ~74 tokens: 1,453,008 tokens,
# d 128; kept in OUTDIR/m3-20k for later runs), builds OUTDIR/ix-LABEL with the defaults, and
# prints: the load average before and after, wall and CPU seconds of the build, the tool's
# training / adding split, and bench_assign's k-means and assignment (encoding) times at the
# same sizes, so that adding minus assignment and compression is the LMDB write. Then
# bench_fidelity measures the index's recall (exhaustive vs exact MaxSim, default search vs
# exhaustive). TARTAN and BENCH_FIDELITY may name other builds' programs (a checkout of main,
# to compare), as in bench/fidelity.sh.
set -eu
out=$1 label=${2:-build}
mkdir -p "$out"
c="$out/m3-20k"
T=${TARTAN:-./tartan}
[ -f "$c/doclens.npy" ] || "$T" gen "$c" --docs 20000 --doc-len 74 --model 3 --queries 200
echo "host: $(nproc) cores usable; $(uptime)"
rm -rf "$out/ix-$label"
/usr/bin/time -f "build: %e s wall, %U s user, %S s sys, %M KB peak" "$T" build "$out/ix-$label" \
    --embeddings "$c/embeddings.npy" --doclens "$c/doclens.npy" --ids "$c/ids.txt"
echo "after the build: $(uptime)"
# The same sizes through bench_assign: K 16,384, the k-means sample (64 points a centroid,
# index/train.c), 4 iterations (the default), every token assigned.
if [ -x bench/bench_assign ]; then
    bench/bench_assign --device cpu --tokens 1453008 --centroids 16384 --kmeans-points 1048576 \
        --iters 4 --check 0 2>&1 | tail -6
fi
"${BENCH_FIDELITY:-bench/bench_fidelity}" "$out/ix-$label" "$c" --truth "$c/exact10.trec" \
    --label "$label-m3-20k" --json "$out/fid.jsonl"
