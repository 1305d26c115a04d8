#!/bin/bash
# session 38 call 1: 1M model 1; exhaustive fix A/B (pair_q array), per-kernel times without
# ncu's clock/cache control, ncu sections of the big kernels, a trace
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/outS1; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/outS1.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
NCU=/usr/local/cuda/bin/ncu
$B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $?"; tail -2 $O/check_search_gpu.txt
run() { # corpus, name, binary, env...
  local S=$1 name=$2 bin=$3; shift 3
  env "$@" $B/$bin $S/ix --queries $S/queries.npy --reps 3 --targets 0.99 --ncells 1 --ndocs 256 \
      --runs-out $O/run-$name.trec > $O/gpu-$name.txt 2>&1
  echo "== $name rc $? $(( $(date +%s)-T0 )) s"; grep -A1 "^defaults" $O/gpu-$name.txt | head -2; grep "^adaptive\|^fixed\|exhaustive on" $O/gpu-$name.txt
}
S=/tmp/s/big; mkdir -p /tmp/s
t0=$(date +%s)
$B/tartan gen $S --docs 1000000 --queries 1000 --doc-len 70 --seed 8 --model 1 --dtype f16 > /dev/null && \
$B/tartan build $S/ix --embeddings $S/embeddings.npy --doclens $S/doclens.npy --ids $S/ids.txt --device cuda > $O/build1m.txt 2>&1
echo "gen+build rc $? $(( $(date +%s)-t0 )) s"; tail -1 $O/build1m.txt; rm -f $S/embeddings.npy
run $S m1-new-1 bench_search_gpu
run $S m1-old-1 bench_search_gpu_old
run $S m1-new-2 bench_search_gpu
for a in new-1 new-2; do cmp -s $O/run-m1-old-1.trec $O/run-m1-$a.trec && echo "$a = old-1 byte for byte"; done
rm -f $O/run-m1-new-2.trec $O/run-m1-old-1.trec
TARTAN_GPU_TRACE=2 $B/tartan search $S/ix --queries $S/queries.npy --batch 1000 --device cuda -o /dev/null 2> $O/trace-new.txt
xz -9 $O/trace-new.txt
echo "elapsed $(( $(date +%s)-T0 )) s"
# per-kernel times, clocks and caches as they are
$NCU --csv --cache-control none --clock-control none --metrics gpu__time_duration.sum $B/tartan search $S/ix --queries $S/queries.npy --batch 1000 --device cuda -o /dev/null > $O/ncu-times.csv 2>/dev/null
python3 $D/ncusum.py $O/ncu-times.csv > $O/summary-times.txt; head -20 $O/summary-times.txt; xz -9 $O/ncu-times.csv
echo "elapsed $(( $(date +%s)-T0 )) s"
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis"
for k in interaction_narrow centroid_scores_f16x2 probe_segment mark_kernel residual_mma take_kernel; do
  [ $(( $(date +%s)-T0 )) -gt 520 ] && break
  timeout 60 $NCU --csv --page details --cache-control none --clock-control none $SEC -k regex:$k --launch-skip 2 --launch-count 1 \
     $B/tartan search $S/ix --queries $S/queries.npy --batch 1000 --device cuda -o /dev/null > $O/sec-$k.csv 2>&1
  echo "-- $k rc $? $(( $(date +%s)-T0 )) s"; grep -E '"(Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread)"' $O/sec-$k.csv | awk -F'","' '{print $(NF-2), $(NF-1), $NF}' | head -8
done
echo "elapsed $(( $(date +%s)-T0 )) s"; date -u
