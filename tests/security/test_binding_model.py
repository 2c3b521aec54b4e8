"""A binding fixes the identity completely.

A field the binding names is forced; a field it does not name cannot be set
by the session at all (harbor.set_identity refuses it, raw settings are
ignored), so a role bound to a tenant or a project reaches no user's, session's
or run's rows. A role bound to a user picks among that user's own sessions and
runs. The table in docs/security.md states the same.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.conftest import PgDatabase
from tests.security.conftest import connect, on_cluster

Conn = psycopg.Connection[Any]

TENANT_BOUND = "harbor_test_bound_tenant"
PROJECT_BOUND = "harbor_test_bound_project"
USER_BOUND = "harbor_test_bound_user"

GLOBAL_AND_TENANT = {"mine: global fact", "mine: t1 tenant fact"}
# what each kind of binding reads, whatever the session sets
SEES = {
    TENANT_BOUND: GLOBAL_AND_TENANT,
    PROJECT_BOUND: GLOBAL_AND_TENANT | {"mine: p1 project fact"},
    USER_BOUND: GLOBAL_AND_TENANT | {"mine: u1 user fact"},
}
# and a role bound to a user, in its own session s1
OWN_SESSION = {"mine: u1 s1 session fact"}
# raw settings naming the attacker's favourite identity: every field
SPOOF = {
    "tenant_id": "t1",
    "project_id": "p1",
    "principal_id": "u1",
    "user_id": "u1",
    "session_id": "s1",
    "run_id": "r1",
}


def _contents(conn: Conn, table: str, column: str = "content") -> set[str]:
    return {r[0] for r in conn.execute(f"select {column} from harbor.{table}").fetchall()}


def _connect(db: PgDatabase, role: str, spoof: bool) -> Conn:
    conn = connect(db.url_for(role), autocommit=True)
    if spoof:
        for name, value in SPOOF.items():
            conn.execute("select set_config(%s, %s, false)", (f"harbor.{name}", value))
    return conn


@pytest.mark.parametrize(
    "kwargs",
    [
        {"principal_id": "u1"},
        {"user_id": "u1"},
        {"principal_id": "u1", "session_id": "s1"},
        {"session_id": "s1"},
        {"run_id": "r1"},
    ],
    ids=["principal", "user", "principal-and-session", "session", "run"],
)
@pytest.mark.parametrize("role", [TENANT_BOUND, PROJECT_BOUND])
def test_a_role_bound_to_no_user_cannot_take_on_a_user_or_a_session(
    seeded: PgDatabase, role: str, kwargs: dict[str, str]
) -> None:
    with _connect(seeded, role, spoof=False) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(
            "select harbor.set_identity('t1', principal_id => %(principal_id)s,"
            " user_id => %(user_id)s, session_id => %(session_id)s, run_id => %(run_id)s)",
            {"principal_id": None, "user_id": None, "session_id": None, "run_id": None, **kwargs},
        )


@pytest.mark.parametrize("role", [TENANT_BOUND, USER_BOUND])
def test_a_role_bound_to_no_project_cannot_take_on_a_project(seeded: PgDatabase, role: str) -> None:
    with _connect(seeded, role, spoof=False) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute("select harbor.set_identity('t1', project_id => 'p1')")


def test_a_role_bound_to_a_user_picks_its_own_session(seeded: PgDatabase) -> None:
    with _connect(seeded, USER_BOUND, spoof=False) as conn:
        conn.execute("select harbor.set_identity('t1', session_id => 's1', run_id => 'r1')")
        assert _contents(conn, "messages") == {"mine: hello"}
        assert _contents(conn, "memories") == SEES[USER_BOUND] | OWN_SESSION


@pytest.mark.parametrize("spoof", [False, True], ids=["no-settings", "spoofed-settings"])
@pytest.mark.parametrize("role", list(SEES))
def test_each_binding_reads_exactly_its_rows_whatever_the_session_sets(
    seeded: PgDatabase, role: str, spoof: bool
) -> None:
    # the spoofed session is a user-bound role's own to pick; on the cluster a
    # session-level set_config() does not reach the workers (Citus forwards SET LOCAL
    # only): there the session is not picked, and nothing more is seen (fail closed)
    picks = role == USER_BOUND and spoof and not on_cluster(seeded.superuser_url)
    with _connect(seeded, role, spoof) as conn:
        own_session = OWN_SESSION if picks else set()
        assert _contents(conn, "memories") == SEES[role] | own_session
        messages = _contents(conn, "messages")
        working = _contents(conn, "working_state", "state->>'tag'")
    if picks:
        # its own session s1 (the spoofed session is its own to pick), no project: no run rows
        assert (messages, working) == ({"mine: hello"}, set())
    else:
        assert (messages, working) == (set(), set())


@pytest.mark.parametrize("role", list(SEES))
def test_the_candidate_functions_follow_the_binding(seeded: PgDatabase, role: str) -> None:
    with _connect(seeded, role, spoof=True) as conn:
        expected = {r[0] for r in conn.execute("select id from harbor.memories").fetchall()}
        lexical = conn.execute(
            "select memory_id from harbor._lexical_candidates('fact', %s, now(), 100)",
            ("{global,tenant,project,user,session,run}",),
        ).fetchall()
        dense = conn.execute(
            "select memory_id from harbor._dense_candidates('[1,0,0]', 'm', %s, now(), 100)",
            ("{global,tenant,project,user,session,run}",),
        ).fetchall()
        # (both legs at once, for a small owner: on the cluster the legs run apart)
        both = conn.execute(
            "select memory_id, lexical_rank, dense_rank from harbor._lexical_candidates("
            " 'fact', %s, now(), 100, p_embedding => '[1,0,0]', p_model_id => 'm')"
            " where memory_id is not null",
            ("{global,tenant,project,user,session,run}",),
        ).fetchall()
    assert {r[0] for r in lexical} == expected
    assert {r[0] for r in dense} == expected
    assert {r[0] for r in both if r[1] is not None} == expected
    if not on_cluster(seeded.superuser_url):
        assert {r[0] for r in both if r[2] is not None} == expected


def test_a_project_bound_role_writes_project_rows_only(seeded: PgDatabase) -> None:
    with _connect(seeded, PROJECT_BOUND, spoof=True) as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
                " content_hash) values ('t1', 'user', 'u1', 'u1', 'forged', repeat('f', 64))"
            )
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                "insert into harbor.messages (tenant_id, user_id, session_id, principal_id, role,"
                " content) values ('t1', 'u1', 's1', 'u1', 'user', 'forged')"
            )
        with pytest.raises(errors.InsufficientPrivilege):
            # a project row signed as a user of the project
            conn.execute(
                "insert into harbor.memories (tenant_id, scope, project_id, principal_id,"
                " content, content_hash)"
                " values ('t1', 'project', 'p1', 'u1', 'signed', repeat('f', 64))"
            )
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, project_id, content, content_hash)"
            " values ('t1', 'project', 'p1', 'a project note', repeat('f', 64))"
        )
        assert (
            conn.execute("delete from harbor.memories where content = 'a project note'").rowcount
            == 1
        )
