#!/usr/bin/env python3
"""codec_refine_sim.py: would a smarter encoder lift the 2-bit codec's fidelity?

    python3 bench/codec_refine_sim.py DUMP CORPUS [SWEEPS]

DUMP is `bench/index_dump INDEX DUMP` of an index built from CORPUS (a `tartan gen` directory
with embeddings.npy, doclens.npy and queries.npy [nq, lq, d]). With the index's centroids and
codes and pooled 2-bit Lloyd-Max tables fitted here (as idx_codec_fit fits them), it encodes
every token twice: each dimension's nearest bucket (what tartan does), then SWEEPS (2) rounds
of coordinate descent that change one dimension's bucket at a time wherever that raises the
cosine of the normalised reconstruction with the original token (the kernels' format and
bytes unchanged: only the choice of buckets). For each it prints the mean token cosine and
exhaustive MaxSim's recall@10 against exact MaxSim over the original vectors (numpy, float32).
"""
import sys

import numpy as np


def main():
    dump, corpus = sys.argv[1], sys.argv[2]
    sweeps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    C = np.load(dump + "/centroids.npy")
    codes = np.load(dump + "/codes.npy")
    dl = np.load(corpus + "/doclens.npy")
    X = np.load(corpus + "/embeddings.npy").astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Q = np.load(corpus + "/queries.npy").astype(np.float32)
    Q /= np.linalg.norm(Q, axis=2, keepdims=True)
    Cc = C[codes]
    R = X - Cc
    rng = np.random.default_rng(0)
    v = np.sort(R[rng.choice(len(R), min(20000, len(R)), replace=False)].ravel())
    B = 4
    w = np.quantile(v, (np.arange(B) + 0.5) / B)
    for _ in range(30):
        b = np.searchsorted((w[1:] + w[:-1]) / 2, v)
        w = np.array([v[b == i].mean() for i in range(B)])
    bb = np.searchsorted((w[1:] + w[:-1]) / 2, R)
    starts = np.concatenate([[0], np.cumsum(dl)])[:-1]

    def recon(bb):
        Xh = Cc + w[bb].astype(np.float32)
        return Xh / np.linalg.norm(Xh, axis=1, keepdims=True)

    def top10(T):
        return [np.argsort(-np.maximum.reduceat(q @ T.T, starts, axis=1).sum(0))[:10] for q in Q]

    exact = top10(X)

    def report(label, bb):
        r = recon(bb)
        got = top10(r)
        rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, exact)])
        print(f"{label}: mean cosine {(X * r).sum(1).mean():.5f}, exh/exact {rec:.4f}", flush=True)

    report("nearest buckets", bb)
    Xh = Cc + w[bb]
    dot, n2 = (X * Xh).sum(1), (Xh * Xh).sum(1)
    for sweep in range(sweeps):
        for j in range(X.shape[1]):
            best_c, best_b = dot / np.sqrt(n2), bb[:, j].copy()
            best_d, best_n = dot.copy(), n2.copy()
            for alt in range(B):
                d2 = dot + X[:, j] * (w[alt] - w[bb[:, j]])
                n22 = n2 - Xh[:, j] ** 2 + (Cc[:, j] + w[alt]) ** 2
                c2 = d2 / np.sqrt(n22)
                better = c2 > best_c
                best_c = np.where(better, c2, best_c)
                best_b = np.where(better, alt, best_b)
                best_d = np.where(better, d2, best_d)
                best_n = np.where(better, n22, best_n)
            bb[:, j] = best_b
            Xh[:, j] = Cc[:, j] + w[best_b]
            dot, n2 = best_d, best_n
        report(f"coordinate descent, sweep {sweep + 1}", bb)


if __name__ == "__main__":
    main()
