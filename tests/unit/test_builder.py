"""MemoryContextBuilder: build order, trimming, rewrite, recall, budgets and failures.

Scripted models and the in-process stores; no database. The rolling summary
itself is covered in test_builder_summary.py.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from harbor_pg.context.builder import ContextRecall, MemoryContextBuilder
from harbor_pg.context.condenser import QueryCondenser, RewriteRejectedError
from harbor_pg.context.result import MemoryContext, recalled_entity_ids
from harbor_pg.errors import (
    MemoryConfigurationError,
    MemoryDatabaseError,
    MemoryScopeError,
    MemoryValidationError,
)
from harbor_pg.llm.base import MemoryModelError, StructuredOutputUnsupportedError
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import BudgetSplit, MemoryPolicy
from harbor_pg.records import ConversationMessage, Memory, MemoryType
from harbor_pg.tiers.in_process import InMemoryLongTermStore, InMemoryShortTermStore
from harbor_pg.tokens import approximate_tokens
from tests.unit.test_builder_support import (
    ScriptedModel,
    ScriptedRecall,
    assistant,
    exchange,
    tool,
    user,
)

OWNER = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
QUESTION = "and who owns it?"
WARN = "harbor_pg.context"


async def fill(store: InMemoryShortTermStore, messages: list[ConversationMessage]) -> None:
    for message in messages:
        await store.append(OWNER, message)


def builder(
    messages: InMemoryShortTermStore | None = None,
    *,
    memories: Any = None,
    **kwargs: Any,
) -> MemoryContextBuilder:
    return MemoryContextBuilder(
        messages=messages if messages is not None else InMemoryShortTermStore(),
        memories=memories,
        **kwargs,
    )


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- identity and contract -------------------------------------------------------------


@pytest.mark.parametrize(
    "owner",
    [
        MemoryOwner(tenant_id="t1", session_id="s1"),
        MemoryOwner(tenant_id="t1", principal_id="alice"),
        MemoryOwner(tenant_id="t1", user_id="alice", session_id="s1"),
    ],
)
async def test_build_requires_principal_and_session(owner: MemoryOwner) -> None:
    with pytest.raises(MemoryScopeError, match=r"principal_id|session_id"):
        await builder().build(owner, QUESTION)


async def test_user_id_is_derived_from_principal() -> None:
    store = InMemoryShortTermStore()
    explicit = MemoryOwner(tenant_id="t1", principal_id="alice", user_id="alice", session_id="s1")
    await store.append(explicit, user("hello there"))
    context = await builder(store).build(
        MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1"), QUESTION
    )
    assert [m.content for m in context.messages] == ["hello there"]


async def test_build_does_not_persist_the_question() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(2))
    before = await store.count(OWNER)
    context = await builder(store).build(OWNER, QUESTION)
    assert await store.count(OWNER) == before
    assert all(m.content != QUESTION for m in context.messages)
    assert context.question == QUESTION


async def test_question_must_be_a_string() -> None:
    with pytest.raises(MemoryValidationError):
        await builder().build(OWNER, 42)  # type: ignore[arg-type]


async def test_empty_session_builds_an_empty_context() -> None:
    context = await builder(memories=InMemoryLongTermStore()).build(OWNER, QUESTION)
    assert context.messages == ()
    assert context.summary is None
    assert context.standalone_query == QUESTION
    assert context.degraded == ()


# -- the result ------------------------------------------------------------------------


async def test_context_is_immutable_and_converts_to_langchain() -> None:
    store = InMemoryShortTermStore()
    await fill(store, [user("first question"), assistant("first answer")])
    context = await builder(store).build(OWNER, QUESTION, anchor_entity_ids=["e1", "e1", "e2"])
    assert isinstance(context, MemoryContext)
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.summary = "changed"  # type: ignore[misc]
    assert isinstance(context.messages, tuple)
    assert context.anchor_entity_ids == ("e1", "e2")
    lc = context.langchain_messages()
    assert isinstance(lc[0], HumanMessage)
    assert lc[0].content == "first question"
    assert lc[0].id == str(context.messages[0].id)


def test_recalled_entity_ids_is_the_ordered_union() -> None:
    context = MemoryContext(
        recalled=(
            Memory(content="a", entity_ids=["x", "y"]),
            Memory(content="b", entity_ids=["y", "z"]),
            Memory(content="c"),
        )
    )
    assert recalled_entity_ids(context) == ("x", "y", "z")


@pytest.mark.parametrize("bad", ["e1", ["e1", 2]])
async def test_anchors_must_be_a_sequence_of_strings(bad: Any) -> None:
    with pytest.raises(MemoryValidationError):
        await builder().build(OWNER, QUESTION, anchor_entity_ids=bad)


# -- no-model default and disabled policy ------------------------------------------------


async def test_no_model_path_searches_the_question_as_asked() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(3))
    context = await builder(store).build(OWNER, QUESTION)
    assert context.standalone_query == QUESTION
    assert context.rewritten is False
    assert context.wanted_types == ()


class CountingLongTerm(InMemoryLongTermStore):
    def __init__(self) -> None:
        super().__init__()
        self.loads = 0
        self.saves = 0

    async def load_summary(self, owner: MemoryOwner) -> Memory | None:
        self.loads += 1
        return await super().load_summary(owner)

    async def save_summary(
        self, owner: MemoryOwner, memory: Memory, *, expected_frontier: int | None
    ) -> Memory | None:
        self.saves += 1
        return await super().save_summary(owner, memory, expected_frontier=expected_frontier)


async def test_disabled_policy_calls_no_model_and_writes_nothing() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(10, words=80))
    memories = CountingLongTerm()
    model = ScriptedModel(summaries=[AssertionError("no call")], rewrites=[AssertionError("no")])
    recall = ScriptedRecall()
    context = await builder(
        store, memories=memories, model=model, recall=recall, policy=MemoryPolicy.disabled()
    ).build(OWNER, QUESTION)
    assert model.calls == []
    assert recall.calls == []
    assert memories.saves == 0 and memories.loads == 0
    assert len(context.messages) <= 4
    assert context.messages == tuple((await store.recent(OWNER, 4))[-len(context.messages) :])
    assert context.standalone_query == QUESTION
    assert context.summary is None and context.recalled == ()


async def test_disabled_window_is_the_last_four_messages() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(5, words=2))
    context = await builder(store, policy=MemoryPolicy.disabled()).build(OWNER, QUESTION)
    assert context.messages == tuple(await store.recent(OWNER, 4))


# -- trimming --------------------------------------------------------------------------


async def test_window_is_trimmed_to_the_token_budget_and_opens_on_a_user_turn() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(6, words=30))
    policy = MemoryPolicy(recent_max_tokens=300, recent_max_messages=12)
    context = await builder(store, policy=policy).build(OWNER, QUESTION)
    lc = context.langchain_messages()
    from harbor_pg.tokens import message_tokens

    assert 0 < len(context.messages) < 12
    assert message_tokens(lc) <= 300
    assert context.messages[0].role == "user"
    recent = await store.recent(OWNER, 12)
    assert context.messages == tuple(recent[-len(context.messages) :])


async def test_window_never_opens_on_an_orphaned_tool_result() -> None:
    store = InMemoryShortTermStore()
    chain = [
        user("look it up " + "x " * 200),
        assistant("", [{"name": "search", "args": {"q": "a"}, "id": "c1"}]),
        tool("result " * 50, "c1"),
        assistant("done " * 30),
    ]
    await fill(store, chain)
    policy = MemoryPolicy(recent_max_tokens=150)
    context = await builder(store, policy=policy).build(OWNER, QUESTION)
    assert context.messages
    assert context.messages[0].role != "tool"


async def test_a_budget_too_small_for_one_message_keeps_the_newest() -> None:
    store = InMemoryShortTermStore()
    await fill(store, [user("short"), assistant("a very long answer " * 100)])
    policy = MemoryPolicy(recent_max_tokens=5, summary_keep_messages=1, recent_max_messages=2)
    context = await builder(store, policy=policy).build(OWNER, QUESTION)
    assert [m.role for m in context.messages] == ["assistant"]


async def test_injected_token_counter_is_used_for_budgets() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(3, words=3))
    seen: list[str] = []

    def counter(text: str) -> int:
        seen.append(text)
        return 1000 if text else 0  # every message is far too large

    context = await builder(store, token_counter=counter).build(OWNER, QUESTION)
    assert seen  # the injected counter measured the window
    assert len(context.messages) == 1  # only the newest survives a budget nothing fits

    default = await builder(store).build(OWNER, QUESTION)
    assert len(default.messages) == 6


# -- rewrite ---------------------------------------------------------------------------


async def test_rewrite_yields_standalone_query_and_wanted_types_in_one_call() -> None:
    store = InMemoryShortTermStore()
    await fill(store, [user("Tell me about the ingest pipeline"), assistant("It loads docs.")])
    model = ScriptedModel(
        rewrites=[
            {
                "standalone_query": "Who owns the ingest pipeline?",
                "wanted_types": ["decisions", "fact", "nonsense", "summary", "episode", "pref"],
            }
        ]
    )
    context = await builder(store, model=model).build(OWNER, QUESTION)
    assert model.kinds() == ["rewrite"]
    assert context.standalone_query == "Who owns the ingest pipeline?"
    assert context.rewritten is True
    assert context.wanted_types == (MemoryType.DECISION, MemoryType.FACT, MemoryType.EPISODE)
    call = model.calls[0]
    assert "untrusted" in call.system
    assert "<question>and who owns it?</question>" in call.user
    assert "ingest pipeline" in call.user  # the window is shown


async def test_unchanged_rewrite_is_not_rewritten() -> None:
    model = ScriptedModel(
        rewrites=[{"standalone_query": "  AND who   owns it? ", "wanted_types": ["fact"]}]
    )
    context = await builder(model=model).build(OWNER, QUESTION)
    assert context.standalone_query == QUESTION
    assert context.rewritten is False
    assert context.wanted_types == (MemoryType.FACT,)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"standalone_query": "   ", "wanted_types": ["fact"]}, "empty"),
        ({"standalone_query": "word " * 400, "wanted_types": []}, "implausibly long"),
    ],
)
async def test_empty_or_implausibly_long_rewrites_are_rejected(
    answer: dict[str, Any], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(rewrites=[answer])
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await builder(model=model).build(OWNER, QUESTION)
    assert context.standalone_query == QUESTION
    assert context.rewritten is False
    assert context.wanted_types == ()
    assert context.degraded == ("rewrite",)
    assert any(reason in w for w in warnings_of(caplog))


async def test_model_without_structured_output_falls_back_to_plain_text() -> None:
    model = ScriptedModel(
        supports_structured=False, plain_rewrites=['"Who owns the ingest pipeline?"\nextra']
    )
    context = await builder(model=model).build(OWNER, QUESTION)
    assert model.kinds() == ["plain_rewrite"]
    assert "wanted_types" not in model.calls[0].system
    assert context.standalone_query == "Who owns the ingest pipeline?"
    assert context.rewritten is True
    assert context.wanted_types == ()


async def test_structured_output_unsupported_at_call_time_falls_back_to_plain_text() -> None:
    model = ScriptedModel(
        rewrites=[StructuredOutputUnsupportedError("no json mode")],
        plain_rewrites=["Who owns the ingest pipeline?"],
    )
    context = await builder(model=model).build(OWNER, QUESTION)
    assert model.kinds() == ["rewrite", "plain_rewrite"]
    assert context.standalone_query == "Who owns the ingest pipeline?"
    assert context.wanted_types == ()


async def test_query_rewrite_off_makes_no_rewrite_call() -> None:
    model = ScriptedModel()
    context = await builder(model=model, policy=MemoryPolicy(query_rewrite=False)).build(
        OWNER, QUESTION
    )
    assert model.calls == []
    assert context.standalone_query == QUESTION


async def test_condenser_limits_scale_with_the_question() -> None:
    condenser = QueryCondenser(
        ScriptedModel(rewrites=[{"standalone_query": "w " * 200, "wanted_types": []}])
    )
    long_question = "word " * 100  # 125 tokens: the limit grows to 375
    result = await condenser.condense(long_question)
    assert result.rewritten is True
    short = QueryCondenser(
        ScriptedModel(rewrites=[{"standalone_query": "w " * 200, "wanted_types": []}])
    )
    with pytest.raises(RewriteRejectedError):
        await short.condense("hi?")


# -- recall ----------------------------------------------------------------------------


def memory(content: str, **kwargs: Any) -> Memory:
    return Memory(content=content, **kwargs)


async def test_recall_gets_the_standalone_query_types_anchors_and_block_budget() -> None:
    model = ScriptedModel(
        rewrites=[{"standalone_query": "Who owns ingest?", "wanted_types": ["decision"]}]
    )
    recall = ScriptedRecall(memories=[memory("Bob owns ingest.", entity_ids=["bob"])])
    context = await builder(model=model, recall=recall).build(
        OWNER, QUESTION, anchor_entity_ids=["ingest", "ingest", "bob"]
    )
    assert isinstance(recall, ContextRecall)
    [call] = recall.calls
    assert call.query == "Who owns ingest?"
    assert call.wanted_types == (MemoryType.DECISION,)
    assert call.anchor_entity_ids == ("ingest", "bob")
    assert call.token_budget == int(0.15 * 2000)
    assert call.owner == OWNER
    assert [m.content for m in context.recalled] == ["Bob owns ingest."]
    assert context.anchor_entity_ids == ("ingest", "bob")
    assert recalled_entity_ids(context) == ("bob",)


async def test_recall_top_k_zero_disables_recall() -> None:
    recall = ScriptedRecall(memories=[memory("x")])
    context = await builder(recall=recall, policy=MemoryPolicy(recall_top_k=0)).build(
        OWNER, QUESTION
    )
    assert recall.calls == []
    assert context.recalled == ()


async def test_recalled_block_is_pruned_to_its_budget_and_top_k() -> None:
    many = [memory(f"memory {i} " + "word " * 40) for i in range(10)]  # ~52 tokens each
    recall = ScriptedRecall(memories=many)
    context = await builder(recall=recall).build(OWNER, QUESTION)
    assert context.recalled == tuple(many[:5])  # 5 * 52 <= 300 < 6 * 52
    few = await builder(recall=recall, policy=MemoryPolicy(recall_top_k=2)).build(OWNER, QUESTION)
    assert few.recalled == tuple(many[:2])


# -- budget split ----------------------------------------------------------------------


SPLIT = MemoryPolicy(budget=BudgetSplit())


def test_budget_split_needs_a_total() -> None:
    with pytest.raises(MemoryConfigurationError, match="prompt_tokens"):
        builder(policy=SPLIT)
    with pytest.raises(MemoryConfigurationError):
        builder(policy=SPLIT, prompt_tokens=0)


async def test_budget_split_shares_window_and_recall() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(6, words=30))
    recall = ScriptedRecall(memories=[memory("m " * 40) for _ in range(6)])
    b = builder(
        store, policy=SPLIT.with_changes(recent_max_tokens=5000), recall=recall, prompt_tokens=50
    )
    context = await b.build(OWNER, QUESTION, prompt_tokens=1000)  # a per-turn total
    assert context.budget is not None
    assert context.budget == (350, 250, 300, 100)
    from harbor_pg.tokens import message_tokens

    assert message_tokens(context.langchain_messages()) <= 350
    assert recall.calls[0].token_budget == 250
    assert sum(approximate_tokens(m.content) for m in context.recalled) <= 250


async def test_unused_share_is_not_handed_on() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(6, words=30))
    b = builder(store, policy=SPLIT.with_changes(recent_max_tokens=5000), prompt_tokens=1000)
    context = await b.build(OWNER, QUESTION)  # no recall: the episodic share stays unused
    from harbor_pg.tokens import message_tokens

    assert message_tokens(context.langchain_messages()) <= 350


async def test_budget_split_counts_the_summary_in_the_session_share() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(6, words=30))
    memories = InMemoryLongTermStore()
    b = builder(store, memories=memories, policy=SPLIT, prompt_tokens=1000)
    context = await b.build(OWNER, QUESTION)
    from harbor_pg.tokens import MESSAGE_OVERHEAD_TOKENS, message_tokens

    assert context.summary is not None and context.summary_refreshed
    summary_cost = approximate_tokens(context.summary) + MESSAGE_OVERHEAD_TOKENS
    assert summary_cost <= 350 // 4 + MESSAGE_OVERHEAD_TOKENS  # sized to the session share
    assert message_tokens(context.langchain_messages()) <= 350 - summary_cost

    tiny = await b.build(OWNER, QUESTION, prompt_tokens=100)  # session share: 35 tokens
    assert tiny.summary is None  # pruned: it alone does not fit
    assert len(tiny.messages) >= 1


# -- failures never fail the turn --------------------------------------------------------


class BrokenShortTerm(InMemoryShortTermStore):
    async def recent(self, owner: MemoryOwner, limit: int) -> list[ConversationMessage]:
        raise MemoryDatabaseError("database unavailable: connection refused")


class BrokenLongTerm(InMemoryLongTermStore):
    def __init__(self, *, load: bool = False, save: bool = False) -> None:
        super().__init__()
        self.fail_load = load
        self.fail_save = save

    async def load_summary(self, owner: MemoryOwner) -> Memory | None:
        if self.fail_load:
            raise MemoryDatabaseError("database unavailable: timeout")
        return await super().load_summary(owner)

    async def save_summary(
        self, owner: MemoryOwner, memory: Memory, *, expected_frontier: int | None
    ) -> Memory | None:
        if self.fail_save:
            raise MemoryDatabaseError("database error: disk full")
        return await super().save_summary(owner, memory, expected_frontier=expected_frontier)


async def test_history_failure_is_logged_and_the_turn_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ScriptedModel(rewrites=[{"standalone_query": "What is X?", "wanted_types": []}])
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await builder(BrokenShortTerm(), model=model).build(OWNER, QUESTION)
    assert context.messages == ()
    assert context.degraded == ("history",)
    assert context.standalone_query == "What is X?"
    assert any("loading the history failed" in w for w in warnings_of(caplog))
    assert all("connection refused" in w for w in warnings_of(caplog))


async def test_summary_load_failure_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(6, words=30))
    policy = MemoryPolicy(recent_max_tokens=400)
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await builder(store, memories=BrokenLongTerm(load=True), policy=policy).build(
            OWNER, QUESTION
        )
    assert context.summary is None
    assert context.degraded == ("summary",)
    assert context.messages  # the trimmed history
    assert any("loading the session summary failed" in w for w in warnings_of(caplog))


async def test_summary_save_failure_keeps_the_trimmed_history(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(6, words=30))
    policy = MemoryPolicy(recent_max_tokens=400)
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await builder(store, memories=BrokenLongTerm(save=True), policy=policy).build(
            OWNER, QUESTION
        )
    assert context.summary is None
    assert context.summary_refreshed is False
    assert context.degraded == ("summary",)
    recent = await store.recent(OWNER, 12)
    expected = await builder(store, policy=policy).build(OWNER, QUESTION)
    assert context.messages == expected.messages
    assert context.messages == tuple(recent[-len(context.messages) :])
    assert any("saving the summary failed" in w for w in warnings_of(caplog))


async def test_summary_model_failure_keeps_the_trimmed_history_and_question(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(6, words=30))
    model = ScriptedModel(
        summaries=[MemoryModelError("the model timed out after 30s")],
        rewrites=[MemoryModelError("HTTP 429")],
    )
    policy = MemoryPolicy(recent_max_tokens=400)
    memories = InMemoryLongTermStore()
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await builder(store, memories=memories, model=model, policy=policy).build(
            OWNER, QUESTION
        )
    assert model.kinds() == ["summary", "rewrite"]
    assert context.summary is None
    assert context.standalone_query == QUESTION
    assert context.rewritten is False
    assert context.degraded == ("summary", "rewrite")
    assert await memories.load_summary(OWNER) is None
    warnings = warnings_of(caplog)
    assert any("summary call failed" in w and "timed out" in w for w in warnings)
    assert any("query rewrite failed" in w and "429" in w for w in warnings)
    plain = await builder(store, policy=policy).build(OWNER, QUESTION)
    assert context.messages == plain.messages


async def test_recall_failure_is_logged_and_recalls_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recall = ScriptedRecall(error=RuntimeError("index exploded"))
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await builder(recall=recall).build(OWNER, QUESTION)
    assert context.recalled == ()
    assert context.degraded == ("recall",)
    assert any("recall failed" in w and "index exploded" in w for w in warnings_of(caplog))


async def test_unexpected_model_exception_is_contained(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel(rewrites=[ValueError("boom")])
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await builder(model=model).build(OWNER, QUESTION)
    assert context.standalone_query == QUESTION
    assert any("ValueError: boom" in w for w in warnings_of(caplog))
