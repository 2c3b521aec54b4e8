"""Fixtures for raw-SQL break-out attempts.

Every row is written through the role a real caller has: narrow scopes by
``harbor_app`` with the owner's identity set (harbor.set_identity), TENANT and
GLOBAL memories by ``harbor_admin`` with its tenant set. The superuser only
creates login roles and grants them, as an operator would; bindings are made
by ``harbor_admin`` with harbor.bind_role. Each attack then runs connected as
the application role with an identity set, or as a role bound to an identity.

The attacks run against one server and against the Citus cluster of
tests/citus/cluster.py (the ``target`` of :func:`module_db` and :func:`fresh_db`);
on the cluster also as ``harbor_app`` logged in straight to a worker. There a
connection is one transaction (:func:`connect`): the identity that
harbor.set_identity() sets reaches the workers for the rest of a transaction
(harbor-pg distribute gives it SET LOCAL), never beyond, so an autocommit
connection with a session identity would see nothing there (fail-closed, tested in
tests/citus). The cluster runs every attack of the modules in ``CLUSTER_MODULES``, every variant,
for every attacker kind (``pytest_collection_modifyitems``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import conninfo, errors, sql

from harbor_pg.testing.nodes import LocalCluster
from tests.citus.cluster import ClusterDatabase, make_database
from tests.conftest import PgDatabase, PgServer, _drop_database, _new_database

#: the security modules whose attacks also run on the cluster: every one
CLUSTER_MODULES = {p.stem for p in Path(__file__).parent.glob("test_*.py")}
#: attacks of those modules that do not run on the cluster, each with its reason (open
#: work, docs/citus.md "Security suite on the cluster"); matched on the test's name
CLUSTER_KNOWN: dict[str, str] = {}
#: attacks that fail on the cluster and are open work (docs/citus.md "Security suite on
#: the cluster"): expected to fail there (strict: one that passes fails the run, so a fix
#: must take it off this list), each with its reason; matched on the test's name
CLUSTER_OPEN: dict[str, str] = {}
#: the ports of the cluster's nodes (a connection to one is one transaction)
_CLUSTER_PORTS: set[int] = set()


def on_cluster(url: str) -> bool:
    return int(conninfo.conninfo_to_dict(url).get("port") or 0) in _CLUSTER_PORTS


def show_every_shard(conn: psycopg.Connection[Any]) -> None:
    """On the cluster, make EXPLAIN ANALYZE show every shard's task: Citus shows one
    task of a multi-shard query by default (the slowest), which need not be the shard
    holding the row a test looks for."""
    if conn.info.port in _CLUSTER_PORTS:
        conn.execute("set citus.explain_all_tasks = on")


_SETS_IDENTITY = re.compile(r"set_identity|^\s*set\s", re.IGNORECASE)


class _OneTransaction(psycopg.Connection[Any]):
    """A cluster connection: one transaction (committed when its ``with`` block ends),
    each statement in a savepoint of its own, so a statement that fails undoes only
    itself and the connection goes on as an autocommit one would (the identity set by
    an earlier statement stays: it was set before the savepoint)."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if _SETS_IDENTITY.search(str(query)):
            # Citus forgets a SET LOCAL made in a savepoint once the savepoint is released
            # (the coordinator keeps it; a worker connection opened afterwards gets none)
            return super().execute(query, params, **kwargs)
        if self.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            super().execute("select")  # (opens the transaction)
        with self.transaction():
            return super().execute(query, params, **kwargs)


#: the constraint each harbor refusal names, by a phrase of its message
_REFUSALS = {'ids starting with "summary:"': "memories_summary_id"}


