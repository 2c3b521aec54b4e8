"""Short-term tier in process: conversation turns in a dict (no database)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass

from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.base import ErasureSubject, SummaryLease
from harbor_pg.tiers.in_process._shared import erased, utc_now
from harbor_pg.tiers.session_ttl import live_turns

__all__ = ["InMemoryShortTermStore"]


@dataclass
class _SessionState:
    """In-process twin of a ``harbor.session_state`` row (monotonic clock)."""

    summarised_at: float | None = None
    lease_until: float | None = None
    lease_token: str | None = None
    turns_at_summary: int = 0


# Its methods repeat the signatures of tiers/base.py's protocols on purpose, as the other
# implementation does: each store implements them.
class InMemoryShortTermStore:
    """Conversation turns in a dict keyed by (tenant, user, session)."""

    def __init__(self) -> None:
        self._turns: dict[tuple[str, str, str], list[ConversationMessage]] = {}
        # turn id -> the principal that appended it ('' when none), for erasure
        self._principals: dict[int, str] = {}
        self._ids = itertools.count(1)
        self._sessions: dict[tuple[str, str, str], _SessionState] = {}
        self._lease_lock = asyncio.Lock()

    @staticmethod
    def _key(owner: MemoryOwner) -> tuple[str, str, str]:
        owner.require_scope("session")
        return (owner.tenant_id, owner.user_id or "", owner.session_id or "")

    async def append(self, owner: MemoryOwner, message: ConversationMessage) -> ConversationMessage:
        """Store ``message`` as the owner's newest turn; return it with its id and time."""
        key = self._key(owner)
        turn_id = next(self._ids)
        stored = message.model_copy(update={"id": turn_id, "created_at": utc_now()})
        self._turns.setdefault(key, []).append(stored)
        self._principals[turn_id] = owner.principal_id or ""
        return stored

    async def recent(
        self, owner: MemoryOwner, limit: int, *, ttl_seconds: float | None = None
    ) -> list[ConversationMessage]:
        """The owner's last ``limit`` turns, oldest first; with ``ttl_seconds``, only
        those a session TTL of inactivity has not expired (as in PostgreSQL)."""
        turns = self._turns.get(self._key(owner), [])
        newest = list(turns[-limit:]) if limit > 0 else []
        return live_turns(newest, ttl_seconds) if ttl_seconds is not None else newest

    async def after(
        self, owner: MemoryOwner, after_id: int, limit: int, before_id: int | None = None
    ) -> list[ConversationMessage]:
        """Up to ``limit`` turns with ids after ``after_id`` (and before
        ``before_id``), oldest first."""
        turns = [
            t
            for t in self._turns.get(self._key(owner), [])
            if (t.id or 0) > after_id and (before_id is None or (t.id or 0) < before_id)
        ]
        return turns[:limit]

    async def count(self, owner: MemoryOwner) -> int:
        """How many turns the owner's session holds."""
        return len(self._turns.get(self._key(owner), []))

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the session's turns; return how many went."""
        gone = self._turns.pop(self._key(owner), [])
        for turn in gone:
            self._principals.pop(turn.id or 0, None)
        return len(gone)

    async def append_and_check_summary(
        self,
        owner: MemoryOwner,
        message: ConversationMessage,
        *,
        min_turns: int,
        cooldown_seconds: float,
    ) -> tuple[ConversationMessage, bool]:
        """:meth:`append`, and whether the session is now due a background summary."""
        stored = await self.append(owner, message)
        due = await self.summary_due(owner, min_turns=min_turns, cooldown_seconds=cooldown_seconds)
        return stored, due

    async def summary_due(
        self, owner: MemoryOwner, *, min_turns: int, cooldown_seconds: float
    ) -> bool:
        """Whether :meth:`acquire_summary_lease` would succeed now; changes nothing."""
        key = self._key(owner)
        turns = len(self._turns.get(key, []))
        state = self._sessions.get(key)
        now = time.monotonic()
        return turns >= min_turns and (
            state is None
            or (
                (state.lease_until is None or state.lease_until <= now)
                and (state.summarised_at is None or state.summarised_at <= now - cooldown_seconds)
                and (turns < state.turns_at_summary or turns - state.turns_at_summary >= min_turns)
            )
        )

    async def acquire_summary_lease(
        self,
        owner: MemoryOwner,
        *,
        min_turns: int,
        cooldown_seconds: float,
        lease_seconds: float,
    ) -> SummaryLease | None:
        """Take the session's summary lease (same rules as the PostgreSQL store)."""
        key = self._key(owner)
        async with self._lease_lock:
            turns = len(self._turns.get(key, []))
            now = time.monotonic()
            state = self._sessions.get(key)
            if turns < min_turns:
                return None
            if state is not None:
                if state.lease_until is not None and state.lease_until > now:
                    return None
                if state.summarised_at is not None and state.summarised_at > now - cooldown_seconds:
                    return None
                if turns >= state.turns_at_summary and turns - state.turns_at_summary < min_turns:
                    return None
            else:
                state = self._sessions[key] = _SessionState()
            state.lease_until = now + lease_seconds
            state.lease_token = uuid.uuid4().hex
            return SummaryLease(
                token=state.lease_token, turns=turns, turns_at_summary=state.turns_at_summary
            )

    async def finish_summary_lease(
        self, owner: MemoryOwner, lease: SummaryLease, *, turns_at_summary: int
    ) -> bool:
        """Record a finished summary and drop the lease, if ``lease`` still holds it."""
        async with self._lease_lock:
            state = self._sessions.get(self._key(owner))
            if state is None or state.lease_token != lease.token or state.lease_until is None:
                return False
            state.summarised_at = time.monotonic()
            state.turns_at_summary = turns_at_summary
            state.lease_until = None
            state.lease_token = None
            return True

    async def release_summary_lease(self, owner: MemoryOwner, lease: SummaryLease) -> bool:
        """Drop the lease without recording a summary, if ``lease`` still holds it."""
        async with self._lease_lock:
            state = self._sessions.get(self._key(owner))
            if state is None or state.lease_token != lease.token or state.lease_until is None:
                return False
            state.lease_until = None
            state.lease_token = None
            return True

    def purge_expired_turns(self, tenant_id: str, ttl_seconds: float) -> int:
        """Delete the tenant's turns a session TTL has hidden (``purge_expired_turns`` in SQL)."""
        gone = 0
        for key in [k for k in self._turns if k[0] == tenant_id]:
            turns = self._turns[key]
            kept = live_turns(turns, ttl_seconds)
            for turn in turns[: len(turns) - len(kept)]:
                self._principals.pop(turn.id or 0, None)
                gone += 1
            if kept:
                self._turns[key] = kept
            else:
                del self._turns[key]
        return gone

    async def erase(self, subject: ErasureSubject) -> list[int]:
        """Delete the turns of a user, a session or an agent (``harbor.erase``'s rules).

        Returns the ids of the deleted turns (memories derived from them go too).
        """
        tenant_id, user_id = subject.tenant_id, subject.user_id
        session_id, principal_id = subject.session_id, subject.principal_id
        if user_id is not None and principal_id is None:
            for key in list(self._sessions):
                if key[0] == tenant_id and key[1] == user_id and session_id in (None, key[2]):
                    del self._sessions[key]
        gone: list[int] = []
        for key in list(self._turns):
            if key[0] != tenant_id:
                continue
            kept = []
            for turn in self._turns[key]:
                principal = self._principals.get(turn.id or 0, "")
                if erased(key[1], principal, (key[2],), user_id, session_id, principal_id):
                    gone.append(turn.id or 0)
                    self._principals.pop(turn.id or 0, None)
                else:
                    kept.append(turn)
            if kept:
                self._turns[key] = kept
            else:
                del self._turns[key]
        return gone
