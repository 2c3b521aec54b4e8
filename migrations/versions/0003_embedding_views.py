"""Two views of a memory's text for the dense leg: the content alone, and with its context.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Conversation turns lean on their neighbours: a question may match a turn's
own words or the exchange it belongs to. A memory saved with a ``context``
line now gets two vectors per model, one of the content alone
(``with_context = false``) and one of the context line followed by the
content (``with_context = true``); recall takes the nearer of the two.
Measured on the LoCoMo dev conversations with MiniLM (benchmarks/RESULTS.md):
dense-only recall@10 49.3 -> 58.6, hybrid 64.7 -> 72.1.

Vectors written before this revision were computed from the context line
followed by the content, so a row whose memory has a non-blank context is
labelled ``with_context = true``. The tables force row-level security on their
owner too, so the relabelling lifts that for the length of this transaction.
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "alter table harbor.memory_embeddings"
        " add column with_context boolean not null default false"
    )
    op.execute("alter table harbor.memory_embeddings no force row level security")
    op.execute("alter table harbor.memories no force row level security")
    op.execute(
        "update harbor.memory_embeddings e set with_context = true"
        "  from harbor.memories m"
        " where m.tenant_id = e.tenant_id and m.id = e.memory_id"
        "   and coalesce(btrim(m.context), '') <> ''"
    )
    op.execute("alter table harbor.memories force row level security")
    op.execute("alter table harbor.memory_embeddings force row level security")
    op.execute(
        "alter table harbor.memory_embeddings drop constraint memory_embeddings_pkey,"
        " add constraint memory_embeddings_pkey"
        " primary key (tenant_id, memory_id, model_id, with_context)"
    )


def downgrade() -> None:
    # keep one vector per memory and model: the one recall used before this revision
    op.execute("alter table harbor.memory_embeddings no force row level security")
    op.execute(
        "delete from harbor.memory_embeddings e"
        " where not e.with_context and exists (select 1 from harbor.memory_embeddings x"
        "  where x.tenant_id = e.tenant_id and x.memory_id = e.memory_id"
        "    and x.model_id = e.model_id and x.with_context)"
    )
    op.execute("alter table harbor.memory_embeddings force row level security")
    op.execute(
        "alter table harbor.memory_embeddings drop constraint memory_embeddings_pkey,"
        " add constraint memory_embeddings_pkey primary key (tenant_id, memory_id, model_id)"
    )
    op.execute("alter table harbor.memory_embeddings drop column with_context")
