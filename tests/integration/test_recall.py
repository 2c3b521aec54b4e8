"""MemoryRecall and MemoryManager.recall: hybrid recall through the Python API."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from harbor_pg.context.recall import MemoryRecall, RecallRequest, recalled_entity_ids
from harbor_pg.db.connection import Database
from harbor_pg.embedders.base import EmbedderError
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.ranking import search_and_rank
from harbor_pg.records import Memory, MemoryType
from harbor_pg.tiers.in_process import InMemoryLongTermStore
from harbor_pg.tiers.long_term import PostgresLongTermStore

ALICE = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
BOB = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="bob", session_id="s1")

FACTS = [
    Memory(
        content="Alice is allergic to peanuts",
        memory_type=MemoryType.FACT,
        importance=0.9,
        entity_ids=["alice", "peanuts"],
    ),
    Memory(content="Alice prefers answers in bullet points", memory_type=MemoryType.PREFERENCE),
    Memory(
        content="We chose pgvector over a separate vector database",
        memory_type=MemoryType.DECISION,
        scope=MemoryScope.PROJECT,
    ),
    Memory(
        content="The team offsite is in Lisbon in May",
        memory_type=MemoryType.EPISODE,
        scope=MemoryScope.SESSION,
    ),
]


class BrokenEmbedder(HashingEmbedder):
    async def embed_query(self, text: str) -> list[float]:
        raise EmbedderError("model went away")


class NaNEmbedder(HashingEmbedder):
    async def embed_query(self, text: str) -> list[float]:
        return [float("nan")] * self.dimensions


class ShortEmbedder(HashingEmbedder):
    async def embed_query(self, text: str) -> list[float]:
        return [1.0, 0.0]


@pytest.fixture
async def manager(database: Database) -> MemoryManager:
    m = MemoryManager.from_database(database, embedder=HashingEmbedder())
    await m.save_many(ALICE, FACTS)
    await m.save(BOB, Memory(content="Bob is allergic to cats"))
    return m


async def test_hybrid_recall_ranks_the_relevant_memory_first(manager: MemoryManager) -> None:
    got = await manager.recall(ALICE, "what is alice allergic to?")
    assert got[0].content == "Alice is allergic to peanuts"
    assert all(m.user_id in ("alice", "") for m in got)  # never Bob's
    scored = await manager.recaller().recall_scored(ALICE, "what is alice allergic to?")
    top = scored[0]
    assert top.dense_rank == 1 and top.lexical_rank == 1
    assert top.similarity is not None and top.similarity >= HashingEmbedder().relevance_threshold


async def test_every_saved_memory_has_a_vector_of_the_embedder(manager: MemoryManager) -> None:
    assert manager.database is not None
    async with manager.database.transaction(ALICE) as conn:
        cur = await conn.execute(
            "select count(*), min(model_id), max(dims) from harbor.memory_embeddings"
        )
        row = await cur.fetchone()
    assert row is not None
    assert row["count"] == 4  # Alice's four (Bob's row is not visible to her)
    assert row["min"] == HashingEmbedder().model_id


async def test_vectors_of_another_model_are_never_compared(manager: MemoryManager) -> None:
    other = HashingEmbedder(dimensions=128)
    assert other.model_id != HashingEmbedder().model_id
    recall = MemoryRecall(memories=manager.long_term, embedder=other)
    scored = await recall.recall_scored(ALICE, "peanuts allergy")
    assert scored and all(item.dense_rank is None for item in scored)


async def test_wanted_types_and_anchors_rerank(manager: MemoryManager) -> None:
    policy = MemoryPolicy(type_affinity_weight=2.0, entity_overlap_weight=2.0, recall_top_k=10)
    recall = MemoryRecall(policy=policy, memories=manager.long_term, embedder=HashingEmbedder())
    plain = await recall.recall(ALICE, "alice")
    hinted = await recall.recall(ALICE, "alice", wanted_types=["preference", "bogus", "summary"])
    assert {m.id for m in plain} == {m.id for m in hinted}
    assert hinted[0].content == "Alice prefers answers in bullet points"
    anchored = await recall.recall(ALICE, "alice", anchor_entity_ids=["peanuts"])
    assert anchored[0].content == "Alice is allergic to peanuts"
    assert recalled_entity_ids(anchored)[:2] == ("alice", "peanuts")


async def test_embedder_failure_falls_back_to_lexical_with_a_warning(
    manager: MemoryManager, caplog: pytest.LogCaptureFixture
) -> None:
    for broken in (BrokenEmbedder(), NaNEmbedder(), ShortEmbedder()):
        caplog.clear()
        recall = MemoryRecall(memories=manager.long_term, embedder=broken)
        with caplog.at_level(logging.WARNING, logger="harbor_pg.recall"):
            scored = await recall.recall_scored(ALICE, "peanuts")
        assert [s.memory.content for s in scored] == ["Alice is allergic to peanuts"]
        assert scored[0].dense_rank is None
        assert "embedder failed" in caplog.text


async def test_index_failure_falls_back_to_lexical(
    manager: MemoryManager, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = PostgresLongTermStore.recall

    async def flaky(store: object, owner: MemoryOwner, request: RecallRequest) -> object:
        if request.embedding is not None:
            raise RuntimeError("hnsw index corrupted")
        return await real(store, owner, request)  # type: ignore[arg-type]

    monkeypatch.setattr(PostgresLongTermStore, "recall", flaky)
    with caplog.at_level(logging.WARNING, logger="harbor_pg.recall"):
        got = await manager.recall(ALICE, "peanuts")
    assert [m.content for m in got] == ["Alice is allergic to peanuts"]
    assert "dense search failed" in caplog.text


async def test_repository_failure_yields_nothing_and_never_raises(
    manager: MemoryManager, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(*args: object) -> object:
        raise ConnectionError("database is down")

    monkeypatch.setattr(PostgresLongTermStore, "recall", down)
    with caplog.at_level(logging.WARNING, logger="harbor_pg.recall"):
        assert await manager.recall(ALICE, "peanuts") == ()
    assert "memory store failed" in caplog.text


async def test_bad_input_has_a_defined_outcome(manager: MemoryManager) -> None:
    assert await manager.recall(ALICE, "") == ()
    assert await manager.recall(ALICE, "   \n") == ()
    assert await manager.recall(ALICE, "peanuts", top_k=0) == ()
    huge = "peanuts " + "lorem ipsum " * 10_000  # 100,000+ characters
    got = await manager.recall(ALICE, huge)
    assert any(m.content == "Alice is allergic to peanuts" for m in got)
    got = await manager.recall(ALICE, "peanuts", wanted_types=["nonsense", 42])  # type: ignore[list-item]
    assert got[0].content == "Alice is allergic to peanuts"


async def test_token_budget_keeps_a_prefix(manager: MemoryManager) -> None:
    recall = MemoryRecall(
        policy=MemoryPolicy(recall_top_k=10), memories=manager.long_term, embedder=HashingEmbedder()
    )
    full = await recall.recall_scored(ALICE, "alice")
    assert len(full) >= 2
    cut = await recall.recall_scored(ALICE, "alice", token_budget=full[0].tokens)
    assert [c.memory.id for c in cut] == [full[0].memory.id]
    words = MemoryRecall(
        policy=MemoryPolicy(recall_top_k=10),
        memories=manager.long_term,
        embedder=HashingEmbedder(),
        token_counter=lambda text: len(text.split()),
    )
    counted = await words.recall_scored(ALICE, "alice", token_budget=8)
    assert sum(c.tokens for c in counted) <= 8
    assert [c.memory.id for c in counted] == [f.memory.id for f in full[: len(counted)]]


async def test_scopes_the_owner_cannot_address_are_skipped(manager: MemoryManager) -> None:
    no_project = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")
    got = await manager.recall(no_project, "pgvector vector database")
    assert all(m.scope is not MemoryScope.PROJECT for m in got)
    with_project = await manager.recall(ALICE, "pgvector vector database")
    assert with_project[0].scope is MemoryScope.PROJECT


async def test_as_of_recall_sees_the_past(manager: MemoryManager) -> None:
    before = datetime(2020, 1, 1, tzinfo=UTC)
    assert await manager.recall(ALICE, "peanuts", as_of=before) == ()


async def test_snapshot_recalls_with_the_same_ranking(manager: MemoryManager) -> None:
    snap = await manager.snapshot(ALICE, query="what is alice allergic to?")
    direct = await manager.recall(ALICE, "what is alice allergic to?", top_k=6)
    assert [m.id for m in snap.memories] == [m.id for m in direct]


def test_construction_errors() -> None:
    with pytest.raises(MemoryConfigurationError):
        MemoryRecall(memories=None)
    with pytest.raises(MemoryConfigurationError):
        MemoryRecall(memories=InMemoryLongTermStore(), index=InMemoryLongTermStore())


class FlakyStore(InMemoryLongTermStore):
    """Fails every search of the session scope; records each search's limit."""

    def __init__(self) -> None:
        super().__init__()
        self.limits: list[int] = []

    async def search(
        self,
        owner: MemoryOwner,
        query_text: str,
        *,
        limit: int = 10,
        as_of: datetime | None = None,
    ) -> list[Memory]:
        self.limits.append(limit)
        if owner.session_id is not None:
            raise ConnectionError("session shard down")
        return await super().search(owner, query_text, limit=limit, as_of=as_of)


