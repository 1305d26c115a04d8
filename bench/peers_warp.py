#!/usr/bin/env python3
"""xtr-warp-rs (WARP) on a `tartan gen` corpus, beside tartan (issue 22).

    python3 bench/peers_warp.py --corpus DIR --index-dir DIR [--build] [--threads N]
        [--device cpu|cuda] [--exact exact.trec] [--tartan-exhaustive exh.trec]
        [--out peers.jsonl] [--nprobe 1,2,4,8,16,32] [--t-prime 2000,10000,50000]
        [--thresholds 0]
        [--nbits 4] [--nq N] [--latency-nq N] [--repeats R] [--max-seconds S]

Build (--build): XTRWarp(index).create() from one float32 tensor per document (views of the
memory-mapped embeddings.npy), on --device, with WARP's defaults (nbits 4, 4 k-means
iterations, centroids 2^floor(log2(16 sqrt(tokens))), seed 42), all --threads threads;
timed from the list of documents to the index on disk, load timed apart.

Search: WARP's defaults (its hyperparams.optimize: nprobe, t_prime, bound, threshold and
max_candidates from the index's density and k), then its speed/recall knobs: each nprobe of
--nprobe at each centroid score threshold of --thresholds (default 0: WARP's own 0.5 drops
query tokens whose best centroid scores under it, which on `tartan gen --model 1` holds
recall near 0.42-0.50 whatever nprobe is; on model 2 it changes little), each nprobe at the
default threshold, and each t_prime of --t-prime at the default nprobe (bound raised to at
least 8 nprobe, as its heuristic does). WARP's recall against exact MaxSim is low at its
defaults by design: it scores a document from the probed clusters only and imputes the
other query tokens' similarities, without rescoring (bench/peers_warp_check.py measures
it; bench/RESULTS.md, "Side by side with the peers"). --threads sets torch's threads and
WARP's num_threads (its rayon pool). One JSON line a setting (bench/peers_common.py).
"""
import argparse
import os
import re
import sys
import time
import types
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_common as pc  # noqa: E402


