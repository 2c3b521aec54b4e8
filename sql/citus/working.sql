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
as $$
declare
    v_user  text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_shard bigint;  -- the tenant's shard of harbor.working_state
    v_name  text;    -- the prepared statement's name
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.working_state_delegated', 'harbor.working_state', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    if (select g.groupid from pg_dist_local_group g) = 0 then
        -- on the coordinator (a call in a transaction block, not delegated): the run's
        -- state under the policies, routed by Citus to the tenant's shard
        return query
        select w.state, w.expires_at
          from harbor.working_state w
         where w.tenant_id = p_tenant_id and w.user_id = v_user
           and w.session_id = p_session_id and w.run_id = p_run_id
           and w.project_id = p_project_id
         order by w.id desc
         limit 1;
        return;
    end if;
    -- on the worker that holds the tenant's shard: the same statement over the shard
    -- table, which carries the distributed table's policies, prepared once a connection
    -- (harbor._prepare_on_shard) and run by name
    v_shard := get_shard_id_for_distribution_column('harbor.working_state'::regclass,
                                                    p_tenant_id);
    v_name := 'harbor_working_' || v_shard;
    perform harbor._prepare_on_shard(array[v_name], array[pg_catalog.format($q$
        prepare %s(text, text, text, text, text) as
        select w.state, w.expires_at
          from %s w
         where w.tenant_id = $1 and w.user_id = $2 and w.session_id = $3
           and w.run_id = $4 and w.project_id = $5
         order by w.id desc
         limit 1 $q$, v_name, shard_name('harbor.working_state'::regclass, v_shard))]);
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
