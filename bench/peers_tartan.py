#!/usr/bin/env python3
"""tartan, measured the way bench/peers_*.py measure its peers (issue 22).

    python3 bench/peers_tartan.py --corpus DIR --index-dir DIR [--build --tartan-bin PATH]
        [--threads N] [--device cpu|cuda] [--exact exact.trec] [--tartan-exhaustive exh.trec]
        [--out peers.jsonl] [--recall 0.8,0.9,0.99,0.999] [--plaid 1x256,2x1024,4x4096]
        [--nq N] [--latency-nq N] [--repeats R] [--write-exhaustive exh.trec]

Build (--build): the `tartan build` command (--tartan-bin) on embeddings.npy, doclens.npy and
ids.txt, with its defaults (nbits 2, its centroid rule, calibration), on --device, with
--threads OpenMP threads; timed as the command's wall clock.

Search, through the Python package (python/: `import tartan`, libtartan in the same process,
like the peers' Python-over-native APIs): the defaults (adaptive search, recall target 0.95),
then the --recall knob (each target of --recall), then PLAID's fixed stages (--plaid, NCELLSxNDOCS,
threshold 0.5). Batched: Index.search_arrays of all nq queries, one call (threads=--threads);
latency: one query a call. --write-exhaustive FILE writes tartan's exhaustive top k of the
queries as a TREC run (the reference the peers' recall_tartan is measured against) and
exits. One JSON line a setting (bench/peers_common.py).
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_common as pc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pc.common_args(ap)
    ap.add_argument("--tartan-bin", default="tartan", help="the tartan command (for --build)")
    ap.add_argument("--nbits", type=int, default=2,
                    help="residual bits of the build (tartan's default 2); records of another "
                    "value are labelled tartan-nbN")
    ap.add_argument("--recall", default="0.8,0.9,0.99,0.999", help="recall targets to sweep")
    ap.add_argument("--plaid", default="1x256,2x1024,4x4096",
                    help="PLAID fixed stages to sweep, NCELLSxNDOCS (threshold 0.5)")
    ap.add_argument("--write-exhaustive", default=None,
                    help="write tartan's exhaustive top k here (TREC) and stop")
    a = ap.parse_args()
    pc.set_thread_env(a.threads)
    t_start = time.perf_counter()
    dev = a.device
    cuda = dev.startswith("cuda")
    c = pc.Corpus(a.corpus, a.nq)

    import tartan

    label = "tartan" if a.nbits == 2 else f"tartan-nb{a.nbits}"
    rec = pc.Recorder(a.out, label, tartan.version(), c, "cuda" if cuda else "cpu",
                      {"device_arg": dev})
    pc.log(f"tartan {tartan.version()}, {dev}, {a.threads} threads; {c.n_docs} documents, "
           f"{c.n_tokens} tokens")

    if a.build:
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, a.threads)))
        cmd = [a.tartan_bin, "build", a.index_dir,
               "--embeddings", os.path.join(c.path, "embeddings.npy"),
               "--doclens", os.path.join(c.path, "doclens.npy"), "--device", dev,
               "--nbits", str(a.nbits)]
        if os.path.exists(os.path.join(c.path, "ids.txt")):
            cmd += ["--ids", os.path.join(c.path, "ids.txt")]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        build_s = time.perf_counter() - t0
        if p.returncode:
            sys.exit(f"tartan build failed ({p.returncode}): {p.stderr.strip()}")
        nbytes = pc.dir_bytes(a.index_dir)
        r = rec.write({"kind": "build", "threads": a.threads, "build_s": build_s,
                       "index_bytes": nbytes, "bytes_per_token": nbytes / c.n_tokens,
                       "params": {"nbits": a.nbits}, "log": p.stderr.strip()[-2000:]})
        pc.log(f"build {build_s:.2f} s, {nbytes / 2**20:.1f} MiB "
               f"({r['bytes_per_token']:.1f} B a token)")
    if a.no_search:
        return

    ix = tartan.Index(a.index_dir, readonly=True)
    Q = c.padded_queries() if len({len(q) for q in c.queries}) == 1 else c.queries
    if a.write_exhaustive:
        t0 = time.perf_counter()
        h = ix.search_arrays(Q, k=a.k, exhaustive=True, threads=a.threads, device=dev)
        got = [[x for x in h.ids[i, : h.counts[i]]] for i in range(len(h))]
        sc = [h.scores[i, : h.counts[i]].tolist() for i in range(len(h))]
        pc.write_trec(a.write_exhaustive, c.qids, got, sc, tag="tartan-exhaustive")
        pc.log(f"exhaustive: {len(got)} queries, {time.perf_counter() - t0:.1f} s -> "
               f"{a.write_exhaustive}")
        return

    refs = pc.References(a.exact, a.tartan_exhaustive, c.qids, a.k)
    grid = [("default", {})]
    if not a.defaults_only:
        for r in pc.float_list(a.recall):
            if r != 0.95:
                grid.append((f"recall{r:g}", {"recall_target": r}))
        for s in [x for x in a.plaid.split(",") if x.strip()]:
            nc, nd = (int(v) for v in s.lower().split("x"))
            grid.append((f"plaid{nc}x{nd}", {"ncells": nc, "ndocs": nd, "threshold": 0.5}))

    for name, kw in grid:
        if name != "default" and a.max_seconds and time.perf_counter() - t_start > a.max_seconds:
            pc.log(f"--max-seconds: {name} and later settings left out")
            break
        stats = {}

        def batch(n, kw=kw):
            h = ix.search_arrays(Q[:n], k=a.k, threads=a.threads, device=dev, **kw)
            stats["last"] = h.stats
            return [list(h.ids[i, : h.counts[i]]) for i in range(len(h))]

        def one(i, kw=kw):
            return ix.search(Q[i : i + 1], k=a.k, threads=a.threads, device=dev, **kw)

        try:
            m, got = pc.measure(batch, one, len(c.queries), a.repeats, a.latency_nq,
                                lambda d: d, None, a.max_batch_s)
        except Exception as e:  # noqa: BLE001
            pc.log(f"{name}: {type(e).__name__}: {e}")
            rec.write({"kind": "error", "setting": name, "threads": a.threads,
                       "error": f"{type(e).__name__}: {e}"})
            continue
        st = stats.get("last")
        params = dict(kw)
        params.setdefault("recall_target", 0.95 if not kw else None)
        m.update({"kind": "search", "setting": name, "params": params})
        if st is not None:
            m["stats"] = {"candidates_per_query": st.n_candidates / max(1, m["nq"]),
                          "exact_per_query": st.n_exact / max(1, m["nq"]),
                          "seconds_total": st.seconds_total}
        r = rec.write(pc.finish_setting(m, got, refs, a.threads, "cuda" if cuda else "cpu",
                                        a.k))
        pc.log(f"{name:12s} {r['batch_qps']:9.1f} q/s, p50 {r.get('latency_p50_ms', 0):7.2f} "
               f"ms, p99 {r.get('latency_p99_ms', 0):7.2f} ms, recall@{a.k} exact "
               f"{r['recall_exact'] or 0:.4f} tartan {r['recall_tartan'] or 0:.4f}")
    ix.close()


if __name__ == "__main__":
    main()
