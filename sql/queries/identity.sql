-- name: set_identity
-- Set the caller's identity for the current transaction. The wrapper validated
-- the owner already (MemoryOwner), so it skips harbor.set_identity()'s checks;
-- a role binding still wins, because the policies read harbor.caller_*().
select pg_catalog.set_config('harbor.tenant_id', %(tenant_id)s::text, true),
       pg_catalog.set_config('harbor.project_id', coalesce(%(project_id)s::text, ''), true),
       pg_catalog.set_config('harbor.principal_id', coalesce(%(principal_id)s::text, ''), true),
       pg_catalog.set_config('harbor.user_id',
                             coalesce(%(user_id)s::text, %(principal_id)s::text, ''), true),
       pg_catalog.set_config('harbor.session_id', coalesce(%(session_id)s::text, ''), true),
       pg_catalog.set_config('harbor.run_id', coalesce(%(run_id)s::text, ''), true)

-- name: set_identity_and_plan_cache_mode
-- set_identity (the same six settings, in its order) and, in the same statement,
-- plan_cache_mode for the current transaction alone (set_plan_cache_mode): the identity of
-- a save that runs its generic plan, one statement fewer in its round trip.
select pg_catalog.set_config('harbor.tenant_id', %(tenant_id)s::text, true),
       pg_catalog.set_config('harbor.project_id', coalesce(%(project_id)s::text, ''), true),
       pg_catalog.set_config('harbor.principal_id', coalesce(%(principal_id)s::text, ''), true),
       pg_catalog.set_config('harbor.user_id',
                             coalesce(%(user_id)s::text, %(principal_id)s::text, ''), true),
       pg_catalog.set_config('harbor.session_id', coalesce(%(session_id)s::text, ''), true),
       pg_catalog.set_config('harbor.run_id', coalesce(%(run_id)s::text, ''), true),
       pg_catalog.set_config('plan_cache_mode', %(mode)s::text, true)

-- name: login_role
-- Who the pooled connection logged in as, and whether it may switch to the target role;
-- and the OID of public.vector (null before the extension exists), which the binary form
-- of a vector[] parameter names.
select current_user::text as current_user,
       r.rolsuper or r.rolbypassrls as privileged,
       pg_has_role(session_user, %(target)s::name, 'MEMBER') as is_member,
       pg_catalog.to_regtype('public.vector')::oid::bigint as vector_oid
  from pg_roles r
 where r.rolname = current_user

-- name: set_identity_checked
-- The documented harbor.set_identity() for one transaction (is_local), with its
-- checks: what harbor_pg.tables.set_identity sends on an application's own
-- SQLAlchemy connection.
select harbor.set_identity(%(tenant_id)s::text, project_id => %(project_id)s::text,
                           principal_id => %(principal_id)s::text,
                           user_id => %(user_id)s::text, session_id => %(session_id)s::text,
                           run_id => %(run_id)s::text, is_local => true)

-- name: set_identity_local
-- The caller's identity as SET LOCAL commands, for a Citus deployment (a format
-- template: each field in braces is filled with a quoted literal). Citus forwards SET LOCAL
-- to the workers of the transaction (citus.propagate_set_commands = 'local', set
-- by harbor-pg distribute), not set_config(). Same values as set_identity.
set local harbor.tenant_id = {tenant_id};
set local harbor.project_id = {project_id};
set local harbor.principal_id = {principal_id};
set local harbor.user_id = {user_id};
set local harbor.session_id = {session_id};
set local harbor.run_id = {run_id}

-- name: deployment
-- Whether this database runs Citus (harbor-pg distribute): the identity is then
-- set with SET LOCAL (set_identity_local).
select exists (select 1 from pg_catalog.pg_extension where extname = 'citus') as citus

-- name: set_plan_cache_mode
-- plan_cache_mode for the current transaction alone (Database.fetch_rows_in_one_round_trip:
-- a save runs its generic plan), sent in the same round trip as the identity.
select pg_catalog.set_config('plan_cache_mode', %(mode)s::text, true)
