-- Caller identity and the one visibility predicate.
--
-- The identity comes from transaction- or session-level settings
-- (harbor.tenant_id, harbor.project_id, harbor.principal_id, harbor.user_id,
-- harbor.session_id, harbor.run_id), set through harbor.set_identity(). For a
-- role bound with harbor.bind_role() the binding wins over those settings.
-- The binding is looked up by session_user first, so SET ROLE cannot shed it.
-- The role set with SET ROLE is read from the `role` setting as well as
-- current_user: inside the SECURITY DEFINER candidate functions of recall
-- (sql/functions/recall/) current_user is their owner, while `role` still names
-- the caller's role.

-- harbor._binding() and harbor._setting() are written with SQL-standard bodies
-- (RETURN / BEGIN ATOMIC): parsed at creation, so no search_path can redirect
-- them, and inlined into the functions that read them. The caller_*() functions
-- the policies call are PL/pgSQL with a pinned search_path: the policies call
-- them once a statement (an uncorrelated sub-select), and a function that reads
-- a table is not inlined there. Called, a SQL function planned its body again in
-- every statement before PostgreSQL 18 (about 60 us a call), where PL/pgSQL keeps
-- its plan for the session; on 18 both keep it and cost the same (about 8 us a
-- call, most of it the binding lookup), so the policies look the identity up
-- twice a policy (harbor._caller_keys below), not once a field.
create or replace function harbor._binding(out tenant_id text, out project_id text, out user_id text)
    returns setof record
    language sql stable security invoker parallel safe
begin atomic
    select b.tenant_id, b.project_id, b.user_id
      from harbor.role_bindings b
     where b.role_name operator(pg_catalog.=) any (array[session_user, current_user,
               nullif(pg_catalog.current_setting('role'), 'none')::name])
     order by (b.role_name operator(pg_catalog.=) session_user) desc
     limit 1;
end;

-- Whether no binding can apply to the caller: the login, the current user and the role
-- set (SET ROLE) are each one of harbor-pg's own roles, or no role is set. No binding
-- names those roles (harbor._role_binding_one_tenant refuses them for every writer, and
-- migration 0031 refused to upgrade a database holding one), so the identity functions
-- below skip the binding lookup for such a caller and read the settings alone: the
-- library's own login, harbor_app, and the candidate functions' owner inside them. The
-- lookup is a statement of its own, about half of each call, and a save asks for the
-- identity five to seven times (each policy's check, each vector's owner check, the
-- graph decision). A RETURN body without SET: inlined, so a PL/pgSQL caller evaluates
-- it as a simple expression, with no statement.
create or replace function harbor._unbindable_caller() returns boolean
    language sql stable security invoker parallel safe
return session_user operator(pg_catalog.=) any (
           '{harbor_owner,harbor_app,harbor_admin,harbor_search}'::name[])
   and current_user operator(pg_catalog.=) any (
           '{harbor_owner,harbor_app,harbor_admin,harbor_search}'::name[])
   and pg_catalog.current_setting('role') operator(pg_catalog.=) any (
           '{none,harbor_owner,harbor_app,harbor_admin,harbor_search}'::text[]);

create or replace function harbor._setting(name text) returns text
    language sql stable security invoker parallel safe
return nullif(pg_catalog.current_setting('harbor.' operator(pg_catalog.||) name, true), '');

create or replace function harbor.caller_tenant() returns text
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    return coalesce(bt, harbor._setting('tenant_id'));
end
$$;

-- For a bound role the binding is the whole identity: a field it names is
-- forced, and a field it does not name is NULL (nothing keyed on it is
-- visible or writable), whatever the session set. Session and run are the one
-- exception: a role bound to a user picks among that user's own sessions and
-- runs (every row they key also carries the bound user); a role bound to no
-- user has none.
create or replace function harbor.caller_project() returns text
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    return case when bt is not null then bp else harbor._setting('project_id') end;
end
$$;

create or replace function harbor.caller_user() returns text
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    return case when bt is not null then bu
                else coalesce(harbor._setting('user_id'), harbor._setting('principal_id')) end;
end
$$;

create or replace function harbor.caller_principal() returns text
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    return case when bt is not null then bu else harbor._setting('principal_id') end;
end
$$;

