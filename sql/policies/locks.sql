-- Row-level security of harbor.owner_locks (migration 0017). Re-runnable;
-- skipped while the table does not exist yet (an upgrade stepping through
-- earlier revisions applies this file after each of them).
--
-- The application role may propose, see and lock only the row of its own
-- session (scope 'session': project and run '') or run (scope 'run'), keyed
-- exactly as harbor._writable_keys keys its writes. What keeps anyone else off an
-- owner's lock is the INSERT check: INSERT ... ON CONFLICT DO UPDATE locks the
-- row its proposed row conflicts with before any other policy is tested, and
-- a proposed row must carry the caller's own identity, so it can conflict
-- only with the caller's own row. (A role bound to a user forces that user;
-- a role bound to no user has no session or run, so it can lock nothing.)
-- The elevated role takes and deletes its tenant's rows (harbor.erase).
-- The policy's harbor._writable_keys(...) call repeats the owner-keyed tables' in
-- policies.sql on purpose: a policy is one expression the planner inlines, one a
-- table.
do $locks$
begin
    if pg_catalog.to_regclass('harbor.owner_locks') is null then
        return;
    end if;
    drop policy if exists owner_locks_app on harbor.owner_locks;
    create policy owner_locks_app on harbor.owner_locks for all to harbor_app
        using (harbor._writable_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
            (select harbor.caller_tenant()), (select harbor._caller_keys())))
        with check (harbor._writable_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
            (select harbor.caller_tenant()), (select harbor._caller_keys())));
    -- harbor.erase, run by the elevated role, takes the locks of the erased sessions
    -- first (INSERT ... ON CONFLICT DO UPDATE, as an append does)
    grant insert, update (scope)
        on harbor.owner_locks to harbor_admin;
    drop policy if exists owner_locks_admin on harbor.owner_locks;
    create policy owner_locks_admin on harbor.owner_locks for all to harbor_admin
        using (not (select harbor.caller_is_bound())
               and tenant_id operator(pg_catalog.=) (select harbor.caller_tenant()));
end
$locks$;
