-- Maintenance and governance: purge, retention, erasure. Run as harbor_admin
-- (the elevated role); the policies confine them to the caller's tenant.

-- Reclaim the space of expired working state (already invisible to readers).
create or replace function harbor.purge_working_state() returns bigint
    language sql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
    with d as (
        delete from harbor.working_state w
         where w.expires_at is not null and w.expires_at <= pg_catalog.now()
        returning 1)
    select count(*) from d
$$;

-- Remove long-term memories of the caller's tenant older than max_age, for one
-- scope and/or at or above one sensitivity (both optional). Rolling summaries
-- are kept unless include_summaries. Returns the number of memories deleted.
create or replace function harbor.apply_retention(
    max_age interval,
    only_scope harbor.memory_scope default null,
    min_sensitivity harbor.sensitivity default null,
    include_summaries boolean default false
) returns bigint
    language sql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
    with d as (
        delete from harbor.memories m
         where m.created_at < pg_catalog.now() - max_age
           and (only_scope is null or m.scope = only_scope)
           and (min_sensitivity is null or m.sensitivity >= min_sensitivity)
           and (include_summaries or m.memory_type <> 'summary')
        returning 1)
    select count(*) from d
$$;

-- Right to erasure: delete, in the caller's transaction, every row of the
-- caller's tenant that belongs to a user (all their sessions), to one session
-- of a user, or to an agent (the principal that wrote it). Embeddings go with
-- their memories (ON DELETE CASCADE). Returns one row per tier with counts;
-- no copy of the erased text is written anywhere.
create or replace function harbor.erase(
    user_id text default null,
    session_id text default null,
    principal_id text default null,
    out tier text, out deleted bigint
) returns setof record
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    t text := harbor.caller_tenant();
    n bigint;
    e bigint;
begin
    if t is null then
        raise exception 'harbor.erase: no identity set (harbor.set_identity)' using errcode = '42501';
    end if;
    if user_id is null and principal_id is null then
        raise exception 'harbor.erase: name a user_id or a principal_id' using errcode = '22023';
    end if;

    select count(*) into e from harbor.memory_embeddings x
      join harbor.memories m on m.tenant_id = x.tenant_id and m.id = x.memory_id
     where m.tenant_id = t
       and (erase.user_id is null or m.user_id = erase.user_id)
       and (erase.session_id is null or m.session_id = erase.session_id
            or m.source_session_id = erase.session_id)
       and (erase.principal_id is null or m.principal_id = erase.principal_id);

    -- successors first lose their link, then the rows go
    delete from harbor.memories m
     where m.tenant_id = t
       and (erase.user_id is null or m.user_id = erase.user_id)
       and (erase.session_id is null or m.session_id = erase.session_id
            or m.source_session_id = erase.session_id)
       and (erase.principal_id is null or m.principal_id = erase.principal_id);
    get diagnostics n = row_count;
    tier := 'long_term'; deleted := n; return next;
    tier := 'embeddings'; deleted := e; return next;

    delete from harbor.messages m
     where m.tenant_id = t
       and (erase.user_id is null or m.user_id = erase.user_id)
       and (erase.session_id is null or m.session_id = erase.session_id)
       and (erase.principal_id is null or m.principal_id = erase.principal_id);
    get diagnostics n = row_count;
    tier := 'short_term'; deleted := n; return next;

    delete from harbor.working_state w
     where w.tenant_id = t
       and (erase.user_id is null or w.user_id = erase.user_id)
       and (erase.session_id is null or w.session_id = erase.session_id)
       and (erase.principal_id is null or w.principal_id = erase.principal_id);
    get diagnostics n = row_count;
    tier := 'working'; deleted := n; return next;

    delete from harbor.session_state s
     where s.tenant_id = t
       and (erase.user_id is null or s.user_id = erase.user_id)
       and (erase.session_id is null or s.session_id = erase.session_id)
       and erase.principal_id is null;
    return;
end
$$;
