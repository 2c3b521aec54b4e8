"""harbor-pg distribute on a real cluster: what it makes of a migrated database."""

from __future__ import annotations

import re

import psycopg
import pytest

from harbor_pg.db import citus
from harbor_pg.db.sqlfiles import read_sql
from harbor_pg.errors import MemoryConfigurationError
from tests.citus.conftest import ClusterDatabase


def test_every_tenant_table_is_distributed_by_tenant_and_colocated(
    cluster_db: ClusterDatabase,
) -> None:
    with psycopg.connect(cluster_db.superuser_url) as conn:
        rows = conn.execute(
            "select table_name::text, citus_table_type, distribution_column, colocation_id"
            " from citus_tables where table_name::text like 'harbor.%' order by 1"
        ).fetchall()
    tables = {r[0]: r for r in rows}
    assert all(tables[t][1] == "reference" for t in citus.REFERENCE_TABLES)
    distributed = [tables[t] for t in citus.CO_LOCATED]
    assert all(r[1] == "distributed" and r[2] == "tenant_id" for r in distributed)
    assert len({r[3] for r in distributed}) == 1
    # every table of the schema is in Citus' metadata
    with psycopg.connect(cluster_db.superuser_url) as conn:
        local = conn.execute(
            "select c.oid::regclass::text from pg_class c"
            " where c.relnamespace = 'harbor'::regnamespace and c.relkind = 'r'"
            "   and not exists (select 1 from pg_dist_partition p where p.logicalrelid = c.oid)"
        ).fetchall()
    assert local == []


def test_each_worker_holds_shards_of_every_table(cluster_db: ClusterDatabase) -> None:
    with psycopg.connect(cluster_db.superuser_url) as conn:
        rows = conn.execute(
            "select nodeport, count(*) from citus_shards"
            " where table_name = 'harbor.memories'::regclass group by 1"
        ).fetchall()
    assert {r[0] for r in rows} == {w.port for w in cluster_db.cluster.workers}
    assert all(r[1] >= 1 for r in rows)


def test_policies_are_the_single_server_ones_without_sub_selects(
    cluster_db: ClusterDatabase,
) -> None:
    # (and those of the Citus forms: harbor_owner's, for the trigger that stands for the
    # superseded_by key's ON DELETE SET NULL)
    source = "".join(
        read_sql(name)
        for name in (
            "policies/policies.sql",
            "policies/tokens.sql",
            "policies/locks.sql",
            *citus.CITUS_FILES,
        )
    )
    names = set(re.findall(r"create policy (\w+) on", source))
    with psycopg.connect(cluster_db.superuser_url) as conn:
        found = {
            r[0]: r[1]
            for r in conn.execute(
                "select policyname, coalesce(qual, '') || coalesce(with_check, '')"
                " from pg_policies where schemaname = 'harbor'"
            ).fetchall()
        }
        on_worker = conn.execute(
            "select result from run_command_on_workers($$select count(*) from pg_policies"
            " where schemaname = 'harbor' and tablename = 'memories'$$)"
        ).fetchall()
    assert set(found) == names
    assert not any(re.search(r"\(\s*select", text, re.IGNORECASE) for text in found.values())
    # the workers hold the distributed tables' policies too (metadata synced)
    # (distinct names: a DO block creates one policy in one of two forms)
    expected = len(
        {
            name
            for name, table in re.findall(r"create policy (\w+) on (harbor\.\w+)", source)
            if table == "harbor.memories"
        }
    )
    assert [int(r[0]) for r in on_worker] == [expected] * len(cluster_db.cluster.workers)


def test_derivation_refuses_a_sub_select_it_cannot_rewrite() -> None:
    import pytest

    from harbor_pg.errors import MemoryConfigurationError

    with pytest.raises(MemoryConfigurationError, match="sub-select"):
        citus.citus_policies("create policy p on harbor.memories using (tenant_id in (select 1));")
    assert citus.citus_policies("using (x = (select harbor.caller_tenant()))") == (
        "using (x = harbor.caller_tenant())"
    )


def test_distribute_again_changes_nothing(cluster_db: ClusterDatabase) -> None:
    report = citus.distribute(cluster_db.superuser_url)
    assert report.distributed == []
    assert set(report.already) == {*citus.REFERENCE_TABLES, *citus.CO_LOCATED}
    assert report.workers == 2


def test_the_command_reports_a_distributed_database(cluster_db: ClusterDatabase) -> None:
    from tests.conftest import run_cli

    done = run_cli("distribute", url=cluster_db.superuser_url)
    assert done.returncode == 0, done.stderr
    assert "distributed now: nothing" in done.stdout
    assert "harbor.memories" in done.stdout and "workers: 2" in done.stdout


def test_the_command_refuses_a_server_without_citus(fresh_db: object) -> None:
    from tests.conftest import PgDatabase, run_cli

    assert isinstance(fresh_db, PgDatabase)
    done = run_cli("distribute", url=fresh_db.superuser_url)
    assert done.returncode == 2
    assert "no citus extension" in done.stderr


def test_migrate_again_reapplies_the_citus_forms(cluster_db: ClusterDatabase) -> None:
    """`harbor-pg migrate` on a distributed database re-applies the re-runnable files
    in the forms Citus takes: the policies derived, recall runnable afterwards."""
    from harbor_pg.db import migrate
    from harbor_pg.db.connection import local_identity
    from harbor_pg.owner import MemoryOwner

    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        conn.execute("update public.harbor_idempotent_sql set sha256 = 'stale'")
    migrate.upgrade(cluster_db.owner_url, progress=None)
    owner = MemoryOwner(tenant_id="migrate-t", principal_id="max", session_id="s1")
    with psycopg.connect(cluster_db.app_url) as conn:
        for command in local_identity(owner):
            conn.execute(command)
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values ('migrate-t', 'user', 'max', 'max',"
            " 'the lighthouse keeper logs storms', repeat('d', 64))"
        )
        rows = conn.execute("select content from harbor.recall('lighthouse storms')").fetchall()
        conn.rollback()
    assert rows == [("the lighthouse keeper logs storms",)]
    with psycopg.connect(cluster_db.superuser_url) as conn:
        state = conn.execute("select sha256 from public.harbor_idempotent_sql").fetchone()
    assert state is not None and state[0] != "stale"


def test_distribute_refuses_a_bound_role_that_can_set_role_harbor_app(
    cluster_db: ClusterDatabase,
) -> None:
    """A binding made safe (harbor_app granted without SET) and the grant changed
    afterwards (no trigger sees a GRANT): distribute, run again, refuses and says which
    role and what to do; with the grant put back it runs."""
    role = "harbor_test_regranted"
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop role if exists {role}")
        su.execute(f"create role {role} login")
        su.execute(f"grant harbor_app to {role} with inherit true, set false")
        su.execute(
            "insert into harbor.role_bindings (tenant_id, role_name) values ('regrant-t', %s)",
            (role,),
        )
        su.execute(f"grant harbor_app to {role} with set true")
    try:
        with pytest.raises(
            MemoryConfigurationError, match=f"{role} .tenant 'regrant-t': can SET ROLE harbor_app"
        ):
            citus.distribute(cluster_db.superuser_url)
        with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
            su.execute(f"grant harbor_app to {role} with set false")
        assert citus.distribute(cluster_db.superuser_url).distributed == []
    finally:
        with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
            su.execute("delete from harbor.role_bindings where role_name = %s", (role,))
            su.execute(f"drop owned by {role}")
            su.execute(f"drop role {role}")
