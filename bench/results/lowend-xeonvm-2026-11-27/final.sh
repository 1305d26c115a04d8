#!/bin/bash
# final.sh ROUND CORPORA...: base tartan, new tartan (/tmp/low/new4), WARP; 1 thread, same session
r=$1; shift
PY=/work/venvs/peers/bin/python
R=/work/wt-low/bench/results/peers-xeonvm-2026-11-27
out=/tmp/low/final; mkdir -p $out
for c in "$@"; do
  refs="--exact $R/$c/exact.trec --tartan-exhaustive $R/$c/tartan-exhaustive.trec"
  for b in base new4; do
    uptime > $out/$c-$b-$r.uptime
    OMP_NUM_THREADS=1 LD_PRELOAD=/tmp/low/$b/libtartan.so.0 $PY /work/wt-low/bench/peers_tartan.py \
      --corpus /work/peers-data/$c --index-dir /tmp/low/idx-$c --threads 1 $refs \
      --recall 0.3,0.5 --plaid ${PLAID:-1x16,1x32,1x64} --latency-nq 30 --repeats 2 --out $out/$c-$b-$r.jsonl > $out/$c-$b-$r.log 2>&1
  done
  if [ $r = 1 ]; then
    uptime > $out/$c-warp-$r.uptime
    OMP_NUM_THREADS=1 $PY /work/wt-low/bench/peers_warp.py --corpus /work/peers-data/$c --index-dir /tmp/low/warp/idx-$c \
      --threads 1 $refs --nprobe 2,8 --thresholds 0 --t-prime "" --latency-nq 30 --repeats 2 \
      --out $out/$c-warp-$r.jsonl > $out/$c-warp-$r.log 2>&1
  fi
done
