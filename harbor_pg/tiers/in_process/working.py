"""Working tier in process: per-run scratch state with a monotonic-clock TTL (no database)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from harbor_pg.owner import MemoryOwner
from harbor_pg.tiers.base import ErasureSubject
from harbor_pg.tiers.in_process._shared import erased

__all__ = ["InMemoryWorkingStore"]

_KEY = ("tenant_id", "project_id", "user_id", "session_id", "run_id")


# Its methods repeat the signatures of tiers/base.py's protocols on purpose, as the other
# implementation does: each store implements them.
class InMemoryWorkingStore:
    """Scratch state per run with a monotonic-clock TTL."""

    def __init__(self) -> None:
        # run key -> (state, monotonic expiry, principal of the last writer)
        self._state: dict[tuple[str, ...], tuple[dict[str, Any], float | None, str]] = {}
        self._lock = asyncio.Lock()

    @staticmethod
    def _key(owner: MemoryOwner) -> tuple[str, ...]:
        owner.require_scope("run")
        return tuple(getattr(owner, f) or "" for f in _KEY)

    def _live(self, key: tuple[str, ...]) -> dict[str, Any] | None:
        entry = self._state.get(key)
        if entry is None:
            return None
        state, expires, _principal = entry
        if expires is not None and time.monotonic() >= expires:
            return None
        return state

    async def get(self, owner: MemoryOwner) -> dict[str, Any]:
        """The run's working state (empty once it expired)."""
        return dict(self._live(self._key(owner)) or {})

    async def update(
        self, owner: MemoryOwner, state: dict[str, Any], ttl_seconds: float | None
    ) -> dict[str, Any]:
        """Merge ``state`` into the run's working state, renewing its TTL; return the result."""
        async with self._lock:
            key = self._key(owner)
            merged = {**(self._live(key) or {}), **state}
            expires = None if ttl_seconds is None else time.monotonic() + ttl_seconds
            self._state[key] = (merged, expires, owner.principal_id or "")
            return dict(merged)

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the run's working state; return 1 if there was one, else 0."""
        return 1 if self._state.pop(self._key(owner), None) is not None else 0

    async def purge_expired(self) -> int:
        """Drop every expired run (all tenants)."""
        dead = [k for k in self._state if self._live(k) is None]
        for k in dead:
            del self._state[k]
        return len(dead)

    def purge_expired_of(self, tenant_id: str) -> int:
        """Drop the expired runs of one tenant (retention)."""
        dead = [k for k in self._state if k[0] == tenant_id and self._live(k) is None]
        for k in dead:
            del self._state[k]
        return len(dead)

    async def erase(self, subject: ErasureSubject) -> int:
        """Delete the runs of a user, a session or an agent (``harbor.erase``'s rules)."""
        tenant_id, user_id = subject.tenant_id, subject.user_id
        session_id, principal_id = subject.session_id, subject.principal_id
        dead = [
            k
            for k, (_state, _expires, principal) in self._state.items()
            if k[0] == tenant_id
            and erased(k[2], principal, (k[3],), user_id, session_id, principal_id)
        ]
        for k in dead:
            del self._state[k]
        return len(dead)
