"""Rows of the memories table and of ``harbor.recall()`` as records, and back.

:func:`memory_params` are a memory's columns as ``insert_memory`` names them,
:func:`memory_from_row` validates a memory row; for recall, a
:class:`~harbor_pg.ranking.RecallRequest` becomes the named parameters of
``harbor.recall()`` (``sql/queries/recall.sql``) and its rows come back as
:class:`~harbor_pg.ranking.RecalledMemory`, built by column position.
:meth:`PostgresLongTermStore.recall <harbor_pg.tiers.long_term.PostgresLongTermStore.recall>`
runs it in one round trip.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, TypeVar

from psycopg.types.json import Jsonb
from pydantic import BaseModel

from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query as sql_query
from harbor_pg.db.vectors import PgVector
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.profile import ProfileRequest
from harbor_pg.ranking import RecalledMemory, RecallRequest
from harbor_pg.records import Memory, MemoryType, Sensitivity, content_hash

__all__ = [
    "ELEVATED_SCOPES",
    "current_memories_params",
    "memory_from_row",
    "memory_params",
    "profile_params",
    "recall_in_one_round_trip",
    "recall_params",
    "recalled_from_row",
    "recalled_rows",
]


#: Scopes only the elevated role may write.
ELEVATED_SCOPES = frozenset({MemoryScope.TENANT, MemoryScope.GLOBAL})


def memory_params(owner: MemoryOwner, memory: Memory) -> dict[str, Any]:
    """Named parameters of ``insert_memory`` for ``memory`` saved by ``owner``."""
    key = owner.key(memory.scope)
    return {
        **key,
        "id": memory.id,
        "scope": memory.scope.value,
        "principal_id": "" if memory.scope in ELEVATED_SCOPES else (owner.principal_id or ""),
        "memory_type": memory.memory_type.value,
        "importance": memory.importance,
        "content": memory.content,
        "content_hash": memory.content_hash or content_hash(memory.scope, memory.content),
        "context": memory.context,
        "entity_ids": list(memory.entity_ids),
        "source": memory.source,
        "sensitivity": memory.sensitivity.value,
        "source_session_id": memory.source_session_id,
        "source_message_ids": list(memory.source_message_ids),
        "metadata": Jsonb(memory.metadata),
        "valid_from": memory.valid_from,
        "expires_at": memory.expires_at,
    }


def current_memories_params(
    owner: MemoryOwner, scopes: Sequence[MemoryScope], limit: int
) -> dict[str, Any] | None:
    """Parameters of ``extraction_current_memories``; None when no scope is addressable.

    A scope is switched on by its key parameters; a scope the owner cannot
    address (or not asked for) gets NULL keys, which match no row.
    """
    wanted = {MemoryScope(s) for s in scopes}
    usable = {s for s in wanted if owner.can_address(s)}
    on = {s: s in usable for s in (MemoryScope.USER, MemoryScope.SESSION, MemoryScope.PROJECT)}
    if limit <= 0 or not any(on.values()):
        return None
    return {
        "tenant_id": owner.tenant_id,
        "user_user_id": owner.user_id if on[MemoryScope.USER] else None,
        "session_user_id": owner.user_id if on[MemoryScope.SESSION] else None,
        "session_session_id": owner.session_id if on[MemoryScope.SESSION] else None,
        "project_project_id": owner.project_id if on[MemoryScope.PROJECT] else None,
        "limit": limit,
    }


def profile_params(request: ProfileRequest, scopes: Sequence[MemoryScope]) -> dict[str, Any]:
    """Named parameters of the ``profile`` query for ``request``, reading ``scopes``."""
    return {
        "scopes": [s.value for s in scopes],
        "token_budget": request.token_budget,
        "stable_after": request.stable_after,
        "as_of": request.as_of,
        "max_sensitivity": request.max_sensitivity.value,
    }


def memory_from_row(row: dict[str, Any]) -> Memory:
    """A validated :class:`Memory` from a row holding (some of) its columns."""
    data = {k: v for k, v in row.items() if k in Memory.model_fields}
    data["importance"] = float(data.get("importance", 0.5))
    return Memory.model_validate(data)


def recall_params(request: RecallRequest) -> dict[str, Any]:
    """Named parameters of the ``recall`` query for ``request``."""
    vector = request.embedding
    return {
        "query": request.query,
        "embedding": None if vector is None else PgVector(vector),
        "model_id": request.model_id,
        "scopes": [s.value for s in request.scopes],
        "top_k": request.top_k,
        "anchors": list(request.anchor_entity_ids),
        "wanted": [t.value for t in request.wanted_types],
        "as_of": request.as_of,
        "half_life": request.recency_half_life_hours,
        "entity_weight": request.entity_weight,
        "type_weight": request.type_weight,
        "rrf_k": request.rrf_k,
        "min_similarity": request.min_similarity,
        "token_budget": request.token_budget,
        "candidates": request.candidates,
        "dense_weight": request.dense_weight,
        "lexical_weight": request.lexical_weight,
        "fusion": request.fusion,
        "max_sensitivity": request.max_sensitivity.value,
        "neighbour_weight": request.neighbour_weight,
        "date_weight": request.date_weight,
        "importance_half_life": request.importance_half_life_hours,
        "excluded": [t.value for t in request.excluded_types],
    }


_MEMORY_FIELDS = tuple(Memory.model_fields)
_memory_values = operator.itemgetter(*_MEMORY_FIELDS)
_set_attribute = object.__setattr__
_Model = TypeVar("_Model", bound=BaseModel)


def constructed(model: type[_Model], data: dict[str, Any]) -> _Model:
    """``model`` holding ``data``, every field given and already valid, as
    ``model_construct`` builds it then, without its per-field alias and default
    lookups. Only for a model with no post-init hook and no private attributes
    (callers test that once); ``data`` becomes the instance's own dict."""
    instance = model.__new__(model)
    _set_attribute(instance, "__dict__", data)
    _set_attribute(instance, "__pydantic_fields_set__", set(data))
    _set_attribute(instance, "__pydantic_extra__", None)
    _set_attribute(instance, "__pydantic_private__", None)
    return instance


