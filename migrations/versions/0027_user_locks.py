"""A lock row per user in harbor.owner_locks (scope 'user'), for erasure.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06

Erasing a user took the locks of the sessions the user had turns in. A turn
being appended, uncommitted, in a session with no turn yet was under no lock
the erasure knew of: it committed after the erasure had looked, and it stayed,
with its queued extraction job, which then found its turn and wrote facts of a
user erased before.

From this revision every append also locks its user's row (scope 'user',
session, project and run ''), before its session's and as it locks that one
(``INSERT ... ON CONFLICT DO UPDATE ... WHERE false``), and ``harbor.erase``
locks the erased user's row first. So an append in flight is committed before
the erasure reads the user's turns and jobs, and is erased with them; an
append that starts later waits for the erasure to commit and is a turn after
it. A write derived from a user's memories (an observation) takes the row too. The row-level security of the table
(sql/policies/locks.sql) already admits, for harbor_app, only the caller's own
user's row.

Downgrade deletes the user rows and restores the old checks.
"""

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
alter table harbor.owner_locks drop constraint owner_locks_session_id_check;
alter table harbor.owner_locks drop constraint owner_locks_scope_check;
alter table harbor.owner_locks add constraint owner_locks_scope_check
    check (scope in ('user', 'session', 'run'));
alter table harbor.owner_locks add constraint owner_locks_check1
    check ((scope = 'user') = (session_id = ''));
"""
    )


def downgrade() -> None:
    op.execute(
        """
delete from harbor.owner_locks where scope = 'user';
alter table harbor.owner_locks drop constraint owner_locks_check1;
alter table harbor.owner_locks drop constraint owner_locks_scope_check;
alter table harbor.owner_locks add constraint owner_locks_scope_check
    check (scope in ('session', 'run'));
alter table harbor.owner_locks add constraint owner_locks_session_id_check
    check (session_id <> '');
"""
    )
