"""Window trimming and the post-summary boundary, over LangChain messages.

Both functions keep tool results next to the assistant message whose tool call
produced them: a window that opened on an orphaned tool result is rejected by
most chat APIs, and a summary that swallowed the call but not its result would
misdescribe the turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, trim_messages

from harbor_pg.errors import MemoryValidationError
from harbor_pg.messages import from_langchain, is_user_message, to_langchain
from harbor_pg.tokens import TokenCounter, approximate_tokens, message_tokens

__all__ = [
    "from_langchain",
    "summary_boundary",
    "to_langchain",
    "trim_window",
]


def trim_window(
    messages: Sequence[BaseMessage],
    max_tokens: int,
    token_counter: TokenCounter = approximate_tokens,
) -> list[BaseMessage]:
    """Keep the newest messages that fit ``max_tokens``, starting on a user turn.

    Uses LangChain's ``trim_messages(strategy="last", start_on="human")``, with
    tokens counted by :func:`~harbor_pg.tokens.message_tokens` over
    ``token_counter``. When nothing fits (a budget too small for one message,
    or no user turn inside the budget) the newest message is still kept, so a
    turn never loses its immediate history; if that newest message is a tool
    result, the assistant message that issued the call (and any sibling
    results) come with it. Input order (oldest first) is preserved.
    """
    if not messages:
        return []

    def count(batch: list[BaseMessage]) -> int:
        return message_tokens(batch, token_counter)

    trimmed = trim_messages(
        list(messages),
        max_tokens=max(0, max_tokens),
        token_counter=count,
        strategy="last",
        start_on="human",
    )
    if trimmed:
        return trimmed
    return _newest_unit(messages)


def _newest_unit(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The newest message, plus the tool call that produced it when it is a tool result."""
    newest = messages[-1]
    if not isinstance(newest, ToolMessage):
        return [newest]
    for index in range(len(messages) - 2, -1, -1):
        candidate = messages[index]
        if isinstance(candidate, ToolMessage):
            continue
        if isinstance(candidate, AIMessage) and candidate.tool_calls:
            return list(messages[index:])
        break
    return [newest]


def summary_boundary(messages: Sequence[BaseMessage], keep: int) -> int:
    """Index where the verbatim tail starts once everything older is summarised.

    Starts ``keep`` messages from the end and walks back to the nearest user
    turn, so the tail may hold more than ``keep`` messages but never opens on a
    tool result or an assistant reply cut off from the question it answers.
    ``messages[:boundary]`` is what a refresh folds into the summary. Returns 0
    (nothing to summarise) when ``keep`` covers the whole window or when no user
    turn precedes the cut, e.g. a window that is one question followed by a long
    tool chain. ``keep == 0`` returns ``len(messages)``.

    Raises :class:`MemoryValidationError` for a negative ``keep``.
    """
    if keep < 0:
        raise MemoryValidationError(f"keep must be >= 0, got {keep}")
    total = len(messages)
    if keep >= total:
        return 0
    boundary = total - keep
    if boundary == total:
        return total
    while boundary > 0 and not is_user_message(messages[boundary]):
        boundary -= 1
    return boundary
