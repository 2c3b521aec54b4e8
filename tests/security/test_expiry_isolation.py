"""Expiry closes only what the caller may close, and only at the expiry.

Every memory is written by its owner's role (harbor_app as each user, with an
expiry in the past and its interval still open: what a sweep finds). The
attacker is the application role with u1's identity: its sweep closes its own
expired memory and nobody else's; it may not set or move an expiry, nor close
another user's memory by hand. The elevated role closes its tenant's; with no
identity (the periodic upkeep) every tenant's, and then only a row already past
its expiry, only at its expiry. Run on one server and on the Citus cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.range import Range

from tests.conftest import PgDatabase
from tests.security.conftest import connect, insert_memory, writer

NOW = datetime.now(UTC)
#: (tenant, user, content, expired): each user's expired memory, and one of u2's that
#: expires next year
ROWS = [
    ("t1", "u1", "u1 badge is blue", True),
    ("t1", "u2", "u2 badge is green", True),
    ("t1", "u2", "u2 badge is red", False),
    ("t2", "u1", "t2 u1 badge is grey", True),
]


@pytest.fixture
def expiring(fresh_db: PgDatabase) -> Iterator[PgDatabase]:
    for i, (tenant, user, content, expired) in enumerate(ROWS):
        with writer(fresh_db, tenant, "user", "", user, "", "") as conn:
            insert_memory(
                conn,
                {
                    "tenant_id": tenant,
                    "scope": "user",
                    "user_id": user,
                    "content": content,
                    "content_hash": f"{i + 1:064x}",
                    "valid": Range(NOW - timedelta(days=2), None, "[)"),
                    "expires_at": NOW - timedelta(days=1) if expired else NOW + timedelta(days=365),
                },
            )
    yield fresh_db


def _state(db: PgDatabase) -> dict[str, tuple[bool, Any]]:
    """Each memory's content -> (interval open, end of the interval)."""
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select content, upper_inf(valid), upper(valid), expires_at from harbor.memories"
        ).fetchall()
    for content, is_open, end, expires_at in rows:
        assert is_open or end == expires_at, content  # closed only ever at its expiry
    return {content: (is_open, end) for content, is_open, end, _e in rows}


def _open(db: PgDatabase) -> set[str]:
    return {content for content, (is_open, _end) in _state(db).items() if is_open}


def test_the_application_role_closes_only_its_own_expired_memories(
    expiring: PgDatabase,
) -> None:
    with connect(expiring.app_url, autocommit=True) as conn:
        # no identity: the policies show nothing, so nothing is closed
        assert conn.execute("select harbor.expire_memories()").fetchone() == (0,)
        conn.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        assert conn.execute("select harbor.expire_memories()").fetchone() == (1,)
        assert conn.execute("select harbor.expire_memories()").fetchone() == (0,)
    assert _open(expiring) == {"u2 badge is green", "u2 badge is red", "t2 u1 badge is grey"}


def test_the_application_role_cannot_move_an_expiry_or_close_another_users_memory(
    expiring: PgDatabase,
) -> None:
    with connect(expiring.app_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1', principal_id => 'u1')")
        for target in ("u1 badge is blue", "u2 badge is red"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    "update harbor.memories set expires_at = now() - interval '1 hour'"
                    " where content = %s",
                    (target,),
                )
        # another user's rows are not the caller's to update, expired or not
        cur = conn.execute(
            "update harbor.memories set valid = tstzrange(lower(valid), now())"
            " where user_id = 'u2' or tenant_id = 't2'"
        )
        assert cur.rowcount == 0
    assert _open(expiring) == {row[2] for row in ROWS}


def test_the_elevated_role_closes_its_tenants_expired_memories(expiring: PgDatabase) -> None:
    with connect(expiring.admin_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1')")
        assert conn.execute("select harbor.expire_memories()").fetchone() == (2,)
    # t2's expired memory and u2's current one stay open
    assert _open(expiring) == {"u2 badge is red", "t2 u1 badge is grey"}


def test_the_upkeep_closes_every_tenants_expired_memories_at_their_expiry_only(
    expiring: PgDatabase,
) -> None:
    with connect(expiring.admin_url, autocommit=True) as conn:
        # with no identity the elevated role sees no tenant's current memories...
        assert conn.execute(
            "select count(*) from harbor.memories where content = 'u2 badge is red'"
        ).fetchone() == (0,)
        # ...and may close an expired one at its expiry only, and leave it unlinked
        for change in (
            "valid = tstzrange(lower(valid), now())",
            "superseded_by = id, valid = tstzrange(lower(valid), expires_at)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    f"update harbor.memories set {change} where content = 't2 u1 badge is grey'"
                )
        assert conn.execute("select harbor.expire_memories()").fetchone() == (3,)
        assert (
            conn.execute(
                "update harbor.memories set valid = tstzrange(lower(valid), now())"
                " where content = 'u2 badge is red'"
            ).rowcount
            == 0
        )
    assert _open(expiring) == {"u2 badge is red"}
