"""The embedder seam: the :class:`Embedder` protocol, its error and vector checks."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from harbor_pg.errors import MemoryError

__all__ = [
    "UNCALIBRATED_DUPLICATE_THRESHOLD",
    "Embedder",
    "EmbedderError",
    "duplicate_threshold_of",
    "normalize_vector",
    "normalize_vectors",
]

#: The near-duplicate threshold of an embedder never calibrated for one: high, so that
#: only texts the embedder finds almost identical merge (MiniLM, calibrated at 0.955,
#: scores 95% of restatements above 0.974; benchmarks/RESULTS.md).
UNCALIBRATED_DUPLICATE_THRESHOLD = 0.97


class EmbedderError(MemoryError):
    """An embedder could not be loaded or could not embed.

    Raised for a model that will not load, a failed remote call (timeout, HTTP
    error), and a vector that is unusable: wrong length, NaN or infinity, or
    all zeros. The message never contains credentials.
    """


@runtime_checkable
# Each embedder repeats this protocol's properties on purpose: each documents its own
# model id and threshold.


class Embedder(Protocol):
    """Turns text into L2-normalised vectors of one fixed model space.

    ``model_id`` names that space and is stored beside every vector, so vectors
    of different models are never compared. ``relevance_threshold`` is the
    cosine similarity at or above which this embedder's match is considered
    relevant; it was calibrated per model and is meaningless across models.

    An embedder may also have ``duplicate_threshold``: the cosine similarity at or
    above which two texts say the same thing (consolidation merges them), calibrated
    per model like the relevance threshold (``benchmarks/duplicate_threshold.py``).
    It is optional: :func:`duplicate_threshold_of` falls back to
    :data:`UNCALIBRATED_DUPLICATE_THRESHOLD` for an embedder without one.
    """

    @property
    def model_id(self) -> str:
        """Stable name of the vector space (model and its settings)."""
        ...

    @property
    def dimensions(self) -> int:
        """Length of every vector."""
        ...

    @property
    def relevance_threshold(self) -> float:
        """Calibrated cosine-similarity floor for a relevant match."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts`` (batched), one unit vector each, in order; ``[]`` for ``[]``.

        Raises:
            EmbedderError: on any failure.
        """
        ...

    async def embed_query(self, text: str) -> list[float]:
        """Embed one search query (some models treat queries differently).

        Raises:
            EmbedderError: on any failure.
        """
        ...


def duplicate_threshold_of(embedder: object) -> float:
    """``embedder``'s calibrated near-duplicate threshold, or the conservative
    :data:`UNCALIBRATED_DUPLICATE_THRESHOLD` for one that has none."""
    value = getattr(embedder, "duplicate_threshold", None)
    return float(value) if isinstance(value, int | float) else UNCALIBRATED_DUPLICATE_THRESHOLD


def normalize_vector(values: Iterable[float], *, dimensions: int, model_id: str) -> list[float]:
    """Return ``values`` scaled to unit length, checked for length and finiteness.

    Raises:
        EmbedderError: wrong length, a NaN or infinite component, or a zero vector.
    """
    vector = list(map(float, values))
    if len(vector) != dimensions:
        raise EmbedderError(
            f"{model_id} returned a vector of {len(vector)} dimensions, expected {dimensions}"
        )
    # one pass in C (every recall and save embeds: 0.2 ms -> 0.02 ms for 384 floats):
    # a NaN or infinite component makes the length NaN or infinite
    norm = math.hypot(*vector)
    if not math.isfinite(norm):
        if not all(map(math.isfinite, vector)):
            raise EmbedderError(f"{model_id} returned a vector with NaN or infinite components")
        raise EmbedderError(f"{model_id} returned a zero (or unnormalisable) vector")
    if norm == 0.0:
        raise EmbedderError(f"{model_id} returned a zero (or unnormalisable) vector")
    # (a comprehension: the same divisions, half the time of map(norm.__rtruediv__, ...))
    return [x / norm for x in vector]


def normalize_vectors(
    rows: Iterable[Iterable[float]], *, dimensions: int, model_id: str
) -> list[list[float]]:
    """:func:`normalize_vector` over a batch."""
    return [normalize_vector(row, dimensions=dimensions, model_id=model_id) for row in rows]
