"""Run the Alembic migrations shipped with harbor-pg."""

from __future__ import annotations

import functools
import io
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from harbor_pg.db.errors import (
    connect_errors,
    driver_errors,
    first_line,
    migration_error,
    scrub,
)
from harbor_pg.db.server import OWNER_ROLE
from harbor_pg.db.sqlfiles import idempotent_sha256, query
from harbor_pg.errors import MemoryConfigurationError

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic and SQLAlchemy (about half a second of imports) load only when a
# migration actually runs: a start against an up-to-date schema is decided by
# one query (:func:`is_current`) and never imports them.

__all__ = [
    "alembic_config",
    "current_revision",
    "downgrade",
    "head_revision",
    "is_current",
    "upgrade",
]

log = logging.getLogger(__name__)

#: Seconds between two progress reports of a running migration.
PROGRESS_INTERVAL = 10.0


def _sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if "://" not in url:  # key=value conninfo: libpq's own parse (quoted values included)
        params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
        return "postgresql+psycopg:///?" + urlencode(params, quote_via=quote)
    return url


def alembic_config(owner_url: str) -> Config:
    """An Alembic config for the shipped migrations, pointed at ``owner_url``."""
    from alembic.config import Config

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
    known_state: Sequence[tuple[str, str]] | None = None,
) -> None:
    """Migrate the database to ``revision`` (default: the newest).

    Some steps rebuild an index over every stored vector (minutes for a
    million). While one runs, ``progress`` gets a line every
    ``progress_interval`` seconds saying how far it has got (by default the
    ``harbor_pg.db.migrate`` logger at INFO; ``None`` for silence). A
    migration that ends sooner reports nothing and opens no extra connection.

    Raises :class:`MemoryConfigurationError` when the login may not migrate
    or the database lacks an extension; any other database failure comes out
    as :mod:`harbor_pg.db.errors` maps it (a :class:`MemoryDatabaseError` for
    most); never a driver traceback, never the password.

    A database already at the newest revision, with the re-runnable SQL this
    package ships, costs one connection and one catalog query
    (:func:`is_current`): no lock, no change, no Alembic. ``known_state``:
    the rows of query ``migration_state`` just read on another connection to
    the same database (:attr:`ServerInfo.schema_state`); when they say it is
    current, not even that connection is opened.
    """
    if revision == "head" and (
        (known_state is not None and _current(known_state)) or is_current(owner_url)
    ):
        return
    from alembic import command

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
    from alembic import command

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
            log.debug("migration progress reporting stopped: %s", scrub(first_line(exc), url))
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
    with connect_errors(url):
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10, row_factory=dict_row)
    with driver_errors(url), conn:
        yield conn


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
    import sqlalchemy.exc
    from alembic.util import CommandError

    try:
        yield
    except CommandError as exc:  # an unknown revision, say
        raise MemoryConfigurationError(
            f"cannot migrate to {revision!r}: {scrub(first_line(exc), url)}"
        ) from None
    except sqlalchemy.exc.DBAPIError as exc:
        raise migration_error(url, revision, exc.orig or exc) from None
    except psycopg.Error as exc:
        raise migration_error(url, revision, exc) from None


def head_revision() -> str | None:
    """The newest revision shipped."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config("postgresql://unused"))
    return script.get_current_head()


_REVISION = re.compile(r"^revision\s*=\s*[\"']([^\"']+)[\"']\s*$", re.MULTILINE)
_DOWN_REVISION = re.compile(r"^down_revision\s*=\s*(None|[\"']([^\"']+)[\"'])\s*$", re.MULTILINE)


@functools.cache
def shipped_head() -> str | None:
    """The newest revision shipped, read from the revision files' ``revision``
    and ``down_revision`` lines without loading Alembic (a few milliseconds).

    None when the history is not one line of plain assignments (several heads,
    a merge, a file this cannot read): callers then ask Alembic
    (:func:`head_revision`), which this always agrees with otherwise
    (tests/migration).
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    folder = resources.files("harbor_pg._migrations").joinpath("versions")
    for entry in folder.iterdir():
        if not entry.name.endswith(".py") or entry.name.startswith("__"):
            continue
        text = entry.read_text(encoding="utf-8")
        rev = _REVISION.findall(text)
        down = _DOWN_REVISION.findall(text)
        if len(rev) != 1 or len(down) != 1:
            return None
        revisions.add(rev[0])
        if down[0][0] != "None":
            parents.add(down[0][1])
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None


def is_current(owner_url: str) -> bool:
    """Whether the database at ``owner_url`` needs no migration: the login may
    migrate, the schema is at the newest shipped revision, and the re-runnable
    SQL recorded there is the one this package ships (same sha256).

    One connection and one read-only query on two one-row tables; nothing is
    locked beyond what reading them takes, and no Alembic is loaded. Any
    failure, or a database that is not current, answers False: :func:`upgrade`
    then migrates (under the advisory lock), or reports why it cannot. A
    migration commits the revision and the recorded sha256 in one transaction,
    so a start that sees both current sees the schema they describe.
    """
    if shipped_head() is None:
        return False
    try:
        with psycopg.connect(owner_url, autocommit=True, connect_timeout=10) as conn:
            rows = conn.execute(query("migration_state")).fetchall()
    except psycopg.Error:
        return False
    return _current(rows)


def _current(rows: Sequence[tuple[str, str]]) -> bool:
    """Whether ``migration_state`` rows say: at the shipped head, with the shipped SQL."""
    head = shipped_head()
    return head is not None and [tuple(r) for r in rows] == [(head, idempotent_sha256())]


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
