-- Bearer tokens of the MCP server (harbor.access_tokens, migration 0014).

-- name: token_insert
-- Store a new token's hash and the identity it stands for (elevated role, the tenant set).
insert into harbor.access_tokens (tenant_id, token_hash, name, project_id, principal_id,
                                  user_id, session_id, run_id, is_admin, expires_at)
values (%(tenant_id)s::text, %(token_hash)s::text, %(name)s::text, %(project_id)s::text,
        %(principal_id)s::text, %(user_id)s::text, %(session_id)s::text, %(run_id)s::text,
        %(is_admin)s::boolean, %(expires_at)s::timestamptz)
returning id, created_at

-- name: token_revoke
-- Revoke one of the tenant's tokens (elevated role); no row when none was live.
update harbor.access_tokens t set revoked_at = pg_catalog.now()
 where t.tenant_id = %(tenant_id)s::text and t.id = %(token_id)s::text
   and t.revoked_at is null
returning t.id

-- name: token_list
-- The tenant's tokens, newest first, without their hashes (elevated role).
select t.id, t.name, t.tenant_id, t.project_id, t.principal_id, t.user_id, t.session_id,
       t.run_id, t.is_admin, t.created_at, t.expires_at, t.revoked_at
  from harbor.access_tokens t
 where t.tenant_id = %(tenant_id)s::text
 order by t.created_at desc, t.id

-- name: token_holder
-- Name the presented token's hash for the transaction: the policy shows only that row.
select pg_catalog.set_config('harbor.token_hash', %(token_hash)s::text, true)

-- name: token_identity
-- The identity of a live token whose hash token_holder named (none when revoked or expired).
select t.id, t.name, t.tenant_id, t.project_id, t.principal_id, t.user_id, t.session_id,
       t.run_id, t.is_admin, t.created_at, t.expires_at, t.revoked_at
  from harbor.access_tokens t
 where t.token_hash = %(token_hash)s::text
   and t.revoked_at is null
   and (t.expires_at is null or t.expires_at > pg_catalog.now())
