"""tartan.Index: adding in every accepted form, searching, deleting, info, check."""
import numpy as np
import pytest

import tartan
from conftest import maxsim_reference, snapshot

# The 2-bit codec moves a score by less than this much a query token (cosines of unit
# vectors); a gap above it between the reference's best two documents decides the winner.
# These tokens (d 32, clusters as wide as their spread) are hard for 2 bits: over seeds
# 1-40 the worst error was 0.059 a token, so 0.05 failed about one run in seven.
TOL = 0.08


def assert_best(hit_id, ref, ids, lq):
    """hit_id is the reference's best document, or within the codec's error of it."""
    order = np.argsort(-ref)
    if ref[order[0]] - ref[order[1]] > 2 * TOL * lq:
        assert hit_id == ids[order[0]]
    else:
        assert ref[ids.index(hit_id)] >= ref[order[0]] - 2 * TOL * lq


def test_exhaustive_matches_double_reference(built, corpus):
    """Exhaustive scores against a float64 MaxSim of the original embeddings: the binding hands
    the right rows to the right ids (a shifted doclens or a swapped id would fail this); the
    remaining gap is the 2-bit codec's."""
    ids, docs, qs = corpus
    res = built.search(qs, k=10, exhaustive=True)
    assert len(res) == len(qs)
    for q, hits in zip(qs, res):
        ref = maxsim_reference(q, docs)
        assert len(hits) == 10
        assert_best(hits[0][0], ref, ids, q.shape[0])
        for doc_id, score in hits:
            assert isinstance(doc_id, str) and isinstance(score, float)
            assert abs(score - ref[ids.index(doc_id)]) < TOL * q.shape[0]
        scores = [s for _, s in hits]
        assert scores == sorted(scores, reverse=True)


def test_plaid_finds_the_best(built, corpus):
    ids, docs, qs = corpus
    for q, hits in zip(qs, built.search(qs, k=5)):
        assert_best(hits[0][0], maxsim_reference(q, docs), ids, q.shape[0])


def test_input_forms_give_one_index(tmp_path, corpus):
    """A list of arrays, a flat array with doclens (int32 or int64), views of one array and
    a [docs, tokens, dim] array build the same index: same search results to the bit."""
    ids, docs, qs = corpus
    flat = np.concatenate(docs)
    lens = [len(d) for d in docs]
    forms = {
        "list": dict(embeddings=docs),
        "flat64": dict(embeddings=flat, doclens=np.array(lens, np.int64)),
        "flat32": dict(embeddings=flat, doclens=np.array(lens, np.int32)),
        "flatlist": dict(embeddings=flat, doclens=lens),
        "views": dict(embeddings=np.split(flat, np.cumsum(lens)[:-1])),
    }
    got = {}
    for name, kw in forms.items():
        with tartan.Index(tmp_path / name, dim=32, create=True) as ix:
            ix.add(ids, **kw)
            got[name] = snapshot(ix, qs)
    for name in forms:
        assert got[name] == got["list"], name


def test_fixed_length_documents(tmp_path, rng):
    arr = rng.standard_normal((50, 10, 16)).astype(np.float32)
    ids = [f"p{i}" for i in range(50)]
    with tartan.Index(tmp_path / "a", dim=16, create=True) as a, \
            tartan.Index(tmp_path / "b", dim=16, create=True) as b:
        a.add(ids, arr)
        b.add(ids, list(arr))
        assert snapshot(a, arr[:4, :3]) == snapshot(b, arr[:4, :3])
        assert a.info().n_tokens == 500


def test_query_forms(built, corpus):
    """[nq, lq, d], a list of [lq, d] arrays, a single [lq, d] array, and ragged queries."""
    ids, docs, qs = corpus
    as3d = built.search(qs, k=7)
    assert built.search(list(qs), k=7) == as3d
    assert built.search(qs[3], k=7) == [as3d[3]]
    ragged = [qs[0][:3], qs[1], qs[2][:1]]
    r = built.search(ragged, k=7)
    assert r[1] == as3d[1]
    assert r[0] == built.search(qs[0][:3][None], k=7)[0]
    assert r[2] == built.search(qs[2][:1], k=7)[0]


def test_search_arrays_equal_tuples(built, corpus):
    ids, docs, qs = corpus
    tuples = built.search(qs, k=9, exhaustive=True)
    h = built.search_arrays(qs, k=9, exhaustive=True)
    assert h.ids.shape == (len(qs), 9) and h.scores.dtype == np.float32
    assert h.tolist() == tuples
    assert list(h.counts) == [9] * len(qs)
    assert h.stats.n_exact == 300 * len(qs)


