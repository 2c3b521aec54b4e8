-- name: jobs_open
-- Which of the given jobs are still queued or running (on the queue's connection).
select j.id
  from harbor_jobs.procrastinate_jobs j
 where j.id = any (%(ids)s::bigint[])
   and j.status in ('todo', 'doing')

-- name: jobs_record_error
-- One failed run of a job: its error and the model output that broke it (both bounded
-- by the caller); a second report of the same attempt replaces the first.
insert into harbor_jobs.job_errors (job_id, attempt, error, raw_output)
values (%(job_id)s::bigint, %(attempt)s::integer, %(error)s::text, %(raw_output)s::text)
on conflict (job_id, attempt) do update
   set error = excluded.error, raw_output = excluded.raw_output, failed_at = now()
