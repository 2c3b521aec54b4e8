"""A vector belongs to its memory's owner, and the definer functions trust nothing else.

``harbor.memory_embeddings`` copies its memory's owner fields so that the dense
leg can find an owner's vectors without a join. The write policy can only
check the copies; the foreign key covers them, so a caller cannot store a
vector keyed to itself for someone else's memory (ids are not secret, see
test_memory_ids.py). And the candidate functions, which run with BYPASSRLS,
test the memory's own owner fields too, so even a vector that did get planted
could not make them report a memory the policies hide.

Every row here is written by the role a real caller has: the victim through
``harbor_app`` with its identity set, the attacker through ``harbor_app`` or
through a role bound to it.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.conftest import PgDatabase
from tests.security.conftest import connect, grant_option

Conn = psycopg.Connection[Any]

BOUND = "harbor_test_vector_planter"
DIMS = 384
SCOPES = "{global,tenant,project,user,session,run}"


def _vector(seed: int) -> str:
    rng = random.Random(seed)
    return "[" + ",".join(f"{rng.gauss(0, 1):.5f}" for _ in range(DIMS)) + "]"


VICTIM_VECTOR = _vector(1)


def _app(db: PgDatabase, tenant: str, user: str) -> Conn:
    conn = connect(db.app_url, autocommit=True)
    conn.execute("select harbor.set_identity(%s, principal_id => %s)", (tenant, user))
    return conn


def _write_memory(conn: Conn, user: str, content: str, vector: str) -> str:
    row = conn.execute(
        "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
        " content_hash) values ('t1', 'user', %s, %s, %s, encode(sha256(%s::bytea), 'hex'))"
        " returning id",
        (user, user, content, content),
    ).fetchone()
    assert row is not None
    conn.execute(
        "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,"
        " scope, user_id) values ('t1', %s, 'm384', %s, %s::vector, 'user', %s)",
        (row[0], DIMS, vector, user),
    )
    return str(row[0])


@pytest.fixture(scope="module")
def planted(module_db: PgDatabase) -> Iterator[dict[str, Any]]:
    """u2's memory (written by u2), u1's own memory, and a role bound to t1/u1."""
    with _app(module_db, "t1", "u2") as victim:
        victim_id = _write_memory(victim, "u2", "victim: u2 keeps the vault code", VICTIM_VECTOR)
    with _app(module_db, "t1", "u1") as owner:
        own_id = _write_memory(owner, "u1", "mine: u1 likes tea", _vector(2))
    with connect(module_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop role if exists {BOUND}")
        su.execute(f"create role {BOUND} login")
        su.execute(f"grant harbor_app to {BOUND}" + grant_option(module_db))
        su.execute(f'grant connect on database "{module_db.name}" to {BOUND}')
    with connect(module_db.admin_url, autocommit=True) as admin:
        admin.execute("select harbor.set_identity('t1')")
        admin.execute("select harbor.bind_role(%s, 't1', user_id => 'u1')", (BOUND,))
    yield {"db": module_db, "victim_id": victim_id, "own_id": own_id}
    with connect(module_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop owned by {BOUND}")
        su.execute(f"drop role {BOUND}")


@pytest.fixture(params=["app", "bound"])
def attacker(request: pytest.FixtureRequest, planted: dict[str, Any]) -> Iterator[Conn]:
    """u1 of t1: the application role with u1's identity, or the role bound to t1/u1."""
    db: PgDatabase = planted["db"]
    if request.param == "app":
        conn = _app(db, "t1", "u1")
    else:
        conn = connect(db.url_for(BOUND), autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def _plant(conn: Conn, memory_id: str) -> None:
    """A vector keyed to the attacker (t1/u1) for someone else's memory id."""
    conn.execute(
        "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,"
        " scope, user_id, with_context) values ('t1', %s, 'm384', %s, %s::vector, 'user', 'u1',"
        " true)",
        (memory_id, DIMS, VICTIM_VECTOR),
    )


def test_a_vector_keyed_to_the_caller_cannot_be_attached_to_another_users_memory(
    attacker: Conn, planted: dict[str, Any]
) -> None:
    with pytest.raises(errors.ForeignKeyViolation):
        _plant(attacker, planted["victim_id"])
    # the same insert for the caller's own memory is accepted: the key is the owner
    _plant(attacker, planted["own_id"])
    attacker.execute(
        "delete from harbor.memory_embeddings where memory_id = %s and with_context",
        (planted["own_id"],),
    )


@pytest.mark.parametrize("path", ["exact", "hnsw"])
def test_dense_candidates_report_no_memory_the_policies_hide_after_a_planting_attempt(
    attacker: Conn, planted: dict[str, Any], path: str
) -> None:
    # whatever the caller managed to write first ...
    with contextlib.suppress(psycopg.Error):
        _plant(attacker, planted["victim_id"])
    # ... the definer function returns only memories a plain SELECT shows it
    visible = {
        r[0]
        for r in attacker.execute(
            "select id from harbor.memories where memory_type <> 'summary'"
        ).fetchall()
    }
    assert planted["victim_id"] not in visible
    rows = attacker.execute(
        "select memory_id, content_hash from harbor._dense_candidates(%s::vector, 'm384', %s,"
        " now(), 50, %s)",
        (VICTIM_VECTOR, SCOPES, 5000 if path == "exact" else 0),
    ).fetchall()
    got = {r[0] for r in rows}
    assert planted["victim_id"] not in got
    assert got == visible and planted["own_id"] in got
