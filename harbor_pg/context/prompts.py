"""Prompts for the two model calls the per-turn context makes, and their output schemas.

- rolling summary refresh: fold new messages into the prior summary;
- query rewrite: a standalone retrieval query plus the memory types it wants.

Conversation text is fenced as untrusted data (:mod:`harbor_pg.fencing`); the
fact-extraction prompt is in :mod:`harbor_pg.extraction.prompts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harbor_pg.fencing import (
    SECRETS_RULE,
    MessageLike,
    Prompt,
    escape_untrusted,
    render_conversation,
    untrusted_notice,
)
from harbor_pg.records import RECALL_MEMORY_TYPES, MemoryType

__all__ = [
    "MAX_WANTED_TYPES",
    "RewriteResult",
    "SummaryResult",
    "parse_wanted_types",
    "rewrite_prompt",
    "summary_prompt",
]

#: Most memory types one rewrite may hint (seed 000).
MAX_WANTED_TYPES = 3

_RECALLABLE_NAMES: list[Any] = [t.value for t in RECALL_MEMORY_TYPES]


def _render_summary(summary: str | None) -> str:
    if not summary or not summary.strip():
        return "<prior_summary/>"
    return f"<prior_summary>\n{escape_untrusted(summary.strip())}\n</prior_summary>"


# --- rolling summary ------------------------------------------------------------


class SummaryResult(BaseModel):
    """Structured form of a summary refresh, for models asked for JSON."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    summary: str = Field(description="The updated rolling summary, plain text")

    @field_validator("summary", mode="before")
    @classmethod
    def _text(cls, value: object) -> str:
        return value.strip() if isinstance(value, str) else ""


def summary_prompt(
    messages: Sequence[MessageLike],
    prior_summary: str | None = None,
    *,
    max_words: int = 250,
) -> Prompt:
    """Prompt for refreshing the rolling session summary.

    The model folds ``messages`` (the turns the verbatim window is about to
    drop) into ``prior_summary`` and returns one updated summary of at most
    ``max_words`` words, as plain text.
    """
    system = "\n\n".join(
        [
            "You maintain the rolling summary of a conversation between a user and an AI "
            "assistant. The summary replaces older turns that no longer fit in the prompt, "
            "so a later turn must be able to continue the conversation from it.",
            "Fold the new messages into the prior summary and return one updated summary. "
            "Keep what later turns may need: the user's goals and questions, facts, names, "
            "numbers, decisions and their reasons, preferences, tool results that matter, "
            "and open tasks. Drop greetings, filler and anything the new messages make "
            "obsolete. Write neutral third-person prose ('The user asked ...', 'The assistant "
            f"found ...'), at most {max_words} words. Return only the summary text.",
            SECRETS_RULE + " Write [redacted] in their place.",
            untrusted_notice("prior_summary", "conversation"),
        ]
    )
    user = "\n\n".join(
        [
            _render_summary(prior_summary),
            "New messages to fold in:",
            render_conversation(messages),
            "Write the updated summary.",
        ]
    )
    return Prompt(system, user)


# --- query rewrite --------------------------------------------------------------


def parse_wanted_types(
    raw: Iterable[object] | object, limit: int = MAX_WANTED_TYPES
) -> tuple[MemoryType, ...]:
    """Recallable memory types named in ``raw``: unknown names dropped, first ``limit`` kept."""
    items: Iterable[object]
    if isinstance(raw, str):
        items = [raw]
    elif isinstance(raw, list | tuple):
        items = raw
    else:
        return ()
    wanted: list[MemoryType] = []
    for item in items:
        if not isinstance(item, str):
            continue
        label = item.strip().lower()
        for candidate in (label, label.removesuffix("s")):
            try:
                memory_type = MemoryType(candidate)
            except ValueError:
                continue
            if memory_type in RECALL_MEMORY_TYPES and memory_type not in wanted:
                wanted.append(memory_type)
            break
        if len(wanted) == limit:
            break
    return tuple(wanted)


# Its model_config has the shape of extraction/facts.py's ExtractedFact, on purpose: each
# model the LLM answers with gives its own description.
class RewriteResult(BaseModel):
    """The rewrite call's answer: a standalone retrieval query and the memory types it wants.

    ``wanted_types`` is normalised on parse to at most three recallable type
    names; unknown names and ``summary`` are dropped.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        json_schema_extra={"description": "A standalone search query and wanted memory types."},
    )

    standalone_query: str = Field(
        description="The latest question rewritten to be understood without the conversation"
    )
    wanted_types: list[str] = Field(
        description=(
            "Up to three of: fact, preference, decision, episode, observation (what several "
            "facts about one thing add up to); empty if none stand out"
        ),
        json_schema_extra={"items": {"type": "string", "enum": _RECALLABLE_NAMES}},
    )

    @field_validator("standalone_query", mode="before")
    @classmethod
    def _query(cls, value: object) -> str:
        return " ".join(value.split()) if isinstance(value, str) else ""

    @field_validator("wanted_types", mode="before")
    @classmethod
    def _types(cls, value: object) -> list[str]:
        return [t.value for t in parse_wanted_types(value)]

    def memory_types(self) -> tuple[MemoryType, ...]:
        """``wanted_types`` as :class:`MemoryType` members."""
        return tuple(MemoryType(t) for t in self.wanted_types)


def rewrite_prompt(
    question: str,
    messages: Sequence[MessageLike] = (),
    summary: str | None = None,
    *,
    structured: bool = True,
) -> Prompt:
    """Prompt for condensing ``question`` into one self-contained retrieval query.

    With ``structured`` (the default) the model answers as :class:`RewriteResult`,
    also naming up to three memory types the question asks for. With
    ``structured=False`` (models without structured output) it returns only the
    query, and no type hint is asked for.
    """
    task = [
        "You turn the latest question of a conversation into one standalone search query "
        "for a long-term memory store. Resolve pronouns, ellipsis and references such as "
        "'it', 'that one' or 'the same again' using the prior summary and the recent "
        "messages, and keep the names, numbers and terms that matter for search. Do not "
        "answer the question and do not add facts that are not in the conversation. If the "
        "question already stands on its own, return it unchanged. Keep the query to one "
        "sentence in the question's language.",
    ]
    if structured:
        task.append(
            "Also name the kinds of stored memory the question is asking for, at most "
            f"{MAX_WANTED_TYPES}, from: fact (something true about the user, project or world), "
            "preference (how someone likes things done), decision (what was chosen and why), "
            "episode (something that happened). Use an empty list when no kind stands out. "
            'Answer as JSON: {"standalone_query": "...", "wanted_types": ["decision"]}.'
        )
    else:
        task.append("Return only the standalone query on a single line, with no preamble.")
    task.append(untrusted_notice("prior_summary", "conversation", "question"))
    user = "\n\n".join(
        [
            _render_summary(summary),
            "Recent messages:",
            render_conversation(messages),
            f"<question>{escape_untrusted(question)}</question>",
            "Rewrite the question.",
        ]
    )
    return Prompt("\n\n".join(task), user)
