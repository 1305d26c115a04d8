#!/bin/bash
# call 3: the column bests from the table kernel, table budget 2 GiB; tests; 1M model 1 and 200k models 3, 2: old vs new
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/out3; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/out3.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
for cs in centroid_scores_f16 adaptive_stages memory errors; do
  CK_RUN_CASE=$cs $B/check_kernels_gpu > $O/ck-$cs.txt 2>&1; echo "check_kernels_gpu $cs rc $? $(tail -1 $O/ck-$cs.txt) $(( $(date +%s)-T0 )) s"
done
$B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $?"; grep -E '^[0-9]+%|Failure|Error' $O/check_search_gpu.txt | head
grep -h "GPU recall" $O/check_search_gpu.txt | head -12
echo "tests done $(( $(date +%s)-T0 )) s"
run() { # corpus, name, binary, env...
  local S=$1 name=$2 bin=$3; shift 3
  env "$@" $B/$bin $S/ix --queries $S/queries.npy --reps 3 --targets 0.99 --ncells 1 --ndocs 256 \
      --runs-out $O/run-$name.trec > $O/gpu-$name.txt 2>&1
  echo "== $name rc $? $(( $(date +%s)-T0 )) s"; grep -A1 "^defaults" $O/gpu-$name.txt | head -2; grep "^adaptive\|^fixed" $O/gpu-$name.txt
}
S=/tmp/s/big; mkdir -p /tmp/s
t0=$(date +%s)
$B/tartan gen $S --docs 1000000 --queries 1000 --doc-len 70 --seed 8 --model 1 --dtype f16 > /dev/null && \
$B/tartan build $S/ix --embeddings $S/embeddings.npy --doclens $S/doclens.npy --ids $S/ids.txt --device cuda > $O/build1m.txt 2>&1
echo "gen+build rc $? $(( $(date +%s)-t0 )) s"; tail -1 $O/build1m.txt; rm -f $S/embeddings.npy
run $S m1-new-1 bench_search_gpu
run $S m1-old-1 bench_search_gpu_old
run $S m1-new-2 bench_search_gpu
run $S m1-colprobe bench_search_gpu TARTAN_GPU_COLBEST=probe
run $S m1-t1024 bench_search_gpu TARTAN_GPU_TABLE_MB=1024
for a in new-1 new-2 colprobe t1024; do cmp -s $O/run-m1-old-1.trec $O/run-m1-$a.trec && echo "$a = old-1 byte for byte"; done
rm -f $O/run-m1-new-2.trec $O/run-m1-colprobe.trec $O/run-m1-t1024.trec
rm -rf $S
echo "elapsed $(( $(date +%s)-T0 )) s"
for m in 3 2; do
  [ $(( $(date +%s)-T0 )) -gt 500 ] && { echo "skipping model $m: time"; continue; }
  S=/tmp/s/m$m; t0=$(date +%s)
  $B/tartan gen $S --docs 200000 --queries 1000 --doc-len 70 --seed $((7+m)) --model $m --dtype f16 > /dev/null && \
  $B/tartan build $S/ix --embeddings $S/embeddings.npy --doclens $S/doclens.npy --ids $S/ids.txt --device cuda > $O/build-m$m.txt 2>&1
  echo "model $m gen+build rc $? $(( $(date +%s)-t0 )) s"; tail -1 $O/build-m$m.txt
  run $S m$m-old bench_search_gpu_old
  run $S m$m-new bench_search_gpu
  cmp -s $O/run-m$m-old.trec $O/run-m$m-new.trec && echo "model $m: new = old byte for byte"
done
echo "elapsed $(( $(date +%s)-T0 )) s"; date -u
