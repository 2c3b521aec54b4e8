"""The dedup exclusion constraint compares the narrow owner fields and the hash as one key.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Same rule as before (two currently valid memories with the same owner key and
content hash cannot coexist), same name. With every owner column spelled out
in the constraint's GiST index, the planner's cached plans for recall found it
as cheap as the B-tree owner index for an owner's rows and took it: 2.4 ms
against 0.9 ms for a 1,000-row owner at 1,000,000 memories
(benchmarks/RESULTS.md). Folding project, user, session, run and hash into one
injective text key leaves the GiST index only tenant and scope for such
lookups, so the B-tree wins; tenant_id stays a plain column (Citus).
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_KEY = """
create function harbor.memory_dedup_key(project_id text, user_id text, session_id text,
                                        run_id text, content_hash text) returns text
    language sql immutable parallel safe
return pg_catalog.length(project_id) || ':' || project_id || ';'
    || pg_catalog.length(user_id) || ':' || user_id || ';'
    || pg_catalog.length(session_id) || ':' || session_id || ';'
    || pg_catalog.length(run_id) || ':' || run_id || ';' || content_hash
"""


def upgrade() -> None:
    op.execute(_KEY)
    op.execute(
        "alter table harbor.memories drop constraint memories_no_duplicate_valid,"
        " add constraint memories_no_duplicate_valid exclude using gist ("
        " tenant_id with =, scope with =,"
        " (harbor.memory_dedup_key(project_id, user_id, session_id, run_id, content_hash)) with =,"
        " valid with &&)"
    )


def downgrade() -> None:
    op.execute(
        "alter table harbor.memories drop constraint memories_no_duplicate_valid,"
        " add constraint memories_no_duplicate_valid exclude using gist ("
        " tenant_id with =, scope with =, project_id with =, user_id with =,"
        " session_id with =, run_id with =, content_hash with =, valid with &&)"
    )
    op.execute(
        "drop function harbor.memory_dedup_key(text, text, text, text, text)"
    )
