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

-- Retention for the caller's tenant, one entry point: always reclaims the
-- tenant's expired working state (already invisible to readers) and, when
-- max_age is given, removes long-term memories older than it, for one scope
-- and/or at or above one sensitivity (both optional). Rolling summaries are
-- kept unless include_summaries. Embeddings go with their memories (ON DELETE
-- CASCADE). Returns both counts.
do $$
begin
    -- an earlier version returned only the memory count: a new result type
    -- needs DROP (CREATE OR REPLACE cannot change it)
    if exists (select 1 from pg_catalog.pg_proc p
                where p.oid = pg_catalog.to_regprocedure('harbor.apply_retention(interval, '
                          'harbor.memory_scope, harbor.sensitivity, boolean)')
                  and p.prorettype = 'pg_catalog.int8'::pg_catalog.regtype) then
        drop function harbor.apply_retention(interval, harbor.memory_scope, harbor.sensitivity,
                                             boolean);
    end if;
end
$$;

create or replace function harbor.apply_retention(
    max_age interval default null,
    only_scope harbor.memory_scope default null,
    min_sensitivity harbor.sensitivity default null,
    include_summaries boolean default false,
    out working_state bigint,
    out memories bigint
) returns record
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    t text := harbor.caller_tenant();
begin
    if t is null then
        raise exception 'harbor.apply_retention: no identity set (harbor.set_identity)'
            using errcode = '42501';
    end if;
    if max_age is null and (only_scope is not null or min_sensitivity is not null) then
        raise exception 'harbor.apply_retention: a scope or sensitivity needs max_age'
            using errcode = '22023';
    end if;
    if max_age < interval '0' then
        raise exception 'harbor.apply_retention: max_age must not be negative'
            using errcode = '22023';
    end if;

    delete from harbor.working_state w
     where w.tenant_id = t
       and w.expires_at is not null and w.expires_at <= pg_catalog.now();
    get diagnostics working_state = row_count;

    memories := 0;
    if max_age is not null then
        delete from harbor.memories m
         where m.tenant_id = t
           and m.created_at < pg_catalog.now() - max_age
           and (only_scope is null or m.scope = only_scope)
           and (min_sensitivity is null or m.sensitivity >= min_sensitivity)
           and (include_summaries or m.memory_type <> 'summary');
        get diagnostics memories = row_count;
    end if;
end
$$;

-- Right to erasure: delete, in the caller's transaction, every row of the
-- caller's tenant that belongs to a user (all their sessions), to one session
-- of a user, or to an agent (the principal that wrote it). Returns one row per
-- tier with counts; no copy of the erased text is written anywhere.
--
-- A user's rows are those keyed to them (user_id) and those they wrote as the
-- principal in any scope: a PROJECT memory stores user_id = '' and the author
-- in principal_id. A session's memories are those of the session and those
-- derived from it (source_session_id). Any memory derived from a turn being
-- erased (source_message_ids) goes too, whoever wrote it, so a fact an agent
-- extracted from the conversation does not outlive it. Embeddings are deleted
-- with their memories and counted.
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
    u text := erase.user_id;
    s text := erase.session_id;
    p text := erase.principal_id;
    turn_ids text[];
    memory_ids text[];
    n bigint;
begin
    if t is null then
        raise exception 'harbor.erase: no identity set (harbor.set_identity)' using errcode = '42501';
    end if;
    if u is null and p is null then
        raise exception 'harbor.erase: name a user_id or a principal_id' using errcode = '22023';
    end if;

    -- the turns first: their ids find the memories derived from them
    with gone as (
        delete from harbor.messages x
         where x.tenant_id = t
           and (u is null or x.user_id = u or x.principal_id = u)
           and (s is null or x.session_id = s)
           and (p is null or x.principal_id = p)
        returning x.id)
    select coalesce(array_agg(gone.id::text), '{}'), count(*) into turn_ids, n from gone;
    tier := 'short_term'; deleted := n; return next;

    select coalesce(array_agg(distinct d.id), '{}') into memory_ids
      from (select m.id from harbor.memories m
             where m.tenant_id = t
               and (u is null or m.user_id = u or m.principal_id = u)
               and (s is null or m.session_id = s or m.source_session_id = s)
               and (p is null or m.principal_id = p)
            union all
            select m.id from harbor.memories m
             cross join lateral unnest(m.source_message_ids) as src(message_id)
              join unnest(turn_ids) as gone(message_id) on gone.message_id = src.message_id
             where m.tenant_id = t and m.source_message_ids <> '{}') d;

    delete from harbor.memory_embeddings x
     using unnest(memory_ids) as gone(id)
     where x.tenant_id = t and x.memory_id = gone.id;
    get diagnostics n = row_count;
    tier := 'embeddings'; deleted := n; return next;

    -- successors of an erased memory lose their link (ON DELETE SET NULL)
    delete from harbor.memories m
     using unnest(memory_ids) as gone(id)
     where m.tenant_id = t and m.id = gone.id;
    get diagnostics n = row_count;
    tier := 'long_term'; deleted := n; return next;

    delete from harbor.working_state w
     where w.tenant_id = t
       and (u is null or w.user_id = u or w.principal_id = u)
       and (s is null or w.session_id = s)
       and (p is null or w.principal_id = p);
    get diagnostics n = row_count;
    tier := 'working'; deleted := n; return next;

    -- summary bookkeeping of the erased sessions (no text, but it names them)
    delete from harbor.session_state x
     where x.tenant_id = t
       and u is not null and p is null
       and x.user_id = u
       and (s is null or x.session_id = s);
    return;
end
$$;
