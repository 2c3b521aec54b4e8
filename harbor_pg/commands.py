"""The ``harbor-pg`` commands beyond the server's life cycle: worker, jobs, mcp, inspect,
token, export, import, stop (registered on the parser of :mod:`harbor_pg.cli`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from harbor_pg.errors import MemoryConfigurationError, MemoryValidationError
from harbor_pg.owner import MemoryOwner

if TYPE_CHECKING:
    from harbor_pg.access_tokens import TokenStore

__all__ = ["add_commands", "progress_bar", "stop_hint"]

_IDENTITY_FIELDS = ("tenant", "project", "principal", "user", "session", "run")


def _add_identity(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    g = p.add_argument_group("identity (whose memory; never taken from a model)")
    g.add_argument("--tenant", required=required, help="tenant id")
    g.add_argument("--project", help="project id")
    g.add_argument("--principal", help="principal (the person or agent acting)")
    g.add_argument("--user", help="user id (default: the principal)")
    g.add_argument("--session", help="session id")
    g.add_argument("--run", help="run id")


# Keyword-for-keyword like RecallRequest(...) in context/recall.py by shape only: not a copy.
def _owner(args: argparse.Namespace) -> MemoryOwner:
    return MemoryOwner(
        tenant_id=args.tenant,
        project_id=args.project,
        principal_id=args.principal,
        user_id=args.user,
        session_id=args.session,
        run_id=args.run,
    )


async def _manager(args: argparse.Namespace, *, embeddings: bool = True) -> Any:
    from harbor_pg.manager import MemoryManager

    return await MemoryManager.create(
        database_url=args.database_url,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        embeddings=embeddings,
    )


def stop_hint(args: argparse.Namespace) -> str:
    """The command that stops the embedded server these arguments use."""
    extra = f" --data-dir {shlex.quote(args.data_dir)}" if getattr(args, "data_dir", None) else ""
    return f"harbor-pg{extra} stop"


def progress_bar(stream: IO[str], what: str) -> Callable[[int, int], None] | None:
    """A progress bar on ``stream`` when it is a terminal, else None."""
    if not stream.isatty():
        return None

    def show(done: int, total: int) -> None:
        width = 30
        filled = width if total == 0 else int(width * done / total)
        percent = 100 if total == 0 else int(100 * done / total)
        bar = "#" * filled + "-" * (width - filled)
        end = "\n" if done >= total else ""
        stream.write(f"\r{what} [{bar}] {percent:3d}% {done}/{total}{end}")
        stream.flush()

    return show


# -- stop -------------------------------------------------------------------------


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the embedded PostgreSQL that `up` or `demo` left running."""
    from harbor_pg.db import server

    if args.database_url or os.environ.get("HARBOR_DATABASE_URL"):
        raise MemoryConfigurationError(
            "harbor-pg stops only its embedded server; this one is external "
            "(HARBOR_DATABASE_URL or --database-url is set)"
        )
    data_dir = (Path(args.data_dir) if args.data_dir else server.default_data_dir()).expanduser()
    pgdata = data_dir.resolve() / "pgdata"
    if not (pgdata / "postmaster.pid").exists():
        print(f"no embedded server is running in {pgdata}")
        return 0
    server.stop_embedded(pgdata)
    if (pgdata / "postmaster.pid").exists():
        print(f"harbor-pg: error: the embedded server in {pgdata} did not stop", file=sys.stderr)
        return 1
    print(f"stopped the embedded server in {pgdata}")
    return 0


