#!/usr/bin/env python3
"""Shared parts of the side-by-side drivers (bench/peers_*.py, issue 22).

Every driver reads the corpus as `tartan gen` writes it (embeddings.npy [T, d] float32 /
float16 / bfloat16-as-uint16, doclens.npy [N], ids.txt, queries.npy [Q, L, d] or packed
[Tq, d] with qlens.npy, query_ids.txt), measures the same figures the same way and appends
one JSON object a line to the same kind of file:

- a build record: {"kind": "build", engine, threads, device, build_s, index_bytes,
  bytes_per_token, ...};
- a search record per (setting, threads): {"kind": "search", engine, setting, params,
  threads, device, nq, batch_qps, qps_per_core, latency_p50_ms, latency_p99_ms,
  recall_exact, recall_tartan, ...}.

Timing: batched = all nq queries in one call of the engine, best of --repeats after one
warm-up call (with the process's CPU seconds in that call: qps_per_cpu_s); latency = one query a call over the first --latency-nq queries after 5 warm-up
calls, wall clock of the Python call (every engine here is Python over native code).
queries/s per core = batched queries/s / threads on the CPU (on a GPU: the queries/s).

Recall@k: the share of a reference top k that the engine's top k holds, averaged over the
queries. Two references: exact MaxSim over the original vectors (fp32, every document:
`python3 bench/peers_common.py exact ...` writes it as a TREC run), and tartan's exhaustive
search (`tartan search --exhaustive`), which scores tartan's own compressed vectors.

    python3 bench/peers_common.py exact --corpus DIR --out exact.trec [--k 10] [--nq N]
        [--device cpu|cuda] [--threads N]
"""
import argparse
import datetime
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import warnings

import numpy as np

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "RAYON_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def set_thread_env(n):
    """Pins every thread pool we know of to n threads: call before importing torch or an
    engine (OpenMP, BLAS and rayon read these once, when their pool starts)."""
    if n and n > 0:
        for v in THREAD_VARS:
            os.environ[v] = str(n)


def int_list(s):
    return [int(x) for x in str(s).split(",") if x.strip()]


def float_list(s):
    return [float(x) for x in str(s).split(",") if x.strip()]


def read_lines(path):
    with open(path) as f:
        return [ln.rstrip("\n") for ln in f if ln.strip()]


def read_trec(path, k):
    """qid -> the docids of its k best lines (by rank, then by score)."""
    per = {}
    with open(path) as f:
        for ln in f:
            p = ln.split()
            if len(p) < 6:
                continue
            per.setdefault(p[0], []).append((int(p[3]), -float(p[4]), p[2]))
    return {q: [d for _, _, d in sorted(v)[:k]] for q, v in per.items()}


def recall(got_lists, ref, qids, k):
    """Mean over the queries that ref holds of |top k & ref's top k| / |ref's top k|."""
    if ref is None:
        return None
    tot, n = 0.0, 0
    for qi, q in enumerate(qids):
        r = ref.get(q)
        if not r:
            continue
        tot += len(set(got_lists[qi][:k]) & set(r[:k])) / len(r[:k])
        n += 1
    return tot / n if n else None


