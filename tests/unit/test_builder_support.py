"""Scripted collaborators for the context-builder tests (no tests of its own).

``ScriptedModel`` is a :class:`~harbor_pg.llm.MemoryModel` that answers from
queues: summary calls (recognised by the summary prompt) pop ``summaries``,
structured calls pop ``rewrites``, plain-text rewrite calls pop
``plain_rewrites``. A queued exception is raised instead of answered. Every
call is recorded.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from harbor_pg.llm.base import StructuredOutputUnsupportedError
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory, MemoryType

T = TypeVar("T", bound=BaseModel)

_QUESTION = re.compile(r"<question>(.*?)</question>", re.DOTALL)


@dataclass
class Call:
    kind: str  # "summary", "rewrite" or "plain_rewrite"
    system: str
    user: str


class ScriptedModel:
    """A MemoryModel answering from queues; records every call."""

    def __init__(
        self,
        *,
        summaries: Iterable[Any] = (),
        rewrites: Iterable[Any] = (),
        plain_rewrites: Iterable[Any] = (),
        supports_structured: bool = True,
        delay: float = 0.0,
    ) -> None:
        self.summaries: deque[Any] = deque(summaries)
        self.rewrites: deque[Any] = deque(rewrites)
        self.plain_rewrites: deque[Any] = deque(plain_rewrites)
        self.supports_structured = supports_structured
        self.delay = delay
        self.calls: list[Call] = []

    def kinds(self) -> list[str]:
        return [c.kind for c in self.calls]

    def count(self, kind: str) -> int:
        return sum(1 for c in self.calls if c.kind == kind)

    @staticmethod
    def _answer(item: Any) -> Any:
        if isinstance(item, BaseException):
            raise item
        return item

    async def generate_text(self, system: str, user: str) -> str:
        if self.delay:
            await asyncio.sleep(self.delay)
        if "rolling summary" in system:
            self.calls.append(Call("summary", system, user))
            n = self.count("summary")
            item = self.summaries.popleft() if self.summaries else f"summary number {n}"
            return str(self._answer(item))
        self.calls.append(Call("plain_rewrite", system, user))
        if self.plain_rewrites:
            return str(self._answer(self.plain_rewrites.popleft()))
        match = _QUESTION.search(user)
        return match.group(1) if match else ""

    async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
        if self.delay:
            await asyncio.sleep(self.delay)
        self.calls.append(Call("rewrite", system, user))
        if not self.supports_structured:
            raise AssertionError("generate_structured called on a model without structured output")
        if self.rewrites:
            item = self._answer(self.rewrites.popleft())
        else:
            match = _QUESTION.search(user)
            item = {"standalone_query": match.group(1) if match else "", "wanted_types": []}
        if isinstance(item, StructuredOutputUnsupportedError):
            raise item
        return schema.model_validate(item)


@dataclass
class RecallCall:
    owner: MemoryOwner
    query: str
    anchor_entity_ids: tuple[str, ...]
    wanted_types: tuple[MemoryType, ...]
    token_budget: int | None


@dataclass
class ScriptedRecall:
    """A recall collaborator returning fixed memories (or raising), recording calls."""

    memories: Sequence[Memory] = ()
    error: BaseException | None = None
    calls: list[RecallCall] = field(default_factory=list)

    async def recall(
        self,
        owner: MemoryOwner,
        query: str,
        *,
        anchor_entity_ids: Sequence[str] = (),
        wanted_types: Sequence[MemoryType] = (),
        as_of: datetime | None = None,
        token_budget: int | None = None,
    ) -> tuple[Memory, ...]:
        self.calls.append(
            RecallCall(owner, query, tuple(anchor_entity_ids), tuple(wanted_types), token_budget)
        )
        if self.error is not None:
            raise self.error
        return tuple(self.memories)


def user(text: str) -> ConversationMessage:
    return ConversationMessage(role="user", content=text)


def assistant(text: str, tool_calls: list[dict[str, Any]] | None = None) -> ConversationMessage:
    return ConversationMessage(role="assistant", content=text, tool_calls=tool_calls or [])


def tool(text: str, call_id: str) -> ConversationMessage:
    return ConversationMessage(role="tool", content=text, tool_call_id=call_id)


def exchange(n: int, words: int = 20) -> list[ConversationMessage]:
    """``n`` user/assistant pairs, each message about ``words`` distinct words long."""
    out: list[ConversationMessage] = []
    for i in range(n):
        filler = " ".join(f"topic{i}word{j}" for j in range(words))
        out.append(user(f"Question {i} about Project{i}: {filler}?"))
        out.append(assistant(f"Answer {i} mentions Widget{i} and 4{i}2 units. {filler}."))
    return out
