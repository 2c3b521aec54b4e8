"""Consolidation: near-duplicate memories merged into one successor, add-only.

PostgreSQL merges with ``harbor.consolidate_memories()``
(``sql/functions/consolidate.sql``); :func:`consolidation_groups` is the same grouping
for stores that are not PostgreSQL (the in-process store, or one of your own), and the
reference the SQL is tested against:

- candidates: an owner key's current memories (never summaries), ranked per owner key
  and writer (``principal_id``): most important first, then the newest, then the id;
- two candidates of one owner key and writer match when their texts are the same
  once lower-cased with every run of characters other than letters and digits made
  one space (:func:`loose_text`), or when their content vectors are at least
  ``min_similarity`` similar (cosine);
- a candidate that matches no better-ranked one heads a group; every other candidate
  joins the best-ranked head it matches (one matching only members waits for a later
  run), so a group never chains resemblances.

A merge closes every member's validity at the moment of the merge and stores one
successor: the head's text, context, type and writer, the group's highest importance
and sensitivity, the union of its entities and source turns, and
``metadata["consolidated_from"]``, the ids merged (head first). Each member's
``superseded_by`` is the successor; nothing is deleted.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from harbor_pg.errors import MemoryValidationError
from harbor_pg.owner import MemoryScope
from harbor_pg.records import Memory, MemoryType

__all__ = [
    "MERGE_SYSTEM_PROMPT",
    "ConsolidationReport",
    "ConsolidationRequest",
    "Merge",
    "MergedText",
    "consolidation_groups",
    "loose_text",
    "merge_prompt",
]

#: what a language model is told when it writes a group's merged text
MERGE_SYSTEM_PROMPT = (
    "You merge statements that say the same thing into one statement. Keep every detail "
    "the statements give, add nothing, and answer with the one statement only, as plain "
    "text on one line."
)


def merge_prompt(contents: Sequence[str]) -> str:
    """The user message that asks for one group's merged text."""
    lines = "\n".join(f"{i}. {' '.join(text.split())}" for i, text in enumerate(contents, 1))
    return f"Statements:\n{lines}\n\nThe one statement:"


@dataclass(frozen=True)
class MergedText:
    """A text written for a group (its successor's content), its dedup key, its vector."""

    content: str
    content_hash: str
    embedding: Sequence[float] | None = None


#: scopes consolidation reads and writes: the caller's own
_SCOPES = frozenset({MemoryScope.USER, MemoryScope.PROJECT, MemoryScope.SESSION, MemoryScope.RUN})
_NOT_ALNUM = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class ConsolidationRequest:
    """What one consolidation merges besides the owner.

    ``scopes``: among USER (the default), PROJECT, SESSION and RUN.
    ``min_similarity``: cosine similarity, in (0, 1], at which two content vectors of
    ``model_id`` are near-duplicates (None: texts only).
    ``max_merges``: the most groups merged in one call (the best-ranked heads first).
    ``dry_run``: report the groups a merge would make and write nothing.
    ``since``: compare vectors only in pairs of which one memory was stored at or after
    it (a periodic run passes the start of the last; texts are compared all with all).
    """

    scopes: tuple[MemoryScope, ...] = (MemoryScope.USER,)
    min_similarity: float | None = None
    model_id: str | None = None
    max_merges: int = 1000
    dry_run: bool = False
    since: datetime | None = None
    #: texts written for groups, by head id (see :class:`MergedText`)
    merged: Mapping[str, MergedText] | None = None

    def __post_init__(self) -> None:
        scopes = tuple(MemoryScope(s) for s in self.scopes)
        if not scopes:
            raise MemoryValidationError("consolidation needs at least one scope")
        if wrong := [s.value for s in scopes if s not in _SCOPES]:
            raise MemoryValidationError(
                "consolidation merges the caller's own scopes (user, project, session, run), "
                f"not {', '.join(wrong)}"
            )
        object.__setattr__(self, "scopes", scopes)
        if self.min_similarity is not None:
            if isinstance(self.min_similarity, bool) or not (
                isinstance(self.min_similarity, int | float) and 0 < self.min_similarity <= 1
            ):
                raise MemoryValidationError(
                    f"min_similarity must be in (0, 1] or None, got {self.min_similarity!r}"
                )
            if not self.model_id:
                raise MemoryValidationError("min_similarity needs the model_id of the vectors")
        if self.since is not None and self.since.tzinfo is None:
            raise MemoryValidationError("since must be timezone-aware")
        if (
            isinstance(self.max_merges, bool)
            or not isinstance(self.max_merges, int)
            or self.max_merges < 0
        ):
            raise MemoryValidationError(
                f"max_merges must be an integer >= 0, got {self.max_merges!r}"
            )


@dataclass(frozen=True)
class Merge:
    """One merge: the successor stored (None in a dry run), the memories it superseded
    (the head first), how they matched (``text``, ``vector`` or ``text,vector``) and the
    text kept."""

    successor_id: str | None
    merged_ids: tuple[str, ...]
    matched_by: str
    content: str
    #: True when the successor's text was written for it (a model's), not the head's
    written: bool = False


