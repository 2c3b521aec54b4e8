-- Recall's view of the caller: the identity in one lookup, and the owner keys it
-- can address, shared by both candidate legs (dense.sql, lexical.sql).

-- The caller's identity in one lookup (one role-binding query instead of one
-- per field): the same values harbor.caller_tenant() ... caller_run() return.
create or replace function harbor._caller_identity(
    out tenant_id text, out project_id text, out user_id text, out session_id text,
    out run_id text)
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
begin
    -- (PL/pgSQL, as caller_tenant(): its statement's plan is kept for the session)
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    tenant_id := coalesce(bt, harbor._setting('tenant_id'));
    project_id := case when bt is not null then bp else harbor._setting('project_id') end;
    user_id := case when bt is not null then bu
                    else coalesce(harbor._setting('user_id'), harbor._setting('principal_id')) end;
    session_id := case when bt is not null and bu is null then null
                       else harbor._setting('session_id') end;
    run_id := case when bt is not null and bu is null then null
                   else harbor._setting('run_id') end;
end
$$;

-- An identity narrowed to each requested scope it can address: one owner key
-- per scope, exactly the key harbor._visible() accepts for rows of that scope.
drop function if exists harbor.recall_keys(harbor.memory_scope[]);
create or replace function harbor._recall_keys(
    scopes harbor.memory_scope[], i_tenant text, i_project text, i_user text, i_session text,
    i_run text
) returns table (scope harbor.memory_scope, tenant_id text, project_id text, user_id text,
                 session_id text, run_id text)
    language sql immutable security invoker parallel safe
begin atomic
    select k.scope, k.tenant_id, k.project_id, k.user_id, k.session_id, k.run_id
      from (values
               ('global'::harbor.memory_scope, ''::text, ''::text, ''::text, ''::text, ''::text),
               ('tenant', i_tenant, '', '', '', ''),
               ('project', i_tenant, i_project, '', '', ''),
               ('user', i_tenant, '', i_user, '', ''),
               ('session', i_tenant, '', i_user, i_session, ''),
               ('run', i_tenant, coalesce(i_project, ''), i_user, i_session, i_run)
           ) k(scope, tenant_id, project_id, user_id, session_id, run_id)
     where k.scope operator(pg_catalog.=) any (scopes)
       and k.tenant_id is not null and k.project_id is not null and k.user_id is not null
       and k.session_id is not null and k.run_id is not null;
end;
