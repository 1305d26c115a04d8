#!/usr/bin/env bash
# peers_device.sh: the side-by-side run of issue 22 on the GPU host, in one call, from the
# repository root, with .devpack/ (bench/peers_prep.sh) carried:
#
#   bash bench/peers_device.sh    # table, plots, logs and a tarball of every record in $OUT
#
# Installs the carried wheels into /tmp/site (no internet there), unpacks the tartan command,
# generates the corpora with `tartan gen` (cheaper than carrying them), and runs
# bench/peers_run.sh on them with a deadline, so that the table and plots are written even
# when the run is cut short. Settings (environment; defaults in brackets): DOCS [20000] a
# corpus, MODELS [2 1] (`tartan gen --model`, in that order), NQ [100] queries, DEADLINE [470]
# seconds after which no new run starts, and everything peers_run.sh reads (ENGINES, THREADS,
# THREADS [1 16: the issue's goals], TARTAN_NBITS [2 4], PARALLEL [1], VOY_BG [1], LAT_NQ [20],
# REPEATS [1], MAX_S [40], RUN_CAP [3 x MAX_S], ...). SCIFACT=DIR adds a
# corpus directory already on the host. SciFact's embeddings (1.9 GB) are too large to carry:
# with .devpack/scifact.tar.xz there (bench/peers_prep.sh with SCIFACT_PY), SCIFACT=embed
# embeds BEIR SciFact on the host's GPU first (bench/scifact/embed.py, all 5,183 documents
# and 300 test queries, weights rounded to fp16 by bench/scifact/pack_model.py) and adds it.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
t0=$(date +%s)
# the runs write many files; the device tool brings back at most 8 from $OUT, so the work
# happens in $res and the summary is copied to $OUT at the end
res=/tmp/peers-res
final=${OUT:-/tmp/peers-out}
mkdir -p "$res" "$final"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .devpack/peers-wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
mkdir -p /tmp/peers-bin && tar -C /tmp -xJf .devpack/peers-bin.tar.xz || exit 1
export LD_LIBRARY_PATH=/tmp/peers-bin/lib:/tmp/site/tartan${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
T=/tmp/peers-bin/bin/tartan
{
  echo "== $(date -u +%FT%TZ) $(nproc) cores; $(nvidia-smi -L 2>/dev/null | head -1)"
  python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'
  "$T" --version
  python3 -c 'import sys; sys.path.insert(0, "bench"); import peers_fastplaid as p; p.stub_usearch(); import tartan, fast_plaid.search; print("tartan and fast-plaid import (peers_warp.py stubs duckdb, peers_fastplaid.py usearch where missing)")'
  python3 -c 'import voyager_index, faiss, latence_shard_engine; print("voyager-index imports")'
} 2>&1 | tee "$res/env.txt"
DOCS=${DOCS:-20000}
NQ=${NQ:-100}
corpora=()
mkdir -p /tmp/peers-corpora
for m in ${MODELS:-2 1}; do
  c=/tmp/peers-corpora/gen-m$m-$((DOCS / 1000))k
  "$T" gen "$c" --docs "$DOCS" --queries "$NQ" --doc-len 70 --seed 7 --model "$m" 2>&1 |
    tail -1 | tee -a "$res/env.txt"
  corpora+=("$c")
done
if [[ ${SCIFACT:-} == embed ]]; then
  # SCIFACT_DOCS=N: its first N documents only (BEIR's order), in scifactNk
  sf=/tmp/peers-corpora/scifact${SCIFACT_DOCS:+$((SCIFACT_DOCS / 1000))k}
  tar -C /tmp -xJf .devpack/scifact.tar.xz &&
    python3 bench/scifact/embed.py --data /tmp/scifact/data --model-dir /tmp/scifact/model \
      --device "$(nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)" --pad-queries \
      --limit "${SCIFACT_DOCS:-0}" --out "$sf" 2>&1 | tail -2 | tee -a "$res/env.txt" &&
    corpora+=("$sf")
  cp "$sf/meta.json" "$res/scifact-meta.json" 2>/dev/null
elif [[ -n ${SCIFACT:-} ]]; then
  corpora+=("$SCIFACT")
fi
used=$(( $(date +%s) - t0 ))
echo "setup: $used s" | tee -a "$res/env.txt"
TARTAN=$T PY=python3 NQ=$NQ DEADLINE=$(( ${DEADLINE:-470} - used )) PARALLEL=${PARALLEL:-1} \
  THREADS=${THREADS:-1 16} TARTAN_NBITS=${TARTAN_NBITS:-2 4} \
  VOY_BG=${VOY_BG:-1} LAT_NQ=${LAT_NQ:-20} REPEATS=${REPEATS:-1} MAX_S=${MAX_S:-40} \
  RUN_CAP=${RUN_CAP:-$(( 3 * ${MAX_S:-40} ))} \
  WORK=/tmp/peers-work bash bench/peers_run.sh "$res" "${corpora[@]}" 2>&1 | tee "$res/run.log"
# two files a call (the device tool brings back at most 8): the table, and every record, log
# and plot in the tarball
cp "$res"/peers-table.md "$res"/peers-results.tar.gz "$final"/ 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s; in $final: $(ls "$final" | tr '\n' ' ')"
