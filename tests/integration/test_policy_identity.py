"""The policies read the caller's identity as (tenant, owner keys): two lookups a
policy instead of five, with the same answer as the five-value predicates."""

from __future__ import annotations

import os
import re
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import PgDatabase


def test_keyed_predicates_answer_as_the_five_value_ones(module_db: PgDatabase) -> None:
    # every scope, row keys of '', 'a', 'b', identity fields NULL (unset, or left unset
    # by a binding), '' and 'a': harbor._visible_keys and harbor._writable_keys hold
    # exactly where harbor._visible and harbor._writable do (a NULL answer denies)
    with psycopg.connect(module_db.superuser_url) as conn:
        row = conn.execute(
            """
            with i(x) as (values (null::text), (''), ('a')),
                 r(x) as (values (''), ('a'), ('b')),
                 s(scope) as (select unnest(enum_range(null::harbor.memory_scope))),
                 grid as (
                     select s.scope, rt.x rt, rp.x rp, ru.x ru, rs.x rs, rr.x rr,
                            it.x it, ip.x ip, iu.x iu, isn.x isn, ir.x ir,
                            harbor._owner_keys(ip.x, iu.x, isn.x, ir.x) keys
                       from s, r rt, r rp, r ru, r rs, r rr, i it, i ip, i iu, i isn, i ir)
            select count(*),
                   count(*) filter (where coalesce(harbor._visible(scope, rt, rp, ru, rs, rr,
                                                                  it, ip, iu, isn, ir), false)),
                   count(*) filter (where coalesce(harbor._writable(scope, rt, rp, ru, rs, rr,
                                                                   it, ip, iu, isn, ir), false)),
                   count(*) filter (where coalesce(harbor._visible(scope, rt, rp, ru, rs, rr,
                                                                  it, ip, iu, isn, ir), false)
                                          <> coalesce(harbor._visible_keys(scope, rt, rp, ru, rs,
                                                                           rr, it, keys), false)),
                   count(*) filter (where coalesce(harbor._writable(scope, rt, rp, ru, rs, rr,
                                                                   it, ip, iu, isn, ir), false)
                                          <> coalesce(harbor._writable_keys(scope, rt, rp, ru,
                                                                            rs, rr, it, keys),
                                                      false))
              from grid
            """
        ).fetchone()
    assert row is not None
    total, visible, writable, visible_differs, writable_differs = row
    assert total == 6 * 3**5 * 3**5
    assert visible > writable > 0
    assert (visible_differs, writable_differs) == (0, 0)


def test_the_insert_check_answers_as_the_five_value_one(module_db: PgDatabase) -> None:
    # harbor._writable_check (the whole identity in one value, the tenant in it) holds
    # exactly where harbor._writable, and the principal test, did: every scope, rows
    # with a NULL tenant or principal too, identity fields NULL or not
    with psycopg.connect(module_db.superuser_url) as conn:
        row = conn.execute(
            """
            with i(x) as (values (null::text), ('a')),
                 ip(x) as (values (null::text), (''), ('a')),
                 r(x) as (values (''), ('a'), ('b')),
                 rn(x) as (values (null::text), (''), ('a')),
                 s(scope) as (select unnest(enum_range(null::harbor.memory_scope))),
                 grid as (
                     select s.scope, rt.x rt, rp.x rp, ru.x ru, rs.x rs, rr.x rr, rpr.x rpr,
                            it.x it, ipj.x ipj, iu.x iu, isn.x isn, ir.x ir, ipr.x ipr,
                            harbor._owner_write_keys(it.x, ipj.x, iu.x, isn.x, ir.x, ipr.x) keys
                       from s, rn rt, r rp, r ru, r rs, r rr, rn rpr,
                            i it, i ipj, i iu, i isn, i ir, ip ipr)
            select count(*),
                   count(*) filter (where ok),
                   count(*) filter (where ok <> coalesce(harbor._writable_check(
                       scope, rt, rp, ru, rs, rr, rpr, keys), false)),
                   count(*) filter (where okw <> coalesce(harbor._writable_check(
                       scope, rt, rp, ru, rs, rr, keys), false))
              from (select g.*,
                           coalesce(harbor._writable(scope, rt, rp, ru, rs, rr,
                                                     it, ipj, iu, isn, ir), false) okw,
                           coalesce(harbor._writable(scope, rt, rp, ru, rs, rr,
                                                     it, ipj, iu, isn, ir)
                                    and rpr = coalesce(ipr, ''), false) ok
                      from grid g) x
            """
        ).fetchone()
    assert row is not None
    total, allowed, differs, differs_without_principal = row
    assert total == 6 * 3 * 3**4 * 3 * 2**5 * 3
    assert allowed > 0
    assert (differs, differs_without_principal) == (0, 0)


def _keys(conn: psycopg.Connection[Any]) -> tuple[Any, Any]:
    row = conn.execute(
        "select harbor._caller_keys(), harbor._owner_keys(harbor.caller_project(),"
        " harbor.caller_user(), harbor.caller_session(), harbor.caller_run()),"
        " harbor._caller_write_keys(), harbor._owner_write_keys(harbor.caller_tenant(),"
        " harbor.caller_project(), harbor.caller_user(), harbor.caller_session(),"
        " harbor.caller_run(), harbor.caller_principal())"
    ).fetchone()
    assert row is not None
    assert row[2] == row[3]
    return row[0], row[1]


