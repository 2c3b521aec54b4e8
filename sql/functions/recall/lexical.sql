-- A candidate leg of harbor.recall() (ranking.sql): SECURITY DEFINER, owned by
-- harbor_search (BYPASSRLS, NOLOGIN), so that the planner may use the index it needs
-- (see ranking.sql); it returns ids, ranks and the ranking's columns of the caller's
-- rows only, tested with the policies' own predicate, harbor._visible().

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
-- a question of more than 16 lexemes, and so does an owner of at most
-- p_term_limit rows: the lookup could not read fewer of them, and its three
-- statements and the ranking of their arrays cost more than one pass over so
-- few rows (a 20-memory owner's leg: server CPU 0.84 -> 0.61 ms).
-- The lookup first counts, in the same index, how many of the owner's rows hold
-- each term. A term in at least 90% of them (a speaker's name, in every turn of
-- a conversation and in its context) weighs almost nothing in BM25 but makes
-- nearly every row a match: when the question holds such a term and others, the
-- leg reads and scores only the rows holding one of the others, with document
-- frequencies from the counts (LoCoMo, paired: the leg's server CPU -34%,
-- recall quality held; docs/decisions.md).
-- Handed the query's vector and model, the leg ranks an owner of at most
-- p_merge_limit rows for both legs in one statement (the first branch below), with
-- the answers the two legs give apart.
-- The owner pass below reads the rows in two LATERAL branches that differ only in
-- `not harbor.lexical_entry_fits(...)` on purpose: one per source (the covering
-- index for the entries that fit it, the table for the rest), as the comment in the
-- body says. Its identity declarations share the shape of
-- every entry point's (erase, _dense_candidates).
do $$
begin
    -- Older versions, dropped first: their signatures grew (by p_term_limit, then
    -- by p_max_sensitivity, the recall ceiling, then by p_excluded_types, then by
    -- p_embedding and p_model_id, with the dense columns, then by p_merge_limit), and
    -- an old overload left in place would make calls ambiguous.
    drop function if exists harbor._lexical_candidates(text, harbor.memory_scope[],
                                                       timestamptz, integer, integer);
    drop function if exists harbor._lexical_candidates(text, harbor.memory_scope[],
                                                       timestamptz, integer, integer, integer);
    drop function if exists harbor._lexical_candidates(text, harbor.memory_scope[],
                                                       timestamptz, integer, integer, integer,
                                                       harbor.sensitivity);
    drop function if exists harbor._lexical_candidates(text, harbor.memory_scope[],
                                                       timestamptz, integer, integer, integer,
                                                       harbor.sensitivity,
                                                       harbor.memory_type[]);
    drop function if exists harbor._lexical_candidates(text, harbor.memory_scope[],
                                                       timestamptz, integer, integer, integer,
                                                       harbor.sensitivity,
                                                       harbor.memory_type[], public.vector,
                                                       text);
end
$$;
create or replace function harbor._lexical_candidates(
    p_query text, p_scopes harbor.memory_scope[], p_as_of timestamptz, p_limit integer,
    p_scan_limit integer default 2000, p_term_limit integer default 32,
    p_max_sensitivity harbor.sensitivity default 'sensitive',
    p_excluded_types harbor.memory_type[] default '{}',
    p_embedding public.vector default null, p_model_id text default null,
    p_merge_limit integer default 128
) returns table (tenant_id text, memory_id text, lexical_rank integer,
                 lexical_score double precision,
                 scope harbor.memory_scope, memory_type harbor.memory_type, importance real,
                 valid_from timestamptz, content_hash text, entity_ids text[],
                 owner_rows integer, context_hash text, dense_rank integer,
                 similarity double precision)
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
    v_contexts text[];  -- the rows' memories.context_hash, beside v_cols
    v_owners  text[];
    v_keys    text[];
    v_hits    integer;
    v_found   boolean := false;  -- the lookup found every match
    v_hidden  text[];            -- the owner's memories above p_max_sensitivity
    v_df      double precision[];  -- the owner's rows holding each of v_terms
    v_rare    text[];              -- the terms of v_terms that carry weight
    v_common  text[];              -- (a large owner) the terms the statistics call common
    v_common_df double precision[];  -- their expected rows
    v_rare_tsq tsquery;              -- (a large owner) the query of the rarer terms
    v_match   text;                  -- (a large owner) the matching statement
    v_match_keys text[];             -- (a large owner) its owner-term keys
    v_dense   boolean := p_embedding is not null and p_model_id is not null;
    v_dims    integer := public.vector_dims(p_embedding);
begin
    if p_query is null or coalesce(p_limit, 0) < 1 then
        return;
    end if;
    -- (the types recall leaves out: never candidates, so they take no place in the
    -- list; BM25's statistics still count them, as rows of the owner's collection)
    p_excluded_types := coalesce(p_excluded_types, '{}');
    v_terms := tsvector_to_array(to_tsvector('english'::regconfig, left(p_query, 20000)));
    if cardinality(v_terms) = 0 and not v_dense then
        return;
    end if;
    if cardinality(v_terms) > 0 then
        v_tsq := harbor.or_tsquery(p_query);
    end if;
    -- how many rows the caller's owner keys hold, of every type and validity (at
    -- most p_scan_limit + 1 counted, from the narrow owner index): BM25's
    -- collection size, and whether the pass below reads them all. One count for
    -- both ways (the lookup's matches, or the pass), taken first: it also bounds
    -- the term counts of the lookup below.
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
    if v_dense and v_seen <= least(p_merge_limit, p_scan_limit) then
        -- ---- an owner of at most p_merge_limit rows, both legs at once. Given the
        -- query's vector and its model (harbor.recall() gives them), the owner's rows
        -- are read once and both legs are ranked over them in this statement, with the
        -- answers the legs give apart (tests/integration/test_small_owner.py holds them
        -- equal, rank for rank and score for score): BM25 as the paths below score it
        -- (the owner pass, or for an owner above p_term_limit whose question holds a
        -- term in 90% of its rows the rows holding a rarer term, with the owner's
        -- counts as document frequencies), the distances as the dense leg's exact scan
        -- measures them (harbor._dense_candidates: a memory's nearer vector counts).
        -- One row a memory that either leg ranks (the other leg's columns null), and
        -- one row whose memory_id is null and dense_rank 0, carrying owner_rows: the
        -- dense leg's candidates are among these rows, recall need not ask it. For an
        -- owner of a few hundred rows most of a recall was fixed cost: the two legs
        -- each looked the caller up, counted its rows and ran statements of their own.
        -- No step joins two of its sets on the memory: a generic plan estimates one
        -- row for each and nests loops over them (a 100-row owner's call took twice
        -- as long); sets meet by UNION ALL and GROUP BY, and the terms' counts are
        -- looked up in arrays.
        return query
            with marked as materialized (
                -- every row of the owner's (of every type and validity: BM25's
                -- collection) with its query terms only (marked with weight A, then
                -- kept, as the owner pass does), whether it matches the query, and
                -- whether either leg may return it
                select o.tenant_id, o.id, o.scope, o.memory_type, o.importance,
                       lower(o.valid) as valid_from, o.content_hash, o.entity_ids,
                       o.context_hash,
                       greatest(pg_catalog.length(o.fts), 1)::double precision as dl,
                       pg_catalog.ts_filter(pg_catalog.setweight(o.fts, 'A', v_terms),
                                            '{a}') as terms,
                       coalesce(o.fts operator(pg_catalog.@@) v_tsq, false) as hit,
                       coalesce(o.valid operator(pg_catalog.@>) p_as_of, false)
                       and not coalesce(o.expires_at operator(pg_catalog.<=) p_as_of, false)
                       and o.memory_type <> 'summary'
                       and o.memory_type <> all (p_excluded_types)
                       and o.sensitivity <= p_max_sensitivity as live
                  from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                           v_session, v_run) k
                  cross join lateral (
                      select m.tenant_id, m.id, m.fts, m.scope, m.memory_type,
                             m.importance, m.valid, m.expires_at, m.sensitivity,
                             m.content_hash, m.entity_ids, m.context_hash
                        from harbor.memories m
                       where m.tenant_id = k.tenant_id and m.scope = k.scope
                         and m.user_id = k.user_id and m.project_id = k.project_id
                         and m.session_id = k.session_id and m.run_id = k.run_id
                      offset 0) o
            ), counted as materialized (
                -- each term's rows: the owner's (the leg's counts in the owner-term
                -- index) and the matches' (the owner pass's document frequency); and
                -- whether the leg apart would read only the rows holding a rarer term:
                -- an owner above p_term_limit rows, whose matches its lookup cannot find
                -- (a term in more than p_term_limit rows, or more matches than that),
                -- asked at most 16 lexemes, with a term in 90% of its rows and another
                -- in fewer (those terms: rarer)
                select array_agg(c.lexeme) as lexemes, array_agg(c.n_all) as n_all,
                       array_agg(c.n_matched) as n_matched,
                       coalesce(array_agg(c.lexeme) filter (where c.n_all < 0.9 * v_seen),
                                '{}') as rarer,
                       coalesce(v_seen > p_term_limit and p_term_limit > 0
                                and cardinality(v_terms) <= 16
                                and (max(c.n_all) > p_term_limit
                                     or (select count(*) from marked m
                                          where m.live and m.hit) > p_term_limit)
                                and bool_or(c.n_all >= 0.9 * v_seen)
                                and bool_or(c.n_all < 0.9 * v_seen), false) as rare
                  from (select u.lexeme, count(*)::double precision as n_all,
                               count(*) filter (where m.live and m.hit)::double precision
                                   as n_matched
                          from marked m
                          cross join lateral pg_catalog.unnest(m.terms) u
                         group by u.lexeme) c
            ), matches as materialized (
                -- the matches the lexical leg ranks (with the rule above, those holding
                -- a rarer term)
                select m.tenant_id, m.id, m.dl, m.terms
                  from marked m cross join counted c
                 where m.live and m.hit
                   and (not c.rare
                        or pg_catalog.tsvector_to_array(m.terms) operator(pg_catalog.&&)
                           c.rarer)
            ), lexical as materialized (
                -- BM25, each match's terms summed in their order in its vector, as the
                -- leg's paths sum them (in another order a sum may differ in its last
                -- bit, and two rows of equal scores would not tie)
                select t.tenant_id, t.id, (rank() over (order by t.score desc))::integer as rnk,
                       t.score
                  from (select d.tenant_id, d.id,
                               (select sum(ln(1 + (greatest(v_seen::double precision, x.df)
                                                   - x.df + 0.5) / (x.df + 0.5))
                                           * x.tf * 2.2
                                           / (x.tf + 1.2 * (0.25 + 0.75 * d.dl / a.v)))
                                  from (select coalesce(cardinality(u.positions), 1)
                                                   ::double precision as tf,
                                               case when c.rare
                                                    then c.n_all[pg_catalog.array_position(
                                                                     c.lexemes, u.lexeme)]
                                                    else c.n_matched[pg_catalog.array_position(
                                                                         c.lexemes, u.lexeme)]
                                               end as df
                                          from pg_catalog.unnest(d.terms) u) x) as score
                          from matches d
                          cross join counted c
                          cross join (select greatest(avg(m.dl), 1) as v from matches m) a
                         order by 3 desc, 2
                         limit p_limit) t
            ), vectors as (
                -- the owner keys' vectors of the model, from the two indexes the dense
                -- leg's exact scan reads
                select e.tenant_id, e.memory_id,
                       e.embedding operator(public.<=>) p_embedding as dist
                  from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                           v_session, v_run) k
                  cross join lateral (
                      select e.tenant_id, e.memory_id, e.embedding
                        from harbor.memory_embeddings e
                       where harbor.vector_owner_key(e.tenant_id, e.model_id,
                                                     e.scope, e.user_id,
                                                     e.project_id, e.session_id,
                                                     e.run_id) collate "C"
                             = harbor.vector_owner_key(k.tenant_id, p_model_id,
                                                       k.scope, k.user_id,
                                                       k.project_id, k.session_id,
                                                       k.run_id) collate "C"
                         and harbor.vector_owner_entry_fits(e.dims, e.tenant_id,
                                                            e.model_id,
                                                            e.project_id,
                                                            e.user_id,
                                                            e.session_id,
                                                            e.run_id, e.memory_id)
                      offset 0) e
                 where v_dims = 384
                union all
                select e.tenant_id, e.memory_id,
                       e.embedding operator(public.<=>) p_embedding
                  from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                           v_session, v_run) k
                  cross join lateral (
                      select e.tenant_id, e.memory_id, e.embedding
                        from harbor.memory_embeddings e
                       where e.tenant_id = k.tenant_id and e.model_id = p_model_id
                         and e.scope = k.scope and e.user_id = k.user_id
                         and e.project_id = k.project_id
                         and e.session_id = k.session_id and e.run_id = k.run_id
                         and not harbor.vector_owner_entry_fits(e.dims, e.tenant_id,
                                                                e.model_id,
                                                                e.project_id,
                                                                e.user_id,
                                                                e.session_id,
                                                                e.run_id,
                                                                e.memory_id)
                         and e.dims = v_dims
                      offset 0) e
            ), dense as materialized (
                -- each memory either leg may return at its nearer vector's distance
                select t.tenant_id, t.memory_id,
                       (rank() over (order by t.dist))::integer as rnk,
                       1 - t.dist as similarity
                  from (select v.tenant_id, v.memory_id, min(v.dist) as dist
                          from (select e.tenant_id, e.memory_id, e.dist, false as live
                                  from vectors e
                                union all
                                select m.tenant_id, m.id, null, true
                                  from marked m where m.live) v
                         group by v.tenant_id, v.memory_id
                        having bool_or(v.live) and min(v.dist) is not null
                         order by 3, 2
                         limit p_limit) t
            )
            select r.tenant_id, r.id, r.lexical_rank, r.lexical_score, r.scope,
                   r.memory_type, r.importance, r.valid_from, r.content_hash, r.entity_ids,
                   v_seen, r.context_hash, r.dense_rank, r.similarity
              from (select u.tenant_id, u.id, max(u.lexical_rank) as lexical_rank,
                           max(u.lexical_score) as lexical_score,
                           max(u.dense_rank) as dense_rank, max(u.similarity) as similarity,
                           any_value(u.scope) as scope, any_value(u.memory_type) as memory_type,
                           any_value(u.importance) as importance,
                           any_value(u.valid_from) as valid_from,
                           any_value(u.content_hash) as content_hash,
                           any_value(u.entity_ids) as entity_ids,
                           any_value(u.context_hash) as context_hash
                      from (select m.tenant_id, m.id, null::integer as lexical_rank,
                                   null::double precision as lexical_score,
                                   null::integer as dense_rank,
                                   null::double precision as similarity, m.scope,
                                   m.memory_type, m.importance, m.valid_from,
                                   m.content_hash, m.entity_ids, m.context_hash
                              from marked m where m.live
                            union all
                            select x.tenant_id, x.id, x.rnk, x.score, null, null, null, null,
                                   null, null, null, null, null
                              from lexical x
                            union all
                            select d.tenant_id, d.memory_id, null, null, d.rnk, d.similarity,
                                   null, null, null, null, null, null, null
                              from dense d) u
                     group by u.tenant_id, u.id
                    having max(u.lexical_rank) is not null or max(u.dense_rank) is not null) r
            union all
            select null, null, null, null, null, null, null, null, null, null, v_seen, null,
                   0, null;
        return;
    end if;
    if cardinality(v_terms) = 0 then
        -- no word to match (a question of stop words, or none: recall asks with the
        -- vector alone): the dense leg's turn, handed the count taken above (one row
        -- whose memory_id and dense_rank are null) so that it need not count the
        -- vectors
        if v_dense and v_seen <= p_scan_limit then
            return query
                select null::text, null::text, null::integer, null::double precision,
                       null::harbor.memory_scope, null::harbor.memory_type, null::real,
                       null::timestamptz, null::text, null::text[], v_seen, null::text,
                       null::integer, null::double precision;
        end if;
        return;
    end if;
    -- the caller's owner keys (harbor.vector_owner_key() with no model, as the
    -- owner-term index files them)
    select array_agg(harbor.vector_owner_key(k.tenant_id, '', k.scope, k.user_id,
                                             k.project_id, k.session_id, k.run_id))
      into v_owners
      from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user, v_session, v_run) k;
    -- (not for a question of more than 16 lexemes: one key each, and such a
    -- question mostly matches more rows than the limit anyway; at 1,000,000
    -- memories the lookup cost a 200-word question 1.6 ms before falling back;
    -- nor for an owner of at most p_term_limit rows, read whole by the pass below)
    if p_term_limit > 0 and cardinality(v_terms) <= 16
       and (v_seen > p_term_limit or v_seen > p_scan_limit) then
        -- under each owner key, one key per lexeme of the query
        select array_agg(harbor.owner_term_prefix(o.key) || l.lexeme)
          into v_keys
          from pg_catalog.unnest(v_owners) o(key),
               pg_catalog.unnest(harbor.or_tsquery_lexemes(v_terms)) l(lexeme);
        if v_keys is null then
            return;  -- no owner key, or no lexeme the query could match
        end if;
        -- how many of the owner's rows hold each term (every type and validity, as
        -- the collection size above), counted in the owner-term index; the owner
        -- key is tested column by column (cheaper than building it for each row).
        -- An owner above p_scan_limit is not scored from these counts, only asked
        -- whether every term is in at most p_term_limit rows (the lookup below), so
        -- there the count stops at (p_term_limit + 1) rows a term in all: if every
        -- term is in at most p_term_limit rows, all are counted; if not, the count
        -- reaches a term above that before it stops (at 100,000 memories of one
        -- owner, counting up to the scan limit for each term was a third of the
        -- leg's time)
        select array_agg(coalesce(c.n, 0) order by l.i)
          into v_df
          from pg_catalog.unnest(v_terms) with ordinality l(term, i)
          left join (
              select x.term, count(*)::double precision as n
                from (select t.term
                        from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                 v_session, v_run) k
                        cross join pg_catalog.unnest(v_terms) t(term)
                        cross join lateral (
                            select 1
                              from harbor.memories m
                             where harbor.memory_owner_terms(m.tenant_id, m.scope, m.user_id,
                                                             m.project_id, m.session_id,
                                                             m.run_id, m.fts)
                                   operator(pg_catalog.&&)
                                   array[harbor.owner_term_prefix(harbor.vector_owner_key(
                                             k.tenant_id, '', k.scope, k.user_id,
                                             k.project_id, k.session_id, k.run_id))
                                         || t.term]
                               -- (in coalesce(): a filter, never the owner index,
                               -- which would have the terms computed for each row)
                               and coalesce(m.tenant_id = k.tenant_id and m.scope = k.scope
                                            and m.user_id = k.user_id
                                            and m.project_id = k.project_id
                                            and m.session_id = k.session_id
                                            and m.run_id = k.run_id, false)
                            offset 0) m
                       -- (below p_scan_limit every term is counted; above it, the
                       -- count stops after p_term_limit + 1 rows a term: a term
                       -- counted short is then one whose count already exceeds
                       -- p_term_limit, or one after it)
                       limit (case when v_seen > p_scan_limit then p_term_limit
                                   else p_scan_limit end + 1)
                             * cardinality(v_terms)) x
               group by x.term) c on c.term = l.term;
    end if;
    -- (a term in more rows than the lookup reads: it cannot find them all)
    if v_keys is not null
       and coalesce((select max(d.n) from pg_catalog.unnest(v_df) d(n)), 0) <= p_term_limit then
        -- the rows indexed under those keys: a row matches the query only if its
        -- text holds one of the query's lexemes, so these are all the candidates
        -- (the owner key and the text are tested on each; the index is the only
        -- one the conditions can use)
        select count(*),
               array_agg(o.tenant_id), array_agg(o.id), array_agg(o.fts),
               array_agg(row(o.scope, o.memory_type, o.importance, lower(o.valid),
                             o.content_hash, o.entity_ids)::harbor._ranking_columns),
               array_agg(o.context_hash)
          into v_hits, v_tenants, v_ids, v_docs, v_cols, v_contexts
          from (select m.tenant_id, m.id, m.fts, m.scope, m.memory_type, m.importance,
                       m.valid, m.content_hash, m.entity_ids, m.context_hash
                  from harbor.memories m
                 where harbor.memory_owner_terms(m.tenant_id, m.scope, m.user_id, m.project_id,
                                                 m.session_id, m.run_id, m.fts)
                       operator(pg_catalog.&&) v_keys
                   and harbor.vector_owner_key(m.tenant_id, '', m.scope, m.user_id,
                                               m.project_id, m.session_id, m.run_id)
                       operator(pg_catalog.=) any (v_owners)
                   and coalesce(m.fts operator(pg_catalog.@@) v_tsq, false)
                   and coalesce(m.valid operator(pg_catalog.@>) p_as_of, false)
                   and not coalesce(m.expires_at operator(pg_catalog.<=) p_as_of, false)
                   and m.memory_type <> 'summary'
                   and m.memory_type <> all (p_excluded_types)
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
    if not v_found and v_df is not null and v_seen <= p_scan_limit
       and v_seen > p_term_limit then
        -- the terms in fewer than 90% of the owner's rows. A term in nearly every
        -- row (LoCoMo: the speakers' names, in every turn and its context) weighs
        -- almost nothing in BM25 (ln(1 + 0.1 / 0.9) = 0.1 at 90%, against 4.6 for
        -- a term in 1% of them), yet makes every row a match to be scored. When
        -- the query holds such a term and others, only the rows holding one of the
        -- others are read and scored (every term of the query counts in their
        -- score), from the owner-term index; document frequencies are the counts
        -- above, not the matches'. Rows holding only the common terms are not
        -- candidates.
        select array_agg(t.term)
          into v_rare
          from unnest(v_terms, v_df) t(term, n)
         where t.n > 0 and t.n < 0.9 * v_seen;
        if cardinality(v_rare) > 0
           and exists (select 1 from pg_catalog.unnest(v_df) d(n) where d.n >= 0.9 * v_seen)
        then
            -- (every owner key's: a row is read under its own, tested column by column)
            select array_agg(harbor.owner_term_prefix(o.key) || t.term)
              into v_keys
              from pg_catalog.unnest(v_owners) o(key), pg_catalog.unnest(v_rare) t(term);
            return query
                with docs as materialized (
                    select m.tenant_id, m.id,
                           greatest(pg_catalog.length(m.fts), 1)::double precision as dl,
                           pg_catalog.ts_filter(pg_catalog.setweight(m.fts, 'A', v_terms),
                                                '{a}') as terms,
                           m.scope, m.memory_type, m.importance, lower(m.valid) as valid_from,
                           m.content_hash, m.entity_ids, m.context_hash
                      from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                               v_session, v_run) k
                      cross join lateral (
                          select m.*
                            from harbor.memories m
                           where harbor.memory_owner_terms(m.tenant_id, m.scope, m.user_id,
                                                           m.project_id, m.session_id,
                                                           m.run_id, m.fts)
                                 operator(pg_catalog.&&) v_keys
                             and coalesce(m.tenant_id = k.tenant_id and m.scope = k.scope
                                          and m.user_id = k.user_id
                                          and m.project_id = k.project_id
                                          and m.session_id = k.session_id
                                          and m.run_id = k.run_id, false)
                          offset 0) m
                     where coalesce(m.fts operator(pg_catalog.@@) v_tsq, false)
                       and coalesce(m.valid operator(pg_catalog.@>) p_as_of, false)
                       and not coalesce(m.expires_at operator(pg_catalog.<=) p_as_of, false)
                       and m.memory_type <> 'summary'
                       and m.memory_type <> all (p_excluded_types)
                       and m.sensitivity <= p_max_sensitivity
                       and harbor._visible(m.scope, m.tenant_id, m.project_id, m.user_id,
                                           m.session_id, m.run_id, v_tenant, v_project,
                                           v_user, v_session, v_run)
                ), postings as materialized (
                    select x.tenant_id, x.id, x.dl, (x.u).lexeme as lexeme,
                           coalesce(cardinality((x.u).positions), 1)::double precision as tf,
                           x.scope, x.memory_type, x.importance, x.valid_from,
                           x.content_hash, x.entity_ids, x.context_hash
                      from (select d.tenant_id, d.id, d.dl, pg_catalog.unnest(d.terms) as u,
                                   d.scope, d.memory_type, d.importance, d.valid_from,
                                   d.content_hash, d.entity_ids, d.context_hash
                              from docs d) x
                ), avgdl as (
                    select greatest(avg(d.dl), 1) as v from docs d
                ), scored as (
                    select p.tenant_id, p.id,
                           sum(ln(1 + (greatest(v_seen::double precision, df.n) - df.n + 0.5)
                                      / (df.n + 0.5))
                               * p.tf * 2.2 / (p.tf + 1.2 * (0.25 + 0.75 * p.dl / a.v)))
                               as score,
                           any_value(p.scope) as scope,
                           any_value(p.memory_type) as memory_type,
                           any_value(p.importance) as importance,
                           any_value(p.valid_from) as valid_from,
                           any_value(p.content_hash) as content_hash,
                           any_value(p.entity_ids) as entity_ids,
                           any_value(p.context_hash) as context_hash
                      from postings p
                      join unnest(v_terms, v_df) df(lexeme, n) on df.lexeme = p.lexeme
                      cross join avgdl a
                     group by p.tenant_id, p.id
                ), top as (
                    select s.*
                      from scored s
                     order by s.score desc, s.id
                     limit p_limit
                )
                select t.tenant_id, t.id, (rank() over (order by t.score desc))::integer,
                       t.score, t.scope, t.memory_type, t.importance, t.valid_from,
                       t.content_hash, t.entity_ids, v_seen, t.context_hash,
                       null::integer, null::double precision
                  from top t;
            return;
        end if;
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
                           m.content_hash, m.entity_ids, m.context_hash
                      from (-- the owner's rows from the index that carries what is read here
                        -- (side by side, without visiting the table), then those whose
                        -- entry would not fit that index
                        -- (per owner key, a LATERAL subquery kept whole by OFFSET 0:
                        -- an index range scan under each key, never a merge join
                        -- that a generic plan may pick, which reads the index from
                        -- its start, every other owner's rows before the caller's)
                        select m.tenant_id, m.id, m.fts, m.scope, m.memory_type, m.importance,
                               m.valid, m.content_hash, m.entity_ids, m.project_id, m.user_id,
                               m.session_id, m.run_id, m.context_hash, m.expires_at
                          from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                   v_session, v_run) k
                          cross join lateral (
                              select m.tenant_id, m.id, m.fts, m.scope, m.memory_type,
                                     m.importance, m.valid, m.content_hash, m.entity_ids,
                                     m.project_id, m.user_id, m.session_id, m.run_id,
                                     m.context_hash, m.expires_at
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
                               m.session_id, m.run_id, m.context_hash, m.expires_at
                          from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                   v_session, v_run) k
                          cross join lateral (
                              select m.tenant_id, m.id, m.fts, m.scope, m.memory_type,
                                     m.importance, m.valid, m.content_hash, m.entity_ids,
                                     m.project_id, m.user_id, m.session_id, m.run_id,
                                     m.context_hash, m.expires_at
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
                       and not coalesce(m.expires_at operator(pg_catalog.<=) p_as_of, false)
                       and m.memory_type <> 'summary'
                       and m.memory_type <> all (p_excluded_types)
                       and (v_hidden is null or m.id <> all (v_hidden))
                       and harbor._visible(m.scope, m.tenant_id, m.project_id, m.user_id,
                                           m.session_id, m.run_id, v_tenant, v_project,
                                           v_user, v_session, v_run)
                ), postings as materialized (
                    -- (the set-returning function in the select list: one call per
                    -- document without a result store of its own. Each document's
                    -- ranking columns ride along to the scores, any_value() keeping
                    -- them: joined back to the documents after the ranking, the top
                    -- rows were a nested loop over every match, each estimated one
                    -- row, 50 x 500 comparisons for a LoCoMo conversation)
                    select x.tenant_id, x.id, x.dl, (x.u).lexeme as lexeme,
                           coalesce(cardinality((x.u).positions), 1)::double precision as tf,
                           x.scope, x.memory_type, x.importance, x.valid_from,
                           x.content_hash, x.entity_ids, x.context_hash
                      from (select d.tenant_id, d.id, d.dl, pg_catalog.unnest(d.terms) as u,
                                   d.scope, d.memory_type, d.importance, d.valid_from,
                                   d.content_hash, d.entity_ids, d.context_hash
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
                               as score,
                           any_value(p.scope) as scope,
                           any_value(p.memory_type) as memory_type,
                           any_value(p.importance) as importance,
                           any_value(p.valid_from) as valid_from,
                           any_value(p.content_hash) as content_hash,
                           any_value(p.entity_ids) as entity_ids,
                           any_value(p.context_hash) as context_hash
                      from postings p join df on df.lexeme = p.lexeme cross join avgdl a
                     group by p.tenant_id, p.id
                ), top as (
                    -- the first p_limit; their ranks among all matches are their
                    -- ranks among these (a rank counts the higher scores only)
                    select s.*
                      from scored s
                     order by s.score desc, s.id
                     limit p_limit
                )
                select t.tenant_id, t.id, (rank() over (order by t.score desc))::integer,
                       t.score, t.scope, t.memory_type, t.importance, t.valid_from,
                       t.content_hash, t.entity_ids, v_seen, t.context_hash,
                       null::integer, null::double precision
                  from top t;
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
                   case when v_seen <= p_scan_limit then v_seen end, h.context_hash,
                   null::integer, null::double precision
              from harbor._bm25(v_terms, v_total, p_limit, v_tenants, v_ids, v_docs) b
              join unnest(v_tenants, v_ids, v_cols, v_contexts)
                   h(tenant_id, id, scope, memory_type, importance, valid_from, content_hash,
                     entity_ids, context_hash)
                on h.tenant_id = b.tenant_id and h.id = b.memory_id;
        return;
    end if;
    -- a large owner whose matches the lookup did not find. On conversation text most of
    -- its rows hold a common word of the question, and matching and scoring them all is
    -- linear in the owner's rows (287 ms a call at 100,000, benchmarks/RESULTS.md
    -- recall-scaling). So the table's own statistics of its lexemes (pg_stats, which
    -- ANALYZE keeps for memories.fts: the most common lexemes and the share of rows
    -- holding each) split the question's terms: a term the statistics expect in more
    -- rows than p_scan_limit is common. When the question has both kinds, only the rows
    -- holding a rarer term are matched (the GIN index), every term still counts in their
    -- score, and a common term's document frequency is its expected row count (its
    -- share times the collection size) where the matches hold fewer. Without statistics
    -- (not analysed yet; a Citus coordinator), without both kinds, or with fewer rows
    -- holding a rarer term than p_limit, every term matches.
    select array_agg(t.term order by t.i) filter (where coalesce(f.freq, 0) * v_total
                                                       <= p_scan_limit),
           array_agg(t.term order by t.i) filter (where f.freq * v_total > p_scan_limit),
           array_agg(f.freq * v_total order by t.i) filter (where f.freq * v_total
                                                                  > p_scan_limit)
      into v_rare, v_common, v_common_df
      from pg_catalog.unnest(v_terms) with ordinality t(term, i)
      left join (
          select e.elem, e.freq::double precision as freq
            from pg_catalog.pg_stats st
           -- (the multi-array form of unnest, only unqualified)
           cross join lateral unnest(
                   st.most_common_elems::text::text[],
                   st.most_common_elem_freqs[1:pg_catalog.cardinality(
                       st.most_common_elems::text::text[])]) e(elem, freq)
           where st.schemaname = 'harbor' and st.tablename = 'memories'
             and st.attname = 'fts') f on f.elem = t.term;
    -- the caller's matches of the query $1 (the rarer terms', or every term's), one
    -- statement text for the count below and the ranking: their parameters are the same.
    -- They are found in the owner-term index under the caller's owner keys ($16: those
    -- terms' keys), so the read is the owner's rows holding a term, whatever the rest of
    -- the table holds (the text index would find every tenant's rows holding it, to be
    -- filtered by owner after); the text and the owner are tested on each row
    v_match := $m$
        select m.tenant_id, m.id, m.fts, m.scope, m.memory_type, m.importance,
               lower(m.valid) as valid_from, m.content_hash, m.entity_ids, m.context_hash
          from harbor.memories m
         where coalesce(m.fts operator(pg_catalog.@@) $1, false)
           and m.tenant_id = any (array['', $2])
           and harbor.memory_owner_terms(m.tenant_id, m.scope, m.user_id, m.project_id,
                                         m.session_id, m.run_id, m.fts)
               operator(pg_catalog.&&) $16
           and m.scope = any ($3)
           and coalesce(m.valid operator(pg_catalog.@>) $4, false)
           and not coalesce(m.expires_at operator(pg_catalog.<=) $4, false)
           and m.memory_type <> 'summary'
           and m.memory_type <> all ($15)
           and m.sensitivity <= $12
           and harbor._visible(m.scope, m.tenant_id, m.project_id, m.user_id,
                               m.session_id, m.run_id, $2, $5, $6, $7, $8) $m$;
    if cardinality(v_rare) > 0 and cardinality(v_common) > 0 then
        v_rare_tsq := (select pg_catalog.to_tsquery('simple'::regconfig, pg_catalog.string_agg(
                                  pg_catalog.quote_literal(pg_catalog.replace(r.lexeme, '\', '')),
                                  ' | '))
                         from pg_catalog.unnest(v_rare) r(lexeme));
        select array_agg(harbor.owner_term_prefix(o.key) || l.lexeme)
          into v_match_keys
          from pg_catalog.unnest(v_owners) o(key),
               pg_catalog.unnest(harbor.or_tsquery_lexemes(v_rare)) l(lexeme);
        -- (fewer rows holding a rarer term than the leg hands over: every term matches,
        -- so that the rows holding only common ones still fill the list)
        execute 'select count(*)::integer from (' || v_match || ' limit $11) x'
          into v_hits
          using v_rare_tsq, v_tenant, p_scopes, p_as_of, v_project, v_user, v_session, v_run,
                v_terms, v_total, p_limit, p_max_sensitivity, v_common, v_common_df,
                p_excluded_types, v_match_keys;
        if v_hits < p_limit then
            v_rare_tsq := null;
            v_common := null;
            v_common_df := null;
        end if;
    else
        v_common := null;
        v_common_df := null;
    end if;
    if v_rare_tsq is null then
        select array_agg(harbor.owner_term_prefix(o.key) || l.lexeme)
          into v_match_keys
          from pg_catalog.unnest(v_owners) o(key),
               pg_catalog.unnest(harbor.or_tsquery_lexemes(v_terms)) l(lexeme);
    end if;
    -- the owner-term index, planned for this query's words (EXECUTE plans once per
    -- call; a cached generic plan cannot judge their rarity)
    return query execute 'with matched as materialized (' || v_match || $q$)
        select b.tenant_id, b.memory_id, b.lexical_rank, b.lexical_score, x.scope,
               x.memory_type, x.importance, x.valid_from, x.content_hash, x.entity_ids,
               null::integer, x.context_hash, null::integer, null::double precision
          from harbor._bm25($9, $10, $11,
                            (select array_agg(x.tenant_id) from matched x),
                            (select array_agg(x.id) from matched x),
                            (select array_agg(x.fts) from matched x), $13, $14) b
          join matched x on x.tenant_id = b.tenant_id and x.id = b.memory_id $q$
        using coalesce(v_rare_tsq, v_tsq), v_tenant, p_scopes, p_as_of, v_project, v_user,
              v_session, v_run, v_terms, v_total, p_limit, p_max_sensitivity, v_common,
              v_common_df, p_excluded_types, v_match_keys;
