#!/bin/bash
PY=/work/venvs/peers/bin/python
for c in scifact1k g10k-m2 g10k-m1; do
  uptime > /tmp/low/warp/$c-build.uptime
  $PY /work/wt-low/bench/peers_warp.py --corpus /work/peers-data/$c --index-dir /tmp/low/warp/idx-$c --build --no-search --device cpu --threads 2 --out /tmp/low/warp/$c-build.jsonl > /tmp/low/warp/$c-build.log 2>&1
done
