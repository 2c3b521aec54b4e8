"""Drop the GIN index on memories' entity ids, which no statement reads.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06

``memories_entities_idx`` (GIN on ``entity_ids``, since the first revision)
served no statement: recall's entity boost compares a candidate's ids with the
anchors after the candidates are found (``= any``), and the one filter on
them, the inspector's (``@>``, ``&&``), runs under row-level security, where
those operators, not leakproof, cannot be index conditions ahead of the
policy. 200 hybrid recalls scanned it 0 times (``ingest --mode indexes``,
benchmarks/RESULTS.md, ingest). Its write cost measured within noise there
(memories without entity ids); a memory with entity ids (an extracted fact)
adds one entry an id.
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("drop index harbor.memories_entities_idx")


def downgrade() -> None:
    op.execute("create index memories_entities_idx on harbor.memories using gin (entity_ids)")
