"""A small index of the memories classified above 'none', for recall's sensitivity ceiling.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01

harbor.recall() takes max_sensitivity (MemoryPolicy.recall_max_sensitivity,
'pii' by default): memories classified above it are left out while the
candidates are generated, so that they never take a place in the result. The
lexical leg reads an owner's rows from a covering index that does not carry
the sensitivity; instead of widening that index (a rebuild of the largest
index of the table), this partial index files the rows above 'none' under
their owner keys and their sensitivity, and the leg looks up the ones above
the ceiling there: for an owner with none, one probe per owner key that
finds nothing. It holds only the classified rows.

The build runs in the migration's transaction (not CONCURRENTLY), so writes
to memories wait for it; reads go on.
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
create index memories_sensitivity_idx
    on harbor.memories (tenant_id, scope, user_id, project_id, session_id, run_id, sensitivity)
    include (id)
    where sensitivity <> 'none'
"""
    )


def downgrade() -> None:
    op.execute("drop index harbor.memories_sensitivity_idx")
