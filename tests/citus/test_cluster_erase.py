"""Erasure on the cluster.

Deleting a memory that another version links to: Citus refuses the superseded_by key's
ON DELETE SET NULL; the trigger of sql/citus/successor.sql does what it did
(docs/citus.md). The security side (who may reopen what) is
tests/security/test_erase_reopen.py, on both targets.

The facade's erasure: one call delegated to the tenant's worker
(harbor.erase_delegated, sql/citus/erase.sql) while no GLOBAL memory may exist, with the
same receipt and the same rows left as on one server; harbor.erase when one may (the
GLOBAL memories derived from the user go too) or the user has role bindings. A bound
login that names another tenant or user in the call is refused.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from harbor_pg.db import migrate
from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.testing.nodes import LocalCluster
from harbor_pg.tiers.base import EraseReceipt
from tests.citus.conftest import ClusterDatabase, make_database
from tests.citus.delegated import (
    HOWS,
    CommandRecorder,
    LoggedDatabase,
    assert_refused,
    attacks,
    bound_login,
)
from tests.conftest import PgDatabase

TRIGGER = "FK_memories_superseded_by_set_null"
FUNCTION = "harbor._memories_successor_set_null()"


def _write(db: ClusterDatabase, tenant: str, principal: str | None, content: str) -> str:
    with psycopg.connect(db.app_url) as conn:
        conn.execute(
            "select harbor.set_identity(%s, principal_id => %s, user_id => 'u1')",
            (tenant, principal),
        )
        row = conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values (%s, 'user', 'u1', coalesce(%s, ''), %s,"
            " encode(sha256(%s::bytea), 'hex')) returning id",
            (tenant, principal, content, f"{tenant}/{content}"),
        ).fetchone()
    assert row is not None
    return str(row[0])


def _supersede(db: ClusterDatabase, tenant: str, old: str, new: str) -> None:
    with psycopg.connect(db.app_url) as conn:
        conn.execute("select harbor.set_identity(%s, user_id => 'u1')", (tenant,))
        conn.execute(
            "update harbor.memories set valid = tstzrange(lower(valid), now()),"
            " superseded_by = %s where tenant_id = %s and id = %s",
            (new, tenant, old),
        )


def _state(db: ClusterDatabase, tenant: str, memory_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(db.superuser_url) as conn:
        return conn.execute(
            "select upper_inf(valid), superseded_by from harbor.memories"
            " where tenant_id = %s and id = %s",
            (tenant, memory_id),
        ).fetchone()


def _erase_bot(db: ClusterDatabase, tenant: str) -> int:
    with psycopg.connect(db.admin_url) as conn:
        conn.execute("select harbor.set_identity(%s)", (tenant,))
        rows = conn.execute("select * from harbor.erase(principal_id => 'bot')").fetchall()
    return dict(rows)["long_term"]


def test_erase_of_a_chain_in_one_statement_reopens_the_version_before_it(
    cluster_db: ClusterDatabase,
) -> None:
    """u1's fact, then two newer versions an agent wrote: erasing the agent deletes
    both in one statement (the first links to the second), and u1's comes back."""
    tenant = "erase-chain-t"
    v1 = _write(cluster_db, tenant, None, "the ferry leaves at six")
    v2 = _write(cluster_db, tenant, "bot", "the ferry leaves at seven")
    v3 = _write(cluster_db, tenant, "bot", "the ferry leaves at eight")
    _supersede(cluster_db, tenant, v1, v2)
    _supersede(cluster_db, tenant, v2, v3)
    assert _erase_bot(cluster_db, tenant) == 2
    assert _state(cluster_db, tenant, v2) is None and _state(cluster_db, tenant, v3) is None
    assert _state(cluster_db, tenant, v1) == (True, None)


