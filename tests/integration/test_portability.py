"""Export and import of memories as JSON Lines: round trips, idempotence, bad input."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from harbor_pg.commands import progress_bar
from harbor_pg.db.connection import Database
from harbor_pg.embedders import HashingEmbedder
from harbor_pg.errors import MemoryDatabaseError, MemoryValidationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory, MemoryType, Sensitivity
from tests.conftest import PgDatabase, PgServer, _drop_database, _new_database, run_cli

DANA = MemoryOwner(tenant_id="acme", project_id="handbook", principal_id="dana", session_id="s1")
EVE = MemoryOwner(tenant_id="acme", project_id="handbook", principal_id="eve", session_id="s1")


@pytest.fixture
def other_db(pg_server: PgServer) -> Iterator[PgDatabase]:
    db = _new_database(pg_server)
    yield db
    _drop_database(pg_server, db.name)


@pytest_asyncio.fixture
async def managers(
    fresh_db: PgDatabase, other_db: PgDatabase
) -> AsyncIterator[tuple[MemoryManager, MemoryManager]]:
    opened = []
    for db in (fresh_db, other_db):
        database = Database(db.app_url, db.admin_url)
        await database.open()
        opened.append(database)
    try:
        yield tuple(  # type: ignore[misc]
            MemoryManager.from_database(d, embedder=HashingEmbedder(384)) for d in opened
        )
    finally:
        for database in opened:
            await database.close()


async def _seed(manager: MemoryManager) -> dict[str, str]:
    ids = {}
    lisbon = await manager.inject_memory(
        DANA,
        "Dana lives in Lisbon",
        importance=0.8,
        sensitivity=Sensitivity.PII,
        entity_ids=["dana", "lisbon"],
        metadata={"checked": True, "by": "hr"},
    )
    store: Any = manager.long_term
    porto = await store.supersede(DANA, lisbon.memory.id, Memory(content="Dana lives in Porto"))
    ids["lisbon"], ids["porto"] = lisbon.memory.id, porto.memory.id
    turn = await manager.save(
        DANA,
        Memory(
            content="I moved last spring",
            scope=MemoryScope.SESSION,
            memory_type=MemoryType.EPISODE,
            source="user",
            context="Where do you live now?",
            source_session_id="s1",
            source_message_ids=["7", "8"],
        ),
    )
    ids["turn"] = turn.memory.id
    project = await manager.inject_memory(DANA, "The handbook uses pgvector", scope="project")
    ids["project"] = project.memory.id
    tenant = await manager.inject_memory(DANA, "Acme's fiscal year starts in April", scope="tenant")
    ids["tenant"] = tenant.memory.id
    eve = await manager.inject_memory(EVE, "Eve prefers tea")
    ids["eve"] = eve.memory.id
    return ids


def _export(manager: MemoryManager, owner: MemoryOwner, **kw: Any) -> Any:
    async def run() -> str:
        sink = io.StringIO()
        await manager.export_memories(owner, sink, **kw)
        return sink.getvalue()

    return run()


def _count(db: PgDatabase, table: str = "memories") -> int:
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute(f"select count(*) from harbor.{table}").fetchone()
    assert row is not None
    return int(row[0])


async def test_identity_round_trip_is_identical_and_idempotent(
    managers: tuple[MemoryManager, MemoryManager], other_db: PgDatabase
) -> None:
    source, target = managers
    ids = await _seed(source)
    exported = await _export(source, DANA, vectors=True)
    lines = [json.loads(line) for line in exported.splitlines()]
    assert lines[0] == {
        "type": "header",
        "format": "harbor-pg/memories",
        "version": 1,
        "tenant_id": "acme",
        "elevated": False,
        "vectors": True,
    }
    assert lines[-1] == {"type": "end", "memories": len(lines) - 2}
    by_id = {m["id"]: m for m in lines[1:-1]}
    # what dana may see, less the tenant row; eve's user memory is not visible to dana
    assert set(by_id) == {ids["lisbon"], ids["porto"], ids["turn"], ids["project"]}
    old, new = by_id[ids["lisbon"]], by_id[ids["porto"]]
    assert old["superseded_by"] == ids["porto"] and old["invalid_at"] is not None
    assert new["invalid_at"] is None and new["valid_from"] == old["invalid_at"]
    assert (old["sensitivity"], old["metadata"], old["entity_ids"]) == (
        "pii",
        {"checked": True, "by": "hr"},
        ["dana", "lisbon"],
    )
    turn = by_id[ids["turn"]]
    assert turn["context"] == "Where do you live now?"
    assert (turn["source"], turn["source_session_id"], turn["source_message_ids"]) == (
        "user",
        "s1",
        ["7", "8"],
    )
    assert {(v["model_id"], v["with_context"]) for v in turn["vectors"]} == {
        ("hashing-v1-384", False),
        ("hashing-v1-384", True),
    }
    assert len(turn["vectors"][0]["embedding"]) == 384

    report = await target.import_memories(DANA, io.StringIO(exported))
    assert (report.read, report.written, report.duplicates, report.refused) == (4, 4, 0, [])
    assert report.vectors == sum(len(m["vectors"]) for m in by_id.values())
    assert await _export(target, DANA, vectors=True) == exported

    again = await target.import_memories(DANA, io.StringIO(exported))
    assert (again.written, again.duplicates, again.vectors) == (0, 4, 0)
    assert "skipped 4 as duplicates" in again.summary()
    assert await _export(target, DANA, vectors=True) == exported
    assert _count(other_db) == 4

    # the same facts under other ids are duplicates too (the dedup constraint)
    renamed = exported.replace(ids["project"], "another-id")
    third = await target.import_memories(DANA, io.StringIO(renamed))
    assert third.written == 0 and third.duplicates == 4
    assert _count(other_db) == 4


async def test_tenant_round_trip_as_the_administrator(
    managers: tuple[MemoryManager, MemoryManager], other_db: PgDatabase
) -> None:
    source, target = managers
    ids = await _seed(source)
    exported = await _export(source, MemoryOwner(tenant_id="acme"), elevated=True)
    found = {json.loads(line).get("id") for line in exported.splitlines()[1:-1]}
    assert found == set(ids.values())  # every user's, and the tenant row
    assert '"vectors"' not in exported.split("\n", 1)[1]
    report = await target.import_memories(
        MemoryOwner(tenant_id="acme"), io.StringIO(exported), elevated=True, batch_size=2
    )
    assert (report.written, report.refused) == (len(ids), [])
    assert report.vectors > 0  # embedded on the way in: the file carried none
    assert await _export(target, MemoryOwner(tenant_id="acme"), elevated=True) == exported
    # eve, in the target, finds her memory through recall (it was written under her owner)
    assert [m.content for m in await target.recall(EVE, "tea")] == ["Eve prefers tea"]


async def test_lines_the_identity_may_not_write_are_refused_with_reasons(
    managers: tuple[MemoryManager, MemoryManager], other_db: PgDatabase
) -> None:
    source, target = managers
    await _seed(source)
    exported = await _export(source, DANA)
    as_eve = await target.import_memories(EVE, io.StringIO(exported))
    assert as_eve.written == 0 and len(as_eve.refused) == 4
    reasons = dict(as_eve.refused)
    assert sorted(reasons) == [2, 3, 4, 5]
    assert any("user_id 'dana'" in r for r in reasons.values())
    assert any("principal 'dana'" in r for r in reasons.values())  # the project row
    other_tenant = MemoryOwner(tenant_id="zeta", principal_id="dana", session_id="s1")
    refused = await target.import_memories(other_tenant, io.StringIO(exported))
    assert [n for n, _ in refused.refused] == [2, 3, 4, 5]
    assert all("tenant 'acme'" in r for _, r in refused.refused)
    assert _count(other_db) == 0
    tenant_line = await _export(source, MemoryOwner(tenant_id="acme"), elevated=True)
    as_dana = await target.import_memories(DANA, io.StringIO(tenant_line))
    assert any("elevated role" in r for _, r in as_dana.refused)


def _as_session_without_id(line: str) -> str:
    obj = json.loads(line)
    obj.update(scope="session", session_id="")
    return json.dumps(obj) + "\n"


def _memory_lines(exported: str) -> list[str]:
    return exported.splitlines(keepends=True)


@pytest.mark.parametrize(
    ("change", "line", "message"),
    [
        (lambda ls: [*ls[:-1], ls[-1][:-8]], "last", "truncated"),
        (lambda ls: [*ls[:-2], ls[-2][:40]], "second-last", "truncated"),
        (lambda ls: ls[:-1], "after-last", "no end line"),
        (lambda ls: [ls[0].replace('"version":1', '"version":2'), *ls[1:]], 1, "version 2"),
        (lambda ls: ls[1:], 1, "header"),
        (
            lambda ls: [*ls[:2], ls[2].replace('"importance":', '"importance":7,"x":'), *ls[3:]],
            3,
            "importance",
        ),
        (lambda ls: [*ls[:3], '{"type": "memory"\n', *ls[3:]], 4, "not valid JSON"),
        (
            lambda ls: [ls[0], _as_session_without_id(ls[1]), *ls[2:]],
            2,
            "a session memory (needs|stores no)",
        ),
        (lambda ls: [*ls[:-1], '{"type":"end","memories":99}\n'], "last", "counts 99"),
    ],
)
async def test_bad_input_is_reported_by_line_and_writes_nothing(
    managers: tuple[MemoryManager, MemoryManager],
    other_db: PgDatabase,
    change: Any,
    line: Any,
    message: str,
) -> None:
    source, target = managers
    await _seed(source)
    lines = _memory_lines(await _export(source, DANA))
    broken = change(lines)
    expected = {"last": len(broken), "second-last": len(broken), "after-last": len(broken) + 1}
    number = expected.get(line, line)
    with pytest.raises(MemoryValidationError, match=rf"^line {number}: .*{message}"):
        await target.import_memories(DANA, io.StringIO("".join(broken)))
    assert _count(other_db) == 0


async def test_a_failed_batch_leaves_nothing_of_itself(
    managers: tuple[MemoryManager, MemoryManager], other_db: PgDatabase
) -> None:
    source, target = managers
    for i in range(5):
        await source.inject_memory(DANA, f"fact number {i}" if i != 3 else "poison fact")
    exported = await _export(source, DANA)
    # the target database refuses one row (a real server-side failure, mid-batch)
    with psycopg.connect(other_db.superuser_url, autocommit=True) as conn:
        conn.execute(
            "create function public.refuse_poison() returns trigger language plpgsql as $$"
            " begin if new.content like 'poison%' then raise exception 'refused by a trigger';"
            " end if; return new; end $$"
        )
        conn.execute(
            "create trigger refuse_poison before insert on harbor.memories"
            " for each row execute function public.refuse_poison()"
        )
    order = [json.loads(line)["content"] for line in exported.splitlines()[1:-1]]
    poison_line = order.index("poison fact") + 2
    batch_start = 2 + ((poison_line - 2) // 2) * 2
    with pytest.raises(MemoryDatabaseError, match=rf"lines {batch_start}-{batch_start + 1}"):
        await target.import_memories(DANA, io.StringIO(exported), batch_size=2)
    with psycopg.connect(other_db.superuser_url) as conn:
        stored = {r[0] for r in conn.execute("select content from harbor.memories").fetchall()}
    assert stored == set(
        order[: batch_start - 2]
    )  # the earlier batches, nothing of the failing one
    assert _count(other_db, "memory_embeddings") == len(stored)  # one vector each, no context


def test_cli_export_import_summary_and_idempotence(
    fresh_db: PgDatabase, other_db: PgDatabase, tmp_path: Path
) -> None:
    identity = ["--tenant", "acme", "--principal", "dana"]
    with psycopg.connect(fresh_db.app_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('acme', principal_id => 'dana')")
        for fact in ("Dana owns ingest", "Dana reviews billing"):
            conn.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
                " content_hash) values ('acme', 'user', 'dana', 'dana', %s, md5(%s) || md5(%s))",
                (fact, fact, fact + "!"),
            )
    path = tmp_path / "dana.jsonl"
    done = run_cli("export", *identity, "-o", str(path), url=fresh_db.superuser_url)
    assert done.returncode == 0, done.stderr
    assert "exported 2 memories" in done.stderr and "[#" not in done.stderr  # not a terminal
    first = run_cli("import", str(path), *identity, url=other_db.superuser_url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1].startswith("read 2 memories, wrote 2 (")
    second = run_cli("import", str(path), *identity, url=other_db.superuser_url)
    assert "wrote 0 (0 vectors), skipped 2 as duplicates, refused 0" in second.stdout
    back = tmp_path / "back.jsonl"
    assert run_cli("export", *identity, "-o", str(back), url=other_db.superuser_url).returncode == 0
    assert back.read_text() == path.read_text()
    eve = run_cli(
        "import", str(path), "--tenant", "acme", "--principal", "eve", url=other_db.superuser_url
    )
    assert eve.returncode == 1
    assert "line 2: refused: user_id 'dana'" in eve.stderr
    assert "refused 2" in eve.stdout


def test_progress_bar_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert progress_bar(io.StringIO(), "import") is None
    screen = Terminal()
    show = progress_bar(screen, "import")
    assert show is not None
    show(1, 4)
    show(4, 4)
    assert screen.getvalue() == (
        "\rimport [#######-----------------------]  25% 1/4"
        "\rimport [##############################] 100% 4/4\n"
    )
