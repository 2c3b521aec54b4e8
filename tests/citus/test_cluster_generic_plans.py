"""On the tenant's worker, the statements a delegated append, recent, save, search or read
prepares on
the tenant's shard tables run their generic plans: planned once a connection, not again at
each call (sql/citus/delegated.sql). PostgreSQL's default planned each of them at every
call, estimating their generic plans dearer; these calls set plan_cache_mode for them,
and keep it off the statements Citus plans on a distributed table, which it cannot plan
generically (a summarised session's count, a save's vectors and their owner trigger)."""

from __future__ import annotations

from typing import Any

import psycopg

from harbor_pg.db.connection import carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import MemoryVectors, _delegated_save_params, _one_params
from harbor_pg.tiers.rows import current_memories_params, memory_params
from tests.citus.conftest import ClusterDatabase
from tests.citus.test_cluster_append import _call, _summarised_session, _worker_of

CALLS = 7  # more than the five custom plans PostgreSQL's default makes before it compares


def _plans(conn: psycopg.Connection[Any], prefix: str) -> dict[str, tuple[int, int]]:
    """{name: (generic plans, custom plans)} of the connection's statements named
    ``prefix``..."""
    return {
        str(name): (int(generic), int(custom))
        for name, generic, custom in conn.execute(
            "select name, generic_plans, custom_plans from pg_prepared_statements"
            " where name like %s",
            (prefix + "%",),
        ).fetchall()
    }


def test_an_append_and_a_recent_run_their_statements_generic_plans(
    cluster_db: ClusterDatabase,
) -> None:
    # a session's turns appended with the summary check (its state and count
    # statements run too), then its newest turns read, each call on the worker's
    # connection: every statement the calls ran was planned once, generically
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-generic")
    with psycopg.connect(_worker_of(cluster_db, owner.tenant_id, "harbor_app")) as conn:
        conn.autocommit = True
        for n in range(CALLS):
            row = conn.execute(
                query("append_turn_delegated"),
                _call(owner, f"turn {n}", min_turns=50, cooldown_seconds=60.0),
            ).fetchone()
            assert row is not None and row[2] is False
        recent = [
            conn.execute(
                query("recent_turns_delegated"),
                {"limit": 3, "ttl_seconds": None, **carried_identity(owner)},
            ).fetchall()
            for _ in range(CALLS)
        ]
        appended = _plans(conn, "harbor_append_")
        read = _plans(conn, "harbor_recent_")
    assert [r[2] for r in recent[-1]] == [f"turn {n}" for n in range(CALLS - 3, CALLS)]
    ran = {name: plans for name, plans in appended.items() if sum(plans)}
    # the append in one statement, then the session's summary state and its count
    assert {name.rsplit("_", 1)[0] for name in ran} == {
        "harbor_append_one",
        "harbor_append_state",
        "harbor_append_count",
    }, appended
    assert all(custom == 0 and generic == CALLS for generic, custom in ran.values()), appended
    [(generic, custom)] = read.values()
    assert (generic, custom) == (CALLS, 0), read


def test_a_summarised_sessions_count_is_still_planned_by_citus(
    cluster_db: ClusterDatabase,
) -> None:
    # the count of a summarised session's turns reads the distributed table on the
    # worker, which Citus cannot plan generically: the append still answers
    owner = _summarised_session(cluster_db, "s-generic-count")
    with psycopg.connect(_worker_of(cluster_db, owner.tenant_id, "harbor_app")) as conn:
        conn.autocommit = True
        rows = [
            conn.execute(
                query("append_turn_delegated"),
                _call(owner, f"counted {n}", min_turns=11 + n, cooldown_seconds=60.0),
            ).fetchone()
            for n in range(CALLS)
        ]
    # 11 turns since the summary with the first: due at 11; then 12 at 12, ...
    assert all(row is not None and row[2] is True for row in rows), rows


