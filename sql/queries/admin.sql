-- name: server_versions
-- PostgreSQL and pgvector versions of the connected database, its shared
-- buffers and its size on disk.
select current_setting('server_version') as server_version,
       (select extversion from pg_extension where extname = 'vector') as vector_version,
       current_setting('shared_buffers') as shared_buffers,
       pg_size_pretty(pg_database_size(current_database())) as database_size

-- name: tier_totals
-- Row counts per tier across every tenant (needs a login that bypasses RLS).
select (select count(*) from harbor.messages) as short_term,
       (select count(*) from harbor.working_state) as working,
       (select count(*) from harbor.memories) as long_term,
       (select count(*) from harbor.memories where upper_inf(valid)) as current_memories,
       (select count(*) from harbor.memory_embeddings) as embeddings

-- name: server_extensions
-- The login, its database, and the extensions harbor-pg needs: the version available in the cluster and the one installed in this database.
select current_user as login,
       current_database() as database,
       (select rolsuper from pg_roles where rolname = current_user) as superuser,
       (select coalesce(jsonb_object_agg(name, default_version), '{}')
          from pg_available_extensions where name in ('vector', 'btree_gist')) as available,
       (select coalesce(jsonb_object_agg(extname, extversion), '{}')
          from pg_extension where extname in ('vector', 'btree_gist')) as installed

-- name: bootstrap_state
-- Whether this database has what harbor_pg.db.server.bootstrap creates: the four roles (harbor_owner a member of harbor_search), the vector and btree_gist extensions, and the grants on the database and on schema public. One catalog read, so a start after the first writes nothing.
select case
         when (select pg_catalog.count(*) from pg_catalog.pg_roles
                where rolname in ('harbor_owner', 'harbor_app', 'harbor_admin', 'harbor_search')) = 4
         then pg_catalog.pg_has_role('harbor_owner', 'harbor_search', 'MEMBER')
              and (select pg_catalog.count(*) from pg_catalog.pg_extension
                    where extname in ('vector', 'btree_gist')) = 2
              and pg_catalog.has_database_privilege('harbor_owner', pg_catalog.current_database(), 'CREATE')
              and pg_catalog.has_database_privilege('harbor_owner', pg_catalog.current_database(), 'CONNECT')
              and pg_catalog.has_database_privilege('harbor_app', pg_catalog.current_database(), 'CONNECT')
              and pg_catalog.has_database_privilege('harbor_admin', pg_catalog.current_database(), 'CONNECT')
              and pg_catalog.has_schema_privilege('harbor_owner', 'public', 'CREATE')
         else false
       end as ready

-- name: migration_login
-- Whether the login may run migrations (is, or is a member of, harbor_owner) and read the Alembic version table.
select current_user as login,
       exists (select 1 from pg_roles where rolname = 'harbor_owner') as owner_exists,
       case when exists (select 1 from pg_roles where rolname = 'harbor_owner')
            then pg_has_role(current_user, 'harbor_owner', 'MEMBER') else false end as is_owner,
       to_regclass('public.harbor_alembic_version') is not null as has_version_table,
       coalesce(has_table_privilege(to_regclass('public.harbor_alembic_version'), 'SELECT'), false)
           as can_read_version

-- name: schema_revision
-- The Alembic revision the harbor schema is at.
select version_num from public.harbor_alembic_version

-- name: index_build_progress
-- Index builds running on harbor tables in this database (the long steps of a migration), with how far each has got.
select p.relid::regclass::text as table_name, p.command, p.phase,
       p.blocks_done, p.blocks_total, p.tuples_done, p.tuples_total,
       extract(epoch from pg_catalog.now() - a.query_start)::integer as seconds
  from pg_catalog.pg_stat_progress_create_index p
  join pg_catalog.pg_stat_activity a on a.pid = p.pid
 where p.datname = pg_catalog.current_database()
   and p.pid <> pg_catalog.pg_backend_pid()
   and p.relid in (select c.oid from pg_catalog.pg_class c
                    where c.relnamespace = pg_catalog.to_regnamespace('harbor'))
 order by p.pid

