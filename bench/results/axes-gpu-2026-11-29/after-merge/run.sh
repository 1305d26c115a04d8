#!/bin/bash
# session 42 call B: main after the merge of the kernel work: the GPU tests in full; 100k docs of
# models 3 and 1: GPU builds scalar / axes / auto (traced), bench_search_gpu defaults + one fixed
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/outB; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/outB.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u; echo "commit $(cat $D/COMMIT 2>/dev/null)"
timeout 200 $B/check_search_gpu > $O/check_search_gpu.txt 2>&1; echo "check_search_gpu rc $? $(( $(date +%s)-T0 )) s: $(tail -1 $O/check_search_gpu.txt)"
timeout 120 $B/check_index_gpu > $O/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $? $(( $(date +%s)-T0 )) s: $(tail -1 $O/check_index_gpu.txt)"
timeout 300 $B/check_kernels_gpu > $O/check_kernels_gpu.txt 2>&1; echo "check_kernels_gpu rc $? $(( $(date +%s)-T0 )) s: $(tail -1 $O/check_kernels_gpu.txt)"
grep -i "fail\|error" $O/check_kernels_gpu.txt | head -5
timeout 60 $B/bench_kernels_gpu --only codes10k > $O/bench_codes10k.txt 2>&1; echo "bench codes10k rc $?"; grep -i "axes\|scalar\|codes" $O/bench_codes10k.txt | head -20
for mo in 3 1; do
  C=/tmp/s/m$mo; t0=$(date +%s)
  $B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen-m$mo.txt 2>&1
  echo "gen m$mo rc $? $(( $(date +%s)-t0 )) s"
  for cd in scalar axes auto; do
    [ $(( $(date +%s)-T0 )) -gt 500 ] && { echo "out of time"; exit 0; }
    L=$cd-m$mo; ix=/tmp/s/ix-$L; rm -rf $ix; t0=$(date +%s)
    TARTAN_KMEANS_TRACE=1 $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$L.txt 2>&1
    echo "build $L rc $? $(( $(date +%s)-t0 )) s: $(grep -h 'codec auto\|axes code' $O/build-$L.txt | tr '\n' ' ')"
    grep -i "adding\|calibrat\|compress\|built" $O/build-$L.txt | tail -4
    [ $cd = auto ] && continue
    $B/bench_search_gpu $ix --queries $C/queries.npy --json $O/bsg-$L.json --targets "" --ncells 2 --ndocs 1024 --reps 3 > $O/bsg-$L.txt 2>&1
    echo "bsg $L rc $? $(( $(date +%s)-T0 )) s"; sed -n 4,9p $O/bsg-$L.txt
    rm -rf $ix
  done
done
echo "elapsed $(( $(date +%s)-T0 )) s"
