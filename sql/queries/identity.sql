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

-- name: login_role
-- Who the pooled connection logged in as, and whether it may switch to the target role.
select current_user::text as current_user,
       r.rolsuper or r.rolbypassrls as privileged,
       pg_has_role(session_user, %(target)s::name, 'MEMBER') as is_member
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
