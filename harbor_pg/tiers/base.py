"""The store seam: small protocols any backend implements.

The PostgreSQL stores and the in-process stores both satisfy these, and
``harbor_pg.testing.conformance`` proves a store of your own behaves the same.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol, runtime_checkable

from harbor_pg.consolidation import ConsolidationReport, ConsolidationRequest
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.profile import ProfileRequest, UserProfile
from harbor_pg.ranking import RecalledMemory, RecallRequest
from harbor_pg.records import ConversationMessage, Memory

__all__ = [
    "BlockingShortTermStore",
    "ConsolidatingStore",
    "ErasableLongTermStore",
    "ErasableShortTermStore",
    "ErasableWorkingStore",
    "EraseReceipt",
    "ErasureSubject",
    "ExtractionStore",
    "FactResult",
    "LongTermStore",
    "NearestMemory",
    "ObservationStore",
    "ProfileStore",
    "RetentionReceipt",
    "SaveResult",
    "ShortTermStore",
    "SummaryLease",
    "SummaryLeaseStore",
    "SummaryStore",
    "WorkingStore",
    "summary_memory_id",
]


def summary_memory_id(owner: MemoryOwner) -> str:
    """The id of ``owner``'s rolling session summary: ``summary:`` and 32 hex digits.

    The digits are the start of the sha256 of the owner's SESSION key (tenant,
    project, user, session and run, each length-prefixed), so the id names no
    session and two users' sessions of the same name get different ids. The
    PostgreSQL store does not take the caller's word for it: the database gives
    every summary row the id of its own owner fields (``harbor.summary_id`` in
    sql/functions/guards.sql computes the same value) and refuses the prefix on
    any other row, so no one can hold another owner's summary id.

    Raises:
        TypeError: ``owner`` is not a :class:`MemoryOwner` (the id was once
            derived from the session id alone).
        MemoryScopeError: ``owner`` has no user or no session.
    """
    if not isinstance(owner, MemoryOwner):
        raise TypeError(
            "summary_memory_id takes the session's MemoryOwner (the id is derived from the "
            f"whole owner key), not {type(owner).__name__}"
        )
    key = owner.key(MemoryScope.SESSION)
    fields = (
        key["tenant_id"],
        key["project_id"],
        key["user_id"],
        key["session_id"],
        key["run_id"],
    )
    encoded = ";".join(f"{len(v)}:{v}" for v in fields)
    return "summary:" + hashlib.sha256(encoded.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class SaveResult:
    """Outcome of a save: the stored memory, and whether this call created it."""

    memory: Memory
    created: bool


@dataclass(frozen=True)
class EraseReceipt:
    """What an erasure deleted, per tier (no content, only counts)."""

    short_term: int
    working: int
    long_term: int
    embeddings: int
    #: database roles bound to the erased user (harbor.role_bindings)
    role_bindings: int = 0

    @property
    def total(self) -> int:
        """Rows deleted in all tiers."""
        return (
            self.short_term + self.working + self.long_term + self.embeddings + self.role_bindings
        )


@dataclass(frozen=True)
class ErasureSubject:
    """Whose rows an erasure deletes, in one tenant: a user (all their sessions, or
    ``session_id`` only) and/or an agent (``principal_id``, the writer of the rows)."""

    tenant_id: str
    user_id: str | None = None
    session_id: str | None = None
    principal_id: str | None = None


@runtime_checkable
class ErasableShortTermStore(Protocol):
    """A short-term store that can erase (the right to be forgotten).

    :meth:`MemoryManager.erase` refuses to run over a configured store that
    does not implement this, rather than report an erasure it did not do.
    """

    async def erase(self, subject: ErasureSubject) -> list[int]:
        """Delete the subject's turns: a user's turns are those of their sessions and
        those they wrote as the principal; an agent's, those it wrote. Returns the ids
        of the deleted turns (the long-term store erases what was derived from them)."""
        ...


@runtime_checkable
class ErasableWorkingStore(Protocol):
    """A working store that can erase (see :class:`ErasableShortTermStore`)."""

    async def erase(self, subject: ErasureSubject) -> int:
        """Delete the subject's runs (expired ones included); return how many."""
        ...


