"""Background work on a PostgreSQL job queue (procrastinate, schema ``harbor_jobs``).

A job is queued in the transaction of the write that causes it (an appended
turn queues its session's fact extraction unless one is waiting already, which
then reads it, and the summary fold of a session it makes due: query
``append_message_with_jobs``), so a rolled-back turn leaves no job and a
committed one is always read by one. A job's arguments are ids only: its
owner's identity and a turn's id. Upkeep (expired working state, expired memories) is a
periodic job with no owner, run as ``harbor_admin``. Failed runs are retried
with exponential backoff and leave their error in ``harbor_jobs.job_errors``;
the running jobs of a worker that went silent are run again. Whoever runs
it (``harbor-pg worker``, or the manager itself in its event loop when no
worker is configured) runs it as that owner, under row-level security, through
the facade's own methods; the queue's tables are read and changed through
``harbor_admin`` (sql/policies/jobs.sql).

procrastinate and its dependencies load on first use: a manager that queues
nothing never imports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from psycopg.rows import dict_row

from harbor_pg.db.connection import elevated_role_setup
from harbor_pg.db.sqlfiles import query
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.owner import MemoryOwner
from harbor_pg.telemetry import traced

if TYPE_CHECKING:
    import procrastinate

__all__ = [
    "CONSOLIDATE_TASK",
    "CONSOLIDATION_SCAN_TASK",
    "EXTRACT_SESSION_TASK",
    "EXTRACT_TASK",
    "FOLD_TASK",
    "PURGE_TASK",
    "QUEUE",
    "REEMBED_TASK",
    "RETENTION_TASK",
    "SCHEMA",
    "JobHandlers",
    "JobRunner",
    "owner_from_args",
]

log = logging.getLogger("harbor_pg")

#: the schema holding procrastinate's tables (migration 0020)
SCHEMA = "harbor_jobs"
#: the queue harbor-pg's jobs are queued on
QUEUE = "harbor"
#: fact extraction after an appended turn (arguments: the owner's ids, message_id): a
#: turn's own, as a distributed database's appends queue it
EXTRACT_TASK = "harbor.extract_turn"
#: fact extraction of a session's turns from one on (arguments: the owner's ids,
#: from_id): at most one waiting a session, queued by the turn that finds none and read
#: with every turn appended until it starts (migration 0029)
EXTRACT_SESSION_TASK = "harbor.extract_session"
#: a session's rolling-summary fold, once it is due (arguments: the owner's ids)
FOLD_TASK = "harbor.fold_summary"
#: consolidation of an owner's memories after an extraction (arguments: the owner's ids,
#: since): one pending per tenant, project and user (its queueing lock)
CONSOLIDATE_TASK = "harbor.consolidate_owner"
#: consolidation, periodic: one harbor.consolidate_owner queued for each owner key (and
#: writer) with memories written since the last run (MemoryManagerConfig.consolidation_cron;
#: no owner: it lists the owners as harbor_admin, each consolidation runs as its owner)
CONSOLIDATION_SCAN_TASK = "harbor.queue_consolidations"
#: how far before the extraction's start a consolidation's ``since`` reaches: the
#: memories are stamped by the database's clock, the start by the worker's
CLOCK_MARGIN = timedelta(minutes=1)
#: upkeep, periodic: reclaim expired working state and close expired memories (no owner:
#: it runs as harbor_admin)
PURGE_TASK = "harbor.purge_working_state"
#: when the upkeep runs (cron; procrastinate defers each tick once, whatever the workers)
PURGE_CRON = "*/10 * * * *"
#: retention, periodic: each configured tenant's retention rules applied
#: (MemoryManagerConfig.retention; no owner: it runs as harbor_admin, one tenant at a time)
RETENTION_TASK = "harbor.apply_retention"
#: a tenant's re-embedding backfill (arguments: tenant_id, model_id; harbor_pg.reembed):
#: one pending a tenant (its queueing lock), and one running a tenant (its lock)
REEMBED_TASK = "harbor.reembed_tenant"
#: most characters of a failed run's error, and of the model answer that broke it, kept
ERROR_CHARS = 2000
RAW_OUTPUT_CHARS = 4000

#: the owner fields a job's arguments carry ('' when absent), as the policies compare them
_OWNER_FIELDS = ("tenant_id", "project_id", "principal_id", "user_id", "session_id", "run_id")


def owner_from_args(args: Mapping[str, Any]) -> MemoryOwner:
    """The owner a job runs as: the identity fields of its arguments ('' is absent)."""
    fields = {name: (str(args.get(name) or "") or None) for name in _OWNER_FIELDS}
    return MemoryOwner(**fields)


class JobHandlers(Protocol):
    """What runs a job: the facade's methods, as the job's owner."""

    async def run_extraction_job(self, owner: MemoryOwner, message_id: int) -> None:
        """Extract facts from ``owner``'s session up to its turn ``message_id``."""

    async def run_session_extraction_job(self, owner: MemoryOwner, from_id: int) -> None:
        """Extract facts from ``owner``'s session's turns from ``from_id`` on."""

    async def release_session_extraction(self, owner: MemoryOwner) -> None:
        """Let ``owner``'s session's next turn queue its extraction (one was cancelled)."""

    async def run_summary_job(self, owner: MemoryOwner) -> None:
        """Fold ``owner``'s session's rolling summary, if it is still due."""

    async def run_consolidation_job(self, owner: MemoryOwner, since: datetime) -> None:
        """Merge ``owner``'s near-duplicates, comparing those stored since ``since``."""

    async def purge_working_state(self) -> int:
        """Reclaim the space of expired working state (every tenant's; elevated role)."""

    async def expire_memories(self) -> int:
        """Close the memories past their expiry (every tenant's; elevated role)."""

    async def apply_configured_retention(self) -> Any:
        """Apply each configured tenant's retention rules (elevated role, a tenant at a time)."""

    async def run_reembed_job(self, tenant_id: str, model_id: str) -> None:
        """Backfill ``tenant_id``'s vectors of ``model_id``, each owner key as its owner."""


