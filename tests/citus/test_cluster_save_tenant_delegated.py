"""On the cluster, the elevated role's save of TENANT memories (one, or a save_many batch)
is one call that Citus delegates to the tenant's worker
(harbor.save_tenant_memories_delegated, sql/citus/save.sql), as the application role's
save is, with the same answers as one server. A bound login granted harbor_admin that
names another tenant, user or session in the call, or its own, is refused, and nothing
of either tenant is written; the application role cannot run the call, nor write a
TENANT memory through its own."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory
from harbor_pg.tiers.base import SaveResult
from harbor_pg.tiers.long_term import _batch_params
from harbor_pg.tiers.rows import memory_params
from tests.citus.conftest import ClusterDatabase
from tests.citus.test_cluster_routing import _facade_commands
from tests.conftest import PgDatabase

ANN = MemoryOwner(tenant_id="tsave-a", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="tsave-b", principal_id="bob", session_id="s1")
TENANTS = (ANN.tenant_id, BOB.tenant_id)
ROLE = "harbor_test_tenant_save_bound"
CALL = "save_tenant_memories_delegated"


def _tenant(content: str) -> Memory:
    return Memory(content=content, scope=MemoryScope.TENANT)


def _params(owner: MemoryOwner, memories: list[Memory], **overrides: Any) -> dict[str, Any]:
    """save_tenant_memories_delegated's parameters for ``memories`` of ``owner``, without
    vectors (``overrides``: what an attacker changes)."""
    params = [memory_params(owner, m) for m in memories]
    return {
        **_batch_params(params, [None] * len(params), None),
        # (no vectors: a plain connection has no dumper for PgVectorArray)
        "embeddings": None,
        "context_embeddings": None,
        **carried_identity(owner, "caller_"),
        **overrides,
    }


def _rows(url: str) -> dict[str, list[tuple[str, str]]]:
    """Each tenant's memories, (scope, content), as a superuser reads them."""
    with psycopg.connect(url) as conn:
        return {
            t: [
                (str(s), str(c))
                for s, c in conn.execute(
                    "select scope::text, content from harbor.memories where tenant_id = %s"
                    " order by content, scope",
                    (t,),
                ).fetchall()
            ]
            for t in TENANTS
        }


def _admin_save(db: ClusterDatabase, owner: MemoryOwner, content: str) -> None:
    """A TENANT memory of ``owner``'s tenant written by the unbound elevated role, through
    the call (what that role may do)."""
    with psycopg.connect(db.admin_url, autocommit=True) as admin:
        admin.execute(query(CALL), _params(owner, [_tenant(content)]))


