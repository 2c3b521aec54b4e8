"""The rolling summary inside the builder, and background summaries, on in-process stores."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from harbor_pg.context.builder import MemoryContextBuilder
from harbor_pg.context.summarizer import (
    FRONTIER_KEY,
    RollingSummary,
    SessionSummarizer,
    frontier_of,
)
from harbor_pg.errors import MemoryConfigurationError, MemoryScopeError, MemoryValidationError
from harbor_pg.llm.base import MemoryModelError
from harbor_pg.llm.extractive import ExtractiveSummarizer
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage, Memory, MemoryType
from harbor_pg.tiers.base import SummaryLeaseStore, SummaryStore, summary_memory_id
from harbor_pg.tiers.in_process import InMemoryLongTermStore, InMemoryShortTermStore
from tests.unit.test_builder_support import ScriptedModel, assistant, exchange, tool, user

OWNER = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
QUESTION = "what next?"
WARN = "harbor_pg.context"
#: a 400-token window refreshed above 280 tokens; exchange() messages are ~70 tokens with
#: words=20 and ~100 with words=30, so twelve of them always trigger a refresh
POLICY = MemoryPolicy(recent_max_tokens=400, recent_max_messages=12, summary_keep_messages=4)


async def fill(
    store: InMemoryShortTermStore, messages: list[ConversationMessage], owner: MemoryOwner = OWNER
) -> list[ConversationMessage]:
    return [await store.append(owner, m) for m in messages]


def make(
    store: InMemoryShortTermStore,
    memories: InMemoryLongTermStore,
    **kwargs: Any,
) -> MemoryContextBuilder:
    kwargs.setdefault("policy", POLICY)
    return MemoryContextBuilder(messages=store, memories=memories, **kwargs)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_builtin_stores_implement_the_summary_protocols() -> None:
    assert isinstance(InMemoryLongTermStore(), SummaryStore)
    assert isinstance(InMemoryShortTermStore(), SummaryLeaseStore)


async def test_refresh_saves_the_summary_row_with_frontier_and_folded_ids() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    stored = await fill(store, exchange(6, words=20))  # 12 messages, ~70 tokens each
    model = ScriptedModel(summaries=["The user asked about six projects."])
    context = await make(store, memories, model=model).build(OWNER, QUESTION)

    assert context.summary_refreshed is True
    assert context.summary == "The user asked about six projects."
    row = await memories.load_summary(OWNER)
    assert row is not None
    # derived from the whole owner key (project '' at SESSION scope): it names no session
    assert row.id == summary_memory_id(OWNER) == "summary:4d020140d199ca4a7ef430368aed373c"
    assert row.scope is MemoryScope.SESSION
    assert row.memory_type is MemoryType.SUMMARY
    assert row.source == "summary"
    assert row.source_session_id == "s1"
    assert row.principal_id == "alice" and row.user_id == "alice" and row.project_id == ""
    # keep 4 -> boundary at index 8 (a user turn): messages 0..7 folded
    folded = [str(m.id) for m in stored[:8]]
    assert row.source_message_ids == folded
    assert row.metadata[FRONTIER_KEY] == stored[7].id
    assert frontier_of(row) == stored[7].id
    # the window replays only what the summary does not cover
    assert [m.id for m in context.messages] == [m.id for m in stored[8:]]
    # the summary prompt fenced the folded messages as untrusted data
    [call] = [c for c in model.calls if c.kind == "summary"]
    assert "untrusted" in call.system
    assert call.user.count("<message ") == 8


async def test_unchanged_history_makes_no_second_summary_call() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(6, words=30))
    model = ScriptedModel()
    b = make(store, memories, model=model, policy=POLICY.with_changes(query_rewrite=False))
    first = await b.build(OWNER, QUESTION)
    second = await b.build(OWNER, QUESTION)
    assert model.count("summary") == 1
    assert second.summary == first.summary
    assert second.summary_refreshed is False
    assert second.messages == first.messages


async def test_later_refresh_folds_only_new_messages_into_the_prior_summary() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    first_batch = await fill(store, exchange(6, words=20))
    model = ScriptedModel(summaries=["first summary", "second summary"])
    b = make(store, memories, model=model, policy=POLICY.with_changes(query_rewrite=False))
    await b.build(OWNER, QUESTION)
    created = (await memories.load_summary(OWNER)).created_at  # type: ignore[union-attr]
    second_batch = await fill(store, exchange(3, words=20))
    context = await b.build(OWNER, QUESTION)

    assert model.count("summary") == 2
    second_call = [c for c in model.calls if c.kind == "summary"][1]
    assert "first summary" in second_call.user  # the prior summary is folded in
    row = await memories.load_summary(OWNER)
    assert row is not None and row.content == "second summary"
    assert row.id == summary_memory_id(OWNER) and row.created_at == created
    new_ids = [m.id for m in [*first_batch, *second_batch] if m.id > first_batch[7].id]
    # uncovered = 4 + 6 messages; keep 4 -> the 6 oldest of them are folded
    assert row.source_message_ids == [str(i) for i in new_ids[:6]]
    assert frontier_of(row) == new_ids[5]
    assert [m.id for m in context.messages] == new_ids[6:]
    # the session never holds a second summary row
    assert len([m for m in memories._rows.values() if m.memory_type is MemoryType.SUMMARY]) == 1


async def test_no_model_path_writes_an_extractive_summary() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(6, words=30))
    context = await make(store, memories).build(OWNER, QUESTION)
    assert context.summary is not None
    assert context.summary.startswith(("User:", "Assistant:"))
    assert context.standalone_query == QUESTION


async def test_below_the_trigger_nothing_is_summarised() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(6, words=2))  # ~15 tokens each: far below 280
    model = ScriptedModel()
    context = await make(store, memories, model=model).build(OWNER, QUESTION)
    assert model.count("summary") == 0
    assert context.summary is None
    assert len(context.messages) == 12


async def test_no_repository_means_no_summary() -> None:
    store = InMemoryShortTermStore()
    await fill(store, exchange(6, words=30))
    model = ScriptedModel()
    b = MemoryContextBuilder(messages=store, model=model, policy=POLICY)
    context = await b.build(OWNER, QUESTION)
    assert model.count("summary") == 0
    assert context.summary is None


async def test_boundary_walks_back_to_the_nearest_user_turn() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    long = "detail " * 60
    messages = [
        user("first " + long),
        assistant("first answer " + long),
        user("second question " + long),
        assistant("", [{"name": "search", "args": {"q": "x"}, "id": "c1"}]),
        tool("found " + long, "c1"),
        assistant("", [{"name": "search", "args": {"q": "y"}, "id": "c2"}]),
        tool("found more " + long, "c2"),
        assistant("second answer " + long),
    ]
    stored = await fill(store, messages)
    model = ScriptedModel()
    await make(store, memories, model=model, policy=POLICY.with_changes(query_rewrite=False)).build(
        OWNER, QUESTION
    )
    row = await memories.load_summary(OWNER)
    assert row is not None
    # keep 4 would cut at index 4 (a tool result): walked back to index 2, the user turn
    assert row.source_message_ids == [str(stored[0].id), str(stored[1].id)]


async def test_one_long_user_turn_writes_no_summary() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    chain: list[ConversationMessage] = [user("research this " + "x " * 100)]
    for i in range(5):
        chain.append(assistant("", [{"name": "search", "args": {"q": str(i)}, "id": f"c{i}"}]))
        chain.append(tool("result " * 80, f"c{i}"))
    await fill(store, chain)
    model = ScriptedModel()
    context = await make(
        store, memories, model=model, policy=POLICY.with_changes(query_rewrite=False)
    ).build(OWNER, QUESTION)
    assert model.count("summary") == 0
    assert await memories.load_summary(OWNER) is None
    assert context.summary is None
    assert context.messages  # rides on token trimming alone
    assert context.messages[0].role != "tool"


async def test_catch_up_reads_at_most_four_pages_and_resumes_from_the_frontier() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    stored = await fill(store, exchange(60, words=30))  # 120 messages
    model = ScriptedModel()
    b = make(
        store, memories, model=model, page_size=10, policy=POLICY.with_changes(query_rewrite=False)
    )
    first = await b.build(OWNER, QUESTION)
    assert model.count("summary") == 4
    row = await memories.load_summary(OWNER)
    assert row is not None
    assert row.source_message_ids == [str(m.id) for m in stored[:40]]
    assert frontier_of(row) == stored[39].id
    # the current turn still gets its recent window
    recent = await store.recent(OWNER, 12)
    assert first.messages and first.messages[-1].id == recent[-1].id

    await b.build(OWNER, QUESTION)
    assert model.count("summary") == 8
    row = await memories.load_summary(OWNER)
    assert row is not None
    assert row.source_message_ids == [str(m.id) for m in stored[40:80]]

    await b.build(OWNER, QUESTION)  # the rest up to the kept tail: 36 messages, 4 pages
    row = await memories.load_summary(OWNER)
    assert row is not None
    assert frontier_of(row) == stored[115].id
    calls = model.count("summary")
    await b.build(OWNER, QUESTION)
    assert model.count("summary") == calls  # caught up: nothing more to fold


class StuckHistory(InMemoryShortTermStore):
    """A store whose ``after`` ignores its cursor: it would loop forever."""

    async def after(
        self, owner: MemoryOwner, after_id: int, limit: int, before_id: int | None = None
    ) -> list[ConversationMessage]:
        return await super().after(owner, 0, limit, before_id)


async def test_a_non_advancing_cursor_stops_catch_up(caplog: pytest.LogCaptureFixture) -> None:
    store, memories = StuckHistory(), InMemoryLongTermStore()
    stored = await fill(store, exchange(60, words=30))
    model = ScriptedModel()
    b = make(
        store, memories, model=model, page_size=10, policy=POLICY.with_changes(query_rewrite=False)
    )
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await b.build(OWNER, QUESTION)
    assert model.count("summary") == 1  # the second page repeated the first: stop
    assert any("did not advance" in w for w in warnings_of(caplog))
    row = await memories.load_summary(OWNER)
    assert row is not None and frontier_of(row) == stored[9].id
    assert context.degraded == ("summary",)
    assert context.messages


async def test_summary_failure_mid_catch_up_saves_what_was_folded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    stored = await fill(store, exchange(60, words=30))
    model = ScriptedModel(summaries=["one", "two", MemoryModelError("HTTP 500")])
    b = make(
        store, memories, model=model, page_size=10, policy=POLICY.with_changes(query_rewrite=False)
    )
    with caplog.at_level(logging.WARNING, logger=WARN):
        context = await b.build(OWNER, QUESTION)
    row = await memories.load_summary(OWNER)
    assert row is not None and row.content == "two"
    assert frontier_of(row) == stored[19].id
    assert context.summary == "two"
    assert context.degraded == ("summary",)
    assert any("HTTP 500" in w for w in warnings_of(caplog))


async def test_ownership_survives_credential_and_project_changes() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    first_owner = MemoryOwner(
        tenant_id="t1", project_id="p1", principal_id="token-a", user_id="alice", session_id="s1"
    )
    later_owner = MemoryOwner(
        tenant_id="t1", project_id="p2", principal_id="token-b", user_id="alice", session_id="s1"
    )
    await fill(store, exchange(6, words=30), first_owner)
    model = ScriptedModel(summaries=["one", "two"])
    policy = POLICY.with_changes(query_rewrite=False)
    await make(store, memories, model=model, policy=policy).build(first_owner, QUESTION)
    original = await memories.load_summary(first_owner)
    await fill(store, exchange(3, words=30), later_owner)
    context = await make(store, memories, model=model, policy=policy).build(later_owner, QUESTION)
    refreshed = await memories.load_summary(later_owner)
    assert original is not None and refreshed is not None
    assert context.summary == "two"
    assert refreshed.id == original.id
    assert refreshed.principal_id == "token-a"
    assert refreshed.project_id == ""
    assert refreshed.created_at == original.created_at
    assert refreshed.source_session_id == "s1"


async def test_user_id_omitted_is_the_principal_for_the_summary() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(6, words=30))
    await make(store, memories).build(OWNER, QUESTION)
    explicit = MemoryOwner(tenant_id="t1", principal_id="alice", user_id="alice", session_id="s1")
    assert await memories.load_summary(explicit) is not None


async def test_summaries_are_never_returned_by_search() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(6, words=30))
    model = ScriptedModel(summaries=["Widget summary text"])
    await make(store, memories, model=model).build(OWNER, QUESTION)
    assert await memories.search(OWNER, "Widget summary") == []


async def test_explicit_summarizer_wins_over_the_model() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(6, words=30))
    model = ScriptedModel()
    context = await make(
        store, memories, model=model, summarizer=ExtractiveSummarizer(max_chars=300)
    ).build(OWNER, QUESTION)
    assert model.count("summary") == 0
    assert model.count("rewrite") == 1
    assert context.summary is not None and len(context.summary) <= 300


# -- the summary store contract (in-process) ---------------------------------------------


def summary(content: str, frontier: int, owner: MemoryOwner = OWNER) -> Memory:
    return Memory(
        id=summary_memory_id(owner),
        scope=MemoryScope.SESSION,
        memory_type=MemoryType.SUMMARY,
        content=content,
        source="summary",
        metadata={FRONTIER_KEY: frontier},
    )


async def test_save_summary_is_a_compare_and_set_on_the_frontier() -> None:
    memories = InMemoryLongTermStore()
    first = await memories.save_summary(OWNER, summary("a", 5), expected_frontier=None)
    assert first is not None
    assert await memories.save_summary(OWNER, summary("b", 9), expected_frontier=None) is None
    assert await memories.save_summary(OWNER, summary("b", 9), expected_frontier=7) is None
    second = await memories.save_summary(OWNER, summary("b", 9), expected_frontier=5)
    assert second is not None and second.content == "b" and frontier_of(second) == 9


async def test_same_session_id_of_another_user_gets_an_id_of_its_own() -> None:
    memories = InMemoryLongTermStore()
    bob = MemoryOwner(tenant_id="t1", principal_id="bob", session_id="s1")
    mine = await memories.save_summary(OWNER, summary("alice's", 5), expected_frontier=None)
    # bob asks for alice's id: the store gives bob's summary bob's id, as the database does
    theirs = await memories.save_summary(bob, summary("bob's", 3), expected_frontier=None)
    assert mine is not None and theirs is not None
    assert mine.id == summary_memory_id(OWNER)
    assert theirs.id == summary_memory_id(bob) != mine.id
    assert "s1" not in mine.id and "s1" not in theirs.id
    assert (await memories.load_summary(bob)).content == "bob's"  # type: ignore[union-attr]
    assert (await memories.load_summary(OWNER)).content == "alice's"  # type: ignore[union-attr]
    again = await memories.save_summary(bob, summary("bob's 2", 8, bob), expected_frontier=3)
    assert again is not None and again.id == theirs.id


async def test_a_summary_id_cannot_be_taken_by_another_memory() -> None:
    memories = InMemoryLongTermStore()
    bob = MemoryOwner(tenant_id="t1", principal_id="bob", session_id="s1")
    with pytest.raises(MemoryValidationError, match="summary"):
        await memories.save(bob, Memory(id=summary_memory_id(OWNER), content="squatter"))
    assert await memories.save_summary(OWNER, summary("a", 5), expected_frontier=None)


# -- background summaries (in-process) ---------------------------------------------------


def background(
    store: InMemoryShortTermStore, memories: InMemoryLongTermStore, **kwargs: Any
) -> SessionSummarizer:
    policy = kwargs.pop("policy", MemoryPolicy(summarise_after_turns=20))
    return SessionSummarizer(policy=policy, messages=store, memories=memories, **kwargs)


async def test_background_summary_runs_after_enough_turns_then_cools_down() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    worker = background(store, memories)
    await fill(store, exchange(9, words=10))  # 18 turns
    assert await worker.maybe_summarise(OWNER) is False
    await fill(store, exchange(1, words=10))  # 20 turns
    assert await worker.maybe_summarise(OWNER) is True
    row = await memories.load_summary(OWNER)
    assert row is not None and row.source == "summary"
    assert await store.count(OWNER) == 20  # raw turns are kept
    await fill(store, exchange(10, words=10))
    assert await worker.maybe_summarise(OWNER) is False  # cooldown (300 s)


async def test_background_summary_without_cooldown_needs_new_turns() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    policy = MemoryPolicy(summarise_after_turns=4, summary_cooldown_seconds=0)
    worker = background(store, memories, policy=policy)
    await fill(store, exchange(5, words=10))
    assert await worker.maybe_summarise(OWNER) is True
    assert await worker.maybe_summarise(OWNER) is False  # no new turns
    await fill(store, exchange(2, words=10))
    assert await worker.maybe_summarise(OWNER) is True


async def test_concurrent_background_workers_run_once() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(12, words=10))
    model = ScriptedModel(delay=0.01)
    workers = [background(store, memories, model=model) for _ in range(5)]
    results = await asyncio.gather(*(w.maybe_summarise(OWNER) for w in workers))
    assert sorted(results) == [False, False, False, False, True]
    assert model.count("summary") == 1


async def test_schedule_runs_in_the_background_and_drains() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(10, words=10))
    worker = background(store, memories)
    task = worker.schedule(OWNER)
    assert worker.pending == 1
    await worker.drain()
    assert task.result() is True
    assert worker.pending == 0


async def test_builder_schedules_the_background_summary() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(10, words=2))
    worker = background(store, memories)
    b = MemoryContextBuilder(messages=store, memories=memories, background=worker)
    await b.build(OWNER, QUESTION)
    await worker.drain()
    assert await memories.load_summary(OWNER) is not None
    disabled = MemoryContextBuilder(
        messages=store, memories=memories, background=worker, policy=MemoryPolicy.disabled()
    )
    await disabled.build(OWNER, QUESTION)
    assert worker.pending == 0


async def test_background_failure_is_logged_and_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(12, words=10))
    model = ScriptedModel(summaries=[MemoryModelError("HTTP 503")])
    worker = background(store, memories, model=model, lease_seconds=60)
    with caplog.at_level(logging.WARNING, logger=WARN):
        assert await worker.maybe_summarise(OWNER) is False
    assert any("HTTP 503" in w for w in warnings_of(caplog))
    assert await worker.maybe_summarise(OWNER) is False  # the failed run's lease is still live
    assert model.count("summary") == 1


async def test_background_needs_a_session_owner_and_an_enabled_policy() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    with pytest.raises(MemoryScopeError):
        await background(store, memories).maybe_summarise(
            MemoryOwner(tenant_id="t1", principal_id="alice")
        )
    await fill(store, exchange(12, words=10))
    off = background(store, memories, policy=MemoryPolicy.disabled())
    assert await off.maybe_summarise(OWNER) is False
    with pytest.raises(MemoryConfigurationError):
        background(store, memories, lease_seconds=0)


def test_rolling_summary_validates_its_sizes() -> None:
    with pytest.raises(MemoryConfigurationError):
        RollingSummary(
            policy=POLICY,
            messages=InMemoryShortTermStore(),
            memories=InMemoryLongTermStore(),
            page_size=0,
        )


# -- the credential filter (every long-term write passes it, the summary too) ------------


async def test_a_summary_leaves_out_the_sentences_that_hold_a_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(6, words=20))
    model = ScriptedModel(
        summaries=[
            "Dana chose the blue plan. Her AWS key is AKIAIOSFODNN7EXAMPLE. She ships Friday."
        ]
    )
    with caplog.at_level(logging.WARNING, logger="harbor_pg.context"):
        context = await make(store, memories, model=model).build(OWNER, QUESTION)
    row = await memories.load_summary(OWNER)
    assert row is not None and row.content == "Dana chose the blue plan. She ships Friday."
    assert context.summary == row.content
    assert "aws_access_key" in caplog.text and "AKIA" not in caplog.text


async def test_a_summary_made_only_of_secrets_is_withheld() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    await fill(store, exchange(6, words=20))
    model = ScriptedModel(summaries=["Dana's password is Tr0ub4dor&3."])
    context = await make(store, memories, model=model).build(OWNER, QUESTION)
    row = await memories.load_summary(OWNER)
    assert row is not None and "Tr0ub4dor" not in row.content and row.content.strip()
    assert context.summary == row.content and context.summary_refreshed


async def test_the_extractive_summary_does_not_keep_a_pasted_secret() -> None:
    store, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    token = "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    await fill(
        store,
        [
            user(f"We decided that the deploy uses the token {token} from now on."),
            assistant("Noted."),
            *exchange(6, words=20),
        ],
    )
    # the no-model summary keeps decisions verbatim: this one too, but for the token
    await make(store, memories).build(OWNER, QUESTION)
    row = await memories.load_summary(OWNER)
    assert row is not None and row.content.strip()
    assert token not in row.content and "ghp_" not in row.content
