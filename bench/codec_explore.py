#!/usr/bin/env python3
"""codec_explore.py: what other residual codecs would give, on an index's own centroids and codes.

Reads a corpus (tartan gen's layout, or bench/scifact/embed.py's with ragged queries: see
bench/synth_stats.py, whose loader it shares) and the centroids and codes of an index built
from it (bench/index_dump INDEX DIR), and scores every
query's documents by exact MaxSim over (a) the original vectors and (b) each codec's
decompression normalise(C[code] + decoded residual), in float32 with NumPy. Prints recall@10 of
(b) against (a) and the residuals' mean squared error per token, for:
  - the scalar codec tartan stores (one pooled table of 2^B levels, Lloyd-Max from quantiles),
    at B = 2 and 3 bits a dimension;
  - product quantisation at the same bytes as B = 2: 4-dimension subspaces of 256 codewords
    (k-means on a sample of each subspace's residuals);
  - the centroids alone (no residual), as the floor;
  - scalar codes per axis (--axes): a Lloyd-Max table per dimension; the same in the residuals'
    principal axes (one global rotation), 2 bits each; and in those axes with the 2 d bits
    allocated by greedy reverse water-filling (1-4 bits an axis, the same 32 bytes at d 128);
    whole-byte widths; and those with each axis's levels additive in its index's bits
    (c0 + sum_k c_k bit_k: a decoder could score bits, with no table);
  - the rate-distortion bound at the same bits: the Gaussian test channel that an ideal codec
    of 2 bits a dimension approaches (reverse water-filling over the residuals' per-dimension
    variances; reconstruction a x + noise, error D a dimension), which no codec of those bytes
    beats on Gaussian residuals of these variances (the kurtosis printed says how Gaussian).
This is a simulation for choosing a codec (issue 19), not tartan's code path: the scalar row
should land near what bench/bench_fidelity measures on the real index.

    python3 bench/codec_explore.py CORPUS DUMPDIR [--queries N] [--pq-iters N] [--seed S] [--no-pq]
                                                  [--axes]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_stats import load_corpus_dump, maxsim_all  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("dump")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--pq-iters", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-pq", action="store_true", help="skip product quantisation (slowest)")
    ap.add_argument("--axes", action="store_true",
                    help="also per-axis tables, principal axes, and bits allocated per axis")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    emb, lens, starts, q, qstart, cent, codes = load_corpus_dump(a.corpus, a.dump,
                                                                 "codec_explore")
    emb = np.array(emb, dtype=np.float32)
    q = np.array(q, dtype=np.float32)
    nq = min(a.queries, len(qstart) - 1)
    emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    res = emb - cent[codes]

    def top10(x):
        out = np.empty((nq, 10), np.int64)
        for i in range(nq):
            s = maxsim_all(x @ q[qstart[i] : qstart[i + 1]].T, starts)
            out[i] = np.argsort(-s, kind="stable")[:10]
        return out

    exact = top10(emb)

    def report(name, rhat):
        x = cent[codes] + rhat
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        got = top10(x)
        rec = np.mean([len(set(g) & set(e)) / 10 for g, e in zip(got, exact)])
        mse = float(((res - rhat) ** 2).sum(1).mean())
        print(f"{name:44s} recall@10 {rec:.4f}  residual mse a token {mse:.5f}", flush=True)

    def scalar(bits, steps=10):
        v = res.ravel()
        nb = 1 << bits
        cut = np.quantile(v, np.arange(1, nb) / nb)
        for _ in range(steps):
            b = np.searchsorted(cut, v)
            w = np.array([v[b == j].mean() for j in range(nb)])
            cut = (w[:-1] + w[1:]) / 2
        return w[np.searchsorted(cut, res)].astype(np.float32)

    def pq(sub, bits=8, train=60000):
        out = np.empty_like(res)
        k = 1 << bits
        for s in range(0, res.shape[1], sub):
            x = res[:, s : s + sub]
            tr = x[rng.choice(len(x), min(train, len(x)), replace=False)]
            cb = tr[rng.choice(len(tr), k, replace=False)].copy()
            for _ in range(a.pq_iters):
                d2 = (tr**2).sum(1)[:, None] - 2 * tr @ cb.T + (cb**2).sum(1)[None]
                lab = d2.argmin(1)
                for j in range(k):
                    m = lab == j
                    if m.any():
                        cb[j] = tr[m].mean(0)
            d2 = (x**2).sum(1)[:, None] - 2 * x @ cb.T + (cb**2).sum(1)[None]
            out[:, s : s + sub] = cb[d2.argmin(1)]
        return out

    def lloyd(v, bits, steps=12):
        nb = 1 << bits
        cut = np.quantile(v, np.arange(1, nb) / nb)
        for _ in range(steps):
            b = np.searchsorted(cut, v)
            w = np.array([v[b == j].mean() if (b == j).any() else 0.0 for j in range(nb)])
            cut = (w[:-1] + w[1:]) / 2
        return cut, w

    def per_axis(r, bits):
        out = np.empty_like(r)
        fit = r[::5]
        for j in range(r.shape[1]):
            cut, w = lloyd(fit[:, j], int(bits[j]))
            out[:, j] = w[np.searchsorted(cut, r[:, j])]
        return out

    def additive(v, bits, steps=15):
        """Levels additive in the index's bits, c0 + sum_k c_k bit_k(idx) (bits + 1 numbers for
        2^bits levels), fitted by alternating least squares from the Lloyd-Max table: a decoder
        can then score the code's bits, as 0/1 values weighted by c, without a table."""
        nb = 1 << bits
        cut, w = lloyd(v, bits)
        basis = np.array([[1.0] + [(i >> k) & 1 for k in range(bits)] for i in range(nb)])
        idx = np.searchsorted(cut, v)
        lev = w
        for _ in range(steps):
            cnt = np.bincount(idx, minlength=nb).astype(np.float64)
            tot = np.bincount(idx, weights=v, minlength=nb)
            c = np.linalg.lstsq(basis.T @ (cnt[:, None] * basis), basis.T @ tot, rcond=None)[0]
            lev = basis @ c
            order = np.argsort(lev)
            sl = lev[order]
            idx = order[np.searchsorted((sl[:-1] + sl[1:]) / 2, v)]
        order = np.argsort(lev)
        sl = lev[order]
        return (sl[:-1] + sl[1:]) / 2, sl

    def per_axis_additive(r, bits):
        out = np.empty_like(r)
        fit = r[::5]
        for j in range(r.shape[1]):
            if bits[j] == 0:
                out[:, j] = 0.0
                continue
            cut, sl = additive(fit[:, j].astype(np.float64), int(bits[j]))
            out[:, j] = sl[np.searchsorted(cut, r[:, j])]
        return out

    def axes_rows():
        d = res.shape[1]
        report("scalar, a table per dimension, 2 bits", per_axis(res, np.full(d, 2)))
        ev, vec = np.linalg.eigh(np.cov(res[::3].T))
        ev, vec = ev[::-1], vec[:, ::-1]
        print(f"principal axes: variance top {ev[0]:.5f}, median {np.median(ev):.5f}, "
              f"least {ev[-1]:.5f}; top 10 hold {ev[:10].sum() / ev.sum():.3f}")
        rot = res @ vec
        report("principal axes, a table each, 2 bits", per_axis(rot, np.full(d, 2)) @ vec.T)
        bits, var = np.zeros(d, int), ev.copy()
        for _ in range(2 * d):  # each bit to the axis whose error it lowers most (var / 4)
            j = int(np.argmax(np.where(bits < 4, var, -1.0)))
            bits[j] += 1
            var[j] /= 4
        print("bits an axis (0..4):", np.bincount(bits, minlength=5).tolist())
        report("principal axes, 1-4 bits allocated (2 d bits)", per_axis(rot, bits) @ vec.T)
        # Widths 4, 2, 1 and 0 only, each width's axes filling whole bytes (4-bit axes in
        # pairs, 2-bit in fours, 1-bit in eights), so that every packed byte holds one width
        # and a decoder reads it with one table per byte: the counts with the least modelled
        # error (Lloyd-Max Gaussian distortion per bit width) over all that spend 2 d bits.
        dist = {0: 1.0, 1: 0.3634, 2: 0.1175, 4: 0.009497}
        best = None
        for n4 in range(0, d + 1, 2):
            for n2 in range(0, d - n4 + 1, 4):
                n1 = 2 * d - 4 * n4 - 2 * n2
                if n1 < 0 or n1 % 8 or n4 + n2 + n1 > d:
                    continue
                w = np.array([4] * n4 + [2] * n2 + [1] * n1 + [0] * (d - n4 - n2 - n1))
                err = float((ev * np.array([dist[int(b)] for b in w])).sum())
                if best is None or err < best[0]:
                    best = (err, w)
        w = best[1]
        print("whole-byte widths (0, 1, 2, 4 bits):",
              [int((w == b).sum()) for b in (0, 1, 2, 4)])
        report("principal axes, 0/1/2/4 bits in whole bytes", per_axis(rot, w) @ vec.T)
        report("the same, levels additive in the bits", per_axis_additive(rot, w) @ vec.T)
        w2 = np.full(d, 2)
        report("principal axes, 2 bits each, additive in the bits",
               per_axis_additive(rot, w2) @ vec.T)

    def rd_bound(bits):
        mean = res.mean(0)
        var = np.maximum(res.var(0), 1e-20)
        lo, hi = 0.0, float(var.max())
        for _ in range(100):  # water level theta: sum of 0.5 log2(var / min(theta, var)) = bits d
            th = (lo + hi) / 2
            rate = 0.5 * np.log2(var / np.minimum(th, var)).sum()
            lo, hi = (th, hi) if rate > bits * len(var) else (lo, th)
        dist = np.minimum(hi, var)
        alpha = 1 - dist / var
        noise = rng.standard_normal(res.shape).astype(np.float32)
        return (mean + alpha * (res - mean) + np.sqrt(alpha * dist) * noise).astype(np.float32)

    t0 = time.time()
    print(f"{emb.shape[0]} tokens of d {emb.shape[1]}, {len(lens)} documents, K {len(cent)}, "
          f"{nq} queries")
    report("centroids alone", np.zeros_like(res))
    report("scalar, 2 bits a dimension (tartan's)", scalar(2))
    if not a.no_pq:
        report("PQ, 4-dim subspaces x 256 (2 bits a dim)", pq(4))
    if a.axes:
        axes_rows()
    report("rate-distortion bound, 2 bits a dimension", rd_bound(2))
    report("scalar, 3 bits a dimension", scalar(3))
    z = (res - res.mean(0)) / np.maximum(res.std(0), 1e-12)
    print(f"residual coordinates: excess kurtosis {float((z**4).mean() - 3):.3f} (0 if Gaussian)")
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
