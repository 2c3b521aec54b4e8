"""Short-term tier: conversation turns in PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg.types.json import Jsonb

from harbor_pg.db.connection import Database, carried_identity, identity_params
from harbor_pg.db.sqlfiles import query
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.base import SummaryLease
from harbor_pg.tiers.rows import constructed
from harbor_pg.tokens import approximate_tokens

__all__ = ["PostgresShortTermStore", "message_from_row", "session_key"]


def session_key(owner: MemoryOwner) -> dict[str, Any]:
    """The SESSION key of ``owner`` (tenant, user, session)."""
    owner.require_scope("session")
    return {"tenant_id": owner.tenant_id, "user_id": owner.user_id, "session_id": owner.session_id}


#: ConversationMessage's fields, in its order (what model_construct keeps them in)
_MESSAGE_FIELDS = tuple(ConversationMessage.model_fields)
_PLAIN_MESSAGE = (
    ConversationMessage.__pydantic_post_init__ is None
    and not ConversationMessage.__private_attributes__
    and _MESSAGE_FIELDS
    == ("role", "content", "name", "tool_calls", "tool_call_id", "metadata", "id", "created_at")
)


def message_from_row(row: dict[str, Any]) -> ConversationMessage:
    """A stored turn; rows were validated on the way in, so skip re-validation."""
    values = {  # in _MESSAGE_FIELDS' order
        "role": row["role"],
        "content": row["content"],
        "name": row["name"],
        "tool_calls": row["tool_calls"] or [],
        "tool_call_id": row["tool_call_id"],
        "metadata": row["metadata"] or {},
        "id": row["id"],
        "created_at": _timestamp(row["created_at"]),
    }
    if not _PLAIN_MESSAGE:
        return ConversationMessage.model_construct(**values)
    # every field given: what model_construct does then, without its per-field
    # alias and default lookups (a recent() reads a dozen turns);
    # tests/unit/test_message_rows.py holds the two equal
    return constructed(ConversationMessage, values)


def _timestamp(value: Any) -> Any:
    # the snapshot query returns JSON, where timestamps are ISO strings
    if isinstance(value, str):
        from datetime import datetime

        return datetime.fromisoformat(value)
    return value


def _append_params(owner: MemoryOwner, message: ConversationMessage) -> dict[str, Any]:
    return {
        **session_key(owner),
        "project_id": owner.project_id or "",
        "principal_id": owner.principal_id or "",
        "role": message.role,
        "content": message.content,
        "name": message.name,
        "tool_calls": Jsonb(message.tool_calls),
        "tool_call_id": message.tool_call_id,
        "metadata": Jsonb(message.metadata),
        "token_estimate": approximate_tokens(message.content),
    }


def _delegated_params(
    owner: MemoryOwner, params: dict[str, Any], due: dict[str, Any] | None
) -> dict[str, Any]:
    """``append_turn_delegated``'s parameters: the append's, the rest of the identity
    (the call carries it), and the summary's (None: no summary check)."""
    return {
        **params,
        "run_id": owner.run_id or "",
        "min_turns": None,
        "cooldown_seconds": None,
        **(due or {}),
    }


def _recent_query(
    owner: MemoryOwner, limit: int, ttl_seconds: float | None
) -> tuple[str, dict[str, Any]]:
    params = {**identity_params(owner), "limit": limit}
    if ttl_seconds is None:
        return "recent_turns", params
    return "recent_live_turns", {**params, "ttl_seconds": ttl_seconds}


