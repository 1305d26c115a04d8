#!/bin/bash
# session 43 call 3: main as committed before CI: every GPU test in full
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/out3; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/out3.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; nproc; date -u
CK_RUN_CASE=residual_mma_dims timeout 60 $B/check_kernels_gpu > $O/ckg-mma-dims.txt 2>&1; echo "residual_mma_dims rc $? $(el): $(tail -1 $O/ckg-mma-dims.txt)"; grep -i "fail\|Assert" $O/ckg-mma-dims.txt | head -3
timeout 120 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(el): $(tail -1 $O/check_search_gpu.txt)"
timeout 90 $B/check_index_gpu > $O/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $? $(el): $(tail -1 $O/check_index_gpu.txt)"
timeout 420 $B/check_kernels_gpu > $O/check_kernels_gpu.txt 2>&1; echo "check_kernels_gpu rc $? $(el): $(tail -1 $O/check_kernels_gpu.txt)"
grep -i "fail\|Assert" $O/check_kernels_gpu.txt | head -5
echo "elapsed $(el)"
