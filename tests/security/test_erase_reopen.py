"""Only harbor.erase reopens a closed version, and no setting a caller plants can ask for it.

harbor.erase reopens the version before an erased current successor. The
add-only guard used to allow a reopen whenever the setting ``harbor.erasing``
was 'on' and the writer was a member of harbor_admin, and any session can set
a setting: an administrator (who cannot write a user's memories) could bring a
user's superseded fact back into their recall. Now the guard reopens a row only
while the foreign key's ON DELETE SET NULL clears its link to a deleted
successor (PostgreSQL runs that as the table's owner, which no caller is), and
only a row erase listed.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.conftest import PgDatabase
from tests.security.conftest import connect, insert_memory, writer


def _chain(db: PgDatabase) -> tuple[str, str]:
    """u1's fact, superseded by a newer one that an agent ('bot') wrote for u1, both
    through harbor_app."""
    owner = dict(tenant_id="t1", scope="user", user_id="u1")
    with writer(db, "t1", "user", "", "u1", "", "") as conn:
        old = insert_memory(
            conn, {**owner, "content": "u1 lives in Berlin", "content_hash": "a" * 64}
        )
    with connect(db.app_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1', principal_id => 'bot', user_id => 'u1')")
        new = insert_memory(
            conn, {**owner, "content": "u1 lives in Lisbon", "content_hash": "b" * 64}
        )
        conn.execute(
            "update harbor.memories set valid = tstzrange(lower(valid), now()),"
            " superseded_by = %s where id = %s",
            (new, old),
        )
    return old, new


def _admin(db: PgDatabase) -> psycopg.Connection[Any]:
    conn = connect(db.admin_url, autocommit=True)
    conn.execute("select harbor.set_identity('t1')")
    return conn


def _is_current(db: PgDatabase, memory_id: str) -> bool:
    with connect(db.superuser_url) as su:
        row = su.execute(
            "select upper_inf(valid) from harbor.memories where id = %s", (memory_id,)
        ).fetchone()
    assert row is not None
    return bool(row[0])


@pytest.mark.parametrize("setting", ["harbor.erasing", "harbor.erase_reopen"])
def test_an_admin_cannot_reopen_a_users_superseded_fact_by_planting_a_setting(
    fresh_db: PgDatabase, setting: str
) -> None:
    old, _new = _chain(fresh_db)
    value = "on" if setting == "harbor.erasing" else json.dumps([["t1", old]])
    with _admin(fresh_db) as admin:
        admin.execute("select set_config(%s, %s, false)", (setting, value))
        with pytest.raises(errors.InsufficientPrivilege, match="cannot be reopened"):
            admin.execute(
                "update harbor.memories set valid = tstzrange(lower(valid), null, '[)'),"
                " superseded_by = null where id = %s",
                (old,),
            )
        # clearing the link itself (the admin may relink chains) reopens nothing either
        admin.execute("update harbor.memories set superseded_by = null where id = %s", (old,))
    assert not _is_current(fresh_db, old)


def test_erase_still_reopens_the_version_before_an_erased_successor(
    fresh_db: PgDatabase,
) -> None:
    old, _new = _chain(fresh_db)
    with _admin(fresh_db) as admin:
        # erasing the agent takes the newer version it wrote; u1's own comes back
        admin.execute("select * from harbor.erase(principal_id => 'bot')")
    assert _is_current(fresh_db, old)


def test_a_user_who_deletes_their_newer_fact_does_not_reopen_the_older(
    fresh_db: PgDatabase,
) -> None:
    """The referential action runs for anyone who deletes a successor; the reopen is
    an unbound administrator's (harbor.erase) alone, whatever the user plants."""
    old, new = _chain(fresh_db)
    with connect(fresh_db.app_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1', principal_id => 'bot', user_id => 'u1')")
        conn.execute(
            "select set_config('harbor.erase_reopen', %s, false)", (json.dumps([["t1", old]]),)
        )
        assert conn.execute("delete from harbor.memories where id = %s", (new,)).rowcount == 1
    assert not _is_current(fresh_db, old)


def test_an_admin_cannot_run_the_owners_unlink_on_a_table_of_its_own(
    fresh_db: PgDatabase,
) -> None:
    """On Citus the key's ON DELETE SET NULL is a trigger function run as the table's
    owner (sql/citus/successor.sql). An administrator that plants the reopen list and
    attaches that function to a temporary table of its own, holding the user's
    successor's tenant and id, would have the owner clear the link and the guard reopen
    the user's fact without anything deleted. No role may execute it (on one server it
    does not exist): the older version stays closed and linked."""
    old, new = _chain(fresh_db)
    with _admin(fresh_db) as admin:
        admin.execute(
            "select set_config('harbor.erase_reopen', %s, false)", (json.dumps([["t1", old]]),)
        )
        admin.execute("create temp table gone (tenant_id text, id text)")
        admin.execute("insert into gone values ('t1', %s)", (new,))
        with pytest.raises((errors.InsufficientPrivilege, errors.UndefinedFunction)):
            admin.execute(
                "create trigger gone_unlink after delete on gone"
                " for each row execute function harbor._memories_successor_set_null()"
            )
        admin.execute("delete from gone")
    assert not _is_current(fresh_db, old)
    with connect(fresh_db.superuser_url) as su:
        row = su.execute("select superseded_by from harbor.memories where id = %s", (old,))
        assert row.fetchone() == (new,)
