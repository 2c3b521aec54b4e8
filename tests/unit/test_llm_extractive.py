"""The extractive (no-model) summary."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.llm import ExtractiveSummarizer
from harbor_pg.records import ConversationMessage

CONVERSATION = [
    ConversationMessage(role="system", content="You are a helpful assistant."),
    ConversationMessage(role="user", content="Hi there!"),
    ConversationMessage(role="assistant", content="Hello! How can I help?"),
    ConversationMessage(
        role="user",
        content="Our ingest pipeline runs on Kafka. Alice Moreno owns it since March 2024.",
    ),
    ConversationMessage(role="assistant", content="Got it. Thanks!"),
    ConversationMessage(
        role="user", content="The nightly batch failed twice this week with a 502 from S3."
    ),
    ConversationMessage(role="tool", content="TOOL OUTPUT SHOULD NOT APPEAR", tool_call_id="t1"),
    ConversationMessage(
        role="assistant",
        content="I suggest raising the S3 retry budget to 5 attempts. Anything else?",
    ),
    ConversationMessage(role="user", content="Ok."),
]


def test_role_lines_in_order_without_filler() -> None:
    summary = ExtractiveSummarizer(max_chars=2000).summarize(CONVERSATION)
    lines = summary.splitlines()
    assert lines == [
        "User: Our ingest pipeline runs on Kafka. Alice Moreno owns it since March 2024.",
        "User: The nightly batch failed twice this week with a 502 from S3.",
        "Assistant: I suggest raising the S3 retry budget to 5 attempts.",
    ]
    assert "TOOL OUTPUT" not in summary
    assert "helpful assistant" not in summary


def test_budget_is_respected_and_newest_wins_ties() -> None:
    summarizer = ExtractiveSummarizer(max_chars=120)
    summary = summarizer.summarize(CONVERSATION)
    assert 0 < len(summary) <= 120
    assert summary.startswith(("User: ", "Assistant: "))


@pytest.mark.parametrize("budget", [1, 10, 40, 80, 200, 400])
def test_never_exceeds_budget(budget: int) -> None:
    summary = ExtractiveSummarizer().summarize(CONVERSATION, max_chars=budget)
    assert len(summary) <= budget


def test_token_budget_uses_the_counter() -> None:
    summarizer = ExtractiveSummarizer(max_tokens=20, token_counter=lambda t: len(t.split()))
    summary = summarizer.summarize(CONVERSATION)
    assert 0 < len(summary.split()) <= 20


def test_recency_bias() -> None:
    old = {"role": "user", "content": "The staging database is Postgres 15 on host db-7."}
    new = {"role": "user", "content": "The production database is Postgres 17 on host db-9."}
    filler = [{"role": "assistant", "content": "Noted."}] * 5
    one_line = len("User: ") + len(new["content"])
    summary = ExtractiveSummarizer(max_chars=one_line).summarize([old, *filler, new])
    assert summary == f"User: {new['content']}"
    without_bias = ExtractiveSummarizer(max_chars=one_line, recency_weight=0.0)
    assert without_bias.summarize([old, *filler, new]) != ""


def test_deterministic() -> None:
    summarizer = ExtractiveSummarizer(max_chars=150)
    assert len({summarizer.summarize(CONVERSATION) for _ in range(5)}) == 1


def test_prior_summary_is_folded_in() -> None:
    prior = "User: My name is Priya and I work in the Lisbon office.\nAssistant: Welcome, Priya."
    summary = ExtractiveSummarizer(max_chars=2000).summarize(
        [{"role": "user", "content": "Please book the Berlin offsite for 12 people."}],
        prior_summary=prior,
    )
    lines = summary.splitlines()
    assert lines[0] == "User: My name is Priya and I work in the Lisbon office."
    assert lines[-1] == "User: Please book the Berlin offsite for 12 people."


def test_near_duplicates_are_dropped() -> None:
    messages = [
        {"role": "user", "content": "Deploys happen every Tuesday at 10am from the main branch."},
        {"role": "user", "content": "Deploys happen every Tuesday at 10am from the main branch!"},
    ]
    summary = ExtractiveSummarizer(max_chars=2000).summarize(messages)
    assert len(summary.splitlines()) == 1


def test_accepts_langchain_messages_and_content_blocks() -> None:
    messages = [
        SystemMessage(content="system prompt"),
        HumanMessage(content=[{"type": "text", "text": "Invoices are due on the 5th."}]),
        ToolMessage(content="raw tool output", tool_call_id="x"),
        AIMessage(content="Reminder set for the 5th of every month."),
    ]
    summary = ExtractiveSummarizer(max_chars=2000).summarize(messages)
    assert summary.splitlines() == [
        "User: Invoices are due on the 5th.",
        "Assistant: Reminder set for the 5th of every month.",
    ]


def test_long_sentences_are_cut() -> None:
    long_text = "Kubernetes " * 100
    summary = ExtractiveSummarizer(max_sentence_chars=60).summarize(
        [{"role": "user", "content": long_text}]
    )
    assert summary.endswith("…")
    assert len(summary) <= len("User: ") + 60


def test_empty_and_filler_only() -> None:
    summarizer = ExtractiveSummarizer()
    assert summarizer.summarize([]) == ""
    assert summarizer.summarize([{"role": "user", "content": "ok thanks!"}]) == ""


async def test_async_twin() -> None:
    summarizer = ExtractiveSummarizer(max_chars=300)
    assert await summarizer.asummarize(CONVERSATION) == summarizer.summarize(CONVERSATION)


def test_configuration_errors() -> None:
    with pytest.raises(MemoryConfigurationError):
        ExtractiveSummarizer(max_chars=10, max_tokens=10)
    with pytest.raises(MemoryConfigurationError):
        ExtractiveSummarizer(max_chars=0)
    with pytest.raises(MemoryConfigurationError):
        ExtractiveSummarizer(recency_weight=-1)
