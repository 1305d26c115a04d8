"""tartan: late-interaction retrieval (ColBERT, ColPali) for Python, over libtartan.

An index is a directory holding one LMDB environment with a PLAID index. Open it with
:class:`Index`, add documents (one transaction each), search with queries of any length,
delete by id::

    import numpy as np, tartan

    with tartan.Index("my.idx", create=True) as ix:        # dim comes from the first add
        ix.add(["a", "b"], [np.random.rand(30, 128).astype(np.float32),
                            np.random.rand(12, 128).astype(np.float32)])
        hits = ix.search(np.random.rand(1, 32, 128).astype(np.float32), k=2)
        # hits[0] == [("a", 11.9), ("b", 11.7)]

Embeddings are float32, float16 or bfloat16 NumPy arrays or torch tensors. C-contiguous
input reaches the engine as its own memory (no copy by the binding); other layouts are made
contiguous once. Every engine call releases the GIL. Failures raise :class:`Error` subclasses
named after the engine's codes (``tartan.EDIM``, ``tartan.ENONFINITE``, ...), or
:class:`ErrnoError` for system errors. See python/README.md.
"""
from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _tartan
from ._tartan import Error, ErrnoError

__version__ = "0.1.0"

# One exception class per engine code, made by the extension from the header's error list
# (TARTAN_ERRNO_MAP): tartan.EINVAL, tartan.EDIM, ... Argument errors also derive from
# ValueError (EDTYPE from TypeError).
ERROR_CODES: dict = dict(_tartan.ERROR_CODES)
for _name in ERROR_CODES:
    globals()[_name] = getattr(_tartan, _name)
del _name

#: Type accepted for ids: str (UTF-8) or bytes.
Id = Union[str, bytes]
#: A search hit: (external id, MaxSim score).
Hit = Tuple[str, float]

_DEVICES = {None: _tartan.DEVICE_AUTO, "auto": _tartan.DEVICE_AUTO, "cpu": _tartan.DEVICE_CPU,
            "cuda": _tartan.DEVICE_CUDA}
_GPU_MODES = {None: _tartan.GPU_AUTO, "auto": _tartan.GPU_AUTO,
              "resident": _tartan.GPU_RESIDENT, "streaming": _tartan.GPU_STREAMING}
_GPU_SPLITS = {None: _tartan.GPU_SPLIT_AUTO, "auto": _tartan.GPU_SPLIT_AUTO,
               "documents": _tartan.GPU_SPLIT_DOCUMENTS, "queries": _tartan.GPU_SPLIT_QUERIES}


def _raise(cls_name: str, detail: str) -> None:
    """Raises the engine's exception class cls_name ('EDIM') for an error the binding finds."""
    cls = getattr(_tartan, cls_name)
    exc = cls(f"TARTAN_{cls_name}: {detail}")
    exc.code = ERROR_CODES[cls_name][0]
    exc.name = f"TARTAN_{cls_name}"
    exc.message = str(exc)
    raise exc


def _device_code(device: Optional[str]) -> int:
    if device is not None and not isinstance(device, str):
        device = str(device)  # a torch.device
    key = device.split(":")[0] if device else device
    if key not in _DEVICES:
        _raise("EINVAL", f"device is 'auto', 'cpu' or 'cuda', not {device!r}")
    return _DEVICES[key]


# ----------------------------------------------------------------------------------------
# Arrays: what the engine reads, as views of the caller's memory where the layout allows
# ----------------------------------------------------------------------------------------

def _is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach")


