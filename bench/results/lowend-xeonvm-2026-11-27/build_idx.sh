#!/bin/bash
export LD_LIBRARY_PATH=/tmp/low/base OMP_NUM_THREADS=2
for c in g10k-m2 g10k-m1 scifact1k; do
  d=/work/peers-data/$c
  /usr/bin/time -f "$c %e s" /tmp/low/base/tartan build /tmp/low/idx-$c --embeddings $d/embeddings.npy --doclens $d/doclens.npy --ids $d/ids.txt --device cpu --nbits 2 
done