create or replace function harbor.caller_session() returns text
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    return case when bt is not null and bu is null then null
                else harbor._setting('session_id') end;
end
$$;

create or replace function harbor.caller_run() returns text
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    return case when bt is not null and bu is null then null
                else harbor._setting('run_id') end;
end
$$;

-- Whether the caller is a bound role (the harbor_admin policies grant a bound
-- role nothing, see policies.sql).
create or replace function harbor.caller_is_bound() returns boolean
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    return bt is not null;
end
$$;

-- The visibility predicate, shared by every read policy and by the candidate
-- functions. A row is visible when its tenant is the caller's (or '' for
-- GLOBAL) and its stored owner key equals the caller's identity narrowed to the
-- row's scope. Callers pass the identity as uncorrelated sub-selects, so it is
-- computed once per query and the tenant test can drive an index scan.
-- Written as a RETURN body (parsed at creation, immune to search_path) without
-- SET so the planner can inline it; each identity argument is used exactly once
-- (an argument used twice would stop the inlining). A NULL identity field
-- makes the comparison NULL: the row is not visible.
-- harbor._writable below writes this key rule out again on purpose (see there), and
-- harbor._owner_keys tabulates it for the policies: change the three together.
create or replace function harbor._visible(
    r_scope harbor.memory_scope, r_tenant text, r_project text, r_user text,
    r_session text, r_run text,
    i_tenant text, i_project text, i_user text, i_session text, i_run text
) returns boolean
    language sql immutable security invoker parallel safe
return r_tenant operator(pg_catalog.=) any (array['', i_tenant])
   and array[r_project, r_user, r_session, r_run] operator(pg_catalog.=) array[
        case when r_scope in ('project', 'run')
             then coalesce(i_project, case when r_scope operator(pg_catalog.=) 'run' then '' end)
             else '' end,
        case when r_scope in ('user', 'session', 'run') then i_user else '' end,
        case when r_scope in ('session', 'run') then i_session else '' end,
        case when r_scope operator(pg_catalog.=) 'run' then i_run else '' end];

-- What the application role may write: its own narrow scopes, exactly keyed.
-- The key rule is written out again rather than calling harbor._visible: the tenant
-- test differs, and passing i_tenant to both tests would use it twice, which stops
-- the inlining (see above). Change the two together.
create or replace function harbor._writable(
    r_scope harbor.memory_scope, r_tenant text, r_project text, r_user text,
    r_session text, r_run text,
    i_tenant text, i_project text, i_user text, i_session text, i_run text
) returns boolean
    language sql immutable security invoker parallel safe
return r_scope in ('project', 'user', 'session', 'run')
   and r_tenant operator(pg_catalog.=) i_tenant
   and array[r_project, r_user, r_session, r_run] operator(pg_catalog.=) array[
        case when r_scope in ('project', 'run')
             then coalesce(i_project, case when r_scope operator(pg_catalog.=) 'run' then '' end)
             else '' end,
        case when r_scope in ('user', 'session', 'run') then i_user else '' end,
        case when r_scope in ('session', 'run') then i_session else '' end,
        case when r_scope operator(pg_catalog.=) 'run' then i_run else '' end];

-- The same two predicates with the identity in two values instead of five, for
-- the policies. Each identity field the policies pass is an uncorrelated
-- sub-select, one InitPlan each, and each InitPlan called a function that looked
-- the binding up again: five lookups a policy, eleven for an INSERT ... RETURNING
-- on memories. An argument used more than once stops the inlining when it is a
-- sub-select, so one composite argument cannot carry the whole identity: the
-- tenant comes alone (the tenant test drives an index scan), and the rest as
-- harbor._caller_keys(), the owner key the identity has in each scope (one
-- lookup), from which the row's scope picks its key with one subscript.
-- harbor._owner_keys() builds that table: row n (1 to 6, the order of
-- harbor.memory_scope) is the expected (project, user, session, run) of a row of
-- scope n, exactly what harbor._visible() compares (a NULL field compares unequal
-- to every stored value, so the row is not visible).
create or replace function harbor._owner_keys(
    i_project text, i_user text, i_session text, i_run text
) returns text[]
    language sql immutable security invoker parallel safe