@runtime_checkable
class ErasableLongTermStore(Protocol):
    """A long-term store that can erase (see :class:`ErasableShortTermStore`)."""

    async def erase(self, subject: ErasureSubject, *, turn_ids: Sequence[int]) -> tuple[int, int]:
        """Delete the subject's memories and those derived from its conversations in any
        scope (naming one of ``turn_ids``, the erased turns, or a source session of the
        erased user); return (memories, vectors) deleted."""
        ...


@dataclass(frozen=True)
class RetentionReceipt:
    """What a retention run deleted: expired working state, aged memories, and the
    turns of sessions the session TTL expired (``short_term``); and how many
    expired memories it closed (``expired``: kept as history, not deleted)."""

    working: int
    long_term: int
    short_term: int = 0
    expired: int = 0

    @property
    def total(self) -> int:
        """Rows deleted in every tier."""
        return self.working + self.long_term + self.short_term


@dataclass(frozen=True)
class SummaryLease:
    """A held background-summary lease on one session.

    ``token`` identifies this holder (opaque to callers); ``turns`` is the
    session's turn count when the lease was taken and ``turns_at_summary`` the
    count recorded by the previous completed summary (0 when none).
    """

    token: str
    turns: int
    turns_at_summary: int


# The stores (short_term.py, working.py, long_term.py and in_process/) repeat these
# protocols' signatures on purpose: each implements them.


@runtime_checkable
class ShortTermStore(Protocol):
    """Conversation turns of one session (tenant, user, session)."""

    async def append(self, owner: MemoryOwner, message: ConversationMessage) -> ConversationMessage:
        """Store one turn; return it with ``id`` and ``created_at`` set."""
        ...

    async def recent(self, owner: MemoryOwner, limit: int) -> list[ConversationMessage]:
        """The newest ``limit`` turns, oldest first."""
        ...

    async def after(
        self, owner: MemoryOwner, after_id: int, limit: int, before_id: int | None = None
    ) -> list[ConversationMessage]:
        """Up to ``limit`` turns with ``after_id < id (< before_id)``, oldest first."""
        ...

    async def count(self, owner: MemoryOwner) -> int:
        """How many turns the session holds."""
        ...

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the session's turns; return how many."""
        ...


@runtime_checkable
class BlockingShortTermStore(Protocol):
    """A short-term store that can also be called without an event loop (the
    PostgreSQL one, on short-lived connections): LangChain's synchronous chat
    history calls these when the store's own loop cannot run its coroutines."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the store's async connections belong to (None: none yet)."""
        ...

    def append_sync(self, owner: MemoryOwner, message: ConversationMessage) -> ConversationMessage:
        """Append one turn, blocking."""
        ...

    def recent_sync(
        self, owner: MemoryOwner, limit: int, *, ttl_seconds: float | None = None
    ) -> list[ConversationMessage]:
        """The newest ``limit`` turns, oldest first, blocking."""
        ...

    def clear_sync(self, owner: MemoryOwner) -> int:
        """Delete the session's turns, blocking."""
        ...


@runtime_checkable
class WorkingStore(Protocol):
    """Per-run scratch state with an optional time to live."""

    async def get(self, owner: MemoryOwner) -> dict[str, Any]:
        """The run's current state ({} when none or expired)."""
        ...

    async def update(
        self, owner: MemoryOwner, state: dict[str, Any], ttl_seconds: float | None
    ) -> dict[str, Any]:
        """Merge ``state``'s keys into the run's state; return the result."""
        ...

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the run's state."""
        ...


