"""The pure scoring rules of recall, as seed 000 defines them.

PostgreSQL ranks inside ``harbor.recall()`` (``sql/functions/recall/ranking.sql``);
these functions are the same rules for stores that are not PostgreSQL (the
in-process store, or one of your own), and the reference the SQL is tested
against::

    final = relevance * (1 + recency) * (1 + importance) * (1 + entity) * (1 + type)
    recency = 0.5 ** (hours_since_updated / recency_half_life_hours)
    entity = entity_overlap_weight * overlapping_ids / max(1, len(memory.entity_ids))
    type = type_affinity_weight when memory.memory_type was asked for, else 0
    importance = importance * 0.5 ** (hours_since_last_recalled / importance_half_life_hours)
                 (only with a half-life: importance decay, off by default)

``relevance`` fuses the dense and lexical lists (:func:`fuse`): by default
the reciprocal rank fusion ``sum(weight / (rrf_k + rank))``; with
``fusion="weighted"``, ``dense_weight * s_dense + lexical_weight * s_lexical``
where each leg's score (cosine similarity, BM25) is min-max normalised over
that leg's candidates (1 when they all score the same, 0 when absent). A
memory's "updated" time is the start of its validity interval: memories are
add-only, so that is when its content became what we believe.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import NamedTuple, Protocol

from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory, MemoryType, Sensitivity, content_hash, normalize_content
from harbor_pg.tokens import TokenCounter, approximate_tokens

__all__ = [
    "RecallRequest",
    "RecalledMemory",
    "Relevance",
    "SearchableStore",
    "budget_prefix",
    "date_match",
    "dedupe",
    "entity_boost",
    "final_score",
    "fuse",
    "fused_relevance",
    "neighbour_relevance",
    "order_key",
    "query_dates",
    "recency",
    "render_recalled",
    "rrf",
    "search_and_rank",
    "type_boost",
]

log = logging.getLogger("harbor_pg.recall")


@dataclass(frozen=True)
class RecalledMemory:
    """One recalled memory with every signal that ranked it.

    ``dense_rank``/``similarity`` and ``lexical_rank``/``lexical_score`` are
    ``None`` when the memory was not in that list; ``substring_match`` marks a
    candidate from the substring fallback (flat relevance).
    """

    memory: Memory
    rank: int
    relevance: float
    recency: float
    entity: float
    type_boost: float
    score: float
    tokens: int
    dense_rank: int | None = None
    similarity: float | None = None
    lexical_rank: int | None = None
    lexical_score: float | None = None
    substring_match: bool = False
    #: the better fused relevance of the candidates before and after this one
    #: (0 when neither is a candidate), see :func:`neighbour_relevance`
    neighbour: float = 0.0
    #: 1 when the query names a month or year this memory became valid in, else 0
    date_match: float = 0.0


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
    #: importance decay: the half-life, in hours since recall last returned a memory (or
    #: since it became valid), of its importance in the score; None: no decay
    importance_half_life_hours: float | None = None
    #: memory types left out of the candidates before they are ranked
    excluded_types: tuple[MemoryType, ...] = ()

    @property
    def candidates_per_leg(self) -> int:
        """How many candidates each search hands the ranking, counted as
        ``harbor.recall()`` counts them: ``candidates``, at least max(2 x top_k, 50)."""
        return max(self.candidates or 0, 2 * self.top_k, 50)


_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August",
    "September", "October", "November", "December",
)  # fmt: skip
_MONTH_WORD = re.compile(r"\b(" + "|".join(_MONTHS) + r")\b")
_YEAR_WORD = re.compile(r"\b((?:19|20)[0-9]{2})\b")


def query_dates(query: str) -> tuple[frozenset[int], frozenset[int]]:
    """The months (1-12, capitalised English names) and years (19xx, 20xx) a query
    names as whole words, as ``harbor.recall()`` reads them for ``date_match``."""
    text = query[:20000]
    months = frozenset(_MONTHS.index(m) + 1 for m in _MONTH_WORD.findall(text))
    years = frozenset(int(y) for y in _YEAR_WORD.findall(text))
    return months, years


def date_match(memory: Memory, months: Collection[int], years: Collection[int]) -> float:
    """1 when the query named a month or a year and the memory became valid (UTC) in
    one of the named months (of a named year, when one is named), else 0."""
    if (not months and not years) or memory.valid_from is None:
        return 0.0
    when = memory.valid_from.astimezone(UTC)
    ok = (not months or when.month in months) and (not years or when.year in years)
    return 1.0 if ok else 0.0


def neighbour_relevance(items: Sequence[RecalledMemory], fused: Sequence[float]) -> list[float]:
    """Each candidate's neighbour signal: the higher fused relevance of the candidate
    before it and the candidate after it, 0 when neither is a candidate.

    A memory's ``context`` is the text before it (a conversation's previous
    turn): candidate B follows candidate A when B's context, hashed as content
    of B's scope (:func:`~harbor_pg.records.content_hash`), is A's content hash.
    """
    by_hash: dict[tuple[str, str], float] = {}
    after: dict[tuple[str, str], float] = {}
    keys: list[tuple[str, str] | None] = []
    for item, rel in zip(items, fused, strict=True):
        m = item.memory
        own = (m.tenant_id, m.content_hash or content_hash(m.scope, m.content))
        by_hash[own] = max(by_hash.get(own, rel), rel)
        if m.context is None:
            keys.append(None)
            continue
        before = (m.tenant_id, content_hash(m.scope, m.context))
        keys.append(before)
        after[before] = max(after.get(before, rel), rel)  # what follows `before`
    out = []
    for item, key in zip(items, keys, strict=True):
        m = item.memory
        own = (m.tenant_id, m.content_hash or content_hash(m.scope, m.content))
        prev = by_hash.get(key, 0.0) if key is not None else 0.0
        out.append(max(prev, after.get(own, 0.0)))
    return out


def rrf(ranks: Iterable[int | None], k: int) -> float:
    """Reciprocal rank fusion: ``sum(1 / (k + rank))`` over the lists a memory is in."""
    return sum(1.0 / (k + r) for r in ranks if r is not None)


def _unit(value: float | None, low: float, high: float) -> float:
    if value is None:
        return 0.0
    return 1.0 if high <= low else (value - low) / (high - low)


def fuse(
    legs: Sequence[tuple[int | None, float | None, int | None, float | None]],
    *,
    fusion: str = "rrf",
    rrf_k: int = 5,
    dense_weight: float = 0.75,
    lexical_weight: float = 1.0,
) -> list[float]:
    """The relevance of each candidate, as ``harbor.recall()`` fuses its two lists.

    ``legs`` holds, per candidate, ``(dense_rank, similarity, lexical_rank,
    lexical_score)`` (``None`` where the candidate is not in that list), for
    every candidate of both lists: the weighted fusion normalises each leg
    over all of its candidates.
    """
    if fusion == "rrf":
        return [
            (dense_weight / (rrf_k + d) if d is not None else 0.0)
            + (lexical_weight / (rrf_k + lr) if lr is not None else 0.0)
            for d, _s, lr, _l in legs
        ]
    if fusion != "weighted":
        raise ValueError(f"fusion must be 'rrf' or 'weighted', got {fusion!r}")
    sims = [s for d, s, _lr, _l in legs if d is not None and s is not None]
    scores = [x for _d, _s, lr, x in legs if lr is not None and x is not None]
    s_lo, s_hi = (min(sims), max(sims)) if sims else (0.0, 0.0)
    l_lo, l_hi = (min(scores), max(scores)) if scores else (0.0, 0.0)
    return [
        dense_weight * _unit(s if d is not None else None, s_lo, s_hi)
        + lexical_weight * _unit(x if lr is not None else None, l_lo, l_hi)
        for d, s, lr, x in legs
    ]


class Relevance(NamedTuple):
    """A candidate's relevance and its parts, as ``harbor.recall()``'s columns hold them."""

    #: ``(fused + neighbour_weight * neighbour) * (1 + date_weight * date_match)``
    relevance: float
    #: the fusion of the two lists alone (:func:`fuse`; flat for a substring match)
    fused: float
    #: :func:`neighbour_relevance` (0 when ``neighbour_weight`` is 0)
    neighbour: float
    #: :func:`date_match` for the query's months and years (0 when ``date_weight`` is 0)
    date_match: float


def fused_relevance(
    items: Sequence[RecalledMemory],
    *,
    fusion: str = "rrf",
    rrf_k: int = 5,
    dense_weight: float = 0.75,
    lexical_weight: float = 1.0,
    neighbour_weight: float = 0.75,
    date_weight: float = 2.0,
    query: str | None = None,
) -> list[Relevance]:
    """The relevance ``harbor.recall()`` gives each of ``items`` (every candidate of a
    recall, from their leg columns), with its parts: the fused relevance
    (:func:`fuse`, and for a substring-fallback match the flat relevance of a
    first-ranked match, ``1 / (rrf_k + 1)``, with ``fusion="weighted"`` 1), plus
    ``neighbour_weight`` times :func:`neighbour_relevance`, times ``1 + date_weight
    * date_match`` for the months and years ``query`` names (none without a
    query). A weight of 0 reports its signal as 0, as the SQL does."""
    fused = _fused(
        items, fusion=fusion, rrf_k=rrf_k, dense_weight=dense_weight, lexical_weight=lexical_weight
    )
    near = neighbour_relevance(items, fused) if neighbour_weight > 0 else [0.0] * len(items)
    months, years = query_dates(query) if query and date_weight > 0 else ((), ())
    out = []
    for i, f, n in zip(items, fused, near, strict=True):
        dated = date_match(i.memory, months, years)
        out.append(Relevance((f + neighbour_weight * n) * (1 + date_weight * dated), f, n, dated))
    return out


def _fused(
    items: Sequence[RecalledMemory],
    *,
    fusion: str,
    rrf_k: int,
    dense_weight: float,
    lexical_weight: float,
) -> list[float]:
    flat = 1.0 if fusion == "weighted" else 1.0 / (rrf_k + 1)
    fused = iter(
        fuse(
            [
                (i.dense_rank, i.similarity, i.lexical_rank, i.lexical_score)
                for i in items
                if not i.substring_match
            ],
            fusion=fusion,
            rrf_k=rrf_k,
            dense_weight=dense_weight,
            lexical_weight=lexical_weight,
        )
    )
    return [flat if i.substring_match else next(fused) for i in items]


def recency(memory: Memory, as_of: datetime, half_life_hours: float | None) -> float:
    """``0.5 ** (hours since the memory became valid / half-life)``; 0 without a half-life."""
    if half_life_hours is None:
        return 0.0
    since = memory.valid_from or memory.updated_at or memory.created_at
    if since is None:
        return 1.0
    hours = max((as_of - since).total_seconds(), 0.0) / 3600.0
    return float(0.5 ** (hours / half_life_hours))


def decayed_importance(
    memory: Memory,
    as_of: datetime,
    half_life_hours: float | None,
    last_recalled: datetime | None = None,
) -> float:
    """The importance recall scores with: the memory's importance times
    ``0.5 ** (hours since it was last recalled, or became valid, / half-life)``, at
    ``as_of``; the importance itself without a half-life. Never above the importance."""
    if half_life_hours is None:
        return memory.importance
    since = max(
        (t for t in (memory.valid_from, last_recalled) if t is not None),
        default=memory.updated_at or memory.created_at,
    )
    if since is None:
        return memory.importance
    hours = max((as_of - since).total_seconds(), 0.0) / 3600.0
    return float(memory.importance * 0.5 ** (hours / half_life_hours))


def entity_boost(memory: Memory, anchors: Collection[str], weight: float) -> float:
    """Share of the memory's own entity ids that are anchors, times ``weight`` (never < 0)."""
    if not anchors or not memory.entity_ids or weight <= 0:
        return 0.0
    overlap = len(set(memory.entity_ids) & set(anchors))
    return weight * overlap / max(1, len(memory.entity_ids))


