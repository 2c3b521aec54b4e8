-- Hot-path reads as single statements: the identity is set for the statement's
-- own (implicit) transaction and the read runs under the policies, so an
-- autocommit client needs one round trip. SECURITY INVOKER: row-level
-- security applies exactly as for a plain SELECT, and a role binding still
-- wins over the identity passed here.
create or replace function harbor.recent_turns(
    p_tenant text, p_project text, p_principal text, p_user text, p_session text,
    p_run text, p_limit integer
) returns table (id bigint, role text, content text, name text, tool_calls jsonb,
                 tool_call_id text, metadata jsonb, created_at timestamptz)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    -- a plain variable, not coalesce() in the query: the cached generic plan
    -- then uses it as an index condition instead of filtering the session's rows
    v_user text := coalesce(p_user, p_principal, '');
begin
    perform set_config('harbor.tenant_id', p_tenant, true),
            set_config('harbor.project_id', coalesce(p_project, ''), true),
            set_config('harbor.principal_id', coalesce(p_principal, ''), true),
            set_config('harbor.user_id', v_user, true),
            set_config('harbor.session_id', coalesce(p_session, ''), true),
            set_config('harbor.run_id', coalesce(p_run, ''), true);
    return query
        select n.id, n.role::text, n.content, n.name, n.tool_calls, n.tool_call_id, n.metadata,
               n.created_at
          from (select m.* from harbor.messages m
                 where m.tenant_id = p_tenant and m.user_id = v_user
                   and m.session_id = p_session
                 order by m.id desc
                 limit p_limit) n
         order by n.id;
end
$$;
