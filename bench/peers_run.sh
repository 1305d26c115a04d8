#!/usr/bin/env bash
# peers_run.sh: tartan beside xtr-warp-rs (WARP), fast-plaid and voyager-index on the same
# machine, the same files and the same queries (issue 22). For each corpus directory (as
# `tartan gen` writes it): exact MaxSim truth, tartan's exhaustive truth, every engine's index
# build (timed), then every engine's search at its defaults and along its knob on the CPU at
# each thread count of THREADS, and on the GPU (tartan, WARP, fast-plaid) when one is there;
# then one markdown table and one recall-vs-queries/s plot per corpus (bench/peers_plot.py).
#
#   bench/peers_run.sh OUTDIR CORPUS_DIR...
#
# Settings (environment; defaults in brackets):
#   TARTAN        the tartan command [tartan]             PY      python [python3]
#   ENGINES       [tartan warp fastplaid voyager]         THREADS [1 4 16]
#   GPU           1: GPU runs too, 0: none [1 if nvidia-smi sees one]
#   BUILD_DEVICE  where indexes are built: cuda or cpu [cuda with a GPU, else cpu]
#                 (voyager always builds on the CPU: its router trains there)
#   NQ            queries searched in a batch [200]       LAT_NQ  queries timed one a call [50]
#   REPEATS       timed batches (best counts) [2]         MAX_S   seconds a run may start
#                                                               settings for [60]
#   RUN_CAP       seconds after which a search run is stopped, keeping the settings it
#                 finished (0: none) [0]; a setting's first batch may outlast MAX_S
#   PARALLEL      1: the 1-thread runs of the engines side by side on cores 0,1,2,..., and the
#                 4-thread runs on cores 0-3, 4-7, ... (each pinned with taskset); 0: one run
#                 at a time [0]
#   WORK          where indexes go [OUTDIR/work]          KEEP    1: keep indexes [0]
#   DEADLINE      seconds after the start past which no new run starts and every run still
#                 going is stopped (0: none) [0]; each run's MAX_S is cut to the time left,
#                 so the table still gets written
#   VOY_BG        1: voyager's build (single-threaded for the most part: its k-means++ and
#                 router training) runs in the background from the corpus's start, pinned to
#                 the last VOY_CPUS cores [4], and its searches wait for it [0]
# Knob lists: TARTAN_RECALL, TARTAN_PLAID, WARP_NPROBE, WARP_THR, WARP_TPRIME, FP_PROBES, FP_FULL,
# VOY_KCAND, VOY_NFULL (see each driver's --help; the defaults below are short on purpose);
# FP_NBITS [4, fast-plaid's own default; bench/peers_fastplaid.py's is 2, tartan's];
# TARTAN_NBITS [2]: one tartan index a value ("2 4": both, the second labelled tartan-nb4).
# Outputs under OUTDIR: CORPUS/*.jsonl (one file a run), CORPUS/*.log, peers-table.md,
# peers-CORPUS.png, and peers-results.tar.gz of all of it.
set -uo pipefail
[[ $# -ge 2 ]] || { sed -n '2,28p' "$0"; exit 2; }
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
TARTAN=${TARTAN:-tartan}
ENGINES=${ENGINES:-tartan warp fastplaid voyager}
THREADS=${THREADS:-1 4 16}
if [[ -z ${GPU:-} ]]; then
  if nvidia-smi -L >/dev/null 2>&1; then GPU=1; else GPU=0; fi
fi
if [[ $GPU == 1 ]]; then BUILD_DEVICE=${BUILD_DEVICE:-cuda}; else BUILD_DEVICE=${BUILD_DEVICE:-cpu}; fi
NQ=${NQ:-200}
LAT_NQ=${LAT_NQ:-50}
REPEATS=${REPEATS:-2}
MAX_S=${MAX_S:-60}
RUN_CAP=${RUN_CAP:-0}
PARALLEL=${PARALLEL:-0}
DEADLINE=${DEADLINE:-0}
VOY_BG=${VOY_BG:-0}
VOY_CPUS=${VOY_CPUS:-4}
WORK=${WORK:-$out/work}
ncpu=$(nproc)
TARTAN_RECALL=${TARTAN_RECALL:-0.8,0.9,0.99}
TARTAN_NBITS=${TARTAN_NBITS:-2}
TARTAN_PLAID=${TARTAN_PLAID:-1x256,2x1024}
WARP_NPROBE=${WARP_NPROBE:-2,8,32,128}
WARP_THR=${WARP_THR:-0}
WARP_TPRIME=${WARP_TPRIME:-10000,50000}
FP_PROBES=${FP_PROBES:-1,4}
FP_FULL=${FP_FULL:-256,1024}
FP_NBITS=${FP_NBITS:-4}
VOY_KCAND=${VOY_KCAND:-250,1000,8000}
VOY_NFULL=${VOY_NFULL:-}
mkdir -p "$out" "$WORK"
t_all=$(date +%s)

has() { [[ " $ENGINES " == *" $1 "* ]]; }
stamp() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t_all ))s] $*"; }

