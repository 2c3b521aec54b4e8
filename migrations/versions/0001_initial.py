"""Initial schema: the three tiers, embeddings, role bindings, session state.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

The SQL is frozen in 0001_initial.sql next to this file; sql/schema.sql is the
canonical fresh-install schema and tests/migration proves the two agree.
"""

from pathlib import Path

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # through the driver directly: psycopg would read '%' in the SQL as placeholders
    raw = op.get_bind().connection.driver_connection
    raw.execute(Path(__file__).with_name("0001_initial.sql").read_text(encoding="utf-8"))


def downgrade() -> None:
    op.get_bind().exec_driver_sql("drop schema harbor cascade")
