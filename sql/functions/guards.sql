-- Guards that keep long-term memory add-only.

-- The trigger functions below share one shape on purpose (security invoker, a pinned
-- search_path, a refusal with its errcode and hint): each guards its own table or rule.

-- Only the validity interval and the successor link of a memory may change
-- after insert; a rolling summary (memory_type 'summary') is the one row whose
-- content is refreshed in place under its deterministic id.
create or replace function harbor._memories_add_only() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    reopened boolean := false;
begin
    if old.memory_type <> 'summary' and (
           new.content is distinct from old.content
        or new.content_hash is distinct from old.content_hash
        or new.context is distinct from old.context
        or new.source_message_ids is distinct from old.source_message_ids
        or new.metadata is distinct from old.metadata
        or new.importance is distinct from old.importance
        or new.entity_ids is distinct from old.entity_ids) then
        raise exception 'harbor.memories is add-only: only valid and superseded_by may change'
            using errcode = '42501', constraint = 'memories_add_only';
    end if;
    -- one exception: harbor.erase reopens the version before an erased current successor
    -- (the interval keeps its start and becomes open). Nothing a caller sets is trusted
    -- for it: the link to the deleted successor is cleared by the foreign key's ON DELETE
    -- SET NULL, which PostgreSQL runs as the table's owner (no caller is, and a caller's
    -- own UPDATE of superseded_by runs as the caller; on Citus, which refuses the action,
    -- by the owner's trigger of sql/citus/successor.sql), and then only a row that erase
    -- listed in harbor.erase_reopen is reopened, for an unbound administrator. Planting
    -- that setting gets an administrator no more than erase gives: the version before a
    -- current version it may delete, and has deleted, comes back.
    if old.superseded_by is not null and new.superseded_by is null
       and upper(old.valid) is not null and new.valid is not distinct from old.valid
       and coalesce(pg_catalog.current_setting('harbor.erase_reopen', true), '') <> ''
       and exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_roles r
                                on r.oid = c.relowner
                    where c.oid = tg_relid and r.rolname = current_user)
       -- and the statement that deleted the successor is an unbound administrator's
       -- (in the referential action current_user is the owner; the `role` setting and
       -- session_user still name the caller)
       and pg_catalog.pg_has_role(coalesce(nullif(pg_catalog.current_setting('role'), 'none'),
                                           session_user::text)::name, 'harbor_admin', 'MEMBER')
       and not harbor.caller_is_bound()
       and pg_catalog.current_setting('harbor.erase_reopen', true)::jsonb
           @> pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_array(old.tenant_id, old.id))
    then
        new.valid := pg_catalog.tstzrange(lower(old.valid), null, '[)');
        reopened := true;
    end if;
    if upper(old.valid) is not null and new.valid is distinct from old.valid
       and not reopened then
        raise exception 'harbor.memories: a closed validity interval cannot be reopened'
            using errcode = '42501', constraint = 'memories_add_only';
    end if;
    new.updated_at := pg_catalog.now();
    return new;
end
$$;

create or replace trigger memories_add_only
    before update on harbor.memories
    for each row execute function harbor._memories_add_only();

-- Provenance names a session and turns; whose they were is the writer's identity
-- (session ids repeat across users, and a GLOBAL row has no tenant of its own), so
-- erasure can tell two users' sessions named `s1` apart. Set by the database, not
-- the caller: a row naming no source has neither.
create or replace function harbor._memories_provenance() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    if new.source_session_id is not null or new.source_message_ids <> '{}' then
        new.source_tenant_id := harbor.caller_tenant();
        new.source_user_id := harbor.caller_user();
    else
        new.source_tenant_id := null;
        new.source_user_id := null;
    end if;
    return new;
end
$$;

