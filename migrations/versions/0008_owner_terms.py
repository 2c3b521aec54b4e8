"""The owner-term index: the lexical leg reads only the rows that can match.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

The lexical leg of harbor.recall() read every row of the caller's owner keys
(up to 2,000, from the covering index of migration 0005) to find the few that
match the question. This GIN index holds each memory under one key per lexeme
of its text, '<owner hash>:<lexeme>' (the first 8 hex digits of the md5 of
the owner key of migration 0007's harbor.vector_owner_key() with no model), so
the leg looks up the question's lexemes under the caller's keys and reads the
matching rows alone when there are few (harbor._lexical_candidates, whose new
version ships with this package). A collision of two owners' hashes costs a
read, never a row: the leg tests the owner key and the text of each row.
fastupdate is off, so that a lookup never scans a pending list of recent
writes.

On an existing store this builds one index, in the migration's transaction
(not CONCURRENTLY): writes to memories wait for it, reads go on. At 1,000,000
memories on two cores it takes about half a minute (measured on the
benchmark machine).
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_PREFIX = """
create function harbor.owner_term_prefix(owner_key text) returns text
    language sql immutable parallel safe
return pg_catalog.left(pg_catalog.md5(owner_key), 8) || ':'
"""

_TERMS = """
create function harbor.memory_owner_terms(tenant_id text, scope harbor.memory_scope,
                                          user_id text, project_id text, session_id text,
                                          run_id text, fts tsvector) returns text[]
    language sql immutable parallel safe
return array(select harbor.owner_term_prefix(harbor.vector_owner_key(tenant_id, '', scope,
                                                                     user_id, project_id,
                                                                     session_id, run_id))
                    || lexeme
               from pg_catalog.unnest(pg_catalog.tsvector_to_array(fts)) lexeme)
"""

_FIELDS = "tenant_id, scope, user_id, project_id, session_id, run_id"


def upgrade() -> None:
    op.execute(_PREFIX)
    op.execute(_TERMS)
    op.execute(
        "create index memories_owner_terms_idx on harbor.memories"
        f" using gin (harbor.memory_owner_terms({_FIELDS}, fts)) with (fastupdate = off)"
    )


def downgrade() -> None:
    op.execute("drop index harbor.memories_owner_terms_idx")
    op.execute(
        "drop function harbor.memory_owner_terms(text, harbor.memory_scope, text, text, text,"
        " text, tsvector)"
    )
    op.execute("drop function harbor.owner_term_prefix(text)")
