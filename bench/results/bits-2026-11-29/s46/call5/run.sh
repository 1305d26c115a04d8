#!/bin/bash
# session 46 call 5: the staged change (pair loops shared by the kernels): GPU tests again,
# kernel benchmarks (codes10k, 384), GPU search tests
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o5; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o5.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT
for c in residual_axes_bits residual_axes residual_axes_batched residual_axes_bad_arguments residual_mma_dims residual residual_batched; do
  CK_RUN_CASE=$c timeout 200 $B/check_kernels_gpu > $O/ckg-$c.txt 2>&1
  echo "check_kernels_gpu $c rc $? $(el): $(tail -1 $O/ckg-$c.txt)"
done
TARTAN_GPU_AXES_SPLIT=1 CK_RUN_CASE=residual_axes timeout 200 $B/check_kernels_gpu > $O/ckg-split1.txt 2>&1; echo "residual_axes split forced rc $? $(el): $(tail -1 $O/ckg-split1.txt)"
timeout 150 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(el): $(tail -1 $O/check_search_gpu.txt)"
timeout 200 $B/check_index_gpu > $O/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $? $(el): $(tail -1 $O/check_index_gpu.txt)"
timeout 150 $B/bench_kernels_gpu --only codes10k > $O/bench_codes10k.txt 2>&1; echo "bench codes10k rc $? $(el)"; grep "us (" $O/bench_codes10k.txt | grep -v fp32 | cut -c1-60
timeout 150 $B/bench_kernels_gpu --only 384_ > $O/bench_384.txt 2>&1; echo "bench 384 rc $? $(el)"; grep "us (" $O/bench_384.txt | cut -c1-60
echo "elapsed $(el)"
