#!/bin/bash
# session 45 call 4: where a default GPU search's exact rounds spend their time: ncu kernel
# durations of single-query searches (model 3, 100k docs, scalar and axes)
set -u
T0=$(date +%s)
D=$PWD/.device; export LD_LIBRARY_PATH=$D/lib; B=$D/bin
O=/tmp/o4; mkdir -p $O /tmp/s
exec > >(tee $O/log.txt) 2>&1
finish() { sleep 1; tar -C $O -cJf $OUT/o4.tar.xz . ; }
trap finish EXIT
el() { echo "$(( $(date +%s)-T0 )) s"; }
nvidia-smi -L; date -u; cat $D/COMMIT; which ncu
mo=3; C=/tmp/s/m$mo
$B/tartan gen $C --docs 100000 --queries 200 --model $mo --seed 11 > $O/gen.txt 2>&1; echo "gen rc $? $(el)"
python3 -c "
import numpy as np; q=np.load('$C/queries.npy'); print(q.shape, q.dtype); np.save('/tmp/s/q8.npy', q[:8])"
for cd in scalar axes; do
  ix=/tmp/s/ix-$cd; $B/tartan build $ix --embeddings $C/embeddings.npy --doclens $C/doclens.npy --ids $C/ids.txt --device cuda --codec $cd > $O/build-$cd.txt 2>&1
  echo "build $cd rc $? $(el)"
  TARTAN_GPU_TRACE=2 $B/tartan search $ix --queries /tmp/s/q8.npy --device cuda --batch 1 -o /dev/null --quiet 2> $O/trace-$cd.txt; echo "trace rc $?"; cat $O/trace-$cd.txt | tail -12
  timeout 200 ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-count 600 $B/tartan search $ix --queries /tmp/s/q8.npy --device cuda --batch 1 -o /dev/null --quiet > $O/ncu-$cd.csv 2> $O/ncu-$cd.err
  echo "ncu $cd rc $? $(el): $(wc -l < $O/ncu-$cd.csv) lines"; tail -3 $O/ncu-$cd.err
  python3 - $O/ncu-$cd.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index('Kernel Name'); vi = hdr.index('Metric Value'); ui = hdr.index('Metric Unit')
tot = collections.defaultdict(float); cnt = collections.Counter(); order = []
for r in rows[1:]:
    try: v = float(r[vi].replace(',', ''))
    except ValueError: continue
    if r[ui] == 'usecond': v *= 1e3
    elif r[ui] == 'msecond': v *= 1e6
    n = r[ki].split('(')[0][:70]; tot[n] += v; cnt[n] += 1
for n, v in sorted(tot.items(), key=lambda x: -x[1])[:25]:
    print(f"{v/1e3:10.1f} us {cnt[n]:5d} calls {v/1e3/cnt[n]:8.2f} us each  {n}")
print("launches", sum(cnt.values()), "total us", sum(tot.values())/1e3)
PY
done
echo "elapsed $(el)"
