#!/bin/sh
# The additive tables against Lloyd-Max's, exhaustive recall@10 against exact MaxSim, on the
# Zen3VM (2 cores), 2026-11-29, from the build tree of the session's working tree (before the
# rule "additive only at dims without the GPU's table kernels" and the 10% slack: at the time
# the fit kept additive tables where they cost at most 1% more error, and AXSLACK=1 forced them;
# with the final code, dim 384 takes them by itself and dim 128 never does).
# Corpora: `tartan gen DIR --docs 5000 --model 1|2 --seed 42` (m1-5k, m2-5k),
# `--docs 20000 --model 3` (m3-20k), `--docs 1500 --dim 384 --doc-len 228 --model 3` (d384).
set -eu
for m in m1-5k m2-5k; do
  TARTAN_AXES_ADDITIVE=0 bench/fidelity.sh OUT lloyd C/$m -- --codec axes
  bench/fidelity.sh OUT add C/$m -- --codec axes
done
for m in m3-20k d384; do
  TARTAN_AXES_ADDITIVE=0 bench/fidelity.sh OUT lloyd C/$m -- --codec axes
  AXSLACK=1 bench/fidelity.sh OUT add C/$m -- --codec axes
done
