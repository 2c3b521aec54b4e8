"""Long-term recall: :class:`MemoryRecall`.

On PostgreSQL one call to ``harbor.recall()`` generates the candidates (dense
and lexical), fuses, boosts, deduplicates and cuts them; see
``sql/functions/recall/``. Any other store (the in-process one, or yours)
is read through its own ``search`` once per recall scope, with a flat
relevance, and ranked by the same rules in Python
(:mod:`harbor_pg.context.ranking`).

Failure semantics (seed 000): recall never raises into the turn.

=====================  =============================================
failure                what recall does
=====================  =============================================
embedder raises        WARNING, lexical / substring recall
index raises           WARNING, lexical / substring recall
repository raises      WARNING, no candidates for that scope
=====================  =============================================
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from harbor_pg.context.ranking import (
    RecalledMemory,
    budget_prefix,
    dedupe,
    entity_boost,
    final_score,
    fused_relevance,
    recency,
    rrf,
    type_boost,
)
from harbor_pg.db.sqlfiles import query as sql_query
from harbor_pg.db.vectors import PgVector
from harbor_pg.embedders.base import Embedder, EmbedderError, normalize_vector
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import (
    RECALL_MEMORY_TYPES,
    Memory,
    MemoryType,
    Sensitivity,
    embedding_texts,
)
from harbor_pg.telemetry import DB_SYSTEM, note, traced
from harbor_pg.tiers.base import LongTermStore
from harbor_pg.tiers.long_term import PostgresLongTermStore, memory_from_row
from harbor_pg.tokens import TokenCounter, approximate_tokens
from harbor_pg.validation import check_count, check_text

if TYPE_CHECKING:
    from harbor_pg.db.connection import Database

__all__ = [
    "MemoryRecall",
    "RecallRequest",
    "RecalledMemory",
    "embedding_texts",
    "recalled_entity_ids",
]

log = logging.getLogger("harbor_pg.recall")

#: Longest query text embedded (models read a few hundred tokens at most).
MAX_EMBED_CHARS = 4000
#: Longest query text searched lexically (the rest is ignored).
MAX_QUERY_CHARS = 20_000


@dataclass(frozen=True)
class RecallRequest:
    """Everything one recall needs besides the owner; built by :class:`MemoryRecall`."""

    query: str
    scopes: tuple[MemoryScope, ...]
    top_k: int
    anchor_entity_ids: tuple[str, ...] = ()
    wanted_types: tuple[MemoryType, ...] = ()
    as_of: datetime | None = None
    # These defaults repeat MemoryPolicy's on purpose, so a request built by hand ranks as the
    # default policy does; tests/unit/test_policy.py checks that the two agree.
    recency_half_life_hours: float | None = 4320.0
    entity_weight: float = 0.5
    type_weight: float = 0.5
    rrf_k: int = 5
    dense_weight: float = 0.75
    lexical_weight: float = 1.0
    min_similarity: float | None = None
    token_budget: int | None = None
    embedding: list[float] | None = None
    model_id: str | None = None
    #: candidates per leg (None: max(2 x top_k, 50))
    candidates: int | None = None
    #: how the two legs' lists are fused: "rrf" or "weighted" (see harbor.recall())
    fusion: str = "rrf"
    #: the most sensitive memories recall may return (candidates above it are never read)
    max_sensitivity: Sensitivity = Sensitivity.PII
    #: share of the better fused relevance of a candidate's neighbours (the
    #: candidates before and after it in its conversation) a candidate adds
    neighbour_weight: float = 0.75
    #: relevance times (1 + date_weight) for a memory valid from a month or year the query names
    date_weight: float = 2.0

    @property
    def candidates_per_leg(self) -> int:
        """How many candidates each search hands the ranking, counted as
        ``harbor.recall()`` counts them: ``candidates``, at least max(2 x top_k, 50)."""
        return max(self.candidates or 0, 2 * self.top_k, 50)


def _wanted(types: Iterable[MemoryType | str]) -> tuple[MemoryType, ...]:
    out: list[MemoryType] = []
    for raw in types:
        try:
            t = MemoryType(str(raw).strip().lower())
        except ValueError:
            log.debug("recall: ignoring unknown memory type %r", raw)
            continue
        if t in RECALL_MEMORY_TYPES and t not in out:
            out.append(t)
    return tuple(out[:3])


def _anchors(ids: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for raw in ids:
        if isinstance(raw, str) and raw.strip() and raw not in out:
            out.append(raw)
    return tuple(out)


class MemoryRecall:
    """Ranked long-term memories for a question.

    Args:
        policy: recall settings (``recall_top_k``, ``recall_scopes``,
            ``recency_half_life_hours``, the boost weights, ``rrf_k``,
            ``relevance_threshold``, ``block_budget_fraction`` x ``recent_max_tokens``).
        memories: the long-term store (the canonical repository).
        index: where the vectors live. On PostgreSQL the vectors sit beside
            the memories, so the index *is* the store: pass the same object, or
            leave it ``None`` to use the store whenever an embedder is wired.
            Pass ``False`` to switch the dense leg off.
        embedder: embeds the query; dense candidates need both an embedder and
            an index.
        token_counter: counts tokens of the rendered block instead of
            :func:`~harbor_pg.tokens.approximate_tokens`.
    """

    def __init__(
        self,
        *,
        policy: MemoryPolicy | None = None,
        memories: LongTermStore | None,
        index: LongTermStore | bool | None = None,
        embedder: Embedder | None = None,
        token_counter: TokenCounter | None = None,
    ) -> None:
        if memories is None:
            raise MemoryConfigurationError("MemoryRecall needs the long-term store (memories=)")
        if index not in (None, False, True) and index is not memories:
            raise MemoryConfigurationError(
                "the vector index must be the long-term store that holds the vectors"
            )
        self.policy = policy or MemoryPolicy()
        self.memories = memories
        self.embedder = embedder
        self.dense = embedder is not None and index is not False
        self.token_counter = token_counter

    @property
    def block_budget(self) -> int:
        """Tokens the recalled block may take: ``block_budget_fraction * recent_max_tokens``."""
        return int(self.policy.block_budget_fraction * self.policy.recent_max_tokens)

    # Signature repeated on purpose by recall_scored() below and by MemoryManager.recall
    # (the facade's documented entry point); both delegate here or to recall_scored().
    async def recall(
        self,
        owner: MemoryOwner,
        query: str,
        *,
        anchor_entity_ids: Sequence[str] = (),
        wanted_types: Sequence[MemoryType | str] = (),
        as_of: datetime | None = None,
        top_k: int | None = None,
        token_budget: int | None = None,
    ) -> tuple[Memory, ...]:
        """The recalled memories, best first, cut to the token budget.

        Never raises for a store or embedder failure (it logs a WARNING and
        recalls less, or nothing); arguments of the wrong kind (a ``top_k`` that
        is not a whole number, a query that is not text PostgreSQL can store)
        raise :class:`MemoryValidationError`."""
        scored = await self.recall_scored(
            owner,
            query,
            anchor_entity_ids=anchor_entity_ids,
            wanted_types=wanted_types,
            as_of=as_of,
            top_k=top_k,
            token_budget=token_budget,
        )
        return tuple(item.memory for item in scored)

    # recall() above and recall_scored() share their signature on purpose: two public
    # methods, plain and with every signal; recall() delegates.
    @traced(
        "harbor_pg.recall",
        attributes=lambda self, owner, query, **kw: {"harbor.recall.top_k": kw.get("top_k")},
        result=lambda items: {"harbor.recall.returned": len(items)},
    )
    async def recall_scored(
        self,
        owner: MemoryOwner,
        query: str,
        *,
        anchor_entity_ids: Sequence[str] = (),
        wanted_types: Sequence[MemoryType | str] = (),
        as_of: datetime | None = None,
        top_k: int | None = None,
        token_budget: int | None = None,
    ) -> tuple[RecalledMemory, ...]:
        """Like :meth:`recall`, with every ranking signal of each memory.

        ``token_budget`` defaults to :attr:`block_budget`; ``top_k`` to the
        policy's ``recall_top_k``. A blank query, recall switched off, or a
        ``top_k`` of 0 give ``()``. Unknown wanted types are dropped, at most
        three are kept.
        """
        request = await self.prepare(
            owner,
            query,
            anchor_entity_ids=anchor_entity_ids,
            wanted_types=wanted_types,
            as_of=as_of,
            top_k=top_k,
            token_budget=token_budget,
        )
        if request is None:
            return ()
        try:
            items = await self._rank(owner, request)
        except Exception as exc:  # index failure: retry without the dense leg
            if request.embedding is None:
                log.warning("recall: the memory store failed, no memories this turn: %s", exc)
                note("harbor.recall.degraded", "store")
                return ()
            log.warning("recall: dense search failed, falling back to lexical recall: %s", exc)
            note("harbor.recall.degraded", "lexical")
            try:
                items = await self._rank(owner, _without_embedding(request))
            except Exception as again:
                log.warning("recall: the memory store failed, no memories this turn: %s", again)
                note("harbor.recall.degraded", "store")
                return ()
        return self.finish(items, request)

    async def prepare(
        self,
        owner: MemoryOwner,
        query: str,
        *,
        anchor_entity_ids: Sequence[str] = (),
        wanted_types: Sequence[MemoryType | str] = (),
        as_of: datetime | None = None,
        top_k: int | None = None,
        token_budget: int | None = None,
    ) -> RecallRequest | None:
        """The request :meth:`recall_scored` would run (query embedded), or None for no recall.

        Exposed so a caller can run ``harbor.recall()`` inside a statement of
        its own (``MemoryManager.snapshot`` does) and finish with :meth:`finish`.
        """
        policy = self.policy
        check_text(query, "query", optional=True)
        k = policy.recall_top_k if top_k is None else min(_whole(top_k, "top_k"), 1000)
        if token_budget is not None:
            token_budget = _whole(token_budget, "token_budget")
        text = (query or "")[:MAX_QUERY_CHARS]
        if not policy.enabled or k == 0 or not text.strip():
            return None
        scopes = tuple(s for s in policy.recall_scopes if owner.can_address(s))
        if not scopes:
            return None
        # (keyword for keyword like the fused_relevance(...) call below by shape only)
        request = RecallRequest(
            query=text,
            scopes=scopes,
            top_k=k,
            anchor_entity_ids=_anchors(anchor_entity_ids),
            wanted_types=_wanted(wanted_types),
            as_of=as_of,
            recency_half_life_hours=policy.recency_half_life_hours,
            entity_weight=policy.entity_overlap_weight,
            type_weight=policy.type_affinity_weight,
            rrf_k=policy.rrf_k,
            fusion=policy.recall_fusion,
            max_sensitivity=policy.recall_max_sensitivity,
            token_budget=self.block_budget if token_budget is None else max(0, int(token_budget)),
        )
        if self.dense and self.embedder is not None:
            request = await self._with_embedding(request)
        return request

    def finish(
        self, items: Sequence[RecalledMemory], request: RecallRequest
    ) -> tuple[RecalledMemory, ...]:
        """Cut ranked ``items`` to the request's token budget with this recall's counter."""
        counter = self.token_counter or approximate_tokens
        return tuple(budget_prefix(items, request.token_budget, counter))

    @traced(
        lambda self, request: f"embeddings {self.embedder.model_id}",
        kind="client",
        attributes=lambda self, request: {
            "gen_ai.operation.name": "embeddings",
            "gen_ai.request.model": self.embedder.model_id,
        },
    )
    async def _with_embedding(self, request: RecallRequest) -> RecallRequest:
        assert self.embedder is not None
        try:
            raw = await self.embedder.embed_query(request.query[:MAX_EMBED_CHARS])
            vector = normalize_vector(
                raw, dimensions=self.embedder.dimensions, model_id=self.embedder.model_id
            )
        except (EmbedderError, Exception) as exc:
            log.warning("recall: the embedder failed, falling back to lexical recall: %s", exc)
            note("harbor.recall.degraded", "lexical")
            return request
        threshold = self.policy.relevance_threshold
        if threshold is None:
            threshold = self.embedder.relevance_threshold
        return replace(
            request, embedding=vector, model_id=self.embedder.model_id, min_similarity=threshold
        )

    @traced(
        "harbor.recall",
        kind="client",
        attributes=lambda self, owner, request: {
            **(
                {
                    "db.system.name": DB_SYSTEM,
                    "db.operation.name": "SELECT",
                    "db.stored_procedure.name": "harbor.recall",
                }
                if isinstance(self.memories, PostgresLongTermStore)
                else {}
            ),
            "harbor.recall.dense": request.embedding is not None,
            "harbor.recall.top_k": request.top_k,
        },
        result=lambda items: {"harbor.recall.candidates": len(items)},
    )
    async def _rank(self, owner: MemoryOwner, request: RecallRequest) -> list[RecalledMemory]:
        store = self.memories
        if isinstance(store, PostgresLongTermStore):
            return await _postgres_recall(store, owner, request)
        return await _generic_recall(store, owner, request)


def _whole(value: object, what: str) -> int:
    """``value`` as a count (negative ones as 0; a float only if whole), else
    :class:`MemoryValidationError`."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0, value)
    return check_count(value, what)  # raises, naming the type