-- name: misowned_functions
-- harbor functions not owned as a migration leaves them: the SECURITY DEFINER ones (the candidate searches) by harbor_search, every other by harbor_owner. A function re-created by hand, say as a superuser, blocks the next migration ("must be owner of function"), and a definer owned by another role runs with that role's rights.
select p.oid::pg_catalog.regprocedure::text as function,
       pg_catalog.pg_get_userbyid(p.proowner)::text as owner,
       x.expected
  from pg_catalog.pg_proc p
 cross join lateral (
       select case when p.prosecdef then 'harbor_search' else 'harbor_owner' end as expected) x
 where p.pronamespace = pg_catalog.to_regnamespace('harbor')
   and pg_catalog.pg_get_userbyid(p.proowner) <> x.expected
 order by 1

-- name: purge_expired_turns
-- Delete the caller's tenant's turns that a session TTL of inactivity (seconds)
-- has hidden: in each session, every turn up to the newest one followed by a gap
-- longer than the TTL (or by nothing, when the session has been idle that long).
-- Memories and summaries derived from them stay. Runs as the elevated role.
with gaps as (
    select m.user_id, m.session_id, m.id,
           coalesce(lead(m.created_at) over (partition by m.user_id, m.session_id
                                             order by m.id), pg_catalog.now())
               - m.created_at > make_interval(secs => %(ttl_seconds)s::double precision)
               as gap_after
      from harbor.messages m
     where m.tenant_id = (select harbor.caller_tenant())
), cut as (
    select g.user_id, g.session_id, max(g.id) as last_expired
      from gaps g where g.gap_after
     group by g.user_id, g.session_id
)
delete from harbor.messages m
 using cut c
 where m.tenant_id = (select harbor.caller_tenant())
   and m.user_id = c.user_id and m.session_id = c.session_id and m.id <= c.last_expired

-- name: migration_state
-- What decides whether a start has anything to migrate: the Alembic revision and the sha256 of the re-runnable SQL last applied (one row each), for a login that may migrate (else no row). A missing table is an error, which counts as "not current" too.
select v.version_num::text, s.sha256::text
  from public.harbor_alembic_version v
 cross join public.harbor_idempotent_sql s
 where pg_catalog.pg_has_role(current_user, 'harbor_owner', 'MEMBER')

-- name: migration_lock
-- Serialise migrations and starts: an advisory lock held to the end of the migration's transaction (concurrent create() calls wait here, one at a time).
-- The one advisory lock left: a fixed key that any login can take too, so holding it delays migrations and the starts that migrate (an operator's matter, visible in pg_locks with the holder's pid), never a caller's reads or writes; the locks keyed by an owner are row locks on harbor.owner_locks (migration 0017).
select pg_catalog.pg_advisory_xact_lock(7236837574727530753)

-- name: idempotent_state_exists
-- Whether the table recording which re-runnable SQL was last applied exists (it is made by the first migration run that applies them).
select pg_catalog.to_regclass('public.harbor_idempotent_sql') is not null as present

-- name: idempotent_state_create
-- The one-row table recording the sha256 of the re-runnable SQL files last applied (Alembic bookkeeping, next to its version table; not part of the harbor schema).
create table public.harbor_idempotent_sql (
    singleton boolean primary key default true check (singleton),
    sha256 text not null,
    applied_at timestamptz not null default pg_catalog.now()
)

-- name: idempotent_state_read
-- The sha256 of the re-runnable SQL files last applied (no row: never recorded).
select sha256 from public.harbor_idempotent_sql

-- name: idempotent_state_record
-- Record the sha256 of the re-runnable SQL files just applied.
insert into public.harbor_idempotent_sql (singleton, sha256) values (true, %(sha256)s::text)
on conflict (singleton) do update set sha256 = excluded.sha256, applied_at = pg_catalog.now()

-- name: idempotent_state_drop
-- Drop the record of the re-runnable SQL files (the harbor schema is gone: downgraded to base).
drop table if exists public.harbor_idempotent_sql

-- name: tenant_users
-- The users of the caller's tenant who hold current memories of the user scope (as the
-- elevated role: its policy shows the tenant's rows), in order: whom a tenant-wide
-- consolidation visits.
select distinct m.user_id
  from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text
   and m.scope = 'user'
   and m.user_id <> ''
   and upper_inf(m.valid)
 order by m.user_id
