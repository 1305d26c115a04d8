"""The package and the `tartan` command on the same files: an index built from Python and
searched by the command, and the other way round, give the same results; `tartan.evaluate`
gives `tartan eval`'s numbers."""
import json

import numpy as np
import pytest

import tartan
from conftest import run_tool


def read_trec(text):
    """{qid: [(docid, float32 score), ...] in rank order} from a TREC run."""
    out = {}
    for line in text.splitlines():
        qid, _, doc, rank, score, _ = line.split()
        out.setdefault(qid, []).append((doc, np.float32(score)))
        assert len(out[qid]) == int(rank)
    return out


def as_run(results, qids):
    return {q: [(d, np.float32(s)) for d, s in hits] for q, hits in zip(qids, results) if hits}


def gen_corpus(tartan_bin, d, model, docs=400, queries=20, dtype="f32"):
    run_tool(tartan_bin, "gen", d, "--docs", docs, "--queries", queries, "--doc-len", 24,
             "--model", model, "--dtype", dtype)
    return d


@pytest.mark.parametrize("model", [1, 2, 3])
def test_command_built_index_searched_from_python(tmp_path, tartan_bin, model):
    g = gen_corpus(tartan_bin, tmp_path / "g", model)
    ix_path = tmp_path / "ix"
    run_tool(tartan_bin, "build", ix_path, "--embeddings", g / "embeddings.npy", "--doclens",
             g / "doclens.npy", "--ids", g / "ids.txt")
    qs = np.load(g / "queries.npy")
    qids = [str(i) for i in range(len(qs))]
    for extra, kw in (([], {}), (["--exhaustive"], {"exhaustive": True}),
                      (["--ncells", 4, "--ndocs", 64], {"ncells": 4, "ndocs": 64})):
        cli = read_trec(run_tool(tartan_bin, "search", ix_path, "--queries", g / "queries.npy",
                                 "-k", 10, *extra))
        with tartan.Index(ix_path, readonly=True) as ix:
            py = as_run(ix.search(qs, k=10, **kw), qids)
            assert as_run(ix.search_arrays(qs, k=10, **kw).tolist(), qids) == py
        assert py == cli, extra


def test_python_built_index_searched_by_the_command(tmp_path, tartan_bin, corpus):
    ids, docs, qs = corpus
    ix_path = tmp_path / "ix"
    with tartan.Index(ix_path, dim=32, create=True) as ix:
        ix.add(ids[:200], docs[:200])
        ix.add(ids[200:], np.concatenate(docs[200:]), [len(d) for d in docs[200:]])
        ix.delete(["doc7", "doc8"])
        ragged = [qs[i][: 3 + i % 6] for i in range(len(qs))]
        want = {
            "plaid": ix.search(qs, k=10),
            "exact": ix.search(qs, k=10, exhaustive=True),
            "subset": ix.search(qs, k=10, subset=ids[50:90]),
            "ragged": ix.search(ragged, k=10),
        }
    run_tool(tartan_bin, "check", ix_path)  # exit status 0: sound
    np.save(tmp_path / "q.npy", qs)
    flat = np.concatenate(ragged)
    np.save(tmp_path / "rq.npy", flat)
    np.save(tmp_path / "rl.npy", np.array([len(r) for r in ragged], np.int64))
    (tmp_path / "subset.txt").write_text("\n".join(ids[50:90]) + "\n")
    qids = [str(i) for i in range(len(qs))]
    base = ["search", ix_path, "--queries", tmp_path / "q.npy", "-k", 10]
    assert read_trec(run_tool(tartan_bin, *base)) == as_run(want["plaid"], qids)
    assert read_trec(run_tool(tartan_bin, *base, "--exhaustive")) == as_run(want["exact"], qids)
    assert read_trec(run_tool(tartan_bin, *base, "--subset", tmp_path / "subset.txt")) == \
        as_run(want["subset"], qids)
    assert read_trec(run_tool(tartan_bin, "search", ix_path, "--queries", tmp_path / "rq.npy",
                              "--qlens", tmp_path / "rl.npy", "-k", 10)) == \
        as_run(want["ragged"], qids)


def test_command_changes_seen_from_python(tmp_path, tartan_bin, corpus):
    """`tartan add` and `tartan delete` on an index Python built; Python sees both."""
    ids, docs, qs = corpus
    ix_path = tmp_path / "ix"
    with tartan.Index(ix_path, dim=32, create=True) as ix:
        ix.add(ids[:250], docs[:250])
    np.save(tmp_path / "e.npy", np.concatenate(docs[250:]))
    np.save(tmp_path / "l.npy", np.array([len(d) for d in docs[250:]], np.int64))
    (tmp_path / "ids.txt").write_text("\n".join(ids[250:]) + "\n")
    (tmp_path / "gone.txt").write_text("doc0\ndoc1\n")
    run_tool(tartan_bin, "add", ix_path, "--embeddings", tmp_path / "e.npy", "--doclens",
             tmp_path / "l.npy", "--ids", tmp_path / "ids.txt")
    run_tool(tartan_bin, "delete", ix_path, "--ids", tmp_path / "gone.txt")
    with tartan.Index(ix_path) as ix:
        assert len(ix) == 298 and ix.check().ok
        got = {d for hits in ix.search(qs, k=50, exhaustive=True) for d, _ in hits}
        assert "doc0" not in got and got & set(ids[250:])


