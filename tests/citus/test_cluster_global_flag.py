"""On the cluster, whether GLOBAL memories may exist is one flag (harbor.global_memory_flag,
sql/citus/global.sql): with it unset, a search is one delegated call to the tenant's worker
and nothing else; the elevated role's save of a GLOBAL memory sets it, and searches then
read the global memories too, merged in one server's order. A GLOBAL memory inserted while
it is unset is refused (a write path that forgot it fails, rather than searches missing
the memory), and the Citus forms, applied again, set it when a GLOBAL memory is stored.

A database of its own: the flag is the whole database's, and the shared one's other
tests store GLOBAL memories."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors

from harbor_pg.db import migrate
from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory
from harbor_pg.testing.nodes import LocalCluster
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.citus.conftest import ClusterDatabase, make_database
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="flag-a", principal_id="ann", session_id="s1")


@pytest.fixture(scope="module")
def flag_db(citus_cluster: LocalCluster) -> ClusterDatabase:
    db = make_database(citus_cluster, "harbor_global_flag")
    asyncio.run(_save(db, ANN, Memory(content="ann: a lighthouse keeper's note")))
    return db


def _flag(db: ClusterDatabase) -> bool:
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute("select may_exist from harbor.global_memory_flag").fetchone()
    assert row is not None
    return bool(row[0])


def _reset(db: ClusterDatabase) -> None:
    """No GLOBAL memory and the flag unset (as an operator would, a superuser)."""
    with psycopg.connect(db.superuser_url) as conn:
        conn.execute("delete from harbor.memories where tenant_id = ''")
        conn.execute("update harbor.global_memory_flag set may_exist = false")


async def _save(db: ClusterDatabase, owner: MemoryOwner, memory: Memory) -> str:
    """``memory`` saved through the facade (a GLOBAL one by the elevated role); its id."""
    database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
    await database.open()
    manager = MemoryManager.from_database(database)
    try:
        return (await manager.save(owner, memory)).memory.id
    finally:
        await manager.close()
        await database.close()


def _search(db: ClusterDatabase, query: str) -> tuple[list[str], list[tuple[int, str]]]:
    """A search of ANN's through the facade: the contents found, and the commands sent."""
    found: list[str] = []

    async def run(manager: MemoryManager) -> None:
        found.extend(m.content for m in await manager.search(ANN, query))

    sent = asyncio.run(_facade_commands(db, run))
    return found, sent


def _get_many(db: ClusterDatabase, ids: list[str]) -> tuple[list[str], list[tuple[int, str]]]:
    """The store's get_many of ``ids`` for ANN through the facade: the contents found,
    sorted (it promises no order), and the commands sent."""
    found: list[str] = []

    async def run(manager: MemoryManager) -> None:
        store = manager.long_term
        assert isinstance(store, PostgresLongTermStore)
        found.extend(m.content for m in await store.get_many(ANN, ids))

    sent = asyncio.run(_facade_commands(db, run))
    return sorted(found), sent


def _get(db: ClusterDatabase, memory_id: str) -> tuple[str | None, list[tuple[int, str]]]:
    """The facade's get of ``memory_id`` for ANN: the content found, and the commands sent."""
    found: list[str | None] = []

    async def run(manager: MemoryManager) -> None:
        memory = await manager.get(ANN, memory_id)
        found.append(memory.content if memory else None)

    sent = asyncio.run(_facade_commands(db, run))
    return found[0], sent


def _one_command_to_anns_worker(
    db: ClusterDatabase, sent: list[tuple[int, str]], call: str
) -> None:
    """``sent`` (the commands a facade call sent) is one command, ``call``, to the node
    of ann's tenant: no BEGIN, SET LOCAL or COMMIT, no read of another shard."""
    assert _queries(sent) == sent, sent
    assert len(sent) == 1, sent
    [(port, command)] = sent
    assert port == db.node_of(ANN.tenant_id).port
    assert call in command


def _ann_note(db: ClusterDatabase) -> str:
    """The id of ANN's memory saved with the database."""
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute(
            "select id from harbor.memories where tenant_id = %s and content = %s",
            (ANN.tenant_id, "ann: a lighthouse keeper's note"),
        ).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def no_global(flag_db: ClusterDatabase) -> Iterator[ClusterDatabase]:
    _reset(flag_db)
    yield flag_db
    _reset(flag_db)


def test_a_search_with_no_global_memory_is_one_command_to_the_tenants_worker(
    no_global: ClusterDatabase,
) -> None:
    # (a database just distributed, with no GLOBAL memory: the flag is unset)
    found, sent = _search(no_global, "lighthouse keeper")
    assert found == ["ann: a lighthouse keeper's note"]
    _one_command_to_anns_worker(no_global, sent, "search_delegated")