def _from_torch(t: Any, what: str) -> Tuple[np.ndarray, int]:
    """A torch tensor as a NumPy view of its memory (CPU tensors) and its dtype code.

    CUDA (and other device) tensors are copied to host memory first: the engine reads host
    memory, and makes its own normalised copy on the GPU when it searches there.
    """
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    name = str(t.dtype)
    if name == "torch.bfloat16":
        # NumPy has no bfloat16: the same bytes as uint16, tagged as bfloat16 for the engine.
        import torch  # only reached with a tensor in hand, so torch is importable

        return t.view(torch.int16).numpy().view(np.uint16), _tartan.BFLOAT16
    if name == "torch.float32":
        return t.numpy(), _tartan.FLOAT32
    if name == "torch.float16":
        return t.numpy(), _tartan.FLOAT16
    if t.is_floating_point():
        import torch

        return t.to(torch.float32).numpy(), _tartan.FLOAT32
    _raise("EDTYPE", f"{what} of dtype {name}: tartan takes float32, float16 or bfloat16")
    raise AssertionError  # unreachable


def _array(x: Any, what: str) -> Tuple[np.ndarray, int]:
    """x as a C-contiguous NumPy array in native byte order and its engine dtype code.

    No copy for C-contiguous float32, float16 and bfloat16 (ml_dtypes' NumPy bfloat16, a
    torch bfloat16 tensor, or uint16 holding bfloat16 bits as the tool's .npy files do).
    float64 and other float types are converted to float32 (a copy); strided or
    non-native-endian arrays are copied once into C order.
    """
    if _is_torch(x):
        arr, code = _from_torch(x, what)
    else:
        arr = np.asarray(x)
        dt = arr.dtype
        if dt == np.float32:
            code = _tartan.FLOAT32
        elif dt == np.float16:
            code = _tartan.FLOAT16
        elif dt.name == "bfloat16" and dt.itemsize == 2:
            arr, code = arr.view(np.uint16), _tartan.BFLOAT16
        elif dt == np.uint16:
            code = _tartan.BFLOAT16
        elif dt.kind == "f":
            arr, code = arr.astype(np.float32), _tartan.FLOAT32
        else:
            _raise("EDTYPE", f"{what} of dtype {dt}: tartan takes float32, float16 or "
                             "bfloat16")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr, code


def _pieces(items: Sequence[Any], what: str) -> Tuple[List[np.ndarray], int, int]:
    """A list of [n_i, d] arrays as (arrays, dtype code, d), all of one dtype."""
    arrs, codes = [], []
    for i, x in enumerate(items):
        a, c = _array(x, what)
        if a.ndim != 2:
            _raise("EDIM", f"{what} {i} has shape {a.shape}; each must be [tokens, dim]")
        arrs.append(a)
        codes.append(c)
    if not arrs:
        return arrs, _tartan.FLOAT32, 0
    dims = {a.shape[1] for a in arrs}
    if len(dims) > 1:
        _raise("EDIM", f"{what}s of dimensions {sorted(dims)} in one call")
    if len(set(codes)) > 1:  # mixed element types: one common type, float32 (a copy)
        return [_as_float32(a, c) for a, c in zip(arrs, codes)], _tartan.FLOAT32, dims.pop()
    return arrs, codes[0], dims.pop()


def _as_float32(a: np.ndarray, code: int) -> np.ndarray:
    if code == _tartan.BFLOAT16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def _lengths(lens: Any, what: str) -> np.ndarray:
    """Lengths as the uint64 array the engine reads as size_t (no copy when they are)."""
    a = np.asarray(lens)
    if a.ndim != 1:
        _raise("EINVAL", f"{what} must be one-dimensional, not of shape {a.shape}")
    if a.size and a.dtype.kind not in "iu":
        _raise("EINVAL", f"{what} must be integers, not {a.dtype}")
    if a.size and a.dtype.kind == "i" and (a < 0).any():
        i = int(np.argmax(a < 0))
        _raise("EINVAL", f"{what}[{i}] is {int(a[i])}")
    return np.ascontiguousarray(a, dtype=np.uint64)


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or _is_torch(x)


# ----------------------------------------------------------------------------------------
# Results and descriptions
# ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SearchStats:
    """Where a search spent its time (seconds, thread time summed over the batch's queries,
    except ``seconds_total``, the call's wall time) and how many documents each stage saw."""

    seconds_candidates: float
    seconds_prune: float
    seconds_exact: float
    seconds_total: float
    n_candidates: int
    n_exact: int
    n_probes: int = 0  # centroids probed, summed over the queries' tokens
    probe_margin: float = -1.0  # stage 1's probe margin (-1: fixed ncells)
    rerank_z: float = 0.0  # stage 3's stopping rule's z (0: fixed ndocs)


