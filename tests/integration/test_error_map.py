"""A database error reads the same whichever path met it: the migration
helpers, a migration step, the ``harbor-pg`` command and its last resort all
report it as :mod:`harbor_pg.db.errors` maps it (same exception class, same
wording), on a real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harbor_pg import cli
from harbor_pg.db import migrate
from harbor_pg.db.errors import redact
from harbor_pg.errors import MemoryDatabaseError, MemoryValidationError
from tests.conftest import PgDatabase, run_cli

LOCK_TIMEOUT = "database error: canceling statement due to lock timeout"
BAD_INTEGER = 'rejected by the database: invalid input syntax for type integer: "x"'


@pytest.fixture
def locked_version_table(fresh_db: PgDatabase) -> Iterator[str]:
    """The owner's URL with a short lock timeout, while another session holds
    the Alembic version table: reading the schema revision fails, on a live
    server, with SQLSTATE 55P03 (lock not available)."""
    with psycopg.connect(fresh_db.superuser_url) as holder:
        holder.execute("lock table public.harbor_alembic_version in access exclusive mode")
        # a URL (a migration hands it on to SQLAlchemy as it is); libpq reads
        # no '+' as a space in it
        url = cli.as_url(fresh_db.owner_url)
        yield url + ("&" if "?" in url else "?") + "options=-c%20lock_timeout%3D200"
        holder.rollback()


def test_a_failed_read_is_the_same_error_on_the_migrate_and_cli_paths(
    locked_version_table: str,
) -> None:
    url = locked_version_table
    with pytest.raises(MemoryDatabaseError) as info:
        migrate.current_revision(url)
    assert type(info.value) is MemoryDatabaseError
    assert str(info.value) == LOCK_TIMEOUT

    for command in ("status", "migrate"):
        out = run_cli(command, url=url)
        assert out.returncode == 2, (out.stdout, out.stderr)
        assert out.stderr == f"harbor-pg: error: {LOCK_TIMEOUT}\n"


def test_a_failed_migration_step_uses_the_same_wording(locked_version_table: str) -> None:
    url = locked_version_table
    with pytest.raises(MemoryDatabaseError) as info:
        migrate.upgrade(url, known_state=())
    assert type(info.value) is MemoryDatabaseError
    assert str(info.value) == f"migrating {redact(url)} to head failed: {LOCK_TIMEOUT}"


def test_the_cli_last_resort_reports_as_the_map_does(
    fresh_db: PgDatabase, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the migrate path's connection helper, on bad input
    with pytest.raises(MemoryValidationError) as info, migrate._connect(fresh_db.owner_url) as conn:
        conn.execute("select 'x'::int")
    assert str(info.value) == BAD_INTEGER

    # the same statement failing inside a command, with nothing there to catch it
    def status(args: Any) -> int:
        with psycopg.connect(fresh_db.app_url) as conn:
            conn.execute("select 'x'::int")
        return 0

    monkeypatch.setattr(cli, "cmd_status", status)
    code = cli.main(["--database-url", fresh_db.owner_url, "status"])
    assert code == 2
    assert capsys.readouterr().err == f"harbor-pg: error: {BAD_INTEGER}\n"
