"""Drop the GIN index on memories' text vectors, which no statement reads any more.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06

``memories_fts_idx`` (GIN on ``fts``, since the first revision) served one path: the
lexical leg of recall for an owner above its scan limit, which matched the question's
rarer terms through it. That path now reads the owner-term index
(``memories_owner_terms_idx``) under the caller's owner keys, the owner's rows holding
a term rather than every tenant's. The other statements that test ``fts`` (search,
the inspector) run under row-level security, where ``@@``, not leakproof, cannot be an
index condition ahead of the policy, and OR it with a substring test besides. So no
statement reads the index, and every memory written paid for an entry a lexeme.
"""

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("drop index harbor.memories_fts_idx")


def downgrade() -> None:
    op.execute("create index memories_fts_idx on harbor.memories using gin (fts)")
