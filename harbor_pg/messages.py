"""Converters between stored :class:`ConversationMessage` rows and LangChain messages.

``to_langchain`` and ``from_langchain`` round-trip exactly: role, content, name,
tool calls, tool-call id, metadata, row id and timestamp all survive. Whatever a
LangChain message class cannot carry natively (metadata, the timestamp, a tool
call shape LangChain would normalise) travels in
``additional_kwargs["harbor"]``, a key provider adapters ignore.

Going the other way, a foreign LangChain message loses what a
``ConversationMessage`` has no field for: non-text content blocks (only the text
is kept), ``ToolMessage.status`` and ``artifact``, and response metadata.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.messages.tool import invalid_tool_call, tool_call

from harbor_pg.errors import MemoryValidationError
from harbor_pg.records import ConversationMessage, MessageRole

__all__ = [
    "HARBOR_KWARGS_KEY",
    "from_langchain",
    "is_user_message",
    "message_text",
    "to_langchain",
]

#: ``additional_kwargs`` key holding the fields LangChain has no slot for.
HARBOR_KWARGS_KEY = "harbor"

_CHAT_ROLES: dict[str, MessageRole] = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
_DIGITS = re.compile(r"[0-9]+")


# llm/langchain.py's _message_text is near this on purpose: llm/ sits below messages.py in
# the layering, and a chat answer's blocks need a type to count as text, a stored message's not.
def message_text(content: str | Sequence[Any]) -> str:
    """The text of a message's content: the string itself, or its text blocks joined."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping) and block.get("type", "text") == "text":
            text = block.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def is_user_message(message: BaseMessage) -> bool:
    """True for a human (user) turn, whatever LangChain class carries it."""
    if isinstance(message, HumanMessage):
        return True
    return isinstance(message, ChatMessage) and _CHAT_ROLES.get(message.role.lower()) == "user"


def _split_tool_calls(
    raw_calls: Sequence[Mapping[str, Any]],
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """Stored tool calls (LangChain or OpenAI shape) as LangChain valid/invalid calls."""
    valid: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for raw in raw_calls:
        function = raw.get("function")
        if isinstance(function, Mapping):  # OpenAI wire shape
            name = function.get("name")
            args: Any = function.get("arguments")
        else:
            name = raw.get("name")
            args = raw.get("args")
        call_id = raw.get("id")
        call_id = call_id if isinstance(call_id, str) else None
        name = name if isinstance(name, str) else None
        error = raw.get("error")
        if raw.get("type") == "invalid_tool_call":
            invalid.append(
                invalid_tool_call(
                    name=name,
                    args=args if isinstance(args, str) else None,
                    id=call_id,
                    error=error if isinstance(error, str) else None,
                )
            )
            continue
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                invalid.append(invalid_tool_call(name=name, args=args, id=call_id, error=None))
                continue
        if args is None:
            args = {}
        if not isinstance(args, dict) or name is None:
            invalid.append(
                invalid_tool_call(
                    name=name, args=json.dumps(args, default=str), id=call_id, error=None
                )
            )
            continue
        valid.append(tool_call(name=name, args=args, id=call_id))
    return valid, invalid


def _tool_calls_of(message: AIMessage) -> list[dict[str, Any]]:
    return [dict(call) for call in message.tool_calls] + [
        dict(call) for call in message.invalid_tool_calls
    ]


def to_langchain(message: ConversationMessage) -> BaseMessage:
    """Convert a stored message to the LangChain message class for its role."""
    extras: dict[str, Any] = {}
    if message.metadata:
        extras["metadata"] = copy.deepcopy(message.metadata)
    if message.created_at is not None:
        extras["created_at"] = message.created_at.isoformat()
    common: dict[str, Any] = {
        "content": message.content,
        "name": message.name,
        "id": None if message.id is None else str(message.id),
    }
    result: BaseMessage
    if message.role == "assistant":
        valid, invalid = _split_tool_calls(message.tool_calls)
        result = AIMessage(**common, tool_calls=valid, invalid_tool_calls=invalid)
        if _tool_calls_of(result) != message.tool_calls:
            # LangChain reshaped the calls (OpenAI shape, missing "type"): keep the original.
            extras["tool_calls"] = copy.deepcopy(message.tool_calls)
    else:
        if message.tool_calls:
            extras["tool_calls"] = copy.deepcopy(message.tool_calls)
        if message.role == "tool":
            # A real tool_call_id is never empty, so "" safely encodes "none recorded".
            result = ToolMessage(**common, tool_call_id=message.tool_call_id or "")
        elif message.role == "user":
            result = HumanMessage(**common)
        else:
            result = SystemMessage(**common)
    if message.role != "tool" and message.tool_call_id is not None:
        extras["tool_call_id"] = message.tool_call_id
    if extras:
        result.additional_kwargs[HARBOR_KWARGS_KEY] = extras
    return result


def _role_of(message: BaseMessage) -> MessageRole:
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, ToolMessage | FunctionMessage):
        return "tool"
    if isinstance(message, ChatMessage):
        role = _CHAT_ROLES.get(message.role.lower())
        if role is not None:
            return role
        raise MemoryValidationError(f"unsupported chat message role {message.role!r}")
    raise MemoryValidationError(f"unsupported message type {type(message).__name__}")


def from_langchain(message: BaseMessage) -> ConversationMessage:
    """Convert a LangChain message to a :class:`ConversationMessage`.

    Raises :class:`MemoryValidationError` for a message type or chat role that
    has no system/user/assistant/tool equivalent.
    """
    role = _role_of(message)
    stashed = message.additional_kwargs.get(HARBOR_KWARGS_KEY)
    extras: Mapping[str, Any] = stashed if isinstance(stashed, Mapping) else {}

    tool_calls: list[dict[str, Any]] = []
    if isinstance(message, AIMessage):
        tool_calls = _tool_calls_of(message)
    original = extras.get("tool_calls")
    if isinstance(original, list) and all(isinstance(c, Mapping) for c in original):
        if isinstance(message, AIMessage):
            # Restore the stored shape only if the calls were not edited since conversion.
            valid, invalid = _split_tool_calls(original)
            probe = AIMessage(content="", tool_calls=valid, invalid_tool_calls=invalid)
            if _tool_calls_of(probe) == tool_calls:
                tool_calls = copy.deepcopy([dict(c) for c in original])
        else:
            tool_calls = copy.deepcopy([dict(c) for c in original])

    tool_call_id: str | None
    if isinstance(message, ToolMessage):
        tool_call_id = message.tool_call_id or None
    else:
        raw_id = extras.get("tool_call_id")
        tool_call_id = raw_id if isinstance(raw_id, str) else None

    created_at = None
    raw_created = extras.get("created_at")
    if isinstance(raw_created, str):
        try:
            created_at = datetime.fromisoformat(raw_created)
        except ValueError:
            created_at = None
    elif isinstance(raw_created, datetime):
        created_at = raw_created

    metadata = extras.get("metadata")
    row_id = int(message.id) if message.id and _DIGITS.fullmatch(message.id) else None
    try:
        return ConversationMessage(
            role=role,
            content=message_text(message.content),
            name=message.name,
            tool_calls=tool_calls,
            tool_call_id=tool_call_id,
            metadata=copy.deepcopy(dict(metadata)) if isinstance(metadata, Mapping) else {},
            id=row_id,
            created_at=created_at,
        )
    except ValueError as exc:
        raise MemoryValidationError(f"cannot convert {type(message).__name__}: {exc}") from None
