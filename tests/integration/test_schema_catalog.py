"""Properties of the schema checked from the catalog."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.conftest import PgDatabase


def q(db: PgDatabase, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db.superuser_url) as conn:
        return conn.execute(sql).fetchall()


def test_every_key_and_constraint_includes_tenant_id(module_db: PgDatabase) -> None:
    # primary keys, unique and exclusion constraints (Citus needs the
    # distribution column in each), and foreign keys (co-location)
    rows = q(
        module_db,
        """
        select c.conrelid::regclass::text, c.conname, c.contype,
               array(select a.attname from unnest(c.conkey) k
                       join pg_attribute a on a.attrelid = c.conrelid and a.attnum = k)
          from pg_constraint c
         where c.connamespace = 'harbor'::regnamespace and c.contype in ('p', 'u', 'x', 'f')
    """,
    )
    assert len(rows) >= 8
    offenders = [(t, n) for t, n, _kind, cols in rows if "tenant_id" not in cols]
    assert offenders == []
    unique_indexes = q(
        module_db,
        """
        select i.indexrelid::regclass::text,
               array(select a.attname from unnest(i.indkey) k
                       join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k)
          from pg_index i join pg_class c on c.oid = i.indrelid
         where c.relnamespace = 'harbor'::regnamespace and i.indisunique
    """,
    )
    assert [n for n, cols in unique_indexes if "tenant_id" not in cols] == []


def test_every_table_forces_row_level_security(module_db: PgDatabase) -> None:
    rows = q(
        module_db,
        """
        select relname, relrowsecurity, relforcerowsecurity from pg_class
         where relnamespace = 'harbor'::regnamespace and relkind = 'r'
    """,
    )
    assert rows
    assert [r for r in rows if not (r[1] and r[2])] == []


def test_app_role_has_no_bypass(module_db: PgDatabase) -> None:
    rows = q(
        module_db,
        """
        select rolname, rolsuper, rolbypassrls from pg_roles
         where rolname in ('harbor_app', 'harbor_admin', 'harbor_owner')
    """,
    )
    assert sorted(rows) == [
        ("harbor_admin", False, False),
        ("harbor_app", False, False),
        ("harbor_owner", False, False),
    ]


def test_functions_are_pinned(module_db: PgDatabase) -> None:
    # every function either pins search_path or has a body parsed at creation
    # (RETURN / BEGIN ATOMIC), and only the candidate functions are definers
    rows = q(
        module_db,
        """
        select p.proname, p.prosecdef, p.proconfig, p.prosqlbody is not null
          from pg_proc p where p.pronamespace = 'harbor'::regnamespace
    """,
    )
    assert rows
    unpinned = [
        name
        for name, _sd, config, parsed in rows
        if not parsed and not any(c.startswith("search_path=") for c in (config or []))
    ]
    assert unpinned == []
    definers = {name for name, sd, _c, _p in rows if sd}
    # (promote_vector_owner: a visible key's in_graph; vector_owner_graph: where a visible
    # key's new vectors go; tests/security/test_graph_promotion.py; consolidation_owners:
    # owner ids, for the unbound administrator only,
    # tests/integration/test_jobs_periodic_consolidation.py; _session_turns: the turn
    # count of the caller's own session, 0 for any other, and _session_turns_since_summary
    # those after its last summarised turn, null for any other; _forget_summary_frontier:
    # the trigger that clears that turn, on harbor.messages only;
    # tests/security/test_isolation.py)
    assert definers <= {
        "_dense_candidates",
        "_lexical_candidates",
        "_session_turns",
        "_session_turns_since_summary",
        "_forget_summary_frontier",
        "promote_vector_owner",
        "vector_owner_graph",
        "consolidation_owners",
    }