def import_warp():
    """Imports xtr_warp. Its metadata filtering module imports duckdb at load time; the
    benchmark filters nothing, so where duckdb is missing (the GPU host) a stub stands in."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        sys.modules["duckdb"] = types.ModuleType("duckdb")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import xtr_warp
    return xtr_warp


def search_bytes(d):
    """Bytes of the files a search loads. WARP keeps each indexing chunk's codes, residuals,
    passage ids and doclens beside the compacted lists it searches (for add and update), so
    the directory holds the residuals twice; a copy without the chunk files gives the same
    answers (checked on a 5,000-document index)."""
    n = 0
    for f in os.listdir(d):
        if re.match(r"^(\d+\.(codes|residuals|passage_ids|metadata)\.|doclens\.\d+\.npy$)", f):
            continue
        p = os.path.join(d, f)
        if os.path.isfile(p):
            n += os.path.getsize(p)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pc.common_args(ap)
    ap.add_argument("--nbits", type=int, default=4, help="residual bits (WARP's default 4)")
    ap.add_argument("--kmeans-iters", type=int, default=4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--nprobe", default="1,2,4,8,16,32")
    ap.add_argument("--t-prime", default="2000,10000,50000")
    ap.add_argument("--thresholds", default="0",
                    help="centroid score thresholds at which the --nprobe sweep runs again "
                    "(besides WARP's own default)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"],
                    help="precision the index is loaded and searched in")
    a = ap.parse_args()
    pc.set_thread_env(a.threads)
    t_start = time.perf_counter()

    import logging

    import numpy as np
    import torch

    logging.getLogger("xtr_warp").setLevel(logging.ERROR)
    xtr_warp = import_warp()
    torch.set_num_threads(max(1, a.threads))
    dev = a.device
    cuda = dev.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else None

    c = pc.Corpus(a.corpus, a.nq)
    dev_name = torch.cuda.get_device_name() if cuda else "cpu"
    rec = pc.Recorder(a.out, "warp", pc.pkg_version("xtr-warp-rs"), c, dev_name,
                      {"torch": torch.__version__, "device_arg": dev})
    pc.log(f"xtr-warp-rs {pc.pkg_version('xtr-warp-rs')}, torch {torch.__version__}, "
           f"{dev_name}, {a.threads} threads; {c.n_docs} documents, {c.n_tokens} tokens")

    if a.build:
        docs = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only map: torch warns it is not writable
            for i in range(c.n_docs):
                x = c.emb[c.offs[i] : c.offs[i + 1]]
                docs.append(torch.from_numpy(x) if x.dtype == np.float32
                            else torch.from_numpy(c.doc_f32(i)))
        t0 = time.perf_counter()
        xtr_warp.XTRWarp(index=a.index_dir).create(
            embeddings_source=docs, device=dev, nbits=a.nbits, kmeans_niters=a.kmeans_iters,
            seed=a.seed, show_progress=False)
        if sync:
            sync()
        build_s = time.perf_counter() - t0
        del docs
        nbytes = pc.dir_bytes(a.index_dir)
        sbytes = search_bytes(a.index_dir)
        r = rec.write({"kind": "build", "threads": a.threads, "build_s": build_s,
                       "index_bytes": nbytes, "bytes_per_token": nbytes / c.n_tokens,
                       "search_bytes": sbytes, "search_bytes_per_token": sbytes / c.n_tokens,
                       "params": {"nbits": a.nbits, "kmeans_iters": a.kmeans_iters}})
        pc.log(f"build {build_s:.2f} s, {nbytes / 2**20:.1f} MiB "
               f"({r['bytes_per_token']:.1f} B a token; the files search reads: "
               f"{r['search_bytes_per_token']:.1f})")
    if a.no_search:
        return

    refs = pc.References(a.exact, a.tartan_exhaustive, c.qids, a.k)
    t0 = time.perf_counter()
    xw = xtr_warp.XTRWarp(index=a.index_dir)
    xw.load(device=dev, dtype=getattr(torch, a.dtype), mmap=not cuda)
    if sync:
        sync()
    load_s = time.perf_counter() - t0
    Q = torch.from_numpy(c.padded_queries()).to(getattr(torch, a.dtype))
    if cuda:
        Q = Q.to(dev)
    bound_d, nprobe_d, thr_d, maxc_d, tprime_d = xw.optimize_hyperparams(a.k, Q)
    pc.log(f"load {load_s:.2f} s; defaults: nprobe {nprobe_d}, t_prime {tprime_d}, "
           f"bound {bound_d}, threshold {thr_d}, max_candidates {maxc_d}")

    grid = [("default", {})]
    if not a.defaults_only:
        # The thresholds first: at WARP's default threshold (0.5) recall against exact MaxSim
        # stays low on the generated corpora whatever nprobe is; at 0 it climbs with nprobe.
        for thr in pc.float_list(a.thresholds):
            if thr == thr_d:
                continue
            for p in pc.int_list(a.nprobe):
                grid.append((f"thr{thr:g}-nprobe{p}", {"nprobe": p, "bound": max(bound_d, 8 * p),
                                                       "centroid_score_threshold": thr}))
        for p in pc.int_list(a.nprobe):
            if p != nprobe_d:
                grid.append((f"nprobe{p}", {"nprobe": p, "bound": max(bound_d, 8 * p)}))
        for t in pc.int_list(a.t_prime):
            if t != tprime_d:
                grid.append((f"tprime{t}", {"t_prime": t}))

    for name, kw in grid:
        if name != "default" and a.max_seconds and time.perf_counter() - t_start > a.max_seconds:
            pc.log(f"--max-seconds: {name} and later settings left out")
            break

        def batch(n, kw=kw):
            r = xw.search(Q[:n], top_k=a.k, num_threads=a.threads, show_progress=False, **kw)
            return [[pid for pid, _ in row] for row in r]

        def one(i, kw=kw):
            return xw.search(Q[i : i + 1], top_k=a.k, num_threads=a.threads,
                             show_progress=False, **kw)

        try:
            m, got = pc.measure(batch, one, len(c.queries), a.repeats, a.latency_nq,
                                lambda j: c.ids[j], sync, a.max_batch_s)
        except Exception as e:  # noqa: BLE001 (keep going: the next setting may work)
            pc.log(f"{name}: {type(e).__name__}: {e}")
            rec.write({"kind": "error", "setting": name, "threads": a.threads,
                       "error": f"{type(e).__name__}: {e}"})
            continue
        params = {"nprobe": kw.get("nprobe", nprobe_d), "t_prime": kw.get("t_prime", tprime_d),
                  "bound": kw.get("bound", bound_d),
                  "centroid_score_threshold": kw.get("centroid_score_threshold", thr_d),
                  "max_candidates": maxc_d, "nbits": a.nbits, "dtype": a.dtype}
        m.update({"kind": "search", "setting": name, "params": params, "load_s": load_s})
        r = rec.write(pc.finish_setting(m, got, refs, a.threads,
                                        "cuda" if cuda else "cpu", a.k))
        pc.log(f"{name:12s} {r['batch_qps']:9.1f} q/s, p50 {r.get('latency_p50_ms', 0):7.2f} "
               f"ms, p99 {r.get('latency_p99_ms', 0):7.2f} ms, recall@{a.k} exact "
               f"{r['recall_exact'] or 0:.4f} tartan {r['recall_tartan'] or 0:.4f}")


if __name__ == "__main__":
    main()
