-- Row-level security policies. Re-runnable: each policy is dropped and created.
-- Reads go through harbor._visible_keys (harbor._visible's predicate); writes through
-- harbor._writable_keys. The identity is passed as two sub-selects, the tenant and
-- the owner keys (sql/functions/identity.sql), so it is evaluated once per
-- statement (an InitPlan each), not once per row; the checks of the rows the save
-- path inserts (and of an update's new row) take it as one, with the tenant
-- (harbor._writable_check: no index to drive there).

-- The policies of the four owner-keyed tables (and owner_locks', sql/policies/locks.sql)
-- repeat the same calls on purpose: a policy is one expression the planner inlines.

-- role_bindings: a role sees its own binding; admins manage their tenant's,
-- and read every tenant's so that harbor.bind_role can refuse a role already
-- bound in another tenant (harbor_admin is one role serving every tenant: it
-- picks its tenant with set_identity).
drop policy if exists role_bindings_self on harbor.role_bindings;
create policy role_bindings_self on harbor.role_bindings for select
    to harbor_app, harbor_search
    using (role_name in (session_user, current_user));
drop policy if exists role_bindings_admin on harbor.role_bindings;
create policy role_bindings_admin on harbor.role_bindings for all
    to harbor_admin
    using (role_name in (session_user, current_user)
           or tenant_id = (select harbor._setting('tenant_id')))
    with check (tenant_id = (select harbor._setting('tenant_id')));
drop policy if exists role_bindings_admin_read on harbor.role_bindings;
create policy role_bindings_admin_read on harbor.role_bindings for select
    to harbor_admin
    using (true);
-- and harbor_owner reads the binding of the caller it acts for, inside the
-- security-definer function that queues a turn's jobs (harbor_jobs.queue_turn_jobs,
-- sql/functions/jobs.sql): the login's binding, or that of the role it set (SET ROLE); inside
-- that function current_user is harbor_owner, which no role binding names.
drop policy if exists role_bindings_queue on harbor.role_bindings;
create policy role_bindings_queue on harbor.role_bindings for select
    to harbor_owner
    using (role_name in (session_user,
                         nullif(pg_catalog.current_setting('role'), 'none')::name));

-- messages: SESSION-scoped
drop policy if exists messages_read on harbor.messages;
create policy messages_read on harbor.messages for select to harbor_app
    using (harbor._visible_keys('session', tenant_id, '', user_id, session_id, '',
        (select harbor.caller_tenant()), (select harbor._caller_keys())));
drop policy if exists messages_insert on harbor.messages;
create policy messages_insert on harbor.messages for insert to harbor_app
    with check (harbor._writable_keys('session', tenant_id, '', user_id, session_id, '',
        (select harbor.caller_tenant()), (select harbor._caller_keys()))
        and principal_id = coalesce((select harbor.caller_principal()), '')
        and project_id = coalesce((select harbor.caller_project()), ''));
drop policy if exists messages_delete on harbor.messages;
create policy messages_delete on harbor.messages for delete to harbor_app
    using (harbor._writable_keys('session', tenant_id, '', user_id, session_id, '',
        (select harbor.caller_tenant()), (select harbor._caller_keys())));
drop policy if exists messages_admin on harbor.messages;
create policy messages_admin on harbor.messages for all to harbor_admin
    using (not (select harbor.caller_is_bound()) and tenant_id = (select harbor.caller_tenant()));

-- working_state: RUN-scoped, and invisible to reads once expired.
drop policy if exists working_state_app on harbor.working_state;
drop policy if exists working_state_read on harbor.working_state;
create policy working_state_read on harbor.working_state for select to harbor_app
    using (harbor._visible_keys('run', tenant_id, project_id, user_id, session_id, run_id,
        (select harbor.caller_tenant()), (select harbor._caller_keys()))
        and (expires_at is null or expires_at > pg_catalog.now()));
drop policy if exists working_state_insert on harbor.working_state;
create policy working_state_insert on harbor.working_state for insert to harbor_app
    with check (harbor._writable_keys('run', tenant_id, project_id, user_id, session_id, run_id,
        (select harbor.caller_tenant()), (select harbor._caller_keys()))
        and principal_id = coalesce((select harbor.caller_principal()), ''));
drop policy if exists working_state_update on harbor.working_state;
drop policy if exists working_state_delete on harbor.working_state;
create policy working_state_delete on harbor.working_state for delete to harbor_app
    using (harbor._writable_keys('run', tenant_id, project_id, user_id, session_id, run_id,
        (select harbor.caller_tenant()), (select harbor._caller_keys())));
drop policy if exists working_state_admin on harbor.working_state;
-- (expired rows of every tenant: harbor.purge_working_state(); only the
-- unbound administrator, who may take any tenant's identity anyway)
create policy working_state_admin on harbor.working_state for all to harbor_admin
    using (not (select harbor.caller_is_bound())
           and (tenant_id = (select harbor.caller_tenant())
                or (expires_at is not null and expires_at <= pg_catalog.now())));

-- memories
drop policy if exists memories_read on harbor.memories;
create policy memories_read on harbor.memories for select to harbor_app
    using (harbor._visible_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
        (select harbor.caller_tenant()), (select harbor._caller_keys())));
drop policy if exists memories_insert on harbor.memories;
create policy memories_insert on harbor.memories for insert to harbor_app
    with check (harbor._writable_check(scope, tenant_id, project_id, user_id, session_id, run_id,
        principal_id, (select harbor._caller_write_keys())));
drop policy if exists memories_update on harbor.memories;
create policy memories_update on harbor.memories for update to harbor_app
    using (harbor._writable_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
        (select harbor.caller_tenant()), (select harbor._caller_keys())))
    with check (harbor._writable_check(scope, tenant_id, project_id, user_id, session_id, run_id,
        (select harbor._caller_write_keys())));
drop policy if exists memories_delete on harbor.memories;
create policy memories_delete on harbor.memories for delete to harbor_app
    using (harbor._writable_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
        (select harbor.caller_tenant()), (select harbor._caller_keys())));