def test_a_user_deleting_a_middle_version_unlinks_the_one_before(
    cluster_db: ClusterDatabase,
) -> None:
    """A raw DELETE by harbor_app of its own version that another links to: the link is
    cleared (as ON DELETE SET NULL did), the older version stays closed, and another
    tenant's chain is untouched."""
    tenant, other = "erase-raw-t", "erase-raw-other"
    old = _write(cluster_db, tenant, None, "the bakery opens at seven")
    new = _write(cluster_db, tenant, None, "the bakery opens at eight")
    _supersede(cluster_db, tenant, old, new)
    other_old = _write(cluster_db, other, None, "the bakery opens at seven")
    other_new = _write(cluster_db, other, None, "the bakery opens at eight")
    _supersede(cluster_db, other, other_old, other_new)
    with psycopg.connect(cluster_db.app_url) as conn:
        conn.execute("select harbor.set_identity(%s, user_id => 'u1')", (tenant,))
        deleted = conn.execute(
            "delete from harbor.memories where tenant_id = %s and id = %s", (tenant, new)
        ).rowcount
    assert deleted == 1
    assert _state(cluster_db, tenant, old) == (False, None)
    assert _state(cluster_db, other, other_old) == (False, other_new)


def test_the_trigger_refuses_to_act_for_a_table_that_is_not_harbors(
    cluster_db: ClusterDatabase,
) -> None:
    """Its second line: were EXECUTE granted again (grants.sql grants every harbor
    function; the Citus form revokes it after), a caller could attach the owner's
    function to a temporary table of its own, with any tenant and id in it. The
    function then refuses: it acts only for a harbor table its owner owns."""
    tenant = "erase-temp-t"
    old = _write(cluster_db, tenant, None, "the museum closes on mondays")
    new = _write(cluster_db, tenant, None, "the museum closes on tuesdays")
    _supersede(cluster_db, tenant, old, new)
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"grant execute on function {FUNCTION} to harbor_app")
    try:
        with psycopg.connect(cluster_db.app_url) as conn:
            conn.execute("select harbor.set_identity(%s, user_id => 'u1')", (tenant,))
            conn.execute("create temp table gone (tenant_id text, id text)")
            conn.execute(
                "create trigger gone_unlink after delete on gone"
                f" for each row execute function {FUNCTION}"
            )
            conn.execute("insert into gone values (%s, %s)", (tenant, new))
            with pytest.raises(errors.InsufficientPrivilege, match="foreign key's action"):
                conn.execute("delete from gone")
    finally:
        with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
            su.execute(f"revoke execute on function {FUNCTION} from harbor_app")
    assert _state(cluster_db, tenant, old) == (False, new)


def test_migrate_gives_an_older_distributed_database_the_trigger(
    cluster_db: ClusterDatabase,
) -> None:
    """A database distributed before the trigger existed (no function, policies or
    trigger; EXECUTE on every harbor function, as grants.sql gives it): `harbor-pg
    migrate` re-applies the Citus forms, and a delete that another version links to
    works again."""
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute("set citus.enable_unsafe_triggers = on")
        su.execute(f'drop trigger "{TRIGGER}" on harbor.memories')
        su.execute("drop policy memories_owner_set_null on harbor.memories")
        su.execute("drop policy memories_owner_set_null_read on harbor.memories")
        su.execute(f"drop function {FUNCTION}")
        su.execute("update public.harbor_idempotent_sql set sha256 = 'stale'")
    tenant = "erase-migrate-t"
    old = _write(cluster_db, tenant, None, "the tram runs every ten minutes")
    new = _write(cluster_db, tenant, "bot", "the tram runs every twelve minutes")
    _supersede(cluster_db, tenant, old, new)
    with pytest.raises(errors.ForeignKeyViolation):
        _erase_bot(cluster_db, tenant)
    migrate.upgrade(cluster_db.owner_url, progress=None)
    with psycopg.connect(cluster_db.superuser_url) as su:
        executable = su.execute(
            "select has_function_privilege(r, %s, 'execute') from unnest(array["
            "'harbor_app', 'harbor_admin', 'harbor_search']) r",
            (FUNCTION,),
        ).fetchall()
        on_workers = su.execute(
            "select result from run_command_on_workers($$select count(*) from pg_trigger"
            f" where tgname like '{TRIGGER}%'$$)"
        ).fetchall()
    assert executable == [(False,)] * 3
    # (a trigger on every shard of harbor.memories, and on the worker's shell table)
    assert all(int(r[0]) >= 1 for r in on_workers)
    assert _erase_bot(cluster_db, tenant) == 1
    assert _state(cluster_db, tenant, old) == (True, None)


