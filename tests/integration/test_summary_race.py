"""Rolling (per-turn) and background summaries share one fold per due point.

The session's summary lease, kept by the database, decides which of them folds:
the other calls no model, so no summary call's result is ever thrown away. The
extractive fold runs off the application's event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from harbor_pg import ConversationMessage, MemoryContextBuilder, MemoryOwner, MemoryPolicy
from harbor_pg.context.summarizer import SessionSummarizer
from harbor_pg.db.connection import Database
from harbor_pg.llm.extractive import ExtractiveSummarizer
from harbor_pg.tiers.in_process import InMemoryLongTermStore, InMemoryShortTermStore
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")
POLICY = MemoryPolicy(
    recent_max_messages=12,
    recent_max_tokens=300,
    summary_keep_messages=4,
    summarise_after_turns=4,
    summary_cooldown_seconds=0,
    query_rewrite=False,
    recall_top_k=0,
)


class SlowSummaryModel:
    """Writes numbered summaries, slowly enough for two folds to overlap."""

    supports_structured = False

    def __init__(self) -> None:
        self.calls = 0

    async def generate_text(self, system: str, user: str) -> str:
        self.calls += 1
        n = self.calls
        await asyncio.sleep(0.3)
        return f"summary number {n}"

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        raise NotImplementedError


async def _stores(database: Database) -> tuple[PostgresShortTermStore, PostgresLongTermStore]:
    messages, memories = PostgresShortTermStore(database), PostgresLongTermStore(database)
    for i in range(12):
        role = "user" if i % 2 == 0 else "assistant"
        await messages.append(OWNER, ConversationMessage(role=role, content=f"turn {i} " * 20))
    return messages, memories


@pytest.mark.parametrize("first", ["builder", "background"])
async def test_one_fold_per_due_point_and_no_discarded_call(database: Database, first: str) -> None:
    messages, memories = await _stores(database)
    model = SlowSummaryModel()
    builder = MemoryContextBuilder(policy=POLICY, messages=messages, memories=memories, model=model)
    background = SessionSummarizer(policy=POLICY, messages=messages, memories=memories, model=model)
    if first == "builder":
        context, ran = await asyncio.gather(
            builder.build(OWNER, "what now?"), background.maybe_summarise(OWNER)
        )
    else:
        job = asyncio.ensure_future(background.maybe_summarise(OWNER))
        await asyncio.sleep(0.1)  # the background fold is inside its model call now
        context = await builder.build(OWNER, "what now?")
        ran = await job
    assert model.calls == 1  # one fold, and its result is the stored summary
    summary = await memories.load_summary(OWNER)
    assert summary is not None and summary.content == "summary number 1"
    assert context.summary_refreshed != ran  # exactly one of them folded
    assert "summary" not in context.degraded
    # the due point is used up: neither path folds again until new turns arrive
    assert not await background.maybe_summarise(OWNER)
    again = await builder.build(OWNER, "and then?")
    assert not again.summary_refreshed and model.calls == 1


class CpuHeavySummarizer(ExtractiveSummarizer):
    """An extractive summarizer whose work takes 0.4 s of blocking CPU time."""

    def summarize(self, messages: Any, **kwargs: Any) -> str:
        time.sleep(0.4)
        return super().summarize(messages, **kwargs)


async def test_the_background_fold_leaves_the_event_loop_free() -> None:
    messages, memories = InMemoryShortTermStore(), InMemoryLongTermStore()
    for i in range(12):
        await messages.append(OWNER, ConversationMessage(role="user", content=f"fact {i} " * 20))
    background = SessionSummarizer(
        policy=POLICY, messages=messages, memories=memories, summarizer=CpuHeavySummarizer()
    )
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while len(gaps) < 80:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.05)  # the ticker runs before the fold starts
    ran = await background.maybe_summarise(OWNER)
    await ticking
    assert ran and await memories.load_summary(OWNER) is not None
    assert max(gaps) < 0.2, max(gaps)  # the loop kept ticking while the fold ran
