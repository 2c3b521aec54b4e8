"""Every Memory field travels through an export and back, or is left out by name.

An export that dropped a new field silently would lose it on every backup and move.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from harbor_pg.portability import NOT_EXPORTED, _memory_line, _MemoryLine, _params
from harbor_pg.records import Memory

_LINE_ONLY = {"type", "vectors"}


# Its Memory(...) literal shares a shape with the owners of conformance.py and
# test_erasure.py on purpose: each test states its own data.
def _row() -> dict[str, object]:
    """A row as export_memories reads it: a value for every Memory field."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    memory = Memory(
        id="m1",
        tenant_id="t1",
        principal_id="dana",
        user_id="dana",
        content="Dana likes tea",
        content_hash="0" * 64,
        valid_from=now,
        created_at=now,
        updated_at=now,
    )
    return memory.model_dump()


def test_every_memory_field_is_exported_or_named() -> None:
    fields = set(Memory.model_fields)
    assert fields >= NOT_EXPORTED, "NOT_EXPORTED names a field Memory does not have"
    assert set(_MemoryLine.model_fields) - _LINE_ONLY == fields - NOT_EXPORTED


def test_an_export_line_writes_and_imports_every_exported_field() -> None:
    line = json.loads(_memory_line(_row(), None))
    exported = set(Memory.model_fields) - NOT_EXPORTED
    assert set(line) - _LINE_ONLY == exported
    record = _MemoryLine.model_validate(line)
    assert set(_params(record)) == exported
