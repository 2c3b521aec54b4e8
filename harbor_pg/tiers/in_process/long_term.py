"""Long-term tier in process: memories and their vectors in dicts (no database)."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from harbor_pg.consolidation import (
    ConsolidationReport,
    ConsolidationRequest,
    Merge,
    consolidation_groups,
    successor_of,
)
from harbor_pg.errors import MemoryScopeError, MemoryValidationError
from harbor_pg.owner import SCOPE_OWNER_FIELDS, MemoryOwner, MemoryScope
from harbor_pg.profile import ProfileRequest, UserProfile, profile_of
from harbor_pg.ranking import RecalledMemory, RecallRequest, search_and_rank
from harbor_pg.records import (
    Memory,
    MemoryType,
    Sensitivity,
    content_hash,
    normalize_content,
)
from harbor_pg.tiers.base import (
    ErasureSubject,
    FactResult,
    NearestMemory,
    SaveResult,
    summary_memory_id,
)
from harbor_pg.tiers.in_process._shared import erased, utc_now

__all__ = ["InMemoryLongTermStore"]


def _visible(memory: Memory, owner: MemoryOwner) -> bool:
    if memory.tenant_id not in ("", owner.tenant_id):
        return False
    for field in SCOPE_OWNER_FIELDS[memory.scope]:
        mine = getattr(owner, field) or ""
        if field == "project_id" and memory.scope.value == "project" and not mine:
            return False
        if getattr(memory, field) != mine:
            return False
    return True


_EXTRACTION_SCOPES = frozenset({MemoryScope.USER, MemoryScope.PROJECT, MemoryScope.SESSION})


#: the owner columns a row is keyed by (besides its scope)
_KEY_FIELDS = ("tenant_id", "project_id", "user_id", "session_id", "run_id")


def _keyed(memory: Memory, key: dict[str, str]) -> bool:
    """True when ``memory`` is stored under exactly the owner ``key``."""
    return all(getattr(memory, f) == v for f, v in key.items())


def _check_embedding(embedding: Sequence[float] | None, model_id: str | None) -> list[float] | None:
    """The same checks PostgresLongTermStore applies to a vector."""
    if embedding is None:
        return None
    values = [float(x) for x in embedding]
    if not values:
        raise MemoryValidationError("embedding is empty")
    if not all(math.isfinite(x) for x in values):
        raise MemoryValidationError("embedding contains NaN or infinity")
    if not model_id:
        raise MemoryValidationError("an embedding needs the model_id that produced it")
    return values


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return math.fsum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0


def _summary_rule(owner: MemoryOwner, memory: Memory) -> str | None:
    """The id ``memory`` is stored under, by the database's rule (``memories_summary_id``):
    a SESSION summary gets its owner's summary id, and no other memory a ``summary:`` id."""
    if memory.scope is MemoryScope.SESSION and memory.memory_type is MemoryType.SUMMARY:
        return summary_memory_id(owner)
    if memory.id is not None and memory.id.startswith("summary:"):
        raise MemoryValidationError(
            'ids starting with "summary:" belong to rolling session summaries, whose ids '
            "are derived from their owner"
        )
    return memory.id


# Its methods repeat the signatures of tiers/base.py's protocols on purpose, as the other
# implementation does: each store implements them.
def _closable(row: Memory, scope: MemoryScope, key: dict[str, str], now: datetime) -> bool:
    """Whether ``row`` may be closed now (superseded, or closed with no successor): a
    current, not yet superseded, non-summary memory of ``scope`` under ``key``, valid
    from before ``now`` (as the SQL of both writes tests it)."""
    return (
        row.scope is scope
        and _keyed(row, key)
        and row.memory_type is not MemoryType.SUMMARY
        and row.superseded_by is None
        and row.invalid_at is None
        and row.valid_from is not None
        and row.valid_from < now
    )


