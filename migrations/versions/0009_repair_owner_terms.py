"""Rebuild the owner-term index where the first version of 0008 built it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Revision 0008 as first committed (6c0ec0b) keyed the owner-term index by a
function of its own, harbor.memory_owner_key(). The revision was then changed
in place (06f7525) to key it by harbor.vector_owner_key() with no model, the
encoding the lexical leg of this package looks the question's words up under.
A database migrated by the first version still has the old keys: the lookup
finds nothing, and the leg, which trusts an empty lookup to mean that no row
matches, returns no lexical candidates for any question of at most 16
lexemes. Such a database, and only such a database, still has
harbor.memory_owner_key(). There, this revision gives
harbor.memory_owner_terms() its current body, rebuilds the index with it and
drops the old function; everywhere else it does nothing.

The rebuild runs in the migration's transaction: writes to memories wait for
it (17.4 s at 1,000,000 memories on two cores), reads go on. There is
nothing to undo on the way down: the index is then as 0008 defines it.
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_REPAIR = """
do $repair$
begin
    if pg_catalog.to_regprocedure('harbor.memory_owner_key(text, harbor.memory_scope, text,'
                                  ' text, text, text)') is null then
        return;
    end if;
    raise notice 'rebuilding harbor.memories_owner_terms_idx, built by the first version of'
                 ' migration 0008 with other keys than the lexical leg looks up';
    create or replace function harbor.memory_owner_terms(tenant_id text,
                                                         scope harbor.memory_scope,
                                                         user_id text, project_id text,
                                                         session_id text, run_id text,
                                                         fts tsvector) returns text[]
        language sql immutable parallel safe
    return array(select harbor.owner_term_prefix(harbor.vector_owner_key(tenant_id, '', scope,
                                                                         user_id, project_id,
                                                                         session_id, run_id))
                        || lexeme
                   from pg_catalog.unnest(pg_catalog.tsvector_to_array(fts)) lexeme);
    reindex index harbor.memories_owner_terms_idx;
    drop function harbor.memory_owner_key(text, harbor.memory_scope, text, text, text, text);
end
$repair$
"""


def upgrade() -> None:
    op.execute(_REPAIR)


def downgrade() -> None:
    pass
