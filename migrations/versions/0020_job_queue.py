"""The job queue: procrastinate's schema in its own schema, harbor_jobs.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06

Work that needs a language model (fact extraction, summary folds) and upkeep
run as jobs on procrastinate, a job queue kept in PostgreSQL. Its schema, as
procrastinate 3.10.0 ships it, is frozen in 0020_job_queue.sql next to this
file and created here in the schema ``harbor_jobs`` (owned by harbor_owner),
so that it lives beside harbor's, is migrated with it, and a fresh install has
it. A later procrastinate whose schema differs comes with a new revision.

procrastinate's functions name its tables without a schema: each gets a fixed
``search_path`` (harbor_jobs, then pg_catalog), so they work from a connection
whose path does not include harbor_jobs (the application's, which enqueues a
turn's jobs in the turn's own transaction) and no path can redirect them.

Who may touch the queue: nothing is granted to PUBLIC. harbor_admin, the
role workers use for the queue, may read and change every table and run
every function. harbor_app may only enqueue (``procrastinate_defer_jobs_v1``:
INSERT into the jobs, and the event its trigger writes) and read back the
jobs' ids: the jobs and events tables have row-level security, and their
policies (sql/policies/jobs.sql, re-applied after every upgrade) admit for
harbor_app only jobs whose arguments carry the caller's own identity.
"""

from pathlib import Path

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_GRANTS = """
-- the owner key of a harbor job: its arguments' identity fields ('' when absent),
-- in the order of the caller_* functions the policies compare it with
create function harbor_jobs.job_owner(args jsonb) returns text[]
    language sql immutable parallel safe
return array[args ->> 'tenant_id', coalesce(args ->> 'project_id', ''),
             coalesce(args ->> 'principal_id', ''), coalesce(args ->> 'user_id', ''),
             coalesce(args ->> 'session_id', ''), coalesce(args ->> 'run_id', '')];
revoke all on schema harbor_jobs from public;
revoke all on all functions in schema harbor_jobs from public;
grant usage on schema harbor_jobs to harbor_admin, harbor_app;
grant select, insert, update, delete on all tables in schema harbor_jobs to harbor_admin;
grant usage, select, update on all sequences in schema harbor_jobs to harbor_admin;
grant execute on all functions in schema harbor_jobs to harbor_admin;
grant execute on function harbor_jobs.job_owner(jsonb) to harbor_app;
grant execute on function harbor_jobs.procrastinate_defer_jobs_v1(
    harbor_jobs.procrastinate_job_to_defer_v1[]) to harbor_app;
grant insert (queue_name, task_name, priority, lock, queueing_lock, args, scheduled_at)
    on harbor_jobs.procrastinate_jobs to harbor_app;
grant select (id, queue_name, task_name, args, status, scheduled_at, attempts)
    on harbor_jobs.procrastinate_jobs to harbor_app;
grant usage on sequence harbor_jobs.procrastinate_jobs_id_seq to harbor_app;
grant insert (job_id, type, at) on harbor_jobs.procrastinate_events to harbor_app;
grant usage on sequence harbor_jobs.procrastinate_events_id_seq to harbor_app;
alter table harbor_jobs.procrastinate_jobs enable row level security;
alter table harbor_jobs.procrastinate_events enable row level security;
"""


def upgrade() -> None:
    # through the driver directly: psycopg would read '%' in the SQL as placeholders
    raw = op.get_bind().connection.driver_connection
    raw.execute("create schema harbor_jobs")
    path = raw.execute("select pg_catalog.current_setting('search_path')").fetchone()[0]
    raw.execute("select pg_catalog.set_config('search_path', 'harbor_jobs, pg_catalog', true)")
    raw.execute(Path(__file__).with_name("0020_job_queue.sql").read_text(encoding="utf-8"))
    raw.execute("select pg_catalog.set_config('search_path', %s, true)", (path,))
    raw.execute(
        """
do $fix$
declare
    f regprocedure;
begin
    for f in select p.oid::regprocedure from pg_catalog.pg_proc p
              where p.pronamespace = 'harbor_jobs'::regnamespace
    loop
        execute pg_catalog.format(
            'alter function %s set search_path = harbor_jobs, pg_catalog, pg_temp', f);
    end loop;
end
$fix$
"""
    )
    raw.execute(_GRANTS)


def downgrade() -> None:
    op.execute("drop schema harbor_jobs cascade")
