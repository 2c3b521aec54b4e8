-- name: scratch
-- The caller's current (unexpired) working state for its run.
select state, expires_at from harbor.working_state w
 where w.tenant_id = %(tenant_id)s::text and w.user_id = %(user_id)s::text
   and w.session_id = %(session_id)s::text and w.run_id = %(run_id)s::text
   and w.project_id = %(project_id)s::text
 order by w.id desc
 limit 1

-- name: lock_run
-- Serialise writers of one run's working state for the rest of the transaction: lock the
-- run's row of harbor.owner_locks (inserted by the run's first write; ON CONFLICT DO
-- UPDATE locks it even though WHERE false updates nothing). Its policy admits only the
-- caller's own run, so no one else can hold it. A statement of its own: update_working
-- reads the current state, which must be read after the lock is held.
insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope, project_id, run_id)
values (%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text, 'run',
        %(project_id)s::text, %(run_id)s::text)
on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
do update set scope = excluded.scope where false

-- name: update_working
-- Merge keys into the run's state as a new version, then drop the older visible versions.
with current_state as (
    select w.state from harbor.working_state w
     where w.tenant_id = %(tenant_id)s::text and w.user_id = %(user_id)s::text
       and w.session_id = %(session_id)s::text and w.run_id = %(run_id)s::text
       and w.project_id = %(project_id)s::text
     order by w.id desc limit 1
), inserted as (
    insert into harbor.working_state (tenant_id, project_id, user_id, session_id, run_id,
                                      principal_id, state, expires_at)
    select %(tenant_id)s::text, %(project_id)s::text, %(user_id)s::text, %(session_id)s::text,
           %(run_id)s::text, %(principal_id)s::text,
           coalesce((select state from current_state), '{}'::jsonb) || %(state)s::jsonb,
           case when %(ttl_seconds)s::double precision is null then null
                else pg_catalog.now() + make_interval(secs => %(ttl_seconds)s::double precision) end
    returning id, state, expires_at
), removed as (
    delete from harbor.working_state w
     where w.tenant_id = %(tenant_id)s::text and w.user_id = %(user_id)s::text
       and w.session_id = %(session_id)s::text and w.run_id = %(run_id)s::text
       and w.project_id = %(project_id)s::text
       and w.id < (select id from inserted)
)
select state, expires_at from inserted

-- name: clear_working
-- Delete the caller's working state for its run.
delete from harbor.working_state w
 where w.tenant_id = %(tenant_id)s::text and w.user_id = %(user_id)s::text
   and w.session_id = %(session_id)s::text and w.run_id = %(run_id)s::text
   and w.project_id = %(project_id)s::text

-- name: purge_working_state
-- Reclaim expired working state (elevated role).
select harbor.purge_working_state() as purged
