-- Consolidation: near-duplicate memories merged into one, add-only.

-- harbor.consolidate_memories() is SECURITY INVOKER: it reads and writes under the
-- row-level security policies, as the caller, only the caller's own owner keys
-- narrowed to each requested scope (user, project, session, run: the scopes a caller
-- writes; harbor._owner_memories(), as harbor.profile()).
--
-- Candidates: the current memories of those keys (valid now, not superseded, never
-- rolling summaries, valid from before this transaction), each with its rank among
-- the memories of its owner key and writer (principal_id): most important first, then
-- the newest, then the id. Two candidates of one owner key and one writer match when
--   text     their contents are the same once lower-cased, with every run of
--            characters other than letters and digits made one space, or
--   vector   min_similarity is given and their content vectors of model_id (the
--            vector of the content alone, not the one with its context) are at least
--            that similar (cosine); with since, only pairs of which one memory was
--            stored (created_at) at or after since are compared: a run every so often
--            passes the start of the last, and compares the new memories with all
--            instead of all with all (the comparison is quadratic in an owner key).
-- Memories of different writers are never merged (erasing one writer's memories then
-- never takes, or leaves behind, another's), and only the caller's own writes are
-- candidates (principal_id: a successor is stored as its writer's, which the row
-- policies let only the writer do; another writer's copies in the same owner key are
-- that writer's to merge).
--
-- Groups: a candidate that matches no better-ranked candidate heads a group; every
-- other candidate joins the best-ranked head it matches (one that matches no head,
-- only members of groups, waits for a later run). So each group is its head and
-- memories that match the head itself, never a chain of resemblances.
--
-- Merging a group (at most max_merges groups, best-ranked heads first), in this
-- transaction: the members still current are locked (all groups' rows in one
-- statement, in id order, so that two consolidations never wait on each other in a
-- circle), their validity closed at now() and a successor inserted, valid from now():
-- the head's content, context, type, scope and writer; the highest importance and
-- sensitivity of the group; the union of its entity ids and of its source turns
-- (source_message_ids), the head's source session; the head's metadata plus
-- "consolidated_from", the ids merged. Each member's superseded_by is the successor,
-- and the head's vectors (of every model) are copied to it. Nothing is deleted: as of
-- any moment before now the members are what they were. A group of which fewer than
-- two members are still current (a concurrent consolidation or supersession closed
-- them first) is left alone.
--
-- merged, when given, holds a text written for a group (by a language model, from a dry
-- run's groups), keyed by its head's id: {"content", "content_hash" (the content's dedup
-- key, harbor_pg.records.content_hash), "embedding" (its vector of model_id, optional)}.
-- The successor of that group then has that text, no context, that vector (in the HNSW
-- graph when the head's vectors are) and "written_by_model": true in its metadata; a
-- text that is already the content of a current memory of the owner key outside the
-- group is not used (the head's stands). A head not in merged keeps its own text.
-- Returns one row a merge: the successor's id, the ids merged (the head first), how
-- the members matched ('text', 'vector', or 'text,vector' when both occur), and the
-- content kept. With dry_run, the groups it would merge (the same rows, the successor's
-- id null), and nothing is locked or written.
-- (the signatures without dry_run, since and merged: an overload left in place would make
-- calls ambiguous)
drop function if exists harbor.consolidate_memories(harbor.memory_scope[], double precision, text,
                                                    integer);
drop function if exists harbor.consolidate_memories(harbor.memory_scope[], double precision, text,
                                                    integer, boolean);
drop function if exists harbor.consolidate_memories(harbor.memory_scope[], double precision, text,
                                                    integer, boolean, timestamptz);
create or replace function harbor.consolidate_memories(
    scopes harbor.memory_scope[] default '{user}',
    min_similarity double precision default null,
    model_id text default null,
    max_merges integer default 1000,
    dry_run boolean default false,
    since timestamptz default null,
    merged jsonb default null
) returns table (successor_id text, merged_ids text[], matched_by text, content text)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_id        record := harbor._caller_identity();
    v_groups    jsonb;
    v_nestloop  text;
    v_heads     text[];
    v_news      text[];
    v_ids       text[];
    v_succ      text[];
    v_principal text := coalesce(harbor.caller_principal(), '');
    v_group_row record;
    v_live      text[];
    v_text      jsonb;
    v_group  text[];
    v_new    text;
begin
    if v_id.tenant_id is null then
        raise exception 'harbor.consolidate_memories: no identity set (harbor.set_identity)'
            using errcode = '42501';
    end if;
    if consolidate_memories.scopes is null or cardinality(consolidate_memories.scopes) = 0 then
        return;
    end if;
    if consolidate_memories.scopes && '{global,tenant}'::harbor.memory_scope[] then
        raise exception 'harbor.consolidate_memories: scopes are among user, project, session and run'
            using errcode = '22023';
    end if;
    if consolidate_memories.min_similarity is not null
       and not (consolidate_memories.min_similarity > 0
                and consolidate_memories.min_similarity <= 1) then
        raise exception 'harbor.consolidate_memories: min_similarity must be in (0, 1] (or null)'
            using errcode = '22023';
    end if;
    if consolidate_memories.min_similarity is not null
       and consolidate_memories.model_id is null then
        raise exception 'harbor.consolidate_memories: min_similarity needs a model_id'
            using errcode = '22023';
    end if;
    if consolidate_memories.max_merges is null or consolidate_memories.max_merges < 0 then
        raise exception 'harbor.consolidate_memories: max_merges must be >= 0'
            using errcode = '22023';
    end if;
    -- the groups, from one snapshot: [{head, members, matched_by}] best-ranked head first.
    -- Without nested loops where there is a choice: the planner cannot count the
    -- candidates (a function's rows, filtered), takes them for one row, and would compare
    -- every candidate's text with every other's where a hash join pairs equal texts in
    -- one pass. (Every table read below is keyed by the caller's owner keys: no hash join
    -- reads more than the owner's rows.)
    v_nestloop := pg_catalog.current_setting('enable_nestloop');
    perform pg_catalog.set_config('enable_nestloop', 'off', true);
    with candidates as materialized (
        select m.id, m.tenant_id, m.scope, m.project_id, m.user_id, m.session_id, m.run_id,
               m.principal_id, m.created_at,
               row_number() over (partition by m.scope, m.project_id, m.user_id, m.session_id,
                                               m.run_id, m.principal_id
                                  order by m.importance desc, lower(m.valid) desc,
                                           m.id collate "C")
                   as rnk,
               pg_catalog.btrim(pg_catalog.regexp_replace(pg_catalog.lower(m.content),
                                                          '[^[:alnum:]]+', ' ', 'g')) as normal
          from harbor._owner_memories(consolidate_memories.scopes, v_id.tenant_id,
                                      v_id.project_id, v_id.user_id, v_id.session_id,
                                      v_id.run_id) m
         where pg_catalog.upper_inf(m.valid)
           and pg_catalog.lower(m.valid) < pg_catalog.now()
           and m.superseded_by is null
           -- (a memory with an expiry is never merged: the merged memory would
           -- have to take one expiry for several)
           and m.expires_at is null
           and m.memory_type <> 'summary'
           -- the caller's own writes: a successor is stored as its writer's, which
           -- only the writer may do (the row policies)
           and m.principal_id = v_principal
    ), owner_vectors as materialized (
        -- the content vectors of model_id of the caller's owner keys, read a key at a time
        -- (one range of memory_embeddings_owner_idx each, whatever the statistics: a
        -- lookup a candidate could be planned as a scan of the whole key each)
        select e.memory_id, e.embedding
          from harbor._recall_keys(consolidate_memories.scopes, v_id.tenant_id,
                                   v_id.project_id, v_id.user_id, v_id.session_id,
                                   v_id.run_id) k
         cross join lateral (
               select e.memory_id, e.embedding
                 from harbor.memory_embeddings e
                where e.tenant_id = k.tenant_id
                  and e.model_id = consolidate_memories.model_id
                  and e.scope = k.scope and e.user_id = k.user_id
                  and e.project_id = k.project_id and e.session_id = k.session_id
                  and e.run_id = k.run_id and not e.with_context
               offset 0) e
         where consolidate_memories.min_similarity is not null
    ), vectors as materialized (
        select c.*, e.embedding
          from candidates c
          join owner_vectors e on e.memory_id = c.id
    ), pairs as (
        -- (better, worse): two candidates of one owner key and writer that match
        select a.id as better, a.rnk as better_rank, b.id as worse, 'text' as why
          from candidates a
          join candidates b
            on b.scope = a.scope and b.project_id = a.project_id and b.user_id = a.user_id
           and b.session_id = a.session_id and b.run_id = a.run_id
           and b.principal_id = a.principal_id
           and b.rnk > a.rnk and b.normal = a.normal
         where a.normal <> ''
        union
        -- every pair of an owner key and writer (no since)
        select a.id, a.rnk, b.id, 'vector'
          from vectors a
          join vectors b
            on b.scope = a.scope and b.project_id = a.project_id and b.user_id = a.user_id
           and b.session_id = a.session_id and b.run_id = a.run_id
           and b.principal_id = a.principal_id
           and b.rnk > a.rnk
         where consolidate_memories.since is null
           and public.vector_dims(a.embedding) = public.vector_dims(b.embedding)
           and 1 - (a.embedding operator(public.<=>) b.embedding)
               >= consolidate_memories.min_similarity
        union
        -- each memory stored since `since` with every other of its owner key and writer
        -- (a pair of two new ones once), the better-ranked first
        select case when n.rnk < o.rnk then n.id else o.id end, least(n.rnk, o.rnk),
               case when n.rnk < o.rnk then o.id else n.id end, 'vector'
          from (select v.* from vectors v
                 where v.created_at >= consolidate_memories.since) n
          join vectors o
            on o.scope = n.scope and o.project_id = n.project_id and o.user_id = n.user_id
           and o.session_id = n.session_id and o.run_id = n.run_id
           and o.principal_id = n.principal_id
           and o.id <> n.id
         where consolidate_memories.since is not null
           and (o.created_at < consolidate_memories.since or n.rnk < o.rnk)
           and public.vector_dims(n.embedding) = public.vector_dims(o.embedding)
           and 1 - (n.embedding operator(public.<=>) o.embedding)
               >= consolidate_memories.min_similarity
    ), joined as (
        -- each member with the best-ranked head it matches (a head matches nothing better)
        select distinct on (p.worse) p.worse, p.better, p.better_rank
          from pairs p
         where not exists (select 1 from pairs q where q.worse = p.better)
         order by p.worse, p.better_rank, p.better collate "C"
    ), grouped as (
        select j.better as head, min(j.better_rank) as head_rank,
               array_agg(distinct j.worse collate "C" order by j.worse collate "C") as members,
               pg_catalog.string_agg(distinct p.why, ',' order by p.why) as matched_by
          from joined j
          join pairs p on p.better = j.better and p.worse = j.worse
         group by j.better
    )
    select coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                        'head', g.head, 'members', g.members, 'matched_by', g.matched_by)
                    order by g.head_rank, g.head collate "C"), '[]')
      into v_groups
      from grouped g;
    perform pg_catalog.set_config('enable_nestloop', v_nestloop, true);
    if consolidate_memories.dry_run then
        return query
            select null::text, array[g.head] || g.members, g.matched_by, m.content
              from rows from (jsonb_to_recordset(v_groups)
                              as (head text, members text[], matched_by text))
                   with ordinality g(head, members, matched_by, n)
              join harbor.memories m on m.tenant_id = v_id.tenant_id and m.id = g.head
             order by g.n
             limit consolidate_memories.max_merges;
        return;
    end if;
    -- every group's rows still current, locked in one statement in id order
    select array_agg(x.id)
      into v_live
      from (select m.id
              from harbor.memories m
             where m.tenant_id = v_id.tenant_id
               and m.id = any (array(select g.head
                                       from jsonb_to_recordset(v_groups) g(head text)
                                     union all
                                     select unnest(g.members)
                                       from jsonb_to_recordset(v_groups) g(members text[])))
               and pg_catalog.upper_inf(m.valid)
               and m.superseded_by is null
             order by m.id collate "C"
             for update) x;
    if consolidate_memories.merged is null
       and not exists (select 1 from pg_catalog.pg_extension where extname = 'citus') then
        -- every group at once, in four statements whatever their number (a statement
        -- a group made each merge pay its own plans and statement triggers, and a lookup
        -- planned as a scan of the owner's rows, on statistics older than the rows,
        -- made that a scan a merge). Not on Citus, where a write of many rows from a
        -- function's is a COPY, which row-level security refuses, and the statements of
        -- one group are each sent whole to the tenant's shard. The groups up to
        -- max_merges whose head and at least one member are still current, each with
        -- its successor's id:
        select coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                            'head', x.head, 'new', x.new, 'ids', x.ids,
                            'matched_by', x.matched_by) order by x.n), '[]'),
               coalesce(array_agg(x.head order by x.n), '{}'),
               coalesce(array_agg(x.new order by x.n), '{}')
          into v_groups, v_heads, v_news
          from (select g.n, g.head, g.matched_by, l.ids,
                       (pg_catalog.gen_random_uuid())::text as new
                  from (select g.head, g.members, g.matched_by, g.n
                          from rows from (jsonb_to_recordset(v_groups)
                                          as (head text, members text[], matched_by text))
                               with ordinality g(head, members, matched_by, n)
                         order by g.n
                         limit consolidate_memories.max_merges) g
                 cross join lateral (
                       select array(select y.id
                                      from unnest(array[g.head] || g.members)
                                           with ordinality y(id, k)
                                     where y.id = any (v_live)
                                     order by y.k) as ids) l
                 where cardinality(l.ids) >= 2 and l.ids[1] = g.head) x;
        -- each memory merged (the groups in order, each head first) and its successor
        select coalesce(array_agg(y.id order by g.n, y.k), '{}'),
               coalesce(array_agg(g.new order by g.n, y.k), '{}')
          into v_ids, v_succ
          from rows from (jsonb_to_recordset(v_groups) as (new text, ids text[]))
               with ordinality g(new, ids, n)
         cross join unnest(g.ids) with ordinality y(id, k);
        update harbor.memories m
           set valid = pg_catalog.tstzrange(pg_catalog.lower(m.valid), pg_catalog.now(), '[)')
         where m.tenant_id = v_id.tenant_id and m.id = any (v_ids);
        with merged as (
            select x.new, x.id, x.k, m.importance, m.sensitivity, m.entity_ids,
                   m.source_message_ids
              from unnest(v_ids, v_succ) with ordinality x(id, new, k)
              join harbor.memories m on m.tenant_id = v_id.tenant_id and m.id = x.id
        ), totals as (
            select r.new, max(r.importance) as importance, max(r.sensitivity) as sensitivity,
                   array_agg(r.id order by r.k) as ids
              from merged r
             group by r.new
        ), entities as (
            select r.new, array_agg(distinct u.e collate "C" order by u.e collate "C") as ids
              from merged r
             cross join unnest(r.entity_ids) u(e)
             group by r.new
        ), sources as (
            select r.new, array_agg(distinct u.s collate "C" order by u.s collate "C") as ids
              from merged r
             cross join unnest(r.source_message_ids) u(s)
             group by r.new
        )
        insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id,
                                     run_id, principal_id, memory_type, importance, content,
                                     content_hash, context, entity_ids, source, sensitivity,
                                     source_session_id, source_message_ids, metadata, valid)
        select h.tenant_id, s.new, h.scope, h.project_id, h.user_id, h.session_id, h.run_id,
               h.principal_id, h.memory_type, t.importance, h.content, h.content_hash,
               h.context, coalesce(e.ids, '{}'), h.source, t.sensitivity,
               h.source_session_id, coalesce(src.ids, '{}'),
               h.metadata || pg_catalog.jsonb_build_object('consolidated_from',
                                                           pg_catalog.to_jsonb(t.ids)),
               pg_catalog.tstzrange(pg_catalog.now(), null, '[)')
          from unnest(v_heads, v_news) s(head, new)
          join harbor.memories h on h.tenant_id = v_id.tenant_id and h.id = s.head
          join totals t on t.new = s.new
          left join entities e on e.new = s.new
          left join sources src on src.new = s.new;
        update harbor.memories m
           set superseded_by = x.new
          from unnest(v_ids, v_succ) x(id, new)
         where m.tenant_id = v_id.tenant_id and m.id = x.id;
        insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,
                                              scope, project_id, user_id, session_id, run_id,
                                              with_context, in_graph)
        select e.tenant_id, s.new, e.model_id, e.dims, e.embedding, e.scope, e.project_id,
               e.user_id, e.session_id, e.run_id, e.with_context, e.in_graph
          from unnest(v_heads, v_news) s(head, new)
          join harbor.memory_embeddings e
            on e.tenant_id = v_id.tenant_id and e.memory_id = s.head;
        return query
            select g.new, g.ids, g.matched_by, h.content
              from rows from (jsonb_to_recordset(v_groups)
                              as (head text, new text, ids text[], matched_by text))
                   with ordinality g(head, new, ids, matched_by, n)
              join harbor.memories h on h.tenant_id = v_id.tenant_id and h.id = g.new
             order by g.n;
        return;
    end if;
    -- a group at a time (with written texts: a text is used only when no current memory
    -- of the key has it, the successors of the groups before included; and on Citus)
    for v_group_row in
        select g.head, g.members, g.matched_by
          from rows from (jsonb_to_recordset(v_groups)
                          as (head text, members text[], matched_by text))
               with ordinality g(head, members, matched_by, n)
         order by g.n
         limit consolidate_memories.max_merges
    loop
        -- the head and the members still current; a head gone leaves its group alone
        v_group := array(select x.id
                           from unnest(array[v_group_row.head] || v_group_row.members)
                                with ordinality x(id, n)
                          where x.id = any (v_live)
                          order by x.n);
        continue when coalesce(cardinality(v_group), 0) < 2
                   or v_group[1] is distinct from v_group_row.head;
        -- a written text, unless it is already a current memory of the key beside the group
        v_text := consolidate_memories.merged -> v_group_row.head;
        if v_text is not null and exists (
            select 1
              from harbor.memories h
              join harbor.memories c
                on c.tenant_id = h.tenant_id and c.scope = h.scope
               and c.project_id = h.project_id and c.user_id = h.user_id
               and c.session_id = h.session_id and c.run_id = h.run_id
             where h.tenant_id = v_id.tenant_id and h.id = v_group_row.head
               and c.content_hash = v_text ->> 'content_hash'
               and pg_catalog.upper_inf(c.valid)
               and c.id <> all (v_group)) then
            v_text := null;
        end if;
        update harbor.memories m
           set valid = pg_catalog.tstzrange(pg_catalog.lower(m.valid), pg_catalog.now(), '[)')
         where m.tenant_id = v_id.tenant_id and m.id = any (v_group);
        v_new := (pg_catalog.gen_random_uuid())::text;
        insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id,
                                     run_id, principal_id, memory_type, importance, content,
                                     content_hash, context, entity_ids, source, sensitivity,
                                     source_session_id, source_message_ids, metadata, valid)
        select h.tenant_id, v_new, h.scope, h.project_id, h.user_id, h.session_id, h.run_id,
               h.principal_id, h.memory_type, g.importance,
               coalesce(v_text ->> 'content', h.content),
               coalesce(v_text ->> 'content_hash', h.content_hash),
               case when v_text is null then h.context end, g.entity_ids, h.source,
               g.sensitivity, h.source_session_id, g.source_message_ids,
               h.metadata || pg_catalog.jsonb_build_object('consolidated_from',
                                                           pg_catalog.to_jsonb(v_group))
                   || case when v_text is null then '{}'::jsonb
                           else '{"written_by_model": true}'::jsonb end,
               pg_catalog.tstzrange(pg_catalog.now(), null, '[)')
          from harbor.memories h
         cross join (
             select max(m.importance) as importance, max(m.sensitivity) as sensitivity,
                    array(select distinct u.e collate "C"
                            from harbor.memories m2
                           cross join unnest(m2.entity_ids) u(e)
                           where m2.tenant_id = v_id.tenant_id and m2.id = any (v_group)
                           order by 1) as entity_ids,
                    array(select distinct s.s collate "C"
                            from harbor.memories m3
                           cross join unnest(m3.source_message_ids) s(s)
                           where m3.tenant_id = v_id.tenant_id and m3.id = any (v_group)
                           order by 1) as source_message_ids
               from harbor.memories m
              where m.tenant_id = v_id.tenant_id and m.id = any (v_group)) g
         where h.tenant_id = v_id.tenant_id and h.id = v_group_row.head;
        update harbor.memories m
           set superseded_by = v_new
         where m.tenant_id = v_id.tenant_id and m.id = any (v_group);
        insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,
                                              scope, project_id, user_id, session_id, run_id,
                                              with_context, in_graph)
        select e.tenant_id, v_new, e.model_id, e.dims, e.embedding, e.scope, e.project_id,
               e.user_id, e.session_id, e.run_id, e.with_context, e.in_graph
          from harbor.memory_embeddings e
         where e.tenant_id = v_id.tenant_id and e.memory_id = v_group_row.head
           and v_text is null;
        -- a written text's own vector
        insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,
                                              scope, project_id, user_id, session_id, run_id,
                                              with_context, in_graph)
        select h.tenant_id, v_new, consolidate_memories.model_id,
               public.vector_dims((v_text ->> 'embedding')::public.vector),
               (v_text ->> 'embedding')::public.vector, h.scope, h.project_id, h.user_id,
               h.session_id, h.run_id, false,
               coalesce((select pg_catalog.bool_or(e.in_graph)
                           from harbor.memory_embeddings e
                          where e.tenant_id = v_id.tenant_id
                            and e.memory_id = v_group_row.head
                            and e.model_id = consolidate_memories.model_id), false)
          from harbor.memories h
         where h.tenant_id = v_id.tenant_id and h.id = v_group_row.head
           and v_text ? 'embedding' and consolidate_memories.model_id is not null;
        successor_id := v_new;
        merged_ids := v_group;
        matched_by := v_group_row.matched_by;
        select h.content into consolidate_memories.content
          from harbor.memories h where h.tenant_id = v_id.tenant_id and h.id = v_new;
        return next;
    end loop;
