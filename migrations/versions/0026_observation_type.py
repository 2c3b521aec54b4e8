"""A memory type for observations: ``observation``.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06

An observation is what several current facts about one entity add up to, one
sentence a model writes from them (``MemoryManager.observe``), stored with the
ids of the facts it read and superseded by a new one when those facts change.
It needs a value of its own in ``harbor.memory_type`` so that recall can ask
for it by type.

Downgrade deletes the observations; the enum value stays (PostgreSQL cannot
drop a value from an enum), and an upgrade after it adds nothing.
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("alter type harbor.memory_type add value if not exists 'observation'")


def downgrade() -> None:
    op.execute("delete from harbor.memories where memory_type::text = 'observation'")
