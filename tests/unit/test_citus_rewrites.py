"""Every Citus statement rewrite still matches the function it is written for, in the
SQL file that defines it (no database: the rewrites apply to the catalog definition,
whose body is the file's text)."""

from __future__ import annotations

import re

import pytest

from harbor_pg.db.citus_rewrites import REWRITES, rewrite, rewritten_functions
from harbor_pg.db.sqlfiles import idempotent_files
from harbor_pg.errors import MemoryConfigurationError


def _definitions(name: str) -> list[tuple[str, str]]:
    """(file, text) of each ``create or replace function harbor.<name>(`` up to its end."""
    found = []
    for file, text in idempotent_files():
        for m in re.finditer(rf"create or replace function harbor\.{name}\(", text):
            found.append((file, text[m.start() : text.index("\n$$;", m.start())]))
    return found


@pytest.mark.parametrize("name", rewritten_functions())
def test_each_rewrite_matches_its_function(name: str) -> None:
    definitions = _definitions(name)
    assert len(definitions) == 1, f"harbor.{name} is defined in {[f for f, _ in definitions]}"
    file, text = definitions[0]
    for function, pattern, replacement in REWRITES:
        if function == name:
            # in order: a later pattern may match what an earlier one wrote
            assert pattern.search(text), f"{file}: harbor.{name} lacks {pattern.pattern!r}"
            text = pattern.sub(lambda m, r=replacement: m.expand(r), text)


def test_recall_is_split_in_two_statements() -> None:
    [(_file, text)] = _definitions("recall")
    rewritten = rewrite("recall", text)
    assert rewritten.count(" into v_candidates from (") == 1
    assert rewritten.count("select * from candidates) c;") == 1


def test_half_a_split_is_refused() -> None:
    [(_file, text)] = _definitions("recall")
    moved = text.replace("), linked as (", "), linked_rows as (")
    with pytest.raises(MemoryConfigurationError, match=r"ranking\.sql no longer has the shape"):
        rewrite("recall", moved)


def test_recall_ranks_without_a_distributed_table() -> None:
    # the ranking statement reads no distributed table (PostgreSQL alone plans it);
    # the fallback's contexts, the hits and the hydration are statements of their own
    [(_file, text)] = _definitions("recall")
    rewritten = rewrite("recall", text)
    assert rewritten.count(" into v_ranked, v_ids from (") == 1
    start = rewritten.index(" into v_ranked, v_ids from (")
    ranking = rewritten[start : rewritten.index("from ranked r) r;", start)]
    assert "harbor.memories" not in ranking
    assert "harbor.memory_hits" not in ranking
    assert "harbor._decayed_importance" not in ranking
    assert "harbor.memories" in rewritten[start + len(ranking) :]


def test_half_the_hydration_split_is_refused() -> None:
    [(_file, text)] = _definitions("recall")
    moved = text.replace("), hydrated as (", "), read_back as (")
    with pytest.raises(MemoryConfigurationError, match=r"ranking\.sql no longer has the shape"):
        rewrite("recall", moved)