@dataclass(frozen=True)
class Hits:
    """A batch's results as arrays, width ``w`` = the most hits any query got (at most k).

    ``ids[i, j]`` (object array of str) and ``scores[i, j]`` (float32) are query i's j-th
    best hit for ``j < counts[i]``; past that, ``ids`` holds None and ``scores`` -inf.
    """

    ids: np.ndarray
    scores: np.ndarray
    counts: np.ndarray
    stats: SearchStats

    def __len__(self) -> int:
        return int(self.counts.shape[0])

    def __getitem__(self, i: int) -> List[Hit]:
        n = int(self.counts[i])
        return list(zip(self.ids[i, :n].tolist(), self.scores[i, :n].tolist()))

    def tolist(self) -> List[List[Hit]]:
        """The same hits as :meth:`Index.search` returns them."""
        return [self[i] for i in range(len(self))]


@dataclass(frozen=True)
class IndexInfo:
    """What an index holds and where its bytes go (tartan_index_info)."""

    n_docs: int
    n_tokens: int
    dim: int
    nbits: int
    n_centroids: int
    code_bytes: int
    bytes_residuals: int
    bytes_codes: int
    bytes_norms: int
    bytes_docs: int
    bytes_ivf: int
    ivf_entries: int
    bytes_ids: int
    bytes_centroids: int
    bytes_meta: int
    bytes_free: int
    bytes_file: int
    map_size: int
    format: int = 2  # the on-disk format version: 3 with the axes code
    codec: str = "scalar"  # the residual code the index holds: 'scalar' or 'axes'


@dataclass(frozen=True)
class Problem:
    """One problem ``Index.check`` found: a short stable kind and a message."""

    kind: str
    message: str


