"""Embedders: text to L2-normalised vectors, each with its calibrated threshold.

- :class:`FastEmbedEmbedder`: local ONNX models through fastembed (default
  ``BAAI/bge-small-en-v1.5``, or a local model directory).
- :class:`OpenAIEmbedder`: OpenAI embeddings, on request (``openai`` extra).
- :class:`HashingEmbedder`: dependency-free keyword hashing, the fallback.
- :func:`default_embedder`: the best of these that loads here.

Optional dependencies are imported only when an embedder is built.
"""

from __future__ import annotations

from harbor_pg.embedders.base import Embedder, EmbedderError
from harbor_pg.embedders.factory import default_embedder
from harbor_pg.embedders.fastembed import FastEmbedEmbedder
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.embedders.openai import OpenAIEmbedder

__all__ = [
    "Embedder",
    "EmbedderError",
    "FastEmbedEmbedder",
    "HashingEmbedder",
    "OpenAIEmbedder",
    "default_embedder",
]
