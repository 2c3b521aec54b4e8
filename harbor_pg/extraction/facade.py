"""The facade's fact extraction (a mixin of :class:`~harbor_pg.manager.MemoryManager`).

The extractor and the model libraries it needs are imported on the first call,
so a manager that never extracts never loads them.
"""

from __future__ import annotations

import logging
from typing import Any

from harbor_pg.embedders.base import Embedder
from harbor_pg.errors import MemoryConfigurationError, MemoryNotFoundError
from harbor_pg.extraction.entities import MemoryEntityResolver
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.telemetry import traced
from harbor_pg.tiers.facade import FacadeBase

__all__ = ["Extraction"]

log = logging.getLogger("harbor_pg")


class Extraction(FacadeBase):
    """``extract_memories``: durable facts mined from a session's recent turns."""

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

    async def run_extraction_job(self, owner: MemoryOwner, message_id: int) -> None:
        """Run a queued extraction job (:mod:`harbor_pg.jobs`): the facts of ``owner``'s
        session's turns up to its turn ``message_id`` (the policy's
        ``recent_max_messages`` of them, however many came after), with the manager's
        ``extraction_model``. A turn that is gone (erased, purged) extracts nothing,
        and so does one erased while the model answers: each fact's write takes the
        session's lock and finds the turn still there first, in its own transaction,
        and harbor.erase takes that lock before it deletes anything (so a fact
        written before the erasure is erased with the rest, and none is written
        after it).

        Raises :class:`MemoryConfigurationError` when this process has no
        ``extraction_model`` (the job then fails, visibly, on the queue), and
        whatever stopped the extraction (the model, the database), for the queue
        to retry; a re-run stores nothing twice.
        """
        from harbor_pg.extraction.extractor import MemoryExtractor
        from harbor_pg.tiers.long_term import PostgresLongTermStore

        self._check_caller(owner)
        model = self._job_model()
        store: Any = self._long()
        if isinstance(store, PostgresLongTermStore):
            store = _ForTurn(store, message_id)
        extractor = MemoryExtractor(
            memories=store,
            model=model,
            policy=self.policy,
            embedder=self.embedder,
        )
        count = extractor.policy.recent_max_messages
        through = getattr(self._short(), "turns_through", None)
        if through is not None:
            turns = list(await through(owner, message_id, count))
        else:  # a store of one's own: the newest turns, if they still reach this one
            recent = await self._live_turns().recent(owner, count)
            turns = [t for t in recent if t.id is not None and int(t.id) <= message_id]
        if not turns or int(turns[-1].id) != message_id:
            return
        try:
            await extractor.extract(owner, turns, strict=True)
        except MemoryNotFoundError:  # the turn went (erased) while the model answered
            log.info("extraction of turn %s: the turn is gone, nothing more is written", message_id)

    def _job_model(self) -> Any:
        """The model a queued extraction calls: the manager's ``extraction_model``."""
        if self.extraction_model is None:
            raise MemoryConfigurationError(
                "this process has no extraction_model: give the manager that runs the "
                "queue's jobs one (harbor-pg worker --manager module:function)"
            )
        return self.extraction_model

    async def run_session_extraction_job(self, owner: MemoryOwner, from_id: int) -> None:
        """Run a queued session extraction (:data:`harbor_pg.jobs.EXTRACT_SESSION_TASK`):
        the facts of ``owner``'s session's turns from its turn ``from_id`` on, with the
        manager's ``extraction_model``, one model call a window of the policy's
        ``recent_max_messages`` turns (the first window showing the turns before
        ``from_id`` too, when the new ones are fewer).

        It starts by clearing its session's waiting flag, after the appends in flight,
        and reads the turns in that transaction: every turn appended before is read
        here, and one appended after queues the next job. Each fact's write is fenced
        by its window's newest turn, as :meth:`run_extraction_job`'s by its turn: a
        session erased while the model answers gets nothing more written. Raises as
        :meth:`run_extraction_job`; a re-run stores nothing twice.
        """
        from harbor_pg.extraction.extractor import MemoryExtractor
        from harbor_pg.tiers.long_term import PostgresLongTermStore

        self._check_caller(owner)
        short: Any = self._short()
        claim = getattr(short, "claim_extraction", None)
        if claim is None:  # a store of one's own: the turn's own extraction
            await self.run_extraction_job(owner, from_id)
            return
        count = self.policy.recent_max_messages
        page = max(count, _EXTRACTION_PAGE)
        # first, before anything that may fail: a job that failed for good must not leave
        # its session waiting for it (a retry claims again, and reads the same turns)
        turns = list(await claim(owner, from_id, context=count - 1, limit=page))
        model = self._job_model()
        long_term: Any = self._long()
        while True:
            fresh = [t for t in turns if t.id is not None and int(t.id) >= from_id]
            if not fresh:
                return
            earlier = [t for t in turns if t.id is not None and int(t.id) < from_id]
            for window in _windows(earlier, fresh, count):
                store = long_term
                if isinstance(store, PostgresLongTermStore):
                    store = _ForTurn(store, int(window[-1].id or 0))
                extractor = MemoryExtractor(
                    memories=store, model=model, policy=self.policy, embedder=self.embedder
                )
                try:
                    await extractor.extract(owner, window, strict=True)
                except MemoryNotFoundError:  # the session's turns went while the model answered
                    log.info(
                        "extraction of turns %s to %s: the turn is gone, nothing more is written",
                        window[0].id,
                        window[-1].id,
                    )
                    return
            if len(fresh) < page:
                return
            from_id = int(fresh[-1].id or 0) + 1
            turns = list(
                await short.extraction_turns(owner, from_id, context=count - 1, limit=page)
            )

    async def release_session_extraction(self, owner: MemoryOwner) -> None:
        """Clear ``owner``'s session's waiting-extraction flag, as a cancelled session
        extraction leaves it: the session's next turn queues a new one."""
        self._check_caller(owner)
        release = getattr(self._short(), "release_extraction", None)
        if release is not None:
            await release(owner)


#: most turns a session extraction reads at once (it reads on in pages of this many)
_EXTRACTION_PAGE = 500


def _windows(earlier: list[Any], fresh: list[Any], count: int) -> list[list[Any]]:
    """The model's windows over a session extraction's ``fresh`` turns: ``count`` turns
    each, ending at every ``count``-th fresh turn and at the last; the first window is
    filled from ``earlier`` (the turns before) when the fresh ones are fewer."""
    ends = list(range(count - 1, len(fresh), count))
    if not ends or ends[-1] != len(fresh) - 1:
        ends.append(len(fresh) - 1)
    turns = [*earlier, *fresh]
    offset = len(earlier)
    return [turns[max(0, offset + end - count + 1) : offset + end + 1] for end in ends]


class _ForTurn:
    """The long-term store as a queued extraction writes to it: each fact's write is
    fenced by the job's turn (``add_fact(..., for_turn=...)``); everything else is the
    store's own."""

    def __init__(self, store: Any, turn_id: int) -> None:
        self._store = store
        self._turn_id = turn_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def add_fact(self, owner: MemoryOwner, memory: Any, **options: Any) -> Any:
        return await self._store.add_fact(owner, memory, for_turn=self._turn_id, **options)
