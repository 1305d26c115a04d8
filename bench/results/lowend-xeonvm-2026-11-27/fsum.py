import json,glob,collections
rows=collections.defaultdict(dict)
for f in sorted(glob.glob(__import__('os').environ.get('G','/tmp/low/final/*.jsonl'))):
    name=f.split('/')[-1][:-6]; c,b,r=name.rsplit('-',2)
    for l in open(f):
        x=json.loads(l)
        if x.get('kind')!='search': continue
        rows[(c,b)].setdefault(x['setting'],[]).append(x)
def best(xs,key): return max(xs,key=lambda x:x[key] or 0)
print('| corpus | engine | setting | recall@10 exact | q/s per core (1 thread) | q/CPU-s | p50 ms | load |')
print('|---|---|---|---|---|---|---|---|')
for (c,b),d in sorted(rows.items()):
    for s,xs in d.items():
        x=best(xs,'batch_qps')
        print('| %s | %s | %s | %.3f | %.1f | %.1f | %.2f | %.1f |'%(c,b,s,x['recall_exact'] or 0,x['batch_qps'],x['qps_per_cpu_s'] or 0,x.get('latency_p50_ms') or 0,x['machine']['load'][0]))
print()
for key in ['batch_qps','qps_per_cpu_s']:
  print('equal recall,', key)
  for c in ['g10k-m2','g10k-m1','scifact1k']:
    for lvl in [0.5,0.6,0.7,0.8]:
        out=[]
        for b in ['new4','base','warp']:
            d=rows.get((c,b),{})
            cands=[(best(xs,key)[key] or 0, s) for s,xs in d.items() if best(xs,key)['recall_exact'] and best(xs,key)['recall_exact']>=lvl]
            out.append(max(cands) if cands else (0,'-'))
        n,bb,w=out
        print('  %s >=%.1f: new %.1f (%s) base %.1f (%s) warp %.1f (%s) new/warp %.2fx base/warp %.2fx'%(c,lvl,n[0],n[1],bb[0],bb[1],w[0],w[1],n[0]/w[0] if w[0] else 0,bb[0]/w[0] if w[0] else 0))
