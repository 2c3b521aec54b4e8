"""A user's profile: harbor.profile() and MemoryManager.profile on both stores.

The PostgreSQL store answers with ``harbor.profile()``; the in-process store with
``harbor_pg.profile.profile_of``. Both are fed the same memories here and must give
the same sections, ranks and tokens, budget by budget.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryValidationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.profile import ProfileRequest, UserProfile, profile_of
from harbor_pg.records import Memory, MemoryType, Sensitivity
from harbor_pg.tiers.in_process import InMemoryLongTermStore
from tests.conftest import PgDatabase

NOW = datetime.now(UTC).replace(microsecond=0)
ALICE = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
BOB = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="bob", session_id="s1")


def _ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def _facts() -> list[Memory]:
    return [
        Memory(content="Alice is vegetarian", importance=0.9, valid_from=_ago(200)),
        Memory(content="Alice lives in Lisbon", importance=0.5, valid_from=_ago(120)),
        Memory(content="Alice plays the cello", importance=0.7, valid_from=_ago(90)),
        Memory(content="Alice started a new job at the harbour office", valid_from=_ago(2)),
        Memory(content="Alice is reading a book on tides", importance=0.8, valid_from=_ago(5)),
    ]


def _view(profile: UserProfile) -> list[tuple[str, int, str, int]]:
    return [
        (section, e.rank, e.memory.content, e.tokens)
        for section, entries in (("stable", profile.stable), ("recent", profile.recent))
        for e in entries
    ]


async def test_sections_order_and_what_is_left_out(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    await manager.save_many(ALICE, _facts())
    # neither a summary, nor a memory of another user, nor a closed one is a profile's
    await manager.save(BOB, Memory(content="Bob is vegetarian", valid_from=_ago(100)))
    old = await manager.save(ALICE, Memory(content="Alice lives in Porto", valid_from=_ago(300)))
    assert old.memory is not None and old.memory.id is not None
    await manager.long_term.supersede(
        ALICE, old.memory.id, Memory(content="Alice moved away from Porto", importance=0.1)
    )
    got = await manager.profile(ALICE, token_budget=None)
    assert [e.memory.content for e in got.stable] == [
        "Alice is vegetarian",
        "Alice plays the cello",
        "Alice lives in Lisbon",
    ]
    assert [e.memory.content for e in got.recent] == [
        "Alice moved away from Porto",
        "Alice started a new job at the harbour office",
        "Alice is reading a book on tides",
    ]
    assert [e.rank for e in got.stable] == [1, 2, 3] and [e.rank for e in got.recent] == [1, 2, 3]
    assert all(e.memory.user_id == "alice" for e in (*got.stable, *got.recent))
    assert got.tokens == sum(e.tokens for e in (*got.stable, *got.recent)) > 0
    assert got.render().splitlines()[0] == "Stable:"
    # as of 100 days ago: Lisbon (from 120 days ago) was recent, Porto still current,
    # the cello not yet
    then = await manager.profile(ALICE, token_budget=None, as_of=_ago(100))
    assert [e.memory.content for e in then.stable] == [
        "Alice is vegetarian",
        "Alice lives in Porto",
    ]
    assert [e.memory.content for e in then.recent] == ["Alice lives in Lisbon"]
    # a shorter stable_after moves memories from recent to stable
    week = await manager.profile(ALICE, token_budget=None, stable_after=timedelta(days=3))
    assert "Alice is reading a book on tides" in [e.memory.content for e in week.stable]


async def test_budget_halves_and_prefixes(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    await manager.save_many(ALICE, _facts())
    full = await manager.profile(ALICE, token_budget=None)
    line = {e.memory.content: e.tokens for e in (*full.stable, *full.recent)}
    stable_need = sum(e.tokens for e in full.stable)
    # a budget that covers the recent section's need leaves the rest to the stable one
    recent_need = sum(e.tokens for e in full.recent)
    budget = 2 * recent_need
    got = await manager.profile(ALICE, token_budget=budget)
    assert len(got.recent) == len(full.recent)
    assert got.tokens <= budget
    assert [e.memory.id for e in got.stable] == [e.memory.id for e in full.stable][
        : len(got.stable)
    ]
    assert budget - recent_need >= sum(e.tokens for e in got.stable)
    # twice the first stable line: its half holds that line and no second one (the
    # recent section needs all of its own half), and the recent half its first line
    first = line["Alice is vegetarian"]
    assert recent_need > first and line["Alice plays the cello"] > 0
    tight = await manager.profile(ALICE, token_budget=2 * first)
    assert [e.memory.content for e in tight.stable] == ["Alice is vegetarian"]
    assert [e.memory.content for e in tight.recent] == [full.recent[0].memory.content][
        : len(tight.recent)
    ]
    assert sum(e.tokens for e in tight.recent) <= first
    # one token short of the first line: the stable section is empty, never a later line
    short = await manager.profile(ALICE, token_budget=2 * first - 2)
    assert short.stable == ()
    assert (await manager.profile(ALICE, token_budget=0)).memories == []
    assert stable_need > 0


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_postgres_and_in_process_agree(database: Database, seed: int) -> None:
    rng = random.Random(seed)
    memories = [
        Memory(
            content=f"fact {i} "
            + " ".join(
                rng.choice(["tide", "harbour", "sail", "net"]) for _ in range(rng.randint(1, 12))
            ),
            importance=round(rng.random(), 2),
            valid_from=_ago(rng.uniform(0, 120)),
            scope=rng.choice([MemoryScope.USER, MemoryScope.SESSION]),
            memory_type=rng.choice([MemoryType.FACT, MemoryType.PREFERENCE, MemoryType.EPISODE]),
            sensitivity=rng.choice([Sensitivity.NONE, Sensitivity.NONE, Sensitivity.SENSITIVE]),
        )
        for i in range(40)
    ]
    # the same text in two scopes: one profile line
    memories.append(
        Memory(
            content=memories[0].content,
            scope=MemoryScope.SESSION
            if memories[0].scope is MemoryScope.USER
            else MemoryScope.USER,
            valid_from=_ago(1),
        )
    )
    pg = MemoryManager.from_database(database)
    mem = MemoryManager(long_term=InMemoryLongTermStore())
    await pg.save_many(ALICE, memories)
    await mem.save_many(ALICE, memories)
    scopes = (MemoryScope.USER, MemoryScope.SESSION)
    for budget in (None, 0, 7, 40, 150, 10_000):
        a = await pg.profile(ALICE, token_budget=budget, scopes=scopes, as_of=NOW)
        b = await mem.profile(ALICE, token_budget=budget, scopes=scopes, as_of=NOW)
        assert _view(a) == _view(b), budget
    everything = await pg.profile(ALICE, token_budget=None, scopes=scopes, as_of=NOW)
    hashes = [m.content_hash for m in everything.memories]
    assert len(hashes) == len(set(hashes))
    assert all(m.sensitivity is not Sensitivity.SENSITIVE for m in everything.memories)
    opted = MemoryManager.from_database(
        database, policy=MemoryPolicy(recall_max_sensitivity="sensitive")
    )
    more = await opted.profile(ALICE, token_budget=None, scopes=scopes, as_of=NOW)
    assert len(more.memories) > len(everything.memories)


async def test_bad_arguments_are_refused(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    with pytest.raises(MemoryValidationError, match="token_budget"):
        await manager.profile(ALICE, token_budget=-1)
    with pytest.raises(MemoryValidationError, match="stable_after"):
        await manager.profile(ALICE, stable_after=timedelta(days=-1))
    with pytest.raises(MemoryValidationError, match="own scopes"):
        await manager.profile(ALICE, scopes=["global"])
    with pytest.raises(MemoryValidationError):
        await manager.profile(ALICE, scopes=["nonsense"])
    with pytest.raises(MemoryValidationError, match="timezone"):
        await manager.profile(ALICE, as_of=datetime(2026, 1, 1))


def test_the_sql_function_refuses_a_negative_budget(fresh_db: PgDatabase) -> None:
    with psycopg.connect(fresh_db.app_url) as conn:
        conn.execute("select harbor.set_identity('t1', user_id => 'alice', is_local => true)")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="token_budget"):
            conn.execute("select * from harbor.profile(token_budget => -5)")


async def test_an_owner_who_cannot_address_a_scope_gets_an_empty_section(
    database: Database,
) -> None:
    manager = MemoryManager.from_database(database)
    no_session = MemoryOwner(tenant_id="t1", principal_id="carol")
    await manager.save(no_session, Memory(content="Carol likes tea", valid_from=_ago(40)))
    got = await manager.profile(no_session, scopes=["session", "user"], token_budget=None)
    assert [e.memory.content for e in got.stable] == ["Carol likes tea"]
    assert await manager.profile(no_session, scopes=["session"]) == UserProfile()


def test_profile_of_is_the_reference() -> None:
    facts = [
        m.model_copy(update={"content_hash": f"h{i}", "id": f"m{i}"})
        for i, m in enumerate(_facts())
    ]
    got = profile_of(facts, ProfileRequest(token_budget=None), as_of=NOW)
    assert [e.memory.id for e in got.stable] == ["m0", "m2", "m1"]
    assert [e.memory.id for e in got.recent] == ["m3", "m4"]
    with pytest.raises(MemoryValidationError):
        ProfileRequest(scopes=())


async def test_the_context_builder_carries_the_profile_when_asked(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    await manager.save_many(ALICE, _facts())
    question = "what does Alice play and eat?"
    # off by default: no profile, recall as before
    plain = await manager.context_builder(
        policy=MemoryPolicy(query_rewrite=False, recall_top_k=10)
    ).build(ALICE, question)
    assert plain.profile is None
    assert "Alice is vegetarian" in [m.content for m in plain.recalled]
    asked = await manager.context_builder(
        policy=MemoryPolicy(query_rewrite=False, recall_top_k=10, profile_max_tokens=200)
    ).build(ALICE, question)
    assert asked.profile is not None
    assert asked.profile == await manager.profile(ALICE, token_budget=200)
    held = {m.id for m in asked.profile.memories}
    assert "Alice is vegetarian" in [m.content for m in asked.profile.memories]
    # what the profile holds is not recalled a second time
    assert not held & {m.id for m in asked.recalled}
    assert asked.degraded == ()


def test_profile_max_tokens_is_checked() -> None:
    from harbor_pg.errors import MemoryConfigurationError

    with pytest.raises(MemoryConfigurationError, match="profile_max_tokens"):
        MemoryPolicy(profile_max_tokens=-1)
