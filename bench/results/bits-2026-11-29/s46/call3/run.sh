#!/bin/bash
# session 46 call 3: the bit-plane kernels (tables additive in the bits): GPU tests, codes10k,
# 100k default search on model 3 with bits / tables / scalar
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o3; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o3.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT
for c in residual_axes_bits residual_axes_batched; do
  CK_RUN_CASE=$c timeout 200 $B/check_kernels_gpu > $O/ckg-$c.txt 2>&1
  echo "check_kernels_gpu $c rc $? $(el): $(tail -1 $O/ckg-$c.txt)"
done
grep -E "relative error" $O/ckg-residual_axes_bits.txt | awk '{print $(NF-3), $(NF-1)}' | sort -g | tail -3
#
timeout 120 $B/bench_kernels_gpu --only codes10k_ > $O/bench_codes10k.txt 2>&1; echo "bench codes10k rc $? $(el)"; grep "us (" $O/bench_codes10k.txt | grep -v fp32 | cut -c1-60
TARTAN_GPU_AXES_SPLIT=1 timeout 60 $B/bench_kernels_gpu --only codes10k_bitsm3_1q > $O/b-bits-split1.txt 2>&1; echo "bits split forced: $(grep 'us (' $O/b-bits-split1.txt | cut -c1-60)"
for mo in NONE; do
  C=/tmp/s/m$mo
  $B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1; echo "gen m$mo rc $? $(el)"
  for cd in scalar axes; do
    ix=/tmp/s/ix-$cd-m$mo; $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd-m$mo.txt 2>&1
    echo "build $cd m$mo rc $? $(el)"; tail -2 $O/build-$cd-m$mo.txt
  done
  for v in scalar axes-bits axes-tables; do
    ix=/tmp/s/ix-${v%%-*}-m$mo; e="X=1"
    case $v in axes-tables*) e="TARTAN_GPU_AXES_BITS=0";; esac
    env $e $B/bench_search_gpu $ix --queries $C/queries.npy --json $O/bsg-$v-m$mo.json --targets "" --ncells 2 --ndocs 1024 --reps 3 > $O/bsg-$v-m$mo.txt 2>&1
    echo "bsg $v m$mo ($e) rc $? $(el)"; sed -n 4,9p $O/bsg-$v-m$mo.txt
  done
done
echo "elapsed $(el)"
for w in 1 0; do TARTAN_GPU_AXES_BITS=$w timeout 60 $B/bench_kernels_gpu --only codes10k_bitsm3 > $O/b-bits$w.txt 2>&1; echo "BITS=$w"; grep "us (" $O/b-bits$w.txt | cut -c1-60; done
