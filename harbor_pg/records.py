"""Typed rows: what the tiers store and return (pydantic models)."""

from __future__ import annotations

import enum
import hashlib
import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from harbor_pg.owner import MemoryScope
from harbor_pg.validation import json_problem, text_problem

__all__ = [
    "CANONICAL_SOURCES",
    "RECALL_MEMORY_TYPES",
    "ConversationMessage",
    "Memory",
    "MemoryType",
    "MessageRole",
    "Sensitivity",
    "content_hash",
    "embedding_texts",
    "normalize_content",
    "validate_source",
]


def _json_serialisable(value: dict[str, Any]) -> dict[str, Any]:
    problem = json_problem(value)  # nesting depth first: json.dumps would recurse too deep
    if problem is not None:
        raise ValueError(f"metadata {problem}")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serialisable: {exc}") from None
    return value


#: A row's ``metadata``: stored as jsonb, so it must serialise as JSON.
JsonMetadata = Annotated[dict[str, Any], AfterValidator(_json_serialisable)]


class MemoryType(enum.StrEnum):
    """What kind of long-term memory a row holds."""

    FACT = "fact"
    PREFERENCE = "preference"
    DECISION = "decision"
    EPISODE = "episode"
    SUMMARY = "summary"
    #: what several facts about one entity add up to, written by a model from them
    #: (:meth:`~harbor_pg.manager.MemoryManager.observe`)
    OBSERVATION = "observation"


#: Types recall may return (rolling summaries are never recalled).
RECALL_MEMORY_TYPES: tuple[MemoryType, ...] = (
    MemoryType.FACT,
    MemoryType.PREFERENCE,
    MemoryType.DECISION,
    MemoryType.EPISODE,
    MemoryType.OBSERVATION,
)


class Sensitivity(enum.StrEnum):
    """Ordered classification: none < low < pii < sensitive."""

    NONE = "none"
    LOW = "low"
    PII = "pii"
    SENSITIVE = "sensitive"

    @property
    def level(self) -> int:
        """Rank in the order none < low < pii < sensitive (0 to 3), for comparisons."""
        return list(Sensitivity).index(self)


CANONICAL_SOURCES: frozenset[str] = frozenset(
    {
        "user",
        "assistant",
        "tool",
        "summary",
        "injected",
        "extracted",
        "reflection",
        "imported",
        "unknown",
    }
)
_NAMESPACED_SOURCE = re.compile(r"^tool:[A-Za-z0-9_.\-/]{1,100}$")


def validate_source(source: str) -> str:
    """Return ``source`` if canonical or ``tool:<name>``, else raise ``ValueError``."""
    if isinstance(source, str) and (
        source in CANONICAL_SOURCES or _NAMESPACED_SOURCE.match(source)
    ):
        return source
    raise ValueError(
        f"invalid source {source!r}: use one of {sorted(CANONICAL_SOURCES)} or 'tool:<name>'"
    )


_WS = re.compile(r"\s+")


def normalize_content(content: str) -> str:
    """Collapse whitespace runs and fold case (the dedup normal form)."""
    return _WS.sub(" ", content).strip().casefold()


def content_hash(scope: MemoryScope | str, content: str) -> str:
    """sha256 of scope + normalized content, hex: the dedup key."""
    scope_value = MemoryScope(scope).value
    return hashlib.sha256(f"{scope_value}:{normalize_content(content)}".encode()).hexdigest()


MessageRole = Literal["system", "user", "assistant", "tool"]


def _storable_json(value: dict[str, Any]) -> dict[str, Any]:
    problem = json_problem(value)
    if problem is not None:
        raise ValueError(f"metadata must be JSON that PostgreSQL can store: it {problem}")
    return value


def _check_strings(*fields: tuple[str, str | None]) -> None:
    for name, value in fields:
        if value is not None:
            problem = text_problem(value)
            if problem is not None:
                raise ValueError(f"{name} {problem}")


class ConversationMessage(BaseModel):
    """One conversation turn (short-term tier)."""

    model_config = ConfigDict(frozen=True)

    role: MessageRole
    content: str
    name: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_id: str | None = None
    metadata: JsonMetadata = Field(default_factory=dict)
    id: int | None = None
    created_at: datetime | None = None

    # The same two checks as Memory's, on purpose: each model names its own text fields (the
    # checks themselves are _storable_json and _check_strings, shared).
    @field_validator("metadata")
    @classmethod
    def _json_metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _storable_json(value)

    @model_validator(mode="after")
    def _storable_text(self) -> ConversationMessage:
        _check_strings(
            ("content", self.content),
            ("name", self.name),
            ("tool_call_id", self.tool_call_id),
        )
        problem = json_problem({"tool_calls": self.tool_calls})
        if problem is not None:
            raise ValueError(f"tool_calls {problem}")
        return self


class Memory(BaseModel):
    """A durable long-term memory row.

    ``context`` is optional text the memory leans on (for a conversation turn,
    the turn before it). It is never recalled on its own: the full-text index
    reads it with the content, and a manager with an embedder stores a second
    vector of context plus content, of which dense recall takes the nearer.
    """

    model_config = ConfigDict(frozen=True)

    id: str | None = None
    tenant_id: str = ""
    scope: MemoryScope = MemoryScope.USER
    project_id: str = ""
    principal_id: str = ""
    user_id: str = ""
    session_id: str = ""
    run_id: str = ""
    memory_type: MemoryType = MemoryType.FACT
    content: str
    content_hash: str | None = None
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    entity_ids: list[str] = Field(default_factory=list)
    source: str = "unknown"
    sensitivity: Sensitivity = Sensitivity.NONE
    valid_from: datetime | None = None
    invalid_at: datetime | None = None
    superseded_by: str | None = None
    source_session_id: str | None = None
    source_message_ids: list[str] = Field(default_factory=list)
    metadata: JsonMetadata = Field(default_factory=dict)
    context: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    #: when the memory stops holding (None: never). From then on it is left out of
    #: recall, search, the profile and the snapshot, and as-of reads before it still
    #: find it; the store closes its interval there (``expire_memories``), not deleting it
    expires_at: datetime | None = None

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return validate_source(value)

    # As ConversationMessage's, on purpose (see there).
    @field_validator("metadata")
    @classmethod
    def _json_metadata(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _storable_json(value)

    @model_validator(mode="after")
    def _storable_text(self) -> Memory:
        _check_strings(
            ("id", self.id),
            ("content", self.content),
            ("context", self.context),
            ("source_session_id", self.source_session_id),
            *(("entity_ids", e) for e in self.entity_ids),
            *(("source_message_ids", m) for m in self.source_message_ids),
        )
        return self

    def is_valid_at(self, when: datetime) -> bool:
        """True when ``when`` falls inside this memory's validity interval and
        before its expiry."""
        if self.valid_from is not None and when < self.valid_from:
            return False
        if self.expires_at is not None and when >= self.expires_at:
            return False
        return self.invalid_at is None or when < self.invalid_at


def embedding_texts(memory: Memory) -> tuple[str, str | None]:
    """The texts a memory's vectors are computed from: its content, and with a context.

    Conversation turns lean on their neighbours: a question may match a
    turn's own words or the exchange it belongs to. A memory saved with a
    ``context`` line (the preceding turn, say) gets a second vector of the
    context followed by the content, and dense recall takes the nearer of the
    two; the full-text index reads context and content together.
    """
    if memory.context and memory.context.strip():
        return memory.content, f"{memory.context.strip()}\n{memory.content}"
    return memory.content, None