-- the elevated role: everything in its tenant, plus TENANT and GLOBAL writes.
-- Every harbor_admin policy starts with "not bound": binding a member of
-- harbor_admin is refused (guards.sql), and a bound role granted harbor_admin
-- afterwards gets none of its rights (a GLOBAL write reaches every tenant, so
-- there is no tenant-confined administrator).
drop policy if exists memories_admin_read on harbor.memories;
create policy memories_admin_read on harbor.memories for select to harbor_admin
    using (not (select harbor.caller_is_bound()) and tenant_id = any (array['', (select harbor.caller_tenant())]));
-- and, for erasure, a GLOBAL memory derived from this tenant's conversations (the
-- column comes with revision 0011; this file also runs on the revisions before it)
drop policy if exists memories_admin_delete on harbor.memories;
do $$
begin
    perform 1 from pg_catalog.pg_attribute
     where attrelid = 'harbor.memories'::pg_catalog.regclass
       and attname = 'source_tenant_id' and not attisdropped;
    if found then
        create policy memories_admin_delete on harbor.memories for delete to harbor_admin
            using (not (select harbor.caller_is_bound())
                   and (tenant_id = (select harbor.caller_tenant())
                        or (tenant_id = '' and source_tenant_id = (select harbor.caller_tenant()))));
    else
        create policy memories_admin_delete on harbor.memories for delete to harbor_admin
            using (not (select harbor.caller_is_bound())
                   and tenant_id = (select harbor.caller_tenant()));
    end if;
