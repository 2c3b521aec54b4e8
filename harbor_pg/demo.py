"""``harbor-pg demo``: a scripted conversation through the three tiers.

It writes a conversation, scratch state and memories, recalls them, builds the
context of a follow-up turn (verbatim window, rolling summary, rewritten query,
recalled memories), extracts a fact and supersedes it. Everything runs locally:
the summary is the extractive no-model one, and the query rewrite and the fact
extraction are done by scripted stand-ins for a language model, labelled as
such in the output.
"""

from __future__ import annotations

import argparse
import html
import re
import textwrap
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from harbor_pg.jobs import EXTRACT_SESSION_TASK, EXTRACT_TASK
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.base import SummaryStore

__all__ = ["run_demo"]


class _ScriptedExtractionModel:
    """Stands in for a language model in the demo (no model is configured by default).

    It "extracts" where Dana lives from the last user turn and, when a stored
    memory about where she lives is shown to it, names that memory's bracketed
    reference in ``replaces``, as a real model is asked to.
    """

    async def generate_text(self, system: str, user: str) -> str:
        raise NotImplementedError

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        city = re.findall(r"I (?:live|moved) (?:in|to) ([A-Z][a-z]+)", user)
        if not city:
            return schema.model_validate({"facts": []})
        old = re.search(r"\[([0-9a-f]{12})\] Dana lives in", user)
        fact = {
            "content": f"Dana lives in {city[-1]}",
            "type": "fact",
            "scope": "user",
            "importance": 0.8,
            "entities": ["Dana", city[-1]],
            "sensitivity": "low",
            "replaces": old.group(1) if old else None,
        }
        return schema.model_validate({"facts": [fact]})


class _ScriptedRewriteModel:
    """Stands in for a language model for the query rewrite (nothing leaves the machine).

    It does what the rewrite prompt asks of a real model, with a rule instead of
    a model: it resolves "it" in the question to the topic the conversation
    shown to it (the rolling summary and the recent messages) mentioned last,
    and hints that the question wants facts. Summaries are not its job: the
    demo's builder writes them with the extractive no-model summarizer.
    """

    TOPICS: ClassVar[dict[str, str]] = {
        "ingest pipeline": "the ingest pipeline of the handbook project",
        "parser": "the wiki page parser",
        "re-embedding": "the re-embedding backfill",
    }

    async def generate_text(self, system: str, user: str) -> str:
        raise NotImplementedError("the demo's scripted model only rewrites queries")

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        asked = re.search(r"<question>(.*?)</question>", user, re.DOTALL)
        question = html.unescape(asked.group(1)).strip() if asked else ""
        shown = html.unescape(user[: asked.start()] if asked else user).lower()
        latest = max(self.TOPICS, key=shown.rfind)
        query = question
        if shown.rfind(latest) >= 0 and re.search(r"\bit\b", question):
            query = re.sub(r"\bit\b", self.TOPICS[latest], question, count=1)
            query = re.sub(r"^(?:and|so|but)\s+", "", query, flags=re.IGNORECASE)
            query = query[:1].upper() + query[1:]
        return schema.model_validate({"standalone_query": query, "wanted_types": ["fact"]})


SCRIPT = [
    ("user", "Hi! I'm Dana, I look after the ingest pipeline for the handbook project."),
    ("assistant", "Nice to meet you, Dana. What are you working on today?"),
    ("user", "We decided to move the embeddings into Postgres with pgvector."),
    ("assistant", "Good choice: one database for rows, vectors and access rules."),
    ("user", "Please keep answers short, I read them on my phone."),
]

