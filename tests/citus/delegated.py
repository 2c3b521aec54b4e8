"""What the tests of the delegated calls share: a bound login, the attack of such a login
that names another owner in a call's identity arguments, and a record of the commands the
coordinator sends to the nodes while the facade makes a call."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, errors, sql

from harbor_pg.db.connection import Connection, Database
from tests.citus.conftest import ClusterDatabase

#: the ways a bound role can make a call: in autocommit (delegated to the worker), in a
#: transaction whose SET LOCALs name the same owner (run on the coordinator), or on the
#: named tenant's worker directly
HOWS = ("autocommit", "set local", "worker")

#: what a writer of a GLOBAL memory runs first, in its transaction: the flag that they may
#: exist set (sql/citus/global.sql; the cluster refuses one written with it unset)
GLOBAL_FLAG_SET = "update harbor.global_memory_flag set may_exist = true where not may_exist"


def attacks(other_tenant: str) -> dict[str, dict[str, str]]:
    """A bound role's (bound to user ann) changes to a call's identity arguments, each of
    which names another owner than its own (carl: another user of its tenant)."""
    return {
        # the distribution argument names bob's tenant: the call goes to its worker
        "another tenant": {"tenant_id": other_tenant, "user_id": "bob", "principal_id": "bob"},
        "another tenant, own user": {"tenant_id": other_tenant},
        "another user of its tenant": {"user_id": "carl", "principal_id": "carl"},
        "no user": {"user_id": "", "principal_id": ""},
    }


@contextmanager
def bound_login(db: ClusterDatabase, role: str, tenant: str, user: str) -> Iterator[str]:
    """A login bound to ``tenant`` as ``user``, with harbor_app's rights, without SET."""
    with psycopg.connect(db.superuser_url, autocommit=True) as su:
        su.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
        su.execute(sql.SQL("create role {} login").format(sql.Identifier(role)))
        su.execute(
            sql.SQL("grant harbor_app to {} with inherit true, set false").format(
                sql.Identifier(role)
            )
        )
    with psycopg.connect(db.admin_url) as admin:
        # (SET LOCAL: Citus sends it on to the nodes that write the bindings)
        admin.execute(sql.SQL("set local harbor.tenant_id = {}").format(sql.Literal(tenant)))
        admin.execute("select harbor.bind_role(%s, %s, user_id => %s)", (role, tenant, user))
    try:
        yield role
    finally:
        with psycopg.connect(db.admin_url) as admin:
            admin.execute(sql.SQL("set local harbor.tenant_id = {}").format(sql.Literal(tenant)))
            admin.execute("select harbor.unbind_role(%s)", (role,))
        with psycopg.connect(db.superuser_url, autocommit=True) as su:
            su.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


def assert_refused(
    db: ClusterDatabase, role: str, statement: str, params: dict[str, Any], how: str
) -> None:
    """``role`` runs ``statement`` (a delegated call) with ``params`` the way ``how``
    says: refused before any row is read."""
    if how == "worker":
        node = db.node_of(str(params["tenant_id"]))
        index = [w.port for w in db.cluster.workers].index(node.port)
        url = db.worker_url(index, role)
    else:
        url = db.url_for(role)
    with psycopg.connect(url, autocommit=how == "autocommit") as conn:
        if how != "autocommit":
            for name in ("tenant_id", "project_id", "principal_id", "user_id", "session_id"):
                conn.execute(
                    sql.SQL("set local {} = {}").format(
                        sql.Identifier("harbor", name), sql.Literal(str(params[name]))
                    )
                )
        with pytest.raises(errors.InsufficientPrivilege, match="not the caller's"):
            conn.execute(statement, params)


class CommandRecorder:
    """The (port, command) of each command Citus sends to a node while recording
    (``citus.log_remote_commands``: a notice per command, naming the node)."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, str]] = []
        self.on = False

    def seen(self, diag: psycopg.errors.Diagnostic) -> None:
        found = re.search(r"on server \S+@\S+:(\d+)", diag.message_detail or "")
        text = diag.message_primary or ""
        if self.on and found and text.startswith("issuing "):
            self.sent.append((int(found.group(1)), text.removeprefix("issuing ")))

    def __enter__(self) -> CommandRecorder:
        self.on = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.on = False


class LoggedDatabase(Database):
    """The facade's database with every pooled connection (the application role's and the
    elevated role's) handing the commands Citus sends to ``recorder``."""

    def __init__(
        self, db: ClusterDatabase, recorder: CommandRecorder, *, max_size: int = 1
    ) -> None:
        logged = "-c citus.log_remote_commands=on"
        super().__init__(
            conninfo.make_conninfo(db.app_url, options=logged),
            conninfo.make_conninfo(db.admin_url, options=logged),
            min_size=1,
            max_size=max_size,
        )
        self._recorder = recorder

    @contextlib.asynccontextmanager
    async def _connection(self, pool: Any) -> AsyncIterator[Connection]:
        async with super()._connection(pool) as conn:
            if not getattr(conn, "_commands_logged", False):
                conn.add_notice_handler(self._recorder.seen)
                conn._commands_logged = True  # type: ignore[attr-defined]
            yield conn
