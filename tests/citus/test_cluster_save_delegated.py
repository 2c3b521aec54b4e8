"""On the cluster, a save of one memory is one call that Citus delegates to the tenant's
worker (harbor.save_memory_delegated, sql/citus/save.sql). A bound role that names
another tenant, user or session in the call, or a memory owned by someone else, is
refused, and nothing of theirs is read or written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from harbor_pg.db.sqlfiles import query
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import _delegated_save_params
from harbor_pg.tiers.rows import memory_params
from tests.citus.conftest import ClusterDatabase

ANN = MemoryOwner(tenant_id="save-a", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="save-b", principal_id="bob", session_id="s1")
CARL = MemoryOwner(tenant_id="save-a", principal_id="carl", session_id="s1")
ROLE = "harbor_test_save_bound"


def _params(owner: MemoryOwner, content: str, **overrides: Any) -> dict[str, Any]:
    """save_memory_delegated's parameters for a user memory of ``owner``."""
    memory = Memory(content=content)
    return {**_delegated_save_params(owner, memory_params(owner, memory), None, None), **overrides}


def _contents(url: str, tenant: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "select content from harbor.memories where tenant_id = %s order by content", (tenant,)
        ).fetchall()
    return [str(r[0]) for r in rows]


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant save-a as user ann, with harbor_app's rights, without SET."""
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop role if exists {ROLE}")
        su.execute(f"create role {ROLE} login")
        su.execute(f"grant harbor_app to {ROLE} with inherit true, set false")
    with psycopg.connect(cluster_db.admin_url) as admin:
        admin.execute("set local harbor.tenant_id = 'save-a'")
        admin.execute("select harbor.bind_role(%s, 'save-a', user_id => 'ann')", (ROLE,))
    with psycopg.connect(cluster_db.app_url, autocommit=True) as app:
        app.execute(query("save_memory_delegated"), _params(BOB, "bob: his own fact"))
        app.execute(query("save_memory_delegated"), _params(CARL, "carl: his own fact"))
    yield ROLE
    with psycopg.connect(cluster_db.admin_url) as admin:
        admin.execute("set local harbor.tenant_id = 'save-a'")
        admin.execute("select harbor.unbind_role(%s)", (ROLE,))
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop role {ROLE}")


def test_a_bound_role_saves_its_own_memory_once(
    cluster_db: ClusterDatabase, bound_role: str
) -> None:
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        first = conn.execute(query("save_memory_delegated"), _params(ANN, "ann: bound")).fetchone()
        again = conn.execute(query("save_memory_delegated"), _params(ANN, "ann: bound")).fetchone()
    assert first is not None and again is not None
    assert first[-1] is True and again[-1] is False and first[0] == again[0]  # deduplicated
    assert _contents(cluster_db.superuser_url, "save-a").count("ann: bound") == 1


