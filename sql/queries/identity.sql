-- name: set_identity
-- Set the caller's identity for the current transaction.
select harbor.set_identity(
    %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text,
    %(user_id)s::text, %(session_id)s::text, %(run_id)s::text, true)

-- name: login_role
-- Who the pooled connection logged in as, and whether it may switch to the target role.
select current_user::text as current_user,
       r.rolsuper or r.rolbypassrls as privileged,
       pg_has_role(session_user, %(target)s::name, 'MEMBER') as is_member
  from pg_roles r
 where r.rolname = current_user
