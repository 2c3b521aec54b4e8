"""OpenTelemetry spans, checked with the SDK's in-memory exporter.

The SDK's global tracer provider can be set once per process: the first test
here sets it, with an in-memory exporter that each test clears.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage

OWNER = MemoryOwner(tenant_id="tenant-xq7", principal_id="person-kz9", session_id="sess-vv3")
SECRET = "the vault combination is 7-31-44"
QUESTION = "what opens the vault?"
FACT = "The night shift starts at nine"
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


class EchoRewrite:
    """A scripted model: the rewrite keeps the question; extraction proposes one fact."""

    model = "scripted-model-1"

    async def generate_text(self, system: str, user: str) -> str:
        raise NotImplementedError

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        if "standalone_query" in schema.model_fields:
            return schema.model_validate({"standalone_query": QUESTION, "wanted_types": []})
        fact = {
            "content": FACT,
            "type": "fact",
            "scope": "user",
            "importance": 0.9,
            "entities": [],
            "sensitivity": "none",
        }
        return schema.model_validate({"facts": [fact]})


class BrokenQueryEmbedder(HashingEmbedder):
    async def embed_query(self, text: str) -> list[float]:
        raise RuntimeError(f"cannot embed {text}")


def _by_name(found: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in found:
        out.setdefault(span.name, []).append(span)
    return out


def _text_of(span: ReadableSpan) -> str:
    parts = [span.name, json.dumps(dict(span.attributes or {}), default=str)]
    parts += [e.name + json.dumps(dict(e.attributes or {}), default=str) for e in span.events]
    parts.append(str(span.status.description))
    return " ".join(parts)


async def test_operations_emit_spans_with_conventions_and_no_content(
    spans: InMemorySpanExporter, database: Database
) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    model = EchoRewrite()
    await manager.append(OWNER, ConversationMessage(role="user", content=SECRET))
    await manager.append(OWNER, ConversationMessage(role="user", content=FACT))
    await manager.append(OWNER, ConversationMessage(role="assistant", content="noted: " + SECRET))
    ids = await manager.extract_memories(OWNER, model=model, extract_facts=True)
    assert len(ids) == 1
    await manager.inject_memory(OWNER, SECRET, allow_secrets=True)
    await manager.recall(OWNER, QUESTION)
    built = await manager.context_builder(model=model).build(OWNER, QUESTION)
    assert SECRET in [m.content for m in built.recalled]
    receipt = await manager.erase(OWNER.tenant_id, user_id=OWNER.user_id)
    assert receipt.long_term == 2

    found = spans.get_finished_spans()
    named = _by_name(found)
    for expected in (
        "harbor_pg.append",
        "harbor_pg.extract",
        "harbor_pg.save",
        "harbor_pg.recall",
        "harbor.recall",
        "harbor_pg.build",
        "harbor_pg.erase",
        "embeddings hashing-v1-384",
        "chat scripted-model-1",
    ):
        assert expected in named, (expected, sorted(named))

    # the recall statement: database conventions, the function's name, never its parameters
    db_span = named["harbor.recall"][0]
    assert db_span.kind is trace.SpanKind.CLIENT
    attrs = dict(db_span.attributes or {})
    assert attrs["db.system.name"] == "postgresql"
    assert attrs["db.stored_procedure.name"] == "harbor.recall"
    assert attrs["db.operation.name"] == "SELECT"
    assert attrs["harbor.recall.dense"] is True and attrs["harbor.recall.candidates"] >= 1
    recall_spans = named["harbor_pg.recall"]
    ids_of = {s.context.span_id: s for s in found}
    assert all(ids_of[s.parent.span_id].name == "harbor_pg.recall" for s in named["harbor.recall"])
    assert recall_spans[0].attributes["harbor.recall.returned"] >= 1  # type: ignore[index]

    # model calls and the query embedding: GenAI conventions, children of their operation
    embedding = named["embeddings hashing-v1-384"][0]
    assert embedding.attributes["gen_ai.operation.name"] == "embeddings"  # type: ignore[index]
    assert embedding.attributes["gen_ai.request.model"] == "hashing-v1-384"  # type: ignore[index]
    chats = named["chat scripted-model-1"]
    purposes = {c.attributes["harbor.model.purpose"] for c in chats}  # type: ignore[index]
    assert purposes >= {"extract", "rewrite"}
    for chat in chats:
        assert chat.attributes["gen_ai.operation.name"] == "chat"  # type: ignore[index]
        assert ids_of[chat.parent.span_id].name in {"harbor_pg.extract", "harbor_pg.build"}
    build = named["harbor_pg.build"][0]
    assert ids_of[named["harbor_pg.recall"][-1].parent.span_id] is build
    assert build.attributes["harbor.build.recalled"] >= 1  # type: ignore[index]
    erase = named["harbor_pg.erase"][0].attributes or {}
    assert erase["harbor.erase.long_term"] == 2 and erase["harbor.erase.short_term"] == 3

    # no memory content, question or identity anywhere in a span
    for span in found:
        text = _text_of(span)
        for secret in (
            SECRET,
            FACT,
            "7-31-44",
            QUESTION,
            "vault",
            "tenant-xq7",
            "person-kz9",
            "sess-vv3",
        ):
            assert secret not in text, (span.name, secret)


async def test_a_degraded_recall_says_so_and_a_failure_names_only_the_error_type(
    spans: InMemorySpanExporter, database: Database
) -> None:
    manager = MemoryManager.from_database(database, embedder=BrokenQueryEmbedder())
    await manager.inject_memory(OWNER, SECRET, allow_secrets=True)
    assert [m.content for m in await manager.recall(OWNER, "vault combination")] == [SECRET]
    named = _by_name(spans.get_finished_spans())
    [embedding] = named["embeddings hashing-v1-384"]
    assert embedding.attributes["harbor.recall.degraded"] == "lexical"  # type: ignore[index]
    assert named["harbor.recall"][0].attributes["harbor.recall.dense"] is False  # type: ignore[index]

    spans.clear()
    with pytest.raises(Exception, match="session"):
        await manager.append(MemoryOwner(tenant_id="t"), {"role": "user", "content": SECRET})
    [failed] = spans.get_finished_spans()
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert failed.attributes["error.type"] == "MemoryScopeError"  # type: ignore[index]
    assert SECRET not in _text_of(failed) and failed.events == ()


_ABSENT = """
import asyncio, importlib.abc, json, sys

class NoTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, NoTelemetry())
from harbor_pg import MemoryManager, MemoryOwner, telemetry

async def main():
    m = await MemoryManager.create(in_process=True)
    o = MemoryOwner(tenant_id="t", principal_id="p", session_id="s")
    await m.append(o, {"role": "user", "content": "hello"})
    await m.inject_memory(o, "p likes tea")
    await m.recall(o, "tea")
    await m.context_builder().build(o, "what does p like?")
    await m.erase("t", user_id="p")

asyncio.run(main())
print(json.dumps({"enabled": telemetry.enabled(),
                  "loaded": sorted(n for n in sys.modules if n.startswith("opentelemetry"))}))
"""


async def test_every_job_is_a_span_with_its_model_call_inside(
    database: Database, spans: InMemorySpanExporter
) -> None:
    import asyncio

    from harbor_pg.jobs import EXTRACT_SESSION_TASK

    owner = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s-job")
    manager = MemoryManager.from_database(
        database, extraction_model=EchoRewrite(), embedder=HashingEmbedder()
    )
    try:
        await manager.append(owner, ConversationMessage(role="user", content="nine o'clock"))
        await asyncio.wait_for(manager.drain(), timeout=30)
    finally:
        await manager.close()
    finished: list[ReadableSpan] = list(spans.get_finished_spans())
    # (the worker also ran the periodic upkeep it queued at its start)
    [job] = [
        s
        for s in finished
        if s.name == "harbor_pg.job"
        and (s.attributes or {}).get("harbor.job.task") == EXTRACT_SESSION_TASK
    ]
    assert job.attributes is not None and job.attributes["harbor.job.attempt"] == 0
    inside = [
        s for s in finished if s.parent is not None and s.parent.span_id == job.context.span_id
    ]
    assert any(s.attributes and s.attributes.get("gen_ai.operation.name") for s in inside)
    # no identity, no content
    text = json.dumps([dict(s.attributes or {}) for s in finished], default=str)
    assert "dana" not in text and "nine o'clock" not in text


async def test_a_fold_job_and_its_failed_runs_are_spans_too(
    database: Database, spans: InMemorySpanExporter
) -> None:
    """Every run of every job is a span: here a summary fold whose model fails, run
    twice (one retry), each run a span with status ERROR and the error's class only."""
    import asyncio

    from harbor_pg.config import MemoryManagerConfig
    from harbor_pg.jobs import FOLD_TASK
    from harbor_pg.policy import MemoryPolicy
    from tests.integration.test_jobs_failures import FailingSummaryModel

    owner = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s-fold")
    manager = MemoryManager.from_database(
        database,
        policy=MemoryPolicy(
            summarise_after_turns=4, summary_keep_messages=1, summary_cooldown_seconds=0
        ),
        config=MemoryManagerConfig(
            summaries_on_queue=True, jobs_in_process=False, job_retries=1, job_retry_seconds=0
        ),
        summary_model=FailingSummaryModel(),
    )
    try:
        for i in range(4):
            await manager.append(owner, ConversationMessage(role="user", content=f"item {i}"))
        await asyncio.wait_for(manager.run_worker(wait=False), timeout=30)
    finally:
        await manager.close()
    runs = [
        s
        for s in spans.get_finished_spans()
        if s.name == "harbor_pg.job" and (s.attributes or {}).get("harbor.job.task") == FOLD_TASK
    ]
    assert sorted((s.attributes or {})["harbor.job.attempt"] for s in runs) == [0, 1]
    for run in runs:
        assert run.status.status_code is trace.StatusCode.ERROR
        assert (run.attributes or {}).get("error.type") == "MemoryModelError"
        assert "unreachable" not in json.dumps(dict(run.attributes or {}))


def test_without_opentelemetry_nothing_is_imported_or_emitted() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _ABSENT], check=True, capture_output=True, text=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"enabled": False, "loaded": []}
