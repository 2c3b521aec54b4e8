-- Row-level security of the job queue (procrastinate's tables in harbor_jobs,
-- migration 0020). Re-runnable; skipped while the queue does not exist yet (an
-- upgrade stepping through earlier revisions applies this file after each of them).
--
-- harbor_admin is the role workers use for the queue: every job and event.
-- harbor_app writes nothing to the queue: a turn's jobs are queued, in the turn's
-- transaction, by harbor_jobs.queue_turn_jobs (sql/functions/jobs.sql), which builds their
-- arguments from the caller's own identity. It reads back its own jobs: a job whose
-- arguments carry exactly the caller's identity (tenant, project, principal, user,
-- session and run; an absent field is ''), and the jobs of its session (tenant, user
-- and session equal), whatever their project, run or principal.
do $jobs$
begin
    if pg_catalog.to_regclass('harbor_jobs.procrastinate_jobs') is null then
        return;
    end if;
    drop policy if exists jobs_app on harbor_jobs.procrastinate_jobs;
    create policy jobs_app on harbor_jobs.procrastinate_jobs for select to harbor_app
        using (harbor_jobs.job_owner(args) operator(pg_catalog.=) array[
                (select harbor.caller_tenant()),
                coalesce((select harbor.caller_project()), ''),
                coalesce((select harbor.caller_principal()), ''),
                coalesce((select harbor.caller_user()), ''),
                coalesce((select harbor.caller_session()), ''),
                coalesce((select harbor.caller_run()), '')]);
    -- and it may read (never change) its session's jobs, whoever queued them in it (an
    -- agent, another run): what the inspector's session page lists
    drop policy if exists jobs_app_session on harbor_jobs.procrastinate_jobs;
    create policy jobs_app_session on harbor_jobs.procrastinate_jobs for select to harbor_app
        using (args operator(pg_catalog.->>) 'tenant_id'
                   operator(pg_catalog.=) (select harbor.caller_tenant())
               and args operator(pg_catalog.->>) 'user_id'
                   operator(pg_catalog.=) (select harbor.caller_user())
               and args operator(pg_catalog.->>) 'session_id'
                   operator(pg_catalog.=) (select harbor.caller_session()));
    drop policy if exists jobs_worker on harbor_jobs.procrastinate_jobs;
    create policy jobs_worker on harbor_jobs.procrastinate_jobs for all to harbor_admin
        using (not (select harbor.caller_is_bound()));
    drop policy if exists job_events_app on harbor_jobs.procrastinate_events;
    drop policy if exists job_events_worker on harbor_jobs.procrastinate_events;
    create policy job_events_worker on harbor_jobs.procrastinate_events for all to harbor_admin
        using (not (select harbor.caller_is_bound()));
end
$jobs$;
