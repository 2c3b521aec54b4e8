"""On the cluster, the facade's recall is one call that Citus delegates to the tenant's
worker (harbor.recall_delegated, sql/citus/recall.sql): one command reaches the worker
and no other node, with the answer harbor.recall() gives; the identity it carries as
arguments is checked there against the caller's binding, so a bound role that names
another tenant or user is refused before anything is read."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryDatabaseError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.ranking import RecallRequest
from harbor_pg.records import Memory
from harbor_pg.tiers.rows import recall_in_one_round_trip, recall_params
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import GLOBAL_FLAG_SET, HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries, _save

ANN = MemoryOwner(tenant_id="recall-a", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="recall-b", principal_id="bob", session_id="s1")
CARL = MemoryOwner(tenant_id="recall-a", principal_id="carl", session_id="s1")
ROLE = "harbor_test_recall_bound"
SCOPES = (MemoryScope.USER, MemoryScope.PROJECT, MemoryScope.SESSION)


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> ClusterDatabase:
    _save(cluster_db.app_url, ANN, "ann: the delegated memo")
    _save(cluster_db.app_url, BOB, "bob: the delegated memo")
    _save(cluster_db.app_url, CARL, "carl: the delegated memo")
    return cluster_db


def _params(owner: MemoryOwner, **overrides: Any) -> dict[str, Any]:
    """recall_delegated's parameters for ``owner`` (``overrides``: what an attacker
    changes)."""
    return {
        **recall_params(RecallRequest(query="delegated memo", scopes=SCOPES, top_k=10)),
        "tenant_id": owner.tenant_id,
        "project_id": "",
        "principal_id": owner.principal_id,
        "user_id": owner.principal_id,
        "session_id": owner.session_id,
        "run_id": "",
        **overrides,
    }


def test_the_facades_recall_is_one_call_on_the_tenants_worker(stored: ClusterDatabase) -> None:
    async def run(manager: MemoryManager) -> None:
        found = await manager.recall(ANN, "delegated memo")
        assert [m.content for m in found] == ["ann: the delegated memo"]

    sent = asyncio.run(_facade_commands(stored, run))
    port = stored.node_of(ANN.tenant_id).port
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == port
    assert re.match(r"SELECT .* FROM harbor\.recall_delegated\('recall-a'::text", command), command
    assert _queries(sent) == sent


def test_the_delegated_recall_answers_as_harbor_recall(stored: ClusterDatabase) -> None:
    # every column, for the same request, from the delegated call and from harbor.recall()
    # with the identity set in the transaction (the statements planned on the coordinator)
    request = RecallRequest(query="delegated memo", scopes=SCOPES, top_k=10)

    async def run() -> tuple[list[Any], list[Any]]:
        db = Database(stored.app_url, stored.admin_url, min_size=1, max_size=1)
        await db.open()
        try:
            delegated = await recall_in_one_round_trip(db, ANN, request)
            rows = await db.fetch_in_one_round_trip(ANN, query("recall"), recall_params(request))
        finally:
            await db.close()
        return delegated, rows

    delegated, rows = asyncio.run(run())
    assert [(m.memory.id, m.memory.content) for m in delegated] == [
        (r["id"], r["content"]) for r in rows
    ]
    assert [m.score for m in delegated] == pytest.approx([r["score"] for r in rows])
    assert len(delegated) == 1


def test_recall_with_global_memories_still_answers_on_the_cluster(stored: ClusterDatabase) -> None:
    # the global memories' shard may be another worker's: such a recall is not delegated
    with psycopg.connect(stored.superuser_url) as conn:
        conn.execute(GLOBAL_FLAG_SET)
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values ('', 'global', '', 'admin', 'global: delegated memo',"
            " repeat('8', 64)) on conflict do nothing"
        )

    request = RecallRequest(
        query="delegated memo", scopes=(MemoryScope.GLOBAL, MemoryScope.USER), top_k=10
    )

    async def run() -> list[str]:
        db = Database(stored.app_url, stored.admin_url, min_size=1, max_size=1)
        await db.open()
        try:
            return [m.memory.content for m in await recall_in_one_round_trip(db, ANN, request)]
        finally:
            await db.close()

    try:
        found = sorted(asyncio.run(run()))
    finally:  # (the cluster's database is shared by the other tests)
        with psycopg.connect(stored.superuser_url) as conn:
            conn.execute("delete from harbor.memories where content = 'global: delegated memo'")
    assert found == ["ann: the delegated memo", "global: delegated memo"]


@pytest.fixture(scope="module")
def bound_role(stored: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant recall-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(stored, ROLE, "recall-a", "ann") as role:
        yield role


def test_a_bound_role_recalls_its_own_memories(stored: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(stored.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("recall_delegated"), _params(ANN)).fetchall()
    assert [r[10] for r in rows] == ["ann: the delegated memo"]


ATTACKS = attacks("recall-b")


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
        stored, bound_role, query("recall_delegated"), _params(ANN, **ATTACKS[attack]), how
    )


def test_a_caller_cannot_hold_another_tenants_shard(stored: ClusterDatabase) -> None:
    # the delegated calls' hold on their shard (sql/citus/delegated.sql) is for the
    # caller's own tenant: a lock on another tenant's shard could delay its moves
    node = stored.node_of(BOB.tenant_id)
    index = [w.port for w in stored.cluster.workers].index(node.port)
    with psycopg.connect(stored.worker_url(index, "harbor_app")) as conn:
        conn.execute("set local harbor.tenant_id = 'recall-a'")
        with pytest.raises(errors.InsufficientPrivilege, match="not the caller's tenant"):
            conn.execute("select harbor._hold_tenant_shard('harbor.memories', 'recall-b')")
    with psycopg.connect(stored.worker_url(index, "harbor_app")) as conn:
        conn.execute("set local harbor.tenant_id = 'recall-b'")
        held = conn.execute("select harbor._hold_tenant_shard('harbor.memories', 'recall-b')")
        assert held.fetchone() == (True,)  # its own, on the node that holds it


#: a statement Citus refuses while planning it inside a function (a DO block's): a LATERAL
#: subquery with OFFSET over a VALUES list, which it cannot push down
_UNPLANNABLE_IN_A_FUNCTION = """
do $$ begin
    perform 1
       from (values ('recall-a'), ('recall-b')) k(tenant_id)
      cross join lateral (select e.memory_id from harbor.memory_embeddings e
                           where e.tenant_id = k.tenant_id offset 0) e;
