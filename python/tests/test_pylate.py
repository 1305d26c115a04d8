"""tartan.pylate.TartanIndex: PyLate's index interface, used directly and through PyLate's
own retriever (pylate.retrieve.ColBERT) when PyLate is installed (skipped otherwise: PyLate
needs torch, transformers and datasets, several GB that CI does not install)."""
import numpy as np
import pytest

import tartan
from conftest import make_docs, maxsim_reference, queries_from
from tartan.fast_plaid import FastPlaid
from tartan.pylate import TartanIndex


@pytest.fixture
def data(rng):
    docs = make_docs(rng, 200, 32)
    qs = queries_from(rng, docs, 6, 12)
    return docs, qs


def test_interface_without_pylate(tmp_path, data):
    docs, qs = data
    ids = [f"doc_{i}" for i in range(len(docs))]
    index = TartanIndex(index_folder=str(tmp_path), index_name="t", override=True)
    assert index.is_end_to_end_index
    assert index.add_documents(documents_ids=ids, documents_embeddings=docs) is index
    res = index(list(qs), k=5)
    want = index.index.search(qs, k=5)
    assert [[(r["id"], r["score"]) for r in q] for q in res] == want
    assert index(qs[0], k=5) == res[:1]  # one [tokens, dim] query
    # Subsets: one list for all queries, or one per query.
    one = index(qs, k=5, subset=ids[:50])
    assert all(r["id"] in ids[:50] for q in one for r in q)
    per = index(qs[:2], k=5, subset=[ids[:10], ids[100:110]])
    assert {r["id"] for r in per[0]} <= set(ids[:10])
    assert {r["id"] for r in per[1]} <= set(ids[100:110])
    assert index(qs, k=5, subset=[]) == [[] for _ in qs]
    # Remove, update, reopen.
    best = res[0][0]["id"]
    index.remove_documents([best])
    assert best not in {r["id"] for r in index(qs[:1], k=5)[0]}
    index.update_documents([ids[3]], [docs[4]])
    index.close()
    again = TartanIndex(index_folder=str(tmp_path), index_name="t")
    assert len(again.index) == 199
    with pytest.raises(NotImplementedError):
        again.get_documents_embeddings([[ids[0]]])
    with pytest.raises(TypeError):
        again.add_documents([5], [docs[0]])  # str ids here
    again.close()


def test_int_ids_come_back_as_ints(tmp_path, data):
    docs, qs = data
    index = TartanIndex(index_folder=str(tmp_path), index_name="i", override=True)
    index.add_documents(documents_ids=range(len(docs)), documents_embeddings=docs)
    res = index(qs, k=3)
    assert all(isinstance(r["id"], int) for q in res for r in q)
    assert index(qs, k=3, subset=[1, 2, 3])[0][0]["id"] in (1, 2, 3)
    index.remove_documents([res[0][0]["id"]])
    index.close()
    again = TartanIndex(index_folder=str(tmp_path), index_name="i")
    assert isinstance(again(qs, k=1)[0][0]["id"], int)
    with pytest.raises(TypeError):
        again.add_documents(["a"], [docs[0]])
    again.close()


def test_fast_plaid_convenience(tmp_path, data):
    docs, qs = data
    fp = FastPlaid(index=str(tmp_path / "fp"))
    fp.create(documents_embeddings=docs[:150])
    fp.update(documents_embeddings=docs[150:])
    res = fp.search(queries_embeddings=qs, top_k=5)
    assert all(isinstance(d, int) and 0 <= d < 200 for q in res for d, _ in q)
    for q, hits in zip(qs, fp.search(qs, top_k=5, n_ivf_probe=64, n_full_scores=4096)):
        ref = maxsim_reference(q, docs)
        assert ref[hits[0][0]] >= ref.max() - 0.1 * len(q)
    sub = fp.search(qs, top_k=5, subset=[1, 2, 3, 160])
    assert all(d in (1, 2, 3, 160) for q in sub for d, _ in q)
    fp.delete([res[0][0][0]])
    assert res[0][0][0] not in [d for d, _ in fp.search(qs[:1], top_k=5)[0]]
    fp.close()
    reopened = FastPlaid(index=str(tmp_path / "fp"))
    reopened.update(documents_embeddings=docs[:1])
    assert reopened.search(docs[0][None], top_k=2)[0][0][0] in (0, 200)
    reopened.close()


def test_pylate_retriever(tmp_path, data):
    """PyLate's own retriever over TartanIndex, embeddings given directly (no model)."""
    retrieve = pytest.importorskip("pylate.retrieve")
    from pylate import rank
    import torch

    docs, qs = data
    # Unit-length tokens, as PyLate's models give them: PyLate's exact scores (raw dot
    # products) are then the index's definition too (cosines).
    docs = [d / np.linalg.norm(d, axis=1, keepdims=True) for d in docs]
    qs = qs / np.linalg.norm(qs, axis=2, keepdims=True)
    ids = [f"doc_{i}" for i in range(len(docs))]
    index = TartanIndex(index_folder=str(tmp_path), index_name="p", override=True)
    index = index.add_documents(documents_ids=ids, documents_embeddings=[torch.from_numpy(d)
                                                                         for d in docs])
    retriever = retrieve.ColBERT(index=index)
    res = retriever.retrieve(queries_embeddings=list(qs), k=10)
    assert len(res) == len(qs) and all(len(r) == 10 for r in res)
    assert [[(r["id"], r["score"]) for r in q] for q in res] == index.index.search(qs, k=10)
    assert retriever.retrieve(queries_embeddings=torch.from_numpy(qs), k=10) == res
    sub = retriever.retrieve(queries_embeddings=list(qs), k=10, subset=ids[20:60])
    assert all(r["id"] in ids[20:60] for q in sub for r in q)

    # PyLate's exact reranker on the original embeddings agrees with the index's
    # exhaustive scores up to the 2-bit codec.
    exact = index.index.search(qs, k=10, exhaustive=True)
    reranked = rank.rerank(documents_ids=[[d for d, _ in q] for q in exact],
                           queries_embeddings=list(qs),
                           documents_embeddings=[[docs[ids.index(d)] for d, _ in q]
                                                 for q in exact], device="cpu")
    for q, mine, theirs in zip(qs, exact, reranked):
        ref = {r["id"]: r["score"] for r in theirs}
        assert set(ref) == {d for d, _ in mine}
        for d, s in mine:
            assert abs(s - ref[d]) < 0.05 * len(q)

    index.remove_documents(ids[:100])
    after = retriever.retrieve(queries_embeddings=list(qs), k=10)
    assert all(r["id"] in ids[100:] for q in after for r in q)
