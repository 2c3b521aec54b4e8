"""On the cluster, each tenant-scoped call of the facade reaches the tenant's worker in one
round trip from the coordinator: one command, to that worker, with no BEGIN, SET LOCAL or
COMMIT sent on to it (Citus's log of the commands the coordinator sends,
``citus.log_remote_commands``, on every connection of the facade's two pools).

One audit over the calls users make (``MemoryManager`` and the tier stores it hands out:
its turns, working state, long-term memories, summaries and leases, extraction's fact
write), each with the delegated function that answers it (``harbor_pg.db.citus
.DELEGATED_CALLS``). Calls that are several calls by design (a snapshot, a context build,
an extraction) are held to every command being one such call. Calls that are by design not
one hop are listed in :data:`BY_DESIGN` with the reason, and each is asserted to do what
docs/citus.md says it does.

A database of its own: whether GLOBAL memories may exist is one flag for the whole
database (``harbor.global_memory_flag``), and with it set a search or a read by id is two
commands by design; the shared database's other tests store GLOBAL memories."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage, Memory, MemoryType
from harbor_pg.testing.nodes import LocalCluster
from harbor_pg.tiers.base import summary_memory_id
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.citus.conftest import ClusterDatabase, make_database
from tests.citus.delegated import CommandRecorder, LoggedDatabase
from tests.unit.test_extractor import ScriptedModel, fact, facts

TENANT = "hop-a"
ANN = MemoryOwner(tenant_id=TENANT, principal_id="ann", session_id="s1", run_id="r1")

#: the commands that are a transaction's or the identity's, not a statement
CONTROL = re.compile(r"^(BEGIN|COMMIT|ROLLBACK|PREPARE|SET |SELECT assign_distributed)", re.I)


def _ann(**fields: str) -> MemoryOwner:
    """ANN in another session or run (a call that changes them keeps to its own)."""
    return ANN.model_copy(update=fields)


#: a facade call to audit: it prepares what it needs, then makes the call inside ``with rec``
Case = Callable[[MemoryManager, CommandRecorder], Awaitable[Any]]


def _sent(db: ClusterDatabase, case: Case, **manager: Any) -> list[tuple[int, str]]:
    """The commands Citus sent while ``case`` made its call (and while the work the call
    left running, background summaries and hit counts, finished)."""
    recorder = CommandRecorder()

    async def run() -> None:
        database = LoggedDatabase(db, recorder, max_size=4)
        await database.open()
        facade = MemoryManager.from_database(database, **manager)
        try:
            await case(facade, recorder)
            with recorder:
                await facade.drain()
        finally:
            await facade.close()
            await database.close()

    asyncio.run(run())
    return recorder.sent


def _function(command: str) -> str:
    """The harbor function a command calls (the first one it names)."""
    found = re.search(r"\bharbor\.(\w+)\(", command)
    return found.group(1) if found else command


@pytest.fixture(scope="module")
def hop_db(citus_cluster: LocalCluster) -> ClusterDatabase:
    return make_database(citus_cluster, "harbor_one_hop")


@pytest.fixture(scope="module")
def seeded(hop_db: ClusterDatabase) -> ClusterDatabase:
    """ANN's session turns, run state and memories, stored through the facade."""

    async def seed(m: MemoryManager, rec: CommandRecorder) -> None:
        for text in ("I like green tea.", "Noted: green tea.", "I work at the lighthouse."):
            role = "assistant" if text.startswith("Noted") else "user"
            await m.append(ANN, ConversationMessage(role=role, content=text))
        await m.update(ANN, {"step": "drafting"})
        await m.save(ANN, Memory(content="ann likes green tea", entity_ids=["tea"]))
        await m.save(ANN, Memory(content="ann works at the lighthouse"))

    _sent(hop_db, seed)
    return hop_db


def _saved(m: MemoryManager, content: str, **fields: Any) -> Awaitable[str]:
    async def save() -> str:
        return (await m.save(ANN, Memory(content=content, **fields))).memory.id or ""

    return save()


