"""The summary rule after a summary counts only the turns that came after it.

A finished summary records, beside its turn count (``turns_at_summary``), the id
of the last of those turns (``session_state.summarised_through``). While it is
set, whether the session is due again is whether ``min_turns`` turns came after
it, which is the counting rule's answer (the session holds ``turns_at_summary``
turns up to it); a deletion of any of the session's turns clears it, and the rule
counts every turn again. These tests hold both forms to the same answers.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.conftest import PgDatabase

OWNER = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")
OTHER = MemoryOwner(tenant_id="t1", principal_id="bob", session_id="s9")
MIN_TURNS = 5


def state(db: PgDatabase, session: str = "s1") -> dict[str, Any]:
    with psycopg.connect(db.superuser_url, row_factory=dict_row) as conn:
        row = conn.execute(
            "select turns_at_summary, summarised_through from harbor.session_state"
            " where session_id = %s",
            (session,),
        ).fetchone()
    assert row is not None
    return row


def turn_ids(db: PgDatabase, session: str = "s1") -> list[int]:
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select id from harbor.messages where session_id = %s order by id", (session,)
        ).fetchall()
    return [r[0] for r in rows]


def as_app(db: PgDatabase, owner: MemoryOwner) -> psycopg.Connection[Any]:
    """A connection of the application role with ``owner``'s identity set for its first
    transaction."""
    conn = psycopg.connect(db.app_url)
    conn.execute(
        "select set_config('harbor.tenant_id', %s, true),"
        " set_config('harbor.principal_id', %s, true),"
        " set_config('harbor.session_id', %s, true)",
        (owner.tenant_id, owner.principal_id, owner.session_id),
    )
    return conn


def due_both_ways(db: PgDatabase, owner: MemoryOwner = OWNER) -> tuple[bool, bool]:
    """The rule as the application asks it (harbor.summary_due_rows, cooldown 0), with the
    recorded last turn and with it cleared in a transaction rolled back."""
    with as_app(db, owner) as conn:
        ask = (
            "select due from harbor.summary_due_rows(%s, %s, %s, %s, 0)",
            (owner.tenant_id, owner.principal_id, owner.session_id, MIN_TURNS),
        )
        row = conn.execute(*ask).fetchone()
        assert row is not None
        with_mark = bool(row[0])
        conn.execute("update harbor.session_state set summarised_through = null")
        row = conn.execute(*ask).fetchone()
        assert row is not None
        counted = bool(row[0])
        conn.rollback()
    return with_mark, counted


async def append(store: PostgresShortTermStore, n: int, owner: MemoryOwner = OWNER) -> None:
    for i in range(n):
        await store.append(owner, ConversationMessage(role="user", content=f"turn {i}"))


async def summarise(store: PostgresShortTermStore, owner: MemoryOwner = OWNER) -> int:
    """Take the lease and finish it with the count it took, as a completed summary does."""
    lease = await store.acquire_summary_lease(
        owner, min_turns=MIN_TURNS, cooldown_seconds=0, lease_seconds=60
    )
    assert lease is not None
    assert await store.finish_summary_lease(owner, lease, turns_at_summary=lease.turns)
    return lease.turns


async def test_a_summary_records_its_last_turn_and_the_rule_counts_only_later_ones(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresShortTermStore(database)
    await append(store, 12)
    assert await summarise(store) == 12
    assert state(fresh_db) == {"turns_at_summary": 12, "summarised_through": turn_ids(fresh_db)[11]}
    # not due until MIN_TURNS more, due from then on: the same answers as counting them all
    for new in range(1, 8):
        await append(store, 1)
        assert due_both_ways(fresh_db) == (new >= MIN_TURNS,) * 2, new
    assert await summarise(store) == 19
    assert state(fresh_db) == {"turns_at_summary": 19, "summarised_through": turn_ids(fresh_db)[18]}
    assert due_both_ways(fresh_db) == (False, False)


async def test_deleting_turns_forgets_the_last_turn_and_the_rule_counts_every_turn(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresShortTermStore(database)
    await append(store, 12)
    await summarise(store)
    await append(store, 2)
    oldest = turn_ids(fresh_db)[:5]
    # the application deletes five of its own turns, in a statement of its own
    with as_app(fresh_db, OWNER) as conn:
        deleted = conn.execute("delete from harbor.messages where id = any(%s)", (oldest,))
        assert deleted.rowcount == 5
    assert state(fresh_db) == {"turns_at_summary": 12, "summarised_through": None}
    # 9 turns, fewer than the 12 summarised: due by the counting rule (two turns after
    # the old mark would not have been)
    assert due_both_ways(fresh_db) == (True, True)
    # the next summary records a mark again
    assert await summarise(store) == 9
    assert state(fresh_db) == {"turns_at_summary": 9, "summarised_through": turn_ids(fresh_db)[8]}
    assert due_both_ways(fresh_db) == (False, False)


async def test_an_erasure_by_the_administrator_forgets_the_last_turn(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresShortTermStore(database)
    await append(store, 8)
    await summarise(store)
    assert state(fresh_db)["summarised_through"] is not None
    with psycopg.connect(fresh_db.admin_url, autocommit=True) as conn:
        conn.execute("set harbor.tenant_id = 't1'")
        conn.execute("delete from harbor.messages where session_id = 's1'")
    assert state(fresh_db)["summarised_through"] is None


async def test_a_finish_after_turns_were_deleted_records_no_last_turn(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresShortTermStore(database)
    await append(store, 8)
    lease = await store.acquire_summary_lease(
        OWNER, min_turns=MIN_TURNS, cooldown_seconds=0, lease_seconds=60
    )
    assert lease is not None and lease.turns == 8
    # the application deletes one of its turns while the summary runs
    with as_app(fresh_db, OWNER) as conn:
        conn.execute("delete from harbor.messages where id = %s", (turn_ids(fresh_db)[3],))
    assert await store.finish_summary_lease(OWNER, lease, turns_at_summary=lease.turns)
    assert state(fresh_db) == {"turns_at_summary": 8, "summarised_through": None}
    # 7 turns, fewer than at the summary: due by the counting rule, with or without a mark
    assert due_both_ways(fresh_db) == (True, True)


async def test_another_session_learns_nothing_from_the_count(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresShortTermStore(database)
    await append(store, 12)
    await summarise(store)
    await append(store, MIN_TURNS)
    # bob asks about alice's session: her turns are not his to count, with or without
    # the mark (the count is 0; no session_state row of his)
    with as_app(fresh_db, OTHER) as conn:
        row = conn.execute(
            "select harbor._session_turns_since_summary('t1', 'alice', 's1', 100)"
        ).fetchone()
        assert row == (None,)
        row = conn.execute(
            "select due from harbor.summary_due_rows('t1', 'alice', 's1', 1, 0)"
        ).fetchone()
        assert row == (False,)
