#!/usr/bin/env python3
"""Score TREC runs against qrels the way trec_eval does, and measure parity between runs.

  score.py --qrels QRELS --run RUN [--json OUT.json]     nDCG@10, Recall@100, MRR@10, MAP, ...
  score.py --parity EXACT_RUN OTHER_RUN [-k 10]          recall@k of EXACT_RUN's top-k

trec_eval conventions kept here:
- a query's documents are ordered by score descending, ties by document id descending (byte
  order); the rank column of the run is ignored;
- a document is relevant when its qrels level is >= 1; nDCG's gain is the level itself;
- a measure is averaged over the queries that have qrels; a query absent from the run counts
  0 (trec_eval -c). Without -c trec_eval averages over the queries in both: `n_queries_in_run`
  says whether the two differ.
- MRR@10 is trec_eval's recip_rank on each query's first 10 documents.
Qrels may be BEIR TSV (`query-id corpus-id score`, header line) or TREC (`qid 0 docid rel`);
CRLF line ends are accepted. Where pytrec_eval imports (pip install pytrec-eval-terrier), the
same measures are computed with it too and both are reported.
"""

import argparse
import json
import math
import sys

MEASURES = ("ndcg_cut_10", "recall_100", "recip_rank_10", "map", "recall_10", "P_10")


def read_qrels(path):
    """{qid: {docid: level}} from a BEIR TSV or TREC qrels file."""
    qrels = {}
    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f, 1):
            fields = line.rstrip("\r\n").split()
            if not fields:
                continue
            if n == 1 and fields[0] == "query-id":
                continue
            if len(fields) == 3:
                qid, docid, rel = fields
            elif len(fields) == 4:
                qid, _, docid, rel = fields
            else:
                raise ValueError(f"{path}:{n}: expected 3 (BEIR) or 4 (TREC) fields")
            qrels.setdefault(qid, {})[docid] = int(rel)
    return qrels


def trec_order(docs):
    """docs [(docid, score)] sorted as trec_eval does: score desc, then docid desc."""
    # Two stable sorts: docid descending first, then score descending.
    docs = sorted(docs, key=lambda d: d[0].encode("utf-8"), reverse=True)
    return sorted(docs, key=lambda d: -d[1])


def read_run(path):
    """{qid: [(docid, score)]} in trec_eval order from a TREC run (qid Q0 docid rank score tag)."""
    run = {}
    with open(path, encoding="utf-8", newline="") as f:
        for n, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 6:
                raise ValueError(f"{path}:{n}: expected `qid Q0 docid rank score tag`")
            run.setdefault(fields[0], []).append((fields[2], float(fields[4])))
    for qid, docs in run.items():
        if len({d for d, _ in docs}) != len(docs):
            raise ValueError(f"{path}: query {qid} lists a document twice")
        run[qid] = trec_order(docs)
    return run


def query_measures(rels, ranked):
    """All MEASURES for one query. rels {docid: level}, ranked [docid] in trec_eval order."""
    n_rel = sum(1 for v in rels.values() if v >= 1)
    hits = [rels.get(d, 0) >= 1 for d in ranked]
    gains = [max(rels.get(d, 0), 0) for d in ranked]

    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:10]))
    ideal = sorted((v for v in rels.values() if v > 0), reverse=True)[:10]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))

    rr10 = 0.0
    for i, h in enumerate(hits[:10]):
        if h:
            rr10 = 1.0 / (i + 1)
            break
    ap, found = 0.0, 0
    for i, h in enumerate(hits):
        if h:
            found += 1
            ap += found / (i + 1)
    return {
        "ndcg_cut_10": dcg / idcg if idcg > 0 else 0.0,
        "recall_100": sum(hits[:100]) / n_rel if n_rel else 0.0,
        "recip_rank_10": rr10,
        "map": ap / n_rel if n_rel else 0.0,
        "recall_10": sum(hits[:10]) / n_rel if n_rel else 0.0,
        "P_10": sum(hits[:10]) / 10.0,
    }


def evaluate(qrels, run):
    """(means {measure: value}, per_query {qid: {measure: value}}), averaged over qrels queries."""
    per_query = {}
    for qid, rels in qrels.items():
        ranked = [d for d, _ in run.get(qid, [])]
        per_query[qid] = query_measures(rels, ranked)
    means = {m: sum(pq[m] for pq in per_query.values()) / len(per_query) for m in MEASURES}
    return means, per_query


def evaluate_pytrec(qrels, run):
    """Same means through pytrec_eval (trec_eval's own code), or None where it is missing."""
    try:
        import pytrec_eval
    except ImportError:
        return None
    as_dict = {q: {d: s for d, s in docs} for q, docs in run.items()}
    top10 = {q: {d: s for d, s in docs[:10]} for q, docs in run.items()}
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut", "recall", "map", "P"})
    full = ev.evaluate(as_dict)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    names = {"ndcg_cut_10": "ndcg_cut_10", "recall_100": "recall_100", "map": "map",
             "recall_10": "recall_10", "P_10": "P_10"}
    n = len(qrels)  # queries with qrels; those missing from the run count 0, as above
    means = {m: sum(full[q][k] for q in full) / n for m, k in names.items()}
    means["recip_rank_10"] = sum(rr[q]["recip_rank"] for q in rr) / n
    return means


def parity(exact, other, k):
    """Mean over EXACT's queries of |top-k(other) & top-k(exact)| / |top-k(exact)|."""
    vals = []
    for qid, docs in exact.items():
        want = {d for d, _ in docs[:k]}
        if not want:
            continue
        got = {d for d, _ in other.get(qid, [])[:k]}
        vals.append(len(want & got) / len(want))
    return sum(vals) / len(vals) if vals else 0.0


def score_report(qrels_path, run_path):
    qrels, run = read_qrels(qrels_path), read_run(run_path)
    means, per_query = evaluate(qrels, run)
    report = {
        "run": run_path,
        "qrels": qrels_path,
        "n_queries_qrels": len(qrels),
        "n_queries_in_run": sum(1 for q in qrels if q in run),
        "python": means,
        "pytrec_eval": evaluate_pytrec(qrels, run),
    }
    if report["pytrec_eval"] is not None:
        report["max_abs_diff"] = max(abs(means[m] - report["pytrec_eval"][m]) for m in MEASURES)
    return report, per_query


def print_report(report, out=sys.stdout):
    pt = report.get("pytrec_eval")
    print(f"{'measure':<14} {'python':>8}" + (f" {'pytrec_eval':>11}" if pt else ""), file=out)
    for m in MEASURES:
        line = f"{m:<14} {report['python'][m]:8.4f}"
        if pt:
            line += f" {pt[m]:11.4f}"
        print(line, file=out)
    print(f"queries: {report['n_queries_qrels']} with qrels, {report['n_queries_in_run']} of them "
          "in the run", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qrels")
    ap.add_argument("--run")
    ap.add_argument("--json", help="write the report (with per-query values) here")
    ap.add_argument("--parity", nargs=2, metavar=("EXACT_RUN", "OTHER_RUN"))
    ap.add_argument("-k", type=int, default=10, help="parity depth [10]")
    args = ap.parse_args()
    if args.parity:
        value = parity(read_run(args.parity[0]), read_run(args.parity[1]), args.k)
        print(f"{value:.4f}")
        return
    if not (args.qrels and args.run):
        ap.error("give --qrels and --run, or --parity EXACT_RUN OTHER_RUN")
    report, per_query = score_report(args.qrels, args.run)
    print_report(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(report, per_query=per_query), f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