# -- the facade's erasure: one delegated call, or harbor.erase ------------------------

ANN = MemoryOwner(tenant_id="erase-one", principal_id="ann", session_id="s1")
ANN_S2 = MemoryOwner(tenant_id="erase-one", principal_id="ann", session_id="s2")
ANN_RUN = MemoryOwner(tenant_id="erase-one", principal_id="ann", session_id="s1", run_id="r1")
BEN = MemoryOwner(tenant_id="erase-one", principal_id="ben", session_id="s1")
BOT = MemoryOwner(tenant_id="erase-one", principal_id="bot", user_id="ann", session_id="s1")
OTHER = MemoryOwner(tenant_id="erase-other", principal_id="ann", session_id="s1")


@pytest.fixture(scope="module")
def erase_db(citus_cluster: LocalCluster) -> ClusterDatabase:
    """A database of its own: whether GLOBAL memories may exist is the whole database's
    flag, and the shared database's other tests store some."""
    return make_database(citus_cluster, "harbor_erase_delegated")


@pytest.fixture
def no_global(erase_db: ClusterDatabase) -> Iterator[ClusterDatabase]:
    """No GLOBAL memory, the flag unset, and none of these tests' rows (as a superuser)."""
    _clean(erase_db.superuser_url, cluster=True)
    yield erase_db
    _clean(erase_db.superuser_url, cluster=True)


def _clean(url: str, *, cluster: bool) -> None:
    with psycopg.connect(url) as conn:
        for table in ("memories", "messages", "working_state", "owner_locks", "session_state"):
            conn.execute(
                f"delete from harbor.{table} where tenant_id = any (%s)",
                (["", ANN.tenant_id, OTHER.tenant_id],),
            )
        conn.execute("delete from harbor_jobs.procrastinate_jobs")
        if cluster:
            conn.execute("update harbor.global_memory_flag set may_exist = false")


async def _fill(app_url: str, admin_url: str) -> None:
    """The same rows, through the facade: ann's turns in two sessions, her memories (one
    of a session, one derived from her turn that ben wrote, and an agent's newer version
    of her fact), her run's working state; ben's own; and another tenant's ann."""
    database = Database(app_url, admin_url, min_size=1, max_size=2)
    await database.open()
    manager = MemoryManager.from_database(database)
    try:
        first = await manager.append(ANN, ConversationMessage(role="user", content="I like tea"))
        await manager.append(ANN, ConversationMessage(role="assistant", content="Noted: tea"))
        await manager.append(ANN_S2, ConversationMessage(role="user", content="I live in Oslo"))
        await manager.append(BEN, ConversationMessage(role="user", content="I like coffee"))
        await manager.append(OTHER, ConversationMessage(role="user", content="other tenant"))
        fact = await manager.save(ANN, Memory(id="ann-fact", content="ann likes green tea"))
        await manager.save(
            ANN,
            Memory(
                id="ann-session",
                scope=MemoryScope.SESSION,
                content="ann asked about tea today",
                source_session_id="s1",
            ),
        )
        await manager.save(
            BEN,
            Memory(
                id="ben-derived",
                content="ben heard that ann likes tea",
                source_message_ids=[str(first.id)],
            ),
        )
        await manager.save(BEN, Memory(id="ben-own", content="ben likes coffee"))
        await manager.save(OTHER, Memory(id="other-fact", content="the other ann likes tea"))
        assert manager.working is not None
        await manager.working.update(ANN_RUN, {"step": 1}, None)
        # an agent's newer version of ann's fact, in her scope
        with psycopg.connect(app_url) as conn:
            conn.execute(
                "select harbor.set_identity(%s, principal_id => 'bot', user_id => 'ann')",
                (BOT.tenant_id,),
            )
            conn.execute(
                "insert into harbor.memories (tenant_id, id, scope, user_id, principal_id,"
                " content, content_hash) values (%s, 'bot-fact', 'user', 'ann', 'bot',"
                " 'ann likes black tea', encode(sha256('bot-fact'::bytea), 'hex'))",
                (BOT.tenant_id,),
            )
            conn.execute(
                "update harbor.memories set valid = tstzrange(lower(valid), now()),"
                " superseded_by = 'bot-fact' where tenant_id = %s and id = %s",
                (BOT.tenant_id, fact.memory.id),
            )
    finally:
        await manager.close()
        await database.close()


