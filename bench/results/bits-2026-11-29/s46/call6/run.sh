#!/bin/bash
# session 46 call 6 (nvidia-h200-x2): the multi-GPU tests and the GPU search tests at main
# (GPU code as af4afa0), on two H200s
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o6; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o6.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT
timeout 300 $B/check_gpus_gpu > $O/check_gpus_gpu.txt 2>&1; echo "check_gpus_gpu rc $? $(el): $(tail -1 $O/check_gpus_gpu.txt)"
grep -E "^[0-9]+%|:[FE]:" $O/check_gpus_gpu.txt | head
timeout 150 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(el): $(tail -1 $O/check_search_gpu.txt)"
echo "elapsed $(el)"
