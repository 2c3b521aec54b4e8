"""Fixtures for raw-SQL break-out attempts.

Rows are seeded as the superuser (who bypasses RLS). Each attack then runs
connected as the application role with an identity set, or as a database
role bound to an identity by an administrator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.conftest import PgDatabase

H = "0" * 63

# (tenant, scope, project, user, session, run, content)
MEMORIES = [
    ("t1", "user", "", "u1", "", "", "mine: u1 user fact"),
    ("t1", "session", "", "u1", "s1", "", "mine: u1 s1 session fact"),
    ("t1", "run", "p1", "u1", "s1", "r1", "mine: u1 s1 r1 run fact"),
    ("t1", "project", "p1", "", "", "", "mine: p1 project fact"),
    ("t1", "tenant", "", "", "", "", "mine: t1 tenant fact"),
    ("", "global", "", "", "", "", "mine: global fact"),
    ("t2", "tenant", "", "", "", "", "secret: t2 tenant fact"),
    ("t2", "user", "", "u1", "", "", "secret: t2 user u1 fact"),
    ("t1", "project", "p2", "", "", "", "secret: p2 project fact"),
    ("t1", "user", "", "u2", "", "", "secret: u2 user fact"),
    ("t1", "session", "", "u1", "s2", "", "secret: u1 s2 session fact"),
    ("t1", "session", "", "u2", "s1", "", "secret: u2 s1 session fact"),
    ("t1", "run", "p1", "u1", "s1", "r2", "secret: u1 s1 r2 run fact"),
]
MESSAGES = [
    ("t1", "u1", "s1", "mine: hello"),
    ("t1", "u1", "s2", "secret: other session"),
    ("t1", "u2", "s1", "secret: other user"),
    ("t2", "u1", "s1", "secret: other tenant"),
]
WORKING = [
    ("t1", "p1", "u1", "s1", "r1", "mine"),
    ("t1", "p1", "u1", "s1", "r2", "secret-run"),
    ("t1", "p1", "u1", "s2", "r1", "secret-session"),
    ("t1", "p1", "u2", "s1", "r1", "secret-user"),
    ("t2", "p1", "u1", "s1", "r1", "secret-tenant"),
]

IDENTITY = dict(tenant_id="t1", project_id="p1", principal_id="u1", session_id="s1", run_id="r1")
BOUND_ROLE = "harbor_test_analyst"


def seed(db: PgDatabase) -> None:
    with psycopg.connect(db.superuser_url, autocommit=True) as conn:
        for i, (t, scope, p, u, s, r, content) in enumerate(MEMORIES):
            conn.execute(
                "insert into harbor.memories (tenant_id, scope, project_id, user_id, session_id,"
                " run_id, content, content_hash) values (%s,%s,%s,%s,%s,%s,%s,%s)",
                (t, scope, p, u, s, r, content, f"{i:064x}"),
            )
        for t, u, s, content in MESSAGES:
            conn.execute(
                "insert into harbor.messages (tenant_id, user_id, session_id, role, content)"
                " values (%s,%s,%s,'user',%s)",
                (t, u, s, content),
            )
        for t, p, u, s, r, tag in WORKING:
            conn.execute(
                "insert into harbor.working_state (tenant_id, project_id, user_id, session_id,"
                " run_id, state) values (%s,%s,%s,%s,%s, jsonb_build_object('tag', %s::text))",
                (t, p, u, s, r, tag),
            )
        conn.execute(
            "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,"
            " scope, project_id, user_id, session_id, run_id)"
            " select tenant_id, id, 'm', 3, '[1,0,0]', scope, project_id, user_id, session_id,"
            " run_id from harbor.memories"
        )
        conn.execute(f"drop role if exists {BOUND_ROLE}")
        conn.execute(f"create role {BOUND_ROLE} login")
        conn.execute(f"grant harbor_app to {BOUND_ROLE}")
        conn.execute(f'grant connect on database "{db.name}" to {BOUND_ROLE}')
    with psycopg.connect(db.admin_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1')")
        conn.execute("select harbor.bind_role(%s, 't1', user_id => 'u1')", (BOUND_ROLE,))


@pytest.fixture(scope="module")
def seeded(module_db: PgDatabase) -> Iterator[PgDatabase]:
    seed(module_db)
    yield module_db
    with psycopg.connect(module_db.superuser_url, autocommit=True) as conn:
        conn.execute(f"drop owned by {BOUND_ROLE}")


@pytest.fixture(params=["app", "bound"])
def attacker(
    request: pytest.FixtureRequest, seeded: PgDatabase
) -> Iterator[psycopg.Connection[Any]]:
    """A raw connection as the app role (identity t1/p1/u1/s1/r1) or as the bound role."""
    user = "harbor_app" if request.param == "app" else BOUND_ROLE
    conn = psycopg.connect(seeded.url_for(user), autocommit=True)
    if request.param == "app":
        conn.execute(
            "select harbor.set_identity(%(tenant_id)s, %(project_id)s, %(principal_id)s,"
            " null, %(session_id)s, %(run_id)s)",
            IDENTITY,
        )
    else:
        # a bound role names only what its binding leaves open
        conn.execute("select harbor.set_identity('t1', 'p1', null, null, 's1', 'r1')")
    try:
        yield conn
    finally:
        conn.close()
