"""MemoryPolicy.max_session_turns caps every recent read, in one place."""

from __future__ import annotations

import pytest

from harbor_pg import (
    ConversationMessage,
    MemoryConfigurationError,
    MemoryManager,
    MemoryManagerConfig,
    MemoryOwner,
    MemoryPolicy,
)
from harbor_pg.db.connection import Database

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1", run_id="r1")
FIVE = MemoryPolicy(max_session_turns=5, recent_max_messages=4, summary_keep_messages=4)


async def _fill(manager: MemoryManager, n: int) -> None:
    for i in range(n):
        await manager.append(OWNER, ConversationMessage(role="user", content=f"turn {i}"))


@pytest.mark.parametrize("backend", ["in_process", "postgres"])
async def test_policy_cap_holds_for_recent_and_snapshot(backend: str, database: Database) -> None:
    if backend == "in_process":
        manager = await MemoryManager.create(in_process=True, policy=FIVE)
    else:
        manager = MemoryManager.from_database(database, policy=FIVE)
    try:
        await _fill(manager, 8)
        got = await manager.recent(OWNER)
        assert [m.content for m in got] == [f"turn {i}" for i in range(3, 8)]
        assert len(await manager.recent(OWNER, limit=100)) == 5
        snap = await manager.snapshot(OWNER, recent_limit=100)
        assert [m.content for m in snap.recent] == [f"turn {i}" for i in range(3, 8)]
    finally:
        await manager.close()


async def test_default_cap_is_fifty_as_seed_004_states() -> None:
    assert MemoryPolicy().max_session_turns == 50
    manager = await MemoryManager.create(in_process=True)
    await _fill(manager, 60)
    got = await manager.recent(OWNER)
    assert len(got) == 50 and got[-1].content == "turn 59"
    await manager.close()


def test_the_knob_lives_only_in_the_policy() -> None:
    with pytest.raises(MemoryConfigurationError, match="MemoryPolicy"):
        MemoryManagerConfig(max_session_turns=5)  # type: ignore[call-arg]
    assert "max_session_turns" not in MemoryManagerConfig.model_fields
