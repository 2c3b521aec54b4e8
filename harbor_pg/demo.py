"""``harbor-pg demo``: a scripted conversation through the three tiers."""

from __future__ import annotations

import argparse
import re
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage

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


SCRIPT = [
    ("user", "Hi! I'm Dana, I look after the ingest pipeline for the handbook project."),
    ("assistant", "Nice to meet you, Dana. What are you working on today?"),
    ("user", "We decided to move the embeddings into Postgres with pgvector."),
    ("assistant", "Good choice: one database for rows, vectors and access rules."),
    ("user", "Please keep answers short, I read them on my phone."),
]

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

        _rule("context for the next turn (no model: nothing leaves the machine)")
        context = await manager.context_builder().build(owner, "and who looks after ingest?")
        print(f"  window   : {len(context.messages)} turns, last {context.messages[-1].content!r}")
        print(f"  summary  : {context.summary or '(none yet: the session is short)'}")
        print(f"  query    : {context.standalone_query!r} (rewritten: {context.rewritten})")
        for mem in context.recalled:
            print(f"  recalled : [{mem.scope.value}] {mem.content}")

        _rule("extraction: facts from the conversation, then a contradiction")
        from harbor_pg.extraction.extractor import MemoryExtractor

        assert manager.long_term is not None
        extractor = MemoryExtractor(
            memories=manager.long_term,  # type: ignore[arg-type]
            model=_ScriptedExtractionModel(),
            embedder=manager.embedder,
        )
        print("  (a scripted model stands in for the LLM; configure a MemoryModel for real use)")
        first = await manager.append(
            owner, ConversationMessage(role="user", content="By the way, I live in Berlin.")
        )
        saved = await extractor.extract(owner, [first])
        for mem in saved:
            print(
                f"  extracted  : [{mem.scope.value}] {mem.content}"
                f" (valid from {mem.valid_from:%H:%M:%S.%f})"
            )
        before_move = datetime.now(UTC)
        moved = await manager.append(
            owner, ConversationMessage(role="user", content="Update: I moved to Lisbon last week.")
        )
        for mem in await extractor.extract(owner, [moved]):
            print(f"  supersedes : [{mem.scope.value}] {mem.content}")
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
