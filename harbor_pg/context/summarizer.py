"""The rolling session summary, and session summaries written in the background.

One summary per session, stored as a long-term memory of type SUMMARY, scope
SESSION and source ``"summary"`` under an id derived from the whole owner
(:func:`~harbor_pg.tiers.base.summary_memory_id`; the database assigns it).
``metadata["last_covered_message_id"]`` is its
frontier: every message of the session up to that id has been folded in, and
nothing after it. A refresh folds only messages past the frontier, so unchanged
history never costs a second summary call; ``source_message_ids`` lists just the
messages that refresh folded in, so the row never grows without bound.

:class:`RollingSummary` is the refresh itself (used by the per-turn builder and
the background worker alike). :class:`SessionSummarizer` runs it without a
caller once a session has gained ``summarise_after_turns`` turns, under a
per-session lease and cooldown kept by the store (``harbor.session_state`` in
PostgreSQL), so two workers never summarise one session at once. Raw turns are
never deleted.

Summaries are written by the configured :class:`~harbor_pg.llm.MemoryModel`, or
without any model by :class:`~harbor_pg.llm.ExtractiveSummarizer` (the default:
nothing leaves the machine).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from harbor_pg.context.prompts import summary_prompt
from harbor_pg.context.trimming import summary_boundary
from harbor_pg.credentials import without_secret_sentences
from harbor_pg.errors import MemoryConfigurationError, MemoryDatabaseError
from harbor_pg.llm.base import MemoryModel, MemoryModelError
from harbor_pg.llm.extractive import ExtractiveSummarizer
from harbor_pg.llm.langchain import as_memory_model
from harbor_pg.messages import to_langchain
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage, Memory, MemoryType
from harbor_pg.telemetry import chat_span
from harbor_pg.tiers.base import (
    ShortTermStore,
    SummaryLease,
    SummaryLeaseStore,
    SummaryStore,
    summary_memory_id,
)
from harbor_pg.tokens import TokenCounter, approximate_tokens, message_tokens

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "FRONTIER_KEY",
    "MAX_CATCH_UP_PAGES",
    "LeasingShortTermStore",
    "RefreshOutcome",
    "RollingSummary",
    "SessionSummarizer",
    "frontier_of",
    "summary_memory_id",
]

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

log = logging.getLogger("harbor_pg.context")

#: the summary text when every sentence of a fold held a credential
_WITHHELD = "(The earlier turns are not summarised: they held what looked like a credential.)"

#: Metadata key of the summary's frontier (the newest message id it covers).
FRONTIER_KEY = "last_covered_message_id"
#: Most pages of unread history one refresh folds in; the rest waits for later turns.
MAX_CATCH_UP_PAGES = 4
#: Messages per catch-up page (one summary call each).
DEFAULT_PAGE_SIZE = 50


def frontier_of(summary: Memory | None) -> int | None:
    """The summary's ``last_covered_message_id``, or None (no summary, or none recorded)."""
    if summary is None:
        return None
    value = summary.metadata.get(FRONTIER_KEY)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _failure(outcome: RefreshOutcome) -> BaseException:
    """What a failed refresh raises in strict mode: its own error, else a database one."""
    return outcome.error or MemoryDatabaseError("the rolling summary's refresh failed")


@dataclass(frozen=True, slots=True)
class RefreshOutcome:
    """What one refresh did.

    Attributes:
        summary: the session summary after the refresh (the prior one when
            nothing was saved), or None.
        frontier: that summary's ``last_covered_message_id``.
        folded_ids: ids of the messages this refresh folded in (empty unless saved).
        saved: True when a new summary was written.
        complete: True when everything older than the kept tail is now covered
            (False: a backlog remains, or a step failed).
        failed: True when a model or store failure (logged at WARNING) cut it short.
        error: that failure (None when nothing failed).
    """

    summary: Memory | None
    frontier: int | None
    folded_ids: tuple[int, ...] = ()
    saved: bool = False
    complete: bool = True
    failed: bool = False
    error: BaseException | None = None