def test_caller_keys_are_the_caller_fields(module_db: PgDatabase) -> None:
    role = f"ident_keys_{os.getpid()}"
    with psycopg.connect(module_db.superuser_url, autocommit=True) as su:
        su.execute(sql.SQL("create role {} login in role harbor_app").format(sql.Identifier(role)))
    try:
        with psycopg.connect(module_db.app_url, autocommit=True) as app:
            # no identity: every narrowed field NULL
            keys, fields = _keys(app)
            assert keys == fields
            assert keys[5] == ["", None, None, None]
            app.execute("select harbor.set_identity('t1', 'p1', 'u1', null, 's1', 'r1')")
            keys, fields = _keys(app)
            assert keys == fields
            assert keys[2:] == [
                ["p1", "", "", ""],
                ["", "u1", "", ""],
                ["", "u1", "s1", ""],
                ["p1", "u1", "s1", "r1"],
            ]
        with psycopg.connect(module_db.superuser_url, autocommit=True) as su:
            su.execute("select harbor.bind_role(%s, 't1', 'p1', null)", [role])
        with psycopg.connect(module_db.url_for(role), autocommit=True) as bound:
            # a role bound to no user: no user, session or run, whatever the settings say
            for name, value in [
                ("user_id", "u9"),
                ("principal_id", "u9"),
                ("session_id", "s9"),
                ("run_id", "r9"),
                ("project_id", "p9"),
            ]:
                bound.execute("select set_config(%s, %s, false)", [f"harbor.{name}", value])
            keys, fields = _keys(bound)
            assert keys == fields
            assert keys[2:] == [
                ["p1", "", "", ""],
                ["", None, "", ""],
                ["", None, None, ""],
                ["p1", None, None, None],
            ]
    finally:
        with psycopg.connect(module_db.superuser_url, autocommit=True) as su:
            su.execute("delete from harbor.role_bindings where role_name = %s", [role])
            su.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


def test_a_policy_looks_the_identity_up_twice(module_db: PgDatabase) -> None:
    with psycopg.connect(module_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', 'p1', 'u1')")
        plan = "\n".join(
            r[0]
            for r in app.execute(
                "explain (costs off, verbose) select id from harbor.memories where id = 'x'"
            )
        )
    # one lookup for the tenant, which still drives the index scan, one for the keys
    assert len(re.findall(r"InitPlan \d+\n", plan + "\n")) == 2, plan
    assert "harbor.caller_tenant()" in plan and "harbor._caller_keys()" in plan, plan
    assert re.search(r"Index Cond: \(\(memories\.tenant_id = ANY", plan), plan
    assert "caller_user" not in plan and "caller_project" not in plan, plan


def test_an_insert_checks_its_row_with_one_lookup(module_db: PgDatabase) -> None:
    with psycopg.connect(module_db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', 'p1', 'u1')")
        plan = "\n".join(
            r[0]
            for r in app.execute(
                "explain (costs off, verbose) insert into harbor.memory_embeddings"
                " (tenant_id, memory_id, model_id, dims, embedding, scope, project_id, user_id,"
                " session_id, run_id) values ('t1', 'x', 'm', 3, '[1,0,0]', 'user', '', 'u1',"
                " '', '')"
            )
        )
    assert len(re.findall(r"InitPlan \d+\n", plan + "\n")) == 1, plan
    assert "harbor._caller_write_keys()" in plan, plan


def _binding_reads(conn: psycopg.Connection[Any]) -> int:
    """The scans of harbor.role_bindings in this connection's transaction so far."""
    row = conn.execute(
        "select coalesce(sum(seq_scan + coalesce(idx_scan, 0)), 0) from pg_stat_xact_user_tables"
        " where schemaname = 'harbor' and relname = 'role_bindings'"
    ).fetchone()
    assert row is not None
    return int(row[0])


IDENTITY_CALLS = (
    "select harbor.caller_tenant(), harbor.caller_project(), harbor.caller_user(),"
    " harbor.caller_principal(), harbor.caller_session(), harbor.caller_run(),"
    " harbor.caller_is_bound(), harbor._caller_keys(), harbor._caller_write_keys(),"
    " (harbor._caller_identity()).tenant_id"
)


def test_the_librarys_own_login_reads_its_identity_without_a_binding_lookup(
    module_db: PgDatabase,
) -> None:
    # harbor_app (no role set) can be named by no binding: its identity comes from the
    # settings alone, with no read of role_bindings; a login that could be bound (here
    # the superuser) still looks its binding up, with the same answers
    answers = []
    for url, reads_bindings in ((module_db.app_url, False), (module_db.superuser_url, True)):
        with psycopg.connect(url) as conn:
            conn.execute("select harbor.set_identity('t1', principal_id => 'u1', is_local => true)")
            before = _binding_reads(conn)
            answers.append(conn.execute(IDENTITY_CALLS).fetchone())
            assert (_binding_reads(conn) > before) is reads_bindings
    assert answers[0] == answers[1]
    assert answers[0] is not None
    assert answers[0][:7] == ("t1", None, "u1", "u1", None, None, False)
