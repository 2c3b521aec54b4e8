"""Memory ids are not secret, so nothing may build on knowing one.

Text comparisons are leakproof, so the planner applies a condition on id
before the row-level security filter, and EXPLAIN ANALYZE reports the rows
the policy removed: a binary search over ids recovers every id of the
tenant. The product's answer (docs/security.md, threat model) is that ids, and whether
an id exists, are not secret; what is secret is everything else about a row.
So knowing another user's id must give a caller nothing: no vector attached
to that memory, no successor link to it, no candidate row.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import errors

from tests.conftest import PgDatabase
from tests.security.conftest import show_every_shard, write_memory, writer

VICTIM = ("t1", "user", "", "u2", "", "", "victim: u2 keeps the vault code")
MINE = ("t1", "user", "", "u1", "", "", "mine: u1 likes tea")


def _ids(db: PgDatabase) -> tuple[str, str]:
    victim = write_memory(db, VICTIM, "a" * 64, vector=("m", 3, "[1,0,0]"))
    mine = write_memory(db, MINE, "b" * 64, vector=("m", 3, "[0,1,0]"))
    return victim, mine


def test_an_id_found_by_enumeration_cannot_be_linked_as_a_successor(
    fresh_db: PgDatabase,
) -> None:
    victim, mine = _ids(fresh_db)
    with writer(fresh_db, *MINE[:6]) as conn:
        # the enumeration works: ids are not secret
        show_every_shard(conn)
        plan = conn.execute(
            "explain (analyze, costs off, timing off, summary off)"
            " select 1 from harbor.memories where (tenant_id, id) >= ('t1', %s)"
            " and (tenant_id, id) <= ('t1', %s)",
            (victim, victim),
        ).fetchall()
        assert any("Rows Removed by Filter: 1" in r[0] for r in plan), plan
        with pytest.raises(errors.ForeignKeyViolation):
            conn.execute(
                "update harbor.memories set superseded_by = %s where id = %s", (victim, mine)
            )
        with pytest.raises(errors.ForeignKeyViolation):
            conn.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
                " content_hash, superseded_by, valid)"
                " values ('t1', 'user', 'u1', 'u1', 'linked', repeat('c', 64), %s,"
                " tstzrange(now() - interval '1 day', now()))",
                (victim,),
            )
        # a successor of its own is fine
        own = conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values ('t1', 'user', 'u1', 'u1', 'newer', repeat('d', 64))"
            " returning id"
        ).fetchone()
        assert own is not None
        conn.execute(
            "update harbor.memories set superseded_by = %s,"
            " valid = tstzrange(lower(valid), now()) where id = %s",
            (own[0], mine),
        )


def test_an_id_found_by_enumeration_gets_no_vector_and_no_candidate(
    fresh_db: PgDatabase,
) -> None:
    victim, mine = _ids(fresh_db)
    with writer(fresh_db, *MINE[:6]) as conn:
        with pytest.raises(errors.ForeignKeyViolation):
            conn.execute(
                "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                " embedding, scope, user_id, with_context)"
                " values ('t1', %s, 'm', 3, '[1,0,0]', 'user', 'u1', true)",
                (victim,),
            )
        rows: list[Any] = conn.execute(
            "select memory_id from harbor._dense_candidates('[1,0,0]', 'm', '{user}', now(), 10)"
        ).fetchall()
    assert [r[0] for r in rows] == [mine]
