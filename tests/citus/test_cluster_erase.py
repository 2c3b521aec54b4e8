"""Deleting a memory that another version links to, on the cluster.

Citus refuses the superseded_by key's ON DELETE SET NULL; the trigger of
sql/citus/successor.sql does what it did (docs/citus.md). The security side (who
may reopen what) is tests/security/test_erase_reopen.py, on both targets.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import errors

from harbor_pg.db import migrate
from tests.citus.conftest import ClusterDatabase

TRIGGER = "FK_memories_superseded_by_set_null"
FUNCTION = "harbor._memories_successor_set_null()"


def _write(db: ClusterDatabase, tenant: str, principal: str | None, content: str) -> str:
    with psycopg.connect(db.app_url) as conn:
        conn.execute(
            "select harbor.set_identity(%s, principal_id => %s, user_id => 'u1')",
            (tenant, principal),
        )
        row = conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values (%s, 'user', 'u1', coalesce(%s, ''), %s,"
            " encode(sha256(%s::bytea), 'hex')) returning id",
            (tenant, principal, content, f"{tenant}/{content}"),
        ).fetchone()
    assert row is not None
    return str(row[0])


def _supersede(db: ClusterDatabase, tenant: str, old: str, new: str) -> None:
    with psycopg.connect(db.app_url) as conn:
        conn.execute("select harbor.set_identity(%s, user_id => 'u1')", (tenant,))
        conn.execute(
            "update harbor.memories set valid = tstzrange(lower(valid), now()),"
            " superseded_by = %s where tenant_id = %s and id = %s",
            (new, tenant, old),
        )


def _state(db: ClusterDatabase, tenant: str, memory_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(db.superuser_url) as conn:
        return conn.execute(
            "select upper_inf(valid), superseded_by from harbor.memories"
            " where tenant_id = %s and id = %s",
            (tenant, memory_id),
        ).fetchone()


def _erase_bot(db: ClusterDatabase, tenant: str) -> int:
    with psycopg.connect(db.admin_url) as conn:
        conn.execute("select harbor.set_identity(%s)", (tenant,))
        rows = conn.execute("select * from harbor.erase(principal_id => 'bot')").fetchall()
    return dict(rows)["long_term"]


def test_erase_of_a_chain_in_one_statement_reopens_the_version_before_it(
    cluster_db: ClusterDatabase,
) -> None:
    """u1's fact, then two newer versions an agent wrote: erasing the agent deletes
    both in one statement (the first links to the second), and u1's comes back."""
    tenant = "erase-chain-t"
    v1 = _write(cluster_db, tenant, None, "the ferry leaves at six")
    v2 = _write(cluster_db, tenant, "bot", "the ferry leaves at seven")
    v3 = _write(cluster_db, tenant, "bot", "the ferry leaves at eight")
    _supersede(cluster_db, tenant, v1, v2)
    _supersede(cluster_db, tenant, v2, v3)
    assert _erase_bot(cluster_db, tenant) == 2
    assert _state(cluster_db, tenant, v2) is None and _state(cluster_db, tenant, v3) is None
    assert _state(cluster_db, tenant, v1) == (True, None)


def test_a_user_deleting_a_middle_version_unlinks_the_one_before(
    cluster_db: ClusterDatabase,
) -> None:
    """A raw DELETE by harbor_app of its own version that another links to: the link is
    cleared (as ON DELETE SET NULL did), the older version stays closed, and another
    tenant's chain is untouched."""
    tenant, other = "erase-raw-t", "erase-raw-other"
    old = _write(cluster_db, tenant, None, "the bakery opens at seven")
    new = _write(cluster_db, tenant, None, "the bakery opens at eight")
    _supersede(cluster_db, tenant, old, new)
    other_old = _write(cluster_db, other, None, "the bakery opens at seven")
    other_new = _write(cluster_db, other, None, "the bakery opens at eight")
    _supersede(cluster_db, other, other_old, other_new)
    with psycopg.connect(cluster_db.app_url) as conn:
        conn.execute("select harbor.set_identity(%s, user_id => 'u1')", (tenant,))
        deleted = conn.execute(
            "delete from harbor.memories where tenant_id = %s and id = %s", (tenant, new)
        ).rowcount
    assert deleted == 1
    assert _state(cluster_db, tenant, old) == (False, None)
    assert _state(cluster_db, other, other_old) == (False, other_new)