# the shortcut below is model_construct for a model with no post-init hook and no
# private attributes; should Memory gain either, model_construct does the work again
_PLAIN_MEMORY = Memory.__pydantic_post_init__ is None and not Memory.__private_attributes__
# enum members by value: a dict lookup instead of the Enum call (0.9 us each)
_SCOPES = {m.value: m for m in MemoryScope}
_TYPES = {m.value: m for m in MemoryType}
_SENSITIVITIES = {m.value: m for m in Sensitivity}
# harbor.recall()'s signal columns, in _recalled()'s argument order
_SIGNALS = (
    "rank", "relevance", "recency", "entity", "type_boost", "score", "tokens",
    "dense_rank", "similarity", "lexical_rank", "lexical_score", "substring_match",
    "neighbour", "date_match",
)  # fmt: skip
# RecalledMemory is a frozen dataclass without __post_init__ or slots whose
# fields are the memory and these signals: its __init__ only stores them, one
# object.__setattr__ each, so _recalled() may store them in one step
_PLAIN_RECALLED = (
    not hasattr(RecalledMemory, "__post_init__")
    and not hasattr(RecalledMemory, "__slots__")
    and {f.name for f in fields(RecalledMemory)} == {"memory", *_SIGNALS}
)


def _member(members: dict[str, Any], enum: Any, value: Any) -> Any:
    found = members.get(value)
    return enum(value) if found is None else found  # the Enum call raises for a stranger


def _stored_memory(row: dict[str, Any]) -> Memory:
    """A Memory from a typed database row, without re-validating what the database checked."""
    try:
        data = dict(zip(_MEMORY_FIELDS, _memory_values(row), strict=True))
    except KeyError:
        data = {k: row[k] for k in _MEMORY_FIELDS if k in row}
    return _memory_of(data)


def _memory_of(data: dict[str, Any]) -> Memory:
    data["scope"] = _member(_SCOPES, MemoryScope, data["scope"])
    data["memory_type"] = _member(_TYPES, MemoryType, data["memory_type"])
    data["sensitivity"] = _member(_SENSITIVITIES, Sensitivity, data["sensitivity"])
    data["importance"] = float(data["importance"])
    data["entity_ids"] = list(data.get("entity_ids") or [])
    data["source_message_ids"] = list(data.get("source_message_ids") or [])
    data["metadata"] = dict(data.get("metadata") or {})
    if len(data) != len(_MEMORY_FIELDS) or not _PLAIN_MEMORY:
        return Memory.model_construct(**data)
    # every field given (a harbor.recall() row): what model_construct does then,
    # without its per-field default lookups (14 us -> 2 us a memory, a third of
    # the client's work per recall); tests/unit/test_recall_rows.py holds the two equal
    return constructed(Memory, data)


