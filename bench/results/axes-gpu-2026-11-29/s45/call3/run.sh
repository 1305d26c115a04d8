#!/bin/bash
# session 45 call 3: the per-warp axes kernel decoding in registers only (the tile path gone):
# GPU tests, codes10k, model 3 100k: scalar / axes GPU builds, default search, traced rounds
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o3; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o3.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; nproc; date -u; cat $D/COMMIT
for c in residual_axes residual_axes_batched residual_axes_bad_arguments residual_mma_dims; do
  CK_RUN_CASE=$c timeout 150 $B/check_kernels_gpu > $O/ckg-$c.txt 2>&1
  echo "check_kernels_gpu $c rc $? $(el): $(tail -1 $O/ckg-$c.txt)"
done
timeout 120 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(el): $(tail -1 $O/check_search_gpu.txt)"
timeout 120 $B/check_index_gpu > $O/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $? $(el): $(tail -1 $O/check_index_gpu.txt)"
timeout 90 $B/bench_kernels_gpu --only codes10k > $O/bench_codes10k.txt 2>&1; echo "bench codes10k rc $? $(el)"; grep "us (" $O/bench_codes10k.txt | grep -v fp32 | cut -c1-60
for L in axes axesm3; do TARTAN_GPU_AXES_CROSS=0 timeout 60 $B/bench_kernels_gpu --only codes10k_${L}_8q > $O/b-nc8-$L.txt 2>&1; echo "no cross: $(grep 'us (' $O/b-nc8-$L.txt | grep -v fp32| cut -c1-50)"; done
mo=3; C=/tmp/s/m$mo
$B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1; echo "gen rc $? $(el)"
for cd in scalar axes; do
  ix=/tmp/s/ix-$cd; $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd.txt 2>&1
  echo "build $cd rc $? $(el): $(grep -h 'axes code' $O/build-$cd.txt | tr '\n' ' ')"
done
for v in scalar axes scalar2 axes2; do
  ix=/tmp/s/ix-${v%2}
  $B/bench_search_gpu $ix --queries $C/queries.npy --json $O/bsg-$v.json --targets "" --ncells 2 --ndocs 1024 --reps 3 > $O/bsg-$v.txt 2>&1
  echo "bsg $v rc $? $(el)"; sed -n 4,9p $O/bsg-$v.txt
done
for v in scalar axes; do
  TARTAN_GPU_TRACE=2 $B/tartan search /tmp/s/ix-$v --queries $C/queries.npy --device cuda --batch 1 -o /dev/null --quiet 2> $O/trace-$v.txt
  echo "trace $v rc $? $(el): $(wc -l < $O/trace-$v.txt) lines"; sed -n 20,30p $O/trace-$v.txt
done
echo "elapsed $(el)"
