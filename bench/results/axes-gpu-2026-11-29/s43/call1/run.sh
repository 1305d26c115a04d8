#!/bin/bash
# session 43 call 1: main 0568139 + the residual aggregate bound: the seed that failed, then the
# whole check_kernels_gpu with a 520 s limit
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/out1; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/out1.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
TARTAN_TEST_SEED=4021885315793 CK_RUN_CASE=residual timeout 60 $B/check_kernels_gpu > $O/seed.txt 2>&1
echo "seed replay rc $?: $(tail -1 $O/seed.txt)"; grep "dim 96 nbits 8" $O/seed.txt | head -4
timeout 520 $B/check_kernels_gpu > $O/check_kernels_gpu.txt 2>&1
echo "check_kernels_gpu rc $? $(( $(date +%s)-T0 )) s: $(tail -1 $O/check_kernels_gpu.txt)"
grep -i "fail\|error:" $O/check_kernels_gpu.txt | grep -v "relative error" | head -10
grep -c "relative error" $O/check_kernels_gpu.txt
echo "elapsed $(( $(date +%s)-T0 )) s"
