"""A Citus cluster for the tests: a coordinator and two workers, started once a session.

Shared by tests/citus and tests/security (the fixture is registered in tests/conftest.py,
so both directories use the one cluster).

The nodes run from the embedded wheel's binaries with Citus preloaded, each on
a loopback port of its own (harbor_pg.testing.nodes), and are removed at the
end of the session. Without Citus in the wheel the tests skip, saying how to
install it; with ``HARBOR_REQUIRE_CITUS=1`` (set by ``.ci/run`` when it
installed Citus) a missing Citus fails them instead, so CI cannot pass
with the cluster tests skipped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from harbor_pg.db import citus, migrate
from harbor_pg.testing.nodes import (
    CITUS_HINT,
    LocalCluster,
    LocalNode,
    citus_available,
    start_cluster,
)

REQUIRE_ENV = "HARBOR_REQUIRE_CITUS"


def citus_required() -> bool:
    """Whether a missing Citus is a failure (CI) rather than a skip."""
    return os.environ.get(REQUIRE_ENV, "") == "1"


@dataclass(frozen=True)
class ClusterDatabase:
    """A distributed harbor database on the test cluster (the coordinator's URLs)."""

    cluster: LocalCluster
    name: str

    @property
    def superuser_url(self) -> str:
        return self.cluster.coordinator.url(self.name)

    @property
    def app_url(self) -> str:
        return self.cluster.coordinator.url(self.name, "harbor_app")

    @property
    def admin_url(self) -> str:
        return self.cluster.coordinator.url(self.name, "harbor_admin")

    @property
    def owner_url(self) -> str:
        return self.cluster.coordinator.url(self.name, "harbor_owner")

    def url_for(self, user: str) -> str:
        return conninfo.make_conninfo(self.superuser_url, user=user)

    def worker_url(self, index: int, user: str = "postgres") -> str:
        return self.cluster.workers[index].url(self.name, user)

    def node_of(self, tenant: str) -> LocalNode:
        """The worker holding ``tenant``'s shard of harbor.memories."""
        with psycopg.connect(self.superuser_url) as conn:
            row = conn.execute(
                "select nodeport from citus_shards s join pg_dist_shard d using (shardid)"
                " where s.table_name = 'harbor.memories'::regclass"
                "   and d.shardid"
                "       = get_shard_id_for_distribution_column('harbor.memories', %s::text)",
                (tenant,),
            ).fetchone()
        assert row is not None
        return next(w for w in self.cluster.workers if w.port == row[0])


@pytest.fixture(scope="session")
def citus_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Coordinator + two workers with Citus, for the whole session."""
    if not citus_available():
        if citus_required():
            pytest.fail(f"{REQUIRE_ENV}=1 but {CITUS_HINT}")
        pytest.skip(CITUS_HINT)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("xdg")))
    # not under pytest's base directory: another pytest run on the machine makes
    # that 0700 again, and the servers' user (when root runs the tests) must traverse it
    base = Path(tempfile.mkdtemp(prefix="harbor-citus-"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cluster = start_cluster(base / "nodes")
        try:
            yield cluster
        finally:
            cluster.remove()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def make_database(cluster: LocalCluster, name: str) -> ClusterDatabase:
    """Create ``name`` on every node, migrate it on the coordinator, add the workers
    and run ``harbor_pg.db.citus.distribute`` (what docs/citus.md tells a user to do)."""
    cluster.create_database(name)
    migrate.upgrade(cluster.coordinator.url(name, "harbor_owner"))
    cluster.add_workers(name)
    citus.distribute(cluster.coordinator.url(name))
    return ClusterDatabase(cluster=cluster, name=name)
