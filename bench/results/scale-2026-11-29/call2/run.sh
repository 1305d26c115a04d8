#!/bin/bash
# session 47 call 2 (nvidia-h200-x2, one GPU used): fidelity at 100k documents against the number
# of centroids: models 3 and 2 (tartan gen --docs 100000 --seed 11), scalar / axes at the build's
# K (32,768) and at 65,536; exh/exact and def/exh (bench_fidelity), GPU search speed
# (bench_search_gpu), CPU default search time on the host's cores
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
export CUDA_VISIBLE_DEVICES=0
O=/tmp/o2; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o2.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; nproc; date -u; cat $D/COMMIT
for mo in 3 2; do
  C=/tmp/s/m$mo; t0=$(date +%s)
  $B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1
  echo "gen m$mo rc $? $(( $(date +%s)-t0 )) s"
  for cfg in scalar:0 axes:0 axes:65536 scalar:65536; do
    cd_=${cfg%%:*}; K=${cfg##*:}; L=$cd_-k$K-m$mo; ix=/tmp/s/ix-$L; rm -rf $ix; t0=$(date +%s)
    kx=""; [ $K != 0 ] && kx="--centroids $K"
    $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd_ $kx > $O/build-$L.txt 2>&1
    echo "build $L rc $? $(( $(date +%s)-t0 )) s: $(grep -oE 'training [0-9.]* s|[0-9]+ centroids' $O/build-$L.txt | head -2 | tr '\n' ' ')"
    du -sb $ix | awk '{print "bytes", $1}'
    $B/bench_fidelity $ix $C --truth $C/exact10.trec --label $L --json $O/fid.jsonl > $O/fid-$L.txt 2>&1
    echo "fid $L rc $? $(el): $(tail -1 $O/fid-$L.txt)"
    $B/bench_search_gpu $ix --queries $C/queries.npy --targets "" --ncells 2 --ndocs 1024 --reps 3 --json $O/bsg-$L.json > $O/bsg-$L.txt 2>&1
    echo "bsg $L rc $? $(el)"; tail -4 $O/bsg-$L.txt
    for rep in 1 2; do
      t0=$(date +%s%N)
      TARTAN_DEVICE=cpu $B/tartan search $ix --queries $C/queries.npy --device cpu -o $O/cpu-$L.trec > $O/cpu-$L.txt 2>&1
      echo "cpu search $L rep $rep rc $?: $(( ($(date +%s%N) - t0) / 1000000 )) ms for 200 queries (16 cores)"
    done
    [ $(( $(date +%s)-T0 )) -gt 530 ] && exit 0
    [ $K != 0 ] && rm -rf $ix
  done
  rm -rf /tmp/s/ix-*
done
echo "elapsed $(el)"
