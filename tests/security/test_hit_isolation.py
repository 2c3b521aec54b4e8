"""Recall hits: a caller counts, reads and dates hits only of memories it may see.

Every memory is written by its owner's role (harbor_app as each user). The
attacker is the application role with u1's identity, writing to
``harbor.memory_hits`` with raw SQL: a hit of u2's memory (with u2's owner
columns, or with its own), a hit dated in the future, a hit moved to another
memory, and ``harbor.record_hits()`` over every id it can name. Only its own
memory's hits are counted; it reads no one else's. Run on one server and on the
Citus cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.conftest import PgDatabase
from tests.security.conftest import connect, insert_memory, refused_by, writer

#: (tenant, user, content)
ROWS = [("t1", "u1", "u1 fact"), ("t1", "u2", "u2 fact"), ("t2", "u1", "t2 u1 fact")]


@pytest.fixture
def memories(fresh_db: PgDatabase) -> Iterator[tuple[PgDatabase, dict[str, str]]]:
    ids = {}
    for i, (tenant, user, content) in enumerate(ROWS):
        with writer(fresh_db, tenant, "user", "", user, "", "") as conn:
            ids[content] = insert_memory(
                conn,
                {
                    "tenant_id": tenant,
                    "scope": "user",
                    "user_id": user,
                    "content": content,
                    "content_hash": f"{i + 1:064x}",
                },
            )
    yield fresh_db, ids


def _hits(db: PgDatabase) -> dict[str, int]:
    with psycopg.connect(db.superuser_url) as conn:
        rows: list[Any] = conn.execute(
            "select m.content, h.hits from harbor.memory_hits h"
            " join harbor.memories m on m.tenant_id = h.tenant_id and m.id = h.memory_id"
        ).fetchall()
    return dict(rows)


def _as_u1(db: PgDatabase) -> psycopg.Connection[Any]:
    conn = connect(db.app_url, autocommit=True)
    conn.execute("select harbor.set_identity('t1', principal_id => 'u1')")
    return conn


def test_record_hits_counts_only_memories_the_caller_sees(
    memories: tuple[PgDatabase, dict[str, str]],
) -> None:
    db, ids = memories
    with _as_u1(db) as conn:
        counted = conn.execute(
            "select harbor.record_hits(%s)", ([*ids.values(), "no-such-id"],)
        ).fetchone()
        assert counted == (1,)
        conn.execute("select harbor.record_hits(%s)", (list(ids.values()),))
    assert _hits(db) == {"u1 fact": 2}


def test_raw_writes_cannot_count_another_users_memory(
    memories: tuple[PgDatabase, dict[str, str]],
) -> None:
    db, ids = memories
    insert = (
        "insert into harbor.memory_hits (tenant_id, memory_id, scope, user_id, hits)"
        " values (%s, %s, 'user', %s, 5)"
    )
    with _as_u1(db) as conn:
        # u2's memory under u2's owner columns: not the caller's to see (the trigger,
        # which cannot find the memory, or the policy refuses it)
        with pytest.raises(
            (psycopg.errors.ForeignKeyViolation, psycopg.errors.InsufficientPrivilege)
        ):
            conn.execute(insert, ("t1", ids["u2 fact"], "u2"))
        # under the caller's own owner columns: not the memory's (the trigger)
        with pytest.raises(psycopg.errors.ForeignKeyViolation) as refused:
            conn.execute(insert, ("t1", ids["u2 fact"], "u1"))
        assert refused_by(refused.value) in ("memory_hits_owner", None)
        # another tenant's memory
        with pytest.raises(psycopg.Error):
            conn.execute(insert, ("t2", ids["t2 u1 fact"], "u1"))
        # its own memory, dated in the future (which would keep it from decaying)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "insert into harbor.memory_hits (tenant_id, memory_id, scope, user_id,"
                " last_recalled_at) values ('t1', %s, 'user', 'u1', now() + interval '1 year')",
                (ids["u1 fact"],),
            )
        conn.execute("select harbor.record_hits(%s)", ([ids["u1 fact"]],))
        # its own hit moved onto u2's memory, or re-keyed: refused
        for change in (
            "memory_id = %(u2)s",
            "user_id = 'u2'",
            "last_recalled_at = now() + interval '1 year'",
        ):
            with pytest.raises(psycopg.Error):
                conn.execute(
                    f"update harbor.memory_hits set {change} where memory_id = %(u1)s",
                    {"u1": ids["u1 fact"], "u2": ids["u2 fact"]},
                )
    assert _hits(db) == {"u1 fact": 1}


def test_a_caller_reads_only_the_hits_of_memories_it_sees(
    memories: tuple[PgDatabase, dict[str, str]],
) -> None:
    db, ids = memories
    for tenant, user, content in ROWS:
        with connect(db.app_url, autocommit=True) as conn:
            conn.execute("select harbor.set_identity(%s, principal_id => %s)", (tenant, user))
            conn.execute("select harbor.record_hits(%s)", ([ids[content]],))
    assert _hits(db) == {content: 1 for _t, _u, content in ROWS}
    with _as_u1(db) as conn:
        seen = conn.execute("select memory_id from harbor.memory_hits").fetchall()
        assert seen == [(ids["u1 fact"],)]
        # nor through the profile's hit lookup, whatever tenant and ids it names
        for tenant in ("t1", "t2"):
            got = conn.execute(
                "select memory_id, hits from harbor._memory_hits_of(%s, %s)",
                (tenant, list(ids.values())),
            ).fetchall()
            assert got == ([(ids["u1 fact"], 1)] if tenant == "t1" else [])
        # nor can it delete any (hits go with their memory)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("delete from harbor.memory_hits")
