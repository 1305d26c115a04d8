#!/bin/sh
# build_time.sh: times `tartan build` on the CPU for issue 19's goal (a 20k-document,
# 1.45M-token corpus in <= 150 s on 2 cores, search recall unchanged) and splits the time into
# phases. Run from the build tree on a quiet host; it pins itself to cores 0 and 1
# (`taskset -c 0,1`, CORES=... to change) and runs on the CPU (TARTAN_DEVICE=cpu):
#
#   bench/build_time.sh OUTDIR [LABEL]
#
# It writes the corpus (tartan gen --model 3, 20,000 documents of ~74 tokens: 1,453,008 tokens,
# d 128; kept in OUTDIR/m3-20k for later runs), builds OUTDIR/ix-LABEL with the defaults, and
# prints: the load average before and after, wall and CPU seconds of the build, the tool's
# training / adding / calibration split. Then bench_assign on the corpus itself (K 16,384,
# k-means on a sample of 64 points a centroid, 4 iterations, as the build trains): the seconds
# of k-means, of assigning every token (encoding's first step) and of compression, so that
# adding minus those is the LMDB write. Last, bench_fidelity measures the index's recall
# (exhaustive vs exact MaxSim, default search vs exhaustive) into OUTDIR/fid.jsonl. TARTAN, BENCH_ASSIGN and BENCH_FIDELITY may name other builds' programs (a
# checkout of main, to compare), as in bench/fidelity.sh.
set -eu
out=$1 label=${2:-build}
cores=${CORES:-0,1}
if [ -z "${BUILD_TIME_PINNED:-}" ] && command -v taskset >/dev/null 2>&1; then
    BUILD_TIME_PINNED=1 exec taskset -c "$cores" sh "$0" "$@"
fi
export TARTAN_DEVICE=cpu
mkdir -p "$out"
c="$out/m3-20k"
T=${TARTAN:-./tartan}
[ -f "$c/doclens.npy" ] || "$T" gen "$c" --docs 20000 --doc-len 74 --model 3 --queries 200
echo "host: $(nproc) cores usable ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)); $(uptime)"
rm -rf "$out/ix-$label"
# GNU time where it is installed; else the same line from Python's resource module (hosts
# without the time package, such as the device host)
timed() {
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -f "build: %e s wall, %U s user, %S s sys, %M KB peak" "$@"
    else
        python3 -c 'import resource, subprocess, sys, time
t = time.monotonic(); rc = subprocess.call(sys.argv[1:]); w = time.monotonic() - t
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print("build: %.2f s wall, %.2f s user, %.2f s sys, %d KB peak" % (w, r.ru_utime, r.ru_stime, r.ru_maxrss), file=sys.stderr)
sys.exit(rc)' "$@"
    fi
}
timed "$T" build "$out/ix-$label" \
    --embeddings "$c/embeddings.npy" --doclens "$c/doclens.npy" --ids "$c/ids.txt"
echo "after the build: $(uptime)"
BA=${BENCH_ASSIGN:-bench/bench_assign}
if [ -x "$BA" ]; then
    "$BA" --device cpu --embeddings "$c/embeddings.npy" --tokens 1453008 --centroids 16384 \
        --per-centroid 64 --iters 4 --check 1000 --json "$out/assign.json" 2>&1 | tail -9
fi
"${BENCH_FIDELITY:-bench/bench_fidelity}" "$out/ix-$label" "$c" --truth "$c/exact10.trec" \
    --label "$label-m3-20k" --json "$out/fid.jsonl"
