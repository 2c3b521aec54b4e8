"""Consolidation: near-duplicates merged into one successor, add-only, on both stores."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from harbor_pg.consolidation import consolidation_groups
from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryScopeError, MemoryValidationError
from harbor_pg.llm.base import MemoryModelError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory, Sensitivity
from harbor_pg.tiers.in_process import InMemoryLongTermStore
from tests.conftest import PgDatabase, run_cli

NOW = datetime.now(UTC).replace(microsecond=0)
ALICE = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
BOB = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="bob", session_id="s1")


def _ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def _teas() -> list[Memory]:
    return [
        Memory(content="Alice likes tea.", importance=0.5, valid_from=_ago(10), entity_ids=["tea"]),
        Memory(
            content="alice LIKES   tea",
            importance=0.8,
            valid_from=_ago(5),
            entity_ids=["alice"],
            sensitivity=Sensitivity.PII,
        ),
        Memory(content="Alice likes tea!!", importance=0.3, valid_from=_ago(3)),
        Memory(content="Alice works at the harbour", valid_from=_ago(7)),
    ]


async def _current(manager: MemoryManager, owner: MemoryOwner = ALICE) -> list[str]:
    return sorted(m.content for m in await manager.current_memories(owner, ["user"]))


async def test_texts_that_differ_in_case_and_punctuation_merge(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    saved = await manager.save_many(ALICE, _teas())
    ids = [r.memory.id for r in saved]
    report = await manager.consolidate(ALICE)
    [merge] = report.merges
    # the head (the most important) first, then the members in id order
    assert merge.merged_ids == (ids[1], *sorted([ids[0], ids[2]]))
    assert merge.matched_by == "text" and merge.content == "alice LIKES   tea"
    assert report.superseded == 3
    assert await _current(manager) == ["Alice works at the harbour", "alice LIKES   tea"]
    successor = await manager.get(ALICE, merge.successor_id)
    assert successor is not None
    assert successor.importance == pytest.approx(0.8)
    assert successor.entity_ids == ["alice", "tea"]
    assert successor.sensitivity is Sensitivity.PII
    assert successor.metadata["consolidated_from"] == list(merge.merged_ids)
    # add-only: the originals are closed and linked, and as of before they are current
    for memory_id in merge.merged_ids:
        old = await manager.get(ALICE, memory_id)
        assert old is not None and old.superseded_by == merge.successor_id
        assert old.invalid_at is not None
    before = await manager.recall(ALICE, "tea", as_of=_ago(1), token_budget=10_000)
    assert {m.id for m in before} >= set(merge.merged_ids)
    after = await manager.recall(ALICE, "tea", token_budget=10_000)
    assert [m.id for m in after if "tea" in m.content.lower()] == [merge.successor_id]
    # the history (the inspector's timeline) of the successor shows every memory it merged
    history = await manager.history(ALICE, merge.successor_id or "")
    assert {m.id for m in history[:-1]} == set(merge.merged_ids)
    assert history[-1].id == merge.successor_id
    # a second run finds nothing more to merge
    assert (await manager.consolidate(ALICE)).merges == ()


async def test_near_vectors_merge_and_a_threshold_keeps_others_apart(database: Database) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    await manager.save_many(
        ALICE,
        [
            Memory(content="Alice keeps two cats named Miso and Tofu", importance=0.6),
            Memory(content="Alice keeps two cats, Miso and Tofu", importance=0.4),
            Memory(content="Bob's boat is moored in the north harbour"),
        ],
    )
    # too strict: nothing
    assert (await manager.consolidate(ALICE, min_similarity=0.999)).merges == ()
    [merge] = (await manager.consolidate(ALICE, min_similarity=0.7)).merges
    assert merge.matched_by == "vector"
    assert merge.content == "Alice keeps two cats named Miso and Tofu"
    # the successor is found by the dense leg: its vectors were carried over
    got = await manager.recall(ALICE, "how many cats does Alice keep?", token_budget=10_000)
    assert got[0].id == merge.successor_id


async def test_the_default_threshold_is_the_embedders(database: Database) -> None:
    cats = [
        Memory(content="Alice keeps two cats named Miso and Tofu", importance=0.6),
        Memory(content="Alice keeps two cats, Miso and Tofu", importance=0.4),
    ]
    strict, loose = HashingEmbedder(), HashingEmbedder()
    strict.duplicate_threshold, loose.duplicate_threshold = 0.999, 0.7
    await MemoryManager.from_database(database, embedder=strict).save_many(ALICE, cats)
    # no min_similarity: each manager merges at its embedder's calibrated threshold
    report = await MemoryManager.from_database(database, embedder=strict).consolidate(ALICE)
    assert report.merges == ()
    report = await MemoryManager.from_database(database, embedder=loose).consolidate(ALICE)
    [merge] = report.merges
    assert merge.matched_by == "vector"


async def test_writers_and_owners_are_never_merged_together(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    project = MemoryScope.PROJECT
    await manager.save(ALICE, Memory(content="The deploy runs on Fridays", scope=project))
    await manager.save(BOB, Memory(content="the deploy runs on fridays!", scope=project))
    await manager.save(ALICE, Memory(content="I prefer green tea"))
    await manager.save(BOB, Memory(content="I prefer green tea."))
    assert (await manager.consolidate(ALICE, scopes=["user", "project"])).merges == ()
    assert (await manager.consolidate(BOB, scopes=["user", "project"])).merges == ()


@pytest.mark.parametrize("store", ["postgres", "in_process"])
async def test_a_caller_merges_only_its_own_writes_in_its_key(
    database: Database, store: str
) -> None:
    manager = (
        MemoryManager.from_database(database)
        if store == "postgres"
        else MemoryManager(long_term=InMemoryLongTermStore())
    )
    agent = MemoryOwner(tenant_id="t1", principal_id="agent", user_id="alice")
    alice = MemoryOwner(tenant_id="t1", principal_id="alice", user_id="alice")
    await manager.save_many(
        agent, [Memory(content="Alice likes tea."), Memory(content="alice likes TEA")]
    )
    # the agent's copies in Alice's key are the agent's to merge: Alice's run leaves them
    assert (await manager.consolidate(alice)).merges == ()
    assert len(await _current(manager, alice)) == 2
    [merge] = (await manager.consolidate(agent)).merges
    assert len(merge.merged_ids) == 2 and len(await _current(manager, alice)) == 1


async def test_erasing_a_user_takes_their_merged_memories(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    await manager.save_many(ALICE, _teas())
    await manager.save_many(
        BOB,
        [
            Memory(content="Bob likes tea.", valid_from=_ago(2)),
            Memory(content="bob likes TEA", valid_from=_ago(1)),  # the newer: the head
        ],
    )
    assert len((await manager.consolidate(ALICE)).merges) == 1
    assert len((await manager.consolidate(BOB)).merges) == 1
    admin = MemoryManager.from_database(database)
    await admin.erase("t1", user_id="alice")
    assert await _current(manager) == []
    assert await _current(manager, BOB) == ["bob likes TEA"]


async def test_concurrent_consolidations_merge_each_group_once(fresh_db: PgDatabase) -> None:
    databases = [Database(fresh_db.app_url, fresh_db.admin_url) for _ in range(4)]
    for db in databases:
        await db.open()
    try:
        managers = [MemoryManager.from_database(db) for db in databases]
        base = [
            Memory(content=f"Fact number {i}{suffix}", importance=0.1 * (k + 1), valid_from=_ago(1))
            for i in range(20)
            for k, suffix in enumerate(["", ".", "!"])
        ]
        await managers[0].save_many(ALICE, base)
        # three consolidations and a writer at once
        results = await asyncio.gather(
            *(m.consolidate(ALICE) for m in managers[:3]),
            managers[3].save_many(ALICE, [Memory(content=f"New fact {i}") for i in range(10)]),
        )
        merges = [m for r in results[:3] for m in r.merges]
        assert len(merges) == 20
        merged = [i for m in merges for i in m.merged_ids]
        assert len(merged) == len(set(merged)) == 60
        current = await _current(managers[0])
        assert len(current) == 30
        assert sum(c.startswith("New fact") for c in current) == 10
    finally:
        for db in databases:
            await db.close()


@pytest.mark.parametrize(("seed", "similarity"), [(1, None), (2, 0.79), (3, 0.79)])
async def test_postgres_and_in_process_agree(
    database: Database, seed: int, similarity: float | None
) -> None:
    rng = random.Random(seed)
    words = ["tea", "sail", "harbour", "net", "tide"]
    memories = []
    for i in range(30):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 4)))
        memories.append(
            Memory(
                content=rng.choice([text, text.upper(), text + ".", f"{text} {i}"]),
                importance=round(rng.random(), 2),
                valid_from=_ago(rng.uniform(1, 50)),
                scope=rng.choice([MemoryScope.USER, MemoryScope.SESSION]),
            )
        )
    pg = MemoryManager.from_database(database, embedder=HashingEmbedder())
    store = InMemoryLongTermStore()
    mem = MemoryManager(long_term=store, embedder=HashingEmbedder())
    pg_saved = await pg.save_many(ALICE, memories)
    # the in-process store keeps the vectors it is given (the manager embeds for PostgreSQL)
    embedder = HashingEmbedder()
    vectors = await embedder.embed([m.content for m in memories])
    mem_saved = [
        await store.save(ALICE, m, v, embedder.model_id)
        for m, v in zip(memories, vectors, strict=True)
    ]
    # (0.79: between the cosines bags of two to four words can have, 0.75 and 0.816, so
    # float rounding cannot decide a pair)
    # each memory by a label both stores share: its input's position (ids differ; the
    # members' order is the ids', so compared as a set)
    pg_label = {r.memory.id: str(i) for i, r in enumerate(pg_saved)}
    mem_label = {r.memory.id: str(i) for i, r in enumerate(mem_saved)}
    a = await pg.consolidate(ALICE, scopes=["user", "session"], min_similarity=similarity)
    b = await mem.consolidate(ALICE, scopes=["user", "session"], min_similarity=similarity)
    # (heads of equal rank in two owner keys are ordered by id: compared as a set too)
    views = [
        sorted(
            (label[m.merged_ids[0]], sorted(label[i] for i in m.merged_ids[1:]), m.matched_by)
            for m in report.merges
        )
        for report, label in ((a, pg_label), (b, mem_label))
    ]
    assert views[0] == views[1]
    assert views[0], "the data holds near-duplicates"
    assert await _current(pg) == await _current(mem)


async def test_bad_arguments_are_refused(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    with pytest.raises(MemoryValidationError, match="own scopes"):
        await manager.consolidate(ALICE, scopes=["tenant"])
    with pytest.raises(MemoryValidationError, match="model_id"):
        await manager.consolidate(ALICE, min_similarity=0.9)  # no embedder: no vectors
    with_vectors = MemoryManager.from_database(database, embedder=HashingEmbedder())
    with pytest.raises(MemoryValidationError, match="min_similarity"):
        await with_vectors.consolidate(ALICE, min_similarity=1.5)
    with pytest.raises(MemoryValidationError, match="max_merges"):
        await manager.consolidate(ALICE, max_merges=-1)


def test_the_sql_function_refuses_elevated_scopes(fresh_db: PgDatabase) -> None:
    with psycopg.connect(fresh_db.app_url) as conn:
        conn.execute("select harbor.set_identity('t1', user_id => 'alice', is_local => true)")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="scopes"):
            conn.execute("select * from harbor.consolidate_memories(scopes => '{tenant}')")


async def test_a_dry_run_reports_the_groups_and_writes_nothing(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    mem = MemoryManager(long_term=InMemoryLongTermStore())
    for m in (manager, mem):
        saved = await m.save_many(ALICE, _teas())
        before = await _current(m)
        [dry] = (await m.consolidate(ALICE, dry_run=True)).merges
        assert dry.successor_id is None
        assert dry.merged_ids[0] == saved[1].memory.id and len(dry.merged_ids) == 3
        assert dry.content == "alice LIKES   tea" and dry.matched_by == "text"
        assert await _current(m) == before
        [merge] = (await m.consolidate(ALICE)).merges
        assert merge.merged_ids == dry.merged_ids


def test_the_commands_consolidate_and_print_the_profile(fresh_db: PgDatabase) -> None:
    async def seed() -> None:
        db = Database(fresh_db.app_url, fresh_db.admin_url)
        await db.open()
        try:
            await MemoryManager.from_database(db).save_many(ALICE, _teas())
        finally:
            await db.close()

    asyncio.run(seed())
    identity = ("--tenant", "t1", "--project", "p1", "--principal", "alice")
    dry = run_cli("consolidate", *identity, "--dry-run", url=fresh_db.superuser_url)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("would merge 3 (text): alice LIKES   tea")
    assert "1 groups, 3 memories would be superseded" in dry.stderr
    done = run_cli("consolidate", *identity, url=fresh_db.superuser_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("merged 3 (text) into ")
    again = run_cli("consolidate", *identity, url=fresh_db.superuser_url)
    assert again.stdout == "" and "0 groups" in again.stderr
    profile = run_cli("profile", *identity, "--stable-days", "4", url=fresh_db.superuser_url)
    assert profile.returncode == 0, profile.stderr
    assert profile.stdout.splitlines()[0] == "Stable:"
    assert "Alice works at the harbour" in profile.stdout
    assert "Recent:" in profile.stdout and "alice LIKES tea" in profile.stdout
    bad = run_cli("consolidate", *identity, "--max-merges", "-1", url=fresh_db.superuser_url)
    assert bad.returncode == 2 and "max_merges" in bad.stderr


async def test_since_compares_the_new_memories_with_the_rest(database: Database) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    old = await manager.save_many(
        ALICE,
        [
            Memory(content="Alice keeps two cats named Miso and Tofu", importance=0.6),
            Memory(content="Alice keeps two cats, Miso and Tofu", importance=0.4),
        ],
    )
    await asyncio.sleep(0.05)
    mark = datetime.now(UTC)
    # the two stored before the mark are not compared with each other
    assert (await manager.consolidate(ALICE, min_similarity=0.7, since=mark)).merges == ()
    new = await manager.save(ALICE, Memory(content="Alice keeps two cats: Miso and Tofu"))
    [merge] = (await manager.consolidate(ALICE, min_similarity=0.7, since=mark)).merges
    assert merge.merged_ids == (old[0].memory.id, new.memory.id)
    # without since, the one left is compared with the successor and merged too
    [last] = (await manager.consolidate(ALICE, min_similarity=0.7)).merges
    assert set(last.merged_ids) == {merge.successor_id, old[1].memory.id}


def test_the_reference_compares_vectors_only_with_a_new_side() -> None:
    t0 = NOW - timedelta(days=1)
    rows = [
        Memory(id="a", content="x one", importance=0.9, created_at=t0, valid_from=t0),
        Memory(id="b", content="x two", importance=0.5, created_at=t0, valid_from=t0),
        Memory(id="c", content="x three", importance=0.1, created_at=NOW, valid_from=NOW),
    ]
    same = {"a": [1.0, 0.0], "b": [1.0, 0.0], "c": [1.0, 0.0]}
    assert consolidation_groups(rows, same, 0.9) == [("a", ("b", "c"), "vector")]
    assert consolidation_groups(rows, same, 0.9, since=NOW) == [("a", ("c",), "vector")]


class _Writer:
    """A scripted MemoryModel for merged texts: answers from a list, records the prompts."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.prompts: list[str] = []

    async def generate_text(self, system: str, user: str) -> str:
        self.prompts.append(user)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        raise AssertionError("not used")


