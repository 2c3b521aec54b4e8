"""Turns appended concurrently to one session can be followed with a cursor.

A reader that pages with ``id > cursor`` (the rolling summary's frontier does)
must never skip a turn: within a session a turn's id must be in commit order,
or a turn that draws a smaller id but commits later lands behind the cursor.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from harbor_pg import ConversationMessage, MemoryOwner
from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.conftest import PgDatabase

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")
WRITERS = 6
PER_WRITER = 25


def _params(i: int, n: int) -> dict[str, Any]:
    return {
        "tenant_id": "t1",
        "user_id": "u1",
        "session_id": "s1",
        "project_id": "",
        "principal_id": "u1",
        "role": "user",
        "content": f"writer {i} turn {n}",
        "name": None,
        "tool_calls": Jsonb([]),
        "tool_call_id": None,
        "metadata": Jsonb({}),
        "token_estimate": 3,
    }


def _identity(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "select harbor.set_identity('t1', principal_id => 'u1', session_id => 's1',"
        " is_local => true)"
    )


def _follow(url: str, stop: threading.Event, seen: list[int]) -> None:
    """Page through the session with a cursor, as the summary's catch-up does."""
    cursor = 0
    with psycopg.connect(url, row_factory=dict_row) as conn:
        while True:
            finishing = stop.is_set()
            with conn.transaction():
                _identity(conn)
                rows = conn.execute(
                    query("messages_after"),
                    {
                        "tenant_id": "t1",
                        "user_id": "u1",
                        "session_id": "s1",
                        "after_id": cursor,
                        "before_id": None,
                        "limit": 1000,
                    },
                ).fetchall()
            for row in rows:
                seen.append(int(row["id"]))
                cursor = int(row["id"])
            if finishing and not rows:
                return


def test_a_cursor_misses_no_turn_of_slow_committing_writers(fresh_db: PgDatabase) -> None:
    """Writers whose commits take a moment after the append (a busy disk): a turn
    that drew a smaller id must not commit after one with a larger id is seen."""
    appended: list[int] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        with psycopg.connect(fresh_db.app_url, row_factory=dict_row) as conn:
            for n in range(PER_WRITER):
                with conn.transaction():
                    _identity(conn)
                    row = conn.execute(query("append_message"), _params(i, n)).fetchone()
                    assert row is not None
                    time.sleep(0.002 * ((i + n) % 3))
                with lock:
                    appended.append(int(row["id"]))

    stop = threading.Event()
    seen: list[int] = []
    reader = threading.Thread(target=_follow, args=(fresh_db.app_url, stop, seen))
    reader.start()
    writers = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(120)
    stop.set()
    reader.join(120)
    assert len(appended) == WRITERS * PER_WRITER
    assert sorted(seen) == seen  # the cursor moves forward only
    assert set(seen) == set(appended), f"{len(set(appended) - set(seen))} turns skipped"


async def follow_concurrent_appends(
    store: PostgresShortTermStore, owner: MemoryOwner, writers: int, per_writer: int
) -> tuple[list[int], set[int]]:
    """``writers`` tasks each append ``per_writer`` turns to ``owner``'s session through
    ``store`` while a reader follows the session by id > cursor; the ids the reader saw,
    in its order, and the ids the appends returned."""
    seen: list[int] = []
    done = asyncio.Event()

    async def follow() -> None:
        cursor = 0
        while True:
            finishing = done.is_set()
            page = await store.after(owner, cursor, 1000)
            for m in page:
                assert m.id is not None
                seen.append(int(m.id))
                cursor = int(m.id)
            if finishing and not page:
                return
            await asyncio.sleep(0)

    async def write(i: int) -> list[int]:
        ids = []
        for n in range(per_writer):
            stored = await store.append(
                owner, ConversationMessage(role="user", content=f"writer {i} turn {n}")
            )
            ids.append(int(stored.id or 0))
        return ids

    reader = asyncio.create_task(follow())
    written = await asyncio.gather(*(write(i) for i in range(writers)))
    done.set()
    await reader
    return seen, {i for ids in written for i in ids}


async def test_concurrent_appends_through_the_store_are_followed_without_gaps(
    fresh_db: PgDatabase,
) -> None:
    db = Database(fresh_db.app_url, min_size=4, max_size=4)
    await db.open()
    try:
        seen, appended = await follow_concurrent_appends(
            PostgresShortTermStore(db), OWNER, WRITERS, PER_WRITER
        )
    finally:
        await db.close()
    assert len(appended) == WRITERS * PER_WRITER
    assert set(seen) == appended
