"""Token estimates for budgets, without a tokenizer dependency.

The estimate is deliberately simple and stable: about four ASCII characters per
token, and every non-ASCII character counted as a token of its own (CJK text and
emoji tokenise far denser than English, so counting them individually keeps
budgets from being overrun by non-English conversations). Inject a real
tokenizer as a :data:`TokenCounter` when exact counts matter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:  # LangChain's messages load with the first message counted
    from langchain_core.messages import AIMessage, BaseMessage

__all__ = [
    "MESSAGE_OVERHEAD_TOKENS",
    "NON_TEXT_BLOCK_TOKENS",
    "TokenCounter",
    "approximate_tokens",
    "content_tokens",
    "message_tokens",
]

#: Counts the tokens of one string.
TokenCounter: TypeAlias = Callable[[str], int]

#: Per-message framing cost (role markers, separators) that chat formats add.
MESSAGE_OVERHEAD_TOKENS = 4

#: Flat charge for a non-text content block (an image, audio, a file reference):
#: its payload is not prompt text, and counting base64 bytes would wildly overstate it.
NON_TEXT_BLOCK_TOKENS = 85

_ASCII_CHARS_PER_TOKEN = 4


def approximate_tokens(text: str) -> int:
    """Estimate the tokens in ``text``: ASCII at ~4 characters per token, non-ASCII 1 each.

    Returns 0 for the empty string and at least 1 for any non-empty string.
    """
    if not text:
        return 0
    ascii_chars = len(text.encode("ascii", "ignore"))
    other_chars = len(text) - ascii_chars
    return max(1, math.ceil(ascii_chars / _ASCII_CHARS_PER_TOKEN) + other_chars)


def content_tokens(content: str | Sequence[Any], counter: TokenCounter = approximate_tokens) -> int:
    """Tokens of a message's content: a string, or a list of LangChain content blocks."""
    if isinstance(content, str):
        return counter(content)
    total = 0
    for block in content:
        if isinstance(block, str):
            total += counter(block)
        elif isinstance(block, Mapping):
            text = block.get("text")
            if block.get("type", "text") == "text" and isinstance(text, str):
                total += counter(text)
            else:
                total += NON_TEXT_BLOCK_TOKENS
        else:
            total += NON_TEXT_BLOCK_TOKENS
    return total


def _tool_call_tokens(message: AIMessage, counter: TokenCounter) -> int:
    total = 0
    for call in message.tool_calls:
        # sort_keys keeps the estimate independent of how the model ordered the arguments
        arguments = json.dumps(call.get("args", {}), sort_keys=True, default=str)
        total += counter(str(call.get("name", ""))) + counter(arguments)
    for invalid in message.invalid_tool_calls:
        total += counter(str(invalid.get("name") or "")) + counter(str(invalid.get("args") or ""))
    return total


def message_tokens(
    messages: Iterable[BaseMessage], counter: TokenCounter = approximate_tokens
) -> int:
    """Estimate the prompt tokens of ``messages``.

    Counts each message's content (string or content blocks), its ``name``, the
    names and JSON arguments of an assistant's tool calls, and a fixed
    :data:`MESSAGE_OVERHEAD_TOKENS` per message for the chat framing.
    """
    from langchain_core.messages import AIMessage

    total = 0
    for message in messages:
        total += MESSAGE_OVERHEAD_TOKENS + content_tokens(message.content, counter)
        if message.name:
            total += counter(message.name)
        if isinstance(message, AIMessage):
            total += _tool_call_tokens(message, counter)
    return total