def recalled_from_row(row: dict[str, Any], *, typed: bool = True) -> RecalledMemory:
    """A :class:`RecalledMemory` from one row of ``harbor.recall()``.

    ``typed=False`` for rows that went through JSON (timestamps as text), which
    are validated field by field.
    """
    memory = _stored_memory(row) if typed else memory_from_row(row)
    # (neighbour and date_match: absent from rows of an older harbor.recall())
    return _recalled(memory, *(row.get(name) for name in _SIGNALS))


def _recalled(
    memory: Memory,
    rank: Any,
    relevance: Any,
    recency: Any,
    entity: Any,
    type_boost: Any,
    score: Any,
    tokens: Any,
    dense_rank: Any,
    similarity: Any,
    lexical_rank: Any,
    lexical_score: Any,
    substring_match: Any,
    neighbour: Any = 0.0,
    date_match: Any = 0.0,
) -> RecalledMemory:
    values = {
        "memory": memory,
        "rank": int(rank),
        "relevance": float(relevance),
        "recency": float(recency),
        "entity": float(entity),
        "type_boost": float(type_boost),
        "score": float(score),
        "tokens": int(tokens),
        "dense_rank": dense_rank,
        "similarity": similarity,
        "lexical_rank": lexical_rank,
        "lexical_score": lexical_score,
        "substring_match": bool(substring_match),
        "neighbour": float(neighbour or 0.0),
        "date_match": float(date_match or 0.0),
    }
    if not _PLAIN_RECALLED:
        return RecalledMemory(**values)
    # what the dataclass __init__ stores, in one step (5.7 -> 1 us a memory)
    item = RecalledMemory.__new__(RecalledMemory)
    _set_attribute(item, "__dict__", values)
    return item


#: the column positions of each shape of recall result seen (one, in practice),
#: keyed on its column names as the server sent them
_ROW_SHAPES: dict[tuple[bytes, ...], tuple[Callable[..., Any], Callable[..., Any]]] = {}


def _column_names(cursor: Any) -> tuple[bytes, ...]:
    # the names straight from the result: ``cursor.description`` builds a Column
    # with its type looked up for each of the ~40 columns, on every recall (0.2 ms)
    result = cursor.pgresult
    if result is None:
        return ()
    return tuple(result.fname(i) or b"" for i in range(result.nfields))


def recalled_rows(cursor: Any) -> Callable[[Sequence[Any]], RecalledMemory]:
    """A psycopg row factory: each row of ``harbor.recall()`` straight into a
    :class:`RecalledMemory`, by column position (no dict per row)."""
    key = _column_names(cursor)
    shape = _ROW_SHAPES.get(key)
    if shape is None:
        names = [n.decode() for n in key]
        missing = [n for n in (*_MEMORY_FIELDS, *_SIGNALS[:-2]) if n not in names]
        if missing:
            raise MemoryConfigurationError(f"recall rows lack the columns {missing}")
        shape = (
            operator.itemgetter(*(names.index(n) for n in _MEMORY_FIELDS)),
            operator.itemgetter(*(names.index(n) for n in _SIGNALS if n in names)),
        )
        if len(_ROW_SHAPES) < 16:
            _ROW_SHAPES[key] = shape
    memory_values, signal_values = shape

    def make(values: Sequence[Any]) -> RecalledMemory:
        memory = _memory_of(dict(zip(_MEMORY_FIELDS, memory_values(values), strict=True)))
        return _recalled(memory, *signal_values(values))

    return make


async def recall_in_one_round_trip(
    db: Database, owner: MemoryOwner, request: RecallRequest
) -> list[RecalledMemory]:
    """Run ``harbor.recall()`` as ``owner`` in a transaction of its own, in one
    round trip (the identity and the call are sent together and share a transaction).
    On a distributed database, one call that Citus delegates to the tenant's worker,
    with the identity as its arguments (``harbor.recall_delegated``), unless it reads
    global memories too (their tenant's shard may be another worker's)."""
    if db.set_local and MemoryScope.GLOBAL not in request.scopes:
        params = {**recall_params(request), **carried_identity(owner)}
        return await db.fetch_rows_delegated(sql_query("recall_delegated"), params, recalled_rows)
    return await db.fetch_rows_in_one_round_trip(
        owner, sql_query("recall"), recall_params(request), recalled_rows
    )