@runtime_checkable
class LongTermStore(Protocol):
    """Durable memories, add-only, with validity intervals."""

    async def save(
        self,
        owner: MemoryOwner,
        memory: Memory,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
    ) -> SaveResult:
        """Store ``memory`` under ``owner`` narrowed to its scope (dedup by hash)."""
        ...

    async def get(self, owner: MemoryOwner, memory_id: str) -> Memory | None:
        """One memory the caller may see, or None."""
        ...

    async def search(
        self, owner: MemoryOwner, query: str, *, limit: int = 10, as_of: datetime | None = None
    ) -> list[Memory]:
        """Memories matching ``query`` (lexical OR semantics, substring fallback)."""
        ...

    async def delete(self, owner: MemoryOwner, memory_id: str) -> bool:
        """Delete one of the caller's own memories."""
        ...

    async def recall(self, owner: MemoryOwner, request: RecallRequest) -> list[RecalledMemory]:
        """The memories ``request`` recalls for ``owner``, ranked, every signal set
        (:mod:`harbor_pg.ranking`; :func:`~harbor_pg.ranking.search_and_rank` answers
        it from :meth:`search` for any store)."""
        ...


@runtime_checkable
class SummaryStore(Protocol):
    """The rolling session summary: one SESSION/SUMMARY memory per session.

    Both built-in long-term stores implement it. The summary is the one memory
    whose content is refreshed in place; its ownership fields (principal,
    project, creation time) never change after the first save.
    """

    async def load_summary(self, owner: MemoryOwner) -> Memory | None:
        """The newest currently valid SESSION/SUMMARY memory of ``owner``'s session, or None."""
        ...

    async def save_summary(
        self, owner: MemoryOwner, memory: Memory, *, expected_frontier: int | None
    ) -> Memory | None:
        """Insert or refresh the session summary; return the stored row.

        ``expected_frontier`` is the ``last_covered_message_id`` of the summary
        the caller read (None: the caller saw no summary). The write happens
        only if the stored summary still has that frontier (or, for None, no
        summary exists yet), so two concurrent refreshes never fold the same
        messages twice; the loser gets None. A refresh updates content,
        content hash, ``source_message_ids`` and metadata only. When the
        deterministic id is taken by a row the caller cannot see (another
        user's session with the same id), the summary is stored under a
        per-user fallback id instead.
        """
        ...


@runtime_checkable
class SummaryLeaseStore(Protocol):
    """Per-session lease and cooldown for background summaries."""

    # The protocols' signatures stand again in their implementations (tiers/in_process/,
    # tiers/short_term.py, tiers/long_term.py) on purpose: an implementation must repeat them.
    async def acquire_summary_lease(
        self,
        owner: MemoryOwner,
        *,
        min_turns: int,
        cooldown_seconds: float,
        lease_seconds: float,
    ) -> SummaryLease | None:
        """Take the session's summary lease in one atomic step, or return None.

        Succeeds only when no other holder's lease is live, the last completed
        summary is at least ``cooldown_seconds`` old, and the session gained at
        least ``min_turns`` turns since that summary (or holds at least
        ``min_turns`` when its history shrank). The lease lasts ``lease_seconds``.
        """
        ...

    async def finish_summary_lease(
        self, owner: MemoryOwner, lease: SummaryLease, *, turns_at_summary: int
    ) -> bool:
        """Record a finished summary (now, ``turns_at_summary``) and drop the lease.

        Returns False (and changes nothing) when the lease is no longer held
        by ``lease``'s holder.
        """
        ...


class NearestMemory(NamedTuple):
    """The stored memory most similar to a vector, and its cosine similarity (-1..1)."""

    memory_id: str
    similarity: float


@dataclass(frozen=True)
class FactResult:
    """Outcome of :meth:`ExtractionStore.add_fact`.

    Attributes:
        memory: the new row when ``created``; the currently valid row with the
            same content when the fact was a duplicate; None when it was skipped
            as a restatement.
        created: whether a row was inserted.
        superseded: id of the memory the new row superseded, if any.
        restatement_of: the memory whose similarity reached the threshold,
            when the fact was skipped as a restatement.
    """

    memory: Memory | None
    created: bool
    superseded: str | None = None
    restatement_of: NearestMemory | None = None


