#!/bin/bash
# session 47 call 5: the A-fragment pack kernels through one helper (pack_afrag): the axes
# code's kernel cases against the double-precision reference
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o5; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o5.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; date -u; cat $D/COMMIT
for cs in residual_axes_bits residual_axes residual_axes_batched; do
  CK_RUN_CASE=$cs timeout 110 $B/check_kernels_gpu > $O/ckg-$cs.txt 2>&1; echo "ckg $cs rc $? $(( $(date +%s)-T0 )) s"; tail -2 $O/ckg-$cs.txt
  [ $(( $(date +%s)-T0 )) -gt 250 ] && break
done
