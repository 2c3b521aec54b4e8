-- Hybrid recall: candidate generation and ranking, in SQL.
--
-- harbor.recall() is SECURITY INVOKER: it hydrates and ranks under the
-- row-level security policies like any SELECT. Candidate generation needs the
-- indexes that row-level security keeps from the planner (`@@` and `<=>` are
-- not leakproof, see DESIGN.md), so the two candidate functions run as
-- harbor_search (BYPASSRLS, NOLOGIN), return only ids and ranks, and restrict
-- rows with the same harbor._visible() predicate the policies use, evaluated
-- for the caller's identity (harbor.caller_*). Hydration then filters again.

-- The caller's identity in one lookup (one role-binding query instead of one
-- per field): the same values harbor.caller_tenant() ... caller_run() return.
create or replace function harbor._caller_identity(
    out tenant_id text, out project_id text, out user_id text, out session_id text,
    out run_id text)
    language sql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
    select coalesce(b.tenant_id, harbor._setting('tenant_id')),
           case when b.tenant_id is not null then b.project_id
                else harbor._setting('project_id') end,
           case when b.tenant_id is not null then b.user_id
                else coalesce(harbor._setting('user_id'), harbor._setting('principal_id')) end,
           case when b.tenant_id is not null and b.user_id is null then null
                else harbor._setting('session_id') end,
           case when b.tenant_id is not null and b.user_id is null then null
                else harbor._setting('run_id') end
      from (select 1) one left join harbor._binding() b on true
$$;

-- An identity narrowed to each requested scope it can address: one owner key
-- per scope, exactly the key harbor._visible() accepts for rows of that scope.
drop function if exists harbor.recall_keys(harbor.memory_scope[]);
create or replace function harbor._recall_keys(
    scopes harbor.memory_scope[], i_tenant text, i_project text, i_user text, i_session text,
    i_run text
) returns table (scope harbor.memory_scope, tenant_id text, project_id text, user_id text,
                 session_id text, run_id text)
    language sql immutable security invoker parallel safe
begin atomic
    select k.scope, k.tenant_id, k.project_id, k.user_id, k.session_id, k.run_id
      from (values
               ('global'::harbor.memory_scope, ''::text, ''::text, ''::text, ''::text, ''::text),
               ('tenant', i_tenant, '', '', '', ''),
               ('project', i_tenant, i_project, '', '', ''),
               ('user', i_tenant, '', i_user, '', ''),
               ('session', i_tenant, '', i_user, i_session, ''),
               ('run', i_tenant, coalesce(i_project, ''), i_user, i_session, i_run)
           ) k(scope, tenant_id, project_id, user_id, session_id, run_id)
     where k.scope operator(pg_catalog.=) any (scopes)
       and k.tenant_id is not null and k.project_id is not null and k.user_id is not null
       and k.session_id is not null and k.run_id is not null;
end;

-- Approximate tokens, as harbor_pg.context.tokens.approximate_tokens: ASCII at
-- about four characters per token, every other character one token.
create or replace function harbor.approximate_tokens(t text) returns integer
    language sql immutable security invoker parallel safe
-- not STRICT: a strict SQL function with a CASE body is never inlined
return case when t is null then null
            when t = '' then 0
            -- all ASCII (one byte per character): no regular expression needed
            when pg_catalog.octet_length(t) = pg_catalog.length(t)
            then greatest(1, ceil(pg_catalog.length(t) / 4.0)::integer)
            else greatest(1,
    ceil(pg_catalog.length(pg_catalog.regexp_replace(t, '[^\x01-\x7f]', '', 'g')) / 4.0)::integer
    + (pg_catalog.length(t)
       - pg_catalog.length(pg_catalog.regexp_replace(t, '[^\x01-\x7f]', '', 'g')))) end;

-- Tokens of a memory's rendered recall line, '[<hash12>] <content>' with the
-- content's whitespace runs collapsed to one space (as
-- harbor_pg.context.ranking.render_recalled), by harbor.approximate_tokens.
-- regexp_replace() starts a new matcher per match (about 25 us for an
-- eight-word memory: most of the ranking step), so the common case, ASCII
-- with single spaces and no other whitespace, skips it: collapsing cannot
-- change that text beyond btrim(), and all-ASCII text is four characters a
-- token. Not STRICT and argument-only, so it is inlined into the ranking.
-- The same single-spaced-ASCII test is written out again in harbor.context_hash
-- below, on purpose: a shared helper would be one more function call per
-- candidate row unless the planner inlines it; change both together.
create or replace function harbor.recall_line_tokens(content_hash text, content text)
    returns integer
    language sql immutable security invoker parallel safe
return case
    when pg_catalog.octet_length(content) = pg_catalog.length(content)
         and pg_catalog.octet_length(content_hash) = pg_catalog.length(content_hash)
         and pg_catalog.strpos(content, '  ') = 0
         and pg_catalog.strpos(content, E'\t') = 0
         and pg_catalog.strpos(content, E'\n') = 0
         and pg_catalog.strpos(content, E'\r') = 0
         and pg_catalog.strpos(content, E'\f') = 0
         and pg_catalog.strpos(content, pg_catalog.chr(11)) = 0
    then greatest(1, ceil((3 + pg_catalog.length(left(content_hash, 12))
                           + pg_catalog.length(pg_catalog.btrim(content))) / 4.0)::integer)
    else harbor.approximate_tokens('[' || left(content_hash, 12) || '] '
             || pg_catalog.regexp_replace(pg_catalog.btrim(content), '\s+', ' ', 'g')) end;

-- The dedup key a memory's context would have as content of its scope
-- (harbor_pg.records.content_hash: scope ':' the text, whitespace runs collapsed,
-- trimmed, lower case; sha256 in hex), null without a context: recall's neighbour
-- signal links a candidate to the one whose content_hash this is. Stored in
-- memories.context_hash (migration 0019) by the trigger below. regexp_replace()
-- costs about 25 us a text: ASCII with single spaces and no other whitespace is
-- its own collapsed form, so it skips the matcher (as harbor.recall_line_tokens).
-- Stable, not immutable: an enum's text is not immutable.
create or replace function harbor.context_hash(scope harbor.memory_scope, context text)
    returns text
    language sql stable security invoker parallel safe
