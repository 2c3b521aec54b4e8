"""Rows of harbor.recall() become the same objects whichever way they are built."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.owner import MemoryScope
from harbor_pg.ranking import RecalledMemory
from harbor_pg.records import Memory, MemoryType
from harbor_pg.tiers.rows import (
    _MEMORY_FIELDS,
    _PLAIN_MEMORY,
    _stored_memory,
    recalled_from_row,
    recalled_rows,
)


def _row(**overrides: Any) -> dict[str, Any]:
    when = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    row: dict[str, Any] = {
        "rank": 1,
        "id": "m-1",
        "tenant_id": "t1",
        "scope": "user",
        "project_id": "",
        "principal_id": "u1",
        "user_id": "u1",
        "session_id": "",
        "run_id": "",
        "memory_type": "preference",
        "content": "Prefers window seats",
        "content_hash": "ab" * 32,
        "importance": 0.75,
        "entity_ids": ["person:u1"],
        "source": "extracted",
        "sensitivity": "none",
        "valid_from": when,
        "invalid_at": None,
        "superseded_by": None,
        "source_session_id": "s1",
        "source_message_ids": ["1", "2"],
        "metadata": {"k": [1, 2]},
        "context": None,
        "created_at": when,
        "updated_at": when,
        "expires_at": None,
        "dense_rank": 2,
        "similarity": 0.8,
        "lexical_rank": None,
        "lexical_score": None,
        "substring_match": False,
        "relevance": 0.03,
        "recency": 0.9,
        "entity": 0.0,
        "type_boost": 0.5,
        "score": 0.1,
        "tokens": 9,
    }
    row.update(overrides)
    return row


def _constructed(row: dict[str, Any]) -> Memory:
    """The reference: the row validated by pydantic, then built by model_construct."""
    validated = Memory.model_validate({k: row[k] for k in _MEMORY_FIELDS if k in row})
    return Memory.model_construct(**dict(validated))


def test_a_full_row_builds_what_model_construct_builds() -> None:
    assert _PLAIN_MEMORY, "Memory has a post-init hook or private attributes: the shortcut is off"
    row = _row()
    fast, reference = _stored_memory(row), _constructed(row)
    assert fast == reference
    assert fast.model_fields_set == reference.model_fields_set == set(Memory.model_fields)
    assert fast.model_dump() == reference.model_dump()
    assert list(fast.model_dump()) == list(Memory.model_fields)
    assert fast.scope is MemoryScope.USER and fast.memory_type is MemoryType.PREFERENCE
    # a real model: frozen, copyable, validatable again
    with pytest.raises(ValueError):
        fast.content = "changed"  # type: ignore[misc]
    assert fast.model_copy(update={"importance": 0.1}).importance == 0.1
    assert Memory.model_validate(fast.model_dump()) == fast
    # the row's lists are copies: changing the row later changes nothing
    row["entity_ids"].append("x")
    assert fast.entity_ids == ["person:u1"]


def test_a_row_missing_fields_takes_the_defaults() -> None:
    row = _row()
    del row["context"], row["metadata"]
    memory = _stored_memory(row)
    assert memory.context is None and memory.metadata == {}
    assert "context" not in memory.model_fields_set


def test_recalled_from_row_carries_the_signals() -> None:
    got = recalled_from_row(_row())
    assert got.memory.id == "m-1" and got.rank == 1 and got.tokens == 9
    assert got.dense_rank == 2 and got.lexical_rank is None and got.type_boost == 0.5


def test_recalled_from_row_builds_what_the_dataclass_builds() -> None:
    row = _row(lexical_rank=3, lexical_score=1.5)
    got = recalled_from_row(row)
    reference = RecalledMemory(
        memory=_constructed(row),
        rank=1,
        relevance=0.03,
        recency=0.9,
        entity=0.0,
        type_boost=0.5,
        score=0.1,
        tokens=9,
        dense_rank=2,
        similarity=0.8,
        lexical_rank=3,
        lexical_score=1.5,
        substring_match=False,
    )
    assert got == reference
    assert vars(got) == vars(reference)
    assert replace(got, rank=2).rank == 2
    with pytest.raises(FrozenInstanceError):
        got.rank = 5  # type: ignore[misc]


def test_unknown_enum_values_are_refused() -> None:
    with pytest.raises(ValueError):
        _stored_memory(_row(scope="galaxy"))
    with pytest.raises(ValueError):
        _stored_memory(_row(memory_type="rumour"))


class _Result:
    """The part of a libpq result the row factory reads: the column names."""

    def __init__(self, names: list[str]) -> None:
        self._names = [n.encode() for n in names]
        self.nfields = len(names)

    def fname(self, i: int) -> bytes:
        return self._names[i]


class _Cursor:
    def __init__(self, names: list[str]) -> None:
        self.pgresult = _Result(names)


def test_the_positional_row_factory_builds_what_the_dict_path_builds() -> None:
    row = _row(metadata={}, entity_ids=[], lexical_rank=4, lexical_score=2.0)
    # columns in another order than the dict's: positions come from the cursor
    names = sorted(row)
    make = recalled_rows(_Cursor(names))
    got = make(tuple(row[n] for n in names))
    assert got == recalled_from_row(row)
    assert vars(got.memory) == vars(recalled_from_row(row).memory)


def test_the_positional_row_factory_refuses_rows_without_a_field() -> None:
    names = [n for n in _row() if n != "score"]
    with pytest.raises(MemoryConfigurationError, match="score"):
        recalled_rows(_Cursor(names))


def test_the_positional_row_factory_keeps_each_shape_apart() -> None:
    # the positions are kept per shape of result: a second order of the same
    # columns is read by its own positions, not the first one's
    row = _row(metadata={}, entity_ids=[], lexical_rank=4, lexical_score=2.0)
    for names in (sorted(row), sorted(row, reverse=True), sorted(row)):
        got = recalled_rows(_Cursor(names))(tuple(row[n] for n in names))
        assert got == recalled_from_row(row)