@runtime_checkable
class ProfileStore(Protocol):
    """A long-term store that answers a user's profile (both built-in stores do)."""

    async def profile(self, owner: MemoryOwner, request: ProfileRequest) -> UserProfile:
        """The owner's current durable memories of ``request.scopes`` as a profile:
        the rules of :func:`harbor_pg.profile.profile_of` (``harbor.profile()``), only
        rows keyed exactly to ``owner`` narrowed to each scope it can address."""
        ...


@runtime_checkable
class ConsolidatingStore(Protocol):
    """A long-term store that merges near-duplicate memories (both built-in stores do)."""

    async def consolidate(
        self, owner: MemoryOwner, request: ConsolidationRequest
    ) -> ConsolidationReport:
        """Merge the owner's near-duplicate current memories of ``request.scopes``, add-only,
        by the rules of ``harbor.consolidate_memories()`` (:mod:`harbor_pg.consolidation`):
        only rows keyed exactly to ``owner`` narrowed to each scope it can address, never
        two writers' memories into one."""
        ...


@runtime_checkable
class ExtractionStore(LongTermStore, Protocol):
    """What fact extraction needs beyond :class:`LongTermStore`.

    Both built-in long-term stores implement it. Every method acts as the
    owner: rows of other owners are neither read nor changed.
    """

    async def current_memories(
        self, owner: MemoryOwner, scopes: Sequence[MemoryScope], *, limit: int
    ) -> list[Memory]:
        """The owner's currently valid memories in ``scopes``, newest first, at most ``limit``.

        ``scopes`` are among USER, PROJECT and SESSION, the scopes chat
        extraction writes (others are ignored). Only rows keyed exactly to
        ``owner`` narrowed to each scope are returned; scopes the owner cannot
        address are skipped, and rolling summaries are never returned.
        """
        ...

    async def nearest_in_scope(
        self,
        owner: MemoryOwner,
        scope: MemoryScope,
        embedding: Sequence[float],
        model_id: str,
        *,
        exclude_ids: Sequence[str] = (),
    ) -> NearestMemory | None:
        """The owner's most similar currently valid memory of ``scope``, by cosine similarity.

        Compares only with vectors of ``model_id`` and the same dimension;
        ``exclude_ids`` are skipped. None when nothing is comparable.
        """
        ...

    async def supersede(
        self,
        owner: MemoryOwner,
        memory_id: str,
        memory: Memory,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
    ) -> SaveResult | None:
        """Store ``memory`` as the successor of ``memory_id``, atomically.

        In one transaction: the new row is inserted valid from now, the old
        row's interval is closed at now and its ``superseded_by`` set to the
        new id. The old row must be a currently valid, not yet superseded,
        non-summary memory with the same scope and owner key as ``memory``
        (narrowed from ``owner``); otherwise nothing is written and the result
        is None. Of two concurrent supersessions of one memory exactly one
        succeeds. When ``memory``'s content is already currently valid in that
        scope, nothing is written either and the result is that row with
        ``created=False``.
        """
        ...

    # Repeated by tiers/in_process/ and tiers/long_term.py on purpose (the implementations).
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
        """Store one extracted fact: the per-fact work of extraction, in one transaction.

        1. With ``embedding`` and ``dedup_threshold``: when the owner's nearest
           currently valid memory in ``memory.scope`` (other than ``replaces``)
           reaches the threshold, nothing is written (``restatement_of``).
        2. With ``replaces``: :meth:`supersede`; when that memory is no longer
           current (or not the owner's, or in another scope) the fact is stored
           without superseding anything.
        3. Otherwise a plain insert valid from now, with the vector; content
           already currently valid in the scope is a no-op (``created=False``).
        """
        ...


@runtime_checkable
class ObservationStore(ExtractionStore, Protocol):
    """What observations need beyond :class:`ExtractionStore` (both built-in stores
    have it): an observation whose facts fell away is closed, with no successor."""

    async def close_memory(self, owner: MemoryOwner, memory_id: str, scope: MemoryScope) -> bool:
        """End the validity of ``memory_id`` now, add-only: the row stays (as of
        before, it is current), with no successor. Only a currently valid, not yet
        superseded, non-summary memory of ``scope`` keyed to ``owner`` narrowed to it,
        valid from before now; True when it was closed."""
        ...
