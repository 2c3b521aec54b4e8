"""A session's lock row says whether an extraction of its turns is waiting.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06

A turn appended with fact extraction configured queued a job of its own: a row
on the queue with its five indexes and two triggers, about a sixth of the
append's time. From this revision a session has at most one extraction
waiting, and it covers every turn appended while it waits: an append locks
its session's row of ``harbor.owner_locks`` as before, and sets
``extraction_queued`` there in the same ``INSERT ... ON CONFLICT DO UPDATE``
when it is not set yet, queueing the job only then. The job, when it runs,
clears the flag under the same row lock (so it waits for the appends in
flight) and reads the session's turns from its first one on in that
transaction: a turn appended before the clear is read by the job, one
appended after it sets the flag again and queues the next job.

The application role may update the new column of its own session's row
only (the table's row-level security, sql/policies/locks.sql).

Downgrade drops the column: extractions still waiting are run by the jobs
already queued, and a later append queues a job a turn again.
"""

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
alter table harbor.owner_locks
    add column extraction_queued boolean not null default false;
grant update (extraction_queued) on harbor.owner_locks to harbor_app;
"""
    )


def downgrade() -> None:
    op.execute("alter table harbor.owner_locks drop column extraction_queued")
