"""Reads from a hot standby (PostgreSQL streaming replication), writes to the primary.

A :class:`ReadReplica` holds a :class:`~harbor_pg.db.connection.Database` on a
standby and the tiers' stores over it. ``MemoryManager`` (``read_url=`` /
``HARBOR_READ_DATABASE_URL``) sends ``recall``, ``snapshot``, ``recent`` and
``search`` there and every write to the primary. The standby applies the
primary's policies (they are part of the replicated catalog), so row-level
security holds there for every login, as on the primary.

Read-your-writes: a standby replays the primary's writes a moment later. After
a write for an owner (a turn, a memory, working state, a delete), that owner's
(tenant, user) reads go to the primary for ``fresh_seconds`` (default 5):
the caller sees its own last write. Reads of owners who did not write within
that window may lag by the standby's replay delay (``pg_last_xact_replay_timestamp()``
on the standby; on one machine it is a few milliseconds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore

__all__ = ["DEFAULT_FRESH_SECONDS", "READ_URL_ENV", "ReadReplica"]

READ_URL_ENV = "HARBOR_READ_DATABASE_URL"
DEFAULT_FRESH_SECONDS = 5.0


@dataclass
class ReadReplica:
    """A standby's database and stores, and who wrote recently (served by the primary)."""

    database: Database
    fresh_seconds: float = DEFAULT_FRESH_SECONDS
    short_term: PostgresShortTermStore = field(init=False)
    long_term: PostgresLongTermStore = field(init=False)
    _wrote: dict[tuple[str, str], float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.short_term = PostgresShortTermStore(self.database)
        self.long_term = PostgresLongTermStore(self.database)

    @staticmethod
    def _key(owner: MemoryOwner) -> tuple[str, str]:
        return owner.tenant_id, owner.user_id or owner.principal_id or ""

    def wrote(self, owner: MemoryOwner) -> None:
        """Record a write for ``owner``: its reads go to the primary for a while."""
        now = time.monotonic()
        self._wrote[self._key(owner)] = now + self.fresh_seconds
        if len(self._wrote) > 10_000:  # forget the expired ones now and then
            self._wrote = {k: t for k, t in self._wrote.items() if t > now}

    def serves(self, owner: MemoryOwner) -> bool:
        """Whether ``owner``'s reads may go to the standby now."""
        until = self._wrote.get(self._key(owner))
        return until is None or until <= time.monotonic()
