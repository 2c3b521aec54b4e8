-- A page of a session's turns on a distributed database, each read in one call that Citus
-- delegates whole to the tenant's worker (harbor-pg distribute registers them with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.messages; harbor_pg.db.citus): the turns after a cursor id
-- (PostgresShortTermStore.after: a summary's catch-up, messages_after) and the newest turns
-- up to and including one (PostgresShortTermStore.turns_through: what a queued extraction
-- reads, turns_through; sql/queries/short_term.sql). Sent in autocommit, each is the one
-- command the coordinator sends for it, and its own transaction on the worker: no
-- transaction block, no SET LOCAL, no commit round trip.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. One server's
-- statement then runs as the caller (security invoker), over the tenant's shard table
-- (prepared once a connection, harbor._prepare_on_shard, unless harbor._prepared_on_shard
-- finds it; on the coordinator, a call in a transaction block, over the distributed table,
-- which Citus routes to the tenant's shard), under the policies that table carries.

create or replace function harbor.messages_after_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_after_id bigint, p_before_id bigint, p_limit integer
) returns table (id bigint, role text, content text, name text, tool_calls jsonb,
                 tool_call_id text, metadata jsonb, created_at timestamptz)
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
        'harbor.messages_after_delegated', 'harbor.messages', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    v_name := harbor._statement_on_shard(
        'harbor_messages_after_', 'harbor.messages', p_tenant_id, $q$
        prepare %s(text, text, text, bigint, bigint, integer) as
        select m.id, m.role::text as role, m.content, m.name, m.tool_calls,
               m.tool_call_id, m.metadata, m.created_at
          from %s m
         where m.tenant_id = $1 and m.user_id = $2
           and m.session_id = $3 and m.id > $4
           and ($5 is null or m.id < $5)
         order by m.id
         limit $6 $q$);
    return query execute pg_catalog.format('execute %s(%L, %L, %L, %L, %L, %L)', v_name,
                                           p_tenant_id, v_user, p_session_id, p_after_id,
                                           p_before_id, p_limit);
end
$$;
alter function harbor.messages_after_delegated(
    text, text, text, text, text, text, bigint, bigint, integer)
    owner to harbor_owner;
revoke all on function harbor.messages_after_delegated(
    text, text, text, text, text, text, bigint, bigint, integer)
    from public, harbor_admin;
grant execute on function harbor.messages_after_delegated(
    text, text, text, text, text, text, bigint, bigint, integer)
    to harbor_app;

create or replace function harbor.turns_through_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_message_id bigint, p_limit integer
) returns table (id bigint, role text, content text, name text, tool_calls jsonb,
                 tool_call_id text, metadata jsonb, created_at timestamptz)
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
        'harbor.turns_through_delegated', 'harbor.messages', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    v_name := harbor._statement_on_shard(
        'harbor_turns_through_', 'harbor.messages', p_tenant_id, $q$
        prepare %s(text, text, text, bigint, integer) as
        select t.id, t.role, t.content, t.name, t.tool_calls, t.tool_call_id,
               t.metadata, t.created_at
          from (select m.id, m.role::text as role, m.content, m.name, m.tool_calls,
                       m.tool_call_id, m.metadata, m.created_at
                  from %s m
                 where m.tenant_id = $1 and m.user_id = $2
                   and m.session_id = $3 and m.id <= $4
                 order by m.id desc
                 limit $5) t
         order by t.id $q$);
    return query execute pg_catalog.format('execute %s(%L, %L, %L, %L, %L)', v_name,
                                           p_tenant_id, v_user, p_session_id, p_message_id,
                                           p_limit);
end
$$;
alter function harbor.turns_through_delegated(
    text, text, text, text, text, text, bigint, integer)
    owner to harbor_owner;
revoke all on function harbor.turns_through_delegated(
    text, text, text, text, text, text, bigint, integer)
    from public, harbor_admin;
grant execute on function harbor.turns_through_delegated(
    text, text, text, text, text, text, bigint, integer)
    to harbor_app;