def type_boost(memory: Memory, wanted: Collection[MemoryType], weight: float) -> float:
    """``weight`` when the memory's type was asked for, else 0."""
    return weight if memory.memory_type in wanted and weight > 0 else 0.0


def final_score(
    relevance: float, recency_: float, importance: float, entity: float, type_: float
) -> float:
    """``relevance * (1 + recency) * (1 + importance) * (1 + entity) * (1 + type)``."""
    return relevance * (1 + recency_) * (1 + importance) * (1 + entity) * (1 + type_)


def order_key(item: RecalledMemory) -> tuple[float, int, str]:
    """Ranking order: score descending, ties toward the narrower scope, then id."""
    return (-item.score, -item.memory.scope.narrowness, item.memory.id or "")


def dedupe(items: Iterable[RecalledMemory]) -> list[RecalledMemory]:
    """Keep the best-ranked instance of each content hash (else normalized content)."""
    seen: set[str] = set()
    out: list[RecalledMemory] = []
    for item in sorted(items, key=order_key):
        key = item.memory.content_hash or normalize_content(item.memory.content)
        if key in seen:
            continue
        seen.add(key)
        out.append(item)
    return out


def render_recalled(memory: Memory) -> str:
    """One line of the recalled-memory block: ``[<hash12>] <content, whitespace collapsed>``."""
    digest = (memory.content_hash or "")[:12]
    return f"[{digest}] {' '.join(memory.content.split())}"