def _without_embedding(request: RecallRequest) -> RecallRequest:
    return replace(request, embedding=None, model_id=None, min_similarity=None)


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
    }


_MEMORY_FIELDS = tuple(Memory.model_fields)
_memory_values = operator.itemgetter(*_MEMORY_FIELDS)
_set_attribute = object.__setattr__
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
    memory = Memory.__new__(Memory)
    _set_attribute(memory, "__dict__", data)
    _set_attribute(memory, "__pydantic_fields_set__", set(data))
    _set_attribute(memory, "__pydantic_extra__", None)
    _set_attribute(memory, "__pydantic_private__", None)
    return memory


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
    round trip (the identity and the call are sent together and share a transaction)."""
    return await db.fetch_rows_in_one_round_trip(
        owner, sql_query("recall"), recall_params(request), recalled_rows
    )


async def _postgres_recall(
    store: PostgresLongTermStore, owner: MemoryOwner, request: RecallRequest
) -> list[RecalledMemory]:
    return await recall_in_one_round_trip(store.db, owner, request)


async def _generic_recall(
    store: LongTermStore, owner: MemoryOwner, request: RecallRequest
) -> list[RecalledMemory]:
    """Any store: its own search per scope, flat relevance, the same scoring rules."""
    as_of = request.as_of or datetime.now(UTC)
    # a first-ranked match's relevance, as harbor.recall() gives its substring matches
    flat = 1.0 if request.fusion == "weighted" else rrf([1], request.rrf_k)
    candidates: list[RecalledMemory] = []
    for scope in request.scopes:
        try:
            found = await store.search(
                owner.narrowed(scope), request.query, limit=request.candidates_per_leg, as_of=as_of
            )
        except Exception as exc:
            log.warning(
                "recall: reading %s memories failed, none from that scope: %s", scope.value, exc
            )
            continue
        for memory in found:
            if memory.scope is not scope or memory.memory_type is MemoryType.SUMMARY:
                continue
            if memory.sensitivity.level > request.max_sensitivity.level:
                continue  # above the ceiling: never a candidate
            rec = recency(memory, as_of, request.recency_half_life_hours)
            ent = entity_boost(memory, request.anchor_entity_ids, request.entity_weight)
            typ = type_boost(memory, request.wanted_types, request.type_weight)
            candidates.append(
                RecalledMemory(
                    memory=memory,
                    rank=0,
                    relevance=flat,
                    recency=rec,
                    entity=ent,
                    type_boost=typ,
                    score=final_score(flat, rec, memory.importance, ent, typ),
                    tokens=0,
                    substring_match=True,
                )
            )
    # the neighbour and date signals, as harbor.recall() adds them to relevance (keyword for
    # keyword like prepare()'s RecallRequest(...) and commands.py's MemoryOwner(...) by shape
    # only, `duplicates` pairs them: not a copy)
    parts = fused_relevance(
        candidates,
        fusion=request.fusion,
        rrf_k=request.rrf_k,
        dense_weight=request.dense_weight,
        lexical_weight=request.lexical_weight,
        neighbour_weight=request.neighbour_weight,
        date_weight=request.date_weight,
        query=request.query,
    )
    candidates = [
        replace(
            c,
            relevance=p.relevance,
            neighbour=p.neighbour,
            date_match=p.date_match,
            score=final_score(p.relevance, c.recency, c.memory.importance, c.entity, c.type_boost),
        )
        for c, p in zip(candidates, parts, strict=True)
    ]
    ranked = dedupe(candidates)[: request.top_k]
    return [replace(item, rank=i + 1) for i, item in enumerate(ranked)]


def recalled_entity_ids(recalled: Iterable[Memory | RecalledMemory] | Any) -> tuple[str, ...]:
    """The deduplicated union of ``entity_ids`` across recalled memories, in recall order.

    Accepts a sequence of memories (or scored memories) or anything with a
    ``recalled`` attribute (such as a ``MemoryContext``): the seed set for a
    graph-anchored follow-up search.
    """
    items = getattr(recalled, "recalled", recalled)
    out: list[str] = []
    for item in items:
        memory = item.memory if isinstance(item, RecalledMemory) else item
        for entity in memory.entity_ids:
            if entity not in out:
                out.append(entity)
    return tuple(out)