def test_search_arrays_pads_short_results(built, corpus):
    ids, docs, qs = corpus
    h = built.search_arrays(qs[:2], k=5, subset=["doc1", "doc2", "doc3"])
    assert list(h.counts) == [3, 3]
    assert h.ids.shape == (2, 3)
    h = built.search_arrays(qs[:2], k=5, subset=[])
    assert h.ids.shape == (2, 0) and list(h.counts) == [0, 0]


def test_subset(built, corpus):
    ids, docs, qs = corpus
    allowed = ids[100:140]
    for q, hits in zip(qs, built.search(qs, k=10, subset=allowed, exhaustive=True)):
        assert {d for d, _ in hits} <= set(allowed)
        assert_best(hits[0][0], maxsim_reference(q, docs[100:140]), allowed, q.shape[0])
    assert built.search(qs, k=3, subset=[]) == [[] for _ in qs]


def test_plaid_parameters_reach_the_engine(built, corpus):
    ids, docs, qs = corpus
    narrow = built.search_arrays(qs, k=10, ncells=1, ndocs=1, threshold=0.9)
    wide = built.search_arrays(qs, k=10, ncells=64, ndocs=4096, threshold=-1.0)
    assert narrow.stats.n_candidates < wide.stats.n_candidates
    assert wide.tolist() == built.search(qs, k=10, exhaustive=True)


def test_delete_and_replace(built, corpus, rng):
    ids, docs, qs = corpus
    assert built.delete(["doc0", "doc1", "nosuch"]) == 2
    assert len(built) == 298
    for hits in built.search(qs, k=20, exhaustive=True):
        assert not {"doc0", "doc1"} & {d for d, _ in hits}
    assert built.delete([]) == 0
    # Replace: doc5 gets doc7's embeddings, so a query of doc7's tokens finds both equal.
    built.add(["doc5"], [docs[7]], replace=True)
    hits = built.search(docs[7][None], k=2, exhaustive=True)[0]
    assert {hits[0][0], hits[1][0]} == {"doc5", "doc7"}
    assert hits[0][1] == pytest.approx(hits[1][1], abs=1e-5)
    assert len(built) == 298


def test_info_and_check(built, corpus):
    ids, docs, qs = corpus
    info = built.info()
    assert info.n_docs == 300 and info.dim == 32 and info.nbits == 2
    assert info.n_tokens == sum(len(d) for d in docs)
    assert info.bytes_residuals == info.n_tokens * 32 * 2 // 8
    rep = built.check()
    assert rep.ok and rep.n_problems == 0 and rep.problems == []


def test_reopen_and_readonly(tmp_path, corpus):
    ids, docs, qs = corpus
    with tartan.Index(tmp_path / "ix", create=True) as ix:  # dim from the first add
        assert len(ix) == 0 and ix.search(qs, k=3) == [[] for _ in qs]
        ix.add(ids, docs)
        before = snapshot(ix, qs)
    with tartan.Index(tmp_path / "ix") as ix:
        assert snapshot(ix, qs) == before
    with tartan.Index(tmp_path / "ix", readonly=True) as ix:
        assert snapshot(ix, qs) == before
        with pytest.raises(tartan.EREADONLY):
            ix.add(["new"], [docs[0]])
        with pytest.raises(tartan.EREADONLY):
            ix.delete(["doc3"])
    with pytest.raises(tartan.EEXIST):
        tartan.Index(tmp_path / "ix", create=True, exclusive=True)
    with pytest.raises(tartan.EDIM):
        tartan.Index(tmp_path / "ix", dim=64)
    with tartan.Index(tmp_path / "ix", create=True) as ix:  # opens what is there
        assert snapshot(ix, qs) == before


