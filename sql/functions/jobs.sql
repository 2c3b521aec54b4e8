-- The application's one way onto the job queue (procrastinate's tables in harbor_jobs,
-- migration 0020). Re-runnable; skipped while the queue does not exist yet.
--
-- harbor_app writes nothing to the queue itself. A turn's jobs are queued, in the
-- turn's own statement (query append_message_with_jobs), by
-- harbor_jobs.queue_turn_jobs(turn_id, extraction, fold, slots): a SECURITY DEFINER
-- function owned by harbor_owner (the queue's tables' owner, which their row-level
-- security does not restrict) that takes ids and switches only. It builds each job's
-- arguments from the caller's identity as it reads it itself, so a job runs as exactly
-- whoever queued it; a caller with no tenant, user or session queues nothing. The turn
-- id is where the extraction stops reading: the job reads its owner's own turns, under
-- row-level security, so no id reaches anyone else's.
--
-- On one server an append queues its session's extraction through
-- harbor_jobs.queue_session_jobs(turn_id, extraction, fold, slots, delay_seconds) instead
-- (query append_message_with_jobs): the same, but the extraction is the session's
-- (harbor.extract_session, from the turn turn_id on, however many turns come while it
-- waits), queued only by the append that set its session's extraction_queued flag
-- (harbor.owner_locks, migration 0029), and scheduled delay_seconds after the turn when
-- that is above 0, so that the turns of that while share it. queue_turn_jobs, a job a
-- turn, stays for the distributed database's appends (query queue_turn_jobs_citus, in the
-- transaction of the append's delegated call) and for the jobs queued before that
-- migration.
--
-- harbor_jobs.caller_ids is harbor.caller_*() in one call: the caller's role binding
-- first (visible to harbor_owner through the policy role_bindings_queue, policies.sql),
-- then the settings of harbor.set_identity. It is a function of its own, called only
-- here and so always as harbor_owner, on purpose: harbor.caller_*() are planned per
-- role (role_bindings has row-level security) and per search_path, and called both by
-- the turn's own statement (as the application) and in here they were planned again at
-- every call: with the job row's policy checked by the application inside procrastinate's
-- functions (search_path pinned to harbor_jobs), a turn with its extraction queued took
-- 2.4 ms where the turn alone took 0.8. Both bodies are SQL-standard (BEGIN ATOMIC):
-- parsed at creation, so no search_path reaches them, and without a SET clause (one
-- would plan their identity reads again at every call, as above).
do $queue$
begin
    if pg_catalog.to_regclass('harbor_jobs.procrastinate_jobs') is null then
        return;
    end if;
    execute $fn$
create or replace function harbor_jobs.caller_ids(
    out tenant_id text, out project_id text, out principal_id text, out user_id text,
    out session_id text, out run_id text)
    language sql stable security invoker
begin atomic
select coalesce(b.tenant_id, harbor._setting('tenant_id')),
       case when b.tenant_id is not null then b.project_id
            else harbor._setting('project_id') end,
       case when b.tenant_id is not null then b.user_id
            else harbor._setting('principal_id') end,
       case when b.tenant_id is not null then b.user_id
            else coalesce(harbor._setting('user_id'), harbor._setting('principal_id')) end,
       case when b.tenant_id is not null and b.user_id is null then null
            else harbor._setting('session_id') end,
       case when b.tenant_id is not null and b.user_id is null then null
            else harbor._setting('run_id') end
  from (select 1) one left join harbor._binding() b on true;
end
$fn$;
    execute $fn$
create or replace function harbor_jobs.queue_turn_jobs(turn_id bigint, extraction boolean,
                                                       fold boolean, slots integer)
    returns bigint[]
    language sql volatile security definer
