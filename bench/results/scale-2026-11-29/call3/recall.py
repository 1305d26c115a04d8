#!/usr/bin/env python3
"""recall.py RUN TRUTH: mean over TRUTH's queries of |top 10 of RUN and of TRUTH| / 10.

Both are TREC runs (qid Q0 docid rank score tag). Call 3 wrote exh-LABEL.trec and
def-LABEL.trec (runs.tar.xz); call 4 the corpora's exact top 10 (exact10.tar.xz). From this
folder:
    tar -xJf runs.tar.xz && tar -xJf ../call4/exact10.tar.xz
    python3 recall.py exh-axes-k65536-m2.trec exact10-m2.trec      # exh/exact
    python3 recall.py def-axes-k65536-m2.trec exh-axes-k65536-m2.trec   # def/exh
"""
import collections
import sys


def top(path):
    d = collections.defaultdict(list)
    for line in open(path):
        f = line.split()
        if len(f) >= 5:
            d[f[0]].append((int(f[3]), f[2]))
    return {q: {x for _, x in sorted(v)[:10]} for q, v in d.items()}


run, truth = top(sys.argv[1]), top(sys.argv[2])
print(f"{sum(len(run.get(q, set()) & truth[q]) / 10 for q in truth) / len(truth):.4f}")
