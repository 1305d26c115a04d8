#!/bin/bash
# session 46 call 7 (nvidia-h200-x2): the axes code at d 384 on the bit-plane kernels over one
# and two GPUs in one process (TARTAN_GPU_DEVICES=1 / all, split by queries), tartan search
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o7; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o7.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT
C=/tmp/s/d384
$B/tartan gen $C --docs 20000 --dim 384 --queries 4000 --model 3 --seed 11 --dtype f16 > $O/gen.txt 2>&1; echo "gen rc $? $(el)"
for cd in axes scalar; do
  ix=/tmp/s/ix-$cd; $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd.txt 2>&1
  echo "build $cd rc $? $(el)"; $B/tartan info $ix | grep -E "residual code|tokens"
  for g in 1 all; do
    for mode in default exhaustive; do
      x=""; [ $mode = exhaustive ] && x="--exhaustive"
      for rep in 1 2; do
        t0=$(date +%s%N)
        TARTAN_GPU_DEVICES=$g TARTAN_GPU_SPLIT=queries $B/tartan search $ix --queries $C/queries.npy --device cuda --batch 1000 $x -o $O/run-$cd-$g-$mode.trec > $O/search-$cd-$g-$mode.txt 2>&1
        rc=$?; t1=$(date +%s%N)
        echo "$cd gpus=$g $mode rep $rep rc $rc: $(( (t1 - t0) / 1000000 )) ms for 4000 queries; $(grep -iE "queries/s|per second|ms a query" $O/search-$cd-$g-$mode.txt | tail -1)"
      done
    done
  done
  cmp $O/run-$cd-1-exhaustive.trec $O/run-$cd-all-exhaustive.trec && echo "$cd: exhaustive results on 1 and 2 GPUs identical"
done
echo "elapsed $(el)"