return array[
    array['', '', '', ''],
    array['', '', '', ''],
    array[i_project, '', '', ''],
    array['', i_user, '', ''],
    array['', i_user, i_session, ''],
    array[coalesce(i_project, ''), i_user, i_session, i_run]];

-- (PL/pgSQL with a pinned search_path, as caller_tenant(): the policies call it
-- once a statement, and its plan is kept for the session)
create or replace function harbor._caller_keys() returns text[]
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
    i_project text; i_user text; i_session text; i_run text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    -- the fields of caller_project(), caller_user(), caller_session(), caller_run(),
    -- into variables first: harbor._owner_keys uses some more than once, which stops its
    -- inlining when an argument is an expression (a call then costs more than the lookup)
    i_project := case when bt is not null then bp else harbor._setting('project_id') end;
    i_user := case when bt is not null then bu
                   else coalesce(harbor._setting('user_id'), harbor._setting('principal_id')) end;
    i_session := case when bt is not null and bu is null then null
                      else harbor._setting('session_id') end;
    i_run := case when bt is not null and bu is null then null else harbor._setting('run_id') end;
    return harbor._owner_keys(i_project, i_user, i_session, i_run);
end
$$;

-- harbor._visible() with the identity as (tenant, harbor._caller_keys()): the
-- policies' read predicate. Each argument is used once (see harbor._visible),
-- so it is inlined. The slice of the row's scope is a 1x4 array, compared with
-- the row's own key as one.
create or replace function harbor._visible_keys(
    r_scope harbor.memory_scope, r_tenant text, r_project text, r_user text,
    r_session text, r_run text, i_tenant text, i_keys text[]
) returns boolean
    language sql immutable security invoker parallel safe
return r_tenant operator(pg_catalog.=) any (array['', i_tenant])
   and array[array[r_project, r_user, r_session, r_run]] operator(pg_catalog.=)
       i_keys[case r_scope when 'global' then 1 when 'tenant' then 2 when 'project' then 3
                          when 'user' then 4 when 'session' then 5 when 'run' then 6 end
              :case r_scope when 'global' then 1 when 'tenant' then 2 when 'project' then 3
                            when 'user' then 4 when 'session' then 5 when 'run' then 6 end][1:4];

-- harbor._writable() likewise: the policies' write predicate.
create or replace function harbor._writable_keys(
    r_scope harbor.memory_scope, r_tenant text, r_project text, r_user text,
    r_session text, r_run text, i_tenant text, i_keys text[]
) returns boolean
    language sql immutable security invoker parallel safe
return r_scope in ('project', 'user', 'session', 'run')
   and r_tenant operator(pg_catalog.=) i_tenant
   and array[array[r_project, r_user, r_session, r_run]] operator(pg_catalog.=)
       i_keys[case r_scope when 'global' then 1 when 'tenant' then 2 when 'project' then 3
                          when 'user' then 4 when 'session' then 5 when 'run' then 6 end
              :case r_scope when 'global' then 1 when 'tenant' then 2 when 'project' then 3
                            when 'user' then 4 when 'session' then 5 when 'run' then 6 end][1:4];

-- The check of a row an INSERT writes drives no index, so the tenant need not
-- come alone there: harbor._caller_write_keys() is the whole identity in one
-- lookup, row n (scope n) the (tenant, project, user, session, run, principal) a
-- row of scope n must carry (the principal as coalesce(caller_principal(), ''),
-- what the insert policies required of it), and harbor._writable_check() is
-- harbor._writable() and, with r_principal, the principal test, as one
-- comparison. A NULL tenant or principal in the row is refused, as the two
-- equality tests refused it (the array comparison would take two NULLs as equal).
create or replace function harbor._owner_write_keys(
    i_tenant text, i_project text, i_user text, i_session text, i_run text, i_principal text
) returns text[]
    language sql immutable security invoker parallel safe
return array[
    array[i_tenant, '', '', '', '', coalesce(i_principal, '')],
    array[i_tenant, '', '', '', '', coalesce(i_principal, '')],
    array[i_tenant, i_project, '', '', '', coalesce(i_principal, '')],
    array[i_tenant, '', i_user, '', '', coalesce(i_principal, '')],
    array[i_tenant, '', i_user, i_session, '', coalesce(i_principal, '')],
    array[i_tenant, coalesce(i_project, ''), i_user, i_session, i_run,
          coalesce(i_principal, '')]];