def test_the_trigger_refuses_to_act_for_a_table_that_is_not_harbors(
    cluster_db: ClusterDatabase,
) -> None:
    """Its second line: were EXECUTE granted again (grants.sql grants every harbor
    function; the Citus form revokes it after), a caller could attach the owner's
    function to a temporary table of its own, with any tenant and id in it. The
    function then refuses: it acts only for a harbor table its owner owns."""
    tenant = "erase-temp-t"
    old = _write(cluster_db, tenant, None, "the museum closes on mondays")
    new = _write(cluster_db, tenant, None, "the museum closes on tuesdays")
    _supersede(cluster_db, tenant, old, new)
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"grant execute on function {FUNCTION} to harbor_app")
    try:
        with psycopg.connect(cluster_db.app_url) as conn:
            conn.execute("select harbor.set_identity(%s, user_id => 'u1')", (tenant,))
            conn.execute("create temp table gone (tenant_id text, id text)")
            conn.execute(
                "create trigger gone_unlink after delete on gone"
                f" for each row execute function {FUNCTION}"
            )
            conn.execute("insert into gone values (%s, %s)", (tenant, new))
            with pytest.raises(errors.InsufficientPrivilege, match="foreign key's action"):
                conn.execute("delete from gone")
    finally:
        with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
            su.execute(f"revoke execute on function {FUNCTION} from harbor_app")
    assert _state(cluster_db, tenant, old) == (False, new)


def test_migrate_gives_an_older_distributed_database_the_trigger(
    cluster_db: ClusterDatabase,
) -> None:
    """A database distributed before the trigger existed (no function, policies or
    trigger; EXECUTE on every harbor function, as grants.sql gives it): `harbor-pg
    migrate` re-applies the Citus forms, and a delete that another version links to
    works again."""
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute("set citus.enable_unsafe_triggers = on")
        su.execute(f'drop trigger "{TRIGGER}" on harbor.memories')
        su.execute("drop policy memories_owner_set_null on harbor.memories")
        su.execute("drop policy memories_owner_set_null_read on harbor.memories")
        su.execute(f"drop function {FUNCTION}")
        su.execute("update public.harbor_idempotent_sql set sha256 = 'stale'")
    tenant = "erase-migrate-t"
    old = _write(cluster_db, tenant, None, "the tram runs every ten minutes")
    new = _write(cluster_db, tenant, "bot", "the tram runs every twelve minutes")
    _supersede(cluster_db, tenant, old, new)
    with pytest.raises(errors.ForeignKeyViolation):
        _erase_bot(cluster_db, tenant)
    migrate.upgrade(cluster_db.owner_url, progress=None)
    with psycopg.connect(cluster_db.superuser_url) as su:
        executable = su.execute(
            "select has_function_privilege(r, %s, 'execute') from unnest(array["
            "'harbor_app', 'harbor_admin', 'harbor_search']) r",
            (FUNCTION,),
        ).fetchall()
        on_workers = su.execute(
            "select result from run_command_on_workers($$select count(*) from pg_trigger"
            f" where tgname like '{TRIGGER}%'$$)"
        ).fetchall()
    assert executable == [(False,)] * 3
    # (a trigger on every shard of harbor.memories, and on the worker's shell table)
    assert all(int(r[0]) >= 1 for r in on_workers)
    assert _erase_bot(cluster_db, tenant) == 1
    assert _state(cluster_db, tenant, old) == (True, None)
