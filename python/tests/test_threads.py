"""Threads sharing one Index: searches run at once (the GIL is released inside the engine)
and agree with one thread's; a writer beside them; close while they run."""
import sys
import threading
import time

import numpy as np

import tartan
from conftest import make_docs, queries_from


def run_threads(n, target):
    errors = []

    def wrap(i):
        try:
            target(i)
        except BaseException as e:  # reported below, with the thread's number
            errors.append((i, e))

    ts = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_threads_search_one_index(built, corpus):
    ids, docs, qs = corpus
    want_plaid = built.search(qs, k=10)
    want_exact = built.search(qs, k=10, exhaustive=True)
    got = {}

    def searcher(i):
        for rep in range(6):
            q = qs[(i + rep) % len(qs)]
            j = (i + rep) % len(qs)
            if rep % 2:
                got[(i, rep)] = (built.search(q, k=10, exhaustive=True)[0], want_exact[j])
            else:
                got[(i, rep)] = (built.search_arrays(q[None], k=10, threads=1)[0],
                                 want_plaid[j])

    run_threads(8, searcher)
    assert len(got) == 48
    for a, b in got.values():
        assert a == b


def test_gil_is_released_during_a_search(tmp_path, rng):
    """A Python thread keeps running while another thread's search is inside the engine.
    The switch interval is raised above the call's length, so that with the GIL held for
    the call the other thread could not run at all until well after it returned."""
    docs = make_docs(rng, 800, 32, lo=40, hi=80)
    qs = queries_from(rng, docs, 32, 16)
    with tartan.Index(tmp_path / "ix", dim=32, create=True, n_centroids=256) as ix:
        ix.add([f"d{i}" for i in range(len(docs))], docs)
        ticks = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                ticks[0] += 1

        interval = sys.getswitchinterval()
        # Before the thread starts, so that its every wait for the GIL uses it.
        sys.setswitchinterval(1.0)
        t = threading.Thread(target=spin)
        t.start()
        try:
            time.sleep(0.05)
            # Repeat until one call lasts long enough to tell (each is tens of ms). Its
            # time is the engine's own: getting the GIL back after it may wait for the
            # other thread's switch interval.
            for _ in range(6):
                before = ticks[0]
                took = ix.search_arrays(qs, k=10, exhaustive=True, threads=1).stats.seconds_total
                during = ticks[0] - before
                if took > 0.03:
                    break
        finally:
            sys.setswitchinterval(interval)
            stop.set()
            t.join()
        assert 0.01 < took < 0.9, f"a {took:.3f} s search cannot tell"
        assert during > 10000, f"only {during} ticks of the other thread in a {took:.3f} s search"


def test_writer_beside_searchers(built, corpus, rng):
    """Adds and deletes in one thread while others search: each search sees a consistent
    snapshot (results among the ids that existed), and nothing fails."""
    ids, docs, qs = corpus
    extra = make_docs(rng, 40, 32)
    done = threading.Event()
    known = set(ids) | {f"new{i}" for i in range(len(extra))}

    def worker(i):
        if i == 0:
            for j in range(0, len(extra), 5):
                built.add([f"new{j + m}" for m in range(5)], extra[j:j + 5])
                built.delete([f"doc{j}"])
            done.set()
            return
        while not done.is_set():
            for hits in built.search(qs, k=5):
                assert len(hits) == 5 and {d for d, _ in hits} <= known

    run_threads(4, worker)
    assert len(built) == 300 + 40 - 8
    assert built.check().ok


def test_close_while_searching(tmp_path, rng):
    """close() from another thread waits for the searches in flight, then later calls
    raise EINVAL; nothing crashes."""
    docs = make_docs(rng, 600, 32, lo=40, hi=80)
    qs = queries_from(rng, docs, 32, 16)
    ix = tartan.Index(tmp_path / "ix", dim=32, create=True)
    ix.add([f"d{i}" for i in range(len(docs))], docs)
    started = threading.Barrier(5)
    outcomes = []

    def searcher(i):
        started.wait()
        for _ in range(20):
            try:
                r = ix.search(qs, k=5, exhaustive=True)
                assert len(r) == len(qs)
                outcomes.append("ok")
            except tartan.EINVAL:
                outcomes.append("closed")
                return

    ts = [threading.Thread(target=searcher, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    started.wait()
    time.sleep(0.01)
    ix.close()
    for t in ts:
        t.join()
    assert ix.closed and "closed" in outcomes
