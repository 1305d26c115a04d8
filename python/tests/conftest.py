"""Shared fixtures: random corpora, fresh index directories, the `tartan` command."""
import os
import shutil
import subprocess
import zlib

import numpy as np
import pytest

import tartan

HERE = os.path.dirname(os.path.abspath(__file__))


def tartan_command():
    """The tartan command of the build tree: $TARTAN_BIN (tests/check_python.sh sets it),
    else the repository root's ./tartan, else one on PATH; None when there is none."""
    cand = [os.environ.get("TARTAN_BIN"), os.path.join(HERE, "..", "..", "tartan"),
            shutil.which("tartan")]
    for c in cand:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


@pytest.fixture(scope="session")
def tartan_bin():
    b = tartan_command()
    if b is None:
        pytest.skip("no tartan command (build the repository, or set TARTAN_BIN)")
    return b


def run_tool(tartan_bin, *args, check=True):
    """Runs `tartan ARGS`; returns its stdout (str). Raises with stderr on failure."""
    p = subprocess.run([tartan_bin, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"tartan {' '.join(map(str, args))}: exit {p.returncode}\n{p.stderr}")
    return p.stdout


def make_docs(rng, n_docs, dim, lo=4, hi=40, dtype=np.float32):
    """n_docs documents of random lengths, tokens around a few shared directions so that
    centroids mean something (as in real ColBERT tokens)."""
    centers = rng.standard_normal((16, dim))
    docs = []
    for _ in range(n_docs):
        n = int(rng.integers(lo, hi + 1))
        c = centers[rng.integers(0, 16, size=n)]
        docs.append((c + 0.6 * rng.standard_normal((n, dim))).astype(dtype))
    return docs


def queries_from(rng, docs, n_queries, qlen, noise=0.3):
    """Queries made of noisy tokens of random documents: each has a clear best document."""
    dim = docs[0].shape[1]
    qs = np.empty((n_queries, qlen, dim), np.float32)
    for i in range(n_queries):
        d = docs[int(rng.integers(0, len(docs)))]
        rows = d[rng.integers(0, d.shape[0], size=qlen)]
        qs[i] = rows + noise * rng.standard_normal(rows.shape)
    return qs


def maxsim_reference(q, docs):
    """Exact MaxSim of query q [lq, d] against every document, in float64 on L2-normalised
    tokens (the engine's definition, without its quantisation)."""
    q = q.astype(np.float64)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    out = np.empty(len(docs))
    for i, d in enumerate(docs):
        d = d.astype(np.float64)
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        out[i] = (q @ d.T).max(axis=1).sum()
    return out


# Fresh random inputs every run; TARTAN_TEST_SEED=N repeats a run (the header prints N).
BASE_SEED = int(os.environ.get("TARTAN_TEST_SEED") or np.random.SeedSequence().entropy % 2**31)


def pytest_report_header(config):
    return f"tartan: TARTAN_TEST_SEED={BASE_SEED}, libtartan {tartan.version()}"


@pytest.fixture
def rng(request):
    return np.random.default_rng([BASE_SEED, zlib.crc32(request.node.nodeid.encode())])


@pytest.fixture
def corpus(rng):
    """300 documents of dim 32 and ids, plus 12 queries of 8 tokens."""
    docs = make_docs(rng, 300, 32)
    ids = [f"doc{i}" for i in range(len(docs))]
    qs = queries_from(rng, docs, 12, 8)
    return ids, docs, qs


@pytest.fixture
def built(tmp_path, corpus):
    """An index of `corpus`, open; closed after the test."""
    ids, docs, qs = corpus
    ix = tartan.Index(tmp_path / "ix", dim=32, create=True)
    ix.add(ids, docs)
    yield ix
    ix.close()


def snapshot(ix, qs):
    """What an index holds, as far as a caller can see: info and exhaustive results."""
    info = ix.info()
    return (info.n_docs, info.n_tokens, info.n_centroids,
            ix.search(qs, k=20, exhaustive=True), ix.search(qs, k=5))
