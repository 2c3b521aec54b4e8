"""Extraction against the real PostgreSQL: the ExtractionStore contract (run against both
built-in stores), the named queries under row-level security, and MemoryExtractor end
to end with the hashing embedder.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg.rows import dict_row

from harbor_pg.db.connection import Database, identity_params
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryScopeError
from harbor_pg.extraction.extractor import MemoryExtractor
from harbor_pg.extraction.facts import CHAT_SCOPES
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory, MemoryType, Sensitivity
from harbor_pg.tiers.base import ExtractionStore
from harbor_pg.tiers.in_process import InMemoryLongTermStore
from harbor_pg.tiers.long_term import (
    PostgresLongTermStore,
    current_memories_params,
    memory_params,
    vector_literal,
)
from tests.conftest import PgDatabase
from tests.unit.test_extractor import (
    ALICE,
    ALICE_NO_PROJECT,
    ALICE_S2,
    BOB,
    LOGGER,
    TURN,
    ScriptedModel,
    fact,
    facts,
    replacing,
    warnings_of,
)

ALICE_RUN = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1", run_id="r1"
)
EMBEDDER = HashingEmbedder()
MODEL_ID = EMBEDDER.model_id
# no vector, and so no similarity gate (the write statements take both)
NO_VECTOR = {
    "model_id": None,
    "dims": None,
    "embedding": None,
    "dedup_threshold": None,
    "exclude_ids": [],
}


def vec(text: str) -> list[float]:
    return EMBEDDER.embed_sync(text)


async def put(
    store: ExtractionStore,
    owner: MemoryOwner,
    content: str,
    scope: MemoryScope = MemoryScope.USER,
    *,
    embed: bool = False,
    model_id: str = MODEL_ID,
    **fields: Any,
) -> Memory:
    memory = Memory(content=content, scope=scope, **fields)
    vector = vec(content) if embed else None
    result = await store.save(owner, memory, vector, model_id if embed else None)
    assert result.created
    await asyncio.sleep(0.002)  # distinct valid_from for ordering and supersession
    return result.memory


class ExtractionStoreContract:
    """What MemoryExtractor relies on, for any ExtractionStore; needs a ``store`` fixture."""

    async def test_is_an_extraction_store(self, store: ExtractionStore) -> None:
        assert isinstance(store, ExtractionStore)

    async def test_current_memories_are_the_owners_newest_first(
        self, store: ExtractionStore
    ) -> None:
        user = await put(store, ALICE, "Alice likes tea.")
        project = await put(store, ALICE, "The project uses Postgres.", MemoryScope.PROJECT)
        session = await put(store, ALICE, "This session is about billing.", MemoryScope.SESSION)
        await put(store, BOB, "Bob likes jazz.")
        await put(store, ALICE_S2, "Another session.", MemoryScope.SESSION)
        await put(store, ALICE_RUN, "A run note.", MemoryScope.RUN)
        await put(store, ALICE, "The summary.", MemoryScope.SESSION, memory_type=MemoryType.SUMMARY)
        await put(store, MemoryOwner(tenant_id="t2", principal_id="alice"), "Other tenant.")
        old = await put(store, ALICE, "Alice lives in Berlin.")
        assert await store.supersede(ALICE, old.id or "", Memory(content="Alice lives in Rome."))

        got = await store.current_memories(ALICE, CHAT_SCOPES, limit=10)
        assert [m.content for m in got] == [
            "Alice lives in Rome.",
            session.content,
            project.content,
            user.content,
        ]
        assert all(m.content_hash and m.id for m in got)
        assert [m.content for m in await store.current_memories(ALICE, CHAT_SCOPES, limit=2)] == [
            "Alice lives in Rome.",
            session.content,
        ]
        only_user = await store.current_memories(ALICE, [MemoryScope.USER], limit=10)
        assert [m.content for m in only_user] == ["Alice lives in Rome.", user.content]
        no_project = await store.current_memories(ALICE_NO_PROJECT, CHAT_SCOPES, limit=10)
        assert project.content not in [m.content for m in no_project]
        assert await store.current_memories(ALICE, CHAT_SCOPES, limit=0) == []
        assert await store.current_memories(ALICE, [MemoryScope.TENANT], limit=5) == []

    async def test_nearest_in_scope_compares_only_comparable_vectors(
        self, store: ExtractionStore
    ) -> None:
        tea = await put(store, ALICE, "Alice drinks green tea every morning.", embed=True)
        await put(store, ALICE, "Alice owns a red bicycle.", embed=True)
        await put(store, BOB, "Alice drinks green tea every morning!", embed=True)
        await put(store, ALICE, "Alice drinks green tea daily.", MemoryScope.SESSION, embed=True)
        await put(store, ALICE, "Alice drinks green tea.", embed=True, model_id="other-model")
        await put(store, ALICE, "Alice drinks tea, no vector.")

        query_vector = vec("Alice drinks green tea every morning")
        nearest = await store.nearest_in_scope(ALICE, MemoryScope.USER, query_vector, MODEL_ID)
        assert nearest is not None and nearest.memory_id == tea.id
        assert nearest.similarity == pytest.approx(
            sum(a * b for a, b in zip(query_vector, vec(tea.content), strict=True)), abs=1e-5
        )
        excluded = await store.nearest_in_scope(
            ALICE, MemoryScope.USER, query_vector, MODEL_ID, exclude_ids=[tea.id or ""]
        )
        assert excluded is not None and excluded.memory_id != tea.id
        assert excluded.similarity < nearest.similarity
        assert (
            await store.nearest_in_scope(ALICE, MemoryScope.PROJECT, query_vector, MODEL_ID) is None
        )
        assert await store.nearest_in_scope(ALICE, MemoryScope.USER, query_vector, "nope") is None
        short = query_vector[:16]
        assert await store.nearest_in_scope(ALICE, MemoryScope.USER, short, MODEL_ID) is None
        bobs = await store.nearest_in_scope(BOB, MemoryScope.USER, query_vector, MODEL_ID)
        assert bobs is not None and bobs.memory_id != tea.id

    async def test_nearest_in_scope_skips_closed_memories(self, store: ExtractionStore) -> None:
        old = await put(store, ALICE, "Alice lives in Berlin.", embed=True)
        new = Memory(content="Alice moved to Rome.")
        assert await store.supersede(ALICE, old.id or "", new, vec(new.content), MODEL_ID)
        nearest = await store.nearest_in_scope(
            ALICE, MemoryScope.USER, vec("Alice lives in Berlin."), MODEL_ID
        )
        assert nearest is not None and nearest.memory_id != old.id

    async def test_supersede_closes_links_and_inserts_at_one_instant(
        self, store: ExtractionStore
    ) -> None:
        old = await put(store, ALICE, "Alice lives in Berlin.", source="extracted")
        result = await store.supersede(
            ALICE,
            old.id or "",
            Memory(
                content="Alice lives in Rome.",
                source="extracted",
                entity_ids=["kg:rome"],
                sensitivity=Sensitivity.PII,
                source_session_id="s1",
                source_message_ids=["7"],
            ),
        )
        assert result is not None and result.created
        new = result.memory
        assert new.valid_from is not None and new.invalid_at is None
        assert (new.user_id, new.entity_ids, new.sensitivity) == ("alice", ["kg:rome"], "pii")
        assert new.source_message_ids == ["7"] and new.superseded_by is None
        closed = await store.get(ALICE, old.id or "")
        assert closed is not None
        assert closed.superseded_by == new.id
        assert closed.invalid_at == new.valid_from
        assert closed.valid_from == old.valid_from and closed.content == old.content

    async def test_supersede_refuses_what_it_may_not_replace(self, store: ExtractionStore) -> None:
        user = await put(store, ALICE, "Alice lives in Berlin.")
        session = await put(store, ALICE, "Alice is in Paris today.", MemoryScope.SESSION)
        bobs = await put(store, BOB, "Bob lives in Oslo.")
        other_session = await put(store, ALICE_S2, "Meeting at 10.", MemoryScope.SESSION)
        summary = await put(
            store, ALICE, "Summary.", MemoryScope.SESSION, memory_type=MemoryType.SUMMARY
        )
        replaced = await put(store, ALICE, "Alice likes tea.")
        assert await store.supersede(
            ALICE, replaced.id or "", Memory(content="Alice likes coffee.")
        )

        new = Memory(content="Alice lives in Rome.")
        new_session = Memory(content="Alice is in Rome today.", scope=MemoryScope.SESSION)
        assert await store.supersede(ALICE, "no-such-id", new) is None
        assert await store.supersede(ALICE, session.id or "", new) is None  # other scope
        assert await store.supersede(ALICE, bobs.id or "", new) is None  # other user
        assert await store.supersede(ALICE, other_session.id or "", new_session) is None
        assert await store.supersede(ALICE, summary.id or "", new_session) is None
        assert await store.supersede(ALICE, replaced.id or "", new) is None  # already replaced
        with pytest.raises(MemoryScopeError):
            await store.supersede(ALICE, user.id or "", Memory(content="x", scope="tenant"))
        for owner, memory in [
            (ALICE, user),
            (ALICE, session),
            (BOB, bobs),
            (ALICE_S2, other_session),
            (ALICE, summary),
        ]:
            kept = await store.get(owner, memory.id or "")
            assert kept is not None and kept.superseded_by is None and kept.invalid_at is None
        assert await store.search(ALICE, "Rome") == []

    async def test_supersede_with_content_already_current_changes_nothing(
        self, store: ExtractionStore
    ) -> None:
        old = await put(store, ALICE, "Alice lives in Berlin.")
        current = await put(store, ALICE, "Alice lives in Rome.")
        result = await store.supersede(ALICE, old.id or "", Memory(content="alice  lives in ROME."))
        assert result is not None and not result.created and result.memory.id == current.id
        kept = await store.get(ALICE, old.id or "")
        assert kept is not None and kept.superseded_by is None and kept.invalid_at is None

    async def test_supersede_stores_the_successors_vector(self, store: ExtractionStore) -> None:
        old = await put(store, ALICE, "Alice lives in Berlin.", embed=True)
        new = Memory(content="Alice moved to Rome last spring.")
        result = await store.supersede(ALICE, old.id or "", new, vec(new.content), MODEL_ID)
        assert result is not None
        nearest = await store.nearest_in_scope(ALICE, MemoryScope.USER, vec(new.content), MODEL_ID)
        assert nearest is not None and nearest.memory_id == result.memory.id
        assert nearest.similarity == pytest.approx(1.0, abs=1e-5)

    async def test_add_fact_gates_restatements_then_writes(self, store: ExtractionStore) -> None:
        tea = await put(store, ALICE, "Alice drinks green tea every morning.", embed=True)
        same = Memory(content="ALICE drinks green tea every morning!")
        skipped = await store.add_fact(
            ALICE, same, embedding=vec(same.content), model_id=MODEL_ID, dedup_threshold=0.92
        )
        assert skipped.memory is None and not skipped.created
        assert skipped.restatement_of is not None and skipped.restatement_of.memory_id == tea.id
        assert skipped.restatement_of.similarity == pytest.approx(1.0, abs=1e-5)
        # no threshold, no gate; another scope is not compared
        session = Memory(content=same.content, scope=MemoryScope.SESSION)
        kept = await store.add_fact(
            ALICE, session, embedding=vec(same.content), model_id=MODEL_ID, dedup_threshold=0.5
        )
        assert kept.created and kept.memory is not None and kept.superseded is None
        plain = await store.add_fact(ALICE, same, embedding=vec(same.content), model_id=MODEL_ID)
        assert plain.created and plain.memory is not None
        nearest = await store.nearest_in_scope(
            ALICE, MemoryScope.USER, vec(same.content), MODEL_ID, exclude_ids=[tea.id or ""]
        )
        assert nearest is not None and nearest.memory_id == plain.memory.id
        again = await store.add_fact(ALICE, same)
        assert not again.created and again.memory is not None
        assert again.memory.id == plain.memory.id

    async def test_add_fact_supersedes_and_ignores_the_replaced_memory_in_the_gate(
        self, store: ExtractionStore
    ) -> None:
        old = await put(store, ALICE, "Alice lives in Berlin.", embed=True)
        new = Memory(content="Alice lives in Munich.")
        result = await store.add_fact(
            ALICE,
            new,
            embedding=vec(new.content),
            model_id=MODEL_ID,
            dedup_threshold=0.05,  # Berlin would block Munich, were it compared
            replaces=old.id,
        )
        assert result.created and result.superseded == old.id and result.memory is not None
        closed = await store.get(ALICE, old.id or "")
        assert closed is not None and closed.superseded_by == result.memory.id
        # a stale reference: the fact is stored, nothing else is superseded
        later = Memory(content="Alice lives in Vienna.")
        stale = await store.add_fact(ALICE, later, replaces=old.id)
        assert stale.created and stale.superseded is None
        closed_again = await store.get(ALICE, old.id or "")
        assert closed_again == closed
        with pytest.raises(MemoryScopeError):
            await store.add_fact(ALICE, Memory(content="x", scope=MemoryScope.TENANT))


class TestInProcessExtractionStore(ExtractionStoreContract):
    @pytest_asyncio.fixture
    async def store(self) -> ExtractionStore:
        return InMemoryLongTermStore()


class TestPostgresExtractionStore(ExtractionStoreContract):
    @pytest_asyncio.fixture
    async def store(self, database: Database) -> ExtractionStore:
        return PostgresLongTermStore(database)


# -- the named queries under row-level security --------------------------------------------


@pytest_asyncio.fixture
async def seeded(database: Database) -> AsyncIterator[dict[str, Memory]]:
    store = PostgresLongTermStore(database)
    yield {
        "alice": await put(store, ALICE, "Alice drinks green tea.", embed=True),
        "bob": await put(store, BOB, "Bob drinks green tea.", embed=True),
        "bob_session": await put(store, BOB, "Bob's session.", MemoryScope.SESSION, embed=True),
    }


def as_app(db: PgDatabase, owner: MemoryOwner) -> psycopg.Connection[dict[str, Any]]:
    conn = psycopg.connect(db.app_url, autocommit=True, row_factory=dict_row)
    conn.execute(
        "select harbor.set_identity(%(tenant_id)s, %(project_id)s, %(principal_id)s,"
        " %(user_id)s, %(session_id)s, %(run_id)s)",
        identity_params(owner),
    )
    return conn


async def test_the_nearest_query_sees_only_the_callers_rows(
    seeded: dict[str, Memory], fresh_db: PgDatabase
) -> None:
    # Alice's identity, Bob's key: the policies return nothing
    with as_app(fresh_db, ALICE) as conn:
        for owner, scope in [(BOB, MemoryScope.USER), (BOB, MemoryScope.SESSION)]:
            params = {
                **owner.key(scope),
                "scope": scope.value,
                "model_id": MODEL_ID,
                "dims": EMBEDDER.dimensions,
                "embedding": vector_literal(vec("Bob drinks green tea.")),
                "exclude_ids": [],
            }
            assert conn.execute(query("extraction_nearest_memory"), params).fetchall() == []
        bob_key = current_memories_params(BOB, CHAT_SCOPES, 10)
        assert bob_key is not None
        assert conn.execute(query("extraction_current_memories"), bob_key).fetchall() == []


async def test_the_supersede_query_cannot_reach_another_users_row(
    seeded: dict[str, Memory], fresh_db: PgDatabase
) -> None:
    bobs = seeded["bob"]
    params = {
        **memory_params(BOB, Memory(content="Bob drinks coffee now.")),
        **NO_VECTOR,
        "replaces": bobs.id,
    }
    with as_app(fresh_db, ALICE) as conn:
        row = conn.execute(query("extraction_supersede_memory"), params).fetchone()
        assert row is not None
        assert (row["found"], row["id"], row["closed_id"]) == (False, None, None)
        # and a plain insert under Bob's key is refused by the insert policy
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(query("extraction_insert_memory"), {**params, "valid_from": None})
    with psycopg.connect(fresh_db.superuser_url, row_factory=dict_row) as su:
        rows = su.execute(
            "select content, upper(valid) as upper, superseded_by from"
            " harbor.memories where user_id = 'bob' order by content"
        ).fetchall()
    assert rows == [
        {"content": "Bob drinks green tea.", "upper": None, "superseded_by": None},
        {"content": "Bob's session.", "upper": None, "superseded_by": None},
    ]


@pytest.mark.parametrize("name", ["extraction_nearest_memory", "extraction_current_memories"])
async def test_the_extraction_reads_touch_only_the_owners_rows(
    seeded: dict[str, Memory], fresh_db: PgDatabase, name: str
) -> None:
    """With 3,000 other users' rows in the tenant, the plan narrows to the owner by index."""
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        su.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) select 't1', 'user', 'other' || n, 'other' || n, 'note ' || n,"
            " md5(n::text) || md5((n + 1)::text) from generate_series(1, 3000) n"
        )
        su.execute(
            "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
            " embedding, scope, user_id) select tenant_id, id, %s, 384,"
            " array_fill(0.05, array[384])::public.vector, scope, user_id"
            " from harbor.memories where user_id like 'other%%'",
            (MODEL_ID,),
        )
        su.execute("analyze harbor.memories")
        su.execute("analyze harbor.memory_embeddings")
    if name == "extraction_nearest_memory":
        params: dict[str, Any] = {
            **ALICE.key(MemoryScope.USER),
            "scope": "user",
            "model_id": MODEL_ID,
            "dims": EMBEDDER.dimensions,
            "embedding": vector_literal(vec("tea")),
            "exclude_ids": [],
        }
    else:
        params = current_memories_params(ALICE, CHAT_SCOPES, 50) or {}
    with as_app(fresh_db, ALICE) as conn:
        for _ in range(7):  # past the plan cache's custom-plan trials: the generic plan
            conn.execute(query(name), params, prepare=True).fetchall()
        plan = [
            r["QUERY PLAN"]
            for r in conn.execute(
                "explain (analyze, costs off, buffers off) " + query(name), params
            ).fetchall()
        ]
    text = "\n".join(plan)
    assert "Seq Scan" not in text, text
    removed = [int(line.split(":")[1]) for line in plan if "Rows Removed by Filter" in line]
    assert max(removed, default=0) < 50, text
    assert "hnsw" not in text