@pytest.fixture(scope="module")
def bound_admin(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant tsave-a as user ann, with harbor_app's rights, then granted
    harbor_admin's (without SET, as the operator grants them on Citus); and a TENANT
    memory of each tenant, written by the unbound elevated role."""
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop role if exists {ROLE}")
        su.execute(f"create role {ROLE} login")
        su.execute(f"grant harbor_app to {ROLE} with inherit true, set false")
    with psycopg.connect(cluster_db.admin_url) as admin:
        admin.execute("set local harbor.tenant_id = 'tsave-a'")
        admin.execute("select harbor.bind_role(%s, 'tsave-a', user_id => 'ann')", (ROLE,))
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"grant harbor_admin to {ROLE} with inherit true, set false")
    _admin_save(cluster_db, ANN, "tenant a: the office opens at nine")
    _admin_save(cluster_db, BOB, "tenant b: the vault code is 4711")
    yield ROLE
    with psycopg.connect(cluster_db.admin_url) as admin:
        admin.execute("set local harbor.tenant_id = 'tsave-a'")
        admin.execute("select harbor.unbind_role(%s)", (ROLE,))
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop role {ROLE}")


ATTACKS: dict[str, tuple[str, dict[str, Any]]] = {
    # the distribution argument names bob's tenant: the call goes to its worker
    "another tenant": (
        "tenant b: forged",
        {"caller_tenant_id": "tsave-b", "caller_user_id": "bob", "caller_principal_id": "bob"},
    ),
    "another tenant, own user": ("tenant b: forged", {"caller_tenant_id": "tsave-b"}),
    # (the other tenant's memory named again: the call must not answer it as a duplicate)
    "another tenant, its memory again": (
        "tenant b: the vault code is 4711",
        {"caller_tenant_id": "tsave-b"},
    ),
    "another user of its tenant": (
        "tenant a: forged",
        {"caller_user_id": "carl", "caller_principal_id": "carl"},
    ),
    "another session": ("tenant a: forged", {"caller_session_id": "s-other"}),
    # its own identity: a bound role has none of harbor_admin's rights (the policies)
    "its own tenant": ("tenant a: forged", {}),
    "its own tenant, its memory again": ("tenant a: the office opens at nine", {}),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", ["autocommit", "set local", "worker"])
def test_a_bound_elevated_login_naming_any_owner_is_refused(
    cluster_db: ClusterDatabase, bound_admin: str, attack: str, how: str
) -> None:
    content, changes = ATTACKS[attack]
    params = _params(ANN, [_tenant(content)], **changes)
    _refused_writing_nothing(cluster_db, bound_admin, params, how)


def _refused_writing_nothing(
    cluster_db: ClusterDatabase, role: str, params: dict[str, Any], how: str
) -> None:
    """``role`` runs the call with ``params`` the way ``how`` says (in autocommit,
    delegated; in a transaction whose SET LOCALs name the call's caller, on the
    coordinator; on the worker of the tenant the call names): refused, no row returned,
    and neither tenant's memories change."""
    before = _rows(cluster_db.superuser_url)
    if how == "worker":
        node = cluster_db.node_of(str(params["caller_tenant_id"]))
        index = [w.port for w in cluster_db.cluster.workers].index(node.port)
        url = cluster_db.worker_url(index, role)
    else:
        url = cluster_db.url_for(role)
    with psycopg.connect(url, autocommit=how == "autocommit") as conn:
        if how != "autocommit":
            for name in ("tenant_id", "project_id", "principal_id", "user_id", "session_id"):
                conn.execute(
                    sql.SQL("set local {} = {}").format(
                        sql.Identifier("harbor", name), sql.Literal(str(params[f"caller_{name}"]))
                    )
                )
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(query(CALL), params)
    assert _rows(cluster_db.superuser_url) == before


def test_the_application_role_cannot_run_the_call_nor_save_a_tenant_memory(
    cluster_db: ClusterDatabase, bound_admin: str
) -> None:
    # the elevated role's call is not the application role's; and the application role's
    # own delegated calls, given a TENANT memory of its own tenant, are refused by its
    # policies (TENANT is the elevated role's scope)
    before = _rows(cluster_db.superuser_url)
    memory = _tenant("tenant a: written by the application role")
    with psycopg.connect(cluster_db.app_url, autocommit=True) as app:
        with pytest.raises(errors.InsufficientPrivilege, match="permission denied"):
            app.execute(query(CALL), _params(ANN, [memory]))
        with pytest.raises(errors.InsufficientPrivilege):
            app.execute(query("save_memories_delegated"), _params(ANN, [memory]))
        one = {
            **memory_params(ANN, memory),
            **carried_identity(ANN, "caller_"),
            "model_id": None,
            "embedding": None,
            "context_embedding": None,
        }
        with pytest.raises(errors.InsufficientPrivilege):
            app.execute(query("save_memory_delegated"), one)
    assert _rows(cluster_db.superuser_url) == before


@pytest.mark.parametrize("scope", [MemoryScope.GLOBAL, MemoryScope.USER])
def test_the_call_saves_tenant_memories_alone(
    cluster_db: ClusterDatabase, bound_admin: str, scope: MemoryScope
) -> None:
    # the unbound elevated role's call with a memory of another scope in its batch:
    # refused before anything is read or written, the batch's TENANT memory too
    before = _rows(cluster_db.superuser_url)
    memories = [_tenant("tenant a: beside another scope"), Memory(content="x", scope=scope)]
    with (
        psycopg.connect(cluster_db.admin_url, autocommit=True) as admin,
        pytest.raises(errors.InvalidParameterValue, match="TENANT memories only"),
    ):
        admin.execute(query(CALL), _params(ANN, memories))
    assert _rows(cluster_db.superuser_url) == before


def test_the_facades_tenant_save_and_save_many_are_one_call_each_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    # the elevated role's save of a TENANT memory, with its vectors: one command, to the
    # tenant's worker, with no BEGIN, SET LOCAL or COMMIT (it was a transaction of
    # per-row statements from the coordinator); and so is a batch of them
    owner = MemoryOwner(tenant_id="tsave-a", principal_id="ann", session_id="s-facade")
    port = cluster_db.node_of(owner.tenant_id).port

    async def warm(manager: MemoryManager) -> None:
        await manager.save(owner, _tenant("tenant a: a first fact, before the counted ones"))

    asyncio.run(_facade_commands(cluster_db, warm, embedder=HashingEmbedder()))

    async def run_save(manager: MemoryManager) -> None:
        await manager.save(owner, _tenant("tenant a: the lobby closes at six"))

    sent = asyncio.run(_facade_commands(cluster_db, run_save, embedder=HashingEmbedder()))
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == port
    assert re.match(r"SELECT .* FROM harbor\.save_tenant_memories_delegated\('tsave-a'", command)

    async def run_batch(manager: MemoryManager) -> None:
        await manager.save_many(
            owner, [_tenant("tenant a: a batch fact"), _tenant("tenant a: a second one")]
        )

    sent = asyncio.run(_facade_commands(cluster_db, run_batch, embedder=HashingEmbedder()))
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == port
    assert re.match(r"SELECT .* FROM harbor\.save_tenant_memories_delegated\('tsave-a'", command)


async def _tenant_saves(url: str, admin_url: str, owner: MemoryOwner) -> list[Any]:
    """A sequence of TENANT saves through the facade (vectors from the hashing embedder):
    a memory, the same again, a batch holding it and a new one with a context and the new
    one twice, each read back by the application role; what each answered."""
    database = Database(url, admin_url, min_size=1, max_size=2)
    await database.open()
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    try:
        first = await manager.save(owner, _tenant("tenant c: deliveries come on tuesdays"))
        again = await manager.save(owner, _tenant("tenant c: deliveries come on tuesdays"))
        batch = await manager.save_many(
            owner,
            [
                _tenant("tenant c: deliveries come on tuesdays"),
                Memory(
                    content="tenant c: the dock is round the back",
                    context="where do deliveries go?",
                    scope=MemoryScope.TENANT,
                ),
                Memory(
                    content="tenant c: the dock is round the back",
                    context="where do deliveries go?",
                    scope=MemoryScope.TENANT,
                ),
            ],
        )
        results: list[SaveResult] = [first, again, *batch]
        read = [await manager.get(owner, r.memory.id or "") for r in results]
        ids = [r.memory.id for r in results]
        return [
            [(r.created, ids.index(r.memory.id)) for r in results],
            [
                (m.content, m.scope, m.tenant_id, m.context, m.principal_id)
                for m in (r.memory for r in results)
            ],
            [(m.content, m.scope) if m else None for m in read],
            _vectors(url, owner.tenant_id, ids),
        ]
    finally:
        await manager.close()
        await database.close()


def _vectors(url: str, tenant: str, ids: list[str | None]) -> list[tuple[int, int]]:
    """For each id, how many vectors it has and how many of them are of its context."""
    with psycopg.connect(url) as conn:
        conn.execute("select harbor.set_identity(%s)", (tenant,))
        counts = {
            str(m): (int(n), int(c))
            for m, n, c in conn.execute(
                "select memory_id, count(*), count(*) filter (where with_context)"
                " from harbor.memory_embeddings where tenant_id = %s and memory_id = any(%s)"
                " group by memory_id",
                (tenant, ids),
            ).fetchall()
        }
    return [counts.get(str(i), (0, 0)) for i in ids]


def test_tenant_saves_answer_as_one_server(
    cluster_db: ClusterDatabase, fresh_db: PgDatabase
) -> None:
    # the same saves on one server and on the cluster: the same memories created or found
    # again (a repeat answers the stored memory, created false), read back alike, with
    # their vectors (two for the memory with a context)
    owner = MemoryOwner(tenant_id="tsave-c", principal_id="cat", session_id="s1")
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute("delete from harbor.memories where tenant_id = %s", (owner.tenant_id,))
    one = asyncio.run(_tenant_saves(fresh_db.app_url, fresh_db.admin_url, owner))
    cluster = asyncio.run(_tenant_saves(cluster_db.app_url, cluster_db.admin_url, owner))
    assert cluster == one
    assert one[0] == [(True, 0), (False, 0), (False, 0), (True, 3), (False, 3)]
    assert one[3] == [(1, 0), (1, 0), (1, 0), (2, 1), (2, 1)]


def test_a_batch_with_a_global_memory_stays_the_coordinators_transaction(
    cluster_db: ClusterDatabase,
) -> None:
    # a batch of the elevated scopes that holds a GLOBAL memory (another shard, and the
    # flag that they may exist set in its transaction) is not delegated: both memories are
    # saved, in a transaction on the coordinator, and the flag is set
    owner = MemoryOwner(tenant_id="tsave-a", principal_id="ann", session_id="s-mixed")

    results: list[SaveResult] = []

    async def run(manager: MemoryManager) -> None:
        results.extend(
            await manager.save_many(
                owner,
                [
                    _tenant("tenant a: the mixed batch's fact"),
                    Memory(content="global: the mixed batch's fact", scope=MemoryScope.GLOBAL),
                ],
            )
        )

    sent = asyncio.run(_facade_commands(cluster_db, run, embedder=HashingEmbedder()))
    assert [(r.memory.scope, r.memory.tenant_id) for r in results] == [
        (MemoryScope.TENANT, "tsave-a"),
        (MemoryScope.GLOBAL, ""),
    ]
    assert not any(CALL in command for _port, command in sent), sent
    assert any(command.startswith("BEGIN") for _port, command in sent), sent
    with psycopg.connect(cluster_db.superuser_url) as su:
        flag = su.execute("select may_exist from harbor.global_memory_flag").fetchone()
        su.execute("delete from harbor.memories where content = 'global: the mixed batch''s fact'")
    assert flag is not None and flag[0] is True
