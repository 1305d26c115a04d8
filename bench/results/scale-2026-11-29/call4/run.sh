#!/bin/bash
# session 47 call 4: the exact top 10 of call 3's corpora (models 2 and 1, 100k docs, seed 11),
# which tartan gen does not write: bench_fidelity computes and caches it
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
export CUDA_VISIBLE_DEVICES=0
O=/tmp/o4; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o4.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
date -u; cat $D/COMMIT
for mo in 2 1; do
  C=/tmp/s/m$mo
  $B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1
  md5sum $C/embeddings.npy $C/queries.npy
  ix=/tmp/s/ix-m$mo
  $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda > $O/build-m$mo.txt 2>&1
  $B/bench_fidelity $ix $C --truth $C/exact10.trec --label scalar-k0-m$mo --json $O/fid.jsonl > $O/fid-m$mo.txt 2>&1
  echo "fid m$mo rc $? $(el): $(tail -1 $O/fid-m$mo.txt)"
  cp $C/exact10.trec $O/exact10-m$mo.trec
done