# -- MemoryExtractor end to end ------------------------------------------------------------


def pg_extractor(database: Database, model: ScriptedModel, **kwargs: Any) -> MemoryExtractor:
    return MemoryExtractor(
        memories=PostgresLongTermStore(database), model=model, embedder=EMBEDDER, **kwargs
    )


async def test_extracted_facts_are_stored_with_provenance_and_vectors(
    database: Database, fresh_db: PgDatabase
) -> None:
    model = ScriptedModel(
        facts(
            fact("Alice prefers metric units.", type="preference", entities=["metric"]),
            fact("The project ships on Fridays.", scope="project", sensitivity="low"),
            fact("Alice wants the Munich numbers today.", scope="tenant", type="episode"),
        )
    )
    stored = await pg_extractor(database, model).extract(ALICE, TURN)
    assert [m.scope for m in stored] == [MemoryScope.USER, MemoryScope.PROJECT, MemoryScope.SESSION]
    with psycopg.connect(fresh_db.superuser_url, row_factory=dict_row) as su:
        rows = su.execute(
            "select m.content, m.scope::text, m.memory_type::text, m.source, m.sensitivity::text,"
            " m.source_session_id, m.source_message_ids, m.entity_ids, upper_inf(m.valid) as open,"
            " m.principal_id, e.model_id, e.dims, e.scope::text as e_scope, e.user_id as e_user,"
            " e.project_id as e_project, e.session_id as e_session"
            " from harbor.memories m join harbor.memory_embeddings e"
            " on e.tenant_id = m.tenant_id and e.memory_id = m.id order by m.content"
        ).fetchall()
    assert [(r["content"], r["scope"], r["e_scope"]) for r in rows] == [
        ("Alice prefers metric units.", "user", "user"),
        ("Alice wants the Munich numbers today.", "session", "session"),
        ("The project ships on Fridays.", "project", "project"),
    ]
    for r in rows:
        assert r["source"] == "extracted" and r["open"] and r["principal_id"] == "alice"
        assert r["source_session_id"] == "s1" and r["source_message_ids"] == ["41", "42"]
        assert (r["model_id"], r["dims"]) == (MODEL_ID, EMBEDDER.dimensions)
    assert rows[0]["entity_ids"] == ["metric"] and rows[0]["memory_type"] == "preference"
    assert rows[1]["e_session"] == "s1" and rows[2]["e_project"] == "p1"
    assert rows[2]["sensitivity"] == "low"


