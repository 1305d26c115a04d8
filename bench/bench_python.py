#!/usr/bin/env python3
"""The Python package against the C library on the same work (README "Python").

search: one batched search of every query, from C (bench/bench_capi search, its own process)
    and from Python (tartan.Index.search, returning [(id, score)] lists, and search_arrays),
    interleaved in rounds so that the machine's load touches both alike; each side warms up
    first and reports the median of its reps, in queries per wall-clock second and per
    CPU-second of the process (the figure that a loaded machine disturbs least). Python's
    time includes turning the results into Python objects.
add: the memory of adding one large batch from NumPy against C doing the same add from heap
    memory: resident memory before the add and its peak during it (VmHWM, reset through
    /proc/self/clear_refs), plus Python-side allocations traced by tracemalloc. The same
    increase on both sides means the binding copies nothing the engine does not.

    python3 bench/bench_python.py search --index IX --queries Q.npy [-k 10] [--reps 5]
        [--rounds 3] [--threads 0] [--capi bench/bench_capi] [--json OUT]
    python3 bench/bench_python.py add --tokens 1000000 --dim 128 --scratch DIR
        [--capi bench/bench_capi] [--json OUT]

Prints a table (with the load average before and after) and writes JSON.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import tracemalloc

import numpy as np

import tartan


def load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def capi_search(capi, index, queries, k, reps, threads):
    out = subprocess.run([capi, "search", index, queries, "-k", str(k), "--reps", str(reps),
                          "--threads", str(threads)], check=True, capture_output=True,
                         text=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    return [r["qps"] for r in rows], [r["q_per_cpu_s"] for r in rows]


def py_search(ix, qs, k, reps, threads, arrays, overhead):
    """Queries/s (wall and CPU) of Index.search (or search_arrays), and in overhead the
    binding's own share of each call: its wall time less the engine's (tartan_search's
    seconds_total, measured around the same call, so the machine's load cancels)."""
    def call():
        if arrays:
            h = ix.search_arrays(qs, k=k, threads=threads)
            return h.stats.seconds_total
        # Index.search, as a caller runs it, with the engine's time it drops.
        return ix._search(qs, k, False, None, None, None, None, None, None, threads,
                          False)[1]["seconds_total"]

    call()  # warm-up, as the C side's
    qps, qpc = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        engine = call()
        t, c = time.perf_counter() - t0, time.process_time() - c0
        qps.append(len(qs) / t)
        qpc.append(len(qs) / c)
        overhead.append((t - engine) / t)
    return qps, qpc


def bench_search(a):
    qs = np.load(a.queries)
    rows = {"c": [], "python": [], "python_arrays": []}
    cpu = {n: [] for n in rows}
    over = {n: [] for n in rows}
    load0 = load()
    with tartan.Index(a.index, readonly=True) as ix:
        for r in range(a.rounds):
            for n, (w, c) in (("c", capi_search(a.capi, a.index, a.queries, a.k, a.reps,
                                                 a.threads)),
                              ("python", py_search(ix, qs, a.k, a.reps, a.threads, False,
                                                   over["python"])),
                              ("python_arrays", py_search(ix, qs, a.k, a.reps, a.threads,
                                                          True, over["python_arrays"]))):
                rows[n] += w
                cpu[n] += c
        info = ix.info()
    load1 = load()
    med = {n: statistics.median(v) for n, v in rows.items()}
    medc = {n: statistics.median(v) for n, v in cpu.items()}
    print(f"index {a.index}: {info.n_docs} documents, {info.n_tokens} tokens, dim {info.dim}, "
          f"{info.n_centroids} centroids; {qs.shape[0]} queries of {qs.shape[1]} tokens, "
          f"k {a.k}, threads {a.threads or 'all'}")
    print(f"load average before: {load0}, after: {load1}")
    print(f"{'':16} {'median q/s':>11} {'min':>9} {'max':>9}  vs C   "
          f"{'q/CPU-s':>9}  vs C")
    for n, v in rows.items():
        print(f"{n:16} {med[n]:11.1f} {min(v):9.1f} {max(v):9.1f}  {med[n] / med['c']:.3f}  "
              f"{medc[n]:9.1f}  {medc[n] / medc['c']:.3f}")
    share = {n: statistics.median(v) for n, v in over.items() if v}
    print("binding's share of a call's wall time (call less tartan_search's own time), "
          "median [max]: " + ", ".join(f"{n} {100 * share[n]:.3f}% [{100 * max(over[n]):.3f}%]"
                                       for n in share))
    return {"mode": "search", "index": a.index, "queries": a.queries, "k": a.k,
            "threads": a.threads, "n_docs": info.n_docs, "n_tokens": info.n_tokens,
            "n_queries": int(qs.shape[0]), "qps": rows, "median_qps": med,
            "q_per_cpu_s": cpu, "median_q_per_cpu_s": medc,
            "python_over_c": med["python"] / med["c"],
            "python_arrays_over_c": med["python_arrays"] / med["c"],
            "python_over_c_cpu": medc["python"] / medc["c"],
            "binding_share": {n: v for n, v in over.items() if v},
            "python_arrays_over_c_cpu": medc["python_arrays"] / medc["c"],
            "load_before": load0, "load_after": load1}


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def bench_add(a):
    rng = np.random.default_rng(7)
    n_docs = a.tokens // 100
    lens = np.full(n_docs, 100, np.int64)
    # Tokens around shared directions (centroids mean something), float32 [T, d].
    centers = rng.standard_normal((256, a.dim)).astype(np.float32)
    emb = centers[rng.integers(0, 256, size=a.tokens)]
    emb += 0.5 * rng.standard_normal(emb.shape, dtype=np.float32)
    os.makedirs(a.scratch, exist_ok=True)
    e_path, l_path = os.path.join(a.scratch, "emb.npy"), os.path.join(a.scratch, "lens.npy")
    np.save(e_path, emb)
    np.save(l_path, lens)
    ids = [f"d{i}" for i in range(n_docs)]
    load0 = load()
    res = {}
    for side in ("c", "python"):
        ix_path = os.path.join(a.scratch, f"ix-{side}")
        shutil.rmtree(ix_path, ignore_errors=True)
        if side == "c":
            out = subprocess.run([a.capi, "add", ix_path, e_path, l_path, "--train-docs",
                                  str(a.train_docs), "--centroids", str(a.centroids)],
                                 check=True, capture_output=True, text=True).stdout
            res[side] = json.loads(out)
            continue
        with tartan.Index(ix_path, dim=a.dim, create=True, exclusive=True,
                          n_centroids=a.centroids) as ix:
            ix.train(emb[: a.train_docs * 100], lens[: a.train_docs],
                     corpus_tokens=a.tokens)
            before = status_bytes("VmRSS")
            reset_peak()
            tracemalloc.start()
            t0 = time.perf_counter()
            ix.add(ids, emb, lens)
            s = time.perf_counter() - t0
            _, traced = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            peak = status_bytes("VmHWM")
            ptr, copied = tartan._tartan._last_input()
            res[side] = {"mode": "add", "tokens": a.tokens, "bytes": int(emb.nbytes),
                         "seconds": s, "rss_before": before, "peak_during": peak,
                         "peak_increase": peak - before, "tracemalloc_peak": traced,
                         "pointer_is_the_arrays": ptr == emb.ctypes.data,
                         "binding_copied_bytes": copied}
        shutil.rmtree(ix_path, ignore_errors=True)
    shutil.rmtree(os.path.join(a.scratch, "ix-c"), ignore_errors=True)
    load1 = load()
    mb = 1 << 20
    print(f"add {a.tokens} tokens of dim {a.dim} float32 ({emb.nbytes / mb:.0f} MiB) in one "
          f"batch, {n_docs} documents, {a.centroids} centroids trained first")
    print(f"load average before: {load0}, after: {load1}")
    for side, r in res.items():
        print(f"{side:7} {r['seconds']:7.2f} s  RSS before {r['rss_before'] / mb:7.0f} MiB, "
              f"peak during {r['peak_during'] / mb:7.0f} MiB, increase "
              f"{r['peak_increase'] / mb:6.0f} MiB")
    p = res["python"]
    print(f"python: tracemalloc peak during add {p['tracemalloc_peak']} bytes; pointer given "
          f"to the engine is the array's: {p['pointer_is_the_arrays']}; bytes the binding "
          f"copied: {p['binding_copied_bytes']}")
    return {"mode": "add", "results": res, "dim": a.dim, "load_before": load0,
            "load_after": load1}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    here = os.path.dirname(os.path.abspath(__file__))
    s = sub.add_parser("search")
    s.add_argument("--index", required=True)
    s.add_argument("--queries", required=True)
    s.add_argument("-k", type=int, default=10)
    s.add_argument("--reps", type=int, default=5)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--threads", type=int, default=0)
    d = sub.add_parser("add")
    d.add_argument("--tokens", type=int, default=1_000_000)
    d.add_argument("--dim", type=int, default=128)
    d.add_argument("--centroids", type=int, default=1024)
    d.add_argument("--train-docs", type=int, default=200)
    d.add_argument("--scratch", required=True)
    for p in (s, d):
        p.add_argument("--capi", default=os.path.join(here, "bench_capi"))
        p.add_argument("--json")
    a = ap.parse_args()
    out = bench_search(a) if a.mode == "search" else bench_add(a)
    out.update(version=tartan.version(), python=sys.version.split()[0],
               date=time.strftime("%Y-%m-%d %H:%M:%S"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
