"""The model-facing fact schema, parsed leniently, and the chat scope rules.

A model's structured output is untrusted and often slightly off-schema, so the
parsers below never reject a fact for a bad label: they map it to the most
conservative reading instead. The one thing they never do is widen what the
fact may reach -- TENANT and GLOBAL are never produced from chat.

Lenient choices, and why:

- ``type``: case-insensitive, plural forms accepted; anything else (including
  ``summary``, which only the rolling summariser writes) becomes ``FACT``. A
  mislabelled statement is still a statement, and type only nudges ranking.
- ``scope``: ``user``, ``project`` or ``session``; anything unparseable, wider
  or otherwise not writable from chat becomes ``SESSION`` (seed 000 Scope rules).
- ``importance``: numbers and numeric strings, clamped to 0..1; missing or
  unparseable becomes 0.0, so an unscored fact falls below any importance floor
  instead of being stored on a guess.
- ``sensitivity``: the four levels, case-insensitive; missing or ``null`` is
  ``none`` (seed 004's default), an unrecognised label is ``sensitive`` because
  over-classifying is the safe mistake.
- ``entities``: a list of strings (a bare string is one mention); blanks,
  non-strings, over-long mentions and duplicates are dropped.
- ``replaces``: see :func:`parse_replaces`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from harbor_pg.owner import MAX_ID_LENGTH, MemoryOwner, MemoryScope
from harbor_pg.records import Memory, MemoryType, Sensitivity, content_hash

__all__ = [
    "CHAT_SCOPES",
    "EXTRACTABLE_TYPES",
    "HASH_PREFIX_LENGTH",
    "ExtractedFact",
    "ExtractionResult",
    "coerce_scope",
    "memory_reference",
    "parse_chat_scope",
    "parse_entities",
    "parse_importance",
    "parse_memory_type",
    "parse_replaces",
    "parse_sensitivity",
]

#: Memory types extraction may write (summaries come only from the summariser).
EXTRACTABLE_TYPES: tuple[MemoryType, ...] = (
    MemoryType.FACT,
    MemoryType.PREFERENCE,
    MemoryType.DECISION,
    MemoryType.EPISODE,
)

#: The only scopes a conversation may write.
CHAT_SCOPES: tuple[MemoryScope, ...] = (MemoryScope.USER, MemoryScope.PROJECT, MemoryScope.SESSION)

#: Hex characters of ``content_hash`` shown to the model as a memory's reference.
HASH_PREFIX_LENGTH = 12

_MAX_ENTITIES = 32

_TYPE_ALIASES: dict[str, MemoryType] = {t.value: t for t in EXTRACTABLE_TYPES} | {
    f"{t.value}s": t for t in EXTRACTABLE_TYPES
}
_SCOPE_ALIASES: dict[str, MemoryScope] = {s.value: s for s in CHAT_SCOPES} | {
    "conversation": MemoryScope.SESSION,
    "personal": MemoryScope.USER,
}
_NULLISH = frozenset({"", "none", "null", "nil", "n/a"})
_REFERENCE = re.compile(
    r"^\s*(?:\[\s*(?P<bracketed>[0-9a-f]+)\s*\]|(?P<bare>[0-9a-f]+)(?![0-9a-z_-]))",
    re.IGNORECASE,
)
_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")


def _label(raw: object) -> str | None:
    if isinstance(raw, MemoryScope | MemoryType | Sensitivity):
        return raw.value
    if isinstance(raw, str):
        return raw.strip().lower()
    return None


def parse_memory_type(raw: object) -> MemoryType:
    """Read a model-proposed type; anything not extractable becomes ``FACT``."""
    label = _label(raw)
    return _TYPE_ALIASES.get(label, MemoryType.FACT) if label is not None else MemoryType.FACT


def parse_chat_scope(raw: object) -> MemoryScope:
    """Read a model-proposed scope; anything but USER, PROJECT, SESSION becomes SESSION."""
    label = _label(raw)
    if label is None:
        return MemoryScope.SESSION
    return _SCOPE_ALIASES.get(label, MemoryScope.SESSION)


def coerce_scope(raw: object, owner: MemoryOwner) -> MemoryScope:
    """The scope a fact proposed from chat is actually stored under (seed 000 Scope rules).

    Only USER, PROJECT and SESSION can come out of a conversation; an
    unparseable or wider scope (TENANT, GLOBAL) falls back to SESSION, and so
    does RUN, which chat extraction does not write. A scope the owner cannot
    address -- PROJECT from an owner without ``project_id`` -- degrades to
    SESSION rather than being stored where another project could read it.
    """
    scope = parse_chat_scope(raw)
    if scope is not MemoryScope.SESSION and not owner.can_address(scope):
        return MemoryScope.SESSION
    return scope


def parse_importance(raw: object) -> float:
    """Read an importance as a float in 0..1; missing or unparseable is 0.0."""
    if isinstance(raw, bool):
        return 0.0
    value: float
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        percent = _PERCENT.match(raw)
        try:
            value = float(percent.group(1)) / 100 if percent else float(raw.strip())
        except ValueError:
            return 0.0
    else:
        return 0.0
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))


def parse_sensitivity(raw: object) -> Sensitivity:
    """Read a sensitivity label; missing is NONE, unrecognised is SENSITIVE."""
    if raw is None:
        return Sensitivity.NONE
    label = _label(raw)
    if label is None:
        return Sensitivity.SENSITIVE
    if label in _NULLISH:
        return Sensitivity.NONE
    try:
        return Sensitivity(label)
    except ValueError:
        return Sensitivity.SENSITIVE


def parse_entities(raw: object) -> list[str]:
    """Read entity mentions: stripped, non-blank, at most MAX_ID_LENGTH chars, deduplicated."""
    items: list[object]
    if isinstance(raw, str):
        items = [raw]
    elif isinstance(raw, list | tuple):
        items = list(raw)
    else:
        return []
    mentions: list[str] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, str):
            continue
        mention = " ".join(item.split())
        key = mention.casefold()
        if not mention or len(mention) > MAX_ID_LENGTH or key in seen:
            continue
        seen.add(key)
        mentions.append(mention)
        if len(mentions) == _MAX_ENTITIES:
            break
    return mentions


def parse_replaces(ref: object) -> str | None:
    """Normalise a supersession reference to the lowercase 12-hex-character hash prefix.

    Accepts the bracketed form the prompt shows (``[3f9a0c1b2d4e]``), the bare
    prefix, a longer prefix or the full hash (cut to 12), and a reference
    followed by the copied memory text. Anything shorter than 12 hex
    characters, or not hex at all, is ``None``: the extractor resolves
    references by exact lookup, and a guess must never supersede the wrong row.
    """
    if not isinstance(ref, str):
        return None
    match = _REFERENCE.match(ref)
    if match is None:
        return None
    digits = match.group("bracketed") or match.group("bare")
    if len(digits) < HASH_PREFIX_LENGTH:
        return None
    return digits[:HASH_PREFIX_LENGTH].lower()


def memory_reference(memory: Memory) -> str:
    """The reference a stored memory is shown under: the first 12 hex chars of its hash."""
    digest = memory.content_hash or content_hash(memory.scope, memory.content)
    return digest[:HASH_PREFIX_LENGTH].lower()


_TYPE_SCHEMA = WithJsonSchema(
    {
        "type": "string",
        "enum": [t.value for t in EXTRACTABLE_TYPES],
        "description": "fact, preference, decision or episode",
    }
)
_SCOPE_SCHEMA = WithJsonSchema(
    {
        "type": "string",
        "enum": [s.value for s in CHAT_SCOPES],
        "description": "user: personal preference or stable trait; project: decision, "
        "convention or fact about the project; session: matters only in this conversation",
    }
)
_SENSITIVITY_SCHEMA = WithJsonSchema(
    {
        "type": "string",
        "enum": [s.value for s in Sensitivity],
        "description": "none < low < pii < sensitive",
    }
)

_FACT_DEFAULTS: dict[str, Any] = {
    "content": "",
    "type": MemoryType.FACT,
    "scope": MemoryScope.SESSION,
    "importance": 0.0,
    "entities": [],
    "sensitivity": None,
    "replaces": None,
}
_FACT_ALIASES = {
    "memory_type": "type",
    "kind": "type",
    "entity_mentions": "entities",
    "mentions": "entities",
    "text": "content",
    "fact": "content",
    "supersedes": "replaces",
}


# Its model_config has the shape of context/prompts.py's RewriteResult, on purpose (see there).
class ExtractedFact(BaseModel):
    """One atomic fact proposed by the extraction model, already normalised.

    Every field is required in the JSON schema the model is shown, but parsing
    is lenient (see the module docstring): a missing or odd value becomes its
    conservative default instead of failing the whole extraction. ``scope`` here
    is the model's judgement narrowed to USER/PROJECT/SESSION; use
    :meth:`scope_for` (or :func:`coerce_scope`) to apply the owner's limits.
    """

    # The docstring is for developers; the model is shown this description instead.
    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        json_schema_extra={"description": "One atomic, self-contained fact worth remembering."},
    )

    content: str = Field(
        description="One self-contained third-person statement, e.g. 'The user prefers dark mode.'"
    )
    type: Annotated[MemoryType, _TYPE_SCHEMA]
    scope: Annotated[MemoryScope, _SCOPE_SCHEMA]
    importance: float = Field(description="How worth remembering, 0 (trivial) to 1 (essential)")
    entities: list[str] = Field(description="Names of the people, projects, tools it is about")
    sensitivity: Annotated[Sensitivity, _SENSITIVITY_SCHEMA]
    replaces: str | None = Field(
        description="The bracketed reference, e.g. [3f9a0c1b2d4e], of the stored memory "
        "this fact contradicts or updates; null when it replaces nothing"
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_missing(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        filled = dict(_FACT_DEFAULTS)
        for key, value in data.items():
            if not isinstance(key, str):
                continue
            name = _FACT_ALIASES.get(key, key)
            # an alias must not override the canonical key when both are present
            if name != key and name in data:
                continue
            filled[name] = value
        return filled

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: object) -> str:
        return value.strip() if isinstance(value, str) else ""

    @field_validator("type", mode="before")
    @classmethod
    def _type(cls, value: object) -> MemoryType:
        return parse_memory_type(value)

    # One shape per validator, on purpose: each delegates to its parse_* function.
    @field_validator("scope", mode="before")
    @classmethod
    def _scope(cls, value: object) -> MemoryScope:
        return parse_chat_scope(value)

    @field_validator("importance", mode="before")
    @classmethod
    def _importance(cls, value: object) -> float:
        return parse_importance(value)

    @field_validator("entities", mode="before")
    @classmethod
    def _entities(cls, value: object) -> list[str]:
        return parse_entities(value)

    @field_validator("sensitivity", mode="before")
    @classmethod
    def _sensitivity(cls, value: object) -> Sensitivity:
        return parse_sensitivity(value)

    @field_validator("replaces", mode="before")
    @classmethod
    def _replaces(cls, value: object) -> str | None:
        return parse_replaces(value)

    def scope_for(self, owner: MemoryOwner) -> MemoryScope:
        """The scope this fact is stored under for ``owner`` (see :func:`coerce_scope`)."""
        return coerce_scope(self.scope, owner)


class ExtractionResult(BaseModel):
    """The extraction model's whole answer: a list of proposed facts.

    A bare list is accepted as the fact list, and items that are not objects
    are dropped rather than failing the rest.
    """

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        json_schema_extra={"description": "Facts extracted from the conversation."},
    )

    facts: list[ExtractedFact] = Field(description="Atomic facts worth remembering; may be empty")

    @model_validator(mode="before")
    @classmethod
    def _lenient(cls, data: Any) -> Any:
        if isinstance(data, list | tuple):
            data = {"facts": data}
        if not isinstance(data, Mapping):
            return data
        facts = data.get("facts")
        items = facts if isinstance(facts, list | tuple) else []
        return {"facts": [item for item in items if isinstance(item, Mapping | ExtractedFact)]}
