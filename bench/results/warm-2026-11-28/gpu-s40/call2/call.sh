#!/bin/bash
# session 40: check_index_gpu with the k-means test on the same schedule on both devices
export LD_LIBRARY_PATH=$PWD/.device/lib
B=.device/bin
$B/check_index_gpu > $OUT/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $?" | tee -a $OUT/check_index_gpu.txt
tail -3 $OUT/check_index_gpu.txt
