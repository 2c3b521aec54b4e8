"""Long-term recall: :class:`MemoryRecall`.

On PostgreSQL one call to ``harbor.recall()`` generates the candidates (dense
and lexical), fuses, boosts, deduplicates and cuts them; see
``sql/functions/recall/``. Any other store (the in-process one, or yours)
answers through its own ``recall`` (the store protocol's); a store without
one is read through its ``search`` once per recall scope, with a flat
relevance, and ranked by the same rules in Python
(:func:`harbor_pg.ranking.search_and_rank`).

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
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from harbor_pg.embedders.base import Embedder, EmbedderError, normalize_vector
from harbor_pg.errors import MemoryConfigurationError, MemoryValidationError
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.ranking import RecalledMemory, RecallRequest, budget_prefix, search_and_rank
from harbor_pg.records import RECALL_MEMORY_TYPES, Memory, MemoryType, embedding_texts
from harbor_pg.telemetry import DB_SYSTEM, note, traced
from harbor_pg.tiers.base import LongTermStore
from harbor_pg.tokens import TokenCounter, approximate_tokens
from harbor_pg.validation import check_as_of, check_count, check_text, text_problem

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


def _excluded(types: Iterable[MemoryType | str]) -> tuple[MemoryType, ...]:
    """The recallable types a recall leaves out (unknown names are dropped)."""
    if isinstance(types, str):
        types = [types]
    out: list[MemoryType] = []
    for raw in types:
        try:
            t = MemoryType(str(raw).strip().lower())
        except ValueError:
            log.debug("recall: ignoring unknown memory type %r", raw)
            continue
        if t in RECALL_MEMORY_TYPES and t not in out:
            out.append(t)
    return tuple(out)


def _anchors(ids: Iterable[str]) -> tuple[str, ...]:
    """The distinct non-blank string ids (others are dropped); an id PostgreSQL
    cannot store is bad input, refused here rather than failing in the store."""
    out: list[str] = []
    for raw in ids:
        if not isinstance(raw, str):
            continue
        problem = text_problem(raw)
        if problem is not None:
            raise MemoryValidationError(f"anchor_entity_ids has an id that {problem}")
        if raw.strip() and raw not in out:
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
        excluded_types: Sequence[MemoryType | str] = (),
    ) -> tuple[Memory, ...]:
        """The recalled memories, best first, cut to the token budget.

        Never raises for a store or embedder failure (it logs a WARNING and
        recalls less, or nothing); arguments of the wrong kind (a ``top_k`` that
        is not a whole number, a query or an anchor entity id that is not text
        PostgreSQL can store, an ``as_of`` that is not a datetime) raise
        :class:`MemoryValidationError`."""
        scored = await self.recall_scored(
            owner,
            query,
            anchor_entity_ids=anchor_entity_ids,
            wanted_types=wanted_types,
            as_of=as_of,
            top_k=top_k,
            token_budget=token_budget,
            excluded_types=excluded_types,
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
        excluded_types: Sequence[MemoryType | str] = (),
    ) -> tuple[RecalledMemory, ...]:
        """Like :meth:`recall`, with every ranking signal of each memory.

        ``token_budget`` defaults to :attr:`block_budget`; ``top_k`` to the
        policy's ``recall_top_k``. A blank query, recall switched off, or a
        ``top_k`` of 0 give ``()``. Unknown wanted types are dropped, at most
        three are kept. ``excluded_types`` (say ``["observation"]``) are left out
        of the candidates before they are ranked.
        """
        request = await self.prepare(
            owner,
            query,
            anchor_entity_ids=anchor_entity_ids,
            wanted_types=wanted_types,
            as_of=as_of,
            top_k=top_k,
            token_budget=token_budget,
            excluded_types=excluded_types,
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
        excluded_types: Sequence[MemoryType | str] = (),
    ) -> RecallRequest | None:
        """The request :meth:`recall_scored` would run (query embedded), or None for no recall.

        Exposed so a caller can run ``harbor.recall()`` inside a statement of
        its own (``MemoryManager.snapshot`` does) and finish with :meth:`finish`.
        """
        policy = self.policy
        check_text(query, "query", optional=True)
        check_as_of(as_of)
        anchors = _anchors(anchor_entity_ids)
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
            anchor_entity_ids=anchors,
            wanted_types=_wanted(wanted_types),
            excluded_types=_excluded(excluded_types),
            as_of=as_of,
            recency_half_life_hours=policy.recency_half_life_hours,
            entity_weight=policy.entity_overlap_weight,
            type_weight=policy.type_affinity_weight,
            rrf_k=policy.rrf_k,
            fusion=policy.recall_fusion,
            max_sensitivity=policy.recall_max_sensitivity,
            token_budget=self.block_budget if token_budget is None else max(0, int(token_budget)),
            importance_half_life_hours=policy.importance_half_life_hours,
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
            **_database_attributes(self.memories),
            "harbor.recall.dense": request.embedding is not None,
            "harbor.recall.top_k": request.top_k,
        },
        result=lambda items: {"harbor.recall.candidates": len(items)},
    )
    async def _rank(self, owner: MemoryOwner, request: RecallRequest) -> list[RecalledMemory]:
        store = self.memories
        recall = getattr(store, "recall", None)
        if recall is None:  # a store written before the protocol had recall()
            return await search_and_rank(store, owner, request)
        found: list[RecalledMemory] = await recall(owner, request)
        return found


def _database_attributes(store: object) -> dict[str, Any]:
    """The span attributes of a store whose recall is a database function."""
    procedure = getattr(store, "recall_procedure", None)
    if procedure is None:
        return {}
    return {
        "db.system.name": DB_SYSTEM,
        "db.operation.name": "SELECT",
        "db.stored_procedure.name": procedure,
    }


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
