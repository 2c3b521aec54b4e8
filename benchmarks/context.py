"""Overhead of MemoryContextBuilder.build(), model time excluded (target: p50 < 15 ms).

    python -m benchmarks context [--turns 1000] [--memories 100000] [--calls 300]
                                           [--own-memories 400] [--users 1000]

Data, written as the superuser into a fresh embedded server:

* one session of ``--turns`` turns (alternating user / assistant; user turns of
  5-35 words, assistant turns of 60-260 words) in ``harbor.messages``;
* ``--memories`` USER memories in one tenant: ``--own-memories`` of them
  belong to the benchmark's own user, the rest are spread over ``--users``
  other users of the same tenant, all drawn from the same vocabulary (so the
  lexical index holds real competitors). Each memory has a 384-dimension row
  in ``harbor.memory_embeddings`` under the HashingEmbedder's ``model_id``:
  the own user's vectors are computed with the HashingEmbedder, the others
  are random unit vectors (binary COPY). The HNSW and full-text indexes are
  rebuilt after the load, then ``VACUUM ANALYZE``.

Measured as ``harbor_app`` (row-level security on, identity set per
transaction) through ``MemoryManager.from_database(db, embedder=HashingEmbedder())``
and ``manager.context_builder(...)`` with the default policy, two builders:

* ``model``: an instant scripted MemoryModel (a fixed summary, and for each
  question a rewrite scripted before the call), so the summary and rewrite
  paths run while model time stays ~0; the time spent inside model calls is
  measured and subtracted ("excluding model time");
* ``no-model``: ``model=None`` (extractive summary, no rewrite).

Builders from ``context_builder`` schedule the manager's background
SessionSummarizer at the end of every build (an asyncio task that starts only
once the caller awaits again). The benchmark awaits it (``drain()``) after each
build, outside the timed region, and reports its time on its own line.

For each builder the summary is first caught up: the first builds (and their
background summaries) fold the session's history into the rolling summary, at
most four pages of 50 messages per refresh; they are timed and reported on
their own (the summary row and the session's lease row are reset between the
two builders). Then both builders get 20 warm-up builds and ``--calls``
steady-state builds each, interleaved, with varied questions; p50 / p95 / p99
are printed, with a per-step breakdown (history read, summary load, rewrite
without the model call, query embedding, the recall transaction, the rest in
Python).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg.types.enum import EnumInfo, register_enum
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, pct, private_server, record, with_params

from harbor_pg.context.summarizer import frontier_of
from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import content_hash
from harbor_pg.tiers.base import summary_memory_id
from harbor_pg.tokens import approximate_tokens

T = TypeVar("T", bound=BaseModel)

TENANT = "t-bench"
ME = "me"
SESSION = "s-bench"
DIMS = 384
WARMUP = 20
SEED = 11

PROJECTS = ["Atlas", "Borealis", "Cedar", "Dune", "Ember", "Fjord", "Granite", "Helix", "Iris"]
TECH = ["PostgreSQL", "Kafka", "Redis", "Terraform", "Kubernetes", "Airflow", "Grafana", "dbt"]
THINGS = [
    "budget",
    "roadmap",
    "invoice",
    "migration",
    "schema",
    "dashboard",
    "release",
    "onboarding",
    "contract",
    "deadline",
    "ingest pipeline",
    "search index",
    "billing export",
    "travel plan",
    "design review",
    "quarterly report",
]
PEOPLE = ["Maria", "Kenji", "Aisha", "Tom", "Priya", "Lukas", "Sofia", "Omar", "Elena", "Ravi"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "next sprint", "end of quarter"]
PREFS = [
    "window seats",
    "vegetarian meals",
    "morning meetings",
    "dark mode",
    "async standups",
    "bullet-point summaries",
    "metric units",
    "short emails",
    "written agendas",
]
ACTIVITIES = ["long flights", "team lunches", "code reviews", "reports", "planning sessions"]
VERBS = ["postpone", "split", "rewrite", "audit", "ship", "freeze", "review", "migrate"]
EVENTS = ["met", "argued", "had a call", "paired", "went over the numbers", "shared a draft"]
FILLER = [
    "That should keep the numbers consistent with last month.",
    "I would double-check the owner list before sending it out.",
    "The main risk is the dependency on the vendor's API limits.",
    "If that slips, the fallback is to run the old job for one more week.",
    "Let me know if you want me to draft the message for the team.",
    "Most of the cost comes from the nightly batch, not the interactive queries.",
    "It is worth writing this down so the next review does not reopen it.",
    "Here is a short checklist you can follow step by step.",
]


def memory_text(rng: random.Random) -> tuple[str, str]:
    """(memory type, content): one realistic long-term memory."""
    kind = rng.choice(["fact", "preference", "decision", "episode"])
    p, t, th = rng.choice(PROJECTS), rng.choice(TECH), rng.choice(THINGS)
    if kind == "fact":
        text = f"The {p} project keeps its {th} in {t}, owned by {rng.choice(PEOPLE)}."
    elif kind == "preference":
        text = f"The user prefers {rng.choice(PREFS)} for {rng.choice(ACTIVITIES)} on {p}."
    elif kind == "decision":
        text = (
            f"The team decided to {rng.choice(VERBS)} the {p} {th} before "
            f"{rng.choice(DAYS)}, because of the {rng.choice(THINGS)}."
        )
    else:
        text = (
            f"On {rng.choice(DAYS)} the user {rng.choice(EVENTS)} with {rng.choice(PEOPLE)} "
            f"about the {p} {th} and the {t} setup."
        )
    return kind, text


def sentence(rng: random.Random) -> str:
    p, t, th = rng.choice(PROJECTS), rng.choice(TECH), rng.choice(THINGS)
    return rng.choice(
        [
            f"For {p}, the {th} depends on how {t} is configured in production.",
            f"{rng.choice(PEOPLE)} owns the {th}, so any change should go through them first.",
            f"You could {rng.choice(VERBS)} the {th} before {rng.choice(DAYS)} and keep {t}.",
            f"The {p} {th} was last updated on {rng.choice(DAYS)} after the {t} incident.",
            rng.choice(FILLER),
        ]
    )


def turn_text(rng: random.Random, role: str) -> str:
    if role == "user":
        p, th = rng.choice(PROJECTS), rng.choice(THINGS)
        base = rng.choice(
            [
                f"Can you help me with the {p} {th}?",
                f"What did {rng.choice(PEOPLE)} say about the {th} for {p}?",
                f"I think we should {rng.choice(VERBS)} the {th} before {rng.choice(DAYS)}.",
                f"Remind me how the {th} works with {rng.choice(TECH)}.",
                "ok, and what about the other one?",
            ]
        )
        target = rng.randint(5, 35)
        words = base.split()
        while len(words) < target:
            words += rng.choice(FILLER).split()
        return " ".join(words[: max(target, len(base.split()))])
    target = rng.randint(60, 260)
    words: list[str] = []
    while len(words) < target:
        words += sentence(rng).split()
    return " ".join(words)


def questions(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """(question, the rewrite the scripted model will answer with)."""
    out = []
    for _ in range(n):
        p, th, who = rng.choice(PROJECTS), rng.choice(THINGS), rng.choice(PEOPLE)
        q, rw = rng.choice(
            [
                (f"What did we decide about the {th}?", f"decision about the {p} {th}"),
                (f"and who owns it on {p}?", f"who owns the {th} of the {p} project"),
                (f"When did I last talk to {who}?", f"last meeting with {who} about {p}"),
                (
                    f"Which setup does {p} use for the {th}?",
                    f"{p} project {th} technology setup",
                ),
                (
                    f"Remind me what I like for {rng.choice(ACTIVITIES)}.",
                    f"user preferences for {rng.choice(ACTIVITIES)}",
                ),
                (f"Should we {rng.choice(VERBS)} it?", f"plan to change the {p} {th}"),
            ]
        )
        out.append((q, rw))
    return out


# -- data -----------------------------------------------------------------------------------


def build(su: str, turns: int, memories: int, own: int, users: int) -> dict[str, float]:
    rng = random.Random(SEED)
    nrng = np.random.default_rng(SEED)
    embedder = HashingEmbedder(DIMS)
    now = datetime.now(UTC)
    took: dict[str, float] = {}
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as conn:
        register_vector(conn)
        scope_info = EnumInfo.fetch(conn, "harbor.memory_scope")
        assert scope_info is not None
        register_enum(scope_info, conn)
        user_scope = next(m for m in scope_info.enum if m.name.lower() == "user")

        # the session: turns spread over the last 30 days, oldest first
        t0 = time.perf_counter()
        with (
            conn.transaction(),
            conn.cursor().copy(
                "copy harbor.messages (tenant_id, user_id, session_id, principal_id, role, content,"
                " token_estimate, created_at) from stdin"
            ) as copy,
        ):
            for i in range(turns):
                role = "user" if i % 2 == 0 else "assistant"
                text = turn_text(rng, role)
                at = now - timedelta(days=30) + timedelta(days=30) * i / max(1, turns)
                copy.write_row((TENANT, ME, SESSION, ME, role, text, approximate_tokens(text), at))
        took["turns"] = time.perf_counter() - t0

        # long-term memories: own user's first, then the other users'
        t1 = time.perf_counter()
        defs = {
            name: conn.execute(
                "select indexdef from pg_indexes where schemaname = 'harbor' and indexname = %s",
                (name,),
            ).fetchone()[0]  # type: ignore[index]
            for name in (
                "memory_embeddings_hnsw_384",
                "memories_owner_terms_idx",
            )
        }
        for name in defs:
            conn.execute(f"drop index harbor.{name}")
        owners: list[tuple[str, str]] = []  # (memory id, user id)
        own_texts: list[str] = []
        seen: set[tuple[str, str]] = set()
        with (
            conn.transaction(),
            conn.cursor().copy(
                "copy harbor.memories (tenant_id, id, scope, user_id, principal_id, memory_type,"
                " importance, content, content_hash, source, valid, created_at, updated_at)"
                " from stdin"
            ) as copy,
        ):
            for n in range(memories):
                user = ME if n < own else f"u{(n - own) % users + 1}"
                while True:
                    kind, text = memory_text(rng)
                    digest = content_hash("user", text)
                    if (user, digest) not in seen:
                        seen.add((user, digest))
                        break
                at = now - timedelta(hours=rng.uniform(1, 24 * 120))
                mid = f"m{n}"
                copy.write_row(
                    (
                        TENANT,
                        mid,
                        "user",
                        user,
                        user,
                        kind,
                        round(rng.uniform(0.2, 0.9), 2),
                        text,
                        digest,
                        "extracted",
                        f"[{at.isoformat()},)",
                        at,
                        at,
                    )
                )
                owners.append((mid, user))
                if user == ME:
                    own_texts.append(text)
        took["memories"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        own_vecs = [np.asarray(embedder.embed_sync(t), dtype=np.float32) for t in own_texts]
        rest = nrng.standard_normal((len(owners) - len(own_vecs), DIMS)).astype(np.float32)
        rest /= np.linalg.norm(rest, axis=1, keepdims=True)
        with (
            conn.transaction(),
            conn.cursor().copy(
                "copy harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,"
                " scope, user_id) from stdin with (format binary)"
            ) as copy,
        ):
            copy.set_types(
                ["text", "text", "text", "int4", "vector", "harbor.memory_scope", "text"]
            )
            for i, (mid, user) in enumerate(owners):
                vec = own_vecs[i] if i < len(own_vecs) else rest[i - len(own_vecs)]
                copy.write_row((TENANT, mid, embedder.model_id, DIMS, vec, user_scope, user))
        took["embeddings"] = time.perf_counter() - t2

        t3 = time.perf_counter()
        conn.execute("set maintenance_work_mem = '1GB'")
        for sql in defs.values():
            conn.execute(sql)
        took["indexes"] = time.perf_counter() - t3
        t4 = time.perf_counter()
        for table in ("messages", "memories", "memory_embeddings"):
            conn.execute(f"vacuum analyze harbor.{table}")
        took["vacuum"] = time.perf_counter() - t4
    return took


# -- the scripted model and the step clocks -------------------------------------------------


class InstantModel:
    """A MemoryModel that answers at once: a fixed summary, and the rewrite set beforehand.

    ``seconds`` accumulates the time spent inside its calls (including validating
    the structured answer, as a real adapter would).
    """

    supports_structured = True

    def __init__(self, summary: str) -> None:
        self.summary = summary
        self.rewrite = ""
        self.wanted: list[str] = []
        self.seconds = 0.0
        self.calls = {"summary": 0, "rewrite": 0}

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = {"summary": 0, "rewrite": 0}

    async def generate_text(self, system: str, user: str) -> str:
        t = time.perf_counter()
        try:
            if "rolling summary" in system:
                self.calls["summary"] += 1
                return self.summary
            self.calls["rewrite"] += 1
            return self.rewrite
        finally:
            self.seconds += time.perf_counter() - t

    async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
        t = time.perf_counter()
        try:
            self.calls["rewrite"] += 1
            return schema.model_validate(
                {"standalone_query": self.rewrite, "wanted_types": self.wanted}
            )
        finally:
            self.seconds += time.perf_counter() - t


STEPS = ("history", "summary_load", "rewrite", "embed", "recall", "recall_db")


class Clock:
    def __init__(self) -> None:
        self.t = dict.fromkeys(STEPS, 0.0)

    def reset(self) -> None:
        for k in self.t:
            self.t[k] = 0.0

    def wrap(self, obj: Any, name: str, label: str) -> None:
        inner: Callable[..., Awaitable[Any]] = getattr(obj, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                self.t[label] += time.perf_counter() - t

        setattr(obj, name, timed)


# -- measurement ----------------------------------------------------------------------------


def ms_line(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"p50 {statistics.median(ms):7.3f} ms  p95 {pct(ms, 95):7.3f} ms  "
        f"p99 {pct(ms, 99):7.3f} ms  (n={len(ms)})"
    )


async def catch_up(
    builder: Any, owner: MemoryOwner, model: InstantModel | None, question: str
) -> list[dict[str, Any]]:
    """Builds until neither a build nor its background summary folds anything.

    One dict per build: build and background seconds, whether the build itself
    refreshed the summary, summary calls in each, model seconds, and the frontier
    after both. The last build is the first that folded nothing.
    """
    out: list[dict[str, Any]] = []
    frontier = frontier_of(await builder.rolling.load(owner))
    for _ in range(50):
        if model is not None:
            model.rewrite = "catch-up question about the Atlas budget"
            model.reset()
        t = time.perf_counter()
        ctx = await builder.build(owner, question)
        dt = time.perf_counter() - t
        row: dict[str, Any] = {
            "build": dt,
            "refreshed": ctx.summary_refreshed,
            "calls": model.calls["summary"] if model is not None else 0,
            "model": model.seconds if model is not None else 0.0,
        }
        # the background summary the build scheduled (it has not run yet: build()
        # returned without awaiting again after scheduling it)
        t = time.perf_counter()
        await builder.background.drain()
        row["bg"] = time.perf_counter() - t
        row["bg_calls"] = (model.calls["summary"] if model is not None else 0) - row["calls"]
        assert not ctx.degraded, ctx.degraded
        row["frontier"] = frontier_of(await builder.rolling.load(owner))
        out.append(row)
        moved = row["frontier"] != frontier
        frontier = row["frontier"]
        if not moved:
            break
    return out


def reset_summary(su: str) -> None:
    """Forget the session's rolling summary and its background-summary bookkeeping."""
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
        c.execute(
            "delete from harbor.memories where tenant_id = %s and id = %s",
            (
                TENANT,
                summary_memory_id(
                    MemoryOwner(tenant_id=TENANT, principal_id=ME, session_id=SESSION)
                ),
            ),
        )
        c.execute(
            "delete from harbor.session_state where tenant_id = %s and session_id = %s",
            (TENANT, SESSION),
        )