end
$$;

-- The owners with current memories written since p_since (every one, when null), for
-- the periodic consolidation (harbor_pg.jobs, task harbor.queue_consolidations): each
-- owner key of the user and project scopes, of every tenant, with the writer
-- (principal_id) of those memories, one row each. Only ids, no content; each owner's
-- consolidation then runs as that owner, under row-level security. Only for an unbound
-- administrator (a member of harbor_admin: the job queue's login); any other caller is
-- refused. SECURITY DEFINER, owned by harbor_search (which reads every tenant's rows
-- and writes nothing). It reads every memory's created_at: one pass over the table a
-- call.
create or replace function harbor.consolidation_owners(p_since timestamptz)
returns table (tenant_id text, project_id text, user_id text, principal_id text)
    language plpgsql stable security definer
    set search_path to pg_catalog, pg_temp
as $$
begin
    if harbor.caller_is_bound()
       or not pg_catalog.pg_has_role(
               coalesce(nullif(pg_catalog.current_setting('role'), 'none'),
                        session_user::text)::name, 'harbor_admin', 'MEMBER') then
        raise exception 'harbor.consolidation_owners: only the unbound administrator lists owners'
            using errcode = '42501';
    end if;
    return query
        select distinct m.tenant_id, m.project_id, m.user_id, m.principal_id
          from harbor.memories m
         where m.scope in ('user', 'project')
           and m.tenant_id <> ''
           and (p_since is null or m.created_at >= p_since)
           and pg_catalog.upper_inf(m.valid)
           and m.superseded_by is null
           and m.memory_type <> 'summary'
         order by 1, 2, 3, 4;
end
$$;
grant create on schema harbor to harbor_search;
alter function harbor.consolidation_owners(timestamptz) owner to harbor_search;
revoke create on schema harbor from harbor_search;
