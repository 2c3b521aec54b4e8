"""The embedded server starts over a stale ``postmaster.pid`` and never removes a
live server's.

After a container restart the pid in the file's first line may belong to
another process; right after a crash (``kill -9``) the server's backends run
on for a moment. Either used to stop the embedded server from starting until
someone deleted the file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harbor_pg.db import server
from harbor_pg.errors import MemoryConfigurationError
from tests.conftest import PgServer

_START = (
    "import sys; from pathlib import Path; from harbor_pg.db import server;"
    " url = server.start_embedded(Path(sys.argv[1]));"
    " import psycopg; c = psycopg.connect(url); print(c.execute('select pg_backend_pid()')"
    ".fetchone()[0]); c.close()"
)


def _start_in_a_new_process(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _START, str(data)], capture_output=True, text=True, timeout=120
    )


def _postmaster(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().splitlines()[0])


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer) -> Iterator[Path]:
    """A data directory initialised once for the module (its server stopped)."""
    data = tmp_path_factory.mktemp("stale")
    out = _start_in_a_new_process(data)
    assert out.returncode == 0, out.stderr
    server.stop_embedded(data / "pgdata")
    yield data
    server.stop_embedded(data / "pgdata")


def test_a_pid_file_naming_another_live_process_is_stale(data: Path) -> None:
    pgdata = data / "pgdata"
    out = _start_in_a_new_process(data)
    assert out.returncode == 0, out.stderr
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    server.stop_embedded(pgdata)
    # as after a container restart: the file is back, its pid now someone else's
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (pgdata / "postmaster.pid").write_text("\n".join([str(other.pid), *lines[1:]]) + "\n")
        out = _start_in_a_new_process(data)
        assert out.returncode == 0, out.stderr
        assert other.poll() is None  # the other process was left alone
        assert _postmaster(pgdata) != other.pid
    finally:
        other.kill()
        other.wait()
        server.stop_embedded(pgdata)


def test_a_live_servers_pid_file_is_kept(data: Path) -> None:
    pgdata = data / "pgdata"
    out = _start_in_a_new_process(data)
    assert out.returncode == 0, out.stderr
    try:
        before = (pgdata / "postmaster.pid").read_text()
        assert server.clear_stale_pid_file(pgdata) is False
        again = _start_in_a_new_process(data)  # reuses the running server
        assert again.returncode == 0, again.stderr
        assert (pgdata / "postmaster.pid").read_text() == before
    finally:
        server.stop_embedded(pgdata)


def test_a_pid_file_of_a_running_server_with_a_foreign_pid_is_kept(data: Path) -> None:
    """A file that names another process while the server still runs there is not
    removed (the server would then run without its lock file)."""
    pgdata = data / "pgdata"
    out = _start_in_a_new_process(data)
    assert out.returncode == 0, out.stderr
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        planted = "\n".join([str(os.getppid()), *lines[1:]]) + "\n"
        (pgdata / "postmaster.pid").write_text(planted)
        with pytest.raises(MemoryConfigurationError, match="still work in it"):
            server.clear_stale_pid_file(pgdata, wait=0.5)
        assert (pgdata / "postmaster.pid").read_text() == planted
        (pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")
    finally:
        server.stop_embedded(pgdata)


def test_starts_right_after_the_server_was_killed(data: Path) -> None:
    pgdata = data / "pgdata"
    out = _start_in_a_new_process(data)
    assert out.returncode == 0, out.stderr
    # a process ready to start the server the moment it reads a line
    waiting = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, psycopg; from harbor_pg.db import server;"
            " print('ready', flush=True); sys.stdin.readline(); " + _START,
            str(data),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stdout is not None
        assert waiting.stdout.readline() == "ready\n"  # imported, waiting for the line
        os.kill(_postmaster(pgdata), signal.SIGKILL)
        _stdout, stderr = waiting.communicate("go\n", timeout=120)
        assert waiting.returncode == 0, stderr
    finally:
        waiting.kill()
        server.stop_embedded(pgdata)


def test_a_dying_server_still_seen_running_is_not_reused(data: Path, tmp_path: Path) -> None:
    """Right after a kill the postmaster still looks running (torn down, then a zombie):
    the wheel reused it and handed out a URL on which every connection was refused.
    Here a process named postgres working in the data directory, listening on nothing,
    holds the pid file for a second and then exits, as such a postmaster does: the
    start waits it out and starts the server."""
    pgdata = data / "pgdata"
    out = _start_in_a_new_process(data)
    assert out.returncode == 0, out.stderr
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    server.stop_embedded(pgdata)
    fake = tmp_path / "postgres"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    dying = subprocess.Popen([str(fake), "1.5"], cwd=pgdata)
    reaper = threading.Thread(target=dying.wait)  # (reaped at once: no zombie left)
    reaper.start()
    try:
        (pgdata / "postmaster.pid").write_text("\n".join([str(dying.pid), *lines[1:]]) + "\n")
        assert server._is_postmaster_of(dying.pid, pgdata)  # it passes for the server
        out = _start_in_a_new_process(data)
        assert out.returncode == 0, out.stderr
        assert _postmaster(pgdata) != dying.pid
    finally:
        dying.kill()
        reaper.join()
        server.stop_embedded(pgdata)


def test_starts_again_in_the_same_process_after_a_crash(data: Path) -> None:
    pgdata = data / "pgdata"
    try:
        url = server.start_embedded(data)
        with psycopg.connect(url) as conn:
            conn.execute("select 1")
        os.kill(_postmaster(pgdata), signal.SIGKILL)
        time.sleep(0.2)
        url = server.start_embedded(data)
        with psycopg.connect(url) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        server.stop_embedded(pgdata)