class JobRunner:
    """The queue's tasks over a facade's :class:`JobHandlers`, and the worker that runs them.

    ``admin_url``: the queue's connection (``harbor_admin``; its search path is
    set to ``harbor_jobs`` for procrastinate's own statements). The jobs
    themselves read and write memory through ``handlers``, as their owners.
    """

    def __init__(
        self,
        handlers: JobHandlers,
        admin_url: str | None,
        *,
        retries: int = 4,
        retry_seconds: float = 2.0,
        stalled_seconds: float = 30.0,
        poll_seconds: float = 1.0,
        consolidate_after_extraction: bool = False,
        retention_cron: str | None = None,
        consolidation_cron: str | None = None,
    ) -> None:
        if not admin_url:
            raise MemoryConfigurationError(
                "running queued jobs needs the elevated database login (harbor_admin): "
                "pass Database(app_url, admin_url)"
            )
        self.handlers = handlers
        self.admin_url = admin_url
        #: runs after the first that a failed job gets, the first after ``retry_seconds``,
        #: each later one after twice the wait before it
        self.retries = retries
        self.retry_seconds = retry_seconds
        #: a worker silent (no heartbeat) this long is taken for dead, and the jobs it
        #: was running are run again
        self.stalled_seconds = stalled_seconds
        #: how often an idle worker looks again for jobs it could not take before: a
        #: session's (or a slot's) next job once the one running ends, a retry come due
        #: (a newly queued job wakes it at once)
        self.poll_seconds = poll_seconds
        #: after each extraction job, queue a consolidation of its owner's memories (one
        #: pending per owner) that compares the memories stored since the extraction began
        self.consolidate_after_extraction = consolidate_after_extraction
        #: when this worker queues the periodic retention job (cron; None: never: a
        #: worker with no retention configured leaves that job to those that have it)
        self.retention_cron = retention_cron
        #: when this worker queues the periodic consolidation (cron; None: never)
        self.consolidation_cron = consolidation_cron
        self._app: procrastinate.App | None = None
        self._opened = False
        self._worker: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        #: ids of jobs this process queued that have not run yet (what drain waits for)
        self.queued: set[int] = set()

    # -- the procrastinate app -------------------------------------------------------

    @property
    def app(self) -> procrastinate.App:
        """The procrastinate app with harbor-pg's tasks (made on first use)."""
        if self._app is None:
            self._app = self._make_app()
        return self._app

    def _make_app(self) -> procrastinate.App:
        import procrastinate

        connector = procrastinate.PsycopgConnector(
            conninfo=self.admin_url,
            kwargs={
                "options": f"-c search_path={SCHEMA},pg_catalog",
                "row_factory": dict_row,
            },
            configure=elevated_role_setup(),
            min_size=1,
            max_size=4,
        )
        app = procrastinate.App(connector=connector)
        _tolerate_erased_jobs(app.job_manager)
        handlers = self.handlers
        backoff = _backoff(self.retries, self.retry_seconds)

        @app.task(name=EXTRACT_TASK, queue=QUEUE, pass_context=True, retry=backoff)
        async def extract_turn(context: Any, /, *, message_id: int, **ids: Any) -> None:
            owner = owner_from_args(ids)
            started = datetime.now(UTC)
            await self._run(context, backoff, handlers.run_extraction_job(owner, int(message_id)))
            if self.consolidate_after_extraction:
                await self._queue_consolidation(ids, started - CLOCK_MARGIN)

        @app.task(name=EXTRACT_SESSION_TASK, queue=QUEUE, pass_context=True, retry=backoff)
        async def extract_session(context: Any, /, *, from_id: int, **ids: Any) -> None:
            owner = owner_from_args(ids)
            started = datetime.now(UTC)
            work = handlers.run_session_extraction_job(owner, int(from_id))
            await self._run(context, backoff, work)
            if self.consolidate_after_extraction:
                await self._queue_consolidation(ids, started - CLOCK_MARGIN)

        @app.task(name=CONSOLIDATE_TASK, queue=QUEUE, pass_context=True, retry=backoff)
        async def consolidate_owner(context: Any, /, *, since: str, **ids: Any) -> None:
            work = handlers.run_consolidation_job(
                owner_from_args(ids), datetime.fromisoformat(since)
            )
            await self._run(context, backoff, work)

        @app.task(name=FOLD_TASK, queue=QUEUE, pass_context=True, retry=backoff)
        async def fold_summary(context: Any, /, **ids: Any) -> None:
            await self._run(context, backoff, handlers.run_summary_job(owner_from_args(ids)))

        @app.periodic(cron=PURGE_CRON, periodic_id="upkeep")
        @app.task(name=PURGE_TASK, queue=QUEUE, pass_context=True, queueing_lock=PURGE_TASK)
        async def purge_working_state(context: Any, /, timestamp: int) -> None:
            await self._run(context, backoff, _upkeep(handlers))

        async def apply_retention(context: Any, /, timestamp: int) -> None:
            await self._run(context, backoff, _retention(handlers))

        @app.task(name=REEMBED_TASK, queue=QUEUE, pass_context=True, retry=backoff)
        async def reembed_tenant(context: Any, /, *, tenant_id: str, model_id: str) -> None:
            await self._run(context, backoff, handlers.run_reembed_job(tenant_id, model_id))

        retention = app.task(
            name=RETENTION_TASK,
            queue=QUEUE,
            pass_context=True,
            queueing_lock=RETENTION_TASK,
            retry=backoff,
        )(apply_retention)
        if self.retention_cron is not None:
            app.periodic(cron=self.retention_cron, periodic_id="retention")(retention)

        async def queue_consolidations(context: Any, /, timestamp: int) -> None:
            await self._run(context, backoff, _none(self._queue_periodic_consolidations()))

        scan = app.task(
            name=CONSOLIDATION_SCAN_TASK,
            queue=QUEUE,
            pass_context=True,
            queueing_lock=CONSOLIDATION_SCAN_TASK,
            retry=backoff,
        )(queue_consolidations)
        if self.consolidation_cron is not None:
            app.periodic(cron=self.consolidation_cron, periodic_id="consolidation")(scan)
        return app

    async def _queue_periodic_consolidations(self) -> int:
        """The periodic consolidation: one consolidation queued for each owner key and
        writer with current user or project memories written since the start of this
        task's last successful run (less the clock margin; every owner the first time),
        comparing those. The owners are listed as harbor_admin (ids only:
        ``harbor.consolidation_owners()``); each consolidation runs as its owner, under
        row-level security. Returns how many owners it found."""
        connector = self.app.connector
        last = await connector.execute_query_one_async(
            query("jobs_last_started"), task_name=CONSOLIDATION_SCAN_TASK
        )
        since = last["started"] - CLOCK_MARGIN if last and last["started"] else None
        rows = await connector.execute_query_all_async(
            query("jobs_consolidation_owners"), since=since
        )
        for row in rows:
            await self._queue_consolidation(
                row, since or datetime(1970, 1, 1, tzinfo=UTC), periodic=True
            )
        return len(rows)

    async def _queue_consolidation(
        self, ids: Mapping[str, Any], since: datetime, *, periodic: bool = False
    ) -> None:
        """Queue a consolidation of the owner's memories stored since ``since``, unless
        one is pending already (its queueing lock: per tenant, project and user after an
        extraction, and also per writer for the periodic one; the pending one's ``since``
        is earlier, so it covers these memories too). Every consolidation of one tenant,
        project and user takes the same lock, so that they never run at once."""
        owner = {name: str(ids.get(name) or "") for name in _OWNER_FIELDS}
        key = "consolidate:" + "/".join(
            f"{len(owner[name])}:{owner[name]}" for name in ("tenant_id", "project_id", "user_id")
        )
        queueing = key
        if periodic:
            queueing = f"consolidate-periodic:{key}/{len(owner['principal_id'])}:"
            queueing += owner["principal_id"]
        pending = await self.app.connector.execute_query_one_async(
            query("jobs_pending_with_lock"), queueing_lock=queueing
        )
        if pending["pending"]:
            return
        task = self.app.configure_task(CONSOLIDATE_TASK, queueing_lock=queueing, lock=key)
        try:
            job_id = await task.defer_async(**owner, since=since.isoformat())
        except Exception as exc:
            # another worker queued it since the look above (procrastinate cannot tell
            # that conflict from others here: under row-level security the database
            # does not name the conflicting key); a consolidation not queued is made up
            # by the owner's next extraction, and never fails this one
            log.info("consolidation of %s not queued: %s", key, _describe(exc))
            return
        self.queued.add(job_id)

    async def queue_reembed(self, tenant_id: str, model_id: str) -> int | None:
        """Queue the backfill of ``tenant_id``'s vectors of ``model_id``; its id, or None
        when one is pending for the tenant already."""
        await self.open()
        key = f"reembed:{len(tenant_id)}:{tenant_id}"
        pending = await self.app.connector.execute_query_one_async(
            query("jobs_pending_with_lock"), queueing_lock=key
        )
        if pending["pending"]:
            return None
        task = self.app.configure_task(REEMBED_TASK, queueing_lock=key, lock=key)
        try:
            job_id: int = await task.defer_async(tenant_id=tenant_id, model_id=model_id)
        except Exception as exc:  # queued by another since the look above
            log.info("re-embedding of %r not queued: %s", tenant_id, _describe(exc))
            return None
        return job_id  # (for the workers: not among the jobs drain() waits for)

    @traced("harbor_pg.job", attributes=lambda _self, context, *_: _job_attributes(context))
    async def _run(self, context: Any, backoff: Any, work: Awaitable[None]) -> None:
        """Run one job's ``work`` (a span ``harbor_pg.job`` when tracing is on); a failed
        run leaves its error on the queue (``harbor_jobs.job_errors``) before
        procrastinate retries or fails the job."""
        job = context.job
        try:
            await work
        except Exception as exc:
            await self._record_failure(job.id, job.attempts, exc)
            if backoff.get_retry_decision(exception=exc, job=job) is None:
                self.queued.discard(job.id)  # failed for good: nothing more to wait for
            raise
        self.queued.discard(job.id)

    async def _record_failure(self, job_id: int, attempt: int, exc: BaseException) -> None:
        raw = getattr(exc, "raw_output", None)
        try:
            await self.app.connector.execute_query_async(
                query("jobs_record_error"),
                job_id=job_id,
                attempt=attempt,
                error=_describe(exc)[:ERROR_CHARS],
                raw_output=raw[:RAW_OUTPUT_CHARS] if isinstance(raw, str) else None,
            )
        except Exception as failure:  # the job's own error is what procrastinate reports
            log.warning("job %s: its error was not recorded (%s)", job_id, _describe(failure))

    async def open(self) -> None:
        """Open the queue's connection pool (idempotent)."""
        async with self._lock:
            if not self._opened:
                await self.app.open_async()
                self._opened = True

    async def close(self) -> None:
        """Stop the in-process worker (it finishes the job it runs) and close the pool."""
        await self.stop()
        async with self._lock:
            if self._opened and self._app is not None:
                await self._app.close_async()
            self._opened = False

    # -- workers ---------------------------------------------------------------------

    async def run_worker(
        self,
        *,
        concurrency: int = 1,
        wait: bool = True,
        name: str = "harbor-worker",
        install_signal_handlers: bool = True,
    ) -> None:
        """Run harbor-pg's jobs until stopped (``wait=False``: until the worker finds no
        job it may take; a job that waits for its session's running one counts as none).

        Beside the jobs, the worker runs again the jobs of workers that went silent
        (killed, or their machine lost) for ``stalled_seconds``: at its start and
        then every ``stalled_seconds / 2``.
        """
        await self.open()
        await self.retry_stalled()
        watcher = asyncio.get_running_loop().create_task(self._watch_stalled())
        try:
            await self.app.run_worker_async(
                queues=[QUEUE],
                concurrency=concurrency,
                wait=wait,
                name=name,
                install_signal_handlers=install_signal_handlers,
                fetch_job_polling_interval=self.poll_seconds,
                update_heartbeat_interval=max(self.stalled_seconds / 3, 0.1),
                stalled_worker_timeout=self.stalled_seconds,
            )
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def retry_stalled(self) -> int:
        """Queue again the running jobs of workers silent for ``stalled_seconds``; how many."""
        manager = self.app.job_manager
        stalled = await manager.get_stalled_jobs(
            queue=QUEUE, seconds_since_heartbeat=self.stalled_seconds
        )
        again = 0
        for job in stalled:
            try:
                await manager.retry_job(job)
            except Exception as exc:  # another worker took it back first
                log.debug("stalled job %s not retried here (%s)", job.id, exc)
            else:
                again += 1
                log.warning("job %s of a silent worker is queued again", job.id)
        return again

    async def _watch_stalled(self) -> None:
        while True:
            await asyncio.sleep(max(self.stalled_seconds / 2, 0.2))
            try:
                await self.retry_stalled()
            except Exception as exc:
                log.warning("looking for stalled jobs failed (%s)", _describe(exc))

    def start_in_process(self) -> None:
        """Run a worker in this event loop, in the background, until :meth:`stop`
        (started once; a no-op while it runs)."""
        if self._worker is not None and not self._worker.done():
            return
        self._worker = asyncio.get_running_loop().create_task(
            self.run_worker(name="harbor-in-process", install_signal_handlers=False),
            name="harbor-jobs",
        )
        self._worker.add_done_callback(_report_stop)

    async def stop(self) -> None:
        """Stop the in-process worker, if one runs."""
        worker, self._worker = self._worker, None
        if worker is None or worker.done():
            return
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    # -- looking at the queue (harbor-pg jobs) ----------------------------------------

    async def counts(self) -> list[dict[str, Any]]:
        """How many jobs are in each state, per task: ``task_name``, ``status``, ``jobs``."""
        await self.open()
        return await self.app.connector.execute_query_all_async(query("jobs_counts"))

    async def failures(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest failed jobs (``id``, ``task_name``, ``attempts``) with the error of
        their last failed run (``error``, ``has_output``, ``failed_at``)."""
        await self.open()
        return await self.app.connector.execute_query_all_async(query("jobs_failures"), limit=limit)

    async def retry(self, job_id: int) -> None:
        """Run a failed job once more, now (:class:`MemoryConfigurationError` when
        ``job_id`` is not a failed job of harbor-pg's queue)."""
        await self.open()
        if not await self._ours(job_id, "failed"):
            raise MemoryConfigurationError(f"job {job_id} is not a failed harbor-pg job")
        await self.app.job_manager.retry_job_by_id_async(job_id=job_id, retry_at=_now())

    async def cancel(self, job_id: int) -> bool:
        """Cancel a job that has not started; whether it was queued and is cancelled now.
        A session extraction cancelled lets its session's next turn queue a new one."""
        await self.open()
        rows = await self._job(job_id)
        if not any(r["status"] == "todo" for r in rows):
            return False
        cancelled = await self.app.job_manager.cancel_job_by_id_async(job_id)
        for row in rows:
            if cancelled and row["task_name"] == EXTRACT_SESSION_TASK:
                await self.handlers.release_session_extraction(owner_from_args(row["args"]))
        return cancelled

    async def _job(self, job_id: int) -> list[dict[str, Any]]:
        """``job_id``'s row if it is a job of harbor-pg's queue (none otherwise)."""
        rows: list[dict[str, Any]] = await self.app.connector.execute_query_all_async(
            query("jobs_status"), id=job_id
        )
        return rows

    async def _ours(self, job_id: int, status: str) -> bool:
        """Whether ``job_id`` is a job of harbor-pg's queue in ``status``."""
        return any(r["status"] == status for r in await self._job(job_id))

    async def wait_for(self, job_ids: Iterable[int], *, poll_seconds: float = 0.05) -> None:
        """Wait until none of ``job_ids`` is queued or running any more."""
        pending = list(job_ids)
        if not pending:
            return
        await self.open()
        while pending:
            rows = await self.app.connector.execute_query_all_async(query("jobs_open"), ids=pending)
            pending = [int(r["id"]) for r in rows]
            if pending:
                if self._worker is None or self._worker.done():
                    raise MemoryConfigurationError(
                        "jobs are pending and no worker runs in this process"
                    )
                await asyncio.sleep(poll_seconds)


def _now() -> Any:
    import datetime

    return datetime.datetime.now(datetime.UTC)


def _job_attributes(context: Any) -> dict[str, Any]:
    """A job's span attributes: its task, id and attempt (never its arguments)."""
    job = context.job
    return {
        "harbor.job.task": job.task_name,
        "harbor.job.id": job.id,
        "harbor.job.attempt": job.attempts,
    }


async def _upkeep(handlers: JobHandlers) -> None:
    """The periodic upkeep: expired working state reclaimed, expired memories closed."""
    await handlers.purge_working_state()
    await handlers.expire_memories()


async def _retention(handlers: JobHandlers) -> None:
    """The periodic retention: the configured tenants' rules, their counts logged."""
    receipts = await handlers.apply_configured_retention()
    for tenant_id, done in receipts.items():
        log.info(
            "retention of tenant %r: %d rows deleted, %d memories closed",
            tenant_id,
            sum(r.total for r in done),
            sum(r.expired for r in done),
        )


async def _none(work: Awaitable[Any]) -> None:
    """``work`` awaited, its result dropped (a job's work returns nothing)."""
    await work


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _backoff(retries: int, first_seconds: float) -> Any:
    """procrastinate's retry strategy for harbor-pg's jobs: up to ``retries`` more runs,
    the first after ``first_seconds``, each later one after twice the wait before it.
    Not retried: a configuration error (no model here) and a model answer that stayed
    unreadable after its repair attempt (the same prompt would fail the same way)."""
    from procrastinate.retry import BaseRetryStrategy, RetryDecision

    from harbor_pg.llm.base import MemoryModelError

    class Backoff(BaseRetryStrategy):
        def get_retry_decision(self, *, exception: BaseException, job: Any) -> Any:
            if job.attempts >= retries or isinstance(exception, MemoryConfigurationError):
                return None
            if isinstance(exception, MemoryModelError) and exception.raw_output is not None:
                return None
            wait = first_seconds * 2**job.attempts
            return RetryDecision(retry_in={"milliseconds": round(wait * 1000)})

    return Backoff()


def _tolerate_erased_jobs(manager: Any) -> None:
    """Let ``manager`` (procrastinate's job manager) end a job whose row is gone.

    Erasure deletes the erased subject's jobs in its transaction, running ones too, so
    that no row of the queue names them afterwards; the job itself then writes nothing
    (its writes find its turn gone). When its run ends, procrastinate's finish or
    retry of it finds no row and raises, in a task nobody awaits: here that is a
    job that was erased, said once at INFO, and nothing else changes."""
    for name in ("finish_job", "retry_job"):
        step = getattr(manager, name)

        async def tolerant(job: Any, *args: Any, _step: Any = step, **kwargs: Any) -> Any:
            try:
                return await _step(job, *args, **kwargs)
            except Exception as exc:
                if "Job was not found" not in str(exc.__cause__ or ""):
                    raise
                log.info("job %s was erased while it ran", job.id)
                return None

        setattr(manager, name, tolerant)


def _report_stop(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("the in-process job worker stopped (%s)", task.exception())