begin atomic
with caller as (
    select pg_catalog.jsonb_build_object(
               'tenant_id', i.tenant_id, 'project_id', coalesce(i.project_id, ''),
               'principal_id', coalesce(i.principal_id, ''), 'user_id', i.user_id,
               'session_id', i.session_id, 'run_id', coalesce(i.run_id, '')) as ids,
           i.tenant_id || pg_catalog.chr(31) || i.user_id || pg_catalog.chr(31)
               || i.session_id as session
      from harbor_jobs.caller_ids() i
     where i.tenant_id is not null and i.user_id <> '' and i.session_id <> ''
), queued as (
    insert into harbor_jobs.procrastinate_jobs (queue_name, task_name, priority, lock, args)
    select 'harbor', j.task, 0,
           case when slots > 0
                then 'harbor-slot:' || pg_catalog.abs(pg_catalog.hashtext(c.session) % slots)
                else 'harbor-session:' || c.session end,
           c.ids || j.extra
      from caller c
     cross join (values ('harbor.extract_turn',
                         pg_catalog.jsonb_build_object('message_id', turn_id), extraction),
                        ('harbor.fold_summary', '{}'::jsonb, fold)) j(task, extra, wanted)
     where j.wanted
    returning id
)
select pg_catalog.array_agg(q.id order by q.id) from queued q;
end
$fn$;
    execute $fn$
create or replace function harbor_jobs.queue_session_jobs(turn_id bigint, extraction boolean,
                                                          fold boolean, slots integer,
                                                          delay_seconds double precision)
    returns bigint[]
    language sql volatile security definer
begin atomic
with caller as (
    select pg_catalog.jsonb_build_object(
               'tenant_id', i.tenant_id, 'project_id', coalesce(i.project_id, ''),
               'principal_id', coalesce(i.principal_id, ''), 'user_id', i.user_id,
               'session_id', i.session_id, 'run_id', coalesce(i.run_id, '')) as ids,
           i.tenant_id || pg_catalog.chr(31) || i.user_id || pg_catalog.chr(31)
               || i.session_id as session
      from harbor_jobs.caller_ids() i
     where i.tenant_id is not null and i.user_id <> '' and i.session_id <> ''
), queued as (
    insert into harbor_jobs.procrastinate_jobs (queue_name, task_name, priority, lock, args,
                                                scheduled_at)
    select 'harbor', j.task, 0,
           case when slots > 0
                then 'harbor-slot:' || pg_catalog.abs(pg_catalog.hashtext(c.session) % slots)
                else 'harbor-session:' || c.session end,
           c.ids || j.extra,
           case when j.delayed and delay_seconds > 0
                then pg_catalog.now()
                     operator(pg_catalog.+) pg_catalog.make_interval(secs => delay_seconds)
           end
      from caller c
     cross join (values ('harbor.extract_session',
                         pg_catalog.jsonb_build_object('from_id', turn_id), extraction, true),
                        ('harbor.fold_summary', '{}'::jsonb, fold, false))
                j(task, extra, wanted, delayed)
     where j.wanted
    returning id
)
select pg_catalog.array_agg(q.id order by q.id) from queued q;
end
$fn$;
    revoke all on function harbor_jobs.caller_ids() from public;
    revoke all on function harbor_jobs.queue_turn_jobs(bigint, boolean, boolean, integer)
        from public;
    grant execute on function harbor_jobs.queue_turn_jobs(bigint, boolean, boolean, integer)
        to harbor_app;
    revoke all on function harbor_jobs.queue_session_jobs(bigint, boolean, boolean, integer,
                                                         double precision) from public;
    grant execute on function harbor_jobs.queue_session_jobs(bigint, boolean, boolean, integer,
                                                           double precision) to harbor_app;
    -- what migration 0020 let the application do itself, and it no longer may
    revoke execute on function harbor_jobs.procrastinate_defer_jobs_v1(
        harbor_jobs.procrastinate_job_to_defer_v1[]) from harbor_app;
    revoke insert on harbor_jobs.procrastinate_jobs from harbor_app;
    revoke usage on sequence harbor_jobs.procrastinate_jobs_id_seq from harbor_app;
    revoke insert on harbor_jobs.procrastinate_events from harbor_app;
    revoke usage on sequence harbor_jobs.procrastinate_events_id_seq from harbor_app;
end
$queue$;
