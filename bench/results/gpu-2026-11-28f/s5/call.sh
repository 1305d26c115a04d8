#!/bin/bash
# session 38 call 5: TARTAN_GPU_BLOCKS=off (the copy in [K, ld]) against the blocks, one host
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/outS5; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/outS5.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
$B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $?"; tail -1 $O/check_search_gpu.txt
CK_RUN_CASE=batch_interaction $B/check_kernels_gpu > $O/ck-batch_interaction.txt 2>&1; echo "check_kernels_gpu batch_interaction rc $? $(tail -1 $O/ck-batch_interaction.txt)"
run() { # corpus, name, binary, env...
  local S=$1 name=$2 bin=$3; shift 3
  env "$@" $B/$bin $S/ix --queries $S/queries.npy --reps 3 --targets 0.99 --ncells 1 --ndocs 256 \
      --runs-out $O/run-$name.trec > $O/gpu-$name.txt 2>&1
  echo "== $name rc $? $(( $(date +%s)-T0 )) s"; grep -A1 "^defaults" $O/gpu-$name.txt | head -2
}
S=/tmp/s/big; t0=$(date +%s)
$B/tartan gen $S --docs 1000000 --queries 1000 --doc-len 70 --seed 8 --model 1 --dtype f16 > /dev/null && \
$B/tartan build $S/ix --embeddings $S/embeddings.npy --doclens $S/doclens.npy --ids $S/ids.txt --device cuda > $O/build1m.txt 2>&1
echo "gen+build rc $? $(( $(date +%s)-t0 )) s"; rm -f $S/embeddings.npy
run $S m1-blocks-1 bench_search_gpu
run $S m1-noblocks-1 bench_search_gpu TARTAN_GPU_BLOCKS=off
run $S m1-blocks-2 bench_search_gpu
run $S m1-noblocks-2 bench_search_gpu TARTAN_GPU_BLOCKS=off
for a in noblocks-1 blocks-2 noblocks-2; do cmp -s $O/run-m1-blocks-1.trec $O/run-m1-$a.trec && echo "$a = blocks-1 byte for byte"; done
rm -f $O/run-*.trec
echo "elapsed $(( $(date +%s)-T0 )) s"; date -u
