"""Drop the (tenant_id, valid) GiST index on memories.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Measured under row-level security: the planner chose this index for
primary-key lookups (its estimate for the policy's tenant test and the join's
tenant test multiplied to one row), then filtered the caller's whole row set
by id once per candidate. Every validity query also names an owner, which the
owner-key index serves; the exclusion constraint keeps its own GiST index.
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("drop index if exists harbor.memories_valid_idx")


def downgrade() -> None:
    op.execute(
        "create index memories_valid_idx on harbor.memories using gist (tenant_id, valid)"
    )
