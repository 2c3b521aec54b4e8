"""Delete vectors whose owner fields differ from their memory's.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

harbor.memory_embeddings copies the owner fields of its memory (scope,
project, user, session, run) so that the dense leg can find an owner's
vectors without a join, and its write policy checks only those copies. The
foreign key covers (tenant_id, memory_id) alone and is checked without
row-level security, so a caller could store a vector keyed to itself for
another user's memory id, and the dense candidate function (SECURITY
DEFINER) then reported that memory. From this version on the
memory_embeddings_owner trigger (sql/functions/guards.sql, re-applied after
the revisions) refuses such a vector; this revision deletes the ones already
stored (only a planted vector can differ: every writer of this package
copies the fields).

The migration role is subject to row-level security like every other role
(FORCE), so the two tables are opened to it for that one statement. The
statement reads every vector and its memory by primary key, in the
migration's transaction.
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("alter table harbor.memory_embeddings no force row level security")
    op.execute("alter table harbor.memories no force row level security")
    op.execute(
        "delete from harbor.memory_embeddings e"
        " where not exists (select 1 from harbor.memories m"
        "  where m.tenant_id = e.tenant_id and m.id = e.memory_id and m.scope = e.scope"
        "    and m.project_id = e.project_id and m.user_id = e.user_id"
        "    and m.session_id = e.session_id and m.run_id = e.run_id)"
    )
    op.execute("alter table harbor.memories force row level security")
    op.execute("alter table harbor.memory_embeddings force row level security")


def downgrade() -> None:
    pass  # the deleted vectors were planted; nothing to restore
