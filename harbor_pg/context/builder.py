"""MemoryContextBuilder: everything one chat or agent turn needs from memory.

The builder follows the build order of seed 000:

1. identify the conversation (tenant, user, session) from the owner;
2. load the last ``recent_max_messages`` messages, oldest first;
3. when the policy is disabled, return that window with the question unchanged;
4. load the session's rolling summary and its frontier;
5. refresh the summary when the window outgrows ``summary_trigger_fraction`` of
   its budget (see :mod:`harbor_pg.context.summarizer`);
6. token-trim the window, starting on a user turn;
7. condense summary, window and question into one standalone query, and learn
   which memory types the question wants (see :mod:`harbor_pg.context.condenser`);
8. recall long-term memories for that query, within the memory block's budget.

No model or repository failure ever fails the turn: each is logged at WARNING,
named in :attr:`MemoryContext.degraded`, and the turn continues with the
trimmed history and the original question.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from harbor_pg.context.condenser import QueryCondenser
from harbor_pg.context.result import MemoryContext
from harbor_pg.context.summarizer import (
    DEFAULT_PAGE_SIZE,
    RollingSummary,
    SessionSummarizer,
    frontier_of,
)
from harbor_pg.context.trimming import trim_window
from harbor_pg.errors import MemoryConfigurationError, MemoryValidationError
from harbor_pg.llm.base import MemoryModel
from harbor_pg.llm.extractive import ExtractiveSummarizer
from harbor_pg.llm.langchain import as_memory_model
from harbor_pg.messages import to_langchain
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import BudgetAllowance, MemoryPolicy
from harbor_pg.profile import ProfileRequest, UserProfile
from harbor_pg.records import ConversationMessage, Memory, MemoryType
from harbor_pg.telemetry import traced
from harbor_pg.tiers.base import ProfileStore, ShortTermStore, SummaryLease, SummaryStore
from harbor_pg.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter, approximate_tokens

__all__ = ["ContextRecall", "MemoryContextBuilder"]

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

log = logging.getLogger("harbor_pg.context")

#: How long a turn's own summary refresh holds the session's lease (it expires
#: on its own if the turn dies mid-way).
REFRESH_LEASE_SECONDS = 120.0


@runtime_checkable
class ContextRecall(Protocol):
    """What the builder needs from recall (``harbor_pg.context.recall.MemoryRecall`` fits).

    ``recall`` never raises; it returns memories already ranked and cut to
    ``token_budget``. The builder still guards the call and re-checks the budget.
    """

    async def recall(
        self,
        owner: MemoryOwner,
        query: str,
        *,
        anchor_entity_ids: Sequence[str] = (),
        wanted_types: Sequence[MemoryType] = (),
        as_of: datetime | None = None,
        token_budget: int | None = None,
    ) -> tuple[Memory, ...]:
        """Memories worth spending ``token_budget`` prompt tokens on, best first."""
        ...


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _anchors(raw: Sequence[str]) -> tuple[str, ...]:
    if isinstance(raw, str):
        raise MemoryValidationError("anchor_entity_ids must be a sequence of ids, not one string")
    seen: dict[str, None] = {}
    for item in raw:
        if not isinstance(item, str):
            raise MemoryValidationError(
                f"anchor_entity_ids must hold strings, got {type(item).__name__}"
            )
        if item.strip():
            seen.setdefault(item, None)
    return tuple(seen)


class MemoryContextBuilder:
    """Assemble the per-turn :class:`MemoryContext`.

    Args:
        policy: the :class:`MemoryPolicy` (default ``MemoryPolicy()``).
        messages: the short-term store holding the conversation.
        memories: the long-term store holding the rolling summary; None means
            no summary is read or written.
        model: the language model for summaries and the query rewrite: a
            :class:`~harbor_pg.llm.MemoryModel` or a LangChain ``BaseChatModel``
            (wrapped by :class:`~harbor_pg.llm.LangChainModel`). None
            (the default) is the no-model path: summaries are extractive and
            the question is searched as asked, so nothing leaves the machine.
        recall: long-term recall (:class:`ContextRecall`); None recalls nothing.
        summarizer: an :class:`ExtractiveSummarizer` to write summaries with,
            even when a model is set (the model then only rewrites).
        token_counter: counts tokens for every budget (default
            :func:`~harbor_pg.tokens.approximate_tokens`).
        prompt_tokens: the total prompt budget a :class:`~harbor_pg.policy.BudgetSplit`
            is applied to; required when the policy has one (``build`` may
            override it per turn), ignored otherwise.
        summary_max_tokens: length budget of the rolling summary (default a
            quarter of the window's budget, ``recent_max_tokens`` or the session
            share of ``prompt_tokens``, at least 32).
        page_size: messages per catch-up page of the summary refresh.
        background: a :class:`SessionSummarizer`; when set, every enabled
            ``build`` schedules it for the session (it runs only when due).
        profile: a store that keeps profiles (:class:`~harbor_pg.tiers.base.ProfileStore`);
            with ``MemoryPolicy.profile_max_tokens`` above 0 each ``build`` puts
            the user's profile in :attr:`MemoryContext.profile`.

    Raises:
        MemoryConfigurationError: the policy has a BudgetSplit but no
            ``prompt_tokens`` was given, or a size is out of range.
    """

    def __init__(
        self,
        *,
        policy: MemoryPolicy | None = None,
        messages: ShortTermStore,
        memories: SummaryStore | None = None,
        model: MemoryModel | BaseChatModel | None = None,
        recall: ContextRecall | None = None,
        summarizer: ExtractiveSummarizer | None = None,
        token_counter: TokenCounter | None = None,
        prompt_tokens: int | None = None,
        summary_max_tokens: int | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        background: SessionSummarizer | None = None,
        profile: ProfileStore | None = None,
    ) -> None:
        self.policy = policy or MemoryPolicy()
        if self.policy.budget is not None and prompt_tokens is None:
            raise MemoryConfigurationError(
                "the policy has a BudgetSplit: pass prompt_tokens, the total prompt budget"
            )
        self._check_total(prompt_tokens)
        self.messages = messages
        self.memories = memories
        # a LangChain chat model is wrapped once, for the summary and the rewrite alike
        model = as_memory_model(model)
        self.model = model
        self.recall = recall
        self.token_counter: TokenCounter = token_counter or approximate_tokens
        self.prompt_tokens = prompt_tokens
        self.background = background
        self.profile = profile
        self.rolling: RollingSummary | None = None
        if memories is not None:
            if summary_max_tokens is None:
                base = self._budgets(None)[1]  # the window's budget (the session share)
                summary_max_tokens = max(32, base // 4)
            self.rolling = RollingSummary(
                policy=self.policy,
                messages=messages,
                memories=memories,
                model=model,
                summarizer=summarizer,
                token_counter=self.token_counter,
                summary_max_tokens=summary_max_tokens,
                page_size=page_size,
            )
        self.condenser = (
            QueryCondenser(model, token_counter=self.token_counter) if model is not None else None
        )

    @staticmethod
    def _check_total(prompt_tokens: int | None) -> None:
        if prompt_tokens is None:
            return
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int):
            raise MemoryConfigurationError("prompt_tokens must be an integer")
        if prompt_tokens < 1:
            raise MemoryConfigurationError(f"prompt_tokens must be >= 1, got {prompt_tokens}")

    def _budgets(self, prompt_tokens: int | None) -> tuple[BudgetAllowance | None, int, int]:
        """(allowance, window budget, recall budget) for this turn."""
        policy = self.policy
        if policy.budget is None:
            return None, policy.recent_max_tokens, policy.block_budget_tokens
        self._check_total(prompt_tokens)
        total = prompt_tokens if prompt_tokens is not None else self.prompt_tokens
        assert total is not None  # checked at construction
        allowance = policy.budget.allocate(total)
        return allowance, allowance.session, allowance.episodic

    @traced(
        "harbor_pg.build",
        result=lambda c: {
            "harbor.build.messages": len(c.messages),
            "harbor.build.recalled": len(c.recalled),
            "harbor.build.rewritten": c.rewritten,
            "harbor.build.summary_refreshed": c.summary_refreshed,
            "harbor.build.degraded": list(c.degraded),
        },
    )
    async def build(
        self,
        owner: MemoryOwner,
        question: str,
        *,
        anchor_entity_ids: Sequence[str] = (),
        prompt_tokens: int | None = None,
    ) -> MemoryContext:
        """Assemble this turn's context for ``question``.

        Contract: ``question`` must **not** be persisted yet. The window
        returned is the history before this turn; append the user message to
        the short-term store after ``build`` (a caller that appends first sees
        its own question replayed inside the window).

        ``owner`` must carry ``principal_id`` and ``session_id``; ``user_id``
        defaults to ``principal_id`` (for reads and the summary save alike), so
        supply ``user_id`` consistently or always omit it. The rolling summary
        keeps the ownership of its first save across credential or project
        changes within the session.

        ``anchor_entity_ids`` are the graph entities this turn's document
        retrieval surfaced; recall boosts memories that share them, and they
        are echoed in the result. ``prompt_tokens`` overrides the builder's
        total prompt budget for a policy with a BudgetSplit: the window (and
        the summary) are then fitted to the ``session`` share and recall to the
        ``episodic`` share; an unused share is not handed to another, and the
        ``system`` and ``current_turn`` shares are reported in
        :attr:`MemoryContext.budget`, never spent.

        A model or store failure never raises: it is logged at WARNING, its
        step is listed in :attr:`MemoryContext.degraded`, and the turn goes on
        with the trimmed history and the original question.

        Raises:
            MemoryScopeError: ``owner`` lacks ``principal_id`` or ``session_id``.
            MemoryValidationError: ``question`` is not a string, or an anchor is not one.
            MemoryConfigurationError: ``prompt_tokens`` is not a positive integer.
        """
        # 1. the conversation identity: tenant, user (defaults to principal), session
        owner.require("principal_id", "session_id")
        if not isinstance(question, str):
            raise MemoryValidationError(f"question must be a string, got {type(question).__name__}")
        anchors = _anchors(anchor_entity_ids)
        allowance, window_budget, recall_budget = self._budgets(prompt_tokens)
        policy = self.policy
        degraded: list[str] = []

        # 2. the newest messages, oldest first
        window: list[ConversationMessage] = []
        try:
            window = list(await self.messages.recent(owner, policy.recent_max_messages))
        except Exception as exc:
            log.warning("context: loading the history failed (%s)", _describe(exc))
            degraded.append("history")

        # 3. disabled: a plain window, no model, no repository write
        if not policy.enabled:
            return MemoryContext(
                messages=self._trim(window, window_budget),
                standalone_query=question,
                anchor_entity_ids=anchors,
                question=question,
                budget=allowance,
                degraded=tuple(degraded),
            )

        # 4-5. the rolling summary, refreshed when the window outgrows its share
        summary, refreshed = await self._summary(owner, window, window_budget, degraded)
        summary_text = summary.content if summary is not None else None
        frontier = frontier_of(summary)
        if allowance is not None and summary_text is not None:
            # the session share holds the summary first, then the window; a summary
            # that alone exceeds the share is left out rather than cut mid-sentence
            cost = self.token_counter(summary_text) + MESSAGE_OVERHEAD_TOKENS
            if cost > window_budget:
                summary_text = None
            else:
                window_budget -= cost
        if summary_text is not None and frontier is not None:
            # what the summary covers is not replayed verbatim as well
            window = [m for m in window if m.id is None or m.id > frontier]

        # 6. the verbatim window, trimmed to its budget
        messages = self._trim(window, window_budget)

        # 7. the standalone query and the wanted memory types
        standalone_query, rewritten = question, False
        wanted: tuple[MemoryType, ...] = ()
        if policy.query_rewrite and self.condenser is not None:
            try:
                condensed = await self.condenser.condense(question, messages, summary_text)
            except Exception as exc:
                log.warning("context: the query rewrite failed (%s)", _describe(exc))
                degraded.append("rewrite")
            else:
                standalone_query = condensed.standalone_query
                wanted = condensed.wanted_types
                rewritten = condensed.rewritten

        # 8. long-term recall, within the memory block's budget
        recalled: tuple[Memory, ...] = ()
        if self.recall is not None and policy.recall_top_k > 0 and recall_budget > 0:
            try:
                found = await self.recall.recall(
                    owner,
                    standalone_query,
                    anchor_entity_ids=anchors,
                    wanted_types=wanted,
                    token_budget=recall_budget,
                )
                recalled = self._fit(found, recall_budget)
            except Exception as exc:
                log.warning("context: recall failed (%s)", _describe(exc))
                degraded.append("recall")

        # 9. the user's profile, when asked for: recall then leaves out what it holds
        profile: UserProfile | None = None
        if self.profile is not None and policy.profile_max_tokens > 0:
            try:
                profile = await self.profile.profile(
                    owner,
                    ProfileRequest(
                        token_budget=policy.profile_max_tokens,
                        max_sensitivity=policy.recall_max_sensitivity,
                    ),
                )
            except Exception as exc:
                log.warning("context: loading the profile failed (%s)", _describe(exc))
                degraded.append("profile")
            else:
                held = {m.id for m in profile.memories}
                recalled = tuple(m for m in recalled if m.id is None or m.id not in held)

        if self.background is not None:
            try:
                self.background.schedule(owner)
            except Exception as exc:
                log.warning("context: scheduling the background summary failed (%s)", exc)

        return MemoryContext(
            messages=messages,
            summary=summary_text,
            recalled=recalled,
            standalone_query=standalone_query,
            wanted_types=wanted,
            anchor_entity_ids=anchors,
            rewritten=rewritten,
            question=question,
            summary_refreshed=refreshed,
            budget=allowance,
            degraded=tuple(degraded),
            profile=profile,
        )

    async def _summary(
        self,
        owner: MemoryOwner,
        window: list[ConversationMessage],
        window_budget: int,
        degraded: list[str],
    ) -> tuple[Memory | None, bool]:
        """Steps 4 and 5: load the summary, refresh it if due; (summary, refreshed)."""
        if self.rolling is None:
            return None, False
        loaded, summary = await self._load_summary(owner, degraded)
        if not loaded:
            return None, False
        if "history" in degraded or not window:
            return summary, False
        # floor, forgiving float noise such as 0.7 * 10 == 6.999999999999999
        trigger = math.floor(self.policy.summary_trigger_fraction * window_budget + 1e-9)
        if not self._due(window, summary, trigger):
            return summary, False
        # the session's summary lease decides who folds (this turn or a background worker),
        # so no two folds of one due point run and no model call's result is thrown away
        acquire = getattr(self.messages, "acquire_summary_lease", None)
        lease: SummaryLease | None = None
        if acquire is not None:
            try:
                lease = await acquire(
                    owner, min_turns=1, cooldown_seconds=0.0, lease_seconds=REFRESH_LEASE_SECONDS
                )
            except Exception as exc:
                log.warning("context: taking the summary lease failed (%s)", _describe(exc))
                degraded.append("summary")
                return summary, False
            if lease is None:
                # another worker is folding this session now; its summary serves later turns
                return summary, False
            # a fold that finished between the load above and the lease moved the frontier
            loaded, summary = await self._load_summary(owner, degraded)
            if not loaded:
                return None, False
            if not self._due(window, summary, trigger):
                await self._finish(owner, lease, lease.turns_at_summary)
                return summary, False
        outcome = await self.rolling.refresh(
            owner,
            window,
            summary,
            window_is_whole_session=len(window) < self.policy.recent_max_messages,
        )
        if outcome.failed:
            degraded.append("summary")
        if lease is not None and (outcome.saved or not outcome.failed):
            # as the background worker does: a backlog left keeps the old turn mark;
            # a failure leaves the lease to expire, a back-off before the next try
            await self._finish(
                owner, lease, lease.turns if outcome.complete else lease.turns_at_summary
            )
        return outcome.summary, outcome.saved

    async def _load_summary(
        self, owner: MemoryOwner, degraded: list[str]
    ) -> tuple[bool, Memory | None]:
        """(loaded, the session's summary); a failure is logged and marks ``degraded``."""
        assert self.rolling is not None
        try:
            return True, await self.rolling.load(owner)
        except Exception as exc:
            log.warning("context: loading the session summary failed (%s)", _describe(exc))
            degraded.append("summary")
            return False, None

    def _due(
        self, window: Sequence[ConversationMessage], summary: Memory | None, trigger: int
    ) -> bool:
        """Whether the window's turns past the summary's frontier exceed ``trigger`` tokens."""
        assert self.rolling is not None
        frontier = frontier_of(summary)
        uncovered = [m for m in window if frontier is None or m.id is None or m.id > frontier]
        return self.rolling.window_tokens(uncovered) > trigger

    async def _finish(self, owner: MemoryOwner, lease: SummaryLease, turns: int) -> None:
        try:
            await self.messages.finish_summary_lease(  # type: ignore[attr-defined]
                owner, lease, turns_at_summary=turns
            )
        except Exception as exc:
            log.warning("context: releasing the summary lease failed (%s)", _describe(exc))

    def _trim(
        self, window: Sequence[ConversationMessage], budget: int
    ) -> tuple[ConversationMessage, ...]:
        """Step 6: the newest messages within ``budget``, opening on a user turn."""
        if not window:
            return ()
        kept = trim_window([to_langchain(m) for m in window], budget, self.token_counter)
        # trim_window keeps a suffix of its input: return the stored rows themselves
        return tuple(window[len(window) - len(kept) :]) if kept else ()

    def _fit(self, memories: Sequence[Memory], budget: int) -> tuple[Memory, ...]:
        """The longest prefix of ``memories`` within ``recall_top_k`` and ``budget`` tokens."""
        kept: list[Memory] = []
        used = 0
        for memory in memories[: self.policy.recall_top_k]:
            cost = self.token_counter(memory.content)
            if used + cost > budget:
                break
            kept.append(memory)
            used += cost
        return tuple(kept)