# -- mcp ---------------------------------------------------------------------------


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve the memory over the Model Context Protocol: on stdio as the identity
    given by --tenant and the other identity options, or with --http on streamable
    HTTP, each request as the identity of its bearer token (harbor-pg token create)."""
    try:
        from harbor_pg.mcp import Caller, serve_http, serve_stdio
    except ImportError as exc:
        raise MemoryConfigurationError(
            f"harbor-pg mcp needs the 'mcp' extra: pip install 'harbor-pg[mcp]' ({exc})"
        ) from None

    async def main() -> None:
        if args.http:
            if args.tenant:
                raise MemoryValidationError(
                    "over HTTP the identity comes from each request's token: drop --tenant"
                )
        elif not args.tenant:
            raise MemoryValidationError("on stdio the server needs an identity: pass --tenant")
        manager = await _manager(args)
        try:
            if args.http:

                def ready(url: str) -> None:
                    print(f"harbor-pg MCP server at {url} (Ctrl-C stops it)", file=sys.stderr)

                await serve_http(manager, host=args.host, port=args.port, ready=ready)
            else:
                await serve_stdio(manager, Caller(_owner(args), is_admin=args.admin))
        finally:
            await manager.close()

    asyncio.run(main())
    return 0


# -- inspect -------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    """Serve the memory inspector, a local web app: memories by scope, type, sensitivity
    and source (now or as of a time), a memory's history and provenance, why recall
    ranked what it did, and a session's turns, summary and working state. Bound to
    127.0.0.1 by default; on any other address every request needs an access token
    (harbor-pg token create). Prints its URL; Ctrl-C stops it."""
    try:
        from harbor_pg.inspect import InspectorSettings, serve
    except ImportError as exc:
        raise MemoryConfigurationError(
            f"harbor-pg inspect needs the 'inspect' extra: pip install 'harbor-pg[inspect]' ({exc})"
        ) from None
    if not 0 <= args.port <= 65535:
        raise MemoryValidationError(f"--port {args.port} is not a TCP port (0-65535)")
    settings = InspectorSettings(host=args.host, port=args.port, tenant=args.tenant)

    async def main() -> None:
        manager = await _manager(args)
        try:

            def ready(url: str) -> None:
                rule = (
                    "every request needs an access token (harbor-pg token create)"
                    if settings.needs_token
                    else "loopback only, no token needed"
                )
                print(f"harbor-pg inspect at {url} ({rule}; Ctrl-C stops it)", flush=True)

            await serve(manager, settings, ready=ready)
        finally:
            await manager.close()

    asyncio.run(main())
    return 0


# -- token ---------------------------------------------------------------------------


def _with_token_store(
    args: argparse.Namespace, action: Callable[[TokenStore], Awaitable[int]]
) -> int:
    """Run ``action`` on a :class:`TokenStore` over the configured database, then close it."""
    from harbor_pg.access_tokens import TokenStore

    async def main() -> int:
        manager = await _manager(args, embeddings=False)
        try:
            return await action(TokenStore(manager.database))
        finally:
            await manager.close()

    return asyncio.run(main())


def cmd_token_create(args: argparse.Namespace) -> int:
    """Create a bearer token for one identity and print it (it is shown only this once)."""

    async def create(store: TokenStore) -> int:
        issued = await store.create(_owner(args), name=args.name or "", is_admin=args.admin)
        print(issued.token)
        print(
            f"token {issued.record.id} for tenant {args.tenant}"
            f"{' (administrator)' if args.admin else ''}; keep it secret, it is not stored",
            file=sys.stderr,
        )
        return 0

    return _with_token_store(args, create)


def cmd_token_revoke(args: argparse.Namespace) -> int:
    """Revoke a token by its id; it stops working at once."""

    async def revoke(store: TokenStore) -> int:
        await store.revoke(args.tenant, args.token_id)
        print(f"revoked token {args.token_id}")
        return 0

    return _with_token_store(args, revoke)


def cmd_token_list(args: argparse.Namespace) -> int:
    """List a tenant's tokens (ids and identities, never the tokens themselves)."""

    async def list_tokens(store: TokenStore) -> int:
        for t in await store.list(args.tenant):
            state = "revoked" if t.revoked_at else "live"
            who = ", ".join(f"{k}={v}" for k, v in t.owner.model_dump().items() if v is not None)
            admin = " admin" if t.is_admin else ""
            print(f"{t.id}  {state}{admin}  {who}  {t.name}")
        return 0

    return _with_token_store(args, list_tokens)


