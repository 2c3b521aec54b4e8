"""The ``harbor-pg`` command line: up, stop, migrate, status, demo, mcp, inspect, token,
export, import (the last six in :mod:`harbor_pg.commands`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harbor_pg.db.errors import driver_errors
from harbor_pg.errors import MemoryConfigurationError, MemoryError

__all__ = ["main"]


def _server(args: argparse.Namespace) -> Any:
    from harbor_pg.db import server

    return server.resolve_server(
        args.database_url, data_dir=Path(args.data_dir) if args.data_dir else None
    )


def as_url(conninfo: str) -> str:
    """A ``postgresql://`` URL for a connection string (a URL is returned as it is).

    The embedded server listens on a Unix socket, which goes in the ``host``
    query parameter: ``postgresql://harbor_app@/harbor?host=/path/to/pgdata``.
    """
    if "://" in conninfo:
        return conninfo
    from urllib.parse import quote, urlencode

    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(conninfo).items() if v is not None}
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", None)
    userinfo = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    host = params.pop("host", "")
    port = params.pop("port", "")
    netloc = ""
    if host and not host.startswith("/") and "," not in host:
        netloc = host + (f":{port}" if port else "")
    else:
        if host:
            params["host"] = host
        if port:
            params["port"] = port
    dbname = quote(params.pop("dbname", ""), safe="")
    # percent-encoded (libpq reads "+" in a URL as a plus sign, never a space)
    query = f"?{urlencode(params, quote_via=quote)}" if params else ""
    return f"postgresql://{userinfo}{netloc}/{dbname}{query}"


def _to_stderr(line: str) -> None:
    """Progress of a long migration step, on stderr (stdout stays the result)."""
    print(line, file=sys.stderr, flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    """Start the embedded server (or check HARBOR_DATABASE_URL), migrate, print the URL."""
    from harbor_pg.db import migrate, server

    t0 = time.perf_counter()
    info = _server(args)
    migrate.upgrade(info.owner_url, progress=_to_stderr)
    took = time.perf_counter() - t0
    where = f"embedded server in {info.embedded}" if info.embedded else "external server"
    print(f"harbor-pg is up ({where}, schema at {migrate.head_revision()}, {took:.2f}s)")
    print(f"application URL: {server.redact(as_url(info.app_url))}")
    print(f"elevated URL:    {server.redact(as_url(info.admin_url))}")
    print("connect with psql and run: select harbor.set_identity('tenant', principal_id => 'me');")
    if info.embedded:
        from harbor_pg.commands import stop_hint

        print(f"the server keeps running after this command; stop it with: {stop_hint(args)}")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Apply the migrations up to a revision (default: the newest)."""
    from harbor_pg.db import migrate

    info = _server(args)
    before = migrate.current_revision(info.owner_url)
    if args.revision in ("base",) or (args.revision != "head" and args.downgrade):
        migrate.downgrade(info.owner_url, args.revision, progress=_to_stderr)
    else:
        migrate.upgrade(info.owner_url, args.revision, progress=_to_stderr)
    after = migrate.current_revision(info.owner_url)
    print(f"schema revision: {before or 'none'} -> {after or 'none'}")
    return 0


