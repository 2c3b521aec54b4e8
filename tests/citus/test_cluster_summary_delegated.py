"""On the cluster, the per-turn context reads a session's rolling summary in one call that
Citus delegates to the tenant's worker (harbor.session_summary_delegated,
sql/citus/summary.sql): one command to one node, with no BEGIN, SET LOCAL or COMMIT,
answering as the coordinator's statement and one server's context_load_summary do. The
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

from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory, MemoryType
from harbor_pg.tiers.base import summary_memory_id
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _queries

ANN = MemoryOwner(tenant_id="summary-a", principal_id="ann", session_id="s1")
ANN_OTHER = MemoryOwner(tenant_id="summary-a", principal_id="ann", session_id="s2")
CARL = MemoryOwner(tenant_id="summary-a", principal_id="carl", session_id="s1")
BOB = MemoryOwner(tenant_id="summary-b", principal_id="bob", session_id="s1")
ROLE = "harbor_test_summary_bound"


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> ClusterDatabase:
    # each owner's summary saved as the per-turn context saves it (the application role,
    # its identity set: PostgresLongTermStore.save_summary)
    async def write() -> None:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        store = PostgresLongTermStore(db)
        try:
            for owner, text in (
                (ANN, "ann: the summary of s1"),
                (ANN_OTHER, "ann: the summary of s2"),
                (CARL, "carl: his summary"),
                (BOB, "bob: his summary"),
            ):
                summary = Memory(
                    id=summary_memory_id(owner),
                    scope=MemoryScope.SESSION,
                    memory_type=MemoryType.SUMMARY,
                    content=text,
                    source="summary",
                )
                assert await store.save_summary(owner, summary, expected_frontier=None)
        finally:
            await db.close()

    asyncio.run(write())
    return cluster_db


def _params(owner: MemoryOwner, **overrides: Any) -> dict[str, Any]:
    """session_summary_delegated's parameters for ``owner`` (``overrides``: what an attacker
    changes)."""
    return {**carried_identity(owner), **overrides}


def test_the_summarys_read_is_one_call_on_the_tenants_worker(stored: ClusterDatabase) -> None:
    sent: list[tuple[int, str]] = []
    found: list[Any] = []

    async def run() -> None:
        url = psycopg.conninfo.make_conninfo(
            stored.app_url, options="-c citus.log_remote_commands=on"
        )
        db = Database(url, stored.admin_url, min_size=1, max_size=1)
        await db.open()

        def seen(diag: psycopg.errors.Diagnostic) -> None:
            port = re.search(r"on server \S+@\S+:(\d+)", diag.message_detail or "")
            text = diag.message_primary or ""
            if port and text.startswith("issuing "):
                sent.append((int(port.group(1)), text.removeprefix("issuing ")))

        try:
            async with db.autocommit() as conn:
                conn.add_notice_handler(seen)
            found.append(await PostgresLongTermStore(db).load_summary(ANN))
        finally:
            await db.close()

    asyncio.run(run())
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == stored.node_of(ANN.tenant_id).port
    assert re.match(r"SELECT .* FROM harbor\.session_summary_delegated\('summary-a'::text", command)
    [summary] = found
    assert summary is not None and summary.content == "ann: the summary of s1"


@pytest.mark.parametrize("owner", [ANN, ANN_OTHER], ids=["s1", "s2"])
def test_the_delegated_call_answers_as_the_coordinators_statement_and_one_servers(
    stored: ClusterDatabase, owner: MemoryOwner
) -> None:
    # from the delegated call in autocommit (the shard table's prepared statement on the
    # worker, twice: the second runs what the first prepared), from the same function in a
    # transaction (the coordinator's statement), and one server's context_load_summary
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        delegated = conn.execute(query("session_summary_delegated"), _params(owner)).fetchall()
        again = conn.execute(query("session_summary_delegated"), _params(owner)).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        coordinated = conn.execute(query("session_summary_delegated"), _params(owner)).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        for setting, value in carried_identity(owner).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        one_server = conn.execute(
            query("context_load_summary"), owner.key(MemoryScope.SESSION)
        ).fetchall()
    assert delegated == again == coordinated == one_server
    assert [r[9] for r in delegated] == [f"ann: the summary of {owner.session_id}"]


@pytest.fixture(scope="module")
def bound_role(stored: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant summary-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(stored, ROLE, "summary-a", "ann") as role:
        yield role


def test_a_bound_role_reads_its_own_summary(stored: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(stored.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("session_summary_delegated"), _params(ANN)).fetchall()
    assert [r[9] for r in rows] == ["ann: the summary of s1"]


ATTACKS = attacks("summary-b")


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
        query("session_summary_delegated"),
        _params(ANN, **ATTACKS[attack]),
        how,
    )