async def test_other_stores_rank_with_flat_relevance_per_scope(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyStore()
    manager = MemoryManager(long_term=store)
    await manager.save_many(ALICE, FACTS)
    with caplog.at_level(logging.WARNING, logger="harbor_pg.recall"):
        got = await MemoryRecall(memories=store).recall_scored(ALICE, "alice")
    # the session scope failed: no candidates from it, the others still answer
    assert "none from that scope" in caplog.text
    assert all(item.memory.scope is not MemoryScope.SESSION for item in got)
    assert {item.memory.content for item in got} >= {"Alice is allergic to peanuts"}
    assert all(item.relevance == pytest.approx(1 / 6) for item in got)  # 1 / (rrf_k 5 + 1)
    # flat relevance: importance decides
    assert got[0].memory.content == "Alice is allergic to peanuts"


async def test_other_stores_are_searched_as_deep_as_the_sql_legs() -> None:
    """Each scope's search asks for max(candidates, 2 x top_k, 50) memories, the
    count harbor.recall() gives each of its legs."""
    store = FlakyStore()
    scopes = (MemoryScope.USER,)
    for top_k, candidates in ((10, None), (30, None), (10, 120)):
        request = RecallRequest(query="alice", scopes=scopes, top_k=top_k, candidates=candidates)
        await search_and_rank(store, ALICE, request)
    assert store.limits == [50, 60, 120]


async def test_save_many_validates_everything_before_writing(manager: MemoryManager) -> None:
    from harbor_pg.errors import MemoryValidationError

    before = await manager.recall(ALICE, "zebra")
    with pytest.raises(MemoryValidationError):
        await manager.save_many(ALICE, [Memory(content="zebra one"), Memory(content="   ")])
    assert before == await manager.recall(ALICE, "zebra") == ()


async def test_save_many_reports_progress_and_duplicates(manager: MemoryManager) -> None:
    seen: list[tuple[int, int]] = []
    batch: Sequence[Memory] = [Memory(content=f"fact number {i}") for i in range(5)]
    results = await manager.save_many(
        ALICE, [*batch, FACTS[0]], batch_size=2, progress=lambda a, b: seen.append((a, b))
    )
    assert seen == [(2, 6), (4, 6), (6, 6)]
    assert [r.created for r in results] == [True] * 5 + [False]


async def test_the_manager_wires_a_context_builder_with_recall(manager: MemoryManager) -> None:
    from harbor_pg import MemoryContext
    from harbor_pg.records import ConversationMessage

    await manager.append(ALICE, ConversationMessage(role="user", content="I am planning dinner"))
    await manager.append(ALICE, ConversationMessage(role="assistant", content="Happy to help."))
    context = await manager.context_builder().build(ALICE, "Anything I should avoid eating?")
    assert isinstance(context, MemoryContext)
    assert [m.content for m in context.messages][-2:] == ["I am planning dinner", "Happy to help."]
    assert context.standalone_query == "Anything I should avoid eating?"
    assert not context.rewritten  # no model: no rewrite, nothing leaves the machine
    recalled = await manager.context_builder().build(ALICE, "what is alice allergic to?")
    assert "Alice is allergic to peanuts" in [m.content for m in recalled.recalled]


async def test_recalled_memories_equal_the_stored_rows(manager: MemoryManager) -> None:
    """Recall builds memories without re-validation: they must equal what get() returns."""
    recalled = await manager.recall(ALICE, "alice pgvector offsite", top_k=10)
    assert len(recalled) >= 3
    for memory in recalled:
        assert memory.id is not None
        assert await manager.get(ALICE, memory.id) == memory


async def test_store_batches_hold_one_role_and_the_manager_splits_them(
    manager: MemoryManager,
) -> None:
    from harbor_pg.errors import MemoryValidationError
    from harbor_pg.tiers.long_term import PostgresLongTermStore

    mixed = [
        Memory(content="tenant-wide holiday calendar", scope=MemoryScope.TENANT),
        Memory(content="Alice's own holiday plan"),
    ]
    store = manager.long_term
    assert isinstance(store, PostgresLongTermStore)
    with pytest.raises(MemoryValidationError, match="cannot mix"):
        await store.save_many(ALICE, mixed)
    results = await manager.save_many(ALICE, mixed)
    assert [r.created for r in results] == [True, True]
    assert {r.memory.scope for r in results} == {MemoryScope.TENANT, MemoryScope.USER}


async def test_a_memory_with_context_gets_a_second_vector_and_is_found_by_either(
    manager: MemoryManager,
) -> None:
    """Content alone and context + content: dense recall takes the nearer of the two."""
    turn = Memory(content="She adopted her last week.", context="Do you have a dog named Luna?")
    saved = await manager.save(ALICE, turn)
    plain = (await manager.save(ALICE, Memory(content="Luna is a moon goddess"))).memory
    assert manager.database is not None
    async with manager.database.transaction(ALICE) as conn:
        cur = await conn.execute(
            "select memory_id, with_context from harbor.memory_embeddings"
            " where memory_id = any(%s) order by memory_id, with_context",
            ([saved.memory.id, plain.id],),
        )
        views = {(r["memory_id"], r["with_context"]) for r in await cur.fetchall()}
    assert views == {(saved.memory.id, False), (saved.memory.id, True), (plain.id, False)}
    embedder = HashingEmbedder()
    content_v, context_v = await embedder.embed(
        ["She adopted her last week.", "Do you have a dog named Luna?\nShe adopted her last week."]
    )
    recaller = manager.recaller()
    for question in ("a dog named Luna", "who adopted her last week"):
        q = await embedder.embed_query(question)
        best = max(sum(a * b for a, b in zip(q, v, strict=True)) for v in (content_v, context_v))
        dense = [i for i in await recaller.recall_scored(ALICE, question) if i.dense_rank]
        (hit,) = [i for i in dense if i.memory.id == saved.memory.id]  # once, not twice
        assert hit.similarity == pytest.approx(best, abs=1e-5)
    # a question about the context ranks the turn first
    by_context = await recaller.recall_scored(ALICE, "dog named Luna")
    assert by_context[0].memory.id == saved.memory.id


async def test_context_vectors_are_validated(manager: MemoryManager) -> None:
    from harbor_pg.errors import MemoryValidationError
    from harbor_pg.tiers.long_term import PostgresLongTermStore

    store = manager.long_term
    assert isinstance(store, PostgresLongTermStore)
    v = [1.0] + [0.0] * 383
    no_context = Memory(content="no context here")
    with_context = Memory(content="a turn", context="the turn before")
    with pytest.raises(MemoryValidationError, match="without context"):
        await store.save(ALICE, no_context, v, "m", context_embedding=v)
    with pytest.raises(MemoryValidationError, match="content embedding too"):
        await store.save(ALICE, with_context, None, "m", context_embedding=v)
    with pytest.raises(MemoryValidationError, match="dimensions"):
        await store.save(ALICE, with_context, v, "m", context_embedding=v[:100])
    with pytest.raises(MemoryValidationError, match="2 memories but 1 vectors"):
        await store.save_many(ALICE, [no_context, with_context], [v], "m")
    assert await store.search(ALICE, "turn before") == []  # nothing was written
