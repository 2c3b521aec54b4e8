"""The per-turn builder against the real PostgreSQL: the summary row, its frontier, ownership."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg.rows import dict_row

from harbor_pg.context.builder import MemoryContextBuilder
from harbor_pg.context.summarizer import FRONTIER_KEY, frontier_of
from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage, Memory, MemoryType
from harbor_pg.tiers.base import SummaryLeaseStore, SummaryStore, summary_memory_id
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.conftest import PgDatabase
from tests.unit.test_builder_support import ScriptedModel, exchange

OWNER = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
QUESTION = "what next?"
POLICY = MemoryPolicy(
    recent_max_tokens=400, recent_max_messages=12, summary_keep_messages=4, query_rewrite=False
)


def stores(database: Database) -> tuple[PostgresShortTermStore, PostgresLongTermStore]:
    return PostgresShortTermStore(database), PostgresLongTermStore(database)


async def fill(
    store: PostgresShortTermStore, messages: list[ConversationMessage], owner: MemoryOwner = OWNER
) -> list[ConversationMessage]:
    return [await store.append(owner, m) for m in messages]


def make(
    store: PostgresShortTermStore, memories: PostgresLongTermStore, **kwargs: Any
) -> MemoryContextBuilder:
    kwargs.setdefault("policy", POLICY)
    return MemoryContextBuilder(messages=store, memories=memories, **kwargs)


def summary_rows(db: PgDatabase) -> list[dict[str, Any]]:
    """Every summary row, read as the superuser (no row-level security)."""
    with psycopg.connect(db.superuser_url, row_factory=dict_row) as conn:
        return conn.execute(
            "select id, tenant_id, scope::text as scope, memory_type::text as memory_type,"
            " project_id, principal_id, user_id, session_id, source, source_session_id,"
            " source_message_ids, metadata, content, created_at, updated_at"
            " from harbor.memories where memory_type = 'summary' order by id"
        ).fetchall()


def sql_summary_id(db: PgDatabase, *fields: str) -> str:
    """harbor.summary_id() of the owner fields, computed by the database."""
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute("select harbor.summary_id(%s, %s, %s, %s, %s)", fields).fetchone()
        assert row is not None
        return str(row[0])


def test_postgres_stores_implement_the_summary_protocols() -> None:
    assert isinstance(PostgresLongTermStore.__new__(PostgresLongTermStore), SummaryStore)
    assert isinstance(PostgresShortTermStore.__new__(PostgresShortTermStore), SummaryLeaseStore)


async def test_summary_row_frontier_and_folded_ids(
    database: Database, fresh_db: PgDatabase
) -> None:
    store, memories = stores(database)
    stored = await fill(store, exchange(6, words=20))
    model = ScriptedModel(summaries=["The user asked about six projects."])
    context = await make(store, memories, model=model).build(OWNER, QUESTION)

    assert context.summary_refreshed and context.summary == "The user asked about six projects."
    [row] = summary_rows(fresh_db)
    # derived from the whole owner key (project '' at SESSION scope), naming no session;
    # the database computes the same id (harbor.summary_id)
    assert row["id"] == summary_memory_id(OWNER) == "summary:4d020140d199ca4a7ef430368aed373c"
    assert row["id"] == sql_summary_id(fresh_db, "t1", "", "alice", "s1", "")
    assert row["scope"] == "session" and row["memory_type"] == "summary"
    assert row["source"] == "summary" and row["source_session_id"] == "s1"
    assert (row["tenant_id"], row["user_id"], row["session_id"]) == ("t1", "alice", "s1")
    assert row["project_id"] == "" and row["principal_id"] == "alice"
    assert row["source_message_ids"] == [str(m.id) for m in stored[:8]]
    assert row["metadata"] == {FRONTIER_KEY: stored[7].id}
    assert [m.id for m in context.messages] == [m.id for m in stored[8:]]

    # unchanged history: no second summary call, same row
    again = await make(store, memories, model=model).build(OWNER, QUESTION)
    assert model.count("summary") == 1
    assert again.summary == context.summary and not again.summary_refreshed


async def test_refresh_in_place_keeps_ownership_across_credentials_and_projects(
    database: Database, fresh_db: PgDatabase
) -> None:
    store, memories = stores(database)
    first = MemoryOwner(
        tenant_id="t1", project_id="p1", principal_id="token-a", user_id="alice", session_id="s1"
    )
    later = MemoryOwner(
        tenant_id="t1", project_id="p2", principal_id="token-b", user_id="alice", session_id="s1"
    )
    first_batch = await fill(store, exchange(6, words=20), first)
    model = ScriptedModel(summaries=["one", "two"])
    await make(store, memories, model=model).build(first, QUESTION)
    [before] = summary_rows(fresh_db)
    second_batch = await fill(store, exchange(3, words=20), later)
    context = await make(store, memories, model=model).build(later, QUESTION)
    [after] = summary_rows(fresh_db)

    assert context.summary == "two" and context.summary_refreshed
    assert after["id"] == before["id"]
    assert after["principal_id"] == "token-a"  # the first saver's, not token-b's
    assert after["project_id"] == ""
    assert after["created_at"] == before["created_at"]
    assert after["updated_at"] >= before["updated_at"]
    new = [m.id for m in [*first_batch, *second_batch] if m.id > first_batch[7].id]
    assert after["source_message_ids"] == [str(i) for i in new[:6]]
    assert after["metadata"][FRONTIER_KEY] == new[5]
    assert "one" in [c for c in model.calls if c.kind == "summary"][1].user


async def test_catch_up_pages_resume_from_the_saved_frontier(
    database: Database, fresh_db: PgDatabase
) -> None:
    store, memories = stores(database)
    stored = await fill(store, exchange(40, words=20))  # 80 messages
    model = ScriptedModel()
    b = make(store, memories, model=model, page_size=10)
    context = await b.build(OWNER, QUESTION)
    assert model.count("summary") == 4
    [row] = summary_rows(fresh_db)
    assert row["source_message_ids"] == [str(m.id) for m in stored[:40]]
    assert row["metadata"][FRONTIER_KEY] == stored[39].id
    recent = await store.recent(OWNER, 12)
    assert context.messages[-1].id == recent[-1].id

    await b.build(OWNER, QUESTION)  # resumes at message 41: 36 left before the kept tail
    [row] = summary_rows(fresh_db)
    assert row["source_message_ids"] == [str(m.id) for m in stored[40:76]]
    assert row["metadata"][FRONTIER_KEY] == stored[75].id
    calls = model.count("summary")
    final = await b.build(OWNER, QUESTION)
    assert model.count("summary") == calls
    assert [m.id for m in final.messages] == [m.id for m in stored[76:]]
    assert await store.count(OWNER) == 80  # raw turns are kept


async def test_two_users_with_the_same_session_id_each_get_a_summary(
    database: Database, fresh_db: PgDatabase
) -> None:
    store, memories = stores(database)
    bob = MemoryOwner(tenant_id="t1", principal_id="bob", session_id="s1")
    await fill(store, exchange(6, words=20))
    await fill(store, exchange(6, words=20), bob)
    model = ScriptedModel(summaries=["alice summary", "bob summary"])
    await make(store, memories, model=model).build(OWNER, QUESTION)
    bob_context = await make(store, memories, model=model).build(bob, QUESTION)
    assert bob_context.summary == "bob summary"
    assert bob_context.degraded == ()
    rows = {r["user_id"]: r for r in summary_rows(fresh_db)}
    assert rows["alice"]["id"] == summary_memory_id(OWNER)
    assert rows["bob"]["id"] == summary_memory_id(bob) != rows["alice"]["id"]
    assert (await memories.load_summary(OWNER)).content == "alice summary"  # type: ignore[union-attr]
    assert (await memories.load_summary(bob)).content == "bob summary"  # type: ignore[union-attr]
    # and bob's refresh updates bob's row
    await fill(store, exchange(3, words=20), bob)
    refreshed = await make(store, memories, model=model).build(bob, QUESTION)
    assert refreshed.summary_refreshed
    assert len(summary_rows(fresh_db)) == 2


async def test_concurrent_refreshes_fold_once(database: Database, fresh_db: PgDatabase) -> None:
    store, memories = stores(database)
    await fill(store, exchange(6, words=20))
    results = await asyncio.gather(
        *(
            make(store, memories, model=ScriptedModel(delay=0.02)).build(OWNER, QUESTION)
            for _ in range(4)
        )
    )
    assert sum(r.summary_refreshed for r in results) == 1
    [row] = summary_rows(fresh_db)
    assert len(row["source_message_ids"]) == 8
    assert all(r.degraded == () for r in results)


async def test_summary_store_compare_and_set(database: Database) -> None:
    _store, memories = stores(database)

    def summary(content: str, frontier: int) -> Memory:
        return Memory(
            id=summary_memory_id(OWNER),
            scope=MemoryScope.SESSION,
            memory_type=MemoryType.SUMMARY,
            content=content,
            source="summary",
            metadata={FRONTIER_KEY: frontier},
        )

    first = await memories.save_summary(OWNER, summary("a", 5), expected_frontier=None)
    assert first is not None and frontier_of(first) == 5
    assert await memories.save_summary(OWNER, summary("b", 9), expected_frontier=None) is None
    assert await memories.save_summary(OWNER, summary("b", 9), expected_frontier=4) is None
    second = await memories.save_summary(OWNER, summary("b", 9), expected_frontier=5)
    assert second is not None and second.content == "b" and frontier_of(second) == 9
    loaded = await memories.load_summary(OWNER)
    assert loaded is not None and loaded.content == "b"
    # summaries are never returned by search
    assert await memories.search(OWNER, "b") == []


async def test_disabled_policy_writes_nothing(database: Database, fresh_db: PgDatabase) -> None:
    store, memories = stores(database)
    await fill(store, exchange(10, words=40))
    context = await make(store, memories, policy=MemoryPolicy.disabled()).build(OWNER, QUESTION)
    assert len(context.messages) <= 4
    assert summary_rows(fresh_db) == []


async def test_builder_with_the_real_recall(database: Database) -> None:
    from harbor_pg.context.recall import MemoryRecall
    from harbor_pg.context.result import recalled_entity_ids

    store, memories = stores(database)
    await memories.save(
        OWNER,
        Memory(content="Bob owns the ingest pipeline.", scope=MemoryScope.USER, entity_ids=["bob"]),
    )
    await memories.save(OWNER, Memory(content="The user prefers tea.", scope=MemoryScope.USER))
    await fill(store, exchange(6, words=20))
    model = ScriptedModel(
        summaries=["The user asked about the ingest pipeline."],
        rewrites=[{"standalone_query": "Who owns the ingest pipeline?", "wanted_types": ["fact"]}],
    )
    recall = MemoryRecall(policy=POLICY, memories=memories)
    b = make(
        store, memories, model=model, recall=recall, policy=POLICY.with_changes(query_rewrite=True)
    )
    context = await b.build(OWNER, "and who owns it?", anchor_entity_ids=["bob"])
    assert context.standalone_query == "Who owns the ingest pipeline?"
    assert context.wanted_types == (MemoryType.FACT,)
    assert [m.content for m in context.recalled][:1] == ["Bob owns the ingest pipeline."]
    assert all(m.memory_type is not MemoryType.SUMMARY for m in context.recalled)
    assert recalled_entity_ids(context)[:1] == ("bob",)
    assert context.degraded == ()
