#!/bin/bash
# session 47 call 6 (nvidia-h200-x2): the GPU test programs at main
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o6; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o6.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; date -u; cat $D/COMMIT
for t in check_gpus_gpu check_search_gpu check_index_gpu; do
  timeout 120 $B/$t > $O/$t.txt 2>&1; echo "$t rc $? $(( $(date +%s)-T0 )) s: $(tail -n 1 $O/$t.txt)"
done
for cs in residual residual_batched residual_mma_dims residual_axes_bits; do
  [ $(( $(date +%s)-T0 )) -gt 170 ] && break
  CK_RUN_CASE=$cs timeout 60 $B/check_kernels_gpu > $O/ckg-$cs.txt 2>&1; echo "ckg $cs rc $? $(( $(date +%s)-T0 )) s: $(tail -n 1 $O/ckg-$cs.txt)"
done
true