# run LOG CPUS CMD...: one run, its output in LOG; CPUS (a taskset list, or -) pins it.
run() {
  local log=$1 cpus=$2; shift 2
  local t0; t0=$(date +%s)
  if (( DEADLINE > 0 && t0 - t_all >= DEADLINE )); then
    stamp "$(basename "$log" .log): not started (DEADLINE)"
    return 0
  fi
  # past DEADLINE no run goes on: a run still going then is stopped (rc 124), so that the
  # table is written in time (a long build, voyager's in particular, once held a whole call)
  # RUN_CAP (search runs only: run_cap is set by search()) bounds one run, so that a slow
  # engine's 1-thread run does not hold its side-by-side group until DEADLINE
  local lim=() left=0
  (( DEADLINE > 0 )) && left=$(( DEADLINE - (t0 - t_all) ))
  if (( ${run_cap:-0} > 0 )) && (( left <= 0 || run_cap < left )); then left=$run_cap; fi
  (( left > 0 )) && lim=(timeout -k 5 "$left")
  if [[ $cpus != - ]] && command -v taskset >/dev/null; then
    "${lim[@]}" taskset -c "$cpus" "$@" >"$log" 2>&1
  else
    "${lim[@]}" "$@" >"$log" 2>&1
  fi
  local rc=$?
  stamp "$(basename "$log" .log): rc $rc, $(( $(date +%s) - t0 )) s"
  [[ $rc == 0 ]] || tail -5 "$log"
  return 0
}

