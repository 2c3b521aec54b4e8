-- Guards that keep long-term memory add-only.

-- Only the validity interval and the successor link of a memory may change
-- after insert; a rolling summary (memory_type 'summary') is the one row whose
-- content is refreshed in place under its deterministic id.
create or replace function harbor._memories_add_only() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
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
    -- one exception: harbor.erase reopens the version before an erased successor
    -- (the interval keeps its start and becomes open), as the elevated role
    if upper(old.valid) is not null and new.valid is distinct from old.valid
       and not (pg_catalog.current_setting('harbor.erasing', true) = 'on'
                and pg_catalog.pg_has_role(current_user, 'harbor_admin', 'MEMBER')
                and lower(new.valid) = lower(old.valid) and upper_inf(new.valid)
                and new.superseded_by is null) then
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

-- (the columns come with revision 0011; this file also runs on the revisions before it)
do $$
begin
    if exists (select 1 from pg_catalog.pg_attribute
                where attrelid = 'harbor.memories'::pg_catalog.regclass
                  and attname = 'source_tenant_id' and not attisdropped) then
        create or replace trigger memories_provenance
            before insert on harbor.memories
            for each row execute function harbor._memories_provenance();
    else
        drop trigger if exists memories_provenance on harbor.memories;
    end if;
end
$$;

-- A database role is bound in one tenant at most (harbor._binding() looks a role
-- up by name alone). harbor.bind_role() checks this with a clear message; this
-- trigger holds the rule for every other writer too (harbor_admin inserting into
-- role_bindings directly, a superuser), under the same per-role advisory lock.
-- role_bindings is keyed by (tenant_id, role_name) for Citus, so no unique index
-- on role_name alone can say it.
create or replace function harbor._role_binding_one_tenant() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    perform pg_advisory_xact_lock(
        hashtextextended('harbor.bind_role:' || new.role_name::text, 0));
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
    before insert or update of tenant_id, role_name on harbor.role_bindings
    for each row execute function harbor._role_binding_one_tenant();
