"""Raw-SQL attempts to break tenant/project/user/session/run isolation.

Every attempt runs twice: as the application role with an identity set, and
as a database role an administrator bound to an identity. Each must fail or
return nothing.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.conftest import PgDatabase
from tests.security.conftest import (
    BOUND_ROLE,
    connect,
    set_role_refused_on_cluster,
    write_memory,
)

Conn = psycopg.Connection[Any]


def contents(conn: Conn, sql: str, params: Any = None) -> list[str]:
    return [r[0] for r in conn.execute(sql, params).fetchall()]


def test_sees_exactly_its_own_memories(attacker: Conn) -> None:
    rows = contents(attacker, "select content from harbor.memories order by content")
    assert rows == sorted(c for c in rows if c.startswith("mine:"))
    assert len(rows) == 6, rows


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("tenant_id", "t2"),
        ("project_id", "p2"),
        ("user_id", "u2"),
        ("session_id", "s2"),
        ("run_id", "r2"),
    ],
    ids=["tenant", "project", "user", "session", "run"],
)
def test_cannot_read_others_memories(attacker: Conn, column: str, value: str) -> None:
    rows = contents(attacker, f"select content from harbor.memories where {column} = %s", (value,))
    assert rows == []


TABLES = ["memories", "memory_embeddings", "messages", "working_state"]


@pytest.mark.parametrize("table", TABLES)
def test_always_true_filter_cannot_widen(attacker: Conn, table: str) -> None:
    # an OR that is always true: the policy still applies, nothing beyond it comes back
    n_all = attacker.execute(f"select count(*) from harbor.{table} where true or false").fetchone()
    assert n_all is not None
    assert n_all == attacker.execute(f"select count(*) from harbor.{table}").fetchone()


@pytest.mark.parametrize("table", TABLES)
def test_subquery_filter_cannot_widen(attacker: Conn, table: str) -> None:
    # a subquery naming another tenant: the policy still applies
    n_sub = attacker.execute(
        f"select count(*) from harbor.{table} where tenant_id in (select 't2')"
    ).fetchone()
    assert n_sub == (0,)


def test_cannot_read_other_sessions_messages(attacker: Conn) -> None:
    assert contents(attacker, "select content from harbor.messages") == ["mine: hello"]


@pytest.mark.parametrize(
    ("tenant", "user", "session"),
    [("t1", "u1", "s2"), ("t1", "u2", "s1"), ("t2", "u1", "s1")],
    ids=["session", "user", "tenant"],
)
def test_cannot_count_other_sessions_turns(
    attacker: Conn, tenant: str, user: str, session: str
) -> None:
    # the summary rule's turn count (a definer on one server) answers for the caller's
    # own session as its policies do, and 0 for a session holding another's turns
    own = attacker.execute("select harbor._session_turns('t1', 'u1', 's1', null)").fetchone()
    assert own == (1,)
    assert own == attacker.execute("select count(*) from harbor.messages").fetchone()
    for limit in (None, 10):
        row = attacker.execute(
            "select harbor._session_turns(%s, %s, %s, %s)", (tenant, user, session, limit)
        ).fetchone()
        assert row == (0,)
    # nor the turns after another session's last summarised turn: unknown (null)
    row = attacker.execute(
        "select harbor._session_turns_since_summary(%s, %s, %s, 10)", (tenant, user, session)
    ).fetchone()
    assert row == (None,)


def test_cannot_forget_another_sessions_summarised_turn(attacker: Conn, seeded: PgDatabase) -> None:
    # the trigger that clears a session's last summarised turn on a deletion of its turns
    # is a definer: attached to the attacker's own table, whose rows name another tenant's
    # session, it refuses, and that session's mark stays (written by the application
    # role as that session's owner)
    with connect(seeded.url_for("harbor_app"), autocommit=True) as victim:
        victim.execute("select harbor.set_identity('t2', null, 'u1', null, 's1', null)")
        victim.execute(
            "insert into harbor.session_state (tenant_id, user_id, session_id,"
            " turns_at_summary, summarised_through) values ('t2', 'u1', 's1', 1, 7)"
        )
    try:
        attacker.execute(
            "create temp table gone_turns (tenant_id text, user_id text, session_id text)"
        )
        attacker.execute("insert into gone_turns values ('t2', 'u1', 's1')")
        with pytest.raises((errors.InsufficientPrivilege, errors.UndefinedFunction)):
            attacker.execute(
                "create trigger forget after delete on gone_turns"
                " referencing old table as gone for each statement"
                " execute function harbor._forget_summary_frontier()"
            )
            attacker.execute("delete from gone_turns")
        with psycopg.connect(seeded.superuser_url) as su:
            mark = su.execute(
                "select summarised_through from harbor.session_state where tenant_id = 't2'"
            ).fetchone()
        assert mark == (7,)
    finally:
        with psycopg.connect(seeded.superuser_url, autocommit=True) as su:
            su.execute("delete from harbor.session_state where tenant_id = 't2'")


def test_cannot_read_other_runs_working_state(attacker: Conn) -> None:
    assert contents(attacker, "select state->>'tag' from harbor.working_state") == ["mine"]


def test_cannot_read_others_embeddings(attacker: Conn) -> None:
    n = attacker.execute("select count(*) from harbor.memory_embeddings").fetchone()
    assert n == (6,)


def test_only_candidate_functions_are_security_definers(attacker: Conn) -> None:
    # every set-returning or row-reading function in the schema runs as the invoker
    rows = attacker.execute(
        "select p.proname from pg_proc p where p.pronamespace = 'harbor'::regnamespace"
        " and p.prosecdef"
    ).fetchall()
    definers = {r[0] for r in rows}
    # (promote_vector_owner returns a count and updates in_graph, nothing else, and
    # only for a key the caller sees: test_a_caller_cannot_promote_a_key_it_cannot_see;
    # vector_owner_graph writes nothing and answers (false, false) for a key the caller
    # cannot see: test_a_caller_learns_nothing_of_a_key_it_cannot_see;
    # _memories_successor_set_null, on Citus only, is the superseded_by key's ON DELETE
    # SET NULL, run as the table's owner as the referential action is: no role may
    # execute it, so no caller can attach it to a table of its own, below and
    # test_an_admin_cannot_run_the_owners_unlink_on_a_table_of_its_own;
    # consolidation_owners lists owner ids, for an unbound harbor_admin only, below;
    # _hold_tenant_shard, on Citus only, takes a shared lock on the caller's own
    # tenant's shard and says whether this node holds it, and refuses another tenant:
    # tests/citus/test_cluster_recall_delegated.py;
    # _session_turns counts the turns of the caller's own session only, 0 for any other,
    # and _session_turns_since_summary those after its last summarised turn, null for any
    # other: test_cannot_count_other_sessions_turns; _forget_summary_frontier, the trigger
    # that clears that turn when turns are deleted, refuses to run on any table but
    # harbor.messages: test_cannot_forget_another_sessions_summarised_turn;
    # _delegated_session_turns, on Citus only,
    # the same count on the worker of a delegated append:
    # tests/citus/test_cluster_append.py; _recall_twin, on Citus only, makes the twins of
    # recall and its candidate legs on the caller's own tenant's shard tables, temporary
    # functions of the connection, and refuses another tenant:
    # tests/security/test_recall_candidates.py, tests/citus/test_cluster_recall_delegated.py)
    assert definers <= {
        "_recall_twin",
        "_hold_tenant_shard",
        "_session_turns",
        "_session_turns_since_summary",
        "_forget_summary_frontier",
        "_delegated_session_turns",
        "consolidation_owners",
        "_dense_candidates",
        "_lexical_candidates",
        "promote_vector_owner",
        "vector_owner_graph",
        "_memories_successor_set_null",
    }, definers
    if "_memories_successor_set_null" in definers:
        executable = attacker.execute(
            "select r from unnest(array['harbor_app', 'harbor_admin', 'harbor_search']) r"
            " where has_function_privilege(r, 'harbor._memories_successor_set_null()',"
            " 'execute')"
        ).fetchall()
        assert executable == []


def test_cannot_list_every_tenants_owners(attacker: Conn) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute("select * from harbor.consolidation_owners(null)")


def test_cannot_erase_others_rows(attacker: Conn) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute("select * from harbor.erase(user_id => 'u2')")


def test_cannot_update_others_memories(attacker: Conn) -> None:
    cur = attacker.execute(
        "update harbor.memories set valid = tstzrange(lower(valid), now())"
        " where content like 'secret:%%'"
    )
    assert cur.rowcount == 0


def test_cannot_update_working_state(attacker: Conn) -> None:
    # working state is written as new versions only: no UPDATE at all
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute(
            "update harbor.working_state set state = '{}' where state->>'tag' <> 'mine'"
        )


@pytest.mark.parametrize(
    "sql",
    [
        "update harbor.messages set content = 'overwritten' where content like 'secret:%%'",
        "update harbor.memory_embeddings set model_id = 'forged' where tenant_id = 't2'",
    ],
    ids=["messages", "memory_embeddings"],
)
def test_cannot_update_turns_or_vectors(attacker: Conn, sql: str) -> None:
    # turns and vectors are never updated in place: the application role has no UPDATE
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "delete from harbor.memories where content like 'secret:%%'",
        "delete from harbor.working_state where state->>'tag' <> 'mine'",
        "delete from harbor.memory_embeddings where tenant_id = 't2'",
    ],
    ids=["memories", "working_state", "memory_embeddings"],
)
def test_cannot_delete_others_rows(attacker: Conn, sql: str) -> None:
    cur = attacker.execute(sql)
    assert cur.rowcount == 0


@pytest.mark.parametrize(
    ("scope", "tenant", "project", "user", "session", "run"),
    [
        ("user", "t2", "", "u1", "", ""),
        ("user", "t1", "", "u2", "", ""),
        ("project", "t1", "p2", "", "", ""),
        ("session", "t1", "", "u1", "s2", ""),
        ("run", "t1", "p1", "u1", "s1", "r2"),
    ],
    ids=["other-tenant", "other-user", "other-project", "other-session", "other-run"],
)
def test_cannot_insert_forged_owner(
    attacker: Conn, scope: str, tenant: str, project: str, user: str, session: str, run: str
) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute(
            "insert into harbor.memories (tenant_id, scope, project_id, user_id, session_id,"
            " run_id,"
            " content, content_hash) values (%s,%s,%s,%s,%s,%s,'forged', repeat('f', 64))",
            (tenant, scope, project, user, session, run),
        )


@pytest.mark.parametrize(
    ("tenant", "user", "session"),
    [("t1", "u2", "s1"), ("t2", "u1", "s1"), ("t1", "u1", "s2")],
    ids=["other-user", "other-tenant", "other-session"],
)
def test_cannot_insert_forged_message(attacker: Conn, tenant: str, user: str, session: str) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute(
            "insert into harbor.messages (tenant_id, user_id, session_id, role, content)"
            " values (%s, %s, %s, 'user', 'forged')",
            (tenant, user, session),
        )


@pytest.mark.parametrize(
    ("tenant", "project", "user", "session", "run"),
    [
        ("t1", "p1", "u1", "s1", "r9"),
        ("t2", "p1", "u1", "s1", "r1"),
        ("t1", "p2", "u1", "s1", "r1"),
        ("t1", "p1", "u2", "s1", "r1"),
        ("t1", "p1", "u1", "s2", "r1"),
    ],
    ids=["other-run", "other-tenant", "other-project", "other-user", "other-session"],
)
def test_cannot_insert_forged_working_state(
    attacker: Conn, tenant: str, project: str, user: str, session: str, run: str
) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute(
            "insert into harbor.working_state (tenant_id, project_id, user_id, session_id, run_id)"
            " values (%s, %s, %s, %s, %s)",
            (tenant, project, user, session, run),
        )


def test_cannot_insert_wider_scope_with_narrow_key(attacker: Conn) -> None:
    # a USER row keyed like the caller but widened to the project
    with pytest.raises((errors.InsufficientPrivilege, errors.CheckViolation)):
        attacker.execute(
            "insert into harbor.memories (tenant_id, scope, project_id, user_id, content,"
            " content_hash)"
            " values ('t1', 'project', 'p1', 'u1', 'widened', repeat('e', 64))"
        )


@pytest.mark.parametrize(
    ("scope", "tenant"), [("tenant", "t1"), ("global", "")], ids=["tenant", "global"]
)
def test_cannot_insert_tenant_or_global(attacker: Conn, scope: str, tenant: str) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute(
            "insert into harbor.memories (tenant_id, scope, content, content_hash)"
            " values (%s, %s, 'wide', repeat('d', 64))",
            (tenant, scope),
        )


@pytest.mark.parametrize("scope", ["tenant", "global"])
def test_cannot_update_tenant_or_global(attacker: Conn, scope: str) -> None:
    cur = attacker.execute(
        "update harbor.memories set valid = tstzrange(lower(valid), now()) where scope = %s",
        (scope,),
    )
    assert cur.rowcount == 0


def test_cannot_change_content_of_own_memory(attacker: Conn) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute("update harbor.memories set content = 'rewritten' where scope = 'user'")


@pytest.mark.parametrize(
    "sql",
    [
        "select harbor.set_identity('t2')",
        "select harbor.set_identity('t1', principal_id => 'u2')",
    ],
    ids=["other-tenant", "other-user"],
)
def test_bound_role_cannot_set_another_identity(seeded: Any, sql: str) -> None:
    with (
        connect(seeded.url_for(BOUND_ROLE), autocommit=True) as conn,
        pytest.raises(errors.InsufficientPrivilege),
    ):
        conn.execute(sql)


@pytest.mark.parametrize(
    "settings",
    [
        [("tenant_id", "t2")],
        [("user_id", "u2")],
        [("tenant_id", "t2"), ("user_id", "u2")],
    ],
    ids=["tenant", "user", "tenant-and-user"],
)
def test_bound_role_ignores_raw_identity_settings(
    seeded: Any, settings: list[tuple[str, str]]
) -> None:
    # raw settings are ignored: the binding wins
    with connect(seeded.url_for(BOUND_ROLE), autocommit=True) as conn:
        for name, value in settings:
            conn.execute("select set_config(%s, %s, false)", (f"harbor.{name}", value))
        rows = contents(conn, "select content from harbor.memories")
        assert rows and all(r.startswith("mine:") for r in rows), rows


@pytest.mark.parametrize("role", ["harbor_owner", "harbor_admin", "harbor_search", "postgres"])
def test_cannot_set_role_to_escape(attacker: Conn, role: str) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute(f"set role {role}")


@pytest.mark.parametrize("reset", [False, True], ids=["set-role-app", "then-reset-role"])
def test_set_or_reset_role_keeps_the_binding(seeded: Any, reset: bool) -> None:
    if set_role_refused_on_cluster(seeded, BOUND_ROLE, "harbor_app"):
        return
    with connect(seeded.url_for(BOUND_ROLE), autocommit=True) as conn:
        conn.execute("set role harbor_app")  # allowed: it is a member
        conn.execute("select set_config('harbor.tenant_id', 't2', false)")
        if reset:
            conn.execute("reset role")
        rows = contents(conn, "select content from harbor.memories")
        assert rows and all(r.startswith("mine:") for r in rows), rows


def test_set_role_then_set_local_keeps_the_binding(seeded: Any) -> None:
    """The identity settings a transaction sets with SET LOCAL (which Citus sends to the
    workers) after SET ROLE to the application role: the binding still wins. On Citus
    the worker connections are opened as the current user, where the binding would not
    be seen: there a bound role cannot be one that may SET ROLE harbor_app (the operator
    grants it without SET, and the bindings' trigger refuses to bind one:
    test_role_bindings), so the SET ROLE itself is refused."""
    if set_role_refused_on_cluster(seeded, BOUND_ROLE, "harbor_app"):
        return
    with connect(seeded.url_for(BOUND_ROLE)) as conn:  # (one transaction)
        conn.execute("set role harbor_app")
        for name, value in [("tenant_id", "t2"), ("user_id", "u1"), ("principal_id", "u1")]:
            conn.execute(f"set local harbor.{name} = '{value}'")
        rows = contents(conn, "select content from harbor.memories")
        assert rows and all(r.startswith("mine:") for r in rows), rows


@pytest.mark.parametrize(
    "table", ["memories", "messages", "working_state", "memory_embeddings", "role_bindings"]
)
def test_cannot_truncate(attacker: Conn, table: str) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute(f"truncate harbor.{table}")


def test_cannot_disable_row_security(attacker: Conn) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute("alter table harbor.memories disable row level security")


def test_row_security_off_refuses_to_read(attacker: Conn) -> None:
    attacker.execute("set row_security = off")
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute("select count(*) from harbor.memories")


def _refused_on_a_worker(exc: psycopg.Error) -> bool:
    """A Citus worker refuses DDL from a client before any privilege check ("operation
    is not allowed on this node"): the attack is refused there with another error."""
    return isinstance(exc, errors.InternalError) and "not allowed on this node" in str(exc)


def test_cannot_create_shadowing_function_in_public(attacker: Conn) -> None:
    with pytest.raises((errors.InsufficientPrivilege, errors.InternalError)) as refused:
        attacker.execute(
            "create function public.current_setting(text, boolean) returns text"
            " language sql as $$ select 't2' $$"
        )
    assert isinstance(refused.value, errors.InsufficientPrivilege) or _refused_on_a_worker(
        refused.value
    ), refused.value


def test_cannot_create_schema_for_shadowing(attacker: Conn) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute("create schema evil")


PG_TEMP_SHADOWS = {
    "current_setting": "create function pg_temp.current_setting(text, boolean) returns text"
    " language sql as $$ select 't2' $$",
    "caller_tenant": "create function pg_temp.caller_tenant() returns text"
    " language sql as $$ select 't2' $$",
}


@pytest.mark.parametrize(
    "shadowed",
    [["current_setting"], ["caller_tenant"], ["current_setting", "caller_tenant"]],
    ids=["current_setting", "caller_tenant", "both"],
)
def test_cannot_shadow_harbor_functions_via_pg_temp(attacker: Conn, shadowed: list[str]) -> None:
    # temporary objects: pg_temp is never searched for functions, and harbor's
    # functions pin their search_path or were parsed at creation
    for name in shadowed:
        try:
            attacker.execute(PG_TEMP_SHADOWS[name])
        except errors.InternalError as exc:
            # (a worker: the shadow cannot even be made; the read below still runs)
            assert _refused_on_a_worker(exc), exc
    attacker.execute("set search_path = pg_temp, harbor, public")
    rows = contents(attacker, "select content from memories")
    assert rows and all(r.startswith("mine:") for r in rows), rows


def test_cannot_bind_roles(attacker: Conn) -> None:
    with pytest.raises(errors.InsufficientPrivilege):
        attacker.execute("select harbor.bind_role('harbor_app', 't2')")


def test_cannot_read_others_bindings(attacker: Conn) -> None:
    assert attacker.execute(
        "select count(*) from harbor.role_bindings where role_name <> %s", (BOUND_ROLE,)
    ).fetchone() == (0,)


@pytest.mark.parametrize(
    ("table", "expected"),
    [("memories", ["mine: global fact"]), ("messages", [])],
    ids=["memories", "messages"],
)
def test_no_identity_sees_only_global(seeded: Any, table: str, expected: list[str]) -> None:
    with connect(seeded.url_for("harbor_app"), autocommit=True) as conn:
        assert contents(conn, f"select content from harbor.{table}") == expected


@pytest.mark.parametrize(
    "args",
    [("t2", None, "u1", None, "s1", None), ("t1", None, "u2", None, "s1", None)],
    ids=["other-tenant", "other-user"],
)
def test_bound_role_cannot_read_through_recent_turns(
    seeded: Any, args: tuple[str | None, ...]
) -> None:
    # harbor.recent_turns sets the identity it is given, but a binding wins
    with connect(seeded.url_for(BOUND_ROLE), autocommit=True) as conn:
        rows = conn.execute(
            "select content from harbor.recent_turns(%s, %s, %s, %s, %s, %s, 50)", args
        ).fetchall()
        assert rows == []


# -- harbor.recall() as an attacker ---------------------------------------------------
#
# Victims hold memories with a word nobody else has and a vector nobody else
# has (same model id and dimensions as the seeded ones, so the dense leg
# compares them), so anything of theirs that leaked would rank first.

VICTIM_WORD = "zephyrquartz"
VICTIM_VECTOR = "[0,1,0]"
ALL_SCOPES = "{global,tenant,project,user,session,run}"
# (tenant, scope, project, user, session, run, content)
VICTIM_MEMORIES = [
    # another user of the attacker's tenant, in the attacker's session id
    ("t1", "user", "", "u2", "", "", f"victim: t1 u2 {VICTIM_WORD} user note"),
    ("t1", "session", "", "u2", "s1", "", f"victim: t1 u2 s1 {VICTIM_WORD} session note"),
    ("t1", "run", "p1", "u2", "s1", "r1", f"victim: t1 u2 r1 {VICTIM_WORD} run note"),
    # another tenant, with the attacker's own user, project, session and run ids
    ("t2", "user", "", "u1", "", "", f"victim: t2 u1 {VICTIM_WORD} user note"),
    ("t2", "session", "", "u1", "s1", "", f"victim: t2 u1 s1 {VICTIM_WORD} session note"),
    ("t2", "project", "p1", "", "", "", f"victim: t2 p1 {VICTIM_WORD} project note"),
    ("t2", "tenant", "", "", "", "", f"victim: t2 {VICTIM_WORD} tenant note"),
]


@pytest.fixture(scope="module")
def victims(seeded: Any) -> Any:
    """The seeded database plus the victims' memories and their vectors.

    None of them is visible to the attacker identities (t1/p1/u1/s1/r1, or the
    role bound to t1/p1/u1), so the other tests of this module are unaffected.
    Each is written by its owner (harbor_app as that identity, harbor_admin for
    the TENANT row).
    """
    for i, row in enumerate(VICTIM_MEMORIES):
        write_memory(seeded, row, f"{i + 1000:064x}", vector=("m", 3, VICTIM_VECTOR))
    return seeded


def recall_rows(conn: Conn) -> list[tuple[str, int | None, int | None]]:
    """(content, dense_rank, lexical_rank) of a recall aimed at the victims' rows."""
    rows = conn.execute(
        "select content, dense_rank, lexical_rank from harbor.recall("
        " query => %s, query_embedding => %s::vector, model_id => 'm',"
        " scopes => %s::harbor.memory_scope[], top_k => 100)",
        (f"what about {VICTIM_WORD}?", VICTIM_VECTOR, ALL_SCOPES),
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def assert_no_victim_rows(rows: list[tuple[str, int | None, int | None]]) -> None:
    leaked = [r for r in rows if r[0].startswith("victim:") or VICTIM_WORD in r[0]]
    assert leaked == []
    # the call did run both legs: the dense one still ranks the caller's own rows
    assert rows and all(r[0].startswith("mine:") for r in rows), rows
    assert all(r[1] is not None for r in rows), rows


def test_recall_returns_nothing_of_another_user_or_tenant(victims: Any, attacker: Conn) -> None:
    # app role as t1/p1/u1/s1/r1, or the role bound to t1/u1: neither u2 of t1
    # nor anyone of t2 (same user, project, session, run ids) comes back
    assert_no_victim_rows(recall_rows(attacker))


@pytest.mark.parametrize(
    ("tenant", "user", "set_role"),
    [("t2", "u1", False), ("t1", "u2", False), ("t2", "u2", False), ("t2", "u2", True)],
    ids=["t2-u1", "t1-u2", "t2-u2", "t2-u2-then-set-role-app"],
)
def test_recall_as_a_bound_role_ignores_spoofed_settings(
    victims: Any, tenant: str, user: str, set_role: bool
) -> None:
    with connect(victims.url_for(BOUND_ROLE), autocommit=True) as conn:
        for name, value in [
            ("tenant_id", tenant),
            ("user_id", user),
            ("principal_id", user),
            ("project_id", "p1"),
            ("session_id", "s1"),
            ("run_id", "r1"),
        ]:
            conn.execute("select set_config(%s, %s, false)", (f"harbor.{name}", value))
        if set_role:
            # and after SET ROLE to the role it inherits from
            if set_role_refused_on_cluster(victims, BOUND_ROLE, "harbor_app"):
                return
            conn.execute("set role harbor_app")
        assert_no_victim_rows(recall_rows(conn))


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        (("t1", "p1", "u2", "s1", "r1"), {0, 1, 2}),
        (("t2", "p1", "u1", "s1", None), {3, 4, 5, 6}),
    ],
    ids=["t1-u2", "t2-u1"],
)
def test_recall_gives_the_victim_its_own_rows(
    victims: Any, identity: tuple[str | None, ...], expected: set[int]
) -> None:
    # the same call as the attacks above, as the owner: its rows come back from
    # both legs, so an empty result above is the policy at work, not a bad query
    with connect(victims.app_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity(%s, %s, %s, null, %s, %s)", identity)
        rows = recall_rows(conn)
        visible = set(contents(conn, "select content from harbor.memories"))
    got = {r[0] for r in rows if r[0].startswith("victim:")}
    assert got == {VICTIM_MEMORIES[i][6] for i in expected}
    for content, dense_rank, lexical_rank in rows:
        if content.startswith("victim:"):
            assert dense_rank is not None and lexical_rank is not None, content
    # and nothing beyond what the policies show this identity
    assert {r[0] for r in rows} <= visible


def test_profile_holds_only_its_own_memories(attacker: Conn) -> None:
    # every scope asked for, no budget: the caller's own rows of each, never another
    # owner's, and no GLOBAL row (a profile is a tenant's user's)
    rows = contents(
        attacker,
        "select content from harbor.profile("
        " scopes => '{global,tenant,project,user,session,run}', token_budget => null,"
        " stable_after => '0') order by content",
    )
    assert rows == [
        "mine: p1 project fact",
        "mine: t1 tenant fact",
        "mine: u1 s1 r1 run fact",
        "mine: u1 s1 session fact",
        "mine: u1 user fact",
    ]
