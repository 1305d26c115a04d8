#!/bin/bash
# the codec simulation rows of s45 (Zen3VM, 2 threads, 2026-11-29): corpora by tartan gen, indexes by
# tartan build (scalar code), dumps by bench/index_dump
set -eu
S=${1:-/tmp/s45}
./tartan gen $S/m3/c --docs 5000 --queries 200 --model 3 --seed 42
./tartan build $S/m3/ix --embeddings $S/m3/c/embeddings.npy --doclens $S/m3/c/doclens.npy --ids $S/m3/c/ids.txt
bench/index_dump $S/m3/ix $S/m3/dump
python3 bench/codec_explore.py $S/m3/c $S/m3/dump --no-pq --axes
# model 1: the same with --model 1 (the s44 corpus m1-5k, seed 42)
