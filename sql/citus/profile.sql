-- A user's profile (MemoryManager.profile) on a distributed database, in one call that
-- Citus delegates whole to the tenant's worker (harbor-pg distribute registers it with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.memories; harbor_pg.db.citus). Sent in autocommit, it is the one command the
-- coordinator sends for it: no transaction block, no SET LOCAL, no commit round trip. Run
-- on the coordinator, harbor.profile()'s statements (the owner keys' memories,
-- harbor._owner_memories(), then their recall counts, harbor._memory_hits_of()) were each
-- planned there and sent on to the worker, with the transaction's BEGIN, identity and
-- COMMIT; here they run on the worker that holds the tenant's shards, over its shard
-- tables, through twins of profile() and the two functions made in the worker's
-- connection (as recall's: harbor._recall_twin, sql/citus/recall.sql). Run as
-- harbor.profile() on the worker, each statement paid Citus's planning there (local
-- execution), and the call was no faster than the coordinator's transaction.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. Then the
-- profile runs as the caller (security invoker), under the same policies (the shard
-- tables carry them), with the identity set: the rows are its own.
create or replace function harbor.profile_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    scopes harbor.memory_scope[] default '{user}',
    token_budget integer default 400,
    stable_after interval default '30 days',
    as_of timestamptz default null,
    max_sensitivity harbor.sensitivity default 'pii'
) returns table (
    section text, rank integer, id text, tenant_id text, scope text, project_id text,
    principal_id text, user_id text, session_id text, run_id text, memory_type text,
    content text, content_hash text, importance real, entity_ids text[], source text,
    sensitivity text, valid_from timestamptz, tokens integer
)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.profile_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, coalesce(nullif(p_user_id, ''), p_principal_id, ''), p_session_id,
        p_run_id);
    -- on the worker that holds the tenant's shard (the call was delegated): the profile's
    -- twin over the tenant's shard tables (harbor._recall_twin, sql/citus/recall.sql, makes
    -- it with recall's), whose statements PostgreSQL alone plans, as on one server;
    -- elsewhere harbor.profile() itself
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        return query execute pg_catalog.format(
            'select p.* from pg_temp.%I($1, $2, $3, $4, $5) p',
            'profile_on_shard_' || harbor._recall_twin(p_tenant_id))
        using profile_delegated.scopes, profile_delegated.token_budget,
              profile_delegated.stable_after, profile_delegated.as_of,
              profile_delegated.max_sensitivity;
    else
        return query
        select p.*
          from harbor.profile(profile_delegated.scopes, profile_delegated.token_budget,
                              profile_delegated.stable_after, profile_delegated.as_of,
                              profile_delegated.max_sensitivity) p;
    end if;
end
$$;
alter function harbor.profile_delegated(text, text, text, text, text, text,
                                        harbor.memory_scope[], integer, interval, timestamptz,
                                        harbor.sensitivity)
    owner to harbor_owner;
revoke all on function harbor.profile_delegated(text, text, text, text, text, text,
                                                harbor.memory_scope[], integer, interval,
                                                timestamptz, harbor.sensitivity)
    from public, harbor_admin;
grant execute on function harbor.profile_delegated(text, text, text, text, text, text,
                                                   harbor.memory_scope[], integer, interval,
                                                   timestamptz, harbor.sensitivity)
    to harbor_app;