async def test_a_retried_turn_is_a_no_op_even_concurrently(
    database: Database, fresh_db: PgDatabase
) -> None:
    answer = facts(
        fact("Alice keeps bees."), fact("The project ships on Fridays.", scope="project")
    )
    results = await asyncio.gather(
        *(pg_extractor(database, ScriptedModel(answer)).extract(ALICE, TURN) for _ in range(6))
    )
    assert sorted(len(r) for r in results)[-1] <= 2
    assert sum(len(r) for r in results) == 2
    assert await pg_extractor(database, ScriptedModel(answer)).extract(ALICE, TURN) == ()
    with psycopg.connect(fresh_db.superuser_url) as su:
        counts = su.execute(
            "select (select count(*) from harbor.memories),"
            " (select count(*) from harbor.memory_embeddings)"
        ).fetchone()
    assert counts == (2, 2)


async def test_a_restatement_is_skipped_by_similarity_in_sql(database: Database) -> None:
    await pg_extractor(database, ScriptedModel(facts(fact("Alice prefers dark mode.")))).extract(
        ALICE, TURN
    )
    restated = ScriptedModel(
        facts(fact("ALICE prefers dark mode!"), fact("Alice prefers dark mode!", scope="session"))
    )
    stored = await pg_extractor(database, restated).extract(ALICE, TURN)
    assert [(m.content, m.scope) for m in stored] == [
        ("Alice prefers dark mode!", MemoryScope.SESSION)
    ]


