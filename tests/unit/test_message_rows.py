"""Stored turns become the same messages whichever way they are built."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import _MESSAGE_FIELDS, _PLAIN_MESSAGE, message_from_row


def _row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": 41,
        "role": "assistant",
        "content": "Booked the 9:40 train",
        "name": "planner",
        "tool_calls": [{"id": "c1", "function": {"name": "book", "arguments": "{}"}}],
        "tool_call_id": "c0",
        "metadata": {"channel": "chat", "n": [1, 2]},
        "created_at": datetime(2026, 12, 6, 9, 30, tzinfo=UTC),
    }
    row.update(overrides)
    return row


def _constructed(row: dict[str, Any]) -> ConversationMessage:
    # what message_from_row built before: pydantic's model_construct of the same values
    return ConversationMessage.model_construct(
        id=row["id"],
        role=row["role"],
        content=row["content"],
        name=row["name"],
        tool_calls=row["tool_calls"] or [],
        tool_call_id=row["tool_call_id"],
        metadata=row["metadata"] or {},
        created_at=(
            datetime.fromisoformat(row["created_at"])
            if isinstance(row["created_at"], str)
            else row["created_at"]
        ),
    )


ROWS = [
    _row(),
    _row(name=None, tool_calls=None, tool_call_id=None, metadata=None, role="user"),
    _row(tool_calls=[], metadata={}),
    _row(created_at="2026-12-06T09:30:00+00:00"),  # a snapshot's row, through JSON
    _row(id=None, created_at=None),
]


def test_the_direct_path_is_taken() -> None:
    assert _PLAIN_MESSAGE
    assert tuple(ConversationMessage.model_fields) == _MESSAGE_FIELDS


@pytest.mark.parametrize("row", ROWS)
def test_a_row_gives_what_model_construct_gives(row: dict[str, Any]) -> None:
    built, expected = message_from_row(row), _constructed(row)
    assert type(built) is ConversationMessage
    assert built == expected
    # every field, its value's type, and the order pydantic keeps them in
    assert list(built.__dict__.items()) == list(expected.__dict__.items())
    for name in _MESSAGE_FIELDS:
        assert type(getattr(built, name)) is type(getattr(expected, name)), name
    assert built.model_fields_set == expected.model_fields_set
    assert built.__pydantic_extra__ == expected.__pydantic_extra__
    assert built.__pydantic_private__ == expected.__pydantic_private__
    assert repr(built) == repr(expected)
    assert built.model_dump() == expected.model_dump()
    assert built.model_dump(exclude_unset=True) == expected.model_dump(exclude_unset=True)
    assert built.model_dump_json() == expected.model_dump_json()


def test_the_message_is_frozen_and_its_containers_are_its_own() -> None:
    row = _row(tool_calls=None, metadata=None)
    first, second = message_from_row(row), message_from_row(row)
    with pytest.raises(ValidationError):
        first.content = "changed"  # type: ignore[misc]
    first.metadata["k"] = 1
    first.tool_calls.append({"id": "x"})
    assert second.metadata == {} and second.tool_calls == []


def test_a_copy_with_an_update_is_a_message_too() -> None:
    built = message_from_row(_row())
    copied = built.model_copy(update={"content": "Moved to 10:10"})
    assert copied.content == "Moved to 10:10" and copied.id == 41
    assert ConversationMessage.model_validate(built.model_dump()) == built
