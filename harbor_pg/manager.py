"""MemoryManager: the single facade chat and agent code imports."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from harbor_pg.changes import MemoryWatch
from harbor_pg.config import MemoryManagerConfig
from harbor_pg.consolidation import (
    MERGE_SYSTEM_PROMPT,
    ConsolidationReport,
    ConsolidationRequest,
    MergedText,
    merge_prompt,
)
from harbor_pg.context.background import BackgroundSummaries
from harbor_pg.context.recall import MemoryRecall
from harbor_pg.context.snapshot import MemorySnapshot, snapshot_in_one_round_trip
from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query as sql_query
from harbor_pg.embedders.base import Embedder, duplicate_threshold_of
from harbor_pg.errors import MemoryConfigurationError, MemoryScopeError, MemoryValidationError
from harbor_pg.extraction.facade import Extraction
from harbor_pg.governance import Governance
from harbor_pg.jobs import JobRunner
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.portability import Portability
from harbor_pg.profile import ProfileRequest, UserProfile
from harbor_pg.records import (
    ConversationMessage,
    Memory,
    MemoryType,
    content_hash,
)
from harbor_pg.reembed import Reembedding
from harbor_pg.telemetry import traced
from harbor_pg.tiers.base import (
    ConsolidatingStore,
    LongTermStore,
    ObservationStore,
    ProfileStore,
    SaveResult,
    ShortTermStore,
    WorkingStore,
)
from harbor_pg.tiers.facades import LongTermMemory, ShortTermMemory, WorkingMemory, unwrap_store
from harbor_pg.tiers.in_process import (
    InMemoryLongTermStore,
    InMemoryShortTermStore,
    InMemoryWorkingStore,
)
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.postgres import all_postgres, is_postgres
from harbor_pg.tiers.replica import READ_URL_ENV, ReadReplica
from harbor_pg.tiers.session_ttl import LiveTurns
from harbor_pg.tiers.short_term import PostgresShortTermStore
from harbor_pg.tiers.working import PostgresWorkingStore
from harbor_pg.tiers.writer import LongTermWrites, embed_memories
from harbor_pg.validation import (
    check_as_of,
    check_count,
    check_json,
    check_text,
    check_ttl,
    first_error,
)

__all__ = ["MemoryManager", "MemoryManagerConfig", "MemorySnapshot"]

log = logging.getLogger("harbor_pg")

T = TypeVar("T")

#: what a model is asked when it writes an observation (MemoryManager.observe)
OBSERVE_SYSTEM = (
    "You write one sentence that says what the facts below, all about one entity, add up "
    "to: what they show together, not a list of them. Use only what they say. Answer with "
    "the sentence alone."
)


class MemoryManager(LongTermWrites, Governance, Portability, Extraction, Reembedding):
    """One facade over the tiers you configure.

    Pass only the stores you use (or seed 000's tier objects wrapping them,
    ``WorkingMemory(InMemoryWorkingMemoryStore())``); calling into an unconfigured tier raises
    :class:`MemoryConfigurationError`. ``await MemoryManager.create()`` with no
    arguments starts the embedded PostgreSQL and wires every tier.

    Bind the manager to the authenticated caller (``caller=`` or
    :meth:`bound_to`) and every method rejects, with :class:`MemoryScopeError`,
    an owner that is not exactly that caller: the ones taking an owner, the
    governance ones for another tenant or subject, and the helpers it hands
    out (:meth:`recaller`, :meth:`context_builder`,
    :meth:`background_summarizer`) on every call. The tier attributes
    (``short_term``, ``working``, ``long_term``) are the raw stores and are not
    bound.

    The methods of each feature are defined beside it and mixed in: long-term
    writes (:class:`~harbor_pg.tiers.writer.LongTermWrites`), erasure and
    retention (:class:`~harbor_pg.governance.Governance`), export and import
    (:class:`~harbor_pg.portability.Portability`) and fact extraction
    (:class:`~harbor_pg.extraction.facade.Extraction`).
    """

    def __init__(
        self,
        *,
        short_term: ShortTermStore | ShortTermMemory | None = None,
        working: WorkingStore | WorkingMemory | None = None,
        long_term: LongTermStore | LongTermMemory | None = None,
        config: MemoryManagerConfig | None = None,
        caller: MemoryOwner | None = None,
        database: Database | None = None,
        embedder: Embedder | None = None,
        policy: MemoryPolicy | None = None,
        summary_model: Any = None,
        replica: ReadReplica | None = None,
        extraction_model: Any = None,
        previous_embedder: Embedder | None = None,
    ) -> None:
        # seed 000's tier objects (WorkingMemory(store), ...) are accepted for their store
        self.short_term: ShortTermStore | None = unwrap_store(short_term)
        self.working: WorkingStore | None = unwrap_store(working)
        self.long_term: LongTermStore | None = unwrap_store(long_term)
        self.config = config or MemoryManagerConfig()
        self.caller = caller
        self.database = database
        #: embeds memories on save and queries on recall (None: lexical recall only)
        self.embedder = embedder
        #: recall settings (scopes, top_k, weights, budget); see MemoryPolicy
        self.policy = policy or MemoryPolicy()
        #: writes background session summaries (a MemoryModel or LangChain chat model;
        #: None: the extractive summary, nothing leaves the machine)
        self.summary_model = summary_model
        #: a hot standby for recall, snapshot, recent and search (None: the primary)
        self.replica = replica
        #: extracts facts from each appended turn, as a job queued with the turn
        #: (a MemoryModel or LangChain chat model; None: no extraction on append)
        self.extraction_model = extraction_model
        #: the model recall searches until the backfill to ``embedder``'s is complete for
        #: the owner (harbor_pg.reembed; None: no model change under way)
        self.previous_embedder = previous_embedder
        self._switched = {}
        queues = extraction_model is not None or self.config.summaries_on_queue
        if queues and self.config.jobs_in_process and database and not database.admin_url:
            raise MemoryConfigurationError(
                "this manager would run its queued jobs itself (jobs_in_process), which needs "
                "the elevated login: pass Database(app_url, admin_url), or set "
                "MemoryManagerConfig(jobs_in_process=False) and run harbor-pg worker"
            )
        self._owns_database = False
        self._background = BackgroundSummaries()
        #: the queue's runner, made on first use and shared with bound copies
        self._jobs_box: dict[str, JobRunner] = {}
        self._live: LiveTurns | None = None

    # -- construction -------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        *,
        database_url: str | None = None,
        data_dir: str | Path | None = None,
        caller: MemoryOwner | None = None,
        config: MemoryManagerConfig | None = None,
        in_process: bool = False,
        embedder: Embedder | None = None,
        embeddings: bool = True,
        policy: MemoryPolicy | None = None,
        summary_model: Any = None,
        read_url: str | None = None,
        extraction_model: Any = None,
        previous_embedder: Embedder | None = None,
    ) -> MemoryManager:
        """A manager with every tier, ready to use.

        With no arguments: the embedded PostgreSQL (started and migrated on
        first use, reused afterwards), or ``HARBOR_DATABASE_URL`` when set.
        ``in_process=True`` gives process-local stores instead (no database).

        Memories are embedded with ``embedder``, or else with the best one that
        loads here (:func:`~harbor_pg.embedders.default_embedder`: fastembed,
        ``HARBOR_EMBED_MODEL_PATH``, else the hashing embedder with a WARNING);
        ``embeddings=False`` switches vectors off (lexical recall only).

        ``read_url`` (or ``HARBOR_READ_DATABASE_URL``): a hot standby of that
        server; reads go there, writes to the primary (:mod:`harbor_pg.tiers.replica`).

        ``extraction_model``: facts are extracted from every appended turn by a
        job queued in the turn's transaction (:meth:`append`).

        ``previous_embedder``: the model the stored vectors are of, when ``embedder``
        is a new one: recall searches it until :meth:`reembed` has backfilled the new
        model's vectors (:mod:`harbor_pg.reembed`).
        """
        if in_process:
            return cls(
                short_term=InMemoryShortTermStore(),
                working=InMemoryWorkingStore(),
                long_term=InMemoryLongTermStore(),
                config=config,
                caller=caller,
                policy=policy,
                summary_model=summary_model,
                extraction_model=extraction_model,
            )
        if embedder is None and embeddings:
            from harbor_pg.embedders import default_embedder

            embedder = default_embedder()
        from harbor_pg.db import migrate, server

        info = server.resolve_server(
            database_url, data_dir=Path(data_dir) if data_dir is not None else None
        )
        migrate.upgrade(info.owner_url, known_state=info.schema_state)
        db = Database(info.app_url, info.admin_url)
        await db.open()
        manager = cls.from_database(
            db,
            config=config,
            caller=caller,
            embedder=embedder,
            policy=policy,
            summary_model=summary_model,
            extraction_model=extraction_model,
            previous_embedder=previous_embedder,
        )
        manager._owns_database = True
        read_url = read_url or os.environ.get(READ_URL_ENV)
        if read_url:
            reader = Database(read_url)
            await reader.open()
            manager.replica = ReadReplica(reader)
        return manager

    @classmethod
    def from_database(
        cls,
        db: Database,
        *,
        config: MemoryManagerConfig | None = None,
        caller: MemoryOwner | None = None,
        embedder: Embedder | None = None,
        policy: MemoryPolicy | None = None,
        summary_model: Any = None,
        extraction_model: Any = None,
        previous_embedder: Embedder | None = None,
    ) -> MemoryManager:
        """Every tier backed by ``db`` (an open :class:`Database`)."""
        return cls(
            short_term=PostgresShortTermStore(db),
            working=PostgresWorkingStore(db),
            long_term=PostgresLongTermStore(db),
            config=config,
            caller=caller,
            database=db,
            embedder=embedder,
            policy=policy,
            summary_model=summary_model,
            extraction_model=extraction_model,
            previous_embedder=previous_embedder,
        )

    def bound_to(self, caller: MemoryOwner) -> MemoryManager:
        """The same tiers, bound to an authenticated caller: every method then
        rejects any other owner with :class:`MemoryScopeError`.

        A bound manager binds only to its own caller again (bind other callers
        from the unbound manager).
        """
        self._check_caller(caller)
        clone = MemoryManager(
            short_term=self.short_term,
            working=self.working,
            long_term=self.long_term,
            config=self.config,
            caller=caller,
            database=self.database,
            embedder=self.embedder,
            policy=self.policy,
            summary_model=self.summary_model,
            replica=self.replica,
            extraction_model=self.extraction_model,
            previous_embedder=self.previous_embedder,
        )
        clone._switched = self._switched  # one record of the owners switched to the new model
        clone.reembed_recheck_seconds = self.reembed_recheck_seconds
        clone._background = self._background  # one set of background summaries to drain
        clone._jobs_box = self._jobs_box  # and one job runner
        return clone

    async def close(self) -> None:
        """Wait for background summaries and the jobs this manager runs, stop its
        in-process job worker, then close the database pools this manager opened."""
        try:
            await self.drain()
        finally:
            jobs = self._jobs_box.get("runner")
            if jobs is not None:
                await jobs.close()
            if self._owns_database and self.database is not None:
                await self.database.close()
                if self.replica is not None:
                    await self.replica.database.close()

    async def drain(self) -> None:
        """Wait until every background summary scheduled so far has finished, the
        recall hits counted so far are written, and, when this manager runs the
        queue's jobs itself, every job it queued."""
        await self._background.drain()
        drain_hits = getattr(self.long_term, "drain_hits", None)
        if drain_hits is not None:  # the recall hits still being counted
            await drain_hits()
        jobs = self._jobs_box.get("runner")
        # (a job may queue another: a consolidation after an extraction)
        while jobs is not None and self.config.jobs_in_process and jobs.queued:
            queued = list(jobs.queued)
            await jobs.wait_for(queued)
            jobs.queued.difference_update(queued)

    async def __aenter__(self) -> MemoryManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- tier access ----------------------------------------------------------------

    # -- short-term -----------------------------------------------------------------

    @traced("harbor_pg.append", result=lambda m: {"harbor.message.role": m.role})
    async def append(
        self, owner: MemoryOwner, turn: ConversationMessage | dict[str, Any] | Any
    ) -> ConversationMessage:
        """Append one turn (a ConversationMessage, a dict, or a LangChain message).

        Once the session is due a summary (``summarise_after_turns`` new turns,
        the cooldown passed; see :meth:`background_summarizer`) it is summarised
        in the background. Append never waits for that and never fails for it.

        With an ``extraction_model`` (PostgreSQL stores only), the turn's fact
        extraction is queued in the turn's own transaction (:mod:`harbor_pg.jobs`):
        a turn that is not stored has no job, a stored one always has one; so is
        the summary fold of a session the turn makes due (also with
        ``MemoryManagerConfig.summaries_on_queue`` alone). A worker
        (``harbor-pg worker``) runs them, or, with
        ``MemoryManagerConfig.jobs_in_process`` (the default), this manager in its
        event loop.
        """
        self._check_caller(owner)
        store = self._short()
        message = self._turn(owner, turn)
        self._wrote(owner)
        if self._queues_jobs():
            return await self._append_with_jobs(owner, message)
        background = self._background
        if not (
            self.config.summarise_in_background
            and self.policy.enabled
            and owner.principal_id is not None
            and background.can_summarise(store, self.long_term)
        ):
            return await store.append(owner, message)
        return await background.append(
            store, owner, message, policy=self.policy, summarise_if_due=self._summarise_if_due
        )

    def _queues_jobs(self) -> bool:
        """Whether appends queue jobs (extraction is configured, or summaries go on the
        queue), on the PostgreSQL stores."""
        if self.extraction_model is None and not self.config.summaries_on_queue:
            return False
        if not isinstance(self.short_term, PostgresShortTermStore):
            raise MemoryConfigurationError(
                "extraction_model and summaries_on_queue need the PostgreSQL stores: their "
                "jobs are queued in the database, with the turn"
            )
        return True

    def watch(self, owner: MemoryOwner) -> MemoryWatch:
        """The changes to memories that ``owner`` may read, as they commit (PostgreSQL
        stores): an async iterator of :class:`~harbor_pg.changes.MemoryChange`.

        Each change was announced on the tenant's channel in the transaction that made
        it (ids and a kind only) and is read back as ``owner``, under row-level
        security, before it is yielded: what an inspector, a cache or a webhook relay
        subscribes to. ``async with manager.watch(owner) as changes:`` listens from
        the ``with``; a bare ``async for`` from its first step. See
        :mod:`harbor_pg.changes`.
        """
        self._check_caller(owner)
        store = unwrap_store(self._long())
        if self.database is None or not isinstance(store, PostgresLongTermStore):
            raise MemoryConfigurationError("watch() needs the PostgreSQL stores")
        return MemoryWatch(self.database.app_url, owner, store)

    def job_runner(self) -> JobRunner:
        """The queue's tasks over this manager (:mod:`harbor_pg.jobs`), made on first use;
        what ``harbor-pg worker`` runs. Its jobs run as the owners in their arguments,
        so a bound manager refuses (:class:`MemoryScopeError`): use the unbound one."""
        if self.caller is not None:
            raise MemoryScopeError(
                "a bound manager runs no jobs (they run as their own owners): use the "
                "unbound manager's job_runner() or run_worker()"
            )
        return self._job_runner()

    def _job_runner(self) -> JobRunner:
        runner = self._jobs_box.get("runner")
        if runner is None:
            admin_url = self.database.admin_url if self.database else None
            # a job runs as the owner in its arguments, whoever this copy is bound to
            handlers = self
            if self.caller is not None:
                handlers = copy.copy(self)
                handlers.caller = None
            config = self.config
            runner = self._jobs_box["runner"] = JobRunner(
                handlers,
                admin_url,
                retries=config.job_retries,
                retry_seconds=config.job_retry_seconds,
                stalled_seconds=config.job_stalled_seconds,
                poll_seconds=config.job_poll_seconds,
                consolidate_after_extraction=config.consolidate_after_extraction,
                retention_cron=config.retention_cron if config.retention else None,
                consolidation_cron=config.consolidation_cron,
            )
        return runner

    async def run_worker(self, *, concurrency: int = 1, wait: bool = True) -> None:
        """Run the queue's jobs with this manager's models, as their owners, until
        stopped (SIGINT, SIGTERM) or, with ``wait=False``, until it finds no job it may
        take (a job waiting for its session's running one counts as none).
        Refused by a bound manager (:meth:`job_runner`)."""
        await self.job_runner().run_worker(concurrency=concurrency, wait=wait)

    async def _append_with_jobs(
        self, owner: MemoryOwner, message: ConversationMessage
    ) -> ConversationMessage:
        store = self.short_term
        assert isinstance(store, PostgresShortTermStore)
        fold = (
            self.config.summarise_in_background
            and self.policy.enabled
            and owner.principal_id is not None
            and self._background.can_summarise(store, self.long_term)
        )
        stored, _due, job_ids = await store.append_with_jobs(
            owner,
            message,
            min_turns=self.policy.summarise_after_turns,
            cooldown_seconds=self.policy.summary_cooldown_seconds,
            extract=self.extraction_model is not None,
            fold=fold,
            slots=self.config.job_model_concurrency,
            delay_seconds=self.config.extraction_delay_seconds,
        )
        if self.config.jobs_in_process and job_ids:
            try:
                runner = self._job_runner()
                runner.queued.update(job_ids)
                await runner.open()
                runner.start_in_process()
            except Exception as exc:  # the turn and its jobs are stored: a worker runs them
                log.warning("the in-process job worker did not start (%s)", exc)
        return stored

    def _turn(
        self, owner: MemoryOwner, turn: ConversationMessage | dict[str, Any] | Any
    ) -> ConversationMessage:
        """``turn`` validated for ``owner``'s session (raises before anything is written)."""
        message = _to_message(turn)
        self._check_content(message.content, "turn content")
        owner.require_scope(MemoryScope.SESSION)
        return message

    async def recent(
        self, owner: MemoryOwner, limit: int | None = None
    ) -> list[ConversationMessage]:
        """The newest turns of the owner's session, oldest first.

        At most ``MemoryPolicy.max_session_turns`` (default 50) are addressable;
        older turns are kept for summaries until erased.
        """
        self._check_caller(owner)
        store = self._live_turns()
        owner.require_scope(MemoryScope.SESSION)
        if self._reads_replica(owner):
            assert self.replica is not None
            store = LiveTurns(self.replica.short_term, self.config.session_ttl_seconds)
        turns: list[ConversationMessage] = await store.recent(owner, self._recent_limit(limit))
        return turns

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the owner's session turns; returns how many."""
        self._check_caller(owner)
        self._wrote(owner)
        store = self._short()
        owner.require_scope(MemoryScope.SESSION)
        return await store.clear(owner)

    # -- working --------------------------------------------------------------------

    async def scratch(self, owner: MemoryOwner) -> dict[str, Any]:
        """The run's working state ({} when none or expired)."""
        self._check_caller(owner)
        store = self._working()
        owner.require_scope(MemoryScope.RUN)
        return await store.get(owner)

    async def update(
        self, owner: MemoryOwner, state: dict[str, Any], ttl_seconds: float | None = None
    ) -> dict[str, Any]:
        """Merge ``state``'s keys into the run's working state; returns the result."""
        self._check_caller(owner)
        self._wrote(owner)
        store = self._working()
        owner.require_scope(MemoryScope.RUN)
        check_json(state, "working state")
        try:
            encoded = json.dumps(state, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise MemoryValidationError(f"working state must be JSON: {exc}") from None
        self._check_content(encoded, "working state")
        if ttl_seconds is not None:
            ttl_seconds = check_ttl(ttl_seconds)
        return await store.update(owner, state, ttl_seconds)

    async def clear_working(self, owner: MemoryOwner) -> int:
        """Delete the run's working state."""
        self._check_caller(owner)
        store = self._working()
        owner.require_scope(MemoryScope.RUN)
        return await store.clear(owner)

    # -- long-term ------------------------------------------------------------------

    # Near-copy of MemoryRecall.recall's signature, on purpose: the facade's own documented
    # entry point, which delegates (as snapshot and the other facade methods do).
    async def recall(
        self,
        owner: MemoryOwner,
        query: str,
        *,
        anchor_entity_ids: Sequence[str] = (),
        wanted_types: Sequence[MemoryType | str] = (),
        as_of: datetime | None = None,
        top_k: int | None = None,
        token_budget: int | None = None,
        excluded_types: Sequence[MemoryType | str] = (),
    ) -> tuple[Memory, ...]:
        """Hybrid recall under this manager's policy (see :class:`MemoryRecall`).

        Never raises for a failing leg; bad arguments raise MemoryValidationError
        (a query or an anchor entity id with a NUL or a lone surrogate, an ``as_of``
        that is not a datetime, a ``top_k`` that is not a whole number). A bound
        manager rejects another owner. ``wanted_types`` boosts memories of
        those types; ``excluded_types`` (say ``["observation"]``) leaves them out.
        """
        self._check_caller(owner)
        recaller = await self._recaller_for(owner)
        if self._reads_replica(owner):
            assert self.replica is not None
            recaller = MemoryRecall(
                policy=self.policy,
                memories=self.replica.long_term,
                embedder=await self.query_embedder(owner),
            )
        return await recaller.recall(
            owner,
            query,
            anchor_entity_ids=anchor_entity_ids,
            wanted_types=wanted_types,
            as_of=as_of,
            top_k=top_k,
            token_budget=token_budget,
            excluded_types=excluded_types,
        )

    def context_builder(
        self,
        *,
        model: Any = None,
        policy: MemoryPolicy | None = None,
        **options: Any,
    ) -> Any:
        """A :class:`~harbor_pg.context.builder.MemoryContextBuilder` over this manager's tiers.

        ``model`` is an optional :class:`~harbor_pg.llm.MemoryModel` (None: the
        no-model path, an extractive summary and no rewrite, so nothing leaves
        the machine). ``options`` go to the builder (``token_counter``,
        ``prompt_tokens``, ``page_size``, ...).
        """
        from harbor_pg.context.builder import MemoryContextBuilder

        chosen = policy or self.policy
        recall = MemoryRecall(policy=chosen, memories=self._long(), embedder=self.embedder)
        if "background" not in options:
            options["background"] = self.background_summarizer(model=model, policy=chosen)
        return self._guarded(
            MemoryContextBuilder(
                policy=chosen,
                messages=self._live_turns(),
                memories=self.long_term,  # type: ignore[arg-type]
                model=model,
                recall=recall,
                profile=self.long_term if isinstance(self.long_term, ProfileStore) else None,
                **options,
            )
        )

    def background_summarizer(
        self, *, model: Any = None, policy: MemoryPolicy | None = None
    ) -> Any:
        """The manager's :class:`~harbor_pg.context.summarizer.SessionSummarizer`.

        :meth:`append` (with ``model=summary_model``) and builders from
        :meth:`context_builder` schedule it after each turn: once a session has
        ``summarise_after_turns`` new turns it is summarised in the background,
        one worker at a time (a lease row in the database, with the cooldown).
        :meth:`close` waits for running summaries.
        """
        found = self._background.summarizer(
            policy=policy or self.policy,
            messages=self._live_turns(),
            memories=self._long(),  # type: ignore[arg-type]
            model=model,
        )
        return self._guarded(found)

    async def run_summary_job(self, owner: MemoryOwner) -> None:
        """Run a queued summary fold (:mod:`harbor_pg.jobs`): ``owner``'s session is
        summarised with the manager's ``summary_model`` if it is still due (the summary
        lease decides, so a fold queued twice folds once). A fold that fails raises,
        after saving what it folded until then: the queue retries it, and shows it
        failed with its error once the retries are spent."""
        self._check_caller(owner)
        await self._background.summarise_if_due(
            owner,
            checked=False,
            short_term=self.short_term,
            policy=self.policy,
            summarizer=lambda: self.background_summarizer(model=self.summary_model),
            strict=True,
        )

    async def _summarise_if_due(self, owner: MemoryOwner, checked: bool) -> None:
        await self._background.summarise_if_due(
            owner,
            checked=checked,
            short_term=self.short_term,
            policy=self.policy,
            summarizer=lambda: self.background_summarizer(model=self.summary_model),
        )

    async def _recaller_for(self, owner: MemoryOwner) -> MemoryRecall:
        """:meth:`recaller`, searching the model ``owner``'s vectors are complete in."""
        embedder = await self.query_embedder(owner)
        if embedder is self.embedder:
            return self.recaller()
        recall = MemoryRecall(policy=self.policy, memories=self._long(), embedder=embedder)
        return self._guarded(recall)

    def recaller(self) -> MemoryRecall:
        """A :class:`MemoryRecall` over this manager's long-term store, policy and embedder
        (on a bound manager, one that rejects any other owner)."""
        recall = MemoryRecall(policy=self.policy, memories=self._long(), embedder=self.embedder)
        return self._guarded(recall)

    async def get(self, caller: MemoryOwner, memory_id: str) -> Memory | None:
        """One memory the caller may see, or None."""
        self._check_caller(caller)
        check_text(memory_id, "memory_id")
        return await self._long().get(caller, memory_id)

    async def search(
        self,
        caller: MemoryOwner,
        query_text: str,
        *,
        limit: int = 10,
        as_of: datetime | None = None,
    ) -> list[Memory]:
        """Memories visible to ``caller`` that match ``query_text``."""
        self._check_caller(caller)
        check_text(query_text, "query")
        check_count(limit, "limit")
        check_as_of(as_of)
        store = self._long()
        if self._reads_replica(caller):
            assert self.replica is not None
            store = self.replica.long_term
        return await store.search(caller, query_text, limit=limit, as_of=as_of)

    async def delete(self, caller: MemoryOwner, memory_id: str) -> bool:
        """Delete one of the caller's own memories; False when none was deleted."""
        self._check_caller(caller)
        check_text(memory_id, "memory_id")
        self._wrote(caller)
        return await self._long().delete(caller, memory_id)

    async def history(self, caller: MemoryOwner, memory_id: str) -> list[Memory]:
        """``memory_id``'s supersession chain as far as ``caller`` may see it, oldest
        first: the versions it replaced, itself, the versions that replaced it (each
        with its validity interval). Empty when the memory is not visible."""
        self._check_caller(caller)
        store = self._long()
        history = getattr(store, "history", None)
        if history is None:
            raise MemoryConfigurationError("memory history needs the PostgreSQL long-term store")
        result: list[Memory] = await history(caller, memory_id)
        return result

    async def current_memories(
        self,
        caller: MemoryOwner,
        scopes: Sequence[MemoryScope | str] = (
            MemoryScope.USER,
            MemoryScope.SESSION,
            MemoryScope.PROJECT,
        ),
        *,
        limit: int = 100,
    ) -> list[Memory]:
        """``caller``'s currently valid memories in ``scopes`` (user, session and
        project; those it can address), newest first, at most ``limit``; no summaries."""
        self._check_caller(caller)
        if limit < 0:
            raise MemoryValidationError("limit must be >= 0")
        store = self._long()
        try:
            wanted = [MemoryScope(s) for s in scopes]
        except ValueError as exc:
            raise MemoryValidationError(str(exc)) from None
        wanted = [s for s in wanted if caller.can_address(s)]
        current = getattr(store, "current_memories", None)
        if current is None:
            raise MemoryConfigurationError("listing memories needs a store that can list them")
        found: list[Memory] = await current(caller, wanted, limit=limit)
        return found

    async def profile(
        self,
        caller: MemoryOwner,
        *,
        token_budget: int | None = 400,
        stable_after: timedelta = timedelta(days=30),
        scopes: Sequence[MemoryScope | str] = (MemoryScope.USER,),
        as_of: datetime | None = None,
    ) -> UserProfile:
        """``caller``'s profile: their current durable memories of ``scopes`` (user by
        default; among user, project, session and run, those the caller can address),
        in two sections: ``stable`` (valid for at least ``stable_after``: most important
        first, then the most often recalled, then the longest held) and ``recent``
        (newest first), together within ``token_budget`` tokens (None: no budget). One
        call; on PostgreSQL one round trip to ``harbor.profile()``. The recall policy's
        ``max_sensitivity`` applies. Raises :class:`MemoryValidationError` on a bad argument and
        :class:`MemoryConfigurationError` for a long-term store that keeps no profile."""
        self._check_caller(caller)
        try:
            request = ProfileRequest(
                scopes=tuple(MemoryScope(s) for s in scopes),
                token_budget=token_budget,
                stable_after=stable_after,
                as_of=as_of,
                max_sensitivity=self.policy.recall_max_sensitivity,
            )
        except ValueError as exc:
            raise MemoryValidationError(str(exc)) from None
        store = self._long()
        if not isinstance(store, ProfileStore):
            raise MemoryConfigurationError(
                "a profile needs a long-term store that keeps one (both built-in stores do)"
            )
        return await store.profile(caller, request)

    async def consolidate(
        self,
        caller: MemoryOwner,
        *,
        scopes: Sequence[MemoryScope | str] = (MemoryScope.USER,),
        min_similarity: float | None = None,
        max_merges: int = 1000,
        dry_run: bool = False,
        since: datetime | None = None,
        model: Any = None,
    ) -> ConsolidationReport:
        """Merge ``caller``'s near-duplicate current memories of ``scopes`` (user by default;
        among user, project, session and run, those the caller can address), add-only.

        Memories of one owner key and one writer whose texts are the same once case and
        punctuation are set aside, or (with an embedder) whose content vectors are at
        least ``min_similarity`` similar (default: the embedder's calibrated
        ``duplicate_threshold``, 0.955 for MiniLM-L6 and 0.83 for the hashing embedder, or
        0.97 for an embedder never calibrated), are superseded by one
        successor that keeps the best-ranked text (most important, then newest), the
        highest importance and sensitivity, and every entity and source turn; the
        originals stay readable as of before (:mod:`harbor_pg.consolidation`). At most
        ``max_merges`` groups a call; ``dry_run`` reports the groups and writes nothing;
        ``since`` compares vectors only in pairs with a memory stored at or after it (a
        periodic run passes the start of its last: new with all, not all with all).
        Safe beside concurrent writers and consolidations:
        a group is merged once. With ``model`` (a :class:`~harbor_pg.llm.MemoryModel` or a
        LangChain chat model), each group's successor gets a text the model writes from
        the group's texts (``metadata["written_by_model"]``, its own vector); a model that
        fails, or answers nothing usable, leaves that group the head's text. Raises
        :class:`MemoryValidationError` on a bad argument and
        :class:`MemoryConfigurationError` for a store that cannot merge."""
        self._check_caller(caller)
        vectors = self.embedder is not None and self.embedder.model_id is not None
        threshold = min_similarity
        if threshold is None and vectors:
            threshold = duplicate_threshold_of(self.embedder)
        try:
            request = ConsolidationRequest(
                scopes=tuple(MemoryScope(s) for s in scopes),
                min_similarity=threshold,
                model_id=self.embedder.model_id if vectors and self.embedder else None,
                max_merges=max_merges,
                dry_run=dry_run,
                since=since,
            )
        except ValueError as exc:
            raise MemoryValidationError(str(exc)) from None
        store = self._long()
        if not isinstance(store, ConsolidatingStore):
            raise MemoryConfigurationError(
                "consolidation needs a long-term store that merges (both built-in stores do)"
            )
        if model is not None and not dry_run:
            # (imported here: a manager that never merges with a model never loads LangChain)
            from harbor_pg.llm.langchain import as_memory_model

            preview = await store.consolidate(caller, replace(request, dry_run=True))
            written = await self._written_merges(caller, store, preview, as_memory_model(model))
            request = replace(request, merged=written or None)
        return await store.consolidate(caller, request)

    async def run_consolidation_job(self, owner: MemoryOwner, since: datetime) -> None:
        """Run a queued consolidation job (:mod:`harbor_pg.jobs`, queued after an
        extraction when ``MemoryManagerConfig.consolidate_after_extraction``):
        :meth:`consolidate` of ``owner``'s user and project memories (those it can
        address), comparing the memories stored since ``since`` with the rest; then,
        with ``MemoryManagerConfig.observe_after_consolidation`` and an
        ``extraction_model``, :meth:`observe` with that model."""
        scopes = [s for s in (MemoryScope.USER, MemoryScope.PROJECT) if owner.can_address(s)]
        await self.consolidate(owner, scopes=scopes, since=since)
        if self.config.observe_after_consolidation and self.extraction_model is not None:
            await self.observe(owner, model=self.extraction_model)

    async def observe(
        self,
        caller: MemoryOwner,
        *,
        model: Any,
        min_facts: int = 3,
        max_observations: int = 20,
    ) -> list[Memory]:
        """Write observations: for each entity that at least ``min_facts`` of
        ``caller``'s current user memories name (``entity_ids``), one sentence ``model``
        (a :class:`~harbor_pg.llm.MemoryModel` or LangChain chat model) writes from those
        facts, saved as a USER memory of type ``observation`` with that entity, the
        facts' highest importance and sensitivity, source ``reflection`` and the ids of
        the facts it read (``metadata["observed_ids"]``). An entity whose facts are the
        ones its current observation read gets none; one whose facts changed (added,
        superseded, merged) gets a new observation that supersedes the old, so
        ``history`` and ``as_of`` show what was observed when. At most
        ``max_observations`` a call, the entities with the most facts first; a model
        that fails or answers nothing usable leaves that entity as it was. An
        observation whose facts fell away is closed, with no successor (its row stays,
        current as of before): its entity has fewer than ``min_facts`` current facts,
        or a fact it read is no longer current (superseded, merged, expired, erased)
        and no new observation replaced it in this call. Returns the observations
        written. Recall returns them like any memory; it asks for them with
        ``wanted_types=["observation"]``."""
        self._check_caller(caller)
        if min_facts < 2 or max_observations < 0:
            raise MemoryValidationError("min_facts must be >= 2 and max_observations >= 0")
        caller.require_scope(MemoryScope.USER)
        store = self._long()
        if not isinstance(store, ObservationStore):
            raise MemoryConfigurationError(
                "observations need a long-term store with current_memories, supersede and "
                "close_memory (both built-in stores have them)"
            )
        # (imported here: a manager that never observes never loads LangChain)
        from harbor_pg.llm.langchain import as_memory_model

        writer = as_memory_model(model)
        if writer is None:
            raise MemoryConfigurationError("observe needs a model to write the observations")
        rows = await store.current_memories(caller, [MemoryScope.USER], limit=10_000)
        current: dict[str, Memory] = {}  # entity -> its current observation
        by_entity: dict[str, list[Memory]] = {}
        for row in rows:
            if row.memory_type is MemoryType.OBSERVATION:
                for entity in row.entity_ids[:1]:
                    current.setdefault(entity, row)
                continue
            for entity in dict.fromkeys(row.entity_ids):
                by_entity.setdefault(entity, []).append(row)
        written: list[Memory] = []
        renewed: set[str] = set()  # entities whose observation was written anew
        for entity, facts in sorted(by_entity.items(), key=lambda e: (-len(e[1]), e[0])):
            if len(facts) < min_facts or len(written) >= max_observations:
                continue
            ids = sorted(f.id or "" for f in facts)
            old = current.get(entity)
            if old is not None and sorted(old.metadata.get("observed_ids") or []) == ids:
                continue  # what it read still holds
            lines = "\n".join(f"- {f.content}" for f in sorted(facts, key=lambda f: f.id or ""))
            try:
                text = (await writer.generate_text(OBSERVE_SYSTEM, f"Facts:\n{lines}")).strip()
                memory = Memory(
                    content=text,
                    memory_type=MemoryType.OBSERVATION,
                    scope=MemoryScope.USER,
                    entity_ids=[entity],
                    importance=max(f.importance for f in facts),
                    sensitivity=max((f.sensitivity for f in facts), key=lambda s: s.level),
                    source="reflection",
                    metadata={"observed_ids": ids},
                )
                self._check_memory(caller, memory)
            except Exception as exc:  # the model failed, or wrote nothing storable
                log.warning("observe: no observation of %s: %s", entity, exc)
                continue
            result: SaveResult | None
            if old is None:
                result = await self.save(caller, memory)
            else:
                embedder = self._vector_embedder(store)
                vectors = await embed_memories(embedder, [memory]) if embedder else None
                result = await store.supersede(
                    caller,
                    old.id or "",
                    memory,
                    vectors[0].content if vectors else None,
                    embedder.model_id if vectors and embedder else None,
                )
            if result is not None and result.created:
                written.append(result.memory)
                renewed.add(entity)
        current_ids = {row.id for row in rows}
        for entity, old in current.items():
            read = old.metadata.get("observed_ids") or []
            fell_away = len(by_entity.get(entity, ())) < min_facts or any(
                i not in current_ids for i in read
            )
            if entity not in renewed and fell_away:
                await store.close_memory(caller, old.id or "", old.scope)
        return written

    async def consolidate_tenant(
        self,
        tenant_id: str,
        *,
        min_similarity: float | None = None,
        max_merges: int = 1000,
        dry_run: bool = False,
        since: datetime | None = None,
        model: Any = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, ConsolidationReport]:
        """:meth:`consolidate` for every user of ``tenant_id`` who holds current memories of
        the user scope, each as that user (under row-level security), one call a user;
        returns each user's report. Listing the users needs the elevated role (an admin
        URL), and an unbound manager: a manager bound to one caller refuses. ``progress``
        is called with (users done, users) after each."""
        if self.caller is not None:
            raise MemoryScopeError("a manager bound to one caller consolidates only that caller")
        check_text(tenant_id, "tenant_id")
        if self.database is None:
            raise MemoryConfigurationError(
                "a tenant-wide consolidation needs the PostgreSQL stores"
            )
        async with self.database.transaction(MemoryOwner(tenant_id=tenant_id), admin=True) as conn:
            cur = await conn.execute(sql_query("tenant_users"), {"tenant_id": tenant_id})
            users = [str(row["user_id"]) for row in await cur.fetchall()]
        reports: dict[str, ConsolidationReport] = {}
        for done, user in enumerate(users, start=1):
            reports[user] = await self.consolidate(
                MemoryOwner(tenant_id=tenant_id, principal_id=user, user_id=user),
                min_similarity=min_similarity,
                max_merges=max_merges,
                dry_run=dry_run,
                since=since,
                model=model,
            )
            if progress is not None:
                progress(done, len(users))
        return reports

    async def _written_merges(
        self,
        caller: MemoryOwner,
        store: LongTermStore,
        preview: ConsolidationReport,
        model: Any,
    ) -> dict[str, MergedText]:
        """The texts ``model`` writes for the groups of ``preview``, by head id (a group
        the model fails for, or answers unusably, is left out: its head's text stands)."""
        texts: dict[str, tuple[MemoryScope, str]] = {}
        for merge in preview.merges:
            members = [await store.get(caller, i) for i in merge.merged_ids]
            if any(m is None for m in members):
                continue  # gone since the preview: the merge leaves the group alone anyway
            head = merge.merged_ids[0]
            try:
                answer = await model.generate_text(
                    MERGE_SYSTEM_PROMPT, merge_prompt([m.content for m in members if m])
                )
                text = " ".join(str(answer).split())
                self._check_content(text, "a merged text")
            except Exception as exc:  # any model failure: the head's text stands
                log.warning("consolidation: the model's text for %s was not used: %s", head, exc)
                continue
            scope = members[0].scope if members[0] else MemoryScope.USER
            texts[head] = (scope, text)
        if not texts:
            return {}
        vectors: list[list[float]] | None = None
        if self.embedder is not None and self.embedder.model_id is not None:
            vectors = await self.embedder.embed([t for _s, t in texts.values()])
        return {
            head: MergedText(
                content=text,
                content_hash=content_hash(scope, text),
                embedding=vectors[i] if vectors is not None else None,
            )
            for i, (head, (scope, text)) in enumerate(texts.items())
        }

    # -- combined -------------------------------------------------------------------

    async def snapshot(
        self, owner: MemoryOwner, query: str | None = None, recent_limit: int | None = None
    ) -> MemorySnapshot:
        """Recent turns, working state and memories matching ``query``.

        On PostgreSQL this is one database round trip (on Citus, three calls sent at
        once, each delegated to the tenant's worker). Rejects an owner that is not the
        caller this manager was bound to.
        """
        self._check_caller(owner)
        check_text(query, "query", optional=True)
        limit = (
            self.config.recent_limit
            if recent_limit is None
            else check_count(recent_limit, "recent_limit")
        )
        limit = max(0, min(limit, self.policy.max_session_turns))
        text = (query or "")[: self.config.max_content_chars]
        if (
            is_postgres(self.short_term)
            and all_postgres(self.working, self.long_term)
            and self.database is not None
            # Citus cannot plan recall() inside the one-statement snapshot: three calls
            and not self.database.set_local
        ):
            replica = self.replica if self._reads_replica(owner) else None
            return await snapshot_in_one_round_trip(
                replica.database if replica else self.database,
                owner,
                text,
                recent_limit=limit,
                ttl_seconds=self.config.session_ttl_seconds,
                recaller=await self._recaller_for(owner) if self.long_term else None,
                top_k=self.config.snapshot_top_k,
                with_working=self.working is not None,
            )
        # three reads, sent at once (on Citus each is one call delegated to the tenant's
        # worker, on a pooled connection of its own)
        recent, working, memories = await asyncio.gather(
            self.recent(owner, limit)
            if self.short_term and owner.can_address(MemoryScope.SESSION)
            else _resolved(list[ConversationMessage]()),
            self.scratch(owner)
            if self.working and owner.can_address(MemoryScope.RUN)
            else _resolved(dict[str, Any]()),
            self.recall(owner, text, top_k=self.config.snapshot_top_k)
            if self.long_term and text.strip()
            else _resolved(tuple[Memory, ...]()),
        )
        return MemorySnapshot(recent=recent, working_state=working, memories=list(memories))


async def _resolved(value: T) -> T:
    """``value``, as an awaitable (a part of a snapshot that is not read)."""
    return value


def _to_message(turn: ConversationMessage | dict[str, Any] | Any) -> ConversationMessage:
    if isinstance(turn, ConversationMessage):
        return turn
    try:
        if isinstance(turn, dict):
            return ConversationMessage.model_validate(turn)
        from langchain_core.messages import BaseMessage

        if isinstance(turn, BaseMessage):
            from harbor_pg.messages import from_langchain

            return from_langchain(turn)
    except ValidationError as exc:
        raise MemoryValidationError(f"invalid turn: {first_error(exc)}") from None
    raise MemoryValidationError(f"cannot store a turn of type {type(turn).__name__}")
