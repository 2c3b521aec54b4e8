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
with 64 (benchmarks/RESULTS.md, session 7).

The build takes about 1.5 times as long: 108 s instead of 73 s for 200,000
vectors on two cores with maintenance_work_mem at 3 GB. With the server's
default 64 MB the graph does not fit in memory and the build is far slower:
a first version of this migration took about 7 minutes for 200,000 vectors
and more than 20 for 1,000,000. So the migration raises maintenance_work_mem
to 1 GB for its own transaction (the same 200,000-vector build: 158 s, with a
test run sharing the two cores). It builds the new graph next to the old one
(writes of vectors wait; recall goes on) and swaps them at the end.
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
    op.execute(
        f"create index {name}_rebuilt on harbor.memory_embeddings"
        f" using hnsw ((embedding::public.vector({dims})) public.vector_cosine_ops)"
        f"{options} where dims = {dims}"
    )
    op.execute(f"drop index harbor.{name}")
    op.execute(f"alter index harbor.{name}_rebuilt rename to {name}")


def upgrade() -> None:
    # the graph of a large store fits in memory (the default 64 MB does not hold
    # 200,000 vectors); the memory is taken only as the graph grows
    op.execute("set local maintenance_work_mem = '1GB'")
    for dims in (384, 1536):
        _rebuild(dims, " with (m = 16, ef_construction = 128)")


def downgrade() -> None:
    op.execute("set local maintenance_work_mem = '1GB'")
    for dims in (384, 1536):
        _rebuild(dims, "")
