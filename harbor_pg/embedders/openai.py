"""OpenAI (and OpenAI-compatible) embeddings, on request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harbor_pg.embedders.base import (
    UNCALIBRATED_DUPLICATE_THRESHOLD,
    EmbedderError,
    normalize_vectors,
)
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.llm._openai_support import client_setup, describe_openai_error

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["OpenAIEmbedder"]

# Not calibrated on this project's data (no network to the API here): for
# text-embedding-3 models unrelated texts typically score 0.0-0.2 and related
# ones 0.4-0.7, so 0.3 sits between. Pass relevance_threshold= to override.
_DEFAULT_THRESHOLD = 0.3


class OpenAIEmbedder:
    """Embeddings from the OpenAI embeddings endpoint (or a compatible server).

    Texts are sent in batches of ``batch_size``; vectors come back in input
    order, checked and L2-normalised. ``dimensions`` is sent to the API for the
    ``text-embedding-3`` family (which can shorten vectors) and otherwise only
    checked. Every failure, including timeouts and HTTP errors, is raised as
    :class:`EmbedderError` with no credentials in its message.

    Args:
        model: the embedding model name.
        dimensions: vector length.
        api_key: the key; defaults to ``OPENAI_API_KEY``.
        base_url: the API root (``.../v1``); defaults to OpenAI's.
        client: a ready ``openai.AsyncOpenAI`` to use instead of building one.
        batch_size: texts per request (the API accepts up to 2048).
        timeout: seconds allowed for one HTTP attempt.
        max_retries: client-side retries on connection errors, 429 and 5xx.
        send_dimensions: force sending (True) or not sending (False) the
            ``dimensions`` parameter; None decides by model name.
        relevance_threshold: override the default threshold (0.3).
        duplicate_threshold: override the near-duplicate threshold (not calibrated
            here either: the conservative 0.97).

    Raises:
        MemoryConfigurationError: ``openai`` is not installed or there is no key.
    """

    def __init__(
        self,
        model: str = "text-embedding-3-small",
        dimensions: int = 1536,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: AsyncOpenAI | None = None,
        batch_size: int = 256,
        timeout: float = 30.0,
        max_retries: int = 2,
        send_dimensions: bool | None = None,
        relevance_threshold: float | None = None,
        duplicate_threshold: float | None = None,
    ) -> None:
        if dimensions < 1:
            raise MemoryConfigurationError(f"dimensions must be >= 1, got {dimensions!r}")
        if not 1 <= batch_size <= 2048:
            raise MemoryConfigurationError(f"batch_size must be in 1..2048, got {batch_size!r}")
        # The same call as llm/openai.py's OpenAIModel, on purpose: both share client_setup().
        self._client, self._owns_client, self._timeout = client_setup(
            "OpenAIEmbedder",
            client,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
        )
        self.model = model
        self._dimensions = dimensions
        self._api_key = api_key
        self._batch_size = batch_size
        self._send_dimensions = (
            model.startswith("text-embedding-3") if send_dimensions is None else send_dimensions
        )
        self._threshold = (
            relevance_threshold if relevance_threshold is not None else _DEFAULT_THRESHOLD
        )
        self._duplicate_threshold = (
            duplicate_threshold
            if duplicate_threshold is not None
            else UNCALIBRATED_DUPLICATE_THRESHOLD
        )
        self._model_id = f"openai:{model}-{dimensions}"

    # As in fastembed.py and hashing.py, on purpose: each embedder documents its own properties.
    @property
    def model_id(self) -> str:
        """``openai:<model>-<dimensions>``."""
        return self._model_id

    @property
    def dimensions(self) -> int:
        """Vector length."""
        return self._dimensions

    @property
    def relevance_threshold(self) -> float:
        """0.3 unless overridden (see the module note: not calibrated here)."""
        return self._threshold

    @property
    def duplicate_threshold(self) -> float:
        """0.97 unless overridden (not calibrated here: a conservative value)."""
        return self._duplicate_threshold

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(model={self.model!r}, dimensions={self._dimensions})"

    async def aclose(self) -> None:
        """Close the HTTP client if this embedder built it."""
        if self._owns_client:
            await self._client.close()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts`` in batches; ``[]`` in, ``[]`` out."""
        if isinstance(texts, str):
            raise EmbedderError("embed() takes a sequence of texts; use embed_query() for one")
        items = list(texts)
        vectors: list[list[float]] = []
        for start in range(0, len(items), self._batch_size):
            vectors.extend(await self._embed_batch(items[start : start + self._batch_size]))
        return vectors

    async def embed_query(self, text: str) -> list[float]:
        """Embed one query (the API treats queries and documents alike)."""
        return (await self._embed_batch([text]))[0]

    async def _embed_batch(self, batch: list[str]) -> list[list[float]]:
        if not all(isinstance(t, str) for t in batch):
            raise EmbedderError("every text to embed must be a str")
        # the API rejects empty strings; a blank text embeds as a single space
        payload = [t if t.strip() else " " for t in batch]
        kwargs: dict[str, Any] = {
            "model": self.model,
            "input": payload,
            "encoding_format": "float",
        }
        if self._send_dimensions:
            kwargs["dimensions"] = self._dimensions
        try:
            response = await self._client.embeddings.create(**kwargs)
        except Exception as exc:
            key = self._api_key or getattr(self._client, "api_key", None)
            failure = describe_openai_error(
                exc,
                what=f"embedding with {self.model!r}",
                api_key=key if isinstance(key, str) else None,
                timeout=self._timeout,
            )
            raise EmbedderError(failure.message) from None
        data = sorted(response.data, key=lambda item: item.index)
        if len(data) != len(batch) or [d.index for d in data] != list(range(len(batch))):
            raise EmbedderError(
                f"embedding with {self.model!r} returned {len(data)} vectors for {len(batch)} texts"
            )
        return normalize_vectors(
            (d.embedding for d in data), dimensions=self._dimensions, model_id=self._model_id
        )