def test_a_saves_insert_runs_its_generic_plan(cluster_db: ClusterDatabase) -> None:
    # memories saved with both vectors: the insert into the shard table was planned once;
    # the vectors' insert (whose owner trigger reads the distributed table) as before
    owner = MemoryOwner(tenant_id="save-a", principal_id="ann", session_id="s-generic")

    def params(n: int) -> dict[str, Any]:
        memory = Memory(content=f"ann: generic plan {n}", context="the turn before")
        one = _one_params(
            memory_params(owner, memory), MemoryVectors([1.0, 0.0], [0.6, 0.8]), "test-model"
        )
        return {**_delegated_save_params(owner, memory_params(owner, memory), None, None), **one}

    with psycopg.connect(_worker_of(cluster_db, owner.tenant_id, "harbor_app")) as conn:
        conn.autocommit = True
        saved = [
            conn.execute(query("save_memory_delegated"), params(n)).fetchone() for n in range(CALLS)
        ]
        plans = _plans(conn, "harbor_save_")
    assert all(row is not None and row[-1] is True for row in saved), saved
    [insert] = [p for name, p in plans.items() if name.startswith("harbor_save_insert_")]
    assert insert == (CALLS, 0), plans
    [vectors] = [p for name, p in plans.items() if name.startswith("harbor_save_vectors_")]
    assert sum(vectors) == CALLS, plans


def test_a_search_runs_its_generic_plan(cluster_db: ClusterDatabase) -> None:
    # the search on the tenant's shard table was planned once; its answer is the same
    # at every call
    owner = MemoryOwner(tenant_id="save-a", principal_id="ann", session_id="s-generic")
    params = {
        "tenant_id": owner.tenant_id,
        "query": "ann generic plan",
        "as_of": None,
        "limit": 5,
        **carried_identity(owner),
    }
    with psycopg.connect(cluster_db.app_url, autocommit=True) as app:
        app.execute(
            query("save_memory_delegated"),
            _delegated_save_params(
                owner, memory_params(owner, Memory(content="ann: a generic plan found")), None, None
            ),
        )
    with psycopg.connect(_worker_of(cluster_db, owner.tenant_id, "harbor_app")) as conn:
        conn.autocommit = True
        found = [conn.execute(query("search_delegated"), params).fetchall() for _ in range(CALLS)]
        plans = _plans(conn, "harbor_search_")
    assert found[0] and all(rows == found[0] for rows in found), found
    assert "ann: a generic plan found" in [r[9] for r in found[0]]
    [(generic, custom)] = plans.values()
    assert (generic, custom) == (CALLS, 0), plans


def test_the_reads_run_their_statements_generic_plans(cluster_db: ClusterDatabase) -> None:
    # a memory and three turns of ann's session, then each read of the tenant's shard
    # tables called again and again on the worker's connection: each statement was
    # planned once, and answered the same at every call
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-reads")
    with psycopg.connect(cluster_db.app_url, autocommit=True) as app:
        [saved] = app.execute(
            query("save_memory_delegated"),
            _delegated_save_params(
                owner, memory_params(owner, Memory(content="ann: read back")), None, None
            ),
        ).fetchall()
        turns = [
            app.execute(query("append_turn_delegated"), _call(owner, f"turn {n}")).fetchone()
            for n in range(3)
        ]
    memory_id, first_turn = saved[0], turns[0][0]  # type: ignore[index]
    keys = current_memories_params(owner, [MemoryScope.USER], 100)
    assert keys is not None
    identity = carried_identity(owner)
    reads = {
        "get": ("get_memories_delegated", {"ids": [memory_id]}),
        "current": ("current_memories_delegated", keys),
        "history": ("memory_history_delegated", {"id": memory_id}),
        "messages_after": (
            "messages_after_delegated",
            {"after_id": 0, "before_id": None, "limit": 100},
        ),
        "turns_through": ("turns_through_delegated", {"message_id": first_turn, "limit": 10}),
        "working": ("working_state_delegated", {}),
        "summary": ("session_summary_delegated", {}),
    }
    with psycopg.connect(_worker_of(cluster_db, owner.tenant_id, "harbor_app")) as conn:
        conn.autocommit = True
        answers = {
            read: [
                conn.execute(query(name), {**params, **identity}).fetchall() for _ in range(CALLS)
            ]
            for read, (name, params) in reads.items()
        }
        plans = {
            read: conn.execute(
                "select generic_plans, custom_plans from pg_prepared_statements where name ~ %s",
                (f"^harbor_{read}_[0-9]+$",),
            ).fetchall()
            for read in reads
        }
    assert all(all(a == got[0] for a in got) for got in answers.values()), answers
    assert answers["get"][0] and answers["history"][0] and answers["current"][0]
    assert len(answers["messages_after"][0]) == 3 and len(answers["turns_through"][0]) == 1
    assert plans == {read: [(CALLS, 0)] for read in reads}, plans