def refused_by(exc: psycopg.Error) -> str | None:
    """The constraint an error names. Citus forwards a worker's error without its
    constraint name (its context then says "while executing command on"): there the
    constraint is told by the message, which names the rule."""
    if exc.diag.constraint_name is not None or "while executing command on" not in (
        exc.diag.context or ""
    ):
        return exc.diag.constraint_name
    message = exc.diag.message_primary or ""
    return next((c for phrase, c in _REFUSALS.items() if phrase in message), None)


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect``, except that on the cluster the connection is one
    transaction (:class:`_OneTransaction`): the identity set in it then reaches the
    workers."""
    if on_cluster(url):
        kwargs["autocommit"] = False
        return _OneTransaction.connect(url, **kwargs)
    return psycopg.connect(url, **kwargs)


@pytest.fixture(scope="session")
def security_cluster(citus_cluster: LocalCluster) -> ClusterDatabase:
    """One distributed database for the security suite's attacks on the cluster
    (made once: a distributed database takes ~20 s; each module or test that asks
    for a fresh database gets it emptied instead)."""
    db = make_database(citus_cluster, "harbor_security")
    _CLUSTER_PORTS.update(node.port for node in citus_cluster.nodes)
    return db


def _emptied(db: ClusterDatabase) -> ClusterDatabase:
    with psycopg.connect(db.superuser_url, autocommit=True) as conn:
        conn.execute(
            "truncate harbor.memory_hits, harbor.memory_embeddings, harbor.memories,"
            " harbor.messages,"
            " harbor.working_state, harbor.session_state, harbor.role_bindings"
        )
    return db


def _server_or_cluster(request: pytest.FixtureRequest, pg_server: PgServer) -> Iterator[Any]:
    """What module_db and fresh_db yield (they differ only in scope)."""
    if request.param == "cluster":
        yield _emptied(request.getfixturevalue("security_cluster"))
        return
    db = _new_database(pg_server)
    yield db
    _drop_database(pg_server, db.name)


@pytest.fixture(scope="module", params=["server", "cluster"])
def module_db(request: pytest.FixtureRequest, pg_server: PgServer) -> Iterator[Any]:
    """A migrated database for one module: on one server, or the cluster's (emptied)."""
    yield from _server_or_cluster(request, pg_server)


@pytest.fixture(params=["server", "cluster"])
def fresh_db(request: pytest.FixtureRequest, pg_server: PgServer) -> Iterator[Any]:
    """A migrated database for one test: on one server, or the cluster's (emptied)."""
    yield from _server_or_cluster(request, pg_server)


H = "0" * 63

# (tenant, scope, project, user, session, run, content)
MEMORIES = [
    ("t1", "user", "", "u1", "", "", "mine: u1 user fact"),
    ("t1", "session", "", "u1", "s1", "", "mine: u1 s1 session fact"),
    ("t1", "run", "p1", "u1", "s1", "r1", "mine: u1 s1 r1 run fact"),
    ("t1", "project", "p1", "", "", "", "mine: p1 project fact"),
    ("t1", "tenant", "", "", "", "", "mine: t1 tenant fact"),
    ("", "global", "", "", "", "", "mine: global fact"),
    ("t2", "tenant", "", "", "", "", "secret: t2 tenant fact"),
    ("t2", "user", "", "u1", "", "", "secret: t2 user u1 fact"),
    ("t1", "project", "p2", "", "", "", "secret: p2 project fact"),
    ("t1", "user", "", "u2", "", "", "secret: u2 user fact"),
    ("t1", "session", "", "u1", "s2", "", "secret: u1 s2 session fact"),
    ("t1", "session", "", "u2", "s1", "", "secret: u2 s1 session fact"),
    ("t1", "run", "p1", "u1", "s1", "r2", "secret: u1 s1 r2 run fact"),
]
MESSAGES = [
    ("t1", "u1", "s1", "mine: hello"),
    ("t1", "u1", "s2", "secret: other session"),
    ("t1", "u2", "s1", "secret: other user"),
    ("t2", "u1", "s1", "secret: other tenant"),
]
WORKING = [
    ("t1", "p1", "u1", "s1", "r1", "mine"),
    ("t1", "p1", "u1", "s1", "r2", "secret-run"),
    ("t1", "p1", "u1", "s2", "r1", "secret-session"),
    ("t1", "p1", "u2", "s1", "r1", "secret-user"),
    ("t2", "p1", "u1", "s1", "r1", "secret-tenant"),
]

IDENTITY = dict(tenant_id="t1", project_id="p1", principal_id="u1", session_id="s1", run_id="r1")
# bound to the same identity as IDENTITY's tenant, project and user: it picks session and run
BOUND_ROLE = "harbor_test_analyst"
# one role per kind of binding: (tenant, project, user)
BOUND_ROLES = {
    "harbor_test_bound_tenant": ("t1", None, None),
    "harbor_test_bound_project": ("t1", "p1", None),
    "harbor_test_bound_user": ("t1", None, "u1"),
    BOUND_ROLE: ("t1", "p1", "u1"),
}


