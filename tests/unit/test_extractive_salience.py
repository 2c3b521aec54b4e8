"""The no-model summary keeps what the next turn needs, on conversations with known answers.

Decisions, preferences, who owns or does what, and open questions must survive
the budget; pasted reports and chit-chat must give way to them.
"""

from __future__ import annotations

from harbor_pg.demo import LATER, SCRIPT, SUMMARY_TOKENS
from harbor_pg.llm.extractive import ExtractiveSummarizer

DEMO = [{"role": role, "content": text} for role, text in SCRIPT + LATER]

PLANNING = [
    {"role": "user", "content": "Morning! How was your weekend? Mine was quiet, lots of rain."},
    {"role": "assistant", "content": "Good morning. Happy to help with whatever you need today."},
    {
        "role": "user",
        "content": "Here is the load test output: p50 41 ms, p95 188 ms, p99 612 ms, "
        "errors 0.4%, 12,400 requests, 3 nodes, 2,048 MB each, run 2024-05-02 14:10-14:40.",
    },
    {
        "role": "assistant",
        "content": "Those latencies look reasonable for three nodes, though the tail at p99 "
        "deserves a closer look once the caches are warm and the connection pool is tuned.",
    },
    {"role": "user", "content": "We decided to ship the billing export on the 14th."},
    {"role": "user", "content": "I prefer the weekly digest as a plain-text email."},
    {"role": "user", "content": "Marta owns the invoice templates from now on."},
    {"role": "user", "content": "Still to be decided: which currency we report refunds in."},
    {
        "role": "assistant",
        "content": "Noted. Many teams find it helpful to keep templates versioned alongside "
        "the code, with previews generated on each change, so reviews stay quick and "
        "regressions are caught before they reach customers.",
    },
    {"role": "user", "content": "Cool, thanks, that's all for now."},
]


def test_demo_opening_keeps_owner_decision_and_preference_not_the_run_report() -> None:
    # what the demo's builder folds on its first refresh: all but the last 8 messages
    summary = ExtractiveSummarizer(max_tokens=SUMMARY_TOKENS).summarize(DEMO[:-8])
    assert "look after the ingest pipeline" in summary  # who owns what
    assert "decided to move the embeddings into Postgres with pgvector" in summary
    assert "Please keep answers short" in summary  # the stated preference
    assert "02:47" not in summary and "1,812" not in summary  # the pasted job log


def test_demo_folded_in_pages_keeps_decisions_and_actions() -> None:
    summarizer = ExtractiveSummarizer(max_tokens=SUMMARY_TOKENS)
    first = summarizer.summarize(DEMO[:7])
    summary = summarizer.summarize(DEMO[7:13], prior_summary=first)
    assert "pgvector" in summary
    assert "Decisions: we keep the nightly schedule" in summary
    assert "Priya reviews it" in summary


def test_a_planning_chat_keeps_its_four_answers() -> None:
    # room for the four answers and a little more, not for everything
    summary = ExtractiveSummarizer(max_tokens=64).summarize(PLANNING)
    for known in (
        "We decided to ship the billing export on the 14th.",
        "I prefer the weekly digest as a plain-text email.",
        "Marta owns the invoice templates from now on.",
        "Still to be decided: which currency we report refunds in.",
    ):
        assert known in summary, summary
    assert "p99" not in summary and "weekend" not in summary
