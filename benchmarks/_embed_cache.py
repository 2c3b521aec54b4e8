"""An embedder that keeps every vector it computes in a file, for the LoCoMo benchmarks.

Embedding the dev conversations with MiniLM takes minutes of CPU on a small
machine; a sweep or a rerun should not pay it again. ``CachedEmbedder`` wraps
any :class:`~harbor_pg.embedders.base.Embedder`: a text embedded before (by
the same model, as a query or as a document) is read back from the cache,
the others are embedded and added. The cache is one ``.npz`` file per model;
keep it outside the repository (the data's licence).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harbor_pg.embedders.base import Embedder, duplicate_threshold_of


class CachedEmbedder:
    """``inner`` with a vector cache in ``directory`` (``save()`` writes it)."""

    def __init__(self, inner: Embedder, directory: str | Path) -> None:
        self.inner = inner
        self.path = Path(directory) / f"vectors-{_slug(inner.model_id)}.npz"
        self._vectors: dict[str, np.ndarray[Any, Any]] = {}
        self._dirty = False
        if self.path.exists():
            with np.load(self.path) as f:
                keys, matrix = f["keys"], f["vectors"]
            self._vectors = {str(k): matrix[i] for i, k in enumerate(keys)}

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    @property
    def relevance_threshold(self) -> float:
        return self.inner.relevance_threshold

    @property
    def duplicate_threshold(self) -> float:
        return duplicate_threshold_of(self.inner)

    def vector(self, text: str, *, query: bool = False) -> np.ndarray[Any, Any] | None:
        """The cached vector of ``text`` (None when it was never embedded)."""
        return self._vectors.get(_key(text, query))

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if _key(t, False) not in self._vectors]
        if missing:
            for text, vec in zip(missing, await self.inner.embed(missing), strict=True):
                self._vectors[_key(text, False)] = np.asarray(vec, dtype=np.float32)
            self._dirty = True
        return [self._vectors[_key(t, False)].astype(float).tolist() for t in texts]

    async def embed_query(self, text: str) -> list[float]:
        key = _key(text, True)
        if key not in self._vectors:
            self._vectors[key] = np.asarray(await self.inner.embed_query(text), dtype=np.float32)
            self._dirty = True
        return self._vectors[key].astype(float).tolist()

    def save(self) -> None:
        """Write the cache if anything was added."""
        if not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._vectors))
        matrix = np.stack([self._vectors[k] for k in keys])
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=keys, vectors=matrix)
        tmp.replace(self.path)
        self._dirty = False


def _key(text: str, query: bool) -> str:
    return ("q:" if query else "d:") + hashlib.sha256(text.encode()).hexdigest()


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
