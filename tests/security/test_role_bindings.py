"""A database role is bound in one tenant at most.

``harbor._binding()`` looks a role up by name alone, so a role bound in two
tenants would get whichever binding came first. ``role_bindings`` is keyed by
(tenant_id, role_name) for Citus, so ``harbor.bind_role`` refuses instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.conftest import PgDatabase
from tests.security.conftest import connect, grant_option, on_cluster

ROLE = "harbor_test_two_tenants"
OTHER = "harbor_test_other_role"
REFUSED = f"harbor.bind_role: role {ROLE} is already bound in another tenant"


@pytest.fixture
def roles(fresh_db: PgDatabase) -> Iterator[PgDatabase]:
    with connect(fresh_db.superuser_url, autocommit=True) as conn:
        for role in (ROLE, OTHER):
            conn.execute(f"drop role if exists {role}")
            conn.execute(f"create role {role} login")
            conn.execute(f"grant harbor_app to {role}" + grant_option(fresh_db))
            conn.execute(f'grant connect on database "{fresh_db.name}" to {role}')
    yield fresh_db
    with connect(fresh_db.superuser_url, autocommit=True) as conn:
        for role in (ROLE, OTHER):
            conn.execute(f"drop owned by {role}")
            conn.execute(f"drop role {role}")


def _admin(db: PgDatabase, tenant: str, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    conn = connect(db.admin_url, autocommit=autocommit)
    conn.execute("select harbor.set_identity(%s)", (tenant,))
    if not autocommit and not on_cluster(db.admin_url):
        conn.commit()  # (on the cluster the identity holds for this transaction only)
    return conn


def _bindings(db: PgDatabase) -> list[tuple[str, str, str | None]]:
    with connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select tenant_id, role_name::text, user_id from harbor.role_bindings order by 1, 2"
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def _bound_tenant(db: PgDatabase, role: str) -> str | None:
    with connect(db.url_for(role)) as conn:
        row = conn.execute("select harbor.caller_tenant()").fetchone()
    return None if row is None else row[0]


def test_admin_cannot_bind_a_role_bound_in_another_tenant(roles: PgDatabase) -> None:
    with _admin(roles, "t1") as conn:
        conn.execute("select harbor.bind_role(%s, 't1', user_id => 'u1')", (ROLE,))
    with _admin(roles, "t2") as conn:
        with pytest.raises(errors.UniqueViolation) as info:
            conn.execute("select harbor.bind_role(%s, 't2', user_id => 'u9')", (ROLE,))
        assert info.value.diag.message_primary == REFUSED
        assert "unbind it there first" in (info.value.diag.message_hint or "")
    assert _bindings(roles) == [("t1", ROLE, "u1")]
    assert _bound_tenant(roles, ROLE) == "t1"


def test_superuser_is_refused_too(roles: PgDatabase) -> None:
    with _admin(roles, "t1") as conn:
        conn.execute("select harbor.bind_role(%s, 't1')", (ROLE,))
    with (
        connect(roles.superuser_url, autocommit=True) as conn,
        pytest.raises(errors.UniqueViolation, match=REFUSED),
    ):
        conn.execute("select harbor.bind_role(%s, 't2')", (ROLE,))
    assert _bindings(roles) == [("t1", ROLE, None)]


def test_other_roles_and_rebinding_after_unbind_still_work(roles: PgDatabase) -> None:
    with _admin(roles, "t1") as conn:
        conn.execute("select harbor.bind_role(%s, 't1')", (ROLE,))
    with _admin(roles, "t2") as conn:
        # a different role binds in the other tenant without trouble
        conn.execute("select harbor.bind_role(%s, 't2')", (OTHER,))
        # t2's administrator cannot remove t1's binding ...
        assert conn.execute("select harbor.unbind_role(%s)", (ROLE,)).fetchone() == (0,)
    assert _bindings(roles) == [("t1", ROLE, None), ("t2", OTHER, None)]
    # ... t1's can, and then the role may be bound in t2
    with _admin(roles, "t1") as conn:
        assert conn.execute("select harbor.unbind_role(%s)", (ROLE,)).fetchone() == (1,)
    with _admin(roles, "t2") as conn:
        conn.execute("select harbor.bind_role(%s, 't2')", (ROLE,))
    assert _bindings(roles) == [("t2", OTHER, None), ("t2", ROLE, None)]
    assert _bound_tenant(roles, ROLE) == "t2"


def test_admin_cannot_delete_another_tenants_bindings(roles: PgDatabase) -> None:
    # reading every tenant's bindings (for the check) does not widen what it may change
    with _admin(roles, "t1") as conn:
        conn.execute("select harbor.bind_role(%s, 't1')", (ROLE,))
    with _admin(roles, "t2") as conn:
        assert conn.execute("delete from harbor.role_bindings").rowcount == 0
    assert _bindings(roles) == [("t1", ROLE, None)]


def test_admin_cannot_bind_in_another_tenant(roles: PgDatabase) -> None:
    # reading every tenant's bindings (for the check) does not widen what it may change
    with _admin(roles, "t1") as conn:
        conn.execute("select harbor.bind_role(%s, 't1')", (ROLE,))
    with _admin(roles, "t2") as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute("select harbor.bind_role(%s, 't1')", (OTHER,))
    assert _bindings(roles) == [("t1", ROLE, None)]


def test_concurrent_binds_in_two_tenants_take_turns(roles: PgDatabase) -> None:
    first = _admin(roles, "t1", autocommit=False)
    second = _admin(roles, "t2", autocommit=False)
    outcome: list[BaseException | None] = []

    def bind_in_t2() -> None:
        try:
            second.execute("select harbor.bind_role(%s, 't2')", (ROLE,))
            second.commit()
            outcome.append(None)
        except psycopg.Error as exc:
            second.rollback()
            outcome.append(exc)

    try:
        first.execute("select harbor.bind_role(%s, 't1')", (ROLE,))  # not committed yet
        worker = threading.Thread(target=bind_in_t2)
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive(), "the second bind must wait for the first"
        first.commit()
        worker.join(timeout=10)
        assert not worker.is_alive()
    finally:
        first.close()
        second.close()
    assert len(outcome) == 1 and isinstance(outcome[0], errors.UniqueViolation), outcome
    assert _bindings(roles) == [("t1", ROLE, None)]


def test_binding_the_same_role_again_in_its_tenant(roles: PgDatabase) -> None:
    """The same binding twice is a no-op; a different one in the same tenant is
    refused with a clear message (it would change what the role sees)."""
    with _admin(roles, "t1") as conn:
        conn.execute("select harbor.bind_role(%s, 't1', user_id => 'u1')", (ROLE,))
        conn.execute("select harbor.bind_role(%s, 't1', user_id => 'u1')", (ROLE,))
        with pytest.raises(errors.UniqueViolation) as info:
            conn.execute("select harbor.bind_role(%s, 't1', user_id => 'u2')", (ROLE,))
        assert info.value.diag.message_primary == (
            f"harbor.bind_role: role {ROLE} is already bound in tenant t1 with another identity"
        )
        assert "unbind_role" in (info.value.diag.message_hint or "")
    assert _bindings(roles) == [("t1", ROLE, "u1")]


def test_a_direct_insert_cannot_bind_a_role_in_a_second_tenant(roles: PgDatabase) -> None:
    """The one-tenant rule holds for writers that skip harbor.bind_role (a trigger)."""
    with _admin(roles, "t1") as conn:
        conn.execute("select harbor.bind_role(%s, 't1')", (ROLE,))
    with _admin(roles, "t2") as conn, pytest.raises(errors.UniqueViolation, match=REFUSED):
        conn.execute(
            "insert into harbor.role_bindings (tenant_id, role_name) values ('t2', %s)", (ROLE,)
        )
    with (
        connect(roles.superuser_url, autocommit=True) as conn,
        pytest.raises(errors.UniqueViolation, match=REFUSED),
    ):
        conn.execute(
            "insert into harbor.role_bindings (tenant_id, role_name) values ('t3', %s)", (ROLE,)
        )
    # a direct insert of a role bound nowhere is still the admin's to make
    with _admin(roles, "t2") as conn:
        conn.execute(
            "insert into harbor.role_bindings (tenant_id, role_name) values ('t2', %s)", (OTHER,)
        )
    assert _bindings(roles) == [("t1", ROLE, None), ("t2", OTHER, None)]
    assert _bound_tenant(roles, ROLE) == "t1"


def test_a_login_without_grants_cannot_hold_up_bind_role(roles: PgDatabase) -> None:
    """bind_role took an advisory lock on a key any login can compute and hold."""
    idle = "harbor_test_no_grants"
    with connect(roles.superuser_url, autocommit=True) as su:
        su.execute(f"drop role if exists {idle}")
        su.execute(f"create role {idle} login")
        su.execute(f'grant connect on database "{roles.name}" to {idle}')
    try:
        with connect(roles.url_for(idle), autocommit=True) as squatter:
            for key in (ROLE, OTHER):
                squatter.execute(
                    "select pg_advisory_lock(hashtextextended(%s, 0))", (f"harbor.bind_role:{key}",)
                )
            with _admin(roles, "t1") as conn:
                conn.execute("set lock_timeout = '3s'")
                conn.execute("select harbor.bind_role(%s, 't1')", (ROLE,))
                assert conn.execute("select harbor.unbind_role(%s)", (ROLE,)).fetchone() == (1,)
    finally:
        with connect(roles.superuser_url, autocommit=True) as su:
            su.execute(f"drop owned by {idle}")
            su.execute(f"drop role {idle}")


def test_on_citus_a_role_that_can_set_role_to_a_harbor_role_is_not_bound(
    roles: PgDatabase,
) -> None:
    """Citus opens its worker connections as the current user: a bound role that ran
    SET ROLE harbor_app would reach the workers as harbor_app, out of its binding, and
    the SET LOCAL identity it sends would hold there. So on a distributed database a
    role that can SET ROLE to another role with harbor-pg rights (a harbor-pg role, or
    a member of one), directly or through a group, is not bound (by bind_role, or by a
    direct insert); one server binds it (its binding wins after SET ROLE:
    test_isolation)."""
    direct, group, member = "harbor_test_sets_app", "harbor_test_app_group", "harbor_test_member"
    # and one that can SET ROLE to an unbound login holding harbor_app (without SET): on
    # the workers it would be that unbound login, whose session identity is trusted
    via_login, login = "harbor_test_via_login", "harbor_test_unbound_login"
    with connect(roles.superuser_url, autocommit=True) as su:
        for role in (direct, member, group, via_login, login):
            su.execute(f"drop role if exists {role}")
        su.execute(f"create role {login} login")
        su.execute(f"grant harbor_app to {login} with inherit true, set false")
        su.execute(f"create role {via_login} login")
        su.execute(f"grant harbor_app to {via_login} with inherit true, set false")
        su.execute(f"grant {login} to {via_login}")
        su.execute(f"create role {direct} login")
        su.execute(f"grant harbor_app to {direct}")  # (SET TRUE: PostgreSQL's default)
        su.execute(f"create role {group} nologin")
        su.execute(f"grant harbor_app to {group}")
        su.execute(f"create role {member} login")
        su.execute(f"grant harbor_app to {member} with inherit true, set false")
        su.execute(f"grant {group} to {member}")  # (SET ROLE harbor_app through the group)
    try:
        for role in (direct, member, via_login):
            if grant_option(roles):
                with (
                    _admin(roles, "t1") as conn,
                    pytest.raises(errors.InsufficientPrivilege, match="can SET ROLE"),
                ):
                    conn.execute("select harbor.bind_role(%s, 't1')", (role,))
                with (
                    connect(roles.superuser_url, autocommit=True) as su,
                    pytest.raises(errors.InsufficientPrivilege, match="can SET ROLE"),
                ):
                    su.execute(
                        "insert into harbor.role_bindings (tenant_id, role_name) values ('t1', %s)",
                        (role,),
                    )
                assert role not in {r for _t, r, _u in _bindings(roles)}
            else:
                with _admin(roles, "t1") as conn:
                    conn.execute("select harbor.bind_role(%s, 't1')", (role,))
                assert ("t1", role, None) in _bindings(roles)
        # granted without SET, and in no group that has it: bound on both
        with _admin(roles, "t1") as conn:
            conn.execute("select harbor.bind_role(%s, 't1')", (ROLE,))
        assert ("t1", ROLE, None) in _bindings(roles)
    finally:
        with connect(roles.superuser_url, autocommit=True) as su:
            su.execute("delete from harbor.role_bindings where role_name like 'harbor_test_%'")
            for role in (direct, member, group, via_login, login):
                su.execute(f"drop owned by {role}")
                su.execute(f"drop role {role}")
