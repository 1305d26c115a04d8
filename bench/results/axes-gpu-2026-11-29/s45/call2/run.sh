#!/bin/bash
# session 45 call 2: the axes code's per-warp kernel decoding B fragments in registers (REG, with
# a step's prefetch) against the tile decode (TARTAN_GPU_AXES_TILE=1): tests, codes10k (two
# layouts), model 3 100k: GPU builds, default search
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o2; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o2.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; nproc; date -u; cat $D/COMMIT
for c in residual_axes residual_axes_batched residual_axes_bad_arguments residual_mma_dims; do
  CK_RUN_CASE=$c timeout 150 $B/check_kernels_gpu > $O/ckg-$c.txt 2>&1
  echo "check_kernels_gpu $c rc $? $(el): $(tail -1 $O/ckg-$c.txt)"
done
timeout 120 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(el): $(tail -1 $O/check_search_gpu.txt)"
for r in 1 2; do
for v in reg tile nopf; do
  e="X=1"; [ $v = tile ] && e="TARTAN_GPU_AXES_TILE=1"; [ $v = nopf ] && e="TARTAN_GPU_AXES_PREFETCH=0"
  for L in axes axesm3; do
  env $e timeout 60 $B/bench_kernels_gpu --only codes10k_${L}_1q > $O/b-$v-$L-$r.txt 2>&1
  env $e TARTAN_GPU_AXES_CROSS=0 timeout 60 $B/bench_kernels_gpu --only codes10k_${L}_8q > $O/b-$v-$L-nc8-$r.txt 2>&1
  echo "$v $L $r: $(grep 'us (' $O/b-$v-$L-$r.txt | grep -v fp32 | cut -c1-44) | no cross: $(grep 'us (' $O/b-$v-$L-nc8-$r.txt | grep -v fp32| cut -c1-44)"
  done
done; done
timeout 90 $B/bench_kernels_gpu --only codes10k > $O/bench_codes10k.txt 2>&1; echo "bench codes10k rc $? $(el)"; grep "us (" $O/bench_codes10k.txt | grep -v fp32 | cut -c1-60
mo=3; C=/tmp/s/m$mo
$B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1; echo "gen rc $? $(el)"
for cd in scalar axes; do
  ix=/tmp/s/ix-$cd; $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd.txt 2>&1
  echo "build $cd rc $? $(el): $(grep -h 'axes code' $O/build-$cd.txt | tr '\n' ' ')"
done
for v in scalar axes-reg axes-tile axes-reg2 axes-tile2; do
  [ $(( $(date +%s)-T0 )) -gt 540 ] && { echo "out of time"; exit 0; }
  ix=/tmp/s/ix-${v%%-*}; e="X=1"; [ ${v#axes-} = tile ] || [ ${v#axes-} = tile2 ] && e="TARTAN_GPU_AXES_TILE=1"
  env $e $B/bench_search_gpu $ix --queries $C/queries.npy --json $O/bsg-$v.json --targets "" --ncells 2 --ndocs 1024 --reps 3 > $O/bsg-$v.txt 2>&1
  echo "bsg $v ($e) rc $? $(el)"; sed -n 4,9p $O/bsg-$v.txt
done
echo "elapsed $(el)"
