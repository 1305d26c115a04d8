#!/usr/bin/env python3
"""Exhaustive MaxSim in NumPy over embed.py's files: the run tartan's exhaustive search must match.

  reference.py EMB_DIR [--qrels QRELS] [--out DIR] [-k 100]

Every token is L2-normalised (again: harmless when embed.py already did); a document's score
for a query is the sum over query tokens of the best dot product with any of its tokens. Dot
products are float32 (BLAS), the per-query sums float64. Scores are rounded to 6 decimals, the
precision the run file keeps, before ranking, so that the file's order is exactly trec_eval's
(score descending, ties by document id descending). Writes DIR/reference.trec (top-k per query)
and DIR/reference.json (metrics from score.py: Python and, where installed, pytrec_eval).
Where embed.py also wrote the model's own pooled sentence embeddings (doc_pooled.npy,
query_pooled.npy), the same is done for that single-vector baseline: DIR/dense.trec, reported
under "dense_baseline".

Needs only NumPy (pytrec_eval optional).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import score  # noqa: E402


def die(msg):
    print(f"reference.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f if line.strip()]


def normalized(x):
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return x / norms


def maxsim_all(queries, qlens, docs, doclens, chunk_tokens):
    """Scores [Nq, N] float64. Document chunks keep Q.D^T at Tq x chunk_tokens floats."""
    n_docs = len(doclens)
    q_off = np.concatenate([[0], np.cumsum(qlens)[:-1]]).astype(np.int64)
    d_end = np.cumsum(doclens.astype(np.int64))
    d_off = d_end - doclens
    scores = np.full((len(qlens), n_docs), -np.inf)
    first = 0
    while first < n_docs:
        # Grow the chunk by whole documents up to chunk_tokens (at least one document).
        last = int(np.searchsorted(d_end, d_off[first] + chunk_tokens, side="right"))
        last = max(last, first + 1)
        lens = doclens[first:last]
        live = np.nonzero(lens > 0)[0]  # an empty document scores nothing, is never returned
        if len(live):
            sims = queries @ docs[d_off[first]:d_end[last - 1]].T  # [Tq, tokens]
            starts = (d_off[first:last] - d_off[first])[live]
            best = np.maximum.reduceat(sims, starts, axis=1)  # [Tq, live docs]
            scores[:, first + live] = np.add.reduceat(best.astype(np.float64), q_off, axis=0)
        first = last
    return scores


def spot_check(queries, qlens, docs, doclens, scores, n, seed=0):
    """Largest |score - naive float64 MaxSim| over n random (query, document) pairs."""
    rng = np.random.default_rng(seed)
    q_off = np.concatenate([[0], np.cumsum(qlens)])
    d_off = np.concatenate([[0], np.cumsum(doclens)])
    worst = 0.0
    for _ in range(n):
        qi, di = int(rng.integers(len(qlens))), int(rng.integers(len(doclens)))
        if doclens[di] == 0:
            continue
        q = queries[q_off[qi]:q_off[qi + 1]].astype(np.float64)
        d = docs[d_off[di]:d_off[di + 1]].astype(np.float64)
        want = sum(max(float(qt @ dt) for dt in d) for qt in q)
        worst = max(worst, abs(want - scores[qi, di]))
    return worst


def top_k(scores, doc_ids, k):
    """Per query, [(docid, score)] best k in trec_eval order (score desc, docid desc)."""
    # Rank on the rounded value the run file keeps; a rank by docid descending breaks ties.
    rounded = np.round(scores, 6)
    desc_id = np.argsort(np.array(doc_ids, dtype=object))[::-1]  # docid descending
    rank_of_id = np.empty(len(doc_ids), dtype=np.int64)
    rank_of_id[desc_id] = np.arange(len(doc_ids))
    out = []
    for row in rounded:
        valid = np.isfinite(row)
        order = np.lexsort((rank_of_id, -np.where(valid, row, -np.inf)))
        order = [i for i in order[:k] if valid[i]]
        out.append([(doc_ids[i], float(row[i])) for i in order])
    return out


def write_run(path, query_ids, ranked, tag):
    with open(path, "w", encoding="utf-8") as f:
        for qid, docs_q in zip(query_ids, ranked):
            for r, (d, s) in enumerate(docs_q, 1):
                f.write(f"{qid} Q0 {d} {r} {s:.6f} {tag}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("emb", help="embed.py's output directory")
    ap.add_argument("--qrels", help="qrels file [meta.json's data dir/qrels/SPLIT.tsv]")
    ap.add_argument("--out", help="where to write reference.trec and reference.json [EMB]")
    ap.add_argument("-k", type=int, default=100, help="documents per query in the run [100]")
    ap.add_argument("--chunk-tokens", type=int, default=8192,
                    help="document tokens per matrix product (memory: Tq x this x 4 B) [8192]")
    ap.add_argument("--check", type=int, default=20,
                    help="compare this many random pairs with a naive loop [20]")
    ap.add_argument("--tag", default="numpy-maxsim", help="run tag")
    args = ap.parse_args()

    emb = Path(args.emb)
    names = ["embeddings.npy", "doclens.npy", "ids.txt", "queries.npy", "qlens.npy",
             "query_ids.txt"]
    for n in names:
        if not (emb / n).is_file():
            die(f"missing {emb / n}: run bench/scifact/embed.py --out {emb} first")
    meta = {}
    if (emb / "meta.json").is_file():
        meta = json.loads((emb / "meta.json").read_text(encoding="utf-8"))
    qrels_path = args.qrels
    if not qrels_path:
        if "data" not in meta:
            die("no --qrels and no data directory in meta.json")
        qrels_path = str(Path(meta["data"]) / "qrels" / f"{meta.get('split', 'test')}.tsv")
    out = Path(args.out) if args.out else emb

    docs = np.load(emb / "embeddings.npy")
    doclens = np.load(emb / "doclens.npy").astype(np.int64)
    doc_ids = read_lines(emb / "ids.txt")
    queries = np.load(emb / "queries.npy")
    qlens = np.load(emb / "qlens.npy").astype(np.int64)
    query_ids = read_lines(emb / "query_ids.txt")
    if docs.ndim != 2 or queries.ndim != 2 or docs.shape[1] != queries.shape[1]:
        die(f"shapes {docs.shape} and {queries.shape} are not [T, d] and [Tq, d]")
    if doclens.sum() != len(docs) or len(doc_ids) != len(doclens):
        die("doclens, ids.txt and embeddings.npy disagree")
    if qlens.sum() != len(queries) or len(query_ids) != len(qlens) or (qlens <= 0).any():
        die("qlens, query_ids.txt and queries.npy disagree (or a query has no tokens)")

    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    queries, docs = normalized(queries), normalized(docs)
    scores = maxsim_all(queries, qlens, docs, doclens, args.chunk_tokens)
    maxsim_s = time.perf_counter() - t0
    ranked = top_k(scores, doc_ids, args.k)
    total_s = time.perf_counter() - t0
    check_err = spot_check(queries, qlens, docs, doclens, scores, args.check)
    if check_err > 1e-3:
        die(f"MaxSim disagrees with the naive loop by {check_err:.2e}")

    out.mkdir(parents=True, exist_ok=True)
    run_path = out / "reference.trec"
    write_run(run_path, query_ids, ranked, args.tag)

    report, per_query = score.score_report(qrels_path, str(run_path))
    report.update({
        "k": args.k,
        "n_docs": len(doclens),
        "n_doc_tokens": int(doclens.sum()),
        "n_queries": len(qlens),
        "n_query_tokens": int(qlens.sum()),
        "naive_check_pairs": args.check,
        "naive_check_max_abs_diff": check_err,
        "maxsim_s": round(maxsim_s, 3),
        "total_s": round(total_s, 3),
        "loadavg_before": load_before,
        "loadavg_after": list(os.getloadavg()),
        "embed_meta": meta,
    })
    dense = None
    if (emb / "doc_pooled.npy").is_file() and (emb / "query_pooled.npy").is_file():
        dp, qp = np.load(emb / "doc_pooled.npy"), np.load(emb / "query_pooled.npy")
        if dp.shape[0] != len(doc_ids) or qp.shape[0] != len(query_ids):
            die("doc_pooled.npy / query_pooled.npy do not match ids.txt / query_ids.txt")
        dense_scores = normalized(qp).astype(np.float64) @ normalized(dp).astype(np.float64).T
        write_run(out / "dense.trec", query_ids, top_k(dense_scores, doc_ids, args.k), "dense")
        dense = score.score_report(qrels_path, str(out / "dense.trec"))[0]
        report["dense_baseline"] = dense
    with open(out / "reference.json", "w", encoding="utf-8") as f:
        json.dump(dict(report, per_query=per_query), f, indent=1)
        f.write("\n")
    print("exhaustive MaxSim over token embeddings:")
    score.print_report(report)
    if dense:
        print("single-vector baseline (the model's pooled sentence embeddings, cosine):")
        score.print_report(dense)
    print(f"naive-loop check: {args.check} pairs, max |diff| {check_err:.2e}", file=sys.stderr)
    print(f"exhaustive MaxSim: {len(qlens)} queries x {len(doclens)} docs in {maxsim_s:.1f} s "
          f"(top-{args.k} {total_s:.1f} s) -> {run_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