create or replace function harbor._caller_write_keys() returns text[]
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
declare
    bt text; bp text; bu text;
    i_tenant text; i_project text; i_user text; i_session text; i_run text; i_principal text;
begin
    if not harbor._unbindable_caller() then
        select b.tenant_id, b.project_id, b.user_id into bt, bp, bu from harbor._binding() b;
    end if;
    -- the fields of caller_tenant(), caller_project(), caller_user(), caller_session(),
    -- caller_run(), caller_principal() (into variables first, as in _caller_keys)
    i_tenant := coalesce(bt, harbor._setting('tenant_id'));
    i_project := case when bt is not null then bp else harbor._setting('project_id') end;
    i_user := case when bt is not null then bu
                   else coalesce(harbor._setting('user_id'), harbor._setting('principal_id')) end;
    i_session := case when bt is not null and bu is null then null
                      else harbor._setting('session_id') end;
    i_run := case when bt is not null and bu is null then null else harbor._setting('run_id') end;
    i_principal := case when bt is not null then bu else harbor._setting('principal_id') end;
    return harbor._owner_write_keys(i_tenant, i_project, i_user, i_session, i_run, i_principal);
end
$$;

create or replace function harbor._writable_check(
    r_scope harbor.memory_scope, r_tenant text, r_project text, r_user text,
    r_session text, r_run text, i_keys text[]
) returns boolean
    language sql immutable security invoker parallel safe
return r_scope in ('project', 'user', 'session', 'run')
   and pg_catalog.num_nulls(r_tenant) operator(pg_catalog.=) 0
   and array[array[r_tenant, r_project, r_user, r_session, r_run]] operator(pg_catalog.=)
       i_keys[case r_scope when 'project' then 3 when 'user' then 4 when 'session' then 5
                           when 'run' then 6 end
              :case r_scope when 'project' then 3 when 'user' then 4 when 'session' then 5
                            when 'run' then 6 end][1:5];

create or replace function harbor._writable_check(
    r_scope harbor.memory_scope, r_tenant text, r_project text, r_user text,
    r_session text, r_run text, r_principal text, i_keys text[]
) returns boolean
    language sql immutable security invoker parallel safe
return r_scope in ('project', 'user', 'session', 'run')
   and pg_catalog.num_nulls(r_tenant, r_principal) operator(pg_catalog.=) 0
   and array[array[r_tenant, r_project, r_user, r_session, r_run, r_principal]]
       operator(pg_catalog.=)
       i_keys[case r_scope when 'project' then 3 when 'user' then 4 when 'session' then 5
                           when 'run' then 6 end
              :case r_scope when 'project' then 3 when 'user' then 4 when 'session' then 5
                            when 'run' then 6 end][1:6];

-- The documented SQL entry point: set who you are, for the transaction
-- (is_local => true, what the Python wrapper does) or for the session.
-- user_id defaults to principal_id. For a bound role, a field that contradicts
-- the binding, or that the binding leaves unset (see harbor.caller_project),
-- is refused: it would be ignored anyway, and silently ignoring it would hide
-- the caller's mistake.
create or replace function harbor.set_identity(
    tenant_id text,
    project_id text default null,
    principal_id text default null,
    user_id text default null,
    session_id text default null,
    run_id text default null,
    is_local boolean default false
) returns void
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    b record;
    v text;
