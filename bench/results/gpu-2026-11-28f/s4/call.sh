#!/bin/bash
# session 38 call 4: one query's copy without blocks; single-query latency at 200k, new and
# former binaries alternating
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/outS4; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/outS4.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
$B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $?"; tail -1 $O/check_search_gpu.txt
run() { # corpus, name, binary, env...
  local S=$1 name=$2 bin=$3; shift 3
  env "$@" $B/$bin $S/ix --queries $S/queries.npy --reps 3 --targets 0.99 --ncells 1 --ndocs 256 \
      --runs-out $O/run-$name.trec > $O/gpu-$name.txt 2>&1
  echo "== $name rc $? $(( $(date +%s)-T0 )) s"; grep -A1 "^defaults" $O/gpu-$name.txt | head -2
}
mkdir -p /tmp/s
for m in 3 2; do
  S=/tmp/s/m$m; t0=$(date +%s)
  $B/tartan gen $S --docs 200000 --queries 1000 --doc-len 70 --seed $((7+m)) --model $m --dtype f16 > /dev/null && \
  $B/tartan build $S/ix --embeddings $S/embeddings.npy --doclens $S/doclens.npy --ids $S/ids.txt --device cuda > $O/build-m$m.txt 2>&1
  echo "model $m gen+build rc $? $(( $(date +%s)-t0 )) s"
  run $S 200k-m$m-old-1 bench_search_gpu_old
  run $S 200k-m$m-new-1 bench_search_gpu
  run $S 200k-m$m-old-2 bench_search_gpu_old
  run $S 200k-m$m-new-2 bench_search_gpu
  for a in new-1 new-2; do cmp -s $O/run-200k-m$m-old-1.trec $O/run-200k-m$m-$a.trec && echo "model $m: $a = old-1 byte for byte"; done
  rm -f $O/run-*.trec
  [ $(( $(date +%s)-T0 )) -gt 300 ] && break
done
echo "elapsed $(( $(date +%s)-T0 )) s"; date -u