@dataclass(frozen=True)
class ConsolidationReport:
    """What one consolidation merged."""

    merges: tuple[Merge, ...] = field(default_factory=tuple)

    @property
    def superseded(self) -> int:
        """How many memories were closed (each now superseded by a successor)."""
        return sum(len(m.merged_ids) for m in self.merges)


def loose_text(content: str) -> str:
    """The text two memories must share to match by text: lower case, every run of
    characters other than letters and digits made one space, trimmed."""
    return _NOT_ALNUM.sub(" ", content.lower()).strip()


def _rank_key(memory: Memory) -> tuple[float, float, str]:
    start = memory.valid_from.timestamp() if memory.valid_from else -math.inf
    return (-memory.importance, -start, memory.id or "")


def _owner_key(memory: Memory) -> tuple[str, ...]:
    return (
        memory.scope.value,
        memory.project_id,
        memory.user_id,
        memory.session_id,
        memory.run_id,
        memory.principal_id,
    )


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def consolidation_groups(
    candidates: Sequence[Memory],
    vectors: Mapping[str, Sequence[float]],
    min_similarity: float | None,
    *,
    since: datetime | None = None,
) -> list[tuple[str, tuple[str, ...], str]]:
    """The groups ``harbor.consolidate_memories()`` would merge among ``candidates``
    (current memories with ids), best-ranked head first: (head id, member ids in id
    order, how they matched). ``vectors`` maps a memory id to its content vector; with
    ``since``, vectors are compared only in pairs of which one memory was created at or
    after it."""

    def new(memory: Memory) -> bool:
        return since is None or (memory.created_at is not None and memory.created_at >= since)

    by_key: dict[tuple[str, ...], list[Memory]] = defaultdict(list)
    for memory in candidates:
        if memory.memory_type is not MemoryType.SUMMARY and memory.id:
            by_key[_owner_key(memory)].append(memory)
    rank: dict[str, int] = {}
    pairs: dict[tuple[str, str], set[str]] = defaultdict(set)  # (better, worse) -> why
    for rows in by_key.values():
        rows.sort(key=_rank_key)
        for i, memory in enumerate(rows, start=1):
            rank[memory.id or ""] = i
        loose = [loose_text(m.content) for m in rows]
        for i, a in enumerate(rows):
            for j in range(i + 1, len(rows)):
                b = rows[j]
                if loose[i] and loose[i] == loose[j]:
                    pairs[(a.id or "", b.id or "")].add("text")
                va, vb = vectors.get(a.id or ""), vectors.get(b.id or "")
                if (
                    min_similarity is not None
                    and (new(a) or new(b))
                    and va is not None
                    and vb is not None
                    and len(va) == len(vb)
                    and _cosine(va, vb) >= min_similarity
                ):
                    pairs[(a.id or "", b.id or "")].add("vector")
    worse = {w for _b, w in pairs}
    heads: dict[str, list[tuple[str, set[str]]]] = defaultdict(list)
    best: dict[str, tuple[int, str]] = {}
    for better_id, worse_id in pairs:
        if better_id in worse:
            continue  # a member of a better head: no head
        if worse_id not in best or (rank[better_id], better_id) < best[worse_id]:
            best[worse_id] = (rank[better_id], better_id)
    for worse_id, (_r, head_id) in best.items():
        heads[head_id].append((worse_id, pairs[(head_id, worse_id)]))
    groups = []
    for head, members in heads.items():
        why = sorted(set().union(*(m[1] for m in members)))
        groups.append((head, tuple(sorted(m[0] for m in members)), ",".join(why)))
    groups.sort(key=lambda g: (rank[g[0]], g[0]))
    return groups


def successor_of(
    group: Sequence[Memory], *, at: datetime | None = None, text: MergedText | None = None
) -> Memory:
    """The memory that supersedes ``group`` (its head first), valid from ``at``: the head's
    text, or ``text`` (then without a context)."""
    head = group[0]
    ids = [m.id or "" for m in group]
    written: dict[str, object] = {}
    if text is not None:
        written = {
            "content": text.content,
            "content_hash": text.content_hash,
            "context": None,
        }
    entities = sorted({e for m in group for e in m.entity_ids})
    sources = sorted({s for m in group for s in m.source_message_ids})
    sensitivity = max((m.sensitivity for m in group), key=lambda s: s.level)
    return head.model_copy(
        update={
            "id": None,
            "importance": max(m.importance for m in group),
            "entity_ids": entities,
            "source_message_ids": sources,
            "sensitivity": sensitivity,
            "metadata": {
                **head.metadata,
                "consolidated_from": ids,
                **({"written_by_model": True} if text is not None else {}),
            },
            **written,
            "valid_from": at or datetime.now(UTC),
            "invalid_at": None,
            "superseded_by": None,
            "created_at": None,
            "updated_at": None,
        }
    )
