"""``harbor-pg stop`` stops the embedded server that ``up`` left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from harbor_pg.db import server


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harbor_pg.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_up_says_how_to_stop_and_stop_stops(tmp_path: Path) -> None:
    env = {**os.environ}
    env.pop("HARBOR_DATABASE_URL", None)
    env.pop("HARBOR_DATA_DIR", None)
    data = tmp_path / "data"
    pgdata = data / "pgdata"
    try:
        up = _cli("--data-dir", str(data), "up", env=env)
        assert up.returncode == 0, up.stderr
        assert f"stop it with: harbor-pg --data-dir {data} stop" in up.stdout
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 0)  # running after `up` returned

        stop = _cli("--data-dir", str(data), "stop", env=env)
        assert stop.returncode == 0, stop.stderr
        assert stop.stdout.strip() == f"stopped the embedded server in {pgdata.resolve()}"
        assert not (pgdata / "postmaster.pid").exists()
        deadline = time.monotonic() + 10  # pg_ctl returns as the postmaster exits
        while _running(pid):
            assert time.monotonic() < deadline, f"the server process {pid} still runs"
            time.sleep(0.1)

        again = _cli("--data-dir", str(data), "stop", env=env)
        assert again.returncode == 0
        assert "no embedded server is running" in again.stdout
    finally:
        server.stop_embedded(pgdata)


def test_stop_leaves_an_external_server_alone() -> None:
    env = {**os.environ, "HARBOR_DATABASE_URL": "postgresql://app@/harbor?host=/nonexistent"}
    out = _cli("stop", env=env)
    assert out.returncode == 2
    assert "only its embedded server" in out.stderr
