"""The embedded server starts with shared buffers sized by harbor-pg.

Each start runs in a process of its own, as a user's would (the wheel keeps one
handle per data directory and process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harbor_pg.db import server

START = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from harbor_pg.db import server
from harbor_pg.errors import MemoryConfigurationError
if len(sys.argv) > 2 and sys.argv[2] == "unwritable":
    def refuse(pgdata, settings):
        raise PermissionError(13, "Permission denied", str(pgdata / "harbor.conf"))
    server.write_embedded_settings = refuse
elif len(sys.argv) > 2:  # the automatic size, replaced by one the server refuses
    server._memory_bytes = lambda: None
    server.embedded_settings = lambda: {"shared_buffers": sys.argv[2]}
try:
    print(server.start_embedded(Path(sys.argv[1])))
except MemoryConfigurationError as exc:
    print("error:", exc)
"""


def _start(data_dir: Path, shared_buffers: str | None, refused: str | None = None) -> str:
    env = {**os.environ}
    env.pop(server.SHARED_BUFFERS_ENV, None)
    if shared_buffers is not None:
        env[server.SHARED_BUFFERS_ENV] = shared_buffers
    args = [sys.executable, "-c", START, str(data_dir)] + ([refused] if refused else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] + "\n" + done.stderr


def _shared_buffers(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("show shared_buffers").fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "data"
    server.stop_embedded(tmp_path / "data" / "pgdata")


def test_a_new_data_directory_starts_with_the_size_and_keeps_it_up_to_date(
    data_dir: Path,
) -> None:
    url = _start(data_dir, "256MB").splitlines()[0]
    pgdata = data_dir / "pgdata"
    # no restart needed: the settings are written between initdb and the first start
    assert _shared_buffers(url) == "256MB"
    assert "shared_buffers = '256MB'" in (pgdata / "harbor.conf").read_text()
    # an existing data directory takes a new size at its next start, and the
    # include line is written once
    server.stop_embedded(pgdata)
    url = _start(data_dir, "384MB").splitlines()[0]
    assert _shared_buffers(url) == "384MB"
    assert (pgdata / "postgresql.conf").read_text().count("include_if_exists = 'harbor.conf'") == 1
    # ALTER SYSTEM wins over harbor-pg's file
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("alter system set shared_buffers = '200MB'")
    server.stop_embedded(pgdata)
    assert _shared_buffers(_start(data_dir, "384MB").splitlines()[0]) == "200MB"


def test_a_running_server_is_reused_as_it_is(data_dir: Path) -> None:
    url = _start(data_dir, "256MB").splitlines()[0]
    again = _start(data_dir, "512MB").splitlines()[0]
    assert again == url
    assert _shared_buffers(again) == "256MB"  # until it restarts


def test_without_a_choice_the_size_comes_from_the_machine(data_dir: Path) -> None:
    url = _start(data_dir, None).splitlines()[0]
    assert _shared_buffers(url) == server.embedded_settings()["shared_buffers"]


def test_a_chosen_size_the_server_refuses_is_a_clear_error(data_dir: Path) -> None:
    out = _start(data_dir, "100TB")
    assert out.startswith("error: the embedded PostgreSQL in ")
    assert "(set by HARBOR_SHARED_BUFFERS)" in out
    assert 'invalid value for parameter "shared_buffers": "100TB"' in out
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()


def test_an_automatic_size_the_server_refuses_falls_back_to_the_default(data_dir: Path) -> None:
    out = _start(data_dir, None, refused="100TB")
    url = out.splitlines()[0]
    assert url.startswith("postgresql://")
    assert "WARNING the embedded PostgreSQL did not start with shared_buffers 100TB" in out
    assert "starting it with the server's default (128MB) instead" in out
    assert _shared_buffers(url) == "128MB"


def test_a_data_directory_it_cannot_write_starts_with_the_settings_it_has(
    data_dir: Path,
) -> None:
    url = _start(data_dir, "256MB").splitlines()[0]
    server.stop_embedded(data_dir / "pgdata")
    out = _start(data_dir, "384MB", refused="unwritable")
    assert "WARNING cannot write the embedded server's settings in " in out
    assert "Permission denied" in out and "it starts with the settings it has" in out
    assert out.splitlines()[0] == url
    assert _shared_buffers(url) == "256MB"