# The conversation goes on long enough that the window outgrows its summary
# trigger (summary_trigger_fraction x recent_max_tokens = 0.7 x 2000 tokens with
# the default policy), so the next turn folds its older part into the rolling summary.
LATER = [
    (
        "user",
        "I'm at my desk today, so fuller answers are fine. Here is last night's run report "
        "of the ingest pipeline, pasted from the job log. "
        "Start 02:00 UTC, end 02:47 UTC (usual duration 12 minutes). Pages exported from "
        "the wiki: 4,180. Pages parsed: 4,180. Pages with zero chunks: 312, all of them "
        "under /policies. Chunks written: 57,930 (usual 61,200). Embedding requests: 1,812, "
        "of which 406 were retried after HTTP 429 responses between 02:09 and 02:38, with "
        "backoff growing to 64 seconds. Index rebuild: skipped because the run exceeded its "
        "40-minute budget. Alert: sent to #handbook-alerts at 02:48.",
    ),
    (
        "assistant",
        "That looks like two separate problems. First, the 312 zero-chunk pages: when every "
        "empty page sits in one section of the wiki, the usual cause is that the section's "
        "HTML changed and the parser no longer finds the page body, so the splitter gets an "
        "empty string and quietly writes nothing. It is worth comparing one of those pages "
        "with a page that still works. Second, the duration: 406 retries with backoff "
        "growing to 64 seconds account for most of the extra 35 minutes, and the skipped "
        "index rebuild follows from that. So the rate limit, not the data volume, made the "
        "run slow. Do you know whether anything changed in how requests are sent?",
    ),
    (
        "user",
        "Confirmed on both counts. The wiki team moved /policies to their new page template "
        "last Thursday; in the new template the page body sits inside a section element "
        "with the class content instead of the old div with the id main-body, so our "
        "selector finds nothing and the splitter receives an empty string. On the rate "
        "limit: the embedding service allows 600 requests a minute per key, and since the "
        "parallel export change we fire up to 16 requests at once with no pacing, so the "
        "bursts at the start of each batch trip the limit.",
    ),
    (
        "assistant",
        "Then both fixes are small. For the parser, look for the body with the new "
        "template's selector first and fall back to the old one, and treat a page that "
        "still yields no text as an error: log its path, count it, and skip it, rather "
        "than writing zero chunks as if it were fine. For the rate limit, cap the embedding "
        "client at 4 concurrent requests and pace it to about 500 requests a minute, which "
        "leaves headroom under the 600 a minute the key allows. At that pace the 1,812 "
        "requests take under four minutes, so the run still fits comfortably in the "
        "nightly window, and the index rebuild gets its time back.",
    ),
    (
        "user",
        "Notes from this morning's standup, for the record. Decisions: we keep the nightly "
        "schedule at 02:00 UTC; the parser gets the new selector and fails loudly on empty "
        "pages; the embedding client gets a limit of 4 concurrent requests; we alert when "
        "more than 1% of pages produce no chunks, instead of only when the run fails. "
        "Actions: I write the parser change today, Priya reviews it tomorrow morning, and "
        "Tomasz adds the alert rule to the monitoring repository before Friday.",
    ),
    (
        "assistant",
        "That is a good set of decisions. Two suggestions for the parser change: add one "
        "page in the new template to the parser's test fixtures, so the selector cannot "
        "silently regress the next time the wiki team changes a template, and make the "
        "test assert a chunk count rather than only the absence of errors. For the alert, "
        "keep the 1% threshold in the alert rule in the monitoring repository rather than "
        "in the pipeline's code, so it can be tuned without a deploy, and include the "
        "first few failing page paths in the alert text so the person on call can start "
        "from them.",
    ),
    (
        "user",
        "Next topic: the search team wants to try a larger embedding model next quarter, "
        "1,024 dimensions instead of 384. That means re-embedding all 4,180 pages, roughly "
        "61,000 chunks, and the vectors take about 2.7 times the space. They would like to "
        "compare answer quality on the old and the new vectors for two weeks before "
        "deciding, and they cannot accept any search downtime during the switch. The "
        "nightly run has to keep working throughout, since the handbook changes every day.",
    ),
    (
        "assistant",
        "Then treat the re-embedding as a backfill next to the live data rather than a "
        "migration in place. Add a second vector column with its own index, fill it in "
        "batches outside the nightly run, and let the nightly run write both columns for "
        "new and changed pages, so the new vectors never fall behind. During the two-week "
        "comparison the search team can query either column. When they decide, switch "
        "reads to the new column, keep the old one for a week in case of a rollback, and "
        "then drop it. Search never sees a half-filled index that way, and there is no "
        "downtime at any step.",
    ),
    (
        "user",
        "One more gap before I write all this up: the ingest pipeline has no owner listed in "
        "the on-call runbook. Last night's alert went to a shared channel that nobody "
        "watches at night, which is why we only noticed at 09:30. The runbook entry still "
        "names the contractor who built the first version, and he left in the spring.",
    ),
    (
        "assistant",
        "That one is worth fixing today, before the write-up, because it is the reason a "
        "47-minute run went unnoticed for seven hours. Name an owner and a backup in the "
        "runbook entry for the ingest pipeline, route its alerts to them directly rather "
        "than to the shared channel, and replace the contractor's name everywhere it still "
        "appears, including the escalation list. It also helps to add a short section on "
        "the failure modes you saw last night, the rate limit and the template change, "
        "with the first thing to check for each, so whoever is on call at night does not "
        "have to rediscover them.",
    ),
]

