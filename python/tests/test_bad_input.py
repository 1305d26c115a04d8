"""Bad input raises a tartan.Error (or TypeError for a wrong Python type), never crashes,
and leaves the index exactly as it was."""
import numpy as np
import pytest

import tartan
from conftest import snapshot


def bad_adds(docs):
    d = docs[0]
    nan = d.copy()
    nan[1, 3] = np.nan
    inf = d.copy()
    inf[0, 0] = np.inf
    zero = d.copy()
    zero[2] = 0
    flat = np.concatenate(docs[:3])
    n = sum(len(x) for x in docs[:3])
    return [
        # (ids, embeddings, doclens, expected exception)
        (["n1"], [nan], None, tartan.ENONFINITE),
        (["n1", "n2"], [d, inf], None, tartan.ENONFINITE),
        (["z"], [zero], None, tartan.ERANGE),
        (["w"], [d[:, :16]], None, tartan.EDIM),
        (["w", "v"], [d, d[:, :16]], None, tartan.EDIM),
        (["e"], [d[:0]], None, tartan.EEMPTY),
        ([], [], None, tartan.EEMPTY),
        (["doc3"], [d], None, tartan.EDUPID),  # the index has it (no replace)
        (["a", "a"], [d, d], None, tartan.EDUPID),
        ([""], [d], None, tartan.EBADID),
        (["tab\there"], [d], None, tartan.EBADID),
        (["nul\0id"], [d], None, tartan.EBADID),
        (["x" * 512], [d], None, tartan.EBADID),
        ([1], [d], None, TypeError),
        ([None], [d], None, TypeError),
        ("abc", [d], None, TypeError),
        (["a", "b"], [d], None, tartan.EINVAL),  # more ids than documents
        (["a", "b", "c"], flat, [1, 2, n], tartan.EINVAL),  # doclens sum above the rows
        (["a", "b", "c"], flat, [1, 2, 3], tartan.EINVAL),  # and below
        (["a", "b", "c"], flat, [1, -2, n + 1], tartan.EINVAL),
        (["a", "b", "c"], flat, [1.5, 2, 3], tartan.EINVAL),
        (["a", "b", "c"], flat, None, tartan.EINVAL),  # a [T, d] array needs doclens
        (["a"], flat.astype(np.int32), [n], TypeError),  # tartan.EDTYPE
        (["a"], flat.astype(np.complex64), [n], TypeError),
        (["a"], [d.astype(object)], None, TypeError),
        (["a"], [d[0]], None, tartan.EDIM),  # one token as a 1-D array
        (["a"], [d[None]], None, tartan.EDIM),
        (["a"], ["not an array"], None, TypeError),
        (["a"], None, None, TypeError),
        (["a"], 5, None, TypeError),
    ]


def test_bad_adds_leave_the_index_unchanged(built, corpus):
    ids, docs, qs = corpus
    before = snapshot(built, qs)
    for i, (bad_ids, emb, lens, exc) in enumerate(bad_adds(docs)):
        with pytest.raises(exc) as e:
            built.add(bad_ids, emb, lens)
        if issubclass(exc, tartan.Error):
            assert e.value.name.startswith("TARTAN_E"), i
            assert str(e.value).startswith(e.value.name), i
        assert snapshot(built, qs) == before, i
    assert built.check().ok


def test_bad_searches(built, corpus):
    ids, docs, qs = corpus
    before = snapshot(built, qs)
    nan = qs.copy()
    nan[2, 1, 0] = np.nan
    cases = [
        (dict(queries=qs[:, :, :16]), tartan.EDIM),
        (dict(queries=nan), tartan.ENONFINITE),
        (dict(queries=np.zeros_like(qs)), tartan.ERANGE),
        (dict(queries=qs, k=0), tartan.ERANGE),
        (dict(queries=qs, k=-3), tartan.ERANGE),
        (dict(queries=qs, k=tartan._tartan.MAX_K + 1), tartan.ERANGE),
        (dict(queries=qs, k=2**70), OverflowError),
        (dict(queries=qs, ncells=0), tartan.ERANGE),
        (dict(queries=qs, ndocs=-1), tartan.ERANGE),
        (dict(queries=qs, threshold=float("nan")), tartan.ERANGE),
        (dict(queries=qs, threads=-1), tartan.ERANGE),
        (dict(queries=qs, subset=["doc1", ""]), tartan.EBADID),
        (dict(queries=qs, subset=["doc1", 7]), TypeError),
        (dict(queries=qs, subset="doc1"), TypeError),
        (dict(queries=qs, device="tpu"), tartan.EINVAL),
        (dict(queries=qs[:0]), tartan.EEMPTY),
        (dict(queries=qs[:, :0]), tartan.EEMPTY),
        (dict(queries=[]), tartan.EEMPTY),
        (dict(queries=[qs[0], qs[1][:0]]), tartan.EEMPTY),
        (dict(queries=[qs[0], qs[1][:, :8]]), tartan.EDIM),
        (dict(queries=qs[0, 0]), tartan.EINVAL),  # 1-D
        (dict(queries=qs[None]), tartan.EINVAL),  # 4-D
        (dict(queries=qs.astype(np.int64)), TypeError),
        (dict(queries=np.zeros((1, 70000, 32), np.float32) + 1), tartan.ETOOBIG),
        (dict(queries="text"), TypeError),
    ]
    for i, (kw, exc) in enumerate(cases):
        with pytest.raises(exc):
            built.search(**kw)
        with pytest.raises(exc):
            built.search_arrays(**kw)
        assert snapshot(built, qs) == before, i


