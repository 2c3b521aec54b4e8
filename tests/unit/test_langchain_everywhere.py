"""Every place that takes a model accepts a LangChain BaseChatModel (seed 000).

Two of LangChain's own fake chat models stand in for real ones: FakeListChatModel,
which cannot do structured output, and GenericFakeChatModel with tool binding,
on which LangChain's own ``with_structured_output`` works (it answers with a
tool call).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool

from harbor_pg import (
    ConversationMessage,
    MemoryContextBuilder,
    MemoryExtractor,
    MemoryManager,
    MemoryOwner,
    MemoryPolicy,
    ResolvedEntity,
    SessionSummarizer,
    extract_memories,
)
from harbor_pg.context.condenser import QueryCondenser
from harbor_pg.context.summarizer import RollingSummary
from harbor_pg.tiers.in_process import InMemoryLongTermStore, InMemoryShortTermStore

DANA = MemoryOwner(tenant_id="acme", project_id="handbook", principal_id="dana", session_id="s1")
FACT = {
    "content": "Dana owns the ingest pipeline",
    "type": "fact",
    "scope": "project",
    "importance": 0.8,
    "entities": ["ingest pipeline"],
    "sensitivity": "none",
}


class StructuredFake(GenericFakeChatModel):
    """LangChain's generic fake with tool binding: with_structured_output works on it."""

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        return self


def structured(*answers: tuple[str, dict[str, Any]]) -> StructuredFake:
    """A StructuredFake answering each call with one tool call ``(schema name, args)``."""
    return StructuredFake(
        messages=iter(
            AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"c{i}"}])
            for i, (name, args) in enumerate(answers)
        )
    )


async def _conversation(store: InMemoryShortTermStore, n: int = 6) -> None:
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        await store.append(DANA, ConversationMessage(role=role, content=f"message {i} " * 30))


async def test_builder_rewrites_with_a_plain_chat_model() -> None:
    manager = MemoryManager(short_term=InMemoryShortTermStore(), long_term=InMemoryLongTermStore())
    await manager.append(DANA, ConversationMessage(role="user", content="Dana owns ingest."))
    fake = FakeListChatModel(responses=["who owns the ingest pipeline"])
    context = await manager.context_builder(model=fake).build(DANA, "and who owns it?")
    assert context.degraded == ()
    assert context.standalone_query == "who owns the ingest pipeline" and context.rewritten
    await manager.close()


async def test_builder_rewrites_with_a_structured_chat_model() -> None:
    fake = structured(
        (
            "RewriteResult",
            {"standalone_query": "why was pgvector chosen", "wanted_types": ["decision"]},
        )
    )
    builder = MemoryContextBuilder(messages=InMemoryShortTermStore(), model=fake)
    context = await builder.build(DANA, "why did we pick it?")
    assert context.degraded == ()
    assert context.standalone_query == "why was pgvector chosen"
    assert [t.value for t in context.wanted_types] == ["decision"]


async def test_condenser_takes_either_kind() -> None:
    plain = QueryCondenser(FakeListChatModel(responses=["the ingest owner"]))
    assert (await plain.condense("who?")).standalone_query == "the ingest owner"
    typed = QueryCondenser(
        structured(
            ("RewriteResult", {"standalone_query": "dana tea", "wanted_types": ["preference"]})
        )
    )
    done = await typed.condense("what does she drink?")
    assert done.standalone_query == "dana tea" and [t.value for t in done.wanted_types] == [
        "preference"
    ]


async def test_rolling_and_background_summaries_take_a_chat_model() -> None:
    messages, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await _conversation(messages)
    policy = MemoryPolicy(
        recent_max_messages=6,
        summary_keep_messages=2,
        summarise_after_turns=2,
        summary_cooldown_seconds=0,
    )
    rolling = RollingSummary(
        policy=policy,
        messages=messages,
        memories=memories,
        model=FakeListChatModel(responses=["Dana and the bot talked about messages."]),
    )
    assert rolling.uses_model
    window = await messages.recent(DANA, 6)
    outcome = await rolling.refresh(DANA, window, None, window_is_whole_session=True)
    assert outcome.saved and outcome.summary is not None
    assert outcome.summary.content == "Dana and the bot talked about messages."

    background = SessionSummarizer(
        policy=policy,
        messages=messages,
        memories=memories,
        model=FakeListChatModel(responses=["A later summary."]),
    )
    await _conversation(messages, 4)
    assert await background.maybe_summarise(DANA)
    summary = await memories.load_summary(DANA)
    assert summary is not None and summary.content == "A later summary."


async def test_extractor_and_extract_memories_take_either_kind() -> None:
    messages, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await messages.append(DANA, ConversationMessage(role="user", content="I own ingest now."))
    plain = MemoryExtractor(
        memories=memories, model=FakeListChatModel(responses=[json.dumps({"facts": [FACT]})])
    )
    ids = await extract_memories(DANA, short_term=messages, extractor=plain, extract_facts=True)
    assert len(ids) == 1
    manager = MemoryManager(short_term=messages, long_term=InMemoryLongTermStore())
    ids = await manager.extract_memories(
        DANA, model=structured(("ExtractionResult", {"facts": [FACT]})), extract_facts=True
    )
    stored = await manager.get(DANA, ids[0])
    assert stored is not None and stored.content == "Dana owns the ingest pipeline"
    await manager.close()


class GraphResolver:
    """Resolves 'ingest pipeline' to a knowledge-graph node."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str]] = []

    async def resolve_entities(
        self, mentions: Sequence[str], *, tenant_id: str
    ) -> tuple[ResolvedEntity, ...]:
        self.calls.append((list(mentions), tenant_id))
        return tuple(
            ResolvedEntity(mention=m, entity_id="kg:ingest", confidence=0.9)
            for m in mentions
            if m == "ingest pipeline"
        )


async def test_manager_extract_memories_takes_an_entity_resolver() -> None:
    manager = MemoryManager(short_term=InMemoryShortTermStore(), long_term=InMemoryLongTermStore())
    await manager.append(DANA, ConversationMessage(role="user", content="I own ingest now."))
    resolver = GraphResolver()
    ids = await manager.extract_memories(
        DANA,
        model=FakeListChatModel(responses=[json.dumps({"facts": [FACT]})]),
        extract_facts=True,
        entities=resolver,
        max_facts=3,
    )
    stored = await manager.get(DANA, ids[0])
    assert stored is not None and stored.entity_ids == ["kg:ingest"]
    assert resolver.calls == [(["ingest pipeline"], "acme")]
    await manager.close()