async def measure(app_url: str, su: str, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(SEED + 1)
    summary = " ".join(sentence(rng) for _ in range(18))
    db = Database(app_url, min_size=1, max_size=2)
    await db.open()
    embedder = HashingEmbedder(DIMS)
    manager = MemoryManager.from_database(db, embedder=embedder)
    model = InstantModel(summary)
    builders = {
        "model": manager.context_builder(model=model),
        "no-model": manager.context_builder(),
    }
    owner = MemoryOwner(tenant_id=TENANT, principal_id=ME, session_id=SESSION)
    clock = Clock()
    clock.wrap(manager.short_term, "recent", "history")
    clock.wrap(manager.long_term, "load_summary", "summary_load")
    clock.wrap(embedder, "embed_query", "embed")
    for b in builders.values():
        if b.condenser is not None:
            clock.wrap(b.condenser, "condense", "rewrite")
        clock.wrap(b.recall, "recall", "recall")
        clock.wrap(b.recall, "_rank", "recall_db")

    window = await manager.short_term.recent(owner, builders["model"].policy.recent_max_messages)
    res: dict[str, Any] = {
        "window_tokens": builders["model"].rolling.window_tokens(window),
        "trigger": int(
            builders["model"].policy.summary_trigger_fraction
            * builders["model"].policy.recent_max_tokens
        ),
        "catch_up": {},
    }
    # the summary catch-up, once per builder (the summary row is reset in between)
    first_q = "What did we decide about the Atlas budget?"
    res["catch_up"]["model"] = await catch_up(builders["model"], owner, model, first_q)
    reset_summary(su)
    res["catch_up"]["no-model"] = await catch_up(builders["no-model"], owner, None, first_q)

    qs = questions(WARMUP + args.calls, random.Random(SEED + 2))
    wanted = [[], ["decision"], ["preference"], ["episode", "fact"]]
    samples: dict[str, dict[str, list[float]]] = {
        name: {k: [] for k in ("total", "model", "net", "recalled", "background", *STEPS)}
        for name in builders
    }
    counts = {"rewritten": 0, "summary_calls": 0, "rewrite_calls": 0, "refreshed": 0}
    for i, (q, rw) in enumerate(qs):
        model.rewrite, model.wanted = rw, wanted[i % len(wanted)]
        order = list(builders) if i % 2 == 0 else list(reversed(builders))
        for name in order:
            model.reset()
            clock.reset()
            t = time.perf_counter()
            ctx = await builders[name].build(owner, q)
            dt = time.perf_counter() - t
            spent = model.seconds if name == "model" else 0.0
            t = time.perf_counter()
            await builders[name].background.drain()
            bg = time.perf_counter() - t
            assert not ctx.degraded, ctx.degraded
            if i < WARMUP:
                continue
            s = samples[name]
            s["background"].append(bg)
            s["total"].append(dt)
            s["model"].append(spent)
            s["net"].append(dt - spent)
            s["recalled"].append(len(ctx.recalled))
            for k in STEPS:
                s[k].append(clock.t[k] - (spent if k == "rewrite" else 0.0))
            counts["refreshed"] += ctx.summary_refreshed
            if name == "model":
                counts["rewritten"] += ctx.rewritten
                counts["summary_calls"] += model.calls["summary"]
                counts["rewrite_calls"] += model.calls["rewrite"]
    await manager.close()
    await db.close()
    res["samples"] = samples
    res["counts"] = counts
    res["summary_tokens"] = approximate_tokens(ctx.summary or "")
    res["window_messages"] = len(ctx.messages)
    return res


def report(args: argparse.Namespace, took: dict[str, float], res: dict[str, Any]) -> None:
    print(f"\nmachine: {machine()}")
    print(
        f"data: 1 session of {args.turns:,} turns; {args.memories:,} USER memories in one"
        f" tenant ({args.own_memories:,} of the benchmark's user, the rest over"
        f" {args.users:,} other users), each with a {DIMS}-dim vector"
    )
    print(
        "built in {:.1f}s: turns {turns:.1f}s, memories {memories:.1f}s, vectors"
        " {embeddings:.1f}s, HNSW + full-text indexes {indexes:.1f}s, vacuum analyze"
        " {vacuum:.1f}s".format(sum(took.values()), **took)
    )
    print(
        f"window before catch-up: {res['window_tokens']} tokens in the last 12 messages"
        f" (summary trigger above {res['trigger']})"
    )
    for name, rows in res["catch_up"].items():
        folding, first = rows[:-1], rows[-1]
        each = "; ".join(
            f"build {r['build'] * 1000:.1f} ms ({'refreshed' if r['refreshed'] else 'no refresh'},"
            f" {r['calls']} summary calls) + background {r['bg'] * 1000:.1f} ms"
            f" ({r['bg_calls']} summary calls), frontier -> {r['frontier']}"
            for r in folding
        )
        print(
            f"catch-up [{name}]: {len(folding)} builds folded the history; build() time"
            f" {sum(r['build'] for r in folding) * 1000:.1f} ms in all (model time"
            f" {sum(r['model'] for r in folding) * 1000:.3f} ms), background"
            f" {sum(r['bg'] for r in folding) * 1000:.1f} ms: {each}; the next build folded"
            f" nothing ({first['build'] * 1000:.1f} ms, frontier {first['frontier']})"
        )
    c = res["counts"]
    print(
        f"\nsteady state: {args.calls} builds per builder after {WARMUP} warm-up builds,"
        f" interleaved; model builder made {c['rewrite_calls']} rewrite calls and"
        f" {c['summary_calls']} summary calls, {c['rewritten']} rewrites accepted;"
        f" summary refreshed {c['refreshed']} times; both builders read the summary the"
        f" no-model catch-up wrote ({res['summary_tokens']} tokens) and replay"
        f" {res['window_messages']} messages"
    )
    for name, s in res["samples"].items():
        rec = statistics.mean(s["recalled"])
        print(f"\n[{name}] recalled {rec:.1f} memories per build on average")
        print(
            f"  background task (after build() returned; not in the figures below)"
            f" p50 {statistics.median(s['background']) * 1000:.3f} ms"
        )
        if name == "model":
            print(f"  build() total              {ms_line(s['total'])}")
            print(
                f"  inside model calls         {ms_line(s['model'])};"
                f" sum {sum(s['model']) * 1000:.2f} ms"
            )
            print(f"  build() excl. model time   {ms_line(s['net'])}   <- target p50 < 15 ms")
        else:
            print(f"  build() (no model)         {ms_line(s['total'])}   <- target p50 < 15 ms")
        rest = [
            n - h - sl - rw - r
            for n, h, sl, rw, r in zip(
                s["net"], s["history"], s["summary_load"], s["rewrite"], s["recall"], strict=True
            )
        ]
        recall_py = [
            r - d - e for r, d, e in zip(s["recall"], s["recall_db"], s["embed"], strict=True)
        ]
        parts = [
            ("history read (recent)", s["history"]),
            ("summary load", s["summary_load"]),
            ("rewrite excl. model", s["rewrite"]),
            ("recall: query embedding", s["embed"]),
            ("recall: harbor.recall trip", s["recall_db"]),
            ("recall: other Python", recall_py),
            ("builder, rest (trim etc.)", rest),
        ]
        for label, values in parts:
            if name == "no-model" and label == "rewrite excl. model":
                continue
            print(
                f"    {label:27s} p50 {statistics.median(values) * 1000:7.3f} ms"
                f"  p95 {pct(values, 95) * 1000:7.3f} ms"
            )


QUESTION = "What does building a turn's context cost, model time excluded?"


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` as on the command line."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks context",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--memories", type=int, default=100_000)
    ap.add_argument("--own-memories", type=int, default=400)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    args = ap.parse_args(argv)
    if not 0 < args.own_memories <= args.memories:
        ap.error("--own-memories must be in 1..--memories")
    with private_server() as (su, _base):
        server.bootstrap(su)
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        took = build(su, args.turns, args.memories, args.own_memories, args.users)
        print(f"data built in {sum(took.values()):.1f}s", flush=True)
        res = asyncio.run(measure(with_params(su, dbname="harbor", user="harbor_app"), su, args))
    report(args, took, res)
    if args.record:
        rows = []
        for name, s in res["samples"].items():
            values = s["net"] if name == "model" else s["total"]
            rows.append(
                [
                    f"build() {'excl. model time' if name == 'model' else '(no model)'}",
                    f"{statistics.median(values) * 1000:.2f}",
                    f"{pct(values, 95) * 1000:.2f}",
                    f"{statistics.median(s['recall']) * 1000:.2f}",
                    f"{statistics.mean(s['recalled']):.1f}",
                ]
            )
        record(
            "context",
            title="Per-turn context build (`context`)",
            data=f"1 session of {args.turns:,} turns; {args.memories:,} USER memories in one"
            f" tenant ({args.own_memories:,} of the user's own, the rest over {args.users:,}"
            f" users); {args.calls} builds a builder",
            header=["builder", "p50 ms", "p95 ms", "recall part p50 ms", "memories recalled"],
            rows=rows,
        )


if __name__ == "__main__":
    main()