begin
    foreach v in array array[tenant_id, project_id, principal_id, user_id, session_id, run_id] loop
        if v is not null and (v = '' or length(v) > 200 or v ~ '[\x01-\x1f\x7f]') then
            raise exception 'harbor.set_identity: ids must be 1-200 characters without control characters'
                using errcode = '22023';
        end if;
    end loop;
    if tenant_id is null then
        raise exception 'harbor.set_identity: tenant_id is required' using errcode = '22023';
    end if;
    select * into b from harbor._binding();
    if b.tenant_id is not null then
        if tenant_id is distinct from b.tenant_id
           or (project_id is not null and project_id is distinct from b.project_id)
           or (user_id is not null and user_id is distinct from b.user_id)
           or (principal_id is not null and principal_id is distinct from b.user_id) then
            raise exception 'harbor.set_identity: role % is bound to another identity', session_user
                using errcode = '42501',
                      detail = pg_catalog.format('The binding is tenant %s, project %s, user %s; '
                                                 'a field it does not name cannot be set.',
                                                 b.tenant_id, coalesce(b.project_id, '(none)'),
                                                 coalesce(b.user_id, '(none)'));
        end if;
        if b.user_id is null and (session_id is not null or run_id is not null) then
            raise exception 'harbor.set_identity: role % is bound to no user, so it has no '
                            'session or run', session_user
                using errcode = '42501';
        end if;
    end if;
    perform set_config('harbor.tenant_id', tenant_id, is_local);
    perform set_config('harbor.project_id', coalesce(project_id, ''), is_local);
    perform set_config('harbor.principal_id', coalesce(principal_id, ''), is_local);
    perform set_config('harbor.user_id', coalesce(user_id, principal_id, ''), is_local);
    perform set_config('harbor.session_id', coalesce(session_id, ''), is_local);
    perform set_config('harbor.run_id', coalesce(run_id, ''), is_local);
end
$$;

-- Administrators bind a database role to an identity (tenant, optionally a
-- project and/or a user). Requires harbor_admin (the policy checks the tenant).
-- A role is bound in one tenant at most: harbor._binding() looks a role up by
-- name alone, so a second binding elsewhere would leave its identity to
-- whichever row came first. Every key must include tenant_id compared with =
-- (Citus), so no constraint can say "one tenant per role"; the check is in the
-- role_bindings_one_tenant trigger (guards.sql), with the rules on which roles
-- may be bound, and a table lock makes concurrent binds take turns (a lock
-- only writers of role_bindings can take: an advisory lock key can be taken,
-- and held, by any login).
-- harbor_admin may read every tenant's bindings for this (policies.sql).
create or replace function harbor.bind_role(
    role_name name, tenant_id text, project_id text default null, user_id text default null
) returns void
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- a role bound in another tenant is refused by the role_bindings_one_tenant
    -- trigger (guards.sql) when the row is inserted, under this same lock
    lock table harbor.role_bindings in share row exclusive mode;
    if exists (select 1 from harbor.role_bindings b
                where b.role_name = bind_role.role_name
                  and b.tenant_id = bind_role.tenant_id) then
        -- the same binding again is a no-op; a different one in the same tenant
        -- would change what the role sees, so it must be unbound first
        if exists (select 1 from harbor.role_bindings b
                    where b.role_name = bind_role.role_name
                      and b.tenant_id = bind_role.tenant_id
                      and b.project_id is not distinct from bind_role.project_id
                      and b.user_id is not distinct from bind_role.user_id) then
            return;
        end if;
        raise exception 'harbor.bind_role: role % is already bound in tenant % with another identity',
                bind_role.role_name, bind_role.tenant_id
            using errcode = '23505',
                  hint = 'Unbind it first (harbor.unbind_role), then bind it again.';
    end if;
    insert into harbor.role_bindings (tenant_id, role_name, project_id, user_id)
    values (bind_role.tenant_id, bind_role.role_name, bind_role.project_id, bind_role.user_id);
end
$$;

create or replace function harbor.unbind_role(role_name name) returns bigint
    language sql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
    with d as (delete from harbor.role_bindings b where b.role_name = unbind_role.role_name returning 1)
    select count(*) from d
$$;

-- Full-text query with OR semantics: a question rarely has every term in one
-- memory. The query is parsed with the same configuration as the stored
-- tsvector, and its lexemes are OR-ed (quoted, so no operator is injected).
create or replace function harbor.or_tsquery(query text) returns tsquery
    language sql immutable security invoker parallel safe strict
return (
    select pg_catalog.to_tsquery('simple'::regconfig, coalesce(pg_catalog.string_agg(
               pg_catalog.quote_literal(pg_catalog.replace(lex, '\', '')), ' | '), ''))
      from pg_catalog.unnest(pg_catalog.tsvector_to_array(
               pg_catalog.to_tsvector('english'::regconfig, pg_catalog.left(query, 20000)))) lex);
