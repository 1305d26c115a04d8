"""An index for PyLate's retrievers: ``pylate.retrieve.ColBERT(index=TartanIndex(...))``.

PyLate (lightonai/pylate) calls an index through a small interface, which this class
implements without importing PyLate (or torch) itself:

- ``is_end_to_end_index = True``: the retriever hands the queries to the index and returns
  what ``__call__`` gives, with no reranking step of its own;
- ``add_documents(documents_ids, documents_embeddings) -> self``;
- ``remove_documents(documents_ids) -> self``;
- ``update_documents(documents_ids, documents_embeddings) -> self``;
- ``__call__(queries_embeddings, k=10, subset=None) -> [[{"id": ..., "score": ...}]]``,
  ``subset`` one list of ids for every query or one list per query;
- ``get_documents_embeddings``: not available (the index keeps 2-bit residuals, as PLAID's).

Example (model.encode gives lists of NumPy arrays or torch tensors)::

    from pylate import models, retrieve
    from tartan.pylate import TartanIndex

    index = TartanIndex(index_folder="indexes", index_name="scifact", override=True)
    index.add_documents(documents_ids=ids, documents_embeddings=model.encode(docs, is_query=False))
    retriever = retrieve.ColBERT(index=index)
    results = retriever.retrieve(queries_embeddings=model.encode(queries, is_query=True), k=10)

Document ids may be str or int (as PyLate's own indexes take them); the kind of the first
add is kept in ``pylate.json`` beside the engine's index, and search results give ids back as
that kind.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import Index, _is_array

DocId = Union[str, int]


def _id_kind(ids: Sequence[Any]) -> str:
    kinds = set()
    for i in ids:
        if isinstance(i, (bool, np.bool_)):
            kinds.add("other")
        elif isinstance(i, (int, np.integer)):
            kinds.add("int")
        elif isinstance(i, str):
            kinds.add("str")
        else:
            kinds.add("other")
    if kinds - {"int", "str"} or len(kinds) > 1:
        raise TypeError("document ids must be all str or all int")
    return kinds.pop() if kinds else "str"


class TartanIndex:
    """A tartan index with PyLate's index interface (``pylate.indexes.PLAID``'s calls).

    Args:
        index_folder, index_name: the index lives in ``index_folder/index_name`` (the
            engine's LMDB directory ``tartan/`` and ``pylate.json``), as PyLate's indexes.
        override: delete an index already there first.
        nbits: residual bits per dimension (1, 2, 4, 8) when creating.
        kmeans_niters: k-means iterations when training.
        n_centroids: centroids to train (None: PLAID's rule from the first batch's size).
        seed: sampling and k-means seed.
        device: 'auto', 'cpu' or 'cuda' for the engine's work (None: auto).
        ncells, ndocs, centroid_score_threshold: PLAID's search parameters (None: the
            engine's defaults for k). PyLate's ``n_ivf_probe`` and ``n_full_scores`` are taken
            as ``ncells`` and ``ndocs``.
        recall_target: passed to every search (where the linked libtartan has it).
        **kwargs: other PyLate index options (batch sizes, progress bars, ...) are accepted
            and ignored.
    """

    is_end_to_end_index = True

    def __init__(self, index_folder: str = "indexes", index_name: str = "tartan",
                 override: bool = False, *, nbits: int = 2, kmeans_niters: int = 4,
                 n_centroids: Optional[int] = None, seed: int = 42,
                 device: Optional[str] = None, ncells: Optional[int] = None,
                 ndocs: Optional[int] = None, centroid_score_threshold: Optional[float] = None,
                 recall_target: Optional[float] = None, **kwargs: Any) -> None:
        self.index_path = os.path.join(index_folder, index_name)
        if override and os.path.exists(self.index_path):
            shutil.rmtree(self.index_path)
        os.makedirs(self.index_path, exist_ok=True)
        self._meta_path = os.path.join(self.index_path, "pylate.json")
        self._id_kind: Optional[str] = None
        if os.path.exists(self._meta_path):
            with open(self._meta_path, encoding="utf-8") as f:
                self._id_kind = json.load(f).get("id_kind")
        self._lock = threading.Lock()
        self.index = Index(os.path.join(self.index_path, "tartan"), create=True, nbits=nbits,
                           kmeans_iters=kmeans_niters, n_centroids=n_centroids, seed=seed,
                           device=device)
        self.search_params: Dict[str, Any] = dict(
            ncells=ncells if ncells is not None else kwargs.get("n_ivf_probe"),
            ndocs=ndocs if ndocs is not None else kwargs.get("n_full_scores"),
            threshold=centroid_score_threshold, recall_target=recall_target)

    def _keys(self, ids: Sequence[Any], adding: bool) -> List[str]:
        kind = _id_kind(ids)
        if self._id_kind is None and adding and ids:
            self._id_kind = kind
        elif ids and self._id_kind is not None and kind != self._id_kind:
            raise TypeError(f"this index holds {self._id_kind} ids, not {kind} ones")
        return [str(int(i)) if kind == "int" else i for i in ids]

    def _save_kind(self) -> None:
        tmp = self._meta_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"id_kind": self._id_kind}, f)
        os.replace(tmp, self._meta_path)

    def add_documents(self, documents_ids: Union[DocId, Sequence[DocId]],
                      documents_embeddings: Any, **kwargs: Any) -> "TartanIndex":
        """Adds (or, for ids the index has, replaces) documents in one transaction.

        ``documents_embeddings``: one ``[tokens, dim]`` array or tensor per document (a list,
        or a ``[docs, tokens, dim]`` array).
        """
        if isinstance(documents_ids, (str, int, np.integer)):
            documents_ids = [documents_ids]
            if _is_array(documents_embeddings) and documents_embeddings.ndim == 2:
                documents_embeddings = [documents_embeddings]
        with self._lock:
            new_kind = self._id_kind is None
            keys = self._keys(list(documents_ids), adding=True)
            try:
                self.index.add(keys, documents_embeddings, replace=True)
            except BaseException:
                if new_kind:
                    self._id_kind = None
                raise
            if new_kind:
                self._save_kind()
        return self

    def update_documents(self, documents_ids: Sequence[DocId],
                         documents_embeddings: Any) -> "TartanIndex":
        """Replaces documents' embeddings (ids not in the index are added)."""
        return self.add_documents(documents_ids, documents_embeddings)

    def remove_documents(self, documents_ids: Sequence[DocId]) -> "TartanIndex":
        """Deletes documents by id in one transaction; unknown ids are skipped."""
        if isinstance(documents_ids, (str, int, np.integer)):
            documents_ids = [documents_ids]
        ids = list(documents_ids)
        if ids and self._id_kind is not None:
            self.index.delete(self._keys(ids, adding=False))
        return self

    def _out(self, hits: List[tuple]) -> List[Dict[str, Any]]:
        if self._id_kind == "int":
            return [{"id": int(d), "score": s} for d, s in hits]
        return [{"id": d, "score": s} for d, s in hits]

    def __call__(self, queries_embeddings: Any, k: int = 10,
                 subset: Optional[Union[Sequence[DocId], Sequence[Sequence[DocId]]]] = None
                 ) -> List[List[Dict[str, Any]]]:
        """The best k documents of each query: ``[[{"id": id, "score": score}, ...], ...]``.

        ``queries_embeddings``: ``[queries, tokens, dim]``, a list of ``[tokens, dim]`` arrays
        or tensors, or one ``[tokens, dim]`` query. ``subset``: ids every query may return,
        or one such list per query.
        """
        if _is_array(queries_embeddings) and queries_embeddings.ndim == 2:
            queries_embeddings = [queries_embeddings]
        if not _is_array(queries_embeddings):
            queries_embeddings = list(queries_embeddings)
        p = self.search_params
        if subset is not None and len(subset) and isinstance(subset[0], (list, tuple)):
            if len(subset) != len(queries_embeddings):
                raise ValueError(f"{len(subset)} subsets for {len(queries_embeddings)} queries")
            out = []
            for q, sub in zip(queries_embeddings, subset):
                keys = self._keys(list(sub), adding=False) if self._id_kind else []
                out.append(self._out(self.index.search([q], k=k, subset=keys, **p)[0]))
            return out
        if subset is not None:
            subset = self._keys(list(subset), adding=False) if self._id_kind else []
        res = self.index.search(queries_embeddings, k=k, subset=subset, **p)
        return [self._out(h) for h in res]

    def get_documents_embeddings(self, documents_ids: Any) -> Any:
        raise NotImplementedError(
            "tartan keeps documents as centroid codes and 2-bit residuals (as PLAID does); "
            "their original embeddings cannot be given back")

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> "TartanIndex":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