end
$$;
-- erasure mends the chains through an erased memory in the tenant (and GLOBAL): it
-- relinks a predecessor to the next surviving version or reopens it; the grant allows
-- only valid/superseded_by, and the add-only trigger allows reopening only in erase
drop policy if exists memories_admin_chain on harbor.memories;
create policy memories_admin_chain on harbor.memories for update to harbor_admin
    using (not (select harbor.caller_is_bound())
           and tenant_id = any (array['', (select harbor.caller_tenant())]))
    with check (not (select harbor.caller_is_bound())
                and tenant_id = any (array['', (select harbor.caller_tenant())]));
drop policy if exists memories_admin_insert on harbor.memories;
create policy memories_admin_insert on harbor.memories for insert to harbor_admin
    with check (not (select harbor.caller_is_bound())
                and ((scope = 'tenant' and tenant_id = (select harbor.caller_tenant()))
                     or (scope = 'global' and tenant_id = '')));
drop policy if exists memories_admin_update on harbor.memories;
create policy memories_admin_update on harbor.memories for update to harbor_admin
    using (not (select harbor.caller_is_bound())
           and ((scope = 'tenant' and tenant_id = (select harbor.caller_tenant()))
                or (scope = 'global' and tenant_id = '')))
    with check (not (select harbor.caller_is_bound())
                and ((scope = 'tenant' and tenant_id = (select harbor.caller_tenant()))
                     or (scope = 'global' and tenant_id = '')));
-- the periodic upkeep, run with no identity, closes every tenant's expired memories
-- (harbor.expire_memories()): only the unbound administrator (who may take any
-- tenant's identity anyway), only with no identity set, only a row past its expiry
-- whose interval is open, and only to end that interval at its expiry, unlinked; it
-- reads the rows past their expiry and no others.
-- The column comes with revision 0024; this file also runs on the revisions before it.
drop policy if exists memories_admin_expire_read on harbor.memories;
drop policy if exists memories_admin_expire on harbor.memories;
do $$
begin
    perform 1 from pg_catalog.pg_attribute
     where attrelid = 'harbor.memories'::pg_catalog.regclass
       and attname = 'expires_at' and not attisdropped;
    if found then
        -- (no identity: num_nulls, not IS NULL, which Citus cannot propagate in a policy;
        -- the closed row too: an UPDATE's new row must stay visible to its author)
        create policy memories_admin_expire_read on harbor.memories for select to harbor_admin
            using (not (select harbor.caller_is_bound())
                   and pg_catalog.num_nulls((select harbor.caller_tenant())) = 1
                   and expires_at <= pg_catalog.now());
        create policy memories_admin_expire on harbor.memories for update to harbor_admin
            using (not (select harbor.caller_is_bound())
                   and pg_catalog.num_nulls((select harbor.caller_tenant())) = 1
                   and expires_at <= pg_catalog.now() and upper_inf(valid))
            -- (closed at its expiry, or at its start for an expiry at or before the start:
            -- as harbor.expire_memories() closes it)
            with check (not (select harbor.caller_is_bound())
                        and pg_catalog.num_nulls((select harbor.caller_tenant())) = 1
                        and pg_catalog.num_nulls(superseded_by) = 1
                        and (upper(valid) = expires_at
                             or (expires_at <= lower(valid) and upper(valid) = lower(valid))));
    end if;
end
$$;
drop policy if exists memories_search on harbor.memories;
create policy memories_search on harbor.memories for select to harbor_search using (true);

-- memory_hits: same key as the memory, copied (the memory_hits_owner trigger); a hit
-- of any memory the caller may see, never dated in the future. The table comes with
-- revision 0025; this file also runs on the revisions before it.
do $$
begin
    if pg_catalog.to_regclass('harbor.memory_hits') is not null then
        drop policy if exists memory_hits_read on harbor.memory_hits;
        create policy memory_hits_read on harbor.memory_hits for select to harbor_app
            using (harbor._visible_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
                (select harbor.caller_tenant()), (select harbor._caller_keys())));
        drop policy if exists memory_hits_write on harbor.memory_hits;
        create policy memory_hits_write on harbor.memory_hits for insert to harbor_app
            with check (harbor._visible_keys(scope, tenant_id, project_id, user_id, session_id,
                run_id,
                (select harbor.caller_tenant()), (select harbor._caller_keys()))
                and last_recalled_at <= pg_catalog.now());
        drop policy if exists memory_hits_update on harbor.memory_hits;
        create policy memory_hits_update on harbor.memory_hits for update to harbor_app
            using (harbor._visible_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
                (select harbor.caller_tenant()), (select harbor._caller_keys())))
            with check (harbor._visible_keys(scope, tenant_id, project_id, user_id, session_id,
                run_id,
                (select harbor.caller_tenant()), (select harbor._caller_keys()))
                and last_recalled_at <= pg_catalog.now());
        drop policy if exists memory_hits_admin on harbor.memory_hits;
        create policy memory_hits_admin on harbor.memory_hits for all to harbor_admin
            using (not (select harbor.caller_is_bound())
                   and tenant_id = any (array['', (select harbor.caller_tenant())]))
            with check (not (select harbor.caller_is_bound())
                        and tenant_id = any (array['', (select harbor.caller_tenant())]));
    end if;