return case when context is null then null
            else pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
                     scope::text || ':' || pg_catalog.lower(pg_catalog.btrim(
                         case when pg_catalog.octet_length(context) = pg_catalog.length(context)
                               and pg_catalog.strpos(context, '  ') = 0
                               and pg_catalog.strpos(context, E'\t') = 0
                               and pg_catalog.strpos(context, E'\n') = 0
                               and pg_catalog.strpos(context, E'\r') = 0
                               and pg_catalog.strpos(context, E'\f') = 0
                               and pg_catalog.strpos(context, pg_catalog.chr(11)) = 0
                              then context
                              else pg_catalog.regexp_replace(context, '\s+', ' ', 'g') end)),
                     'UTF8')), 'hex') end;

-- memories.context_hash follows the row's scope and context on every insert and
-- on an update of either (or of the column: a writer's own value is replaced).
create or replace function harbor._memories_context_hash() returns trigger
    language plpgsql security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    new.context_hash := harbor.context_hash(new.scope, new.context);
    return new;
end
$$;

-- (the column comes with revision 0019; this file also runs on the revisions before
-- it. The condition keeps the call off the rows without a context)
do $$
begin
    if exists (select 1 from pg_catalog.pg_attribute
                where attrelid = 'harbor.memories'::pg_catalog.regclass
                  and attname = 'context_hash' and not attisdropped) then
        create or replace trigger memories_context_hash
            before insert or update of scope, context, context_hash on harbor.memories
            for each row
            when (new.context is not null or new.context_hash is not null)
            execute function harbor._memories_context_hash();
    else
        drop trigger if exists memories_context_hash on harbor.memories;
    end if;
end
$$;

-- Dense candidates: the p_limit nearest memories by cosine distance (a memory
-- saved with a context has a vector of its content and one of context plus
-- content; the nearer counts) among the caller's visible rows of one model,
-- valid at p_as_of, of the given scopes, never rolling summaries. Each comes
-- with the columns the ranking reads (read anyway by the validity probe), so
-- that harbor.recall() hydrates only the memories it returns.
-- When the caller sees at most p_exact_limit vectors of that model, or at most
-- 2% of all vectors, it scans them exactly (from the owner-keyed covering index);
-- otherwise it walks the HNSW index with an iterative scan and the visibility
-- filter. At 2% or more of the rows passing the filter, the walk meets enough
-- of them long before its scan limit, so a filter never starves the result,
-- and a small owner never pays for a graph walk over everyone else's rows.
-- p_owner_rows, when given, is how many memories the same owner keys hold (the
-- lexical leg counts them, see harbor._lexical_candidates): a memory has at most
-- two vectors of a model, so at most twice that many vectors means the exact
-- scan without counting them (about 0.2 ms of a 1,000-memory owner's call at
-- 1,000,000). The count only chooses the path: a wrong figure costs time, never
-- rows, because the exact scan does not rely on it.
do $$
begin
    -- Older versions, dropped first: their signatures grew (the dense leg's by
    -- p_owner_rows, the lexical leg's by p_term_limit), and an old overload left
    -- in place would make calls ambiguous.
    drop function if exists harbor._dense_candidates(public.vector, text,
                                                     harbor.memory_scope[], timestamptz,
                                                     integer, integer);
    drop function if exists harbor._lexical_candidates(text, harbor.memory_scope[],
                                                       timestamptz, integer, integer);
    -- (and by p_max_sensitivity, the recall ceiling)
    drop function if exists harbor._dense_candidates(public.vector, text,
                                                     harbor.memory_scope[], timestamptz,
                                                     integer, integer, integer);
    drop function if exists harbor._lexical_candidates(text, harbor.memory_scope[],
                                                       timestamptz, integer, integer, integer);
end
$$;
create or replace function harbor._dense_candidates(
    p_embedding public.vector, p_model_id text, p_scopes harbor.memory_scope[],
    p_as_of timestamptz, p_limit integer, p_exact_limit integer default 5000,
    p_owner_rows integer default null,
    p_max_sensitivity harbor.sensitivity default 'sensitive'
) returns table (tenant_id text, memory_id text, dense_rank integer, similarity double precision,
                 scope harbor.memory_scope, memory_type harbor.memory_type, importance real,
                 valid_from timestamptz, content_hash text, entity_ids text[])
    language plpgsql stable security definer
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_generic_plan
as $$
declare
    v_id      record := harbor._caller_identity();
    v_tenant  text := v_id.tenant_id;
    v_project text := v_id.project_id;
    v_user    text := v_id.user_id;
    v_session text := v_id.session_id;
    v_run     text := v_id.run_id;
    v_dims    integer := public.vector_dims(p_embedding);
    v_seen    integer;
    v_limit   integer;
    v_window  integer;
    v_rows    bigint;
    v_scan    text;
    v_ef      text;
    v_tuples  text;
    v_sort    text;
    v_seqscan text;
begin
    if p_embedding is null or p_model_id is null or coalesce(p_limit, 0) < 1 then
        return;
    end if;
    select greatest(p_exact_limit, (0.02 * greatest(c.reltuples, 0))::integer) into v_limit
      from pg_catalog.pg_class c where c.oid = 'harbor.memory_embeddings'::regclass;
    if p_owner_rows >= 0 and 2 * p_owner_rows::bigint <= v_limit then
        v_seen := null;  -- few enough: the exact scan, uncounted
    else
        select count(*) into v_seen
          from (select 1
                  from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user, v_session,
                                           v_run) k
                  -- (an index range scan per owner key, as in the lexical leg)
                  cross join lateral (
                      select 1 from harbor.memory_embeddings e
                       where e.tenant_id = k.tenant_id and e.model_id = p_model_id
                         and e.scope = k.scope and e.user_id = k.user_id
                         and e.project_id = k.project_id
                         and e.session_id = k.session_id and e.run_id = k.run_id
                      offset 0) e
                 limit v_limit + 1) c;
        if v_seen = 0 then
            return;
        end if;
    end if;
    if v_seen is null or v_seen <= v_limit or v_dims not in (384, 1536) then
        -- The caller's vectors by distance (owner-keyed indexes; the owner-key join
        -- is the visibility test), first only the nearest v_window of them (a
        -- bounded sort), then each one's memory by primary key in that order
        -- until enough valid ones are found: never the other way round, which
        -- a generic plan would otherwise pick, re-reading the owner's vectors
        -- per memory. A memory with a context has two vectors and the nearer
        -- counts: the nearest p_limit + C valid vectors, C the context vectors
        -- in the window (at most p_limit), hold the nearer vector of each of
        -- the nearest p_limit valid memories (at most C of those vectors are
        -- a second vector of a memory already counted). When the window holds
        -- fewer valid vectors than that (superseded memories crowd it) and not
        -- every vector of the caller (it is full), the statement returns nothing
        -- and runs again over all of them (v_window null: no limit).
        v_window := 2 * p_limit + 64;
        loop
            return query
                with win as materialized (
                    select w.tenant_id, w.memory_id, w.with_context, w.dist
                      from (-- 384-dimension vectors from the index that holds them (an
                            -- owner's side by side), without visiting the table
                            -- (one key column: the owner fields encoded, compared
                            -- byte for byte)
                            select e.tenant_id, e.memory_id, e.with_context,
                                   e.embedding operator(public.<=>) p_embedding as dist
                              from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                       v_session, v_run) k
                              join harbor.memory_embeddings e
                                on harbor.vector_owner_key(e.tenant_id, e.model_id, e.scope,
                                                           e.user_id, e.project_id,
                                                           e.session_id, e.run_id) collate "C"
                                   = harbor.vector_owner_key(k.tenant_id, p_model_id, k.scope,
                                                             k.user_id, k.project_id,
                                                             k.session_id, k.run_id) collate "C"
                             where harbor.vector_owner_entry_fits(e.dims, e.tenant_id,
                                                                  e.model_id, e.project_id,
                                                                  e.user_id, e.session_id,
                                                                  e.run_id, e.memory_id)
                               and v_dims = 384
                            union all
                            -- every other vector of this dimension
                            select e.tenant_id, e.memory_id, e.with_context,
                                   e.embedding operator(public.<=>) p_embedding
                              from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                       v_session, v_run) k
                              join harbor.memory_embeddings e
                                on e.tenant_id = k.tenant_id and e.model_id = p_model_id
                               and e.scope = k.scope and e.user_id = k.user_id
                               and e.project_id = k.project_id
                               and e.session_id = k.session_id and e.run_id = k.run_id
                             where not harbor.vector_owner_entry_fits(e.dims, e.tenant_id,
                                                                      e.model_id,
                                                                      e.project_id,
                                                                      e.user_id,
                                                                      e.session_id,
                                                                      e.run_id, e.memory_id)
                               and e.dims = v_dims) w
                     order by w.dist, w.memory_id
                     limit v_window
                ), wanted as (
                    select p_limit + least(p_limit, count(*) filter (where win.with_context))::integer
                           as n
                      from win
                ), near as materialized (
                    select win.tenant_id, win.memory_id, win.dist, m.scope, m.memory_type,
                           m.importance, lower(m.valid) as valid_from, m.content_hash, m.entity_ids
                      from win
                      join harbor.memories m
                        on m.tenant_id = win.tenant_id and m.id = win.memory_id
                     -- only the primary key may find the row
                     where coalesce(m.valid operator(pg_catalog.@>) p_as_of, false)
                       -- the memory's own owner, not only its vector's copy (a
                       -- trigger keeps them equal; this does not rely on it), in
                       -- coalesce() as the tests above, so it is no index condition
                       and coalesce(harbor._visible(m.scope, m.tenant_id, m.project_id,
                                                    m.user_id, m.session_id, m.run_id,
                                                    v_tenant, v_project, v_user, v_session,
                                                    v_run), false)
                       and m.memory_type <> 'summary'
                       and m.sensitivity <= p_max_sensitivity
                       and coalesce(m.scope = any (p_scopes), false)
                     order by win.dist, win.memory_id
                     limit (select wanted.n from wanted)
                )
                select c.tenant_id, c.memory_id, (rank() over (order by c.dist))::integer,
                       1 - c.dist, c.scope, c.memory_type, c.importance, c.valid_from,
                       c.content_hash, c.entity_ids
                  from (select w.tenant_id, w.memory_id, min(w.dist) as dist,
                               any_value(w.scope) as scope,
                               any_value(w.memory_type) as memory_type,
                               any_value(w.importance) as importance,
                               any_value(w.valid_from) as valid_from,
                               any_value(w.content_hash) as content_hash,
                               any_value(w.entity_ids) as entity_ids
                          from near w
                         -- every vector was in the window, or it held enough valid ones
                         where v_window is null
                            or (select count(*) from win) < v_window
                            or (select count(*) from near) >= (select wanted.n from wanted)
                         group by w.tenant_id, w.memory_id
                         order by dist, w.memory_id
                         limit p_limit) c;
            get diagnostics v_rows = row_count;
            exit when v_rows > 0 or v_window is null;
            v_window := null;
        end loop;
        return;
    end if;
    -- many visible rows: the HNSW index of this dimension (an expression index,
    -- so the dimension is spelled as a literal), filtered as it is walked; an
    -- iterative scan keeps walking until enough rows pass the filter. The two
    -- settings are restored before returning.
    v_scan := current_setting('hnsw.iterative_scan', true);
    v_ef := current_setting('hnsw.ef_search', true);
    v_tuples := current_setting('hnsw.max_scan_tuples', true);
    v_sort := current_setting('enable_sort');
    v_seqscan := current_setting('enable_seqscan');
    -- without these two the planner prefers sorting a large owner's rows (a
    -- parallel scan and an external sort of 100,000 vectors: 270 ms) to the
    -- graph walk (15 ms)
    perform set_config('hnsw.iterative_scan', 'relaxed_order', true),
            set_config('hnsw.ef_search', least(greatest(4 * p_limit, 400), 1000)::text, true),
            set_config('hnsw.max_scan_tuples', '50000', true),
            set_config('enable_sort', 'off', true),
            set_config('enable_seqscan', 'off', true);
    -- (twice the rows: a memory with a context has two vectors, the nearer counts)
    -- The graph holds only the owner keys of harbor.graph_min_vectors() vectors or more
    -- (memory_embeddings.in_graph): the walk reads those; an owner key of the caller
    -- with rows outside it (a small user of a large tenant; a key promoted over its
    -- next writes) is scanned exactly beside it (one descent of the owner index finds
    -- whether it has any), every row of it, and the two merged, the nearer vector of
    -- each memory counting. So the rows are those of a graph over all of them.
    return query execute pg_catalog.format($q$
        select c.tenant_id, c.memory_id,
               (rank() over (order by c.dist))::integer, 1 - c.dist,
               c.scope, c.memory_type, c.importance, c.valid_from, c.content_hash, c.entity_ids
          from (select w.tenant_id, w.memory_id, min(w.dist) as dist,
                       any_value(w.scope) as scope, any_value(w.memory_type) as memory_type,
                       any_value(w.importance) as importance,
                       any_value(w.valid_from) as valid_from,
                       any_value(w.content_hash) as content_hash,
                       any_value(w.entity_ids) as entity_ids
                  from ((select e.tenant_id, e.memory_id, m.scope, m.memory_type,
                                m.importance,
                               lower(m.valid) as valid_from, m.content_hash, m.entity_ids,
                               (e.embedding::public.vector(%1$s)) operator(public.<=>)
                                   ($1::public.vector(%1$s)) as dist
                          from harbor.memory_embeddings e
                          join harbor.memories m
                            on m.tenant_id = e.tenant_id and m.id = e.memory_id
                         where e.dims = %1$s and e.model_id = $2
                           and e.scope = any ($3)
                           and harbor._visible(e.scope, e.tenant_id, e.project_id, e.user_id,
                                               e.session_id, e.run_id, $5, $6, $7, $8, $9)
                           and coalesce(harbor._visible(m.scope, m.tenant_id,
                                                        m.project_id, m.user_id,
                                                        m.session_id, m.run_id,
                                                        $5, $6, $7, $8, $9), false)
                           and coalesce(m.valid operator(pg_catalog.@>) $4, false)
                           and m.memory_type <> 'summary'
                           and m.sensitivity <= $11
                           and e.in_graph
                         order by (e.embedding::public.vector(%1$s)) operator(public.<=>)
                                  ($1::public.vector(%1$s))
                         limit 2 * $10)
                union all
                -- the caller's owner keys outside the graph, exactly
                (select e.tenant_id, e.memory_id, m.scope, m.memory_type, m.importance,
                        lower(m.valid) as valid_from, m.content_hash, m.entity_ids,
                        e.embedding operator(public.<=>) $1 as dist
                   from harbor._recall_keys($3, $5, $6, $7, $8, $9) k
                   join harbor.memory_embeddings e
                     on k.tenant_id = e.tenant_id and e.model_id = $2 and e.scope = k.scope
                    and e.user_id = k.user_id and e.project_id = k.project_id
                    and e.session_id = k.session_id and e.run_id = k.run_id
                    and e.tenant_id = any (case when 'global' = any ($3) then array['', $5]
                                                else array[$5] end)
                   join harbor.memories m
                     on m.tenant_id = e.tenant_id and m.id = e.memory_id
                  where e.dims = %1$s
                    and exists (select 1 from harbor.memory_embeddings l
                                 where k.tenant_id = l.tenant_id and l.model_id = $2
                                   and l.scope = k.scope and l.user_id = k.user_id
                                   and l.project_id = k.project_id
                                   and l.session_id = k.session_id and l.run_id = k.run_id
                                   and not l.in_graph)
                    and coalesce(harbor._visible(m.scope, m.tenant_id, m.project_id,
                                                 m.user_id, m.session_id, m.run_id,
                                                 $5, $6, $7, $8, $9), false)
                    and coalesce(m.valid operator(pg_catalog.@>) $4, false)
                    and m.memory_type <> 'summary'
                    and m.sensitivity <= $11
                  order by e.embedding operator(public.<=>) $1
                  limit 2 * $10)) w
                 group by w.tenant_id, w.memory_id
                 order by dist, w.memory_id
                 limit $10) c $q$, v_dims)
        using p_embedding, p_model_id, p_scopes, p_as_of, v_tenant, v_project, v_user,
              v_session, v_run, p_limit, p_max_sensitivity;
    perform set_config('hnsw.iterative_scan', coalesce(v_scan, 'off'), true),
            set_config('hnsw.ef_search', coalesce(v_ef, '40'), true),
            set_config('hnsw.max_scan_tuples', coalesce(v_tuples, '20000'), true),
            set_config('enable_sort', v_sort, true),
            set_config('enable_seqscan', v_seqscan, true);
