"""Working tier: per-run scratch state with a TTL, in PostgreSQL."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.owner import MemoryOwner

__all__ = ["PostgresWorkingStore", "run_key"]


def run_key(owner: MemoryOwner) -> dict[str, Any]:
    """The RUN key of ``owner``."""
    owner.require_scope("run")
    return {
        "tenant_id": owner.tenant_id,
        "project_id": owner.project_id or "",
        "user_id": owner.user_id,
        "session_id": owner.session_id,
        "run_id": owner.run_id,
    }


# Its methods repeat the signatures of tiers/base.py's protocols on purpose, as the other
# implementation does: each store implements them.
class PostgresWorkingStore:
    """Scratch state in ``harbor.working_state``; expiry decided by the read policy."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, owner: MemoryOwner) -> dict[str, Any]:
        key = run_key(owner)
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/working.sql)
            rows = await self.db.fetch_delegated(
                query("working_state_delegated"), carried_identity(owner)
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(owner, query("scratch"), key)
        return dict(rows[0]["state"]) if rows else {}

    async def update(
        self, owner: MemoryOwner, state: dict[str, Any], ttl_seconds: float | None
    ) -> dict[str, Any]:
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/working.sql)
            [found] = await self.db.fetch_delegated(
                query("working_update_delegated"),
                {**carried_identity(owner), "state": Jsonb(state), "ttl_seconds": ttl_seconds},
            )
            return dict(found["state"])
        params = {
            **run_key(owner),
            "principal_id": owner.principal_id or "",
            "state": Jsonb(state),
            "ttl_seconds": ttl_seconds,
        }
        async with self.db.transaction(owner) as conn:
            await conn.execute(query("lock_run"), params)
            row = await (await conn.execute(query("update_working"), params)).fetchone()
        assert row is not None
        return dict(row["state"])

    async def clear(self, owner: MemoryOwner) -> int:
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/clear.sql)
            run_key(owner)  # (the owner must name a run)
            rows = await self.db.fetch_delegated(
                query("clear_working_delegated"), carried_identity(owner)
            )
            return int(rows[0]["deleted"])
        async with self.db.transaction(owner) as conn:
            cur = await conn.execute(query("clear_working"), run_key(owner))
            return cur.rowcount

    async def purge_expired(self) -> int:
        """Reclaim expired rows (runs as the elevated role)."""
        async with self.db.transaction(None, admin=True) as conn:
            row = await (await conn.execute(query("purge_working_state"))).fetchone()
        return int(row["purged"]) if row else 0
