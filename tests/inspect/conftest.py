"""Fixtures of the inspector's tests: a seeded database and the app served by uvicorn.

The rows are written through the application role, each as its own identity
(what any application can do): two users of tenant ``acme`` and a user of the
same name in another tenant. Each of the other two holds a marker string that
must never appear in a page read as dana.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.inspect import InspectorSettings, build_app
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import Memory, MemoryScope, MemoryType, Sensitivity
from tests.conftest import PgDatabase

DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1", run_id="r1")
EVE = MemoryOwner(tenant_id="acme", principal_id="eve", session_id="e1")
STRANGER = MemoryOwner(tenant_id="globex", principal_id="dana", session_id="s1")
#: text only eve's rows hold, and text only the other tenant's rows hold
EVE_MARK = "violet kazoo collection"
STRANGER_MARK = "zebra otter lighthouse"

_TURNS = [
    ("user", "We moved the ingest pipeline from RabbitMQ to Kafka last week."),
    ("assistant", "Noted: the ingest pipeline runs on Kafka now."),
    ("user", "Dana owns the ingest pipeline and the on-call rota for it."),
    ("assistant", "Understood, Dana is the owner of ingest."),
    ("user", "I prefer tea to coffee, by the way."),
    ("assistant", "Tea it is."),
    ("user", "The billing service still reads from the old queue."),
    ("assistant", "I will keep that in mind for the migration plan."),
]


def policy() -> MemoryPolicy:
    """What the seeding and the served app share: quick summaries, recall as default."""
    return MemoryPolicy(
        summarise_after_turns=6, summary_cooldown_seconds=0, summary_keep_messages=4
    )


@dataclass(frozen=True)
class Seed:
    db: PgDatabase
    owns_ingest: str
    rabbit: str
    kafka: str
    badge: str
    turn_ids: list[int]
    before_kafka: datetime


async def _seed(db: PgDatabase) -> Seed:
    database = Database(db.app_url, db.admin_url, min_size=1, max_size=2)
    await database.open()
    manager = MemoryManager.from_database(
        database,
        embedder=HashingEmbedder(),
        policy=policy(),
        config=MemoryManagerConfig(summarise_in_background=False),
    )
    try:
        turns = [await manager.append(DANA, {"role": r, "content": c}) for r, c in _TURNS]
        ids = [int(t.id) for t in turns if t.id is not None]
        assert await manager.background_summarizer().maybe_summarise(DANA)
        # a few more turns after the summary's frontier
        await manager.append(DANA, {"role": "user", "content": "What about the billing queue?"})

        async def save(content: str, **kw: Any) -> str:
            result = await manager.save(DANA, Memory(content=content, **kw))
            assert result.memory.id is not None
            return result.memory.id

        owns = await save(
            "Dana owns the ingest pipeline",
            importance=0.9,
            entity_ids=["dana", "ingest"],
            source="extracted",
            source_session_id="s1",
            source_message_ids=[str(ids[2]), str(ids[3])],
        )
        rabbit = await save(
            "The ingest pipeline runs on RabbitMQ",
            entity_ids=["ingest"],
            source="extracted",
            source_session_id="s1",
            source_message_ids=[str(ids[0])],
        )
        await asyncio.sleep(0.05)
        before = datetime.now(UTC)
        await asyncio.sleep(0.05)
        assert manager.long_term is not None
        replaced = await manager.long_term.supersede(  # type: ignore[attr-defined]
            DANA,
            rabbit,
            Memory(
                content="The ingest pipeline runs on Kafka",
                scope=MemoryScope.USER,
                entity_ids=["ingest"],
                source="extracted",
                source_session_id="s1",
                source_message_ids=[str(ids[0]), str(ids[1])],
            ),
        )
        kafka = replaced.memory.id
        await save(
            "Dana prefers tea over coffee",
            memory_type=MemoryType.PREFERENCE,
            entity_ids=["dana"],
            source="user",
        )
        badge = await save(
            "Dana lives at 12 Harbour Lane", sensitivity=Sensitivity.PII, source="injected"
        )
        await save(
            "The session is about the queue migration",
            scope=MemoryScope.SESSION,
            memory_type=MemoryType.EPISODE,
            source="summary",
        )
        for n, topic in enumerate(
            ["billing", "search", "payments", "alerts", "reporting", "auth", "storage", "mail"]
        ):
            await save(
                f"The {topic} pipeline has a weekly maintenance window #{n}",
                memory_type=MemoryType.FACT,
                importance=0.2 + n / 20,
                source="tool:cron",
            )
        await manager.update(
            DANA, {"step": "drafting the migration plan", "open_tickets": 3}, ttl_seconds=3600
        )

        # the others: same tenant, another user; another tenant, the same user name
        await manager.append(EVE, {"role": "user", "content": f"My {EVE_MARK} needs a pipeline"})
        await manager.save(
            EVE,
            Memory(
                content=f"Eve keeps a {EVE_MARK} near the pipeline",
                entity_ids=["ingest"],
                source="user",
            ),
        )
        await manager.append(STRANGER, {"role": "user", "content": f"{STRANGER_MARK} pipeline"})
        await manager.save(
            STRANGER,
            Memory(
                content=f"Dana at globex likes {STRANGER_MARK}",
                entity_ids=["ingest"],
                source="user",
            ),
        )
        return Seed(db, owns, rabbit, kafka or "", badge, ids, before)
    finally:
        await manager.close()
        await database.close()


@pytest.fixture(scope="module")
def seeded(module_db: PgDatabase) -> Seed:
    """The module's database with the rows above."""
    return asyncio.run(_seed(module_db))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(db: PgDatabase, settings: InspectorSettings) -> Iterator[str]:
    """The inspector for ``settings`` served by uvicorn on 127.0.0.1 in a thread of its own
    (its own event loop and pools); yields its base URL."""
    import uvicorn

    port = _free_port()
    box: dict[str, Any] = {}

    async def main() -> None:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=4)
        await database.open()
        manager = MemoryManager.from_database(database, embedder=HashingEmbedder(), policy=policy())
        config = uvicorn.Config(
            build_app(manager, settings),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="on",
        )
        server = uvicorn.Server(config)
        box["server"] = server
        try:
            await server.serve()
        finally:
            await manager.close()
            await database.close()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the waiting test
            box["error"] = exc

    thread = threading.Thread(target=run, name="inspector", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (box.get("server") and box["server"].started):
        if "error" in box or not thread.is_alive():
            raise RuntimeError(f"the inspector did not start: {box.get('error')!r}")
        if time.monotonic() > deadline:
            raise RuntimeError("the inspector did not start within 60 s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        box["server"].should_exit = True
        thread.join(timeout=30)