@pytest.mark.parametrize("store", ["postgres", "in_process"])
async def test_a_model_writes_the_merged_text(database: Database, store: str) -> None:
    embedder = HashingEmbedder()
    manager = (
        MemoryManager.from_database(database, embedder=embedder)
        if store == "postgres"
        else MemoryManager(long_term=InMemoryLongTermStore(), embedder=embedder)
    )
    await manager.save_many(ALICE, _teas())
    await manager.save_many(
        ALICE, [Memory(content="Bob sails on Sundays."), Memory(content="bob sails on sundays")]
    )
    writer = _Writer("Alice likes  tea, and says so often.", MemoryModelError("rate limited"))
    report = await manager.consolidate(ALICE, model=writer)
    tea, sail = sorted(report.merges, key=lambda m: m.content)
    assert tea.written and tea.content == "Alice likes tea, and says so often."
    assert not sail.written and sail.content in ("Bob sails on Sundays.", "bob sails on sundays")
    assert "1. alice LIKES tea" in writer.prompts[0]  # the texts, whitespace collapsed
    successor = await manager.get(ALICE, tea.successor_id or "")
    assert successor is not None and successor.context is None
    assert successor.metadata["written_by_model"] is True
    assert successor.metadata["consolidated_from"] == list(tea.merged_ids)
    got = await manager.recall(ALICE, "does alice say she likes tea often", token_budget=10_000)
    assert got[0].id == tea.successor_id


