-- A lexical search on a distributed database: this function, which Citus delegates whole to
-- the tenant's worker (harbor-pg distribute registers it with create_distributed_function,
-- distribution argument p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus),
-- for the tenant's memories, and, only when global memories may exist, search_global
-- (sql/queries/citus.sql), a statement Citus routes to the node of tenant '' (the global
-- memories' shard), which any caller may read. Whether they may exist is a flag this
-- function reads on the worker (harbor.global_memory_flag, sql/citus/global.sql): when it
-- is set, its answer ends with one more row, every column of which is null (the id too),
-- which stands for the global memories and tells the facade (harbor_pg.tiers.long_term) to
-- read them; unset, a search is this one command to one worker. Each is one command to one
-- node, in autocommit: no transaction block, no SET LOCAL, no commit round trip. The
-- facade merges the two lists by the search's order (the rank column, then importance,
-- then the newest, then the id). What they replace was one statement in a transaction,
-- which the coordinator planned against both shards and whose BEGIN, identity and COMMIT
-- it sent on to each node. One call that read the global memories itself is not possible
-- at the same cost: on another worker than the tenant's, they were read over a connection
-- Citus opened for the call and closed after it (a delegated call's own connections to
-- other nodes are not kept), 15-20 ms a search.
--
-- The identity travels as the call's first arguments, as recall's does
-- (sql/citus/recall.sql): harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET
-- LOCAL) and checks it against what the policies read; a caller that names another tenant
-- (the distribution argument), user or session than its own is refused before any row is
-- read. The statement then runs as the caller (security invoker), under the same policies
-- as every other read.
create or replace function harbor.search_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    query text, as_of timestamptz default null, result_limit integer default 10
) returns table (
    id text, tenant_id text, scope text, project_id text, principal_id text, user_id text,
    session_id text, run_id text, memory_type text, content text, content_hash text,
    importance real, entity_ids text[], source text, sensitivity text,
    valid_from timestamptz, invalid_at timestamptz, superseded_by text,
    source_session_id text, source_message_ids text[], metadata jsonb, context text,
    created_at timestamptz, updated_at timestamptz, expires_at timestamptz, rank real
)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_generic_plan
as $$
declare
    v_as_of timestamptz := coalesce(search_delegated.as_of, pg_catalog.now());
    v_query text := left(search_delegated.query, 20000);
    v_shard bigint;  -- the tenant's shard of harbor.memories
    v_name  text;    -- the prepared statement's name
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.search_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, p_user_id, p_session_id, p_run_id);
    if v_query is null or btrim(v_query) = '' then
        return;
    end if;
    if (select g.groupid from pg_dist_local_group g) = 0 then
        -- on the coordinator (a call in a transaction block, not delegated): the tenant's
        -- rows under the policies, routed by Citus to its shard (planned as Citus plans
        -- it: the generic plans of the SET clause are for the statement on the shard
        -- table below, sql/citus/delegated.sql)
        perform pg_catalog.set_config('plan_cache_mode', 'auto', true);
        return query
        select m.id, m.tenant_id, m.scope::text, m.project_id, m.principal_id, m.user_id,
               m.session_id, m.run_id, m.memory_type::text, m.content, m.content_hash,
               m.importance, m.entity_ids, m.source, m.sensitivity::text, lower(m.valid),
               upper(m.valid), m.superseded_by, m.source_session_id, m.source_message_ids,
               m.metadata, m.context, m.created_at, m.updated_at, m.expires_at,
               pg_catalog.ts_rank_cd(m.fts, q.tsq)
          from harbor.memories m,
               (select harbor.or_tsquery(v_query) as tsq) q
         where m.tenant_id = p_tenant_id
           and m.valid operator(pg_catalog.@>) v_as_of
           and not coalesce(m.expires_at operator(pg_catalog.<=) v_as_of, false)
           and m.memory_type operator(pg_catalog.<>) 'summary'
           and (m.fts operator(pg_catalog.@@) q.tsq
                or pg_catalog.strpos(pg_catalog.lower(m.content), pg_catalog.lower(v_query)) > 0)
         order by pg_catalog.ts_rank_cd(m.fts, q.tsq) desc, m.importance desc,
                  lower(m.valid) desc, m.id collate "C"
         limit search_delegated.result_limit;
        if harbor._global_memories_may_exist() then
            return next;  -- (the marker: no output column was assigned, all are null)
        end if;
        return;
    end if;
    -- on the worker that holds the tenant's shard: one server's search (search_memories,
    -- sql/queries/long_term.sql: the caller's owner keys read one by one) over the shard
    -- table, which carries the distributed table's policies: PostgreSQL's statement alone,
    -- prepared once a connection (harbor._prepare_on_shard, sql/citus/delegated.sql; Citus
    -- keeps its connections to the workers open) and run by name. On the distributed table
    -- it paid Citus's planning and execution on the worker (about 1 ms), and run by
    -- EXECUTE its planning (1.4 ms).
    v_shard := get_shard_id_for_distribution_column('harbor.memories'::regclass, p_tenant_id);
    v_name := 'harbor_search_' || v_shard;
    if not harbor._prepared_on_shard(v_name) then
        perform harbor._prepare_on_shard(array[v_name], array[pg_catalog.format($q$
            prepare %s(text, timestamptz, integer) as
            select m.id, m.tenant_id, m.scope::text, m.project_id, m.principal_id, m.user_id,
                   m.session_id, m.run_id, m.memory_type::text, m.content, m.content_hash,
                   m.importance, m.entity_ids, m.source, m.sensitivity::text, lower(m.valid),
                   upper(m.valid), m.superseded_by, m.source_session_id, m.source_message_ids,
                   m.metadata, m.context, m.created_at, m.updated_at, m.expires_at,
                   pg_catalog.ts_rank_cd(m.fts, q.tsq)
              from (select harbor.or_tsquery($1) as tsq) q,
                   harbor._caller_identity() i
             cross join lateral harbor._recall_keys('{tenant,project,user,session,run}',
                                                    i.tenant_id, i.project_id, i.user_id,
                                                    i.session_id, i.run_id) k
             cross join lateral (
                 select m.*
                   from %s m
                  where m.tenant_id = k.tenant_id and m.scope = k.scope
                    and m.user_id = k.user_id and m.project_id = k.project_id
                    and m.session_id = k.session_id and m.run_id = k.run_id
                 offset 0) m
             where m.valid operator(pg_catalog.@>) $2
               and not coalesce(m.expires_at operator(pg_catalog.<=) $2, false)
               and m.memory_type operator(pg_catalog.<>) 'summary'
               and (m.fts operator(pg_catalog.@@) q.tsq
                    or pg_catalog.strpos(pg_catalog.lower(m.content), pg_catalog.lower($1)) > 0)
             order by pg_catalog.ts_rank_cd(m.fts, q.tsq) desc, m.importance desc,
                      lower(m.valid) desc, m.id collate "C"
             limit $3 $q$, v_name, harbor._tenant_table('harbor.memories', p_tenant_id))]);
    end if;
    return query execute pg_catalog.format('execute %s(%L, %L, %L)', v_name, v_query, v_as_of,
                                           search_delegated.result_limit);
    -- the global memories' marker (above), from this node's copy of the flag
    if harbor._global_memories_may_exist() then
        return next;  -- (the marker: no output column was assigned, all are null)
    end if;
end
$$;
alter function harbor.search_delegated(text, text, text, text, text, text, text, timestamptz,
                                       integer)
    owner to harbor_owner;
revoke all on function harbor.search_delegated(text, text, text, text, text, text, text,
                                               timestamptz, integer)
    from public, harbor_admin;
grant execute on function harbor.search_delegated(text, text, text, text, text, text, text,
                                                  timestamptz, integer)
    to harbor_app, harbor_search;