# -- export / import -------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    """Write the identity's memories (with --admin, the tenant's) as JSON Lines:
    full validity history, provenance, governance fields, optionally vectors."""

    async def main() -> int:
        manager = await _manager(args, embeddings=False)
        try:
            bar = progress_bar(sys.stderr, "export")
            to_file = args.output and args.output != "-"
            count = await manager.export_memories(
                _owner(args),
                args.output if to_file else sys.stdout,
                elevated=args.admin,
                vectors=args.vectors,
                progress=bar,
            )
        finally:
            await manager.close()
        print(f"exported {count} memories", file=sys.stderr)
        return 0

    return asyncio.run(main())


def cmd_import(args: argparse.Namespace) -> int:
    """Read a JSON Lines export back, idempotently (a re-run writes nothing); prints
    a summary line, and each refused line with its reason. Exit 1 when any was refused."""

    async def main() -> int:
        manager = await _manager(args)
        try:
            source: Any = sys.stdin if args.file == "-" else args.file
            report = await manager.import_memories(
                _owner(args),
                source,
                elevated=args.admin,
                batch_size=args.batch_size,
                progress=progress_bar(sys.stderr, "import"),
            )
        finally:
            await manager.close()
        for number, reason in report.refused:
            print(f"line {number}: refused: {reason}", file=sys.stderr)
        print(report.summary())
        return 1 if report.refused else 0

    return asyncio.run(main())


# -- upkeep -----------------------------------------------------------------------


def cmd_consolidate(args: argparse.Namespace) -> int:
    """Merge the identity's near-duplicate memories, add-only: each group becomes one
    successor and the originals stay readable as of before (docs/recall.md,
    Consolidation). --all-users does it for every user of the tenant, each as that user.
    --dry-run lists the groups and writes nothing. One line a group, then a summary on
    stderr."""

    async def main() -> int:
        manager = await _manager(args)
        try:
            if args.all_users:
                reports = await manager.consolidate_tenant(
                    args.tenant,
                    min_similarity=args.min_similarity,
                    max_merges=args.max_merges,
                    dry_run=args.dry_run,
                    progress=progress_bar(sys.stderr, "consolidate"),
                )
            else:
                reports = {
                    "": await manager.consolidate(
                        _owner(args),
                        scopes=args.scope or ["user"],
                        min_similarity=args.min_similarity,
                        max_merges=args.max_merges,
                        dry_run=args.dry_run,
                    )
                }
        finally:
            await manager.close()
        verb = "would merge" if args.dry_run else "merged"
        groups = superseded = 0
        for user, report in reports.items():
            whose = f"{user}: " if user else ""
            for merge in report.merges:
                into = "" if merge.successor_id is None else f" into {merge.successor_id}"
                print(
                    f"{whose}{verb} {len(merge.merged_ids)} ({merge.matched_by}){into}:"
                    f" {merge.content}"
                )
            groups += len(report.merges)
            superseded += report.superseded
        what = "would be superseded" if args.dry_run else "superseded"
        users = f" over {len(reports)} users" if args.all_users else ""
        print(f"{groups} groups, {superseded} memories {what}{users}", file=sys.stderr)
        return 0

    return asyncio.run(main())


def cmd_reembed(args: argparse.Namespace) -> int:
    """Write the vectors of the manager's embedder (the new model) for the tenant's
    memories that have vectors of another model only, a batch a transaction, each owner
    key as its owner (docs/operations.md, Changing the embedding model). Resumable: run
    again, it writes only what is still missing. --queue queues it as a job for the
    workers (whose embedder must be the same model) instead; harbor-pg jobs shows it.
    --manager MODULE:FUNCTION: the manager (and so the embedder) to use, as for worker."""

    async def main() -> int:
        manager = await _worker_manager(args)
        try:
            if args.queue:
                job_id = await manager.queue_reembed(args.tenant)
                if job_id is None:
                    print(f"a re-embedding of {args.tenant} is queued already")
                else:
                    print(f"job {job_id}: re-embedding of {args.tenant} queued")
                return 0
            report = await manager.reembed(
                args.tenant,
                batch_size=args.batch_size,
                progress=progress_bar(sys.stderr, "re-embed"),
            )
        finally:
            await manager.close()
        print(
            f"{report.memories} memories given {report.vectors} vectors of"
            f" {manager.embedder.model_id}",
            file=sys.stderr,
        )
        return 0

    return asyncio.run(main())


def cmd_profile(args: argparse.Namespace) -> int:
    """Print the identity's profile: its current durable memories, stable (held for
    --stable-days or more, most important first) then recent (newest first), within
    --tokens (docs/recall.md, A user's profile)."""

    async def main() -> int:
        manager = await _manager(args)
        try:
            profile = await manager.profile(
                _owner(args),
                token_budget=args.tokens,
                stable_after=timedelta(days=args.stable_days),
                scopes=args.scope or ["user"],
            )
        finally:
            await manager.close()
        print(profile.render() or "(no memories)")
        return 0

    return asyncio.run(main())


def cmd_worker(args: argparse.Namespace) -> int:
    """Run the queue's jobs (fact extraction queued with appended turns) until SIGINT or
    SIGTERM; several workers, on one machine or many, share the queue safely.

    Each job runs as its owner (the identity in its arguments), under row-level
    security, with the models of the manager that ``--manager MODULE:FUNCTION``
    returns (a function taking no arguments, async or not, that returns a
    MemoryManager with its ``extraction_model``). Without ``--manager``, a manager
    over the configured database with the default embedder and no extraction
    model, whose extraction jobs fail, visibly, on the queue. ``--once`` stops when
    it finds no job it may take (one waiting for its session's running job counts as
    none). See docs/operations.md#background-jobs.
    """

    async def run() -> None:
        manager = await _worker_manager(args)
        try:
            await manager.run_worker(concurrency=args.concurrency, wait=not args.once)
        finally:
            await manager.close()

    asyncio.run(run())
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """Show the queue's jobs: how many are in each state, per task, and the newest
    failed ones with the error of their last run; or retry a failed job, or cancel
    one that has not started. Runs as the elevated role (HARBOR_ADMIN_DATABASE_URL).
    """

    async def run() -> int:
        manager = await _manager(args, embeddings=False)
        try:
            runner = manager.job_runner()
            if args.action == "retry":
                await runner.retry(_job_id(args))
                print(f"job {args.job_id}: queued to run again")
                return 0
            if args.action == "cancel":
                if not await runner.cancel(_job_id(args)):
                    print(f"job {args.job_id}: not cancelled (not queued, or not started)")
                    return 1
                print(f"job {args.job_id}: cancelled")
                return 0
            counts = await runner.counts()
            if not counts:
                print("no jobs")
            for row in counts:
                print(f"{row['task_name']:<28} {row['status']:<10} {row['jobs']}")
            failed = await runner.failures(limit=args.failures)
            if failed:
                print("\nfailed:")
            for row in failed:
                output = " (the model's answer is kept)" if row["has_output"] else ""
                print(
                    f"  #{row['id']} {row['task_name']} after {row['attempts']} run(s): "
                    f"{row['error'] or 'no error recorded'}{output}"
                )
            return 0
        finally:
            await manager.close()

    return asyncio.run(run())


def _job_id(args: argparse.Namespace) -> int:
    if args.job_id is None:
        raise MemoryValidationError(f"harbor-pg jobs {args.action} needs a job id")
    return int(args.job_id)


async def _worker_manager(args: argparse.Namespace) -> Any:
    if not args.manager:
        return await _manager(args)
    import importlib
    import inspect

    module_name, _, attribute = args.manager.partition(":")
    if not module_name or not attribute:
        raise MemoryConfigurationError("--manager takes MODULE:FUNCTION, e.g. myapp.memory:manager")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the application's modules, as uvicorn finds them
    factory = getattr(importlib.import_module(module_name), attribute)
    manager = factory()
    if inspect.isawaitable(manager):
        manager = await manager
    return manager


def add_commands(sub: Any) -> None:
    """Register stop, worker, jobs, mcp, inspect, token, export and import on ``sub`` (argparse
    subparsers)."""
    p = sub.add_parser("stop", help="stop the embedded server", description=cmd_stop.__doc__)
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser(
        "worker", help="run the queue's background jobs", description=cmd_worker.__doc__
    )
    p.add_argument("--manager", help="MODULE:FUNCTION returning the MemoryManager jobs run with")
    p.add_argument("--concurrency", type=int, default=1, help="jobs run at once (default 1)")
    p.add_argument("--once", action="store_true", help="stop when no job is ready to run")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser(
        "jobs",
        help="the queue's jobs: states, failures, retry, cancel",
        description=cmd_jobs.__doc__,
    )
    p.add_argument("action", nargs="?", choices=["show", "retry", "cancel"], default="show")
    p.add_argument("job_id", nargs="?", type=int, help="the job to retry or cancel")
    p.add_argument("--failures", type=int, default=20, help="failed jobs listed (default 20)")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("mcp", help="serve the memory over MCP", description=cmd_mcp.__doc__)
    p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    p.add_argument("--admin", action="store_true", help="stdio: the identity may erase")
    _add_identity(p, required=False)
    p.set_defaults(func=cmd_mcp)

    p = sub.add_parser(
        "inspect", help="serve the web memory inspector", description=cmd_inspect.__doc__
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8766, help="port (default 8766; 0: any free one)")
    p.add_argument("--tenant", help="the tenant the identity page starts with")
    p.add_argument(
        "--database-url",
        default=argparse.SUPPRESS,
        help="the PostgreSQL to inspect (as the global option; default: $HARBOR_DATABASE_URL "
        "or the embedded server)",
    )
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("token", help="create, revoke or list MCP bearer tokens")
    tsub = p.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    t = tsub.add_parser("create", help="create a token", description=cmd_token_create.__doc__)
    _add_identity(t)
    t.add_argument("--name", help="a label for the token")
    t.add_argument("--admin", action="store_true", help="its holder may erase in the tenant")
    t.set_defaults(func=cmd_token_create)
    t = tsub.add_parser("revoke", help="revoke a token", description=cmd_token_revoke.__doc__)
    t.add_argument("token_id", help="the token's id (from create or list)")
    t.add_argument("--tenant", required=True, help="the token's tenant")
    t.set_defaults(func=cmd_token_revoke)
    t = tsub.add_parser("list", help="list a tenant's tokens", description=cmd_token_list.__doc__)
    t.add_argument("--tenant", required=True, help="tenant id")
    t.set_defaults(func=cmd_token_list)

    p = sub.add_parser(
        "export", help="export memories as JSON Lines", description=cmd_export.__doc__
    )
    _add_identity(p)
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p.add_argument("--vectors", action="store_true", help="include the stored vectors")
    p.add_argument("--admin", action="store_true", help="the whole tenant (elevated role)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="import a JSON Lines export", description=cmd_import.__doc__)
    p.add_argument("file", help="the export to read ('-': stdin)")
    _add_identity(p)
    p.add_argument("--admin", action="store_true", help="the whole tenant (elevated role)")
    p.add_argument("--batch-size", type=int, default=200, help="memories per transaction")
    p.set_defaults(func=cmd_import)
    p = sub.add_parser(
        "consolidate",
        help="merge an identity's near-duplicate memories",
        description=cmd_consolidate.__doc__,
    )
    _add_identity(p)
    p.add_argument(
        "--scope",
        action="append",
        choices=["user", "project", "session", "run"],
        help="a scope to merge in (repeatable; default: user)",
    )
    p.add_argument(
        "--min-similarity",
        type=float,
        default=None,
        help="cosine similarity of near-duplicate vectors (default: the embedder's calibrated "
        "duplicate_threshold)",
    )
    p.add_argument("--max-merges", type=int, default=1000, help="groups at most (default: 1000)")
    p.add_argument("--dry-run", action="store_true", help="list the groups, write nothing")
    p.add_argument(
        "--all-users",
        action="store_true",
        help="every user of --tenant, each as that user (user scope; needs the admin role)",
    )
    p.set_defaults(func=cmd_consolidate)
    p = sub.add_parser(
        "reembed",
        help="backfill a tenant's vectors of the current embedding model",
        description=cmd_reembed.__doc__,
    )
    p.add_argument("--tenant", required=True, help="tenant id")
    p.add_argument("--manager", help="MODULE:FUNCTION returning the MemoryManager to use")
    p.add_argument("--batch-size", type=int, default=64, help="memories a transaction")
    p.add_argument("--queue", action="store_true", help="queue it as a job for the workers")
    p.set_defaults(func=cmd_reembed)
    p = sub.add_parser(
        "profile", help="print an identity's profile", description=cmd_profile.__doc__
    )
    _add_identity(p)
    p.add_argument(
        "--scope",
        action="append",
        choices=["user", "project", "session", "run"],
        help="a scope to read (repeatable; default: user)",
    )
    p.add_argument("--tokens", type=int, default=400, help="token budget (default: 400)")
    p.add_argument(
        "--stable-days", type=float, default=30, help="days a stable memory has held (default: 30)"
    )
    p.set_defaults(func=cmd_profile)