class InMemoryLongTermStore:
    """Memories in a list; same visibility, dedup and validity rules as PostgreSQL."""

    def __init__(self) -> None:
        self._rows: dict[str, Memory] = {}
        self._lock = asyncio.Lock()
        # memory id -> (model_id, vector); entries of deleted rows are dropped lazily
        self._vectors: dict[str, tuple[str, list[float]]] = {}
        # memory id -> (tenant, user) of the conversation a memory names as its source (the
        # memories_provenance trigger's columns): session ids repeat across users
        self._sources: dict[str, tuple[str, str]] = {}
        # memory id -> (recall hits, when last recalled) (harbor.memory_hits)
        self._hits: dict[str, tuple[int, datetime]] = {}

    def _note_source(self, owner: MemoryOwner, memory: Memory) -> None:
        if memory.id and (memory.source_session_id is not None or memory.source_message_ids):
            self._sources[memory.id] = (owner.tenant_id, owner.user_id or "")

    def _current_duplicate(
        self,
        scope: MemoryScope,
        key: dict[str, str],
        digest: str,
        now: datetime,
        *,
        ignore: frozenset[str] | set[str] = frozenset(),
    ) -> Memory | None:
        """The row valid at ``now`` with this content hash under exactly this owner key
        (other than the ids in ``ignore``)."""
        for row in self._rows.values():
            if (
                row.content_hash == digest
                and row.scope is scope
                and _keyed(row, key)
                and row.is_valid_at(now)
                and (row.id or "") not in ignore
            ):
                return row
        return None

    # _keep's parameters are save()'s by shape, on purpose: it holds what save checked.
    def _keep(
        self,
        owner: MemoryOwner,
        stored: Memory,
        vector: list[float] | None = None,
        model_id: str | None = None,
    ) -> None:
        """Hold a new row (and its vector, by model); the caller holds the lock."""
        self._rows[stored.id or ""] = stored
        self._note_source(owner, stored)
        if vector is not None and model_id:
            self._vectors[stored.id or ""] = (model_id, vector)

    async def save(
        self,
        owner: MemoryOwner,
        memory: Memory,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
    ) -> SaveResult:
        """Store ``memory`` for the owner, or return the valid copy with the same
        content already there (``created`` False); the vector is kept by model."""
        key = owner.key(memory.scope)
        digest = memory.content_hash or content_hash(memory.scope, memory.content)
        vector = _check_embedding(embedding, model_id)
        memory_id = _summary_rule(owner, memory)
        now = utc_now()
        async with self._lock:
            found = self._current_duplicate(memory.scope, key, digest, now)
            if found is not None:
                return SaveResult(memory=found, created=False)
            # a duplicate past its expiry but not closed yet: closed first, as in SQL
            self._close_expired(
                now,
                lambda row: (
                    row.content_hash == digest and row.scope is memory.scope and _keyed(row, key)
                ),
            )
            stored = memory.model_copy(
                update={
                    **key,
                    "id": memory_id or str(uuid.uuid4()),
                    "principal_id": owner.principal_id or "",
                    "content_hash": digest,
                    "valid_from": memory.valid_from or now,
                    "created_at": now,
                    "updated_at": now,
                }
            )
            self._keep(owner, stored, vector, model_id)
            return SaveResult(memory=stored, created=True)

    def _close_expired(self, now: datetime, which: Callable[[Memory], bool]) -> int:
        """Close the open intervals of the rows past their expiry that ``which`` picks, at
        the expiry (``harbor.expire_memories()``); the caller holds the lock or needs none."""
        closed = 0
        for memory_id, row in list(self._rows.items()):
            if (
                row.expires_at is not None
                and row.expires_at <= now
                and row.invalid_at is None
                and which(row)
            ):
                start = row.valid_from or row.expires_at
                end = max(row.expires_at, start)
                self._rows[memory_id] = row.model_copy(
                    update={"invalid_at": end, "updated_at": now}
                )
                closed += 1
        return closed

    def expire_memories_of(self, tenant_id: str) -> int:
        """Close the tenant's memories past their expiry (as ``harbor.expire_memories()``):
        their intervals end at the expiry, nothing is deleted. Returns how many."""
        return self._close_expired(utc_now(), lambda row: row.tenant_id == tenant_id)

    async def expire_every_tenant(self) -> int:
        """Close every tenant's memories past their expiry (the periodic upkeep)."""
        async with self._lock:
            return self._close_expired(utc_now(), lambda row: True)

    async def expire_memories(self, owner: MemoryOwner) -> int:
        """Close the memories past their expiry that ``owner`` may write (its own owner
        keys), as ``harbor.expire_memories()`` does for the application role."""
        keys = {s: owner.key(s) for s in MemoryScope if owner.can_address(s)}
        async with self._lock:
            return self._close_expired(
                utc_now(),
                lambda row: (
                    row.scope in keys
                    and row.scope not in (MemoryScope.TENANT, MemoryScope.GLOBAL)
                    and _keyed(row, keys[row.scope])
                ),
            )

    async def get(self, owner: MemoryOwner, memory_id: str) -> Memory | None:
        """The memory ``memory_id`` if the owner may see it, else None."""
        row = self._rows.get(memory_id)
        return row if row is not None and _visible(row, owner) else None

    async def recall(self, owner: MemoryOwner, request: RecallRequest) -> list[RecalledMemory]:
        """The memories ``request`` recalls: :meth:`search` per scope, ranked by the
        rules ``harbor.recall()`` applies (:func:`~harbor_pg.ranking.search_and_rank`);
        with importance decay on, their hits are counted after they are ranked."""
        found = await search_and_rank(self, owner, request)
        if request.importance_half_life_hours is not None:
            await self.record_hits(owner, [r.memory.id or "" for r in found])
        return found

    async def record_hits(self, owner: MemoryOwner, memory_ids: Sequence[str]) -> int:
        """Count one recall hit for each memory of ``memory_ids`` the owner may see
        (``harbor.record_hits()``); returns how many."""
        now = utc_now()
        counted = 0
        async with self._lock:
            for memory_id in dict.fromkeys(memory_ids):
                row = self._rows.get(memory_id)
                if row is None or not _visible(row, owner):
                    continue
                hits, last = self._hits.get(memory_id, (0, now))
                self._hits[memory_id] = (hits + 1, max(last, now))
                counted += 1
        return counted

    def last_recalled(self, memory_id: str) -> datetime | None:
        """When recall last returned the memory (None: never); decay reads it."""
        found = self._hits.get(memory_id)
        return found[1] if found else None

    def recall_hits(self, memory_id: str) -> int:
        """How many times recall returned the memory."""
        found = self._hits.get(memory_id)
        return found[0] if found else 0

    async def search(
        self, owner: MemoryOwner, query: str, *, limit: int = 10, as_of: datetime | None = None
    ) -> list[Memory]:
        """Memories the owner may see, valid at ``as_of`` (default now), never
        summaries, that share a word with ``query`` or contain it: the most shared
        words first (importance breaks ties), at most ``limit``."""
        if not query.strip():
            return []
        when = as_of or utc_now()
        terms = set(normalize_content(query).split())
        needle = normalize_content(query)
        scored: list[tuple[float, Memory]] = []
        for row in self._rows.values():
            if not _visible(row, owner) or not row.is_valid_at(when):
                continue
            if row.memory_type is MemoryType.SUMMARY:
                continue
            words = set(normalize_content(row.content).split())
            overlap = len(terms & words)
            if overlap or needle in normalize_content(row.content):
                scored.append((overlap + row.importance / 10, row))
        scored.sort(key=lambda p: -p[0])
        return [m for _s, m in scored[:limit]]

    async def consolidate(
        self, owner: MemoryOwner, request: ConsolidationRequest
    ) -> ConsolidationReport:
        """Merge the owner's near-duplicates by the rules of ``harbor.consolidate_memories()``
        (ConsolidatingStore)."""
        keys = {s: owner.key(s) for s in request.scopes if owner.can_address(s)}
        merges: list[Merge] = []
        async with self._lock:
            now = utc_now()
            candidates = [
                row
                for row in self._rows.values()
                if row.scope in keys
                and _keyed(row, keys[row.scope])
                and row.memory_type is not MemoryType.SUMMARY
                # (the caller's own writes: a successor is stored as its writer's)
                and row.principal_id == (owner.principal_id or "")
                and row.superseded_by is None
                and row.invalid_at is None
                and row.expires_at is None
                and row.valid_from is not None
                and row.valid_from < now
            ]
            vectors = {
                memory_id: vector
                for memory_id, (model, vector) in self._vectors.items()
                if request.min_similarity is not None and model == request.model_id
            }
            groups = consolidation_groups(
                candidates, vectors, request.min_similarity, since=request.since
            )
            for head, members, why in groups[: request.max_merges]:
                group = [self._rows[i] for i in (head, *members)]
                if request.dry_run:
                    merges.append(Merge(None, (head, *members), why, group[0].content))
                    continue
                text = (request.merged or {}).get(head)
                if text is not None and self._current_duplicate(
                    group[0].scope,
                    {f: getattr(group[0], f) for f in _KEY_FIELDS},
                    text.content_hash,
                    now,
                    ignore={m.id or "" for m in group},
                ):
                    text = None  # already a current memory beside the group: the head stands
                stored = successor_of(group, at=now, text=text).model_copy(
                    update={"id": str(uuid.uuid4())}
                )
                new_id = stored.id or ""
                for old in group:
                    self._rows[old.id or ""] = old.model_copy(
                        update={"invalid_at": now, "superseded_by": new_id, "updated_at": now}
                    )
                self._rows[new_id] = stored.model_copy(
                    update={"created_at": now, "updated_at": now}
                )
                if head in self._sources:
                    self._sources[new_id] = self._sources[head]
                if text is None and head in self._vectors:
                    self._vectors[new_id] = self._vectors[head]
                elif text is not None and text.embedding is not None and request.model_id:
                    self._vectors[new_id] = (request.model_id, list(text.embedding))
                merges.append(
                    Merge(
                        successor_id=new_id,
                        merged_ids=tuple(m.id or "" for m in group),
                        matched_by=why,
                        content=stored.content,
                        written=text is not None,
                    )
                )
        return ConsolidationReport(merges=tuple(merges))

    async def profile(self, owner: MemoryOwner, request: ProfileRequest) -> UserProfile:
        """The owner's profile by the rules of ``harbor.profile()`` (ProfileStore)."""
        keys = {s: owner.key(s) for s in request.scopes if owner.can_address(s)}
        rows = [
            row for row in self._rows.values() if row.scope in keys and _keyed(row, keys[row.scope])
        ]
        return profile_of(rows, request, as_of=request.as_of or utc_now(), hits=self.recall_hits)

    # -- extraction (ExtractionStore) ------------------------------------------------

    async def current_memories(
        self, owner: MemoryOwner, scopes: Sequence[MemoryScope], *, limit: int
    ) -> list[Memory]:
        """The owner's currently valid memories in ``scopes``, newest first (ExtractionStore)."""
        keys = {
            scope: owner.key(scope)
            for scope in {MemoryScope(s) for s in scopes}
            if scope in _EXTRACTION_SCOPES and owner.can_address(scope)
        }
        if limit <= 0 or not keys:
            return []
        now = utc_now()
        rows = sorted(
            (
                row
                for row in self._rows.values()
                if row.scope in keys
                and _keyed(row, keys[row.scope])
                and row.memory_type is not MemoryType.SUMMARY
                and row.invalid_at is None
                and row.is_valid_at(now)
            ),
            key=lambda row: row.id or "",
        )
        rows.sort(key=lambda row: row.valid_from or now, reverse=True)
        return rows[:limit]

    async def nearest_in_scope(
        self,
        owner: MemoryOwner,
        scope: MemoryScope,
        embedding: Sequence[float],
        model_id: str,
        *,
        exclude_ids: Sequence[str] = (),
    ) -> NearestMemory | None:
        """The owner's most similar currently valid memory of ``scope`` (ExtractionStore)."""
        scope = MemoryScope(scope)
        key = owner.key(scope)
        vector = _check_embedding(embedding, model_id) or []
        excluded = set(exclude_ids)
        now = utc_now()
        best: NearestMemory | None = None
        for memory_id, (vector_model, stored) in list(self._vectors.items()):
            row = self._rows.get(memory_id)
            if row is None:
                del self._vectors[memory_id]
                continue
            if (
                vector_model != model_id
                or len(stored) != len(vector)
                or memory_id in excluded
                or row.scope is not scope
                or not _keyed(row, key)
                or row.memory_type is MemoryType.SUMMARY
                or not row.is_valid_at(now)
            ):
                continue
            similarity = _cosine(stored, vector)
            if (
                best is None
                or similarity > best.similarity
                or (similarity == best.similarity and memory_id < best.memory_id)
            ):
                best = NearestMemory(memory_id, similarity)
        return best

    async def supersede(
        self,
        owner: MemoryOwner,
        memory_id: str,
        memory: Memory,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
    ) -> SaveResult | None:
        """Store ``memory`` as the successor of ``memory_id`` atomically (ExtractionStore)."""
        if memory.scope in (MemoryScope.TENANT, MemoryScope.GLOBAL):
            raise MemoryScopeError("supersede writes only the caller's own scopes")
        key = owner.key(memory.scope)
        digest = memory.content_hash or content_hash(memory.scope, memory.content)
        vector = _check_embedding(embedding, model_id)
        now = utc_now()
        async with self._lock:
            old = self._rows.get(memory_id)
            if old is None or not _closable(old, memory.scope, key, now):
                return None
            found = self._current_duplicate(memory.scope, key, digest, now)
            if found is not None:
                return SaveResult(memory=found, created=False)
            stored = memory.model_copy(
                update={
                    **key,
                    "id": memory.id or str(uuid.uuid4()),
                    "principal_id": owner.principal_id or "",
                    "content_hash": digest,
                    "valid_from": now,
                    "invalid_at": None,
                    "superseded_by": None,
                    "created_at": now,
                    "updated_at": now,
                }
            )
            new_id = stored.id or ""
            self._keep(owner, stored, vector, model_id)
            self._rows[memory_id] = old.model_copy(
                update={"invalid_at": now, "superseded_by": new_id, "updated_at": now}
            )
            return SaveResult(memory=stored, created=True)

    async def close_memory(self, owner: MemoryOwner, memory_id: str, scope: MemoryScope) -> bool:
        """End a current memory's validity now, with no successor (ObservationStore)."""
        if scope in (MemoryScope.TENANT, MemoryScope.GLOBAL):
            raise MemoryScopeError("close_memory closes only the caller's own scopes")
        key = owner.key(scope)
        now = utc_now()
        async with self._lock:
            old = self._rows.get(memory_id)
            if old is None or not _closable(old, scope, key, now):
                return False
            self._rows[memory_id] = old.model_copy(update={"invalid_at": now, "updated_at": now})
            return True

    async def add_fact(
        self,
        owner: MemoryOwner,
        memory: Memory,
        *,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
        dedup_threshold: float | None = None,
        replaces: str | None = None,
    ) -> FactResult:
        """Similarity gate, then supersede or save (ExtractionStore)."""
        if memory.scope in (MemoryScope.TENANT, MemoryScope.GLOBAL):
            raise MemoryScopeError("extraction writes only the caller's own scopes")
        if embedding is not None and model_id and dedup_threshold is not None:
            nearest = await self.nearest_in_scope(
                owner,
                memory.scope,
                embedding,
                model_id,
                exclude_ids=[replaces] if replaces else [],
            )
            if nearest is not None and nearest.similarity >= dedup_threshold:
                return FactResult(memory=None, created=False, restatement_of=nearest)
        if replaces is not None:
            result = await self.supersede(owner, replaces, memory, embedding, model_id)
            if result is not None:
                return FactResult(
                    memory=result.memory,
                    created=result.created,
                    superseded=replaces if result.created else None,
                )
        saved = await self.save(owner, memory, embedding, model_id)
        return FactResult(memory=saved.memory, created=saved.created)

    async def delete(self, owner: MemoryOwner, memory_id: str) -> bool:
        """Delete one of the owner's memories (never a TENANT or GLOBAL one); True if it went."""
        row = self._rows.get(memory_id)
        if row is None or not _visible(row, owner) or row.scope.value in ("tenant", "global"):
            return False
        del self._rows[memory_id]
        self._hits.pop(memory_id, None)
        return True

    async def load_summary(self, owner: MemoryOwner) -> Memory | None:
        """The newest valid SESSION/SUMMARY memory of ``owner``'s session (see SummaryStore)."""
        key = owner.key(MemoryScope.SESSION)
        now = utc_now()
        found = [
            row
            for row in self._rows.values()
            if row.scope is MemoryScope.SESSION
            and row.memory_type is MemoryType.SUMMARY
            and _keyed(row, key)
            and row.is_valid_at(now)
        ]
        if not found:
            return None
        return max(found, key=lambda m: (m.updated_at or now, m.id or ""))

    async def save_summary(
        self, owner: MemoryOwner, memory: Memory, *, expected_frontier: int | None
    ) -> Memory | None:
        """Insert or refresh the session summary, compare-and-set on the frontier."""
        if memory.id is None:
            raise MemoryValidationError("a session summary needs its deterministic id")
        if memory.memory_type is not MemoryType.SUMMARY or memory.scope is not MemoryScope.SESSION:
            raise MemoryValidationError(
                "a session summary must have scope SESSION and type SUMMARY"
            )
        key = owner.key(MemoryScope.SESSION)
        expected = "" if expected_frontier is None else str(expected_frontier)
        now = utc_now()
        changes = {
            "content": memory.content,
            "content_hash": content_hash(MemoryScope.SESSION, memory.content),
            "source_message_ids": list(memory.source_message_ids),
            "metadata": dict(memory.metadata),
            "updated_at": now,
        }
        # the id of the owner's summary, whatever the caller passed (as the database does)
        memory_id = summary_memory_id(owner)
        async with self._lock:
            row = self._rows.get(memory_id)
            if (
                row is not None
                and row.scope is MemoryScope.SESSION
                and row.memory_type is MemoryType.SUMMARY
                and _keyed(row, key)
                and row.is_valid_at(now)
                and str(row.metadata.get("last_covered_message_id", "")) == expected
            ):
                # ownership (principal, project, created_at, provenance) stays as first saved
                refreshed = row.model_copy(update=changes)
                self._rows[memory_id] = refreshed
                return refreshed
            if expected_frontier is not None or row is not None:
                return None  # another writer refreshed (or created) it first
            stored = memory.model_copy(
                update={
                    **key,
                    **changes,
                    "id": memory_id,
                    "principal_id": owner.principal_id or "",
                    "source": "summary",
                    "source_session_id": owner.session_id,
                    "entity_ids": [],
                    "valid_from": now,
                    "invalid_at": None,
                    "superseded_by": None,
                    "created_at": now,
                }
            )
            self._keep(owner, stored)
            return stored

    def apply_retention(
        self,
        tenant_id: str,
        max_age_seconds: float,
        *,
        scope: MemoryScope | None = None,
        min_sensitivity: Sensitivity | None = None,
        include_summaries: bool = False,
    ) -> int:
        """Delete the tenant's memories older than ``max_age_seconds`` (as in SQL)."""
        cutoff = utc_now() - timedelta(seconds=max_age_seconds)
        dead = {
            k
            for k, m in self._rows.items()
            if m.tenant_id == tenant_id
            and m.created_at is not None
            and m.created_at < cutoff
            and (scope is None or m.scope is scope)
            and (min_sensitivity is None or m.sensitivity.level >= min_sensitivity.level)
            and (include_summaries or m.memory_type is not MemoryType.SUMMARY)
        }
        self._drop(dead)
        return len(dead)

    def _drop(self, dead: set[str]) -> int:
        """Delete rows and their vectors; successors lose their link (ON DELETE SET NULL).
        Returns how many vectors went."""
        vectors = 0
        for k in dead:
            del self._rows[k]
            self._sources.pop(k, None)
            self._hits.pop(k, None)
            if self._vectors.pop(k, None) is not None:
                vectors += 1
        for k, m in list(self._rows.items()):
            if m.superseded_by in dead:
                self._rows[k] = m.model_copy(update={"superseded_by": None})
        return vectors

    async def erase(
        self, subject: ErasureSubject, *, turn_ids: Sequence[int] = ()
    ) -> tuple[int, int]:
        """Delete the memories of a user, a session or an agent (``harbor.erase``'s rules).

        A memory derived from one of ``turn_ids`` (the erased turns) goes too.
        Returns (memories, embeddings) deleted.
        """
        tenant_id, user_id = subject.tenant_id, subject.user_id
        session_id, principal_id = subject.session_id, subject.principal_id
        derived = {str(i) for i in turn_ids}

        def doomed(k: str, m: Memory) -> bool:
            source = self._sources.get(k)
            if m.tenant_id == tenant_id:
                # keyed to the subject or written by it; a memory's own session, or the
                # session it came from when that was the subject's (the source's user decides)
                sessions: tuple[str | None, ...] = (m.session_id or "",)
                if user_id is None or (source is not None and source[1] == user_id):
                    sessions += (m.source_session_id,)
                if erased(
                    m.user_id or "",
                    m.principal_id or "",
                    sessions,
                    user_id,
                    session_id,
                    principal_id,
                ):
                    return True
            if m.tenant_id not in ("", tenant_id):
                return False
            if source is not None and source[0] == tenant_id:
                # derived from the subject's conversations, in any scope (GLOBAL too)
                if (
                    user_id is not None
                    and source[1] == user_id
                    and m.source_session_id is not None
                    and (session_id is None or m.source_session_id == session_id)
                    and (principal_id is None or m.principal_id == principal_id)
                ):
                    return True
            elif m.tenant_id != tenant_id:
                return False
            # derived from an erased turn
            return not derived.isdisjoint(m.source_message_ids)

        dead = {k for k, m in self._rows.items() if doomed(k, m)}
        vectors = self._drop(dead)
        return len(dead), vectors
