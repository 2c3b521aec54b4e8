"""On the cluster, with GLOBAL memories stored, the facade's search is two commands: one
call that Citus delegates to the tenant's worker (harbor.search_delegated,
sql/citus/search.sql) for the tenant's memories, whose last row, all null, says that global
memories may exist, and then one statement routed to the global memories' node; each
reaches one node, and together they answer as one server's search does (the merge holds its
order; with none stored, the first alone: tests/citus/test_cluster_global_flag.py). The
identity the call carries as arguments is checked on the worker against the caller's
binding, so a bound role that names another tenant or user is refused before anything is
read."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import GLOBAL_FLAG_SET, HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries, _save

ANN = MemoryOwner(tenant_id="search-a", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="search-b", principal_id="bob", session_id="s1")
CARL = MemoryOwner(tenant_id="search-a", principal_id="carl", session_id="s1")
ROLE = "harbor_test_search_bound"
GLOBAL = "global: the searched harbor"


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> Iterator[ClusterDatabase]:
    _save(cluster_db.app_url, ANN, "ann: the searched harbor")
    _save(cluster_db.app_url, BOB, "bob: the searched harbor")
    _save(cluster_db.app_url, CARL, "carl: the searched harbor")
    with psycopg.connect(cluster_db.superuser_url) as conn:
        conn.execute(GLOBAL_FLAG_SET)
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values ('', 'global', '', 'admin', %s, repeat('7', 64))",
            (GLOBAL,),
        )
    yield cluster_db
    with psycopg.connect(cluster_db.superuser_url) as conn:  # (a database the tests share)
        conn.execute("delete from harbor.memories where content = %s", (GLOBAL,))


def _params(owner: MemoryOwner, **overrides: Any) -> dict[str, Any]:
    """search_delegated's parameters for ``owner`` (``overrides``: what an attacker
    changes)."""
    return {
        "query": "searched harbor",
        "as_of": None,
        "limit": 10,
        **carried_identity(owner),
        **overrides,
    }


def test_the_facades_search_is_a_call_on_the_tenants_worker_then_one_for_the_global_rows(
    stored: ClusterDatabase,
) -> None:
    async def run(manager: MemoryManager) -> None:
        found = await manager.search(ANN, "searched harbor")
        # the caller's own memory and the global one; not carl's, not bob's
        assert sorted(m.content for m in found) == sorted([GLOBAL, "ann: the searched harbor"])

    sent = asyncio.run(_facade_commands(stored, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 2, sent
    tenant = [(to, c) for to, c in sent if "search_delegated" in c]
    shared = [(to, c) for to, c in sent if "search_delegated" not in c]
    assert [to for to, _ in tenant] == [stored.node_of(ANN.tenant_id).port]
    assert re.match(r"SELECT .* FROM harbor\.search_delegated\('search-a'::text", tenant[0][1])
    assert [to for to, _ in shared] == [stored.node_of("").port]


def test_the_delegated_search_answers_as_the_coordinators_statement(
    stored: ClusterDatabase,
) -> None:
    # every column, from the delegated call in autocommit (the shard table's prepared
    # statement on the worker) and from the same function in a transaction (not delegated
    # there: Citus delegates a call outside a transaction block; the coordinator's statement)
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        delegated = conn.execute(query("search_delegated"), _params(ANN)).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        coordinated = conn.execute(query("search_delegated"), _params(ANN)).fetchall()
    assert delegated == coordinated
    # (and the marker that global memories may exist: a last row, every column null)
    assert [r[9] for r in delegated] == ["ann: the searched harbor", None]
    assert set(delegated[-1]) == {None}


def test_the_global_statement_reads_the_global_rows_alone(stored: ClusterDatabase) -> None:
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        rows = conn.execute(query("search_global"), _params(ANN)).fetchall()
    assert [r[9] for r in rows] == [GLOBAL]


@pytest.fixture(scope="module")
def bound_role(stored: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant search-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(stored, ROLE, "search-a", "ann") as role:
        yield role


def test_a_bound_role_searches_its_own_memories(stored: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(stored.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("search_delegated"), _params(ANN)).fetchall()
    assert [r[9] for r in rows] == ["ann: the searched harbor", None]


ATTACKS = attacks("search-b")


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
        stored, bound_role, query("search_delegated"), _params(ANN, **ATTACKS[attack]), how
    )