@dataclass(frozen=True)
class CheckReport:
    """The outcome of :meth:`Index.check`: sound when ``n_problems`` is 0."""

    n_problems: int
    problems: List[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.n_problems == 0

    def __bool__(self) -> bool:
        return self.ok


# ----------------------------------------------------------------------------------------
# The index
# ----------------------------------------------------------------------------------------

class Index:
    """An open tartan index (one LMDB directory holding a PLAID index).

    Args:
        path: the index directory.
        dim: the embedding dimension. Needed to create an index, unless it is left to the
            first :meth:`add` (``create=True`` with ``dim=None``: the directory is created
            then, with the first batch's dimension). When opening, None or the index's.
        create: create the index (and its directory) if there is none.
        exclusive: with ``create``, fail with :class:`EEXIST` if an index exists.
        readonly: open read-only (changes raise :class:`EREADONLY`).
        nbits: residual bits per dimension (1, 2, 4 or 8), used when creating.
        n_centroids: centroids to train; None: 2^floor(log2(16 sqrt(tokens))).
        kmeans_iters: k-means iterations when training.
        sample_docs: documents the first add trains from; None: PLAID's rule.
        seed: sampling and k-means seed.
        map_size: initial LMDB map size in bytes; None: 256 MiB (it grows by itself).
        device: 'auto' (default), 'cpu' or 'cuda': where searches, k-means and encoding run.
        gpu_mode: 'auto', 'resident' or 'streaming': how a GPU search holds the index.
        gpu_devices: GPUs a GPU search uses: None (the TARTAN_GPU_DEVICES variable, else 1),
            'all', or a number (the first N visible).
        gpu_split: how several GPUs share a search: 'queries' (a copy of the index on each,
            a share of each batch's queries), 'documents' (a partition of the documents on
            each, the top k merged), or 'auto'/None (the TARTAN_GPU_SPLIT variable, else
            copies while one fits in a third of a GPU's memory).
        codec: the residual code a training fits: 'scalar' (default: one table for every
            dimension), 'axes' (the residuals' principal axes, more bits where they vary
            most: more faithful at the same bytes on anisotropic embeddings; nbits 1, 2 or
            4; GPU search is fast on it at dims 64, 96 and 128 only) or 'auto' (axes where
            it cuts the held-out error by 10% or more and the GPU reads it fast, else
            scalar). An index keeps the code it was trained with.

    The index is a context manager (``with tartan.Index(...) as ix:``) and closes on exit.
    Threads may share one Index: searches run at once (the GIL is released), changes are
    serialised by the engine. Never open the same index twice in one process (LMDB's rule);
    share the object instead. Every :meth:`add`, :meth:`delete` and :meth:`train` is one
    transaction: it lands whole or not at all, and a call that raises leaves the index as
    it was.
    """

    def __init__(self, path: Union[str, os.PathLike], dim: Optional[int] = None,
                 create: bool = False, *, exclusive: bool = False, readonly: bool = False,
                 nbits: int = 2, n_centroids: Optional[int] = None, kmeans_iters: int = 4,
                 sample_docs: Optional[int] = None, seed: int = 42,
                 map_size: Optional[int] = None, device: Optional[str] = None,
                 gpu_mode: Optional[str] = None, gpu_devices: Union[None, int, str] = None,
                 gpu_split: Optional[str] = None, codec: str = "scalar") -> None:
        self.path = os.fspath(path)
        if gpu_mode not in _GPU_MODES:
            _raise("EINVAL", f"gpu_mode is 'auto', 'resident' or 'streaming', not {gpu_mode!r}")
        if gpu_split not in _GPU_SPLITS:
            _raise("EINVAL", f"gpu_split is 'auto', 'documents' or 'queries', not {gpu_split!r}")
        codecs = {"scalar": 0, "axes": 1, "auto": 2}
        if codec not in codecs:
            _raise("EINVAL", f"codec is 'scalar', 'axes' or 'auto', not {codec!r}")
        if gpu_devices is None:
            ndev = 0
        elif gpu_devices == "all":
            ndev = -1
        elif isinstance(gpu_devices, int) and not isinstance(gpu_devices, bool) \
                and 1 <= gpu_devices <= 1024:
            ndev = gpu_devices
        else:
            _raise("EINVAL", f"gpu_devices is None, 'all' or a number of GPUs (1 to 1024), "
                             f"not {gpu_devices!r}")
        flags = (_tartan.READONLY if readonly else 0)
        self._opts = dict(nbits=nbits, n_centroids=n_centroids or 0, kmeans_iters=kmeans_iters,
                          sample_docs=sample_docs or 0, seed=seed, map_size=map_size or 0,
                          device=_device_code(device), gpu_mode=_GPU_MODES[gpu_mode],
                          gpu_devices=ndev, gpu_split=_GPU_SPLITS[gpu_split],
                          codec=codecs[codec])
        self._lock = threading.Lock()
        self._db: Optional[_tartan.Db] = None
        self._pending_flags: Optional[int] = None
        if create and not readonly:
            flags |= _tartan.CREATE | (_tartan.EXCL if exclusive else 0)
            if dim is None:
                # Open what is there; with nothing there, create at the first add.
                try:
                    self._db = _tartan.Db(self.path, flags & ~_tartan.CREATE & ~_tartan.EXCL,
                                          0, **self._opts)
                    if exclusive:
                        self._db.close()
                        self._db = None
                        _raise("EEXIST", f"'{self.path}': an index exists here already")
                except _tartan.ENOINDEX:
                    self._pending_flags = flags
                except ErrnoError as e:
                    if e.errno != errno.ENOENT:
                        raise
                    self._pending_flags = flags
                return
        self._db = _tartan.Db(self.path, flags, dim or 0, **self._opts)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the index. Calls in flight in other threads finish first; later calls
        raise :class:`EINVAL`. Closing twice is fine."""
        with self._lock:
            self._pending_flags = None
            if self._db is not None:
                self._db.close()

    @property
    def closed(self) -> bool:
        db = self._db
        return self._pending_flags is None and (db is None or db.closed)

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("not created yet" if self._db is None else "open")
        return f"tartan.Index({self.path!r}, {state})"

    def _handle(self) -> Optional["_tartan.Db"]:
        """The handle, None while creation waits for the first add."""
        db = self._db
        if db is None and self._pending_flags is None:
            _raise("EINVAL", f"'{self.path}': the index is closed")
        return db

    def _handle_for_write(self, dim: int) -> "_tartan.Db":
        db = self._db
        if db is not None:
            return db
        with self._lock:
            if self._db is None:
                if self._pending_flags is None:
                    _raise("EINVAL", f"'{self.path}': the index is closed")
                if dim < 1:
                    _raise("EEMPTY", "no documents: the first add sets the index's dimension")
                self._db = _tartan.Db(self.path, self._pending_flags, dim, **self._opts)
                self._pending_flags = None
            return self._db

    # -- changes ------------------------------------------------------------------------------

    def _batch(self, embeddings: Any, doclens: Any, n_docs: Optional[int], what: str
               ) -> Tuple[List[np.ndarray], np.ndarray, int, int, int]:
        """(pieces, doclens uint64, n_rows, dim, dtype code) of a batch of documents."""
        if doclens is not None:
            arr, code = _array(embeddings, what)
            if arr.ndim != 2:
                _raise("EDIM", f"{what} with doclens must be [tokens, dim], not {arr.shape}")
            return [arr], _lengths(doclens, "doclens"), arr.shape[0], arr.shape[1], code
        if _is_array(embeddings):
            arr, code = _array(embeddings, what)
            if arr.ndim == 3:  # [n_docs, tokens, dim]: documents of one length
                lens = np.full(arr.shape[0], arr.shape[1], dtype=np.uint64)
                return [arr], lens, arr.shape[0] * arr.shape[1], arr.shape[2], code
            _raise("EINVAL", f"{what} of shape {arr.shape}: give a list of [tokens, dim] "
                             "arrays, a [docs, tokens, dim] array, or [tokens, dim] with doclens")
        arrs, code, dim = _pieces(list(embeddings), what)
        lens = np.fromiter((a.shape[0] for a in arrs), dtype=np.uint64, count=len(arrs))
        return arrs, lens, int(lens.sum()), dim, code

    def add(self, ids: Sequence[Id], embeddings: Any, doclens: Optional[Any] = None, *,
            replace: bool = False, calibrate: bool = True) -> None:
        """Adds documents in one transaction.

        Args:
            ids: one external id per document (str or bytes; 1 to 511 bytes, no control
                characters, unique).
            embeddings: a list of ``[n_i, dim]`` arrays or tensors (one per document), or a
                flat ``[T, dim]`` array with ``doclens``, or a ``[n_docs, tokens, dim]`` array.
            doclens: tokens of each document, summing to T, with a flat array.
            replace: replace documents whose ids the index has, instead of refusing them.
            calibrate: afterwards, calibrate the adaptive search (:meth:`calibrate`) when the
                index has no calibration or its documents changed more than twofold since, as
                ``tartan add`` does; False leaves it to the caller.

        The first add to an untrained index trains the centroids and codec from a sample of
        its documents. A C-contiguous array (or a list of arrays lying back to back in one
        buffer) goes to the engine without a copy; separate arrays are joined once.

        Raises:
            EDIM, ENONFINITE, ERANGE (a zero token), EEMPTY, EDUPID, EBADID, ETOOBIG,
            EREADONLY, EDTYPE, ...: nothing is added.
        """
        if isinstance(ids, (str, bytes)):
            raise TypeError("ids must be a sequence of ids, not one str")
        pieces, lens, n_rows, dim, code = self._batch(embeddings, doclens, None, "document")
        ids = ids if isinstance(ids, (list, tuple)) else list(ids)
        if len(ids) != lens.shape[0]:
            _raise("EINVAL", f"{len(ids)} ids for {lens.shape[0]} documents")
        db = self._handle_for_write(dim)
        db.add(ids, pieces, lens, n_rows, dim, code, _tartan.REPLACE if replace else 0)
        if calibrate:
            cal = db.calibration()
            if not cal["calibrated"] or cal["stale"]:
                db.calibrate()

    def calibrate(self, n_pseudo: int = 0, reference_docs: int = 0, seed: int = 42,
                  threads: int = 0) -> Dict[str, Any]:
        """Measures how wide the adaptive search must probe to keep each share of exhaustive
        search's top 10 and top 100 (pseudo-queries drawn from the index's documents against
        an exhaustive reference over at most ``reference_docs`` of them, 0: 20,000) and
        stores it in the index (tartan_calibrate). Returns what was measured: margins,
        recall at k 10 and 100, candidates, seconds. Raises EEMPTY on an empty index."""
        db = self._handle()
        if db is None:
            _raise("EEMPTY", "calibrate: the index has no documents yet")
        return db.calibrate(int(n_pseudo), int(reference_docs), int(seed), int(threads))

    def calibration(self) -> Dict[str, Any]:
        """The stored calibration (``calibrated`` False when none; ``stale`` True when the
        documents changed more than twofold since)."""
        db = self._handle()
        if db is None:
            return dict(calibrated=0)
        return db.calibration()

    def train(self, sample: Any, doclens: Optional[Any] = None, corpus_tokens: int = 0) -> None:
        """Trains centroids and codec from a sample before any add (for corpora larger than
        memory: sample ``sample_docs(N)`` documents, train, then add in batches).

        Args:
            sample: documents as for :meth:`add` (ids are not needed).
            corpus_tokens: the whole corpus's token count (it sizes the centroid table);
                0: the sample's own.
        """
        pieces, lens, n_rows, dim, code = self._batch(sample, doclens, None, "sample document")
        db = self._handle_for_write(dim)
        db.train(pieces, lens, lens.shape[0], n_rows, dim, code, corpus_tokens)

    def delete(self, ids: Iterable[Id]) -> int:
        """Deletes the documents with these ids in one transaction; ids the index does not
        have are skipped. Returns the number deleted."""
        if isinstance(ids, (str, bytes)):
            raise TypeError("ids must be a sequence of ids, not one str")
        db = self._handle()
        ids = ids if isinstance(ids, (list, tuple)) else list(ids)
        if db is None:
            return 0
        return db.delete(ids)

    # -- search ------------------------------------------------------------------------------

    def _queries(self, queries: Any) -> Tuple[List[np.ndarray], Optional[np.ndarray], int, int,
                                              int, int, int]:
        """(pieces, qlens or None, qlen, n_queries, n_rows, dim, dtype code)."""
        if _is_array(queries):
            arr, code = _array(queries, "query")
            if arr.ndim == 2:  # one query [tokens, dim]
                arr = arr[None]
            if arr.ndim != 3:
                _raise("EINVAL", f"queries of shape {arr.shape}: give [queries, tokens, dim] "
                                 "or a list of [tokens, dim] arrays")
            nq, lq, dim = arr.shape
            return [arr], None, lq, nq, nq * lq, dim, code
        arrs, code, dim = _pieces(list(queries), "query")
        lens = np.fromiter((a.shape[0] for a in arrs), dtype=np.uint64, count=len(arrs))
        return arrs, lens, 0, len(arrs), int(lens.sum()), dim, code

    def _search(self, queries: Any, k: int, exhaustive: bool, subset: Optional[Iterable[Id]],
                recall_target: Optional[float], device: Optional[str], ncells: Optional[int],
                threshold: Optional[float], ndocs: Optional[int], threads: int,
                arrays: bool) -> Any:
        pieces, qlens, qlen, nq, n_rows, dim, code = self._queries(queries)
        if subset is not None:
            if isinstance(subset, (str, bytes)):
                raise TypeError("subset must be a sequence of ids, not one str")
            subset = subset if isinstance(subset, (list, tuple)) else list(subset)
        db = self._handle()
        if db is None:  # created at the first add: nothing to find yet
            stats = dict(seconds_candidates=0.0, seconds_prune=0.0, seconds_exact=0.0,
                         seconds_total=0.0, n_candidates=0, n_exact=0)
            if not arrays:
                return [[] for _ in range(nq)], stats
            return ([], bytearray(), bytearray(np.zeros(nq, np.int64).tobytes()), 0), stats
        return db.search(pieces, qlens, qlen, nq, n_rows, dim, code, int(k), ncells=ncells,
                         threshold=threshold, ndocs=ndocs, exhaustive=bool(exhaustive),
                         subset=subset, threads=int(threads), device=_device_code(device),
                         recall_target=recall_target, arrays=arrays)

    def search(self, queries: Any, k: int = 10, *, exhaustive: bool = False,
               subset: Optional[Iterable[Id]] = None, recall_target: Optional[float] = None,
               device: Optional[str] = None, ncells: Optional[int] = None,
               threshold: Optional[float] = None, ndocs: Optional[int] = None,
               threads: int = 0) -> List[List[Hit]]:
        """The best k documents of each query, as ``[[(id, score), ...], ...]`` in rank order.

        Args:
            queries: ``[n_queries, tokens, dim]`` (an array or tensor), a list of
                ``[tokens_i, dim]`` arrays (queries of any lengths), or one ``[tokens, dim]``
                query. float32, float16 or bfloat16; every token counts.
            k: results per query (fewer when fewer documents qualify).
            exhaustive: score every live document exactly (slow; the reference for recall).
            subset: allowed external ids (a filter); only these can be returned.
            recall_target: the share of exhaustive search's top k that the default adaptive
                search aims to keep, in [0, 1) (None: 0.95); higher probes more.
            device: 'auto', 'cpu' or 'cuda' for this call; None: the index's.
            ncells, threshold, ndocs: PLAID's parameters (None: the defaults for k).
            threads: OpenMP threads for this call (0: OpenMP's default).

        Scores are sums over query tokens of cosines (tokens are L2-normalised). One call
        sees one snapshot of the index. Raises EDIM, ENONFINITE, ERANGE, EEMPTY, ETOOBIG,
        EBADID, ... and leaves the index unchanged (it never changes it).
        """
        return self._search(queries, k, exhaustive, subset, recall_target, device, ncells,
                            threshold, ndocs, threads, False)[0]

    def search_arrays(self, queries: Any, k: int = 10, *, exhaustive: bool = False,
                      subset: Optional[Iterable[Id]] = None,
                      recall_target: Optional[float] = None, device: Optional[str] = None,
                      ncells: Optional[int] = None, threshold: Optional[float] = None,
                      ndocs: Optional[int] = None, threads: int = 0) -> Hits:
        """Like :meth:`search`, the hits as arrays (:class:`Hits`) with the search's stats."""
        (ids, scores, counts, w), st = self._search(queries, k, exhaustive, subset,
                                                    recall_target, device, ncells, threshold,
                                                    ndocs, threads, True)
        c = np.frombuffer(counts, dtype=np.int64)
        nq = c.shape[0]
        id_arr = np.empty(nq * w, dtype=object)
        id_arr[:] = ids
        return Hits(ids=id_arr.reshape(nq, w),
                    scores=np.frombuffer(scores, dtype=np.float32).reshape(nq, w),
                    counts=c, stats=SearchStats(**st))

    # -- descriptions ------------------------------------------------------------------------

    def info(self) -> IndexInfo:
        """What the index holds (documents, tokens, dimension, ...) and its bytes by part."""
        db = self._handle()
        if db is None:
            return IndexInfo(**{f: 0 for f in IndexInfo.__dataclass_fields__
                                if f not in ("format", "codec")})
        return IndexInfo(**db.info())

    def __len__(self) -> int:
        return self.info().n_docs

    def check(self) -> CheckReport:
        """Verifies the whole index (tartan_check) and reports every problem found. A report
        with problems is returned, not raised; failures to run the check raise."""
        db = self._handle()
        if db is None:
            return CheckReport(0, [])
        n, probs = db.check()
        return CheckReport(n, [Problem(k, m) for k, m in probs])


# ----------------------------------------------------------------------------------------
# Evaluation: the tool's code (tools/evaluate.c), so BEIR runs need no second tool
# ----------------------------------------------------------------------------------------

DEFAULT_METRICS = ("ndcg_cut.10", "recall.100", "recip_rank.10", "map", "P.10")


class Evaluation(dict):
    """Mean of each measure over the queries scored, keyed by trec_eval's names
    (``ndcg_cut_10``, ``recall_100``, ``recip_rank_10``, ``map``, ``P_10``), as
    ``tartan eval`` prints them; plus ``per_query`` ({qid: {measure: value}}), ``num_q``,
    ``run_only`` (run queries without judgments) and ``qrels_only`` (judged queries absent
    from the run)."""

    per_query: dict
    num_q: int
    run_only: int
    qrels_only: int


def evaluate(qrels: Union[str, os.PathLike, Mapping[str, Mapping[str, int]]],
             run: Union[str, os.PathLike, Mapping[str, Mapping[str, float]]],
             metrics: Union[str, Sequence[str]] = DEFAULT_METRICS, *, level: int = 1,
             complete: bool = False) -> Evaluation:
    """Scores a run against qrels with trec_eval's definitions (the code of ``tartan eval``).

    Args:
        qrels: a BEIR TSV or TREC qrels file, or ``{qid: {docid: relevance}}`` (int).
        run: a TREC run file, or ``{qid: {docid: score}}`` (see :func:`run_from_results`).
        metrics: trec_eval names (``ndcg_cut.10``, ``recall.100``, ``P.10``, ``map``,
            ``recip_rank.10``) or short ones (``ndcg@10``, ``recall@100``, ``mrr@10``,
            ``p@10``), as a list or one comma-separated string.
        level: judged relevance >= level is relevant (trec_eval -l).
        complete: average over every judged query, missing ones scoring 0 (trec_eval -c).

    Documents are ordered by score, ties by docid, both descending; means are over the
    queries in both the run and the qrels.
    """
    spec = metrics if isinstance(metrics, str) else ",".join(metrics)

    def prep(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {q: (dict(d) if not isinstance(d, dict) else d) for q, d in x.items()}
        return os.fspath(x)

    r = _tartan.evaluate(prep(qrels), prep(run), spec, level=level, complete=complete)
    ev = Evaluation(zip(r["measures"], r["mean"]))
    ev.per_query = {q: dict(zip(r["measures"], v)) for q, v in zip(r["qids"], r["values"])}
    ev.num_q, ev.run_only, ev.qrels_only = r["num_q"], r["run_only"], r["qrels_only"]
    return ev


def run_from_results(query_ids: Sequence[str],
                     results: Union[Sequence[Sequence[Hit]], Hits]) -> dict:
    """A run ``{qid: {docid: score}}`` from :meth:`Index.search` results (or :class:`Hits`)
    of the queries ``query_ids``, in the same order, for :func:`evaluate`."""
    if isinstance(results, Hits):
        results = results.tolist()
    if len(query_ids) != len(results):
        _raise("EINVAL", f"{len(query_ids)} query ids for {len(results)} results")
    return {str(q): {d: float(s) for d, s in hits} for q, hits in zip(query_ids, results)}


def version() -> str:
    """The version of the libtartan linked at run time ("0.1.0")."""
    return _tartan.version()[0]


def sample_docs(n_docs: int) -> int:
    """How many documents to sample from a corpus of n_docs for :meth:`Index.train`
    (tartan_sample_docs): PLAID's min(1 + 16 sqrt(120 n_docs), n_docs)."""
    return _tartan.sample_docs(n_docs)


__all__ = ["Index", "Error", "ErrnoError", "Hits", "SearchStats", "IndexInfo", "Problem",
           "CheckReport", "Evaluation", "evaluate", "run_from_results", "version",
           "sample_docs", "ERROR_CODES", *ERROR_CODES]
