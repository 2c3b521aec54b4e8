"""Every scope saves through every write path, with the embedder on and off."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory, MemoryType, Sensitivity
from tests.conftest import PgDatabase

OWNER = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="dana", session_id="s1", run_id="r1"
)
PATHS = ("save", "save_many", "inject_memory")


def vectors_of(db: PgDatabase, content: str) -> int:
    """How many vectors the memory holding ``content`` has (read as the superuser)."""
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute(
            "select count(e.*) from harbor.memories m left join harbor.memory_embeddings e"
            " on e.tenant_id = m.tenant_id and e.memory_id = m.id where m.content = %s",
            (content,),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(("embedder_on", "path"), list(itertools.product((True, False), PATHS)))
async def test_every_scope_saves_through_every_path_with_embedder_on_and_off(
    database: Database, fresh_db: PgDatabase, embedder_on: bool, path: str
) -> None:
    manager = MemoryManager.from_database(
        database, embedder=HashingEmbedder() if embedder_on else None
    )
    for scope in MemoryScope:
        content = f"{scope.value} fact saved by {path} (embedder {embedder_on})"
        memory = Memory(content=content, scope=scope, context="the turn before")
        if path == "save":
            result = await manager.save(OWNER, memory)
        elif path == "save_many":
            [result] = await manager.save_many(OWNER, [memory])
        else:
            result = await manager.inject_memory(
                OWNER, content, scope=scope, context="the turn before"
            )
        assert result.created, scope
        assert result.memory.scope is scope
        assert (await manager.get(OWNER, str(result.memory.id))) is not None, scope
        # with the embedder: the content vector and the context + content vector
        assert vectors_of(fresh_db, content) == (2 if embedder_on else 0), scope
        # a second save of the same content is the no-op that reports the stored row
        again = await manager.save(OWNER, Memory(content=content, scope=scope))
        assert not again.created and again.memory.id == result.memory.id, scope


@pytest.mark.parametrize("path", PATHS[:2])
async def test_a_saved_memory_is_the_one_a_read_validates(database: Database, path: str) -> None:
    """The memory a save returns (built from the stored row without validating it
    again) equals the one a read returns (validated field by field), every field set,
    for a new memory and for the duplicate a second save reports."""
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    for scope in MemoryScope:
        memory = Memory(
            content=f"{scope.value} memory with every field ({path})",
            scope=scope,
            memory_type=MemoryType.PREFERENCE,
            importance=0.75,
            entity_ids=["ent-1", "ent-2"],
            source="tool:calendar",
            sensitivity=Sensitivity.PII,
            valid_from=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            source_session_id="s1",
            source_message_ids=["m1", "m2"],
            metadata={"lang": "en", "n": [1, 2.5, None, {"k": True}]},
            context="the turn before",
            expires_at=datetime(2126, 1, 1, tzinfo=UTC),
        )
        if path == "save":
            saved = await manager.save(OWNER, memory)
        else:
            [saved] = await manager.save_many(OWNER, [memory])
        again = await manager.save(OWNER, memory)
        stored = await manager.get(OWNER, str(saved.memory.id))
        assert saved.created and not again.created, scope
        assert stored is not None
        assert saved.memory == stored and again.memory == stored, scope
        assert saved.memory.model_dump() == stored.model_dump(), scope
        assert type(saved.memory.scope) is MemoryScope and saved.memory.scope is scope
