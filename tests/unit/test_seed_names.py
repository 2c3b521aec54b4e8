"""Seed 000's public names, and its worked example with one import changed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import harbor_pg

# seed 000's "Worked example", verbatim except for the package name
WORKED_EXAMPLE = textwrap.dedent(
    """
    import asyncio
    from harborrag_memory import (
        InMemoryWorkingMemoryStore,
        MemoryManager,
        MemoryOwner,
        WorkingMemory,
    )

    async def main() -> None:
        owner = MemoryOwner(
            tenant_id="tenant-1",
            principal_id="user-1",
            session_id="session-1",
            run_id="run-1",
        )
        memory = MemoryManager(working=WorkingMemory(InMemoryWorkingMemoryStore()))
        await memory.update(owner, {"step": "retrieval", "candidates": 12})
        print(await memory.scratch(owner))  # {'step': 'retrieval', 'candidates': 12}
        snapshot = await memory.snapshot(owner)  # recent turns + working state + memories
        print(snapshot.working_state)

    asyncio.run(main())
    """
)

#: Every public name seed 000 shows in its examples and module map (docs/integrations.md lists
#: the few it names that harbor-pg deliberately does not provide).
SEED_NAMES = (
    "InMemoryWorkingMemoryStore",
    "MemoryManager",
    "MemoryManagerConfig",
    "MemoryOwner",
    "MemoryScope",
    "WorkingMemory",
    "ShortTermMemory",
    "LongTermMemory",
    "MemoryContextBuilder",
    "MemoryContext",
    "MemoryPolicy",
    "MemoryRecall",
    "MemoryExtractor",
    "MemoryEntityResolver",
    "ResolvedEntity",
    "MemoryError",
    "MemoryConfigurationError",
    "MemoryScopeError",
    "HarborChatMessageHistory",
    "ConversationMessage",
    "Memory",
    "MemoryModel",
    "RECALL_MEMORY_TYPES",
    "approximate_tokens",
    "recalled_entity_ids",
    "scope_owner_fields",
)


def test_the_worked_example_runs_with_harbor_pg_imported() -> None:
    code = WORKED_EXAMPLE.replace("harborrag_memory", "harbor_pg")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "{'step': 'retrieval', 'candidates': 12}",
        "{'step': 'retrieval', 'candidates': 12}",
    ]


@pytest.mark.parametrize("name", SEED_NAMES)
def test_seed_name_is_exported(name: str) -> None:
    assert name in harbor_pg.__all__
    assert getattr(harbor_pg, name) is not None


async def test_tier_objects_wrap_stores_and_offer_their_methods() -> None:
    owner = harbor_pg.MemoryOwner(tenant_id="t", principal_id="u", session_id="s", run_id="r")
    short = harbor_pg.ShortTermMemory(harbor_pg.InMemoryConversationStore())
    working = harbor_pg.WorkingMemory()
    long_term = harbor_pg.LongTermMemory(harbor_pg.InMemoryMemoryRepository())
    memory = harbor_pg.MemoryManager(short_term=short, working=working, long_term=long_term)
    assert memory.short_term is short.store and memory.long_term is long_term.store
    await memory.append(owner, harbor_pg.ConversationMessage(role="user", content="hi"))
    assert [m.content for m in await short.recent(owner)] == ["hi"]
    await working.update(owner, {"k": 1})
    assert await memory.scratch(owner) == {"k": 1}
    await memory.inject_memory(owner, "Dana owns ingest")
    assert [m.content for m in await long_term.search(owner, "ingest")] == ["Dana owns ingest"]
