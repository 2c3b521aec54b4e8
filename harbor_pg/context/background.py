"""Session summaries scheduled in the background after appends.

:class:`BackgroundSummaries` keeps, for a facade and the bound copies it makes,
one :class:`~harbor_pg.context.summarizer.SessionSummarizer` per (model,
policy), and after each append at most one due check per session in flight.
The summarizer (and the model libraries it loads) is imported on first use.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.base import ShortTermStore, SummaryLeaseStore, SummaryStore

if TYPE_CHECKING:
    from harbor_pg.context.summarizer import LeasingShortTermStore, SessionSummarizer

__all__ = ["BackgroundSummaries"]

log = logging.getLogger("harbor_pg")


#: a session, as background summaries key it: (tenant, user, session)
_SessionKey = tuple[str, str | None, str | None]


class BackgroundSummaries:
    """The background summaries of a facade and the bound copies it makes.

    Keeps one :class:`SessionSummarizer` per (model, policy), and after each
    append at most one due check per session in flight: an append that
    arrives meanwhile makes that check look once more when it is done.
    """

    def __init__(self) -> None:
        #: SessionSummarizer per (id(model), id(policy))
        self.summarizers: dict[tuple[int, int], SessionSummarizer] = {}
        #: due checks scheduled after appends, running or waiting
        self.tasks: set[asyncio.Task[None]] = set()
        #: sessions with a check in flight -> another append arrived meanwhile
        self.pending: dict[_SessionKey, bool] = {}
        #: (short-term store, long-term store, whether they can hold summaries)
        self._capable: tuple[object, object, bool] | None = None

    def can_summarise(self, short_term: object, long_term: object) -> bool:
        """Whether the stores can hold summaries (two runtime Protocol checks, about
        0.1 ms on every append: kept while the stores stay the same)."""
        known = self._capable
        if known is not None and known[0] is short_term and known[1] is long_term:
            return known[2]
        capable = isinstance(short_term, SummaryLeaseStore) and isinstance(long_term, SummaryStore)
        self._capable = (short_term, long_term, capable)
        return capable

    async def append(
        self,
        store: ShortTermStore,
        owner: MemoryOwner,
        message: ConversationMessage,
        *,
        policy: MemoryPolicy,
        summarise_if_due: Callable[[MemoryOwner, bool], Awaitable[None]],
    ) -> ConversationMessage:
        """Append ``message`` and, once the session is due a summary, schedule
        ``summarise_if_due`` (see :meth:`schedule`)."""
        checking = getattr(store, "append_and_check_summary", None)
        if checking is None:
            stored = await store.append(owner, message)
            self.schedule(owner, summarise_if_due, known_due=False)
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
            self.schedule(owner, summarise_if_due, known_due=True)
        return stored

    @staticmethod
    async def summarise_if_due(
        owner: MemoryOwner,
        *,
        checked: bool,
        short_term: object,
        policy: MemoryPolicy,
        summarizer: Callable[[], SessionSummarizer],
        strict: bool = False,
    ) -> None:
        """Summarise ``owner``'s session with ``summarizer()`` if it is due; unless
        ``checked``, a read-only due check of ``short_term`` comes first, so that a
        session with nothing due writes nothing (no lease row). ``strict``: a failure
        is raised (see :meth:`SessionSummarizer.maybe_summarise`)."""
        due = None if checked else getattr(short_term, "summary_due", None)
        if due is not None and not await due(
            owner,
            min_turns=policy.summarise_after_turns,
            cooldown_seconds=policy.summary_cooldown_seconds,
        ):
            return
        if strict:
            await summarizer().maybe_summarise(owner, strict=True)
        else:  # (a summarizer of one's own need not know strict)
            await summarizer().maybe_summarise(owner)

    def summarizer(
        self,
        *,
        policy: MemoryPolicy,
        messages: LeasingShortTermStore,
        memories: SummaryStore,
        model: Any = None,
    ) -> SessionSummarizer:
        """The summarizer for ``model`` and ``policy``, made on first use."""
        from harbor_pg.context.summarizer import SessionSummarizer

        key = (id(model), id(policy))
        found = self.summarizers.get(key)
        if found is None:
            found = SessionSummarizer(
                policy=policy, messages=messages, memories=memories, model=model
            )
            self.summarizers[key] = found
        return found

    def schedule(
        self,
        owner: MemoryOwner,
        summarise_if_due: Callable[[MemoryOwner, bool], Awaitable[None]],
        *,
        known_due: bool,
    ) -> None:
        """After an append: run ``summarise_if_due(owner, checked)`` in the background.

        ``known_due``: the append found the session due already (``checked``
        is True on the first run); otherwise the callee checks first. Never raises.
        """
        try:
            key = (owner.tenant_id, owner.user_id, owner.session_id)
            if key in self.pending:
                self.pending[key] = True
                return
            loop = asyncio.get_running_loop()
            self.pending[key] = False
            task = loop.create_task(
                self._when_due(owner, key, summarise_if_due, checked=known_due),
                name=f"harbor-summary:{owner.session_id}",
            )
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        except Exception as exc:
            log.warning("background summary not scheduled (%s)", exc)

    async def _when_due(
        self,
        owner: MemoryOwner,
        key: _SessionKey,
        summarise_if_due: Callable[[MemoryOwner, bool], Awaitable[None]],
        *,
        checked: bool,
    ) -> None:
        try:
            while True:
                self.pending[key] = False
                try:
                    await summarise_if_due(owner, checked)
                except Exception as exc:
                    log.warning("background summary failed (%s)", exc)
                if not self.pending.get(key):
                    return
                checked = False  # appends arrived meanwhile: look again
        finally:
            self.pending.pop(key, None)

    async def drain(self) -> None:
        """Wait until every background summary scheduled so far has finished."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        for summarizer in list(self.summarizers.values()):
            await summarizer.drain()
