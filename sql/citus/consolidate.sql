-- A consolidation (MemoryManager.consolidate) on a distributed database, in one call that
-- Citus delegates whole to the tenant's worker (harbor-pg distribute registers it with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.memories; harbor_pg.db.citus). Sent in autocommit, it is the one command the
-- coordinator sends for it, and its own transaction on the worker, which commits in one
-- phase. Run on the coordinator in a transaction, harbor.consolidate_memories()'s
-- statements (the content vectors, the candidates, the locks, then each group's writes)
-- were each planned there and sent on to the worker with the transaction's BEGIN,
-- identity and COMMIT; here they run on the worker that holds the tenant's shards, where
-- Citus executes them on its own shards (local execution), with no other node reached.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. Then
-- harbor.consolidate_memories() runs as the caller (security invoker), under the same
-- policies, with the identity set: it reads and writes the caller's own owner keys.
create or replace function harbor.consolidate_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    scopes harbor.memory_scope[] default '{user}',
    min_similarity double precision default null,
    model_id text default null,
    max_merges integer default 1000,
    dry_run boolean default false,
    since timestamptz default null,
    merged jsonb default null
) returns table (successor_id text, merged_ids text[], matched_by text, content text)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.consolidate_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, coalesce(nullif(p_user_id, ''), p_principal_id, ''), p_session_id,
        p_run_id);
    return query
    select c.*
      from harbor.consolidate_memories(
               consolidate_delegated.scopes, consolidate_delegated.min_similarity,
               consolidate_delegated.model_id, consolidate_delegated.max_merges,
               consolidate_delegated.dry_run, consolidate_delegated.since,
               consolidate_delegated.merged) c;
end
$$;
alter function harbor.consolidate_delegated(text, text, text, text, text, text,
                                            harbor.memory_scope[], double precision, text,
                                            integer, boolean, timestamptz, jsonb)
    owner to harbor_owner;
revoke all on function harbor.consolidate_delegated(text, text, text, text, text, text,
                                                    harbor.memory_scope[], double precision,
                                                    text, integer, boolean, timestamptz, jsonb)
    from public, harbor_admin;
grant execute on function harbor.consolidate_delegated(text, text, text, text, text, text,
                                                       harbor.memory_scope[], double precision,
                                                       text, integer, boolean, timestamptz,
                                                       jsonb)
    to harbor_app;
