-- Recall on a distributed database, in one call that Citus delegates whole to the
-- tenant's worker (harbor-pg distribute registers it with create_distributed_function,
-- distribution argument p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus).
-- The coordinator sends the one call, in autocommit: no transaction block, no SET LOCAL;
-- the worker runs recall on its tenant's shard tables, through twins of recall's Citus
-- forms made in its connection (harbor._recall_twin, below): the candidate legs' twins
-- are SECURITY DEFINER as on one server, and read through the same indexes. Called on
-- the coordinator, harbor.recall()'s statements were each planned there and sent to the
-- worker, a hop and two plannings each.
--
-- The identity travels as the call's arguments, as harbor.append_turn's does
-- (sql/citus/append.sql): the function sets it (SET LOCAL, for the worker's
-- transaction) and checks it against what the policies read, harbor.caller_tenant(),
-- caller_user() and caller_session(), which give a bound role's binding (the reference
-- table, read from the worker's own placement) whatever was set. A caller that names
-- another tenant (the distribution argument: the call is sent to that tenant's worker),
-- user or session than its own is refused before any row is read. harbor.recall() then
-- runs as the caller (security invoker), under the same policies as on one server.

-- harbor._recall_twin: recall's twins for the caller's tenant's shard, in this connection,
-- made unless they are there; returns their names' suffix (the shard's id and the
-- templates' version). They are temporary functions (pg_temp, this connection's alone,
-- dropped with it): the statements of recall_on_shard() and its candidate legs with each
-- co-located table replaced by the tenant's shard of it (harbor._recall_twin_templates(),
-- made by harbor-pg distribute, harbor_pg.db.citus). A statement on a distributed table
-- pays Citus's planning and execution on the worker every time it runs, 0.5-1 ms a
-- statement beside the shard query's own 0.05-0.2 ms (a delegated recall runs about ten:
-- on a worker, 11 ms against about 2); on the shard table it is PostgreSQL's alone, its
-- plan kept by the connection. Made by harbor_search (SECURITY DEFINER, BYPASSRLS,
-- NOLOGIN), so the legs' twins are definers owned by it, as the legs are; a function of
-- one of the twins' names that harbor_search does not own (another role of the session
-- made it first) is refused, not used. Only on the node that holds the shard, for the
-- caller's own tenant (recall_delegated holds the shard before it calls this).
create or replace function harbor._recall_twin(p_tenant_id text) returns text
    language plpgsql volatile security definer
    set search_path to pg_catalog, pg_temp
    -- (a temporary function is this connection's alone: nothing to send to other nodes,
    -- and a worker refuses to send DDL)
    set citus.enable_ddl_propagation to off
    -- (its statements read no distributed table: their generic plans, kept by the
    -- connection; the lookup of the twins was planned again at each recall, 0.2 ms)
    set plan_cache_mode to force_generic_plan
    -- (the templates are the one-server functions' own definitions, checked when those
    -- were made: checked again, the twins cost a connection's first recall on a shard
    -- about 8 ms more, 30 against 22 ms to make them on a worker)
    set check_function_bodies to off
as $$
declare
    -- the templates' version, then each twin's name (without the suffix) and its template
    v_templates text[] := harbor._recall_twin_templates();
    v_suffix    text;
    v_names     text[];
    v_text      text;
    v_table     text;
begin
    if p_tenant_id is distinct from harbor.caller_tenant() then
        raise exception 'harbor._recall_twin: not the caller''s tenant' using errcode = '42501';
    end if;
    v_suffix := get_shard_id_for_distribution_column('harbor.memories', p_tenant_id)::text
                || '_' || v_templates[1];
    v_names := array(select v_templates[i] || '_' || v_suffix
                       from pg_catalog.generate_series(2, cardinality(v_templates), 2) i);
    if (select count(*) from pg_catalog.pg_proc p
         where p.pronamespace = pg_catalog.pg_my_temp_schema() and p.proname = any (v_names)
           and p.proowner = 'harbor_search'::regrole) = cardinality(v_names) then
        return v_suffix;
    end if;
    if exists (select 1 from pg_catalog.pg_proc p
                where p.pronamespace = pg_catalog.pg_my_temp_schema()
                  and p.proname = any (v_names)) then
        raise exception 'harbor._recall_twin: a function of this connection holds the name of'
                        ' a recall twin' using errcode = '42501';
    end if;
    for i in 3 .. cardinality(v_templates) by 2 loop
        v_text := replace(v_templates[i], '@@suffix@@', v_suffix);
        -- each co-located table the template names, as the tenant's shard of it
        for v_table in select distinct t.m[1]
                         from pg_catalog.regexp_matches(v_text, '@@(harbor\.\w+)@@', 'g') t(m)
        loop
            v_text := replace(v_text, '@@' || v_table || '@@',
                              harbor._tenant_table(v_table::regclass, p_tenant_id));
        end loop;
        execute v_text;
    end loop;
    return v_suffix;
end
$$;
grant create on schema harbor to harbor_search;
alter function harbor._recall_twin(text) owner to harbor_search;
revoke create on schema harbor from harbor_search;
revoke all on function harbor._recall_twin(text) from public;
grant execute on function harbor._recall_twin(text) to harbor_app, harbor_search;

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
    -- node's): recall's twins on the tenant's shard tables (harbor._recall_twin, above),
    -- whose candidate legs read as on one server; elsewhere harbor.recall() itself
    if (select g.groupid from pg_dist_local_group g) <> 0
       and 'global' <> all (coalesce(recall_delegated.scopes, '{}')) then
        return query execute pg_catalog.format(
            'select r.* from pg_temp.%I($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,'
            ' $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23) r',
            'recall_on_shard_' || harbor._recall_twin(p_tenant_id))
        using recall_delegated.query, recall_delegated.query_embedding,
              recall_delegated.model_id, recall_delegated.scopes, recall_delegated.top_k,
              recall_delegated.anchor_entity_ids, recall_delegated.wanted_types,
              recall_delegated.as_of, recall_delegated.recency_half_life_hours,
              recall_delegated.entity_weight, recall_delegated.type_weight,
              recall_delegated.rrf_k, recall_delegated.min_similarity,
              recall_delegated.token_budget, recall_delegated.candidates,
              recall_delegated.dense_weight, recall_delegated.lexical_weight,
              recall_delegated.fusion, recall_delegated.max_sensitivity,
              recall_delegated.neighbour_weight, recall_delegated.date_weight,
              recall_delegated.importance_half_life_hours, recall_delegated.excluded_types;
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
