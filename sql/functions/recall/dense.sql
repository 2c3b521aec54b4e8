-- A candidate leg of harbor.recall() (ranking.sql): SECURITY DEFINER, owned by
-- harbor_search (BYPASSRLS, NOLOGIN), so that the planner may use the index it needs
-- (see ranking.sql); it returns ids, ranks and the ranking's columns of the caller's
-- rows only, tested with the policies' own predicate, harbor._visible().

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
    -- Older versions, dropped first: their signatures grew (by p_owner_rows, then
    -- by p_max_sensitivity, the recall ceiling, then by p_excluded_types), and an old
    -- overload left in place would make calls ambiguous.
    drop function if exists harbor._dense_candidates(public.vector, text,
                                                     harbor.memory_scope[], timestamptz,
                                                     integer, integer);
    drop function if exists harbor._dense_candidates(public.vector, text,
                                                     harbor.memory_scope[], timestamptz,
                                                     integer, integer, integer);
    drop function if exists harbor._dense_candidates(public.vector, text,
                                                     harbor.memory_scope[], timestamptz,
                                                     integer, integer, integer,
                                                     harbor.sensitivity);
end
$$;
create or replace function harbor._dense_candidates(
    p_embedding public.vector, p_model_id text, p_scopes harbor.memory_scope[],
    p_as_of timestamptz, p_limit integer, p_exact_limit integer default 5000,
    p_owner_rows integer default null,
    p_max_sensitivity harbor.sensitivity default 'sensitive',
    p_excluded_types harbor.memory_type[] default '{}'
) returns table (tenant_id text, memory_id text, dense_rank integer, similarity double precision,
                 scope harbor.memory_scope, memory_type harbor.memory_type, importance real,
                 valid_from timestamptz, content_hash text, entity_ids text[],
                 context_hash text)
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
    v_outside boolean;