def test_an_admins_global_memory_sets_the_flag_and_searches_read_it_in_order(
    no_global: ClusterDatabase,
) -> None:
    assert not _flag(no_global)
    asyncio.run(
        _save(
            no_global,
            ANN,
            Memory(content="global: the lighthouse keeper's lighthouse", scope=MemoryScope.GLOBAL),
        )
    )
    asyncio.run(_save(no_global, ANN, Memory(content="ann: lighthouse", importance=0.9)))
    assert _flag(no_global)
    found, sent = _search(no_global, "lighthouse keeper")
    # one server's order: the rank first (the global memory names both words, one twice),
    # then the importance among equal ranks
    assert found == [
        "global: the lighthouse keeper's lighthouse",
        "ann: a lighthouse keeper's note",
        "ann: lighthouse",
    ]
    assert sorted(port for port, _c in sent) == sorted(
        [no_global.node_of(ANN.tenant_id).port, no_global.node_of("").port]
    )
    # and as one server answers: its statement run by the coordinator over the whole table
    with psycopg.connect(no_global.superuser_url) as conn:
        ranked = conn.execute(
            "select content from harbor.memories m,"
            " (select harbor.or_tsquery('lighthouse keeper') as q) q"
            " where m.tenant_id in ('', %s) and m.fts @@ q.q"
            " order by ts_rank_cd(m.fts, q.q) desc, m.importance desc, lower(m.valid) desc,"
            ' m.id collate "C"',
            (ANN.tenant_id,),
        ).fetchall()
    assert [r[0] for r in ranked] == found


def test_reads_by_id_with_no_global_memory_are_one_command_to_the_tenants_worker(
    no_global: ClusterDatabase,
) -> None:
    # a get_many, of the tenant's memory and of an id stored nowhere: one delegated call
    # (no read of the global memories' shard), as a search's
    note = _ann_note(no_global)
    found, sent = _get_many(no_global, [note, "no-such-memory"])
    assert found == ["ann: a lighthouse keeper's note"]
    _one_command_to_anns_worker(no_global, sent, "get_memories_delegated")
    # and a get the tenant's shard cannot answer is that one command too
    missing, sent = _get(no_global, "no-such-memory")
    assert missing is None
    _one_command_to_anns_worker(no_global, sent, "get_memories_delegated")


def test_an_admins_global_memory_is_read_by_id(no_global: ClusterDatabase) -> None:
    note = _ann_note(no_global)
    global_id = asyncio.run(
        _save(
            no_global,
            ANN,
            Memory(content="global: the keeper's logbook", scope=MemoryScope.GLOBAL),
        )
    )
    assert _flag(no_global)
    tenant, shared = no_global.node_of(ANN.tenant_id).port, no_global.node_of("").port
    # its id alone: the delegated call (whose answer says that global memories may
    # exist), then the global memories' shard
    found, sent = _get_many(no_global, [global_id])
    assert found == ["global: the keeper's logbook"]
    assert [port for port, _c in _queries(sent)] == [tenant, shared], sent
    # the tenant's and the global one's together: both
    found, _sent = _get_many(no_global, [global_id, note, "no-such-memory"])
    assert found == ["ann: a lighthouse keeper's note", "global: the keeper's logbook"]
    # and a get of it
    memory, sent = _get(no_global, global_id)
    assert memory == "global: the keeper's logbook"
    assert [port for port, _c in _queries(sent)] == [tenant, shared], sent


def _admin_insert(db: ClusterDatabase, content: str) -> None:
    """A GLOBAL memory inserted by the elevated role with its own SQL, not the facade's."""
    with psycopg.connect(db.admin_url) as conn:
        conn.execute("select harbor.set_identity('flag-a')")
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, content, content_hash)"
            " values ('', 'global', %s, md5(%s) || md5('global'))",
            (content, content),
        )


def test_a_global_memory_inserted_with_the_flag_unset_is_refused(
    no_global: ClusterDatabase,
) -> None:
    with pytest.raises(errors.ObjectNotInPrerequisiteState, match="global_memory_flag"):
        _admin_insert(no_global, "global: written past the flag")
    with psycopg.connect(no_global.superuser_url) as conn:
        stored = conn.execute("select count(*) from harbor.memories where tenant_id = ''")
        assert stored.fetchone() == (0,)
    # the same insert, the flag set in its transaction first (as the facade's save does):
    # written; and the elevated role cannot unset it
    with psycopg.connect(no_global.admin_url) as conn:
        conn.execute("select harbor.set_identity('flag-a')")
        conn.execute("update harbor.global_memory_flag set may_exist = true where not may_exist")
    _admin_insert(no_global, "global: written after the flag")
    with psycopg.connect(no_global.admin_url) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute("select harbor.set_identity('flag-a')")
        conn.execute("update harbor.global_memory_flag set may_exist = false")
    assert _flag(no_global)
    # the application role can neither set nor unset it
    with psycopg.connect(no_global.app_url) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute("update harbor.global_memory_flag set may_exist = true")


@pytest.mark.parametrize("state", ["unset", "missing"])
def test_the_citus_forms_applied_again_set_the_flag_when_a_global_memory_is_stored(
    no_global: ClusterDatabase, state: str
) -> None:
    _admin_insert_with_flag(no_global)
    with psycopg.connect(no_global.superuser_url, autocommit=True) as conn:
        if state == "unset":  # (as if written past it)
            conn.execute("update harbor.global_memory_flag set may_exist = false")
        else:  # (a database distributed before the flag existed)
            conn.execute("drop table harbor.global_memory_flag")
        conn.execute("update public.harbor_idempotent_sql set sha256 = 'stale'")
    migrate.upgrade(no_global.owner_url, progress=None)
    assert _flag(no_global)
    # and searches read the global memory again
    found, _sent = _search(no_global, "reapplied")
    assert found == ["global: stored before the flag was reapplied"]


def _admin_insert_with_flag(db: ClusterDatabase) -> None:
    with psycopg.connect(db.admin_url) as conn:
        conn.execute("select harbor.set_identity('flag-a')")
        conn.execute("update harbor.global_memory_flag set may_exist = true where not may_exist")
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, content, content_hash)"
            " values ('', 'global', 'global: stored before the flag was reapplied',"
            " repeat('9', 64))"
        )
