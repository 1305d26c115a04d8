#!/usr/bin/env python3
"""make_corpus.py: writes a clustered synthetic late-interaction corpus for build benchmarks.

    bench/make_corpus.py OUTDIR --docs 100000 --tokens 64 --dim 128 [--clusters 4096] [--seed 1]

Writes OUTDIR/embeddings.npy [T, dim] float32 and OUTDIR/doclens.npy [N] int64. Tokens are
drawn around random unit cluster centres (Zipf-like cluster frequencies, Gaussian noise), and
document lengths vary uniformly in [tokens/2, 3*tokens/2]. Streams in slices so that its memory
does not grow with N.
"""
import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--docs", type=int, default=100000)
    ap.add_argument("--tokens", type=int, default=64, help="mean tokens per document")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--clusters", type=int, default=4096)
    ap.add_argument("--noise", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    lens = rng.integers(a.tokens // 2, a.tokens + a.tokens // 2 + 1, size=a.docs).astype(np.int64)
    np.save(os.path.join(a.outdir, "doclens.npy"), lens)
    total = int(lens.sum())
    centres = rng.standard_normal((a.clusters, a.dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    p = 1.0 / np.arange(1, a.clusters + 1) ** 0.8
    p /= p.sum()
    path = os.path.join(a.outdir, "embeddings.npy")
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(total, a.dim))
    step = 1 << 16
    for r0 in range(0, total, step):
        n = min(step, total - r0)
        c = rng.choice(a.clusters, size=n, p=p)
        x = centres[c] + (a.noise / np.sqrt(a.dim)) * rng.standard_normal((n, a.dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[r0:r0 + n] = x
    out.flush()
    del out
    print(f"{a.docs} documents, {total} tokens, dim {a.dim}: {path}")


if __name__ == "__main__":
    main()