# search ENGINE CORPUS DEVICE THREADS CPUS: one search run of one engine.
search() {
  local e=$1 c=$2 dev=$3 t=$4 cpus=$5
  local name; name=$(basename "$c")
  local d=$out/$name w=$WORK/$name tag="$e-$dev-$t"
  local max_s=$MAX_S
  if (( DEADLINE > 0 )); then
    local left=$(( DEADLINE - ($(date +%s) - t_all) ))
    (( left < max_s )) && max_s=$(( left > 1 ? left : 1 ))
  fi
  local run_cap=$RUN_CAP
  local common=(--corpus "$c" --threads "$t" --device "$dev" --nq "$NQ"
                --latency-nq "$LAT_NQ" --repeats "$REPEATS" --max-seconds "$max_s")
  local refs=(--exact "$d/exact.trec" --tartan-exhaustive "$d/tartan-exhaustive.trec")
  case $e in
    tartan)
      local nb
      for nb in $TARTAN_NBITS; do
        run "$d/$tag-nb$nb.log" "$cpus" "$PY" "$here/peers_tartan.py" "${common[@]}" "${refs[@]}" \
          --index-dir "$w/tartan-nb$nb" --nbits "$nb" --recall "$TARTAN_RECALL" \
          --plaid "$TARTAN_PLAID" --out "$d/$tag-nb$nb.jsonl"
      done ;;
    warp)
      run "$d/$tag.log" "$cpus" "$PY" "$here/peers_warp.py" "${common[@]}" "${refs[@]}" \
        --index-dir "$w/warp" --nprobe "$WARP_NPROBE" --t-prime "$WARP_TPRIME" \
        --thresholds "$WARP_THR" \
        --out "$d/$tag.jsonl" ;;
    voyager)
      run "$d/$tag.log" "$cpus" "$PY" "$here/peers_voyager.py" "${common[@]}" "${refs[@]}" \
        --index-dir "$w/voyager" --k-candidates "$VOY_KCAND" --n-full-scores "$VOY_NFULL" \
        --out "$d/$tag.jsonl" ;;
    fastplaid)
      run "$d/$tag.log" "$cpus" "$PY" "$here/peers_fastplaid.py" --corpus "$c" \
        --threads "$([[ $dev == cpu ]] && echo "$t" || echo 0)" --device "$dev" --nq "$NQ" \
        --latency-nq "$LAT_NQ" --repeats "$REPEATS" --max-seconds "$max_s" \
        --reference "$d/tartan-exhaustive.trec" --exact-truth "$d/exact.trec" \
        --index-dir "$w/fastplaid" --reuse-index --nbits "$FP_NBITS" \
        --probes "$FP_PROBES" --full-scores "$FP_FULL" \
        --out "$d/$tag.json" --run "$d/$tag.run" --jsonl "$d/$tag.jsonl" ;;
  esac
}