def percentile(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, math.ceil(p / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[i]


def dir_bytes(d):
    n = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                n += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return n


class Corpus:
    """A `tartan gen` directory through numpy memory maps.

    emb [T, d] (the map), lens [N] int64, offs [N + 1], ids [N], queries: a list of [L_i, d]
    float32 arrays (padding left out where qlens.npy says so), qids."""

    def __init__(self, d, nq=0):
        self.path = os.path.abspath(d)
        self.name = os.path.basename(self.path.rstrip("/"))
        self.emb = np.load(os.path.join(d, "embeddings.npy"), mmap_mode="r")
        self.lens = np.load(os.path.join(d, "doclens.npy")).astype(np.int64)
        self.offs = np.zeros(len(self.lens) + 1, dtype=np.int64)
        np.cumsum(self.lens, out=self.offs[1:])
        p = os.path.join(d, "ids.txt")
        self.ids = read_lines(p) if os.path.exists(p) else [str(i) for i in range(len(self.lens))]
        if self.emb.ndim != 2 or self.lens.ndim != 1:
            sys.exit("corpus: need embeddings.npy [T, d] and doclens.npy [N]")
        if int(self.lens.sum()) != self.emb.shape[0]:
            sys.exit(f"corpus: doclens sum {int(self.lens.sum())} != embeddings rows "
                     f"{self.emb.shape[0]}")
        if (self.lens <= 0).any():
            sys.exit("corpus: a document has no tokens")
        if len(self.ids) != len(self.lens):
            sys.exit("corpus: ids.txt and doclens.npy differ in length")
        if self.emb.dtype not in (np.float32, np.float16, np.uint16):
            sys.exit(f"embeddings.npy: unsupported dtype {self.emb.dtype}")
        self.dtype = "bfloat16" if self.emb.dtype == np.uint16 else str(self.emb.dtype)
        self.dim = int(self.emb.shape[1])
        self.queries, self.qids, self.query_len = self._load_queries(d, nq)

    def _load_queries(self, d, nq):
        qs = np.load(os.path.join(d, "queries.npy"))
        p = os.path.join(d, "qlens.npy")
        qlens = np.load(p).astype(np.int64) if os.path.exists(p) else None
        if qs.ndim == 3:
            n = qs.shape[0]
            qlens = qlens if qlens is not None else np.full(n, qs.shape[1], dtype=np.int64)
            lst = [qs[i, : qlens[i]] for i in range(n)]
        elif qs.ndim == 2 and qlens is not None:
            o = np.zeros(len(qlens) + 1, dtype=np.int64)
            np.cumsum(qlens, out=o[1:])
            lst = [qs[o[i] : o[i + 1]] for i in range(len(qlens))]
        else:
            sys.exit("corpus: queries.npy must be [Q, L, d], or [Tq, d] with qlens.npy")
        if qs.shape[-1] != self.dim:
            sys.exit("corpus: queries and documents differ in dimension")
        p = os.path.join(d, "query_ids.txt")
        qids = read_lines(p) if os.path.exists(p) else [str(i) for i in range(len(lst))]
        if len(qids) != len(lst):
            sys.exit("corpus: query_ids.txt and queries.npy differ in length")
        n = len(lst) if nq <= 0 else min(nq, len(lst))
        out = []
        for q in lst[:n]:
            q = np.asarray(q)
            if q.dtype == np.uint16:  # bfloat16 bit patterns
                q = (q.astype(np.uint32) << 16).view(np.float32)
            out.append(np.ascontiguousarray(q, dtype=np.float32))
        return out, qids[:n], max(len(q) for q in out)

    @property
    def n_docs(self):
        return len(self.lens)

    @property
    def n_tokens(self):
        return int(self.emb.shape[0])

    def doc_f32(self, i):
        """Document i as a float32 array (a copy)."""
        x = np.asarray(self.emb[self.offs[i] : self.offs[i + 1]])
        if x.dtype == np.uint16:
            return (x.astype(np.uint32) << 16).view(np.float32)
        return x.astype(np.float32)

    def padded_queries(self, n=None):
        """The first n queries as one zero-padded float32 array [n, Lmax, d]."""
        qs = self.queries[: (n or len(self.queries))]
        out = np.zeros((len(qs), self.query_len, self.dim), dtype=np.float32)
        for i, q in enumerate(qs):
            out[i, : len(q)] = q
        return out

    def describe(self):
        return {"path": self.path, "name": self.name, "documents": self.n_docs,
                "tokens": self.n_tokens, "dim": self.dim, "dtype": self.dtype,
                "queries": len(self.queries), "query_tokens": self.query_len}


def machine_info():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    cpu = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = None
    try:
        load = [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except (OSError, ValueError):
        pass
    commit = None
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cores": os.cpu_count(),
            "python": platform.python_version(), "load": load, "commit": commit}


def pkg_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Recorder:
    """Appends JSON lines to a file; every record carries the run's common fields."""

    def __init__(self, path, engine, version, corpus, device, extra=None):
        """corpus: a Corpus, or a dict of name, documents and tokens."""
        self.path = path
        if isinstance(corpus, dict):
            name, docs, toks = corpus["name"], corpus["documents"], corpus["tokens"]
        else:
            name, docs, toks = corpus.name, corpus.n_docs, corpus.n_tokens
        self.base = {"engine": engine, "version": version, "corpus": name,
                     "documents": docs, "tokens": toks,
                     "device": device, "device_kind": "cpu" if device == "cpu" else "gpu",
                     "machine": machine_info()}
        if extra:
            self.base.update(extra)

    def write(self, rec):
        r = dict(self.base)
        r["date"] = now_utc()
        r.update(rec)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(r) + "\n")
        return r


class References:
    """The exact and tartan-exhaustive top k, read from TREC runs (either may be absent)."""

    def __init__(self, exact_path, tartan_path, qids, k):
        self.k = k
        self.qids = qids
        self.exact = read_trec(exact_path, k) if exact_path else None
        self.tartan = read_trec(tartan_path, k) if tartan_path else None
        for name, ref in (("exact", self.exact), ("tartan", self.tartan)):
            if ref is not None and not any(q in ref for q in qids):
                sys.exit(f"no query of the {name} reference matches query_ids.txt")

    def score(self, got):
        return {"recall_exact": recall(got, self.exact, self.qids, self.k),
                "recall_tartan": recall(got, self.tartan, self.qids, self.k)}


def measure(search_batch, search_one, nq, repeats, latency_nq, ids_of, sync=None,
            max_batch_s=None):
    """Times one setting. search_batch(n) searches the first n queries in one call and
    returns per query a list of document numbers (best first); search_one(i) searches query
    i alone. ids_of maps document numbers to ids. Returns (figures, top lists as ids).

    With max_batch_s, a warm-up batch slower than that is not repeated (its time counts)."""
    sync = sync or (lambda: None)
    t0 = time.perf_counter()
    res = search_batch(nq)
    sync()
    first = time.perf_counter() - t0
    times = [first] if max_batch_s and first > max_batch_s else []
    cpu = [float("nan")] if times else []
    for _ in range(repeats if not times else 0):
        c0 = time.process_time()
        t0 = time.perf_counter()
        res = search_batch(nq)
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    best = min(range(len(times)), key=times.__getitem__)
    # CPU seconds of the process (all its threads) in the fastest batch: on a shared machine
    # queries per CPU second stays put where wall-clock rates drop with the load
    out = {"nq": nq, "batch_s": times, "batch_qps": nq / times[best],
           "batch_cpu_s": cpu, "qps_per_cpu_s": nq / cpu[best] if cpu[best] > 0 else None,
           "warmup_s": first}
    lat_n = min(latency_nq, nq)
    if lat_n > 0:
        for i in range(min(5, lat_n)):
            search_one(i)
        sync()
        lat = []
        for i in range(lat_n):
            t0 = time.perf_counter()
            search_one(i)
            sync()
            lat.append((time.perf_counter() - t0) * 1e3)
        lat.sort()
        out.update({"latency_queries": lat_n, "latency_p50_ms": percentile(lat, 50),
                    "latency_p99_ms": percentile(lat, 99),
                    "latency_mean_ms": sum(lat) / len(lat)})
    got = [[ids_of(j) for j in r] for r in res]
    out["queries_short_of_k"] = None
    return out, got


def finish_setting(rec, got, refs, threads, device, k):
    """Adds recall and per-core figures to a measured setting."""
    rec.update(refs.score(got))
    rec["queries_short_of_k"] = sum(1 for g in got if len(g) < k)
    rec["threads"] = threads
    cores = threads if device == "cpu" else 1
    rec["qps_per_core"] = rec["batch_qps"] / max(1, cores)
    return rec


def write_trec(path, qids, got, scores=None, tag="run"):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for qi, q in enumerate(qids):
            for r, d in enumerate(got[qi], 1):
                s = scores[qi][r - 1] if scores else float(len(got[qi]) - r)
                f.write(f"{q} Q0 {d} {r} {s:.6f} {tag}\n")
    os.replace(tmp, path)


def common_args(ap, default_threads=1):
    """The options every driver shares."""
    ap.add_argument("--corpus", required=True, help="directory written by `tartan gen`")
    ap.add_argument("--exact", default=None, help="TREC run of exact MaxSim (peers_common.py exact)")
    ap.add_argument("--tartan-exhaustive", default=None,
                    help="TREC run of `tartan search --exhaustive`")
    ap.add_argument("--index-dir", required=True, help="where the engine's index lives")
    ap.add_argument("--build", action="store_true", help="build the index (timed) first")
    ap.add_argument("--no-search", action="store_true", help="build only")
    ap.add_argument("--threads", type=int, default=default_threads,
                    help="CPU threads for search (and for the build)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--nq", type=int, default=0, help="first N queries (default all)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2, help="timed batched calls (best counts)")
    ap.add_argument("--latency-nq", type=int, default=100, help="queries timed one a call")
    ap.add_argument("--out", default=None, help="JSON lines appended here")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop starting new settings after this many seconds (0: no limit)")
    ap.add_argument("--max-batch-s", type=float, default=20,
                    help="a warm-up batch slower than this is timed once, not repeated")
    ap.add_argument("--defaults-only", action="store_true", help="the engine's defaults only")
    return ap


# ---- exact MaxSim --------------------------------------------------------------------


def exact_topk(torch, corpus, queries, k, device, threads=0):
    """Exact MaxSim of every document on the original vectors, fp32 (no TF32).

    queries: list of [L_i, d] float32 arrays. Returns (scores [nq, k], doc numbers [nq, k]).
    Documents stream from the map in chunks whose score block stays under a fixed size."""
    if threads:
        torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    nq = len(queries)
    qlens = [len(q) for q in queries]
    Q = torch.from_numpy(np.concatenate(queries)).to(device=device, dtype=torch.float32)
    R = Q.shape[0]
    qseg = torch.repeat_interleave(torch.arange(nq, device=device),
                                   torch.tensor(qlens, device=device))
    lens, offs, emb = corpus.lens, corpus.offs, corpus.emb
    cap = (1 << 30 if str(device).startswith("cuda") else 1 << 25) // R
    cap = max(cap, int(lens.max()))
    best_s = torch.full((nq, 0), float("-inf"), device=device)
    best_i = torch.zeros((nq, 0), dtype=torch.int64, device=device)
    pad = torch.full((1, R), float("-inf"), device=device)
    n, d0 = len(lens), 0
    while d0 < n:
        d1 = int(np.searchsorted(offs, offs[d0] + cap, side="right")) - 1
        d1 = min(max(d1, d0 + 1), n)
        while d1 - d0 > 1 and (d1 - d0) * int(lens[d0:d1].max()) > cap:
            d1 = d0 + (d1 - d0) // 2
        t0, t1 = int(offs[d0]), int(offs[d1])
        x = np.asarray(emb[t0:t1])
        if x.dtype == np.uint16:
            x = (x.astype(np.uint32) << 16).view(np.float32)
        X = torch.from_numpy(np.array(x, dtype=np.float32)).to(device)  # a writable copy
        S = torch.cat([X @ Q.T, pad])  # [tokens + 1, R]; the last row pads short documents
        L = torch.from_numpy(lens[d0:d1]).to(device)
        lmax = int(lens[d0:d1].max())
        ar = torch.arange(lmax, device=device)
        idx = torch.from_numpy(offs[d0:d1] - t0).to(device)[:, None] + ar[None, :]
        idx = torch.where(ar[None, :] < L[:, None], idx, torch.full_like(idx, t1 - t0))
        tok = S[idx].amax(1)  # [docs, R]
        doc = torch.zeros((d1 - d0, nq), device=device).index_add_(1, qseg, tok).T
        cand_s = torch.cat([best_s, doc], 1)
        cand_i = torch.cat([best_i, torch.arange(d0, d1, device=device).expand(nq, -1)], 1)
        best_s, j = cand_s.topk(min(k, cand_s.shape[1]), dim=1)
        best_i = cand_i.gather(1, j)
        d0 = d1
    return best_s.cpu().numpy(), best_i.cpu().numpy()


def cmd_exact(argv):
    ap = argparse.ArgumentParser(prog="peers_common.py exact",
                                 description="exact MaxSim top k over the original vectors")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True, help="TREC run written here")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--nq", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    set_thread_env(a.threads)
    import torch

    c = Corpus(a.corpus, a.nq)
    t0 = time.perf_counter()
    with torch.inference_mode():
        s, i = exact_topk(torch, c, c.queries, a.k, a.device, a.threads)
    got = [[c.ids[j] for j in row] for row in i.tolist()]
    write_trec(a.out, c.qids, got, s.tolist(), tag="exact")
    log(f"exact MaxSim: {len(c.queries)} queries x {c.n_docs} documents on {a.device}, "
        f"{time.perf_counter() - t0:.1f} s -> {a.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "exact":
        cmd_exact(sys.argv[2:])
    else:
        sys.exit(__doc__)