def _left(url: str) -> dict[str, Any]:
    """What is left of the two tenants: each table's rows, by what tells them apart."""
    tenants = [ANN.tenant_id, OTHER.tenant_id, ""]
    with psycopg.connect(url) as conn:
        return {
            "memories": conn.execute(
                "select tenant_id, id, upper_inf(valid), superseded_by from harbor.memories"
                " where tenant_id = any (%s) order by 1, 2",
                (tenants,),
            ).fetchall(),
            "messages": conn.execute(
                "select tenant_id, user_id, session_id, content from harbor.messages"
                " where tenant_id = any (%s) order by 1, 2, 3, 4",
                (tenants,),
            ).fetchall(),
            "working": conn.execute(
                "select tenant_id, user_id, run_id from harbor.working_state"
                " where tenant_id = any (%s) order by 1, 2, 3",
                (tenants,),
            ).fetchall(),
            "locks": conn.execute(
                "select tenant_id, user_id, session_id, scope::text from harbor.owner_locks"
                " where tenant_id = any (%s) order by 1, 2, 3, 4",
                (tenants,),
            ).fetchall(),
            "jobs": conn.execute(
                "select args->>'tenant_id', args->>'user_id' from harbor_jobs.procrastinate_jobs"
                " where args->>'tenant_id' = any (%s) order by 1, 2",
                (tenants,),
            ).fetchall(),
        }


def _queue_jobs(url: str) -> None:
    """A job of ann's and one of ben's on the queue (as the queue's worker role would)."""
    with psycopg.connect(url) as conn:
        for user in ("ann", "ben"):
            conn.execute(
                "insert into harbor_jobs.procrastinate_jobs (queue_name, task_name, args)"
                " values ('harbor', 'harbor.fold_summary', %s)",
                (
                    psycopg.types.json.Jsonb(
                        {"tenant_id": ANN.tenant_id, "user_id": user, "principal_id": user}
                    ),
                ),
            )


async def _facade_erase(
    db: ClusterDatabase | PgDatabase, *, log: bool = False, **subject: str
) -> tuple[EraseReceipt, list[tuple[int, str]]]:
    """The facade's erase of ``subject`` in ann's tenant: its receipt, and (``log``, on the
    cluster) the commands Citus sent to the nodes meanwhile."""
    recorder = CommandRecorder()
    if log:
        assert isinstance(db, ClusterDatabase)
        database: Database = LoggedDatabase(db, recorder)
    else:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
    await database.open()
    manager = MemoryManager.from_database(database)
    try:
        with recorder:
            receipt = await manager.erase(ANN.tenant_id, **subject)
    finally:
        await manager.close()
        await database.close()
    return receipt, recorder.sent


def test_an_erase_with_no_global_memory_is_one_delegated_call(
    no_global: ClusterDatabase,
) -> None:
    """One call, sent whole to the tenant's worker: the worker sees the transaction's BEGIN,
    the call and its COMMIT (one phase), and nothing else, no other node; the subject's
    jobs, on the coordinator's queue, go in the same transaction."""
    asyncio.run(_fill(no_global.app_url, no_global.admin_url))
    _queue_jobs(no_global.superuser_url)
    receipt, sent = asyncio.run(_facade_erase(no_global, log=True, user_id="ann"))
    port = no_global.node_of(ANN.tenant_id).port
    assert {p for p, _c in sent} == {port}, sent
    assert len(sent) == 3, sent
    assert sent[0][1].startswith("BEGIN TRANSACTION"), sent
    assert re.match(r"SELECT .* FROM harbor\.erase_delegated\('erase-one'::text", sent[1][1])
    assert sent[2][1] == "COMMIT", sent
    assert receipt == EraseReceipt(
        short_term=3, working=1, long_term=4, embeddings=0, role_bindings=0
    )
    left = _left(no_global.superuser_url)
    assert [r[1] for r in left["memories"]] == ["ben-own", "other-fact"]
    assert left["jobs"] == [(ANN.tenant_id, "ben")]


