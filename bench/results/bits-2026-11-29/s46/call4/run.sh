#!/bin/bash
# session 46 call 4: bit-plane kernels at dims without table kernels (additive fit there):
# GPU tests, bits384 / 2bit384 kernels, codes10k_bitsm3 auto (tables) and forced bits, dim 384
# end to end (model 3 at SciFact's shape, as s43/call2): scalar, axes (bit-plane), axes on the fp32 kernel, auto
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o4; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o4.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT
for c in residual_axes_bits residual_axes residual_axes_batched residual_axes_bad_arguments residual_mma_dims; do
  CK_RUN_CASE=$c timeout 200 $B/check_kernels_gpu > $O/ckg-$c.txt 2>&1
  echo "check_kernels_gpu $c rc $? $(el): $(tail -1 $O/ckg-$c.txt)"
done
timeout 150 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(el): $(tail -1 $O/check_search_gpu.txt)"
timeout 200 $B/check_index_gpu > $O/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $? $(el): $(tail -1 $O/check_index_gpu.txt)"
timeout 150 $B/bench_kernels_gpu --only 384_ > $O/bench_384.txt 2>&1; echo "bench 384 rc $? $(el)"; grep "us (" $O/bench_384.txt | cut -c1-60
timeout 60 $B/bench_kernels_gpu --only codes10k_bitsm3 > $O/b-bits-auto.txt 2>&1; echo "bitsm3 auto"; grep "us (" $O/b-bits-auto.txt | cut -c1-60
TARTAN_GPU_AXES_BITS=1 timeout 60 $B/bench_kernels_gpu --only codes10k_bitsm3 > $O/b-bits-1.txt 2>&1; echo "bitsm3 BITS=1"; grep "us (" $O/b-bits-1.txt | cut -c1-60
C=/tmp/s/d384
$B/tartan gen $C --docs 5183 --dim 384 --doc-len 228 --queries 300 --model 3 --seed 11 > $O/gen-d384.txt 2>&1; echo "gen d384 rc $? $(el)"
for cd in scalar axes auto; do
  ix=/tmp/s/ix-$cd; TARTAN_TRACE=1 $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd.txt 2>&1
  echo "build $cd rc $? $(el)"; grep -E "codec auto|s wall|^build" $O/build-$cd.txt | head -3; $B/tartan info $ix | grep "residual code"
done
for v in scalar axes-bits axes-fp32 auto; do
  ix=/tmp/s/ix-${v%%-*}; e="X=1"
  case $v in axes-fp32*) e="TARTAN_GPU_AXES_BITS=0";; esac
  env $e timeout 150 $B/bench_search_gpu $ix --queries $C/queries.npy --json $O/bsg-$v.json --targets "" --ncells 2 --ndocs 1024 --reps 3 > $O/bsg-$v.txt 2>&1
  echo "bsg $v ($e) rc $? $(el)"; sed -n 4,9p $O/bsg-$v.txt
done
for cd in scalar axes; do
  timeout 200 $B/bench_fidelity /tmp/s/ix-$cd $C --truth $C/exact10.trec --label $cd-d384 --json $O/fid.jsonl > $O/fid-$cd.txt 2>&1
  echo "fidelity $cd rc $? $(el)"; tail -2 $O/fid-$cd.txt
done
echo "elapsed $(el)"