async def test_a_written_text_already_current_elsewhere_is_not_used(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    await manager.save_many(ALICE, [*_teas(), Memory(content="Alice drinks tea")])
    writer = _Writer("Alice drinks tea")  # the content of a memory outside the group
    [merge] = (await manager.consolidate(ALICE, model=writer)).merges
    assert not merge.written and merge.content == "alice LIKES   tea"
    assert "Alice drinks tea" in await _current(manager)


async def test_a_tenant_wide_run_consolidates_every_user_as_that_user(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    await manager.save_many(ALICE, _teas())
    await manager.save_many(BOB, [Memory(content="Bob sails."), Memory(content="bob SAILS")])
    other = MemoryOwner(tenant_id="t2", principal_id="carol")
    await manager.save_many(other, [Memory(content="Carol rows."), Memory(content="carol rows")])
    seen: list[tuple[int, int]] = []
    reports = await manager.consolidate_tenant("t1", progress=lambda d, n: seen.append((d, n)))
    assert sorted(reports) == ["alice", "bob"] and seen == [(1, 2), (2, 2)]
    assert [len(r.merges) for r in reports.values()] == [1, 1]
    assert len(await _current(manager, other)) == 2  # another tenant: untouched
    with pytest.raises(MemoryScopeError):
        await manager.bound_to(ALICE).consolidate_tenant("t1")


def test_the_command_consolidates_every_user(fresh_db: PgDatabase) -> None:
    async def seed() -> None:
        db = Database(fresh_db.app_url, fresh_db.admin_url)
        await db.open()
        try:
            manager = MemoryManager.from_database(db)
            await manager.save_many(ALICE, _teas())
            await manager.save_many(
                BOB, [Memory(content="Bob sails."), Memory(content="bob SAILS")]
            )
        finally:
            await db.close()

    asyncio.run(seed())
    done = run_cli("consolidate", "--tenant", "t1", "--all-users", url=fresh_db.superuser_url)
    assert done.returncode == 0, done.stderr
    assert sorted(line.split(":")[0] for line in done.stdout.splitlines()) == ["alice", "bob"]
    assert "2 groups, 5 memories superseded over 2 users" in done.stderr
