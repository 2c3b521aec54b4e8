-- A user's profile: their current durable memories in one call, grouped into what
-- has held for a long time (stable) and what is new (recent), within a token budget.

-- The memories stored under the caller's owner keys narrowed to each of scopes
-- (harbor._recall_keys(), as recall's legs): one owner-index range scan a key, the
-- tenant named once more (on Citus, one shard group). Read as the invoker, under the
-- row-level security policies; GLOBAL rows (no tenant's) are not among them. Every
-- validity and type: the caller filters. (Its body is parsed at each call, not at
-- creation: a body parsed at creation would hold every column of memories, and a
-- downgrade that drops one would have to drop it first; so its search_path is pinned.)
create or replace function harbor._owner_memories(
    scopes harbor.memory_scope[], i_tenant text, i_project text, i_user text,
    i_session text, i_run text
) returns setof harbor.memories
    language sql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
    select m.*
      from harbor._recall_keys(scopes, i_tenant, i_project, i_user, i_session, i_run) k
      cross join lateral (
          select m.*
            from harbor.memories m
           where m.tenant_id = i_tenant
             and m.tenant_id = k.tenant_id and m.scope = k.scope
             and m.user_id = k.user_id and m.project_id = k.project_id
             and m.session_id = k.session_id and m.run_id = k.run_id
          offset 0) m
$$;

-- How often recall returned each of ids (harbor.memory_hits: counted only with
-- importance decay on), of the tenant's rows the caller may see; ids with no hits are
-- absent. A function of its own, and PL/pgSQL (not inlined; its body is parsed at
-- its first call, so this file also runs on the revisions before the hits table's,
-- 0025): on Citus a statement that read memory_hits under its tenant predicate
-- beside harbor._owner_memories() would be routed whole to the tenant's worker, and
-- the function's own query refused there as a nested distributed query; as a
-- function scan, each is a query of its own on the coordinator, routed to the shard.
create or replace function harbor._memory_hits_of(p_tenant text, p_ids text[])
returns table (memory_id text, hits bigint)
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    return query
    select h.memory_id, h.hits
      from harbor.memory_hits h
     where h.tenant_id = p_tenant and h.memory_id = any (p_ids);
end
$$;

-- harbor.profile() is SECURITY INVOKER: it reads under the row-level security
-- policies like any SELECT, and only the caller's own owner keys narrowed to each
-- requested scope (harbor._owner_memories()); GLOBAL memories (no tenant's) are not a
-- user's profile. Rows: the
-- memories valid at as_of (default now), of the given scopes,
-- never rolling summaries, at most max_sensitivity, one per content_hash (the more
-- important copy, then the older, then the narrower scope). A memory is 'stable' when
-- it has been valid for at least stable_after at as_of, else 'recent'.
--   stable   most important first, then the most often recalled
--            (harbor._memory_hits_of()), then the longest held
--   recent   newest first, then the most important
-- Each row carries the tokens of its rendered line ('[<hash12>] <content>', as
-- recall's lines, harbor.recall_line_tokens()). token_budget (null: no budget) is
-- split in two halves, the stable section taking the odd token; a section that
-- needs less than its half leaves the rest to the other. Each section is then cut
-- at the first memory that would pass its share, so it is always a prefix of its
-- order. rank counts within the section from 1.
create or replace function harbor.profile(
    scopes harbor.memory_scope[] default '{user}',
    token_budget integer default 400,
    stable_after interval default '30 days',
    as_of timestamptz default null,
    max_sensitivity harbor.sensitivity default 'pii'
) returns table (
    section text, rank integer, id text, tenant_id text, scope text, project_id text,
    principal_id text, user_id text, session_id text, run_id text, memory_type text,
    content text, content_hash text, importance real, entity_ids text[], source text,
    sensitivity text, valid_from timestamptz, tokens integer
)
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_as_of timestamptz := coalesce(profile.as_of, pg_catalog.now());
    v_id    record := harbor._caller_identity();
begin
    if profile.token_budget is not null and profile.token_budget < 0 then
        raise exception 'harbor.profile: token_budget must be >= 0 (or null for no budget)'
            using errcode = '22023';
    end if;
    if profile.stable_after is null or profile.stable_after < interval '0' then
        raise exception 'harbor.profile: stable_after must be an interval >= 0'
            using errcode = '22023';
    end if;
    if profile.max_sensitivity is null then
        raise exception 'harbor.profile: max_sensitivity must not be null' using errcode = '22023';
    end if;
    if profile.scopes is null or cardinality(profile.scopes) = 0 then
        return;
    end if;
    return query
    with current_rows as (
        select m.id, m.tenant_id, m.scope, m.project_id, m.principal_id, m.user_id,
               m.session_id, m.run_id, m.memory_type, m.content, m.content_hash,
               m.importance, m.entity_ids, m.source, m.sensitivity, lower(m.valid) as valid_from,
               lower(m.valid) <= v_as_of - profile.stable_after as stable,
               harbor.recall_line_tokens(m.content_hash, m.content) as tok,
               case m.scope when 'run' then 0 when 'session' then 1 when 'user' then 2
                            when 'project' then 3 when 'tenant' then 4 else 5 end as breadth
          from harbor._owner_memories(profile.scopes, v_id.tenant_id, v_id.project_id,
                                      v_id.user_id, v_id.session_id, v_id.run_id) m
         where coalesce(m.valid operator(pg_catalog.@>) v_as_of, false)
           and not coalesce(m.expires_at operator(pg_catalog.<=) v_as_of, false)
           and m.memory_type <> 'summary'
           and m.sensitivity <= profile.max_sensitivity
    ), distinct_rows as (
        select c.*, row_number() over (partition by c.content_hash collate "C"
                                       order by c.importance desc, c.valid_from, c.breadth,
                                                c.id) as copy
          from current_rows c
    ), hits as (
        select h.memory_id, h.hits
          from harbor._memory_hits_of(
                   v_id.tenant_id,
                   (select pg_catalog.array_agg(d.id) from distinct_rows d
                     where d.copy = 1 and d.stable)) h
    ), ordered as (
        select d.*,
               row_number() over w as pos,
               sum(d.tok) over w as cumulative,
               sum(d.tok) over (partition by d.stable) as section_tokens
          from distinct_rows d
          left join hits h on h.memory_id = d.id
         where d.copy = 1
        window w as (partition by d.stable
                     order by case when d.stable then d.importance end desc nulls last,
                              case when d.stable then coalesce(h.hits, 0) end desc nulls last,
                              case when d.stable then d.valid_from end,
                              case when not d.stable then d.valid_from end desc nulls last,
                              d.importance desc, d.id
                     rows between unbounded preceding and current row)
    ), shares as (
        -- each section's half of the budget, plus what the other leaves of its half
        select coalesce(max(o.section_tokens) filter (where o.stable), 0) as stable_tokens,
               coalesce(max(o.section_tokens) filter (where not o.stable), 0) as recent_tokens,
               profile.token_budget - profile.token_budget / 2 as stable_half,
               profile.token_budget / 2 as recent_half
          from ordered o
    )
    select case when o.stable then 'stable' else 'recent' end, o.pos::integer, o.id,
           o.tenant_id, o.scope::text, o.project_id, o.principal_id, o.user_id, o.session_id,
           o.run_id, o.memory_type::text, o.content, o.content_hash, o.importance,
           o.entity_ids, o.source, o.sensitivity::text, o.valid_from, o.tok
      from ordered o cross join shares s
     where profile.token_budget is null
        or o.cumulative <= case when o.stable
                                then s.stable_half + greatest(s.recent_half - s.recent_tokens, 0)
                                else s.recent_half + greatest(s.stable_half - s.stable_tokens, 0)
                           end
     order by o.stable desc, o.pos;
end
$$;