end
$$;

-- memory_embeddings: same key as the memory, copied
drop policy if exists memory_embeddings_read on harbor.memory_embeddings;
create policy memory_embeddings_read on harbor.memory_embeddings for select to harbor_app
    using (harbor._visible_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
        (select harbor.caller_tenant()), (select harbor._caller_keys())));
drop policy if exists memory_embeddings_write on harbor.memory_embeddings;
create policy memory_embeddings_write on harbor.memory_embeddings for insert to harbor_app
    with check (harbor._writable_check(scope, tenant_id, project_id, user_id, session_id, run_id,
        (select harbor._caller_write_keys())));
drop policy if exists memory_embeddings_delete on harbor.memory_embeddings;
create policy memory_embeddings_delete on harbor.memory_embeddings for delete to harbor_app
    using (harbor._writable_keys(scope, tenant_id, project_id, user_id, session_id, run_id,
        (select harbor.caller_tenant()), (select harbor._caller_keys())));
drop policy if exists memory_embeddings_admin on harbor.memory_embeddings;
create policy memory_embeddings_admin on harbor.memory_embeddings for all to harbor_admin
    using (not (select harbor.caller_is_bound()) and tenant_id = (select harbor.caller_tenant()))
    with check (not (select harbor.caller_is_bound())
                and ((scope = 'tenant' and tenant_id = (select harbor.caller_tenant()))
                     or (scope = 'global' and tenant_id = '')));
-- GLOBAL vectors are as public as GLOBAL memories: the elevated role counts those an
-- erasure takes (their memories' deletion cascades to them)
drop policy if exists memory_embeddings_admin_global_read on harbor.memory_embeddings;
create policy memory_embeddings_admin_global_read on harbor.memory_embeddings for select
    to harbor_admin using (not (select harbor.caller_is_bound()) and tenant_id = '');
drop policy if exists memory_embeddings_search on harbor.memory_embeddings;
create policy memory_embeddings_search on harbor.memory_embeddings for select
    to harbor_search using (true);

-- session_state: SESSION-scoped bookkeeping
drop policy if exists session_state_app on harbor.session_state;
create policy session_state_app on harbor.session_state for all to harbor_app
    using (harbor._visible_keys('session', tenant_id, '', user_id, session_id, '',
        (select harbor.caller_tenant()), (select harbor._caller_keys())))
    with check (harbor._writable_keys('session', tenant_id, '', user_id, session_id, '',
        (select harbor.caller_tenant()), (select harbor._caller_keys())));
drop policy if exists session_state_admin on harbor.session_state;
create policy session_state_admin on harbor.session_state for all to harbor_admin
    using (not (select harbor.caller_is_bound()) and tenant_id = (select harbor.caller_tenant()));