ATTACKS = {
    # the distribution argument names bob's tenant: the call goes to its worker
    "another tenant": {
        "caller_tenant_id": "save-b",
        "tenant_id": "save-b",
        "caller_user_id": "bob",
        "caller_principal_id": "bob",
        "user_id": "bob",
        "principal_id": "bob",
    },
    "another tenant, own user": {"caller_tenant_id": "save-b", "tenant_id": "save-b"},
    "another user of its tenant": {
        "caller_user_id": "carl",
        "caller_principal_id": "carl",
        "user_id": "carl",
        "principal_id": "carl",
    },
    # its own identity, a memory keyed to carl: the policies refuse the row
    "a memory of another user": {"user_id": "carl", "principal_id": "carl"},
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", ["autocommit", "set local", "worker"])
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    params = _params(ANN, "forged fact", **ATTACKS[attack])
    _refused_writing_nothing(cluster_db, bound_role, query("save_memory_delegated"), params, how)


def _refused_writing_nothing(
    cluster_db: ClusterDatabase, role: str, statement: str, params: dict[str, Any], how: str
) -> None:
    """``role`` runs ``statement`` (a delegated save) with ``params`` the way ``how`` says
    (in autocommit, delegated; in a transaction whose SET LOCALs name the call's caller,
    on the coordinator; on the worker of the tenant the call names): refused, and
    neither tenant's memories change."""
    before = {t: _contents(cluster_db.superuser_url, t) for t in ("save-a", "save-b")}
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
            conn.execute(statement, params)
    after = {t: _contents(cluster_db.superuser_url, t) for t in ("save-a", "save-b")}
    assert after == before


def test_on_the_worker_the_save_runs_on_the_shard_tables_prepared_once(
    cluster_db: ClusterDatabase,
) -> None:
    # on the tenant's worker the save's insert and its vectors' address the tenant's own
    # shards, prepared in the connection on its first save and used again by the next:
    # a memory with a context is stored with both vectors, a second with its one, the
    # first saved again comes back as the duplicate it is
    from harbor_pg.tiers.long_term import MemoryVectors, _one_params
    from tests.citus.test_cluster_append import _worker_of

    owner = MemoryOwner(tenant_id="save-a", principal_id="ann", session_id="s-shard")
    with psycopg.connect(cluster_db.superuser_url) as su:
        shards = {
            table: str(
                su.execute(
                    "select shard_name(%s::regclass,"
                    " get_shard_id_for_distribution_column(%s::regclass, %s::text))",
                    (table, table, owner.tenant_id),
                ).fetchone()[0]  # type: ignore[index]
            )
            for table in ("harbor.memories", "harbor.memory_embeddings")
        }

    def params(memory: Memory, vectors: MemoryVectors) -> dict[str, Any]:
        one = _one_params(memory_params(owner, memory), vectors, "test-model")
        return {**_delegated_save_params(owner, memory_params(owner, memory), None, None), **one}

    first = Memory(content="ann: prepared on the shard", context="the turn before")
    second = Memory(content="ann: the next one")
    with psycopg.connect(_worker_of(cluster_db, owner.tenant_id, "harbor_app")) as conn:
        conn.autocommit = True
        saved = conn.execute(
            query("save_memory_delegated"), params(first, MemoryVectors([1.0, 0.0], [0.6, 0.8]))
        ).fetchone()
        prepared = dict(
            conn.execute(
                "select name, statement from pg_prepared_statements where name like 'harbor_save_%'"
            ).fetchall()
        )
        other = conn.execute(
            query("save_memory_delegated"), params(second, MemoryVectors([0.0, 1.0]))
        ).fetchone()
        again = conn.execute(
            query("save_memory_delegated"), params(first, MemoryVectors([1.0, 0.0], [0.6, 0.8]))
        ).fetchone()
        still = conn.execute(
            "select count(*) from pg_prepared_statements where name like 'harbor_save_%'"
        ).fetchone()
    assert saved is not None and other is not None and again is not None
    assert saved[-1] is True and other[-1] is True and again[-1] is False
    assert again[0] == saved[0]
    assert len(prepared) == 2 and still is not None and still[0] == 2, prepared
    suffix = shards["harbor.memories"].rsplit("_", 1)[1]
    assert all(str(name).endswith("_" + suffix) for name in prepared), prepared
    assert shards["harbor.memories"] in str(prepared[f"harbor_save_insert_{suffix}"])
    assert shards["harbor.memory_embeddings"] in str(prepared[f"harbor_save_vectors_{suffix}"])
    with psycopg.connect(cluster_db.superuser_url) as su:
        vectors = dict(
            su.execute(
                "select memory_id, count(*) from harbor.memory_embeddings"
                " where tenant_id = %s and memory_id = any(%s) group by memory_id",
                (owner.tenant_id, [saved[0], other[0]]),
            ).fetchall()
        )
    assert vectors == {saved[0]: 2, other[0]: 1}


def _batch(owner: MemoryOwner, memories: list[Memory], **overrides: Any) -> dict[str, Any]:
    """save_memories_delegated's parameters for user memories of ``owner``, without
    vectors (``overrides``: what an attacker changes)."""
    from harbor_pg.db.connection import carried_identity
    from harbor_pg.tiers.long_term import _batch_params

    params = [memory_params(owner, m) for m in memories]
    return {
        **_batch_params(params, [None] * len(params), None),
        # (no vectors: a plain connection has no dumper for PgVectorArray)
        "embeddings": None,
        "context_embeddings": None,
        **carried_identity(owner, "caller_"),
        **overrides,
    }


def test_the_facades_batch_is_saved_by_one_call_as_one_server_saves_it(
    cluster_db: ClusterDatabase,
) -> None:
    # save_many through the facade (one delegated call, tests/citus/test_cluster_routing):
    # each memory inserted once with its vectors, a duplicate of a stored memory and a
    # repeat within the batch answered by the memory already there (created false), in
    # the input's order, as one server's save_many answers
    import asyncio

    from harbor_pg.db.connection import Database
    from harbor_pg.manager import MemoryManager

    owner = MemoryOwner(tenant_id="save-a", principal_id="ann", session_id="s-batch")
    stored = Memory(content="ann: stored before the batch")
    batch = [
        Memory(content="ann: batch one", context="the turn before"),
        Memory(content="ann: stored before the batch"),
        Memory(content="ann: batch two"),
        Memory(content="ann: batch one", context="the turn before"),
    ]
    vectors = {
        "ann: stored before the batch": [1.0, 0.0],
        "ann: batch one": [0.0, 1.0],
        "the turn before\nann: batch one": [0.6, 0.8],
        "ann: batch two": [0.8, 0.6],
    }

    async def run() -> tuple[Any, list[Any]]:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db, embedder=_Lookup(vectors))
        try:
            first = await manager.save(owner, stored)
            return first, await manager.save_many(owner, batch)
        finally:
            await manager.close()
            await db.close()

    first, results = asyncio.run(run())
    assert [r.created for r in results] == [True, False, True, False]
    assert [r.memory.content for r in results] == [m.content for m in batch]
    assert results[1].memory.id == first.memory.id
    assert results[3].memory.id == results[0].memory.id
    with psycopg.connect(cluster_db.superuser_url) as su:
        counts = dict(
            su.execute(
                "select m.content, count(e.memory_id) from harbor.memories m"
                " left join harbor.memory_embeddings e"
                "   on e.tenant_id = m.tenant_id and e.memory_id = m.id"
                " where m.tenant_id = %s and m.content = any(%s) group by m.content",
                (owner.tenant_id, list(vectors)),
            ).fetchall()
        )
    assert counts == {
        "ann: stored before the batch": 1,
        "ann: batch one": 2,
        "ann: batch two": 1,
    }