#: The demo's summary budget, small so the summary visibly condenses; the
#: builder's default is a quarter of the window budget (500 tokens).
SUMMARY_TOKENS = 160

FOLLOW_UP = "And who looks after it?"

FACTS = [
    ("Dana owns the ingest pipeline of the handbook project", "user", "fact", 0.8),
    ("Dana prefers short answers (reads on a phone)", "user", "preference", 0.7),
    (
        "The handbook project stores embeddings in Postgres with pgvector",
        "project",
        "decision",
        0.9,
    ),
]


def _rule(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 60 - len(title)))


async def run_demo(args: argparse.Namespace) -> int:
    """Write a short conversation, scratch state and memories; read them back."""
    t0 = time.perf_counter()
    manager = await MemoryManager.create(
        database_url=getattr(args, "database_url", None),
        data_dir=Path(args.data_dir) if getattr(args, "data_dir", None) else None,
    )
    session = f"demo-{uuid.uuid4().hex[:8]}"
    # eve's owner further down repeats this shape on purpose: only the principal differs.
    owner = MemoryOwner(
        tenant_id="acme",
        project_id="handbook",
        principal_id="dana",
        session_id=session,
        run_id="run-1",
    )
    try:
        where = (
            "embedded PostgreSQL"
            if manager.database and not getattr(args, "database_url", None)
            else "PostgreSQL"
        )
        print(f"harbor-pg demo on {where} (ready in {time.perf_counter() - t0:.2f}s)")
        print(f"owner: tenant=acme project=handbook user=dana session={session} run=run-1")

        _rule("short-term: conversation turns")
        for role, text in SCRIPT:
            await manager.append(owner, ConversationMessage(role=role, content=text))  # type: ignore[arg-type]
        for m in await manager.recent(owner, limit=12):
            print(f"  #{m.id:<4} {m.role:<9} {m.content}")

        _rule("working: scratch state for this run (TTL 15 min)")
        await manager.update(owner, {"step": "retrieval", "candidates": 12}, ttl_seconds=900)
        state = await manager.update(owner, {"step": "answer"}, ttl_seconds=900)
        print(f"  {state}")

        _rule("long-term: durable memories")
        for content, scope, kind, importance in FACTS:
            res = await manager.inject_memory(
                owner, content, scope=scope, memory_type=kind, importance=importance
            )
            again = await manager.inject_memory(
                owner, content, scope=scope, memory_type=kind, importance=importance
            )
            print(
                f"  [{scope:<7} {kind:<10}] {content}"
                f"{'' if res.created else '  (already stored)'}"
                f"{'  - saved twice, stored once' if not again.created else ''}"
            )

        _rule("snapshot: one round trip, query 'who owns ingest?'")
        snap = await manager.bound_to(owner).snapshot(
            owner, query="who owns ingest?", recent_limit=3
        )
        print(f"  recent turns : {len(snap.recent)} (last: {snap.recent[-1].content!r})")
        print(f"  working state: {snap.working_state}")
        for mem in snap.memories:
            print(f"  memory       : [{mem.scope.value}] {mem.content}")

        question = "where do we store the embeddings, and who owns ingest?"
        _rule(f"recall: {question!r}")
        print(f"  embedder: {manager.embedder.model_id if manager.embedder else 'none (lexical)'}")
        ranked = await manager.recaller().recall_scored(owner, question, top_k=5)
        print(
            f"  {'#':>2} {'scope':<8}{'type':<11}{'dense':>6}{'lex':>5}{'relev':>8}"
            f"{'recency':>8}{'import':>7}{'score':>8}  content"
        )
        for item in ranked:
            mem = item.memory
            print(
                f"  {item.rank:>2} {mem.scope.value:<8}{mem.memory_type.value:<11}"
                f"{item.dense_rank or '-':>6}{item.lexical_rank or '-':>5}"
                f"{item.relevance:>8.4f}{item.recency:>8.3f}{mem.importance:>7.2f}"
                f"{item.score:>8.4f}  {mem.content}"
            )

        _rule("sensitivity ceiling: 'sensitive' memories need an opt-in")
        await manager.inject_memory(
            owner, "Dana is on medical leave in March", sensitivity="sensitive"
        )
        leave = "when is Dana on leave?"
        shown = await manager.recall(owner, leave, top_k=3)
        print(f"  policy.recall_max_sensitivity = {manager.policy.recall_max_sensitivity.value}")
        print(f"  recall {leave!r}: {[m.content for m in shown]}")
        from harbor_pg.context.recall import MemoryRecall

        opted = MemoryRecall(
            policy=manager.policy.with_changes(recall_max_sensitivity="sensitive"),
            memories=manager.long_term,
            embedder=manager.embedder,
        )
        shown = await opted.recall(owner, leave, top_k=3)
        print(f"  with recall_max_sensitivity='sensitive': {[m.content for m in shown]}")

        _rule("the conversation goes on")
        for role, text in LATER:
            m = await manager.append(owner, ConversationMessage(role=role, content=text))  # type: ignore[arg-type]
            print(f"  #{m.id:<4} {m.role:<9} {textwrap.shorten(text, 66, placeholder=' ...')}")

        _rule("context for the next turn: window, summary, rewrite, recall")
        from harbor_pg.context.summarizer import frontier_of
        from harbor_pg.llm.extractive import ExtractiveSummarizer

        policy = manager.policy
        builder = manager.context_builder(
            model=_ScriptedRewriteModel(),  # rewrites only: the summarizer writes the summary
            summarizer=ExtractiveSummarizer(max_tokens=SUMMARY_TOKENS),
            background=manager.background_summarizer(),  # no model either
        )
        print(
            f"  (summary: the extractive no-model summarizer, budget {SUMMARY_TOKENS} tokens;"
            " rewrite: a scripted stand-in model, not an LLM; nothing leaves the machine)"
        )
        context = await builder.build(owner, FOLLOW_UP)
        window = context.messages
        if window:
            print(
                f"  window   : {len(window)} turns (#{window[0].id}-#{window[-1].id}), "
                f"last {textwrap.shorten(window[-1].content, 50, placeholder=' ...')!r}"
            )
        if context.summary:
            summaries = manager.long_term
            assert isinstance(summaries, SummaryStore)
            stored = await summaries.load_summary(owner)
            folded = sorted(int(i) for i in stored.source_message_ids) if stored else []
            covers = f" of messages #{folded[0]}-#{frontier_of(stored)}" if folded else ""
            print(
                f"  summary  : rolling summary{covers}, refreshed this turn:"
                f" {'yes' if context.summary_refreshed else 'no'} (the window outgrew its"
                f" trigger, {policy.summary_trigger_fraction} x {policy.recent_max_tokens}"
                f" = {policy.summary_trigger_tokens} tokens)"
            )
            for line in context.summary.splitlines():
                print(textwrap.fill(line, 100, initial_indent=" " * 13, subsequent_indent=" " * 15))
        else:
            print("  summary  : (none: the window is still within its summary trigger)")
        print(f"  question : {context.question!r}")
        wanted = ", ".join(t.value for t in context.wanted_types) or "none"
        by = ", by the scripted model" if context.rewritten else ""
        print(
            f"  query    : {context.standalone_query!r}"
            f" (rewritten: {context.rewritten}{by}; wanted types: {wanted})"
        )
        for mem in context.recalled:
            print(f"  recalled : [{mem.scope.value}] {mem.content}")
        if context.degraded:
            print(f"  degraded : {', '.join(context.degraded)} (see the warnings above)")

        _rule("extraction: queued with the turns, run in the background")
        # a manager with an extraction model queues a session's extraction in the
        # transaction of the turn that finds none waiting (the turns after it join it);
        # with no worker configured it runs the jobs itself
        assert manager.database is not None
        extracting = MemoryManager.from_database(
            manager.database, embedder=manager.embedder, extraction_model=_ScriptedExtractionModel()
        )
        print(
            "  (a scripted model stands in for the LLM; the job ran in this process, where "
            "`harbor-pg worker` runs it in production)"
        )
        await extracting.append(
            owner, ConversationMessage(role="user", content="By the way, I live in Berlin.")
        )
        await extracting.drain()
        saved = [m for m in await manager.search(owner, "Dana lives in") if m.source == "extracted"]
        for mem in saved:
            print(
                f"  extracted  : [{mem.scope.value}] {mem.content}"
                f" (valid from {mem.valid_from:%H:%M:%S.%f})"
            )
        before_move = datetime.now(UTC)
        await extracting.append(
            owner, ConversationMessage(role="user", content="Update: I moved to Lisbon last week.")
        )
        await extracting.drain()
        replaced = f", superseding {saved[0].content!r}" if saved else ""
        known = {m.id for m in saved}
        for mem in await manager.search(owner, "Dana lives in"):
            if mem.source == "extracted" and mem.id not in known:
                print(f"  then       : [{mem.scope.value}] {mem.content}{replaced}")
        counts = await extracting.job_runner().counts()
        done = sum(
            int(r["jobs"])
            for r in counts
            if r["status"] == "succeeded" and r["task_name"] in (EXTRACT_TASK, EXTRACT_SESSION_TASK)
        )
        print(f"  queue      : {done} extraction jobs run (`harbor-pg jobs` lists the queue)")
        await extracting.close()
        if saved:
            old = await manager.get(owner, saved[0].id or "")
            if old is not None:
                print(
                    f"  old row    : {old.content!r} closed at {old.invalid_at:%H:%M:%S.%f},"
                    f" superseded_by {old.superseded_by}"
                )
        then = await manager.recall(owner, "where does Dana live?", as_of=before_move, top_k=1)
        now = await manager.recall(owner, "where does Dana live?", top_k=1)
        print(f"  as of before the move: {[m.content for m in then]}")
        print(f"  as of now            : {[m.content for m in now]}")

        _rule("isolation: another user in the same tenant")
        # The shape of dana's owner above, on purpose: only the principal differs.
        other = MemoryOwner(
            tenant_id="acme",
            project_id="handbook",
            principal_id="eve",
            session_id=session,
            run_id="run-1",
        )
        print(
            f"  eve sees {len(await manager.recent(other))} of dana's turns, "
            f"{len(await manager.search(other, 'Dana'))} of dana's user memories, and "
            f"{len(await manager.search(other, 'pgvector'))} shared project memory"
        )
        print("\ndone: the rows are in the harbor schema; try `harbor-pg status`.")
    finally:
        await manager.close()
    return 0
