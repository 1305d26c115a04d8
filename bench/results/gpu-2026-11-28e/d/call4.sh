#!/bin/bash
# call 4: another host: 1M model 1, new vs old, and the new per-chunk split
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/out4; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/out4.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
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
for a in new-1 new-2; do cmp -s $O/run-m1-old-1.trec $O/run-m1-$a.trec && echo "$a = old-1 byte for byte"; done
rm -f $O/run-m1-new-2.trec
TARTAN_GPU_TRACE=2 $B/tartan search $S/ix --queries $S/queries.npy --batch 1000 --device cuda -o /dev/null 2> $O/trace-new.txt
grep -c chunk $O/trace-new.txt; grep 'interaction' $O/trace-new.txt | head -3; grep 'candidates' $O/trace-new.txt | head -3
time $B/tartan search $S/ix --queries $S/queries.npy --batch 1000 --device cuda -o $O/cli.trec 2>&1 | tail -2
echo "elapsed $(( $(date +%s)-T0 )) s"; date -u
