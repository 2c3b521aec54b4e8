"""Run the Alembic migrations shipped with harbor-pg."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from typing import Any

import psycopg
import sqlalchemy.exc
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from psycopg.rows import dict_row

from harbor_pg.db.server import OWNER_ROLE, describe_connect_error, redact, scrub
from harbor_pg.db.sqlfiles import query
from harbor_pg.errors import MemoryConfigurationError, MemoryDatabaseError

__all__ = ["alembic_config", "current_revision", "downgrade", "head_revision", "upgrade"]

log = logging.getLogger(__name__)

#: Seconds between two progress reports of a running migration.
PROGRESS_INTERVAL = 10.0


def _sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if "://" not in url:  # key=value conninfo
        return "postgresql+psycopg:///?" + "&".join(p.replace("'", "") for p in url.split())
    return url


def alembic_config(owner_url: str) -> Config:
    """An Alembic config for the shipped migrations, pointed at ``owner_url``."""
    location = resources.files("harbor_pg._migrations")
    cfg = Config(str(location.joinpath("alembic.ini")), stdout=io.StringIO())
    cfg.set_main_option("script_location", str(location))
    cfg.attributes["url"] = owner_url
    return cfg


def upgrade(
    owner_url: str,
    revision: str = "head",
    *,
    progress: Callable[[str], None] | None = log.info,
    progress_interval: float = PROGRESS_INTERVAL,
) -> None:
    """Migrate the database to ``revision`` (default: the newest).

    Some steps rebuild an index over every stored vector (minutes for a
    million). While one runs, ``progress`` gets a line every
    ``progress_interval`` seconds saying how far it has got (by default the
    ``harbor_pg.db.migrate`` logger at INFO; ``None`` for silence). A
    migration that ends sooner reports nothing and opens no extra connection.

    Raises :class:`MemoryConfigurationError` when the login may not migrate
    or the database lacks an extension, :class:`MemoryDatabaseError` for any
    other database failure; never a driver traceback, never the password.
    """
    _run(command.upgrade, owner_url, revision, progress, progress_interval)


def downgrade(
    owner_url: str,
    revision: str = "base",
    *,
    progress: Callable[[str], None] | None = log.info,
    progress_interval: float = PROGRESS_INTERVAL,
) -> None:
    """Migrate the database down to ``revision`` (default: nothing left),
    reporting long index builds as :func:`upgrade` does."""
    _run(command.downgrade, owner_url, revision, progress, progress_interval)


def _run(
    step: Callable[[Config, str], None],
    owner_url: str,
    revision: str,
    progress: Callable[[str], None] | None,
    progress_interval: float,
) -> None:
    """One Alembic command as the schema owner: errors as harbor errors, long
    index builds reported."""
    _require_owner(owner_url, "migrate the schema")
    with (
        _migration_errors(owner_url, revision),
        _index_progress(owner_url, progress, progress_interval),
    ):
        step(alembic_config(owner_url), revision)


@contextmanager
def _index_progress(
    url: str, report: Callable[[str], None] | None, interval: float
) -> Iterator[None]:
    """While the body runs, report the index builds on harbor tables every
    ``interval`` seconds, from a thread with a connection of its own (opened at
    the first report). Reporting is best effort: a failure stops it quietly
    and never reaches the migration."""
    if report is None or interval <= 0:
        yield
        return
    done = threading.Event()

    def poll() -> None:
        conn: psycopg.Connection[dict[str, Any]] | None = None
        try:
            while not done.wait(interval):
                if conn is None:
                    conn = psycopg.connect(
                        url, autocommit=True, connect_timeout=10, row_factory=dict_row
                    )
                for row in conn.execute(query("index_build_progress")).fetchall():
                    if not done.is_set():
                        report(describe_index_progress(row))
        except Exception as exc:  # progress must never fail a migration
            log.debug("migration progress reporting stopped: %s", scrub(_first_line(exc), url))
        finally:
            if conn is not None:
                conn.close()

    thread = threading.Thread(target=poll, name="harbor-migrate-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=15)


def describe_index_progress(row: Mapping[str, Any]) -> str:
    """One line for a row of ``pg_stat_progress_create_index`` (query
    ``index_build_progress``): what is built on which table, the phase, how
    much is done and for how long."""
    amount = ""
    if row.get("blocks_total"):
        done, total = int(row["blocks_done"] or 0), int(row["blocks_total"])
        amount = f", {done:,} of {total:,} blocks ({100 * done // total}%)"
    elif row.get("tuples_total"):
        done, total = int(row["tuples_done"] or 0), int(row["tuples_total"])
        amount = f", {done:,} of {total:,} rows ({100 * done // total}%)"
    minutes, seconds = divmod(max(int(row.get("seconds") or 0), 0), 60)
    return (
        f"migrating: {str(row['command']).lower()} on {row['table_name']}: {row['phase']}"
        f"{amount}, {minutes} min {seconds:02d} s so far"
    )


@contextmanager
def _connect(url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A short autocommit connection whose failures come out as harbor errors."""
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10, row_factory=dict_row)
    except psycopg.Error as exc:
        raise MemoryConfigurationError(describe_connect_error(url, exc)) from None
    try:
        with conn:
            yield conn
    except psycopg.Error as exc:
        raise MemoryDatabaseError(
            f"database error at {redact(url)}: {scrub(_first_line(exc), url)}"
        ) from None