end
$$;

-- The columns the ranking reads, carried by each candidate leg for its rows.
do $$
begin
    if to_regtype('harbor._ranking_columns') is null then
        create type harbor._ranking_columns as (
            scope harbor.memory_scope, memory_type harbor.memory_type, importance real,
            valid_from timestamptz, content_hash text, entity_ids text[]);
    end if;
end
$$;

-- The lexemes of harbor.or_tsquery(query), given the query's English lexemes
-- (tsvector_to_array(to_tsvector('english', query))): that query ORs, for each
-- of them, the 'simple' configuration's parse of it, whose lexemes are those
-- of to_tsvector('simple', ...) of the same text. A text matches the query
-- only if it holds one of these (tests/integration/test_owner_terms.py checks
-- them against the query's own text form). Cheaper than reading them back out
-- of the query's text.
create or replace function harbor.or_tsquery_lexemes(terms text[]) returns text[]
    language sql immutable security invoker parallel safe strict
return array(
    select distinct w.lexeme
      from pg_catalog.unnest(terms) t(term),
           pg_catalog.unnest(pg_catalog.tsvector_to_array(pg_catalog.to_tsvector(
               'simple'::regconfig, pg_catalog.replace(t.term, '\', '')))) w(lexeme));

-- Lexical candidates: memories matching ANY query term (OR semantics), ranked
-- by BM25 (k1 = 1.2, b = 0.75) computed over the matching rows, among the
-- caller's visible rows valid at p_as_of, of the given scopes, never rolling
-- summaries. A small visible set is scanned through the owner-keyed indexes; a
-- large one goes through the GIN index on the text. Like the dense leg, each
-- comes with the columns the ranking reads (from the row the match was tested
-- on), so that harbor.recall() reads no candidate twice. Each row also carries
-- owner_rows, how many memories the owner keys hold (of every type and
-- validity; null above p_scan_limit, where they are not counted):
-- harbor.recall() hands it to the dense leg, which then need not count the
-- owner's vectors itself.
-- Before reading all of the owner's rows, the leg looks the query's lexemes up
-- under the caller's owner keys in the owner-term index (sql/schema.sql),
-- reading at most p_term_limit + 1 matching rows. When that finds them all (at
-- most p_term_limit), they are the matches, and the owner's rows are only
-- counted (BM25's collection size, owner_rows), from the narrow owner index;
-- with more, the leg reads the owner's rows as above. Both ways find the same
-- matches with the same scores; p_term_limit 0 skips the lookup, and so does
-- a question of more than 16 lexemes.
-- The owner pass below reads the rows in two LATERAL branches that differ only in
-- `not harbor.lexical_entry_fits(...)` on purpose (`duplicates` pairs them): one per
-- source (the covering index for the entries that fit it, the table for the rest),
-- as the comment in the body says. Its identity declarations share the shape of
-- every entry point's (erase, _dense_candidates).
create or replace function harbor._lexical_candidates(
    p_query text, p_scopes harbor.memory_scope[], p_as_of timestamptz, p_limit integer,
    p_scan_limit integer default 2000, p_term_limit integer default 32,
    p_max_sensitivity harbor.sensitivity default 'sensitive'
) returns table (tenant_id text, memory_id text, lexical_rank integer,
                 lexical_score double precision,
                 scope harbor.memory_scope, memory_type harbor.memory_type, importance real,
                 valid_from timestamptz, content_hash text, entity_ids text[],
                 owner_rows integer)
    language plpgsql stable security definer
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_generic_plan
as $$
declare
    v_id      record := harbor._caller_identity();
    v_tenant  text := v_id.tenant_id;
    v_project text := v_id.project_id;
    v_user    text := v_id.user_id;
    v_session text := v_id.session_id;
    v_run     text := v_id.run_id;
    v_terms   text[];
    v_tsq     tsquery;
    v_seen    integer;
    v_total   double precision;
    v_tenants text[];
    v_ids     text[];
    v_docs    tsvector[];
    v_cols    harbor._ranking_columns[];
    v_owners  text[];
    v_keys    text[];
    v_hits    integer;
    v_found   boolean := false;  -- the lookup found every match
    v_hidden  text[];            -- the owner's memories above p_max_sensitivity
begin
    if p_query is null or coalesce(p_limit, 0) < 1 then
        return;
    end if;
    v_terms := tsvector_to_array(to_tsvector('english'::regconfig, left(p_query, 20000)));
    if cardinality(v_terms) = 0 then
        return;
    end if;
    v_tsq := harbor.or_tsquery(p_query);
    -- (not for a question of more than 16 lexemes: one key each, and such a
    -- question mostly matches more rows than the limit anyway; at 1,000,000
    -- memories the lookup cost a 200-word question 1.6 ms before falling back)
    if p_term_limit > 0 and cardinality(v_terms) <= 16 then
        -- the caller's owner keys, and under each one key per lexeme of the query
        -- (harbor.vector_owner_key() with no model, as the index files them)
        select array_agg(harbor.vector_owner_key(k.tenant_id, '', k.scope, k.user_id,
                                                 k.project_id, k.session_id, k.run_id))
          into v_owners
          from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user, v_session, v_run) k;
        select array_agg(harbor.owner_term_prefix(o.key) || l.lexeme)
          into v_keys
          from pg_catalog.unnest(v_owners) o(key),
               pg_catalog.unnest(harbor.or_tsquery_lexemes(v_terms)) l(lexeme);
        if v_keys is null then
            return;  -- no owner key, or no lexeme the query could match
        end if;
        -- the rows indexed under those keys: a row matches the query only if its
        -- text holds one of the query's lexemes, so these are all the candidates
        -- (the owner key and the text are tested on each; the index is the only
        -- one the conditions can use)
        select count(*),
               array_agg(o.tenant_id), array_agg(o.id), array_agg(o.fts),
               array_agg(row(o.scope, o.memory_type, o.importance, lower(o.valid),
                             o.content_hash, o.entity_ids)::harbor._ranking_columns)
          into v_hits, v_tenants, v_ids, v_docs, v_cols
          from (select m.tenant_id, m.id, m.fts, m.scope, m.memory_type, m.importance,
                       m.valid, m.content_hash, m.entity_ids
                  from harbor.memories m
                 where harbor.memory_owner_terms(m.tenant_id, m.scope, m.user_id, m.project_id,
                                                 m.session_id, m.run_id, m.fts)
                       operator(pg_catalog.&&) v_keys
                   and harbor.vector_owner_key(m.tenant_id, '', m.scope, m.user_id,
                                               m.project_id, m.session_id, m.run_id)
                       operator(pg_catalog.=) any (v_owners)
                   and coalesce(m.fts operator(pg_catalog.@@) v_tsq, false)
                   and coalesce(m.valid operator(pg_catalog.@>) p_as_of, false)
                   and m.memory_type <> 'summary'
                   and m.sensitivity <= p_max_sensitivity
                   -- (in coalesce(): its tenant test, inlined, would otherwise have
                   -- the planner AND the owner's rows of a tenant index to the lookup)
                   and coalesce(harbor._visible(m.scope, m.tenant_id, m.project_id,
                                                m.user_id, m.session_id, m.run_id, v_tenant,
                                                v_project, v_user, v_session, v_run), false)
                 limit p_term_limit + 1) o;
        if v_hits = 0 then
            return;
        end if;
        -- (at most p_term_limit: every match found)
        v_found := v_hits <= p_term_limit;
    end if;
    -- how many rows the caller's owner keys hold, of every type and validity (at
    -- most p_scan_limit + 1 counted, from the narrow owner index): BM25's
    -- collection size, and whether the pass below reads them all. One count for
    -- both ways (the lookup's matches, or the pass).
    select count(*) into v_seen
      from (select 1
              from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                       v_session, v_run) k
              cross join lateral (
                  select 1 from harbor.memories m
                   where m.tenant_id = k.tenant_id and m.scope = k.scope
                     and m.user_id = k.user_id and m.project_id = k.project_id
                     and m.session_id = k.session_id and m.run_id = k.run_id
                  offset 0) m
             limit p_scan_limit + 1) c;
    if v_seen = 0 then
        return;
    end if;
    if not v_found then
        -- the owner's memories above the sensitivity ceiling, which the pass
        -- below must not count as matches: the covering index it reads does not
        -- carry the sensitivity, a small partial index of the rows above 'none'
        -- does (usually none of an owner's, so one probe per owner key finds nothing)
        if p_max_sensitivity < 'sensitive' then
            select array_agg(m.id) into v_hidden
              from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user, v_session,
                                       v_run) k
              join harbor.memories m
                on m.tenant_id = k.tenant_id and m.scope = k.scope
               and m.user_id = k.user_id and m.project_id = k.project_id
               and m.session_id = k.session_id and m.run_id = k.run_id
             where m.sensitivity <> 'none' and m.sensitivity > p_max_sensitivity;
        end if;
        if v_seen <= p_scan_limit then
            -- one statement over the caller's rows (owner-keyed indexes): the
            -- matches, BM25 over them (as harbor._bm25, which the other paths
            -- call), the top p_limit with their columns. No arrays in between:
            -- building and unnesting them, and joining the columns back, cost
            -- more than the scoring when most of an owner's rows match (LoCoMo:
            -- the speakers' names are in every turn). coalesce(): the text test
            -- is a filter on these rows, never the tenant-wide GIN index (a
            -- cached plan cannot know how common the words are).
            return query
                with docs as materialized (
                    -- each match's query terms only: marked with weight A (the
                    -- stored vectors carry no weights, and every lexeme has
                    -- positions), then kept, in C
                    select m.tenant_id, m.id,
                           greatest(pg_catalog.length(m.fts), 1)::double precision as dl,
                           pg_catalog.ts_filter(pg_catalog.setweight(m.fts, 'A', v_terms),
                                                '{a}') as terms,
                           m.scope, m.memory_type, m.importance, lower(m.valid) as valid_from,
                           m.content_hash, m.entity_ids
                      from (-- the owner's rows from the index that carries what is read here
                        -- (side by side, without visiting the table), then those whose
                        -- entry would not fit that index
                        -- (per owner key, a LATERAL subquery kept whole by OFFSET 0:
                        -- an index range scan under each key, never a merge join
                        -- that a generic plan may pick, which reads the index from
                        -- its start, every other owner's rows before the caller's)
                        select m.tenant_id, m.id, m.fts, m.scope, m.memory_type, m.importance,
                               m.valid, m.content_hash, m.entity_ids, m.project_id, m.user_id,
                               m.session_id, m.run_id
                          from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                   v_session, v_run) k
                          cross join lateral (
                              select m.tenant_id, m.id, m.fts, m.scope, m.memory_type,
                                     m.importance, m.valid, m.content_hash, m.entity_ids,
                                     m.project_id, m.user_id, m.session_id, m.run_id
                                from harbor.memories m
                               where m.tenant_id = k.tenant_id and m.scope = k.scope
                                 and m.user_id = k.user_id and m.project_id = k.project_id
                                 and m.session_id = k.session_id and m.run_id = k.run_id
                                 and harbor.lexical_entry_fits(m.tenant_id, m.project_id,
                                                               m.user_id, m.session_id,
                                                               m.run_id, m.id, m.fts,
                                                               m.entity_ids)
                              offset 0) m
                        union all
                        select m.tenant_id, m.id, m.fts, m.scope, m.memory_type, m.importance,
                               m.valid, m.content_hash, m.entity_ids, m.project_id, m.user_id,
                               m.session_id, m.run_id
                          from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                   v_session, v_run) k
                          cross join lateral (
                              select m.tenant_id, m.id, m.fts, m.scope, m.memory_type,
                                     m.importance, m.valid, m.content_hash, m.entity_ids,
                                     m.project_id, m.user_id, m.session_id, m.run_id
                                from harbor.memories m
                               where m.tenant_id = k.tenant_id and m.scope = k.scope
                                 and m.user_id = k.user_id and m.project_id = k.project_id
                                 and m.session_id = k.session_id and m.run_id = k.run_id
                                 and not harbor.lexical_entry_fits(m.tenant_id, m.project_id,
                                                                   m.user_id, m.session_id,
                                                                   m.run_id, m.id, m.fts,
                                                                   m.entity_ids)
                              offset 0) m) m
                     where coalesce(m.fts operator(pg_catalog.@@) v_tsq, false)
                       and coalesce(m.valid operator(pg_catalog.@>) p_as_of, false)
                       and m.memory_type <> 'summary'
                       and (v_hidden is null or m.id <> all (v_hidden))
                       and harbor._visible(m.scope, m.tenant_id, m.project_id, m.user_id,
                                           m.session_id, m.run_id, v_tenant, v_project,
                                           v_user, v_session, v_run)
                ), postings as materialized (
                    -- (the set-returning function in the select list: one call per
                    -- document without a result store of its own)
                    select x.tenant_id, x.id, x.dl, (x.u).lexeme as lexeme,
                           coalesce(cardinality((x.u).positions), 1)::double precision as tf
                      from (select d.tenant_id, d.id, d.dl, pg_catalog.unnest(d.terms) as u
                              from docs d) x
                ), df as (
                    select p.lexeme, count(*)::double precision as n
                      from postings p group by p.lexeme
                ), avgdl as (
                    select greatest(avg(d.dl), 1) as v from docs d
                ), scored as (
                    select p.tenant_id, p.id,
                           sum(ln(1 + (greatest(v_seen::double precision, df.n) - df.n + 0.5)
                                      / (df.n + 0.5))
                               * p.tf * 2.2 / (p.tf + 1.2 * (0.25 + 0.75 * p.dl / a.v)))
                               as score
                      from postings p join df on df.lexeme = p.lexeme cross join avgdl a
                     group by p.tenant_id, p.id
                ), top as (
                    -- the first p_limit; their ranks among all matches are their
                    -- ranks among these (a rank counts the higher scores only)
                    select s.tenant_id, s.id, s.score
                      from scored s
                     order by s.score desc, s.id
                     limit p_limit
                )
                select t.tenant_id, t.id, (rank() over (order by t.score desc))::integer,
                       t.score, d.scope, d.memory_type, d.importance, d.valid_from,
                       d.content_hash, d.entity_ids, v_seen
                  from top t
                  join docs d on d.tenant_id = t.tenant_id and d.id = t.id;
            return;
        end if;
    end if;
    -- BM25's collection size: the owner's rows, or for an owner above the scan
    -- limit (not counted further) the table's
    if v_seen <= p_scan_limit then
        v_total := v_seen;
    else
        select greatest(c.reltuples, v_seen) into v_total
          from pg_catalog.pg_class c where c.oid = 'harbor.memories'::regclass;
    end if;
    if v_found or v_seen <= p_scan_limit then
        -- each ranked match with its columns (ids are unique within a tenant; a
        -- composite array unnests into its fields)
        return query
            select b.tenant_id, b.memory_id, b.lexical_rank, b.lexical_score, h.scope,
                   h.memory_type, h.importance, h.valid_from, h.content_hash, h.entity_ids,
                   case when v_seen <= p_scan_limit then v_seen end
              from harbor._bm25(v_terms, v_total, p_limit, v_tenants, v_ids, v_docs) b
              join unnest(v_tenants, v_ids, v_cols)
                   h(tenant_id, id, scope, memory_type, importance, valid_from, content_hash,
                     entity_ids)
                on h.tenant_id = b.tenant_id and h.id = b.memory_id;
        return;
    end if;
    -- a large owner whose matches the lookup did not find: the GIN index,
    -- planned for this query's words (EXECUTE plans once per call; a cached
    -- generic plan cannot judge their rarity)
    return query execute $q$
        with matched as materialized (
            select m.tenant_id, m.id, m.fts, m.scope, m.memory_type, m.importance,
                   lower(m.valid) as valid_from, m.content_hash, m.entity_ids
              from harbor.memories m
             where m.fts operator(pg_catalog.@@) $1
               and m.tenant_id = any (array['', $2])
               and m.scope = any ($3)
               and coalesce(m.valid operator(pg_catalog.@>) $4, false)
               and m.memory_type <> 'summary'
               and m.sensitivity <= $12
               and harbor._visible(m.scope, m.tenant_id, m.project_id, m.user_id,
                                   m.session_id, m.run_id, $2, $5, $6, $7, $8))
        select b.tenant_id, b.memory_id, b.lexical_rank, b.lexical_score, x.scope,
               x.memory_type, x.importance, x.valid_from, x.content_hash, x.entity_ids,
               null::integer
          from harbor._bm25($9, $10, $11,
                            (select array_agg(x.tenant_id) from matched x),
                            (select array_agg(x.id) from matched x),
                            (select array_agg(x.fts) from matched x)) b
          join matched x on x.tenant_id = b.tenant_id and x.id = b.memory_id $q$
        using v_tsq, v_tenant, p_scopes, p_as_of, v_project, v_user, v_session, v_run,
              v_terms, v_total, p_limit, p_max_sensitivity;
end
$$;

-- BM25 over a matched set (parallel arrays), the top p_limit by score.
-- Equal scores share a rank (as equal distances do in the dense leg), so two
-- copies of one text fuse to the same relevance and the scope decides.
-- Document frequencies come from the matched rows, the collection size from
-- the caller (its visible row count), the average length from the matches.
create or replace function harbor._bm25(
    p_terms text[], p_total double precision, p_limit integer,
    p_tenants text[], p_ids text[], p_docs tsvector[]
) returns table (tenant_id text, memory_id text, lexical_rank integer,
                 lexical_score double precision)
    language sql immutable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
as $$
    with docs as (
        -- each document's query terms only: marked with weight A (the stored
        -- vectors carry no weights, and every lexeme has positions), then kept,
        -- in C, instead of a row per lexeme of the document (3x faster when
        -- hundreds of conversation turns match: LoCoMo, 193 questions)
        select d.tenant_id, d.id, greatest(length(d.doc), 1)::double precision as dl,
               ts_filter(setweight(d.doc, 'A', p_terms), '{a}') as terms
          from unnest(p_tenants, p_ids, p_docs) d(tenant_id, id, doc)
    ), postings as (
        select docs.tenant_id, docs.id, docs.dl, u.lexeme,
               coalesce(cardinality(u.positions), 1)::double precision as tf
          from docs, unnest(docs.terms) u
    ), df as (
        select p.lexeme, count(*)::double precision as n from postings p group by p.lexeme
    ), avgdl as (
        select greatest(avg(docs.dl), 1) as v from docs
    ), scored as (
        select p.tenant_id, p.id,
               sum(ln(1 + (greatest(p_total, df.n) - df.n + 0.5) / (df.n + 0.5))
                   * p.tf * 2.2 / (p.tf + 1.2 * (0.25 + 0.75 * p.dl / a.v))) as score
          from postings p join df using (lexeme) cross join avgdl a
         group by p.tenant_id, p.id
    )
    select s.tenant_id, s.id,
           (rank() over (order by s.score desc))::integer, s.score
      from scored s
     order by s.score desc, s.id
     limit p_limit
$$;

-- Substring matches, recall()'s fallback when there is no embedding and no
-- word of the query matched: the caller's memories (an invoker's read, so the
-- row-level security policies apply) valid at p_as_of, of the given scopes,
-- never rolling summaries, whose content contains the query, case-insensitively.
-- A function of its own, not inlined (the SET clauses), so that recall()'s
-- statement does not start this scan on every call: the call sits under a
-- one-time filter and runs only when the fallback applies.
drop function if exists harbor._substring_matches(text, harbor.memory_scope[], timestamptz,
                                                  integer);
