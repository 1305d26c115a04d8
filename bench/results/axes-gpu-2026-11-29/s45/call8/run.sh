#!/bin/bash
# session 45 call 8: main 672d505 (reg_setup shared): the split kernel, models 3 and 1; axes tests, GPU
# search tests, codes10k, 100k default search, split on / off
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o8; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o8.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT
for sp in auto 1; do
for c in residual_axes residual_axes_batched residual_axes_bad_arguments residual_mma_dims; do
  e="X=1"; [ $sp = 1 ] && e="TARTAN_GPU_AXES_SPLIT=1"
  env $e CK_RUN_CASE=$c timeout 150 $B/check_kernels_gpu > $O/ckg-$sp-$c.txt 2>&1
  echo "check_kernels_gpu split=$sp $c rc $? $(el): $(tail -1 $O/ckg-$sp-$c.txt)"
done; done
timeout 120 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(el): $(tail -1 $O/check_search_gpu.txt)"
for sp in 0 1; do TARTAN_GPU_AXES_SPLIT=$sp timeout 60 $B/bench_kernels_gpu --only codes10k_axesm3_1q > $O/b-split$sp.txt 2>&1; echo "split=$sp: $(grep 'us (' $O/b-split$sp.txt | grep -v fp32 | cut -c1-50)"; done
timeout 90 $B/bench_kernels_gpu --only codes10k > $O/bench_codes10k.txt 2>&1; echo "bench codes10k rc $? $(el)"; grep "us (" $O/bench_codes10k.txt | grep -v fp32 | cut -c1-60
for mo in 3 1; do
  C=/tmp/s/m$mo
  $B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1; echo "gen m$mo rc $? $(el)"
  for cd in scalar axes; do
    ix=/tmp/s/ix-$cd-m$mo; $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd-m$mo.txt 2>&1
    echo "build $cd m$mo rc $? $(el)"
  done
  for v in scalar axes-split axes-nosplit; do
    ix=/tmp/s/ix-${v%%-*}-m$mo; e="X=1"
    case $v in axes-nosplit*) e="TARTAN_GPU_AXES_SPLIT=0";; esac
    env $e $B/bench_search_gpu $ix --queries $C/queries.npy --json $O/bsg-$v-m$mo.json --targets "" --ncells 2 --ndocs 1024 --reps 3 > $O/bsg-$v-m$mo.txt 2>&1
    echo "bsg $v m$mo ($e) rc $? $(el)"; sed -n 4,9p $O/bsg-$v-m$mo.txt
  done
  rm -rf /tmp/s/ix-*-m$mo
done
echo "elapsed $(el)"
