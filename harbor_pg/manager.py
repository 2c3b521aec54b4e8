"""MemoryManager: the single facade chat and agent code imports."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harbor_pg.context.recall import (
    MemoryRecall,
    RecallRequest,
    embedding_texts,
    recall_params,
    recalled_from_row,
)
from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.base import Embedder, normalize_vector
from harbor_pg.errors import (
    MemoryConfigurationError,
    MemoryScopeError,
    MemoryValidationError,
)
from harbor_pg.extraction.entities import MemoryEntityResolver
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import (
    ConversationMessage,
    Memory,
    MemoryType,
    Sensitivity,
    validate_source,
)
from harbor_pg.telemetry import traced
from harbor_pg.tiers.base import (
    ErasableLongTermStore,
    ErasableShortTermStore,
    ErasableWorkingStore,
    EraseReceipt,
    ErasureSubject,
    LongTermStore,
    RetentionReceipt,
    SaveResult,
    ShortTermStore,
    SummaryLeaseStore,
    SummaryStore,
    WorkingStore,
)
from harbor_pg.tiers.facades import LongTermMemory, ShortTermMemory, WorkingMemory, unwrap_store
from harbor_pg.tiers.in_process import (
    InMemoryLongTermStore,
    InMemoryShortTermStore,
    InMemoryWorkingStore,
)
from harbor_pg.tiers.long_term import (
    ELEVATED_SCOPES,
    MemoryVectors,
    PostgresLongTermStore,
)
from harbor_pg.tiers.replica import READ_URL_ENV, ReadReplica
from harbor_pg.tiers.session_ttl import LiveTurns
from harbor_pg.tiers.short_term import PostgresShortTermStore, message_from_row
from harbor_pg.tiers.working import PostgresWorkingStore
from harbor_pg.validation import check_count, check_json, check_text, check_ttl

__all__ = ["MemoryManager", "MemoryManagerConfig", "MemorySnapshot"]

log = logging.getLogger("harbor_pg")

#: Every field of a MemoryOwner; a snapshot owner must equal the bound caller on each.
_IDENTITY_FIELDS = tuple(MemoryOwner.model_fields)

_T = TypeVar("_T")

#: Parameters of a snapshot that recalls nothing.
_NO_RECALL = RecallRequest(query="", scopes=(), top_k=0)


class MemoryManagerConfig(BaseModel):
    """Limits the facade enforces before anything is written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: longest accepted content (turns and memories), in characters
    max_content_chars: int = Field(default=20_000, ge=1, le=1_000_000)
    #: default number of recent turns in a snapshot
    recent_limit: int = Field(default=12, ge=0)
    #: memories a snapshot recalls
    snapshot_top_k: int = Field(default=6, ge=0, le=1000)
    #: after each append, summarise the session in the background once it is due
    #: (MemoryPolicy.summarise_after_turns, summary_cooldown_seconds)
    summarise_in_background: bool = True
    #: hours of inactivity after which a session's recent turns expire (seed 004): they
    #: are invisible at once and apply_retention reclaims them; summaries and memories
    #: extracted from them stay. None: turns never expire.
    session_ttl_hours: float | None = Field(default=24.0, gt=0)

    @property
    def session_ttl_seconds(self) -> float | None:
        """:attr:`session_ttl_hours` in seconds (None: never)."""
        return None if self.session_ttl_hours is None else self.session_ttl_hours * 3600.0

    @model_validator(mode="before")
    @classmethod
    def _moved_knobs(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_session_turns" in data:
            # one knob, one place: the policy caps every recent read (manager and builder)
            raise MemoryConfigurationError(
                "max_session_turns is a MemoryPolicy field: pass "
                "MemoryManager(policy=MemoryPolicy(max_session_turns=...))"
            )
        return data


class _Background:
    """Background-summary state shared by a manager and the clones :meth:`bound_to` makes."""

    def __init__(self) -> None:
        #: SessionSummarizer per (model, policy)
        self.summarizers: dict[tuple[int, int], Any] = {}
        #: due checks scheduled by append, running or waiting
        self.tasks: set[asyncio.Task[None]] = set()
        #: sessions with a check in flight -> another append arrived meanwhile
        self.pending: dict[tuple[str, str | None, str | None], bool] = {}


@dataclass(frozen=True)
class MemorySnapshot:
    """Recent turns, working state and recalled memories, read together."""

    recent: list[ConversationMessage] = field(default_factory=list)
    working_state: dict[str, Any] = field(default_factory=dict)
    memories: list[Memory] = field(default_factory=list)


class MemoryManager:
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
        self._owns_database = False
        self._background = _Background()
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
        )
        clone._background = self._background  # one set of background summaries to drain
        return clone

    async def close(self) -> None:
        """Wait for background summaries, then close the database pools this manager opened."""
        await self.drain()
        if self._owns_database and self.database is not None:
            await self.database.close()
            if self.replica is not None:
                await self.replica.database.close()

    async def drain(self) -> None:
        """Wait until every background summary scheduled so far has finished."""
        background = self._background
        while background.tasks:
            await asyncio.gather(*list(background.tasks), return_exceptions=True)
        for summarizer in list(background.summarizers.values()):
            await summarizer.drain()

    async def __aenter__(self) -> MemoryManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- tier access ----------------------------------------------------------------

    def _short(self) -> ShortTermStore:
        if self.short_term is None:
            raise MemoryConfigurationError("the short-term tier is not configured")
        return self.short_term

    def _working(self) -> WorkingStore:
        if self.working is None:
            raise MemoryConfigurationError("the working tier is not configured")
        return self.working

    def _long(self) -> LongTermStore:
        if self.long_term is None:
            raise MemoryConfigurationError("the long-term tier is not configured")
        return self.long_term

    def _check_content(self, content: str, what: str) -> None:
        if not isinstance(content, str):
            raise MemoryValidationError(f"{what} must be a string")
        if len(content) > self.config.max_content_chars:
            raise MemoryValidationError(
                f"{what} is {len(content)} characters; the limit is "
                f"{self.config.max_content_chars} (MemoryManagerConfig.max_content_chars)"
            )
        check_text(content, what)

    # -- short-term -----------------------------------------------------------------

    @traced("harbor_pg.append", result=lambda m: {"harbor.message.role": m.role})
    async def append(
        self, owner: MemoryOwner, turn: ConversationMessage | dict[str, Any] | Any
    ) -> ConversationMessage:
        """Append one turn (a ConversationMessage, a dict, or a LangChain message).

        Once the session is due a summary (``summarise_after_turns`` new turns,
        the cooldown passed; see :meth:`background_summarizer`) it is summarised
        in the background. Append never waits for that and never fails for it.
        """
        self._check_caller(owner)
        store = self._short()
        message = self._turn(owner, turn)
        self._wrote(owner)
        if not self._summarises(owner):
            return await store.append(owner, message)
        policy = self.policy
        checking = getattr(store, "append_and_check_summary", None)
        if checking is None:
            stored = await store.append(owner, message)
            self._schedule_summary(owner, known_due=False)
            return stored
        # the due check rides in the append's own statement: no extra round trip, and
        # nothing is scheduled (or written) unless a summary is due
        result: tuple[ConversationMessage, bool] = await checking(
            owner,
            message,
            min_turns=policy.summarise_after_turns,
            cooldown_seconds=policy.summary_cooldown_seconds,
        )
        stored, due = result
        if due:
            self._schedule_summary(owner, known_due=True)
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

    def _live_turns(self) -> Any:
        """The short-term store seen through the session TTL (what every recent read uses)."""
        store = self._short()
        live = self._live
        if live is None or live.store is not store:
            live = self._live = LiveTurns(store, self.config.session_ttl_seconds)
        return live

    def _reads_replica(self, owner: MemoryOwner) -> bool:
        """Whether ``owner``'s read goes to the standby (not right after its own write)."""
        return self.replica is not None and self.replica.serves(owner)

    def _wrote(self, owner: MemoryOwner) -> None:
        if self.replica is not None:
            self.replica.wrote(owner)

    def _recent_limit(self, limit: int | None) -> int:
        cap = self.policy.max_session_turns
        n = cap if limit is None else check_count(limit, "limit")
        return min(n, cap)

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

    @traced(
        "harbor_pg.save",
        attributes=lambda self, caller, memory, **kw: {
            "harbor.memory.scope": memory.scope.value,
            "harbor.memory.type": memory.memory_type.value,
        },
        result=lambda r: {"harbor.memory.created": r.created},
    )
    async def save(
        self,
        caller: MemoryOwner,
        memory: Memory,
        *,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
        allow_secrets: bool = False,
    ) -> SaveResult:
        """Store a memory under ``caller`` narrowed to the memory's scope.

        Saving the same content twice in the same scope is a no-op that
        reports the existing memory (``created=False``). Content or context
        that looks like a credential (an API key, a stated password or PIN,
        ...; see :mod:`harbor_pg.extraction.secrets`) is refused with
        :class:`MemoryValidationError` naming the kind, unless
        ``allow_secrets=True``.
        """
        self._check_caller(caller)
        self._wrote(caller)
        store = self._long()
        self._check_memory(caller, memory, allow_secrets=allow_secrets)
        if embedding is None and self._embeds(store):
            vectors = await self._embed([memory])
            if vectors is not None:
                assert isinstance(store, PostgresLongTermStore)
                return await store.save(
                    caller,
                    memory,
                    vectors[0].content,
                    self._model_id(),
                    context_embedding=vectors[0].with_context,
                )
        return await store.save(caller, memory, embedding, model_id)

    @traced(
        "harbor_pg.save_many",
        attributes=lambda self, caller, memories, **kw: {"harbor.save.count": len(memories)},
        result=lambda rs: {"harbor.save.created": sum(r.created for r in rs)},
    )
    async def save_many(
        self,
        caller: MemoryOwner,
        memories: Sequence[Memory],
        *,
        batch_size: int = 64,
        progress: Callable[[int, int], None] | None = None,
        allow_secrets: bool = False,
    ) -> list[SaveResult]:
        """Save many memories: embedded in batches, each batch one transaction.

        Every memory is validated before anything is written, so bad input
        writes nothing. On PostgreSQL a batch commits as a whole: a failure
        leaves the earlier batches saved and none of the failing one.
        ``progress(saved, total)`` is called after each batch. A memory that
        looks like a credential is refused as in :meth:`save` (``allow_secrets``).
        """
        self._check_caller(caller)
        self._wrote(caller)
        if batch_size < 1:
            raise MemoryValidationError("batch_size must be >= 1")
        store = self._long()
        for memory in memories:
            self._check_memory(caller, memory, allow_secrets=allow_secrets)
        results: list[SaveResult] = []
        total = len(memories)
        for start in range(0, total, batch_size):
            batch = list(memories[start : start + batch_size])
            vectors = await self._embed(batch) if self._embeds(store) else None
            model_id = self._model_id() if vectors is not None else None
            one_role = len({m.scope in ELEVATED_SCOPES for m in batch}) == 1
            if isinstance(store, PostgresLongTermStore):
                content = [v.content for v in vectors] if vectors is not None else None
                contextual = [v.with_context for v in vectors] if vectors is not None else None
                if one_role:
                    results.extend(
                        await store.save_many(
                            caller, batch, content, model_id, context_vectors=contextual
                        )
                    )
                else:
                    for i, memory in enumerate(batch):
                        results.append(
                            await store.save(
                                caller,
                                memory,
                                content[i] if content is not None else None,
                                model_id,
                                context_embedding=contextual[i] if contextual else None,
                            )
                        )
            else:
                for memory in batch:
                    results.append(await store.save(caller, memory))
            if progress is not None:
                progress(len(results), total)
        return results

    def _check_memory(
        self, caller: MemoryOwner, memory: Memory, *, allow_secrets: bool = False
    ) -> None:
        self._check_content(memory.content, "memory content")
        if not memory.content.strip():
            raise MemoryValidationError("memory content is blank")
        caller.require_scope(memory.scope)
        if not allow_secrets:
            from harbor_pg.extraction.secrets import secret_kind

            for what, text in (("content", memory.content), ("context", memory.context)):
                kind = secret_kind(text) if text else None
                if kind is not None:
                    raise MemoryValidationError(
                        f"memory {what} looks like it holds a secret ({kind}); long-term "
                        "memory is read back into later prompts, so it is not stored "
                        "(pass allow_secrets=True if you mean to store it)"
                    )

    def _embeds(self, store: LongTermStore) -> bool:
        return self.embedder is not None and isinstance(store, PostgresLongTermStore)

    def _model_id(self) -> str:
        assert self.embedder is not None
        return self.embedder.model_id

    async def _embed(self, memories: Sequence[Memory]) -> list[MemoryVectors] | None:
        """Vectors of ``memories`` (content, and context + content where there is a
        context) in one embedder call, or None with a WARNING on failure."""
        assert self.embedder is not None
        pairs = [embedding_texts(m) for m in memories]
        texts = [content for content, _ in pairs]
        texts += [with_context for _, with_context in pairs if with_context is not None]
        try:
            raw = await self.embedder.embed(texts)
            vectors = [
                normalize_vector(
                    v, dimensions=self.embedder.dimensions, model_id=self.embedder.model_id
                )
                for v in raw
            ]
        except Exception as exc:
            log.warning(
                "embedding %d memories failed, saving them without vectors (lexical recall "
                "still finds them): %s",
                len(memories),
                exc,
            )
            return None
        extra = iter(vectors[len(pairs) :])
        return [
            MemoryVectors(vectors[i], next(extra) if with_context is not None else None)
            for i, (_, with_context) in enumerate(pairs)
        ]

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
    ) -> tuple[Memory, ...]:
        """Hybrid recall under this manager's policy (see :class:`MemoryRecall`).

        Never raises for a failing leg (bad arguments raise MemoryValidationError);
        a bound manager rejects another owner.
        """
        self._check_caller(owner)
        recaller = self.recaller()
        if self._reads_replica(owner):
            assert self.replica is not None
            recaller = MemoryRecall(
                policy=self.policy, memories=self.replica.long_term, embedder=self.embedder
            )
        return await recaller.recall(
            owner,
            query,
            anchor_entity_ids=anchor_entity_ids,
            wanted_types=wanted_types,
            as_of=as_of,
            top_k=top_k,
            token_budget=token_budget,
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
        from harbor_pg.context.summarizer import SessionSummarizer

        key = (id(model), id(policy or self.policy))
        found = self._background.summarizers.get(key)
        if found is None:
            found = SessionSummarizer(
                policy=policy or self.policy,
                messages=self._live_turns(),
                memories=self._long(),  # type: ignore[arg-type]
                model=model,
            )
            self._background.summarizers[key] = found
        return self._guarded(found)

    def _summarises(self, owner: MemoryOwner) -> bool:
        """Whether appends for ``owner`` may schedule background summaries."""
        return (
            self.config.summarise_in_background
            and self.policy.enabled
            and owner.principal_id is not None
            and self._summary_stores()
        )

    def _summary_stores(self) -> bool:
        """Whether the stores can hold summaries (two runtime Protocol checks, about
        0.1 ms on every append: kept while the stores stay the same)."""
        stores = (self.short_term, self.long_term)
        known: tuple[Any, Any, bool] | None = getattr(self, "_summary_capable", None)
        if known is not None and known[0] is stores[0] and known[1] is stores[1]:
            return bool(known[2])
        capable = isinstance(stores[0], SummaryLeaseStore) and isinstance(stores[1], SummaryStore)
        self._summary_capable = (*stores, capable)
        return capable

    def _schedule_summary(self, owner: MemoryOwner, *, known_due: bool) -> None:
        """After an append: summarise the session in the background if it is due.

        ``known_due``: the append found it due already; otherwise a read-only
        check comes first. At most one task per session is in flight; an append
        that arrives meanwhile makes it check once more when done. Never raises.
        """
        try:
            key = (owner.tenant_id, owner.user_id, owner.session_id)
            background = self._background
            if key in background.pending:
                background.pending[key] = True
                return
            loop = asyncio.get_running_loop()
            background.pending[key] = False
            task = loop.create_task(
                self._summarise_when_due(owner, key, checked=known_due),
                name=f"harbor-summary:{owner.session_id}",
            )
            background.tasks.add(task)
            task.add_done_callback(background.tasks.discard)
        except Exception as exc:
            log.warning("background summary not scheduled (%s)", exc)

    async def _summarise_when_due(
        self, owner: MemoryOwner, key: tuple[str, str | None, str | None], *, checked: bool
    ) -> None:
        background = self._background
        try:
            while True:
                background.pending[key] = False
                try:
                    await self._summarise_if_due(owner, checked=checked)
                except Exception as exc:
                    log.warning("background summary failed (%s)", exc)
                if not background.pending.get(key):
                    return
                checked = False  # appends arrived meanwhile: look again
        finally:
            background.pending.pop(key, None)

    async def _summarise_if_due(self, owner: MemoryOwner, *, checked: bool) -> None:
        policy = self.policy
        # a read first: an append that finds nothing due writes nothing (no lease row)
        due = None if checked else getattr(self.short_term, "summary_due", None)
        if due is not None and not await due(
            owner,
            min_turns=policy.summarise_after_turns,
            cooldown_seconds=policy.summary_cooldown_seconds,
        ):
            return
        await self.background_summarizer(model=self.summary_model).maybe_summarise(owner)

    @traced("harbor_pg.extract", result=lambda ids: {"harbor.extract.stored": len(ids)})
    async def extract_memories(
        self,
        owner: MemoryOwner,
        *,
        model: Any = None,
        extract_facts: bool = False,
        limit: int | None = None,
        entities: MemoryEntityResolver | None = None,
        policy: MemoryPolicy | None = None,
        embedder: Embedder | None = None,
        render_limit: int | None = None,
        max_facts: int | None = None,
    ) -> list[str]:
        """Mine ``owner``'s session's recent turns for durable facts; the new memory ids.

        Off by default (one model call per call): pass ``extract_facts=True``
        and a ``model`` (a :class:`~harbor_pg.llm.MemoryModel` or a LangChain
        chat model). Facts are stored with ``source="extracted"``, deduplicated
        and superseded as :class:`~harbor_pg.extraction.extractor.MemoryExtractor`
        describes, which takes the same collaborators: ``entities`` (a
        :class:`~harbor_pg.extraction.entities.MemoryEntityResolver`, so facts
        are anchored to knowledge-graph ids), ``policy`` and ``embedder``
        (default: the manager's), ``render_limit`` and ``max_facts``. Raises
        :class:`MemoryConfigurationError` when off, without a model, or when a
        collaborator does not fit; every other failure is logged and yields the
        ids stored so far.
        """
        from harbor_pg.extraction.extractor import MemoryExtractor, extract_memories

        self._check_caller(owner)
        if not extract_facts:
            raise MemoryConfigurationError(
                "fact extraction is off: pass extract_facts=True (it costs one model call)"
            )
        if model is None:
            raise MemoryConfigurationError("fact extraction needs a model (model=...)")
        sizes: dict[str, int] = {}
        if render_limit is not None:
            sizes["render_limit"] = render_limit
        if max_facts is not None:
            sizes["max_facts"] = max_facts
        extractor = MemoryExtractor(
            memories=self._long(),  # type: ignore[arg-type]
            model=model,
            policy=policy or self.policy,
            embedder=embedder if embedder is not None else self.embedder,
            entities=entities,
            **sizes,
        )
        return await extract_memories(
            owner,
            short_term=self._live_turns(),
            extractor=extractor,
            extract_facts=True,
            limit=limit,
        )

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

    # export_memories and import_memories below share one shape on purpose: thin forwarders
    # to harbor_pg.portability, imported lazily so that the manager does not load it.
    async def export_memories(
        self,
        owner: MemoryOwner,
        destination: str | Path | Any,
        *,
        elevated: bool = False,
        vectors: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Write ``owner``'s memories, their whole validity history, as JSON Lines
        (see :mod:`harbor_pg.portability`); ``elevated`` exports the tenant's.
        Returns how many were written."""
        self._check_caller(owner)
        from harbor_pg.portability import export_memories

        return await export_memories(
            self, owner, destination, elevated=elevated, vectors=vectors, progress=progress
        )

    async def import_memories(
        self,
        owner: MemoryOwner,
        source: str | Path | Any,
        *,
        elevated: bool = False,
        batch_size: int = 200,
        progress: Callable[[int, int], None] | None = None,
    ) -> Any:
        """Read an export back (idempotent: a re-run writes nothing); returns an
        :class:`~harbor_pg.portability.ImportReport` (read, written, duplicates,
        refused lines with reasons). See :mod:`harbor_pg.portability`."""
        self._check_caller(owner)
        from harbor_pg.portability import import_memories

        return await import_memories(
            self, owner, source, elevated=elevated, batch_size=batch_size, progress=progress
        )

    async def inject_memory(
        self,
        owner: MemoryOwner,
        content: str,
        *,
        scope: MemoryScope | str = MemoryScope.USER,
        memory_type: MemoryType | str = MemoryType.FACT,
        importance: float = 0.5,
        source: str = "injected",
        sensitivity: Sensitivity | str = Sensitivity.NONE,
        entity_ids: Sequence[str] = (),
        metadata: dict[str, Any] | None = None,
        context: str | None = None,
        allow_secrets: bool = False,
    ) -> SaveResult:
        """Store a fact you know directly (source ``injected`` by default).

        Refuses a credential as :meth:`save` does, unless ``allow_secrets=True``.
        """
        self._check_caller(owner)
        self._wrote(owner)
        try:
            memory = Memory(
                content=content,
                scope=MemoryScope(scope),
                memory_type=MemoryType(memory_type),
                importance=importance,
                source=validate_source(source),
                sensitivity=Sensitivity(sensitivity),
                entity_ids=list(entity_ids),
                metadata=metadata or {},
                context=context,
            )
        except (ValidationError, ValueError, TypeError) as exc:
            raise MemoryValidationError(f"invalid memory: {_first(exc)}") from None
        return await self.save(owner, memory, allow_secrets=allow_secrets)

    # -- combined -------------------------------------------------------------------

    async def snapshot(
        self, owner: MemoryOwner, query: str | None = None, recent_limit: int | None = None
    ) -> MemorySnapshot:
        """Recent turns, working state and memories matching ``query``.

        On PostgreSQL this is one database round trip. Rejects an owner that is
        not the caller this manager was bound to.
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
            isinstance(self.short_term, PostgresShortTermStore)
            and isinstance(self.working, PostgresWorkingStore | None)
            and isinstance(self.long_term, PostgresLongTermStore | None)
            and self.database is not None
            # Citus cannot plan recall() inside the one-statement snapshot: three calls
            and not self.database.set_local
        ):
            return await self._snapshot_sql(owner, text, limit)
        recent = (
            (await self.recent(owner, limit))
            if self.short_term and owner.can_address(MemoryScope.SESSION)
            else []
        )
        working = (
            (await self.scratch(owner))
            if self.working and owner.can_address(MemoryScope.RUN)
            else {}
        )
        memories = (
            list(await self.recall(owner, text, top_k=self.config.snapshot_top_k))
            if self.long_term and text.strip()
            else []
        )
        return MemorySnapshot(recent=recent, working_state=working, memories=memories)

    async def _snapshot_sql(self, owner: MemoryOwner, text: str, limit: int) -> MemorySnapshot:
        assert self.database is not None
        database = self.replica.database if self.replica and self._reads_replica(owner) else None
        database = database or self.database
        owner.require_scope(MemoryScope.SESSION)
        recaller = self.recaller() if self.long_term else None
        request = (
            await recaller.prepare(owner, text, top_k=self.config.snapshot_top_k)
            if recaller is not None
            else None
        )
        params = {
            "tenant_id": owner.tenant_id,
            "user_id": owner.user_id,
            "session_id": owner.session_id,
            "run_id": owner.run_id or "",
            "project_id": owner.project_id or "",
            "recent_limit": limit,
            "ttl_seconds": self.config.session_ttl_seconds,
            "recall": request is not None,
            **recall_params(request or _NO_RECALL),
        }
        # the identity and the statement in one flight and one transaction: one round trip
        try:
            [row] = await database.fetch_in_one_round_trip(owner, query("snapshot"), params)
        except Exception as exc:
            if request is None or request.embedding is None:
                raise
            # an index failure must not cost the turn its history: again, lexically
            log.warning("snapshot: dense recall failed, falling back to lexical recall: %s", exc)
            request = replace(request, embedding=None, model_id=None, min_similarity=None)
            params.update(recall_params(request))
            [row] = await database.fetch_in_one_round_trip(owner, query("snapshot"), params)
        memories: list[Memory] = []
        if recaller is not None and request is not None:
            ranked = [recalled_from_row(m, typed=False) for m in row["memories"]]
            memories = [item.memory for item in recaller.finish(ranked, request)]
        return MemorySnapshot(
            recent=[message_from_row(r) for r in row["recent"]] if self.short_term else [],
            working_state=dict(row["working"] or {}) if self.working else {},
            memories=memories,
        )

    def _check_caller(self, owner: MemoryOwner) -> None:
        """Reject an owner that is not exactly the bound caller.

        Every identity field must be equal, unset ones included: an owner that
        adds a field the caller does not carry (a ``project_id``, a ``run_id``)
        would widen what a call reads or writes beyond the authenticated caller.
        """
        if self.caller is None:
            return
        if not isinstance(owner, MemoryOwner):
            raise MemoryScopeError(f"owner must be a MemoryOwner, got {type(owner).__name__}")
        for name in _IDENTITY_FIELDS:
            if getattr(owner, name) != getattr(self.caller, name):
                raise MemoryScopeError(
                    f"owner does not match the authenticated caller ({name} differs)"
                )

    def _check_subject(
        self,
        tenant_id: str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        principal_id: str | None = None,
    ) -> None:
        """On a bound manager, governance acts on the caller's own tenant and rows only."""
        caller = self.caller
        if caller is None:
            return
        named = {"user_id": user_id, "session_id": session_id, "principal_id": principal_id}
        if tenant_id != caller.tenant_id:
            raise MemoryScopeError("tenant_id does not match the authenticated caller")
        for name, value in named.items():
            if value is not None and value != getattr(caller, name):
                raise MemoryScopeError(
                    f"{name} does not match the authenticated caller ({name} differs)"
                )

    def _guarded(self, helper: _T) -> _T:
        """``helper`` as a bound manager hands it out: checking every owner it is given."""
        if self.caller is None:
            return helper
        return cast(_T, _CallerGuard(helper, self._check_caller))

    # -- governance -----------------------------------------------------------------

    @traced(
        "harbor_pg.erase",
        result=lambda r: {
            "harbor.erase.short_term": r.short_term,
            "harbor.erase.working": r.working,
            "harbor.erase.long_term": r.long_term,
            "harbor.erase.embeddings": r.embeddings,
        },
    )
    async def erase(
        self,
        tenant_id: str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        principal_id: str | None = None,
    ) -> EraseReceipt:
        """Delete every row of a user, a user's session, or an agent, in every tier.

        A user's rows are those keyed to the user and those the user wrote as
        the principal in a wider scope (a PROJECT memory stores the author in
        ``principal_id``); a session's memories include those derived from it
        (``source_session_id``), and any memory derived from an erased turn
        (``source_message_ids``) goes too. Embeddings go with their memories.

        One transaction on PostgreSQL (as the elevated role); returns counts
        per tier. Nothing of the erased text is written anywhere.
        """
        if user_id is None and principal_id is None:
            raise MemoryValidationError("erase needs a user_id or a principal_id (agent)")
        self._check_subject(
            tenant_id, user_id=user_id, session_id=session_id, principal_id=principal_id
        )
        owner = MemoryOwner(tenant_id=tenant_id)
        stores = (self.short_term, self.working, self.long_term)
        builtin = PostgresShortTermStore, PostgresWorkingStore, PostgresLongTermStore
        if self.database is not None and any(isinstance(s, builtin) for s in stores):
            if not all(s is None or isinstance(s, builtin) for s in stores):
                raise MemoryConfigurationError(
                    "erasure over PostgreSQL stores mixed with other stores is not "
                    "supported: the erasure must be one transaction"
                )
            async with self.database.transaction(owner, admin=True) as conn:
                rows = await (
                    await conn.execute(
                        query("erase"),
                        {
                            "user_id": user_id,
                            "session_id": session_id,
                            "principal_id": principal_id,
                        },
                    )
                ).fetchall()
            counts = {r["tier"]: int(r["deleted"]) for r in rows}
            return EraseReceipt(
                short_term=counts.get("short_term", 0),
                working=counts.get("working", 0),
                long_term=counts.get("long_term", 0),
                embeddings=counts.get("embeddings", 0),
                role_bindings=counts.get("role_bindings", 0),
            )
        return await self._erase_in_stores(
            ErasureSubject(
                tenant_id=tenant_id,
                user_id=user_id,
                session_id=session_id,
                principal_id=principal_id,
            )
        )

    async def _erase_in_stores(self, subject: ErasureSubject) -> EraseReceipt:
        """Erasure through the stores' own ``erase`` (the Erasable* protocols).

        Every configured store must implement it: one that cannot is refused
        before anything is deleted, so a receipt never reports an erasure that
        did not happen.
        """
        short, working, long = self.short_term, self.working, self.long_term
        tiers: list[tuple[str, object, type]] = [
            ("short-term", short, ErasableShortTermStore),
            ("working", working, ErasableWorkingStore),
            ("long-term", long, ErasableLongTermStore),
        ]
        cannot = [
            f"the {name} store ({type(store).__name__})"
            for name, store, protocol in tiers
            if store is not None and not isinstance(store, protocol)
        ]
        if cannot:
            raise MemoryConfigurationError(
                f"erasure: {', '.join(cannot)} cannot erase; implement erase() "
                "(harbor_pg.tiers.base.ErasableShortTermStore, ErasableWorkingStore, "
                "ErasableLongTermStore) so that nothing is left behind"
            )
        turn_ids: list[int] = (
            await short.erase(subject) if isinstance(short, ErasableShortTermStore) else []
        )
        runs = await working.erase(subject) if isinstance(working, ErasableWorkingStore) else 0
        memories, vectors = (
            await long.erase(subject, turn_ids=turn_ids)
            if isinstance(long, ErasableLongTermStore)
            else (0, 0)
        )
        return EraseReceipt(
            short_term=len(turn_ids), working=runs, long_term=memories, embeddings=vectors
        )

    async def erase_agent_memories(
        self, tenant_id: str, agent_id: str, session_id: str | None = None
    ) -> EraseReceipt:
        """Erase everything an agent (principal) wrote; with ``session_id``, only that session."""
        return await self.erase(tenant_id, principal_id=agent_id, session_id=session_id)

    async def apply_retention(
        self,
        tenant_id: str,
        *,
        max_age_seconds: float | None = None,
        scope: MemoryScope | str | None = None,
        min_sensitivity: Sensitivity | str | None = None,
        include_summaries: bool = False,
    ) -> RetentionReceipt:
        """Apply retention to one tenant: purge its expired working state and, when
        ``max_age_seconds`` is given, delete its memories older than that (optionally
        only one ``scope`` and/or at or above ``min_sensitivity``; rolling summaries
        only with ``include_summaries``). It also deletes the turns the session
        TTL (``MemoryManagerConfig.session_ttl_hours``) has expired, keeping the
        summaries and memories derived from them. Returns the counts.

        One transaction on PostgreSQL, as the elevated role.
        """
        self._check_subject(tenant_id)
        if max_age_seconds is not None and (
            isinstance(max_age_seconds, bool)
            or not isinstance(max_age_seconds, int | float)
            or not math.isfinite(max_age_seconds)
            or max_age_seconds < 0
        ):
            raise MemoryValidationError("max_age_seconds must be a finite number >= 0")
        if max_age_seconds is None and (scope is not None or min_sensitivity is not None):
            raise MemoryValidationError("a retention scope or sensitivity needs max_age_seconds")
        try:
            only_scope = MemoryScope(scope) if scope is not None else None
            floor = Sensitivity(min_sensitivity) if min_sensitivity is not None else None
        except ValueError as exc:
            raise MemoryValidationError(str(exc)) from None
        if self.database is None:
            working = self.working
            long_term = self.long_term
            if (working is not None and not hasattr(working, "purge_expired_of")) or (
                long_term is not None and not hasattr(long_term, "apply_retention")
            ):
                raise MemoryConfigurationError(
                    "retention needs the PostgreSQL stores, or stores with purge_expired_of "
                    "(working) and apply_retention (long-term) as the in-process ones have"
                )
            ttl = self.config.session_ttl_seconds
            return RetentionReceipt(
                short_term=int(
                    await _call_optional(self.short_term, "purge_expired_turns", 0, tenant_id, ttl)
                )
                if ttl is not None
                else 0,
                working=int(await _call_optional(working, "purge_expired_of", 0, tenant_id)),
                long_term=int(
                    await _call_optional(
                        long_term,
                        "apply_retention",
                        0,
                        tenant_id,
                        max_age_seconds,
                        scope=only_scope,
                        min_sensitivity=floor,
                        include_summaries=include_summaries,
                    )
                )
                if max_age_seconds is not None
                else 0,
            )
        async with self.database.transaction(MemoryOwner(tenant_id=tenant_id), admin=True) as conn:
            row = await (
                await conn.execute(
                    query("apply_retention"),
                    {
                        "max_age_seconds": max_age_seconds,
                        "scope": only_scope.value if only_scope else None,
                        "min_sensitivity": floor.value if floor else None,
                        "include_summaries": include_summaries,
                    },
                )
            ).fetchone()
            turns = 0
            ttl = self.config.session_ttl_seconds
            if ttl is not None:
                purged = await conn.execute(query("purge_expired_turns"), {"ttl_seconds": ttl})
                turns = purged.rowcount
        assert row is not None
        return RetentionReceipt(
            working=int(row["working_state"]), long_term=int(row["memories"]), short_term=turns
        )

    async def purge_working_state(self) -> int:
        """Reclaim the space of expired working state."""
        store = self._working()
        purge = getattr(store, "purge_expired", None)
        return int(await purge()) if purge else 0


async def _call_optional(store: object, method: str, default: Any, *args: Any, **kw: Any) -> Any:
    """``store.method(*args, **kw)``, awaited when it is a coroutine; ``default`` without it."""
    found = getattr(store, method, None) if store is not None else None
    if found is None:
        return default
    result = found(*args, **kw)
    return await result if inspect.isawaitable(result) else result


class _CallerGuard:
    """A helper handed out by a bound manager: each method call that passes a
    :class:`MemoryOwner` (positionally or by keyword) is checked against the
    bound caller first; everything else is the helper's own."""

    def __init__(self, target: Any, check: Callable[[MemoryOwner], None]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_check", check)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value
        check = self._check

        @functools.wraps(value)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, MemoryOwner):
                    check(arg)
            return value(*args, **kwargs)

        return guarded

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)

    def __repr__(self) -> str:
        return f"<bound {self._target!r}>"


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
        raise MemoryValidationError(f"invalid turn: {_first(exc)}") from None
    raise MemoryValidationError(f"cannot store a turn of type {type(turn).__name__}")


def _first(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))
    return str(exc)
