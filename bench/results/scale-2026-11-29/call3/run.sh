#!/bin/bash
# session 47 call 3: the same as call 2 for models 2 and 1 (100k documents, seed 11), without
# bench_fidelity's token cosines (slow for the axes code on the CPU): exh/exact and def/exh from
# tartan search runs against the corpus's exact top 10
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
export CUDA_VISIBLE_DEVICES=0
O=/tmp/o3; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o3.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
rec() { python3 - "$1" "$2" <<'PY'
import sys, collections
def top(p):
    d = collections.defaultdict(list)
    for l in open(p):
        f = l.split()
        if len(f) >= 5: d[f[0]].append((int(f[3]), f[2]))
    return {q: {x for _, x in sorted(v)[:10]} for q, v in d.items()}
a, b = top(sys.argv[1]), top(sys.argv[2])
print(f"{sum(len(a.get(q, set()) & b[q]) / 10 for q in b) / len(b):.4f}")
PY
}
nvidia-smi -L; nproc; date -u; cat $D/COMMIT
for mo in 2 1; do
  C=/tmp/s/m$mo; t0=$(date +%s)
  $B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1
  echo "gen m$mo rc $? $(( $(date +%s)-t0 )) s"
  for cfg in scalar:0 axes:0 axes:65536 scalar:65536; do
    cd_=${cfg%%:*}; K=${cfg##*:}; L=$cd_-k$K-m$mo; ix=/tmp/s/ix-$L; rm -rf $ix; t0=$(date +%s)
    kx=""; [ $K != 0 ] && kx="--centroids $K"
    $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd_ $kx > $O/build-$L.txt 2>&1
    echo "build $L rc $? $(( $(date +%s)-t0 )) s: $(grep -oE 'training [0-9.]* s|[0-9]+ centroids|axes code[^;]*' $O/build-$L.txt | head -3 | tr '\n' ' ')"
    du -sb $ix | awk '{print "bytes", $1}'
    $B/tartan search $ix --queries $C/queries.npy --device cuda --exhaustive -o $O/exh-$L.trec > /dev/null 2>&1
    $B/tartan search $ix --queries $C/queries.npy --device cuda -o $O/def-$L.trec > /dev/null 2>&1
    echo "fid $L: exh/exact $(rec $O/exh-$L.trec $C/exact10.trec) def/exh $(rec $O/def-$L.trec $O/exh-$L.trec) def/exact $(rec $O/def-$L.trec $C/exact10.trec) $(el)"
    $B/bench_search_gpu $ix --queries $C/queries.npy --targets "" --ncells 2 --ndocs 1024 --reps 3 --json $O/bsg-$L.json > $O/bsg-$L.txt 2>&1
    echo "bsg $L rc $? $(el)"; grep -A1 -E "^defaults|^exhaustive" $O/bsg-$L.txt
    for rep in 1 2; do
      t0=$(date +%s%N)
      $B/tartan search $ix --queries $C/queries.npy --device cpu -o $O/cpu-$L.trec > $O/cpu-$L.txt 2>&1
      echo "cpu search $L rep $rep rc $?: $(( ($(date +%s%N) - t0) / 1000000 )) ms for 200 queries (32 cores)"
    done
    [ $(( $(date +%s)-T0 )) -gt 480 ] && exit 0
    rm -rf $ix
  done
done
echo "elapsed $(el)"
