-- harbor-pg roles. Run once per cluster by a superuser (or a role with
-- CREATEROLE): `harbor-pg up` does it for the embedded server. Idempotent.
--
--   harbor_owner   owns the harbor schema and runs migrations
--   harbor_app     the role applications connect as (RLS applies, no BYPASSRLS)
--   harbor_admin   elevated: TENANT and GLOBAL writes, erasure, retention
--   harbor_search  NOLOGIN, BYPASSRLS: owns the two SECURITY DEFINER candidate
--                  functions (harbor._dense_candidates and harbor._lexical_candidates,
--                  in sql/functions/recall/dense.sql and lexical.sql) and nothing else
do $roles$
begin
    -- One block per role, alike on purpose: each role is created only where it is missing.
    if not exists (select 1 from pg_catalog.pg_roles where rolname = 'harbor_owner') then
        create role harbor_owner login nosuperuser nocreaterole nocreatedb nobypassrls;
    end if;
    if not exists (select 1 from pg_catalog.pg_roles where rolname = 'harbor_app') then
        create role harbor_app login nosuperuser nocreaterole nocreatedb nobypassrls;
    end if;
    if not exists (select 1 from pg_catalog.pg_roles where rolname = 'harbor_admin') then
        create role harbor_admin login nosuperuser nocreaterole nocreatedb nobypassrls;
    end if;
    if not exists (select 1 from pg_catalog.pg_roles where rolname = 'harbor_search') then
        create role harbor_search nologin nosuperuser nocreaterole nocreatedb bypassrls;
    end if;
    -- the owner hands function ownership to harbor_search during migrations
    if not pg_catalog.pg_has_role('harbor_owner', 'harbor_search', 'MEMBER') then
        grant harbor_search to harbor_owner;
    end if;
end
$roles$;