begin
    if p_embedding is null or p_model_id is null or coalesce(p_limit, 0) < 1 then
        return;
    end if;
    -- (the types recall leaves out: never candidates, so they take no place in the list)
    p_excluded_types := coalesce(p_excluded_types, '{}');
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
        -- bounded sort), then the window's memories by primary key, nearest
        -- first, until p_limit valid ones are found: never the other way round,
        -- which a generic plan would otherwise pick, re-reading the owner's
        -- vectors per memory. A memory with a context has two vectors and the
        -- nearer counts: the window holds a memory's nearer vector whenever it
        -- holds its other one, so each memory of the window is looked up once,
        -- at that distance (one lookup a vector read a contextual memory
        -- twice: LoCoMo, 100 lookups for 76 memories). When the window holds
        -- fewer valid memories than p_limit (superseded memories crowd it) and
        -- not every vector of the caller (it is full), the statement returns
        -- nothing and runs again over all of them (v_window null: no limit).
        -- Both reads are LATERAL subqueries (as the count above), so that whatever the
        -- statistics say they are an index range scan per owner key (its nearest v_window
        -- vectors, a bounded sort each, merged) and a primary-key lookup per vector. The
        -- generic plan is built at a connection's first call and kept until the statistics
        -- change; with plain joins, a store asked right after it was written (no ANALYZE
        -- yet) got one that hashed every owner's vectors (LoCoMo, five owners: 20 ms where
        -- the owner's own take 1.5 ms; recall's dense p50 8.9 -> 3.2 ms on a fresh server,
        -- the same once analysed), and an analysed one read every owner's vectors outside
        -- the covering index; with the vectors read per owner key the window is estimated
        -- larger, and a plain join to the memories then scanned the whole table.
        v_window := 2 * p_limit + 64;
        loop
            return query
                with win as materialized (
                    select w.tenant_id, w.memory_id, w.with_context, w.dist
                      from (-- 384-dimension vectors from the index that holds them (an
                            -- owner's side by side), without visiting the table
                            -- (one key column: the owner fields encoded, compared
                            -- byte for byte)
                            select e.tenant_id, e.memory_id, e.with_context, e.dist
                              from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                       v_session, v_run) k
                              cross join lateral (
                                  select e.tenant_id, e.memory_id, e.with_context,
                                         e.embedding operator(public.<=>) p_embedding as dist
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
                                   order by dist, e.memory_id
                                   limit v_window) e
                             where v_dims = 384
                            union all
                            -- every other vector of this dimension (an index range scan
                            -- per owner key as well: as a plain join, in a table where one
                            -- owner holds most vectors, the generic plan hashed the keys
                            -- against a parallel scan of this index, and starting its
                            -- workers cost a 100-memory owner's recall 14 ms)
                            select e.tenant_id, e.memory_id, e.with_context,
                                   e.embedding operator(public.<=>) p_embedding
                              from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user,
                                                       v_session, v_run) k
                              cross join lateral (
                                  select e.tenant_id, e.memory_id, e.with_context, e.embedding
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
                                  offset 0) e) w
                     order by w.dist, w.memory_id
                     limit v_window
                ), nearest as materialized (
                    -- each memory of the window once, at its nearer vector's distance
                    -- (whenever a memory's farther vector is in the window, so is its
                    -- nearer one), nearest first
                    select win.tenant_id, win.memory_id, min(win.dist) as dist
                      from win
                     group by win.tenant_id, win.memory_id
                     order by dist, win.memory_id
                ), near as materialized (
                    select n.tenant_id, n.memory_id, n.dist, m.scope, m.memory_type,
                           m.importance, m.valid_from, m.content_hash, m.entity_ids,
                           m.context_hash
                      from nearest n
                      -- only the primary key may find the row (one lookup per
                      -- memory, nearest first, until p_limit are found, whatever
                      -- the estimates)
                      cross join lateral (
                          select m.scope, m.memory_type, m.importance,
                                 lower(m.valid) as valid_from, m.content_hash, m.entity_ids,
                                 m.context_hash
                            from harbor.memories m
                           where m.tenant_id = n.tenant_id and m.id = n.memory_id
                             and coalesce(m.valid operator(pg_catalog.@>) p_as_of, false)
                             and not coalesce(m.expires_at operator(pg_catalog.<=) p_as_of, false)
                             -- the memory's own owner, not only its vector's copy (a
                             -- trigger keeps them equal; this does not rely on it), in
                             -- coalesce() as the tests above, so it is no index condition
                             and coalesce(harbor._visible(m.scope, m.tenant_id, m.project_id,
                                                          m.user_id, m.session_id, m.run_id,
                                                          v_tenant, v_project, v_user,
                                                          v_session, v_run), false)
                             and m.memory_type <> 'summary'
                             and m.memory_type <> all (p_excluded_types)
                             and m.sensitivity <= p_max_sensitivity
                             and coalesce(m.scope = any (p_scopes), false)
                          offset 0) m
                     order by n.dist, n.memory_id
                     limit p_limit
                )
                select c.tenant_id, c.memory_id, (rank() over (order by c.dist))::integer,
                       1 - c.dist, c.scope, c.memory_type, c.importance, c.valid_from,
                       c.content_hash, c.entity_ids, c.context_hash
                  from (select w.*
                          from near w
                         -- every vector was in the window, or it held enough valid memories
                         where v_window is null
                            or (select count(*) from win) < v_window
                            or (select count(*) from near) >= p_limit
                         order by w.dist, w.memory_id
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
    -- Whether any key has rows outside the graph is asked first, and the exact branch
    -- runs only then ($13, a constant of the statement's plan): tested in the branch
    -- alone, the estimates of a key just written (one row, where there are 100,000)
    -- put that test after the join of all of its vectors to their memories (a
    -- 100,000-memory owner's recall: 520 ms, where the graph walk took 6).
    select exists (select 1
                     from harbor._recall_keys(p_scopes, v_tenant, v_project, v_user, v_session,
                                              v_run) k
                     join harbor.memory_embeddings l
                       on l.tenant_id = k.tenant_id and l.model_id = p_model_id
                      and l.scope = k.scope and l.user_id = k.user_id
                      and l.project_id = k.project_id and l.session_id = k.session_id
                      and l.run_id = k.run_id
                    where not l.in_graph)
      into v_outside;
    return query execute pg_catalog.format($q$
        select c.tenant_id, c.memory_id,
               (rank() over (order by c.dist))::integer, 1 - c.dist,
               c.scope, c.memory_type, c.importance, c.valid_from, c.content_hash, c.entity_ids,
               c.context_hash
          from (select w.tenant_id, w.memory_id, min(w.dist) as dist,
                       any_value(w.scope) as scope, any_value(w.memory_type) as memory_type,
                       any_value(w.importance) as importance,
                       any_value(w.valid_from) as valid_from,
                       any_value(w.content_hash) as content_hash,
                       any_value(w.entity_ids) as entity_ids,
                       any_value(w.context_hash) as context_hash
                  from ((select e.tenant_id, e.memory_id, m.scope, m.memory_type,
                                m.importance,
                               lower(m.valid) as valid_from, m.content_hash, m.entity_ids,
                               m.context_hash,
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
                           and not coalesce(m.expires_at operator(pg_catalog.<=) $4, false)
                           and m.memory_type <> 'summary'
                           and m.memory_type <> all ($12)
                           and m.sensitivity <= $11
                           and e.in_graph
                         order by (e.embedding::public.vector(%1$s)) operator(public.<=>)
                                  ($1::public.vector(%1$s))
                         limit 2 * $10)
                union all
                -- the caller's owner keys outside the graph, exactly
                (select e.tenant_id, e.memory_id, m.scope, m.memory_type, m.importance,
                        lower(m.valid) as valid_from, m.content_hash, m.entity_ids,
                        m.context_hash, e.embedding operator(public.<=>) $1 as dist
                   from harbor._recall_keys($3, $5, $6, $7, $8, $9) k
                   join harbor.memory_embeddings e
                     on k.tenant_id = e.tenant_id and e.model_id = $2 and e.scope = k.scope
                    and e.user_id = k.user_id and e.project_id = k.project_id
                    and e.session_id = k.session_id and e.run_id = k.run_id
                    and e.tenant_id = any (case when 'global' = any ($3) then array['', $5]
                                                else array[$5] end)
                   join harbor.memories m
                     on m.tenant_id = e.tenant_id and m.id = e.memory_id
                  where $13 and e.dims = %1$s
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
                    and not coalesce(m.expires_at operator(pg_catalog.<=) $4, false)
                    and m.memory_type <> 'summary'
                    and m.memory_type <> all ($12)
                    and m.sensitivity <= $11
                  order by e.embedding operator(public.<=>) $1
                  limit 2 * $10)) w
                 group by w.tenant_id, w.memory_id
                 order by dist, w.memory_id
                 limit $10) c $q$, v_dims)
        using p_embedding, p_model_id, p_scopes, p_as_of, v_tenant, v_project, v_user,
              v_session, v_run, p_limit, p_max_sensitivity, p_excluded_types, v_outside;
    perform set_config('hnsw.iterative_scan', coalesce(v_scan, 'off'), true),
            set_config('hnsw.ef_search', coalesce(v_ef, '40'), true),
            set_config('hnsw.max_scan_tuples', coalesce(v_tuples, '20000'), true),
            set_config('enable_sort', v_sort, true),
            set_config('enable_seqscan', v_seqscan, true);
end
$$;

-- The dense leg runs as harbor_search (BYPASSRLS, NOLOGIN). Handing
-- a function to a role needs that role to hold CREATE on the schema for the
-- moment of the transfer only.
grant create on schema harbor to harbor_search;
alter function harbor._dense_candidates(public.vector, text, harbor.memory_scope[], timestamptz,
                                        integer, integer, integer, harbor.sensitivity,
                                        harbor.memory_type[])
    owner to harbor_search;
revoke create on schema harbor from harbor_search;
