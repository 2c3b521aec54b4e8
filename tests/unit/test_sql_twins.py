"""The SQL that stands in two places on purpose must not drift apart.

A statement under ``sql/queries`` stands alone (one round trip, no includes), so two
things are written more than once: the memory column list that ``memory_from_row``
reads, and the ``harbor.recall(...)`` call that ``snapshot`` repeats so that a snapshot
is one statement. These tests hold the copies to their original.
"""

from __future__ import annotations

import re

import pytest

from harbor_pg.db.sqlfiles import query

#: Statements that return memories with get_memory's column list, in its order.
SAME_COLUMNS = (
    "get_memories",
    "get_memory_citus",
    "search_memories",
    "context_load_summary",
    "extraction_current_memories",
    "memory_history",
)


def _columns(name: str) -> list[str]:
    """The memory select list (``select m.id, m.tenant_id, ...``) of the statement."""
    text = query(name)
    start = text.index("select m.id, m.tenant_id,") + len("select ")
    end = re.compile(r"\n\s*from\b").search(text, start)
    assert end is not None, name
    return [" ".join(part.split()) for part in text[start : end.start()].split(",")]


def _recall_call(name: str) -> str:
    text = query(name)
    start = text.index("from harbor.recall(")
    # the call's closing parenthesis and its alias, at a line's end or the text's
    end = re.compile(r"\) r(\n|$)").search(text, start).start()  # type: ignore[union-attr]
    return " ".join(text[start:end].split())


@pytest.mark.parametrize("name", SAME_COLUMNS)
def test_memory_column_lists_are_get_memorys(name: str) -> None:
    assert _columns(name) == _columns("get_memory")


def test_export_and_inspect_read_every_memory_column() -> None:
    wanted = set(_columns("get_memory"))
    assert set(_columns("export_memories")) == wanted
    assert wanted <= set(_columns("inspect_memory"))


def test_snapshot_recalls_as_recall_does() -> None:
    assert _recall_call("snapshot") == _recall_call("recall")


def _saved_columns(name: str) -> list[str]:
    """The select list after ``s.created`` in the final select of a save statement."""
    text = query(name)
    start = text.index("s.created,", text.index("\nselect ")) + len("s.created,")
    end = re.compile(r"\n\s*from\b").search(text, start)
    assert end is not None, name
    return [" ".join(part.split()) for part in text[start : end.start()].split(",")]


def test_one_memory_save_returns_what_a_batch_save_returns() -> None:
    assert _saved_columns("save_memory") == _saved_columns("save_memories")
    assert len(_saved_columns("save_memory")) == len(_columns("get_memory"))


def test_the_identity_of_a_generic_plan_save_is_set_identitys() -> None:
    """set_identity_and_plan_cache_mode: set_identity's settings, then plan_cache_mode."""
    both = " ".join(query("set_identity_and_plan_cache_mode").split())
    identity = " ".join(query("set_identity").split())
    body = identity[identity.index("select ") :]
    assert both[both.index("select ") :] == (
        body + ", pg_catalog.set_config('plan_cache_mode', %(mode)s::text, true)"
    )


def _recall_arguments(name: str) -> str:
    """The recall arguments of a statement, from the query on (a delegated call carries
    the caller's identity before them)."""
    text = query(name)
    start = text.index("%(query)s::text,")
    end = re.compile(r"\) r(\n|$)").search(text, start).start()  # type: ignore[union-attr]
    return " ".join(text[start:end].split())


def test_the_delegated_recall_passes_what_recall_takes() -> None:
    # (on a distributed database recall is harbor.recall_delegated's call, sql/citus/recall.sql)
    assert _recall_arguments("recall_delegated") == _recall_arguments("recall")