def test_evaluate_equals_tartan_eval(tmp_path, tartan_bin):
    g = gen_corpus(tartan_bin, tmp_path / "g", 2, docs=300, queries=25)
    ix_path = tmp_path / "ix"
    run_tool(tartan_bin, "build", ix_path, "--embeddings", g / "embeddings.npy", "--doclens",
             g / "doclens.npy", "--ids", g / "ids.txt")
    run_path = tmp_path / "run.trec"
    run_tool(tartan_bin, "search", ix_path, "--queries", g / "queries.npy", "--query-ids",
             g / "query_ids.txt", "-k", 100, "-o", run_path)
    metrics = "ndcg@10,recall@100,mrr@10,map,p@10,ndcg_cut.5,20,recip_rank,ndcg"
    run_tool(tartan_bin, "eval", "--qrels", g / "qrels.tsv", "--run", run_path, "-m", metrics,
             "--per-query", "--json", tmp_path / "eval.json")
    want = json.loads((tmp_path / "eval.json").read_text())
    ev = tartan.evaluate(g / "qrels.tsv", run_path, metrics)
    assert dict(ev) == pytest.approx(want["measures"], abs=1e-12) and set(ev) == set(want["measures"])
    assert set(ev.per_query) == set(want["per_query"])
    for q, vals in want["per_query"].items():
        assert ev.per_query[q] == pytest.approx(vals, abs=1e-12), q
    assert ev.num_q == 25

    # The same run from Python's own search, as dicts: the same numbers.
    qids = (g / "query_ids.txt").read_text().split()
    qrels = {}
    for line in (g / "qrels.tsv").read_text().splitlines()[1:]:
        q, d, r = line.split()
        qrels.setdefault(q, {})[d] = int(r)
    with tartan.Index(ix_path, readonly=True) as ix:
        run = tartan.run_from_results(qids, ix.search(np.load(g / "queries.npy"), k=100))
    ev2 = tartan.evaluate(qrels, run, metrics.split(","))
    assert dict(ev2) == pytest.approx(want["measures"], abs=1e-12)

    # Options: level and complete (one judged query dropped from the run).
    del run[qids[0]]
    for level, complete in ((1, True), (2, False)):
        args = ["eval", "--qrels", g / "qrels.tsv", "--run", tmp_path / "run2.trec", "-m",
                metrics, "--json", tmp_path / "e2.json", "--level", level]
        with open(tmp_path / "run2.trec", "w") as f:
            for q, docs in run.items():
                for rank, (d, s) in enumerate(sorted(docs.items(), key=lambda x: -x[1])):
                    f.write(f"{q} Q0 {d} {rank + 1} {float(s)!r} t\n")
        run_tool(tartan_bin, *(args + (["--complete"] if complete else [])))
        want2 = json.loads((tmp_path / "e2.json").read_text())["measures"]
        got2 = tartan.evaluate(qrels, run, metrics, level=level, complete=complete)
        assert dict(got2) == pytest.approx(want2, abs=1e-12)
        assert got2.num_q == (25 if complete else 24)


def test_evaluate_bad_input(tmp_path):
    with pytest.raises(tartan.EINVAL):
        tartan.evaluate({"q": {"d": 1}}, {"q": {"d": 1.0}}, "ndcg@x")
    with pytest.raises(tartan.EEMPTY):
        tartan.evaluate({"q": {}}, {"q": {"d": 1.0}}, "map")
    with pytest.raises(tartan.EEMPTY):  # no query in both
        tartan.evaluate({"q": {"d": 1}}, {"other": {"d": 1.0}}, "map")
    with pytest.raises(TypeError):
        tartan.evaluate({"q": {"d": 0.5}}, {"q": {"d": 1.0}}, "map")
    with pytest.raises(TypeError):
        tartan.evaluate({1: {"d": 1}}, {"q": {"d": 1.0}}, "map")
    with pytest.raises(tartan.EFORMAT):
        tartan.evaluate({"q": {"d": 1}}, {"q": {"d": float("nan")}}, "map")
    with pytest.raises(tartan.ErrnoError):
        tartan.evaluate(tmp_path / "nosuch.tsv", {"q": {"d": 1.0}}, "map")
    (tmp_path / "bad.tsv").write_text("a b c d e f\n")
    with pytest.raises(tartan.EFORMAT):
        tartan.evaluate(tmp_path / "bad.tsv", {"q": {"d": 1.0}}, "map")
    ev = tartan.evaluate({"q": {"d": 1, "e": 0}}, {"q": {"d": 2.0, "e": 3.0}},
                         ["P.1", "recip_rank"])
    assert ev == {"P_1": 0.0, "recip_rank": 0.5}
