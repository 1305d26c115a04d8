#!/bin/bash
while pgrep -f "final.sh 2" >/dev/null; do sleep 5; done
PY=/work/venvs/peers/bin/python
R=/work/wt-low/bench/results/peers-xeonvm-2026-11-27
out=/tmp/low/final
for c in g10k-m1 scifact1k g10k-m2; do
  refs="--exact $R/$c/exact.trec --tartan-exhaustive $R/$c/tartan-exhaustive.trec"
  uptime > $out/$c-warp-2.uptime
  OMP_NUM_THREADS=1 $PY /work/wt-low/bench/peers_warp.py --corpus /work/peers-data/$c --index-dir /tmp/low/warp/idx-$c \
    --threads 1 $refs --nprobe 2,8 --thresholds 0 --t-prime "" --latency-nq 30 --repeats 2 \
    --out $out/$c-warp-2.jsonl > $out/$c-warp-2.log 2>&1
done
