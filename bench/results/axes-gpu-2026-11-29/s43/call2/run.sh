#!/bin/bash
# session 43 call 2: main 99f8ea6 (step_max shared by the axes MMA kernels; the axes compress
# in per-thread steps): the axes kernel tests, codes10k, 100k builds of model 3 scalar / axes,
# then d 384 (SciFact's shape, model 3) scalar / axes GPU search speed
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/out2; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/out2.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; nproc; date -u
for c in residual_axes residual_axes_batched residual_axes_bad_arguments; do
  CK_RUN_CASE=$c timeout 150 $B/check_kernels_gpu > $O/ckg-$c.txt 2>&1
  echo "check_kernels_gpu $c rc $? $(el): $(tail -1 $O/ckg-$c.txt)"
done
CK_RUN_CASE=axes_code timeout 100 $B/check_search_gpu > $O/csg-axes.txt 2>&1; echo "check_search_gpu axes_code rc $? $(el): $(tail -1 $O/csg-axes.txt)"
timeout 60 $B/bench_kernels_gpu --only codes10k > $O/bench_codes10k.txt 2>&1; echo "bench codes10k rc $? $(el)"; grep "us (" $O/bench_codes10k.txt | grep -v fp32 | cut -c1-60
C=/tmp/s/m3; $B/tartan gen $C --docs 100000 --queries 200 --model 3 --seed 11 > $O/gen-m3.txt 2>&1; echo "gen m3 rc $? $(el)"
for cd in scalar axes; do
  ix=/tmp/s/ix-$cd-m3; rm -rf $ix; t0=$(date +%s)
  TARTAN_KMEANS_TRACE=1 $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd-m3.txt 2>&1
  echo "build $cd-m3 rc $? $(( $(date +%s)-t0 )) s: $(grep -h '^built' $O/build-$cd-m3.txt)"
  grep "^adding: .*tokens)" $O/build-$cd-m3.txt | awk '{for(i=1;i<=NF;i++) if($i=="residuals") s+=$(i+1)} END {print "  residuals summed:", s, "s"}'
  rm -rf $ix
done
C=/tmp/s/d384; $B/tartan gen $C --docs 5183 --queries 300 --model 3 --dim 384 --doc-len 228 --seed 11 > $O/gen-d384.txt 2>&1; echo "gen d384 rc $? $(el)"
for cd in scalar axes; do
  [ $(( $(date +%s)-T0 )) -gt 420 ] && { echo "out of time"; exit 0; }
  ix=/tmp/s/ix-$cd-d384; rm -rf $ix; t0=$(date +%s)
  $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd-d384.txt 2>&1
  echo "build $cd-d384 rc $? $(( $(date +%s)-t0 )) s: $(grep -h '^built\|axes code' $O/build-$cd-d384.txt | tr '\n' ' ')"
  timeout 100 $B/bench_search_gpu $ix --queries $C/queries.npy --json $O/bsg-$cd-d384.json --targets "" --ncells 2 --ndocs 1024 --reps 3 > $O/bsg-$cd-d384.txt 2>&1
  echo "bsg $cd-d384 rc $? $(el)"; sed -n 1,9p $O/bsg-$cd-d384.txt
done
echo "elapsed $(el)"
