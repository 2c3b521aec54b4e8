"""Fixtures of the Citus tests (the cluster itself: tests/citus/cluster.py)."""

from __future__ import annotations

import pytest

from tests.citus.cluster import (
    REQUIRE_ENV,
    ClusterDatabase,
    LocalCluster,
    citus_required,
    make_database,
)

__all__ = ["REQUIRE_ENV", "ClusterDatabase", "citus_required", "make_database"]


@pytest.fixture(scope="session")
def cluster_db(citus_cluster: LocalCluster) -> ClusterDatabase:
    """One distributed database for the behaviour tests (each uses its own tenants)."""
    return make_database(citus_cluster, "harbor_cluster")
