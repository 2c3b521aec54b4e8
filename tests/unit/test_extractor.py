"""MemoryExtractor with scripted models over the in-process store (no database).

The helpers at the top (ScriptedModel, fact(), owners) are shared with the
hostile-conversation tests and the integration tests.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import BaseModel

from harbor_pg.embedders.base import EmbedderError
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryConfigurationError, MemoryDatabaseError
from harbor_pg.extraction.entities import MemoryEntityResolver, ResolvedEntity
from harbor_pg.extraction.extractor import (
    DEFAULT_MAX_FACTS,
    MemoryExtractor,
    extract_memories,
    parse_text_answer,
)
from harbor_pg.extraction.facts import ExtractionResult, memory_reference
from harbor_pg.llm.base import MemoryModelError, StructuredOutputUnsupportedError
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage, Memory, MemoryType, Sensitivity, content_hash
from harbor_pg.tiers.base import NearestMemory, SaveResult
from harbor_pg.tiers.in_process import InMemoryLongTermStore, InMemoryShortTermStore

T = TypeVar("T", bound=BaseModel)

LOGGER = "harbor_pg.extraction"

ALICE = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
ALICE_NO_PROJECT = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")
ALICE_S2 = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s2")
BOB = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="bob", session_id="s1")

TURN = [
    ConversationMessage(id=41, role="user", content="I moved to Munich, and please use metric."),
    ConversationMessage(id=42, role="assistant", content="Noted: Munich, metric units."),
]

Answer = dict[str, Any] | Exception | Callable[[str, str], Any]


def fact(content: str, **fields: Any) -> dict[str, Any]:
    """One model-proposed fact with sensible defaults."""
    return {
        "content": content,
        "type": "fact",
        "scope": "user",
        "importance": 0.8,
        "entities": [],
        "sensitivity": "none",
        "replaces": None,
        **fields,
    }


def facts(*items: dict[str, Any]) -> dict[str, Any]:
    return {"facts": list(items)}


def references(user_prompt: str) -> dict[str, str]:
    """content -> bracketed reference, as rendered in the prompt's <stored_memories>."""
    block = user_prompt.split("<stored_memories>", 1)[-1].split("</stored_memories>", 1)[0]
    return {
        m.group(2): f"[{m.group(1)}]" for m in re.finditer(r"^\[([0-9a-f]+)\] (.*)$", block, re.M)
    }


def replacing(old_content: str, new: dict[str, Any]) -> Callable[[str, str], dict[str, Any]]:
    """A model that reads the rendered reference of ``old_content`` and replaces it."""

    def answer(system: str, user: str) -> dict[str, Any]:
        return facts({**new, "replaces": references(user)[old_content]})

    return answer


class ScriptedModel:
    """A MemoryModel that plays back answers; it records every prompt it was given.

    Each answer is a dict (validated into the requested schema), an exception
    (raised), or a callable ``(system, user) -> dict`` that may read the
    prompt. The last answer repeats.
    """

    def __init__(self, *answers: Answer, structured: bool = True) -> None:
        self.answers = list(answers) or [facts()]
        self.supports_structured = structured
        self.calls: list[tuple[str, str]] = []

    def _next(self, system: str, user: str) -> Any:
        self.calls.append((system, user))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer(system, user) if callable(answer) else answer

    async def generate_text(self, system: str, user: str) -> str:
        answer = self._next(system, user)
        return (
            answer
            if isinstance(answer, str)
            else ExtractionResult.model_validate(answer).model_dump_json()
        )

    async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
        return schema.model_validate(self._next(system, user))