def test_an_erase_leaves_what_one_server_leaves(
    no_global: ClusterDatabase, fresh_db: PgDatabase
) -> None:
    """The same rows through the facade on one server and on the cluster; each erasure
    (a user, a session of a user, an agent) gives the same receipt and leaves the same rows."""
    for subject in (
        {"principal_id": "bot"},
        {"user_id": "ann", "session_id": "s2"},
        {"user_id": "ann"},
    ):
        _clean(no_global.superuser_url, cluster=True)
        _clean(fresh_db.superuser_url, cluster=False)
        receipts = []
        for db in (fresh_db, no_global):
            asyncio.run(_fill(db.app_url, db.admin_url))
            _queue_jobs(db.superuser_url)
            receipts.append(asyncio.run(_facade_erase(db, **subject))[0])
        assert receipts[0] == receipts[1], subject
        assert _left(fresh_db.superuser_url) == _left(no_global.superuser_url), subject


async def _save_global(db: ClusterDatabase, owner: MemoryOwner, memory_id: str) -> None:
    database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
    await database.open()
    manager = MemoryManager.from_database(database)
    try:
        await manager.save(
            owner,
            Memory(
                id=memory_id,
                scope=MemoryScope.GLOBAL,
                content=f"derived from {owner.principal_id}",
                source_session_id="s1",
            ),
        )
    finally:
        await manager.close()
        await database.close()


def test_an_erase_with_global_memories_erases_those_derived_from_the_user(
    no_global: ClusterDatabase,
) -> None:
    """With the flag set, the worker refuses the one call (nothing deleted) and the facade
    runs harbor.erase: the GLOBAL memory derived from ann's session goes, another stays."""
    asyncio.run(_fill(no_global.app_url, no_global.admin_url))
    # GLOBAL memories derived from ann's and ben's sessions, saved through the facade (the
    # elevated role's save sets the flag)
    asyncio.run(_save_global(no_global, ANN, "global-ann"))
    asyncio.run(_save_global(no_global, BEN, "global-ben"))
    # the call itself, with the flag set: refused, nothing deleted
    params = {
        **carried_identity(MemoryOwner(tenant_id=ANN.tenant_id)),
        "erase_user_id": "ann",
        "erase_session_id": None,
        "erase_principal_id": None,
    }
    before = _left(no_global.superuser_url)
    with (
        psycopg.connect(no_global.admin_url, autocommit=True) as conn,
        pytest.raises(errors.ObjectNotInPrerequisiteState, match="GLOBAL memories may exist"),
    ):
        conn.execute(query("erase_delegated"), params)
    assert _left(no_global.superuser_url) == before
    receipt, sent = asyncio.run(_facade_erase(no_global, log=True, user_id="ann"))
    assert receipt.long_term == 5 and receipt.short_term == 3
    left = _left(no_global.superuser_url)
    assert [r[1] for r in left["memories"]] == ["global-ben", "ben-own", "other-fact"]
    # the refused call, then harbor.erase's statements, on both shards' nodes
    assert any("erase_delegated" in c for _p, c in sent)


def test_an_erase_of_a_user_with_a_role_binding_runs_harbor_erase(
    no_global: ClusterDatabase,
) -> None:
    """The bindings are a reference table, on every node: the worker refuses the one call,
    and harbor.erase deletes the binding with the rest."""
    asyncio.run(_fill(no_global.app_url, no_global.admin_url))
    with bound_login(no_global, "harbor_test_erase_binding", ANN.tenant_id, "ann"):
        receipt, _sent = asyncio.run(_facade_erase(no_global, user_id="ann"))
        assert receipt.role_bindings == 1 and receipt.short_term == 3
        with psycopg.connect(no_global.superuser_url) as conn:
            assert conn.execute("select count(*) from harbor.role_bindings").fetchone() == (0,)
        # (bound_login unbinds it again: nothing left to unbind)


