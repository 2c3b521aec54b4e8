"""The HNSW graph holds only the vectors of owner keys large enough to walk it.

Revision ID: 0018
Revises: 0016
Create Date: 2026-12-02

Inserting a vector into the HNSW graph was about 95% of a write's cost
(benchmarks/RESULTS.md, ingest). Recall's dense leg walks the graph only for a
caller who sees more vectors than its exact-scan limit (at least 5,000, or 2%
of all vectors); below that it scans the caller's vectors exactly and never
reads the graph. So the graph need not hold the rows of a small owner.

This revision adds ``memory_embeddings.in_graph`` (false by default) and builds
the two HNSW indexes again as partial indexes ``where dims = N and in_graph``.
A row is in the graph when its owner key (tenant, model, scope, user, project,
session, run) holds at least 4,096 vectors (``harbor.graph_min_vectors()``):
the writes set it from then on and promote the key's older rows
(``harbor.promote_vector_owner``). The dense leg's walk reads the graph and
scans any of the caller's owner keys with rows outside it exactly beside it,
so its answers are those of a graph over every row. The owner index gains
``in_graph`` as its last column (whether a key has rows outside the graph: one
descent).

Backfill: the owner keys that already hold 4,096 vectors or more are put in
the graph (their rows updated), then the graphs are built over those rows
only. A store of 100,000 or 1,000,000 memories over 1,000 owners has no such
key: the upgrade drops the graphs, rebuilds the owner index (seconds) and
builds two empty graphs. A store with large owners builds a graph over their
rows, as migration 0006 did over all rows (about 100 s for 200,000 vectors on
two cores). Writes of vectors wait for the upgrade; recall goes on until the
graphs are dropped, then waits.
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_MIN_VECTORS = 4096


def _hnsw(dims: int, where: str) -> None:
    # (as in 0006: a parallel build that /dev/shm refuses runs again in one process)
    create = (
        f"create index memory_embeddings_hnsw_{dims} on harbor.memory_embeddings"
        f" using hnsw ((embedding::public.vector({dims})) public.vector_cosine_ops)"
        f" with (m = 16, ef_construction = 128) where {where}"
    )
    op.execute(
        "do $build$ begin"
        f" execute $q${create}$q$;"
        " exception when insufficient_resources then"
        f"  raise notice using message = 'building the {dims} graph in one process: ' || sqlerrm;"
        "  perform pg_catalog.set_config('max_parallel_maintenance_workers', '0', true);"
        f"  execute $q${create}$q$;"
        " end $build$"
    )


def upgrade() -> None:
    op.execute("drop index harbor.memory_embeddings_hnsw_384")
    op.execute("drop index harbor.memory_embeddings_hnsw_1536")
    op.execute("drop index harbor.memory_embeddings_owner_idx")
    op.execute(
        "alter table harbor.memory_embeddings add column in_graph boolean not null default false"
    )
    # the table forces row-level security on its owner too: lifted for the backfill
    op.execute("alter table harbor.memory_embeddings no force row level security")
    op.execute(
        f"""
update harbor.memory_embeddings e set in_graph = true
  from (select tenant_id, model_id, scope, user_id, project_id, session_id, run_id
          from harbor.memory_embeddings
         group by tenant_id, model_id, scope, user_id, project_id, session_id, run_id
        having count(*) >= {_MIN_VECTORS}) k
 where e.tenant_id = k.tenant_id and e.model_id = k.model_id and e.scope = k.scope
   and e.user_id = k.user_id and e.project_id = k.project_id
   and e.session_id = k.session_id and e.run_id = k.run_id
"""
    )
    op.execute("alter table harbor.memory_embeddings force row level security")
    op.execute(
        "create index memory_embeddings_owner_idx on harbor.memory_embeddings"
        " (tenant_id, model_id, scope, user_id, project_id, session_id, run_id, in_graph)"
    )
    _hnsw(384, "dims = 384 and in_graph")
    _hnsw(1536, "dims = 1536 and in_graph")
    op.execute("grant update (in_graph) on harbor.memory_embeddings to harbor_search")


def downgrade() -> None:
    op.execute("revoke update (in_graph) on harbor.memory_embeddings from harbor_search")
    op.execute("drop index harbor.memory_embeddings_hnsw_384")
    op.execute("drop index harbor.memory_embeddings_hnsw_1536")
    op.execute("drop index harbor.memory_embeddings_owner_idx")
    op.execute("alter table harbor.memory_embeddings drop column in_graph")
    op.execute(
        "create index memory_embeddings_owner_idx on harbor.memory_embeddings"
        " (tenant_id, model_id, scope, user_id, project_id, session_id, run_id)"
    )
    _hnsw(384, "dims = 384")
    _hnsw(1536, "dims = 1536")
