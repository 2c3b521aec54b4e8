-- name: jobs_open
-- Which of the given jobs are still queued or running (on the queue's connection).
select j.id
  from harbor_jobs.procrastinate_jobs j
 where j.id = any (%(ids)s::bigint[])
   and j.status in ('todo', 'doing')

-- name: jobs_pending_with_lock
-- Whether a job with this queueing lock is waiting to run (on the queue's connection).
select exists (select 1 from harbor_jobs.procrastinate_jobs j
                where j.queueing_lock = %(queueing_lock)s::text and j.status = 'todo') as pending

-- name: jobs_record_error
-- One failed run of a job: its error and the model output that broke it (both bounded
-- by the caller); a second report of the same attempt replaces the first.
insert into harbor_jobs.job_errors (job_id, attempt, error, raw_output)
values (%(job_id)s::bigint, %(attempt)s::integer, %(error)s::text, %(raw_output)s::text)
on conflict (job_id, attempt) do update
   set error = excluded.error, raw_output = excluded.raw_output, failed_at = now()

-- name: jobs_counts
-- How many of harbor-pg's jobs are in each state, per task (harbor-pg jobs).
select j.task_name, j.status::text as status, count(*) as jobs
  from harbor_jobs.procrastinate_jobs j
 where j.queue_name = 'harbor'
 group by j.task_name, j.status
 order by j.task_name, j.status

-- name: jobs_failures
-- The newest failed jobs with the error of their last failed run (harbor-pg jobs).
select j.id, j.task_name, j.attempts, e.error, e.raw_output is not null as has_output,
       e.failed_at
  from harbor_jobs.procrastinate_jobs j
  left join lateral (
      select x.error, x.raw_output, x.failed_at
        from harbor_jobs.job_errors x
       where x.job_id = j.id
       order by x.attempt desc
       limit 1) e on true
 where j.queue_name = 'harbor' and j.status = 'failed'
 order by j.id desc
 limit %(limit)s::integer

-- name: jobs_status
-- One job of harbor-pg's queue, its state, task and arguments (none: not one of
-- harbor-pg's jobs).
select j.id, j.status::text as status, j.task_name, j.args
  from harbor_jobs.procrastinate_jobs j
 where j.id = %(id)s::bigint and j.queue_name = 'harbor'

-- name: jobs_last_started
-- When the newest run of a task that succeeded started (null: none has).
select max(e.at) as started
  from harbor_jobs.procrastinate_jobs j
  join harbor_jobs.procrastinate_events e on e.job_id = j.id and e.type = 'started'
 where j.task_name = %(task_name)s::text and j.status = 'succeeded'

-- name: jobs_consolidation_owners
-- The owner keys of the user and project scopes with memories written since (null: all), each with the writer (harbor.consolidation_owners).
select o.tenant_id, o.project_id, o.user_id, o.principal_id
  from harbor.consolidation_owners(%(since)s::timestamptz) o
