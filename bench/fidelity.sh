#!/bin/sh
# fidelity.sh: builds an index of each corpus with this tree's `tartan` and measures it with
# bench_fidelity (exhaustive search vs exact MaxSim over the original vectors, default search vs
# exhaustive, token cosines, bytes/token), appending one JSON line per corpus.
#
#   bench/fidelity.sh OUTDIR LABEL CORPUS_DIR... [-- BUILD_ARGS...]
#
# Each CORPUS_DIR is as `tartan gen` writes it; its exact top 10 is cached in
# CORPUS_DIR/exact10.trec (computed on the first run). Indexes go to OUTDIR/ix-LABEL-<corpus>,
# results to OUTDIR/fid.jsonl; the build's timing line goes to OUTDIR/build-LABEL-<corpus>.log.
# Run from the build tree (it calls ./tartan and bench/bench_fidelity, or $TARTAN and
# $BENCH_FIDELITY when set).
set -eu
out=$1 label=$2
shift 2
corpora=
while [ $# -gt 0 ] && [ "$1" != "--" ]; do corpora="$corpora $1"; shift; done
[ $# -gt 0 ] && shift
mkdir -p "$out"
for c in $corpora; do
    name=$(basename "$c")
    ix="$out/ix-$label-$name"
    rm -rf "$ix"
    ids=
    [ -f "$c/ids.txt" ] && ids="--ids $c/ids.txt"
    /usr/bin/time -f "%e s wall %U s user %S s sys %M KB" "${TARTAN:-./tartan}" build "$ix" --embeddings "$c/embeddings.npy" \
        --doclens "$c/doclens.npy" $ids "$@" 2>"$out/build-$label-$name.log"
    "${BENCH_FIDELITY:-bench/bench_fidelity}" "$ix" "$c" --truth "$c/exact10.trec" --label "$label-$name" \
        --json "$out/fid.jsonl"
done
