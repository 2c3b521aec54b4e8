-- Hybrid recall: candidate generation and ranking, in SQL. This folder holds the
-- caller's owner keys (owner_keys.sql), token estimates (tokens.sql), the context
-- key (context_hash.sql), the dense and the lexical candidate legs (dense.sql,
-- lexical.sql), and here harbor.recall() with its substring fallback.
--
-- harbor.recall() is SECURITY INVOKER: it hydrates and ranks under the
-- row-level security policies like any SELECT. Candidate generation needs the
-- vector and text indexes, which row-level security keeps from the planner: `@@`
-- and `<=>` are not leakproof, so the planner may not evaluate them (as index
-- conditions) ahead of the policies' predicate, and would scan every visible row.
-- So the two candidate functions (dense.sql, lexical.sql) run as harbor_search
-- (BYPASSRLS, NOLOGIN), return only ids and ranks, and restrict rows with the same
-- harbor._visible() predicate the policies use, evaluated for the caller's
-- identity (harbor.caller_*). Hydration then filters again.

-- Substring matches, recall()'s fallback when there is no embedding and no
-- word of the query matched: the caller's memories (an invoker's read, so the
-- row-level security policies apply) valid at p_as_of, of the given scopes,
-- never rolling summaries, whose content contains the query, case-insensitively.
-- A function of its own, not inlined (the SET clauses), so that recall()'s
-- statement does not start this scan on every call: the call sits under a
-- one-time filter and runs only when the fallback applies.
-- It reads the caller's owner keys one by one (an index range scan each, as the
-- candidate legs): the policies' visibility test is a filter, not an index condition,
-- so a read of the tenant's rows tested every user's memories of the tenant (a
-- 100-memory owner's question that matched nothing: 30 ms beside a user of 100,000).
-- p_tenant is read on a distributed database only, where this reads the tenant's rows
-- in one statement instead (harbor_pg/db/citus_rewrites.py): the caller's tenant as
-- recall() read it, a value Citus prunes the shards by (it cannot with a function call
-- such as harbor.caller_tenant()); the policies still decide what is visible.
-- It returns each match's context key (memories.context_hash) too, the neighbour
-- signal's link, as the legs do with theirs: recall reads no row of its own for it.
-- PL/pgSQL (its statement checked when first run): the file is applied at revisions
-- older than the context key's column too.
drop function if exists harbor._substring_matches(text, harbor.memory_scope[], timestamptz,
                                                  integer);
drop function if exists harbor._substring_matches(text, harbor.memory_scope[], timestamptz,
                                                  integer, harbor.sensitivity);
do $$
begin
    -- (the form without the context key: a function's columns cannot be replaced)
    if exists (select 1 from pg_catalog.pg_proc p
                where p.oid = to_regprocedure('harbor._substring_matches(text, '
                                              'harbor.memory_scope[], timestamptz, integer, '
                                              'harbor.sensitivity, text)')
                  and not 'context_hash' = any (p.proargnames)) then
        drop function harbor._substring_matches(text, harbor.memory_scope[], timestamptz,
                                                integer, harbor.sensitivity, text);
    end if;
end
$$;
create or replace function harbor._substring_matches(
    p_query text, p_scopes harbor.memory_scope[], p_as_of timestamptz, p_limit integer,
    p_max_sensitivity harbor.sensitivity default 'sensitive', p_tenant text default null
) returns table (tenant_id text, memory_id text, scope harbor.memory_scope,
                 memory_type harbor.memory_type, importance real, valid_from timestamptz,
                 content_hash text, entity_ids text[], context_hash text)
    language plpgsql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_generic_plan
as $$
#variable_conflict use_column
begin
    return query
    select m.tenant_id, m.id, m.scope, m.memory_type, m.importance, lower(m.valid),
           m.content_hash, m.entity_ids, m.context_hash
      from harbor._caller_identity() i
     cross join lateral harbor._recall_keys(p_scopes, i.tenant_id, i.project_id, i.user_id,
                                            i.session_id, i.run_id) k
     cross join lateral (
         select m.tenant_id, m.id, m.scope, m.memory_type, m.importance, m.valid,
                m.content_hash, m.entity_ids, m.sensitivity, m.content, m.context_hash
           from harbor.memories m
          where m.tenant_id = k.tenant_id and m.scope = k.scope and m.user_id = k.user_id
            and m.project_id = k.project_id and m.session_id = k.session_id
            and m.run_id = k.run_id
         offset 0) m
     where m.valid operator(pg_catalog.@>) p_as_of
       and m.memory_type <> 'summary'
       and m.sensitivity <= p_max_sensitivity
       and strpos(lower(m.content), lower(btrim(left(p_query, 1000)))) > 0
     limit p_limit;
end
$$;

-- Ranked recall for the caller (the identity set with harbor.set_identity()),
-- under row-level security. Every signal is a column:
--   dense_rank / similarity   nearest-neighbour rank and cosine similarity
--                             (only for memories at or above min_similarity)
--   lexical_rank / lexical_score   BM25 rank and score of the OR-semantics match
--   relevance   the fusion of the two lists. fusion => 'rrf' (the default):
--               reciprocal rank fusion, sum of weight / (rrf_k + rank) over
--               both lists (dense_weight, lexical_weight: 0.75 and 1 unless set,
--               rrf_k 5); fusion => 'weighted':
--               dense_weight * the similarity + lexical_weight * the BM25
--               score, each min-max normalised over its leg's candidates (1
--               when they all score the same, 0 when the memory is not in the
--               list). Substring-fallback matches get the flat 1 / (rrf_k + 1)
--               (with 'weighted', 1)
--   neighbour   the higher fused relevance of the candidates before and after
--               this one (B follows A when B's context, hashed as content of B's
--               scope, is A's content_hash), 0 when neither is a candidate
--   date_match  1 when the query names a month (capitalised English name) or
--               a year (19xx, 20xx) and the memory became valid (UTC) in a
--               named month (of a named year, when one is named), else 0
--               The relevance column is (fused + neighbour_weight * neighbour)
--               * (1 + date_weight * date_match) (0.75 and 2 unless set)
--   recency     0.5 ^ (hours since the memory became valid / half-life), at as_of
--   entity      entity_weight * |entity_ids & anchors| / max(1, |entity_ids|)
--   type_boost  type_weight when the memory's type was asked for, else 0
--   score       relevance * (1 + recency) * (1 + importance) * (1 + entity)
--               * (1 + type_boost)
--               With importance_half_life_hours (default null: no decay) the
--               importance in the score decays: importance * 0.5 ^ (hours since
--               recall last returned the memory (harbor.memory_hits, written by
--               harbor.record_hits() after a recall), or since it became valid
--               when it never was, at as_of / half-life). The importance column
--               stays the stored one.
-- Memories of excluded_types (default none; say '{observation}') are left out by the
-- candidate legs themselves, so they take no candidate's place, and by the ranking
-- (the substring fallback's rows).
-- Results are deduplicated by content_hash (highest score wins; ties toward
-- the narrower scope), capped at top_k, then cut at the first memory that
-- would push the rendered block ('[<hash12>] <content>' per line) past
-- token_budget, so they are always a prefix of the ranking. Candidates are
-- ranked on the columns the legs carry; only the top_k are read in full.
-- Each leg hands over `candidates` memories, by default max(2 x top_k, 50):
-- on LoCoMo, 4 x top_k gave the same R@5 and R@10 (within 0.3 points) and a
-- lower R@25 (81.0 against 83.2), and a call at 1,000,000 took 14-15% longer.
-- Memories classified above max_sensitivity (default 'pii': 'sensitive' ones
-- need max_sensitivity => 'sensitive') are left out by the candidate legs
-- themselves, so they never take a place that an allowed memory could fill.
-- Without an embedding the lexical leg alone ranks; when it finds nothing, a
-- case-insensitive substring match on the query supplies flat relevance.
-- A candidate's importance under decay: its importance times 0.5 ^ (hours since recall
-- last returned it (harbor.memory_hits, read as the invoker) or since it became valid,
-- whichever is later, at p_as_of / p_half_life_hours); never above the importance (the
-- exponent stops at 1000, 0.5 ^ 1000 = 9e-302: power() raises on an underflow).
create or replace function harbor._decayed_importance(
    p_tenant text, p_memory_id text, p_importance real, p_valid_from timestamptz,
    p_as_of timestamptz, p_half_life_hours double precision
) returns double precision
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- (PL/pgSQL: its body is parsed at its first call, not at creation, so this file
    -- also runs on the revisions before the hits table's, 0025)
    return p_importance * power(0.5::double precision, least(
               greatest(date_part('epoch', p_as_of - greatest(
                   p_valid_from,
                   (select h.last_recalled_at from harbor.memory_hits h
                     where h.tenant_id = p_tenant and h.memory_id = p_memory_id))), 0)
               / 3600.0 / p_half_life_hours, 1000));
end
$$;

-- (the previous signature, without fusion and max_sensitivity: an overload
-- left in place would make calls ambiguous)
drop function if exists harbor.recall(text, public.vector, text, harbor.memory_scope[], integer,
                                      text[], harbor.memory_type[], timestamptz,
                                      double precision, double precision, double precision,
                                      integer, double precision, integer, integer,
                                      double precision, double precision);
-- (and the one without neighbour_weight and date_weight, and their columns)
drop function if exists harbor.recall(text, public.vector, text, harbor.memory_scope[], integer,
                                      text[], harbor.memory_type[], timestamptz,
                                      double precision, double precision, double precision,
                                      integer, double precision, integer, integer,
                                      double precision, double precision, text,
                                      harbor.sensitivity);
-- (and the one without importance_half_life_hours, whose result also lacked expires_at
-- in its first version; and the one without excluded_types, after it)
drop function if exists harbor.recall(text, public.vector, text, harbor.memory_scope[], integer,
                                      text[], harbor.memory_type[], timestamptz,
                                      double precision, double precision, double precision,
                                      integer, double precision, integer, integer,
                                      double precision, double precision, text,
                                      harbor.sensitivity, double precision, double precision,
                                      double precision);
drop function if exists harbor.recall(text, public.vector, text, harbor.memory_scope[], integer,
                                      text[], harbor.memory_type[], timestamptz,
                                      double precision, double precision, double precision,
                                      integer, double precision, integer, integer,
                                      double precision, double precision, text,
                                      harbor.sensitivity, double precision, double precision);
create or replace function harbor.recall(
    query text,
    query_embedding public.vector default null,
    model_id text default null,
    scopes harbor.memory_scope[] default '{user,project,session}',
    top_k integer default 6,
    anchor_entity_ids text[] default '{}',
    wanted_types harbor.memory_type[] default '{}',
    as_of timestamptz default null,
    recency_half_life_hours double precision default 4320,
    entity_weight double precision default 0.5,
    type_weight double precision default 0.5,
    rrf_k integer default 5,
    min_similarity double precision default null,
    token_budget integer default null,
    candidates integer default null,
    dense_weight double precision default 0.75,
    lexical_weight double precision default 1,
    fusion text default 'rrf',
    max_sensitivity harbor.sensitivity default 'pii',
    neighbour_weight double precision default 0.75,
    date_weight double precision default 2,
    importance_half_life_hours double precision default null,
    excluded_types harbor.memory_type[] default '{}'
) returns table (
    rank integer, id text, tenant_id text, scope text, project_id text, principal_id text,
    user_id text, session_id text, run_id text, memory_type text, content text,
    content_hash text, importance real, entity_ids text[], source text, sensitivity text,
    valid_from timestamptz, invalid_at timestamptz, superseded_by text,
    source_session_id text, source_message_ids text[], metadata jsonb, context text,
    created_at timestamptz, updated_at timestamptz, expires_at timestamptz,
    dense_rank integer, similarity double precision, lexical_rank integer,
    lexical_score double precision, substring_match boolean, relevance double precision,
    recency double precision, entity double precision, type_boost double precision,
    score double precision, tokens integer, neighbour double precision,
    date_match double precision
)
    language plpgsql stable security invoker
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_generic_plan
as $$
declare
    v_as_of  timestamptz := coalesce(recall.as_of, pg_catalog.now());
    v_n      integer;
    v_query  text := left(coalesce(recall.query, ''), 20000);
    -- the months (capitalised English names) and the years (19xx, 20xx) as whole words
    v_month_re constant text := '\m(January|February|March|April|May|June|July|August'
                                '|September|October|November|December)\M';
    v_year_re constant text := '\m((?:19|20)[0-9]{2})\M';
    v_months integer[];  -- the months the query names (1-12), for date_match
    v_years  integer[];  -- the years it names
begin
    if recall.top_k is null or recall.top_k < 0 or recall.top_k > 1000 then
        raise exception 'harbor.recall: top_k must be between 0 and 1000' using errcode = '22023';
    end if;
    if recall.rrf_k is null or recall.rrf_k < 1 then
        raise exception 'harbor.recall: rrf_k must be >= 1' using errcode = '22023';
    end if;
    if recall.recency_half_life_hours is not null and not recall.recency_half_life_hours > 0 then
        raise exception 'harbor.recall: recency_half_life_hours must be > 0 (or null for no recency)'
            using errcode = '22023';
    end if;
    if coalesce(recall.entity_weight, 0) < 0 or coalesce(recall.type_weight, 0) < 0
       or recall.entity_weight = 'NaN' or recall.type_weight = 'NaN' then
        raise exception 'harbor.recall: boost weights must be >= 0' using errcode = '22023';
    end if;
    if not (coalesce(recall.dense_weight, -1) >= 0 and coalesce(recall.lexical_weight, -1) >= 0)
       or recall.dense_weight = 'Infinity' or recall.lexical_weight = 'Infinity' then
        raise exception 'harbor.recall: leg weights must be finite and >= 0' using errcode = '22023';
    end if;
    if recall.fusion is null or recall.fusion not in ('rrf', 'weighted') then
        raise exception 'harbor.recall: fusion must be rrf or weighted'
            using errcode = '22023';
    end if;
    if not (coalesce(recall.neighbour_weight, -1) >= 0 and coalesce(recall.date_weight, -1) >= 0)
       or recall.neighbour_weight = 'Infinity' or recall.date_weight = 'Infinity' then
        raise exception 'harbor.recall: neighbour_weight and date_weight must be finite and >= 0'
            using errcode = '22023';
    end if;
    if recall.importance_half_life_hours is not null
       and not recall.importance_half_life_hours > 0 then
        raise exception 'harbor.recall: importance_half_life_hours must be > 0 (or null for '
                        'no decay)' using errcode = '22023';
    end if;
    if recall.max_sensitivity is null then
        raise exception 'harbor.recall: max_sensitivity must not be null' using errcode = '22023';
    end if;
    if recall.token_budget is not null and recall.token_budget < 0 then
        raise exception 'harbor.recall: token_budget must be >= 0' using errcode = '22023';
    end if;
    if recall.top_k = 0 or recall.scopes is null or cardinality(recall.scopes) = 0
       or (btrim(v_query) = '' and recall.query_embedding is null) then
        return;
    end if;
    v_n := greatest(coalesce(recall.candidates, 0), 2 * recall.top_k, 50);
    -- ---- the date signal: the months and the years the query names. Each list is read
    -- by a statement of its own, run only when a test of its pattern (a simple expression,
    -- no statement) finds one: most queries name no date, and the two statements cost
    -- a small owner's call about 30 us
    if recall.date_weight > 0 and v_query operator(pg_catalog.~) v_month_re then
        select array_agg(distinct pg_catalog.array_position(array['January', 'February',
                   'March', 'April', 'May', 'June', 'July', 'August', 'September',
                   'October', 'November', 'December'], r.m[1]))
          into v_months
          from pg_catalog.regexp_matches(v_query, v_month_re, 'g') r(m);
    end if;
    if recall.date_weight > 0 and v_query operator(pg_catalog.~) v_year_re then
        select array_agg(distinct r.m[1]::integer)
          into v_years
          from pg_catalog.regexp_matches(v_query, v_year_re, 'g') r(m);
    end if;
    return query
    with lexical as materialized (
        -- the lexical leg, handed the query's vector too: for a small owner it ranks
        -- both legs over the owner's rows at once, and says so with a row whose
        -- memory_id is null and dense_rank 0 (the dense leg then does not run); its
        -- rows carry the owner's row count (owner_rows) for the dense leg
        select l.*
          from harbor._lexical_candidates(v_query, recall.scopes, v_as_of, v_n,
                                          p_max_sensitivity => recall.max_sensitivity,
                                          p_excluded_types => recall.excluded_types,
                                          p_embedding => recall.query_embedding,
                                          p_model_id => recall.model_id) l
    ), dense as (
        -- the lexical leg runs first: its count of the owner's memories spares
        -- the dense leg counting the vectors (when a word matched, or the question
        -- holds none)
        select d.*, min(d.similarity) over () as sim_lo, max(d.similarity) over () as sim_hi
          from (select d.*
                  from harbor._dense_candidates(recall.query_embedding, recall.model_id,
                                                recall.scopes, v_as_of, v_n,
                                                p_owner_rows => (select x.owner_rows
                                                                   from lexical x limit 1),
                                                p_max_sensitivity => recall.max_sensitivity,
                                                p_excluded_types => recall.excluded_types) d
                 -- (a one-time filter: the leg runs only when the lexical leg did not
                 -- rank its candidates)
                 where not exists (select 1 from lexical x
                                    where x.memory_id is null and x.dense_rank = 0)
                union all
                select x.tenant_id, x.memory_id, x.dense_rank, x.similarity, x.scope,
                       x.memory_type, x.importance, x.valid_from, x.content_hash,
                       x.entity_ids, x.context_hash
                  from lexical x
                 where x.memory_id is not null and x.dense_rank is not null) d
         where recall.min_similarity is null or d.similarity >= recall.min_similarity
    ), lexical_ranked as (
        -- (the score range of the leg's candidates: the weighted fusion's scale)
        select l.*, min(l.lexical_score) over () as score_lo,
               max(l.lexical_score) over () as score_hi
          from lexical l
         where l.lexical_rank is not null
    ), fused as materialized (
        -- both legs carry the ranking columns of their rows (the same row's)
        select coalesce(d.tenant_id, l.tenant_id) as tenant_id,
               coalesce(d.memory_id, l.memory_id) as memory_id,
               d.dense_rank, d.similarity, l.lexical_rank, l.lexical_score, false as substring_match,
               case when recall.fusion = 'weighted' then
                   -- each leg's score, min-max normalised over its candidates
                   coalesce(recall.dense_weight
                            * case when d.sim_hi <= d.sim_lo then 1
                                   else (d.similarity - d.sim_lo) / (d.sim_hi - d.sim_lo) end, 0)
                   + coalesce(recall.lexical_weight
                              * case when l.score_hi <= l.score_lo then 1
                                     else (l.lexical_score - l.score_lo)
                                          / (l.score_hi - l.score_lo) end, 0)
               else coalesce(recall.dense_weight / (recall.rrf_k + d.dense_rank), 0)
                    + coalesce(recall.lexical_weight / (recall.rrf_k + l.lexical_rank), 0)
               end as relevance,
               coalesce(d.scope, l.scope) as scope,
               coalesce(d.memory_type, l.memory_type) as memory_type,
               coalesce(d.importance, l.importance) as importance,
               coalesce(d.valid_from, l.valid_from) as valid_from,
               coalesce(d.content_hash, l.content_hash) as content_hash,
               case when d.memory_id is null then l.entity_ids else d.entity_ids end as entity_ids,
               -- the key of the row's context (memories.context_hash), read by the leg
               -- with the rest: the neighbour signal's link, no probe of its own
               coalesce(d.context_hash, l.context_hash) as context_key
          from dense d full join lexical_ranked l
            -- C collation: the merge join sorts both legs on these keys, and only
            -- equality matters (libc's strcoll() is most of a text comparison)
            on l.tenant_id collate "C" = d.tenant_id collate "C"
           and l.memory_id collate "C" = d.memory_id collate "C"
    ), candidates as (
        select f.* from fused f
        union all
        -- the substring fallback: no embedding and nothing matched the words (a
        -- one-time filter: the function runs only then)
        select s.tenant_id, s.memory_id, null::integer, null::double precision,
               null::integer, null::double precision, true,
               case when recall.fusion = 'weighted' then 1::double precision
                    else 1::double precision / (recall.rrf_k + 1) end,
               s.scope, s.memory_type, s.importance, s.valid_from, s.content_hash, s.entity_ids,
               s.context_hash
          from harbor._substring_matches(v_query, recall.scopes, v_as_of, v_n,
                                         recall.max_sensitivity) s
         where recall.query_embedding is null
           and btrim(v_query) <> ''
           and not exists (select 1 from fused)
    ), linked as (
        -- ---- neighbour expansion. A memory's context is the text before it (a
        -- conversation's previous turn), stored with the key it would have as content
        -- (memories.context_hash, harbor.context_hash()). The legs and the substring
        -- fallback return it with their rows (no probe of recall's own: each node of
        -- this statement is set up on every call, run or not). A candidate follows the
        -- candidate whose content hash is its context's
        select c.*,
               case when recall.neighbour_weight > 0 then c.context_key end as context_hash
          from candidates c
    ), neighboured as (
        -- each candidate's neighbour signal: the higher fused relevance of the
        -- candidate before it and the candidate after it (0 when neither is one)
        select l.tenant_id, l.memory_id, l.dense_rank, l.similarity, l.lexical_rank,
               l.lexical_score, l.substring_match,
               coalesce(greatest(p.relevance, n.relevance), 0::double precision) as neighbour,
               l.relevance as fused,
               l.scope, l.memory_type, l.importance, l.valid_from, l.content_hash, l.entity_ids
          from linked l
          left join (select b.tenant_id, b.content_hash collate "C" as h,
                            max(b.relevance) as relevance
                       from linked b group by 1, 2) p
            on p.tenant_id = l.tenant_id and p.h = l.context_hash collate "C"
          left join (select a.tenant_id, a.context_hash collate "C" as h,
                            max(a.relevance) as relevance
                       from linked a where a.context_hash is not null group by 1, 2) n
            on n.tenant_id = l.tenant_id and n.h = l.content_hash collate "C"
    ), dated as (
        -- ---- the date signal: 1 when the query names a month or a year
        -- and the memory became valid (UTC) in one of the named months (of a named
        -- year, when it names one), else 0
        select g.*,
               case when v_months is null and v_years is null then 0::double precision
                    when (v_months is null
                          or pg_catalog.date_part('month', g.valid_from at time zone 'UTC')::integer
                             = any (v_months))
                     and (v_years is null
                          or pg_catalog.date_part('year', g.valid_from at time zone 'UTC')::integer
                             = any (v_years))
                    then 1::double precision else 0::double precision end as date_match
          from neighboured g
    ), relevant as (
        -- relevance: the fused relevance plus neighbour_weight times the
        -- neighbour's, times (1 + date_weight * date_match)
        select d.tenant_id, d.memory_id, d.dense_rank, d.similarity, d.lexical_rank,
               d.lexical_score, d.substring_match,
               (d.fused + recall.neighbour_weight * d.neighbour)
                 * (1 + recall.date_weight * d.date_match) as relevance,
               d.scope, d.memory_type, d.importance, d.valid_from, d.content_hash, d.entity_ids,
               d.neighbour, d.date_match
          from dated d
    ), scored as (
        -- ---- (end of the neighbour and date signals)
        select c.*,
               case when recall.recency_half_life_hours is null then 0::double precision
                    else pg_catalog.power(0.5::double precision,
                        -- date_part(): double precision directly (extract() returns numeric,
                        -- converted to double through its text form)
                        greatest(pg_catalog.date_part('epoch', v_as_of - c.valid_from), 0)
                        / 3600.0 / recall.recency_half_life_hours) end as recency,
               case when coalesce(cardinality(recall.anchor_entity_ids), 0) = 0
                         or coalesce(recall.entity_weight, 0) = 0 then 0::double precision
                    else recall.entity_weight * (
                   select count(*) from (select distinct e from unnest(c.entity_ids) e) x
                    where x.e = any (recall.anchor_entity_ids))::double precision
                   / greatest(1, cardinality(c.entity_ids)) end as entity,
               case when c.memory_type = any (coalesce(recall.wanted_types, '{}'))
                    then coalesce(recall.type_weight, 0) else 0 end::double precision as type_boost,
               case c.scope when 'run' then 0 when 'session' then 1 when 'user' then 2
                            when 'project' then 3 when 'tenant' then 4 else 5 end as breadth,
               -- importance decay (off without importance_half_life_hours), read through
               -- a function called only in the branch that decays: a subquery here, even
               -- one never run, cost a recall without decay 2% (its plan is set up for
               -- every call)
               case when recall.importance_half_life_hours is null then c.importance
                    else harbor._decayed_importance(c.tenant_id, c.memory_id, c.importance,
                                                    c.valid_from, v_as_of,
                                                    recall.importance_half_life_hours)
               end as weight
          from relevant c
    ), final as (
        select s.*,
               s.relevance * (1 + s.recency) * (1 + s.weight) * (1 + s.entity)
                 * (1 + s.type_boost) as score
          from scored s
    ), deduped as (
        select f.*, row_number() over (partition by f.content_hash collate "C"
                                       order by f.score desc, f.breadth, f.memory_id) as copy
          from final f
    ), ranked as (
        select d.*, row_number() over (order by d.score desc, d.breadth, d.memory_id) as pos
          from deduped d
         where d.copy = 1
           -- (excluded_types: the legs leave them out; the substring fallback's rows here,
           -- before the cut, so that top_k counts the rest)
           and d.memory_type operator(pg_catalog.<>) all (coalesce(recall.excluded_types, '{}'))
         order by d.score desc, d.breadth, d.memory_id
         limit recall.top_k
    ), hydrated as (
        -- the returned memories in full, read as the invoker: the policies filter
        -- again here. One primary-key probe per memory: the probe names only the
        -- id (the policy supplies the tenant), and OFFSET 0 keeps the candidate's
        -- tenant test outside it; with both tenant tests inside, the planner
        -- multiplies them into a one-row estimate and scans the caller's rows per
        -- candidate (measured: 6.3 s for a 100,000-row owner, each probe reading
        -- all of them)
        select m.*, r.dense_rank, r.similarity, r.lexical_rank, r.lexical_score,
               r.substring_match, r.relevance::double precision as relevance, r.recency,
               r.entity, r.type_boost, r.score, r.pos, r.neighbour, r.date_match,
               harbor.recall_line_tokens(m.content_hash, m.content) as tok
          from ranked r
          cross join lateral (
              select m1.* from harbor.memories m1 where m1.id = r.memory_id offset 0) m
         where m.tenant_id = r.tenant_id
           and coalesce(m.valid operator(pg_catalog.@>) v_as_of, false)
           and not coalesce(m.expires_at operator(pg_catalog.<=) v_as_of, false)
           and m.memory_type <> 'summary'
           and m.scope = any (recall.scopes)
    ), budgeted as (
        select h.*, sum(h.tok) over (order by h.pos) as cumulative
          from hydrated h
    )
    select b.pos::integer, b.id, b.tenant_id, b.scope::text, b.project_id, b.principal_id,
           b.user_id, b.session_id, b.run_id, b.memory_type::text, b.content, b.content_hash,
           b.importance, b.entity_ids, b.source, b.sensitivity::text, lower(b.valid),
           upper(b.valid), b.superseded_by, b.source_session_id, b.source_message_ids,
           b.metadata, b.context, b.created_at, b.updated_at, b.expires_at,
           b.dense_rank, b.similarity, b.lexical_rank, b.lexical_score, b.substring_match,
           b.relevance, b.recency, b.entity, b.type_boost, b.score, b.tok, b.neighbour,
           b.date_match
      from budgeted b
     where recall.token_budget is null or b.cumulative <= recall.token_budget
     order by b.pos;
end
$$;
