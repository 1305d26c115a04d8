#!/usr/bin/env python3
"""voyager-index (its shard engine) on a `tartan gen` corpus, beside tartan (issue 22).

    python3 bench/peers_voyager.py --corpus DIR --index-dir DIR [--build] [--threads N]
        [--device cpu|cuda] [--exact exact.trec] [--tartan-exhaustive exh.trec]
        [--out peers.jsonl] [--k-candidates 250,500,1000,4000,8000]
        [--n-full-scores 1024,16384] [--nq N] [--latency-nq N] [--repeats R]

Build (--build): voyager_index.Index(path, dim, engine="shard", device=...) and one add() of
every document (float32 arrays read from the memory map), which builds the sealed index at
its defaults: RROQ-1.58 codec (K 8192), LEMUR router (10 epochs) with a FAISS flat-IP
shortlist, 256 shards; timed from the list of arrays to the index on disk.

Search: its defaults (k_candidates 2000 routed candidates, n_full_scores 4096, max_docs_exact
10000), then its speed/recall knobs: each k_candidates of --k-candidates (the router's
shortlist: a construction-time setting, so the index is reopened with it, load timed apart),
and each n_full_scores of --n-full-scores at the default shortlist. Batched: Index.search_batch
(its batch path: one routing GEMM for all queries); latency: Index.search, one query a call.
--threads pins rayon (its Rust CPU kernels), OpenMP (FAISS) and torch to that many threads.
One JSON line a setting (bench/peers_common.py). Needs faiss-cpu and latence-shard-engine
(its Rust CPU kernels); without the latter it falls back to slower paths, and says so.
"""
import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_common as pc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pc.common_args(ap)
    ap.add_argument("--k-candidates", default="250,500,1000,4000,8000")
    ap.add_argument("--n-full-scores", default="1024,16384")
    ap.add_argument("--compression", default=None,
                    help="codec (default: voyager's own, rroq158); e.g. fp16, rroq4_riem")
    a = ap.parse_args()
    pc.set_thread_env(a.threads)
    os.environ["VOYAGER_RROQ158_N_THREADS"] = str(max(1, a.threads))
    t_start = time.perf_counter()

    import logging

    import torch

    torch.set_num_threads(max(1, a.threads))
    logging.getLogger("voyager_index").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from voyager_index import Index
    try:
        import latence_shard_engine  # noqa: F401

        native = True
    except ImportError:
        native = False
        pc.log("warning: latence_shard_engine missing: voyager's CPU kernels fall back")
    dev = a.device
    cuda = dev.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else None

    c = pc.Corpus(a.corpus, a.nq)
    dev_name = torch.cuda.get_device_name() if cuda else "cpu"
    rec = pc.Recorder(a.out, "voyager", pc.pkg_version("voyager-index"), c, dev_name,
                      {"torch": torch.__version__, "device_arg": dev, "native_kernels": native,
                       "faiss": pc.pkg_version("faiss-cpu")})
    pc.log(f"voyager-index {pc.pkg_version('voyager-index')}, torch {torch.__version__}, "
           f"{dev_name}, {a.threads} threads; {c.n_docs} documents, {c.n_tokens} tokens")
    extra = {"compression": a.compression} if a.compression else {}

    def open_index(**kw):
        return Index(a.index_dir, dim=c.dim, engine="shard", device=dev, **extra, **kw)

    if a.build:
        if os.path.exists(a.index_dir) and os.listdir(a.index_dir):
            sys.exit(f"--build: {a.index_dir} is not empty")
        docs = [c.doc_f32(i) for i in range(c.n_docs)]
        t0 = time.perf_counter()
        ix = open_index()
        ix.add(docs, ids=list(range(c.n_docs)))
        ix.flush()
        ix.close()
        if sync:
            sync()
        build_s = time.perf_counter() - t0
        del docs
        nbytes = pc.dir_bytes(a.index_dir)
        r = rec.write({"kind": "build", "threads": a.threads, "build_s": build_s,
                       "index_bytes": nbytes, "bytes_per_token": nbytes / c.n_tokens,
                       "params": {"compression": a.compression or "default"}})
        pc.log(f"build {build_s:.2f} s, {nbytes / 2**20:.1f} MiB "
               f"({r['bytes_per_token']:.1f} B a token)")
    if a.no_search:
        return

    refs = pc.References(a.exact, a.tartan_exhaustive, c.qids, a.k)
    Q = c.queries  # float32 [L, d] arrays

    grid = [("default", {}, {})]
    if not a.defaults_only:
        for kc in pc.int_list(a.k_candidates):
            if kc != 2000:
                grid.append((f"kcand{kc}", {"k_candidates": kc}, {}))
        for nf in pc.int_list(a.n_full_scores):
            if nf != 4096:
                grid.append((f"nfull{nf}", {}, {"n_full_scores": nf}))

    ix, ix_kw = None, None
    for name, open_kw, search_kw in grid:
        if name != "default" and a.max_seconds and time.perf_counter() - t_start > a.max_seconds:
            pc.log(f"--max-seconds: {name} and later settings left out")
            break
        try:
            if ix is None or open_kw != ix_kw:
                if ix is not None:
                    ix.close()
                t0 = time.perf_counter()
                ix = open_index(**open_kw)
                load_s = time.perf_counter() - t0
                ix_kw = open_kw
            mgr = ix._manager  # the shard manager: its per-call overrides (n_full_scores)

            def batch(n, kw=search_kw):
                if kw:
                    r = mgr.search_batch(Q[:n], k=a.k, **kw)
                    return [[int(d) for d, _ in row] for row in r]
                return [[h.doc_id for h in row] for row in ix.search_batch(Q[:n], k=a.k)]

            def one(i, kw=search_kw):
                if kw:
                    return mgr.search_multivector(Q[i], k=a.k, **kw)
                return ix.search(Q[i], k=a.k)

            m, got = pc.measure(batch, one, len(Q), a.repeats, a.latency_nq,
                                lambda j: c.ids[j], sync, a.max_batch_s)
        except Exception as e:  # noqa: BLE001 (keep going: the next setting may work)
            pc.log(f"{name}: {type(e).__name__}: {e}")
            rec.write({"kind": "error", "setting": name, "threads": a.threads,
                       "error": f"{type(e).__name__}: {e}"})
            continue
        params = {"k_candidates": open_kw.get("k_candidates", 2000),
                  "n_full_scores": search_kw.get("n_full_scores", 4096),
                  "max_docs_exact": 10000, "compression": a.compression or "rroq158"}
        m.update({"kind": "search", "setting": name, "params": params, "load_s": load_s})
        r = rec.write(pc.finish_setting(m, got, refs, a.threads,
                                        "cuda" if cuda else "cpu", a.k))
        pc.log(f"{name:12s} {r['batch_qps']:9.1f} q/s, p50 {r.get('latency_p50_ms', 0):7.2f} "
               f"ms, p99 {r.get('latency_p99_ms', 0):7.2f} ms, recall@{a.k} exact "
               f"{r['recall_exact'] or 0:.4f} tartan {r['recall_tartan'] or 0:.4f}")
    if ix is not None:
        ix.close()


if __name__ == "__main__":
    main()
