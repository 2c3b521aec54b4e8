"""On the cluster, a queued job's guards (harbor.require_turn: the turn a write folded is
still stored; harbor.require_memories: the memories an observation read are) read the
shards their rows can be in, not every shard: the caller's tenant's (and, for memories,
the global memories'), named by a literal predicate in their Citus forms
(harbor_pg.db.citus_rewrites). They answer as on one server: a stored row passes, a gone
one or another tenant's raises no_data_found."""

from __future__ import annotations

import asyncio
import re

import psycopg
import pytest
from psycopg import errors

from harbor_pg.db.connection import Database, local_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.citus.conftest import ClusterDatabase

ANN = MemoryOwner(tenant_id="guard-a", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="guard-b", principal_id="bob", session_id="s1")


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> dict[str, str]:
    """A turn and a memory of ann's and of bob's (saved through the facade), by name."""
    ids: dict[str, str] = {}

    async def write() -> None:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db)
        try:
            for name, owner in (("ann", ANN), ("bob", BOB)):
                turn = await manager.append(owner, ConversationMessage(role="user", content="hi"))
                ids[f"{name} turn"] = str(turn.id)
                saved = await manager.save(owner, Memory(content=f"{name}: a fact"))
                ids[f"{name} memory"] = saved.memory.id
        finally:
            await manager.close()
            await db.close()

    asyncio.run(write())
    return ids


def _check(db: ClusterDatabase, statement: str, params: dict[str, object]) -> list[int]:
    """``statement`` run as ann in a transaction (its identity by SET LOCAL, as the facade
    sets it on Citus); the ports of the nodes Citus sent it to. Raises what it raises."""
    url = psycopg.conninfo.make_conninfo(db.app_url, options="-c citus.log_remote_commands=on")
    reached: list[int] = []

    def seen(diag: psycopg.errors.Diagnostic) -> None:
        port = re.search(r"on server \S+@\S+:(\d+)", diag.message_detail or "")
        text = diag.message_primary or ""
        if port and re.match(r"issuing SELECT .* FROM harbor\.(messages|memories)_\d+", text):
            reached.append(int(port.group(1)))

    with psycopg.connect(url) as conn:
        conn.add_notice_handler(seen)
        for command in local_identity(ANN):
            conn.execute(command)
        conn.execute(statement, params)
    return reached


def test_a_stored_turn_passes_reading_the_tenants_node_alone(
    cluster_db: ClusterDatabase, stored: dict[str, str]
) -> None:
    reached = _check(cluster_db, query("job_turn_present"), {"turn_id": stored["ann turn"]})
    assert reached == [cluster_db.node_of(ANN.tenant_id).port]


def test_a_turn_queued_with_its_extraction_passes_reading_the_tenants_node_alone(
    cluster_db: ClusterDatabase,
) -> None:
    # the turn stored by the delegated call on the tenant's worker, in the transaction that
    # queued the job on the coordinator: the job's guard finds it there
    async def append() -> tuple[int | None, list[int]]:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        try:
            turn, _due, jobs = await PostgresShortTermStore(db).append_with_jobs(
                ANN,
                ConversationMessage(role="user", content="queued"),
                min_turns=100,
                cooldown_seconds=0.0,
                extract=True,
                fold=False,
            )
        finally:
            await db.close()
        return turn.id, jobs

    turn_id, [job] = asyncio.run(append())
    with psycopg.connect(cluster_db.superuser_url) as conn:
        [(args,)] = conn.execute(
            "select args from harbor_jobs.procrastinate_jobs where id = %s", (job,)
        ).fetchall()
    assert args["message_id"] == turn_id
    reached = _check(cluster_db, query("job_turn_present"), {"turn_id": str(turn_id)})
    assert reached == [cluster_db.node_of(ANN.tenant_id).port]


@pytest.mark.parametrize("turn", ["bob turn", "gone"])
def test_a_gone_or_another_tenants_turn_is_refused(
    cluster_db: ClusterDatabase, stored: dict[str, str], turn: str
) -> None:
    turn_id = stored.get(turn, str(10**12))
    with pytest.raises(errors.NoDataFound, match="is gone"):
        _check(cluster_db, query("job_turn_present"), {"turn_id": turn_id})


def test_stored_memories_pass_reading_the_tenants_and_the_global_nodes_alone(
    cluster_db: ClusterDatabase, stored: dict[str, str]
) -> None:
    reached = _check(cluster_db, query("job_memories_present"), {"ids": [stored["ann memory"]]})
    assert set(reached) <= {cluster_db.node_of(ANN.tenant_id).port, cluster_db.node_of("").port}
    assert len(reached) <= 2


@pytest.mark.parametrize("memory", ["bob memory", "gone"])
def test_a_gone_or_another_tenants_memory_is_refused(
    cluster_db: ClusterDatabase, stored: dict[str, str], memory: str
) -> None:
    ids = [stored["ann memory"], stored.get(memory, "no-such-memory")]
    with pytest.raises(errors.NoDataFound, match="is gone"):
        _check(cluster_db, query("job_memories_present"), {"ids": ids})