def writer(
    db: PgDatabase, tenant: str, scope: str, project: str, user: str, session: str, run: str
) -> psycopg.Connection[Any]:
    """A connection as the role that may write a row of this owner, its identity set.

    GLOBAL and TENANT rows: ``harbor_admin`` (GLOBAL rows belong to no tenant, so any
    tenant will do). The narrow scopes: ``harbor_app`` as the row's own identity, the
    principal being the row's user (none for a PROJECT row).
    """
    if scope in ("global", "tenant"):
        conn = connect(db.admin_url, autocommit=True)
        conn.execute("select harbor.set_identity(%s)", (tenant or "t1",))
        if scope == "global":
            note_global(db, conn)
        return conn
    conn = connect(db.app_url, autocommit=True)
    conn.execute(
        "select harbor.set_identity(%s, %s, %s, null, %s, %s)",
        (tenant, project or None, user or None, session or None, run or None),
    )
    return conn


def note_global(db: PgDatabase, conn: psycopg.Connection[Any]) -> None:
    """What a writer of a GLOBAL memory does first on the cluster, in its transaction: set
    the flag that global memories may exist (sql/citus/global.sql; the cluster refuses one
    written with it unset). On one server, nothing."""
    if isinstance(db, ClusterDatabase):
        conn.execute("update harbor.global_memory_flag set may_exist = true where not may_exist")


def insert_memory(conn: psycopg.Connection[Any], columns: Mapping[str, Any]) -> str:
    """Insert one memory with these columns (the principal is the caller's); its id."""
    names = list(columns)
    stmt = sql.SQL(
        "insert into harbor.memories ({}, principal_id) values ({},"
        " coalesce(harbor.caller_principal(), '')) returning id"
    ).format(
        sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.Placeholder(n) for n in names),
    )
    row = conn.execute(stmt, dict(columns)).fetchone()
    assert row is not None
    return str(row[0])


def insert_vector(
    conn: psycopg.Connection[Any], memory: Mapping[str, Any], model_id: str, dims: int, vector: str
) -> None:
    """Insert a vector of ``memory`` (its owner fields copied, as every writer does)."""
    conn.execute(
        "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,"
        " scope, project_id, user_id, session_id, run_id)"
        " values (%(tenant_id)s, %(id)s, %(model_id)s, %(dims)s, %(vector)s::vector, %(scope)s,"
        " %(project_id)s, %(user_id)s, %(session_id)s, %(run_id)s)",
        {
            "project_id": "",
            "user_id": "",
            "session_id": "",
            "run_id": "",
            **memory,
            "model_id": model_id,
            "dims": dims,
            "vector": vector,
        },
    )


def write_memory(
    db: PgDatabase,
    row: tuple[str, str, str, str, str, str, str],
    content_hash: str,
    *,
    vector: tuple[str, int, str] | None = None,
    **columns: Any,
) -> str:
    """Write one MEMORIES-shaped row (and optionally a vector of it) as its writer."""
    t, scope, p, u, s, r, content = row
    memory = dict(
        tenant_id=t,
        scope=scope,
        project_id=p,
        user_id=u,
        session_id=s,
        run_id=r,
        content=content,
        content_hash=content_hash,
        **columns,
    )
    with writer(db, t, scope, p, u, s, r) as conn:
        memory["id"] = insert_memory(conn, memory)
        if vector is not None:
            insert_vector(conn, memory, *vector)
    return str(memory["id"])


def grant_option(db: PgDatabase) -> LiteralString:
    """How the operator grants a harbor-pg role to a login: on Citus without SET
    (docs/citus.md: a bound role that can SET ROLE harbor_app would reach the workers as
    harbor_app, so the bindings' trigger there refuses to bind one)."""
    return " with inherit true, set false" if isinstance(db, ClusterDatabase) else ""


def set_role_refused_on_cluster(db: PgDatabase, login: str, role: str) -> bool:
    """On the cluster a bound login holds harbor-pg roles without SET (:func:`grant_option`,
    docs/citus.md): assert there that its ``SET ROLE role`` is refused, and say so (the
    attack ends there); on one server False, and the attack goes on with the SET ROLE."""
    if not grant_option(db):
        return False
    with (
        connect(db.url_for(login), autocommit=True) as conn,
        pytest.raises(errors.InsufficientPrivilege, match="permission denied to set role"),
    ):
        conn.execute(sql.SQL("set role {}").format(sql.Identifier(role)))
    return True


