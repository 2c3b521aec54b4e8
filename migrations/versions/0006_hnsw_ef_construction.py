"""Build the HNSW indexes with ef_construction 128 instead of pgvector's default 64.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

Owners above the exact-scan limit are answered by a filtered walk of the HNSW
graph. With the graph built at ef_construction 64 over rows written round robin
by many owners (as a live service writes them), the walk found on average 93.3%
of a 100,000-row owner's exact top 25, and 72% for the worst question, below the
95% the recall benchmark asks for. With 128 it found 99.8% (96% at worst) at
the same query time. The same rows written one owner at a time had given 99.2%
with 64 (measured on the benchmark machine when this revision was written).

The build takes about 1.5 times as long: 108 s instead of 73 s for 200,000
vectors on two cores with maintenance_work_mem at 3 GB. A graph that does not
fit in maintenance_work_mem goes on being built on disk, many times slower:
at the server's default 64 MB a first version of this migration took about 7
minutes for 200,000 vectors, and a second one, at 1 GB, had built 59% of a
1,000,000-vector graph after 32 minutes. So the migration sizes
maintenance_work_mem for its own transaction to the graph: 1.5 times the old
graphs' size on disk (at least the server's setting). A parallel build first
takes a shared memory segment of that size, which a small /dev/shm refuses
(64 MB in a default Docker container: "could not resize shared memory
segment"); the build then runs again in one process, whose memory grows with
the graph. Measured on the benchmark machine: 60,000 vectors under
a 64 MB /dev/shm, 82 s in one process; 1,000,000 vectors (2.9 GB allowed),
756 s in parallel, 1,694 s in one process. Plan on that memory for a large
store. It builds the new graph next to the old one (writes of vectors wait;
recall goes on) and swaps them at the end.
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _rebuild(dims: int, options: str) -> None:
    # the new graph first, under another name: building takes a SHARE lock, so
    # recall goes on reading the old one; only the drop and the rename at the
    # end lock the table, for the moment until the migration commits
    name = f"memory_embeddings_hnsw_{dims}"
    create = (
        f"create index {name}_rebuilt on harbor.memory_embeddings"
        f" using hnsw ((embedding::public.vector({dims})) public.vector_cosine_ops)"
        f"{options} where dims = {dims}"
    )
    # A parallel build first takes a shared memory segment as large as
    # maintenance_work_mem, which a small /dev/shm refuses (64 MB by default in
    # a Docker container): then the graph is built by one process, in memory
    # taken as it grows. The failed attempt is rolled back to its savepoint.
    op.execute(
        "do $build$ begin"
        f" execute $q${create}$q$;"
        " exception when insufficient_resources then"
        f"  raise notice using message = 'building {name} in one process: ' || sqlerrm;"
        "  perform pg_catalog.set_config('max_parallel_maintenance_workers', '0', true);"
        f"  execute $q${create}$q$;"
        " end $build$"
    )
    op.execute(f"drop index harbor.{name}")
    op.execute(f"alter index harbor.{name}_rebuilt rename to {name}")


def _memory_for_the_graph() -> None:
    # Room for the whole graph: 1.5 times the old graphs' size on disk (the same
    # vectors and links; an element takes a little more in memory), at least the
    # server's own setting. A graph that does not fit goes on to be built on
    # disk, many times slower.
    op.execute(
        "select pg_catalog.set_config('maintenance_work_mem', (greatest("
        " pg_catalog.pg_size_bytes(pg_catalog.current_setting('maintenance_work_mem')),"
        " 1.5 * (pg_catalog.pg_relation_size('harbor.memory_embeddings_hnsw_384')"
        " + pg_catalog.pg_relation_size('harbor.memory_embeddings_hnsw_1536')))"
        " / 1024)::bigint || 'kB', true)"
    )


def upgrade() -> None:
    _memory_for_the_graph()
    for dims in (384, 1536):
        _rebuild(dims, " with (m = 16, ef_construction = 128)")


def downgrade() -> None:
    _memory_for_the_graph()
    for dims in (384, 1536):
        _rebuild(dims, "")