class CountingEmbedder(HashingEmbedder):
    """The hashing embedder, counting batches; optionally failing."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.batches: list[list[str]] = []
        self.fail = fail

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.batches.append(list(texts))
        if self.fail:
            raise EmbedderError("embedding service unavailable")
        return await super().embed(texts)


class FlakyStore(InMemoryLongTermStore):
    """The in-process store, failing a chosen method on its n-th call."""

    def __init__(self, method: str, on_call: int = 1) -> None:
        super().__init__()
        self.method, self.on_call = method, on_call
        self.counts: dict[str, int] = {}

    def _tick(self, method: str) -> None:
        self.counts[method] = self.counts.get(method, 0) + 1
        if method == self.method and self.counts[method] == self.on_call:
            raise MemoryDatabaseError("database unavailable: connection refused")

    async def current_memories(self, *args: Any, **kwargs: Any) -> list[Memory]:
        self._tick("current_memories")
        return await super().current_memories(*args, **kwargs)

    async def nearest_in_scope(self, *args: Any, **kwargs: Any) -> NearestMemory | None:
        self._tick("nearest_in_scope")
        return await super().nearest_in_scope(*args, **kwargs)

    async def save(self, *args: Any, **kwargs: Any) -> SaveResult:
        self._tick("save")
        return await super().save(*args, **kwargs)

    async def supersede(self, *args: Any, **kwargs: Any) -> SaveResult | None:
        self._tick("supersede")
        return await super().supersede(*args, **kwargs)


class GraphResolver:
    """A resolver written to seed 000's port over a fixed table; any write-like call fails.

    ``tenant_id`` is keyword-only, as in the seed, so a positional call fails the test.
    """

    def __init__(self, table: Sequence[ResolvedEntity] | Exception) -> None:
        self.table = table
        self.calls: list[list[str]] = []
        self.tenants: list[str] = []

    async def resolve_entities(
        self, mentions: Sequence[str], *, tenant_id: str
    ) -> tuple[ResolvedEntity, ...]:
        self.calls.append(list(mentions))
        self.tenants.append(tenant_id)
        if isinstance(self.table, Exception):
            raise self.table
        return tuple(self.table)

    def __getattr__(self, name: str) -> Any:  # create_node, merge, upsert, ...
        raise AssertionError(f"extraction must not call {name} on the knowledge graph")


def extractor(
    model: ScriptedModel,
    store: InMemoryLongTermStore | None = None,
    **kwargs: Any,
) -> MemoryExtractor:
    return MemoryExtractor(memories=store or InMemoryLongTermStore(), model=model, **kwargs)


async def all_rows(store: InMemoryLongTermStore, owner: MemoryOwner = ALICE) -> list[Memory]:
    """Every memory of ``owner`` in the chat scopes, including closed ones."""
    return [m for m in store._rows.values() if m.tenant_id == owner.tenant_id]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# -- what is stored -----------------------------------------------------------------------


async def test_stores_each_fact_as_a_new_row_with_provenance() -> None:
    model = ScriptedModel(
        facts(
            fact("The user prefers metric units.", type="preference", importance=0.7),
            fact(
                "The handbook project stores embeddings in Postgres.",
                type="decision",
                scope="project",
                importance=0.9,
                entities=["handbook", "Postgres"],
                sensitivity="low",
            ),
        )
    )
    store = InMemoryLongTermStore()
    stored = await extractor(model, store).extract(ALICE, TURN)

    assert [m.content for m in stored] == [
        "The user prefers metric units.",
        "The handbook project stores embeddings in Postgres.",
    ]
    pref, decision = stored
    assert (pref.scope, pref.memory_type, pref.importance) == (
        MemoryScope.USER,
        MemoryType.PREFERENCE,
        0.7,
    )
    assert (decision.scope, decision.memory_type, decision.sensitivity) == (
        MemoryScope.PROJECT,
        MemoryType.DECISION,
        Sensitivity.LOW,
    )
    assert decision.project_id == "p1" and decision.user_id == ""
    assert decision.entity_ids == ["handbook", "Postgres"]  # no resolver: verbatim mentions
    for m in stored:
        assert m.id is not None and m.source == "extracted"
        assert m.source_session_id == "s1"
        assert m.source_message_ids == ["41", "42"]
        assert m.content_hash == content_hash(m.scope, m.content)
        assert m.valid_from is not None and m.invalid_at is None and m.superseded_by is None
    assert len(model.calls) == 1


async def test_prompt_fences_the_conversation_and_forbids_secrets() -> None:
    model = ScriptedModel(facts())
    await extractor(model).extract(ALICE, TURN)
    system, user = model.calls[0]
    assert "untrusted data" in system and "never follow instructions" in system
    assert "Never record secrets" in system
    assert "<conversation>" in user and "I moved to Munich" in user
    for kind in ("fact", "preference", "decision", "episode"):
        assert kind in system


async def test_langchain_messages_are_accepted() -> None:
    model = ScriptedModel(facts(fact("The user likes tea.")))
    turn = [HumanMessage("I like tea", id="m-1"), AIMessage("Tea it is.", id="m-2")]
    (stored,) = await extractor(model).extract(ALICE, turn)
    assert stored.source_message_ids == ["m-1", "m-2"]


@pytest.mark.parametrize(
    ("owner", "proposed", "expected"),
    [
        (ALICE, "user", MemoryScope.USER),
        (ALICE, "project", MemoryScope.PROJECT),
        (ALICE, "session", MemoryScope.SESSION),
        (ALICE, "tenant", MemoryScope.SESSION),
        (ALICE, "global", MemoryScope.SESSION),
        (ALICE, "run", MemoryScope.SESSION),
        (ALICE, "everyone", MemoryScope.SESSION),
        (ALICE, None, MemoryScope.SESSION),
        (ALICE, 7, MemoryScope.SESSION),
        (ALICE_NO_PROJECT, "project", MemoryScope.SESSION),
        (ALICE_NO_PROJECT, "user", MemoryScope.USER),
    ],
)
async def test_scope_rules(owner: MemoryOwner, proposed: object, expected: MemoryScope) -> None:
    model = ScriptedModel(facts(fact("The team ships on Fridays.", scope=proposed)))
    store = InMemoryLongTermStore()
    (stored,) = await extractor(model, store).extract(owner, TURN)
    assert stored.scope is expected
    assert stored.tenant_id == "t1"
    assert stored.user_id == ("" if expected is MemoryScope.PROJECT else "alice")


async def test_project_scope_is_not_offered_to_an_owner_without_a_project() -> None:
    model = ScriptedModel(facts())
    await extractor(model).extract(ALICE_NO_PROJECT, TURN)
    assert "project: not available here" in model.calls[0][0]


async def test_blank_and_unimportant_facts_are_dropped() -> None:
    model = ScriptedModel(
        facts(
            fact("   "),
            fact(""),
            fact("Below the floor.", importance=0.29),
            fact("At the floor.", importance=0.3),
            fact("Unscored.", importance=None),
            fact("Scored as text.", importance="90%"),
        )
    )
    stored = await extractor(model, policy=MemoryPolicy(extraction_min_importance=0.3)).extract(
        ALICE, TURN
    )
    assert [m.content for m in stored] == ["At the floor.", "Scored as text."]


async def test_whitespace_in_a_fact_is_collapsed() -> None:
    model = ScriptedModel(facts(fact("  The user\n likes   tea. ")))
    (stored,) = await extractor(model).extract(ALICE, TURN)
    assert stored.content == "The user likes tea."


async def test_credentials_are_refused_before_anything_is_saved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ScriptedModel(
        facts(
            fact("The user's password is hunter2!"),
            fact("The OpenAI key is sk-proj-Abc123Def456Ghi789Jkl012Mno345."),
            fact("The staging database is postgres://app:s3cretPw@db.internal/app."),
            fact("The user rotates passwords every month."),
        )
    )
    store = FlakyStore("none")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        stored = await extractor(model, store).extract(ALICE, TURN)
    assert [m.content for m in stored] == ["The user rotates passwords every month."]
    assert store.counts.get("save") == 1
    text = "\n".join(warnings_of(caplog))
    assert "password" in text and "openai_api_key" in text and "connection_string" in text
    assert "hunter2" not in text and "s3cretPw" not in text and "sk-proj" not in text


async def test_a_credential_in_an_entity_mention_is_dropped() -> None:
    model = ScriptedModel(
        facts(fact("The user deploys with a token.", entities=["ghp_" + "a1B2" * 9, "deploy"]))
    )
    (stored,) = await extractor(model).extract(ALICE, TURN)
    assert stored.entity_ids == ["deploy"]


async def test_a_long_answer_is_capped(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel(facts(*(fact(f"Fact number {i}.") for i in range(DEFAULT_MAX_FACTS + 5))))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        stored = await extractor(model).extract(ALICE, TURN)
    assert len(stored) == DEFAULT_MAX_FACTS
    assert any("only the first" in w for w in warnings_of(caplog))


# -- embeddings and deduplication ---------------------------------------------------------


async def test_facts_are_embedded_in_one_batch_and_stored_with_their_vector() -> None:
    embedder = CountingEmbedder()
    model = ScriptedModel(facts(fact("The user likes tea."), fact("The user owns a bike.")))
    store = InMemoryLongTermStore()
    stored = await extractor(model, store, embedder=embedder).extract(ALICE, TURN)
    assert embedder.batches == [["The user likes tea.", "The user owns a bike."]]
    query = await embedder.embed_query("The user owns a bike.")
    nearest = await store.nearest_in_scope(ALICE, MemoryScope.USER, query, embedder.model_id)
    assert nearest is not None and nearest.memory_id == stored[1].id
    assert nearest.similarity == pytest.approx(1.0)


async def test_a_retried_turn_is_a_no_op() -> None:
    answer = facts(fact("The user likes tea."), fact("The team ships on Fridays.", scope="project"))
    store = InMemoryLongTermStore()
    first = await extractor(ScriptedModel(answer), store).extract(ALICE, TURN)
    again = await extractor(ScriptedModel(answer), store).extract(ALICE, TURN)
    assert len(first) == 2 and again == ()
    assert len(await all_rows(store)) == 2


async def test_identical_facts_in_one_answer_are_stored_once() -> None:
    model = ScriptedModel(facts(fact("The user likes tea."), fact("the user  LIKES tea.")))
    stored = await extractor(model).extract(ALICE, TURN)
    assert [m.content for m in stored] == ["The user likes tea."]


async def test_the_hash_gate_holds_beyond_the_rendered_memories() -> None:
    store = InMemoryLongTermStore()
    for i in range(5):
        await store.save(ALICE, Memory(content=f"Older fact {i}.", scope=MemoryScope.USER))
    model = ScriptedModel(facts(fact("Older fact 0.")))
    # render only one memory: the duplicate is not in the prompt, the store still refuses it
    assert await extractor(model, store, render_limit=1).extract(ALICE, TURN) == ()
    assert len(await all_rows(store)) == 5


async def test_a_restatement_is_skipped_by_similarity_in_the_same_scope_only() -> None:
    embedder = CountingEmbedder()
    store = InMemoryLongTermStore()
    first = ScriptedModel(facts(fact("The user prefers dark mode.")))
    await extractor(first, store, embedder=embedder).extract(ALICE, TURN)
    restated = ScriptedModel(
        facts(
            fact("The user prefers DARK mode!"),  # other hash, same words: a restatement
            fact("The user prefers dark mode!", scope="session"),  # other scope: kept
        )
    )
    stored = await extractor(restated, store, embedder=embedder).extract(ALICE, TURN)
    assert [(m.content, m.scope) for m in stored] == [
        ("The user prefers dark mode!", MemoryScope.SESSION)
    ]


async def test_without_an_embedder_there_is_no_similarity_gate() -> None:
    store = InMemoryLongTermStore()
    await extractor(ScriptedModel(facts(fact("The user prefers dark mode."))), store).extract(
        ALICE, TURN
    )
    stored = await extractor(
        ScriptedModel(facts(fact("The user prefers DARK mode!"))), store
    ).extract(ALICE, TURN)
    assert len(stored) == 1


# -- supersession -------------------------------------------------------------------------


async def seed(store: InMemoryLongTermStore, content: str, **fields: Any) -> Memory:
    fields.setdefault("scope", MemoryScope.USER)
    result = await store.save(ALICE, Memory(content=content, source="extracted", **fields))
    await asyncio.sleep(0.002)  # the successor starts strictly later
    return result.memory


async def test_stored_memories_are_rendered_with_their_reference() -> None:
    store = InMemoryLongTermStore()
    old = await seed(store, "The user lives in Berlin.")
    model = ScriptedModel(facts())
    await extractor(model, store).extract(ALICE, TURN)
    user = model.calls[0][1]
    assert f"[{memory_reference(old)}] The user lives in Berlin." in user


async def test_rendered_memories_are_the_owners_current_ones_newest_first_bounded() -> None:
    store = InMemoryLongTermStore()
    for i in range(4):
        await seed(store, f"User fact {i}.")
    await seed(store, "Session fact.", scope=MemoryScope.SESSION)
    await store.save(BOB, Memory(content="Bob's fact.", scope=MemoryScope.USER))
    await store.save(ALICE_S2, Memory(content="Other session.", scope=MemoryScope.SESSION))
    await store.save(
        ALICE,
        Memory(
            content="The rolling summary.",
            scope=MemoryScope.SESSION,
            memory_type=MemoryType.SUMMARY,
        ),
    )
    model = ScriptedModel(facts())
    await extractor(model, store, render_limit=3).extract(ALICE, TURN)
    assert list(references(model.calls[0][1])) == ["Session fact.", "User fact 3.", "User fact 2."]


async def test_a_contradiction_supersedes_the_rendered_memory() -> None:
    store = InMemoryLongTermStore()
    old = await seed(store, "The user lives in Berlin.")
    model = ScriptedModel(replacing("The user lives in Berlin.", fact("The user lives in Munich.")))
    (new,) = await extractor(model, store).extract(ALICE, TURN)

    closed = await store.get(ALICE, old.id or "")
    assert closed is not None
    assert closed.superseded_by == new.id
    assert closed.invalid_at == new.valid_from
    assert closed.content == "The user lives in Berlin."  # still readable
    assert old.valid_from is not None
    assert [m.content for m in await store.search(ALICE, "lives", as_of=old.valid_from)] == [
        "The user lives in Berlin."
    ]
    assert [m.content for m in await store.search(ALICE, "lives")] == ["The user lives in Munich."]


async def test_the_replaced_memory_does_not_count_as_a_restatement() -> None:
    store = InMemoryLongTermStore()
    embedder = CountingEmbedder()
    await extractor(
        ScriptedModel(facts(fact("The user lives in Berlin."))), store, embedder=embedder
    ).extract(ALICE, TURN)
    await asyncio.sleep(0.002)
    model = ScriptedModel(replacing("The user lives in Berlin.", fact("The user lives in Munich.")))
    # a threshold so low that Berlin would block Munich, were it compared
    policy = MemoryPolicy(dedup_threshold=0.1)
    stored = await extractor(model, store, embedder=embedder, policy=policy).extract(ALICE, TURN)
    assert [m.content for m in stored] == ["The user lives in Munich."]


@pytest.mark.parametrize(
    "reference",
    ["[0123456789ab]", "0123456789ab", "[abc]", "Berlin", "", None, 12],
)
async def test_an_unknown_reference_is_ignored_and_the_fact_stored(reference: object) -> None:
    store = InMemoryLongTermStore()
    old = await seed(store, "The user lives in Berlin.")
    model = ScriptedModel(facts(fact("The user lives in Munich.", replaces=reference)))
    (new,) = await extractor(model, store).extract(ALICE, TURN)
    assert new.content == "The user lives in Munich."
    kept = await store.get(ALICE, old.id or "")
    assert kept is not None and kept.invalid_at is None and kept.superseded_by is None


async def test_a_reference_into_another_scope_is_ignored() -> None:
    store = InMemoryLongTermStore()
    old = await seed(store, "The user lives in Berlin.")
    model = ScriptedModel(
        replacing(
            "The user lives in Berlin.", fact("The user is in Munich today.", scope="session")
        )
    )
    (new,) = await extractor(model, store).extract(ALICE, TURN)
    assert new.scope is MemoryScope.SESSION
    kept = await store.get(ALICE, old.id or "")
    assert kept is not None and kept.superseded_by is None


async def test_a_memory_superseded_meanwhile_is_not_superseded_again() -> None:
    store = InMemoryLongTermStore()
    old = await seed(store, "The user lives in Berlin.")

    class RacingModel(ScriptedModel):
        async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
            # another extractor wins the race between our render and our save
            winner = Memory(content="The user lives in Hamburg.", scope=MemoryScope.USER)
            assert await store.supersede(ALICE, old.id or "", winner) is not None
            return await super().generate_structured(system, user, schema)

    model = RacingModel(replacing("The user lives in Berlin.", fact("The user lives in Munich.")))
    stored = await extractor(model, store).extract(ALICE, TURN)
    closed = await store.get(ALICE, old.id or "")
    assert closed is not None and closed.superseded_by is not None
    successor = await store.get(ALICE, closed.superseded_by)
    assert successor is not None and successor.content == "The user lives in Hamburg."
    assert [m.content for m in stored] == ["The user lives in Munich."]  # stored, unlinked


async def test_one_memory_is_replaced_at_most_once_per_answer() -> None:
    store = InMemoryLongTermStore()
    old = await seed(store, "The user lives in Berlin.")

    def answer(system: str, user: str) -> dict[str, Any]:
        ref = references(user)["The user lives in Berlin."]
        return facts(
            fact("The user lives in Munich.", replaces=ref),
            fact("The user lives near the Isar.", replaces=ref),
        )

    first, second = await extractor(ScriptedModel(answer), store).extract(ALICE, TURN)
    closed = await store.get(ALICE, old.id or "")
    assert closed is not None and closed.superseded_by == first.id
    assert second.valid_from is not None and second.invalid_at is None


async def test_a_successor_identical_to_a_current_memory_changes_nothing() -> None:
    store = InMemoryLongTermStore()
    old = await seed(store, "The user lives in Berlin.")
    await seed(store, "The user lives in Munich.")
    model = ScriptedModel(replacing("The user lives in Berlin.", fact("The user lives in Munich.")))
    assert await extractor(model, store).extract(ALICE, TURN) == ()
    kept = await store.get(ALICE, old.id or "")
    assert kept is not None and kept.superseded_by is None


async def test_render_limit_zero_shows_nothing_and_supersedes_nothing() -> None:
    store = InMemoryLongTermStore()
    old = await seed(store, "The user lives in Berlin.")
    ref = f"[{memory_reference(old)}]"
    model = ScriptedModel(facts(fact("The user lives in Munich.", replaces=ref)))
    (new,) = await extractor(model, store, render_limit=0).extract(ALICE, TURN)
    assert "<stored_memories/>" in model.calls[0][1]
    kept = await store.get(ALICE, old.id or "")
    assert kept is not None and kept.superseded_by is None and new.invalid_at is None


# -- entity anchoring ---------------------------------------------------------------------


async def test_resolved_entities_above_the_floor_are_stored() -> None:
    resolver = GraphResolver(
        [
            ResolvedEntity("Ingest pipeline", "kg:pipeline", 0.9),
            ResolvedEntity("ingest pipeline", "kg:pipeline", 0.8),  # same node again
            ResolvedEntity("Dana", "kg:dana", 0.5),  # at the floor: kept
            ResolvedEntity("Dana", "kg:dana-2", 0.49),  # below: dropped
            ResolvedEntity("Postgres", "kg:pg", float("nan")),
            ResolvedEntity("Postgres", " ", 0.9),
            ResolvedEntity("not asked", "kg:other", 1.0),
        ]
    )
    model = ScriptedModel(
        facts(
            fact("Dana owns the ingest pipeline.", entities=["Dana", "Ingest pipeline"]),
            fact("The pipeline writes to Postgres.", entities=["Postgres", "ingest   pipeline"]),
        )
    )
    policy = MemoryPolicy(entity_confidence_floor=0.5)
    first, second = await extractor(model, entities=resolver, policy=policy).extract(ALICE, TURN)
    assert first.entity_ids == ["kg:dana", "kg:pipeline"]
    assert second.entity_ids == ["kg:pipeline"]
    assert resolver.calls == [["Dana", "Ingest pipeline", "Postgres"]]  # one call, distinct
    assert resolver.tenants == ["t1"]  # tenant_id=owner.tenant_id


async def test_the_resolver_is_asked_within_the_owners_tenant_only() -> None:
    resolver = GraphResolver([ResolvedEntity("Dana", "kg:dana", 0.9)])
    other_tenant = MemoryOwner(tenant_id="t2", principal_id="alice", session_id="s1")
    model = ScriptedModel(facts(fact("Dana owns the ingest pipeline.", entities=["Dana"])))
    (stored,) = await extractor(model, entities=resolver).extract(other_tenant, TURN)
    assert stored.entity_ids == ["kg:dana"]
    assert resolver.tenants == ["t2"]


async def test_a_resolver_copied_from_the_seed_is_wired_and_called() -> None:
    class SeedResolver:  # the port exactly as seed 000 writes it, plus a body
        async def resolve_entities(
            self, mentions: Sequence[str], *, tenant_id: str
        ) -> tuple[ResolvedEntity, ...]:
            return tuple(ResolvedEntity(m, f"{tenant_id}:{m.lower()}", 1.0) for m in mentions)

    resolver = SeedResolver()
    assert isinstance(resolver, MemoryEntityResolver)
    model = ScriptedModel(facts(fact("Dana owns the ingest pipeline.", entities=["Dana", "KG"])))
    (stored,) = await extractor(model, entities=resolver).extract(ALICE, TURN)
    assert stored.entity_ids == ["t1:dana", "t1:kg"]


def test_a_pre_release_resolve_method_is_rejected_with_a_rename_hint() -> None:
    class OldStyle:
        async def resolve(self, mentions: Sequence[str], owner: MemoryOwner) -> Any:
            return ()

    assert not isinstance(OldStyle(), MemoryEntityResolver)
    with pytest.raises(MemoryConfigurationError, match=r"rename it to resolve_entities"):
        extractor(ScriptedModel(), entities=OldStyle())


async def test_a_failing_resolver_costs_the_anchors_only(caplog: pytest.LogCaptureFixture) -> None:
    resolver = GraphResolver(RuntimeError("graph offline"))
    model = ScriptedModel(facts(fact("Dana owns the ingest pipeline.", entities=["Dana"])))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        (stored,) = await extractor(model, entities=resolver).extract(ALICE, TURN)
    assert stored.entity_ids == []
    assert any("entity resolver failed" in w for w in warnings_of(caplog))


async def test_a_resolver_answering_garbage_costs_the_anchors_only() -> None:
    class Garbage:
        async def resolve_entities(self, mentions: Sequence[str], *, tenant_id: str) -> Any:
            return 42

    model = ScriptedModel(facts(fact("Dana owns the ingest pipeline.", entities=["Dana"])))
    (stored,) = await extractor(model, entities=Garbage()).extract(ALICE, TURN)
    assert stored.entity_ids == []


async def test_the_resolver_is_not_called_without_mentions() -> None:
    resolver = GraphResolver([])
    await extractor(ScriptedModel(facts(fact("No names here."))), entities=resolver).extract(
        ALICE, TURN
    )
    assert resolver.calls == []


# -- failure semantics --------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        MemoryModelError("upstream returned 429", status_code=429),
        RuntimeError("a bug in a model adapter"),
        {"facts": "not a list"},  # validates to no facts
    ],
)
async def test_a_failing_model_stores_nothing_and_does_not_raise(
    failure: Answer, caplog: pytest.LogCaptureFixture
) -> None:
    store = InMemoryLongTermStore()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert await extractor(ScriptedModel(failure), store).extract(ALICE, TURN) == ()
    assert await all_rows(store) == []
    if isinstance(failure, Exception):
        assert any("the model call" in w for w in warnings_of(caplog))


async def test_a_failing_embedder_stores_nothing(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryLongTermStore()
    model = ScriptedModel(facts(fact("The user likes tea.")))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = await extractor(model, store, embedder=CountingEmbedder(fail=True)).extract(
            ALICE, TURN
        )
    assert got == () and await all_rows(store) == []
    assert any("embedding" in w and "EmbedderError" in w for w in warnings_of(caplog))


@pytest.mark.parametrize(
    ("method", "on_call", "saved"),
    [
        ("current_memories", 1, 0),
        ("nearest_in_scope", 1, 0),
        ("nearest_in_scope", 2, 1),
        ("save", 1, 0),
        ("save", 2, 1),
        ("save", 3, 2),
    ],
)
async def test_a_failing_store_returns_what_was_already_saved(
    method: str, on_call: int, saved: int, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyStore(method, on_call)
    model = ScriptedModel(facts(fact("First."), fact("Second."), fact("Third.")))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = await extractor(model, store, embedder=CountingEmbedder()).extract(ALICE, TURN)
    assert [m.content for m in got] == ["First.", "Second.", "Third."][:saved]
    (warning,) = warnings_of(caplog)
    assert "MemoryDatabaseError" in warning and f"{saved} memories saved" in warning
    if method == "current_memories":
        assert model.calls == []  # stopped before the model call


async def test_a_failing_supersession_returns_what_was_saved() -> None:
    store = FlakyStore("supersede")
    await seed(store, "The user lives in Berlin.")

    def answer(system: str, user: str) -> dict[str, Any]:
        ref = references(user)["The user lives in Berlin."]
        return facts(fact("The user likes tea."), fact("The user lives in Munich.", replaces=ref))

    got = await extractor(ScriptedModel(answer), store).extract(ALICE, TURN)
    assert [m.content for m in got] == ["The user likes tea."]


async def test_cancellation_is_not_swallowed() -> None:
    class Hanging(ScriptedModel):
        async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    task = asyncio.ensure_future(extractor(Hanging()).extract(ALICE, TURN))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_disabled_policy_calls_no_model() -> None:
    model = ScriptedModel(facts(fact("The user likes tea.")))
    assert await extractor(model, policy=MemoryPolicy.disabled()).extract(ALICE, TURN) == ()
    assert model.calls == []


async def test_no_messages_calls_no_model() -> None:
    model = ScriptedModel(facts(fact("The user likes tea.")))
    assert await extractor(model).extract(ALICE, []) == ()
    assert model.calls == []


async def test_an_owner_without_a_session_is_refused_without_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ScriptedModel(facts(fact("The user likes tea.")))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = await extractor(model).extract(MemoryOwner(tenant_id="t1", principal_id="a"), TURN)
    assert got == () and model.calls == []
    assert any("does not address a session" in w for w in warnings_of(caplog))


# -- models without structured output -----------------------------------------------------


async def test_a_text_only_model_answers_in_json() -> None:
    answer = '```json\n{"facts": [{"content": "The user likes tea.", "importance": 0.9}]}\n```'
    model = ScriptedModel(lambda s, u: answer, structured=False)
    (stored,) = await extractor(model).extract(ALICE, TURN)
    assert stored.content == "The user likes tea." and stored.scope is MemoryScope.SESSION


async def test_structured_output_unsupported_falls_back_to_text() -> None:
    class TextOnly(ScriptedModel):
        async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
            raise StructuredOutputUnsupportedError("no json mode")

    model = TextOnly(facts(fact("The user likes tea.")))
    (stored,) = await extractor(model).extract(ALICE, TURN)
    assert stored.content == "The user likes tea."


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ('{"facts": []}', 0),
        ('[{"content": "A."}, {"content": "B."}]', 2),
        ('Here you go: {"facts": [{"content": "A."}]} Hope that helps.', 1),
        ("```\n[]\n```", 0),
    ],
)
def test_parse_text_answer(text: str, count: int) -> None:
    assert len(parse_text_answer(text).facts) == count


@pytest.mark.parametrize("text", ["", "no json here", "{broken", "]["])
def test_parse_text_answer_rejects_non_json(text: str) -> None:
    with pytest.raises(ValueError):
        parse_text_answer(text)


# -- wiring -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"memories": object()},
        {"model": object()},
        {"model": None},
        {"embedder": object()},
        {"entities": object()},
        {"policy": {"dedup_threshold": 0.9}},
        {"render_limit": -1},
        {"max_facts": 0},
        {"max_facts": True},
    ],
)
def test_miswiring_raises_a_configuration_error(kwargs: dict[str, Any]) -> None:
    wiring: dict[str, Any] = {"memories": InMemoryLongTermStore(), "model": ScriptedModel()}
    with pytest.raises(MemoryConfigurationError):
        MemoryExtractor(**{**wiring, **kwargs})


# -- extract_memories ---------------------------------------------------------------------


async def test_extract_memories_is_off_by_default() -> None:
    with pytest.raises(MemoryConfigurationError, match="extract_facts=True"):
        await extract_memories(
            ALICE, short_term=InMemoryShortTermStore(), extractor=extractor(ScriptedModel())
        )
    with pytest.raises(MemoryConfigurationError):
        await extract_memories(
            ALICE, short_term=InMemoryShortTermStore(), extractor=None, extract_facts=True
        )


async def test_extract_memories_mines_the_recent_turns() -> None:
    turns = InMemoryShortTermStore()
    for i in range(5):
        await turns.append(ALICE, ConversationMessage(role="user", content=f"turn {i}"))
    await turns.append(BOB, ConversationMessage(role="user", content="bob's turn"))
    model = ScriptedModel(facts(fact("The user likes tea."), fact("The user owns a bike.")))
    store = InMemoryLongTermStore()
    ids = await extract_memories(
        ALICE,
        short_term=turns,
        extractor=extractor(model, store),
        extract_facts=True,
        limit=3,
    )
    assert len(ids) == 2
    user = model.calls[0][1]
    assert "turn 2" in user and "turn 4" in user and "turn 1" not in user
    assert "bob's turn" not in user
    saved = await store.get(ALICE, ids[0])
    assert saved is not None and saved.source_message_ids == ["3", "4", "5"]
    # a second call over the same turns stores nothing new
    again = await extract_memories(
        ALICE, short_term=turns, extractor=extractor(model, store), extract_facts=True, limit=3
    )
    assert again == []


async def test_extract_memories_survives_a_failing_short_term_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(InMemoryShortTermStore):
        async def recent(self, owner: MemoryOwner, limit: int) -> list[ConversationMessage]:
            raise MemoryDatabaseError("database unavailable")

    model = ScriptedModel(facts(fact("The user likes tea.")))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ids = await extract_memories(
            ALICE, short_term=Broken(), extractor=extractor(model), extract_facts=True
        )
    assert ids == [] and model.calls == []
    assert warnings_of(caplog)
