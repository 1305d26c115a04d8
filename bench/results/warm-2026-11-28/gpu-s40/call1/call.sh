#!/bin/bash
# session 40: the GPU k-means path after the warm start's rework (warm off on the GPU by default)
export LD_LIBRARY_PATH=$PWD/.device/lib
B=.device/bin
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
$B/check_index_gpu > $OUT/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $?" | tee -a $OUT/check_index_gpu.txt
$B/check_train_shared > $OUT/check_train_shared.txt 2>&1; echo "check_train_shared rc $?" | tee -a $OUT/check_train_shared.txt
tail -3 $OUT/check_index_gpu.txt
W=/tmp/w40; mkdir -p $W
$B/tartan gen $W/c --docs 200000 --queries 200 --model 2 > $OUT/gen.txt 2>&1
for w in default 2/4; do
  rm -rf $W/ix
  if [ $w = default ]; then unset TARTAN_KMEANS_WARM; else export TARTAN_KMEANS_WARM=$w; fi
  TARTAN_KMEANS_TRACE=1 /usr/bin/time -f "%e s wall" $B/tartan build $W/ix --embeddings $W/c/embeddings.npy --doclens $W/c/doclens.npy --ids $W/c/ids.txt > $OUT/build-$(echo $w | tr / _).txt 2>&1
  grep -E 'k-means,|built|wall' $OUT/build-$(echo $w | tr / _).txt
done