async def test_supersession_through_the_extractor(database: Database) -> None:
    store = PostgresLongTermStore(database)
    (old,) = await pg_extractor(
        database, ScriptedModel(facts(fact("Alice lives in Berlin.")))
    ).extract(ALICE, TURN)
    await asyncio.sleep(0.002)
    model = ScriptedModel(replacing("Alice lives in Berlin.", fact("Alice lives in Munich.")))
    (new,) = await pg_extractor(database, model).extract(ALICE, TURN)

    closed = await store.get(ALICE, old.id or "")
    assert closed is not None
    assert closed.superseded_by == new.id and closed.invalid_at == new.valid_from
    before = await store.search(ALICE, "lives", as_of=old.valid_from)
    assert [m.content for m in before] == ["Alice lives in Berlin."]
    assert [m.content for m in await store.search(ALICE, "lives")] == ["Alice lives in Munich."]


async def test_hostile_reference_to_another_users_memory_on_postgres(
    seeded: dict[str, Memory], database: Database
) -> None:
    bobs = seeded["bob"]
    complied = ScriptedModel(
        facts(fact("Bob drinks coffee.", replaces=f"[{(bobs.content_hash or '')[:12]}]")),
        facts(fact("Bob drinks cocoa.", replaces=bobs.id)),
    )
    ex = pg_extractor(database, complied)
    await ex.extract(ALICE, TURN)
    await ex.extract(ALICE, TURN)
    kept = await PostgresLongTermStore(database).get(BOB, bobs.id or "")
    assert kept is not None and kept.invalid_at is None and kept.superseded_by is None


async def test_a_closed_database_is_a_warning_not_an_exception(
    fresh_db: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    db = Database(fresh_db.app_url, min_size=1, max_size=1)
    await db.open()
    await db.close()
    model = ScriptedModel(facts(fact("Alice keeps bees.")))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert await pg_extractor(db, model).extract(ALICE, TURN) == ()
    assert any("loading stored memories" in w for w in warnings_of(caplog))
    assert model.calls == []
