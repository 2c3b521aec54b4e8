"""A rolling summary's id is keyed to its whole owner: no one can see or block another's.

The id used to be ``summary:<session_id>`` (falling back to a per-user variant
when another user's row held it), so it named the session, and another user
of the tenant who knew a session id could store rows under both ids first:
the victim's summary was then never written, and the unique violation told
the attacker that the id was in use. Now the database gives every SESSION
summary the id of its own owner fields (``harbor.summary_id``) and refuses
the ``summary:`` prefix on every other row, so the attacker (user u2 of the
same tenant, as a bound role and as the application role) can neither take
the victim's id nor learn the victim's session from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory, MemoryType
from harbor_pg.tiers.base import summary_memory_id
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.conftest import PgDatabase
from tests.security.conftest import (
    bind,
    connect,
    create_login_roles,
    drop_roles,
    refused_by,
    show_every_shard,
)

ATTACKER_ROLE = "harbor_test_summary_squatter"
# a session id the attacker must not learn (unique: any copy of it is a leak)
SECRET_SESSION = "victim-session-5d1e9c"
VICTIM = MemoryOwner(tenant_id="t1", principal_id="u1", session_id=SECRET_SESSION)
OTHER_SESSION = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="never-summarised")


def _old_ids(owner: MemoryOwner) -> list[str]:
    """The ids a summary of ``owner`` could get before: summary:<session> and the
    per-user variant."""
    base = f"summary:{owner.session_id}"
    digest = hashlib.sha256(f"{owner.tenant_id}\x00{owner.user_id}".encode()).hexdigest()
    return [base, f"{base}:{digest[:16]}"]


@pytest.fixture(params=["bound", "app"])
def squatter(request: pytest.FixtureRequest, fresh_db: PgDatabase) -> Iterator[Any]:
    """User u2 of tenant t1 in a session of its own: a role bound to t1/u2, or the
    application role with that identity."""
    if request.param == "bound":
        create_login_roles(fresh_db, ATTACKER_ROLE)
        bind(fresh_db, ATTACKER_ROLE, "t1", None, "u2")
        conn = connect(fresh_db.url_for(ATTACKER_ROLE), autocommit=True)
        conn.execute("select harbor.set_identity('t1', session_id => 'attacker-session')")
    else:
        conn = connect(fresh_db.app_url, autocommit=True)
        conn.execute(
            "select harbor.set_identity('t1', principal_id => 'u2',"
            " session_id => 'attacker-session')"
        )
    try:
        yield conn
    finally:
        conn.close()
        if request.param == "bound":
            drop_roles(fresh_db, ATTACKER_ROLE)


def _insert(conn: Any, memory_id: str, memory_type: str = "fact", content: str = "x") -> str:
    row = conn.execute(
        "insert into harbor.memories (tenant_id, id, scope, user_id, session_id, principal_id,"
        " memory_type, content, content_hash)"
        " values ('t1', %s, 'session', 'u2', 'attacker-session', coalesce("
        " harbor.caller_principal(), ''), %s::harbor.memory_type, %s, repeat('e', 64))"
        " returning id",
        (memory_id, memory_type, content),
    ).fetchone()
    return str(row[0])


def _summary(owner: MemoryOwner, text: str, frontier: int) -> Memory:
    return Memory(
        id=summary_memory_id(owner),
        scope=MemoryScope.SESSION,
        memory_type=MemoryType.SUMMARY,
        content=text,
        source="summary",
        metadata={"last_covered_message_id": frontier},
    )


async def test_another_user_cannot_pre_take_a_users_summary_id(
    squatter: Any, database: Database, fresh_db: PgDatabase
) -> None:
    targets = [summary_memory_id(VICTIM), *_old_ids(VICTIM)]
    for target in targets:
        # as a memory of its own: the prefix belongs to summaries
        with pytest.raises(errors.CheckViolation) as caught:
            _insert(squatter, target)
        assert refused_by(caught.value) == "memories_summary_id"
        # as a summary of its own: it gets its own owner's id, not the one it asked for
        got = _insert(squatter, target, "summary", f"squatter's summary for {target}")
        assert got == summary_memory_id(
            MemoryOwner(tenant_id="t1", principal_id="u2", session_id="attacker-session")
        )
        squatter.execute("delete from harbor.memories where id = %s", (got,))

    # the victim's summary is written, under the id of the victim's owner
    store = PostgresLongTermStore(database)
    stored = await store.save_summary(
        VICTIM, _summary(VICTIM, "u1 chose the blue plan", 7), expected_frontier=None
    )
    assert stored is not None and stored.id == summary_memory_id(VICTIM)
    loaded = await store.load_summary(VICTIM)
    assert loaded is not None and loaded.content == "u1 chose the blue plan"


def test_a_summary_id_is_no_existence_oracle(squatter: Any, fresh_db: PgDatabase) -> None:
    """The squatter's probe fails the same way whether or not the victim has a summary."""
    with connect(fresh_db.app_url, autocommit=True) as victim:
        victim.execute(
            "select harbor.set_identity('t1', principal_id => 'u1', session_id => %s)",
            (SECRET_SESSION,),
        )
        _victim_summary(victim)
    outcomes = []
    for owner in (VICTIM, OTHER_SESSION):
        with pytest.raises(psycopg.Error) as caught:
            _insert(squatter, summary_memory_id(owner))
        outcomes.append((caught.value.sqlstate, refused_by(caught.value)))
    assert outcomes[0] == outcomes[1] == ("23514", "memories_summary_id")