def create_login_roles(db: PgDatabase, *roles: str) -> None:
    """Login roles granted harbor_app (the operator's part: the superuser)."""
    with psycopg.connect(db.superuser_url, autocommit=True) as conn:
        for role in roles:
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("create role {} login").format(sql.Identifier(role)))
            conn.execute(
                sql.SQL("grant harbor_app to {}").format(sql.Identifier(role))
                + sql.SQL(grant_option(db))
            )
            conn.execute(
                sql.SQL("grant connect on database {} to {}").format(
                    sql.Identifier(db.name), sql.Identifier(role)
                )
            )


def bind(db: PgDatabase, role: str, tenant: str, project: str | None, user: str | None) -> None:
    """Bind ``role`` as the tenant's administrator does."""
    with connect(db.admin_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity(%s)", (tenant,))
        conn.execute(
            "select harbor.bind_role(%s, %s, project_id => %s, user_id => %s)",
            (role, tenant, project, user),
        )


def drop_roles(db: PgDatabase, *roles: str) -> None:
    with psycopg.connect(db.superuser_url, autocommit=True) as conn:
        for role in roles:
            conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


def seed(db: PgDatabase) -> None:
    for i, row in enumerate(MEMORIES):
        write_memory(db, row, f"{i:064x}", vector=("m", 3, "[1,0,0]"))
    for t, u, s, content in MESSAGES:
        with writer(db, t, "session", "", u, s, "") as conn:
            conn.execute(
                "insert into harbor.messages (tenant_id, user_id, session_id, principal_id, role,"
                " content) values (%s, %s, %s, %s, 'user', %s)",
                (t, u, s, u, content),
            )
    for t, p, u, s, r, tag in WORKING:
        with writer(db, t, "run", p, u, s, r) as conn:
            conn.execute(
                "insert into harbor.working_state (tenant_id, project_id, user_id, session_id,"
                " run_id, principal_id, state)"
                " values (%s,%s,%s,%s,%s,%s, jsonb_build_object('tag', %s::text))",
                (t, p, u, s, r, u, tag),
            )
    create_login_roles(db, *BOUND_ROLES)
    for role, (tenant, project, user) in BOUND_ROLES.items():
        bind(db, role, tenant, project, user)


@pytest.fixture(scope="module")
def seeded(module_db: PgDatabase) -> Iterator[PgDatabase]:
    seed(module_db)
    yield module_db
    drop_roles(module_db, *BOUND_ROLES)


@pytest.fixture(params=["app", "bound", "worker"])
def attacker(
    request: pytest.FixtureRequest, seeded: PgDatabase
) -> Iterator[psycopg.Connection[Any]]:
    """A raw connection as the app role (identity t1/p1/u1/s1/r1) or as the role bound to
    t1/p1/u1 (which picks session s1 and run r1); on the cluster also the app role
    logged in straight to a worker (the one without t1's shard), which the
    single server has none of."""
    user = "harbor_app" if request.param != "bound" else BOUND_ROLE
    url = seeded.url_for(user)
    if request.param == "worker":
        if not isinstance(seeded, ClusterDatabase):
            pytest.fail("a worker attacker is for the cluster (deselected on one server)")
        other = next(w for w in seeded.cluster.workers if w != seeded.node_of("t1"))
        url = other.url(seeded.name, user)
    conn = connect(url, autocommit=True)
    if request.param != "bound":
        conn.execute(
            "select harbor.set_identity(%(tenant_id)s, %(project_id)s, %(principal_id)s,"
            " null, %(session_id)s, %(run_id)s)",
            IDENTITY,
        )
    else:
        # a bound role names only what its binding leaves open
        conn.execute("select harbor.set_identity('t1', session_id => 's1', run_id => 'r1')")
    try:
        yield conn
    finally:
        conn.close()


def _target(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for name in ("module_db", "fresh_db"):
        if name in callspec.params:
            return str(callspec.params[name])
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The cluster runs every attack of ``CLUSTER_MODULES`` (every variant, every
    attacker kind), and the worker attacker only there."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        if not item.nodeid.startswith("tests/security/"):
            keep.append(item)
            continue
        target = _target(item)
        callspec = getattr(item, "callspec", None)
        attacker = callspec.params.get("attacker") if callspec is not None else None
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        if target != "cluster":
            (dropped if attacker == "worker" else keep).append(item)
            continue
        name = item.nodeid.split("::", 1)[-1]
        known = any(name.startswith(k) for k in CLUSTER_KNOWN)
        if module not in CLUSTER_MODULES or known:
            dropped.append(item)
            continue
        reason = next((r for k, r in CLUSTER_OPEN.items() if name.startswith(k)), None)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
