"""harbor.promote_vector_owner is SECURITY DEFINER (it updates in_graph, which its
callers may not): it must do nothing for an owner key the caller cannot see, whatever
the caller claims about the key's size."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.conftest import PgDatabase
from tests.security.conftest import on_cluster

Conn = psycopg.Connection[Any]

_PROMOTE = (
    "select harbor.promote_vector_owner('t1', 'm', %s::harbor.memory_scope, %s, '', '', '',"
    " p_new => 1000000)"
)
_IN_GRAPH = (
    "select count(*) filter (where in_graph), count(*) from harbor.memory_embeddings"
    " where tenant_id = 't1' and model_id = 'm' and scope = %s::harbor.memory_scope"
    " and user_id = %s and project_id = '' and session_id = '' and run_id = ''"
)


def test_a_caller_cannot_promote_a_key_it_cannot_see(attacker: Conn, seeded: PgDatabase) -> None:
    with psycopg.connect(seeded.superuser_url) as su:
        in_graph, victims = su.execute(_IN_GRAPH, ("user", "u2")).fetchone()  # type: ignore[misc]
    assert victims > 0 and in_graph == 0
    # another user's key: nothing, though the caller says it is past the threshold
    assert attacker.execute(_PROMOTE, ("user", "u2")).fetchone() == (0,)
    with psycopg.connect(seeded.superuser_url) as su:
        assert su.execute(_IN_GRAPH, ("user", "u2")).fetchone() == (0, victims)
    # the caller's own key (the control: the function does promote what it may see),
    # rolled back so that the module's rows stay as seeded; on the cluster it promotes
    # nothing at all (every vector a save writes is in the graph there, docs/citus.md)
    with attacker.transaction():
        [(promoted,)] = attacker.execute(_PROMOTE, ("user", "u1")).fetchall()
        if on_cluster(seeded.superuser_url):
            assert promoted == 0
        else:
            assert promoted > 0
        raise psycopg.Rollback()


_GRAPH = (
    "select in_graph, promote from harbor.vector_owner_graph('t1', 'm',"
    " %s::harbor.memory_scope, %s, '', '', '', %s)"
)


def test_a_caller_learns_nothing_of_a_key_it_cannot_see(attacker: Conn, seeded: PgDatabase) -> None:
    """harbor.vector_owner_graph reads as harbor_search: for another user's key it answers
    (false, false) whatever that key holds and whatever the caller claims to add, so it
    neither tells the key's size nor puts anything in the graph; for the caller's own
    key (the control) the same call says the key's new vectors go in the graph."""
    with psycopg.connect(seeded.superuser_url) as su:
        _, victims = su.execute(_IN_GRAPH, ("user", "u2")).fetchone()  # type: ignore[misc]
    assert victims > 0
    for claimed in (0, 1, 1_000_000):
        assert attacker.execute(_GRAPH, ("user", "u2", claimed)).fetchone() == (False, False)
    own = attacker.execute(_GRAPH, ("user", "u1", 1_000_000)).fetchone()
    assert own is not None and own[0] is True