def _victim_summary(conn: Any) -> str:
    row = conn.execute(
        "insert into harbor.memories (tenant_id, id, scope, user_id, session_id, principal_id,"
        " memory_type, content, content_hash, source, source_session_id)"
        " values ('t1', 'whatever-i-like', 'session', 'u1', %s, 'u1', 'summary',"
        " 'u1 chose the blue plan', repeat('d', 64), 'summary', %s) returning id",
        (SECRET_SESSION, SECRET_SESSION),
    ).fetchone()
    return str(row[0])


def test_the_attacker_cannot_learn_the_victims_session_id(
    squatter: Any, fresh_db: PgDatabase
) -> None:
    with connect(fresh_db.app_url, autocommit=True) as victim:
        victim.execute(
            "select harbor.set_identity('t1', principal_id => 'u1', session_id => %s)",
            (SECRET_SESSION,),
        )
        victim.execute(
            "insert into harbor.messages (tenant_id, user_id, session_id, principal_id, role,"
            " content) values ('t1', 'u1', %s, 'u1', 'user', 'hello')",
            (SECRET_SESSION,),
        )
        summary_id = _victim_summary(victim)
    # the one thing about the row the attacker can learn is its id (ids are not secret:
    # EXPLAIN ANALYZE of a range condition on id counts the rows the policy removed)
    show_every_shard(squatter)
    plan = "\n".join(
        r[0]
        for r in squatter.execute(
            "explain (analyze, costs off, timing off, summary off)"
            " select 1 from harbor.memories where (tenant_id, id) >= ('t1', 'summary:')"
            " and (tenant_id, id) < ('t1', 'summary;')"
        ).fetchall()
    )
    assert "Rows Removed by Filter: 1" in plan  # the enumeration still works ...
    assert summary_id == summary_memory_id(VICTIM)
    assert SECRET_SESSION not in summary_id  # ... and the id names no session
    # nothing else the attacker can read holds it
    for table in (
        "memories",
        "messages",
        "session_state",
        "working_state",
        "role_bindings",
        "current_memories",
    ):
        rows = squatter.execute(f"select t::text from harbor.{table} t").fetchall()
        assert not any(SECRET_SESSION in r[0] for r in rows), table
