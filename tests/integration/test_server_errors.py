"""Configuration mistakes end in one clear error, never a driver traceback or a password.

Each case checks the error class, its message, and that the password in the
URL does not appear anywhere in what the user sees (through the Python API and
through the ``harbor-pg`` command, run as a subprocess).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from harbor_pg import cli
from harbor_pg.db import migrate, server
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager
from tests.conftest import PgDatabase, PgServer, _drop_database, run_cli, run_cli_process

SECRET = "Hunter2-do-not-print"
EXPECTED = "expected postgresql://user:password@host:port/dbname or key=value pairs"


def _assert_clean_cli_error(out: subprocess.CompletedProcess[str], message: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert SECRET not in out.stderr + out.stdout
    lines = out.stderr.strip().splitlines()
    assert lines == [f"harbor-pg: error: {message}"], out.stderr


def _with_password(url: str, **params: Any) -> str:
    return conninfo.make_conninfo(url, password=SECRET, **params)


# -- malformed or non-PostgreSQL URLs ----------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            f"mysql://u:{SECRET}@localhost/x",
            f"the database URL mysql://u:***@localhost/x is not a PostgreSQL URL "
            f"(scheme 'mysql'; {EXPECTED})",
        ),
        (
            "garbage in here",
            f'the database URL is malformed: missing "=" after "garbage" in connection info '
            f"string ({EXPECTED})",
        ),
        (
            f"u:{SECRET}@localhost",
            f'the database URL is malformed: missing "=" after "u:***@localhost" in connection '
            f"info string ({EXPECTED})",
        ),
        (
            f"host=localhost password={SECRET} bogus=1",
            f'the database URL is malformed: invalid connection option "bogus" ({EXPECTED})',
        ),
        (
            f"postgresql://u:{SECRET}@[::1/x",
            "the database URL is malformed: end of string reached when looking for matching "
            f'"]" in IPv6 host address in URI: "postgresql://u:***@[::1/x" ({EXPECTED})',
        ),
    ],
    ids=["mysql", "garbage", "userinfo-without-scheme", "unknown-option", "broken-ipv6"],
)
def test_bad_url_is_one_clear_error(url: str, message: str) -> None:
    with pytest.raises(MemoryConfigurationError) as info:
        server.check_server(url)
    assert str(info.value) == message
    assert SECRET not in str(info.value)
    # no driver exception chained on (its text would carry the password)
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_bad_url_from_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARBOR_DATABASE_URL", f"mysql://u:{SECRET}@localhost/x")
    with pytest.raises(MemoryConfigurationError) as info:
        server.resolve_server()
    assert str(info.value) == (
        f"HARBOR_DATABASE_URL mysql://u:***@localhost/x is not a PostgreSQL URL "
        f"(scheme 'mysql'; {EXPECTED})"
    )


@pytest.mark.parametrize(
    "url", [f"mysql://u:{SECRET}@localhost/x", "garbage in here"], ids=["mysql", "garbage"]
)
async def test_manager_create_with_a_bad_url_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("HARBOR_DATABASE_URL", url)
    with pytest.raises(MemoryConfigurationError, match=r"^HARBOR_DATABASE_URL .*") as info:
        await MemoryManager.create(embeddings=False)
    assert SECRET not in str(info.value)
    assert "PostgreSQL URL" in str(info.value) or "is malformed" in str(info.value)


def test_cli_status_with_a_mysql_url() -> None:
    # in a process of its own: what the installed command prints when it refuses a URL
    out = run_cli_process("status", url=f"mysql://u:{SECRET}@localhost/x")
    _assert_clean_cli_error(
        out,
        f"HARBOR_DATABASE_URL mysql://u:***@localhost/x is not a PostgreSQL URL "
        f"(scheme 'mysql'; {EXPECTED})",
    )


def test_cli_migrate_with_garbage() -> None:
    out = run_cli("migrate", url="garbage in here")
    _assert_clean_cli_error(
        out,
        f'HARBOR_DATABASE_URL is malformed: missing "=" after "garbage" in connection info '
        f"string ({EXPECTED})",
    )


def test_cli_last_resort_for_driver_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql://bob:{SECRET}@db.example/x"

    def boom(args: Any) -> int:
        raise psycopg.errors.InsufficientPrivilege(f"permission denied near {url}\nDETAIL: more")

    monkeypatch.setattr(cli, "cmd_status", boom)
    code = cli.main(["--database-url", url, "status"])
    err = capsys.readouterr().err
    assert code == 2
    # the same map as every other path: a refused privilege is "not permitted"
    assert err == (
        "harbor-pg: error: not permitted: permission denied near postgresql://bob:***@db.example/x\n"
    )


# -- extensions available in the cluster but not installed in the database ----------


@pytest.fixture
def bare_db(pg_server: PgServer) -> Iterator[PgDatabase]:
    """A database with the harbor roles' grants but no extensions (and no schema)."""
    name = f"harbor_bare_{os.getpid()}"
    _drop_database(pg_server, name)
    with psycopg.connect(pg_server.superuser_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
        conn.execute(f'grant create, connect on database "{name}" to harbor_owner')
        conn.execute(f'grant connect on database "{name}" to harbor_app, harbor_admin')
    with psycopg.connect(pg_server.url(name), autocommit=True) as conn:
        conn.execute("grant create on schema public to harbor_owner")
    yield PgDatabase(
        name=name,
        superuser_url=pg_server.url(name),
        app_url=pg_server.url(name, "harbor_app"),
        admin_url=pg_server.url(name, "harbor_admin"),
        owner_url=pg_server.url(name, "harbor_owner"),
    )
    _drop_database(pg_server, name)


def test_non_superuser_without_installed_extensions(bare_db: PgDatabase) -> None:
    url = _with_password(bare_db.owner_url)
    with pytest.raises(MemoryConfigurationError) as info:
        server.check_server(url)
    text = str(info.value)
    assert SECRET not in text and "***" in text
    assert text.endswith(
        f"has vector and btree_gist available but not installed in database "
        f"'{bare_db.name}', and login 'harbor_owner' is not a superuser, so harbor-pg cannot "
        "create them: as a superuser, run `create extension if not exists vector; "
        f"create extension if not exists btree_gist;` in database '{bare_db.name}'"
    ), text


def test_non_superuser_missing_only_btree_gist(bare_db: PgDatabase) -> None:
    with psycopg.connect(bare_db.superuser_url, autocommit=True) as conn:
        conn.execute("create extension vector")
    url = _with_password(bare_db.owner_url)
    with pytest.raises(MemoryConfigurationError) as info:
        server.check_server(url)
    text = str(info.value)
    assert SECRET not in text
    assert "has btree_gist available but not installed" in text
    assert "cannot create it: as a superuser, run `create extension if not exists btree_gist;`" in (
        text
    )
    assert "extension if not exists vector" not in text


def test_superuser_only_needs_the_extensions_available(bare_db: PgDatabase) -> None:
    # a superuser login gets them created, so available is enough
    assert server.check_server(bare_db.superuser_url) is True


def test_cli_migrate_names_the_missing_create_extension(bare_db: PgDatabase) -> None:
    with psycopg.connect(bare_db.superuser_url, autocommit=True) as conn:
        conn.execute("create extension vector")
    out = run_cli("migrate", url=_with_password(bare_db.owner_url))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and SECRET not in out.stderr
    assert "default operator class" not in out.stderr
    assert "run `create extension if not exists btree_gist;`" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert migrate.current_revision(bare_db.owner_url) is None


def test_upgrade_wraps_the_driver_error(bare_db: PgDatabase) -> None:
    # straight to migrate.upgrade, without check_server: the migration itself fails
    with psycopg.connect(bare_db.superuser_url, autocommit=True) as conn:
        conn.execute("create extension vector")
    url = _with_password(bare_db.owner_url)
    with pytest.raises(MemoryConfigurationError) as info:
        migrate.upgrade(url)
    text = str(info.value)
    assert SECRET not in text
    assert text.startswith(f"migrating {server.redact(url)} to head failed: ")
    assert 'data type text has no default operator class for access method "gist"' in text
    assert text.endswith(
        "as a superuser, run `create extension if not exists vector; create extension if not "
        "exists btree_gist;` in it"
    )
    # the failed migration left nothing half-done
    assert migrate.current_revision(bare_db.owner_url) is None


# -- logging in as the application role ---------------------------------------------

APP_NEEDS_OWNER = (
    "(or a role that is a member of it, or a superuser); point HARBOR_DATABASE_URL "
    "(or --database-url) at harbor_owner for `harbor-pg migrate` and `harbor-pg status`. "
    "Applications connect as harbor_app."
)


def test_current_revision_as_the_app_role(fresh_db: PgDatabase) -> None:
    with pytest.raises(MemoryConfigurationError) as info:
        migrate.current_revision(_with_password(fresh_db.app_url))
    assert str(info.value) == (
        "login 'harbor_app' cannot read the schema revision (public.harbor_alembic_version): "
        f"that needs the schema owner harbor_owner {APP_NEEDS_OWNER}"
    )


def test_upgrade_as_the_app_role(fresh_db: PgDatabase) -> None:
    with pytest.raises(MemoryConfigurationError) as info:
        migrate.upgrade(_with_password(fresh_db.app_url))
    assert str(info.value) == (
        "login 'harbor_app' cannot migrate the schema: that needs the schema owner "
        f"harbor_owner {APP_NEEDS_OWNER}"
    )


def test_owner_role_reads_the_revision(fresh_db: PgDatabase) -> None:
    # the same call succeeds for the owner: the check above is not a blanket refusal
    assert migrate.current_revision(_with_password(fresh_db.owner_url)) == migrate.head_revision()


@pytest.mark.parametrize("command", ["status", "migrate"])
def test_cli_as_the_app_role(fresh_db: PgDatabase, command: str) -> None:
    out = run_cli(command, url=_with_password(fresh_db.app_url))
    _assert_clean_cli_error(
        out,
        "login 'harbor_app' cannot read the schema revision (public.harbor_alembic_version): "
        f"that needs the schema owner harbor_owner {APP_NEEDS_OWNER}",
    )


def test_cli_migrate_to_an_unknown_revision(fresh_db: PgDatabase) -> None:
    out = run_cli("migrate", "--revision", "nope", url=_with_password(fresh_db.owner_url))
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and SECRET not in out.stderr
    assert out.stderr.startswith("harbor-pg: error: cannot migrate to 'nope': ")