-- A vector's owner fields are copies of its memory's (so that the dense leg finds
-- an owner's vectors without a join), and the write policy can only check the
-- copies; the foreign key, checked without row-level security, covers the id
-- alone. So the memory is read here, by primary key and under the writer's own
-- policies, and a vector is refused unless its memory is one the writer can see
-- and has the same owner fields: the same error whether the memory is someone
-- else's or does not exist. (A foreign key over the owner fields was tried
-- first: its check query is planned generically, and the planner took the owner
-- index for it, reading every row of the memory's owner for each vector.)
-- One function for every table whose rows copy their memory's owner fields
-- (memory_embeddings, memory_hits): tg_argv[0] names what a row is in the error
-- ('a vector'), and the constraint the error names is the trigger's, <table>_owner.
create or replace function harbor._owner_is_memorys() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    m record;
begin
    -- by primary key: the read policy already tests the tenant, and a second tenant test
    -- here made the planner count the two as independent, estimate one row for the
    -- owner index and take it, reading every row of the memory's owner for each vector
    -- (the fence keeps the tenant test out of the scan)
    select x.scope, x.project_id, x.user_id, x.session_id, x.run_id into m
      from (select y.tenant_id, y.scope, y.project_id, y.user_id, y.session_id, y.run_id
              from harbor.memories y
             where y.id = new.memory_id
            offset 0) x
     where x.tenant_id = new.tenant_id;
    if not found or (m.scope, m.project_id, m.user_id, m.session_id, m.run_id)
                    is distinct from (new.scope, new.project_id, new.user_id, new.session_id,
                                      new.run_id) then
        raise exception 'harbor.%: % needs a memory the writer can see, with the same owner '
                        'fields', tg_table_name, tg_argv[0]
            using errcode = '23503', constraint = tg_table_name || '_owner';
    end if;
    return new;
end
$$;

-- (the columns come with revision 0011; this file also runs on the revisions before it)
do $$
begin
    if exists (select 1 from pg_catalog.pg_attribute
                where attrelid = 'harbor.memories'::pg_catalog.regclass
                  and attname = 'source_tenant_id' and not attisdropped) then
        -- (the condition: rows the function would change; a row naming no source and no
        -- provenance, what most writes are, skips the call)
        create or replace trigger memories_provenance
            before insert on harbor.memories
            for each row
            when (new.source_session_id is not null or new.source_message_ids <> '{}'
                  or new.source_tenant_id is not null or new.source_user_id is not null)
            execute function harbor._memories_provenance();
    else
        drop trigger if exists memories_provenance on harbor.memories;
    end if;
end
$$;

create or replace trigger memory_embeddings_owner
    before insert or update of tenant_id, memory_id, scope, project_id, user_id, session_id,
                               run_id on harbor.memory_embeddings
    for each row execute function harbor._owner_is_memorys('a vector');

-- A recall hit's owner columns are its memory's (memory_hits; the policies test them),
-- and the memory is one the writer can see: as for a vector's (above).
-- (the table comes with revision 0025; this file also runs on the revisions before it)
do $$
begin
    if pg_catalog.to_regclass('harbor.memory_hits') is not null then
        create or replace trigger memory_hits_owner
            before insert or update of tenant_id, memory_id, scope, project_id, user_id,
                                       session_id, run_id on harbor.memory_hits
            for each row execute function harbor._owner_is_memorys('a hit');
    end if;
end
$$;
-- (the functions each table had before harbor._owner_is_memorys served both)
drop function if exists harbor._hit_owner_is_memorys();
drop function if exists harbor._embedding_owner_is_memorys();

-- Who may be bound, and by whom. This trigger holds the rules for every writer of
-- role_bindings (harbor.bind_role, harbor.unbind_role, harbor_admin writing the
-- table directly, a superuser):
-- * a role is bound in one tenant at most (harbor._binding() looks a role up by
--   name alone). role_bindings is keyed by (tenant_id, role_name) for Citus, so
--   no unique index on role_name alone can say it;
-- * harbor-pg's own roles, members of harbor_admin, superusers and BYPASSRLS
--   roles are never bound: a binding would not confine them (harbor_admin is an
--   operator's role across tenants: it writes GLOBAL memories, which every
--   tenant reads), or, for harbor_search, would change the identity that the
--   candidate functions see for every caller;
-- * a bound role manages no bindings, its own included (a role bound and then
--   granted harbor_admin could otherwise unbind itself).
-- Writers take turns on a table lock, which only roles with write rights on the
-- table can take (an advisory lock key can be taken by any login, and held).
create or replace function harbor._role_binding_one_tenant() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    lock table harbor.role_bindings in share row exclusive mode;
    if exists (select 1 from harbor._binding()) then
        raise exception 'harbor.bind_role: role % is bound to an identity, and a bound role '
                        'cannot change bindings', session_user
            using errcode = '42501';
    end if;
    if tg_op = 'DELETE' then
        return old;
    end if;
    if new.role_name in ('harbor_owner', 'harbor_app', 'harbor_admin', 'harbor_search')
       or exists (select 1 from pg_catalog.pg_roles r
                   where r.rolname = new.role_name
                     and (r.rolsuper or r.rolbypassrls
                          or pg_catalog.pg_has_role(r.oid, 'harbor_admin', 'MEMBER'))) then
        raise exception 'harbor.bind_role: role % cannot be bound', new.role_name
            using errcode = '42501',
                  hint = 'Only roles that inherit from harbor_app, and are neither members of '
                         'harbor_admin nor superusers nor BYPASSRLS, can be bound; harbor-pg''s '
                         'own roles never.';
    end if;
    if exists (select 1 from harbor.role_bindings b
                where b.role_name = new.role_name
                  and b.tenant_id is distinct from new.tenant_id) then
        raise exception 'harbor.bind_role: role % is already bound in another tenant',
                new.role_name
            using errcode = '23505',
                  hint = 'A role can be bound in one tenant only: unbind it there first '
                         '(harbor.unbind_role as that tenant''s administrator), or bind another role.';
    end if;
    return new;
end
$$;

create or replace trigger role_bindings_one_tenant
    before insert or update or delete on harbor.role_bindings
    for each row execute function harbor._role_binding_one_tenant();

-- A memory's successor (superseded_by) is a memory the writer can see. The
-- foreign key is checked without row-level security, so without this a caller
-- could link its memory to another user's memory id (ids are not secret), and
-- anything that follows the link would take the caller's word for it.
create or replace function harbor._memory_successor_visible() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    if new.superseded_by is not null
       and (tg_op = 'INSERT' or new.superseded_by is distinct from old.superseded_by)
       -- by primary key, the tenant tested outside the scan (see _owner_is_memorys)
       and not exists (select 1
                         from (select s.tenant_id from harbor.memories s
                                where s.id = new.superseded_by offset 0) s
                        where s.tenant_id = new.tenant_id) then
        raise exception 'harbor.memories: a successor must be a memory the writer can see'
            using errcode = '23503', constraint = 'memories_superseded_by_visible';
    end if;
    return new;
end
$$;

-- (the condition: the function checks nothing for a row without a successor)
create or replace trigger memories_superseded_by_visible
    before insert or update of superseded_by on harbor.memories
    for each row when (new.superseded_by is not null)
    execute function harbor._memory_successor_visible();

-- A rolling session summary's id is derived from its whole owner key: 'summary:'
-- and 32 hex digits of the sha256 of the tenant, project, user, session and run,
-- each length-prefixed (so the encoding is injective). The id names no session,
-- and no caller can hold another owner's summary id: a summary row gets the id of
-- its own owner fields whatever the writer asked for (the write policies keep a
-- caller to its own owner fields), and no other row may take an id with the
-- prefix. Python computes the same id (harbor_pg.tiers.base.summary_memory_id).
create or replace function harbor.summary_id(
    tenant_id text, project_id text, user_id text, session_id text, run_id text
) returns text
    language sql immutable security invoker parallel safe
return 'summary:' operator(pg_catalog.||) pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
    pg_catalog.convert_to(
        pg_catalog.length(tenant_id) operator(pg_catalog.||) ':' operator(pg_catalog.||) tenant_id
        operator(pg_catalog.||) ';' operator(pg_catalog.||)
        pg_catalog.length(project_id) operator(pg_catalog.||) ':' operator(pg_catalog.||) project_id
        operator(pg_catalog.||) ';' operator(pg_catalog.||)
        pg_catalog.length(user_id) operator(pg_catalog.||) ':' operator(pg_catalog.||) user_id
        operator(pg_catalog.||) ';' operator(pg_catalog.||)
        pg_catalog.length(session_id) operator(pg_catalog.||) ':' operator(pg_catalog.||) session_id
        operator(pg_catalog.||) ';' operator(pg_catalog.||)
        pg_catalog.length(run_id) operator(pg_catalog.||) ':' operator(pg_catalog.||) run_id,
        'UTF8')), 'hex'), 32);

-- (the WHEN clause keeps the call off every other insert)
create or replace function harbor._memories_summary_id() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    if new.scope = 'session' and new.memory_type = 'summary' then
        new.id := harbor.summary_id(new.tenant_id, new.project_id, new.user_id,
                                    new.session_id, new.run_id);
    elsif new.id like 'summary:%' then
        raise exception 'harbor.memories: ids starting with "summary:" belong to rolling '
                        'session summaries, whose ids the database derives from their owner'
            using errcode = '23514', constraint = 'memories_summary_id';
    end if;
    return new;
end
$$;

create or replace trigger memories_summary_id
    before insert or update of id, tenant_id, scope, project_id, user_id, session_id, run_id,
                               memory_type on harbor.memories
    for each row when (new.memory_type = 'summary' or new.id like 'summary:%')
    execute function harbor._memories_summary_id();