create or replace function harbor._substring_matches(
    p_query text, p_scopes harbor.memory_scope[], p_as_of timestamptz, p_limit integer,
    p_max_sensitivity harbor.sensitivity default 'sensitive'
) returns table (tenant_id text, memory_id text, scope harbor.memory_scope,
                 memory_type harbor.memory_type, importance real, valid_from timestamptz,
                 content_hash text, entity_ids text[])
    language sql stable security invoker parallel safe
    set search_path to pg_catalog, pg_temp
    set plan_cache_mode to force_generic_plan
as $$
    select m.tenant_id, m.id, m.scope, m.memory_type, m.importance, lower(m.valid),
           m.content_hash, m.entity_ids
      from harbor.memories m
     where m.tenant_id = any (array['', harbor.caller_tenant()])
       and m.scope = any (p_scopes)
       and m.valid operator(pg_catalog.@>) p_as_of
       and m.memory_type <> 'summary'
       and m.sensitivity <= p_max_sensitivity
       and strpos(lower(m.content), lower(btrim(left(p_query, 1000)))) > 0
     limit p_limit
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
    date_weight double precision default 2
) returns table (
    rank integer, id text, tenant_id text, scope text, project_id text, principal_id text,
    user_id text, session_id text, run_id text, memory_type text, content text,
    content_hash text, importance real, entity_ids text[], source text, sensitivity text,
    valid_from timestamptz, invalid_at timestamptz, superseded_by text,
    source_session_id text, source_message_ids text[], metadata jsonb, context text,
    created_at timestamptz, updated_at timestamptz,
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
    -- ---- issue 21, the date signal: the months (capitalised English names) and
    -- the years (19xx, 20xx) the query names, as whole words
    if recall.date_weight > 0 then
        select array_agg(distinct pg_catalog.array_position(array['January', 'February',
                   'March', 'April', 'May', 'June', 'July', 'August', 'September',
                   'October', 'November', 'December'], r.m[1]))
          into v_months
          from pg_catalog.regexp_matches(v_query, '\m(January|February|March|April|May|June'
                   '|July|August|September|October|November|December)\M', 'g') r(m);
        select array_agg(distinct r.m[1]::integer)
          into v_years
          from pg_catalog.regexp_matches(v_query, '\m((?:19|20)[0-9]{2})\M', 'g') r(m);
    end if;
    return query
    with lexical as materialized (
        -- (the score range of the leg's candidates: the weighted fusion's scale)
        select l.*, min(l.lexical_score) over () as score_lo,
               max(l.lexical_score) over () as score_hi
          from harbor._lexical_candidates(v_query, recall.scopes, v_as_of, v_n,
                                          p_max_sensitivity => recall.max_sensitivity) l
         where btrim(v_query) <> ''
    ), dense as (
        -- the lexical leg runs first: its count of the owner's memories spares
        -- the dense leg counting the vectors (when a word matched)
        select d.*, min(d.similarity) over () as sim_lo, max(d.similarity) over () as sim_hi
          from harbor._dense_candidates(recall.query_embedding, recall.model_id, recall.scopes,
                                          v_as_of, v_n,
                                          p_owner_rows => (select x.owner_rows
                                                             from lexical x limit 1),
                                          p_max_sensitivity => recall.max_sensitivity) d
         where recall.min_similarity is null or d.similarity >= recall.min_similarity
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
               case when d.memory_id is null then l.entity_ids else d.entity_ids end as entity_ids
          from dense d full join lexical l
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
               s.scope, s.memory_type, s.importance, s.valid_from, s.content_hash, s.entity_ids
          from harbor._substring_matches(v_query, recall.scopes, v_as_of, v_n,
                                         recall.max_sensitivity) s
         where recall.query_embedding is null
           and btrim(v_query) <> ''
           and not exists (select 1 from fused)
    ), contexts as (
        -- ---- issue 21, neighbour expansion. A memory's context is the text
        -- before it (a conversation's previous turn), stored with the key it
        -- would have as content (memories.context_hash, harbor.context_hash()):
        -- the candidates' keys, read by primary key as the invoker (the probe's
        -- form is the hydration's below, which harbor_pg.db.citus rewrites into
        -- a join for Citus)
        select c.tenant_id, c.memory_id, x.context_hash
          from candidates c
          cross join lateral (
              select m1.* from harbor.memories m1 where m1.id = c.memory_id offset 0) x
         where x.tenant_id = c.tenant_id
           and recall.neighbour_weight > 0 and x.context_hash is not null
    ), linked as (
        -- a candidate follows the candidate whose content hash is its context's
        select c.*, k.context_hash
          from candidates c
          left join contexts k on k.tenant_id = c.tenant_id and k.memory_id = c.memory_id
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
        -- ---- issue 21, the date signal: 1 when the query names a month or a year
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
        -- ---- (end of issue 21's part)
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
                            when 'project' then 3 when 'tenant' then 4 else 5 end as breadth
          from relevant c
    ), final as (
        select s.*,
               s.relevance * (1 + s.recency) * (1 + s.importance) * (1 + s.entity)
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
           b.metadata, b.context, b.created_at, b.updated_at,
           b.dense_rank, b.similarity, b.lexical_rank, b.lexical_score, b.substring_match,
           b.relevance, b.recency, b.entity, b.type_boost, b.score, b.tok, b.neighbour,
           b.date_match
      from budgeted b
     where recall.token_budget is null or b.cumulative <= recall.token_budget
     order by b.pos;
end
$$;

-- The candidate functions run as harbor_search (BYPASSRLS, NOLOGIN). Handing
-- a function to a role needs that role to hold CREATE on the schema for the
-- moment of the transfer only.
grant create on schema harbor to harbor_search;
alter function harbor._dense_candidates(public.vector, text, harbor.memory_scope[], timestamptz,
                                        integer, integer, integer, harbor.sensitivity)
    owner to harbor_search;
alter function harbor._lexical_candidates(text, harbor.memory_scope[], timestamptz, integer,
                                          integer, integer, harbor.sensitivity)
    owner to harbor_search;
revoke create on schema harbor from harbor_search;
