-- Recall on a distributed database, in one call that Citus delegates whole to the
-- tenant's worker (harbor-pg distribute registers it with create_distributed_function,
-- distribution argument p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus).
-- The coordinator sends the one call, in autocommit: no transaction block, no SET LOCAL;
-- the worker runs recall on its own shards (Citus's local execution), through the twins
-- harbor.recall_on_shard() and its candidate legs, which harbor-pg distribute makes of
-- recall's Citus forms: the legs there are SECURITY DEFINER as on one server, and read
-- through the same indexes (harbor_pg.db.citus, _ON_SHARD). Called on the coordinator,
-- harbor.recall()'s statements were each planned there and sent to the worker, a hop
-- and two plannings each.
--
-- The identity travels as the call's arguments, as harbor.append_turn's does
-- (sql/citus/append.sql): the function sets it (SET LOCAL, for the worker's
-- transaction) and checks it against what the policies read, harbor.caller_tenant(),
-- caller_user() and caller_session(), which give a bound role's binding (the reference
-- table, read from the worker's own placement) whatever was set. A caller that names
-- another tenant (the distribution argument: the call is sent to that tenant's worker),
-- user or session than its own is refused before any row is read. harbor.recall() then
-- runs as the caller (security invoker), under the same policies as on one server.
create or replace function harbor.recall_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    query text,
    query_embedding public.vector default null,
    model_id text default null,
    scopes harbor.memory_scope[] default '{user,project,session}',
    top_k integer default 6,
    anchor_entity_ids text[] default '{}',
    wanted_types harbor.memory_type[] default '{}',
    as_of timestamptz default null,
    recency_half_life_hours double precision default 4320,
    entity_weight double precision default 0.5,
    type_weight double precision default 0.5,
    rrf_k integer default 5,
    min_similarity double precision default null,
    token_budget integer default null,
    candidates integer default null,
    dense_weight double precision default 0.75,
    lexical_weight double precision default 1,
    fusion text default 'rrf',
    max_sensitivity harbor.sensitivity default 'pii',
    neighbour_weight double precision default 0.75,
    date_weight double precision default 2,
    importance_half_life_hours double precision default null,
    excluded_types harbor.memory_type[] default '{}'
) returns table (
    rank integer, id text, tenant_id text, scope text, project_id text, principal_id text,
    user_id text, session_id text, run_id text, memory_type text, content text,
    content_hash text, importance real, entity_ids text[], source text, sensitivity text,
    valid_from timestamptz, invalid_at timestamptz, superseded_by text,
    source_session_id text, source_message_ids text[], metadata jsonb, context text,
    created_at timestamptz, updated_at timestamptz, expires_at timestamptz,
    dense_rank integer, similarity double precision, lexical_rank integer,
    lexical_score double precision, substring_match boolean, relevance double precision,
    recency double precision, entity double precision, type_boost double precision,
    score double precision, tokens integer, neighbour double precision,
    date_match double precision
)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.recall_delegated', 'harbor.memories', p_tenant_id, p_project_id, p_principal_id,
        p_user_id, p_session_id, p_run_id);
    -- on the worker that holds the tenant's shard (the call was delegated), without
    -- the global scope (whose memories are on the shard of tenant '', maybe another
    -- node's): recall's twins for this node alone (harbor_pg.db.citus), whose
    -- candidate legs read as on one server; elsewhere harbor.recall() itself
    if (select g.groupid from pg_dist_local_group g) <> 0
       and 'global' <> all (coalesce(recall_delegated.scopes, '{}')) then
        return query
        select r.* from harbor.recall_on_shard(
            recall_delegated.query, recall_delegated.query_embedding, recall_delegated.model_id,
            recall_delegated.scopes, recall_delegated.top_k, recall_delegated.anchor_entity_ids,
            recall_delegated.wanted_types, recall_delegated.as_of,
            recall_delegated.recency_half_life_hours, recall_delegated.entity_weight,
            recall_delegated.type_weight, recall_delegated.rrf_k, recall_delegated.min_similarity,
            recall_delegated.token_budget, recall_delegated.candidates,
            recall_delegated.dense_weight, recall_delegated.lexical_weight,
            recall_delegated.fusion, recall_delegated.max_sensitivity,
            recall_delegated.neighbour_weight, recall_delegated.date_weight,
            recall_delegated.importance_half_life_hours, recall_delegated.excluded_types) r;
    else
        return query
        select r.* from harbor.recall(
            recall_delegated.query, recall_delegated.query_embedding, recall_delegated.model_id,
            recall_delegated.scopes, recall_delegated.top_k, recall_delegated.anchor_entity_ids,
            recall_delegated.wanted_types, recall_delegated.as_of,
            recall_delegated.recency_half_life_hours, recall_delegated.entity_weight,
            recall_delegated.type_weight, recall_delegated.rrf_k, recall_delegated.min_similarity,
            recall_delegated.token_budget, recall_delegated.candidates,
            recall_delegated.dense_weight, recall_delegated.lexical_weight,
            recall_delegated.fusion, recall_delegated.max_sensitivity,
            recall_delegated.neighbour_weight, recall_delegated.date_weight,
            recall_delegated.importance_half_life_hours, recall_delegated.excluded_types) r;
    end if;
end
$$;
alter function harbor.recall_delegated(text, text, text, text, text, text, text, public.vector,
    text, harbor.memory_scope[], integer, text[], harbor.memory_type[], timestamptz,
    double precision, double precision, double precision, integer, double precision, integer,
    integer, double precision, double precision, text, harbor.sensitivity, double precision,
    double precision, double precision, harbor.memory_type[])
    owner to harbor_owner;
revoke all on function harbor.recall_delegated(text, text, text, text, text, text, text,
    public.vector, text, harbor.memory_scope[], integer, text[], harbor.memory_type[],
    timestamptz, double precision, double precision, double precision, integer,
    double precision, integer, integer, double precision, double precision, text,
    harbor.sensitivity, double precision, double precision, double precision,
    harbor.memory_type[])
    from public, harbor_admin;
grant execute on function harbor.recall_delegated(text, text, text, text, text, text, text,
    public.vector, text, harbor.memory_scope[], integer, text[], harbor.memory_type[],
    timestamptz, double precision, double precision, double precision, integer,
    double precision, integer, integer, double precision, double precision, text,
    harbor.sensitivity, double precision, double precision, double precision,
    harbor.memory_type[])
    to harbor_app, harbor_search;
