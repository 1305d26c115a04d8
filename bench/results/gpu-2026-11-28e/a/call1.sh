#!/bin/bash
# call 1: tests at the new tree; 1M model 1: old vs new, chunk budgets, trace, ncu at real clocks
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/out1; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/out1.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
$B/check_kernels_gpu > $O/check_kernels_gpu.txt 2>&1; echo "check_kernels_gpu rc $?"; grep -E '^[0-9]+%|Failure|Error' $O/check_kernels_gpu.txt | head
$B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $?"; grep -E '^[0-9]+%|Failure|Error' $O/check_search_gpu.txt | head
grep -h "GPU recall" $O/check_search_gpu.txt | head -12
echo "tests done $(( $(date +%s)-T0 )) s"
run() { # corpus, name, binary, env...
  local S=$1 name=$2 bin=$3; shift 3
  env "$@" $B/$bin $S/ix --queries $S/queries.npy --reps 3 --targets 0.99 --ncells 1 --ndocs 256 \
      --runs-out $O/run-$name.trec > $O/gpu-$name.txt 2>&1
  echo "== $name rc $?"; grep -A1 "^defaults" $O/gpu-$name.txt | head -2; grep "^adaptive\|^fixed" $O/gpu-$name.txt
}
S=/tmp/s/big; mkdir -p /tmp/s
t0=$(date +%s)
$B/tartan gen $S --docs 1000000 --queries 1000 --doc-len 70 --seed 8 --model 1 --dtype f16 > /dev/null && \
$B/tartan build $S/ix --embeddings $S/embeddings.npy --doclens $S/doclens.npy --ids $S/ids.txt --device cuda > $O/build1m.txt 2>&1
echo "gen+build rc $? $(( $(date +%s)-t0 )) s"; tail -1 $O/build1m.txt; rm -f $S/embeddings.npy
for rep in 1 2; do
  run $S m1-old-$rep bench_search_gpu_old
  run $S m1-new-$rep bench_search_gpu
done
for mb in 2048 4096 8192; do run $S m1-new-t$mb bench_search_gpu TARTAN_GPU_TABLE_MB=$mb; done
run $S m1-new-t4096-i8 bench_search_gpu TARTAN_GPU_TABLE_MB=4096 TARTAN_GPU_TABLE=i8
for a in new-1 new-2 new-t2048 new-t4096 new-t8192; do cmp -s $O/run-m1-old-1.trec $O/run-m1-$a.trec && echo "$a = old-1 byte for byte"; done
rm -f $O/run-m1-*-2.trec $O/run-m1-new-t*.trec
echo "elapsed $(( $(date +%s)-T0 )) s"
for mb in 1024 4096; do
  TARTAN_GPU_TABLE_MB=$mb TARTAN_GPU_TRACE=2 $B/tartan search $S/ix --queries $S/queries.npy --batch 1000 --device cuda -o /dev/null 2> $O/trace-$mb.txt
  grep -c chunk $O/trace-$mb.txt; tail -3 $O/trace-$mb.txt
done
echo "elapsed $(( $(date +%s)-T0 )) s"
if [ $(( $(date +%s)-T0 )) -lt 420 ]; then
  timeout 120 /usr/local/cuda/bin/ncu --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum $B/tartan search $S/ix --queries $S/queries.npy --batch 1000 --device cuda -o /dev/null > $O/ncu-new.csv 2>/dev/null
  python3 $D/ncusum.py $O/ncu-new.csv > $O/summary-new.txt; head -24 $O/summary-new.txt; xz -9 $O/ncu-new.csv
fi
echo "elapsed $(( $(date +%s)-T0 )) s"; date -u
