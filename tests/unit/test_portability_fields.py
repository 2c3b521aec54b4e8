"""Every Memory field travels through an export and back, or is left out by name.

An export that dropped a new field silently would lose it on every backup and move.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from harbor_pg.portability import NOT_EXPORTED, _memory_line, _MemoryLine, _params
from harbor_pg.records import Memory

_LINE_ONLY = {"type", "vectors"}


def _row() -> dict[str, object]:
    """A row as export_memories reads it: one value for every exported column."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return {
        "id": "m1",
        "tenant_id": "t1",
        "scope": "user",
        "project_id": "",
        "principal_id": "dana",
        "user_id": "dana",
        "session_id": "",
        "run_id": "",
        "memory_type": "fact",
        "content": "Dana likes tea",
        "content_hash": "0" * 64,
        "context": None,
        "importance": 0.5,
        "entity_ids": [],
        "source": "unknown",
        "sensitivity": "none",
        "valid_from": now,
        "invalid_at": None,
        "superseded_by": None,
        "source_session_id": None,
        "source_message_ids": [],
        "metadata": {},
        "created_at": now,
        "updated_at": now,
    }


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