def test_open_errors(tmp_path):
    with pytest.raises(tartan.ErrnoError) as e:
        tartan.Index(tmp_path / "nosuch")
    assert e.value.errno == 2 and e.value.name == "ENOENT" and isinstance(e.value, OSError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(tartan.ENOINDEX) as e:
        tartan.Index(tmp_path / "empty")
    assert e.value.code == tartan.ERROR_CODES["ENOINDEX"][0]
    assert str(e.value).startswith("TARTAN_ENOINDEX")
    with pytest.raises(tartan.EINVAL):
        tartan.Index(tmp_path / "x", dim=12, create=True, nbits=3)


def test_closed_index(tmp_path, corpus):
    ids, docs, qs = corpus
    ix = tartan.Index(tmp_path / "ix", dim=32, create=True)
    ix.add(ids[:10], docs[:10])
    ix.close()
    ix.close()
    assert ix.closed
    for call in (lambda: ix.search(qs), lambda: ix.add(["z"], [docs[0]]), ix.info, ix.check,
                 lambda: ix.delete(["doc1"])):
        with pytest.raises(tartan.EINVAL):
            call()


def test_train_then_add(tmp_path, corpus):
    ids, docs, qs = corpus
    with tartan.Index(tmp_path / "ix", dim=32, create=True, n_centroids=64) as ix:
        ix.train(docs[:150])
        assert ix.info().n_centroids == 64 and len(ix) == 0
        ix.add(ids[:150], docs[:150])
        ix.add(ids[150:], docs[150:])
        assert len(ix) == 300 and ix.check().ok
        with pytest.raises(tartan.EINVAL):
            ix.train(docs[:10])
    assert tartan.sample_docs(100) == 100 and tartan.sample_docs(10**6) < 10**6


def test_error_classes_follow_the_header():
    """One class per code of the header's list, each with its code, and argument errors are
    also ValueErrors."""
    assert len(tartan.ERROR_CODES) >= 24
    for name, (code, text) in tartan.ERROR_CODES.items():
        cls = getattr(tartan, name)
        assert issubclass(cls, tartan.Error) and cls.__name__ == name
        assert code < 0 and text
        assert tartan._tartan.strerror(code).startswith("TARTAN_" + name)
    assert issubclass(tartan.EDIM, ValueError) and issubclass(tartan.EDTYPE, TypeError)
    assert not issubclass(tartan.ECORRUPT, ValueError)
    assert issubclass(tartan.ErrnoError, OSError)


def test_ids_round_trip(tmp_path, rng):
    """str (any Unicode), bytes, and non-UTF-8 bytes (back as surrogate-escaped str that is
    accepted again)."""
    docs = [rng.standard_normal((5, 8)).astype(np.float32) for _ in range(4)]
    ids = ["naïve→π", b"raw-bytes", b"\xff\xfeodd", "x" * 511]
    with tartan.Index(tmp_path / "ix", dim=8, create=True) as ix:
        ix.add(ids, docs)
        got = {d for d, _ in ix.search(docs[0][None], k=4, exhaustive=True)[0]}
        odd = b"\xff\xfeodd".decode("utf-8", "surrogateescape")
        assert got == {"naïve→π", "raw-bytes", odd, "x" * 511}
        assert ix.delete([odd]) == 1
        assert ix.search(docs[0][None], k=4, exhaustive=True, subset=["raw-bytes"])[0][0][0] \
            == "raw-bytes"


def test_version():
    assert tartan.version() == tartan._tartan.HEADER_VERSION


def test_axes_codec(tmp_path, corpus):
    """codec='axes' trains the principal-axes code; exhaustive search equals MaxSim in double
    over the documents as the index decodes them, and a bad name is refused."""
    ids, docs, qs = corpus
    with pytest.raises(tartan.EINVAL):
        tartan.Index(tmp_path / "bad", dim=32, create=True, codec="pca")
    with tartan.Index(tmp_path / "ax", dim=32, create=True, codec="axes", device="cpu") as ix:
        ix.add(ids, docs)
        assert ix.check().ok
        hits = ix.search(qs[:3], k=5, exhaustive=True)
        assert len(hits) == 3 and all(len(h) == 5 for h in hits)
        assert (ix.info().codec, ix.info().format) == ("axes", 3)
    with tartan.Index(tmp_path / "ax", device="cpu") as ix:  # reopened: the code is stored
        assert ix.search(qs[:3], k=5, exhaustive=True) == hits
    # 'auto' on this small corpus (too few held-out residuals to judge) keeps the scalar code:
    # the same hits as an index built with it.
    found = []
    for codec in ("auto", "scalar"):
        with tartan.Index(tmp_path / codec, dim=32, create=True, codec=codec, device="cpu") as ix:
            ix.add(ids, docs)
            found.append(ix.search(qs[:3], k=5, exhaustive=True))
            assert (ix.info().codec, ix.info().format) == ("scalar", 2)
    assert found[0] == found[1]
