#!/usr/bin/env python3
"""fast-plaid on a `tartan gen` corpus: the peer side of bench_search's GPU figures.

    python3 bench/peers_fastplaid.py --corpus DIR --reference REF.run [--nq N] [--k 10]
        [--device cuda|cpu] [--threads N] [--jsonl peers.jsonl] [--exact-truth exact.trec]
        [--out fastplaid.json] [--run fastplaid.run]
        [--sweep-run fastplaid-sweep.run] [--index-dir DIR] [--reuse-index]
        [--nbits 2] [--centroids K] [--kmeans-iters 4] [--probes 1,2,4,8,16,32]
        [--full-scores 256,1024,4096,16384] [--latency-nq 300] [--repeats 3]
        [--match-recall R] [--max-seconds S] [--exact-run exact.run]

Reads the corpus as `tartan gen` writes it (embeddings.npy [T, d] float32 / float16 /
bfloat16-as-uint16, doclens.npy [N], ids.txt, queries.npy [Q, L, d], query_ids.txt) through
numpy memory maps, hands fast-plaid one tensor per document (views of the map: no copy of the
corpus in host memory; fast-plaid converts each document to fp16 as it batches them), and
times its index build. Then, for fast-plaid's default search parameters and for every pair of
the n_ivf_probe x n_full_scores grid:

- batched queries/s: all N queries in one search() call, best of --repeats after a warm-up call;
- single-query latency p50/p99: one query per call, torch.cuda.synchronize() after each, over
  the first --latency-nq queries after 10 warm-up calls;
- recall@k against the reference run (tartan search --exhaustive): the share of the
  reference's top k that fast-plaid's top k holds, averaged over the queries;
- GPU memory: torch.cuda.max_memory_allocated over the setting, and device memory in use.

CPU mode (--device cpu --threads N, issue 22): every thread pool (OpenMP, BLAS, rayon, torch)
is pinned to N threads before torch loads; a batch runs as fast-plaid's own CPU batch path does,
N joblib worker threads over slices of the queries (its n_processes) with torch's intra-op
threads at 1, so N threads in all; a single query runs on torch's intra-op threads (N).
--jsonl appends one line a setting in the common format of bench/peers_common.py (the
side-by-side table and plot, bench/peers_plot.py, read it); --exact-truth reads exact MaxSim's
top k from a TREC run (bench/peers_common.py exact) instead of computing it.

Writes the JSON after every setting (so a run cut short keeps what it measured), the default
setting's top k as a TREC run (--run) and, with --sweep-run, every setting's top k in one
TREC file whose tag column names the setting (fastplaid-p{probe}-f{full}).

The reference run (tartan's exhaustive search) scores tartan's own compressed index, so
fast-plaid, with its own centroids and residual buckets, cannot reach recall 1 against it even
when it scores every document. With --exact-run, the script also computes exact MaxSim of every
document on the uncompressed embeddings (fp32), writes that top k as a TREC run, and reports
each setting's recall against it and the reference run's own recall against it.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import types
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_common as pc  # noqa: E402

DEFAULT_PROBE = 8  # fast-plaid's FastPlaid.search defaults (1.7.0)
DEFAULT_FULL = 4096


def log(*a):
    print(*a, flush=True)


def int_list(s):
    return [int(x) for x in s.split(",") if x.strip()]


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


def load_corpus(d):
    emb = np.load(os.path.join(d, "embeddings.npy"), mmap_mode="r")
    lens = np.load(os.path.join(d, "doclens.npy")).astype(np.int64)
    ids_path = os.path.join(d, "ids.txt")
    ids = read_lines(ids_path) if os.path.exists(ids_path) else [str(i) for i in range(len(lens))]
    qs = np.load(os.path.join(d, "queries.npy"))
    qid_path = os.path.join(d, "query_ids.txt")
    qids = read_lines(qid_path) if os.path.exists(qid_path) else [str(i) for i in range(len(qs))]
    if emb.ndim != 2 or qs.ndim != 3 or lens.ndim != 1:
        sys.exit("corpus: need embeddings.npy [T, d], queries.npy [Q, L, d], doclens.npy [N]")
    if int(lens.sum()) != emb.shape[0]:
        sys.exit(f"corpus: doclens sum {int(lens.sum())} != embeddings rows {emb.shape[0]}")
    if (lens <= 0).any():
        sys.exit("corpus: a document has no tokens (fast-plaid needs at least one)")
    if len(ids) != len(lens) or len(qids) != len(qs):
        sys.exit("corpus: ids.txt / query_ids.txt line counts do not match doclens / queries")
    if qs.shape[2] != emb.shape[1]:
        sys.exit("corpus: queries and documents differ in dimension")
    return emb, lens, ids, qs, qids


def doc_tensors(torch, emb, lens):
    """One tensor per document, each a view of the memory map (no copy)."""
    bf16 = emb.dtype == np.uint16  # tartan's bfloat16 files: uint16 bit patterns
    if emb.dtype not in (np.float32, np.float16, np.uint16):
        sys.exit(f"embeddings.npy: unsupported dtype {emb.dtype}")
    offs = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only map: torch warns that it is not writable
        for i in range(len(lens)):
            t = torch.from_numpy(emb[offs[i] : offs[i + 1]])
            out.append(t.view(torch.bfloat16) if bf16 else t)
    return out


def query_tensor(torch, qs_np, nq):
    """The first nq queries as a CPU tensor (bfloat16 files are uint16 bit patterns)."""
    t = torch.from_numpy(np.ascontiguousarray(qs_np[:nq]))
    return t.view(torch.bfloat16) if qs_np.dtype == np.uint16 else t


def exact_topk(torch, emb, lens, queries, k, device):
    """Brute-force MaxSim of every document on the uncompressed embeddings, fp32 throughout.

    Returns (scores [nq, k], document numbers [nq, k]). Documents stream from the map in
    chunks whose padded score block [docs, longest, nq * Lq] stays under a fixed size.
    """
    torch.set_float32_matmul_precision("highest")  # no TF32: this is the reference
    nq, lq, d = queries.shape
    Q = queries.reshape(nq * lq, d).to(device=device, dtype=torch.float32)
    R = Q.shape[0]
    cap = (1 << 30 if str(device).startswith("cuda") else 1 << 26) // R  # padded tokens a chunk
    cap = max(cap, int(lens.max()))
    offs = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    best_s = torch.full((nq, 0), float("-inf"), device=device)
    best_i = torch.zeros((nq, 0), dtype=torch.int64, device=device)
    n, d0 = len(lens), 0
    pad = torch.full((1, R), float("-inf"), device=device)
    while d0 < n:
        d1 = int(np.searchsorted(offs, offs[d0] + cap, side="right")) - 1
        d1 = min(max(d1, d0 + 1), n)
        while d1 - d0 > 1 and (d1 - d0) * int(lens[d0:d1].max()) > cap:
            d1 = d0 + (d1 - d0) // 2
        t0, t1 = int(offs[d0]), int(offs[d1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only map; the tensor is only read
            X = torch.from_numpy(np.ascontiguousarray(emb[t0:t1]))
        if emb.dtype == np.uint16:
            X = X.view(torch.bfloat16)
        X = X.to(device=device).float()
        S = torch.cat([X @ Q.T, pad])  # [tokens + 1, R]; the last row pads short documents
        L = torch.from_numpy(lens[d0:d1]).to(device)
        lmax = int(lens[d0:d1].max())
        ar = torch.arange(lmax, device=device)
        idx = (torch.from_numpy(offs[d0:d1] - t0).to(device)[:, None] + ar[None, :])
        idx = torch.where(ar[None, :] < L[:, None], idx, torch.full_like(idx, t1 - t0))
        doc = S[idx].amax(1).view(d1 - d0, nq, lq).sum(2).T  # [nq, docs]
        cand_s = torch.cat([best_s, doc], 1)
        cand_i = torch.cat([best_i, torch.arange(d0, d1, device=device).expand(nq, -1)], 1)
        kk = min(k, cand_s.shape[1])
        best_s, j = cand_s.topk(kk, dim=1)
        best_i = cand_i.gather(1, j)
        d0 = d1
    return best_s.cpu(), best_i.cpu()


def recall(got_lists, ref, qids, k):
    """Mean over queries with reference lines of |top k & reference top k| / |reference|."""
    tot, n = 0.0, 0
    for qi, q in enumerate(qids):
        r = ref.get(q)
        if not r:
            continue
        tot += len(set(got_lists[qi][:k]) & set(r)) / len(r)
        n += 1
    return tot / n if n else float("nan")


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
        commit = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip() or None
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


class Gpu:
    """Memory and synchronisation, no-ops on the CPU."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.startswith("cuda")

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def snapshot(self):
        if not self.cuda:
            return {}
        c = self.torch.cuda
        c.synchronize()
        free, total = c.mem_get_info()
        return {
            "max_allocated_bytes": c.max_memory_allocated(),
            "max_reserved_bytes": c.max_memory_reserved(),
            "allocated_bytes": c.memory_allocated(),
            "device_used_bytes": total - free,
            "device_total_bytes": total,
        }


