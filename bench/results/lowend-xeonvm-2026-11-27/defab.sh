#!/bin/bash
PY=/work/venvs/peers/bin/python
R=/work/wt-low/bench/results/peers-xeonvm-2026-11-27
out=/tmp/low/defab; mkdir -p $out
for r in 1 2; do for c in scifact1k g10k-m1; do for v in base new4 fp32; do
  lib=$v; env=""; [ $v = fp32 ] && { lib=new4; env="TARTAN_CPU_PROBE=fp32"; }
  env $env OMP_NUM_THREADS=1 LD_PRELOAD=/tmp/low/$lib/libtartan.so.0 $PY /work/wt-low/bench/peers_tartan.py \
      --corpus /work/peers-data/$c --index-dir /tmp/low/idx-$c --threads 1 --exact $R/$c/exact.trec \
      --recall 0.5 --plaid "" --latency-nq 0 --repeats 3 --out $out/$c-$v-$r.jsonl > $out/$c-$v-$r.log 2>&1
done; done; done
