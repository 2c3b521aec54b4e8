"""An embedding's owner fields are its memory's: a foreign key over all of them.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

harbor.memory_embeddings copies the owner fields of its memory (scope,
project, user, session, run) so that the dense leg can find an owner's
vectors without a join, and its write policy checks those copies. The foreign
key to memories covered only (tenant_id, memory_id), and foreign keys are
checked without row-level security: a caller could store a vector keyed to
itself for another user's memory id, and the dense candidate function
(SECURITY DEFINER) then reported that memory. The key now covers the owner
fields too, against a new unique constraint on memories over the same
columns, so the database refuses a vector whose owner differs from its
memory's, whoever writes it. The recall indexes are unchanged.

Vectors that already differ from their memory are deleted first (only a
planted vector can: every writer of this package copies the fields). The
migration role is subject to row-level security like every other role
(FORCE), so the table is opened to it for that one statement.

The migration builds one B-tree over memories (the unique constraint) and
checks the new key against every vector, in its transaction: writes to both
tables wait for it; reads go on.
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_OWNER = "scope, project_id, user_id, session_id, run_id"


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
    op.execute(
        "alter table harbor.memories add constraint memories_owner_key"
        f" unique (tenant_id, id, {_OWNER})"
    )
    op.execute(
        "alter table harbor.memory_embeddings drop constraint memory_embeddings_memory_fkey,"
        " add constraint memory_embeddings_memory_fkey"
        f" foreign key (tenant_id, memory_id, {_OWNER})"
        f" references harbor.memories (tenant_id, id, {_OWNER}) on delete cascade"
    )


def downgrade() -> None:
    op.execute(
        "alter table harbor.memory_embeddings drop constraint memory_embeddings_memory_fkey,"
        " add constraint memory_embeddings_memory_fkey foreign key (tenant_id, memory_id)"
        " references harbor.memories (tenant_id, id) on delete cascade"
    )
    op.execute("alter table harbor.memories drop constraint memories_owner_key")
