"""Embeddings reach the engine as the caller's own memory where the layout allows, and
float16 / bfloat16 / torch inputs are taken as they are."""
import tracemalloc

import numpy as np
import pytest

import tartan
from conftest import make_docs

last_input = tartan._tartan._last_input


def bf16_bits(a):
    """float32 -> bfloat16 bits (uint16), rounding to nearest even, as the tool's files hold."""
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_add_and_search_pass_the_callers_pointer(tmp_path, rng, dtype):
    docs = make_docs(rng, 120, 16, lo=9)
    flat32 = np.concatenate(docs)
    flat = bf16_bits(flat32) if dtype == "bfloat16" else flat32.astype(dtype)
    lens = np.array([len(d) for d in docs])
    ids = [f"d{i}" for i in range(len(docs))]
    with tartan.Index(tmp_path / "ix", dim=16, create=True) as ix:
        _, copied0 = last_input()
        ix.add(ids, flat, lens)
        assert last_input() == (flat.ctypes.data, copied0)
        # Views of one array, in order: the same memory, no copy.
        ix.add([f"v{i}" for i in range(len(docs))], np.split(flat, np.cumsum(lens)[:-1]))
        assert last_input() == (flat.ctypes.data, copied0)
        q = flat[:24].reshape(3, 8, 16)
        ix.search(q, k=3)
        assert last_input() == (q.ctypes.data, copied0)
        ix.search([q[0], q[1], q[2][:5]], k=3)  # back to back: no copy either
        assert last_input() == (q.ctypes.data, copied0)
        ix.search([q[0], q[1][:5], q[2]], k=3)  # a gap: joined once
        assert last_input()[1] == copied0 + 21 * 16 * flat.itemsize
        copied0 = last_input()[1]
        # Separate arrays are joined once, and counted.
        ix.add(["s1", "s2"], [flat[:5].copy(), flat[5:9].copy()])
        assert last_input()[1] == copied0 + 9 * 16 * flat.itemsize


def test_no_copy_of_a_large_batch(tmp_path, rng):
    """Adding a flat batch allocates nothing of its size on the Python side (NumPy's
    allocations are traced by tracemalloc; the engine's own C allocations are not, and are
    what the engine would make anyway)."""
    tokens, dim = 60_000, 32
    emb = rng.standard_normal((tokens, dim)).astype(np.float32)
    lens = np.full(tokens // 60, 60, np.int64)
    ids = [f"d{i}" for i in range(lens.shape[0])]
    with tartan.Index(tmp_path / "ix", dim=dim, create=True, n_centroids=256) as ix:
        tracemalloc.start()
        ix.add(ids, emb, lens)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert ix.info().n_tokens == tokens
    assert peak < emb.nbytes // 20, f"{peak} bytes traced while adding {emb.nbytes}"


def test_half_precision_queries_and_documents(tmp_path, rng):
    """float16 and bfloat16 input gives the float32 results up to the input's rounding."""
    docs = make_docs(rng, 200, 32, lo=6)
    ids = [f"d{i}" for i in range(len(docs))]
    qs = np.stack([d[:6] for d in docs[:10]])
    with tartan.Index(tmp_path / "ix", dim=32, create=True) as ix:
        ix.add(ids, docs)
        ref = ix.search(qs, k=5, exhaustive=True)
        for q in (qs.astype(np.float16), bf16_bits(qs)):
            got = ix.search(q, k=5, exhaustive=True)
            for a, b in zip(got, ref):
                assert a[0][0] == b[0][0]
                assert a[0][1] == pytest.approx(b[0][1], abs=0.05)
        # Mixed element types in one list become float32.
        mixed = [qs[0], qs[1].astype(np.float16), bf16_bits(qs[2])]
        got = ix.search(mixed, k=5, exhaustive=True)
        assert [h[0][0] for h in got] == [h[0][0] for h in ref[:3]]
        # float64 is taken as float32 (a conversion, so a copy).
        assert ix.search(qs.astype(np.float64), k=5, exhaustive=True) == ref
        # Strided and big-endian arrays are made contiguous.
        wide = np.zeros((10, 6, 64), np.float32)
        wide[:, :, ::2] = qs
        assert ix.search(wide[:, :, ::2], k=5, exhaustive=True) == ref
        assert ix.search(qs.astype(">f4"), k=5, exhaustive=True) == ref
    for name, conv in (("f16", lambda d: d.astype(np.float16)), ("bf16", bf16_bits)):
        with tartan.Index(tmp_path / name, dim=32, create=True) as ix:
            ix.add(ids, [conv(d) for d in docs])
            got = ix.search(qs, k=5, exhaustive=True)
            assert [h[0][0] for h in got] == [h[0][0] for h in ref]


def test_ml_dtypes_bfloat16(tmp_path, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    docs = make_docs(rng, 50, 16)
    bf = [d.astype(ml_dtypes.bfloat16) for d in docs]
    with tartan.Index(tmp_path / "a", dim=16, create=True) as a, \
            tartan.Index(tmp_path / "b", dim=16, create=True) as b:
        a.add([f"d{i}" for i in range(50)], bf)
        b.add([f"d{i}" for i in range(50)], [bf16_bits(d.astype(np.float32)) for d in bf])
        q = bf[3][:4]
        assert a.search(q, k=3) == b.search(q.view(np.uint16), k=3)
        flat = np.concatenate(bf)
        a.search(flat[:8], k=1)
        assert last_input()[0] == flat.ctypes.data


def test_torch_tensors(tmp_path, rng):
    """CPU tensors of float32, float16 and bfloat16 are read in place; the results equal
    NumPy's. CUDA tensors are copied to the host first (the engine reads host memory)."""
    torch = pytest.importorskip("torch")
    docs = make_docs(rng, 80, 16, lo=5)
    ids = [f"d{i}" for i in range(80)]
    qs = np.stack([d[:5] for d in docs[:6]])
    with tartan.Index(tmp_path / "ix", dim=16, create=True) as ix:
        ix.add(ids, [torch.from_numpy(d) for d in docs])
        ref = ix.search(qs, k=4, exhaustive=True)
        t = torch.from_numpy(qs)
        assert ix.search(t, k=4, exhaustive=True) == ref
        assert last_input()[0] == t.data_ptr()
        assert ix.search(list(t), k=4, exhaustive=True) == ref
        th = t.to(torch.float16)
        assert ix.search(th, k=4, exhaustive=True) == ix.search(th.numpy(), k=4, exhaustive=True)
        assert last_input()[0] == th.data_ptr()
        tb = t.to(torch.bfloat16)
        bits = tb.view(torch.int16).numpy().view(np.uint16)
        assert ix.search(tb, k=4, exhaustive=True) == ix.search(bits, k=4, exhaustive=True)
        assert last_input()[0] == tb.data_ptr()
        tg = t.clone().requires_grad_(True)
        assert ix.search(tg, k=4, exhaustive=True) == ref
        if torch.cuda.is_available():
            assert ix.search(t.cuda(), k=4, exhaustive=True) == ref
