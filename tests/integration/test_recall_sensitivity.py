"""Recall's sensitivity ceiling: memories classified above it never reach a model.

MemoryPolicy.recall_max_sensitivity (default ``pii``) goes into harbor.recall()
as max_sensitivity, and the candidate legs leave the memories above it out,
so that they never take a place that an allowed memory could fill: the
memories above the ceiling here outrank the allowed ones in both legs and
outnumber the candidates each leg hands over (50), and top_k still fills
with allowed memories. Recall, the snapshot and the context builder all honour it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import Memory, Sensitivity
from tests.conftest import PgDatabase

OWNER = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="dana", session_id="s1")
QUERY = "harbor ledger"


def _memories(sensitive: int, pii: int, plain: int) -> list[Memory]:
    # the sensitive ones say the query's words three times: they rank first in
    # both legs (BM25 and the hashing embedder's cosine)
    out = [
        Memory(
            content=f"harbor ledger harbor ledger harbor ledger entry {i}",
            sensitivity=Sensitivity.SENSITIVE,
        )
        for i in range(sensitive)
    ]
    out += [
        Memory(content=f"harbor ledger note on pii row {i}", sensitivity=Sensitivity.PII)
        for i in range(pii)
    ]
    out += [Memory(content=f"the harbor ledger, plain row {i}") for i in range(plain)]
    return out


async def _manager(database: Database, policy: MemoryPolicy | None = None) -> MemoryManager:
    return MemoryManager.from_database(
        database, embedder=HashingEmbedder(), policy=policy or MemoryPolicy()
    )


def test_the_default_ceiling_is_pii() -> None:
    assert MemoryPolicy().recall_max_sensitivity is Sensitivity.PII


@pytest.mark.parametrize("sensitive", [60, 20])  # above and below the owner-term lookup's 32
async def test_recall_leaves_sensitive_memories_out_and_still_fills_top_k(
    database: Database, sensitive: int
) -> None:
    manager = await _manager(database, MemoryPolicy(recall_top_k=6))
    await manager.save_many(OWNER, _memories(sensitive, 3, 3))  # exactly six allowed
    got = await manager.recall(OWNER, QUERY, token_budget=10_000)
    assert len(got) == 6
    assert all(m.sensitivity is not Sensitivity.SENSITIVE for m in got)
    assert {m.sensitivity for m in got} == {Sensitivity.PII, Sensitivity.NONE}
    # lexical only (no embedder): the same ceiling
    lexical = MemoryManager.from_database(database, policy=MemoryPolicy(recall_top_k=6))
    got = await lexical.recall(OWNER, QUERY, token_budget=10_000)
    assert len(got) == 6 and all(m.sensitivity is not Sensitivity.SENSITIVE for m in got)


async def test_sensitive_memories_need_an_explicit_opt_in(database: Database) -> None:
    manager = await _manager(
        database, MemoryPolicy(recall_top_k=6, recall_max_sensitivity="sensitive")
    )
    await manager.save_many(OWNER, _memories(60, 2, 6))
    got = await manager.recall(OWNER, QUERY, token_budget=10_000)
    assert len(got) == 6 and all(m.sensitivity is Sensitivity.SENSITIVE for m in got)


async def test_a_ceiling_of_none_leaves_pii_out_too(database: Database) -> None:
    manager = await _manager(database, MemoryPolicy(recall_top_k=6, recall_max_sensitivity="none"))
    await manager.save_many(OWNER, _memories(60, 60, 6))
    got = await manager.recall(OWNER, QUERY, token_budget=10_000)
    assert len(got) == 6 and all(m.sensitivity is Sensitivity.NONE for m in got)


async def test_snapshot_and_builder_honour_the_ceiling(database: Database) -> None:
    manager = await _manager(database, MemoryPolicy(recall_top_k=4, query_rewrite=False))
    await manager.save_many(OWNER, _memories(60, 0, 4))
    snap = await manager.bound_to(OWNER).snapshot(OWNER, query=QUERY)
    assert len(snap.memories) == 4
    assert all(m.sensitivity is Sensitivity.NONE for m in snap.memories)
    context = await manager.context_builder().build(OWNER, QUERY)
    assert len(context.recalled) == 4
    assert all(m.sensitivity is Sensitivity.NONE for m in context.recalled)
    opted = manager.context_builder(
        policy=MemoryPolicy(recall_top_k=4, query_rewrite=False, recall_max_sensitivity="sensitive")
    )
    context = await opted.build(OWNER, QUERY)
    assert all(m.sensitivity is Sensitivity.SENSITIVE for m in context.recalled)


def test_sql_recall_takes_the_ceiling_as_a_parameter(fresh_db: PgDatabase) -> None:
    """From plain SQL: the default leaves sensitive rows out of every path (lexical,
    dense, the substring fallback); max_sensitivity => 'sensitive' lets them in."""
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        for i in range(60):
            su.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash,"
                " sensitivity) values ('t1', 'user', 'u1', %s, md5(%s) || md5(%s), %s)",
                (f"zq-secret harbor ledger ledger {i}", str(i), str(-i), "sensitive"),
            )
        for i in range(3):
            su.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash)"
                " values ('t1', 'user', 'u1', %s, md5(%s) || md5('x'))",
                (f"zq-plain ledger {i}", f"p{i}"),
            )
    with psycopg.connect(fresh_db.app_url, autocommit=True, row_factory=dict_row) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'u1')")

        def rows(sql: str, *args: Any) -> list[dict[str, Any]]:
            return app.execute(sql, args).fetchall()

        got = rows("select content, sensitivity from harbor.recall('ledger', top_k => 5)")
        assert [r["sensitivity"] for r in got] == ["none"] * 3
        got = rows(
            "select sensitivity from harbor.recall('ledger', top_k => 5,"
            " max_sensitivity => 'sensitive')"
        )
        assert [r["sensitivity"] for r in got] == ["sensitive"] * 5
        # the substring fallback ('zq-' matches no word: no lexeme 'zq' alone)
        got = rows("select sensitivity, substring_match from harbor.recall('q-s', top_k => 5)")
        assert got == []
        got = rows(
            "select sensitivity from harbor.recall('q-s', top_k => 5,"
            " max_sensitivity => 'sensitive')"
        )
        assert len(got) == 5
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            app.execute("select * from harbor.recall('ledger', max_sensitivity => null)")