def _store(m: MemoryManager) -> PostgresLongTermStore:
    assert isinstance(m.long_term, PostgresLongTermStore)
    return m.long_term


def _turns(m: MemoryManager) -> PostgresShortTermStore:
    assert isinstance(m.short_term, PostgresShortTermStore)
    return m.short_term


# -- the calls, each one command to the tenant's worker ------------------------------------


async def _append(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        await m.append(ANN, ConversationMessage(role="user", content="And oolong too."))


async def _recent(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        assert await m.recent(ANN)


async def _clear(m: MemoryManager, rec: CommandRecorder) -> None:
    owner = _ann(session_id="s-clear")
    await m.append(owner, ConversationMessage(role="user", content="soon gone"))
    with rec:
        assert await m.clear(owner) == 1


async def _turns_after(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        assert await _turns(m).after(ANN, 0, 10)


async def _turns_through(m: MemoryManager, rec: CommandRecorder) -> None:
    [first, *_] = await m.recent(ANN)
    with rec:
        assert await _turns(m).turns_through(ANN, first.id or 0, 10)


async def _summary_due(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        await _turns(m).summary_due(ANN, min_turns=1, cooldown_seconds=0)


async def _lease_acquire(m: MemoryManager, rec: CommandRecorder) -> None:
    owner = _ann(session_id="s-lease-1")
    await m.append(owner, ConversationMessage(role="user", content="a turn to summarise"))
    with rec:
        lease = await _turns(m).acquire_summary_lease(
            owner, min_turns=1, cooldown_seconds=0, lease_seconds=60
        )
    assert lease is not None


async def _lease_finish(m: MemoryManager, rec: CommandRecorder) -> None:
    owner = _ann(session_id="s-lease-2")
    await m.append(owner, ConversationMessage(role="user", content="a turn to summarise"))
    lease = await _turns(m).acquire_summary_lease(
        owner, min_turns=1, cooldown_seconds=0, lease_seconds=60
    )
    assert lease is not None
    with rec:
        assert await _turns(m).finish_summary_lease(owner, lease, turns_at_summary=1)


async def _lease_release(m: MemoryManager, rec: CommandRecorder) -> None:
    owner = _ann(session_id="s-lease-3")
    await m.append(owner, ConversationMessage(role="user", content="a turn to summarise"))
    lease = await _turns(m).acquire_summary_lease(
        owner, min_turns=1, cooldown_seconds=0, lease_seconds=60
    )
    assert lease is not None
    with rec:
        assert await _turns(m).release_summary_lease(owner, lease)


async def _scratch(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        assert await m.scratch(ANN) == {"step": "drafting"}


async def _update(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        await m.update(_ann(run_id="r-update"), {"step": "checking"})


async def _clear_working(m: MemoryManager, rec: CommandRecorder) -> None:
    owner = _ann(run_id="r-clear")
    await m.update(owner, {"step": "scrap"})
    with rec:
        assert await m.clear_working(owner) == 1


async def _save(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        assert (await m.save(ANN, Memory(content="ann saved this"))).created


async def _save_many(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        saved = await m.save_many(
            ANN, [Memory(content="ann batch one"), Memory(content="ann batch two")]
        )
    assert len(saved) == 2


async def _inject(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        assert (await m.inject_memory(ANN, "ann injected this")).created


async def _save_tenant(m: MemoryManager, rec: CommandRecorder) -> None:
    # the elevated role's (a TENANT memory)
    with rec:
        saved = await m.save(ANN, Memory(content="the tenant's rule", scope=MemoryScope.TENANT))
    assert saved.created


async def _save_many_tenant(m: MemoryManager, rec: CommandRecorder) -> None:
    # the elevated role's (TENANT memories)
    batch = [Memory(content=f"tenant rule {i}", scope=MemoryScope.TENANT) for i in (1, 2)]
    with rec:
        assert len(await m.save_many(ANN, batch)) == 2


async def _search(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        assert await m.search(ANN, "green tea")


async def _get(m: MemoryManager, rec: CommandRecorder) -> None:
    memory_id = await _saved(m, "ann: a note to read")
    with rec:
        assert await m.get(ANN, memory_id) is not None


async def _get_missing(m: MemoryManager, rec: CommandRecorder) -> None:
    # no memory of the id: with no GLOBAL memory possible, nothing else to read
    with rec:
        assert await m.get(ANN, "0" * 32) is None


async def _get_many(m: MemoryManager, rec: CommandRecorder) -> None:
    ids = [await _saved(m, "ann: one to read"), await _saved(m, "ann: another to read")]
    with rec:
        assert len(await _store(m).get_many(ANN, ids)) == 2


async def _current(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        assert await m.current_memories(ANN)


async def _history(m: MemoryManager, rec: CommandRecorder) -> None:
    memory_id = await _saved(m, "ann: a fact with a past")
    with rec:
        assert len(await m.history(ANN, memory_id)) == 1


async def _delete(m: MemoryManager, rec: CommandRecorder) -> None:
    memory_id = await _saved(m, "ann: a fact to delete")
    with rec:
        assert await m.delete(ANN, memory_id)


async def _supersede(m: MemoryManager, rec: CommandRecorder) -> None:
    memory_id = await _saved(m, "ann lives in Berlin")
    with rec:
        result = await _store(m).supersede(ANN, memory_id, Memory(content="ann lives in Rome"))
    assert result is not None and result.created


async def _close(m: MemoryManager, rec: CommandRecorder) -> None:
    memory_id = await _saved(m, "ann: a fact that falls away")
    with rec:
        assert await _store(m).close_memory(ANN, memory_id, MemoryScope.USER)


async def _add_fact(m: MemoryManager, rec: CommandRecorder) -> None:
    # extraction's fact write
    with rec:
        result = await _store(m).add_fact(ANN, Memory(content="ann: an extracted fact"))
    assert result.created


async def _expire(m: MemoryManager, rec: CommandRecorder) -> None:
    # the caller's own memories past their expiry closed (a tenant's sweep)
    with rec:
        await _store(m).expire_memories(ANN)


async def _profile(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        profile = await m.profile(ANN)
    assert profile.stable or profile.recent


async def _consolidate(m: MemoryManager, rec: CommandRecorder) -> None:
    await _saved(m, "Ann drinks coffee.")
    await _saved(m, "ann drinks coffee")
    with rec:
        report = await m.consolidate(ANN)
    assert report.merges


async def _recall(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        assert await m.recall(ANN, "green tea")


async def _summary(m: MemoryManager, rec: CommandRecorder) -> None:
    with rec:
        await _store(m).load_summary(ANN)


async def _summary_write(m: MemoryManager, rec: CommandRecorder) -> None:
    owner = _ann(session_id="s-summary")
    [turn] = [await m.append(owner, ConversationMessage(role="user", content="sum me up"))]
    summary = Memory(
        id=summary_memory_id(owner),
        scope=MemoryScope.SESSION,
        memory_type=MemoryType.SUMMARY,
        content="ann asked to be summed up",
        source="summary",
        source_message_ids=[str(turn.id)],
        metadata={"last_covered_message_id": str(turn.id)},
    )
    with rec:
        assert await _store(m).save_summary(owner, summary, expected_frontier=None) is not None


async def _erase(m: MemoryManager, rec: CommandRecorder) -> None:
    # the elevated role's: a user's rows in every tier
    zed = MemoryOwner(tenant_id=TENANT, principal_id="zed", session_id="s1")
    await m.append(zed, ConversationMessage(role="user", content="zed was here"))
    await m.save(zed, Memory(content="zed likes chess"))
    with rec:
        receipt = await m.erase(TENANT, user_id="zed")
    assert receipt.short_term == 1 and receipt.long_term == 1


async def _erase_agent(m: MemoryManager, rec: CommandRecorder) -> None:
    bot = MemoryOwner(tenant_id=TENANT, principal_id="bot-7", session_id="s1")
    await m.save(bot, Memory(content="bot-7 noted a thing"))
    with rec:
        receipt = await m.erase_agent_memories(TENANT, "bot-7")
    assert receipt.long_term == 1


@dataclass(frozen=True)
class OneHop:
    """A call that is one command to the tenant's worker: ``function`` (harbor.<name>)."""

    case: Case
    function: str


#: every tenant-scoped call of the facade and its stores that is one delegated call
ONE_HOP: dict[str, OneHop] = {
    "append": OneHop(_append, "append_turn"),
    "recent": OneHop(_recent, "recent_turns_delegated"),
    "clear (a session's turns)": OneHop(_clear, "clear_session_delegated"),
    "turns after a cursor": OneHop(_turns_after, "messages_after_delegated"),
    "turns through one": OneHop(_turns_through, "turns_through_delegated"),
    "summary due": OneHop(_summary_due, "summary_due_delegated"),
    "summary lease taken": OneHop(_lease_acquire, "summary_lease_acquire_delegated"),
    "summary lease finished": OneHop(_lease_finish, "summary_lease_end_delegated"),
    "summary lease released": OneHop(_lease_release, "summary_lease_end_delegated"),
    "session summary": OneHop(_summary, "session_summary_delegated"),
    "session summary written": OneHop(_summary_write, "save_summary_delegated"),
    "scratch (working state)": OneHop(_scratch, "working_state_delegated"),
    "update (working state)": OneHop(_update, "working_update_delegated"),
    "clear_working": OneHop(_clear_working, "clear_working_delegated"),
    "save": OneHop(_save, "save_memory_delegated"),
    "save_many": OneHop(_save_many, "save_memories_delegated"),
    "inject_memory": OneHop(_inject, "save_memory_delegated"),
    "save of a TENANT memory (elevated)": OneHop(_save_tenant, "save_tenant_memories_delegated"),
    "save_many of TENANT memories (elevated)": OneHop(
        _save_many_tenant, "save_tenant_memories_delegated"
    ),
    "search": OneHop(_search, "search_delegated"),
    "get": OneHop(_get, "get_memories_delegated"),
    "get of an id not stored": OneHop(_get_missing, "get_memories_delegated"),
    "get_many": OneHop(_get_many, "get_memories_delegated"),
    "current_memories": OneHop(_current, "current_memories_delegated"),
    "history": OneHop(_history, "memory_history_delegated"),
    "delete": OneHop(_delete, "delete_memory_delegated"),
    "supersede": OneHop(_supersede, "add_fact_delegated"),
    "close_memory": OneHop(_close, "close_memory_delegated"),
    "add_fact (extraction's fact write)": OneHop(_add_fact, "add_fact_delegated"),
    "expire (the caller's memories)": OneHop(_expire, "expire_memories_delegated"),
    "profile": OneHop(_profile, "profile_delegated"),
    "consolidate": OneHop(_consolidate, "consolidate_delegated"),
    "recall": OneHop(_recall, "recall_delegated"),
}


def _one_command_to_the_tenants_worker(db: ClusterDatabase, sent: list[tuple[int, str]]) -> str:
    """``sent`` is one command, a statement, to the tenant's worker; the function it calls."""
    assert len(sent) == 1, sent
    [(port, command)] = sent
    assert not CONTROL.match(command), sent
    assert port == db.node_of(TENANT).port, sent
    return _function(command)


@pytest.mark.parametrize("name", list(ONE_HOP))
def test_each_tenant_scoped_call_is_one_command_to_the_tenants_worker(
    seeded: ClusterDatabase, name: str
) -> None:
    call = ONE_HOP[name]
    sent = _sent(seeded, call.case)
    assert _one_command_to_the_tenants_worker(seeded, sent) == call.function


def test_an_erase_is_one_delegated_call_in_the_coordinators_transaction(
    seeded: ClusterDatabase,
) -> None:
    # (BY_DESIGN: the call, BEGIN before it and COMMIT after, to the tenant's worker alone)
    for case in (_erase, _erase_agent):
        sent = _sent(seeded, case)
        assert [p for p, _c in sent] == [seeded.node_of(TENANT).port] * 3, sent
        begin, call, commit = (c for _p, c in sent)
        assert begin.startswith("BEGIN TRANSACTION") and commit == "COMMIT", sent
        assert _function(call) == "erase_delegated", sent


def test_an_append_with_queued_jobs_is_one_delegated_call_in_the_coordinators_transaction(
    seeded: ClusterDatabase,
) -> None:
    # the call, BEGIN before it and COMMIT after, to the tenant's worker alone; the jobs
    # queued on the coordinator in the same transaction (the queue's tables are its own)
    from harbor_pg.config import MemoryManagerConfig

    owner = _ann(session_id="s-jobs")
    stored: list[int] = []

    async def append(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            turn = await m.append(owner, ConversationMessage(role="user", content="queue me"))
        assert turn.id is not None
        stored.append(turn.id)

    sent = _sent(
        seeded,
        append,
        extraction_model=ScriptedModel(facts()),
        config=MemoryManagerConfig(jobs_in_process=False),
    )
    assert [p for p, _c in sent] == [seeded.node_of(TENANT).port] * 3, sent
    begin, call, commit = (c for _p, c in sent)
    assert begin.startswith("BEGIN TRANSACTION") and commit == "COMMIT", sent
    assert "set local" not in begin.lower(), sent
    assert _function(call) == "append_turn", sent
    with psycopg.connect(seeded.superuser_url) as conn:
        queued = conn.execute(
            "select (args->>'message_id')::bigint from harbor_jobs.procrastinate_jobs"
            " where task_name = 'harbor.extract_turn' and args->>'tenant_id' = %s"
            "   and args->>'session_id' = 's-jobs'",
            (TENANT,),
        ).fetchall()
    assert stored and queued == [(stored[0],)]


# -- calls that are several calls by design, each one hop ----------------------------------


def _each_one_hop(db: ClusterDatabase, sent: list[tuple[int, str]]) -> list[str]:
    """Each command of ``sent`` is a statement to the tenant's worker (no BEGIN, SET LOCAL
    or COMMIT, no other node): the functions they call, in order."""
    assert sent, "no command was sent"
    port = db.node_of(TENANT).port
    assert [c for _p, c in sent if CONTROL.match(c)] == [], sent
    assert {p for p, _c in sent} == {port}, sent
    return [_function(c) for _p, c in sent]


def test_a_snapshot_is_three_calls_each_one_hop(seeded: ClusterDatabase) -> None:
    # (docs/citus.md: recent turns, working state and recall, sent at once)
    async def snapshot(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            snap = await m.snapshot(ANN, query="green tea")
        assert snap.recent and snap.working_state and snap.memories

    called = _each_one_hop(seeded, _sent(seeded, snapshot))
    assert sorted(called) == [
        "recall_delegated",
        "recent_turns_delegated",
        "working_state_delegated",
    ]


def test_a_recall_with_importance_decay_is_one_call_and_its_hit_write_one(
    seeded: ClusterDatabase,
) -> None:
    # recall with importance decay: the recall, then the hit write it leaves running
    # (harbor.record_hits_delegated, sql/citus/hits.sql), waited for inside the recording
    policy = MemoryPolicy(importance_half_life_hours=240)

    async def recall(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            assert await m.recall(ANN, "green tea")

    called = _each_one_hop(seeded, _sent(seeded, recall, policy=policy))
    assert called == ["recall_delegated", "record_hits_delegated"], called


def test_a_context_build_is_its_reads_each_one_hop(seeded: ClusterDatabase) -> None:
    async def build(m: MemoryManager, rec: CommandRecorder) -> None:
        builder = m.context_builder()
        with rec:
            context = await builder.build(ANN, "what tea do I like?")
        assert context.recalled

    called = _each_one_hop(seeded, _sent(seeded, build))
    assert "recall_delegated" in called and "recent_turns_delegated" in called, called
    assert all(f.endswith("_delegated") for f in called), called


def test_an_extraction_is_its_reads_and_one_call_a_fact(seeded: ClusterDatabase) -> None:
    model = ScriptedModel(facts(fact("Ann likes oolong."), fact("Ann keeps a lighthouse.")))

    async def extract(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            stored = await m.extract_memories(ANN, model=model, extract_facts=True)
        assert len(stored) == 2

    called = _each_one_hop(seeded, _sent(seeded, extract))
    assert called.count("add_fact_delegated") == 2, called
    assert all(f.endswith("_delegated") for f in called), called


def test_an_observation_is_its_read_and_one_call_a_write(seeded: ClusterDatabase) -> None:
    owner = _ann(principal_id="obs", session_id="s-obs")
    writer = ScriptedModel("Obs is fond of every kind of tea.")

    async def observe(m: MemoryManager, rec: CommandRecorder) -> None:
        for kind in ("green", "black", "white"):
            await m.save(owner, Memory(content=f"obs drinks {kind} tea", entity_ids=["tea"]))
        with rec:
            written = await m.observe(owner, model=writer)
        assert len(written) == 1

    called = _each_one_hop(seeded, _sent(seeded, observe))
    # (the observation's write with its guard, the facts it read still stored: fact.sql)
    assert called == ["current_memories_delegated", "add_fact_delegated"], called


# -- calls that are by design not one hop ---------------------------------------------------

#: each call of the facade that is by design more than one command, or not sent to the
#: tenant's worker alone, with the reason (docs/citus.md); each is asserted below
BY_DESIGN: dict[str, str] = {
    "erase / erase_agent_memories (elevated)": (
        "one call delegated to the tenant's worker (harbor.erase_delegated) inside the "
        "coordinator's transaction that deletes the subject's queued jobs from the "
        "coordinator's queue in it: BEGIN, the call and COMMIT to that worker alone, one phase"
    ),
    "search, once GLOBAL memories may exist": (
        "the tenant's memories in one delegated call, then the global ones (tenant '', whose "
        "shard may be another worker's) in one statement routed to their shard: two commands"
    ),
    "get / get_many, once GLOBAL memories may exist": (
        "as search: the tenant's shard in one delegated call, then the '' shard's; a get only "
        "when the tenant's shard has none of the id, get_many whenever the flag is set"
    ),
    "history of a GLOBAL memory": (
        "the tenant's chain in one delegated call finds nothing; the '' shard's chain is one "
        "more statement, routed there"
    ),
    "save of a GLOBAL memory (elevated)": (
        "writes the '' shard and sets harbor.global_memory_flag (a reference table, on every "
        "node) in the coordinator's transaction"
    ),
    "recall with the GLOBAL scope": (
        "reads the '' shard as well as the tenant's: harbor.recall() on the coordinator, in "
        "a transaction with SET LOCAL, each statement routed to the shards it reads"
    ),
}


def _flag(db: ClusterDatabase) -> bool:
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute("select may_exist from harbor.global_memory_flag").fetchone()
    assert row is not None
    return bool(row[0])


@pytest.fixture
def global_memory(seeded: ClusterDatabase) -> Iterator[str]:
    """A GLOBAL memory saved by the elevated role (which sets the flag); afterwards none,
    and the flag unset again (as an operator may, a superuser)."""
    found: list[str] = []

    async def save(m: MemoryManager, rec: CommandRecorder) -> None:
        saved = await m.save(
            ANN, Memory(content="everyone: tea is served at four", scope=MemoryScope.GLOBAL)
        )
        found.append(saved.memory.id or "")

    _sent(seeded, save)
    try:
        yield found[0]
    finally:
        with psycopg.connect(seeded.superuser_url) as conn:
            conn.execute("delete from harbor.memories where tenant_id = ''")
            conn.execute("update harbor.global_memory_flag set may_exist = false")


def _tenant_then_global(db: ClusterDatabase, sent: list[tuple[int, str]]) -> tuple[str, str]:
    """``sent`` is two statements: one to the tenant's worker, one to the '' shard's node;
    the functions (or statements) they ran."""
    assert [c for _p, c in sent if CONTROL.match(c)] == [], sent
    assert len(sent) == 2, sent
    tenant = [c for p, c in sent if p == db.node_of(TENANT).port and "_delegated(" in c]
    others = [c for c in (c for _p, c in sent) if c not in tenant]
    assert len(tenant) == 1 and len(others) == 1, sent
    assert {p for p, c in sent if c in others} == {db.node_of("").port}, sent
    return _function(tenant[0]), others[0]


def test_a_search_once_global_memories_may_exist(
    seeded: ClusterDatabase, global_memory: str
) -> None:
    async def search(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            found = await m.search(ANN, "tea")
        assert {x.id for x in found} >= {global_memory}

    delegated, other = _tenant_then_global(seeded, _sent(seeded, search))
    assert delegated == "search_delegated"
    assert "memories" in other


def test_a_get_and_get_many_once_global_memories_may_exist(
    seeded: ClusterDatabase, global_memory: str
) -> None:
    async def get(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            assert await m.get(ANN, global_memory) is not None

    delegated, _other = _tenant_then_global(seeded, _sent(seeded, get))
    assert delegated == "get_memories_delegated"

    async def get_many(m: MemoryManager, rec: CommandRecorder) -> None:
        mine = await _saved(m, "ann: one read beside a global one")
        with rec:
            assert len(await _store(m).get_many(ANN, [mine, global_memory])) == 2

    delegated, _other = _tenant_then_global(seeded, _sent(seeded, get_many))
    assert delegated == "get_memories_delegated"

    async def get_own(m: MemoryManager, rec: CommandRecorder) -> None:
        mine = await _saved(m, "ann: found on the tenant's shard")
        with rec:
            assert await m.get(ANN, mine) is not None

    # a get the tenant's shard answers is still one command
    assert _one_command_to_the_tenants_worker(seeded, _sent(seeded, get_own)) == (
        "get_memories_delegated"
    )


def test_the_history_of_a_global_memory(seeded: ClusterDatabase, global_memory: str) -> None:
    async def history(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            assert len(await m.history(ANN, global_memory)) == 1

    delegated, _other = _tenant_then_global(seeded, _sent(seeded, history))
    assert delegated == "memory_history_delegated"


def test_a_global_save_is_the_coordinators_transaction_and_sets_the_flag(
    seeded: ClusterDatabase, global_memory: str
) -> None:
    with psycopg.connect(seeded.superuser_url) as conn:
        conn.execute("update harbor.global_memory_flag set may_exist = false")
    assert not _flag(seeded)

    async def save(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            await m.save(
                ANN,
                Memory(content="everyone: the lighthouse closes at nine", scope=MemoryScope.GLOBAL),
            )

    sent = _sent(seeded, save)
    assert any(CONTROL.match(c) for _p, c in sent), sent  # a transaction
    workers = {w.port for w in seeded.cluster.workers}
    assert {p for p, _c in sent} == workers, sent  # the '' shard's, and the flag on every node
    assert _flag(seeded)


def test_a_recall_with_the_global_scope_reads_the_global_shard_too(
    seeded: ClusterDatabase, global_memory: str
) -> None:
    policy = MemoryPolicy(recall_scopes=(MemoryScope.USER, MemoryScope.GLOBAL))

    async def recall(m: MemoryManager, rec: CommandRecorder) -> None:
        with rec:
            found = await m.recall(ANN, "tea")
        assert global_memory in {x.id for x in found}

    sent = _sent(seeded, recall, policy=policy)
    # the coordinator's transaction, the identity set with SET LOCAL
    assert any(c.startswith("BEGIN") and "set local harbor.tenant_id" in c for _p, c in sent)
    queries = {p for p, c in sent if not CONTROL.match(c)}
    assert queries == {seeded.node_of(TENANT).port, seeded.node_of("").port}, sent
    assert "recall_delegated" not in {_function(c) for _p, c in sent}
