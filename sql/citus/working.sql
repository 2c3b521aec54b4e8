-- A run's working state on a distributed database, read in one call that Citus delegates
-- whole to the tenant's worker (harbor-pg distribute registers it with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.working_state; harbor_pg.db.citus). Sent in autocommit, it is the one command the
-- coordinator sends for it: no transaction block, no SET LOCAL, no commit round trip.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement then runs as the caller (security invoker), under the policies of
-- harbor.working_state (the caller's own run, not expired), which its shard tables carry.
-- The row is the scratch statement's (sql/queries/working.sql): the run's newest state.
create or replace function harbor.working_state_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text
) returns table (state jsonb, expires_at timestamptz)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_generic_plan
as $$
declare
    v_user  text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_name  text;    -- the prepared statement's name
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.working_state_delegated', 'harbor.working_state', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    -- one server's statement, on the tenant's shard table (sql/citus/delegated.sql)
    v_name := harbor._statement_on_shard(
        'harbor_working_', 'harbor.working_state', p_tenant_id, $q$
        prepare %s(text, text, text, text, text) as
        select w.state, w.expires_at
          from %s w
         where w.tenant_id = $1 and w.user_id = $2 and w.session_id = $3
           and w.run_id = $4 and w.project_id = $5
         order by w.id desc
         limit 1 $q$);
    return query execute pg_catalog.format('execute %s(%L, %L, %L, %L, %L)', v_name,
                                           p_tenant_id, v_user, p_session_id, p_run_id,
                                           p_project_id);
end
$$;
alter function harbor.working_state_delegated(text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.working_state_delegated(text, text, text, text, text, text)
    from public, harbor_admin;
grant execute on function harbor.working_state_delegated(text, text, text, text, text, text)
    to harbor_app;

-- A run's working state written (MemoryManager.update: its keys merged into the run's
-- newest state as a new version, the older versions dropped) on a distributed database,
-- in one call that Citus delegates whole to the tenant's worker, as the read above. The
-- steps are the one-server statements' (sql/queries/working.sql: lock_run, then
-- update_working), in the call's one transaction: the run's lock row of
-- harbor.owner_locks taken first (writers of one run take turns), then the newest
-- visible state read, the merged one inserted, the older visible versions deleted. A
-- version's id is drawn from the sequence as on one server, and kept above the run's
-- newest: each worker draws from its own range of it (Citus gives each node one), so a
-- tenant moved to a node with a lower range would otherwise write a version that reads
-- as older than the one it replaces (as the append keeps a turn above its session's,
-- sql/citus/append.sql). The statements address the tenant's shard tables on the worker
-- (prepared once a connection, harbor._prepare_on_shard; the distributed tables on the
-- coordinator, for a call Citus did not delegate), under the same policies.
create or replace function harbor._working_statements(p_tenant_id text) returns text
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key text := 'tables';
    v_state text;
    v_locks text;
    v_names text[];
begin
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        v_key := get_shard_id_for_distribution_column('harbor.working_state'::regclass,
                                                      p_tenant_id)::text;
    end if;
    -- (prepared already: their names are all this needs)
    if harbor._prepared_on_shard('harbor_working_lock_' || v_key) then
        return v_key;
    end if;
    v_state := harbor._tenant_table('harbor.working_state', p_tenant_id);
    v_locks := harbor._tenant_table('harbor.owner_locks', p_tenant_id);
    v_names := array['harbor_working_lock_' || v_key, 'harbor_working_newest_' || v_key,
                     'harbor_working_insert_' || v_key, 'harbor_working_older_' || v_key];
    perform harbor._prepare_on_shard(v_names, array[
        format('prepare %s(text, text, text, text, text) as insert into %s as l (tenant_id,'
               ' user_id, session_id, scope, project_id, run_id) values ($1, $2, $3, ''run'','
               ' $4, $5) on conflict (tenant_id, user_id, session_id, scope, project_id,'
               ' run_id) do update set scope = excluded.scope where false',
               v_names[1], v_locks),
        format('prepare %s(text, text, text, text, text) as select w.id, w.state from %s w'
               ' where w.tenant_id = $1 and w.user_id = $2 and w.session_id = $3'
               ' and w.run_id = $4 and w.project_id = $5 order by w.id desc limit 1',
               v_names[2], v_state),
        format('prepare %s(text, bigint, text, text, text, text, text, jsonb,'
               ' double precision) as insert into %s as w (tenant_id, id, project_id,'
               ' user_id, session_id, run_id, principal_id, state, expires_at)'
               ' overriding system value values ($1, $2, $3, $4, $5, $6, $7, $8,'
               ' case when $9 is null then null'
               ' else pg_catalog.now() + pg_catalog.make_interval(secs => $9) end)'
               ' on conflict do nothing returning w.id, w.state, w.expires_at',
               v_names[3], v_state),
        format('prepare %s(text, text, text, text, text, bigint) as delete from %s w'
               ' where w.tenant_id = $1 and w.user_id = $2 and w.session_id = $3'
               ' and w.run_id = $4 and w.project_id = $5 and w.id < $6',
               v_names[4], v_state)]);
    return v_key;
end
$$;
alter function harbor._working_statements(text) owner to harbor_owner;
revoke all on function harbor._working_statements(text) from public;
grant execute on function harbor._working_statements(text) to harbor_app;

create or replace function harbor.working_update_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_state jsonb, p_ttl_seconds double precision
) returns table (state jsonb, expires_at timestamptz)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_user   text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_key    text;    -- the suffix of the prepared statements' names
    v_last   bigint;  -- the run's newest visible version
    v_merged jsonb;   -- its state, the keys given merged in
    v_id     bigint;
    v_new    bigint;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.working_update_delegated', 'harbor.working_state', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    v_key := harbor._working_statements(p_tenant_id);
    execute format('execute harbor_working_lock_%s(%L, %L, %L, %L, %L)', v_key, p_tenant_id,
                   v_user, p_session_id, p_project_id, p_run_id);
    execute format('execute harbor_working_newest_%s(%L, %L, %L, %L, %L)', v_key, p_tenant_id,
                   v_user, p_session_id, p_run_id, p_project_id)
        into v_last, v_merged;
    v_merged := coalesce(v_merged, '{}'::jsonb) || p_state;
    v_id := pg_catalog.nextval(pg_catalog.pg_get_serial_sequence('harbor.working_state', 'id'));
    loop
        if v_id <= v_last then
            v_id := v_last + 1;
        end if;
        execute format('execute harbor_working_insert_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L)',
                       v_key, p_tenant_id, v_id, p_project_id, v_user, p_session_id, p_run_id,
                       coalesce(p_principal_id, ''), v_merged, p_ttl_seconds)
            into v_new, state, expires_at;
        exit when v_new is not null;
        -- (the id is another run's of the tenant: the next one)
        v_last := v_id;
    end loop;
    execute format('execute harbor_working_older_%s(%L, %L, %L, %L, %L, %L)', v_key,
                   p_tenant_id, v_user, p_session_id, p_run_id, p_project_id, v_new);
    return next;
end
$$;
alter function harbor.working_update_delegated(text, text, text, text, text, text, jsonb,
                                               double precision)
    owner to harbor_owner;
revoke all on function harbor.working_update_delegated(text, text, text, text, text, text,
                                                       jsonb, double precision)
    from public, harbor_admin;
grant execute on function harbor.working_update_delegated(text, text, text, text, text, text,
                                                          jsonb, double precision)
    to harbor_app;
