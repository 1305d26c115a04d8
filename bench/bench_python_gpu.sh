#!/bin/sh
# The Python package on a GPU host, in one command: its pytest suite (the device='cuda'
# branches run there) and bench_python.py's batched search against C on a 100,000-document
# index built on the GPU, where a query costs about 0.1 ms and the binding's share of a call
# matters most. Run from a tree built with CUDA (./configure --enable-cuda=yes && make):
#
#   sh bench/bench_python_gpu.sh OUTDIR [DOCS]
#
# Writes OUTDIR/pytest.txt, OUTDIR/python-search-gpu.txt and .json. Needs python3 with NumPy,
# pytest and setuptools; no network (the extension is built in place, not through pip).
set -e
out=${1:?usage: sh bench/bench_python_gpu.sh OUTDIR [DOCS]}
docs=${2:-100000}
top=$(pwd)
mkdir -p "$out"
(cd python && python3 setup.py -q build_ext --inplace)
export PYTHONPATH="$top/python/src"
TARTAN_BIN="$top/tartan" python3 -m pytest -q -p no:cacheprovider python/tests \
    >"$out/pytest.txt" 2>&1 || echo "pytest failed: see $out/pytest.txt"
tail -n 1 "$out/pytest.txt"
./tartan gen "$out/g" --docs "$docs" --queries 1024 --model 2
./tartan build "$out/g/ix" --embeddings "$out/g/embeddings.npy" --doclens "$out/g/doclens.npy" \
    --ids "$out/g/ids.txt" --device cuda
python3 bench/bench_python.py search --index "$out/g/ix" --queries "$out/g/queries.npy" -k 10 \
    --threads 0 --rounds 3 --reps 10 --json "$out/python-search-gpu.json" |
    tee "$out/python-search-gpu.txt"
