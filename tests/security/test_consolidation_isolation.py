"""Consolidation merges only the caller's own memories, whatever identity it claims.

Rows are written by their owners' role (harbor_app as each user); the attacker is a
login bound to u1 by the tenant's administrator, which is refused u2's identity and
then asks to consolidate every scope it may name. u2's near-duplicates stay current and unlinked;
u1's are merged. Run on one server and on the Citus cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.range import Range

from tests.conftest import PgDatabase
from tests.security.conftest import (
    bind,
    connect,
    create_login_roles,
    drop_roles,
    insert_memory,
    writer,
)

ROLE = "harbor_test_consolidation_bound"
DAY_AGO = datetime.now(UTC) - timedelta(days=1)
TEAS = ("Alice likes tea.", "alice likes TEA", "ALICE LIKES TEA!")


@pytest.fixture
def victims(fresh_db: PgDatabase) -> Iterator[PgDatabase]:
    for user in ("u1", "u2"):
        with writer(fresh_db, "t1", "user", "", user, "", "") as conn:
            for i, text in enumerate(TEAS):
                insert_memory(
                    conn,
                    {
                        "tenant_id": "t1",
                        "scope": "user",
                        "user_id": user,
                        "content": text,
                        "content_hash": f"{10 * (user == 'u2') + i:064x}",
                        "importance": 0.1 * (i + 1),
                        "valid": Range(DAY_AGO, None, "[)"),
                    },
                )
    create_login_roles(fresh_db, ROLE)
    bind(fresh_db, ROLE, "t1", None, "u1")
    yield fresh_db
    drop_roles(fresh_db, ROLE)


def _current(db: PgDatabase, user: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db.superuser_url) as conn:
        return conn.execute(
            "select content, superseded_by is null from harbor.memories"
            " where user_id = %s and upper_inf(valid) order by content",
            (user,),
        ).fetchall()


def test_a_bound_role_consolidates_only_its_own_user(victims: PgDatabase) -> None:
    before = _current(victims, "u2")
    with (
        connect(victims.url_for(ROLE), autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="bound"),
    ):
        conn.execute("select harbor.set_identity('t1', user_id => 'u2', principal_id => 'u2')")
    with connect(victims.url_for(ROLE), autocommit=True) as conn:
        # what it may set: the tenant alone (the binding supplies u1)
        conn.execute("select harbor.set_identity('t1')")
        merged = conn.execute(
            "select merged_ids from harbor.consolidate_memories("
            " scopes => '{user,project,session,run}')"
        ).fetchall()
    assert len(merged) == 1 and len(merged[0][0]) == 3
    assert _current(victims, "u2") == before  # untouched
    assert _current(victims, "u1") == [("ALICE LIKES TEA!", True)]
