"""Embedders: text to L2-normalised vectors, each with its calibrated threshold.

- :class:`FastEmbedEmbedder`: local ONNX models through fastembed (default
  ``BAAI/bge-small-en-v1.5``, or a local model directory).
- :class:`OpenAIEmbedder`: OpenAI embeddings, on request (``openai`` extra).
- :class:`HashingEmbedder`: dependency-free keyword hashing, the fallback.
- :func:`default_embedder`: the best of these that loads here.

Optional dependencies are imported only when an embedder is built, and the
names below load on first use (PEP 562): a worker that passes its own embedder
does not import the others' modules (nor, through the OpenAI one, the LLM
adapters) at start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_LAZY = {
    "Embedder": "harbor_pg.embedders.base",
    "EmbedderError": "harbor_pg.embedders.base",
    "default_embedder": "harbor_pg.embedders.factory",
    "FastEmbedEmbedder": "harbor_pg.embedders.fastembed",
    "HashingEmbedder": "harbor_pg.embedders.hashing",
    "OpenAIEmbedder": "harbor_pg.embedders.openai",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harbor_pg.embedders' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
