"""Changes to memories as they commit: :meth:`MemoryManager.watch` (the PostgreSQL stores).

Every statement that writes, supersedes or erases memories notifies, in its
transaction, on its tenant's channel (``sql/functions/changes.sql``): the kind of
change and the ids, nothing else. A watch listens on its owner's tenant channel
and on GLOBAL memories' one, reads every announced id back as its owner, under
row-level security, and yields only what that owner may read, with the memory as
it reads it now. An erasure is yielded for an id this watch yielded before and
that its owner can no longer read (a deleted row cannot be read back to see whose
it was). Any login may LISTEN and NOTIFY on any channel, so a payload is only a
hint: a watch never hands on anything it has not read back itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg import sql
from pydantic import BaseModel

from harbor_pg.db.errors import wrap_db_errors
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory

if TYPE_CHECKING:
    from harbor_pg.tiers.long_term import PostgresLongTermStore

__all__ = ["CHANNEL_PREFIX", "MemoryChange", "MemoryWatch", "change_channel"]

log = logging.getLogger("harbor_pg")

#: the start of every channel harbor-pg announces changes on
CHANNEL_PREFIX = "harbor_changes_"
#: how many yielded ids a watch remembers, to tell their erasure
SEEN_IDS = 100_000

ChangeKind = Literal["written", "superseded", "erased"]


def change_channel(tenant_id: str) -> str:
    """The channel of ``tenant_id``'s changes (as harbor.change_channel names it)."""
    return CHANNEL_PREFIX + hashlib.sha256(tenant_id.encode()).hexdigest()[:32]


class MemoryChange(BaseModel):
    """One change a watch yields: ``written`` (a new memory, or a summary folded
    again), ``superseded`` (its validity changed: closed by a successor or by expiry,
    or reopened), ``erased`` (deleted). ``memory``: the memory as the watching owner
    reads it now (None for an erasure)."""

    kind: ChangeKind
    memory_id: str
    memory: Memory | None = None


class MemoryWatch:
    """The changes one owner may read, as they commit: an async iterator.

    Listening starts on entering it (``async with manager.watch(owner) as changes``),
    or else on the first ``__anext__``; changes committed before that are not seen.
    It holds a connection of its own (not one of the pool's) until closed
    (``aclose``, or leaving the ``async with`` block).
    """

    def __init__(self, url: str, owner: MemoryOwner, store: PostgresLongTermStore) -> None:
        self._url = url
        self._owner = owner
        self._store = store
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._notes: AsyncIterator[psycopg.Notify] | None = None
        self._pending: list[MemoryChange] = []
        self._seen: OrderedDict[str, None] = OrderedDict()

    async def start(self) -> None:
        """Listen from now on (idempotent)."""
        if self._conn is not None:
            return
        async with wrap_db_errors():
            conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
            try:
                for tenant in dict.fromkeys((self._owner.tenant_id, "")):
                    await conn.execute(
                        sql.SQL("listen {}").format(sql.Identifier(change_channel(tenant)))
                    )
            except BaseException:
                await conn.close()
                raise
        self._conn = conn
        self._notes = conn.notifies()

    async def aclose(self) -> None:
        """Stop listening and close the connection."""
        conn, self._conn, self._notes = self._conn, None, None
        if conn is not None:
            await conn.close()

    async def __aenter__(self) -> MemoryWatch:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> MemoryWatch:
        return self

    async def __anext__(self) -> MemoryChange:
        await self.start()
        while not self._pending:
            notes = self._notes
            if notes is None:
                raise StopAsyncIteration
            async with wrap_db_errors():
                note = await anext(notes)
            self._pending = await self._read_back(note.payload)
        return self._pending.pop(0)

    async def _read_back(self, payload: str) -> list[MemoryChange]:
        """The changes of one notification that the owner may read, read back as it."""
        parsed = _parse(payload)
        if parsed is None:
            return []
        kind, ids = parsed
        visible = {m.id: m for m in await self._store.get_many(self._owner, ids)}
        out: list[MemoryChange] = []
        for memory_id in ids:
            memory = visible.get(memory_id)
            if kind == "erased":
                # told for what this watch handed on, and only once it is gone
                if memory is None and memory_id in self._seen:
                    del self._seen[memory_id]
                    out.append(MemoryChange(kind="erased", memory_id=memory_id))
            elif memory is not None:
                self._remember(memory_id)
                out.append(MemoryChange(kind=kind, memory_id=memory_id, memory=memory))
        return out

    def _remember(self, memory_id: str) -> None:
        self._seen[memory_id] = None
        self._seen.move_to_end(memory_id)
        while len(self._seen) > SEEN_IDS:
            self._seen.popitem(last=False)


def _parse(payload: str) -> tuple[ChangeKind, Sequence[str]] | None:
    """(kind, ids) of a payload as harbor.change_channel's trigger sends it; None for
    anything else (any login may notify on the channel)."""
    try:
        data = json.loads(payload)
        kind, ids = data["kind"], data["ids"]
    except (ValueError, TypeError, KeyError):
        return None
    if kind not in ("written", "superseded", "erased") or not isinstance(ids, list):
        return None
    if not all(isinstance(i, str) for i in ids) or len(ids) > 1000:
        return None
    return kind, ids
