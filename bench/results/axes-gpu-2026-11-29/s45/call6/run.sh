#!/bin/bash
# session 45 call 6: rows_max_sum shared by the MMA kernels (frag_cuda.cuh): the kernel tests
# that run them, the GPU search tests, codes10k
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o6; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o6.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT
for c in dense dense_wgmma long_documents varlen stream_warp residual residual_variants residual_big_dims residual_batched residual_axes residual_axes_batched residual_axes_bad_arguments residual_mma_dims i8 adaptive_stages; do
  [ $(( $(date +%s)-T0 )) -gt 480 ] && { echo "out of time before $c"; break; }
  CK_DEFAULT_TIMEOUT=200 CK_RUN_CASE=$c timeout 200 $B/check_kernels_gpu > $O/ckg-$c.txt 2>&1
  echo "check_kernels_gpu $c rc $? $(el): $(tail -1 $O/ckg-$c.txt)"
done
timeout 120 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(el): $(tail -1 $O/check_search_gpu.txt)"
timeout 90 $B/bench_kernels_gpu --only codes10k > $O/bench_codes10k.txt 2>&1; echo "bench codes10k rc $? $(el)"; grep "us (" $O/bench_codes10k.txt | grep -v fp32 | cut -c1-60
echo "elapsed $(el)"