# Its methods repeat the signatures of tiers/base.py's protocols on purpose, as the other
# implementation does: each store implements them.
class PostgresShortTermStore:
    """Conversation turns kept in ``harbor.messages`` under row-level security."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def append(self, owner: MemoryOwner, message: ConversationMessage) -> ConversationMessage:
        params = _append_params(owner, message)
        if self.db.set_local:
            row, _due = await self._append_citus(owner, params, None)
        else:
            [row] = await self.db.fetch_in_one_round_trip(owner, query("append_message"), params)
        return message.model_copy(update={"id": row["id"], "created_at": row["created_at"]})

    async def _append_citus(
        self, owner: MemoryOwner, params: dict[str, Any], due: dict[str, Any] | None
    ) -> tuple[dict[str, Any], bool]:
        """The append on a distributed database: one call (``append_turn_delegated``) that
        Citus sends whole to the tenant's worker, which takes the user's lock and the
        session's, stores the turn and (with ``due``, the summary's parameters) tells
        whether a summary is due (``sql/citus/append.sql``)."""
        [row] = await self.db.fetch_delegated(
            query("append_turn_delegated"), _delegated_params(owner, params, due)
        )
        return row, bool(row["summary_due"]) if due is not None else False

    async def append_and_check_summary(
        self,
        owner: MemoryOwner,
        message: ConversationMessage,
        *,
        min_turns: int,
        cooldown_seconds: float,
    ) -> tuple[ConversationMessage, bool]:
        """:meth:`append`, and whether the session is now due a background summary
        (:meth:`summary_due`'s rules, read in the same statement: no extra round trip)."""
        params = {
            **_append_params(owner, message),
            "min_turns": min_turns,
            "cooldown_seconds": cooldown_seconds,
        }
        if self.db.set_local:
            row, due = await self._append_citus(
                owner, params, {"min_turns": min_turns, "cooldown_seconds": cooldown_seconds}
            )
            stored = message.model_copy(update={"id": row["id"], "created_at": row["created_at"]})
            return stored, due
        [row] = await self.db.fetch_in_one_round_trip(
            owner, query("append_message_check_summary"), params
        )
        stored = message.model_copy(update={"id": row["id"], "created_at": row["created_at"]})
        return stored, bool(row["summary_due"])

    async def append_with_jobs(
        self,
        owner: MemoryOwner,
        message: ConversationMessage,
        *,
        min_turns: int,
        cooldown_seconds: float,
        extract: bool,
        fold: bool,
        slots: int | None = None,
        delay_seconds: float = 0.0,
    ) -> tuple[ConversationMessage, bool, list[int]]:
        """:meth:`append_and_check_summary`, and the turn's jobs queued in the same
        transaction (:mod:`harbor_pg.jobs`; on one server in the same statement): its
        fact extraction (``extract``) and, when the session is now due one, its summary
        fold (``fold``). The stored turn,
        whether a summary is due, and the ids of the jobs queued with it. ``slots``: at
        most that many of these jobs run at once across every worker (None: a session's
        jobs one at a time, sessions in parallel).

        On one server the extraction is the session's (:data:`harbor_pg.jobs.EXTRACT_SESSION_TASK`):
        queued only when none is waiting for the session, it reads every turn appended
        until it starts, ``delay_seconds`` after the turn that queued it. On a
        distributed database each turn queues its own (:data:`harbor_pg.jobs.EXTRACT_TASK`)."""
        params = {
            **_append_params(owner, message),
            "min_turns": min_turns,
            "cooldown_seconds": cooldown_seconds,
            "extract": extract,
            "fold": fold,
            "slots": slots or 0,
            "delay_seconds": delay_seconds,
        }
        if self.db.set_local:
            row, job_ids = await self._append_with_jobs_citus(owner, params)
        else:
            [row] = await self.db.fetch_in_one_round_trip(
                owner, query("append_message_with_jobs"), params
            )
            job_ids = [int(i) for i in row["job_ids"] or ()]
        stored = message.model_copy(update={"id": row["id"], "created_at": row["created_at"]})
        return stored, bool(row["summary_due"]), job_ids

    async def _append_with_jobs_citus(
        self, owner: MemoryOwner, params: dict[str, Any]
    ) -> tuple[dict[str, Any], list[int]]:
        """:meth:`append_with_jobs` on a distributed database: in one transaction block,
        the turn stored by the append's delegated call (``append_turn_delegated``, which
        Citus sends whole to the tenant's worker inside the block: the same call as
        :meth:`append`'s, so that a session's ids stay in commit order across both), then
        its jobs queued on the coordinator (``queue_turn_jobs_citus``: they need the turn's
        id and whether a summary is due, which the call returns) and COMMIT. Two round
        trips; the worker sees BEGIN, the call and COMMIT, and commits in one phase. The
        stored turn's row and the ids of its jobs."""
        due = {"min_turns": params["min_turns"], "cooldown_seconds": params["cooldown_seconds"]}

        def jobs(results: list[list[dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
            [[turn]] = results
            return [
                # (the identity the queue reads, on the coordinator alone)
                (query("set_identity"), identity_params(owner)),
                (
                    query("queue_turn_jobs_citus"),
                    {
                        "turn_id": turn["id"],
                        "summary_due": turn["summary_due"],
                        "extract": params["extract"],
                        "fold": params["fold"],
                        "slots": params["slots"],
                    },
                ),
            ]

        [[row], _identity, [queued]] = await self.db.fetch_each_delegated_in_transaction(
            [(query("append_turn_delegated"), _delegated_params(owner, params, due))], then=jobs
        )
        return row, [int(i) for i in queued["job_ids"] or ()]

    # -- synchronous twins, each on a short-lived connection of its own ----------------
    # (for HarborChatMessageHistory's sync members when the async pool cannot be used)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the database's pool belongs to (None before it is opened)."""
        return self.db.loop

    def append_sync(self, owner: MemoryOwner, message: ConversationMessage) -> ConversationMessage:
        """:meth:`append` without an event loop (see :meth:`Database.sync_transaction`)."""
        params = _append_params(owner, message)
        with self.db.sync_transaction(owner) as conn:
            if self.db.set_local:
                # (the same call as append's on a distributed database: its ids are drawn on
                # the tenant's worker, and a session's must stay in commit order)
                row = conn.execute(
                    query("append_turn_delegated"), _delegated_params(owner, params, None)
                ).fetchone()
            else:
                row = conn.execute(query("append_message"), params).fetchone()
        assert row is not None
        return message.model_copy(update={"id": row["id"], "created_at": row["created_at"]})

    def recent_sync(
        self, owner: MemoryOwner, limit: int, *, ttl_seconds: float | None = None
    ) -> list[ConversationMessage]:
        """:meth:`recent` without an event loop."""
        session_key(owner)
        name, params = _recent_query(owner, limit, ttl_seconds)
        with self.db.sync_transaction(owner) as conn:
            rows = conn.execute(query(name), params).fetchall()
        return [message_from_row(r) for r in rows]

    def clear_sync(self, owner: MemoryOwner) -> int:
        """:meth:`clear` without an event loop."""
        with self.db.sync_transaction(owner) as conn:
            return conn.execute(query("clear_messages"), session_key(owner)).rowcount

    async def recent(
        self, owner: MemoryOwner, limit: int, *, ttl_seconds: float | None = None
    ) -> list[ConversationMessage]:
        """The newest ``limit`` turns, oldest first; with ``ttl_seconds``, only those a
        session TTL of inactivity has not expired (see :mod:`harbor_pg.tiers.session_ttl`)."""
        session_key(owner)  # the owner must address a session
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/recent.sql)
            found = await self.db.fetch_delegated(
                query("recent_turns_delegated"),
                {**carried_identity(owner), "limit": limit, "ttl_seconds": ttl_seconds},
            )
            return [message_from_row(r) for r in found]
        name, params = _recent_query(owner, limit, ttl_seconds)
        # one statement that sets the identity itself: one round trip
        rows = await self.db.fetch_self_identified(query(name), params)
        return [message_from_row(r) for r in rows]

    async def after(
        self, owner: MemoryOwner, after_id: int, limit: int, before_id: int | None = None
    ) -> list[ConversationMessage]:
        params = {
            **session_key(owner),
            "after_id": after_id,
            "before_id": before_id,
            "limit": limit,
        }
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/turns.sql)
            rows = await self.db.fetch_delegated(
                query("messages_after_delegated"), {**params, **carried_identity(owner)}
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(owner, query("messages_after"), params)
        return [message_from_row(r) for r in rows]

    async def turns_through(
        self, owner: MemoryOwner, message_id: int, limit: int
    ) -> list[ConversationMessage]:
        """The newest ``limit`` turns of ``owner``'s session up to and including turn
        ``message_id``, oldest first (a queued extraction's turns, however many came
        after them)."""
        params = {**session_key(owner), "message_id": message_id, "limit": limit}
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/turns.sql)
            rows = await self.db.fetch_delegated(
                query("turns_through_delegated"), {**params, **carried_identity(owner)}
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(owner, query("turns_through"), params)
        return [message_from_row(r) for r in rows]

    async def claim_extraction(
        self, owner: MemoryOwner, from_id: int, *, context: int, limit: int
    ) -> list[ConversationMessage]:
        """A queued session extraction starting: its session's waiting flag cleared
        (after the appends in flight commit, as they hold the session's lock) and, in the
        same transaction, its turns read: from ``from_id`` on (at most ``limit``), with
        the ``context`` turns before, oldest first. Every turn appended before the flag
        was cleared is among them (or in the pages after, :meth:`extraction_turns`); a
        turn appended after it queues the next extraction."""
        params = {**session_key(owner), "from_id": from_id, "context": context, "limit": limit}
        _cleared, rows = await self.db.fetch_each_in_one_round_trip(
            owner, [(query("extraction_claim"), params), (query("extraction_turns"), params)]
        )
        return [message_from_row(r) for r in rows]

    async def release_extraction(self, owner: MemoryOwner) -> None:
        """Clear ``owner``'s session's waiting-extraction flag (its extraction was
        cancelled): the session's next turn queues a new one."""
        await self.db.fetch_in_one_round_trip(owner, query("extraction_claim"), session_key(owner))

    async def extraction_turns(
        self, owner: MemoryOwner, from_id: int, *, context: int, limit: int
    ) -> list[ConversationMessage]:
        """The turns of ``owner``'s session from ``from_id`` on (at most ``limit``), with
        the ``context`` turns before, oldest first: a session extraction's next page."""
        params = {**session_key(owner), "from_id": from_id, "context": context, "limit": limit}
        rows = await self.db.fetch_in_one_round_trip(owner, query("extraction_turns"), params)
        return [message_from_row(r) for r in rows]

    async def count(self, owner: MemoryOwner) -> int:
        rows = await self.db.fetch_in_one_round_trip(
            owner, query("count_messages"), session_key(owner)
        )
        return int(rows[0]["n"]) if rows else 0

    async def clear(self, owner: MemoryOwner) -> int:
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/clear.sql)
            session_key(owner)  # (the owner must name a session)
            rows = await self.db.fetch_delegated(
                query("clear_session_delegated"), carried_identity(owner)
            )
            return int(rows[0]["deleted"])
        async with self.db.transaction(owner) as conn:
            cur = await conn.execute(query("clear_messages"), session_key(owner))
            return cur.rowcount

    async def summary_due(
        self, owner: MemoryOwner, *, min_turns: int, cooldown_seconds: float
    ) -> bool:
        """Whether :meth:`acquire_summary_lease` would succeed now; reads only (one round trip)."""
        params = {
            **session_key(owner),
            "min_turns": min_turns,
            "cooldown_seconds": cooldown_seconds,
        }
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/lease.sql)
            [row] = await self.db.fetch_delegated(
                query("summary_due_delegated"), {**params, **carried_identity(owner)}
            )
        else:
            [row] = await self.db.fetch_in_one_round_trip(owner, query("summary_due"), params)
        return bool(row["due"])

    async def acquire_summary_lease(
        self,
        owner: MemoryOwner,
        *,
        min_turns: int,
        cooldown_seconds: float,
        lease_seconds: float,
    ) -> SummaryLease | None:
        """Take the session's summary lease (one atomic statement; see SummaryLeaseStore)."""
        params = {
            **session_key(owner),
            "min_turns": min_turns,
            "cooldown_seconds": cooldown_seconds,
            "lease_seconds": lease_seconds,
        }
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/lease.sql)
            rows = await self.db.fetch_delegated(
                query("summary_lease_acquire_delegated"), {**params, **carried_identity(owner)}
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(
                owner, query("context_acquire_summary_lease"), params
            )
        if not rows:
            return None
        row = rows[0]
        return SummaryLease(
            token=row["summary_lease_until"].isoformat(),
            turns=int(row["turns"]),
            turns_at_summary=int(row["turns_at_summary"]),
        )

    async def finish_summary_lease(
        self, owner: MemoryOwner, lease: SummaryLease, *, turns_at_summary: int
    ) -> bool:
        """Record a finished summary and drop the lease, if ``lease`` still holds it."""
        params = {
            **session_key(owner),
            "lease_until": lease.token,
            "turns_at_summary": turns_at_summary,
        }
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/lease.sql)
            rows = await self.db.fetch_delegated(
                query("summary_lease_end_delegated"), {**params, **carried_identity(owner)}
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(
                owner, query("context_finish_summary_lease"), params
            )
        return bool(rows)

    async def release_summary_lease(self, owner: MemoryOwner, lease: SummaryLease) -> bool:
        """Drop the lease without recording a summary, if ``lease`` still holds it (a
        queued fold that failed: its retry finds the session still due)."""
        params = {**session_key(owner), "lease_until": lease.token}
        if self.db.set_local:
            # a distributed database: one call that Citus delegates to the tenant's
            # worker, the identity its arguments (sql/citus/lease.sql)
            rows = await self.db.fetch_delegated(
                query("summary_lease_end_delegated"),
                {**params, **carried_identity(owner), "turns_at_summary": None},
            )
        else:
            rows = await self.db.fetch_in_one_round_trip(
                owner, query("context_release_summary_lease"), params
            )
        return bool(rows)
