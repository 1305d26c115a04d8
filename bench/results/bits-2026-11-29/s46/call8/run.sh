#!/bin/bash
# session 46 call 8: a second family at d 384 (model 2 at SciFact's shape): scalar against axes
# on the bit-plane kernels, GPU builds, default/exhaustive speed and fidelity
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o8; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o8.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT
C=/tmp/s/d384m2
$B/tartan gen $C --docs 5183 --dim 384 --doc-len 228 --queries 300 --model 2 --seed 11 > $O/gen.txt 2>&1; echo "gen rc $? $(el)"
for cd in scalar axes auto; do
  ix=/tmp/s/ix-$cd; TARTAN_TRACE=1 $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd.txt 2>&1
  echo "build $cd rc $? $(el)"; grep -E "codec auto" $O/build-$cd.txt | head -2; $B/tartan info $ix | grep "residual code"
done
for cd in scalar axes; do
  timeout 100 $B/bench_search_gpu /tmp/s/ix-$cd --queries $C/queries.npy --json $O/bsg-$cd.json --targets "" --ncells 2 --ndocs 1024 --reps 3 > $O/bsg-$cd.txt 2>&1
  echo "bsg $cd rc $? $(el)"; sed -n 4,9p $O/bsg-$cd.txt
done
for cd in scalar axes; do
  timeout 150 $B/bench_fidelity /tmp/s/ix-$cd $C --truth $C/exact10.trec --label $cd-d384m2 --json $O/fid.jsonl > $O/fid-$cd.txt 2>&1
  echo "fidelity $cd rc $? $(el)"; tail -1 $O/fid-$cd.txt
done
echo "elapsed $(el)"