for c in "$@"; do
  c=$(cd "$c" && pwd)
  name=$(basename "$c")
  d=$out/$name w=$WORK/$name
  mkdir -p "$d" "$w"
  stamp "corpus $name: $(python3 -c "import numpy as n; print(n.load('$c/doclens.npy').shape[0], 'documents')" 2>/dev/null)"
  truth_dev=cpu; [[ $GPU == 1 ]] && truth_dev=cuda
  # ---- references ---------------------------------------------------------------------
  run "$d/exact.log" - "$PY" "$here/peers_common.py" exact --corpus "$c" --nq "$NQ" \
    --device "$truth_dev" --threads "$ncpu" --out "$d/exact.trec"
  # ---- builds (all threads; tartan's first: its exhaustive search is a reference) -------
  rm -rf "$w"/tartan-nb* "$w/warp" "$w/fastplaid" "$w/voyager"
  voy_pid=
  engines_now=$ENGINES
  if has voyager && [[ $VOY_BG == 1 ]]; then
    vcpus="$(( ncpu - VOY_CPUS ))-$(( ncpu - 1 ))"
    run "$d/voyager-build.log" "$vcpus" "$PY" "$here/peers_voyager.py" --corpus "$c" \
      --index-dir "$w/voyager" --build --no-search --device cpu --threads "$VOY_CPUS" \
      --out "$d/voyager-build.jsonl" &
    voy_pid=$!
    engines_now=${ENGINES/voyager/}
  fi
  for nb in $TARTAN_NBITS; do
    run "$d/tartan-build-nb$nb.log" - "$PY" "$here/peers_tartan.py" --corpus "$c" \
      --index-dir "$w/tartan-nb$nb" --nbits "$nb" --build --no-search --tartan-bin "$TARTAN" \
      --device "$BUILD_DEVICE" --threads "$ncpu" --out "$d/tartan-build-nb$nb.jsonl"
  done
  # the reference "vs tartan": the exhaustive search of the first TARTAN_NBITS index
  nb0=${TARTAN_NBITS%% *}
  run "$d/tartan-exhaustive.log" - "$PY" "$here/peers_tartan.py" --corpus "$c" \
    --index-dir "$w/tartan-nb$nb0" --nbits "$nb0" --nq "$NQ" --threads "$ncpu" \
    --device "$truth_dev" --write-exhaustive "$d/tartan-exhaustive.trec"
  has warp && run "$d/warp-build.log" - "$PY" "$here/peers_warp.py" --corpus "$c" \
    --index-dir "$w/warp" --build --no-search --device "$BUILD_DEVICE" --threads "$ncpu" \
    --out "$d/warp-build.jsonl"
  has fastplaid && run "$d/fastplaid-build.log" - "$PY" "$here/peers_fastplaid.py" --corpus "$c" \
    --reference "$d/tartan-exhaustive.trec" --device "$BUILD_DEVICE" --threads "$ncpu" \
    --index-dir "$w/fastplaid" --build-only --nbits "$FP_NBITS" --out "$d/fastplaid-build.json" \
    --jsonl "$d/fastplaid-build.jsonl"
  if has voyager && [[ $VOY_BG != 1 ]]; then
    run "$d/voyager-build.log" - "$PY" "$here/peers_voyager.py" --corpus "$c" \
      --index-dir "$w/voyager" --build --no-search --device cpu --threads "$ncpu" \
      --out "$d/voyager-build.jsonl"
  fi
  # ---- CPU searches -------------------------------------------------------------------
  # cpu_searches ENGINES NCORES [BELOW]: the runs of THREADS on cores 0..NCORES-1; with
  # BELOW, only thread counts under it (beside a background build), with -BELOW the others.
  cpu_searches() {
    local engs=$1 n=$2 below=${3:-0} t lo e
    for t in $THREADS; do
      if (( below > 0 && t >= below )); then continue; fi
      if (( below < 0 && t < -below )); then continue; fi
      if [[ $PARALLEL == 1 ]] && (( t < n )); then
        lo=0
        for e in $engs; do
          if (( lo + t > n )); then wait_runs; lo=0; fi
          search "$e" "$c" cpu "$t" "$lo-$(( lo + t - 1 ))" &
          lo=$(( lo + t ))
        done
        wait_runs
      else
        for e in $engs; do
          if (( n < ncpu )); then search "$e" "$c" cpu "$t" "0-$(( n - 1 ))"
          else search "$e" "$c" cpu "$t" -; fi
        done
      fi
    done
  }
  # waits for the search runs started in the background, not for voyager's build
  wait_runs() { local p; for p in $(jobs -p); do [[ $p == "${voy_pid:-}" ]] || wait "$p"; done; }
  gpu_searches() {
    local e
    [[ $GPU == 1 ]] || return 0
    for e in $1; do
      [[ $e == voyager ]] && continue
      if (( $2 < ncpu )); then search "$e" "$c" cuda 1 "0-$(( $2 - 1 ))"
      else search "$e" "$c" cuda 1 -; fi
    done
  }
  if [[ -n $voy_pid ]]; then
    # beside voyager's build (on the last VOY_CPUS cores): the other engines' runs that fit
    # in the other cores, and their GPU runs; after it: the rest, and voyager's own runs
    n=$(( ncpu - VOY_CPUS ))
    cpu_searches "$engines_now" "$n" "$n"
    gpu_searches "$engines_now" "$n"
    wait "$voy_pid"
    voy_pid=
    cpu_searches "$engines_now" "$ncpu" "-$n"
    cpu_searches voyager "$ncpu"
  else
    cpu_searches "$ENGINES" "$ncpu"
    gpu_searches "$ENGINES" "$ncpu"
  fi
  [[ ${KEEP:-0} == 1 ]] || rm -rf "$w"
done

"$PY" "$here/peers_plot.py" "$out" >"$out/plot.log" 2>&1 || tail -5 "$out/plot.log"
tar -C "$out" -czf "$out.tar.gz.tmp" --exclude=./work --exclude=./peers-results.tar.gz . && mv "$out.tar.gz.tmp" "$out/peers-results.tar.gz"
stamp "done: $out/peers-table.md, $out/peers-*.png, $out/peers-results.tar.gz"
