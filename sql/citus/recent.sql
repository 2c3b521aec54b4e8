-- A session's newest turns on a distributed database, in one call that Citus delegates
-- whole to the tenant's worker (harbor-pg distribute registers it with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.messages; harbor_pg.db.citus). Sent in autocommit, it is the one command the
-- coordinator sends for it: no transaction block, no SET LOCAL, no commit round trip. What
-- it replaces was harbor.recent_turns in a transaction whose BEGIN, identity and COMMIT the
-- coordinator sent on to the worker around the statement.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does
-- (sql/citus/append.sql, search.sql): harbor._delegated_caller (sql/citus/delegated.sql)
-- sets it (SET LOCAL) and checks it against what the policies read; a caller that names
-- another tenant (the distribution argument), user or session than its own is refused
-- before any row is read. The statement then runs as the caller (security invoker), under
-- the policies of harbor.messages, which its shard tables carry.
--
-- The rows are recent_turns' (sql/functions/tiers.sql): the session's newest p_limit turns,
-- oldest first. With p_ttl_seconds, those a session TTL of inactivity has not expired, as
-- recent_live_turns (sql/queries/short_term.sql) reads them: the newest turns up to the
-- first gap longer than the TTL, the gap from the newest turn to now counted too.
create or replace function harbor.recent_turns_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_limit integer,
    p_ttl_seconds double precision default null
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
        'harbor.recent_turns_delegated', 'harbor.messages', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    -- one server's statement, on the tenant's shard table (sql/citus/delegated.sql)
    v_name := harbor._statement_on_shard(
        'harbor_recent_', 'harbor.messages', p_tenant_id, $q$
        prepare %s(text, text, text, integer, double precision) as
        select l.id, l.role, l.content, l.name, l.tool_calls, l.tool_call_id, l.metadata,
               l.created_at
          from (select g.*,
                       bool_or(g.gap_after) over (order by g.id desc
                                                  rows between unbounded preceding
                                                           and current row) as expired
                  from (select r.*,
                               coalesce(lag(r.created_at) over (order by r.id desc),
                                        pg_catalog.now()) - r.created_at
                                   > make_interval(secs => $5) as gap_after
                          from (select m.id, m.role::text as role, m.content, m.name,
                                       m.tool_calls, m.tool_call_id, m.metadata, m.created_at
                                  from %s m
                                 where m.tenant_id = $1 and m.user_id = $2
                                   and m.session_id = $3
                                 order by m.id desc
                                 limit $4) r) g) l
         where $5 is null or not l.expired
         order by l.id $q$);
    return query execute pg_catalog.format('execute %s(%L, %L, %L, %L, %L)', v_name,
                                           p_tenant_id, v_user, p_session_id, p_limit,
                                           p_ttl_seconds);
end
$$;
alter function harbor.recent_turns_delegated(text, text, text, text, text, text, integer,
                                             double precision)
    owner to harbor_owner;
revoke all on function harbor.recent_turns_delegated(text, text, text, text, text, text,
                                                     integer, double precision)
    from public, harbor_admin;
grant execute on function harbor.recent_turns_delegated(text, text, text, text, text, text,
                                                        integer, double precision)
    to harbor_app;
