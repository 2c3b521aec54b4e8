"""A long migration step says how far it has got.

Rebuilding the HNSW graph of a million vectors takes minutes (migration 0006:
756 s on the benchmark machine). While an index is built on a harbor table,
``migrate.upgrade`` and ``migrate.downgrade`` report it every few seconds
from a thread with a connection of its own; a quick migration reports nothing.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from harbor_pg.db import migrate
from tests.conftest import PgDatabase


def test_a_row_of_the_progress_view_reads_as_one_line() -> None:
    row = {
        "table_name": "harbor.memory_embeddings",
        "command": "CREATE INDEX",
        "phase": "building index: loading tuples",
        "blocks_done": 108_544,
        "blocks_total": 200_001,
        "tuples_done": 542_586,
        "tuples_total": 0,
        "seconds": 336,
    }
    assert migrate.describe_index_progress(row) == (
        "migrating: create index on harbor.memory_embeddings: building index: loading tuples,"
        " 108,544 of 200,001 blocks (54%), 5 min 36 s so far"
    )
    rows = {**row, "blocks_total": 0, "tuples_done": 10, "tuples_total": 40, "seconds": 7}
    assert migrate.describe_index_progress(rows).endswith(
        "loading tuples, 10 of 40 rows (25%), 0 min 07 s so far"
    )
    bare = {**row, "blocks_total": 0, "tuples_total": 0, "seconds": None, "phase": "initializing"}
    assert migrate.describe_index_progress(bare) == (
        "migrating: create index on harbor.memory_embeddings: initializing, 0 min 00 s so far"
    )


def _build_watched(db: PgDatabase, table: str) -> tuple[list[str], float]:
    """Build an index on a new 600,000-row ``table`` while progress is reported
    every 0.05 s; return the reports and how long the build took."""
    lines: list[str] = []
    with psycopg.connect(db.superuser_url, autocommit=True) as conn:
        conn.execute(
            f"create table {table} as select md5(g::text) as t from generate_series(1, 600000) g"
        )
        started = time.perf_counter()
        with migrate._index_progress(db.superuser_url, lines.append, 0.05):
            conn.execute(f"create index on {table} (t)")
        took = time.perf_counter() - started
        conn.execute(f"drop table {table}")
    assert took > 0.2, f"the build took {took:.2f}s: too quick to be seen"
    return lines, took


def test_an_index_build_on_a_harbor_table_is_reported(fresh_db: PgDatabase) -> None:
    lines, _took = _build_watched(fresh_db, "harbor.progress_probe")
    assert lines, "no report during the build"
    assert all(
        line.startswith("migrating: create index on harbor.progress_probe: ") for line in lines
    ), lines
    assert all(line.endswith(" so far") for line in lines)


def test_a_quick_migration_reports_nothing_and_does_not_wait(fresh_db: PgDatabase) -> None:
    lines: list[str] = []
    started = time.perf_counter()
    migrate.upgrade(fresh_db.owner_url, progress=lines.append, progress_interval=30)
    assert time.perf_counter() - started < 10
    assert lines == []


def test_index_builds_elsewhere_are_not_reported(fresh_db: PgDatabase) -> None:
    lines, _took = _build_watched(fresh_db, "public.not_ours")
    assert lines == []


@pytest.mark.parametrize("interval", [0.01, 0.2])
def test_a_failing_report_never_reaches_the_migration(interval: float) -> None:
    calls: list[str] = []
    unreachable = "postgresql://nobody@/harbor?host=/nonexistent-socket-dir&connect_timeout=1"
    with migrate._index_progress(unreachable, calls.append, interval):
        time.sleep(0.3)
    assert calls == []