def cmd_distribute(args: argparse.Namespace) -> int:
    """Turn the migrated harbor database on a Citus coordinator into a distributed one
    (every tenant table by tenant_id, co-located; role bindings as a reference
    table). Needs a superuser URL (--database-url or HARBOR_DATABASE_URL) of the
    coordinator's harbor database, with the workers added; see docs/citus.md."""
    from harbor_pg.db import citus

    url = args.database_url or os.environ.get("HARBOR_DATABASE_URL")
    if not url:
        raise MemoryConfigurationError(
            "harbor-pg distribute needs the coordinator: --database-url or HARBOR_DATABASE_URL"
        )
    report = citus.distribute(url, shard_count=args.shard_count)
    print(f"distributed now: {', '.join(report.distributed) or 'nothing'}")
    print(f"already distributed: {', '.join(report.already) or 'nothing'}")
    print(f"workers: {report.workers}; shards of harbor.memories per node: {report.shards}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print the server, the schema revision and row counts per tier; exit 1 when
    the schema is not migrated or a harbor function has another owner than a
    migration gives it (one re-created by hand, say as a superuser)."""
    import psycopg
    from psycopg.rows import dict_row

    from harbor_pg.db import migrate, server
    from harbor_pg.db.sqlfiles import query

    info = _server(args)
    url = info.superuser_url or info.app_url
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        versions = conn.execute(query("server_versions")).fetchone() or {}
        misowned = conn.execute(query("misowned_functions")).fetchall()
    current = migrate.current_revision(info.owner_url)
    head = migrate.head_revision()
    print(
        f"server:   PostgreSQL {versions.get('server_version', '?')}"
        f" ({'embedded in ' + str(info.embedded) if info.embedded else server.redact(url)})"
    )
    print(f"pgvector: {versions.get('vector_version') or 'not installed in this database'}")
    print(
        f"memory:   shared_buffers {versions.get('shared_buffers', '?')},"
        f" database {versions.get('database_size', '?')} on disk"
    )
    state = "up to date" if current == head else f"behind (newest is {head}; run harbor-pg migrate)"
    print(f"schema:   {current or 'not migrated'} - {state}")
    if current is None:
        return 1
    if misowned:
        print(
            f"owners:   {len(misowned)} harbor function(s) not owned as a migration leaves"
            " them (the next migration stops at them):"
        )
        for row in misowned:
            print(
                f"          {row['function']} is owned by {row['owner']}:"
                f" alter function {row['function']} owner to {row['expected']};"
            )
        return 1
    if info.superuser_url is None:
        print("rows:     (needs a superuser URL to count across tenants)")
        return 0
    with psycopg.connect(info.superuser_url, autocommit=True, row_factory=dict_row) as conn:
        counts = conn.execute(query("tier_totals")).fetchone()
    assert counts is not None
    print(
        f"rows:     short-term {counts['short_term']}, working {counts['working']}, "
        f"long-term {counts['long_term']} ({counts['current_memories']} currently valid), "
        f"embeddings {counts['embeddings']}"
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """A short scripted conversation written and read back through the three tiers."""
    from harbor_pg.commands import stop_hint
    from harbor_pg.demo import run_demo

    code = asyncio.run(run_demo(args))
    if not (args.database_url or os.environ.get("HARBOR_DATABASE_URL")):
        print(f"the embedded server keeps running; stop it with: {stop_hint(args)}")
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harbor-pg",
        description="Scope-aware memory for LLM applications, kept in PostgreSQL. With no "
        "configuration it runs an embedded PostgreSQL in a data directory.",
    )
    parser.add_argument(
        "--database-url",
        help="use this PostgreSQL instead of the embedded one (default: $HARBOR_DATABASE_URL)",
    )
    parser.add_argument(
        "--data-dir",
        help="embedded server data directory (default: $HARBOR_DATA_DIR or the per-user data dir)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "up",
        help="start the embedded server, migrate it, print its URL",
        description=cmd_up.__doc__,
    )
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("migrate", help="apply schema migrations", description=cmd_migrate.__doc__)
    p.add_argument(
        "--revision",
        default="head",
        help="target revision (default: head; 'base' removes the schema)",
    )
    p.add_argument("--downgrade", action="store_true", help="migrate down to --revision")
    p.set_defaults(func=cmd_migrate)
    p = sub.add_parser(
        "distribute",
        help="distribute a migrated database on a Citus coordinator",
        description=cmd_distribute.__doc__,
    )
    p.add_argument(
        "--shard-count",
        type=int,
        default=None,
        help="shards per table (default: citus.shard_count, 32)",
    )
    p.set_defaults(func=cmd_distribute)
    p = sub.add_parser(
        "status",
        help="server, schema revision, row counts per tier",
        description=cmd_status.__doc__,
    )
    p.set_defaults(func=cmd_status)
    p = sub.add_parser(
        "demo", help="a scripted conversation through the three tiers", description=cmd_demo.__doc__
    )
    p.set_defaults(func=cmd_demo)
    from harbor_pg.commands import add_commands

    add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``harbor-pg`` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # last resort: a driver error nothing below turned into a harbor error goes
    # through the same map, with every password we know of scrubbed
    known_urls = (
        args.database_url,
        os.environ.get("HARBOR_DATABASE_URL"),
        os.environ.get("HARBOR_ADMIN_DATABASE_URL"),
    )
    try:
        with driver_errors(*known_urls):
            return int(args.func(args))
    except MemoryError as exc:
        print(f"harbor-pg: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
