#!/bin/bash
# session 39 call W1: k-means warm start on the GPU: check_index_gpu, 1M model-1 builds cold/warm
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/outW1; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/outW1.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
timeout 200 $B/check_index_gpu > $O/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $? $(( $(date +%s)-T0 )) s"; tail -1 $O/check_index_gpu.txt
S=/tmp/s/big; t0=$(date +%s)
$B/tartan gen $S --docs 1000000 --queries 1000 --doc-len 70 --seed 8 --model 1 --dtype f16 > /dev/null
echo "gen rc $? $(( $(date +%s)-t0 )) s"
for w in 0 default 0b defaultb; do
  t0=$(date +%s); rm -rf $S/ix
  case $w in 0*) export TARTAN_KMEANS_WARM=0;; *) unset TARTAN_KMEANS_WARM;; esac
  TARTAN_KMEANS_TRACE=1 $B/tartan build $S/ix --embeddings $S/embeddings.npy --doclens $S/doclens.npy --ids $S/ids.txt --device cuda > $O/build-$w.txt 2>&1
  echo "== build $w rc $? $(( $(date +%s)-t0 )) s"; grep -E "^built|k-means, member" $O/build-$w.txt
  case $w in *b) continue;; esac
  unset TARTAN_KMEANS_WARM
  $B/bench_search_gpu $S/ix --queries $S/queries.npy --reps 3 --targets 0.99 --ncells 1 --ndocs 256 > $O/gpu-$w.txt 2>&1
  echo "== search $w rc $? $(( $(date +%s)-T0 )) s"; grep -A1 "^defaults" $O/gpu-$w.txt | head -2
  [ $(( $(date +%s)-T0 )) -gt 480 ] && break
done
echo "elapsed $(( $(date +%s)-T0 )) s"; date -u
