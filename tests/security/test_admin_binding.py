"""Administrators are not bound: binding one is refused, and a bound role has no admin rights.

harbor_admin is the operator's role across tenants: it takes any tenant's
identity with harbor.set_identity, and it writes GLOBAL memories, which every
tenant reads, so a binding could not confine it to a tenant. harbor.bind_role
(and any direct write of role_bindings) refuses members of harbor_admin,
harbor-pg's own roles, superusers and BYPASSRLS roles. A bound role that is
granted harbor_admin afterwards (a GRANT no trigger sees) gets none of the
admin policies' rights, cannot change bindings (its own included), and the
admin policies never write another tenant's rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.conftest import PgDatabase
from tests.security.conftest import (
    bind,
    connect,
    create_login_roles,
    drop_roles,
    grant_option,
    note_global,
    set_role_refused_on_cluster,
    write_memory,
)

Conn = psycopg.Connection[Any]

ADMIN_LOGIN = "harbor_test_tenant_admin"
LATE_ADMIN = "harbor_test_late_admin"


@pytest.fixture
def admin_db(fresh_db: PgDatabase) -> Iterator[dict[str, Any]]:
    """t2's memory with a vector, t2's expired working state, and two login roles:
    one granted harbor_admin, one bound to t1 and granted harbor_admin afterwards."""
    t2_memory = write_memory(
        fresh_db,
        ("t2", "user", "", "u9", "", "", "t2: u9 keeps the vault code"),
        "9" * 64,
        vector=("m", 3, "[1,0,0]"),
    )
    with connect(fresh_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t2', 'p1', 'u9', null, 's1', 'r1')")
        app.execute(
            "insert into harbor.working_state (tenant_id, project_id, user_id, session_id,"
            " run_id, principal_id, state, expires_at) values ('t2', 'p1', 'u9', 's1', 'r1',"
            " 'u9', '{\"tag\": \"t2-expired\"}', now() - interval '1 minute')"
        )
    create_login_roles(fresh_db, ADMIN_LOGIN, LATE_ADMIN)
    bind(fresh_db, LATE_ADMIN, "t1", None, None)
    with connect(fresh_db.superuser_url, autocommit=True) as su:
        # the operator's grants (no trigger sees a GRANT)
        su.execute(f"grant harbor_admin to {ADMIN_LOGIN}, {LATE_ADMIN}" + grant_option(fresh_db))
    yield {"db": fresh_db, "t2_memory": t2_memory}
    drop_roles(fresh_db, ADMIN_LOGIN, LATE_ADMIN)


def _admin(db: PgDatabase, tenant: str = "t1") -> Conn:
    conn = connect(db.admin_url, autocommit=True)
    conn.execute("select harbor.set_identity(%s)", (tenant,))
    return conn


@pytest.mark.parametrize(
    "role", [ADMIN_LOGIN, "harbor_admin", "harbor_app", "harbor_search", "harbor_owner"]
)
def test_binding_an_administrator_or_a_harbor_role_is_refused(
    admin_db: dict[str, Any], role: str
) -> None:
    db: PgDatabase = admin_db["db"]
    with _admin(db) as conn, pytest.raises(errors.InsufficientPrivilege, match="cannot be bound"):
        conn.execute("select harbor.bind_role(%s, 't1')", (role,))
    with (
        connect(db.superuser_url, autocommit=True) as su,
        pytest.raises(errors.InsufficientPrivilege, match="cannot be bound"),
    ):
        su.execute(
            "insert into harbor.role_bindings (tenant_id, role_name) values ('t1', %s)", (role,)
        )


def test_a_bound_role_granted_harbor_admin_reads_no_other_tenants_expired_state(
    admin_db: dict[str, Any],
) -> None:
    db: PgDatabase = admin_db["db"]
    # on Citus the operator grants harbor_admin without SET (docs/citus.md): the worker
    # connections of a SET ROLE harbor_admin would be the unbound administrator's
    if set_role_refused_on_cluster(db, LATE_ADMIN, "harbor_admin"):
        return
    with connect(db.url_for(LATE_ADMIN), autocommit=True) as conn:
        conn.execute("set role harbor_admin")
        assert conn.execute("select harbor.caller_tenant()").fetchone() == ("t1",)
        assert conn.execute("select count(*) from harbor.working_state").fetchone() == (0,)
        assert conn.execute("select count(*) from harbor.memories").fetchone() == (0,)


@pytest.mark.parametrize("set_role", [False, True], ids=["as-login", "set-role-harbor-admin"])
def test_a_bound_role_granted_harbor_admin_writes_nothing_as_admin(
    admin_db: dict[str, Any], set_role: bool
) -> None:
    db: PgDatabase = admin_db["db"]
    if set_role and set_role_refused_on_cluster(db, LATE_ADMIN, "harbor_admin"):
        return
    with connect(db.url_for(LATE_ADMIN), autocommit=True) as conn:
        if set_role:
            conn.execute("set role harbor_admin")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                "insert into harbor.memories (tenant_id, scope, content, content_hash)"
                " values ('', 'global', 'planted in every tenant', repeat('e', 64))"
            )
        with pytest.raises((errors.InsufficientPrivilege, errors.ForeignKeyViolation)):
            conn.execute(
                "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                " embedding, scope) values ('t2', %s, 'm', 3, '[0,1,0]', 'global')",
                (admin_db["t2_memory"],),
            )
        # and it cannot shed its binding
        with pytest.raises(errors.InsufficientPrivilege, match="bound role cannot change"):
            conn.execute("select harbor.unbind_role(%s)", (LATE_ADMIN,))
    with connect(db.url_for(LATE_ADMIN)) as conn:
        assert conn.execute("select harbor.caller_tenant()").fetchone() == ("t1",)


def test_an_admin_cannot_write_a_vector_into_another_tenant(admin_db: dict[str, Any]) -> None:
    """memory_embeddings_admin's WITH CHECK let any tenant_id through for scope 'global'."""
    with (
        _admin(admin_db["db"], "t1") as conn,
        pytest.raises((errors.InsufficientPrivilege, errors.ForeignKeyViolation)),
    ):
        conn.execute(
            "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
            " embedding, scope) values ('t2', %s, 'm', 3, '[0,1,0]', 'global')",
            (admin_db["t2_memory"],),
        )
    with connect(admin_db["db"].superuser_url) as su:
        assert su.execute("select count(*) from harbor.memory_embeddings").fetchone() == (1,)


def test_the_unbound_administrator_keeps_its_rights(admin_db: dict[str, Any]) -> None:
    """The same statements as the administrator's own login: GLOBAL writes, its tenant's
    rows, and the purge of every tenant's expired working state."""
    db: PgDatabase = admin_db["db"]
    with connect(db.url_for(ADMIN_LOGIN), autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t2')")
        assert conn.execute("select count(*) from harbor.memories").fetchone() == (1,)
        note_global(db, conn)
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, content, content_hash)"
            " values ('', 'global', 'a global note', repeat('e', 64))"
        )
        conn.execute("select harbor.set_identity('t1')")
        assert conn.execute("select harbor.purge_working_state()").fetchone() == (1,)
