"""The security suite's rows are written by the roles real callers have.

A fixture that seeded rows as the superuser could store what no caller can
write (the suite once stored every vector that way, with owner fields that
matched their memories, and so could not see that a caller could store one
that did not). Here the seeding runs with every superuser connection limited
to the operator's part: creating login roles and granting them.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from tests.conftest import PgDatabase
from tests.security import conftest as fixtures

OPERATOR_STATEMENTS = re.compile(r"\s*(create role|drop role|drop owned|grant )", re.IGNORECASE)


class _OperatorOnly:
    """A superuser connection that refuses anything but role management."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, query: Any, params: Any = None) -> Any:
        text = query if isinstance(query, str) else query.as_string(self._conn)
        if not OPERATOR_STATEMENTS.match(text):
            raise AssertionError(f"a fixture wrote as the superuser: {text}")
        return self._conn.execute(query, params)

    def __enter__(self) -> _OperatorOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()


def test_security_fixtures_write_rows_only_through_callers_roles(
    fresh_db: PgDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    connect = psycopg.connect

    def guarded(conninfo: str = "", **kwargs: Any) -> Any:
        conn = connect(conninfo, **kwargs)
        return _OperatorOnly(conn) if conninfo == fresh_db.superuser_url else conn

    monkeypatch.setattr(psycopg, "connect", guarded)
    try:
        fixtures.seed(fresh_db)
    finally:
        monkeypatch.undo()
        fixtures.drop_roles(fresh_db, *fixtures.BOUND_ROLES)
    # and the rows are all there, each kind written by its own caller
    with psycopg.connect(fresh_db.superuser_url) as su:
        counts = su.execute(
            "select (select count(*) from harbor.memories),"
            " (select count(*) from harbor.memory_embeddings),"
            " (select count(*) from harbor.messages), (select count(*) from harbor.working_state)"
        ).fetchone()
    assert counts == (
        len(fixtures.MEMORIES),
        len(fixtures.MEMORIES),
        len(fixtures.MESSAGES),
        len(fixtures.WORKING),
    )
