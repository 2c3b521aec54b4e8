"""The SECURITY DEFINER candidate functions return exactly what the policies allow.

``harbor._dense_candidates`` and ``harbor._lexical_candidates`` run as
``harbor_search`` (BYPASSRLS) so that the GIN and HNSW indexes stay usable.
For every identity shape, both code paths of each function (exact scan of the
caller's rows, and the index walk) are compared with a plain SELECT under
row-level security on the same connection: the id sets must be equal.
Every row is written by its owner's role (tests/security/conftest.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.range import Range

from tests.conftest import PgDatabase
from tests.security.conftest import (
    MEMORIES,
    bind,
    connect,
    drop_roles,
    grant_option,
    on_cluster,
    write_memory,
)

Conn = psycopg.Connection[Any]

LOGIN_ROLE = "harbor_test_recall_login"
BOUND_ROLE = "harbor_test_recall_bound"
ALL_SCOPES = "{global,tenant,project,user,session,run}"
DIMS = 384


def _vector(rng: random.Random) -> str:
    return "[" + ",".join(f"{rng.gauss(0, 1):.5f}" for _ in range(DIMS)) + "]"


@pytest.fixture(scope="module")
def recall_db(module_db: PgDatabase) -> Iterator[PgDatabase]:
    rng = random.Random(3)
    now = datetime.now(UTC)
    for i, row in enumerate(MEMORIES):
        # distinct ranking columns per row: a leg that mixed rows up would show
        t, scope, p, u, s, r, content = row
        write_memory(
            module_db,
            (t, scope, p, u, s, r, content + " shared words"),
            f"{i:064x}",
            vector=("m384", DIMS, _vector(rng)),
            importance=(i % 10) / 10,
            entity_ids=[f"e{i}-{k}" for k in range(i % 3)],
            memory_type=("fact", "preference", "episode")[i % 3],
            valid=Range(now - timedelta(hours=i + 1), None, "[)"),
        )
    # a closed (superseded) row and a rolling summary: never candidates now
    write_memory(
        module_db,
        ("t1", "user", "", "u1", "", "", "mine: closed fact shared words"),
        "c" * 64,
        vector=("m384", DIMS, _vector(rng)),
        valid=Range(now - timedelta(days=2), now - timedelta(days=1), "[)"),
    )
    write_memory(
        module_db,
        ("t1", "session", "", "u1", "s1", "", "mine: summary shared words"),
        "d" * 64,
        vector=("m384", DIMS, _vector(rng)),
        memory_type="summary",
    )
    # a nologin role bound to t1/u1, taken on with SET ROLE by a login role
    with connect(module_db.superuser_url, autocommit=True) as conn:
        for role in (LOGIN_ROLE, BOUND_ROLE):
            conn.execute(f"drop role if exists {role}")
        conn.execute(f"create role {BOUND_ROLE} nologin")
        conn.execute(f"grant harbor_app to {BOUND_ROLE}" + grant_option(module_db))
        conn.execute(f"create role {LOGIN_ROLE} login")
        conn.execute(f"grant harbor_app, {BOUND_ROLE} to {LOGIN_ROLE}")
        conn.execute(f'grant connect on database "{module_db.name}" to {LOGIN_ROLE}')
    bind(module_db, BOUND_ROLE, "t1", None, "u1")
    yield module_db
    drop_roles(module_db, LOGIN_ROLE, BOUND_ROLE)


# (tenant, project, principal, session, run): every shape an identity can take
IDENTITIES = [
    ("t1", "p1", "u1", "s1", "r1"),
    ("t1", None, "u1", "s1", None),
    ("t1", "p1", "u1", None, None),
    ("t1", "p2", "u2", "s1", "r2"),
    ("t1", None, None, None, None),
    ("t2", "p1", "u1", "s1", "r1"),
    ("t3", None, "u9", "s9", None),
]


def _set_identity(conn: Conn, identity: tuple[str | None, ...]) -> None:
    tenant, project, principal, session, run = identity
    conn.execute(
        "select harbor.set_identity(%s, %s, %s, null, %s, %s)",
        (tenant, project, principal, session, run),
    )


def _visible_ids(conn: Conn) -> set[str]:
    rows = conn.execute(
        "select id from harbor.memories where valid @> now() and memory_type <> 'summary'"
    ).fetchall()
    return {r[0] for r in rows}


def _lexical_ids(conn: Conn, scan_limit: int, term_limit: int) -> set[str]:
    rows = conn.execute(
        "select memory_id from harbor._lexical_candidates('shared words', %s, now(), 1000, %s, %s)",
        (ALL_SCOPES, scan_limit, term_limit),
    ).fetchall()
    return {r[0] for r in rows}


def _dense_ids(conn: Conn, exact_limit: int) -> set[str]:
    probe = _vector(random.Random(11))
    rows = conn.execute(
        "select memory_id from harbor._dense_candidates(%s::vector, 'm384', %s, now(), 1000, %s)",
        (probe, ALL_SCOPES, exact_limit),
    ).fetchall()
    return {r[0] for r in rows}


_SMALL = (
    "harbor._lexical_candidates(%s, %s, now(), 1000, 5000, 100000,"
    " p_embedding => %s::vector, p_model_id => 'm384', p_merge_limit => 100000)"
)


def _small_ids(conn: Conn, leg: str) -> set[str]:
    """The candidates of one leg (lexical or dense) when the lexical leg ranks both over
    a small owner's rows (limits that make every owner small)."""
    rows = conn.execute(
        f"select memory_id, {leg}_rank from {_SMALL}",
        ("shared words", ALL_SCOPES, _vector(random.Random(11))),
    ).fetchall()
    if on_cluster(conn.info.dsn):
        # the legs run apart on the cluster (harbor_pg.db.citus_rewrites): the lexical
        # leg's rows only, and no row saying it ranked the dense leg's
        assert all(r[0] is not None for r in rows)
        assert leg == "lexical" or all(r[1] is None for r in rows)
        return _visible_ids(conn) if leg == "dense" else {r[0] for r in rows}
    assert sum(1 for r in rows if r[0] is None) == 1  # (it ranked the dense leg's)
    return {r[0] for r in rows if r[0] is not None and r[1] is not None}