class _Lookup:
    """An embedder that looks its 2-d vectors up (every text given beforehand)."""

    model_id = "test-lookup"
    dimensions = 2
    relevance_threshold = 0.0

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    async def embed(self, texts: Any) -> list[list[float]]:
        return [self.vectors[t] for t in texts]

    async def embed_query(self, text: str) -> list[float]:
        return self.vectors[text]


def test_a_batch_that_fails_on_one_memory_saves_none(
    cluster_db: ClusterDatabase, bound_role: str
) -> None:
    # the bound role's own identity, its batch's second memory keyed to carl: the
    # policies refuse that row, and the call's one transaction keeps the first out too
    memories = [Memory(content="ann: batch before the refused one"), Memory(content="x")]
    params = _batch(ANN, memories)
    params["user_ids"] = ["ann", "carl"]
    params["principal_ids"] = ["ann", "carl"]
    before = _contents(cluster_db.superuser_url, "save-a")
    with (
        psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn,
        pytest.raises(errors.InsufficientPrivilege),
    ):
        conn.execute(query("save_memories_delegated"), params)
    assert _contents(cluster_db.superuser_url, "save-a") == before


def _batch_changes(changes: dict[str, str]) -> dict[str, Any]:
    """An attack's changes to a one-memory call as a batch's: the memory's owner fields
    as arrays, and no tenant of its own (a batch's memories are all of the call's)."""
    renamed = {"user_id": "user_ids", "principal_id": "principal_ids"}
    return {
        renamed.get(key, key): [value] if key in renamed else value
        for key, value in changes.items()
        if key != "tenant_id"
    }


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", ["autocommit", "set local", "worker"])
def test_a_bound_role_naming_another_owner_in_a_batch_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    params = _batch(ANN, [Memory(content="forged batch fact")], **_batch_changes(ATTACKS[attack]))
    _refused_writing_nothing(cluster_db, bound_role, query("save_memories_delegated"), params, how)


def test_the_shared_save_step_takes_only_a_statement_suffix(
    cluster_db: ClusterDatabase, bound_role: str
) -> None:
    # harbor._save_memory_on_shard names its prepared statements by the suffix it is
    # given: anything but a shard id or 'tables' is refused before a statement runs
    with (
        psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn,
        pytest.raises(errors.InvalidParameterValue, match="not a statement suffix"),
    ):
        conn.execute(
            "select * from harbor._save_memory_on_shard('1(null); select 1; --', 'save-a',"
            " null, 'user', '', 'ann', '', '', 'ann', 'fact', 0.5, 'x', repeat('a', 64),"
            " null, '{}', 'user', 'none', null, '{}', '{}', null, null, null, null, null)"
        )