def budget_prefix(
    items: Sequence[RecalledMemory],
    budget: int | None,
    counter: TokenCounter = approximate_tokens,
) -> list[RecalledMemory]:
    """The longest prefix of ``items`` whose rendered lines fit in ``budget`` tokens.

    Stops at the first memory that would overflow, so the block is always a
    prefix of the ranking (a later, shorter memory never jumps the queue).
    """
    out: list[RecalledMemory] = []
    used = 0
    for item in items:
        cost = counter(render_recalled(item.memory))
        if budget is not None and used + cost > budget:
            break
        used += cost
        out.append(replace(item, tokens=cost) if cost != item.tokens else item)
    return out


class SearchableStore(Protocol):
    """What :func:`search_and_rank` needs of a store: a lexical search per owner."""

    async def search(
        self, owner: MemoryOwner, query: str, *, limit: int = 10, as_of: datetime | None = None
    ) -> list[Memory]: ...


async def search_and_rank(
    store: SearchableStore, owner: MemoryOwner, request: RecallRequest
) -> list[RecalledMemory]:
    """Recall for any store: its own search per scope, flat relevance, the same
    scoring rules as ``harbor.recall()`` (the in-process store's recall; a store of
    your own can answer ``recall`` with it)."""
    as_of = request.as_of or datetime.now(UTC)
    # (a store that counts recall hits says when each memory was last recalled)
    last_recalled: Callable[[str], datetime | None] = getattr(
        store, "last_recalled", lambda _memory_id: None
    )
    # a first-ranked match's relevance, as harbor.recall() gives its substring matches
    flat = 1.0 if request.fusion == "weighted" else rrf([1], request.rrf_k)
    candidates: list[RecalledMemory] = []
    weights: dict[str, float] = {}  # each candidate's importance in the score
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
            if memory.memory_type in request.excluded_types:
                continue
            if memory.sensitivity.level > request.max_sensitivity.level:
                continue  # above the ceiling: never a candidate
            rec = recency(memory, as_of, request.recency_half_life_hours)
            ent = entity_boost(memory, request.anchor_entity_ids, request.entity_weight)
            typ = type_boost(memory, request.wanted_types, request.type_weight)
            weights[memory.id or ""] = decayed_importance(
                memory, as_of, request.importance_half_life_hours, last_recalled(memory.id or "")
            )
            candidates.append(
                RecalledMemory(
                    memory=memory,
                    rank=0,
                    relevance=flat,
                    recency=rec,
                    entity=ent,
                    type_boost=typ,
                    score=final_score(flat, rec, weights[memory.id or ""], ent, typ),
                    tokens=0,
                    substring_match=True,
                )
            )
    # the neighbour and date signals, as harbor.recall() adds them to relevance
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
            score=final_score(
                p.relevance, c.recency, weights[c.memory.id or ""], c.entity, c.type_boost
            ),
        )
        for c, p in zip(candidates, parts, strict=True)
    ]
    ranked = dedupe(candidates)[: request.top_k]
    return [replace(item, rank=i + 1) for i, item in enumerate(ranked)]
