"""On the cluster, whether a session is due a background summary
(PostgresShortTermStore.summary_due) is one call that Citus delegates to the tenant's
worker (harbor.summary_due_delegated, sql/citus/lease.sql): one command to one node, with
no BEGIN, SET LOCAL or COMMIT, answering as the coordinator's statement and one server's
summary_due do (too few turns, enough, a lease held, a cooldown, turns since the last
summary). The identity the call carries as arguments is checked on the worker against the
caller's binding, so a bound role that names another tenant or user is refused before
anything is read."""

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
from harbor_pg.tiers.short_term import PostgresShortTermStore, session_key
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

TENANT = "due-a"
ROLE = "harbor_test_due_bound"
#: (min_turns, cooldown_seconds) asked of every session
RULES = [(1, 0.0), (3, 0.0), (4, 0.0), (2, 3600.0), (10, 0.0)]


def _owner(session: str, user: str = "ann") -> MemoryOwner:
    return MemoryOwner(tenant_id=TENANT, principal_id=user, session_id=session)


def _prepare(db: ClusterDatabase, session: str, turns: int, lease: str) -> MemoryOwner:
    """A session of ``turns`` turns, written through the facade, whose summary lease is
    then ``lease``: "none" (never taken), "held", or "finished" (a summary recorded at
    every turn, then two turns more)."""
    owner = _owner(session)

    async def run() -> None:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        store = PostgresShortTermStore(database)
        try:
            for k in range(turns):
                await manager.append(owner, ConversationMessage(role="user", content=f"{k}"))
            if lease != "none":
                taken = await store.acquire_summary_lease(
                    owner, min_turns=1, cooldown_seconds=0, lease_seconds=600
                )
                assert taken is not None
                if lease == "finished":
                    assert await store.finish_summary_lease(owner, taken, turns_at_summary=turns)
                    for k in range(2):
                        await manager.append(
                            owner, ConversationMessage(role="user", content=f"after {k}")
                        )
        finally:
            await manager.close()
            await database.close()

    asyncio.run(run())
    return owner


def _params(owner: MemoryOwner, min_turns: int = 1, cooldown: float = 0.0) -> dict[str, Any]:
    return {**carried_identity(owner), "min_turns": min_turns, "cooldown_seconds": cooldown}


def test_the_facades_due_check_is_one_call_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    owner = _prepare(cluster_db, "facade", 3, "none")
    found: list[bool] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        store = PostgresShortTermStore(manager.database)
        found.append(await store.summary_due(owner, min_turns=3, cooldown_seconds=0))
        found.append(await store.summary_due(owner, min_turns=4, cooldown_seconds=0))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert [to for to, _c in sent] == [cluster_db.node_of(TENANT).port] * 2, sent
    assert all(
        re.match(r"SELECT harbor\.summary_due_delegated\('due-a'::text", c) for _to, c in sent
    )
    assert found == [True, False]


@pytest.mark.parametrize("lease", ["none", "held", "finished"])
def test_the_delegated_call_answers_as_the_coordinators_statement_and_one_servers(
    cluster_db: ClusterDatabase, lease: str
) -> None:
    # the delegated call in autocommit, the same function in a transaction (the
    # coordinator's statement) and one server's summary_due under the same identity
    owner = _prepare(cluster_db, f"same-{lease}", 3, lease)
    call = query("summary_due_delegated")
    answers: dict[str, list[bool]] = {"delegated": [], "coordinated": [], "one": []}
    for min_turns, cooldown in RULES:
        params = _params(owner, min_turns, cooldown)
        with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
            [(due,)] = conn.execute(call, params).fetchall()
            answers["delegated"].append(due)
        with psycopg.connect(cluster_db.app_url) as conn:
            [(due,)] = conn.execute(call, params).fetchall()
            answers["coordinated"].append(due)
        with psycopg.connect(cluster_db.app_url) as conn:
            for setting, value in carried_identity(owner).items():
                conn.execute(f"set local harbor.{setting} = '{value}'")
            [(due,)] = conn.execute(
                query("summary_due"),
                {**session_key(owner), "min_turns": min_turns, "cooldown_seconds": cooldown},
            ).fetchall()
            answers["one"].append(due)
    expected = {
        # 3 turns, never summarised: due from min_turns turns
        "none": [True, True, False, True, False],
        # a lease held: never due
        "held": [False] * 5,
        # summarised at 3, 5 turns now: 2 since, and the cooldown of an hour not over
        "finished": [True, False, False, False, False],
    }[lease]
    assert answers == {"delegated": expected, "coordinated": expected, "one": expected}


def test_the_cluster_counts_every_turn_whatever_the_summarys_last_turn_says(
    cluster_db: ClusterDatabase,
) -> None:
    # one server counts only the turns after the last summary's last turn
    # (session_state.summarised_through), which a trigger clears when turns are deleted;
    # the cluster has no such trigger, so its rule counts every turn and never reads the
    # mark: one that says no turn came since (here the newest turn's id) changes nothing
    owner = _prepare(cluster_db, "marked", 3, "finished")  # summarised at 3, 5 turns now
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        marked = su.execute(
            "update harbor.session_state s set summarised_through = (select max(m.id)"
            " from harbor.messages m where m.tenant_id = s.tenant_id"
            " and m.user_id = s.user_id and m.session_id = s.session_id)"
            " where s.tenant_id = %s and s.session_id = 'marked'",
            (TENANT,),
        )
        assert marked.rowcount == 1
    params = _params(owner, 1, 0.0)
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        assert conn.execute(query("summary_due_delegated"), params).fetchall() == [(True,)]
    with psycopg.connect(cluster_db.app_url) as conn:
        for setting, value in carried_identity(owner).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        due = conn.execute(
            query("summary_due"), {**session_key(owner), "min_turns": 1, "cooldown_seconds": 0}
        ).fetchall()
        assert due == [(True,)]


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant due-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, TENANT, "ann") as role:
        yield role


def test_a_bound_role_reads_its_own_sessions(cluster_db: ClusterDatabase, bound_role: str) -> None:
    owner = _prepare(cluster_db, "bound", 2, "none")
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("summary_due_delegated"), _params(owner, 2)).fetchall()
    assert rows == [(True,)]


ATTACKS = attacks("due-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is read
    assert_refused(
        cluster_db,
        bound_role,
        query("summary_due_delegated"),
        {**_params(_owner("attacked")), **ATTACKS[attack]},
        how,
    )
