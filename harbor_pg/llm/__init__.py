"""Language-model adapters: the :class:`MemoryModel` protocol and its implementations.

- :class:`OpenAIModel`: OpenAI or any OpenAI-compatible server (``openai`` extra).
- :class:`LangChainModel`: any LangChain ``BaseChatModel``.
- :class:`ExtractiveSummarizer`: the default no-model path; nothing leaves the machine.

``openai`` itself is imported only when an ``OpenAIModel`` is built, so this
package imports without the extra installed.
"""

from __future__ import annotations

from harbor_pg.llm.base import (
    MemoryModel,
    MemoryModelError,
    StructuredOutputUnsupportedError,
    supports_structured_output,
)
from harbor_pg.llm.extractive import ExtractiveSummarizer
from harbor_pg.llm.langchain import LangChainModel, as_memory_model
from harbor_pg.llm.openai import OpenAIModel

__all__ = [
    "ExtractiveSummarizer",
    "LangChainModel",
    "MemoryModel",
    "MemoryModelError",
    "OpenAIModel",
    "StructuredOutputUnsupportedError",
    "as_memory_model",
    "supports_structured_output",
]
