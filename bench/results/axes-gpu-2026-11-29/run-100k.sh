#!/bin/bash
# session 42 call A: check_search_gpu (axes test), kernel axes cases; 100k docs of models 3 and 1:
# GPU builds scalar / axes, fidelity (exh/exact), bench_search_gpu (default + exhaustive)
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=$OUT/a; mkdir -p $O /tmp/s
nvidia-smi -L | tee $O/gpu.txt; nproc; date -u
timeout 200 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(( $(date +%s)-T0 )) s"; tail -3 $O/check_search_gpu.txt
for cs in residual_axes residual_axes_batched residual_axes_bad_arguments; do
  CK_RUN_CASE=$cs timeout 120 $B/check_kernels_gpu > $O/ckg-$cs.txt 2>&1; echo "ckg $cs rc $? $(( $(date +%s)-T0 )) s"; tail -1 $O/ckg-$cs.txt
done
for mo in 3 1 2; do
  C=/tmp/s/m$mo; t0=$(date +%s)
  $B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1
  echo "gen m$mo rc $? $(( $(date +%s)-t0 )) s"
  for cd in scalar axes; do
    L=$cd-m$mo; ix=/tmp/s/ix-$L; rm -rf $ix; t0=$(date +%s)
    TARTAN_KMEANS_TRACE=1 $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$L.txt 2>&1
    echo "build $L rc $? $(( $(date +%s)-t0 )) s: $(grep -o 'training [0-9.]* s' $O/build-$L.txt) $(grep 'axes code' $O/build-$L.txt)"
    $B/bench_fidelity $ix $C --truth $C/exact10.trec --label $L --json $O/fid.jsonl > $O/fid-$L.txt 2>&1
    echo "fid $L rc $? $(( $(date +%s)-T0 )) s: $(tail -1 $O/fid-$L.txt)"
    $B/bench_search_gpu $ix --queries $C/queries.npy --json $O/bsg-$L.json --reps 3 > $O/bsg-$L.txt 2>&1
    echo "bsg $L rc $? $(( $(date +%s)-T0 )) s"; tail -6 $O/bsg-$L.txt
    [ $(( $(date +%s)-T0 )) -gt 520 ] && exit 0
  done
  rm -rf /tmp/s/ix-*
done
echo "elapsed $(( $(date +%s)-T0 )) s"
