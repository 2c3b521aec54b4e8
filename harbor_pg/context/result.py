"""MemoryContext: everything one turn needs from memory, as one immutable value.

``recalled_entity_ids(context)`` (from :mod:`harbor_pg.context.recall`) is
re-exported here: the de-duplicated entity ids of ``context.recalled``.
"""

from __future__ import annotations

from dataclasses import dataclass

from langchain_core.messages import BaseMessage

from harbor_pg.context.recall import recalled_entity_ids
from harbor_pg.messages import to_langchain
from harbor_pg.policy import BudgetAllowance
from harbor_pg.profile import UserProfile
from harbor_pg.records import ConversationMessage, Memory, MemoryType

__all__ = ["MemoryContext", "recalled_entity_ids"]


@dataclass(frozen=True, slots=True)
class MemoryContext:
    """What :meth:`MemoryContextBuilder.build` assembled for one turn.

    Attributes:
        messages: the verbatim window to replay, oldest first (the history
            before this turn; the question itself is not in it).
        summary: the rolling session summary covering the turns the window
            dropped, or None.
        recalled: long-term memories, already ranked and cut to the token budget.
        standalone_query: what retrieval should search for (the question itself
            unless a rewrite changed it).
        wanted_types: memory types the rewrite said the question asks for (at most three).
        anchor_entity_ids: the graph entities passed to ``build``, de-duplicated, in order.
        rewritten: True only when the rewrite actually changed the question.
        question: the question as asked.
        summary_refreshed: True when this turn folded messages into the summary and saved it.
        budget: the per-share token allowances, when the policy has a BudgetSplit.
        degraded: the steps that failed and were skipped this turn (each logged at
            WARNING): any of ``"history"``, ``"summary"``, ``"rewrite"``, ``"recall"``,
            ``"profile"``.
        profile: the user's profile within ``MemoryPolicy.profile_max_tokens`` (None
            when that is 0 or the builder has no profile store); ``recalled`` then
            leaves out the memories it holds.
    """

    messages: tuple[ConversationMessage, ...] = ()
    summary: str | None = None
    recalled: tuple[Memory, ...] = ()
    standalone_query: str = ""
    wanted_types: tuple[MemoryType, ...] = ()
    anchor_entity_ids: tuple[str, ...] = ()
    rewritten: bool = False
    question: str = ""
    summary_refreshed: bool = False
    budget: BudgetAllowance | None = None
    degraded: tuple[str, ...] = ()
    profile: UserProfile | None = None

    def langchain_messages(self) -> list[BaseMessage]:
        """The window as fresh LangChain messages, ready to send to a chat model."""
        return [to_langchain(message) for message in self.messages]