def _login(conn: psycopg.Connection[dict[str, Any]]) -> dict[str, Any]:
    row = conn.execute(query("migration_login")).fetchone()
    assert row is not None
    return row


def _require_owner(url: str, action: str) -> None:
    with _connect(url) as conn:
        row = _login(conn)
    if not row["is_owner"]:
        raise MemoryConfigurationError(_not_owner(row, action))


def _not_owner(row: dict[str, Any], action: str) -> str:
    if not row["owner_exists"]:
        return (
            f"login {row['login']!r} cannot {action}: the role {OWNER_ROLE} does not exist "
            "on this server; run sql/roles.sql as a superuser (or point HARBOR_DATABASE_URL "
            "at a superuser once, which creates the roles)"
        )
    return (
        f"login {row['login']!r} cannot {action}: that needs the schema owner {OWNER_ROLE} "
        f"(or a role that is a member of it, or a superuser); point HARBOR_DATABASE_URL "
        f"(or --database-url) at {OWNER_ROLE} for `harbor-pg migrate` and `harbor-pg status`. "
        "Applications connect as harbor_app."
    )


@contextmanager
def _migration_errors(url: str, revision: str) -> Iterator[None]:
    try:
        yield
    except CommandError as exc:  # an unknown revision, say
        raise MemoryConfigurationError(
            f"cannot migrate to {revision!r}: {scrub(_first_line(exc), url)}"
        ) from None
    except sqlalchemy.exc.DBAPIError as exc:
        raise _describe_migration_error(url, revision, exc.orig or exc) from None
    except psycopg.Error as exc:
        raise _describe_migration_error(url, revision, exc) from None


def _describe_migration_error(url: str, revision: str, exc: BaseException) -> Exception:
    text = scrub(_first_line(exc), url)
    low = text.lower()
    where = redact(url)
    if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        return MemoryConfigurationError(describe_connect_error(url, exc))
    if 'access method "gist"' in low or 'type "vector"' in low or "extension" in low:
        return MemoryConfigurationError(
            f"migrating {where} to {revision} failed: {text}. The vector and btree_gist "
            "extensions must be installed in this database: as a superuser, run "
            "`create extension if not exists vector; create extension if not exists "
            "btree_gist;` in it"
        )
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return MemoryConfigurationError(f"migrating {where} to {revision} failed: {text}")
    return MemoryDatabaseError(f"migrating {where} to {revision} failed: {text}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def head_revision() -> str | None:
    """The newest revision shipped."""
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused"))
    return script.get_current_head()


def current_revision(url: str) -> str | None:
    """The revision the database is at (None for an empty database).

    Raises :class:`MemoryConfigurationError` when the login may not read the
    Alembic version table (the application role, say).
    """
    with _connect(url) as conn:
        login = _login(conn)
        if not login["has_version_table"]:
            return None
        if not login["can_read_version"]:
            raise MemoryConfigurationError(
                _not_owner(login, "read the schema revision (public.harbor_alembic_version)")
            )
        row = conn.execute(query("schema_revision")).fetchone()
    return None if row is None else str(row["version_num"])
