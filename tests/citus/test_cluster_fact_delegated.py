"""On the cluster, an extracted fact's write (PostgresLongTermStore.add_fact: the similarity
gate, then the supersede of the memory it replaces or its insert) and an observation's
supersede (PostgresLongTermStore.supersede, MemoryManager.observe's write) are one call each
that Citus delegates to the tenant's worker (harbor.add_fact_delegated, sql/citus/fact.sql):
one command to one node, with no BEGIN, SET LOCAL or COMMIT, the write guards (a queued
job's turn, an observation's read memories) inside it. They answer as the coordinator's
transaction of the guards and extraction_supersede_memory / extraction_insert_memory does,
which still writes an observation that read a GLOBAL memory (its shard may be another
worker's: the delegated call writes nothing and says so). The identity the call carries as
arguments is checked on the worker against the caller's binding, so a bound role that names
another tenant or user is refused before anything is read or written."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.errors import MemoryNotFoundError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory, MemoryScope, MemoryType
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.rows import memory_params
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import GLOBAL_FLAG_SET, HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ROLE = "harbor_test_fact_bound"
MODEL = "test-3d"
TEA, COFFEE = [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]


def _owners(tenant: str) -> tuple[MemoryOwner, MemoryOwner]:
    return (
        MemoryOwner(tenant_id=tenant, principal_id="ann", session_id="s1"),
        MemoryOwner(tenant_id=tenant, principal_id="carl", session_id="s1"),
    )


ANN, CARL = _owners("fact-a")
BOB = MemoryOwner(tenant_id="fact-b", principal_id="bob", session_id="s1")


def _observation(ids: list[str], text: str) -> Memory:
    return Memory(
        content=text,
        memory_type=MemoryType.OBSERVATION,
        scope=MemoryScope.USER,
        entity_ids=["drinks"],
        source="reflection",
        metadata={"observed_ids": sorted(ids)},
    )


async def _writes(
    store: PostgresLongTermStore, owner: MemoryOwner, turn: int, *, vectors: bool = True
) -> list[Any]:
    """The fact writes of extraction and observe, as ``owner``: what each answered
    (``vectors``: with their vectors and the similarity gate)."""
    t = owner.tenant_id
    add = store.add_fact

    def vector(v: list[float]) -> dict[str, Any]:
        return {"embedding": v, "model_id": MODEL, "dedup_threshold": 0.9} if vectors else {}

    tea = await add(owner, Memory(content=f"{t}: likes tea"), **vector(TEA))
    assert tea.memory is not None
    coffee = await add(
        owner, Memory(content=f"{t}: likes coffee"), replaces=tea.memory.id, **vector(COFFEE)
    )
    assert coffee.memory is not None
    # the gate: a restatement of the current fact writes nothing
    again = await add(owner, Memory(content=f"{t}: coffee, really"), **vector(COFFEE))
    # the replaced memory is gone (superseded already): inserted as new, gated again
    late = await add(
        owner, Memory(content=f"{t}: likes water"), dedup_threshold=0.9, replaces=tea.memory.id
    )
    assert late.memory is not None
    # a duplicate of a current memory: that memory comes back
    dup = await add(owner, Memory(content=f"{t}: likes water"), for_turn=turn)
    # an observation, then its successor (observe's supersede)
    ids = [coffee.memory.id or "", late.memory.id or ""]
    first = await add(owner, _observation(ids, f"{t}: drinks coffee and water"))
    assert first.memory is not None
    then = await store.supersede(
        owner, first.memory.id or "", _observation(ids, f"{t}: drinks mostly coffee")
    )
    gone = await store.supersede(
        owner, first.memory.id or "", _observation(ids, f"{t}: drinks nothing")
    )
    facts = [
        (f.created, f.superseded is not None, f.restatement_of is not None)
        for f in (tea, coffee, again, late, dup, first)
    ]
    observed = [r if r is None else r.created for r in (then, gone)]
    assert dup.memory is not None
    restated = again.restatement_of and again.restatement_of.memory_id == coffee.memory.id
    return [*facts, *observed, restated, dup.memory.id == late.memory.id]


def _stored(db: ClusterDatabase, tenant: str) -> list[tuple[Any, ...]]:
    """The tenant's memories as they stand (content, open, superseded by whose content,
    type, vectors), in content order."""
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select id, content, upper_inf(valid), superseded_by, memory_type::text"
            " from harbor.memories where tenant_id = %s",
            (tenant,),
        ).fetchall()
        vectors = conn.execute(
            "select memory_id from harbor.memory_embeddings where tenant_id = %s", (tenant,)
        ).fetchall()
    content = {r[0]: r[1] for r in rows}
    return sorted(
        (text, is_open, content.get(successor), kind, vectors.count((memory_id,)))
        for memory_id, text, is_open, successor, kind in rows
    )


async def _with_store(
    db: ClusterDatabase, run: Callable[[PostgresLongTermStore], Awaitable[Any]]
) -> Any:
    database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
    await database.open()
    try:
        return await run(PostgresLongTermStore(database))
    finally:
        await database.close()


def _turn(db: ClusterDatabase, owner: MemoryOwner) -> int:
    async def run() -> int:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            turn = await manager.append(owner, ConversationMessage(role="user", content="tea?"))
            return int(turn.id or 0)
        finally:
            await manager.close()
            await database.close()

    return asyncio.run(run())


def test_the_fact_writes_are_one_call_each_and_answer_as_the_coordinators_transaction(
    cluster_db: ClusterDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the facade's fact writes for ann of fact-a (with vectors and the gate) and of fact-e
    # (without): each one command, to the tenant's worker
    plain, _carl = _owners("fact-e")
    turns = [_turn(cluster_db, ANN), _turn(cluster_db, plain)]
    answers: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        store = PostgresLongTermStore(manager.database)
        answers.append(await _writes(store, ANN, turns[0]))
        answers.append(await _writes(store, plain, turns[1], vectors=False))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    nodes = [cluster_db.node_of(t).port for t in ("fact-a", "fact-e")]
    assert [to for to, _c in sent] == [nodes[0]] * 8 + [nodes[1]] * 8, sent
    assert all(
        re.match(r"SELECT .* FROM harbor\.add_fact_delegated\('fact-[ae]'::text", c)
        for _to, c in sent
    ), sent
    assert answers[0] == [
        (True, False, False),  # tea
        (True, True, False),  # coffee supersedes tea
        (False, False, True),  # a restatement of coffee: nothing written
        (True, False, False),  # water: tea is gone, inserted as new
        (False, False, False),  # water again: the current duplicate
        (True, False, False),  # the observation
        True,  # its successor
        None,  # (superseded already)
        True,  # the restatement's is coffee's id
        True,  # the duplicate's is water's
    ]
    # (two observations, coffee and tea with a vector each, water)
    assert [r[4] for r in _stored(cluster_db, "fact-a")] == [0, 0, 1, 1, 0]
    # the writes without vectors for fact-c in the coordinator's transaction (the call not
    # made; with vectors its writing statements fail on Citus: COPY under the policies):
    # the same answers, the same rows
    coordinated, _carl = _owners("fact-c")
    turn = _turn(cluster_db, coordinated)

    async def not_delegated(*_args: Any, **_kwargs: Any) -> None:
        return None

    monkeypatch.setattr(PostgresLongTermStore, "_fact_delegated", not_delegated)
    answers.append(
        asyncio.run(_with_store(cluster_db, lambda s: _writes(s, coordinated, turn, vectors=False)))
    )

    def tenantless(tenant: str) -> list[tuple[Any, ...]]:
        rows = _stored(cluster_db, tenant)
        return [tuple(str(v).replace(tenant, "T") for v in row) for row in rows]

    assert answers[1] == answers[2]
    assert answers[1][2] == (True, False, False)  # (no gate: written)
    assert tenantless("fact-e") == tenantless("fact-c")


def test_the_guards_hold_and_a_global_read_is_written_by_the_coordinator(
    cluster_db: ClusterDatabase,
) -> None:
    owner, _carl = _owners("fact-d")
    global_id = "fact-global-memory"
    with psycopg.connect(cluster_db.superuser_url) as conn:
        conn.execute(GLOBAL_FLAG_SET)
        conn.execute(
            "insert into harbor.memories (tenant_id, id, scope, principal_id, content,"
            " content_hash) values ('', %s, 'global', 'admin', 'global: water is wet',"
            " md5('global') || md5('water')) on conflict do nothing",
            (global_id,),
        )
    outcomes: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        store = PostgresLongTermStore(manager.database)
        own = await store.add_fact(owner, Memory(content="fact-d: likes juice"))
        assert own.memory is not None
        # an observation that read a GLOBAL memory: written by the coordinator's transaction
        read = [own.memory.id or "", global_id]
        written = await store.add_fact(owner, _observation(read, "fact-d: juice and water"))
        outcomes.append(written.created)
        # a queued job whose turn is gone, an observation whose read memory is gone:
        # nothing written (after a failed call the facade replaces its connection, whose
        # commands are not logged here)
        for write in (
            store.add_fact(owner, Memory(content="fact-d: from a gone turn"), for_turn=-1),
            store.add_fact(owner, _observation([own.memory.id or "", "gone"], "fact-d: gone")),
        ):
            with pytest.raises(MemoryNotFoundError):
                await write

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert outcomes == [True]
    # the own fact one call; the observation one call (global_read), then the transaction
    calls = [c.split()[0] for _to, c in sent if "add_fact_delegated" in c or "BEGIN" in c]
    assert calls[:3] == ["SELECT", "SELECT", "BEGIN"], sent
    assert [r[0] for r in _stored(cluster_db, "fact-d")] == [
        "fact-d: juice and water",
        "fact-d: likes juice",
    ]


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant fact-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, "fact-a", "ann") as role:
        yield role


def _params(owner: MemoryOwner, target: MemoryOwner, replaces: str | None) -> dict[str, Any]:
    """add_fact_delegated's parameters: ``owner``'s identity, a fact of ``target``'s owner
    key superseding ``replaces``."""
    memory = memory_params(target, Memory(content=f"{target.principal_id}: overwritten"))
    return {
        **memory,
        "metadata": Jsonb({}),
        **carried_identity(owner),
        **{f"key_{f}": memory[f] for f in ("project_id", "user_id", "session_id", "run_id")},
        "writer_id": memory["principal_id"],
        "model_id": None,
        "dims": None,
        "embedding": None,
        "dedup_threshold": None,
        "exclude_ids": [],
        "replaces": replaces,
        "insert_if_gone": True,
        "turn_id": None,
        "read_ids": None,
    }


def test_a_bound_role_writes_its_own(cluster_db: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        [row] = conn.execute(query("add_fact_delegated"), _params(ANN, ANN, None)).fetchall()
    assert row[0] is False and row[5] is not None  # not a global read; written


ATTACKS = attacks("fact-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, and the memory of the owner it names (bob's or carl's) is not superseded
    target = BOB if attack.startswith("another tenant") else CARL

    async def victim(store: PostgresLongTermStore) -> str:
        saved = await store.add_fact(target, Memory(content=f"victim {attack} {how}"))
        assert saved.memory is not None
        return saved.memory.id or ""

    victim_id = asyncio.run(_with_store(cluster_db, victim))
    assert_refused(
        cluster_db,
        bound_role,
        query("add_fact_delegated"),
        {**_params(ANN, target, victim_id), **ATTACKS[attack]},
        how,
    )
    with psycopg.connect(cluster_db.superuser_url) as conn:
        row = conn.execute(
            "select upper_inf(valid), superseded_by from harbor.memories"
            " where tenant_id = %s and id = %s",
            (target.tenant_id, victim_id),
        ).fetchone()
    assert row == (True, None)