def test_an_erase_of_an_agents_chain_in_the_call_reopens_the_version_before_it(
    no_global: ClusterDatabase,
) -> None:
    """harbor.erase's chain walk, in the delegated call: erasing the agent deletes its
    newer version of ann's fact, and ann's is current again."""
    asyncio.run(_fill(no_global.app_url, no_global.admin_url))
    receipt, sent = asyncio.run(_facade_erase(no_global, log=True, principal_id="bot"))
    assert any("erase_delegated" in c for _p, c in sent) and len(sent) == 3
    assert receipt.long_term == 1
    memories = {r[1]: r[2:] for r in _left(no_global.superuser_url)["memories"]}
    assert memories["ann-fact"] == (True, None)
    assert "bot-fact" not in memories


# -- attacks: a bound login naming another owner in the call ---------------------------

ERASE_ROLE = "harbor_test_erase_bound"


@pytest.fixture(scope="module")
def erase_bound(erase_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant erase-a as user ann; bob's rows in erase-b and carl's in
    erase-a written by the application role, each as its own owner."""
    with bound_login(erase_db, ERASE_ROLE, "erase-a", "ann") as role:
        yield role


def _victims(db: ClusterDatabase) -> None:
    async def fill() -> None:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            for owner in (
                MemoryOwner(tenant_id="erase-b", principal_id="bob", session_id="s1"),
                MemoryOwner(tenant_id="erase-a", principal_id="carl", session_id="s1"),
            ):
                await manager.append(owner, ConversationMessage(role="user", content="mine"))
                await manager.save(owner, Memory(content=f"{owner.principal_id}: mine"))
        finally:
            await manager.close()
            await database.close()

    asyncio.run(fill())


def _victims_rows(db: ClusterDatabase) -> list[Any]:
    with psycopg.connect(db.superuser_url) as conn:
        return conn.execute(
            "select 'm', tenant_id, user_id, content from harbor.memories"
            " where tenant_id in ('erase-a', 'erase-b')"
            " union all select 't', tenant_id, user_id, content from harbor.messages"
            " where tenant_id in ('erase-a', 'erase-b') order by 1, 2, 3, 4"
        ).fetchall()


@pytest.mark.parametrize("attack", sorted(attacks("erase-b")))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_login_naming_another_owner_in_the_erasure_is_refused(
    erase_db: ClusterDatabase, erase_bound: str, attack: str, how: str
) -> None:
    _victims(erase_db)
    before = _victims_rows(erase_db)
    owner = MemoryOwner(tenant_id="erase-a", principal_id="ann", session_id="s1")
    params = {**carried_identity(owner), **attacks("erase-b")[attack]}
    params.update(
        erase_user_id=params["user_id"] or "carl", erase_session_id=None, erase_principal_id=None
    )
    assert_refused(erase_db, erase_bound, query("erase_delegated"), params, how)
    assert _victims_rows(erase_db) == before


def test_a_bound_login_erasing_another_user_of_its_tenant_deletes_nothing_of_theirs(
    erase_db: ClusterDatabase, erase_bound: str
) -> None:
    """Its own identity, carl named as the erased user: refused as harbor.erase refuses
    it (the user's lock is the elevated role's), and carl's rows stay."""
    _victims(erase_db)
    before = _victims_rows(erase_db)
    owner = MemoryOwner(tenant_id="erase-a", principal_id="ann", session_id="s1")
    params = {
        **carried_identity(owner),
        "erase_user_id": "carl",
        "erase_session_id": None,
        "erase_principal_id": None,
    }
    with (
        psycopg.connect(erase_db.url_for(erase_bound), autocommit=True) as conn,
        pytest.raises(errors.InsufficientPrivilege),
    ):
        conn.execute(query("erase_delegated"), params)
    assert _victims_rows(erase_db) == before
