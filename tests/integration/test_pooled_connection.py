"""A pooled connection's way back to the pool: a transaction its user left open is
committed on a normal exit and rolled back on an error, as psycopg's own connection
context does; the connection comes back idle and usable either way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import psycopg.rows
import pytest
import pytest_asyncio

from harbor_pg import MemoryOwner
from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryError
from tests.conftest import PgDatabase

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")
IDLE = psycopg.pq.TransactionStatus.IDLE


@pytest_asyncio.fixture
async def single(fresh_db: PgDatabase) -> AsyncIterator[Database]:
    # one connection: each use below gets the connection the one before it returned
    db = Database(fresh_db.app_url, min_size=1, max_size=1)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


async def _probe(db: Database) -> str | None:
    async with db.autocommit() as conn:
        assert conn.info.transaction_status == IDLE
        row = await (
            await conn.execute("select current_setting('harbor.probe', true) as v")
        ).fetchone()
        return None if row is None else row["v"]


async def test_a_transaction_left_open_is_committed(single: Database) -> None:
    async with single.autocommit() as conn:
        await conn.execute("begin")
        await conn.execute("select set_config('harbor.probe', 'kept', false)")
        assert conn.info.transaction_status != IDLE
    assert await _probe(single) == "kept"


async def test_an_error_rolls_the_open_transaction_back(single: Database) -> None:
    with pytest.raises(RuntimeError, match="the caller failed"):
        async with single.autocommit() as conn:
            await conn.execute("begin")
            await conn.execute("select set_config('harbor.probe', 'dropped', false)")
            raise RuntimeError("the caller failed")
    assert await _probe(single) in (None, "")


async def test_an_idle_connection_goes_back_as_it_was(single: Database) -> None:
    async with single.autocommit() as conn:
        await conn.execute("select set_config('harbor.probe', 'session', false)")
        assert conn.info.transaction_status == IDLE
    assert await _probe(single) == "session"
    # and the one-round-trip calls, which leave it idle too, keep working on it
    rows = await single.fetch_in_one_round_trip(
        OWNER, "select current_setting('harbor.tenant_id') as t where %(x)s::int = 1", {"x": 1}
    )
    assert rows == [{"t": "t1"}]
    assert await _probe(single) == "session"


# -- one round trip: the identity and the call's statements, sent in one write ---------


async def _prepared_here(db: Database) -> list[str]:
    async with db.autocommit() as conn:
        cur = await conn.execute(
            "select statement from pg_prepared_statements where name like '\\_harbor\\_%%'"
            " order by statement",
            prepare=False,
        )
        return [row["statement"] for row in await cur.fetchall()]


async def test_each_statement_returns_its_own_rows(single: Database) -> None:
    rows = await single.fetch_each_in_one_round_trip(
        OWNER,
        [
            ("select %(a)s::int as a", {"a": 1}),
            ("select current_setting('harbor.user_id') as u where %(x)s::int = 1", {"x": 1}),
            ("select g as n from generate_series(1, %(n)s::int) g", {"n": 3}),
        ],
    )
    assert rows == [[{"a": 1}], [{"u": "u1"}], [{"n": 1}, {"n": 2}, {"n": 3}]]
    # a statement with no parameters goes through psycopg's own pipeline, as before
    assert await single.fetch_in_one_round_trip(OWNER, "select 2 as b") == [{"b": 2}]


async def test_rows_come_back_as_psycopgs_dict_rows(single: Database) -> None:
    # the rows of a one-round-trip call are read from the result without a cursor: the
    # same dicts as psycopg's dict_row cursor gives, for every kind of value a memory
    # row holds, NULLs, several rows and a name used twice (the last value wins)
    text = """
        select g as n, %(t)s::text as t, null::text as missing, array['a', null, 'c'] as arr,
               '{"k": [1, 2.5, null]}'::jsonb as doc,
               '2026-01-02 03:04:05.678+00'::timestamptz as ts,
               tstzrange('2026-01-01', null) as valid, 0.3::real as importance,
               'user'::harbor.memory_scope as scope, true as flag, 'x' as dup, 'y' as dup
          from generate_series(1, 2) g"""
    got = await single.fetch_in_one_round_trip(OWNER, text, {"t": "zaï"})
    async with single.autocommit() as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute(text, {"t": "zaï"})
        expected = await cur.fetchall()
    assert got == expected
    assert len(got) == 2 and got[1]["n"] == 2 and got[0]["dup"] == "y"
    assert got[0]["arr"] == ["a", None, "c"] and got[0]["doc"] == {"k": [1, 2.5, None]}


async def test_statements_are_prepared_from_their_first_run(single: Database) -> None:
    text = "select %(a)s::int + 1 as b"
    assert await single.fetch_in_one_round_trip(OWNER, text, {"a": 1}) == [{"b": 2}]
    prepared = await _prepared_here(single)
    assert "select $1::int + 1 as b" in prepared
    assert any("harbor.tenant_id" in statement for statement in prepared)  # the identity's


async def test_statements_dropped_under_the_connection_are_prepared_again(
    single: Database,
) -> None:
    text = "select %(a)s::int * 2 as b"
    assert await single.fetch_in_one_round_trip(OWNER, text, {"a": 2}) == [{"b": 4}]
    async with single.autocommit() as conn:
        await conn.execute("deallocate all")
    assert await _prepared_here(single) == []
    assert await single.fetch_in_one_round_trip(OWNER, text, {"a": 3}) == [{"b": 6}]
    assert "select $1::int * 2 as b" in await _prepared_here(single)


async def test_an_error_rolls_back_the_whole_trip_and_leaves_the_connection_usable(
    single: Database,
) -> None:
    with pytest.raises(MemoryError) as failed:
        await single.fetch_each_in_one_round_trip(
            OWNER,
            [
                ("select set_config('harbor.probe', %(v)s::text, false)", {"v": "written"}),
                ("select 1 / %(z)s::int as boom", {"z": 0}),
                ("select set_config('harbor.probe', %(v)s::text, false)", {"v": "after"}),
            ],
        )
    assert "division by zero" in str(failed.value)
    # nothing of the trip stayed: not the identity, not the statement before the error
    async with single.autocommit() as conn:
        assert conn.info.transaction_status == IDLE
        row = await (
            await conn.execute(
                "select current_setting('harbor.probe', true) as p,"
                " current_setting('harbor.tenant_id', true) as t"
            )
        ).fetchone()
    assert row is not None and row["p"] in (None, "") and row["t"] in (None, "")
    # a guard that fails stops the statement after it, in the same trip
    with pytest.raises(MemoryError):
        await single.fetch_in_one_round_trip(
            OWNER,
            "select set_config('harbor.probe', %(v)s::text, false)",
            {"v": "guarded"},
            guards=[("select 1 / %(z)s::int", {"z": 0})],
        )
    assert await _probe(single) in (None, "")
    assert await single.fetch_in_one_round_trip(OWNER, "select %(a)s::int as a", {"a": 5}) == [
        {"a": 5}
    ]


async def test_a_call_cancelled_in_flight_costs_its_connection_not_the_next_call(
    single: Database,
) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(
            single.fetch_in_one_round_trip(
                OWNER, "select pg_sleep(%(s)s::float8) as slept", {"s": 2.0}
            ),
            0.3,
        )
    # the cut-off connection was closed and replaced: the next call runs normally
    rows = await single.fetch_in_one_round_trip(OWNER, "select %(a)s::int as a", {"a": 7})
    assert rows == [{"a": 7}]
    assert await _probe(single) in (None, "")


async def test_a_statement_that_sets_its_own_identity_runs_alone(single: Database) -> None:
    rows = await single.fetch_self_identified(
        "select %(a)s::int as a, %(a)s::int + %(b)s::int as b,"
        " current_setting('harbor.tenant_id', true) as t",
        {"a": 1, "b": 2},
    )
    # no identity was set for it: it is the statement's own business
    assert rows == [{"a": 1, "b": 3, "t": None}] or rows == [{"a": 1, "b": 3, "t": ""}]
    assert await single.fetch_self_identified(
        "select x from (values (1), (2)) v(x) where x > %(n)s::int order by x", {"n": 0}
    ) == [{"x": 1}, {"x": 2}]
    assert await single.fetch_self_identified("select 1 as x where %(n)s::int < 0", {"n": 0}) == []
    with pytest.raises(MemoryError, match="division by zero"):
        await single.fetch_self_identified("select 1 / %(z)s::int", {"z": 0})
    assert await _probe(single) in (None, "")