class RollingSummary:
    """Fold a session's older messages into its rolling summary.

    Args:
        policy: the :class:`MemoryPolicy` (``summary_keep_messages``,
            ``recent_max_messages``, ``max_content_chars`` are read).
        messages: the short-term store, for catch-up pages (``after``).
        memories: the store holding the summary (:class:`SummaryStore`).
        model: writes the summary with :func:`~harbor_pg.context.prompts.summary_prompt`:
            a :class:`~harbor_pg.llm.MemoryModel` or a LangChain ``BaseChatModel``
            (wrapped); None uses ``summarizer``.
        summarizer: the no-model path; when given it is used even if a model is
            set. Default: an :class:`ExtractiveSummarizer` bounded to
            ``summary_max_tokens``.
        token_counter: counts tokens (default
            :func:`~harbor_pg.tokens.approximate_tokens`).
        summary_max_tokens: length budget of the summary (default a quarter of
            ``recent_max_tokens``, at least 64).
        page_size: messages per catch-up page.
        max_pages: most pages (summary calls) per refresh.

    :meth:`refresh` never raises for a model or store failure: it logs at
    WARNING, saves what it folded before the failure, and reports it.
    """

    # SessionSummarizer repeats these parameters on purpose: it builds a RollingSummary.
    def __init__(
        self,
        *,
        policy: MemoryPolicy,
        messages: ShortTermStore,
        memories: SummaryStore,
        model: MemoryModel | BaseChatModel | None = None,
        summarizer: ExtractiveSummarizer | None = None,
        token_counter: TokenCounter | None = None,
        summary_max_tokens: int | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_pages: int = MAX_CATCH_UP_PAGES,
    ) -> None:
        model = as_memory_model(model)
        if page_size < 1:
            raise MemoryConfigurationError(f"page_size must be >= 1, got {page_size}")
        if max_pages < 1:
            raise MemoryConfigurationError(f"max_pages must be >= 1, got {max_pages}")
        if summary_max_tokens is not None and summary_max_tokens < 1:
            raise MemoryConfigurationError(
                f"summary_max_tokens must be >= 1, got {summary_max_tokens}"
            )
        self.policy = policy
        self.messages = messages
        self.memories = memories
        self.token_counter: TokenCounter = token_counter or approximate_tokens
        self.summary_max_tokens = summary_max_tokens or max(64, policy.recent_max_tokens // 4)
        self.page_size = page_size
        self.max_pages = max_pages
        self.model = None if summarizer is not None else model
        self.summarizer = summarizer or ExtractiveSummarizer(
            max_tokens=self.summary_max_tokens, token_counter=self.token_counter
        )

    @property
    def uses_model(self) -> bool:
        """True when summaries are written by a language model."""
        return self.model is not None

    async def load(self, owner: MemoryOwner) -> Memory | None:
        """The session's current summary (store errors propagate)."""
        return await self.memories.load_summary(owner)

    def window_tokens(self, window: Sequence[ConversationMessage]) -> int:
        """Prompt tokens of ``window`` as replayed (LangChain framing included)."""
        return message_tokens([to_langchain(m) for m in window], self.token_counter)

    async def refresh(
        self,
        owner: MemoryOwner,
        window: Sequence[ConversationMessage],
        prior: Memory | None,
        *,
        window_is_whole_session: bool = False,
    ) -> RefreshOutcome:
        """Fold everything older than the kept tail of ``window`` into the summary.

        ``window`` is the newest messages of the session, oldest first, as
        loaded (at most ``recent_max_messages``); ``prior`` the summary loaded
        for it. The kept tail is the last ``summary_keep_messages`` messages not
        yet covered, walked back to the nearest user turn; when the whole
        uncovered window is one user turn, nothing is folded. Messages between
        the prior frontier and the window (unread history) are read from the
        short-term store in at most ``max_pages`` pages, resuming from the
        frontier; a page that does not advance the cursor stops the catch-up.
        All pages folded are saved once, with ``source_message_ids`` listing
        exactly them; the save is a compare-and-set on the prior frontier.
        """
        frontier = frontier_of(prior)
        if any(m.id is None for m in window):
            problem = "the short-term store returned messages without ids"
            log.warning("rolling summary skipped: %s", problem)
            return RefreshOutcome(
                prior,
                frontier,
                complete=False,
                failed=True,
                error=MemoryConfigurationError(problem),
            )
        uncovered = [m for m in window if frontier is None or (m.id or 0) > frontier]
        boundary = summary_boundary(
            [to_langchain(m) for m in uncovered], self.policy.summary_keep_messages
        )
        if boundary == 0:
            return RefreshOutcome(prior, frontier)
        stop_id = uncovered[boundary].id or 0
        # unread history may lie before the window unless the window is the whole session
        # or starts inside what the summary already covers
        gap_possible = len(uncovered) == len(window) and not window_is_whole_session

        async def from_store(cursor: int) -> list[ConversationMessage]:
            return await self.messages.after(owner, cursor, self.page_size, before_id=stop_id)

        in_window = uncovered[:boundary]

        async def from_window(cursor: int) -> list[ConversationMessage]:
            return [m for m in in_window if (m.id or 0) > cursor][: self.page_size]

        fetch: Callable[[int], Awaitable[list[ConversationMessage]]]
        fetch = from_store if gap_possible else from_window
        cursor = frontier if frontier is not None else 0
        text = prior.content if prior is not None else None
        folded: list[int] = []
        complete = False
        failed = False
        error: BaseException | None = None
        for _page in range(self.max_pages):
            try:
                raw = await fetch(cursor)
            except Exception as exc:
                log.warning("rolling summary: reading history failed (%s)", _describe(exc))
                failed, error = True, exc
                break
            if not raw:
                complete = True
                break
            page = [m for m in raw if m.id is not None and cursor < m.id < stop_id]
            if not page or max(m.id or 0 for m in page) <= cursor:
                problem = (
                    f"the history cursor did not advance past message {cursor}; catch-up stopped"
                )
                log.warning("rolling summary: %s", problem)
                failed, error = True, MemoryDatabaseError(problem)
                break
            try:
                text = await self._fold(page, text)
            except Exception as exc:
                log.warning("rolling summary: the summary call failed (%s)", _describe(exc))
                failed, error = True, exc
                break
            cursor = max(m.id or 0 for m in page)
            folded.extend(m.id or 0 for m in page)
            if len(raw) < self.page_size or cursor >= (in_window[-1].id or 0):
                complete = True
                break
        if not folded:
            return RefreshOutcome(
                prior, frontier, complete=complete and not failed, failed=failed, error=error
            )
        if not text:
            # nothing informative to keep yet (the extractive path found only filler)
            return RefreshOutcome(prior, frontier, complete=complete, failed=failed, error=error)
        outcome = await self._save(owner, prior, frontier, text, folded, complete, failed)
        if outcome.error is None and error is not None:
            outcome = replace(outcome, error=error)
        return outcome

    @chat_span("summary")
    async def _fold(self, page: Sequence[ConversationMessage], prior_text: str | None) -> str:
        if self.model is None:
            # the summarizer's own budget applies (the default one is sized to summary_max_tokens)
            text = await self.summarizer.asummarize(page, prior_summary=prior_text)
            return text.strip() or (prior_text or "")
        words = max(50, self.summary_max_tokens * 3 // 4)
        prompt = summary_prompt(page, prior_text, max_words=words)
        text = (await self.model.generate_text(prompt.system, prompt.user)).strip()
        if not text:
            raise MemoryModelError("the summary model returned an empty summary")
        return text

    async def _save(
        self,
        owner: MemoryOwner,
        prior: Memory | None,
        frontier: int | None,
        text: str,
        folded: list[int],
        complete: bool,
        failed: bool,
    ) -> RefreshOutcome:
        # the filter every other long-term write passes: a turn that held a credential
        # must not be carried into the stored summary (and so into every later prompt)
        text, kind = without_secret_sentences(text)
        if kind is not None:
            log.warning(
                "rolling summary: left out what looked like a secret (%s) from the summary", kind
            )
            text = text or (prior.content if prior is not None else "") or _WITHHELD
        limit = self.policy.max_content_chars
        if len(text) > limit:
            text = text[: limit - 1].rstrip() + "\u2026"
        metadata: dict[str, Any] = dict(prior.metadata) if prior is not None else {}
        metadata[FRONTIER_KEY] = folded[-1]
        memory = Memory(
            id=prior.id if prior is not None else summary_memory_id(owner),
            scope=MemoryScope.SESSION,
            memory_type=MemoryType.SUMMARY,
            content=text,
            source="summary",
            source_session_id=owner.session_id,
            source_message_ids=[str(i) for i in folded],
            metadata=metadata,
        )
        try:
            stored = await self.memories.save_summary(owner, memory, expected_frontier=frontier)
        except Exception as exc:
            log.warning("rolling summary: saving the summary failed (%s)", _describe(exc))
            return RefreshOutcome(prior, frontier, complete=False, failed=True, error=exc)
        if stored is None:
            log.info("rolling summary: another writer refreshed this session's summary first")
            return RefreshOutcome(prior, frontier, complete=False, failed=failed)
        return RefreshOutcome(
            stored,
            frontier_of(stored),
            folded_ids=tuple(folded),
            saved=True,
            complete=complete,
            failed=failed,
        )


class LeasingShortTermStore(ShortTermStore, SummaryLeaseStore, Protocol):
    """A short-term store that also keeps the summary lease (both built-in stores do)."""


class SessionSummarizer:
    """Summarise sessions in the background, once enough turns have arrived.

    Args:
        policy: reads ``summarise_after_turns``, ``summary_cooldown_seconds`` and
            the summary fields; a disabled policy never summarises.
        messages: the short-term store; it also keeps the per-session lease
            (:class:`~harbor_pg.tiers.base.SummaryLeaseStore`).
        memories: the store holding the summary.
        model, summarizer, token_counter, summary_max_tokens, page_size, max_pages:
            as for :class:`RollingSummary`.
        lease_seconds: how long a worker holds the lease. A worker whose refresh
            fails leaves its lease to expire, which spaces out retries.

    The summary written is the same rolling summary the per-turn builder keeps
    (same row, same frontier), covering everything older than the last
    ``summary_keep_messages`` messages.
    """

    # RollingSummary's parameters (it builds one), plus the lease: repeated on purpose.
    def __init__(
        self,
        *,
        policy: MemoryPolicy,
        messages: LeasingShortTermStore,
        memories: SummaryStore,
        model: MemoryModel | BaseChatModel | None = None,
        summarizer: ExtractiveSummarizer | None = None,
        token_counter: TokenCounter | None = None,
        summary_max_tokens: int | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_pages: int = MAX_CATCH_UP_PAGES,
        lease_seconds: float = 120.0,
    ) -> None:
        if lease_seconds <= 0:
            raise MemoryConfigurationError(f"lease_seconds must be positive, got {lease_seconds}")
        self.policy = policy
        self.messages = messages
        self.lease_seconds = lease_seconds
        self.rolling = RollingSummary(
            policy=policy,
            messages=messages,
            memories=memories,
            model=model,
            summarizer=summarizer,
            token_counter=token_counter,
            summary_max_tokens=summary_max_tokens,
            page_size=page_size,
            max_pages=max_pages,
        )
        self._tasks: set[asyncio.Task[bool]] = set()

    async def maybe_summarise(self, owner: MemoryOwner, *, strict: bool = False) -> bool:
        """Summarise ``owner``'s session if it is due; return whether this call ran it.

        Due means: the policy is enabled, the session gained at least
        ``summarise_after_turns`` turns since its last background summary, the
        last one finished at least ``summary_cooldown_seconds`` ago, and no
        other worker holds the lease. The lease is taken atomically by the
        store, so of concurrent callers exactly one runs. Returns True when this
        call held the lease and brought the summary up to date (or found nothing
        to fold); False otherwise, including after a failure, which is logged
        at WARNING and not raised, unless ``strict`` (a queued fold, which the queue
        retries and shows failed): then the failure is raised, after what was folded
        until then is saved and the lease released.

        Raises:
            MemoryScopeError: ``owner`` lacks ``principal_id`` or ``session_id``.
        """
        owner.require("principal_id", "session_id")
        if not self.policy.enabled:
            return False
        try:
            lease = await self.messages.acquire_summary_lease(
                owner,
                min_turns=self.policy.summarise_after_turns,
                cooldown_seconds=self.policy.summary_cooldown_seconds,
                lease_seconds=self.lease_seconds,
            )
        except Exception as exc:
            log.warning("background summary: taking the session lease failed (%s)", _describe(exc))
            if strict:
                raise
            return False
        if lease is None:
            return False
        try:
            prior = await self.rolling.load(owner)
            window = await self.messages.recent(owner, self.policy.recent_max_messages)
        except Exception as exc:
            log.warning("background summary: reading the session failed (%s)", _describe(exc))
            if strict:
                raise
            return False
        outcome = await self.rolling.refresh(
            owner,
            window,
            prior,
            window_is_whole_session=len(window) < self.policy.recent_max_messages,
        )
        if outcome.failed and not outcome.saved:
            if strict:
                # a queued fold: the queue backs off and retries, and the retry must find
                # the session still due, not leased
                await self._release(owner, lease)
                raise _failure(outcome)
            return False  # the lease expires on its own: a back-off before the retry
        # a backlog left over keeps the old turn mark, so the next run is due after the cooldown
        turns = lease.turns if outcome.complete else lease.turns_at_summary
        try:
            await self.messages.finish_summary_lease(owner, lease, turns_at_summary=turns)
        except Exception as exc:
            log.warning(
                "background summary: releasing the session lease failed (%s)", _describe(exc)
            )
            if strict:
                raise
        if strict and outcome.failed:
            raise _failure(outcome)
        return outcome.complete

    async def _release(self, owner: MemoryOwner, lease: SummaryLease) -> None:
        """Drop ``lease`` without recording a summary (stores that can; else it expires)."""
        release = getattr(self.messages, "release_summary_lease", None)
        if release is None:
            return
        try:
            await release(owner, lease)
        except Exception as exc:  # it expires on its own
            log.warning(
                "background summary: releasing the session lease failed (%s)", _describe(exc)
            )

    def schedule(self, owner: MemoryOwner) -> asyncio.Task[bool]:
        """Run :meth:`maybe_summarise` for ``owner`` as a background task.

        The task is kept referenced until it finishes; await it, or call
        :meth:`drain` (e.g. at shutdown) to wait for every scheduled task.
        Must be called from a running event loop.
        """
        task = asyncio.get_running_loop().create_task(
            self._guarded(owner), name=f"harbor-summary:{owner.session_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guarded(self, owner: MemoryOwner) -> bool:
        try:
            return await self.maybe_summarise(owner)
        except Exception as exc:  # a bad owner: nobody awaits a background task's error
            log.warning("background summary not run (%s)", _describe(exc))
            return False

    @property
    def pending(self) -> int:
        """How many scheduled summaries have not finished yet."""
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait until every scheduled summary has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