# each code path of each SECURITY DEFINER function is its own test
PATHS: dict[str, Callable[[Conn], set[str]]] = {
    # the three ways of the lexical leg: the owner scan, the tenant-wide GIN
    # index (a large owner), the owner-term lookup (few matches; here with a scan
    # limit of 0, so that it runs for an owner of any size)
    "lexical-scan": lambda conn: _lexical_ids(conn, 5000, 0),
    "lexical-index": lambda conn: _lexical_ids(conn, 0, 0),
    "lexical-lookup": lambda conn: _lexical_ids(conn, 0, 100000),
    "dense-exact": lambda conn: _dense_ids(conn, 5000),
    "dense-hnsw": lambda conn: _dense_ids(conn, 0),
    # a small owner's both legs at once, in the lexical leg
    "small-lexical": lambda conn: _small_ids(conn, "lexical"),
    "small-dense": lambda conn: _small_ids(conn, "dense"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("identity", IDENTITIES, ids=lambda i: "/".join(x or "-" for x in i))
def test_candidates_equal_policy_rows_for_every_identity(
    recall_db: PgDatabase, identity: tuple[str | None, ...], path: str
) -> None:
    with connect(recall_db.app_url, autocommit=True) as conn:
        _set_identity(conn, identity)
        expected = _visible_ids(conn)
        assert expected, "every identity sees at least the global memory"
        assert PATHS[path](conn) == expected


_RANKING_COLUMNS = "scope::text, memory_type::text, importance, content_hash, entity_ids"


_CARRYING = {
    "dense-exact": (
        "harbor._dense_candidates(%s::vector, 'm384', %s, now(), 1000, 5000)",
        lambda: _vector(random.Random(11)),
    ),
    "dense-hnsw": (
        "harbor._dense_candidates(%s::vector, 'm384', %s, now(), 1000, 0)",
        lambda: _vector(random.Random(11)),
    ),
    "lexical-scan": ("harbor._lexical_candidates(%s, %s, now(), 1000, 5000, 0)", lambda: "shared"),
    "lexical-index": ("harbor._lexical_candidates(%s, %s, now(), 1000, 0, 0)", lambda: "shared"),
    "lexical-lookup": (
        "harbor._lexical_candidates(%s, %s, now(), 1000, 5000, 100000)",
        lambda: "shared",
    ),
    "small": (
        "(select %s::vector as v, %s::harbor.memory_scope[] as sc) a,"
        " harbor._lexical_candidates('shared', a.sc, now(), 1000, 5000, 100000,"
        " p_embedding => a.v, p_model_id => 'm384') where memory_id is not null",
        lambda: _vector(random.Random(11)),
    ),
}


@pytest.mark.parametrize("path", _CARRYING)
@pytest.mark.parametrize("identity", IDENTITIES, ids=lambda i: "/".join(x or "-" for x in i))
def test_ranking_columns_are_the_policy_rows_columns(
    recall_db: PgDatabase, identity: tuple[str | None, ...], path: str
) -> None:
    """The columns each leg carries for ranking are those a plain SELECT under
    the policies reads for the same rows, and nothing of any other row."""
    call, probe = _CARRYING[path]
    with connect(recall_db.app_url, autocommit=True) as conn:
        _set_identity(conn, identity)
        expected = {
            r[0]: r[1:]
            for r in conn.execute(
                f"select id, {_RANKING_COLUMNS}, lower(valid) from harbor.memories"
                " where valid @> now() and memory_type <> 'summary'"
            ).fetchall()
        }
        got = {
            r[0]: r[1:]
            for r in conn.execute(
                f"select memory_id, {_RANKING_COLUMNS}, valid_from from {call}",
                (probe(), ALL_SCOPES),
            ).fetchall()
        }
    # every visible memory holds "shared": both legs return all of them (and the
    # lexical leg ranking both for a small owner returns each once)
    assert got == expected


@pytest.mark.parametrize("path", PATHS)
def test_no_identity_sees_only_global(recall_db: PgDatabase, path: str) -> None:
    with connect(recall_db.app_url, autocommit=True) as conn:
        expected = _visible_ids(conn)
        assert len(expected) == 1
        assert PATHS[path](conn) == expected


@pytest.mark.parametrize("path", PATHS)
def test_set_role_to_a_bound_role_cannot_be_spoofed_by_settings(
    recall_db: PgDatabase, path: str
) -> None:
    """SET ROLE to a bound role: inside the definer functions the binding still wins."""
    with connect(recall_db.url_for(LOGIN_ROLE), autocommit=True) as conn:
        conn.execute(f"set role {BOUND_ROLE}")
        if on_cluster(recall_db.app_url):
            # Citus opens its worker connections as the current user, which this NOLOGIN
            # role cannot be: refused, before any row is read (docs/citus.md)
            with pytest.raises(psycopg.errors.ConnectionFailure, match="not permitted to log in"):
                conn.execute("select count(*) from harbor.memories")
            return
        for name, value in [("tenant_id", "t2"), ("user_id", "u1"), ("principal_id", "u1")]:
            conn.execute("select set_config(%s, %s, false)", (f"harbor.{name}", value))
        expected = _visible_ids(conn)
        assert all(not c.startswith("secret") for c in _contents(conn, expected))
        assert PATHS[path](conn) == expected


@pytest.mark.parametrize("path", PATHS)
def test_bound_login_role_ignores_a_foreign_identity(recall_db: PgDatabase, path: str) -> None:
    with connect(recall_db.url_for(LOGIN_ROLE), autocommit=True) as conn:
        # unbound login role: settings decide, exactly as for the policies
        conn.execute("select harbor.set_identity('t2', principal_id => 'u1')")
        expected = _visible_ids(conn)
        assert PATHS[path](conn) == expected


def test_candidate_functions_are_definers_owned_by_the_search_role(recall_db: PgDatabase) -> None:
    with connect(recall_db.superuser_url) as conn:
        rows = conn.execute(
            "select p.proname, pg_get_userbyid(p.proowner), p.prosecdef, p.proconfig"
            " from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
            " where n.nspname = 'harbor' and p.proname like '%%_candidates'"
        ).fetchall()
    assert {r[0] for r in rows} == {"_dense_candidates", "_lexical_candidates"}
    for _name, owner, definer, config in rows:
        assert owner == "harbor_search"
        # (on the cluster they run as the caller: Citus opens worker connections as the
        # current user, which the NOLOGIN owner cannot be; the shards' policies then hold
        # them to the caller's rows, tests/security/test_isolation.py on the cluster)
        assert definer == (not on_cluster(recall_db.app_url))
        assert "search_path=pg_catalog, pg_temp" in config


@pytest.mark.parametrize("identity", IDENTITIES, ids=lambda i: "/".join(x or "-" for x in i))
def test_substring_fallback_returns_exactly_the_policy_rows(
    recall_db: PgDatabase, identity: tuple[str | None, ...]
) -> None:
    """recall() without an embedding, for text that is no word of any memory but a
    substring of every one: the fallback returns what the policies allow, no more."""
    with connect(recall_db.app_url, autocommit=True) as conn:
        _set_identity(conn, identity)
        expected = _visible_ids(conn)
        rows = conn.execute(
            "select id, substring_match from harbor.recall('ared wor', scopes => %s,"
            " top_k => 1000)",
            (ALL_SCOPES,),
        ).fetchall()
    assert rows and all(match for _id, match in rows)
    assert {r[0] for r in rows} == expected


def test_substring_fallback_reads_as_the_invoker(recall_db: PgDatabase) -> None:
    """The fallback's own function reads under the caller's policies: never a definer."""
    with connect(recall_db.superuser_url) as conn:
        row = conn.execute(
            "select pg_get_userbyid(p.proowner), p.prosecdef from pg_proc p"
            " where p.oid = 'harbor._substring_matches'::regproc"
        ).fetchone()
    assert row is not None
    owner, definer = row
    assert not definer
    assert owner != "harbor_search"


def _contents(conn: Conn, ids: set[str]) -> list[str]:
    rows = conn.execute("select content from harbor.memories where id = any(%s)", (list(ids),))
    return [r[0] for r in rows.fetchall()]


# The legs' twins a delegated recall runs on its tenant's worker (harbor._recall_twin,
# sql/citus/recall.sql): temporary functions of the connection on the tenant's shard
# tables, SECURITY DEFINER as the legs are on one server, over the scopes of the caller's
# tenant (a recall with the global scope is not delegated). Each path of each, called on
# the worker that holds the identity's tenant, returns exactly the rows of that tenant
# the policies give the caller there.
_TENANT_SCOPES = "{tenant,project,user,session,run}"
ON_SHARD_PATHS = {
    "lexical-scan": ("_lexical_candidates", "'shared words', %s, now(), 1000, 5000, 0"),
    "lexical-index": ("_lexical_candidates", "'shared words', %s, now(), 1000, 0, 0"),
    "lexical-lookup": ("_lexical_candidates", "'shared words', %s, now(), 1000, 0, 100000"),
    "dense-exact": ("_dense_candidates", "%s::vector, 'm384', %s, now(), 1000, 5000"),
    "dense-hnsw": ("_dense_candidates", "%s::vector, 'm384', %s, now(), 1000, 0"),
}


def _on_tenants_worker(db: Any, tenant: str, role: str) -> Conn:
    node = db.node_of(tenant)
    index = [w.port for w in db.cluster.workers].index(node.port)
    return connect(db.worker_url(index, role), autocommit=True)


def _twin_ids(conn: Conn, tenant: str, path: str) -> set[str]:
    """The rows of ``path``'s twin, made for ``tenant``'s shard in this connection."""
    leg, args = ON_SHARD_PATHS[path]
    [(suffix,)] = conn.execute("select harbor._recall_twin(%s)", (tenant,)).fetchall()
    values: tuple[str, ...] = (_TENANT_SCOPES,)
    if leg == "_dense_candidates":
        values = (_vector(random.Random(11)), _TENANT_SCOPES)
    name = f"pg_temp.{leg}_on_shard_{suffix}"
    rows = conn.execute(f"select memory_id from {name}({args})", values).fetchall()
    return {r[0] for r in rows}


def _tenant_policy_ids(conn: Conn, tenant: str) -> set[str]:
    rows = conn.execute(
        "select id from harbor.memories where tenant_id = %s and valid @> now()"
        " and memory_type <> 'summary'",
        (tenant,),
    ).fetchall()
    return {r[0] for r in rows}


@pytest.mark.parametrize("path", ON_SHARD_PATHS)
@pytest.mark.parametrize("identity", IDENTITIES, ids=lambda i: "/".join(x or "-" for x in i))
def test_the_legs_twins_on_the_tenants_worker_return_the_policy_rows(
    recall_db: Any, identity: tuple[str | None, ...], path: str
) -> None:
    if not on_cluster(recall_db.app_url):
        # one server has no twins: a recall runs the legs themselves
        with connect(recall_db.superuser_url) as conn:
            found = conn.execute(
                "select count(*) from pg_proc where proname like '%%\\_twin%%'"
            ).fetchone()
        assert found == (0,)
        return
    tenant = str(identity[0])
    with _on_tenants_worker(recall_db, tenant, "harbor_app") as conn:
        _set_identity(conn, identity)
        expected = _tenant_policy_ids(conn, tenant)
        assert _twin_ids(conn, tenant, path) == expected


@pytest.mark.parametrize("path", ON_SHARD_PATHS)
def test_the_legs_twins_keep_a_bound_role_to_its_binding(recall_db: Any, path: str) -> None:
    """SET ROLE to a role bound to t1/u1, on the worker that holds tenant t1's rows, with
    settings naming t2: the twins cannot be made for t2's shard, and those of t1's read as
    the binding, t1's rows of user u1 and of t1."""
    if not on_cluster(recall_db.app_url):
        return  # (one server: test_set_role_to_a_bound_role_cannot_be_spoofed_by_settings)
    with _on_tenants_worker(recall_db, "t1", LOGIN_ROLE) as conn:
        conn.execute(f"set role {BOUND_ROLE}")
        for name, value in [("tenant_id", "t2"), ("user_id", "u1"), ("principal_id", "u1")]:
            conn.execute("select set_config(%s, %s, false)", (f"harbor.{name}", value))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not the caller's tenant"):
            conn.execute("select harbor._recall_twin('t2')")
        got = _twin_ids(conn, "t1", path)
    with _on_tenants_worker(recall_db, "t1", "harbor_app") as conn:
        _set_identity(conn, ("t1", None, "u1", None, None))
        expected = _tenant_policy_ids(conn, "t1")
    assert expected
    assert got == expected
