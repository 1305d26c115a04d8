#!/usr/bin/env python3
"""synth_stats.py: the statistics that decide how hard a corpus is for PLAID's stages 2-3,
measured the same way on real embeddings and on a `tartan gen` corpus (bench/RESULTS.md,
"Calibrating the generator").

    bench/index_dump INDEX DUMP                # centroids.npy, codes.npy, ids.txt of the index
    bench/synth_stats.py CORPUS DUMP [--nq 100] [--ndocs 256] [--sample 200000] [--json F]

CORPUS holds embeddings.npy [T, d], doclens.npy [N], ids.txt, and queries.npy: [Q, L, d], or
[sum of qlens, d] with qlens.npy [Q] (real queries are ragged; generated ones are not). The statistics:

  token-centroid cosine   cos(token, its centroid in the index): how far the codec's first
                          approximation (the centroid alone, which stages 2-3 score with) is
                          from the token. Mean and quartiles over a sample of tokens.
  score gaps              exact MaxSim over the float embeddings, per query token (so that
                          queries of different lengths compare): the top-1 score, and the gaps
                          top1 - top10 and top1 - top100, over the first nq queries.
  centroid-approx error   |centroid-only MaxSim - exact MaxSim| per query token, over the
                          exact top 100 documents: the noise stages 2-3 rank with.
  top-10 in top ndocs/4   share of the exact top 10 that are among the ndocs/4 best documents
                          by centroid-only MaxSim over the whole corpus (stage 3 without
                          pruning; PLAID keeps ndocs/4 documents for exact scoring).
  within-document cosine  mean cosine between two tokens of one document (100 documents):
                          how strongly a passage's context shapes its tokens.
  random-document score   MaxSim per query token against random documents (200): the floor
                          the top scores stand above.
"""
import argparse
import json
import os
import sys

import numpy as np


def load(path):
    return np.load(path, mmap_mode="r")


def maxsim_all(tok_scores, starts):
    """tok_scores [T, Lq]; starts [N]: per document max over its tokens, summed over Lq."""
    return np.maximum.reduceat(tok_scores, starts, axis=0).sum(axis=1)


def load_corpus_dump(corpus, dump, prog):
    """A corpus (embeddings.npy, doclens.npy, ids.txt, queries.npy, qlens.npy when ragged) and
    the bench/index_dump of an index built from it. Returns the embeddings (mapped), document
    lengths and start rows, the query tokens [sum of qlens, d] and each query's start row
    ([Q + 1]), the centroids and every token's code; exits when the dump is not of this corpus."""
    emb = load(os.path.join(corpus, "embeddings.npy"))
    doclens = np.asarray(load(os.path.join(corpus, "doclens.npy")), dtype=np.int64)
    queries = load(os.path.join(corpus, "queries.npy"))
    qlens_path = os.path.join(corpus, "qlens.npy")
    if os.path.exists(qlens_path):  # ragged: queries.npy [sum(qlens), d]
        qlens = np.asarray(np.load(qlens_path), dtype=np.int64)
    else:
        qlens = np.full(queries.shape[0], queries.shape[1], dtype=np.int64)
        queries = queries.reshape(-1, queries.shape[2])
    qstart = np.concatenate([[0], np.cumsum(qlens)])
    cent = np.asarray(load(os.path.join(dump, "centroids.npy")), dtype=np.float32)
    codes = np.asarray(load(os.path.join(dump, "codes.npy")), dtype=np.int64).ravel()
    ids_c = open(os.path.join(corpus, "ids.txt")).read().split()
    ids_d = open(os.path.join(dump, "ids.txt")).read().split()
    if ids_c != ids_d or codes.shape[0] != emb.shape[0]:
        sys.exit(f"{prog}: the index's documents are not the corpus's, in its order")
    starts = np.zeros(doclens.shape[0], dtype=np.int64)
    np.cumsum(doclens[:-1], out=starts[1:])
    return emb, doclens, starts, queries, qstart, cent, codes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("dump")
    ap.add_argument("--nq", type=int, default=100)
    ap.add_argument("--ndocs", type=int, default=256)
    ap.add_argument("--sample", type=int, default=200000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args()

    emb, doclens, starts, queries, qstart, cent, codes = load_corpus_dump(
        a.corpus, a.dump, "synth_stats")
    qlens = np.diff(qstart)
    T, d = emb.shape
    N = doclens.shape[0]
    rng = np.random.default_rng(a.seed)

    # Token-centroid cosine on a sample (tokens are unit norm; centroids need not be).
    idx = np.sort(rng.choice(T, size=min(a.sample, T), replace=False))
    x = np.asarray(emb[idx], dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    c = cent[codes[idx]]
    cos = (x * c).sum(axis=1) / np.linalg.norm(c, axis=1)
    tok = {"mean": float(cos.mean()), "p25": float(np.percentile(cos, 25)),
           "p50": float(np.percentile(cos, 50)), "p75": float(np.percentile(cos, 75))}

    docs = rng.choice(N, size=min(200, N), replace=False)
    within = []
    for i in docs[:100]:
        D = np.asarray(emb[starts[i] : starts[i] + doclens[i]], dtype=np.float32)
        n = D.shape[0]
        if n > 1:
            within.append(((D @ D.T).sum() - np.trace(D @ D.T)) / (n * n - n))

    # Exact and centroid-only MaxSim of the first nq queries against every document.
    E = np.asarray(emb, dtype=np.float32)
    nq = min(a.nq, qlens.shape[0])
    keep = a.ndocs // 4
    top1, gap10, gap100, err, inkeep, rnd = [], [], [], [], [], []
    for j in range(nq):
        q = np.asarray(queries[qstart[j] : qstart[j + 1]], dtype=np.float32)
        lq = q.shape[0]
        exact = maxsim_all(E @ q.T, starts) / lq
        approx = maxsim_all((cent @ q.T)[codes], starts) / lq
        order = np.argsort(-exact, kind="stable")
        rnd.append(exact[docs].mean())
        top1.append(exact[order[0]])
        gap10.append(exact[order[0]] - exact[order[9]])
        gap100.append(exact[order[0]] - exact[order[99]])
        err.append(np.abs(approx[order[:100]] - exact[order[:100]]).mean())
        kth = np.partition(-approx, keep - 1)[keep - 1]  # -(keep-th best approx)
        inkeep.append(float((-approx[order[:10]] <= kth).mean()))
    res = {
        "corpus": a.corpus, "docs": int(N), "tokens": int(T), "dim": int(d),
        "centroids": int(cent.shape[0]), "queries": nq,
        "mean_query_tokens": float(qlens[:nq].mean()),
        "token_centroid_cos": tok,
        "within_document_cos": float(np.mean(within)),
        "per_query_token": {
            "random_document": float(np.mean(rnd)),
            "top1": float(np.mean(top1)), "gap_top1_top10": float(np.mean(gap10)),
            "gap_top1_top100": float(np.mean(gap100)),
            "centroid_approx_abs_err_top100": float(np.mean(err)),
        },
        "ndocs": a.ndocs,
        "exact_top10_in_centroid_top_ndocs_over_4": float(np.mean(inkeep)),
    }
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
