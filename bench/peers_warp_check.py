#!/usr/bin/env python3
"""Where xtr-warp-rs (WARP) loses recall against exact MaxSim (issue 22).

    python3 bench/peers_warp_check.py --corpus DIR --index-dir WARP_INDEX --exact exact.trec
        [--nq 100] [--k 10] [--nprobe 2,8,32,128] [--threads 2] [--out check.json]

The index must have been built by bench/peers_warp.py --build from the same corpus. For
each setting (WARP's defaults, then each nprobe of --nprobe at threshold 0, then every
centroid probed) this measures, over the queries:

- recall@k of WARP's top k against exact MaxSim (the driver's figure);
- the id mapping: WARP's score of each returned passage against exact MaxSim of the
  document at that position (and at the positions one before and one after): with the
  right mapping the two agree up to the codec and the imputation; with a shifted mapping
  they do not correlate;
- the scoring: recall@k after rescoring WARP's own best --rescore-k (by its own scores)
  with exact MaxSim: if that recovers the recall, the candidates were there
  and WARP's scores (partial sums plus imputed similarities) ranked them wrongly; if not, the
  candidate generation missed the documents;
- with every centroid probed (nprobe = bound = the number of centroids), every document
  token is scored for every query token, so no similarity is imputed: the recall left is the
  4-bit codec's (and WARP's missing renormalisation of the decoded vectors).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_common as pc  # noqa: E402
import peers_warp as pw  # noqa: E402


def exact_scores(c, qi, docs):
    """Exact MaxSim (fp32) of query qi against the documents numbered docs."""
    q = c.queries[qi]
    return np.array([float((c.doc_f32(d) @ q.T).max(0).sum()) if 0 <= d < c.n_docs
                     else np.nan for d in docs])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--index-dir", required=True)
    ap.add_argument("--exact", required=True)
    ap.add_argument("--nq", type=int, default=100)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--nprobe", default="2,8,32,128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rescore-k", type=int, default=1000,
                    help="WARP returns this many (its best by its own score) for the rescoring")
    ap.add_argument("--no-full", action="store_true", help="skip the every-centroid setting")
    ap.add_argument("--out", default=None, help="JSON summary written here")
    a = ap.parse_args()
    pc.set_thread_env(a.threads)
    import torch

    xtr_warp = pw.import_warp()
    torch.set_num_threads(a.threads)
    c = pc.Corpus(a.corpus, a.nq)
    exact = pc.read_trec(a.exact, a.k)
    pos = {d: i for i, d in enumerate(c.ids)}
    xw = xtr_warp.XTRWarp(index=a.index_dir)
    xw.load(device="cpu", dtype=torch.float32, mmap=True)
    meta = json.load(open(os.path.join(a.index_dir, "metadata.json")))
    nparts = int(meta["num_partitions"])
    Q = torch.from_numpy(c.padded_queries())
    bound_d, nprobe_d, thr_d, maxc_d, tprime_d = xw.optimize_hyperparams(a.k, Q)
    settings = [("default", {})]
    settings += [(f"thr0-nprobe{p}", {"nprobe": p, "bound": max(bound_d, 8 * p),
                                      "centroid_score_threshold": 0.0})
                 for p in pc.int_list(a.nprobe)]
    if not a.no_full:
        settings.append(("all-centroids", {"nprobe": nparts, "bound": nparts,
                                           "centroid_score_threshold": -1.0,
                                           "t_prime": int(meta["num_embeddings"])}))
    # exact MaxSim of every document for every query: the corpus is small (a check)
    t0 = time.perf_counter()
    with torch.inference_mode():
        s_all, i_all = pc.exact_topk(torch, c, c.queries, c.n_docs, "cpu", a.threads)
    full = np.full((len(c.queries), c.n_docs), np.nan, dtype=np.float64)
    for qi in range(len(c.queries)):
        full[qi, i_all[qi]] = s_all[qi]
    pc.log(f"exact MaxSim of all {c.n_docs} documents: {time.perf_counter() - t0:.1f} s")
    # WARP drops a query token whose best centroid scores under its threshold (0.5 by default)
    cents = np.load(os.path.join(a.index_dir, "centroids.npy")).astype(np.float32)
    best = np.concatenate([(q @ cents.T).max(1) for q in c.queries])
    below = {f"{t:g}": float(np.mean(best < t)) for t in (0.3, 0.4, 0.45, 0.5)}
    pc.log(f"query tokens whose best centroid scores under t: {below}; median best "
           f"{float(np.median(best)):.3f}")
    out = {"corpus": c.describe(), "num_partitions": nparts,
           "query_tokens_best_centroid_below": below,
           "query_token_best_centroid_median": float(np.median(best)),
           "defaults": {"bound": bound_d, "nprobe": nprobe_d, "threshold": thr_d,
                        "max_candidates": maxc_d, "t_prime": tprime_d}, "settings": []}
    dflt = {"bound": bound_d, "nprobe": nprobe_d, "centroid_score_threshold": thr_d,
            "max_candidates": maxc_d, "t_prime": tprime_d}
    for name, kw in settings:
        # every parameter given, from the defaults at top_k = k, so that the long list for the
        # rescoring differs from the top k search in its length only
        kw = {**dflt, **kw}
        t0 = time.perf_counter()
        res10 = xw.search(Q, top_k=a.k, num_threads=a.threads, show_progress=False, **kw)
        dt = time.perf_counter() - t0
        res = xw.search(Q, top_k=max(a.k, a.rescore_k), num_threads=a.threads,
                        show_progress=False, **kw)
        rec_top, rec_top_long, rec_rescored, n_ret = [], [], [], []
        d_same, d_prev, d_next, under = [], [], [], []
        for qi, row in enumerate(res):
            ref = set(exact.get(c.qids[qi], []))
            pids = [p for p, _ in row]
            n_ret.append(len(pids))
            rec_top_long.append(len(ref & {c.ids[p] for p in pids[: a.k]}) / max(1, len(ref)))
            ex = full[qi, pids]
            order = np.argsort(-ex, kind="stable")[: a.k]
            rec_rescored.append(len(ref & {c.ids[pids[j]] for j in order}) / max(1, len(ref)))
        for qi, row in enumerate(res10):
            ref = set(exact.get(c.qids[qi], []))
            pids = [p for p, _ in row]
            ws = np.array([s for _, s in row], dtype=np.float64)
            rec_top.append(len(ref & {c.ids[p] for p in pids[: a.k]}) / max(1, len(ref)))
            kk = min(a.k, len(pids))
            pk = np.array(pids[:kk])
            d_same += list(ws[:kk] - full[qi, pk])
            d_prev += list(ws[:kk] - full[qi, np.clip(pk - 1, 0, c.n_docs - 1)])
            d_next += list(ws[:kk] - full[qi, np.clip(pk + 1, 0, c.n_docs - 1)])
            under += list(ws[:kk] < full[qi, pk])
        # exact top k's documents: what share WARP returned at all (in its whole list)
        found = []
        for qi, row in enumerate(res):
            ref = exact.get(c.qids[qi], [])
            got = {p for p, _ in row}
            found.append(sum(1 for d in ref if pos[d] in got) / max(1, len(ref)))

        def stats(v):
            v = np.asarray(v)
            return {"mean": float(np.mean(v)), "mean_abs": float(np.mean(np.abs(v))),
                    "p95_abs": float(np.percentile(np.abs(v), 95))}

        ws_all = np.concatenate([[s for _, s in row[: a.k]] for row in res10])
        ex_all = np.concatenate([full[qi, [p for p, _ in row[: a.k]]]
                                 for qi, row in enumerate(res10)])
        r = {"setting": name, "params": kw, "seconds": dt,
             "returned_mean": float(np.mean(n_ret)),
             "recall_top": float(np.mean(rec_top)),
             "recall_top_of_long_list": float(np.mean(rec_top_long)),
             "recall_rescored_returned": float(np.mean(rec_rescored)),
             "exact_topk_in_returned": float(np.mean(found)),
             "score_minus_exact": stats(d_same),
             "score_minus_exact_prev_doc": stats(d_prev),
             "score_minus_exact_next_doc": stats(d_next),
             "corr_score_exact": float(np.corrcoef(ws_all, ex_all)[0, 1]),
             "share_score_below_exact": float(np.mean(under))}
        out["settings"].append(r)
        pc.log(f"{name:16s} {dt:6.2f} s, returned {r['returned_mean']:7.1f}, recall@{a.k} "
               f"{r['recall_top']:.3f}, rescored {r['recall_rescored_returned']:.3f}, exact top "
               f"in list {r['exact_topk_in_returned']:.3f}; score-exact "
               f"{r['score_minus_exact']['mean']:+.3f} (|.| "
               f"{r['score_minus_exact']['mean_abs']:.3f}, prev doc {r['score_minus_exact_prev_doc']['mean_abs']:.3f}), corr "
               f"{r['corr_score_exact']:.3f}, below exact {r['share_score_below_exact']:.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