def stub_usearch():
    """fast-plaid imports usearch at load time for its CPU update path (outliers against the
    centroids), which this benchmark never calls; where usearch is missing (the GPU host, to
    keep numkong's 11 MB out of what a call carries) a stub stands in that fails if used."""
    try:
        import usearch.index  # noqa: F401
    except ImportError:
        mod, sub = types.ModuleType("usearch"), types.ModuleType("usearch.index")

        class Index:
            def __init__(self, *args, **kwargs):
                raise RuntimeError("usearch is stubbed: fast-plaid's update path is not measured")

        sub.Index = Index
        mod.index = sub
        sys.modules["usearch"], sys.modules["usearch.index"] = mod, sub


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, help="directory written by `tartan gen`")
    ap.add_argument("--reference", required=True, help="TREC run of tartan search --exhaustive")
    ap.add_argument("--nq", type=int, default=0, help="first N queries (default all)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--device", default="cuda", help="cuda (cuda:N) or cpu")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads: every pool pinned to N, joblib workers for batches "
                    "(default: leave fast-plaid's own choice)")
    ap.add_argument("--jsonl", default=None,
                    help="also append one JSON line a setting (bench/peers_common.py format)")
    ap.add_argument("--build-only", action="store_true",
                    help="build the index into --index-dir (kept), record it, search nothing")
    ap.add_argument("--exact-truth", default=None,
                    help="TREC run of exact MaxSim (bench/peers_common.py exact): recall "
                    "against it, without computing it here")
    ap.add_argument("--out", default="fastplaid.json", help="JSON of every figure")
    ap.add_argument("--run", default=None, help="TREC run of the default setting "
                    "(default: --out with .run)")
    ap.add_argument("--sweep-run", default=None, help="TREC run of every setting, tag per setting")
    ap.add_argument("--exact-run", default=None,
                    help="also compute exact MaxSim on the uncompressed embeddings (fp32, on "
                    "--device), write its top k there and report recall against it too")
    ap.add_argument("--index-dir", default=None,
                    help="where fast-plaid writes its index (default: a temporary directory, "
                    "removed at the end)")
    ap.add_argument("--reuse-index", action="store_true",
                    help="search the index already in --index-dir instead of building")
    ap.add_argument("--nbits", type=int, default=2)
    ap.add_argument("--centroids", type=int, default=0,
                    help="k-means centroids (default fast-plaid's: 2^floor(log2(16 sqrt(T))))")
    ap.add_argument("--kmeans-iters", type=int, default=4)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--probes", type=int_list, default=[1, 2, 4, 8, 16, 32],
                    help="n_ivf_probe values of the sweep (cells per query token)")
    ap.add_argument("--full-scores", type=int_list, default=[256, 1024, 4096, 16384],
                    help="n_full_scores values of the sweep (candidates kept after the "
                    "centroid-only scores; a quarter of them are decompressed)")
    ap.add_argument("--latency-nq", type=int, default=300,
                    help="queries timed one per call for p50/p99 (default 300)")
    ap.add_argument("--repeats", type=int, default=3, help="batched calls timed (best of)")
    ap.add_argument("--match-recall", type=float, default=None,
                    help="also report the fastest setting (batched) with recall >= this")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="measure no further sweep setting once this much time has passed "
                    "since the start (0: no limit; the default setting and --exact-run always "
                    "run); what was measured is kept")
    a = ap.parse_args()
    t_start = time.perf_counter()
    pc.set_thread_env(a.threads)

    import torch

    if a.threads > 0:
        torch.set_num_threads(a.threads)

    stub_usearch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import fast_plaid.search.fast_plaid as fp_mod
        from fast_plaid import search as fp_search

    dev = a.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda, but torch sees no GPU")
    gpu = Gpu(torch, dev)
    if gpu.cuda:
        torch.cuda.set_device(torch.device(dev if ":" in dev else "cuda:0"))  # memory stats' device
    run_path = a.run or (os.path.splitext(a.out)[0] + ".run")

    emb, lens, ids, qs_np, qids = load_corpus(a.corpus)
    nq = len(qs_np) if a.nq <= 0 else min(a.nq, len(qs_np))
    ref = read_trec(a.reference, a.k)
    qids = qids[:nq]
    if not any(q in ref for q in qids):
        # a reference written without --query-ids names queries by row number
        if any(str(i) in ref for i in range(nq)):
            log("reference names queries by row number; using 0..N-1")
            qids = [str(i) for i in range(nq)]
        else:
            sys.exit("no query of the reference run matches query_ids.txt")
    missing = sum(1 for q in qids if q not in ref)
    if missing:
        log(f"warning: {missing} of {nq} queries have no reference lines; left out of recall")
    # fast-plaid searches in fp16 (it converts whatever it is given): convert once, untimed
    queries = query_tensor(torch, qs_np, nq).half()

    info = {
        "tool": "fast-plaid",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(),
        "device": (torch.cuda.get_device_name() if gpu.cuda
                   else "cpu (" + machine_info()["cpu"] + ")"),
        "device_arg": dev,
        "versions": {
            "fast_plaid": pkg_version("fast-plaid"),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "fastkmeans": pkg_version("fastkmeans"),
            "usearch": pkg_version("usearch"),
            "numpy": np.__version__,
        },
        "corpus": {
            "path": os.path.abspath(a.corpus),
            "documents": int(len(lens)),
            "tokens": int(emb.shape[0]),
            "dim": int(emb.shape[1]),
            "dtype": str(emb.dtype) if emb.dtype != np.uint16 else "bfloat16",
            "queries": nq,
            "query_tokens": int(qs_np.shape[1]),
        },
        "reference": os.path.abspath(a.reference),
        "recall_queries": nq - missing,
        "k": a.k,
        "settings": [],
    }
    log(f"fast-plaid {info['versions']['fast_plaid']}, torch {torch.__version__}, "
        f"device {info['device']}")
    log(f"corpus {a.corpus}: {len(lens)} documents, {emb.shape[0]} tokens, d {emb.shape[1]}, "
        f"{info['corpus']['dtype']}; {nq} queries of {qs_np.shape[1]} tokens")

    exact_truth = read_trec(a.exact_truth, a.k) if a.exact_truth else None
    recorder = None
    if a.jsonl:
        recorder = pc.Recorder(
            a.jsonl, "fast-plaid", info["versions"]["fast_plaid"],
            {"name": os.path.basename(os.path.abspath(a.corpus).rstrip("/")),
             "documents": int(len(lens)), "tokens": int(emb.shape[0])},
            torch.cuda.get_device_name() if gpu.cuda else "cpu",
            {"torch": torch.__version__, "device_arg": dev})

    def write_json():
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(info, f, indent=1)
        os.replace(tmp, a.out)

    # ---- build ----------------------------------------------------------------------
    own_tmp = a.index_dir is None
    if a.build_only and (own_tmp or a.reuse_index):
        sys.exit("--build-only needs --index-dir and no --reuse-index")
    if a.index_dir and not a.reuse_index and os.path.isdir(a.index_dir):
        # create() deletes every *.json and *.npy in its directory before writing
        if (os.path.realpath(a.index_dir) == os.path.realpath(a.corpus)
                or any(os.path.exists(os.path.join(a.index_dir, f))
                       for f in ("embeddings.npy", "doclens.npy", "queries.npy"))):
            sys.exit(f"--index-dir {a.index_dir} holds a corpus: fast-plaid's create() would "
                     "delete its .npy files; give an empty or new directory")
    index_dir = a.index_dir or tempfile.mkdtemp(prefix="fastplaid-idx-")
    build = {"index_dir": index_dir, "nbits": a.nbits, "kmeans_iters": a.kmeans_iters,
             "seed": a.seed}
    try:
        gpu.reset_peak()
        t0 = time.perf_counter()
        fp = fp_search.FastPlaid(index=index_dir, device=dev)  # loads an index already there
        gpu.sync()
        ctor_s = time.perf_counter() - t0
        if not a.reuse_index:
            if a.centroids > 0:
                # create() has no centroid-count argument; its k-means helper has one.
                orig = fp_mod.compute_kmeans

                def fixed_k(*args, **kw):
                    kw["num_partitions"] = a.centroids
                    return orig(*args, **kw)

                fp_mod.compute_kmeans = fixed_k
            t0 = time.perf_counter()
            docs = doc_tensors(torch, emb, lens)
            build["prepare_s"] = time.perf_counter() - t0
            gpu.reset_peak()
            t0 = time.perf_counter()
            fp.create(documents_embeddings=docs, nbits=a.nbits, kmeans_niters=a.kmeans_iters,
                      seed=a.seed)
            gpu.sync()
            build["build_s"] = time.perf_counter() - t0
            build["gpu"] = gpu.snapshot()
            del docs
            log(f"build: {build['build_s']:.2f} s (+ {build['prepare_s']:.2f} s to make "
                f"{len(lens)} document views)")
        else:
            build["reused"] = True
        build["index_bytes"] = dir_bytes(index_dir)
        try:
            build["centroids"] = int(np.load(os.path.join(index_dir, "centroids.npy"),
                                             mmap_mode="r").shape[0])
        except (OSError, ValueError):
            build["centroids"] = None
        # fast-plaid loads a new index onto the device at the first search: do that here, timed
        # (an index reused from disk was loaded by the constructor: its time counts instead)
        if not a.reuse_index:
            gpu.reset_peak()
        t0 = time.perf_counter()
        fp._check_and_reload_index(blocking=True)
        gpu.sync()
        build["load_s"] = time.perf_counter() - t0 + (ctor_s if a.reuse_index else 0.0)
        build["gpu_after_load"] = gpu.snapshot()
        try:
            from fast_plaid.search import load as fp_load

            data = fp_load._load_index_tensors_cpu(index_path=index_dir)
            build["index_gpu_memory_tier"] = fp_load._resolve_index_gpu_memory(
                data, dev, fp.index_gpu_memory, fp.index_memory_fraction)
            del data
        except Exception as e:  # noqa: BLE001 (private API: informative only)
            build["index_gpu_memory_tier"] = f"unknown ({e})"
        info["build"] = build
        if recorder is not None and "build_s" in build:
            recorder.write({"kind": "build", "threads": a.threads if not gpu.cuda else 1,
                            "build_s": build["build_s"], "index_bytes": build["index_bytes"],
                            "bytes_per_token": build["index_bytes"] / int(emb.shape[0]),
                            "params": {"nbits": a.nbits, "centroids": build["centroids"],
                                       "kmeans_iters": a.kmeans_iters}})
        log(f"index: {build['centroids']} centroids, nbits {a.nbits}, "
            f"{build['index_bytes'] / 2**20:.1f} MiB on disk, load {build['load_s']:.2f} s, "
            f"placement {build['index_gpu_memory_tier']}")
        write_json()
        if a.build_only:
            return

        # ---- search settings ---------------------------------------------------------
        grid = [(DEFAULT_PROBE, DEFAULT_FULL)]
        for f in sorted(a.full_scores):
            for p in sorted(a.probes):
                if (p, f) not in grid:
                    grid.append((p, f))
        lat_n = min(a.latency_nq, nq)
        sweep_f = open(a.sweep_run + ".tmp", "w") if a.sweep_run else None
        tops = {}

        cpu_threads = a.threads if (a.threads > 0 and not gpu.cuda) else 0

        def search(q, p, f):
            kw = {}
            if cpu_threads:
                # a batch: cpu_threads joblib workers, one torch thread each; one query:
                # torch's intra-op threads
                one = q.shape[0] == 1
                torch.set_num_threads(cpu_threads if one else 1)
                kw["n_processes"] = 1 if one else min(cpu_threads, q.shape[0])
            r = fp.search(queries_embeddings=q, top_k=a.k, n_ivf_probe=p, n_full_scores=f,
                          show_progress=False, **kw)
            gpu.sync()
            return r

        for gi, (p, f) in enumerate(grid):
            if gi and a.max_seconds and time.perf_counter() - t_start > a.max_seconds:
                log(f"--max-seconds reached: {len(grid) - gi} settings left unmeasured")
                info["sweep_cut_short"] = len(grid) - gi
                break
            s = {"name": "default" if gi == 0 else "sweep", "n_ivf_probe": p,
                 "n_full_scores": f}
            try:
                gpu.reset_peak()
                res = search(queries, p, f)  # warm-up, and the results scored below
                times, cpu = [], []
                for _ in range(a.repeats):
                    c0 = time.process_time()
                    t0 = time.perf_counter()
                    res = search(queries, p, f)
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                s["batch_s"] = times
                s["batch_qps"] = nq / min(times)
                s["batch_cpu_s"] = cpu
                cb = cpu[times.index(min(times))]
                s["qps_per_cpu_s"] = nq / cb if cb > 0 else None
                for i in range(min(10, nq)):
                    search(queries[i : i + 1], p, f)
                lat = []
                for i in range(lat_n):
                    t0 = time.perf_counter()
                    search(queries[i : i + 1], p, f)
                    lat.append((time.perf_counter() - t0) * 1e3)
                lat.sort()
                s["latency_queries"] = lat_n
                s["latency_p50_ms"] = percentile(lat, 50)
                s["latency_p99_ms"] = percentile(lat, 99)
                s["latency_mean_ms"] = sum(lat) / len(lat) if lat else float("nan")
                s["gpu"] = gpu.snapshot()
                got = [[ids[pid] for pid, _ in res[qi][: a.k]] for qi in range(nq)]
                tops[gi] = got
                s["recall_at_k"] = recall(got, ref, qids, a.k)
                if exact_truth is not None:
                    s["recall_at_k_exact"] = recall(got, exact_truth, qids, a.k)
                s["queries_short_of_k"] = sum(1 for g in got if len(g) < a.k)
                lines = []
                tag = "fastplaid" if gi == 0 else f"fastplaid-p{p}-f{f}"
                for qi in range(nq):
                    for rank, (pid, score) in enumerate(res[qi][: a.k], 1):
                        lines.append(f"{qids[qi]} Q0 {ids[pid]} {rank} {score:.6f} {tag}\n")
                if gi == 0:
                    with open(run_path + ".tmp", "w") as rf:
                        rf.writelines(lines)
                    os.replace(run_path + ".tmp", run_path)
                if sweep_f:
                    sweep_f.writelines(lines if gi else
                                       [ln.replace(" fastplaid\n", f" fastplaid-p{p}-f{f}\n")
                                        for ln in lines])
            except Exception as e:  # noqa: BLE001 (e.g. device out of memory: keep going)
                s["error"] = f"{type(e).__name__}: {e}"
                log(f"probe {p} full {f}: {s['error']}")
                if gpu.cuda:
                    torch.cuda.empty_cache()
            info["settings"].append(s)
            if recorder is not None and "recall_at_k" in s:
                recorder.write({
                    "kind": "search", "setting": "default" if gi == 0 else f"p{p}-f{f}",
                    "params": {"n_ivf_probe": p, "n_full_scores": f, "nbits": a.nbits},
                    "threads": a.threads if not gpu.cuda else 1, "nq": nq,
                    "batch_s": s["batch_s"], "batch_qps": s["batch_qps"],
                    "batch_cpu_s": s["batch_cpu_s"], "qps_per_cpu_s": s["qps_per_cpu_s"],
                    "qps_per_core": s["batch_qps"] / (max(1, a.threads) if not gpu.cuda else 1),
                    "latency_queries": s["latency_queries"],
                    "latency_p50_ms": s["latency_p50_ms"], "latency_p99_ms": s["latency_p99_ms"],
                    "latency_mean_ms": s["latency_mean_ms"],
                    "recall_exact": s.get("recall_at_k_exact"), "recall_tartan": s["recall_at_k"],
                    "queries_short_of_k": s["queries_short_of_k"],
                    "load_s": info["build"].get("load_s")})
            if "recall_at_k" in s:
                log(f"{s['name']:7s} probe {p:3d} full {f:6d}: {s['batch_qps']:10.1f} q/s "
                    f"batched, p50 {s['latency_p50_ms']:8.2f} ms, p99 "
                    f"{s['latency_p99_ms']:8.2f} ms, recall@{a.k} {s['recall_at_k']:.4f}")
            write_json()
        if sweep_f:
            sweep_f.close()
            os.replace(a.sweep_run + ".tmp", a.sweep_run)
        if a.exact_run:
            # after the sweep, so that its memory does not count in fast-plaid's figures
            del fp
            if gpu.cuda:
                torch.cuda.empty_cache()
            t0 = time.perf_counter()
            try:
                es, ei = exact_topk(torch, emb, lens, query_tensor(torch, qs_np, nq).float(),
                                    a.k, dev)
                gpu.sync()
                ex = {q: [ids[j] for j in ei[qi].tolist()] for qi, q in enumerate(qids)}
                with open(a.exact_run + ".tmp", "w") as ef:
                    for qi, q in enumerate(qids):
                        for rank, (j, sc) in enumerate(zip(ei[qi].tolist(), es[qi].tolist()), 1):
                            ef.write(f"{q} Q0 {ids[j]} {rank} {sc:.6f} exact\n")
                os.replace(a.exact_run + ".tmp", a.exact_run)
                ref_lists = [ref.get(q, []) for q in qids]
                info["exact"] = {
                    "run": os.path.abspath(a.exact_run),
                    "seconds": time.perf_counter() - t0,
                    "reference_recall_at_k": recall(ref_lists, ex, qids, a.k),
                }
                for gi, s in enumerate(info["settings"]):
                    if gi in tops:
                        s["recall_at_k_exact"] = recall(tops[gi], ex, qids, a.k)
                log(f"exact MaxSim on the uncompressed embeddings: "
                    f"{info['exact']['seconds']:.1f} s; the reference run's recall@{a.k} against it "
                    f"{info['exact']['reference_recall_at_k']:.4f}")
            except Exception as e:  # noqa: BLE001
                info["exact"] = {"error": f"{type(e).__name__}: {e}"}
                log(f"exact reference failed: {info['exact']['error']}")
            write_json()
    finally:
        if own_tmp:
            shutil.rmtree(index_dir, ignore_errors=True)

    ok = [s for s in info["settings"] if "recall_at_k" in s]
    if a.match_recall is not None:
        m = [s for s in ok if s["recall_at_k"] >= a.match_recall]
        best = max(m, key=lambda s: s["batch_qps"]) if m else None
        info["match"] = {"recall_at_least": a.match_recall,
                         "setting": ({"n_ivf_probe": best["n_ivf_probe"],
                                      "n_full_scores": best["n_full_scores"]} if best else None)}
    info["total_s"] = time.perf_counter() - t_start
    write_json()

    # ---- table -------------------------------------------------------------------------
    b = info["build"]
    log("")
    log(f"fast-plaid {info['versions']['fast_plaid']} on {info['device']}, "
        f"{len(lens)} documents / {emb.shape[0]} tokens, {nq} queries, k {a.k}")
    if "build_s" in b:
        log(f"build {b['build_s']:.2f} s, load {b['load_s']:.2f} s, {b['centroids']} centroids, "
            f"nbits {a.nbits}, index {b['index_bytes'] / 2**20:.1f} MiB"
            + (f", GPU peak {b['gpu']['max_allocated_bytes'] / 2**30:.2f} GiB" if gpu.cuda else ""))
    has_ex = "reference_recall_at_k" in info.get("exact", {})
    hdr = (f"| setting | n_ivf_probe | n_full_scores | queries/s (batched) | p50 ms | p99 ms "
           f"| recall@{a.k} |" + (f" recall@{a.k} vs exact |" if has_ex else "")
           + (" GPU peak GiB |" if gpu.cuda else ""))
    log(hdr)
    log("|" + "---|" * (hdr.count("|") - 1))
    for s in info["settings"]:
        if "recall_at_k" not in s:
            log(f"| {s['name']} | {s['n_ivf_probe']} | {s['n_full_scores']} | error: "
                f"{s['error']} |")
            continue
        log(f"| {s['name']} | {s['n_ivf_probe']} | {s['n_full_scores']} | "
            f"{s['batch_qps']:,.1f} | {s['latency_p50_ms']:.2f} | {s['latency_p99_ms']:.2f} | "
            f"{s['recall_at_k']:.4f} |"
            + (f" {s['recall_at_k_exact']:.4f} |" if has_ex else "")
            + (f" {s['gpu']['max_allocated_bytes'] / 2**30:.2f} |" if gpu.cuda else ""))
    if has_ex:
        log(f"the reference run's own recall@{a.k} against exact: "
            f"{info['exact']['reference_recall_at_k']:.4f}")
    if "match" in info:
        log(f"fastest setting with recall@{a.k} >= {a.match_recall}: {info['match']['setting']}")
    log(f"wrote {a.out}, {run_path}" + (f", {a.sweep_run}" if a.sweep_run else ""))


if __name__ == "__main__":
    main()