def test_recall_target(built, corpus):
    """recall_target reaches the engine: a higher target probes at least as many centroids
    and never loses a hit the lower one found against exhaustive search; values outside
    [0, 1) raise ERANGE and leave the index as it was."""
    ids, docs, qs = corpus
    before = snapshot(built, qs)
    ref = built.search(qs, k=5, exhaustive=True)
    lo = built.search_arrays(qs, k=5, recall_target=0.5).stats
    hi = built.search_arrays(qs, k=5, recall_target=0.99).stats
    assert lo.n_probes <= hi.n_probes
    assert hi.probe_margin >= lo.probe_margin >= 0
    assert len(built.search(qs, k=5, recall_target=0.99)) == len(qs)
    got = built.search(qs, k=5, recall_target=0.99)
    hits = sum(len({i for i, _ in g} & {i for i, _ in r}) for g, r in zip(got, ref))
    assert hits >= 0.9 * sum(len(r) for r in ref)
    for bad in (1.0, 1.5, -0.1, float("nan")):
        with pytest.raises(tartan.ERANGE):
            built.search(qs, k=5, recall_target=bad)
    assert snapshot(built, qs) == before


def test_cuda_without_a_gpu(built, corpus):
    """device='cuda' without a GPU (or without CUDA in the build) is TARTAN_ENODEV, never a
    silent fall-back; on a GPU host the results match the CPU's up to rounding."""
    ids, docs, qs = corpus
    try:
        gpu = built.search(qs, k=5, device="cuda", exhaustive=True)
    except tartan.ENODEV:
        return
    cpu = built.search(qs, k=5, device="cpu", exhaustive=True)
    for g, c in zip(gpu, cpu):
        assert g[0][0] == c[0][0]
        assert g[0][1] == pytest.approx(c[0][1], abs=1e-3)


def test_failed_first_add_creates_nothing_usable(tmp_path, rng):
    """A deferred index whose first add fails is still empty and can be created later."""
    d = rng.standard_normal((6, 8)).astype(np.float32)
    bad = d.copy()
    bad[0, 0] = np.nan
    with tartan.Index(tmp_path / "ix", create=True) as ix:
        with pytest.raises(tartan.ENONFINITE):
            ix.add(["a"], [bad])
        assert len(ix) == 0
        ix.add(["a"], [d])
        assert len(ix) == 1


def test_calibration_follows_adds(tmp_path, corpus):
    """add calibrates an uncalibrated index, and the stored calibration is what search uses
    (its probe margin at k 10 is the calibration's margin for queries of this length)."""
    ids, docs, qs = corpus
    with tartan.Index(str(tmp_path / "c"), dim=32, create=True) as ix:
        ix.add(ids, docs, calibrate=False)
        assert not ix.calibration()["calibrated"]
        got = ix.calibrate(n_pseudo=16)
        assert got["calibrated"] and got["n_reference_docs"] == len(ids)
        assert 0 <= got["recall_k10"] <= 1
        st = ix.search_arrays(qs, k=10).stats
        # These queries have 8 tokens: the short queries' margin.
        assert qs.shape[1] == 8 and got["short_len"] == 8
        assert got["margin_k10_short"] >= got["margin_k10"]
        assert abs(st.probe_margin - got["margin_k10_short"]) < 1e-6
    with tartan.Index(str(tmp_path / "d"), dim=32, create=True) as ix:
        ix.add(ids, docs)
        assert ix.calibration()["calibrated"]
        with pytest.raises(ValueError):
            ix.calibrate(n_pseudo=-1)


def test_gpu_options(tmp_path, corpus):
    """gpu_devices and gpu_split reach the engine: bad values raise EINVAL before anything is
    created; good ones open an index whose CPU searches are unchanged, and a GPU search (where
    there is one) returns the CPU's documents with either split."""
    ids, docs, qs = corpus
    for kw in ({"gpu_split": "rows"}, {"gpu_devices": 0}, {"gpu_devices": -1},
               {"gpu_devices": "some"}, {"gpu_devices": True}, {"gpu_devices": 2.0}):
        with pytest.raises(tartan.EINVAL):
            tartan.Index(tmp_path / "bad", dim=32, create=True, **kw)
        assert not (tmp_path / "bad").exists()
    ref = None
    for split in ("documents", "queries", "auto", None):
        path = tmp_path / f"ix-{split}"
        with tartan.Index(path, dim=32, create=True, gpu_devices="all", gpu_split=split) as ix:
            ix.add(ids, docs)
            cpu = ix.search(qs, k=5, device="cpu", exhaustive=True)
            if ref is None:
                ref = cpu
            assert [[h[0] for h in r] for r in cpu] == [[h[0] for h in r] for r in ref]
            try:
                gpu = ix.search(qs, k=5, device="cuda", exhaustive=True)
            except tartan.ENODEV:
                continue
            for g, c in zip(gpu, cpu):
                assert g[0][0] == c[0][0]