end $$"""


def test_calls_after_a_failed_one_are_still_delegated(stored: ClusterDatabase) -> None:
    # an error Citus raises planning inside a function ("cannot push down this subquery")
    # can leave that backend unable to delegate later calls, which then ran on the
    # coordinator without their identity reaching the worker (the save refused, the
    # recall empty): the facade replaces a connection whose work failed (the pool here
    # holds one connection, which the failing statement runs on as the facade's calls do)
    owner = MemoryOwner(tenant_id="recall-a", principal_id="dora", session_id="s1")

    async def run() -> list[str]:
        db = Database(stored.app_url, stored.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db, embedder=HashingEmbedder())
        try:
            await manager.save(owner, Memory(content="dora: the delegated memo"))
            with pytest.raises(MemoryDatabaseError, match="cannot push down"):
                await db.fetch_in_one_round_trip(owner, _UNPLANNABLE_IN_A_FUNCTION)
            await manager.save(owner, Memory(content="dora: saved after a failure"))
            return [m.content for m in await manager.recall(owner, "saved after a failure")]
        finally:
            await manager.close()
            await db.close()

    assert "dora: saved after a failure" in asyncio.run(run())


DINA = MemoryOwner(tenant_id="recall-d", principal_id="dina", session_id="s1")


@pytest.fixture(scope="module")
def dina(stored: ClusterDatabase) -> MemoryOwner:
    """An owner of tenant recall-d with memories and their vectors (hashing embedder)."""

    async def run() -> None:
        db = Database(stored.app_url, stored.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db, embedder=HashingEmbedder())
        try:
            for text in (
                "dina waters the garden on sunday",
                "dina's sister lives in Oslo",
                "the garden shed needs a new roof",
            ):
                await manager.save(DINA, Memory(content=text))
        finally:
            await manager.close()
            await db.close()

    asyncio.run(run())
    return DINA


def _on_worker(
    stored: ClusterDatabase, owner: MemoryOwner
) -> tuple[psycopg.Connection[Any], list[str]]:
    """harbor_app's connection to ``owner``'s worker, logging each command Citus runs:
    ('issuing ...' for one sent over a connection, 'executing the command locally' for one
    run on the node's own shard)."""
    node = stored.node_of(owner.tenant_id)
    index = [w.port for w in stored.cluster.workers].index(node.port)
    url = psycopg.conninfo.make_conninfo(
        stored.worker_url(index, "harbor_app"), options="-c citus.log_remote_commands=on"
    )
    conn = psycopg.connect(url, autocommit=True)
    notes: list[str] = []
    conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
    return conn, notes


def test_a_delegated_recall_reads_its_tenants_shard_alone(
    stored: ClusterDatabase, dina: MemoryOwner
) -> None:
    # on the worker, every statement of the delegated recall (both legs, the ranking and
    # the hydration) reads the tenant's own shard tables, through recall's twins for
    # that shard (harbor._recall_twin): none is sent over a connection to another shard,
    # this node's or the other worker's, nor run through Citus's local execution
    embedder = HashingEmbedder()
    question = "what did dina say about the garden?"
    params = {
        **_params(dina),
        "query": question,
        "embedding": str(embedder.embed_sync(question)),
        "model_id": embedder.model_id,
    }
    conn, notes = _on_worker(stored, dina)
    with conn:
        rows = conn.execute(query("recall_delegated"), params).fetchall()
    contents = [r[10] for r in rows]
    assert contents[0] == "dina waters the garden on sunday", contents
    assert "the garden shed needs a new roof" in contents
    # every statement on the shard tables themselves: none through Citus
    assert notes == []


def test_the_substring_fallback_of_a_delegated_recall_reads_its_tenants_shard_alone(
    stored: ClusterDatabase, dina: MemoryOwner
) -> None:
    # text that is no word of any memory but a piece of one, without a vector: the
    # fallback finds it, on the tenant's shard table, the connection's twins planned
    # once (its second call on the same connection too)
    conn, notes = _on_worker(stored, dina)
    with conn:
        for _ in range(3):
            rows = conn.execute(query("recall_delegated"), _params(dina, query="aters the gard"))
            assert [(r[10], r[30]) for r in rows.fetchall()] == [
                ("dina waters the garden on sunday", True)
            ]
    assert notes == []


def test_the_dense_legs_graph_walk_reads_its_tenants_shard_alone(
    stored: ClusterDatabase, dina: MemoryOwner
) -> None:
    # the dense leg's walk of the HNSW graph (an owner of more vectors than the exact
    # scan reads: here every owner, p_exact_limit 0), as a delegated recall runs it on
    # the tenant's worker (its twin there): on the tenant's shard table, and it finds the
    # owner's nearest
    embedder = HashingEmbedder()
    conn, notes = _on_worker(stored, dina)
    with conn, conn.transaction():
        conn.execute(
            "select harbor._delegated_caller('test', 'harbor.memories', %s, '', %s, %s, %s, '')",
            (dina.tenant_id, dina.principal_id, dina.principal_id, dina.session_id),
        )
        [(suffix,)] = conn.execute("select harbor._recall_twin(%s)", (dina.tenant_id,))
        notes.clear()
        ids = [
            r[0]
            for r in conn.execute(
                sql.SQL(
                    "select d.memory_id from {}(%s::text::public.vector, %s,"
                    " '{{user,project,session}}', now(), 10, p_exact_limit => 0) d"
                    " order by d.dense_rank"
                ).format(sql.Identifier("pg_temp", f"_dense_candidates_on_shard_{suffix}")),
                (str(embedder.embed_sync("dina's sister in Oslo")), embedder.model_id),
            ).fetchall()
        ]
        walked = list(notes)
        contents = dict(
            conn.execute(
                "select id, content from harbor.memories where tenant_id = %s and id = any (%s)",
                (dina.tenant_id, ids),
            ).fetchall()
        )
    assert contents[ids[0]] == "dina's sister lives in Oslo", contents
    assert len(ids) == 3
    assert walked == []


def test_recalls_twins_are_the_connections_own_and_keep_the_legs_rights(
    stored: ClusterDatabase, dina: MemoryOwner
) -> None:
    # a delegated recall makes recall's twins for its tenant's shard in the worker's
    # connection, once: temporary functions (no other connection sees them), the legs'
    # SECURITY DEFINER owned by harbor_search as the legs are on one server, the others
    # (recall's and the functions it calls that read a table, and the profile's, made
    # with them: sql/citus/profile.sql) invokers; the next recall on that shard uses
    # them again
    conn, _notes = _on_worker(stored, dina)
    twins = (
        "select p.proname::text, p.prosecdef, pg_get_userbyid(p.proowner)::text"
        "  from pg_proc p where p.pronamespace = pg_my_temp_schema() order by 1"
    )
    with conn:
        for _ in range(2):
            conn.execute(query("recall_delegated"), _params(dina, query="garden")).fetchall()
            rows = conn.execute(twins).fetchall()
            assert [(r[0].split("_on_shard_")[0], r[1], r[2]) for r in rows] == [
                ("_decayed_importance", False, "harbor_search"),
                ("_dense_candidates", True, "harbor_search"),
                ("_lexical_candidates", True, "harbor_search"),
                ("_memory_hits_of", False, "harbor_search"),
                ("_owner_memories", False, "harbor_search"),
                ("_substring_matches", False, "harbor_search"),
                ("profile", False, "harbor_search"),
                ("recall", False, "harbor_search"),
            ]
        shard = conn.execute(
            "select get_shard_id_for_distribution_column('harbor.memories', %s::text)",
            (dina.tenant_id,),
        ).fetchone()
        assert shard is not None
        assert all(f"_on_shard_{shard[0]}_" in r[0] for r in rows)
    other, _notes = _on_worker(stored, dina)
    with other:
        assert other.execute(twins).fetchall() == []


def test_a_function_planted_under_a_twins_name_is_refused(
    stored: ClusterDatabase, dina: MemoryOwner
) -> None:
    # the caller's own function under the name of one of recall's twins, made in its
    # connection before the recall: the recall refuses to run it (or to make the twins
    # beside it), before anything is read
    node = stored.node_of(dina.tenant_id)
    index = [w.port for w in stored.cluster.workers].index(node.port)
    with psycopg.connect(stored.worker_url(index)) as su:
        [(suffix,)] = su.execute(
            "select get_shard_id_for_distribution_column('harbor.memories', %s::text)::text"
            " || '_' || (harbor._recall_twin_templates())[1]",
            (dina.tenant_id,),
        ).fetchall()
    conn, _notes = _on_worker(stored, dina)
    with conn:
        # (a worker sends no DDL on: the caller's own setting)
        conn.execute("set citus.enable_ddl_propagation = off")
        conn.execute(
            sql.SQL("create function {}() returns integer language sql return 1").format(
                sql.Identifier("pg_temp", f"_lexical_candidates_on_shard_{suffix}")
            )
        )
        with pytest.raises(errors.InsufficientPrivilege, match="holds the name of a recall twin"):
            conn.execute(query("recall_delegated"), _params(dina, query="garden"))
