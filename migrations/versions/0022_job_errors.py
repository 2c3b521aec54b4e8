"""Why a queued job failed: harbor_jobs.job_errors.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06

procrastinate records a job's state and its events, not the error a run
ended with. A worker writes one row here for every failed run of a harbor-pg
job: the attempt, the error (its class and first line) and, when a language
model's answer could not be read, that answer, each cut to a bounded length
by the worker. So a failed job stays visible with its error, and the output
that broke it can be looked at without re-running it.

The rows go with their job (ON DELETE CASCADE): erasure, which deletes the
erased subject's jobs (harbor.erase), deletes their errors with them, model
output included. Only the queue's role, harbor_admin, may read or write them.
"""

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
create table harbor_jobs.job_errors (
    job_id     bigint not null
               references harbor_jobs.procrastinate_jobs (id) on delete cascade,
    attempt    integer not null,
    error      text not null,
    raw_output text,
    failed_at  timestamptz not null default now(),
    primary key (job_id, attempt)
);
revoke all on harbor_jobs.job_errors from public;
grant select, insert, update, delete on harbor_jobs.job_errors to harbor_admin;
"""
    )


def downgrade() -> None:
    op.execute("drop table harbor_jobs.job_errors")
