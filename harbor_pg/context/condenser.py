"""The query rewrite: one model call for a standalone query and the memory types it wants.

A follow-up such as "and who owns it?" cannot be searched as asked. The
condenser shows the model the rolling summary, the window and the question
(all fenced as untrusted data, see :mod:`harbor_pg.fencing`) and asks,
in the same call, which kinds of memory the question is after. A model that
cannot produce structured output gets the plain-text prompt and hints nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harbor_pg.context.prompts import RewriteResult, rewrite_prompt
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.llm.base import (
    MemoryModel,
    MemoryModelError,
    StructuredOutputUnsupportedError,
    supports_structured_output,
)
from harbor_pg.llm.langchain import as_memory_model
from harbor_pg.records import ConversationMessage, MemoryType, normalize_content
from harbor_pg.telemetry import chat_span
from harbor_pg.tokens import TokenCounter, approximate_tokens

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

__all__ = [
    "MIN_REWRITE_TOKEN_LIMIT",
    "REWRITE_GROWTH_LIMIT",
    "CondensedQuery",
    "QueryCondenser",
    "RewriteRejectedError",
]

#: A rewrite may always use this many tokens, however short the question was.
MIN_REWRITE_TOKEN_LIMIT = 64
#: Beyond that floor, a rewrite longer than this multiple of the question is rejected.
REWRITE_GROWTH_LIMIT = 3

_QUOTES = ('"', "'", "`", "\u201c", "\u201d")


class RewriteRejectedError(MemoryModelError):
    """The model answered, but its rewrite was empty or implausibly long."""


@dataclass(frozen=True, slots=True)
class CondensedQuery:
    """The accepted rewrite: the query to search, the types wanted, whether it changed."""

    standalone_query: str
    wanted_types: tuple[MemoryType, ...]
    rewritten: bool


def _plain_query(text: str) -> str:
    """The first non-empty line of a plain-text answer, without wrapping quotes."""
    for line in text.splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        while len(line) >= 2 and line[0] in _QUOTES and line[-1] in _QUOTES:
            line = line[1:-1].strip()
        return line
    return ""


class QueryCondenser:
    """Condense a question into a standalone retrieval query with one model call.

    Args:
        model: any :class:`~harbor_pg.llm.MemoryModel`, or a LangChain
            ``BaseChatModel`` (wrapped by :class:`~harbor_pg.llm.LangChainModel`).
        token_counter: counts tokens for the length check (default
            :func:`~harbor_pg.tokens.approximate_tokens`).

    A rewrite is rejected (:class:`RewriteRejectedError`) when it is empty or
    longer than ``max(MIN_REWRITE_TOKEN_LIMIT, REWRITE_GROWTH_LIMIT * tokens(question))``
    tokens: a standalone query resolves a few references, it does not answer.
    """

    def __init__(
        self, model: MemoryModel | BaseChatModel, *, token_counter: TokenCounter | None = None
    ) -> None:
        resolved = as_memory_model(model)
        if resolved is None:
            raise MemoryConfigurationError("QueryCondenser needs a model")
        self.model: MemoryModel = resolved
        self.token_counter: TokenCounter = token_counter or approximate_tokens

    @chat_span("rewrite")
    async def condense(
        self,
        question: str,
        messages: Sequence[ConversationMessage] = (),
        summary: str | None = None,
    ) -> CondensedQuery:
        """Rewrite ``question`` given the window ``messages`` and the rolling ``summary``.

        Raises:
            MemoryModelError: the model call failed, or (as
                :class:`RewriteRejectedError`) its answer was rejected.
        """
        wanted: tuple[MemoryType, ...] = ()
        if supports_structured_output(self.model):
            prompt = rewrite_prompt(question, messages, summary, structured=True)
            try:
                result = await self.model.generate_structured(
                    prompt.system, prompt.user, RewriteResult
                )
            except StructuredOutputUnsupportedError:
                text = await self._plain(question, messages, summary)
            else:
                text = result.standalone_query
                wanted = result.memory_types()
        else:
            text = await self._plain(question, messages, summary)
        return self._accept(question, text, wanted)

    async def _plain(
        self, question: str, messages: Sequence[ConversationMessage], summary: str | None
    ) -> str:
        prompt = rewrite_prompt(question, messages, summary, structured=False)
        return _plain_query(await self.model.generate_text(prompt.system, prompt.user))

    def _accept(self, question: str, text: str, wanted: tuple[MemoryType, ...]) -> CondensedQuery:
        query = " ".join(text.split())
        if not query:
            raise RewriteRejectedError("the rewrite was empty")
        limit = max(MIN_REWRITE_TOKEN_LIMIT, REWRITE_GROWTH_LIMIT * self.token_counter(question))
        size = self.token_counter(query)
        if size > limit:
            raise RewriteRejectedError(
                f"the rewrite was implausibly long ({size} tokens; the limit is {limit})"
            )
        if normalize_content(query) == normalize_content(question):
            return CondensedQuery(question, wanted, rewritten=False)
        return CondensedQuery(query, wanted, rewritten=True)
