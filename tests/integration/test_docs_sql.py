"""Every SQL block of README.md and docs/*.md runs as printed, against the
Quickstart's data.

Blocks are found by a line they contain (``SQL_BLOCKS``), so moving one to
another page or adding text around it keeps its test; a new ``sql`` block
anywhere in README.md or docs/ fails ``test_every_sql_block_is_run`` until a
test here runs it (or ``NOT_RUN`` says why it cannot run here).

A block runs as harbor_app (with the identity it sets), except statements that
only a superuser may run (CREATE ROLE, GRANT of a role) and those after a
``-- as harbor_admin, with harbor.set_identity('T'):`` comment, which run as
the elevated role in tenant T, as the comment says.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from harbor_pg.db.connection import Database
from harbor_pg.embedders import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from tests.conftest import PgDatabase, repo_root

_BLOCK = re.compile(r"```sql\n(.*?)```", re.S)
_STATEMENT_END = re.compile(r";[ \t]*(?:--[^\n]*)?\n")
_AS_ADMIN = re.compile(r"--\s*as harbor_admin, with harbor\.set_identity\('([^']+)'\)")
OWNER = MemoryOwner(
    tenant_id="acme", project_id="handbook", principal_id="dana", session_id="s1", run_id="r1"
)
DEFAULT_MODEL = "BAAI/bge-small-en-v1.5"


#: Each block a test runs: the page it is on and a line that finds it there.
SQL_BLOCKS = {
    "identity": ("README.md", "select content, scope from harbor.memories;"),
    "recall": ("docs/recall.md", "from harbor.recall('who owns ingest?', top_k => 5);"),
    "views": ("docs/recall.md", "select content from harbor.current_memories;"),
    "bound role": ("docs/security.md", "grant harbor_app to analyst;"),
    "erase": ("docs/operations.md", "from harbor.erase(user_id => 'dana');"),
    "physical erasure": ("docs/operations.md", "vacuum (full) harbor.messages,"),
    "failed jobs": ("docs/operations.md", "join harbor_jobs.job_errors e on e.job_id = j.id"),
}
#: Blocks that cannot run against one embedded server, and why.
NOT_RUN = {
    ("docs/citus.md", "create extension citus;"): "needs a Citus node, and psql's \\c",
}


def page_blocks() -> dict[str, list[str]]:
    """Every sql block of README.md and docs/*.md, by page (relative path)."""
    root = repo_root()
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return {
        p.relative_to(root).as_posix(): _BLOCK.findall(p.read_text(encoding="utf-8")) for p in pages
    }


def _find(page: str, line: str) -> list[str]:
    return [b for b in page_blocks().get(page, []) if line in b]


def sql_block(name: str) -> str:
    page, line = SQL_BLOCKS[name]
    found = _find(page, line)
    assert len(found) == 1, f"{name!r}: {len(found)} sql blocks in {page} contain {line!r}"
    return found[0]


def statements(block: str) -> list[str]:
    parts, start = [], 0
    for end in _STATEMENT_END.finditer(block):
        parts.append(block[start : end.end()].strip())
        start = end.end()
    rest = block[start:].strip()
    assert not rest or rest.startswith("--"), f"a statement without its semicolon: {rest!r}"
    return parts


@pytest_asyncio.fixture
async def quickstart(fresh_db: PgDatabase) -> AsyncIterator[PgDatabase]:
    """The Quickstart's memory, with a vector under the default embedder's model id."""
    db = Database(fresh_db.app_url, fresh_db.admin_url)
    await db.open()
    try:
        manager = MemoryManager.from_database(db)
        vector = (await HashingEmbedder(384).embed(["Dana owns the ingest pipeline"]))[0]
        await manager.save(
            OWNER,
            Memory(content="Dana owns the ingest pipeline"),
            embedding=vector,
            model_id=DEFAULT_MODEL,
        )
        await manager.inject_memory(OWNER, "The handbook uses pgvector", scope="project")
    finally:
        await db.close()
    yield fresh_db


def _run_block(
    db: PgDatabase, block: str, prelude: str | None = None
) -> list[list[tuple[Any, ...]]]:
    """Run ``block`` statement by statement as its comments say (harbor_app unless it
    names harbor_admin; role and maintenance statements as the server's operator),
    after ``prelude`` on the application connection."""
    results: list[list[tuple[Any, ...]]] = []
    with (
        psycopg.connect(db.app_url, autocommit=True) as app,
        psycopg.connect(db.superuser_url, autocommit=True) as su,
        psycopg.connect(db.admin_url, autocommit=True) as admin,
    ):
        conn = app
        if prelude:
            app.execute(prelude)
        for statement in statements(block):
            switch = _AS_ADMIN.search(statement)
            if switch:
                admin.execute("select harbor.set_identity(%s)", (switch.group(1),))
                conn = admin
            elif re.match(
                r"(create role|grant \w+ to|vacuum|checkpoint|select pg_switch_wal)",
                statement,
                re.I,
            ):
                conn = su
            cur = conn.execute(statement.replace("%", "%%"))
            results.append(cur.fetchall() if cur.description else [])
            if conn is su:
                conn = app
    return results


def test_every_sql_block_is_run() -> None:
    claimed = [*SQL_BLOCKS.values(), *NOT_RUN]
    for page, line in claimed:
        assert len(_find(page, line)) == 1, f"no single sql block in {page} contains {line!r}"
    unclaimed = [
        (page, block.splitlines()[0])
        for page, blocks in page_blocks().items()
        for block in blocks
        if not any(p == page and line in block for p, line in claimed)
    ]
    assert unclaimed == [], "a sql block no test runs: add it to SQL_BLOCKS and test it"


def test_identity_block(quickstart: PgDatabase) -> None:
    _, rows = _run_block(quickstart, sql_block("identity"))
    # no project in this identity: the project's memory is not dana's to see here
    assert rows == [("Dana owns the ingest pipeline", "user")]


def test_recall_blocks_run_as_printed(quickstart: PgDatabase) -> None:
    _, lexical, dense = _run_block(quickstart, sql_block("recall"))
    assert lexical[0][1] == "Dana owns the ingest pipeline"
    rank, content, dense_rank, similarity, score = dense[0]
    assert (rank, content, dense_rank) == (1, "Dana owns the ingest pipeline", 1)
    assert similarity == pytest.approx(1.0, abs=1e-5) and score > 0


def test_bound_role_block(quickstart: PgDatabase) -> None:
    try:
        _run_block(quickstart, sql_block("bound role"))
        analyst = psycopg.conninfo.make_conninfo(quickstart.app_url, user="analyst")
        with psycopg.connect(analyst, autocommit=True) as conn:
            conn.execute("select harbor.set_identity('acme')")
            rows = conn.execute("select content, scope from harbor.memories").fetchall()
        assert rows == [("The handbook uses pgvector", "project")]
    finally:
        with psycopg.connect(quickstart.superuser_url, autocommit=True) as su:
            su.execute("delete from harbor.role_bindings where role_name = 'analyst'")
            su.execute("drop role if exists analyst")


def test_views_block(quickstart: PgDatabase) -> None:
    with psycopg.connect(quickstart.superuser_url) as su:
        [(memory_id,)] = su.execute(
            "select id from harbor.memories where content = 'Dana owns the ingest pipeline'"
        ).fetchall()
    block = sql_block("views").replace("'...'", f"'{memory_id}'")
    current, history = _run_block(
        quickstart, block, prelude="select harbor.set_identity('acme', principal_id => 'dana')"
    )
    assert current == [("Dana owns the ingest pipeline",)]
    [(version, content, valid_from, valid_to)] = history
    assert (version, content, valid_to) == (1, "Dana owns the ingest pipeline", None)
    assert valid_from is not None


def test_physical_erasure_block(quickstart: PgDatabase) -> None:
    results = _run_block(quickstart, sql_block("physical erasure"))
    # vacuum, checkpoint, then the WAL switch (and its checkpoint) on one line
    assert len(results) == 3
    [(lsn,)] = results[2]
    assert "/" in str(lsn)


def test_erase_block(quickstart: PgDatabase) -> None:
    receipt, [(left,)] = _run_block(quickstart, sql_block("erase"))
    counts = dict(receipt)
    # dana's USER memory and the PROJECT memory dana wrote, and the one vector
    assert (counts["long_term"], counts["embeddings"]) == (2, 1)
    assert left == 0
    with psycopg.connect(quickstart.superuser_url) as su:
        [(remaining,)] = su.execute("select count(*) from harbor.memories").fetchall()
    assert remaining == 0


def test_failed_jobs_block(quickstart: PgDatabase) -> None:
    with psycopg.connect(quickstart.app_url) as app:
        app.execute(
            "select harbor.set_identity('acme', principal_id => 'dana', session_id => 's1')"
        )
        [(ids,)] = app.execute("select harbor_jobs.queue_turn_jobs(1, true, false, 0)").fetchall()
    with psycopg.connect(quickstart.admin_url) as admin:
        admin.execute(
            "update harbor_jobs.procrastinate_jobs set status = 'failed', attempts = 1"
            " where id = %s",
            (ids[0],),
        )
        admin.execute(
            "insert into harbor_jobs.job_errors (job_id, attempt, error) values (%s, 0, %s)",
            (ids[0], "MemoryModelError: rate limited"),
        )
    [rows] = _run_block(quickstart, sql_block("failed jobs"))
    [(job_id, task, args, attempts, attempt, error, raw)] = rows
    assert (job_id, task, attempts, attempt, error, raw) == (
        ids[0],
        "harbor.extract_turn",
        1,
        0,
        "MemoryModelError: rate limited",
        None,
    )
    assert args["message_id"] == 1
