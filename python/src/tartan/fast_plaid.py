"""fast-plaid's calls over a tartan index, for code written against ``fast_plaid.search``::

    from tartan.fast_plaid import FastPlaid

    fp = FastPlaid(index="my_index")
    fp.create(documents_embeddings=[torch.randn(300, 128) for _ in range(100)])
    fp.update(documents_embeddings=[torch.randn(300, 128) for _ in range(10)])
    results = fp.search(queries_embeddings=torch.randn(2, 32, 128), top_k=10)
    # [[(doc_number, score), ...], ...] best first
    fp.delete(subset=[0, 7])

Documents are numbered 0, 1, 2, ... in the order they were added, as fast-plaid numbers
them. One difference: fast-plaid renumbers the documents after a deletion (later numbers
shift down); tartan's numbers never change (the index maps them to its own ids), so a number
stays valid until its document is deleted. ``n_ivf_probe`` and ``n_full_scores`` are taken as
PLAID's ``ncells`` and ``ndocs``; fast-plaid's other tuning options (batch sizes, Triton,
memory fractions) are accepted and ignored.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import Index, _is_array


class FastPlaid:
    """A tartan index in directory ``index`` (the engine's ``tartan/`` and ``numbers.json``,
    the next document number), with fast-plaid's ``create``, ``update``, ``search`` and
    ``delete``."""

    def __init__(self, index: str, device: Optional[str] = None, **kwargs: Any) -> None:
        self.index = index
        self.device = device if device is None or str(device).split(":")[0] in (
            "cpu", "cuda", "auto") else None
        self._meta = os.path.join(index, "numbers.json")
        self._ix: Optional[Index] = None
        if os.path.exists(os.path.join(index, "tartan")):
            self._ix = Index(os.path.join(index, "tartan"), device=self.device)

    def _next(self) -> int:
        if not os.path.exists(self._meta):
            return 0
        with open(self._meta, encoding="utf-8") as f:
            return int(json.load(f)["next"])

    def _set_next(self, n: int) -> None:
        tmp = self._meta + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"next": n}, f)
        os.replace(tmp, self._meta)

    @staticmethod
    def _docs(documents_embeddings: Any) -> Any:
        if _is_array(documents_embeddings) and documents_embeddings.ndim == 2:
            return [documents_embeddings]
        return documents_embeddings if _is_array(documents_embeddings) else list(
            documents_embeddings)

    def _add(self, docs: Any) -> None:
        start = self._next()
        n = len(docs)
        self._ix.add([str(start + i) for i in range(n)], docs)
        self._set_next(start + n)

    def create(self, documents_embeddings: Any, kmeans_niters: int = 4, nbits: int = 2,
               seed: int = 42, **kwargs: Any) -> "FastPlaid":
        """Builds a new index from these documents (one ``[tokens, dim]`` array or tensor
        each), replacing any index in the directory. ``nbits`` defaults to tartan's 2
        (fast-plaid's is 4)."""
        if self._ix is not None:
            self._ix.close()
            self._ix = None
        if os.path.exists(self.index):
            shutil.rmtree(self.index)
        os.makedirs(self.index)
        self._ix = Index(os.path.join(self.index, "tartan"), create=True, nbits=nbits,
                         kmeans_iters=kmeans_niters, seed=seed, device=self.device)
        self._add(self._docs(documents_embeddings))
        return self

    def update(self, documents_embeddings: Any, **kwargs: Any) -> "FastPlaid":
        """Adds documents, numbered after the last one added; creates the index if there is
        none."""
        if self._ix is None:
            return self.create(documents_embeddings)
        self._add(self._docs(documents_embeddings))
        return self

    def search(self, queries_embeddings: Any, top_k: int = 10,
               n_full_scores: Optional[int] = None, n_ivf_probe: Optional[int] = None,
               subset: Optional[Union[Sequence[int], Sequence[Sequence[int]]]] = None,
               **kwargs: Any) -> List[List[Tuple[int, float]]]:
        """The best ``top_k`` documents of each query as ``(number, score)``, best first.
        ``subset``: document numbers every query may return, or one list per query."""
        if self._ix is None:
            raise ValueError("the index is empty: create it first")
        q = queries_embeddings
        if _is_array(q) and q.ndim == 2:
            q = [q]
        elif not _is_array(q):
            q = list(q)
        kw = dict(ncells=n_ivf_probe, ndocs=n_full_scores)
        if subset is not None and len(subset) and isinstance(subset[0], (list, tuple)):
            res = [self._ix.search([qi], k=top_k, subset=[str(int(s)) for s in sub], **kw)[0]
                   for qi, sub in zip(q, subset)]
        else:
            sub = None if subset is None else [str(int(s)) for s in subset]
            res = self._ix.search(q, k=top_k, subset=sub, **kw)
        return [[(int(d), s) for d, s in hits] for hits in res]

    def delete(self, subset: Sequence[int]) -> "FastPlaid":
        """Deletes documents by number (numbers not in the index are skipped)."""
        if self._ix is not None:
            self._ix.delete([str(int(s)) for s in subset])
        return self

    def close(self) -> None:
        if self._ix is not None:
            self._ix.close()

    def __enter__(self) -> "FastPlaid":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