end
$$;

-- BM25 over a matched set (parallel arrays), the top p_limit by score.
-- Equal scores share a rank (as equal distances do in the dense leg), so two
-- copies of one text fuse to the same relevance and the scope decides.
-- Document frequencies come from the matched rows, or for p_known_terms from
-- p_known_df where that is more (a common term the matches were not selected by,
-- with its expected rows); the collection size from the caller (its visible row
-- count), the average length from the matches.
-- (the signature without the known frequencies: an overload left in place would make
-- calls ambiguous)
drop function if exists harbor._bm25(text[], double precision, integer, text[], text[],
                                     tsvector[]);
create or replace function harbor._bm25(
    p_terms text[], p_total double precision, p_limit integer,
    p_tenants text[], p_ids text[], p_docs tsvector[],
    p_known_terms text[] default null, p_known_df double precision[] default null
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
        select p.lexeme, greatest(count(*)::double precision, max(k.n)) as n
          from postings p
          left join unnest(p_known_terms, p_known_df) k(lexeme, n) on k.lexeme = p.lexeme
         group by p.lexeme
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

-- The lexical leg runs as harbor_search (BYPASSRLS, NOLOGIN). Handing
-- a function to a role needs that role to hold CREATE on the schema for the
-- moment of the transfer only.
grant create on schema harbor to harbor_search;
alter function harbor._lexical_candidates(text, harbor.memory_scope[], timestamptz, integer,
                                          integer, integer, harbor.sensitivity,
                                          harbor.memory_type[], public.vector, text, integer)
    owner to harbor_search;
revoke create on schema harbor from harbor_search;
