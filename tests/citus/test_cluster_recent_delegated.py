"""On the cluster, the facade reads a session's newest turns in one call that Citus
delegates to the tenant's worker (harbor.recent_turns_delegated, sql/citus/recent.sql):
one command to one node, with no BEGIN, SET LOCAL or COMMIT, answering as the
coordinator's statement and as one server's recent_turns do, with or without a session
TTL. The identity the call carries as arguments is checked on the worker against the
caller's binding, so a bound role that names another tenant, user or session is refused
before anything is read."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="recent-a", principal_id="ann", session_id="s1")
ANN_OTHER_SESSION = MemoryOwner(tenant_id="recent-a", principal_id="ann", session_id="s2")
BOB = MemoryOwner(tenant_id="recent-b", principal_id="bob", session_id="s1")
CARL = MemoryOwner(tenant_id="recent-a", principal_id="carl", session_id="s1")
ROLE = "harbor_test_recent_bound"
TURNS = [f"ann: turn {i}" for i in range(5)]


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> ClusterDatabase:
    async def write() -> None:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db)
        try:
            for content in TURNS:
                await manager.append(ANN, ConversationMessage(role="user", content=content))
            await manager.append(
                ANN_OTHER_SESSION, ConversationMessage(role="user", content="ann: elsewhere")
            )
            await manager.append(BOB, ConversationMessage(role="user", content="bob: a turn"))
            await manager.append(CARL, ConversationMessage(role="user", content="carl: a turn"))
        finally:
            await manager.close()
            await db.close()

    asyncio.run(write())
    return cluster_db


def _params(owner: MemoryOwner, **overrides: Any) -> dict[str, Any]:
    """recent_turns_delegated's parameters for ``owner`` (``overrides``: what an attacker
    changes)."""
    return {"limit": 3, "ttl_seconds": None, **carried_identity(owner), **overrides}


def _contents(rows: list[Any]) -> list[str]:
    return [r[2] for r in rows]


def test_the_facades_recent_is_one_call_on_the_tenants_worker(stored: ClusterDatabase) -> None:
    found: list[ConversationMessage] = []

    async def run(manager: MemoryManager) -> None:
        found.extend(await manager.recent(ANN, 3))

    sent = asyncio.run(_facade_commands(stored, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == stored.node_of(ANN.tenant_id).port
    assert re.match(r"SELECT .* FROM harbor\.recent_turns_delegated\('recent-a'::text", command)
    # the session's newest three, oldest first: not its other session's, not carl's
    assert [m.content for m in found] == TURNS[-3:]


@pytest.mark.parametrize("ttl_seconds", [None, 3600.0, 0.0])
def test_the_delegated_call_answers_as_the_coordinators_statement_and_one_servers(
    stored: ClusterDatabase, ttl_seconds: float | None
) -> None:
    # every column, from the delegated call in autocommit (the shard table's prepared
    # statement on the worker) and from the same function in a transaction (Citus
    # delegates a call outside a transaction block only: the coordinator's statement),
    # and from one server's statements (recent_turns, recent_live_turns) under the same
    # identity
    params = _params(ANN, ttl_seconds=ttl_seconds)
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        delegated = conn.execute(query("recent_turns_delegated"), params).fetchall()
        # (twice: the second call runs the statement prepared by the first)
        again = conn.execute(query("recent_turns_delegated"), params).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        coordinated = conn.execute(query("recent_turns_delegated"), params).fetchall()
    name = "recent_turns" if ttl_seconds is None else "recent_live_turns"
    with psycopg.connect(stored.app_url) as conn:
        for setting, value in carried_identity(ANN).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        one_server = conn.execute(query(name), params).fetchall()
    assert delegated == again == coordinated == one_server
    # a TTL of 0 s: the gap from the newest turn to now already expired the session
    expected = [] if ttl_seconds == 0.0 else TURNS[-3:]
    assert _contents(delegated) == expected


@pytest.fixture(scope="module")
def bound_role(stored: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant recent-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(stored, ROLE, "recent-a", "ann") as role:
        yield role


def test_a_bound_role_reads_its_own_turns(stored: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(stored.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("recent_turns_delegated"), _params(ANN)).fetchall()
    assert _contents(rows) == TURNS[-3:]


ATTACKS = attacks("recent-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    stored: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, whatever the way
    assert_refused(
        stored,
        bound_role,
        query("recent_turns_delegated"),
        _params(ANN, **ATTACKS[attack]),
        how,
    )


def test_a_worker_connection_prepares_again_what_an_older_version_prepared(
    stored: ClusterDatabase,
) -> None:
    # the call prepares its statement once a connection and marks the connection with the
    # version of the Citus forms (harbor._prepared_on_shard): a connection marked by
    # another version, holding another statement under the name, gets this version's
    # statement again (as after `harbor-pg distribute` changed the files), and its answer
    node = stored.node_of(ANN.tenant_id)
    index = [w.port for w in stored.cluster.workers].index(node.port)
    with psycopg.connect(stored.worker_url(index, "harbor_app"), autocommit=True) as conn:
        first = conn.execute(query("recent_turns_delegated"), _params(ANN)).fetchall()
        [(name,)] = conn.execute(
            "select name from pg_prepared_statements where name like 'harbor_recent_%'"
        ).fetchall()
        mark = f"harbor.prepared_{name}"
        version = conn.execute("select current_setting(%s)", (mark,)).fetchone()
        assert version is not None and re.fullmatch(r"[0-9a-f]{16}", version[0])
        # an older version's mark and statement (under the same name, answering nothing)
        conn.execute(f"deallocate {name}")
        conn.execute(
            f"prepare {name}(text, text, text, integer, double precision) as"
            " select null::bigint, null::text, null::text, null::text, null::jsonb,"
            " null::text, null::jsonb, null::timestamptz where false"
        )
        conn.execute("select set_config(%s, 'an older one', false)", (mark,))
        again = conn.execute(query("recent_turns_delegated"), _params(ANN)).fetchall()
        assert conn.execute("select current_setting(%s)", (mark,)).fetchone() == version
    assert _contents(first) == _contents(again) == TURNS[-3:]
    assert first == again
