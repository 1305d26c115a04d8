#!/bin/bash
# session 40: the warm start on the GPU, quality: 100k docs of models 1-3, GPU builds cold / 2/4
# (two seeds each), bench_fidelity (exact truth on the CPU's 16 cores)
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=$OUT/w; mkdir -p $O /tmp/s
nvidia-smi -L | tee $O/gpu.txt; nproc; date -u
for mo in 1 2 3; do
  C=/tmp/s/m$mo; t0=$(date +%s)
  $B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1
  echo "gen m$mo rc $? $(( $(date +%s)-t0 )) s"
  for sd in 42 7; do
    for w in 0 2/4; do
      L=$(echo "w${w}-s$sd-m$mo" | tr / _); ix=/tmp/s/ix-$L; rm -rf $ix; t0=$(date +%s)
      TARTAN_KMEANS_WARM=$w TARTAN_KMEANS_TRACE=1 $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --seed $sd > $O/build-$L.txt 2>&1
      echo "build $L rc $? $(( $(date +%s)-t0 )) s: $(grep -o 'training [0-9.]* s' $O/build-$L.txt)"
      $B/bench_fidelity $ix $C --truth $C/exact10.trec --label $L --json $O/fid.jsonl > $O/fid-$L.txt 2>&1
      echo "fid $L rc $? $(( $(date +%s)-T0 )) s: $(tail -1 $O/fid-$L.txt)"
      rm -rf $ix
      [ $(( $(date +%s)-T0 )) -gt 540 ] && exit 0
    done
  done
done
echo "elapsed $(( $(date +%s)-T0 )) s"
